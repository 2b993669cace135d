//! Meshing, the page side: which OS pages of a slab page can share a
//! physical page with OS pages of other slab pages, and what the page keeps
//! track of once they do (docs/design.md, "Meshing").
//!
//! An OS page is *meshed* when its virtual page shows a group's physical
//! page (`os/shared.rs`), whose bytes at each position belong to one member
//! at most. A member keeps the positions that held live slots when it
//! joined: those slots are its own in the group page, and they may be freed
//! and handed out again like any other. Every other slot overlapping a
//! meshed OS page is *withheld*: neither free nor in use, like a hollow
//! slot, since its bytes may be another member's object. The page records
//! them in a bitmap of its own ([`Withheld`]); a withheld slot is never on
//! the free list and is never carved again while it overlaps a meshed page.
//!
//! The segment's `meshed` bitmap says which OS pages are meshed; their
//! commit bits stay set (the virtual page is backed). When no slot on a
//! meshed OS page is in use any more, the page leaves its group and
//! becomes an ordinary hollow OS page (commit bit clear), carved again on
//! demand. A page released to the span pool leaves every group first.
//!
//! Which pages are looked at and when is the heap's policy
//! (`heap/mesh.rs`); the system calls are the page source's.

use crate::memory::hollow::SlotSet;
use crate::memory::layout::{os_page, segment_base, MAX_OS_PAGE};
use crate::memory::page::{Block, Page};
use crate::memory::segment::Segment;
use crate::memory::size_class::MIN_SLOT;
use core::ptr::null_mut;

/// Most slot positions an OS page has: slots that start in it, and one
/// that straddles into it.
pub const MAX_POSITIONS: usize = MAX_OS_PAGE / MIN_SLOT + 1;
/// Words of a [`Positions`] mask.
const POSITION_WORDS: usize = MAX_POSITIONS.div_ceil(64);

/// The withheld slots of a page with meshed OS pages (one bit per slot).
pub type Withheld = SlotSet;

/// A set of slot positions of one OS page: position `j` is the `j`-th slot
/// overlapping it.
#[derive(Clone, Copy)]
pub struct Positions([u64; POSITION_WORDS]);

impl Positions {
    /// No position.
    pub const EMPTY: Positions = Positions([0; POSITION_WORDS]);

    pub(crate) fn insert(&mut self, j: usize) {
        self.0[j / 64] |= 1 << (j % 64);
    }

    /// Whether position `j` is in the set.
    pub fn contains(&self, j: usize) -> bool {
        self.0[j / 64] & (1 << (j % 64)) != 0
    }

    /// Whether no position is in both.
    pub fn disjoint(&self, other: &Positions) -> bool {
        self.0.iter().zip(&other.0).all(|(a, b)| a & b == 0)
    }

    /// Adds every position of `other`.
    pub fn union(&mut self, other: &Positions) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a |= b;
        }
    }
}

/// An OS page that could join a mesh group: resident, not meshed, holding
/// some live slots and room for others.
#[derive(Clone, Copy)]
pub struct Candidate {
    /// Its slab page.
    pub page: *mut Page,
    /// Its index among the page's OS pages.
    pub k: u32,
    /// Where the slot grid meets the OS page (`k * os_page % slot`): only
    /// OS pages of one class and one phase have the same positions.
    pub phase: u32,
    /// Live slot positions.
    pub live: Positions,
}

impl Candidate {
    /// The OS page's address.
    pub fn addr(&self) -> usize {
        // SAFETY: a slab page descriptor of the caller's heap.
        unsafe { (*self.page).start + self.k as usize * os_page() }
    }

    /// Whether the slot starting at `addr` (16-aligned, so its first two
    /// words are on the OS page `addr` is on) starts on this OS page at a
    /// position not in use when the candidate was taken: a free slot, whose
    /// position the group page gives to another member's object.
    pub fn free_slot_at(&self, addr: usize) -> bool {
        let start = self.addr();
        if addr < start || addr - start >= os_page() {
            return false;
        }
        // SAFETY: a slab page descriptor of the caller's heap.
        let page = unsafe { &*self.page };
        let i = (addr - page.start) / page.slot_size as usize;
        let (first, _) = page.slots_on(self.k as usize);
        !self.live.contains(i - first)
    }
}

impl Page {
    /// Whether slot `i` (carved) overlaps an OS page whose commit bit is
    /// clear: hollow or, if withheld, both.
    fn on_uncommitted(&self, seg: &Segment, i: usize) -> bool {
        let (first, n) = self.os_pages_of(seg, i);
        seg.count_committed(first, n) != n
    }

    /// Whether slot `i` overlaps a meshed OS page.
    pub(crate) fn on_meshed(&self, seg: &Segment, i: usize) -> bool {
        let (first, n) = self.os_pages_of(seg, i);
        (first..first + n).any(|p| seg.is_meshed(p))
    }

    /// Whether slot `i` is withheld.
    pub(crate) fn is_withheld(&self, i: usize) -> bool {
        // SAFETY: the record, if any, is this page's (set by the heap under
        // the page lists, and freed only when the page is released).
        !self.mesh.is_null() && unsafe { (*self.mesh).contains(i) }
    }

    /// Whether slot `i` is in use: carved, and neither free (in `free`),
    /// hollow nor withheld.
    fn in_use(&self, seg: &Segment, free: &SlotSet, i: usize) -> bool {
        !free.contains(i) && !self.is_withheld(i) && !self.on_uncommitted(seg, i)
    }

    /// OS pages of this page meshed now.
    pub fn meshed_pages(&self) -> u32 {
        self.meshed_pages
    }

    /// The OS pages of this page that could join a mesh group, each passed
    /// to `found`: resident, not meshed, with live bytes (of the slots in
    /// use, as far as they lie on it) filling at most half of it, or three
    /// quarters for slots larger than half an OS page: an OS page holding
    /// the small end of one live 5,120-byte slot and one holding the large
    /// start of another, on the same grid, mesh (the halves of a 4 KiB page
    /// 5,120-byte slots cut at 1 KiB). Returns false (and finds nothing)
    /// if the page has too few slots out of use to be worth it: free or
    /// hollow, since a slot straddling a hollow OS page is hollow and
    /// leaves room on its resident one (one live 5,120-byte slot per five
    /// 4 KiB OS pages leaves no slot on the free list at all).
    ///
    /// # Safety
    /// The owner's page lists are held; a slab page of the heap that is not
    /// any thread's current page (as for [`Page::hollow`]).
    pub unsafe fn mesh_candidates(&self, mut found: impl FnMut(Candidate)) -> bool {
        let slot = self.slot_size as usize;
        let most = if slot * 2 > os_page() {
            os_page() * 3 / 4
        } else {
            os_page() / 2
        };
        let Some(free) = self.free_slots() else {
            return false;
        };
        let out_of_use = (self.capacity() - self.used()) as usize;
        if out_of_use * slot * 2 < os_page() {
            // Not half an OS page of room: no OS page of it is sparse.
            return false;
        }
        // SAFETY: per the caller.
        let set = unsafe { self.free_set(free) };
        // SAFETY: a slab page lies in a registered, mapped segment.
        let seg = unsafe { &*Segment::of(segment_base(self.start)) };
        let base = seg.os_page(self.start);
        for k in 0..self.carved_os_pages() {
            if seg.count_committed(base + k, 1) == 0 || seg.is_meshed(base + k) {
                continue;
            }
            let (first, last) = self.slots_on(k);
            let (page_begin, page_end) = (k * os_page(), (k + 1) * os_page());
            let mut live = Positions::EMPTY;
            let mut bytes = 0;
            for i in first..=last {
                if self.in_use(seg, &set, i) {
                    live.insert(i - first);
                    bytes += ((i + 1) * slot).min(page_end) - (i * slot).max(page_begin);
                }
            }
            if bytes > 0 && bytes <= most {
                found(Candidate {
                    page: self as *const Page as *mut Page,
                    k: k as u32,
                    phase: ((k * os_page()) % slot) as u32,
                    live,
                });
            }
        }
        true
    }

    /// The meshed OS pages of this page, each passed to `found` with, as
    /// its `live` positions, every position a slot of this page may use on
    /// it: each slot overlapping it that is not withheld, whether in use,
    /// free or hollow (a free slot is handed out again at any time, and a
    /// hollow one once its other OS page is carved again). A group that
    /// takes a new member must keep clear of all of them.
    ///
    /// # Safety
    /// The owner's page lists are held; a slab page of the heap.
    pub unsafe fn meshed_positions(&self, mut found: impl FnMut(Candidate)) {
        if self.meshed_pages == 0 {
            return;
        }
        let slot = self.slot_size as usize;
        // SAFETY: a slab page lies in a registered, mapped segment.
        let seg = unsafe { &*Segment::of(segment_base(self.start)) };
        let base = seg.os_page(self.start);
        for k in 0..self.carved_os_pages() {
            if !seg.is_meshed(base + k) {
                continue;
            }
            found(Candidate {
                page: self as *const Page as *mut Page,
                k: k as u32,
                phase: ((k * os_page()) % slot) as u32,
                live: self.owned_on(k),
            });
        }
    }

    /// Every position a slot of this page may use on its OS page `k`
    /// (meshed): each slot overlapping it that is not withheld (see
    /// [`Page::meshed_positions`]).
    pub fn owned_on(&self, k: usize) -> Positions {
        let (first, last) = self.slots_on(k);
        let mut owned = Positions::EMPTY;
        for i in first..=last {
            if !self.is_withheld(i) {
                owned.insert(i - first);
            }
        }
        owned
    }

    /// Free-listed slots (carved, not in use, not hollow or withheld), or
    /// `None` if the counts say more are in use than carved.
    fn free_slots(&self) -> Option<usize> {
        let n = self
            .capacity()
            .checked_sub(self.used() + self.hollow_slots())?;
        Some(n as usize)
    }

    /// Byte ranges (offset in the OS page, length) of the live slots of
    /// OS page `k` at `live`, adjacent slots merged, written to `out`;
    /// returns how many.
    pub fn live_ranges(&self, k: usize, live: &Positions, out: &mut [(usize, usize)]) -> usize {
        let slot = self.slot_size as usize;
        let (first, last) = self.slots_on(k);
        let page_begin = k * os_page();
        let mut n = 0;
        for i in first..=last {
            if !live.contains(i - first) {
                continue;
            }
            let begin = (i * slot).max(page_begin) - page_begin;
            let end = ((i + 1) * slot).min(page_begin + os_page()) - page_begin;
            if n > 0 && out[n - 1].0 + out[n - 1].1 == begin {
                out[n - 1].1 += end - begin;
            } else {
                out[n] = (begin, end - begin);
                n += 1;
            }
        }
        n
    }

    /// After OS pages of this page joined groups (their `meshed` bits set,
    /// `newly` of them): every slot on a meshed OS page that is not in use
    /// becomes withheld, and the free list is rebuilt without them.
    /// `record` is a zeroed bitmap for a page that has none yet.
    ///
    /// # Safety
    /// As [`Page::mesh_candidates`]; `record` is exclusively this page's
    /// from now until [`Page::take_mesh_record`].
    pub unsafe fn withhold_meshed(&mut self, newly: u32, record: *mut Withheld) {
        let free = self
            .free_slots()
            .unwrap_or_else(|| crate::fault::misuse(crate::fault::Misuse::DoubleFree, self.start));
        // SAFETY: per the caller.
        let set = unsafe { self.free_set(free) };
        if self.mesh.is_null() {
            self.mesh = record;
        }
        // SAFETY: a slab page lies in a registered, mapped segment.
        let seg = unsafe { &*Segment::of(segment_base(self.start)) };
        for i in 0..self.capacity() as usize {
            if !self.is_withheld(i) && !self.in_use(seg, &set, i) && self.on_meshed(seg, i) {
                // SAFETY: the record is this page's (above).
                unsafe { (*self.mesh).insert(i) };
            }
        }
        self.meshed_pages += newly;
        self.count_withheld();
        self.relink_usable(seg, &set);
        // Neighbours whose slots are now all free or withheld can be
        // hollowed: worth a look though nothing was freed.
        self.hollow_seen_used = u32::MAX;
    }

    /// The meshed OS pages of this page on which no slot is in use leave
    /// their groups (`leave(addr)` remaps one and says whether it did) and
    /// become hollow; slots withheld only because of them become hollow
    /// too. Returns the OS pages that left.
    ///
    /// # Safety
    /// As [`Page::mesh_candidates`].
    pub unsafe fn leave_unused_meshed(&mut self, mut leave: impl FnMut(usize) -> bool) -> u32 {
        if self.meshed_pages == 0 {
            return 0;
        }
        let free = self
            .free_slots()
            .unwrap_or_else(|| crate::fault::misuse(crate::fault::Misuse::DoubleFree, self.start));
        // SAFETY: per the caller.
        let set = unsafe { self.free_set(free) };
        // SAFETY: a slab page lies in a registered, mapped segment.
        let seg = unsafe { &*Segment::of(segment_base(self.start)) };
        let base = seg.os_page(self.start);
        let mut left = 0;
        for k in 0..self.carved_os_pages() {
            if !seg.is_meshed(base + k) {
                continue;
            }
            let (first, last) = self.slots_on(k);
            if (first..=last).any(|i| self.in_use(seg, &set, i)) {
                continue;
            }
            if leave(self.start + k * os_page()) {
                seg.clear_meshed(base + k);
                seg.clear_committed(base + k, 1);
                left += 1;
            }
        }
        if left > 0 {
            self.meshed_pages -= left;
            self.hollow_pages += left;
            self.unwithhold_unmeshed(seg);
            self.count_withheld();
            self.relink_usable(seg, &set);
        }
        left
    }

    /// Every meshed OS page of this page (which holds no slot in use: it is
    /// being released) leaves its group. Returns how many did not (the
    /// kernel refused a remap): the caller must not reuse the page.
    ///
    /// # Safety
    /// Owner only; an empty slab page about to be released.
    pub unsafe fn leave_all_meshed(&mut self, mut leave: impl FnMut(usize) -> bool) -> u32 {
        // SAFETY: a slab page lies in a registered, mapped segment.
        let seg = unsafe { &*Segment::of(segment_base(self.start)) };
        let base = seg.os_page(self.start);
        let mut stuck = 0;
        for k in 0..self.carved_os_pages() {
            if seg.is_meshed(base + k) {
                if leave(self.start + k * os_page()) {
                    seg.clear_meshed(base + k);
                    seg.clear_committed(base + k, 1);
                } else {
                    stuck += 1;
                }
            }
        }
        self.meshed_pages = stuck;
        if stuck == 0 {
            self.withheld_slots = 0;
        }
        stuck
    }

    /// After `failed` OS pages planned for groups did not join (their
    /// `meshed` bits cleared again): the slots withheld for them that are on
    /// no meshed page any more go back on the free list (or are hollow),
    /// with the page key rewritten: a page that founded a group that came
    /// to nothing got its bytes back from the group page, where a member
    /// that failed late may have copied its objects over those slots.
    ///
    /// # Safety
    /// As [`Page::mesh_candidates`]; the failed pages show their own bytes
    /// again (never remapped, or back on their own page with its live
    /// slots' bytes).
    pub unsafe fn restore_unmeshed(&mut self, failed: u32) {
        let free = self
            .free_slots()
            .unwrap_or_else(|| crate::fault::misuse(crate::fault::Misuse::DoubleFree, self.start));
        // SAFETY: per the caller.
        let mut set = unsafe { self.free_set(free) };
        // SAFETY: a slab page lies in a registered, mapped segment.
        let seg = unsafe { &*Segment::of(segment_base(self.start)) };
        for i in 0..self.capacity() as usize {
            if self.is_withheld(i) && !self.on_meshed(seg, i) {
                // SAFETY: the record is this page's.
                unsafe { (*self.mesh).remove(i) };
                if !self.on_uncommitted(seg, i) {
                    let b = (self.start + i * self.slot_size as usize) as *mut Block;
                    // SAFETY: a slot of this page, not in use, on its own
                    // resident memory: its link (rewritten by
                    // `relink_usable`) and key are ours to write.
                    unsafe { Block::mark_carved(b, self.slot_size as usize) };
                    set.insert(i);
                }
            }
        }
        self.meshed_pages -= failed;
        self.count_withheld();
        self.relink_usable(seg, &set);
    }

    /// Gives the withheld-slot record back once no OS page of the page is
    /// meshed (null otherwise, or if it has none).
    pub fn take_mesh_record(&mut self) -> *mut Withheld {
        if self.meshed_pages != 0 {
            return null_mut();
        }
        core::mem::replace(&mut self.mesh, null_mut())
    }

    fn count_withheld(&mut self) {
        self.withheld_slots = if self.mesh.is_null() {
            0
        } else {
            // SAFETY: the page's own record.
            unsafe { (*self.mesh).len() as u32 }
        };
    }

    /// Clears the withheld bit of every slot that no longer overlaps a
    /// meshed OS page (it is then hollow: its OS page left and is clear).
    fn unwithhold_unmeshed(&mut self, seg: &Segment) {
        for i in 0..self.capacity() as usize {
            if self.is_withheld(i) && !self.on_meshed(seg, i) {
                // SAFETY: the record is this page's.
                unsafe { (*self.mesh).remove(i) };
            }
        }
    }

    /// Rebuilds the free list from `set` in address order without the
    /// slots that are withheld or on an OS page whose commit bit is clear,
    /// and recounts the slots that are neither free nor in use.
    fn relink_usable(&mut self, seg: &Segment, set: &SlotSet) {
        let slot = self.slot_size as usize;
        let (mut head, mut tail) = (null_mut::<Block>(), null_mut::<Block>());
        let mut free = 0;
        for i in 0..self.capacity() as usize {
            if set.contains(i) && !self.is_withheld(i) && !self.on_uncommitted(seg, i) {
                // SAFETY: a free slot of this page on resident memory that
                // is its own; the page lists are held.
                unsafe {
                    crate::memory::hollow::link_after(
                        &mut head,
                        &mut tail,
                        (self.start + i * slot) as *mut Block,
                    )
                };
                free += 1;
            }
        }
        self.free = head;
        self.set_hollow_slots(self.capacity() - self.used() - free);
    }
}
