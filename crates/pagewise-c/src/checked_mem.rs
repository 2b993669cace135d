//! The hardened library's `memcpy`, `memmove` and `memset`: each checks
//! that a destination inside a pagewise block does not run past the
//! block's end (`pw::raw::check_write`, which aborts with an overflow
//! report if it does), then hands the work to the C library's own
//! function, looked up with `dlsym(RTLD_NEXT)` when the library is loaded.
//! Nothing here allocates. Calls made before that (by the loader's
//! relocation of other libraries) copy a byte at a time.
//!
//! Only calls that reach these symbols are checked: the C library's own
//! internal calls, and copies a compiler made inline, are not.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

type Copy = unsafe extern "C" fn(*mut c_void, *const c_void, usize) -> *mut c_void;
type Fill = unsafe extern "C" fn(*mut c_void, c_int, usize) -> *mut c_void;

/// The C library's functions, 0 until looked up.
static LIBC_MEMCPY: AtomicUsize = AtomicUsize::new(0);
static LIBC_MEMMOVE: AtomicUsize = AtomicUsize::new(0);
static LIBC_MEMSET: AtomicUsize = AtomicUsize::new(0);

/// `memcpy`, checked.
///
/// # Safety
/// As C's `memcpy`.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dst: *mut c_void, src: *const c_void, n: usize) -> *mut c_void {
    if !pw::raw::write_fits_in_line(dst.cast(), n) {
        // SAFETY: forwarded.
        return unsafe { memcpy_checked(dst, src, n) };
    }
    // SAFETY: forwarded.
    unsafe { memcpy_now(dst, src, n) }
}

/// [`memcpy`] of a write the check in line did not pass: checked (an
/// overflow aborts here), then made. Out of line, so that `memcpy` itself
/// makes no call but its tail call, and saves no register.
///
/// # Safety
/// As C's `memcpy`.
#[inline(never)]
unsafe fn memcpy_checked(dst: *mut c_void, src: *const c_void, n: usize) -> *mut c_void {
    pw::raw::check_write(dst.cast(), n);
    // SAFETY: forwarded.
    unsafe { memcpy_now(dst, src, n) }
}

/// The copy itself: the C library's `memcpy`, or a byte at a time before
/// it was looked up.
///
/// # Safety
/// As C's `memcpy`.
#[inline(always)]
unsafe fn memcpy_now(dst: *mut c_void, src: *const c_void, n: usize) -> *mut c_void {
    match LIBC_MEMCPY.load(Relaxed) {
        // SAFETY: the regions do not overlap (the caller's contract).
        0 => unsafe { copy_bytes(dst, src, n, false) },
        // SAFETY: libc's `memcpy`, looked up by name; forwarded.
        // Its result is `dst`: a tail call.
        f => unsafe { core::mem::transmute::<usize, Copy>(f)(dst, src, n) },
    }
}

/// `memmove`, checked.
///
/// # Safety
/// As C's `memmove`.
#[no_mangle]
pub unsafe extern "C" fn memmove(dst: *mut c_void, src: *const c_void, n: usize) -> *mut c_void {
    if !pw::raw::write_fits_in_line(dst.cast(), n) {
        // SAFETY: forwarded.
        return unsafe { memmove_checked(dst, src, n) };
    }
    // SAFETY: forwarded.
    unsafe { memmove_now(dst, src, n) }
}

/// [`memmove`] of a write the check in line did not pass (as
/// [`memcpy_checked`]).
///
/// # Safety
/// As C's `memmove`.
#[inline(never)]
unsafe fn memmove_checked(dst: *mut c_void, src: *const c_void, n: usize) -> *mut c_void {
    pw::raw::check_write(dst.cast(), n);
    // SAFETY: forwarded.
    unsafe { memmove_now(dst, src, n) }
}

/// The move itself (as [`memcpy_now`]).
///
/// # Safety
/// As C's `memmove`.
#[inline(always)]
unsafe fn memmove_now(dst: *mut c_void, src: *const c_void, n: usize) -> *mut c_void {
    match LIBC_MEMMOVE.load(Relaxed) {
        // SAFETY: both regions are valid (the caller's contract).
        0 => unsafe { copy_bytes(dst, src, n, true) },
        // SAFETY: libc's `memmove`, looked up by name; forwarded.
        // Its result is `dst`: a tail call.
        f => unsafe { core::mem::transmute::<usize, Copy>(f)(dst, src, n) },
    }
}

/// `memset`, checked.
///
/// # Safety
/// As C's `memset`.
#[no_mangle]
pub unsafe extern "C" fn memset(dst: *mut c_void, c: c_int, n: usize) -> *mut c_void {
    if !pw::raw::write_fits_in_line(dst.cast(), n) {
        // SAFETY: forwarded.
        return unsafe { memset_checked(dst, c, n) };
    }
    // SAFETY: forwarded.
    unsafe { memset_now(dst, c, n) }
}

/// [`memset`] of a write the check in line did not pass (as
/// [`memcpy_checked`]).
///
/// # Safety
/// As C's `memset`.
#[inline(never)]
unsafe fn memset_checked(dst: *mut c_void, c: c_int, n: usize) -> *mut c_void {
    pw::raw::check_write(dst.cast(), n);
    // SAFETY: forwarded.
    unsafe { memset_now(dst, c, n) }
}

/// The fill itself: the C library's `memset`, or a byte at a time before
/// it was looked up.
///
/// # Safety
/// As C's `memset`.
#[inline(always)]
unsafe fn memset_now(dst: *mut c_void, c: c_int, n: usize) -> *mut c_void {
    match LIBC_MEMSET.load(Relaxed) {
        // SAFETY: `n` writable bytes (the caller's contract).
        0 => unsafe { fill_bytes(dst, c, n) },
        // SAFETY: libc's `memset`, looked up by name; forwarded.
        // Its result is `dst`: a tail call.
        f => unsafe { core::mem::transmute::<usize, Fill>(f)(dst, c, n) },
    }
}

/// Fills `n` bytes with `c` a byte at a time (volatile, so that the loop
/// is not made a `memset` call); `dst`.
///
/// # Safety
/// As C's `memset`.
#[cold]
#[inline(never)]
unsafe fn fill_bytes(dst: *mut c_void, c: c_int, n: usize) -> *mut c_void {
    for i in 0..n {
        // SAFETY: `n` writable bytes (the caller's contract).
        unsafe { dst.cast::<u8>().add(i).write_volatile(c as u8) };
    }
    dst
}

/// Copies `n` bytes a byte at a time (`dst` returned), backwards if `dst` is above `src`
/// and `overlap` allows it (a `memmove`). Volatile accesses, so that the
/// compiler does not make the loop a call to the functions above.
///
/// # Safety
/// As C's `memmove` (or `memcpy` without `overlap`).
#[cold]
#[inline(never)]
unsafe fn copy_bytes(dst: *mut c_void, src: *const c_void, n: usize, overlap: bool) -> *mut c_void {
    let (to, dst, src) = (dst, dst.cast::<u8>(), src.cast::<u8>());
    // SAFETY: both regions hold `n` bytes (caller).
    unsafe {
        if overlap && (dst as usize) > (src as usize) {
            for i in (0..n).rev() {
                dst.add(i).write_volatile(src.add(i).read_volatile());
            }
        } else {
            for i in 0..n {
                dst.add(i).write_volatile(src.add(i).read_volatile());
            }
        }
    }
    to
}

/// Looks up the C library's functions (the next definitions after this
/// library's).
extern "C" fn look_up() {
    for (name, to) in [
        (c"memcpy", &LIBC_MEMCPY),
        (c"memmove", &LIBC_MEMMOVE),
        (c"memset", &LIBC_MEMSET),
    ] {
        // SAFETY: a NUL-terminated name; RTLD_NEXT from this library.
        let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        to.store(f as usize, Relaxed);
    }
    // The allocator's own fills and copies inside blocks skip the check.
    if let (f @ 1.., c @ 1..) = (LIBC_MEMSET.load(Relaxed), LIBC_MEMCPY.load(Relaxed)) {
        // SAFETY: libc's `memset` and `memcpy`, looked up by name.
        unsafe {
            pw::raw::use_unchecked_mem(
                core::mem::transmute::<usize, Fill>(f),
                core::mem::transmute::<usize, Copy>(c),
            )
        };
    }
}

/// Runs [`look_up`] when the library is loaded.
#[used]
#[link_section = ".init_array"]
static LOOK_UP: extern "C" fn() = look_up;
