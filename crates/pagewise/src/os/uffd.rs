//! The write barrier through `userfaultfd` in write-protect mode, where the
//! kernel has it (shared memory: Linux 5.19 and later) and the process may
//! use it for the kernel's own accesses too (`CAP_SYS_PTRACE`, or
//! `vm.unprivileged_userfaultfd = 1`).
//!
//! A page write-protected this way makes a store to it wait in the kernel,
//! whoever makes it: a thread of the program, or the kernel on behalf of a
//! system call (a `read(2)` into the page), which with `mprotect` would
//! fail with `EFAULT` instead. No signal is involved, so the program's own
//! SIGSEGV handler never sees these faults. The waiters are woken when the
//! page is made writable again, or when the page has been remapped
//! ([`wake`]): they then retry on the new mapping.
//!
//! The heap's mappings are registered once made ([`register`], and again
//! for each page remapped, as a new mapping has no registration). Where
//! `userfaultfd` cannot be had, [`open`] says so and the barrier uses
//! `mprotect` and its SIGSEGV handler (`os/barrier.rs`). Linux only.

use super::descriptor::{Kept, KeptCell};
use core::sync::atomic::{AtomicI32, Ordering::*};

/// The process's userfaultfd (none yet: [`Kept::NONE`]), and the process
/// that opened it: a forked child inherits the descriptor, but it acts on
/// the parent's memory, so the child must never use it. Kept out of the
/// program's way and checked at each [`fd`] (`os/descriptor.rs`): a
/// program that closed it or put a file at its number must not have its
/// bytes read as fault messages.
static FD: KeptCell = KeptCell::new();
static OWNER: AtomicI32 = AtomicI32::new(0);

/// The userfaultfd, if this process opened it (-1: none): what the other
/// calls here take, so that one that makes several (the barrier, from its
/// raising to its lowering) asks for the process once.
pub fn fd() -> i32 {
    #[cfg(test)]
    tests::FD_LOOKUPS.with(|n| n.set(n.get() + 1));
    #[cfg(test)]
    if tests::HIDDEN.with(|h| h.get()) {
        return -1;
    }
    let kept = FD.get();
    // SAFETY: plain system call (async-signal-safe).
    if kept.is_some() && OWNER.load(Relaxed) == unsafe { libc::getpid() } {
        kept.get().unwrap_or(-1)
    } else {
        -1
    }
}

const UFFD_API: u64 = 0xaa;
const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
const REGISTER_MODE_WP: u64 = 1 << 1;
const WRITEPROTECT_MODE_WP: u64 = 1 << 0;

/// `_IOWR(0xAA, nr, size)` and `_IOR(0xAA, nr, size)` (the generic ioctl
/// encoding: x86-64 and aarch64 alike).
const fn iowr(nr: u64, size: u64) -> u64 {
    (3 << 30) | (size << 16) | (0xaa << 8) | nr
}
const fn ior(nr: u64, size: u64) -> u64 {
    (2 << 30) | (size << 16) | (0xaa << 8) | nr
}
const UFFDIO_API: u64 = iowr(0x3f, 24);
const UFFDIO_REGISTER: u64 = iowr(0x00, 32);
const UFFDIO_UNREGISTER: u64 = ior(0x01, 16);
const UFFDIO_WAKE: u64 = ior(0x02, 16);
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, 24);

#[repr(C)]
struct Api {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Range {
    start: u64,
    len: u64,
}

#[repr(C)]
struct Register {
    range: Range,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct WriteProtect {
    range: Range,
    mode: u64,
}

fn ioctl<T>(fd: i32, request: u64, arg: &mut T) -> bool {
    // SAFETY: a userfaultfd of ours and the argument its request takes.
    unsafe { libc::ioctl(fd, request as _, arg as *mut T) == 0 }
}

/// Opens the process's userfaultfd with write-protection of shared memory
/// for every fault, the kernel's included; false if the kernel or the
/// process's privileges do not allow it.
pub fn open() -> bool {
    if FD.get().is_some() {
        return true;
    }
    // SAFETY: plain system call; no UFFD_USER_MODE_ONLY: the kernel's own
    // accesses must wait too.
    let fd =
        unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) } as i32;
    if fd < 0 {
        return false;
    }
    let mut api = Api {
        api: UFFD_API,
        features: FEATURE_PAGEFAULT_FLAG_WP | FEATURE_WP_HUGETLBFS_SHMEM,
        ioctls: 0,
    };
    let wanted = api.features;
    if !ioctl(fd, UFFDIO_API, &mut api) || api.features & wanted != wanted {
        // SAFETY: our fd.
        unsafe { libc::close(fd) };
        return false;
    }
    // SAFETY: plain system call (async-signal-safe).
    OWNER.store(unsafe { libc::getpid() }, Relaxed);
    let kept = Kept::keep(fd);
    if !FD.set(kept) {
        // Another thread's is in use (or ours could not be kept).
        kept.close();
    }
    true
}

/// Takes the fault messages queued since the last call: how many stores
/// (or system calls) met a write-protected page and wait (None: the
/// queue could not be read, so there may be some). Reading them does not
/// wake their threads (waking the range does).
pub fn take_faults(fd: i32) -> Option<u64> {
    let mut n = 0;
    // struct uffd_msg is 32 bytes.
    let mut buf = [0u8; 32 * 16];
    if fd < 0 {
        return Some(0);
    }
    loop {
        // SAFETY: our descriptor (non-blocking) and buffer.
        let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if got > 0 {
            n += got as u64 / 32;
        // SAFETY: the calling thread's errno slot.
        } else if got < 0 && unsafe { *libc::__errno_location() } == libc::EAGAIN {
            return Some(n);
        } else {
            return None;
        }
    }
}

/// Registers `addr..addr+len` (shared memory of ours) for
/// write-protection. False if it could not be (the barrier then must not
/// rely on it for this range).
pub fn register(addr: usize, len: usize) -> bool {
    #[cfg(test)]
    if tests::REFUSE_REGISTER.with(|r| r.get()) {
        return false;
    }
    let fd = fd();
    let mut r = Register {
        range: Range {
            start: addr as u64,
            len: len as u64,
        },
        mode: REGISTER_MODE_WP,
        ioctls: 0,
    };
    fd >= 0 && ioctl(fd, UFFDIO_REGISTER, &mut r)
}

/// Unregisters `addr..addr+len` (memory of ours) from `fd` (from [`fd`]):
/// the kernel merges its mappings again where they differed only by
/// registration, and wakes any thread waiting there.
pub fn unregister(fd: i32, addr: usize, len: usize) -> bool {
    #[cfg(test)]
    if tests::REFUSE_UNREGISTER.with(|r| r.get()) {
        return false;
    }
    let mut r = Range {
        start: addr as u64,
        len: len as u64,
    };
    fd >= 0 && ioctl(fd, UFFDIO_UNREGISTER, &mut r)
}

/// Write-protects (`on`) or releases `addr..addr+len` through `fd` (from
/// [`fd`]); releasing wakes the threads waiting there.
pub fn protect(fd: i32, addr: usize, len: usize, on: bool) -> bool {
    let mut w = WriteProtect {
        range: Range {
            start: addr as u64,
            len: len as u64,
        },
        mode: if on { WRITEPROTECT_MODE_WP } else { 0 },
    };
    fd >= 0 && ioctl(fd, UFFDIO_WRITEPROTECT, &mut w)
}

/// Wakes the threads waiting on `addr..addr+len` (remapped since they
/// faulted: they retry on the new mapping) through `fd` (from [`fd`]).
pub fn wake(fd: i32, addr: usize, len: usize) {
    let mut r = Range {
        start: addr as u64,
        len: len as u64,
    };
    if fd >= 0 {
        #[cfg(test)]
        tests::WAKES.with(|n| n.set(n.get() + 1));
        let _ = ioctl(fd, UFFDIO_WAKE, &mut r);
    }
}

/// In a forked child: closes the parent's userfaultfd (it acts on the
/// parent's memory); the child's barrier uses `mprotect`.
pub fn forget_in_child() {
    let kept = FD.take();
    // SAFETY: plain system call (async-signal-safe).
    if OWNER.load(Relaxed) != unsafe { libc::getpid() } {
        // The inherited descriptor, no longer used (if the program put
        // one of its own at the number, it is left to it).
        kept.close();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    std::thread_local! {
        /// This thread's lookups of the userfaultfd (each a `getpid`).
        pub(crate) static FD_LOOKUPS: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
        /// This thread's `UFFDIO_WAKE` calls.
        pub(crate) static WAKES: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
        /// Whether this thread sees no userfaultfd (as before the process
        /// opened one), whatever the process has.
        pub(crate) static HIDDEN: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
        /// Whether this thread's registrations fail (as the kernel may
        /// refuse one: no memory for a split or merge of its mappings).
        pub(crate) static REFUSE_REGISTER: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
        /// Whether this thread's unregistrations fail (as the kernel may
        /// refuse one: no memory to merge the mappings again).
        pub(crate) static REFUSE_UNREGISTER: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
    }
}
