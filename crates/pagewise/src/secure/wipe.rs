//! Wiping freed blocks, and checking them when they are handed out again.
//!
//! The hardened free zeroes what the block's owner could have written
//! there, its request and the canary after it, up to [`WIPE_MAX`] bytes,
//! and its tail word (a free slot's, `canary::free_tail`; 0 in a large
//! block); the heap writes the free lists' link and key over
//! the first two words after. In a slot of a slab page (up to 256 KiB) big
//! enough, the third word then gets a mark: how many bytes the free
//! zeroed, encoded with the secret and the slot's address. When the slot
//! is handed out again, those bytes past the mark must still be zero: a
//! write after free is reported then, at the first byte found changed, and
//! the next owner never sees the last one's bytes.
//!
//! A slot carved fresh has no mark (its third word is cleared where it is
//! carved, `Block::mark_carved`), so memory an earlier use of the span
//! left is never checked; a mark a write after free changed is reported
//! too. Slots on purged OS pages read back zero or keep what the free
//! left, both of which pass.
//!
//! Large and huge blocks are not checked here: their first [`WIPE_MAX`]
//! bytes are zeroed, and the block is made inaccessible while its span is
//! kept (`fence::shut`), so a write after free faults at the access; once
//! the span goes back to the heap nothing marks it: the same address comes
//! back as a slab page, or a block of another size, whose bytes another
//! owner wrote meanwhile, and a mark left there could not tell those apart
//! from a write after free. Bytes past the first [`WIPE_MAX`] are not wiped:
//! zeroing a 64 MiB block of which the program touched a page would bring
//! all of it into memory.

use super::canary::Keys;
use super::TAIL;
use crate::memory::size_class::SMALL_MAX;

/// Bytes wiped at each free, at most: a block's first OS page.
pub const WIPE_MAX: usize = 4096;

/// The words the heap keeps in a free slot (its link and its key).
const LINKS: usize = 16;

/// Where a freed slot's mark lies: right after the heap's words.
const MARK_AT: usize = LINKS;

/// Slots that hold a mark and a free slot's tail word: from 32 bytes (a
/// 16-byte slot is all link and key).
pub const MARKED_MIN: usize = 32;

/// The mark of a slot with keys `keys`, zeroed to `n` bytes: `n`'s halves
/// swapped (its high half, zero, where a byte changed most likely lands)
/// and encoded with the slot's mark mask (secret, per address, never
/// with its top bit clear: no mark is 0, a fresh slot's).
#[inline(always)]
fn mark(keys: Keys, n: usize) -> usize {
    n.rotate_left(usize::BITS / 2) ^ keys.mark_mask()
}

/// Wipes a block of `u` usable bytes at `p` that held a request of `size`
/// bytes and is being freed, and marks it if it is a slot big enough.
///
/// # Safety
/// `p` is a live block of `u > size` bytes (`u >= 16`) the caller may
/// write, armed for `size` (`canary::arm_keyed`); `keys` are `Keys::of(p)`.
#[inline(always)]
pub unsafe fn wipe(p: *mut u8, size: usize, u: usize, keys: Keys) {
    // SAFETY: forwarded.
    unsafe { wipe_written(p, super::canary::written(size, u), u, keys) }
}

/// [`wipe`] of a block whose owner could have written its first
/// `written` bytes (`canary::written`, which the free's check found).
///
/// # Safety
/// As [`wipe`]; `written` is `canary::written(size, u)`.
#[inline(always)]
pub unsafe fn wipe_written(p: *mut u8, written: usize, u: usize, keys: Keys) {
    // At least past the mark's word where there is one (a block of 32
    // bytes or more has `u - TAIL >= MARK_AT + 8`), never into the tail.
    let n = written.max(MARK_AT + 8).min(u - TAIL).min(WIPE_MAX);
    // SAFETY: inside the block, below its tail word (caller); in a block
    // that gets a mark, the mark lies in the zeroed bytes.
    unsafe {
        zero(p, n);
        if (MARKED_MIN..=SMALL_MAX).contains(&u) {
            // A slot's tail word guards the next slot's start too (in a
            // 16-byte slot, it is where the heap writes the slot's key).
            p.add(u - TAIL)
                .cast::<usize>()
                .write_unaligned(keys.free_tail());
            let m = mark(keys, n);
            p.add(MARK_AT).cast::<usize>().write_unaligned(m);
        } else {
            p.add(u - TAIL).cast::<usize>().write_unaligned(0);
        }
    }
}

/// What a slot of `u` bytes at `p` carved fresh gets: no mark (its third
/// word cleared), and a free slot's tail word (from 32 bytes: a 16-byte
/// slot's last word is its key).
///
/// # Safety
/// `p` is a slot of `u` bytes the caller may write.
#[inline(always)]
pub unsafe fn carved(p: *mut u8, u: usize) {
    // SAFETY: inside the slot (caller). A 16-byte slot is all link and
    // key.
    unsafe {
        if u >= MARKED_MIN {
            p.add(MARK_AT).cast::<usize>().write_unaligned(0);
            let tail = super::canary::free_tail(p as usize);
            p.add(u - TAIL).cast::<usize>().write_unaligned(tail);
        }
    }
}

/// Checks a slot of `u` bytes at `p` about to be handed out again: the
/// bytes its free zeroed past the mark are still zero, and so is the mark
/// or it decodes. The address of the first byte found changed if not.
///
/// # Safety
/// `p` is a free slot of a slab page, of `u` bytes the caller may read,
/// just taken off a free list (its first two words are the heap's);
/// `keys` are `Keys::of(p)`.
#[inline(always)]
pub unsafe fn check_freed(p: *const u8, u: usize, keys: Keys) -> Result<(), usize> {
    if u < MARKED_MIN {
        return Ok(());
    }
    // SAFETY: inside the slot (caller).
    let w = unsafe { p.add(MARK_AT).cast::<usize>().read_unaligned() };
    if w == 0 {
        return Ok(()); // carved fresh: nothing was zeroed
    }
    let n = mark(keys, 0) ^ w;
    let n = n.rotate_left(usize::BITS / 2);
    if n > u - TAIL || n < MARK_AT + 8 || n % 8 != 0 {
        return Err(p as usize + MARK_AT);
    }
    // SAFETY: the words from the mark's end to `n <= u - TAIL`, inside the
    // slot; the slot is 16-byte aligned and `n` a multiple of 8.
    let words = unsafe {
        core::slice::from_raw_parts(p.add(MARK_AT + 8).cast::<u64>(), (n - MARK_AT - 8) / 8)
    };
    if or_all(words) == 0 {
        return Ok(());
    }
    // SAFETY: as above.
    let first = (MARK_AT + 8..n).find(|&i| unsafe { *p.add(i) } != 0);
    Err(p as usize + first.unwrap_or(MARK_AT + 8))
}

/// The OR of `words`: up to four (most slots' zeroed bytes) with four
/// loads that overlap, no loop; beyond, on x86-64, 32 bytes a step in two
/// SSE2 registers (part of the baseline instruction set), elsewhere a word
/// at a time.
#[inline(always)]
fn or_all(words: &[u64]) -> u64 {
    let n = words.len();
    if n <= 4 {
        if n == 0 {
            return 0;
        }
        // SAFETY: each index is below `n` (0, 1 if `n > 1`, `n - 2` or 0,
        // `n - 1`): together every word of the four or fewer.
        return unsafe {
            *words.get_unchecked(0)
                | *words.get_unchecked((n > 1) as usize)
                | *words.get_unchecked(n.saturating_sub(2))
                | *words.get_unchecked(n - 1)
        };
    }
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_or_si128, _mm_setzero_si128};
        let steps = words.len() / 4;
        let q = words.as_ptr().cast::<__m128i>();
        // SAFETY: SSE2 is part of x86-64; the loads read the first
        // `4 * steps` words of `words`, 16 bytes each (unaligned loads).
        let lanes: [u64; 2] = unsafe {
            let (mut a, mut b) = (_mm_setzero_si128(), _mm_setzero_si128());
            for i in 0..steps {
                a = _mm_or_si128(a, _mm_loadu_si128(q.add(2 * i)));
                b = _mm_or_si128(b, _mm_loadu_si128(q.add(2 * i + 1)));
            }
            core::mem::transmute(_mm_or_si128(a, b))
        };
        words[4 * steps..]
            .iter()
            .fold(lanes[0] | lanes[1], |d, &w| d | w)
    }
    #[cfg(not(target_arch = "x86_64"))]
    words.iter().fold(0, |d, &w| d | w)
}

/// Zeroes `n >= 8` bytes at `p`: up to 64 with a few overlapping stores in
/// line (most blocks are small), beyond with the C library's `memset`
/// (`unchecked.rs`).
///
/// # Safety
/// `n` bytes at `p` are writable.
#[inline(always)]
unsafe fn zero(p: *mut u8, n: usize) {
    debug_assert!(n >= 8);
    type W = [u64; 2];
    // SAFETY: each store lies in [p, p + n) (caller).
    unsafe {
        if n > 64 {
            super::unchecked::zero(p, n);
        } else if n > 32 {
            p.cast::<W>().write_unaligned([0; 2]);
            p.add(16).cast::<W>().write_unaligned([0; 2]);
            p.add(n - 32).cast::<W>().write_unaligned([0; 2]);
            p.add(n - 16).cast::<W>().write_unaligned([0; 2]);
        } else if n >= 16 {
            p.cast::<W>().write_unaligned([0; 2]);
            p.add(n - 16).cast::<W>().write_unaligned([0; 2]);
        } else {
            p.cast::<u64>().write_unaligned(0);
            p.add(n - 8).cast::<u64>().write_unaligned(0);
        }
    }
}

/// Clears what the heap left in a block just handed out (the free lists'
/// link and key, which would tell the program where other blocks are, and
/// a slot's mark).
///
/// # Safety
/// `p` is a live block of `u` bytes the caller may write.
#[inline(always)]
pub unsafe fn clear_links(p: *mut u8, u: usize) {
    // SAFETY: inside the block (caller). Only a guarded block
    // (`crate::guard`) can be shorter than the two words.
    unsafe {
        if u >= MARKED_MIN {
            p.cast::<[usize; 3]>().write_unaligned([0; 3]);
        } else if u >= LINKS {
            p.cast::<[usize; 2]>().write_unaligned([0; 2]);
        } else {
            core::ptr::write_bytes(p, 0, u);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_counts_in_the_or_at_every_length() {
        for n in 0..40 {
            let mut w = vec![0u64; n];
            assert_eq!(or_all(&w), 0, "{n} zero words");
            for i in 0..n {
                for bit in [0, 17, 63] {
                    w[i] = 1 << bit;
                    assert_eq!(or_all(&w), 1 << bit, "{n} words, word {i} bit {bit}");
                    w[i] = 0;
                }
            }
        }
    }
}
