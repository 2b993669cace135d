//! The transfer cache: slots one thread frees are allocated again by the
//! next thread that asks, whichever heap their pages belong to, instead of
//! waiting in the pages of the heap that allocated them (its own test
//! binary: it reads the global statistics, and `trim()` empties the
//! transfer cache of every class). Tests take `SERIAL`: one at a time.

// Built by the `pagewise-secure` package too, whose library has its own name.
#[cfg(pagewise_secure_package)]
extern crate pagewise_secure as pagewise;

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

use pagewise::size_class::{class_of, SLOT_SIZE};
use std::alloc::{alloc, dealloc, Layout};
use std::collections::HashSet;
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

/// Slots of a class the test harness's threads may hold in their caches
/// (starting a thread allocates and frees a few small structures).
const FEW: u64 = 4;

/// Live blocks of a class that the harness holds: none in the default
/// build; in the hardened one, a block whose request fills a smaller
/// class's slot exactly takes a slot of the next class for its canary
/// (2,048 bytes in a 2,560-byte slot), and the harness keeps a few such.
fn harness_live() -> u64 {
    if cfg!(feature = "secure") {
        FEW
    } else {
        0
    }
}

/// Blocks of `size` bytes allocated on the calling thread, as addresses.
fn allocate(size: usize, n: usize) -> Vec<usize> {
    let layout = Layout::from_size_align(size, 8).unwrap();
    (0..n)
        .map(|_| {
            // SAFETY: non-zero size.
            let p = unsafe { alloc(layout) };
            assert!(!p.is_null());
            p as usize
        })
        .collect()
}

fn free_all(size: usize, blocks: &[usize]) {
    let layout = Layout::from_size_align(size, 8).unwrap();
    for &p in blocks {
        // SAFETY: allocated by `allocate` with this layout, freed once.
        unsafe { dealloc(p as *mut u8, layout) };
    }
}

/// Allocates `n` blocks here, frees them on a thread that then exits.
fn freed_by_an_exited_thread(size: usize, n: usize) -> Vec<usize> {
    let blocks = allocate(size, n);
    let mine = blocks.clone();
    std::thread::spawn(move || free_all(size, &mine))
        .join()
        .unwrap();
    blocks
}

fn class_stats(size: usize) -> pagewise::ClassStats {
    pagewise::stats().classes[class_of(size)]
}

#[test]
fn slots_freed_on_one_thread_are_allocated_on_another() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const SIZE: usize = 1000;
    const N: usize = 1500; // 1.5 MiB: the transfer cache holds 2 MiB a class
    let freed: HashSet<usize> = freed_by_an_exited_thread(SIZE, N).into_iter().collect();
    let committed = pagewise::stats().committed_bytes;
    // A third thread (a heap of its own, whose pages hold none of them).
    let again = std::thread::spawn(|| allocate(SIZE, N)).join().unwrap();
    let reused = again.iter().filter(|p| freed.contains(p)).count();
    let grown = pagewise::stats().committed_bytes.saturating_sub(committed);
    free_all(SIZE, &again);
    // Without the transfer cache the frees go home to the main thread's
    // pages, which only the main thread allocates from: the third thread
    // carves new pages for all N blocks and reuses none.
    assert!(reused * 10 >= N * 9, "{reused} of {N} blocks reused");
    // The third thread's own start (its stack bookkeeping, the result
    // vector) may commit a few fresh OS pages too, 64 KiB each at a
    // 64 KiB page: allow four besides a tenth of the blocks. Without the
    // transfer cache all N blocks are fresh (1.5 MiB).
    let slot = SLOT_SIZE[class_of(SIZE)] as u64;
    let os_page = pagewise::layout::os_page() as u64;
    assert!(
        grown < (N as u64 / 10) * slot + 4 * os_page,
        "{grown} bytes committed for blocks that were free"
    );
}

#[test]
fn slots_in_the_transfer_cache_count_as_free_and_cached() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const SIZE: usize = 1500;
    const N: usize = 1000;
    let _ = freed_by_an_exited_thread(SIZE, N);
    let c = class_stats(SIZE);
    assert_eq!(c.live_slots, 0, "{c:?}");
    // All but what the main thread's own cache of the class may hold are
    // in the transfer cache (the exited thread's cache went there too).
    assert!(c.cached_slots as usize >= N - 128, "{c:?}");
}

#[test]
fn trim_sends_the_transfer_cache_home() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const SIZE: usize = 2500;
    const N: usize = 600;
    let _ = freed_by_an_exited_thread(SIZE, N);
    assert!(class_stats(SIZE).cached_slots > 0);
    pagewise::trim();
    let c = class_stats(SIZE);
    // Home, the pages emptied and went back: what is left of the class is
    // at most a slot or two that the harness's own threads (starting ours)
    // freed into their caches, which only they touch, and their pages.
    assert!(
        c.live_slots <= harness_live() && c.cached_slots <= FEW && c.pages <= FEW,
        "{c:?}"
    );
}

#[test]
fn the_purger_sends_them_home_when_the_program_is_quiet() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const SIZE: usize = 3500;
    const N: usize = 400;
    pagewise::options::set("decay_ms", "40").unwrap();
    // Allocated on a thread of its own too, so that no live thread's cache
    // (which only its thread touches) holds a slot of the class.
    std::thread::spawn(|| freed_by_an_exited_thread(SIZE, N))
        .join()
        .unwrap();
    assert!(class_stats(SIZE).cached_slots > 0);
    // The purger wakes every decay/4 (at least 10 ms): a batch older than
    // the decay goes home; give it many passes, then check.
    let mut c = class_stats(SIZE);
    for _ in 0..200 {
        if c.cached_slots <= FEW && c.pages <= FEW {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        c = class_stats(SIZE);
    }
    pagewise::options::set("decay_ms", "1000").unwrap();
    // As after `trim()`: a slot or two in the harness threads' caches.
    assert!(
        c.live_slots <= harness_live() && c.cached_slots <= FEW && c.pages <= FEW,
        "{c:?}"
    );
}
