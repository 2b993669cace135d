//! A tight allocate/free loop for profiling the fast paths:
//! `cargo run --release -p pagewise --example pair_loop -- 64 100000000`
use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;

fn main() {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(64, |s| s.parse().unwrap());
    let n: u64 = args.next().map_or(100_000_000, |s| s.parse().unwrap());
    let l = Layout::from_size_align(size, 8).unwrap();
    let a = pagewise::Pagewise;
    let t = std::time::Instant::now();
    for _ in 0..n {
        // SAFETY: non-zero layout; freed with the same layout.
        unsafe {
            let p = a.alloc(l);
            p.write(1);
            a.dealloc(black_box(p), l);
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!("{size} B: {ns:.2} ns per allocate/free pair");
}
