//! The record of blocks handed out: one bit per 16 bytes of each segment
//! of the global heaps, set when the hardened layer hands out a block
//! starting there and cleared by the hardened free of that block. It is
//! the one place that says whether a block start is live: a slot carved
//! and never handed out, a slot freed (in a thread cache or its page's
//! lists) and a large block freed all read 0, with no read of
//! the block itself.
//!
//! A free slot's own bytes say it is free (its free key, a free slot's
//! tail word), but a write after free can change all of them: all of a
//! 16-byte slot, or the key and the tail word of a block that fills its
//! slot to within seven bytes, or the key of a slot carved and never
//! handed out. Then only something outside the slot can tell a slot freed
//! twice from a live block written past its end. This record is that:
//! kept apart from every block (a mapping of its own per segment, mapped
//! on first use, found through a static directory), changed only by atomic
//! read-modify-writes (a free and a hand-out on different threads share
//! its words), read before any of the block's bytes. The free loads no
//! byte of its block to decide: the line it would wait for is the one the
//! block's last owner, often another thread, wrote last. A large block
//! kept shut after its free (`fence::shut`) is known free here without a
//! read of its bytes, which would fault.
//!
//! A bit is set only for a block start the hardened layer handed out and
//! cleared by that block's free; a block's memory goes to other uses (a
//! page emptied and carved for another class, a span reused) only once
//! every block on it was freed, so no bit outlives its block. Meshing
//! moves a page's bytes, not its addresses.
//!
//! Where a segment's bitmap is refused,
//! nothing is recorded there, for good: the hand-out and the free both
//! find it refused, and the free falls back to the free key in the slot
//! (which catches a second free of a slot whose key is intact, and a free
//! of a slot carved and never handed out).

use crate::memory::layout::{SEGMENT, SEGMENT_SHIFT};
use crate::os::source::map_table;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

/// Bytes per bit: every block starts at a multiple of 16.
const GRANULE: usize = 16;
/// Words of one segment's bitmap.
const WORDS: usize = SEGMENT / GRANULE / 64;
/// Segments of the 47-bit address range: the directory's entries, and
/// one more, for the segment at `1 << 47` (the address the registry's
/// range test lets through with the rest), so that a free, which made
/// that test, makes no other here.
const ENTRIES: usize = (1 << (47 - SEGMENT_SHIFT)) + 1;

/// The directory: one entry per segment, 0 while its bitmap is not
/// mapped yet, 1 if the OS refused it, else the bitmap's address. A static
/// table (zero pages until a segment's entry is written, as a mapping made
/// on first use was), so that finding a segment's bitmap is one load at an
/// index, with no load of the directory's address nor test for it.
static DIR: [AtomicUsize; ENTRIES] = [const { AtomicUsize::new(0) }; ENTRIES];

/// Maps `bytes` of zeroed memory and publishes it in `cell` (0 before),
/// unless another thread did first (its mapping is kept, this one given
/// back). 1 in `cell` if the OS refused.
#[cold]
fn map_into(cell: &AtomicUsize, bytes: usize) -> Option<usize> {
    let Some(m) = map_table(bytes) else {
        let _ = cell.compare_exchange(0, 1, Relaxed, Relaxed);
        return None;
    };
    match cell.compare_exchange(0, m.as_ptr() as usize, AcqRel, Acquire) {
        Ok(_) => Some(m.as_ptr() as usize),
        Err(seen) => {
            // SAFETY: ours, never published.
            unsafe { crate::os::source::unmap_table(m, bytes) };
            (seen > 1).then_some(seen)
        }
    }
}

/// The word and the bit of the block starting at `addr`, its segment's
/// bitmap mapped first (a free of a block in a segment where none was
/// handed out maps one, and finds the block not live). `None` where a
/// mapping was refused, or past the directory's range.
#[inline(always)]
fn bit(addr: usize) -> Option<(&'static AtomicU64, u64)> {
    let i = addr >> SEGMENT_SHIFT;
    // Not `DIR.get(i)`: that borrows the whole table, which Miri would
    // track byte by byte.
    if i >= ENTRIES {
        return None;
    }
    // SAFETY: `i` is below ENTRIES, the table's length.
    let entry = unsafe { &*DIR.as_ptr().add(i) };
    let mut w = entry.load(Acquire);
    if w <= 1 {
        if w == 1 {
            return None;
        }
        w = map_into(entry, WORDS * 8)?;
    }
    let g = (addr & (SEGMENT - 1)) / GRANULE;
    // SAFETY: a mapping of WORDS zeroed words, never unmapped; `g / 64` is
    // below WORDS.
    let word = unsafe { &*(w as *const AtomicU64).add(g / 64) };
    Some((word, 1 << (g % 64)))
}

/// Records the block at `addr` handed out (live).
#[inline(always)]
pub fn handed_out(addr: usize) {
    if let Some((w, b)) = bit(addr) {
        w.fetch_or(b, Relaxed);
    }
}

/// Records the block at `addr` freed: whether it was live (false: freed
/// already, or never handed out). `None` where the record was refused.
#[inline(always)]
pub fn release(addr: usize) -> Option<bool> {
    bit(addr).map(|(w, b)| w.fetch_and(!b, Relaxed) & b != 0)
}

/// Whether the block at `addr` is live. `None` where the record was
/// refused.
#[inline(always)]
pub fn is_live(addr: usize) -> Option<bool> {
    bit(addr).map(|(w, b)| w.load(Relaxed) & b != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_live_from_its_hand_out_to_its_free_and_its_neighbours_apart() {
        // Addresses in a segment no heap uses (the directory covers every
        // segment): the bits are this test's.
        let base = 0x7e00_0000_0000usize;
        let (a, b) = (base + 4096, base + 4096 + GRANULE);
        assert_eq!(is_live(a), Some(false), "never handed out");
        assert_eq!(
            release(a),
            Some(false),
            "a free of a block never handed out"
        );
        handed_out(a);
        assert_eq!(is_live(a), Some(true));
        assert_eq!(is_live(b), Some(false), "one bit a block");
        assert_eq!(release(a), Some(true), "the first free");
        assert_eq!(is_live(a), Some(false));
        assert_eq!(release(a), Some(false), "the second free");
        handed_out(b);
        handed_out(a);
        assert_eq!(release(b), Some(true));
        assert_eq!(is_live(a), Some(true), "a neighbour's free leaves it");
        assert_eq!(release(a), Some(true), "freed again after its hand-out");
        assert_eq!((is_live(a), is_live(b)), (Some(false), Some(false)));
    }
}
