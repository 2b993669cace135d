//! The huge-object cache: a freed huge object's segment run is kept whole
//! for the next huge request it fits, and purged after the decay delay.
//! Runs under the heap's span lock.

use super::*;
use crate::memory::huge_pages::{Policy, RunAdvice};

impl Spans {
    /// Allocates a huge object: reuses the smallest cached run that fits
    /// (at most twice the need, lowest address on ties), else takes a new
    /// run of segments. Also says whether no page of it was committed
    /// (fresh or purged).
    pub fn take_huge(&mut self, ctx: &Ctx, size: usize, align: usize) -> Option<(usize, bool)> {
        let offset = align.max(HEADER_SLICES * SLICE);
        let usable = align_up(size, os_page());
        let need = offset + usable;
        let limit = ctx.config.limit_bytes();
        // What the object commits is charged against the limit before any
        // state changes: refused, nothing is taken.
        let (seg, charged) = match self.best_cached_huge(need, align) {
            Some(h) => {
                // SAFETY: a cached huge header of this heap (lock held).
                let mut probe = unsafe { (*(*h).huge_state()).resident };
                let grown = probe.place(offset, offset + usable).grown;
                if !ctx.budget.charge(grown, limit) {
                    self.over_limit = true;
                    return None;
                }
                self.unlink(h, true);
                // SAFETY: a cached huge header we own again (lock held).
                let st = unsafe { &*(*h).huge_state() };
                self.counts.retained -= st.resident.bytes();
                (h, grown)
            }
            None => {
                let nsegs = need.div_ceil(SEGMENT);
                // A fresh run: its header and the object's pages.
                if !ctx.budget.charge(header_bytes() + usable, limit) {
                    self.over_limit = true;
                    return None;
                }
                let refuse_huge = Policy::refuses_elsewhere(ctx.source);
                let Some(base) = ctx.reservations.lock().take(
                    ctx.source,
                    nsegs,
                    align.max(SEGMENT),
                    ctx.config.reservation_bytes(),
                    refuse_huge,
                ) else {
                    ctx.budget.uncharge(header_bytes() + usable);
                    return None;
                };
                self.counts.segments += 1;
                self.counts.metadata += header_bytes();
                crate::memory::registry::mark_huge(base);
                // SAFETY: the run is ours; fresh, or its header was zeroed on release.
                (
                    unsafe { Segment::init(base, nsegs, ctx.heap, true) },
                    usable,
                )
            }
        };
        // What the profiler remembered of a sampled block in the run is
        // over, wherever in it the new object starts.
        // SAFETY: the header of a run we own, under the lock.
        let run = unsafe { (*seg).nsegs } * SEGMENT;
        crate::profile::recent::reused(seg as usize, seg as usize + run);
        // SAFETY: the huge state of a run we own, under the lock.
        let st = unsafe { &mut *(*seg).huge_state() };
        // Committed: whatever the object spans, beyond what may already be
        // resident; zero if no byte of it may hold old data.
        let placed = st.resident.place(offset, offset + usable);
        st.offset = offset;
        st.size = usable;
        st.requested = size;
        debug_assert_eq!(placed.grown, charged);
        self.add_committed(placed.grown);
        // The whole 2 MiB regions inside the object may be huge pages; a
        // run reused at another place first takes back the old advice.
        let want = RunAdvice::inside(offset, offset + usable);
        let base = seg as usize;
        if st.thp != want && !st.thp.is_empty() {
            let old = st.thp;
            st.thp
                .before_purge(ctx.source, &ctx.budget.huge, base, old.lo, old.hi - old.lo);
        }
        self.purge_outside_object(ctx, seg);
        // SAFETY: as above (`purge_outside_object` is done with it).
        let st = unsafe { &mut *(*seg).huge_state() };
        if st.thp.is_empty()
            && Policy::of(ctx.config.thp(), ctx.source).on()
            && want.advise(ctx.source, &ctx.budget.huge, base)
        {
            st.thp = want;
        }
        self.counts.huge_count += 1;
        self.counts.huge_bytes += usable;
        self.counts.huge_requested += size;
        Some((seg as usize + offset, placed.was_clean))
    }

    /// A run reused by a smaller object, or at another offset, purges what
    /// the object does not cover, so that every committed byte of a live
    /// huge run is the object's (`committed = live + free slots + retained`
    /// holds for huge runs too). A run reused at its own size purges nothing.
    fn purge_outside_object(&mut self, ctx: &Ctx, seg: *mut Segment) {
        // SAFETY: the huge state of a run we own, under the lock.
        let (st, base) = unsafe { (&mut *(*seg).huge_state(), (*seg).base()) };
        let (lo, hi) = (st.offset, st.offset + st.size);
        let mut ok = true;
        for (offset, len) in st.resident.outside(lo, hi).into_iter().flatten() {
            // SAFETY: outside the live object, inside the run's mapping,
            // page-aligned (offsets and sizes are multiples of OS pages).
            ok &= st
                .thp
                .before_purge(ctx.source, &ctx.budget.huge, base, offset, len)
                && unsafe {
                    ctx.source.purge(
                        NonNull::new_unchecked((base + offset) as *mut u8),
                        len,
                        ctx.config.purge(),
                    )
                };
        }
        if !ok {
            // The pages stay counted as committed (by the hull).
            self.counts.purge_failures += 1;
            return;
        }
        let bytes = st.resident.purged_outside(lo, hi);
        self.counts.committed -= bytes;
        ctx.budget.uncharge(bytes);
        self.count_purged(Why::Reuse, bytes);
    }

    pub(super) fn best_cached_huge(&self, need: usize, align: usize) -> Option<*mut Segment> {
        let mut best: Option<(usize, *mut Segment)> = None;
        let mut h = self.huge_cache;
        while !h.is_null() {
            // SAFETY: cache entries are huge segment headers of this heap.
            let (cap, next) = unsafe { ((*h).nsegs * SEGMENT, (*(*h).links()).next) };
            let aligned = align <= SEGMENT || (h as usize) % align == 0;
            if cap >= need
                && cap <= 2 * need
                && aligned
                && best.is_none_or(|(c, b)| cap < c || (cap == c && h < b))
            {
                best = Some((cap, h));
            }
            h = next;
        }
        best.map(|(_, h)| h)
    }

    /// Frees a huge object into the cache (retained, purged after the delay).
    pub fn give_back_huge(&mut self, seg: *mut Segment, now: u64) {
        // SAFETY: `seg` is a huge header of this heap holding a live object;
        // its state changes under the span lock.
        let st = unsafe { &mut *(*seg).huge_state() };
        self.counts.huge_count -= 1;
        self.counts.huge_bytes -= st.size;
        self.counts.huge_requested -= st.requested;
        st.size = 0;
        st.requested = 0;
        st.freed_at = now;
        self.counts.retained += st.resident.bytes();
        // SAFETY: links of a header we own, under the lock.
        unsafe {
            let l = (*seg).links();
            (*l).prev = null_mut();
            (*l).next = self.huge_cache;
            if !self.huge_cache.is_null() {
                (*(*self.huge_cache).links()).prev = seg;
            }
        }
        self.huge_cache = seg;
    }

    /// Purges cached huge runs as [`Spans::decay`] does spans. Returns
    /// whether demand kept an expired run.
    pub(super) fn decay_huge(
        &mut self,
        ctx: &Ctx,
        now: u64,
        force: Option<Why>,
        keep: crate::memory::budget::Keep,
    ) -> bool {
        let delay = ctx.config.decay_ms();
        let mut kept_expired = false;
        let mut h = self.huge_cache;
        while !h.is_null() {
            // SAFETY: cache entries are huge headers of this heap (lock held).
            let (st, next, base) =
                unsafe { (&mut *(*h).huge_state(), (*(*h).links()).next, (*h).base()) };
            self.sync_retained(ctx.budget);
            let total = ctx.budget.retained();
            let expired = st.freed_at.saturating_add(delay) <= now;
            let why = match force {
                Some(why) => why,
                None if expired => Why::Decay,
                None => Why::Budget,
            };
            let due = force.is_some() || total > keep.young || expired && total > keep.expired;
            kept_expired |= expired && !due && st.resident.any();
            if let Some((offset, len)) = st.resident.range().filter(|_| due) {
                // SAFETY: the cached run holds no live object; the range is
                // page-aligned and inside the run's mapping.
                let ok = st
                    .thp
                    .before_purge(ctx.source, &ctx.budget.huge, base, offset, len)
                    && unsafe {
                        ctx.source.purge(
                            NonNull::new_unchecked((base + offset) as *mut u8),
                            len,
                            ctx.config.purge(),
                        )
                    };
                if ok {
                    let bytes = st.resident.purged();
                    self.counts.retained -= bytes;
                    self.counts.committed -= bytes;
                    ctx.budget.uncharge(bytes);
                    self.count_purged(why, bytes);
                } else {
                    self.counts.purge_failures += 1;
                }
            }
            h = next;
        }
        kept_expired
    }
}
