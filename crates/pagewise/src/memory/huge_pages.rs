//! Huge pages for the dense parts of the heap: which 2 MiB regions pagewise
//! asks the kernel to back with one huge page, and the rule that keeps the
//! accounting exact when it does.
//!
//! A segment is 32 MiB, aligned, so it holds 16 *regions* of 2 MiB, each
//! one possible huge page. Invariants:
//!
//! - **A region is advised only while all of it is committed.** The kernel
//!   makes a huge page resident whole at the first touch, so before a
//!   region is advised (`MADV_HUGEPAGE`) every OS page of it is marked
//!   committed in the segment's bitmap, counted and charged against the
//!   hard limit; the bitmap then still says exactly what may be resident.
//! - **A purge inside an advised region first takes the advice back**
//!   (`MADV_NOHUGEPAGE`, [`before_purge`]): else a fault on a purged page
//!   of a region whose page table the kernel dropped would bring 2 MiB back,
//!   and the kernel's background collapse (`khugepaged`) would fill a split
//!   region again, behind the bitmap's back. Purging part of a region
//!   splits its huge page (counted: `Stats::thp_splits`); purging all of it
//!   gives the huge page back whole.
//! - **Which regions** ([`Policy`]): under `auto` (the default), a region
//!   a slab page starts in when nothing else of the region is committed or
//!   used and the heap already holds [`DENSE_HEAP`] (16 MiB) of slab pages
//!   (so the region will fill: slab spans go to the fullest region first,
//!   `spans/regions.rs`), and every region wholly inside a large or huge
//!   object (the program asked for all of it). Under `always` the heap's
//!   size does not matter.
//!
//! Region 0 of a segment holds the header and is never advised. The bits
//! of advised regions are in the segment header (`Segment::huge_regions`);
//! a huge object's run keeps its advised range in its huge state.

use crate::memory::layout::{os_page_shift, SEGMENT, SLICE_SHIFT};
use crate::memory::segment::Segment;
use crate::os::source::PageSource;
use crate::os::thp::{Thp, ThpMode, HUGE_PAGE, HUGE_PAGE_SHIFT};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// A region: one possible huge page.
pub const REGION: usize = HUGE_PAGE;
/// log2 of [`REGION`].
pub const REGION_SHIFT: usize = HUGE_PAGE_SHIFT;
/// Regions per segment (the first holds the header).
pub const REGIONS: usize = SEGMENT / REGION;
/// Slices per region.
pub const REGION_SLICES: usize = REGION >> SLICE_SHIFT;
/// Slab memory a heap holds before a region it starts gets a huge page
/// under `auto`. The region at a heap's frontier, not full yet, is
/// resident whole, as are the uncarved slots of its pages there: below
/// this, that would be a large share of the heap. Measured
/// (docs/defaults.md, "thp"): at 4 MiB, a server of 4 threads with heaps
/// of about 7 MiB peaked 8 % above small pages and 16 rounds of 8 threads
/// up to 18 %; at 8 MiB the rounds 3 % (up to 5 %); at 16 MiB neither.
pub const DENSE_HEAP: usize = 16 << 20;
/// Regions advised at once, at most, per budget: each run of advised
/// regions costs the kernel up to two mappings, of the 65,530 a process
/// may have by default (`vm.max_map_count`); a heap this big (32 GiB of
/// huge pages) asks for no more.
pub const MAX_REGIONS: usize = 16 << 10;

// Region bits fit the segment's word, and region 0 holds the whole header.
const _: () = assert!(REGIONS <= 32);
const _: () = assert!(crate::memory::segment::HEADER_SLICES <= REGION_SLICES);

/// Which regions of a heap get huge pages (from `Config::thp` and what
/// the kernel does, [`PageSource::thp`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// None, and no advice of either kind.
    Off,
    /// Regions of a heap that holds [`DENSE_HEAP`] of slab pages, and
    /// the insides of large and huge objects.
    Dense,
    /// As `Dense`, whatever the heap's size.
    Everywhere,
}

impl Policy {
    /// The policy for a heap with setting `thp` on `source`.
    pub fn of(thp: Thp, source: &dyn PageSource) -> Policy {
        match (thp, source.thp()) {
            (Thp::Never, _) => Policy::Off,
            (Thp::Always, _) => Policy::Everywhere,
            (Thp::Auto, ThpMode::Never) => Policy::Off,
            (Thp::Auto, _) => Policy::Dense,
        }
    }

    /// Whether any region gets a huge page.
    pub fn on(self) -> bool {
        self != Policy::Off
    }

    /// Whether a new reservation must refuse huge pages first: under the
    /// kernel's `always` the kernel would otherwise back any region of it
    /// at the first touch, whatever the policy (the regions the policy
    /// wants are advised afterwards, one by one). Under the setting `never`
    /// too: a region the kernel backs on its own is resident whole, and a
    /// fault after a purge brings it back whole (an idle run measured
    /// 32 MiB resident where 1.7 are with the refusal; docs/benchmarks.md,
    /// "Huge pages"). A source that shares pages (meshing) too: the heap's
    /// own pages are private memory there, and a group page never lies in
    /// an advised region (a mesh pass takes the advice back first, as a
    /// purge does).
    pub fn refuses_elsewhere(source: &dyn PageSource) -> bool {
        source.thp() == ThpMode::Always
    }

    /// Whether a region a slab page starts in gets a huge page, for a heap
    /// holding `slab_bytes` of slab pages.
    pub fn for_slab(self, slab_bytes: usize) -> bool {
        match self {
            Policy::Off => false,
            Policy::Dense => slab_bytes >= DENSE_HEAP,
            Policy::Everywhere => true,
        }
    }
}

/// What happened to a budget's huge pages (its heaps', counted exactly).
#[derive(Default)]
pub struct HugeCounts {
    /// Regions advised now.
    regions: AtomicUsize,
    /// Regions whose huge page a purge split (part of it purged).
    splits: AtomicU64,
}

impl HugeCounts {
    /// Nothing advised yet.
    pub const fn new() -> HugeCounts {
        HugeCounts {
            regions: AtomicUsize::new(0),
            splits: AtomicU64::new(0),
        }
    }

    /// Bytes of regions advised now.
    pub fn bytes(&self) -> usize {
        self.regions.load(Relaxed) * REGION
    }

    /// Huge pages split by a purge so far.
    pub fn splits(&self) -> u64 {
        self.splits.load(Relaxed)
    }

    /// Whether `n` more regions stay within [`MAX_REGIONS`].
    pub(crate) fn room_for(&self, n: usize) -> bool {
        self.regions.load(Relaxed) + n <= MAX_REGIONS
    }

    pub(crate) fn advised(&self, n: usize) {
        self.regions.fetch_add(n, Relaxed);
    }

    pub(crate) fn unadvised(&self, n: usize, split: usize) {
        self.regions.fetch_sub(n, Relaxed);
        if split > 0 {
            self.splits.fetch_add(split as u64, Relaxed);
        }
    }
}

/// The regions of a segment `off..off + len` (bytes from its base) touches,
/// as a mask.
pub fn regions_touched(off: usize, len: usize) -> u32 {
    debug_assert!(len > 0 && off + len <= SEGMENT);
    let first = off >> REGION_SHIFT;
    let last = (off + len - 1) >> REGION_SHIFT;
    mask(first, last + 1)
}

/// The regions of a segment lying wholly inside `off..off + len`, as a
/// mask (region 0, the header's, never).
pub fn regions_inside(off: usize, len: usize) -> u32 {
    let first = (off.div_ceil(REGION)).max(1);
    let end = ((off + len) >> REGION_SHIFT).min(REGIONS);
    if first >= end {
        0
    } else {
        mask(first, end)
    }
}

/// Bits `first..end`.
fn mask(first: usize, end: usize) -> u32 {
    let n = end - first;
    (if n >= 32 { u32::MAX } else { (1u32 << n) - 1 }) << first
}

/// The OS pages of region `r` of a segment, as (first, count).
pub fn region_pages(r: usize) -> (usize, usize) {
    let per = REGION >> os_page_shift();
    (r * per, per)
}

/// Calls `f(first, count)` for each run of consecutive set bits of `m`.
pub fn runs(mut m: u32, mut f: impl FnMut(usize, usize)) {
    while m != 0 {
        let first = m.trailing_zeros() as usize;
        let n = (m >> first).trailing_ones() as usize;
        f(first, n);
        m &= !mask(first, first + n);
    }
}

/// Advises the regions `m` of `seg` to be huge pages, each run in one
/// call, and records them; every OS page of them must be committed
/// already. Returns the regions the kernel accepted.
pub fn advise(source: &dyn PageSource, counts: &HugeCounts, seg: &Segment, m: u32) -> u32 {
    let mut done = 0;
    runs(m, |first, n| {
        let at = seg.base() + (first << REGION_SHIFT);
        // SAFETY: regions of a segment this heap holds (its mapping).
        let ok = unsafe {
            source.advise_huge(
                NonNull::new_unchecked(at as *mut u8),
                n << REGION_SHIFT,
                true,
            )
        };
        if ok {
            done |= mask(first, first + n);
        }
    });
    seg.mark_huge_regions(done);
    counts.advised(done.count_ones() as usize);
    done
}

/// Before `addr..addr + len` of `seg` (OS-page aligned, inside the
/// segment) is purged: takes the huge-page advice back from every advised
/// region the range touches, so the purge leaves them to small pages.
/// Returns false, with the regions still advised, if the kernel refused
/// (the caller then does not purge: the pages stay committed).
pub fn before_purge(
    source: &dyn PageSource,
    counts: &HugeCounts,
    seg: &Segment,
    addr: usize,
    len: usize,
) -> bool {
    if seg.huge_regions() == 0 {
        return true;
    }
    let off = addr - seg.base();
    let taken = seg.take_huge_regions(regions_touched(off, len));
    if taken == 0 {
        return true;
    }
    let mut refused = 0;
    runs(taken, |first, n| {
        let at = seg.base() + (first << REGION_SHIFT);
        // SAFETY: regions of a segment this heap holds (its mapping).
        let ok = unsafe {
            source.advise_huge(
                NonNull::new_unchecked(at as *mut u8),
                n << REGION_SHIFT,
                false,
            )
        };
        if !ok {
            refused |= mask(first, first + n);
        }
    });
    seg.mark_huge_regions(refused);
    let gone = taken & !refused;
    let split = gone & !regions_inside(off, len);
    counts.unadvised(gone.count_ones() as usize, split.count_ones() as usize);
    refused == 0
}

/// A huge object's advised range, `lo..hi` bytes from its run's base (2
/// MiB-aligned; empty if `lo == hi`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunAdvice {
    /// First advised byte (offset from the run's base).
    pub lo: usize,
    /// End of the advised range.
    pub hi: usize,
}

impl RunAdvice {
    /// Nothing advised.
    pub const NONE: RunAdvice = RunAdvice { lo: 0, hi: 0 };

    /// The whole regions inside an object at `lo..hi` of its run (the
    /// first segment's region 0 holds the header: objects start after it).
    pub fn inside(lo: usize, hi: usize) -> RunAdvice {
        let a = lo.div_ceil(REGION) * REGION;
        let b = hi & !(REGION - 1);
        if a < b {
            RunAdvice { lo: a, hi: b }
        } else {
            RunAdvice::NONE
        }
    }

    /// Whether nothing is advised.
    pub fn is_empty(&self) -> bool {
        self.lo >= self.hi
    }

    fn regions(&self) -> usize {
        (self.hi - self.lo) >> REGION_SHIFT
    }

    /// Advises the range of the run at `base`; false (nothing advised) if
    /// the kernel refused or the budget's regions are spent.
    pub fn advise(&self, source: &dyn PageSource, counts: &HugeCounts, base: usize) -> bool {
        if self.is_empty() || !counts.room_for(self.regions()) {
            return false;
        }
        // SAFETY: inside the run's mapping, which this heap holds.
        let ok = unsafe {
            source.advise_huge(
                NonNull::new_unchecked((base + self.lo) as *mut u8),
                self.hi - self.lo,
                true,
            )
        };
        if ok {
            counts.advised(self.regions());
        }
        ok
    }

    /// Takes the advice back before `off..off + len` of the run is purged,
    /// if the two meet; false (still advised) if the kernel refused.
    pub fn before_purge(
        &mut self,
        source: &dyn PageSource,
        counts: &HugeCounts,
        base: usize,
        off: usize,
        len: usize,
    ) -> bool {
        if self.is_empty() || off + len <= self.lo || off >= self.hi {
            return true;
        }
        // SAFETY: inside the run's mapping, which this heap holds.
        let ok = unsafe {
            source.advise_huge(
                NonNull::new_unchecked((base + self.lo) as *mut u8),
                self.hi - self.lo,
                false,
            )
        };
        if ok {
            let whole = off <= self.lo && off + len >= self.hi;
            let split = if whole {
                0
            } else {
                // The regions the purge cuts into, not wholly inside it.
                let cut = |at: usize| (at > self.lo && at < self.hi && at % REGION != 0) as usize;
                cut(off) + cut(off + len)
            };
            counts.unadvised(self.regions(), split);
            *self = RunAdvice::NONE;
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::source::FakePages;

    #[test]
    fn masks() {
        assert_eq!(regions_touched(0, 1), 1);
        assert_eq!(regions_touched(REGION - 4096, 8192), 0b11);
        assert_eq!(regions_touched(0, SEGMENT), u32::MAX >> 16);
        assert_eq!(regions_inside(0, SEGMENT), (u32::MAX >> 16) & !1);
        assert_eq!(regions_inside(REGION + 4096, 2 * REGION), 0b100);
        assert_eq!(regions_inside(REGION + 4096, REGION), 0);
        let mut seen = Vec::new();
        runs(0b1101_1000, |f, n| seen.push((f, n)));
        assert_eq!(seen, [(3, 2), (6, 2)]);
    }

    #[test]
    fn policies() {
        let madvise = FakePages::with_thp(ThpMode::Madvise);
        let never = FakePages::new();
        assert_eq!(Policy::of(Thp::Auto, &madvise), Policy::Dense);
        assert_eq!(Policy::of(Thp::Auto, &never), Policy::Off);
        assert_eq!(Policy::of(Thp::Never, &madvise), Policy::Off);
        assert_eq!(Policy::of(Thp::Always, &never), Policy::Everywhere);
        assert!(!Policy::Dense.for_slab(DENSE_HEAP - 1));
        assert!(Policy::Dense.for_slab(DENSE_HEAP));
        assert!(Policy::Everywhere.for_slab(0));
        let always = FakePages::with_thp(ThpMode::Always);
        assert!(Policy::refuses_elsewhere(&always));
        assert!(!Policy::refuses_elsewhere(&madvise));
    }

    #[test]
    fn run_advice_splits_only_what_a_purge_cuts() {
        let fake = FakePages::with_thp(ThpMode::Madvise);
        let counts = HugeCounts::new();
        let run = fake.map(2 * SEGMENT, SEGMENT).unwrap().as_ptr() as usize;
        let mut a = RunAdvice::inside(128 << 10, SEGMENT + 5 * REGION + 4096);
        assert_eq!((a.lo, a.hi), (REGION, SEGMENT + 5 * REGION));
        assert!(a.advise(&fake, &counts, run));
        assert_eq!(counts.bytes(), SEGMENT + 4 * REGION);
        // A purge past the range changes nothing.
        assert!(a.before_purge(&fake, &counts, run, a.hi, REGION));
        assert_eq!(fake.syscalls().nohugepage, 0);
        // One cutting into the last region splits it.
        assert!(a.before_purge(&fake, &counts, run, a.hi - 4096, REGION));
        assert_eq!((counts.bytes(), counts.splits()), (0, 1));
        assert!(a.is_empty());
        // SAFETY: mapped above, unused.
        unsafe { fake.unmap(NonNull::new(run as *mut u8).unwrap(), 2 * SEGMENT) };
    }
}
