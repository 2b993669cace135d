//! The size-class table: which slot size serves a request, and how many
//! slices a slab page of that class spans.
//!
//! Spacing: every 16 B from 16 B up to 128 B, then four classes per
//! doubling (x·1.25, x·1.5, x·1.75, x·2) up to [`SMALL_MAX`] = 256 KiB: 52
//! classes. No slot is smaller than 16 bytes: a free slot holds its link
//! and, in its second word, the key that catches a double free
//! ([`crate::fault`]); a C `malloc` must return 16-byte aligned memory
//! anyway.
//! Worst-case internal waste (slot minus request, over the slot) is 15 B
//! below 128 B and under 20 % above it (a request of 1 + 2^k·1.0 rounded to
//! 2^k·1.25); jemalloc's spacing, whose docs bound it at "~20 %".
//!
//! Page sizes are chosen per class at compile time: the fewest 64 KiB slices
//! that hold at least [`MIN_SLOTS`] slots with at most 1/16 of the page left
//! over at the tail.

use crate::memory::layout::SLICE;

/// Largest request served from slab pages (bigger requests take spans).
pub const SMALL_MAX: usize = 256 * 1024;
/// Number of size classes.
pub const CLASSES: usize = 52;
/// Fewest slots a slab page holds.
pub const MIN_SLOTS: usize = 4;
/// Most slices a slab page spans.
pub const MAX_PAGE_SLICES: usize = 32;

/// The smallest slot: two words, a free slot's link and its key.
pub const MIN_SLOT: usize = 16;

const fn slot_size_of(class: usize) -> usize {
    if class < 8 {
        (class + 1) * MIN_SLOT
    } else {
        let k = class - 8; // 0 => 160
        let doubling = k / 4; // 0 => (128, 256]
        let step = k % 4 + 1; // 1..=4
        let base = 128usize << doubling;
        base + step * (base / 4)
    }
}

const fn slices_of(slot: usize) -> usize {
    let mut n = 1;
    // Track the best page by waste fraction (waste / bytes), compared by
    // cross-multiplication; start from a sentinel worse than any real page.
    let mut best = 1;
    let mut best_waste = SLICE;
    while n <= MAX_PAGE_SLICES {
        let bytes = n * SLICE;
        let slots = bytes / slot;
        let waste = bytes - slots * slot;
        if slots >= MIN_SLOTS {
            if waste * 16 <= bytes {
                return n;
            }
            if waste * best < best_waste * n {
                best = n;
                best_waste = waste;
            }
        }
        n += 1;
    }
    best
}

const fn build_slots() -> [u32; CLASSES] {
    let mut t = [0u32; CLASSES];
    let mut i = 0;
    while i < CLASSES {
        t[i] = slot_size_of(i) as u32;
        i += 1;
    }
    t
}

const fn build_slices() -> [u8; CLASSES] {
    let mut t = [0u8; CLASSES];
    let mut i = 0;
    while i < CLASSES {
        t[i] = slices_of(slot_size_of(i)) as u8;
        i += 1;
    }
    t
}

/// Slot size of each class, in bytes.
pub static SLOT_SIZE: [u32; CLASSES] = build_slots();
/// Slices per slab page of each class.
pub static PAGE_SLICES: [u8; CLASSES] = build_slices();

/// Most slices of a slab page in [`HUGE_PAGE_SLICES`].
const HUGE_MAX_SLICES: usize = 8;

/// The page of a class in a heap whose regions may be huge pages: a page
/// of [`slices_of`] whose tail leaves whole OS pages (4 KiB) unused costs
/// nothing on small pages (they are never carved) but is resident in a
/// huge page, so such a class gets the page of at most
/// [`HUGE_MAX_SLICES`] slices with the least tail (the fewest slices on
/// ties): zero for all eight such classes (5 KiB on 5 slices, 6 KiB on 3).
const fn huge_slices_of(slot: usize) -> usize {
    let n = slices_of(slot);
    if (n * SLICE) % slot < crate::memory::layout::MIN_OS_PAGE {
        return n;
    }
    let mut best = n;
    let mut best_waste = (n * SLICE) % slot;
    let mut m = 1;
    while m <= HUGE_MAX_SLICES {
        let waste = (m * SLICE) % slot;
        if (m * SLICE) / slot >= MIN_SLOTS && waste * best < best_waste * m {
            best = m;
            best_waste = waste;
        }
        m += 1;
    }
    best
}

const fn build_huge_slices() -> [u8; CLASSES] {
    let mut t = [0u8; CLASSES];
    let mut i = 0;
    while i < CLASSES {
        t[i] = huge_slices_of(slot_size_of(i)) as u8;
        i += 1;
    }
    t
}

/// Slices per slab page of each class in a heap whose 2 MiB regions may be
/// huge pages (`Config::thp`; docs/design.md, "Huge pages"): as
/// [`PAGE_SLICES`] but for the classes whose page would leave whole OS
/// pages of its tail unused, which get a page without a tail.
///
/// ```
/// use pagewise::size_class::{class_of, HUGE_PAGE_SLICES, PAGE_SLICES, SLOT_SIZE};
/// let c = class_of(6000); // 6 KiB slots: 10 on one slice, 4 KiB left over
/// assert_eq!((PAGE_SLICES[c], HUGE_PAGE_SLICES[c]), (1, 3));
/// assert_eq!(3 * 65536 % SLOT_SIZE[c], 0);
/// assert_eq!(HUGE_PAGE_SLICES[class_of(100)], PAGE_SLICES[class_of(100)]);
/// ```
pub static HUGE_PAGE_SLICES: [u8; CLASSES] = build_huge_slices();

const _: () = assert!(slot_size_of(CLASSES - 1) == SMALL_MAX);

/// What the free path needs to check that an address starts a slot, per
/// class, in 16 bytes (each heap keeps a copy in its class state): one
/// multiplication and one comparison, no division.
///
/// With `M = ceil(2^64 / slot)`, an offset below 2^32 is a multiple of the
/// slot size exactly when `offset * M` (mod 2^64) is below `M` (Lemire,
/// Kaser and Kurz, "Faster remainder by direct computation", 2019). For a
/// multiple `k * slot` the product is `k * e`, where `e = slot * M - 2^64`,
/// so comparing against `min(M, slots_per_page * e)` also rejects the one
/// multiple that lies in the page's tail past its last slot. When `e` is 0
/// (slot sizes that are powers of two) the page has no tail, which
/// `build_geometry` checks.
///
/// ```
/// use pagewise::size_class::{class_of, GEOMETRY, SLOT_SIZE};
/// let c = class_of(100); // 112-byte slots
/// let g = GEOMETRY[c];
/// assert!(g.starts_slot(0) && g.starts_slot(112) && g.starts_slot(112 * 7));
/// assert!(!g.starts_slot(8) && !g.starts_slot(111));
/// # assert_eq!(SLOT_SIZE[c], 112);
/// ```
#[derive(Clone, Copy, Debug)]
#[repr(C, align(16))]
pub struct Geometry {
    /// `ceil(2^64 / slot size)`.
    pub divisor: u64,
    /// Offsets whose product with `divisor` is below this start a slot.
    pub limit: u64,
}

impl Geometry {
    /// A geometry no offset passes: the class state behind slices that hold
    /// no slab page.
    pub const NONE: Geometry = Geometry {
        divisor: 0,
        limit: 0,
    };

    /// Whether a slot starts `offset` bytes into a slab page of the class
    /// (`offset` below the page's size). See [`Geometry`] for an example.
    #[inline]
    pub fn starts_slot(&self, offset: usize) -> bool {
        (offset as u64).wrapping_mul(self.divisor) < self.limit
    }

    const fn of(slot: usize, per_page: usize, page_bytes: usize) -> Geometry {
        let divisor = (u64::MAX / slot as u64).wrapping_add(1);
        let excess = divisor.wrapping_mul(slot as u64);
        let limit = if excess == 0 {
            assert!(
                per_page * slot == page_bytes,
                "a power-of-two slot leaves no tail"
            );
            divisor
        } else {
            let l = per_page as u64 * excess;
            if l < divisor {
                l
            } else {
                divisor
            }
        };
        Geometry { divisor, limit }
    }
}

const fn build_geometry(huge: bool) -> [Geometry; CLASSES] {
    let mut t = [Geometry::NONE; CLASSES];
    let mut i = 0;
    while i < CLASSES {
        let slot = slot_size_of(i);
        let slices = if huge {
            huge_slices_of(slot)
        } else {
            slices_of(slot)
        };
        let page_bytes = slices * SLICE;
        t[i] = Geometry::of(slot, page_bytes / slot, page_bytes);
        i += 1;
    }
    t
}

/// Slot geometry of each class.
pub const GEOMETRY: [Geometry; CLASSES] = build_geometry(false);

/// Slot geometry of each class's page in [`HUGE_PAGE_SLICES`].
///
/// ```
/// use pagewise::size_class::{class_of, GEOMETRY, HUGE_GEOMETRY};
/// let c = class_of(6000); // 6,144-byte slots
/// assert!(!GEOMETRY[c].starts_slot(10 * 6144), "one slice holds 10");
/// assert!(HUGE_GEOMETRY[c].starts_slot(10 * 6144), "three hold 32");
/// ```
pub const HUGE_GEOMETRY: [Geometry; CLASSES] = build_geometry(true);

/// The class serving a request of `size` bytes (1..=SMALL_MAX; 0 maps to class 0).
///
/// ```
/// use pagewise::size_class::{class_of, SLOT_SIZE};
/// assert_eq!(SLOT_SIZE[class_of(1)], 16);
/// assert_eq!(SLOT_SIZE[class_of(100)], 112);
/// assert_eq!(SLOT_SIZE[class_of(129)], 160);
/// assert_eq!(SLOT_SIZE[class_of(256 * 1024)], 256 * 1024);
/// ```
#[inline]
pub fn class_of(size: usize) -> usize {
    if size <= TABLE_MAX {
        // SAFETY: (size + 7) / 8 <= TABLE_MAX / 8, the table's last index.
        unsafe { *CLASS_BY_8.get_unchecked((size + 7) >> 3) as usize }
    } else {
        computed_class_of(size)
    }
}

/// Requests up to this size find their class with one table load.
const TABLE_MAX: usize = 1024;

/// The class of each request size rounded up to 8 bytes, up to `TABLE_MAX`.
const CLASS_BY_8: [u8; TABLE_MAX / 8 + 1] = {
    let mut t = [0u8; TABLE_MAX / 8 + 1];
    let mut i = 0;
    while i < t.len() {
        t[i] = computed_class_of(i * 8) as u8;
        i += 1;
    }
    t
};

/// The class formula behind [`class_of`].
pub(crate) const fn computed_class_of(size: usize) -> usize {
    if size <= MIN_SLOT {
        0
    } else if size <= 128 {
        ((size + 15) >> 4) - 1
    } else {
        let s = size - 1;
        let w = usize::BITS as usize - 1 - s.leading_zeros() as usize; // floor(log2(s)) >= 7
        8 + (w - 7) * 4 + ((s >> (w - 2)) - 4)
    }
}

/// The class serving `size` bytes at alignment `align`, if any: the smallest
/// class at least `size` whose slot size is a multiple of `align` (slabs start
/// slice-aligned, so such slots are aligned).
///
/// ```
/// use pagewise::size_class::{class_for, SLOT_SIZE};
/// assert_eq!(SLOT_SIZE[class_for(24, 32).unwrap()], 32);
/// assert_eq!(SLOT_SIZE[class_for(100, 64).unwrap()], 128);
/// assert!(class_for(100, 1 << 20).is_none());
/// ```
#[inline]
pub fn class_for(size: usize, align: usize) -> Option<usize> {
    if size > SMALL_MAX || align > SLICE {
        return None;
    }
    let mut c = class_of(size.max(align));
    while c < CLASSES {
        if SLOT_SIZE[c] as usize % align == 0 {
            return Some(c);
        }
        c += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_increase_and_cover_every_size() {
        for c in 1..CLASSES {
            assert!(SLOT_SIZE[c] > SLOT_SIZE[c - 1]);
        }
        for size in 1..=SMALL_MAX {
            let c = class_of(size);
            assert!(SLOT_SIZE[c] as usize >= size, "size {size}");
            if c > 0 {
                assert!(
                    (SLOT_SIZE[c - 1] as usize) < size,
                    "size {size} not tightest"
                );
            }
        }
    }

    #[test]
    fn table_matches_the_formula() {
        for size in 0..=SMALL_MAX {
            assert_eq!(class_of(size), computed_class_of(size), "size {size}");
        }
    }

    #[test]
    fn waste_is_bounded() {
        for size in 129..=SMALL_MAX {
            let slot = SLOT_SIZE[class_of(size)] as usize;
            assert!((slot - size) * 5 < slot, "size {size} slot {slot}");
        }
    }

    #[test]
    fn pages_hold_enough_slots_with_little_tail() {
        for c in 0..CLASSES {
            let bytes = PAGE_SLICES[c] as usize * SLICE;
            let slots = bytes / SLOT_SIZE[c] as usize;
            assert!(slots >= MIN_SLOTS, "class {c}");
            assert!(
                (bytes - slots * SLOT_SIZE[c] as usize) * 8 <= bytes,
                "class {c}"
            );
        }
    }

    #[test]
    fn pages_for_huge_regions_leave_no_whole_os_page_unused() {
        for c in 0..CLASSES {
            let bytes = HUGE_PAGE_SLICES[c] as usize * SLICE;
            let slot = SLOT_SIZE[c] as usize;
            assert!(bytes / slot >= MIN_SLOTS, "class {c}");
            // No more slots than the smallest class's page (the hollowing
            // bitmap's size, `memory/hollow.rs`).
            assert!(bytes / slot <= SLICE / MIN_SLOT, "class {c}");
            assert!(bytes % slot < 4096, "class {c}: {} left", bytes % slot);
            let changed = HUGE_PAGE_SLICES[c] != PAGE_SLICES[c];
            assert_eq!(changed, PAGE_SLICES[c] as usize * SLICE % slot >= 4096);
        }
    }

    #[test]
    fn geometry_finds_exactly_the_slot_starts() {
        // Every offset of every class's page, exhaustively (about 20 M): the
        // free path asks only about offsets inside the page (the slab table
        // maps each slice to the page holding it). And the pages of heaps
        // whose regions may be huge pages, where they differ.
        let tables = [
            (&GEOMETRY, &PAGE_SLICES),
            (&HUGE_GEOMETRY, &HUGE_PAGE_SLICES),
        ];
        for (huge, (geometry, slices)) in tables.into_iter().enumerate() {
            for (c, g) in geometry.iter().enumerate() {
                if huge == 1 && HUGE_PAGE_SLICES[c] == PAGE_SLICES[c] {
                    continue;
                }
                let slot = SLOT_SIZE[c] as usize;
                let bytes = slices[c] as usize * SLICE;
                for off in 0..bytes {
                    let want = off % slot == 0 && off / slot < bytes / slot;
                    assert_eq!(g.starts_slot(off), want, "class {c} offset {off}");
                }
            }
        }
        for off in [0, 8, 4096, 1 << 20] {
            assert!(!Geometry::NONE.starts_slot(off));
        }
    }

    #[test]
    fn aligned_classes_are_multiples() {
        for align in [8usize, 16, 32, 64, 128, 4096, 65536] {
            for size in [1usize, 7, 100, 1000, 5000, 70000] {
                let c = class_for(size, align);
                // Every power of two up to 64 KiB is itself a class, so a
                // class always exists below SMALL_MAX.
                let c = c.unwrap_or_else(|| panic!("no class for {size} at {align}"));
                assert_eq!(SLOT_SIZE[c] as usize % align, 0);
                assert!(SLOT_SIZE[c] as usize >= size);
            }
        }
        assert!(class_for(100, 1 << 17).is_none(), "above a slice: no class");
        assert!(class_for(SMALL_MAX + 1, 16).is_none());
    }
}
