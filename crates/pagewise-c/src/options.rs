//! `pagewise_option_get` and `pagewise_option_set`: the settings of
//! `pagewise::options` from C.

use core::ffi::{c_char, c_int, CStr};

fn name_of<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string (caller).
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// The current value of option `name` (`decay_ms`, `retain_max`, `limit`,
/// `reserve`, `purge`, `background`, `mesh`): `-1` for none or never; an
/// unknown name returns `-1` with `errno = EINVAL`.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pagewise_option_get(name: *const c_char) -> i64 {
    match name_of(name).map(pw::options::get) {
        Some(Ok(v)) => v,
        _ => {
            crate::out::set_errno(libc::EINVAL);
            -1
        }
    }
}

/// Sets option `name` to `value` (parsed as its `PAGEWISE_*` variable:
/// `500`, `32M`, `1.5G`, `-1`; the same parser). Returns 0; `EINVAL` for an
/// unknown name or a malformed or refused value; `EPERM` for an option
/// fixed at start-up (`purge`, `background`, `mesh`). Prints nothing: the
/// caller has the error.
///
/// # Safety
/// `name` and `value` are null or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn pagewise_option_set(name: *const c_char, value: *const c_char) -> c_int {
    let (Some(name), Some(value)) = (name_of(name), name_of(value)) else {
        return libc::EINVAL;
    };
    match pw::options::set(name, value) {
        Ok(()) => 0,
        Err(pw::options::OptionError::FixedAtStart) => libc::EPERM,
        Err(_) => libc::EINVAL,
    }
}
