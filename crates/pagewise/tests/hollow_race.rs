//! A double free that lands in a thread cache while the slot's page is
//! being hollowed: the free read the page as cacheable, and the page's OS
//! pages are checked and given back before the free stores its key (the
//! window `memory/cache_handshake.rs` closes). The schedule-perturbation
//! build lets the test put `trim()` exactly inside that window
//! (`pagewise::set_window_hook`), on the allocator's own code:
//!
//! ```sh
//! RUSTFLAGS="--cfg pagewise_perturb" CARGO_TARGET_DIR=target/perturb \
//!     cargo test --release -p pagewise --test hollow_race
//! ```
//!
//! Without the handshake the slot went into the cache while its OS page
//! was given back, and both the cache and the page handed it out. Now the
//! page sees the slot announced and keeps its OS page, and the double
//! free is reported when the page hands the slot out again.
#![cfg(pagewise_perturb)]

mod reexec;

use std::alloc::{GlobalAlloc, Layout};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

const CHILD: &str = "PAGEWISE_TEST_HOLLOW_RACE_CHILD";

static ARMED: AtomicBool = AtomicBool::new(false);

/// Runs inside the free fast path's window: once armed, one `trim()`,
/// which hollows the page of the slot being freed.
fn trim_in_the_window() {
    if ARMED.swap(false, Relaxed) {
        let before = pagewise::stats().hollow_bytes;
        pagewise::trim();
        if pagewise::stats().hollow_bytes > before {
            // (This test binary's own allocator is the system's.)
            println!("hollowed in the window");
        }
    }
}

#[test]
fn a_double_free_racing_the_hollowing_of_its_page_aborts() {
    let out = reexec::this_binary()
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the double free went unreported: {stdout}"
    );
    assert!(
        stderr.contains("pagewise: double free"),
        "stdout {stdout:?}, stderr {stderr:?}"
    );
    assert!(
        stdout.contains("hollowed in the window"),
        "the race was not set up: {stdout:?}"
    );
}

/// The child: a page of a thread that has exited keeps one live block and
/// a freed slot `a` on its free list; this thread frees `a` again while
/// `trim()` hollows the page.
#[test]
fn child() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let a = pagewise::Pagewise;
    let l = Layout::from_size_align(64, 8).unwrap();
    // SAFETY: non-zero layouts; the one double free is the test.
    unsafe {
        // This thread needs a heap (a cache) of its own.
        let _warm = std::hint::black_box(a.alloc(Layout::from_size_align(4096, 8).unwrap()));
        let (n, victim) = std::thread::spawn(move || {
            let n = 1024;
            let blocks: Vec<usize> = (0..n).map(|_| a.alloc(l) as usize).collect();
            for &b in &blocks[1..] {
                a.dealloc(b as *mut u8, l);
            }
            pagewise::trim();
            assert!(pagewise::stats().hollow_bytes > 0, "the page was hollowed");
            // Allocate until the page carves its hollow slots again (the
            // free slots of its first OS page go first): then every slot
            // not handed out is on its free list with the page key.
            let mut again = Vec::new();
            while pagewise::stats().hollow_bytes > 0 && again.len() < n {
                again.push(a.alloc(l) as usize);
            }
            assert_eq!(pagewise::stats().hollow_bytes, 0, "carved again");
            assert!(!again.contains(&blocks[900]));
            (n, blocks[900])
        })
        .join()
        .unwrap();
        pagewise::set_window_hook(Some(trim_in_the_window));
        ARMED.store(true, Relaxed);
        a.dealloc(victim as *mut u8, l);
        pagewise::set_window_hook(None);
        // Still running: the free was taken. Look for an address handed
        // out twice, by this thread's cache and by a thread that carves
        // the page again.
        let mine: Vec<usize> = (0..8).map(|_| a.alloc(l) as usize).collect();
        let theirs =
            std::thread::spawn(move || (0..4 * n).map(|_| a.alloc(l) as usize).collect::<Vec<_>>())
                .join()
                .unwrap();
        let mut seen = HashSet::new();
        for p in mine.into_iter().chain(theirs) {
            if !seen.insert(p) {
                println!("handed out twice: {p:#x}");
            }
        }
    }
    std::process::exit(0);
}
