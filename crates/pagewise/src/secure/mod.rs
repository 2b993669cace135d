//! The hardened build (the `secure` feature): checks around every block
//! the global allocator and the C library hand out, at the cost of a few
//! writes per allocation and a wipe per free (docs/hardening.md has the
//! figures and what each check catches).
//!
//! Every block is allocated eight bytes longer than asked, and its end
//! carries a tail word (`canary.rs`) saying where the requested bytes end,
//! encoded with the process's secret; the bytes between the request and the
//! tail hold a canary. A free or realloc checks both, so a write past the
//! end, of one byte or many, is reported at the latest when the block is
//! freed. A free then wipes the block (`wipe.rs`): the next owner never sees
//! the last one's data, and a second free of the block is told apart from
//! an overflow.
//!
//! A slot freed twice is reported at its second free: it still holds its
//! free key (`memory/block.rs`), or its tail word is the zero the first
//! free's wipe left (a slot whose OS page was purged meanwhile reads zero
//! too).
//!
//! The layer sits at the entry points (`global/allocator.rs`,
//! `global/raw.rs`); the heaps below it allocate the longer block and never
//! see the canaries. Owned `Heap`s are not hardened.

mod canary;
mod wipe;

use crate::fault::{misuse, Misuse};
use crate::heap::HeapCore;
use crate::memory::page::Block;
use crate::memory::size_class::SMALL_MAX;
use core::ptr::null_mut;

/// Bytes every block gets beyond its request: the tail word.
pub const TAIL: usize = 8;

/// Allocates `size` bytes at `align` through `inner` (which takes the
/// longer size), clears the heap's words in it, and arms the canary. Null if `inner` fails or the size overflows.
///
/// # Safety
/// `inner` returns null or a live block of at least the size it is given,
/// as [`HeapCore::usable_size`] measures it.
#[inline]
pub unsafe fn alloc(
    size: usize,
    align: usize,
    inner: impl FnOnce(usize, usize) -> *mut u8,
) -> *mut u8 {
    let Some(n) = size.checked_add(TAIL) else {
        return null_mut();
    };
    let p = inner(n, align);
    if !p.is_null() {
        // SAFETY: a live block of `u >= n` bytes, just handed out.
        unsafe {
            let u = HeapCore::usable_size(p);
            wipe::clear_links(p, u);
            canary::arm(p, size, u);
        }
    }
    p
}

/// Checks a block handed back (to free, realloc or `malloc_usable_size`):
/// aborts if it is free already or its end was overwritten. Returns its
/// requested size and its usable size below this layer.
///
/// # Safety
/// `p` is not null.
#[inline]
unsafe fn check(p: *mut u8) -> (usize, usize) {
    // SAFETY: `usable_size_checked` aborts for anything but the start of
    // a block of a live span or slab page (or a guarded block), whose `u`
    // bytes are then mapped.
    unsafe {
        let u = HeapCore::usable_size_checked(p);
        // A huge run freed (and cached) has no size; a slot freed twice
        // still holds its free key.
        if u < TAIL || (u <= SMALL_MAX && Block::is_free(p as *const Block)) {
            misuse(Misuse::DoubleFree, p as usize);
        }
        (canary::check(p, u), u)
    }
}

/// Frees `p` through `inner` after checking and wiping it.
///
/// # Safety
/// `p` is not null; `inner` frees a live block.
#[inline]
pub unsafe fn free(p: *mut u8, inner: impl FnOnce(*mut u8)) {
    // SAFETY: checked live above; wiped before it is free.
    unsafe {
        let (_, u) = check(p);
        wipe::wipe(p, u);
    }
    inner(p)
}

/// Resizes `p` to `size` bytes at `align`: in place if the block has room
/// (the canary moves), else into a block from `alloc` (checked as
/// [`alloc`] checks it) with `p` wiped and freed through `free`. Null (and
/// `p` unchanged) on failure. The move is made here, not by the heap's
/// realloc, so that no block leaves or enters use without the checks.
///
/// # Safety
/// `p` is not null; `alloc` and `free` are as for [`alloc`] and [`free`].
pub unsafe fn realloc(
    p: *mut u8,
    size: usize,
    align: usize,
    alloc_inner: impl FnOnce(usize, usize) -> *mut u8,
    free_inner: impl FnOnce(*mut u8),
) -> *mut u8 {
    // SAFETY: `check` aborts unless `p` is live, with `u` usable bytes;
    // the new block is a live one of at least `size` bytes.
    unsafe {
        let (old, u) = check(p);
        if size.checked_add(TAIL).is_some_and(|n| n <= u) && (p as usize) % align == 0 {
            canary::disarm(p, old, u);
            canary::arm(p, size, u);
            return p;
        }
        let q = alloc(size, align, alloc_inner);
        if q.is_null() {
            return null_mut();
        }
        core::ptr::copy_nonoverlapping(p, q, old.min(size));
        wipe::wipe(p, u);
        free_inner(p);
        q
    }
}

/// The usable size of `p`: exactly what was asked for (the bytes past it
/// are the canary's), after checking the block.
///
/// # Safety
/// `p` is not null.
pub unsafe fn usable_size(p: *const u8) -> usize {
    // SAFETY: forwarded.
    unsafe { check(p as *mut u8).0 }
}
