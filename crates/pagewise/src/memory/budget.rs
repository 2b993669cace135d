//! The retention budget: how many free committed bytes may be kept, for a
//! whole process (every thread heap of the global allocator shares one
//! [`Budget`]) or for one owned `Heap` (its own).
//!
//! Retention follows demand. *Demand* is committed bytes in use (committed
//! minus retained: live objects, slab pages, free slots in them). The budget
//! keeps a short history of demand, the highest value seen in each of
//! [`SLOTS`] time slots covering the last decay delay, and allows to retain
//! what that recent peak says will be needed again:
//!
//! ```text
//! needed  = peak demand over the last decay_ms - demand now
//! expired spans are kept while  retained <= min(ceiling, needed)
//! young spans are kept while    retained <= min(ceiling, needed + slack)
//! ```
//!
//! A program that frees a buffer and allocates another keeps the first
//! (demand fell, the peak did not), whatever its size; a program that went
//! quiet has its peak fall to its demand one decay delay later, and then
//! every expired span goes. The slack (`max(2 MiB, peak / 5)`) lets young
//! fragments that no demand accounts for wait for their decay. The ceiling
//! is `Config::retain_max_bytes` (`PAGEWISE_RETAIN_MAX`), none by default.
//!
//! Heaps publish their committed and retained bytes here under their span
//! lock, as deltas, on their slow paths (span operations, decay): never on a
//! fast path. After a span operation a heap publishes its retained bytes
//! only once they moved by `SYNC_GRAIN` (4 MiB; its own decisions use its
//! exact figure, and the decay syncs exactly before it purges): a large
//! object freed and taken again then costs no locked instruction on a line
//! every heap shares (1 MiB pairs went from 15.6 to 27.5 ns with an
//! exact publish on every operation, 20 ns with this). The history is approximate under races (a slot may be cleared
//! and then raised by a thread with an older time): it errs towards keeping
//! a little more for one slot, never towards purging what is in use.
//!
//! The hard limit (`Config::limit_bytes`, `PAGEWISE_LIMIT`) has a counter
//! of its own, exact at every moment: [`Budget::charge`] reserves bytes
//! before they are committed (a compare-and-swap that refuses to pass the
//! limit), [`Budget::uncharge`] gives them back once they are purged or
//! unmapped. It counts every byte a heap commits (slab pages as their slots
//! are carved, large spans, huge runs, OS pages of slab pages committed
//! again after a purge) and the header of every segment it maps, so that
//! neither lazy publishing (above) nor threads racing to the last free
//! bytes can take the heap's memory past the limit. An allocation whose
//! charge is refused purges what every heap retains and tries once more,
//! then fails. Only slow paths charge: where memory is committed, never
//! where a slot is taken from a cache or a page.

use crate::config::Config;
use crate::options::LiveConfig;
use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Time slots of the demand history (covering one decay delay).
pub const SLOTS: usize = 8;

/// Shared retention counters and demand history.
///
/// ```
/// use pagewise::Config;
/// use pagewise::budget::Budget;
/// let b = Budget::new();
/// let c = Config { decay_ms: 800, ..Config::DEFAULT };
/// b.add(100 << 20, 0); // 100 MiB committed, all in use
/// b.note(0, &c);
/// b.add(0, 60 << 20); // 60 MiB of it freed and retained
/// b.note(10, &c);
/// let k = b.keep(10, &c);
/// assert_eq!(k.expired, 60 << 20, "the peak says they come back");
/// // One decay delay later with no new peak, nothing is needed again.
/// assert_eq!(b.keep(10 + 800, &c).expired, 0);
/// ```
pub struct Budget {
    committed: AtomicUsize,
    retained: AtomicUsize,
    /// The time slot `history` was last advanced to.
    epoch: AtomicU64,
    /// Highest demand seen per slot, indexed by slot number mod `SLOTS`.
    history: [AtomicUsize; SLOTS],
    /// Purges the retained memory of every member heap but the caller's
    /// (a `fn()`, null if none): what an allocation over the limit runs
    /// before it fails.
    purge_others: AtomicPtr<()>,
    /// Bytes counted against the limit: committed or about to be (see the
    /// module docs). Exact, never lazily published.
    charged: AtomicUsize,
    /// Highest `charged` seen.
    peak_charged: AtomicUsize,
    /// The member heaps' huge pages (`memory/huge_pages.rs`).
    pub(crate) huge: crate::memory::huge_pages::HugeCounts,
}

/// What retention may hold now (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keep {
    /// Total retained bytes up to which expired spans are kept.
    pub expired: usize,
    /// Total retained bytes up to which young spans are kept.
    pub young: usize,
    /// When the history moves next (a kept expired span may go then).
    pub recheck_at: u64,
}

/// The budget of the global allocator's thread heaps.
pub static GLOBAL: Budget = Budget::new();

impl Default for Budget {
    fn default() -> Self {
        Self::new()
    }
}

impl Budget {
    /// An empty budget.
    pub const fn new() -> Budget {
        Budget {
            committed: AtomicUsize::new(0),
            retained: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            history: [const { AtomicUsize::new(0) }; SLOTS],
            purge_others: AtomicPtr::new(core::ptr::null_mut()),
            charged: AtomicUsize::new(0),
            peak_charged: AtomicUsize::new(0),
            huge: crate::memory::huge_pages::HugeCounts::new(),
        }
    }

    /// Reserves `bytes` about to be committed, unless that would take the
    /// charged bytes past `limit` (`usize::MAX`: no limit; the bytes are
    /// counted all the same, so a limit set later starts exact). Returns
    /// whether they were reserved. Lock-free: threads racing for the last
    /// bytes under the limit get them one at a time, none past it.
    ///
    /// ```
    /// use pagewise::budget::Budget;
    /// let b = Budget::new();
    /// assert!(b.charge(48, 64));
    /// assert!(!b.charge(17, 64), "65 would pass the limit");
    /// assert!(b.charge(16, 64));
    /// b.uncharge(32);
    /// assert_eq!((b.charged(), b.peak_charged()), (32, 64));
    /// ```
    pub fn charge(&self, bytes: usize, limit: usize) -> bool {
        if bytes == 0 {
            return true;
        }
        let now = if limit == usize::MAX {
            self.charged.fetch_add(bytes, Relaxed).wrapping_add(bytes)
        } else {
            let mut cur = self.charged.load(Relaxed);
            loop {
                let Some(new) = cur.checked_add(bytes).filter(|&n| n <= limit) else {
                    return false;
                };
                match self
                    .charged
                    .compare_exchange_weak(cur, new, Relaxed, Relaxed)
                {
                    Ok(_) => break new,
                    Err(seen) => cur = seen,
                }
            }
        };
        if now > self.peak_charged.load(Relaxed) {
            self.peak_charged.fetch_max(now, Relaxed);
        }
        true
    }

    /// Gives back `bytes` charged before (purged, decommitted or unmapped,
    /// or not committed after all).
    pub fn uncharge(&self, bytes: usize) {
        if bytes != 0 {
            let before = self.charged.fetch_sub(bytes, Relaxed);
            debug_assert!(before >= bytes, "uncharged {bytes} of {before}");
        }
    }

    /// Bytes counted against the limit now.
    pub fn charged(&self) -> usize {
        self.charged.load(Relaxed)
    }

    /// The highest [`Budget::charged`] seen.
    pub fn peak_charged(&self) -> usize {
        self.peak_charged.load(Relaxed)
    }

    /// Adds signed deltas (two's complement in a `usize`) to committed and
    /// retained bytes.
    pub fn add(&self, committed: usize, retained: usize) {
        if committed != 0 {
            self.committed.fetch_add(committed, Relaxed);
        }
        if retained != 0 {
            self.retained.fetch_add(retained, Relaxed);
        }
    }

    /// Committed bytes of every member heap (as last published).
    pub fn committed(&self) -> usize {
        self.committed.load(Relaxed)
    }

    /// Retained bytes of every member heap (as last published).
    pub fn retained(&self) -> usize {
        self.retained.load(Relaxed)
    }

    /// Committed bytes in use.
    pub fn demand(&self) -> usize {
        self.committed().saturating_sub(self.retained())
    }

    /// Sets what an allocation over the limit runs to purge the other
    /// member heaps (the global allocator sets it when it makes its first
    /// heap). It runs with no span lock of the caller held, and must not
    /// allocate.
    pub fn set_purge_others(&self, f: fn()) {
        self.purge_others.store(f as *mut (), Relaxed);
    }

    /// Runs the hook of [`Budget::set_purge_others`], if any.
    pub fn purge_others(&self) {
        let p = self.purge_others.load(Relaxed);
        if !p.is_null() {
            // SAFETY: only `set_purge_others` stores here, and it stores a
            // `fn()`; function and data pointers have one size on every
            // platform pagewise builds for.
            let f = unsafe { core::mem::transmute::<*mut (), fn()>(p) };
            f();
        }
    }

    fn slot_ms(config: &Config) -> u64 {
        (config.decay_ms / SLOTS as u64).max(1)
    }

    /// Records the current demand in the history.
    pub fn note(&self, now: u64, config: &Config) {
        let e = now / Self::slot_ms(config);
        let cur = self.epoch.load(Relaxed);
        if e > cur
            && self
                .epoch
                .compare_exchange(cur, e, Relaxed, Relaxed)
                .is_ok()
        {
            for k in cur + 1..=e.min(cur + SLOTS as u64) {
                self.history[(k % SLOTS as u64) as usize].store(0, Relaxed);
            }
        }
        // Most calls find the slot already at or above today's demand (a
        // churn frees and takes back the same bytes): a load then, not a
        // locked read-modify-write on a line every heap shares.
        let slot = &self.history[(e % SLOTS as u64) as usize];
        let demand = self.demand();
        if slot.load(Relaxed) < demand {
            slot.fetch_max(demand, Relaxed);
        }
    }

    /// When the history's slot of `now` ends.
    pub fn next_slot_at(&self, now: u64, config: &Config) -> u64 {
        let slot = Self::slot_ms(config);
        (now / slot + 1) * slot
    }

    /// The highest demand over the last decay delay (at least today's).
    pub fn peak(&self, now: u64, config: &Config) -> usize {
        let mut peak = self.demand();
        if config.decay_ms == 0 {
            return peak;
        }
        let e = now / Self::slot_ms(config);
        let cur = self.epoch.load(Relaxed);
        for k in 0..SLOTS as u64 {
            let Some(slot) = cur.checked_sub(k) else {
                break;
            };
            // Slots older than the window (the history was not advanced
            // while nobody allocated) no longer count.
            if slot + (SLOTS as u64) > e {
                peak = peak.max(self.history[(slot % SLOTS as u64) as usize].load(Relaxed));
            }
        }
        peak
    }

    /// A lower bound of [`Keep::young`] that needs no history: retention
    /// at or under it is within the budget whatever the demand was. (The
    /// slack alone is at least 2 MiB.)
    pub(crate) fn young_floor(config: &LiveConfig) -> usize {
        if config.decay_ms() == 0 {
            0
        } else {
            (2usize << 20).min(config.retain_max_bytes())
        }
    }

    /// What retention may hold now.
    pub fn keep(&self, now: u64, config: &Config) -> Keep {
        let peak = self.peak(now, config);
        let needed = peak.saturating_sub(self.demand());
        let slack = if config.decay_ms == 0 {
            0
        } else {
            (peak / 5).max(2 << 20)
        };
        let ceiling = config.retain_max_bytes;
        let slot = Self::slot_ms(config);
        Keep {
            expired: needed.min(ceiling),
            young: needed.saturating_add(slack).min(ceiling),
            recheck_at: (now / slot + 1) * slot,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_history_does_not_count() {
        let b = Budget::new();
        let c = Config {
            decay_ms: 80,
            ..Config::DEFAULT
        };
        b.add(50, 0);
        b.note(5, &c);
        b.add(0, 40);
        assert_eq!(b.peak(5, &c), 50);
        assert_eq!(b.peak(79, &c), 50);
        assert_eq!(b.peak(80, &c), 10, "the slot of t=5 left the window");
        b.note(1000, &c);
        assert_eq!(b.peak(1000, &c), 10);
    }
}
