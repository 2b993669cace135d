//! `libpagewise.so`: pagewise as the C allocator of any program.
//!
//! A thin shell over the core: the C allocation family with C semantics is
//! the core's `pw::c_malloc`, exported here under its C names by
//! `pw::export_c_malloc!` (the same functions a Rust binary gets with the
//! core's `override` feature); C++'s `operator new` and `delete` ([`cxx`]);
//! glibc's introspection calls ([`introspect`]); and pagewise's own
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
//!   `extern "C"`, which aborts rather than unwind if anything ever did.
//! - **Fork**: a constructor (`.init_array`, run when the library is loaded)
//!   has the core register its fork handlers (`pthread_atfork`, once per
//!   process), so a child of a multi-threaded parent finds every allocator
//!   lock free.
//! - **Thread exit** is the core's pthread key destructor. The thread heap
//!   pointer is one initial-exec TLS word (the core's `tls.rs`), which the
//!   loader places in static TLS for a preloaded (or directly linked)
//!   library: reading it is one `mov`, no `__tls_get_addr` call.
//! - **Fast path**: `malloc` takes a slot from the thread cache
//!   (`raw::malloc_cached`) and tail-calls the rest, errno included, so it
//!   saves no register.
//! - **Exit**: a destructor (`.fini_array`) writes the report asked for with
//!   `PAGEWISE_STATS=1` (text on stderr) or `PAGEWISE_STATS_FILE=path` (JSON).
//!   While running, `PAGEWISE_STATS_SIGNAL` and `PAGEWISE_STATS_INTERVAL_MS`
//!   ask for more ([`live_report`]).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(feature = "secure")]
pub mod checked_mem;
pub mod cxx;
pub mod introspect;
pub mod live_report;
pub mod options;
pub mod out;
pub mod proc;
pub mod report;
pub mod sampler;

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

/// The allocator's counters and the kernel's view, taken with the purger
/// paused so that no purge falls between the two (which would make the
/// accounting and the resident bytes disagree by what it purged).
fn snapshot() -> (pw::Stats, proc::OsMemory) {
    pw::purger::pause();
    let s = pw::stats();
    let os = proc::os_memory();
    pw::purger::resume();
    (s, os)
}

/// Writes a human-readable report of the allocator's state to `fd`.
#[no_mangle]
pub extern "C" fn pagewise_stats_print(fd: c_int) {
    let (s, os) = snapshot();
    let mut w = out::FdWriter::new(fd);
    let _ = report::text(&mut w, &s, &os);
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
    let (s, os) = snapshot();
    let slice: &mut [u8] = if buf.is_null() || len == 0 {
        &mut []
    } else {
        // SAFETY: the caller gives `len` writable bytes.
        unsafe { core::slice::from_raw_parts_mut(buf.cast(), len) }
    };
    let mut w = out::SliceWriter::new(slice);
    let _ = report::json(&mut w, &s, &os);
    w.terminate();
    w.total
}

// ----- load and exit ------------------------------------------------------------

extern "C" fn sampler_fork_child() {
    sampler::after_fork_child();
}

extern "C" fn on_load() {
    // The core's handlers (every allocator lock), once per process.
    pw::thread::register_fork_handlers();
    // SAFETY: a function with the signature pthread_atfork expects.
    unsafe { libc::pthread_atfork(None, None, Some(sampler_fork_child)) };
    // Read the configuration now, while the process is single-threaded, so
    // that a malformed value is reported once and early.
    let _ = pw::thread::config();
    sampler::start_from_env();
    live_report::start_from_env();
}

extern "C" fn on_exit() {
    sampler::stop();
    exit_report();
}

/// Runs [`on_load`] when the library is loaded (preloaded, linked or dlopened).
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

/// Runs [`on_exit`] at `exit()` (after the program's own `atexit` handlers).
#[used]
#[link_section = ".fini_array"]
static ON_EXIT: extern "C" fn() = on_exit;

fn getenv(name: &core::ffi::CStr) -> Option<&'static [u8]> {
    // SAFETY: NUL-terminated name; getenv returns null or a C string that
    // lives while the environment is not changed (we use it at once).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null getenv result.
    Some(unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes())
}

/// Warns about a malformed variable on one line of stderr.
fn malformed(name: &[u8], value: &[u8], what: &[u8]) {
    pw::fault::write_stderr(&[b"pagewise: ignoring malformed ", name, b"=", value, what]);
}

/// Parses a boolean environment value (`1/0`, `true/false`, `on/off`, `yes/no`).
pub fn parse_bool(v: &[u8]) -> Option<bool> {
    match v {
        b"1" | b"true" | b"on" | b"yes" => Some(true),
        b"0" | b"false" | b"off" | b"no" | b"" => Some(false),
        _ => None,
    }
}

fn exit_report() {
    if let Some(path) = getenv(c"PAGEWISE_STATS_FILE").filter(|p| !p.is_empty()) {
        let mut name = [0u8; 4096];
        if !out::expand_path(path, &mut name) {
            malformed(b"PAGEWISE_STATS_FILE", path, b" (path too long)\n");
            return;
        }
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC;
        // SAFETY: `name` is NUL-terminated.
        let fd = unsafe { libc::open(name.as_ptr().cast(), flags, 0o644 as libc::c_uint) };
        if fd < 0 {
            pw::fault::write_stderr(&[b"pagewise: cannot write PAGEWISE_STATS_FILE=", path, b"\n"]);
            return;
        }
        let (s, os) = snapshot();
        {
            let mut w = out::FdWriter::new(fd);
            let _ = report::json(&mut w, &s, &os);
            let _ = core::fmt::Write::write_str(&mut w, "\n");
        }
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        return;
    }
    if let Some(v) = getenv(c"PAGEWISE_STATS") {
        match parse_bool(v) {
            Some(true) => pagewise_stats_print(2),
            Some(false) => {}
            None => malformed(b"PAGEWISE_STATS", v, b" (expected 1 or 0)\n"),
        }
    }
}
