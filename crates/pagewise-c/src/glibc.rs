//! The rest of glibc's allocation family: its internal `__libc_*` names
//! (which some programs and libraries call directly, and which would
//! otherwise hand out glibc memory that pagewise's `free` then rejects),
//! the obsolete `cfree`, C23's `free_sized` and `free_aligned_sized`, and
//! `malloc_good_size` (the usable size a request gets, as macOS's
//! `malloc_good_size` and jemalloc's `nallocx` answer).

use core::ffi::c_void;

use crate::MIN_ALIGN;

/// glibc's internal name of `malloc`.
#[no_mangle]
pub extern "C" fn __libc_malloc(size: usize) -> *mut c_void {
    crate::malloc(size)
}

/// glibc's internal name of `free`.
///
/// # Safety
/// As `free`.
#[no_mangle]
pub unsafe extern "C" fn __libc_free(ptr: *mut c_void) {
    // SAFETY: forwarded.
    unsafe { crate::free(ptr) }
}

/// glibc's internal name of `calloc`.
#[no_mangle]
pub extern "C" fn __libc_calloc(n: usize, size: usize) -> *mut c_void {
    crate::calloc(n, size)
}

/// glibc's internal name of `realloc`.
///
/// # Safety
/// As `realloc`.
#[no_mangle]
pub unsafe extern "C" fn __libc_realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { crate::realloc(ptr, size) }
}

/// glibc's internal name of `memalign`.
#[no_mangle]
pub extern "C" fn __libc_memalign(align: usize, size: usize) -> *mut c_void {
    crate::memalign(align, size)
}

/// glibc's internal name of `valloc`.
#[no_mangle]
pub extern "C" fn __libc_valloc(size: usize) -> *mut c_void {
    crate::valloc(size)
}

/// glibc's internal name of `pvalloc`.
#[no_mangle]
pub extern "C" fn __libc_pvalloc(size: usize) -> *mut c_void {
    crate::pvalloc(size)
}

/// Obsolete `cfree`: `free`.
///
/// # Safety
/// As `free`.
#[no_mangle]
pub unsafe extern "C" fn cfree(ptr: *mut c_void) {
    // SAFETY: forwarded.
    unsafe { crate::free(ptr) }
}

/// Checks a size given back with a block (debug builds of the library
/// only, as the Rust `dealloc` path does not check it either): larger than
/// the block is misuse, one line and an abort.
///
/// # Safety
/// `ptr` is null or a live block of this allocator.
#[inline(always)]
pub(crate) unsafe fn check_size(ptr: *mut c_void, size: usize, what: &[u8]) {
    #[cfg(debug_assertions)]
    if !ptr.is_null() {
        // SAFETY: a live block (caller).
        let usable = unsafe { pw::raw::usable_size(ptr.cast()) };
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
    pw::fault::write_stderr(&[
        b"pagewise: ",
        what,
        b" of ",
        crate::out::decimal(size, &mut digits),
        b" bytes, larger than the block: ",
        pw::fault::hex(addr, &mut hex),
        b"\n",
    ]);
    std::process::abort()
}

/// C23 `free_sized`: frees `ptr`, a block of `size` bytes from `malloc`,
/// `calloc` or `realloc` (pagewise finds the size itself; debug builds
/// check it).
///
/// # Safety
/// `ptr` is null or a live block of this allocator.
#[no_mangle]
pub unsafe extern "C" fn free_sized(ptr: *mut c_void, size: usize) {
    // SAFETY: forwarded.
    unsafe {
        check_size(ptr, size, b"free_sized");
        crate::free(ptr)
    }
}

/// C23 `free_aligned_sized`: frees `ptr`, a block of `size` bytes from
/// `aligned_alloc(align, size)` (debug builds check the size).
///
/// # Safety
/// `ptr` is null or a live block of this allocator.
#[no_mangle]
pub unsafe extern "C" fn free_aligned_sized(ptr: *mut c_void, _align: usize, size: usize) {
    // SAFETY: forwarded.
    unsafe {
        check_size(ptr, size, b"free_aligned_sized");
        crate::free(ptr)
    }
}

/// The usable size `malloc(size)` would give: the slot size of its class,
/// or whole slices or pages for large and huge blocks. At least `size`.
#[no_mangle]
pub extern "C" fn malloc_good_size(size: usize) -> usize {
    pw::raw::good_size(size, MIN_ALIGN)
}
