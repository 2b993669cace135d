//! Which process this is, without a system call each time it is asked.
//!
//! Meshing's shared pages, its write barrier and its userfaultfd belong to
//! the process that made them: a child forked without the fork handlers
//! (`_Fork()`, the raw system call) inherits their descriptors and must
//! never act on the parent's file through them. Each of their operations
//! used to compare `getpid()` with the maker's pid: about four system
//! calls per OS page a mesh pass meshes.
//!
//! Here the pid is kept in a page of its own marked `MADV_WIPEONFORK`: the
//! kernel hands every child, however it was forked, that page filled with
//! zeros. A zero read there means "not asked yet in this process", and
//! only then is `getpid()` called (and its answer stored). Where the page
//! cannot be had (no `MADV_WIPEONFORK` before Linux 4.14, or the mapping
//! refused), or before [`watch`] has run, [`id`] calls `getpid()` as before.
//!
//! Async-signal-safe: [`id`] is a load, or a system call and a store.

use core::sync::atomic::{AtomicI32, AtomicPtr, Ordering::*};

/// The wiped-on-fork word holding this process's pid (0: not asked in this
/// process yet); null until [`watch`] maps it.
static WORD: AtomicPtr<AtomicI32> = AtomicPtr::new(core::ptr::null_mut());

/// Whether a [`watch`] was refused (then [`id`] always asks the kernel).
static REFUSED: AtomicI32 = AtomicI32::new(0);

/// This process's id: the kernel's answer, asked once per process after
/// [`watch`].
#[inline]
pub fn id() -> i32 {
    let word = WORD.load(Acquire);
    if word.is_null() {
        return getpid();
    }
    // SAFETY: `word` points into the page `watch` mapped, never unmapped.
    let word = unsafe { &*word };
    match word.load(Relaxed) {
        0 => {
            let pid = getpid();
            word.store(pid, Relaxed);
            pid
        }
        pid => pid,
    }
}

/// Maps the wiped-on-fork word, once per process (its children inherit
/// it). Returns whether [`id`] can answer without a system call.
pub fn watch() -> bool {
    if !WORD.load(Acquire).is_null() {
        return true;
    }
    if REFUSED.load(Relaxed) != 0 {
        return false;
    }
    let Some(page) = wiped_page() else {
        REFUSED.store(1, Relaxed);
        return false;
    };
    if WORD
        .compare_exchange(core::ptr::null_mut(), page, AcqRel, Acquire)
        .is_err()
    {
        // SAFETY: our own page, never published.
        unsafe { libc::munmap(page.cast(), crate::memory::layout::os_page()) };
    }
    true
}

/// A private page that every child gets back zeroed, or None.
fn wiped_page() -> Option<*mut AtomicI32> {
    let size = crate::memory::layout::os_page();
    // SAFETY: a fresh private anonymous mapping of our own.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: the mapping just made, whole.
    if unsafe { libc::madvise(p, size, libc::MADV_WIPEONFORK) } != 0 {
        // SAFETY: the mapping just made, not published.
        unsafe { libc::munmap(p, size) };
        return None;
    }
    Some(p.cast())
}

fn getpid() -> i32 {
    #[cfg(test)]
    tests::ASKED.with(|n| n.set(n.get() + 1));
    // SAFETY: plain system call (async-signal-safe).
    unsafe { libc::getpid() }
}

#[cfg(test)]
pub(crate) mod tests {
    std::thread_local! {
        /// This thread's `getpid` system calls made here.
        pub(crate) static ASKED: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
    }

    fn asked() -> u64 {
        ASKED.with(|n| n.get())
    }

    #[test]
    fn asks_the_kernel_once_then_answers_from_memory() {
        assert!(super::watch(), "MADV_WIPEONFORK refused here");
        // SAFETY: plain system call.
        let pid = unsafe { libc::getpid() };
        assert_eq!(super::id(), pid);
        let before = asked();
        for _ in 0..100 {
            assert_eq!(super::id(), pid);
        }
        assert_eq!(asked() - before, 0, "no system call once asked");
    }

    /// A child of the raw fork system call (no atfork handlers, no libc
    /// bookkeeping) must see its own pid, never its parent's.
    #[test]
    fn a_child_forked_without_handlers_gets_its_own_id() {
        assert!(super::watch(), "MADV_WIPEONFORK refused here");
        // SAFETY: plain system call.
        let parent = unsafe { libc::getpid() };
        assert_eq!(super::id(), parent);
        // SAFETY: the raw fork; the child only makes system calls and
        // reads memory, then `_exit`s.
        let child = unsafe { libc::syscall(libc::SYS_fork) } as i32;
        assert!(child >= 0, "fork failed");
        if child == 0 {
            // SAFETY: plain system calls in the child.
            let own = unsafe { libc::syscall(libc::SYS_getpid) } as i32;
            let seen = super::id();
            let again = super::id();
            let code = if seen == own && again == own && seen != parent {
                0
            } else {
                1
            };
            // SAFETY: leaves the child at once.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: our child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(libc::WIFEXITED(status));
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "the child saw its parent's id"
        );
        assert_eq!(super::id(), parent);
    }
}
