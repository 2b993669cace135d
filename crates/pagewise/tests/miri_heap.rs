//! The heap logic above the OS layer, on the fake page source: small enough
//! to run under Miri (`cargo +nightly miri test -p pagewise --test miri_heap`),
//! which checks every pointer access, alignment and aliasing rule on the way.
//! Kept to a few dozen operations: each one retags a segment header of
//! ~100 KiB, which costs Miri about a second.

use pagewise::{Config, FakePages, Heap, PageSource};
use std::alloc::Layout;

fn small_config() -> Config {
    // One segment per reservation keeps the fake mappings small for Miri.
    Config {
        reservation_bytes: pagewise::layout::SEGMENT,
        decay_ms: 10,
        ..Config::DEFAULT
    }
}

#[test]
fn slab_large_and_huge_paths_round_trip() {
    // A static, not a leaked box: Miri reports leaks not reachable from statics.
    static SRC: FakePages = FakePages::new();
    let src: &'static FakePages = &SRC;
    let heap = Heap::with_source(src, small_config());
    let sizes = [1usize, 8, 24, 100, 1000, 5000, 70_000, 300_000, 2 << 20];
    let mut live = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let layout = Layout::from_size_align(size, 8 << (i % 4)).unwrap();
        let p = heap.allocate(layout).unwrap().cast::<u8>();
        assert_eq!(p.as_ptr() as usize % layout.align(), 0);
        // SAFETY: fresh block of `size` bytes.
        unsafe {
            p.as_ptr().write(i as u8);
            p.as_ptr().add(size - 1).write(i as u8);
        }
        live.push((p, layout));
    }
    // Grow the 100-byte block across classes, then into a large span.
    let (p, l) = live[3];
    // SAFETY: live block with layout `l`.
    let q = unsafe { heap.reallocate(p, l, 200_000) }
        .unwrap()
        .cast::<u8>();
    // SAFETY: the first byte was preserved.
    assert_eq!(unsafe { q.as_ptr().read() }, 3);
    live[3] = (q, Layout::from_size_align(200_000, l.align()).unwrap());
    for (i, (p, l)) in live.into_iter().enumerate() {
        // SAFETY: live blocks with their layouts.
        unsafe {
            assert_eq!(p.as_ptr().read(), i as u8);
            heap.deallocate(p, l);
        }
    }
    src.advance_ms(20);
    heap.trim();
    let s = heap.stats();
    assert_eq!(s.live_bytes, 0);
    assert_eq!(s.committed_bytes, 0);
    drop(heap);
    assert_eq!(src.syscalls().mapped_bytes, 0);
}

#[test]
fn slots_are_reused_lifo_and_pages_drain() {
    // A static, not a leaked box: Miri reports leaks not reachable from statics.
    static SRC: FakePages = FakePages::new();
    let src: &'static FakePages = &SRC;
    let heap = Heap::with_source(src, small_config());
    let l = Layout::from_size_align(48, 8).unwrap();
    let ptrs: Vec<_> = (0..12)
        .map(|_| heap.allocate(l).unwrap().cast::<u8>())
        .collect();
    for p in ptrs.iter().rev() {
        // SAFETY: live blocks with layout `l`.
        unsafe { heap.deallocate(*p, l) };
    }
    let again = heap.allocate(l).unwrap().cast::<u8>();
    assert_eq!(again, ptrs[0], "the last freed slot comes back first");
    // SAFETY: live.
    unsafe { heap.deallocate(again, l) };
    let class = pagewise::size_class::class_of(48);
    let s = heap.stats();
    assert_eq!(s.live_allocations, 0);
    assert_eq!(s.classes[class].cached_slots, 12, "all in the thread cache");
    // Trim sends the cached slots home; the page drains and is released.
    heap.trim();
    let c = &heap.stats().classes[class];
    assert_eq!((c.cached_slots, c.pages), (0, 0));
}

#[test]
fn a_hollowed_page_keeps_its_survivor_and_refills() {
    // Hollowing (memory/hollow.rs, heap/hollow.rs): a slab page keeps one
    // live slot and its other slots are freed; trim gives back the OS pages
    // they alone cover; allocating again carves them anew. One OS page per
    // slot keeps the operations few.
    static SRC: FakePages = FakePages::new();
    let src: &'static FakePages = &SRC;
    let heap = Heap::with_source(src, small_config());
    let page = pagewise::layout::os_page();
    let l = Layout::from_size_align(page, 16).unwrap();
    // Eight slots, or as many as one slab page holds (at a 16 or 64 KiB
    // OS page, four: more would start a second page, which empties and is
    // released rather than hollowed).
    let class = pagewise::size_class::class_of(page);
    let per_page = pagewise::size_class::PAGE_SLICES[class] as usize * pagewise::layout::SLICE
        / pagewise::size_class::SLOT_SIZE[class] as usize;
    let n = per_page.min(8);
    let slots: Vec<_> = (0..n)
        .map(|_| heap.allocate(l).unwrap().cast::<u8>())
        .collect();
    // SAFETY: a live block of `page` bytes.
    unsafe { slots[0].as_ptr().write_bytes(0xa5, page) };
    for p in &slots[1..] {
        // SAFETY: live blocks with layout `l`, freed once.
        unsafe { heap.deallocate(*p, l) };
    }
    heap.trim();
    let s = heap.stats();
    assert_eq!(s.hollow_bytes as usize, (n - 1) * page, "{s:?}");
    // Before its free list was checked and purged, the page stopped taking
    // frees into thread caches, and every thread passed a barrier: once.
    assert_eq!(src.syscalls().barriers, 1);
    // SAFETY: the survivor is live; the fake source zeroes what it purges.
    let survivor = unsafe { std::slice::from_raw_parts(slots[0].as_ptr(), page) };
    assert!(survivor.iter().all(|&b| b == 0xa5), "the survivor's bytes");
    let mut again: Vec<_> = (0..n - 1)
        .map(|_| heap.allocate(l).unwrap().cast::<u8>())
        .collect();
    for p in &again {
        // SAFETY: fresh blocks of `page` bytes (a purged page reads zero).
        unsafe {
            assert_eq!(p.as_ptr().add(page - 1).read(), 0);
            p.as_ptr().write_bytes(0x3c, page);
        }
    }
    let mut want: Vec<_> = slots[1..].to_vec();
    want.sort();
    again.sort();
    assert_eq!(again, want, "the freed slots come back, each once");
    assert_eq!(heap.stats().hollow_bytes, 0);
    for p in again.into_iter().chain([slots[0]]) {
        // SAFETY: live blocks with layout `l`, freed once.
        unsafe { heap.deallocate(p, l) };
    }
    heap.trim();
    let s = heap.stats();
    assert_eq!((s.live_bytes, s.committed_bytes), (0, 0));
    // An empty page is released, not hollowed: no barrier.
    assert_eq!(src.syscalls().barriers, 1);
}

#[test]
fn huge_regions_are_committed_whole_and_given_back() {
    // `Thp::Always`: a region is advised however small the heap, so two
    // pages of the largest class (16 slices each) reach region 1; then a
    // large object with a whole region inside it.
    static SRC: FakePages = FakePages::with_thp(pagewise::thp::ThpMode::Madvise);
    let src: &'static FakePages = &SRC;
    let heap = Heap::with_source(
        src,
        Config {
            thp: pagewise::Thp::Always,
            ..small_config()
        },
    );
    let class = Layout::from_size_align(256 << 10, 8).unwrap();
    let large = Layout::from_size_align(5 << 20, 8).unwrap();
    let a = heap.allocate(class).unwrap().cast::<u8>();
    let b = heap.allocate(class).unwrap().cast::<u8>();
    let c = heap.allocate(large).unwrap().cast::<u8>();
    let s = heap.stats();
    assert!(s.thp_bytes >= 2 << 21, "{:?}", s.thp_bytes);
    assert_eq!(
        s.committed_bytes,
        s.live_bytes + s.free_slot_bytes + s.retained_bytes
    );
    // SAFETY: live blocks with their layouts.
    unsafe {
        b.as_ptr().write(2);
        heap.deallocate(a, class);
        heap.deallocate(b, class);
        heap.deallocate(c, large);
    }
    heap.trim();
    let s = heap.stats();
    assert_eq!((s.thp_bytes, s.committed_bytes), (0, 0));
    assert_eq!(src.syscalls().hugepage, src.syscalls().nohugepage);
    drop(heap);
    assert_eq!(src.syscalls().mapped_bytes, 0);
}
