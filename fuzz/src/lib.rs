//! What the fuzz targets share: a decoder that turns libFuzzer's raw bytes
//! into operations, the size and alignment distributions, the byte patterns
//! every live block carries, and the model of live blocks (no overlap).
//!
//! Inputs are decoded by hand (no `arbitrary`): one byte picks an operation,
//! the next bytes its arguments, and an exhausted input reads as zeros, so
//! every byte string is a valid program and a mutation changes one argument
//! rather than the whole parse.

use std::collections::{BTreeMap, HashMap};

/// Reads operations' arguments from the fuzzer's input.
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    /// A reader at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Input { data, pos: 0 }
    }

    /// True once every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    /// The next two bytes, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | u16::from(self.u8()) << 8
    }

    /// The next four bytes, little-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | u32::from(self.u16()) << 16
    }

    /// An index below `n` (which must be non-zero).
    pub fn pick(&mut self, n: usize) -> usize {
        self.u16() as usize % n
    }

    /// A value in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        debug_assert!(lo <= hi);
        let span = (hi - lo) as u64 + 1;
        lo + (u64::from(self.u32()) % span) as usize
    }
}

pub const KIB: usize = 1 << 10;
pub const MIB: usize = 1 << 20;

/// Sizes where pagewise changes behaviour (size-class edges, the slab/large
/// and large/huge limits, slice and page multiples), each tried as is.
pub const EDGE_SIZES: [usize; 24] = [
    1,
    8,
    9,
    16,
    17,
    128,
    129,
    1024,
    1025,
    4095,
    4096,
    4097,
    64 * KIB - 1,
    64 * KIB,
    64 * KIB + 1,
    128 * KIB + 1,
    256 * KIB,
    256 * KIB + 1,
    2 * MIB,
    2 * MIB + 1,
    16 * MIB - 4096,
    16 * MIB,
    16 * MIB + 1,
    32 * MIB,
];

/// A log-uniform size in `lo..hi` (powers of two: `1 << lo_log ..`).
fn log_uniform(inp: &mut Input, lo_log: u32, hi_log: u32) -> usize {
    let e = lo_log + u32::from(inp.u8()) % (hi_log - lo_log);
    let base = 1usize << e;
    base + inp.range(0, base - 1)
}

/// A request size, skewed the way programs ask: mostly small, some medium,
/// a few large (256 KiB..16 MiB) and huge (16..=`max_huge`), plus the edges.
/// Never 0 (the callers that want 0 ask for it themselves).
pub fn size(inp: &mut Input, max_huge: usize) -> usize {
    let b = inp.u8();
    match b {
        0..=127 => 1 + inp.u8() as usize,      // 1..=256 B
        128..=175 => log_uniform(inp, 8, 14),  // 256 B..16 KiB
        176..=207 => log_uniform(inp, 14, 19), // 16..512 KiB (slab/large edge)
        208..=231 => EDGE_SIZES[inp.u8() as usize % EDGE_SIZES.len()].min(max_huge),
        232..=249 => log_uniform(inp, 18, 24), // 256 KiB..16 MiB: large
        _ => inp.range(16 * MIB, max_huge.max(16 * MIB)), // huge
    }
}

/// An alignment: mostly 1..=16, sometimes any power of two up to 2 MiB.
pub fn align(inp: &mut Input) -> usize {
    let b = inp.u8();
    if b < 192 {
        1 << (b % 5)
    } else {
        1 << (b % 22)
    }
}

// ----- patterns ---------------------------------------------------------------

/// A 64-bit mixer (splitmix64's finaliser).
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A block's seed: from its address and a per-run counter, so two blocks
/// never carry the same bytes (an aliased or stale block shows).
pub fn seed_for(addr: usize, counter: u64) -> u64 {
    mix(addr as u64 ^ counter.rotate_left(40)) | 1
}

/// Length of the pattern's period: a prime, so blocks whose seeds differ
/// (mod it) never carry the same bytes at the same offsets.
const PERIOD: usize = 65_521;

/// The pattern, written out once: `PERIOD` pseudo-random bytes followed by
/// their continuation, so that any range of up to [`CHUNK`] bytes starting
/// at any phase is one slice of it. Blocks are filled with `memcpy` from
/// it and checked with `memcmp` against it: libc's, which coverage does
/// not instrument (a byte loop here costs a `__sanitizer_cov_trace_cmp`
/// call per comparison and was most of the targets' time).
fn pattern() -> &'static [u8; PERIOD + CHUNK] {
    static P: std::sync::OnceLock<[u8; PERIOD + CHUNK]> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        let mut b = [0u8; PERIOD + CHUNK];
        for (i, x) in b.iter_mut().enumerate() {
            let j = i % PERIOD;
            *x = (mix(j as u64 / 8) >> ((j % 8) * 8)) as u8;
        }
        b
    })
}

/// Longest range copied or compared in one go.
const CHUNK: usize = 256 * 1024;

/// Builds the pattern now (it is a static: no allocation). Call it before
/// taking allocation baselines so the first use does not fall in one.
pub fn init() {
    let _ = pattern();
}

#[inline]
fn phase(seed: u64, off: usize) -> usize {
    ((seed % PERIOD as u64) as usize + off % PERIOD) % PERIOD
}

/// The pattern byte at offset `off` of a block: depends on the offset, not
/// the address, so contents that move with `realloc` still match.
#[inline]
pub fn byte(seed: u64, off: usize) -> u8 {
    pattern()[phase(seed, off)]
}

/// The pattern bytes at offsets `off..off + n` of a block (`n` at most
/// 256 KiB).
pub fn pattern_slice(seed: u64, off: usize, n: usize) -> &'static [u8] {
    assert!(n <= CHUNK);
    let at = phase(seed, off);
    &pattern()[at..at + n]
}

/// Writes the pattern over offsets `lo..hi` of the block at `p`.
///
/// # Safety
/// `p + lo .. p + hi` is writable memory the caller owns.
pub unsafe fn fill(p: *mut u8, seed: u64, lo: usize, hi: usize) {
    let pat = pattern();
    let mut o = lo;
    while o < hi {
        let n = (hi - o).min(CHUNK);
        let at = phase(seed, o);
        // SAFETY: `o..o + n` is inside `lo..hi` (caller); the source slice
        // has `n` bytes from `at < PERIOD`.
        unsafe { core::ptr::copy_nonoverlapping(pat[at..at + n].as_ptr(), p.add(o), n) };
        o += n;
    }
}

/// The first offset in `lo..hi` where the block at `p` differs from its
/// pattern.
///
/// # Safety
/// `p + lo .. p + hi` is readable.
pub unsafe fn check(p: *const u8, seed: u64, lo: usize, hi: usize) -> Option<usize> {
    let pat = pattern();
    let mut o = lo;
    while o < hi {
        let n = (hi - o).min(CHUNK);
        let at = phase(seed, o);
        // SAFETY: inside `lo..hi` (caller).
        let got = unsafe { core::slice::from_raw_parts(p.add(o), n) };
        let want = &pat[at..at + n];
        if got != want {
            return Some(o + (0..n).find(|&i| got[i] != want[i]).unwrap());
        }
        o += n;
    }
    None
}

/// The first non-zero offset in `lo..hi`.
///
/// # Safety
/// `p + lo .. p + hi` is readable.
pub unsafe fn check_zero(p: *const u8, lo: usize, hi: usize) -> Option<usize> {
    static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
    let mut o = lo;
    while o < hi {
        let n = (hi - o).min(ZEROS.len());
        // SAFETY: inside `lo..hi` (caller).
        let got = unsafe { core::slice::from_raw_parts(p.add(o), n) };
        if got != &ZEROS[..n] {
            return Some(o + got.iter().position(|&b| b != 0).unwrap());
        }
        o += n;
    }
    None
}

/// Blocks up to this size carry the pattern in every byte.
pub const FULL: usize = 256 * KIB;
/// Larger blocks carry it in their first and last `EDGE` bytes...
pub const EDGE: usize = 16 * KIB;
/// ...and in the first `SAMPLE` bytes of every `STRIDE`-aligned window of
/// the address space they cover. Windows are placed by address, not by
/// offset, so memory that comes back in another block (at another offset,
/// after a free) has its sampled bytes at the same places: a zero check of
/// the new block reads exactly where the old one wrote.
pub const STRIDE: usize = 256 * KIB;
pub const SAMPLE: usize = 64;
/// Zeroed blocks are checked in full up to this size, and in their first
/// and last `ZERO_EDGE` bytes plus the sampled windows beyond it.
pub const ZERO_FULL: usize = MIB;
pub const ZERO_EDGE: usize = 256 * KIB;

/// Calls `f(lo, hi)` for the offset ranges of the block at `addr` of
/// `size` bytes that carry (or are checked for) bytes: everything up to
/// `full`, else head and tail `edge` bytes and the sampled windows.
/// Ranges are disjoint and ascending.
pub fn probes(addr: usize, size: usize, full: usize, edge: usize, mut f: impl FnMut(usize, usize)) {
    if size <= full {
        if size > 0 {
            f(0, size);
        }
        return;
    }
    f(0, edge);
    let end = size - edge;
    let mut w = (addr + edge).next_multiple_of(STRIDE);
    while w < addr + end {
        let lo = w - addr;
        f(lo, (lo + SAMPLE).min(end));
        w += STRIDE;
    }
    f(end, size);
}

/// Writes the pattern of a block into all its probed ranges.
///
/// # Safety
/// The block is live, writable and `size` bytes long.
pub unsafe fn fill_block(p: *mut u8, size: usize, seed: u64) {
    // SAFETY: probes lie inside `0..size`.
    probes(p as usize, size, FULL, EDGE, |lo, hi| unsafe {
        fill(p, seed, lo, hi)
    });
}

/// Checks the probed ranges of a block below `limit` (its size, or the
/// part kept by a resize); panics with `what` on the first bad byte.
///
/// `origin` is the address the block had when its pattern was written (the
/// probes are placed by that address), `p` where it is now.
///
/// # Safety
/// `p..p + min(size, limit)` is readable.
pub unsafe fn check_block(
    what: &str,
    origin: usize,
    p: *const u8,
    size: usize,
    seed: u64,
    limit: usize,
) {
    probes(origin, size, FULL, EDGE, |lo, hi| {
        let hi = hi.min(limit);
        if lo < hi {
            // SAFETY: inside the readable prefix (caller).
            if let Some(o) = unsafe { check(p, seed, lo, hi) } {
                // SAFETY: as above.
                let got = unsafe { p.add(o).read() };
                panic!(
                    "{what}: block {p:p} (size {size}, written at {origin:#x}) has {got:#04x} \
                     at offset {o}, expected {:#04x}",
                    byte(seed, o)
                );
            }
        }
    });
}

/// Checks that a fresh zeroed block reads as zeros: in full up to
/// [`ZERO_FULL`], else its head, tail and sampled windows.
///
/// # Safety
/// `p..p + size` is readable.
pub unsafe fn check_zeroed(what: &str, p: *const u8, size: usize) {
    probes(p as usize, size, ZERO_FULL, ZERO_EDGE, |lo, hi| {
        // SAFETY: inside the block (caller).
        if let Some(o) = unsafe { check_zero(p, lo, hi) } {
            // SAFETY: as above.
            let got = unsafe { p.add(o).read() };
            panic!("{what}: zeroed block {p:p} of {size} bytes has {got:#04x} at offset {o}");
        }
    });
}

// ----- the model of live blocks -------------------------------------------------

/// One live block as the model knows it.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    pub addr: usize,
    /// Requested size.
    pub size: usize,
    /// Bytes the allocator says are usable (at least `size`).
    pub usable: usize,
    pub align: usize,
    pub seed: u64,
    /// Free-form tag for the target (which API made it, which arena, ...).
    pub tag: u32,
}

/// Live blocks by address; insertion checks that the new block's usable
/// range overlaps no other's. Blocks are also kept in one list per tag, so
/// the input picks one in constant time (a walk of the map per operation
/// was most of the targets' time on long inputs).
#[derive(Default)]
pub struct Live {
    pub blocks: BTreeMap<usize, Block>,
    /// Addresses per tag, in the order the input picks from.
    order: Vec<Vec<usize>>,
    /// Where each address sits in `order[tag]`.
    index: HashMap<usize, usize>,
    /// Sum of requested sizes.
    pub bytes: usize,
    /// Sum of usable sizes.
    pub usable: usize,
    /// Blocks with more than 256 KiB usable (so not slab slots).
    pub big: usize,
}

impl Live {
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Live blocks with this tag.
    pub fn count(&self, tag: u32) -> usize {
        self.order.get(tag as usize).map_or(0, Vec::len)
    }

    /// Adds a block; panics if it overlaps a live one.
    pub fn insert(&mut self, b: Block) {
        let (lo, hi) = (b.addr, b.addr + b.usable.max(1));
        if let Some((_, prev)) = self.blocks.range(..=lo).next_back() {
            assert!(
                prev.addr + prev.usable.max(1) <= lo,
                "new block {lo:#x}..{hi:#x} ({} B asked) overlaps live block {:#x}..{:#x} ({} B asked)",
                b.size,
                prev.addr,
                prev.addr + prev.usable,
                prev.size
            );
        }
        if let Some((_, next)) = self.blocks.range(lo..).next() {
            assert!(
                hi <= next.addr,
                "new block {lo:#x}..{hi:#x} ({} B asked) overlaps live block {:#x}..{:#x} ({} B asked)",
                b.size,
                next.addr,
                next.addr + next.usable,
                next.size
            );
        }
        self.bytes += b.size;
        self.usable += b.usable;
        self.big += usize::from(b.usable > 256 * KIB);
        self.blocks.insert(b.addr, b);
        let t = b.tag as usize;
        if self.order.len() <= t {
            self.order.resize_with(t + 1, Vec::new);
        }
        self.index.insert(b.addr, self.order[t].len());
        self.order[t].push(b.addr);
    }

    /// A block chosen by the input, or None if there is none.
    pub fn pick(&self, inp: &mut Input) -> Option<Block> {
        if self.blocks.is_empty() {
            return None;
        }
        let mut i = inp.pick(self.blocks.len());
        for list in &self.order {
            if i < list.len() {
                return Some(self.blocks[&list[i]]);
            }
            i -= list.len();
        }
        unreachable!("the lists hold every block")
    }

    /// A block with this tag chosen by the input, or None.
    pub fn pick_tag(&self, inp: &mut Input, tag: u32) -> Option<Block> {
        let list = self.order.get(tag as usize).filter(|l| !l.is_empty())?;
        Some(self.blocks[&list[inp.pick(list.len())]])
    }

    /// Every live block with this tag.
    pub fn with_tag(&self, tag: u32) -> Vec<Block> {
        self.order
            .get(tag as usize)
            .map_or(Vec::new(), |l| l.iter().map(|a| self.blocks[a]).collect())
    }

    /// Removes the block at `addr`.
    pub fn remove(&mut self, addr: usize) -> Block {
        let b = self.blocks.remove(&addr).expect("live block");
        self.bytes -= b.size;
        self.usable -= b.usable;
        self.big -= usize::from(b.usable > 256 * KIB);
        let list = &mut self.order[b.tag as usize];
        let i = self.index.remove(&addr).expect("indexed");
        list.swap_remove(i);
        if let Some(&moved) = list.get(i) {
            self.index.insert(moved, i);
        }
        b
    }
}

/// Whether `PAGEWISE_TEST_FUZZ_TRACE` is set: the targets then print each
/// operation to stderr (to read what a reproducer does).
pub fn tracing() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("PAGEWISE_TEST_FUZZ_TRACE").is_some())
}

/// Prints to stderr when tracing.
#[macro_export]
macro_rules! trace {
    ($($t:tt)*) => {
        if $crate::tracing() {
            eprintln!($($t)*);
        }
    };
}
