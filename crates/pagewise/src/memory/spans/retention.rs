//! Retention: every free span with committed pages sits on a FIFO with the
//! time it was freed; the decay purges the oldest while the budget says
//! retention is above what demand will need again (more for expired spans
//! than for young ones: see [`crate::budget`]), one `madvise` per run of
//! committed pages. Runs under the heap's span lock.

use super::*;

/// How far a pool's retained bytes may drift from what the budget shows
/// between span operations (see [`Spans::sync_retained_coarsely`]).
pub const SYNC_GRAIN: usize = 4 << 20;

impl Spans {
    pub(super) fn is_dirty(&self, f: *mut Page) -> bool {
        // SAFETY: a free span descriptor (lock held).
        unsafe { (*f).in_dirty }
    }

    pub(super) fn dirty_push(&mut self, f: *mut Page) {
        // SAFETY: `f` is a free span descriptor not on the FIFO (lock held).
        unsafe {
            (*f).in_dirty = true;
            (*f).dirty_next = null_mut();
            (*f).dirty_prev = self.dirty_tail;
            if self.dirty_tail.is_null() {
                self.dirty_head = f;
            } else {
                (*self.dirty_tail).dirty_next = f;
            }
        }
        self.dirty_tail = f;
    }

    pub(super) fn dirty_unlink(&mut self, f: *mut Page) {
        // SAFETY: `f` is on the FIFO (lock held).
        unsafe {
            (*f).in_dirty = false;
            if (*f).dirty_prev.is_null() {
                self.dirty_head = (*f).dirty_next;
            } else {
                (*(*f).dirty_prev).dirty_next = (*f).dirty_next;
            }
            if (*f).dirty_next.is_null() {
                self.dirty_tail = (*f).dirty_prev;
            } else {
                (*(*f).dirty_next).dirty_prev = (*f).dirty_prev;
            }
        }
    }

    pub(super) fn purge_span(&mut self, ctx: &Ctx, f: *mut Page, why: Why) {
        let seg = seg_of(f);
        let idx = seg.index_of(f);
        let n = count_of(f);
        // SAFETY: a free span on the FIFO (lock held).
        let dirty = unsafe { (*f).dirty_pages } as usize;
        self.counts.retained -= dirty * os_page();
        self.dirty_unlink(f);
        let base = seg.base();
        let mut failed = false;
        let cleared = seg.drain_committed(
            idx * os_pages_per_slice(),
            n * os_pages_per_slice(),
            |first, count| {
                let addr = base + first * os_page();
                // SAFETY: the run is inside a free span (no live data), page-aligned,
                // in a mapped segment of this source.
                let ok = Self::before_purge(ctx, seg, first, count)
                    && unsafe {
                        ctx.source.purge(
                            NonNull::new_unchecked(addr as *mut u8),
                            count * os_page(),
                            ctx.config.purge(),
                        )
                    };
                failed |= !ok;
                ok
            },
        );
        self.counts.committed -= cleared * os_page();
        ctx.budget.uncharge(cleared * os_page());
        self.count_purged(why, cleared * os_page());
        // SAFETY: as above.
        unsafe { (*f).dirty_pages = (dirty - cleared) as u32 };
        if failed {
            self.counts.purge_failures += 1;
            self.counts.retained += (dirty - cleared) * os_page();
            self.dirty_push(f);
        }
    }

    fn expired(&self, f: *mut Page, now: u64, delay: u64) -> bool {
        // SAFETY: a free span descriptor (lock held).
        unsafe { (*f).freed_at }.saturating_add(delay) <= now
    }

    /// Adds the change of this pool's retained bytes since the last call to
    /// the budget.
    pub fn sync_retained(&mut self, budget: &Budget) {
        let r = self.counts.retained;
        budget.add(0, r.wrapping_sub(self.published_retained));
        self.published_retained = r;
    }

    /// [`Spans::sync_retained`] only once this pool's retained bytes moved
    /// by [`SYNC_GRAIN`] or more since the last call: a churn that takes a
    /// span from retention and gives it back then touches no counter every
    /// heap shares. The decay syncs exactly before it decides.
    /// Returns whether it published.
    pub fn sync_retained_coarsely(&mut self, budget: &Budget) -> bool {
        let due = self.retained_sync_due();
        if due {
            self.sync_retained(budget);
        }
        due
    }

    /// Whether the retained bytes moved by [`SYNC_GRAIN`] or more since
    /// they were last published.
    #[inline]
    pub fn retained_sync_due(&self) -> bool {
        self.unpublished_retained().unsigned_abs() >= SYNC_GRAIN
    }

    /// Retained bytes not yet added to the budget (negative: taken).
    pub fn unpublished_retained(&self) -> isize {
        self.counts.retained.wrapping_sub(self.published_retained) as isize
    }

    /// Purges retained spans as the budget says (see [`crate::budget`]):
    /// the oldest first, while the retention of every heap sharing the
    /// budget is above what demand keeps for young spans, or the span has
    /// expired and the retention is above what demand keeps for expired
    /// ones; everything if `force` (counted as its cause). Cached huge runs
    /// follow the same rule. Returns the time of the next deadline, if
    /// anything is still retained.
    pub fn decay(&mut self, ctx: &Ctx, now: u64, force: Option<Why>) -> Option<u64> {
        let why = force;
        let force = force.is_some();
        let delay = ctx.config.decay_ms();
        self.sync_retained(ctx.budget);
        let keep = ctx.budget.keep(now, &ctx.config.get());
        let mut kept_expired = false;
        while !self.dirty_head.is_null() {
            let f = self.dirty_head;
            // SAFETY: FIFO entries are free span descriptors.
            let expired = unsafe { (*f).freed_at }.saturating_add(delay) <= now;
            let total = ctx.budget.retained();
            let over = total > keep.young;
            if !(force || over || expired && total > keep.expired) {
                kept_expired = expired;
                break;
            }
            if !(force || over) && self.growing_into(f, now, delay) {
                // The rest of a huge page the heap is filling: kept while
                // it grows (its age starts again), given back once the
                // heap is quiet, or for the budget or the limit.
                self.dirty_unlink(f);
                // SAFETY: a free span of this pool, off the FIFO (lock held).
                unsafe { (*f).freed_at = now };
                self.dirty_push(f);
                continue;
            }
            if let Some(g) = self.whole_before(f).filter(|_| over && !force) {
                // For the budget, whole huge pages go back before one is
                // split.
                let cause = if self.expired(g, now, delay) {
                    Why::Decay
                } else {
                    Why::Budget
                };
                self.purge_span(ctx, g, cause);
                self.sync_retained(ctx.budget);
                if self.is_dirty(g) {
                    break; // the purge failed and it went back on the FIFO: do not spin
                }
                continue;
            }
            // An expired span goes for the decay; a young one only for the
            // budget.
            let cause = why.unwrap_or(if expired { Why::Decay } else { Why::Budget });
            self.purge_span(ctx, f, cause);
            self.sync_retained(ctx.budget);
            if self.dirty_tail == f && self.is_dirty(f) {
                break; // the purge failed and it went back on the FIFO: do not spin
            }
        }
        kept_expired |= self.decay_huge(ctx, now, why, keep);
        self.sync_retained(ctx.budget);
        let mut next = None;
        if !self.dirty_head.is_null() {
            // SAFETY: as above.
            next = Some(unsafe { (*self.dirty_head).freed_at } + delay);
        }
        let mut h = self.huge_cache;
        while !h.is_null() {
            // SAFETY: cache entries are huge segment headers of this heap.
            unsafe {
                let st = *(*h).huge_state();
                if st.resident.any() {
                    let d = st.freed_at + delay;
                    next = Some(next.map_or(d, |n: u64| n.min(d)));
                }
                h = (*(*h).links()).next;
            }
        }
        if kept_expired {
            // Demand kept an expired span: look again when the history moves.
            next = next.map(|n| n.max(keep.recheck_at));
        }
        next
    }

    /// Purges retained spans, oldest first, until `bytes` are purged or
    /// none is left (cached huge runs stay). Returns the bytes purged.
    pub fn purge_oldest(&mut self, ctx: &Ctx, bytes: usize) -> usize {
        let start = self.counts.retained;
        while !self.dirty_head.is_null() && start - self.counts.retained < bytes {
            let f = self.dirty_head;
            self.purge_span(ctx, f, Why::Reclaim);
            if self.dirty_tail == f && self.is_dirty(f) {
                break; // the purge failed and it went back on the FIFO: do not spin
            }
        }
        self.sync_retained(ctx.budget);
        start.saturating_sub(self.counts.retained)
    }

    /// Committed bytes currently retained (free spans and cached huge runs).
    pub fn retained(&self) -> usize {
        self.counts.retained
    }
}
