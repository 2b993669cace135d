//! Reports: what the allocator holds, in the kernel's terms too, as text
//! for people and JSON for programs, without allocating.
//!
//! [`report()`] takes a [`Report`]: the allocator's [`Stats`] and the
//! kernel's view of the process ([`OsMemory`]) taken together. Its
//! `Display` is the human report (a dozen lines; `Stats` alone displays the
//! allocator's part), [`Report::write_json`] the JSON document
//! ([`Stats::write_json`] the allocator's figures alone). Both write
//! through `core::fmt` into any buffer: [`FdWriter`] and [`SliceWriter`]
//! are fixed buffers, so a report can be written from an exit handler or
//! a signal reporter with the heap in any state.
//!
//! The same reports, asked for from the environment, in a Rust program
//! whose global allocator is [`Pagewise`](crate::Pagewise) and in any
//! program under `libpagewise.so` alike (Linux):
//!
//! | variable | what is written |
//! |---|---|
//! | `PAGEWISE_STATS=1` | the text report on stderr at `exit()` |
//! | `PAGEWISE_STATS_FILE=path` | the JSON document to `path` at `exit()` instead (`%p`: the pid) |
//! | `PAGEWISE_STATS_SIGNAL=SIGUSR2` | a report each time the signal arrives (`USR1`, `HUP`, or a real-time signal's number) |
//! | `PAGEWISE_STATS_INTERVAL_MS=N` | a report every N ms |
//!
//! A report asked for by the signal or the interval goes where the exit
//! report goes: the JSON file (replaced each time, by a rename, so a reader
//! never sees half of one) or stderr. So a process that is killed (the OOM
//! killer's `SIGKILL` runs no exit handler) has left one. The signal's
//! handler only sets a flag; a thread of pagewise's own writes the report
//! within 50 ms. `PAGEWISE_SAMPLE_FILE` is the sampler behind
//! `pagewise run --plot` (`sampler.rs`).
//!
//! ```
//! #[global_allocator]
//! static A: pagewise::Pagewise = pagewise::Pagewise;
//!
//! let v = vec![0u8; 1 << 20];
//! let r = pagewise::report();
//! assert!(r.stats.live_bytes >= 1 << 20);
//! eprintln!("{r}");
//! # drop(v);
//! ```

mod json;
mod text;
mod writer;

#[cfg(all(target_os = "linux", not(miri)))]
pub(crate) mod exit;
#[cfg(all(target_os = "linux", not(miri)))]
mod live;
#[cfg(all(target_os = "linux", not(miri)))]
pub(crate) mod sampler;

pub use crate::os::proc::OsMemory;
pub use json::JSON_VERSION;
#[cfg(all(target_os = "linux", not(miri)))]
pub(crate) use writer::expand_path;
pub use writer::{Bytes, FdWriter, SliceWriter};

use crate::stats::Stats;

/// The allocator's figures and the kernel's, taken together: what
/// [`report()`] returns. `Display` is the human report; [`write_json`](Report::write_json)
/// the JSON document.
///
/// ```
/// let r = pagewise::report();
/// assert_eq!(r.pid, std::process::id());
/// assert!(r.stats.committed_bytes >= r.stats.retained_bytes);
/// ```
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Report {
    /// The process id.
    pub pid: u32,
    /// The parent's process id.
    pub ppid: u32,
    /// The global allocator's counters ([`crate::stats()`]).
    pub stats: Stats,
    /// The kernel's view of the process at the same moment.
    pub os: OsMemory,
    comm: [u8; 64],
    comm_len: usize,
}

impl Report {
    /// A report of `stats` and `os` for this process.
    pub(crate) fn of(stats: Stats, os: OsMemory) -> Report {
        let mut comm = [0u8; 64];
        let comm_len = crate::os::proc::comm(&mut comm).len();
        // SAFETY: getpid and getppid have no preconditions.
        let (pid, ppid) = unsafe { (libc::getpid(), libc::getppid()) };
        Report {
            pid: pid as u32,
            ppid: ppid as u32,
            stats,
            os,
            comm,
            comm_len,
        }
    }

    /// The process's name as the kernel keeps it (`/proc/self/comm`: at
    /// most 15 bytes, not always UTF-8; empty where it cannot be read).
    ///
    /// ```
    /// let r = pagewise::report();
    /// assert!(r.comm().len() <= 15);
    /// ```
    pub fn comm(&self) -> &[u8] {
        &self.comm[..self.comm_len]
    }
}

/// Takes a report: the global allocator's counters and the kernel's view,
/// read with the background purger paused, so that no purge falls between
/// the two (it would make the accounting and the resident bytes disagree by
/// what it purged). Allocates nothing; reads /proc (a few hundred
/// microseconds).
///
/// ```
/// let text = pagewise::report().to_string();
/// assert!(text.starts_with("pagewise report (pid "));
/// ```
pub fn report() -> Report {
    let pass = crate::global::purger::hold_off();
    let s = crate::global::allocator::stats_held_off(&pass);
    let os = OsMemory::now();
    drop(pass);
    Report::of(s, os)
}

/// Milliseconds on `CLOCK_MONOTONIC` (the sampler's time base, and the
/// reporter's).
#[cfg(all(target_os = "linux", not(miri)))]
pub(crate) fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// At load (the library's constructor): starts the sampler and the
/// reporter if their variables ask for them.
#[cfg(all(target_os = "linux", not(miri)))]
pub(crate) fn start() {
    sampler::start_from_env();
    live::start_from_env();
}
