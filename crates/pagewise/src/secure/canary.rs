//! The tail word and the canary: how a block of the hardened build says
//! where its requested bytes end, and how a write past them is seen.
//!
//! ```text
//! | requested bytes | canary (8 to 15 bytes) | slack | tail |
//! ```
//!
//! The tail word, the last eight bytes of the usable block, holds the
//! distance from the end of the request to the tail, its halves swapped and
//! encoded with the process's secret and the block's address: the word's
//! low half, which an overflow reaches first, holds the distance's high
//! half, zero in any block below 4 GiB, so a change there decodes to a
//! distance longer than the block. Canary bytes come from the same secret and are
//! never zero, so a string's terminator written one byte too far is caught.
//!
//! The canary is written and checked a word at a time, two words at most:
//! the byte at offset `i` of a block is the pattern's byte `i % 8`, so the
//! canary runs from the request's end to the word boundary after the next
//! one, and the first word (which may hold the request's last bytes) is
//! merged under a mask. A linear overflow writes the canary's first byte
//! first, so a longer canary would only catch writes that skip it; the two
//! words are what a free reads and a wipe clears, on lines the program
//! has just used.

use super::secret_now;
use super::TAIL;
use crate::fault::Misuse;

/// Canary bytes after a request, at most (to the next word boundary past
/// this many): the first of them is what a linear overflow writes first.
const CANARY_MAX: usize = 8;

/// The top bit of every tail word: no valid one is 0 (the wipe's mark of
/// a freed block), nor has its last byte zeroed by a string terminator.
const TOP: usize = 1 << (usize::BITS - 1);

/// What a block at `addr` is checked with: the tail word's mask (never
/// with its top bit clear) and the canary's pattern word (no zero byte).
#[inline(always)]
fn marks(addr: usize) -> (usize, u64) {
    let h = (secret_now() ^ addr).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h | TOP, (h.rotate_left(29) as u64) | 0x0101_0101_0101_0101)
}

/// A word with its halves swapped (its own inverse).
#[inline(always)]
fn swap(x: usize) -> usize {
    x.rotate_left(usize::BITS / 2)
}

/// Where the canary ends in a block of `u` usable bytes holding `size`:
/// a word boundary, at most [`CANARY_MAX`] bytes past the request's last
/// word, never into the tail.
#[inline(always)]
fn canary_end(size: usize, u: usize) -> usize {
    ((size + 7) & !7).saturating_add(CANARY_MAX).min(u - TAIL)
}

/// The bytes a wipe must clear in a block of `u` bytes that held `size`:
/// the request and its canary (the tail word is cleared on its own).
#[inline(always)]
pub fn written(size: usize, u: usize) -> usize {
    canary_end(size, u)
}

/// The mask of the bytes of the word at `size & !7` that belong to the
/// canary (the request owns the ones below `size`).
#[inline(always)]
fn first_mask(size: usize) -> u64 {
    !0u64 << (8 * (size & 7))
}

/// Writes the tail word and the canary of a block of `u` usable bytes at
/// `p` holding a request of `size` bytes. With `keep`, the request's bytes
/// are kept; without, those of its last word below `size` are zeroed (the
/// block's owner has not written them yet, and a zeroed block stays
/// zeroed), so that the canary is only written, not read: reading it first
/// would fault a fresh page in twice, once to read and once to write.
///
/// # Safety
/// `p` is a live block of `u >= size + TAIL` bytes the caller may write,
/// `u` a multiple of 8.
#[inline(always)]
pub unsafe fn arm(p: *mut u8, size: usize, u: usize, keep: bool) {
    debug_assert!(u % 8 == 0 && size + TAIL <= u);
    let (mask, pat) = marks(p as usize);
    let end = canary_end(size, u);
    let mut at = size & !7;
    // SAFETY: the words written lie in [size & !7, end) and the tail, all
    // inside the block (caller); with `keep`, the first one's bytes below
    // `size` are written back as they were.
    unsafe {
        if at < end {
            let w = if keep && size & 7 != 0 {
                word(p, at)
            } else {
                0
            };
            let m = first_mask(size);
            put(p, at, (w & !m) | (pat & m));
            at += 8;
            // Two words at most: `end <= (size & !7) + 16`.
            if at < end {
                put(p, at, pat);
            }
        }
        p.add(u - TAIL)
            .cast::<usize>()
            .write_unaligned(swap(u - TAIL - size) ^ mask);
    }
}

/// The distance a free slot's tail word holds (encoded as a live one's
/// is): longer than any block, so no live tail word is a free one, with a
/// bit set below the top one, so that the top byte stays nonzero too.
const FREE_GAP: usize = 1 << (usize::BITS / 2 - 2);

/// The tail word of a free slot at `addr` (freed, or carved and never
/// handed out): a value the block before it must not change either.
#[inline(always)]
pub fn free_tail(addr: usize) -> usize {
    swap(FREE_GAP) ^ marks(addr).0
}

/// Whether `word`, read at the end of the slot of `u` bytes at `addr`, is
/// a tail word the allocator wrote there: a live block's, a free slot's,
/// or zero (its OS page was purged). Anything else was written by the
/// program: past the end of that slot, or before the start of the next.
#[inline(always)]
pub fn is_tail(addr: usize, u: usize, word: usize) -> bool {
    let mask = marks(addr).0;
    word == 0 || swap(word ^ mask) <= u - TAIL || word == swap(FREE_GAP) ^ mask
}

/// The word at offset `at` of `p`, as the canary's byte order sees it.
///
/// # Safety
/// Eight bytes at `p + at` are readable.
#[inline(always)]
unsafe fn word(p: *const u8, at: usize) -> u64 {
    // SAFETY: per the caller.
    u64::from_le(unsafe { p.add(at).cast::<u64>().read_unaligned() })
}

/// Writes `w` at offset `at` of `p`.
///
/// # Safety
/// Eight bytes at `p + at` are writable.
#[inline(always)]
unsafe fn put(p: *mut u8, at: usize, w: u64) {
    // SAFETY: per the caller.
    unsafe { p.add(at).cast::<u64>().write_unaligned(w.to_le()) }
}

/// Checks the tail word and the canary of a block of `u` usable bytes at
/// `p`: the requested size, or the misuse and the address it was found at.
/// A tail word of 0 is a block the hardened free already wiped (freed
/// twice); any other that does not decode, or a canary byte changed, is a
/// write past the end (the address: the first byte found changed).
///
/// # Safety
/// `p` is a block of `u >= TAIL` bytes the caller may read, `u` a
/// multiple of 8.
#[inline(always)]
pub unsafe fn verify(p: *const u8, u: usize) -> Result<usize, (Misuse, usize)> {
    // SAFETY: the tail word is the block's last TAIL bytes (caller).
    let tail = unsafe { p.add(u - TAIL).cast::<usize>().read_unaligned() };
    let (mask, pat) = marks(p as usize);
    let gap = swap(tail ^ mask);
    if tail == 0 || gap == FREE_GAP {
        // Wiped (a large block) or a free slot's: freed already.
        return Err((Misuse::DoubleFree, p as usize));
    }
    if gap > u - TAIL {
        return Err((Misuse::Overflow, p as usize + (u - TAIL)));
    }
    let size = u - TAIL - gap;
    let end = canary_end(size, u);
    let mut at = size & !7;
    let mut diff = 0u64;
    // SAFETY: the canary's words, inside the block below the tail.
    unsafe {
        if at < end {
            diff = (word(p, at) ^ pat) & first_mask(size);
            at += 8;
            if at < end {
                diff |= word(p, at) ^ pat;
            }
        }
    }
    if diff != 0 {
        // SAFETY: as above.
        return Err((Misuse::Overflow, unsafe {
            first_changed(p, size, end, pat)
        }));
    }
    Ok(size)
}

/// The address of the first canary byte of `p` that does not match.
///
/// # Safety
/// As [`verify`], which found one.
#[cold]
unsafe fn first_changed(p: *const u8, size: usize, end: usize, pat: u64) -> usize {
    let bytes = pat.to_le_bytes();
    (size..end)
        // SAFETY: inside the canary (caller).
        .find(|&i| unsafe { *p.add(i) } != bytes[i % 8])
        .map_or(p as usize + size, |i| p as usize + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test block, 16-byte aligned like every pagewise block.
    #[repr(C, align(16))]
    struct Buf([u8; 512]);

    #[test]
    fn every_byte_of_the_canary_and_the_tail_is_checked() {
        crate::memory::block::init_secret();
        let mut buf = Buf([0; 512]);
        let p = buf.0.as_mut_ptr();
        for u in [16, 32, 48, 112, 160, 512] {
            for size in 0..=u - TAIL {
                // SAFETY (all below): `p` has 512 bytes, u <= 512.
                unsafe {
                    p.write_bytes(0xa5, u);
                    arm(p, size, u, true);
                    assert_eq!(verify(p, u), Ok(size), "u {u} size {size}");
                    assert!(
                        (0..size).all(|i| *p.add(i) == 0xa5),
                        "u {u} size {size}: the request's bytes are kept"
                    );
                    let end = canary_end(size, u);
                    assert!(end >= (size + CANARY_MAX).min(u - TAIL));
                    // The slack is not checked; the tail's high half is checked
                    // only through the canary it would move.
                    for i in (size..end).chain(u - TAIL..u - TAIL / 2) {
                        for v in [0u8, b'x', *p.add(i) ^ 1] {
                            let old = *p.add(i);
                            if v == old {
                                continue;
                            }
                            *p.add(i) = v;
                            let r = verify(p, u);
                            *p.add(i) = old;
                            let at = p as usize + i.min(u - TAIL);
                            assert_eq!(
                                r,
                                Err((Misuse::Overflow, at)),
                                "u {u} size {size} byte {i} = {v:#x}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn canary_bytes_are_never_zero_and_a_wiped_tail_is_a_double_free() {
        crate::memory::block::init_secret();
        let mut buf = Buf([0xa5; 512]);
        let p = buf.0.as_mut_ptr();
        // SAFETY: inside the test's buffer.
        unsafe {
            arm(p, 3, 64, false);
            assert_eq!(&buf.0[..3], [0; 3], "zeroed, not kept");
            p.write_bytes(0xa5, 3);
            arm(p, 3, 64, true);
            assert_eq!(&buf.0[..3], [0xa5; 3], "kept");
            assert!((3..56).all(|i| *p.add(i) != 0));
            p.add(56).cast::<usize>().write(0);
            assert_eq!(verify(p, 64), Err((Misuse::DoubleFree, p as usize)));
        }
    }
}
