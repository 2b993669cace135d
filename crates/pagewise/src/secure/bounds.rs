//! Where the block holding an address ends: the check behind the hardened
//! C library's `memcpy`, `memmove` and `memset` (snmalloc's checked
//! `memcpy`), which stop a write that runs past the end of a pagewise
//! block before it happens.
//!
//! The end is the block's slot, span or run end, as the allocator's own
//! tables say: no byte of the block is read. A slot is found as the free
//! fast path finds it (the registry, then the segment's slab table: two
//! loads and a multiplication); other blocks through their descriptors,
//! out of line; a destination outside pagewise's memory costs one load. A write into the slot's slack past the
//! request is left to the canary, found at the free.
//!
//! A destination in memory that is not a block in use (a free span, a
//! segment's header, the slack after a page's last slot) is not checked:
//! its descriptors may be changing under another thread.
//!
//! Every block starts and ends at a multiple of [`GRANULE`] bytes (slots
//! are 16-byte multiples from a 16-byte aligned page start; spans, runs and
//! the ends the checks take for them are whole OS pages): a write that
//! stays in the 16 bytes its first byte lies in cannot run past the end of
//! the block holding that byte, and is not looked up ([`in_one_granule`]).
//! Most of the small copies a program makes (a short string into a new
//! block) are such writes.

use super::fence;
use crate::fault::{misuse, Misuse};
use crate::memory::layout::{os_page, segment_base, SLICE_SHIFT};
use crate::memory::page::Kind;
use crate::memory::registry;
use crate::memory::segment::{Segment, HEADER_SLICES, STATE_SHIFT};
use crate::memory::size_class::{GEOMETRY, SLOT_SIZE};

/// The alignment of every block's start and end.
pub const GRANULE: usize = 16;
const _: () = assert!(crate::memory::size_class::MIN_SLOT % GRANULE == 0);

/// Whether a write of `len` bytes at `addr` stays in the [`GRANULE`] its
/// first byte lies in (a write of no bytes does): then it cannot pass the
/// end of a block.
#[inline(always)]
pub fn in_one_granule(addr: usize, len: usize) -> bool {
    len <= GRANULE - addr % GRANULE
}

/// Whether a write of `len` bytes at `addr` is known, with no call, to
/// stay in the pagewise block holding `addr`: it stays in its first
/// byte's [`GRANULE`], `addr` is not pagewise's, or `addr` lies in a slot
/// and the write ends by the slot's end. False leaves the write to
/// [`check_write`] (a slot overrun, or a block that is not a slot).
///
/// Only a slot is judged here, as the free fast path finds it, so that the
/// common cases make no call and a C `memcpy` that asks this first keeps
/// its own call a tail call, with no register saved on its way.
#[inline(always)]
pub fn fits_in_line(addr: usize, len: usize) -> bool {
    if in_one_granule(addr, len) {
        return true;
    }
    // One load of the segment map says which of the three it is.
    match registry::shared_or_registered(addr) {
        // Not pagewise's at all (a stack or a static buffer, the
        // destination of many copies): no descriptor to read.
        None => true,
        Some(true) => {
            // SAFETY: a registered segment is mapped and headed by a `Segment`.
            let seg = unsafe { &*Segment::of(segment_base(addr)) };
            // The slab table, as the free fast path reads it: one load, no
            // descriptor (most destinations are small blocks).
            let (state_at, offset) = seg.slab_entry(addr);
            if state_at == 0 {
                return false;
            }
            let class = (state_at >> STATE_SHIFT) - 1;
            len <= slot_end(addr, class, offset) - addr
        }
        Some(false) => false,
    }
}

/// The end of the slot of `class` holding `addr`, `offset` bytes into its
/// page.
#[inline(always)]
fn slot_end(addr: usize, class: usize, offset: usize) -> usize {
    addr - into_slot(class, offset) + slot_size(class)
}

/// Aborts with an overflow report (naming the first byte past the block)
/// if a write of `len` bytes at `addr` runs past the end of the pagewise
/// block holding `addr`: its slot's end in a slab page, its span's in a
/// large block, its run's in a huge one. Nothing if `addr` is not in a
/// block in use. What [`fits_in_line`] passes makes no call.
#[inline(always)]
pub fn check_write(addr: usize, len: usize) {
    if !fits_in_line(addr, len) {
        check_looked_up(addr, len);
    }
}

/// [`check_write`] of a write [`fits_in_line`] did not pass: a slot
/// overrun reported, any other block of pagewise's looked up.
#[cold]
#[inline(never)]
fn check_looked_up(addr: usize, len: usize) {
    match registry::shared_or_registered(addr) {
        None => {}
        Some(true) => {
            // SAFETY: a registered segment is mapped and headed by a `Segment`.
            let seg = unsafe { &*Segment::of(segment_base(addr)) };
            let (state_at, offset) = seg.slab_entry(addr);
            if state_at == 0 {
                return check_described(addr, len);
            }
            let class = (state_at >> STATE_SHIFT) - 1;
            let end = slot_end(addr, class, offset);
            if len > end - addr {
                overflow(end);
            }
        }
        Some(false) => check_described(addr, len),
    }
}

/// [`check_write`] of a destination in a segment of pagewise's that the
/// slab table does not place in a slot.
#[cold]
#[inline(never)]
fn check_described(addr: usize, len: usize) {
    if let Some(end) = described_end(addr) {
        if len > end - addr {
            overflow(end);
        }
    }
}

/// Aborts: a write runs past the block ending at `end`.
#[cold]
#[inline(never)]
fn overflow(end: usize) -> ! {
    misuse(Misuse::Overflow, end)
}

/// The size of a slot of `class` (below CLASSES, as slab-table entries say).
#[inline(always)]
fn slot_size(class: usize) -> usize {
    // SAFETY: below CLASSES (caller).
    unsafe { *SLOT_SIZE.get_unchecked(class) as usize }
}

/// How far `offset` (bytes into a slab page of `class`) lies into its slot:
/// `offset % slot`, by the class's reciprocal (exact below 2^32) rather
/// than a division.
#[inline(always)]
fn into_slot(class: usize, offset: usize) -> usize {
    // SAFETY: below CLASSES (caller).
    let divisor = unsafe { GEOMETRY.get_unchecked(class) }.divisor;
    let frac = (offset as u64).wrapping_mul(divisor);
    ((frac as u128 * slot_size(class) as u128) >> 64) as usize
}

/// [`end_of_block`] from the allocator's descriptors: a large or huge
/// block of the global heaps (which ends where its last guard page starts,
/// `fence.rs`), or a slot of a page the slab table leaves out.
#[inline(never)]
fn described_end(addr: usize) -> Option<usize> {
    if let Some((start, end)) = fence::span_of(addr) {
        let end = end.checked_sub(os_page())?;
        return (addr >= start && addr < end).then_some(end);
    }
    let (base, huge) = registry::lookup(addr)?;
    if huge {
        return None; // an owned heap's huge run: not hardened
    }
    // SAFETY: a registered segment is mapped and headed by a `Segment`.
    let seg = unsafe { &*Segment::of(base) };
    let idx = (addr - base) >> SLICE_SHIFT;
    if idx < HEADER_SLICES {
        return None;
    }
    // SAFETY: a descriptor of this segment; only fields fixed while its
    // span is in use are read, and a stale offset is range-checked.
    unsafe {
        let off = (*seg.page(idx)).slice_offset as usize;
        if off > idx - HEADER_SLICES {
            return None;
        }
        let page = &*seg.page(idx - off);
        match page.kind() {
            Kind::Slab => {
                let slot = page.slot_size as usize;
                let i = (addr - page.start) / slot;
                (i < page.reserved as usize).then(|| page.start + (i + 1) * slot)
            }
            Kind::Large => {
                let end = page.start + page.large_size;
                (addr < end).then_some(end)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::size_class::CLASSES;

    #[test]
    fn a_write_is_left_unchecked_only_inside_the_granule_of_its_first_byte() {
        for class in 0..CLASSES {
            assert_eq!(
                slot_size(class) % GRANULE,
                0,
                "class {class}: slots end on a granule"
            );
        }
        let a = 0x2000_0000_0000usize;
        assert!(in_one_granule(a, 0) && in_one_granule(a + 15, 0));
        assert!(in_one_granule(a, 16) && !in_one_granule(a, 17));
        assert!(in_one_granule(a + 8, 8) && !in_one_granule(a + 8, 9));
        assert!(in_one_granule(a + 15, 1) && !in_one_granule(a + 15, 2));
        // No wrap-around for a length near the address space's size.
        assert!(!in_one_granule(a + 15, usize::MAX) && !in_one_granule(a, usize::MAX - 7));
    }

    #[test]
    fn the_reciprocal_gives_the_offset_into_the_slot_of_every_class() {
        for class in 0..CLASSES {
            let slot = slot_size(class);
            // Offsets over 32 MiB, beyond any slab page: the remainder is
            // exact.
            for offset in (0..32 << 20)
                .step_by(slot * 61 + 3)
                .chain([slot - 1, slot, slot + 1])
            {
                assert_eq!(
                    into_slot(class, offset),
                    offset % slot,
                    "class {class} offset {offset}"
                );
            }
        }
    }
}
