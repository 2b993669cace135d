//! An asymmetric fence: a barrier that costs nothing on a hot path, paired
//! with an expensive one on a rare path, which together order a store
//! before a load on each side as two full fences would (the pattern of
//! userspace RCU and of `membarrier(2)`'s manual page).
//!
//! The hot side ([`light`]) is a compiler fence: the store and the load it
//! separates stay in program order in the instructions, though the CPU may
//! still let the load pass the store. The rare side is the page source's
//! [`serialize_threads`](crate::PageSource::serialize_threads): on Linux
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which makes every other
//! running thread of the process execute a full memory barrier before it
//! returns (a thread not running had one when it was switched out). So for
//!
//! ```text
//! hot:  store A; light();  load B        rare: store B; serialize; load A
//! ```
//!
//! at least one side sees the other's store: either the hot load reads the
//! new B, or the rare load reads the new A. Under loom both sides are
//! `fence(SeqCst)`, which is what the pair amounts to, so the models check
//! the protocols that rely on it.

/// The hot side of the pair: no instruction, only an order for the
/// compiler (and in the schedule-perturbation build, a place where another
/// thread may step in).
#[inline(always)]
pub fn light() {
    crate::sync::perturb::point();
    #[cfg(not(loom))]
    core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
    #[cfg(loom)]
    loom::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
}
