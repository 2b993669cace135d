//! Allocation: the fast paths (the thread cache, then the current page's
//! free list) and what happens when they run dry: refilling a page from
//! its remote frees or fresh OS pages, and choosing the next page.
//!
//! Placement: when the current page of a class runs out, the next one is
//! the fullest non-full page of the class, so sparse pages drain and can be
//! released (an interpreter's most-full-first, a JIT pool's best fit). A
//! page that becomes empty goes back to the span pool at once unless it is
//! the class's current page, which is kept so that a class that repeatedly
//! drains costs nothing; kept pages are released at the next maintenance
//! pass that finds them still empty.
//!
//! Invariants: everything here runs on the heap's owning thread; the only
//! shared state it touches is a page's `thread_free` word (atomic) and the
//! span pool (under its lock).

use super::*;
use crate::memory::segment::STATE_SHIFT;
use core::sync::atomic::AtomicU32;

/// Fresh memory a heap commits before other heaps' retention is reclaimed
/// for it.
const FRESH_GRAIN: usize = 1 << 20;

/// Candidates looked at when choosing the fullest non-full page.
const FULLEST_CANDIDATES: usize = 8;

/// Largest request [`HeapCore::alloc_cached16`] serves: every slab class.
pub const CACHED_MAX: usize = SMALL_MAX;

/// Requests up to this size find their class state with one table load.
const STATE_TABLE_MAX: usize = 1024;

/// The byte offset of the class state serving each request size rounded up
/// to 16 bytes, up to [`STATE_TABLE_MAX`]: `(class_of(size) + 1) <<
/// STATE_SHIFT`, the offset the slab table gives the free path. Sizes
/// rounded up to 16 find the class of the size itself, since every slot
/// is a multiple of 16 bytes.
const STATE_AT: [u16; STATE_TABLE_MAX / 16 + 1] = {
    let mut t = [0u16; STATE_TABLE_MAX / 16 + 1];
    let mut i = 0;
    while i < t.len() {
        let class = crate::memory::size_class::computed_class_of(i * 16);
        t[i] = ((class + 1) << STATE_SHIFT) as u16;
        i += 1;
    }
    t
};

/// [`STATE_AT`] as the C library's `malloc` reads it: the same but while
/// the background purger is asked for and not yet started, when every
/// entry is 0, the state that caches nothing, so that the next small
/// `malloc` of any thread takes the slow path, which starts the purger
/// (`global/purger.rs`), and the fast path tests for no request. Entries
/// of 32 bits: a 16-bit atomic load would be widened by one more
/// instruction.
static STATE_AT_BY_16: [AtomicU32; STATE_TABLE_MAX / 16 + 1] = {
    let mut t = [const { AtomicU32::new(0) }; STATE_TABLE_MAX / 16 + 1];
    let mut i = 0;
    while i < t.len() {
        t[i] = AtomicU32::new(STATE_AT[i] as u32);
        i += 1;
    }
    t
};

/// Sends every small `malloc` of the C library to its slow path (see
/// [`STATE_AT_BY_16`]) until [`undivert_small_mallocs`].
pub(crate) fn divert_small_mallocs() {
    for e in &STATE_AT_BY_16 {
        e.store(0, SeqCst);
    }
}

/// Undoes [`divert_small_mallocs`] (nothing to undo: no store).
pub(crate) fn undivert_small_mallocs() {
    for (e, &at) in STATE_AT_BY_16.iter().zip(&STATE_AT) {
        if e.load(Relaxed) != at as u32 {
            e.store(at as u32, SeqCst);
        }
    }
}
// Every class has slots of a multiple of 16 bytes in 64 KiB aligned pages,
// so any request with an alignment of at most 16 takes `class_of(size)`.
const _: () = {
    let mut c = 0;
    while c < CLASSES {
        assert!(crate::memory::size_class::SLOT_SIZE[c] % 16 == 0);
        c += 1;
    }
};

impl HeapCore {
    /// Allocates `size` bytes at `align` (a power of two). Null when out of
    /// memory or for impossible requests.
    ///
    /// # Safety
    /// Called by the owning thread only.
    #[inline]
    pub unsafe fn alloc(&self, size: usize, align: usize) -> *mut u8 {
        if size <= SMALL_MAX {
            let class = if align <= 16 {
                class_of(size)
            } else {
                match class_for(size, align) {
                    Some(c) => c,
                    // SAFETY: forwarded.
                    None => return unsafe { self.alloc_large(size, align) },
                }
            };
            // SAFETY: forwarded.
            unsafe { self.alloc_small(class, size, align) }
        } else {
            // SAFETY: forwarded.
            unsafe { self.alloc_large(size, align) }
        }
    }

    /// Allocates zeroed memory, writing zeros only where the memory is not
    /// known to be zero already (large and huge objects on never-used or
    /// `MADV_DONTNEED`-purged pages are left alone).
    ///
    /// # Safety
    /// Called by the owning thread only.
    pub unsafe fn alloc_zeroed(&self, size: usize, align: usize) -> *mut u8 {
        // SAFETY: forwarded (owner).
        let (p, zero) = unsafe {
            if size <= SMALL_MAX && class_for(size, align).is_some() {
                (self.alloc(size, align), false)
            } else {
                self.alloc_span(size, align)
            }
        };
        if !p.is_null() && !zero {
            // SAFETY: a fresh allocation of at least `size` bytes.
            unsafe { core::ptr::write_bytes(p, 0, size) };
        }
        p
    }

    /// A slot of at least `size` bytes (up to [`CACHED_MAX`]), aligned to 16,
    /// from the thread cache of `heap`; null if the request is bigger or the
    /// cache of its class is empty (then take [`HeapCore::alloc`]), as every
    /// cache of [`empty_heap`] is, or if the background purger was asked
    /// for and not started yet (the slow path starts it: for sizes up to
    /// [`STATE_TABLE_MAX`], the table sends them to the state that caches
    /// nothing). The C `malloc`'s fast path: no page, no test for a missing
    /// heap or for the purger, no size or alignment branches beyond one
    /// comparison.
    ///
    /// # Safety
    /// `heap` is the calling thread's own heap, or [`empty_heap`].
    #[inline(always)]
    pub unsafe fn alloc_cached16(heap: *const HeapCore, size: usize) -> *mut u8 {
        // Every class has 16-byte-multiple slots in 64 KiB aligned pages.
        // The common sizes first: one comparison and one table load give
        // the class state's offset, with no shift to scale a class index.
        let state_at = if size <= STATE_TABLE_MAX {
            // SAFETY: (size + 15) / 16 <= STATE_TABLE_MAX / 16, the last index.
            unsafe { STATE_AT_BY_16.get_unchecked((size + 15) >> 4) }.load(Relaxed) as usize
        } else if size <= CACHED_MAX && !crate::global::purger::poll_pending() {
            (class_of(size) + 1) << STATE_SHIFT
        } else {
            return null_mut();
        };
        // SAFETY: `state_at` is the byte offset of the state of a class below
        // CLASSES in the heap's states (as in `cache_free`), which start
        // `STATES_OFFSET` bytes into it, [`empty_heap`]'s too; owner only.
        unsafe {
            let states = (heap as *const u8).wrapping_add(STATES_OFFSET);
            (*(states.add(state_at) as *const ClassState)).pop() as *mut u8
        }
    }

    /// The C `malloc` once [`HeapCore::alloc_cached16`] found the class's
    /// cache empty, for requests of up to [`STATE_TABLE_MAX`] bytes: the
    /// class's current page, else the slow path, straight from `heap`.
    /// The general path (`raw::malloc_uncached` to [`HeapCore::alloc`])
    /// looks at the purger, the thread's heap, the size's class and the
    /// cache again first: about 60 instructions a miss, and a program that
    /// builds a structure misses at most of its allocations (lua5.4 at
    /// seven in ten). `None` when the general path is needed after all:
    /// the thread has no heap yet (`heap` is [`empty_heap`]), the request
    /// is bigger than the table, or the table sends it to the state that
    /// caches nothing (the background purger was asked for: the general
    /// path starts it).
    ///
    /// # Safety
    /// `heap` is the calling thread's own heap, or [`empty_heap`].
    #[cfg(not(feature = "secure"))]
    #[inline(always)]
    pub(crate) unsafe fn alloc_missed16(heap: *const HeapCore, size: usize) -> Option<*mut u8> {
        if size > STATE_TABLE_MAX || core::ptr::eq(heap, empty_heap()) {
            return None;
        }
        // SAFETY: (size + 15) / 16 <= STATE_TABLE_MAX / 16, the last index.
        let state_at =
            unsafe { STATE_AT_BY_16.get_unchecked((size + 15) >> 4) }.load(Relaxed) as usize;
        if state_at == 0 {
            return None;
        }
        // SAFETY: `heap` is the calling thread's own (not the empty one),
        // and `state_at` the offset of the state of a class below CLASSES.
        // Zero bytes are served as one, as the general path serves them.
        Some(unsafe { (*heap).alloc_past_cache((state_at >> STATE_SHIFT) - 1, size.max(1), 16) })
    }

    /// The hardened build's fast path: a slot for a request of `size`
    /// bytes (1 to [`CACHED_MAX`]) from the thread cache of `heap`, found as
    /// [`HeapCore::alloc_cached16`] finds it, and the byte offset of its
    /// class state, `(class + 1) << STATE_SHIFT`. The slot is null if the
    /// cache of the class is empty, as every cache of [`empty_heap`] is;
    /// the offset is 0 (the state that caches nothing) if the background
    /// purger was asked for and not started yet: no test for a missing heap
    /// or for the purger on the way to a cached slot.
    ///
    /// # Safety
    /// `heap` is the calling thread's own heap, or [`empty_heap`]; `size`
    /// is 1 to [`CACHED_MAX`].
    #[cfg(feature = "secure")]
    #[inline(always)]
    pub unsafe fn alloc_cached_at(heap: *const HeapCore, size: usize) -> (*mut u8, usize) {
        debug_assert!((1..=CACHED_MAX).contains(&size));
        let state_at = if size <= STATE_TABLE_MAX {
            // SAFETY: (size + 15) / 16 <= STATE_TABLE_MAX / 16, the last index.
            unsafe { STATE_AT_BY_16.get_unchecked((size + 15) >> 4) }.load(Relaxed) as usize
        } else if !crate::global::purger::poll_pending() {
            (class_of(size) + 1) << STATE_SHIFT
        } else {
            0
        };
        // SAFETY: as in `alloc_cached16`.
        unsafe {
            let states = (heap as *const u8).wrapping_add(STATES_OFFSET);
            let p = (*(states.add(state_at) as *const ClassState)).pop() as *mut u8;
            (p, state_at)
        }
    }

    /// A slot of `class` for a request of `size` bytes past the thread
    /// cache (its current page's free list, else the slow path), null when
    /// out of memory (the hardened build's second fast path; the slot may
    /// be a sampled block instead).
    ///
    /// # Safety
    /// Owner only; `class` is below CLASSES and `class_of(size)`.
    #[cfg(feature = "secure")]
    #[inline(always)]
    pub unsafe fn alloc_past_cache_of(&self, class: usize, size: usize) -> *mut u8 {
        // In line: the hardened miss path (`secure::alloc_from_page`) is
        // already out of line, and a second call would save and restore
        // registers again at every miss. SAFETY: per the caller.
        unsafe { self.alloc_past_cache_inline(class, size, 16) }
    }

    /// # Safety
    /// Owner only.
    #[inline]
    pub(crate) unsafe fn alloc_small(&self, class: usize, size: usize, align: usize) -> *mut u8 {
        debug_assert!(class < CLASSES);
        // SAFETY: `class_of` and `class_for` return classes below CLASSES.
        let state = unsafe { self.states.get_unchecked(class + 1) };
        // SAFETY: owner only (caller): the cache is ours and holds free slots
        // of this class (a page with a slot out is never released).
        unsafe {
            let b = state.pop();
            if !b.is_null() {
                return b as *mut u8;
            }
            self.alloc_past_cache(class, size, align)
        }
    }

    /// `alloc_small` past the cache: the current page's free list, else the
    /// slow path. Out of line, so that the pop stays small enough to be
    /// inlined where the class is known (a constant-size allocation folds
    /// the class lookup away).
    ///
    /// # Safety
    /// Owner only.
    #[inline(never)]
    pub(super) unsafe fn alloc_past_cache(
        &self,
        class: usize,
        size: usize,
        align: usize,
    ) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { self.alloc_past_cache_inline(class, size, align) }
    }

    /// [`HeapCore::alloc_past_cache`]'s body, for callers that are out of
    /// line themselves (the hardened build's miss path).
    ///
    /// # Safety
    /// Owner only.
    #[inline(always)]
    unsafe fn alloc_past_cache_inline(&self, class: usize, size: usize, align: usize) -> *mut u8 {
        // SAFETY: `class` is below CLASSES (caller); owner only: `direct`
        // pages are live slab pages of this heap or the never-written empty
        // page.
        unsafe {
            let state = self.class(class);
            if state.sample_due() {
                return self.alloc_sampled(class, size, align);
            }
            // The list ran dry: the slots the cache's last overflow kept
            // come next, as they would from one list.
            if state.take_up_older() {
                return state.pop() as *mut u8;
            }
            let page: *mut Page = self.direct.get_unchecked(class);
            if (*page).has_free() {
                return self.pop(page, class, size);
            }
            self.alloc_slow(class, size)
        }
    }

    /// A slot of `class` once the cache and the current page's free list
    /// ran dry. Slots that are free already come before fresh ones: the
    /// current page's remote frees, then the fullest page of the class
    /// with free or remote slots, then a batch from the transfer cache and
    /// an exited thread's leftovers; only then does the heap commit memory,
    /// carving (or refilling hollow slots) on the current page, then on the
    /// fullest page with room, then on a new page. Carving first committed
    /// fresh memory while free slots of the class waited, resident, in the
    /// transfer cache.
    #[cold]
    pub(super) unsafe fn alloc_slow(&self, class: usize, size: usize) -> *mut u8 {
        let mut l = self.lock_local();
        let l = &mut *l;
        // SAFETY: owner only (caller), with the page lists held.
        unsafe {
            self.process_delayed(l, Access::Owner);
            let page = self.current_page(class);
            if page != empty_page() && self.collect(page) {
                return self.pop(page, class, size);
            }
            self.maintenance(l);
            // Maintenance may have emptied the caches into this page (then
            // it has free slots again), or even released it (then it is no
            // longer current): look again.
            let page = self.current_page(class);
            if page != empty_page() {
                if self.collect(page) {
                    return self.pop(page, class, size);
                }
                if !can_carve(&*page) {
                    self.retire_exhausted(l, page);
                }
            }
            if let Some(p) = self.fullest_nonfull(l, class, Room::Free) {
                self.set_current_page(class, p);
                // In use again: its free OS pages stay (`heap/hollow.rs`).
                (*p).back_in_use();
                if self.collect(p) {
                    return self.pop(p, class, size);
                }
            }
            if self.global {
                // Before fresh slots: slots other threads freed.
                let p = self.alloc_from_transfer(class);
                if !p.is_null() {
                    return p;
                }
                // Then slots exited threads' heaps left (`leftovers.rs`).
                let p = self.alloc_from_leftovers(class);
                if !p.is_null() {
                    return p;
                }
            }
            let page = self.current_page(class);
            if page != empty_page() {
                match self.carve(page) {
                    Ok(true) => return self.pop(page, class, size),
                    Ok(false) => self.retire_exhausted(l, page),
                    Err(OverLimit) => return self.alloc_over_limit(l, class, size),
                }
            }
            let next = match self.fullest_nonfull(l, class, Room::Carve) {
                Some(p) => p,
                None => match self.new_slab_page(l, class) {
                    Some(p) => p,
                    None => return null_mut(),
                },
            };
            self.set_current_page(class, next);
            // In use again: its free OS pages stay (`heap/hollow.rs`).
            (*next).back_in_use();
            match self.refill(next) {
                Ok(true) => {}
                Ok(false) => return null_mut(),
                Err(OverLimit) => return self.alloc_over_limit(l, class, size),
            }
            self.pop(next, class, size)
        }
    }

    /// Takes the first slot of `page`'s free list. Aborts if it does not
    /// hold the page key: it was freed twice (its other copy was handed out
    /// from a cache or from this list, or is still in a cache).
    ///
    /// # Safety
    /// Owner only; `page` has a free slot.
    #[inline]
    pub(super) unsafe fn pop(&self, page: *mut Page, class: usize, size: usize) -> *mut u8 {
        // SAFETY: per the caller.
        unsafe {
            let b = (*page).free;
            if !Block::is_in_page(b) {
                misuse(crate::memory::block::KEY_LOST, b as usize);
            }
            let next = Block::next(b);
            (*page).free = next;
            // The next pop reads `next`: a slot freed a while ago is cold,
            // and the free list is a chain of dependent loads, so its load
            // starts now (a null `next` is not dereferenced by a prefetch).
            // In python3 with PYTHONMALLOC=malloc this load was 97 % of the
            // time of this path.
            #[cfg(target_arch = "x86_64")]
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                next as *const i8,
            );
            Block::mark_live(b);
            (*page).set_used((*page).used() + 1);
            self.class(class).count_alloc(size);
            b as *mut u8
        }
    }

    /// Gives `page` a free slot if it can: remote frees first, then fresh
    /// slots ([`HeapCore::collect`], then [`HeapCore::carve`]). Owner only,
    /// with the page lists held.
    pub(super) unsafe fn refill(&self, page: *mut Page) -> Result<bool, OverLimit> {
        // SAFETY: per the caller.
        unsafe {
            if self.collect(page) {
                return Ok(true);
            }
            self.carve(page)
        }
    }

    /// Whether `page` has a free slot, once the slots other threads freed
    /// to it are taken in; commits nothing. Owner only.
    pub(super) unsafe fn collect(&self, page: *mut Page) -> bool {
        // SAFETY: owner only; `page` is a slab page of this heap. Page
        // methods borrow it only for the call.
        unsafe {
            if (*page).has_free() {
                return true;
            }
            let n = (*page).collect_thread_free();
            if n > 0 {
                self.class((*page).class as usize).returned.add(n as u64);
                return true;
            }
        }
        false
    }

    /// Gives `page`, which has no free slot, slots that need memory: its
    /// hollow slots, else fresh ones. Owner only, with the page lists held
    /// (counters it updates are the visitors' too). Whatever it commits
    /// (slots on purged OS pages, fresh ones) is charged against the hard
    /// limit first: `Err` if the limit refused it, with nothing committed.
    pub(super) unsafe fn carve(&self, page: *mut Page) -> Result<bool, OverLimit> {
        // SAFETY: owner only; `page` is a slab page of this heap. Page
        // methods borrow it only for the call.
        unsafe {
            let seg = &*Segment::of(crate::memory::layout::segment_base((*page).start));
            // Slots on purged OS pages before fresh ones: the page stays as
            // compact as it was.
            if (*page).can_refill_hollow() {
                // What `refill_hollow` commits: every carved OS page that
                // is not committed.
                let base = seg.os_page((*page).start);
                let carved = (*page).carved_os_pages();
                let need = (carved - seg.count_committed(base, carved)) * os_page();
                if !self.charge(need) {
                    return Err(OverLimit);
                }
                let before = self.slab_committed.get();
                let refilled = self.refill_hollow(page);
                self.settle_charge(need, (self.slab_committed.get() - before) as usize);
                if refilled {
                    return Ok(true);
                }
            }
            if (*page).capacity() < (*page).reserved {
                let (first, count) = next_carved_os_pages(&*page);
                let need = (count - seg.count_committed(seg.os_page(first), count)) * os_page();
                if !self.charge(need) {
                    return Err(OverLimit);
                }
                let carved = (*page).extend(self.shuffle_carving);
                debug_assert_eq!(carved, (first, count));
                let (first, count) = carved;
                let newly = seg.set_committed(seg.os_page(first), count);
                self.settle_charge(need, newly * os_page());
                self.slab_committed.add((newly * os_page()) as u64);
                self.note_peak();
                self.note_fresh(newly * os_page());
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// `need` bytes were charged for a commit that committed `newly`:
    /// gives back what was not committed after all (and, should the two
    /// ever disagree the other way, counts the difference: the count never
    /// falls below what is committed).
    fn settle_charge(&self, need: usize, newly: usize) {
        debug_assert!(
            newly <= need,
            "committed {newly} bytes on a charge of {need}"
        );
        if newly < need {
            self.budget().uncharge(need - newly);
        } else if newly > need {
            self.budget().charge(newly - need, usize::MAX);
        }
    }

    /// The limit refused the memory a new slot of the current page needs:
    /// a slot that needs none if the class has one (another page of the
    /// class with free or remotely freed slots, the transfer cache), else
    /// null.
    ///
    /// # Safety
    /// Owner only, with the page lists held.
    #[cold]
    unsafe fn alloc_over_limit(&self, l: &mut Local, class: usize, size: usize) -> *mut u8 {
        let mut p = l.queues[class].head;
        // SAFETY: queue entries are slab pages of this heap; owner only.
        unsafe {
            while !p.is_null() {
                let mut usable = (*p).has_free();
                if !usable {
                    let n = (*p).collect_thread_free();
                    self.class(class).returned.add(n as u64);
                    usable = n > 0;
                }
                if usable {
                    self.set_current_page(class, p);
                    (*p).back_in_use();
                    return self.pop(p, class, size);
                }
                p = (*p).next;
            }
        }
        if self.global {
            // SAFETY: owner only (caller).
            return unsafe { self.alloc_from_transfer(class) };
        }
        null_mut()
    }

    /// Counts fresh memory this heap committed; past a grain, other heaps
    /// give back as much of what they retain ([`heaps::reclaim_elsewhere`]).
    /// With the page lists held.
    ///
    /// [`heaps::reclaim_elsewhere`]: crate::global::heaps::reclaim_elsewhere
    pub(super) fn note_fresh(&self, bytes: usize) {
        if !self.global || bytes == 0 {
            return;
        }
        self.fresh.add(bytes as u64);
        let fresh = self.fresh.get() as usize;
        if fresh >= FRESH_GRAIN && self.budget().retained() > 0 {
            self.fresh.sub(fresh as u64);
            crate::global::heaps::reclaim_elsewhere(self, fresh);
        }
    }

    /// Moves an exhausted current page to the full list (unless remote frees
    /// just arrived). A page on the full list is never current: a visitor
    /// may free into it (the heap's delayed list). Owner only.
    pub(super) unsafe fn retire_exhausted(&self, l: &mut Local, page: *mut Page) {
        // SAFETY: owner only; `page` is this heap's current page of its class.
        // If remote frees arrived meanwhile, try_mark_full collected them and
        // the page stays on its queue with free slots.
        unsafe {
            let class = (*page).class as usize;
            match (*page).try_mark_full() {
                Ok(()) => {
                    self.set_current_page(class, empty_page());
                    l.queues[class].remove(page);
                    l.full.push(page);
                }
                Err(collected) => self.class(class).returned.add(collected as u64),
            }
        }
    }

    /// The fullest page of the class queue (among the first few) with
    /// `room`, other than an exhausted current page. Owner only.
    pub(super) unsafe fn fullest_nonfull(
        &self,
        l: &Local,
        class: usize,
        room: Room,
    ) -> Option<*mut Page> {
        let mut best: *mut Page = null_mut();
        let mut best_used = 0;
        let mut p = l.queues[class].head;
        let mut seen = 0;
        while !p.is_null() && seen < FULLEST_CANDIDATES {
            // SAFETY: queue entries are slab pages of this heap.
            let (usable, used, next) = unsafe {
                let usable =
                    (*p).has_free() || (*p).has_remote() || (room == Room::Carve && can_carve(&*p));
                (usable, (*p).used(), (*p).next)
            };
            if usable && (best.is_null() || used > best_used) {
                best = p;
                best_used = used;
            }
            seen += 1;
            p = next;
        }
        (!best.is_null()).then_some(best)
    }

    pub(super) unsafe fn new_slab_page(&self, l: &mut Local, class: usize) -> Option<*mut Page> {
        if self.global {
            // Memory that may later be retained: the purger must be there
            // before the program goes quiet (in the C library it starts at
            // the next allocation, where that is safe).
            crate::global::purger::request();
        }
        let slices = self.page_slices[class] as usize;
        // The span commits nothing (its committed pages were counted when
        // they were committed; slots are charged as they are carved) but a
        // new segment's header and a region that gets a huge page, which
        // the span pool charges. Such a region's free spans are retained:
        // `after_span_change` gives them a deadline.
        let slab_bytes = self.slab_committed.get() as usize;
        let (page, fresh) = self.take_spans_within_limit(|ctx, spans| {
            let now = self.source().now_ms();
            self.slab_grown_at.set(now);
            let (page, committed, fresh) = spans.take_for_slab(ctx, slices, slab_bytes, now)?;
            self.slab_committed.add(committed as u64);
            self.publish(spans, now);
            self.after_span_change(ctx, spans, now);
            Some((page, fresh))
        })?;
        // A huge page is fresh memory as carved slots are: exited threads'
        // retention makes room for it (with the span lock let go).
        self.note_fresh(fresh);
        // The span lock is let go here: the span must already be a slab
        // span, or a neighbour freed now would merge it (`Spans::take`).
        crate::sync::perturb::point();
        // SAFETY: a freshly taken span, exclusively ours; owner only.
        unsafe {
            (*page).init_slab(class, SLOT_SIZE[class] as usize, slices * SLICE, self.me());
            let seg = &*Segment::of(crate::memory::layout::segment_base((*page).start));
            seg.mark_slab(seg.slice_index((*page).start), slices, class);
            let c = &self.page_counts[class];
            c.pages.add(1);
            c.slots.add((*page).reserved as u64);
            l.queues[class].push(page);
        }
        Some(page)
    }

    /// Returns an empty slab page to the span pool. With the page lists
    /// held; a current page only by its owner.
    pub(super) unsafe fn release_page(&self, l: &mut Local, page: *mut Page) {
        // SAFETY: the page lists are held; `page` is an empty slab page of
        // this heap, on its class queue or the full list.
        unsafe {
            (*page).verify_empty();
            self.leave_groups_before_release(l, page);
            let class = (*page).class as usize;
            if (*page).in_full {
                l.full.remove(page);
                (*page).clear_full();
            } else {
                l.queues[class].remove(page);
            }
            if self.current_page(class) == page {
                self.set_current_page(class, empty_page());
            }
            let c = &self.page_counts[class];
            c.pages.sub(1);
            c.slots.sub((*page).reserved as u64);
            // Its hollow OS pages are already purged: the span pool counts
            // only the committed ones (the bitmap).
            self.hollow_bytes
                .sub((*page).hollow_pages() as u64 * os_page() as u64);
            let seg = &*Segment::of(crate::memory::layout::segment_base((*page).start));
            seg.clear_slab(
                seg.slice_index((*page).start),
                self.page_slices[class] as usize,
            );
            // The span becomes `Kind::Free` inside `give_back_slab`, under
            // the span lock: a neighbour being freed by another thread must
            // not see it free before it is in the pool.
        }
        let now = self.source().now_ms();
        let ctx = self.ctx();
        let mut spans = self.spans.lock();
        let moved = spans.give_back_slab(page, now);
        self.slab_committed.sub(moved as u64);
        self.after_span_change(&ctx, &mut spans, now);
    }
}

/// A charge against the hard limit was refused (`HeapCore::refill`).
pub(super) struct OverLimit;

/// The pages [`HeapCore::fullest_nonfull`] looks for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Room {
    /// Free slots or remotely freed ones: memory committed already.
    Free,
    /// Those, or slots still to carve or hollow ones to refill.
    Carve,
}

/// Whether `page` has slots that [`HeapCore::carve`] can give it.
fn can_carve(page: &Page) -> bool {
    page.capacity() < page.reserved || page.can_refill_hollow()
}

/// The OS pages [`Page::extend`] touches next, as `(first page address,
/// count)`: the slots it carves run from the end of the carved ones to the
/// end of that OS page (at least one slot, at most the page's last).
fn next_carved_os_pages(page: &Page) -> (usize, usize) {
    let capacity = page.capacity() as usize;
    let slot = page.slot_size as usize;
    let begin = page.start + capacity * slot;
    let os = os_page();
    let limit = crate::memory::layout::align_up(begin + 1, os);
    let n = ((limit - begin) / slot)
        .max(1)
        .min(page.reserved as usize - capacity);
    let end = begin + n * slot;
    let first = begin & !(os - 1);
    let last = (end - 1) & !(os - 1);
    (first, (last - first) / os + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The malloc fast path's table gives, for every size it covers, the
    /// offset of the state of the class `class_of` picks: the offset the
    /// slab table gives the free path for that class's slots.
    #[test]
    fn the_state_table_finds_the_class_of_every_size() {
        for size in 0..=STATE_TABLE_MAX {
            let at = STATE_AT[(size + 15) >> 4] as usize;
            assert_eq!(at, (class_of(size) + 1) << STATE_SHIFT, "size {size}");
        }
    }

    /// A diverted table sends every small size to the state that caches
    /// nothing; undoing it puts every entry back.
    #[test]
    fn a_diverted_table_finds_the_state_that_caches_nothing() {
        // The purger started (or turned off) first: no start undoes the
        // diversion below meanwhile.
        crate::global::purger::ensure();
        divert_small_mallocs();
        let diverted: Vec<u32> = STATE_AT_BY_16.iter().map(|e| e.load(Relaxed)).collect();
        undivert_small_mallocs();
        assert!(diverted.iter().all(|&at| at == 0), "{diverted:?}");
        for (e, &at) in STATE_AT_BY_16.iter().zip(&STATE_AT) {
            assert_eq!(e.load(Relaxed), at as u32);
        }
    }
}
