//! The RSS of every live process of the tree, read by `pagewise run`
//! itself from `/proc/PID/statm` at a fixed period: the plot's lines for
//! processes the library does not sample (a forked child that never
//! execs, a static program) and the whole tree's sum.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// One reading: a process's RSS at a time (ms since the run's start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// Milliseconds since the run started.
    pub t_ms: u64,
    /// The process.
    pub pid: u32,
    /// Its resident bytes.
    pub rss: u64,
}

/// The sampling thread and the set of processes it reads.
pub struct RssSampler {
    pids: Arc<Mutex<Vec<u32>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Reading>>>,
}

impl RssSampler {
    /// Starts reading every `interval_ms`; `now_ms` is the run's clock.
    pub fn start(interval_ms: u64, now_ms: fn() -> u64) -> RssSampler {
        let pids = Arc::new(Mutex::new(Vec::<u32>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (pids.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut readings = Vec::new();
            while !s.load(Ordering::Relaxed) {
                let t_ms = now_ms();
                let live = p.lock().map(|v| v.clone()).unwrap_or_default();
                for pid in live {
                    if let Some(rss) = statm_rss(pid) {
                        readings.push(Reading { t_ms, pid, rss });
                    }
                }
                std::thread::sleep(Duration::from_millis(interval_ms.max(1)));
            }
            readings
        });
        RssSampler {
            pids,
            stop,
            thread: Some(thread),
        }
    }

    /// Starts (`alive`) or stops reading `pid`.
    pub fn watch(&self, pid: u32, alive: bool) {
        if let Ok(mut v) = self.pids.lock() {
            v.retain(|&p| p != pid);
            if alive {
                v.push(pid);
            }
        }
    }

    /// Stops the thread; returns every reading in time order.
    pub fn finish(mut self) -> Vec<Reading> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

/// Resident bytes of `pid` (the second field of statm, in pages).
fn statm_rss(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    // A zombie's statm reads all zeros: not a reading.
    (pages > 0).then_some(pages * page)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zero() -> u64 {
        0
    }

    #[test]
    fn reads_a_watched_process() {
        let s = RssSampler::start(1, zero);
        s.watch(std::process::id(), true);
        std::thread::sleep(Duration::from_millis(20));
        s.watch(std::process::id(), false);
        let r = s.finish();
        assert!(!r.is_empty());
        assert!(r.iter().all(|x| x.pid == std::process::id() && x.rss > 0));
    }
}
