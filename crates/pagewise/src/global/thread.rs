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
//! Heaps live in memory mapped for them (never from the global allocator)
//! and are never unmapped, so a pointer to a heap stays valid forever.

use crate::config::Config;
use crate::global::tls;
use crate::heap::HeapCore;
use crate::memory::reservation::Reservations;
use crate::os::source::{PageSource, SystemPages};
use crate::sync::lock::{self, Locked};
use core::cell::{Cell, UnsafeCell};
use core::ptr::null_mut;
use core::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering::*};

/// The page source of the global allocator.
pub static SYSTEM: SystemPages = SystemPages::new();
/// Its reservations.
pub static RESERVATIONS: Locked<Reservations> = Locked::new(Reservations::new());
/// Every thread heap ever made (push-only list; heaps are reused, never freed).
static HEAPS: AtomicPtr<HeapCore> = AtomicPtr::new(null_mut());
/// Heaps whose thread exited, waiting for a new thread.
static ABANDONED: Locked<usize> = Locked::new(0);
/// Bump allocator for heap structures.
static META: Locked<Meta> = Locked::new(Meta {
    next: 0,
    end: 0,
    mapped: 0,
});

struct Meta {
    next: usize,
    end: usize,
    mapped: usize,
}

const META_CHUNK: usize = 1 << 20;

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

struct ConfigCell(UnsafeCell<Config>);
// SAFETY: written once before CONFIG_STATE becomes READY, read-only after.
unsafe impl Sync for ConfigCell {}
static CONFIG: ConfigCell = ConfigCell(UnsafeCell::new(Config::DEFAULT));
static CONFIG_STATE: AtomicU8 = AtomicU8::new(0);
const READY: u8 = 2;

/// The global allocator's configuration (read from the environment once).
pub fn config() -> Config {
    if CONFIG_STATE.load(Acquire) != READY {
        if CONFIG_STATE
            .compare_exchange(0, 1, Acquire, Relaxed)
            .is_ok()
        {
            // SAFETY: we won the race to initialise; readers wait for READY.
            unsafe { *CONFIG.0.get() = Config::from_env() };
            CONFIG_STATE.store(READY, Release);
        } else {
            while CONFIG_STATE.load(Acquire) != READY {
                core::hint::spin_loop();
            }
        }
    }
    // SAFETY: READY means the value is written and never changes again.
    unsafe { *CONFIG.0.get() }
}

/// The calling thread's heap, made or adopted on first use. Null only if
/// the system is out of memory.
#[inline]
pub fn current() -> *mut HeapCore {
    let h = tls::current_heap();
    if !h.is_null() {
        return h;
    }
    acquire()
}

/// The calling thread's heap if it has one.
#[inline]
pub fn current_or_null() -> *mut HeapCore {
    tls::current_heap()
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
    }
    if n < FREES_BEFORE_HEAP || n == EXITING {
        return null_mut();
    }
    current()
}

#[cold]
fn acquire() -> *mut HeapCore {
    let heap = match pop_abandoned() {
        Some(h) => h,
        None => match create() {
            Some(h) => h,
            None => return null_mut(),
        },
    };
    // SAFETY: the heap is ours now: abandoned heaps have no owner and new
    // ones were never published to another thread as owned.
    unsafe { (*heap).owner.store(thread_id(), Release) };
    tls::set_current_heap(heap);
    register_exit(heap);
    heap
}

fn thread_id() -> usize {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as usize }
}

fn create() -> Option<*mut HeapCore> {
    let at = meta_alloc(core::mem::size_of::<HeapCore>())? as *mut HeapCore;
    // SAFETY: fresh, aligned, zeroed metadata memory; SYSTEM and
    // RESERVATIONS are statics.
    unsafe {
        HeapCore::init_at(
            at,
            &SYSTEM as &dyn PageSource as *const dyn PageSource,
            &RESERVATIONS,
            config(),
            true,
        );
    }
    let mut head = HEAPS.load(Relaxed);
    loop {
        // SAFETY: `at` is not yet published.
        unsafe { (*at).next_heap.store(head, Relaxed) };
        match HEAPS.compare_exchange_weak(head, at, Release, Relaxed) {
            Ok(_) => return Some(at),
            Err(seen) => head = seen,
        }
    }
}

fn meta_alloc(size: usize) -> Option<usize> {
    let size = crate::memory::layout::align_up(size, 64);
    let mut m = META.lock();
    if m.next + size > m.end {
        let chunk = size.max(META_CHUNK);
        let p = SYSTEM.map(chunk, crate::memory::layout::OS_PAGE)?.as_ptr() as usize;
        m.next = p;
        m.end = p + chunk;
        m.mapped += chunk;
    }
    let p = m.next;
    m.next += size;
    Some(p)
}

/// Bytes mapped for heap structures.
pub fn meta_mapped() -> usize {
    META.lock().mapped
}

fn pop_abandoned() -> Option<*mut HeapCore> {
    let mut head = ABANDONED.lock();
    let h = *head as *mut HeapCore;
    if h.is_null() {
        return None;
    }
    // SAFETY: abandoned heaps are live and linked through `next_abandoned`.
    *head = unsafe { (*h).next_abandoned } as usize;
    Some(h)
}

fn push_abandoned(h: *mut HeapCore) {
    let mut head = ABANDONED.lock();
    // SAFETY: `h` has no owner; the list lock serialises the link.
    unsafe { (*h).next_abandoned = *head as *mut HeapCore };
    *head = h as usize;
}

/// Runs `f` on every abandoned heap, with the exclusive access of an owner:
/// the heaps are taken off the list meanwhile (a new thread then makes a
/// fresh heap rather than wait) and put back afterwards.
pub fn for_each_abandoned(mut f: impl FnMut(&HeapCore)) {
    let mut taken = {
        let mut head = ABANDONED.lock();
        core::mem::replace(&mut *head, 0) as *mut HeapCore
    };
    while !taken.is_null() {
        // SAFETY: off the list, the heap has no owner but us; heaps are
        // never freed.
        let next = unsafe { (*taken).next_abandoned };
        // SAFETY: as above.
        f(unsafe { &*taken });
        push_abandoned(taken);
        taken = next;
    }
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
    unsafe { (*heap).abandon() };
    push_abandoned(heap);
}

/// Calls `f` on every thread heap (live or abandoned).
pub fn for_each_heap(mut f: impl FnMut(&HeapCore)) {
    let mut h = HEAPS.load(Acquire);
    while !h.is_null() {
        // SAFETY: heaps are never freed; the list is push-only.
        let heap = unsafe { &*h };
        f(heap);
        h = heap.next_heap.load(Acquire);
    }
}

// ----- fork -------------------------------------------------------------------

/// Takes every allocator lock, so that `fork()` cannot copy one held by a
/// thread that will not exist in the child. Call before `fork()` (the C
/// library registers this with `pthread_atfork`).
pub fn fork_prepare() {
    crate::global::purger::pause();
    lock::hold(&ABANDONED);
    lock::hold(&META);
    for_each_heap(|h| lock::hold(&h.spans));
    lock::hold(&RESERVATIONS);
}

/// Releases what [`fork_prepare`] took, in the parent.
pub fn fork_parent() {
    // SAFETY: this thread took each lock in fork_prepare.
    unsafe {
        lock::release(&RESERVATIONS);
        for_each_heap(|h| lock::release(&h.spans));
        lock::release(&META);
        lock::release(&ABANDONED);
    }
    crate::global::purger::resume();
}

/// Releases what [`fork_prepare`] took, in the child. Heaps of threads that
/// do not exist in the child keep their objects (the child may free them)
/// but are not reused.
pub fn fork_child() {
    // SAFETY: in the child only this thread exists.
    unsafe {
        RESERVATIONS.reset_after_fork();
        for_each_heap(|h| h.spans.reset_after_fork());
        META.reset_after_fork();
        ABANDONED.reset_after_fork();
    }
    crate::global::purger::after_fork_child();
}
