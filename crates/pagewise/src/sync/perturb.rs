//! Schedule perturbation: in a build with `--cfg pagewise_perturb`, every
//! [`point`] may spin for a while or yield the CPU, at random, so that the
//! interleavings a test of many threads sees are not the few the hardware
//! happens to favour. Points sit at lock acquisitions and releases, before
//! each CAS of the cross-thread protocols, and at the state changes between
//! them (a span taken and then initialised, a heap claimed, a page marked
//! full). In every other build [`point`] is empty and costs nothing.
//!
//! ```sh
//! RUSTFLAGS="--cfg pagewise_perturb" cargo test --release -p pagewise --test stress
//! ```
//!
//! `PAGEWISE_PERTURB=N` (read once, at the first point) sets how often a
//! point acts: one point in N yields, one in N/8 spins (default 64, at
//! least 8).

#[cfg(pagewise_perturb)]
mod imp {
    use core::cell::Cell;
    use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

    std::thread_local! {
        // A const initialiser and no destructor: no allocation, usable at
        // any time in a thread's life.
        static STATE: Cell<u64> = const { Cell::new(0) };
    }

    /// One point in RATE yields (0: not read yet).
    static RATE: AtomicU64 = AtomicU64::new(0);

    fn rate() -> u64 {
        let r = RATE.load(Relaxed);
        if r != 0 {
            return r;
        }
        let n = crate::config::Variable::Perturb.number().unwrap_or(64);
        RATE.store(n, Relaxed);
        n
    }

    #[inline(never)]
    pub fn point() {
        let x = STATE
            .try_with(|s| {
                let mut x = s.get();
                if x == 0 {
                    // Seed from the thread's stack address.
                    x = (&x as *const u64 as u64) | 1;
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                s.set(x);
                x
            })
            .unwrap_or(1);
        let rate = rate();
        if x % rate == 0 {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        } else if x % (rate / 8) == 0 {
            for _ in 0..(x >> 32) % 2048 {
                core::hint::spin_loop();
            }
        }
    }
}

#[cfg(pagewise_perturb)]
mod window {
    use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    /// The test's hook (a `fn()`), or 0.
    static HOOK: AtomicUsize = AtomicUsize::new(0);

    /// Sets (or clears) the function every [`super::window`] calls.
    pub fn set_window_hook(hook: Option<fn()>) {
        HOOK.store(hook.map_or(0, |f| f as usize), Relaxed);
    }

    pub fn window() {
        super::point();
        let h = HOOK.load(Relaxed);
        if h != 0 {
            // SAFETY: only `set_window_hook` stores, and only a `fn()`.
            let f: fn() = unsafe { core::mem::transmute::<usize, fn()>(h) };
            f();
        }
    }
}

#[cfg(pagewise_perturb)]
pub use window::set_window_hook;

#[cfg(not(pagewise_perturb))]
mod imp {
    #[inline(always)]
    pub fn point() {}
}

/// A place where another thread's step may fall (see the module docs).
#[inline(always)]
pub fn point() {
    imp::point()
}

/// A point inside a window two threads' steps must not both fall into
/// unseen (the free fast path between reading a page's slab word and
/// storing the slot's key). In the perturbation build a test can make
/// another step happen exactly there ([`set_window_hook`]), so that the
/// protocol closing the window is tested on the allocator's own code; in
/// every other build it is empty.
#[inline(always)]
pub fn window() {
    #[cfg(pagewise_perturb)]
    window::window();
}
