//! pagewise: a memory allocator that never thrashes the kernel, gives memory
//! back at OS-page granularity, and can tell you where every byte went.
//!
//! ```
//! #[global_allocator]
//! static A: pagewise::Pagewise = pagewise::Pagewise;
//!
//! let v: Vec<u8> = vec![7; 1 << 20];
//! drop(v);
//! pagewise::trim();
//! println!("{} bytes committed", pagewise::stats().committed_bytes);
//! ```
//!
//! Map of the crate (one concept per file in `src/`):
//! - [`source`] (`source.rs`): the OS layer (mmap/munmap/madvise behind the `PageSource` trait);
//! - `reservation.rs`: address space mapped once and carved into segments;
//! - `segment.rs`: 32 MiB segments, their header and commit bitmap;
//! - `page.rs`: page (span) descriptors and slab free lists;
//! - [`size_class`] (`size_class.rs`): the size-class table;
//! - `spans.rs`: the per-heap span pool: best fit, coalescing, retention FIFO, huge cache;
//! - [`config`] (`config.rs`): the retention policy and its environment variables;
//! - `cache.rs`: the thread cache of free slots, per class;
//! - `heap.rs`: size-class queues, fast paths, placement;
//! - `registry.rs`: which addresses are pagewise's (foreign-pointer detection);
//! - `lock.rs`: the spin lock of the slow paths;
//! - [`thread`]: per-thread heaps, thread exit, fork hooks;
//! - `tls.rs`: the thread's heap pointer, one initial-exec TLS word;
//! - [`raw`]: unsized entry points for the C library;
//! - [`purger`]: the background purger;
//! - [`mod@stats`]: counters and their meaning;
//! - [`fault`]: what bad input does;
//! - [`arena`], [`pool`]: building blocks for runtimes (bump arenas on pooled blocks, ref-counted code pools).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub(crate) mod cache;
pub mod config;
pub mod fault;
mod global;
pub(crate) mod heap;
pub mod layout;
pub(crate) mod lock;
mod owned_heap;
pub(crate) mod page;
pub mod purger;
pub mod raw;
pub(crate) mod registry;
pub(crate) mod reservation;
pub(crate) mod segment;
pub mod size_class;
pub mod source;
pub(crate) mod spans;
pub mod stats;
pub mod thread;
pub(crate) mod tls;

pub use config::Config;
pub use global::{stats, trim, usable_size, Pagewise};
pub use owned_heap::Heap;
pub use source::{FakePages, PageSource, Purge, SyscallCounts, SystemPages};
pub use stats::{ClassStats, ObjectStats, Stats};

// --- runtime building blocks (issue 5) ---
pub mod arena;
mod block_pool;
pub mod pool;
mod protect;
pub use arena::Arena;
