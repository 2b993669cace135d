//! The tail word and the canary: how a block of the hardened build says
//! where its requested bytes end, and how a write past them is seen.
//!
//! ```text
//! | requested bytes | canary (up to CANARY_MAX bytes) | slack | tail |
//! ```
//!
//! The tail word, the last eight bytes of the usable block, holds the
//! distance from the end of the request to the tail, encoded with the
//! process's secret and the block's address: a value an overflow writes
//! there decodes to a distance longer than the block, or to one whose
//! canary does not match. Canary bytes come from the same secret and are
//! never zero, so a string's terminator written one byte too far is caught.

use super::TAIL;
use crate::fault::{misuse, Misuse};
use crate::memory::block::secret;

/// Canary bytes written and checked after a request (the first of them is
/// what a linear overflow writes first; the rest catch short skips).
const CANARY_MAX: usize = 64;

/// What a tail word is XORed with: secret, per address, never with its top
/// bit clear, so that no valid tail word is 0 (the wipe's mark of a freed
/// block).
fn mask(addr: usize) -> usize {
    (secret() ^ addr).wrapping_mul(0x9e37_79b9_7f4a_7c15) | (1 << (usize::BITS - 1))
}

/// The canary's bytes for the block at `addr`, by offset modulo 8.
fn pattern(addr: usize) -> [u8; 8] {
    let w = (secret() ^ addr.rotate_left(29)).wrapping_mul(0xff51_afd7_ed55_8ccd) as u64;
    (w | 0x0101_0101_0101_0101).to_le_bytes()
}

/// Writes the tail word and the canary of a block of `u` usable bytes at
/// `p` holding a request of `size` bytes.
///
/// # Safety
/// `p` is a live block of `u >= size + TAIL` bytes the caller may write.
pub unsafe fn arm(p: *mut u8, size: usize, u: usize) {
    let gap = u - TAIL - size;
    let pat = pattern(p as usize);
    // SAFETY: the canary lies in [size, u - TAIL), the tail in the last
    // TAIL bytes, all inside the block (caller).
    unsafe {
        for i in size..size + gap.min(CANARY_MAX) {
            *p.add(i) = pat[i % 8];
        }
        p.add(u - TAIL)
            .cast::<usize>()
            .write_unaligned(gap ^ mask(p as usize));
    }
}

/// Clears the canary and the tail word (before a realloc copies the block).
///
/// # Safety
/// As [`arm`], with the `size` it was armed with.
pub unsafe fn disarm(p: *mut u8, size: usize, u: usize) {
    // SAFETY: [size, u) is the block's own (caller).
    unsafe { core::ptr::write_bytes(p.add(size), 0, u - size) };
}

/// Checks the tail word and the canary of a block of `u` usable bytes at
/// `p`, returning the requested size. Aborts: a tail word of 0 is a block
/// the hardened free already wiped (freed twice); any other that does not
/// decode, or a canary byte changed, is a write past the end.
///
/// # Safety
/// `p` is a block of `u >= TAIL` bytes the caller may read.
pub unsafe fn check(p: *mut u8, u: usize) -> usize {
    // SAFETY: the tail word is the block's last TAIL bytes (caller).
    let word = unsafe { p.add(u - TAIL).cast::<usize>().read_unaligned() };
    if word == 0 {
        misuse(Misuse::DoubleFree, p as usize);
    }
    let gap = word ^ mask(p as usize);
    if gap > u - TAIL {
        misuse(Misuse::Overflow, p as usize + (u - TAIL));
    }
    let size = u - TAIL - gap;
    let pat = pattern(p as usize);
    for i in size..size + gap.min(CANARY_MAX) {
        // SAFETY: inside the block, below the tail.
        if unsafe { *p.add(i) } != pat[i % 8] {
            misuse(Misuse::Overflow, p as usize + i);
        }
    }
    size
}
