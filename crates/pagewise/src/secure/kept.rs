//! The spans of the last few large blocks between guard pages a thread
//! freed (`fence.rs`), kept guarded and inaccessible for its next large
//! blocks: a write after free faults while the span is kept, and arming and
//! disarming a span's guards costs four system calls, which a program that
//! allocates and frees large buffers over and over then does not pay (it
//! pays two: one to shut the block at the free, one to open it again).
//!
//! [`SPANS`] spans; those of more than [`KEPT_MAX`] bytes are kept without
//! their memory (`fence::shut`), so the bytes kept a thread are at most
//! 8 MiB; a block takes the smallest kept span that holds it and is at
//! most a quarter (or a slice) longer; a span freed when all are taken
//! pushes out the one kept longest, which goes back to the heap.

use crate::memory::layout::SLICE;
use core::cell::Cell;

/// Spans a thread keeps.
pub const SPANS: usize = 4;

/// Spans above this many bytes are kept without their memory, which goes
/// back to the OS at the free. (Read where guard pages are made: Linux.)
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub const KEPT_MAX: usize = 2 << 20;

/// A thread's kept spans (owner only).
pub struct Kept {
    /// Each span's start (0: none) and usable bytes.
    spans: [Cell<(usize, usize)>; SPANS],
    /// The entry the next span pushes out when all are taken.
    next: Cell<usize>,
}

impl Kept {
    /// Nothing kept.
    pub const fn new() -> Kept {
        Kept {
            spans: [const { Cell::new((0, 0)) }; SPANS],
            next: Cell::new(0),
        }
    }

    /// The smallest kept span that holds a block of `outer` bytes and is
    /// at most a quarter (or a slice) longer, taken out: its start and its
    /// usable bytes.
    #[inline]
    pub fn take(&self, outer: usize) -> Option<(*mut u8, usize)> {
        let slack = (outer / 4).max(SLICE);
        let best = self
            .spans
            .iter()
            .filter(|c| {
                let (b, u) = c.get();
                b != 0 && u >= outer && u - outer <= slack
            })
            .min_by_key(|c| c.get().1)?;
        let (b, u) = best.replace((0, 0));
        Some((b as *mut u8, u))
    }

    /// Keeps the span of `u` usable bytes at `b`, returning the one kept
    /// longest when all are taken, which must go back to the heap.
    #[inline]
    pub fn put(&self, b: *mut u8, u: usize) -> Option<(*mut u8, usize)> {
        let slot = match self.spans.iter().position(|c| c.get().0 == 0) {
            Some(i) => i,
            None => {
                let i = self.next.get();
                self.next.set((i + 1) % SPANS);
                i
            }
        };
        let (old, old_u) = self.spans[slot].replace((b as usize, u));
        (old != 0).then_some((old as *mut u8, old_u))
    }

    /// Takes one kept span out, if any (called until it answers `None`).
    pub fn drain(&self) -> Option<(*mut u8, usize)> {
        let c = self.spans.iter().find(|c| c.get().0 != 0)?;
        let (b, u) = c.replace((0, 0));
        Some((b as *mut u8, u))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_takes_the_smallest_span_that_fits_and_the_oldest_goes_first() {
        let k = Kept::new();
        let span = |i: usize| (i << 24) as *mut u8;
        let mib = 1 << 20;
        for (i, u) in [(1, mib), (2, mib / 2), (3, mib + SLICE), (4, 2 * mib)] {
            assert_eq!(k.put(span(i), u), None);
        }
        assert_eq!(k.take(mib), Some((span(1), mib)), "the smallest that fits");
        assert_eq!(k.take(mib), Some((span(3), mib + SLICE)), "a slice longer");
        assert_eq!(k.take(mib), None, "2 MiB is more than a quarter longer");
        assert_eq!(k.put(span(5), mib), None, "a free entry");
        assert_eq!(k.put(span(6), mib), None);
        // All four taken: the entry pushed out is the first one.
        assert_eq!(k.put(span(7), mib), Some((span(5), mib)));
        let mut left = 0;
        while k.drain().is_some() {
            left += 1;
        }
        assert_eq!(left, 4);
    }
}
