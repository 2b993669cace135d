//! The transfer cache: per size class, a short stack of batches of free
//! slots that thread caches of the global allocator pass to each other.
//!
//! A thread cache that overflows puts its older half here, as one batch,
//! instead of sending each slot home to its page; a thread whose cache and
//! pages of the class are empty takes a batch before it carves a new page.
//! So memory one thread frees is allocated again by whichever thread asks
//! next, as tcmalloc's transfer cache and central lists share it, instead
//! of waiting in the pages of the heap that allocated it, which only that
//! heap's thread reuses. Without it, a program whose threads free each
//! other's objects and come and go keeps free slots spread over every
//! heap's pages.
//!
//! Slots here are cached slots (they hold the cache key): from their page's
//! point of view they are still in use, exactly as in a thread cache. The
//! background purger sends batches older than the decay delay home
//! (`drain`), so an idle program's slots do not stay here; `trim()` sends
//! all of them.
//!
//! Each class has its own spin lock, taken only on slow paths (a cache
//! overflow, a cache refill, the purger), and held by the fork handlers.

use crate::memory::block::Block;
use crate::memory::size_class::{CLASSES, SLOT_SIZE};
use crate::sync::lock::Locked;
use core::ptr::null_mut;

/// Batches per class.
pub const DEPTH: usize = 64;
/// Most bytes of slots per class.
pub const MAX_BYTES: usize = 2 << 20;

/// A chain of cached slots of one class, linked through `Block::next`.
#[derive(Clone, Copy, Debug)]
pub struct Batch {
    /// First slot.
    pub head: *mut Block,
    /// Slots in the chain (walk by count: a double free makes a cycle).
    pub count: u32,
    /// When it was put here (the purger's clock), for the decay.
    pub at_ms: u64,
}

impl Batch {
    const EMPTY: Batch = Batch {
        head: null_mut(),
        count: 0,
        at_ms: 0,
    };
}

/// One class's stack of batches.
pub struct Stack {
    batches: [Batch; DEPTH],
    len: usize,
    slots: usize,
}

impl Stack {
    const fn new() -> Stack {
        Stack {
            batches: [Batch::EMPTY; DEPTH],
            len: 0,
            slots: 0,
        }
    }
}

/// The process's transfer cache: one stack per size class.
pub struct Transfer {
    classes: [Locked<Stack>; CLASSES],
}

// SAFETY: the raw pointers are slots handed from thread to thread under
// the class lock; nothing in them is thread-bound.
unsafe impl Send for Stack {}

/// The global allocator's transfer cache.
pub static GLOBAL: Transfer = Transfer::new();

impl Transfer {
    /// Empty stacks (usable in a `static`).
    pub const fn new() -> Transfer {
        Transfer {
            classes: [const { Locked::new(Stack::new()) }; CLASSES],
        }
    }

    /// The lock of `class` (for the fork handlers).
    pub fn lock_of(&self, class: usize) -> &Locked<Stack> {
        &self.classes[class]
    }

    /// Takes `batch` unless the class's stack is full (then gives it back).
    pub fn put(&self, class: usize, batch: Batch) -> Result<(), Batch> {
        let bytes = batch.count as usize * SLOT_SIZE[class] as usize;
        let mut s = self.classes[class].lock();
        if s.len == DEPTH || (s.slots * SLOT_SIZE[class] as usize) + bytes > MAX_BYTES {
            return Err(batch);
        }
        let at = s.len;
        s.batches[at] = batch;
        s.len += 1;
        s.slots += batch.count as usize;
        Ok(())
    }

    /// The most recent batch of `class`, if any.
    pub fn take(&self, class: usize) -> Option<Batch> {
        let mut s = self.classes[class].try_lock()?;
        if s.len == 0 {
            return None;
        }
        s.len -= 1;
        let b = s.batches[s.len];
        s.slots -= b.count as usize;
        Some(b)
    }

    /// Takes every batch put at or before `cutoff_ms` (all with
    /// `u64::MAX`), oldest first, and hands each to `send`. With `wait`
    /// false, a class whose lock is busy is skipped.
    pub fn drain(&self, cutoff_ms: u64, wait: bool, mut send: impl FnMut(usize, Batch)) {
        for class in 0..CLASSES {
            loop {
                let b = {
                    let lock = &self.classes[class];
                    let Some(mut s) = (if wait {
                        Some(lock.lock())
                    } else {
                        lock.try_lock()
                    }) else {
                        break;
                    };
                    if s.len == 0 || s.batches[0].at_ms > cutoff_ms {
                        break;
                    }
                    let b = s.batches[0];
                    let len = s.len;
                    s.batches.copy_within(1..len, 0);
                    s.len -= 1;
                    s.slots -= b.count as usize;
                    b
                };
                send(class, b);
            }
        }
    }

    /// Slots held for `class`.
    pub fn slots(&self, class: usize) -> usize {
        self.classes[class].lock().slots
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of `count` made-up slots (never dereferenced here).
    fn batch(tag: usize, count: u32, at_ms: u64) -> Batch {
        Batch {
            head: (tag * 4096) as *mut Block,
            count,
            at_ms,
        }
    }

    #[test]
    fn takes_the_most_recent_batch_and_counts_slots() {
        let t = Transfer::new();
        t.put(3, batch(1, 10, 5)).unwrap();
        t.put(3, batch(2, 20, 6)).unwrap();
        assert_eq!(t.slots(3), 30);
        assert_eq!(t.take(3).unwrap().head as usize, 2 * 4096);
        assert_eq!(t.slots(3), 10);
        assert!(t.take(4).is_none(), "classes are separate");
        assert_eq!(t.take(3).unwrap().count, 10);
        assert!(t.take(3).is_none());
    }

    #[test]
    fn refuses_past_its_depth_or_its_bytes() {
        let t = Transfer::new();
        for i in 0..DEPTH {
            t.put(0, batch(i + 1, 1, 0)).unwrap();
        }
        assert!(t.put(0, batch(99, 1, 0)).is_err(), "depth");
        // The largest class: 256 KiB slots, so 2 MiB is 8 slots.
        let big = CLASSES - 1;
        let fits = (MAX_BYTES / SLOT_SIZE[big] as usize) as u32;
        t.put(big, batch(1, fits, 0)).unwrap();
        let refused = t.put(big, batch(2, 1, 0)).unwrap_err();
        assert_eq!(refused.head as usize, 2 * 4096, "the batch comes back");
    }

    #[test]
    fn drains_the_oldest_up_to_the_cutoff() {
        let t = Transfer::new();
        t.put(1, batch(1, 1, 10)).unwrap();
        t.put(1, batch(2, 1, 20)).unwrap();
        t.put(2, batch(3, 1, 15)).unwrap();
        let mut sent = Vec::new();
        t.drain(15, true, |class, b| {
            sent.push((class, b.head as usize / 4096))
        });
        assert_eq!(sent, [(1, 1), (2, 3)]);
        assert_eq!((t.slots(1), t.slots(2)), (1, 0));
        t.drain(u64::MAX, true, |class, b| {
            sent.push((class, b.head as usize / 4096))
        });
        assert_eq!(sent.last(), Some(&(1, 2)));
        assert_eq!(t.slots(1), 0);
    }

    #[test]
    fn a_drain_that_must_not_wait_skips_a_busy_class() {
        let t = Transfer::new();
        t.put(1, batch(1, 1, 0)).unwrap();
        let held = t.lock_of(1).lock();
        let mut sent = 0;
        t.drain(u64::MAX, false, |_, _| sent += 1);
        drop(held);
        assert_eq!((sent, t.slots(1)), (0, 1));
    }
}
