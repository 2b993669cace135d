//! `fork()`: a child of a multi-threaded process gets a copy of memory but
//! only the forking thread, so any allocator lock another thread held at
//! that instant would stay held in the child forever. The handlers here
//! take every lock of the global allocator before the fork and release
//! (parent) or reset (child) them after.
//!
//! [`register`] installs them with `pthread_atfork`, once per process,
//! whoever asks first: the constructor run at load (Linux: a Rust program
//! using `#[global_allocator]` or `libpagewise.so`, with no call of its
//! own) or the first heap the global allocator makes. `pthread_atfork` is called
//! with no allocator lock held and, in glibc, takes no memory of its own for
//! the first 48 handlers of the process.
//!
//! Heaps of threads that do not exist in the child keep their objects (the
//! child may free them) but are not reused: their owner-only state may have
//! been in the middle of a fast path when the copy was made.

use crate::global::heaps::{for_each_heap, ABANDONED_LIST, META, RESERVATIONS, VISITS};
use crate::memory::size_class::CLASSES;
use crate::memory::transfer;
use crate::sync::lock;
use core::sync::atomic::{AtomicBool, Ordering::*};

static REGISTERED: AtomicBool = AtomicBool::new(false);

/// Installs the fork handlers once per process (later calls do nothing).
///
/// ```
/// pagewise::thread::register_fork_handlers();
/// pagewise::thread::register_fork_handlers(); // once only
/// ```
pub fn register() {
    if REGISTERED.load(Relaxed) || REGISTERED.swap(true, AcqRel) {
        return;
    }
    // SAFETY: three functions with the signature pthread_atfork expects.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

extern "C" fn prepare() {
    // A config being read by another thread would leave a child waiting
    // for it forever: read it now, before any lock.
    let _ = crate::global::thread::config();
    crate::global::purger::pause();
    lock::hold(&VISITS);
    lock::hold(&ABANDONED_LIST);
    // Heaps are published only with META held (`heaps::publish`), so from
    // here on the list is the one `parent` and `child` walk to release.
    lock::hold(&META);
    // Each thread's page lists (so none is left held by a thread on a slow
    // path, which the child would never see finish), then the span pools:
    // the order every slow path takes them in.
    for_each_heap(|h| lock::hold(h.local_lock()));
    for_each_heap(|h| lock::hold(&h.spans));
    lock::hold(&RESERVATIONS);
    // Leaf locks: no other lock is taken while one is held.
    for class in 0..CLASSES {
        lock::hold(transfer::GLOBAL.lock_of(class));
    }
    lock::hold(crate::profile::sites::SITES.lock());
    // Last: the heap becomes read-only until the child has its own copy
    // (a meshing heap's memory is shared with the child otherwise).
    #[cfg(target_os = "linux")]
    if crate::global::heaps::meshing() {
        crate::global::heaps::SHARED.fork_prepare();
    }
}

extern "C" fn parent() {
    #[cfg(target_os = "linux")]
    if crate::global::heaps::meshing() {
        crate::global::heaps::SHARED.fork_parent();
    }
    // SAFETY: this thread took each lock in `prepare`.
    unsafe {
        lock::release(crate::profile::sites::SITES.lock());
        for class in 0..CLASSES {
            lock::release(transfer::GLOBAL.lock_of(class));
        }
        lock::release(&RESERVATIONS);
        for_each_heap(|h| lock::release(&h.spans));
        for_each_heap(|h| lock::release(h.local_lock()));
        lock::release(&META);
        lock::release(&ABANDONED_LIST);
        lock::release(&VISITS);
    }
    crate::global::purger::resume();
}

extern "C" fn child() {
    #[cfg(target_os = "linux")]
    if crate::global::heaps::meshing() {
        crate::global::heaps::SHARED.fork_child();
    }
    // SAFETY: in the child only this thread exists.
    unsafe {
        crate::profile::sites::SITES.lock().reset_after_fork();
        for class in 0..CLASSES {
            transfer::GLOBAL.lock_of(class).reset_after_fork();
        }
        RESERVATIONS.reset_after_fork();
        for_each_heap(|h| h.spans.reset_after_fork());
        for_each_heap(|h| h.local_lock().reset_after_fork());
        META.reset_after_fork();
        ABANDONED_LIST.reset_after_fork();
        VISITS.reset_after_fork();
    }
    // A mesh pass paused for the fork (its page lists let go) has no
    // thread in the child to end it.
    for_each_heap(|h| h.forget_mesh_pass_after_fork());

    crate::global::heaps::end_visits_after_fork();
    crate::global::purger::after_fork_child();
    // The sampler's thread is not in the child either: the child does not
    // sample (one that execs starts its own sampler at load).
    #[cfg(all(target_os = "linux", not(miri)))]
    crate::report::sampler::after_fork_child();
}
