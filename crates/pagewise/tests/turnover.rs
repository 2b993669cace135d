//! Allocate-then-free one object, 200,000 times, must cost at most
//! a few system calls in total, at every size, counted by pagewise itself.

use pagewise::{Heap, PageSource, SystemPages};
use std::alloc::Layout;

const ROUNDS: usize = 200_000;

fn turnover(size: usize) -> pagewise::SyscallCounts {
    static SOURCES: [SystemPages; 8] = [const { SystemPages::new() }; 8];
    let slot = [
        64,
        4096,
        16 << 10,
        64 << 10,
        256 << 10,
        1 << 20,
        8 << 20,
        64 << 20,
    ]
    .iter()
    .position(|&s| s == size)
    .unwrap();
    let source: &'static SystemPages = &SOURCES[slot];
    let heap = Heap::with_source(source, pagewise::Config::default());
    let layout = Layout::from_size_align(size, 8).unwrap();
    for _ in 0..ROUNDS {
        let p = heap.allocate(layout).unwrap();
        // SAFETY: writes inside the allocation, then frees it with its layout.
        unsafe {
            p.cast::<u8>().as_ptr().write(1);
            heap.deallocate(p.cast(), layout);
        }
    }
    let during = source.syscalls();
    heap.trim();
    let s = heap.stats();
    assert_eq!(s.live_bytes, 0);
    assert_eq!(s.committed_bytes, 0, "trim leaves nothing committed");
    drop(heap);
    let after = source.syscalls();
    assert_eq!(after.mapped_bytes, 0, "drop unmaps everything");
    during
}

#[test]
fn turnover_costs_a_few_syscalls_at_every_size() {
    for size in [
        64usize,
        4096,
        16 << 10,
        64 << 10,
        256 << 10,
        1 << 20,
        8 << 20,
    ] {
        let c = turnover(size);
        // One mapping for the heap's bookkeeping, one reservation; nothing else.
        assert!(c.mmap <= 2, "{size}: {c:?}");
        assert_eq!(c.munmap, 0, "{size}: {c:?}");
        assert_eq!(c.madvise, 0, "{size}: {c:?}");
    }
}

#[test]
fn huge_turnover_reuses_the_cached_run() {
    let c = turnover(64 << 20);
    assert!(c.mmap <= 3, "{c:?}");
    assert_eq!(c.munmap, 0, "{c:?}");
    assert_eq!(c.madvise, 0, "{c:?}");
}
