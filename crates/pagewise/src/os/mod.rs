//! The OS layer: every system call pagewise makes is in this folder.
//! Everything above it is policy, tested against [`source::FakePages`].

#[cfg(target_os = "linux")]
pub(crate) mod barrier;
#[cfg(target_os = "linux")]
pub(crate) mod descriptor;
#[cfg(target_os = "linux")]
pub(crate) mod guard_pages;
#[cfg(target_os = "linux")]
pub(crate) mod membarrier;
pub(crate) mod proc;
pub(crate) mod protect;
pub(crate) mod random;
#[cfg(target_os = "linux")]
pub(crate) mod segv;
#[cfg(target_os = "linux")]
pub mod shared;
#[cfg(unix)]
pub(crate) mod signals;
pub mod source;
pub mod thp;
#[cfg(target_os = "linux")]
pub(crate) mod uffd;
