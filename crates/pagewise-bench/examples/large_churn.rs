//! Minimal reproducer: allocate-then-free of one large size under pagewise,
//! timed per pair, for sizes around the slab/large boundary.
//!
//! `cargo run --release -p pagewise-bench --example large_churn`

use std::alloc::{alloc, dealloc, Layout};
use std::hint::black_box;
use std::time::Instant;

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

fn main() {
    let n = 200_000u32;
    for kib in [256usize, 257, 320, 384, 448, 512, 768, 1024, 2048, 4096] {
        let l = Layout::from_size_align(kib << 10, 8).expect("layout");
        let s0 = pagewise::stats().syscalls;
        let t = Instant::now();
        for _ in 0..n {
            // SAFETY: non-zero layout; freed right away with the same layout.
            unsafe {
                let p = alloc(l);
                assert!(!p.is_null());
                p.write(1);
                dealloc(black_box(p), l);
            }
        }
        let per = t.elapsed() / n;
        let s1 = pagewise::stats().syscalls;
        println!(
            "{kib:>5} KiB: {per:>8?} per alloc+free pair; mmap {} munmap {} madvise {}",
            s1.mmap - s0.mmap,
            s1.munmap - s0.munmap,
            s1.madvise - s0.madvise
        );
    }
}
