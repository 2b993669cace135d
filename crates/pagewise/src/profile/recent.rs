//! The profiler's recent blocks: the last [`RECENT`] allocations and frees
//! of sampled blocks, each saying where the block was allocated and, once
//! freed, where it was freed, so that a
//! misuse report at an address inside one of them says so (a double free
//! of a sampled 1 MiB buffer names the code that allocated it and the code
//! that freed it first, as the guard pool's reports do for its blocks).
//!
//! A block of 512 KiB or more is sampled more often than not at the
//! default rate (`PAGEWISE_PROF_SAMPLE`), so under the profiler most bugs
//! with large buffers get the two stacks; a small block, rarely.
//!
//! The stacks are the profile's own sites (`sites.rs`), so an entry holds
//! two site numbers, not frames. Entries are written by any thread,
//! lock-free, into a ring, each under a sequence number (odd while it is
//! written: a seqlock) that also orders them: the newest entry covering an
//! address is the one that speaks for it. An address pagewise hands out
//! again for anything else (a span or huge object taken, a large object
//! grown into it) forgets the entries there (`reused`), so a report never
//! blames an unsampled block's bug on the sampled one that was there
//! before it. Nothing here allocates or takes a lock but the sites' (to
//! intern a free's stack; a leaf lock, which a free holding its span lock
//! may take). The stacks themselves are taken by the callers with no
//! pagewise lock held (the unwinder may allocate).
//!
//! ```
//! // Without PAGEWISE_PROF=1 nothing is sampled, so no block is known.
//! let b = vec![0u8; 1 << 20];
//! assert!(pagewise::profile::recent::find(b.as_ptr() as usize).is_none());
//! ```

use super::unwind;
use core::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// Allocations and frees of sampled blocks remembered: at one sample per
/// 512 KiB allocated, those of the last 256 to 512 MiB or so of the
/// program's allocations.
pub const RECENT: usize = 1024;

/// One sampled block, allocated or freed.
struct Entry {
    /// 0: empty; odd: being written; else twice the entry's number + 2.
    seq: AtomicU64,
    start: AtomicUsize,
    end: AtomicUsize,
    /// The allocation's site + 1, and the free's (0: not freed).
    allocated_at: AtomicU32,
    freed_at: AtomicU32,
    /// The threads (`gettid`) that allocated and freed it.
    allocated_by: AtomicU32,
    freed_by: AtomicU32,
}

static RING: [Entry; RECENT] = [const {
    Entry {
        seq: AtomicU64::new(0),
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
        allocated_at: AtomicU32::new(0),
        freed_at: AtomicU32::new(0),
        allocated_by: AtomicU32::new(0),
        freed_by: AtomicU32::new(0),
    }
}; RECENT];

/// Entries written so far (the next one's number).
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Whether any entry was ever written: until then [`reused`], on every
/// span taken, is one load.
static ANY: AtomicBool = AtomicBool::new(false);

/// A stack kept with a sampled block: the profile's site and the thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    /// The site's index in the profile (its frames: [`frames`]).
    pub site: u32,
    /// The thread's id (`gettid`; 0 where the system has none).
    pub thread: u32,
}

/// What the ring knows of the sampled block at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Known {
    /// The block's first byte.
    pub start: usize,
    /// The byte after it.
    pub end: usize,
    /// Where it was allocated.
    pub allocated: Taken,
    /// Where it was freed (None: it is live, as far as pagewise knows).
    pub freed: Option<Taken>,
}

fn thread() -> u32 {
    #[cfg(target_os = "linux")]
    // SAFETY: plain system call, no arguments.
    return unsafe { libc::syscall(libc::SYS_gettid) as u32 };
    #[cfg(not(target_os = "linux"))]
    0
}

/// Writes an entry (any thread).
fn write(start: usize, end: usize, allocated: Taken, freed: Option<Taken>) {
    let Some((n, e)) = claim() else { return };
    e.start.store(start, Relaxed);
    e.end.store(end, Relaxed);
    e.allocated_at.store(allocated.site + 1, Relaxed);
    e.allocated_by.store(allocated.thread, Relaxed);
    let (at, by) = freed.map_or((0, 0), |f| (f.site + 1, f.thread));
    e.freed_at.store(at, Relaxed);
    e.freed_by.store(by, Relaxed);
    e.seq.store(2 * n + 2, Release);
    ANY.store(true, Relaxed);
}

/// Takes the next entry for a write, marked as being written (an odd
/// sequence number, seen before any field changes): its number and the
/// entry. An entry another writer is still writing (it was claimed a lap
/// of the ring ago, and that writer was held up) is passed by: two writers
/// of one entry would each publish the other's half. None if every entry
/// tried was (a ring's worth of held-up writers: the entry is not written).
fn claim() -> Option<(u64, &'static Entry)> {
    for _ in 0..RECENT {
        let n = NEXT.fetch_add(1, Relaxed);
        let e = &RING[(n % RECENT as u64) as usize];
        let was = e.seq.load(Relaxed);
        if was & 1 == 0
            && e.seq
                .compare_exchange(was, 2 * n + 1, Relaxed, Relaxed)
                .is_ok()
        {
            fence(Release);
            return Some((n, e));
        }
    }
    None
}

/// Reads entry `e` whole: its number and content, or None if it is empty
/// or was being written.
fn read(e: &Entry) -> Option<(u64, Known)> {
    let s = e.seq.load(Acquire);
    if s == 0 || s & 1 == 1 {
        return None;
    }
    let site = |v: u32, by: &AtomicU32| {
        (v != 0).then(|| Taken {
            site: v - 1,
            thread: by.load(Relaxed),
        })
    };
    let k = Known {
        start: e.start.load(Relaxed),
        end: e.end.load(Relaxed),
        allocated: site(e.allocated_at.load(Relaxed), &e.allocated_by)?,
        freed: site(e.freed_at.load(Relaxed), &e.freed_by),
    };
    // The fields were read before the number is read again.
    fence(Acquire);
    (e.seq.load(Relaxed) == s).then_some((s, k))
}

/// A sampled block `[start, end)` was allocated at the profile's `site`
/// (any thread; called where the block's address is known).
pub(crate) fn allocated(site: u32, start: usize, end: usize) {
    let me = Taken {
        site,
        thread: thread(),
    };
    write(start, end, me, None);
}

/// The stack of a sampled block's free, taken before the free takes its
/// span lock again (the unwinder may allocate: `unwind.rs`).
pub(crate) struct FreeStack {
    frames: [usize; unwind::DEPTH],
    len: usize,
}

impl FreeStack {
    /// The calling stack.
    #[inline(never)]
    pub(crate) fn take() -> FreeStack {
        let mut s = FreeStack {
            frames: [0; unwind::DEPTH],
            len: 0,
        };
        s.len = unwind::capture(&mut s.frames, 1);
        s
    }
}

/// The sampled block `[start, end)` of `site` is freed by the code of
/// `stack` (any thread; the profile's lock is taken to intern the stack,
/// a leaf: the caller may hold its span lock). Nothing is written if a
/// layer above the heap already said more of the block inside it (the
/// hardened build's block between guard pages: [`block_placed`]).
pub(crate) fn freed(site: u32, start: usize, end: usize, stack: &FreeStack) {
    let allocated = match newest_in(start, end) {
        None => Taken { site, thread: 0 },
        Some(k) if k.start == start => k.allocated,
        Some(_) => return,
    };
    write_freed(start, end, allocated, stack);
}

fn write_freed(start: usize, end: usize, allocated: Taken, stack: &FreeStack) {
    let Some(at) = super::sites::SITES.intern(&stack.frames[..stack.len]) else {
        return;
    };
    let me = Taken {
        site: at,
        thread: thread(),
    };
    write(start, end, allocated, Some(me));
}

/// The sampled block at `start` was resized in place to end at `end`.
pub(crate) fn resized(site: u32, start: usize, end: usize) {
    let allocated = newest(start)
        .filter(|k| k.start == start)
        .map_or(Taken { site, thread: 0 }, |k| k.allocated);
    write(start, end, allocated, None);
}

/// The span at `span` holds the program's block `[start, end)` inside it
/// (the hardened build's block between guard pages): if the span is a
/// sampled block's, the block is what its entry speaks for.
#[cfg(feature = "secure")]
pub(crate) fn block_placed(span: usize, start: usize, end: usize) {
    if let Some(k) = newest(span).filter(|k| k.start == span) {
        write(start, end, k.allocated, None);
    }
}

/// The program's block `[start, end)` is freed by the calling code: if it
/// is a sampled block's (its newest entry starts there), the free is
/// written with the calling stack (the hardened build's block between
/// guard pages, whose span the heap frees later, or keeps).
#[cfg(feature = "secure")]
pub(crate) fn block_freed(start: usize, end: usize) {
    if let Some(k) = newest_in(start, end).filter(|k| k.start == start) {
        write_freed(start, end, k.allocated, &FreeStack::take());
    }
}

/// `[start, end)` is handed out again for something the ring does not
/// follow (a span or a huge object taken, a large object grown): entries
/// that overlap it no longer speak for those addresses. Called on every
/// such hand-out (under the span lock); one load until a block is sampled.
#[inline]
pub(crate) fn reused(start: usize, end: usize) {
    if ANY.load(Relaxed) {
        forget(start, end);
    }
}

#[cold]
fn forget(start: usize, end: usize) {
    for e in &RING {
        if let Some((s, k)) = read(e) {
            if overlaps(&k, start, end) {
                // Only if unchanged since read: a newer entry stays.
                let _ = e.seq.compare_exchange(s, 0, Relaxed, Relaxed);
            }
        }
    }
}

/// The newest entry of the sampled block that covers `addr` (or that
/// starts there: a block of no bytes), if the ring still has one.
///
/// ```
/// assert_eq!(pagewise::profile::recent::find(0x1000), None);
/// ```
pub fn find(addr: usize) -> Option<Known> {
    newest(addr)
}

fn newest(addr: usize) -> Option<Known> {
    newest_in(addr, addr.saturating_add(1))
}

/// The newest entry of a block that overlaps `[start, end)`.
fn newest_in(start: usize, end: usize) -> Option<Known> {
    if !ANY.load(Relaxed) {
        return None;
    }
    let mut best: Option<(u64, Known)> = None;
    for e in &RING {
        if let Some((s, k)) = read(e) {
            if overlaps(&k, start, end) && best.is_none_or(|(b, _)| s > b) {
                best = Some((s, k));
            }
        }
    }
    best.map(|(_, k)| k)
}

/// Whether block `k` overlaps `[start, end)` (a block of no bytes is at
/// its start).
fn overlaps(k: &Known, start: usize, end: usize) -> bool {
    k.start < end && start < k.end.max(k.start + 1)
}

/// The frames of the profile's `site` (innermost first, the allocator's
/// own included), copied into `out`; how many.
///
/// ```
/// let mut out = [0usize; pagewise::profile::unwind::DEPTH];
/// assert_eq!(pagewise::profile::recent::frames(7, &mut out), 0, "no such site");
/// ```
pub fn frames(site: u32, out: &mut [usize; unwind::DEPTH]) -> usize {
    super::sites::SITES.frames(site, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Addresses no allocation has: the ring is the process's, shared with
    // every other test.
    const A: usize = 0x7f00_dead_0000;
    const MIB: usize = 1 << 20;

    /// One test of the ring at a time: each writes over the others'.
    fn alone() -> std::sync::MutexGuard<'static, ()> {
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        ONE.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn freed_here(site: u32, start: usize, end: usize) {
        let stack = FreeStack {
            frames: [0; unwind::DEPTH],
            len: 0,
        };
        freed(site, start, end, &stack);
    }

    #[test]
    #[cfg_attr(miri, ignore = "interning a stack maps the profile's table")]
    fn the_newest_entry_speaks_for_an_address_until_it_is_handed_out_again() {
        let _one = alone();
        assert_eq!(find(A), None);
        allocated(3, A, A + MIB);
        let live = find(A + 4096).expect("inside the live block");
        assert_eq!((live.start, live.end, live.allocated.site), (A, A + MIB, 3));
        assert_eq!(live.freed, None);
        assert_eq!(find(A + MIB), None, "the byte after it is not in it");

        freed_here(3, A, A + MIB);
        let gone = find(A).expect("the freed block");
        assert_eq!(gone.allocated, live.allocated, "who allocated it is kept");
        assert!(gone.freed.is_some());

        // A span taken over its second half: nothing there speaks for it.
        reused(A + MIB / 2, A + MIB);
        assert_eq!(find(A), None);
        assert_eq!(find(A + MIB - 1), None);

        // A new sampled block at the same place is the one found.
        allocated(4, A, A + 2 * MIB);
        let made = find(A).expect("the new block").allocated;
        resized(4, A, A + MIB);
        let again = find(A).expect("the new block");
        assert_eq!(
            (again.end, again.allocated, again.freed),
            (A + MIB, made, None)
        );
        reused(A, A + 1);
        assert_eq!(find(A), None);
    }

    /// The real heap's span hand-outs forget what was remembered there: a
    /// span taken again and a large object grown over a freed one. (An
    /// owned heap samples nothing: its blocks are told to the ring here.)
    #[test]
    #[cfg_attr(miri, ignore = "maps real memory")]
    fn a_span_handed_out_again_forgets_the_sampled_block_that_was_there() {
        let _one = alone();
        use core::alloc::Layout;
        let heap = crate::Heap::new();
        let l = Layout::from_size_align(MIB, 8).unwrap();
        let p = heap.allocate(l).unwrap().cast::<u8>();
        let at = p.as_ptr() as usize;
        allocated(11, at, at + MIB);
        // SAFETY: `p` is live with `l`.
        unsafe { heap.deallocate(p, l) };
        assert!(find(at).is_some(), "nothing took its place yet");
        let q = heap.allocate(l).unwrap().cast::<u8>();
        assert_eq!(q, p, "the same span again");
        assert_eq!(find(at), None, "a span taken again");

        // Two blocks side by side; the second, told to the ring, freed;
        // the first grown in place over it.
        let r = heap.allocate(l).unwrap().cast::<u8>();
        let next = r.as_ptr() as usize;
        assert_eq!(next, at + MIB, "the second block is after the first");
        allocated(12, next, next + MIB);
        // SAFETY: `r` is live with `l`.
        unsafe { heap.deallocate(r, l) };
        assert!(find(next).is_some());
        // SAFETY: `q` is live with `l`.
        let grown = unsafe { heap.reallocate(q, l, 2 * MIB) }.unwrap();
        assert_eq!(grown.cast::<u8>(), q, "grown in place");
        assert_eq!(find(next), None, "a large object grown over it");
        // SAFETY: live, of that size.
        unsafe { heap.deallocate(q, Layout::from_size_align(2 * MIB, 8).unwrap()) };

        // A huge object's run, cached when freed, taken again.
        let h = Layout::from_size_align(40 * MIB, 8).unwrap();
        let p = heap.allocate(h).unwrap().cast::<u8>();
        let at = p.as_ptr() as usize;
        allocated(13, at, at + 40 * MIB);
        // SAFETY: `p` is live with `h`.
        unsafe { heap.deallocate(p, h) };
        assert!(find(at).is_some());
        let q = heap.allocate(h).unwrap().cast::<u8>();
        assert_eq!(q, p, "the cached run again");
        assert_eq!(find(at), None, "a huge run taken again");
        // SAFETY: `q` is live with `h`.
        unsafe { heap.deallocate(q, h) };
    }

    #[test]
    fn every_block_written_since_is_found_while_the_ring_has_room() {
        let _one = alone();
        const C: usize = 0x7f00_c0de_0000;
        let n = RECENT as u32 / 4;
        for i in 0..n {
            let at = C + i as usize * 4096;
            allocated(100 + i, at, at + 4096);
        }
        for i in 0..n {
            let at = C + i as usize * 4096;
            assert_eq!(find(at + 1).map(|k| k.allocated.site), Some(100 + i), "{i}");
        }
        reused(C, C + n as usize * 4096);
    }

    /// Entries are rewritten while they are read: a reader never sees one
    /// half written (every entry written here is 4 KiB long, so a start
    /// of one write with the end of another would show).
    #[test]
    #[cfg_attr(miri, ignore = "a stress test: too slow interpreted")]
    fn a_reader_never_sees_an_entry_half_written() {
        let _one = alone();
        use std::sync::atomic::AtomicBool;
        const D: usize = 0x7f10_0000_0000;
        static STOP: AtomicBool = AtomicBool::new(false);
        let writers: Vec<_> = (0..2)
            .map(|w| {
                std::thread::spawn(move || {
                    let mut i = 0usize;
                    while !STOP.load(Relaxed) {
                        let at = D + (w << 32) + (i % 4096) * 8192;
                        allocated(7, at, at + 4096);
                        i += 1;
                    }
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(300);
        let mut seen = 0u64;
        while std::time::Instant::now() < deadline {
            for e in &RING {
                if let Some((_, k)) = read(e) {
                    if k.start >= D {
                        assert_eq!(k.end - k.start, 4096, "torn: {k:x?}");
                        seen += 1;
                    }
                }
            }
        }
        STOP.store(true, Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        assert!(seen > 0, "the reader saw the writers' entries");
        reused(D, D + (2 << 32));
    }

    #[test]
    fn an_entry_being_written_is_not_read() {
        let _one = alone();
        // Every entry written, so that the next one claimed holds a block.
        const E: usize = 0x7f20_0000_0000;
        for i in 0..RECENT {
            allocated(8, E + i * 4096, E + (i + 1) * 4096);
        }
        // Two in a row: whatever the parity of their numbers.
        for _ in 0..2 {
            let (_, e) = claim().unwrap();
            assert_eq!(read(e), None);
            e.seq.store(0, Relaxed);
        }
        reused(E, E + RECENT * 4096);
    }

    #[test]
    fn an_entry_being_written_is_not_claimed_again() {
        let _one = alone();
        let (n, e) = claim().unwrap();
        // A lap of the ring later, while the first writer is held up.
        NEXT.fetch_add(RECENT as u64 - 1, Relaxed);
        let (m, f) = claim().unwrap();
        assert!(!core::ptr::eq(e, f), "another entry");
        assert_eq!(m, n + RECENT as u64 + 1);
        e.seq.store(0, Relaxed);
        f.seq.store(0, Relaxed);
    }

    #[test]
    fn a_block_of_no_bytes_is_found_at_its_start() {
        let _one = alone();
        const B: usize = 0x7f00_beef_0000;
        allocated(5, B, B);
        assert_eq!(find(B).map(|k| k.allocated.site), Some(5));
        reused(B, B + 1);
        assert_eq!(find(B), None);
    }
}
