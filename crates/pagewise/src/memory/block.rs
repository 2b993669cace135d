//! A free slot: its link, and the key that says it is free.
//!
//! Every free slot, wherever it waits (a thread cache, a page's free list,
//! a remote-free list, a heap's delayed list), holds in its second word a
//! key derived from a per-process secret and its own address; every
//! allocation clears it. A free that finds the key already there is a
//! double free, and aborts ([`crate::fault`]). That is glibc's tcache check,
//! made exact enough to need no confirming scan: a live object holds the
//! key only if the program wrote `secret ^ address` there itself, which it
//! can learn only by reading freed memory (and a copy of a freed slot's
//! bytes elsewhere carries the wrong address). Cost: on a free one load, one
//! compare and one store to the slot's first cache line, which the free
//! writes anyway; on an allocation one store to the line it reads.
//!
//! This is why no slot is smaller than two words (`size_class::MIN_SLOT`).

use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// A free slot, linked through its first word, keyed in its second.
#[repr(C)]
pub struct Block {
    /// Next free slot.
    pub next: *mut Block,
    /// [`key_of`] this slot while it is free; anything else while live.
    key: usize,
}

/// The per-process secret behind every key (0 until the first heap is
/// made; no slot exists before that).
static SECRET: AtomicUsize = AtomicUsize::new(0);

/// Draws the secret, once per process (later calls keep it). Allocates
/// nothing: the kernel's random bytes for the process ([`crate::os::random`]).
pub fn init_secret() {
    if SECRET.load(Relaxed) != 0 {
        return;
    }
    let _ = SECRET.compare_exchange(0, random_word() | 1, Relaxed, Relaxed);
}

#[cfg(not(miri))]
fn random_word() -> usize {
    crate::os::random::random_word()
}

#[cfg(miri)]
fn random_word() -> usize {
    0x9e37_79b9_7f4a_7c15
}

/// The key a free slot at `addr` holds.
#[inline(always)]
fn key_of(addr: usize) -> usize {
    SECRET.load(Relaxed) ^ addr
}

impl Block {
    /// Marks a slot free, returning false (and marking nothing) if it
    /// already was: the caller has a double free.
    ///
    /// # Safety
    /// `block` is a slot of at least two words that the caller may write.
    #[inline(always)]
    pub unsafe fn mark_free(block: *mut Block) -> bool {
        let key = key_of(block as usize);
        // SAFETY: per the caller.
        unsafe {
            if (*block).key == key {
                return false;
            }
            (*block).key = key;
        }
        true
    }

    /// Marks a slot live (about to be handed out).
    ///
    /// # Safety
    /// As [`Block::mark_free`].
    #[inline(always)]
    pub unsafe fn mark_live(block: *mut Block) {
        // SAFETY: per the caller.
        unsafe { (*block).key = 0 };
    }
}
