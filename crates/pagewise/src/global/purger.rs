//! The background purger: makes decay progress in a process that has gone
//! quiet, at no cost to the fast paths.
//!
//! jemalloc and mimalloc advance their decay only when the program calls the
//! allocator, so an idle process keeps its peak RSS (jemalloc #1398, #2688;
//! mimalloc_rust #141). pagewise starts one thread (raw pthread, no Rust
//! runtime, no allocation in its loop) the first time memory is retained:
//! at that free under the Rust global allocator, at the next allocation in
//! the C library (whose `free` glibc may call with a lock that
//! `pthread_create` needs). It
//! wakes every quarter of the decay delay. Each pass visits every heap
//! (`heaps::visit_all`): one whose thread exited as its owner, one whose
//! thread lives with its page lists only, skipped if its thread is on a
//! slow path: collects what other threads freed into it and releases its
//! emptied pages but the current ones; then, for
//! each heap whose earliest deadline has passed, it purges expired spans
//! under that heap's span lock (`try_lock`: a busy heap is simply visited
//! next round). Owner threads
//! never wait for it on their fast paths, which take no lock.
//!
//! Disable with `PAGEWISE_BACKGROUND=0`: purging then happens on slow paths.

use crate::global::{heaps, thread};
use crate::os::source::PageSource;
use crate::sync::lock::{self, Locked};
use core::sync::atomic::{AtomicBool, AtomicU8, Ordering::*};

const NOT_STARTED: u8 = 0;
const RUNNING: u8 = 1;
const OFF: u8 = 2;
/// A free retained memory; the next allocation starts the purger. The C
/// library's small `malloc`s find it out on their slow path, where the
/// request sends them (`heap::alloc::divert_small_mallocs`); the others
/// test for it.
const REQUESTED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(NOT_STARTED);
/// Set by the Rust global allocator: its frees never run inside glibc, so
/// a free's slow path may start the purger itself ([`after_free`]).
static FREE_MAY_START: AtomicBool = AtomicBool::new(false);
/// Held by the purger for each pass, and by `fork_prepare`.
static PASS: Locked<()> = Locked::new(());

/// Asks for the purger (a free retained memory). Never starts a thread
/// itself: glibc frees a dead thread's TLS while holding its stack-cache
/// lock, which `pthread_create` needs too, so starting one from `free`
/// can deadlock. The next allocation starts it ([`poll`]).
#[inline]
pub fn request() {
    if STATE.load(Relaxed) == NOT_STARTED {
        divert();
    }
}

/// [`request`] past its test: asks once, and sends every small `malloc`
/// of the C library to its slow path, which starts the purger ([`poll`]).
#[cold]
fn divert() {
    if STATE
        .compare_exchange(NOT_STARTED, REQUESTED, SeqCst, Relaxed)
        .is_err()
    {
        return;
    }
    crate::heap::alloc::divert_small_mallocs();
    // A `malloc` that started the purger between the request and the
    // diversion undid nothing: undo it here. (Otherwise the start comes
    // later in the single order of these operations, and so does its
    // undoing, after the diversion's stores.)
    if STATE.load(SeqCst) != REQUESTED {
        crate::heap::alloc::undivert_small_mallocs();
    }
}

/// Lets a free's slow path start the purger (the Rust global allocator,
/// whose frees never come from inside glibc).
pub(crate) fn allow_start_from_free() {
    if !FREE_MAY_START.load(Relaxed) {
        FREE_MAY_START.store(true, Relaxed);
    }
}

/// At the end of a free's slow path (cache flush), with no lock held and
/// no heap operation left in progress on this thread: starts the purger
/// where that is safe ([`allow_start_from_free`]), else asks for it.
#[cold]
pub(crate) fn after_free() {
    if FREE_MAY_START.load(Relaxed) {
        ensure();
    } else {
        request();
    }
}

/// Whether a free asked for the purger and [`poll`] would start it: the
/// allocation fast path then takes the slow path, which polls.
#[inline(always)]
pub fn poll_pending() -> bool {
    STATE.load(Relaxed) == REQUESTED
}

/// Starts the purger if a free asked for it. One relaxed load when not.
/// Call from allocation entry points, where no allocator lock is held and
/// no heap operation is in progress on this thread (creating a thread may
/// allocate).
#[inline]
pub fn poll() {
    if poll_pending() {
        start();
    }
}

/// Starts the purger now if it is enabled and not running. One relaxed
/// load when it is. Same conditions as [`poll`].
#[inline]
pub fn ensure() {
    let s = STATE.load(Relaxed);
    if s == NOT_STARTED || s == REQUESTED {
        start();
    }
}

#[cold]
fn start() {
    start_thread();
    // The small `malloc`s a request diverted go back to their fast path.
    crate::heap::alloc::undivert_small_mallocs();
}

fn start_thread() {
    if !thread::config().background {
        STATE.store(OFF, SeqCst);
        return;
    }
    let s = STATE.load(Relaxed);
    let startable = s == NOT_STARTED || s == REQUESTED;
    if !startable || STATE.compare_exchange(s, RUNNING, SeqCst, Relaxed).is_err() {
        return;
    }
    // glibc carves a thread's static TLS out of its stack, so a program
    // with more than 64 KiB of `__thread` data cannot have a 64 KiB thread:
    // then the default stack size (address space, touched only as used).
    if spawn(Some(64 * 1024)) != 0 && spawn(None) != 0 {
        // No thread: slow paths still purge. Do not retry every free.
        STATE.store(OFF, Relaxed);
    }
}

/// Starts the detached purger thread; returns pthread_create's result.
/// It starts with the program's signals blocked (a thread inherits its
/// creator's mask): it never runs a handler of the program, which could
/// store into a page it is copying (`os/signals.rs`).
fn spawn(stack: Option<usize>) -> i32 {
    let mask = crate::os::signals::block_async();
    let rc = spawn_thread(stack);
    crate::os::signals::restore(mask);
    rc
}

fn spawn_thread(stack: Option<usize>) -> i32 {
    // SAFETY: plain pthread calls with valid out-pointers; `run` has the
    // required signature and takes no argument.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        if let Some(size) = stack {
            libc::pthread_attr_setstacksize(&mut attr, size);
        }
        let mut tid: libc::pthread_t = core::mem::zeroed();
        let rc = libc::pthread_create(&mut tid, &attr, run, core::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        rc
    }
}

/// Whether the purger thread is running.
pub fn running() -> bool {
    STATE.load(Relaxed) == RUNNING
}

extern "C" fn run(_: *mut libc::c_void) -> *mut libc::c_void {
    let mut next_mesh = 0;
    loop {
        // Read each pass: `options::set` may change the delay.
        sleep_ms((thread::config().decay_ms / 4).clamp(10, 1000));
        let _pass = PASS.lock();
        #[cfg(target_os = "linux")]
        if heaps::meshing() {
            // The SIGSEGV handler back in front if the program (or the
            // Rust runtime, after the first allocation) put its own in.
            crate::os::segv::ensure();
        }
        let now = crate::global::heaps::SYSTEM.now_ms();
        // Batches no thread took within a decay period go home first, so
        // the visits below find their pages empty.
        crate::heap::transfer::send_home_older_than(
            now.saturating_sub(thread::config().decay_ms),
            true,
        );
        // Heaps whose thread exited or is elsewhere: nobody else would
        // collect what other threads freed into them or release their
        // emptied pages while the program is quiet.
        heaps::visit_all(core::ptr::null(), heaps::Busy::Skip, |h, l, who| {
            // SAFETY: `visit_all` hands over the page lists, and the heap
            // itself only with `Access::Owner`.
            unsafe { h.release_while_away(l, who) };
        });
        heaps::for_each_heap(|h| {
            if h.next_deadline.load(Relaxed) <= now {
                h.purge_expired(None);
            }
        });
        if heaps::meshing() && now >= next_mesh {
            // Once per decay period, after the visits above have hollowed
            // what can simply be purged; a heap meshes once it is quiet
            // (`MeshWhen::IfQuiet`).
            heaps::visit_all(core::ptr::null(), heaps::Busy::Skip, |h, l, _| {
                // SAFETY: `visit_all` hands over the page lists; other
                // threads' stores wait in the barrier during a copy.
                unsafe { h.mesh_pass(l, crate::heap::mesh::MeshWhen::IfQuiet(now), &PassHeld) };
            });
            next_mesh = now.saturating_add(thread::config().decay_ms);
        }
    }
}

fn sleep_ms(ms: u64) {
    // `as _`: the field types differ between C libraries (the libc crate
    // deprecates naming musl's `time_t`, which changes width).
    let ts = libc::timespec {
        tv_sec: (ms / 1000) as _,
        tv_nsec: ((ms % 1000) * 1_000_000) as _,
    };
    // SAFETY: valid timespec; an early wake-up (signal) only shortens a pass.
    unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
}

/// What the purger's mesh pass holds besides the heap's page lists: its
/// pass lock, then the visits' ([`heaps::VisitsHeld`]), let go between
/// chunks of the pass's rounds for a thread that waits for one of them (a fork's
/// handlers take both).
struct PassHeld;

impl crate::heap::mesh::Outer for PassHeld {
    fn wanted(&self) -> bool {
        PASS.waiting() || heaps::VisitsHeld.wanted()
    }
    fn let_go(&self) {
        heaps::VisitsHeld.let_go();
        // SAFETY: `run`'s guard holds it on this thread, and `take_again`
        // takes it back before the pass goes on.
        unsafe { lock::release(&PASS) };
    }
    fn take_again(&self) {
        lock::hold(&PASS);
        heaps::VisitsHeld.take_again();
    }
}

/// Keeps the purger out of its pass while the guard lives: `stats()`
/// counts every slot where it is (a thread cache, the transfer cache, a
/// page's remote frees, its heap's returned count), and a pass moves slots
/// between those places (batches from the transfer cache home to their
/// pages, exited threads' remote frees collected). A batch taken off the
/// transfer cache after its heaps were counted and before the transfer
/// cache was would be counted nowhere: live, though freed.
///
/// The guard is what [`crate::global::allocator::stats_held_off`] asks
/// for, so a caller that holds the pass already (a report, which reads
/// the kernel's figures inside the same hold) counts without taking the
/// lock twice, and no count is made without it.
pub(crate) fn hold_off() -> HeldOff {
    HeldOff(PASS.lock())
}

/// The purger kept out of its pass ([`hold_off`]) until this is dropped.
pub(crate) struct HeldOff(#[allow(dead_code)] lock::Guard<'static, ()>);

/// Keeps the purger out of its pass (fork preparation).
pub fn pause() {
    lock::hold(&PASS);
}

/// Lets the purger run again.
pub fn resume() {
    // SAFETY: paired with `pause` on this thread.
    unsafe { lock::release(&PASS) };
}

/// In a forked child: the purger thread does not exist there.
pub fn after_fork_child() {
    // SAFETY: only this thread exists in the child.
    unsafe { PASS.reset_after_fork() };
    if STATE.load(Relaxed) == RUNNING {
        STATE.store(NOT_STARTED, Relaxed);
    }
    // A request the parent diverted for may not have been undone yet.
    if STATE.load(Relaxed) != REQUESTED {
        crate::heap::alloc::undivert_small_mallocs();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A report keeps the purger out for its counts and the kernel's
    /// figures alike, and counts with the pass it holds: it must not take
    /// the pass a second time (it did once, and every report hung).
    #[test]
    fn a_report_takes_the_pass_once() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = crate::report();
            let _ = tx.send(r.stats.committed_bytes >= r.stats.retained_bytes);
        });
        // A deadlock detector, not a timing: a report takes milliseconds.
        let done = rx.recv_timeout(std::time::Duration::from_secs(60));
        assert_eq!(
            done,
            Ok(true),
            "report() did not return: it waits for itself"
        );
    }

    /// `stats()` counts nothing while a purger pass runs: it waits for the
    /// pass (here a pass held open, as `pause` holds it) to end. A stats
    /// count made during a pass could see a batch the pass took off the
    /// transfer cache neither there nor on its pages, and count its slots
    /// as live.
    #[test]
    fn stats_waits_for_a_purger_pass() {
        let ended = AtomicBool::new(false);
        pause();
        std::thread::scope(|s| {
            let counter = s.spawn(|| {
                let _ = crate::stats();
                // Whether the pass had ended when the count was made.
                ended.load(SeqCst)
            });
            // Long enough for the count to finish if nothing holds it back
            // (the assertion below is on order, not on time).
            std::thread::sleep(std::time::Duration::from_millis(50));
            ended.store(true, SeqCst);
            resume();
            assert!(
                counter.join().unwrap(),
                "stats() counted while a purger pass held its lock"
            );
        });
    }
}
