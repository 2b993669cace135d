//! Zeroed allocations (`alloc_zeroed`, C `calloc`) never return old bytes,
//! however the memory under them was used and purged before: above all a
//! huge object's run reused at another offset (a larger alignment), whose
//! bytes below the new offset must not pass for purged.

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

use pagewise::{Config, FakePages, Heap, PageSource};
use std::alloc::{alloc, alloc_zeroed, dealloc, Layout};

const MIB: usize = 1 << 20;

/// Index and value of the first non-zero byte, if any.
fn first_nonzero(p: *const u8, len: usize) -> Option<(usize, u8)> {
    // SAFETY: the caller's live allocation of at least `len` bytes.
    let s = unsafe { std::slice::from_raw_parts(p, len) };
    s.iter().position(|&b| b != 0).map(|i| (i, s[i]))
}

/// Fills `len` bytes at `p` with `byte`, in a way the optimiser keeps.
fn fill(p: *mut u8, len: usize, byte: u8) {
    // SAFETY: the caller's live allocation of at least `len` bytes.
    unsafe { std::ptr::write_bytes(std::hint::black_box(p), byte, len) };
    std::hint::black_box(p);
}

/// The reproducer on an owned heap: a huge object dirtied and
/// freed, its run reused at a 2 MiB offset and freed, the decay run, then a
/// zeroed allocation of the first size.
fn reuse_at_another_alignment<S: PageSource>(heap: &Heap<S>, after_free: impl Fn()) {
    let big = Layout::from_size_align(40 * MIB, 16).unwrap();
    let aligned = Layout::from_size_align(30 * MIB, 2 * MIB).unwrap();
    let a = heap.allocate(big).unwrap().cast::<u8>();
    fill(a.as_ptr(), big.size(), 0xAA);
    // SAFETY: blocks of this heap, freed once with their layouts.
    unsafe {
        heap.deallocate(a, big);
        let b = heap.allocate(aligned).unwrap().cast::<u8>();
        heap.deallocate(b, aligned);
    }
    after_free();
    let c = heap.allocate_zeroed(big).unwrap().cast::<u8>();
    assert_eq!(first_nonzero(c.as_ptr(), big.size()), None, "stale bytes");
    // SAFETY: as above.
    unsafe { heap.deallocate(c, big) };
}

#[test]
fn owned_heap_decay_after_reuse_at_another_offset() {
    let heap = Heap::with_source(FakePages::new(), Config::default());
    reuse_at_another_alignment(&heap, || {
        heap.source().advance_ms(10_000);
        // Any slow path runs the decay once the deadline has passed.
        let l = Layout::from_size_align(300 << 10, 8).unwrap();
        let p = heap.allocate(l).unwrap();
        // SAFETY: freed once.
        unsafe { heap.deallocate(p.cast(), l) };
    });
}

#[test]
fn owned_heap_trim_after_reuse_at_another_offset() {
    let heap = Heap::new();
    reuse_at_another_alignment(&heap, || heap.trim());
    let s = heap.stats();
    assert_eq!(s.live_bytes, 0);
}

#[test]
fn global_alloc_zeroed_after_reuse_at_another_offset() {
    let big = Layout::from_size_align(40 * MIB, 16).unwrap();
    let aligned = Layout::from_size_align(30 * MIB, 2 * MIB).unwrap();
    // SAFETY: each block is freed once with its layout.
    unsafe {
        let a = alloc(big);
        fill(a, big.size(), 0xAA);
        dealloc(a, big);
        let b = alloc(aligned);
        dealloc(b, aligned);
        pagewise::trim();
        let c = alloc_zeroed(big);
        assert_eq!(first_nonzero(c, big.size()), None, "stale bytes");
        dealloc(c, big);
    }
}

/// Every dirty byte is counted and purged: the reuse at another offset
/// purges the pages below the new object at once, and the decay gives back
/// the object's 30 MiB later, from where they are (`FakePages` zeroes what
/// it purges).
#[test]
fn a_reused_huge_run_purges_the_pages_below_its_new_offset() {
    let heap = Heap::with_source(FakePages::new(), Config::default());
    let big = Layout::from_size_align(40 * MIB, 16).unwrap();
    let aligned = Layout::from_size_align(30 * MIB, 2 * MIB).unwrap();
    let a = heap.allocate(big).unwrap().cast::<u8>();
    fill(a.as_ptr(), big.size(), 0xAA);
    // SAFETY: blocks of this heap, freed once with their layouts.
    let below = unsafe {
        heap.deallocate(a, big);
        let b = heap.allocate(aligned).unwrap().cast::<u8>();
        heap.deallocate(b, aligned);
        b.as_ptr() as usize - a.as_ptr() as usize
    };
    assert!(below > 0, "the object moved up");
    // Placing the 30 MiB object purged the rest of the run at once, the
    // pages below its new offset included: only the object's pages are
    // retained.
    let s = heap.stats();
    assert_eq!(s.retained_bytes, 30 * MIB as u64);
    assert_eq!(first_nonzero(a.as_ptr(), below), None, "below the offset");
    heap.source().advance_ms(10_000);
    let l = Layout::from_size_align(300 << 10, 8).unwrap();
    let p = heap.allocate(l).unwrap();
    // SAFETY: freed once.
    unsafe { heap.deallocate(p.cast(), l) };
    let s = heap.stats();
    // Only the probe's own span (320 KiB) is left.
    assert!(
        s.retained_bytes < MIB as u64,
        "retained {}",
        s.retained_bytes
    );
    // The freed object's memory is still the heap's (mapped, unused):
    // reading it shows what the purge reached.
    assert_eq!(first_nonzero(a.as_ptr(), big.size()), None, "not purged");
}

/// A cached huge run reused by a smaller object keeps committed only what
/// the object covers: every committed byte has a name
/// (`committed = live + free slots + retained`).
#[test]
fn a_huge_run_reused_by_a_smaller_object_commits_only_the_object() {
    let heap = Heap::with_source(FakePages::new(), Config::default());
    let big = Layout::from_size_align(40 * MIB, 16).unwrap();
    let smaller = Layout::from_size_align(33 * MIB, 16).unwrap();
    let a = heap.allocate(big).unwrap().cast::<u8>();
    fill(a.as_ptr(), big.size(), 0xAA);
    // SAFETY: blocks of this heap, freed once with their layouts.
    unsafe {
        heap.deallocate(a, big);
        let b = heap.allocate(smaller).unwrap().cast::<u8>();
        let s = heap.stats();
        assert_eq!(
            s.committed_bytes,
            s.live_bytes + s.free_slot_bytes + s.retained_bytes,
            "{} committed, {} live, {} free slots, {} retained",
            s.committed_bytes,
            s.live_bytes,
            s.free_slot_bytes,
            s.retained_bytes
        );
        assert_eq!(s.live_bytes, 33 * MIB as u64);
        heap.deallocate(b, smaller);
    }
}

/// The fake page source reads as the kernel's memory does: zeros when
/// mapped (even where the system allocator hands back memory it used
/// before) and zeros after a `DontNeed` purge, with the bytes beside the
/// purged pages kept. Every heap test on the fake relies on it.
#[test]
fn the_fake_source_reads_zeros_when_mapped_and_after_a_purge() {
    let fake = FakePages::new();
    let page = pagewise::layout::os_page();
    let size = pagewise::layout::SEGMENT;
    for round in 0..3 {
        let p = fake.map(size, size).expect("fake map");
        assert_eq!(
            first_nonzero(p.as_ptr(), size),
            None,
            "round {round}: mapped"
        );
        fill(p.as_ptr(), size, 0xA5);
        // SAFETY: three whole OS pages inside the mapping, nothing live in them.
        let purged = unsafe { fake.purge(p.add(page), 3 * page, pagewise::Purge::DontNeed) };
        assert!(purged);
        assert_eq!(
            first_nonzero(unsafe { p.as_ptr().add(page) }, 3 * page),
            None
        );
        // SAFETY: in the mapping.
        let before = unsafe { *p.as_ptr().add(page - 1) };
        let after = unsafe { *p.as_ptr().add(4 * page) };
        assert_eq!(
            (before, after),
            (0xA5, 0xA5),
            "round {round}: neighbours kept"
        );
        // SAFETY: the whole mapping made above.
        unsafe { fake.unmap(p, size) };
    }
}
