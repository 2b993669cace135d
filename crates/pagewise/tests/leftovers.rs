//! A running thread allocates from the free slots a thread that exited
//! left on its pages, instead of opening new pages beside them while no
//! thread adopts the exited one's heap (its own test binary, one test: a
//! thread started meanwhile would adopt that heap whole).

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

use std::alloc::{alloc, dealloc, Layout};

/// A size the test harness does not use, so its class holds only ours.
const SIZE: usize = 720;
const N: usize = 4000;

fn layout() -> Layout {
    Layout::from_size_align(SIZE, 8).unwrap()
}

fn allocate(n: usize) -> Vec<usize> {
    (0..n)
        .map(|_| {
            // SAFETY: non-zero size.
            let p = unsafe { alloc(layout()) };
            assert!(!p.is_null());
            p as usize
        })
        .collect()
}

fn free(p: usize) {
    // SAFETY: allocated by `allocate`, freed once.
    unsafe { dealloc(p as *mut u8, layout()) };
}

#[test]
fn a_running_thread_takes_the_slots_an_exited_thread_left() {
    // This thread has a heap of its own before the other one exits (else
    // its first allocation would adopt the exited heap, pages and all).
    let mut mine = Vec::with_capacity(N);
    // Every other block freed by the thread that allocated them, which
    // then exits: the freed half waits in its caches, then on its pages.
    let (kept, freed): (Vec<usize>, Vec<usize>) = std::thread::spawn(|| {
        let all = allocate(N);
        let kept: Vec<usize> = all.iter().copied().step_by(2).collect();
        let freed: Vec<usize> = all.iter().copied().skip(1).step_by(2).collect();
        freed.iter().for_each(|&p| free(p));
        (kept, freed)
    })
    .join()
    .unwrap();
    let mut freed = freed;
    freed.sort_unstable();
    // The exited thread's cached slots go home to its pages (the transfer
    // cache sends them there), where no running thread allocated before.
    pagewise::trim();
    let committed = pagewise::stats().committed_bytes;
    for _ in 0..N / 2 {
        // SAFETY: non-zero size.
        let p = unsafe { alloc(layout()) };
        assert!(!p.is_null());
        mine.push(p as usize);
    }
    let reused = mine
        .iter()
        .filter(|p| freed.binary_search(p).is_ok())
        .count();
    let grown = pagewise::stats().committed_bytes.saturating_sub(committed);
    assert!(
        reused >= N / 2 * 9 / 10,
        "{reused} of {} blocks came from the exited thread's free slots; committed memory grew {grown} B",
        N / 2
    );
    assert!(
        grown < (N / 2 * SIZE / 10) as u64,
        "committed memory grew {grown} B for {} blocks that had free slots waiting",
        N / 2
    );
    mine.into_iter().chain(kept).for_each(free);
}
