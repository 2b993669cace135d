//! The write barrier of meshing: while an OS page's live slots are copied
//! to its group's physical page, the page is read-only, and a thread that
//! stores to it takes a write-protection fault. This module's claim on
//! SIGSEGV ([`super::segv`], pagewise's one handler) makes such a thread
//! wait on a futex until the copy is done and then returns, so the store
//! is retried on the new mapping (Mesh's barrier, with a futex instead of
//! a lock). Linux only.
//!
//! The claim is only a write-protection fault (`SEGV_ACCERR`) on a page
//! pagewise made read-only: the range the copier protected ([`protect`],
//! until [`lower`]). Any other fault, a program's own `mprotect` of a heap
//! buffer included, goes to the handler installed before ours, or kills
//! the process as it would have without pagewise. A fault on a page that
//! was pagewise's when it happened but no longer is when the handler looks
//! (the copy ended in between) cannot be told from the program's own from
//! the page alone, so a fault outside the range is retried once: the
//! thread's record (its id, the page, and the count of ranges lowered)
//! says whether the same store faults again with nothing of pagewise's
//! having changed, and only then is it passed on.
//!
//! Where the kernel and the process's privileges allow, the page is
//! write-protected through a userfaultfd instead ([`super::uffd`]): a
//! store waits in the kernel, with no signal, and so does a system call
//! writing into the page. With `mprotect`, what it cannot do: the kernel
//! does not fault on behalf of a system call, so a `read(2)` into an
//! object on a page being copied fails with `EFAULT` instead of waiting;
//! and a program that replaces the SIGSEGV handler (Go's runtime, JVMs)
//! removes the barrier until the handler is put back in front.

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// `si_code` of a fault on a page whose protection forbids the access
/// (Linux's value; the libc crate does not name it).
const SEGV_ACCERR: i32 = 2;
/// `si_code` of a fault on an address with no mapping.
const SEGV_MAPERR: i32 = 1;

/// The process whose heap the allocator's shared pages are: set at
/// [`install`] and by a child the fork handlers gave a copy
/// ([`home_is_here`]). In any other process (a child forked without the
/// handlers) the heap is not mapped.
static HOME: AtomicI32 = AtomicI32::new(0);

/// Odd while a copy is under way (the futex word).
static WORD: AtomicU32 = AtomicU32::new(0);
/// Threads in [`wait_for_copy`]: the barrier's lowering wakes the futex
/// only when one is there.
static SLEEPERS: AtomicU32 = AtomicU32::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// `fn(usize) -> bool`: whether an address is the allocator's.
static OWNS: AtomicUsize = AtomicUsize::new(0);
/// The range the copier has made read-only (`PROTECTED_END` 0: none),
/// set before the `mprotect` and cleared once the barrier falls: while a
/// page is read-only by pagewise, it lies here.
static PROTECTED_START: AtomicUsize = AtomicUsize::new(0);
static PROTECTED_END: AtomicUsize = AtomicUsize::new(0);
/// Whether that range is write-protected through the userfaultfd
/// (`os/uffd.rs`: stores wait in the kernel, system calls' included)
/// rather than by `mprotect`.
static BY_UFFD: AtomicBool = AtomicBool::new(false);
/// Ranges lowered so far: a retried fault whose count changed may have
/// met another of pagewise's ranges.
static LOWERED: AtomicU64 = AtomicU64::new(0);
/// Per thread (by id, modulo the table), the last fault outside the range
/// retried: (thread id, page, `LOWERED` then).
const RETRIES: usize = 64;
static RETRY_TID: [AtomicI32; RETRIES] = [const { AtomicI32::new(0) }; RETRIES];
static RETRY_PAGE: [AtomicUsize; RETRIES] = [const { AtomicUsize::new(0) }; RETRIES];
static RETRY_LOWERED: [AtomicU64; RETRIES] = [const { AtomicU64::new(0) }; RETRIES];
/// Faults the handler made wait, and the longest wait in microseconds.
static WAITS: AtomicU64 = AtomicU64::new(0);
static LONGEST_US: AtomicU64 = AtomicU64::new(0);

/// While a fork is under way: the parent's pid; what a forked child runs
/// if it touches the heap (which it does not inherit) before its fork
/// handler ran; and what the parent runs for a store to a page not yet
/// copied for the child.
static FORK_PARENT: AtomicI32 = AtomicI32::new(0);
static CHILD_MAP: AtomicUsize = AtomicUsize::new(0);
static PARENT_COPY: AtomicUsize = AtomicUsize::new(0);

/// Turns the barrier on for the life of the process: from now on pages are
/// made read-only while copied, and the handler is (re)installed before
/// each protection by `mprotect` (the one whose faults it handles). `owns` says whether an address belongs to the allocator's
/// shared pages; it must be async-signal-safe (no locks, no allocation).
pub fn install(owns: fn(usize) -> bool) -> bool {
    OWNS.store(owns as usize, Relaxed);
    home_is_here();
    // Where the kernel and the process's privileges allow, pages are
    // write-protected through a userfaultfd; `mprotect` otherwise.
    super::uffd::open();
    super::segv::register(super::segv::Client::Barrier, claim);
    INSTALLED.store(true, Release);
    // In place from the start, not only from the first copy: a child
    // forked without the fork handlers must be told why it faults.
    super::segv::ensure();
    true
}

/// This process's heap is its own (at [`install`], and in a child the
/// fork handlers gave a copy of the heap).
pub fn home_is_here() {
    // SAFETY: plain system call (async-signal-safe).
    HOME.store(unsafe { libc::getpid() }, Relaxed);
}

/// Whether the handler is installed (so pages may be made read-only).
pub fn installed() -> bool {
    INSTALLED.load(Acquire)
}

/// Held by the one copier at a time (the purger, a `mesh()` call, an owned
/// heap's pass, a fork).
static COPIER: AtomicBool = AtomicBool::new(false);
/// The userfaultfd as the copier found it when it raised the barrier (-1:
/// none): the copier's process does not change while it holds the
/// barrier, so it is asked for once per raising, not per call.
static COPIER_UFFD: AtomicI32 = AtomicI32::new(-1);

/// Raises the barrier: faults on the allocator's read-only pages wait.
/// Waits for another copier to lower it first.
pub fn raise() {
    while COPIER
        .compare_exchange_weak(false, true, Acquire, Relaxed)
        .is_err()
    {
        core::hint::spin_loop();
    }
    COPIER_UFFD.store(super::uffd::fd(), Relaxed);
    WORD.fetch_add(1, AcqRel);
}

/// Lowers the barrier and wakes every thread waiting on it (a system call
/// each only where a thread waits: a pass lowers it once per page).
pub fn lower() {
    if BY_UFFD.swap(false, Relaxed) {
        // Threads waiting in the kernel on pages since remapped retry on
        // the new mapping once woken. Each left a message, read here; with
        // none, no thread waits (the range is remapped or writable again,
        // so none can start waiting now), and no wake is needed.
        let fd = COPIER_UFFD.load(Relaxed);
        let faults = super::uffd::take_faults(fd);
        WAITS.fetch_add(faults.unwrap_or(0), Relaxed);
        if faults != Some(0) {
            let start = PROTECTED_START.load(Relaxed);
            super::uffd::wake(fd, start, PROTECTED_END.load(Relaxed) - start);
        }
    }
    PROTECTED_END.store(0, Release);
    LOWERED.fetch_add(1, AcqRel);
    // Sequentially consistent with `wait_for_copy`'s count and load: a
    // thread that read the word odd is counted in SLEEPERS by now, and
    // one not counted yet will read it even (or the kernel will, at its
    // futex wait, and return at once).
    WORD.fetch_add(1, SeqCst);
    COPIER.store(false, Release);
    if SLEEPERS.load(SeqCst) != 0 {
        #[cfg(test)]
        tests::FUTEX_WAKES.with(|n| n.set(n.get() + 1));
        // SAFETY: futex wake on our own word; wakes at most i32::MAX waiters.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                WORD.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
            )
        };
    }
}

/// Marks a fork under way (the heap read-only until each page is copied
/// for the child): in the child, a fault on the heap before its fork
/// handler ran (glibc frees memory there) runs `child_map`, which maps the
/// child's copy (true if it did just now); in the parent, a store to a
/// page in the protected range runs `parent_copy(addr)`, which copies the
/// page and makes it writable (false if it could not). Both must be
/// async-signal-safe.
pub fn fork_begin(child_map: fn() -> bool, parent_copy: fn(usize) -> bool) {
    CHILD_MAP.store(child_map as usize, Relaxed);
    PARENT_COPY.store(parent_copy as usize, Relaxed);
    // SAFETY: plain system call (async-signal-safe).
    FORK_PARENT.store(unsafe { libc::getpid() }, Release);
}

/// The fork is over (in parent and child).
pub fn fork_end() {
    FORK_PARENT.store(0, Release);
}

/// Makes `addr..addr+len` read-only (before its bytes are copied), and
/// claims the faults on it until the barrier falls.
///
/// # Safety
/// A page-aligned range of the allocator's shared pages, under a raised
/// barrier; it is remapped or made writable again before the barrier falls.
/// One range at a time, or a range covering those before.
pub unsafe fn protect(addr: usize, len: usize) -> bool {
    let fd = COPIER_UFFD.load(Relaxed);
    if PROTECTED_END.load(Relaxed) == 0 && super::uffd::protect(fd, addr, len, true) {
        PROTECTED_START.store(addr, Relaxed);
        PROTECTED_END.store(addr + len, Release);
        BY_UFFD.store(true, Relaxed);
        return true;
    }
    // SAFETY: per the caller.
    unsafe { protect_by_mprotect(addr, len) }
}

/// [`protect`] always by `mprotect`, whose faults reach the SIGSEGV
/// handler (the fork's copy, which copies a faulting page at once).
///
/// # Safety
/// As [`protect`].
pub unsafe fn protect_by_mprotect(addr: usize, len: usize) -> bool {
    let (start, end) = match PROTECTED_END.load(Relaxed) {
        0 => (addr, addr + len),
        end => (PROTECTED_START.load(Relaxed).min(addr), end.max(addr + len)),
    };
    PROTECTED_START.store(start, Relaxed);
    PROTECTED_END.store(end, Release);
    // The handler in front of any the program has put in since, before a
    // store can fault.
    super::segv::ensure();
    // SAFETY: per the caller.
    unsafe { libc::mprotect(addr as *mut libc::c_void, len, libc::PROT_READ) == 0 }
}

/// Whether `addr` is in the range pagewise has made read-only now.
fn protected(addr: usize) -> bool {
    let end = PROTECTED_END.load(Acquire);
    end != 0 && addr < end && addr >= PROTECTED_START.load(Relaxed)
}

/// For a write-protection fault outside pagewise's range: true the first
/// time (retry it: it may have been pagewise's, the copy over by now),
/// false when the same thread faults on the same page again with no range
/// lowered since (the protection is the program's).
fn retry_once(addr: usize) -> bool {
    // SAFETY: plain system call (async-signal-safe).
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    let page = addr & !(crate::memory::layout::os_page() - 1);
    let lowered = LOWERED.load(Acquire);
    let i = tid as usize % RETRIES;
    if RETRY_TID[i].load(Relaxed) == tid
        && RETRY_PAGE[i].load(Relaxed) == page
        && RETRY_LOWERED[i].load(Relaxed) == lowered
    {
        RETRY_TID[i].store(0, Relaxed);
        return false;
    }
    RETRY_TID[i].store(tid, Relaxed);
    RETRY_PAGE[i].store(page, Relaxed);
    RETRY_LOWERED[i].store(lowered, Relaxed);
    true
}

/// Makes `addr..addr+len` writable again (a copy that did not happen).
///
/// # Safety
/// As [`protect`].
pub unsafe fn unprotect(addr: usize, len: usize) -> bool {
    if BY_UFFD.load(Relaxed) {
        return super::uffd::protect(COPIER_UFFD.load(Relaxed), addr, len, false);
    }
    // SAFETY: per the caller.
    unsafe {
        libc::mprotect(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
        ) == 0
    }
}

/// Faults made to wait so far, and the longest wait in microseconds.
pub fn waits() -> (u64, u64) {
    (WAITS.load(Relaxed), LONGEST_US.load(Relaxed))
}

fn now_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; clock_gettime is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

/// The barrier's claim on a fault ([`super::segv`]): a write-protection
/// fault on the allocator's shared pages waits for the copy (or, in a
/// forked child, makes the child's own copy), then is retried.
fn claim(info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) -> bool {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    let owns = OWNS.load(Relaxed);
    // SAFETY: OWNS holds a `fn(usize) -> bool` stored by `install`.
    let ours = owns != 0 && unsafe { core::mem::transmute::<usize, fn(usize) -> bool>(owns) }(addr);
    if !ours {
        return false;
    }
    let parent = FORK_PARENT.load(Acquire);
    // SAFETY: plain system call (async-signal-safe).
    let in_child = parent != 0 && unsafe { libc::getpid() } != parent;
    if code == SEGV_MAPERR {
        if in_child {
            // SAFETY: stored by `fork_begin` as a `fn() -> bool`.
            let map =
                unsafe { core::mem::transmute::<usize, fn() -> bool>(CHILD_MAP.load(Relaxed)) };
            return map();
        }
        not_inherited();
        return false;
    }
    if code != SEGV_ACCERR || in_child {
        return false;
    }
    if !protected(addr) {
        // Not (or no longer) pagewise's: retried once, then passed on.
        return retry_once(addr);
    }
    if parent != 0 {
        // SAFETY: stored by `fork_begin` as a `fn(usize) -> bool`.
        let copy =
            unsafe { core::mem::transmute::<usize, fn(usize) -> bool>(PARENT_COPY.load(Relaxed)) };
        if copy(addr) {
            WAITS.fetch_add(1, Relaxed);
            return true;
        }
    }
    wait_for_copy();
    true
}

/// A fault on the heap where it is not mapped: in a child forked without
/// the fork handlers (`_Fork()`, the raw system call), which does not
/// inherit the heap (`MADV_DONTFORK`), one line says so before the fault
/// takes its course (the default action, or the program's handler).
fn not_inherited() {
    // SAFETY: plain system call (async-signal-safe).
    if unsafe { libc::getpid() } != HOME.load(Relaxed) {
        crate::fault::write_stderr(&[
            b"pagewise: a child forked without the fork handlers (_Fork() or the fork system call) \
touched the heap, which it does not inherit with PAGEWISE_MESH=1 (such a child may only exec or _exit)\n",
        ]);
    }
}

/// Waits while the barrier is up (the fault's page is being copied).
fn wait_for_copy() {
    let start = now_us();
    SLEEPERS.fetch_add(1, SeqCst);
    loop {
        let w = WORD.load(SeqCst);
        if w & 1 == 0 {
            break;
        }
        // SAFETY: futex wait on our own word while it still holds `w`.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                WORD.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                w,
                core::ptr::null::<libc::timespec>(),
            )
        };
    }
    SLEEPERS.fetch_sub(1, Relaxed);
    WAITS.fetch_add(1, Relaxed);
    LONGEST_US.fetch_max(now_us().saturating_sub(start), Relaxed);
}

#[cfg(test)]
mod tests {
    use crate::source::{PageSource, SharedPages};

    std::thread_local! {
        /// This thread's futex wakes at a lowering.
        pub(super) static FUTEX_WAKES: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
    }

    #[test]
    fn a_copy_under_the_barrier_asks_for_the_process_once() {
        if !super::super::uffd::open() {
            eprintln!("no userfaultfd here: nothing to count");
            return;
        }
        let pages = SharedPages::new();
        let p = pages.map(1 << 25, 1 << 25).unwrap().as_ptr() as usize;
        let os = crate::memory::layout::os_page();
        let lookups = || super::super::uffd::tests::FD_LOOKUPS.with(|n| n.get());
        let wakes = || super::super::uffd::tests::WAKES.with(|n| n.get());
        let futex_wakes = || FUTEX_WAKES.with(|n| n.get());
        let (before, woken, futexed) = (lookups(), wakes(), futex_wakes());
        super::raise();
        // SAFETY: a page of our shared mapping, under the raised barrier,
        // made writable again before it falls.
        unsafe {
            assert!(super::protect(p, os));
            assert!(super::unprotect(p, os));
        }
        super::lower();
        assert_eq!(
            lookups() - before,
            1,
            "raise, protect, unprotect, lower: one lookup of the userfaultfd"
        );
        assert_eq!(wakes() - woken, 0, "no thread waited: no UFFDIO_WAKE");
        assert_eq!(
            futex_wakes() - futexed,
            0,
            "no thread waited: no futex wake"
        );
        // SAFETY: the whole mapping, unused.
        unsafe { pages.unmap(core::ptr::NonNull::new(p as *mut u8).unwrap(), 1 << 25) };
    }
}
