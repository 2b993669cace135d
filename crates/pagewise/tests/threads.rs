//! The global allocator under many threads: cross-thread frees, threads that
//! exit while their objects live on elsewhere, heaps reused by new threads.

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

use std::sync::mpsc;
use std::thread;

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

#[test]
fn cross_thread_frees_in_a_ring() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 10_000;
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
}

#[test]
fn many_threads_allocate_and_free_concurrently() {
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
    for v in all.iter().flatten() {
        assert!(v.iter().all(|&w| w == v.len() as u64));
    }
}

#[test]
fn stats_and_trim_account_for_the_process() {
    let before = pagewise::stats();
    let v: Vec<Vec<u8>> = (0..1000).map(|i| vec![1u8; 100 + i]).collect();
    let mid = pagewise::stats();
    assert!(mid.live_bytes >= before.live_bytes + 1000 * 100);
    drop(v);
    pagewise::trim();
    let after = pagewise::stats();
    assert!(after.committed_bytes <= mid.committed_bytes);
    assert!(after.syscalls.mmap >= 1);
    assert!(after.metadata_bytes * 100 < after.reserved_bytes.max(1) + after.metadata_bytes * 100);
}
