//! The span pool's 2 MiB regions: where slab spans go when the heap asks
//! for huge pages (the fullest region first), and which regions get a huge
//! page (`memory/huge_pages.rs` has the rules and the invariant: an
//! advised region is committed whole). Runs under the heap's span lock.
//!
//! Each segment counts the free slices of each of its regions
//! (`Links::region_free`, kept by `insert` and `remove`), so a region's
//! use is one load.

use super::*;
use crate::memory::huge_pages::{self, Policy, REGION, REGION_SLICES};

/// Adds (`add`) or takes away the free slices `idx..idx + n` of `seg` to
/// or from their regions' counts.
pub(super) fn count_free(seg: &Segment, idx: usize, n: usize, add: bool) {
    let links = seg.links();
    let end = idx + n;
    let mut i = idx;
    while i < end {
        let r = i / REGION_SLICES;
        let stop = ((r + 1) * REGION_SLICES).min(end);
        let k = (stop - i) as u8;
        // SAFETY: links of a segment of this pool, under the span lock.
        unsafe {
            let c = &mut (*links).region_free[r];
            *c = if add { *c + k } else { *c - k };
        }
        i = stop;
    }
}

/// Slices of region `r` of `seg` in used spans (the header's included).
fn used_slices(seg: &Segment, r: usize) -> usize {
    // SAFETY: links of a segment of this pool, under the span lock.
    REGION_SLICES - unsafe { (*seg.links()).region_free[r] } as usize
}

/// Slices of `idx..idx + n` inside region `r`.
fn overlap(idx: usize, n: usize, r: usize) -> usize {
    let (a, b) = (r * REGION_SLICES, (r + 1) * REGION_SLICES);
    (idx + n).min(b).saturating_sub(idx.max(a))
}

impl Spans {
    /// The free span a slab page of `n` slices goes to when the heap asks
    /// for huge pages, `bin` being the smallest non-empty bin that fits:
    /// of the first few candidates (size, then address order), the one
    /// whose region is the most used (the slab page takes the front of
    /// the span), so that a few regions carry the heap's slab pages and
    /// their huge pages fill, while others empty out and go back whole;
    /// the most committed pages on ties, then the first.
    pub(super) fn fullest_region_placed(&self, bin: usize, n: usize) -> *mut Page {
        const CANDIDATES: usize = 16;
        let want = n * os_pages_per_slice();
        let mut best: *mut Page = null_mut();
        let mut best_score = (0, 0);
        let mut seen = 0;
        let mut b = Some(bin);
        while let Some(i) = b {
            let mut f = self.bins[i];
            while !f.is_null() && seen < CANDIDATES {
                let seg = seg_of(f);
                let r = seg.index_of(f) / REGION_SLICES;
                // SAFETY: free span descriptors of this pool (lock held).
                let cover = (unsafe { (*f).dirty_pages } as usize).min(want);
                let score = (used_slices(seg, r), cover);
                if best.is_null() || score > best_score {
                    best = f;
                    best_score = score;
                }
                seen += 1;
                // SAFETY: as above.
                f = unsafe { (*f).next };
            }
            if seen >= CANDIDATES {
                break;
            }
            b = self.first_bin_at_least(i + 1);
        }
        best
    }

    /// After the slab span `p` of `n` slices was taken, for a heap holding
    /// `slab_bytes` of slab pages: backs with a huge page each region the
    /// span starts or ends in that nothing else uses and no page of which
    /// is committed (so the kernel can map a huge page at the first touch),
    /// if the policy says so. Every OS page of such a region is committed
    /// (charged against the limit first; refused, nothing happens): the
    /// span's own are returned as bytes for the heap's slab count, the
    /// free spans' are retained. `now` dates the retention of free spans
    /// that had none. Returns the span's bytes so committed, and all the
    /// bytes committed (the regions').
    pub(super) fn back_slab_regions(
        &mut self,
        ctx: &Ctx,
        p: *mut Page,
        slab_bytes: usize,
        now: u64,
    ) -> (usize, usize) {
        if !Policy::of(ctx.config.thp(), ctx.source).for_slab(slab_bytes) {
            return (0, 0);
        }
        let seg = seg_of(p);
        let idx = seg.index_of(p);
        let n = count_of(p);
        let mut m = 0u32;
        for r in (idx / REGION_SLICES)..=((idx + n - 1) / REGION_SLICES) {
            let (first, count) = huge_pages::region_pages(r);
            let fresh = r > 0
                && seg.huge_regions() & 1 << r == 0
                && used_slices(seg, r) == overlap(idx, n, r)
                && seg.count_committed(first, count) == 0;
            if fresh {
                m |= 1 << r;
            }
        }
        let regions = m.count_ones() as usize;
        if regions == 0
            || !ctx.budget.huge.room_for(regions)
            || !ctx
                .budget
                .charge(regions * REGION, ctx.config.limit_bytes())
        {
            return (0, 0);
        }
        huge_pages::runs(m, |r, k| {
            seg.set_committed(
                huge_pages::region_pages(r).0,
                k * (REGION >> os_page_shift()),
            );
        });
        let done = huge_pages::advise(ctx.source, &ctx.budget.huge, seg, m);
        huge_pages::runs(m & !done, |r, k| {
            seg.clear_committed(
                huge_pages::region_pages(r).0,
                k * (REGION >> os_page_shift()),
            );
        });
        let refused = (m & !done).count_ones() as usize;
        ctx.budget.uncharge(refused * REGION);
        let mut own = 0;
        huge_pages::runs(done, |r0, k| {
            for r in r0..r0 + k {
                own += overlap(idx, n, r);
                self.retain_rest_of_region(seg, r, idx, n, now);
            }
        });
        (own * SLICE, done.count_ones() as usize * REGION)
    }

    /// The free spans of region `r` of `seg`, all of whose slices but the
    /// used span's `idx..idx + n` are free, just had their pages there
    /// committed: they hold them as retained pages.
    fn retain_rest_of_region(&mut self, seg: &Segment, r: usize, idx: usize, n: usize, now: u64) {
        let (a, b) = (r * REGION_SLICES, (r + 1) * REGION_SLICES);
        let per = os_pages_per_slice();
        // Free spans before the used span, from its left neighbour back.
        let mut s = idx.min(b);
        while s > a {
            // SAFETY: the slice before a span ends a free span here; its
            // last descriptor says where that span starts (lock held).
            let first = s - 1 - unsafe { (*seg.page(s - 1)).slice_offset } as usize;
            self.retain_pages(seg.page(first), (s - first.max(a)) * per, now);
            s = first;
        }
        // Free spans after it.
        let mut s = (idx + n).max(a);
        while s < b {
            let f = seg.page(s);
            let k = count_of(f);
            self.retain_pages(f, (s + k).min(b).saturating_sub(s) * per, now);
            s += k;
        }
    }

    /// `pages` more OS pages of the free span `f` were committed.
    fn retain_pages(&mut self, f: *mut Page, pages: usize, now: u64) {
        // SAFETY: a free span of this pool (lock held).
        unsafe {
            debug_assert_eq!((*f).kind(), Kind::Free);
            (*f).dirty_pages += pages as u32;
        }
        self.counts.retained += pages * os_page();
        self.add_committed(pages * os_page());
        if !self.is_dirty(f) {
            // SAFETY: as above.
            unsafe { (*f).freed_at = now };
            self.dirty_push(f);
        }
        debug_assert_eq!(
            // SAFETY: as above.
            unsafe { (*f).dirty_pages } as usize,
            Self::committed_pages(f, count_of(f))
        );
    }

    /// Backs with huge pages the regions wholly inside the large object's
    /// span `p` (committed whole) that are not yet, if the policy says so:
    /// the program asked for all of that memory.
    pub fn back_large(&mut self, ctx: &Ctx, p: *mut Page) {
        let seg = seg_of(p);
        let off = seg.index_of(p) * SLICE;
        // Objects under 2 MiB (most) are done after one division.
        let m = huge_pages::regions_inside(off, count_of(p) * SLICE) & !seg.huge_regions();
        if m == 0
            || !Policy::of(ctx.config.thp(), ctx.source).on()
            || !ctx.budget.huge.room_for(m.count_ones() as usize)
        {
            return;
        }
        debug_assert!({
            let mut all = true;
            huge_pages::runs(m, |r, k| {
                let (first, count) = huge_pages::region_pages(r);
                all &= seg.count_committed(first, k * count) == k * count;
            });
            all
        });
        huge_pages::advise(ctx.source, &ctx.budget.huge, seg, m);
    }

    /// Whether purging the free span `f` would split a huge page of a heap
    /// that took a slab span less than `delay` ago (at `now`): a heap still
    /// growing into the region.
    pub(super) fn growing_into(&self, f: *mut Page, now: u64, delay: u64) -> bool {
        delay != 0 && now < self.slab_taken_at.saturating_add(delay) && Self::would_split(f)
    }

    /// Whether purging the free span `f` would split a huge page: it covers
    /// part of an advised region (whose pages are all committed).
    pub(super) fn would_split(f: *mut Page) -> bool {
        let seg = seg_of(f);
        let (off, len) = (seg.index_of(f) * SLICE, count_of(f) * SLICE);
        let advised = huge_pages::regions_touched(off, len) & seg.huge_regions();
        advised & !huge_pages::regions_inside(off, len) != 0
    }

    /// Of the retention FIFO's first few spans from `f`, the first whose
    /// purge would split no huge page, if `f`'s would: what the budget
    /// purges first, so that whole huge pages go back before any is split.
    pub(super) fn whole_before(&self, f: *mut Page) -> Option<*mut Page> {
        const LOOK: usize = 8;
        if !Self::would_split(f) {
            return None;
        }
        let mut g = f;
        for _ in 0..LOOK {
            // SAFETY: FIFO entries are free spans of this pool (lock held).
            g = unsafe { (*g).dirty_next };
            if g.is_null() {
                return None;
            }
            if !Self::would_split(g) {
                return Some(g);
            }
        }
        None
    }

    /// Takes the huge-page advice back from the regions of `seg` that
    /// `first..first + count` (OS pages) touches, before they are purged.
    pub(super) fn before_purge(ctx: &Ctx, seg: &Segment, first: usize, count: usize) -> bool {
        let shift = os_page_shift();
        huge_pages::before_purge(
            ctx.source,
            &ctx.budget.huge,
            seg,
            seg.base() + (first << shift),
            count << shift,
        )
    }
}
