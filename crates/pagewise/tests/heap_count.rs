//! The number of heaps stays bounded by the threads alive at once plus a
//! small constant, however threads come and go: while another thread runs
//! `stats()` and `trim()` over the abandoned heaps, and when a thread
//! allocates in its last round of exit destructors. (Its own test binary,
//! one test: it counts heaps.)

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

/// Short-lived threads, at most `alive` at once, each allocating and
/// freeing, while another thread loops on `stats()` and `trim()`.
fn churn_threads_while_visiting(total: usize, alive: usize) -> u64 {
    let stop = Arc::new(AtomicBool::new(false));
    let visitor = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut max = 0;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let s = pagewise::stats();
                max = max.max(s.heaps);
                if i % 4 == 0 {
                    pagewise::trim();
                }
                i += 1;
            }
            max
        })
    };
    for _ in 0..total / alive {
        let batch: Vec<_> = (0..alive)
            .map(|t| {
                thread::spawn(move || {
                    let v: Vec<Box<[u64; 8]>> =
                        (0..50).map(|i| Box::new([i + t as u64; 8])).collect();
                    std::hint::black_box(&v);
                })
            })
            .collect();
        for h in batch {
            h.join().unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    visitor.join().unwrap()
}

/// A pthread key whose destructor allocates and re-arms itself, so it runs
/// in every round glibc makes (4), the last one after pagewise's own exit
/// destructor has given the thread's heap up.
fn late_allocating_key() -> libc::pthread_key_t {
    extern "C" fn dtor(value: *mut libc::c_void) {
        let rounds = value as usize;
        let b = std::hint::black_box(Box::new([rounds as u64; 16]));
        drop(b);
        let v: Vec<u8> = std::hint::black_box(vec![1u8; 300]);
        drop(v);
        if rounds > 1 {
            // SAFETY: KEY is a valid key; the value is a count, not a pointer.
            unsafe {
                libc::pthread_setspecific(
                    KEY.load(Ordering::Relaxed) as _,
                    (rounds - 1) as *const _,
                )
            };
        }
    }
    static KEY: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `dtor` has the signature pthread_key_create expects.
    assert_eq!(unsafe { libc::pthread_key_create(&mut key, Some(dtor)) }, 0);
    KEY.store(key as usize, Ordering::Relaxed);
    key
}

#[test]
fn heaps_stay_bounded_by_live_threads() {
    // Main thread plus the visitor plus three workers at most.
    let alive = 3;
    let max = churn_threads_while_visiting(1500, alive);
    let after = pagewise::stats().heaps;
    assert!(
        max <= alive as u64 + 4 && after <= alive as u64 + 4,
        "heaps: {max} at most during the churn, {after} after it"
    );

    let key = late_allocating_key();
    for _ in 0..40 {
        thread::spawn(move || {
            let v = std::hint::black_box(vec![7u8; 1000]);
            drop(v);
            // SAFETY: a valid key; the value counts the rounds left.
            unsafe { libc::pthread_setspecific(key, 8 as *const libc::c_void) };
        })
        .join()
        .unwrap();
    }
    let s = pagewise::stats();
    assert!(
        s.heaps <= alive as u64 + 4,
        "{} heaps after 40 threads that allocated in their last exit destructors",
        s.heaps
    );
}
