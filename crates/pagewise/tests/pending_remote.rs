//! `stats()` counts as free the slots other threads freed into a live
//! thread's pages and that the owner has not collected yet: they wait on
//! the pages' remote lists and, for the first free into a full page, on the
//! heap's delayed list (`heap/remote.rs`, `pending_remote`). Its own test
//! binary, run in a child process, with no purger: the counts are exact
//! only with no other thread collecting (cargo-mutants found that no test
//! read a heap with frees pending: counting none of them, or every class
//! one too many, passed).

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;
mod solo;

use pagewise::layout::SLICE;
use pagewise::size_class::{class_of, PAGE_SLICES, SLOT_SIZE};
use pagewise::thread::{current_or_null, FREES_BEFORE_HEAP};
use std::alloc::{alloc, dealloc, Layout};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

#[test]
fn stats_counts_frees_pending_in_a_live_threads_pages() {
    // The purger would take the delayed list in (to the same counts, so
    // the test would pass whether or not stats() reads it).
    std::env::set_var("PAGEWISE_BACKGROUND", "0");
    solo::alone(
        "stats_counts_frees_pending_in_a_live_threads_pages",
        Duration::from_secs(60),
        pending,
    );
}

fn pending() {
    // A class with few slots per page: several pages fill up and go to the
    // owner's full list, so the first free into each goes to the delayed
    // list, the others to the page's remote list.
    let size = 32 << 10;
    let c = class_of(size);
    let per_page = PAGE_SLICES[c] as usize * SLICE / SLOT_SIZE[c] as usize;
    let n = 3 * per_page + 1;
    // The freeing thread has no heap for its first FREES_BEFORE_HEAP frees
    // (its own start frees a few): each of its frees is a remote one.
    assert!(
        n + 16 < FREES_BEFORE_HEAP as usize,
        "{per_page} slots per page"
    );
    let layout = Layout::from_size_align(size, 8).unwrap();
    let before = pagewise::stats().classes[c];
    let (blocks_tx, blocks_rx) = mpsc::channel::<Vec<usize>>();
    let done = Arc::new(AtomicBool::new(false));
    let owner_done = done.clone();
    let owner = std::thread::spawn(move || {
        // SAFETY: a non-zero layout.
        let v: Vec<usize> = (0..n).map(|_| unsafe { alloc(layout) } as usize).collect();
        assert!(v.iter().all(|&p| p != 0));
        blocks_tx.send(v).unwrap();
        // Alive, and allocating or freeing nothing more, so it collects
        // nothing, until the checks are done. Parked, not blocked on a
        // channel: a blocking receive allocates (its waiter entry), and an
        // allocation that comes after the other thread's frees (this thread
        // descheduled after its send) takes the pending slots in before
        // stats() can count them where they wait.
        while !owner_done.load(Ordering::Acquire) {
            std::thread::park();
        }
    });
    let blocks = blocks_rx.recv().unwrap();
    let held = pagewise::stats().classes[c];
    assert_eq!(held.live_slots, before.live_slots + n as u64, "{held:?}");
    let freer = std::thread::spawn(move || {
        for &p in &blocks {
            // SAFETY: allocated by the owner with `layout`, freed once, here.
            unsafe { dealloc(p as *mut u8, layout) };
        }
        assert!(current_or_null().is_null(), "the freeing thread got a heap");
    });
    freer.join().unwrap();
    let s = pagewise::stats().classes[c];
    assert_eq!(
        s.total_frees,
        held.total_frees + n as u64,
        "pending frees not counted: {s:?}"
    );
    assert_eq!(s.live_slots, before.live_slots, "{s:?}");
    done.store(true, Ordering::Release);
    owner.thread().unpark();
    owner.join().unwrap();
    // The owner took them in (at its exit at the latest): the same counts.
    let after = pagewise::stats().classes[c];
    assert_eq!(after.live_slots, before.live_slots, "{after:?}");
}
