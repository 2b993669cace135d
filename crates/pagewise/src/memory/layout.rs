//! The geometry of pagewise's address space: OS pages, slices, segments.
//!
//! ```text
//! reservation (1 GiB of address space, mapped once, kept until trim/drop)
//! └── segment (32 MiB, aligned to 32 MiB: ptr & !(SEGMENT-1) finds its header)
//!     ├── slices 0-1: segment header (slice descriptors, commit bitmap)
//!     └── slices 2..512 (64 KiB each), grouped into spans:
//!         ├── slab page: one size class, 1..16 slices
//!         ├── large object: any number of slices
//!         └── free span: retained (dirty) or purged (clean)
//! ```
//! Objects above [`LARGE_MAX`] get a "huge" segment run of their own.

/// The OS page: the unit of commit tracking and of purging.
pub const OS_PAGE: usize = 4096;
/// log2 of [`SLICE`].
pub const SLICE_SHIFT: usize = 16;
/// The unit spans are measured in: 64 KiB.
pub const SLICE: usize = 1 << SLICE_SHIFT;
/// log2 of [`SEGMENT`].
pub const SEGMENT_SHIFT: usize = 25;
/// A segment: 32 MiB, aligned to its size, so a pointer finds its header by masking.
pub const SEGMENT: usize = 1 << SEGMENT_SHIFT;
/// Slices per segment, header slice included.
pub const SLICES_PER_SEGMENT: usize = SEGMENT / SLICE;
/// OS pages per segment (one bit each in the commit bitmap).
pub const OS_PAGES_PER_SEGMENT: usize = SEGMENT / OS_PAGE;
/// OS pages per slice.
pub const OS_PAGES_PER_SLICE: usize = SLICE / OS_PAGE;
/// Largest object served from spans inside a segment (a segment less its
/// header, at most two slices); larger ones are huge. Up to a whole segment,
/// so that buffers of a few MiB to tens of MiB share one best-fit pool and
/// one retention FIFO, whatever their size, rather than a 20 MiB object
/// waiting in a run of its own that a 10 MiB one cannot use.
pub const LARGE_MAX: usize = SEGMENT - 2 * SLICE;
/// Largest alignment a span inside a segment can honour by splitting.
pub const LARGE_ALIGN_MAX: usize = SEGMENT / 4;

/// Rounds `x` up to a multiple of the power of two `to`.
#[inline]
pub const fn align_up(x: usize, to: usize) -> usize {
    (x + to - 1) & !(to - 1)
}

/// The segment an address belongs to (if it belongs to one).
#[inline]
pub fn segment_base(addr: usize) -> usize {
    addr & !(SEGMENT - 1)
}
