//! Blocks of zero bytes that fault when touched: the hardened build's
//! `malloc(0)`.
//!
//! A C `malloc(0)` must return a unique pointer (or null), which the
//! program may pass to `free` and `realloc` but never read or write
//! through. Here it is an address in a reservation no byte of which is
//! accessible ([`crate::os::guard_pages`]), 16 bytes from the next, so any
//! access faults at once. A bitmap in a mapping of its own says which are
//! live: a zero-byte block freed twice is reported, and an address is
//! handed out again only after the search has gone round every other one
//! (the oldest freed first, as a quarantine would). Linux only (elsewhere
//! `malloc(0)` is a 16-byte slot, as in the default build).

use core::sync::atomic::{AtomicUsize, Ordering::*};

/// Zero-byte blocks live at once, at most (16 MiB of address space, and a
/// 128 KiB bitmap, mapped on the first `malloc(0)`).
const BLOCKS: usize = 1 << 20;
/// Bytes between two blocks' addresses (the C alignment of `malloc`).
const STRIDE: usize = 16;
const WORDS: usize = BLOCKS / 64;

/// The reservation's base (0: not made yet; 1: the OS refused).
static BASE: AtomicUsize = AtomicUsize::new(0);
/// The bitmap of live blocks (valid once `BASE` is set).
static BITS: AtomicUsize = AtomicUsize::new(0);
/// The bitmap word the next search starts at.
static CURSOR: AtomicUsize = AtomicUsize::new(0);

/// The reservation and its bitmap, made on first use; None if the OS
/// refused (then `malloc(0)` takes the usual path).
fn region() -> Option<(usize, *const AtomicUsize)> {
    let base = BASE.load(Acquire);
    if base > 1 {
        return Some((base, BITS.load(Relaxed) as *const AtomicUsize));
    }
    if base == 1 {
        return None;
    }
    make_region()
}

#[cold]
fn make_region() -> Option<(usize, *const AtomicUsize)> {
    #[cfg(target_os = "linux")]
    {
        use crate::os::guard_pages;
        let made = guard_pages::reserve(BLOCKS * STRIDE, false).and_then(|(base, _)| {
            let bits = guard_pages::map_records(WORDS * 8)?;
            Some((base, bits))
        });
        let Some((base, bits)) = made else {
            let _ = BASE.compare_exchange(0, 1, Relaxed, Relaxed);
            return None;
        };
        // Two threads may race here: the loser's mappings stay unused (the
        // bitmap must be published before the base that says it is there).
        if BASE.load(Acquire) == 0 {
            BITS.store(bits, Relaxed);
            if BASE.compare_exchange(0, base, Release, Acquire).is_ok() {
                return Some((base, bits as *const AtomicUsize));
            }
        }
        region()
    }
    #[cfg(not(target_os = "linux"))]
    {
        BASE.store(1, Relaxed);
        None
    }
}

/// A zero-byte block that faults when touched; null if none is left or the
/// OS refused the reservation.
pub fn alloc() -> *mut u8 {
    let Some((base, bits)) = region() else {
        return core::ptr::null_mut();
    };
    let start = CURSOR.load(Relaxed);
    for k in 0..WORDS {
        let i = (start + k) % WORDS;
        // SAFETY: the bitmap holds WORDS words.
        let word = unsafe { &*bits.add(i) };
        let mut w = word.load(Relaxed);
        while w != !0 {
            let bit = (!w).trailing_zeros() as usize;
            let old = word.fetch_or(1 << bit, Relaxed);
            if old & (1 << bit) == 0 {
                CURSOR.store(i, Relaxed);
                return (base + (i * 64 + bit) * STRIDE) as *mut u8;
            }
            w = old | (1 << bit);
        }
    }
    core::ptr::null_mut()
}

/// Whether `p` is a zero-byte block's address (live or not).
#[inline]
pub fn owns(p: *const u8) -> bool {
    let base = BASE.load(Relaxed);
    base > 1 && (p as usize).wrapping_sub(base) < BLOCKS * STRIDE
}

/// Frees the zero-byte block `p` (which [`owns`] says is one): aborts if
/// it is not a block's address, or is free already.
pub fn free(p: *const u8) {
    let Some((base, bits)) = region() else {
        return;
    };
    let off = p as usize - base;
    if off % STRIDE != 0 {
        crate::fault::misuse(crate::fault::Misuse::Misaligned, p as usize);
    }
    let (i, bit) = (off / STRIDE / 64, off / STRIDE % 64);
    // SAFETY: `off` is inside the reservation (`owns`), so `i < WORDS`.
    let old = unsafe { &*bits.add(i) }.fetch_and(!(1 << bit), Relaxed);
    if old & (1 << bit) == 0 {
        crate::fault::misuse(crate::fault::Misuse::DoubleFree, p as usize);
    }
}
