//! A multi-thread stress of the global allocator, meant to be run as it is,
//! in release, under the schedule-perturbation build
//! (`RUSTFLAGS="--cfg pagewise_perturb"`) and under ThreadSanitizer
//! (`.ci/tsan.sh`). See `docs/stress-and-tsan.md`.
//!
//! Worker threads (`PAGEWISE_TEST_STRESS_THREADS`, default 12) run a bounded
//! amount of work (`PAGEWISE_TEST_STRESS_OPS` operations in all) chosen by a
//! seeded PRNG (`PAGEWISE_TEST_STRESS_SEED`, printed at the start): allocations
//! of 1 B to 64 MiB (log-uniform, mostly small) at alignments of 1 B to
//! 2 MiB through `std::alloc` and `pagewise::raw`, `realloc`, zeroed
//! allocations checked for zero every time, blocks handed to other threads
//! (a lock-free mailbox per worker, a mutex-protected pool of orphans) and
//! freed there, workers that exit mid-run and are replaced (heaps abandoned
//! and adopted; their blocks outlive them), `fork()` with allocation in the
//! child, and a thread calling `pagewise::trim()` and `pagewise::stats()`
//! all along, checking what holds even while racing. Every block carries a
//! pattern derived from its address, size and a tag unique to the
//! allocation, checked before it is freed, handed over or resized: an
//! overlap, a stale byte or a lost write fails with the address, offset,
//! expected and found bytes. At the end everything is freed, `trim()` runs,
//! and the final `stats()` must be back near where it started.

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;
mod support;

use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread;
use support::{
    check, check_range, covered_below, describe_mismatch, describe_nonzero, disabled, env_u64,
    fill, first_nonzero, fork_probe, key, say, Inherited, Rng,
};

/// The tests of this binary look at process-wide counters: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Most blocks a worker holds at once.
const LOCAL_MAX: usize = 1024;
/// Blocks a worker tends to hold (allocations and frees balance there).
const LOCAL_TARGET: usize = 128;
/// How long a forked child may take before it counts as hung.
const FORK_TIMEOUT_MS: u64 = 30_000;
/// How long the workers may make no progress at all before the run counts
/// as deadlocked (or, after a failure, before the workers count as stuck
/// in corrupt allocator state).
const STALL_TIMEOUT_S: u64 = 120;

// ----- parameters ----------------------------------------------------------------

struct Params {
    threads: usize,
    ops: u64,
    seed: u64,
    forks: u64,
    live_max: usize,
    max_size: usize,
    exits: bool,
    remote: bool,
    realloc: bool,
    zeroed: bool,
    raw: bool,
    trim: bool,
    stats: bool,
    align: bool,
    yields: bool,
    /// Extra heaps tolerated (exploration only; 0 by default).
    heap_slack: u64,
}

/// Operations in all, by default: a few seconds on 2 cores.
#[allow(unexpected_cfgs)]
fn default_ops() -> u64 {
    let base = if cfg!(debug_assertions) {
        60_000
    } else {
        120_000
    };
    // The perturbation build yields and spins inside the allocator.
    if cfg!(pagewise_perturb) {
        base / 4
    } else {
        base
    }
}

impl Params {
    fn from_env() -> Params {
        let max_size = if disabled("huge") { 16 * MIB } else { 64 * MIB };
        Params {
            threads: env_u64("PAGEWISE_TEST_STRESS_THREADS", 12).clamp(1, 256) as usize,
            ops: env_u64("PAGEWISE_TEST_STRESS_OPS", default_ops()).max(1),
            seed: env_u64("PAGEWISE_TEST_STRESS_SEED", 0x5EED_0F9A_6E77_715E),
            forks: if disabled("fork") {
                0
            } else {
                env_u64("PAGEWISE_TEST_STRESS_FORKS", 6)
            },
            live_max: env_u64("PAGEWISE_TEST_STRESS_LIVE_MAX", 512 << 20) as usize,
            max_size: if disabled("large") {
                256 * KIB
            } else {
                max_size
            },
            exits: !disabled("exit"),
            remote: !disabled("remote"),
            realloc: !disabled("realloc"),
            zeroed: !disabled("zeroed"),
            raw: !disabled("raw"),
            trim: !disabled("trim"),
            stats: !disabled("stats"),
            align: !disabled("align"),
            yields: !disabled("yield"),
            heap_slack: env_u64("PAGEWISE_TEST_STRESS_HEAP_SLACK", 0),
        }
    }
}

// ----- blocks --------------------------------------------------------------------

/// Which API allocated a block (and frees it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    /// `std::alloc` (the global allocator) with a `Layout`.
    Rust,
    /// `pagewise::raw` (C-style: no size on free).
    Raw,
}

/// A live block the test holds, with what its pattern derives from.
#[derive(Clone, Copy, Debug)]
struct Blk {
    addr: usize,
    size: usize,
    align: usize,
    tag: u64,
    api: Api,
}

impl Blk {
    fn ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
    fn key(&self) -> u64 {
        key(self.addr, self.size, self.tag)
    }
    fn layout(&self) -> Layout {
        Layout::from_size_align(self.size, self.align).expect("valid layout")
    }
    fn who(&self) -> String {
        format!(
            "block {:#x} ({} B, align {}, {:?} API, tag {:#x}: made by worker {}, generation {}, allocation {})",
            self.addr,
            self.size,
            self.align,
            self.api,
            self.tag,
            self.tag >> 56,
            (self.tag >> 40) & 0xFFFF,
            self.tag & 0xFF_FFFF_FFFF
        )
    }
}

/// A worker's inbox: a lock-free stack that others push onto and the
/// owner empties in one swap (no ABA: nodes are never popped one by one).
struct Mailbox {
    head: AtomicPtr<Node>,
}

struct Node {
    blk: Blk,
    next: *mut Node,
}

impl Mailbox {
    fn new() -> Mailbox {
        Mailbox {
            head: AtomicPtr::new(null_mut()),
        }
    }
    fn push(&self, blk: Blk) {
        let n = Box::into_raw(Box::new(Node {
            blk,
            next: null_mut(),
        }));
        let mut head = self.head.load(Relaxed);
        loop {
            // SAFETY: `n` is ours until the CAS publishes it.
            unsafe { (*n).next = head };
            match self.head.compare_exchange_weak(head, n, Release, Relaxed) {
                Ok(_) => return,
                Err(seen) => head = seen,
            }
        }
    }
    fn take_all(&self) -> Vec<Blk> {
        let mut out = Vec::new();
        let mut p = self.head.swap(null_mut(), Acquire);
        while !p.is_null() {
            // SAFETY: the swap made the whole list ours; nodes came from Box.
            let n = unsafe { Box::from_raw(p) };
            out.push(n.blk);
            p = n.next;
        }
        out
    }
}

// ----- shared state --------------------------------------------------------------

#[derive(Default)]
struct Counts {
    allocs: AtomicU64,
    zeroed: AtomicU64,
    raw: AtomicU64,
    large: AtomicU64,
    huge: AtomicU64,
    frees: AtomicU64,
    remote_frees: AtomicU64,
    reallocs: AtomicU64,
    realloc_moves: AtomicU64,
    sent: AtomicU64,
    orphaned: AtomicU64,
    generations: AtomicU64,
    forks: AtomicU64,
    trims: AtomicU64,
    stats: AtomicU64,
    max_heaps: AtomicU64,
    skipped_for_cap: AtomicU64,
}

struct Shared {
    p: Params,
    boxes: Vec<Mailbox>,
    /// Blocks of workers that exited, for anyone to free.
    orphans: Mutex<Vec<Blk>>,
    /// Requested bytes of the blocks the test holds (capped at `live_max`).
    live: AtomicUsize,
    stop: AtomicBool,
    failures: Mutex<Vec<String>>,
    /// Operations done, in batches (paces forks and the stats thread).
    ops_done: AtomicU64,
    next_fork: AtomicU64,
    workers_done: AtomicBool,
    /// Heaps before the run.
    heaps_before: u64,
    /// Too many heaps were reported (once is enough).
    heaps_noted: AtomicBool,
    /// A fork failed: no more forks (a hang costs the whole timeout).
    fork_failed: AtomicBool,
    /// Worker threads started and not yet joined, and the most at once:
    /// with the main and stats threads, the most heaps the run may need.
    alive: AtomicU64,
    max_alive: AtomicU64,
    counts: Counts,
}

impl Shared {
    /// Records a failure after which going on is unsafe or pointless (a
    /// corrupt block, a wrong counter): every thread stops, blocks are
    /// leaked.
    fn fail(&self, msg: String) {
        self.note(msg);
        self.stop.store(true, SeqCst);
    }
    /// Records a failure that leaves the allocator usable (a hung fork
    /// child, which was killed; too many heaps): the run goes on, so one
    /// run can report several defects.
    fn note(&self, msg: String) {
        say(&format!("stress: FAILURE (seed {:#x}): {msg}", self.p.seed));
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        f.push(msg);
    }
    /// The most heaps the run may have needed so far: those there were
    /// before, one per worker thread alive at once, one each for the
    /// stats thread and the watchdog.
    fn heap_bound(&self) -> u64 {
        self.heaps_before + self.max_alive.load(SeqCst) + 2 + self.p.heap_slack
    }
    fn stopped(&self) -> bool {
        self.stop.load(Relaxed)
    }
    fn reserve(&self, bytes: usize) -> bool {
        let before = self.live.fetch_add(bytes, Relaxed);
        if before + bytes > self.p.live_max {
            self.live.fetch_sub(bytes, Relaxed);
            self.counts.skipped_for_cap.fetch_add(1, Relaxed);
            return false;
        }
        true
    }
    fn unreserve(&self, bytes: usize) {
        self.live.fetch_sub(bytes, Relaxed);
    }
    /// Checks a block's pattern; false (after reporting) if it is broken.
    fn verify(&self, b: &Blk, when: &str) -> bool {
        // SAFETY: a live block the test holds.
        let bad = unsafe { check(b.ptr(), b.size, b.key()) };
        match bad {
            None => true,
            Some(off) => {
                // SAFETY: as above.
                let d = unsafe { describe_mismatch(b.ptr(), b.size, b.key(), off) };
                self.fail(format!(
                    "{when}: {} lost its pattern (overlap or stale byte) {d}",
                    b.who()
                ));
                false
            }
        }
    }
    /// Frees a block the test holds, checking it first (a broken block is
    /// leaked: freeing it could make a clear report an abort).
    fn free(&self, b: Blk, rng: &mut Rng, when: &str) {
        if !self.verify(&b, when) {
            return;
        }
        // SAFETY: a live block, freed once, by the API that made it (or the
        // raw `free`, which takes any pagewise block).
        unsafe {
            match b.api {
                Api::Rust if !rng.chance(1, 8) => dealloc(b.ptr(), b.layout()),
                _ => pagewise::raw::free(b.ptr()),
            }
        }
        self.unreserve(b.size);
        self.counts.frees.fetch_add(1, Relaxed);
    }
}

// ----- sizes ---------------------------------------------------------------------

/// Sizes that sit on the allocator's boundaries.
const EDGE_SIZES: &[usize] = &[
    1,
    8,
    9,
    16,
    17,
    1024,
    4096,
    64 * KIB - 1,
    64 * KIB,
    256 * KIB - 1,
    256 * KIB,
    256 * KIB + 1,
    320 * KIB,
    MIB,
    16 * MIB - 64 * KIB,
    16 * MIB,
    16 * MIB + 1,
    32 * MIB - 128 * KIB,
    32 * MIB,
    32 * MIB + 1,
];

/// A size from 1 B to `max` (log-uniform per band, mostly small).
fn pick_size(rng: &mut Rng, max: usize) -> usize {
    let r = rng.below(1000);
    let size = if r < 20 {
        EDGE_SIZES[rng.index(EDGE_SIZES.len())]
    } else if r < 828 {
        // 1 B .. 32 KiB
        {
            let b = rng.below(15) as u32;
            rng.in_octave(b)
        }
    } else if r < 988 {
        // 32 KiB .. 1 MiB: the big slab classes and small large objects
        {
            let b = 15 + rng.below(5) as u32;
            rng.in_octave(b)
        }
    } else if r < 998 {
        // 1 MiB .. 16 MiB: large objects
        {
            let b = 20 + rng.below(4) as u32;
            rng.in_octave(b)
        }
    } else {
        // 16 MiB .. 64 MiB: huge objects
        {
            let b = 24 + rng.below(2) as u32;
            rng.in_octave(b)
        }
    };
    size.clamp(1, max)
}

/// An alignment from 1 B to 2 MiB (powers of two, mostly small) for a
/// block of `size` bytes. Blocks above 256 KiB (spans and huge runs) take
/// one of 128 KiB to 2 MiB a third of the time: those are the alignments
/// that move a large object's start inside its free span and a huge
/// object's offset inside its run.
fn pick_align(rng: &mut Rng, p: &Params, size: usize) -> usize {
    if !p.align {
        return 8;
    }
    if size > 256 * KIB && rng.chance(1, 3) {
        return 1 << (17 + rng.below(5)); // 128 KiB..2 MiB
    }
    let r = rng.below(100);
    let bit = if r < 70 {
        rng.below(5) // 1..16
    } else if r < 92 {
        5 + rng.below(8) // 32..4096
    } else {
        13 + rng.below(9) // 8 KiB..2 MiB
    };
    1 << bit
}

// ----- workers -------------------------------------------------------------------

struct Worker<'a> {
    sh: &'a Shared,
    slot: usize,
    generation: u64,
    rng: Rng,
    local: Vec<Blk>,
    seq: u64,
}

impl Worker<'_> {
    fn tag(&mut self) -> u64 {
        self.seq += 1;
        (self.slot as u64) << 56 | (self.generation & 0xFFFF) << 40 | (self.seq & 0xFF_FFFF_FFFF)
    }

    fn run(&mut self, ops: u64) {
        let sh = self.sh;
        let n = self.rng.index(8);
        self.adopt_orphans(n);
        let mut batch = 0;
        for i in 0..ops {
            if sh.stopped() {
                break;
            }
            self.step();
            batch += 1;
            if batch == 64 {
                let done = sh.ops_done.fetch_add(batch, Relaxed) + batch;
                batch = 0;
                self.maybe_fork(done);
            }
            if i % 32 == 31 {
                self.drain_mailbox();
            }
        }
        sh.ops_done.fetch_add(batch, Relaxed);
        self.exit();
    }

    fn step(&mut self) {
        let sh = self.sh;
        let p = &sh.p;
        match self.rng.below(1000) {
            // Allocate or free, drifting towards LOCAL_TARGET blocks held.
            0..=659 => self.alloc_or_free(),
            660..=739 if p.realloc => self.realloc_one(),
            740..=829 if p.remote => self.send_one(),
            830..=879 => self.verify_one(),
            880..=899 if p.remote => {
                let n = 1 + self.rng.index(4);
                self.adopt_orphans(n)
            }
            900..=902 => self.burst(),
            903..=912 if p.yields => thread::yield_now(),
            _ => self.alloc_or_free(),
        }
    }

    /// Allocates or frees, drifting towards [`LOCAL_TARGET`] blocks held.
    fn alloc_or_free(&mut self) {
        if self.rng.index(2 * LOCAL_TARGET) >= self.local.len() {
            self.alloc_new()
        } else {
            self.free_one()
        }
    }

    fn alloc_new(&mut self) {
        if self.local.len() >= LOCAL_MAX {
            return self.free_one();
        }
        let sh = self.sh;
        let p = &sh.p;
        let size = pick_size(&mut self.rng, p.max_size);
        let align = pick_align(&mut self.rng, p, size);
        let api = if p.raw && self.rng.chance(2, 5) {
            Api::Raw
        } else {
            Api::Rust
        };
        let zeroed = p.zeroed && self.rng.chance(1, 4);
        if let Some(b) = self.alloc_block(size, align, api, zeroed) {
            self.local.push(b);
        }
    }

    /// Allocates, checks and stamps a block (None if the live cap is
    /// reached or the allocation failed, which is reported).
    fn alloc_block(&mut self, size: usize, align: usize, api: Api, zeroed: bool) -> Option<Blk> {
        let sh = self.sh;
        if !sh.reserve(size) {
            // Over the live cap: make room instead.
            self.free_one();
            return None;
        }
        let layout = Layout::from_size_align(size, align).expect("valid layout");
        // SAFETY: non-zero sizes, power-of-two alignments.
        let ptr = unsafe {
            match (api, zeroed) {
                (Api::Rust, false) => alloc(layout),
                (Api::Rust, true) => alloc_zeroed(layout),
                (Api::Raw, false) => pagewise::raw::malloc(size, align),
                (Api::Raw, true) => pagewise::raw::calloc(size, align),
            }
        };
        let how = match (api, zeroed) {
            (Api::Rust, false) => "alloc",
            (Api::Rust, true) => "alloc_zeroed",
            (Api::Raw, false) => "raw::malloc",
            (Api::Raw, true) => "raw::calloc",
        };
        if ptr.is_null() {
            sh.unreserve(size);
            sh.fail(format!(
                "{how}({size} B, align {align}) returned null with {} MiB live in the test",
                sh.live.load(Relaxed) >> 20
            ));
            return None;
        }
        let b = Blk {
            addr: ptr as usize,
            size,
            align,
            tag: self.tag(),
            api,
        };
        if !self.check_fresh(&b, how, zeroed) {
            // Leaked: it may overlap something.
            return None;
        }
        // SAFETY: a fresh block of `size` bytes.
        unsafe { fill(ptr, size, b.key()) };
        let c = &sh.counts;
        c.allocs.fetch_add(1, Relaxed);
        if zeroed {
            c.zeroed.fetch_add(1, Relaxed);
        }
        if api == Api::Raw {
            c.raw.fetch_add(1, Relaxed);
        }
        if size > 16 * MIB {
            c.huge.fetch_add(1, Relaxed);
        } else if size > 256 * KIB {
            c.large.fetch_add(1, Relaxed);
        }
        Some(b)
    }

    /// Alignment, usable size and (zeroed blocks) zero contents of a block
    /// just allocated or resized.
    fn check_fresh(&self, b: &Blk, how: &str, zeroed: bool) -> bool {
        let sh = self.sh;
        if b.addr % b.align != 0 {
            sh.fail(format!("{how}: {} is not aligned to {}", b.who(), b.align));
            return false;
        }
        // SAFETY: a live pagewise block.
        let usable = unsafe { pagewise::raw::usable_size(b.ptr()) };
        if usable < b.size {
            sh.fail(format!(
                "{how}: {} has a usable size of only {usable} B",
                b.who()
            ));
            return false;
        }
        if zeroed {
            // SAFETY: a live block of `size` bytes.
            if let Some((off, v)) = unsafe { first_nonzero(b.ptr(), b.size) } {
                // SAFETY: as above.
                let d = unsafe { describe_nonzero(b.ptr(), b.size, off, v) };
                sh.fail(format!("{how}: {} is not zero: {d}", b.who()));
                return false;
            }
        }
        true
    }

    fn take_random(&mut self) -> Option<Blk> {
        if self.local.is_empty() {
            return None;
        }
        let i = self.rng.index(self.local.len());
        Some(self.local.swap_remove(i))
    }

    fn free_one(&mut self) {
        if let Some(b) = self.take_random() {
            self.sh.free(b, &mut self.rng, "before free");
        }
    }

    fn verify_one(&mut self) {
        if !self.local.is_empty() {
            let b = self.local[self.rng.index(self.local.len())];
            self.sh.verify(&b, "periodic check");
        }
    }

    fn realloc_one(&mut self) {
        let Some(old) = self.take_random() else {
            return;
        };
        let sh = self.sh;
        if !sh.verify(&old, "before realloc") {
            return;
        }
        let new_size = match self.rng.below(6) {
            0 => old.size * 2,
            1 => (old.size / 2).max(1),
            2 => old.size + 1 + self.rng.index(64),
            3 => old.size.saturating_sub(1 + self.rng.index(64)).max(1),
            _ => pick_size(&mut self.rng, sh.p.max_size),
        }
        .min(sh.p.max_size);
        if new_size > old.size && !sh.reserve(new_size - old.size) {
            self.local.push(old);
            return;
        }
        // SAFETY: a live block; the Rust path passes the layout it was made
        // with, the raw path the alignment it asked for.
        let ptr = unsafe {
            match old.api {
                Api::Rust => realloc(old.ptr(), old.layout(), new_size),
                Api::Raw => pagewise::raw::realloc(old.ptr(), new_size, old.align),
            }
        };
        let how = match old.api {
            Api::Rust => "realloc",
            Api::Raw => "raw::realloc",
        };
        if ptr.is_null() {
            if new_size > old.size {
                sh.unreserve(new_size - old.size);
            }
            self.local.push(old);
            sh.fail(format!(
                "{how} of {} to {new_size} B returned null",
                old.who()
            ));
            return;
        }
        if new_size < old.size {
            sh.unreserve(old.size - new_size);
        }
        let new = Blk {
            addr: ptr as usize,
            size: new_size,
            align: old.align,
            tag: self.tag(),
            api: old.api,
        };
        let what = format!("{how} of {} to {new_size} B at {:#x}", old.who(), new.addr);
        if !self.check_fresh(&new, &what, false) {
            return;
        }
        // The old contents, up to the smaller size, at the new address.
        let keep = old.size.min(new_size);
        let mut bad = None;
        covered_below(old.size, keep, |lo, hi| {
            if bad.is_none() {
                // SAFETY: `hi <= keep <= new_size`.
                bad = unsafe { check_range(ptr, old.key(), lo, hi) };
            }
        });
        if let Some(off) = bad {
            // SAFETY: inside the new block's first `keep` bytes.
            let d = unsafe { describe_mismatch(ptr, keep, old.key(), off) };
            sh.fail(format!("{what}: contents not preserved {d}"));
            return;
        }
        // SAFETY: the new block, `new_size` bytes.
        unsafe { fill(ptr, new_size, new.key()) };
        let c = &sh.counts;
        c.reallocs.fetch_add(1, Relaxed);
        if new.addr != old.addr {
            c.realloc_moves.fetch_add(1, Relaxed);
        }
        self.local.push(new);
    }

    /// Hands a block to another worker, which checks and frees (or keeps) it.
    fn send_one(&mut self) {
        let n = self.sh.p.threads;
        if n < 2 {
            return;
        }
        if let Some(b) = self.take_random() {
            if !self.sh.verify(&b, "before handing over") {
                return;
            }
            let to = (self.slot + 1 + self.rng.index(n - 1)) % n;
            self.sh.boxes[to].push(b);
            self.sh.counts.sent.fetch_add(1, Relaxed);
        }
    }

    fn receive(&mut self, b: Blk, from: &str) {
        let sh = self.sh;
        if self.local.len() < LOCAL_MAX && self.rng.chance(1, 2) {
            if sh.verify(&b, from) {
                self.local.push(b);
            }
        } else {
            sh.free(b, &mut self.rng, from);
            sh.counts.remote_frees.fetch_add(1, Relaxed);
        }
    }

    fn drain_mailbox(&mut self) {
        for b in self.sh.boxes[self.slot].take_all() {
            self.receive(b, "received from another thread");
        }
    }

    fn adopt_orphans(&mut self, n: usize) {
        let taken: Vec<Blk> = {
            let mut o = self.sh.orphans.lock().unwrap();
            let k = n.min(o.len());
            let at = o.len() - k;
            o.split_off(at)
        };
        for b in taken {
            self.receive(b, "adopted from an exited thread");
        }
    }

    /// Many blocks of one small size, then most of them freed at once (the
    /// thread cache's overflow and page release paths), some handed over.
    fn burst(&mut self) {
        let size = 1 + self.rng.index(2 * KIB);
        let n = 16 + self.rng.index(240);
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            match self.alloc_block(size, 8, Api::Rust, false) {
                Some(b) => v.push(b),
                None => break,
            }
        }
        let sh = self.sh;
        let threads = sh.p.threads;
        for b in v {
            if sh.p.remote && threads > 1 && self.rng.chance(1, 4) {
                let to = (self.slot + 1 + self.rng.index(threads - 1)) % threads;
                sh.boxes[to].push(b);
                sh.counts.sent.fetch_add(1, Relaxed);
            } else {
                sh.free(b, &mut self.rng, "before free (burst)");
            }
        }
    }

    /// Forks when the run's progress passes the next fork point.
    fn maybe_fork(&mut self, done: u64) {
        let sh = self.sh;
        let forks = sh.p.forks;
        if sh.fork_failed.load(Relaxed) {
            return;
        }
        loop {
            let k = sh.next_fork.load(Relaxed);
            if k >= forks || done < sh.p.ops * (k + 1) / (forks + 1) {
                return;
            }
            if sh
                .next_fork
                .compare_exchange(k, k + 1, Relaxed, Relaxed)
                .is_ok()
            {
                let inherited: Vec<Inherited> = self
                    .local
                    .iter()
                    .take(3)
                    .map(|b| Inherited {
                        addr: b.addr,
                        size: b.size,
                        key: b.key(),
                        layout: (b.api == Api::Rust).then(|| b.layout()),
                    })
                    .collect();
                if let Err(e) = fork_probe(&inherited, FORK_TIMEOUT_MS) {
                    sh.fork_failed.store(true, Relaxed);
                    sh.note(format!(
                        "fork #{k} (worker {}): {e} (no more forks in this run)",
                        self.slot
                    ));
                }
                sh.counts.forks.fetch_add(1, Relaxed);
                return;
            }
        }
    }

    /// The thread is about to exit: its blocks are freed, orphaned or
    /// handed over, so that many outlive it.
    fn exit(&mut self) {
        let sh = self.sh;
        if sh.stopped() {
            // Something is corrupt: leave everything as it is.
            self.local.clear();
            return;
        }
        self.drain_mailbox();
        let n = sh.p.threads;
        while let Some(b) = self.local.pop() {
            match self.rng.below(4) {
                1 if sh.p.remote => {
                    sh.orphans.lock().unwrap().push(b);
                    sh.counts.orphaned.fetch_add(1, Relaxed);
                }
                2 if sh.p.remote && n > 1 => {
                    let to = (self.slot + 1 + self.rng.index(n - 1)) % n;
                    sh.boxes[to].push(b);
                    sh.counts.sent.fetch_add(1, Relaxed);
                }
                _ => sh.free(b, &mut self.rng, "before free (thread exit)"),
            }
        }
    }
}

/// Tells the main thread that a worker is done, even if it panicked.
struct DoneGuard {
    slot: usize,
    tx: mpsc::Sender<usize>,
}

impl Drop for DoneGuard {
    fn drop(&mut self) {
        let _ = self.tx.send(self.slot);
    }
}

fn spawn_worker(
    sh: &Arc<Shared>,
    slot: usize,
    generation: u64,
    ops: u64,
    tx: &mpsc::Sender<usize>,
) -> thread::JoinHandle<()> {
    let sh = sh.clone();
    let tx = tx.clone();
    sh.counts.generations.fetch_add(1, Relaxed);
    let alive = sh.alive.fetch_add(1, SeqCst) + 1;
    sh.max_alive.fetch_max(alive, SeqCst);
    thread::Builder::new()
        .name(format!("stress-{slot}.{generation}"))
        .spawn(move || {
            let _done = DoneGuard { slot, tx };
            let seed = sh.p.seed ^ support::mix((slot as u64) << 32 | generation);
            let mut w = Worker {
                sh: &sh,
                slot,
                generation,
                rng: Rng::new(seed),
                local: Vec::new(),
                seq: 0,
            };
            w.run(ops);
        })
        .expect("spawn a worker")
}

// ----- the trim/stats thread -----------------------------------------------------

/// Upper bound for any byte or event counter: a wrapped subtraction shows
/// as a number near 2^64.
const ABSURD: u64 = 1 << 46;

/// Checks what holds in a `stats()` taken while everything races.
/// Whether a `stats()` has more heaps than `max_heaps`, the most the
/// threads alive so far can need.
fn check_heaps(s: &pagewise::Stats, max_heaps: u64) -> Result<(), String> {
    if s.heaps > max_heaps {
        return Err(format!(
            "stats(): {} heaps, while the threads alive at once so far need at most {max_heaps}: heaps pile up instead of being reused",
            s.heaps
        ));
    }
    Ok(())
}

/// Checks the counters of a `stats()` taken while everything races.
fn check_racing(s: &pagewise::Stats) -> Result<(), String> {
    let named = [
        ("reserved_bytes", s.reserved_bytes),
        ("committed_bytes", s.committed_bytes),
        ("peak_committed_bytes", s.peak_committed_bytes),
        ("metadata_bytes", s.metadata_bytes),
        ("live_bytes", s.live_bytes),
        ("live_requested_bytes", s.live_requested_bytes),
        ("live_allocations", s.live_allocations),
        ("retained_bytes", s.retained_bytes),
        ("free_slot_bytes", s.free_slot_bytes),
        ("purged_bytes", s.purged_bytes),
        ("segments", s.segments),
        ("large.bytes", s.large.bytes),
        ("large.count", s.large.count),
        ("huge.bytes", s.huge.bytes),
        ("huge.count", s.huge.count),
        ("syscalls.mmap", s.syscalls.mmap),
        ("syscalls.munmap", s.syscalls.munmap),
        ("syscalls.madvise", s.syscalls.madvise),
        ("syscalls.mapped_bytes", s.syscalls.mapped_bytes),
        ("syscalls.peak_mapped_bytes", s.syscalls.peak_mapped_bytes),
    ];
    for (name, v) in named {
        if v >= ABSURD {
            return Err(format!("stats().{name} = {v} ({v:#x}): a wrapped counter"));
        }
    }
    for (c, cs) in s.classes.iter().enumerate() {
        for (name, v) in [
            ("pages", cs.pages),
            ("live_slots", cs.live_slots),
            ("free_slots", cs.free_slots),
            ("cached_slots", cs.cached_slots),
            ("live_requested_bytes", cs.live_requested_bytes),
        ] {
            if v >= ABSURD {
                return Err(format!(
                    "stats().classes[{c}].{name} = {v} ({v:#x}): a wrapped counter"
                ));
            }
        }
    }
    if s.committed_bytes < s.retained_bytes {
        return Err(format!(
            "stats(): committed_bytes {} < retained_bytes {}",
            s.committed_bytes, s.retained_bytes
        ));
    }
    Ok(())
}

fn stats_loop(sh: &Shared) {
    let every = (sh.p.ops / 800).max(50);
    let mut last = 0;
    let mut i = 0u64;
    while !sh.workers_done.load(Acquire) && !sh.stopped() {
        let done = sh.ops_done.load(Relaxed);
        if done < last + every {
            thread::sleep(std::time::Duration::from_millis(1));
            continue;
        }
        last = done;
        i += 1;
        if sh.p.trim && i % 2 == 0 {
            pagewise::trim();
            sh.counts.trims.fetch_add(1, Relaxed);
        }
        if sh.p.stats {
            let s = pagewise::stats();
            sh.counts.stats.fetch_add(1, Relaxed);
            sh.counts.max_heaps.fetch_max(s.heaps, Relaxed);
            if let Err(e) = check_racing(&s) {
                sh.fail(format!("while racing: {e}"));
            }
            // The bound is read after the stats: a thread started since
            // is counted.
            if let Err(e) = check_heaps(&s, sh.heap_bound()) {
                if !sh.heaps_noted.swap(true, Relaxed) {
                    sh.note(format!("while racing: {e}"));
                }
            }
        }
    }
}

// ----- the watchdog ----------------------------------------------------------------

/// Aborts the process (after saying why) if the workers stop making
/// progress: an allocator deadlock, or, after a failure, a worker caught in
/// a loop through corrupt metadata. A hang is then a clear failure rather
/// than a test that never ends. Polls once a second; times nothing else.
fn watchdog(sh: &Shared) {
    let mut last = u64::MAX;
    let mut still = 0;
    while !sh.workers_done.load(Acquire) {
        thread::sleep(std::time::Duration::from_secs(1));
        let done = sh.ops_done.load(Relaxed);
        let stopped = sh.stopped();
        if done != last && !stopped {
            last = done;
            still = 0;
            continue;
        }
        still += 1;
        let limit = if stopped {
            STALL_TIMEOUT_S / 2
        } else {
            STALL_TIMEOUT_S
        };
        if still >= limit && !sh.workers_done.load(Acquire) {
            say(&format!(
                "stress: FAILURE (seed {:#x}): {}; aborting",
                sh.p.seed,
                if stopped {
                    format!("workers still running {limit} s after the failure above (stuck in corrupt allocator state?)")
                } else {
                    format!(
                        "no progress for {limit} s at {done} operations: a deadlock or livelock"
                    )
                }
            ));
            std::process::abort();
        }
    }
}

// ----- the test ------------------------------------------------------------------

/// Runs the whole stress with `p`; returns the failures.
fn run_stress(p: Params) -> Vec<String> {
    say(&format!(
        "stress: seed {:#x} (replay: PAGEWISE_TEST_STRESS_SEED={:#x}), {} threads, {} ops, {} forks, live cap {} MiB, sizes up to {} MiB",
        p.seed,
        p.seed,
        p.threads,
        p.ops,
        p.forks,
        p.live_max >> 20,
        p.max_size >> 20
    ));
    pagewise::trim();
    let before = pagewise::stats();
    let threads = p.threads;
    let sh = Arc::new(Shared {
        boxes: (0..threads).map(|_| Mailbox::new()).collect(),
        orphans: Mutex::new(Vec::new()),
        live: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        failures: Mutex::new(Vec::new()),
        ops_done: AtomicU64::new(0),
        next_fork: AtomicU64::new(0),
        workers_done: AtomicBool::new(false),
        heaps_before: before.heaps,
        heaps_noted: AtomicBool::new(false),
        fork_failed: AtomicBool::new(false),
        alive: AtomicU64::new(0),
        max_alive: AtomicU64::new(0),
        counts: Counts::default(),
        p,
    });
    let stats_thread = {
        let sh = sh.clone();
        thread::Builder::new()
            .name("stress-trim-stats".into())
            .spawn(move || stats_loop(&sh))
            .expect("spawn the stats thread")
    };
    let watchdog_thread = {
        let sh = sh.clone();
        thread::Builder::new()
            .name("stress-watchdog".into())
            .spawn(move || watchdog(&sh))
            .expect("spawn the watchdog")
    };

    // Each slot runs its share of the work in generations: a thread that
    // exits after a while and a new one that takes over its mailbox.
    let mut rng = Rng::new(sh.p.seed ^ 0xA11CE);
    let quota = (sh.p.ops / threads as u64).max(1);
    let (tx, rx) = mpsc::channel::<usize>();
    let mut remaining = vec![quota; threads];
    let mut generation = vec![0u64; threads];
    let mut handles: Vec<Option<thread::JoinHandle<()>>> = Vec::new();
    let next_len = |rng: &mut Rng, left: u64| {
        if sh.p.exits {
            (quota / 40 + rng.below(quota / 10 + 1)).clamp(1, left)
        } else {
            left
        }
    };
    for (slot, left) in remaining.iter_mut().enumerate() {
        let n = next_len(&mut rng, *left);
        *left -= n;
        handles.push(Some(spawn_worker(&sh, slot, 0, n, &tx)));
    }
    let mut running = threads;
    while running > 0 {
        let slot = rx.recv().expect("a worker reports");
        let old = handles[slot].take().expect("a running worker");
        if remaining[slot] > 0 && !sh.stopped() {
            // The successor starts while the old thread is still exiting.
            generation[slot] += 1;
            let n = next_len(&mut rng, remaining[slot]);
            remaining[slot] -= n;
            handles[slot] = Some(spawn_worker(&sh, slot, generation[slot], n, &tx));
        } else {
            running -= 1;
        }
        let joined = old.join();
        sh.alive.fetch_sub(1, SeqCst);
        if let Err(e) = joined {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            sh.fail(format!("worker {slot} panicked: {msg}"));
        }
    }
    sh.workers_done.store(true, Release);
    let _ = watchdog_thread.join();
    if stats_thread.join().is_err() {
        sh.fail("the trim/stats thread panicked".into());
    }

    // What is left in mailboxes and the orphanage: checked and freed here.
    let corrupt = sh.stopped();
    if !corrupt {
        let mut left: Vec<Blk> = std::mem::take(&mut *sh.orphans.lock().unwrap());
        for b in &sh.boxes {
            left.extend(b.take_all());
        }
        for b in left {
            sh.free(b, &mut rng, "left over at the end");
        }
    }
    let c = &sh.counts;
    eprintln!(
        "stress: {} allocations ({} zeroed, {} raw, {} large, {} huge), {} frees ({} after a hand-over), {} reallocs ({} moved), {} handed over, {} orphaned, {} threads (at most {} at once), {} forks, {} trims, {} stats (at most {} heaps seen), {} allocations skipped at the live cap",
        c.allocs.load(Relaxed),
        c.zeroed.load(Relaxed),
        c.raw.load(Relaxed),
        c.large.load(Relaxed),
        c.huge.load(Relaxed),
        c.frees.load(Relaxed),
        c.remote_frees.load(Relaxed),
        c.reallocs.load(Relaxed),
        c.realloc_moves.load(Relaxed),
        c.sent.load(Relaxed),
        c.orphaned.load(Relaxed),
        c.generations.load(Relaxed),
        sh.max_alive.load(Relaxed),
        c.forks.load(Relaxed),
        c.trims.load(Relaxed),
        c.stats.load(Relaxed),
        c.max_heaps.load(Relaxed),
        c.skipped_for_cap.load(Relaxed),
    );
    let mut failures = std::mem::take(&mut *sh.failures.lock().unwrap());
    if !corrupt {
        if sh.live.load(Relaxed) != 0 {
            failures.push(format!(
                "the test lost track of {} bytes",
                sh.live.load(Relaxed)
            ));
        }
        pagewise::trim();
        let after = pagewise::stats();
        failures.extend(check_final(&before, &after, sh.heap_bound()));
    }
    failures
}

/// What must hold once every worker has exited and every block is freed
/// and trimmed.
fn check_final(before: &pagewise::Stats, after: &pagewise::Stats, max_heaps: u64) -> Vec<String> {
    let mut f = Vec::new();
    if let Err(e) = check_racing(after) {
        f.push(format!("at the end: {e}"));
    }
    if let Err(e) = check_heaps(after, max_heaps) {
        f.push(format!("at the end: {e}"));
    }
    let show = |s: &pagewise::Stats| {
        format!(
            "live {} B in {} allocations ({} large, {} huge), committed {} B, retained {} B, reserved {} B, {} segments, {} heaps",
            s.live_bytes,
            s.live_allocations,
            s.large.count,
            s.huge.count,
            s.committed_bytes,
            s.retained_bytes,
            s.reserved_bytes,
            s.segments,
            s.heaps
        )
    };
    eprintln!("stress: before: {}", show(before));
    eprintln!("stress: after:  {}", show(after));
    let mut expect = |ok: bool, what: &str| {
        if !ok {
            f.push(format!(
                "at the end: {what}\n  before: {}\n  after:  {}",
                show(before),
                show(after)
            ));
        }
    };
    expect(
        after.large.count == before.large.count && after.huge.count == before.huge.count,
        "large or huge objects still live after everything was freed",
    );
    expect(
        after.live_bytes <= before.live_bytes + 2 * MIB as u64,
        "live bytes not back near where they started",
    );
    expect(
        after.committed_bytes <= before.committed_bytes + 16 * MIB as u64,
        "committed bytes not back near where they started after trim()",
    );
    expect(
        after.retained_bytes <= MIB as u64,
        "retained bytes after trim()",
    );
    expect(
        after.reserved_bytes <= before.reserved_bytes + (2 << 30),
        "reservations not unmapped after trim()",
    );
    expect(
        after.reserved_bytes >= after.segments * 32 * MIB as u64,
        "more segments than reserved address space",
    );
    f
}

fn finish(failures: Vec<String>, seed: u64) {
    if !failures.is_empty() {
        let n = failures.len();
        let shown: Vec<String> = failures.into_iter().take(10).collect();
        panic!(
            "{n} failure(s) with seed {seed:#x} (replay: PAGEWISE_TEST_STRESS_SEED={seed:#x}):\n{}",
            shown.join("\n")
        );
    }
}

#[test]
fn stress_global_allocator() {
    let _serial = serial();
    let p = Params::from_env();
    let seed = p.seed;
    finish(run_stress(p), seed);
}

/// Runs test `name` of this binary in a child process with `envs` set
/// (and `PAGEWISE_TEST_STRESS_CHILD=name`); relays its output; Err with the
/// tail of it if the child failed (a failed test, an abort, a signal, or
/// exit code 66: a ThreadSanitizer report).
fn run_child(name: &str, envs: &[(&str, String)]) -> Result<(), String> {
    let mut cmd = reexec::this_binary();
    cmd.args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env("PAGEWISE_TEST_STRESS_CHILD", name);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the test binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    if out.status.success() && text.contains("1 passed") {
        return Ok(());
    }
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(40)..].join("\n");
    Err(format!(
        "{name} failed in a child process ({}):\n{tail}",
        out.status
    ))
}

/// For a test whose defect may corrupt the allocator (and so take every
/// later test of the process down with it): true in a child process made
/// for it, where the caller runs its body; in the test process itself,
/// runs that child, fails if it failed, and returns false.
fn isolated(name: &str) -> bool {
    isolated_with(name, &[])
}

/// [`isolated`], with these environment variables in the child.
fn isolated_with(name: &str, envs: &[(&str, String)]) -> bool {
    if std::env::var("PAGEWISE_TEST_STRESS_CHILD").as_deref() == Ok(name) {
        return true;
    }
    if let Err(e) = run_child(name, envs) {
        panic!("{e}");
    }
    false
}

/// The whole stress again in a child process with one-segment reservations
/// (every segment is its own mapping: reservation reuse and the limit on
/// their number come into play) and no decay delay (every freed span is
/// purged at once: zeroed allocations lean on what pagewise knows to be
/// zero), at half the work.
#[test]
fn stress_small_reservations_no_decay() {
    let _serial = serial();
    let ops = env_u64("PAGEWISE_TEST_STRESS_OPS", default_ops()) / 2;
    let envs = [
        ("PAGEWISE_RESERVE", "32M".to_string()),
        ("PAGEWISE_DECAY_MS", "0".to_string()),
        ("PAGEWISE_TEST_STRESS_OPS", ops.max(1).to_string()),
    ];
    if let Err(e) = run_child("stress_global_allocator", &envs) {
        panic!("with PAGEWISE_RESERVE=32M PAGEWISE_DECAY_MS=0: {e}");
    }
}

// ----- focused reproducers ---------------------------------------------------------
//
// Each of these pins down one defect the stress found (at 1e55a32; each
// fixed since), deterministically or nearly so, in a fraction of a second,
// each in a process of its own.

/// Fills `size` bytes at `p` with `v`.
///
/// # Safety
/// `p..p + size` is one writable block.
unsafe fn paint(p: *mut u8, size: usize, v: u8) {
    // SAFETY: per the caller.
    unsafe { std::ptr::write_bytes(p, v, size) };
}

/// A huge object's run is reused at another alignment (so at another
/// offset from the run's start), then purged, then reused again by a zeroed
/// allocation, which must read zero everywhere. (The defect: the purge
/// covered the last occupant's offset only, so bytes of an earlier occupant
/// survived, and the zeroed allocation, told the run was clean, handed them
/// out.) One thread, no timing: the heap's retention cap forces the purge.
#[test]
fn zeroed_huge_block_after_its_run_was_purged_at_another_offset() {
    let _serial = serial();
    // An explicit ceiling on retention (the default has none: demand
    // bounds it).
    let envs = [("PAGEWISE_RETAIN_MAX", "96M".to_string())];
    if !isolated_with(
        "zeroed_huge_block_after_its_run_was_purged_at_another_offset",
        &envs,
    ) {
        return;
    }
    let cap = pagewise::thread::config().retain_max_bytes;
    assert_eq!(cap, 96 * MIB);
    // Huge blocks are over one segment (32 MiB) or could not be spans.
    // A huge block that alone stays under the cap, and with 52 MiB more
    // goes over it.
    let filler = cap - 4 * MIB;
    let huge = |size: usize, align: usize| Layout::from_size_align(size, align).unwrap();
    // (first occupant, second occupant, the zeroed block checked at the end)
    let cases = [
        // Earlier occupant at the usual offset (128 KiB), later one at 2 MiB:
        // the start of the next block is stale.
        (
            huge(52 * MIB, 16),
            huge(52 * MIB, 2 * MIB),
            huge(52 * MIB, 16),
        ),
        // Earlier occupant at 2 MiB reaching the run's end, later one at
        // 128 KiB and shorter: the end of the next block is stale.
        (
            huge(62 * MIB, 2 * MIB),
            huge(52 * MIB, 16),
            huge(64 * MIB - 128 * KIB, 16),
        ),
    ];
    let mut failures = Vec::new();
    for (i, (first, second, last)) in cases.into_iter().enumerate() {
        pagewise::trim();
        // SAFETY: each block is allocated, used within its size and freed
        // once with its layout.
        unsafe {
            let a = alloc(first);
            assert!(!a.is_null());
            paint(a, first.size(), 0xA5);
            dealloc(a, first);
            // Reuses the run of `a` (a cached huge run fits up to twice the need).
            let b = alloc(second);
            assert!(!b.is_null());
            paint(b, second.size(), 0xB6);
            let d_layout = huge(filler, 16);
            let d = alloc(d_layout);
            assert!(!d.is_null());
            dealloc(d, d_layout);
            // Over the cap now: the run of `b`, freed last, is purged first.
            dealloc(b, second);
            let c = alloc_zeroed(last);
            assert!(!c.is_null());
            if let Some((off, v)) = first_nonzero(c, last.size()) {
                failures.push(format!(
                    "case {i}: {} B at align {}, then {} B at align {} in the same run, purged; alloc_zeroed({} B, align {}) = {c:p}: {}",
                    first.size(),
                    first.align(),
                    second.size(),
                    second.align(),
                    last.size(),
                    last.align(),
                    describe_nonzero(c, last.size(), off, v)
                ));
            }
            dealloc(c, last);
        }
    }
    pagewise::trim();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A cached huge run's purge stays inside the run. (The defect: the run
/// remembered the committed bytes of its largest occupant but the offset
/// of its last one, so when the last one sat further into the run the
/// purge ran past the run's end, `MADV_DONTNEED` over the next segment's
/// header and first object, live or not, or failed when the run ended its
/// mapping, and the bytes stayed retained after `trim()`.)
#[test]
fn huge_run_purge_stays_inside_the_run() {
    let _serial = serial();
    if !isolated("huge_run_purge_stays_inside_the_run") {
        return;
    }
    pagewise::trim();
    // Runs of two segments: a huge block is over one segment.
    let first = Layout::from_size_align(64 * MIB - 128 * KIB, 16).unwrap();
    let second = Layout::from_size_align(60 * MIB, 2 * MIB).unwrap();
    let neighbour = Layout::from_size_align(52 * MIB, 16).unwrap();
    // SAFETY: blocks used within their sizes and freed once with their
    // layouts (a neighbour found broken is leaked: its header may be gone).
    unsafe {
        // One run each: `first` fills its run up to the end.
        let a = alloc(first);
        assert!(!a.is_null());
        paint(a, first.size(), 0xA5);
        let run = a as usize & !(32 * MIB - 1);
        // Live blocks in the segments after it (the lowest free ones).
        let mut neighbours = Vec::new();
        for i in 0..4u8 {
            let x = alloc(neighbour);
            assert!(!x.is_null());
            paint(x, neighbour.size(), 0x10 + i);
            neighbours.push((x, 0x10 + i));
        }
        dealloc(a, first);
        // Reuses the run at offset 2 MiB: committed stays 64 MiB - 128 KiB.
        let b = alloc(second);
        assert!(!b.is_null());
        assert_eq!(
            b as usize & !(32 * MIB - 1),
            run,
            "the cached run is reused"
        );
        paint(b, second.size(), 0xB6);
        dealloc(b, second);
        let retained_before = pagewise::stats().retained_bytes;
        // Purges the cached run: [run + 2 MiB, run + 2 MiB + 62 MiB - 128 KiB).
        pagewise::trim();
        let s = pagewise::stats();
        let mut broken = Vec::new();
        for &(x, v) in &neighbours {
            let bad = (0..neighbour.size())
                .step_by(4096)
                .find(|&o| *x.add(o) != v);
            match bad {
                Some(o) => broken.push(format!(
                    "the live {} MiB block at {x:p} (segment {:#x}, {} MiB after the purged run {run:#x}) reads {:#04x} at offset {o}, not {v:#04x}",
                    neighbour.size() >> 20,
                    x as usize & !(32 * MIB - 1),
                    ((x as usize & !(32 * MIB - 1)) - run) >> 20,
                    *x.add(o)
                )),
                None => dealloc(x, neighbour),
            }
        }
        if s.retained_bytes > MIB as u64 {
            broken.push(format!(
                "{} bytes still retained after trim() ({} before): a purge failed",
                s.retained_bytes, retained_before
            ));
        }
        pagewise::trim();
        assert!(broken.is_empty(), "{}", broken.join("\n"));
    }
}

/// A thread frees a large object of another thread's heap right while that
/// thread makes a slab page; the slab page must not be merged into a free
/// span. (The defect: the slab page's span left the pool under the span
/// lock, but its descriptor became `Kind::Slab` only after the lock was
/// released (`new_slab_page`, `Page::init_slab`), and the large free, under
/// the lock, merged the previously freed large span, kept unmerged as the
/// pool's `recent` span, with its free-looking neighbours: the new slab
/// page joined a free span, which a later allocation handed out again over
/// live slots.)
///
/// Layout in the owner's heap: `m` (6 slices), `r` (5 slices, freed first:
/// the recent span), then the new slab page `s` (more than 5 slices, so it
/// comes from the free tail, right after `r`; checked). The other thread frees `m`
/// while the owner makes `s`, which settles `r` and reads `s`'s descriptor.
/// A merge shows as an allocation of exactly `r` + `s` overlapping `s`'s
/// live slot. The window is a few instructions wide: this finds it rarely
/// in a plain build, more often under `--cfg pagewise_perturb`, and under
/// ThreadSanitizer always (a data race on the descriptor's `kind`).
#[test]
fn large_free_racing_slab_page_creation() {
    use pagewise::size_class::{PAGE_SLICES, SLOT_SIZE};
    let _serial = serial();
    if !isolated("large_free_racing_slab_page_creation") {
        return;
    }
    let iterations = env_u64("PAGEWISE_TEST_STRESS_RACE_ITERATIONS", 500);
    const SLICE: usize = 64 * KIB;
    // The smallest class whose slab page is longer than `r`.
    let class = (0..PAGE_SLICES.len())
        .find(|&c| PAGE_SLICES[c] > 5)
        .expect("a class with pages of more than 5 slices");
    let slab_slices = PAGE_SLICES[class] as usize;
    let small = Layout::from_size_align(SLOT_SIZE[class] as usize, 8).unwrap();
    let m_layout = Layout::from_size_align(6 * SLICE, 8).unwrap();
    let r_layout = Layout::from_size_align(5 * SLICE, 8).unwrap();
    let both = Layout::from_size_align((5 + slab_slices) * SLICE, 8).unwrap();
    // The remote freeing thread: frees each block it is handed, after a
    // varying spin (from at once to well after the owner made its page).
    let handoff = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let freer = {
        let (handoff, stop) = (handoff.clone(), stop.clone());
        thread::spawn(move || {
            let mut rng = Rng::new(7);
            while !stop.load(Relaxed) {
                let p = handoff.load(Acquire);
                if p <= 1 {
                    // (Yield: on 2 busy cores a pure spin can cost a time slice.)
                    thread::yield_now();
                    continue;
                }
                let spins = rng.below(env_u64("PAGEWISE_TEST_STRESS_RACE_SPIN", 4000));
                for _ in 0..spins {
                    std::hint::spin_loop();
                }
                // SAFETY: handed over by its owner, freed once; both blocks
                // handed over are large (the layout is not looked at).
                unsafe { dealloc(p as *mut u8, m_layout) };
                handoff.store(1, Release);
            }
        })
    };
    let hand_over = |p: *mut u8| {
        handoff.store(p as usize, Release);
    };
    let wait_freed = || {
        while handoff.load(Acquire) != 1 {
            thread::yield_now();
        }
        handoff.store(0, Release);
    };
    let laid_out = AtomicU64::new(0);
    let mut overlaps = Vec::new();
    // Until half the iterations' worth had the layout the race needs (up
    // to four times as many tries): where the slab page lands depends on
    // the background purger's timing too, which the perturbed schedule
    // moves, and a run with fewer laid-out tries tests less, not nothing.
    let mut tries = 0;
    for i in 0..iterations * 4 {
        if laid_out.load(Relaxed) * 2 >= iterations {
            break;
        }
        tries += 1;
        // A fresh thread each time: it adopts the previous one's heap, whose
        // empty slab pages went back to the span pool (`trim()` below), so
        // its allocation of `small` makes a new slab page.
        let r = thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: blocks used within their sizes, freed once.
                    unsafe {
                        let m = alloc(m_layout);
                        let r = alloc(r_layout);
                        assert!(!m.is_null() && !r.is_null());
                        hand_over(r);
                        wait_freed();
                        // `r` is now the recent span. Free `m` remotely while
                        // making the slab page next to `r`.
                        hand_over(m);
                        let s = alloc(small);
                        assert!(!s.is_null());
                        paint(s, small.size(), 0x5A);
                        let page = r as usize + 5 * SLICE;
                        if (page..page + slab_slices * SLICE).contains(&(s as usize)) {
                            laid_out.fetch_add(1, Relaxed);
                        }
                        wait_freed();
                        let b = alloc(both);
                        assert!(!b.is_null());
                        paint(b, both.size(), 0xC3);
                        let hit = (b as usize..b as usize + both.size()).contains(&(s as usize))
                            || (0..small.size()).any(|o| *s.add(o) != 0x5A);
                        let msg = hit.then(|| {
                            format!(
                                "iteration {i}: the {} B block {b:p} overlaps the live {} B slot {s:p}: the slab page was merged into a free span",
                                both.size(),
                                small.size()
                            )
                        });
                        if !hit {
                            dealloc(b, both);
                            dealloc(s, small);
                        }
                        msg
                    }
                })
                .join()
                .expect("the allocating thread")
        });
        // The exited thread passed its cached slot `s` to the transfer
        // cache, which keeps `s`'s page in use: send it home, so the page
        // empties and the next thread makes a new one again.
        pagewise::trim();
        if let Some(msg) = r {
            overlaps.push(msg);
            break;
        }
    }
    stop.store(true, Relaxed);
    freer.join().unwrap();
    assert!(overlaps.is_empty(), "{}", overlaps.join("\n"));
    let laid_out = laid_out.load(Relaxed);
    assert!(
        laid_out * 2 >= iterations,
        "only {laid_out} of {tries} iterations had the slab page right after the recent span (half of {iterations} wanted): the reproducer's set-up no longer holds"
    );
}

/// Threads come and go one after another while another thread calls
/// `stats()` and `trim()` in a loop: each new thread should adopt the heap
/// the last one left. (The defect: `for_each_abandoned` took the whole
/// abandoned list while it ran, so new threads found it empty and made new
/// heaps, which are never freed.)
#[test]
fn heaps_are_reused_while_stats_and_trim_run() {
    let _serial = serial();
    if !isolated("heaps_are_reused_while_stats_and_trim_run") {
        return;
    }
    let threads = env_u64("PAGEWISE_TEST_STRESS_HEAP_THREADS", 300);
    let before = pagewise::stats().heaps;
    let stop = Arc::new(AtomicBool::new(false));
    let looper = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Relaxed) {
                i += 1;
                if i % 2 == 0 {
                    pagewise::trim();
                } else {
                    std::hint::black_box(pagewise::stats());
                }
            }
        })
    };
    for i in 0..threads {
        thread::spawn(move || {
            let v: Vec<u64> = (0..100 + i).collect();
            std::hint::black_box(&v);
        })
        .join()
        .unwrap();
    }
    stop.store(true, Relaxed);
    looper.join().unwrap();
    let after = pagewise::stats().heaps;
    eprintln!("{before} heaps before, {after} after {threads} threads");
    // One thread at a time plus the looper: a few heaps at most.
    assert!(
        after <= before + 4,
        "{after} heaps after {threads} threads that ran one at a time (there were {before} before)"
    );
}

/// Huge blocks are cheap to hold while untouched (address space, no RSS),
/// and the kernel has room for terabytes of it. (The defect: the global
/// allocator kept at most 256 reservations: with 1 GiB reservations of 32
/// segments, the 8193rd live block above 16 MiB failed.)
#[test]
fn many_live_huge_blocks() {
    let _serial = serial();
    if !isolated("many_live_huge_blocks") {
        return;
    }
    let n = env_u64("PAGEWISE_TEST_STRESS_HUGE_BLOCKS", 8448) as usize;
    let size = 16 * MIB + 1;
    let mut held = Vec::with_capacity(n);
    let mut failed_at = None;
    for i in 0..n {
        // SAFETY: a valid alignment; freed below.
        let p = unsafe { pagewise::raw::malloc(size, 16) };
        if p.is_null() {
            failed_at = Some(i);
            break;
        }
        held.push(p);
    }
    let reserved = pagewise::stats().reserved_bytes;
    for p in held {
        // SAFETY: allocated above, freed once.
        unsafe { pagewise::raw::free(p) };
    }
    pagewise::trim();
    if let Some(i) = failed_at {
        panic!(
            "raw::malloc({size}) returned null with {i} such blocks live ({} GiB of address space reserved)",
            reserved >> 30
        );
    }
}
