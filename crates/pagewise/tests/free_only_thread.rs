//! A thread that only frees what others allocate adopts a heap after
//! `FREES_BEFORE_HEAP` frees, so its frees are batched in a thread cache
//! instead of costing an atomic push each (its own test binary: the global
//! statistics see no other test's threads).

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

use pagewise::size_class::class_of;
use pagewise::thread::{current_or_null, FREES_BEFORE_HEAP};
use std::alloc::{alloc, dealloc, Layout};

#[test]
fn a_thread_that_only_frees_gets_a_thread_cache() {
    let layout = Layout::from_size_align(200, 8).unwrap();
    // Objects of the class live before the test: the harness's own (with
    // four `--skip` filters, as CI's aarch64 step passes, the vector of the
    // command-line arguments is a live 224-byte slot of this class).
    let live_before = pagewise::stats().classes[class_of(200)].live_slots;
    let n = FREES_BEFORE_HEAP as usize + 10;
    // SAFETY: non-zero layout.
    let blocks: Vec<usize> = (0..n).map(|_| unsafe { alloc(layout) } as usize).collect();
    assert!(blocks.iter().all(|&p| p != 0));
    // Made here: the freeing thread must not allocate.
    let mut had_heap = Vec::with_capacity(n);
    let freer = std::thread::spawn(move || {
        assert!(
            current_or_null().is_null(),
            "the thread starts without a heap"
        );
        for &p in &blocks {
            // SAFETY: allocated above with `layout`, freed once, here.
            unsafe { dealloc(p as *mut u8, layout) };
            had_heap.push(!current_or_null().is_null());
        }
        let cached = pagewise::stats().classes[class_of(200)].cached_slots;
        (had_heap, cached)
    });
    let (had_heap, cached) = freer.join().unwrap();
    // The thread's start frees a few blocks of its own (its closure, its
    // handle's parts): the heap comes a little before the loop's 64th free.
    let first = had_heap.iter().position(|h| *h).expect("a heap at last");
    let want = FREES_BEFORE_HEAP as usize - 1;
    assert!(
        first <= want && first + 8 >= want,
        "heap adopted at free {first}"
    );
    assert!(had_heap[first..].iter().all(|h| *h), "a heap from then on");
    // (The main thread's cache may hold slots of the class too.)
    assert!(cached as usize >= n - first, "the rest went to its cache");
    // Every block is free again, the exited thread's cached ones included.
    let c = &pagewise::stats().classes[class_of(200)];
    assert_eq!(c.live_slots, live_before, "{c:?}");
}
