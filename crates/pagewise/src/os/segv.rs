//! pagewise's one SIGSEGV handler, shared by the parts that fault on
//! purpose: the guard pool's inaccessible pages ([`crate::guard`]) and the
//! write barrier of meshing ([`super::barrier`]). Each registers a
//! *client*, asked in turn whether a fault is its own; a fault no client
//! claims goes to the handler that was installed before ours, or, with
//! none, kills the process as it would have without pagewise. One handler
//! for both, so that neither can chain to the other in a loop.
//!
//! The handler is (re)installed by [`ensure`], which the clients call at
//! the points where they are about to make a page fault: a program (or the
//! Rust runtime, whose stack-overflow handler goes in after the first
//! allocation) may have put its own handler in since, and ours then goes
//! in front of it, chaining to it. One `sigaction` call when nothing
//! changed. Linux only.

use core::sync::atomic::{AtomicI32, AtomicUsize, Ordering::*};

/// Who may claim a fault, asked in this order.
#[derive(Clone, Copy)]
pub enum Client {
    /// The guard pool (its faults are reports: they never return).
    Guard = 0,
    /// The write barrier of meshing (its faults wait, then retry).
    Barrier = 1,
}

/// Claims a fault: `(signal info, ucontext)`; true if it was the client's
/// (handled: the access is retried on return). Must be async-signal-safe.
pub type Claim = fn(*mut libc::siginfo_t, *mut libc::c_void) -> bool;

/// Each client's `Claim` (0: none).
static CLIENTS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// The handler found in place when ours went in (its address and flags),
/// to chain to: atomics, as a fault may read them while `ensure` reinstalls.
static PREVIOUS_HANDLER: AtomicUsize = AtomicUsize::new(0);
static PREVIOUS_FLAGS: AtomicI32 = AtomicI32::new(0);

/// Registers `claim` for `client` (once, before its first fault).
pub fn register(client: Client, claim: Claim) {
    CLIENTS[client as usize].store(claim as usize, Release);
}

/// Puts our handler in place unless it is there, chaining to whatever is.
pub fn ensure() {
    let ours = on_segv as *const () as usize;
    // SAFETY: a zeroed sigaction is a valid out-parameter.
    let mut current: libc::sigaction = unsafe { core::mem::zeroed() };
    // SAFETY: valid pointers.
    if unsafe { libc::sigaction(libc::SIGSEGV, core::ptr::null(), &mut current) } != 0
        || current.sa_sigaction == ours
    {
        return;
    }
    PREVIOUS_FLAGS.store(current.sa_flags, Relaxed);
    PREVIOUS_HANDLER.store(current.sa_sigaction, Release);
    // SAFETY: a zeroed sigaction is valid; we fill handler, flags, mask.
    let mut action: libc::sigaction = unsafe { core::mem::zeroed() };
    action.sa_sigaction = ours;
    // On the alternate stack where there is one: a stack overflow must
    // still reach the handler of the program (or the Rust runtime).
    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
    // SAFETY: valid pointers.
    unsafe {
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGSEGV, &action, core::ptr::null_mut());
    }
}

extern "C" fn on_segv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    for c in &CLIENTS {
        let claim = c.load(Acquire);
        // SAFETY: a non-zero entry is a `Claim` stored by `register`.
        if claim != 0 && unsafe { core::mem::transmute::<usize, Claim>(claim) }(info, ctx) {
            return;
        }
    }
    // SAFETY: the handler that was there before, called as it asked.
    unsafe { chain(sig, info, ctx) };
}

/// Passes a fault that is no client's to the previous handler; with none,
/// restores the default action so that the fault, retried, kills the
/// process as it would have.
///
/// # Safety
/// Called from the SIGSEGV handler with its arguments.
unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let h = PREVIOUS_HANDLER.load(Acquire);
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // SAFETY: a zeroed sigaction is SIG_DFL; the faulting instruction
        // runs again on return and the default action applies.
        unsafe {
            let dfl: libc::sigaction = core::mem::zeroed();
            libc::sigaction(sig, &dfl, core::ptr::null_mut());
        }
        return;
    }
    // SAFETY: the previous handler, with the calling convention its flags
    // say it has.
    unsafe {
        if PREVIOUS_FLAGS.load(Relaxed) & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                core::mem::transmute(h);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(libc::c_int) = core::mem::transmute(h);
            f(sig);
        }
    }
}
