//! The calling thread's `errno`, which the C functions set on failure.
//!
//! The slot's address comes from libc (`__errno_location` on Linux,
//! `__error` on macOS and the BSDs); reading it allocates nothing.

use core::ffi::c_int;

#[cfg(any(target_os = "linux", target_os = "android"))]
fn slot() -> *mut c_int {
    // SAFETY: no precondition; the result is the calling thread's errno.
    unsafe { libc::__errno_location() }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn slot() -> *mut c_int {
    // SAFETY: no precondition; the result is the calling thread's errno.
    unsafe { libc::__error() }
}

/// The calling thread's `errno`.
///
/// ```
/// use pagewise::c_malloc::{errno, set_errno};
/// set_errno(libc::EAGAIN);
/// assert_eq!(errno(), libc::EAGAIN);
/// ```
pub fn errno() -> c_int {
    // SAFETY: the thread's own errno slot, valid while the thread lives.
    unsafe { *slot() }
}

/// Sets the calling thread's `errno`.
///
/// ```
/// pagewise::c_malloc::set_errno(0);
/// assert_eq!(pagewise::c_malloc::errno(), 0);
/// ```
pub fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *slot() = e };
}
