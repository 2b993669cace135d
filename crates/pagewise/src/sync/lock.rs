//! A small spin lock for the slow paths (span pool, reservations, heap lists).
//!
//! Never taken on the malloc/free fast path. It does not allocate, so it is
//! usable inside the allocator, and the fork hooks can take and reset it.
//!
//! The lock is generic over its flag ([`Flag`]): `core`'s `AtomicBool` in
//! the allocator, and in the model checker (`--cfg loom`) [`ModelFlag`],
//! loom's `AtomicBool` with a loom cell standing for the data, so a model
//! runs this very lock (and the code under it, e.g. `memory/transfer.rs`'s
//! stacks) and loom reports two holders that its orderings do not separate
//! as a data race. The flag's methods are `#[inline(always)]`, so the
//! allocator's lock is what it would be without the trait.

use core::cell::UnsafeCell;
use core::mem::ManuallyDrop;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The word of a spin lock: an atomic bool, and what a guard keeps. The
/// lock's protocol (its orderings) is [`Locked`]'s, for every flag.
pub trait Flag {
    /// What a guard keeps while the lock is held (in the model checker,
    /// the data's access, for loom to check).
    type Held;
    /// `compare_exchange(false, true, ok, err)`; whether it succeeded.
    fn set_if_clear(&self, ok: Ordering, err: Ordering) -> bool;
    /// `load`.
    fn get(&self, order: Ordering) -> bool;
    /// `store(false, order)`.
    fn clear(&self, order: Ordering);
    /// Begins a holder's access to the data (the lock was just taken).
    fn held(&self) -> Self::Held;
    /// One step of the wait for a holder (`spins` so far).
    fn wait(spins: u32);
    /// Whether a waiter spins on plain loads between attempts (so that it
    /// does not take the cache line from the holder). Not in the model
    /// checker, where a relaxed load may read the stale `true` forever: a
    /// waiter there retries the CAS after each yield (the loads decide
    /// nothing; the CAS alone takes the lock).
    const SPIN_ON_LOADS: bool = true;
}

impl Flag for AtomicBool {
    type Held = ();
    #[inline(always)]
    fn set_if_clear(&self, ok: Ordering, err: Ordering) -> bool {
        self.compare_exchange(false, true, ok, err).is_ok()
    }
    #[inline(always)]
    fn get(&self, order: Ordering) -> bool {
        self.load(order)
    }
    #[inline(always)]
    fn clear(&self, order: Ordering) {
        self.store(false, order);
    }
    #[inline(always)]
    fn held(&self) {}
    #[inline(always)]
    fn wait(spins: u32) {
        if spins < 64 {
            core::hint::spin_loop();
        } else {
            yield_now();
        }
    }
}

/// The model checker's flag (`--cfg loom`): loom's atomic bool, and a loom
/// cell that a guard writes for as long as it lives.
#[cfg(all(test, loom))]
pub struct ModelFlag {
    locked: loom::sync::atomic::AtomicBool,
    data: loom::cell::UnsafeCell<()>,
}

#[cfg(all(test, loom))]
impl Flag for ModelFlag {
    type Held = loom::cell::MutPtr<()>;
    fn set_if_clear(&self, ok: Ordering, err: Ordering) -> bool {
        self.locked.compare_exchange(false, true, ok, err).is_ok()
    }
    fn get(&self, order: Ordering) -> bool {
        self.locked.load(order)
    }
    fn clear(&self, order: Ordering) {
        self.locked.store(false, order);
    }
    fn held(&self) -> Self::Held {
        self.data.get_mut()
    }
    fn wait(_spins: u32) {
        loom::thread::yield_now();
    }
    const SPIN_ON_LOADS: bool = false;
}

/// Data behind a spin lock.
pub struct Locked<T, F: Flag = AtomicBool> {
    locked: F,
    /// Threads in [`Locked::lock`] that found it held and wait: a holder
    /// for a long time (a mesh pass) lets it go while any does
    /// ([`Guard::pause`]).
    waiting: AtomicU32,
    data: UnsafeCell<T>,
}

// SAFETY: the lock serialises all access to `data`.
unsafe impl<T: Send, F: Flag + Sync> Sync for Locked<T, F> {}
// SAFETY: moving the lock moves the data; no thread holds a guard then.
unsafe impl<T: Send, F: Flag + Send> Send for Locked<T, F> {}

/// Proof that the lock is held; releases it on drop.
pub struct Guard<'a, T, F: Flag = AtomicBool> {
    lock: &'a Locked<T, F>,
    held: ManuallyDrop<F::Held>,
}

impl<T> Locked<T> {
    /// A new, unlocked value.
    pub const fn new(data: T) -> Self {
        Locked {
            locked: AtomicBool::new(false),
            waiting: AtomicU32::new(0),
            data: UnsafeCell::new(data),
        }
    }
}

#[cfg(all(test, loom))]
impl<T> Locked<T, ModelFlag> {
    /// A new, unlocked value on loom's atomics (inside `loom::model` only).
    pub fn new_model(data: T) -> Self {
        Locked {
            locked: ModelFlag {
                locked: loom::sync::atomic::AtomicBool::new(false),
                data: loom::cell::UnsafeCell::new(()),
            },
            waiting: AtomicU32::new(0),
            data: UnsafeCell::new(data),
        }
    }
}

impl<T, F: Flag> Locked<T, F> {
    /// Takes the lock, spinning (then yielding) while another thread holds
    /// it; counted in [`Locked::waiting`] meanwhile.
    pub fn lock(&self) -> Guard<'_, T, F> {
        crate::sync::perturb::point();
        if let Some(g) = self.try_lock() {
            return g;
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let mut spins = 0u32;
        loop {
            while F::SPIN_ON_LOADS && self.locked.get(Ordering::Relaxed) {
                spins += 1;
                F::wait(spins);
            }
            if !F::SPIN_ON_LOADS {
                F::wait(spins);
            }
            if let Some(g) = self.try_lock() {
                self.waiting.fetch_sub(1, Ordering::Relaxed);
                return g;
            }
        }
    }

    /// Whether a thread waits in [`Locked::lock`] for the holder.
    pub fn waiting(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) != 0
    }

    /// Takes the lock if it is free.
    pub fn try_lock(&self) -> Option<Guard<'_, T, F>> {
        self.locked
            .set_if_clear(Ordering::Acquire, Ordering::Relaxed)
            .then(|| Guard {
                lock: self,
                held: ManuallyDrop::new(self.locked.held()),
            })
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
        // The waiting threads are not in the child.
        self.waiting.store(0, Ordering::Relaxed);
        self.locked.clear(Ordering::Release);
    }
}

/// Takes the lock and forgets the guard: for fork hooks, which take locks in
/// one function and release them in another.
pub fn hold<T, F: Flag>(lock: &Locked<T, F>) {
    core::mem::forget(lock.lock());
}

/// Releases a lock taken by [`hold`].
///
/// # Safety
/// The calling thread took the lock with `hold`.
pub unsafe fn release<T, F: Flag>(lock: &Locked<T, F>) {
    lock.locked.clear(Ordering::Release);
}

/// Gives the CPU to another thread (spin loops that waited long).
pub fn yield_now() {
    // SAFETY: sched_yield has no preconditions.
    unsafe {
        libc::sched_yield();
    }
}

impl<T, F: Flag> Deref for Guard<'_, T, F> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves the lock is held.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T, F: Flag> DerefMut for Guard<'_, T, F> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves the lock is held, exclusively.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T, F: Flag> Guard<'_, T, F> {
    /// Lets the lock go for the time of `away` (a thread waiting for it
    /// takes it meanwhile), then takes it again. The guard is borrowed
    /// mutably, so no reference into the data lives across the pause; what
    /// the holder read before it may have changed after.
    pub fn pause(&mut self, away: impl FnOnce()) {
        // SAFETY: this access ends here; `held` is made anew below.
        unsafe { ManuallyDrop::drop(&mut self.held) };
        self.lock.locked.clear(Ordering::Release);
        crate::sync::perturb::point();
        away();
        core::mem::forget(self.lock.lock());
        self.held = ManuallyDrop::new(self.lock.locked.held());
    }
}

impl<T, F: Flag> Drop for Guard<'_, T, F> {
    fn drop(&mut self) {
        // The access ends before the lock is let go (for loom; nothing in
        // the allocator's build).
        // SAFETY: dropped once, here; the field is not used afterwards.
        unsafe { ManuallyDrop::drop(&mut self.held) };
        self.lock.locked.clear(Ordering::Release);
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

    /// A holder that pauses while a thread waits lets that thread in, and
    /// holds the lock again after; the wait is counted only while it lasts.
    #[test]
    fn a_pause_lets_a_waiting_thread_in() {
        let l = std::sync::Arc::new(Locked::new(0u64));
        let mut g = l.lock();
        assert!(!l.waiting());
        let waiter = {
            let l = l.clone();
            std::thread::spawn(move || *l.lock() += 1)
        };
        while !l.waiting() {
            std::hint::spin_loop();
        }
        *g += 10;
        g.pause(|| {
            while l.waiting() {
                std::hint::spin_loop();
            }
        });
        assert!(!l.waiting());
        assert!(l.try_lock().is_none(), "held again after the pause");
        let seen = *g;
        drop(g);
        waiter.join().unwrap();
        assert_eq!(seen, 11, "the waiter ran inside the pause");
    }
}
