//! Which address ranges are pagewise's: one byte per 32 MiB of address space.
//!
//! `free()` of a pointer looks up its segment here (a single load, no lock)
//! before trusting any header. A pointer whose segment is not registered is
//! foreign and gets a clear abort instead of corrupting memory. The map is a
//! zero-initialised static (4 MiB of address space for the 47-bit user range,
//! only the pages covering used addresses are ever touched).

use crate::memory::layout::{SEGMENT, SEGMENT_SHIFT};
use core::sync::atomic::{AtomicU8, Ordering};

const ADDRESS_BITS: usize = 47;
const ENTRIES: usize = 1 << (ADDRESS_BITS - SEGMENT_SHIFT);

/// Not a pagewise segment.
const NONE: u8 = 0;
/// A segment header of a thread heap of the global allocator lives at the
/// start of this segment.
const HEADER: u8 = 1;
/// The interior of a multi-segment huge object; its header is at a lower address.
const INTERIOR: u8 = 2;
/// The header of a huge object's segment run (so `free` knows without
/// reading the header).
const HUGE: u8 = 3;
/// A segment header of an owned `Heap` (whose blocks the global allocator
/// must not take).
const OWNED: u8 = 4;

/// One entry more than the address range needs: the entry of the address
/// `1 << ADDRESS_BITS` (never registered, [`addressable`]), so that
/// [`in_shared_segment`] rules out null and the addresses past the range
/// with one test and then tests no bound.
static MAP: [AtomicU8; ENTRIES + 1] = [const { AtomicU8::new(NONE) }; ENTRIES + 1];

fn index(addr: usize) -> Option<usize> {
    let i = addr >> SEGMENT_SHIFT;
    // `<=`: the map has `ENTRIES + 1` entries. (Not `MAP.len()`: that
    // borrows the whole 4 MiB map, which Miri tracks byte by byte.)
    (i <= ENTRIES).then_some(i)
}

/// Records `nsegs` segments starting at `base` (a segment header at `base`),
/// of an owned heap or of the global allocator's thread heaps.
pub fn register(base: usize, nsegs: usize, owned: bool) {
    let i = index(base).expect("segment above the 47-bit address range");
    MAP[i].store(if owned { OWNED } else { HEADER }, Ordering::Release);
    for j in 1..nsegs {
        MAP[i + j].store(INTERIOR, Ordering::Release);
    }
}

/// Forgets `nsegs` segments starting at `base`.
pub fn unregister(base: usize, nsegs: usize) {
    if let Some(i) = index(base) {
        for j in 0..nsegs {
            MAP[i + j].store(NONE, Ordering::Release);
        }
    }
}

/// Marks the run at `base` as holding a huge object.
pub fn mark_huge(base: usize) {
    if let Some(i) = index(base) {
        MAP[i].store(HUGE, Ordering::Release);
    }
}

/// The segment header responsible for `addr`, if `addr` is pagewise's,
/// and whether it heads a huge object.
#[inline]
pub fn lookup(addr: usize) -> Option<(usize, bool)> {
    let mut i = index(addr)?;
    loop {
        match MAP[i].load(Ordering::Acquire) {
            HEADER | OWNED => return Some((i * SEGMENT, false)),
            HUGE => return Some((i * SEGMENT, true)),
            INTERIOR if i > 0 => i -= 1,
            _ => return None,
        }
    }
}

/// Whether `addr` is neither null nor past the map's last entry (the
/// address `1 << ADDRESS_BITS`): one test for both, [`in_shared_segment`]'s
/// first.
#[inline(always)]
pub fn in_range_not_null(addr: usize) -> bool {
    addr.wrapping_sub(1) >> ADDRESS_BITS == 0
}

/// The map's entry for the segment containing `addr` (NONE outside the map).
#[inline]
fn entry(addr: usize) -> u8 {
    index(addr).map_or(NONE, |i| MAP[i].load(Ordering::Acquire))
}

/// Whether `addr` lies in a (non-huge) segment of the global allocator's
/// thread heaps: one load, the free fast path's ownership check. Null is
/// in none (no segment starts at address 0), and one test rules it out
/// with the addresses past the map, so that the C library's `free` makes
/// no test of its own for null before this one.
#[inline]
pub fn in_shared_segment(addr: usize) -> bool {
    if !in_range_not_null(addr) {
        return false;
    }
    let i = addr >> SEGMENT_SHIFT;
    debug_assert!(i <= ENTRIES);
    // A pointer to the entry, not a borrow of the whole map (which
    // `get_unchecked` takes, and Miri tracks byte by byte: 4 MiB per free).
    let map = core::ptr::addr_of!(MAP).cast::<AtomicU8>();
    // SAFETY: `1 <= addr <= 1 << ADDRESS_BITS` (just tested), so `i` is at
    // most `ENTRIES`, the map's last index: the entry is inside the static,
    // which lives for the whole program and is only ever accessed through
    // atomics.
    let e = unsafe { &*map.add(i) };
    e.load(Ordering::Acquire) == HEADER
}

/// The free fast path's map index of `addr`: the entry of the segment
/// holding `addr - 1`. It is below the map's range ([`index_in_range`])
/// exactly when `addr` is neither null nor past it ([`in_range_not_null`]),
/// so one comparison rules out both and leaves the index in a register for
/// the entry's load ([`shared_at`]) and the segment's base (the index
/// shifted back), where the range test and the index took a shift each.
/// It is `addr`'s own segment's but at a segment's first byte, which no
/// slot starts (the header is there): that byte finds the segment below,
/// whose first slice, its header's, holds no slot either, so the free
/// past the cache looks it up again. Hidden from the optimizer, which would
/// make the comparison a test of `addr - 1 >> 47` and shift again.
#[inline(always)]
pub fn index_below(addr: usize) -> usize {
    crate::memory::layout::opaque(addr.wrapping_sub(1) >> SEGMENT_SHIFT)
}

/// Whether an [`index_below`] is one of the map's range, which neither
/// null's nor that of an address past the range is.
#[inline(always)]
pub fn index_in_range(i: usize) -> bool {
    i < ENTRIES
}

/// Whether the map's entry `i` is a (non-huge) segment of the global
/// allocator's thread heaps ([`in_shared_segment`] by index).
///
/// # Safety
/// `i` is [`index_in_range`].
#[inline(always)]
pub unsafe fn shared_at(i: usize) -> bool {
    debug_assert!(index_in_range(i));
    // As in `in_shared_segment`: a pointer to the entry, no borrow of the map.
    let map = core::ptr::addr_of!(MAP).cast::<AtomicU8>();
    // SAFETY: `i < ENTRIES` (caller): the entry is inside the static, which
    // lives for the whole program and is only ever accessed through atomics.
    let e = unsafe { &*map.add(i) };
    e.load(Ordering::Acquire) == HEADER
}

/// Where `addr` lies, from one load: `Some(true)` in a (non-huge) segment
/// of the global allocator's thread heaps ([`in_shared_segment`]),
/// `Some(false)` in any other segment the map records (an owned heap's,
/// or a huge run's), `None` in none, so that an address that is none of
/// pagewise's (a stack, a static) is told so at once.
#[inline]
#[cfg_attr(not(feature = "secure"), allow(dead_code))]
pub fn shared_or_registered(addr: usize) -> Option<bool> {
    match entry(addr) {
        NONE => None,
        e => Some(e == HEADER),
    }
}

/// Whether `addr` lies in a (non-huge) segment of an owned `Heap`.
#[inline]
pub fn in_owned_segment(addr: usize) -> bool {
    entry(addr) == OWNED
}

/// The segment header responsible for `addr`, if `addr` is pagewise's.
#[inline]
pub fn header_of(addr: usize) -> Option<usize> {
    lookup(addr).map(|(base, _)| base)
}

/// Whether the address range of a segment fits in the map.
pub fn addressable(base: usize, nsegs: usize) -> bool {
    matches!(index(base), Some(i) if i + nsegs <= ENTRIES)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast path's lookup rules out null and the addresses past the
    /// map with one test: registered or not, they are in no segment, and
    /// the entry of the first address past the range is there and says
    /// none (the address where a shift test would index past the map).
    #[test]
    fn null_and_addresses_past_the_map_are_in_no_segment() {
        let top = 1usize << ADDRESS_BITS;
        // The segment at the top of the range registered, and for a
        // moment the one at address 0, whose entry a lookup of null
        // without the test would read.
        let last = top - SEGMENT;
        register(last, 1, false);
        register(0, 1, false);
        let low = [0, 1, 16].map(in_shared_segment);
        assert!(in_shared_segment(16), "a registered segment at 0 is found");
        unregister(0, 1);
        assert_eq!(low, [false, true, true], "null is in no segment");
        assert!(in_shared_segment(last) && in_shared_segment(top - 1));
        for a in [0, 16, top, top + 1, top + SEGMENT, 1 << 56, usize::MAX] {
            assert!(!in_shared_segment(a), "{a:#x}");
        }
        for a in [1, top - 1, top] {
            assert!(in_range_not_null(a), "{a:#x}");
        }
        for a in [0, top + 1, usize::MAX] {
            assert!(!in_range_not_null(a), "{a:#x}");
        }
        // The fast path's index: of the byte before, in the range exactly
        // where the test above passes, the map's last entry the top one.
        for a in [1, 16, SEGMENT, SEGMENT + 1, last + 16, top - 1, top] {
            let i = index_below(a);
            assert!(index_in_range(i), "{a:#x}");
            assert_eq!(i, (a - 1) / SEGMENT, "{a:#x}");
        }
        assert_eq!(index_below(top), ENTRIES - 1);
        for a in [0, top + 1, top + 16, top + SEGMENT, usize::MAX] {
            assert!(!index_in_range(index_below(a)), "{a:#x}");
        }
        // SAFETY: indices in range (tested above).
        unsafe {
            assert!(shared_at(index_below(last + 16)) && shared_at(index_below(top)));
            assert!(!shared_at(index_below(last)), "the byte before is below");
            assert!(!shared_at(index_below(16)));
        }
        assert_eq!(index(top), Some(ENTRIES));
        assert_eq!(lookup(top + 16), None);
        assert_eq!(index(top + SEGMENT), None);
        assert!(!addressable(last, 2), "the extra entry is never registered");
        unregister(last, 1);
    }

    #[test]
    fn finds_headers_and_interiors() {
        let base = 0x3000_0000_0000usize;
        assert_eq!(header_of(base + 5), None);
        register(base, 3, false);
        assert!(in_shared_segment(base + 5));
        assert!(!in_shared_segment(base + SEGMENT));
        assert_eq!(header_of(base + 5), Some(base));
        assert_eq!(lookup(base + 5), Some((base, false)));
        mark_huge(base);
        assert_eq!(lookup(base + SEGMENT + 5), Some((base, true)));
        assert_eq!(header_of(base + 2 * SEGMENT + 77), Some(base));
        assert_eq!(header_of(base + 3 * SEGMENT), None);
        unregister(base, 3);
        assert_eq!(header_of(base + 5), None);
        assert_eq!(header_of(usize::MAX), None);
        register(base, 1, true);
        assert_eq!(header_of(base + 5), Some(base));
        assert!(!in_shared_segment(base + 5), "an owned heap's segment");
        assert!(in_owned_segment(base + 5));
        mark_huge(base);
        assert!(!in_owned_segment(base + 5), "a huge object's run");
        unregister(base, 1);
    }
}
