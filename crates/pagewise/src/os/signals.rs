//! The program's signals on pagewise's threads.
//!
//! A thread pagewise starts (the purger, the sampler, the live reporter)
//! starts with every signal a program may send blocked, and so never
//! takes one of the program's: a program that blocks a signal on its own
//! threads to wait for it (`sigwait`, `signalfd`) would otherwise lose it
//! to a thread of pagewise's that the kernel found open (its default
//! action, or the program's handler, on the wrong thread). The live
//! reporter leaves open the report signal, whose handler is pagewise's.
//!
//! A thread that copies pages for meshing or a fork raises the write
//! barrier: a store to a page it is copying waits until it lowers it. If a
//! handler of the program ran on that thread and stored into such a page,
//! it would wait for a copy that cannot finish until it returns. So the
//! purger runs with every signal a program may send blocked (it never runs
//! a handler of the program: the kernel delivers a process-directed signal
//! to another thread, or keeps it pending), and a pass made on a program's
//! thread blocks them while it copies. Faults (SIGSEGV, SIGBUS, SIGILL,
//! SIGFPE, SIGTRAP, SIGSYS) stay open: a blocked fault kills the process.

/// A thread's signal mask as it was before [`block_async`].
pub(crate) struct Mask(libc::sigset_t);

/// Blocks every signal but the faults on the calling thread; returns the
/// mask to put back.
pub(crate) fn block_async() -> Mask {
    block_async_but(0)
}

/// [`block_async`], but leaving `open` (0: none) as it was: a signal
/// whose handler is pagewise's own, which its thread may take.
pub(crate) fn block_async_but(open: libc::c_int) -> Mask {
    // SAFETY: zeroed sets are valid out-parameters; plain system calls.
    unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        for fault in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGTRAP,
            libc::SIGSYS,
        ] {
            libc::sigdelset(&mut all, fault);
        }
        if open > 0 {
            libc::sigdelset(&mut all, open);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        Mask(old)
    }
}

/// Puts back the mask [`block_async`] returned.
pub(crate) fn restore(mask: Mask) {
    // SAFETY: a mask read by `pthread_sigmask`.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &mask.0, core::ptr::null_mut()) };
}
