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
//! Map of the crate (one concept per module):
//! - [`source`]: the OS layer (mmap/munmap/madvise behind the `PageSource` trait);
//! - [`reservation`]: address space mapped once and carved into segments;
//! - [`segment`]: 32 MiB segments, their header and commit bitmap;
//! - [`page`]: page (span) descriptors and slab free lists;
//! - [`size_class`]: the size-class table;
//! - [`spans`]: the per-heap span pool: best fit, coalescing, retention FIFO, huge cache;
//! - [`config`]: the retention policy and its environment variables;
//! - [`heap`]: size-class queues, fast paths, placement;
//! - [`thread`]: per-thread heaps, thread exit, fork hooks;
//! - [`raw`]: unsized entry points for the C library;
//! - [`purger`]: the background purger;
//! - [`stats`]: counters and their meaning;
//! - [`fault`]: what bad input does;
//! - [`arena`], [`pool`]: building blocks for runtimes (bump arenas on pooled blocks, ref-counted code pools).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod config;
pub mod fault;
mod global;
pub mod heap;
pub mod layout;
pub mod lock;
mod owned_heap;
pub mod page;
pub mod purger;
pub mod raw;
pub mod registry;
pub mod reservation;
pub mod segment;
pub mod size_class;
pub mod source;
pub mod spans;
pub mod stats;
pub mod thread;

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
