//! pagewise: a memory allocator that never thrashes the kernel, gives memory
//! back at OS-page granularity, and can tell you where every byte went.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod layout;
pub mod size_class;
pub mod source;

pub use source::{FakePages, PageSource, Purge, SyscallCounts, SystemPages};

// --- runtime building blocks (issue 5) ---
pub mod arena;
mod block_pool;
pub mod pool;
mod protect;
pub use arena::Arena;
