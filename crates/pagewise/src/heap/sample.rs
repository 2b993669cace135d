//! Sampling in a heap: when an allocation is sampled, and how a sampled
//! allocation is served (the policy over `profile/`).
//!
//! Each size class counts down, in its cache's line, the allocations until
//! its next sample (`ClassState::left`): a gap of exponentially distributed
//! bytes over the class's slot size, so every class samples its bytes at
//! the process's rate. At the sampled allocation the cache declines, and
//! [`HeapCore::alloc_sampled`] serves it as a large object whose descriptor
//! carries the sample, so its free (on any thread) counts it off. Large and
//! huge allocations count down bytes in the heap (`large_left`) on their
//! own slow path. Only the global allocator's thread heaps sample.
//!
//! A heap that is inside the sampler samples nothing more (a signal
//! handler that allocates, or an unwinder that does): `in_sampler`.

use super::*;
use crate::heap::cache::NOT_SAMPLING;
use crate::profile::{gap, Sample};

/// The sampling state of a heap besides the countdowns in its class
/// states (which hold what the fast paths touch).
pub struct Sampling {
    /// Per class: the class's allocations when its countdown reaches 0
    /// (so its allocations now are this less `left`).
    end: [Counter; CLASSES],
    /// Bytes of large and huge allocations until the next sampled one.
    large_left: AtomicU64,
    /// The gaps' random state (owner only).
    random: AtomicU64,
    /// Set while the owner is taking a sample.
    in_sampler: AtomicBool,
}

impl Sampling {
    pub(super) const fn new() -> Sampling {
        Sampling {
            end: [const { Counter::new(NOT_SAMPLING as u64) }; CLASSES],
            large_left: AtomicU64::new(u64::MAX),
            random: AtomicU64::new(0),
            in_sampler: AtomicBool::new(false),
        }
    }
}

impl HeapCore {
    /// Allocations of `class` this heap has made (any thread; a snapshot).
    pub fn allocs(&self, class: usize) -> u64 {
        let left = self.class(class).left().max(1) as u64;
        self.sampling.end[class].get().wrapping_sub(left)
    }

    /// Starts the countdowns (owner, or the heap's maker): the first gap of
    /// every class if the process samples, else never.
    pub(super) fn start_sampling(&self) {
        let mean = if self.global {
            crate::profile::sample_bytes()
        } else {
            0
        };
        let s = &self.sampling;
        if mean != 0 {
            // Only a sampling heap draws (an owned heap under Miri, which
            // has no auxiliary vector, never does).
            s.random.store(
                crate::os::random::random_word() as u64 ^ self.me() as u64,
                Relaxed,
            );
        }
        for (c, &slot) in SLOT_SIZE.iter().enumerate() {
            let left = if mean == 0 {
                NOT_SAMPLING
            } else {
                self.draw(slot as usize, mean)
            };
            // The allocations counted so far stay counted.
            s.end[c].set(self.allocs(c) + left as u64);
            self.class(c).arm(left);
        }
        let large = if mean == 0 {
            u64::MAX
        } else {
            self.draw(1, mean) as u64
        };
        s.large_left.store(large, Relaxed);
    }

    /// A countdown in allocations of `slot` bytes: a gap of exponential
    /// bytes of mean `mean` (owner only).
    fn draw(&self, slot: usize, mean: usize) -> i64 {
        let s = &self.sampling;
        let mut r = s.random.load(Relaxed);
        let u = gap::next_random(&mut r);
        s.random.store(r, Relaxed);
        gap::slots_until(gap::exponential_gap(u, mean), slot)
    }

    /// The allocation of `class` whose countdown ran out: starts the next
    /// countdown (this allocation is not the class's: it is served as a
    /// large object), takes the sample and
    /// serves the allocation with it. Unsampled if the heap is sampling
    /// already, or the sample's span cannot be had.
    ///
    /// # Safety
    /// Owner only.
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn alloc_sampled(&self, class: usize, size: usize) -> *mut u8 {
        let mean = crate::profile::sample_bytes();
        let slot = SLOT_SIZE[class] as usize;
        let s = &self.sampling;
        let next = if mean == 0 {
            NOT_SAMPLING
        } else {
            self.draw(slot, mean)
        };
        // `left` is 1: the allocations so far are `end - 1`.
        s.end[class].set(self.allocs(class) + next as u64);
        self.class(class).arm(next);
        if mean != 0 && !s.in_sampler.swap(true, Relaxed) {
            let sample = Sample::take(size, gap::inverse_probability(slot, mean), 1);
            // No sample if the sites could not be mapped: served as usual.
            let p = if sample.is_some() {
                // SAFETY: owner (caller).
                unsafe { self.alloc_span_sampled(size, 16, sample) }
            } else {
                null_mut()
            };
            s.in_sampler.store(false, Relaxed);
            if !p.is_null() {
                return p;
            }
            sample.release(size);
        }
        // Served as it would have been (and counted as the class's by the
        // countdown just restarted).
        // SAFETY: owner (caller).
        unsafe { self.alloc_small(class, size) }
    }

    /// For a large or huge allocation of `size` bytes: its sample if the
    /// bytes' countdown runs out in it (owner only).
    pub(super) fn sample_large(&self, size: usize) -> Sample {
        let s = &self.sampling;
        let left = s.large_left.load(Relaxed);
        if left == u64::MAX {
            // Not sampling: nothing to count down (no store on the path).
            return Sample::NONE;
        }
        if left > size as u64 {
            s.large_left.store(left - size as u64, Relaxed);
            return Sample::NONE;
        }
        let mean = crate::profile::sample_bytes();
        if mean == 0 {
            s.large_left.store(u64::MAX, Relaxed);
            return Sample::NONE;
        }
        s.large_left.store(self.draw(1, mean) as u64, Relaxed);
        if s.in_sampler.swap(true, Relaxed) {
            return Sample::NONE;
        }
        let sample = Sample::take(size, gap::inverse_probability(size, mean), 2);
        s.in_sampler.store(false, Relaxed);
        sample
    }
}
