//! jemalloc's own interface, answered by pagewise: programs built for
//! jemalloc (Debian's `redis-server` links `libjemalloc.so.2` and calls
//! `mallctl`, `malloc_stats_print` and `nallocx`) run under
//! `LD_PRELOAD=libpagewise.so` and see pagewise's figures instead of an
//! empty jemalloc heap.
//!
//! - [`ctl`]: `mallctl`, `mallctlnametomib` and `mallctlbymib` with
//!   jemalloc's calling convention, for the names of [`names`];
//! - [`figures`]: jemalloc's statistics from pagewise's counters, and the
//!   snapshot that writing `epoch` refreshes;
//! - [`stats_print`]: `malloc_stats_print`, pagewise's report;
//! - [`flags`]: `mallocx`, `rallocx`, `xallocx`, `sallocx`, `dallocx`,
//!   `sdallocx` and `nallocx` with their `MALLOCX_*` flags.
//!
//! The mapping of each name to pagewise's figures is tabled in
//! docs/guide/observing-memory.md. Nothing here allocates, and nothing panics.

pub mod ctl;
pub mod figures;
pub mod flags;
pub mod names;
pub mod stats_print;
