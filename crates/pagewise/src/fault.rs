//! Bad input: what pagewise does when handed a pointer it cannot free.
//!
//! Every detected misuse aborts the process with one line on stderr naming
//! the problem and the address (on Linux followed by the stack it was found
//! at, symbolized: `guard/report.rs`), because continuing after a
//! corrupting free turns a clear bug into a mysterious one. Detected by
//! default (each case has a test in `tests/misuse.rs`):
//! - a pointer pagewise never handed out (not in any of its segments), at
//!   the free;
//! - a pointer inside an allocation but not at its start, at the free;
//! - a pointer into memory that is free: a large or huge object freed
//!   twice, a pointer into a free span or a released slab page, at the
//!   free; and a small slot freed twice, wherever the first free left it
//!   (this thread's cache, another thread's, its page's free list, a
//!   remote-free list) and whichever thread frees it: every free slot
//!   carries a key made from a per-process secret and its address, one
//!   kind in thread caches and another in page lists (`memory/block.rs`).
//!   A free past the cache (a thread without a heap) checks it at once; a
//!   free into a thread cache only stores it, and the slot freed twice is
//!   caught where it leaves the cache or its page list again: the
//!   allocation that would hand it out a second time, the flush that sends
//!   it home, the release of a page that looks empty one slot early, the
//!   thread's exit, or the process's `exit()` (docs/design.md, "Bad input");
//! - a slot of a slab page that was carved but never handed out;
//! - freeing into an owned `Heap`, or through the global allocator, a
//!   pointer that belongs to another heap (small, large and huge alike);
//! - in the hardened build (`secure`), a free slot whose link (encoded with
//!   the secret) or key a write after free changed, where the list that
//!   holds it follows it: a corrupted free list; and a freed slot whose
//!   zeroed bytes were written before it is handed out again.
//!
//! Not detected: a slot freed, handed out again, and then freed a second
//! time through the old pointer (it is live again, so the free is valid as
//! far as the allocator can tell; glibc cannot tell either); a second free
//! landing in the thread cache after the slot's page emptied, was purged and
//! was remade for another class (past the cache, `Page::carved` catches it);
//! a second free into the cache of a thread that, before the process ends,
//! neither allocates the slot again, nor flushes, nor exits, and is not the
//! thread that calls `exit()`; and writes to freed memory that do not touch
//! a slot's first two words.

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
    /// Bytes past the end of the block were written (the hardened build).
    Overflow,
    /// A free slot's link or key was overwritten: a write after free (the
    /// hardened build, where links are encoded).
    CorruptedFreeList,
    /// A freed block was written before it was handed out again (the
    /// hardened build, which fills freed slots and checks them).
    WriteAfterFree,
    /// Bytes before the start of the block were written (the hardened
    /// build: the tail word of the slot before it changed).
    Underflow,
}

impl Misuse {
    fn describe(self) -> &'static [u8] {
        match self {
            Misuse::Foreign => b"free of a pointer pagewise did not allocate",
            Misuse::Misaligned => b"free of a pointer that is not the start of an allocation",
            Misuse::DoubleFree => b"double free (the memory is already free)",
            Misuse::WrongHeap => b"free of a pointer that belongs to another pagewise heap",
            Misuse::Overflow => b"heap buffer overflow (written past the end of the block)",
            Misuse::CorruptedFreeList => {
                b"corrupted free list (a free block's link was overwritten: a write after free)"
            }
            Misuse::WriteAfterFree => b"write after free (a freed block was written)",
            Misuse::Underflow => {
                b"heap buffer underflow (written before the start of the block, or past the end of the one before)"
            }
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

/// Formats `x` in decimal into `buf`, returning the used part.
///
/// ```
/// let mut buf = [0u8; 20];
/// assert_eq!(pagewise::fault::decimal(4096, &mut buf), b"4096");
/// ```
pub fn decimal(mut x: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (x % 10) as u8;
        x /= 10;
        if x == 0 {
            return &buf[at..];
        }
    }
}

/// Reports the misuse and aborts.
#[cold]
#[inline(never)]
pub fn misuse(kind: Misuse, addr: usize) -> ! {
    let mut buf = [0u8; 18];
    let headline: [&[u8]; 5] = [
        b"pagewise: ",
        kind.describe(),
        b": ",
        hex(addr, &mut buf),
        b"\n",
    ];
    // A pointer pagewise never handed out has no block to say more of.
    let block = (kind != Misuse::Foreign).then_some(addr);
    report_at_and_abort(&headline, block)
}

/// Writes `headline` (one line, its parts as given) and, on Linux, the
/// stack it was found at, symbolized, the allocator's own frames left out
/// (`guard/report.rs`); then aborts. Allocates nothing.
#[cold]
#[inline(never)]
pub(crate) fn report_and_abort(headline: &[&[u8]]) -> ! {
    report_at_and_abort(headline, None)
}

/// [`report_and_abort`] of a misuse at `block`, an address in pagewise's
/// memory: if the heap profiler sampled the block there, the report adds
/// where it was allocated and, if it was, freed (`profile/recent.rs`).
#[cold]
#[inline(never)]
fn report_at_and_abort(headline: &[&[u8]], block: Option<usize>) -> ! {
    #[cfg(target_os = "linux")]
    crate::guard::found_elsewhere(headline, block);
    #[cfg(not(target_os = "linux"))]
    {
        let _ = block;
        write_stderr(headline);
    }
    std::process::abort()
}
