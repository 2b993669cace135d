//! The span pool of one heap: free runs of slices, best fit, lowest address
//! first, coalesced on free; plus the retention FIFO that decides when
//! retained pages are purged, and the cache of freed huge objects.
//!
//! Everything here runs under the heap's span lock: the owner takes it on
//! slow paths (new slab page, large objects), other threads to free large
//! objects, and the background purger to purge expired spans.

//! The files of this folder: `mod.rs` (free-span bins, taking and
//! returning spans, coalescing), `retention.rs` (the retention FIFO and
//! the decay), `huge.rs` (the huge-object cache), `segments.rs` (taking
//! and releasing segments), `regions.rs` (2 MiB regions: placement
//! fullest first, and which get huge pages).

mod huge;
mod regions;
mod retention;
mod segments;

use crate::memory::budget::Budget;
use crate::memory::layout::{
    align_up, os_page, os_page_shift, os_pages_per_segment, os_pages_per_slice, SEGMENT, SLICE,
    SLICES_PER_SEGMENT,
};
use crate::memory::page::{Kind, Page};
use crate::memory::reservation::Reservations;
use crate::memory::segment::{header_bytes, header_pages, Segment, HEADER_SLICES};
use crate::options::LiveConfig;
use crate::os::source::PageSource;
use crate::sync::lock::Locked;
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
    /// The heap's settings (read where used: a span operation reads one or
    /// two of them, not a copy of all).
    pub(crate) config: &'a LiveConfig,
    /// The retention budget the heap shares (the process's, or its own).
    pub budget: &'a Budget,
}

/// Why a span pool purged retained pages: indexes [`SpanCounts::purged_by`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Why {
    /// The decay: expired, and retention above what demand keeps for
    /// expired spans.
    Decay = 0,
    /// The retention budget: retention above what demand keeps for young
    /// spans (or `retain_max_bytes`).
    Budget,
    /// Another heap committed fresh memory (`heaps::reclaim_elsewhere`).
    Reclaim,
    /// `trim()`.
    Trim,
    /// The hard limit refused a charge.
    Limit,
    /// A cached huge run reused by a smaller object, or at another offset.
    Reuse,
}

/// How many [`Why`]s there are.
pub const WHYS: usize = 6;

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
    /// `purged` by cause, indexed by [`Why`]; sums to `purged`.
    pub purged_by: [usize; WHYS],
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
    /// The large object's span freed last, kept in its bin but not merged
    /// with its free neighbours, so that an allocation of the same size
    /// takes it back whole: no split, no merge, its descriptors already
    /// right (an allocate/free turnover at 1 MiB). Merged as soon as another
    /// large span is freed, the pool needs room, or segments are released.
    recent: *mut Page,
    /// Retained bytes as last added to the budget.
    published_retained: usize,
    /// The heap's committed bytes (span pool and slab pages) as last added
    /// to the budget.
    pub published_committed: usize,
    /// When the budget's demand history moves to its next slot: until
    /// then, a span operation that published nothing need not note the
    /// demand again (`HeapCore::publish_coarsely`).
    pub next_note_at: u64,
    /// When the heap last took a span for a slab page: until a decay
    /// delay later it is growing, and the free part of a huge page it is
    /// filling waits (`regions.rs`).
    pub slab_taken_at: u64,
    /// Set when a span operation failed because the hard limit refused a
    /// charge (a new segment's header, a large span's pages, a huge run):
    /// the heap then purges and tries once more.
    pub over_limit: bool,
    /// Byte counts.
    pub counts: SpanCounts,
}

// SAFETY: raw pointers into segments the heap owns; access is serialised by
// the lock around `Spans`.
unsafe impl Send for Spans {}

fn seg_of(page: *const Page) -> &'static Segment {
    // SAFETY: descriptors live inside their segment's header, so masking the
    // descriptor address finds the header, mapped while the span exists.
    // Only shared references to headers are made; mutable state in them is
    // in cells or atomics.
    unsafe { &*Segment::of(crate::memory::layout::segment_base(page as usize)) }
}

/// Slice count of the span whose first descriptor is `p`.
fn count_of(p: *mut Page) -> usize {
    // SAFETY: `p` is a span's first descriptor; the span lock is held.
    unsafe { (*p).slice_count as usize }
}

impl Spans {
    /// An empty pool behind its lock: the only way to get a pool outside
    /// this module, so a `&mut Spans` (what [`Page::set_kind`] asks for) is
    /// proof that the lock is held.
    pub const fn locked() -> Locked<Spans> {
        Locked::new(Spans::new())
    }

    /// A pool outside any lock, for the unit tests of other modules.
    #[cfg(test)]
    pub(crate) const fn unlocked_for_tests() -> Spans {
        Spans::new()
    }

    /// An empty pool.
    const fn new() -> Self {
        Spans {
            bins: [null_mut(); BINS],
            nonempty: [0; BINS / 64],
            dirty_head: null_mut(),
            dirty_tail: null_mut(),
            segments: null_mut(),
            huge_cache: null_mut(),
            recent: null_mut(),
            published_retained: 0,
            published_committed: 0,
            over_limit: false,
            next_note_at: 0,
            slab_taken_at: 0,
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
                purged_by: [0; WHYS],
                purge_failures: 0,
            },
        }
    }

    /// Counts `bytes` purged for `why`.
    fn count_purged(&mut self, why: Why, bytes: usize) {
        self.counts.purged += bytes;
        self.counts.purged_by[why as usize] += bytes;
    }

    fn add_committed(&mut self, bytes: usize) {
        self.counts.committed += bytes;
        self.counts.peak_committed = self.counts.peak_committed.max(self.counts.committed);
    }

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

    /// Committed OS pages in the span of `n` slices starting at descriptor `f`.
    fn committed_pages(f: *mut Page, n: usize) -> usize {
        let seg = seg_of(f);
        let idx = seg.index_of(f);
        seg.count_committed(idx * os_pages_per_slice(), n * os_pages_per_slice())
    }

    /// Links a free span of `n` slices holding `dirty` committed OS pages
    /// into its bin (address order) and, if `dirty > 0`, at the tail of the
    /// retention FIFO.
    fn insert(&mut self, f: *mut Page, n: usize, freed_at: u64, dirty: usize) {
        debug_assert_eq!(dirty, Self::committed_pages(f, n));
        let seg = seg_of(f);
        let idx = seg.index_of(f);
        // SAFETY: `f` and the span's last descriptor belong to this segment;
        // the span lock is held, so no one else touches free spans.
        unsafe {
            (*f).set_kind(Kind::Free, self);
            (*f).slice_count = n as u32;
            (*f).slice_offset = 0;
            (*f).start = seg.slice_addr(idx);
            (*f).freed_at = freed_at;
            (*f).in_dirty = false;
            (*f).dirty_pages = dirty as u32;
            let last = seg.page(idx + n - 1);
            (*last).slice_offset = (n - 1) as u32;
            (*last).slice_count = n as u32;
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
            (*seg.links()).free_slices += n;
        }
        regions::count_free(seg, idx, n, true);
        self.nonempty[n / 64] |= 1 << (n % 64);
        if dirty > 0 {
            self.counts.retained += dirty * os_page();
            self.dirty_push(f);
        }
    }

    /// Unlinks a free span; returns its committed OS pages.
    fn remove(&mut self, f: *mut Page) -> usize {
        if f == self.recent {
            self.recent = null_mut();
        }
        let n = count_of(f);
        // SAFETY: a free span descriptor (lock held).
        let dirty = unsafe { (*f).dirty_pages } as usize;
        if self.is_dirty(f) {
            self.counts.retained -= dirty * os_page();
            self.dirty_unlink(f);
        }
        // SAFETY: `f` is a linked free span of this pool (lock held).
        unsafe {
            if (*f).prev.is_null() {
                self.bins[n] = (*f).next;
            } else {
                (*(*f).prev).next = (*f).next;
            }
            if !(*f).next.is_null() {
                (*(*f).next).prev = (*f).prev;
            }
            (*seg_of(f).links()).free_slices -= n;
        }
        let seg = seg_of(f);
        regions::count_free(seg, seg.index_of(f), n, false);
        if self.bins[n].is_null() {
            self.nonempty[n / 64] &= !(1 << (n % 64));
        }
        dirty
    }

    /// Takes a span of `n` slices for a large object, its start aligned to
    /// `align_slices` slices (1 for no alignment): best fit, lowest
    /// address; see [`Spans::take`].
    pub fn take_large(
        &mut self,
        ctx: &Ctx,
        n: usize,
        align_slices: usize,
    ) -> Option<(*mut Page, usize)> {
        self.take(ctx, n, align_slices, Kind::Large)
    }

    /// [`Spans::take_large`] (unaligned) only if the span it would take has
    /// all its OS pages committed; else None, and the pool is as it was (no
    /// segment mapped, no span split). What an allocation of another heap
    /// takes rather than commit fresh memory while this pool's sits unused
    /// (`HeapCore::alloc_large_resident`).
    pub fn take_large_resident(&mut self, ctx: &Ctx, n: usize) -> Option<(*mut Page, usize)> {
        let full = n * os_pages_per_slice();
        // The span `take_free` would pick: the recent span if it has the
        // size, else the best placed in the first bin that fits.
        let candidate = if !self.recent.is_null() && count_of(self.recent) == n {
            self.recent
        } else {
            let bin = self.first_bin_at_least(n)?;
            self.best_placed(bin, n)
        };
        if Self::committed_pages(candidate, n) != full {
            return None;
        }
        let (p, dirty) = self.take_large(ctx, n, 1)?;
        debug_assert_eq!(dirty, full);
        Some((p, dirty))
    }

    /// Takes a span of `n` slices whose start is aligned to `align_slices`
    /// slices (1 for no alignment): best fit, lowest address. Maps a new
    /// segment if no free span fits. Every descriptor of the span points
    /// back to its first, and the span is `kind` before the lock is let go
    /// (a span out of the pool but still marked free would be merged by the
    /// next neighbour freed). Committed bits are the caller's business.
    /// Returns the span and how many of its OS pages are committed.
    fn take(
        &mut self,
        ctx: &Ctx,
        n: usize,
        align_slices: usize,
        kind: Kind,
    ) -> Option<(*mut Page, usize)> {
        debug_assert!(n >= 1 && n + align_slices - 1 <= SPAN_SLICES);
        debug_assert!(kind == Kind::Slab || kind == Kind::Large);
        // Slab pages fill the fullest 2 MiB region first when regions may
        // become huge pages (else: today's best fit, lowest address).
        let fullest = kind == Kind::Slab
            && crate::memory::huge_pages::Policy::of(ctx.config.thp(), ctx.source).on();
        let (p, dirty) = self.take_free(ctx, n, align_slices, fullest)?;
        // SAFETY: a span just carved out of the pool, ours under the lock.
        let start = unsafe {
            (*p).set_kind(kind, self);
            (*p).start
        };
        // What the profiler remembered of a sampled block here is over.
        crate::profile::recent::reused(start, start + n * SLICE);
        Some((p, dirty))
    }

    /// The part of [`Spans::take`] that finds and carves the span.
    fn take_free(
        &mut self,
        ctx: &Ctx,
        n: usize,
        align_slices: usize,
        fullest: bool,
    ) -> Option<(*mut Page, usize)> {
        if align_slices == 1 && !self.recent.is_null() && count_of(self.recent) == n {
            let p = self.recent;
            let dirty = self.remove(p);
            // SAFETY: the span was a used span of `n` slices when freed and
            // has not changed shape since (any change goes through `remove`,
            // which forgets it), so its descriptors still point back to its
            // first; ours under the lock.
            unsafe { (*p).heap = ctx.heap };
            return Some((p, dirty));
        }
        let want = n + align_slices - 1;
        let bin = match self.first_bin_at_least(want) {
            Some(b) => b,
            None => {
                // Merging the recent span may make room.
                self.settle_recent();
                match self.first_bin_at_least(want) {
                    Some(b) => b,
                    None => {
                        self.new_segment(ctx)?;
                        self.first_bin_at_least(want)?
                    }
                }
            }
        };
        let f = if align_slices == 1 && fullest {
            self.fullest_region_placed(bin, n)
        } else if align_slices == 1 {
            self.best_placed(bin, n)
        } else {
            self.bins[bin]
        };
        // SAFETY: a non-empty bin's head is a free span descriptor.
        let freed_at = unsafe { (*f).freed_at };
        let size = count_of(f);
        let dirty = self.remove(f);
        let seg = seg_of(f);
        let idx = seg.index_of(f);
        let lead = (align_slices - (idx % align_slices)) % align_slices;
        let start = idx + lead;
        // Count only the parts cut off the front and the part taken; the
        // tail's count follows from the span's.
        let (lead_dirty, taken_dirty) = if dirty == 0 {
            (0, 0)
        } else {
            (
                Self::committed_pages(f, lead),
                Self::committed_pages(seg.page(start), n),
            )
        };
        if lead > 0 {
            self.insert(f, lead, freed_at, lead_dirty);
        }
        let tail = size - lead - n;
        if tail > 0 {
            self.insert(
                seg.page(start + n),
                tail,
                freed_at,
                dirty - lead_dirty - taken_dirty,
            );
        }
        let p = seg.page(start);
        // SAFETY: the descriptors of the span just carved, ours under the lock.
        unsafe {
            for i in 0..n {
                (*seg.page(start + i)).slice_offset = i as u32;
            }
            (*p).slice_count = n as u32;
            (*p).start = seg.slice_addr(start);
            (*p).heap = ctx.heap;
        }
        Some((p, taken_dirty))
    }

    /// The free span a request of `n` slices goes to, `bin` being the
    /// smallest non-empty bin that fits: of the first few candidates in
    /// size order (then address order), the one whose committed pages cover
    /// most of the request, so that a new object lands on memory already
    /// resident (no page faults, no growth of RSS) rather than on purged
    /// pages while retained ones wait next door; the best fit on ties.
    fn best_placed(&self, bin: usize, n: usize) -> *mut Page {
        const CANDIDATES: usize = 16;
        let want = n * os_pages_per_slice();
        let mut best = self.bins[bin];
        // SAFETY: free span descriptors of this pool (lock held).
        let mut best_cover = unsafe { (*best).dirty_pages } as usize;
        if best_cover >= want {
            return best;
        }
        let mut seen = 0;
        let mut b = Some(bin);
        while let Some(i) = b {
            let mut f = self.bins[i];
            while !f.is_null() && seen < CANDIDATES {
                // SAFETY: as above.
                let cover = (unsafe { (*f).dirty_pages } as usize).min(want);
                if cover > best_cover {
                    best = f;
                    best_cover = cover;
                    if cover == want {
                        return best;
                    }
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

    /// Marks all OS pages of a used span committed (large objects, whose
    /// use pagewise cannot see).
    /// Returns how many OS pages were not committed before.
    pub fn commit_whole(&mut self, p: *mut Page) -> usize {
        self.commit_whole_of(p, usize::MAX)
    }

    /// [`Spans::commit_whole`] for a span just taken with `dirty` of its OS
    /// pages committed (what `take_large` returns): a span that is all
    /// committed already (a large object freed and taken again, the common
    /// case of a program that reuses its buffers) needs no bitmap walk.
    #[inline]
    pub fn commit_whole_of(&mut self, p: *mut Page, dirty: usize) -> usize {
        if dirty == count_of(p) * os_pages_per_slice() {
            debug_assert_eq!(Self::committed_pages(p, count_of(p)), dirty);
            return 0;
        }
        let seg = seg_of(p);
        let idx = seg.index_of(p);
        let n = count_of(p);
        let newly = seg.set_committed(idx * os_pages_per_slice(), n * os_pages_per_slice());
        self.add_committed(newly * os_page());
        newly
    }

    /// Marks committed the OS pages of `p` (a span just taken with `dirty`
    /// of them committed) that its first `bytes` bytes use, leaving the
    /// others as they are: a sampled small object alone on a span
    /// (`HeapCore::alloc_span_sampled`). Returns how many were not.
    pub fn commit_prefix_of(&mut self, p: *mut Page, bytes: usize, dirty: usize) -> usize {
        if dirty == count_of(p) * os_pages_per_slice() {
            return 0;
        }
        let seg = seg_of(p);
        let first = seg.index_of(p) * os_pages_per_slice();
        let newly = seg.set_committed(first, bytes.max(1).div_ceil(os_page()));
        self.add_committed(newly * os_page());
        newly
    }

    /// Returns a large object's span whose OS pages may not all be
    /// committed (one from [`Spans::commit_prefix_of`]): they are counted
    /// by the bitmap, as a slab page's are.
    pub fn give_back_partly_committed(&mut self, p: *mut Page, now: u64) {
        let dirty = Self::committed_pages(p, count_of(p));
        self.give_back(p, now, dirty);
    }

    /// Bytes of the used span `p` that are not committed, `dirty` of its
    /// OS pages being committed (what [`Spans::commit_whole_of`] would
    /// commit).
    pub fn uncommitted_bytes(&self, p: *mut Page, dirty: usize) -> usize {
        debug_assert_eq!(Self::committed_pages(p, count_of(p)), dirty);
        (count_of(p) * os_pages_per_slice() - dirty) * os_page()
    }

    /// Bytes of the first `bytes` of the used span `p` that are not
    /// committed (what [`Spans::commit_prefix_of`] would commit).
    pub fn uncommitted_prefix_bytes(&self, p: *mut Page, bytes: usize) -> usize {
        let seg = seg_of(p);
        let first = seg.index_of(p) * os_pages_per_slice();
        let n = bytes.max(1).div_ceil(os_page());
        (n - seg.count_committed(first, n)) * os_page()
    }

    /// Committed OS pages of the used span `p`.
    pub fn committed_pages_of(&self, p: *mut Page) -> usize {
        Self::committed_pages(p, count_of(p))
    }

    /// Puts back a span just taken with `take_large` (`dirty` of its OS
    /// pages committed) that will not be used: the hard limit refused what
    /// committing the rest would cost.
    pub fn untake_large(&mut self, p: *mut Page, dirty: usize, now: u64) {
        self.give_back(p, now, dirty);
    }

    /// Takes a span for a slab page of a heap holding `slab_bytes` of
    /// slab pages. Its committed pages (if it was retained dirty) leave
    /// this pool's accounting: the caller counts them. A region the page
    /// starts may get a huge page, committed whole (`regions.rs`): the
    /// page's part of it is counted with the page's.
    /// Returns the page, its committed bytes, and the bytes a huge page
    /// committed fresh (the page's part and the free rest of the region).
    pub fn take_for_slab(
        &mut self,
        ctx: &Ctx,
        n: usize,
        slab_bytes: usize,
        now: u64,
    ) -> Option<(*mut Page, usize, usize)> {
        let (p, dirty) = self.take(ctx, n, 1, Kind::Slab)?;
        let bytes = dirty * os_page();
        self.counts.committed -= bytes;
        self.slab_taken_at = now;
        let (own, fresh) = self.back_slab_regions(ctx, p, slab_bytes, now);
        Some((p, bytes + own, fresh))
    }

    /// Returns a slab page's span; its committed pages join this pool's
    /// accounting (as retained).
    pub fn give_back_slab(&mut self, p: *mut Page, now: u64) -> usize {
        let dirty = Self::committed_pages(p, count_of(p));
        self.add_committed(dirty * os_page());
        self.give_back(p, now, dirty);
        dirty * os_page()
    }

    /// Returns a large object's span (all of whose pages are committed).
    /// It becomes the recent span (see [`Spans::recent`]); the previous one
    /// is merged with its neighbours. Every descriptor of the span must
    /// point back to its first (a span as `take` or `grow_in_place` left it).
    pub fn give_back_large(&mut self, p: *mut Page, now: u64) {
        let n = count_of(p);
        let dirty = n * os_pages_per_slice();
        debug_assert_eq!(dirty, Self::committed_pages(p, n));
        self.settle_recent();
        self.insert(p, n, now, dirty);
        self.recent = p;
    }

    /// Merges the recent span with its free neighbours, as every other
    /// freed span is at once.
    fn settle_recent(&mut self) {
        let r = self.recent;
        if r.is_null() {
            return;
        }
        // SAFETY: the recent span is a linked free span (lock held).
        let freed_at = unsafe { (*r).freed_at };
        let dirty = self.remove(r);
        self.give_back(r, freed_at, dirty);
    }

    /// Returns a used span holding `dirty` committed OS pages to the pool,
    /// coalescing with free neighbours.
    fn give_back(&mut self, p: *mut Page, now: u64, mut dirty: usize) {
        let seg = seg_of(p);
        let mut idx = seg.index_of(p);
        let mut n = count_of(p);
        // SAFETY: descriptors of this segment; the lock serialises span
        // changes, and the slice after a span always starts a span.
        // Loops: next to the recent span (kept unmerged) a free neighbour
        // may have a free neighbour of its own.
        unsafe {
            (*p).set_kind(Kind::Free, self);
            while idx + n < SLICES_PER_SEGMENT && (*seg.page(idx + n)).kind() == Kind::Free {
                let next = seg.page(idx + n);
                n += count_of(next);
                dirty += self.remove(next);
            }
            while idx > HEADER_SLICES {
                let before = idx - 1;
                let first = before - (*seg.page(before)).slice_offset as usize;
                if first < HEADER_SLICES || (*seg.page(first)).kind() != Kind::Free {
                    break;
                }
                dirty += self.remove(seg.page(first));
                n += idx - first;
                idx = first;
            }
        }
        self.insert(seg.page(idx), n, now, dirty);
    }

    /// Grows a used large span in place by `extra` slices if the span after
    /// it is free and big enough.
    pub fn grow_in_place(&mut self, p: *mut Page, extra: usize) -> bool {
        let seg = seg_of(p);
        let idx = seg.index_of(p);
        let n = count_of(p);
        let end = idx + n;
        // SAFETY: descriptors of this segment, under the lock.
        unsafe {
            if end >= SLICES_PER_SEGMENT || (*seg.page(end)).kind() != Kind::Free {
                return false;
            }
            let next = seg.page(end);
            let (m, freed_at) = (count_of(next), (*next).freed_at);
            if m < extra {
                return false;
            }
            let dirty = self.remove(next);
            if m > extra {
                let taken = if dirty == 0 {
                    0
                } else {
                    Self::committed_pages(next, extra)
                };
                self.insert(seg.page(end + extra), m - extra, freed_at, dirty - taken);
            }
            for i in n..n + extra {
                (*seg.page(idx + i)).slice_offset = i as u32;
            }
            (*p).slice_count = (n + extra) as u32;
            let end = (*p).start + n * SLICE;
            crate::profile::recent::reused(end, end + extra * SLICE);
        }
        true
    }

    /// Undoes a [`Spans::grow_in_place`] of `p` from `keep` slices whose
    /// new pages were not committed (the hard limit refused them): the tail
    /// goes back with the committed pages it has.
    pub fn ungrow_in_place(&mut self, p: *mut Page, keep: usize, now: u64) {
        let seg = seg_of(p);
        let idx = seg.index_of(p);
        let n = count_of(p);
        debug_assert!(keep < n);
        let t = seg.page(idx + keep);
        // SAFETY: as in `shrink_in_place`.
        unsafe {
            (*p).slice_count = keep as u32;
            (*t).slice_count = (n - keep) as u32;
        }
        let dirty = Self::committed_pages(t, n - keep);
        self.give_back(t, now, dirty);
    }

    /// Shrinks a used large span to `keep` slices, returning the tail.
    pub fn shrink_in_place(&mut self, p: *mut Page, keep: usize, now: u64) {
        let seg = seg_of(p);
        let idx = seg.index_of(p);
        let n = count_of(p);
        if keep >= n {
            return;
        }
        let t = seg.page(idx + keep);
        // SAFETY: descriptors of this segment, under the lock; `t` becomes
        // the first descriptor of the tail span.
        unsafe {
            (*p).slice_count = keep as u32;
            (*t).slice_count = (n - keep) as u32;
        }
        // A large object's pages are all committed. Merged at once, not
        // kept as the recent span: its descriptors point back to `p`.
        self.give_back(t, now, (n - keep) * os_pages_per_slice());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::source::FakePages;

    /// The free spans in the bins, as (first slice index, slices).
    pub(super) fn free_spans(spans: &Spans) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for &head in spans.bins.iter() {
            let mut f = head;
            while !f.is_null() {
                out.push((seg_of(f).index_of(f), count_of(f)));
                // SAFETY: a linked free span (test owns the pool).
                f = unsafe { (*f).next };
            }
        }
        out.sort();
        out
    }

    /// A span taken for a slab page is not free even before the heap has
    /// made it a slab page: a neighbour freed in that window (by another
    /// thread: a remote large free, or `trim()`) must not merge it.
    #[test]
    fn a_span_taken_for_a_slab_is_never_merged_as_free() {
        let source = FakePages::new();
        let reservations = Locked::new(Reservations::owned());
        let config = LiveConfig::new(crate::Config::DEFAULT);
        let budget = Budget::new();
        let ctx = Ctx {
            source: &source,
            reservations: &reservations,
            heap: null_mut(),
            config: &config,
            budget: &budget,
        };
        let mut spans = Spans::new();
        let (slab, _, _) = spans.take_for_slab(&ctx, 1, 0, 0).unwrap();
        // The window: the heap has not yet initialised the slab page.
        let (large, _) = spans.take_large(&ctx, 1, 1).unwrap();
        spans.commit_whole(large);
        spans.give_back_large(large, 0);
        spans.settle_recent();
        let seg = seg_of(slab);
        let slab_idx = seg.index_of(slab);
        for (first, n) in free_spans(&spans) {
            assert!(
                slab_idx < first || slab_idx >= first + n,
                "the slab's slice {slab_idx} is inside free span {first}+{n}"
            );
        }
        // SAFETY: links are read with the pool exclusively ours.
        assert_eq!(unsafe { (*seg.links()).free_slices }, SPAN_SLICES - 1);
        spans.decay(&ctx, 0, Some(Why::Trim));
        // SAFETY: nothing of the reservation is used afterwards.
        unsafe { reservations.lock().unmap_all(&source) };
    }
}

#[cfg(all(test, loom))]
mod loom_model {
    //! Span take, merge and purge from three threads, in every order loom
    //! finds for their critical sections: the owner taking a span for a slab
    //! page (and initialising it after the lock is let go), another thread
    //! freeing a neighbouring large object, and the purger.
    use super::*;
    use crate::os::source::FakePages;
    use loom::sync::{Arc, Mutex};

    struct World {
        source: FakePages,
        reservations: Locked<Reservations>,
        config: LiveConfig,
        budget: Budget,
        spans: Mutex<Spans>,
    }

    impl World {
        fn ctx(&self) -> Ctx<'_> {
            Ctx {
                source: &self.source,
                reservations: &self.reservations,
                heap: null_mut(),
                config: &self.config,
                budget: &self.budget,
            }
        }
    }

    #[test]
    fn slab_take_races_a_neighbour_free_and_the_purger() {
        loom::model(|| {
            let w = Arc::new(World {
                source: FakePages::new(),
                reservations: Locked::new(Reservations::owned()),
                config: LiveConfig::new(crate::Config {
                    reservation_bytes: crate::memory::layout::SEGMENT,
                    ..crate::Config::DEFAULT
                }),
                budget: Budget::new(),
                spans: Mutex::new(Spans::new()),
            });
            // A large object in the segment, freed by another thread below.
            let large = {
                let mut s = w.spans.lock().unwrap();
                let (p, _) = s.take_large(&w.ctx(), 1, 1).unwrap();
                s.commit_whole(p);
                p as usize
            };
            let freer = {
                let w = w.clone();
                loom::thread::spawn(move || {
                    let mut s = w.spans.lock().unwrap();
                    s.give_back_large(large as *mut Page, 0);
                })
            };
            let purger = {
                let w = w.clone();
                loom::thread::spawn(move || {
                    let mut s = w.spans.lock().unwrap();
                    s.decay(&w.ctx(), 0, Some(Why::Trim));
                })
            };
            let slab = {
                let mut s = w.spans.lock().unwrap();
                s.take_for_slab(&w.ctx(), 1, 0, 0).unwrap().0
            };
            // The owner initialises the page with the lock let go.
            loom::thread::yield_now();
            // SAFETY: our slab span.
            assert_eq!(unsafe { (*slab).kind() }, Kind::Slab);
            freer.join().unwrap();
            purger.join().unwrap();
            let mut s = w.spans.lock().unwrap();
            s.settle_recent();
            let seg = seg_of(slab);
            let idx = seg.index_of(slab);
            for (first, n) in tests::free_spans(&s) {
                assert!(
                    idx < first || idx >= first + n,
                    "slab {idx} in free {first}+{n}"
                );
            }
            // SAFETY: links are read under the pool's lock.
            assert_eq!(unsafe { (*seg.links()).free_slices }, SPAN_SLICES - 1);
            s.decay(&w.ctx(), 0, Some(Why::Trim));
            drop(s);
            // SAFETY: nothing of the reservation is used afterwards.
            unsafe { w.reservations.lock().unmap_all(&w.source) };
        });
    }
}
