//! The remote-free protocol: slots freed by a thread other than their
//! page's owner, and slots going home from a thread cache.
//!
//! - A slot of another heap's page goes onto the page's `thread_free` list
//!   with one CAS (one per run of slots of the same page).
//! - The first such free into a page on its owner's full list goes to the
//!   heap's `delayed` list instead, so the owner notices the page has room
//!   again; the `DELAYED`/`NOTIFIED` state in `thread_free` settles the race
//!   (`memory::page`).
//! - The owner takes `thread_free` lists whole (one CAS) and the `delayed`
//!   list whole (one swap), and only then touches the slots. Both
//!   protocols are functions generic over the atomic word, model-checked
//!   with loom on that same code: `memory/remote_word.rs` and
//!   `memory/delayed.rs`.

use super::free::lookup_page;
use super::*;
use crate::memory::delayed;

impl HeapCore {
    /// Sends the cached slots of `class` back to their pages, all but the
    /// `keep` most recent.
    ///
    /// # Safety
    /// Owner only, with its page lists held.
    pub(super) unsafe fn flush_cache(&self, l: &mut Local, class: usize, keep: u32) {
        // SAFETY: owner only (caller); the detached list holds `n` cached
        // slots of this class.
        unsafe {
            let (b, n) = self.take_cached(class, keep);
            send_home(Some((self, l)), b, n);
        }
    }

    /// Empties every class's cache. Owner only, with its page lists held.
    pub(super) unsafe fn flush_caches(&self, l: &mut Local) {
        for class in 0..CLASSES {
            // SAFETY: owner only (caller).
            unsafe { self.flush_cache(l, class, 0) };
        }
    }

    /// Handles frees that other threads made into pages on the full list.
    /// A visitor leaves a slot of a current page on the list for the owner
    /// (its free list is the owner's fast path); none is expected, since a
    /// full page is never current, but a slot may wait here while its page
    /// leaves the full list and becomes current.
    pub(super) unsafe fn process_delayed(&self, l: &mut Local, who: Access) {
        if delayed::looks_empty(&self.delayed) {
            return;
        }
        crate::sync::perturb::point();
        // SAFETY: the delayed list holds slots of this heap's pages, pushed
        // by `free_remote` (their links are their first word); the slots
        // taken are ours, and we hold the page lists (caller).
        unsafe {
            delayed::take_each(
                &self.delayed,
                |b| Block::next(b),
                |b| {
                    let seg = &*Segment::of(crate::memory::layout::segment_base(b as usize));
                    let page = lookup_page(seg, b as usize);
                    if !self.direct.may_touch(who, (*page).class as usize, page) {
                        self.push_delayed(b);
                    } else {
                        let _ = self.free_local(l, page, b);
                    }
                },
            )
        }
    }

    /// Takes in every slot other threads freed into this heap's pages (the
    /// owner would on its next slow paths), so counters show them as free;
    /// a visitor leaves current pages to their owner.
    pub(crate) unsafe fn collect_remote(&self, l: &mut Local, who: Access) {
        // SAFETY: the page lists are held (caller); queue and full-list
        // entries are slab pages of this heap, and collecting moves no page
        // between lists.
        unsafe {
            self.process_delayed(l, who);
            for class in 0..CLASSES {
                let mut p = l.queues[class].head;
                while !p.is_null() {
                    if self.direct.may_touch(who, class, p) {
                        let n = (*p).collect_thread_free();
                        self.class(class).returned.add(n as u64);
                    }
                    p = (*p).next;
                }
            }
            let mut p = l.full.head;
            while !p.is_null() {
                let n = (*p).collect_thread_free();
                self.class((*p).class as usize).returned.add(n as u64);
                p = (*p).next;
            }
        }
    }

    /// Slots freed into this heap's pages by other threads and not yet
    /// collected, per class: on the pages' remote lists and the delayed
    /// list. Read only; the page lists are held, so no page leaves.
    pub(crate) fn pending_remote(&self, l: &Local) -> [u64; CLASSES] {
        let mut out = [0u64; CLASSES];
        let mut count = |p: *mut Page| {
            // SAFETY: a slab page of this heap, on a list we hold; its
            // remote word is atomic.
            let (class, n) = unsafe { ((*p).class as usize, (*p).pending_remote()) };
            out[class] += n as u64;
        };
        for q in l.queues.iter().chain(core::iter::once(&l.full)) {
            let mut p = q.head;
            while !p.is_null() {
                count(p);
                // SAFETY: as above.
                p = unsafe { (*p).next };
            }
        }
        // Current pages are on their class queue; the delayed list's slots
        // stay until a holder of the page lists takes them, as we do now.
        let mut b = delayed::first(&self.delayed);
        while !b.is_null() {
            // SAFETY: slots on the delayed list are this heap's, and only a
            // holder of the page lists unlinks them.
            unsafe {
                let seg = &*Segment::of(crate::memory::layout::segment_base(b as usize));
                let page = lookup_page(seg, b as usize);
                out[(*page).class as usize] += 1;
                b = Block::next(b);
            }
        }
        out
    }

    /// Puts a slot on the delayed list, for a holder of the page lists.
    ///
    /// # Safety
    /// `block` is a free slot of this heap's page, on no list.
    unsafe fn push_delayed(&self, block: *mut Block) {
        // SAFETY: per the caller, the slot is ours to link.
        delayed::push(&self.delayed, block, |head| unsafe {
            Block::set_next(block, head)
        });
    }
}

/// Sends a detached list of `n` cached slots (of any pages) home: to
/// their pages, locally for pages of `me`'s heap (with its page lists), as
/// remote frees for the others'. `me` is `None` for a thread with no heap
/// of its own (the purger, draining the transfer cache).
///
/// Each slot is checked before it is touched: a slot freed twice into a
/// cache, or whose other copy already went to its page, aborts here.
///
/// # Safety
/// The list holds `n` cached slots no one else uses, whose heaps outlive
/// them; `me` is the calling thread's heap, as owner, with its page lists.
pub(crate) unsafe fn send_home(me: Option<(&HeapCore, &mut Local)>, mut b: *mut Block, n: u32) {
    let (heap, mut l) = match me {
        Some((h, l)) => (Some(h), Some(l)),
        None => (None, None),
    };
    // SAFETY: per the caller.
    unsafe {
        // Slots of one page of another heap that come in a row go home
        // as one chain, with one CAS (a producer's objects often come
        // from the same page).
        let mut run = RemoteRun::EMPTY;
        let mut prev = null_mut::<Block>();
        // By count: a slot freed twice makes the list a cycle (the
        // second copy is met, and caught, before it comes round again).
        for _ in 0..n {
            if b.is_null() {
                // Shorter than counted: a slot was freed twice.
                misuse(Misuse::DoubleFree, prev as usize);
            }
            if !Block::cached_to_page(b) {
                misuse(Misuse::DoubleFree, b as usize);
            }
            let next = Block::next(b);
            // Owner and page from the segment header's read-mostly
            // fields, not from the descriptor, which its owner rewrites
            // on every allocation (cached slots passed the free checks).
            let seg = &*Segment::of(crate::memory::layout::segment_base(b as usize));
            let page = seg.slab_page(b as usize);
            match (heap, l.as_deref_mut()) {
                (Some(h), Some(l)) if seg.heap == h.me() => {
                    let _ = h.free_local(l, page, b);
                }
                _ if page == run.page => {
                    Block::set_next(run.last, b);
                    run.last = b;
                    run.count += 1;
                }
                _ => {
                    run.send();
                    run = RemoteRun {
                        page,
                        first: b,
                        last: b,
                        count: 1,
                    };
                }
            }
            (prev, b) = (b, next);
        }
        run.send();
    }
}

/// Consecutive slots of one page of another heap, linked first to last.
pub(super) struct RemoteRun {
    page: *mut Page,
    first: *mut Block,
    last: *mut Block,
    count: usize,
}

impl RemoteRun {
    const EMPTY: RemoteRun = RemoteRun {
        page: null_mut(),
        first: null_mut(),
        last: null_mut(),
        count: 0,
    };

    /// Frees the run to its page (nothing if empty).
    ///
    /// # Safety
    /// The run holds live slots of `page`, whose heap outlives them.
    unsafe fn send(&mut self) {
        if self.page.is_null() {
            return;
        }
        // SAFETY: per the caller; the chain ends at `last`.
        unsafe {
            Block::set_next(self.last, null_mut());
            let mut first = self.first;
            let mut count = self.count;
            // A page on its owner's full list takes the first slot through
            // the heap's delayed list (`free_remote`); the rest go on.
            while !(*self.page).push_remote_chain(first, self.last, count) {
                let rest = Block::next(first);
                Block::set_next(first, null_mut());
                free_to_delayed(self.page, first);
                if rest.is_null() {
                    break;
                }
                first = rest;
                count -= 1;
            }
        }
        *self = RemoteRun::EMPTY;
    }
}

/// Frees a slot of a page owned by another thread's heap.
///
/// # Safety
/// `block` is a live slot of `page`; the page's heap outlives it.
#[inline]
pub(super) unsafe fn free_remote(page: *mut Page, block: *mut Block) {
    // SAFETY: per the caller.
    unsafe {
        if !(*page).push_remote(block) {
            free_to_delayed(page, block);
        }
    }
}

/// Puts a slot on its heap's delayed list: the first remote free into a
/// page on the owner's full list, which tells the owner the page has room.
///
/// # Safety
/// `block` is a live slot of `page`, whose heap outlives it; `push_remote`
/// just claimed the notification for it.
unsafe fn free_to_delayed(page: *mut Page, block: *mut Block) {
    crate::sync::perturb::point();
    // SAFETY: per the caller; the heap outlives its pages.
    unsafe { (*((*page).heap as *const HeapCore)).push_delayed(block) };
}
