//! The hardened build (the `secure` feature): checks around every block
//! the global allocator and the C library hand out (docs/hardening.md has
//! what each check catches and what they cost).
//!
//! Every block is allocated at least a byte longer than asked, and its end
//! carries a tail word (`canary.rs`) saying where the requested bytes end,
//! encoded with the process's secret; the bytes between the request and the
//! tail hold a canary. A slot with fewer than eight bytes spare has a short
//! tail instead: canary bytes and a last byte saying how many are spare. A free or realloc checks both, so a write past the
//! end, of one byte or many, is reported at the latest when the block is
//! freed, and a free checks the word before its block too (the end of the
//! slot before: an underflow). A free then wipes what the block's owner
//! wrote and marks it (`wipe.rs`), and the slot is checked when it is
//! handed out again: a write after free is reported then. A freed slot
//! waits in its thread's cache for its class's depth of later frees
//! (`heap/cache/fifo.rs`) before it can be handed out again. A block above 256 KiB sits between guard pages
//! (`fence.rs`; a thread keeps the spans of the last few it freed, the
//! blocks made inaccessible, `kept.rs`). `malloc(0)` is a block that
//! faults (`zero.rs`), and the C library's `memcpy` family asks
//! [`check_write`] first (`bounds.rs`).
//!
//! A block freed twice is reported at its second free, decided in one
//! place ([`block_is_free`]) before any byte of the block is read: the
//! hardened layer records each block start it hands out and clears the
//! record at its free (`live.rs`, a bitmap apart from the blocks, which a
//! write after free cannot reach), so a slot freed, one carved and never
//! handed out, and a live one are told apart there. Only where that
//! record's mapping was refused does the free read the slot's free key
//! (`memory/block.rs`) instead. Free-list links are encoded there too.
//!
//! The checks run on the fast paths: an allocation from the thread cache
//! (or, when it is empty, from its class's current page) knows its slot's
//! size from its class, and a free finds its slot through the slab table,
//! as the cache's free does; only the other paths look the block up. The layer sits at the entry points (`global/allocator.rs`,
//! `global/raw.rs`); the heaps below it allocate the longer block and never
//! see the canaries. Owned `Heap`s are not hardened.

mod bounds;
mod canary;
mod fence;
mod kept;
pub(crate) mod link;
mod live;
pub(crate) mod unchecked;
mod wipe;
mod zero;

pub use kept::Kept;
/// Later frees of its class a freed slot waits for at most before its
/// thread hands it out again (a small class's; `heap/cache/fifo.rs`).
pub const QUARANTINE: usize = crate::heap::cache::DEPTH_MOST;

use crate::fault::{misuse, Misuse};
use crate::heap::cache::ClassState;
use crate::heap::{HeapCore, STATES_OFFSET};
use crate::memory::layout::segment_base;
use crate::memory::page::Block;
use crate::memory::registry;
use crate::memory::segment::{Segment, STATE_SHIFT};
use crate::memory::size_class::{SLOT_SIZE, SMALL_MAX};
use core::ptr::null_mut;

/// The per-process secret, without drawing it (0 before the first heap is
/// made): a load, since the hardened paths only ever meet blocks a heap
/// made, after the secret was drawn.
#[inline(always)]
pub fn secret_now() -> usize {
    crate::memory::block::SECRET.load(core::sync::atomic::Ordering::Relaxed)
}

/// Bytes of a tail word, which a block with that many spare bytes gets;
/// a large block (above a slot's sizes) always gets one.
pub const TAIL: usize = 8;

use canary::{Keys, MIN_SLACK};

/// The hardened allocation's fast path: a slot of more than `size` bytes from
/// the thread cache of `heap` (or, when the class's cache is empty, from
/// its current page), aligned to 16, cleared of the heap's words and
/// armed. Null if the request is too big for a slot or of zero bytes, if
/// `heap` is the empty heap or the background purger waits to be started
/// (`HeapCore::alloc_cached_at`), or if no slot could be had (then take
/// [`alloc`]).
///
/// # Safety
/// `heap` is the calling thread's own heap, or `crate::heap::empty_heap`.
#[inline(always)]
pub unsafe fn alloc_cached(heap: *const HeapCore, size: usize) -> *mut u8 {
    // Zero bytes (a block that faults when touched) or too big: not here.
    if size.wrapping_sub(1) >= crate::heap::alloc::CACHED_MAX - TAIL {
        return null_mut();
    }
    // SAFETY: our own heap or the empty one (caller); `size + MIN_SLACK` is
    // 2 to CACHED_MAX.
    unsafe {
        let (p, state_at) = HeapCore::alloc_cached_at(heap, size + MIN_SLACK);
        if p.is_null() {
            return alloc_from_page(heap, size, state_at);
        }
        // A slot of the class, just taken from the cache: a state that
        // holds a slot is one of a class below CLASSES.
        let class = (state_at >> STATE_SHIFT) - 1;
        hand_out(p, size, *SLOT_SIZE.get_unchecked(class) as usize, true);
        p
    }
}

/// [`alloc_cached`] when the cache of the class whose state is `state_at`
/// bytes into the heap's states is empty: a slot from the class's current
/// page (where a program that allocates more than it frees takes most of
/// its blocks), else the heap's slow path. Null when out of memory, and
/// when `heap` is the empty heap or `state_at` is 0 (the purger waits:
/// the caller's slow path starts it).
///
/// # Safety
/// As [`alloc_cached`]; `state_at` is what `HeapCore::alloc_cached_at`
/// gave for `size + MIN_SLACK`.
#[inline(never)]
unsafe fn alloc_from_page(heap: *const HeapCore, size: usize, state_at: usize) -> *mut u8 {
    if state_at == 0 || core::ptr::eq(heap, crate::heap::empty_heap()) {
        return null_mut();
    }
    let class = (state_at >> STATE_SHIFT) - 1;
    // SAFETY: our own heap; `class` fits `size + MIN_SLACK` (caller).
    unsafe {
        let p = (*heap).alloc_past_cache_of(class, size + MIN_SLACK);
        if !p.is_null() {
            hand_out_found(p, size);
        }
        p
    }
}

/// [`hand_out`] of a block just allocated below this layer, whose kind is
/// not known: a slot the slab table lists has its class's size (one load,
/// where the usable size would look the page up) and is checked for writes
/// since its free; any other block is looked up. Returns its usable bytes.
///
/// # Safety
/// `p` is a live block of more than `size` bytes, just handed out, a slot
/// or at least `size + TAIL` bytes.
#[inline(always)]
unsafe fn hand_out_found(p: *mut u8, size: usize) -> usize {
    // SAFETY: just handed out (caller).
    let (u, slot) = match unsafe { listed_class(p) } {
        // SAFETY: classes of the slab table are below CLASSES.
        Some(class) => (unsafe { *SLOT_SIZE.get_unchecked(class) } as usize, true),
        // SAFETY: a live block (caller).
        None => (unsafe { HeapCore::usable_size(p) }, false),
    };
    // SAFETY: a live block of `u` bytes that fit `size`, just handed out.
    unsafe { hand_out(p, size, u, slot) };
    u
}

/// Allocates `size` bytes at `align` (zeroed if `zeroed`) through
/// `inner(n, align, zero)` (which allocates the longer size `n`, zeroed if
/// `zero`), clears the heap's words in it, and arms the canary. Null if
/// `inner` fails, also once the spans the thread kept went back to the
/// heap ([`retried`]), or the size overflows.
///
/// A block up to a slot's size is zeroed here, after it is armed, and
/// only below its last word (where the arming zeroed the request's bytes
/// in the one store that wrote the tail): a zeroing below this layer
/// would write a slot's last word piecemeal while another thread freeing
/// the slot after it reads that word (`check_neighbour`), and take the
/// half-zeroed word for an underflow. Larger blocks are zeroed below,
/// where memory known to be zero is not written.
///
/// # Safety
/// `inner` returns null or a live block of at least the size it is given,
/// as [`HeapCore::usable_size`] measures it.
#[inline(never)]
pub unsafe fn alloc(
    size: usize,
    align: usize,
    zeroed: bool,
    inner: impl Fn(usize, usize, bool) -> *mut u8,
) -> *mut u8 {
    if size == 0 && align <= 16 {
        let p = zero::alloc();
        if !p.is_null() {
            return p;
        }
    }
    let Some(n) = size.checked_add(TAIL) else {
        return null_mut();
    };
    if fence::wanted(n) {
        // SAFETY: forwarded.
        return unsafe { alloc_fenced(size, n, align, zeroed, inner) };
    }
    // A slot needs a byte spare; a larger block (an aligned request a span
    // serves) has room for the tail word past it anyway.
    let n = size + MIN_SLACK;
    let zero_here = zeroed && n <= SMALL_MAX;
    let p = retried(|| inner(n, align, zeroed && !zero_here));
    if !p.is_null() {
        // SAFETY: a live block of at least `n` bytes, just handed out,
        // armed for `size`: its bytes below `size` and its last word are
        // the program's to zero.
        unsafe {
            let u = hand_out_found(p, size);
            if zero_here {
                unchecked::zero(p, size.min(u - TAIL));
            }
        }
    }
    p
}

/// [`alloc`] of a large or huge block of `n` bytes (`size` and the tail),
/// between guard pages (`fence.rs`).
///
/// # Safety
/// As [`alloc`].
#[inline(never)]
unsafe fn alloc_fenced(
    size: usize,
    n: usize,
    align: usize,
    zeroed: bool,
    inner: impl Fn(usize, usize, bool) -> *mut u8,
) -> *mut u8 {
    let off = fence::offset(align);
    let Some(outer) = fence::outer(n, off) else {
        return null_mut();
    };
    let page = crate::memory::layout::os_page();
    // A span this thread freed, still guarded, its block shut (its bytes
    // are not known to be zero; the kept spans' blocks start a page in).
    let heap = crate::global::thread::current_or_null();
    if !zeroed && off == page && !heap.is_null() {
        // SAFETY: our own heap; a kept span is a live guarded block's,
        // wiped, of `u >= outer` bytes.
        if let Some((b, u)) = unsafe { (*heap).kept.take(outer) } {
            // A block the heap does not see handed out: what the profiler
            // remembered of the span's last block is over.
            crate::profile::recent::reused(b as usize, b as usize + u);
            // SAFETY: as above.
            unsafe {
                let p = b.add(page);
                fence::reopen(p, u - 2 * page);
                hand_out(p, size, u - 2 * page, false);
                return p;
            }
        }
    }
    // Aligned to `off` (a page at least: the guards are whole OS pages).
    let b = retried(|| inner(outer, off, zeroed));
    if b.is_null() {
        return b;
    }
    // SAFETY: a live large span or huge run of at least `outer` bytes,
    // aligned to `off`, just handed out; the block of `u >= n` bytes at
    // `p` lies in it, between its two guard pages.
    unsafe {
        let p = b.add(off);
        let u = HeapCore::usable_size(b) - off - page;
        crate::profile::recent::block_placed(b as usize, p as usize, p as usize + u);
        fence::arm(p, u);
        hand_out(p, size, u, false);
        p
    }
}

/// `inner()`, and if it fails (out of memory, or refused by a limit) while
/// the calling thread keeps spans of freed large blocks (`kept.rs`, counted
/// as in use), `inner()` again once they went back to the heap.
#[inline]
fn retried(inner: impl Fn() -> *mut u8) -> *mut u8 {
    let p = inner();
    if !p.is_null() {
        return p;
    }
    let heap = crate::global::thread::current_or_null();
    // SAFETY: the calling thread's own heap, between operations.
    if heap.is_null() || !unsafe { give_back_kept(&*heap) } {
        return p;
    }
    inner()
}

/// Gives the spans `heap` kept back to the heap, made accessible: whether
/// there were any.
///
/// # Safety
/// `heap` is the calling thread's own heap, between operations.
unsafe fn give_back_kept(heap: &HeapCore) -> bool {
    let me = heap as *const HeapCore;
    let page = crate::memory::layout::os_page();
    let mut any = false;
    // SAFETY: owner only (caller); a kept span is a guarded block's,
    // wiped and shut, which nobody uses.
    unsafe {
        while let Some((b, u)) = heap.kept.drain() {
            fence::release(b.add(page), u - 2 * page);
            HeapCore::free_uncached(b, me);
            any = true;
        }
    }
    any
}

/// If `p` starts a slot of a slab page of a thread heap whose slots the
/// thread caches take, its class and its offset in its page (the slab
/// table says so, as the cache's free path reads it; a page with purged or
/// meshed OS pages is left out, and its slots are not checked). A page
/// meshed after its word was read: `check_neighbour`.
#[inline(always)]
fn slot_of(p: *const u8) -> Option<(usize, usize)> {
    // A thread without a heap finds the empty heap's states, whose
    // geometry no offset passes: its lookups take the checked way.
    slot_word_of(p, crate::global::thread::current_or_empty())
        .map(|(class, offset, _)| (class, offset))
}

/// The class of the block `p` just handed out by the heap below, if its
/// page is one the slab table lists ([`slot_of`] without its test of
/// whether `p` starts a slot: a block the heap hands out starts one, and
/// one on a page the table does not list, such as a sampled block between
/// guard pages, is looked up).
///
/// # Safety
/// `p` is a block the heap below just handed out.
#[inline(always)]
unsafe fn listed_class(p: *const u8) -> Option<usize> {
    let addr = p as usize;
    if !registry::in_shared_segment(addr) {
        return None;
    }
    // SAFETY: a registered segment is mapped and headed by a `Segment`.
    let seg = unsafe { &*Segment::of(segment_base(addr)) };
    let (state_at, _) = seg.split_slab_word(seg.slab_word(addr), addr);
    // Slab-table entries hold `class + 1` for classes below CLASSES.
    (state_at != 0).then(|| (state_at >> STATE_SHIFT) - 1)
}

/// [`slot_of`], with the slab word it read (`Segment::slab_word`), the
/// offset tested against the slot geometry of `heap`'s class states: a
/// thread heap's pages, all of one size (one slice for most classes, more
/// in a heap whose regions may be huge pages, `size_class::HUGE_GEOMETRY`), as the
/// default build's free tests it. (With the table of one-slice pages, a
/// heap of larger pages had the slots past its pages' first slice looked
/// up the checked way, past the cache.)
#[inline(always)]
fn slot_word_of(p: *const u8, heap: *const HeapCore) -> Option<(usize, usize, usize)> {
    let addr = p as usize;
    if !registry::in_shared_segment(addr) {
        return None;
    }
    // SAFETY: a registered segment is mapped and headed by a `Segment`.
    let seg = unsafe { &*Segment::of(segment_base(addr)) };
    let (state_at, offset) = seg.split_slab_word(seg.slab_word(addr), addr);
    if state_at == 0 {
        return None;
    }
    // SAFETY: `heap` is a thread heap or the empty heap (caller), whose
    // states start `STATES_OFFSET` bytes in; a slab-table entry's state is
    // the byte offset of its class's state among them (`mark_slab`), the
    // same in every heap.
    let state = unsafe {
        let states = (heap as *const u8).wrapping_add(STATES_OFFSET);
        &*(states.add(state_at) as *const ClassState)
    };
    let class = (state_at >> STATE_SHIFT) - 1;
    state
        .starts_slot(offset)
        .then_some((class, offset, state_at))
}

/// Makes a block of `u` usable bytes just handed out a hardened block of
/// `size` bytes; with `slot`, after checking that nothing wrote to it since
/// it was freed (aborts if something did).
///
/// # Safety
/// `p` is a live block of `u` bytes that [`canary::fits`] `size`, just
/// handed out; with `slot`, a slot of a slab page just taken off a free
/// list.
#[inline(always)]
unsafe fn hand_out(p: *mut u8, size: usize, u: usize, slot: bool) {
    live::handed_out(p as usize);
    let keys = Keys::of(p as usize);
    // SAFETY: per the caller.
    unsafe {
        if slot {
            if let Err(at) = wipe::check_freed(p, u, keys) {
                misuse(Misuse::WriteAfterFree, at);
            }
        }
        wipe::clear_links(p, u);
        canary::arm_keyed(p, size, u, false, keys);
    }
}

/// A block handed back and checked ([`check`]).
struct Checked {
    /// The bytes the program asked for.
    size: usize,
    /// Its usable bytes, up to the end of its tail word.
    u: usize,
    /// What the heap below handed out for it: the block itself, or the
    /// span around a block between guard pages.
    below: *mut u8,
    /// Its offset in its page if it is a slot the slab table lists
    /// ([`slot_of`]).
    offset: Option<usize>,
}

/// Checks a block handed back (to free, realloc or `malloc_usable_size`):
/// aborts if it is free already or its end was overwritten. With
/// `freeing`, it is recorded freed ([`block_is_free`]).
///
/// # Safety
/// `p` is not null.
#[inline]
unsafe fn check(p: *mut u8, freeing: bool) -> Checked {
    // A slot the slab table lists has its class's size: one load, as
    // the free's fast path finds it, where the checked lookup walks the
    // segment's page descriptors (`malloc_usable_size`, which some
    // programs call at every allocation and free, takes this path).
    let offset = slot_of(p);
    // SAFETY: a slot of the slab table is mapped, of its class's size;
    // `usable_size_checked` aborts for anything but the start of a block
    // of a live span or slab page (or a sampled guarded block), whose `u`
    // bytes are then mapped; a fenced block lies two OS pages inside its
    // span.
    unsafe {
        let (below, u) = match offset {
            // Classes of the slab table are below CLASSES.
            Some((class, _)) => (p, *SLOT_SIZE.get_unchecked(class) as usize),
            None => match fence::start_of(p) {
                Some(b) => (
                    b,
                    HeapCore::usable_size_checked(b)
                        .saturating_sub(p as usize - b as usize + crate::memory::layout::os_page()),
                ),
                None => (p, HeapCore::usable_size_checked(p)),
            },
        };
        // A huge run freed (and cached) has no size; a block freed twice
        // is recorded so (one kept shut is not read).
        if u < TAIL || block_is_free(p, u, freeing) {
            // A page of a block between guard pages taken for an aligned
            // block's start is the middle of that block.
            if below != p && fence::inside_live_block(below, p) {
                misuse(Misuse::Misaligned, p as usize);
            }
            misuse(Misuse::DoubleFree, p as usize);
        }
        Checked {
            size: verified(p, u),
            u,
            below,
            offset: offset.map(|(_, offset)| offset),
        }
    }
}

/// What to free below this layer for the block `p` checked as `c`, wiped:
/// the block, or its span with the guard pages made accessible again.
///
/// # Safety
/// As [`check`]'s result for `p`, which the program no longer uses.
#[inline]
unsafe fn below(p: *mut u8, c: &Checked) -> *mut u8 {
    if c.below != p {
        // SAFETY: a guarded block of `c.u` bytes (`check`).
        unsafe { fence::disarm(p, c.u) };
    }
    c.below
}

/// The requested size of the block of `u` bytes at `p`, after checking
/// its tail and canary (aborts if they were overwritten).
///
/// # Safety
/// `p` is a live block of `u` bytes.
#[inline(always)]
unsafe fn verified(p: *mut u8, u: usize) -> usize {
    // SAFETY: forwarded.
    unsafe { verified_keyed(p, u, Keys::of(p as usize)) }
}

/// [`verified`] with the block's keys computed already.
///
/// # Safety
/// As [`verified`]; `keys` are `Keys::of(p)`.
#[inline(always)]
unsafe fn verified_keyed(p: *mut u8, u: usize, keys: Keys) -> usize {
    // SAFETY: per the caller.
    match unsafe { canary::verify_keyed(p, u, keys) } {
        Ok(size) => size,
        Err((kind, at)) => refused(kind, at),
    }
}

/// Aborts with what [`verified`] found wrong at `at` (in a block
/// [`block_is_free`] found live: a slot freed is never judged by its
/// bytes).
#[cold]
#[inline(never)]
fn refused(kind: Misuse, at: usize) -> ! {
    misuse(kind, at)
}

/// Whether the block `p` of `u` usable bytes is not live: not recorded
/// handed out (`live.rs`: freed, or a slot carved and never handed out),
/// read without a load of the block; only where the record was refused,
/// a slot holding a free key (a slot carved and never handed out has
/// one). With `freeing` (a free of `p`), it is recorded free now: of two
/// frees of a block racing on two threads, one finds the other's record.
/// The one place that decides it, before any check reads the block's
/// bytes: a write after free can
/// overwrite all of a slot's (its key, and the free slot's tail word at
/// its end), and a slot whose bytes were judged first would be reported as
/// a live block written past its end; a large block kept shut
/// (`fence::shut`) cannot be read at all.
///
/// # Safety
/// `p` starts a block of `u` bytes of a live slab page or large span or
/// huge run (a slot of two words at least, readable).
#[inline(always)]
unsafe fn block_is_free(p: *mut u8, u: usize, freeing: bool) -> bool {
    // SAFETY: forwarded.
    unsafe { judged(p, u, freeing) == Judged::Free }
}

/// What [`block_is_free`] found, and how.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Judged {
    /// Not live: freed, or never handed out.
    Free,
    /// Live, as its record says.
    Live,
    /// Live, as its key says where its record was refused.
    LiveByKey,
}

/// [`block_is_free`], saying whether the record or the block's key
/// decided a live block (a free marks the second only).
///
/// # Safety
/// As [`block_is_free`].
#[inline(always)]
unsafe fn judged(p: *mut u8, u: usize, freeing: bool) -> Judged {
    let live = if freeing {
        live::release(p as usize)
    } else {
        live::is_live(p as usize)
    };
    match live {
        Some(true) => Judged::Live,
        Some(false) => Judged::Free,
        // The record refused: the slot's own key says. SAFETY: a slot,
        // readable (caller).
        None if u <= SMALL_MAX && unsafe { Block::is_free(p as *const Block) } => Judged::Free,
        None => Judged::LiveByKey,
    }
}

/// The checks of a slot freed into a thread cache, once [`block_is_free`]
/// found it live (and recorded it freed), before the heap marks and
/// caches it: its end intact, the word before it too; then wiped.
///
/// # Safety
/// `b` starts a slot of `class` in a live slab page of a thread heap, as
/// its slab word said after `begun` (`heap::mesh::passes_begun`) was read.
#[inline(always)]
unsafe fn free_slot(b: *mut Block, class: usize, offset: usize, begun: usize) {
    let p = b as *mut u8;
    // SAFETY: classes of the slab table are below CLASSES.
    let u = unsafe { *SLOT_SIZE.get_unchecked(class) } as usize;
    // SAFETY: a slot of `u` bytes (caller), `offset` bytes into its page,
    // resident: the thread caches take only slots of pages with no purged
    // or meshed OS page (one purged meanwhile reads zero).
    unsafe {
        // Computed once for the checks and the wipe.
        let keys = Keys::of(p as usize);
        let found = match canary::verify_found(p, u, keys) {
            Ok(found) => found,
            Err((kind, at)) => refused(kind, at),
        };
        check_neighbour(p, u, offset, begun);
        wipe::wipe_written(p, found.written, u, keys);
    }
}

/// [`free`] of a slot the thread cache could take: checked, wiped, and
/// put in the thread's cache (`HeapCore::cache_push`), which hands it out
/// again only after its class's depth of later frees on the thread
/// (`heap/cache/fifo.rs`). The slot holds the cache key from then on, which
/// makes a second free of it a double free where its record of blocks
/// handed out was refused (and which a 16-byte slot's neighbour's free
/// takes for a free slot's last word).
///
/// # Safety
/// `b` starts a slot of `class` in a live slab page of a thread heap, as
/// its slab word said after `begun` was read, itself read after `b` was
/// announced on `current`'s state 0; found live (and recorded freed);
/// `state_at` is the slab word's state; `current` is the calling thread's
/// heap.
#[inline(always)]
unsafe fn cache_slot(
    b: *mut Block,
    class: usize,
    offset: usize,
    state_at: usize,
    begun: usize,
    current: *mut HeapCore,
) {
    // SAFETY: per the caller; the state at `state_at` in `current`'s
    // states is the slot's class's (as the default build's free finds it).
    unsafe {
        free_slot(b, class, offset, begun);
        let states = (current as *const u8).add(STATES_OFFSET);
        let state = &*(states.add(state_at) as *const ClassState);
        HeapCore::cache_push(current, b as usize, state_at, state);
    }
}

/// [`cache_slot`] of a slot whose record of blocks handed out was refused
/// (its key said it was live), out of the way of the free's path.
///
/// # Safety
/// As [`cache_slot`].
#[cold]
#[inline(never)]
unsafe fn cache_keyed(
    b: *mut Block,
    class: usize,
    offset: usize,
    state_at: usize,
    begun: usize,
    current: *mut HeapCore,
) {
    // SAFETY: forwarded.
    unsafe { cache_slot(b, class, offset, state_at, begun, current) }
}

/// What a slot carved fresh gets in the hardened build
/// (`Block::mark_carved`): no mark, and a free slot's tail word.
///
/// # Safety
/// `p` is a slot of `u` bytes the caller may write.
#[inline(always)]
pub unsafe fn carved(p: *mut u8, u: usize) {
    // SAFETY: per the caller.
    unsafe { wipe::carved(p, u) }
}

/// Checks the tail word of the slot before the slot of `u` bytes at `p`
/// (if `p` is not its page's first): a write before `p`'s start, or past
/// the end of that slot, changed it. Aborts then. Not checked if a mesh
/// pass began since `begun` (`heap::mesh::passes_begun`, read before the
/// page's slab word): the page may be meshed by now.
///
/// # Safety
/// `p` starts a slot of `u` bytes `offset` bytes into a slab page whose
/// slots are carved up to it and resident (no OS page purged, none
/// meshed; one purged meanwhile reads zero, which passes), as the slab
/// word read after `begun` said.
#[inline(always)]
unsafe fn check_neighbour(p: *const u8, u: usize, offset: usize, begun: usize) {
    if offset < u {
        return; // the page's first slot: what lies before is not a slot
    }
    let prev = p as usize - u;
    // The caller's read of the page's slab word (after `begun`) comes
    // before this one's: a word that said cacheable after a pass was
    // counted was written once the page had no meshed OS page again.
    core::sync::atomic::fence(core::sync::atomic::Ordering::Acquire);
    crate::sync::perturb::window();
    // SAFETY: the previous slot's last word, inside the page (caller).
    let word = unsafe { p.sub(TAIL).cast::<usize>().read_unaligned() };
    // A mesh pass may have remapped the page since its word was read: the
    // address may show a group page, where the slot before is another
    // page's object (armed for its own address) or free memory. Not a
    // word of this page's: nothing to judge.
    if !crate::heap::mesh::none_begun_since(begun) {
        return;
    }
    // A free 16-byte slot's last word is its key, judged as read: its
    // owner may take the slot meanwhile (the key, then zero, then a tail
    // word), and a second load would see the tail after the first saw
    // the key.
    let free_key = u < wipe::MARKED_MIN && Block::is_free_key(prev, word);
    if !(canary::is_tail(prev, u, word) || free_key) {
        misuse(Misuse::Underflow, p as usize);
    }
}

/// Frees `p`: a slot the thread cache could take is checked, wiped and put
/// in the thread's cache, which hands it out again only after its class's
/// depth of later frees (`heap/cache/fifo.rs`); anything else is checked
/// and wiped, then freed through `uncached`.
///
/// `heap` is the calling thread's heap or, for a thread without one,
/// `crate::heap::empty_heap` (`thread::current_or_empty`: one comparison
/// says which, where the heap or null would take a second test);
/// `uncached(b, current)` frees `b` below this layer, `current` the
/// thread's heap or null. It captures nothing, so that nothing is kept
/// in memory for it on the free's path.
///
/// # Safety
/// `p` is not null; `heap` is the calling thread's heap or the empty one;
/// `uncached` frees a live block below this layer.
#[inline(always)]
pub unsafe fn free(p: *mut u8, heap: *mut HeapCore, uncached: impl FnOnce(*mut u8, *mut HeapCore)) {
    if !core::ptr::eq(heap, crate::heap::empty_heap()) {
        let current = heap;
        let begun = crate::heap::mesh::passes_begun();
        // The slot is announced before its page's word is read, as the
        // default build's free does: a mesh pass or a page being hollowed
        // that stops the page's cached frees either sees it or is seen
        // (`memory/cache_handshake.rs`), so no store below lands in a slot
        // whose OS page shows another page's objects.
        // SAFETY: state 0 starts the states of our own heap.
        unsafe {
            let states = (current as *const u8).add(STATES_OFFSET);
            (*(states as *const ClassState)).announce(p as usize);
        }
        crate::memory::cache_handshake::before_reading_the_word();
        if let Some((class, offset, state_at)) = slot_word_of(p, current) {
            let b = p as *mut Block;
            // SAFETY: a slot of a thread heap's live slab page whose slots
            // the caches take, so resident; `current` is ours (caller).
            // Whether it is free is decided first, before any other byte
            // of it is read (`block_is_free`), and recorded freed.
            unsafe {
                // Classes of the slab table are below CLASSES.
                let u = *SLOT_SIZE.get_unchecked(class) as usize;
                match judged(p, u, true) {
                    Judged::Live => cache_slot(b, class, offset, state_at, begun, current),
                    Judged::Free => misuse(Misuse::DoubleFree, p as usize),
                    Judged::LiveByKey => cache_keyed(b, class, offset, state_at, begun, current),
                }
            }
            return;
        }
        // SAFETY: forwarded.
        return unsafe { free_uncached(p, current, uncached) };
    }
    // SAFETY: forwarded; the thread has no heap.
    unsafe { free_uncached(p, null_mut(), uncached) }
}

/// Gives the spans of guarded blocks `heap` kept back to the heap (a trim,
/// or the thread's exit).
///
/// # Safety
/// `heap` is the calling thread's own heap.
pub unsafe fn give_back_kept_spans(heap: &HeapCore) {
    // SAFETY: forwarded.
    unsafe { give_back_kept(heap) };
}

/// [`free`] past the cache: looks the block up, checks and wipes it. The
/// span of a block between guard pages stays in `current`, guarded and
/// shut, for its next large block (the one kept longest goes back to the
/// heap).
///
/// # Safety
/// As [`free`].
#[inline(never)]
unsafe fn free_uncached(
    p: *mut u8,
    current: *mut HeapCore,
    uncached: impl FnOnce(*mut u8, *mut HeapCore),
) {
    if zero::owns(p) {
        return zero::free(p);
    }
    // SAFETY: checked live above; wiped before it is free. A slot the slab
    // table lists is on a page with no purged or meshed OS page.
    unsafe {
        // Before `check` reads the page's slab word (`c.offset`).
        let begun = crate::heap::mesh::passes_begun();
        let c = check(p, true);
        if let Some(offset) = c.offset {
            check_neighbour(p, c.u, offset, begun);
        }
        wipe::wipe(p, c.size, c.u, Keys::of(p as usize));
        let page = crate::memory::layout::os_page();
        if c.below != p {
            // A block between guard pages, whose span the heap frees later
            // (or keeps): if the profiler sampled it, its free is here.
            crate::profile::recent::block_freed(p as usize, p as usize + c.u);
        }
        if c.below == p.wrapping_sub(page) && !current.is_null() {
            // Our own heap (caller); the block is shut while its span is
            // kept, and the span pushed out goes back to the heap open.
            let given_back = fence::shut(p, c.u);
            if let Some((b, u)) = (*current).kept.put(c.below, c.u + 2 * page, given_back) {
                fence::release(b.add(page), u - 2 * page);
                uncached(b, current);
            }
            return;
        }
        uncached(below(p, &c), current)
    }
}

/// Resizes `p` to `size` bytes at `align`: in place if the block has room
/// (the canary moves), else into a block from `alloc` (a hardened
/// allocation: armed) with `p` freed through `free`, the program's own
/// hardened free: checked (the word before it too), wiped and cached
/// behind its class's depth of later frees, so that the address does not
/// come straight back. Null
/// (and `p` unchanged) on failure. The move is made here, not by the
/// heap's realloc, so that no block leaves or enters use without the
/// checks.
///
/// # Safety
/// `p` is not null; `alloc` returns null or a hardened block of the size
/// it is given; `free` is the hardened free ([`free`] with the caller's
/// heap and its free below this layer).
pub unsafe fn realloc(
    p: *mut u8,
    size: usize,
    align: usize,
    alloc: impl FnOnce(usize, usize) -> *mut u8,
    free: impl FnOnce(*mut u8),
) -> *mut u8 {
    if zero::owns(p) {
        // Nothing to keep: the new block, then the old one freed.
        let q = alloc(size, align);
        if !q.is_null() {
            zero::free(p);
        }
        return q;
    }
    // SAFETY: `check` aborts unless `p` is live, with `u` usable bytes;
    // the new block is a live one of at least `size` bytes.
    unsafe {
        let c = check(p, false);
        let (old, u) = (c.size, c.u);
        if canary::fits(size, u) && (p as usize) % align == 0 {
            canary::rearm(p, old, size, u);
            return p;
        }
        let q = alloc(size, align);
        if q.is_null() {
            return null_mut();
        }
        unchecked::copy(p, q, old.min(size));
        free(p);
        q
    }
}

/// Checks a write of `len` bytes at `dst` (a C `memcpy`, `memmove` or
/// `memset` about to run): if `dst` lies in a pagewise block and the write
/// runs past that block's end, aborts with an overflow report naming the
/// first byte past it (`bounds.rs`).
#[inline(always)]
pub fn check_write(dst: *const u8, len: usize) {
    bounds::check_write(dst as usize, len);
}

/// Whether a write of `len` bytes at `dst` is known to stay in its block
/// without a call (`bounds.rs`); false leaves it to [`check_write`].
#[inline(always)]
pub fn write_fits_in_line(dst: *const u8, len: usize) -> bool {
    bounds::fits_in_line(dst as usize, len)
}

/// The usable size of `p`: exactly what was asked for (the bytes past it
/// are the canary's), after checking the block.
///
/// # Safety
/// `p` is not null.
pub unsafe fn usable_size(p: *const u8) -> usize {
    // A slot the slab table lists, checked in line: some programs ask at
    // every allocation and free (redis keeps its memory count so).
    if let Some((class, _)) = slot_of(p) {
        let p = p as *mut u8;
        // SAFETY: a slot of a live slab page, of its class's size (classes
        // of the slab table are below CLASSES); read only once
        // `block_is_free` found it live.
        unsafe {
            let u = *SLOT_SIZE.get_unchecked(class) as usize;
            if block_is_free(p, u, false) {
                misuse(Misuse::DoubleFree, p as usize);
            }
            return verified(p, u);
        }
    }
    if zero::owns(p) {
        return 0;
    }
    // SAFETY: forwarded.
    unsafe { check(p as *mut u8, false).size }
}

#[cfg(test)]
mod tests {
    /// Every slot a thread heap hands out is found by the free's lookup,
    /// whatever the size of the heap's pages: where its regions may be
    /// huge pages (the kernel's `madvise` or `always`), a 5,120-byte
    /// class's page holds 64 slots in five slices, not 12 in one, and the
    /// lookup tests the offset against the heap's own geometry. With the
    /// table of one-slice pages, the slots past the first slice went the
    /// checked way past the cache: an exited thread's freed blocks then
    /// pinned five times the transfer cache's bytes in their pages.
    /// (Where the heap's pages are one slice, it holds either way.)
    #[test]
    fn every_slot_a_thread_heap_hands_out_is_found_by_the_frees_lookup() {
        for size in [1000usize, 5000, 6000, 12000, 30000] {
            // SAFETY: allocations, freed below.
            let blocks: std::vec::Vec<*mut u8> = (0..200)
                .map(|_| unsafe { crate::raw::malloc(size, 16) })
                .collect();
            let mut missed = 0;
            for &p in &blocks {
                let Some((class, offset)) = super::slot_of(p) else {
                    missed += 1;
                    continue;
                };
                // Its class's slot holds the block, and starts there.
                let u = super::SLOT_SIZE[class] as usize;
                assert!(u >= size && u < 2 * size, "{size} B in a slot of {u}");
                let slice = crate::memory::layout::SLICE;
                assert_eq!((p as usize - offset) % slice, 0, "{offset} off a page");
                assert_eq!(offset % u, 0, "{offset} not a slot's start");
            }
            for &p in &blocks {
                // SAFETY: live blocks, each freed once.
                unsafe { crate::raw::free(p) };
            }
            assert_eq!(missed, 0, "{missed} of 200 blocks of {size} B not found");
        }
    }
}
