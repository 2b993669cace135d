//! Maintenance on the owner's slow paths, `trim()`, abandoning a heap at
//! thread exit, and the purges other threads may run on it.
//!
//! Invariants: `maintenance`, `trim` and `abandon` are owner-only (an
//! abandoned heap's owner is whoever claimed it); `trim_shared` and
//! `purge_expired` touch only the span pool, under its lock, and may run on
//! any thread.

use super::*;

impl HeapCore {
    /// Owner-side periodic work on slow paths: release current pages that
    /// stayed empty since the last pass, and run the decay if due.
    pub(super) unsafe fn maintenance(&self) {
        if self.flush_requested.load(Relaxed) {
            self.flush_requested.store(false, Relaxed);
            // SAFETY: owner only (caller).
            unsafe { self.flush_caches() };
        }
        let now = self.source().now_ms();
        // SAFETY: owner only (caller); the borrow ends before any call.
        unsafe {
            let next = &mut self.local().next_maintenance;
            if now < *next {
                return;
            }
            *next = now + (self.config.decay_ms / 2).max(1);
        }
        for class in 0..CLASSES {
            // Halve the caches: slots still wanted come back from their
            // pages cheaply; slots no longer wanted go home within a few
            // passes, so their pages can empty.
            let n = self.class(class).cached();
            if n > 0 {
                // SAFETY: owner only (caller).
                unsafe { self.flush_cache(class, n / 2) };
            }
        }
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
                    self.release_page(page);
                }
            }
        }
        if self.next_deadline.load(Relaxed) <= now {
            let ctx = self.ctx();
            let mut spans = self.spans.lock();
            self.after_span_change(&ctx, &mut spans, now);
        }
    }

    /// Gives back everything retained: empty slab pages, expired or not,
    /// retained spans and huge objects, wholly free segments and unused
    /// reservations.
    ///
    /// # Safety
    /// Owner only.
    pub unsafe fn trim(&self) {
        // SAFETY: owner only (caller).
        unsafe {
            self.flush_caches();
            self.process_delayed();
            self.release_empty_pages();
        }
        let ctx = self.ctx();
        let now = self.source().now_ms();
        let mut spans = self.spans.lock();
        spans.decay(&ctx, now, true);
        spans.release_empty(&ctx);
        self.publish(&mut spans, now);
        self.next_deadline.store(u64::MAX, Relaxed);
    }

    /// Collects remote frees everywhere and releases every empty slab page.
    pub(super) unsafe fn release_empty_pages(&self) {
        for class in 0..CLASSES {
            self.set_current_page(class, empty_page());
            // SAFETY: owner only (caller); queue entries are slab pages of
            // this heap; the next link is read before the page may leave.
            unsafe {
                let mut p = self.local().queues[class].head;
                while !p.is_null() {
                    let next = (*p).next;
                    self.collect_and_release_if_empty(p);
                    p = next;
                }
            }
        }
        // SAFETY: as above, for the full list.
        unsafe {
            let mut p = self.local().full.head;
            while !p.is_null() {
                let next = (*p).next;
                if (*p).has_remote() {
                    self.local().full.remove(p);
                    (*p).clear_full();
                    self.local().queues[(*p).class as usize].push(p);
                    self.collect_and_release_if_empty(p);
                }
                p = next;
            }
        }
    }

    pub(super) unsafe fn collect_and_release_if_empty(&self, page: *mut Page) {
        // SAFETY: owner only; a slab page of this heap.
        unsafe {
            let n = (*page).collect_thread_free();
            self.class((*page).class as usize).returned.add(n as u64);
            if (*page).used() == 0 {
                self.release_page(page);
            }
        }
    }

    /// Prepares the heap to be left without an owner (its thread exited):
    /// empty pages go back to the span pool, to be purged by decay.
    ///
    /// # Safety
    /// Owner only, as its last act.
    pub unsafe fn abandon(&self) {
        // SAFETY: owner only.
        unsafe {
            self.flush_caches();
            self.process_delayed();
            self.release_empty_pages();
        }
        self.owner.store(crate::global::heaps::ABANDONED, Release);
    }

    /// Checks every slot in the thread caches, changing nothing: aborts on
    /// a slot freed twice into them, or whose other copy went to its page
    /// or was handed out (what the next allocation or flush would catch).
    /// For the process's exit, where no flush comes.
    ///
    /// # Safety
    /// Owner only, between operations.
    pub unsafe fn verify_caches(&self) {
        for class in 0..CLASSES {
            // SAFETY: owner only (caller).
            unsafe { self.class(class).verify() };
        }
    }

    /// The purger's pass over a heap whose thread exited: collects what
    /// other threads freed into it, releases the pages that emptied (to be
    /// purged by the decay) and runs the decay. Its live objects stay where
    /// they are.
    ///
    /// # Safety
    /// The caller holds the heap as its owner (a visit of an abandoned heap).
    pub unsafe fn release_while_abandoned(&self) {
        // SAFETY: per the caller.
        unsafe {
            self.process_delayed();
            self.release_empty_pages();
        }
        self.purge_expired(false);
    }

    /// Gives back what can be given back without the owner: retained spans,
    /// cached huge objects, wholly free segments (any thread).
    pub fn trim_shared(&self) {
        let ctx = self.ctx();
        let now = self.source().now_ms();
        let mut spans = self.spans.lock();
        spans.decay(&ctx, now, true);
        spans.release_empty(&ctx);
        self.publish(&mut spans, now);
        self.next_deadline.store(u64::MAX, Relaxed);
    }

    /// Runs the decay from outside the owner (background purger, global
    /// trim). Returns false if the span lock was busy.
    pub fn purge_expired(&self, force: bool) -> bool {
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
