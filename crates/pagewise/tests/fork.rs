//! A Rust program using pagewise as its global allocator may fork while
//! other threads are inside the allocator: the child finds every allocator
//! lock free and allocates. No fork handler is registered by the program:
//! the global allocator registers its own. (Its own test binary.)

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the child does: allocate at every size range, then exit.
fn child_work() -> ! {
    let small: Vec<Box<u64>> = (0..100).map(Box::new).collect();
    let large = vec![3u8; 1 << 20];
    let mut huge: Vec<u8> = Vec::with_capacity(40 << 20);
    huge.extend_from_slice(&[5; 4096]);
    let ok = small.iter().enumerate().all(|(i, b)| **b == i as u64)
        && large[12345] == 3
        && huge[4095] == 5;
    pagewise::trim();
    // SAFETY: _exit has no preconditions; no destructor runs in the child.
    unsafe { libc::_exit(if ok { 0 } else { 3 }) }
}

/// Waits for `pid`; kills it and returns None if it has not exited after
/// `limit` (a child stuck on a lock held across the fork).
fn wait_or_kill(pid: libc::pid_t, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: our own child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(status);
        }
        if start.elapsed() > limit {
            // SAFETY: our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn children_allocate_while_other_threads_trim_and_allocate() {
    let stop = Arc::new(AtomicBool::new(false));
    let busy: Vec<_> = (0..2)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    if t == 0 {
                        pagewise::trim();
                        let _ = pagewise::stats();
                    } else {
                        // Large objects and new slab pages take the span and
                        // reservation locks.
                        let v = vec![i as u8; 300 << 10];
                        let w: Vec<Box<[u8; 200]>> = (0..64).map(|_| Box::new([1; 200])).collect();
                        std::hint::black_box((&v, &w));
                    }
                    i += 1;
                }
            })
        })
        .collect();
    let mut hung = 0;
    let mut failed = 0;
    for _ in 0..300 {
        // SAFETY: the child only allocates (which is what is tested) and
        // calls _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            child_work();
        }
        match wait_or_kill(pid, Duration::from_secs(10)) {
            None => hung += 1,
            Some(status) if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) => {
                failed += 1
            }
            Some(_) => {}
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in busy {
        t.join().unwrap();
    }
    assert_eq!((hung, failed), (0, 0), "children hung, failed (of 300)");
}
