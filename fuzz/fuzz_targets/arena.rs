//! `arena`: up to three `pagewise::Arena`s sharing one `BlockPool` (cap and
//! purge advice chosen by the input) on a page source used by nothing else
//! (`SystemPages` or `FakePages`), driven through the arena's own methods
//! and its `allocator_api2` `Allocator` impl.
//!
//! Checked: every allocation is aligned and overlaps no live allocation of
//! any arena; its pattern survives until its arena is reset or dropped (and
//! a `grow`/`shrink` keeps the prefix); slices copied or filled in read
//! back; each arena's `stats()` count allocations and requested bytes as
//! documented (reset clears them and keeps at most one block);
//! `allocated_bytes()` is the arena's block bytes; the pool never holds more
//! than its cap; every block the pool handed out fresh is one an arena
//! counted as fresh; and the source's mapped bytes are exactly the pooled
//! bytes plus the blocks the live arenas hold, down to 0 once the arenas
//! and the pool are gone.

#![no_main]

use allocator_api2::alloc::Allocator;
use core::alloc::Layout;
use core::ptr::NonNull;
use libfuzzer_sys::fuzz_target;
use pagewise::arena::{Arena, BlockPool, BlockPoolConfig};
use pagewise::{FakePages, PageSource, Purge, SystemPages};
use pagewise_fuzz::{
    check_block, fill_block, pattern_slice, seed_for, trace, Block, Input, Live, KIB, MIB,
};
use std::sync::Arc;

static FAKE: FakePages = FakePages::new();
static SYSTEM: SystemPages = SystemPages::new();

const ARENAS: usize = 3;
const BUDGET: usize = 96 * MIB;
const MAX_LIVE: usize = 2048;

/// A request size: mostly small, some block-sized, a few above the 4 MiB
/// block growth cap (a block of their own).
fn asize(inp: &mut Input) -> usize {
    match inp.u8() {
        0..=191 => 1 + inp.u8() as usize,
        192..=231 => inp.range(257, 64 * KIB),
        232..=247 => inp.range(64 * KIB, 4 * MIB + 64 * KIB),
        _ => inp.range(4 * MIB, 9 * MIB),
    }
}

/// An alignment: mostly small, some above the OS page (blocks are only
/// page-aligned, so these need padding).
fn aalign(inp: &mut Input) -> usize {
    let b = inp.u8();
    if b < 200 {
        1 << (b % 5)
    } else {
        1 << (b % 17)
    }
}

/// What the model expects of one arena's counters.
#[derive(Default, Clone, Copy)]
struct Expect {
    allocations: u64,
    requested: usize,
    resets: u64,
}

struct Run<S: PageSource + 'static> {
    src: &'static S,
    mapped_before: u64,
    pool: Arc<BlockPool<S>>,
    arenas: [Option<Arena<S>>; ARENAS],
    expect: [Expect; ARENAS],
    /// Fresh blocks counted by arenas already dropped.
    dropped_fresh: u64,
    live: Live,
    counter: u64,
}

impl<S: PageSource + 'static> Run<S> {
    fn arena(&mut self, i: usize) -> &Arena<S> {
        if self.arenas[i].is_none() {
            self.arenas[i] = Some(Arena::with_pool(self.pool.clone()));
            self.expect[i] = Expect::default();
        }
        self.arenas[i].as_ref().unwrap()
    }

    /// Records a fresh allocation of arena `i` and writes its pattern.
    fn admit(&mut self, what: &str, i: usize, p: *mut u8, size: usize, align: usize) -> Block {
        assert_eq!(
            p as usize % align,
            0,
            "{what}: {p:p} not aligned to {align}"
        );
        self.counter += 1;
        let b = Block {
            addr: p as usize,
            size,
            usable: size,
            align,
            seed: seed_for(p as usize, self.counter),
            tag: i as u32,
        };
        if size > 0 {
            self.live.insert(b);
            // SAFETY: fresh arena memory of `size` bytes.
            unsafe { fill_block(p, size, b.seed) };
        }
        b
    }

    fn room(&self, size: usize) -> bool {
        self.live.len() < MAX_LIVE && self.live.bytes + size <= BUDGET
    }

    fn alloc(&mut self, inp: &mut Input, i: usize, trait_api: bool) {
        let size = if inp.u8() >= 250 { 0 } else { asize(inp) };
        let align = aalign(inp);
        if !self.room(size) {
            return;
        }
        trace!("arena {i}: alloc {size} align {align} trait {trait_api}");
        let l = Layout::from_size_align(size, align).unwrap();
        let a = self.arena(i);
        let p = if trait_api {
            let s = Allocator::allocate(&a, l).expect("arena allocate");
            assert_eq!(s.len(), size, "allocate returns the size asked for");
            s.cast::<u8>()
        } else {
            a.try_alloc_layout(l).expect("arena try_alloc_layout")
        };
        self.expect[i].allocations += 1;
        self.expect[i].requested += size;
        self.admit("alloc", i, p.as_ptr(), size, align);
    }

    /// A live allocation of arena `i`, if it has one.
    fn pick_of(&self, inp: &mut Input, i: usize) -> Option<Block> {
        let b = self.live.pick_tag(inp, i as u32)?;
        // SAFETY: live allocation.
        unsafe {
            check_block(
                "arena block",
                b.addr,
                b.addr as *const u8,
                b.size,
                b.seed,
                b.size,
            )
        };
        Some(b)
    }

    fn dealloc(&mut self, inp: &mut Input, i: usize) {
        let Some(b) = self.pick_of(inp, i) else {
            return;
        };
        trace!("arena {i}: deallocate {:#x} ({} B)", b.addr, b.size);
        self.live.remove(b.addr);
        let a = self.arenas[i].as_ref().unwrap();
        let l = Layout::from_size_align(b.size, b.align).unwrap();
        // SAFETY: a live allocation of this arena with this layout.
        unsafe { Allocator::deallocate(&a, NonNull::new(b.addr as *mut u8).unwrap(), l) };
    }

    fn resize(&mut self, inp: &mut Input, i: usize, grow: bool) {
        let Some(b) = self.pick_of(inp, i) else {
            return;
        };
        let s = asize(inp);
        let new_size = if grow {
            b.size + s
        } else {
            b.size - (s % (b.size + 1))
        };
        let new_align = aalign(inp);
        if grow && !self.room(s) {
            return;
        }
        trace!(
            "arena {i}: {} {:#x} {} -> {new_size} align {} -> {new_align}",
            if grow { "grow" } else { "shrink" },
            b.addr,
            b.size,
            b.align
        );
        let a = self.arenas[i].as_ref().unwrap();
        let old = Layout::from_size_align(b.size, b.align).unwrap();
        let new = Layout::from_size_align(new_size, new_align).unwrap();
        let ptr = NonNull::new(b.addr as *mut u8).unwrap();
        // SAFETY: a live allocation of this arena with layout `old`; sizes
        // go the way each call asks.
        let r = unsafe {
            if grow {
                Allocator::grow(&a, ptr, old, new)
            } else {
                Allocator::shrink(&a, ptr, old, new)
            }
        }
        .expect("arena resize");
        assert_eq!(r.len(), new_size, "resize returns the new size");
        let q = r.cast::<u8>().as_ptr();
        if q as usize == b.addr {
            // In place: grow adds the difference to the requested bytes.
            if grow {
                self.expect[i].requested += new_size - b.size;
            }
        } else {
            // Moved: a new allocation (the old one stays until reset).
            self.expect[i].allocations += 1;
            self.expect[i].requested += new_size;
        }
        // SAFETY: `q` holds at least min(old, new) bytes.
        unsafe {
            check_block(
                "resize kept",
                b.addr,
                q,
                b.size,
                b.seed,
                b.size.min(new_size),
            )
        };
        self.live.remove(b.addr);
        self.admit("resize", i, q, new_size, new_align);
    }

    /// `alloc_slice_copy` or `alloc_slice_fill_with` of pattern bytes.
    fn slice(&mut self, inp: &mut Input, i: usize, copy: bool) {
        let n = asize(inp).min(256 * KIB);
        if !self.room(n) {
            return;
        }
        trace!("arena {i}: slice of {n} copy {copy}");
        self.counter += 1;
        let seed = seed_for(n, self.counter);
        let a = self.arena(i);
        let src = pattern_slice(seed, 0, n);
        let p = if copy {
            a.alloc_slice_copy(src).as_mut_ptr()
        } else {
            a.alloc_slice_fill_with(n, |o| src[o]).as_mut_ptr()
        };
        // SAFETY: the slice is `n` bytes of live arena memory.
        unsafe { check_block("slice contents", p as usize, p, n, seed, n) };
        self.expect[i].allocations += 1;
        self.expect[i].requested += n;
        if n > 0 {
            let b = Block {
                addr: p as usize,
                size: n,
                usable: n,
                align: 1,
                seed,
                tag: i as u32,
            };
            self.live.insert(b);
            // SAFETY: as above: the pattern, placed by this address.
            unsafe { fill_block(p, n, seed) };
        }
    }

    /// Checks and forgets every allocation of arena `i`.
    fn retire(&mut self, i: usize) {
        let mine = self.live.with_tag(i as u32);
        for b in mine {
            // SAFETY: live until the reset or drop that follows.
            unsafe {
                check_block(
                    "arena end",
                    b.addr,
                    b.addr as *const u8,
                    b.size,
                    b.seed,
                    b.size,
                )
            };
            self.live.remove(b.addr);
        }
    }

    fn reset(&mut self, i: usize) {
        if self.arenas[i].is_none() {
            return;
        }
        trace!("arena {i}: reset");
        self.retire(i);
        let a = self.arenas[i].as_mut().unwrap();
        a.reset();
        let s = a.stats();
        let e = &mut self.expect[i];
        e.allocations = 0;
        e.requested = 0;
        e.resets += 1;
        assert!(
            s.blocks <= 1,
            "reset keeps at most the current block: {s:?}"
        );
    }

    fn drop_arena(&mut self, i: usize, elsewhere: bool) {
        let Some(a) = self.arenas[i].take() else {
            return;
        };
        trace!("arena {i}: drop (on another thread: {elsewhere})");
        self.retire(i);
        self.dropped_fresh += a.stats().fresh_blocks;
        if elsewhere {
            std::thread::scope(|s| {
                s.spawn(move || drop(a));
            });
        } else {
            drop(a);
        }
    }

    fn check_counts(&self) {
        let mut held = 0u64;
        let mut fresh = self.dropped_fresh;
        for (i, a) in self.arenas.iter().enumerate() {
            let Some(a) = a else { continue };
            let s = a.stats();
            let e = self.expect[i];
            assert_eq!(
                (s.allocations, s.requested_bytes, s.resets),
                (e.allocations, e.requested, e.resets),
                "arena {i}: allocations, requested bytes, resets (got vs model)"
            );
            assert_eq!(
                a.allocated_bytes(),
                s.block_bytes,
                "arena {i}: allocated_bytes"
            );
            assert!(s.blocks > 0 || s.block_bytes == 0, "arena {i}: {s:?}");
            held += s.block_bytes as u64;
            fresh += s.fresh_blocks;
        }
        let p = self.pool.stats();
        assert!(
            p.pooled_bytes <= self.pool.config().cap_bytes,
            "pool holds {} over its cap {}",
            p.pooled_bytes,
            self.pool.config().cap_bytes
        );
        assert_eq!(p.fresh_blocks, fresh, "pool's fresh blocks vs the arenas'");
        let mapped = self.src.syscalls().mapped_bytes - self.mapped_before;
        assert_eq!(
            mapped,
            p.pooled_bytes as u64 + held,
            "mapped bytes = pooled + held by arenas: {p:?}"
        );
    }

    fn go(&mut self, inp: &mut Input) {
        while !inp.is_empty() {
            let op = inp.u8();
            let i = (op >> 4) as usize % ARENAS;
            match op % 16 {
                0..=3 => self.alloc(inp, i, false),
                4 => self.alloc(inp, i, true),
                5 => self.dealloc(inp, i),
                6 | 7 => self.resize(inp, i, true),
                8 => self.resize(inp, i, false),
                9 => self.slice(inp, i, true),
                10 => self.slice(inp, i, false),
                11 => self.reset(i),
                12 => {
                    let elsewhere = inp.u8() & 1 == 1;
                    self.drop_arena(i, elsewhere)
                }
                13 => {
                    let n = asize(inp);
                    trace!("arena {i}: reserve {n}");
                    self.arena(i).reserve(n);
                }
                14 => {
                    trace!("pool trim");
                    self.pool.trim();
                    assert_eq!(self.pool.stats().pooled_bytes, 0, "trim empties the pool");
                }
                _ => {
                    for b in self.live.blocks.values() {
                        // SAFETY: live allocations.
                        unsafe {
                            check_block(
                                "check",
                                b.addr,
                                b.addr as *const u8,
                                b.size,
                                b.seed,
                                b.size,
                            )
                        };
                    }
                }
            }
            self.check_counts();
        }
        for i in 0..ARENAS {
            self.drop_arena(i, false);
        }
        self.check_counts();
    }
}

fn run<S: PageSource + 'static>(src: &'static S, config: BlockPoolConfig, inp: &mut Input) {
    let mapped_before = src.syscalls().mapped_bytes;
    let pool = Arc::new(BlockPool::new(src, config));
    let mut r = Run {
        src,
        mapped_before,
        pool: pool.clone(),
        arenas: [None, None, None],
        expect: [Expect::default(); ARENAS],
        dropped_fresh: 0,
        live: Live::default(),
        counter: 0,
    };
    r.go(inp);
    drop(r);
    drop(pool);
    assert_eq!(
        src.syscalls().mapped_bytes,
        mapped_before,
        "arenas and pool gone: every block unmapped"
    );
}

fuzz_target!(|data: &[u8]| {
    pagewise_fuzz::init();
    let mut inp = Input::new(data);
    let c = inp.u8();
    let config = BlockPoolConfig {
        cap_bytes: [
            64 * MIB,
            0,
            64 * KIB,
            MIB,
            8 * MIB,
            16 * MIB,
            128 * KIB,
            4 * MIB,
        ][(c & 7) as usize],
        purge: if c & 8 == 0 {
            Purge::Free
        } else {
            Purge::DontNeed
        },
    };
    trace!("pool {config:?} fake {}", c & 16 != 0);
    if c & 16 == 0 {
        run(&SYSTEM, config, &mut inp);
    } else {
        run(&FAKE, config, &mut inp);
    }
});
