//! `mallctl`, `mallctlnametomib` and `mallctlbymib`, with jemalloc's
//! calling convention:
//!
//! - a value is read when `oldp` and `oldlenp` are both non-null:
//!   `*oldlenp` must be the value's size, or as many bytes as fit are
//!   copied, `*oldlenp` is set to that, and the call returns `EINVAL`;
//! - a value is written when `newp` is non-null: `newlen` must be its size
//!   (`EINVAL` otherwise);
//! - a read-only name given `newp` or `newlen` returns `EPERM`, and so does
//!   an action (`arena.<i>.purge`) given anything to read or write;
//! - an unknown name returns `ENOENT`.
//!
//! Statistics are served from the snapshot the last `epoch` write took
//! ([`super::figures`]), as jemalloc serves them.

use super::figures;
use super::names::{Found, Name, MAX_DEPTH};
use core::ffi::{c_char, c_int, c_uint, c_void, CStr};
use core::mem::size_of;

/// What `version` reads: jemalloc's interface version first (programs
/// compare it), then that the allocator is pagewise.
pub const VERSION: &str = concat!("5.3.0-0-pagewise-", env!("CARGO_PKG_VERSION"), "\0");

/// `arenas.narenas`: the whole process answers as one arena (pagewise's
/// heaps belong to threads and are not addressable).
pub const NARENAS: c_uint = 1;

/// jemalloc's `MALLCTL_ARENAS_ALL`: `arena.4096.*` is every arena.
pub const ARENAS_ALL: usize = 4096;

/// The four pointers and sizes of a call.
struct Call {
    oldp: *mut c_void,
    oldlenp: *mut usize,
    newp: *const c_void,
    newlen: usize,
}

impl Call {
    /// `EPERM` if anything is to be written.
    fn read_only(&self) -> Result<(), c_int> {
        if self.newp.is_null() && self.newlen == 0 {
            Ok(())
        } else {
            Err(libc::EPERM)
        }
    }

    /// `EPERM` if anything is to be read or written (an action).
    fn neither(&self) -> Result<(), c_int> {
        self.read_only()?;
        if self.oldp.is_null() && self.oldlenp.is_null() {
            Ok(())
        } else {
            Err(libc::EPERM)
        }
    }

    /// Gives `v` to the caller, if asked for.
    ///
    /// # Safety
    /// `oldlenp` is null or valid; `oldp` is null or valid for `*oldlenp`
    /// bytes of writes (the caller's contract).
    unsafe fn read<T: Copy>(&self, v: T) -> Result<(), c_int> {
        if self.oldp.is_null() || self.oldlenp.is_null() {
            return Ok(());
        }
        // SAFETY: valid (caller).
        let len = unsafe { *self.oldlenp };
        let n = len.min(size_of::<T>());
        // SAFETY: `n` bytes of a local value into `n` writable bytes.
        unsafe {
            core::ptr::copy_nonoverlapping((&v as *const T).cast::<u8>(), self.oldp.cast(), n)
        };
        if len == size_of::<T>() {
            Ok(())
        } else {
            // SAFETY: valid (caller).
            unsafe { *self.oldlenp = n };
            Err(libc::EINVAL)
        }
    }

    /// The value to write, if any: `size_of::<T>()` bytes read as `T`
    /// (only integer types here, which any bytes are).
    ///
    /// # Safety
    /// `newp` is null or valid for `newlen` bytes of reads.
    unsafe fn write<T: Copy>(&self) -> Result<Option<T>, c_int> {
        if self.newp.is_null() {
            return Ok(None);
        }
        if self.newlen != size_of::<T>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `size_of::<T>()` readable bytes (caller); T is an integer.
        Ok(Some(unsafe { self.newp.cast::<T>().read_unaligned() }))
    }
}

/// pagewise's `decay_ms` as jemalloc's `ssize_t` decay (-1: never).
fn decay_ms() -> isize {
    pw::options::get("decay_ms").unwrap_or(-1) as isize
}

/// Sets `decay_ms`; `EFAULT` for a value it refuses, as jemalloc answers.
fn set_decay_ms(v: isize) -> Result<(), c_int> {
    let mut digits = [0u8; 20];
    let text: &[u8] = match v {
        -1 => b"-1",
        v if v >= 0 => crate::out::decimal(v as usize, &mut digits),
        _ => return Err(libc::EFAULT),
    };
    // SAFETY: ASCII.
    let text = unsafe { core::str::from_utf8_unchecked(text) };
    pw::options::set("decay_ms", text).map_err(|_| libc::EFAULT)
}

fn background() -> u8 {
    (pw::options::get("background") == Ok(1)) as u8
}

/// Serves `found` for `call`.
///
/// # Safety
/// The pointers of `call` as `mallctl`'s contract says.
unsafe fn serve(found: Found, call: &Call) -> Result<(), c_int> {
    let stat = |f: fn(figures::Figures) -> u64| -> Result<(), c_int> {
        call.read_only()?;
        // SAFETY: forwarded (caller).
        unsafe { call.read(f(figures::current()) as usize) }
    };
    // SAFETY (each `read` and `write`): forwarded (caller).
    unsafe {
        match found.name {
            Name::Version => {
                call.read_only()?;
                call.read(VERSION.as_ptr().cast::<c_char>())
            }
            Name::Epoch => {
                let e = match call.write::<u64>()? {
                    Some(_) => figures::refresh(),
                    None => figures::epoch(),
                };
                call.read(e)
            }
            Name::Allocated => stat(|f| f.allocated),
            Name::Active => stat(|f| f.active),
            Name::Metadata => stat(|f| f.metadata),
            Name::Resident => stat(|f| f.resident),
            Name::Mapped => stat(|f| f.mapped),
            Name::Retained => stat(|f| f.retained),
            Name::Narenas => {
                call.read_only()?;
                call.read(NARENAS)
            }
            Name::Page => {
                call.read_only()?;
                call.read(pw::layout::os_page())
            }
            Name::DirtyDecayMs => {
                call.read(decay_ms())?;
                match call.write::<isize>()? {
                    Some(v) => set_decay_ms(v),
                    None => Ok(()),
                }
            }
            Name::OptDirtyDecayMs => {
                call.read_only()?;
                call.read(decay_ms())
            }
            Name::OptBackgroundThread => {
                call.read_only()?;
                call.read(background())
            }
            Name::BackgroundThread => {
                let now = background();
                let new = call.write::<u8>()?;
                call.read(now)?;
                match new {
                    // The purger thread is started (or not) once, at start.
                    Some(v) if (v != 0) as u8 != now => Err(libc::EPERM),
                    _ => Ok(()),
                }
            }
            Name::ThreadAllocated => {
                call.read_only()?;
                call.read(pw::thread::allocated_bytes())
            }
            Name::ThreadDeallocated => {
                call.read_only()?;
                call.read(pw::thread::freed_bytes())
            }
            Name::Purge => {
                call.neither()?;
                let i = found.index.unwrap_or(0);
                if i > NARENAS as usize && i != ARENAS_ALL {
                    return Err(libc::ENOENT);
                }
                pw::trim();
                Ok(())
            }
        }
    }
}

fn result(r: Result<(), c_int>) -> c_int {
    r.err().unwrap_or(0)
}

/// jemalloc's `mallctl`: reads or writes the value of `name` (the names
/// are in docs/guide/observing-memory.md; `ENOENT` for others), with jemalloc's
/// calling convention (module docs). Allocates nothing.
///
/// # Safety
/// `name` is null or NUL-terminated; `oldlenp` is null or valid, `oldp`
/// null or valid for `*oldlenp` bytes; `newp` null or valid for `newlen`.
#[no_mangle]
pub unsafe extern "C" fn mallctl(
    name: *const c_char,
    oldp: *mut c_void,
    oldlenp: *mut usize,
    newp: *mut c_void,
    newlen: usize,
) -> c_int {
    if name.is_null() {
        return libc::ENOENT;
    }
    // SAFETY: NUL-terminated (caller).
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    let Some(found) = super::names::lookup(name) else {
        return libc::ENOENT;
    };
    let call = Call {
        oldp,
        oldlenp,
        newp,
        newlen,
    };
    // SAFETY: forwarded (caller).
    result(unsafe { serve(found, &call) })
}

/// jemalloc's `mallctlnametomib`: the MIB of `name` into `mibp`, at most
/// `*miblenp` numbers; `*miblenp` is set to the name's length. `ENOENT`
/// for an unknown name or a `*miblenp` too small for it.
///
/// # Safety
/// `name` is null or NUL-terminated; `miblenp` null or valid; `mibp` valid
/// for `*miblenp` numbers.
#[no_mangle]
pub unsafe extern "C" fn mallctlnametomib(
    name: *const c_char,
    mibp: *mut usize,
    miblenp: *mut usize,
) -> c_int {
    if name.is_null() || mibp.is_null() || miblenp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: NUL-terminated (caller).
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    let Some(found) = super::names::lookup(name) else {
        return libc::ENOENT;
    };
    // SAFETY: valid (caller).
    if unsafe { *miblenp } < found.depth {
        return libc::ENOENT;
    }
    let mib = found.mib();
    // SAFETY: room for `depth` numbers (checked above); valid (caller).
    unsafe {
        core::ptr::copy_nonoverlapping(mib.as_ptr(), mibp, found.depth);
        *miblenp = found.depth;
    }
    0
}

/// jemalloc's `mallctlbymib`: [`mallctl`] for a MIB from
/// [`mallctlnametomib`] (an index may be replaced). `ENOENT` for a MIB
/// that names nothing.
///
/// # Safety
/// `mib` valid for `miblen` numbers; the rest as for [`mallctl`].
#[no_mangle]
pub unsafe extern "C" fn mallctlbymib(
    mib: *const usize,
    miblen: usize,
    oldp: *mut c_void,
    oldlenp: *mut usize,
    newp: *mut c_void,
    newlen: usize,
) -> c_int {
    if mib.is_null() || miblen == 0 || miblen > MAX_DEPTH {
        return libc::ENOENT;
    }
    // SAFETY: `miblen` numbers (caller).
    let mib = unsafe { core::slice::from_raw_parts(mib, miblen) };
    let Some(found) = Found::from_mib(mib) else {
        return libc::ENOENT;
    };
    let call = Call {
        oldp,
        oldlenp,
        newp,
        newlen,
    };
    // SAFETY: forwarded (caller).
    result(unsafe { serve(found, &call) })
}
