//! A heap: size-class queues of slab pages (owner only, no locks), the span
//! pool (behind a lock, shared with remote frees and the purger), and the
//! counters behind `stats()`.
//!
//! Fast paths:
//! - allocate: pop the class's thread cache, else the free list of the
//!   class's current page;
//! - free (any thread heap's slot, by any thread with a heap): push onto the
//!   freeing thread's cache ([`crate::cache`]);
//! - past the cache: onto the page's free list (its owner), or one CAS onto
//!   the page's `thread_free` list (another thread).
//!
//! Placement: when the current page of a class runs out, the next one is the
//! fullest non-full page of the class, so sparse pages drain and can be
//! released (seed 003's most-full-first, seed 002's best fit). A page that
//! becomes empty goes back to the span pool at once unless it is the class's
//! current page, which is kept so that a class that repeatedly drains costs
//! nothing (seed 000); kept pages are released at the next maintenance pass
//! that finds them still empty.

use crate::cache::ClassState;
use crate::config::Config;
use crate::fault::{misuse, Misuse};
use crate::layout::{LARGE_ALIGN_MAX, LARGE_MAX, OS_PAGE, SLICE, SLICE_SHIFT};
use crate::lock::Locked;
use crate::page::{Block, Kind, Page};
use crate::registry;
use crate::reservation::Reservations;
use crate::segment::Segment;
use crate::size_class::{class_for, class_of, CLASSES, PAGE_SLICES, SLOT_SIZE, SMALL_MAX};
use crate::source::PageSource;
use crate::spans::{Ctx, Spans};
use core::cell::UnsafeCell;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};

/// Candidates looked at when choosing the fullest non-full page.
const FULLEST_CANDIDATES: usize = 8;

/// Largest request [`HeapCore::alloc_cached16`] serves: every slab class.
pub const CACHED_MAX: usize = SMALL_MAX;
// `alloc_cached16` serves any request of up to 16 B from class 1 and relies
// on every class from 1 up having slots of a multiple of 16 bytes.
const _: () = {
    assert!(crate::size_class::SLOT_SIZE[1] == 16);
    let mut c = 1;
    while c < CLASSES {
        assert!(crate::size_class::SLOT_SIZE[c] % 16 == 0);
        c += 1;
    }
};

/// A page with no slots, so the fast path needs no null check.
struct EmptyPage(UnsafeCell<Page>);
// SAFETY: the empty page is never written: its free list is null, so the
// fast path falls through to the slow path, which checks for it first.
unsafe impl Sync for EmptyPage {}
static EMPTY_PAGE: EmptyPage = EmptyPage(UnsafeCell::new(Page::empty()));

fn empty_page() -> *mut Page {
    EMPTY_PAGE.0.get()
}

/// A single-writer counter: the owner updates it with a plain load and
/// store (no locked instruction); other threads read it for stats.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub(crate) const fn zero() -> Counter {
        Counter(AtomicU64::new(0))
    }
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }
    #[inline]
    pub(crate) fn sub(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_sub(n), Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

#[derive(Clone, Copy)]
struct Queue {
    head: *mut Page,
    len: usize,
}

impl Queue {
    const EMPTY: Queue = Queue {
        head: null_mut(),
        len: 0,
    };
    fn push(&mut self, p: *mut Page) {
        // SAFETY: `p` is a slab page of this heap, on no queue.
        unsafe {
            (*p).prev = null_mut();
            (*p).next = self.head;
            if !self.head.is_null() {
                (*self.head).prev = p;
            }
        }
        self.head = p;
        self.len += 1;
    }
    fn remove(&mut self, p: *mut Page) {
        // SAFETY: `p` is on this queue.
        unsafe {
            if (*p).prev.is_null() {
                self.head = (*p).next;
            } else {
                (*(*p).prev).next = (*p).next;
            }
            if !(*p).next.is_null() {
                (*(*p).next).prev = (*p).prev;
            }
            (*p).next = null_mut();
            (*p).prev = null_mut();
        }
        self.len -= 1;
    }
}

/// What only the owning thread touches.
struct Local {
    queues: [Queue; CLASSES],
    full: Queue,
    next_maintenance: u64,
}

/// Slab pages of one class in a heap (owner-maintained).
pub struct PageCounts {
    /// Slab pages of the class.
    pub pages: Counter,
    /// Slots those pages can hold.
    pub slots: Counter,
}

impl PageCounts {
    const fn zero() -> PageCounts {
        PageCounts {
            pages: Counter::zero(),
            slots: Counter::zero(),
        }
    }
}

/// One heap. Lives in memory from the page source (never the global
/// allocator) at a fixed address: pages point back to it.
pub struct HeapCore {
    /// The current page of each class. Atomic only so that `stats()` can
    /// read it from another thread; the owner uses plain loads and stores.
    direct: [AtomicPtr<Page>; CLASSES],
    local: UnsafeCell<Local>,
    /// Frees from other threads into pages on the full list.
    delayed: AtomicPtr<Block>,
    /// Span pool, shared with remote large frees and the purger.
    pub spans: Locked<Spans>,
    /// Per size class, at index `class + 1`: its cache, geometry and
    /// counters. Index 0 is a state no address passes, so the free path can
    /// index by the slab table's entry (`class + 1`, or 0 outside slab
    /// pages) without checking for 0 first. Read through [`HeapCore::class`].
    states: [ClassState; CLASSES + 1],
    /// Per class: slab pages and the slots they hold.
    pub page_counts: [PageCounts; CLASSES],
    /// Committed bytes in slab pages (owner-maintained).
    pub slab_committed: Counter,
    /// Highest `slab_committed + span_committed` seen.
    pub peak_committed: Counter,
    /// The span pool's committed bytes as last published (under its lock).
    pub span_committed: Counter,
    source: *const dyn PageSource,
    reservations: *const Locked<Reservations>,
    /// Retention policy.
    pub config: Config,
    /// Set by `trim()` of another thread: empty the caches at the next slow path.
    pub flush_requested: AtomicBool,
    /// Thread that owns the heap (0: none, abandoned).
    pub owner: AtomicUsize,
    /// Next heap in the list of all heaps.
    pub next_heap: AtomicPtr<HeapCore>,
    /// Next heap in the list of abandoned heaps.
    pub next_abandoned: *mut HeapCore,
    /// Earliest time a retained span of this heap expires (u64::MAX: none).
    pub next_deadline: AtomicU64,
    /// A thread heap of the global allocator (serviced by the purger).
    pub global: bool,
}

// SAFETY: owner-only state is behind `local` and only touched by the owning
// thread (documented on each method); everything else is atomic or locked.
unsafe impl Sync for HeapCore {}
// SAFETY: as above; a heap moves between threads only when abandoned/adopted.
unsafe impl Send for HeapCore {}

impl HeapCore {
    /// Builds a heap in place.
    ///
    /// # Safety
    /// `at` is writable, aligned memory for a `HeapCore`; `source` and
    /// `reservations` outlive the heap.
    pub unsafe fn init_at(
        at: *mut HeapCore,
        source: *const dyn PageSource,
        reservations: *const Locked<Reservations>,
        config: Config,
        global: bool,
    ) {
        let heap = HeapCore {
            direct: [const { AtomicPtr::new(null_mut()) }; CLASSES],
            local: UnsafeCell::new(Local {
                queues: [Queue::EMPTY; CLASSES],
                full: Queue::EMPTY,
                next_maintenance: 0,
            }),
            delayed: AtomicPtr::new(null_mut()),
            spans: Locked::new(Spans::new()),
            states: ClassState::all(),
            page_counts: [const { PageCounts::zero() }; CLASSES],
            slab_committed: Counter::zero(),
            peak_committed: Counter::zero(),
            span_committed: Counter::zero(),
            source,
            reservations,
            config,
            flush_requested: AtomicBool::new(false),
            owner: AtomicUsize::new(0),
            next_heap: AtomicPtr::new(null_mut()),
            next_abandoned: null_mut(),
            next_deadline: AtomicU64::new(u64::MAX),
            global,
        };
        for d in &heap.direct {
            d.store(empty_page(), Relaxed);
        }
        // SAFETY: per the caller.
        unsafe { at.write(heap) };
    }

    /// The state (cache, geometry, counters) of size class `class`.
    #[inline]
    pub fn class(&self, class: usize) -> &ClassState {
        &self.states[class + 1]
    }

    /// The states of all size classes, in class order.
    pub fn class_states(&self) -> &[ClassState] {
        &self.states[1..]
    }

    #[inline]
    fn current_page(&self, class: usize) -> *mut Page {
        self.direct[class].load(Relaxed)
    }

    #[inline]
    fn set_current_page(&self, class: usize, page: *mut Page) {
        self.direct[class].store(page, Relaxed);
    }

    /// Per class: 1 if the class's current page holds no live slot.
    ///
    /// Safe to call from any thread while the heap's segments stay mapped
    /// (the caller holds the reservation lock, so no trim unmaps them).
    pub fn empty_pages_by_class(&self) -> [u8; CLASSES] {
        let mut out = [0u8; CLASSES];
        for (c, o) in out.iter_mut().enumerate() {
            let p = self.current_page(c);
            // SAFETY: a current page is the empty sentinel or a descriptor in
            // a mapped segment header; `used` is atomic.
            if p != empty_page() && unsafe { (*p).used() } == 0 {
                *o = 1;
            }
        }
        out
    }

    fn me(&self) -> *mut u8 {
        self as *const HeapCore as *mut u8
    }

    /// The page source.
    pub fn source(&self) -> &dyn PageSource {
        // SAFETY: the source outlives the heap (init_at contract).
        unsafe { &*self.source }
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            source: self.source(),
            // SAFETY: outlives the heap (init_at contract).
            reservations: unsafe { &*self.reservations },
            heap: self.me(),
            config: &self.config,
        }
    }

    /// # Safety
    /// Only the owning thread may call this, and not reentrantly.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    unsafe fn local(&self) -> &mut Local {
        // SAFETY: forwarded from the caller.
        unsafe { &mut *self.local.get() }
    }

    // ----- allocation -------------------------------------------------------

    /// Allocates `size` bytes at `align` (a power of two). Null when out of
    /// memory or for impossible requests.
    ///
    /// # Safety
    /// Called by the owning thread only.
    #[inline]
    pub unsafe fn alloc(&self, size: usize, align: usize) -> *mut u8 {
        if size <= SMALL_MAX {
            let class = if align <= 8 || (align == 16 && size > 8) {
                class_of(size)
            } else {
                match class_for(size, align) {
                    Some(c) => c,
                    // SAFETY: forwarded.
                    None => return unsafe { self.alloc_large(size, align) },
                }
            };
            // SAFETY: forwarded.
            unsafe { self.alloc_small(class, size) }
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
    /// from this heap's thread cache; null if the request is bigger or the
    /// cache of its class is empty (then take [`HeapCore::alloc`]). The C
    /// `malloc`'s fast path: no page, no size or alignment branches beyond
    /// one comparison.
    ///
    /// # Safety
    /// Owner only.
    #[inline(always)]
    pub unsafe fn alloc_cached16(&self, size: usize) -> *mut u8 {
        if size > CACHED_MAX {
            return null_mut();
        }
        // Every class from 16 B up has 16-byte-multiple slots in 64 KiB
        // aligned pages; requests below 16 B take the 16 B class.
        let class = class_of(size.max(16));
        // SAFETY: `class_of` returns classes below CLASSES; owner only.
        unsafe { self.states.get_unchecked(class + 1).pop() as *mut u8 }
    }

    /// # Safety
    /// Owner only.
    #[inline]
    unsafe fn alloc_small(&self, class: usize, size: usize) -> *mut u8 {
        debug_assert!(class < CLASSES);
        // SAFETY: `class_of` and `class_for` return classes below CLASSES.
        let state = unsafe { self.states.get_unchecked(class + 1) };
        // SAFETY: owner only (caller): the cache is ours and holds free slots
        // of this class (a page with a slot out is never released); `direct`
        // pages are live slab pages of this heap or the never-written empty
        // page.
        unsafe {
            let b = state.pop();
            if !b.is_null() {
                return b as *mut u8;
            }
            let page = self.direct.get_unchecked(class).load(Relaxed);
            let b = (*page).free;
            if !b.is_null() {
                (*page).free = (*b).next;
                (*page).set_used((*page).used() + 1);
                state.count_alloc(size);
                return b as *mut u8;
            }
            self.alloc_slow(class, size)
        }
    }

    /// Sends the cached slots of `class` back to their pages, all but the
    /// `keep` most recent.
    ///
    /// # Safety
    /// Owner only.
    unsafe fn flush_cache(&self, class: usize, keep: u32) {
        // SAFETY: owner only; the detached list holds live slots of this
        // class, of this heap's pages or other heaps' (which outlive them).
        unsafe {
            let mut b = self.class(class).take_older(keep);
            // Slots of one page of another heap that come in a row go home
            // as one chain, with one CAS (a producer's objects often come
            // from the same page).
            let mut run = RemoteRun::EMPTY;
            while !b.is_null() {
                let next = (*b).next;
                // Owner and page from the segment header's read-mostly
                // fields, not from the descriptor, which its owner rewrites
                // on every allocation (cached slots passed the free checks).
                let seg = &*Segment::of(crate::layout::segment_base(b as usize));
                let page = seg.slab_page(b as usize);
                if seg.heap == self.me() {
                    let _ = self.free_local(page, b);
                } else if page == run.page {
                    (*run.last).next = b;
                    run.last = b;
                    run.count += 1;
                } else {
                    run.send();
                    run = RemoteRun {
                        page,
                        first: b,
                        last: b,
                        count: 1,
                    };
                }
                b = next;
            }
            run.send();
        }
    }

    /// Empties every class's cache. Owner only.
    unsafe fn flush_caches(&self) {
        for class in 0..CLASSES {
            // SAFETY: owner only (caller).
            unsafe { self.flush_cache(class, 0) };
        }
    }

    #[cold]
    unsafe fn alloc_slow(&self, class: usize, size: usize) -> *mut u8 {
        // SAFETY: owner only (caller).
        unsafe {
            self.process_delayed();
            let page = self.current_page(class);
            if page != empty_page() && self.refill(page) {
                return self.pop(page, class, size);
            }
            self.maintenance();
            // Maintenance may have emptied the caches into this page (then
            // it has room again), or even released it (then it is no longer
            // current): look again.
            let page = self.current_page(class);
            if page != empty_page() {
                if self.refill(page) {
                    return self.pop(page, class, size);
                }
                self.retire_exhausted(page);
            }
            let next = match self.fullest_nonfull(class) {
                Some(p) => p,
                None => match self.new_slab_page(class) {
                    Some(p) => p,
                    None => return null_mut(),
                },
            };
            self.set_current_page(class, next);
            if !self.refill(next) {
                return null_mut();
            }
            self.pop(next, class, size)
        }
    }

    /// # Safety
    /// Owner only; `page` has a free slot.
    unsafe fn pop(&self, page: *mut Page, class: usize, size: usize) -> *mut u8 {
        // SAFETY: per the caller.
        unsafe {
            let b = (*page).free;
            (*page).free = (*b).next;
            (*page).set_used((*page).used() + 1);
            self.class(class).count_alloc(size);
            b as *mut u8
        }
    }

    /// Gives `page` a free slot if it can: remote frees first, then fresh
    /// slots. Owner only.
    unsafe fn refill(&self, page: *mut Page) -> bool {
        // SAFETY: owner only; `page` is a slab page of this heap. Page
        // methods borrow it only for the call.
        unsafe {
            if (*page).has_free() {
                return true;
            }
            let n = (*page).collect_thread_free();
            if n > 0 {
                self.class((*page).class as usize).frees.add(n as u64);
                return true;
            }
            if (*page).capacity < (*page).reserved {
                let (first, count) = (*page).extend();
                let seg = &*Segment::of(crate::layout::segment_base(first));
                let newly = seg.set_committed(seg.os_page(first), count);
                self.slab_committed.add((newly * OS_PAGE) as u64);
                self.note_peak();
                return true;
            }
        }
        false
    }

    /// Moves an exhausted current page to the full list (unless remote frees
    /// just arrived). Owner only.
    unsafe fn retire_exhausted(&self, page: *mut Page) {
        // SAFETY: owner only; `page` is this heap's current page of its class.
        // If remote frees arrived meanwhile, try_mark_full collected them and
        // the page stays on its queue with free slots.
        unsafe {
            let class = (*page).class as usize;
            match (*page).try_mark_full() {
                Ok(()) => {
                    self.local().queues[class].remove(page);
                    self.local().full.push(page);
                }
                Err(collected) => self.class(class).frees.add(collected as u64),
            }
        }
    }

    /// The fullest page of the class queue (among the first few), other
    /// than an exhausted current page. Owner only.
    unsafe fn fullest_nonfull(&self, class: usize) -> Option<*mut Page> {
        let mut best: *mut Page = null_mut();
        let mut best_used = 0;
        // SAFETY: owner only.
        let mut p = unsafe { self.local().queues[class].head };
        let mut seen = 0;
        while !p.is_null() && seen < FULLEST_CANDIDATES {
            // SAFETY: queue entries are slab pages of this heap.
            let (usable, used, next) = unsafe {
                let usable = (*p).has_free() || (*p).capacity < (*p).reserved || (*p).has_remote();
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

    unsafe fn new_slab_page(&self, class: usize) -> Option<*mut Page> {
        let slices = PAGE_SLICES[class] as usize;
        let (page, committed) = {
            let ctx = self.ctx();
            let mut spans = self.spans.lock();
            spans.take_for_slab(&ctx, slices)?
        };
        self.slab_committed.add(committed as u64);
        // SAFETY: a freshly taken span, exclusively ours; owner only.
        unsafe {
            (*page).init_slab(class, SLOT_SIZE[class] as usize, slices * SLICE, self.me());
            let seg = &*Segment::of(crate::layout::segment_base((*page).start));
            seg.mark_slab(seg.slice_index((*page).start), slices, class);
            let c = &self.page_counts[class];
            c.pages.add(1);
            c.slots.add((*page).reserved as u64);
            self.local().queues[class].push(page);
        }
        Some(page)
    }

    /// Returns an empty slab page to the span pool. Owner only.
    unsafe fn release_page(&self, page: *mut Page) {
        // SAFETY: owner only; `page` is an empty slab page of this heap, on
        // its class queue or the full list.
        unsafe {
            let class = (*page).class as usize;
            if (*page).in_full {
                self.local().full.remove(page);
                (*page).clear_full();
            } else {
                self.local().queues[class].remove(page);
            }
            if self.current_page(class) == page {
                self.set_current_page(class, empty_page());
            }
            let c = &self.page_counts[class];
            c.pages.sub(1);
            c.slots.sub((*page).reserved as u64);
            let seg = &*Segment::of(crate::layout::segment_base((*page).start));
            seg.clear_slab(seg.slice_index((*page).start), PAGE_SLICES[class] as usize);
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

    // ----- free --------------------------------------------------------------

    /// Frees `ptr`, allocated by any heap. `current` is the calling thread's
    /// heap (null if it has none), which decides local versus remote free.
    ///
    /// Returns true when the free left memory retained (a page or span went
    /// back to a pool), the cue to make sure the background purger runs.
    ///
    /// # Safety
    /// `current`, if not null, is owned by the calling thread. `ptr` must
    /// not be used afterwards. Misuse that is detected aborts.
    #[inline]
    pub unsafe fn free_any(ptr: *mut u8, current: *const HeapCore) -> bool {
        // SAFETY: forwarded.
        unsafe {
            if HeapCore::free_to_cache(ptr, current) {
                return false;
            }
            HeapCore::free_uncached(ptr, current)
        }
    }

    /// The free fast path: puts a slot of a global-allocator thread heap
    /// into the calling thread's cache (a full cache first sends its older
    /// half home). False if it did not (no heap, not such a slot): then the
    /// caller takes the uncached path (`thread::free_past_cache`).
    ///
    /// # Safety
    /// As `free_any`; on true, the free is done.
    #[inline]
    pub unsafe fn free_to_cache(ptr: *mut u8, current: *const HeapCore) -> bool {
        let addr = ptr as usize;
        // SAFETY: the segment is registered, so mapped with a header;
        // `current` is the calling thread's heap, whose cache may take any
        // slot of a thread heap of the global allocator.
        !current.is_null()
            && registry::in_shared_segment(addr)
            && unsafe { (*current).cache_free(addr) }
    }

    /// Puts `addr` in this heap's cache if it starts a slot of a live slab
    /// page (false if not: the caller takes the uncached path).
    ///
    /// # Safety
    /// Owner only, not inside another heap operation; `addr` lies in a
    /// registered segment and is a live allocation the cache may take (a
    /// slot of this heap, or of any thread heap if this is one).
    #[inline]
    unsafe fn cache_free(&self, addr: usize) -> bool {
        // SAFETY: registered segments are mapped and headed by a `Segment`.
        let seg = unsafe { &*Segment::of(crate::layout::segment_base(addr)) };
        let (entry, offset) = seg.slab_entry(addr);
        // SAFETY: slab table entries are 0 or a class + 1 (`mark_slab`), and
        // `states` has CLASSES + 1 entries. Entry 0 (no slab page) finds the
        // state whose geometry no offset passes.
        let state = unsafe { self.states.get_unchecked(entry) };
        if !state.starts_slot(offset) {
            return false; // not a slot start: the uncached path says so
        }
        // SAFETY: owner only (caller); the slot is live (caller) and of
        // the class `entry - 1` (slab table).
        unsafe {
            if !state.push(addr as *mut Block) {
                self.cache_full(entry - 1, addr as *mut Block);
            }
        }
        true
    }

    /// A free found its class's cache full: send the older half home, then
    /// cache the slot. So a thread that frees many slots does the page work
    /// in batches, and its next frees stay on the fast path; and since this
    /// is the slow path of a thread that may only ever free, it is also
    /// where such a thread runs its maintenance.
    ///
    /// # Safety
    /// As `cache_free`; the cache of `class` is full.
    #[cold]
    #[inline(never)]
    unsafe fn cache_full(&self, class: usize, block: *mut Block) {
        let state = self.class(class);
        // SAFETY: owner only (caller), between operations.
        unsafe {
            let keep = state.cached() / 2;
            self.flush_cache(class, keep);
            self.maintenance();
            let cached = state.push(block);
            debug_assert!(cached, "room was just made");
        }
    }

    /// `free_any` past the cache: into the slot's page, or a large or huge
    /// object; detects misuse.
    ///
    /// # Safety
    /// As `free_any`.
    #[inline(never)]
    pub unsafe fn free_uncached(ptr: *mut u8, current: *const HeapCore) -> bool {
        let addr = ptr as usize;
        let Some((base, huge)) = registry::lookup(addr) else {
            misuse(Misuse::Foreign, addr)
        };
        // SAFETY: registered segments are mapped and headed by a `Segment`.
        let seg = unsafe { &*Segment::of(base) };
        if huge {
            // SAFETY: the heap of a segment outlives its segments.
            unsafe { (*(seg.heap as *const HeapCore)).free_huge(seg, addr) };
            return true;
        }
        let page = lookup_page(seg, addr);
        // SAFETY: `lookup_page` returns a descriptor of this segment. Only
        // fields fixed while the span is in use are read here (the page may
        // belong to another thread, which mutates its other fields).
        let (kind, heap, start) =
            unsafe { ((*page).kind, (*page).heap as *const HeapCore, (*page).start) };
        match kind {
            Kind::Slab => {
                // SAFETY: as above; slot geometry is fixed for a slab's life.
                if unsafe { (*page).slot_index(addr) }.is_none() {
                    misuse(Misuse::Misaligned, addr);
                }
                if heap == current {
                    // SAFETY: the calling thread owns `current`.
                    unsafe { (*heap).free_local(page, addr as *mut Block) }
                } else {
                    // SAFETY: `current` is the calling thread's own heap;
                    // `heap` outlives its pages; the slot is live.
                    unsafe {
                        if !(*heap).global {
                            // An owned `Heap`'s block freed through the
                            // global allocator (or another heap).
                            misuse(Misuse::WrongHeap, addr);
                        }
                        free_remote(page, addr as *mut Block);
                    }
                    false
                }
            }
            Kind::Large => {
                if addr != start {
                    misuse(Misuse::Misaligned, addr);
                }
                // SAFETY: the heap outlives its pages.
                unsafe { (*heap).free_large(page) };
                true
            }
            _ => misuse(Misuse::DoubleFree, addr),
        }
    }

    /// Frees `ptr` into this heap, which must own it (owned `Heap`s).
    ///
    /// # Safety
    /// Owner only; `ptr` not used afterwards.
    pub unsafe fn free_own(&self, ptr: *mut u8) -> bool {
        let addr = ptr as usize;
        let Some(base) = registry::header_of(addr) else {
            misuse(Misuse::Foreign, addr)
        };
        // SAFETY: registered segments are mapped and headed by a `Segment`.
        if unsafe { (*Segment::of(base)).heap } != self.me() {
            misuse(Misuse::WrongHeap, addr);
        }
        // SAFETY: we are the owner and `current`; the block is ours, and in
        // a slab-capable segment whose own header is the one checked above
        // (not the interior of a huge run) when `in_owned_segment` says so.
        unsafe {
            (registry::in_owned_segment(addr) && self.cache_free(addr))
                || HeapCore::free_uncached(ptr, self)
        }
    }

    /// # Safety
    /// Owner only; `block` is a live slot of `page`, a slab page of this heap.
    /// Returns true if a page went back to the span pool.
    #[inline]
    unsafe fn free_local(&self, page: *mut Page, block: *mut Block) -> bool {
        // SAFETY: per the caller; the page is only touched through `page`.
        unsafe {
            let used = (*page).used();
            let head = (*page).free;
            if used == 0 || head == block {
                misuse(Misuse::DoubleFree, block as usize);
            }
            (*block).next = head;
            (*page).free = block;
            (*page).set_used(used - 1);
            let class = (*page).class as usize;
            self.class(class).frees.add(1);
            // Slow only if the page leaves the full list, or empties and is
            // not its class's current page (which is kept: seed 000's churn
            // then never leaves this function).
            if (*page).in_full || (used == 1 && self.current_page(class) != page) {
                return self.free_slow(page);
            }
            false
        }
    }

    #[cold]
    unsafe fn free_slow(&self, page: *mut Page) -> bool {
        // SAFETY: owner only (caller); `page` is a slab page of this heap.
        unsafe {
            let class = (*page).class as usize;
            if (*page).in_full {
                self.local().full.remove(page);
                (*page).clear_full();
                self.local().queues[class].push(page);
            }
            if (*page).used() == 0 && self.current_page(class) != page {
                self.release_page(page);
                return true;
            }
            false
        }
    }

    /// Handles frees that other threads made into pages on the full list.
    unsafe fn process_delayed(&self) {
        if self.delayed.load(Relaxed).is_null() {
            return;
        }
        let mut b = self.delayed.swap(null_mut(), Acquire);
        while !b.is_null() {
            // SAFETY: the delayed list holds slots of this heap's pages,
            // pushed by `free_remote`; we own the list after the swap.
            unsafe {
                let next = (*b).next;
                let seg = &*Segment::of(crate::layout::segment_base(b as usize));
                let page = lookup_page(seg, b as usize);
                let _ = self.free_local(page, b);
                b = next;
            }
        }
    }

    // ----- large and huge ----------------------------------------------------

    #[cold]
    #[inline(never)]
    unsafe fn alloc_large(&self, size: usize, align: usize) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { self.alloc_span(size, align).0 }
    }

    /// Allocates a large or huge object; also says whether its memory is
    /// known to be zero.
    unsafe fn alloc_span(&self, size: usize, align: usize) -> (*mut u8, bool) {
        if size > LARGE_MAX || align > LARGE_ALIGN_MAX {
            return self.alloc_huge(size, align);
        }
        let n = size.max(1).div_ceil(SLICE);
        let align_slices = (align / SLICE).max(1);
        let now = self.source().now_ms();
        let ctx = self.ctx();
        let mut spans = self.spans.lock();
        let Some((page, _)) = spans.take(&ctx, n, align_slices) else {
            return (null_mut(), false);
        };
        // SAFETY: a freshly taken span, exclusively ours under the lock.
        let start = unsafe {
            (*page).kind = Kind::Large;
            (*page).large_size = n * SLICE;
            (*page).large_requested = size;
            (*page).start
        };
        let newly = spans.commit_whole(page);
        spans.counts.large_count += 1;
        spans.counts.large_bytes += n * SLICE;
        spans.counts.large_requested += size;
        self.after_span_change(&ctx, &mut spans, now);
        // Pages not committed before were never used or purged; purged ones
        // read as zero only after MADV_DONTNEED.
        let zero =
            newly == n * SLICE / OS_PAGE && self.config.purge == crate::source::Purge::DontNeed;
        (start as *mut u8, zero)
    }

    /// Frees a large object (any thread: the span lock serialises it).
    unsafe fn free_large(&self, page: *mut Page) {
        let now = self.source().now_ms();
        let ctx = self.ctx();
        let mut spans = self.spans.lock();
        // SAFETY: `page` is a span descriptor of this heap; under the lock
        // its kind tells whether it is still a live large object.
        let (kind, start, size, requested) = unsafe {
            (
                (*page).kind,
                (*page).start,
                (*page).large_size,
                (*page).large_requested,
            )
        };
        if kind != Kind::Large {
            drop(spans);
            misuse(Misuse::DoubleFree, start);
        }
        spans.counts.large_count -= 1;
        spans.counts.large_bytes -= size;
        spans.counts.large_requested -= requested;
        spans.give_back_large(page, now);
        self.after_span_change(&ctx, &mut spans, now);
    }

    #[cold]
    fn alloc_huge(&self, size: usize, align: usize) -> (*mut u8, bool) {
        if size > isize::MAX as usize / 2 || align > 1 << 40 {
            return (null_mut(), false);
        }
        let now = self.source().now_ms();
        let ctx = self.ctx();
        let mut spans = self.spans.lock();
        let p = spans.take_huge(&ctx, size, align);
        self.after_span_change(&ctx, &mut spans, now);
        let dontneed = self.config.purge == crate::source::Purge::DontNeed;
        p.map_or((null_mut(), false), |(a, fresh)| {
            (a as *mut u8, fresh && dontneed)
        })
    }

    /// Frees a huge object (any thread: the span lock serialises it).
    fn free_huge(&self, seg: &Segment, addr: usize) {
        let now = self.source().now_ms();
        let ctx = self.ctx();
        let mut spans = self.spans.lock();
        // SAFETY: the huge state is read under the span lock.
        let st = unsafe { *seg.huge_state() };
        if st.size == 0 {
            drop(spans);
            misuse(Misuse::DoubleFree, addr);
        }
        if addr != seg.base() + st.offset {
            drop(spans);
            misuse(Misuse::Misaligned, addr);
        }
        spans.give_back_huge(seg as *const Segment as *mut Segment, now);
        self.after_span_change(&ctx, &mut spans, now);
    }

    /// After a span operation (span lock held): purge what has expired or
    /// exceeds the cap, publish the next deadline for the background purger,
    /// and track the peak.
    fn after_span_change(&self, ctx: &Ctx, spans: &mut Spans, now: u64) {
        let due = self.next_deadline.load(Relaxed) <= now
            || spans.retained() > self.config.retain_max_bytes;
        if due || spans.retained() > 0 && self.next_deadline.load(Relaxed) == u64::MAX {
            let next = spans.decay(ctx, now, false);
            self.next_deadline.store(next.unwrap_or(u64::MAX), Relaxed);
        }
        self.span_committed
            .0
            .store(spans.counts.committed as u64, Relaxed);
        self.note_peak();
    }

    /// Records a new peak of committed bytes (slab pages plus the span
    /// pool's last published figure).
    fn note_peak(&self) {
        let total = self.slab_committed.get() + self.span_committed.get();
        if total > self.peak_committed.get() {
            self.peak_committed.0.store(total, Relaxed);
        }
    }

    /// Owner-side periodic work on slow paths: release current pages that
    /// stayed empty since the last pass, and run the decay if due.
    unsafe fn maintenance(&self) {
        if self.flush_requested.load(Relaxed) {
            self.flush_requested.store(false, Relaxed);
            // SAFETY: owner only (caller).
            unsafe { self.flush_caches() };
        }
        let now = self.source().now_ms();
        // SAFETY: owner only (caller); the borrow ends before any call.
        unsafe {
            let next = &mut self.local().next_maintenance;
            if now < *next {
                return;
            }
            *next = now + (self.config.decay_ms / 2).max(1);
        }
        for class in 0..CLASSES {
            // Halve the caches: slots still wanted come back from their
            // pages cheaply; slots no longer wanted go home within a few
            // passes, so their pages can empty.
            let n = self.class(class).cached();
            if n > 0 {
                // SAFETY: owner only (caller).
                unsafe { self.flush_cache(class, n / 2) };
            }
        }
        for class in 0..CLASSES {
            let page = self.current_page(class);
            if page == empty_page() {
                continue;
            }
            // SAFETY: a current page of this heap; owner only.
            unsafe {
                if (*page).used() != 0 {
                    (*page).idle = false;
                } else if !(*page).idle {
                    // Mark it; if still empty at the next pass it goes.
                    (*page).idle = true;
                } else {
                    self.set_current_page(class, empty_page());
                    self.release_page(page);
                }
            }
        }
        if self.next_deadline.load(Relaxed) <= now {
            let ctx = self.ctx();
            let mut spans = self.spans.lock();
            self.after_span_change(&ctx, &mut spans, now);
        }
    }

    // ----- sizes and reallocation ---------------------------------------------

    /// Usable size of the allocation at `ptr`.
    ///
    /// # Safety
    /// `ptr` is a live allocation of some pagewise heap.
    pub unsafe fn usable_size(ptr: *const u8) -> usize {
        let addr = ptr as usize;
        let Some(base) = registry::header_of(addr) else {
            misuse(Misuse::Foreign, addr)
        };
        // SAFETY: registered segments are mapped and headed by a `Segment`.
        let seg = unsafe { &*Segment::of(base) };
        if seg.huge {
            // SAFETY: the object is live (caller), so its state is stable.
            let st = unsafe { *seg.huge_state() };
            return st.size - (addr - base - st.offset);
        }
        let p = lookup_page(seg, addr);
        // SAFETY: a descriptor of this segment; only fields fixed while the
        // object lives are read.
        unsafe {
            match (*p).kind {
                Kind::Slab => (*p).slot_size as usize,
                Kind::Large => (*p).large_size - (addr - (*p).start),
                _ => misuse(Misuse::DoubleFree, addr),
            }
        }
    }

    /// Resizes the allocation at `ptr` (of `old_size` bytes, alignment
    /// `align`) to `new_size`, in place when it can.
    ///
    /// # Safety
    /// Owner of the calling thread's heap; `ptr` live; `current` as in `free_any`.
    pub unsafe fn realloc(
        &self,
        ptr: *mut u8,
        old_size: usize,
        align: usize,
        new_size: usize,
        current: *const HeapCore,
    ) -> *mut u8 {
        // SAFETY: `ptr` is live (caller).
        let usable = unsafe { HeapCore::usable_size(ptr) };
        if new_size <= usable && (new_size >= usable / 2 || usable <= 64) {
            return ptr;
        }
        // SAFETY: forwarded.
        if unsafe { self.resize_large_in_place(ptr, new_size) } {
            return ptr;
        }
        // SAFETY: owner (caller).
        let new = unsafe { self.alloc(new_size, align) };
        if !new.is_null() {
            // SAFETY: both live, distinct allocations of at least this size.
            unsafe {
                core::ptr::copy_nonoverlapping(ptr, new, old_size.min(new_size));
                HeapCore::free_any(ptr, current);
            }
        }
        new
    }

    /// Grows or shrinks a large object of this heap in place.
    unsafe fn resize_large_in_place(&self, ptr: *mut u8, new_size: usize) -> bool {
        let addr = ptr as usize;
        let Some(base) = registry::header_of(addr) else {
            return false;
        };
        // SAFETY: registered segment.
        let seg = unsafe { &*Segment::of(base) };
        if seg.huge || seg.heap != self.me() || new_size > LARGE_MAX || new_size <= SMALL_MAX {
            return false;
        }
        let page = lookup_page(seg, addr);
        let now = self.source().now_ms();
        let ctx = self.ctx();
        let mut spans = self.spans.lock();
        // SAFETY: descriptor of this segment, read under the span lock.
        let (kind, start, have) =
            unsafe { ((*page).kind, (*page).start, (*page).slice_count as usize) };
        if kind != Kind::Large || addr != start {
            return false;
        }
        let want = new_size.div_ceil(SLICE);
        let ok = if want > have {
            spans.grow_in_place(page, want - have)
        } else if want < have {
            spans.shrink_in_place(page, want, now);
            true
        } else {
            true
        };
        if ok {
            // SAFETY: our live large span, under the lock.
            unsafe {
                spans.counts.large_bytes =
                    spans.counts.large_bytes - (*page).large_size + want * SLICE;
                spans.counts.large_requested =
                    spans.counts.large_requested - (*page).large_requested + new_size;
                (*page).large_size = want * SLICE;
                (*page).large_requested = new_size;
            }
            spans.commit_whole(page);
            self.after_span_change(&ctx, &mut spans, now);
        }
        ok
    }

    // ----- trim, abandon, drop --------------------------------------------------

    /// Gives back everything retained: empty slab pages, expired or not,
    /// retained spans and huge objects, wholly free segments and unused
    /// reservations.
    ///
    /// # Safety
    /// Owner only.
    pub unsafe fn trim(&self) {
        // SAFETY: owner only (caller).
        unsafe {
            self.flush_caches();
            self.process_delayed();
            self.release_empty_pages();
        }
        let ctx = self.ctx();
        let now = self.source().now_ms();
        let mut spans = self.spans.lock();
        spans.decay(&ctx, now, true);
        spans.release_empty(&ctx);
        self.next_deadline.store(u64::MAX, Relaxed);
    }

    /// Collects remote frees everywhere and releases every empty slab page.
    unsafe fn release_empty_pages(&self) {
        for class in 0..CLASSES {
            self.set_current_page(class, empty_page());
            // SAFETY: owner only (caller); queue entries are slab pages of
            // this heap; the next link is read before the page may leave.
            unsafe {
                let mut p = self.local().queues[class].head;
                while !p.is_null() {
                    let next = (*p).next;
                    self.collect_and_release_if_empty(p);
                    p = next;
                }
            }
        }
        // SAFETY: as above, for the full list.
        unsafe {
            let mut p = self.local().full.head;
            while !p.is_null() {
                let next = (*p).next;
                if (*p).has_remote() {
                    self.local().full.remove(p);
                    (*p).clear_full();
                    self.local().queues[(*p).class as usize].push(p);
                    self.collect_and_release_if_empty(p);
                }
                p = next;
            }
        }
    }

    unsafe fn collect_and_release_if_empty(&self, page: *mut Page) {
        // SAFETY: owner only; a slab page of this heap.
        unsafe {
            let n = (*page).collect_thread_free();
            self.class((*page).class as usize).frees.add(n as u64);
            if (*page).used() == 0 {
                self.release_page(page);
            }
        }
    }

    /// Takes in every slot other threads freed into this heap's pages
    /// (the owner would on its next slow paths), so counters show them as
    /// free. Owner only.
    pub unsafe fn collect_remote(&self) {
        // SAFETY: owner only (caller); queue and full-list entries are slab
        // pages of this heap, and collecting moves no page between lists.
        unsafe {
            self.process_delayed();
            for class in 0..CLASSES {
                let mut p = self.local().queues[class].head;
                while !p.is_null() {
                    let n = (*p).collect_thread_free();
                    self.class(class).frees.add(n as u64);
                    p = (*p).next;
                }
            }
            let mut p = self.local().full.head;
            while !p.is_null() {
                let n = (*p).collect_thread_free();
                self.class((*p).class as usize).frees.add(n as u64);
                p = (*p).next;
            }
        }
    }

    /// Prepares the heap to be left without an owner (its thread exited):
    /// empty pages go back to the span pool, to be purged by decay.
    ///
    /// # Safety
    /// Owner only, as its last act.
    pub unsafe fn abandon(&self) {
        // SAFETY: owner only.
        unsafe {
            self.flush_caches();
            self.process_delayed();
            self.release_empty_pages();
        }
        self.owner.store(0, Release);
    }

    /// Gives back what can be given back without the owner: retained spans,
    /// cached huge objects, wholly free segments (any thread).
    pub fn trim_shared(&self) {
        let ctx = self.ctx();
        let now = self.source().now_ms();
        let mut spans = self.spans.lock();
        spans.decay(&ctx, now, true);
        spans.release_empty(&ctx);
        self.next_deadline.store(u64::MAX, Relaxed);
    }

    /// Runs the decay from outside the owner (background purger, global
    /// trim). Returns false if the span lock was busy.
    pub fn purge_expired(&self, force: bool) -> bool {
        let Some(mut spans) = self.spans.try_lock() else {
            return false;
        };
        let ctx = self.ctx();
        let now = self.source().now_ms();
        let next = spans.decay(&ctx, now, force);
        self.next_deadline.store(next.unwrap_or(u64::MAX), Relaxed);
        true
    }
}

/// The first descriptor of the span containing `addr` in `seg`, checked
/// against stale or corrupt offsets (a pointer into free memory).
#[inline]
fn lookup_page(seg: &Segment, addr: usize) -> *mut Page {
    let idx = (addr - seg.base()) >> SLICE_SHIFT;
    if idx < crate::segment::HEADER_SLICES {
        misuse(Misuse::Foreign, addr);
    }
    // SAFETY: a descriptor of this segment; `slice_offset` is fixed while
    // the span is in use (a stale one, for free memory, is range-checked).
    let off = unsafe { (*seg.page(idx)).slice_offset } as usize;
    if off > idx - crate::segment::HEADER_SLICES {
        misuse(Misuse::Foreign, addr);
    }
    seg.page(idx - off)
}

/// Consecutive slots of one page of another heap, linked first to last.
struct RemoteRun {
    page: *mut Page,
    first: *mut Block,
    last: *mut Block,
    count: usize,
}

impl RemoteRun {
    const EMPTY: RemoteRun = RemoteRun {
        page: null_mut(),
        first: null_mut(),
        last: null_mut(),
        count: 0,
    };

    /// Frees the run to its page (nothing if empty).
    ///
    /// # Safety
    /// The run holds live slots of `page`, whose heap outlives them.
    unsafe fn send(&mut self) {
        if self.page.is_null() {
            return;
        }
        // SAFETY: per the caller; the chain ends at `last`.
        unsafe {
            (*self.last).next = null_mut();
            let mut first = self.first;
            let mut count = self.count;
            // A page on its owner's full list takes the first slot through
            // the heap's delayed list (`free_remote`); the rest go on.
            while !(*self.page).push_remote_chain(first, self.last, count) {
                let rest = (*first).next;
                (*first).next = null_mut();
                free_to_delayed(self.page, first);
                if rest.is_null() {
                    break;
                }
                first = rest;
                count -= 1;
            }
        }
        *self = RemoteRun::EMPTY;
    }
}

/// Frees a slot of a page owned by another thread's heap.
///
/// # Safety
/// `block` is a live slot of `page`; the page's heap outlives it.
#[inline]
unsafe fn free_remote(page: *mut Page, block: *mut Block) {
    // SAFETY: per the caller.
    unsafe {
        if !(*page).push_remote(block) {
            free_to_delayed(page, block);
        }
    }
}

/// Puts a slot on its heap's delayed list: the first remote free into a
/// page on the owner's full list, which tells the owner the page has room.
///
/// # Safety
/// `block` is a live slot of `page`, whose heap outlives it; `push_remote`
/// just claimed the notification for it.
unsafe fn free_to_delayed(page: *mut Page, block: *mut Block) {
    // SAFETY: per the caller.
    unsafe {
        let heap = &*((*page).heap as *const HeapCore);
        let mut head = heap.delayed.load(Relaxed);
        loop {
            (*block).next = head;
            match heap
                .delayed
                .compare_exchange_weak(head, block, Release, Relaxed)
            {
                Ok(_) => return,
                Err(seen) => head = seen,
            }
        }
    }
}
