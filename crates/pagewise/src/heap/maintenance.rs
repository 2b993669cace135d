//! Maintenance on the owner's slow paths, `trim()`, abandoning a heap at
//! thread exit, and the purges other threads may run on it.
//!
//! Invariants: `maintenance`, `trim` and `abandon` are owner-only (an
//! abandoned heap's owner is whoever claimed it), and run with the page
//! lists held; `release_while_away` is a visit, with the page lists held;
//! `trim_shared` and `purge_expired` touch only the span pool, under its
//! lock, and may run on any thread.

use super::cache::{walk_to_cache, walk_to_page, LIMITS};
use super::hollow::Hollow;
use super::*;
use crate::memory::spans::Why;

impl HeapCore {
    /// Owner-side periodic work on slow paths: release current pages that
    /// stayed empty since the last pass, and run the decay if due.
    pub(super) unsafe fn maintenance(&self, l: &mut Local) {
        if self.flush_requested.load(Relaxed) {
            self.flush_requested.store(false, Relaxed);
            // SAFETY: owner only (caller).
            #[cfg(not(feature = "secure"))]
            unsafe {
                self.flush_caches(l)
            };
            // Another thread's `trim()`: the hardened caches keep their
            // depth, slots freed last that wait for later frees.
            #[cfg(feature = "secure")]
            for class in 0..CLASSES {
                // SAFETY: owner only (caller).
                unsafe { self.flush_cache(l, class, super::cache::DEPTH[class] as u32) };
            }
        }
        let now = self.source().now_ms();
        if now < l.next_maintenance {
            return;
        }
        l.next_maintenance = now.saturating_add((self.config.decay_ms() / 2).max(1));
        for (class, &usual) in LIMITS.iter().enumerate() {
            // Halve the caches: slots still wanted come back from their
            // pages cheaply; slots no longer wanted go home within a few
            // passes, so their pages can empty. A cache that grew halves
            // its bound too (`heap/cache.rs`): a thread still cycling grows
            // it again at its next round trip.
            let state = self.class(class);
            let limit = (state.limit() / 2).max(usual);
            let n = state.cached();
            let keep = (n / 2).min(limit);
            // The hardened cache keeps its depth: those slots wait for
            // later frees before they are handed out or passed on.
            #[cfg(feature = "secure")]
            let keep = keep.max((super::cache::DEPTH[class] as u32).min(n));
            if n > keep {
                // SAFETY: owner only (caller).
                unsafe { self.flush_cache(l, class, keep) };
            }
            state.set_limit(limit);
        }
        // SAFETY: owner only, with the page lists held (caller).
        unsafe { self.hollow_stale_pages(l, now) };
        for class in 0..CLASSES {
            let page = self.current_page(class);
            if page == empty_page() {
                continue;
            }
            // SAFETY: a current page of this heap; owner only.
            unsafe {
                if (*page).used() != 0 {
                    (*page).idle = false;
                } else if !(*page).idle {
                    // Mark it; if still empty at the next pass it goes.
                    (*page).idle = true;
                } else {
                    self.set_current_page(class, empty_page());
                    self.release_page(l, page);
                }
            }
        }
        if self.next_deadline.load(Relaxed) <= now {
            let ctx = self.ctx();
            let mut spans = self.spans.lock();
            self.after_span_change(&ctx, &mut spans, now);
        }
    }

    /// Hollows the pages of the class queues that have been out of use for
    /// a decay period (`heap/hollow.rs`); remote frees not yet collected
    /// count as slots in use.
    ///
    /// # Safety
    /// Owner only, with the page lists held.
    unsafe fn hollow_stale_pages(&self, l: &mut Local, now: u64) {
        for class in 0..CLASSES {
            let current = self.current_page(class);
            let mut p = l.queues[class].head;
            while !p.is_null() {
                // SAFETY: queue entries are slab pages of this heap; the
                // page lists are held; the current page is left alone.
                unsafe {
                    if p != current {
                        self.hollow_and_uncharge(p, Hollow::IfStale(now));
                    }
                    p = (*p).next;
                }
            }
        }
    }

    /// Gives back everything retained: empty slab pages, expired or not,
    /// retained spans and huge objects, wholly free segments and unused
    /// reservations.
    ///
    /// # Safety
    /// Owner only.
    pub unsafe fn trim(&self) {
        {
            let mut l = self.lock_local();
            // SAFETY: owner only (caller), with the page lists held.
            unsafe {
                self.flush_caches(&mut l);
                self.release_empty_pages(&mut l, Access::Owner, Hollow::Now);
            }
        }
        self.trim_shared();
    }

    /// [`HeapCore::hollow_page`], giving back to the hard limit's count
    /// what it purged (`hollowed` moves only with the page lists held).
    ///
    /// # Safety
    /// As [`HeapCore::hollow_page`].
    unsafe fn hollow_and_uncharge(&self, p: *mut Page, when: Hollow) {
        let before = self.hollowed.get();
        // SAFETY: per the caller.
        unsafe { self.hollow_page(p, when) };
        self.budget()
            .uncharge((self.hollowed.get() - before) as usize);
    }

    /// Collects remote frees everywhere, releases every empty slab page and
    /// hollows the others as `hollow` says (a visitor of a live heap: every
    /// page but the current ones).
    pub(crate) unsafe fn release_empty_pages(&self, l: &mut Local, who: Access, hollow: Hollow) {
        // SAFETY: the page lists are held (caller).
        unsafe { self.process_delayed(l, who) };
        for class in 0..CLASSES {
            if who == Access::Owner {
                self.set_current_page(class, empty_page());
            }
            // SAFETY: the page lists are held (caller); queue entries are
            // slab pages of this heap; the next link is read before the page
            // may leave.
            unsafe {
                let mut p = l.queues[class].head;
                while !p.is_null() {
                    let next = (*p).next;
                    if self.direct.may_touch(who, class, p)
                        && !self.collect_and_release_if_empty(l, p)
                    {
                        self.hollow_and_uncharge(p, hollow);
                    }
                    p = next;
                }
            }
        }
        // SAFETY: as above, for the full list (never a current page).
        unsafe {
            let mut p = l.full.head;
            while !p.is_null() {
                let next = (*p).next;
                if (*p).has_remote() {
                    l.full.remove(p);
                    (*p).clear_full();
                    l.queues[(*p).class as usize].push(p);
                    self.collect_and_release_if_empty(l, p);
                }
                p = next;
            }
        }
    }

    /// Collects the remote frees of `page` and releases it if that
    /// emptied it; says whether it did.
    pub(super) unsafe fn collect_and_release_if_empty(
        &self,
        l: &mut Local,
        page: *mut Page,
    ) -> bool {
        // SAFETY: the page lists are held; a slab page of this heap, not
        // current unless the caller owns the heap.
        unsafe {
            let n = (*page).collect_thread_free();
            self.class((*page).class as usize).returned.add(n as u64);
            if (*page).used() == 0 {
                self.release_page(l, page);
                return true;
            }
        }
        false
    }

    /// Prepares the heap to be left without an owner (its thread exited):
    /// empty pages go back to the span pool, to be purged by decay. The
    /// caller then hands the heap on (`global::heaps::abandon`).
    ///
    /// # Safety
    /// Owner only, as its last act on the heap's owner-only state.
    pub unsafe fn abandon(&self) {
        // The spans of guarded blocks the thread kept go back to the heap.
        #[cfg(feature = "secure")]
        // SAFETY: owner only (caller).
        unsafe {
            crate::secure::give_back_kept_spans(self)
        };
        // Its thread frees into this cache no more: a slot it announced
        // keeps no OS page out of mesh passes while the heap waits for an
        // adopter.
        self.states[0].announce(0);
        {
            let mut l = self.lock_local();
            // SAFETY: owner only, with the page lists held.
            unsafe {
                if self.global {
                    // The next threads to allocate take them, instead of
                    // this heap's pages holding them for an adopter.
                    for class in 0..CLASSES {
                        self.pass_older(&mut l, class, 0, false);
                    }
                } else {
                    self.flush_caches(&mut l);
                }
                self.release_empty_pages(&mut l, Access::Owner, Hollow::Never);
            }
        }
        // Empty now: the next owner's caches start short.
        for (class, &usual) in LIMITS.iter().enumerate() {
            self.class(class).set_limit(usual);
        }
    }

    /// Checks every slot in the thread caches, and for a global heap in
    /// the transfer cache too, changing nothing: aborts on a slot freed
    /// twice into them (in one list twice, or in the cache and a batch),
    /// or whose other copy went to its page or was handed out (what the
    /// next allocation or flush would catch). For the process's exit,
    /// where no flush comes. A class whose transfer stack another thread
    /// holds is checked in the cache alone.
    ///
    /// # Safety
    /// Owner only, between operations.
    pub unsafe fn verify_caches(&self) {
        for class in 0..CLASSES {
            let state = self.class(class);
            // SAFETY: owner only (caller); the batches are walked and their
            // keys put back with their stack's lock held, so nobody takes
            // one meanwhile, and the cache's keys go back before it is used.
            unsafe {
                state.keys_to_page();
                if self.global {
                    self.transfer().with_batches(class, |batches| {
                        for b in batches {
                            walk_to_page(b.head, b.count);
                        }
                        for b in batches {
                            walk_to_cache(b.head, b.count);
                        }
                    });
                }
                state.keys_to_cache();
            }
        }
    }

    /// A visit while the heap's thread is elsewhere (the purger's pass,
    /// another thread's `trim()`): collects what other threads freed into
    /// its pages, releases the pages that emptied (to be purged by the
    /// decay), hollows the pages out of use for a decay period
    /// (`heap/hollow.rs`) and runs the decay. Live objects stay where they are. A heap
    /// whose thread is alive (`Access::Visitor`) keeps its current pages
    /// and caches, which its fast paths use without the lock; an abandoned
    /// one (`Access::Owner`, claimed by the caller) has none worth keeping.
    ///
    /// # Safety
    /// `l` is this heap's page lists; with `Access::Owner`, the caller also
    /// holds the heap as its owner (a visit of an abandoned heap).
    pub(crate) unsafe fn release_while_away(&self, l: &mut Local, who: Access) {
        let now = self.source().now_ms();
        // SAFETY: per the caller.
        unsafe { self.release_empty_pages(l, who, Hollow::IfStale(now)) };
        self.purge_expired(None);
    }

    /// Gives back what can be given back without the owner: retained spans,
    /// cached huge objects, wholly free segments (any thread), counted as
    /// purged for `trim()`.
    pub fn trim_shared(&self) {
        self.trim_shared_for(Why::Trim);
    }

    /// [`HeapCore::trim_shared`], counting what it purges as `why`.
    pub(crate) fn trim_shared_for(&self, why: Why) {
        let ctx = self.ctx();
        let now = self.source().now_ms();
        let mut spans = self.spans.lock();
        spans.decay(&ctx, now, Some(why));
        spans.release_empty(&ctx);
        self.publish(&mut spans, now);
        self.next_deadline.store(u64::MAX, Relaxed);
    }

    /// Purges up to `bytes` of this heap's retained spans, oldest first,
    /// for another heap that had to commit fresh memory (any thread; a
    /// busy span pool is skipped). Returns the bytes purged.
    pub fn purge_for_another(&self, bytes: usize) -> usize {
        let Some(mut spans) = self.spans.try_lock() else {
            return 0;
        };
        let ctx = self.ctx();
        let purged = spans.purge_oldest(&ctx, bytes);
        if purged > 0 {
            self.publish(&mut spans, self.source().now_ms());
        }
        purged
    }

    /// Runs the decay from outside the owner (background purger), or
    /// purges everything for `force`'s cause (the limit). Returns false if
    /// the span lock was busy.
    pub fn purge_expired(&self, force: Option<Why>) -> bool {
        let Some(mut spans) = self.spans.try_lock() else {
            return false;
        };
        let ctx = self.ctx();
        let now = self.source().now_ms();
        let next = spans.decay(&ctx, now, force);
        self.publish(&mut spans, now);
        self.next_deadline.store(next.unwrap_or(u64::MAX), Relaxed);
        true
    }
}
