//! The hardened build's link encoding: a free slot's link is stored as
//! `(next ^ slot ^ key) * ODD`, with `key` from the per-process secret and
//! `slot` the slot's own address, and decoded by the inverse. A decoded
//! link must be a 16-byte-aligned address below 2^48 (or null): a write
//! after free that changes any bit of the stored word decodes to one with a
//! low bit set (a change whose lowest bit is among the four lowest), or
//! with a high bit set (a change above bit 47: the multiplication carries
//! it upward), or to a value whose high bits are those of the product,
//! which pass the check once in 65,536. The slot is then reported as a
//! corrupted free list, rather than handed out at an address the write
//! chose (`Block::next`).

use crate::memory::block::SECRET;
use core::sync::atomic::Ordering::Relaxed;

/// The multiplier (odd, so invertible modulo 2^64).
const ODD: usize = 0x9e37_79b9_7f4a_7c15;

/// `ODD`'s inverse modulo 2^64 (Newton's iteration doubles the correct
/// low bits each step: 3, 6, 12, 24, 48, 96).
const INV: usize = {
    let mut x = ODD;
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2usize.wrapping_sub(ODD.wrapping_mul(x)));
        i += 1;
    }
    x
};
const _: () = assert!(ODD.wrapping_mul(INV) == 1);

/// Bits no decoded link may have: the four low ones (slots are 16-byte
/// aligned) and those above 47 (user addresses).
const INVALID: usize = 0xffff_0000_0000_000f;

/// The key: the secret's halves swapped, so that it differs from the
/// free keys' secret (a link is not a key XORed with an address).
#[inline(always)]
fn key() -> usize {
    SECRET.load(Relaxed).rotate_left(usize::BITS / 2)
}

/// The stored form of a link to `next` in the slot at `at`.
#[inline(always)]
pub fn encode(at: usize, next: usize) -> usize {
    (next ^ at ^ key()).wrapping_mul(ODD)
}

/// The link stored as `word` in the slot at `at`, or `None` if the word
/// was not written by [`encode`] for this slot.
#[inline(always)]
pub fn decode(at: usize, word: usize) -> Option<usize> {
    let next = word.wrapping_mul(INV) ^ at ^ key();
    (next & INVALID == 0).then_some(next)
}
