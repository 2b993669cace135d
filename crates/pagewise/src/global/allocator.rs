//! The global allocator: `#[global_allocator] static A: Pagewise = Pagewise;`

use crate::global::{heaps, thread};
use crate::heap::hollow::Hollow;
use crate::heap::{Access, HeapCore};
use crate::stats::Stats;
use core::alloc::{GlobalAlloc, Layout};

/// pagewise as the process's global allocator.
///
/// Per-thread heaps, no lock on the malloc/free fast path, lock-free
/// cross-thread frees, and heaps of exited threads reused by new ones.
///
/// ```
/// use std::alloc::{GlobalAlloc, Layout};
/// let l = Layout::from_size_align(1000, 64).unwrap();
/// // SAFETY: non-zero layout; freed with the same layout.
/// unsafe {
///     let p = pagewise::Pagewise.alloc(l);
///     assert_eq!(p as usize % 64, 0);
///     pagewise::Pagewise.dealloc(p, l);
/// }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Pagewise;

// SAFETY: pointers come from pagewise heaps, aligned as the layout asks
// (slot sizes are multiples of the alignment, spans are slice-aligned and
// split to the alignment, huge objects sit at an aligned offset); null on
// failure; nothing here panics or allocates through the global allocator.
unsafe impl GlobalAlloc for Pagewise {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        #[cfg(feature = "secure")]
        // SAFETY: forwarded.
        return unsafe { alloc_secure(layout.size(), layout.align()) };
        #[cfg(not(feature = "secure"))]
        // SAFETY: forwarded.
        unsafe {
            alloc_plain(layout.size(), layout.align())
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        #[cfg(feature = "secure")]
        let heap = thread::current_or_empty();
        #[cfg(feature = "secure")]
        // SAFETY: forwarded; the heap is the calling thread's or the empty
        // one, and `dealloc_uncached` frees a live block.
        return unsafe {
            crate::secure::free(ptr, heap, |p, current| dealloc_uncached(p, current))
        };
        #[cfg(not(feature = "secure"))]
        // SAFETY: forwarded.
        unsafe {
            dealloc_plain(ptr)
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        #[cfg(feature = "secure")]
        // SAFETY: `alloc_zeroed_plain` returns null or a live block of the
        // size.
        return unsafe {
            let (size, align) = (layout.size(), layout.align());
            let heap = thread::current_or_null();
            let p = if heap.is_null() || align > 16 {
                core::ptr::null_mut()
            } else {
                crate::secure::alloc_cached(heap, size)
            };
            if p.is_null() {
                crate::secure::alloc(size, align, true, |n, a, z| alloc_below(n, a, z))
            } else {
                core::ptr::write_bytes(p, 0, size);
                p
            }
        };
        #[cfg(not(feature = "secure"))]
        // SAFETY: forwarded.
        unsafe {
            alloc_zeroed_plain(layout.size(), layout.align())
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        #[cfg(feature = "secure")]
        // SAFETY: forwarded; the closures allocate and free live blocks,
        // the block moved away from through the program's own `dealloc`.
        return unsafe {
            crate::secure::realloc(
                ptr,
                new_size,
                layout.align(),
                |n, a| alloc_secure(n, a),
                |p| self.dealloc(p, layout),
            )
        };
        #[cfg(not(feature = "secure"))]
        // SAFETY: forwarded.
        unsafe {
            realloc_plain(ptr, layout.size(), layout.align(), new_size)
        }
    }
}

/// `GlobalAlloc::alloc` in the hardened build: from the thread cache if it
/// can, else below the layer (`alloc_plain`), armed either way.
///
/// # Safety
/// As `GlobalAlloc::alloc` (`align` a power of two).
#[cfg(feature = "secure")]
#[inline(always)]
unsafe fn alloc_secure(size: usize, align: usize) -> *mut u8 {
    let heap = thread::current_or_null();
    if !heap.is_null() && align <= 16 {
        // SAFETY: the calling thread's own heap.
        let p = unsafe { crate::secure::alloc_cached(heap, size) };
        if !p.is_null() {
            return p;
        }
    }
    // SAFETY: `alloc_plain` returns null or a live block of the size.
    unsafe { crate::secure::alloc(size, align, false, |n, a, z| alloc_below(n, a, z)) }
}

/// `GlobalAlloc::alloc` below the hardened layer.
///
/// # Safety
/// As `GlobalAlloc::alloc` (`align` a power of two).
#[inline(always)]
unsafe fn alloc_plain(size: usize, align: usize) -> *mut u8 {
    {
        // One comparison with the empty heap where the thread-local word
        // is never null (x86-64 glibc), rather than two.
        let heap = thread::current_or_empty();
        if heap == crate::heap::empty_heap() {
            // A tail call, so the fast path below saves no registers.
            return first_alloc(size, align);
        }
        // SAFETY: `heap` is the calling thread's own heap.
        unsafe { (*heap).alloc(size, align) }
    }
}

/// `GlobalAlloc::dealloc` below the hardened layer.
///
/// # Safety
/// As `GlobalAlloc::dealloc`.
#[cfg(not(feature = "secure"))]
#[inline(always)]
unsafe fn dealloc_plain(ptr: *mut u8) {
    // A thread without a heap finds the empty one, whose caches take no
    // slot: no test for it here.
    let current = thread::current_or_empty();
    // SAFETY: the caller gives back a live allocation; the current heap is
    // the calling thread's or the empty one.
    if unsafe { HeapCore::free_to_cache_or_empty(ptr, current) } {
        return;
    }
    // SAFETY: as above. A tail call, so the fast path saves no registers.
    unsafe { dealloc_uncached(ptr, thread::current_or_null()) }
}

/// `GlobalAlloc::alloc` or, with `zeroed`, `alloc_zeroed` below the
/// hardened layer (which asks for a block zeroed here only past a slot's
/// size).
///
/// # Safety
/// As `GlobalAlloc::alloc`.
#[cfg(feature = "secure")]
unsafe fn alloc_below(size: usize, align: usize, zeroed: bool) -> *mut u8 {
    // SAFETY: forwarded.
    unsafe {
        if zeroed {
            alloc_zeroed_plain(size, align)
        } else {
            alloc_plain(size, align)
        }
    }
}

/// `GlobalAlloc::alloc_zeroed` below the hardened layer.
///
/// # Safety
/// As `GlobalAlloc::alloc_zeroed`.
#[inline(always)]
unsafe fn alloc_zeroed_plain(size: usize, align: usize) -> *mut u8 {
    // SAFETY: `with_heap` lends the calling thread's own heap.
    thread::with_heap(|h| unsafe { h.alloc_zeroed(size, align) }).unwrap_or(core::ptr::null_mut())
}

/// `GlobalAlloc::realloc` below the hardened layer: `old` is the size to
/// preserve.
///
/// # Safety
/// As `GlobalAlloc::realloc`.
#[cfg(not(feature = "secure"))]
#[inline(always)]
unsafe fn realloc_plain(ptr: *mut u8, old: usize, align: usize, new_size: usize) -> *mut u8 {
    // A purger a free asked for starts here, as at the C library's
    // `realloc` (the slot's path below takes no `malloc` that would).
    crate::global::purger::poll();
    // SAFETY: forwarded: a live block of `old` bytes (at most its slot).
    let moved =
        unsafe { crate::global::raw::realloc_cached_slot(ptr, old, new_size.max(1), align) };
    if !moved.is_null() {
        return moved;
    }
    // SAFETY: `with_heap` lends the calling thread's own heap; `ptr` is
    // live with `old` bytes to keep (caller).
    thread::with_heap(|h| unsafe { h.realloc(ptr, old, align, new_size, h) })
        .unwrap_or(core::ptr::null_mut())
}

/// A free the thread cache did not take.
///
/// # Safety
/// As `GlobalAlloc::dealloc`; `current` is the calling thread's heap or null.
#[inline(never)]
unsafe fn dealloc_uncached(ptr: *mut u8, current: *mut HeapCore) {
    // SAFETY: forwarded.
    if unsafe { thread::free_past_cache(ptr, current) } {
        // A Rust program's frees never come from inside glibc (its own
        // allocations use its own malloc), so unlike the C library's
        // `free`, this one may start the purger thread directly.
        crate::global::purger::ensure();
    }
}

/// The calling thread's first allocation: makes or adopts its heap.
#[cold]
#[inline(never)]
fn first_alloc(size: usize, align: usize) -> *mut u8 {
    crate::global::purger::allow_start_from_free();
    // SAFETY: `with_heap` lends the calling thread's own heap.
    thread::with_heap(|h| unsafe { h.alloc(size, align) }).unwrap_or(core::ptr::null_mut())
}

/// Usable size of a live allocation made by the global allocator (or any
/// pagewise heap): at least the requested size (in the hardened build,
/// exactly that: the rest of the block holds its canary).
///
/// # Safety
/// `ptr` is a live pagewise allocation. A foreign pointer aborts.
///
/// ```
/// use std::alloc::{GlobalAlloc, Layout};
/// let l = Layout::from_size_align(100, 8).unwrap();
/// // SAFETY: as documented.
/// unsafe {
///     let p = pagewise::Pagewise.alloc(l);
///     assert!(pagewise::usable_size(p) >= 100);
///     // The slot of its class; the hardened build's is the request.
///     #[cfg(not(feature = "secure"))]
///     assert_eq!(pagewise::usable_size(p), 112);
///     #[cfg(feature = "secure")]
///     assert_eq!(pagewise::usable_size(p), 100);
///     pagewise::Pagewise.dealloc(p, l);
/// }
/// ```
pub unsafe fn usable_size(ptr: *const u8) -> usize {
    #[cfg(feature = "secure")]
    // SAFETY: forwarded.
    return unsafe { crate::secure::usable_size(ptr) };
    #[cfg(not(feature = "secure"))]
    // SAFETY: forwarded.
    unsafe {
        HeapCore::usable_size(ptr)
    }
}

/// Gives back to the OS everything the global allocator retains: every
/// heap's empty pages (those other threads emptied too), retained spans and
/// cached huge objects, wholly free segments, and reservations left unused
/// (munmap). The calling thread does the other heaps' work, waiting for a
/// thread that is on one of its slow paths. What stays: the free slots in
/// other live threads' caches and their current pages (one per size class
/// at most), which their threads use without a lock; each such thread
/// empties its caches at its next slow path.
///
/// ```
/// pagewise::trim();
/// ```
pub fn trim() {
    #[cfg(feature = "secure")]
    {
        let me = thread::current_or_null();
        if !me.is_null() {
            // SAFETY: our own heap: the spans of guarded blocks it kept go
            // back to it (its cache, which the trim empties below, holds
            // the slots it freed last).
            unsafe { crate::secure::give_back_kept_spans(&*me) };
        }
    }
    {
        // Under the visit lock, which the fork handlers take first: a
        // batch between the transfer cache and its pages is never copied
        // into a child that would not have this thread to finish it.
        let _pass = heaps::VISITS.lock();
        crate::heap::transfer::send_home_older_than(u64::MAX, true);
    }
    let me = thread::current_or_null();
    if !me.is_null() {
        // SAFETY: our own heap.
        unsafe { (*me).trim() };
    }
    heaps::visit_all(me, heaps::Busy::Wait, |h, l, who| {
        // SAFETY: `visit_all` hands over the page lists, and the heap
        // itself only with `Access::Owner`.
        unsafe { h.release_empty_pages(l, who, Hollow::Now) };
        if who == Access::Visitor {
            // Their caches are theirs alone: ask them to empty them.
            h.flush_requested
                .store(true, core::sync::atomic::Ordering::Relaxed);
        }
    });
    heaps::for_each_heap(|h| {
        if !core::ptr::eq(h, me) {
            h.trim_shared();
        }
    });
}

/// Meshes now: first what [`trim`] does, then a mesh pass over every
/// thread heap (docs/design.md, "Meshing"): OS pages of one size class
/// whose live slots sit at different offsets come to share one physical
/// page. Only with `PAGEWISE_MESH=1` (Linux); the background purger makes
/// such a pass once per decay period anyway, and a heap whose pass is
/// under way (paused for a thread that needed the heap) is left to it.
/// Other threads may go on writing: a store to a page while it is copied
/// waits for the copy. Returns the OS pages that joined groups (0 when
/// the global allocator does not mesh).
///
/// ```
/// // Without `PAGEWISE_MESH=1` nothing meshes.
/// # if std::env::var_os("PAGEWISE_MESH").is_none() {
/// assert_eq!(pagewise::mesh(), 0);
/// assert_eq!(pagewise::stats().meshed_bytes, 0);
/// # }
/// ```
pub fn mesh() -> usize {
    if !heaps::meshing() {
        return 0;
    }
    #[cfg(target_os = "linux")]
    crate::os::segv::ensure();
    trim();
    let mut joined = 0;
    heaps::visit_all(core::ptr::null(), heaps::Busy::Wait, |h, l, _| {
        // SAFETY: `visit_all` hands over the page lists; other threads'
        // stores wait in the barrier while a page is copied.
        joined += unsafe { h.mesh_pass(l, crate::heap::mesh::MeshWhen::Now, &heaps::VisitsHeld) };
    });
    joined
}

/// A snapshot of the global allocator's counters. Slots other threads
/// freed count as free at once, whichever heap they went to.
///
/// ```
/// let s = pagewise::stats();
/// assert!(s.committed_bytes >= s.retained_bytes);
/// ```
pub fn stats() -> Stats {
    stats_held_off(&crate::global::purger::hold_off())
}

/// [`stats()`], with the purger already kept out of its pass by the
/// caller. The pass is taken first, as the purger and the fork handlers
/// take it: no slot moves between the places counted below while they
/// are counted (a thread of the program may still move its own).
pub(crate) fn stats_held_off(_pass: &crate::global::purger::HeldOff) -> Stats {
    let me = thread::current_or_null();
    if !me.is_null() {
        // SAFETY: our own heap. Collecting what other threads freed into
        // it makes those slots count as free rather than live.
        unsafe { (*me).collect_remote(&mut (*me).lock_local(), Access::Owner) };
    }
    let mut s = Stats::ZERO;
    heaps::visit_all(me, heaps::Busy::Wait, |h, l, who| {
        if who == Access::Owner {
            // SAFETY: `visit_all` gives us the abandoned heap as its owner.
            unsafe { h.collect_remote(l, who) };
        }
        // Slots freed into a live thread's pages wait for it on the pages'
        // remote lists: counted free from there.
        s.add_pending_frees(&h.pending_remote(l));
    });
    s.syscalls = heaps::source().syscalls();
    s.limit_charged_bytes = crate::memory::budget::GLOBAL.charged() as u64;
    s.limit_peak_bytes = crate::memory::budget::GLOBAL.peak_charged() as u64;
    s.thp_bytes = crate::memory::budget::GLOBAL.huge.bytes() as u64;
    s.thp_splits = crate::memory::budget::GLOBAL.huge.splits();
    #[cfg(target_os = "linux")]
    if heaps::meshing() {
        use crate::os::source::SharePages;
        let (pages, groups) = heaps::SHARED.shared();
        let page = crate::memory::layout::os_page();
        s.meshed_bytes = (pages * page) as u64;
        s.mesh_saved_bytes = (pages.saturating_sub(groups) * page) as u64;
        s.mesh_mappings = heaps::SHARED.seams() as u64;
        s.mesh_guards_lost = heaps::SHARED.guards_lost();
        s.mesh_registrations_refused = heaps::SHARED.registrations_refused();
        (s.mesh_waits, s.mesh_longest_wait_us) = crate::os::barrier::waits();
        s.mesh_pauses = crate::heap::mesh::pauses();
    }
    {
        // Hold the reservation lock while peeking at current pages, so no
        // trim can unmap a segment under us (spans are locked per heap later,
        // after this lock is released: the span lock is always taken first
        // elsewhere).
        let _res = crate::global::heaps::RESERVATIONS.lock();
        heaps::for_each_heap(|h| {
            for (c, n) in h.empty_pages_by_class().iter().enumerate() {
                s.classes[c].retained_pages += *n as u64;
            }
        });
    }
    heaps::for_each_heap(|h| s.add_heap(h));
    s.add_transfer_cache();
    s.reserved_bytes = crate::global::heaps::RESERVATIONS.lock().reserved_bytes as u64;
    s.finish();
    s
}
