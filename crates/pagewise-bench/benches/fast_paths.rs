//! Micro-benchmarks of the fast paths, pagewise against System (glibc),
//! mimalloc and jemalloc, each called directly through its `GlobalAlloc`
//! impl (the bench binary's own global allocator is the system one):
//! - `pair/<alloc>/<size>`: allocate-then-free of one size class;
//! - `cross_thread/<alloc>`: a batch allocated on one thread, freed on another;
//! - `realloc_growth/<alloc>`: a buffer grown by doubling from 16 B to 64 KiB.
//!
//! `cargo bench -p pagewise-bench --bench fast_paths`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::{Duration, Instant};

type Alloc = (&'static str, &'static (dyn GlobalAlloc + Sync));

static PAGEWISE: pagewise::Pagewise = pagewise::Pagewise;
static SYSTEM: System = System;
static MIMALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const ALLOCS: [Alloc; 4] = [
    ("pagewise", &PAGEWISE),
    ("system", &SYSTEM),
    ("mimalloc", &MIMALLOC),
    ("jemalloc", &JEMALLOC),
];

const SIZES: [usize; 9] = [
    16,
    64,
    256,
    1024,
    4096,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
];

fn pairs(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair");
    g.throughput(Throughput::Elements(1));
    for (name, a) in ALLOCS {
        for size in SIZES {
            let layout = Layout::from_size_align(size, 8).unwrap();
            g.bench_with_input(BenchmarkId::new(name, size), &layout, |b, &l| {
                b.iter(|| {
                    // SAFETY: non-zero layout; the block is freed with the
                    // same allocator and layout.
                    unsafe {
                        let p = a.alloc(l);
                        assert!(!p.is_null());
                        p.write(1);
                        a.dealloc(black_box(p), l);
                    }
                })
            });
        }
    }
    g.finish();
}

/// Allocation addresses handed to another thread.
struct Batch(Vec<usize>);

fn cross_thread(c: &mut Criterion) {
    const N: usize = 1024;
    let layout = Layout::from_size_align(64, 8).unwrap();
    let mut g = c.benchmark_group("cross_thread");
    g.throughput(Throughput::Elements(N as u64));
    for (name, a) in ALLOCS {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let (to_free, rx) = std::sync::mpsc::sync_channel::<Batch>(4);
                let (done_tx, done) = std::sync::mpsc::channel::<Duration>();
                let freer = std::thread::spawn(move || {
                    let mut t = Duration::ZERO;
                    for batch in rx {
                        let s = Instant::now();
                        for p in batch.0 {
                            // SAFETY: allocated below by `a` with `layout`,
                            // freed once, here.
                            unsafe { a.dealloc(p as *mut u8, layout) };
                        }
                        t += s.elapsed();
                    }
                    done_tx.send(t).unwrap();
                });
                let mut alloc_time = Duration::ZERO;
                for _ in 0..iters {
                    let mut v = Vec::with_capacity(N);
                    let s = Instant::now();
                    for _ in 0..N {
                        // SAFETY: non-zero layout.
                        let p = unsafe { a.alloc(layout) };
                        assert!(!p.is_null());
                        v.push(p as usize);
                    }
                    alloc_time += s.elapsed();
                    to_free.send(Batch(v)).unwrap();
                }
                drop(to_free);
                let free_time = done.recv().unwrap();
                freer.join().unwrap();
                // Time of allocating on one thread plus freeing on the other.
                alloc_time + free_time
            })
        });
    }
    g.finish();
}

fn realloc_growth(c: &mut Criterion) {
    let mut g = c.benchmark_group("realloc_growth");
    for (name, a) in ALLOCS {
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut size = 16usize;
                let mut l = Layout::from_size_align(size, 8).unwrap();
                // SAFETY: non-zero layout; each realloc passes the current
                // layout; the last block is freed with its layout.
                unsafe {
                    let mut p = a.alloc(l);
                    while size < (64 << 10) {
                        let new = size * 2;
                        p = a.realloc(p, l, new);
                        assert!(!p.is_null());
                        p.add(new - 1).write(1);
                        size = new;
                        l = Layout::from_size_align(size, 8).unwrap();
                    }
                    a.dealloc(black_box(p), l);
                }
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = pairs, cross_thread, realloc_growth
}
criterion_main!(benches);
