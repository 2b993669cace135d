//! What glibc and C23 add to the family beyond plain aliases: sized frees,
//! whose size debug builds check, and `malloc_good_size` (the usable size
//! a request gets, as macOS's `malloc_good_size` and jemalloc's `nallocx`
//! answer). glibc's internal `__libc_*` names and `cfree` are plain aliases,
//! given in [`crate::export_c_malloc`].

use super::standard::{free, MIN_ALIGN};
use core::ffi::c_void;

/// Checks a size given back with a block (debug builds only, as the Rust
/// `dealloc` path does not check it either): larger than the block is
/// misuse, one line on stderr and an abort. `what` names the call.
///
/// # Safety
/// `ptr` is null or a live block of this allocator.
///
/// ```
/// let p = pagewise::c_malloc::malloc(100);
/// // SAFETY: a live block, freed once.
/// unsafe {
///     pagewise::c_malloc::check_size(p, 100, b"sized delete");
///     pagewise::c_malloc::free(p);
/// }
/// ```
#[inline(always)]
pub unsafe fn check_size(ptr: *mut c_void, size: usize, what: &[u8]) {
    #[cfg(debug_assertions)]
    if !ptr.is_null() {
        // SAFETY: a live block (caller).
        let usable = unsafe { crate::raw::usable_size(ptr.cast()) };
        if size > usable {
            wrong_size(ptr as usize, size, what);
        }
    }
    let _ = (ptr, size, what);
}

#[cfg(debug_assertions)]
#[cold]
fn wrong_size(addr: usize, size: usize, what: &[u8]) -> ! {
    let (mut hex, mut digits) = ([0u8; 18], [0u8; 20]);
    crate::fault::report_and_abort(&[
        b"pagewise: ",
        what,
        b" of ",
        crate::fault::decimal(size, &mut digits),
        b" bytes, larger than the block: ",
        crate::fault::hex(addr, &mut hex),
        b"\n",
    ])
}

/// C23 `free_sized`: frees `ptr`, a block of `size` bytes from `malloc`,
/// `calloc` or `realloc` (pagewise finds the size itself; debug builds
/// check it).
///
/// # Safety
/// `ptr` is null or a live block of this allocator.
///
/// ```
/// let p = pagewise::c_malloc::malloc(40);
/// // SAFETY: a live block of 40 bytes, freed once.
/// unsafe { pagewise::c_malloc::free_sized(p, 40) };
/// ```
#[inline]
pub unsafe fn free_sized(ptr: *mut c_void, size: usize) {
    // SAFETY: forwarded.
    unsafe {
        check_size(ptr, size, b"free_sized");
        free(ptr)
    }
}

/// C23 `free_aligned_sized`: frees `ptr`, a block of `size` bytes from
/// `aligned_alloc(align, size)` (debug builds check the size).
///
/// # Safety
/// `ptr` is null or a live block of this allocator.
///
/// ```
/// let p = pagewise::c_malloc::aligned_alloc(64, 40);
/// // SAFETY: a live block of 40 bytes, freed once.
/// unsafe { pagewise::c_malloc::free_aligned_sized(p, 64, 40) };
/// ```
#[inline]
pub unsafe fn free_aligned_sized(ptr: *mut c_void, _align: usize, size: usize) {
    // SAFETY: forwarded.
    unsafe {
        check_size(ptr, size, b"free_aligned_sized");
        free(ptr)
    }
}

/// `malloc_good_size`: the usable size `malloc(size)` would give, the slot
/// size of its class or whole slices or pages for large and huge blocks
/// (in the hardened build, `size` itself: the rest of a block holds its
/// canary). At least `size`.
///
/// ```
/// assert!(pagewise::c_malloc::malloc_good_size(100) >= 100);
/// // The slot of its class; not in the hardened build (see above).
/// #[cfg(not(feature = "secure"))]
/// assert_eq!(pagewise::c_malloc::malloc_good_size(100), 112);
/// ```
pub fn malloc_good_size(size: usize) -> usize {
    crate::raw::good_size(size, MIN_ALIGN)
}
