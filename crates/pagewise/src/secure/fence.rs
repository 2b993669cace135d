//! Large and huge blocks between guard pages: a write (or read) before the
//! start of a block above 256 KiB, or far enough past its end, faults at
//! the access, before it reaches another block.
//!
//! ```text
//! | guard page | requested bytes | canary | slack | tail | guard page |
//! ^ the span                                                 span end ^
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
//! A guarded block is known by its address: one OS page past the start of
//! a live large span or huge run (no block of the heap starts there). The
//! free makes the two pages accessible again before the span goes back to
//! the heap, so nothing below this layer ever meets a guard: two system
//! calls to arm a block, two to disarm it. Guard regions (Linux 6.13) are
//! used where the kernel has them, `mprotect` elsewhere, as the first
//! block finds; a block whose pages the kernel refuses to guard (too many
//! mappings for `mprotect`) is laid out the same, unguarded. Requests
//! aligned to more than an OS page are not guarded (their start must be
//! the span's). Linux only.
//!
//! Each thread keeps the spans of the last few guarded blocks it freed
//! (`kept.rs`), guards and all, wiped as any freed block is: its next
//! large block of about one's size takes it without a system call (a
//! program that allocates and frees large buffers over and over pays
//! none). A trim or the thread's exit gives them back.

use crate::memory::layout::{os_page, SLICE_SHIFT};
use crate::memory::page::Kind;
use crate::memory::registry;
use crate::memory::segment::{Segment, HEADER_SLICES};
use crate::memory::size_class::SMALL_MAX;
use core::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// How this process's guards are made: 0 not known yet, then 1 + the
/// [`Mode`] the first block found working.
#[cfg(target_os = "linux")]
static MODE: AtomicU8 = AtomicU8::new(0);

#[cfg(target_os = "linux")]
use crate::os::guard_pages::{self, Mode};

/// Whether a block of `n` bytes (request and tail) at `align` is guarded:
/// a large or huge block aligned to an OS page at most (Linux).
#[inline]
pub fn wanted(n: usize, align: usize) -> bool {
    cfg!(target_os = "linux") && n > SMALL_MAX && align <= os_page()
}

/// The bytes to ask the heap for a guarded block of `n` bytes.
#[inline]
pub fn outer(n: usize) -> Option<usize> {
    n.checked_add(2 * os_page())
}

/// Makes the first and last OS pages of the span of `outer_u` usable bytes
/// at `b`, just allocated, inaccessible. Returns the block's address (one
/// page in) and its usable bytes (two pages fewer).
///
/// # Safety
/// `b` is a live block of `outer_u >= 2 * os_page()` bytes just handed out
/// below this layer, page-aligned, whose bytes nobody uses yet.
pub unsafe fn arm(b: *mut u8, outer_u: usize) -> (*mut u8, usize) {
    let page = os_page();
    debug_assert!(b as usize % page == 0 && outer_u % page == 0 && outer_u >= 2 * page);
    #[cfg(target_os = "linux")]
    {
        let known = match MODE.load(Relaxed) {
            0 => None,
            1 => Some(Mode::Regions),
            _ => Some(Mode::Protect),
        };
        // SAFETY: the span's first and last pages, ours and unused
        // (caller).
        unsafe {
            if let Some(m) = guard_pages::fence(b as usize, page, known) {
                if known.is_none() {
                    MODE.store(if m == Mode::Regions { 1 } else { 2 }, Relaxed);
                }
                let _ = guard_pages::fence(b as usize + outer_u - page, page, Some(m));
            }
        }
    }
    // SAFETY: inside the block (caller).
    (unsafe { b.add(page) }, outer_u - 2 * page)
}

/// Makes the guard pages of the guarded block whose span of `outer_u`
/// usable bytes starts at `b` accessible again (before the span goes back
/// to the heap). Harmless where they were not made inaccessible.
///
/// # Safety
/// `b` starts a live guarded block's span of `outer_u` bytes, which the
/// program no longer uses.
pub unsafe fn disarm(b: *mut u8, outer_u: usize) {
    #[cfg(target_os = "linux")]
    {
        let mode = match MODE.load(Relaxed) {
            0 => return, // no block was ever guarded
            1 => Mode::Regions,
            _ => Mode::Protect,
        };
        let page = os_page();
        // SAFETY: the span's first and last pages (caller).
        unsafe {
            guard_pages::open(b as usize, page, mode);
            guard_pages::open(b as usize + outer_u - page, page, mode);
        }
    }
    let _ = (b, outer_u);
}

/// If `p` is a guarded block's address (one OS page past the start of a
/// live large span or of a huge run), the span's start. Reads only the
/// allocator's descriptors.
#[inline]
pub fn start_of(p: *const u8) -> Option<*mut u8> {
    let addr = p as usize;
    let page = os_page();
    if !wanted(SMALL_MAX + 1, 1) || addr % page != 0 {
        return None;
    }
    let (base, huge) = registry::lookup(addr)?;
    // SAFETY: a registered segment is mapped and headed by a `Segment`.
    let seg = unsafe { &*Segment::of(base) };
    let start = if huge {
        // SAFETY: the header of a huge run, mapped while it is registered.
        // A run freed (and cached) keeps its offset, with no size: the
        // check that follows reports its second free.
        base + unsafe { (*seg.huge_state()).offset }
    } else {
        let idx = (addr - base) >> SLICE_SHIFT;
        if idx < HEADER_SLICES {
            return None;
        }
        // SAFETY: a descriptor of this segment; a stale offset (free
        // memory) is range-checked, and only a live large span's start is
        // taken (a sampled small block's span has a slot size).
        unsafe {
            let off = (*seg.page(idx)).slice_offset as usize;
            if off > idx - HEADER_SLICES {
                return None;
            }
            let span = &*seg.page(idx - off);
            (span.kind() == Kind::Large && span.slot_size == 0).then_some(span.start)?
        }
    };
    (addr == start + page).then_some(start as *mut u8)
}
