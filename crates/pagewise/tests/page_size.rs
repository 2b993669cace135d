//! The OS page is a run-time value. On a kernel with 16 or 64 KiB
//! pages, `madvise` on a 4 KiB boundary fails with `EINVAL` and RSS never
//! drops. This machine's kernel has 4 KiB pages and accepts `madvise` on
//! any multiple of them, so the tests run pagewise with the
//! `PAGEWISE_OS_PAGE` override, which it then treats as the OS page, and
//! check what a larger-page kernel would: every purge starts on a page
//! boundary and covers whole pages, carving and committing go a page at a
//! time, huge objects round to the page, and memory still goes back.
//!
//! `the_override_is_honoured_at_16k_and_64k` re-executes this binary with
//! the override; the `at_the_page_in_force_*` tests run in the children
//! (and, doing nothing else, in a plain run: CI also runs the whole suite
//! with `PAGEWISE_OS_PAGE=16K` and `64K`, where they check that page).

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;

use pagewise::{Config, FakePages, Heap, PageSource, Purge, SyscallCounts};
use std::alloc::Layout;
use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

const CHILD: &str = "PAGEWISE_TEST_PAGE_SIZE_CHILD";

/// The page the tests expect pagewise to use: `PAGEWISE_OS_PAGE` (as
/// `16K`, `64K` or bytes) when set and larger than the system's, else the
/// system's page.
fn expected_page() -> usize {
    // SAFETY: sysconf reads a constant.
    let real = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    if std::env::var_os("PAGEWISE_TEST_PAGE_SIZE_EXPECT_SYSTEM").is_some() {
        return real; // a bad override: refused
    }
    let Ok(v) = std::env::var("PAGEWISE_OS_PAGE") else {
        return real;
    };
    let v = v.trim();
    let n: usize = match v.strip_suffix(['K', 'k']) {
        Some(k) => k.parse::<usize>().unwrap() << 10,
        None => v.parse().unwrap(),
    };
    n.max(real)
}

/// A fake page source that remembers the alignment of every purge (the OR
/// of every start and length: its trailing zeros are the coarsest page
/// all of them fit). It takes no lock and never allocates.
struct Recording {
    fake: FakePages,
    purges: AtomicU64,
    purged: AtomicU64,
    bits: AtomicUsize,
}

static PAGES: Recording = Recording {
    fake: FakePages::new(),
    purges: AtomicU64::new(0),
    purged: AtomicU64::new(0),
    bits: AtomicUsize::new(0),
};

// SAFETY: forwards to `FakePages`, which upholds the contract.
unsafe impl PageSource for Recording {
    fn map(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        self.fake.map(size, align)
    }
    unsafe fn unmap(&self, ptr: NonNull<u8>, size: usize) {
        // SAFETY: forwarded.
        unsafe { self.fake.unmap(ptr, size) }
    }
    unsafe fn purge(&self, ptr: NonNull<u8>, size: usize, how: Purge) -> bool {
        self.purges.fetch_add(1, Relaxed);
        self.purged.fetch_add(size as u64, Relaxed);
        self.bits.fetch_or(ptr.as_ptr() as usize | size, Relaxed);
        // SAFETY: forwarded.
        unsafe { self.fake.purge(ptr, size, how) }
    }
    fn now_ms(&self) -> u64 {
        self.fake.now_ms()
    }
    fn syscalls(&self) -> SyscallCounts {
        self.fake.syscalls()
    }
}

fn layout(size: usize, align: usize) -> Layout {
    Layout::from_size_align(size, align).unwrap()
}

/// An owned heap on the recording source: slab pages carve and commit a
/// page at a time, huge objects round to the page, and every purge (decay,
/// reuse of a huge run at another size, trim) is aligned to the page.
#[test]
fn at_the_page_in_force_an_owned_heap_carves_commits_and_purges_by_page() {
    let page = expected_page();
    let heap = Heap::with_source(&PAGES, Config::default());

    // Carving: one 48-byte slot commits one page; the page's worth of
    // slots commits no more; the next slot commits a second page.
    let base = heap.stats();
    let l48 = layout(48, 8);
    let mut small = vec![heap.allocate(l48).unwrap()];
    let s = heap.stats();
    assert_eq!(
        s.committed_bytes - base.committed_bytes,
        page as u64,
        "one slot commits one OS page of {page} bytes"
    );
    assert_eq!(
        (s.metadata_bytes - base.metadata_bytes) % page as u64,
        0,
        "the segment header is counted in whole OS pages"
    );
    while small.len() < page / 48 {
        small.push(heap.allocate(l48).unwrap());
    }
    let s2 = heap.stats();
    assert_eq!(
        s2.committed_bytes, s.committed_bytes,
        "{page}/48 slots fit one page"
    );
    small.push(heap.allocate(l48).unwrap());
    assert_eq!(
        heap.stats().committed_bytes,
        s.committed_bytes + page as u64,
        "the next slot carves the next page"
    );

    // A mix: small classes, large objects, huge ones, alignments up to 2 MiB.
    let mut live = Vec::new();
    for (size, align, n) in [
        (8, 8, 500),
        (100, 16, 300),
        (3000, 8, 100),
        (20_000, 8, 40),
        (70_000, 8, 10),
        (300_000, 4096, 6),
        (5 << 20, 1 << 16, 2),
        (1 << 20, 1 << 21, 2),
        ((40 << 20) + 1, 8, 1),
        ((35 << 20) + 12_345, 1 << 16, 1),
    ] {
        for _ in 0..n {
            let l = layout(size, align);
            let p = heap.allocate(l).unwrap().cast::<u8>();
            assert_eq!(p.as_ptr() as usize % align, 0);
            // SAFETY: `size` bytes were just allocated.
            unsafe { p.as_ptr().write_bytes(0xA5, size) };
            live.push((p, l));
        }
    }
    let s = heap.stats();
    assert_eq!(s.huge.count, 2);
    let round = |x: usize| x.div_ceil(page) * page;
    assert_eq!(
        s.huge.bytes as usize,
        round((40 << 20) + 1) + round((35 << 20) + 12_345),
        "huge objects are rounded to the OS page"
    );
    assert_eq!(s.committed_bytes % page as u64, 0);
    // Free every other object; let the decay purge; free the rest; reuse a
    // cached huge run for a smaller object (which purges what it leaves).
    for (i, (p, l)) in live.iter().enumerate() {
        if i % 2 == 0 {
            // SAFETY: allocated above with `l`, freed once.
            unsafe { heap.deallocate(*p, *l) };
        }
    }
    PAGES.fake.advance_ms(5_000);
    let poke = heap.allocate(layout(1 << 20, 8)).unwrap().cast::<u8>();
    // SAFETY: allocated just above.
    unsafe { heap.deallocate(poke, layout(1 << 20, 8)) };
    for (i, (p, l)) in live.iter().enumerate() {
        if i % 2 == 1 {
            // SAFETY: as above.
            unsafe { heap.deallocate(*p, *l) };
        }
    }
    let h = heap
        .allocate(layout((33 << 20) + 777, 8))
        .unwrap()
        .cast::<u8>();
    // SAFETY: allocated just above.
    unsafe { heap.deallocate(h, layout((33 << 20) + 777, 8)) };
    for p in small {
        // SAFETY: allocated above with `l48`.
        unsafe { heap.deallocate(p.cast(), l48) };
    }
    PAGES.fake.advance_ms(5_000);
    heap.trim();
    let s = heap.stats();
    assert_eq!((s.live_bytes, s.retained_bytes), (0, 0), "{s:?}");
    assert_eq!(s.committed_bytes % page as u64, 0);

    let purges = PAGES.purges.load(Relaxed);
    let bits = PAGES.bits.load(Relaxed);
    assert!(purges > 10, "the test purged: {purges}");
    assert!(
        bits.trailing_zeros() >= page.trailing_zeros(),
        "a purge not aligned to the {page}-byte OS page: starts and lengths OR to {bits:#x}"
    );
    assert_eq!(
        PAGES.fake.syscalls().purged_bytes,
        PAGES.purged.load(Relaxed),
        "the source refused no purge"
    );
    drop(heap);
}

/// The global allocator: page-aligned requests, the page `good_size`
/// rounds huge sizes to, and freed memory leaving RSS after `trim()` (the
/// system page source refuses a purge not aligned to the page in force, as
/// a kernel with that page does, so a 4 KiB purge would keep it resident).
#[test]
fn at_the_page_in_force_the_global_allocator_gives_memory_back() {
    if std::env::var(CHILD).is_err() {
        return; // counts of the whole process: alone in a child only
    }
    let page = expected_page();
    let l = layout(10, page);
    // SAFETY: a non-zero size.
    let p = unsafe { std::alloc::alloc(l) };
    assert!(!p.is_null() && p as usize % page == 0);
    // SAFETY: allocated above with `l`.
    unsafe { std::alloc::dealloc(p, l) };
    let huge = (40 << 20) + 1;
    assert_eq!(
        pagewise::raw::good_size(huge, 16),
        huge.div_ceil(page) * page
    );

    let before = rss();
    let purged_before = pagewise::stats().purged_bytes;
    let blocks: Vec<Vec<u8>> = (0..256)
        .map(|i| black_box(vec![i as u8; (256 << 10) - 8 * i]))
        .collect();
    let small: Vec<Box<[u64; 5]>> = (0..200_000).map(|i| Box::new([i; 5])).collect();
    let full = rss();
    drop(black_box(blocks));
    drop(black_box(small));
    pagewise::trim();
    let after = rss();
    let s = pagewise::stats();
    let report =
        format!("page {page}: resident {before} before, {full} full, {after} after trim; {s:?}");
    assert!(s.retained_bytes < 1 << 20, "{report}");
    assert!(s.purged_bytes - purged_before >= 64 << 20, "{report}");
    if !reexec::emulated() {
        assert!(full >= before + (64 << 20), "control: {report}");
        assert!(after <= before + (8 << 20), "{report}");
    }
    println!("page-size-report {page} ok");
}

/// Resident bytes of this process.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf reads a constant.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

#[test]
fn the_override_is_honoured_at_16k_and_64k() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    for setting in ["16K", "64K"] {
        let out = reexec::this_binary()
            .args(["at_the_page_in_force", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("PAGEWISE_OS_PAGE", setting)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let what = format!("PAGEWISE_OS_PAGE={setting}:\n{stdout}\n{stderr}");
        assert!(out.status.success(), "{what}");
        assert!(stdout.contains("2 passed"), "both tests ran: {what}");
        assert!(stdout.contains("page-size-report"), "{what}");
        assert!(!stderr.contains("PAGEWISE_OS_PAGE"), "not refused: {what}");
    }
}

/// A malformed or impossible override is refused with one line, and the
/// system's page is used.
#[test]
fn a_bad_override_is_refused_in_one_line() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    for setting in ["12K", "128K", "2K", "x"] {
        let out = reexec::this_binary()
            .args(["at_the_page_in_force_an_owned_heap", "--test-threads=1"])
            .env(CHILD, "1")
            .env("PAGEWISE_OS_PAGE", setting)
            .env("PAGEWISE_TEST_PAGE_SIZE_EXPECT_SYSTEM", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let what = format!("PAGEWISE_OS_PAGE={setting}:\n{stdout}\n{stderr}");
        assert!(out.status.success(), "{what}");
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("PAGEWISE_OS_PAGE"))
            .collect();
        assert_eq!(lines.len(), 1, "one line: {what}");
        assert!(
            lines[0].starts_with(&format!(
                "pagewise: ignoring malformed PAGEWISE_OS_PAGE={setting} "
            )),
            "{what}"
        );
    }
}
