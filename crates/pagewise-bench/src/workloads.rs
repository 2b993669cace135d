//! The workload suite: allocation patterns of real programs.
//!
//! Every workload allocates through the global allocator (whichever the
//! worker binary installed) and keeps its own bookkeeping in [`MmapVec`]s
//! mapped before the baseline RSS is read, so RSS growth is the allocator's
//! and the objects'. A workload returns the objects still live at its end
//! (its "survivors"): the worker measures RSS, live bytes and the page floor
//! with them in place, waits the idle second, then frees them.

use crate::util::{free_obj, new_obj, pages_touched, touch_pages, MmapVec, Obj, ProcReader, Rng};
use serde::{Deserialize, Serialize};
use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

/// Names of the workloads, in suite order.
pub const WORKLOADS: &[&str] = &[
    "churn",
    "arena-on-malloc",
    "block-cohorts",
    "phases",
    "survivors-clustered",
    "survivors-sparse",
    "survivors-random",
    "threads",
    "mixed",
    "arena-churn",
    "jit-pools",
    "idle-one-thread",
    "idle-threads-exit",
    "idle-handoff",
    "idle-handoff-blocked",
    "idle-thread-rounds",
    "big-buffers",
    "redis",
];

/// Workloads whose figure is the RSS after the idle period (programs that
/// free memory and go quiet): with `--quick` only these wait the idle period, and the
/// RSS charts show their idle tail.
pub const IDLE_FOCUSED: &[&str] = &[
    "idle-one-thread",
    "idle-threads-exit",
    "idle-handoff",
    "idle-handoff-blocked",
    "idle-thread-rounds",
    "redis",
];

/// Whether `name` is in [`IDLE_FOCUSED`].
pub fn idle_focused(name: &str) -> bool {
    IDLE_FOCUSED.contains(&name)
}

/// Workloads whose figures do not depend on the global allocator (their
/// memory comes from pagewise's own page sources, and what they report is
/// accounting): the runner runs them under one allocator only, pagewise's
/// worker if it is in `--alloc`, and the report says so.
pub const ALLOCATOR_INDEPENDENT: &[&str] = &["jit-pools"];

/// Whether `name` is in [`ALLOCATOR_INDEPENDENT`].
pub fn allocator_independent(name: &str) -> bool {
    ALLOCATOR_INDEPENDENT.contains(&name)
}

/// One line of description per workload (for `--help` and the report).
pub fn describe(name: &str) -> &'static str {
    match name {
        "churn" => "one object allocated and freed N times in a row, at 64 B, 4 KiB, 64 KiB, 256 KiB, 1 MiB (an allocator that unmaps an emptied page pays system calls on every pair)",
        "arena-on-malloc" => "a language runtime's small-object arena (31 classes) built on 4 KiB blocks from malloc, each freed when it empties",
        "block-cohorts" => "a garbage collector's blocks of 256 KiB-1 MiB taken for cohorts of objects and dropped, over a ~35 MB live set",
        "phases" => "three phases of 16-512 B objects, most freed: survivors at random, in clustered runs, and one per OS page",
        "survivors-clustered" => "16-512 B objects, one run of 256 consecutive allocations in ten kept through the idle period, the rest freed",
        "survivors-sparse" => "16-512 B objects, one kept per OS page through the idle period, the rest freed",
        "survivors-random" => "ten phases of 16-512 B objects, after each one object kept, chosen at random, on each 4 KiB page holding none yet, the rest freed; the survivors stay through the idle period",
        "threads" => "larson-like server: slot arrays handed on each round, every slot replaced once, every object freed by the other thread; 2 then 4 threads",
        "mixed" => "alloc-test shape: short-lived objects, Pareto sizes (16 B..64 KiB), some realloc",
        "arena-churn" => "short-lived arenas of 1-64 MiB (4 alive) filled and dropped: pagewise Arena, bumpalo, arena on malloc",
        "jit-pools" => "a JIT compiler's trace of code-sized requests through pagewise::pool, first/best/worst fit; over-allocation and waste",
        "idle-one-thread" => "one thread allocates 8,192 blocks of 6,000 B, writes them, frees them all, then idles",
        "idle-threads-exit" => "eight threads each allocate, write and free 8,192 blocks of 6,000 B and exit; the main thread idles",
        "idle-handoff" => "a producer thread allocates 200 MiB of 1 KiB objects and exits; the main thread frees them, then idles",
        "idle-handoff-blocked" => "as idle-handoff, but the producer stays alive, blocked, through the idle period",
        "idle-thread-rounds" => "16 rounds of 8 threads that allocate 16 B-16 KiB objects, free half, leave half to the next round's threads, and exit; the main thread frees the rest and idles",
        "big-buffers" => "20 live buffers of 5-25 MiB, one replaced at random 2,000 times, every page of each new buffer written: wall time, peak RSS, page faults",
        "redis" => "redis-server (if installed) filled by six SET passes of 1 KiB, 32 B, 4 KiB, 256 B, 64 B and 2 KiB values, 80 % of keys deleted, then idle: redis's mem_fragmentation_ratio, and the same with the memory the server costs the machine",
        _ => "unknown workload",
    }
}

/// How big a run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    /// Seconds-long sanity sizes for tests.
    Tiny,
    /// `--quick`: the whole suite in about a minute on 2 cores.
    Quick,
    /// The full suite.
    Full,
}

impl Scale {
    /// Parses `tiny`, `quick` or `full`.
    pub fn parse(s: &str) -> Option<Scale> {
        match s {
            "tiny" => Some(Scale::Tiny),
            "quick" => Some(Scale::Quick),
            "full" => Some(Scale::Full),
            _ => None,
        }
    }

    /// The name `parse` accepts.
    pub fn name(self) -> &'static str {
        match self {
            Scale::Tiny => "tiny",
            Scale::Quick => "quick",
            Scale::Full => "full",
        }
    }

    pub(crate) fn pick<T>(self, tiny: T, quick: T, full: T) -> T {
        match self {
            Scale::Tiny => tiny,
            Scale::Quick => quick,
            Scale::Full => full,
        }
    }
}

/// A measured sub-part of a workload (a size, a phase, a thread count).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Part {
    /// What the part is.
    pub name: String,
    /// Allocator operations (allocations + frees + reallocs) in the part.
    pub ops: u64,
    /// Wall time of the part in nanoseconds.
    pub ns: u64,
    /// RSS at the end of the part, if read.
    pub rss: Option<u64>,
    /// Requested bytes live at the end of the part, if known.
    pub live_bytes: Option<u64>,
    /// Pages holding a live byte at the end of the part, if computed.
    pub floor_pages: Option<u64>,
    /// Peak RSS (`VmHWM`, reset when the part started) during the part, if
    /// the workload measured it (parts that are compared with each other).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss: Option<u64>,
    /// Named figures of the part that are not times or RSS (e.g. a pool's
    /// over-allocation factor and waste bytes), reported in a table of their own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub figures: Vec<(String, f64)>,
}

/// What a workload reports while it runs.
pub struct Rec {
    /// Total allocator operations.
    pub ops: u64,
    /// Sub-parts.
    pub parts: Vec<Part>,
    /// Named extra figures (e.g. arena mallocs).
    pub extra: Vec<(String, f64)>,
    /// Phase marks: (ms since the workload started, label).
    pub marks: Vec<(f64, String)>,
    start: Instant,
    proc: Option<ProcReader>,
    /// What ends the threads a workload leaves alive through the idle
    /// period (a blocked producer): run once RSS after idle is read, or
    /// when the recorder is dropped, so no caller leaves them behind.
    lingering: Vec<Box<dyn FnOnce()>>,
}

impl Rec {
    /// A recorder starting now.
    pub fn new() -> Rec {
        Rec {
            ops: 0,
            parts: Vec::with_capacity(16),
            extra: Vec::with_capacity(8),
            marks: Vec::with_capacity(16),
            start: Instant::now(),
            proc: ProcReader::open().ok(),
            lingering: Vec::new(),
        }
    }

    /// Keeps something alive past the workload's end (through the idle
    /// period); `end` releases it and waits for it.
    pub(crate) fn linger(&mut self, end: impl FnOnce() + 'static) {
        self.lingering.push(Box::new(end));
    }

    /// Ends what the workload left alive (see `Rec::linger`).
    pub fn end_lingering(&mut self) {
        for end in self.lingering.drain(..) {
            end();
        }
    }

    pub(crate) fn mark(&mut self, label: &str) {
        let ms = self.start.elapsed().as_secs_f64() * 1e3;
        self.marks.push((ms, label.to_string()));
    }

    pub(crate) fn rss(&mut self) -> Option<u64> {
        self.proc.as_mut().map(|p| p.rss())
    }

    /// Resets the peak-RSS mark so that [`Rec::peak`] is the peak from now
    /// on; the worker's whole-run peak then takes the parts' peaks into
    /// account. Returns false if the kernel refused.
    pub(crate) fn reset_peak(&mut self) -> bool {
        self.proc.is_some() && crate::util::reset_hwm()
    }

    pub(crate) fn peak(&mut self) -> Option<u64> {
        self.proc.as_mut().map(|p| p.hwm())
    }
}

impl Default for Rec {
    fn default() -> Self {
        Rec::new()
    }
}

impl Drop for Rec {
    fn drop(&mut self) {
        self.end_lingering();
    }
}

/// Runs workload `name` at `scale`; returns the survivors.
pub fn run(name: &str, scale: Scale, seed: u64, rec: &mut Rec) -> Result<MmapVec<Obj>, String> {
    let mut rng = Rng::new(seed);
    match name {
        "churn" => Ok(churn(scale, rec)),
        "arena-on-malloc" => Ok(arena_on_malloc(scale, &mut rng, rec)),
        "block-cohorts" => Ok(block_cohorts(scale, &mut rng, rec)),
        "phases" => Ok(phases(scale, &mut rng, rec)),
        "survivors-clustered" => Ok(survivors("clustered", scale, &mut rng, rec)),
        "survivors-sparse" => Ok(survivors("sparse", scale, &mut rng, rec)),
        "survivors-random" => Ok(survivors_random(scale, &mut rng, rec)),
        "threads" => Ok(threads(scale, seed, rec)),
        "mixed" => Ok(mixed(scale, &mut rng, rec)),
        "arena-churn" => Ok(arena_churn(scale, seed, rec)),
        "jit-pools" => Ok(jit_pools(scale, rec)),
        "idle-one-thread" => Ok(crate::idle::one_thread(scale, rec)),
        "idle-threads-exit" => Ok(crate::idle::threads_exit(scale, rec)),
        "idle-handoff" => Ok(crate::idle::handoff(scale, false, rec)),
        "idle-handoff-blocked" => Ok(crate::idle::handoff(scale, true, rec)),
        "idle-thread-rounds" => Ok(crate::idle::thread_rounds(scale, seed, rec)),
        "big-buffers" => Ok(crate::big_buffers::run(scale, seed, rec)),
        "redis" => Err("redis runs redis-server, not a worker (the runner starts it)".into()),
        _ => Err(format!(
            "unknown workload `{name}` (known: {})",
            WORKLOADS.join(", ")
        )),
    }
}

pub(crate) fn part_since(rec: &mut Rec, name: &str, ops: u64, t: Instant) {
    let ns = t.elapsed().as_nanos() as u64;
    let rss = rec.rss();
    rec.parts.push(Part {
        name: name.to_string(),
        ops,
        ns,
        rss,
        ..Part::default()
    });
}

// ---------------------------------------------------------------------------
// 1. churn

fn churn(scale: Scale, rec: &mut Rec) -> MmapVec<Obj> {
    let n = scale.pick(500, 50_000, 200_000);
    for (size, label) in [
        (64usize, "64 B"),
        (4096, "4 KiB"),
        (65536, "64 KiB"),
        (256 << 10, "256 KiB"),
        (1 << 20, "1 MiB"),
    ] {
        rec.mark(label);
        let t = Instant::now();
        for _ in 0..n {
            let o = new_obj(size, 1);
            free_obj(o);
        }
        rec.ops += 2 * n;
        part_since(rec, label, 2 * n, t);
    }
    MmapVec::with_capacity(1)
}

// ---------------------------------------------------------------------------
// 2. arena-on-malloc

/// Block sizes of the arena's 31 classes: 16 B to 512 B in 16 B steps, with
/// 496 B folded into 512 B (QuickJS 2026-06-04: "31 size classes from 16 to
/// 512 bytes").
fn arena_class_size(c: usize) -> usize {
    if c < 30 {
        16 * (c + 1)
    } else {
        512
    }
}

const ARENA_BYTES: usize = 4096;
const ARENA_CLASSES: usize = 31;

#[derive(Clone, Copy, Default)]
struct Arena {
    base: usize,
    class: u32,
    live: u32,
    bump: u32,
    /// Offset + 1 of the first free block (0: none).
    free_head: u32,
    partial: bool,
}

/// A QuickJS-like small-block allocator: blocks are carved from 4 KiB arenas
/// taken from malloc, and an arena is freed as soon as its last block is.
struct SmallArena {
    arenas: MmapVec<Arena>,
    free_ids: MmapVec<u32>,
    partial: Vec<MmapVec<u32>>,
    arena_mallocs: u64,
    arena_frees: u64,
}

impl SmallArena {
    fn new(max_arenas: usize) -> SmallArena {
        SmallArena {
            arenas: MmapVec::with_capacity(max_arenas),
            free_ids: MmapVec::with_capacity(max_arenas),
            partial: (0..ARENA_CLASSES)
                .map(|_| MmapVec::with_capacity(max_arenas))
                .collect(),
            arena_mallocs: 0,
            arena_frees: 0,
        }
    }

    fn layout() -> Layout {
        Layout::from_size_align(ARENA_BYTES, 16).expect("layout")
    }

    /// Allocates a block of class `c`; returns (arena id, address).
    fn alloc(&mut self, c: usize) -> (u32, usize) {
        let bsize = arena_class_size(c) as u32;
        let id = match self.partial[c].as_slice().last() {
            Some(&id) => id,
            None => {
                // SAFETY: non-zero layout.
                let p = unsafe { alloc(Self::layout()) };
                if p.is_null() {
                    handle_alloc_error(Self::layout());
                }
                self.arena_mallocs += 1;
                let a = Arena {
                    base: p as usize,
                    class: c as u32,
                    partial: true,
                    ..Arena::default()
                };
                let id = match self.free_ids.pop() {
                    Some(id) => {
                        self.arenas.as_mut_slice()[id as usize] = a;
                        id
                    }
                    None => {
                        self.arenas.push(a);
                        (self.arenas.len() - 1) as u32
                    }
                };
                self.partial[c].push(id);
                id
            }
        };
        let a = &mut self.arenas.as_mut_slice()[id as usize];
        let off = if a.free_head != 0 {
            let off = a.free_head - 1;
            // SAFETY: a free block of this arena holds the next link.
            a.free_head = unsafe { ((a.base + off as usize) as *const u32).read() };
            off
        } else {
            let off = a.bump;
            a.bump += bsize;
            off
        };
        a.live += 1;
        let full = a.free_head == 0 && a.bump + bsize > ARENA_BYTES as u32;
        if full {
            a.partial = false;
            self.partial[c].pop();
        }
        let addr = a.base + off as usize;
        // SAFETY: the block is inside the arena; a program initialises it.
        unsafe { core::ptr::write_bytes(addr as *mut u8, 0x5a, bsize as usize) };
        (id, addr)
    }

    fn free(&mut self, id: u32, addr: usize) {
        let a = &mut self.arenas.as_mut_slice()[id as usize];
        let c = a.class as usize;
        let off = (addr - a.base) as u32;
        // SAFETY: the block is ours and dead; its first 4 bytes become the link.
        unsafe { (addr as *mut u32).write(a.free_head) };
        a.free_head = off + 1;
        a.live -= 1;
        if a.live == 0 {
            // Free-on-empty: QuickJS's policy, which drains a slab allocator's pages.
            let base = a.base;
            let was_partial = a.partial;
            // SAFETY: the arena came from `alloc(layout())` and is now empty.
            unsafe { dealloc(base as *mut u8, Self::layout()) };
            self.arena_frees += 1;
            if was_partial {
                let list = &mut self.partial[c];
                let pos = list
                    .as_slice()
                    .iter()
                    .rposition(|&x| x == id)
                    .expect("partial arena listed");
                let last = list.pop().expect("non-empty");
                if pos < list.len() {
                    list.as_mut_slice()[pos] = last;
                }
            }
            self.free_ids.push(id);
        } else if !a.partial {
            a.partial = true;
            self.partial[c].push(id);
        }
    }
}

fn arena_on_malloc(scale: Scale, rng: &mut Rng, rec: &mut Rec) -> MmapVec<Obj> {
    // A call-stack-like driver: frames of short-lived objects are pushed and
    // popped in a random walk over the depth, so every class's live count
    // keeps crossing zero (all classes drain whenever the stack empties).
    let steps: u64 = scale.pick(2_000, 1_000_000, 6_000_000);
    let max_depth = 12usize;
    let max_objs_per_frame = 48usize;
    let mut sa = SmallArena::new(max_depth * max_objs_per_frame + 64);
    let mut objs: MmapVec<(u32, usize)> = MmapVec::with_capacity(max_depth * max_objs_per_frame);
    let mut frames: MmapVec<usize> = MmapVec::with_capacity(max_depth + 1);
    let t = Instant::now();
    let mut ops = 0u64;
    for _ in 0..steps {
        let push = frames.is_empty() || (frames.len() < max_depth && rng.below(2) == 0);
        if push {
            frames.push(objs.len());
            let n = rng.range(1, max_objs_per_frame as u64) as usize;
            // Each frame uses one to three classes, small ones more often.
            let k = rng.range(1, 3) as usize;
            let mut classes = [0usize; 3];
            for c in classes.iter_mut().take(k) {
                let u = rng.unit();
                *c = ((u * u) * ARENA_CLASSES as f64) as usize % ARENA_CLASSES;
            }
            for i in 0..n {
                let (id, addr) = sa.alloc(classes[i % k]);
                objs.push((id, addr));
            }
            ops += n as u64;
        } else {
            let start = frames.pop().expect("frame");
            while objs.len() > start {
                let (id, addr) = objs.pop().expect("obj");
                sa.free(id, addr);
                ops += 1;
            }
        }
    }
    while let Some((id, addr)) = objs.pop() {
        sa.free(id, addr);
        ops += 1;
    }
    rec.ops += ops + sa.arena_mallocs + sa.arena_frees;
    part_since(rec, "blocks", ops, t);
    rec.extra
        .push(("arena_mallocs".to_string(), sa.arena_mallocs as f64));
    rec.extra
        .push(("arena_frees".to_string(), sa.arena_frees as f64));
    MmapVec::with_capacity(1)
}

// ---------------------------------------------------------------------------
// 3. block-cohorts

fn block_cohorts(scale: Scale, rng: &mut Rng, rec: &mut Rec) -> MmapVec<Obj> {
    let live_target: usize = scale.pick(4 << 20, 35 << 20, 35 << 20);
    let cohort_bytes: usize = scale.pick(2 << 20, 16 << 20, 16 << 20);
    let cohorts: usize = scale.pick(4, 150, 1500);
    let block = |rng: &mut Rng| (rng.range(256, 1024) as usize) << 10;
    let mut live: MmapVec<Obj> = MmapVec::with_capacity(live_target / (256 << 10) + 8);
    let mut cohort: MmapVec<Obj> = MmapVec::with_capacity(cohort_bytes / (256 << 10) + 8);
    let t = Instant::now();
    let mut ops = 0u64;
    let mut live_bytes = 0usize;
    rec.mark("live set");
    while live_bytes < live_target {
        let o = new_obj(block(rng), 1);
        touch_pages(o);
        live_bytes += o.size;
        live.push(o);
        ops += 1;
    }
    rec.mark("cohorts");
    for _ in 0..cohorts {
        // Promote a cohort: blocks filled (every page written) ...
        let mut b = 0;
        while b < cohort_bytes {
            let o = new_obj(block(rng), 1);
            touch_pages(o);
            b += o.size;
            cohort.push(o);
            ops += 1;
        }
        // ... a few survivors replace old live-set blocks (the live set
        // persists but is not frozen) ...
        for _ in 0..2 {
            let i = rng.below(live.len() as u64) as usize;
            let old = live.as_slice()[i];
            let o = new_obj(block(rng), 1);
            touch_pages(o);
            live.as_mut_slice()[i] = o;
            free_obj(old);
            live_bytes = live_bytes + o.size - old.size;
            ops += 2;
        }
        // ... and the cohort dies.
        while let Some(o) = cohort.pop() {
            free_obj(o);
            ops += 1;
        }
    }
    rec.ops += ops;
    part_since(rec, "cohorts", ops, t);
    live
}

// ---------------------------------------------------------------------------
// 4. phases

fn phases(scale: Scale, rng: &mut Rng, rec: &mut Rec) -> MmapVec<Obj> {
    let n: usize = scale.pick(20_000, 300_000, 2_000_000);
    let mut all: MmapVec<Obj> = MmapVec::with_capacity(n);
    // Survivors of every phase accumulate, as in an interpreter's long run.
    let mut survivors: MmapVec<Obj> = MmapVec::with_capacity(n);
    for phase in ["dense", "clustered", "sparse"] {
        one_phase(phase, n, rng, rec, &mut all, &mut survivors);
    }
    survivors
}

/// One of `phases`' phases alone, its survivors kept through the idle
/// period (the clustered and sparse survivor workloads): what the
/// allocator keeps resident around them once the program is quiet.
fn survivors(phase: &str, scale: Scale, rng: &mut Rng, rec: &mut Rec) -> MmapVec<Obj> {
    let n: usize = scale.pick(20_000, 300_000, 2_000_000);
    let mut all: MmapVec<Obj> = MmapVec::with_capacity(n);
    let mut survivors: MmapVec<Obj> = MmapVec::with_capacity(n);
    one_phase(phase, n, rng, rec, &mut all, &mut survivors);
    survivors
}

/// Ten phases of `n` objects of 16-512 B; after each, on every 4 KiB page
/// the phase's objects start on that holds no survivor yet, one of them,
/// chosen at random, survives; the rest are freed. What meshing is for,
/// phase after phase: no page empties, and where its survivor sits is
/// random.
fn survivors_random(scale: Scale, rng: &mut Rng, rec: &mut Rec) -> MmapVec<Obj> {
    let n: usize = scale.pick(20_000, 300_000, 2_000_000);
    let mut all: MmapVec<Obj> = MmapVec::with_capacity(n);
    let mut survivors: MmapVec<Obj> = MmapVec::with_capacity(n);
    let mut pages = crate::util::PageSet::with_capacity(n);
    for phase in 0..10 {
        rec.mark(&format!("phase {phase}"));
        let t = Instant::now();
        for _ in 0..n {
            let size = rng.range(2, 64) as usize * 8;
            all.push(new_obj(size, size));
        }
        let mut ops = n as u64;
        // Sorted by address, a page's objects are one run: one of each run
        // stays.
        all.as_mut_slice().sort_unstable_by_key(|o| o.addr);
        let objs = all.as_slice();
        let mut start = 0;
        while start < objs.len() {
            let page = objs[start].addr / crate::util::PAGE;
            let end = start
                + objs[start..]
                    .iter()
                    .position(|o| o.addr / crate::util::PAGE != page)
                    .unwrap_or(objs.len() - start);
            let keep = if pages.insert(page) {
                start + rng.below((end - start) as u64) as usize
            } else {
                usize::MAX
            };
            for (i, &o) in objs.iter().enumerate().take(end).skip(start) {
                if i == keep {
                    survivors.push(o);
                } else {
                    free_obj(o);
                    ops += 1;
                }
            }
            start = end;
        }
        all.clear();
        rec.ops += ops;
        part_since(rec, &format!("phase {phase}"), ops, t);
    }
    survivors
}

/// Allocates `n` objects of 16-512 B and frees all but the phase's
/// survivors (`dense`: 10 % at random; `clustered`: one run of 256
/// consecutive allocations in ten; `sparse`: one per OS page), which join
/// `survivors`; records the phase as a part.
fn one_phase(
    phase: &str,
    n: usize,
    rng: &mut Rng,
    rec: &mut Rec,
    all: &mut MmapVec<Obj>,
    survivors: &mut MmapVec<Obj>,
) {
    rec.mark(phase);
    let t = Instant::now();
    for _ in 0..n {
        let size = rng.range(2, 64) as usize * 8;
        all.push(new_obj(size, size));
    }
    let mut ops = n as u64;
    match phase {
        // 10% random survivors.
        "dense" => {
            for &o in all.as_slice() {
                if rng.below(10) == 0 {
                    survivors.push(o);
                } else {
                    free_obj(o);
                    ops += 1;
                }
            }
        }
        // Runs of 256 consecutive allocations, one run in ten kept.
        "clustered" => {
            for (i, &o) in all.as_slice().iter().enumerate() {
                if (i / 256) % 10 == 0 {
                    survivors.push(o);
                } else {
                    free_obj(o);
                    ops += 1;
                }
            }
        }
        // One survivor per OS page: the first object starting on a page
        // that holds no survivor yet.
        _ => {
            let mut pages = crate::util::PageSet::with_capacity(n);
            for &o in all.as_slice() {
                if pages.insert(o.addr / crate::util::PAGE) {
                    survivors.push(o);
                } else {
                    free_obj(o);
                    ops += 1;
                }
            }
        }
    }
    all.clear();
    rec.ops += ops;
    let ns = t.elapsed().as_nanos() as u64;
    let rss = rec.rss();
    let live: u64 = survivors.as_slice().iter().map(|o| o.size as u64).sum();
    rec.parts.push(Part {
        name: phase.to_string(),
        ops,
        ns,
        rss,
        live_bytes: Some(live),
        floor_pages: Some(pages_touched(survivors.as_slice())),
        ..Part::default()
    });
}

// ---------------------------------------------------------------------------
// 5. threads

fn threads(scale: Scale, seed: u64, rec: &mut Rec) -> MmapVec<Obj> {
    // Each round replaces every slot once: slots x rounds replacements per
    // thread (full: 10,000 x 240 = 2.4 M, as many as the 60 rounds of 40,000
    // random replacements this workload used to make).
    let slots: usize = scale.pick(200, 4_000, 10_000);
    let rounds: usize = scale.pick(10, 50, 240);
    let mut survivors = MmapVec::with_capacity(4 * slots);
    for nthreads in [2usize, 4] {
        let label = format!("{nthreads} threads");
        rec.mark(&label);
        // Before the clock: each thread's slot array and the order in which
        // it visits slots (a shuffled permutation, fixed per thread), both
        // outside the allocator under test, so that the timed loop allocates
        // nothing but the objects.
        let setup: Vec<(MmapVec<Obj>, MmapVec<u32>)> = (0..nthreads)
            .map(|id| {
                let mut rng = Rng::new(seed ^ ((id as u64 + 1) * 0x9e37_79b9));
                let mut order = MmapVec::with_capacity(slots);
                for i in 0..slots {
                    order.push(i as u32);
                }
                let o = order.as_mut_slice();
                for i in (1..slots).rev() {
                    o.swap(i, rng.below(i as u64 + 1) as usize);
                }
                (MmapVec::with_capacity(slots), order)
            })
            .collect();
        let t = Instant::now();
        // One slot array per thread, handed on after the fill and after every
        // round: thread i takes the array thread i-1 filled, and a round
        // replaces every slot of it exactly once, so every free in the rounds
        // is of an object the previous thread allocated.
        let mailbox: Arc<Vec<Mutex<Option<MmapVec<Obj>>>>> =
            Arc::new((0..nthreads).map(|_| Mutex::new(None)).collect());
        let barrier = Arc::new(Barrier::new(nthreads));
        let handles: Vec<_> = setup
            .into_iter()
            .enumerate()
            .map(|(id, (mut arr, order))| {
                let mailbox = Arc::clone(&mailbox);
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    let mut rng = Rng::new(seed ^ ((id as u64 + 1) * 0x1234_5678));
                    let size = |rng: &mut Rng| rng.range(16, 1024) as usize;
                    let hand_on = |arr: MmapVec<Obj>| -> MmapVec<Obj> {
                        *mailbox[(id + 1) % nthreads].lock().expect("mailbox") = Some(arr);
                        barrier.wait();
                        let arr = mailbox[id].lock().expect("mailbox").take().expect("array");
                        barrier.wait();
                        arr
                    };
                    for _ in 0..slots {
                        arr.push(new_obj(size(&mut rng), 8));
                    }
                    let mut ops = slots as u64;
                    arr = hand_on(arr);
                    for _ in 0..rounds {
                        let a = arr.as_mut_slice();
                        for &i in order.as_slice() {
                            let i = i as usize;
                            free_obj(a[i]);
                            a[i] = new_obj(size(&mut rng), 8);
                        }
                        ops += 2 * slots as u64;
                        arr = hand_on(arr);
                    }
                    (arr, ops)
                })
            })
            .collect();
        let mut ops = 0;
        let mut arrays = Vec::new();
        for h in handles {
            let (arr, n) = h.join().expect("worker thread panicked");
            ops += n;
            arrays.push(arr);
        }
        // The 2-thread run's objects die (freed by the main thread); the
        // 4-thread run's stay live for the measurement.
        for arr in arrays {
            for &o in arr.as_slice() {
                if nthreads == 4 {
                    survivors.push(o);
                } else {
                    free_obj(o);
                    ops += 1;
                }
            }
        }
        rec.ops += ops;
        part_since(rec, &label, ops, t);
    }
    survivors
}

// ---------------------------------------------------------------------------
// 6. mixed

fn mixed(scale: Scale, rng: &mut Rng, rec: &mut Rec) -> MmapVec<Obj> {
    let steps: u64 = scale.pick(5_000, 1_000_000, 8_000_000);
    let window = 4096usize;
    let pareto = |rng: &mut Rng| -> usize {
        // Pareto(x_m = 16, alpha = 1.1), capped at 64 KiB: mostly tiny
        // objects, a long tail of larger ones.
        let u = 1.0 - rng.unit();
        let x = 16.0 / u.powf(1.0 / 1.1);
        (x as usize).clamp(16, 64 << 10)
    };
    let mut slots: MmapVec<Obj> = MmapVec::with_capacity(window);
    for _ in 0..window {
        slots.push(Obj::default());
    }
    let t = Instant::now();
    let mut ops = 0u64;
    for _ in 0..steps {
        let i = rng.below(window as u64) as usize;
        let old = slots.as_slice()[i];
        if old.addr != 0 && rng.below(8) == 0 {
            // Grow or shrink in place of a free + malloc.
            let new_size = pareto(rng);
            let layout = Layout::from_size_align(old.size, crate::util::ALIGN).expect("layout");
            // SAFETY: `old` is live with `layout`; new_size > 0.
            let p = unsafe { std::alloc::realloc(old.addr as *mut u8, layout, new_size) };
            if p.is_null() {
                handle_alloc_error(layout);
            }
            // SAFETY: `p` has `new_size` bytes.
            unsafe { p.add(new_size - 1).write(1) };
            slots.as_mut_slice()[i] = Obj {
                addr: p as usize,
                size: new_size,
            };
            ops += 1;
            continue;
        }
        if old.addr != 0 {
            free_obj(old);
            ops += 1;
        }
        let size = pareto(rng);
        slots.as_mut_slice()[i] = new_obj(size, 64);
        ops += 1;
    }
    rec.ops += ops;
    part_since(rec, "objects", ops, t);
    let mut live = MmapVec::with_capacity(window);
    for &o in slots.as_slice() {
        if o.addr != 0 {
            live.push(o);
        }
    }
    live
}

// ---------------------------------------------------------------------------
// 7. arena-churn

/// The arena variants of `arena-churn`, in the order they run.
pub const ARENA_VARIANTS: &[&str] = &["pagewise Arena", "bumpalo", "arena on malloc"];

/// Page source of the `pagewise Arena` variant's block pool (its own, so
/// its syscall counts are the variant's).
static ARENA_CHURN_PAGES: pagewise::SystemPages = pagewise::SystemPages::new();

/// A bump arena on the global allocator: the same block policy as
/// `pagewise::Arena` (64 KiB first block, doubling to 4 MiB), blocks taken
/// from the worker's global allocator and given back to it on drop.
struct MallocArena {
    /// Blocks, the current one last: (base, size).
    blocks: Vec<(usize, usize)>,
    off: usize,
}

impl MallocArena {
    const ALIGN: usize = 16;

    fn new() -> MallocArena {
        MallocArena {
            blocks: Vec::with_capacity(64),
            off: 0,
        }
    }

    fn alloc(&mut self, l: Layout) -> *mut u8 {
        if let Some(&(base, size)) = self.blocks.last() {
            let start = (base + self.off).next_multiple_of(l.align()) - base;
            if start + l.size() <= size {
                self.off = start + l.size();
                return (base + start) as *mut u8;
            }
        }
        let grow = match self.blocks.last() {
            None => pagewise::arena::FIRST_BLOCK,
            Some(&(_, size)) => (size * 2).min(pagewise::arena::MAX_BLOCK_GROWTH),
        };
        let bsize = grow.max((l.size() + l.align()).next_power_of_two());
        let bl = Layout::from_size_align(bsize, Self::ALIGN).expect("layout");
        // SAFETY: non-zero size.
        let b = unsafe { alloc(bl) };
        if b.is_null() {
            handle_alloc_error(bl);
        }
        let base = b as usize;
        let start = base.next_multiple_of(l.align()) - base;
        self.blocks.push((base, bsize));
        self.off = start + l.size();
        (base + start) as *mut u8
    }
}

impl Drop for MallocArena {
    fn drop(&mut self) {
        for &(base, size) in &self.blocks {
            let bl = Layout::from_size_align(size, Self::ALIGN).expect("layout");
            // SAFETY: the block came from `alloc(bl)` and nothing refers to it now.
            unsafe { dealloc(base as *mut u8, bl) };
        }
    }
}

/// The arena interface the churn needs.
trait ChurnArena {
    fn bump(&mut self, l: Layout) -> *mut u8;
}

impl ChurnArena for pagewise::Arena {
    fn bump(&mut self, l: Layout) -> *mut u8 {
        self.alloc_layout(l).as_ptr()
    }
}

impl ChurnArena for bumpalo::Bump {
    fn bump(&mut self, l: Layout) -> *mut u8 {
        self.alloc_layout(l).as_ptr()
    }
}

impl ChurnArena for MallocArena {
    fn bump(&mut self, l: Layout) -> *mut u8 {
        self.alloc(l)
    }
}

/// Creates `arenas` arenas of 1..=`max_mib` MiB (uniform whole MiB), at most
/// `window` alive at once (the oldest is dropped first), each filled with
/// objects of 16-256 B that are all written. Returns the objects allocated.
fn churn_arenas<A: ChurnArena>(
    arenas: usize,
    window: usize,
    max_mib: u64,
    seed: u64,
    mut make: impl FnMut() -> A,
) -> u64 {
    // The same trace for every variant.
    let mut rng = Rng::new(seed ^ 0xa7e4a);
    let mut live: std::collections::VecDeque<A> = std::collections::VecDeque::with_capacity(window);
    let mut objects = 0u64;
    for _ in 0..arenas {
        if live.len() == window {
            live.pop_front();
        }
        let bytes = (rng.range(1, max_mib) as usize) << 20;
        let mut a = make();
        let mut done = 0;
        while done < bytes {
            let size = rng.range(16, 256) as usize;
            let p = a.bump(Layout::from_size_align(size, 8).expect("layout"));
            // SAFETY: `p` is `size` fresh bytes of the arena.
            unsafe { core::ptr::write_bytes(p, 0x5a, size) };
            done += size;
            objects += 1;
        }
        live.push_back(a);
    }
    drop(live);
    objects
}

fn arena_churn(scale: Scale, seed: u64, rec: &mut Rec) -> MmapVec<Obj> {
    let arenas: usize = scale.pick(3, 8, 128);
    let max_mib: u64 = scale.pick(2, 64, 64);
    let window = 4;
    for &variant in ARENA_VARIANTS {
        rec.mark(variant);
        let peak_ok = rec.reset_peak();
        let t = Instant::now();
        let mut pool_stats = None;
        let objects = match variant {
            "pagewise Arena" => {
                // A pool with the default configuration (64 MiB cap,
                // MADV_FREE), its own so that it is unmapped when this part
                // ends and the next variant starts from the same RSS.
                let pool = Arc::new(pagewise::arena::BlockPool::new(
                    &ARENA_CHURN_PAGES,
                    pagewise::arena::BlockPoolConfig::default(),
                ));
                let n = churn_arenas(arenas, window, max_mib, seed, || {
                    pagewise::Arena::with_pool(Arc::clone(&pool))
                });
                pool_stats = Some(pool);
                n
            }
            "bumpalo" => churn_arenas(arenas, window, max_mib, seed, bumpalo::Bump::new),
            _ => churn_arenas(arenas, window, max_mib, seed, MallocArena::new),
        };
        // Every arena is dropped; the pagewise pool still holds what it
        // pooled (that is in "RSS at end").
        let ns = t.elapsed().as_nanos() as u64;
        let rss = rec.rss();
        let peak_rss = if peak_ok { rec.peak() } else { None };
        let mut figures = Vec::new();
        if let Some(pool) = pool_stats.take() {
            let s = pool.stats();
            let sys = pagewise::PageSource::syscalls(&ARENA_CHURN_PAGES);
            figures.push((
                "pooled MiB".into(),
                s.pooled_bytes as f64 / (1 << 20) as f64,
            ));
            figures.push(("fresh blocks".into(), s.fresh_blocks as f64));
            figures.push(("reused blocks".into(), s.reused_blocks as f64));
            figures.push(("block mmap".into(), sys.mmap as f64));
            figures.push(("block madvise".into(), sys.madvise as f64));
            drop(pool);
        }
        rec.ops += objects;
        rec.parts.push(Part {
            name: variant.to_string(),
            ops: objects,
            ns,
            rss,
            peak_rss,
            figures,
            ..Part::default()
        });
    }
    MmapVec::with_capacity(1)
}

// ---------------------------------------------------------------------------
// 8. jit-pools

/// One request of the JIT trace: its size, and whether (and which) live
/// allocation is discarded after it.
#[derive(Clone, Copy)]
struct JitRequest {
    size: usize,
    discard: Option<u64>,
}

/// The trace of `examples/jit_pools.rs`: 94 % log-uniform in 100 B-4 KiB
/// (stubs, ICs, small functions), 5 % log-uniform in 4-64 KiB, 1 % uniform
/// in 64-512 KiB (above the 64 KiB threshold: a pool of its own); after each
/// request, with probability 1/3, one random live allocation is discarded.
fn jit_trace(n: usize, seed: u64) -> MmapVec<JitRequest> {
    let mut r = Rng::new(seed ^ 0x717);
    let log_uniform = |r: &mut Rng, lo: f64, hi: f64| (lo * (hi / lo).powf(r.unit())) as usize;
    let mut t = MmapVec::with_capacity(n);
    for _ in 0..n {
        let k = r.below(100);
        let size = if k < 94 {
            log_uniform(&mut r, 100.0, 4096.0)
        } else if k < 99 {
            log_uniform(&mut r, 4096.0, 65536.0)
        } else {
            65537 + r.below(448 << 10) as usize
        };
        let discard = (r.below(3) == 0).then(|| r.next_u64());
        t.push(JitRequest { size, discard });
    }
    t
}

/// The configurations of `jit-pools`: (part name, pool KiB, open pools, fit).
const JIT_CONFIGS: &[(&str, usize, usize, pagewise::pool::Fit)] = &[
    ("first fit", 64, 4, pagewise::pool::Fit::First),
    ("best fit", 64, 4, pagewise::pool::Fit::Best),
    ("worst fit", 64, 4, pagewise::pool::Fit::Worst),
    // Small pools, one open at a time: the configuration a JIT would
    // start from, against which the three fits above are set.
    (
        "first fit, 16K pools, 1 open",
        16,
        1,
        pagewise::pool::Fit::First,
    ),
];

/// Seed of the `jit-pools` trace: fixed, not the run's, so that every run
/// replays the same trace and the accounting is identical across runs (the
/// repetitions only time it, and the medians of the figures stay one run's).
const JIT_SEED: u64 = 1;

fn jit_pools(scale: Scale, rec: &mut Rec) -> MmapVec<Obj> {
    use pagewise::pool::{PoolConfig, Pools};
    let n: usize = scale.pick(2_000, 100_000, 100_000);
    let trace = jit_trace(n, JIT_SEED);
    for &(name, pool_kib, open, fit) in JIT_CONFIGS {
        rec.mark(name);
        let pools = Pools::with_config(PoolConfig {
            pool_size: pool_kib << 10,
            large_threshold: pool_kib << 10,
            open_pools: open,
            fit,
            ..PoolConfig::default()
        });
        // The handles (which keep their pools mapped) live in a plain Vec:
        // the pools' own bookkeeping uses the global allocator anyway.
        let mut live = Vec::with_capacity(n);
        let t = Instant::now();
        let mut ops = 0u64;
        for q in trace.as_slice() {
            live.push(pools.alloc(q.size).expect("pool alloc"));
            ops += 1;
            if let Some(r) = q.discard {
                live.swap_remove(r as usize % live.len());
                ops += 1;
            }
        }
        let ns = t.elapsed().as_nanos() as u64;
        let s = pools.stats();
        assert_eq!(s.allocated, s.asked_for + s.waste(), "pool accounting");
        let rss = rec.rss();
        drop(live);
        drop(pools);
        rec.ops += ops;
        rec.parts.push(Part {
            name: name.to_string(),
            ops,
            ns,
            rss,
            figures: vec![
                ("factor".into(), s.overallocation()),
                ("asked_for".into(), s.asked_for as f64),
                ("allocated".into(), s.allocated as f64),
                ("lwaste".into(), s.lwaste as f64),
                ("swaste".into(), s.swaste as f64),
                ("nwaste".into(), s.nwaste as f64),
                ("owaste".into(), s.owaste as f64),
                ("pools".into(), s.pools_created as f64),
                (
                    "peak pool MiB".into(),
                    s.peak_live_bytes as f64 / (1 << 20) as f64,
                ),
            ],
            ..Part::default()
        });
    }
    MmapVec::with_capacity(1)
}
