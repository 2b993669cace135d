//! Defaults sweep: what each retention setting costs and what it buys, on
//! bursty workloads shaped like real programs. The figures behind
//! `docs/defaults.md`.
//!
//! Four parts:
//! 1. **owned**: an owned `pagewise::Heap::with_config(..)` per setting
//!    (decay 0…5000 ms at the 64 MiB cap, caps 8 MiB…unlimited at 1000 ms,
//!    and MADV_FREE at the defaults) on three workloads: (a) a request loop
//!    of mixed sizes 16 B–1 MiB, (b) a slab allocator's consumer (several classes
//!    drained and refilled every few ms), (c) a garbage collector's large blocks
//!    (256 KiB–1 MiB cohorts over a persistent live set). An owned heap has
//!    no background purger: its decay runs on its slow paths.
//! 2. **reserve**: reservation sizes 32 MiB…2 GiB on (a) and (c): `mmap`
//!    calls and address space held.
//! 3. **idle**: the request loop under the *global* allocator, in a child
//!    process per setting (`PAGEWISE_DECAY_MS`, `PAGEWISE_RETAIN_MAX`), with
//!    idle gaps of 0/50/500/2000 ms between bursts: RSS at the end of each
//!    gap (the benefit) and page faults of the next burst (the cost).
//!    Children start the background thread with `purger::ensure()`
//!    (`SWEEP_START_PURGER=1`), except one row without it.
//! 4. **advice**: MADV_DONTNEED against MADV_FREE (`PAGEWISE_PURGE`), each in
//!    a child: RSS and `LazyFree` after the decay purged 48 MiB, faults when
//!    the memory is reused, and RSS after `MADV_PAGEOUT` (what memory
//!    pressure would do to MADV_FREE'd pages).
//!
//! ```text
//! cargo run --release -p pagewise --example defaults_sweep               # all parts, 3 runs (~6 min)
//! cargo run --release -p pagewise --example defaults_sweep -- owned      # one part: owned | reserve | idle | advice
//! cargo run --release -p pagewise --example defaults_sweep -- --runs 1   # one run of each (~2 min)
//! ```
//!
//! CPU times are reported only as ratios to the default setting within the
//! same run (the machine is shared); they are not absolute claims.

use std::alloc::Layout;
use std::process::Command;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use pagewise::{Config, Heap, Purge};

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

const K: usize = 1 << 10;
const M: usize = 1 << 20;
/// The stride `touch` writes at: the smallest OS page pagewise supports.
const OS_PAGE: usize = 4096;
const UNLIMITED: usize = 1 << 40;

/// Deterministic xorshift: the same trace for every setting.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Log-uniform in `[lo, hi)`.
    fn log_uniform(&mut self, lo: usize, hi: usize) -> usize {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        let (a, b) = ((lo as f64).ln(), (hi as f64).ln());
        ((a + u * (b - a)).exp() as usize).clamp(lo, hi - 1)
    }
}

// ----- measurement helpers ---------------------------------------------------

fn rusage(who: libc::c_int) -> libc::rusage {
    // SAFETY: an all-zero rusage is a valid value; getrusage fills it.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; `who` is RUSAGE_SELF or RUSAGE_THREAD.
    unsafe { libc::getrusage(who, &mut r) };
    r
}

/// Minor page faults and CPU microseconds (user + system) of `who`.
fn faults_cpu(who: libc::c_int) -> (u64, u64) {
    let r = rusage(who);
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (r.ru_minflt as u64, us(r.ru_utime) + us(r.ru_stime))
}

/// Reads a small `/proc` file into a stack buffer, without allocating: an
/// allocation would run the allocator's slow path, which runs the decay,
/// and so would change what is being measured.
fn read_proc(path: &[u8], buf: &mut [u8]) -> usize {
    // SAFETY: `path` is NUL-terminated; `buf` is valid for `buf.len()` bytes.
    unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY);
        if fd < 0 {
            return 0;
        }
        let mut n = 0;
        while n < buf.len() {
            let r = libc::read(fd, buf[n..].as_mut_ptr().cast(), buf.len() - n);
            if r <= 0 {
                break;
            }
            n += r as usize;
        }
        libc::close(fd);
        n
    }
}

/// Resident bytes of this process (`/proc/self/statm`), without allocating.
fn rss() -> usize {
    let mut buf = [0u8; 128];
    let n = read_proc(b"/proc/self/statm\0", &mut buf);
    let pages = std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|s| s.split_whitespace().nth(1))
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf reads a constant; it does not allocate.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize
}

/// A field of `/proc/self/smaps_rollup`, in bytes, without allocating.
fn smaps_rollup(field: &str) -> usize {
    let mut buf = [0u8; 2048];
    let n = read_proc(b"/proc/self/smaps_rollup\0", &mut buf);
    std::str::from_utf8(&buf[..n])
        .unwrap_or("")
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0)
        * K
}

/// Time-weighted average of a piecewise-constant quantity (left Riemann sum:
/// each value holds until the next sample).
struct Average {
    start: Instant,
    last_t: Instant,
    last_v: f64,
    acc: f64,
}

impl Average {
    fn new(v: usize) -> Self {
        let now = Instant::now();
        Average {
            start: now,
            last_t: now,
            last_v: v as f64,
            acc: 0.0,
        }
    }
    fn sample(&mut self, v: usize) {
        let now = Instant::now();
        self.acc += self.last_v * (now - self.last_t).as_secs_f64();
        self.last_t = now;
        self.last_v = v as f64;
    }
    fn mean(&self) -> f64 {
        let t = (self.last_t - self.start).as_secs_f64();
        if t == 0.0 {
            self.last_v
        } else {
            self.acc / t
        }
    }
}

/// Writes one byte in every OS page of `[p, p + size)`, as a program using
/// the memory would.
fn touch(p: *mut u8, size: usize) {
    let mut off = 0;
    while off < size {
        // SAFETY: `off < size`, inside the live allocation.
        unsafe { p.add(off).write_volatile(1) };
        off += OS_PAGE;
    }
}

// ----- the memory under test ---------------------------------------------------

/// Where the workloads get memory: an owned heap, or the global allocator.
trait Mem {
    fn alloc(&self, size: usize) -> *mut u8;
    /// # Safety
    /// `p` came from `alloc(size)` and is not used after.
    unsafe fn free(&self, p: *mut u8, size: usize);
    /// Committed bytes (the allocator's own figure).
    fn committed(&self) -> usize;
}

impl Mem for Heap {
    fn alloc(&self, size: usize) -> *mut u8 {
        let l = Layout::from_size_align(size, 8).unwrap();
        self.allocate(l)
            .expect("out of memory")
            .cast::<u8>()
            .as_ptr()
    }
    unsafe fn free(&self, p: *mut u8, size: usize) {
        let l = Layout::from_size_align(size, 8).unwrap();
        // SAFETY: the caller passes an allocation of this heap with `l`.
        unsafe { self.deallocate(NonNull::new_unchecked(p), l) };
    }
    fn committed(&self) -> usize {
        self.stats().committed_bytes as usize
    }
}

struct Global;
impl Mem for Global {
    fn alloc(&self, size: usize) -> *mut u8 {
        let l = Layout::from_size_align(size, 8).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc(l) };
        assert!(!p.is_null(), "out of memory");
        p
    }
    unsafe fn free(&self, p: *mut u8, size: usize) {
        let l = Layout::from_size_align(size, 8).unwrap();
        // SAFETY: the caller passes a global allocation made with `l`.
        unsafe { std::alloc::dealloc(p, l) };
    }
    fn committed(&self) -> usize {
        pagewise::stats().committed_bytes as usize
    }
}

// ----- workloads -------------------------------------------------------------

/// (a) A request loop: each request allocates 1,500 objects (90 % 16 B–4 KiB,
/// 9 % 4–256 KiB, 1 % 256 KiB–1 MiB, log-uniform; one request in eight is a
/// peak with 4× as many), writes every page, and frees them; 1 % of the
/// objects survive into a cache of at most 1,500 entries (random eviction).
struct Requests {
    rng: Rng,
    objs: Vec<(*mut u8, usize)>,
    cache: Vec<(*mut u8, usize)>,
}

impl Requests {
    fn new() -> Self {
        Requests {
            rng: Rng(0x9E37_79B9_7F4A_7C15),
            objs: Vec::with_capacity(8000),
            cache: Vec::with_capacity(1600),
        }
    }
    fn size(&mut self) -> usize {
        match self.rng.below(1000) {
            0..=899 => self.rng.log_uniform(16, 4 * K),
            900..=989 => self.rng.log_uniform(4 * K, 256 * K),
            _ => self.rng.log_uniform(256 * K, M + 1),
        }
    }
    fn request(&mut self, mem: &dyn Mem) {
        let n = if self.rng.below(8) == 0 { 6000 } else { 1500 };
        for _ in 0..n {
            let s = self.size();
            let p = mem.alloc(s);
            touch(p, s);
            self.objs.push((p, s));
        }
        for (p, s) in self.objs.drain(..) {
            if self.rng.below(100) == 0 {
                if self.cache.len() >= 1500 {
                    let i = self.rng.below(self.cache.len() as u64) as usize;
                    let (q, t) = self.cache.swap_remove(i);
                    // SAFETY: a live object of the cache, removed from it.
                    unsafe { mem.free(q, t) };
                }
                self.cache.push((p, s));
            } else {
                // SAFETY: a live object of this request.
                unsafe { mem.free(p, s) };
            }
        }
    }
    fn finish(&mut self, mem: &dyn Mem) {
        for (p, s) in self.cache.drain(..) {
            // SAFETY: live cache objects.
            unsafe { mem.free(p, s) };
        }
    }
}

/// What one run of a workload measured.
#[derive(Default, Clone, Copy)]
struct Run {
    madvise: u64,
    purged: u64,
    faults: u64,
    cpu_us: u64,
    avg_committed: f64,
    peak_committed: u64,
    end_committed: u64,
}

/// A workload: runs on some memory, sampling committed bytes into the average.
type Workload = fn(&dyn Mem, &mut Average);

fn workload_a(mem: &dyn Mem, avg: &mut Average) {
    let mut w = Requests::new();
    for _ in 0..100 {
        w.request(mem);
        avg.sample(mem.committed());
        std::thread::sleep(Duration::from_millis(5));
        avg.sample(mem.committed());
    }
    w.finish(mem);
}

/// (b) A slab allocator's consumer: every 3 ms, 1,500 objects of 64 B, 256 B, 1 KiB
/// and 4 KiB (~2 MiB, several pages per class) are allocated, written and all
/// freed, so every class drains to zero and refills; 300 cycles.
fn workload_b(mem: &dyn Mem, avg: &mut Average) {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let mut objs = Vec::with_capacity(1500);
    for _ in 0..300 {
        for _ in 0..1500 {
            let s = [64, 256, 1024, 4096][rng.below(4) as usize];
            let p = mem.alloc(s);
            touch(p, s);
            objs.push((p, s));
        }
        avg.sample(mem.committed());
        for (p, s) in objs.drain(..) {
            // SAFETY: live objects of this cycle.
            unsafe { mem.free(p, s) };
        }
        avg.sample(mem.committed());
        std::thread::sleep(Duration::from_millis(3));
    }
}

/// (c) A garbage collector's blocks: a persistent live set of 24 blocks of 256 KiB–1 MiB;
/// every 2 ms a cohort of 8–40 such blocks is allocated and fully written,
/// one of them replaces a random live-set block, the rest die; 300 cycles.
fn workload_c(mem: &dyn Mem, avg: &mut Average) {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut live: Vec<(*mut u8, usize)> = (0..24)
        .map(|_| {
            let s = rng.log_uniform(256 * K, M + 1);
            let p = mem.alloc(s);
            touch(p, s);
            (p, s)
        })
        .collect();
    let mut cohort = Vec::with_capacity(40);
    for _ in 0..300 {
        let n = 8 + rng.below(33);
        for _ in 0..n {
            let s = rng.log_uniform(256 * K, M + 1);
            let p = mem.alloc(s);
            touch(p, s);
            cohort.push((p, s));
        }
        avg.sample(mem.committed());
        let i = rng.below(live.len() as u64) as usize;
        let old = std::mem::replace(&mut live[i], cohort.pop().unwrap());
        // SAFETY: a live-set block just replaced.
        unsafe { mem.free(old.0, old.1) };
        for (p, s) in cohort.drain(..) {
            // SAFETY: live cohort blocks.
            unsafe { mem.free(p, s) };
        }
        avg.sample(mem.committed());
        std::thread::sleep(Duration::from_millis(2));
    }
    for (p, s) in live {
        // SAFETY: live-set blocks.
        unsafe { mem.free(p, s) };
    }
}

fn run_owned(config: Config, work: Workload) -> Run {
    let heap = Heap::with_config(config);
    let s0 = heap.stats();
    let (f0, c0) = faults_cpu(libc::RUSAGE_THREAD);
    let mut avg = Average::new(heap.committed());
    work(&heap, &mut avg);
    let (f1, c1) = faults_cpu(libc::RUSAGE_THREAD);
    let s1 = heap.stats();
    Run {
        madvise: s1.syscalls.madvise - s0.syscalls.madvise,
        purged: s1.purged_bytes - s0.purged_bytes,
        faults: f1 - f0,
        cpu_us: c1 - c0,
        avg_committed: avg.mean(),
        peak_committed: s1.peak_committed_bytes,
        end_committed: s1.committed_bytes,
    }
}

fn label(decay: u64, cap: usize, purge: Purge) -> String {
    let cap = if cap >= UNLIMITED {
        "unlimited".to_string()
    } else {
        format!("{} MiB", cap / M)
    };
    let p = if purge == Purge::Free { " FREE" } else { "" };
    format!("{decay} ms / {cap}{p}")
}

fn settings() -> Vec<(u64, usize, Purge)> {
    let mut v: Vec<_> = [0, 10, 100, 250, 1000, 5000]
        .iter()
        .map(|&d| (d, 64 * M, Purge::DontNeed))
        .collect();
    for cap in [8 * M, 16 * M, 256 * M, UNLIMITED] {
        v.push((1000, cap, Purge::DontNeed));
    }
    v
}

/// Median of a non-empty list.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Column-wise medians of rows of numbers.
fn median_rows(rows: &[Vec<f64>]) -> Vec<f64> {
    (0..rows[0].len())
        .map(|c| median(rows.iter().map(|r| r[c]).collect()))
        .collect()
}

fn part_owned(runs: usize) {
    let mut list = settings();
    list.push((1000, 64 * M, Purge::Free));
    let works: [(&str, Workload); 3] = [
        ("(a) request loop", workload_a),
        ("(b) slab consumer", workload_b),
        ("(c) GC blocks", workload_c),
    ];
    for (name, work) in works {
        println!("\n### owned heap, {name} (median of {runs} runs)\n");
        println!("| decay / cap | madvise | purged MiB | minflt | avg committed MiB | peak committed MiB | end committed MiB | CPU vs default |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        // Rounds over all settings, so slow moments of the shared machine
        // spread over settings instead of landing on one.
        let mut all: Vec<Vec<Vec<f64>>> = vec![Vec::new(); list.len()];
        for _ in 0..runs {
            for (i, &(decay_ms, retain_max_bytes, purge)) in list.iter().enumerate() {
                let c = Config {
                    decay_ms,
                    retain_max_bytes,
                    purge,
                    ..Config::DEFAULT
                };
                let r = run_owned(c, work);
                all[i].push(vec![
                    r.madvise as f64,
                    r.purged as f64,
                    r.faults as f64,
                    r.avg_committed,
                    r.peak_committed as f64,
                    r.end_committed as f64,
                    r.cpu_us as f64,
                ]);
            }
        }
        let med: Vec<Vec<f64>> = all.iter().map(|rows| median_rows(rows)).collect();
        let base = list
            .iter()
            .position(|&s| s == (1000, 64 * M, Purge::DontNeed))
            .map(|i| med[i][6])
            .unwrap_or(1.0)
            .max(1.0);
        for (&(d, cap, p), r) in list.iter().zip(&med) {
            let m = |x: f64| x / M as f64;
            println!(
                "| {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.2} |",
                label(d, cap, p),
                r[0],
                m(r[1]),
                r[2],
                m(r[3]),
                m(r[4]),
                m(r[5]),
                r[6] / base
            );
        }
    }
}

/// Reservation size: mmap calls and address space held, on (a) and (c).
fn part_reserve(runs: usize) {
    let sizes = [32 * M, 256 * M, 1024 * M, 2048 * M];
    let works: [(&str, Workload); 2] = [
        ("(a) request loop", workload_a),
        ("(c) GC blocks", workload_c),
    ];
    println!("\n### reservation size, owned heap, defaults otherwise (median of {runs} runs)\n");
    println!("| workload | reservation | mmap | munmap | peak mapped MiB | CPU vs 1 GiB |");
    println!("|---|---|---:|---:|---:|---:|");
    for (name, work) in works {
        let mut all: Vec<Vec<Vec<f64>>> = vec![Vec::new(); sizes.len()];
        for _ in 0..runs {
            for (i, &r) in sizes.iter().enumerate() {
                let heap = Heap::with_config(Config {
                    reservation_bytes: r,
                    ..Config::DEFAULT
                });
                let (_, c0) = faults_cpu(libc::RUSAGE_THREAD);
                let mut avg = Average::new(0);
                work(&heap, &mut avg);
                let (_, c1) = faults_cpu(libc::RUSAGE_THREAD);
                let s = heap.stats().syscalls;
                all[i].push(vec![
                    s.mmap as f64,
                    s.munmap as f64,
                    s.peak_mapped_bytes as f64,
                    (c1 - c0) as f64,
                ]);
            }
        }
        let med: Vec<Vec<f64>> = all.iter().map(|r| median_rows(r)).collect();
        let base = med[2][3].max(1.0);
        for (&r, v) in sizes.iter().zip(&med) {
            println!(
                "| {name} | {} MiB | {:.0} | {:.0} | {:.0} | {:.2} |",
                r / M,
                v[0],
                v[1],
                v[2] / M as f64,
                v[3] / base
            );
        }
    }
}

// ----- part 2: idle gaps under the global allocator --------------------------

const GAPS: [(u64, usize); 4] = [(0, 12), (50, 8), (500, 4), (2000, 2)];

/// Child: bursts of 5 requests separated by idle gaps; prints one line of
/// numbers for the parent.
fn child_idle() {
    start_purger_if_asked();
    let mut w = Requests::new();
    // Warm up until the survivor cache is full: the live set is then steady.
    while w.cache.len() < 1500 {
        w.request(&Global);
    }
    let s0 = pagewise::stats();
    let (f_start, c_start) = faults_cpu(libc::RUSAGE_SELF);
    let mut avg = Average::new(rss());
    let mut out = Vec::new();
    for (gap, reps) in GAPS {
        let (mut rss_sum, mut flt_sum) = (0usize, 0u64);
        for _ in 0..reps {
            let (f0, _) = faults_cpu(libc::RUSAGE_SELF);
            for _ in 0..5 {
                w.request(&Global);
                avg.sample(rss());
            }
            let (f1, _) = faults_cpu(libc::RUSAGE_SELF);
            flt_sum += f1 - f0;
            let end = Instant::now() + Duration::from_millis(gap);
            while Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10).min(end - Instant::now()));
                avg.sample(rss());
            }
            rss_sum += rss();
        }
        out.push((rss_sum / reps, flt_sum / reps as u64));
    }
    let (f_end, c_end) = faults_cpu(libc::RUSAGE_SELF);
    let s1 = pagewise::stats();
    pagewise::trim();
    let floor = rss();
    print!(
        "{} {} {} {} {:.0} {}",
        pagewise::purger::running() as u8,
        s1.syscalls.madvise - s0.syscalls.madvise,
        s1.purged_bytes - s0.purged_bytes,
        f_end - f_start,
        avg.mean(),
        c_end - c_start
    );
    print!(" {floor}");
    for (r, f) in out {
        print!(" {r} {f}");
    }
    println!();
    w.finish(&Global);
}

/// The figures in docs/defaults.md were taken while the purger did not start
/// by itself (a bug since fixed: `start` only left NOT_STARTED, never
/// REQUESTED). `purger::ensure()` called before any
/// retained free starts it; children run with `SWEEP_START_PURGER=1` do so,
/// to measure the design as intended.
fn start_purger_if_asked() {
    if std::env::var_os("SWEEP_START_PURGER").is_some() {
        pagewise::purger::ensure();
    }
}

fn part_idle(runs: usize) {
    let exe = std::env::current_exe().unwrap();
    // (decay, cap, purge, start the purger by hand)
    let mut list: Vec<_> = settings()
        .into_iter()
        .map(|(d, c, p)| (d, c, p, true))
        .collect();
    list.push((1000, 64 * M, Purge::DontNeed, false));
    let mut all: Vec<Vec<Vec<f64>>> = vec![Vec::new(); list.len()];
    for _ in 0..runs {
        for (i, &(d, cap, _, start)) in list.iter().enumerate() {
            let mut cmd = Command::new(&exe);
            cmd.arg("child-idle")
                .env("PAGEWISE_DECAY_MS", d.to_string())
                .env("PAGEWISE_RETAIN_MAX", cap.to_string());
            if start {
                cmd.env("SWEEP_START_PURGER", "1");
            }
            let out = cmd.output().expect("spawn child");
            let text = String::from_utf8_lossy(&out.stdout);
            let v: Vec<f64> = text
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            assert_eq!(v.len(), 7 + 2 * GAPS.len(), "child said: {text}");
            all[i].push(v);
        }
    }
    let rows: Vec<Vec<f64>> = all.iter().map(|r| median_rows(r)).collect();
    let base = list
        .iter()
        .position(|&s| s == (1000, 64 * M, Purge::DontNeed, true))
        .map(|i| rows[i][5])
        .unwrap_or(1.0);
    println!("\n### global allocator (child per setting), request bursts with idle gaps (median of {runs} runs)\n");
    println!("RSS in MiB at the end of each gap (mean over the gaps of that length); minflt per 5-request burst that follows.\n");
    print!("| decay / cap | purger | madvise | purged MiB | minflt | avg RSS MiB | CPU vs default | RSS after trim |");
    for (g, _) in GAPS {
        print!(" RSS after {g} ms |");
    }
    for (g, _) in GAPS {
        print!(" minflt after {g} ms |");
    }
    println!();
    println!(
        "|---|---|---:|---:|---:|---:|---:|---:|{}",
        "---:|".repeat(2 * GAPS.len())
    );
    for (&(d, cap, p, start), v) in list.iter().zip(&rows) {
        let purger = match (start, v[0] > 0.0) {
            (true, true) => "started by hand",
            (false, false) => "not running",
            (false, true) => "running (started by the allocator)",
            (true, false) => "did not start",
        };
        print!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.2} | {:.1} |",
            label(d, cap, p),
            purger,
            v[1],
            v[2] / M as f64,
            v[3],
            v[4] / M as f64,
            v[5] / base,
            v[6] / M as f64
        );
        for i in 0..GAPS.len() {
            print!(" {:.1} |", v[7 + 2 * i] / M as f64);
        }
        for i in 0..GAPS.len() {
            print!(" {:.0} |", v[8 + 2 * i]);
        }
        println!();
    }
}

// ----- part 3: MADV_DONTNEED vs MADV_FREE ----------------------------------------

const ADVICE_BLOCKS: usize = 48;

/// Child (PAGEWISE_DECAY_MS=100, PAGEWISE_PURGE=dontneed|free): 48 × 1 MiB
/// blocks written, freed, purged by the decay; then reused; then
/// `MADV_PAGEOUT` on their addresses, which reclaims the pages as memory
/// pressure would.
fn child_advice() {
    start_purger_if_asked();
    let settle = || std::thread::sleep(Duration::from_millis(400));
    let mut blocks = Vec::with_capacity(ADVICE_BLOCKS);
    let base_rss = rss();
    let fill = |blocks: &mut Vec<(*mut u8, usize)>| {
        for _ in 0..ADVICE_BLOCKS {
            let p = Global.alloc(M);
            touch(p, M);
            blocks.push((p, M));
        }
    };
    let empty = |blocks: &mut Vec<(*mut u8, usize)>| -> Vec<usize> {
        blocks
            .drain(..)
            .map(|(p, s)| {
                // SAFETY: live blocks of this child.
                unsafe { Global.free(p, s) };
                p as usize
            })
            .collect()
    };
    fill(&mut blocks);
    let rss_live = rss();
    empty(&mut blocks);
    let rss_freed = rss();
    settle();
    let rss_purged = rss();
    let lazy = smaps_rollup("LazyFree:");
    let purged = pagewise::stats().purged_bytes;
    // Reuse: the same blocks come back (best fit, lowest address).
    let (f0, c0) = faults_cpu(libc::RUSAGE_THREAD);
    fill(&mut blocks);
    let (f1, c1) = faults_cpu(libc::RUSAGE_THREAD);
    let addrs = empty(&mut blocks);
    settle();
    let rss_purged2 = rss();
    for a in addrs {
        // SAFETY: the range is a freed 1 MiB block, still mapped by pagewise
        // (it keeps its address space) and holding no live data; after
        // MADV_PAGEOUT its pages read back as zero or as before, and a freed
        // block's contents are never read by the allocator.
        unsafe { libc::madvise(a as *mut libc::c_void, M, libc::MADV_PAGEOUT) };
    }
    let rss_pageout = rss();
    println!(
        "{} {} {} {} {} {} {} {} {} {}",
        rss_live - base_rss,
        rss_freed.saturating_sub(base_rss),
        rss_purged.saturating_sub(base_rss),
        lazy,
        purged,
        f1 - f0,
        c1 - c0,
        rss_purged2.saturating_sub(base_rss),
        rss_pageout.saturating_sub(base_rss),
        smaps_rollup("LazyFree:"),
    );
}

fn part_advice() {
    let exe = std::env::current_exe().unwrap();
    println!(
        "\n### MADV_DONTNEED vs MADV_FREE (global allocator, decay 100 ms, 48 × 1 MiB blocks)\n"
    );
    println!("RSS net of the child's RSS before the first allocation, MiB. Reuse CPU is relative to DONTNEED in this run.\n");
    println!("| advice | live | after free | after decay purge | LazyFree | purged | reuse minflt | reuse CPU | after 2nd purge | after MADV_PAGEOUT | LazyFree after PAGEOUT |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut base = None;
    for advice in ["dontneed", "free"] {
        let out = Command::new(&exe)
            .arg("child-advice")
            .env("PAGEWISE_DECAY_MS", "100")
            .env("PAGEWISE_PURGE", advice)
            .env("SWEEP_START_PURGER", "1")
            .output()
            .expect("spawn child");
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Vec<f64> = text
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        assert_eq!(v.len(), 10, "child said: {text}");
        let b = *base.get_or_insert(v[6].max(1.0));
        let m = |x: f64| x / M as f64;
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {:.3} | {:.1} | {:.1} | {:.1} |",
            advice,
            m(v[0]),
            m(v[1]),
            m(v[2]),
            m(v[3]),
            m(v[4]),
            v[5],
            v[6] / b,
            m(v[7]),
            m(v[8]),
            m(v[9])
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runs = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(3usize)
        .max(1);
    let arg = args
        .iter()
        .find(|a| !a.starts_with("--") && a.parse::<usize>().is_err())
        .cloned()
        .unwrap_or_default();
    match arg.as_str() {
        "child-idle" => return child_idle(),
        "child-advice" => return child_advice(),
        _ => {}
    }
    let t = Instant::now();
    if arg.is_empty() || arg == "owned" {
        part_owned(runs);
    }
    if arg.is_empty() || arg == "reserve" {
        part_reserve(runs);
    }
    if arg.is_empty() || arg == "idle" {
        part_idle(runs);
    }
    if arg.is_empty() || arg == "advice" {
        part_advice();
    }
    eprintln!("\n(total {:.0} s)", t.elapsed().as_secs_f64());
}
