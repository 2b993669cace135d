//! Statistics: where every byte went.
//!
//! Vocabulary (jemalloc's chain, made exact for pagewise):
//! `live_bytes` ⊆ `committed_bytes` (+ `metadata_bytes`) ⊆ `reserved_bytes`.
//! - **reserved**: address space mapped from the OS (whole reservations).
//! - **committed**: OS pages that may be resident: touched slab pages, large
//!   and huge objects, and retained free pages not yet purged. Segment
//!   headers and heap structures are counted apart as **metadata**.
//! - **live**: usable bytes of live allocations (slot size for small ones).
//! - **retained**: committed bytes in free spans and cached huge objects,
//!   kept for reuse until the decay delay or the cap purges them.
//! - **free slots**: committed bytes inside slab pages not holding live
//!   objects (the fragmentation that placement and page release fight).
//!
//! So `committed = live + free_slot_bytes + retained` for slab and span memory
//! (large objects count their whole span as live usable bytes).

use crate::heap::HeapCore;
use crate::memory::size_class::{CLASSES, SLOT_SIZE};
use crate::os::source::SyscallCounts;

/// Per size-class figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ClassStats {
    /// Slot size in bytes.
    pub slot_size: u64,
    /// Slab pages of the class.
    pub pages: u64,
    /// Slots holding live objects (remote frees not yet collected count as live).
    pub live_slots: u64,
    /// Slots in those pages not holding live objects.
    pub free_slots: u64,
    /// Of those, slots waiting in threads' caches to be handed out again
    /// (at most 128 slots and 128 KiB per class and thread, or 128 KiB for
    /// a cache that grew because its thread took its own overflow back
    /// from the transfer cache; they go back to
    /// their pages on `trim()`, thread exit, and over the next maintenance
    /// passes).
    pub cached_slots: u64,
    /// Pages of the class with no live slot (kept as a class's current page).
    pub retained_pages: u64,
    /// Allocations served by the class since start.
    pub total_allocs: u64,
    /// Frees of the class since start (remote frees once collected).
    pub total_frees: u64,
    /// Bytes requested by live objects, estimated from the class's mean
    /// request size (the C `free` does not say the size), sampled over the
    /// allocations served from pages rather than the thread cache.
    pub live_requested_bytes: u64,
}

/// Bytes purged so far, by cause ([`Stats::purged_by`]): the fields sum
/// to [`Stats::purged_bytes`].
///
/// ```
/// use std::alloc::Layout;
/// let heap = pagewise::Heap::new();
/// let l = Layout::from_size_align(1 << 20, 8).unwrap();
/// let p = heap.allocate(l).unwrap();
/// // SAFETY: touched within its size, then freed once with its layout.
/// unsafe {
///     p.as_ptr().cast::<u8>().write_bytes(1, 1 << 20);
///     heap.deallocate(p.cast(), l);
/// }
/// heap.trim();
/// let s = heap.stats();
/// assert!(s.purged_by.trim >= 1 << 20, "{:?}", s.purged_by);
/// assert_eq!(s.purged_by.total(), s.purged_bytes);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct PurgedBy {
    /// Retained spans and cached huge runs purged by the decay: freed
    /// `decay_ms` ago or longer, while retention was above what recent
    /// demand keeps.
    pub decay: u64,
    /// Retained spans and cached huge runs purged younger than `decay_ms`,
    /// because retention passed the budget (what recent demand keeps for
    /// young spans, or `retain_max_bytes`).
    pub budget: u64,
    /// The oldest retention of a heap, purged because another heap had to
    /// commit fresh memory (docs/design.md, "Retention, decay and purge").
    pub reclaim: u64,
    /// Purged by `trim()`.
    pub trim: u64,
    /// Purged because the hard limit (`limit_bytes`) refused a charge.
    pub limit: u64,
    /// Free OS pages inside slab pages in use (hollowing: when the page
    /// was out of use for a decay period, on `trim()` and for the limit).
    pub hollow: u64,
    /// A cached huge run reused by a smaller object, or at another offset:
    /// what the new object does not cover.
    pub huge_reuse: u64,
}

impl PurgedBy {
    /// All zero.
    pub const ZERO: PurgedBy = PurgedBy {
        decay: 0,
        budget: 0,
        reclaim: 0,
        trim: 0,
        limit: 0,
        hollow: 0,
        huge_reuse: 0,
    };

    /// The sum of every cause: [`Stats::purged_bytes`].
    ///
    /// ```
    /// let s = pagewise::Heap::new().stats();
    /// assert_eq!(s.purged_by.total(), s.purged_bytes);
    /// ```
    pub fn total(&self) -> u64 {
        self.decay
            + self.budget
            + self.reclaim
            + self.trim
            + self.limit
            + self.hollow
            + self.huge_reuse
    }

    fn add_spans(&mut self, by: &[usize; crate::memory::spans::WHYS]) {
        use crate::memory::spans::Why;
        self.decay += by[Why::Decay as usize] as u64;
        self.budget += by[Why::Budget as usize] as u64;
        self.reclaim += by[Why::Reclaim as usize] as u64;
        self.trim += by[Why::Trim as usize] as u64;
        self.limit += by[Why::Limit as usize] as u64;
        self.huge_reuse += by[Why::Reuse as usize] as u64;
    }
}

/// Counts and bytes of large or huge objects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ObjectStats {
    /// Live objects.
    pub count: u64,
    /// Their usable bytes.
    pub bytes: u64,
    /// Their requested bytes (exact).
    pub requested_bytes: u64,
}

/// A snapshot of an allocator's state.
///
/// ```
/// let heap = pagewise::Heap::new();
/// let layout = std::alloc::Layout::from_size_align(100, 8).unwrap();
/// let p = heap.allocate(layout).unwrap();
/// let s = heap.stats();
/// assert_eq!(s.live_bytes, 112);
/// assert_eq!(s.classes[pagewise::size_class::class_of(100)].live_slots, 1);
/// // SAFETY: allocated above with this layout.
/// unsafe { heap.deallocate(p.cast(), layout) };
/// ```
///
/// New fields may come in later versions (`#[non_exhaustive]`); with the
/// `serde` feature it serialises (the per-class figures as a sequence):
///
/// ```
/// # #[cfg(feature = "serde")]
/// # {
/// let json = serde_json::to_string(&pagewise::Heap::new().stats()).unwrap();
/// assert!(json.contains("\"committed_bytes\":0"));
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Stats {
    /// Memory system calls made and bytes mapped.
    pub syscalls: SyscallCounts,
    /// Address space held in reservations.
    pub reserved_bytes: u64,
    /// Bytes that may be resident (excluding metadata).
    pub committed_bytes: u64,
    /// Highest `committed_bytes` seen (per heap, summed).
    pub peak_committed_bytes: u64,
    /// Segment headers and heap structures.
    pub metadata_bytes: u64,
    /// Bytes counted against the hard limit (`PAGEWISE_LIMIT`,
    /// `Config::limit_bytes`) now: committed bytes and segment headers,
    /// charged before they are touched, so never above the limit. Exact at
    /// every moment, unlike `committed_bytes`, which sums the heaps one at
    /// a time (counted with or without a limit).
    pub limit_charged_bytes: u64,
    /// Highest `limit_charged_bytes` seen.
    pub limit_peak_bytes: u64,
    /// Usable bytes of live allocations.
    pub live_bytes: u64,
    /// Requested bytes of live allocations (exact for large and huge
    /// objects, estimated per class for small ones).
    pub live_requested_bytes: u64,
    /// Live allocations.
    pub live_allocations: u64,
    /// Committed bytes retained in free spans and the huge cache.
    pub retained_bytes: u64,
    /// Committed bytes of slab pages not holding live objects: free slots
    /// still resident.
    pub free_slot_bytes: u64,
    /// Bytes of OS pages purged inside slab pages that still hold live
    /// objects (their slots all free; carved again when the page is used
    /// again). Not part of `committed_bytes`.
    ///
    /// ```
    /// use std::alloc::Layout;
    /// let heap = pagewise::Heap::new();
    /// let l = Layout::from_size_align(64, 8).unwrap();
    /// let blocks: Vec<_> = (0..1000).map(|_| heap.allocate(l).unwrap()).collect();
    /// // Keep the first block; free the other 999 (about 15 OS pages of
    /// // 4 KiB; at 64 KiB the one OS page holds the live block).
    /// for p in &blocks[1..] {
    ///     // SAFETY: allocated above with `l`, freed once.
    ///     unsafe { heap.deallocate(p.cast(), l) };
    /// }
    /// heap.trim();
    /// let s = heap.stats();
    /// let page = pagewise::layout::os_page() as u64;
    /// assert!(s.hollow_bytes >= (64u64 << 10).saturating_sub(2 * page), "{s:?}");
    /// assert!(s.free_slot_bytes < page);
    /// // SAFETY: allocated above with `l`.
    /// unsafe { heap.deallocate(blocks[0].cast(), l) };
    /// ```
    pub hollow_bytes: u64,
    /// Bytes purged so far (decay, cap, trim, and inside slab pages).
    pub purged_bytes: u64,
    /// `purged_bytes` by cause.
    pub purged_by: PurgedBy,
    /// Bytes of OS pages that are members of mesh groups: each shows one
    /// physical page shared with other members (docs/design.md,
    /// "Meshing"). Only heaps on a page source that can share pages
    /// (`SharedPages`) mesh.
    pub meshed_bytes: u64,
    /// Physical memory meshing saves now: the members' bytes less one
    /// page per group. Already left out of `committed_bytes` and
    /// `free_slot_bytes` (the slots a member may not use are in another's
    /// memory).
    pub mesh_saved_bytes: u64,
    /// Kernel mappings meshing adds to the process: places inside the
    /// heap's mappings where neighbouring OS pages show group pages that
    /// are not consecutive, or where their huge-page advice differs (the
    /// ends of regions advised huge). Capped at a third of
    /// `vm.max_map_count`; a slab page meshed whole onto another's groups
    /// adds at most two.
    pub mesh_mappings: u64,
    /// Times the kernel would not put back the inaccessible guard page at
    /// the end of one of the heap's mappings after meshing made a page
    /// there (as it may at the process's mapping limit,
    /// `vm.max_map_count`): the place is left to whoever maps there, and
    /// that mapping's pages neither mesh nor leave a group keeping their
    /// bytes until the guard can be put back. Each loss is counted once,
    /// however long it lasts. 0 unless the heap meshes (docs/design.md,
    /// "Meshing").
    ///
    /// ```
    /// # #[cfg(target_os = "linux")] {
    /// use pagewise::{Config, Heap, SharedPages};
    /// let heap = Heap::with_source(SharedPages::new(), Config::default());
    /// assert_eq!(heap.stats().mesh_guards_lost, 0);
    /// # }
    /// ```
    pub mesh_guards_lost: u64,
    /// Times the process's userfaultfd would not register a page meshing
    /// remapped (as the kernel may, short of memory): the page's whole
    /// mapping is then unregistered, and the write barrier holds writers
    /// off its pages with `mprotect` instead, which costs a signal per
    /// waiting store. 0 unless the heap meshes with a userfaultfd
    /// (docs/design.md, "Meshing").
    ///
    /// ```
    /// # #[cfg(target_os = "linux")] {
    /// use pagewise::{Config, Heap, SharedPages};
    /// let heap = Heap::with_source(SharedPages::new(), Config::default());
    /// assert_eq!(heap.stats().mesh_registrations_refused, 0);
    /// # }
    /// ```
    pub mesh_registrations_refused: u64,
    /// Stores that waited for a meshed page's copy (the write barrier of
    /// the global allocator), and the longest such wait in microseconds.
    pub mesh_waits: u64,
    /// See `mesh_waits`.
    pub mesh_longest_wait_us: u64,
    /// Times a mesh pass let a heap's page lists go between two chunks of
    /// a round (256 OS pages joining) for a thread of the program waiting
    /// for them (an allocation's slow path, a `trim()`): the thread waits
    /// for one chunk's copies, not the round or the pass, and the pass
    /// then plans the rest of that size class again.
    pub mesh_pauses: u64,
    /// Bytes of the heap's 2 MiB regions pagewise asked the kernel to
    /// back with huge pages (`PAGEWISE_THP`, docs/design.md, "Huge
    /// pages"), now: each is committed whole (in `committed_bytes`). What
    /// the kernel actually backs is in `/proc/self/smaps`
    /// ([`crate::thp::heap_huge_page_bytes`]).
    ///
    /// ```
    /// use pagewise::{thp::ThpMode, FakePages, Heap, Thp};
    /// use std::alloc::Layout;
    /// static PAGES: FakePages = FakePages::with_thp(ThpMode::Madvise);
    /// let heap = Heap::with_source(&PAGES, pagewise::Config::default());
    /// // A large object of 6 MiB holds at least two whole regions.
    /// let l = Layout::from_size_align(6 << 20, 8).unwrap();
    /// let p = heap.allocate(l).unwrap();
    /// assert!(heap.stats().thp_bytes >= 4 << 20);
    /// // SAFETY: allocated above with `l`.
    /// unsafe { heap.deallocate(p.cast(), l) };
    /// heap.trim();
    /// assert_eq!(heap.stats().thp_bytes, 0, "purged, and given back to small pages");
    /// ```
    pub thp_bytes: u64,
    /// Huge pages a purge split so far: part of an advised region given
    /// back while the rest stayed (when the program went quiet, or for the
    /// retention budget or the limit). A region purged whole is not split.
    pub thp_splits: u64,
    /// Segments held.
    pub segments: u64,
    /// Heaps (threads that allocated, plus abandoned heaps awaiting reuse).
    pub heaps: u64,
    /// Large objects (spans inside segments).
    pub large: ObjectStats,
    /// Huge objects (their own segment runs).
    pub huge: ObjectStats,
    /// Small objects, per size class.
    #[cfg_attr(feature = "serde", serde(serialize_with = "serialize_classes"))]
    pub classes: [ClassStats; CLASSES],
}

impl Stats {
    /// All zero.
    pub const ZERO: Stats = Stats {
        syscalls: SyscallCounts {
            mmap: 0,
            munmap: 0,
            madvise: 0,
            mapped_bytes: 0,
            peak_mapped_bytes: 0,
            purged_bytes: 0,
            barriers: 0,
            hugepage: 0,
            nohugepage: 0,
        },
        reserved_bytes: 0,
        committed_bytes: 0,
        peak_committed_bytes: 0,
        metadata_bytes: 0,
        limit_charged_bytes: 0,
        limit_peak_bytes: 0,
        live_bytes: 0,
        live_requested_bytes: 0,
        live_allocations: 0,
        retained_bytes: 0,
        free_slot_bytes: 0,
        hollow_bytes: 0,
        purged_bytes: 0,
        purged_by: PurgedBy::ZERO,
        meshed_bytes: 0,
        mesh_saved_bytes: 0,
        mesh_mappings: 0,
        mesh_guards_lost: 0,
        mesh_registrations_refused: 0,
        mesh_waits: 0,
        mesh_longest_wait_us: 0,
        mesh_pauses: 0,
        thp_bytes: 0,
        thp_splits: 0,
        segments: 0,
        heaps: 0,
        large: ObjectStats {
            count: 0,
            bytes: 0,
            requested_bytes: 0,
        },
        huge: ObjectStats {
            count: 0,
            bytes: 0,
            requested_bytes: 0,
        },
        classes: [ClassStats {
            slot_size: 0,
            pages: 0,
            live_slots: 0,
            free_slots: 0,
            cached_slots: 0,
            retained_pages: 0,
            total_allocs: 0,
            total_frees: 0,
            live_requested_bytes: 0,
        }; CLASSES],
    };

    /// Adds one heap's figures.
    pub(crate) fn add_heap(&mut self, heap: &HeapCore) {
        self.heaps += 1;
        // Raw sums only: a heap can free more slots than it allocated (slots
        // of other heaps' pages kept in its foreign cache), so live figures
        // are derived in `finish` from the totals of all heaps.
        for (c, (cc, pc)) in heap
            .class_states()
            .iter()
            .zip(&heap.page_counts)
            .enumerate()
        {
            let s = &mut self.classes[c];
            s.slot_size = SLOT_SIZE[c] as u64;
            s.pages += pc.pages.get();
            s.free_slots += pc.slots.get(); // capacity for now; see `finish`
            s.cached_slots += cc.cached() as u64;
            let allocs = heap.allocs(c);
            s.total_allocs += allocs;
            s.total_frees += cc.frees(allocs);
            s.live_requested_bytes += cc.requested_estimate(allocs); // total for now
        }
        let slab_committed = heap.slab_committed.get();
        let spans = heap.spans.lock().counts;
        self.committed_bytes += slab_committed + spans.committed as u64;
        // The hardened build's kept spans whose memory went back to the OS
        // (`secure/kept.rs`): in use by the heap, not resident.
        #[cfg(feature = "secure")]
        {
            self.committed_bytes = self.committed_bytes.saturating_sub(heap.kept.given_back());
        }
        self.peak_committed_bytes += heap.peak_committed.get();
        self.metadata_bytes += spans.metadata as u64 + core::mem::size_of::<HeapCore>() as u64;
        self.retained_bytes += spans.retained as u64;
        self.free_slot_bytes += slab_committed; // committed in slabs for now
        self.purged_bytes += spans.purged as u64 + heap.hollowed.get();
        self.purged_by.add_spans(&spans.purged_by);
        self.purged_by.hollow += heap.hollowed.get();
        self.hollow_bytes += heap.hollow_bytes.get();
        self.segments += spans.segments as u64;
        self.large.count += spans.large_count as u64;
        self.large.bytes += spans.large_bytes as u64;
        self.large.requested_bytes += spans.large_requested as u64;
        self.huge.count += spans.huge_count as u64;
        self.huge.bytes += spans.huge_bytes as u64;
        self.huge.requested_bytes += spans.huge_requested as u64;
    }

    /// Counts slots freed into a heap's pages by other threads and not yet
    /// taken in by the heap (per class) as frees.
    pub(crate) fn add_pending_frees(&mut self, pending: &[u64; CLASSES]) {
        for (c, n) in self.classes.iter_mut().zip(pending) {
            c.total_frees += n;
        }
    }

    /// Counts the slots in the global allocator's transfer cache as freed
    /// and cached (they left a thread cache, which stops counting them, and
    /// have not reached a page, which would).
    pub(crate) fn add_transfer_cache(&mut self) {
        for (c, s) in self.classes.iter_mut().enumerate() {
            let n = crate::memory::transfer::GLOBAL.slots(c) as u64;
            s.cached_slots += n;
            s.total_frees += n;
        }
    }

    /// Derives the totals from the parts.
    pub(crate) fn finish(&mut self) {
        let mut small = 0u64;
        for c in self.classes.iter_mut() {
            let live = c.total_allocs.saturating_sub(c.total_frees);
            let requested = c.live_requested_bytes;
            c.live_requested_bytes = if c.total_allocs > 0 {
                (requested as u128 * live as u128 / c.total_allocs as u128) as u64
            } else {
                0
            };
            c.live_slots = live;
            c.free_slots = c.free_slots.saturating_sub(live);
            small += live * c.slot_size;
        }
        self.free_slot_bytes = self
            .free_slot_bytes
            .saturating_sub(small + self.mesh_saved_bytes);
        self.committed_bytes = self.committed_bytes.saturating_sub(self.mesh_saved_bytes);
        let small_req: u64 = self.classes.iter().map(|c| c.live_requested_bytes).sum();
        let small_n: u64 = self.classes.iter().map(|c| c.live_slots).sum();
        self.live_bytes = small + self.large.bytes + self.huge.bytes;
        self.live_requested_bytes =
            small_req + self.large.requested_bytes + self.huge.requested_bytes;
        self.live_allocations = small_n + self.large.count + self.huge.count;
    }
}

impl Default for Stats {
    fn default() -> Self {
        Stats::ZERO
    }
}

/// serde implements arrays up to 32 elements; the classes go as a sequence.
#[cfg(feature = "serde")]
fn serialize_classes<S: serde::Serializer>(
    classes: &[ClassStats; CLASSES],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(classes.iter())
}
