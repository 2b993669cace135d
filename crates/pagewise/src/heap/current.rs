//! The current page of each size class: the page whose free list the
//! owner's allocation fast path pops, with no lock. The rules that make it
//! the fast paths' alone while visitors work on the rest of the heap
//! (docs/design.md, "Visiting a live heap"):
//! - only a holder of the heap's page lists changes which page is current
//!   ([`CurrentPages::set`]: the owner's slow paths, or the claimant of an
//!   abandoned heap);
//! - a holder of the page lists touches a page only where
//!   [`CurrentPages::may_touch`] says so: the owner (or the claimant of an
//!   abandoned heap) any page, a visitor of a live heap none that is
//!   current, which it reads under the lock, so the owner cannot change it
//!   meanwhile;
//! - the owner's fast paths read it without the lock
//!   ([`CurrentPages::get`]) and touch only that page.
//!
//! Generic over the atomic pointer (`sync/word.rs`), so the loom model at
//! the end of this file runs these functions, with the page lists' lock,
//! the visit of one heap (`global::heaps::visit_one`) and the hand-over at
//! thread exit (`global::heaps::hand_on`) of the allocator, on loom's
//! atomics. In the allocator each is one relaxed load or store.

use super::Access;
use crate::sync::word::PtrWord;
use core::sync::atomic::Ordering::Relaxed;

/// The current page of each of `N` classes, a `*mut T` in a `W`.
pub struct CurrentPages<W, const N: usize> {
    pages: [W; N],
}

impl<W, const N: usize> CurrentPages<W, N> {
    /// Current pages as given.
    pub const fn new(pages: [W; N]) -> Self {
        CurrentPages { pages }
    }

    /// The current page of `class`: the owner at any time (its fast paths
    /// touch that page, no other), anyone else with the page lists held
    /// (the owner cannot change it then), or as a snapshot (`stats()`).
    #[inline(always)]
    pub fn get<T>(&self, class: usize) -> *mut T
    where
        W: PtrWord<T>,
    {
        self.pages[class].load(Relaxed)
    }

    /// As [`CurrentPages::get`], without the bounds check.
    ///
    /// # Safety
    /// `class < N`.
    #[inline(always)]
    pub unsafe fn get_unchecked<T>(&self, class: usize) -> *mut T
    where
        W: PtrWord<T>,
    {
        // SAFETY: per the caller.
        unsafe { self.pages.get_unchecked(class) }.load(Relaxed)
    }

    /// Makes `page` the current page of `class`: only with the page lists
    /// held, as their owner (the lock orders it before any visitor's
    /// [`CurrentPages::may_touch`]).
    #[inline(always)]
    pub fn set<T>(&self, class: usize, page: *mut T)
    where
        W: PtrWord<T>,
    {
        self.pages[class].store(page, Relaxed)
    }

    /// Whether the holder of the page lists, `who`, may touch `page` of
    /// `class` (its free list, its count, its queue links): the owner any
    /// page, a visitor of a live heap only one that is not current.
    #[inline]
    pub fn may_touch<T>(&self, who: Access, class: usize, page: *mut T) -> bool
    where
        W: PtrWord<T>,
    {
        who == Access::Owner || self.get(class) != page
    }
}

#[cfg(all(test, loom))]
mod loom_model {
    //! Visiting a live heap, then the same heap abandoned, under every
    //! interleaving loom finds, on the allocator's functions: the current
    //! pages (above), the page lists' lock (`sync/lock.rs`), the visit of
    //! one heap (`global::heaps::visit_one`, the purger's with `Busy::Skip`
    //! and `trim()`'s with `Busy::Wait`) and the owner's hand-over at exit
    //! (`global::heaps::hand_on`). The owner touches its current page with
    //! no lock (the fast path), changes which page is current with the
    //! page lists held (a slow path), then exits; the visitor touches the
    //! pages `may_touch` allows it. Pages are loom cells, so a page touched
    //! by the owner and a visitor that no lock or ordering separates is
    //! reported as a data race. What the fast and slow paths do to a page
    //! (its free list, its queue) is a count here: the allocator's are
    //! `HeapCore`'s, which needs a whole heap.
    use super::*;
    use crate::global::heaps::{hand_on, visit_one, Busy};
    use crate::sync::lock::{Locked, ModelFlag};
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{AtomicPtr, AtomicUsize};
    use loom::sync::Arc;

    type Cell = UnsafeCell<u32>;

    struct Heap {
        owner: AtomicUsize,
        /// The page lists' lock (what it guards is the pages not current).
        lists: Locked<(), ModelFlag>,
        current: CurrentPages<AtomicPtr<Cell>, 1>,
        /// Two pages of the one class.
        pages: [Cell; 2],
        /// The abandoned list the heap goes on at exit.
        abandoned: Locked<usize, ModelFlag>,
    }

    // SAFETY: the raw pointers are the pages' identities, touched only
    // through loom's cells.
    unsafe impl Send for Heap {}
    // SAFETY: as above.
    unsafe impl Sync for Heap {}

    impl Heap {
        fn page(&self, i: usize) -> *mut Cell {
            &self.pages[i] as *const Cell as *mut Cell
        }

        fn touch(&self, page: *mut Cell, by: u32) {
            // SAFETY: `page` is one of `pages`; loom checks the access.
            unsafe { (*page).with_mut(|v| *v += by) };
        }

        /// An allocation's fast path: the current page, no lock.
        fn fast(&self) {
            self.touch(self.current.get(0), 1);
        }

        /// A slow path: the old current page is queued (touched) and the
        /// other one becomes current.
        fn slow(&self) {
            let _lists = self.lists.lock();
            let old: *mut Cell = self.current.get(0);
            self.touch(old, 100);
            let new = if old == self.page(0) {
                self.page(1)
            } else {
                self.page(0)
            };
            self.current.set(0, new);
        }

        /// The thread's exit: its last work on its pages (the caches go
        /// home), then the heap is handed on.
        fn exit(&self) {
            {
                let _lists = self.lists.lock();
                for i in 0..2 {
                    self.touch(self.page(i), 1000);
                }
            }
            hand_on(&self.owner, &self.abandoned, self.page(0), |_, _| {});
        }

        /// A visit: whatever pages it may touch.
        fn visit(&self, busy: Busy) {
            visit_one(&self.owner, &self.lists, busy, |_, who| {
                for i in 0..2 {
                    if self.current.may_touch(who, 0, self.page(i)) {
                        self.touch(self.page(i), 10);
                    }
                }
            });
        }
    }

    fn model(busy: Busy) {
        loom::model(move || {
            let h = Arc::new(Heap {
                owner: AtomicUsize::new(7),
                lists: Locked::new_model(()),
                current: CurrentPages::new([AtomicPtr::new(core::ptr::null_mut())]),
                pages: [UnsafeCell::new(0), UnsafeCell::new(0)],
                abandoned: Locked::new_model(0),
            });
            h.current.set(0, h.page(0));
            let visitor = {
                let h = h.clone();
                loom::thread::spawn(move || h.visit(busy))
            };
            h.fast();
            h.slow();
            h.fast();
            h.exit();
            visitor.join().unwrap();
        });
    }

    #[test]
    fn a_purger_visit_never_meets_the_owner_on_a_page() {
        model(Busy::Skip);
    }

    #[test]
    fn a_trim_visit_never_meets_the_owner_on_a_page() {
        model(Busy::Wait);
    }
}
