//! A heap's delayed-free list (`HeapCore::delayed`): the slots whose remote
//! free told the owner that a page on its full list has room again
//! (`memory/remote_word.rs`'s `DELAYED` state), and slots a visitor leaves
//! for the owner (`heap/remote.rs`).
//!
//! A Treiber stack of slots linked through their first word: any thread
//! pushes one slot with a CAS; a holder of the heap's page lists takes the
//! whole list with one swap and only then reads the links. Nothing pops a
//! single slot, so the stack has no ABA problem. The orderings:
//! - a push is a Release CAS, so the slot's link, and every write of the
//!   freeing thread to the slot before it (the object's last stores), are
//!   visible to whoever takes it;
//! - the take is an Acquire swap, which synchronises with every push before
//!   it (the successful CASes form one release sequence on the head);
//! - a walk without taking (`first`, for `stats()`) loads the head with
//!   Acquire for the same reason.
//!
//! The functions are generic over the atomic pointer (`sync/word.rs`) so
//! that the loom models at the end of this file and in `remote_word.rs` run
//! this very code; in the allocator they compile to the plain atomic
//! operations. Run them with `RUSTFLAGS="--cfg loom" cargo test --release
//! -p pagewise --lib loom`.

use crate::sync::word::PtrWord;
use core::ptr::null_mut;
use core::sync::atomic::Ordering::*;

/// Pushes `node`. Before each attempt `link` is called with the head the
/// node will point at, and must write it into the node's link.
#[inline]
pub fn push<T, W: PtrWord<T>>(head: &W, node: *mut T, mut link: impl FnMut(*mut T)) {
    let mut h = head.load(Relaxed);
    loop {
        link(h);
        match head.cas_weak(h, node, Release, Relaxed) {
            Ok(_) => return,
            Err(seen) => h = seen,
        }
    }
}

/// Whether the list looks empty: a hint for a fast exit (a push may land
/// just after), which orders nothing.
#[inline]
pub fn looks_empty<T, W: PtrWord<T>>(head: &W) -> bool {
    head.load(Relaxed).is_null()
}

/// Takes the whole list and hands each node to `each`, first to last.
/// `next` reads a node's link; it is read before the node is handed on,
/// since `each` may reuse the link (free the slot, or push it back).
///
/// # Safety
/// `next` may be called on any node pushed; the nodes taken are the
/// caller's (concurrent takers get disjoint lists).
#[inline]
pub unsafe fn take_each<T, W: PtrWord<T>>(
    head: &W,
    mut next: impl FnMut(*mut T) -> *mut T,
    mut each: impl FnMut(*mut T),
) {
    let mut b = head.swap(null_mut(), Acquire);
    while !b.is_null() {
        let n = next(b);
        each(b);
        b = n;
    }
}

/// The list's first node, for a walk that leaves the list in place (only a
/// taker unlinks nodes, and the walker must exclude takers).
#[inline]
pub fn first<T, W: PtrWord<T>>(head: &W) -> *mut T {
    head.load(Acquire)
}

#[cfg(all(test, loom))]
mod loom_model {
    //! The delayed list under every interleaving loom finds, with slots
    //! whose link and contents are loom cells: a link or a store of the
    //! freeing thread that no ordering makes visible to the taker is
    //! reported as a data race. (Weakening `push`'s Release or `take_each`'s
    //! Acquire to Relaxed fails both models.)
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::AtomicPtr;
    use loom::sync::Arc;

    struct Slot {
        next: UnsafeCell<*mut Slot>,
        /// What the freeing thread last stored in the object.
        data: UnsafeCell<usize>,
    }

    struct Heap {
        delayed: AtomicPtr<Slot>,
        slots: Vec<Slot>,
    }

    // SAFETY: the raw links are only followed under the protocol modelled.
    unsafe impl Send for Heap {}
    // SAFETY: as above.
    unsafe impl Sync for Heap {}

    impl Heap {
        fn new(n: usize) -> Arc<Heap> {
            Arc::new(Heap {
                delayed: AtomicPtr::new(null_mut()),
                slots: (0..n)
                    .map(|_| Slot {
                        next: UnsafeCell::new(null_mut()),
                        data: UnsafeCell::new(0),
                    })
                    .collect(),
            })
        }

        fn slot(&self, i: usize) -> *mut Slot {
            &self.slots[i] as *const Slot as *mut Slot
        }

        fn index(&self, s: *mut Slot) -> usize {
            (0..self.slots.len()).find(|&i| self.slot(i) == s).unwrap()
        }

        /// A remote free of slot `i`, whose object last held `value`.
        fn free(&self, i: usize, value: usize) {
            // SAFETY: loom checks the access; the slot is ours until pushed.
            self.slots[i].data.with_mut(|d| unsafe { *d = value });
            let node = self.slot(i);
            push(&self.delayed, node, |head| {
                // SAFETY: as above.
                self.slots[i].next.with_mut(|n| unsafe { *n = head })
            });
        }

        /// The owner takes the list: each slot with the value it read.
        fn take(&self, mut each: impl FnMut(usize, usize)) {
            // SAFETY: the nodes are slots of this heap, whose links are
            // loom cells.
            unsafe {
                take_each(
                    &self.delayed,
                    // SAFETY: loom checks the access.
                    |b| (*b).next.with(|n| *n),
                    |b| {
                        let i = self.index(b);
                        // SAFETY: loom checks the access.
                        let v = self.slots[i].data.with(|d| *d);
                        each(i, v);
                    },
                )
            }
        }
    }

    /// Two remote freers push while the owner takes the list: every slot
    /// is taken exactly once, with the freer's last store.
    #[test]
    fn pushes_race_a_take() {
        loom::model(|| {
            let h = Heap::new(2);
            let freers: Vec<_> = (0..2)
                .map(|i| {
                    let h = h.clone();
                    loom::thread::spawn(move || h.free(i, 10 + i))
                })
                .collect();
            let mut got = Vec::new();
            h.take(|i, v| got.push((i, v)));
            for f in freers {
                f.join().unwrap();
            }
            h.take(|i, v| got.push((i, v)));
            got.sort();
            assert_eq!(got, [(0, 10), (1, 11)], "each slot once, contents seen");
        });
    }

    /// A visitor takes the list and pushes back a slot it must leave to the
    /// owner (a current page's, `HeapCore::process_delayed`), while a remote
    /// freer pushes and the owner takes: the slot pushed back keeps its
    /// place in the protocol like any other.
    #[test]
    fn a_visitor_pushes_back_while_others_push_and_take() {
        loom::model(|| {
            let h = Heap::new(2);
            h.free(0, 10);
            let visitor = {
                let h = h.clone();
                loom::thread::spawn(move || {
                    let mut back = Vec::new();
                    h.take(|i, _| back.push(i));
                    for i in back {
                        // The slot's contents are the owner's now; only the
                        // link is rewritten.
                        let node = h.slot(i);
                        push(&h.delayed, node, |head| {
                            // SAFETY: loom checks the access.
                            h.slots[i].next.with_mut(|n| unsafe { *n = head })
                        });
                    }
                })
            };
            let freer = {
                let h = h.clone();
                loom::thread::spawn(move || h.free(1, 11))
            };
            let mut got = Vec::new();
            h.take(|i, v| got.push((i, v)));
            visitor.join().unwrap();
            freer.join().unwrap();
            h.take(|i, v| got.push((i, v)));
            got.sort();
            assert_eq!(got, [(0, 10), (1, 11)]);
        });
    }
}
