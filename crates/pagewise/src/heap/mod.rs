//! A heap: size-class queues of slab pages (owner only, no locks), the span
//! pool (behind a lock, shared with remote frees and the purger), and the
//! counters behind `stats()`.
//!
//! Fast paths:
//! - allocate: pop the class's thread cache, else the free list of the
//!   class's current page;
//! - free (any thread heap's slot, by any thread with a heap): push onto the
//!   freeing thread's cache ([`crate::heap::cache`]);
//! - past the cache: onto the page's free list (its owner), or one CAS onto
//!   the page's `thread_free` list (another thread).
//!
//! The files of this folder, by direction of travel: `alloc.rs`, `free.rs`,
//! `remote.rs` (frees across threads), `large.rs` (large and huge objects,
//! realloc), `maintenance.rs` (maintenance, trim, abandon), `hollow.rs`
//! (free OS pages inside pages in use), `cache.rs` (the thread cache),
//! `current.rs` (the current pages, and who may touch a page).

pub(crate) mod alloc;
pub(crate) mod cache;
pub(crate) mod current;
pub(crate) mod free;
pub(crate) mod hollow;
pub(crate) mod large;
pub(crate) mod leftovers;
pub(crate) mod maintenance;
pub(crate) mod mesh;
pub(crate) mod mesh_plan;
pub(crate) mod remote;
pub(crate) mod sample;
pub(crate) mod thread_bytes;
pub(crate) mod transfer;

use crate::config::Config;
use crate::fault::{misuse, Misuse};
use crate::heap::cache::ClassState;
use crate::memory::budget::Budget;
use crate::memory::huge_pages::Policy;
use crate::memory::layout::{os_page, LARGE_ALIGN_MAX, LARGE_MAX, SLICE, SLICE_SHIFT};
use crate::memory::page::{Block, Kind, Page};
use crate::memory::registry;
use crate::memory::reservation::Reservations;
use crate::memory::segment::Segment;
use crate::memory::size_class::{
    class_for, class_of, CLASSES, GEOMETRY, HUGE_GEOMETRY, HUGE_PAGE_SLICES, PAGE_SLICES,
    SLOT_SIZE, SMALL_MAX,
};
use crate::memory::spans::{Ctx, Spans};
use crate::options::LiveConfig;
use crate::os::source::PageSource;
use crate::sync::lock::Locked;
use core::cell::UnsafeCell;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};

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
    pub(crate) const fn new(v: u64) -> Counter {
        Counter(AtomicU64::new(v))
    }
    #[inline]
    pub(crate) fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
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

/// The heap's page lists: behind [`HeapCore::local`], a lock its owner
/// takes on every slow path and a visitor (the purger, `trim()`,
/// `stats()`) takes to work on the heap while its thread is elsewhere.
///
/// Holding it (a `&mut Local`, which only the lock hands out) is what lets
/// a function touch a page that is not a current page: its free list, its
/// `used` count, its queue links, and release it. What the owner's fast
/// paths touch without it (the thread caches and the current page of each
/// class) only the owner touches, and a visitor of a live heap leaves it
/// alone ([`Access::Visitor`]). The protocol is in docs/design.md,
/// "Visiting a live heap".
pub(crate) struct Local {
    queues: [Queue; CLASSES],
    full: Queue,
    next_maintenance: u64,
    /// Withheld-slot records of pages with meshed OS pages (`mesh.rs`).
    pub(crate) records: mesh::Records,
    /// Whether a mesh pass over the heap is under way (`mesh.rs`).
    mesh_pass: mesh::PassUnderWay,
}

/// Who holds a heap's [`Local`]: the thread that owns the heap (or a
/// visitor of an abandoned heap, which then has every right of an owner),
/// or a visitor of a heap whose thread is alive, which must leave the
/// current pages and caches alone.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Access {
    /// The heap's owner, or the claimant of an abandoned heap.
    Owner,
    /// Another thread, while the owner lives: current pages and caches are
    /// the owner's.
    Visitor,
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
    /// The current page of each class (`current.rs`). Atomic only so that
    /// `stats()` can read it from another thread; the owner uses plain
    /// loads and stores.
    direct: current::CurrentPages<AtomicPtr<Page>, CLASSES>,
    /// The page lists, and with them every page but the current ones.
    local: Locked<Local>,
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
    /// The sampler's state (`heap/sample.rs`).
    sampling: sample::Sampling,
    /// What the owning thread allocated and freed (`heap/thread_bytes.rs`).
    thread_bytes: thread_bytes::ThreadBytes,
    /// Committed bytes in slab pages (owner-maintained).
    pub slab_committed: Counter,
    /// Highest `slab_committed + span_committed` seen.
    pub peak_committed: Counter,
    /// The span pool's committed bytes as last published (under its lock).
    pub span_committed: Counter,
    /// Fresh slab memory committed since other heaps last reclaimed their
    /// retention for it (page lists held).
    fresh: Counter,
    /// Bytes of OS pages purged inside slab pages that hold live slots, now
    /// (page lists held: `heap/hollow.rs`).
    pub hollow_bytes: Counter,
    /// Bytes purged inside such pages so far (cumulative; page lists held).
    pub hollowed: Counter,
    /// When the owner last took a span for a slab page (page lists held):
    /// a page inside a huge page is hollowed only a decay delay after
    /// (`heap/hollow.rs`).
    slab_grown_at: Counter,
    source: *const dyn PageSource,
    /// The transfer cache a global heap passes batches through (the
    /// process's [`GLOBAL`](crate::memory::transfer::GLOBAL); null for an
    /// owned heap, whose slots never leave it). A field, not the static
    /// named in place, so a test can run heaps on a cache of its own.
    transfer: *const crate::memory::transfer::Transfer,
    reservations: *const Locked<Reservations>,
    budget: *const Budget,
    /// Retention policy (changeable at run time: `options::set`).
    pub(crate) config: LiveConfig,
    /// Set by `trim()` of another thread: empty the caches at the next slow path.
    pub flush_requested: AtomicBool,
    /// Thread that owns the heap (0: none, abandoned).
    pub owner: AtomicUsize,
    /// Next heap in the list of all heaps.
    pub next_heap: AtomicPtr<HeapCore>,
    /// Next heap in the list of abandoned heaps.
    pub next_abandoned: AtomicPtr<HeapCore>,
    /// While the heap's thread has exited: one bit per class that may
    /// still have free slots on its pages for a running thread to take
    /// (`heap/leftovers.rs`); set when it is abandoned, cleared by a look
    /// that finds none.
    pub(crate) leftover_classes: AtomicU64,
    /// Earliest time a retained span of this heap expires (u64::MAX: none).
    pub next_deadline: AtomicU64,
    /// A thread heap of the global allocator (serviced by the purger).
    pub global: bool,
    /// The span of the last large block between guard pages this heap's
    /// thread freed, kept for its next one (the hardened build; owner only).
    #[cfg(feature = "secure")]
    pub(crate) kept: crate::secure::Kept,
    /// Carve slots in a shuffled order (a heap whose page source can share
    /// pages: meshing needs survivors at different offsets).
    shuffle_carving: bool,
    /// Slices of each class's slab page: [`PAGE_SLICES`], or, in a heap
    /// whose regions may be huge pages, `HUGE_PAGE_SLICES` (whose pages
    /// leave no whole OS page of their tail unused; the class states hold
    /// the matching geometry). The same for every thread heap.
    page_slices: &'static [u8; CLASSES],
}

// SAFETY: owner-only state is behind `local` and only touched by the owning
// thread (documented on each method); everything else is atomic or locked.
unsafe impl Sync for HeapCore {}

/// Where a heap's class states start in it: the fast paths reach a class
/// state from a heap pointer that may be [`empty_heap`]'s, which only has
/// states.
pub(crate) const STATES_OFFSET: usize = core::mem::offset_of!(HeapCore, states);

/// The class states behind [`empty_heap`]: every cache empty, every
/// geometry one no address passes.
pub(crate) struct EmptyStates(
    // Read only through `empty_heap()`'s pointer.
    #[allow(dead_code)] [ClassState; CLASSES + 1],
);

// SAFETY: nothing writes these states but the atomic word of state 0 a
// free announces its slot in (`ClassState::announce`), which no one reads:
// a pop finds the cache empty before it writes, and a free into them finds
// no slot start before it writes.
unsafe impl Sync for EmptyStates {}

/// The states of [`empty_heap`] (the thread-local word's initial value
/// points into it: `global/tls.rs`).
pub(crate) static EMPTY_STATES: EmptyStates = EmptyStates(
    [const { ClassState::new(0, crate::memory::size_class::Geometry::NONE) }; CLASSES + 1],
);

/// What a thread without a heap finds where the fast paths look for its
/// heap: a pointer whose class states are [`EMPTY_STATES`], so that the
/// thread cache's pop finds nothing and its push no slot, with no test for
/// null. Only its states are ever read ([`HeapCore::alloc_cached16`],
/// [`HeapCore::free_to_cache_or_empty`], [`HeapCore::cached_slot`]); it is
/// no heap.
#[inline(always)]
pub(crate) fn empty_heap() -> *mut HeapCore {
    (&EMPTY_STATES as *const EmptyStates as *const u8)
        .wrapping_sub(STATES_OFFSET)
        .cast_mut()
        .cast()
}
// SAFETY: as above; a heap moves between threads only when abandoned/adopted.
unsafe impl Send for HeapCore {}

impl HeapCore {
    /// Builds a heap in place.
    ///
    /// # Safety
    /// `at` is writable, aligned memory for a `HeapCore`; `source`,
    /// `reservations` and `budget` outlive the heap.
    pub unsafe fn init_at(
        at: *mut HeapCore,
        source: *const dyn PageSource,
        reservations: *const Locked<Reservations>,
        budget: *const Budget,
        config: Config,
        global: bool,
    ) {
        // Before any slot of any heap can be freed.
        crate::memory::block::init_secret();
        // SAFETY: the source outlives the heap (the caller's contract).
        let huge = Policy::of(config.thp, unsafe { &*source }).on();
        let heap = HeapCore {
            direct: current::CurrentPages::new([const { AtomicPtr::new(null_mut()) }; CLASSES]),
            local: Locked::new(Local {
                queues: [Queue::EMPTY; CLASSES],
                full: Queue::EMPTY,
                next_maintenance: 0,
                records: mesh::Records::EMPTY,
                mesh_pass: mesh::PassUnderWay::NONE,
            }),
            delayed: AtomicPtr::new(null_mut()),
            spans: Spans::locked(),
            states: ClassState::all(if huge { &HUGE_GEOMETRY } else { &GEOMETRY }),
            page_counts: [const { PageCounts::zero() }; CLASSES],
            sampling: sample::Sampling::new(),
            thread_bytes: thread_bytes::ThreadBytes::new(),
            slab_committed: Counter::zero(),
            peak_committed: Counter::zero(),
            span_committed: Counter::zero(),
            fresh: Counter::zero(),
            hollow_bytes: Counter::zero(),
            hollowed: Counter::zero(),
            slab_grown_at: Counter::zero(),
            source,
            transfer: if global {
                &crate::memory::transfer::GLOBAL
            } else {
                core::ptr::null()
            },
            reservations,
            budget,
            config: LiveConfig::new(config),
            flush_requested: AtomicBool::new(false),
            owner: AtomicUsize::new(0),
            next_heap: AtomicPtr::new(null_mut()),
            next_abandoned: AtomicPtr::new(null_mut()),
            leftover_classes: AtomicU64::new(0),
            next_deadline: AtomicU64::new(u64::MAX),
            global,
            // SAFETY: the source outlives the heap (the caller's contract).
            #[cfg(feature = "secure")]
            kept: crate::secure::Kept::new(),
            shuffle_carving: unsafe { (*source).sharing().is_some() },
            page_slices: if huge {
                &HUGE_PAGE_SLICES
            } else {
                &PAGE_SLICES
            },
        };
        for class in 0..CLASSES {
            heap.direct.set(class, empty_page());
        }
        // SAFETY: per the caller.
        unsafe {
            at.write(heap);
            (*at).start_sampling();
        }
    }

    /// The state (cache, geometry, counters) of size class `class`.
    #[inline]
    pub fn class(&self, class: usize) -> &ClassState {
        &self.states[class + 1]
    }

    /// The slot this heap's thread last announced it was freeing into its
    /// cache ([`ClassState::announce`]; 0 if none yet).
    pub(crate) fn announced_free(&self) -> usize {
        self.states[0].announced()
    }

    /// The states of all size classes, in class order.
    pub fn class_states(&self) -> &[ClassState] {
        &self.states[1..]
    }

    #[inline]
    fn current_page(&self, class: usize) -> *mut Page {
        self.direct.get(class)
    }

    #[inline]
    fn set_current_page(&self, class: usize, page: *mut Page) {
        self.direct.set(class, page);
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
            // SAFETY: outlives the heap (init_at contract).
            budget: unsafe { &*self.budget },
        }
    }

    /// The retention budget this heap shares.
    pub fn budget(&self) -> &Budget {
        // SAFETY: outlives the heap (init_at contract).
        unsafe { &*self.budget }
    }

    /// Takes the page lists for a slow path (the owner's, or a visit).
    /// Never reentrant: nothing that runs under it may allocate.
    #[inline]
    pub(crate) fn lock_local(&self) -> crate::sync::lock::Guard<'_, Local> {
        self.local.lock()
    }

    /// Whether a thread waits for the page lists (a mesh pass, which holds
    /// them for a long time, lets them go between its rounds then).
    pub(crate) fn lists_wanted(&self) -> bool {
        self.local.waiting()
    }

    /// As [`HeapCore::lock_local`], if no one holds it.
    pub(crate) fn try_lock_local(&self) -> Option<crate::sync::lock::Guard<'_, Local>> {
        self.local.try_lock()
    }

    /// The page lists' lock itself, for the fork handlers and a visit
    /// (`global::heaps::visit_one`).
    pub(crate) fn local_lock(&self) -> &Locked<Local> {
        &self.local
    }

    /// After a span operation (span lock held): publish the heap's bytes to
    /// the budget, purge what the budget says must go (expired beyond what
    /// demand needs, or anything beyond it plus the slack), publish the next
    /// deadline for the background purger, and track the peak.
    ///
    /// Most span operations of a busy program change nothing any of that
    /// looks at (a churn takes a retained span and gives it back: the
    /// committed bytes stay, the retained ones move by less than a grain,
    /// no deadline passes), so that case is told apart first, inline, with
    /// a few loads of this heap's own words; the rest is out of line.
    #[inline]
    fn after_span_change(&self, ctx: &Ctx, spans: &mut Spans, now: u64) {
        if !self.span_change_is_quiet(ctx, spans, now) {
            self.after_span_change_slow(ctx, spans, now);
        }
    }

    /// Whether [`HeapCore::after_span_change_slow`] would change nothing:
    /// nothing to publish (the committed bytes as published, the retained
    /// ones within a grain of it), no demand to note yet, no deadline due,
    /// retention under the floor every budget allows, and the committed
    /// bytes (hence the peak) as recorded.
    #[inline]
    fn span_change_is_quiet(&self, ctx: &Ctx, spans: &Spans, now: u64) -> bool {
        let deadline = self.next_deadline.load(Relaxed);
        spans.counts.committed as u64 == self.span_committed.get()
            && spans.counts.committed + self.slab_committed.get() as usize
                == spans.published_committed
            && !spans.retained_sync_due()
            && now < spans.next_note_at
            && now < deadline
            && (spans.retained() == 0 || deadline != u64::MAX)
            && ctx
                .budget
                .retained()
                .wrapping_add(spans.unpublished_retained() as usize)
                <= Budget::young_floor(ctx.config)
    }

    #[cold]
    #[inline(never)]
    fn after_span_change_slow(&self, ctx: &Ctx, spans: &mut Spans, now: u64) {
        self.publish_coarsely(spans, now);
        // This heap's own retention exactly, the others' as published.
        let retained = ctx
            .budget
            .retained()
            .wrapping_add(spans.unpublished_retained() as usize);
        // The history is read only when retention could be over budget: a
        // churn of one big buffer never gets there.
        let due = self.next_deadline.load(Relaxed) <= now
            || retained > Budget::young_floor(ctx.config)
                && ctx.budget.keep(now, &ctx.config.get()).young < retained;
        if spans.retained() > 0 && (due || self.next_deadline.load(Relaxed) == u64::MAX) {
            let next = spans.decay(ctx, now, None);
            self.next_deadline.store(next.unwrap_or(u64::MAX), Relaxed);
            self.publish(spans, now);
        }
        self.span_committed
            .0
            .store(spans.counts.committed as u64, Relaxed);
        self.note_peak();
    }

    /// Adds the change of this heap's committed and retained bytes since
    /// the last call to the budget, and records the demand (span lock held).
    pub(crate) fn publish(&self, spans: &mut Spans, now: u64) {
        self.publish_committed(spans);
        spans.sync_retained(self.budget());
        self.budget().note(now, &self.config.get());
    }

    /// [`HeapCore::publish`], with retained bytes published only once they
    /// moved by a grain (`Spans::sync_retained_coarsely`): the span
    /// operations of a churn then touch no shared counter.
    /// The demand is noted only if something was published or the
    /// history moved to a new slot since the last note: demand is
    /// committed minus retained, and this heap's share of both is what it
    /// publishes (others note their own changes).
    fn publish_coarsely(&self, spans: &mut Spans, now: u64) {
        let moved = self.publish_committed(spans) | spans.sync_retained_coarsely(self.budget());
        if moved || now >= spans.next_note_at {
            let config = self.config.get();
            self.budget().note(now, &config);
            spans.next_note_at = self.budget().next_slot_at(now, &config);
        }
    }

    /// Returns whether it published.
    fn publish_committed(&self, spans: &mut Spans) -> bool {
        let committed = spans.counts.committed + self.slab_committed.get() as usize;
        let delta = committed.wrapping_sub(spans.published_committed);
        if delta != 0 {
            self.budget().add(delta, 0);
            spans.published_committed = committed;
        }
        delta != 0
    }

    /// Reserves `bytes` this heap is about to commit outside its span
    /// lock, under the hard limit (`Config::limit_bytes`, exact: see
    /// [`Budget::charge`]). Refused, purges what every heap retains
    /// ([`HeapCore::purge_for_limit`]) and tries once more; false if still
    /// refused. The caller holds no span lock.
    pub(crate) fn charge(&self, bytes: usize) -> bool {
        let budget = self.budget();
        if budget.charge(bytes, self.config.limit_bytes()) {
            return true;
        }
        self.purge_for_limit();
        let charged = budget.charge(bytes, self.config.limit_bytes());
        if !charged {
            self.refused_by_limit();
        }
        charged
    }

    /// Runs `take` on the span pool; if it failed because the limit
    /// refused a charge (`Spans::over_limit`), purges what every heap
    /// retains and runs it once more.
    pub(crate) fn take_spans_within_limit<T>(
        &self,
        mut take: impl FnMut(&Ctx, &mut Spans) -> Option<T>,
    ) -> Option<T> {
        let ctx = self.ctx();
        for retry in [false, true] {
            let mut spans = self.spans.lock();
            spans.over_limit = false;
            if let Some(t) = take(&ctx, &mut spans) {
                return Some(t);
            }
            let over = core::mem::take(&mut spans.over_limit);
            drop(spans);
            if !over {
                break;
            }
            if retry {
                self.refused_by_limit();
                break;
            }
            self.purge_for_limit();
        }
        None
    }

    /// The limit refused an allocation, after the purge and the retry:
    /// the global allocator says so once (`PAGEWISE_LIMIT`); an owned heap's
    /// caller has the `Err` and its own configuration.
    #[cold]
    fn refused_by_limit(&self) {
        let budget = self.budget();
        if core::ptr::eq(budget, &crate::memory::budget::GLOBAL) {
            crate::config::warn::limit_refused(self.config.limit_bytes(), budget.charged());
        }
    }

    /// A charge was refused: purges this heap's retained memory (its span
    /// lock taken here: the caller must not hold it), then the other
    /// heaps' through the budget's hook.
    pub(crate) fn purge_for_limit(&self) {
        self.trim_shared_for(crate::memory::spans::Why::Limit);
        self.budget().purge_others();
    }

    /// Records a new peak of committed bytes (slab pages plus the span
    /// pool's last published figure).
    fn note_peak(&self) {
        let total = self.slab_committed.get() + self.span_committed.get();
        if total > self.peak_committed.get() {
            // Not a plain store: other threads get here too (a large free,
            // under the span lock) while the owner does without it.
            self.peak_committed.0.fetch_max(total, Relaxed);
        }
    }
}
