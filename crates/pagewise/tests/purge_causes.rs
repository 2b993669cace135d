//! `Stats::purged_by`: every purge is counted under its cause, and the
//! causes add up to `purged_bytes`. Each test drives one path and asserts
//! that its counter moved by what that path purged, and the others not.
//!
//! The owned-heap tests run on the fake page source (exact counts, a clock
//! moved by hand); reclaiming another heap's retention happens between the
//! global allocator's thread heaps, so that one runs in a child process.

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;

use pagewise::{Config, FakePages, Heap, PurgedBy, Stats};
use std::alloc::Layout;
use std::hint::black_box;

const MIB: usize = 1 << 20;
const CHILD: &str = "PAGEWISE_TEST_PURGE_CAUSES_CHILD";

fn layout(size: usize) -> Layout {
    Layout::from_size_align(size, 8).unwrap()
}

fn fake() -> &'static FakePages {
    Box::leak(Box::new(FakePages::new()))
}

/// The causes add up to the total, and every cause but `only` is zero.
fn only(s: &Stats, cause: &str, bytes: u64) {
    let p = s.purged_by;
    assert_eq!(p.total(), s.purged_bytes, "{p:?}");
    let fields = [
        ("decay", p.decay),
        ("budget", p.budget),
        ("reclaim", p.reclaim),
        ("trim", p.trim),
        ("limit", p.limit),
        ("hollow", p.hollow),
        ("huge_reuse", p.huge_reuse),
    ];
    for (name, v) in fields {
        let want = if name == cause { bytes } else { 0 };
        assert_eq!(v, want, "{name} in {p:?}");
    }
}

#[test]
fn the_decay_counts_expired_spans_it_purges() {
    let src = fake();
    let heap = Heap::with_source(src, Config::DEFAULT);
    let l = layout(4 * MIB);
    let p = heap.allocate(l).unwrap();
    // SAFETY: allocated above with `l`.
    unsafe { heap.deallocate(p.cast(), l) };
    let retained = heap.stats().retained_bytes;
    assert!(retained >= 4 * MIB as u64);
    // Two decay delays later the peak has left the window: the next slow
    // path purges every expired span.
    src.advance_ms(2 * Config::DEFAULT.decay_ms);
    let q = heap.allocate(layout(64)).unwrap();
    let s = heap.stats();
    assert_eq!(s.retained_bytes, 0, "{s:?}");
    only(&s, "decay", retained);
    // SAFETY: allocated above.
    unsafe { heap.deallocate(q.cast(), layout(64)) };
}

#[test]
fn the_budget_counts_what_passes_the_ceiling() {
    let src = fake();
    let heap = Heap::with_source(
        src,
        Config {
            retain_max_bytes: 2 * MIB,
            decay_ms: 60_000,
            ..Config::DEFAULT
        },
    );
    let l = layout(3 * MIB);
    let ps: Vec<_> = (0..3).map(|_| heap.allocate(l).unwrap()).collect();
    let committed = heap.stats().committed_bytes;
    for p in ps {
        // SAFETY: allocated above with `l`.
        unsafe { heap.deallocate(p.cast(), l) };
    }
    let s = heap.stats();
    assert!(s.retained_bytes <= 2 * MIB as u64, "{s:?}");
    // What was freed and is not retained any more was purged for the budget.
    only(&s, "budget", committed - s.retained_bytes);
    assert!(s.purged_by.budget >= 7 * MIB as u64);
}

#[test]
fn trim_counts_what_it_purges() {
    let heap = Heap::with_source(
        fake(),
        Config {
            decay_ms: 60_000,
            ..Config::DEFAULT
        },
    );
    let l = layout(4 * MIB);
    let p = heap.allocate(l).unwrap();
    // SAFETY: allocated above with `l`.
    unsafe { heap.deallocate(p.cast(), l) };
    let retained = heap.stats().retained_bytes;
    assert!(retained >= 4 * MIB as u64);
    heap.trim();
    only(&heap.stats(), "trim", retained);
}

#[test]
fn the_limit_counts_what_it_purges_before_a_charge() {
    let heap = Heap::with_source(
        fake(),
        Config {
            limit_bytes: 64 * MIB,
            decay_ms: 60_000,
            ..Config::DEFAULT
        },
    );
    let l = layout(12 * MIB);
    let mut live: Vec<_> = (0..5).map(|_| heap.allocate(l).unwrap()).collect();
    for p in live.drain(..3) {
        // SAFETY: allocated above with `l`.
        unsafe { heap.deallocate(p.cast(), l) };
    }
    assert_eq!(heap.stats().retained_bytes, 36 * MIB as u64);
    // 30 MiB fit in no retained span and would pass the limit: the
    // retained 36 MiB go first.
    let big = layout(30 * MIB);
    let b = heap.allocate(big).unwrap();
    only(&heap.stats(), "limit", 36 * MIB as u64);
    // SAFETY: allocated above.
    unsafe { heap.deallocate(b.cast(), big) };
    for p in live {
        // SAFETY: allocated above with `l`.
        unsafe { heap.deallocate(p.cast(), l) };
    }
}

#[test]
fn hollowing_counts_the_free_os_pages_of_pages_in_use() {
    // A small class's slab page is 64 KiB: at a 64 KiB OS page (the suite
    // under `PAGEWISE_OS_PAGE=64K`) it is one OS page, with none to hollow.
    if pagewise::layout::os_page() >= 64 << 10 {
        eprintln!("one OS page per slab page: nothing to hollow");
        return;
    }
    let heap = Heap::with_source(fake(), Config::DEFAULT);
    let l = layout(64);
    let blocks: Vec<_> = (0..1000).map(|_| heap.allocate(l).unwrap()).collect();
    for p in &blocks[1..] {
        // SAFETY: allocated above with `l`, freed once.
        unsafe { heap.deallocate(p.cast(), l) };
    }
    // `trim` hollows the page the first block keeps in use; nothing retained
    // is left to purge (the page is the only span the heap took).
    heap.trim();
    let s = heap.stats();
    assert!(s.hollow_bytes > 0, "{s:?}");
    only(&s, "hollow", s.hollow_bytes);
    // SAFETY: allocated above with `l`.
    unsafe { heap.deallocate(blocks[0].cast(), l) };
}

#[test]
fn a_huge_run_reused_smaller_counts_what_the_object_does_not_cover() {
    let heap = Heap::with_source(
        fake(),
        Config {
            decay_ms: 60_000,
            ..Config::DEFAULT
        },
    );
    let (a, b) = (layout(48 * MIB), layout(40 * MIB));
    let p = heap.allocate(a).unwrap();
    // SAFETY: allocated above with `a`.
    unsafe { heap.deallocate(p.cast(), a) };
    let q = heap.allocate(b).unwrap();
    only(&heap.stats(), "huge_reuse", 8 * MIB as u64);
    // SAFETY: allocated above with `b`.
    unsafe { heap.deallocate(q.cast(), b) };
}

#[test]
fn zero_adds_up_to_zero() {
    assert_eq!(PurgedBy::ZERO.total(), 0);
    assert_eq!(Stats::ZERO.purged_by, PurgedBy::ZERO);
}

// ----- between the global allocator's heaps, in a child --------------------

fn run_child(test: &str, envs: &[(&str, &str)]) -> Vec<u64> {
    let mut cmd = reexec::this_binary();
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .env_remove("PAGEWISE_RETAIN_MAX")
        .env_remove("PAGEWISE_LIMIT")
        .env_remove("PAGEWISE_DECAY_MS");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let r = stdout
        .lines()
        .find_map(|l| l.split_once("causes-report ").map(|(_, r)| r.to_string()))
        .unwrap_or_else(|| panic!("no report:\n{stdout}\n{stderr}"));
    r.split(' ').map(|x| x.trim().parse().unwrap()).collect()
}

fn in_child(test: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(test)
}

/// Writes `bytes` of 4 KiB blocks and frees them.
fn churn(bytes: usize) {
    let v: Vec<Box<[u8]>> = (0..bytes / 4096)
        .map(|i| vec![i as u8 | 1; 4096].into_boxed_slice())
        .collect();
    drop(black_box(v));
}

/// Child: rounds of two worker threads started one after the other (each
/// takes its heap before the next starts), a small one (2 MiB) and a big
/// one (16 MiB), which exit in that order, as a pool whose workers do
/// unequal shares of the work restarts them. Reports what was purged over
/// the rounds after the first four, and the causes.
#[test]
fn child_unequal_workers_restarted() {
    if !in_child("child_unequal_workers_restarted") {
        return;
    }
    black_box(vec![1u8; 64]); // the main thread's heap, made now
    let mut before = pagewise::stats();
    for round in 0..12 {
        // From the fifth round: the first rounds settle which heap comes
        // back to which worker (at a 16 KiB OS page one of them still
        // swaps once, in the third).
        if round == 4 {
            before = pagewise::stats();
        }
        let (small_go, big_go) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        let (small_started, big_started) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|s| {
            let small = s.spawn(|| {
                black_box(vec![1u8; 64]); // its heap
                small_started.wait();
                small_go.wait();
                churn(2 * MIB);
            });
            small_started.wait();
            let big = s.spawn(|| {
                black_box(vec![1u8; 64]);
                big_started.wait();
                big_go.wait();
                churn(16 * MIB);
            });
            big_started.wait();
            small_go.wait();
            small.join().unwrap();
            big_go.wait();
            big.join().unwrap();
        });
    }
    let s = pagewise::stats();
    let p = s.purged_by;
    println!(
        "causes-report {} {} {} {} {} {} {} {}",
        s.purged_bytes - before.purged_bytes,
        p.decay,
        p.budget,
        p.reclaim,
        p.trim,
        p.limit,
        p.hollow,
        p.huge_reuse
    );
}

#[test]
fn a_restarted_worker_takes_back_the_heap_of_the_one_it_replaces() {
    let f = run_child(
        "child_unequal_workers_restarted",
        &[("PAGEWISE_DECAY_MS", "60000"), ("PAGEWISE_BACKGROUND", "0")],
    );
    let (purged, causes) = (f[0], &f[1..]);
    // Eight rounds of 18 MiB written and freed. A worker started second took
    // the heap of the worker that exited last: the small one the big one's
    // 16 MiB pool, the big one the small one's 2 MiB, so that the big one
    // committed 14 MiB fresh every round and as much of the small one's
    // pool was purged for it (112 MiB, faulted back the next round).
    // Started in the order they exited, each takes back the pool it sized.
    assert!(
        purged <= 8 * MIB as u64,
        "{} MiB purged over 8 rounds; by cause since start: {causes:?}",
        purged >> 20
    );
}

/// Child: a thread writes and frees 32 MiB of 4 KiB blocks and exits (its
/// heap retains them: the decay is a minute away, no purger runs); then the
/// main thread writes 32 MiB of its own. Reports the causes.
#[test]
fn child_exited_thread_then_main() {
    if !in_child("child_exited_thread_then_main") {
        return;
    }
    let blocks = || -> Vec<Box<[u8]>> {
        (0..8192)
            .map(|i| vec![i as u8 | 1; 4096].into_boxed_slice())
            .collect()
    };
    black_box(vec![1u8; 64]); // the main thread's heap, made now
    std::thread::spawn(move || drop(black_box(blocks())))
        .join()
        .unwrap();
    let retained = pagewise::stats().retained_bytes;
    let mine = black_box(blocks());
    let s = pagewise::stats();
    let p = s.purged_by;
    println!(
        "causes-report {retained} {} {} {} {} {} {} {} {}",
        s.purged_bytes, p.decay, p.budget, p.reclaim, p.trim, p.limit, p.hollow, p.huge_reuse
    );
    drop(mine);
}

#[test]
fn another_heaps_fresh_memory_counts_what_it_reclaims() {
    let f = run_child(
        "child_exited_thread_then_main",
        &[("PAGEWISE_DECAY_MS", "60000"), ("PAGEWISE_BACKGROUND", "0")],
    );
    let r = format!("{f:?}");
    let (retained, purged, causes) = (f[0], f[1], &f[2..]);
    assert!(retained >= 30 * MIB as u64, "the thread's blocks: {r}");
    assert_eq!(causes.iter().sum::<u64>(), purged, "{r}");
    // The exited thread's heap gave back most of what it held as the main
    // thread committed 32 MiB; no other cause purged anything.
    assert!(causes[2] >= 24 * MIB as u64, "reclaim: {r}");
    assert_eq!(purged, causes[2], "only reclaim: {r}");
}
