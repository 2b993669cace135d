//! The atomic operations the cross-thread protocols use, as traits, so the
//! same protocol functions run on `core`'s atomics in the allocator and on
//! loom's in the model checker (`--cfg loom`, see `memory/remote_word.rs`,
//! `memory/delayed.rs`, `global/heaps.rs`, `heap/current.rs` and
//! `sync/lock.rs`). Every method
//! is `#[inline(always)]` and forwards to the atomic's own method, so the
//! allocator's code is what it would be without the traits.

use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// An atomic machine word.
pub trait Word {
    /// `load`.
    fn load(&self, order: Ordering) -> usize;
    /// `store`.
    fn store(&self, value: usize, order: Ordering);
    /// `compare_exchange`.
    fn cas(&self, old: usize, new: usize, ok: Ordering, err: Ordering) -> Result<usize, usize>;
    /// `compare_exchange_weak`.
    fn cas_weak(&self, old: usize, new: usize, ok: Ordering, err: Ordering)
        -> Result<usize, usize>;
    /// `fetch_and`.
    fn fetch_and(&self, bits: usize, order: Ordering) -> usize;
}

macro_rules! word_impl {
    ($t:ty) => {
        impl Word for $t {
            #[inline(always)]
            fn load(&self, order: Ordering) -> usize {
                <$t>::load(self, order)
            }
            #[inline(always)]
            fn store(&self, value: usize, order: Ordering) {
                <$t>::store(self, value, order)
            }
            #[inline(always)]
            fn cas(
                &self,
                old: usize,
                new: usize,
                ok: Ordering,
                err: Ordering,
            ) -> Result<usize, usize> {
                <$t>::compare_exchange(self, old, new, ok, err)
            }
            #[inline(always)]
            fn cas_weak(
                &self,
                old: usize,
                new: usize,
                ok: Ordering,
                err: Ordering,
            ) -> Result<usize, usize> {
                <$t>::compare_exchange_weak(self, old, new, ok, err)
            }
            #[inline(always)]
            fn fetch_and(&self, bits: usize, order: Ordering) -> usize {
                <$t>::fetch_and(self, bits, order)
            }
        }
    };
}

word_impl!(AtomicUsize);
#[cfg(loom)]
word_impl!(loom::sync::atomic::AtomicUsize);

/// An atomic pointer (the delayed-free list, `memory/delayed.rs`; the
/// current pages, `heap/current.rs`).
pub trait PtrWord<T> {
    /// `load`.
    fn load(&self, order: Ordering) -> *mut T;
    /// `store`.
    fn store(&self, value: *mut T, order: Ordering);
    /// `swap`.
    fn swap(&self, value: *mut T, order: Ordering) -> *mut T;
    /// `compare_exchange_weak`.
    fn cas_weak(
        &self,
        old: *mut T,
        new: *mut T,
        ok: Ordering,
        err: Ordering,
    ) -> Result<*mut T, *mut T>;
}

macro_rules! ptr_word_impl {
    ($t:ident) => {
        impl<T> PtrWord<T> for $t<T> {
            #[inline(always)]
            fn load(&self, order: Ordering) -> *mut T {
                $t::load(self, order)
            }
            #[inline(always)]
            fn store(&self, value: *mut T, order: Ordering) {
                $t::store(self, value, order)
            }
            #[inline(always)]
            fn swap(&self, value: *mut T, order: Ordering) -> *mut T {
                $t::swap(self, value, order)
            }
            #[inline(always)]
            fn cas_weak(
                &self,
                old: *mut T,
                new: *mut T,
                ok: Ordering,
                err: Ordering,
            ) -> Result<*mut T, *mut T> {
                $t::compare_exchange_weak(self, old, new, ok, err)
            }
        }
    };
}

ptr_word_impl!(AtomicPtr);
#[cfg(loom)]
use loom::sync::atomic::AtomicPtr as LoomAtomicPtr;
#[cfg(loom)]
ptr_word_impl!(LoomAtomicPtr);

/// One step of a spin wait: a pause hint, or in the model checker a yield
/// to its scheduler (which would otherwise never run the thread waited on).
#[inline(always)]
pub fn spin_hint() {
    #[cfg(not(loom))]
    core::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}
