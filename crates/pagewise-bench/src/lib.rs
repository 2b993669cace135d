//! `pagewise bench`: allocation workloads modelled on real programs (a
//! language runtime's arena, a garbage collector's blocks, a server's
//! threads, idle programs), side by side with glibc, jemalloc, mimalloc and
//! tcmalloc.
//!
//! The runner ([`run`]) spawns one worker process per (workload, allocator,
//! repetition), interleaving allocators (A B C A B C …) so drift in the
//! machine's load spreads over all of them. Each worker binary installs its
//! own `#[global_allocator]` (`pagewise-bench-worker-{pagewise,system,
//! jemalloc,mimalloc}`); tcmalloc (Debian's `libtcmalloc_minimal.so.4`,
//! found in the system's library directories) and any allocator given as a
//! path to a `.so` run the system worker under `LD_PRELOAD`. A worker prints one JSON line
//! ([`worker::WorkerResult`]); the runner reports medians with min–max,
//! a summary of ratios to the best other allocator, and optionally writes
//! every raw run as JSON and SVG charts.
//!
//! ```no_run
//! use clap::Parser;
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     bench: pagewise_bench::BenchArgs,
//! }
//! let cli = Cli::parse_from(["x", "--quick", "--only", "churn"]);
//! std::process::exit(pagewise_bench::run(&cli.bench).unwrap());
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

mod big_buffers;
pub mod delays;
mod idle;
mod plot;
mod progress;
mod published;
mod redis;
mod render;
mod report;
mod runner;
mod text;
pub mod util;
pub mod worker;
pub mod workloads;

pub use redis::server as redis_server;
pub use runner::{run, AllocSpec, BenchArgs, RunRecord, DEFAULT_ALLOCS};
