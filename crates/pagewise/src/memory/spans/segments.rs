//! The heap's segments: taking a new one from the reservations, and giving
//! wholly free segments and purged huge runs back (their headers zeroed for
//! the next user). Runs under the heap's span lock.

use super::*;
use crate::memory::huge_pages::Policy;

impl Spans {
    pub(super) fn new_segment(&mut self, ctx: &Ctx) -> Option<()> {
        // The header is committed memory too: charged against the limit
        // before it is touched, given back in `release_run`.
        if !ctx.budget.charge(header_bytes(), ctx.config.limit_bytes()) {
            self.over_limit = true;
            return None;
        }
        let refuse_huge = Policy::refuses_elsewhere(ctx.source);
        let Some(base) = ctx.reservations.lock().take(
            ctx.source,
            1,
            SEGMENT,
            ctx.config.reservation_bytes(),
            refuse_huge,
        ) else {
            ctx.budget.uncharge(header_bytes());
            return None;
        };
        // SAFETY: the reservation layer handed us this segment exclusively;
        // it is fresh (zero) or its header was zeroed when it was released.
        let seg = unsafe { Segment::init(base, 1, ctx.heap, false) };
        self.push_segment(seg);
        self.counts.segments += 1;
        self.counts.metadata += header_bytes();
        // SAFETY: initialised above.
        let first = unsafe { (*seg).page(HEADER_SLICES) };
        self.insert(first, SPAN_SLICES, 0, 0);
        Some(())
    }

    pub(super) fn push_segment(&mut self, seg: *mut Segment) {
        // SAFETY: `seg` and the list head are live segments of this heap;
        // links are mutated under the span lock.
        unsafe {
            let l = (*seg).links();
            (*l).prev = null_mut();
            (*l).next = self.segments;
            if !self.segments.is_null() {
                (*(*self.segments).links()).prev = seg;
            }
        }
        self.segments = seg;
    }

    /// Releases wholly free segments and purged huge runs to the reservation
    /// layer and unmaps reservations left unused. Call after `decay(force)`.
    pub fn release_empty(&mut self, ctx: &Ctx) {
        // A wholly free segment must be one span.
        self.settle_recent();
        let mut seg = self.segments;
        while !seg.is_null() {
            // SAFETY: list entries are live segments of this heap.
            let s = unsafe { &*seg };
            // SAFETY: links are read under the span lock.
            let (next, free) = unsafe { ((*s.links()).next, (*s.links()).free_slices) };
            let untouched =
                s.count_committed(header_pages(), os_pages_per_segment() - header_pages()) == 0;
            if free == SPAN_SLICES && untouched {
                self.remove(s.page(HEADER_SLICES));
                self.unlink(seg, false);
                self.release_run(ctx, s.base(), 1);
            }
            seg = next;
        }
        let mut h = self.huge_cache;
        while !h.is_null() {
            // SAFETY: cache entries are huge segment headers of this heap.
            let (next, dirty, base, nsegs) = unsafe {
                (
                    (*(*h).links()).next,
                    (*(*h).huge_state()).resident.any(),
                    (*h).base(),
                    (*h).nsegs,
                )
            };
            if !dirty {
                self.unlink(h, true);
                self.release_run(ctx, base, nsegs);
            }
            h = next;
        }
        ctx.reservations.lock().unmap_unused(ctx.source);
    }

    pub(super) fn release_run(&mut self, ctx: &Ctx, base: usize, nsegs: usize) {
        // The header pages are the only committed ones left: give them back
        // too, which also zeroes the header for the segment's next user.
        // Each segment of a huge run may become a segment of its own later,
        // and `Segment::init` trusts its header to read as zero (the slab
        // table above all), but a huge object purged with MADV_FREE may
        // still hold its data there: zero those headers the same way.
        // Unregistered first: a stray free of a pointer in the run then gets
        // the foreign-pointer abort, not a read of a zeroed header.
        crate::memory::registry::unregister(base, nsegs);
        // Nothing of it is committed, so nothing is advised
        // (`memory/huge_pages.rs`): the next user's pages start small.
        debug_assert!({
            // SAFETY: the run's header, still ours.
            let seg = unsafe { &*Segment::of(base) };
            // SAFETY: as above.
            seg.huge_regions() == 0 && unsafe { (*seg.huge_state()).thp.is_empty() }
        });
        for k in 0..nsegs {
            zero_header(ctx, base + k * SEGMENT);
        }
        self.counts.metadata -= header_bytes();
        ctx.budget.uncharge(header_bytes());
        self.counts.segments -= 1;
        ctx.reservations.lock().give_back(base, nsegs);
    }

    /// Unlinks a segment from the segment list or (huge) the huge cache.
    pub(super) fn unlink(&mut self, seg: *mut Segment, huge: bool) {
        let head = if huge {
            &mut self.huge_cache
        } else {
            &mut self.segments
        };
        // SAFETY: `seg` is on that list; links change under the span lock.
        unsafe {
            let l = (*seg).links();
            if (*l).prev.is_null() {
                *head = (*l).next;
            } else {
                (*(*(*l).prev).links()).next = (*l).next;
            }
            if !(*l).next.is_null() {
                (*(*(*l).next).links()).prev = (*l).prev;
            }
            (*l).next = null_mut();
            (*l).prev = null_mut();
        }
    }
}

/// Zeroes the header pages of the segment at `base` (`MADV_DONTNEED`, or
/// writing zeros if the kernel refuses), so `Segment::init` finds them zero.
fn zero_header(ctx: &Ctx, base: usize) {
    // SAFETY: the segment is wholly free and leaving its heap; its header is
    // metadata nobody reads any more.
    let ok = unsafe {
        ctx.source.purge(
            NonNull::new_unchecked(base as *mut u8),
            header_bytes(),
            crate::os::source::Purge::DontNeed,
        )
    };
    if !ok {
        // SAFETY: as above; the header is ours to overwrite.
        unsafe { core::ptr::write_bytes(base as *mut u8, 0, header_bytes()) };
    }
}
