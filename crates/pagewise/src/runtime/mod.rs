//! Building blocks for language runtimes, on top of the allocator:
//! bump arenas on pooled blocks and ref-counted code pools.

pub mod arena;
pub(crate) mod block_pool;
pub mod pool;
