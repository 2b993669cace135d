//! Every thread heap of the global allocator: made, owned, abandoned,
//! adopted, visited.
//!
//! Heaps live in memory mapped for them (never from the global allocator)
//! and are never unmapped, so a pointer to a heap stays valid forever. All
//! of them are on one push-only list; those whose thread exited are also on
//! the abandoned list, waiting for a new thread to adopt them whole.
//!
//! Who may touch a heap's owner-only state is one word, `HeapCore::owner`,
//! and every change of it is a method here:
//! - a thread id: the heap's thread owns it (set before the heap is
//!   published, or by [`adopt`]);
//! - [`ABANDONED`] (0): no owner; its thread exited ([`abandon`]);
//! - [`VISITING`]: `trim()` or `stats()` of another thread works on an
//!   abandoned heap as its owner for a moment ([`visit_abandoned`]).
//!
//! Visiting never takes a heap off the abandoned list, so a thread starting
//! meanwhile adopts it (waiting out the visit) instead of making a new heap:
//! the number of heaps stays bounded by the number of threads alive at
//! once, plus the few a lease or a visit holds for an instant.

use crate::global::thread::config;
use crate::heap::HeapCore;
use crate::memory::reservation::Reservations;
use crate::os::source::{PageSource, SystemPages};
use crate::sync::lock::Locked;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicPtr, Ordering::*};

/// The page source of the global allocator.
pub static SYSTEM: SystemPages = SystemPages::new();
/// Its reservations.
pub static RESERVATIONS: Locked<Reservations> = Locked::new(Reservations::new());
/// Every thread heap ever made (push-only list; heaps are reused, never freed).
static HEAPS: AtomicPtr<HeapCore> = AtomicPtr::new(null_mut());
/// Heaps whose thread exited, waiting for a new thread (linked through
/// `next_abandoned`).
pub(crate) static ABANDONED_LIST: Locked<usize> = Locked::new(0);
/// Held for a whole pass of [`visit_abandoned`] (and by the fork
/// handlers, so that no visit is half done in a child).
pub(crate) static VISITS: Locked<()> = Locked::new(());
/// Bump allocator for heap structures.
pub(crate) static META: Locked<Meta> = Locked::new(Meta { next: 0, end: 0 });

/// `HeapCore::owner` of a heap nobody owns: its thread exited.
pub const ABANDONED: usize = 0;
/// `HeapCore::owner` of an abandoned heap that another thread's `trim()`
/// or `stats()` is working on.
pub const VISITING: usize = usize::MAX;

pub(crate) struct Meta {
    next: usize,
    end: usize,
}

const META_CHUNK: usize = 1 << 20;

/// The calling thread's id, as stored in `HeapCore::owner` (never 0 or
/// [`VISITING`]: pthread ids are addresses).
pub fn thread_id() -> usize {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as usize }
}

/// A heap for the calling thread: an abandoned one adopted whole, else a
/// new one. Null only when out of memory. The caller owns it.
pub fn take_heap() -> *mut HeapCore {
    match pop_abandoned() {
        Some(h) => {
            adopt(h);
            h
        }
        None => create().unwrap_or(null_mut()),
    }
}

/// Makes an abandoned heap, just taken off the list, the calling thread's,
/// waiting out a visit in progress.
fn adopt(h: *mut HeapCore) {
    // SAFETY: heaps are never freed.
    let owner = unsafe { &(*h).owner };
    let me = thread_id();
    let mut spins = 0u32;
    crate::sync::perturb::point();
    while owner
        .compare_exchange_weak(ABANDONED, me, Acquire, Relaxed)
        .is_err()
    {
        // A visitor holds it for the length of one trim or stats pass.
        spins += 1;
        if spins < 64 {
            core::hint::spin_loop();
        } else {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
    }
}

/// Gives up a heap the calling thread owns (its thread is exiting, or a
/// lease ends): its empty pages go back to the span pool, and the heap goes
/// on the abandoned list for the next thread.
///
/// # Safety
/// The calling thread owns `h` and does not use it afterwards.
pub unsafe fn abandon(h: *mut HeapCore) {
    // SAFETY: per the caller; `abandon` ends with the owner set to ABANDONED.
    unsafe { (*h).abandon() };
    crate::sync::perturb::point();
    let mut head = ABANDONED_LIST.lock();
    // SAFETY: `h` is not on the list (its owner just let it go); the list
    // lock serialises the link.
    unsafe { (*h).next_abandoned = *head as *mut HeapCore };
    *head = h as usize;
}

fn pop_abandoned() -> Option<*mut HeapCore> {
    let mut head = ABANDONED_LIST.lock();
    let h = *head as *mut HeapCore;
    if h.is_null() {
        return None;
    }
    // SAFETY: abandoned heaps are live and linked through `next_abandoned`.
    *head = unsafe { (*h).next_abandoned } as usize;
    Some(h)
}

fn create() -> Option<*mut HeapCore> {
    let at = meta_alloc(core::mem::size_of::<HeapCore>())? as *mut HeapCore;
    // SAFETY: fresh, aligned, zeroed metadata memory; SYSTEM and
    // RESERVATIONS are statics. The owner is set before the heap is
    // published, so no visitor ever takes it for abandoned.
    unsafe {
        HeapCore::init_at(
            at,
            &SYSTEM as &dyn PageSource as *const dyn PageSource,
            &RESERVATIONS,
            config(),
            true,
        );
        (*at).owner.store(thread_id(), Relaxed);
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
    }
    let p = m.next;
    m.next += size;
    Some(p)
}

/// Runs `f` on a heap the calling thread owns only for the call (a thread
/// whose own heap was already abandoned at exit): adopted or made, then
/// abandoned again at once. Null-free: None only when out of memory.
pub fn with_leased_heap<R>(f: impl FnOnce(&HeapCore) -> R) -> Option<R> {
    let h = take_heap();
    if h.is_null() {
        return None;
    }
    // SAFETY: the calling thread owns `h` until it abandons it below.
    let r = f(unsafe { &*h });
    // SAFETY: as above; not used after.
    unsafe { abandon(h) };
    Some(r)
}

/// Calls `f` on every thread heap (live or abandoned). `f` may only touch
/// what any thread may: atomics, and state under the locks it takes.
pub fn for_each_heap(mut f: impl FnMut(&HeapCore)) {
    let mut h = HEAPS.load(Acquire);
    while !h.is_null() {
        // SAFETY: heaps are never freed; the list is push-only.
        let heap = unsafe { &*h };
        f(heap);
        h = heap.next_heap.load(Acquire);
    }
}

/// Runs `f` on every abandoned heap with the exclusive access of an owner,
/// one at a time, leaving each on the abandoned list: a thread that starts
/// meanwhile adopts it once `f` is done with it, rather than making a new
/// heap.
pub fn visit_abandoned(mut f: impl FnMut(&HeapCore)) {
    let _pass = VISITS.lock();
    for_each_heap(|h| {
        crate::sync::perturb::point();
        if h.owner
            .compare_exchange(ABANDONED, VISITING, Acquire, Relaxed)
            .is_ok()
        {
            f(h);
            h.owner.store(ABANDONED, Release);
        }
    });
}
