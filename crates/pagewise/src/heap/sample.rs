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
//! The same countdown draws the allocations that go to the guard pool
//! (`crate::guard`, `PAGEWISE_GUARD_SAMPLE`): each class keeps the
//! allocation at which its next profile sample is due and the one at which
//! its next guarded block is, and counts down to the nearer; when both fall
//! on one allocation the profile takes it and the guard the next. The
//! guard draws only in classes whose slots fit in an OS page.
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
    /// Per class: the allocation (numbered as `HeapCore::allocs` counts)
    /// at which the next profile sample is due, and the one at which the
    /// next guarded block is ([`NEVER`]: none). `end` is the nearer.
    prof_at: [AtomicU64; CLASSES],
    guard_at: [AtomicU64; CLASSES],
    /// Bytes of large and huge allocations until the next sampled one.
    large_left: AtomicU64,
    /// The gaps' random state (owner only).
    random: AtomicU64,
    /// Set while the owner is taking a sample.
    in_sampler: AtomicBool,
}

/// No event due at any allocation.
const NEVER: u64 = u64::MAX;

impl Sampling {
    pub(super) const fn new() -> Sampling {
        Sampling {
            end: [const { Counter::new(NOT_SAMPLING as u64) }; CLASSES],
            prof_at: [const { AtomicU64::new(NEVER) }; CLASSES],
            guard_at: [const { AtomicU64::new(NEVER) }; CLASSES],
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

    /// Counts `n` slots of `class` this heap's pages gave another thread's
    /// cache (`heap/leftovers.rs`) as allocations served from its pages
    /// (at the slot's size, an upper bound of what will be asked), without
    /// moving the countdown: the taker counts them as freed into its cache,
    /// and as allocated again as it hands them out (owner, or a claimant).
    pub(super) fn count_given(&self, class: usize, n: u32) {
        self.sampling.end[class].add(n as u64);
        let state = self.class(class);
        state.sampled.add(n as u64);
        state
            .requested
            .add(n as u64 * crate::memory::size_class::SLOT_SIZE[class] as u64);
    }

    /// Starts the countdowns (owner, or the heap's maker): the first gap of
    /// every class if the process samples or guards, else never.
    pub(super) fn start_sampling(&self) {
        let mean = self.sample_mean();
        let rate = self.guard_rate();
        let s = &self.sampling;
        if mean != 0 || rate != 0 {
            // Only a sampling heap draws (an owned heap under Miri, which
            // has no auxiliary vector, never does).
            s.random.store(
                crate::os::random::random_word() as u64 ^ self.me() as u64,
                Relaxed,
            );
        }
        for c in 0..CLASSES {
            // The allocations counted so far stay counted.
            let allocs = self.allocs(c);
            s.prof_at[c].store(self.next_profiled(c, allocs, mean), Relaxed);
            s.guard_at[c].store(self.next_guarded(c, allocs, rate), Relaxed);
            self.arm_class(c);
        }
        let large = if mean == 0 {
            u64::MAX
        } else {
            self.draw(1, mean) as u64
        };
        s.large_left.store(large, Relaxed);
    }

    /// The profile's mean gap in bytes (0: this heap does not sample).
    fn sample_mean(&self) -> usize {
        if self.global {
            crate::profile::sample_bytes()
        } else {
            0
        }
    }

    /// One allocation in how many this heap guards (0: none).
    fn guard_rate(&self) -> usize {
        if self.global {
            crate::guard::sample_rate()
        } else {
            0
        }
    }

    /// The allocation of `class` at which the next profile sample is due,
    /// `allocs` having been made.
    fn next_profiled(&self, class: usize, allocs: u64, mean: usize) -> u64 {
        if mean == 0 {
            return NEVER;
        }
        allocs + self.draw(SLOT_SIZE[class] as usize, mean) as u64
    }

    /// The allocation of `class` at which the next guarded block is due:
    /// one in `rate` on average (every one at 1), in classes whose slots
    /// fit in an OS page.
    fn next_guarded(&self, class: usize, allocs: u64, rate: usize) -> u64 {
        if rate == 0 || SLOT_SIZE[class] as usize > crate::memory::layout::os_page() {
            return NEVER;
        }
        if rate == 1 {
            return allocs + 1;
        }
        allocs + self.draw(1, rate) as u64
    }

    /// Counts the class down to its nearer event, at least `least`
    /// allocations away.
    fn arm_class_at_least(&self, class: usize, least: i64) {
        let s = &self.sampling;
        let allocs = self.allocs(class);
        let at = s.prof_at[class]
            .load(Relaxed)
            .min(s.guard_at[class].load(Relaxed));
        let left = if at == NEVER {
            NOT_SAMPLING
        } else {
            (at.saturating_sub(allocs) as i64).clamp(least, NOT_SAMPLING)
        };
        s.end[class].set(allocs + left as u64);
        self.class(class).arm(left);
    }

    fn arm_class(&self, class: usize) {
        self.arm_class_at_least(class, 1);
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

    /// The allocation of `class` whose countdown ran out: its profile
    /// sample or its guarded block (this allocation is then not the
    /// class's: it is served as a large object, or by the guard pool), and
    /// the next countdown. Served as usual if the heap is sampling already,
    /// or the sample's span or a guard slot cannot be had.
    ///
    /// # Safety
    /// Owner only.
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn alloc_sampled(&self, class: usize, size: usize, align: usize) -> *mut u8 {
        let s = &self.sampling;
        let allocs = self.allocs(class);
        // This allocation is number `allocs + 1`.
        let profile = s.prof_at[class].load(Relaxed) <= allocs + 1;
        // Both due: the guard takes the next allocation.
        let guard = !profile && s.guard_at[class].load(Relaxed) <= allocs + 1;
        if profile {
            let next = self.next_profiled(class, allocs, self.sample_mean());
            s.prof_at[class].store(next, Relaxed);
        }
        if guard {
            let next = self.next_guarded(class, allocs, self.guard_rate());
            s.guard_at[class].store(next, Relaxed);
        }
        self.arm_class(class);
        if (profile || guard) && !s.in_sampler.swap(true, Relaxed) {
            // SAFETY: owner (caller).
            let p = unsafe {
                if profile {
                    self.serve_profiled(class, size)
                } else {
                    serve_guarded(size, align)
                }
            };
            s.in_sampler.store(false, Relaxed);
            if !p.is_null() {
                // Not in the class's count: counted for the thread here.
                // SAFETY: the block just allocated.
                self.note_allocated(unsafe { HeapCore::usable_size(p) });
                return p;
            }
        }
        // Served as it would have been, and counted as the class's: at
        // least one allocation before the next event, so that the cache
        // does not decline this one.
        self.arm_class_at_least(class, 2);
        // SAFETY: owner (caller).
        unsafe { self.alloc_small(class, size, align) }
    }

    /// A profiled allocation of `class`: a large object whose descriptor
    /// carries the sample (null if the sites or the span cannot be had).
    ///
    /// # Safety
    /// Owner only.
    #[inline(never)]
    unsafe fn serve_profiled(&self, class: usize, size: usize) -> *mut u8 {
        let mean = self.sample_mean();
        let slot = SLOT_SIZE[class] as usize;
        let sample = Sample::take(size, gap::inverse_probability(slot, mean));
        if !sample.is_some() {
            return null_mut();
        }
        // SAFETY: owner (caller).
        let p = unsafe { self.alloc_span_sampled(size, slot, sample) };
        if p.is_null() {
            sample.release(size);
        }
        p
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
        let sample = Sample::take(size, gap::inverse_probability(size, mean));
        s.in_sampler.store(false, Relaxed);
        sample
    }
}

/// A guarded block for an allocation of `size` bytes at `align` (null: the
/// pool has no slot free). At least 16-byte aligned, as every slot is.
/// In the hardened build it is sized as a slot would be, a multiple of 16
/// bytes: the hardened layer keeps its tail word in the block's last word
/// and wipes the words before it at the free (`secure/canary.rs`,
/// `secure/wipe.rs`), its canary covers the bytes the rounding adds, and a
/// block placed against its slot's end (16-byte aligned) ends right at the
/// guard page.
fn serve_guarded(size: usize, align: usize) -> *mut u8 {
    #[cfg(target_os = "linux")]
    {
        #[cfg(feature = "secure")]
        let size = size.next_multiple_of(16);
        crate::guard::alloc(size, align.max(16))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (size, align);
        null_mut()
    }
}
