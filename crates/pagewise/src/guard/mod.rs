//! Sampled guard pages: a few allocations, picked at random, are put where
//! a bug that touches them faults at once, in production builds.
//!
//! With `PAGEWISE_GUARD_SAMPLE=N`, about one allocation in `N` of at most
//! an OS page (by the global allocator and `libpagewise.so`) goes to a small
//! pool of slots, each an OS page between two inaccessible ones:
//! the block sits against the end of its slot, or one time in two against
//! its start, and its slot is made inaccessible when it is freed and reused
//! last. A bug in such a block stops the program where it happens, with
//! one line naming the kind and the address, then the stacks that matter
//! (the access, the allocation, the free), function names included:
//!
//! - *overflow*: a read or write in the guard page after a block (or, at
//!   the free, in the bytes between its end and that page);
//! - *underflow*: in the guard page before a block;
//! - *use after free*: a read or write of a freed block;
//! - *double free*, and *invalid free* (a pointer into the pool that does
//!   not start a live block).
//!
//! Faults anywhere else are the program's: they go to the handler it
//! installed, or end it as they would have. This is GWP-ASan's design
//! (Chrome and Android ship it on), drawn by the same countdown as the heap
//! profiler: on the fast paths it costs nothing. Off by default
//! (`docs/guide/memory-bugs.md` says what a rate costs). Linux only.
//!
//! ```
//! // Without PAGEWISE_GUARD_SAMPLE nothing is guarded.
//! assert_eq!(pagewise::guard::sample_rate(), 0);
//! assert_eq!(pagewise::guard::stats().allocations, 0);
//! ```

#[cfg(target_os = "linux")]
mod pool;
#[cfg(target_os = "linux")]
mod report;
#[cfg(target_os = "linux")]
mod report_stack;
#[cfg(target_os = "linux")]
mod symbol;

use core::sync::atomic::{AtomicUsize, Ordering::*};

/// One allocation in this many is guarded (0: off); `usize::MAX`: not read
/// yet.
static RATE: AtomicUsize = AtomicUsize::new(usize::MAX);

/// About one allocation in how many (of at most an OS page) the global
/// allocator guards: `PAGEWISE_GUARD_SAMPLE`, read once (0: off, the
/// default; always 0 off Linux).
///
/// ```
/// assert_eq!(pagewise::guard::sample_rate(), 0, "off unless asked for");
/// ```
pub fn sample_rate() -> usize {
    let r = RATE.load(Relaxed);
    if r != usize::MAX {
        return r;
    }
    let r = if cfg!(target_os = "linux") {
        crate::config::Variable::GuardSample
            .number()
            .map_or(0, |v| v as usize)
    } else {
        0
    };
    RATE.store(r, Relaxed);
    r
}

/// How many guarded blocks can live at once: `PAGEWISE_GUARD_SLOTS`
/// (default 64, at most 16,384; each holds an OS page while its block
/// lives). Read when the pool is made.
#[cfg(target_os = "linux")]
fn slots() -> usize {
    crate::config::Variable::GuardSlots
        .number()
        .map_or(pool::SLOTS, |v| (v as usize).clamp(1, pool::MAX_SLOTS))
}

/// What the guard pool has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardStats {
    /// Allocations put in the pool since the process began.
    pub allocations: u64,
    /// Of them, live now.
    pub live: usize,
    /// Blocks the pool can hold at once (0 until the first is guarded).
    pub slots: usize,
    /// Whether the pool's inaccessible pages are the kernel's guard regions
    /// (Linux 6.13 and later), rather than `mprotect`ed.
    pub guard_regions: bool,
}

/// What the guard pool has done so far.
///
/// ```
/// let s = pagewise::guard::stats();
/// assert!(s.live as u64 <= s.allocations);
/// ```
pub fn stats() -> GuardStats {
    #[cfg(target_os = "linux")]
    if let Some(p) = live::pool() {
        let (allocations, live) = p.counts();
        return GuardStats {
            allocations,
            live,
            slots: p.slots(),
            guard_regions: p.mode() == crate::os::guard_pages::Mode::Regions,
        };
    }
    GuardStats::default()
}

/// Whether `addr` lies in the guard pool (a guarded block, or the pages
/// around them). Async-signal-safe.
///
/// ```
/// let x = 0u8;
/// assert!(!pagewise::guard::owns(&x as *const u8 as usize));
/// ```
#[inline]
pub fn owns(addr: usize) -> bool {
    #[cfg(target_os = "linux")]
    if let Some(p) = live::pool() {
        return p.owns(addr);
    }
    let _ = addr;
    false
}

#[cfg(all(target_os = "linux", feature = "secure"))]
pub(crate) use live::size_at_free;
#[cfg(target_os = "linux")]
pub(crate) use live::{alloc, free, usable_size};
#[cfg(target_os = "linux")]
pub(crate) use report::found_elsewhere;

/// The process's pool and the operations on it.
#[cfg(target_os = "linux")]
mod live {
    use super::pool::{Place, Pool, State};
    use super::report::{self, Kind};
    use core::sync::atomic::{AtomicU8, Ordering::*};

    /// The pool: mapped by the first guarded allocation.
    static POOL: Once = Once::new();

    /// A pool made once (no lock: the loser of the race serves its
    /// allocation unguarded).
    struct Once {
        state: AtomicU8,
        pool: core::cell::UnsafeCell<core::mem::MaybeUninit<Pool>>,
    }

    // SAFETY: `pool` is written once, by the thread that moved `state` from
    // EMPTY to MAKING, and read only after `state` is READY (acquire).
    unsafe impl Sync for Once {}

    const EMPTY: u8 = 0;
    const MAKING: u8 = 1;
    const READY: u8 = 2;
    const FAILED: u8 = 3;

    impl Once {
        const fn new() -> Once {
            Once {
                state: AtomicU8::new(EMPTY),
                pool: core::cell::UnsafeCell::new(core::mem::MaybeUninit::uninit()),
            }
        }

        fn get(&self) -> Option<&Pool> {
            if self.state.load(Acquire) != READY {
                return None;
            }
            // SAFETY: READY: written once and never again (type comment).
            Some(unsafe { (*self.pool.get()).assume_init_ref() })
        }

        fn make(&self) -> Option<&Pool> {
            if let Some(p) = self.get() {
                return Some(p);
            }
            if self
                .state
                .compare_exchange(EMPTY, MAKING, Acquire, Relaxed)
                .is_err()
            {
                return None;
            }
            let Some(p) = Pool::map(crate::memory::layout::os_page(), super::slots(), false) else {
                self.state.store(FAILED, Release);
                return None;
            };
            // SAFETY: we moved the state to MAKING: nobody else writes or
            // reads the pool until READY.
            unsafe { (*self.pool.get()).write(p) };
            crate::os::segv::register(crate::os::segv::Client::Guard, claim);
            self.state.store(READY, Release);
            self.get()
        }
    }

    pub(super) fn pool() -> Option<&'static Pool> {
        POOL.get()
    }

    /// A guarded block of `size` bytes at `align` (null: served as usual:
    /// too big, every slot live, or no pool).
    pub(crate) fn alloc(size: usize, align: usize) -> *mut u8 {
        let page = crate::memory::layout::os_page();
        if size == 0 || size > page || align > page {
            return core::ptr::null_mut();
        }
        let Some(p) = POOL.make() else {
            return core::ptr::null_mut();
        };
        // Our handler goes (back) in front of whatever the program put in
        // since the last guarded block.
        crate::os::segv::ensure();
        p.alloc(size, align)
    }

    /// Frees a block of the pool (`owns(addr)`), or reports why it
    /// cannot; returns the block's size.
    pub(crate) fn free(addr: usize) -> usize {
        let Some(p) = pool() else { return 0 };
        let Place::Slot(i) = p.place(addr) else {
            report::misuse(p, Kind::InvalidFree, addr, None)
        };
        let r = p.record(i);
        let (start, size) = r.block();
        match r.state() {
            State::Live if addr == start => {
                if !p.claim_live(i) {
                    report::misuse(p, Kind::DoubleFree, addr, Some(i));
                }
                if !p.slack_intact(start, size) {
                    report::misuse(p, Kind::OverflowAtFree, addr, Some(i));
                }
                p.release(i);
                size
            }
            State::Freed | State::Busy if addr == start => {
                report::misuse(p, Kind::DoubleFree, addr, Some(i))
            }
            State::Unused => report::misuse(p, Kind::InvalidFree, addr, None),
            _ => report::misuse(p, Kind::InvalidFree, addr, Some(i)),
        }
    }

    /// The size of the block of the pool a free of `addr` would free, or
    /// the report of why it cannot: a block freed already is a double
    /// free, an address that starts no live block an invalid free (as
    /// [`free`] judges them, without freeing). The hardened free's check.
    #[cfg(feature = "secure")]
    pub(crate) fn size_at_free(addr: usize) -> usize {
        let Some(p) = pool() else { return 0 };
        let Place::Slot(i) = p.place(addr) else {
            report::misuse(p, Kind::InvalidFree, addr, None)
        };
        let r = p.record(i);
        let (start, size) = r.block();
        match r.state() {
            State::Live if addr == start => size,
            State::Freed | State::Busy if addr == start => {
                report::misuse(p, Kind::DoubleFree, addr, Some(i))
            }
            State::Unused => report::misuse(p, Kind::InvalidFree, addr, None),
            _ => report::misuse(p, Kind::InvalidFree, addr, Some(i)),
        }
    }

    /// The usable size of a live block of the pool: its requested size
    /// from `addr` on (its slack holds the pattern, so it is not usable).
    pub(crate) fn usable_size(addr: usize) -> usize {
        let Some(p) = pool() else { return 0 };
        if let Place::Slot(i) = p.place(addr) {
            let r = p.record(i);
            let (start, size) = r.block();
            if r.state() == State::Live && addr >= start && addr < start + size {
                return start + size - addr;
            }
            report::misuse(p, Kind::InvalidFree, addr, Some(i));
        }
        report::misuse(p, Kind::InvalidFree, addr, None)
    }

    /// The guard's claim on a SIGSEGV ([`crate::os::segv`]): a fault in the
    /// pool is a bug in a guarded block: reported, then passed on (to the
    /// handler that was there before pagewise's, or to the default action,
    /// which ends the process), never claimed.
    fn claim(info: *mut libc::siginfo_t, ctx: *mut libc::c_void) -> bool {
        // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
        let addr = unsafe { (*info).si_addr() } as usize;
        if let Some(p) = pool().filter(|p| p.owns(addr)) {
            let (access, pc) = cpu(ctx);
            report::fault(p, addr, access, pc);
        }
        false
    }

    /// Whether the faulting access was a write, and the faulting
    /// instruction's address, where the CPU's context tells (0: unknown).
    fn cpu(ctx: *mut libc::c_void) -> (report::Access, usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let uc = ctx as *const libc::ucontext_t;
            // SAFETY: the kernel passes a valid ucontext for SA_SIGINFO
            // handlers; bit 1 of the page-fault error code is "write".
            let (err, pc) = unsafe {
                let g = &(*uc).uc_mcontext.gregs;
                (
                    g[libc::REG_ERR as usize],
                    g[libc::REG_RIP as usize] as usize,
                )
            };
            let access = if err & 2 != 0 {
                report::Access::Write
            } else {
                report::Access::Read
            };
            (access, pc)
        }
        #[cfg(target_arch = "aarch64")]
        {
            let uc = ctx as *const libc::ucontext_t;
            // SAFETY: as above; the program counter of the faulting access.
            let pc = unsafe { (*uc).uc_mcontext.pc } as usize;
            (report::Access::Unknown, pc)
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            let _ = ctx;
            (report::Access::Unknown, 0)
        }
    }
}
