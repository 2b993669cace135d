//! The record of freed blocks: one bit per 16 bytes of each segment of
//! the global heaps, set by the hardened free of the block starting there
//! and cleared when a block starting there is handed out again.
//!
//! A free slot's own bytes say it is free (its free key, a free slot's
//! tail word), but a write after free can change all of them: all of a
//! 16-byte slot, or the key and the tail word of a block that fills its
//! slot to within seven bytes. Then only something outside the slot can
//! tell a slot freed twice from a live block written past its end. This
//! record is that: kept apart from every block (a mapping of its own per
//! segment, and a directory of them, both mapped on first use), changed
//! only by atomic read-modify-writes (a free and a hand-out on different
//! threads share its words), read before the block's bytes are judged. A
//! large block kept shut after its free (`fence::shut`) is known freed
//! here without a read of its bytes, which would fault. A bit left set by
//! a block whose memory went to other uses meanwhile is harmless: only a
//! block start handed out is ever freed, and its hand-out clears the bit
//! first.
//!
//! Where a mapping is refused, nothing is recorded (the free keys still
//! catch a second free of a slot whose key is intact).

use crate::memory::layout::{SEGMENT, SEGMENT_SHIFT};
use crate::os::source::map_table;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

/// Bytes per bit: every block starts at a multiple of 16.
const GRANULE: usize = 16;
/// Words of one segment's bitmap.
const WORDS: usize = SEGMENT / GRANULE / 64;
/// Segments of the 47-bit address range: the directory's entries.
const ENTRIES: usize = 1 << (47 - SEGMENT_SHIFT);

/// The directory: 0 not mapped yet, 1 refused, else its address.
static DIR: AtomicUsize = AtomicUsize::new(0);

/// The directory's entries, mapped on first use if `make`.
#[inline(always)]
fn directory(make: bool) -> Option<&'static [AtomicUsize; ENTRIES]> {
    let d = DIR.load(Acquire);
    if d > 1 {
        // SAFETY: a mapping of ENTRIES zeroed words, never unmapped.
        return Some(unsafe { &*(d as *const [AtomicUsize; ENTRIES]) });
    }
    if d == 1 || !make {
        return None;
    }
    map_into(&DIR, ENTRIES * 8).map(|d| {
        // SAFETY: as above.
        unsafe { &*(d as *const [AtomicUsize; ENTRIES]) }
    })
}

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
/// bitmap mapped first if `make`.
#[inline(always)]
fn bit(addr: usize, make: bool) -> Option<(&'static AtomicU64, u64)> {
    let entry = directory(make)?.get(addr >> SEGMENT_SHIFT)?;
    let mut w = entry.load(Acquire);
    if w <= 1 {
        if w == 1 || !make {
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

/// Records the block at `addr` freed: true if it was already (freed
/// twice).
#[inline(always)]
pub fn claim(addr: usize) -> bool {
    match bit(addr, true) {
        Some((w, b)) => w.fetch_or(b, Relaxed) & b != 0,
        None => false,
    }
}

/// Whether the block at `addr` is recorded freed.
#[inline(always)]
pub fn is_freed(addr: usize) -> bool {
    bit(addr, false).is_some_and(|(w, b)| w.load(Relaxed) & b != 0)
}

/// Records the block at `addr` live again (just handed out).
#[inline(always)]
pub fn handed_out(addr: usize) {
    if let Some((w, b)) = bit(addr, false) {
        if w.load(Relaxed) & b != 0 {
            w.fetch_and(!b, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_freed_once_until_handed_out_and_its_neighbours_apart() {
        // Addresses in a segment no heap uses (the directory covers every
        // segment): the bits are this test's.
        let base = 0x7e00_0000_0000usize;
        let (a, b) = (base + 4096, base + 4096 + GRANULE);
        assert!(!is_freed(a));
        assert!(!claim(a), "the first free");
        assert!(is_freed(a) && !is_freed(b), "one bit a slot");
        assert!(claim(a), "the second free");
        assert!(!claim(b));
        handed_out(a);
        assert!(!is_freed(a) && is_freed(b));
        assert!(!claim(a), "freed again after its hand-out");
        handed_out(a);
        handed_out(b);
        assert!(!is_freed(a) && !is_freed(b));
    }
}
