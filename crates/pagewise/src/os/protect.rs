//! Page protection: the one OS call the page-source layer lacked (`mprotect`),
//! kept here so that [`crate::os::source`] stays unchanged and every OS call still
//! lives behind the page-source layer.
//!
//! Only the executable pools of [`crate::runtime::pool`] use it: their pages are mapped
//! read+write, then flipped to read+execute by an explicit call (W^X), never
//! both at once.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::os::source::{FakePages, PageSource, SystemPages};

/// The access a range of pages allows. There is deliberately no
/// read+write+execute variant: pagewise never maps pages both writable and
/// executable.
///
/// ```
/// use pagewise::pool::Protection;
/// assert_ne!(Protection::ReadWrite, Protection::ReadExecute);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protection {
    /// Readable and writable, not executable (how pages are mapped).
    ReadWrite,
    /// Readable and executable, not writable.
    ReadExecute,
}

/// A page source that can change the protection of its pages.
///
/// Nothing memory-safety-critical rests on it (a wrong answer makes a write or
/// a jump fault, it cannot make one succeed where it should not), so it is a
/// safe trait. [`FakePages`] records nothing and always succeeds.
///
/// ```
/// use pagewise::pool::{ProtectPages, Protection};
/// use pagewise::{PageSource, SystemPages};
/// let pages = SystemPages::new();
/// let p = pages.map(4096, 4096).unwrap();
/// // SAFETY: the page is ours, and nothing writes it while it is read+execute.
/// unsafe {
///     assert!(pages.protect(p, 4096, Protection::ReadExecute));
///     assert!(pages.protect(p, 4096, Protection::ReadWrite));
///     pages.unmap(p, 4096);
/// }
/// ```
pub trait ProtectPages: PageSource {
    /// Changes the protection of `ptr..ptr+size`. Returns false if the OS
    /// refused (the protection is then unchanged).
    ///
    /// # Safety
    /// The range is page-aligned and inside a live mapping of this source, and
    /// no reference to it is used in a way the new protection forbids.
    unsafe fn protect(&self, ptr: NonNull<u8>, size: usize, prot: Protection) -> bool;
}

/// Process-wide count of `mprotect` calls made through [`SystemPages`].
static MPROTECT_CALLS: AtomicU64 = AtomicU64::new(0);

/// `mprotect` calls made so far by every [`SystemPages`] in the process
/// (including failed ones). Per-allocator counts are in
/// [`crate::runtime::pool::PoolStats::mprotect_calls`].
///
/// ```
/// let before = pagewise::pool::system_mprotect_calls();
/// assert!(pagewise::pool::system_mprotect_calls() >= before);
/// ```
pub fn system_mprotect_calls() -> u64 {
    MPROTECT_CALLS.load(Relaxed)
}

impl ProtectPages for SystemPages {
    unsafe fn protect(&self, ptr: NonNull<u8>, size: usize, prot: Protection) -> bool {
        let p = match prot {
            Protection::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
            Protection::ReadExecute => libc::PROT_READ | libc::PROT_EXEC,
        };
        MPROTECT_CALLS.fetch_add(1, Relaxed);
        // SAFETY: the caller guarantees the range is a page-aligned part of a
        // live mapping of ours and that no access the new protection forbids
        // is made through existing references.
        unsafe { libc::mprotect(ptr.as_ptr().cast(), size, p) == 0 }
    }
}

// The fake's memory comes from the system allocator and cannot be re-protected
// without breaking it, so the fake records nothing and reports success: tests
// check the pool's own state machine and call counts.
impl ProtectPages for FakePages {
    unsafe fn protect(&self, _ptr: NonNull<u8>, _size: usize, _prot: Protection) -> bool {
        true
    }
}
