//! The atomic operations the cross-thread protocols use, as a trait, so the
//! same protocol functions run on `core`'s atomics in the allocator and on
//! loom's in the model checker (`--cfg loom`, see `remote_word.rs` and
//! `global/heaps.rs`).

use core::sync::atomic::{AtomicUsize, Ordering};

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

/// One step of a spin wait: a pause hint, or in the model checker a yield
/// to its scheduler (which would otherwise never run the thread waited on).
#[inline(always)]
pub fn spin_hint() {
    #[cfg(not(loom))]
    core::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}
