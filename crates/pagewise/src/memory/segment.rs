//! Segments: 32 MiB aligned runs of address space with their header.
//!
//! The header (the first two slices) holds one [`Page`] descriptor per slice and a bitmap
//! with one bit per OS page saying whether that page may be resident
//! ("committed"). Purging clears bits; handing pages out sets them. The
//! bitmap is what lets pagewise give memory back page by page, and count
//! exactly what it holds.

use crate::memory::layout::{
    opaque, os_page, os_page_shift, MAX_OS_PAGES_PER_SEGMENT, SEGMENT, SLICE, SLICES_PER_SEGMENT,
    SLICE_SHIFT,
};
use crate::memory::page::Page;
use crate::memory::resident::Resident;
use core::cell::UnsafeCell;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Mixed into the header cookie so that a random word at a segment-aligned
/// address is unlikely to pass for a header.
const COOKIE_KEY: usize = 0x7061_6765_7769_7365; // "pagewise"

/// Sized for the smallest OS page; at a larger one only the first
/// `os_pages_per_segment()` bits are used.
const BITMAP_WORDS: usize = MAX_OS_PAGES_PER_SEGMENT / 64;

/// State of a huge object's segment run (mutated under the heap's span lock).
#[derive(Clone, Copy)]
pub struct Huge {
    /// Which bytes of the run may hold data not yet purged (by position).
    pub resident: Resident,
    /// Offset of the object from the segment base.
    pub offset: usize,
    /// Usable bytes of the object (0 while cached for reuse).
    pub size: usize,
    /// Requested bytes.
    pub requested: usize,
    /// The part of the run advised to be huge pages
    /// (`memory/huge_pages.rs`).
    pub thp: crate::memory::huge_pages::RunAdvice,
    /// When it was freed (decay timer).
    pub freed_at: u64,
    /// The object's sample, if it was sampled (`crate::profile`).
    pub sample: crate::profile::Sample,
}

/// Links and counts of a segment in its heap (mutated under the span lock).
#[derive(Clone, Copy)]
pub struct Links {
    /// Next in the heap's segment list or huge cache.
    pub next: *mut Segment,
    /// Previous in the heap's segment list or huge cache.
    pub prev: *mut Segment,
    /// Slices in free spans.
    pub free_slices: usize,
    /// Per 2 MiB region, slices in free spans (placement fills the
    /// fullest region first when the heap asks for huge pages:
    /// `spans/regions.rs`).
    pub region_free: [u8; crate::memory::huge_pages::REGIONS],
}

/// The header at the start of every segment.
///
/// Accessed through shared references only: everything that changes after
/// `init` sits in an `UnsafeCell` (descriptors, links, huge state) or is
/// atomic (commit bitmap), so raw pointers to descriptors and references to
/// the header can coexist soundly (checked by Miri).
#[repr(C)]
pub struct Segment {
    /// `base ^ COOKIE_KEY`: checked before trusting the header.
    pub cookie: usize,
    /// Owning heap (`HeapCore`), type-erased.
    pub heap: *mut u8,
    /// Segments in this run (1, or more for a huge object).
    pub nsegs: usize,
    /// A huge-object segment run (no slices in use).
    pub huge: bool,
    huge_state: UnsafeCell<Huge>,
    links: UnsafeCell<Links>,
    /// One bit per OS page (the run-time [`os_page`]): may be resident. Atomic because the owner sets
    /// bits of its slab pages without the span lock while the purger clears
    /// bits of free spans that share a word.
    pub committed: [AtomicU64; BITMAP_WORDS],
    /// One bit per OS page: a member of a mesh group (`memory/mesh.rs`).
    /// Changed only by the heap's owner (or a visitor) under its page lists.
    meshed: [AtomicU64; BITMAP_WORDS],
    /// One bit per 2 MiB region: advised to be a huge page, all its OS
    /// pages committed (`memory/huge_pages.rs`). Set under the span lock;
    /// cleared by whoever purges inside the region (the span lock, or the
    /// page lists when hollowing).
    huge_regions: AtomicU32,
    /// Per slice, the slab table: if the slice belongs to a slab page,
    /// `(class + 1) << STATE_SHIFT | page_offset` (the page's byte offset in
    /// the segment, a multiple of 64 KiB, so the low 16 bits are free), else
    /// 0. Written only when a slab page is made or released, so other
    /// threads' frees read it from their own caches (the descriptors,
    /// written by the owner on every allocation, would bounce between
    /// cores). Decoding it is two instructions on the free path.
    slab_slices: [AtomicU32; SLICES_PER_SEGMENT],
    slices: [UnsafeCell<Page>; SLICES_PER_SEGMENT],
}

/// OS pages the header occupies (counted as metadata while the segment
/// lives): at most [`HEADER_SLICES`] slices, as a slice is a whole number
/// of OS pages.
#[inline]
pub fn header_pages() -> usize {
    core::mem::size_of::<Segment>().div_ceil(os_page())
}

/// Bytes of the header's OS pages.
#[inline]
pub fn header_bytes() -> usize {
    header_pages() << os_page_shift()
}
/// Slices the header occupies; spans start after them.
pub const HEADER_SLICES: usize = core::mem::size_of::<Segment>().div_ceil(SLICE);

const _: () = assert!(HEADER_SLICES <= 2);
/// A slab-table entry keeps `class + 1` shifted by this much: the size of
/// a heap's per-class state (`heap::cache::ClassState`, which asserts it),
/// so the free path finds the state at that byte offset without a multiply.
pub const STATE_SHIFT: u32 = 7;
const SLAB_STATE_MASK: usize = (1 << SLICE_SHIFT) - 1;
const _: () = assert!((crate::memory::size_class::CLASSES + 1) << STATE_SHIFT <= SLAB_STATE_MASK);
// Metadata stays under 1 % of the segment at every page size pagewise
// accepts (checked at compile time, at the largest page).
const _: () = assert!(
    core::mem::size_of::<Segment>().div_ceil(crate::memory::layout::MAX_OS_PAGE)
        * crate::memory::layout::MAX_OS_PAGE
        * 100
        < crate::memory::layout::SEGMENT
);

impl Segment {
    /// The segment containing `addr`'s base, as a header pointer.
    #[inline]
    pub fn of(base: usize) -> *mut Segment {
        base as *mut Segment
    }

    /// Whether the header at `base` carries a valid cookie.
    ///
    /// # Safety
    /// `base` is a registered segment base (mapped memory).
    #[inline]
    pub unsafe fn valid(base: usize) -> bool {
        // SAFETY: registered segments are mapped; the cookie is the first word.
        unsafe { (*(base as *const Segment)).cookie == base ^ COOKIE_KEY }
    }

    /// Initialises the header of a fresh (zeroed) segment run.
    ///
    /// # Safety
    /// `base` is a fresh, zeroed, exclusively owned segment run; no
    /// reference to its header exists.
    pub unsafe fn init(base: usize, nsegs: usize, heap: *mut u8, huge: bool) -> *mut Segment {
        let seg = Segment::of(base);
        // SAFETY: exclusive and mapped per the caller; zeroed memory is a
        // valid `Segment` except for the fields written here (all-zero Page
        // descriptors are `Page::empty()`, zero links are null).
        unsafe {
            (*seg).cookie = base ^ COOKIE_KEY;
            (*seg).heap = heap;
            (*seg).nsegs = nsegs;
            (*seg).huge = huge;
            *(*seg).huge_state.get_mut() = Huge {
                resident: Resident::NONE,
                offset: 0,
                size: 0,
                requested: 0,
                thp: crate::memory::huge_pages::RunAdvice::NONE,
                freed_at: 0,
                sample: crate::profile::Sample::NONE,
            };
            *(*seg).links.get_mut() = Links {
                next: null_mut(),
                prev: null_mut(),
                free_slices: 0,
                region_free: [0; crate::memory::huge_pages::REGIONS],
            };
            for i in 0..HEADER_SLICES {
                (*seg).slices[i]
                    .get_mut()
                    .init_header(HEADER_SLICES as u32, i as u32, base);
            }
            (*seg).set_committed(0, header_pages());
        }
        seg
    }

    /// The descriptor of slice `i`.
    #[inline]
    pub fn page(&self, i: usize) -> *mut Page {
        self.slices[i].get()
    }

    /// The huge-object state.
    #[inline]
    pub fn huge_state(&self) -> *mut Huge {
        self.huge_state.get()
    }

    /// Links and counts in the owning heap.
    #[inline]
    pub fn links(&self) -> *mut Links {
        self.links.get()
    }

    /// Base address.
    #[inline]
    pub fn base(&self) -> usize {
        self as *const Segment as usize
    }

    /// Index of the slice containing `addr`.
    #[inline]
    pub fn slice_index(&self, addr: usize) -> usize {
        (addr - self.base()) / SLICE
    }

    /// Address of slice `i`.
    #[inline]
    pub fn slice_addr(&self, i: usize) -> usize {
        self.base() + i * SLICE
    }

    /// Index of a descriptor in `slices`.
    #[inline]
    pub fn index_of(&self, page: *const Page) -> usize {
        (page as usize - self.slices.as_ptr() as usize) / core::mem::size_of::<Page>()
    }

    /// Records slices `first..first + n` as a slab page of `class` whose
    /// slots the thread caches may take.
    pub fn mark_slab(&self, first: usize, n: usize, class: usize) {
        self.set_cacheable(first, n, class, true);
    }

    /// Says whether frees of the slab page at slices `first..first + n`
    /// (of `class`) may go into a thread cache. A free into a cache writes
    /// the slot blind, so only a page whose every slot is free or in use
    /// (none hollow or withheld) may be cacheable: its entry then names
    /// the class's state; otherwise the state whose geometry no offset
    /// passes, so `HeapCore::cache_free` declines and the free takes the
    /// checked path. The page's own offset is kept either way
    /// ([`Segment::slab_page`]). Only [`Page::set_hollow_slots`] and
    /// `mark_slab` call this.
    ///
    /// [`Page::set_hollow_slots`]: crate::memory::page::Page::set_hollow_slots
    pub(crate) fn set_cacheable(&self, first: usize, n: usize, class: usize, cacheable: bool) {
        debug_assert!((1..SLICES_PER_SEGMENT).contains(&first));
        let state = if cacheable {
            (class + 1) << STATE_SHIFT
        } else {
            0
        };
        let entry = (state | first << SLICE_SHIFT) as u32;
        // Release: a page made cacheable again once its OS pages are no
        // longer meshed publishes that unmeshing to the hardened free,
        // which reads this word, then (after an acquire fence) the slot
        // before its block, and trusts that word only on the page's own
        // memory.
        for e in &self.slab_slices[first..first + n] {
            e.store(entry, core::sync::atomic::Ordering::Release);
        }
    }

    /// Forgets the slab page at slices `first..first + n`.
    pub fn clear_slab(&self, first: usize, n: usize) {
        for e in &self.slab_slices[first..first + n] {
            e.store(0, Relaxed);
        }
    }

    /// The descriptor of the slab page holding `addr`, a slot of a live slab
    /// page of this segment, found through the read-mostly slab table.
    #[inline]
    pub fn slab_page(&self, addr: usize) -> *mut Page {
        let e = self.slab_table_entry(addr);
        // A slab page's entry keeps its offset (past the header: never 0)
        // whether or not it is cacheable.
        debug_assert!(e != 0, "not a slab slot");
        self.page(e >> SLICE_SHIFT)
    }

    /// For the slice holding `addr`: the raw slab-table word (which
    /// [`Segment::split_slab_word`] takes apart), read again by the free
    /// fast path to see whether it changed (`memory/cache_handshake.rs`).
    /// Any thread may ask; it reads only the read-mostly slab table.
    #[inline]
    pub fn slab_word(&self, addr: usize) -> usize {
        self.slab_table_entry(addr)
    }

    /// [`Segment::split_slab_word`] of the slice holding `addr`'s word, read
    /// once.
    #[inline]
    pub fn slab_entry(&self, addr: usize) -> (usize, usize) {
        self.split_slab_word(self.slab_word(addr), addr)
    }

    /// Of the slab word `e` of the slice holding `addr`:
    /// `(class + 1) << STATE_SHIFT` of the slab page there (0 if none, or
    /// if its frees may not be cached), and `addr`'s offset from the start
    /// of that page (meaningless for 0).
    #[inline]
    pub fn split_slab_word(&self, e: usize, addr: usize) -> (usize, usize) {
        // `addr - self.base()` for an address in this segment, but the
        // same mask as the slab table's index takes, so the two share it.
        debug_assert_eq!(addr & !(SEGMENT - 1), self.base());
        Segment::split_slab_word_at(e, addr & (SEGMENT - 1))
    }

    /// [`Segment::split_slab_word`] of the word `e` of the slice `offset`
    /// bytes into a segment: the state, and `offset`'s offset from the
    /// start of the slab page there.
    #[inline]
    pub fn split_slab_word_at(e: usize, offset: usize) -> (usize, usize) {
        let state = e & SLAB_STATE_MASK;
        // The page's offset is the word less its state: a subtraction and
        // an add of the state already taken apart, where masking the
        // state off takes a copy and a mask. (Wrapping: the offset less
        // the whole word is below 0 for a slot near the page's start.)
        (state, offset.wrapping_sub(e).wrapping_add(state))
    }

    /// The raw slab-table entry of the slice holding `addr`, an address in
    /// this (non-huge) segment.
    #[inline]
    fn slab_table_entry(&self, addr: usize) -> usize {
        debug_assert_eq!(addr & !(SEGMENT - 1), self.base());
        self.slab_word_at(addr)
    }

    /// The raw slab-table word of the slice `offset` bytes into this
    /// segment (`offset` below [`SEGMENT`]; the mask keeps any other in the
    /// table): the header's slices, the first one's included, hold no slab
    /// page and read 0.
    #[inline]
    pub fn slab_word_at(&self, offset: usize) -> usize {
        // The offset's top bits are the slice: the free fast path has the
        // offset in a register already (`split_slab_word_at` takes it
        // too), and masks it once for both. Hidden from the optimizer,
        // which would otherwise shift the address and mask the slice
        // again, one instruction more per free.
        let slice = opaque(offset & (SEGMENT - 1)) >> SLICE_SHIFT;
        debug_assert!(slice < SLICES_PER_SEGMENT);
        // SAFETY: the masked offset is below `SEGMENT`, so the slice is
        // below `SLICES_PER_SEGMENT`, the table's length.
        unsafe { self.slab_slices.get_unchecked(slice) }.load(Relaxed) as usize
    }

    /// Marks OS pages `first..first+n` committed; returns how many were not.
    pub fn set_committed(&self, first: usize, n: usize) -> usize {
        let mut newly = 0;
        for_bits(first, n, |w, mask| {
            // Reused memory is usually still committed: a plain load then
            // spares the locked read-modify-write.
            if self.committed[w].load(Relaxed) & mask != mask {
                let old = self.committed[w].fetch_or(mask, Relaxed);
                newly += (mask & !old).count_ones() as usize;
            }
        });
        newly
    }

    /// Marks OS pages `first..first+n` not committed (purged).
    pub fn clear_committed(&self, first: usize, n: usize) {
        for_bits(first, n, |w, mask| {
            self.committed[w].fetch_and(!mask, Relaxed);
        });
    }

    /// The regions advised to be huge pages, as a mask.
    #[inline]
    pub fn huge_regions(&self) -> u32 {
        self.huge_regions.load(Relaxed)
    }

    /// Records regions `m` as advised.
    pub fn mark_huge_regions(&self, m: u32) {
        if m != 0 {
            self.huge_regions.fetch_or(m, Relaxed);
        }
    }

    /// Forgets the advice of regions `m`; returns those of them that were
    /// advised (the caller takes the advice back).
    pub fn take_huge_regions(&self, m: u32) -> u32 {
        self.huge_regions.fetch_and(!m, Relaxed) & m
    }

    /// Whether OS page `i` is a member of a mesh group.
    #[inline]
    pub fn is_meshed(&self, i: usize) -> bool {
        self.meshed[i / 64].load(Relaxed) & (1 << (i % 64)) != 0
    }

    /// Marks OS page `i` a member of a mesh group.
    pub fn set_meshed(&self, i: usize) {
        self.meshed[i / 64].fetch_or(1 << (i % 64), Relaxed);
    }

    /// Marks OS page `i` out of any mesh group.
    pub fn clear_meshed(&self, i: usize) {
        self.meshed[i / 64].fetch_and(!(1 << (i % 64)), Relaxed);
    }

    /// Counts committed OS pages in `first..first+n`.
    pub fn count_committed(&self, first: usize, n: usize) -> usize {
        let mut c = 0;
        for_bits(first, n, |w, mask| {
            c += (mask & self.committed[w].load(Relaxed)).count_ones() as usize;
        });
        c
    }

    /// Calls `f(first, count)` for each run of committed OS pages in
    /// `first..first+n`, then clears them when `f` returns true.
    pub fn drain_committed(
        &self,
        first: usize,
        n: usize,
        mut f: impl FnMut(usize, usize) -> bool,
    ) -> usize {
        let mut cleared = 0;
        let end = first + n;
        let mut i = first;
        while i < end {
            if !self.bit(i) {
                i += 1;
                continue;
            }
            let run_start = i;
            while i < end && self.bit(i) {
                i += 1;
            }
            if f(run_start, i - run_start) {
                for_bits(run_start, i - run_start, |w, mask| {
                    self.committed[w].fetch_and(!mask, Relaxed);
                });
                cleared += i - run_start;
            }
        }
        cleared
    }

    fn bit(&self, i: usize) -> bool {
        self.committed[i / 64].load(Relaxed) & (1 << (i % 64)) != 0
    }

    /// OS page index of an address inside this segment.
    #[inline]
    pub fn os_page(&self, addr: usize) -> usize {
        (addr - self.base()) >> os_page_shift()
    }
}

fn for_bits(first: usize, n: usize, mut f: impl FnMut(usize, u64)) {
    let end = first + n;
    let mut i = first;
    while i < end {
        let w = i / 64;
        let lo = i % 64;
        let hi = (end - w * 64).min(64);
        let mask = if hi - lo == 64 {
            u64::MAX
        } else {
            ((1u64 << (hi - lo)) - 1) << lo
        };
        f(w, mask);
        i = w * 64 + hi;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_fits_and_bitmap_runs() {
        let layout = core::alloc::Layout::new::<Segment>();
        // SAFETY: a zeroed Segment is valid (only used as a bitmap holder here).
        let seg = unsafe { &*(std::alloc::alloc_zeroed(layout) as *mut Segment) };
        assert_eq!(seg.set_committed(3, 70), 70);
        assert_eq!(seg.set_committed(60, 20), 7);
        assert_eq!(seg.count_committed(0, 200), 77);
        let mut runs = Vec::new();
        seg.set_committed(100, 2);
        let cleared = seg.drain_committed(0, 200, |a, n| {
            runs.push((a, n));
            true
        });
        assert_eq!(runs, vec![(3, 77), (100, 2)]);
        assert_eq!(cleared, 79);
        assert_eq!(seg.count_committed(0, MAX_OS_PAGES_PER_SEGMENT), 0);
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(seg as *const Segment as *mut u8, layout) };
    }

    /// The slab table's word of a slot's slice, taken apart into the
    /// class's state and the slot's offset in its page, by address and by
    /// offset in the segment; the header's slices read 0, and an offset
    /// past the segment is masked into it (the free fast path reads the
    /// first byte past a segment as its segment's offset 0).
    #[test]
    fn slab_words_give_the_state_and_the_offset_in_the_page() {
        let layout =
            core::alloc::Layout::from_size_align(core::mem::size_of::<Segment>(), SEGMENT).unwrap();
        // SAFETY: a zeroed Segment is valid (its slab table only is used).
        let seg = unsafe { &*(std::alloc::alloc_zeroed(layout) as *mut Segment) };
        let class = 5;
        seg.mark_slab(3, 2, class);
        let state = (class + 1) << STATE_SHIFT;
        let word = state | 3 << SLICE_SHIFT;
        for offset in [3 * SLICE, 3 * SLICE + 48, 4 * SLICE + 16] {
            let addr = seg.base() + offset;
            assert_eq!(seg.slab_word(addr), word, "{offset:#x}");
            assert_eq!(seg.slab_word_at(offset), word, "{offset:#x}");
            assert_eq!(seg.slab_word_at(offset + SEGMENT), word, "{offset:#x}");
            let in_page = offset - 3 * SLICE;
            assert_eq!(seg.split_slab_word(word, addr), (state, in_page));
            assert_eq!(Segment::split_slab_word_at(word, offset), (state, in_page));
            assert_eq!(seg.slab_entry(addr), (state, in_page));
        }
        for offset in [0, 16, SLICE, 2 * SLICE, 5 * SLICE] {
            assert_eq!(seg.slab_word_at(offset), 0, "{offset:#x}");
            assert_eq!(seg.split_slab_word(0, seg.base() + offset).0, 0);
        }
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(seg as *const Segment as *mut u8, layout) };
    }
}
