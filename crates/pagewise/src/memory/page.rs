//! Page descriptors: one per 64 KiB slice, describing the span that starts
//! there (a slab page of one size class, a large object, or a free span).
//!
//! A slab page hands out slots from three sources, cheapest first: its free
//! list (owner's frees), the slots other threads freed (`thread_free`, an
//! atomic list collected in bulk), and fresh slots carved one OS page at a
//! time, so a page only becomes resident as far as it is used.
//!
//! The descriptors live in the segment header, not in the pages, so a page's
//! memory can be purged without losing track of it, and individual OS pages
//! of a slab page can be given back while others hold live slots
//! (`memory/hollow.rs`).

use crate::fault;
use crate::memory::layout::{os_page, segment_base};
use crate::memory::remote_word;
use crate::memory::segment::Segment;
use crate::memory::spans::Spans;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};

/// What a span is used for. Stored in the span's first descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Not part of any span in use (free, or interior of a span).
    Free = 0,
    /// Slots of one size class.
    Slab = 1,
    /// One large object.
    Large = 2,
    /// The segment header's own slice.
    Header = 3,
}

pub use crate::memory::block::Block;

/// The descriptor of a span.
#[repr(C)]
pub struct Page {
    /// Owner's free list (slab).
    pub free: *mut Block,
    /// Slots in use, including those freed remotely but not yet collected.
    /// Written only by the owner (plain load/store, no locked instruction);
    /// atomic so `stats()` may read it from another thread.
    pub used: AtomicU32,
    /// Slots carved so far. Written only by the owner (plain load and
    /// store); atomic so that a free on another thread may check that a
    /// slot was ever carved (see [`Page::carved`]).
    capacity: AtomicU32,
    /// Slots that fit in the page.
    pub reserved: u32,
    /// Slot size (slab) in bytes. For a sampled small object served as a
    /// large one (`HeapCore::alloc_span_sampled`): its class's slot, its
    /// usable size (the first bytes of the span, the only ones committed);
    /// 0 for any other large object.
    pub slot_size: u32,
    /// Address of the span's first byte.
    pub start: usize,
    /// What the span is (a `Kind`). Private: it changes only through
    /// [`Page::set_kind`], which asks for the span pool (so its lock), the
    /// lock under which free neighbours are merged. Atomic so that a free on
    /// another thread may read it without that lock.
    kind: AtomicU8,
    /// Size class (slab).
    pub class: u8,
    /// On the heap's full list.
    pub in_full: bool,
    /// The span is retained in the free-span pool with committed pages.
    pub in_dirty: bool,
    /// Slab: the page was found empty by the last maintenance pass.
    pub idle: bool,
    /// Slab: a mesh round made the page stop taking cached frees and may
    /// still mesh its OS pages: it takes them again only when the round
    /// ends ([`Page::end_mesh_round`]), whatever its count says meanwhile.
    /// Private, like `hollow_slots`, for the same word's sake.
    mesh_round: bool,
    /// Free span: its committed OS pages (kept so that freeing and
    /// splitting never recount the bitmap of a whole span).
    pub dirty_pages: u32,
    /// Slab: slots on purged OS pages, neither free nor in use
    /// (`memory/hollow.rs`). Private: written only by
    /// [`Page::set_hollow_slots`], which keeps the slab table's word on
    /// whether the thread caches may take the page's slots in step.
    hollow_slots: u32,
    /// Slab: OS pages purged while the page holds live slots.
    pub(crate) hollow_pages: u32,
    /// Slab: the slots in use when the page was last looked at for free
    /// OS pages; until fewer are, there is nothing new to find
    /// (`u32::MAX`: not looked at since it was last in use).
    pub(crate) hollow_seen_used: u32,
    /// Slab: OS pages of the page that are members of mesh groups
    /// (`memory/mesh.rs`).
    pub(crate) meshed_pages: u32,
    /// Slab: slots withheld for meshed OS pages (counted in
    /// `hollow_slots` too, but never carved again while withheld).
    pub(crate) withheld_slots: u32,
    /// Slab: its withheld slots, while it has meshed OS pages (else null).
    pub(crate) mesh: *mut crate::memory::mesh::Withheld,
    /// Slab: when a visit first found the page out of use (not any
    /// thread's current page) since it last was; 0: not seen so. The
    /// hollowing of its free OS pages waits a decay period from there.
    pub(crate) out_of_use_since: u64,
    /// Span length in slices (first descriptor; and last for free spans).
    pub slice_count: u32,
    /// Distance back to the span's first descriptor.
    pub slice_offset: u32,
    /// Owning heap (`HeapCore`), type-erased to keep this module independent.
    pub heap: *mut u8,
    /// Remote frees: list, count and full-page state (`remote_word.rs`).
    pub thread_free: AtomicUsize,
    /// Queue links (class queue or free-span bin).
    pub next: *mut Page,
    /// Queue links.
    pub prev: *mut Page,
    /// Retention FIFO links (free spans with committed pages).
    pub dirty_next: *mut Page,
    /// Retention FIFO links.
    pub dirty_prev: *mut Page,
    /// When the span was freed or the page became empty (decay timer).
    pub freed_at: u64,
    /// Usable bytes of a large object (from `start`).
    pub large_size: usize,
    /// Requested bytes of a large object.
    pub large_requested: usize,
    /// A large object's sample, if it was sampled (`crate::profile`).
    pub sample: crate::profile::Sample,
}

/// The slot a carve of `n` slots from `at` starts at, drawn from `at`.
fn carve_start(at: usize, n: usize) -> usize {
    let h = (at as u64 ^ (at as u64 >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 32) as usize % n
}

/// The slot the carve of `n` slots from `begin` starts at, in address
/// order from there (wrapping round once): the first; in the hardened
/// build one drawn from the secret and the address, so that where a page's
/// first block lies cannot be predicted.
#[cfg(not(feature = "secure"))]
#[inline(always)]
fn first_carved(_begin: usize, _n: usize) -> usize {
    0
}

/// See the default build's `first_carved`.
#[cfg(feature = "secure")]
#[inline(always)]
fn first_carved(begin: usize, n: usize) -> usize {
    if n > 1 {
        carve_start(begin ^ crate::secure::secret_now(), n)
    } else {
        0
    }
}

impl Page {
    /// An all-zero descriptor: a free, unused slice.
    pub const fn empty() -> Page {
        Page {
            free: null_mut(),
            used: AtomicU32::new(0),
            capacity: AtomicU32::new(0),
            reserved: 0,
            slot_size: 0,
            start: 0,
            kind: AtomicU8::new(Kind::Free as u8),
            class: 0,
            in_full: false,
            in_dirty: false,
            idle: false,
            mesh_round: false,
            dirty_pages: 0,
            hollow_slots: 0,
            hollow_pages: 0,
            hollow_seen_used: u32::MAX,
            meshed_pages: 0,
            withheld_slots: 0,
            mesh: null_mut(),
            out_of_use_since: 0,
            slice_count: 0,
            slice_offset: 0,
            heap: null_mut(),
            thread_free: AtomicUsize::new(0),
            next: null_mut(),
            prev: null_mut(),
            dirty_next: null_mut(),
            dirty_prev: null_mut(),
            freed_at: 0,
            large_size: 0,
            large_requested: 0,
            sample: crate::profile::Sample::NONE,
        }
    }

    /// What the span is. Any thread may ask; for a span another thread may
    /// be changing, the answer is only as good as the caller's lock.
    #[inline]
    pub fn kind(&self) -> Kind {
        match self.kind.load(Ordering::Relaxed) {
            0 => Kind::Free,
            1 => Kind::Slab,
            2 => Kind::Large,
            _ => Kind::Header,
        }
    }

    /// Changes what the span is. The span pool in hand (`&mut Spans`, which
    /// outside the pool's own module and unit tests only its lock guard
    /// gives: `Spans::locked`) is the proof that no other thread is
    /// merging free spans meanwhile: a span must never be seen free while it
    /// is not in the pool, nor in use while it is.
    #[inline]
    pub fn set_kind(&self, kind: Kind, _pool: &mut Spans) {
        crate::sync::perturb::point();
        self.kind.store(kind as u8, Ordering::Relaxed);
    }

    /// Marks a descriptor of a fresh segment's header slices.
    ///
    /// # Safety
    /// The segment is not yet published: no other thread can see it.
    pub unsafe fn init_header(&mut self, slices: u32, offset: u32, start: usize) {
        *self.kind.get_mut() = Kind::Header as u8;
        self.slice_count = slices;
        self.slice_offset = offset;
        self.start = start;
    }

    /// Makes this span a slab page for `class` with `slot` bytes per slot.
    pub fn init_slab(&mut self, class: usize, slot: usize, bytes: usize, heap: *mut u8) {
        debug_assert_eq!(self.kind(), Kind::Slab, "taken as a slab span");
        self.class = class as u8;
        self.slot_size = slot as u32;
        self.reserved = (bytes / slot) as u32;
        self.capacity.store(0, Ordering::Relaxed);
        self.used.store(0, Ordering::Relaxed);
        self.idle = false;
        self.free = null_mut();
        // The slab table is written by `mark_slab` once the page is made.
        self.hollow_slots = 0;
        self.hollow_pages = 0;
        self.hollow_seen_used = u32::MAX;
        debug_assert!(
            self.mesh.is_null() && self.meshed_pages == 0,
            "left its groups"
        );
        self.out_of_use_since = 0;
        self.in_full = false;
        self.heap = heap;
        self.thread_free.store(0, Ordering::Relaxed);
    }

    /// The slot index of `addr` if it is the start of a slot of this page.
    /// Reads only fields fixed for the slab's life, so any thread may ask.
    /// (The free fast path checks with the class's `Geometry` instead; this
    /// serves the uncached path, where a division costs nothing that shows.)
    pub fn slot_index(&self, addr: usize) -> Option<usize> {
        let off = addr.wrapping_sub(self.start);
        let slot = self.slot_size as usize;
        let idx = off / slot;
        (idx < self.reserved as usize && off % slot == 0).then_some(idx)
    }

    /// Carves fresh slots up to the end of the next OS page (at least one
    /// slot) onto the free list. Returns the OS pages newly touched as
    /// `(first_page_addr, count)` so the caller can mark them committed.
    ///
    /// The slots are linked in address order, or with `shuffle` (a meshing
    /// heap, `memory/mesh.rs`) in address order from a slot drawn from the
    /// slots' address, wrapping round once: survivors of a regular pattern
    /// (the first object of each OS page, a run of objects allocated
    /// together) then sit at different offsets from page to page, which is
    /// what lets pages mesh, while objects allocated one after another stay
    /// neighbours, sharing cache lines as without meshing. No state, no
    /// table.
    pub fn extend(&mut self, shuffle: bool) -> (usize, usize) {
        let capacity = self.capacity();
        debug_assert!(self.free.is_null() && capacity < self.reserved);
        let slot = self.slot_size as usize;
        let begin = self.start + capacity as usize * slot;
        let page = os_page();
        let limit = crate::memory::layout::align_up(begin + 1, page);
        let mut n = ((limit - begin) / slot).max(1);
        n = n.min((self.reserved - capacity) as usize);
        let end = begin + n * slot;
        let first = if shuffle && n > 1 {
            carve_start(begin, n)
        } else {
            first_carved(begin, n)
        };
        // Link the new slots, each holding the page key (so that freeing
        // one that was never handed out is caught too).
        let mut k = first;
        self.free = (begin + k * slot) as *mut Block;
        for i in 0..n {
            let p = begin + k * slot;
            // Wraps round once, to the first slot.
            k += 1;
            if k == n {
                k = 0;
            }
            let next = if i + 1 < n { begin + k * slot } else { 0 };
            // SAFETY: `p` is a slot (of at least two words) inside this
            // page's span, which the heap owns and nothing else references yet.
            unsafe {
                Block::set_next(p as *mut Block, next as *mut Block);
                Block::mark_carved(p as *mut Block, slot);
            }
        }
        self.capacity.store(capacity + n as u32, Ordering::Relaxed);
        let first_page = begin & !(page - 1);
        let last_page = (end - 1) & !(page - 1);
        (first_page, (last_page - first_page) / page + 1)
    }

    /// Slots carved so far (any thread: it only grows while the page lives).
    #[inline]
    pub fn capacity(&self) -> u32 {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Whether slot `index` was ever carved, so could have been handed out.
    /// A free of one that was not is of a stale pointer into memory this
    /// page has not used yet (a block of an earlier page on the same span).
    #[inline]
    pub fn carved(&self, index: usize) -> bool {
        index < self.capacity() as usize
    }

    /// Slots in use (owner's view).
    #[inline]
    pub fn used(&self) -> u32 {
        self.used.load(Ordering::Relaxed)
    }

    /// Sets the slots in use (owner only: a plain store).
    #[inline]
    pub fn set_used(&self, n: u32) {
        self.used.store(n, Ordering::Relaxed);
    }

    /// Slots on purged OS pages of this page, and slots withheld for its
    /// meshed OS pages (`memory/mesh.rs`): neither free nor in use.
    #[inline]
    pub fn hollow_slots(&self) -> u32 {
        self.hollow_slots
    }

    /// Sets how many slots of this slab page are hollow or withheld
    /// (neither free nor in use), and with it whether frees of its slots
    /// may go into a thread cache: only while there are none, since a free
    /// into a cache stores into the slot without a check, and a hollow
    /// slot freed twice would then be both cached and carved again
    /// ([`Segment::set_cacheable`]). Every change of the count goes
    /// through here.
    pub fn set_hollow_slots(&mut self, n: u32) {
        self.hollow_slots = n;
        self.set_cacheable(n == 0 && !self.mesh_round);
    }

    /// A mesh round is to mesh OS pages of this page: frees of its slots
    /// stop going into thread caches until [`Page::end_mesh_round`], even
    /// if its count comes back to zero meanwhile (its candidates in one
    /// chunk of the round failed and gave their slots back): the round's
    /// later chunks may still mesh it, with no new handshake with the
    /// threads (`memory/cache_handshake.rs`).
    pub(crate) fn begin_mesh_round(&mut self) {
        self.mesh_round = true;
        self.set_cacheable(false);
    }

    /// The round that began with [`Page::begin_mesh_round`] is over: the
    /// page takes cached frees again if its count allows.
    pub(crate) fn end_mesh_round(&mut self) {
        self.mesh_round = false;
        self.set_hollow_slots(self.hollow_slots);
    }

    /// Writes the slab table's word on whether thread caches may take this
    /// slab page's slots (see [`Page::set_hollow_slots`]; `false` alone
    /// before slots may become hollow, as a purge begins).
    pub(crate) fn set_cacheable(&self, cacheable: bool) {
        // SAFETY: a slab page lies in a registered, mapped segment.
        let seg = unsafe { &*Segment::of(segment_base(self.start)) };
        let first = seg.slice_index(self.start);
        seg.set_cacheable(
            first,
            self.slice_count as usize,
            self.class as usize,
            cacheable,
        );
    }

    /// Whether the page can hand out a slot without more work.
    #[inline]
    pub fn has_free(&self) -> bool {
        !self.free.is_null()
    }

    /// Moves remotely freed slots onto the free list. Returns how many.
    pub fn collect_thread_free(&mut self) -> usize {
        let Some(list) = remote_word::take(&self.thread_free) else {
            return 0;
        };
        let segment = crate::memory::layout::segment_base(self.start);
        let head = (segment + list.first) as *mut Block;
        let n = list.count;
        if self.hollow_slots > 0 {
            // A slot on a purged OS page was free when it was purged: one
            // freed again is a double free (walking the list costs only
            // while the page has hollow slots).
            let mut b = head;
            for _ in 0..n {
                if self.is_hollow_slot(b as usize) {
                    crate::fault::misuse(crate::fault::Misuse::DoubleFree, b as usize);
                }
                // SAFETY: the list holds `n` slots of this page (`take`
                // made us its only owner).
                b = unsafe { Block::next(b) };
            }
        }
        if !self.free.is_null() {
            // Rare (the owner collects when its list runs dry): append the
            // free list after the collected slots.
            let mut tail = head;
            // SAFETY: the list was built by `push_remote_chain` from `n`
            // slots of this page; `take` made us its only owner.
            unsafe {
                for _ in 1..n {
                    tail = Block::next(tail);
                }
                Block::set_next(tail, self.free);
            }
        }
        self.free = head;
        if n as u32 > self.used() {
            // Only a double free the key did not catch can do this: stop
            // before the count wraps and the page is released under live
            // slots.
            crate::fault::misuse(crate::fault::Misuse::DoubleFree, head as usize);
        }
        self.set_used(self.used() - n as u32);
        n
    }

    /// How many slots other threads freed and the owner has not collected
    /// (a snapshot).
    pub fn pending_remote(&self) -> usize {
        remote_word::pending_count(&self.thread_free)
    }

    /// Checks a page that is about to be released because no slot is in
    /// use: every carved slot that is not hollow (`memory/hollow.rs`) must
    /// be free, holding the page key. A slot freed twice whose copies both
    /// reached the page (the second through a thread cache, which does not
    /// check) makes the page count one slot too few in use, so it looks
    /// empty while a live object is still in it, whose slot has no page key:
    /// releasing the page would hand that object's memory to another
    /// allocation. Aborts instead. Clears the keys (the slots are going back
    /// to the span pool).
    ///
    /// The slots are read in address order, not along the free list: the
    /// same cache lines, but a stream the hardware prefetches rather than a
    /// chain of dependent misses (this walk was a sixth of pagewise's time
    /// in python3 with `PYTHONMALLOC=malloc`).
    ///
    /// # Safety
    /// Owner only; a slab page with no slot in use, about to be released.
    pub unsafe fn verify_empty(&self) {
        let slot = self.slot_size as usize;
        for i in 0..self.capacity() as usize {
            let b = (self.start + i * slot) as *mut Block;
            if self.is_hollow_slot(b as usize) {
                continue;
            }
            // SAFETY: a carved slot of this page that is not on a purged OS
            // page, so resident and mapped; owner only (caller).
            unsafe {
                if !Block::is_in_page(b) {
                    fault::misuse(fault::Misuse::DoubleFree, b as usize);
                }
                Block::mark_live(b);
            }
        }
    }

    /// Whether other threads freed slots not yet collected.
    #[inline]
    pub fn has_remote(&self) -> bool {
        remote_word::pending(&self.thread_free)
    }

    /// Tries to mark a page whose slots are exhausted as full. Fails if
    /// remote frees arrived meanwhile, collecting them: `Err(count)`.
    pub fn try_mark_full(&mut self) -> Result<(), usize> {
        if !remote_word::try_mark_full(&self.thread_free) {
            return Err(self.collect_thread_free());
        }
        self.in_full = true;
        Ok(())
    }

    /// Clears the full mark: remote frees go to the page again.
    pub fn clear_full(&mut self) {
        self.in_full = false;
        remote_word::clear_full(&self.thread_free);
    }

    /// Pushes a slot freed by a thread other than the owner. Returns false
    /// (without pushing) when this free is the first since the page was
    /// marked full: the caller must then put the slot on the heap's delayed
    /// list, which tells the owner the page has room again.
    ///
    /// # Safety
    /// `block` is a live slot of this page, no longer used by the caller.
    pub unsafe fn push_remote(&self, block: *mut Block) -> bool {
        // SAFETY: forwarded: a chain of one.
        unsafe { self.push_remote_chain(block, block, 1) }
    }

    /// Pushes a chain of `count` slots freed by a thread other than the
    /// owner, linked from `first` to `last`, with one CAS. Returns false
    /// (without pushing) as [`Page::push_remote`] does.
    ///
    /// Reads no field of the descriptor but `thread_free`: the owner
    /// rewrites the others on every allocation, so a read would be a cache
    /// miss for the freeing thread.
    ///
    /// # Safety
    /// The chain holds `count` live slots of this page, no longer used by
    /// the caller, linked through their first word from `first` to `last`.
    pub unsafe fn push_remote_chain(
        &self,
        first: *mut Block,
        last: *mut Block,
        count: usize,
    ) -> bool {
        let segment = crate::memory::layout::segment_base(first as usize);
        remote_word::push(&self.thread_free, first as usize - segment, count, |old| {
            let head = old.map_or(null_mut(), |l| (segment + l.first) as *mut Block);
            // SAFETY: the caller gives us the chain; `last` is its end.
            unsafe { Block::set_next(last, head) };
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::layout::MAX_OS_PAGE;

    /// Test memory aligned like a slab page: OS-page counts are exact, and
    /// it never straddles a segment boundary (remote lists store offsets
    /// from the segment).
    #[repr(C, align(65536))]
    struct Buf([u64; 2 * MAX_OS_PAGE / 8]);

    fn buf() -> Box<Buf> {
        Box::new(Buf([0; 2 * MAX_OS_PAGE / 8]))
    }

    #[test]
    fn a_page_refills_only_hollow_slots_that_are_not_withheld() {
        let mut p = Page::empty();
        assert!(!p.can_refill_hollow(), "no hollow slot");
        p.hollow_slots = 3;
        assert!(p.can_refill_hollow());
        p.withheld_slots = 3;
        assert!(!p.can_refill_hollow(), "every one withheld for meshing");
        p.withheld_slots = 2;
        assert!(p.can_refill_hollow(), "one not withheld");
    }

    /// Takes `N` slots off the free list by hand, as allocations would.
    ///
    /// # Safety
    /// `p` has at least `N` slots on its free list.
    unsafe fn take<const N: usize>(p: &mut Page) -> [*mut Block; N] {
        let mut taken = [null_mut(); N];
        for t in taken.iter_mut() {
            // SAFETY: per the caller.
            unsafe {
                *t = p.free;
                p.free = Block::next(p.free);
            }
            p.set_used(p.used() + 1);
        }
        taken
    }

    fn page_over(buf: &mut [u64], slot: usize) -> Page {
        let mut p = Page::empty();
        p.set_kind(Kind::Slab, &mut Spans::unlocked_for_tests());
        p.start = buf.as_mut_ptr() as usize;
        p.init_slab(3, slot, buf.len() * 8, null_mut());
        p
    }

    #[test]
    fn extends_one_os_page_at_a_time() {
        let mut buf = buf();
        let mut p = page_over(&mut buf.0, 48);
        let (first, pages) = p.extend(false);
        assert_eq!(first, p.start);
        assert_eq!(pages, 1);
        assert_eq!(p.capacity() as usize, os_page() / 48);
        assert!(p.slot_index(p.start + 48).is_some());
        assert!(p.slot_index(p.start + 47).is_none());
        assert!(p.slot_index(p.start + 48 * p.reserved as usize).is_none());
        assert!(p.slot_index(p.start - 48).is_none());
    }

    /// The free list's slot indices, first to last.
    fn free_order(p: &Page) -> Vec<usize> {
        let mut out = Vec::new();
        let mut b = p.free;
        while !b.is_null() {
            out.push(p.slot_index(b as usize).unwrap());
            // SAFETY: the page's free list, slots of the test's buffer.
            b = unsafe { Block::next(b) };
        }
        out
    }

    #[test]
    fn shuffled_carving_hands_out_every_slot_once_in_an_order_of_its_own() {
        // The start is drawn from the carve's address, and one address in
        // as many as the page has slots draws address order itself (start
        // 0) or the start of the next OS page: so each slot size is carved
        // at eight addresses (buffers kept alive, so they differ), every
        // carve a permutation, and some carve must be shuffled and some
        // next OS page's carve differ from its first.
        for slot in [16, 48, 64, 112, 256] {
            let mut bufs = Vec::new();
            let (mut shuffled, mut differs) = (false, false);
            for _ in 0..8 {
                let mut buf = buf();
                let mut p = page_over(&mut buf.0, slot);
                p.extend(true);
                let order = free_order(&p);
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..p.capacity() as usize).collect::<Vec<_>>());
                shuffled |= order != sorted;
                p.free = null_mut();
                p.extend(true);
                let next: Vec<usize> = free_order(&p).iter().map(|i| i - order.len()).collect();
                let mut next_sorted = next.clone();
                next_sorted.sort_unstable();
                assert_eq!(next_sorted, (0..next.len()).collect::<Vec<_>>());
                differs |= next != order;
                bufs.push(buf);
            }
            assert!(shuffled, "slot {slot}: never shuffled");
            assert!(differs, "slot {slot}: the same order on every next OS page");
        }
        let mut buf = buf();
        let mut p = page_over(&mut buf.0, 64);
        p.extend(false);
        // (The hardened build starts at a slot drawn from the secret, and
        // wraps around to the first once.)
        assert!(
            free_order(&p)
                .windows(2)
                .all(|w| w[0] + 1 == w[1] || (cfg!(feature = "secure") && w[1] == 0)),
            "address order"
        );
    }

    #[test]
    fn carve_starts_differ_from_page_to_page() {
        // 64 consecutive OS pages at a fixed address (so the outcome does
        // not hang on where the allocator put a buffer): their starts take
        // at least half as many values as there are pages or slots.
        let base = 0x7f12_3456_7000usize;
        for n in [256, 64, 16] {
            let starts: std::collections::BTreeSet<usize> =
                (0..64).map(|i| carve_start(base + i * 4096, n)).collect();
            assert!(starts.iter().all(|&s| s < n));
            assert!(starts.len() >= n.min(64) / 2, "{n} slots: {starts:?}");
        }
    }

    #[test]
    fn shuffled_carving_keeps_neighbours_together() {
        // A meshing heap's carve differs from page to page only in where
        // it starts: from there it goes in address order, wrapping round
        // once, so what a program allocates together shares cache lines as
        // without meshing (a stride through the slots scattered it).
        for slot in [16, 48, 64, 112, 256] {
            let mut buf = buf();
            let mut p = page_over(&mut buf.0, slot);
            p.extend(true);
            let order = free_order(&p);
            let n = order.len();
            let jumps = order.windows(2).filter(|w| w[1] != (w[0] + 1) % n).count();
            assert_eq!(jumps, 0, "slot {slot}: {order:?}");
        }
    }

    #[test]
    fn a_chain_of_remote_frees_is_one_push() {
        let mut buf = buf();
        let mut p = page_over(&mut buf.0[..64], 64);
        p.extend(false);
        // SAFETY: test-local page; three slots taken by hand (still linked
        // a -> b -> c, as the free list had them), chained, pushed back once.
        unsafe {
            let [a, b, c] = take::<3>(&mut p);
            assert_eq!((Block::next(a), Block::next(b)), (b, c));
            Block::set_next(c, null_mut());
            assert!(p.push_remote_chain(a, c, 3));
            assert_eq!(p.collect_thread_free(), 3);
            assert_eq!(p.used(), 0);
            assert_eq!(p.free, a);
        }
    }

    #[test]
    fn remote_frees_are_collected_and_full_pages_delay() {
        let mut buf = buf();
        let mut p = page_over(&mut buf.0[..64], 64);
        p.extend(false);
        // SAFETY: test-local page; slots are taken off the free list by hand.
        unsafe {
            let [a, b, c] = take::<3>(&mut p);
            assert!(p.push_remote(a));
            assert_eq!(p.collect_thread_free(), 1);
            assert_eq!(p.used(), 2);
            p.free = null_mut();
            assert_eq!(p.try_mark_full(), Ok(()));
            assert!(
                !p.push_remote(b),
                "the first remote free of a full page notifies the owner"
            );
            assert!(p.push_remote(c), "later ones go onto the page's list");
            assert!(p.has_remote());
            assert_eq!(p.collect_thread_free(), 1);
            p.clear_full();
            assert!(p.push_remote(b));
            assert_eq!(
                p.try_mark_full(),
                Err(1),
                "pending remote frees keep it non-full"
            );
            assert_eq!(p.used(), 0);
        }
    }
}
