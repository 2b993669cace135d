//! Reports while the program runs, not only at its exit, so that a process
//! that is killed (the OOM killer's `SIGKILL` runs no exit handler) has
//! left one:
//!
//! - `PAGEWISE_STATS_SIGNAL=SIGUSR2` (or `USR1`, `HUP`, a number): the
//!   report is written when the signal arrives. The handler only sets a
//!   flag; the report is written by a thread of pagewise's own, outside the
//!   handler, within 50 ms.
//! - `PAGEWISE_STATS_INTERVAL_MS=N`: the report is written every N ms.
//!
//! Where it goes: with `PAGEWISE_STATS_FILE=path` (`%p`: the pid), the JSON
//! report replaces that file each time (written beside it and renamed
//! over it, so a reader never sees half of one); otherwise the text report
//! goes to stderr. The exit report still comes last.
//!
//! The reporter is a raw pthread started at load (only if one of the two
//! variables is set) that never allocates. A child made by `fork()` without
//! `exec` has no reporter (it still writes its exit report); a child that
//! execs starts its own at load.

use crate::config::Variable;
use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

/// A report was asked for by the signal.
static REQUESTED: AtomicBool = AtomicBool::new(false);
/// The period of the periodic report (0: none).
static INTERVAL_MS: AtomicU64 = AtomicU64::new(0);
/// How often the reporter looks at the flag.
const POLL_MS: u64 = 50;

extern "C" fn on_signal(_: c_int) {
    // Async-signal-safe: one atomic store; the reporter does the rest.
    REQUESTED.store(true, Relaxed);
}

/// Reads the two variables (at load) and starts the reporter if either is
/// set.
pub(crate) fn start_from_env() {
    let mut wanted = false;
    if let Some(sig) = Variable::StatsSignal.number() {
        install_handler(sig as c_int);
        wanted = true;
    }
    if let Some(ms) = Variable::StatsIntervalMs.number() {
        INTERVAL_MS.store(ms, Relaxed);
        wanted = true;
    }
    if wanted {
        // The program's signals blocked on the reporter but the report's,
        // whose handler is ours: it takes that one when the program blocks
        // it on its own threads, and never one the program waits for
        // (`os/signals.rs`).
        let open = Variable::StatsSignal.number().map_or(0, |s| s as c_int);
        let mask = crate::os::signals::block_async_but(open);
        spawn();
        crate::os::signals::restore(mask);
    }
}

fn install_handler(sig: c_int) {
    // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe;
    // SA_RESTART keeps the program's interrupted system calls going.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, core::ptr::null_mut());
    }
}

fn spawn() {
    // SAFETY: plain pthread calls with valid out-pointers; `run` has the
    // required signature and takes no argument.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        libc::pthread_attr_setstacksize(&mut attr, 256 * 1024);
        let mut tid: libc::pthread_t = core::mem::zeroed();
        libc::pthread_create(&mut tid, &attr, run, core::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
    }
}

extern "C" fn run(_: *mut libc::c_void) -> *mut libc::c_void {
    let interval = INTERVAL_MS.load(Relaxed);
    let mut next = super::now_ms().saturating_add(interval);
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: (POLL_MS.min(interval.max(1)) * 1_000_000) as _,
    };
    loop {
        // SAFETY: a valid timespec; an early wake-up only shortens a period.
        unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
        let now = super::now_ms();
        let periodic = interval > 0 && now >= next;
        if periodic {
            next = now.saturating_add(interval);
        }
        if REQUESTED.swap(false, Relaxed) || periodic {
            write_report();
            crate::profile::dump();
        }
    }
}

/// Writes one report where the variables say (module docs).
fn write_report() {
    match super::exit::stats_file() {
        // A path that cannot be written: the exit report says so once.
        Some(path) => {
            let _ = super::exit::write_file(path, true);
        }
        None => super::exit::print(2),
    }
}
