//! The process-wide allocator: `#[global_allocator]`, the C-style entry
//! points, a heap per thread, thread exit and fork, and the background
//! purger. Everything here uses the layers below (`heap`, `memory`, `os`)
//! and nothing below uses it.

pub mod allocator;
pub(crate) mod fork;
pub(crate) mod heaps;
pub mod purger;
pub mod raw;
pub mod thread;
pub(crate) mod tls;
