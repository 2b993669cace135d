//! `PAGEWISE_LIMIT` is a hard limit: however many threads allocate at
//! once, the committed bytes never pass it, nor does the memory the
//! allocator makes resident.
//!
//! Each child process (the global allocator reads `PAGEWISE_LIMIT` at
//! start) runs N threads that allocate objects of every kind in turn (slab
//! objects of 16 B to 256 KiB, large objects of 1 and 4 MiB, now and then a
//! huge one of 40 MiB), touch every OS page of each, and on each failure
//! free half of what they hold and go on, until each has seen a number of
//! failures: the threads spend the run at the limit, racing for what the
//! others just gave back. A monitor thread samples the committed bytes
//! (`pagewise::stats()`) and the resident set (`/proc/self/statm`); at the
//! end the child reports the highest of each and what the allocator
//! counted against the limit at its peak.
//!
//! The bounds asserted:
//! - the bytes the allocator counts against the limit (`Stats::
//!   limit_peak_bytes`: committed bytes and segment headers, exact at
//!   every moment): never above the limit, no slack at all; and at the
//!   end, at rest, at least the committed bytes the heaps report;
//! - the live bytes the threads hold: never above the limit;
//! - the resident set, from just before the threads start allocating:
//!   never above the limit by more than [`RSS_SLACK`], whatever the number
//!   of threads.

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;

use std::alloc::{alloc, dealloc, Layout};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::Barrier;

const MIB: usize = 1 << 20;
const LIMIT: usize = 64 * MIB;
const CHILD: &str = "PAGEWISE_TEST_LIMIT_CHILD";
/// What the resident set may grow by beyond the limit: memory that is not
/// the heap's (the registry's pages, the monitor's reads of
/// `/proc/self/statm`, the threads' stacks beyond what they touched before
/// the start). Independent of the number of threads: each thread's heap
/// record and stack are made and touched before the baseline is taken.
const RSS_SLACK: usize = MIB;
/// Failures each thread sees before it stops.
const FAILURES: usize = 40;

fn in_child(name: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(name)
}

fn run_child(name: &str, envs: &[(&str, &str)]) -> Vec<u64> {
    let mut cmd = reexec::this_binary();
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, name)
        .env_remove("PAGEWISE_RETAIN_MAX")
        .env_remove("PAGEWISE_DECAY_MS")
        .env_remove("PAGEWISE_CONF")
        .env("PAGEWISE_LIMIT", "64M");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("limit-report ").map(|(_, r)| r.to_string()))
        .unwrap_or_else(|| panic!("no report from the child:\n{stdout}\n{stderr}"));
    line.split(' ').map(|x| x.parse().unwrap()).collect()
}

/// The resident set, read without allocating: the monitor runs while the
/// threads hold the heap at the limit, where an allocation of its own
/// would be refused (and abort the child).
fn resident() -> usize {
    let mut buf = [0u8; 128];
    // SAFETY: a NUL-terminated path; `buf` is writable for its length; the
    // descriptor is closed once.
    let n = unsafe {
        let fd = libc::open(c"/proc/self/statm".as_ptr(), libc::O_RDONLY);
        assert!(fd >= 0);
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    assert!(n > 0);
    let s = std::str::from_utf8(&buf[..n as usize]).unwrap();
    let pages: usize = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize
}

/// The size of a thread's `i`-th allocation: slab sizes from 16 B to
/// 256 KiB in turn, and unless `slab_only` a large object every 8th, a
/// huge one every 256th.
fn size_of_turn(t: usize, i: usize, slab_only: bool) -> usize {
    let i = i + t * 37;
    if slab_only {
        let k = i % 15;
        ((16usize << k) + (i % 3) * (8usize << k)).min(256 * 1024)
    } else if i % 256 == 255 {
        40 * MIB
    } else if i % 16 == 7 {
        MIB
    } else if i % 16 == 15 {
        4 * MIB
    } else {
        // 16 B .. 256 KiB, with sizes between the powers of two too.
        let k = i % 15;
        ((16usize << k) + (i % 3) * (8usize << k)).min(256 * 1024)
    }
}

fn touch(p: *mut u8, size: usize) {
    let mut off = 0;
    while off < size {
        // SAFETY: inside the block.
        unsafe { p.add(off).write_volatile(1) };
        off += 4096;
    }
    // SAFETY: the last byte of the block.
    unsafe { p.add(size - 1).write_volatile(1) };
}

/// Touches `bytes` of this thread's stack, so that the baseline counts it.
#[inline(never)]
fn touch_stack() {
    let mut buf = [0u8; 64 * 1024];
    for k in (0..buf.len()).step_by(1024) {
        buf[k] = k as u8;
    }
    black_box(&mut buf);
}

fn at_the_limit(threads: usize) {
    let slab_only = std::env::var("PAGEWISE_TEST_LIMIT_SIZES").as_deref() == Ok("slab");
    let ready = Barrier::new(threads + 1);
    let go = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    let live = AtomicUsize::new(0);
    let max_live = AtomicUsize::new(0);
    let failures = AtomicUsize::new(0);
    let (mut max_committed, mut max_rss_growth, rss_base) =
        (0usize, 0usize, std::cell::Cell::new(0));
    std::thread::scope(|s| {
        for t in 0..threads {
            let (ready, go, live, max_live, failures) = (&ready, &go, &live, &max_live, &failures);
            s.spawn(move || {
                // The heap record, the stack and the list of blocks exist
                // before the baseline.
                let mut held: Vec<(*mut u8, Layout)> = Vec::with_capacity(4096);
                black_box(Box::new(t));
                touch_stack();
                ready.wait();
                go.wait();
                let mut seen = 0;
                let mut i = 0;
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                while seen < FAILURES {
                    let size = size_of_turn(t, i, slab_only);
                    i += 1;
                    let l = Layout::from_size_align(size, 16).unwrap();
                    // SAFETY: a layout of non-zero size.
                    let p = unsafe { alloc(l) };
                    if p.is_null() || held.len() == held.capacity() {
                        if p.is_null() {
                            seen += 1;
                            failures.fetch_add(1, Relaxed);
                        } else {
                            // SAFETY: just allocated with `l`.
                            unsafe { dealloc(p, l) };
                        }
                        // Free half, at random.
                        let mut k = 0;
                        while k < held.len() {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            if rng & 1 == 0 {
                                let (q, ql) = held.swap_remove(k);
                                live.fetch_sub(ql.size(), Relaxed);
                                // SAFETY: allocated with `ql`, freed once.
                                unsafe { dealloc(q, ql) };
                            } else {
                                k += 1;
                            }
                        }
                        continue;
                    }
                    touch(p, size);
                    held.push((p, l));
                    let now = live.fetch_add(size, Relaxed) + size;
                    max_live.fetch_max(now, Relaxed);
                }
                for (q, ql) in held.drain(..) {
                    live.fetch_sub(ql.size(), Relaxed);
                    // SAFETY: as above.
                    unsafe { dealloc(q, ql) };
                }
            });
        }
        // Spawned before the start: a thread's making allocates, which the
        // limit may refuse once the others hold the heap.
        let done = s.spawn(|| {
            while failures.load(Relaxed) < threads * FAILURES && !stop.load(Relaxed) {
                std::thread::yield_now();
            }
        });
        ready.wait();
        rss_base.set(resident());
        go.wait();
        // The monitor: this thread, until the others are done.
        while !done.is_finished() {
            let c = pagewise::stats().committed_bytes as usize;
            max_committed = max_committed.max(c);
            max_rss_growth = max_rss_growth.max(resident().saturating_sub(rss_base.get()));
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        stop.store(true, Relaxed);
    });
    let s = pagewise::stats();
    println!(
        "limit-report {} {} {} {} {} {} {}",
        max_live.load(Relaxed),
        max_committed,
        max_rss_growth,
        s.committed_bytes,
        failures.load(Relaxed),
        s.limit_peak_bytes,
        s.limit_charged_bytes,
    );
}

fn check(threads: usize, envs: &[(&str, &str)]) {
    let name = format!("child_{threads}_threads");
    let r = run_child(&name, envs);
    let (live, committed, rss, failures) = (r[0] as usize, r[1] as usize, r[2] as usize, r[4]);
    let (peak, charged, end_committed) = (r[5] as usize, r[6] as usize, r[3] as usize);
    let m = |b: usize| b as f64 / MIB as f64;
    eprintln!(
        "{threads} threads, {envs:?}, limit 64 MiB: live {:.2} MiB, committed {:.2} MiB, resident growth {:.2} MiB, charged at the peak {:.2} MiB, {failures} failures",
        m(live),
        m(committed),
        m(rss),
        m(peak),
    );
    assert!(failures > 0, "the limit was reached: {r:?}");
    assert!(
        live <= LIMIT,
        "{:.2} MiB live under a 64 MiB limit",
        m(live)
    );
    // `committed` is only a sample: `stats()` sums the heaps one at a time,
    // so memory moving between heaps meanwhile (purged in one, committed in
    // another) may count twice. The allocator's own count is exact.
    let _ = committed;
    assert!(
        peak <= LIMIT,
        "{:.2} MiB charged at the peak under a 64 MiB limit",
        m(peak)
    );
    // The threads spent the run at the limit: the peak is near it (a
    // refused charge is of a few MiB at most but for the huge objects'),
    // and no lower than the count at the end.
    assert!(
        peak >= LIMIT - 8 * MIB && peak >= charged,
        "peak {peak}, charged at the end {charged}"
    );
    // The count is exact: at the end (every block freed, the retained
    // memory still committed) it is what the heaps hold, headers included.
    assert!(
        charged >= end_committed,
        "charged {charged} below committed {end_committed}"
    );
    assert!(
        end_committed <= LIMIT,
        "{end_committed} committed at the end"
    );
    if !reexec::emulated() {
        assert!(
            rss <= LIMIT + RSS_SLACK,
            "resident set grew by {:.2} MiB under a 64 MiB limit",
            m(rss)
        );
    }
}

#[test]
fn child_32_threads() {
    if in_child("child_32_threads") {
        at_the_limit(32);
    }
}

#[test]
fn child_8_threads() {
    if in_child("child_8_threads") {
        at_the_limit(8);
    }
}

#[test]
fn child_1_threads() {
    if in_child("child_1_threads") {
        at_the_limit(1);
    }
}

#[test]
fn thirty_two_threads_at_the_limit_stay_within_it() {
    check(32, &[]);
}

#[test]
fn eight_threads_at_the_limit_stay_within_it() {
    check(8, &[]);
}

#[test]
fn one_thread_at_the_limit_stays_within_it() {
    check(1, &[]);
}

#[test]
fn thirty_two_threads_of_slab_objects_at_the_limit_stay_within_it() {
    check(32, &[("PAGEWISE_TEST_LIMIT_SIZES", "slab")]);
}

#[test]
fn eight_threads_of_slab_objects_at_the_limit_stay_within_it() {
    check(8, &[("PAGEWISE_TEST_LIMIT_SIZES", "slab")]);
}

/// An owned heap with `Config::limit_bytes`: objects of every size class
/// in turn, each touched, until one fails; the committed bytes stay within
/// the limit at every step.
#[test]
fn an_owned_heap_stays_within_its_limit() {
    let limit = 16 * MIB;
    let heap = pagewise::Heap::with_config(pagewise::Config {
        limit_bytes: limit,
        ..Default::default()
    });
    let mut held = Vec::with_capacity(1 << 16);
    let mut max = 0;
    let mut failed = 0;
    let mut heap_record = None;
    for i in 0..200_000usize {
        let size = size_of_turn(0, i, false).min(8 * MIB);
        let l = Layout::from_size_align(size, 16).unwrap();
        match heap.allocate(l) {
            Ok(p) => {
                touch(p.cast::<u8>().as_ptr(), size);
                held.push((p.cast::<u8>(), l));
            }
            Err(_) => {
                failed += 1;
                if failed == 20 {
                    break;
                }
                let mut k = 0;
                held.retain(|&(p, l)| {
                    k += 1;
                    if k % 2 == 0 {
                        return true;
                    }
                    // SAFETY: allocated above with `l`, freed once.
                    unsafe { heap.deallocate(p, l) };
                    false
                });
            }
        }
        let s = heap.stats();
        let c = s.committed_bytes as usize;
        max = max.max(c);
        assert!(
            c <= limit,
            "{c} bytes committed under a {limit}-byte limit at step {i}"
        );
        assert!(s.limit_peak_bytes as usize <= limit, "{s:?}");
        assert!(s.limit_peak_bytes >= s.limit_charged_bytes, "{s:?}");
        // Exact: what the heap commits and its segment headers, which is
        // all of its metadata but the heap record, a constant.
        let record = s.committed_bytes + s.metadata_bytes - s.limit_charged_bytes;
        assert_eq!(*heap_record.get_or_insert(record), record, "{s:?}");
    }
    assert!(failed > 0, "the limit was reached (peak {max})");
    for (p, l) in held {
        // SAFETY: allocated above with `l`.
        unsafe { heap.deallocate(p, l) };
    }
}
