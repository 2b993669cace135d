//! A heap's side of the transfer cache (`memory/transfer.rs`): the older
//! half of an overflowing thread cache goes there as one batch, and a class
//! with no free slot in the heap's pages takes a batch before a new page.
//! Global heaps only: an owned `Heap`'s slots never leave it.

use super::cache::GROWN;
use super::remote::send_home;
use super::*;
use crate::memory::transfer::{Batch, Transfer, GLOBAL};

impl HeapCore {
    /// The transfer cache this heap passes batches through.
    pub(super) fn transfer(&self) -> &Transfer {
        debug_assert!(!self.transfer.is_null(), "a global heap");
        // SAFETY: a global heap's transfer cache is a static (`init_at`),
        // or in a test one that outlives its heaps.
        unsafe { &*self.transfer }
    }

    /// Passes all but the `keep` most recent cached slots of `class` to
    /// the transfer cache, or home to their pages if it is full. `signed`:
    /// the batch names this heap, which then grows its cache if it takes
    /// the batch back itself (`alloc_from_transfer`): a full cache's pass,
    /// not a thread's last.
    ///
    /// # Safety
    /// Owner only, with its page lists held; a global heap.
    pub(super) unsafe fn pass_older(&self, l: &mut Local, class: usize, keep: u32, signed: bool) {
        // SAFETY: owner only (caller).
        unsafe {
            let (head, count) = self.take_cached(class, keep);
            self.pass_on(l, class, head, count, signed);
        }
    }

    /// Passes `count` cached slots of `class` at `head`, detached from
    /// this heap's cache, to the transfer cache as one batch, or home to
    /// their pages if it is full (`signed` as in [`HeapCore::pass_older`]).
    ///
    /// # Safety
    /// Owner only, with its page lists held; a global heap; the chain holds
    /// `count` cached slots of `class` no one else uses.
    pub(super) unsafe fn pass_on(
        &self,
        l: &mut Local,
        class: usize,
        head: *mut Block,
        count: u32,
        signed: bool,
    ) {
        debug_assert!(self.global);
        if count == 0 {
            return;
        }
        let at_ms = self.source().now_ms();
        let from = if signed { self.me() as usize } else { 0 };
        let batch = Batch {
            head,
            count,
            at_ms,
            from,
        };
        if let Err(b) = self.transfer().put(class, batch) {
            // SAFETY: `count` cached slots detached from our cache.
            unsafe { send_home(Some((self, l)), b.head, b.count) };
        }
    }

    /// Doubles the bound of `class`'s cache, up to the class's [`GROWN`]
    /// (owner only, on a slow path).
    pub(super) fn grow_cache(&self, class: usize) {
        let state = self.class(class);
        state.set_limit(state.limit().saturating_mul(2).min(GROWN[class]));
    }

    /// Takes a batch of `class` from the transfer cache into this heap's
    /// (empty) cache and allocates its first slot; null if there is none.
    ///
    /// # Safety
    /// Owner only; a global heap.
    pub(super) unsafe fn alloc_from_transfer(&self, class: usize) -> *mut u8 {
        debug_assert!(self.global);
        let state = self.class(class);
        // (The slow path comes with an empty cache; the hardened one's
        // holds the slots that wait for later frees, at most its depth.)
        #[cfg(not(feature = "secure"))]
        let takes = state.cached() == 0;
        #[cfg(feature = "secure")]
        let takes = state.takes_batch();
        if !takes {
            return null_mut();
        }
        let Some(b) = self.transfer().take(class) else {
            return null_mut();
        };
        if b.from == self.me() as usize {
            // Our own overflow, back before anyone else wanted it: the
            // thread cycles through more slots than its cache holds.
            self.grow_cache(class);
        }
        // SAFETY: owner only; the batch holds `count` cached slots of this
        // class, which are now ours.
        unsafe {
            self.install_cached(class, b.head, b.count);
            state.pop() as *mut u8
        }
    }
}

/// Sends every batch of the transfer cache put at or before `cutoff_ms`
/// home to its pages (all of them with `u64::MAX`): the purger's pass,
/// `trim()`, and the memory limit (which must not wait: `wait` false skips
/// a class another thread is using). The calling thread need not have a
/// heap: every slot goes to its page as a remote free, which the page's
/// heap (or a visitor of an abandoned one) takes in.
pub fn send_home_older_than(cutoff_ms: u64, wait: bool) {
    GLOBAL.drain(cutoff_ms, wait, |_, b| {
        // SAFETY: a batch taken off the transfer cache: `count` cached
        // slots no one else holds, of global heaps' pages (never freed).
        unsafe { send_home(None, b.head, b.count) }
    });
}

#[cfg(test)]
mod tests {
    //! The heap side of the transfer cache on the fake page source, small
    //! enough for Miri (`cargo +nightly miri test -p pagewise --lib
    //! transfer`): two thread heaps of the global allocator's kind (global,
    //! shared reservations) on a transfer cache of their own, through
    //! `HeapCore`'s allocation and free paths. Kept to a dozen operations
    //! (a few seconds under Miri), but for the cache's growth, which takes
    //! rounds of hundreds and runs outside Miri only.
    use super::*;
    use crate::config::Config;
    #[cfg(not(feature = "secure"))]
    use crate::heap::cache::GROWN;
    use crate::heap::cache::LIMITS;
    use crate::memory::budget::Budget;
    use crate::memory::layout::SEGMENT;
    use crate::memory::reservation::Reservations;
    use crate::os::source::FakePages;
    use core::cell::UnsafeCell;
    use core::mem::MaybeUninit;

    /// Room for a heap in a static: Miri reports leaks not reachable from
    /// one.
    struct Spot(UnsafeCell<MaybeUninit<HeapCore>>);
    // SAFETY: each spot is initialised once, by the one test that uses it,
    // and then used as a `HeapCore` (which is `Sync`).
    unsafe impl Sync for Spot {}

    /// What one test's two heaps share (each test has its own: tests run
    /// at once).
    struct World {
        src: FakePages,
        reservations: Locked<Reservations>,
        budget: Budget,
        transfer: Transfer,
        heaps: [Spot; 2],
    }

    impl World {
        const fn new() -> World {
            World {
                src: FakePages::new(),
                reservations: Locked::new(Reservations::new()),
                budget: Budget::new(),
                transfer: Transfer::new(),
                heaps: [const { Spot(UnsafeCell::new(MaybeUninit::uninit())) }; 2],
            }
        }

        /// Heap `i` (made once), a global heap on this world's fake source
        /// whose transfer cache is this world's.
        fn heap(&'static self, i: usize) -> &'static HeapCore {
            let config = Config {
                // One segment per reservation keeps the fake mappings small.
                reservation_bytes: SEGMENT,
                decay_ms: 10,
                ..Config::DEFAULT
            };
            let at = self.heaps[i].0.get() as *mut HeapCore;
            // SAFETY: the spot is static, aligned memory for a heap, used
            // by no one yet (each test makes its heaps once); the source,
            // reservations, budget and transfer cache are in the same
            // static.
            unsafe {
                HeapCore::init_at(
                    at,
                    &self.src,
                    &self.reservations,
                    &self.budget,
                    config,
                    true,
                );
                (*at).transfer = &self.transfer;
                &*at
            }
        }
    }

    #[cfg(not(feature = "secure"))]
    static ONE: World = World::new();
    #[cfg(not(feature = "secure"))]
    static TWO: World = World::new();
    #[cfg(not(feature = "secure"))]
    static THREE: World = World::new();
    static FOUR: World = World::new();
    #[cfg(feature = "secure")]
    static FIVE: World = World::new();
    #[cfg(feature = "secure")]
    static SIX: World = World::new();

    #[cfg(not(feature = "secure"))]
    /// The class of 64 KiB slots, whose cache holds two: the third free
    /// overflows. Its slot size.
    fn class_and_size() -> (usize, usize) {
        let class = crate::size_class::class_of(64 << 10);
        assert_eq!(LIMITS[class], 2);
        (class, SLOT_SIZE[class] as usize)
    }

    /// A heap whose class cache overflows passes its older slots to the
    /// transfer cache; another heap with nothing of the class takes them
    /// before it carves a page, uses them, and frees them; they go home
    /// to the first heap's page, which then empties and is released.
    // The default build's cache: a stack of the usual bounds.
    #[cfg(not(feature = "secure"))]
    #[test]
    fn a_heap_allocates_the_slots_another_passed_to_the_transfer_cache() {
        let (class, size) = class_and_size();
        let w = &ONE;
        let (a, b) = (w.heap(0), w.heap(1));
        // SAFETY: each heap is used by this thread alone, as its owner;
        // every block is live until its free, freed once.
        unsafe {
            let slots: Vec<*mut u8> = (0..3).map(|_| a.alloc(size, 16)).collect();
            for (i, &p) in slots.iter().enumerate() {
                assert!(!p.is_null());
                p.write_bytes(i as u8 + 1, size);
            }
            for &p in &slots {
                HeapCore::free_any(p, a);
            }
            // The cache held two; the third free passed the older one on.
            assert_eq!(a.class(class).cached(), 2);
            assert_eq!(w.transfer.slots(class), 1, "the older half, as a batch");
            let q = b.alloc(size, 16);
            assert_eq!(q, slots[0], "the slot the other heap passed on");
            assert_eq!(w.transfer.slots(class), 0);
            assert_eq!(b.page_counts[class].pages.get(), 0, "no page carved");
            // Past the cache's two words, the first heap's thread's bytes.
            assert_eq!(q.add(size - 1).read(), 1);
            q.write_bytes(0x5a, size);
            HeapCore::free_any(q, b);
            assert_eq!(b.class(class).cached(), 1, "into the freeing heap's cache");
            // Its trim sends the slot home to the first heap's page, as a
            // remote free, and that heap's trim takes it in: the page
            // empties and goes.
            b.trim();
            a.trim();
            assert_eq!(a.page_counts[class].pages.get(), 0);
            assert_eq!(a.class(class).cached() + b.class(class).cached(), 0);
            assert_eq!(a.slab_committed.get() + b.slab_committed.get(), 0);
        }
    }

    /// The same on two threads at once: one heap's thread overflows its
    /// cache into the transfer cache while another heap's thread
    /// allocates, uses and frees a slot, taken from there or carved anew
    /// as the race goes (Miri checks every access to the slots across the
    /// threads: the class lock must order them). Whatever the transfer
    /// cache still holds then goes home as the purger's drain sends it, and
    /// both heaps end with no page.
    // The default build's cache: a stack of the usual bounds.
    #[cfg(not(feature = "secure"))]
    #[test]
    fn threads_hand_slots_over_through_the_transfer_cache() {
        let (class, size) = class_and_size();
        let w = &TWO;
        let (a, b) = (w.heap(0), w.heap(1));
        // SAFETY (both threads): each heap is used by one thread at a time
        // as its owner (the main thread after the joins); every block is
        // live until its free, freed once.
        let freer = std::thread::spawn(move || unsafe {
            let slots: Vec<usize> = (0..3).map(|_| a.alloc(size, 16) as usize).collect();
            for &p in &slots {
                (p as *mut u8).write_bytes(7, size);
            }
            for &p in &slots {
                HeapCore::free_any(p as *mut u8, a);
            }
        });
        let taker = std::thread::spawn(move || unsafe {
            let q = b.alloc(size, 16);
            assert!(!q.is_null());
            // Carved from a page of its own, or taken from the transfer
            // cache (its address alone cannot tell: a page this heap
            // released may be the freer's next).
            let carved = b.page_counts[class].pages.get() > 0;
            q.write_bytes(9, size);
            HeapCore::free_any(q, b);
            b.trim();
            !carved
        });
        freer.join().unwrap();
        let taken = taker.join().unwrap();
        assert_eq!(w.transfer.slots(class), !taken as usize);
        w.transfer.drain(u64::MAX, true, |_, batch| {
            // SAFETY: a batch taken off the transfer cache: cached slots
            // no one else holds, of the first heap's page.
            unsafe { send_home(None, batch.head, batch.count) }
        });
        // SAFETY: the first heap's thread has ended (joined).
        unsafe { a.trim() };
        assert_eq!(
            a.page_counts[class].pages.get() + b.page_counts[class].pages.get(),
            0
        );
        assert_eq!(a.slab_committed.get() + b.slab_committed.get(), 0);
    }

    /// A heap that allocates more slots of a class than its cache holds,
    /// then frees them all, round after round (the C library's small-block
    /// benchmark at its larger counts), takes its own overflow back from
    /// the transfer cache: its cache grows until a round fits, and then no
    /// slot goes through the transfer cache at all. The bound goes back
    /// when the cache goes to another owner, or over maintenance passes.
    /// (Before caches grew, every round passed 128 of the 200 slots to the
    /// transfer cache and took them back.) Not under Miri: its 800 frees
    /// take minutes there, and the paths they take are the other tests'.
    // The default build's cache: a stack of the usual bounds.
    #[cfg(not(feature = "secure"))]
    #[test]
    #[cfg_attr(miri, ignore = "800 frees take minutes under Miri")]
    fn a_heap_that_takes_its_own_overflow_back_grows_its_cache() {
        let class = crate::size_class::class_of(512);
        let size = SLOT_SIZE[class] as usize;
        assert_eq!((LIMITS[class], GROWN[class]), (128, 256));
        const N: usize = 200;
        let w = &THREE;
        let (a, b) = (w.heap(0), w.heap(1));
        let mut passed = vec![];
        // SAFETY: each heap is used by this thread alone, as its owner;
        // every block is live until its free, freed once.
        unsafe {
            for _ in 0..4 {
                let blocks: Vec<*mut u8> = (0..N).map(|_| a.alloc(size, 16)).collect();
                for (i, &p) in blocks.iter().enumerate() {
                    assert!(!p.is_null());
                    p.write_bytes(i as u8, size);
                }
                // The first half first in, first out; the rest last in,
                // first out.
                let (older, newer) = blocks.split_at(N / 2);
                for &p in older.iter().chain(newer.iter().rev()) {
                    HeapCore::free_any(p, a);
                }
                passed.push(w.transfer.slots(class));
            }
            assert_eq!(
                passed,
                [128, 0, 0, 0],
                "slots in the transfer cache after each round"
            );
            // Grown to the class's 128 KiB, the cache holds every slot the
            // first round carved on its two 64 KiB pages (up to the end of
            // an OS page: 200 at 4 KiB OS pages, 224 at 16, all 256 at 64):
            // later rounds took their overflow back before carving more.
            let grown = GROWN[class];
            let carved = N.next_multiple_of(crate::memory::layout::os_page() / size);
            let n = carved.min(grown as usize);
            assert_eq!(a.class(class).limit(), grown);
            assert_eq!(a.class(class).cached(), n as u32);
            assert_eq!(a.page_counts[class].pages.get(), 2);
            // The thread's exit passes its whole cache on and leaves the
            // heap's caches short for an adopter. A cache that takes more
            // than it holds grows to take it.
            a.abandon();
            assert_eq!(a.class(class).limit(), LIMITS[class]);
            assert_eq!(w.transfer.slots(class), n);
            let q = b.alloc(size, 16);
            assert!(!q.is_null());
            assert_eq!(b.class(class).limit(), n as u32, "grown to the batch");
            assert_eq!(b.class(class).cached(), n as u32 - 1);
            // Past the decay's half period, the next slow path halves the
            // cache and its bound, to the class's usual bound at least.
            w.src.advance_ms(10);
            let other = b.alloc(64, 16);
            assert!(!other.is_null());
            assert_eq!(b.class(class).limit(), LIMITS[class]);
            assert_eq!(b.class(class).cached(), (n as u32 - 1) / 2);
            HeapCore::free_any(q, b);
            HeapCore::free_any(other, b);
        }
    }

    /// A heap whose page of a class still has room to carve takes the
    /// batch of that class waiting in the transfer cache before it carves:
    /// the batch's slots are resident already, fresh slots would be new
    /// memory on top of them. Here a page of 128 KiB slots with one slot
    /// carved, and a batch of four such slots another heap's exit passed
    /// on: three allocations commit nothing. (Carving first, they
    /// committed 384 KiB while the batch waited.)
    #[test]
    fn a_heap_takes_a_waiting_batch_before_it_carves_fresh_slots() {
        let class = crate::size_class::class_of(128 << 10);
        let size = SLOT_SIZE[class] as usize;
        assert_eq!(size, 128 << 10);
        let w = &FOUR;
        let (a, b) = (w.heap(0), w.heap(1));
        // SAFETY: each heap is used by this thread alone, as its owner;
        // every block is live until its free, freed once.
        unsafe {
            // The second heap's page of the class, one slot carved.
            let first = b.alloc(size, 16);
            assert!(!first.is_null());
            let page = b.current_page(class);
            assert_eq!((*page).capacity(), 1);
            assert!(
                (*page).capacity() + 3 <= (*page).reserved,
                "room to carve 3"
            );
            // Four slots of the first heap, cached, passed on whole at its
            // thread's exit.
            let slots: Vec<*mut u8> = (0..4).map(|_| a.alloc(size, 16)).collect();
            a.class(class).set_limit(4);
            for &p in &slots {
                assert!(!p.is_null());
                HeapCore::free_any(p, a);
            }
            assert_eq!(a.class(class).cached(), 4);
            a.abandon();
            assert_eq!(w.transfer.slots(class), 4);
            let committed = b.slab_committed.get();
            let taken: Vec<*mut u8> = (0..3).map(|_| b.alloc(size, 16)).collect();
            assert_eq!(
                b.slab_committed.get() - committed,
                0,
                "bytes committed for three slots while a batch waited"
            );
            assert_eq!(w.transfer.slots(class), 0, "the batch taken");
            assert_eq!((*page).capacity(), 1, "nothing carved");
            for &p in &taken {
                assert!(slots.contains(&p), "a slot of the batch");
                p.write_bytes(3, size);
                HeapCore::free_any(p, b);
            }
            HeapCore::free_any(first, b);
        }
    }

    /// The hardened cache hands a slot out only after its class's depth
    /// of later frees on its thread, and an overflow passes on the oldest
    /// slots, keeping that depth: another heap that takes the batch gets
    /// none of the slots freed last, and neither does the freeing heap.
    #[cfg(feature = "secure")]
    #[test]
    fn an_overflow_batch_holds_none_of_the_slots_freed_last() {
        use crate::heap::cache::DEPTH;
        let class = crate::size_class::class_of(64 << 10);
        let size = SLOT_SIZE[class] as usize;
        let (depth, limit) = (DEPTH[class] as usize, LIMITS[class] as usize);
        assert_eq!((depth, limit), (2, 4));
        let w = &FIVE;
        let (a, b) = (w.heap(0), w.heap(1));
        // SAFETY: each heap is used by this thread alone, as its owner;
        // every block is live until its free, freed once.
        unsafe {
            let slots: Vec<*mut u8> = (0..=limit).map(|_| a.alloc(size, 16)).collect();
            for &p in &slots {
                assert!(!p.is_null());
                HeapCore::free_any(p, a);
            }
            let last = &slots[slots.len() - depth..];
            assert!(w.transfer.slots(class) > 0, "the overflow passed a batch");
            let taken: Vec<*mut u8> = (0..limit).map(|_| b.alloc(size, 16)).collect();
            assert_eq!(taken[0], slots[0], "the oldest, first");
            let mine: Vec<*mut u8> = (0..limit).map(|_| a.alloc(size, 16)).collect();
            for p in taken.iter().chain(&mine) {
                assert!(!last.contains(p), "{p:?}: freed last, handed out");
            }
            for &p in taken.iter() {
                HeapCore::free_any(p, b);
            }
            for &p in mine.iter() {
                HeapCore::free_any(p, a);
            }
        }
    }

    /// A maintenance pass halves a hardened cache but keeps its depth:
    /// those slots wait for later frees before anyone gets them.
    #[cfg(feature = "secure")]
    #[test]
    fn a_maintenance_pass_keeps_the_depth() {
        use crate::heap::cache::DEPTH;
        let class = crate::size_class::class_of(64);
        let depth = DEPTH[class] as usize;
        assert_eq!(depth, 16);
        let w = &SIX;
        let a = w.heap(0);
        // SAFETY: the heap is used by this thread alone, as its owner;
        // every block is live until its free, freed once.
        unsafe {
            let slots: Vec<*mut u8> = (0..depth + 4).map(|_| a.alloc(64, 16)).collect();
            for &p in &slots {
                assert!(!p.is_null());
                HeapCore::free_any(p, a);
            }
            assert_eq!(a.class(class).cached() as usize, depth + 4);
            w.src.advance_ms(1_000);
            {
                let mut l = a.lock_local();
                a.maintenance(&mut l);
            }
            assert_eq!(
                a.class(class).cached() as usize,
                depth,
                "halved to the depth"
            );
            let p = a.alloc(64, 16);
            assert!(!slots[4..].contains(&p), "a slot of the depth handed out");
            HeapCore::free_any(p, a);
            a.trim();
        }
    }
}
