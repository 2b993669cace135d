//! A double free that lands in a thread cache while the slot's page is
//! being meshed: the free read the page as cacheable, and the whole pass
//! (the page made uncacheable, its free slots withheld, its live slots
//! copied and its OS page remapped onto a group page) runs before the free
//! stores the slot's cache key. Had the slot's OS page meshed, its address
//! would show another page's object, which the key would overwrite (it
//! did, before frees announced their slot: `memory/cache_handshake.rs`);
//! the pass must leave that OS page out, and the double free must still be
//! reported. The
//! schedule-perturbation build lets the test put `pagewise::mesh()` exactly
//! inside that window (`pagewise::set_window_hook`), on the allocator's own
//! code:
//!
//! ```sh
//! RUSTFLAGS="--cfg pagewise_perturb" CARGO_TARGET_DIR=target/perturb \
//!     cargo test --release -p pagewise --test mesh_race
//! ```
#![cfg(all(pagewise_perturb, target_os = "linux"))]

mod reexec;

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

const CHILD: &str = "PAGEWISE_TEST_MESH_RACE_CHILD";
const SIZE: usize = 64;
/// Blocks of the test: eight slab pages of 64 KiB.
const N: usize = 8 * (64 << 10) / SIZE;

static ARMED: AtomicBool = AtomicBool::new(false);
/// The slot freed twice.
static VICTIM: AtomicUsize = AtomicUsize::new(0);
/// Every live object, each filled with its own address.
static SURVIVORS: OnceLock<Vec<usize>> = OnceLock::new();

fn os_page() -> usize {
    pagewise::layout::os_page()
}

/// Whether every survivor still holds its own address in every word.
fn survivors_intact() -> bool {
    SURVIVORS.get().unwrap().iter().all(|&s| {
        // SAFETY: a live 64-byte allocation of this process.
        (0..SIZE / 8).all(|w| unsafe { ((s as *const usize).add(w)).read_volatile() } == s)
    })
}

fn say(s: &[u8]) {
    // SAFETY: writes a buffer to stderr (async-signal-safe).
    unsafe { libc::write(2, s.as_ptr().cast(), s.len()) };
}

/// The abort that reports the double free: was any object overwritten?
extern "C" fn on_abort(_: libc::c_int) {
    say(if survivors_intact() {
        b"survivors intact\n"
    } else {
        b"a survivor was overwritten\n"
    });
    // SAFETY: ends the process at once, as the abort would.
    unsafe { libc::_exit(134) };
}

/// Runs inside the free fast path's window: once armed, one mesh pass,
/// which meshes the page of the slot being freed onto a group page whose
/// object sits where the slot is.
fn mesh_in_the_window() {
    if ARMED.swap(false, Relaxed) {
        let joined = pagewise::mesh();
        let v = VICTIM.load(Relaxed);
        // SAFETY: the victim's OS page is mapped (a slab page in use).
        let shown = unsafe { (v as *const usize).read_volatile() };
        if joined >= 8 {
            say(b"meshed in the window\n");
        }
        if SURVIVORS.get().unwrap().contains(&shown) {
            say(b"the victim shows a live object\n");
        }
    }
}

#[test]
fn a_double_free_racing_the_meshing_of_its_page_overwrites_nothing() {
    let mut cmd = reexec::this_binary();
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("PAGEWISE_MESH", "1");
    let out = reexec::output_within(cmd, std::time::Duration::from_secs(300));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("meshed in the window"),
        "the race was not set up: stdout {stdout:?}, stderr {stderr:?}"
    );
    assert!(
        !stderr.contains("overwritten"),
        "stdout {stdout:?}, stderr {stderr:?}"
    );
    assert!(
        stderr.contains("pagewise: double free") && stderr.contains("survivors intact"),
        "the double free went unreported: stdout {stdout:?}, stderr {stderr:?}"
    );
}

/// The child: the pages of a thread that has exited keep the slots of the
/// first half of each OS page live on every other OS page, the second half
/// on the others, so that each OS page meshes with one of the others and
/// every free slot's address shows a live object once they have; this
/// thread frees one of those free slots again while `mesh()` runs.
#[test]
fn child() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let a = pagewise::Pagewise;
    let l = Layout::from_size_align(SIZE, 8).unwrap();
    // SAFETY: non-zero layouts; the one double free is the test.
    unsafe {
        // This thread needs a heap (a cache) of its own.
        let _warm = std::hint::black_box(a.alloc(Layout::from_size_align(4096, 8).unwrap()));
        let (survivors, victim) = std::thread::spawn(move || {
            let blocks: Vec<usize> = (0..N).map(|_| a.alloc(l) as usize).collect();
            let mut pages: Vec<usize> = blocks.iter().map(|b| b / os_page()).collect();
            pages.sort_unstable();
            pages.dedup();
            let per_page = os_page() / SIZE;
            let (mut survivors, mut victim) = (Vec::new(), 0);
            for &b in &blocks {
                let rank = pages.binary_search(&(b / os_page())).unwrap();
                let pos = b % os_page() / SIZE;
                let first_half = pos < per_page / 2;
                if first_half == (rank % 2 == 0) {
                    (0..SIZE / 8).for_each(|w| (b as *mut usize).add(w).write(b));
                    survivors.push(b);
                } else {
                    if victim == 0 && rank > 4 && rank % 2 == 0 {
                        victim = b;
                    }
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
        libc::signal(
            libc::SIGABRT,
            on_abort as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        pagewise::set_window_hook(Some(mesh_in_the_window));
        ARMED.store(true, Relaxed);
        a.dealloc(victim as *mut u8, l);
        pagewise::set_window_hook(None);
        // Still running: the slot's OS page was left out of the pass, and
        // the slot is on its page's free list twice. A thread that takes
        // the exited thread's heap and allocates meets it there.
        std::thread::spawn(move || {
            for _ in 0..4 * N {
                std::hint::black_box(a.alloc(l));
            }
        })
        .join()
        .unwrap();
        say(if survivors_intact() {
            b"survivors intact, double free unreported\n"
        } else {
            b"a survivor was overwritten, double free unreported\n"
        });
    }
    std::process::exit(0);
}
