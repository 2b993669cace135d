//! The thread cache: per size class, a short LIFO list of free slots that
//! the heap's thread hands out again without touching any page.
//!
//! A free pushes the slot here whatever page it belongs to (this heap's or
//! another thread's), as jemalloc's and tcmalloc's thread caches do; an
//! allocation pops it. So an allocate/free pair, or a server thread freeing
//! what another thread allocated, touches one cache line of the heap and
//! the slot itself: no page descriptor, no atomic operation.
//!
//! The cache is what stands between a free and the page-level accounting
//! that lets pages empty and be released, so it is kept short: at most
//! [`LIMIT`] slots and 128 KiB of slots per class. A free that finds the
//! cache full passes the older half on first, in one batch: to the
//! process's transfer cache (`memory/transfer.rs`), where any thread takes
//! it, or home to their pages if that is full, so page work happens in
//! batches. The maintenance pass that runs on the heap's slow paths every
//! half decay period halves every cache, so slots a thread stopped asking
//! for go home; `trim()` empties them, and thread exit passes them on.
//!
//! A thread whose own batch comes back to it from the transfer cache (it
//! passed slots on, then asked for as many again before anyone else took
//! them) cycles through more slots of the class than its cache holds: each
//! cycle costs a pass and a take that move the slots nowhere. Its cache's
//! bound then doubles, up to the class's 128 KiB of slots ([`GROWN`]), as
//! tcmalloc's thread caches grow a list that keeps overflowing; each
//! maintenance pass halves it again towards [`LIMITS`], so a thread that
//! stops cycling goes back to the short cache, and thread exit resets it.
//!
//! The cache shares its cache line with the class's slot geometry and
//! counters, which the same fast paths read and update.
//!
//! A full cache is two chains: the slots freed since its last overflow
//! (the list the fast paths push and pop) and, below them, the *older
//! part*: the slots that overflow kept. The next overflow passes the older
//! part on whole and makes the list the older part, so handing half a
//! cache over follows no link (it used to walk half the cache to find
//! where to cut it: two thirds of the work of an overflow, and in the
//! hardened build every step decoded and checked a link). The fast paths
//! never see the older part: an allocation that finds the list empty takes
//! the older part as its list on its way to the page (`alloc_past_cache`),
//! so slots come out in the order a single list gave them. Only an
//! overflow that finds no older part worth passing (the first after the
//! list ran dry, or one whose parts are lopsided) still walks to the
//! middle; the slow paths that take an arbitrary share (maintenance,
//! flushes, thread exit) join the two chains first.

use crate::fault::{misuse, Misuse};
use crate::heap::Counter;
use crate::memory::page::Block;
use crate::memory::size_class::{Geometry, CLASSES, SLOT_SIZE};
use core::cell::UnsafeCell;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicI64, AtomicU32, Ordering::Relaxed};

#[cfg(feature = "secure")]
mod fifo;
#[cfg(feature = "secure")]
pub use fifo::{DEPTH, MOST as DEPTH_MOST};

/// Most slots cached per class.
pub const LIMIT: u32 = 128;
/// Most bytes of slots cached per class (at least one slot is).
pub const LIMIT_BYTES: usize = 128 << 10;

const fn build_limits() -> [u32; CLASSES] {
    let mut t = [0u32; CLASSES];
    let mut i = 0;
    while i < CLASSES {
        let n = LIMIT_BYTES / SLOT_SIZE[i] as usize;
        t[i] = if n == 0 {
            1
        } else if n > LIMIT as usize {
            LIMIT
        } else {
            n as u32
        };
        // The hardened cache keeps its class's depth cached and passes on
        // as many: twice the depth at least.
        #[cfg(feature = "secure")]
        if t[i] < 2 * fifo::DEPTH[i] as u32 {
            t[i] = 2 * fifo::DEPTH[i] as u32;
        }
        i += 1;
    }
    t
}

const fn build_grown() -> [u32; CLASSES] {
    let mut t = [0u32; CLASSES];
    let mut i = 0;
    while i < CLASSES {
        // At least the usual bound, which is this one capped at LIMIT.
        let n = (LIMIT_BYTES / SLOT_SIZE[i] as usize) as u32;
        t[i] = if n == 0 { 1 } else { n };
        #[cfg(feature = "secure")]
        if t[i] < 2 * fifo::DEPTH[i] as u32 {
            t[i] = 2 * fifo::DEPTH[i] as u32;
        }
        i += 1;
    }
    t
}

/// `ClassState::left` of a heap that does not sample: 2^45
/// allocations of one class (ten hours of nothing but that class at 10^9
/// a second). A heap that gets there takes the sampled path once, which
/// finds nothing due and counts down from here again.
pub const NOT_SAMPLING: i64 = 1 << 45;
const _: () = assert!(
    NOT_SAMPLING <= i64::MAX >> (ROOM_BITS + 1),
    "fits the counts word"
);

/// Low bits of [`ClassState`]'s counts word that hold the cache's room;
/// the bits above hold the sample countdown. Room is at most the largest
/// [`GROWN`] bound (128 KiB of 16-byte slots: 8,192).
const ROOM_BITS: u32 = 16;
/// The room's bits of the counts word.
const ROOM_MASK: i64 = (1 << ROOM_BITS) - 1;
/// What a pop adds to the counts word: one more slot of room, one
/// allocation less to the next sample (one `add` on memory).
const POPPED: i64 = 1 - (1 << ROOM_BITS);
const _: () = assert!(LIMIT_BYTES / 16 <= ROOM_MASK as usize);

/// Slots cached at most, per class, until the cache grows.
pub static LIMITS: [u32; CLASSES] = build_limits();

/// Slots cached at most, per class, by a cache that grew: 128 KiB of
/// slots (at least [`LIMITS`]).
pub static GROWN: [u32; CLASSES] = build_grown();

/// One size class of a heap: its cache of free slots, the class's slot
/// geometry, and its counters, on one cache line: the fast paths touch no
/// other line of the heap. A second line holds what only slow paths use
/// (the older part's chain and the cache's bound).
#[repr(C, align(64))]
pub struct ClassState {
    /// Cached free slots, newest first, that the fast paths push and pop
    /// (owner only); null-terminated, the older part apart.
    head: UnsafeCell<*mut Block>,
    /// Two counts in one word (owner writes with plain stores; stats read
    /// it whole), so that a pop updates both with one `add` on memory:
    ///
    /// - its low [`ROOM_BITS`], the *room*: slots the cache can still take,
    ///   the list and the older part counted. Counting down saves the free
    ///   path a table lookup;
    /// - the bits above, signed, the *countdown* (`left`): allocations of
    ///   the class until the next sampled one, that one included. The fast
    ///   paths count it down where they used to count allocations up, and
    ///   the heap derives its allocations from it ([`HeapCore::allocs`]).
    ///   At 1 the cache declines the allocation, and the heap samples it
    ///   (`alloc_sampled`). Not sampling: so high it gets there only every
    ///   [`NOT_SAMPLING`] allocations (then it finds nothing due).
    ///
    /// The room is below 2^[`ROOM_BITS`], so the word is below
    /// `2 << ROOM_BITS` exactly when the countdown is at most 1: the pop
    /// tests the countdown with one comparison of the whole word. The
    /// owner's fast paths read it with plain loads: no other thread writes
    /// it.
    ///
    /// [`HeapCore::allocs`]: crate::heap::HeapCore::allocs
    counts: AtomicI64,
    /// The class's slot geometry (a copy of the heap's table, `GEOMETRY`
    /// or `HUGE_GEOMETRY`; fixed), which the free path checks the address
    /// against.
    geometry: Geometry,
    /// Slots in the older part (owner only; 0: none). On this line: the
    /// allocation that finds the list empty reads it.
    older_count: UnsafeCell<u32>,
    /// The hardened build's cache (`cache/fifo.rs`): the room at which a
    /// pop declines, so that `depth` slots stay cached (the limit less the
    /// depth, saturating; owner only).
    #[cfg(feature = "secure")]
    floor: UnsafeCell<u16>,
    /// The hardened build's cache: the later frees of the class a slot
    /// waits for before it is handed out again (owner only).
    #[cfg(feature = "secure")]
    depth: UnsafeCell<u16>,
    /// The hardened build's cache: the newest slot (owner only; null: the
    /// back chain is empty), whose link word holds a raw 0 until the next
    /// push links it.
    #[cfg(feature = "secure")]
    tail: UnsafeCell<*mut Block>,
    /// Slots given back to this heap's pages (cumulative): its own frees
    /// past the cache (or sent home from it) and other threads' frees into
    /// its pages once collected. Frees into the cache are not counted on
    /// the fast path: [`ClassState::frees`] derives them.
    #[cfg(not(feature = "secure"))]
    pub returned: Counter,
    /// Bytes requested by the allocations served from pages (cumulative):
    /// a sample of all allocations, whose mean estimates the requested
    /// bytes of live slots (a C `free` does not say the size anyway).
    pub requested: Counter,
    /// Allocations served from pages (cumulative): the sample's size.
    pub sampled: Counter,
    /// The older part: the slots the last overflow kept, newest first,
    /// null-terminated, `older_count` of them (owner only).
    older: UnsafeCell<*mut Block>,
    /// Most slots the cache holds now: between the class's [`LIMITS`] and
    /// [`GROWN`] (owner writes, on slow paths only; stats read).
    limit: AtomicU32,
    /// As in the default build, on the second line: the hot line holds
    /// the hardened cache's fields instead.
    #[cfg(feature = "secure")]
    pub returned: Counter,
}

// The slab table holds `class + 1` scaled to the state's size (`segment.rs`).
const _: () =
    assert!(core::mem::size_of::<ClassState>() == 1 << crate::memory::segment::STATE_SHIFT);

impl ClassState {
    /// An empty cache of `limit` slots of the class with `geometry`, zero
    /// counters.
    pub const fn new(limit: u32, geometry: Geometry) -> ClassState {
        ClassState {
            head: UnsafeCell::new(null_mut()),
            counts: AtomicI64::new(NOT_SAMPLING << ROOM_BITS | limit as i64),
            geometry,
            older_count: UnsafeCell::new(0),
            #[cfg(feature = "secure")]
            floor: UnsafeCell::new(fifo::floor(limit, 0)),
            #[cfg(feature = "secure")]
            depth: UnsafeCell::new(0),
            #[cfg(feature = "secure")]
            tail: UnsafeCell::new(null_mut()),
            returned: Counter::zero(),
            requested: Counter::zero(),
            sampled: Counter::zero(),
            older: UnsafeCell::new(null_mut()),
            limit: AtomicU32::new(limit),
        }
    }

    /// Whether a slot of this class starts `offset` bytes into its page.
    #[inline]
    pub fn starts_slot(&self, offset: usize) -> bool {
        self.geometry.starts_slot(offset)
    }

    /// Slots given back (cumulative): into the cache, into this heap's
    /// pages, and other threads' frees into its pages once collected; slots
    /// that go from the cache to another heap's page are counted by that
    /// heap. The cache's share is not counted as it happens (a free's fast
    /// path would pay for it) but derived: what went in is what is there,
    /// plus what was handed out from it (`allocs - sampled`), plus what was
    /// sent on to pages (counted again in `returned` or by the other heap,
    /// so it cancels).
    /// `allocs` is the class's allocations ([`HeapCore::allocs`]).
    ///
    /// [`HeapCore::allocs`]: crate::heap::HeapCore::allocs
    pub fn frees(&self, allocs: u64) -> u64 {
        let from_cache = allocs.saturating_sub(self.sampled.get());
        self.cached() as u64 + from_cache + self.returned.get()
    }

    /// Estimated requested bytes of all `allocs` allocations of the class,
    /// from the sample.
    pub fn requested_estimate(&self, allocs: u64) -> u64 {
        let sampled = self.sampled.get();
        if sampled == 0 {
            return 0;
        }
        (self.requested.get() as u128 * allocs as u128 / sampled as u128) as u64
    }

    /// Allocations until the next sampled one (see `left`).
    #[inline]
    pub fn left(&self) -> i64 {
        self.counts.load(Relaxed) >> ROOM_BITS
    }

    /// Slots the cache can still take (any thread; a snapshot).
    #[inline]
    fn room(&self) -> u32 {
        (self.counts.load(Relaxed) & ROOM_MASK) as u32
    }

    /// Sets the room, keeping the countdown (owner only).
    #[inline]
    fn set_room(&self, room: u32) {
        debug_assert!(room as i64 <= ROOM_MASK);
        let w = self.counts.load(Relaxed);
        self.counts.store((w & !ROOM_MASK) + room as i64, Relaxed);
    }

    /// Whether the next allocation of the class is to be sampled.
    #[inline]
    pub fn sample_due(&self) -> bool {
        self.left() <= 1
    }

    /// Sets the allocations until the next sampled one (owner only).
    pub fn arm(&self, left: i64) {
        debug_assert!(left <= NOT_SAMPLING);
        let w = self.counts.load(Relaxed);
        self.counts
            .store((left << ROOM_BITS) + (w & ROOM_MASK), Relaxed);
    }

    /// Slots in the cache (any thread; a snapshot).
    pub fn cached(&self) -> u32 {
        // Saturating: another thread may see a new bound with the old room.
        self.limit().saturating_sub(self.room())
    }

    /// Most slots the cache holds now (any thread; a snapshot).
    pub fn limit(&self) -> u32 {
        self.limit.load(Relaxed)
    }

    /// Makes `limit` the cache's bound, keeping its slots (owner only, on
    /// a slow path; the cache holds at most `limit` slots).
    pub fn set_limit(&self, limit: u32) {
        let cached = self.cached();
        debug_assert!(cached <= limit, "{cached} cached over a bound of {limit}");
        self.limit.store(limit, Relaxed);
        self.set_room(limit - cached);
        #[cfg(feature = "secure")]
        self.fifo_set_floor(limit);
    }

    /// A state per class at index `class + 1`, each cache bounded by
    /// [`LIMITS`], with the slot geometry of `geometry` (the heap's page
    /// sizes: `GEOMETRY` or `HUGE_GEOMETRY`), after a state at index 0
    /// that caches nothing and whose geometry no offset passes.
    pub const fn all(geometry: &[Geometry; CLASSES]) -> [ClassState; CLASSES + 1] {
        let mut t = [const { ClassState::new(0, Geometry::NONE) }; CLASSES + 1];
        let mut i = 0;
        while i < CLASSES {
            #[cfg(not(feature = "secure"))]
            {
                t[i + 1] = ClassState::new(LIMITS[i], geometry[i]);
            }
            #[cfg(feature = "secure")]
            {
                t[i + 1] = fifo::deep(LIMITS[i], geometry[i], fifo::DEPTH[i]);
            }
            i += 1;
        }
        t
    }

    /// Takes a cached slot for an allocation, if any and no sample is due,
    /// and counts the allocation. Aborts if the slot does not hold the
    /// cache key: it was freed twice (its first copy already handed out, or
    /// gone to its page).
    ///
    /// # Safety
    /// Owner only.
    #[inline]
    #[cfg_attr(feature = "secure", allow(unreachable_code, dead_code))]
    pub unsafe fn pop(&self) -> *mut Block {
        #[cfg(feature = "secure")]
        return unsafe { self.fifo_pop() };
        // SAFETY: owner only (caller): the list is ours, and holds free slots
        // whose first word links the next and whose second holds the key.
        // Only the owner writes `left`; other threads only read it, so a
        // plain read of it races with no write.
        unsafe {
            let b = *self.head.get();
            // Two branches, each on a flag its own comparison sets (one
            // branch on both costs two `set`s and an `or`). The plain read
            // of the counts is an operand of the comparison: below
            // `2 << ROOM_BITS`, the countdown is at most 1.
            if b.is_null() || *self.counts.as_ptr() < 2 << ROOM_BITS {
                return null_mut();
            }
            let next = Block::next(b);
            if !Block::is_cached(b) {
                misuse(crate::memory::block::KEY_LOST, b as usize);
            }
            *self.head.get() = next;
            Block::mark_live(b);
            // One more slot of room and one allocation less to the next
            // sample, in one `add` on memory (the word loaded again where
            // it is updated). The room stays below its bound: the cache
            // held this slot.
            self.counts
                .store(self.counts.load(Relaxed) + POPPED, Relaxed);
            b
        }
    }

    /// Caches a freed slot unless the cache is full (then returns false).
    ///
    /// # Safety
    /// Owner only; `block` is a slot of this class, already marked cached
    /// (`Block::mark_cached`), no longer used by the caller.
    #[inline]
    #[cfg_attr(feature = "secure", allow(unreachable_code, dead_code))]
    pub unsafe fn push(&self, block: *mut Block) -> bool {
        #[cfg(feature = "secure")]
        return unsafe { self.fifo_push(block) };
        // SAFETY: only the owner (the caller) writes the counts; other
        // threads only read them, so a plain read races with no write (and
        // is an operand of the comparison).
        if unsafe { *self.counts.as_ptr() } & ROOM_MASK == 0 {
            return false;
        }
        // SAFETY: the slot is ours to link (caller); the list is owner-only.
        unsafe {
            Block::set_next(block, *self.head.get());
            *self.head.get() = block;
        }
        // One slot less of room (not 0: no borrow from the countdown),
        // loaded again where it is updated: one instruction on memory.
        self.counts.store(self.counts.load(Relaxed) - 1, Relaxed);
        true
    }

    /// On the heap's state 0 (no class's: no address passes its geometry,
    /// so its `returned` counts nothing): says that the heap's thread is
    /// about to free the slot at `addr` into its cache. Stored before the
    /// free reads the slot's page's slab word, so a mesh pass or a page
    /// being hollowed, which makes the page uncacheable and then has every
    /// thread pass a barrier, sees the slot here if the free read the old
    /// word (`memory/cache_handshake.rs`, `HeapCore::spare_announced`,
    /// `Page::hollow`). A release store: one that reads a later
    /// announcement sees the stores of the free before it (its key and
    /// link); on x86-64 a plain `mov`, as a relaxed one. One store, by the
    /// owner only (a thread without a heap stores into
    /// [`EMPTY_STATES`](super::EMPTY_STATES), which no pass reads).
    #[inline(always)]
    pub(crate) fn announce(&self, addr: usize) {
        self.returned
            .0
            .store(addr as u64, crate::memory::cache_handshake::ANNOUNCE);
    }

    /// The slot last announced on this state 0 ([`ClassState::announce`]),
    /// and, by an acquire load, what its thread stored before it.
    pub(crate) fn announced(&self) -> usize {
        self.returned
            .0
            .load(crate::memory::cache_handshake::READ_ANNOUNCED) as usize
    }

    /// Makes a list of `count` cached slots of this class (a batch from
    /// the transfer cache) the cache's content. Reached through
    /// `HeapCore::install_cached`, which counts them for the thread's
    /// figures (`heap/thread_bytes.rs`).
    ///
    /// # Safety
    /// Owner only; the cache is empty; the list holds `count` slots of this
    /// class marked cached, at most the class's [`GROWN`] bound, no longer
    /// used by anyone else.
    #[cfg_attr(feature = "secure", allow(unreachable_code, dead_code))]
    pub(super) unsafe fn install(&self, head: *mut Block, count: u32) {
        #[cfg(feature = "secure")]
        return unsafe { self.fifo_install(head, count) };
        debug_assert_eq!(self.cached(), 0);
        // SAFETY: owner only (caller).
        debug_assert!(unsafe { (*self.older.get()).is_null() });
        // A batch passed by a cache that had grown may be more than this
        // one holds: it grows to take it (no further than that cache had).
        self.set_limit(self.limit().max(count));
        let room = self.room();
        // SAFETY: owner only (caller).
        unsafe { *self.head.get() = head };
        self.set_room(room - count);
    }

    /// The most recently cached slot (null if none).
    ///
    /// # Safety
    /// Owner only.
    #[cfg_attr(feature = "secure", allow(unreachable_code, dead_code))]
    pub unsafe fn newest(&self) -> *mut Block {
        #[cfg(feature = "secure")]
        return unsafe { self.fifo_newest() };
        // SAFETY: owner only (caller).
        unsafe {
            match *self.head.get() {
                b if b.is_null() => *self.older.get(),
                b => b,
            }
        }
    }

    /// Makes the older part the list, if the list is empty and the older
    /// part is not (an allocation that found the list empty, on its way
    /// past the cache); returns whether it did. Follows no link.
    ///
    /// # Safety
    /// Owner only.
    #[inline(always)]
    #[cfg_attr(feature = "secure", allow(unreachable_code, dead_code))]
    pub unsafe fn take_up_older(&self) -> bool {
        #[cfg(feature = "secure")]
        return unsafe { self.fifo_take_up() };
        // SAFETY: owner only (caller): both chains are ours.
        unsafe {
            if *self.older_count.get() == 0 || !(*self.head.get()).is_null() {
                return false;
            }
            self.take_up_older_now();
        }
        true
    }

    /// [`ClassState::take_up_older`]'s move, out of line (its caller
    /// checked that the list is empty and the older part is not).
    ///
    /// # Safety
    /// Owner only.
    #[inline(never)]
    #[cfg_attr(feature = "secure", allow(dead_code))]
    unsafe fn take_up_older_now(&self) {
        // SAFETY: owner only (caller).
        unsafe {
            *self.head.get() = *self.older.get();
            *self.older.get() = null_mut();
            *self.older_count.get() = 0;
        }
    }

    /// Detaches the older slots of a full cache for an overflow to pass
    /// on, with their count, and makes what stays the older part (the
    /// list empty): the older part whole, following no link, when it and
    /// the list each hold at least a quarter of the cache; otherwise all
    /// but the newer half, walking to the middle as [`ClassState::take_older`]
    /// does. Reached through `HeapCore::take_overflow`, which counts them
    /// for the thread's figures.
    ///
    /// # Safety
    /// Owner only.
    #[cfg_attr(feature = "secure", allow(unreachable_code, dead_code))]
    pub(super) unsafe fn take_overflow(&self) -> (*mut Block, u32) {
        #[cfg(feature = "secure")]
        return unsafe { self.fifo_take_overflow() };
        let n = self.cached();
        // SAFETY: owner only (caller): both chains are ours.
        unsafe {
            let s = *self.older_count.get();
            let m = n - s;
            let (rest, passed) = if s >= (n / 4).max(1) && m >= (n / 4).max(1) {
                let rest = *self.older.get();
                self.set_room(self.room() + s);
                (rest, s)
            } else {
                self.take_older(n / 2)
            };
            // What stays becomes the older part: the next overflow passes
            // it whole.
            *self.older.get() = *self.head.get();
            *self.older_count.get() = n - passed;
            *self.head.get() = null_mut();
            (rest, passed)
        }
    }

    /// Joins the older part to the end of the list (walking the list to
    /// its last slot), so that the cache is one list again.
    ///
    /// # Safety
    /// Owner only.
    #[cfg_attr(feature = "secure", allow(unreachable_code, dead_code))]
    unsafe fn join(&self) {
        #[cfg(feature = "secure")]
        return unsafe { self.fifo_join() };
        // SAFETY: owner only (caller): both chains are ours, the list
        // holds `cached() - older_count` slots unless a double free left
        // it shorter (then a null link ends the walk).
        unsafe {
            let s = *self.older_count.get();
            if s == 0 {
                return;
            }
            let older = *self.older.get();
            let mut last = *self.head.get();
            if last.is_null() {
                *self.head.get() = older;
            } else {
                for _ in 1..self.cached() - s {
                    let next = Block::next(last);
                    if next.is_null() {
                        // Shorter than counted: a slot was freed twice.
                        misuse(Misuse::DoubleFree, last as usize);
                    }
                    last = next;
                }
                Block::set_next(last, older);
            }
            *self.older.get() = null_mut();
            *self.older_count.get() = 0;
        }
    }

    /// Detaches all but the `keep` most recent cached slots as a list (the
    /// older ones, which the thread is least likely to want back), with
    /// their count: the caller frees each to its page, which counts it where
    /// it lands. The caller walks the list by that count, not to its end: a
    /// slot freed twice into the cache makes the list a cycle. Reached
    /// through `HeapCore::take_cached`, which counts them for the thread's
    /// figures (`heap/thread_bytes.rs`).
    ///
    /// # Safety
    /// Owner only.
    #[cfg_attr(feature = "secure", allow(unreachable_code, dead_code))]
    pub(super) unsafe fn take_older(&self, keep: u32) -> (*mut Block, u32) {
        #[cfg(feature = "secure")]
        return unsafe { self.fifo_take_older(keep) };
        let n = self.cached();
        if n <= keep {
            return (null_mut(), 0);
        }
        // SAFETY: owner only (caller); once joined, the list holds `n`
        // slots, unless a double free left it shorter (then a null link
        // ends the walk).
        unsafe {
            self.join();
            let rest = if keep == 0 {
                let all = *self.head.get();
                *self.head.get() = null_mut();
                all
            } else {
                let mut last = *self.head.get();
                for _ in 1..keep {
                    let next = Block::next(last);
                    if next.is_null() {
                        // Shorter than counted: a slot was freed twice.
                        misuse(Misuse::DoubleFree, last as usize);
                    }
                    last = next;
                }
                let rest = Block::next(last);
                Block::set_next(last, null_mut());
                rest
            };
            self.set_room(self.room() + (n - keep));
            (rest, n - keep)
        }
    }

    /// Checks every cached slot (a walk by count, as at thread exit) without
    /// changing the cache: aborts if a slot is not marked cached, or is in
    /// the cache twice, or the list is shorter than counted.
    ///
    /// # Safety
    /// Owner only.
    pub unsafe fn verify(&self) {
        // SAFETY: forwarded (owner only).
        unsafe {
            self.keys_to_page();
            self.keys_to_cache();
        }
    }

    /// The first half of [`ClassState::verify`]: moves each cached slot's
    /// key to the page key, so that a slot met twice, here or in another
    /// list checked the same way before [`ClassState::keys_to_cache`],
    /// fails the check (aborts).
    ///
    /// # Safety
    /// Owner only; `keys_to_cache` follows before any other use of the
    /// cache.
    #[cfg_attr(feature = "secure", allow(unreachable_code, dead_code))]
    pub unsafe fn keys_to_page(&self) {
        #[cfg(feature = "secure")]
        return unsafe { self.fifo_keys_to_page() };
        // SAFETY: owner only (caller): the chains are ours.
        unsafe {
            let s = *self.older_count.get();
            walk_to_page(*self.head.get(), self.cached() - s);
            walk_to_page(*self.older.get(), s);
        }
    }

    /// Puts the cache keys back after [`ClassState::keys_to_page`].
    ///
    /// # Safety
    /// Owner only, after `keys_to_page`.
    #[cfg_attr(feature = "secure", allow(unreachable_code, dead_code))]
    pub unsafe fn keys_to_cache(&self) {
        #[cfg(feature = "secure")]
        return unsafe { self.fifo_keys_to_cache() };
        // SAFETY: owner only (caller): the list holds `cached()` slots
        // less the older part's.
        unsafe {
            let s = *self.older_count.get();
            walk_to_cache(*self.head.get(), self.cached() - s);
            walk_to_cache(*self.older.get(), s);
        }
    }

    /// Counts an allocation of `size` bytes served from a page (and samples
    /// its size).
    #[inline]
    pub fn count_alloc(&self, size: usize) {
        self.counts
            .store(self.counts.load(Relaxed) - (1 << ROOM_BITS), Relaxed);
        self.requested.add(size as u64);
        self.sampled.add(1);
    }
}

/// Moves the keys of the `n` cached slots of the chain at `head` to the
/// page key, aborting on a slot that does not hold the cache key (freed
/// twice: met already in this walk or in another one made before the keys
/// go back) or a chain shorter than counted.
///
/// # Safety
/// The chain holds `n` cached slots that nobody else uses meanwhile.
pub unsafe fn walk_to_page(head: *mut Block, n: u32) {
    let (mut b, mut prev) = (head, null_mut::<Block>());
    for _ in 0..n {
        if b.is_null() {
            // Shorter than counted: a slot was freed twice.
            misuse(Misuse::DoubleFree, prev as usize);
        }
        // SAFETY: a slot of the chain (caller).
        unsafe {
            if !Block::cached_to_page(b) {
                misuse(crate::memory::block::KEY_LOST, b as usize);
            }
            (prev, b) = (b, Block::next(b));
        }
    }
}

/// Puts the cache key back in the `n` slots of the chain at `head`, after
/// [`walk_to_page`].
///
/// # Safety
/// As `walk_to_page`, which went over this chain.
pub unsafe fn walk_to_cache(head: *mut Block, n: u32) {
    let mut b = head;
    for _ in 0..n {
        // SAFETY: a slot of the chain (caller).
        unsafe {
            Block::mark_cached(b);
            b = Block::next(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::size_class::GEOMETRY;

    /// A test slot: two words, 16-byte aligned like every slot (the
    /// hardened build's links check the alignment).
    #[repr(C, align(16))]
    #[derive(Clone, Copy)]
    struct Slot([usize; 2]);

    #[test]
    fn a_state_reads_back_the_slot_last_announced() {
        let c = ClassState::new(0, Geometry::NONE);
        assert_eq!(c.announced(), 0);
        c.announce(0x2000_0040);
        assert_eq!(c.announced(), 0x2000_0040);
        c.announce(0x2000_0080);
        assert_eq!(c.announced(), 0x2000_0080);
    }

    // The default build's cache (`fifo.rs` tests the hardened one).
    #[cfg(not(feature = "secure"))]
    #[test]
    fn limits_bound_slots_and_bytes() {
        for c in 0..CLASSES {
            let l = LIMITS[c];
            assert!((1..=LIMIT).contains(&l));
            assert!(l == 1 || l as usize * SLOT_SIZE[c] as usize <= LIMIT_BYTES);
        }
        assert_eq!(LIMITS[crate::memory::size_class::class_of(64)], LIMIT);
        assert_eq!(LIMITS[crate::memory::size_class::class_of(256 << 10)], 1);
        // A cache that grew holds 128 KiB of slots, never fewer than before.
        for c in 0..CLASSES {
            let g = GROWN[c];
            assert!(g >= LIMITS[c]);
            assert!(g == LIMITS[c] || g as usize * SLOT_SIZE[c] as usize <= LIMIT_BYTES);
            assert!((g as usize + 1) * SLOT_SIZE[c] as usize > LIMIT_BYTES);
        }
        assert_eq!(GROWN[crate::memory::size_class::class_of(16)], 8192);
    }

    /// A bound set on a slow path keeps the cached slots and counts the
    /// room from them; a batch larger than the cache's bound (passed by a
    /// cache that had grown) grows it to take the batch whole.
    // The default build's cache (`fifo.rs` tests the hardened one).
    #[cfg(not(feature = "secure"))]
    #[test]
    fn a_new_bound_keeps_the_slots_and_a_large_batch_fits() {
        let mut slots = [Slot([0; 2]); 4];
        let p = |s: &mut [Slot; 4], i: usize| s[i].0.as_mut_ptr() as *mut Block;
        let c = ClassState::new(2, GEOMETRY[0]);
        // SAFETY: test-local slots, each in one list at a time, marked
        // cached as a free does.
        unsafe {
            for i in 0..4 {
                Block::mark_cached(p(&mut slots, i));
            }
            assert!(c.push(p(&mut slots, 0)));
            c.set_limit(3);
            assert_eq!((c.limit(), c.cached()), (3, 1));
            assert!(c.push(p(&mut slots, 1)) && c.push(p(&mut slots, 2)));
            assert!(!c.push(p(&mut slots, 3)), "full at the new bound");
            let (list, n) = c.take_older(0);
            assert_eq!(n, 3);
            c.set_limit(2);
            assert_eq!((c.limit(), c.cached()), (2, 0));
            // The three slots, as a batch, into a cache of two.
            c.install(list, n);
            assert_eq!((c.limit(), c.cached()), (3, 3));
            c.verify();
            assert_eq!(c.pop(), p(&mut slots, 2));
        }
    }

    /// Eight test slots, marked cached as a free marks them, and the
    /// address of each.
    #[cfg_attr(feature = "secure", allow(dead_code))]
    fn eight() -> (Box<[Slot; 8]>, Vec<*mut Block>) {
        let mut slots = Box::new([Slot([0; 2]); 8]);
        let all: Vec<*mut Block> = slots
            .iter_mut()
            .map(|s| s.0.as_mut_ptr() as *mut Block)
            .collect();
        for &b in &all {
            // SAFETY: a test-local slot of two words.
            unsafe { Block::mark_cached(b) };
        }
        (slots, all)
    }

    /// The slots of a chain of `n`, first to last.
    ///
    /// # Safety
    /// `head` starts a chain of at least `n` slots.
    #[cfg_attr(feature = "secure", allow(dead_code))]
    unsafe fn chain(mut b: *mut Block, n: u32) -> Vec<*mut Block> {
        let mut v = vec![];
        for _ in 0..n {
            v.push(b);
            // SAFETY: per the caller.
            b = unsafe { Block::next(b) };
        }
        v
    }

    /// An overflow keeps the newer half as the older part and starts an
    /// empty list; the next one passes that older part whole, without
    /// following a link of the list (here, a list whose first link was
    /// overwritten: a walk to the middle, as every overflow made before,
    /// follows it and cuts the chain at the slot it points to).
    // The default build's cache (`fifo.rs` tests the hardened one).
    #[cfg(not(feature = "secure"))]
    #[test]
    fn an_overflow_passes_the_older_part_whole_without_reading_the_list() {
        let (_slots, s) = eight();
        let (a, b, c, d, e, f, x) = (s[0], s[1], s[2], s[3], s[4], s[5], s[7]);
        let cache = ClassState::new(4, GEOMETRY[0]);
        // SAFETY: test-local slots, each in one list at a time.
        unsafe {
            for b in [a, b, c, d] {
                assert!(cache.push(b));
            }
            // The first overflow: no older part yet, so the older half goes
            // (found by walking), and the newer half is kept apart.
            let (first, n) = cache.take_overflow();
            assert_eq!(chain(first, n), [b, a]);
            assert_eq!((cache.cached(), cache.newest()), (2, d));
            assert!(cache.push(e) && cache.push(f));
            assert!(!cache.push(x), "full: two kept, two pushed");
            // Overwrite the list's first link: to a slot that is no part of
            // the cache, whose own link word holds a mark.
            const MARK: usize = 0x5a5a_5a5a_5a5a_5a50;
            (x as *mut usize).write(MARK);
            Block::set_next(f, x);
            let (older, n) = cache.take_overflow();
            assert_eq!((older, n), (d, 2), "the older part, whole");
            assert_eq!(
                (x as *const usize).read(),
                MARK,
                "nothing followed the link"
            );
            assert_eq!(chain(older, n), [d, c]);
            assert_eq!(cache.cached(), 2);
            Block::set_next(f, e);
            // Allocations: the list (now the older part) goes on through
            // the fast path only once it is taken up.
            assert!(cache.pop().is_null(), "the fast path sees an empty list");
            assert!(cache.take_up_older());
            assert!(!cache.take_up_older(), "nothing more to take up");
            assert_eq!((cache.pop(), cache.pop()), (f, e));
            assert!(cache.pop().is_null());
            assert_eq!(cache.cached(), 0);
        }
    }

    /// Slots come out of a cache with an older part in the order one list
    /// gave: the list's, newest first, then the older part's. A flush or a
    /// maintenance pass (which take an arbitrary share) joins the two
    /// chains; the checks walk both.
    // The default build's cache (`fifo.rs` tests the hardened one).
    #[cfg(not(feature = "secure"))]
    #[test]
    fn the_older_part_comes_after_the_list_everywhere() {
        let (_slots, all) = eight();
        let cache = ClassState::new(6, GEOMETRY[0]);
        // SAFETY: test-local slots, each in one list at a time.
        unsafe {
            for &b in &all[..6] {
                assert!(cache.push(b));
            }
            let (gone, n) = cache.take_overflow();
            assert_eq!(chain(gone, n), [all[2], all[1], all[0]]);
            assert!(cache.push(all[6]) && cache.push(all[7]));
            // List 7, 6; older part 5, 4, 3.
            cache.verify();
            assert_eq!(cache.newest(), all[7]);
            // Keep the three most recent: the older part's last two go.
            let (rest, n) = cache.take_older(3);
            assert_eq!(chain(rest, n), [all[4], all[3]]);
            assert_eq!(cache.cached(), 3);
            cache.verify();
            let (rest, n) = cache.take_older(0);
            assert_eq!(chain(rest, n), [all[7], all[6], all[5]]);
            assert_eq!(cache.cached(), 0);
            // An older part alone (the list popped dry) is the newest.
            for &b in &all[..6] {
                assert!(cache.push(b));
            }
            let _ = cache.take_overflow();
            assert_eq!(cache.newest(), all[5]);
            let (rest, n) = cache.take_older(1);
            assert_eq!(chain(rest, n), [all[4], all[3]]);
            assert_eq!(cache.pop(), all[5]);
        }
    }

    /// An older part too small or too large a share of the cache (its
    /// bound grew since it was kept) is not passed alone: the overflow
    /// splits the cache in halves again.
    // The default build's cache (`fifo.rs` tests the hardened one).
    #[cfg(not(feature = "secure"))]
    #[test]
    fn a_lopsided_cache_is_split_in_halves() {
        let (_slots, all) = eight();
        let cache = ClassState::new(2, GEOMETRY[0]);
        // SAFETY: test-local slots, each in one list at a time.
        unsafe {
            assert!(cache.push(all[0]) && cache.push(all[1]));
            let (gone, n) = cache.take_overflow();
            assert_eq!(chain(gone, n), [all[0]]);
            // One slot kept; the bound grows to eight and the list fills.
            cache.set_limit(8);
            for &b in &all[2..] {
                assert!(cache.push(b));
            }
            assert_eq!(cache.cached(), 7);
            assert!(cache.push(all[0]));
            // The older part (1) is under a quarter of 8: halves.
            let (gone, n) = cache.take_overflow();
            assert_eq!(n, 4);
            assert_eq!(chain(gone, n), [all[4], all[3], all[2], all[1]]);
            assert_eq!(cache.cached(), 4);
            cache.verify();
        }
    }

    // The default build's cache (`fifo.rs` tests the hardened one).
    #[cfg(not(feature = "secure"))]
    #[test]
    fn lifo_with_limit_and_counted() {
        let mut slots = [Slot([0; 2]); 4];
        let p = |s: &mut [Slot; 4], i: usize| s[i].0.as_mut_ptr() as *mut Block;
        let c = ClassState::new(3, GEOMETRY[0]);
        // SAFETY: test-local slots, each pushed once while not in the cache,
        // marked cached as a free does.
        unsafe {
            let push = |b: *mut Block| {
                Block::mark_cached(b);
                c.push(b)
            };
            assert!(c.pop().is_null());
            assert!(push(p(&mut slots, 0)));
            assert!(push(p(&mut slots, 1)));
            assert!(push(p(&mut slots, 2)));
            assert!(!push(p(&mut slots, 3)), "full at the limit");
            assert_eq!((c.cached(), c.frees(0)), (3, 3));
            c.verify();
            assert_eq!(c.pop(), p(&mut slots, 2));
            assert_eq!(
                NOT_SAMPLING - c.left(),
                1,
                "a slot handed out is an allocation"
            );
            assert!(push(p(&mut slots, 3)));
            c.verify();
            // Keep the most recent one (3); the older ones (1, then 0) go.
            let (list, n) = c.take_older(1);
            assert_eq!((list, n), (p(&mut slots, 1), 2));
            assert_eq!(Block::next(list), p(&mut slots, 0));
            assert!(Block::next(Block::next(list)).is_null());
            assert_eq!((c.cached(), c.frees(1)), (1, 2));
            assert!(c.take_older(1).0.is_null());
            assert_eq!(c.take_older(0), (p(&mut slots, 3), 1));
            assert_eq!((c.cached(), c.frees(1)), (0, 1));
        }
    }

    #[test]
    fn requested_bytes_are_estimated_from_the_sample() {
        let c = ClassState::new(4, GEOMETRY[0]);
        assert_eq!(c.requested_estimate(0), 0, "no sample, no estimate");
        // Two allocations served from pages (sampled: 10 and 30 bytes).
        c.count_alloc(10);
        c.count_alloc(30);
        assert_eq!(c.requested_estimate(2), 40);
        // Two more served from the cache (not sampled): the sample's mean,
        // 20 bytes, stands for them.
        assert_eq!(c.requested_estimate(4), 80);
        // Allocations from pages count the class's countdown down.
        assert_eq!(NOT_SAMPLING - c.left(), 2);
    }

    /// The sampler's countdown: each allocation from the cache counts it
    /// down, and at 1 (the sampled allocation is next) the cache declines,
    /// keeping its slots, until the countdown is armed again.
    // The default build's cache (`fifo.rs` tests the hardened one).
    #[cfg(not(feature = "secure"))]
    #[test]
    fn a_heap_that_does_not_sample_never_declines() {
        let mut slots = [Slot([0; 2]); 4];
        let c = ClassState::new(4, GEOMETRY[0]);
        // Many more pops than a small countdown would allow: a heap that
        // does not sample must never find a sample due.
        for _ in 0..64 {
            for s in slots.iter_mut() {
                let b = s.0.as_mut_ptr() as *mut Block;
                // SAFETY: test-local slot, pushed while not in the cache.
                unsafe {
                    Block::mark_cached(b);
                    assert!(c.push(b));
                }
            }
            for _ in 0..slots.len() {
                // SAFETY: the cache holds the four slots pushed above.
                assert!(!unsafe { c.pop() }.is_null());
            }
        }
        assert!(!c.sample_due());
        assert_eq!(NOT_SAMPLING - c.left(), 256, "the countdown counts pops");
    }

    /// The room and the countdown share a word: neither's updates reach
    /// the other, at the largest room and at both ends of the countdown.
    // The default build's cache (`fifo.rs` tests the hardened one).
    #[cfg(not(feature = "secure"))]
    #[test]
    fn the_room_and_the_countdown_stay_apart() {
        let most = *GROWN.iter().max().unwrap();
        let c = ClassState::new(most, GEOMETRY[0]);
        assert_eq!((c.cached(), c.left()), (0, NOT_SAMPLING));
        c.arm(1);
        assert_eq!((c.cached(), c.left()), (0, 1), "arming keeps the room");
        assert!(c.sample_due());
        c.arm(2);
        assert!(!c.sample_due(), "a full room is not a countdown");
        c.count_alloc(16);
        assert_eq!((c.cached(), c.left()), (0, 1), "counting keeps the room");
        c.arm(NOT_SAMPLING);
        c.set_limit(1);
        assert_eq!((c.limit(), c.left()), (1, NOT_SAMPLING));
        let mut slots = [Slot([0; 2]); 2];
        let a = slots[0].0.as_mut_ptr() as *mut Block;
        let b = slots[1].0.as_mut_ptr() as *mut Block;
        // SAFETY: test-local slots, each pushed while not in the cache.
        unsafe {
            Block::mark_cached(a);
            Block::mark_cached(b);
            assert!(c.push(a));
            assert!(!c.push(b), "no room left, whatever the countdown");
            assert_eq!((c.cached(), c.left()), (1, NOT_SAMPLING));
            c.arm(2);
            assert_eq!(c.pop(), a);
            assert_eq!((c.cached(), c.left()), (0, 1), "a pop counts both");
            assert!(c.sample_due());
            assert!(c.push(b));
            assert!(c.pop().is_null(), "a due sample declines");
            assert_eq!((c.cached(), c.left()), (1, 1), "a decline counts none");
        }
    }

    // The default build's cache (`fifo.rs` tests the hardened one).
    #[cfg(not(feature = "secure"))]
    #[test]
    fn a_due_sample_makes_the_cache_decline() {
        let mut slots = [Slot([0; 2]); 2];
        let a = slots[0].0.as_mut_ptr() as *mut Block;
        let b = slots[1].0.as_mut_ptr() as *mut Block;
        let c = ClassState::new(4, GEOMETRY[0]);
        assert_eq!(c.left(), NOT_SAMPLING);
        assert!(!c.sample_due());
        c.arm(2);
        assert_eq!(c.left(), 2);
        assert!(!c.sample_due());
        // SAFETY: test-local slots, each pushed once while not in the cache.
        unsafe {
            Block::mark_cached(a);
            Block::mark_cached(b);
            assert!(c.push(a) && c.push(b));
            assert_eq!(c.pop(), b);
            assert_eq!(c.left(), 1);
            assert!(c.sample_due());
            assert!(c.pop().is_null(), "the sample is due: the cache declines");
            assert_eq!(c.cached(), 1, "and keeps its slot");
            c.arm(3);
            assert!(!c.sample_due());
            assert_eq!(c.pop(), a);
            assert_eq!(c.left(), 2);
        }
    }
}
