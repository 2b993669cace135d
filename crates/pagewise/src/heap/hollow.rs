//! Which slab pages give back their free OS pages, and when: the policy
//! over the mechanism of `memory/hollow.rs`.
//!
//! A page that no thread allocates from (not a current page) and that has
//! stayed so for a decay period gives back every OS page whose slots are
//! all free: the purger's visits do this for every heap, live or abandoned;
//! `trim()` and the memory limit do it at once. Only pages on the class
//! queues are considered (a full page has no free slot), with the page
//! lists held, so the rules are those of a visit (design.md, "Visiting a
//! live heap"); the fast paths are untouched. The owner carves the hollow
//! slots again, before fresh ones, when it allocates from the page again
//! (`HeapCore::refill`).

use super::*;
use crate::memory::huge_pages;
use core::ptr::NonNull;

/// When a visit hollows the pages it passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hollow {
    /// Not at all (the heap is being handed on at its thread's exit).
    Never,
    /// Pages out of use for a decay period as of this time (the purger).
    IfStale(u64),
    /// Every page out of use, at once (`trim()`, the memory limit).
    Now,
}

impl HeapCore {
    /// Hollows `page` if `when` says it is due.
    ///
    /// # Safety
    /// The page lists are held; `page` is a slab page of this heap on its
    /// class queue, and not any thread's current page. (Remote frees not
    /// yet collected count as slots in use: their OS pages stay.)
    pub(super) unsafe fn hollow_page(&self, page: *mut Page, when: Hollow) {
        // SAFETY: per the caller: the descriptor is ours under the lock.
        let page = unsafe { &mut *page };
        // SAFETY: the page's segment, mapped while the page lives.
        let seg = unsafe { &*Segment::of(crate::memory::layout::segment_base(page.start)) };
        let due = match when {
            Hollow::Never => false,
            Hollow::Now => true,
            Hollow::IfStale(now) => {
                self.out_of_use_long_enough(page, now) && !self.growing_into(seg, page, now)
            }
        };
        if !due {
            return;
        }
        let how = self.config.purge();
        let source = self.source();
        let huge = &self.budget().huge;
        // SAFETY: per the caller; `purge` is given runs of this page's OS
        // pages whose slots are all free, mapped and page-aligned (a huge
        // page they are in goes back to small pages first).
        let pages = unsafe {
            page.hollow(
                || source.serialize_threads(),
                |f| self.announced_frees(f),
                |addr, bytes| {
                    huge_pages::before_purge(source, huge, seg, addr, bytes)
                        && source.purge(NonNull::new_unchecked(addr as *mut u8), bytes, how)
                },
            )
        };
        if pages > 0 {
            let bytes = (pages * os_page()) as u64;
            self.slab_committed.sub(bytes);
            self.hollow_bytes.add(bytes);
            self.hollowed.add(bytes);
        }
    }

    /// Calls `f` with the slot each thread last announced it was freeing
    /// into its cache, if slots of this heap go into other threads'
    /// caches (a heap of the global allocator): read by a page being
    /// hollowed, after it stopped taking cached frees (`Page::hollow`). An
    /// owned heap's slots go only into its owner's cache, and its owner is
    /// the one hollowing. The calling thread's own announcement is read
    /// too: it is of a free that is over (its last), which keeps a slot's
    /// OS page at worst, and a free's window (`set_window_hook`) may run
    /// this very hollowing in the schedule-perturbation build.
    fn announced_frees(&self, f: &mut dyn FnMut(usize)) {
        if self.global {
            crate::global::heaps::for_each_heap(|h| f(h.announced_free()));
        }
    }

    /// Whether `page` lies in a huge page of a heap that took a slab span
    /// less than a decay delay ago (so is still growing): hollowing it
    /// would split the huge page, which waits until the heap is quiet
    /// (or `trim()`, or the limit).
    fn growing_into(&self, seg: &Segment, page: &Page, now: u64) -> bool {
        let delay = self.config.decay_ms();
        let off = page.start - seg.base();
        let len = self.page_slices[page.class as usize] as usize * SLICE;
        seg.huge_regions() & huge_pages::regions_touched(off, len) != 0
            && now < self.slab_grown_at.get().saturating_add(delay)
    }

    /// Whether `page` has been out of use for a decay period: the first
    /// visit that finds it so starts the clock, a later one past the delay
    /// says yes. Making the page current stops the clock.
    pub(super) fn out_of_use_long_enough(&self, page: &mut Page, now: u64) -> bool {
        let delay = self.config.decay_ms();
        if page.out_of_use_since == 0 {
            page.out_of_use_since = now.max(1);
            return delay == 0;
        }
        delay != u64::MAX && now.saturating_sub(page.out_of_use_since) >= delay
    }

    /// Carves the hollow slots of `page` again, counting the OS pages that
    /// become committed. False if it has none.
    ///
    /// # Safety
    /// Owner only, with the page lists held; a slab page of this heap.
    pub(super) unsafe fn refill_hollow(&self, page: *mut Page) -> bool {
        // SAFETY: per the caller.
        let page = unsafe { &mut *page };
        if !page.can_refill_hollow() {
            return false;
        }
        let hollow = page.hollow_pages() as u64 * os_page() as u64;
        // SAFETY: per the caller.
        let newly = unsafe { page.refill_hollow() };
        self.hollow_bytes.sub(hollow);
        self.slab_committed.add((newly * os_page()) as u64);
        self.note_peak();
        self.note_fresh(newly * os_page());
        page.has_free()
    }
}
