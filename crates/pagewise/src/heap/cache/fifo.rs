//! The hardened build's thread cache: a queue, not a stack. A freed slot
//! is handed out again only after [`DEPTH`] later frees of its class on
//! its thread (so a pointer freed and used again does not find its
//! address in someone else's hands at once), which makes the cache the
//! quarantine: a slot is checked, wiped and cached once.
//!
//! The cache is two chains, linked oldest to newest, so that neither a
//! fast path nor an overflow follows a link to find an end:
//!
//! - the *front* (`head`, `older_count` slots): the oldest, where a pop
//!   takes its slot, and only while the cache holds more than its depth;
//! - the *back* (`older` its oldest slot, `tail` its newest): where a push
//!   appends. The newest slot's link word holds a raw 0 until the next
//!   push links it; that push checks it is still 0 (a write after free
//!   there is reported then, naming the slot).
//!
//! A pop that finds the front empty makes the back the front (sealing its
//! newest slot's link: every chain that leaves the cache ends in a null
//! link); an overflow passes the front whole, the oldest slots, and keeps
//! the back. The slow paths that take an arbitrary share (maintenance,
//! flushes, thread exit) join the two chains first and pass the oldest.

use super::{walk_to_cache, walk_to_page, ClassState, POPPED, ROOM_BITS, ROOM_MASK};
use crate::fault::{misuse, Misuse};
use crate::memory::page::Block;
use crate::memory::size_class::{Geometry, CLASSES, SLOT_SIZE};
use core::cell::UnsafeCell;
use core::ptr::null_mut;
use core::sync::atomic::Ordering::Relaxed;

/// Bytes of a class's slots that wait in a thread's cache before the
/// oldest is handed out again (within [`LEAST`] and [`MOST`] slots).
const DEPTH_BYTES: usize = 16 << 10;

/// Most later frees a slot waits for (the small classes').
pub const MOST: usize = 16;

/// Fewest later frees a slot waits for (the large classes').
pub const LEAST: usize = 2;

const fn build_depth() -> [u16; CLASSES] {
    let mut t = [0u16; CLASSES];
    let mut i = 0;
    while i < CLASSES {
        let n = DEPTH_BYTES / SLOT_SIZE[i] as usize;
        t[i] = if n > MOST {
            MOST as u16
        } else if n < LEAST {
            LEAST as u16
        } else {
            n as u16
        };
        i += 1;
    }
    t
}

/// Later frees of its class on its thread a freed slot waits for, per
/// class: 16 KiB of slots, 2 to 16 of them (16 up to 1 KiB slots, 8 at
/// 2 KiB, 4 at 4 KiB, 2 from 8 KiB).
pub const DEPTH: [u16; CLASSES] = build_depth();

/// The room at which a cache of `limit` slots and `depth` declines a pop:
/// it then holds `depth` slots or fewer.
pub(super) const fn floor(limit: u32, depth: u16) -> u16 {
    if limit > depth as u32 {
        (limit - depth as u32) as u16
    } else {
        0
    }
}

/// An empty cache of `limit` slots of the class with `geometry` whose
/// slots wait for `depth` later frees.
pub(super) const fn deep(limit: u32, geometry: Geometry, depth: u16) -> ClassState {
    ClassState {
        floor: UnsafeCell::new(floor(limit, depth)),
        depth: UnsafeCell::new(depth),
        ..ClassState::new(limit, geometry)
    }
}

/// Aborts: the link word of a cache's newest slot, which holds a raw 0
/// until the next push links it, was written after the slot's free.
#[cold]
#[inline(never)]
fn tail_written(b: *mut Block) -> ! {
    misuse(Misuse::WriteAfterFree, b as usize)
}

impl ClassState {
    /// The depth, as a count of slots.
    #[inline(always)]
    fn depth_now(&self) -> u32 {
        // SAFETY: owner only, or fixed (set at `deep`).
        unsafe { *self.depth.get() as u32 }
    }

    /// Sets the pop's floor for a new bound (owner only, `set_limit`).
    pub(super) fn fifo_set_floor(&self, limit: u32) {
        // SAFETY: owner only (caller).
        unsafe { *self.floor.get() = floor(limit, *self.depth.get()) };
    }

    /// `pop`: the oldest slot, if the cache holds more than its depth and
    /// no sample is due.
    ///
    /// # Safety
    /// Owner only.
    #[inline(always)]
    pub(super) unsafe fn fifo_pop(&self) -> *mut Block {
        // SAFETY: owner only (caller): both chains are ours; the plain read
        // of the counts races with no write (as in the default `pop`).
        unsafe {
            let b = *self.head.get();
            let w = *self.counts.as_ptr();
            // The front empty (the allocation's miss path makes the back
            // the front: `fifo_take_up`), the countdown at most 1, or no
            // more than the depth cached (the room at the floor or above).
            if b.is_null() || w < 2 << ROOM_BITS || w as u16 >= *self.floor.get() {
                return null_mut();
            }
            self.fifo_pop_at(b)
        }
    }

    /// [`ClassState::fifo_pop`] once it took `b`, the front's first slot.
    ///
    /// # Safety
    /// Owner only; `b` is the front's first slot.
    #[inline(always)]
    unsafe fn fifo_pop_at(&self, b: *mut Block) -> *mut Block {
        // SAFETY: per the caller: a cached slot, its link written by
        // `set_next` (the front's last holds a sealed null).
        unsafe {
            let next = Block::next(b);
            if !Block::is_cached(b) {
                misuse(crate::memory::block::KEY_LOST, b as usize);
            }
            *self.head.get() = next;
            *self.older_count.get() -= 1;
            Block::mark_live(b);
            self.counts
                .store(self.counts.load(Relaxed) + POPPED, Relaxed);
            b
        }
    }

    /// `push`: appends `block` to the back, unless the cache is full. The
    /// previous newest slot's link word must still hold the raw 0 its
    /// push left (aborts if not: written after its free).
    ///
    /// # Safety
    /// As `push`.
    #[inline(always)]
    pub(super) unsafe fn fifo_push(&self, block: *mut Block) -> bool {
        // SAFETY: owner only (caller): the counts' plain read races with no
        // write; the slot is ours to link, the back's newest slot too.
        unsafe {
            if *self.counts.as_ptr() & ROOM_MASK == 0 {
                return false;
            }
            Block::clear_link(block);
            let t = *self.tail.get();
            if t.is_null() {
                *self.older.get() = block;
            } else {
                if Block::raw_link(t) != 0 {
                    tail_written(t);
                }
                Block::set_next(t, block);
            }
            *self.tail.get() = block;
        }
        self.counts.store(self.counts.load(Relaxed) - 1, Relaxed);
        true
    }

    /// Ends the back with a null link (its newest slot's raw 0 checked),
    /// returning its newest slot (null if the back is empty), before a
    /// slow path moves or walks it.
    ///
    /// # Safety
    /// Owner only.
    unsafe fn seal(&self) -> *mut Block {
        // SAFETY: owner only (caller).
        unsafe {
            let t = *self.tail.get();
            if !t.is_null() {
                if Block::raw_link(t) != 0 {
                    tail_written(t);
                }
                Block::set_next(t, null_mut());
            }
            t
        }
    }

    /// Makes the back the front (the front empty), sealed.
    ///
    /// # Safety
    /// Owner only; the front is empty.
    unsafe fn back_to_front(&self, count: u32) {
        // SAFETY: owner only (caller).
        unsafe {
            self.seal();
            *self.head.get() = *self.older.get();
            *self.older_count.get() = count;
            *self.older.get() = null_mut();
            *self.tail.get() = null_mut();
        }
        self.fifo_set_floor(self.limit());
    }

    /// `take_up_older`: makes the back the front if the front is empty
    /// and the cache holds more than its depth; whether it did.
    ///
    /// # Safety
    /// Owner only.
    #[inline(always)]
    pub(super) unsafe fn fifo_take_up(&self) -> bool {
        // SAFETY: owner only (caller).
        unsafe {
            // The room below the floor: more than the depth cached, or,
            // below a batch's floor (`fifo_install`), more than the slots
            // that were cached before it (told apart out of line).
            if (*self.tail.get()).is_null()
                || !(*self.head.get()).is_null()
                || self.counts.load(Relaxed) as u16 >= *self.floor.get()
            {
                return false;
            }
            self.back_to_front_now()
        }
    }

    /// [`ClassState::fifo_take_up`]'s move, out of line: the back becomes
    /// the front if the cache holds more than its depth (else the floor,
    /// a batch's, is set back): whether it did.
    ///
    /// # Safety
    /// Owner only; the front is empty, the back is not.
    #[inline(never)]
    unsafe fn back_to_front_now(&self) -> bool {
        let n = self.cached();
        if n <= self.depth_now() {
            self.fifo_set_floor(self.limit());
            return false;
        }
        // SAFETY: per the caller.
        unsafe { self.back_to_front(n) };
        true
    }

    /// `take_overflow`: the front whole (the oldest slots, following no
    /// link) when it and the back each hold a quarter of the cache and the
    /// back its depth; else all but the newer half (and the depth).
    ///
    /// # Safety
    /// Owner only.
    pub(super) unsafe fn fifo_take_overflow(&self) -> (*mut Block, u32) {
        let n = self.cached();
        let depth = self.depth_now();
        // SAFETY: owner only (caller).
        unsafe {
            let s = *self.older_count.get();
            let m = n - s;
            if s >= (n / 4).max(1) && m >= (n / 4).max(depth) {
                let front = *self.head.get();
                self.set_room(self.room() + s);
                self.back_to_front(m);
                return (front, s);
            }
            self.fifo_take_older((n / 2).max(depth).min(n.saturating_sub(1)))
        }
    }

    /// `join`: appends the back to the front, sealed, so that the cache
    /// is one chain (the front).
    ///
    /// # Safety
    /// Owner only.
    pub(super) unsafe fn fifo_join(&self) {
        // SAFETY: owner only (caller): the front holds `older_count` slots
        // unless a double free left it shorter (then a null link ends the
        // walk).
        unsafe {
            if self.seal().is_null() {
                return;
            }
            let s = *self.older_count.get();
            let older = *self.older.get();
            if s == 0 {
                *self.head.get() = older;
            } else {
                let mut last = *self.head.get();
                for _ in 1..s {
                    let next = Block::next(last);
                    if next.is_null() {
                        // Shorter than counted: a slot was freed twice.
                        misuse(Misuse::DoubleFree, last as usize);
                    }
                    last = next;
                }
                Block::set_next(last, older);
            }
            *self.older_count.get() = self.cached();
            *self.older.get() = null_mut();
            *self.tail.get() = null_mut();
        }
        self.fifo_set_floor(self.limit());
    }

    /// `take_older`: all but the `keep` newest slots, oldest first, as a
    /// null-terminated chain, with their count.
    ///
    /// # Safety
    /// Owner only.
    pub(super) unsafe fn fifo_take_older(&self, keep: u32) -> (*mut Block, u32) {
        let n = self.cached();
        if n <= keep {
            return (null_mut(), 0);
        }
        let passed = n - keep;
        // SAFETY: owner only (caller); once joined, the front holds `n`
        // slots unless a double free left it shorter.
        unsafe {
            self.fifo_join();
            let rest = *self.head.get();
            if keep == 0 {
                *self.head.get() = null_mut();
            } else {
                let mut cut = rest;
                for _ in 1..passed {
                    let next = Block::next(cut);
                    if next.is_null() {
                        // Shorter than counted: a slot was freed twice.
                        misuse(Misuse::DoubleFree, cut as usize);
                    }
                    cut = next;
                }
                *self.head.get() = Block::next(cut);
                Block::set_next(cut, null_mut());
            }
            *self.older_count.get() = keep;
            self.set_room(self.room() + passed);
            (rest, passed)
        }
    }

    /// Whether the cache takes a batch from the transfer cache (the heap's
    /// slow path, once a pop declined and the class's current page has no
    /// free slot): when it holds no more than its depth, slots that wait
    /// for later frees, which stay behind the batch.
    pub(crate) fn takes_batch(&self) -> bool {
        self.cached() <= self.depth_now()
    }

    /// `install`: a batch of `count` slots becomes the front, and the
    /// slots cached already (no more than the depth: [`takes_batch`])
    /// the back, behind it. The batch's slots waited on the thread that
    /// passed them (an overflow keeps its depth of later frees), so none
    /// waits here: until the front runs dry, a pop declines only at the
    /// slots that were cached already.
    ///
    /// [`takes_batch`]: ClassState::takes_batch
    ///
    /// # Safety
    /// As `install`, but for the cache being empty: it holds no more than
    /// its depth.
    pub(super) unsafe fn fifo_install(&self, head: *mut Block, count: u32) {
        // SAFETY: owner only (caller): the chains are ours; once joined,
        // the front holds the `kept` slots cached before (a shorter chain,
        // left by a double free, ends the walk at a null link).
        unsafe {
            self.fifo_join();
            let kept = self.cached();
            let old = *self.head.get();
            if kept == 0 {
                *self.older.get() = null_mut();
                *self.tail.get() = null_mut();
            } else {
                let mut last = old;
                for _ in 1..kept {
                    let next = Block::next(last);
                    if next.is_null() {
                        // Shorter than counted: a slot was freed twice.
                        misuse(Misuse::DoubleFree, last as usize);
                    }
                    last = next;
                }
                Block::clear_link(last);
                *self.older.get() = old;
                *self.tail.get() = last;
            }
            // A batch passed by a cache that had grown may be more than
            // this one holds: it grows to take it.
            self.set_limit(self.limit().max(count + kept));
            let room = self.room();
            *self.head.get() = head;
            *self.older_count.get() = count;
            *self.floor.get() = floor(self.limit(), kept as u16);
            self.set_room(room - count);
        }
    }

    /// `newest`: the back's newest slot, else the front's last.
    ///
    /// # Safety
    /// Owner only.
    pub(super) unsafe fn fifo_newest(&self) -> *mut Block {
        // SAFETY: owner only (caller).
        unsafe {
            let t = *self.tail.get();
            if !t.is_null() {
                return t;
            }
            let mut b = *self.head.get();
            for _ in 1..*self.older_count.get() {
                b = Block::next(b);
            }
            b
        }
    }

    /// `keys_to_page`: seals the back, then walks the front and the back.
    ///
    /// # Safety
    /// As `keys_to_page`.
    pub(super) unsafe fn fifo_keys_to_page(&self) {
        // SAFETY: owner only (caller).
        unsafe {
            self.seal();
            let s = *self.older_count.get();
            walk_to_page(*self.head.get(), s);
            walk_to_page(*self.older.get(), self.cached() - s);
        }
    }

    /// `keys_to_cache`: puts the keys back, and the raw 0 in the newest
    /// slot's link, which the next push checks.
    ///
    /// # Safety
    /// As `keys_to_cache`.
    pub(super) unsafe fn fifo_keys_to_cache(&self) {
        // SAFETY: owner only (caller).
        unsafe {
            let s = *self.older_count.get();
            walk_to_cache(*self.head.get(), s);
            walk_to_cache(*self.older.get(), self.cached() - s);
            let t = *self.tail.get();
            if !t.is_null() {
                Block::clear_link(t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::size_class::GEOMETRY;

    /// A test slot: two words, 16-byte aligned like every slot.
    #[repr(C, align(16))]
    #[derive(Clone, Copy)]
    struct Slot([usize; 2]);

    /// `n` test slots, marked cached as a free marks them, and the address
    /// of each.
    fn slots(n: usize) -> (Vec<Slot>, Vec<*mut Block>) {
        let mut slots = vec![Slot([0; 2]); n];
        let all: Vec<*mut Block> = slots
            .iter_mut()
            .map(|s| s.0.as_mut_ptr() as *mut Block)
            .collect();
        for &b in &all {
            // SAFETY: a test-local slot of two words.
            unsafe { Block::mark_cached(b) };
        }
        (slots, all)
    }

    /// The slots of a chain of `n`, first to last.
    ///
    /// # Safety
    /// `b` starts a chain of at least `n` slots.
    unsafe fn chain(mut b: *mut Block, n: u32) -> Vec<*mut Block> {
        let mut v = vec![];
        for _ in 0..n {
            v.push(b);
            // SAFETY: per the caller.
            b = unsafe { Block::next(b) };
        }
        v
    }

    /// An allocation's take from the cache: the pop, else (the front
    /// empty) the miss path's take-up and the pop.
    ///
    /// # Safety
    /// Owner only.
    unsafe fn take(c: &ClassState) -> *mut Block {
        // SAFETY: per the caller.
        unsafe {
            let b = c.pop();
            if b.is_null() && !c.sample_due() && c.take_up_older() {
                return c.pop();
            }
            b
        }
    }

    #[test]
    fn depths_are_sixteen_kib_of_slots_from_two_to_sixteen() {
        use crate::memory::size_class::class_of;
        assert_eq!(DEPTH[class_of(16)], 16);
        assert_eq!(DEPTH[class_of(1024)], 16);
        assert_eq!(DEPTH[class_of(2048)], 8);
        assert_eq!(DEPTH[class_of(4096)], 4);
        assert_eq!(DEPTH[class_of(8192)], 2);
        assert_eq!(DEPTH[class_of(256 << 10)], 2);
        for (c, &d) in DEPTH.iter().enumerate() {
            // The cache holds the depth and passes as many on.
            assert!(super::super::LIMITS[c] >= 2 * d as u32, "class {c}");
            assert!(super::super::GROWN[c] >= super::super::LIMITS[c]);
        }
    }

    /// A slot comes out only once `depth` later slots were pushed, the
    /// oldest first (a stack hands out the newest at once).
    #[test]
    fn a_slot_comes_out_only_after_depth_later_pushes_oldest_first() {
        let (_slots, s) = slots(7);
        let c = deep(16, GEOMETRY[0], 4);
        // SAFETY: test-local slots, each in one list at a time.
        unsafe {
            for &b in &s {
                assert!(c.push(b));
            }
            assert_eq!(take(&c), s[0]);
            assert_eq!(take(&c), s[1]);
            assert_eq!(take(&c), s[2]);
            assert!(take(&c).is_null(), "four cached: they wait");
            assert_eq!(c.cached(), 4);
            c.verify();
            // Pushes after a pop that took the back up go on behind.
            Block::mark_cached(s[0]);
            assert!(c.push(s[0]));
            assert_eq!(take(&c), s[3]);
            assert!(take(&c).is_null());
            // The sample countdown still declines.
            Block::mark_cached(s[1]);
            assert!(c.push(s[1]));
            c.arm(1);
            assert!(take(&c).is_null(), "a due sample declines");
            c.arm(super::super::NOT_SAMPLING);
            assert_eq!(take(&c), s[4]);
        }
    }

    /// An overflow passes the oldest slots: the front whole, following no
    /// link of the back (here, one overwritten: a walk would follow it),
    /// and keeps at least the depth of newest slots.
    #[test]
    fn an_overflow_passes_the_front_whole_and_keeps_depth() {
        let (_slots, s) = slots(13);
        let x = s[12];
        let c = deep(8, GEOMETRY[0], 2);
        // SAFETY: test-local slots, each in one list at a time.
        unsafe {
            for &b in &s[..8] {
                assert!(c.push(b));
            }
            assert!(!c.push(s[8]), "full");
            // All in the back: the oldest half goes, found by walking.
            let (first, n) = c.take_overflow();
            assert_eq!(chain(first, n), s[..4]);
            assert_eq!(c.cached(), 4);
            for &b in &s[8..12] {
                assert!(c.push(b));
            }
            // Overwrite the back's first link: to a slot no part of the
            // cache, whose own link word holds a mark.
            const MARK: usize = 0x5a5a_5a5a_5a5a_5a50;
            (x as *mut usize).write(MARK);
            Block::set_next(s[8], x);
            let (front, n) = c.take_overflow();
            assert_eq!((front, n), (s[4], 4), "the front, whole");
            assert_eq!((x as *const usize).read(), MARK, "nothing followed");
            assert_eq!(chain(front, n), s[4..8]);
            Block::set_next(s[8], s[9]);
            assert_eq!(c.cached(), 4);
            assert_eq!((take(&c), take(&c)), (s[8], s[9]));
            assert!(take(&c).is_null(), "the depth stays");
            // Keeping fewer than the depth is the slow paths' choice only:
            // a maintenance pass keeps what it asks for, oldest first out.
            let (rest, n) = c.take_older(1);
            assert_eq!(chain(rest, n), [s[10]]);
            let (rest, n) = c.take_older(0);
            assert_eq!(chain(rest, n), [s[11]]);
            assert_eq!(c.cached(), 0);
        }
    }

    /// A write into the newest slot's link word, which holds a raw 0 until
    /// the next push links it, is reported by that push.
    #[test]
    fn the_newest_slots_link_is_checked_at_the_next_push() {
        let (_slots, s) = slots(3);
        let c = deep(8, GEOMETRY[0], 2);
        // SAFETY: test-local slots, each in one list at a time.
        unsafe {
            assert!(c.push(s[0]) && c.push(s[1]));
            assert_eq!((s[1] as *const usize).read(), 0);
            // A verify seals and reopens it.
            c.verify();
            assert_eq!((s[1] as *const usize).read(), 0);
            assert!(c.push(s[2]));
            assert_eq!(c.newest(), s[2]);
        }
    }

    /// A batch from the transfer cache goes in front of the slots that
    /// wait for later frees, and comes out whole first; those slots wait
    /// on.
    #[test]
    fn a_batch_goes_in_front_of_the_slots_that_wait() {
        let (_slots, s) = slots(6);
        let other = deep(8, GEOMETRY[0], 0);
        let c = deep(8, GEOMETRY[0], 2);
        // SAFETY: test-local slots, each in one list at a time.
        unsafe {
            for &b in &s[2..5] {
                assert!(other.push(b));
            }
            let (batch, n) = other.take_older(0);
            assert!(c.push(s[0]) && c.push(s[1]));
            assert!(c.takes_batch());
            c.install(batch, n);
            assert_eq!(c.cached(), 5);
            c.verify();
            assert_eq!((take(&c), take(&c), take(&c)), (s[2], s[3], s[4]));
            assert!(take(&c).is_null(), "the two freed here wait");
            assert!(!c.takes_batch() || c.cached() <= 2);
            Block::mark_cached(s[2]);
            assert!(c.push(s[2]));
            assert_eq!(take(&c), s[0]);
            assert!(take(&c).is_null());
        }
    }
}
