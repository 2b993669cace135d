//! `fork()` from a multi-threaded Rust program on the global allocator,
//! while other threads hold its locks: the child must be able to allocate,
//! free, call `stats()` and `trim()`, and exit.
//!
//! The C library registers `thread::fork_prepare/parent/child` with
//! `pthread_atfork`; a Rust program using `pagewise::Pagewise` as its
//! global allocator must be just as safe to fork. A child that hangs (a
//! spin lock copied in the locked state from a thread that does not exist
//! in the child) is killed after `FORK_TIMEOUT_MS` and reported with the
//! step it hung in. Skipped when `PAGEWISE_TEST_STRESS_FORKS=0` (ThreadSanitizer
//! runs: TSan does not support `fork()` from a multi-threaded process).

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod support;

use std::alloc::{alloc, dealloc, Layout};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use support::{env_u64, fork_probe, Rng};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a forked child may take before it counts as hung.
const FORK_TIMEOUT_MS: u64 = 20_000;

fn forks() -> u64 {
    env_u64("PAGEWISE_TEST_STRESS_FORKS", 12)
}

/// Forks `forks()` times while `busy` threads run `work`; returns the
/// failures (stops at the first).
fn fork_while(busy: usize, work: fn(&mut Rng)) -> Vec<String> {
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..busy)
        .map(|t| {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut rng = Rng::new(t as u64 + 1);
                while !stop.load(Relaxed) {
                    work(&mut rng);
                }
            })
        })
        .collect();
    let mut failures = Vec::new();
    for k in 0..forks() {
        // Some work of our own between forks, so each fork finds the
        // others somewhere else.
        let v: Vec<u8> = vec![1; 1000 + k as usize * 7919];
        std::hint::black_box(&v);
        if let Err(e) = fork_probe(&[], FORK_TIMEOUT_MS) {
            failures.push(format!("fork {k} of {}: {e}", forks()));
            break;
        }
    }
    stop.store(true, Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    failures
}

/// Allocates and frees blocks of every kind (slab, large, huge), so the
/// span and reservation locks are taken often.
fn churn(rng: &mut Rng) {
    let size = match rng.below(4) {
        0 => 1 + rng.index(4096),
        1 => 300 << 10,
        2 => (1 + rng.index(8)) << 20,
        _ => (17 + rng.index(8)) << 20,
    };
    let l = Layout::from_size_align(size, 16).unwrap();
    // SAFETY: a non-zero layout, freed at once.
    unsafe {
        let p = alloc(l);
        assert!(!p.is_null());
        p.write(1);
        dealloc(p, l);
    }
}

/// `trim()` in a loop (it takes every heap's span lock and the reservation
/// lock, and munmaps), with a little allocation so there is always
/// something to give back.
fn trim_loop(rng: &mut Rng) {
    churn(rng);
    pagewise::trim();
}

/// `stats()` in a loop (every heap's span lock, the reservation lock, the
/// abandoned list).
fn stats_loop(rng: &mut Rng) {
    churn(rng);
    std::hint::black_box(pagewise::stats());
}

#[test]
fn fork_while_another_thread_trims() {
    let _serial = serial();
    if forks() == 0 {
        return;
    }
    let f = fork_while(1, trim_loop);
    assert!(f.is_empty(), "{}", f.join("\n"));
}

#[test]
fn fork_while_other_threads_allocate_and_take_stats() {
    let _serial = serial();
    if forks() == 0 {
        return;
    }
    fn mixed(rng: &mut Rng) {
        if rng.chance(1, 8) {
            stats_loop(rng)
        } else {
            churn(rng)
        }
    }
    let f = fork_while(3, mixed);
    assert!(f.is_empty(), "{}", f.join("\n"));
}

#[test]
fn fork_while_threads_come_and_go() {
    let _serial = serial();
    if forks() == 0 {
        return;
    }
    // Threads that exit abandon their heaps (the abandoned list's lock),
    // new ones adopt or create heaps (the metadata lock).
    fn short_lived(rng: &mut Rng) {
        let seed = rng.next_u64();
        thread::spawn(move || {
            let mut rng = Rng::new(seed);
            for _ in 0..8 {
                churn(&mut rng);
            }
        })
        .join()
        .unwrap();
    }
    let f = fork_while(2, short_lived);
    assert!(f.is_empty(), "{}", f.join("\n"));
}
