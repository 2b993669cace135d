//! The thread cache takes only slots of live slab pages: never a huge
//! object, never a large one, whatever the bytes around them hold.

use pagewise::{Config, FakePages, Heap, Purge};
use std::alloc::Layout;

const SEGMENT: usize = 32 << 20;

fn config() -> Config {
    Config {
        decay_ms: 10,
        ..Config::DEFAULT
    }
}

#[test]
fn a_huge_block_in_the_middle_of_its_run_is_not_taken_for_a_slot() {
    static SRC: FakePages = FakePages::new();
    let heap = Heap::with_source(&SRC, config());
    // Aligned to a segment, the block starts in the second segment of its
    // run, where a slab segment would keep its slab table.
    let l = Layout::from_size_align(1 << 20, SEGMENT).unwrap();
    let p = heap.allocate(l).unwrap().cast::<u8>();
    assert_eq!(p.as_ptr() as usize % SEGMENT, 0);
    // Bytes that decode as "a slab page of class 2 starts here".
    // SAFETY: the block has 1 MiB; 128 KiB of u16 are written.
    unsafe { std::slice::from_raw_parts_mut(p.as_ptr() as *mut u16, 65536).fill(3) };
    // SAFETY: allocated above with this layout.
    unsafe { heap.deallocate(p, l) };
    assert_eq!(heap.stats().huge.count, 0, "freed as a huge object");
    let q = heap
        .allocate(Layout::from_size_align(32, 8).unwrap())
        .unwrap();
    assert_ne!(q.cast::<u8>(), p, "a freed huge block came back as a slot");
}

#[test]
fn segments_of_a_released_huge_run_start_with_a_clean_slab_table() {
    static SRC: FakePages = FakePages::new();
    // MADV_FREE leaves a purged huge object's bytes in place.
    let heap = Heap::with_source(
        &SRC,
        Config {
            purge: Purge::Free,
            reservation_bytes: 8 * SEGMENT,
            ..config()
        },
    );
    let keep = heap
        .allocate(Layout::from_size_align(64, 8).unwrap())
        .unwrap()
        .cast::<u8>();
    let hl = Layout::from_size_align(40 << 20, 8).unwrap();
    let h = heap.allocate(hl).unwrap().cast::<u8>();
    let run = h.as_ptr() as usize & !(SEGMENT - 1);
    // SAFETY: the block has 40 MiB; all of it is written with bytes that
    // decode as slab-table entries.
    unsafe { std::slice::from_raw_parts_mut(h.as_ptr() as *mut u16, (40 << 20) / 2).fill(0x81) };
    // SAFETY: allocated above with this layout.
    unsafe { heap.deallocate(h, hl) };
    heap.trim();
    // Large objects until one lands in the run's former second segment.
    let big = Layout::from_size_align(15 << 20, 8).unwrap();
    let mut bigs = vec![];
    let mut landed = false;
    for _ in 0..8 {
        let b = heap.allocate(big).unwrap().cast::<u8>();
        landed = b.as_ptr() as usize & !(SEGMENT - 1) == run + SEGMENT;
        bigs.push(b);
        if landed {
            break;
        }
    }
    // The premise: without it the check below passes whatever the slab
    // table holds.
    assert!(landed, "no large object landed in the run's second segment");
    for b in bigs {
        // SAFETY: allocated above with this layout.
        unsafe { heap.deallocate(b, big) };
    }
    assert_eq!(
        heap.stats().large.count,
        0,
        "every large free reached the span pool"
    );
    // SAFETY: allocated above with this layout.
    unsafe { heap.deallocate(keep, Layout::from_size_align(64, 8).unwrap()) };
}
