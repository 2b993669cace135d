//! `Heap`: an owned heap whose drop returns every byte it mapped.

use crate::config::Config;
use crate::heap::HeapCore;
use crate::memory::budget::Budget;
use crate::memory::layout::{align_up, os_page};
use crate::memory::reservation::Reservations;
use crate::os::source::{PageSource, SystemPages};
use crate::stats::Stats;
use crate::sync::lock::Locked;
use allocator_api2::alloc::{AllocError, Allocator};
use core::alloc::Layout;
use core::marker::PhantomData;
use core::ptr::NonNull;

struct Inner<S> {
    core: HeapCore,
    reservations: Locked<Reservations>,
    budget: Budget,
    source: S,
}

/// An owned heap: its own segments and reservations, its own counters, and
/// a drop that unmaps everything it mapped.
///
/// Single-threaded by design (`Send`, not `Sync`): no atomics on its paths
/// beyond those shared with the global allocator's code, and no locks taken
/// by anyone else. Collections can live in it through `&Heap`, which
/// implements [`allocator_api2::alloc::Allocator`].
///
/// ```
/// use allocator_api2::vec::Vec;
/// let heap = pagewise::Heap::new();
/// let mut v = Vec::new_in(&heap);
/// v.extend(0..1000u32);
/// assert_eq!(v.iter().sum::<u32>(), 499500);
/// drop(v);
/// heap.trim();
/// let s = heap.stats();
/// assert_eq!(s.live_bytes, 0);
/// assert_eq!(s.committed_bytes, 0);
/// ```
pub struct Heap<S: PageSource + 'static = SystemPages> {
    inner: NonNull<Inner<S>>,
    _not_sync: PhantomData<*mut ()>,
}

// SAFETY: the heap's state moves with it; nothing else refers to it while
// no allocation of it is shared (a thread that receives the heap becomes
// its only user).
unsafe impl<S: PageSource + Send + 'static> Send for Heap<S> {}

impl Heap<SystemPages> {
    /// A heap with the default policy, backed by the OS.
    ///
    /// ```
    /// let heap = pagewise::Heap::new();
    /// assert_eq!(heap.stats().syscalls.mmap, 1); // its own bookkeeping
    /// ```
    pub fn new() -> Self {
        Self::with_config(Config::DEFAULT)
    }

    /// A heap with the given policy, backed by the OS.
    ///
    /// ```
    /// let c = pagewise::Config { decay_ms: 0, ..Default::default() };
    /// let heap = pagewise::Heap::with_config(c);
    /// # drop(heap);
    /// ```
    pub fn with_config(config: Config) -> Self {
        Self::with_source(SystemPages::new(), config)
    }
}

impl Default for Heap<SystemPages> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: PageSource + 'static> Heap<S> {
    /// A heap on a given page source (a [`FakePages`](crate::FakePages) in tests).
    ///
    /// # Panics
    /// If the source cannot map the heap's bookkeeping (a few KiB).
    ///
    /// ```
    /// let heap = pagewise::Heap::with_source(pagewise::FakePages::new(), Default::default());
    /// # drop(heap);
    /// ```
    pub fn with_source(source: S, config: Config) -> Self {
        let bytes = align_up(core::mem::size_of::<Inner<S>>(), os_page());
        let at = source
            .map(bytes, os_page())
            .expect("pagewise: cannot map a heap's bookkeeping")
            .cast::<Inner<S>>();
        let p = at.as_ptr();
        // SAFETY: fresh, zeroed, page-aligned memory large enough for Inner;
        // the fields are written before any use, and the source and
        // reservations live as long as the core (same allocation).
        unsafe {
            core::ptr::addr_of_mut!((*p).source).write(source);
            core::ptr::addr_of_mut!((*p).reservations).write(Locked::new(Reservations::owned()));
            core::ptr::addr_of_mut!((*p).budget).write(Budget::new());
            let src: *const dyn PageSource = core::ptr::addr_of!((*p).source);
            HeapCore::init_at(
                core::ptr::addr_of_mut!((*p).core),
                src,
                core::ptr::addr_of!((*p).reservations),
                core::ptr::addr_of!((*p).budget),
                config,
                false,
            );
        }
        Heap {
            inner: at,
            _not_sync: PhantomData,
        }
    }

    pub(crate) fn core(&self) -> &HeapCore {
        // SAFETY: `inner` is valid for the heap's life.
        unsafe { &self.inner.as_ref().core }
    }

    /// The page source (for its syscall counters).
    ///
    /// ```
    /// use pagewise::PageSource;
    /// let heap = pagewise::Heap::with_source(pagewise::FakePages::new(), Default::default());
    /// let before = heap.source().syscalls().mmap;
    /// // The first object maps the heap's first reservation.
    /// let v = allocator_api2::vec![in &heap; 1u8; 1000];
    /// assert_eq!(heap.source().syscalls().mmap, before + 1);
    /// drop(v);
    /// ```
    pub fn source(&self) -> &S {
        // SAFETY: as above.
        unsafe { &self.inner.as_ref().source }
    }

    /// Allocates memory for `layout`. Zero-size layouts get a dangling,
    /// aligned pointer and no memory.
    ///
    /// ```
    /// use std::alloc::Layout;
    /// let heap = pagewise::Heap::new();
    /// let l = Layout::from_size_align(3000, 256).unwrap();
    /// let p = heap.allocate(l).unwrap();
    /// assert_eq!(p.cast::<u8>().as_ptr() as usize % 256, 0);
    /// assert!(p.len() >= 3000);
    /// // SAFETY: allocated above with `l`.
    /// unsafe { heap.deallocate(p.cast(), l) };
    /// ```
    pub fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        // SAFETY: a `Heap` is used by one thread at a time (!Sync), which
        // makes the caller the owner.
        let p = unsafe { self.core().alloc(layout.size(), layout.align()) };
        let p = NonNull::new(p).ok_or(AllocError)?;
        // SAFETY: `p` is a live allocation of this heap.
        let len = unsafe { HeapCore::usable_size(p.as_ptr()) };
        Ok(NonNull::slice_from_raw_parts(p, len))
    }

    /// Allocates zeroed memory. Pages pagewise knows to be zero (never
    /// used, or purged with `MADV_DONTNEED`) are not written, so a large
    /// zeroed block stays out of RSS until it is used.
    ///
    /// ```
    /// use std::alloc::Layout;
    /// let heap = pagewise::Heap::new();
    /// let l = Layout::from_size_align(64 << 20, 8).unwrap();
    /// let p = heap.allocate_zeroed(l).unwrap().cast::<u8>();
    /// // SAFETY: a live block of 64 MiB.
    /// assert_eq!(unsafe { p.as_ptr().add(40 << 20).read() }, 0);
    /// # unsafe { heap.deallocate(p, l) };
    /// ```
    pub fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        // SAFETY: owner (see `allocate`).
        let p = unsafe { self.core().alloc_zeroed(layout.size(), layout.align()) };
        let p = NonNull::new(p).ok_or(AllocError)?;
        // Only the bytes asked for are zeroed: the block is that long.
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    /// Frees memory allocated by this heap.
    ///
    /// # Safety
    /// `ptr` was allocated by this heap with `layout` and is not used after.
    /// A pointer of another heap or none aborts with a message.
    ///
    /// ```
    /// use std::alloc::Layout;
    /// let heap = pagewise::Heap::new();
    /// let l = Layout::new::<[u64; 4]>();
    /// let p = heap.allocate(l).unwrap();
    /// // SAFETY: allocated above with `l`.
    /// unsafe { heap.deallocate(p.cast(), l) };
    /// ```
    pub unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        // SAFETY: owner (see `allocate`); the caller vouches for `ptr`.
        unsafe { self.core().free_own(ptr.as_ptr()) };
    }

    /// Resizes an allocation to `new_size` bytes (same alignment), in place
    /// when possible.
    ///
    /// # Safety
    /// As for [`deallocate`](Self::deallocate); on success the old pointer
    /// is invalid unless it is returned again.
    ///
    /// ```
    /// use std::alloc::Layout;
    /// let heap = pagewise::Heap::new();
    /// let l = Layout::from_size_align(10, 1).unwrap();
    /// let p = heap.allocate(l).unwrap().cast::<u8>();
    /// // SAFETY: `p` is live with layout `l`.
    /// let q = unsafe { heap.reallocate(p, l, 12).unwrap() };
    /// assert_eq!(q.cast::<u8>(), p, "grew inside its 16-byte slot");
    /// # unsafe { heap.deallocate(q.cast(), Layout::from_size_align(12, 1).unwrap()) };
    /// ```
    pub unsafe fn reallocate(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new_size: usize,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if old.size() == 0 {
            return self
                .allocate(Layout::from_size_align(new_size, old.align()).map_err(|_| AllocError)?);
        }
        if new_size == 0 {
            // SAFETY: forwarded.
            unsafe { self.deallocate(ptr, old) };
            return Ok(dangling(old));
        }
        let core = self.core();
        // SAFETY: owner; `ptr` live with `old` (caller).
        let p = unsafe { core.realloc(ptr.as_ptr(), old.size(), old.align(), new_size, core) };
        let p = NonNull::new(p).ok_or(AllocError)?;
        // SAFETY: live allocation.
        let len = unsafe { HeapCore::usable_size(p.as_ptr()) };
        Ok(NonNull::slice_from_raw_parts(p, len))
    }

    /// Usable size of a live allocation of this heap.
    ///
    /// # Safety
    /// `ptr` is a live allocation of this heap.
    ///
    /// ```
    /// use std::alloc::Layout;
    /// let heap = pagewise::Heap::new();
    /// let l = Layout::from_size_align(100, 8).unwrap();
    /// let p = heap.allocate(l).unwrap().cast::<u8>();
    /// // SAFETY: live.
    /// assert_eq!(unsafe { heap.usable_size(p) }, 112);
    /// # unsafe { heap.deallocate(p, l) };
    /// ```
    pub unsafe fn usable_size(&self, ptr: NonNull<u8>) -> usize {
        // SAFETY: forwarded.
        unsafe { HeapCore::usable_size(ptr.as_ptr()) }
    }

    /// Gives back to the OS everything retained: empty pages, retained
    /// spans, wholly free segments, unused reservations.
    ///
    /// ```
    /// let heap = pagewise::Heap::new();
    /// heap.trim();
    /// assert_eq!(heap.stats().committed_bytes, 0);
    /// ```
    pub fn trim(&self) {
        // SAFETY: owner (see `allocate`).
        unsafe { self.core().trim() };
    }

    /// Meshes the heap (docs/design.md, "Meshing"): OS pages of different
    /// slab pages of one size class whose live slots sit at different
    /// offsets are made to share one physical page, the live slots of each
    /// copied to the same offsets of it, so every pointer stays valid and
    /// the memory of all but one of them goes back to the OS. Only a heap
    /// on a page source that can share pages does anything
    /// ([`SharedPages`](crate::source::SharedPages), Linux); first it does
    /// what [`Heap::trim`] does to the heap's pages. Returns the OS pages
    /// that joined groups.
    ///
    /// Meshed pages that hold no live slot any more leave their groups at
    /// the next call, and pages freed whole leave at once.
    ///
    /// # Safety
    /// No other thread reads or writes memory allocated from this heap
    /// during the call: a store to a page while it is copied would be lost.
    /// (Safe code cannot do that through the heap, which is not `Sync`;
    /// slices borrowed from its collections can be sent to other threads.)
    ///
    /// ```
    /// # #[cfg(target_os = "linux")] {
    /// use core::alloc::Layout;
    /// use pagewise::{Heap, SharedPages};
    /// let heap = Heap::with_source(SharedPages::new(), Default::default());
    /// let l = Layout::from_size_align(64, 8).unwrap();
    /// let os = pagewise::layout::os_page();
    /// let blocks: Vec<_> = (0..8 * os / 64).map(|_| heap.allocate(l).unwrap()).collect();
    /// // Keep one object per OS page, each at a different offset.
    /// let mut kept = Vec::new();
    /// for (i, p) in blocks.iter().enumerate() {
    ///     if i % (os / 64) == (i / (os / 64)) % 4 {
    ///         // SAFETY: 64 bytes of ours.
    ///         unsafe { p.cast::<u64>().write(i as u64) };
    ///         kept.push((i, *p));
    ///     } else {
    ///         // SAFETY: allocated above with `l`, freed once.
    ///         unsafe { heap.deallocate(p.cast(), l) };
    ///     }
    /// }
    /// // SAFETY: this thread is the only one using the heap.
    /// let joined = unsafe { heap.mesh() };
    /// assert!(joined >= 4, "{joined}");
    /// assert!(heap.stats().mesh_saved_bytes >= 2 * os as u64);
    /// for (i, p) in kept {
    ///     // SAFETY: live, written above.
    ///     assert_eq!(unsafe { p.cast::<u64>().read() }, i as u64);
    /// }
    /// # }
    /// ```
    pub unsafe fn mesh(&self) -> usize {
        // SAFETY: owner (see `allocate`); no writer, per the caller.
        unsafe { self.core().mesh() }
    }

    /// The mesh pass the global allocator's background purger makes, by
    /// the page source's clock ([`PageSource::now_ms`]): nothing meshes
    /// while the heap has taken a new slab page within a decay period (a
    /// phase still running would find a meshed page's free slots withheld
    /// and take fresh pages instead), and then only pages out of use for a
    /// decay period, whose clock the first such call starts. Before it,
    /// thread caches are emptied and empty pages released, as the purger's
    /// visits do. Returns the OS pages that joined groups.
    ///
    /// # Safety
    /// As [`Heap::mesh`].
    ///
    /// ```
    /// # #[cfg(target_os = "linux")] {
    /// use core::alloc::Layout;
    /// use pagewise::{Heap, SharedPages};
    /// let heap = Heap::with_source(SharedPages::new(), Default::default());
    /// let l = Layout::from_size_align(64, 8).unwrap();
    /// let p = heap.allocate(l).unwrap();
    /// // The heap has just grown: a background pass leaves it alone.
    /// // SAFETY: this thread is the only one using the heap.
    /// assert_eq!(unsafe { heap.mesh_if_quiet() }, 0);
    /// // SAFETY: allocated above with `l`, freed once.
    /// unsafe { heap.deallocate(p.cast(), l) };
    /// # }
    /// ```
    ///
    /// [`PageSource::now_ms`]: crate::PageSource::now_ms
    pub unsafe fn mesh_if_quiet(&self) -> usize {
        // SAFETY: owner (see `allocate`); no writer, per the caller.
        unsafe { self.core().mesh_if_quiet() }
    }

    /// A snapshot of this heap's counters.
    ///
    /// ```
    /// let heap = pagewise::Heap::new();
    /// assert_eq!(heap.stats().live_allocations, 0);
    /// ```
    pub fn stats(&self) -> Stats {
        let core = self.core();
        let mut s = Stats::ZERO;
        s.syscalls = self.source().syscalls();
        if let Some(sharing) = self.source().sharing() {
            let (pages, groups) = sharing.shared();
            s.meshed_bytes = (pages * os_page()) as u64;
            s.mesh_saved_bytes = (pages.saturating_sub(groups) * os_page()) as u64;
            s.mesh_mappings = sharing.seams() as u64;
            s.mesh_guards_lost = sharing.guards_lost();
            s.mesh_registrations_refused = sharing.registrations_refused();
        }
        for (c, n) in core.empty_pages_by_class().iter().enumerate() {
            s.classes[c].retained_pages += *n as u64;
        }
        s.add_heap(core);
        s.limit_charged_bytes = core.budget().charged() as u64;
        s.limit_peak_bytes = core.budget().peak_charged() as u64;
        s.thp_bytes = core.budget().huge.bytes() as u64;
        s.thp_splits = core.budget().huge.splits();
        // SAFETY: as above.
        s.reserved_bytes = unsafe { self.inner.as_ref() }
            .reservations
            .lock()
            .reserved_bytes as u64;
        s.finish();
        s
    }
}

impl<S: PageSource + 'static> Drop for Heap<S> {
    fn drop(&mut self) {
        let p = self.inner.as_ptr();
        let bytes = align_up(core::mem::size_of::<Inner<S>>(), os_page());
        // SAFETY: we own `inner`; after unmapping the reservations nothing
        // refers to them, and the source is moved out before its own memory
        // is unmapped.
        unsafe {
            let src: &dyn PageSource = &(*p).source;
            (*p).core.unmap_mesh_records();
            (*p).reservations.lock().unmap_all(src);
            let source = core::ptr::read(core::ptr::addr_of!((*p).source));
            source.unmap(self.inner.cast(), bytes);
            drop(source);
        }
    }
}

fn dangling(layout: Layout) -> NonNull<[u8]> {
    // SAFETY: an alignment is never zero.
    let p = unsafe { NonNull::new_unchecked(layout.align() as *mut u8) };
    NonNull::slice_from_raw_parts(p, 0)
}

// SAFETY: memory blocks stay valid until deallocated or the heap drops
// (which needs `&mut`, impossible while `&Heap` is borrowed by a
// collection); `allocate` returns fitting, aligned blocks.
unsafe impl<S: PageSource + 'static> Allocator for &Heap<S> {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        Heap::allocate(self, layout)
    }

    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        Heap::allocate_zeroed(self, layout)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: forwarded from the trait contract.
        unsafe { Heap::deallocate(self, ptr, layout) }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the trait contract.
        unsafe { resize(self, ptr, old, new) }
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the trait contract.
        unsafe { resize(self, ptr, old, new) }
    }
}

/// Resizes a block of `heap` from `old` to `new`: in place when the
/// alignment allows (`reallocate`), else by moving it to a new block.
///
/// # Safety
/// `ptr` is a live block of `heap` with layout `old`.
unsafe fn resize<S: PageSource + 'static>(
    heap: &Heap<S>,
    ptr: NonNull<u8>,
    old: Layout,
    new: Layout,
) -> Result<NonNull<[u8]>, AllocError> {
    if new.align() <= old.align() {
        // SAFETY: forwarded.
        return unsafe { heap.reallocate(ptr, old, new.size()) };
    }
    let n = heap.allocate(new)?;
    // SAFETY: both blocks are live and distinct; copy what fits, then free
    // the old one.
    unsafe {
        core::ptr::copy_nonoverlapping(
            ptr.as_ptr(),
            n.cast::<u8>().as_ptr(),
            old.size().min(new.size()),
        );
        heap.deallocate(ptr, old);
    }
    Ok(n)
}
