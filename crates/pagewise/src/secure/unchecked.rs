//! The allocator's own fills and copies inside blocks, past the hardened
//! C library's checked `memset` and `memcpy`.
//!
//! Rust lowers `write_bytes` and `copy_nonoverlapping` to calls of
//! `memset` and `memcpy`, and in the hardened C library those names are
//! its own checked versions, which look the destination's block up again
//! (the wipe of every freed block, `calloc`'s zeroing, `realloc`'s copy:
//! writes the allocator knows to be inside the block). The library gives
//! the C library's own functions here when it loads ([`set`]); until
//! then, and in the Rust crate, the plain Rust calls are used.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// C's `memset`.
pub type Fill = unsafe extern "C" fn(*mut c_void, c_int, usize) -> *mut c_void;
/// C's `memcpy`.
pub type Copy = unsafe extern "C" fn(*mut c_void, *const c_void, usize) -> *mut c_void;

/// The unchecked functions, 0 until [`set`].
static MEMSET: AtomicUsize = AtomicUsize::new(0);
static MEMCPY: AtomicUsize = AtomicUsize::new(0);

/// Makes [`zero`] and [`copy`] call `memset` and `memcpy`.
pub fn set(memset: Fill, memcpy: Copy) {
    MEMSET.store(memset as usize, Relaxed);
    MEMCPY.store(memcpy as usize, Relaxed);
}

/// Zeroes `n` bytes at `p`.
///
/// # Safety
/// `n` bytes at `p` are writable.
#[inline(always)]
pub unsafe fn zero(p: *mut u8, n: usize) {
    match MEMSET.load(Relaxed) {
        // SAFETY: per the caller.
        0 => unsafe { core::ptr::write_bytes(p, 0, n) },
        // SAFETY: a C `memset` ([`set`]); `n` writable bytes (caller).
        f => unsafe {
            core::mem::transmute::<usize, Fill>(f)(p.cast(), 0, n);
        },
    }
}

/// Copies `n` bytes from `src` to `dst`.
///
/// # Safety
/// As `core::ptr::copy_nonoverlapping`.
#[inline(always)]
pub unsafe fn copy(src: *const u8, dst: *mut u8, n: usize) {
    match MEMCPY.load(Relaxed) {
        // SAFETY: per the caller.
        0 => unsafe { core::ptr::copy_nonoverlapping(src, dst, n) },
        // SAFETY: a C `memcpy` ([`set`]); the regions (caller).
        f => unsafe {
            core::mem::transmute::<usize, Copy>(f)(dst.cast(), src.cast(), n);
        },
    }
}
