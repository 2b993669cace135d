//! The report of a bug in a guarded block: one line naming the kind and the
//! address, then the stacks that matter, symbolized in the process.
//!
//! ```text
//! pagewise: heap-buffer-overflow: write 0 bytes past the end of the 32-byte block at 0x7f2a3c001fe0 (address 0x7f2a3c002000), thread 4242
//!   access (thread 4242):
//!     #0 0x000055d0c0a01189 overflow_by_one+0x19 (/tmp/prog)
//!     ...
//!   allocated by thread 4242:
//!     #0 0x000055d0c0a01170 make+0x10 (/tmp/prog)
//! ```
//!
//! Written without allocating (into a static buffer, flushed to stderr) by
//! one thread at a time; a bug found at a free aborts, a fault goes on to
//! the handler that was there before pagewise's (so a crash reporter still
//! sees it) or ends the process with the SIGSEGV.

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};

use super::pool::{thread_id, Place, Pool, Stack, State};
use super::symbol;
use crate::profile::{recent, unwind};

/// What went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An access past a block's end (into the guard page after it).
    Overflow,
    /// An access before a block's start (into the guard page before it).
    Underflow,
    /// An access to a block after its free.
    UseAfterFree,
    /// A second free of a block.
    DoubleFree,
    /// A free of a pointer into the pool that does not start a live block.
    InvalidFree,
    /// Found at the free: the bytes between the block's end and its slot's
    /// end were written.
    OverflowAtFree,
    /// An access to the pool that is near no block (a wild pointer).
    Wild,
}

impl Kind {
    /// The name on the report's first line (AddressSanitizer's names,
    /// which tools and people already search for).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Overflow | Kind::OverflowAtFree => "heap-buffer-overflow",
            Kind::Underflow => "heap-buffer-underflow",
            Kind::UseAfterFree => "heap-use-after-free",
            Kind::DoubleFree => "double-free",
            Kind::InvalidFree => "invalid-free",
            Kind::Wild => "wild-access",
        }
    }
}

/// Whether the faulting access read or wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Which of them a target constructs depends on what its CPU says.
#[allow(dead_code)]
pub enum Access {
    /// A read.
    Read,
    /// A write.
    Write,
    /// The CPU did not say (x86-64's always does).
    Unknown,
}

impl Access {
    fn name(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
            Access::Unknown => "access",
        }
    }
}

/// The thread writing a report (0: none): one at a time, and a fault
/// inside the reporter is not reported again.
static REPORTER: AtomicU32 = AtomicU32::new(0);
/// A fault was reported: later faults in the pool (the program's handler
/// returned and the access ran again) go on unreported.
static FAULT_REPORTED: AtomicBool = AtomicBool::new(false);

/// Reports a bug found at a free (or `malloc_usable_size`) and aborts.
/// `slot`: the slot whose records say more.
#[cold]
#[inline(never)]
pub fn misuse(pool: &Pool, kind: Kind, addr: usize, slot: Option<usize>) -> ! {
    if enter() {
        let mut out = Out::new();
        let _ = misuse_text(&mut out, pool, kind, addr, slot);
        out.flush();
    }
    std::process::abort()
}

/// Writes the report of a misuse found outside the guard pool (a bad free,
/// a block's canary or its free list found overwritten): `headline`, one
/// line as given, then the stack it was found at, symbolized. The caller
/// aborts. A second report on the same thread (a misuse found while this
/// one is written) writes its headline alone. `block`: the address the
/// misuse is at, whose sampled block the profiler may remember.
#[cold]
#[inline(never)]
pub fn found_elsewhere(headline: &[&[u8]], block: Option<usize>) {
    if !enter() {
        crate::fault::write_stderr(headline);
        return;
    }
    // SAFETY: one reporter at a time (`enter`): the frames' buffer is ours.
    let frames = unsafe { &mut *core::ptr::addr_of_mut!(FRAMES) };
    // Captured here, on the stack the misuse was found on (the walk could
    // not cross to it from the report's own stack).
    let n = unwind::capture(frames, 0);
    let frames = &frames[..n];
    let mut write = || {
        let mut out = Out::new();
        for part in headline {
            out.bytes(part);
        }
        let _ = out.stack_here("found at", frames);
        if let Some(k) = block.and_then(crate::profile::recent::find) {
            let _ = out.sampled(block.unwrap_or(0), &k);
        }
        out.flush();
    };
    // SAFETY: the reporter's turn is ours; writing the report cannot
    // panic (formatting into a fixed buffer). On the report's own stack:
    // a misuse may be found on a signal handler's small one.
    unsafe { super::report_stack::run(&mut write) };
}

/// Reports a fault in the pool at `addr`, once; the caller then passes the
/// fault on.
#[cold]
#[inline(never)]
pub fn fault(pool: &Pool, addr: usize, access: Access, pc: usize) {
    if FAULT_REPORTED.swap(true, AcqRel) || !enter() {
        return;
    }
    // SAFETY: one reporter at a time (`enter`): the frames' buffer is ours.
    let frames = unsafe { &mut *core::ptr::addr_of_mut!(FRAMES) };
    // Captured here: the walk goes from this frame through the handler and
    // the signal frame to the faulting code.
    let n = unwind::capture(frames, 0);
    let frames = &frames[..n];
    let mut write = || {
        let mut out = Out::new();
        let _ = fault_text(&mut out, pool, addr, access, pc, frames);
        out.flush();
    };
    // SAFETY: the reporter's turn is ours; writing the report cannot
    // panic (formatting into a fixed buffer).
    unsafe { super::report_stack::run(&mut write) };
    REPORTER.store(0, Release);
}

/// The stack captured at a fault (one report at a time).
static mut FRAMES: [usize; unwind::DEPTH] = [0; unwind::DEPTH];

/// Takes the reporter's turn: false if this thread is already reporting
/// (a fault inside the report). Another thread's report ends the process
/// soon: wait for it.
fn enter() -> bool {
    let me = thread_id();
    loop {
        match REPORTER.compare_exchange(0, me, Acquire, Relaxed) {
            Ok(_) => return true,
            Err(t) if t == me => return false,
            Err(_) => {
                // SAFETY: plain system call.
                unsafe { libc::sched_yield() };
            }
        }
    }
}

fn misuse_text(
    out: &mut Out,
    pool: &Pool,
    kind: Kind,
    addr: usize,
    slot: Option<usize>,
) -> fmt::Result {
    write!(out, "pagewise: {}: ", kind.name())?;
    match (kind, slot) {
        (Kind::DoubleFree, Some(i)) => {
            let (start, size) = pool.record(i).block();
            write!(
                out,
                "free of the {size}-byte block at {start:#x}, already freed"
            )?;
        }
        (Kind::OverflowAtFree, Some(i)) => {
            let (start, size) = pool.record(i).block();
            write!(
                out,
                "the bytes after the {size}-byte block at {start:#x} were written \
                 (found at its free)"
            )?;
        }
        (_, Some(i)) => {
            let (start, size) = pool.record(i).block();
            let at = addr.wrapping_sub(start) as isize;
            write!(
                out,
                "free of {addr:#x}, {} from the start of the {size}-byte block at {start:#x}",
                Bytes(at.unsigned_abs())
            )?;
        }
        (_, None) => write!(out, "free of {addr:#x}, which starts no block")?,
    }
    writeln!(out, ", thread {}", thread_id())?;
    let mut frames = [0usize; unwind::DEPTH];
    let n = unwind::capture(&mut frames, 0);
    out.stack_here("free", &frames[..n])?;
    if let Some(i) = slot {
        let r = pool.record(i);
        out.stack("allocated by", &r.alloc)?;
        if kind == Kind::DoubleFree && r.state() == State::Freed {
            out.stack("freed by", &r.free)?;
        }
    }
    Ok(())
}

fn fault_text(
    out: &mut Out,
    pool: &Pool,
    addr: usize,
    access: Access,
    pc: usize,
    frames: &[usize],
) -> fmt::Result {
    let (kind, slot) = blame(pool, addr);
    write!(out, "pagewise: {}: {} ", kind.name(), access.name())?;
    match slot {
        Some(i) => {
            let (start, size) = pool.record(i).block();
            match kind {
                Kind::Overflow => write!(out, "{} past the end of", Bytes(addr - (start + size)))?,
                Kind::Underflow => write!(out, "{} before", Bytes(start - addr))?,
                _ => write!(out, "{} into", Bytes(addr - start))?,
            }
            write!(
                out,
                " the {size}-byte block at {start:#x} (address {addr:#x})"
            )?;
        }
        None => write!(out, "at {addr:#x}, near no block of the guard pool")?,
    }
    writeln!(out, ", thread {}", thread_id())?;
    let n = frames.len();
    // The walk went through the handler and the signal frame: the access
    // is the frame at the faulting instruction.
    match frames
        .iter()
        .position(|&f| pc != 0 && (f == pc || f == pc + 1))
    {
        Some(from) => out.stack_at("access", &frames[from..n], true)?,
        // An unwinder that cannot cross the signal frame (musl's static
        // libunwind): the faulting instruction alone.
        None if pc != 0 => {
            out.stack_at("access", &[pc], true)?;
            writeln!(out, "    (the unwinder stops at the signal frame)")?;
        }
        None => out.stack_at("access", &frames[..n], false)?,
    }
    if let Some(i) = slot {
        let r = pool.record(i);
        out.stack("allocated by", &r.alloc)?;
        if kind == Kind::UseAfterFree {
            out.stack("freed by", &r.free)?;
        }
    }
    Ok(())
}

/// The kind of a fault at `addr` in the pool, and the slot it is about.
fn blame(pool: &Pool, addr: usize) -> (Kind, Option<usize>) {
    match pool.place(addr) {
        Place::Slot(i) => match pool.record(i).state() {
            State::Unused => (Kind::Wild, None),
            _ => (Kind::UseAfterFree, Some(i)),
        },
        Place::Guard(i) => {
            // After slot i-1's block, or before slot i's: the nearer one
            // that has a block.
            let after = i
                .checked_sub(1)
                .filter(|&j| pool.record(j).state() != State::Unused)
                .map(|j| (addr - block_end(pool, j), j));
            let before = (i < pool.slots())
                .then_some(i)
                .filter(|&j| pool.record(j).state() != State::Unused)
                .map(|j| (pool.record(j).block().0 - addr, j));
            match (after, before) {
                (Some((d, j)), Some((e, _))) if d < e => (Kind::Overflow, Some(j)),
                (Some((_, j)), None) => (Kind::Overflow, Some(j)),
                (_, Some((_, j))) => (Kind::Underflow, Some(j)),
                (None, None) => (Kind::Wild, None),
            }
        }
    }
}

/// A count of bytes, written `1 byte`, `2 bytes`.
struct Bytes(usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            1 => f.write_str("1 byte"),
            n => write!(f, "{n} bytes"),
        }
    }
}

fn block_end(pool: &Pool, i: usize) -> usize {
    let (start, size) = pool.record(i).block();
    start + size
}

/// The report's text: a static buffer (reports are one at a time), flushed
/// to stderr when full and at the end.
struct Out {
    len: usize,
}

static mut BUF: [u8; 4096] = [0; 4096];

impl Out {
    fn new() -> Out {
        Out { len: 0 }
    }

    fn buf(&mut self) -> &mut [u8; 4096] {
        // SAFETY: one reporter at a time (`enter`), and an `Out` exists only
        // inside its turn.
        unsafe { &mut *core::ptr::addr_of_mut!(BUF) }
    }

    fn bytes(&mut self, b: &[u8]) {
        for &c in b {
            if self.len == 4096 {
                self.flush();
            }
            let len = self.len;
            self.buf()[len] = c;
            self.len += 1;
        }
    }

    fn flush(&mut self) {
        let len = self.len;
        let b = &self.buf()[..len];
        crate::fault::write_stderr(&[b]);
        self.len = 0;
    }

    /// A stack kept in a record, headed `what thread N:`.
    fn stack(&mut self, what: &str, s: &Stack) -> fmt::Result {
        let mut frames = [0usize; unwind::DEPTH];
        let n = s.read(&mut frames);
        writeln!(self, "  {what} thread {}:", s.thread())?;
        self.frames(&frames[..n], false)
    }

    /// What the profiler remembers of the sampled block `k` that `addr`
    /// is in: its place, then where it was allocated and freed.
    fn sampled(&mut self, addr: usize, k: &recent::Known) -> fmt::Result {
        let state = if k.freed.is_some() { "freed" } else { "live" };
        writeln!(
            self,
            "  {addr:#x} is {} bytes into a {state} {}-byte block at {:#x}, sampled by the heap profiler",
            addr - k.start,
            k.end - k.start,
            k.start
        )?;
        self.site("allocated by", k.allocated)?;
        match k.freed {
            Some(f) => self.site("freed by", f),
            None => Ok(()),
        }
    }

    /// A stack the profiler kept, headed `what thread N:`.
    fn site(&mut self, what: &str, t: recent::Taken) -> fmt::Result {
        let mut frames = [0usize; unwind::DEPTH];
        let n = recent::frames(t.site, &mut frames);
        match t.thread {
            0 => writeln!(self, "  {what} a thread not recorded:")?,
            id => writeln!(self, "  {what} thread {id}:")?,
        }
        self.frames(&frames[..n], false)
    }

    /// The calling stack: the allocator's own frames left out.
    fn stack_here(&mut self, what: &str, frames: &[usize]) -> fmt::Result {
        writeln!(self, "  {what} (thread {}):", thread_id())?;
        self.frames(frames, false)
    }

    /// The stack of an access; `exact`: the first frame is the faulting
    /// instruction itself (not a return address).
    fn stack_at(&mut self, what: &str, frames: &[usize], exact: bool) -> fmt::Result {
        writeln!(self, "  {what} (thread {}):", thread_id())?;
        self.frames(frames, exact)
    }

    fn frames(&mut self, frames: &[usize], exact: bool) -> fmt::Result {
        let first = first_of_program(frames);
        for (k, &f) in frames[first..].iter().enumerate() {
            // A return address points after its call: look up the call.
            let at = if exact && k == 0 {
                f
            } else {
                f.saturating_sub(1)
            };
            write!(self, "    #{k} {f:#018x}")?;
            match symbol::lookup(at) {
                Some(s) => {
                    write!(self, " ")?;
                    symbol::write_name(self, s.name)?;
                    writeln!(self, "+{:#x} ({})", at - s.start, s.object)?;
                }
                None => writeln!(self)?,
            }
        }
        Ok(())
    }
}

/// How many of a stack's innermost frames are the allocator's (malloc,
/// free, their callees): the program's own come after. A frame that is
/// not the allocator's by its name but lies between two that are (a
/// generic function of the standard library that an unoptimized build of
/// pagewise calls, such as `bool::then`) is the allocator's too: an
/// allocator frame among the next [`WINDOW`] moves the start past it.
fn first_of_program(frames: &[usize]) -> usize {
    let alloc = |f: &usize| symbol::is_allocator(f.saturating_sub(1));
    let mut first = 0;
    while let Some(j) = frames[first..].iter().take(WINDOW).rposition(alloc) {
        first += j + 1;
    }
    // All of them the allocator's: show them all.
    if first >= frames.len() {
        0
    } else {
        first
    }
}

/// Frames looked at past the allocator's last one found: it and two more
/// that may not be the allocator's by name.
const WINDOW: usize = 3;

impl Write for Out {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.bytes(s.as_bytes());
        Ok(())
    }
}
