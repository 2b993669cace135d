//! A small spin lock for the slow paths (span pool, reservations, heap lists).
//!
//! Never taken on the malloc/free fast path. It does not allocate, so it is
//! usable inside the allocator, and the fork hooks can take and reset it.

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, Ordering};

/// Data behind a spin lock.
pub struct Locked<T> {
    locked: AtomicBool,
    data: UnsafeCell<T>,
}

// SAFETY: the lock serialises all access to `data`.
unsafe impl<T: Send> Sync for Locked<T> {}
// SAFETY: moving the lock moves the data; no thread holds a guard then.
unsafe impl<T: Send> Send for Locked<T> {}

/// Proof that the lock is held; releases it on drop.
pub struct Guard<'a, T> {
    lock: &'a Locked<T>,
}

impl<T> Locked<T> {
    /// A new, unlocked value.
    pub const fn new(data: T) -> Self {
        Locked {
            locked: AtomicBool::new(false),
            data: UnsafeCell::new(data),
        }
    }

    /// Takes the lock, spinning (then yielding) while another thread holds it.
    pub fn lock(&self) -> Guard<'_, T> {
        let mut spins = 0u32;
        crate::sync::perturb::point();
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            while self.locked.load(Ordering::Relaxed) {
                spins += 1;
                if spins < 64 {
                    core::hint::spin_loop();
                } else {
                    yield_now();
                }
            }
        }
    }

    /// Takes the lock if it is free.
    pub fn try_lock(&self) -> Option<Guard<'_, T>> {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Guard { lock: self })
    }

    /// The data, for the thread that took the lock with [`hold`] (fork
    /// handlers, which hold it across functions).
    ///
    /// # Safety
    /// The calling thread holds the lock.
    pub unsafe fn held_data(&self) -> *mut T {
        self.data.get()
    }

    /// Releases a lock held across `fork()` by the forking thread, or leaves
    /// it free, in the child process.
    ///
    /// # Safety
    /// Only in a freshly forked child, where no other thread exists.
    pub unsafe fn reset_after_fork(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

/// Takes the lock and forgets the guard: for fork hooks, which take locks in
/// one function and release them in another.
pub fn hold<T>(lock: &Locked<T>) {
    core::mem::forget(lock.lock());
}

/// Releases a lock taken by [`hold`].
///
/// # Safety
/// The calling thread took the lock with `hold`.
pub unsafe fn release<T>(lock: &Locked<T>) {
    lock.locked.store(false, Ordering::Release);
}

/// Gives the CPU to another thread (spin loops that waited long).
pub fn yield_now() {
    // SAFETY: sched_yield has no preconditions.
    unsafe {
        libc::sched_yield();
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves the lock is held.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves the lock is held, exclusively.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
        crate::sync::perturb::point();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excludes_and_releases() {
        let l = Locked::new(1);
        {
            let mut g = l.lock();
            *g += 1;
            assert!(l.try_lock().is_none());
        }
        assert_eq!(*l.lock(), 2);
    }

    #[test]
    fn counts_across_threads() {
        let l = std::sync::Arc::new(Locked::new(0u64));
        let ts: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        *l.lock() += 1;
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(*l.lock(), 4000);
    }
}
