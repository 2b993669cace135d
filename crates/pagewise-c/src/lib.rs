//! `libpagewise.so`: pagewise as the C allocator of any program.
//!
//! A thin shell over the core: the C allocation family with C semantics is
//! the core's `pw::c_malloc`, exported here under its C names by
//! `pw::export_c_malloc!` (the same functions a Rust binary gets with the
//! core's `override` feature); C++'s `operator new` and `delete` ([`cxx`]);
//! glibc's introspection calls ([`introspect`]); jemalloc's interface
//! (`mallctl`, `malloc_stats_print`, `mallocx` and its family:
//! [`jemalloc`]), so that programs built for jemalloc see pagewise's
//! figures; and pagewise's own
//! `pagewise_trim`, `pagewise_stats_print` and `pagewise_stats_json`. The C
//! declarations are in `include/pagewise.h`.
//!
//! Preloading rules this crate keeps:
//! - **No bootstrap**: the core lives in zero-initialised statics, so the
//!   first `malloc` (from the loader or libc, before any constructor) works.
//!   Nothing here calls `dlsym` or wraps another malloc (the hardened
//!   library's checked `memcpy` family looks libc's up, [`checked_mem`]).
//! - **No allocation inside the allocator**: the exported functions only call
//!   the core; reports are formatted into stack buffers.
//! - **No unwinding across C**: nothing here panics, and every export is
//!   `extern "C"`, which aborts rather than unwind if anything ever did. A
//!   panic (a bug) writes one line and aborts at once ([`panic_abort`]),
//!   rather than print a backtrace through the allocator it interrupted.
//! - **Fork**: the core's constructor (`.init_array`, run when the library
//!   is loaded) registers its fork handlers (`pthread_atfork`, once per
//!   process), so a child of a multi-threaded parent finds every allocator
//!   lock free.
//! - **Thread exit** is the core's pthread key destructor. The thread heap
//!   pointer is one initial-exec TLS word (the core's `tls.rs`), which the
//!   loader places in static TLS for a preloaded (or directly linked)
//!   library: reading it is one `mov`, no `__tls_get_addr` call.
//! - **Fast path**: `malloc` takes a slot from the thread cache
//!   (`raw::malloc_cached`) and tail-calls the rest, errno included, so it
//!   saves no register.
//! - **Reports**: the core's (`pw::report`), the same as a Rust program's
//!   whose global allocator is pagewise: its destructor (`.fini_array`)
//!   writes the report asked for with `PAGEWISE_STATS=1` (text on stderr)
//!   or `PAGEWISE_STATS_FILE=path` (JSON); while running,
//!   `PAGEWISE_STATS_SIGNAL` and `PAGEWISE_STATS_INTERVAL_MS` ask for more,
//!   and `PAGEWISE_SAMPLE_FILE` for the samples of `pagewise run --plot`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(feature = "secure")]
pub mod checked_mem;
pub mod cxx;
pub mod introspect;
pub mod jemalloc;
pub mod options;
pub mod out;
pub mod panic_abort;

use core::ffi::{c_char, c_int};

// The C family (`malloc`, `free`, ..., glibc's `__libc_*` names, C23's
// sized frees, `malloc_good_size`, `malloc_trim`): the core's
// `pw::c_malloc`, under its C names.
pw::export_c_malloc!();

/// Gives back to the OS all free memory pagewise retains.
#[no_mangle]
pub extern "C" fn pagewise_trim() {
    pw::trim();
}

/// Writes the heap profile (`PAGEWISE_PROF=1`) to `path`: 0, or -1 if the
/// file could not be written or `path` is null. Allocates nothing.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pagewise_prof_dump(path: *const c_char) -> c_int {
    if path.is_null() {
        return -1;
    }
    // SAFETY: a NUL-terminated string (the caller's contract).
    let p = unsafe { core::ffi::CStr::from_ptr(path) };
    if pw::profile::write(p) {
        0
    } else {
        -1
    }
}

/// Writes a human-readable report of the allocator's state to `fd`.
#[no_mangle]
pub extern "C" fn pagewise_stats_print(fd: c_int) {
    let r = pw::report();
    let mut w = out::FdWriter::new(fd);
    let _ = core::fmt::Write::write_fmt(&mut w, format_args!("{r}"));
}

/// Writes the allocator's state as one JSON object into `buf` (`len` bytes,
/// always NUL-terminated when `len > 0`, truncated if too small). Returns
/// the length of the full document, like `snprintf`: call again with a
/// larger buffer if the result is `>= len`. `buf` may be null when `len` is 0.
///
/// # Safety
/// `buf` is valid for `len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn pagewise_stats_json(buf: *mut c_char, len: usize) -> usize {
    let r = pw::report();
    let slice: &mut [u8] = if buf.is_null() || len == 0 {
        &mut []
    } else {
        // SAFETY: the caller gives `len` writable bytes.
        unsafe { core::slice::from_raw_parts_mut(buf.cast(), len) }
    };
    let mut w = out::SliceWriter::new(slice);
    let _ = r.write_json(&mut w);
    w.terminate();
    w.total
}
