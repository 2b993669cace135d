//! The hardened free's check of the word before its slot (the end of the
//! slot before: an underflow) racing the meshing of the slot's page: the
//! free read the page's slab word, and the whole pass (the page made
//! uncacheable, its free slots withheld, its live slots copied and its OS
//! page remapped onto a group page) runs before it reads that word. The
//! slot before was free on the page's own memory; on the group page its
//! address shows another member's live object, whose end was armed for
//! that object's own address. Read as this page's, it looks like a write
//! past the end of the slot before, and the free must not report it (nor
//! read it as anything): the program did nothing wrong. The
//! schedule-perturbation build lets the test put `pagewise::mesh()`
//! exactly inside that window (`pagewise::set_window_hook`), on the
//! allocator's own code:
//!
//! ```sh
//! RUSTFLAGS="--cfg pagewise_perturb" CARGO_TARGET_DIR=target/perturb \
//!     cargo test --release -p pagewise --features secure --test secure_mesh_race
//! ```
#![cfg(all(pagewise_perturb, feature = "secure", target_os = "linux"))]

mod reexec;

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

const CHILD: &str = "PAGEWISE_TEST_SECURE_MESH_RACE_CHILD";
/// The request: a 64-byte slot with its tail word.
const SIZE: usize = 48;
const SLOT: usize = 64;
/// Blocks of the test: eight slab pages of 64 KiB.
const N: usize = 8 * (64 << 10) / SLOT;

static ARMED: AtomicBool = AtomicBool::new(false);
/// The live block freed in the window.
static VICTIM: AtomicUsize = AtomicUsize::new(0);
/// The last word of the slot before it, before the pass.
static BEFORE: AtomicUsize = AtomicUsize::new(0);
/// Every other live object, each filled with its own address.
static SURVIVORS: OnceLock<Vec<usize>> = OnceLock::new();

fn os_page() -> usize {
    pagewise::layout::os_page()
}

fn say(s: &[u8]) {
    // SAFETY: writes a buffer to stderr (async-signal-safe).
    unsafe { libc::write(2, s.as_ptr().cast(), s.len()) };
}

/// Whether every survivor still holds its own address in every word.
fn survivors_intact() -> bool {
    SURVIVORS.get().unwrap().iter().all(|&s| {
        // SAFETY: a live allocation of SIZE bytes of this process.
        (0..SIZE / 8).all(|w| unsafe { ((s as *const usize).add(w)).read_volatile() } == s)
    })
}

/// The last word of the slot before the victim, as its address shows it.
fn neighbour_word() -> usize {
    let v = VICTIM.load(Relaxed);
    // SAFETY: inside the victim's OS page (it is not the page's first
    // slot), which is mapped: a slab page in use.
    unsafe { ((v - 8) as *const usize).read_volatile() }
}

/// Runs inside the hardened free's window: once armed, one mesh pass,
/// which meshes the victim's page onto a group page whose object sits
/// where the slot before the victim is.
fn mesh_in_the_window() {
    if ARMED.swap(false, Relaxed) {
        let joined = pagewise::mesh();
        if joined >= 8 {
            say(b"meshed in the window\n");
        }
        if neighbour_word() != BEFORE.load(Relaxed) {
            say(b"the slot before shows another object\n");
        }
    }
}

#[test]
fn a_free_racing_the_meshing_of_its_page_reports_no_underflow() {
    let mut cmd = reexec::this_binary();
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("PAGEWISE_MESH", "1");
    let out = reexec::output_within(cmd, std::time::Duration::from_secs(300));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("meshed in the window")
            && stderr.contains("the slot before shows another object"),
        "the race was not set up: stdout {stdout:?}, stderr {stderr:?}"
    );
    assert!(
        !stderr.contains("underflow") && stderr.contains("still running, survivors intact"),
        "a sound free was reported: stdout {stdout:?}, stderr {stderr:?}"
    );
    assert!(out.status.success(), "stdout {stdout:?}, stderr {stderr:?}");
}

/// The child: the pages of a thread that has exited keep the even slots
/// of every other OS page live and the odd slots of the others, so that
/// each OS page meshes with one of the others and every free slot's
/// address shows a live object once they have; this thread frees a live
/// slot whose slot before is free, while `mesh()` runs.
#[test]
fn child() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let a = pagewise::Pagewise;
    let l = Layout::from_size_align(SIZE, 8).unwrap();
    // SAFETY: non-zero layouts; each block is freed once.
    unsafe {
        // This thread needs a heap (a cache) of its own.
        let _warm = std::hint::black_box(a.alloc(Layout::from_size_align(4096, 8).unwrap()));
        let (survivors, victim) = std::thread::spawn(move || {
            let blocks: Vec<usize> = (0..N).map(|_| a.alloc(l) as usize).collect();
            let mut pages: Vec<usize> = blocks.iter().map(|b| b / os_page()).collect();
            pages.sort_unstable();
            pages.dedup();
            let (mut survivors, mut victim) = (Vec::new(), 0);
            for &b in &blocks {
                assert_eq!(b % SLOT, 0, "not a {SLOT}-byte slot");
                let rank = pages.binary_search(&(b / os_page())).unwrap();
                let pos = b % os_page() / SLOT;
                if (pos % 2 == 0) == (rank % 2 == 0) {
                    if victim == 0 && rank > 4 && pos >= 2 {
                        victim = b;
                        continue;
                    }
                    (0..SIZE / 8).for_each(|w| (b as *mut usize).add(w).write(b));
                    survivors.push(b);
                } else {
                    a.dealloc(b as *mut u8, l);
                }
            }
            (survivors, victim)
        })
        .join()
        .unwrap();
        assert_ne!(victim, 0);
        SURVIVORS.set(survivors).unwrap();
        VICTIM.store(victim, Relaxed);
        BEFORE.store(neighbour_word(), Relaxed);
        pagewise::set_window_hook(Some(mesh_in_the_window));
        ARMED.store(true, Relaxed);
        a.dealloc(victim as *mut u8, l);
        pagewise::set_window_hook(None);
        assert!(!ARMED.load(Relaxed), "the free met no window");
        say(if survivors_intact() {
            b"still running, survivors intact\n"
        } else {
            b"still running, a survivor was overwritten\n"
        });
    }
    std::process::exit(0);
}
