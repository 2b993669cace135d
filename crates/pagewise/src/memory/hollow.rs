//! Free OS pages inside a slab page that still holds live slots: purging
//! them ("hollowing" the page) and carving them again on demand.
//!
//! A slab page is released to the span pool only once no slot of it is in
//! use. Until then its free slots stay resident, however many there are:
//! one live object keeps a whole 64 KiB page committed. Hollowing gives
//! back each OS page of the page whose slots are all free (a slot that
//! straddles two OS pages keeps both unless it is free as well).
//!
//! The free list runs through the slots themselves, so the slots on a
//! purged OS page must leave it first: the list is rebuilt without them, in
//! address order. They are then *hollow*: neither free-listed nor in use.
//! No per-page record says which they are: the segment's commit bitmap
//! does. A slot is hollow exactly when it overlaps an OS page of the carved
//! part of the page whose commit bit is clear, since a slot in use or on the
//! free list never does (only OS pages every one of whose slots is free are
//! purged, and those slots leave the list). Carving them again
//! ([`Page::refill_hollow`]) sets the bits and puts the slots back on the
//! list, before the page carves fresh slots.
//!
//! The OS page holding the carve frontier of a page still carving is never
//! hollowed (it has slots not yet carved, which [`Page::extend`] hands out
//! later), so the hollow pages are always inside the carved part; once every
//! slot is carved, the last OS page is like the others.
//!
//! Page descriptors live in the segment header, not in the pages, so a
//! purge never touches what the heap needs to find the page again.

use crate::fault::{misuse, Misuse};
use crate::memory::cache_handshake;
use crate::memory::layout::{os_page, segment_base, SLICE};
use crate::memory::page::{Block, Page};
use crate::memory::segment::Segment;
use crate::memory::size_class::{CLASSES, MIN_SLOT, PAGE_SLICES, SLOT_SIZE};
use core::ptr::null_mut;

/// Most slots a slab page holds: the smallest class, on one slice.
const MAX_SLOTS: usize = SLICE / MIN_SLOT;

const fn most_slots() -> usize {
    let mut most = 0;
    let mut c = 0;
    while c < CLASSES {
        let n = PAGE_SLICES[c] as usize * SLICE / SLOT_SIZE[c] as usize;
        if n > most {
            most = n;
        }
        c += 1;
    }
    most
}
const _: () = assert!(most_slots() <= MAX_SLOTS);

/// One bit per slot of a page: which are on the free list (on the stack of
/// the thread hollowing the page: 512 bytes).
pub struct SlotSet([u64; MAX_SLOTS / 64]);

impl SlotSet {
    /// No slot.
    pub fn new() -> SlotSet {
        SlotSet([0; MAX_SLOTS / 64])
    }

    /// Adds slot `i`; false if it was there already.
    pub fn insert(&mut self, i: usize) -> bool {
        let (w, bit) = (i / 64, 1u64 << (i % 64));
        let fresh = self.0[w] & bit == 0;
        self.0[w] |= bit;
        fresh
    }

    pub fn contains(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }

    /// Removes slot `i`.
    pub fn remove(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }

    /// Slots in the set.
    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The slots of this set not in `other`.
    fn without(&self, other: &SlotSet) -> SlotSet {
        let mut s = SlotSet::new();
        for (w, (a, b)) in s.0.iter_mut().zip(self.0.iter().zip(&other.0)) {
            *w = a & !b;
        }
        s
    }

    /// Whether every slot of `first..=last` is in the set.
    fn contains_all(&self, first: usize, last: usize) -> bool {
        (first..=last).all(|i| self.contains(i))
    }
}

impl Page {
    /// Whether [`Page::refill_hollow`] would carve a slot: some hollow
    /// slot is not withheld.
    #[inline]
    pub fn can_refill_hollow(&self) -> bool {
        self.hollow_slots() > self.withheld_slots
    }

    /// OS pages of this page purged while it holds live slots.
    #[inline]
    pub fn hollow_pages(&self) -> u32 {
        self.hollow_pages
    }

    /// Whether the slot at `addr` (a slot start of this page) is hollow: a
    /// slot that is neither free nor in use, so freeing it is a double free
    /// (its first free went to the page, which later purged its OS page).
    ///
    /// Inline, the test of a page that has no hollow slot (nearly every
    /// page): every slot a cache sends home, and every free past the
    /// cache, asks, and a call made for that test alone saved and restored
    /// the registers the rest uses.
    #[inline]
    pub fn is_hollow_slot(&self, addr: usize) -> bool {
        self.hollow_slots() != 0 && self.is_hollow_slot_of_hollow_page(addr)
    }

    /// [`Page::is_hollow_slot`] of a page that has hollow slots.
    #[inline(never)]
    fn is_hollow_slot_of_hollow_page(&self, addr: usize) -> bool {
        // SAFETY: a slab page lies in a registered, mapped segment.
        let seg = unsafe { &*Segment::of(segment_base(self.start)) };
        let i = (addr - self.start) / self.slot_size as usize;
        if self.is_withheld(i) {
            return true;
        }
        let (first, n) = self.os_pages_of(seg, i);
        seg.count_committed(first, n) != n
    }

    /// OS pages of the page that only carved slots use: those wholly
    /// inside the carved part, and once every slot is carved, the last one
    /// too (its tail past the last slot is never used). The OS page holding
    /// the carve frontier of a page still carving is not.
    pub(crate) fn carved_os_pages(&self) -> usize {
        let carved = self.capacity() as usize * self.slot_size as usize;
        if self.capacity() == self.reserved {
            carved.div_ceil(os_page())
        } else {
            carved / os_page()
        }
    }

    /// Slots overlapping OS page `k` of the page (`k` < `carved_os_pages`).
    pub(crate) fn slots_on(&self, k: usize) -> (usize, usize) {
        slots_on(
            k,
            self.slot_size as usize,
            self.capacity() as usize,
            os_page(),
        )
    }

    /// OS pages (first index in the segment, count) slot `i` overlaps.
    pub(crate) fn os_pages_of(&self, seg: &Segment, i: usize) -> (usize, usize) {
        let slot = self.slot_size as usize;
        let begin = self.start + i * slot;
        let first = seg.os_page(begin);
        (first, seg.os_page(begin + slot - 1) - first + 1)
    }

    /// Purges every OS page of the page whose slots are all free, and takes
    /// its slots off the free list. `purge(addr, bytes)` gives a run of
    /// OS pages back to the OS and says whether it did. `announced(f)`
    /// calls `f` with the slot each thread last announced it was freeing
    /// into its cache (`ClassState::announce`; nothing for a heap whose
    /// slots no other thread caches): a free slot announced keeps its OS
    /// pages. Returns the OS pages purged.
    ///
    /// Aborts if the free list is not what the page counts: a slot on it
    /// twice, without the page key, or a list longer or shorter than the
    /// slots neither in use nor hollow (a double free whose copies both came
    /// home).
    ///
    /// # Safety
    /// The owner's page lists are held; a slab page of the heap that is not
    /// any thread's current page. Remote frees not yet collected count as
    /// slots in use (`used`), so their slots, which other threads may be
    /// linking into the remote list, are never on a purged OS page.
    pub unsafe fn hollow(
        &mut self,
        serialize: impl FnOnce() -> bool,
        announced: impl FnOnce(&mut dyn FnMut(usize)),
        mut purge: impl FnMut(usize, usize) -> bool,
    ) -> usize {
        let slot = self.slot_size as usize;
        let Some(free) = self
            .capacity()
            .checked_sub(self.used() + self.hollow_slots())
        else {
            // More slots in use than carved: a double free the keys missed.
            misuse(Misuse::DoubleFree, self.start);
        };
        if (free as usize) * slot < os_page() || self.used() >= self.hollow_seen_used {
            // Not one whole OS page of free slots, or no slot freed since
            // the last look (the page is out of use: nothing was allocated).
            return 0;
        }
        self.hollow_seen_used = self.used();
        // Frees stop going into thread caches before the free list is
        // checked and any OS page purged (a cache's store into a purged
        // slot is unchecked); the count set below, or the same count if
        // nothing was purged, lets them again if the page ends with no
        // hollow slot. A free under way that read the page as cacheable
        // announced its slot before: that slot's OS pages stay, and a
        // free that announced another since has stored its key where the
        // check below finds it (`memory/cache_handshake.rs`).
        self.stop_caching(serialize);
        let spared = self.announced_slots(announced);
        // SAFETY: per the caller.
        let set = unsafe { self.free_set(free as usize) };
        let candidates = set.without(&spared);
        // SAFETY: a slab page lies in a registered, mapped segment.
        let seg = unsafe { &*Segment::of(segment_base(self.start)) };
        let base = seg.os_page(self.start);
        let purged = purge_runs(
            self.carved_os_pages(),
            |k| self.can_hollow(seg, &candidates, base + k, k),
            |run, n| {
                let done = purge(self.start + run * os_page(), n * os_page());
                if done {
                    seg.clear_committed(base + run, n);
                }
                done
            },
        );
        if purged > 0 {
            self.relink_without_hollow(seg, &set);
            self.hollow_pages += purged as u32;
        } else {
            self.set_hollow_slots(self.hollow_slots());
        }
        purged
    }

    /// The slots of this page that threads announced they were freeing
    /// into their caches (`announced`, as [`Page::hollow`] takes it),
    /// read after [`Page::stop_caching`].
    fn announced_slots(&self, announced: impl FnOnce(&mut dyn FnMut(usize))) -> SlotSet {
        let mut spared = SlotSet::new();
        announced(&mut |at| {
            if let Some(i) = self.slot_index(at) {
                spared.insert(i);
            }
        });
        spared
    }

    /// Makes frees of this page's slots stop going into thread caches,
    /// before its announced slots are read and its free list is checked: a
    /// free under way that read the page as cacheable has announced its
    /// slot where the reading sees it, or has since stored its key where
    /// the check finds it (`memory/cache_handshake.rs`). `serialize` is the
    /// page source's; a page that was not cacheable needs none.
    fn stop_caching(&self, serialize: impl FnOnce() -> bool) {
        if self.hollow_slots() == 0 {
            cache_handshake::stop_caching(|| self.set_cacheable(false), serialize);
        }
    }

    /// Whether OS page `k` of the page (`os_page` in the segment) is
    /// resident, not meshed, and every slot on it is free or withheld (a
    /// slot reaching into a meshed neighbour: in no use, and never carved
    /// while it is withheld, so the purge loses nothing; large slots
    /// straddle every OS page, and without this one meshed page would pin
    /// its neighbours).
    fn can_hollow(&self, seg: &Segment, set: &SlotSet, os_page: usize, k: usize) -> bool {
        let (first, last) = self.slots_on(k);
        seg.count_committed(os_page, 1) == 1
            && !seg.is_meshed(os_page)
            && (set.contains_all(first, last)
                || self.withheld_slots > 0
                    && (first..=last).all(|i| set.contains(i) || self.is_withheld(i)))
    }

    /// The free list as a set, checked (see [`Page::hollow`]).
    ///
    /// # Safety
    /// As [`Page::hollow`]; the list holds `n` slots.
    pub(crate) unsafe fn free_set(&self, n: usize) -> SlotSet {
        let mut set = SlotSet::new();
        let mut b = self.free;
        for _ in 0..n {
            // SAFETY: the page's free list (caller): slots of this page,
            // resident while on it. A slot met twice is caught by the set.
            unsafe {
                if b.is_null() || !Block::is_in_page(b) {
                    misuse(Misuse::DoubleFree, b as usize);
                }
                let i = self.slot_index(b as usize).unwrap_or(usize::MAX);
                if i == usize::MAX || !set.insert(i) {
                    misuse(Misuse::DoubleFree, b as usize);
                }
                b = Block::next(b);
            }
        }
        if !b.is_null() {
            misuse(Misuse::DoubleFree, b as usize);
        }
        set
    }

    /// Rebuilds the free list from `set` in address order, leaving out the
    /// slots that overlap a purged OS page (they become hollow).
    fn relink_without_hollow(&mut self, seg: &Segment, set: &SlotSet) {
        let slot = self.slot_size as usize;
        let mut head: *mut Block = null_mut();
        let mut tail: *mut Block = null_mut();
        let mut hollow = self.hollow_slots();
        for i in 0..self.capacity() as usize {
            if !set.contains(i) {
                continue;
            }
            let (first, n) = self.os_pages_of(seg, i);
            if seg.count_committed(first, n) != n {
                hollow += 1;
                continue;
            }
            let b = (self.start + i * slot) as *mut Block;
            // SAFETY: a free slot of this page on resident OS pages; the
            // page lists are held (caller of `hollow`).
            unsafe { link_after(&mut head, &mut tail, b) };
        }
        self.free = head;
        self.set_hollow_slots(hollow);
    }

    /// Carves the hollow slots again: their OS pages become committed (they
    /// fault in as they are written) and the slots go onto the free list
    /// with the page key. Returns the OS pages newly marked committed.
    ///
    /// # Safety
    /// The owner's page lists are held, and the caller is the page's owner
    /// (it is about to allocate from it).
    pub unsafe fn refill_hollow(&mut self) -> usize {
        // SAFETY: a slab page lies in a registered, mapped segment.
        let seg = unsafe { &*Segment::of(segment_base(self.start)) };
        let base = seg.os_page(self.start);
        let slot = self.slot_size as usize;
        let (mut head, mut tail) = (null_mut::<Block>(), null_mut::<Block>());
        let mut next_slot = 0;
        let mut newly = 0;
        for k in 0..self.carved_os_pages() {
            if seg.count_committed(base + k, 1) == 1 {
                continue;
            }
            newly += seg.set_committed(base + k, 1);
            let (first, last) = self.slots_on(k);
            // Slots straddling two hollow OS pages are met twice.
            for i in first.max(next_slot)..=last {
                if self.is_withheld(i) {
                    // Its bytes on a meshed OS page may be another's.
                    continue;
                }
                let b = (self.start + i * slot) as *mut Block;
                // SAFETY: a hollow slot of this page (it overlaps a purged OS
                // page, so it is neither free-listed nor in use), about to be
                // committed again; it holds two words at least.
                unsafe {
                    if Block::is_cached(b) {
                        // Freed again into a thread cache that read the
                        // page as cacheable just before it was hollowed
                        // (`Page::set_hollow_slots`), and still there.
                        misuse(Misuse::DoubleFree, b as usize);
                    }
                    link_after(&mut head, &mut tail, b);
                    Block::mark_in_page(b);
                }
            }
            next_slot = last + 1;
        }
        if !tail.is_null() {
            // SAFETY: the chain's last slot, just linked.
            unsafe { Block::set_next(tail, self.free) };
            self.free = head;
        }
        self.set_hollow_slots(self.withheld_slots);
        self.hollow_pages = 0;
        self.hollow_seen_used = u32::MAX;
        newly
    }

    /// The page is in use again (some thread's current page): what it
    /// frees from now on is worth a look again.
    pub fn back_in_use(&mut self) {
        self.out_of_use_since = 0;
        self.hollow_seen_used = u32::MAX;
    }
}

/// Slots (first, last) of a page of `capacity` slots of `slot` bytes
/// that overlap its OS page `k` (of `os_page` bytes).
pub(crate) fn slots_on(k: usize, slot: usize, capacity: usize, os_page: usize) -> (usize, usize) {
    let last = (((k + 1) * os_page - 1) / slot).min(capacity - 1);
    (k * os_page / slot, last)
}

/// Offers each run of the OS pages `0..end` of a page that `can_go`
/// allows, longest first from the left, to `purge(first, count)`, which
/// says whether it purged them; returns the OS pages purged.
fn purge_runs(
    end: usize,
    mut can_go: impl FnMut(usize) -> bool,
    mut purge: impl FnMut(usize, usize) -> bool,
) -> usize {
    let mut purged = 0;
    let mut k = 0;
    while k < end {
        let run = k;
        while k < end && can_go(k) {
            k += 1;
        }
        if k > run && purge(run, k - run) {
            purged += k - run;
        }
        k += 1;
    }
    purged
}

/// Appends `b` to the list `head..tail` (its link is written: the slot is
/// the caller's to write).
///
/// # Safety
/// `b` is a writable slot of two words at least; `tail`, if not null, too.
pub(crate) unsafe fn link_after(head: &mut *mut Block, tail: &mut *mut Block, b: *mut Block) {
    // SAFETY: per the caller.
    unsafe {
        Block::set_next(b, null_mut());
        if tail.is_null() {
            *head = b;
        } else {
            Block::set_next(*tail, b);
        }
    }
    *tail = b;
}

#[cfg(all(test, loom))]
mod loom_model {
    //! Hollowing a page against a remote free of a slot on it, under every
    //! interleaving loom finds: the remote free is the allocator's
    //! (`memory/remote_word.rs` on loom's atomics), and which OS pages go
    //! is decided by the functions `Page::hollow` decides it with
    //! ([`SlotSet`], [`slots_on`], `purge_runs`, and `can_hollow`'s test
    //! for a page with no slot withheld, `SlotSet::contains_all`). The holder of
    //! the page lists collects the page's remote frees (as
    //! `collect_and_release_if_empty` does before `hollow_page`), then
    //! purges the OS pages whose slots are all free; a purge zeroes the
    //! slots on it, as `MADV_DONTNEED` would. Slots are loom cells, so a
    //! purge of a slot the freeing thread still writes, or wrote with no
    //! ordering that reaches the purge, is reported as a data race.
    use super::*;
    use crate::memory::remote_word;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::AtomicUsize;
    use loom::sync::Arc;

    /// The model's OS page, and a slot of half of one: four slots on two
    /// OS pages.
    const OS_PAGE: usize = 4096;
    const SLOT: usize = 2048;
    const SLOTS: usize = 4;

    struct Page {
        thread_free: AtomicUsize,
        /// Each slot's first word: the object's, then its link (the next
        /// slot + 1, 0: none) once freed.
        slots: [UnsafeCell<usize>; SLOTS],
    }

    impl Page {
        /// Another thread's free of slot `i`, whose object it last wrote.
        fn free_remote(&self, i: usize) {
            // SAFETY: loom checks the access; the slot is the thread's.
            self.slots[i].with_mut(|v| unsafe { *v = 0xab });
            remote_word::push(&self.thread_free, i, 1, |old| {
                // SAFETY: as above.
                self.slots[i].with_mut(|v| unsafe { *v = old.map_or(0, |l| l.first + 1) })
            });
        }

        /// The page-lists holder's collect: the remote frees join `free`.
        fn collect(&self, free: &mut SlotSet) {
            let Some(list) = remote_word::take(&self.thread_free) else {
                return;
            };
            let mut i = list.first;
            for n in 0..list.count {
                free.insert(i);
                if n + 1 < list.count {
                    // SAFETY: loom checks the access; collected.
                    i = self.slots[i].with(|v| unsafe { *v }) - 1;
                }
            }
        }

        /// Purges what `free` allows; returns the OS pages purged.
        fn hollow(&self, free: &SlotSet) -> usize {
            let slots_on = |k| slots_on(k, SLOT, SLOTS, OS_PAGE);
            purge_runs(
                SLOTS * SLOT / OS_PAGE,
                |k| {
                    // `Page::can_hollow` on a page with no slot withheld
                    // (no meshing) and every OS page resident.
                    let (first, last) = slots_on(k);
                    free.contains_all(first, last)
                },
                |run, n| {
                    for k in run..run + n {
                        let (first, last) = slots_on(k);
                        for slot in &self.slots[first..=last] {
                            // SAFETY: loom checks the access.
                            slot.with_mut(|v| unsafe { *v = 0 });
                        }
                    }
                    true
                },
            )
        }
    }

    /// Slot 0 is live (the page's survivor), slots 1 and 3 are free, slot
    /// 2 is another thread's, which frees it while the page is visited:
    /// its OS page (slots 2 and 3) goes only once it is collected, after
    /// its free; the survivor's never does. With `late`, the visit waits
    /// until the free is pending (loom follows one access per atomic back,
    /// so the freeing thread's own load would hide the visit's, and the
    /// schedule where the free comes first would go unexplored).
    fn model(late: bool) {
        loom::model(move || {
            let p = Arc::new(Page {
                thread_free: AtomicUsize::new(0),
                slots: [0; SLOTS].map(UnsafeCell::new),
            });
            let freer = {
                let p = p.clone();
                loom::thread::spawn(move || p.free_remote(2))
            };
            while late && !remote_word::pending(&p.thread_free) {
                loom::thread::yield_now();
            }
            let mut free = SlotSet::new();
            free.insert(1);
            free.insert(3);
            p.collect(&mut free);
            let collected = free.contains(2);
            let purged = p.hollow(&free);
            assert_eq!(purged, collected as usize, "the second OS page alone");
            freer.join().unwrap();
            // The next visit takes in what came late.
            p.collect(&mut free);
            assert!(free.contains(2));
            assert_eq!(free.len(), 3);
        });
    }

    #[test]
    fn hollowing_races_a_remote_free_on_the_page() {
        model(false);
    }

    #[test]
    fn hollowing_after_a_remote_free_on_the_page() {
        model(true);
    }
}
