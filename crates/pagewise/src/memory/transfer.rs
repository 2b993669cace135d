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
//! The cache is generic over the lock's flag (`sync/lock.rs`), so the loom
//! model at the end of this file runs these stacks under this lock on
//! loom's atomics; the allocator's is [`GLOBAL`], on `core`'s.

use crate::memory::block::Block;
use crate::memory::size_class::{CLASSES, SLOT_SIZE};
use crate::sync::lock::{Flag, Locked};
use core::ptr::null_mut;
use core::sync::atomic::AtomicBool;

/// Batches per class.
pub const DEPTH: usize = 64;
/// Most bytes of slots per class: 2 MiB, twice that in the hardened
/// build, whose blocks take larger slots for the same requests (one that
/// fills its class exactly goes up a class for its canary, so that class
/// receives the blocks of two): the cache then holds about as many of a
/// program's blocks as the default build's, rather than sending the rest
/// home to their pages to be carved out again.
pub const MAX_BYTES: usize = if cfg!(feature = "secure") {
    4 << 20
} else {
    2 << 20
};

/// A chain of cached slots of one class, linked through `Block::next`.
#[derive(Clone, Copy, Debug)]
pub struct Batch {
    /// First slot.
    pub head: *mut Block,
    /// Slots in the chain (walk by count: a double free makes a cycle).
    pub count: u32,
    /// When it was put here (the purger's clock), for the decay.
    pub at_ms: u64,
    /// The address of the heap whose full cache passed it on (0 for none:
    /// a thread's last caches), so that a heap taking its own batch back
    /// knows its cache was too short for what it cycles through.
    pub from: usize,
}

impl Batch {
    const EMPTY: Batch = Batch {
        head: null_mut(),
        count: 0,
        at_ms: 0,
        from: 0,
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

/// The process's transfer cache: one stack per size class (the first
/// `N` classes: all of them but in the loom model, which keeps its
/// schedules short with a few).
pub struct Transfer<F: Flag = AtomicBool, const N: usize = CLASSES> {
    classes: [Locked<Stack, F>; N],
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
}

#[cfg(all(test, loom))]
impl<const N: usize> Transfer<crate::sync::lock::ModelFlag, N> {
    /// Empty stacks whose locks are on loom's atomics (inside
    /// `loom::model` only). Built in place: the cache is larger than a
    /// loom thread's stack.
    pub fn new_model() -> Box<Self> {
        let mut t = Box::<Self>::new_uninit();
        let p = t.as_mut_ptr();
        for class in 0..N {
            // SAFETY: `p` is the box's memory; each class is written once.
            unsafe {
                core::ptr::addr_of_mut!((*p).classes[class]).write(Locked::new_model(Stack::new()))
            };
        }
        // SAFETY: every field (the array of classes) was written above.
        unsafe { t.assume_init() }
    }
}

impl<F: Flag, const N: usize> Transfer<F, N> {
    /// The lock of `class` (for the fork handlers).
    pub fn lock_of(&self, class: usize) -> &Locked<Stack, F> {
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
        for class in 0..N {
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

    /// Calls `f` with every batch of `class`, the class's lock held
    /// throughout (so no batch is taken meanwhile); false if the lock was
    /// busy (then `f` is not called).
    pub fn with_batches(&self, class: usize, f: impl FnOnce(&[Batch])) -> bool {
        let Some(s) = self.classes[class].try_lock() else {
            return false;
        };
        f(&s.batches[..s.len]);
        true
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
            from: 0,
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
    fn the_hardened_build_holds_twice_the_bytes_of_a_class() {
        // 4 MiB of the largest class (256 KiB slots) in one batch: taken
        // in the hardened build, refused in the default one.
        let t = Transfer::new();
        let big = CLASSES - 1;
        let slots = ((4 << 20) / SLOT_SIZE[big] as usize) as u32;
        let took = t.put(big, batch(1, slots, 0)).is_ok();
        assert_eq!(took, cfg!(feature = "secure"));
        if took {
            assert!(t.put(big, batch(2, 1, 0)).is_err(), "and not a slot more");
        }
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

#[cfg(all(test, loom))]
mod loom_model {
    //! The transfer cache's stacks under their locks, the allocator's code
    //! on loom's atomics (`Transfer::new_model`), under every interleaving
    //! loom finds: two threads put batches (one also takes) while the
    //! purger drains. Each batch is a chain of slots whose links are loom
    //! cells, written by the thread that puts it and walked by the one that
    //! gets it; the stacks themselves are checked through the lock's loom
    //! cell. A stack touched by two threads that the lock does not order,
    //! or a chain read before its links are visible, is a data race.
    use super::*;
    use crate::sync::lock::ModelFlag;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    const CLASS: usize = 3;

    struct World {
        transfer: Box<Transfer<ModelFlag, { CLASS + 1 }>>,
        /// Per slot: the next slot of its batch, + 1 (0: none).
        links: Vec<UnsafeCell<usize>>,
    }

    // SAFETY: the batches' raw pointers are identities of `links`, handed
    // over under the class lock.
    unsafe impl Send for World {}
    // SAFETY: as above.
    unsafe impl Sync for World {}

    impl World {
        fn slot(&self, i: usize) -> *mut Block {
            &self.links[i] as *const UnsafeCell<usize> as *mut Block
        }

        fn index(&self, b: *mut Block) -> usize {
            (0..self.links.len()).find(|&i| self.slot(i) == b).unwrap()
        }

        /// Links slots `first..first + count` into a batch and puts it.
        fn put(&self, first: usize, count: usize, at_ms: u64) {
            for i in first..first + count {
                let next = if i + 1 < first + count { i + 2 } else { 0 };
                // SAFETY: loom checks the access; the slots are ours.
                self.links[i].with_mut(|l| unsafe { *l = next });
            }
            let b = Batch {
                head: self.slot(first),
                count: count as u32,
                at_ms,
                from: 0,
            };
            self.transfer.put(CLASS, b).unwrap();
        }

        /// The slots of a batch got from the cache, by its links.
        fn walk(&self, b: Batch) -> Vec<usize> {
            let mut out = vec![self.index(b.head)];
            for _ in 1..b.count {
                let last = *out.last().unwrap();
                // SAFETY: loom checks the access.
                let next = self.links[last].with(|l| unsafe { *l });
                out.push(next - 1);
            }
            out
        }
    }

    /// A thread puts two batches while another takes and the purger
    /// drains: every slot comes out once, its batch's links intact. (One
    /// thread waits in `lock`, the others use `try_lock`: two waiters
    /// yielding to each other while the holder is preempted is a schedule
    /// loom would follow without end.)
    #[test]
    fn puts_takes_and_a_drain_hand_each_slot_over_once() {
        loom::model(|| {
            let w = Arc::new(World {
                transfer: Transfer::new_model(),
                links: (0..3).map(|_| UnsafeCell::new(0)).collect(),
            });
            let putter = {
                let w = w.clone();
                loom::thread::spawn(move || {
                    w.put(0, 2, 1);
                    w.put(2, 1, 2);
                })
            };
            let taker = {
                let w = w.clone();
                loom::thread::spawn(move || {
                    w.transfer.take(CLASS).map_or(Vec::new(), |b| w.walk(b))
                })
            };
            // The purger, which must not wait for a busy class.
            let mut got = Vec::new();
            w.transfer.drain(u64::MAX, false, |class, b| {
                assert_eq!(class, CLASS);
                got.extend(w.walk(b));
            });
            putter.join().unwrap();
            got.extend(taker.join().unwrap());
            w.transfer
                .drain(u64::MAX, true, |_, b| got.extend(w.walk(b)));
            got.sort();
            assert_eq!(got, [0, 1, 2], "each slot handed over once");
            assert_eq!(w.transfer.slots(CLASS), 0);
        });
    }
}
