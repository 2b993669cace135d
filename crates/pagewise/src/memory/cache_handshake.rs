//! The handshake between a free into a thread cache and a slab page that
//! stops taking such frees.
//!
//! A free into a thread cache reads the slab table's word for the slot's
//! page (cacheable or not) and then stores the cache key into the slot
//! without looking at it (`HeapCore::cache_free`). A page that is about to
//! give back the OS pages of its free slots (hollowing) first makes its
//! word say "not cacheable", then checks every slot of its free list for
//! the page key, then purges. Without more, a free that read the word just
//! before it changed could store its key just after the check, into a slot
//! on the free list: a double free, which the page would then purge and
//! later carve again while the cache hands the slot out too.
//!
//! So each side orders its store before its load with one half of
//! [an asymmetric fence](crate::sync::asymmetric):
//!
//! - the free stores the key, then reads the word again
//!   ([`still_cacheable`]); if it changed, the free takes the key back and
//!   takes the checked path instead;
//! - the page writes the word, then has every thread pass a barrier
//!   ([`stop_caching`], the page source's `serialize_threads`), then checks
//!   its free list.
//!
//! Either the free sees the new word, or the page's check sees the key: a
//! slot is never both cached and carved. The free pays one load of a line
//! it has just read and a compiler fence; the page one `membarrier` each
//! time it stops being cacheable.

use crate::sync::asymmetric;

/// The free's side of the second handshake, with meshing: between its
/// announcement of the slot (`ClassState::announce`) and its read of the
/// page's word. A mesh pass writes the word, has every thread pass a
/// barrier, then reads every heap's announcement
/// (`HeapCore::spare_announced`): either the free reads the new word and
/// stores nothing into the slot, or the pass sees the slot and leaves its
/// OS page out (a key stored late lands on the page's own memory, never on
/// a group page showing another page's object).
#[inline(always)]
pub fn before_reading_the_word() {
    asymmetric::light();
}

/// The free's side, after it stored the cache key into the slot: whether
/// the slab table's word (`entry()`) still says what it said before the
/// store (`seen`). False: the page stopped taking cached frees meanwhile;
/// the caller clears the key and frees past the cache.
#[inline(always)]
pub fn still_cacheable(entry: impl FnOnce() -> usize, seen: usize) -> bool {
    asymmetric::light();
    entry() == seen
}

/// The page's side: `set_uncacheable()` writes the word, then every thread
/// passes a barrier (`serialize()`, which says whether it could), so the
/// checks of the slots that follow see any key stored by a free that read
/// the old word and did not see the new one.
pub fn stop_caching(set_uncacheable: impl FnOnce(), serialize: impl FnOnce() -> bool) -> bool {
    set_uncacheable();
    serialize()
}

#[cfg(all(test, loom))]
mod loom_model {
    //! A free of a slot into a thread cache races the slot's page
    //! becoming uncacheable and checking its free list, with the functions
    //! above; `serialize` is what the page source does under a model
    //! checker (a `SeqCst` fence, which `membarrier` amounts to).
    use super::*;
    use core::sync::atomic::Ordering::{Relaxed, SeqCst};
    use loom::sync::atomic::{fence, AtomicUsize};
    use loom::sync::Arc;

    const CACHEABLE: usize = 1;
    const UNCACHEABLE: usize = 2;
    const PAGE_KEY: usize = 10;
    const CACHE_KEY: usize = 20;

    struct Page {
        entry: AtomicUsize,
        /// The slot's key word, on the page's free list (a second free
        /// of it is under way).
        key: AtomicUsize,
    }

    /// The freeing thread: whether the slot went into its cache.
    fn free(p: &Page) -> bool {
        let seen = p.entry.load(Relaxed);
        if seen != CACHEABLE {
            return false;
        }
        p.key.store(CACHE_KEY, Relaxed);
        if still_cacheable(|| p.entry.load(Relaxed), seen) {
            return true;
        }
        p.key.store(0, Relaxed);
        false
    }

    /// The hollowing thread: whether its check of the free list passed
    /// (the slot would be purged and later carved again).
    fn hollow(p: &Page) -> bool {
        stop_caching(
            || p.entry.store(UNCACHEABLE, Relaxed),
            || {
                fence(SeqCst);
                true
            },
        );
        p.key.load(Relaxed) == PAGE_KEY
    }

    /// A page about to mesh: the slot's address shows the page's own
    /// memory until the pass remaps it onto the group page, whose word
    /// there is another member's object.
    struct Meshing {
        entry: AtomicUsize,
        /// The freeing thread's announcement (`ClassState::announce`).
        announced: AtomicUsize,
        /// Whether the slot's OS page shows the group page.
        remapped: AtomicUsize,
        own: AtomicUsize,
        group: AtomicUsize,
    }

    const SLOT: usize = 0x1000;
    const OBJECT: usize = 30;

    /// The freeing thread, as `HeapCore::cache_free_at` orders it: the
    /// announcement, the read of the word, and only then any store into
    /// the slot (through whatever the address shows at that instant).
    fn free_announced(p: &Meshing) {
        p.announced.store(SLOT, Relaxed);
        before_reading_the_word();
        if p.entry.load(Relaxed) != CACHEABLE {
            return;
        }
        let shown = if p.remapped.load(Relaxed) == 1 {
            &p.group
        } else {
            &p.own
        };
        shown.store(CACHE_KEY, Relaxed);
    }

    /// The mesh pass, as `HeapCore::stop_caching_planned` and
    /// `spare_announced` order it: the word, the barrier, the
    /// announcements; the slot's OS page is remapped only if no thread
    /// announced the slot.
    fn mesh(p: &Meshing) {
        stop_caching(
            || p.entry.store(UNCACHEABLE, Relaxed),
            || {
                fence(SeqCst);
                true
            },
        );
        if p.announced.load(Relaxed) != SLOT {
            p.remapped.store(1, Relaxed);
        }
    }

    #[test]
    fn a_cached_double_free_never_stores_into_a_group_page() {
        loom::model(|| {
            let p = Arc::new(Meshing {
                entry: AtomicUsize::new(CACHEABLE),
                announced: AtomicUsize::new(0),
                remapped: AtomicUsize::new(0),
                own: AtomicUsize::new(PAGE_KEY),
                group: AtomicUsize::new(OBJECT),
            });
            let freer = {
                let p = p.clone();
                loom::thread::spawn(move || free_announced(&p))
            };
            mesh(&p);
            freer.join().unwrap();
            assert_eq!(
                p.group.load(Relaxed),
                OBJECT,
                "the free's key overwrote another member's object"
            );
        });
    }

    #[test]
    fn a_cached_double_free_is_seen_by_the_hollowing_check_or_sees_the_page_stop() {
        loom::model(|| {
            let p = Arc::new(Page {
                entry: AtomicUsize::new(CACHEABLE),
                key: AtomicUsize::new(PAGE_KEY),
            });
            let freer = {
                let p = p.clone();
                loom::thread::spawn(move || free(&p))
            };
            let passed = hollow(&p);
            let cached = freer.join().unwrap();
            assert!(
                !(cached && passed),
                "the slot is cached and its OS page purged: two owners to come"
            );
        });
    }
}
