//! The sampler behind `pagewise run --plot`: with `PAGEWISE_SAMPLE_FILE=path`
//! (`%p` is replaced by the pid) a thread started at load appends one line
//! every `PAGEWISE_SAMPLE_MS` milliseconds (default 50):
//!
//! ```text
//! <CLOCK_MONOTONIC ms> <RSS> <live> <committed> <live requested> <free slots> <retained> <metadata> <file-backed RSS>
//! ```
//!
//! (bytes; the last five give `pagewise run` the breakdown at the sample
//! with the highest RSS: pagewise's categories from its counters, and the
//! resident file-backed and shared bytes from /proc/self/statm) and a last
//! line at exit. Readers take the first four fields and the rest if present. The clock is absolute so that the samples of
//! successive images of one pid (a shell script that execs its program)
//! line up on one time axis in the same file. A raw pthread with no Rust runtime; its loop
//! neither allocates nor holds a lock between samples.

use super::{expand_path, now_ms, FdWriter};
use crate::config::Variable;
use crate::os::descriptor::{Kept, KeptCell};
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

/// The sample file, kept out of the program's way and checked before each
/// line (`os/descriptor.rs`): a program that closes every descriptor it
/// did not open and opens its own files must not get samples in them.
static FD: KeptCell = KeptCell::new();
static INTERVAL_MS: AtomicU64 = AtomicU64::new(50);
static STOPPED: AtomicBool = AtomicBool::new(false);

/// Starts the sampler if `PAGEWISE_SAMPLE_FILE` is set (called at load),
/// and, if `PAGEWISE_SAMPLE_PARENT=pid` is set too, only in a process whose
/// parent is that pid: `pagewise run` samples the program it started, not
/// every descendant that inherits the environment.
pub(crate) fn start_from_env() {
    let Some(path) = Variable::SampleFile.text() else {
        return;
    };
    if Variable::SampleParent.raw().is_some() {
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() } as u64;
        if Variable::SampleParent.number() != Some(parent) {
            return;
        }
    }
    if let Some(ms) = Variable::SampleMs.number() {
        INTERVAL_MS.store(ms, Relaxed);
    }
    let mut name = [0u8; 4096];
    if !expand_path(path, &mut name) {
        return;
    }
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC;
    // SAFETY: `name` is NUL-terminated.
    let fd = unsafe { libc::open(name.as_ptr().cast(), flags, 0o644 as libc::c_uint) };
    if fd < 0 {
        crate::fault::write_stderr(&[b"pagewise: cannot write PAGEWISE_SAMPLE_FILE=", path, b"\n"]);
        return;
    }
    let kept = Kept::keep(fd);
    if !FD.set(kept) {
        kept.close();
        return;
    }
    sample();
    // It starts with the program's signals blocked (a thread inherits its
    // creator's mask), so it never takes one the program waits for
    // (`os/signals.rs`).
    let mask = crate::os::signals::block_async();
    // SAFETY: plain pthread calls with valid out-pointers; `run` has the
    // required signature and takes no argument.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        libc::pthread_attr_setstacksize(&mut attr, 128 * 1024);
        let mut tid: libc::pthread_t = core::mem::zeroed();
        libc::pthread_create(&mut tid, &attr, run, core::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
    }
    crate::os::signals::restore(mask);
}

extern "C" fn run(_: *mut libc::c_void) -> *mut libc::c_void {
    let ms = INTERVAL_MS.load(Relaxed);
    // `as _`: the field types differ between C libraries (musl's `time_t`).
    let ts = libc::timespec {
        tv_sec: (ms / 1000) as _,
        tv_nsec: ((ms % 1000) * 1_000_000) as _,
    };
    while !STOPPED.load(Acquire) {
        // SAFETY: a valid timespec; an early wake-up only shortens a period.
        unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
        if STOPPED.load(Acquire) {
            break;
        }
        sample();
    }
    core::ptr::null_mut()
}

/// Appends one sample line (a single `write`, so lines never interleave).
fn sample() {
    let kept = FD.get();
    let Some(fd) = kept.get() else {
        // Lost (said once): no more samples.
        FD.take();
        return;
    };
    let s = crate::stats();
    let (rss, file) = crate::os::proc::statm();
    let t = now_ms();
    let mut w = FdWriter::new(fd);
    let _ = writeln!(
        w,
        "{t} {rss} {} {} {} {} {} {} {file}",
        s.live_bytes,
        s.committed_bytes,
        s.live_requested_bytes,
        s.free_slot_bytes,
        s.retained_bytes,
        s.metadata_bytes
    );
}

/// Stops the sampler after a last sample (at exit).
pub(crate) fn stop() {
    if !FD.get().is_some() {
        return;
    }
    STOPPED.store(true, Release);
    sample();
}

/// In a forked child the sampler thread does not exist; the child does not
/// sample (a child that execs starts its own sampler at load).
pub(crate) fn after_fork_child() {
    // Ours (the parent keeps its own copy), unless the program put a file
    // of its own at the number.
    FD.take().close();
}
