//! The handshake between a free into a thread cache and a slab page that
//! stops taking such frees.
//!
//! A free into a thread cache announces the slot in its heap
//! (`ClassState::announce`), reads the slab table's word for the slot's
//! page (cacheable or not) and then stores the cache key and link into
//! the slot without looking at it (`HeapCore::cache_free`). A page that is
//! about to give back the OS pages of its free slots (hollowing) or to
//! remap them (meshing) first makes its word say "not cacheable", then has
//! every thread pass a barrier, then reads every heap's announcement, and
//! only then checks its free list or copies its objects. Without more, a
//! free that read the word just before it changed could store its key
//! just after the check, into a slot on the free list: a double free,
//! which the page would then purge and later carve again while the cache
//! hands the slot out too (or, meshing, a store onto a group page that
//! shows another page's object there).
//!
//! So each side orders its store before its load with one half of
//! [an asymmetric fence](crate::sync::asymmetric):
//!
//! - the free stores the announcement, then reads the word
//!   ([`before_reading_the_word`]);
//! - the page writes the word, then has every thread pass a barrier
//!   ([`stop_caching`], the page source's `serialize_threads`), then reads
//!   the announcements.
//!
//! Either the free sees the new word (and takes the checked path), or the
//! page sees the free's announcement, or a later one of the same thread.
//! If it sees the slot, the slot's OS pages stay (a key stored late lands
//! on the page's own memory, and the page's own checks find it when the
//! slot leaves its free list). If it sees a later announcement, the free
//! of the slot is over: the announcement is a release store
//! ([`ANNOUNCE`]) and the page's read an acquire load ([`READ_ANNOUNCED`]),
//! so the page's check of its free list sees the key. A slot is never both
//! cached and carved, and no key lands on a purged or remapped OS page.
//! The free pays a compiler fence and, on x86-64, nothing more (a release
//! store is a plain `mov` there); it used to read the word a second time
//! after its key. The page pays one `membarrier` each time it stops being
//! cacheable, and a read of every heap's announcement.

use crate::sync::asymmetric;
use core::sync::atomic::Ordering;

/// The order of a free's announcement of its slot (`ClassState::announce`).
pub(crate) const ANNOUNCE: Ordering = Ordering::Release;

/// The order of a page's read of an announcement
/// (`ClassState::announced`).
pub(crate) const READ_ANNOUNCED: Ordering = Ordering::Acquire;

/// The free's side, between its announcement of the slot
/// (`ClassState::announce`) and its read of the page's word: a page that
/// writes the word, has every thread pass a barrier, then reads every
/// heap's announcement (`HeapCore::spare_announced`, `Page::hollow`) sees
/// the slot (or a later announcement of the same thread) if the free read
/// the old word.
#[inline(always)]
pub fn before_reading_the_word() {
    asymmetric::light();
}

/// The page's side: `set_uncacheable()` writes the word, then every thread
/// passes a barrier (`serialize()`, which says whether it could), so the
/// announcements read after it show any free that read the old word and
/// did not see the new one.
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
    const SLOT: usize = 0x1000;
    const OTHER_SLOT: usize = 0x2000;

    struct Page {
        entry: AtomicUsize,
        /// The slot's key word, on the page's free list (a second free
        /// of it is under way).
        key: AtomicUsize,
        /// The freeing thread's announcement (`ClassState::announce`).
        announced: AtomicUsize,
    }

    /// The freeing thread, as `HeapCore::cache_free_at` orders it: the
    /// announcement, the read of the word, the key; then, with `next`, the
    /// thread's next free, of another page's slot, announced (a page that
    /// reads that announcement must see this free's key). Whether the
    /// slot went into its cache.
    fn free(p: &Page, next: bool) -> bool {
        p.announced.store(SLOT, ANNOUNCE);
        before_reading_the_word();
        if p.entry.load(Relaxed) != CACHEABLE {
            return false;
        }
        p.key.store(CACHE_KEY, Relaxed);
        if next {
            p.announced.store(OTHER_SLOT, ANNOUNCE);
        }
        true
    }

    /// The hollowing thread, as `Page::hollow` orders it: the word, the
    /// barrier, the announcements, the check of the free list. Whether it
    /// purged the slot's OS page (it keeps an announced slot's).
    fn hollow(p: &Page) -> bool {
        stop_caching(
            || p.entry.store(UNCACHEABLE, Relaxed),
            || {
                fence(SeqCst);
                true
            },
        );
        let spared = p.announced.load(READ_ANNOUNCED) == SLOT;
        let passed = p.key.load(Relaxed) == PAGE_KEY;
        passed && !spared
    }

    fn race_hollowing(next: bool) {
        loom::model(move || {
            let p = Arc::new(Page {
                entry: AtomicUsize::new(CACHEABLE),
                key: AtomicUsize::new(PAGE_KEY),
                announced: AtomicUsize::new(0),
            });
            let freer = {
                let p = p.clone();
                loom::thread::spawn(move || free(&p, next))
            };
            let purged = hollow(&p);
            let cached = freer.join().unwrap();
            assert!(
                !(cached && purged),
                "the slot is cached and its OS page purged: two owners to come"
            );
        });
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

    const OBJECT: usize = 30;

    /// The freeing thread, as `HeapCore::cache_free_at` orders it: the
    /// announcement, the read of the word, and only then any store into
    /// the slot (through whatever the address shows at that instant).
    fn free_announced(p: &Meshing) {
        p.announced.store(SLOT, ANNOUNCE);
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
        if p.announced.load(READ_ANNOUNCED) != SLOT {
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
    fn a_cached_double_free_is_seen_or_spared_by_the_hollowing_or_sees_the_page_stop() {
        race_hollowing(false);
    }

    /// The free is over and its thread announced another slot when the
    /// page reads the announcement: the page's check sees the key.
    #[test]
    fn a_cached_double_free_followed_by_another_free_is_seen_by_the_hollowing_check() {
        race_hollowing(true);
    }
}
