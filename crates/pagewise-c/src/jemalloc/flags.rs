//! jemalloc's allocation functions with flags: `mallocx`, `rallocx`,
//! `xallocx`, `sallocx`, `dallocx`, `sdallocx`, `nallocx`.
//!
//! Flags: the low six bits are the alignment's base-2 logarithm
//! (`MALLOCX_LG_ALIGN(la)` is `la`, `MALLOCX_ALIGN(a)` is `ffs(a) - 1`; 0
//! is malloc's 16), `MALLOCX_ZERO` (0x40) asks for zeroed memory. The
//! thread-cache and arena bits (`MALLOCX_TCACHE*`, `MALLOCX_ARENA`) are
//! ignored: pagewise has one cache per thread and no arenas to choose.

use core::ffi::{c_int, c_void};
use core::ptr::null_mut;
use pw::c_malloc::MIN_ALIGN;

/// jemalloc's `MALLOCX_ZERO`.
pub const MALLOCX_ZERO: c_int = 0x40;

/// The alignment `flags` ask for (at least 16), or None for one no
/// allocation can have.
fn align_of(flags: c_int) -> Option<usize> {
    match flags & 0x3f {
        0 => Some(MIN_ALIGN),
        lg => 1usize.checked_shl(lg as u32).map(|a| a.max(MIN_ALIGN)),
    }
}

fn zeroed(flags: c_int) -> bool {
    flags & MALLOCX_ZERO != 0
}

/// Largest alignment any block gets (a huge block's, at most 1 TiB).
const ALIGN_MAX: usize = 1 << 40;

/// Zeroes the bytes of `p` from `from` to its usable size.
///
/// # Safety
/// `p` is a live block of at least `from` bytes.
unsafe fn zero_tail(p: *mut c_void, from: usize) {
    // SAFETY: live (caller).
    let to = unsafe { pw::raw::usable_size(p.cast()) };
    if to > from {
        // SAFETY: inside the block's usable bytes.
        unsafe { core::ptr::write_bytes(p.cast::<u8>().add(from), 0, to - from) };
    }
}

/// jemalloc's `mallocx`: `size` bytes with the alignment and zeroing of
/// `flags`; null (`errno = ENOMEM`) on failure. `size` 0 is served as 1.
#[no_mangle]
pub extern "C" fn mallocx(size: usize, flags: c_int) -> *mut c_void {
    let Some(align) = align_of(flags).filter(|&a| a <= ALIGN_MAX) else {
        crate::out::set_errno(libc::ENOMEM);
        return null_mut();
    };
    if !zeroed(flags) {
        // SAFETY: a power of two.
        return unsafe { pw::c_malloc::aligned(size, align) };
    }
    let p = if size > isize::MAX as usize {
        null_mut()
    } else {
        // SAFETY: a power of two.
        unsafe { pw::raw::calloc(size, align) }
    };
    if p.is_null() {
        crate::out::set_errno(libc::ENOMEM);
    }
    p.cast()
}

/// jemalloc's `rallocx`: resizes `ptr` to `size` bytes with the alignment
/// of `flags` (moving it if it is not so aligned); with `MALLOCX_ZERO` the
/// bytes past the old usable size are zero. Null on failure, `ptr` then
/// untouched. A null `ptr` is `mallocx`.
///
/// # Safety
/// `ptr` is null or a live block of this allocator.
#[no_mangle]
pub unsafe extern "C" fn rallocx(ptr: *mut c_void, size: usize, flags: c_int) -> *mut c_void {
    if ptr.is_null() {
        return mallocx(size, flags);
    }
    let align = align_of(flags).filter(|&a| a <= ALIGN_MAX);
    let Some(align) = align.filter(|_| size <= isize::MAX as usize) else {
        crate::out::set_errno(libc::ENOMEM);
        return null_mut();
    };
    // SAFETY: live (caller).
    let old = unsafe { pw::raw::usable_size(ptr.cast()) };
    let p: *mut c_void = if (ptr as usize).is_multiple_of(align) {
        // SAFETY: live; a power of two.
        unsafe { pw::raw::realloc(ptr.cast(), size.max(1), align) }.cast()
    } else {
        // SAFETY: a power of two; the old block is live and distinct.
        unsafe {
            let p = pw::c_malloc::aligned(size, align);
            if !p.is_null() {
                core::ptr::copy_nonoverlapping(ptr.cast::<u8>(), p.cast(), old.min(size));
                pw::raw::free(ptr.cast());
            }
            p
        }
    };
    if p.is_null() {
        crate::out::set_errno(libc::ENOMEM);
    } else if zeroed(flags) {
        // SAFETY: live; it holds the old contents up to `old`.
        unsafe { zero_tail(p, old) };
    }
    p
}

/// jemalloc's `xallocx`: resizes `ptr` in place only, to at least `size`
/// and at most `size + extra` bytes if it can, and returns its usable size
/// after (the old one when it could not). Large blocks (256 KiB to 32 MiB)
/// of the calling thread grow and shrink in place; a block whose usable
/// size is already in range stays as it is. With `MALLOCX_ZERO` bytes it
/// grew by are zero.
///
/// # Safety
/// `ptr` is a live block of this allocator.
#[no_mangle]
pub unsafe extern "C" fn xallocx(
    ptr: *mut c_void,
    size: usize,
    extra: usize,
    flags: c_int,
) -> usize {
    // SAFETY: live (caller).
    let old = unsafe { pw::raw::usable_size(ptr.cast()) };
    let most = size.saturating_add(extra);
    let aligned = align_of(flags).is_some_and(|a| (ptr as usize).is_multiple_of(a));
    if !aligned || (size..=most).contains(&old) {
        return old;
    }
    // SAFETY (each): live (caller).
    let resized = |n| unsafe { pw::raw::resize_in_place(ptr.cast(), n) };
    if old > most || !resized(most) {
        resized(size.max(old.min(most)));
    }
    if zeroed(flags) {
        // SAFETY: live; its first `old` bytes are the caller's.
        unsafe { zero_tail(ptr, old) };
    }
    // SAFETY: live.
    unsafe { pw::raw::usable_size(ptr.cast()) }
}

/// jemalloc's `sallocx`: the usable size of `ptr` (`malloc_usable_size`).
///
/// # Safety
/// `ptr` is a live block of this allocator.
#[no_mangle]
pub unsafe extern "C" fn sallocx(ptr: *const c_void, _flags: c_int) -> usize {
    // SAFETY: live (caller).
    unsafe { pw::raw::usable_size(ptr.cast()) }
}

/// jemalloc's `dallocx`: frees `ptr` (`free`).
///
/// # Safety
/// `ptr` is a live block of this allocator.
#[no_mangle]
pub unsafe extern "C" fn dallocx(ptr: *mut c_void, _flags: c_int) {
    // SAFETY: live (caller).
    unsafe { pw::c_malloc::free(ptr) };
}

/// jemalloc's `sdallocx`: frees `ptr`, a block of `size` bytes (a debug
/// build of the library aborts with one line when `size` is larger than
/// the block).
///
/// # Safety
/// `ptr` is a live block of this allocator.
#[no_mangle]
pub unsafe extern "C" fn sdallocx(ptr: *mut c_void, size: usize, _flags: c_int) {
    // SAFETY: live (caller).
    unsafe {
        pw::c_malloc::check_size(ptr, size, b"sdallocx");
        pw::c_malloc::free(ptr)
    }
}

/// jemalloc's `nallocx`: the usable size `mallocx(size, flags)` would
/// give, without allocating; 0 for a request no allocation can serve.
#[no_mangle]
pub extern "C" fn nallocx(size: usize, flags: c_int) -> usize {
    match align_of(flags) {
        Some(align) if align <= ALIGN_MAX && size <= isize::MAX as usize / 2 => {
            pw::raw::good_size(size, align)
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_give_the_alignment_jemalloc_means() {
        assert_eq!(align_of(0), Some(16));
        assert_eq!(align_of(MALLOCX_ZERO), Some(16));
        assert_eq!(align_of(3), Some(16), "8 is less than malloc's 16");
        assert_eq!(align_of(12 | MALLOCX_ZERO | 0x300), Some(4096));
        assert_eq!(align_of(63), Some(1 << 63));
        assert!(zeroed(MALLOCX_ZERO | 5) && !zeroed(5));
    }
}
