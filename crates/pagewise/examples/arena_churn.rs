//! Arena churn: many short-lived arenas of 1–64 MiB created and dropped, a
//! few alive at once, each filled with small objects that are all written.
//! Compares pagewise arenas (block-pool cap and purge advice varied) with
//! `bumpalo::Bump` and with pagewise arenas whose blocks come from plain
//! `malloc`.
//!
//! Each configuration runs in a fresh child process, so peak RSS (`VmHWM`),
//! page faults and malloc state are its own.
//!
//! ```text
//! cargo run --release -p pagewise --example arena_churn            # all configs
//! cargo run --release -p pagewise --example arena_churn -- 64 4    # arenas, live window
//! ```

use std::alloc::Layout;
use std::process::Command;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

use pagewise::arena::{Arena, BlockPool, BlockPoolConfig};
use pagewise::{PageSource, Purge, SyscallCounts, SystemPages};

const M: usize = 1 << 20;

/// Deterministic xorshift, the same trace for every configuration.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The "arena on plain malloc" baseline: the same bump policy as `Arena`
/// (64 KiB first block, doubling to 4 MiB), blocks from `malloc`/`free`.
struct MallocArena {
    blocks: std::cell::RefCell<Vec<(*mut u8, usize)>>,
    cur: std::cell::Cell<(*mut u8, usize, usize)>, // base, offset, size
}

impl MallocArena {
    fn new() -> Self {
        MallocArena {
            blocks: Default::default(),
            cur: std::cell::Cell::new((std::ptr::null_mut(), 0, 0)),
        }
    }
    fn alloc_layout(&self, l: Layout) -> NonNull<u8> {
        let (base, off, size) = self.cur.get();
        let start = (off + l.align() - 1) & !(l.align() - 1);
        if !base.is_null() && start + l.size() <= size {
            self.cur.set((base, start + l.size(), size));
            // SAFETY: inside the current block.
            return unsafe { NonNull::new_unchecked(base.add(start)) };
        }
        let grow = if size == 0 {
            64 << 10
        } else {
            (size * 2).min(4 << 20)
        };
        let bsize = grow.max((l.size() + l.align()).next_power_of_two());
        // SAFETY: plain malloc of a non-zero size.
        let b = unsafe { libc::malloc(bsize) }.cast::<u8>();
        assert!(!b.is_null());
        self.blocks.borrow_mut().push((b, bsize));
        let start = (b as usize).next_multiple_of(l.align()) - b as usize;
        self.cur.set((b, start + l.size(), bsize));
        // SAFETY: `start + size <= align + size <= bsize`.
        unsafe { NonNull::new_unchecked(b.add(start)) }
    }
}

impl Drop for MallocArena {
    fn drop(&mut self) {
        for &(b, _) in self.blocks.borrow().iter() {
            // SAFETY: every block came from malloc and nothing refers to it now.
            unsafe { libc::free(b.cast()) };
        }
    }
}

static SYSTEM: SystemPages = SystemPages::new();

fn proc_status(key: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0)
        * 1024
}

fn minor_faults() -> i64 {
    // SAFETY: `ru` is a valid out-pointer for getrusage.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru.ru_minflt
    }
}

/// Fills `bytes` with objects of 16–256 bytes, writing each one.
fn fill(rng: &mut Rng, bytes: usize, mut alloc: impl FnMut(Layout) -> NonNull<u8>) {
    let mut done = 0;
    while done < bytes {
        let size = 16 + (rng.next() % 241) as usize;
        let p = alloc(Layout::from_size_align(size, 8).unwrap());
        // SAFETY: `size` fresh bytes of the arena.
        unsafe { std::ptr::write_bytes(p.as_ptr(), 0x5A, size) };
        done += size;
    }
}

trait ChurnArena {
    fn alloc(&self, l: Layout) -> NonNull<u8>;
}
impl<S: PageSource> ChurnArena for Arena<S> {
    fn alloc(&self, l: Layout) -> NonNull<u8> {
        self.alloc_layout(l)
    }
}
impl ChurnArena for MallocArena {
    fn alloc(&self, l: Layout) -> NonNull<u8> {
        self.alloc_layout(l)
    }
}
impl ChurnArena for bumpalo::Bump {
    fn alloc(&self, l: Layout) -> NonNull<u8> {
        self.alloc_layout(l)
    }
}

/// Runs the churn: `arenas` arenas, `window` alive at once.
fn churn<A: ChurnArena>(arenas: usize, window: usize, mut make: impl FnMut() -> A) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut live: std::collections::VecDeque<A> = Default::default();
    for _ in 0..arenas {
        if live.len() == window {
            live.pop_front();
        }
        let size = (1 + rng.next() % 64) as usize * M;
        let a = make();
        fill(&mut rng, size, |l| a.alloc(l));
        live.push_back(a);
    }
}

fn run_one(config: &str, arenas: usize, window: usize) {
    let faults0 = minor_faults();
    let t = Instant::now();
    let mut sys = SyscallCounts::default();
    let mut pooled = 0;
    let mut keep = None; // the pool stays alive until RSS is read
    match config {
        "bumpalo" => churn(arenas, window, bumpalo::Bump::new),
        "malloc" => churn(arenas, window, MallocArena::new),
        _ => {
            // "free:64" or "dontneed:64" (cap in MiB)
            let (purge, cap) = config.split_once(':').expect("config");
            let purge = if purge == "free" {
                Purge::Free
            } else {
                Purge::DontNeed
            };
            let cap = cap.parse::<usize>().expect("cap") * M;
            let pool = Arc::new(BlockPool::new(
                &SYSTEM,
                BlockPoolConfig {
                    cap_bytes: cap,
                    purge,
                },
            ));
            churn(arenas, window, || Arena::with_pool(pool.clone()));
            sys = SYSTEM.syscalls();
            pooled = pool.stats().pooled_bytes;
            keep = Some(pool);
        }
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{config}\t{secs:.3}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        proc_status("VmHWM:") / M,
        proc_status("VmRSS:") / M,
        minor_faults() - faults0,
        sys.mmap,
        sys.munmap,
        sys.madvise,
        pooled / M,
    );
    drop(keep);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 5 && args[1] == "--one" {
        run_one(&args[2], args[3].parse().unwrap(), args[4].parse().unwrap());
        return;
    }
    let arenas: usize = args.get(1).map_or(64, |a| a.parse().expect("arenas"));
    let window: usize = args.get(2).map_or(4, |a| a.parse().expect("window"));
    let mut configs: Vec<String> = vec!["bumpalo".into(), "malloc".into()];
    for cap in [0, 16, 32, 64, 96, 128, 256] {
        configs.push(format!("free:{cap}"));
    }
    for cap in [0, 64, 256] {
        configs.push(format!("dontneed:{cap}"));
    }
    println!(
        "# arena churn: {arenas} arenas of 1-64 MiB (16-256 B objects, all written), {window} alive at once"
    );
    println!(
        "{:<14} {:>8} {:>10} {:>10} {:>10} {:>7} {:>7} {:>8} {:>10}",
        "config",
        "time s",
        "peakRSS M",
        "endRSS M",
        "minflt",
        "mmap",
        "munmap",
        "madvise",
        "pooled M"
    );
    let exe = std::env::current_exe().expect("exe");
    for c in &configs {
        let out = Command::new(&exe)
            .args(["--one", c, &arenas.to_string(), &window.to_string()])
            .output()
            .expect("child");
        let line = String::from_utf8_lossy(&out.stdout);
        let f: Vec<&str> = line.trim().split('\t').collect();
        if f.len() != 9 {
            println!("{c}: failed: {}", String::from_utf8_lossy(&out.stderr));
            continue;
        }
        println!(
            "{:<14} {:>8} {:>10} {:>10} {:>10} {:>7} {:>7} {:>8} {:>10}",
            f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8]
        );
    }
    println!(
        "# free:N / dontneed:N = pagewise Arena, pool cap N MiB, purge MADV_FREE / MADV_DONTNEED"
    );
    println!("# malloc = the same bump policy with blocks from malloc/free (no pool)");
    println!("# bumpalo = bumpalo::Bump on the system allocator (glibc malloc)");
}
