//! The retention budget: one bound for every thread heap of the process,
//! retention that follows demand (a churn of big buffers keeps what it
//! reuses, an idle heap gives everything back after the decay delay), and
//! the hard limit on committed memory.
//!
//! The demand tests run an owned heap on the fake page source (exact
//! counts, a clock moved by hand). The process-wide tests run the global
//! allocator in a child process, which reads its `PAGEWISE_*` variables
//! at start; the child reports, the parent asserts.

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;

use pagewise::{Config, FakePages, Heap, PageSource, Purge};
use std::alloc::Layout;
use std::hint::black_box;
use std::ptr::NonNull;

const MIB: usize = 1 << 20;
const CHILD: &str = "PAGEWISE_TEST_BUDGET_CHILD";

fn layout(size: usize) -> Layout {
    Layout::from_size_align(size, 8).unwrap()
}

/// A deterministic xorshift generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The large-buffer churn on an owned fake heap: 20 live buffers of 5-25 MiB,
/// one at random replaced per step, one fake millisecond per step (the
/// real churn replaces about 1,500 buffers a second).
struct Churn {
    heap: Heap<&'static FakePages>,
    src: &'static FakePages,
    live: Vec<(NonNull<u8>, usize)>,
    rng: Rng,
    allocated: u64,
}

impl Churn {
    fn new() -> Churn {
        let src: &'static FakePages = Box::leak(Box::new(FakePages::new()));
        // MADV_FREE: the fake then does not write zeros over what it purges.
        let config = Config {
            purge: Purge::Free,
            ..Config::DEFAULT
        };
        let heap = Heap::with_source(src, config);
        let mut c = Churn {
            heap,
            src,
            live: Vec::new(),
            rng: Rng(0x9e37_79b9_7f4a_7c15),
            allocated: 0,
        };
        for _ in 0..20 {
            let b = c.alloc();
            c.live.push(b);
        }
        c
    }
    fn alloc(&mut self) -> (NonNull<u8>, usize) {
        let size = 5 * MIB + (self.rng.next() % (20 * MIB as u64)) as usize;
        let p = self.heap.allocate(layout(size)).unwrap().cast::<u8>();
        self.allocated += size as u64;
        (p, size)
    }
    fn steps(&mut self, n: usize) {
        for _ in 0..n {
            let i = (self.rng.next() % 20) as usize;
            let (p, size) = self.live[i];
            // SAFETY: allocated by this heap with this layout.
            unsafe { self.heap.deallocate(p, layout(size)) };
            self.live[i] = self.alloc();
            self.src.advance_ms(1);
        }
    }
    fn free_all(&mut self) {
        for (p, size) in self.live.drain(..) {
            // SAFETY: as above.
            unsafe { self.heap.deallocate(p, layout(size)) };
        }
    }
}

#[test]
fn a_churn_of_big_buffers_keeps_what_it_reuses() {
    let mut c = Churn::new();
    c.steps(1000);
    let before = c.src.syscalls();
    let allocated_before = c.allocated;
    let live: usize = c.live.iter().map(|b| b.1).sum();
    c.steps(2000);
    let after = c.src.syscalls();
    let s = c.heap.stats();
    // About 30 GiB allocated in these 2,000 steps. With a fixed cap of
    // 64 MiB, two thirds of it were purged and faulted back in; what
    // fragmentation makes no use of is purged (a few per cent).
    let allocated = c.allocated - allocated_before;
    let purged = after.purged_bytes - before.purged_bytes;
    assert!(
        purged <= allocated / 16,
        "purged {} MiB in a steady churn (madvise {} calls)",
        purged >> 20,
        after.madvise - before.madvise
    );
    assert_eq!(after.mmap, before.mmap, "no new mapping once warm");
    // Yet retention stays within the recent peak of demand plus the slack.
    assert!(
        s.committed_bytes <= (live as u64) * 2,
        "committed {} MiB for {} MiB live",
        s.committed_bytes >> 20,
        live >> 20
    );
}

#[test]
fn an_idle_heap_gives_everything_back_after_the_decay_delay() {
    let mut c = Churn::new();
    c.steps(500);
    c.free_all();
    let s = c.heap.stats();
    assert!(s.retained_bytes >= 100 * MIB as u64, "kept at first: {s:?}");
    // Half the delay: still kept (demand just fell; the peak says it comes back).
    c.src.advance_ms(500);
    let p = c.heap.allocate(layout(MIB)).unwrap().cast::<u8>();
    // SAFETY: allocated just above.
    unsafe { c.heap.deallocate(p, layout(MIB)) };
    assert!(c.heap.stats().retained_bytes >= 100 * MIB as u64);
    // Two delays after the last free: the peak has left the window, every
    // expired span goes at the next slow path (here a large allocation).
    c.src.advance_ms(1500);
    let p = c.heap.allocate(layout(MIB)).unwrap().cast::<u8>();
    let s = c.heap.stats();
    assert_eq!(s.retained_bytes, 0, "{s:?}");
    assert_eq!(s.committed_bytes, MIB as u64, "only the live MiB: {s:?}");
    // SAFETY: as above.
    unsafe { c.heap.deallocate(p, layout(MIB)) };
}

// ----- the global allocator, in a child process ------------------------------------

fn run_child(test: &str, envs: &[(&str, &str)]) -> String {
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
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    stdout
        .lines()
        .find_map(|l| l.split_once("budget-report ").map(|(_, r)| r.to_string()))
        .unwrap_or_else(|| panic!("no report from the child:\n{stdout}\n{stderr}"))
}

fn in_child(test: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(test)
}

/// Child: four threads each free 24 MiB of large objects, and stay alive
/// (a barrier) while the main thread reads the retained bytes of all heaps.
#[test]
fn child_four_heaps() {
    if !in_child("child_four_heaps") {
        return;
    }
    let start = std::sync::Barrier::new(5);
    let done = std::sync::Barrier::new(5);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let v: Vec<Vec<u8>> = (0..2).map(|_| black_box(vec![1u8; 12 * MIB])).collect();
                drop(black_box(v));
                start.wait();
                done.wait();
            });
        }
        start.wait();
        println!("budget-report {}", pagewise::stats().retained_bytes);
        done.wait();
    });
}

#[test]
fn retention_is_bounded_for_the_whole_process_not_per_heap() {
    let r = run_child(
        "child_four_heaps",
        &[
            ("PAGEWISE_RETAIN_MAX", "32M"),
            ("PAGEWISE_DECAY_MS", "60000"),
        ],
    );
    let retained: u64 = r.trim().parse().unwrap();
    // Each heap alone retains 24 MiB, under the ceiling: the process would
    // keep 96 MiB if the ceiling were per heap.
    assert!(
        retained <= 32 * MIB as u64,
        "4 heaps retain {} MiB with PAGEWISE_RETAIN_MAX=32M",
        retained >> 20
    );
    // Not vacuous: they do retain (how much depends on how the heaps'
    // purges interleave: each purges its own oldest while the total is over).
    assert!(retained > 0, "but do retain: {retained}");
}

#[test]
fn over_the_limit_an_allocation_purges_then_fails() {
    let src: &'static FakePages = Box::leak(Box::new(FakePages::new()));
    let heap = Heap::with_source(
        src,
        Config {
            limit_bytes: 64 * MIB,
            decay_ms: 60_000,
            ..Config::DEFAULT
        },
    );
    let l = layout(12 * MIB);
    let mut live: Vec<_> = (0..5).map(|_| heap.allocate(l).unwrap()).collect();
    assert_eq!(heap.stats().committed_bytes, 60 * MIB as u64);
    let before = src.syscalls();
    assert!(heap.allocate(l).is_err(), "72 MiB would pass the limit");
    assert_eq!(src.syscalls().madvise, before.madvise, "nothing to purge");
    // Three freed buffers are retained (decay is a minute away)...
    for p in live.drain(..3) {
        // SAFETY: allocated above with `l`.
        unsafe { heap.deallocate(p.cast(), l) };
    }
    assert_eq!(heap.stats().retained_bytes, 36 * MIB as u64);
    // ...and reused first: 12 MiB more commit nothing, so nothing is
    // purged for them.
    let again = heap.allocate(l).unwrap();
    assert_eq!(src.syscalls().madvise, before.madvise, "reused, not purged");
    assert_eq!(heap.stats().retained_bytes, 24 * MIB as u64);
    // SAFETY: allocated above with `l`.
    unsafe { heap.deallocate(again.cast(), l) };
    // 30 MiB fit in no retained span: they would commit memory past the
    // limit (60 MiB committed, 24 of them live), so the retained 36 MiB
    // are purged first, and then they fit.
    let big = layout(30 * MIB);
    let b = heap.allocate(big).unwrap();
    let after = src.syscalls();
    assert!(after.madvise > before.madvise);
    assert!(after.purged_bytes - before.purged_bytes >= 36 * MIB as u64);
    let s = heap.stats();
    assert_eq!(s.retained_bytes, 0);
    assert_eq!(s.committed_bytes, 54 * MIB as u64);
    assert!(heap.allocate(l).is_err(), "66 MiB");
    assert!(heap.stats().limit_peak_bytes <= 64 * MIB as u64);
    // SAFETY: allocated above with `big`.
    unsafe { heap.deallocate(b.cast(), big) };
    for p in live {
        // SAFETY: as above.
        unsafe { heap.deallocate(p.cast(), l) };
    }
}

/// Child: under `PAGEWISE_LIMIT=64M`, the global allocator refuses what
/// would pass it, and purges retained memory of another thread's heap to
/// serve what would not.
#[test]
fn child_limit() {
    if !in_child("child_limit") {
        return;
    }
    // Another thread frees 40 MiB: retained in its heap (long decay).
    std::thread::spawn(|| drop(black_box(vec![1u8; 40 * MIB])))
        .join()
        .unwrap();
    let retained = pagewise::stats().retained_bytes;
    let mut v: Vec<u8> = Vec::new();
    let refused = v.try_reserve_exact(100 * MIB).is_err();
    let mut w: Vec<u8> = Vec::new();
    let served = w.try_reserve_exact(40 * MIB).is_ok();
    let s = pagewise::stats();
    println!(
        "budget-report {} {} {} {} {}",
        retained, refused as u8, served as u8, s.retained_bytes, s.committed_bytes
    );
}

#[test]
fn the_global_allocator_fails_over_the_limit_after_purging_every_heap() {
    let r = run_child(
        "child_limit",
        &[("PAGEWISE_LIMIT", "64M"), ("PAGEWISE_DECAY_MS", "60000")],
    );
    let f: Vec<u64> = r.split(' ').map(|x| x.parse().unwrap()).collect();
    assert!(f[0] >= 40 * MIB as u64, "the thread's 40 MiB retained: {r}");
    assert_eq!(f[1], 1, "100 MiB refused: {r}");
    assert_eq!(f[2], 1, "40 MiB served after purging the other heap: {r}");
    assert!(f[3] < 40 * MIB as u64, "{r}");
    assert!(f[4] <= 64 * MIB as u64, "committed within the limit: {r}");
}

/// Child: a thread writes and frees 32 MiB of 4 KiB blocks and exits (its
/// heap abandoned, retaining what it freed: the decay is a minute away and
/// no purger runs); then the main thread, with a heap of its own, writes
/// 32 MiB of 4 KiB blocks. Reports the resident bytes before and after,
/// and the retained bytes.
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
    let before = resident();
    std::thread::spawn(move || drop(black_box(blocks())))
        .join()
        .unwrap();
    let mine = black_box(blocks());
    let after = resident();
    println!(
        "budget-report {before} {after} {}",
        pagewise::stats().retained_bytes
    );
    drop(mine);
}

fn resident() -> usize {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = s.split(' ').nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf reads a constant.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize
}

#[test]
fn an_exited_threads_retention_makes_room_for_a_live_thread() {
    let r = run_child(
        "child_exited_thread_then_main",
        &[("PAGEWISE_DECAY_MS", "60000"), ("PAGEWISE_BACKGROUND", "0")],
    );
    let f: Vec<usize> = r.split(' ').map(|x| x.trim().parse().unwrap()).collect();
    let (before, after, retained) = (f[0], f[1], f[2]);
    // The exited thread's 32 MiB cannot serve the main thread (a heap takes
    // spans from its own pool): kept, it would double the resident set.
    // As the main thread commits fresh memory, as much of it goes back.
    assert!(
        after <= before + 40 * MIB,
        "{} MiB resident after 32 MiB live, {} MiB retained",
        (after - before) >> 20,
        retained >> 20
    );
    // Not vacuous: the process does hold the main thread's 32 MiB.
    assert!(after >= before + 32 * MIB, "{} MiB", (after - before) >> 20);
}

/// Child: as `child_exited_thread_then_main`, but the thread that writes
/// and frees 32 MiB of 4 KiB blocks stays alive, blocked, while the main
/// thread writes its 32 MiB (a heap adopted by a thread that needs less
/// than its last one, or a thread that freed much and went on to other
/// work).
#[test]
fn child_live_thread_then_main() {
    if !in_child("child_live_thread_then_main") {
        return;
    }
    let blocks = || -> Vec<Box<[u8]>> {
        (0..8192)
            .map(|i| vec![i as u8 | 1; 4096].into_boxed_slice())
            .collect()
    };
    black_box(vec![1u8; 64]); // the main thread's heap, made now
    let before = resident();
    let (freed_tx, freed_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        drop(black_box(blocks()));
        freed_tx.send(()).unwrap();
        done_rx.recv().unwrap();
    });
    freed_rx.recv().unwrap();
    let mine = black_box(blocks());
    let after = resident();
    println!(
        "budget-report {before} {after} {}",
        pagewise::stats().retained_bytes
    );
    done_tx.send(()).unwrap();
    t.join().unwrap();
    drop(mine);
}

#[test]
fn a_live_threads_retention_makes_room_for_another_thread() {
    let r = run_child(
        "child_live_thread_then_main",
        &[("PAGEWISE_DECAY_MS", "60000"), ("PAGEWISE_BACKGROUND", "0")],
    );
    let f: Vec<usize> = r.split(' ').map(|x| x.trim().parse().unwrap()).collect();
    let (before, after, retained) = (f[0], f[1], f[2]);
    // The other thread's 32 MiB cannot serve the main thread, and it is
    // not needed by the process's demand, which never fell: kept, it
    // would double the resident set.
    assert!(
        after <= before + 40 * MIB,
        "{} MiB resident after 32 MiB live, {} MiB retained",
        (after - before) >> 20,
        retained >> 20
    );
    // Not vacuous: the process does hold the main thread's 32 MiB.
    assert!(after >= before + 32 * MIB, "{} MiB", (after - before) >> 20);
}

/// Child: a thread writes and frees 24 large objects of 1 MiB and stays
/// alive, blocked (its heap retains them: the decay is a minute away and no
/// purger runs); then the main thread, with a heap of its own, writes 24
/// large objects of 1 MiB. Reports the committed bytes before and after the
/// main thread's objects, the bytes purged meanwhile (for another heap,
/// and in all), and whether one of the main thread's objects resized in
/// place.
#[test]
fn child_large_objects_of_a_live_thread_then_main() {
    if !in_child("child_large_objects_of_a_live_thread_then_main") {
        return;
    }
    let objects = || -> Vec<Box<[u8]>> {
        (0..24)
            .map(|i| vec![i as u8 | 1; MIB].into_boxed_slice())
            .collect()
    };
    black_box(vec![1u8; 64]); // the main thread's heap, made now
                              // Barriers, which allocate nothing once made: the other thread takes no
                              // slab page from its pool after its frees (a channel's first send
                              // would, off the front of the freed span).
    let freed = std::sync::Arc::new(std::sync::Barrier::new(2));
    let done = std::sync::Arc::new(std::sync::Barrier::new(2));
    let (f2, d2) = (freed.clone(), done.clone());
    let t = std::thread::spawn(move || {
        drop(black_box(objects()));
        f2.wait();
        d2.wait();
    });
    freed.wait();
    let mut mine = Vec::with_capacity(24);
    let before = pagewise::stats();
    mine.extend(objects());
    let after = pagewise::stats();
    // An object on the other heap's memory still resizes in place (its
    // span lock is taken): shrunk by a slice, then grown back over it.
    let p = mine[0].as_mut_ptr();
    // SAFETY: a live block, back at its size before the box frees it.
    let resized = unsafe {
        pagewise::raw::resize_in_place(p, MIB - (64 << 10))
            && pagewise::raw::resize_in_place(p, MIB)
    };
    println!(
        "budget-report {} {} {} {} {}",
        before.committed_bytes,
        after.committed_bytes,
        after.purged_by.reclaim - before.purged_by.reclaim,
        after.purged_bytes - before.purged_bytes,
        resized as usize,
    );
    done.wait();
    t.join().unwrap();
    drop(black_box(mine));
}

#[test]
fn a_large_object_takes_resident_memory_another_heap_retains() {
    let r = run_child(
        "child_large_objects_of_a_live_thread_then_main",
        &[("PAGEWISE_DECAY_MS", "60000"), ("PAGEWISE_BACKGROUND", "0")],
    );
    let f: Vec<usize> = r.split(' ').map(|x| x.trim().parse().unwrap()).collect();
    let (before, after, reclaimed, purged, resized) = (f[0], f[1], f[2], f[3], f[4]);
    // The other thread's 24 MiB stay retained while the demand they were
    // freed from is recent. Once the main thread's own objects bring
    // committed memory past that demand (the other heap's retention is
    // then more than any recent demand accounts for), the rest of its
    // objects take that retention: a few MiB committed afresh (the demand
    // history and the published retention move by grains), where before
    // the main heap committed all 24 MiB while the other's waited for its
    // decay. Nothing is purged either way.
    assert_eq!(
        purged,
        0,
        "{} MiB purged, {} MiB of it for another heap",
        purged >> 20,
        reclaimed >> 20
    );
    assert!(
        after <= before + 6 * MIB,
        "committed {before} bytes before the main thread's 24 MiB, {after} after"
    );
    assert_eq!(
        resized, 1,
        "a block on another heap's memory did not resize in place"
    );
}
