//! The `threads` workload's shape: in its timed rounds, every object a
//! worker thread frees was allocated by another thread (the larson-like
//! server of the issue). Checked with a global allocator that tags each
//! block with the thread that allocated it and counts, on the workload's
//! threads, frees of blocks from the same thread and from another one.

use pagewise_bench::workloads::{self, Rec, Scale};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// System's allocator with a 16-byte header holding the allocating thread's
/// id (blocks aligned above 16 are passed through untagged).
struct Tagging;

const HEADER: usize = 16;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static TRACK: AtomicBool = AtomicBool::new(false);
static SAME: AtomicU64 = AtomicU64::new(0);
static CROSS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static ID: Cell<u64> = const { Cell::new(0) };
    /// Set on the thread that drives the workload (its setup and the final
    /// frees are not the rounds).
    static DRIVER: Cell<bool> = const { Cell::new(false) };
}

fn thread_id() -> u64 {
    ID.try_with(|c| {
        if c.get() == 0 {
            c.set(NEXT_ID.fetch_add(1, Relaxed));
        }
        c.get()
    })
    .unwrap_or(0)
}

fn tagged(l: Layout) -> Option<Layout> {
    (l.align() <= HEADER)
        .then(|| Layout::from_size_align(l.size() + HEADER, HEADER).expect("layout"))
}

// SAFETY: every block comes from System with the header added (or unchanged
// for alignments above 16), and is given back to System the same way.
unsafe impl GlobalAlloc for Tagging {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let Some(t) = tagged(l) else {
            // SAFETY: as the caller's.
            return unsafe { System.alloc(l) };
        };
        // SAFETY: a non-zero layout; the header is inside the block.
        unsafe {
            let p = System.alloc(t);
            if p.is_null() {
                return p;
            }
            (p as *mut u64).write(thread_id());
            p.add(HEADER)
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        let Some(t) = tagged(l) else {
            // SAFETY: as the caller's.
            return unsafe { System.dealloc(p, l) };
        };
        // SAFETY: `p` is HEADER bytes into a block made by `alloc` with `t`.
        unsafe {
            let base = p.sub(HEADER);
            let owner = (base as *const u64).read();
            if TRACK.load(Relaxed) && !DRIVER.try_with(|d| d.get()).unwrap_or(false) {
                if owner == thread_id() {
                    SAME.fetch_add(1, Relaxed);
                } else {
                    CROSS.fetch_add(1, Relaxed);
                }
            }
            System.dealloc(base, t);
        }
    }
}

#[global_allocator]
static GLOBAL: Tagging = Tagging;

#[test]
fn every_free_in_the_rounds_is_of_another_threads_object() {
    DRIVER.with(|d| d.set(true));
    let mut rec = Rec::new();
    TRACK.store(true, Relaxed);
    let survivors = workloads::run("threads", Scale::Tiny, 7, &mut rec).expect("threads");
    TRACK.store(false, Relaxed);
    for o in survivors.as_slice() {
        pagewise_bench::util::free_obj(*o);
    }
    let (same, cross) = (SAME.load(Relaxed), CROSS.load(Relaxed));
    assert_eq!(
        same, 0,
        "frees of a thread's own objects ({cross} cross-thread)"
    );
    // Tiny: 200 slots, 10 rounds, 2 then 4 threads: 12,000 frees in rounds.
    assert!(cross >= 12_000, "only {cross} cross-thread frees");
}
