//! The call sites of sampled allocations: each distinct stack once, with
//! what its samples stand for (live now, at the peak, allocated in all).
//!
//! The store is one table mapped once, at the first sample, straight from
//! the OS (never from the allocator itself) and touched only as sites are
//! added: [`CAPACITY`] sites of [`DEPTH`] frames each, found by the hash of
//! their frames through an open-addressing index. Sites are only ever
//! added, under one lock that no other lock is taken under (the fork
//! handlers hold it across `fork()`); a site is published by the count of
//! sites, so readers walk the table without the lock. The figures are
//! atomic sums, changed without the lock by the allocations and frees of
//! sampled objects on any thread.
//!
//! A stack that finds the table full is counted on the site of index 0,
//! which has no frames: its figures are the samples that could not be told
//! apart.

use super::unwind::DEPTH;
use crate::sync::lock::Locked;
use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};

/// Most distinct stacks told apart.
pub const CAPACITY: usize = 1 << 14;
/// Slots of the index (twice the sites: probes stay short).
const INDEX: usize = 2 * CAPACITY;

/// Fixed-point scale of the estimated counts (a sample of a small object
/// stands for thousands of allocations, one of a large object for about
/// one: 16 fractional bits keep both exact enough).
pub const COUNT_ONE: u64 = 1 << 16;

/// Estimated allocations (in [`COUNT_ONE`] units) and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// Estimated allocations, times [`COUNT_ONE`].
    pub count: u64,
    /// Estimated bytes.
    pub bytes: u64,
}

struct Counter2 {
    count: AtomicU64,
    bytes: AtomicU64,
}

impl Counter2 {
    fn add(&self, f: Figures) {
        self.count.fetch_add(f.count, Relaxed);
        self.bytes.fetch_add(f.bytes, Relaxed);
    }
    fn sub(&self, f: Figures) {
        self.count.fetch_sub(f.count, Relaxed);
        self.bytes.fetch_sub(f.bytes, Relaxed);
    }
    fn get(&self) -> Figures {
        Figures {
            count: self.count.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
        }
    }
    fn set(&self, f: Figures) {
        self.count.store(f.count, Relaxed);
        self.bytes.store(f.bytes, Relaxed);
    }
}

/// One call site (the table's entry; zeroed memory is an empty one).
#[repr(C)]
struct Entry {
    hash: u64,
    depth: usize,
    frames: [usize; DEPTH],
    live: Counter2,
    peak: Counter2,
    allocated: Counter2,
}

/// The table and its index, once mapped.
struct Table {
    entries: *mut Entry,
    /// Per slot: a site's index + 1, or 0.
    index: *mut u32,
}

/// The process's sites.
pub struct Sites {
    /// The mapped table (null until the first sample).
    table: AtomicPtr<Entry>,
    /// Its index.
    index: AtomicPtr<u32>,
    /// Sites in the table (the ones below are complete).
    len: AtomicUsize,
    /// Taken to add a site or to copy the live figures to the peak ones.
    lock: Locked<()>,
    /// Estimated live bytes of every site together.
    live_total: AtomicU64,
    /// The process's committed bytes when the live figures were last
    /// copied to the peak ones.
    peak_total: AtomicU64,
}

/// Every sample of the process.
pub static SITES: Sites = Sites::new();

impl Sites {
    const fn new() -> Sites {
        Sites {
            table: AtomicPtr::new(core::ptr::null_mut()),
            index: AtomicPtr::new(core::ptr::null_mut()),
            len: AtomicUsize::new(0),
            lock: Locked::new(()),
            live_total: AtomicU64::new(0),
            peak_total: AtomicU64::new(0),
        }
    }

    /// The lock the fork handlers hold across `fork()`.
    pub fn lock(&self) -> &Locked<()> {
        &self.lock
    }

    /// The site of `frames` (its index), added if new; `None` if the table
    /// cannot be mapped. A full table gives site 0.
    pub fn intern(&self, frames: &[usize]) -> Option<u32> {
        let hash = hash_of(frames);
        let _g = self.lock.lock();
        let t = self.mapped()?;
        let mut slot = hash as usize & (INDEX - 1);
        loop {
            // SAFETY: `slot` < INDEX, the index's length; the lock is held.
            let at = unsafe { *t.index.add(slot) } as usize;
            if at == 0 {
                break;
            }
            // SAFETY: index entries name published sites.
            let e = unsafe { &*t.entries.add(at - 1) };
            if e.hash == hash && &e.frames[..e.depth] == frames {
                return Some(at as u32 - 1);
            }
            slot = (slot + 1) & (INDEX - 1);
        }
        let n = self.len.load(Relaxed);
        if n == CAPACITY {
            return Some(0);
        }
        // SAFETY: entry `n` is past the published ones, so no reader looks
        // at it; it is zeroed memory of the table.
        unsafe {
            let e = &mut *t.entries.add(n);
            e.hash = hash;
            e.depth = frames.len();
            e.frames[..frames.len()].copy_from_slice(frames);
            *t.index.add(slot) = n as u32 + 1;
        }
        self.len.store(n + 1, Release);
        Some(n as u32)
    }

    /// Maps the table if it is not yet (the lock is held).
    fn mapped(&self) -> Option<Table> {
        let mut entries = self.table.load(Relaxed);
        if entries.is_null() {
            let bytes = CAPACITY * core::mem::size_of::<Entry>();
            let table = crate::os::source::map_table(bytes)?;
            let Some(index) = crate::os::source::map_table(INDEX * 4) else {
                // SAFETY: just mapped, never used.
                unsafe { crate::os::source::unmap_table(table, bytes) };
                return None;
            };
            entries = table.as_ptr().cast();
            self.index.store(index.as_ptr().cast(), Relaxed);
            // Site 0: the stacks of a full table (no frames).
            self.len.store(1, Relaxed);
            self.table.store(entries, Release);
        }
        Some(Table {
            entries,
            index: self.index.load(Relaxed),
        })
    }

    fn entry(&self, site: u32) -> Option<&Entry> {
        let entries = self.table.load(Acquire);
        if entries.is_null() || site as usize >= self.len.load(Acquire) {
            return None;
        }
        // SAFETY: a published site of the mapped table, which is never
        // unmapped.
        Some(unsafe { &*entries.add(site as usize) })
    }

    /// The frames of `site` (innermost first) copied into `out`; how many
    /// (0 for a site not in the table).
    pub fn frames(&self, site: u32, out: &mut [usize; DEPTH]) -> usize {
        let Some(e) = self.entry(site) else { return 0 };
        let n = e.depth.min(DEPTH);
        out[..n].copy_from_slice(&e.frames[..n]);
        n
    }

    /// Counts a sampled allocation at `site`, and copies the live figures
    /// to the peak ones when the process's committed bytes have grown by a
    /// sixteenth since they were last copied (so the peak profile is the
    /// in-use profile at a moment within 6 % of the committed peak, at a
    /// cost that does not grow with it). Committed bytes are the global
    /// heaps' charge (`memory/budget.rs`: what they committed, headers
    /// included, exact at every moment); only global heaps sample.
    pub fn allocated(&self, site: u32, f: Figures) {
        let Some(e) = self.entry(site) else { return };
        e.allocated.add(f);
        e.live.add(f);
        self.live_total.fetch_add(f.bytes, Relaxed);
        let committed = crate::memory::budget::GLOBAL.charged() as u64;
        let peak = self.peak_total.load(Relaxed);
        if committed > peak + peak / 16 {
            if let Some(_g) = self.lock.try_lock() {
                self.copy_to_peak(committed);
            }
        }
    }

    /// Counts a sampled object of `site` resized in place: its new figures
    /// are live (its old ones were counted off as a free).
    pub fn resized(&self, site: u32, f: Figures) {
        let Some(e) = self.entry(site) else { return };
        e.live.add(f);
        self.live_total.fetch_add(f.bytes, Relaxed);
    }

    /// Counts the free of a sampled allocation of `site`.
    pub fn freed(&self, site: u32, f: Figures) {
        let Some(e) = self.entry(site) else { return };
        e.live.sub(f);
        self.live_total.fetch_sub(f.bytes, Relaxed);
    }

    fn copy_to_peak(&self, total: u64) {
        for i in 0..self.len.load(Acquire) {
            if let Some(e) = self.entry(i as u32) {
                e.peak.set(e.live.get());
            }
        }
        self.peak_total.store(total, Relaxed);
    }

    /// Calls `f` with each site that ever had a sample.
    pub fn for_each(&self, mut f: impl FnMut(super::Site<'_>)) {
        for i in 0..self.len.load(Acquire) {
            let Some(e) = self.entry(i as u32) else {
                return;
            };
            let allocated = e.allocated.get();
            if allocated.count == 0 {
                continue;
            }
            f(super::Site {
                frames: &e.frames[..e.depth],
                live: e.live.get(),
                peak: e.peak.get(),
                allocated,
            });
        }
    }

    /// Estimated live bytes of every sampled site together.
    pub fn live_total(&self) -> u64 {
        self.live_total.load(Relaxed)
    }
}

/// FNV-1a over the frames.
fn hash_of(frames: &[usize]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &f in frames {
        h = (h ^ f as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h
}
