//! Frees: the fast path into the freeing thread's cache, the path past the
//! cache (into the slot's page, or a large or huge object), and the checks
//! that turn bad input into a clear abort ([`crate::fault`]).
//!
//! Invariants: a free never trusts a header before the registry says the
//! address is pagewise's; only descriptor fields fixed while a span is in
//! use are read for a page owned by another thread.

use super::remote::free_remote;
use super::thread_bytes::note_freed_by;
use super::*;
use crate::memory::cache_handshake;
use crate::memory::layout::{opaque, SEGMENT, SEGMENT_SHIFT};
use crate::memory::segment::STATE_SHIFT;

impl HeapCore {
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
            && unsafe { HeapCore::cache_free_at(current, opaque(addr >> SEGMENT_SHIFT), addr) }
    }

    /// [`HeapCore::free_to_cache`] for a `current` that is never null: the
    /// calling thread's heap, or [`empty_heap`] for a thread with none
    /// (whose states take no slot), so that the C library's `free` tests
    /// for no missing heap.
    ///
    /// # Safety
    /// As `free_any`, `current` being the calling thread's heap or
    /// [`empty_heap`]; on true, the free is done.
    #[inline]
    #[cfg_attr(feature = "secure", allow(dead_code))]
    pub(crate) unsafe fn free_to_cache_or_empty(ptr: *mut u8, current: *const HeapCore) -> bool {
        let addr = ptr as usize;
        // One comparison for null, an address past the registry's map and
        // the map's index, which is the segment's number too: the segment
        // of `addr - 1` (`registry::index_below`), `addr`'s own but at a
        // segment's first byte, whose lookup below finds no slot.
        let i = registry::index_below(addr);
        // SAFETY: as in `free_to_cache`, the entry in range (just tested);
        // `empty_heap`'s states pass no address, so only a real heap's
        // cache takes the slot.
        registry::index_in_range(i)
            && unsafe { registry::shared_at(i) && HeapCore::cache_free_at(current, i, addr) }
    }

    /// Puts `addr` in this heap's cache if it starts a slot of a live slab
    /// page (false if not: the caller takes the uncached path).
    ///
    /// # Safety
    /// Owner only, not inside another heap operation; `addr` lies in a
    /// registered segment and is a live allocation the cache may take (a
    /// slot of this heap, or of any thread heap if this is one).
    #[inline]
    pub(super) unsafe fn cache_free(&self, addr: usize) -> bool {
        // SAFETY: forwarded.
        unsafe { HeapCore::cache_free_at(self, opaque(addr >> SEGMENT_SHIFT), addr) }
    }

    /// [`HeapCore::cache_free`] into the cache of `heap`, which may be
    /// [`empty_heap`] (then false: its states take no slot). `number` is
    /// the registry's index of `addr`'s segment, hidden from the optimizer
    /// (`opaque`), or of the segment below if `addr` is a segment's first
    /// byte (`registry::index_below`): no slot starts there, and the first
    /// slice of the segment below, its header's, is no slab page (false).
    ///
    /// # Safety
    /// As `cache_free`, `heap` being the calling thread's heap or
    /// [`empty_heap`], and `addr` in the segment `number` or at the byte
    /// after it, whose segment number `number` is registered.
    #[inline(always)]
    unsafe fn cache_free_at(heap: *const HeapCore, number: usize, addr: usize) -> bool {
        // The segment's base is its number in the registry's map shifted
        // back: the free fast path has that number in a register from the
        // lookup, and one shift of it is one instruction where masking the
        // address takes two (the caller hides the number from the
        // optimizer, which would make it the mask again).
        let base = number << SEGMENT_SHIFT;
        // SAFETY: registered segments are mapped and headed by a `Segment`.
        let seg = unsafe { &*Segment::of(base) };
        // `addr`'s offset in its segment: 0 (the header's slice) for an
        // address after the segment `number`.
        let offset = addr & (SEGMENT - 1);
        debug_assert!(addr.wrapping_sub(base) <= SEGMENT);
        let states = (heap as *const u8).wrapping_add(STATES_OFFSET);
        // The slot is announced before the page's word is read: a mesh pass
        // that stops the page's cached frees either sees it or is seen
        // (`memory/cache_handshake.rs`), so no store below lands in a slot
        // whose OS page shows another page's objects.
        // SAFETY: state 0 starts the states of a heap or of `empty_heap`
        // (as below); its announcement word is atomic.
        unsafe { (*(states as *const ClassState)).announce(addr) };
        cache_handshake::before_reading_the_word();
        let word = seg.slab_word_at(offset);
        let (state_at, in_page) = Segment::split_slab_word_at(word, offset);
        // SAFETY: slab-table entries are 0 or `(class + 1) << STATE_SHIFT`
        // (`mark_slab`), the byte offset of a state in the heap's states
        // (CLASSES + 1 states of `1 << STATE_SHIFT` bytes, `STATES_OFFSET`
        // bytes into the heap, `empty_heap`'s too). Entry 0 (no slab page,
        // the header's slices included) finds the state whose geometry no
        // offset passes, and so does every entry in `empty_heap`.
        let state = unsafe { &*(states.add(state_at) as *const ClassState) };
        if !state.starts_slot(in_page) {
            return false; // not a slot start: the uncached path says so
        }
        // SAFETY: per the caller; `addr` starts a slot of `state`'s class in
        // the live slab page `word` (read after the announcement) names.
        unsafe { HeapCore::cache_push(heap, addr, state_at, state) }
    }

    /// The end of a cached free, once the page's word `word` (read after
    /// `addr` was announced) said that `addr` starts a slot of the class
    /// of `state`, at `state_at` in `heap`'s states: the cache key and the
    /// push (or the overflow).
    ///
    /// # Safety
    /// As `cache_free_at`; `addr` starts a slot of `state`'s class in a
    /// live slab page of `seg` whose slab word read `word`, after `addr`
    /// was announced in `heap`'s states.
    #[inline(always)]
    pub(crate) unsafe fn cache_push(
        heap: *const HeapCore,
        addr: usize,
        state_at: usize,
        state: &ClassState,
    ) -> bool {
        let block = addr as *mut Block;
        crate::sync::perturb::window();
        // SAFETY: owner only (caller); `addr` starts a slot (of two words at
        // least) of the class `entry - 1` (slab table) in a live slab page.
        // The key is stored blind: loading it would wait for a line another
        // core may have written last; a slot freed twice is caught when it
        // leaves the cache (`ClassState::pop`, `flush_cache`). A page that
        // stopped taking cached frees since the word was read (it is being
        // hollowed or meshed) reads the announcement after its barrier: it
        // keeps this slot's OS pages if the slot is free on it, and if this
        // thread has announced another slot since, its check sees this key
        // (`memory/cache_handshake.rs`).
        unsafe {
            Block::mark_cached(block);
            if !state.push(block) {
                // A real heap: `empty_heap`'s states took no slot above.
                HeapCore::cache_full(block, (state_at >> STATE_SHIFT) - 1, &*heap);
            }
        }
        true
    }

    /// [`HeapCore::free_to_cache`] of a slot already found in the slab
    /// table, as the word `seen` (`Segment::slab_word`, a cacheable slab
    /// page's): by a `realloc` that moved it ([`HeapCore::cached_slot`]). The slot's segment and its start are
    /// known, and while the slot is live its page cannot go, so only what
    /// can change meanwhile is read again, the page's word. A page that
    /// stopped taking cached frees (hollowed, meshed) reads another word:
    /// false, and the caller frees the slot past the cache.
    ///
    /// # Safety
    /// `current` is the calling thread's heap; `ptr` is a live slot of a
    /// thread heap's slab page whose word read `seen` while the slot was
    /// live (or freed and in use by nobody since), freed now.
    #[inline(always)]
    #[cfg_attr(feature = "secure", allow(dead_code))]
    pub(crate) unsafe fn free_seen_to_cache(
        ptr: *mut u8,
        current: *const HeapCore,
        seen: usize,
    ) -> bool {
        let addr = ptr as usize;
        // SAFETY: the segment of a live slot is registered, so mapped and
        // headed by a `Segment`.
        let seg = unsafe { &*Segment::of(crate::memory::layout::segment_base(addr)) };
        let states = (current as *const u8).wrapping_add(STATES_OFFSET);
        // SAFETY: as in `cache_free_at`: announced before the word is read.
        unsafe { (*(states as *const ClassState)).announce(addr) };
        cache_handshake::before_reading_the_word();
        let word = seg.slab_word(addr);
        if word != seen {
            return false; // no longer cacheable: past the cache
        }
        let (state_at, _) = seg.split_slab_word(word, addr);
        // SAFETY: `seen` was a cacheable slab word of `addr`'s slot (caller),
        // whose state is one of `current`'s (as in `cache_free_at`); the
        // page, live while its slot is, still names the same class and
        // start, of which `addr` is a slot.
        unsafe {
            let state = &*(states.add(state_at) as *const ClassState);
            HeapCore::cache_push(current, addr, state_at, state)
        }
    }

    /// The slot size of the block at `addr` if it is a slot the thread
    /// cache takes (a slot of a live slab page of a global-allocator thread
    /// heap whose frees may be cached), read as the free fast path reads
    /// it: the segment's slab table, on a line the program's frees keep
    /// warm, not the page's descriptor; with the page's word read, which
    /// a free of the slot hands [`HeapCore::free_seen_to_cache`]. A size
    /// of 0 otherwise (then ask [`HeapCore::usable_size`]).
    ///
    /// `heap` may be [`empty_heap`], whose states pass no slot: a size of
    /// 0, so that a size found says `heap` is a real heap, with no test for
    /// the empty one.
    ///
    /// # Safety
    /// `heap` is the calling thread's own heap or [`empty_heap`]; `addr`
    /// is a live allocation of some pagewise heap.
    #[inline]
    #[cfg_attr(feature = "secure", allow(dead_code))]
    pub(crate) unsafe fn cached_slot(heap: *const HeapCore, addr: usize) -> (usize, usize) {
        if !registry::in_shared_segment(addr) {
            return (0, 0);
        }
        // SAFETY: registered segments are mapped and headed by a `Segment`.
        let seg = unsafe { &*Segment::of(crate::memory::layout::segment_base(addr)) };
        let word = seg.slab_word(addr);
        let (state_at, offset) = seg.split_slab_word(word, addr);
        // SAFETY: as in `cache_free_at`: the states of a heap or of
        // `empty_heap`; entry 0 finds the state whose geometry no offset
        // passes, and so does every entry in `empty_heap`.
        let state = unsafe {
            &*((heap as *const u8)
                .wrapping_add(STATES_OFFSET)
                .add(state_at) as *const ClassState)
        };
        if !state.starts_slot(offset) {
            return (0, 0);
        }
        // SAFETY: an entry whose state passed the offset is not 0 (above):
        // `(class + 1) << STATE_SHIFT` of a class below CLASSES.
        let slot = unsafe { *SLOT_SIZE.get_unchecked((state_at >> STATE_SHIFT) - 1) };
        (slot as usize, word)
    }

    /// A free found its class's cache full: pass the older half on (to the
    /// transfer cache for a global heap, home to their pages for an owned
    /// one), then cache the slot. So a thread that frees many slots does the page work
    /// in batches, and its next frees stay on the fast path; and since this
    /// is the slow path of a thread that may only ever free, it is also
    /// where such a thread runs its maintenance.
    ///
    /// The slot comes first and the heap last: the fast path, which tail
    /// calls this, then keeps the slot in the register its caller passed it
    /// in, and copies nothing on the way in (a `self` first made `free`
    /// copy the pointer away to free its first register for the heap).
    ///
    /// # Safety
    /// As `cache_free`; the cache of `class` is full.
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn cache_full(block: *mut Block, class: usize, heap: &HeapCore) {
        let state = heap.class(class);
        // SAFETY: owner only (caller), between operations; the page lists
        // are held for the flush and the maintenance.
        unsafe {
            let keep = state.cached() / 2;
            // A cache of one slot passes it all on. If that slot is the
            // one being freed, this is its second free: passed on and
            // cached again, it would be in two lists at once, each a
            // valid free slot, and a program that ends before using both
            // would never be told.
            if keep == 0 && state.newest() == block {
                misuse(Misuse::DoubleFree, block as usize);
            }
            let mut l = heap.lock_local();
            // The older part whole, as a rule: no link followed.
            let (head, count) = heap.take_overflow(class);
            if heap.global {
                heap.pass_on(&mut l, class, head, count, true);
            } else {
                super::remote::send_home(Some((heap, &mut l)), head, count);
            }
            heap.maintenance(&mut l);
            drop(l);
            let cached = state.push(block);
            debug_assert!(cached, "room was just made");
        }
        // The flush may have emptied pages into the span pool: the purger
        // must be there to give them back if the thread now goes quiet.
        if heap.global {
            crate::global::purger::after_free();
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
            let n = free_outside_segments(addr);
            // SAFETY: `current` is the calling thread's heap or null.
            unsafe { note_freed_by(current, n) };
            return false;
        };
        // SAFETY: registered segments are mapped and headed by a `Segment`.
        let seg = unsafe { &*Segment::of(base) };
        let owner = seg.heap as *const HeapCore;
        // SAFETY: the heap of a segment outlives its segments; `global` is
        // fixed at its creation.
        if owner != current && !unsafe { (*owner).global } {
            // An owned `Heap`'s block freed through the global allocator
            // (or another heap): slab, large and huge alike.
            misuse(Misuse::WrongHeap, addr);
        }
        if huge {
            // SAFETY: as above; `current` is the calling thread's heap or
            // null.
            unsafe { note_freed_by(current, (*owner).free_huge(seg, addr)) };
            return true;
        }
        let page = lookup_page(seg, addr);
        // SAFETY: `lookup_page` returns a descriptor of this segment. Only
        // fields fixed while the span is in use are read here (the page may
        // belong to another thread, which mutates its other fields).
        let (kind, heap, start, slot) = unsafe {
            (
                (*page).kind(),
                (*page).heap as *const HeapCore,
                (*page).start,
                (*page).slot_size as usize,
            )
        };
        match kind {
            Kind::Slab => {
                // SAFETY: as above; slot geometry is fixed for a slab's life.
                let Some(index) = (unsafe { (*page).slot_index(addr) }) else {
                    misuse(Misuse::Misaligned, addr);
                };
                // SAFETY: as above (the carved count only grows).
                if !unsafe { (*page).carved(index) } {
                    // Never handed out by this page: a stale pointer freed
                    // again after its page was released and remade.
                    misuse(Misuse::DoubleFree, addr);
                }
                let block = addr as *mut Block;
                // SAFETY: `current` is the calling thread's heap or null.
                unsafe { note_freed_by(current, slot) };
                if heap == current {
                    // SAFETY: the calling thread owns `current`, and holds
                    // its page lists for the call, so the page's hollow
                    // state is stable. A hollow slot is checked before its
                    // key is written: its OS page was purged (or, withheld,
                    // shows another page's bytes). A slot that is free
                    // holds the cache key or the page key.
                    unsafe {
                        let h = &*heap;
                        let mut l = h.lock_local();
                        if (*page).is_hollow_slot(addr) || !Block::mark_free(block) {
                            misuse(Misuse::DoubleFree, addr);
                        }
                        h.free_local(&mut l, page, block)
                    }
                } else {
                    // SAFETY: `addr` starts a slot of a live slab page of
                    // a thread heap, which outlives its pages. A hollow
                    // slot is caught by its owner when it collects the
                    // page's remote frees (`Page::collect_thread_free`);
                    // a withheld one before anything is written into it.
                    unsafe {
                        check_withheld(seg, page, heap, index, addr);
                        if !Block::mark_free(block) {
                            misuse(Misuse::DoubleFree, addr);
                        }
                        free_remote(page, block)
                    };
                    false
                }
            }
            Kind::Large => {
                if addr != start {
                    misuse(Misuse::Misaligned, addr);
                }
                // SAFETY: the heap outlives its pages; `current` is the
                // calling thread's heap or null.
                unsafe { note_freed_by(current, (*heap).free_large(page)) };
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
        self.assert_owns(addr);
        // SAFETY: we are the owner and `current`; the block is ours, and in
        // a slab-capable segment whose own header is the one checked above
        // (not the interior of a huge run) when `in_owned_segment` says so.
        unsafe {
            (registry::in_owned_segment(addr) && self.cache_free(addr))
                || HeapCore::free_uncached(ptr, self)
        }
    }

    /// Aborts unless `addr` lies in one of this heap's segments (the check
    /// an owned `Heap` makes before touching a block it is handed).
    pub fn assert_owns(&self, addr: usize) {
        let Some(base) = registry::header_of(addr) else {
            misuse(Misuse::Foreign, addr)
        };
        // SAFETY: registered segments are mapped and headed by a `Segment`.
        if unsafe { (*Segment::of(base)).heap } != self.me() {
            misuse(Misuse::WrongHeap, addr);
        }
    }

    /// # Safety
    /// The page lists are held (`l`); `block` is a slot of `page`, a slab
    /// page of this heap (a current page only by its owner), that was live
    /// and now holds the page key (`Block::mark_free` or
    /// `Block::cached_to_page`). Returns true if a page went back to the
    /// span pool.
    #[inline]
    pub(super) unsafe fn free_local(
        &self,
        l: &mut Local,
        page: *mut Page,
        block: *mut Block,
    ) -> bool {
        // SAFETY: per the caller; the page is only touched through `page`.
        unsafe {
            let used = (*page).used();
            let head = (*page).free;
            if used == 0 || head == block || (*page).is_hollow_slot(block as usize) {
                misuse(Misuse::DoubleFree, block as usize);
            }
            Block::set_next(block, head);
            (*page).free = block;
            (*page).set_used(used - 1);
            let class = (*page).class as usize;
            self.class(class).returned.add(1);
            // Slow only if the page leaves the full list, or empties and is
            // not its class's current page (which is kept: an allocate/free
            // churn then never leaves this function).
            if (*page).in_full || (used == 1 && self.current_page(class) != page) {
                return self.free_slow(l, page);
            }
            false
        }
    }

    #[cold]
    pub(super) unsafe fn free_slow(&self, l: &mut Local, page: *mut Page) -> bool {
        // SAFETY: the page lists are held (caller); `page` is a slab page of
        // this heap.
        unsafe {
            let class = (*page).class as usize;
            if (*page).in_full {
                l.full.remove(page);
                (*page).clear_full();
                l.queues[class].push(page);
            }
            if (*page).used() == 0 && self.current_page(class) != page {
                self.release_page(l, page);
                return true;
            }
            false
        }
    }

    /// Usable size of the allocation at `ptr`.
    ///
    /// # Safety
    /// `ptr` is a live allocation of some pagewise heap.
    pub unsafe fn usable_size(ptr: *const u8) -> usize {
        let addr = ptr as usize;
        let Some(base) = registry::header_of(addr) else {
            return usable_size_outside_segments(addr);
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
            match (*p).kind() {
                Kind::Slab => (*p).slot_size as usize,
                Kind::Large => large_usable(p) - (addr - (*p).start),
                _ => misuse(Misuse::DoubleFree, addr),
            }
        }
    }
}

#[cfg(feature = "secure")]
impl HeapCore {
    /// [`HeapCore::usable_size`] of a pointer the program hands back, which
    /// is checked first as a free checks it: aborts unless it is the start
    /// of a live block (the hardened build reads the block's end next).
    ///
    /// # Safety
    /// None beyond `ptr` being what the program passed.
    pub unsafe fn usable_size_checked(ptr: *const u8) -> usize {
        let addr = ptr as usize;
        let Some(base) = registry::header_of(addr) else {
            // A guarded block freed already is a double free, as a slot's
            // is below (not an invalid pointer).
            #[cfg(target_os = "linux")]
            if crate::guard::owns(addr) {
                return crate::guard::size_at_free(addr);
            }
            misuse(Misuse::Foreign, addr)
        };
        // SAFETY: registered segments are mapped and headed by a `Segment`.
        let seg = unsafe { &*Segment::of(base) };
        // SAFETY: the heap of a segment outlives its segments; `global` is
        // fixed at its creation. Only the global heaps' blocks are hardened.
        if !unsafe { (*(seg.heap as *const HeapCore)).global } {
            misuse(Misuse::WrongHeap, addr);
        }
        if seg.huge {
            // SAFETY: the header of a huge run is fixed while it is mapped.
            let st = unsafe { *seg.huge_state() };
            if addr != base + st.offset {
                misuse(Misuse::Misaligned, addr);
            }
            return st.size;
        }
        let p = lookup_page(seg, addr);
        // SAFETY: a descriptor of this segment; only fields fixed while the
        // span is in use are read (as `free_uncached` does).
        unsafe {
            match (*p).kind() {
                Kind::Slab => {
                    let Some(index) = (*p).slot_index(addr) else {
                        misuse(Misuse::Misaligned, addr);
                    };
                    if !(*p).carved(index) {
                        misuse(Misuse::DoubleFree, addr);
                    }
                    (*p).slot_size as usize
                }
                Kind::Large if addr == (*p).start => large_usable(p),
                Kind::Large => misuse(Misuse::Misaligned, addr),
                _ => misuse(Misuse::DoubleFree, addr),
            }
        }
    }
}

/// Usable bytes of the large object of span `p` from its start: the span,
/// or for a sampled small object its class's slot (`Page::slot_size`).
///
/// # Safety
/// `p` is the descriptor of a live large object.
unsafe fn large_usable(p: *const Page) -> usize {
    // SAFETY: fields fixed while the object lives (caller).
    unsafe {
        match (*p).slot_size {
            0 => (*p).large_size,
            slot => slot as usize,
        }
    }
}

/// A free of an address in no segment: a guarded block's
/// ([`crate::guard`]), or misuse. Returns the block's size.
#[cold]
fn free_outside_segments(addr: usize) -> usize {
    #[cfg(target_os = "linux")]
    if crate::guard::owns(addr) {
        return crate::guard::free(addr);
    }
    misuse(Misuse::Foreign, addr)
}

/// The usable size of a block in no segment: a guarded block's, or misuse.
#[cold]
fn usable_size_outside_segments(addr: usize) -> usize {
    #[cfg(target_os = "linux")]
    if crate::guard::owns(addr) {
        return crate::guard::usable_size(addr);
    }
    misuse(Misuse::Foreign, addr)
}

/// The first descriptor of the span containing `addr` in `seg`, checked
/// against stale or corrupt offsets (a pointer into free memory).
#[inline]
pub(super) fn lookup_page(seg: &Segment, addr: usize) -> *mut Page {
    let idx = (addr - seg.base()) >> SLICE_SHIFT;
    if idx < crate::memory::segment::HEADER_SLICES {
        misuse(Misuse::Foreign, addr);
    }
    // SAFETY: a descriptor of this segment; `slice_offset` is fixed while
    // the span is in use (a stale one, for free memory, is range-checked).
    let off = unsafe { (*seg.page(idx)).slice_offset } as usize;
    if off > idx - crate::memory::segment::HEADER_SLICES {
        misuse(Misuse::Foreign, addr);
    }
    seg.page(idx - off)
}

/// Before another thread than its owner frees slot `index` of `page`
/// (`addr`): aborts if the slot is withheld on a meshed OS page
/// (`memory/mesh.rs`), where its bytes are another page's object, which
/// marking it free would overwrite. A slot freed twice holds a free key
/// until its page meshes; after, it shows the group page's bytes, and
/// only the page's record (read under its page lists, which a mesh pass
/// holds) tells a withheld slot from a live one. The key is read before
/// the page's meshed bits: a key read from the group page means the page
/// meshed before the read, and its bit was set before the remap.
///
/// # Safety
/// `page` is a live slab page of `heap` (a thread heap) in `seg`; `index`
/// a carved slot of it at `addr`.
#[inline]
unsafe fn check_withheld(
    seg: &Segment,
    page: *mut Page,
    heap: *const HeapCore,
    index: usize,
    addr: usize,
) {
    let block = addr as *const Block;
    // SAFETY: a carved slot of a live slab page (caller): mapped.
    if unsafe { Block::is_cached(block) || Block::is_in_page(block) } {
        misuse(Misuse::DoubleFree, addr);
    }
    core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
    // SAFETY: per the caller; the segment's meshed bits are atomics.
    if !unsafe { (*page).on_meshed(seg, index) } {
        return;
    }
    // SAFETY: per the caller: the heap outlives its pages; its page lists
    // keep the record still while it is read.
    unsafe {
        let _lists = (*heap).lock_local();
        if (*page).is_withheld(index) {
            misuse(Misuse::DoubleFree, addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::lookup_page;
    use crate::memory::layout::SLICE;
    use crate::memory::segment::{Segment, HEADER_SLICES};

    const CHILD: &str = "PAGEWISE_TEST_LOOKUP_OFFSET";
    /// The slice the pointer is in: a few past the header.
    const IDX: usize = HEADER_SLICES + 3;

    /// This test binary, re-executed (through `PAGEWISE_TEST_RUNNER`, the
    /// emulator, when set: `tests/reexec`) to run only this test with
    /// `CHILD` set to the slice offset its descriptor is to hold.
    fn child(off: usize) -> (bool, String) {
        let exe = std::env::current_exe().unwrap();
        let runner = std::env::var("PAGEWISE_TEST_RUNNER").unwrap_or_default();
        let mut words = runner.split_whitespace();
        let mut cmd = match words.next() {
            Some(prog) => {
                let mut c = std::process::Command::new(prog);
                c.args(words).arg(exe);
                c
            }
            None => std::process::Command::new(exe),
        };
        let out = cmd
            .args([
                "--exact",
                "heap::free::tests::a_slice_offset_into_the_header_is_foreign",
            ])
            .args(["--nocapture", "--test-threads=1"])
            .env(CHILD, off.to_string())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `lookup_page` range-checks a descriptor's slice offset (stale or
    /// corrupt, for a pointer into free memory): the span it names must
    /// start past the segment header. An offset reaching into the header
    /// aborts as a foreign pointer; the largest valid one names the first
    /// slice after the header. (cargo-mutants: `idx - HEADER_SLICES` as
    /// `idx + HEADER_SLICES` passed every other test.)
    #[test]
    fn a_slice_offset_into_the_header_is_foreign() {
        if let Ok(off) = std::env::var(CHILD) {
            let off: u32 = off.parse().unwrap();
            let layout = core::alloc::Layout::new::<Segment>();
            // SAFETY: a zeroed Segment is valid as a holder of descriptors;
            // lookup_page reads only them, never the address it is given.
            let seg = unsafe { &*(std::alloc::alloc_zeroed(layout) as *mut Segment) };
            // SAFETY: a descriptor of the zeroed header, ours alone.
            unsafe { (*seg.page(IDX)).slice_offset = off };
            let p = lookup_page(seg, seg.base() + IDX * SLICE + 8);
            assert_eq!(p, seg.page(IDX - off as usize));
            return;
        }
        let (ok, err) = child(IDX - HEADER_SLICES);
        assert!(
            ok,
            "the first slice past the header is a span's start: {err}"
        );
        for off in [IDX - HEADER_SLICES + 1, IDX] {
            let (ok, err) = child(off);
            assert!(
                !ok && err.contains("pagewise: free of a pointer pagewise did not allocate"),
                "slice offset {off} from slice {IDX} reaches into the header: {err}"
            );
        }
    }
}
