//! The span pool of one heap: free runs of slices, best fit, lowest address
//! first, coalesced on free; plus the retention FIFO that decides when
//! retained pages are purged, and the cache of freed huge objects.
//!
//! Everything here runs under the heap's span lock: the owner takes it on
//! slow paths (new slab page, large objects), other threads to free large
//! objects, and the background purger to purge expired spans.

use crate::config::Config;
use crate::layout::{align_up, OS_PAGE, OS_PAGES_PER_SLICE, SEGMENT, SLICE, SLICES_PER_SEGMENT};
use crate::lock::Locked;
use crate::page::{Kind, Page};
use crate::reservation::Reservations;
use crate::segment::{Segment, HEADER_PAGES, HEADER_SLICES};
use crate::source::PageSource;
use core::ptr::{null_mut, NonNull};

const BINS: usize = SLICES_PER_SEGMENT;
/// Slices a segment can give to spans (all but the header's).
pub const SPAN_SLICES: usize = SLICES_PER_SEGMENT - HEADER_SLICES;

/// What a heap's span pool needs from its surroundings.
pub struct Ctx<'a> {
    /// Where pages come from.
    pub source: &'a dyn PageSource,
    /// Where segments come from.
    pub reservations: &'a Locked<Reservations>,
    /// The owning heap (type-erased).
    pub heap: *mut u8,
    /// Retention policy.
    pub config: &'a Config,
}

/// Byte counts kept by the span pool (all exact).
#[derive(Clone, Copy, Default, Debug)]
pub struct SpanCounts {
    /// Bytes that may be resident: committed OS pages of spans and huge
    /// objects, segment headers excluded.
    pub committed: usize,
    /// Highest `committed` seen.
    pub peak_committed: usize,
    /// Committed bytes in free spans and cached huge objects (retained for reuse).
    pub retained: usize,
    /// Committed bytes of segment headers.
    pub metadata: usize,
    /// Segments (normal and huge runs) held.
    pub segments: usize,
    /// Live large objects.
    pub large_count: usize,
    /// Their usable bytes.
    pub large_bytes: usize,
    /// Their requested bytes.
    pub large_requested: usize,
    /// Live huge objects.
    pub huge_count: usize,
    /// Their usable bytes.
    pub huge_bytes: usize,
    /// Their requested bytes.
    pub huge_requested: usize,
    /// Bytes purged by decay, the cap or trim (cumulative).
    pub purged: usize,
    /// Purge calls that failed (the pages stay counted as committed).
    pub purge_failures: usize,
}

/// The span pool.
pub struct Spans {
    bins: [*mut Page; BINS],
    nonempty: [u64; BINS / 64],
    dirty_head: *mut Page,
    dirty_tail: *mut Page,
    segments: *mut Segment,
    huge_cache: *mut Segment,
    /// Byte counts.
    pub counts: SpanCounts,
}

// SAFETY: raw pointers into segments the heap owns; access is serialised by
// the lock around `Spans`.
unsafe impl Send for Spans {}

fn seg_of(page: *const Page) -> &'static mut Segment {
    // SAFETY: descriptors live inside their segment's header, so masking the
    // descriptor address finds the header (mapped while the span exists).
    unsafe { &mut *Segment::of(crate::layout::segment_base(page as usize)) }
}

impl Spans {
    /// An empty pool.
    pub const fn new() -> Self {
        Spans {
            bins: [null_mut(); BINS],
            nonempty: [0; BINS / 64],
            dirty_head: null_mut(),
            dirty_tail: null_mut(),
            segments: null_mut(),
            huge_cache: null_mut(),
            counts: SpanCounts {
                committed: 0,
                peak_committed: 0,
                retained: 0,
                metadata: 0,
                segments: 0,
                large_count: 0,
                large_bytes: 0,
                large_requested: 0,
                huge_count: 0,
                huge_bytes: 0,
                huge_requested: 0,
                purged: 0,
                purge_failures: 0,
            },
        }
    }

    fn add_committed(&mut self, bytes: usize) {
        self.counts.committed += bytes;
        self.counts.peak_committed = self.counts.peak_committed.max(self.counts.committed);
    }

    // ----- bins -------------------------------------------------------------

    fn first_bin_at_least(&self, n: usize) -> Option<usize> {
        let mut w = n / 64;
        let mut mask = u64::MAX << (n % 64);
        while w < self.nonempty.len() {
            let bits = self.nonempty[w] & mask;
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
            mask = u64::MAX;
        }
        None
    }

    /// Links a free span into its bin (address order) and, if it holds
    /// committed pages, at the tail of the retention FIFO.
    fn insert(&mut self, f: *mut Page, n: usize, freed_at: u64) {
        let seg = seg_of(f);
        let idx = seg.index_of(f);
        // SAFETY: `f` and its last slice are descriptors of this segment.
        unsafe {
            (*f).kind = Kind::Free;
            (*f).slice_count = n as u32;
            (*f).slice_offset = 0;
            (*f).start = seg.slice_addr(idx);
            (*f).freed_at = freed_at;
            let last = &mut seg.slices[idx + n - 1];
            last.slice_offset = (n - 1) as u32;
            last.slice_count = n as u32;
            // Address-ordered insert: best fit picks the lowest address.
            let mut prev: *mut Page = null_mut();
            let mut cur = self.bins[n];
            while !cur.is_null() && (cur as usize) < (f as usize) {
                prev = cur;
                cur = (*cur).next;
            }
            (*f).prev = prev;
            (*f).next = cur;
            if !cur.is_null() {
                (*cur).prev = f;
            }
            if prev.is_null() {
                self.bins[n] = f;
            } else {
                (*prev).next = f;
            }
        }
        self.nonempty[n / 64] |= 1 << (n % 64);
        seg.free_slices += n;
        let dirty = seg.count_committed(idx * OS_PAGES_PER_SLICE, n * OS_PAGES_PER_SLICE);
        if dirty > 0 {
            self.counts.retained += dirty * OS_PAGE;
            self.dirty_push(f);
        }
    }

    fn remove(&mut self, f: *mut Page) {
        let seg = seg_of(f);
        // SAFETY: `f` is a linked free span of this pool.
        unsafe {
            let n = (*f).slice_count as usize;
            if (*f).prev.is_null() {
                self.bins[n] = (*f).next;
            } else {
                (*(*f).prev).next = (*f).next;
            }
            if !(*f).next.is_null() {
                (*(*f).next).prev = (*f).prev;
            }
            if self.bins[n].is_null() {
                self.nonempty[n / 64] &= !(1 << (n % 64));
            }
            seg.free_slices -= n;
            if (*f).in_dirty {
                let idx = seg.index_of(f);
                let dirty = seg.count_committed(idx * OS_PAGES_PER_SLICE, n * OS_PAGES_PER_SLICE);
                self.counts.retained -= dirty * OS_PAGE;
                self.dirty_unlink(f);
            }
        }
    }

    fn dirty_push(&mut self, f: *mut Page) {
        // SAFETY: `f` is a free span descriptor not on the FIFO.
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

    fn dirty_unlink(&mut self, f: *mut Page) {
        // SAFETY: `f` is on the FIFO.
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

    // ----- taking and returning spans ----------------------------------------

    /// Takes a span of `n` slices whose start is aligned to `align_slices`
    /// slices (1 for no alignment): best fit, lowest address. Maps a new
    /// segment if no free span fits. The span's descriptors are set up as a
    /// used span of `kind`; committed bits are the caller's business.
    pub fn take(&mut self, ctx: &Ctx, n: usize, align_slices: usize) -> Option<*mut Page> {
        debug_assert!(n >= 1 && n + align_slices - 1 <= SPAN_SLICES);
        let want = n + align_slices - 1;
        let bin = match self.first_bin_at_least(want) {
            Some(b) => b,
            None => {
                self.new_segment(ctx)?;
                self.first_bin_at_least(want)?
            }
        };
        let f = self.bins[bin];
        // SAFETY: a non-empty bin's head is a free span descriptor.
        let freed_at = unsafe { (*f).freed_at };
        self.remove(f);
        let seg = seg_of(f);
        let idx = seg.index_of(f);
        let lead = (align_slices - (idx % align_slices)) % align_slices;
        if lead > 0 {
            self.insert(f, lead, freed_at);
        }
        let start = idx + lead;
        let tail = bin - lead - n;
        if tail > 0 {
            let t: *mut Page = &mut seg.slices[start + n];
            self.insert(t, tail, freed_at);
        }
        for i in 0..n {
            seg.slices[start + i].slice_offset = i as u32;
        }
        let p: *mut Page = &mut seg.slices[start];
        // SAFETY: `p` is the first descriptor of the span just carved.
        unsafe {
            (*p).slice_count = n as u32;
            (*p).start = seg.slice_addr(start);
            (*p).heap = ctx.heap;
        }
        Some(p)
    }

    /// Marks all OS pages of a used span committed (large objects, whose
    /// use pagewise cannot see).
    pub fn commit_whole(&mut self, p: *mut Page) {
        let seg = seg_of(p);
        let idx = seg.index_of(p);
        // SAFETY: `p` is a used span's first descriptor.
        let n = unsafe { (*p).slice_count } as usize;
        let newly = seg.set_committed(idx * OS_PAGES_PER_SLICE, n * OS_PAGES_PER_SLICE);
        self.add_committed(newly * OS_PAGE);
    }

    /// Takes a span for a slab page. Its committed pages (if it was
    /// retained dirty) leave this pool's accounting: the caller counts them.
    /// Returns the page and its committed bytes.
    pub fn take_for_slab(&mut self, ctx: &Ctx, n: usize) -> Option<(*mut Page, usize)> {
        let p = self.take(ctx, n, 1)?;
        let bytes = self.span_committed(p);
        self.counts.committed -= bytes;
        Some((p, bytes))
    }

    /// Returns a slab page's span; its committed pages join this pool's
    /// accounting (as retained).
    pub fn give_back_slab(&mut self, p: *mut Page, now: u64) -> usize {
        let bytes = self.span_committed(p);
        self.add_committed(bytes);
        self.give_back(p, now);
        bytes
    }

    fn span_committed(&self, p: *mut Page) -> usize {
        let seg = seg_of(p);
        let idx = seg.index_of(p);
        // SAFETY: `p` is a span's first descriptor.
        let n = unsafe { (*p).slice_count } as usize;
        seg.count_committed(idx * OS_PAGES_PER_SLICE, n * OS_PAGES_PER_SLICE) * OS_PAGE
    }

    /// Returns a used span to the pool, coalescing with free neighbours.
    pub fn give_back(&mut self, p: *mut Page, now: u64) {
        let seg = seg_of(p);
        let mut idx = seg.index_of(p);
        // SAFETY: `p` is a used span's first descriptor.
        let mut n = unsafe { (*p).slice_count } as usize;
        seg.slices[idx].kind = Kind::Free;
        let end = idx + n;
        if end < SLICES_PER_SEGMENT && seg.slices[end].kind == Kind::Free {
            let next: *mut Page = &mut seg.slices[end];
            // SAFETY: the slice after a span always starts a span.
            n += unsafe { (*next).slice_count } as usize;
            self.remove(next);
        }
        if idx > HEADER_SLICES {
            let before = idx - 1;
            let first = before - seg.slices[before].slice_offset as usize;
            if seg.slices[first].kind == Kind::Free && first >= HEADER_SLICES {
                let prev: *mut Page = &mut seg.slices[first];
                self.remove(prev);
                n += idx - first;
                idx = first;
            }
        }
        let f: *mut Page = &mut seg.slices[idx];
        self.insert(f, n, now);
    }

    /// Grows a used large span in place by `extra` slices if the span after
    /// it is free and big enough.
    pub fn grow_in_place(&mut self, p: *mut Page, extra: usize) -> bool {
        let seg = seg_of(p);
        let idx = seg.index_of(p);
        // SAFETY: `p` is a used span's first descriptor.
        let n = unsafe { (*p).slice_count } as usize;
        let end = idx + n;
        if end >= SLICES_PER_SEGMENT || seg.slices[end].kind != Kind::Free {
            return false;
        }
        let next: *mut Page = &mut seg.slices[end];
        // SAFETY: the slice after a span starts a span.
        let (m, freed_at) = unsafe { ((*next).slice_count as usize, (*next).freed_at) };
        if m < extra {
            return false;
        }
        self.remove(next);
        if m > extra {
            let t: *mut Page = &mut seg.slices[end + extra];
            self.insert(t, m - extra, freed_at);
        }
        for i in n..n + extra {
            seg.slices[idx + i].slice_offset = i as u32;
        }
        // SAFETY: as above.
        unsafe { (*p).slice_count = (n + extra) as u32 };
        true
    }

    /// Shrinks a used large span to `keep` slices, returning the tail.
    pub fn shrink_in_place(&mut self, p: *mut Page, keep: usize, now: u64) {
        let seg = seg_of(p);
        let idx = seg.index_of(p);
        // SAFETY: `p` is a used span's first descriptor.
        let n = unsafe { (*p).slice_count } as usize;
        if keep >= n {
            return;
        }
        // SAFETY: as above.
        unsafe { (*p).slice_count = keep as u32 };
        let t: *mut Page = &mut seg.slices[idx + keep];
        // SAFETY: `t` becomes the first descriptor of the tail span.
        unsafe { (*t).slice_count = (n - keep) as u32 };
        self.give_back(t, now);
    }

    fn new_segment(&mut self, ctx: &Ctx) -> Option<()> {
        let base =
            ctx.reservations
                .lock()
                .take(ctx.source, 1, SEGMENT, ctx.config.reservation_bytes)?;
        // SAFETY: the reservation layer handed us this segment exclusively;
        // it is fresh (zero) or its header was zeroed when it was released.
        let seg = unsafe { &mut *Segment::init(base, 1, ctx.heap, false) };
        seg.next = self.segments;
        if !self.segments.is_null() {
            // SAFETY: list head is a live segment of this heap.
            unsafe { (*self.segments).prev = seg };
        }
        self.segments = seg;
        self.counts.segments += 1;
        self.counts.metadata += HEADER_PAGES * OS_PAGE;
        let f: *mut Page = &mut seg.slices[HEADER_SLICES];
        self.insert(f, SPAN_SLICES, 0);
        Some(())
    }

    // ----- purging -----------------------------------------------------------

    fn purge_span(&mut self, ctx: &Ctx, f: *mut Page) {
        let seg = seg_of(f);
        let idx = seg.index_of(f);
        // SAFETY: `f` is a free span on the FIFO.
        let n = unsafe { (*f).slice_count } as usize;
        let dirty = seg.count_committed(idx * OS_PAGES_PER_SLICE, n * OS_PAGES_PER_SLICE);
        self.counts.retained -= dirty * OS_PAGE;
        self.dirty_unlink(f);
        let base = seg.base();
        let mut failed = false;
        let cleared = seg.drain_committed(
            idx * OS_PAGES_PER_SLICE,
            n * OS_PAGES_PER_SLICE,
            |first, count| {
                let addr = base + first * OS_PAGE;
                // SAFETY: the run is inside a free span (no live data), page-aligned,
                // in a mapped segment of this source.
                let ok = unsafe {
                    ctx.source.purge(
                        NonNull::new_unchecked(addr as *mut u8),
                        count * OS_PAGE,
                        ctx.config.purge,
                    )
                };
                failed |= !ok;
                ok
            },
        );
        self.counts.committed -= cleared * OS_PAGE;
        self.counts.purged += cleared * OS_PAGE;
        if failed {
            self.counts.purge_failures += 1;
            let left = dirty - cleared;
            self.counts.retained += left * OS_PAGE;
            self.dirty_push(f);
        }
    }

    /// Purges retained spans whose decay delay has passed (all of them if
    /// `force`), then the oldest ones while retention exceeds the cap.
    /// Returns the time of the next deadline, if anything is still retained.
    pub fn decay(&mut self, ctx: &Ctx, now: u64, force: bool) -> Option<u64> {
        let delay = ctx.config.decay_ms;
        while !self.dirty_head.is_null() {
            let f = self.dirty_head;
            // SAFETY: FIFO entries are free span descriptors.
            let expired = force || unsafe { (*f).freed_at } + delay <= now;
            if !expired && self.counts.retained <= ctx.config.retain_max_bytes {
                break;
            }
            let before = self.counts.retained;
            self.purge_span(ctx, f);
            if self.counts.retained >= before && self.dirty_head == f {
                break; // purge failed; do not spin
            }
        }
        self.decay_huge(ctx, now, force);
        let mut next = None;
        if !self.dirty_head.is_null() {
            // SAFETY: as above.
            next = Some(unsafe { (*self.dirty_head).freed_at } + delay);
        }
        let mut h = self.huge_cache;
        while !h.is_null() {
            // SAFETY: cache entries are huge segment headers of this heap.
            unsafe {
                if (*h).huge_dirty {
                    let d = (*h).huge_freed_at + delay;
                    next = Some(next.map_or(d, |n: u64| n.min(d)));
                }
                h = (*h).next;
            }
        }
        next
    }

    /// Releases wholly free segments and purged huge runs to the reservation
    /// layer and unmaps reservations left unused. Call after `decay(force)`.
    pub fn release_empty(&mut self, ctx: &Ctx) {
        let mut seg = self.segments;
        while !seg.is_null() {
            // SAFETY: list entries are live segments of this heap.
            let s = unsafe { &mut *seg };
            let next = s.next;
            if s.free_slices == SPAN_SLICES
                && s.count_committed(
                    HEADER_PAGES,
                    crate::layout::OS_PAGES_PER_SEGMENT - HEADER_PAGES,
                ) == 0
            {
                let f: *mut Page = &mut s.slices[HEADER_SLICES];
                self.remove(f);
                self.unlink_segment(seg);
                self.release_run(ctx, s.base(), 1);
            }
            seg = next;
        }
        let mut h = self.huge_cache;
        while !h.is_null() {
            // SAFETY: cache entries are huge segment headers of this heap.
            let s = unsafe { &mut *h };
            let next = s.next;
            if !s.huge_dirty {
                self.unlink_huge(h);
                self.release_run(ctx, s.base(), s.nsegs);
            }
            h = next;
        }
        ctx.reservations.lock().unmap_unused(ctx.source);
    }

    fn release_run(&mut self, ctx: &Ctx, base: usize, nsegs: usize) {
        // The header pages are the only committed ones left: give them back too.
        // SAFETY: the run is wholly free; its header is metadata we drop now.
        let ok = unsafe {
            ctx.source.purge(
                NonNull::new_unchecked(base as *mut u8),
                HEADER_PAGES * OS_PAGE,
                crate::source::Purge::DontNeed,
            )
        };
        if !ok {
            // Zero by hand so a reused segment still starts clean.
            // SAFETY: as above; the header is ours to overwrite.
            unsafe { core::ptr::write_bytes(base as *mut u8, 0, HEADER_PAGES * OS_PAGE) };
        }
        self.counts.metadata -= HEADER_PAGES * OS_PAGE;
        self.counts.segments -= 1;
        ctx.reservations.lock().give_back(base, nsegs);
    }

    fn unlink_segment(&mut self, seg: *mut Segment) {
        // SAFETY: `seg` is on the segment list.
        unsafe {
            if (*seg).prev.is_null() {
                self.segments = (*seg).next;
            } else {
                (*(*seg).prev).next = (*seg).next;
            }
            if !(*seg).next.is_null() {
                (*(*seg).next).prev = (*seg).prev;
            }
        }
    }

    // ----- huge objects ------------------------------------------------------

    /// Allocates a huge object: reuses the smallest cached run that fits
    /// (lowest address on ties), else takes a new run of segments.
    pub fn take_huge(&mut self, ctx: &Ctx, size: usize, align: usize, now: u64) -> Option<usize> {
        let offset = align.max(HEADER_SLICES * SLICE);
        let usable = align_up(size, OS_PAGE);
        let need = offset + usable;
        let mut best: *mut Segment = null_mut();
        let mut h = self.huge_cache;
        while !h.is_null() {
            // SAFETY: cache entries are huge segment headers of this heap.
            let s = unsafe { &*h };
            let cap = s.nsegs * SEGMENT;
            let fits =
                cap >= need && cap <= 2 * need && (align <= SEGMENT || s.base() % align == 0);
            if fits {
                // SAFETY: as above.
                let better = best.is_null()
                    || cap < unsafe { (*best).nsegs } * SEGMENT
                    || (cap == unsafe { (*best).nsegs } * SEGMENT && h < best);
                if better {
                    best = h;
                }
            }
            h = s.next;
        }
        let seg = if !best.is_null() {
            self.unlink_huge(best);
            // SAFETY: `best` is a cached huge header we now own again.
            let s = unsafe { &mut *best };
            if s.huge_dirty {
                self.counts.retained -= s.huge_size_committed();
            }
            s
        } else {
            let nsegs = need.div_ceil(SEGMENT);
            let base = ctx.reservations.lock().take(
                ctx.source,
                nsegs,
                align.max(SEGMENT),
                ctx.config.reservation_bytes,
            )?;
            // SAFETY: the run is ours; it is fresh or was purged and its header zeroed.
            let s = unsafe { &mut *Segment::init(base, nsegs, ctx.heap, true) };
            self.counts.segments += 1;
            self.counts.metadata += HEADER_PAGES * OS_PAGE;
            s
        };
        let _ = now;
        // Committed: whatever the object spans, beyond what was already dirty.
        let before = seg.huge_size_committed();
        seg.huge_offset = offset;
        seg.huge_size = usable;
        seg.huge_requested = size;
        let after = before.max(usable);
        seg.huge_dirty = true;
        seg.huge_committed_bytes(after);
        self.add_committed(after - before);
        self.counts.huge_count += 1;
        self.counts.huge_bytes += usable;
        self.counts.huge_requested += size;
        Some(seg.base() + offset)
    }

    /// Frees a huge object into the cache (retained, purged after the delay).
    pub fn give_back_huge(&mut self, seg: *mut Segment, now: u64) {
        // SAFETY: `seg` is a huge header of this heap holding a live object.
        let s = unsafe { &mut *seg };
        self.counts.huge_count -= 1;
        self.counts.huge_bytes -= s.huge_size;
        self.counts.huge_requested -= s.huge_requested;
        s.huge_size = 0;
        s.huge_freed_at = now;
        self.counts.retained += s.huge_size_committed();
        s.prev = null_mut();
        s.next = self.huge_cache;
        if !self.huge_cache.is_null() {
            // SAFETY: cache head is a huge header of this heap.
            unsafe { (*self.huge_cache).prev = s };
        }
        self.huge_cache = s;
    }

    fn unlink_huge(&mut self, seg: *mut Segment) {
        // SAFETY: `seg` is in the huge cache.
        unsafe {
            if (*seg).prev.is_null() {
                self.huge_cache = (*seg).next;
            } else {
                (*(*seg).prev).next = (*seg).next;
            }
            if !(*seg).next.is_null() {
                (*(*seg).next).prev = (*seg).prev;
            }
            (*seg).next = null_mut();
            (*seg).prev = null_mut();
        }
    }

    fn decay_huge(&mut self, ctx: &Ctx, now: u64, force: bool) {
        let delay = ctx.config.decay_ms;
        let mut h = self.huge_cache;
        while !h.is_null() {
            // SAFETY: cache entries are huge headers of this heap.
            let s = unsafe { &mut *h };
            let over_cap = self.counts.retained > ctx.config.retain_max_bytes;
            if s.huge_dirty && (force || over_cap || s.huge_freed_at + delay <= now) {
                let bytes = s.huge_size_committed();
                let addr = s.base() + s.huge_offset;
                // SAFETY: the cached object is dead; the range is page-aligned and mapped.
                let ok = unsafe {
                    ctx.source.purge(
                        NonNull::new_unchecked(addr as *mut u8),
                        bytes,
                        ctx.config.purge,
                    )
                };
                if ok {
                    s.huge_dirty = false;
                    s.huge_committed_bytes(0);
                    self.counts.retained -= bytes;
                    self.counts.committed -= bytes;
                    self.counts.purged += bytes;
                } else {
                    self.counts.purge_failures += 1;
                }
            }
            h = s.next;
        }
    }

    /// Committed bytes currently retained (free spans and cached huge runs).
    pub fn retained(&self) -> usize {
        self.counts.retained
    }

    /// Unmaps nothing, but forgets every segment (the owner unmaps its
    /// reservations wholesale). Used by `Heap` drop.
    pub fn forget_all(&mut self) {
        *self = Spans::new();
    }
}

impl Default for Spans {
    fn default() -> Self {
        Self::new()
    }
}

impl Segment {
    /// Committed bytes of a huge object's run (beyond the header).
    fn huge_size_committed(&self) -> usize {
        // Stored in the (otherwise unused) first span descriptor.
        self.slices[HEADER_SLICES].large_size
    }
    fn huge_committed_bytes(&mut self, bytes: usize) {
        self.slices[HEADER_SLICES].large_size = bytes;
    }
}
