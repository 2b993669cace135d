//! Where the block holding an address ends: the check behind the hardened
//! C library's `memcpy`, `memmove` and `memset` (snmalloc's checked
//! `memcpy`), which stop a write that runs past the end of a pagewise
//! block before it happens.
//!
//! The end is the block's slot, span or run end, as the allocator's own
//! descriptors say: no byte of the block is read, so a check costs a few
//! loads of metadata the frees read too, and a destination outside
//! pagewise's memory costs one. A write into the slot's slack past the
//! request is left to the canary, found at the free.
//!
//! A destination in memory that is not a block in use (a free span, a
//! segment's header, the slack after a page's last slot) is not checked:
//! its descriptors may be changing under another thread.

use crate::memory::layout::SLICE_SHIFT;
use crate::memory::page::Kind;
use crate::memory::registry;
use crate::memory::segment::{Segment, HEADER_SLICES};

/// The end of the pagewise block holding `addr`: its slot's end in a slab
/// page, its span's in a large block, its run's in a huge one. None if
/// `addr` is not in a block in use.
pub fn end_of_block(addr: usize) -> Option<usize> {
    let (base, huge) = registry::lookup(addr)?;
    // SAFETY: a registered segment is mapped and headed by a `Segment`.
    let seg = unsafe { &*Segment::of(base) };
    if huge {
        // SAFETY: the header of a huge run, mapped while it is registered.
        let st = unsafe { &*seg.huge_state() };
        let start = base + st.offset;
        let end = start + st.size;
        return (st.size != 0 && addr >= start && addr < end).then_some(end);
    }
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
