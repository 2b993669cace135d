//! A file descriptor pagewise keeps open (a meshing mapping's memory file,
//! the process's userfaultfd, `PAGEWISE_SAMPLE_FILE`), kept out of the
//! program's way and checked to be still pagewise's before each use.
//!
//! The numbers are the program's to manage: a daemon closes every
//! descriptor it did not open (`closefrom(3)`, `close_range`), a shell
//! `dup2`s its own over a number, and the next `open` takes the lowest
//! free one. A number pagewise opened may so come to name a file of the
//! program's, and a `pwrite`, `fallocate` or shared `mmap` of a meshing
//! pass through it would write into that file, a sample line be appended
//! to it, or a read of the userfaultfd's messages take bytes from it. So:
//!
//! - a kept descriptor is moved to a number at or above [`FLOOR`] (where
//!   the soft limit on open files allows), which an `open` does not take
//!   while lower numbers are free and a shell does not `dup2` to;
//! - every use first asks the kernel whether the number still names the
//!   same open file (`fstat`: its device and inode, and `fcntl`: its
//!   status flags). If not, the descriptor is *lost*: it is never used
//!   nor closed again, and what it served goes on without it (a mapping
//!   stops meshing, the write barrier falls back to `mprotect`, the
//!   sampler stops), with one line on stderr.
//!
//! A program that closes and reopens numbers while another of its threads
//! is in a meshing pass can still race the check; one that closes every
//! descriptor once, at start or in a forked child, cannot.

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::*};

/// The lowest number a kept descriptor is moved to.
pub const FLOOR: i32 = 512;

/// An open file of pagewise's, as it was when kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kept {
    fd: i32,
    dev: u64,
    ino: u64,
    flags: i32,
}

/// Whether a lost descriptor has been reported (once per process).
static REPORTED: AtomicBool = AtomicBool::new(false);

impl Kept {
    /// No descriptor.
    pub const NONE: Kept = Kept {
        fd: -1,
        dev: 0,
        ino: 0,
        flags: 0,
    };

    /// Keeps `fd`, just opened by pagewise (negative: none): moves it to a
    /// number at or above [`FLOOR`] where it can (closing the first) and
    /// notes what it names. [`Kept::NONE`] if the kernel cannot say.
    pub fn keep(fd: i32) -> Kept {
        // A negative `fd` is neither raised nor known to the kernel.
        let fd = raise(fd);
        match identity(fd) {
            Some((dev, ino, flags)) => Kept {
                fd,
                dev,
                ino,
                flags,
            },
            None => {
                if fd >= 0 {
                    // SAFETY: the descriptor was just opened by pagewise.
                    unsafe { libc::close(fd) };
                }
                Kept::NONE
            }
        }
    }

    /// The descriptor, if it still names the file it was kept as; `None`
    /// if there is none or it was lost (closed, or another file now:
    /// said once on stderr).
    pub fn get(&self) -> Option<i32> {
        if self.fd < 0 {
            return None;
        }
        if identity(self.fd) == Some((self.dev, self.ino, self.flags)) {
            return Some(self.fd);
        }
        lost();
        None
    }

    /// Whether a descriptor was kept (lost or not).
    pub fn is_some(&self) -> bool {
        self.fd >= 0
    }

    /// Closes the descriptor if it is still pagewise's (a number the
    /// program has taken over is left to it).
    pub fn close(self) {
        if let Some(fd) = self.get() {
            // SAFETY: our own open file, checked just now.
            unsafe { libc::close(fd) };
        }
    }
}

/// A [`Kept`] in a static (the process's userfaultfd), set by one thread
/// and read by any, without a lock (the fault handler reads it).
pub struct KeptCell {
    /// -1: none; -2: being set; else the descriptor, published last.
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
    flags: AtomicI32,
}

impl KeptCell {
    /// An empty cell.
    pub const fn new() -> KeptCell {
        KeptCell {
            fd: AtomicI32::new(-1),
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
            flags: AtomicI32::new(0),
        }
    }

    /// Puts `k` in the cell if it holds none (false: another was put
    /// first, or is being put).
    pub fn set(&self, k: Kept) -> bool {
        if k.fd < 0 || self.fd.compare_exchange(-1, -2, Acquire, Relaxed).is_err() {
            return false;
        }
        self.dev.store(k.dev, Relaxed);
        self.ino.store(k.ino, Relaxed);
        self.flags.store(k.flags, Relaxed);
        self.fd.store(k.fd, Release);
        true
    }

    /// What the cell holds ([`Kept::NONE`] if nothing yet).
    pub fn get(&self) -> Kept {
        let fd = self.fd.load(Acquire);
        if fd < 0 {
            return Kept::NONE;
        }
        Kept {
            fd,
            dev: self.dev.load(Relaxed),
            ino: self.ino.load(Relaxed),
            flags: self.flags.load(Relaxed),
        }
    }

    /// Empties the cell; what it held.
    pub fn take(&self) -> Kept {
        let k = self.get();
        if k.fd >= 0 && self.fd.compare_exchange(k.fd, -1, AcqRel, Relaxed).is_ok() {
            return k;
        }
        Kept::NONE
    }
}

/// `fd` moved to the lowest free number at or above [`FLOOR`], close-on-exec
/// (the original closed), or `fd` itself where the limit on open files
/// does not allow it.
fn raise(fd: i32) -> i32 {
    if fd >= FLOOR {
        return fd;
    }
    // SAFETY: plain system call on pagewise's own descriptor.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, FLOOR) };
    if high < 0 {
        return fd;
    }
    // SAFETY: the original, ours, replaced by `high`.
    unsafe { libc::close(fd) };
    high
}

/// What `fd` names: device, inode and status flags (`None`: not open).
fn identity(fd: i32) -> Option<(u64, u64, i32)> {
    // SAFETY: an all-zero `stat` is a valid out-buffer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: plain system calls with a valid out-pointer.
    let (rc, flags) = unsafe { (libc::fstat(fd, &mut st), libc::fcntl(fd, libc::F_GETFL)) };
    (rc == 0 && flags >= 0).then_some((st.st_dev as u64, st.st_ino as u64, flags))
}

fn lost() {
    #[cfg(test)]
    tests::LOST.with(|n| n.set(n.get() + 1));
    if !REPORTED.swap(true, Relaxed) {
        crate::fault::write_stderr(&[
            b"pagewise: the program closed or replaced a file descriptor pagewise keeps open (a \
meshing memory file, the userfaultfd or the sample file); pagewise no longer uses it, and what it \
served goes on without it\n",
        ]);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    std::thread_local! {
        /// This thread's descriptors found lost.
        pub(crate) static LOST: core::cell::Cell<u32> = const { core::cell::Cell::new(0) };
    }

    fn lost_here() -> u32 {
        LOST.with(|n| n.get())
    }

    fn memfd() -> i32 {
        // SAFETY: a C string literal; plain system call.
        unsafe { libc::memfd_create(c"pagewise-test".as_ptr(), libc::MFD_CLOEXEC) }
    }

    #[test]
    fn a_kept_descriptor_moves_out_of_the_programs_way() {
        let fd = memfd();
        let k = Kept::keep(fd);
        assert!(k.get().unwrap() >= FLOOR, "{k:?}");
        // SAFETY: querying a number.
        assert_eq!(
            unsafe { libc::fcntl(fd, libc::F_GETFD) },
            -1,
            "the first is closed"
        );
        k.close();
        // SAFETY: querying a number.
        assert_eq!(unsafe { libc::fcntl(k.fd, libc::F_GETFD) }, -1, "closed");
    }

    #[test]
    fn a_descriptor_closed_or_replaced_by_the_program_is_never_used_again() {
        let k = Kept::keep(memfd());
        let fd = k.get().unwrap();
        // The program closes it and opens a file of its own there.
        let other = memfd();
        // SAFETY: the program's own moves: `dup2` over the number.
        unsafe { libc::dup2(other, fd) };
        let before = lost_here();
        assert_eq!(k.get(), None, "another file at the number");
        assert_eq!(lost_here(), before + 1, "said to be lost");
        k.close();
        // SAFETY: querying a number.
        assert!(
            unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0,
            "the program's left open"
        );
        // SAFETY: the program's descriptors.
        unsafe {
            libc::close(fd);
            libc::close(other);
        }
        assert_eq!(k.get(), None, "closed");
    }

    #[test]
    fn below_a_low_limit_on_open_files_a_descriptor_stays_where_it_is() {
        // In a child: the limit is the process's. The child makes system
        // calls only, and says how it went by its exit status.
        // SAFETY: see above.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let low = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 256,
            };
            // SAFETY: plain system calls in the child.
            unsafe {
                let code = if libc::setrlimit(libc::RLIMIT_NOFILE, &low) != 0 {
                    2
                } else {
                    let fd = memfd();
                    let k = Kept::keep(fd);
                    i32::from(k.get() != Some(fd))
                };
                libc::_exit(code);
            }
        }
        let mut status = 0;
        // SAFETY: our child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "{status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "kept where it was opened");
    }

    #[test]
    fn none_is_never_a_descriptor() {
        let before = lost_here();
        assert_eq!(Kept::keep(-1), Kept::NONE);
        assert_eq!(Kept::NONE.get(), None);
        assert!(!Kept::NONE.is_some());
        assert_eq!(lost_here(), before, "no descriptor is none lost");
    }

    #[test]
    fn a_cell_holds_the_first_descriptor_put_in_until_taken() {
        let cell = KeptCell::new();
        assert_eq!(cell.get(), Kept::NONE);
        assert!(!cell.set(Kept::NONE), "none is not put in");
        assert_eq!(cell.get(), Kept::NONE);
        let (a, b) = (Kept::keep(memfd()), Kept::keep(memfd()));
        assert!(cell.set(a));
        assert!(!cell.set(b), "the first stays");
        assert_eq!(cell.get(), a);
        assert_eq!(cell.get().get(), a.get());
        assert_eq!(cell.take(), a);
        assert!(!cell.get().is_some(), "taken");
        assert!(!cell.take().is_some(), "nothing left to take");
        assert!(cell.set(b), "empty again");
        assert_eq!(cell.get(), b);
        a.close();
        b.close();
    }
}
