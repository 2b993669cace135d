//! Wiping freed blocks, and seeing writes to them.
//!
//! The hardened free zeroes a block's first [`WIPE_MAX`] bytes and its
//! tail word, then marks the block with a word at offset 16 made from the
//! secret, its address and its size (the first two words are the free
//! lists' link and key, which the heap writes after). The allocation that
//! hands the slot out again finds the mark and checks that the wiped bytes
//! are still zero: a write after free is reported there, with the address
//! written. A slot without the mark (carved fresh, or its OS page purged
//! meanwhile) is not checked; a mark made for another size (a page remade
//! for another class) does not match.

use crate::fault::{misuse, Misuse};
use crate::memory::block::secret;

/// Bytes wiped at each free, and checked at the next allocation: all of
/// a block up to this size (every slot of the small classes, to 4 KiB),
/// the first part of bigger ones (their tail word is wiped too).
const WIPE_MAX: usize = 4096;

/// Where the mark is: past the link and the key.
const MARK_AT: usize = 16;

/// The mark of a wiped block of `u` bytes at `addr`.
fn mark(addr: usize, u: usize) -> usize {
    (secret() ^ addr ^ u.rotate_left(40)).wrapping_mul(0xc2b2_ae3d_27d4_eb4f) | 1
}

/// Wipes a block of `u` usable bytes at `p` that is being freed.
///
/// # Safety
/// `p` is a live block of `u >= 16` bytes the caller may write.
pub unsafe fn wipe(p: *mut u8, u: usize) {
    // SAFETY: inside the block (caller).
    unsafe {
        core::ptr::write_bytes(p, 0, u.min(WIPE_MAX));
        if u > WIPE_MAX {
            p.add(u - super::TAIL).cast::<usize>().write_unaligned(0);
        }
        if u >= MARK_AT + 16 {
            p.add(MARK_AT)
                .cast::<usize>()
                .write_unaligned(mark(p as usize, u));
        }
    }
}

/// For a block of `u` usable bytes at `p` just handed out: if the hardened
/// free wiped it, aborts if it was written since; then clears the words
/// the heap and the wipe left in it.
///
/// # Safety
/// As [`wipe`].
pub unsafe fn check_unwritten(p: *mut u8, u: usize) {
    // SAFETY: inside the block (caller).
    unsafe {
        if u >= MARK_AT + 16
            && p.add(MARK_AT).cast::<usize>().read_unaligned() == mark(p as usize, u)
        {
            let end = u.min(WIPE_MAX);
            let mut i = MARK_AT + 8;
            while i + 8 <= end {
                if p.add(i).cast::<u64>().read_unaligned() != 0 {
                    misuse(Misuse::WriteAfterFree, first_nonzero(p, i));
                }
                i += 8;
            }
            for j in i..end {
                if *p.add(j) != 0 {
                    misuse(Misuse::WriteAfterFree, p as usize + j);
                }
            }
        }
        core::ptr::write_bytes(p, 0, u.min(MARK_AT + 8));
    }
}

/// The address of the first non-zero byte of the word at `p + i`.
///
/// # Safety
/// The word is readable.
unsafe fn first_nonzero(p: *mut u8, i: usize) -> usize {
    // SAFETY: per the caller.
    let k = (0..8).find(|&k| unsafe { *p.add(i + k) } != 0).unwrap_or(0);
    p as usize + i + k
}
