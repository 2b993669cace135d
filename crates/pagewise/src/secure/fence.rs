//! Large and huge blocks between guard pages: a write (or read) before the
//! start of a block above 256 KiB, or far enough past its end, faults at
//! the access, before it reaches another block.
//!
//! ```text
//! | guard page | requested bytes | canary | slack | tail | guard page |
//! ^ the span (+ the alignment - a page)                      span end ^
//! ```
//!
//! The hardened layer asks the heap for two OS pages more than the block
//! needs (with the eight-byte tail, such a request is a large span or a
//! huge run, whose start is page-aligned), makes the span's first and last
//! OS pages inaccessible, and hands out the address one page in. The block
//! starts right after the first guard: an underflow faults at its first
//! byte. Between the request's end and the last guard lie the canary, the
//! span's slack (up to 64 KiB: spans are whole slices) and the tail word:
//! a linear overflow is found at the free by the canary, and faults once
//! it passes the span's end, before it reaches the next span.
//!
//! A guarded block is known by its address: one OS page (or its alignment,
//! a larger power of two) past the start of a live large span or huge run
//! (no block of the heap starts there). The
//! free makes the two pages accessible again before the span goes back to
//! the heap, so nothing below this layer ever meets a guard: two system
//! calls to arm a block, two to disarm it. Guard regions (Linux 6.13) are
//! used where the kernel has them, `mprotect` elsewhere, as the first
//! block finds; a block whose pages the kernel refuses to guard (too many
//! mappings for `mprotect`) is laid out the same, unguarded. A block
//! aligned to more than an OS page starts one alignment into its span,
//! its first guard right before it. Every large block of the global heaps
//! is laid out so, which is how the checked `memcpy` knows where one ends
//! (`bounds.rs`). Linux only.
//!
//! Each thread keeps the spans of the last few guarded blocks it freed
//! (`kept.rs`), guards and all, wiped as any freed block is, and the block
//! made inaccessible too ([`shut`]: a write after free faults at the
//! access): its next large block of about one's size takes the span with
//! one system call ([`reopen`]) where a fresh one costs four (a program that
//! allocates and frees large buffers over and over pays two a pair). A
//! span pushed out, a trim or the thread's exit gives them back
//! ([`release`]).

use crate::memory::layout::{os_page, SLICE_SHIFT};
use crate::memory::page::Kind;
use crate::memory::registry;
use crate::memory::segment::{Segment, HEADER_SLICES};
use crate::memory::size_class::SMALL_MAX;
#[cfg(target_os = "linux")]
use core::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// How this process's guards are made: 0 not known yet, then 1 + the
/// [`Mode`] the first block found working.
#[cfg(target_os = "linux")]
static MODE: AtomicU8 = AtomicU8::new(0);

#[cfg(target_os = "linux")]
use crate::os::guard_pages::{self, Mode};

/// Whether a block of `n` bytes (request and tail) is guarded: a large or
/// huge block (Linux).
#[inline]
pub fn wanted(n: usize) -> bool {
    cfg!(target_os = "linux") && n > SMALL_MAX
}

/// How far into its span a guarded block aligned to `align` starts: an OS
/// page, or its alignment if that is more.
#[inline]
pub fn offset(align: usize) -> usize {
    align.max(os_page())
}

/// The bytes to ask the heap for a guarded block of `n` bytes starting
/// `off` bytes into its span ([`offset`]).
#[inline]
pub fn outer(n: usize, off: usize) -> Option<usize> {
    n.checked_add(off)?.checked_add(os_page())
}

/// Makes the OS page before `p` and the one at `p + u` inaccessible: the
/// guards of a block of `u` usable bytes at `p`, in a span just allocated.
///
/// # Safety
/// Both pages lie in a live span just handed out below this layer, which
/// nobody else uses; `p` and `u` are page-aligned.
pub unsafe fn arm(p: *mut u8, u: usize) {
    let page = os_page();
    debug_assert!(p as usize % page == 0 && u % page == 0);
    #[cfg(target_os = "linux")]
    {
        let known = match MODE.load(Relaxed) {
            0 => None,
            1 => Some(Mode::Regions),
            _ => Some(Mode::Protect),
        };
        // SAFETY: the two pages, ours and unused (caller).
        unsafe {
            if let Some(m) = guard_pages::fence(p as usize - page, page, known) {
                if known.is_none() {
                    MODE.store(if m == Mode::Regions { 1 } else { 2 }, Relaxed);
                }
                let _ = guard_pages::fence(p as usize + u, page, Some(m));
            }
        }
    }
    let _ = (p, u);
}

/// Makes the guards of the block of `u` usable bytes at `p` ([`arm`])
/// accessible again, before its span goes back to the heap. Harmless where
/// they were not made inaccessible.
///
/// # Safety
/// `p` is a guarded block of `u` bytes which the program no longer uses.
pub unsafe fn disarm(p: *mut u8, u: usize) {
    #[cfg(target_os = "linux")]
    {
        let mode = match MODE.load(Relaxed) {
            0 => return, // no block was ever guarded
            1 => Mode::Regions,
            _ => Mode::Protect,
        };
        let page = os_page();
        // SAFETY: the two pages around the block, in its span (caller).
        unsafe {
            guard_pages::open(p as usize - page, page, mode);
            guard_pages::open(p as usize + u, page, mode);
        }
    }
    let _ = (p, u);
}

/// The mode this process's guards are made in, if one was made.
#[cfg(target_os = "linux")]
#[inline]
fn mode() -> Option<Mode> {
    match MODE.load(Relaxed) {
        0 => None,
        1 => Some(Mode::Regions),
        _ => Some(Mode::Protect),
    }
}

/// Makes the `u` bytes of the freed guarded block at `p` inaccessible too,
/// from guard to guard, while its span is kept (`kept.rs`): a write or a
/// read after free faults at the access. A block of up to
/// [`super::kept::KEPT_MAX`] bytes keeps its memory (`mprotect`: the next
/// block to take the span faults nothing in); a larger one gives it back
/// to the OS (guard regions, or `mprotect` and `MADV_DONTNEED`). One
/// system call, two for a large block with `mprotect` only. Where the OS
/// refuses, the block stays accessible. Returns the bytes given back to
/// the OS (`u` or 0).
///
/// # Safety
/// `p` is a guarded block of `u` bytes which the program no longer uses,
/// page-aligned, wiped.
pub unsafe fn shut(p: *mut u8, u: usize) -> usize {
    #[cfg(target_os = "linux")]
    {
        let Some(mode) = mode() else {
            return 0; // no block was ever guarded
        };
        let a = p as usize;
        // SAFETY: the block's pages, nobody's bytes (caller).
        unsafe {
            if u <= super::kept::KEPT_MAX {
                guard_pages::close(a, u, Mode::Protect);
                return 0;
            }
            let closed = guard_pages::close(a, u, mode);
            // Guard regions discard the pages they cover.
            let gone = closed && (mode == Mode::Regions || guard_pages::discard(a, u));
            return if gone { u } else { 0 };
        }
    }
    #[allow(unreachable_code)]
    {
        let _ = (p, u);
        0
    }
}

/// Makes the block of `u` bytes at `p`, which [`shut`] made inaccessible,
/// accessible again for the next block its span holds (its guards stay).
/// Harmless where it was not made inaccessible.
///
/// # Safety
/// As [`shut`]; the span was taken for a new block.
pub unsafe fn reopen(p: *mut u8, u: usize) {
    #[cfg(target_os = "linux")]
    {
        let Some(mode) = mode() else {
            return;
        };
        let m = if u <= super::kept::KEPT_MAX {
            Mode::Protect
        } else {
            mode
        };
        // SAFETY: the block's pages (caller).
        unsafe { guard_pages::open(p as usize, u, m) };
    }
    let _ = (p, u);
}

/// [`reopen`] and [`disarm`] together, for a span kept shut that goes
/// back to the heap: with `mprotect` only, or a large block's guard
/// regions, one system call over the whole span.
///
/// # Safety
/// As [`shut`]; the span goes back to the heap.
pub unsafe fn release(p: *mut u8, u: usize) {
    #[cfg(target_os = "linux")]
    {
        let Some(mode) = mode() else {
            return;
        };
        let page = os_page();
        // SAFETY: the block's pages and its guards, in its span (caller).
        unsafe {
            if mode == Mode::Regions && u <= super::kept::KEPT_MAX {
                guard_pages::open(p as usize, u, Mode::Protect);
            }
            guard_pages::open(p as usize - page, u + 2 * page, mode);
        }
    }
    let _ = (p, u);
}

/// The span holding the large block (or huge run) at `addr`, if it is one
/// of the global heaps': its start and its end. Reads only the
/// allocator's descriptors.
pub fn span_of(addr: usize) -> Option<(usize, usize)> {
    let (base, huge) = registry::lookup(addr)?;
    // SAFETY: a registered segment is mapped and headed by a `Segment`;
    // the heap of a segment outlives it, and `global` is fixed.
    let seg = unsafe { &*Segment::of(base) };
    if !unsafe { (*(seg.heap as *const crate::heap::HeapCore)).global } {
        return None; // an owned heap's: not hardened
    }
    if huge {
        // SAFETY: the header of a huge run, mapped while it is registered.
        // A run freed (and cached) keeps its offset, with no size.
        let st = unsafe { &*seg.huge_state() };
        let start = base + st.offset;
        return Some((start, start + st.size));
    }
    let idx = (addr - base) >> SLICE_SHIFT;
    if idx < HEADER_SLICES {
        return None;
    }
    // SAFETY: a descriptor of this segment; a stale offset (free memory) is
    // range-checked, and only a live large span is taken (a sampled small
    // block's span has a slot size).
    unsafe {
        let off = (*seg.page(idx)).slice_offset as usize;
        if off > idx - HEADER_SLICES {
            return None;
        }
        let span = &*seg.page(idx - off);
        (span.kind() == Kind::Large && span.slot_size == 0)
            .then_some((span.start, span.start + span.large_size))
    }
}

/// If `p` is a guarded block's address (one OS page, or a larger power of
/// two it is aligned to, past the start of a live large span or of a huge
/// run of the global heaps), the span's start.
#[inline]
pub fn start_of(p: *const u8) -> Option<*mut u8> {
    let addr = p as usize;
    let page = os_page();
    if !wanted(SMALL_MAX + 1) || addr % page != 0 {
        return None;
    }
    let (start, _) = span_of(addr)?;
    let off = addr.wrapping_sub(start);
    let fenced = off == page || (off > page && off.is_power_of_two() && addr % off == 0);
    fenced.then_some(start as *mut u8)
}

/// Whether `p`, which [`start_of`] took for the start of a block its span
/// at `span` holds at an alignment, lies instead inside a live block the
/// span holds nearer its start (at an OS page, or at a smaller alignment):
/// a pointer into the middle of a block, which the record of live blocks
/// alone cannot tell from a block freed twice.
pub fn inside_live_block(span: *const u8, p: *const u8) -> bool {
    let (span, off) = (span as usize, (p as usize).wrapping_sub(span as usize));
    // Where a block of the span may start: an OS page in, or a power of
    // two past it (the span is aligned to it), below `p`.
    let mut at = os_page();
    while at < off {
        if super::live::is_live(span + at) == Some(true) {
            return true;
        }
        at *= 2;
    }
    false
}
