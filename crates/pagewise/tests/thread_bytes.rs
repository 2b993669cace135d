//! The calling thread's allocated and freed bytes (jemalloc's
//! `thread.allocated` and `thread.deallocated`), exact to the byte on every
//! path: the cache, pages, caches passed on when full, large, huge and
//! over-aligned blocks, frees of another thread's blocks, resizing in place,
//! and a heap adopted from a thread that exited.

use pagewise::raw;
use pagewise::thread::{allocated_bytes, freed_bytes};
use std::thread;

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

/// Sizes and alignments across the classes, past the cache's limit in
/// count, and large and huge blocks.
fn requests() -> Vec<(usize, usize)> {
    let mut r = Vec::with_capacity(20_000);
    for i in 0..12_000 {
        r.push((1 + i % 1024, 16));
    }
    for i in 0..300 {
        r.push((4096 + i * 97, 64));
    }
    for i in 0..20 {
        r.push(((300 << 10) + i * 4096, 4096));
    }
    r.push((40 << 20, 16));
    r.push((3 << 20, 2 << 20));
    r
}

/// Allocates every request in the calling thread; returns the blocks and
/// the sum of their usable sizes. Counts only what it allocates: the
/// vector is allocated before the caller reads the figures.
fn allocate(blocks: &mut Vec<(usize, usize)>, requests: &[(usize, usize)]) -> u64 {
    let mut usable = 0;
    for &(size, align) in requests {
        // SAFETY: alignments above are powers of two; freed by `free_all`.
        let p = unsafe { raw::malloc(size, align) };
        assert!(!p.is_null());
        // SAFETY: a live block.
        usable += unsafe { raw::usable_size(p) } as u64;
        blocks.push((p as usize, size));
    }
    usable
}

fn free_all(blocks: &[(usize, usize)]) -> u64 {
    let mut usable = 0;
    for &(p, _) in blocks {
        // SAFETY: live blocks of `allocate`, each freed once.
        unsafe {
            usable += raw::usable_size(p as *const u8) as u64;
            raw::free(p as *mut u8);
        }
    }
    usable
}

#[test]
fn a_thread_counts_what_it_allocated_and_freed_to_the_byte() {
    thread::spawn(|| {
        let requests = requests();
        let mut blocks = Vec::with_capacity(requests.len());
        let (a0, f0) = (allocated_bytes(), freed_bytes());
        let usable = allocate(&mut blocks, &requests);
        let (a1, f1) = (allocated_bytes(), freed_bytes());
        assert_eq!(a1 - a0, usable, "allocated");
        assert_eq!(f1, f0, "nothing freed yet");
        let freed = free_all(&blocks);
        assert_eq!(freed, usable);
        assert_eq!(freed_bytes() - f1, freed, "freed");
        assert_eq!(allocated_bytes(), a1, "freeing allocates nothing");
    })
    .join()
    .unwrap();
}

#[test]
fn blocks_freed_by_another_thread_count_there() {
    let requests = requests();
    let (blocks, usable) = thread::spawn(move || {
        let mut blocks = Vec::with_capacity(requests.len());
        let usable = allocate(&mut blocks, &requests);
        (blocks, usable)
    })
    .join()
    .unwrap();
    thread::spawn(move || {
        // A first allocation gives this thread its heap (kept opaque: the
        // optimiser may remove an allocation whose block is never used,
        // and without a heap the frees below would not be counted).
        drop(std::hint::black_box(Box::new(1u64)));
        let (a0, f0) = (allocated_bytes(), freed_bytes());
        let freed = free_all(&blocks);
        assert_eq!(freed, usable);
        assert_eq!(freed_bytes() - f0, freed, "the freeing thread counts");
        assert_eq!(allocated_bytes(), a0);
        // Trimming passes this thread's cache on: not a free.
        pagewise::trim();
        assert_eq!(freed_bytes() - f0, freed);
        drop(blocks);
    })
    .join()
    .unwrap();
}

#[test]
fn a_thread_that_adopts_a_heap_starts_from_zero() {
    for _ in 0..4 {
        thread::spawn(|| {
            let requests = requests();
            let mut blocks = Vec::with_capacity(requests.len());
            allocate(&mut blocks, &requests);
            free_all(&blocks[..blocks.len() / 2]);
            // The rest outlives the thread.
            std::mem::forget(blocks);
        })
        .join()
        .unwrap();
        thread::spawn(|| {
            assert_eq!((allocated_bytes(), freed_bytes()), (0, 0), "no heap yet");
            // SAFETY: 16 is a power of two; freed below.
            let p = unsafe { raw::malloc(100, 16) };
            // SAFETY: live.
            let usable = unsafe { raw::usable_size(p) } as u64;
            assert_eq!(allocated_bytes(), usable);
            assert_eq!(freed_bytes(), 0);
            // SAFETY: freed once.
            unsafe { raw::free(p) };
            assert_eq!(freed_bytes(), usable);
        })
        .join()
        .unwrap();
    }
}

#[test]
fn a_resize_in_place_counts_the_new_size_allocated_and_the_old_freed() {
    thread::spawn(|| {
        // SAFETY: 16 is a power of two; freed below.
        let p = unsafe { raw::malloc(400 << 10, 16) };
        // SAFETY: live.
        let old = unsafe { raw::usable_size(p) } as u64;
        let (a0, f0) = (allocated_bytes(), freed_bytes());
        // SAFETY: live; not used past its new size.
        let grew = unsafe { raw::resize_in_place(p, 600 << 10) };
        // SAFETY: live.
        let new = unsafe { raw::usable_size(p) } as u64;
        if grew {
            assert_eq!(allocated_bytes() - a0, new);
            assert_eq!(freed_bytes() - f0, old);
        }
        // SAFETY: live; moved or resized, the block is the one returned.
        let q = unsafe { raw::realloc(p, 200 << 10, 16) };
        // SAFETY: live.
        let last = unsafe { raw::usable_size(q) } as u64;
        let (a1, f1) = (allocated_bytes(), freed_bytes());
        assert_eq!(a1 - a0, if grew { new } else { 0 } + last);
        assert_eq!(f1 - f0, if grew { old + new } else { old });
        // SAFETY: freed once.
        unsafe { raw::free(q) };
        assert_eq!(freed_bytes() - f1, last);
    })
    .join()
    .unwrap();
}
