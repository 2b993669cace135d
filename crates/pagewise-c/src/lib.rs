//! `libpagewise.so`: pagewise as the C allocator of any program.
//!
//! A thin shell over the core's unsized entry points ([`pw::raw`]): the glibc
//! malloc family with C semantics (null and `errno = ENOMEM` on failure,
//! `EINVAL` returns of `posix_memalign`, glibc's `realloc(p, 0)`), plus
//! pagewise's own `pagewise_trim`, `pagewise_stats_print` and
//! `pagewise_stats_json`. The C declarations are in `include/pagewise.h`.
//!
//! Preloading rules this crate keeps:
//! - **No bootstrap**: the core lives in zero-initialised statics, so the
//!   first `malloc` (from the loader or libc, before any constructor) works.
//!   Nothing here calls `dlsym` or wraps another malloc.
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

pub mod cxx;
pub mod glibc;
pub mod introspect;
pub mod live_report;
pub mod options;
pub mod out;
pub mod proc;
pub mod report;
pub mod sampler;

use core::ffi::{c_char, c_int, c_void};
use core::ptr::null_mut;
use out::set_errno;

/// Alignment of `malloc` results: `alignof(max_align_t)` on x86-64 and aarch64.
pub const MIN_ALIGN: usize = 16;

/// The fast path (a slot from the thread cache) and a tail call to the
/// rest, so that the fast path saves no register.
#[inline]
fn alloc(size: usize, align: usize) -> *mut c_void {
    // SAFETY: `align` is a power of two (every caller checks or passes a constant).
    let p = unsafe { pw::raw::malloc_cached(size, align) };
    if !p.is_null() {
        return p.cast();
    }
    alloc_uncached(size, align)
}

/// Everything but a thread-cache hit; null with `ENOMEM` on failure.
#[inline(never)]
fn alloc_uncached(size: usize, align: usize) -> *mut c_void {
    if size > isize::MAX as usize {
        set_errno(libc::ENOMEM);
        return null_mut();
    }
    // SAFETY: `align` is a power of two (as for `alloc`).
    let p = unsafe { pw::raw::malloc_uncached(size, align) };
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p.cast()
}

/// Allocates `size` bytes aligned to 16; `malloc(0)` returns a unique
/// pointer. Null with `errno = ENOMEM` on failure.
#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    alloc(size, MIN_ALIGN)
}

/// Frees a block from any of the functions here (null is ignored).
///
/// Never starts the background purger itself: glibc calls `free` while
/// holding its thread-stack cache lock (evicting a cached stack frees the
/// dead thread's dtv and TLS blocks), and creating a thread there takes the
/// same lock and deadlocks. A free that retains memory only asks for the
/// purger (`pw::purger::request`); the next allocation starts it.
///
/// # Safety
/// `ptr` is null or a live block of this allocator. A pointer pagewise did
/// not allocate, an interior pointer, or a detected double free aborts with
/// one line on stderr.
#[no_mangle]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: `ptr` is a live block (caller).
    unsafe { pw::raw::free(ptr.cast()) };
}

/// Allocates `n * size` zeroed bytes; null with `ENOMEM` if the product
/// overflows or memory is short.
#[no_mangle]
pub extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return null_mut();
    };
    if total > isize::MAX as usize {
        set_errno(libc::ENOMEM);
        return null_mut();
    }
    // SAFETY: 16 is a power of two. Memory known to be zero is not written,
    // so a large calloc stays out of RSS until it is used.
    let p = unsafe { pw::raw::calloc(total, MIN_ALIGN) };
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p.cast()
}

/// Resizes a block, glibc-style: `realloc(NULL, n)` is `malloc(n)`;
/// `realloc(p, 0)` frees `p` and returns null; on failure it returns null
/// with `ENOMEM` and `p` stays valid and unchanged.
///
/// # Safety
/// `ptr` is null or a live block of this allocator.
#[no_mangle]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    if ptr.is_null() {
        return alloc(size, MIN_ALIGN);
    }
    if size == 0 {
        // SAFETY: live block (caller).
        unsafe { pw::raw::free(ptr.cast()) };
        return null_mut();
    }
    if size > isize::MAX as usize {
        set_errno(libc::ENOMEM);
        return null_mut();
    }
    // SAFETY: live block (caller); 16 is a power of two.
    let p = unsafe { pw::raw::realloc(ptr.cast(), size, MIN_ALIGN) };
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p.cast()
}

/// `realloc(ptr, n * size)` with the product checked: null with `ENOMEM`
/// (and `ptr` untouched) if it overflows.
///
/// # Safety
/// As for [`realloc`].
#[no_mangle]
pub unsafe extern "C" fn reallocarray(ptr: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: forwarded.
        Some(total) => unsafe { realloc(ptr, total) },
        None => {
            set_errno(libc::ENOMEM);
            null_mut()
        }
    }
}

/// Stores in `*out` a block of `size` bytes aligned to `align`. Returns 0,
/// `EINVAL` if `align` is not a power of two multiple of `sizeof(void *)`,
/// or `ENOMEM`; `*out` and `errno` are left alone on failure.
///
/// # Safety
/// `out` is valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !align.is_power_of_two() || !align.is_multiple_of(core::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    let saved = out::errno();
    let p = alloc(size, align.max(MIN_ALIGN));
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
#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    alloc(size, align.max(MIN_ALIGN))
}

/// Obsolete `memalign`, as glibc does it: an alignment that is not a power
/// of two is rounded up to one; one above `SIZE_MAX / 2 + 1` is `EINVAL`.
#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    if align > usize::MAX / 2 + 1 {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    let align = align.max(1).next_power_of_two();
    alloc(size, align.max(MIN_ALIGN))
}

/// Obsolete `valloc`: memory aligned to the OS page (the run-time
/// [`pw::layout::os_page`], which is `sysconf(_SC_PAGESIZE)` unless
/// the `PAGEWISE_OS_PAGE` testing override says otherwise).
#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    alloc(size, pw::layout::os_page())
}

/// Obsolete `pvalloc`: page-aligned memory, the size rounded up to whole
/// OS pages (`pvalloc(0)` gives one page).
#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let page = pw::layout::os_page();
    let Some(rounded) = size.max(1).checked_add(page - 1) else {
        set_errno(libc::ENOMEM);
        return null_mut();
    };
    alloc(rounded & !(page - 1), page)
}

/// Bytes usable in a live block (at least the size asked for); 0 for null.
///
/// # Safety
/// `ptr` is null or a live block of this allocator (a foreign pointer aborts).
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> usize {
    if ptr.is_null() {
        return 0;
    }
    // SAFETY: live block (caller).
    unsafe { pw::raw::usable_size(ptr.cast()) }
}

/// glibc's `malloc_trim`: gives back everything pagewise retains (the pad
/// argument is ignored). Returns 1.
#[no_mangle]
pub extern "C" fn malloc_trim(_pad: usize) -> c_int {
    pw::trim();
    1
}

/// Gives back to the OS all free memory pagewise retains.
#[no_mangle]
pub extern "C" fn pagewise_trim() {
    pw::trim();
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
