//! The guard pool's pages ([`crate::guard`]): one reservation that is
//! inaccessible except for the slots handed out, each opened while its
//! block lives and closed (made inaccessible) when it is freed. Linux only.

/// Reserves `len` bytes of inaccessible address space (no memory is
/// committed); `None` if the OS refuses.
pub fn reserve(len: usize) -> Option<usize> {
    // SAFETY: a fresh anonymous mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

/// Maps `len` bytes of zeroed, writable memory for the pool's own records
/// (never reachable from a block: it is a mapping of its own).
pub fn map_records(len: usize) -> Option<usize> {
    // SAFETY: a fresh anonymous mapping.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

/// Makes the slot `addr..addr+len` readable and writable.
///
/// # Safety
/// A page-aligned range of the reservation, whose slot nobody else holds.
pub unsafe fn open(addr: usize, len: usize) -> bool {
    // SAFETY: per the caller.
    unsafe {
        libc::mprotect(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
        ) == 0
    }
}

/// Makes the slot `addr..addr+len` inaccessible. Its memory stays
/// resident (at most the pool's slots): emptying it too would cost a
/// system call and a page fault at each reuse, a fifth of a guarded
/// block's cost, for a few pages.
///
/// # Safety
/// As [`open`]; the block in the slot is no longer live.
pub unsafe fn close(addr: usize, len: usize) -> bool {
    // SAFETY: per the caller.
    unsafe { libc::mprotect(addr as *mut libc::c_void, len, libc::PROT_NONE) == 0 }
}
