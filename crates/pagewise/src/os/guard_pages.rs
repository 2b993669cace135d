//! The guard pool's pages ([`crate::guard`]): one reservation that is
//! inaccessible except for the slots handed out, each opened while its
//! block lives and closed (made inaccessible) when it is freed. Linux only.
//!
//! Two ways, chosen once when the pool is reserved:
//! - *guard regions* (`MADV_GUARD_INSTALL` and `MADV_GUARD_REMOVE`, Linux
//!   6.13 and later): the reservation is one writable mapping whose
//!   inaccessible pages are markers in the page tables. Opening or closing
//!   a slot changes no mapping, so it is cheaper and the pool stays one
//!   mapping however many slots it has (`mprotect` of one page in the
//!   middle of a mapping splits it in three, and a process may hold only
//!   `vm.max_map_count` of them, 65,530 by default). Closing a slot gives
//!   its page back.
//! - `mprotect`, where the kernel does not know guard regions (or an
//!   emulator accepts them without making anything inaccessible: checked
//!   once, through a pipe): the reservation is inaccessible, and a
//!   slot is made readable and writable while its block lives. A closed
//!   slot's page stays resident (at most one per slot).

const MADV_GUARD_INSTALL: libc::c_int = 102;
const MADV_GUARD_REMOVE: libc::c_int = 103;

/// How a reservation makes its pages inaccessible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Guard regions in the page tables (Linux 6.13 and later).
    Regions,
    /// `mprotect`.
    Protect,
}

/// Reserves `len` bytes of inaccessible address space (no memory is
/// committed), with guard regions where the kernel has them (unless
/// `protect` asks for `mprotect`); `None` if the OS refuses.
pub fn reserve(len: usize, protect: bool) -> Option<(usize, Mode)> {
    let p = map(len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_NORESERVE)?;
    // SAFETY: our fresh mapping, nothing in it yet.
    if !protect
        && unsafe { libc::madvise(p as *mut libc::c_void, len, MADV_GUARD_INSTALL) } == 0
        && !kernel_can_read(p)
    {
        return Some((p, Mode::Regions));
    }
    // SAFETY: as above.
    if unsafe { libc::mprotect(p as *mut libc::c_void, len, libc::PROT_NONE) } == 0 {
        return Some((p, Mode::Protect));
    }
    // SAFETY: our mapping, unused.
    unsafe { libc::munmap(p as *mut libc::c_void, len) };
    None
}

/// Whether the kernel can read the byte at `addr`: a write of it into a
/// pipe, which fails with EFAULT if the page is inaccessible (and faults
/// nothing). An emulator that accepts `MADV_GUARD_INSTALL` as a mere hint
/// (qemu-user does) leaves the page readable: then `mprotect` is used.
fn kernel_can_read(addr: usize) -> bool {
    let mut fds = [0; 2];
    // SAFETY: plain system calls on a pipe of our own, closed here.
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return true; // cannot tell: take the sure way
        }
        let n = libc::write(fds[1], addr as *const libc::c_void, 1);
        libc::close(fds[0]);
        libc::close(fds[1]);
        n == 1
    }
}

/// A fresh private anonymous mapping.
fn map(len: usize, prot: libc::c_int, flags: libc::c_int) -> Option<usize> {
    // SAFETY: a fresh anonymous mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

/// Maps `len` bytes of zeroed, writable memory for the pool's own records
/// (never reachable from a block: it is a mapping of its own).
pub fn map_records(len: usize) -> Option<usize> {
    map(len, libc::PROT_READ | libc::PROT_WRITE, 0)
}

/// Makes the slot `addr..addr+len` readable and writable.
///
/// # Safety
/// A page-aligned range of a reservation made in `mode`, whose slot
/// nobody else holds.
pub unsafe fn open(addr: usize, len: usize, mode: Mode) -> bool {
    let a = addr as *mut libc::c_void;
    // SAFETY: per the caller.
    unsafe {
        if mode == Mode::Regions {
            libc::madvise(a, len, MADV_GUARD_REMOVE) == 0
        } else {
            libc::mprotect(a, len, libc::PROT_READ | libc::PROT_WRITE) == 0
        }
    }
}

/// Makes the slot `addr..addr+len` inaccessible (with guard regions, its
/// page also goes back to the OS).
///
/// # Safety
/// As [`open`]; the block in the slot is no longer live.
pub unsafe fn close(addr: usize, len: usize, mode: Mode) -> bool {
    let a = addr as *mut libc::c_void;
    // SAFETY: per the caller.
    unsafe {
        if mode == Mode::Regions {
            libc::madvise(a, len, MADV_GUARD_INSTALL) == 0
        } else {
            libc::mprotect(a, len, libc::PROT_NONE) == 0
        }
    }
}

/// Gives the pages `addr..addr+len` back to the OS (`MADV_DONTNEED`):
/// they read as zeros, or as the file's bytes, when next made accessible.
/// The hardened build's freed large blocks, made inaccessible.
///
/// # Safety
/// A page-aligned range of the caller's mappings whose bytes nobody needs.
#[cfg(feature = "secure")]
pub unsafe fn discard(addr: usize, len: usize) -> bool {
    // SAFETY: per the caller.
    unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) == 0 }
}

/// Makes `addr..addr+len`, pages of a heap's own mapping, inaccessible in
/// `mode`, or in whichever mode works if `mode` is `None` (guard regions
/// first): the mode that worked, `None` if neither did (the range is then
/// left as it was). The hardened build's guard pages around large blocks.
///
/// # Safety
/// A page-aligned range of a private or shared mapping of the caller's,
/// whose bytes nobody needs (guard regions discard them).
#[cfg(feature = "secure")]
pub unsafe fn fence(addr: usize, len: usize, mode: Option<Mode>) -> Option<Mode> {
    let modes: &[Mode] = match mode {
        Some(Mode::Regions) => &[Mode::Regions],
        Some(Mode::Protect) => &[Mode::Protect],
        None => &[Mode::Regions, Mode::Protect],
    };
    // SAFETY: per the caller.
    modes
        .iter()
        .copied()
        .find(|&m| unsafe { close(addr, len, m) })
}
