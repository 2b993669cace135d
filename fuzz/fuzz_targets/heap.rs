//! `heap`: an owned `pagewise::Heap`, one per input, on one of four page
//! sources the input chooses: the real `SystemPages`, `SystemPages` with a
//! clock the input moves (`advance_ms`, so decay and the retention cap run
//! deterministically on real mappings), `FakePages` (memory from the C
//! allocator, clock moved by the input), or `SharedPages` (memfd-backed,
//! Linux), on which the `mesh` operation merges pages. The policy (decay,
//! cap, purge advice, reservation size) is chosen by the input too.
//!
//! An owned heap's counters are its own, so they are checked exactly after
//! every operation: `live_allocations` and `live_bytes` equal the model's,
//! `committed = live + free_slot_bytes + retained` (the identity
//! `stats.rs` documents), `retained <= retain_max_bytes`. After `trim()`
//! nothing is retained; after freeing everything and `trim()`, nothing is
//! committed, no segment or reservation is held; after the heap drops, its
//! source has unmapped every byte it mapped. Blocks are checked as in
//! `global_alloc` (alignment, usable size, overlap, patterns, the prefix
//! kept by a resize), through `Heap`'s methods and the `allocator_api2`
//! `Allocator` impl of `&Heap` (`grow`/`shrink` to another alignment, and
//! a growing `Vec`).

#![no_main]

use allocator_api2::alloc::Allocator;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
use libfuzzer_sys::fuzz_target;
use pagewise::{
    Config, FakePages, Heap, PageSource, Purge, SharedPages, Stats, SyscallCounts, SystemPages,
};
use pagewise_fuzz::{
    align, check, check_block, fill_block, pattern_slice, seed_for, size, trace, Block, Input,
    Live, KIB, MIB,
};
use std::alloc::Layout;

/// `SystemPages` with a clock the fuzzer moves: real mappings (cheap, and
/// purged pages really read back as zeros), deterministic time.
struct Clocked {
    pages: SystemPages,
    clock: AtomicU64,
}

// SAFETY: every call but the clock is forwarded to `SystemPages`, which
// upholds the contract; the clock is monotonic (it only moves forward).
unsafe impl PageSource for Clocked {
    fn map(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        self.pages.map(size, align)
    }
    unsafe fn unmap(&self, ptr: NonNull<u8>, size: usize) {
        // SAFETY: forwarded.
        unsafe { self.pages.unmap(ptr, size) }
    }
    unsafe fn purge(&self, ptr: NonNull<u8>, size: usize, how: Purge) -> bool {
        // SAFETY: forwarded.
        unsafe { self.pages.purge(ptr, size, how) }
    }
    fn now_ms(&self) -> u64 {
        self.clock.load(Relaxed)
    }
    fn syscalls(&self) -> SyscallCounts {
        self.pages.syscalls()
    }
}

static CLOCKED: Clocked = Clocked {
    pages: SystemPages::new(),
    clock: AtomicU64::new(0),
};
static FAKE: FakePages = FakePages::new();
static SYSTEM: SystemPages = SystemPages::new();
static SHARED: SharedPages = SharedPages::new();

const BUDGET: usize = 256 * MIB;
const MAX_LIVE: usize = 1024;

/// The source-specific part of a run.
trait Source: PageSource + Sync + 'static {
    fn advance(&self, ms: u64);
}
impl Source for Clocked {
    fn advance(&self, ms: u64) {
        self.clock.fetch_add(ms, Relaxed);
    }
}
impl Source for FakePages {
    fn advance(&self, ms: u64) {
        self.advance_ms(ms);
    }
}
impl Source for SystemPages {
    fn advance(&self, _ms: u64) {} // real time: nothing to move
}
impl Source for SharedPages {
    fn advance(&self, _ms: u64) {} // real time: nothing to move
}

struct Run<'h, S: Source> {
    heap: &'h Heap<&'static S>,
    src: &'static S,
    config: Config,
    live: Live,
    counter: u64,
    max_huge: usize,
}

impl<S: Source> Run<'_, S> {
    fn stats(&self) -> Stats {
        self.heap.stats()
    }

    /// The exact checks of an owned heap's counters.
    fn check_stats(&self, what: &str) {
        let s = self.stats();
        assert_eq!(
            (s.live_allocations, s.live_bytes),
            (self.live.len() as u64, self.live.usable as u64),
            "{what}: live allocations/bytes differ from the model"
        );
        assert_eq!(
            s.committed_bytes,
            s.live_bytes + s.free_slot_bytes + s.retained_bytes,
            "{what}: committed != live + free_slot_bytes + retained: {s:?}"
        );
        assert!(
            s.retained_bytes <= self.config.retain_max_bytes as u64,
            "{what}: retained {} over the cap {}",
            s.retained_bytes,
            self.config.retain_max_bytes
        );
        assert!(s.peak_committed_bytes >= s.committed_bytes, "{what}: {s:?}");
        assert!(
            s.syscalls.mapped_bytes >= s.reserved_bytes,
            "{what}: mapped {} < reserved {}",
            s.syscalls.mapped_bytes,
            s.reserved_bytes
        );
        let big = self.live.big as u64;
        assert!(s.large.count + s.huge.count >= big, "{what}: {s:?}");
    }

    fn admit(&mut self, what: &str, p: NonNull<[u8]>, size: usize, align: usize) {
        let a = p.cast::<u8>().as_ptr();
        assert_eq!(
            a as usize % align,
            0,
            "{what}: {a:p} not aligned to {align}"
        );
        assert!(p.len() >= size, "{what}: {} bytes for {size}", p.len());
        // SAFETY: a live block of this heap.
        let usable = unsafe { self.heap.usable_size(p.cast()) };
        assert_eq!(
            usable,
            p.len(),
            "{what}: usable_size differs from the returned length"
        );
        self.counter += 1;
        let b = Block {
            addr: a as usize,
            size,
            usable,
            align,
            seed: seed_for(a as usize, self.counter),
            tag: 0,
        };
        self.live.insert(b);
        // SAFETY: live, `size` bytes.
        unsafe { fill_block(a, size, b.seed) };
    }

    fn alloc(&mut self, inp: &mut Input) {
        let mut size = size(inp, self.max_huge);
        let align = align(inp);
        if inp.u8() >= 252 {
            size = 0;
        }
        if self.live.len() >= MAX_LIVE || self.live.bytes + size > BUDGET {
            return;
        }
        trace!("allocate {size} align {align}");
        let l = Layout::from_size_align(size, align).unwrap();
        let p = self.heap.allocate(l).expect("allocate well within memory");
        if size == 0 {
            assert_eq!(p.len(), 0, "a zero-size allocation takes no memory");
            assert_eq!(p.cast::<u8>().as_ptr() as usize % align, 0);
            return;
        }
        self.admit("allocate", p, size, align);
    }

    fn take(&mut self, inp: &mut Input, what: &str) -> Option<Block> {
        let b = self.live.pick(inp)?;
        // SAFETY: live block.
        unsafe { check_block(what, b.addr, b.addr as *const u8, b.size, b.seed, b.size) };
        Some(b)
    }

    fn free(&mut self, inp: &mut Input) {
        let Some(b) = self.take(inp, "deallocate") else {
            return;
        };
        self.free_block(b);
    }

    /// Frees a live block of the model (its contents already checked).
    fn free_block(&mut self, b: Block) {
        trace!("deallocate {:#x} ({} B)", b.addr, b.size);
        self.live.remove(b.addr);
        let l = Layout::from_size_align(b.size, b.align).unwrap();
        // SAFETY: live block of this heap with this layout, freed once.
        unsafe {
            self.heap
                .deallocate(NonNull::new(b.addr as *mut u8).unwrap(), l)
        };
    }

    /// `Heap::reallocate` (same alignment), or the `Allocator` trait's
    /// `grow`/`shrink` to a new layout (alignment may change).
    fn resize(&mut self, inp: &mut Input, trait_api: bool) {
        let Some(b) = self.take(inp, "resize") else {
            return;
        };
        let mut new_size = size(inp, self.max_huge);
        let new_align = if trait_api { align(inp) } else { b.align };
        if !trait_api && inp.u8() >= 248 {
            new_size = 0; // reallocate to 0 frees
        }
        if self.live.bytes - b.size + new_size > BUDGET {
            return;
        }
        trace!(
            "resize {:#x} {} -> {new_size} align {} -> {new_align} trait {trait_api}",
            b.addr,
            b.size,
            b.align
        );
        let ptr = NonNull::new(b.addr as *mut u8).unwrap();
        let old = Layout::from_size_align(b.size, b.align).unwrap();
        let new = Layout::from_size_align(new_size, new_align).unwrap();
        // SAFETY: live block with layout `old`; grow/shrink get sizes in
        // the direction they ask for.
        let p = unsafe {
            if !trait_api {
                self.heap.reallocate(ptr, old, new_size)
            } else if new_size >= b.size {
                Allocator::grow(&self.heap, ptr, old, new)
            } else {
                Allocator::shrink(&self.heap, ptr, old, new)
            }
        }
        .expect("resize well within memory");
        self.live.remove(b.addr);
        if new_size == 0 {
            assert_eq!(p.len(), 0, "reallocate to 0 frees the block");
            return;
        }
        let q = p.cast::<u8>().as_ptr();
        // SAFETY: the new block has at least `new_size` bytes.
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
        self.admit("resize", p, new_size, new_align);
    }

    /// A `Vec` in the heap, grown step by step (the `Allocator` grow path,
    /// in place or moving), its contents checked at the end.
    fn vec(&mut self, inp: &mut Input) {
        let steps = inp.u8() as usize % 32;
        self.counter += 1;
        let seed = seed_for(steps, self.counter);
        trace!("vec grown in {steps} steps");
        let mut v = allocator_api2::vec::Vec::new_in(self.heap);
        for _ in 0..steps {
            let n = match inp.u8() {
                0..=127 => inp.u8() as usize,
                128..=223 => inp.range(256, 16 * KIB),
                _ => inp.range(16 * KIB, 256 * KIB),
            };
            v.extend_from_slice(pattern_slice(seed, v.len(), n));
        }
        // SAFETY: the vector's own bytes.
        if let Some(o) = unsafe { check(v.as_ptr(), seed, 0, v.len()) } {
            panic!(
                "vec of {} bytes in the heap: wrong byte at offset {o}",
                v.len()
            );
        }
        drop(v);
    }

    fn trim(&mut self) {
        trace!("trim");
        self.heap.trim();
        let s = self.stats();
        assert_eq!(s.retained_bytes, 0, "trim leaves nothing retained: {s:?}");
    }

    /// Several OS pages' worth of one small size, then all but one block
    /// per OS page freed, the survivor at an offset that moves from page
    /// to page: the sparse pages a mesh pass merges (random frees rarely
    /// leave a size class with pages other than the one it carves from).
    fn sparse(&mut self, inp: &mut Input) {
        // Mostly small slots; sometimes slots larger than half an OS page,
        // whose pages mesh where the live ends of slots leave room.
        let size = if inp.u8() < 192 {
            inp.range(8, 512)
        } else {
            inp.range(512, 6000)
        };
        let l = Layout::from_size_align(size, 8).unwrap();
        // Blocks per OS page, by the size class's slot size.
        let slot = self.heap.allocate(l).expect("allocate well within memory");
        // SAFETY: allocated just above with `l`.
        unsafe { self.heap.deallocate(slot.cast(), l) };
        let per_page = (pagewise::layout::os_page() / slot.len()).max(1);
        let room = MAX_LIVE.saturating_sub(self.live.len());
        let n = (inp.range(2, 16) * per_page).min(room);
        let step = inp.range(1, per_page.max(2));
        trace!("sparse: {n} blocks of {size} B, survivors {step} apart");
        let mut made = Vec::with_capacity(n);
        for _ in 0..n {
            let p = self.heap.allocate(l).expect("allocate well within memory");
            self.admit("sparse", p, size, 8);
            made.push(p.cast::<u8>().as_ptr() as usize);
        }
        for (i, addr) in made.into_iter().enumerate() {
            if i % per_page != (i / per_page * step) % per_page {
                let b = *self.live.blocks.get(&addr).expect("made above");
                self.free_block(b);
            }
        }
    }

    /// A mesh pass (a no-op on sources that cannot share pages), then every
    /// live block's contents and usable size checked: a pass moves the
    /// live slots of one page into another's physical memory.
    fn mesh(&mut self) {
        // SAFETY: this thread is the only one touching the heap's memory.
        let joined = unsafe { self.heap.mesh() };
        trace!("mesh: {joined} pages joined");
        self.check_all();
    }

    fn advance(&mut self, inp: &mut Input) {
        let d = self.config.decay_ms;
        let ms = match inp.u8() % 5 {
            0 => 1,
            1 => d / 2,
            2 => d,
            3 => d + 1,
            _ => 10 * d + 1000,
        };
        trace!("advance {ms} ms");
        self.src.advance(ms);
    }

    fn check_all(&self) {
        for b in self.live.blocks.values() {
            // SAFETY: live blocks of this heap.
            unsafe {
                check_block("check", b.addr, b.addr as *const u8, b.size, b.seed, b.size);
                let u = self
                    .heap
                    .usable_size(NonNull::new(b.addr as *mut u8).unwrap());
                assert_eq!(u, b.usable, "usable size changed while live");
            }
        }
    }

    fn free_all(&mut self) {
        let blocks: Vec<Block> = self.live.blocks.values().copied().collect();
        for b in blocks {
            // SAFETY: live blocks, freed once.
            unsafe {
                check_block(
                    "free all",
                    b.addr,
                    b.addr as *const u8,
                    b.size,
                    b.seed,
                    b.size,
                );
                let l = Layout::from_size_align(b.size, b.align).unwrap();
                self.heap
                    .deallocate(NonNull::new(b.addr as *mut u8).unwrap(), l);
            }
            self.live.remove(b.addr);
        }
    }

    fn go(&mut self, inp: &mut Input) {
        while !inp.is_empty() {
            let op = inp.u8() % 18;
            match op {
                0..=4 => self.alloc(inp),
                5..=7 => self.free(inp),
                8 => self.resize(inp, false),
                9 => self.resize(inp, true),
                10 => self.trim(),
                11 | 12 => self.advance(inp),
                13 => self.check_all(),
                14 => self.vec(inp),
                15 => self.mesh(),
                16 => self.sparse(inp),
                _ => {
                    trace!("free all");
                    self.free_all();
                }
            }
            self.check_stats("after an operation");
        }
        self.check_all();
        self.free_all();
        self.heap.trim();
        let s = self.stats();
        assert_eq!(
            (
                s.live_bytes,
                s.committed_bytes,
                s.retained_bytes,
                s.segments,
                s.reserved_bytes
            ),
            (0, 0, 0, 0, 0),
            "everything freed and trimmed: {s:?}"
        );
    }
}

fn run<S: Source>(src: &'static S, config: Config, max_huge: usize, inp: &mut Input) {
    let mapped_before = src.syscalls().mapped_bytes;
    let heap = Heap::with_source(src, config);
    let mut r = Run {
        heap: &heap,
        src,
        config,
        live: Live::default(),
        counter: 0,
        max_huge,
    };
    r.go(inp);
    drop(r);
    drop(heap);
    assert_eq!(
        src.syscalls().mapped_bytes,
        mapped_before,
        "the heap's drop unmaps everything it mapped"
    );
}

fuzz_target!(|data: &[u8]| {
    pagewise_fuzz::init();
    let mut inp = Input::new(data);
    let c = inp.u8();
    let p = inp.u8();
    let mut config = Config {
        decay_ms: [0, 1, 100, 1000][(c & 3) as usize],
        retain_max_bytes: [0, 256 * KIB, 4 * MIB, 64 * MIB][((c >> 2) & 3) as usize],
        limit_bytes: usize::MAX,
        purge: if c & 16 == 0 {
            Purge::DontNeed
        } else {
            Purge::Free
        },
        background: false,
        reservation_bytes: if c & 32 == 0 { 1 << 30 } else { 64 * MIB },
        mesh: false, // the global allocator's switch; an owned heap meshes by its source
        // Huge pages and any setting added later: the defaults.
        ..Config::DEFAULT
    };
    trace!("source byte {p} config {config:?}");
    match p {
        // FakePages zeroes every mapping it makes (it takes them from the
        // C allocator, a 32 MiB reservation costs ~30 ms): rarely, with
        // small reservations and huge objects.
        255 => {
            config.reservation_bytes = 32 * MIB;
            run(&FAKE, config, 40 * MIB, &mut inp)
        }
        // Meshing: slab-sized objects matter, huge ones only cost time.
        224..=254 => run(&SHARED, config, 4 * MIB, &mut inp),
        p if p % 2 == 0 => run(&CLOCKED, config, 64 * MIB, &mut inp),
        _ => run(&SYSTEM, config, 64 * MIB, &mut inp),
    }
});
