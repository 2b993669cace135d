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
//! Map of the crate: the layers are folders, and a folder uses only the
//! ones above it in this list.
//! - `sync/`: the spin lock of the slow paths (`lock.rs`);
//! - `os/`: the OS layer, every system call ([`source`]: mmap, munmap,
//!   madvise behind the `PageSource` trait; [`thp`]: the kernel's huge-page
//!   mode and the huge-page advice; `shared.rs`: memfd mappings
//!   whose OS pages can share a physical page, and `barrier.rs`, the write
//!   barrier, for meshing; `protect.rs`: mprotect for W^X pools);
//! - `memory/`: [`layout`] (OS pages, slices, segments), [`size_class`]
//!   (the size-class table), `registry.rs` (which addresses are pagewise's),
//!   `reservation.rs` (address space carved into segments), `segment.rs`
//!   (headers and the commit bitmap), `page.rs` (span descriptors and the
//!   remote-free word), `spans/` (a heap's span pool: best fit and
//!   coalescing, the retention queue, the huge-object cache, segment release),
//!   `transfer.rs` (batches of free slots passed between threads' caches);
//! - `heap/`: one heap: its thread cache (`cache.rs`), allocation and
//!   placement (`alloc.rs`), frees (`free.rs`), the remote-free protocol
//!   (`remote.rs`), large and huge objects (`large.rs`), maintenance, trim
//!   and abandon (`maintenance.rs`), free OS pages inside used pages
//!   (`hollow.rs`), meshing (`mesh.rs`);
//! - `global/`: the process-wide allocator: [`Pagewise`] (`allocator.rs`),
//!   [`thread`] (a heap per thread, thread exit, fork), `tls.rs` (the
//!   thread's heap pointer), [`raw`] (unsized entry points for C), [`purger`]
//!   (the background purger);
//! - `runtime/`: [`arena`] and [`pool`], building blocks for runtimes;
//! - at the root, the API: [`config`] (the retention policy and its
//!   variables), [`mod@stats`], [`fault`] (what bad input does), [`Heap`],
//!   and [`c_malloc`] (the C `malloc` family, which the `override` feature
//!   exports under its C names);
//! - [`guard`]: sampled guard pages, which catch overflows, uses after free
//!   and bad frees of a few allocations in production (over `os/`'s
//!   `guard_pages.rs` and `segv.rs`, the one SIGSEGV handler).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod c_malloc;
/// The C `malloc` family under its C names: the `override` feature.
#[cfg(all(feature = "override", target_os = "linux"))]
mod c_symbols {
    crate::export_c_malloc!();
}
#[cfg(all(feature = "override", not(target_os = "linux")))]
compile_error!(
    "the `override` feature takes over `malloc` through ELF symbol interposition: Linux only"
);
pub mod config;
pub mod fault;
mod global;
pub mod guard;
pub(crate) mod heap;
pub(crate) mod memory;
pub mod options;
mod os;
mod owned_heap;
pub mod profile;
mod runtime;
#[cfg(feature = "secure")]
mod secure;
pub mod stats;
pub(crate) mod sync;

pub use global::allocator::{mesh, stats, trim, usable_size, Pagewise};
pub use global::{purger, raw, thread};
pub use memory::{budget, layout, size_class};
pub use os::source;
pub use os::thp;
pub use runtime::{arena, pool};

pub use arena::Arena;
pub use config::Config;
pub use owned_heap::Heap;
#[cfg(target_os = "linux")]
pub use source::SharedPages;
pub use source::{FakePages, PageSource, Purge, SyscallCounts, SystemPages};
pub use stats::{ClassStats, ObjectStats, Stats};
pub use thp::Thp;

/// The schedule-perturbation build's hook into the free fast path's
/// window (`sync/perturb.rs`): tests only, in that build only.
#[cfg(pagewise_perturb)]
#[doc(hidden)]
pub use sync::perturb::set_window_hook;
