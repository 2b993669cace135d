//! Address space is limited only by what the kernel gives: no table of
//! pagewise's own runs out first. (Its own test binary: it maps hundreds of
//! GiB of address space, untouched, with `MAP_NORESERVE`.)

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

use std::alloc::{alloc, dealloc, Layout};

const MIB: usize = 1 << 20;

/// Allocates `n` blocks of `layout` (untouched), checks each, frees them.
fn allocate_many(layout: Layout, n: usize) {
    let mut blocks = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: a non-zero layout.
        let p = unsafe { alloc(layout) };
        assert!(!p.is_null(), "allocation {i} of {layout:?} failed");
        assert_eq!(p as usize % layout.align(), 0);
        blocks.push(p);
    }
    for p in blocks {
        // SAFETY: allocated above with `layout`, freed once.
        unsafe { dealloc(p, layout) };
    }
}

#[test]
fn more_than_256_one_gib_blocks() {
    allocate_many(Layout::from_size_align(1 << 30, 16).unwrap(), 300);
    pagewise::trim();
}

#[test]
fn more_than_256_blocks_aligned_to_64_mib() {
    allocate_many(Layout::from_size_align(20 * MIB, 64 * MIB).unwrap(), 300);
    pagewise::trim();
}

#[test]
fn an_owned_heap_with_small_reservations_is_not_capped() {
    let heap = pagewise::Heap::with_config(pagewise::Config {
        reservation_bytes: 32 * MIB,
        ..Default::default()
    });
    // Three 10 MiB objects fill a segment, and each reservation is one
    // segment: 300 reservations.
    let l = Layout::from_size_align(10 * MIB, 8).unwrap();
    let blocks: Vec<_> = (0..900)
        .map(|i| {
            heap.allocate(l)
                .unwrap_or_else(|_| panic!("allocation {i} failed"))
        })
        .collect();
    assert!(heap.stats().reserved_bytes >= 300 * 32 * MIB as u64);
    for b in blocks {
        // SAFETY: allocated above with `l`, freed once.
        unsafe { heap.deallocate(b.cast(), l) };
    }
    heap.trim();
    assert_eq!(heap.stats().reserved_bytes, 0);
}
