//! pagewise: a memory allocator for long-running programs and language
//! runtimes. It gives freed memory back to the kernel page by page about a
//! second after its last use, even when the program has gone quiet, without
//! the system-call storms of allocators that give it back at once; it keeps
//! fragmentation low; and it counts every byte it holds, exactly.
//!
//! This page is a guide to the crate. The repository's user guide
//! (`docs/guide/`) also covers the C library (`libpagewise.so`, for any
//! program through `LD_PRELOAD`) and the `pagewise` command; how the
//! allocator works inside is `docs/design.md`.
//!
//! # The global allocator
//!
//! ```
//! #[global_allocator]
//! static GLOBAL: pagewise::Pagewise = pagewise::Pagewise;
//!
//! let v = vec![0u8; 8 << 20];
//! assert!(pagewise::stats().live_bytes >= 8 << 20);
//! drop(v);
//! ```
//!
//! Nothing else to set up: the first allocation maps memory, each thread
//! gets its own heap, and a background thread gives back what was freed
//! once it has stayed unused for the decay delay. The settings come from
//! `PAGEWISE_*` variables ([`config`] lists them all, each with its
//! default); a misspelled or malformed one prints one line and is ignored.
//! Run the program with `PAGEWISE_STATS=1` for a report on stderr at exit.
//!
//! # What it holds: stats and reports
//!
//! ```
//! #[global_allocator]
//! static GLOBAL: pagewise::Pagewise = pagewise::Pagewise;
//!
//! let v: Vec<u64> = (0..100_000).collect();
//! let s = pagewise::stats(); // every counter, exact
//! assert!(s.live_bytes >= 800_000);
//! assert!(s.committed_bytes >= s.live_bytes + s.retained_bytes);
//! println!("{s}"); // the allocator's figures, a dozen lines
//!
//! let r = pagewise::report(); // the same with the kernel's view (RSS)
//! println!("{r}"); // what PAGEWISE_STATS=1 prints at exit
//! let mut json = String::new();
//! r.write_json(&mut json).unwrap(); // what PAGEWISE_STATS_FILE holds
//! assert!(json.starts_with("{\"version\":"));
//! # drop(v);
//! ```
//!
//! [`Stats`] is plain data (`serde` feature: `Serialize`); the [`report`](mod@report)
//! module writes the same reports into fixed buffers, without allocating,
//! and says when the environment asks for them.
//!
//! # Giving memory back now
//!
//! ```
//! #[global_allocator]
//! static GLOBAL: pagewise::Pagewise = pagewise::Pagewise;
//!
//! let buffers: Vec<Vec<u8>> = (0..16).map(|_| vec![1u8; 1 << 20]).collect();
//! drop(buffers); // kept for reuse for the decay delay
//! pagewise::trim(); // given back at once, from every thread's heap
//! assert_eq!(pagewise::stats().retained_bytes, 0);
//! ```
//!
//! # An owned heap
//!
//! A [`Heap`] has its own memory and counters, and its drop unmaps
//! everything it mapped. `&Heap` is an `allocator_api2` allocator, so
//! collections can live in it:
//!
//! ```
//! use allocator_api2::vec::Vec;
//!
//! let heap = pagewise::Heap::new();
//! let mut v = Vec::new_in(&heap);
//! v.extend(0..10_000u32);
//! assert!(heap.stats().live_bytes >= 40_000);
//! drop(v);
//! heap.trim();
//! assert_eq!(heap.stats().committed_bytes, 0);
//! ```
//!
//! # A limit, and the other settings
//!
//! An owned heap takes its policy as a [`Config`]; the global allocator
//! reads the same fields from the environment (`PAGEWISE_LIMIT=16M`,
//! `PAGEWISE_DECAY_MS=250`, ...).
//!
//! ```
//! use std::alloc::Layout;
//!
//! let heap = pagewise::Heap::with_config(pagewise::Config {
//!     limit_bytes: 16 << 20, // a hard limit on committed bytes
//!     decay_ms: 250,         // freed memory kept for reuse for 250 ms
//!     ..pagewise::Config::DEFAULT
//! });
//! let ten_mib = Layout::from_size_align(10 << 20, 8).unwrap();
//! let a = heap.allocate(ten_mib).unwrap();
//! assert!(heap.allocate(ten_mib).is_err(), "20 MiB would pass the limit");
//! // SAFETY: allocated above with this layout.
//! unsafe { heap.deallocate(a.cast(), ten_mib) };
//! ```
//!
//! The global allocator's settings can also change while it runs
//! ([`options`]; the C library's `pagewise_option_set`):
//!
//! ```
//! pagewise::options::set("limit", "1G").unwrap();
//! assert_eq!(pagewise::options::get("limit"), Ok(1 << 30));
//! pagewise::options::set("limit", "-1").unwrap(); // no limit again
//! ```
//!
//! # Which code holds the memory
//!
//! With `PAGEWISE_PROF=1` in its environment, a program whose global
//! allocator is pagewise samples its allocations with their call stacks
//! ([`profile`]): the sites come as data, and the profile file, written at
//! exit to `PAGEWISE_PROF_FILE` or at any time by [`profile::dump`], is what
//! `pagewise run --profile` turns into pprof files and flamegraphs.
//!
//! ```
//! let mut live = 0;
//! pagewise::profile::for_each_site(|site| live += site.live.bytes);
//! let written = pagewise::profile::dump();
//! if pagewise::profile::sample_bytes() == 0 {
//!     // This process was started without PAGEWISE_PROF=1.
//!     assert_eq!((live, written), (0, false));
//! }
//! ```
//!
//! # Arenas and pools for runtimes
//!
//! [`Arena`] is a bump arena whose blocks come from a capped pool shared
//! by the thread's arenas; [`pool`] holds ref-counted code pools for JITs,
//! with their waste counted.
//!
//! ```
//! let mut arena = pagewise::Arena::new();
//! let n = arena.alloc(41u32);
//! *n += 1;
//! assert_eq!(*n, 42);
//! arena.reset(); // keeps one block for the next round
//! ```
//!
//! # Features
//!
//! | feature | what it does |
//! |---|---|
//! | `serde` | `Serialize` for [`Stats`] and its parts |
//! | `override` | exports [`c_malloc`] under the C names, so C code in the binary and libc itself allocate from pagewise too (Linux; in the binary, not in a library) |
//! | `secure` | the hardened build: canaries, double frees caught at the free, freed blocks wiped |
//!
//! # The rest of the crate
//!
//! [`fault`] says what bad input does (one line, then abort); [`guard`]
//! samples allocations between guard pages to catch overflows and uses
//! after free; [`raw`] and [`c_malloc`] are the unsized entry points the
//! C library uses; [`thread`], [`purger`] and [`budget`] show the global
//! allocator's per-thread heaps, background thread and retention budget;
//! [`source`] is the page source every system call goes through (and
//! [`FakePages`], the counted fake the tests use); [`layout`] and
//! [`size_class`] give the geometry.
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
pub mod report;
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
pub use report::report;
pub use runtime::{arena, pool};

pub use arena::Arena;
pub use config::Config;
pub use owned_heap::Heap;
#[cfg(target_os = "linux")]
pub use source::SharedPages;
pub use source::{FakePages, PageSource, Purge, SyscallCounts, SystemPages};
pub use stats::{ClassStats, ObjectStats, PurgedBy, Stats};
pub use thp::Thp;

/// The schedule-perturbation build's hook into the free fast path's
/// window (`sync/perturb.rs`): tests only, in that build only.
#[cfg(pagewise_perturb)]
#[doc(hidden)]
pub use sync::perturb::set_window_hook;
