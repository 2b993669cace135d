//! Retention, decay, the byte cap, trim and drop, checked exactly against a
//! fake page source whose clock the test moves.

use pagewise::{Config, FakePages, Heap, PageSource, Purge};
use std::alloc::Layout;
use std::ptr::NonNull;

fn leak_source() -> &'static FakePages {
    Box::leak(Box::new(FakePages::new()))
}

fn heap(config: Config) -> (Heap<&'static FakePages>, &'static FakePages) {
    let src = leak_source();
    (Heap::with_source(src, config), src)
}

fn alloc(h: &Heap<&'static FakePages>, size: usize) -> NonNull<u8> {
    let p = h
        .allocate(Layout::from_size_align(size, 8).unwrap())
        .unwrap()
        .cast::<u8>();
    // SAFETY: fresh allocation of `size` bytes: touch all of it.
    unsafe { p.as_ptr().write_bytes(0xab, size) };
    p
}

fn free(h: &Heap<&'static FakePages>, p: NonNull<u8>, size: usize) {
    // SAFETY: allocated by `alloc` with this size.
    unsafe { h.deallocate(p, Layout::from_size_align(size, 8).unwrap()) };
}

const MIB: usize = 1 << 20;

#[test]
fn freed_large_spans_are_retained_until_the_decay_delay() {
    let (h, src) = heap(Config {
        decay_ms: 1000,
        ..Config::DEFAULT
    });
    let p = alloc(&h, 4 * MIB);
    assert_eq!(h.stats().committed_bytes, 4 * MIB as u64);
    free(&h, p, 4 * MIB);
    let s = h.stats();
    assert_eq!(s.retained_bytes, 4 * MIB as u64, "retained, not purged");
    assert_eq!(src.syscalls().madvise, 0);
    src.advance_ms(999);
    let q = alloc(&h, 64); // a slow path, but nothing has expired
    free(&h, q, 64);
    assert_eq!(src.syscalls().madvise, 0);
    src.advance_ms(1);
    let r = alloc(&h, 2 * MIB); // reuses part of the retained span...
    let s = h.stats();
    // ...and the rest, now expired, is purged in one call.
    assert_eq!(src.syscalls().madvise, 1);
    assert_eq!(s.retained_bytes, 0);
    // The 64-byte slab page took the first (dirty) slice of the old span:
    // its 64 KiB stay committed, as does the 2 MiB object.
    assert_eq!(s.committed_bytes, 2 * MIB as u64 + 65536);
    free(&h, r, 2 * MIB);
}

#[test]
fn the_cap_purges_the_oldest_at_once() {
    let (h, src) = heap(Config {
        decay_ms: 60_000,
        retain_max_bytes: 3 * MIB,
        ..Config::DEFAULT
    });
    let a = alloc(&h, 2 * MIB);
    let b = alloc(&h, 2 * MIB);
    let guard = alloc(&h, 2 * MIB); // keeps `a` and `b` from coalescing with the tail
    free(&h, a, 2 * MIB);
    assert_eq!(src.syscalls().madvise, 0);
    free(&h, b, 2 * MIB); // 4 MiB retained > 3 MiB cap: the oldest goes
    let s = h.stats();
    assert!(s.retained_bytes <= 3 * MIB as u64, "{s:?}");
    assert!(src.syscalls().madvise >= 1);
    free(&h, guard, 2 * MIB);
}

#[test]
fn trim_leaves_nothing_but_bookkeeping() {
    let (h, src) = heap(Config::DEFAULT);
    let mut v = Vec::new();
    for i in 0..5000 {
        let size = 16 + (i * 37) % 3000;
        v.push((alloc(&h, size), size));
    }
    let big = alloc(&h, 3 * MIB);
    let huge = alloc(&h, 40 * MIB);
    for (p, s) in v {
        free(&h, p, s);
    }
    free(&h, big, 3 * MIB);
    free(&h, huge, 40 * MIB);
    h.trim();
    let s = h.stats();
    assert_eq!(s.live_bytes, 0);
    assert_eq!(s.live_allocations, 0);
    assert_eq!(s.committed_bytes, 0);
    assert_eq!(s.retained_bytes, 0);
    assert_eq!(s.segments, 0);
    assert_eq!(s.reserved_bytes, 0, "unused reservations unmapped");
    // Only the heap's own bookkeeping mapping is left.
    assert_eq!(
        src.syscalls().mapped_bytes,
        src.syscalls().mapped_bytes.min(64 << 10)
    );
}

#[test]
fn dropping_a_heap_unmaps_everything_even_live_objects() {
    let (h, src) = heap(Config::DEFAULT);
    for i in 0..1000 {
        let _ = alloc(&h, 1 + i * 50);
    }
    let _ = alloc(&h, 100 * MIB);
    assert!(src.syscalls().mapped_bytes > 100 * MIB as u64);
    drop(h);
    let c = src.syscalls();
    assert_eq!(c.mapped_bytes, 0, "{c:?}");
    assert_eq!(
        c.mmap, c.munmap,
        "every mapping unmapped exactly once: {c:?}"
    );
}

#[test]
fn memory_is_released_page_by_page_inside_a_segment() {
    // One live object pins its slab page, not its segment.
    let (h, _src) = heap(Config {
        decay_ms: 0,
        ..Config::DEFAULT
    });
    let objs: Vec<_> = (0..20_000).map(|_| alloc(&h, 512)).collect();
    let peak = h.stats().committed_bytes;
    assert!(peak >= 20_000 * 512);
    for (i, p) in objs.iter().enumerate() {
        if i != 10_000 {
            free(&h, *p, 512);
        }
    }
    h.trim();
    let s = h.stats();
    assert_eq!(s.live_allocations, 1);
    assert!(
        s.committed_bytes <= 64 << 10,
        "only the survivor's page stays: {s:?}"
    );
    assert!(s.reserved_bytes > 0, "the segment itself is kept");
    free(&h, objs[10_000], 512);
}

#[test]
fn a_freed_large_span_comes_back_whole_and_merges_later() {
    let (h, _src) = heap(Config::DEFAULT);
    // A slab page, then a large object right after it, then the free tail.
    let small: Vec<_> = (0..100).map(|_| alloc(&h, 64)).collect();
    let large = alloc(&h, MIB);
    free(&h, large, MIB);
    // The span freed last is taken back whole by the next request of its size.
    let again = alloc(&h, MIB);
    assert_eq!(again, large);
    free(&h, again, MIB);
    // It stays unmerged from the free tail; when the slab page before it is
    // released, page, span and tail must become one free span again, or the
    // wholly free segment could not be released whole.
    for p in small {
        free(&h, p, 64);
    }
    h.trim();
    let s = h.stats();
    assert_eq!(
        (s.segments, s.committed_bytes, s.reserved_bytes),
        (0, 0, 0),
        "{s:?}"
    );
    // And the pool is still sound: the next request maps a fresh segment.
    let d = alloc(&h, 3 * MIB);
    let s = h.stats();
    assert_eq!((s.segments, s.large.count), (1, 1), "{s:?}");
    free(&h, d, 3 * MIB);
}

#[test]
fn the_thread_cache_is_bounded_and_goes_home_on_trim() {
    let (h, _src) = heap(Config::DEFAULT);
    let class = pagewise::size_class::class_of(64);
    let objs: Vec<_> = (0..1000).map(|_| alloc(&h, 64)).collect();
    for p in &objs {
        free(&h, *p, 64);
    }
    let s = h.stats();
    let c = &s.classes[class];
    assert_eq!(c.live_slots, 0);
    assert_eq!((c.total_allocs, c.total_frees), (1000, 1000));
    // The cache fills to 128; a free that finds it full sends the older 64
    // home and is cached: after 1000 frees, 65 + (1000 - 129) % 64 are left.
    assert_eq!(c.cached_slots, 104, "at most 128 slots cached per class");
    assert_eq!(c.pages, 1, "the cached slots keep their page");
    // The next allocation comes from the cache, most recent first.
    let again = alloc(&h, 64);
    assert_eq!(again, objs[999]);
    assert_eq!(h.stats().classes[class].cached_slots, 103);
    free(&h, again, 64);
    h.trim();
    let s = h.stats();
    let c = &s.classes[class];
    assert_eq!((c.cached_slots, c.pages, c.live_slots), (0, 0, 0));
    assert_eq!((c.total_allocs, c.total_frees), (1001, 1001));
    assert_eq!(s.committed_bytes, 0, "{s:?}");
}

#[test]
fn a_256_kib_class_caches_one_slot() {
    let (h, _src) = heap(Config::DEFAULT);
    let class = pagewise::size_class::class_of(256 << 10);
    let a = alloc(&h, 256 << 10);
    let b = alloc(&h, 256 << 10);
    free(&h, a, 256 << 10);
    free(&h, b, 256 << 10);
    let c = &h.stats().classes[class];
    assert_eq!(
        (c.cached_slots, c.live_slots),
        (1, 0),
        "64 KiB cap: one slot"
    );
}

#[test]
fn placement_prefers_the_fullest_page() {
    let (h, _src) = heap(Config::DEFAULT);
    // Fill three pages of 1 KiB slots (64 per page).
    let objs: Vec<_> = (0..192).map(|_| alloc(&h, 1024)).collect();
    let page_of = |p: NonNull<u8>| p.as_ptr() as usize >> 16;
    // Page A keeps 60 live, page B keeps 4 live, page C (current) keeps 62.
    let pages: Vec<usize> = objs.iter().map(|p| page_of(*p)).collect();
    let (a, b) = (pages[0], pages[64]);
    let mut freed_a = 0;
    let mut freed_b = 0;
    for (i, p) in objs.iter().enumerate() {
        if pages[i] == a && freed_a < 4 {
            free(&h, *p, 1024);
            freed_a += 1;
        } else if pages[i] == b && freed_b < 60 {
            free(&h, *p, 1024);
            freed_b += 1;
        }
    }
    // Exhaust the current page, then new allocations must go to A (fuller).
    let mut placed = Vec::new();
    for _ in 0..70 {
        placed.push(alloc(&h, 1024));
    }
    let in_a = placed.iter().filter(|p| page_of(**p) == a).count();
    let in_b = placed.iter().filter(|p| page_of(**p) == b).count();
    assert_eq!(in_a, 4, "the fuller page is filled first");
    assert!(in_b <= 60 && in_b > 0);
}

#[test]
fn madv_free_is_an_option() {
    // FakePages, like the kernel, zeroes what MADV_DONTNEED purges and
    // leaves what MADV_FREE purges in place (until memory pressure): the
    // purged span's last byte says which advice was given.
    for (purge, kept) in [(Purge::Free, true), (Purge::DontNeed, false)] {
        let (h, src) = heap(Config {
            decay_ms: 0,
            purge,
            ..Config::DEFAULT
        });
        let p = alloc(&h, MIB); // filled with 0xab
        free(&h, p, MIB);
        let q = alloc(&h, 64); // a slow path: the expired span is purged
        free(&h, q, 64);
        assert!(src.syscalls().madvise >= 1, "{purge:?}");
        assert_eq!(h.stats().retained_bytes, 0, "{purge:?}");
        // SAFETY: the span is purged, not unmapped (only trim and drop
        // unmap), and the 64-byte slab page took at most its first slice.
        let last = unsafe { p.as_ptr().add(MIB - 1).read_volatile() };
        assert_eq!(last == 0xab, kept, "{purge:?}: last byte {last:#x}");
    }
}
