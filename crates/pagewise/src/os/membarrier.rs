//! `membarrier(2)`: the rare side of the asymmetric fence
//! ([`crate::sync::asymmetric`]).
//!
//! `MEMBARRIER_CMD_PRIVATE_EXPEDITED` interrupts each CPU that runs a
//! thread of this process and has it execute a full memory barrier: a few
//! microseconds, no lock, nothing allocated. It needs the process to have
//! registered once (`MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`, Linux
//! 4.14); a process that has not (or a child after `fork`, or an image
//! after `exec`) gets `EPERM` and registers then.

use core::sync::atomic::{AtomicU8, Ordering::Relaxed};

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// 0: not known yet; 1: the kernel has it; 2: it refused (too old, a
/// seccomp filter, an emulator without it).
static STATE: AtomicU8 = AtomicU8::new(0);

/// Makes every other running thread of the process execute a full memory
/// barrier. False if the kernel cannot (then nothing was ordered).
pub(crate) fn serialize_threads() -> bool {
    if STATE.load(Relaxed) == 2 {
        return false;
    }
    if expedited() == 0 {
        STATE.store(1, Relaxed);
        return true;
    }
    // Not registered (the first call, or a forked child): register, retry.
    if register() == 0 && expedited() == 0 {
        STATE.store(1, Relaxed);
        return true;
    }
    STATE.store(2, Relaxed);
    false
}

fn expedited() -> libc::c_long {
    // SAFETY: membarrier takes two integer arguments (and a cpu id, unused
    // without MEMBARRIER_CMD_FLAG_CPU); it touches no memory of ours.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) }
}

fn register() -> libc::c_long {
    // SAFETY: as in `expedited`.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
            0,
            0,
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_kernel_serializes_or_says_it_cannot() {
        // This machine's kernel (4.14 or later) has it; an emulator may not,
        // and then every later call says so without asking again.
        let first = super::serialize_threads();
        assert_eq!(super::serialize_threads(), first);
    }
}
