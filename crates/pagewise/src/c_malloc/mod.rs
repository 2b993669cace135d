//! The C allocation family with C semantics, over [`crate::raw`]: what
//! `libpagewise.so` exports, and what the `override` feature makes a Rust
//! binary's own `malloc`.
//!
//! Every function is also an ordinary Rust function, usable without either:
//!
//! ```
//! use pagewise::c_malloc::{free, malloc};
//! let p = malloc(32);
//! assert!(pagewise::raw::owns(p.cast()));
//! // SAFETY: a live block, freed once.
//! unsafe { free(p) };
//! ```
//!
//! Rules these keep, because C code (and libc itself) calls them:
//! - **No bootstrap**: the core lives in zero-initialised statics, so the
//!   first `malloc` (from the loader or libc, before any constructor) works.
//! - **No allocation inside the allocator**, and no unwinding: nothing here
//!   panics, and the exported symbols are `extern "C"`, which aborts rather
//!   than unwind if anything ever did.
//! - **Fast path**: `malloc` takes a slot from the thread cache and
//!   tail-calls the rest, errno included, so it saves no register.

mod errno;
mod export;
mod glibc;
mod standard;

pub use errno::{errno, set_errno};
pub use glibc::{check_size, free_aligned_sized, free_sized, malloc_good_size};
pub use standard::{
    aligned, aligned_alloc, calloc, free, malloc, malloc_trim, malloc_usable_size, memalign,
    posix_memalign, pvalloc, realloc, reallocarray, valloc, MIN_ALIGN,
};
