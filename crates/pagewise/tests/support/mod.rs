//! Shared by the stress tests (`stress.rs`, `stress_fork.rs`): a seeded
//! PRNG, environment knobs, the per-block byte pattern and its checks, the
//! zero check of `calloc`/`alloc_zeroed`, and a `fork()` probe whose child
//! allocates.
//!
//! Not every test binary uses every item.
#![allow(dead_code)]

use std::alloc::Layout;
use std::fmt::Write as _;
use std::io::Write as _;

// ----- randomness ------------------------------------------------------------

/// The SplitMix64 finaliser: a good 64-bit mixer.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64: small, seeded, reproducible (no wall-clock randomness).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(mix(seed ^ 0x243F_6A88_85A3_08D3))
    }
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }
    /// Uniform in `0..n` (`n > 0`).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// Uniform in `0..n` as a usize.
    #[inline]
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
    /// True with probability `num / den`.
    #[inline]
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
    /// Uniform in the octave `[2^bit, 2^(bit+1))`.
    pub fn in_octave(&mut self, bit: u32) -> usize {
        (1usize << bit) + self.below(1u64 << bit) as usize
    }
}

// ----- environment -----------------------------------------------------------

/// A number from the environment: decimal, `0x` hex, or with a `K`/`M`/`G`
/// suffix (binary units). Anything else (or unset) gives `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    let Ok(v) = std::env::var(name) else {
        return default;
    };
    parse_u64(v.trim()).unwrap_or_else(|| {
        eprintln!("{name}={v:?} is not a number; using {default}");
        default
    })
}

fn parse_u64(v: &str) -> Option<u64> {
    if let Some(hex) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        return u64::from_str_radix(&hex.replace('_', ""), 16).ok();
    }
    let (num, shift) = match v.as_bytes().last()? {
        b'k' | b'K' => (&v[..v.len() - 1], 10),
        b'm' | b'M' => (&v[..v.len() - 1], 20),
        b'g' | b'G' => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    num.replace('_', "")
        .parse::<u64>()
        .ok()?
        .checked_mul(1 << shift)
}

/// Whether `PAGEWISE_TEST_STRESS_DISABLE` (a comma-separated list) names `what`.
pub fn disabled(what: &str) -> bool {
    std::env::var("PAGEWISE_TEST_STRESS_DISABLE")
        .map(|v| v.split(',').any(|w| w.trim() == what))
        .unwrap_or(false)
}

/// Writes a line straight to the process's stderr, past the test harness's
/// output capture: seen even if the process aborts before the test ends.
pub fn say(line: &str) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_all(line.as_bytes());
    let _ = e.write_all(b"\n");
}

// ----- the block pattern -----------------------------------------------------

/// Blocks up to this size carry their pattern in every byte.
pub const FULL_MAX: usize = 64 << 10;
/// Larger blocks: their first and last `EDGE` bytes, and the first word of
/// every 4 KiB page between (relative to the block's start, so blocks that
/// start on a page boundary probe the same addresses).
pub const EDGE: usize = 4096;
pub const PAGE: usize = 4096;
/// `calloc`/`alloc_zeroed` blocks are checked byte for byte up to this
/// size, then over the pattern's coverage (first word of every page, the
/// last `EDGE` bytes).
pub const ZERO_FULL_MAX: usize = 1 << 20;

/// The pattern's key for a block: its address, its size and a tag unique to
/// the allocation, so a block that overlaps another, a stale copy of a
/// former occupant and a byte written past the end all read wrong.
#[inline]
pub fn key(addr: usize, size: usize, tag: u64) -> u64 {
    mix(addr as u64 ^ mix(size as u64 ^ mix(tag)))
}

/// The pattern word at byte offset `off` (a multiple of 8) of a block.
#[inline]
fn word(key: u64, off: usize) -> u64 {
    key ^ ((off >> 3) as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The pattern byte at offset `off` of a block.
#[inline]
pub fn byte(key: u64, off: usize) -> u8 {
    word(key, off & !7).to_le_bytes()[off & 7]
}

/// Calls `f(lo, hi)` for each byte range of a block of `size` bytes that
/// carries the pattern (in increasing order, disjoint).
pub fn covered(size: usize, mut f: impl FnMut(usize, usize)) {
    if size <= FULL_MAX {
        f(0, size);
        return;
    }
    f(0, EDGE);
    let tail = size - EDGE;
    let mut p = EDGE;
    while p < tail {
        f(p, (p + 8).min(tail));
        p += PAGE;
    }
    f(tail, size);
}

/// Same as [`covered`], clipped to `limit` bytes.
pub fn covered_below(size: usize, limit: usize, mut f: impl FnMut(usize, usize)) {
    covered(size, |lo, hi| {
        if lo < limit {
            f(lo, hi.min(limit));
        }
    });
}

/// Writes the pattern of `key` over `lo..hi` of the block at `base`.
///
/// # Safety
/// `base..base + hi` is writable memory of one block.
pub unsafe fn fill_range(base: *mut u8, key: u64, lo: usize, hi: usize) {
    let mut o = lo;
    // SAFETY: every offset written is below `hi` (caller).
    unsafe {
        while o < hi && o % 8 != 0 {
            *base.add(o) = byte(key, o);
            o += 1;
        }
        while o + 8 <= hi {
            (base.add(o) as *mut u64).write_unaligned(word(key, o).to_le());
            o += 8;
        }
        while o < hi {
            *base.add(o) = byte(key, o);
            o += 1;
        }
    }
}

/// The first offset in `lo..hi` of the block at `base` that does not hold
/// the pattern of `key`.
///
/// # Safety
/// `base..base + hi` is readable memory of one block.
pub unsafe fn check_range(base: *const u8, key: u64, lo: usize, hi: usize) -> Option<usize> {
    let mut o = lo;
    // SAFETY: every offset read is below `hi` (caller).
    unsafe {
        while o < hi && o % 8 != 0 {
            if *base.add(o) != byte(key, o) {
                return Some(o);
            }
            o += 1;
        }
        while o + 8 <= hi {
            let w = (base.add(o) as *const u64).read_unaligned();
            if w != word(key, o).to_le() {
                // The first byte that differs.
                let want = word(key, o).to_le_bytes();
                let got = w.to_ne_bytes();
                let i = (0..8).find(|&i| want[i] != got[i]).unwrap_or(0);
                return Some(o + i);
            }
            o += 8;
        }
        while o < hi {
            if *base.add(o) != byte(key, o) {
                return Some(o);
            }
            o += 1;
        }
    }
    None
}

/// Fills a whole block's coverage with its pattern.
///
/// # Safety
/// `base..base + size` is one writable block.
pub unsafe fn fill(base: *mut u8, size: usize, key: u64) {
    // SAFETY: ranges lie inside the block.
    covered(size, |lo, hi| unsafe { fill_range(base, key, lo, hi) });
}

/// The first offset of a block's coverage that lost its pattern.
///
/// # Safety
/// `base..base + size` is one readable block.
pub unsafe fn check(base: *const u8, size: usize, key: u64) -> Option<usize> {
    let mut bad = None;
    covered(size, |lo, hi| {
        if bad.is_none() {
            // SAFETY: ranges lie inside the block.
            bad = unsafe { check_range(base, key, lo, hi) };
        }
    });
    bad
}

/// A line describing a pattern mismatch at `off` of the block at `base`
/// (`size` bytes, pattern `key`): address, offset, expected and found bytes,
/// and the 16 bytes around it, expected against found.
///
/// # Safety
/// `base..base + size` is readable.
pub unsafe fn describe_mismatch(base: *const u8, size: usize, key: u64, off: usize) -> String {
    // SAFETY: `off < size` (it came from a check of this block).
    let found = unsafe { *base.add(off) };
    let mut s = format!(
        "at {:#x} (offset {off} of {size}): expected {:#04x}, found {found:#04x}",
        base as usize + off,
        byte(key, off),
    );
    let lo = (off & !7).saturating_sub(8);
    let hi = ((off & !7) + 16).min(size);
    let _ = write!(s, "; bytes {lo}..{hi} expected [");
    for o in lo..hi {
        let _ = write!(s, "{:02x}", byte(key, o));
    }
    let _ = write!(s, "] found [");
    for o in lo..hi {
        // SAFETY: inside the block.
        let _ = write!(s, "{:02x}", unsafe { *base.add(o) });
    }
    s.push(']');
    // SAFETY: as above.
    let zeros = (lo..hi).all(|o| unsafe { *base.add(o) } == 0);
    if zeros {
        s.push_str(" (all zero: purged or zeroed under a live block?)");
    }
    s
}

/// Calls `f(lo, hi)` for the ranges of a fresh zeroed block of `size` bytes
/// that the zero check reads: every byte of the first [`ZERO_FULL_MAX`],
/// then the first word of every 4 KiB page and the last [`EDGE`] bytes
/// (where former occupants' patterns, which start on page boundaries, had
/// data). Reading a never-touched page maps the shared zero page: no RSS.
pub fn zero_checked(size: usize, mut f: impl FnMut(usize, usize)) {
    if size <= ZERO_FULL_MAX {
        f(0, size);
        return;
    }
    f(0, ZERO_FULL_MAX);
    let tail = size.saturating_sub(EDGE).max(ZERO_FULL_MAX);
    let mut p = ZERO_FULL_MAX;
    while p < tail {
        f(p, (p + 8).min(tail));
        p += PAGE;
    }
    f(tail, size);
}

/// The first non-zero byte of a fresh zeroed block (over [`zero_checked`]),
/// as (offset, value).
///
/// # Safety
/// `base..base + size` is readable.
pub unsafe fn first_nonzero(base: *const u8, size: usize) -> Option<(usize, u8)> {
    let mut bad = None;
    zero_checked(size, |lo, hi| {
        if bad.is_some() {
            return;
        }
        let mut o = lo;
        // SAFETY: inside the block.
        unsafe {
            while o + 8 <= hi {
                if (base.add(o) as *const u64).read_unaligned() != 0 {
                    break;
                }
                o += 8;
            }
            while o < hi {
                let b = *base.add(o);
                if b != 0 {
                    bad = Some((o, b));
                    return;
                }
                o += 1;
            }
        }
    });
    bad
}

/// A line describing stale bytes in a zeroed block: where, and how far the
/// non-zero run goes (up to 64 KiB scanned).
///
/// # Safety
/// `base..base + size` is readable.
pub unsafe fn describe_nonzero(base: *const u8, size: usize, off: usize, value: u8) -> String {
    let end = (off + (64 << 10)).min(size);
    // SAFETY: inside the block.
    let nonzero = (off..end).filter(|&o| unsafe { *base.add(o) } != 0).count();
    let mut s = format!(
        "byte at {:#x} (offset {off} of {size}) is {value:#04x}, not 0; {nonzero} of the {} bytes from there are non-zero; first bytes [",
        base as usize + off,
        end - off
    );
    for o in off..(off + 16).min(size) {
        // SAFETY: inside the block.
        let _ = write!(s, "{:02x}", unsafe { *base.add(o) });
    }
    s.push(']');
    s
}

// ----- fork ------------------------------------------------------------------

/// A block the forking thread holds, which the child checks and frees.
#[derive(Clone, Copy)]
pub struct Inherited {
    pub addr: usize,
    pub size: usize,
    pub key: u64,
    /// Freed with `dealloc` (Some) or `pagewise::raw::free` (None).
    pub layout: Option<Layout>,
}

/// What the child does, in order; the child reports each step's index
/// through a pipe, so a hang names the step it hung in.
pub const CHILD_STEPS: &[&str] = &[
    "start",
    "alloc 24 B",
    "alloc 3000 B",
    "alloc 200 KiB (slab)",
    "alloc 1 MiB (large)",
    "alloc 5 MiB at 2 MiB alignment (large)",
    "alloc 20 MiB (huge, > 16 MiB)",
    "alloc 40 MiB at 2 MiB alignment (huge)",
    "alloc_zeroed 24 B",
    "alloc_zeroed 300 KiB",
    "alloc_zeroed 3 MiB",
    "alloc_zeroed 24 MiB (huge)",
    "raw::malloc/calloc/realloc/free",
    "check and free blocks inherited from the parent",
    "pagewise::stats()",
    "pagewise::trim()",
    "done",
];

/// What the child allocates (steps 1..=11): size, alignment, zeroed.
const CHILD_ALLOCS: &[(usize, usize, bool)] = &[
    (24, 8, false),
    (3000, 16, false),
    (200 << 10, 64, false),
    (1 << 20, 16, false),
    (5 << 20, 2 << 20, false),
    (20 << 20, 16, false),
    (40 << 20, 2 << 20, false),
    (24, 8, true),
    (300 << 10, 16, true),
    (3 << 20, 16, true),
    (24 << 20, 4096, true),
];

/// Forks; the child allocates and frees blocks of several sizes (one above
/// 16 MiB), checks zeroed ones, checks and frees `inherited`, calls
/// `stats()` and `trim()`, and exits with `_exit(0)`. The parent waits for
/// it (polling, at most `timeout_ms`): a child still running then is hung
/// (an allocator lock held across `fork()` by a thread that does not exist
/// in the child) and is killed. Err describes a hang, a crash or a failed
/// check, with the child's last step.
pub fn fork_probe(inherited: &[Inherited], timeout_ms: u64) -> Result<(), String> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for two descriptors.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!("pipe failed: {}", std::io::Error::last_os_error()));
    }
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: the child runs only `child` (no unwinding out of it, no
    // locks of the parent's other threads but the allocator's, which is the
    // point) and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: our descriptors.
        unsafe {
            libc::close(rd);
            libc::close(wr);
        }
        return Err(format!("fork failed: {e}"));
    }
    if pid == 0 {
        // SAFETY: in the child; never returns.
        unsafe {
            libc::close(rd);
            let code = child(wr, inherited);
            libc::_exit(code);
        }
    }
    // SAFETY: our descriptor. Non-blocking reads: a child forked at the same
    // time by another thread may hold a copy of the write end, so EOF may
    // not come when our child exits.
    unsafe {
        libc::close(wr);
        libc::fcntl(rd, libc::F_SETFL, libc::O_NONBLOCK);
    }
    let mut status = 0;
    let mut waited = 0;
    let hung = loop {
        // SAFETY: our child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break false;
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: our descriptor.
            unsafe { libc::close(rd) };
            return Err(format!("waitpid failed: {e}"));
        }
        if waited >= timeout_ms {
            // SAFETY: our child; reaped right after.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            break true;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
        waited += 5;
    };
    let mut last = 0u8;
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: reads into our buffer.
        let n = unsafe { libc::read(rd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        last = buf[n as usize - 1];
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(rd) };
    let step = |i: u8| CHILD_STEPS.get(i as usize).copied().unwrap_or("?");
    if hung {
        return Err(format!(
            "the forked child hung for {timeout_ms} ms in step {last} ({}): an allocator lock held across fork() by another thread",
            step(last)
        ));
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        return Ok(());
    }
    if libc::WIFSIGNALED(status) {
        return Err(format!(
            "the forked child died of signal {} in step {last} ({})",
            libc::WTERMSIG(status),
            step(last)
        ));
    }
    let code = libc::WEXITSTATUS(status);
    Err(format!(
        "the forked child failed with exit code {code} in step {last} ({}): {}",
        step(last),
        match code {
            2 => "allocation returned null",
            3 => "misaligned block",
            4 => "pattern lost in a block it wrote",
            5 => "zeroed block not zero",
            6 => "inherited block lost its pattern",
            _ => "?",
        }
    ))
}

/// The child's work; returns its exit code. Async-signal-safe apart from
/// the allocator itself: no locks but the allocator's, no stdio, no panics
/// on the way (every check returns a code).
///
/// # Safety
/// Only in a freshly forked child.
unsafe fn child(fd: i32, inherited: &[Inherited]) -> i32 {
    let step = |i: u8| {
        // SAFETY: writes one byte from a local.
        unsafe { libc::write(fd, (&i as *const u8).cast(), 1) };
    };
    step(0);
    let mut held: [(usize, usize, usize); 16] = [(0, 0, 0); 16];
    for (i, &(size, align, zeroed)) in CHILD_ALLOCS.iter().enumerate() {
        step(i as u8 + 1);
        // SAFETY: the sizes and alignments above form valid layouts.
        let layout = unsafe { Layout::from_size_align_unchecked(size, align) };
        // SAFETY: non-zero layouts; blocks freed below with the same layout.
        let p = unsafe {
            if zeroed {
                std::alloc::alloc_zeroed(layout)
            } else {
                std::alloc::alloc(layout)
            }
        };
        if p.is_null() {
            return 2;
        }
        if p as usize % align != 0 {
            return 3;
        }
        // SAFETY: a live block of `size` bytes.
        unsafe {
            if zeroed && first_nonzero(p, size).is_some() {
                return 5;
            }
            let k = key(p as usize, size, 0xC41D ^ i as u64);
            fill(p, size, k);
            if check(p, size, k).is_some() {
                return 4;
            }
        }
        held[i] = (p as usize, size, align);
    }
    // Free in an order unlike the allocation order.
    for &(p, size, align) in held.iter().rev().step_by(2).chain(held.iter().step_by(2)) {
        if p != 0 {
            // SAFETY: allocated above with this layout.
            unsafe {
                std::alloc::dealloc(p as *mut u8, Layout::from_size_align_unchecked(size, align))
            };
        }
    }
    step(12);
    // SAFETY: the raw API with valid alignments; each block freed once.
    unsafe {
        let a = pagewise::raw::malloc(100, 16);
        let b = pagewise::raw::calloc(17 << 20, 16);
        if a.is_null() || b.is_null() {
            return 2;
        }
        if first_nonzero(b, 17 << 20).is_some() {
            return 5;
        }
        a.write(7);
        let a = pagewise::raw::realloc(a, 700 << 10, 16);
        if a.is_null() {
            return 2;
        }
        if a.read() != 7 {
            return 4;
        }
        pagewise::raw::free(a);
        pagewise::raw::free(b);
    }
    step(13);
    for h in inherited {
        // SAFETY: the parent's live block, copied into the child.
        unsafe {
            if check(h.addr as *const u8, h.size, h.key).is_some() {
                return 6;
            }
            match h.layout {
                Some(l) => std::alloc::dealloc(h.addr as *mut u8, l),
                None => pagewise::raw::free(h.addr as *mut u8),
            }
        }
    }
    step(14);
    let _ = pagewise::stats();
    step(15);
    pagewise::trim();
    step(16);
    0
}
