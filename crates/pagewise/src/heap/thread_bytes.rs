//! The bytes a heap's thread allocated and freed (jemalloc's
//! `thread.allocated` and `thread.deallocated`), from counters the heap
//! keeps for other reasons, so that the fast paths pay nothing for them.
//!
//! - Small allocations: every allocation of a class, from the cache or a
//!   page, is counted already ([`HeapCore::allocs`]); each is one slot.
//! - Small frees by the owner go into its cache. How many went in is
//!   derived: what is there, plus what allocations took out
//!   (`allocs - sampled`, those not served from a page), plus what was
//!   passed on, less what came in as a batch from the transfer cache. The
//!   two last move only on slow paths, through [`HeapCore::take_cached`]
//!   and [`HeapCore::install_cached`], which count them: the cache's list
//!   is reached no other way.
//! - Everything else (large, huge, sampled and guarded blocks, and frees
//!   that do not go into the cache) is counted where it is served or freed,
//!   on its slow path ([`HeapCore::note_allocated`],
//!   [`HeapCore::note_freed`]).
//!
//! A heap outlives its thread and is adopted by a later one: the figures
//! count from the adoption ([`HeapCore::start_thread_bytes`]).

use super::*;
use crate::memory::size_class::SLOT_SIZE;

/// The counters behind a heap's thread figures (owner-written).
pub struct ThreadBytes {
    /// Per class: cached slots passed on (to pages or the transfer cache).
    taken: [Counter; CLASSES],
    /// Per class: cached slots received as a batch from the transfer cache.
    installed: [Counter; CLASSES],
    /// Bytes of blocks not in a class's count: large, huge, sampled,
    /// guarded, and in-place growth.
    allocated: Counter,
    /// Bytes freed by the owner past its cache, and in-place shrinking.
    freed: Counter,
    /// The figures when the current owner adopted the heap.
    base_allocated: Counter,
    base_freed: Counter,
}

impl ThreadBytes {
    pub(super) const fn new() -> ThreadBytes {
        ThreadBytes {
            taken: [const { Counter::zero() }; CLASSES],
            installed: [const { Counter::zero() }; CLASSES],
            allocated: Counter::zero(),
            freed: Counter::zero(),
            base_allocated: Counter::zero(),
            base_freed: Counter::zero(),
        }
    }
}

impl HeapCore {
    /// Detaches all but the `keep` most recent cached slots of `class`
    /// (`ClassState::take_older`), counting them as passed on.
    ///
    /// # Safety
    /// As `ClassState::take_older`.
    pub(super) unsafe fn take_cached(&self, class: usize, keep: u32) -> (*mut Block, u32) {
        // SAFETY: forwarded.
        let (head, n) = unsafe { self.class(class).take_older(keep) };
        self.thread_bytes.taken[class].add(n as u64);
        (head, n)
    }

    /// Detaches the older slots of the full cache of `class` for an
    /// overflow to pass on (`ClassState::take_overflow`), counting them as
    /// passed on.
    ///
    /// # Safety
    /// As `ClassState::take_overflow`.
    pub(super) unsafe fn take_overflow(&self, class: usize) -> (*mut Block, u32) {
        // SAFETY: forwarded.
        let (head, n) = unsafe { self.class(class).take_overflow() };
        self.thread_bytes.taken[class].add(n as u64);
        (head, n)
    }

    /// Makes a batch of `count` slots of `class` the (empty) cache's
    /// content (`ClassState::install`), counting them as received.
    ///
    /// # Safety
    /// As `ClassState::install`.
    pub(super) unsafe fn install_cached(&self, class: usize, head: *mut Block, count: u32) {
        // SAFETY: forwarded.
        unsafe { self.class(class).install(head, count) };
        self.thread_bytes.installed[class].add(count as u64);
    }

    /// Counts `bytes` allocated outside the classes' counts (owner).
    pub(super) fn note_allocated(&self, bytes: usize) {
        self.thread_bytes.allocated.add(bytes as u64);
    }

    /// Counts `bytes` freed by this heap's owner past its cache (owner).
    pub(super) fn note_freed(&self, bytes: usize) {
        self.thread_bytes.freed.add(bytes as u64);
    }

    /// Bytes allocated and freed by this heap's owners since it was made.
    /// (Not a snapshot of one instant when read from another thread.)
    fn thread_totals(&self) -> (u64, u64) {
        let mut allocated = self.thread_bytes.allocated.get();
        let mut freed = self.thread_bytes.freed.get();
        for (class, &slot) in SLOT_SIZE.iter().enumerate() {
            let slot = slot as u64;
            let state = self.class(class);
            let allocs = self.allocs(class);
            let popped = allocs.wrapping_sub(state.sampled.get());
            let pushed = (state.cached() as u64)
                .wrapping_add(popped)
                .wrapping_add(self.thread_bytes.taken[class].get())
                .wrapping_sub(self.thread_bytes.installed[class].get());
            allocated = allocated.wrapping_add(allocs.wrapping_mul(slot));
            freed = freed.wrapping_add(pushed.wrapping_mul(slot));
        }
        (allocated, freed)
    }

    /// Starts the figures of a new owner at zero (the owner, as it adopts
    /// the heap).
    pub fn start_thread_bytes(&self) {
        let (allocated, freed) = self.thread_totals();
        self.thread_bytes.base_allocated.set(allocated);
        self.thread_bytes.base_freed.set(freed);
    }

    /// Bytes the owning thread allocated and freed since it adopted this
    /// heap, in usable sizes (the owner; from another thread, a snapshot).
    /// They wrap around, as jemalloc's do.
    pub fn thread_bytes(&self) -> (u64, u64) {
        let (allocated, freed) = self.thread_totals();
        (
            allocated.wrapping_sub(self.thread_bytes.base_allocated.get()),
            freed.wrapping_sub(self.thread_bytes.base_freed.get()),
        )
    }
}

/// Counts a free past the cache of `bytes` for the calling thread.
///
/// # Safety
/// `current` is the calling thread's heap (or an owned heap it holds), or
/// null (a thread without a heap: not counted).
pub(super) unsafe fn note_freed_by(current: *const HeapCore, bytes: usize) {
    if !current.is_null() {
        // SAFETY: per the caller.
        unsafe { (*current).note_freed(bytes) };
    }
}
