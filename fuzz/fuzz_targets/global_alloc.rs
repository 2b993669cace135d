//! `global_alloc`: pagewise as this process's `#[global_allocator]`, driven
//! through `GlobalAlloc` and `pagewise::raw`, with a second thread that
//! frees what it is sent, checked against a model of the live blocks.
//!
//! Checked after every operation: alignment, `usable_size >= size` (and
//! `raw::usable_size` agrees), no overlap between live blocks, every block's
//! pattern intact when it is freed, moved or sent away, zeroed blocks read
//! as zeros, `realloc` keeps the common prefix, and the exact deltas of
//! `stats().live_allocations` / `live_bytes` across the operation.
//!
//! Why deltas, not totals: everything Rust allocates in this process goes
//! through pagewise (the model's own map, libfuzzer-sys's glue), while
//! libFuzzer's C++ side uses the C malloc. So a baseline is taken right
//! before each operation and compared right after it, with nothing else
//! allocating in between: the worker thread is parked on a condition
//! variable (no allocation) whenever the main thread works, and
//! `pagewise::stats()` first collects the frees other threads made into
//! the calling thread's pages, so the worker's frees show at once.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pagewise_fuzz::{
    align, check_block, check_zeroed, fill_block, seed_for, size, trace, Block, Input, Live, MIB,
};
use std::alloc::{GlobalAlloc, Layout};
use std::sync::{Condvar, Mutex};

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

/// Requested bytes live at once, at most (the rest of an input's
/// allocations are skipped): bounds memory and time per input.
const BUDGET: usize = 256 * MIB;
/// Live blocks at once, at most.
const MAX_LIVE: usize = 1024;
/// Largest request.
const MAX_HUGE: usize = 64 * MIB;
/// Blocks sent to the worker in one go, at most.
const BATCH: usize = 16;

/// Which API made a block (and so frees it by default).
const VIA_GLOBAL: u32 = 0;
const VIA_RAW: u32 = 1;

fn layout(b: &Block) -> Layout {
    Layout::from_size_align(b.size.max(1), b.align).expect("valid layout")
}

/// `(live_allocations, live_bytes)` of the whole process.
fn snap() -> (u64, u64) {
    let s = pagewise::stats();
    (s.live_allocations, s.live_bytes)
}

/// Asserts the exact change of the live counters across one operation.
#[track_caller]
fn expect_delta(what: &str, before: (u64, u64), after: (u64, u64), n: i64, bytes: i64) {
    let dn = after.0 as i64 - before.0 as i64;
    let db = after.1 as i64 - before.1 as i64;
    assert!(
        dn == n && db == bytes,
        "{what}: stats() live_allocations changed by {dn} (expected {n}), \
         live_bytes by {db} (expected {bytes}); before {before:?}, after {after:?}"
    );
}

// ----- the worker: frees what it is sent, on its own thread ---------------------

const STARTING: u8 = 0;
const IDLE: u8 = 1;
const JOB: u8 = 2;
const DONE: u8 = 3;
const EXIT: u8 = 4;

const EMPTY: Block = Block {
    addr: 0,
    size: 0,
    usable: 0,
    align: 1,
    seed: 0,
    tag: 0,
};

struct Mailbox {
    state: u8,
    n: usize,
    jobs: [Block; BATCH],
}

static MAILBOX: Mutex<Mailbox> = Mutex::new(Mailbox {
    state: STARTING,
    n: 0,
    jobs: [EMPTY; BATCH],
});
static BELL: Condvar = Condvar::new();
static WORKER: Mutex<Option<std::thread::JoinHandle<()>>> = Mutex::new(None);

fn lock() -> std::sync::MutexGuard<'static, Mailbox> {
    MAILBOX.lock().unwrap_or_else(|e| e.into_inner())
}

/// The worker's loop: wait (no allocation while parked), check and free
/// each block sent, report done.
fn worker() {
    let mut g = lock();
    g.state = IDLE;
    BELL.notify_all();
    loop {
        while g.state != JOB && g.state != EXIT {
            g = BELL.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        if g.state == EXIT {
            return;
        }
        for b in &g.jobs[..g.n] {
            let p = b.addr as *mut u8;
            // SAFETY: the block is live and was handed over whole.
            unsafe {
                check_block("freed on the worker", b.addr, p, b.size, b.seed, b.size);
                if b.tag == VIA_RAW {
                    pagewise::raw::free(p);
                } else {
                    A.dealloc(p, layout(b));
                }
            }
        }
        g.state = DONE;
        BELL.notify_all();
    }
}

/// Starts the worker if it is not running, and waits until it is parked.
fn ensure_worker() {
    let mut w = WORKER.lock().unwrap();
    if w.is_none() {
        lock().state = STARTING;
        *w = Some(std::thread::spawn(worker));
        let mut g = lock();
        while g.state != IDLE {
            g = BELL.wait(g).unwrap();
        }
    }
}

/// Ends the worker thread (its heap is abandoned, and adopted by the next).
fn stop_worker() {
    let mut w = WORKER.lock().unwrap();
    if let Some(h) = w.take() {
        lock().state = EXIT;
        BELL.notify_all();
        h.join().expect("worker exits cleanly");
    }
}

/// Has the worker check and free `blocks`, and waits until it has.
fn send(blocks: &[Block]) {
    let mut g = lock();
    debug_assert_eq!(g.state, IDLE);
    g.jobs[..blocks.len()].copy_from_slice(blocks);
    g.n = blocks.len();
    g.state = JOB;
    BELL.notify_all();
    while g.state != DONE {
        g = BELL.wait(g).unwrap();
    }
    g.state = IDLE;
}

// ----- one input ----------------------------------------------------------------

struct Run {
    live: Live,
    counter: u64,
    /// The counters' exact deltas can be checked (false after the worker
    /// restarted: thread start and exit allocate on their own).
    exact: bool,
}

impl Run {
    /// Records a fresh block (checking alignment, usable size, overlap) and
    /// writes its pattern.
    fn admit(&mut self, what: &str, p: *mut u8, size: usize, align: usize, tag: u32) {
        assert!(
            !p.is_null(),
            "{what}: null for {size} B aligned {align} (well within memory)"
        );
        assert_eq!(
            p as usize % align,
            0,
            "{what}: {p:p} not aligned to {align}"
        );
        // SAFETY: a live pagewise block.
        let usable = unsafe { pagewise::usable_size(p) };
        assert!(
            usable >= size,
            "{what}: usable_size {usable} < requested {size}"
        );
        // SAFETY: as above.
        let raw_usable = unsafe { pagewise::raw::usable_size(p) };
        assert_eq!(raw_usable, usable, "{what}: raw::usable_size disagrees");
        self.counter += 1;
        let b = Block {
            addr: p as usize,
            size,
            usable,
            align,
            seed: seed_for(p as usize, self.counter),
            tag,
        };
        self.live.insert(b);
        // SAFETY: the block is live with `size` bytes.
        unsafe { fill_block(p, size, b.seed) };
    }

    fn room_for(&self, size: usize) -> bool {
        self.live.len() < MAX_LIVE && self.live.bytes + size <= BUDGET
    }

    fn delta(&self, what: &str, before: (u64, u64), n: i64, bytes: i64) {
        if self.exact {
            expect_delta(what, before, snap(), n, bytes);
        }
    }

    fn alloc(&mut self, inp: &mut Input, kind: u8) {
        let mut size = size(inp, MAX_HUGE);
        let align = align(inp);
        if kind >= 2 && inp.u8() >= 240 {
            size = 0; // the raw API serves 0 as 1
        }
        if !self.room_for(size) {
            return;
        }
        trace!("alloc kind {kind} size {size} align {align}");
        let before = snap();
        let l = Layout::from_size_align(size.max(1), align).unwrap();
        // SAFETY: non-zero size, power-of-two alignment.
        let (p, zeroed, tag, what) = unsafe {
            match kind {
                0 => (A.alloc(l), false, VIA_GLOBAL, "GlobalAlloc::alloc"),
                1 => (
                    A.alloc_zeroed(l),
                    true,
                    VIA_GLOBAL,
                    "GlobalAlloc::alloc_zeroed",
                ),
                2 => (
                    pagewise::raw::malloc(size, align),
                    false,
                    VIA_RAW,
                    "raw::malloc",
                ),
                3 => (
                    pagewise::raw::calloc(size, align),
                    true,
                    VIA_RAW,
                    "raw::calloc",
                ),
                _ => {
                    let p = pagewise::raw::malloc_cached(size, align);
                    if p.is_null() {
                        return; // nothing cached for this request: fine
                    }
                    (p, false, VIA_RAW, "raw::malloc_cached")
                }
            }
        };
        assert!(
            !p.is_null(),
            "{what}: null for {size} B aligned {align} (well within memory)"
        );
        if zeroed {
            // SAFETY: a fresh block of at least `size` bytes.
            unsafe { check_zeroed(what, p, size) };
        }
        // SAFETY: as above.
        let usable = unsafe { pagewise::usable_size(p) };
        self.delta(what, before, 1, usable as i64);
        self.admit(what, p, size, align, tag);
    }

    fn free(&mut self, inp: &mut Input) {
        let Some(b) = self.live.pick(inp) else { return };
        let via_raw = inp.u8() & 1 == 1;
        trace!("free {:#x} size {} raw {via_raw}", b.addr, b.size);
        // SAFETY: the block is live.
        unsafe { check_block("free", b.addr, b.addr as *const u8, b.size, b.seed, b.size) };
        self.live.remove(b.addr);
        let before = snap();
        // SAFETY: live block, freed once; either API frees any pagewise block.
        unsafe {
            if via_raw {
                pagewise::raw::free(b.addr as *mut u8);
            } else {
                A.dealloc(b.addr as *mut u8, layout(&b));
            }
        }
        self.delta("free", before, -1, -(b.usable as i64));
    }

    fn realloc(&mut self, inp: &mut Input, via_raw: bool) {
        let Some(b) = self.live.pick(inp) else { return };
        let mut new_size = size(inp, MAX_HUGE);
        if via_raw && inp.u8() >= 248 {
            new_size = 0; // realloc(p, 0) keeps a 1-byte block here
        }
        if self.live.bytes - b.size + new_size > BUDGET {
            return;
        }
        trace!(
            "realloc {:#x} {} -> {new_size} raw {via_raw}",
            b.addr,
            b.size
        );
        // SAFETY: the block is live.
        unsafe {
            check_block(
                "before realloc",
                b.addr,
                b.addr as *const u8,
                b.size,
                b.seed,
                b.size,
            )
        };
        let before = snap();
        // SAFETY: live block with its layout; non-zero new size for GlobalAlloc.
        let p = unsafe {
            if via_raw {
                pagewise::raw::realloc(b.addr as *mut u8, new_size, b.align)
            } else {
                A.realloc(b.addr as *mut u8, layout(&b), new_size.max(1))
            }
        };
        let what = if via_raw {
            "raw::realloc"
        } else {
            "GlobalAlloc::realloc"
        };
        assert!(!p.is_null(), "{what}: null for {new_size} B");
        // SAFETY: `p` is live.
        let usable = unsafe { pagewise::usable_size(p) };
        self.delta(what, before, 0, usable as i64 - b.usable as i64);
        // The common prefix came along (checked where the old pattern put
        // its probes, read at the new place).
        // SAFETY: `p` has at least `new_size` bytes.
        unsafe { check_block(what, b.addr, p, b.size, b.seed, b.size.min(new_size)) };
        self.live.remove(b.addr);
        self.admit(what, p, new_size, b.align, b.tag);
    }

    fn send_away(&mut self, inp: &mut Input) {
        let n = 1 + inp.u8() as usize % BATCH;
        let mut batch = [EMPTY; BATCH];
        let mut k = 0;
        while k < n && !self.live.is_empty() {
            let b = self.live.pick(inp).unwrap();
            self.live.remove(b.addr);
            batch[k] = b;
            k += 1;
        }
        if k == 0 {
            return;
        }
        trace!("send {k} blocks to the worker");
        ensure_worker();
        let before = snap();
        send(&batch[..k]);
        let bytes: usize = batch[..k].iter().map(|b| b.usable).sum();
        self.delta("frees on the worker", before, -(k as i64), -(bytes as i64));
    }

    fn check_all(&self) {
        for b in self.live.blocks.values() {
            // SAFETY: live blocks.
            unsafe {
                check_block("check", b.addr, b.addr as *const u8, b.size, b.seed, b.size);
                assert_eq!(
                    pagewise::usable_size(b.addr as *const u8),
                    b.usable,
                    "usable size changed"
                );
            }
        }
        let s = pagewise::stats();
        assert!(s.live_allocations >= self.live.len() as u64, "{s:?}");
        assert!(s.live_bytes >= self.live.usable as u64, "{s:?}");
        let big = self.live.big as u64;
        assert!(
            s.large.count + s.huge.count >= big,
            "large+huge {} < {big}",
            s.large.count + s.huge.count
        );
        assert!(s.committed_bytes >= s.retained_bytes, "{s:?}");
        assert!(s.peak_committed_bytes >= s.committed_bytes, "{s:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    pagewise_fuzz::init();
    let mut inp = Input::new(data);
    let mut run = Run {
        live: Live::default(),
        counter: 0,
        exact: true,
    };
    // The worker thread and its handle are long-lived allocations: make
    // them before the baseline of the whole input.
    ensure_worker();
    let start = snap();
    while !inp.is_empty() {
        match inp.u8() % 16 {
            0..=2 => run.alloc(&mut inp, 0),
            3 => run.alloc(&mut inp, 1),
            4 => run.alloc(&mut inp, 2),
            5 => run.alloc(&mut inp, 3),
            6 => run.alloc(&mut inp, 4),
            7 | 8 => run.free(&mut inp),
            9 => run.realloc(&mut inp, false),
            10 => run.realloc(&mut inp, true),
            11 => run.send_away(&mut inp),
            12 => {
                trace!("trim");
                let before = snap();
                pagewise::trim();
                run.delta("trim", before, 0, 0);
            }
            13 => run.check_all(),
            14 => {
                trace!("restart the worker");
                stop_worker();
                ensure_worker();
                run.exact = false;
            }
            _ => {
                // Free many at once: what a program does between phases.
                let n = inp.u8() as usize % 64;
                for _ in 0..n {
                    run.free(&mut inp);
                }
            }
        }
    }
    run.check_all();
    let blocks: Vec<Block> = run.live.blocks.values().copied().collect();
    for b in blocks {
        // SAFETY: live blocks, freed once.
        unsafe {
            check_block(
                "final free",
                b.addr,
                b.addr as *const u8,
                b.size,
                b.seed,
                b.size,
            );
            A.dealloc(b.addr as *mut u8, layout(&b));
        }
    }
    let exact = run.exact;
    drop(run);
    if exact {
        // Everything this input allocated is freed, the model included.
        expect_delta("whole input", start, snap(), 0, 0);
    }
    // Start the next input from a trimmed allocator, so a reproducer
    // depends less on the inputs run before it.
    pagewise::trim();
});
