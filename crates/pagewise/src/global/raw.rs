//! Unsized entry points for C-style callers (`libpagewise.so`): sizes are
//! not passed back on free, and any thread may call any function.

use crate::global::thread;
use crate::heap::HeapCore;
use crate::memory::registry;

/// Allocates `size` bytes (0 is served as 1) aligned to `align` (a power
/// of two). Null when out of memory or for an impossible request.
///
/// # Safety
/// `align` is a power of two.
///
/// ```
/// // SAFETY: 16 is a power of two; the block is freed below.
/// unsafe {
///     let p = pagewise::raw::malloc(24, 16);
///     assert!(!p.is_null());
///     pagewise::raw::free(p);
/// }
/// ```
#[inline]
pub unsafe fn malloc(size: usize, align: usize) -> *mut u8 {
    // SAFETY: forwarded.
    let p = unsafe { malloc_cached(size, align) };
    if !p.is_null() {
        return p;
    }
    // SAFETY: forwarded.
    unsafe { malloc_uncached(size, align) }
}

/// [`malloc`] from the calling thread's cache only: a request of up to
/// 256 KiB (a slab class) with an alignment of at most 16, when the thread
/// has a heap and the class's cache a slot. Null otherwise (then call
/// [`malloc_uncached`]; null here says nothing about memory running out).
/// Starts no thread and takes no lock: the C library's `malloc` fast path,
/// with no register to save. (The hardened build, whose checks cost more
/// than a call, also takes a slot from the class's current page here when
/// the cache has none, and may then take the heap's own lock as any
/// allocation does.)
///
/// # Safety
/// `align` is a power of two.
///
/// ```
/// // SAFETY: 16 is a power of two; blocks are freed once.
/// unsafe {
///     // The first allocations take the slow path (it makes the heap, then
///     // starts the purger).
///     pagewise::raw::free(pagewise::raw::malloc(100, 16));
///     let p = pagewise::raw::malloc(100, 16);
///     pagewise::raw::free(p);
///     let q = pagewise::raw::malloc_cached(100, 16);
///     // The slot just freed is in this thread's cache.
///     #[cfg(not(feature = "secure"))]
///     assert_eq!(q, p);
///     // The hardened build hands a freed slot out again only after more
///     // frees of its class, and takes another from the class's page.
///     #[cfg(feature = "secure")]
///     assert!(!q.is_null() && q != p);
///     assert!(pagewise::raw::malloc_cached(1 << 20, 16).is_null(), "too big for this path");
///     pagewise::raw::free(q);
/// }
/// ```
#[inline(always)]
pub unsafe fn malloc_cached(size: usize, align: usize) -> *mut u8 {
    // The hardened build arms the slot on the way out.
    #[cfg(feature = "secure")]
    {
        // A thread without a heap finds the empty one, and a request for
        // the purger sends the class to the state that caches nothing
        // (`HeapCore::alloc_cached_at`): `alloc_cached` returns null for
        // both, with no test for either on the way to a cached slot.
        let heap = thread::current_or_empty();
        if align > 16 {
            return core::ptr::null_mut();
        }
        // SAFETY: the calling thread's own heap or the empty one.
        unsafe { crate::secure::alloc_cached(heap, size) }
    }
    #[cfg(not(feature = "secure"))]
    {
        // A thread without a heap finds the empty one, whose caches are
        // empty, and a request for the purger makes the small sizes find
        // an empty cache too (`HeapCore::alloc_cached16`): no test for
        // either here.
        let heap = thread::current_or_empty();
        if align > 16 {
            return core::ptr::null_mut();
        }
        // SAFETY: the calling thread's own heap or the empty one.
        unsafe { HeapCore::alloc_cached16(heap, size) }
    }
}

/// [`malloc`] past the cache: starts the purger if a free asked for it,
/// makes the thread's heap if it has none. Null when out of memory or for
/// an impossible request.
///
/// # Safety
/// `align` is a power of two.
///
/// ```
/// // SAFETY: 16 is a power of two; the block is freed below.
/// unsafe {
///     let p = pagewise::raw::malloc_uncached(3 << 20, 16);
///     assert!(!p.is_null());
///     pagewise::raw::free(p);
/// }
/// ```
#[inline(never)]
pub unsafe fn malloc_uncached(size: usize, align: usize) -> *mut u8 {
    // A small request whose class's cache was empty: its page, from the
    // thread's heap, with no second look at what the fast path looked at.
    #[cfg(not(feature = "secure"))]
    if align <= 16 {
        // SAFETY: the calling thread's own heap or the empty one.
        if let Some(p) = unsafe { HeapCore::alloc_missed16(thread::current_or_empty(), size) } {
            return p;
        }
    }
    // SAFETY: forwarded.
    unsafe { malloc_general(size, align) }
}

/// [`malloc_uncached`] for any other request: starts the purger if a free
/// asked for it, makes the thread's heap if it has none. Out of line in
/// the default build, so that a small request's way to its page saves no
/// register.
///
/// # Safety
/// As [`malloc`].
#[cfg_attr(feature = "secure", inline(always))]
#[cfg_attr(not(feature = "secure"), inline(never))]
unsafe fn malloc_general(size: usize, align: usize) -> *mut u8 {
    crate::global::purger::poll();
    #[cfg(feature = "secure")]
    // SAFETY: `alloc_below` returns null or a live block of the size.
    return unsafe { crate::secure::alloc(size, align, false, |n, a, z| alloc_below(n, a, z)) };
    #[cfg(not(feature = "secure"))]
    // SAFETY: forwarded.
    unsafe {
        malloc_plain(size, align)
    }
}

/// [`malloc_uncached`] below the hardened layer.
///
/// # Safety
/// As [`malloc`].
unsafe fn malloc_plain(size: usize, align: usize) -> *mut u8 {
    // SAFETY: `with_heap` lends the calling thread's own heap.
    thread::with_heap(|h| unsafe { h.alloc(size.max(1), align) }).unwrap_or(core::ptr::null_mut())
}

/// Frees a block from any pagewise heap (null is ignored).
///
/// # Safety
/// `ptr` is null or a live pagewise allocation; misuse that is detected
/// aborts with a message (see [`crate::fault`]).
///
/// ```
/// // SAFETY: 8 is a power of two; the block is freed once.
/// unsafe {
///     let p = pagewise::raw::malloc(100, 8);
///     pagewise::raw::free(p);
///     pagewise::raw::free(core::ptr::null_mut()); // ignored
/// }
/// ```
#[inline]
pub unsafe fn free(ptr: *mut u8) {
    #[cfg(feature = "secure")]
    {
        if ptr.is_null() {
            return;
        }
        // SAFETY: forwarded.
        unsafe { free_hardened(ptr) }
    }
    // Null is ruled out past the cache: the registry's test that takes a
    // slot into the cache takes no null, and the free past it ignores null
    // (`free_uncached`), so a free of a block makes no test for it.
    #[cfg(not(feature = "secure"))]
    // SAFETY: forwarded.
    unsafe {
        free_plain(ptr)
    }
}

/// The hardened [`free`] of a block that is not null: out of line, so
/// that a free of null (a quarter of lua5.4's) returns before the checks
/// save the registers they use.
///
/// # Safety
/// As [`free`].
#[cfg(feature = "secure")]
#[inline(never)]
unsafe fn free_hardened(ptr: *mut u8) {
    let heap = thread::current_or_empty();
    // SAFETY: forwarded; the heap is the calling thread's or the empty
    // one, and `free_uncached` frees a live block.
    unsafe { crate::secure::free(ptr, heap, |p, current| free_uncached(p, current)) }
}

/// [`free`] below the hardened layer (null is ignored).
///
/// # Safety
/// As [`free`].
#[inline(always)]
#[cfg_attr(feature = "secure", allow(dead_code))]
unsafe fn free_plain(ptr: *mut u8) {
    // One test for null and for an address past the registry's map, the
    // one the cache's lookup below starts with (and so makes no more):
    // a free of a block makes no test for null of its own, and a free of
    // null still returns after a few instructions.
    if !registry::index_in_range(registry::index_below(ptr as usize)) {
        // SAFETY: forwarded.
        return unsafe { free_null_or_far(ptr) };
    }
    // A thread without a heap finds the empty one, whose caches take no
    // slot: no test for it here.
    let current = thread::current_or_empty();
    // SAFETY: forwarded; the current heap is the calling thread's or the
    // empty one.
    if unsafe { HeapCore::free_to_cache_or_empty(ptr, current) } {
        return;
    }
    // SAFETY: as above; a tail call keeps the fast path free of spills.
    unsafe { free_uncached(ptr, thread::current_or_null()) }
}

/// [`free_plain`] of null (ignored) or of an address past the registry's
/// map (never pagewise's: the path past the cache says what it is).
///
/// # Safety
/// As [`free`].
#[cold]
#[inline(never)]
#[cfg_attr(feature = "secure", allow(dead_code))]
unsafe fn free_null_or_far(ptr: *mut u8) {
    if !ptr.is_null() {
        // SAFETY: forwarded.
        unsafe { free_uncached(ptr, thread::current_or_null()) }
    }
}

/// A free the thread cache did not take.
///
/// # Safety
/// As [`free`]; `current` is the calling thread's heap or null.
#[inline(never)]
unsafe fn free_uncached(ptr: *mut u8, current: *mut HeapCore) {
    // SAFETY: forwarded.
    if unsafe { thread::free_past_cache(ptr, current) } {
        crate::global::purger::request();
    }
}

/// Allocates `size` zeroed bytes aligned to `align`. Memory pagewise knows
/// to be zero (never touched, or purged with `MADV_DONTNEED`) is not
/// written, so a large `calloc` stays out of RSS until it is used.
///
/// # Safety
/// `align` is a power of two.
///
/// ```
/// // SAFETY: 8 is a power of two; freed below.
/// unsafe {
///     let p = pagewise::raw::calloc(10 << 20, 8);
///     assert_eq!(p.add(5 << 20).read(), 0);
///     pagewise::raw::free(p);
/// }
/// ```
pub unsafe fn calloc(size: usize, align: usize) -> *mut u8 {
    #[cfg(feature = "secure")]
    {
        // SAFETY: `align` is a power of two (caller); the block holds `size`
        // bytes.
        let p = unsafe { malloc_cached(size, align) };
        if !p.is_null() {
            // SAFETY: as above.
            unsafe { crate::secure::unchecked::zero(p, size) };
            return p;
        }
    }
    crate::global::purger::poll();
    #[cfg(feature = "secure")]
    // SAFETY: `alloc_below` returns null or a live block of the size.
    return unsafe { crate::secure::alloc(size, align, true, |n, a, z| alloc_below(n, a, z)) };
    #[cfg(not(feature = "secure"))]
    // SAFETY: forwarded.
    unsafe {
        calloc_plain(size, align)
    }
}

/// [`malloc`] or, with `zeroed`, [`calloc`] below the hardened layer
/// (which asks for a block zeroed here only past a slot's size).
///
/// # Safety
/// As [`malloc`].
#[cfg(feature = "secure")]
unsafe fn alloc_below(size: usize, align: usize, zeroed: bool) -> *mut u8 {
    // SAFETY: forwarded.
    unsafe {
        if zeroed {
            calloc_plain(size, align)
        } else {
            malloc_plain(size, align)
        }
    }
}

/// [`calloc`] below the hardened layer.
///
/// # Safety
/// As [`calloc`].
unsafe fn calloc_plain(size: usize, align: usize) -> *mut u8 {
    // SAFETY: `with_heap` lends the calling thread's own heap.
    thread::with_heap(|h| unsafe { h.alloc_zeroed(size.max(1), align) })
        .unwrap_or(core::ptr::null_mut())
}

/// Resizes a block (contents preserved up to the smaller size), in place
/// when possible. Null `ptr` allocates. Returns null on failure, leaving
/// the block untouched.
///
/// # Safety
/// `ptr` is null or a live pagewise allocation; `align` is a power of two.
///
/// ```
/// // SAFETY: live blocks only.
/// unsafe {
///     let p = pagewise::raw::malloc(10, 8);
///     p.write(42);
///     let q = pagewise::raw::realloc(p, 5000, 8);
///     assert_eq!(q.read(), 42);
///     pagewise::raw::free(q);
/// }
/// ```
#[inline]
pub unsafe fn realloc(ptr: *mut u8, new_size: usize, align: usize) -> *mut u8 {
    if ptr.is_null() {
        // SAFETY: forwarded.
        return unsafe { malloc(new_size, align) };
    }
    crate::global::purger::poll();
    #[cfg(feature = "secure")]
    // SAFETY: forwarded; the closures allocate and free live blocks, the
    // block moved away from through the program's own `free`.
    return unsafe {
        crate::secure::realloc(ptr, new_size, align, |n, a| malloc(n, a), |p| free(p))
    };
    #[cfg(not(feature = "secure"))]
    // SAFETY: forwarded.
    unsafe {
        realloc_plain(ptr, new_size, align)
    }
}

/// [`realloc`] below the hardened layer, of a block that is not null: a
/// slot the thread cache takes in line, the rest out of line (a tail
/// call), so that the slot's path saves no argument for the other.
///
/// # Safety
/// As [`realloc`].
#[cfg(not(feature = "secure"))]
#[inline(always)]
unsafe fn realloc_plain(ptr: *mut u8, new_size: usize, align: usize) -> *mut u8 {
    // SAFETY: forwarded.
    let moved = unsafe { realloc_cached_slot(ptr, usize::MAX, new_size.max(1), align) };
    if !moved.is_null() {
        return moved;
    }
    // SAFETY: forwarded.
    unsafe { realloc_general(ptr, new_size, align) }
}

/// [`realloc_plain`] of any block, through the heap.
///
/// # Safety
/// As [`realloc`].
#[cfg(not(feature = "secure"))]
#[inline(never)]
unsafe fn realloc_general(ptr: *mut u8, new_size: usize, align: usize) -> *mut u8 {
    // SAFETY: `with_heap` lends the calling thread's own heap; `ptr` is
    // live (caller); the usable size bounds what the caller may have
    // written, so it is the size to preserve.
    thread::with_heap(|h| unsafe {
        let old = HeapCore::usable_size(ptr);
        h.realloc(ptr, old, align, new_size.max(1), h)
    })
    .unwrap_or(core::ptr::null_mut())
}

/// [`realloc_plain`] of a slot the thread cache takes, to a size a slot
/// serves, on the fast paths alone: its size from the slab table (as a
/// free reads it), and if it moves, the new slot as the calling thread's
/// heap gives it (its cache, else the class's page, with no second look at
/// the heap or the size) and the old one into the cache. A program that builds text and then trims it
/// (python3's strings are allocated with room to grow and shrunk to fit)
/// resizes this way all the time. Null if the block is not such a slot or
/// the size not such a size (then the general path decides), or if the
/// allocation failed (which the general path then reports). The caller has
/// polled the purger ([`crate::global::purger::poll`]).
///
/// `old` bounds the bytes to keep (`usize::MAX`: the whole slot, for a
/// caller that does not know the size it asked for).
///
/// # Safety
/// As [`realloc`], `ptr` not null, `new_size` not 0; `ptr` holds `old`
/// bytes the program may have written, if it is a slot.
#[cfg(not(feature = "secure"))]
#[inline(always)]
pub(crate) unsafe fn realloc_cached_slot(
    ptr: *mut u8,
    old: usize,
    new_size: usize,
    align: usize,
) -> *mut u8 {
    use crate::memory::size_class::{class_of, SMALL_MAX};
    if align > 16 || new_size > SMALL_MAX {
        return core::ptr::null_mut();
    }
    let current = thread::current_or_empty();
    // SAFETY: the calling thread's own heap or the empty one; `ptr` is live
    // (caller).
    let (slot, word) = unsafe { HeapCore::cached_slot(current, ptr as usize) };
    if slot == 0 {
        return core::ptr::null_mut();
    }
    // A slot found: `current` is the calling thread's own heap (the empty
    // one's states pass none).
    if crate::heap::large::stays_in_place(slot, new_size) {
        return ptr;
    }
    // SAFETY: a power of two at most 16; both blocks live and distinct,
    // the old one holding `slot` bytes the program may have written. The
    // new slot is the one the calling thread's own heap gives a request
    // of this size and alignment (`HeapCore::alloc`): from the thread
    // cache, else from the class's page, without `malloc`'s second look
    // at the heap, the size and the purger (polled on the way in).
    // The free is `free`'s, with the heap, the segment and the slot's start
    // already in hand: only the page's word is read again.
    unsafe {
        let new = (*current).alloc_small(class_of(new_size), new_size, align);
        if !new.is_null() {
            core::ptr::copy_nonoverlapping(ptr, new, slot.min(old).min(new_size));
            if !HeapCore::free_seen_to_cache(ptr, current, word) {
                free_uncached(ptr, current);
            }
        }
        new
    }
}

/// Usable size of a live block.
///
/// # Safety
/// `ptr` is a live pagewise allocation.
///
/// ```
/// // SAFETY: 8 is a power of two; the block is live until freed.
/// unsafe {
///     let p = pagewise::raw::malloc(100, 8);
///     assert!(pagewise::raw::usable_size(p) >= 100);
///     pagewise::raw::free(p);
/// }
/// ```
#[inline]
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

/// Resizes a live block to hold at least `new_size` bytes without moving
/// it, if it can: a large block (above 256 KiB, up to 32 MiB) of a thread
/// heap (whichever thread allocated it) grows over the free slices after it
/// or gives back its tail. Returns whether it did; the block is untouched
/// when not (small and huge blocks, blocks of an owned heap or an arena, a
/// sampled block, the hardened build's blocks). jemalloc's `xallocx` is built on it; [`usable_size`]
/// tells the size after.
///
/// # Safety
/// `ptr` is a live pagewise allocation.
///
/// ```
/// // SAFETY: a live block, freed once.
/// unsafe {
///     let p = pagewise::raw::malloc(512 << 10, 16);
///     if pagewise::raw::resize_in_place(p, 1 << 20) {
///         assert!(pagewise::raw::usable_size(p) >= 1 << 20);
///     }
///     assert!(!pagewise::raw::resize_in_place(p, 64 << 20), "huge: never in place");
///     pagewise::raw::free(p);
/// }
/// ```
pub unsafe fn resize_in_place(ptr: *mut u8, new_size: usize) -> bool {
    #[cfg(feature = "secure")]
    if true {
        // The hardened block's canary sits right after the request.
        let _ = (ptr, new_size);
        return false;
    }
    // SAFETY: `with_heap` lends the calling thread's own heap; `ptr` is
    // live (caller), and only a block of a thread heap is resized, under
    // the span lock of the heap it belongs to.
    thread::with_heap(|h| unsafe { h.resize_large_in_place(ptr, new_size) }).unwrap_or(false)
}

/// The hardened build's quarantine, at most: a small block a thread frees
/// is handed out again only after 16 KiB of its size class's slots, from 2
/// to this many, were freed by the thread after it (this many up to 1 KiB
/// slots, 8 at 2 KiB, 4 at 4 KiB, 2 from 8 KiB). The block waits in the
/// thread's cache of its class, oldest first.
///
/// ```
/// assert!(pagewise::raw::QUARANTINE >= 8);
/// ```
#[cfg(feature = "secure")]
pub const QUARANTINE: usize = crate::secure::QUARANTINE;

/// The hardened build's check of a write of `len` bytes at `dst`, which
/// the hardened C library's `memcpy`, `memmove` and `memset` make before
/// writing: if `dst` lies in a pagewise block and the write would run past
/// the block's end (its slot, span or run), the process stops with an
/// overflow report. A write into the block's slack past the request is
/// found at its free (the canary). Reads no byte of the block.
///
/// ```
/// // SAFETY: 16 is a power of two; the block is freed below.
/// unsafe {
///     let p = pagewise::raw::malloc(100, 16);
///     pagewise::raw::check_write(p, 100); // in the block: returns
///     let x = [0u8; 64];
///     pagewise::raw::check_write(x.as_ptr(), 1 << 20); // not pagewise's
///     pagewise::raw::free(p);
/// }
/// ```
#[cfg(feature = "secure")]
#[inline(always)]
pub fn check_write(dst: *const u8, len: usize) {
    crate::secure::check_write(dst, len);
}

/// The part of [`check_write`] that makes no call: true if a write of
/// `len` bytes at `dst` is known to stay in its block (it stays in the 16
/// bytes its first byte lies in, `dst` is not pagewise's, or it ends by
/// the end of the slot holding `dst`); false leaves it to
/// [`check_write`], which looks the block up or reports the overflow. A C
/// `memcpy` that asks this first and calls out only when it is false
/// saves no register on its common path.
///
/// ```
/// // SAFETY: 16 is a power of two; the block is freed below.
/// unsafe {
///     let p = pagewise::raw::malloc(100, 16);
///     assert!(pagewise::raw::write_fits_in_line(p, 100)); // in its slot
///     assert!(pagewise::raw::write_fits_in_line(p.add(99), 1));
///     let x = [0u8; 64];
///     assert!(pagewise::raw::write_fits_in_line(x.as_ptr(), 1 << 20)); // not pagewise's
///     assert!(!pagewise::raw::write_fits_in_line(p, 1 << 20)); // for check_write
///     pagewise::raw::free(p);
/// }
/// ```
#[cfg(feature = "secure")]
#[inline(always)]
pub fn write_fits_in_line(dst: *const u8, len: usize) -> bool {
    crate::secure::write_fits_in_line(dst, len)
}

/// The hardened build's own fills and copies inside blocks (the wipe of a
/// freed block, `calloc`'s zeroing, `realloc`'s copy) call these, the C
/// library's unchecked `memset` and `memcpy`, rather than whatever the
/// process's `memset` and `memcpy` are: the hardened C library's are
/// checked ([`check_write`]), and looking the block up again for a write
/// the allocator knows to be inside it would be wasted. The hardened C
/// library calls this when it loads; without it, Rust's are used.
///
/// ```
/// use core::ffi::{c_int, c_void};
/// unsafe extern "C" fn fill(d: *mut c_void, c: c_int, n: usize) -> *mut c_void {
///     // SAFETY: as C's `memset` (the caller's contract).
///     unsafe { core::ptr::write_bytes(d.cast::<u8>(), c as u8, n) };
///     d
/// }
/// unsafe extern "C" fn copy(d: *mut c_void, s: *const c_void, n: usize) -> *mut c_void {
///     // SAFETY: as C's `memcpy` (the caller's contract).
///     unsafe { core::ptr::copy_nonoverlapping(s.cast::<u8>(), d.cast::<u8>(), n) };
///     d
/// }
/// pagewise::raw::use_unchecked_mem(fill, copy);
/// // SAFETY: a live block, freed once.
/// unsafe {
///     let p = pagewise::raw::calloc(1000, 16);
///     assert_eq!(*p.add(999), 0);
///     pagewise::raw::free(p);
/// }
/// ```
#[cfg(feature = "secure")]
pub fn use_unchecked_mem(
    memset: unsafe extern "C" fn(
        *mut core::ffi::c_void,
        core::ffi::c_int,
        usize,
    ) -> *mut core::ffi::c_void,
    memcpy: unsafe extern "C" fn(
        *mut core::ffi::c_void,
        *const core::ffi::c_void,
        usize,
    ) -> *mut core::ffi::c_void,
) {
    crate::secure::unchecked::set(memset, memcpy);
}

/// Whether `ptr` lies in memory pagewise manages (it may still be free).
///
/// ```
/// let x = 5;
/// assert!(!pagewise::raw::owns(&x as *const i32 as *const u8));
/// ```
pub fn owns(ptr: *const u8) -> bool {
    registry::header_of(ptr as usize).is_some() || crate::guard::owns(ptr as usize)
}

/// The usable size a request of `size` bytes at `align` (a power of two)
/// gets: the slot size of its class for small requests, whole 64 KiB slices
/// for large ones, whole OS pages for huge ones. What
/// [`usable_size`] reports for the block [`malloc`] returns (the C
/// library's `malloc_good_size`, jemalloc's `nallocx`). A request no heap
/// can serve (above `isize::MAX / 2`) answers `size` itself, and so does
/// every request in the hardened build, whose blocks are exactly the
/// request (the rest of a block holds its canary).
///
/// ```
/// // Rounded up to the slot, the slices or the pages that serve it.
/// #[cfg(not(feature = "secure"))]
/// {
///     assert_eq!(pagewise::raw::good_size(100, 16), 112);
///     assert_eq!(pagewise::raw::good_size(0, 16), 16);
///     assert_eq!(pagewise::raw::good_size(300 << 10, 16), 320 << 10);
/// }
/// // The hardened build's blocks are the request (see above).
/// #[cfg(feature = "secure")]
/// assert_eq!(pagewise::raw::good_size(100, 16), 100);
/// // In both builds, the size `usable_size` reports.
/// // SAFETY: 16 is a power of two; freed below.
/// unsafe {
///     let p = pagewise::raw::malloc(5000, 16);
///     assert_eq!(pagewise::raw::usable_size(p), pagewise::raw::good_size(5000, 16));
///     pagewise::raw::free(p);
/// }
/// ```
pub fn good_size(size: usize, align: usize) -> usize {
    // The hardened build's blocks are exactly the request (the rest is
    // the canary's).
    #[cfg(feature = "secure")]
    if true {
        let _ = align;
        return size;
    }
    use crate::memory::layout::{align_up, os_page, LARGE_ALIGN_MAX, LARGE_MAX, SLICE};
    use crate::memory::size_class::{class_for, class_of, SLOT_SIZE, SMALL_MAX};
    let size = size.max(1);
    // The dispatch of `HeapCore::alloc`, `alloc_span` and `take_huge`.
    if size <= SMALL_MAX {
        let class = if align <= 16 {
            Some(class_of(size))
        } else {
            class_for(size, align)
        };
        if let Some(c) = class {
            return SLOT_SIZE[c] as usize;
        }
    }
    if size <= LARGE_MAX && align <= LARGE_ALIGN_MAX {
        let n = size.div_ceil(SLICE);
        if n + (align / SLICE).max(1) - 1 <= crate::memory::spans::SPAN_SLICES {
            return n * SLICE;
        }
    }
    if size > isize::MAX as usize / 2 {
        return size;
    }
    align_up(size, os_page())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_size_is_the_usable_size_malloc_gives() {
        let mut sizes: Vec<usize> = (0..=2048).collect();
        let mut s = 2048;
        while s < (80 << 20) {
            sizes.extend([s - 1, s, s + 1]);
            s = s * 5 / 4;
        }
        for align in [16, 64, 4096, 1 << 17, 1 << 21] {
            for &size in &sizes {
                // SAFETY: `align` is a power of two; the block is freed below.
                unsafe {
                    let p = malloc(size, align);
                    assert!(!p.is_null());
                    let usable = usable_size(p);
                    free(p);
                    assert_eq!(good_size(size, align), usable, "size {size} align {align}");
                }
            }
        }
        assert_eq!(good_size(usize::MAX, 16), usize::MAX);
    }
}
