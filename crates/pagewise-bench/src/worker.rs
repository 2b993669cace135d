//! The worker side: one process runs one workload under the allocator its
//! binary installed, and prints one JSON line ([`WorkerResult`]).
//!
//! Command line: `WORKER <workload> <tiny|quick|full> [--idle-ms N]
//! [--sample-ms N] [--seed N]`.

use crate::util::{minor_faults, pages_touched, reset_hwm, ProcReader};
use crate::workloads::{self, Part, Rec, Scale};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Memory system calls made during a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Syscalls {
    /// `mmap` calls.
    pub mmap: u64,
    /// `munmap` calls.
    pub munmap: u64,
    /// `madvise` calls.
    pub madvise: u64,
}

impl Syscalls {
    /// All three added.
    pub fn total(&self) -> u64 {
        self.mmap + self.munmap + self.madvise
    }

    fn since(self, before: Syscalls) -> Syscalls {
        Syscalls {
            mmap: self.mmap - before.mmap,
            munmap: self.munmap - before.munmap,
            madvise: self.madvise - before.madvise,
        }
    }
}

/// How a worker binary counts memory syscalls.
#[derive(Clone, Copy)]
pub enum SyscallSource {
    /// Not countable in-process (glibc calls `mmap`/`brk` internally).
    None(&'static str),
    /// pagewise's own counters (`pagewise::stats().syscalls`).
    Pagewise,
    /// The `interpose_mmap!` wrappers in this binary.
    Interposed,
}

/// Counters bumped by the [`interpose_mmap!`](crate::interpose_mmap) wrappers.
pub static INTERPOSED_MMAP: AtomicU64 = AtomicU64::new(0);
/// See [`INTERPOSED_MMAP`].
pub static INTERPOSED_MUNMAP: AtomicU64 = AtomicU64::new(0);
/// See [`INTERPOSED_MMAP`].
pub static INTERPOSED_MADVISE: AtomicU64 = AtomicU64::new(0);
/// Set by the wrappers' first call, so a worker can tell they are live.
pub static INTERPOSED_LIVE: AtomicBool = AtomicBool::new(false);

fn interposed() -> Syscalls {
    Syscalls {
        mmap: INTERPOSED_MMAP.load(Relaxed),
        munmap: INTERPOSED_MUNMAP.load(Relaxed),
        madvise: INTERPOSED_MADVISE.load(Relaxed),
    }
}

fn pagewise_counts() -> Syscalls {
    let s = pagewise::stats().syscalls;
    Syscalls {
        mmap: s.mmap,
        munmap: s.munmap,
        madvise: s.madvise,
    }
}

/// Defines `mmap`, `mmap64`, `munmap` and `madvise` in the calling binary so
/// that the allocators linked into it (jemalloc, mimalloc, pagewise call them
/// through libc's dynamic symbols) are counted in-process. Each wrapper makes
/// the raw system call. glibc's own malloc calls its internal aliases and
/// `brk`, which no wrapper can see: the system worker does not use this.
#[macro_export]
macro_rules! interpose_mmap {
    () => {
        /// Counting wrapper (see `pagewise_bench::interpose_mmap!`).
        ///
        /// # Safety
        /// As `mmap(2)`.
        #[no_mangle]
        pub unsafe extern "C" fn mmap(
            addr: *mut ::libc::c_void,
            len: ::libc::size_t,
            prot: ::libc::c_int,
            flags: ::libc::c_int,
            fd: ::libc::c_int,
            off: ::libc::off_t,
        ) -> *mut ::libc::c_void {
            $crate::worker::INTERPOSED_MMAP.fetch_add(1, ::std::sync::atomic::Ordering::Relaxed);
            $crate::worker::INTERPOSED_LIVE.store(true, ::std::sync::atomic::Ordering::Relaxed);
            // SAFETY: the caller upholds mmap's contract; the raw syscall
            // returns the address or -errno, which libc's `syscall` maps to
            // -1 (MAP_FAILED) with errno set, as `mmap` does.
            unsafe {
                ::libc::syscall(::libc::SYS_mmap, addr, len, prot, flags, fd, off)
                    as *mut ::libc::c_void
            }
        }

        /// Counting wrapper (the LFS alias of `mmap`, same on 64-bit).
        ///
        /// # Safety
        /// As `mmap(2)`.
        #[no_mangle]
        pub unsafe extern "C" fn mmap64(
            addr: *mut ::libc::c_void,
            len: ::libc::size_t,
            prot: ::libc::c_int,
            flags: ::libc::c_int,
            fd: ::libc::c_int,
            off: ::libc::off_t,
        ) -> *mut ::libc::c_void {
            // SAFETY: forwarded with the caller's arguments.
            unsafe { mmap(addr, len, prot, flags, fd, off) }
        }

        /// Counting wrapper.
        ///
        /// # Safety
        /// As `munmap(2)`.
        #[no_mangle]
        pub unsafe extern "C" fn munmap(
            addr: *mut ::libc::c_void,
            len: ::libc::size_t,
        ) -> ::libc::c_int {
            $crate::worker::INTERPOSED_MUNMAP.fetch_add(1, ::std::sync::atomic::Ordering::Relaxed);
            // SAFETY: the caller upholds munmap's contract.
            unsafe { ::libc::syscall(::libc::SYS_munmap, addr, len) as ::libc::c_int }
        }

        /// Counting wrapper.
        ///
        /// # Safety
        /// As `madvise(2)`.
        #[no_mangle]
        pub unsafe extern "C" fn madvise(
            addr: *mut ::libc::c_void,
            len: ::libc::size_t,
            advice: ::libc::c_int,
        ) -> ::libc::c_int {
            $crate::worker::INTERPOSED_MADVISE.fetch_add(1, ::std::sync::atomic::Ordering::Relaxed);
            // SAFETY: the caller upholds madvise's contract.
            unsafe { ::libc::syscall(::libc::SYS_madvise, addr, len, advice) as ::libc::c_int }
        }
    };
}

/// One RSS sample: milliseconds since the workload started, RSS in bytes.
pub type Sample = (f64, u64);

/// Everything one worker run measured. Byte figures are raw (whole process);
/// `baseline_rss` is the RSS right before the workload started (binary,
/// runtime, the harness's pre-mapped bookkeeping).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerResult {
    /// Workload name.
    pub workload: String,
    /// Allocator the worker binary installed (`system` for a preload).
    pub worker: String,
    /// Scale.
    pub scale: Scale,
    /// Allocator operations.
    pub ops: u64,
    /// Wall time of the workload (without the idle period).
    pub elapsed_ns: u64,
    /// RSS before the workload.
    pub baseline_rss: u64,
    /// Peak RSS during the workload (`VmHWM` after a reset).
    pub peak_rss: u64,
    /// RSS right after the workload's frees (survivors still live).
    pub rss_after_free: u64,
    /// RSS after the idle period.
    pub rss_idle: u64,
    /// The memory the process costs the machine before the workload and
    /// after the idle period (`util::memory_of`: the proportional set size,
    /// which counts a physical page mapped at several addresses once, with
    /// memfd files counted by their blocks, so a meshed page counts even
    /// where nothing has touched it since its remap). Absent from older
    /// results and kernels; results before 2026-12-01 hold the plain PSS.
    #[serde(default)]
    pub pss_baseline: Option<u64>,
    /// See `pss_baseline`.
    #[serde(default)]
    pub pss_idle: Option<u64>,
    /// Idle period in milliseconds.
    pub idle_ms: u64,
    /// Requested bytes of the survivors.
    pub live_bytes: u64,
    /// Survivors.
    pub live_objects: u64,
    /// OS pages holding at least one live byte (None without survivors).
    pub floor_pages: Option<u64>,
    /// Memory syscalls from the start of the workload to the end of the idle
    /// period; None where they cannot be counted in-process.
    pub syscalls: Option<Syscalls>,
    /// Of those, the ones made before the idle period (the workload's own;
    /// absent from results of older workers).
    #[serde(default)]
    pub syscalls_workload: Option<Syscalls>,
    /// Where `syscalls` comes from, or why it is missing.
    pub syscall_source: String,
    /// Interposed counts, when the binary interposes too (a cross-check of
    /// pagewise's own counters).
    pub syscalls_interposed: Option<Syscalls>,
    /// Minor page faults during the workload and idle period.
    pub minor_faults: u64,
    /// Sub-parts.
    pub parts: Vec<Part>,
    /// Extra named figures.
    pub extra: Vec<(String, f64)>,
    /// When the workload started, in the samples' clock (ms).
    pub start_ms: f64,
    /// Phase marks (ms since the workload started, label).
    pub marks: Vec<(f64, String)>,
    /// RSS over time.
    pub samples: Vec<Sample>,
}

struct Args {
    workload: String,
    scale: Scale,
    idle_ms: u64,
    sample_ms: u64,
    seed: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let usage =
        "usage: WORKER <workload> <tiny|quick|full> [--idle-ms N] [--sample-ms N] [--seed N]";
    let workload = it.next().ok_or(usage)?;
    let scale = it.next().ok_or(usage)?;
    let scale = Scale::parse(&scale).ok_or_else(|| format!("bad scale `{scale}`; {usage}"))?;
    let mut a = Args {
        workload,
        scale,
        idle_ms: 1000,
        sample_ms: 10,
        seed: 42,
    };
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let n: u64 = v.parse().map_err(|_| format!("{flag}: bad number `{v}`"))?;
        match flag.as_str() {
            "--idle-ms" => a.idle_ms = n,
            "--sample-ms" => a.sample_ms = n.max(1),
            "--seed" => a.seed = n,
            _ => return Err(format!("unknown flag {flag}; {usage}")),
        }
    }
    Ok(a)
}

/// If the runner asked for a preloaded allocator, checks that the dynamic
/// loader really mapped it (ld.so only warns and goes on without it).
fn check_preload() -> Result<(), String> {
    let Ok(want) = std::env::var("PAGEWISE_TEST_BENCH_PRELOAD") else {
        return Ok(());
    };
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| e.to_string())?;
    if maps.lines().any(|l| l.ends_with(want.as_str())) {
        Ok(())
    } else {
        Err(format!(
            "preload failed: `{want}` is not mapped in the worker (LD_PRELOAD={})",
            std::env::var("LD_PRELOAD").unwrap_or_default()
        ))
    }
}

/// The whole worker: parse, run, measure, print. `name` is the allocator
/// the binary installed.
pub fn worker_main(name: &str, source: SyscallSource) -> ! {
    match worker(name, source) {
        Ok(r) => {
            println!("{}", serde_json::to_string(&r).expect("serialize result"));
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("pagewise-bench-worker-{name}: {e}");
            std::process::exit(2)
        }
    }
}

fn syscalls_now(source: SyscallSource) -> Option<Syscalls> {
    match source {
        SyscallSource::None(_) => None,
        SyscallSource::Pagewise => Some(pagewise_counts()),
        SyscallSource::Interposed => Some(interposed()),
    }
}

fn worker(name: &str, source: SyscallSource) -> Result<WorkerResult, String> {
    let args = parse_args()?;
    check_preload()?;
    if !workloads::WORKLOADS.contains(&args.workload.as_str()) {
        return Err(format!(
            "unknown workload `{}` (known: {})",
            args.workload,
            workloads::WORKLOADS.join(", ")
        ));
    }
    let mut proc = ProcReader::open().map_err(|e| format!("/proc/self: {e}"))?;

    // RSS sampler: a thread reading /proc/self/statm into a preallocated buffer.
    let cap = 200_000;
    let samples = Arc::new(std::sync::Mutex::new(Vec::<Sample>::with_capacity(cap)));
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let sampler = {
        let samples = Arc::clone(&samples);
        let stop = Arc::clone(&stop);
        let period = Duration::from_millis(args.sample_ms);
        let mut p = ProcReader::open().map_err(|e| format!("/proc/self: {e}"))?;
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                let rss = p.rss();
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                let mut s = samples.lock().expect("samples");
                if s.len() < s.capacity() {
                    s.push((ms, rss));
                }
                drop(s);
                std::thread::sleep(period);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(args.sample_ms.min(20)));

    let mut rec = Rec::new();
    let interposing = INTERPOSED_LIVE.load(Relaxed);
    let sys0 = syscalls_now(source);
    let int0 = interposed();
    let faults0 = minor_faults();
    let baseline_rss = proc.rss();
    let pss_baseline = proc.memory();
    let hwm_reset = reset_hwm();
    let t = Instant::now();
    let start_ms = t.duration_since(t0).as_secs_f64() * 1e3;
    let survivors = workloads::run(&args.workload, args.scale, args.seed, &mut rec)?;
    let elapsed_ns = t.elapsed().as_nanos() as u64;
    let rss_after_free = proc.rss();
    let peak_rss = if hwm_reset {
        // A workload that measures per-part peaks resets the mark itself:
        // the whole run's peak is then the highest of theirs and the last.
        rec.parts
            .iter()
            .filter_map(|p| p.peak_rss)
            .fold(proc.hwm(), u64::max)
    } else {
        // Without the reset VmHWM would include start-up; fall back to samples.
        samples
            .lock()
            .expect("samples")
            .iter()
            .map(|s| s.1)
            .max()
            .unwrap_or(0)
            .max(rss_after_free)
    };
    let live_bytes: u64 = survivors.as_slice().iter().map(|o| o.size as u64).sum();
    let floor_pages = if survivors.is_empty() {
        None
    } else {
        Some(pages_touched(survivors.as_slice()))
    };
    let sys_mid = syscalls_now(source);
    let t_idle = Instant::now();
    std::thread::sleep(Duration::from_millis(args.idle_ms));
    let rss_idle = proc.rss();
    let pss_idle = proc.memory();
    let idle_ms = t_idle.elapsed().as_millis() as u64;
    let sys1 = syscalls_now(source);
    let int1 = interposed();
    let minor = minor_faults() - faults0;
    // A thread the workload kept alive through the idle period (a blocked
    // producer) ends now, after every figure of the period is read.
    rec.end_lingering();
    stop.store(true, Relaxed);
    sampler.join().map_err(|_| "sampler thread panicked")?;
    let live_objects = survivors.len() as u64;
    for &o in survivors.as_slice() {
        crate::util::free_obj(o);
    }
    drop(survivors);

    let counted = matches!(source, SyscallSource::Pagewise)
        || matches!(source, SyscallSource::Interposed) && interposing;
    let syscalls_workload = sys_mid
        .zip(sys0)
        .map(|(a, b)| a.since(b))
        .filter(|_| counted);
    let (syscalls, syscall_source) = match source {
        SyscallSource::None(_) if std::env::var_os("PAGEWISE_TEST_BENCH_PRELOAD").is_some() => (
            None,
            "n/a: preloaded library (glibc-internal and raw calls are not countable in-process)"
                .to_string(),
        ),
        SyscallSource::None(why) => (None, format!("n/a: {why}")),
        SyscallSource::Pagewise => (
            sys1.zip(sys0).map(|(a, b)| a.since(b)),
            "pagewise::stats().syscalls".to_string(),
        ),
        SyscallSource::Interposed if interposing => (
            sys1.zip(sys0).map(|(a, b)| a.since(b)),
            "interposed libc mmap/munmap/madvise".to_string(),
        ),
        SyscallSource::Interposed => (None, "n/a: interposition did not take effect".to_string()),
    };
    let samples = std::mem::take(&mut *samples.lock().expect("samples"));
    Ok(WorkerResult {
        workload: args.workload,
        worker: name.to_string(),
        scale: args.scale,
        ops: rec.ops,
        elapsed_ns,
        baseline_rss,
        peak_rss,
        rss_after_free,
        rss_idle,
        pss_baseline,
        pss_idle,
        idle_ms,
        live_bytes,
        live_objects,
        start_ms,
        floor_pages,
        syscalls,
        syscalls_workload,
        syscall_source,
        syscalls_interposed: interposing.then(|| int1.since(int0)),
        minor_faults: minor,
        parts: std::mem::take(&mut rec.parts),
        extra: std::mem::take(&mut rec.extra),
        marks: std::mem::take(&mut rec.marks),
        samples,
    })
}
