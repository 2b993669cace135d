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
//! pushes out the one kept longest, which goes back to the heap. What
//! the kept spans gave back to the OS is counted ([`Kept::given_back`]):
//! the heap's figures leave it out of the memory that may be resident.

use crate::memory::layout::SLICE;
use core::cell::Cell;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Spans a thread keeps.
pub const SPANS: usize = 4;

/// Spans above this many bytes are kept without their memory, which goes
/// back to the OS at the free. (Read where guard pages are made: Linux.)
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub const KEPT_MAX: usize = 2 << 20;

/// A thread's kept spans (owner only).
pub struct Kept {
    /// Each span's start (0: none), usable bytes, and bytes of it given
    /// back to the OS while it is kept.
    spans: [Cell<(usize, usize, usize)>; SPANS],
    /// The entry the next span pushes out when all are taken.
    next: Cell<usize>,
    /// The sum of the spans' bytes given back (the owner writes, the
    /// heap's figures read it from any thread).
    given_back: AtomicU64,
}

impl Kept {
    /// Nothing kept.
    pub const fn new() -> Kept {
        Kept {
            spans: [const { Cell::new((0, 0, 0)) }; SPANS],
            next: Cell::new(0),
            given_back: AtomicU64::new(0),
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
                let (b, u, _) = c.get();
                b != 0 && u >= outer && u - outer <= slack
            })
            .min_by_key(|c| c.get().1)?;
        Some(self.out(best))
    }

    /// Keeps the span of `u` usable bytes at `b`, of which `given_back`
    /// bytes went back to the OS when it was shut, returning the one kept
    /// longest when all are taken, which must go back to the heap.
    #[inline]
    pub fn put(&self, b: *mut u8, u: usize, given_back: usize) -> Option<(*mut u8, usize)> {
        let slot = match self.spans.iter().position(|c| c.get().0 == 0) {
            Some(i) => i,
            None => {
                let i = self.next.get();
                self.next.set((i + 1) % SPANS);
                i
            }
        };
        let old = self.spans[slot].get();
        let out = (old.0 != 0).then(|| self.out(&self.spans[slot]));
        self.spans[slot].set((b as usize, u, given_back));
        self.count(given_back as u64, 0);
        out
    }

    /// Takes one kept span out, if any (called until it answers `None`).
    pub fn drain(&self) -> Option<(*mut u8, usize)> {
        let c = self.spans.iter().find(|c| c.get().0 != 0)?;
        Some(self.out(c))
    }

    /// Bytes of the kept spans given back to the OS (any thread may ask).
    pub fn given_back(&self) -> u64 {
        self.given_back.load(Relaxed)
    }

    /// Empties the entry `c` (a span): its start and usable bytes.
    fn out(&self, c: &Cell<(usize, usize, usize)>) -> (*mut u8, usize) {
        let (b, u, given_back) = c.replace((0, 0, 0));
        self.count(0, given_back as u64);
        (b as *mut u8, u)
    }

    /// Adds `more` to the bytes given back and takes `less` off (owner
    /// only: a load and a store).
    fn count(&self, more: u64, less: u64) {
        let now = self.given_back.load(Relaxed);
        self.given_back.store(now + more - less, Relaxed);
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
            assert_eq!(k.put(span(i), u, 0), None);
        }
        assert_eq!(k.take(mib), Some((span(1), mib)), "the smallest that fits");
        assert_eq!(k.take(mib), Some((span(3), mib + SLICE)), "a slice longer");
        assert_eq!(k.take(mib), None, "2 MiB is more than a quarter longer");
        assert_eq!(k.put(span(5), mib, 0), None, "a free entry");
        assert_eq!(k.put(span(6), mib, 0), None);
        // All four taken: the entry pushed out is the first one.
        assert_eq!(k.put(span(7), mib, 0), Some((span(5), mib)));
        let mut left = 0;
        while k.drain().is_some() {
            left += 1;
        }
        assert_eq!(left, 4);
        // A fifth longer than the block: within a quarter, taken.
        assert_eq!(k.put(span(8), mib + mib / 5, 0), None);
        assert_eq!(k.take(mib), Some((span(8), mib + mib / 5)));
        // Pushed out in turn, entry by entry, round and round.
        let k = Kept::new();
        for i in 0..SPANS {
            assert_eq!(k.put(span(10 + i), mib, 0), None);
        }
        for i in 0..2 * SPANS {
            let out = if i < SPANS { 10 + i } else { 20 + i - SPANS };
            assert_eq!(k.put(span(20 + i), mib, 0), Some((span(out), mib)));
        }
    }

    #[test]
    fn the_bytes_given_back_are_counted_while_their_span_is_kept() {
        let k = Kept::new();
        let span = |i: usize| (i << 24) as *mut u8;
        let mib = 1 << 20;
        assert_eq!(k.put(span(1), 24 * mib, 24 * mib), None);
        assert_eq!(k.put(span(2), mib, 0), None);
        assert_eq!(k.put(span(3), 8 * mib, 8 * mib), None);
        assert_eq!(k.given_back(), 32 << 20);
        assert_eq!(k.take(24 * mib), Some((span(1), 24 * mib)));
        assert_eq!(k.given_back(), 8 << 20, "taken: in use again");
        assert_eq!(k.put(span(4), 4 * mib, 4 * mib), None);
        assert_eq!(k.put(span(5), 3 * mib, 3 * mib), None);
        assert_eq!(k.given_back(), 15 << 20);
        // All four taken: the first entry's span goes (4 MiB given back).
        assert_eq!(k.put(span(6), mib, 0), Some((span(4), 4 * mib)));
        assert_eq!(k.given_back(), 11 << 20);
        while k.drain().is_some() {}
        assert_eq!(k.given_back(), 0);
    }
}
