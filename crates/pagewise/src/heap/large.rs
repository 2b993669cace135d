//! Large objects (a span of whole slices in a segment), huge objects (a
//! segment run of their own) and reallocation.
//!
//! Invariants: large and huge objects change state only under the heap's
//! span lock, so any thread may free them; a span's kind is set by the span
//! pool when it is taken, under that lock.

use super::free::lookup_page;
use super::*;
use crate::profile::{recent, Sample};

impl HeapCore {
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn alloc_large(&self, size: usize, align: usize) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { self.alloc_span(size, align).0 }
    }

    /// Allocates a large or huge object; also says whether its memory is
    /// known to be zero. The allocation may be sampled (`heap/sample.rs`).
    pub(super) unsafe fn alloc_span(&self, size: usize, align: usize) -> (*mut u8, bool) {
        let sample = if self.global {
            self.sample_large(size)
        } else {
            Sample::NONE
        };
        // SAFETY: forwarded.
        let (p, zero) = unsafe { self.alloc_span_with(size, align, sample, 0) };
        if p.is_null() {
            sample.release(size);
        } else {
            // SAFETY: the block just allocated.
            let usable = unsafe { HeapCore::usable_size(p) };
            self.note_allocated(usable);
            if let Some(site) = sample.site() {
                recent::allocated(site, p as usize, p as usize + usable);
            }
        }
        (p, zero)
    }

    /// A sampled small allocation served as a large object (null if it
    /// cannot be had). It is what it would have been unsampled, a `slot`
    /// of its class (its usable size, so that a program that uses all of
    /// it, or resizes it within it, sees no difference): only the OS pages
    /// of the slot are committed, and its descriptor carries `sample`.
    ///
    /// # Safety
    /// Owner only.
    pub(super) unsafe fn alloc_span_sampled(
        &self,
        size: usize,
        slot: usize,
        sample: Sample,
    ) -> *mut u8 {
        debug_assert!(size <= slot && slot <= SMALL_MAX && sample.is_some());
        // SAFETY: forwarded; the span starts on a slice, which is as far
        // as any small class is aligned.
        let p = unsafe { self.alloc_span_with(size, 16, sample, slot).0 };
        if let (Some(site), false) = (sample.site(), p.is_null()) {
            recent::allocated(site, p as usize, p as usize + slot);
        }
        p
    }

    /// [`HeapCore::alloc_span`] with its sample decided; `slot`: 0, or the
    /// slot of a sampled small object ([`HeapCore::alloc_span_sampled`]).
    unsafe fn alloc_span_with(
        &self,
        size: usize,
        align: usize,
        sample: Sample,
        slot: usize,
    ) -> (*mut u8, bool) {
        if self.global {
            // As for a new slab page: the purger must be there before the
            // program goes quiet.
            crate::global::purger::request();
        }
        if size > LARGE_MAX || align > LARGE_ALIGN_MAX {
            return self.alloc_huge(size, align, sample);
        }
        let n = size.max(1).div_ceil(SLICE);
        let align_slices = (align / SLICE).max(1);
        if n + align_slices - 1 > crate::memory::spans::SPAN_SLICES {
            // No span of a segment can hold it at that alignment.
            return self.alloc_huge(size, align, sample);
        }
        let now = self.source().now_ms();
        if self.global && slot == 0 && !sample.is_some() && align_slices == 1 {
            if let Some(start) = self.alloc_large_resident(n, size, now) {
                return (start as *mut u8, false);
            }
        }
        // The pages of the span not committed yet are charged against the
        // limit before they are: refused, the span goes back.
        let taken = self.take_spans_within_limit(|ctx, spans| {
            let (page, dirty) = spans.take_large(ctx, n, align_slices)?;
            // A sampled small object alone on a span commits only the OS
            // pages its slot uses (`alloc_span_sampled`).
            let prefix = slot != 0;
            let cost = if prefix {
                spans.uncommitted_prefix_bytes(page, slot)
            } else {
                spans.uncommitted_bytes(page, dirty)
            };
            if !ctx.budget.charge(cost, ctx.config.limit_bytes()) {
                spans.untake_large(page, dirty, now);
                spans.over_limit = true;
                return None;
            }
            // SAFETY: a freshly taken span, exclusively ours under the lock.
            let start = unsafe {
                (*page).large_size = n * SLICE;
                (*page).large_requested = size;
                (*page).slot_size = slot as u32;
                (*page).sample = sample;
                (*page).start
            };
            let newly = if prefix {
                spans.commit_prefix_of(page, slot, dirty)
            } else {
                let newly = spans.commit_whole_of(page, dirty);
                // Committed whole: its whole 2 MiB regions may be huge pages.
                spans.back_large(ctx, page);
                newly
            };
            spans.counts.large_count += 1;
            spans.counts.large_bytes += n * SLICE;
            spans.counts.large_requested += size;
            self.after_span_change(ctx, spans, now);
            Some((start, newly))
        });
        let Some((start, newly)) = taken else {
            return (null_mut(), false);
        };
        // Pages not committed before were never used or purged; purged ones
        // read as zero only after MADV_DONTNEED.
        let zero = newly == n * SLICE / os_page()
            && self.config.purge() == crate::os::source::Purge::DontNeed;
        (start as *mut u8, zero)
    }

    /// A large object of `n` slices on memory already resident: a free
    /// span of this heap's pool whose OS pages are all committed, else one
    /// of another thread heap's pool (those of exited threads first, each
    /// pool by `try_lock`), rather than commit fresh memory while that one
    /// waits (docs/design.md, "Retention, decay and purge"). The object
    /// belongs to the pool it was taken from, as any large object does to
    /// its segment's heap: whichever thread frees it returns it there.
    /// None if no pool has such a span; nothing is committed here. For
    /// thread heaps of the global allocator (the others it looks at).
    fn alloc_large_resident(&self, n: usize, size: usize, now: u64) -> Option<usize> {
        if let Some(start) = self.take_large_resident(n, size, now, true) {
            return Some(start);
        }
        // Every other heap is looked at (a `try_lock` each): the published
        // retention lags by a grain, too coarse to tell a pool that has the
        // span from one that has not, and a look costs far less than the
        // page faults of committing a slice (64 KiB or more) afresh.
        // Retention within what recent demand says comes back is for the
        // heaps' threads (and the next to adopt an exited one) to reuse:
        // taken, they commit as much afresh. Past it (the budget's slack for
        // young spans) it is memory no demand accounts for, which goes to
        // whoever needs it.
        let budget = self.budget();
        if budget.retained() <= budget.keep(now, &self.config.get()).expired {
            return None;
        }
        crate::global::heaps::find_elsewhere(self, true, |h| {
            h.take_large_resident(n, size, now, false)
        })
    }

    /// A large object of `n` slices (unsampled, unaligned) on a span of
    /// this heap's pool whose OS pages are all committed, if it has one;
    /// the span lock waited for if `wait`, else tried. Any thread.
    fn take_large_resident(&self, n: usize, size: usize, now: u64, wait: bool) -> Option<usize> {
        let mut spans = if wait {
            self.spans.lock()
        } else {
            self.spans.try_lock()?
        };
        let ctx = self.ctx();
        let (page, dirty) = spans.take_large_resident(&ctx, n)?;
        // SAFETY: a freshly taken span, exclusively ours under the lock.
        let start = unsafe {
            (*page).large_size = n * SLICE;
            (*page).large_requested = size;
            (*page).slot_size = 0;
            (*page).sample = Sample::NONE;
            (*page).start
        };
        let newly = spans.commit_whole_of(page, dirty);
        debug_assert_eq!(newly, 0, "a resident span committed fresh pages");
        spans.back_large(&ctx, page);
        spans.counts.large_count += 1;
        spans.counts.large_bytes += n * SLICE;
        spans.counts.large_requested += size;
        self.after_span_change(&ctx, &mut spans, now);
        Some(start)
    }

    /// Frees a large object (any thread: the span lock serialises it);
    /// returns its usable size.
    pub(super) unsafe fn free_large(&self, page: *mut Page) -> usize {
        let now = self.source().now_ms();
        let ctx = self.ctx();
        let mut spans = self.spans.lock();
        // SAFETY: as below, under the lock.
        let sampled = unsafe { (*page).kind() == Kind::Large && (*page).sample.is_some() };
        // A sampled object's free is remembered with its stack, taken with
        // the lock let go (the unwinder may allocate), then the lock again:
        // what the object was is read anew below.
        let mut stack = None;
        if sampled {
            drop(spans);
            stack = Some(recent::FreeStack::take());
            spans = self.spans.lock();
        }
        // SAFETY: `page` is a span descriptor of this heap; under the lock
        // its kind tells whether it is still a live large object.
        let (kind, start, size, requested, slot, sample) = unsafe {
            (
                (*page).kind(),
                (*page).start,
                (*page).large_size,
                (*page).large_requested,
                (*page).slot_size as usize,
                core::mem::replace(&mut (*page).sample, Sample::NONE),
            )
        };
        if kind != Kind::Large {
            drop(spans);
            misuse(Misuse::DoubleFree, start);
        }
        spans.counts.large_count -= 1;
        spans.counts.large_bytes -= size;
        spans.counts.large_requested -= requested;
        if sample.is_some() {
            // It may not be committed whole (`alloc_span_sampled`).
            spans.give_back_partly_committed(page, now);
        } else {
            spans.give_back_large(page, now);
        }
        // A sampled small object's usable size is its class's slot.
        let usable = if slot != 0 { slot } else { size };
        if let (Some(site), Some(stack)) = (sample.site(), &stack) {
            // Under the lock: once it is let go, the span may be taken again.
            recent::freed(site, start, start + usable, stack);
        }
        self.after_span_change(&ctx, &mut spans, now);
        sample.release(requested);
        usable
    }

    #[cold]
    pub(super) fn alloc_huge(&self, size: usize, align: usize, sample: Sample) -> (*mut u8, bool) {
        if size > isize::MAX as usize / 2 || align > 1 << 40 {
            return (null_mut(), false);
        }
        let now = self.source().now_ms();
        let p = self.take_spans_within_limit(|ctx, spans| {
            let p = spans.take_huge(ctx, size, align);
            if let Some(base) = p.and_then(|(a, _)| registry::header_of(a)) {
                // SAFETY: the header of the segment run just taken
                // (registered), its state written under the span lock.
                unsafe { (*(*Segment::of(base)).huge_state()).sample = sample };
            }
            if p.is_some() || !spans.over_limit {
                self.after_span_change(ctx, spans, now);
            }
            p
        });
        let dontneed = self.config.purge() == crate::os::source::Purge::DontNeed;
        p.map_or((null_mut(), false), |(a, fresh)| {
            (a as *mut u8, fresh && dontneed)
        })
    }

    /// Frees a huge object (any thread: the span lock serialises it);
    /// returns its usable size.
    pub(super) fn free_huge(&self, seg: &Segment, addr: usize) -> usize {
        let now = self.source().now_ms();
        let ctx = self.ctx();
        let mut spans = self.spans.lock();
        // SAFETY: the huge state is read under the span lock. A sampled
        // object's free stack is taken with the lock let go (as for a
        // large object), and the state read anew below.
        let sampled = unsafe { (*seg.huge_state()).sample.is_some() };
        let mut stack = None;
        if sampled {
            drop(spans);
            stack = Some(recent::FreeStack::take());
            spans = self.spans.lock();
        }
        // SAFETY: the huge state is read under the span lock.
        let st = unsafe { *seg.huge_state() };
        if st.size == 0 {
            drop(spans);
            misuse(Misuse::DoubleFree, addr);
        }
        if addr != seg.base() + st.offset {
            drop(spans);
            misuse(Misuse::Misaligned, addr);
        }
        // SAFETY: as above.
        let sample = unsafe { core::mem::replace(&mut (*seg.huge_state()).sample, Sample::NONE) };
        if let (Some(site), Some(stack)) = (sample.site(), &stack) {
            // Under the lock: once it is let go, the run may be taken again.
            recent::freed(site, addr, addr + st.size, stack);
        }
        spans.give_back_huge(seg as *const Segment as *mut Segment, now);
        self.after_span_change(&ctx, &mut spans, now);
        sample.release(st.requested);
        st.size
    }

    /// Resizes the allocation at `ptr` (of `old_size` bytes, alignment
    /// `align`) to `new_size`, in place when it can.
    ///
    /// # Safety
    /// Owner of the calling thread's heap; `ptr` live; `current` as in `free_any`.
    pub unsafe fn realloc(
        &self,
        ptr: *mut u8,
        old_size: usize,
        align: usize,
        new_size: usize,
        current: *const HeapCore,
    ) -> *mut u8 {
        if !self.global {
            // An owned `Heap` resizes only its own blocks (a thread heap
            // takes any pagewise block: it frees foreign ones remotely).
            self.assert_owns(ptr as usize);
        }
        // SAFETY: `ptr` is live (caller).
        let usable = unsafe { HeapCore::usable_size(ptr) };
        if stays_in_place(usable, new_size) {
            return ptr;
        }
        // SAFETY: forwarded.
        if unsafe { self.resize_large_in_place(ptr, new_size) } {
            return ptr;
        }
        // SAFETY: owner (caller).
        let new = unsafe { self.alloc(new_size, align) };
        if !new.is_null() {
            // SAFETY: both live, distinct allocations of at least this size.
            unsafe {
                core::ptr::copy_nonoverlapping(ptr, new, old_size.min(new_size));
                HeapCore::free_any(ptr, current);
            }
        }
        new
    }

    /// Grows or shrinks a large object in place: one of this heap, or, for
    /// a thread heap of the global allocator, of any thread heap.
    pub(crate) unsafe fn resize_large_in_place(&self, ptr: *mut u8, new_size: usize) -> bool {
        let addr = ptr as usize;
        let Some(base) = registry::header_of(addr) else {
            return false;
        };
        // SAFETY: registered segment.
        let seg = unsafe { &*Segment::of(base) };
        if seg.huge || new_size > LARGE_MAX || new_size <= SMALL_MAX {
            return false;
        }
        // The span pool the object belongs to: this heap's, or, for a thread
        // heap, another thread heap's (a large object taken from memory
        // that heap retained, `alloc_large_resident`), under its span lock
        // as a free from any thread is.
        let owner: &HeapCore = if seg.heap == self.me() {
            self
        } else if self.global {
            // SAFETY: a registered segment's heap outlives its pages (heaps
            // are never freed).
            let h = unsafe { &*(seg.heap as *const HeapCore) };
            if !h.global {
                return false;
            }
            h
        } else {
            return false;
        };
        let page = lookup_page(seg, addr);
        let now = owner.source().now_ms();
        let ctx = owner.ctx();
        let mut spans = owner.spans.lock();
        // SAFETY: descriptor of this segment, read under the span lock.
        let (kind, start, have, slot) = unsafe {
            (
                (*page).kind(),
                (*page).start,
                (*page).slice_count as usize,
                (*page).slot_size,
            )
        };
        if kind != Kind::Large || addr != start || slot != 0 {
            // A sampled small object is not resized past its slot: it
            // moves, as it would have unsampled (`alloc_span_sampled`).
            return false;
        }
        let want = new_size.div_ceil(SLICE);
        let ok = if want > have {
            spans.grow_in_place(page, want - have) && {
                // The pages the object grows over that are not committed
                // are charged first; refused, it shrinks back (the caller
                // then moves the object, through the allocation's purge
                // and retry).
                let dirty = spans.committed_pages_of(page);
                let fits = ctx.budget.charge(
                    spans.uncommitted_bytes(page, dirty),
                    ctx.config.limit_bytes(),
                );
                if !fits {
                    spans.ungrow_in_place(page, have, now);
                }
                fits
            }
        } else if want < have {
            spans.shrink_in_place(page, want, now);
            true
        } else {
            true
        };
        if ok {
            // SAFETY: our live large span, under the lock.
            let (old, sample) = unsafe {
                let old = (*page).large_requested;
                // Counted as jemalloc counts a resize in place: the new
                // size allocated, the old one freed.
                self.note_freed((*page).large_size);
                self.note_allocated(want * SLICE);
                spans.counts.large_bytes =
                    spans.counts.large_bytes - (*page).large_size + want * SLICE;
                spans.counts.large_requested = spans.counts.large_requested - old + new_size;
                (*page).large_size = want * SLICE;
                (*page).large_requested = new_size;
                (old, (*page).sample)
            };
            if let Some(site) = sample.site() {
                // SAFETY: as above.
                let start = unsafe { (*page).start };
                recent::resized(site, start, start + want * SLICE);
            }
            spans.commit_whole(page);
            spans.back_large(&ctx, page);
            owner.after_span_change(&ctx, &mut spans, now);
            // A sampled object stays one, as an unsampled object stays
            // where it is: what it stands for is now of the new size.
            sample.resized(old, new_size);
        }
        ok
    }
}

/// Whether a block of `usable` bytes resized to `new_size` stays where it
/// is: it fits, and shrinks by no more than half (a small block always:
/// moving it frees at most 48 bytes).
#[inline]
pub(crate) fn stays_in_place(usable: usize, new_size: usize) -> bool {
    new_size <= usable && (new_size >= usable / 2 || usable <= 64)
}
