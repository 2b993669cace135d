//! Which bytes of a huge object's segment run may hold data: the one fact
//! `calloc` trusts when it skips zeroing a huge object.
//!
//! A huge run is reused for the next huge request it fits, possibly at
//! another offset (a larger alignment). A *count* of dirty bytes, as kept
//! before, loses where they are: reused at a higher offset, the bytes below
//! it were neither purged nor zeroed, and once the count reached zero the
//! run passed for fresh. [`Resident`] keeps the position instead, and its
//! fields are private, so the only ways to change it are the events that
//! change the pages: an object placed, a purge that succeeded.

/// The bytes of a run that may be resident, as offsets from its base: the
/// hull of every object placed there since the last purge.
///
/// Objects are contiguous, so the hull is exact for one placement and
/// conservative after reuse at another offset: it may count untouched pages
/// between two placements as resident, never a resident page as clean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resident {
    lo: usize,
    hi: usize,
}

/// What placing an object did to a run's resident bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// No byte of the object may hold old data (it reads as zero if the run
    /// was fresh or every purge was `MADV_DONTNEED`).
    pub was_clean: bool,
    /// Bytes the resident range grew by (newly counted as committed).
    pub grown: usize,
}

impl Resident {
    /// Nothing resident: a fresh run, or one just purged.
    pub const NONE: Resident = Resident { lo: 0, hi: 0 };

    /// Bytes that may be resident.
    pub fn bytes(&self) -> usize {
        self.hi - self.lo
    }

    /// Whether any byte may be resident.
    pub fn any(&self) -> bool {
        self.hi > self.lo
    }

    /// An object now occupies `lo..hi`: the resident range grows to cover it.
    pub fn place(&mut self, lo: usize, hi: usize) -> Placed {
        debug_assert!(lo < hi);
        if !self.any() {
            *self = Resident { lo, hi };
            return Placed {
                was_clean: true,
                grown: hi - lo,
            };
        }
        let was_clean = hi <= self.lo || lo >= self.hi;
        let before = self.bytes();
        self.lo = self.lo.min(lo);
        self.hi = self.hi.max(hi);
        Placed {
            was_clean,
            grown: self.bytes() - before,
        }
    }

    /// The parts of the resident range outside `lo..hi` (an object just
    /// placed there), as (offset, length): what a reused run may purge so
    /// that only the object stays resident.
    pub fn outside(&self, lo: usize, hi: usize) -> [Option<(usize, usize)>; 2] {
        let before = (self.lo < lo).then(|| (self.lo, lo - self.lo));
        let after = (self.hi > hi).then(|| (hi, self.hi - hi));
        [before, after]
    }

    /// Those parts were purged: only `lo..hi` is resident (it must lie
    /// inside the range). Returns the bytes released.
    pub fn purged_outside(&mut self, lo: usize, hi: usize) -> usize {
        debug_assert!(self.lo <= lo && hi <= self.hi);
        let before = self.bytes();
        *self = Resident { lo, hi };
        before - self.bytes()
    }

    /// The range to purge, as (offset, length), if anything is resident.
    pub fn range(&self) -> Option<(usize, usize)> {
        self.any().then_some((self.lo, self.bytes()))
    }

    /// The purge of [`Resident::range`] succeeded: nothing is resident.
    /// Returns the bytes it released.
    pub fn purged(&mut self) -> usize {
        let bytes = self.bytes();
        *self = Resident::NONE;
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_at_another_offset_keeps_what_lies_below() {
        let mut r = Resident::NONE;
        // A 40 MiB object at 128 KiB, then a 30 MiB one at 2 MiB.
        let p = r.place(128 << 10, (128 << 10) + (40 << 20));
        assert_eq!(
            p,
            Placed {
                was_clean: true,
                grown: 40 << 20
            }
        );
        let p = r.place(2 << 20, (2 << 20) + (30 << 20));
        assert_eq!(
            p,
            Placed {
                was_clean: false,
                grown: 0
            }
        );
        // The purge covers the first object's bytes, below the second.
        assert_eq!(r.range(), Some((128 << 10, 40 << 20)));
        assert_eq!(r.purged(), 40 << 20);
        assert!(!r.any());
        assert!(r.place(2 << 20, 3 << 20).was_clean);
    }

    #[test]
    fn disjoint_placements_are_clean_and_the_hull_counts_the_gap() {
        let mut r = Resident::NONE;
        r.place(1 << 20, 2 << 20);
        let p = r.place(4 << 20, 5 << 20);
        assert!(p.was_clean);
        assert_eq!(p.grown, 3 << 20);
        assert_eq!(r.bytes(), 4 << 20);
    }
}
