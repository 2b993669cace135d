//! The C standard and POSIX allocation functions, with C semantics: null
//! and `errno = ENOMEM` on failure, the `EINVAL` returns of
//! `posix_memalign`, glibc's `realloc(p, 0)`, and the obsolete page-aligned
//! `valloc` and `pvalloc`.
//!
//! Each is an ordinary Rust function here; [`crate::export_c_malloc`] gives
//! them their C names.

use super::errno::{errno, set_errno};
use core::ffi::{c_int, c_void};
use core::ptr::null_mut;

/// Alignment of `malloc` results: `alignof(max_align_t)` on x86-64 and aarch64.
pub const MIN_ALIGN: usize = 16;

/// `size` bytes aligned to `align`, null with `ENOMEM` on failure: the
/// fast path (a slot from the thread cache) inline, and a tail call to the
/// rest, so that the fast path saves no register.
///
/// # Safety
/// `align` is a power of two.
///
/// ```
/// use pagewise::c_malloc::{aligned, free};
/// // SAFETY: 64 is a power of two; the block is freed once.
/// unsafe {
///     let p = aligned(100, 64);
///     assert_eq!(p as usize % 64, 0);
///     free(p);
/// }
/// ```
#[inline]
pub unsafe fn aligned(size: usize, align: usize) -> *mut c_void {
    // SAFETY: `align` is a power of two (caller).
    let p = unsafe { crate::raw::malloc_cached(size, align) };
    if !p.is_null() {
        return p.cast();
    }
    // SAFETY: as above.
    unsafe { aligned_uncached(size, align) }
}

/// Everything but a thread-cache hit; null with `ENOMEM` on failure.
///
/// # Safety
/// `align` is a power of two.
#[inline(never)]
unsafe fn aligned_uncached(size: usize, align: usize) -> *mut c_void {
    if size > isize::MAX as usize {
        set_errno(libc::ENOMEM);
        return null_mut();
    }
    // SAFETY: `align` is a power of two (caller).
    let p = unsafe { crate::raw::malloc_uncached(size, align) };
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p.cast()
}

/// `malloc`: `size` bytes aligned to 16; `malloc(0)` returns a unique
/// pointer. Null with `errno = ENOMEM` on failure.
///
/// ```
/// use pagewise::c_malloc::{free, malloc};
/// let p = malloc(0);
/// assert!(!p.is_null());
/// assert!(malloc(usize::MAX).is_null());
/// assert_eq!(pagewise::c_malloc::errno(), libc::ENOMEM);
/// // SAFETY: a live block, freed once.
/// unsafe { free(p) };
/// ```
#[inline]
pub fn malloc(size: usize) -> *mut c_void {
    // SAFETY: 16 is a power of two.
    unsafe { aligned(size, MIN_ALIGN) }
}

/// `free`: frees a block from any function here; null is ignored.
///
/// Never starts the background purger itself: glibc calls `free` while
/// holding its thread-stack cache lock (evicting a cached stack frees the
/// dead thread's dtv and TLS blocks), and creating a thread there takes the
/// same lock and deadlocks. A free that retains memory only asks for the
/// purger; the next allocation starts it.
///
/// # Safety
/// `ptr` is null or a live block of this allocator. A pointer pagewise did
/// not allocate, an interior pointer, or a detected double free aborts with
/// one line on stderr ([`crate::fault`]).
///
/// ```
/// // SAFETY: null is allowed.
/// unsafe { pagewise::c_malloc::free(core::ptr::null_mut()) };
/// ```
#[inline]
pub unsafe fn free(ptr: *mut c_void) {
    // SAFETY: `ptr` is null or a live block (caller); `raw::free` ignores
    // null (the default build past its fast path, which takes no null).
    unsafe { crate::raw::free(ptr.cast()) };
}

/// `calloc`: `n * size` zeroed bytes; null with `ENOMEM` if the product
/// overflows or memory is short. Memory known to be zero is not written,
/// so a large `calloc` stays out of RSS until it is used.
///
/// ```
/// use pagewise::c_malloc::{calloc, free};
/// let p = calloc(10, 8).cast::<u64>();
/// // SAFETY: 80 zeroed bytes, freed once.
/// unsafe {
///     assert_eq!(*p.add(9), 0);
///     free(p.cast());
/// }
/// assert!(calloc(usize::MAX, 2).is_null(), "the product overflows");
/// ```
#[inline]
pub fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size).filter(|&t| t <= isize::MAX as usize) else {
        set_errno(libc::ENOMEM);
        return null_mut();
    };
    // SAFETY: 16 is a power of two.
    let p = unsafe { crate::raw::calloc(total, MIN_ALIGN) };
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p.cast()
}

/// `realloc`, as glibc does it: `realloc(NULL, n)` is `malloc(n)`;
/// `realloc(p, 0)` frees `p` and returns null; on failure it returns null
/// with `ENOMEM` and `p` stays valid and unchanged.
///
/// # Safety
/// `ptr` is null or a live block of this allocator.
///
/// ```
/// use pagewise::c_malloc::{free, malloc, realloc};
/// // SAFETY: live blocks, each freed once.
/// unsafe {
///     let p = malloc(8).cast::<u8>();
///     *p = 42;
///     let q = realloc(p.cast(), 100_000).cast::<u8>();
///     assert_eq!(*q, 42);
///     assert!(realloc(q.cast(), usize::MAX).is_null(), "too big: q is kept");
///     assert!(realloc(q.cast(), 0).is_null(), "frees q");
/// }
/// ```
#[inline]
pub unsafe fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    if ptr.is_null() {
        return malloc(size);
    }
    if size == 0 {
        // SAFETY: live block (caller).
        unsafe { free(ptr) };
        return null_mut();
    }
    if size > isize::MAX as usize {
        set_errno(libc::ENOMEM);
        return null_mut();
    }
    // SAFETY: live block (caller); 16 is a power of two.
    let p = unsafe { crate::raw::realloc(ptr.cast(), size, MIN_ALIGN) };
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p.cast()
}

/// `reallocarray`: `realloc(ptr, n * size)` with the product checked: null
/// with `ENOMEM` (and `ptr` untouched) if it overflows.
///
/// # Safety
/// As for [`realloc`].
///
/// ```
/// use pagewise::c_malloc::{free, malloc, reallocarray};
/// // SAFETY: a live block, freed once.
/// unsafe {
///     let p = malloc(8);
///     assert!(reallocarray(p, usize::MAX, 2).is_null());
///     let p = reallocarray(p, 4, 8);
///     free(p);
/// }
/// ```
#[inline]
pub unsafe fn reallocarray(ptr: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: forwarded.
        Some(total) => unsafe { realloc(ptr, total) },
        None => {
            set_errno(libc::ENOMEM);
            null_mut()
        }
    }
}

/// `posix_memalign`: stores in `*out` a block of `size` bytes aligned to
/// `align`. Returns 0, `EINVAL` if `align` is not a power of two multiple
/// of `sizeof(void *)`, or `ENOMEM`; `*out` and `errno` are left alone on
/// failure.
///
/// # Safety
/// `out` is valid for a pointer write.
///
/// ```
/// use pagewise::c_malloc::{free, posix_memalign};
/// let mut p = core::ptr::null_mut();
/// // SAFETY: `p` is writable; the block is freed once.
/// unsafe {
///     assert_eq!(posix_memalign(&mut p, 4096, 10), 0);
///     assert_eq!(p as usize % 4096, 0);
///     assert_eq!(posix_memalign(&mut p, 24, 10), libc::EINVAL);
///     free(p);
/// }
/// ```
#[inline]
pub unsafe fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    // A power of two is a multiple of the pointer size when it is at least that.
    if !align.is_power_of_two() || align < core::mem::size_of::<*mut c_void>() {
        return libc::EINVAL;
    }
    let saved = errno();
    // SAFETY: a power of two.
    let p = unsafe { aligned(size, align.max(MIN_ALIGN)) };
    if p.is_null() {
        set_errno(saved);
        return libc::ENOMEM;
    }
    // SAFETY: the caller gives a writable slot.
    unsafe { *out = p };
    0
}

/// C11 `aligned_alloc`: `align` must be a power of two (else null with
/// `EINVAL`); `size` need not be a multiple of it.
///
/// ```
/// use pagewise::c_malloc::{aligned_alloc, free};
/// let p = aligned_alloc(256, 10);
/// assert_eq!(p as usize % 256, 0);
/// assert!(aligned_alloc(3, 10).is_null());
/// // SAFETY: a live block, freed once.
/// unsafe { free(p) };
/// ```
#[inline]
pub fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: a power of two.
    unsafe { aligned(size, align.max(MIN_ALIGN)) }
}

/// Obsolete `memalign`, as glibc does it: an alignment that is not a power
/// of two is rounded up to one; one above `SIZE_MAX / 2 + 1` is `EINVAL`.
///
/// ```
/// use pagewise::c_malloc::{free, memalign};
/// let p = memalign(48, 10);
/// assert_eq!(p as usize % 64, 0, "48 is rounded up to 64");
/// // SAFETY: a live block, freed once.
/// unsafe { free(p) };
/// ```
#[inline]
pub fn memalign(align: usize, size: usize) -> *mut c_void {
    if align > usize::MAX / 2 + 1 {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    let align = align.max(1).next_power_of_two();
    // SAFETY: a power of two.
    unsafe { aligned(size, align.max(MIN_ALIGN)) }
}

/// Obsolete `valloc`: memory aligned to the OS page (the run-time
/// [`crate::layout::os_page`]).
///
/// ```
/// let p = pagewise::c_malloc::valloc(10);
/// assert_eq!(p as usize % pagewise::layout::os_page(), 0);
/// // SAFETY: a live block, freed once.
/// unsafe { pagewise::c_malloc::free(p) };
/// ```
#[inline]
pub fn valloc(size: usize) -> *mut c_void {
    // SAFETY: the OS page is a power of two.
    unsafe { aligned(size, crate::layout::os_page()) }
}

/// Obsolete `pvalloc`: page-aligned memory, the size rounded up to whole
/// OS pages (`pvalloc(0)` gives one page).
///
/// ```
/// use pagewise::c_malloc::{free, malloc_usable_size, pvalloc};
/// let p = pvalloc(1);
/// // SAFETY: a live block, freed once.
/// unsafe {
///     assert!(malloc_usable_size(p) >= pagewise::layout::os_page());
///     free(p);
/// }
/// ```
#[inline]
pub fn pvalloc(size: usize) -> *mut c_void {
    let page = crate::layout::os_page();
    let Some(rounded) = size.max(1).checked_add(page - 1) else {
        set_errno(libc::ENOMEM);
        return null_mut();
    };
    // SAFETY: the OS page is a power of two.
    unsafe { aligned(rounded & !(page - 1), page) }
}

/// `malloc_usable_size`: bytes usable in a live block (at least the size
/// asked for; in the hardened build, exactly that: the rest of the block
/// holds its canary); 0 for null.
///
/// # Safety
/// `ptr` is null or a live block of this allocator (a foreign pointer aborts).
///
/// ```
/// use pagewise::c_malloc::{free, malloc, malloc_usable_size};
/// let p = malloc(100);
/// // SAFETY: a live block, freed once.
/// unsafe {
///     assert!(malloc_usable_size(p) >= 100);
///     // The slot of its class; the hardened build's is the request.
///     #[cfg(not(feature = "secure"))]
///     assert_eq!(malloc_usable_size(p), 112);
///     #[cfg(feature = "secure")]
///     assert_eq!(malloc_usable_size(p), 100);
///     free(p);
/// }
/// ```
#[inline]
pub unsafe fn malloc_usable_size(ptr: *mut c_void) -> usize {
    if ptr.is_null() {
        return 0;
    }
    // SAFETY: live block (caller).
    unsafe { crate::raw::usable_size(ptr.cast()) }
}

/// glibc's `malloc_trim`: gives back everything pagewise retains
/// ([`crate::trim`]; the pad argument is ignored). Returns 1.
///
/// ```
/// assert_eq!(pagewise::c_malloc::malloc_trim(0), 1);
/// ```
pub fn malloc_trim(_pad: usize) -> c_int {
    crate::trim();
    1
}
