//! Bad input: what pagewise does when handed a pointer it cannot free.
//!
//! Every detected misuse aborts the process with one line on stderr naming
//! the problem and the address, because continuing after a corrupting free
//! turns a clear bug into a mysterious one. Detected cheaply on every free:
//! - a pointer pagewise never handed out (not in any of its segments);
//! - a pointer inside an allocation but not at its start;
//! - a pointer into memory that is free (a large or huge object freed
//!   twice, a pointer into a free span or a released slab page; a slot
//!   whose page has no live slots, when the free goes past the thread cache);
//! - freeing the slot the same thread freed last (the common double free:
//!   it sits at the head of the thread cache);
//! - freeing into an owned `Heap`, or through the global allocator, a
//!   pointer that belongs to another heap.
//!
//! A slot freed twice with other frees of its class in between is not
//! detected in this build (the thread cache takes it without reading the
//! page); the hardened mode planned next adds full detection.

/// The kinds of misuse pagewise detects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misuse {
    /// Not a pointer pagewise allocated.
    Foreign,
    /// Inside an allocation, but not its start.
    Misaligned,
    /// Already free.
    DoubleFree,
    /// Belongs to a different `Heap`.
    WrongHeap,
}

impl Misuse {
    fn describe(self) -> &'static [u8] {
        match self {
            Misuse::Foreign => b"free of a pointer pagewise did not allocate",
            Misuse::Misaligned => b"free of a pointer that is not the start of an allocation",
            Misuse::DoubleFree => b"double free (the memory is already free)",
            Misuse::WrongHeap => b"free of a pointer that belongs to another pagewise heap",
        }
    }
}

/// Writes byte strings to stderr without allocating.
pub fn write_stderr(parts: &[&[u8]]) {
    for p in parts {
        // SAFETY: writing a valid buffer to fd 2; failure is ignored (nothing
        // better to do on the way to an abort or with a config warning).
        unsafe {
            libc::write(2, p.as_ptr().cast(), p.len());
        }
    }
}

/// Formats `x` as 0x-prefixed hex into `buf`, returning the used part.
pub fn hex(x: usize, buf: &mut [u8; 18]) -> &[u8] {
    buf[0] = b'0';
    buf[1] = b'x';
    for i in 0..16 {
        let d = (x >> ((15 - i) * 4)) & 0xf;
        buf[2 + i] = b"0123456789abcdef"[d];
    }
    &buf[..]
}

/// Reports the misuse and aborts.
#[cold]
#[inline(never)]
pub fn misuse(kind: Misuse, addr: usize) -> ! {
    let mut buf = [0u8; 18];
    write_stderr(&[
        b"pagewise: ",
        kind.describe(),
        b": ",
        hex(addr, &mut buf),
        b"\n",
    ]);
    std::process::abort()
}
