//! Thread heaps of the global allocator.
//!
//! Each thread gets its own heap on its first allocation, or on its
//! [`FREES_BEFORE_HEAP`]th free if it only frees; the fast paths touch only
//! that heap. When a thread exits (a pthread key destructor, which
//! unlike Rust's thread-local destructors needs no allocation to register),
//! its heap is abandoned: empty pages go back to the span pool and the heap
//! waits on a list until a new thread adopts it, pages, live objects and all.
//! Objects that outlive their thread stay valid; frees from other threads
//! keep working (atomic lists); nothing is freed twice and nothing leaks.
//!
//! Heaps themselves (made, adopted, abandoned, visited) are `heaps.rs`;
//! the fork handlers are `fork.rs`.

use crate::config::Config;
use crate::global::heaps;
use crate::global::tls;
use crate::heap::HeapCore;
use crate::options::LiveConfig;
use core::cell::Cell;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering::*};

pub use crate::global::fork::register as register_fork_handlers;

thread_local! {
    // (The thread's heap pointer itself is in `tls.rs`.) No destructor and a
    // const initialiser: std stores this in a plain `#[thread_local]` slot,
    // with no registration and no allocation, and it stays readable while
    // pthread key destructors run.
    // Frees made without a heap ([`heap_for_frees`]); `EXITING` once the
    // thread's heap was abandoned.
    static HEAPLESS_FREES: Cell<u32> = const { Cell::new(0) };
}

/// The free on which a thread without a heap adopts one: the frees before
/// it (each an atomic push onto the owning page) go uncached, this one and
/// later ones into the new heap's thread cache. A consumer thread that only
/// frees what others allocate gets a cache; a thread that frees a few
/// objects and exits never pays for a heap.
///
/// ```
/// assert_eq!(pagewise::thread::FREES_BEFORE_HEAP, 64);
/// ```
pub const FREES_BEFORE_HEAP: u32 = 64;
const EXITING: u32 = u32::MAX;

/// The global allocator's settings: read from the environment once, then
/// changed only by [`set_config`] ([`crate::options::set`]).
static CONFIG: LiveConfig = LiveConfig::new(Config::DEFAULT);
static CONFIG_STATE: AtomicU8 = AtomicU8::new(0);
const READY: u8 = 2;

/// The global allocator's configuration (read from the environment once;
/// [`crate::options::set`] changes it at run time).
///
/// ```
/// assert!(pagewise::thread::config().reservation_bytes >= 32 << 20);
/// ```
pub fn config() -> Config {
    if CONFIG_STATE.load(Acquire) != READY {
        if CONFIG_STATE
            .compare_exchange(0, 1, Acquire, Relaxed)
            .is_ok()
        {
            CONFIG.store(Config::from_env());
            CONFIG_STATE.store(READY, Release);
        } else {
            while CONFIG_STATE.load(Acquire) != READY {
                core::hint::spin_loop();
            }
        }
    }
    CONFIG.get()
}

/// Makes `c` the global allocator's configuration, for every thread heap
/// (a heap being made meanwhile takes it when it is published) and the
/// heaps made later. Callers serialise (`options::set`).
pub(crate) fn set_config(c: Config) {
    let _ = config();
    CONFIG.store(c);
    heaps::for_each_heap(|h| h.config.store(c));
}

/// Runs `f` on the calling thread's heap, made or adopted on first use.
/// None only if the system is out of memory. A thread whose heap was
/// already abandoned at its exit (an allocation in a later destructor)
/// borrows one for the call: a heap adopted then would never be abandoned
/// again.
#[inline]
pub fn with_heap<R>(f: impl FnOnce(&HeapCore) -> R) -> Option<R> {
    let h = tls::current_heap();
    if !h.is_null() {
        // SAFETY: the calling thread's own heap; heaps are never freed.
        return Some(f(unsafe { &*h }));
    }
    with_new_heap(f)
}

#[cold]
#[inline(never)]
fn with_new_heap<R>(f: impl FnOnce(&HeapCore) -> R) -> Option<R> {
    if exiting() {
        return heaps::with_leased_heap(f);
    }
    let h = acquire();
    // SAFETY: as in `with_heap`.
    (!h.is_null()).then(|| f(unsafe { &*h }))
}

/// Whether the calling thread's exit destructor has run.
fn exiting() -> bool {
    HEAPLESS_FREES
        .try_with(|c| c.get() == EXITING)
        .unwrap_or(true)
}

/// The calling thread's heap if it has one.
#[inline]
pub fn current_or_null() -> *mut HeapCore {
    tls::current_heap()
}

/// The calling thread's heap, or [`crate::heap::empty_heap`] (whose
/// caches are empty and take no slot) if it has none: the C library's
/// fast paths, which then test for no missing heap.
#[inline(always)]
pub(crate) fn current_or_empty() -> *mut HeapCore {
    tls::current_or_empty()
}

/// Bytes the calling thread has allocated through the global allocator
/// since it started, in usable sizes (what jemalloc's `thread.allocated`
/// reads). Counted from figures the heap keeps anyway: the fast paths pay
/// nothing for it. It wraps around at 2⁶⁴. (The hardened build counts
/// each small block's whole slot, its usable size and the bytes its checks
/// use.)
///
/// ```
/// #[global_allocator]
/// static A: pagewise::Pagewise = pagewise::Pagewise;
///
/// let before = pagewise::thread::allocated_bytes();
/// let v = vec![0u8; 1000];
/// assert!(pagewise::thread::allocated_bytes() - before >= 1000);
/// drop(v);
/// ```
pub fn allocated_bytes() -> u64 {
    thread_bytes().0
}

/// Bytes the calling thread has freed through the global allocator since
/// it started, in usable sizes (what jemalloc's `thread.deallocated`
/// reads): blocks it freed, whichever thread allocated them. Frees made
/// before the thread's first allocation (while it has no heap) are not
/// counted. It wraps around at 2⁶⁴. (The hardened build counts a small
/// block's whole slot.)
///
/// ```
/// #[global_allocator]
/// static A: pagewise::Pagewise = pagewise::Pagewise;
///
/// let v = vec![0u8; 1000];
/// let before = pagewise::thread::freed_bytes();
/// drop(v);
/// assert!(pagewise::thread::freed_bytes() - before >= 1000);
/// ```
pub fn freed_bytes() -> u64 {
    thread_bytes().1
}

fn thread_bytes() -> (u64, u64) {
    let h = current_or_null();
    if h.is_null() {
        return (0, 0);
    }
    // SAFETY: the calling thread's own heap, live while it runs.
    unsafe { (*h).thread_bytes() }
}

/// A free the calling thread's cache did not take (`current` is its heap, or
/// null): a thread without a heap caches it in the heap it adopts after
/// [`FREES_BEFORE_HEAP`] frees; otherwise [`HeapCore::free_uncached`], whose
/// result (whether spans were freed for the purger) this returns.
///
/// # Safety
/// As [`HeapCore::free_uncached`]; `current` is the calling thread's heap
/// or null.
pub(crate) unsafe fn free_past_cache(ptr: *mut u8, mut current: *mut HeapCore) -> bool {
    if current.is_null() {
        current = heap_for_frees();
        // SAFETY: forwarded; `current` is the calling thread's heap or null.
        if unsafe { HeapCore::free_to_cache(ptr, current) } {
            return false;
        }
    }
    // SAFETY: forwarded.
    unsafe { HeapCore::free_uncached(ptr, current) }
}

/// For a free by a thread without a heap: the heap to cache it in, once the
/// thread has made [`FREES_BEFORE_HEAP`] frees (null before, and after the
/// thread's heap was abandoned at exit, so destructors that run later do
/// not adopt a heap again).
#[cold]
fn heap_for_frees() -> *mut HeapCore {
    let n = HEAPLESS_FREES.with(|c| {
        let n = c.get().saturating_add(1);
        if n != EXITING {
            c.set(n);
        }
        n
    });
    if n == 1 {
        // So that the exit destructor runs for this thread even if it never
        // gets a heap, and marks it EXITING: a heap adopted by a free in the
        // last round of pthread key destructors would never be abandoned.
        register_exit(HEAPLESS);
        // pthread_setspecific may allocate (keys past the first 32): in the
        // C library that allocation is ours and gives the thread a heap,
        // registered under the key, which the marker just overwrote.
        let h = tls::current_heap();
        if !h.is_null() {
            register_exit(h);
        }
    }
    if n < FREES_BEFORE_HEAP || n == EXITING {
        return null_mut();
    }
    acquire()
}

/// Gives the calling thread a heap: adopted or made. Null only when out
/// of memory.
#[cold]
fn acquire() -> *mut HeapCore {
    let heap = heaps::take_heap();
    if heap.is_null() {
        return null_mut();
    }
    tls::set_current_heap(heap);
    register_exit(heap);
    // Once per process, with the heap in place (pthread_atfork may
    // allocate) and no allocator lock held.
    register_fork_handlers();
    heap
}

// ----- thread exit ---------------------------------------------------------

static KEY: AtomicUsize = AtomicUsize::new(0);

/// The exit key's value for a thread that has freed without a heap but has
/// none (never dereferenced).
const HEAPLESS: *mut HeapCore = core::ptr::without_provenance_mut(1);

fn register_exit(heap: *mut HeapCore) {
    let key = exit_key();
    if let Some(k) = key {
        // SAFETY: a valid key; the value is our heap pointer (or HEAPLESS,
        // never dereferenced). For keys below
        // PTHREAD_KEY_2NDLEVEL_SIZE (32) glibc stores it without allocating.
        unsafe { libc::pthread_setspecific(k, heap as *const libc::c_void) };
    }
}

fn exit_key() -> Option<libc::pthread_key_t> {
    let k = KEY.load(Acquire);
    if k != 0 {
        return Some((k - 1) as libc::pthread_key_t);
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `on_thread_exit` has the required signature.
    if unsafe { libc::pthread_key_create(&mut key, Some(on_thread_exit)) } != 0 {
        return None;
    }
    match KEY.compare_exchange(0, key as usize + 1, AcqRel, Acquire) {
        Ok(_) => Some(key),
        Err(winner) => {
            // SAFETY: our key is unused.
            unsafe { libc::pthread_key_delete(key) };
            Some((winner - 1) as libc::pthread_key_t)
        }
    }
}

extern "C" fn on_thread_exit(value: *mut libc::c_void) {
    let heap = value as *mut HeapCore;
    if heap.is_null() {
        return;
    }
    if heap == HEAPLESS {
        let _ = HEAPLESS_FREES.try_with(|c| c.set(EXITING));
        return;
    }
    // A late allocation in another destructor may give this thread a heap
    // again; glibc then calls us again (up to 4 rounds).
    tls::set_current_heap(null_mut());
    let _ = HEAPLESS_FREES.try_with(|c| c.set(EXITING));
    // SAFETY: the exiting thread owns `heap`; this is its last use of it.
    unsafe { heaps::abandon(heap) };
}

// ----- process start and exit -----------------------------------------------

/// When the program (or `libpagewise.so`) is loaded: registers the fork
/// handlers, reads the configuration now, while the process is
/// single-threaded (so a malformed value is reported once and early), and
/// starts the sampler and the reporter if their variables ask for them
/// (`crate::report`). In a Rust program this runs before `main`; in the C
/// library, when it is preloaded, linked or dlopened.
#[cfg(all(target_os = "linux", not(miri)))]
extern "C" fn on_process_start() {
    register_fork_handlers();
    let _ = config();
    crate::report::start();
}

/// Runs [`on_process_start`] at load (an ELF `.init_array` entry: no
/// registration, so no allocation).
#[cfg(all(target_os = "linux", not(miri)))]
#[used]
#[link_section = ".init_array"]
static ON_PROCESS_START: extern "C" fn() = on_process_start;

/// At `exit()`: checks the exiting thread's caches, writes the exit report
/// (`PAGEWISE_STATS`, `PAGEWISE_STATS_FILE`, the sampler's last line) and
/// the heap profile (`PAGEWISE_PROF_FILE`). A slot freed twice into
/// a thread cache is caught when it leaves the cache (the next allocation
/// of its class, a flush, the thread's exit), but the thread that calls
/// `exit()` has no exit of its own: a program whose last act is a double
/// free would otherwise end normally. Linux only (an ELF `.fini_array`
/// entry, below); elsewhere such a double free is caught only if the
/// program allocates again, and there is no exit report.
#[cfg(all(target_os = "linux", not(miri)))]
extern "C" fn on_process_exit() {
    let heap = tls::current_heap();
    if !heap.is_null() {
        // SAFETY: the calling thread's own heap; exit handlers run between
        // its allocator calls.
        unsafe { (*heap).verify_caches() };
    }
    crate::report::exit::at_exit();
    crate::profile::dump();
}

/// Runs [`on_process_exit`] at `exit()`, after the program's own `atexit`
/// handlers, with the other destructors (no registration, so no
/// allocation).
#[cfg(all(target_os = "linux", not(miri)))]
#[used]
#[link_section = ".fini_array"]
static ON_PROCESS_EXIT: extern "C" fn() = on_process_exit;
