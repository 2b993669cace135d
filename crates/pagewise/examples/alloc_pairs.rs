//! The Rust global allocator's fast paths alone: 25 blocks of 16 bytes
//! allocated, then freed, over and over (N allocations in all, 1,000,000
//! unless given). Counted with callgrind in docs/benchmarks.md:
//!
//! ```sh
//! cargo build --release -p pagewise --example alloc_pairs
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/alloc_pairs 1000000
//! ```

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

use std::alloc::{alloc, dealloc, Layout};
use std::hint::black_box;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("N: a number of allocations"))
        .unwrap_or(1_000_000);
    let layout = Layout::from_size_align(16, 8).unwrap();
    let mut blocks: Vec<*mut u8> = Vec::with_capacity(25);
    for _ in 0..n / 25 {
        for _ in 0..25 {
            // SAFETY: a layout of non-zero size.
            let p = unsafe { alloc(layout) };
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            blocks.push(black_box(p));
        }
        for p in blocks.drain(..) {
            // SAFETY: allocated above with this layout, freed once.
            unsafe { dealloc(black_box(p), layout) };
        }
    }
}
