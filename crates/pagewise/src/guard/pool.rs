//! The guard pool: a number of slots (64 unless `PAGEWISE_GUARD_SLOTS`
//! says otherwise) of one OS page each, every slot between
//! two inaccessible pages, and a record per slot (its block, its state, the
//! stacks that allocated and freed it) in a mapping of its own, out of
//! reach of any overflow from a block.
//!
//! ```text
//! | guard | slot 0 | guard | slot 1 | guard | ... | slot N-1 | guard |
//! ```
//!
//! A block sits against the end of its slot (an overflow runs into the next
//! guard page), or, one time in two, against its start (an underflow runs
//! into the previous one). The bytes between the block's end and the next
//! guard page (fewer than its alignment) hold a pattern checked at the
//! free. A freed slot is made inaccessible, and the slot freed
//! longest ago is reused first, so a use after free faults for as long as
//! the pool can keep it.
//!
//! No lock: a slot is claimed and released by compare-and-swap on its
//! state, so a signal handler or a forked child cannot find it held (a
//! fork in the middle of a claim loses that one slot in the child).

use core::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};

use crate::os::guard_pages;
use crate::profile::unwind;

/// Slots in the pool by default: how many guarded blocks can live at once.
pub const SLOTS: usize = 64;

/// Most slots a pool can have (`PAGEWISE_GUARD_SLOTS` is capped here).
pub const MAX_SLOTS: usize = 1 << 14;

/// The byte written between a right-aligned block's end and its slot's end.
pub const PATTERN: u8 = 0xa5;

/// A slot's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    /// Never used.
    Unused = 0,
    /// Holds a live block.
    Live = 1,
    /// Its block was freed; inaccessible until reused.
    Freed = 2,
    /// Claimed by a thread that is filling or emptying it.
    Busy = 3,
}

impl State {
    fn from(v: u8) -> State {
        match v {
            0 => State::Unused,
            1 => State::Live,
            2 => State::Freed,
            _ => State::Busy,
        }
    }
}

/// A call stack kept in a record (atomics: a report may read it while a
/// slot is reused).
pub struct Stack {
    len: AtomicUsize,
    frames: [AtomicUsize; unwind::DEPTH],
    thread: AtomicU32,
}

impl Stack {
    /// Takes the calling stack. All of it: how many of its innermost
    /// frames are the allocator's depends on what the compiler inlined and
    /// on the path taken; the report leaves them out by name.
    fn take(&self) {
        let mut frames = [0usize; unwind::DEPTH];
        let n = unwind::capture(&mut frames, 0);
        for (to, &f) in self.frames.iter().zip(&frames[..n]) {
            to.store(f, Relaxed);
        }
        self.len.store(n, Relaxed);
        self.thread.store(thread_id(), Relaxed);
    }

    /// The frames kept, innermost first, into `out`; how many.
    pub fn read(&self, out: &mut [usize; unwind::DEPTH]) -> usize {
        let n = self.len.load(Relaxed).min(unwind::DEPTH);
        for (o, f) in out.iter_mut().zip(&self.frames[..n]) {
            *o = f.load(Relaxed);
        }
        n
    }

    /// The thread that took it.
    pub fn thread(&self) -> u32 {
        self.thread.load(Relaxed)
    }
}

/// The calling thread's kernel id (what `ps -L` and gdb show).
pub fn thread_id() -> u32 {
    // SAFETY: plain system call, no arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// What the pool knows of one slot.
pub struct Record {
    state: AtomicU8,
    /// The block's address and requested size.
    start: AtomicUsize,
    size: AtomicUsize,
    /// When it was last freed (a count of frees): the smallest is reused
    /// first.
    freed_at: AtomicU64,
    /// The stacks that allocated and last freed the block.
    pub alloc: Stack,
    pub free: Stack,
}

impl Record {
    /// The slot's state (acquire: the fields it covers are read after).
    pub fn state(&self) -> State {
        State::from(self.state.load(Acquire))
    }

    /// The block's address and requested size (for a live or freed slot).
    pub fn block(&self) -> (usize, usize) {
        (self.start.load(Relaxed), self.size.load(Relaxed))
    }

    fn claim(&self, from: State) -> bool {
        self.state
            .compare_exchange(from as u8, State::Busy as u8, Acquire, Relaxed)
            .is_ok()
    }

    fn set(&self, to: State) {
        self.state.store(to as u8, Release);
    }
}

/// Where in the pool an address lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// In slot `i`'s page.
    Slot(usize),
    /// In the guard page before slot `i` (`i == slots`: after the last).
    Guard(usize),
}

/// The pool: its reservation and its records.
pub struct Pool {
    base: usize,
    page: usize,
    slots: usize,
    mode: guard_pages::Mode,
    records: *const Record,
    /// Mixed into the choice of side (differs between runs).
    seed: u64,
}

// SAFETY: the records are atomics in a mapping that lives as long as the
// process; the reservation's addresses are plain numbers.
unsafe impl Sync for Pool {}

/// Frees so far (orders the reuse of slots).
static FREES: AtomicU64 = AtomicU64::new(1);
/// Guarded allocations so far, and a random state for the side a block
/// sits against.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

impl Pool {
    /// Maps a pool of `slots` slots of `page` bytes (with `mprotect` if
    /// `protect`, else the kernel's guard regions where it has them);
    /// `None` if the OS refuses.
    pub fn map(page: usize, slots: usize, protect: bool) -> Option<Pool> {
        // One page more, so that the slots can start at a multiple of the
        // page (a mapping is aligned to the kernel's page only, which
        // `page` may exceed).
        let (base, mode) = guard_pages::reserve((2 * slots + 2) * page, protect)?;
        let base = base.next_multiple_of(page);
        let records = guard_pages::map_records(slots * core::mem::size_of::<Record>())?;
        Some(Pool {
            base,
            page,
            slots,
            mode,
            records: records as *const Record,
            seed: crate::os::random::random_word() as u64,
        })
    }

    /// The size of the reservation.
    pub fn len(&self) -> usize {
        (2 * self.slots + 1) * self.page
    }

    /// How it makes pages inaccessible.
    pub fn mode(&self) -> guard_pages::Mode {
        self.mode
    }

    /// How many blocks it can hold at once.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Whether `addr` lies in the pool (slots and guard pages).
    pub fn owns(&self, addr: usize) -> bool {
        addr.wrapping_sub(self.base) < self.len()
    }

    /// Where `addr` (in the pool) lies.
    pub fn place(&self, addr: usize) -> Place {
        let n = (addr - self.base) / self.page;
        if n % 2 == 1 {
            Place::Slot(n / 2)
        } else {
            Place::Guard(n / 2)
        }
    }

    /// Slot `i`'s first byte.
    pub fn slot_start(&self, i: usize) -> usize {
        self.base + (2 * i + 1) * self.page
    }

    /// Slot `i`'s record.
    pub fn record(&self, i: usize) -> &Record {
        assert!(i < self.slots);
        // SAFETY: `records` maps `slots` zeroed records (a zeroed `Record` is
        // an unused slot: all atomics) for the life of the process.
        unsafe { &*self.records.add(i) }
    }

    /// A block of `size` bytes (at most a page) aligned to `align` (a power
    /// of two, at most `size`'s largest power of two and 16 for a C
    /// `malloc`): null if every slot is live or the OS refuses.
    pub fn alloc(&self, size: usize, align: usize) -> *mut u8 {
        let Some(i) = self.claim_slot() else {
            return core::ptr::null_mut();
        };
        let slot = self.slot_start(i);
        let r = self.record(i);
        // SAFETY: a page-aligned slot of the reservation that we hold.
        if !unsafe { guard_pages::open(slot, self.page, self.mode) } {
            r.set(State::Freed);
            return core::ptr::null_mut();
        }
        let mut n = ALLOCATIONS.fetch_add(1, Relaxed) ^ self.seed;
        let left = crate::profile::gap::next_random(&mut n) & 1 == 0;
        let start = if left {
            slot
        } else {
            (slot + self.page - size) & !(align - 1)
        };
        let end = start + size;
        // SAFETY: `end..` and the slot's end are in the slot just opened.
        unsafe { core::ptr::write_bytes(end as *mut u8, PATTERN, self.slack(end)) };
        r.start.store(start, Relaxed);
        r.size.store(size, Relaxed);
        r.alloc.take();
        r.set(State::Live);
        start as *mut u8
    }

    /// Bytes after a block ending at `end` that hold the pattern: to the
    /// slot's end, at most 64 (a block against its slot's start has most
    /// of the page after it; its small overflows land in the first bytes).
    fn slack(&self, end: usize) -> usize {
        let to_page = (self.page - end % self.page) % self.page;
        to_page.min(64)
    }

    /// Whether the pattern after the block `start..start+size` is intact.
    pub fn slack_intact(&self, start: usize, size: usize) -> bool {
        let end = start + size;
        // SAFETY: the slot is open (its block is live): the bytes after the
        // block up to `slack` are in it.
        let after = unsafe { core::slice::from_raw_parts(end as *const u8, self.slack(end)) };
        after.iter().all(|&b| b == PATTERN)
    }

    /// The unused slot first, then the one freed longest ago, claimed.
    fn claim_slot(&self) -> Option<usize> {
        for _ in 0..4 {
            let mut best: Option<(usize, State, u64)> = None;
            for i in 0..self.slots {
                let r = self.record(i);
                let s = r.state();
                let at = match s {
                    State::Unused => 0,
                    State::Freed => r.freed_at.load(Relaxed),
                    _ => continue,
                };
                if best.is_none_or(|(_, _, b)| at < b) {
                    best = Some((i, s, at));
                }
                if at == 0 {
                    break;
                }
            }
            let (i, s, _) = best?;
            if self.record(i).claim(s) {
                return Some(i);
            }
        }
        None
    }

    /// Claims slot `i`'s live block for its free; false if another thread
    /// is freeing it or freed it first.
    pub fn claim_live(&self, i: usize) -> bool {
        self.record(i).claim(State::Live)
    }

    /// Frees the block of slot `i`, claimed by [`Pool::claim_live`]:
    /// records the freeing stack and makes the slot
    /// inaccessible.
    pub fn release(&self, i: usize) {
        let r = self.record(i);
        r.free.take();
        r.freed_at.store(FREES.fetch_add(1, Relaxed), Relaxed);
        // SAFETY: our claimed slot, its block freed.
        unsafe { guard_pages::close(self.slot_start(i), self.page, self.mode) };
        r.set(State::Freed);
    }

    /// Guarded allocations so far, and blocks live now.
    pub fn counts(&self) -> (u64, usize) {
        let live = (0..self.slots)
            .filter(|&i| self.record(i).state() == State::Live)
            .count();
        (ALLOCATIONS.load(Relaxed), live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_pools_records_take_under_70_kib() {
        assert!(SLOTS * core::mem::size_of::<Record>() < 70 << 10);
    }

    /// Whether the kernel can read a byte at `addr` (a write of it into a
    /// pipe fails with EFAULT otherwise): a probe that cannot fault.
    fn readable(addr: usize) -> bool {
        let mut fds = [0; 2];
        // SAFETY: plain system calls on our own pipe.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let n = libc::write(fds[1], addr as *const libc::c_void, 1);
            libc::close(fds[0]);
            libc::close(fds[1]);
            n == 1
        }
    }

    #[test]
    fn a_live_block_is_readable_and_its_guards_and_freed_slot_are_not() {
        let page = crate::memory::layout::os_page();
        for protect in [false, true] {
            let pool = Pool::map(page, 2, protect).unwrap();
            let p = pool.alloc(32, 16) as usize;
            let Place::Slot(i) = pool.place(p) else {
                panic!()
            };
            let slot = pool.slot_start(i);
            assert!(readable(p) && readable(slot) && readable(slot + page - 1));
            assert!(!readable(slot - 1) && !readable(slot + page), "guard pages");
            assert!(pool.claim_live(i));
            pool.release(i);
            assert!(!readable(p) && !readable(slot), "freed ({protect})");
        }
    }

    #[test]
    fn blocks_sit_against_either_side_and_slots_are_reused_oldest_first() {
        for protect in [false, true] {
            sides_and_reuse(protect);
        }
    }

    fn sides_and_reuse(protect: bool) {
        let page = crate::memory::layout::os_page();
        let pool = Pool::map(page, 4, protect).unwrap();
        if protect {
            assert_eq!(pool.mode(), guard_pages::Mode::Protect);
        }
        let (mut left, mut right) = (0, 0);
        for _ in 0..64 {
            let p = pool.alloc(24, 16) as usize;
            let Place::Slot(i) = pool.place(p) else {
                panic!("not in a slot")
            };
            let slot = pool.slot_start(i);
            if p == slot {
                left += 1;
            } else {
                // Against the end, at its alignment: the slack is patterned.
                assert_eq!(p, slot + page - 32);
                assert!(pool.slack_intact(p, 24));
                // SAFETY: the slack of a live block of the pool.
                unsafe { (p as *mut u8).add(24).write(0) };
                assert!(!pool.slack_intact(p, 24), "a write into the slack shows");
                right += 1;
            }
            assert_eq!(pool.record(i).block(), (p, 24));
            assert!(pool.claim_live(i));
            assert!(!pool.claim_live(i), "claimed once");
            pool.release(i);
            assert_eq!(pool.record(i).state(), State::Freed);
        }
        assert!(left > 8 && right > 8, "{left} left, {right} right");
        // Four slots, each freed in turn: the next goes to the one freed
        // longest ago.
        let a = pool.alloc(16, 16) as usize;
        let b = pool.alloc(16, 16) as usize;
        assert_ne!(pool.place(a), pool.place(b));
        let Place::Slot(i) = pool.place(a) else {
            panic!()
        };
        assert!(pool.claim_live(i));
        pool.release(i);
        let c = pool.alloc(16, 16) as usize;
        assert_ne!(pool.place(c), pool.place(a), "the slot freed last waits");
        // Every slot live (b, c, and two more): no block.
        assert!(!pool.alloc(16, 16).is_null());
        assert!(!pool.alloc(16, 16).is_null());
        assert!(pool.alloc(16, 16).is_null(), "4 slots, 4 live");
        assert_eq!(pool.counts().1, 4);
        assert!(pool.owns(a) && !pool.owns(pool.base + pool.len()));
        assert_eq!(pool.place(pool.slot_start(0) - 1), Place::Guard(0));
        assert_eq!(pool.place(pool.slot_start(3) + page), Place::Guard(4));
    }
}
