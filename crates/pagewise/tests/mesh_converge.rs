//! Meshing converges, the same way every run: a pass plans every sparse OS
//! page it finds, however many (not a fixed number per pass); and a program
//! that leaves one object per OS page at a random offset, phase after
//! phase, ends with the same memory whether or not the background pass ran
//! between its phases (as the purger's does, at whatever moments its thread
//! gets to run), reached within a few passes once it is quiet. Passes are
//! driven explicitly on an owned heap with a clock of the test's own, so
//! nothing depends on a thread's timing.
#![cfg(target_os = "linux")]

use pagewise::{Heap, PageSource, SharedPages};
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

fn os_page() -> usize {
    pagewise::layout::os_page()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

struct Obj {
    p: NonNull<u8>,
    layout: Layout,
}

/// `SharedPages` with a mapping budget of `cap` kernel mappings for the
/// planner, and a clock the test moves.
struct Capped {
    pages: SharedPages,
    cap: usize,
    clock: AtomicU64,
}

impl Capped {
    fn new(cap: usize) -> Capped {
        Capped {
            pages: SharedPages::new(),
            cap,
            clock: AtomicU64::new(1),
        }
    }
    fn advance(&self, ms: u64) {
        self.clock.fetch_add(ms, Relaxed);
    }
}

// SAFETY: forwards to `SharedPages`, which upholds the contract.
unsafe impl PageSource for Capped {
    fn map(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        self.pages.map(size, align)
    }
    unsafe fn unmap(&self, ptr: NonNull<u8>, size: usize) {
        // SAFETY: forwarded.
        unsafe { self.pages.unmap(ptr, size) }
    }
    unsafe fn purge(&self, ptr: NonNull<u8>, size: usize, how: pagewise::Purge) -> bool {
        // SAFETY: forwarded.
        unsafe { self.pages.purge(ptr, size, how) }
    }
    fn now_ms(&self) -> u64 {
        self.clock.load(Relaxed)
    }
    fn syscalls(&self) -> pagewise::SyscallCounts {
        self.pages.syscalls()
    }
    fn sharing(&self) -> Option<&dyn pagewise::source::SharePages> {
        Some(self)
    }
}

// SAFETY: forwards to `SharedPages`.
unsafe impl pagewise::source::SharePages for Capped {
    unsafe fn share(&self, founder: usize) -> bool {
        // SAFETY: forwarded.
        unsafe { self.pages.sharing().unwrap().share(founder) }
    }
    unsafe fn join(&self, founder: usize, member: usize, ranges: &[(usize, usize)]) -> bool {
        // SAFETY: forwarded.
        unsafe { self.pages.sharing().unwrap().join(founder, member, ranges) }
    }
    unsafe fn leave(&self, member: usize, how: pagewise::source::Leave) -> bool {
        // SAFETY: forwarded.
        unsafe { self.pages.sharing().unwrap().leave(member, how) }
    }
    fn group_of(&self, addr: usize) -> Option<usize> {
        self.pages.sharing().unwrap().group_of(addr)
    }
    fn members(&self, founder: usize) -> usize {
        self.pages.sharing().unwrap().members(founder)
    }
    fn foundings(&self, founder: usize) -> usize {
        self.pages.sharing().unwrap().foundings(founder)
    }
    fn shared(&self) -> (usize, usize) {
        self.pages.sharing().unwrap().shared()
    }
    fn seams(&self) -> usize {
        self.pages.sharing().unwrap().seams()
    }
    fn seam_budget(&self) -> (usize, usize) {
        (self.seams(), self.cap)
    }
}

/// One phase: `n` objects of 16-512 B, then one survivor per OS page
/// touched, at random, the rest freed.
fn phase(heap: &Heap<Capped>, n: usize, rng: &mut Rng, kept: &mut Vec<Obj>) {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        let size = (rng.below(63) + 2) * 8;
        let layout = Layout::from_size_align(size, 8).unwrap();
        all.push(Obj {
            p: heap.allocate(layout).unwrap().cast(),
            layout,
        });
    }
    let mut by_page: std::collections::BTreeMap<usize, Vec<Obj>> = Default::default();
    for o in all {
        by_page
            .entry(o.p.as_ptr() as usize / os_page())
            .or_default()
            .push(o);
    }
    for (_, objs) in by_page {
        let keep = rng.below(objs.len());
        for (i, o) in objs.into_iter().enumerate() {
            if i == keep {
                kept.push(o);
            } else {
                // SAFETY: allocated above with its layout, freed once.
                unsafe { heap.deallocate(o.p, o.layout) };
            }
        }
    }
}

/// The default decay period, which paces the background pass.
const DECAY_MS: u64 = 1000;

/// Ten phases of the program, a background pass after each if
/// `passes_while_running` (the phases a little shorter than a decay period
/// apart), then quiet: a background pass per decay period. Returns the
/// live bytes and the memory (the memfd files' blocks) after each quiet
/// pass.
fn run(passes_while_running: bool, seed: u64) -> (usize, Vec<u64>) {
    let os = os_page();
    // 600 OS pages of objects per phase (200 of larger pages, to keep the
    // debug build's test short).
    let n = if os > 4096 { 200 } else { 600 } * os / 264;
    let heap = Heap::with_source(Capped::new(usize::MAX), Default::default());
    let mut rng = Rng(seed);
    let mut kept = Vec::new();
    for _ in 0..10 {
        phase(&heap, n, &mut rng, &mut kept);
        heap.source().advance(DECAY_MS * 3 / 5);
        if passes_while_running {
            // SAFETY: this thread is the heap's only user.
            unsafe { heap.mesh_if_quiet() };
        }
    }
    let live: usize = kept.iter().map(|o| o.layout.size()).sum();
    let mut memory = Vec::new();
    for _ in 0..4 {
        heap.source().advance(DECAY_MS);
        // SAFETY: as above.
        unsafe { heap.mesh_if_quiet() };
        memory.push(heap.source().pages.held_bytes());
    }
    for o in kept {
        // SAFETY: live, freed once.
        unsafe { heap.deallocate(o.p, o.layout) };
    }
    (live, memory)
}

/// Passes between the phases of a program still running would mesh pages
/// whose free slots its next phase fills (a meshed page's free slots are
/// withheld, so that phase takes fresh pages: a higher peak) and spend
/// the mapping budget on groups of a state that does not last, so the
/// outcome would depend on when they ran. The background pass waits until
/// the heap has taken no new slab page for a decay period; once quiet, two
/// passes reach it (the first starts the pages' clock, the second
/// meshes them), within 2 %.
#[test]
fn where_meshing_ends_does_not_depend_on_passes_while_the_program_ran() {
    let (live_a, quiet_only) = run(false, 0x5eed);
    let (live_b, also_running) = run(true, 0x5eed);
    eprintln!(
        "live {live_a} / {live_b} B; memory per quiet pass: quiet only {quiet_only:?}, \
         passes while running too {also_running:?}"
    );
    // Utilization (live bytes / memory) after the quiet passes.
    let (ua, ub) = (
        live_a as f64 / quiet_only[3] as f64,
        live_b as f64 / also_running[3] as f64,
    );
    assert!(
        ub >= ua * 0.95,
        "passes while the program ran: utilization {ub:.3} against {ua:.3}"
    );
    // The same program (the passes' releases move a few survivors).
    assert!(
        live_a.abs_diff(live_b) <= live_a / 50,
        "{live_a} / {live_b}"
    );
    assert!(quiet_only[1] < quiet_only[0] * 9 / 10, "{quiet_only:?}");
    for m in [&quiet_only, &also_running] {
        // Within 2 % of the end after two passes, and nothing left to
        // gain after three.
        assert!(
            m[1] <= m[3] + m[3] / 50 && m[2] == m[3],
            "converged within two quiet passes: {m:?}"
        );
    }
}

/// A pass plans every sparse OS page of a class, however many, in rounds
/// as large as its scratch memory: the next pass finds nothing left to
/// join. Where a pass took a fixed number of a class's candidates, the
/// rest waited for later passes, one decay period each.
#[test]
fn one_pass_plans_every_candidate_of_a_class() {
    let os = os_page();
    if os > 16 << 10 {
        // 4,700 OS pages of 64 KiB would map 294 MiB.
        eprintln!("skipped at a {os} B OS page");
        return;
    }
    let heap = Heap::with_source(Capped::new(usize::MAX), Default::default());
    // 64 objects per OS page, on more OS pages than a pass's scratch
    // memory holds candidates (4,096).
    let layout = Layout::from_size_align(os / 64, 8).unwrap();
    let per_page = 64;
    let pages = 4700;
    let mut rng = Rng(7);
    let mut kept = Vec::new();
    let blocks: Vec<NonNull<u8>> = (0..pages * per_page)
        .map(|_| heap.allocate(layout).unwrap().cast())
        .collect();
    let mut by_page: std::collections::BTreeMap<usize, Vec<NonNull<u8>>> = Default::default();
    for p in blocks {
        by_page.entry(p.as_ptr() as usize / os).or_default().push(p);
    }
    for (_, ps) in by_page {
        let keep = rng.below(ps.len());
        for (i, p) in ps.into_iter().enumerate() {
            if i == keep {
                kept.push(p);
            } else {
                // SAFETY: allocated above with `layout`, freed once.
                unsafe { heap.deallocate(p, layout) };
            }
        }
    }
    // SAFETY: this thread is the heap's only user.
    let (first, second) = unsafe { (heap.mesh(), heap.mesh()) };
    eprintln!(
        "{} sparse OS pages: {first} joined, then {second}",
        kept.len()
    );
    assert!(
        first >= pages * 9 / 10,
        "{first} of {pages} OS pages joined"
    );
    assert!(second <= first / 50, "{second} more joined a pass later");
    for p in kept {
        // SAFETY: live, freed once.
        unsafe { heap.deallocate(p, layout) };
    }
}
