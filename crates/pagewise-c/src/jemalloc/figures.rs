//! jemalloc's statistics from pagewise's counters, and the snapshot that
//! writing `epoch` refreshes.
//!
//! jemalloc's chain is `allocated <= active <= resident`, and Redis's
//! fragmentation figures divide one by the other, so the mapping keeps it
//! by construction (the table is in docs/guide/observing-memory.md):
//!
//! | jemalloc | pagewise |
//! |---|---|
//! | `stats.allocated` | live bytes (usable sizes, as jemalloc counts) |
//! | `stats.active` | committed bytes not retained: pages holding live objects, with their free slots |
//! | `stats.metadata` | metadata bytes (segment headers, heap structures) |
//! | `stats.resident` | committed bytes plus metadata: every page that may be resident, retained empty pages included (an upper bound, as jemalloc's is) |
//! | `stats.mapped` | active plus metadata (jemalloc: active extents, no dirty pages) |
//! | `stats.retained` | address space mapped with nothing behind it: purged or never touched (jemalloc: retained virtual memory) |
//!
//! pagewise's own "retained" (committed free pages kept for reuse) is
//! jemalloc's *dirty* memory: inside `resident`, outside `active`.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

/// jemalloc's six byte counts, from one snapshot of pagewise's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// `stats.allocated`.
    pub allocated: u64,
    /// `stats.active`.
    pub active: u64,
    /// `stats.metadata`.
    pub metadata: u64,
    /// `stats.resident`.
    pub resident: u64,
    /// `stats.mapped`.
    pub mapped: u64,
    /// `stats.retained`.
    pub retained: u64,
}

impl Figures {
    /// The figures of one snapshot of pagewise's counters.
    pub fn of(s: &pw::Stats) -> Figures {
        let allocated = s.live_bytes;
        // Committed sums the heaps one after the other, live bytes come
        // from the totals: `max` keeps the chain when a heap moved between.
        let active = s
            .committed_bytes
            .saturating_sub(s.retained_bytes)
            .max(allocated);
        let metadata = s.metadata_bytes;
        let resident = s.committed_bytes.max(active) + metadata;
        Figures {
            allocated,
            active,
            metadata,
            resident,
            mapped: active + metadata,
            retained: s.syscalls.mapped_bytes.saturating_sub(resident),
        }
    }

    fn load() -> Figures {
        let [allocated, active, metadata, resident, mapped, retained] =
            SNAPSHOT.each_ref().map(|v| v.load(Relaxed));
        Figures {
            allocated,
            active,
            metadata,
            resident,
            mapped,
            retained,
        }
    }

    fn store(&self) {
        let values = [
            self.allocated,
            self.active,
            self.metadata,
            self.resident,
            self.mapped,
            self.retained,
        ];
        for (slot, v) in SNAPSHOT.iter().zip(values) {
            slot.store(v, Relaxed);
        }
    }
}

/// The figures as of the last `epoch` write, in [`Figures`] field order.
static SNAPSHOT: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
/// Refreshes so far (0: none yet; the first read takes one).
static EPOCH: AtomicU64 = AtomicU64::new(0);
/// A refresh is storing the snapshot.
static STORING: AtomicBool = AtomicBool::new(false);

/// Takes a new snapshot (jemalloc's `epoch` write) and returns the epoch
/// after it. The counters are read with no lock of this module held; if
/// another thread is storing its snapshot at that moment, that one stands
/// (it is as recent), so nothing here ever waits, even in a child forked
/// in the middle of a store.
pub fn refresh() -> u64 {
    let f = Figures::of(&pw::stats());
    if !STORING.swap(true, Acquire) {
        f.store();
        EPOCH.fetch_add(1, Release);
        STORING.store(false, Release);
    }
    EPOCH.load(Acquire)
}

/// The current epoch (0 before the first snapshot).
pub fn epoch() -> u64 {
    EPOCH.load(Acquire)
}

/// The figures of the last snapshot, as jemalloc serves its cached
/// statistics until the next `epoch` write; the first call takes one.
pub fn current() -> Figures {
    if EPOCH.load(Acquire) == 0 {
        refresh();
    }
    Figures::load()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_holds_and_each_figure_is_its_counter() {
        let mut s = pw::Stats::ZERO;
        s.live_bytes = 3000;
        s.committed_bytes = 10_000;
        s.retained_bytes = 4000;
        s.metadata_bytes = 500;
        s.syscalls.mapped_bytes = 64_000;
        let f = Figures::of(&s);
        assert_eq!(
            f,
            Figures {
                allocated: 3000,
                active: 6000,
                metadata: 500,
                resident: 10_500,
                mapped: 6500,
                retained: 53_500,
            }
        );
        // A snapshot that caught live bytes above committed ones (a heap
        // counted before it grew) still keeps allocated <= active <= resident.
        s.committed_bytes = 1000;
        s.retained_bytes = 0;
        let f = Figures::of(&s);
        assert!(f.allocated <= f.active && f.active <= f.resident, "{f:?}");
    }
}
