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
#[derive(Clone, Copy)]
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
