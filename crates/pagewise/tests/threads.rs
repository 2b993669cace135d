//! The global allocator under many threads: cross-thread frees, threads that
//! exit while their objects live on elsewhere, heaps reused by new threads.
//! Each test runs alone in a child process (`solo`), so the counters it
//! checks see no other test's threads.

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;
mod solo;

use pagewise::Stats;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// Generous: the tests need seconds; this only turns a hang into a failure.
const LIMIT: Duration = Duration::from_secs(300);
const MIB: u64 = 1 << 20;

/// Offsets probed in a buffer: the ends and one byte per 4 KiB page.
fn probes(n: usize) -> impl Iterator<Item = usize> {
    (0..n).step_by(4096).chain(n.checked_sub(1))
}

fn stamp(v: &mut [u8], tag: u8) {
    for i in probes(v.len()) {
        v[i] = tag ^ i as u8;
    }
}

fn verify(v: &[u8], tag: u8) {
    for i in probes(v.len()) {
        assert_eq!(v[i], tag ^ i as u8);
    }
}

/// Usable bytes of a live allocation of the global allocator.
fn usable<T>(p: *const T) -> u64 {
    // SAFETY: callers pass the pointer of a live, non-empty Vec or Box.
    unsafe { pagewise::usable_size(p.cast()) as u64 }
}

/// Everything freed and trimmed: nothing live beyond the baseline, nothing
/// retained, and what stays committed is what holds live objects (the
/// baseline's, in pages the test's threads may have shared) plus at most
/// `slack` bytes of partly used pages.
fn assert_given_back(base: &Stats, after: &Stats, slack: u64) {
    assert_eq!(after.live_bytes, base.live_bytes, "{after:?}");
    assert_eq!(after.live_allocations, base.live_allocations, "{after:?}");
    assert_eq!(after.retained_bytes, 0, "trim purged everything: {after:?}");
    assert_eq!(
        (after.large.count, after.huge.count),
        (base.large.count, base.huge.count)
    );
    assert!(
        after.committed_bytes <= base.committed_bytes.max(after.live_bytes) + slack,
        "committed {} after trim, baseline {} (live {}): {after:?}",
        after.committed_bytes,
        base.committed_bytes,
        after.live_bytes
    );
}

/// Reservations (1 GiB each) mapped between `base` and `now`, at most.
fn new_reservations(base: &Stats, now: &Stats) -> u64 {
    (now.syscalls.peak_mapped_bytes - base.syscalls.mapped_bytes).div_ceil(1 << 30)
}

#[test]
fn cross_thread_frees_in_a_ring() {
    solo::alone("cross_thread_frees_in_a_ring", LIMIT, ring);
}

fn ring() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 10_000;
    let base = pagewise::stats();
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| mpsc::channel::<(Vec<u8>, u8)>())
        .unzip();
    let mut handles = Vec::new();
    for (i, rx) in rxs.into_iter().enumerate() {
        let tx = txs[(i + 1) % THREADS].clone();
        handles.push(thread::spawn(move || {
            for r in 0..ROUNDS {
                let size =
                    [8, 24, 100, 700, 3000, 20_000, 100_000, 300_000, 2 << 20][(r * 7 + i) % 9];
                let tag = (r + i) as u8;
                let mut v = vec![0u8; size];
                stamp(&mut v, tag);
                // Ownership moves to the next thread, which frees it.
                tx.send((v, tag)).unwrap();
                while let Ok((v, tag)) = rx.try_recv() {
                    verify(&v, tag);
                }
            }
            drop(tx);
            // Drain what is left once every sender is gone.
            for (v, tag) in rx.iter() {
                verify(&v, tag);
            }
        }));
    }
    drop(txs);
    for h in handles {
        h.join().unwrap();
    }
    let s = pagewise::stats();
    // Every object was freed, most by another thread than its allocator's:
    // once the threads are gone (their heaps abandoned, their pending
    // remote frees collected), nothing of theirs is live.
    assert_eq!(s.live_bytes, base.live_bytes, "{s:?}");
    assert_eq!(s.live_allocations, base.live_allocations, "{s:?}");
    let allocs = |s: &Stats| s.classes.iter().map(|c| c.total_allocs).sum::<u64>();
    let frees = |s: &Stats| s.classes.iter().map(|c| c.total_frees).sum::<u64>();
    assert!(allocs(&s) - allocs(&base) >= (THREADS * ROUNDS * 7 / 9) as u64);
    assert_eq!(allocs(&s) - allocs(&base), frees(&s) - frees(&base));
    // One heap per thread at most (exited threads' heaps wait for reuse).
    assert!(s.heaps <= base.heaps + THREADS as u64, "{s:?}");
    // 80,000 objects, 2 MiB ones among them, cost a reservation (1 GiB of
    // address space, one mmap) per GiB live at the peak, a mapping or two
    // for heap structures, and no munmap.
    assert_eq!(s.syscalls.munmap, base.syscalls.munmap, "{s:?}");
    assert!(
        s.syscalls.mmap - base.syscalls.mmap <= new_reservations(&base, &s) + 2,
        "{s:?}"
    );
    pagewise::trim();
    let t = pagewise::stats();
    assert_given_back(&base, &t, MIB);
}

/// The first `stats()` that satisfies `exact`, read again every 10 ms for
/// at most 2 s (then the last, for the caller's assertion to report). A CI
/// run once saw 37,696 live bytes too many here, which 600 local runs never
/// did; the suspect is the background purger, which moves exited threads'
/// cached slots home while the program runs: a snapshot taken while a
/// batch is between the transfer cache and its pages would count its slots
/// as live until the batch lands. A count still wrong after 2 s fails.
fn stats_where(exact: impl Fn(&Stats) -> bool) -> Stats {
    let mut s = pagewise::stats();
    for _ in 0..200 {
        if exact(&s) {
            break;
        }
        thread::sleep(Duration::from_millis(10));
        s = pagewise::stats();
    }
    s
}

#[test]
fn many_threads_allocate_and_free_concurrently() {
    solo::alone(
        "many_threads_allocate_and_free_concurrently",
        LIMIT,
        many_threads,
    );
}

fn many_threads() {
    let base = pagewise::stats();
    let handles: Vec<_> = (0..12)
        .map(|t| {
            thread::spawn(move || {
                let mut live: Vec<Vec<u64>> = Vec::new();
                let mut x = t as u64 + 1;
                for _ in 0..50_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if x % 3 == 0 && !live.is_empty() {
                        let v = live.swap_remove((x as usize / 3) % live.len());
                        assert!(v.iter().all(|&w| w == v.len() as u64));
                    } else {
                        let n = 1 + (x % 600) as usize;
                        live.push(vec![n as u64; n]);
                    }
                }
                live
            })
        })
        .collect();
    let all: Vec<Vec<Vec<u64>>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // What is live now is exactly what the threads returned: every vector
    // and the lists holding them, each at most a size class above its
    // request (under 20 % above 128 B, 15 B below).
    let mut held = usable(all.as_ptr());
    for list in &all {
        held += usable(list.as_ptr());
        for v in list {
            assert!(v.iter().all(|&w| w == v.len() as u64));
            let (req, got) = (8 * v.len() as u64, usable(v.as_ptr()));
            assert!(
                got >= req && got <= req + (req / 4).max(15),
                "{req} B in {got}"
            );
            held += got;
        }
    }
    let mid = stats_where(|s| s.live_bytes - base.live_bytes == held);
    assert_eq!(
        mid.live_bytes - base.live_bytes,
        held,
        "live bytes {} before, {} after\nbefore: {base:?}\nafter: {mid:?}",
        base.live_bytes,
        mid.live_bytes
    );
    // The 12 exited threads' heaps hold it, one heap each at most.
    assert!(mid.heaps <= base.heaps + 12, "{mid:?}");
    // Trimmed, they keep committed only the pages holding live objects:
    // the free slots left among them are a small part of what is live.
    pagewise::trim();
    let trimmed = stats_where(|s| s.live_bytes == mid.live_bytes);
    assert_eq!(trimmed.live_bytes, mid.live_bytes, "{trimmed:?}");
    assert_eq!(trimmed.retained_bytes, 0, "{trimmed:?}");
    assert!(
        trimmed.committed_bytes <= trimmed.live_bytes + trimmed.live_bytes / 8,
        "{trimmed:?}"
    );
    // The address space was mapped once: no mapping per object or thread.
    assert_eq!(trimmed.syscalls.munmap, base.syscalls.munmap, "{trimmed:?}");
    assert!(
        trimmed.syscalls.mmap - base.syscalls.mmap <= new_reservations(&base, &trimmed) + 2,
        "{trimmed:?}"
    );
    drop(all);
    pagewise::trim();
    let after = pagewise::stats();
    assert_given_back(&base, &after, MIB);
}

#[test]
fn stats_and_trim_account_for_the_process() {
    solo::alone(
        "stats_and_trim_account_for_the_process",
        LIMIT,
        stats_and_trim,
    );
}

fn stats_and_trim() {
    let before = pagewise::stats();
    let v: Vec<Vec<u8>> = (0..1000).map(|i| vec![1u8; 100 + i]).collect();
    let big: Vec<Vec<u8>> = (0..8).map(|i| vec![2u8; (1 << 20) + i * 4096]).collect();
    let huge = vec![3u8; 40 << 20];
    let held = usable(v.as_ptr())
        + v.iter().map(|x| usable(x.as_ptr())).sum::<u64>()
        + usable(big.as_ptr())
        + big.iter().map(|x| usable(x.as_ptr())).sum::<u64>()
        + usable(huge.as_ptr());
    let mid = pagewise::stats();
    // Live bytes are exactly the usable bytes of what the test holds.
    assert_eq!(mid.live_bytes - before.live_bytes, held, "{mid:?}");
    assert_eq!(
        mid.live_allocations - before.live_allocations,
        1000 + 1 + 8 + 1 + 1
    );
    assert_eq!(mid.large.count - before.large.count, 8, "{mid:?}");
    assert_eq!(mid.huge.count - before.huge.count, 1, "{mid:?}");
    assert!(mid.committed_bytes >= mid.live_bytes, "{mid:?}");
    // Metadata: at most a 128 KiB header per segment (only its touched
    // pages count) and a heap structure (about 10 KiB) per heap.
    assert!(
        mid.metadata_bytes <= mid.segments * (128 << 10) + mid.heaps * (64 << 10),
        "{mid:?}"
    );
    drop(std::hint::black_box((v, big, huge)));
    pagewise::trim();
    let after = pagewise::stats();
    assert_given_back(&before, &after, MIB);
    // What the test held was committed on top of the baseline, and trim
    // gave it back, except what the test's objects made slab pages that
    // also hold baseline objects grow by (those pages stay; how many there
    // are depends on where the C library's and libtest's own allocations
    // landed: on musl, 64 KiB of class 640; bounded by the slack above).
    assert!(
        before.committed_bytes.min(after.committed_bytes) + held <= mid.committed_bytes,
        "{after:?}"
    );
    assert!(after.purged_bytes > before.purged_bytes, "{after:?}");
    // A wholly free reservation is unmapped.
    assert!(
        after.reserved_bytes <= before.reserved_bytes.max(1 << 30),
        "{after:?}"
    );
}

#[test]
fn trim_and_stats_visit_heaps_whose_threads_are_working() {
    solo::alone(
        "trim_and_stats_visit_heaps_whose_threads_are_working",
        LIMIT,
        visited_while_working,
    );
}

/// Producers allocate (from their current pages: their caches stay empty)
/// and consumers free what they receive (in runs onto the producers' pages'
/// remote lists), some pausing now and then, while another thread calls
/// `trim()` and `stats()` in a loop: every heap is visited again and again,
/// between and during its owner's slow paths. Each object carries its own
/// serial number in its first and last words, checked when it is freed (a
/// slot handed out twice, or a page released under a live object, shows as
/// a wrong number or a crash), and in the end nothing is live and
/// everything goes back.
fn visited_while_working() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;
    const PAIRS: usize = 2;
    const OBJECTS: u64 = 400_000;
    const BATCH: usize = 512;
    let base = pagewise::stats();
    let done = Arc::new(AtomicBool::new(false));
    let visitor = {
        let done = done.clone();
        thread::spawn(move || {
            let mut visits = 0u64;
            while !done.load(Relaxed) {
                pagewise::trim();
                let s = pagewise::stats();
                assert!(s.live_bytes <= s.committed_bytes, "{s:?}");
                visits += 1;
            }
            visits
        })
    };
    let mut handles = Vec::new();
    for pair in 0..PAIRS {
        let (tx, rx) = mpsc::sync_channel::<Vec<Box<[u64]>>>(4);
        handles.push(thread::spawn(move || {
            let words = [2usize, 6, 16, 62][pair % 4];
            let mut batch = Vec::with_capacity(BATCH);
            for n in 0..OBJECTS {
                let serial = n * PAIRS as u64 + pair as u64;
                let mut v = vec![0u64; words].into_boxed_slice();
                v[0] = serial;
                v[words - 1] = !serial;
                batch.push(v);
                if batch.len() == BATCH {
                    tx.send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)))
                        .unwrap();
                }
                if n % 65_536 == 65_535 {
                    // Long enough for visits to find the heap quiet.
                    thread::sleep(Duration::from_millis(2));
                }
            }
            tx.send(batch).unwrap();
        }));
        handles.push(thread::spawn(move || {
            for batch in rx {
                for v in batch {
                    let serial = v[0];
                    assert_eq!(v[v.len() - 1], !serial, "object {serial} changed");
                }
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    done.store(true, Relaxed);
    let visits = visitor.join().unwrap();
    drop(done);
    assert!(visits > 10, "the visitor ran {visits} passes only");
    let s = pagewise::stats();
    assert_eq!(s.live_bytes, base.live_bytes, "{s:?}");
    pagewise::trim();
    assert_given_back(&base, &pagewise::stats(), MIB);
}
