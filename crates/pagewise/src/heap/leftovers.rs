//! Free slots left on the pages of heaps whose thread exited, taken by a
//! running thread before it opens a new page.
//!
//! A heap whose thread exited waits whole for the next thread to adopt it
//! (`global/heaps.rs`). Until one does, the slots freed on its pages (by
//! its thread before it exited, and by other threads since) are free
//! memory that no running thread could allocate from: under thread churn
//! (threads that start, hand objects to each other and exit, round after
//! round) the running threads faulted in new pages beside them. Now a
//! thread about to open a new page for a class first takes a batch of that
//! class's free slots from an exited heap's page, as if that heap's owner
//! had allocated them and freed them into the taker's thread cache. The
//! slots stay on their page (its `used` count holds them), and go home to
//! it as any slot freed by another thread does.
//!
//! The exited heap is claimed for the moment of the look as a visitor
//! claims it (`global::heaps::claim_for_visit`, then its page lists with a
//! try-lock): nothing here waits, so neither an adopter nor the purger nor
//! a fork is held up by more than one look (a child forked in the middle
//! of one finds the claim undone: `global::heaps::end_visits_after_fork`). Neither the hardened build
//! (whose frees keep slots in a quarantine) nor a meshing heap (whose pages
//! may withhold slots) takes leftovers.

use crate::heap::{HeapCore, Local};
use crate::memory::block::Block;
use crate::memory::size_class::CLASSES;
use core::ptr::null_mut;
use core::sync::atomic::Ordering::Relaxed;

/// Every class fits a bit of `HeapCore::leftover_classes`.
const _: () = assert!(CLASSES <= 64);

/// How many of an exited heap's pages of the class a look examines (the
/// first of its queue, as `fullest_nonfull` does).
const PAGES_LOOKED_AT: usize = 8;

impl HeapCore {
    /// A slot of `class` from the free slots an exited thread's heap left,
    /// with as many more as the empty thread cache takes installed in it;
    /// null if no exited heap had any to spare now.
    ///
    /// # Safety
    /// Owner only, with the page lists held.
    pub(super) unsafe fn alloc_from_leftovers(&self, class: usize) -> *mut u8 {
        // Only the process's heaps: they are the ones on its list of exited
        // heaps (a test's heaps pass slots through a transfer cache of
        // their own, and must not take the process's).
        let process = core::ptr::eq(self.transfer, &crate::memory::transfer::GLOBAL);
        if cfg!(feature = "secure") || !process || crate::global::heaps::meshing() {
            return null_mut();
        }
        let state = self.class(class);
        if state.cached() != 0 {
            // A sampled allocation declined a batch the transfer cache
            // just installed: the slow path goes on to a page.
            return null_mut();
        }
        let Some((head, count)) =
            crate::global::heaps::take_leftovers(self, class, state.limit().max(1))
        else {
            return null_mut();
        };
        // SAFETY: owner only (caller); `count` slots of this class, marked
        // cached, that nobody else holds now.
        unsafe {
            self.install_cached(class, head, count);
            state.pop() as *mut u8
        }
    }

    /// Marks every class as possibly having free slots to spare: the
    /// heap's thread is exiting.
    pub(crate) fn offer_leftovers(&self) {
        self.leftover_classes.store(u64::MAX, Relaxed);
    }

    /// Whether a look for `class` on this exited heap may find something.
    pub(crate) fn may_have_leftovers(&self, class: usize) -> bool {
        self.leftover_classes.load(Relaxed) & (1 << class) != 0
    }

    /// Takes up to `max` free slots of `class` off the first page of the
    /// class queue that has some (collecting its remote frees), marked
    /// cached and linked as a thread cache's list, with their count. None
    /// if no page looked at had any: the class's bit is cleared, so later
    /// looks pass this heap by until its thread's successor exits.
    ///
    /// # Safety
    /// The caller holds this heap with an owner's rights (an exited heap
    /// claimed for a visit) and its page lists (`l`).
    pub(crate) unsafe fn give_leftovers(
        &self,
        l: &mut Local,
        class: usize,
        max: u32,
    ) -> Option<(*mut Block, u32)> {
        // SAFETY: an owner's rights and the page lists (caller): pages the
        // full list held that other threads freed into join their queues.
        unsafe { self.process_delayed(l, crate::heap::Access::Owner) };
        let mut p = l.queues[class].head;
        for _ in 0..PAGES_LOOKED_AT {
            if p.is_null() {
                break;
            }
            // SAFETY: queue entries are slab pages of this heap, whose free
            // lists are the owner's (the caller's) alone.
            unsafe {
                let next = (*p).next;
                // A page with hollow or withheld slots is not cacheable.
                if (*p).hollow_slots() == 0 {
                    if !(*p).has_free() {
                        let n = (*p).collect_thread_free();
                        self.class(class).returned.add(n as u64);
                    }
                    let got = (*p).has_free().then(|| take_free_slots(&mut *p, max));
                    if let Some((_, n)) = got {
                        self.count_given(class, n);
                    }
                    self.retire_if_spent(l, p);
                    if got.is_some() {
                        return got;
                    }
                }
                p = next;
            }
        }
        self.leftover_classes.fetch_and(!(1 << class), Relaxed);
        None
    }
}

impl HeapCore {
    /// Moves a page with no free slot left and none to carve to the full
    /// list, where a later look does not meet it again (the first slot
    /// freed into it brings it back, through the delayed list).
    ///
    /// # Safety
    /// As [`HeapCore::give_leftovers`]; `page` is on its class queue.
    unsafe fn retire_if_spent(&self, l: &mut Local, page: *mut crate::memory::page::Page) {
        // SAFETY: per the caller.
        unsafe {
            if (*page).has_free() || (*page).capacity() < (*page).reserved {
                return;
            }
            let class = (*page).class as usize;
            match (*page).try_mark_full() {
                Ok(()) => {
                    if self.current_page(class) == page {
                        self.set_current_page(class, super::empty_page());
                    }
                    l.queues[class].remove(page);
                    l.full.push(page);
                }
                // Remote frees arrived meanwhile: it stays, with them.
                Err(collected) => self.class(class).returned.add(collected as u64),
            }
        }
    }
}

/// Takes up to `max` (at least 1) slots off `page`'s free list, which has
/// one, as a null-ended chain of cached slots (the thread cache's form):
/// aborts on a slot that does not hold the page key, as a pop does (freed
/// twice, or written after its free).
///
/// # Safety
/// The caller has the page's owner's rights.
unsafe fn take_free_slots(page: &mut crate::memory::page::Page, max: u32) -> (*mut Block, u32) {
    let head = page.free;
    let (mut tail, mut n) = (head, 0u32);
    // SAFETY: the free list holds slots of this page (caller: ours).
    unsafe {
        loop {
            if !Block::is_in_page(tail) {
                crate::fault::misuse(crate::memory::block::KEY_LOST, tail as usize);
            }
            let next = Block::next(tail);
            Block::mark_cached(tail);
            n += 1;
            if n == max || next.is_null() {
                page.free = next;
                Block::set_next(tail, null_mut());
                break;
            }
            tail = next;
        }
    }
    page.set_used(page.used() + n);
    (head, n)
}

#[cfg(test)]
mod tests {
    //! The exited heap's side on an owned heap over the fake page source
    //! (the taker's side, through the global allocator, is
    //! `tests/leftovers.rs`).
    use crate::memory::block::Block;
    use crate::memory::size_class::{class_of, SLOT_SIZE};
    use crate::os::source::FakePages;
    use crate::{Config, Heap};
    use core::alloc::Layout;

    #[test]
    fn a_look_takes_free_slots_and_one_that_finds_none_clears_its_class_alone() {
        let heap = Heap::with_source(FakePages::new(), Config::DEFAULT);
        let core = heap.core();
        let (class, other) = (class_of(48), class_of(64));
        let layout = Layout::from_size_align(SLOT_SIZE[class] as usize, 8).unwrap();
        assert!(!core.may_have_leftovers(class), "nothing offered yet");
        core.offer_leftovers();
        assert!(core.may_have_leftovers(class) && core.may_have_leftovers(other));
        // Three blocks of the class, two freed and sent to their page.
        let blocks: Vec<_> = (0..3).map(|_| heap.allocate(layout).unwrap()).collect();
        for b in &blocks[1..] {
            // SAFETY: allocated above with this layout, freed once.
            unsafe { heap.deallocate(b.cast(), layout) };
        }
        heap.trim();
        let mut l = core.lock_local();
        // SAFETY: this thread owns the heap, and holds its page lists.
        let (head, n) = unsafe { core.give_leftovers(&mut l, class, 8) }.unwrap();
        // SAFETY: the chain's slots are the heap's, handed to us.
        unsafe {
            let mut b = head;
            for _ in 0..n {
                assert!(Block::is_cached(b), "given as cached slots");
                b = Block::next(b);
            }
            assert!(b.is_null(), "a chain of {n} slots, ended");
        }
        assert!(
            n >= 2,
            "the two freed slots (and fresh ones) given, got {n}"
        );
        // The class of 64 B has no page: a look finds nothing and clears
        // that class's bit only.
        // SAFETY: as above.
        assert!(unsafe { core.give_leftovers(&mut l, other, 8) }.is_none());
        assert!(!core.may_have_leftovers(other));
        assert!(core.may_have_leftovers(class));
        drop(l);
        // SAFETY: the one block still live, allocated above.
        unsafe { heap.deallocate(blocks[0].cast(), layout) };
    }
}
