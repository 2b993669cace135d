//! Free OS pages inside slab pages that still hold live objects go back
//! (hollowing): exactly the OS pages whose slots are all free, for
//! classes whose slots divide the OS page and for classes whose slots
//! straddle OS pages; the survivors keep their bytes; the slots come back,
//! each once, when the page is used again; the purge waits for the decay
//! delay unless `trim()` asks. On an owned heap over the counting fake page
//! source (which zeroes what it purges, so a purged live byte shows).

use pagewise::{Config, FakePages, Heap, PageSource};
use std::alloc::Layout;
use std::collections::BTreeSet;
use std::ptr::NonNull;

/// The OS page pagewise uses (run time: `PAGEWISE_OS_PAGE` in the suites at 16 and 64 KiB).
fn os_page() -> usize {
    pagewise::layout::os_page()
}

/// OS pages in a one-slice slab page: 16 at 4 KiB, 1 at 64 KiB (where a
/// one-slice slab page holding a live slot has no OS page to give back).
fn os_pages_per_slab() -> usize {
    SLAB_PAGE / os_page()
}
const SLAB_PAGE: usize = 64 << 10;

fn heap(config: Config) -> (Heap<&'static FakePages>, &'static FakePages) {
    let src: &'static FakePages = Box::leak(Box::new(FakePages::new()));
    (Heap::with_source(src, config), src)
}

fn fill(p: NonNull<u8>, size: usize, byte: u8) {
    // SAFETY: a live block of at least `size` bytes.
    unsafe { std::ptr::write_bytes(p.as_ptr(), byte, size) };
}

fn holds(p: NonNull<u8>, size: usize, byte: u8) -> bool {
    // SAFETY: a live block of at least `size` bytes.
    unsafe { std::slice::from_raw_parts(p.as_ptr(), size) }
        .iter()
        .all(|&b| b == byte)
}

/// The OS pages that hollowing must give back, given every slot of the
/// class's one-slice pages (`slots`, all carved) and those kept live: an OS
/// page of a slab page that only carved slots use (wholly inside them, or
/// the last one of a page whose every slot is carved), none of whose
/// overlapping slots is kept.
fn expected_hollow(slot: usize, slots: &[usize], kept: &BTreeSet<usize>) -> usize {
    let pages: BTreeSet<usize> = slots.iter().map(|a| a & !(SLAB_PAGE - 1)).collect();
    let mut n = 0;
    for page in pages {
        if !kept.iter().any(|&a| a & !(SLAB_PAGE - 1) == page) {
            continue; // no live slot: the whole page is released, not hollowed
        }
        let carved = slots
            .iter()
            .filter(|&&a| a & !(SLAB_PAGE - 1) == page)
            .count()
            * slot;
        let os_pages = if carved / slot == SLAB_PAGE / slot {
            carved.div_ceil(os_page())
        } else {
            carved / os_page()
        };
        for k in 0..os_pages {
            let (lo, hi) = (page + k * os_page(), page + (k + 1) * os_page());
            if !kept.iter().any(|&a| a < hi && a + slot > lo) {
                n += 1;
            }
        }
    }
    n
}

/// Fills four slab pages of `slot`-byte slots, keeps the slots chosen by
/// `keep(index)` with their bytes written, frees the others, trims; checks
/// the OS pages given back, the survivors, and then the reuse of every
/// freed slot, each once.
fn hollow_then_reuse(slot: usize, keep: impl Fn(usize) -> bool) {
    let (heap, src) = heap(Config::default());
    let l = Layout::from_size_align(slot, 16).unwrap();
    let per_page = SLAB_PAGE / slot;
    let all: Vec<NonNull<u8>> = (0..4 * per_page)
        .map(|_| heap.allocate(l).unwrap().cast())
        .collect();
    let addrs: Vec<usize> = all.iter().map(|p| p.as_ptr() as usize).collect();
    let kept: BTreeSet<usize> = (0..all.len())
        .filter(|&i| keep(i))
        .map(|i| addrs[i])
        .collect();
    for (i, &p) in all.iter().enumerate() {
        if keep(i) {
            fill(p, slot, (i % 251) as u8 | 1);
        } else {
            // SAFETY: allocated above with `l`, freed once.
            unsafe { heap.deallocate(p, l) };
        }
    }
    let madvise = src.syscalls().madvise;
    heap.trim();
    let s = heap.stats();
    let expected = expected_hollow(slot, &addrs, &kept);
    assert!(
        expected >= 2 || os_pages_per_slab() == 1,
        "the pattern leaves whole OS pages free: {expected}"
    );
    assert_eq!(
        s.hollow_bytes as usize,
        expected * os_page(),
        "slot {slot}: hollow bytes (committed {}, free slot bytes {})",
        s.committed_bytes,
        s.free_slot_bytes
    );
    assert!(expected == 0 || src.syscalls().madvise > madvise);
    assert!(s.purged_bytes >= s.hollow_bytes);
    for (i, &p) in all.iter().enumerate() {
        if keep(i) {
            assert!(
                holds(p, slot, (i % 251) as u8 | 1),
                "survivor {i} of slot {slot}"
            );
        }
    }
    // Every freed slot comes back once, from these pages, before any
    // fresh page is made: the hollow ones carved again.
    let freed: BTreeSet<usize> = addrs
        .iter()
        .copied()
        .filter(|a| !kept.contains(a))
        .collect();
    let again: Vec<NonNull<u8>> = (0..freed.len())
        .map(|_| heap.allocate(l).unwrap().cast())
        .collect();
    let again_set: BTreeSet<usize> = again.iter().map(|p| p.as_ptr() as usize).collect();
    assert_eq!(again_set.len(), again.len(), "an address handed out twice");
    assert_eq!(
        again_set, freed,
        "slot {slot}: the freed slots, and only they"
    );
    for &p in &again {
        fill(p, slot, 0xee);
    }
    for (i, &p) in all.iter().enumerate() {
        if keep(i) {
            assert!(
                holds(p, slot, (i % 251) as u8 | 1),
                "survivor {i} after reuse"
            );
        }
    }
    assert_eq!(heap.stats().hollow_bytes, 0);
    for p in again
        .into_iter()
        .chain(kept.iter().map(|&a| NonNull::new(a as *mut u8).unwrap()))
    {
        // SAFETY: live blocks of this heap, each freed once.
        unsafe { heap.deallocate(p, l) };
    }
    heap.trim();
    let s = heap.stats();
    assert_eq!(
        (s.live_bytes, s.hollow_bytes, s.committed_bytes),
        (0, 0, 0),
        "live, hollow, committed after the last trim"
    );
}

#[test]
fn slots_that_divide_the_os_page() {
    // 64 slots per 4 KiB OS page; one kept every two OS pages: every
    // other OS page goes.
    let every = 2 * os_page() / 64;
    hollow_then_reuse(64, |i| i % every == 0);
}

#[test]
fn slots_that_straddle_os_pages() {
    // 48 B: 85.3 slots per 4 KiB OS page, one every 170 kept (about one
    // every two OS pages).
    let every = 2 * os_page() / 48;
    hollow_then_reuse(48, |i| i % every == 7);
    // 5 KiB: a slot spans parts of two or three OS pages.
    hollow_then_reuse(5120, |i| i % 5 == 0);
}

#[test]
fn nothing_goes_while_every_os_page_holds_a_live_slot() {
    let (heap, _) = heap(Config::default());
    let l = Layout::from_size_align(64, 16).unwrap();
    let all: Vec<NonNull<u8>> = (0..4096)
        .map(|_| heap.allocate(l).unwrap().cast())
        .collect();
    for (i, &p) in all.iter().enumerate() {
        if i % 32 != 0 {
            // SAFETY: allocated above, freed once.
            unsafe { heap.deallocate(p, l) };
        }
    }
    heap.trim();
    assert_eq!(heap.stats().hollow_bytes, 0);
    for &p in all.iter().step_by(32) {
        // SAFETY: the survivors, freed once.
        unsafe { heap.deallocate(p, l) };
    }
}

/// Slow paths of the owner, where its maintenance runs: a cache of 16-byte
/// slots overflows.
fn owner_slow_paths(heap: &Heap<&'static FakePages>) {
    let l = Layout::from_size_align(16, 16).unwrap();
    let v: Vec<NonNull<u8>> = (0..400).map(|_| heap.allocate(l).unwrap().cast()).collect();
    for p in v {
        // SAFETY: allocated above, freed once.
        unsafe { heap.deallocate(p, l) };
    }
}

#[test]
fn without_trim_the_purge_waits_for_the_decay_delay() {
    let (heap, src) = heap(Config {
        decay_ms: 1000,
        ..Config::default()
    });
    let l = Layout::from_size_align(64, 16).unwrap();
    let all: Vec<NonNull<u8>> = (0..4096)
        .map(|_| heap.allocate(l).unwrap().cast())
        .collect();
    // Another class becomes current, so the 64 B pages are out of use.
    for (i, &p) in all.iter().enumerate() {
        if i % 1024 != 0 {
            // SAFETY: allocated above, freed once.
            unsafe { heap.deallocate(p, l) };
        }
    }
    for _ in 0..4 {
        src.advance_ms(300);
        owner_slow_paths(&heap);
    }
    // 1.2 s after the frees, but less than a delay since the maintenance
    // first saw the pages out of use (at 0.3 s, or later).
    let early = heap.stats().hollow_bytes;
    for _ in 0..8 {
        src.advance_ms(300);
        owner_slow_paths(&heap);
    }
    let late = heap.stats().hollow_bytes;
    let per = os_pages_per_slab() as u64;
    if per == 1 {
        assert_eq!(late, 0, "one-page slab pages holding a live slot stay");
    } else {
        let want = 3 * (per - 1) * os_page() as u64;
        assert!(late >= want, "after the delay: {late}");
        assert!(early < late, "before the delay {early}, after {late}");
    }
    for &p in all.iter().step_by(1024) {
        // SAFETY: the survivors, freed once.
        unsafe { heap.deallocate(p, l) };
    }
}

#[test]
fn a_fuller_page_is_used_before_a_hollow_one() {
    let (heap, _) = heap(Config::default());
    let l = Layout::from_size_align(64, 16).unwrap();
    let per_page = SLAB_PAGE / 64;
    let all: Vec<NonNull<u8>> = (0..2 * per_page)
        .map(|_| heap.allocate(l).unwrap().cast())
        .collect();
    let page_of = |p: &NonNull<u8>| p.as_ptr() as usize & !(SLAB_PAGE - 1);
    let (first, second) = (page_of(&all[0]), page_of(&all[per_page]));
    assert_ne!(first, second);
    // The first page keeps one object; the second keeps every other one.
    let mut kept = Vec::new();
    for (i, &p) in all.iter().enumerate() {
        if i == 0 || (i >= per_page && i % 2 == 0) {
            kept.push(p);
        } else {
            // SAFETY: allocated above, freed once.
            unsafe { heap.deallocate(p, l) };
        }
    }
    heap.trim();
    let hollow = heap.stats().hollow_bytes;
    let per = os_pages_per_slab() as u64;
    assert!(
        hollow >= (per - 1) * os_page() as u64,
        "the first page is hollow: {hollow}"
    );
    // As many allocations as the second page has room for: all from it,
    // and nothing of the first page is carved again.
    let again: Vec<NonNull<u8>> = (0..per_page / 2)
        .map(|_| heap.allocate(l).unwrap().cast())
        .collect();
    assert!(
        again.iter().all(|p| page_of(p) == second),
        "a hollow page was used first"
    );
    assert_eq!(heap.stats().hollow_bytes, hollow);
    for p in again.into_iter().chain(kept) {
        // SAFETY: live blocks of this heap, each freed once.
        unsafe { heap.deallocate(p, l) };
    }
}
