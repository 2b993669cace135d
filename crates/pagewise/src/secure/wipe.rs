//! Wiping freed blocks.
//!
//! The hardened free zeroes what the block's owner could have written
//! there, its request and the canary after it, up to [`WIPE_MAX`] bytes,
//! and its tail word (the heap writes the free lists' link and key after);
//! the allocation that hands it out again clears the link: the next owner
//! never sees the last one's bytes there, and a second free of a large
//! block finds the tail word zero (`canary.rs`).
//!
//! Bigger blocks keep their bytes past the first [`WIPE_MAX`]: zeroing a
//! 64 MiB block of which the program touched a page would bring all of it
//! into memory, and the bytes past what the program wrote are cost with no
//! secret in them.

/// Bytes wiped at each free, at most: a block's first OS page.
pub const WIPE_MAX: usize = 4096;

/// The words the heap keeps in a free slot (its link and its key).
const LINKS: usize = 16;

/// Wipes a block of `u` usable bytes at `p` that held a request of `size`
/// bytes and is being freed.
///
/// # Safety
/// `p` is a live block of `u >= size + TAIL` bytes (`u >= 16`) the caller
/// may write, armed for `size` (`canary::arm`).
#[inline(always)]
pub unsafe fn wipe(p: *mut u8, size: usize, u: usize) {
    let n = super::canary::written(size, u).min(WIPE_MAX);
    // SAFETY: inside the block, below its tail word (caller).
    unsafe {
        zero(p, n);
        p.add(u - super::TAIL).cast::<usize>().write_unaligned(0);
    }
}

/// Zeroes `n >= 8` bytes at `p`: up to 64 with a few overlapping stores in
/// line (most blocks are small), beyond with `memset`.
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
            core::ptr::write_bytes(p, 0, n);
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
/// link and key, which would tell the program where other blocks are).
///
/// # Safety
/// `p` is a live block of `u` bytes the caller may write.
#[inline(always)]
pub unsafe fn clear_links(p: *mut u8, u: usize) {
    // SAFETY: inside the block (caller). Only a guarded block
    // (`crate::guard`) can be shorter than the two words.
    unsafe {
        if u >= LINKS {
            p.cast::<[usize; 2]>().write_unaligned([0; 2]);
        } else {
            core::ptr::write_bytes(p, 0, u);
        }
    }
}
