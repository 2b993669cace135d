//! Which OS pages mesh, and when: the policy over `memory/mesh.rs` (which
//! slots a meshed page may use) and the page source's `SharePages` (which
//! virtual pages show which physical page). docs/design.md, "Meshing".
//!
//! A pass, run by the heap's owner with its page lists held:
//! 1. meshed OS pages on which nothing is in use any more leave their
//!    groups and become hollow;
//! 2. per size class, the sparse OS pages of the pages out of use are
//!    gathered (`Page::mesh_candidates`), shuffled, and each is placed in
//!    the first of the last [`PROBES`] groups of its phase whose live
//!    positions it does not meet (Mesh's SplitMesher probes 64), or starts
//!    a group;
//! 3. every group of two members or more is made: the pages' slots on the
//!    planned OS pages are withheld first (their free list runs through
//!    memory that is about to show another page's bytes), then the
//!    founder's page is shared and the others join, copying their live
//!    slots; a member the kernel refuses gets its slots back.

use super::hollow::Hollow;
use super::*;
use crate::memory::mesh::{Candidate, Positions, Withheld, MAX_POSITIONS};
use crate::os::source::{map_table, unmap_table, SharePages};
use core::mem::size_of;
use core::ptr::NonNull;

/// Candidates one class gives a pass at most.
const MAX_CANDIDATES: usize = 4096;
/// Open groups a candidate is tried against.
const PROBES: usize = 64;
/// No group.
const NONE: u32 = u32::MAX;

/// A group being planned: its first member, the last one (members are
/// chained through `next`), its phase and the union of live positions.
#[derive(Clone, Copy)]
struct Group {
    first: u32,
    last: u32,
    members: u32,
    phase: u32,
    union: Positions,
}

/// A candidate's place in the plan.
#[derive(Clone, Copy)]
struct Plan {
    group: u32,
    next: u32,
    /// Its slots were withheld for the group.
    withheld: bool,
    /// It did not join (the kernel refused, or its group came to nothing).
    failed: bool,
}

/// The scratch memory of one pass (anonymous, mapped per pass).
struct Scratch {
    base: NonNull<u8>,
    bytes: usize,
    cands: *mut Candidate,
    plans: *mut Plan,
    order: *mut u32,
    groups: *mut Group,
    ranges: *mut (usize, usize),
    n: usize,
    ngroups: usize,
}

impl Scratch {
    fn map() -> Option<Scratch> {
        let parts = [
            MAX_CANDIDATES * size_of::<Candidate>(),
            MAX_CANDIDATES * size_of::<Plan>(),
            MAX_CANDIDATES * size_of::<u32>(),
            MAX_CANDIDATES * size_of::<Group>(),
            MAX_POSITIONS * size_of::<(usize, usize)>(),
        ];
        let mut offsets = [0; 5];
        let mut at = 0;
        for (o, len) in offsets.iter_mut().zip(parts) {
            *o = at;
            at = (at + len).next_multiple_of(64);
        }
        let bytes = at.next_multiple_of(os_page());
        let base = map_table(bytes)?;
        let p = |i: usize| base.as_ptr().wrapping_add(offsets[i]);
        Some(Scratch {
            base,
            bytes,
            cands: p(0).cast(),
            plans: p(1).cast(),
            order: p(2).cast(),
            groups: p(3).cast(),
            ranges: p(4).cast(),
            n: 0,
            ngroups: 0,
        })
    }

    fn push(&mut self, c: Candidate) {
        if self.n < MAX_CANDIDATES {
            // SAFETY: `n` is below the capacity mapped for candidates.
            unsafe { self.cands.add(self.n).write(c) };
            self.n += 1;
        }
    }

    fn cand(&self, i: u32) -> &Candidate {
        // SAFETY: `i` < `n`, written by `push`.
        unsafe { &*self.cands.add(i as usize) }
    }

    fn plan(&mut self, i: u32) -> &mut Plan {
        // SAFETY: `i` < `n`, written by `place`.
        unsafe { &mut *self.plans.add(i as usize) }
    }

    fn group(&mut self, g: u32) -> &mut Group {
        // SAFETY: `g` < `ngroups`, written by `place`.
        unsafe { &mut *self.groups.add(g as usize) }
    }

    /// Shuffles the candidates' order (a xorshift from `seed`) and places
    /// each in a group.
    fn place_all(&mut self, mut seed: u64) {
        self.ngroups = 0;
        for i in 0..self.n {
            // SAFETY: below the capacity.
            unsafe { self.order.add(i).write(i as u32) };
        }
        for i in (1..self.n).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let j = (seed % (i as u64 + 1)) as usize;
            // SAFETY: both below `n`.
            unsafe { core::ptr::swap(self.order.add(i), self.order.add(j)) };
        }
        for k in 0..self.n {
            // SAFETY: below `n`.
            let i = unsafe { *self.order.add(k) };
            self.place(i);
        }
    }

    /// Puts candidate `i` in the first recent group of its phase it fits,
    /// or a new one.
    fn place(&mut self, i: u32) {
        let c = *self.cand(i);
        *self.plan(i) = Plan {
            group: NONE,
            next: NONE,
            withheld: false,
            failed: false,
        };
        let lowest = self.ngroups.saturating_sub(PROBES);
        for g in (lowest..self.ngroups).rev() {
            let g = g as u32;
            let group = self.group(g);
            if group.phase == c.phase && group.union.disjoint(&c.live) {
                group.union.union(&c.live);
                group.members += 1;
                let last = core::mem::replace(&mut group.last, i);
                self.plan(last).next = i;
                self.plan(i).group = g;
                return;
            }
        }
        let g = self.ngroups as u32;
        // SAFETY: at most one group per candidate, below the capacity.
        unsafe {
            self.groups.add(self.ngroups).write(Group {
                first: i,
                last: i,
                members: 1,
                phase: c.phase,
                union: c.live,
            })
        };
        self.ngroups += 1;
        self.plan(i).group = g;
    }

    /// Whether candidate `i` is planned into a group of two or more.
    fn planned(&mut self, i: u32) -> bool {
        let g = self.plan(i).group;
        g != NONE && self.group(g).members >= 2
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: mapped by `map`, no longer used.
        unsafe { unmap_table(self.base, self.bytes) };
    }
}

/// Withheld-slot records: a free list of them in chunks of anonymous
/// memory, kept with the page lists.
pub(crate) struct Records {
    free: *mut Withheld,
    chunks: *mut u8,
}

/// Bytes of one chunk of records: its first record's room holds the link
/// to the next chunk.
const CHUNK: usize = 64 << 10;
const RECORD: usize = size_of::<Withheld>();

impl Records {
    pub(crate) const EMPTY: Records = Records {
        free: null_mut(),
        chunks: null_mut(),
    };

    /// A zeroed record, or null if no memory is left.
    fn take(&mut self) -> *mut Withheld {
        if self.free.is_null() && !self.grow() {
            return null_mut();
        }
        let r = self.free;
        // SAFETY: a free record holds the next one's address in its first
        // word; it is ours from here and is zeroed before use.
        unsafe {
            self.free = *(r as *mut *mut Withheld);
            r.write(Withheld::new());
        }
        r
    }

    fn give(&mut self, r: *mut Withheld) {
        // SAFETY: a record taken from this pool, no longer used.
        unsafe { *(r as *mut *mut Withheld) = self.free };
        self.free = r;
    }

    fn grow(&mut self) -> bool {
        let Some(chunk) = map_table(CHUNK) else {
            return false;
        };
        let chunk = chunk.as_ptr();
        // SAFETY: a fresh chunk of CHUNK bytes: the link, then records.
        unsafe {
            *(chunk as *mut *mut u8) = self.chunks;
            self.chunks = chunk;
            for i in 1..CHUNK / RECORD {
                self.give(chunk.add(i * RECORD).cast());
            }
        }
        true
    }

    /// Unmaps every chunk (the heap is going away).
    pub(crate) fn unmap_all(&mut self) {
        while let Some(chunk) = NonNull::new(self.chunks) {
            // SAFETY: a chunk of ours, linked by `grow`, no longer used.
            unsafe {
                self.chunks = *(chunk.as_ptr() as *mut *mut u8);
                unmap_table(chunk, CHUNK);
            }
        }
        self.free = null_mut();
    }
}

impl HeapCore {
    /// Empties the caches, releases empty pages and hollows the others
    /// (as `trim()` does to the pages), then makes a mesh pass. Returns
    /// the OS pages that joined groups.
    ///
    /// # Safety
    /// Owner only; as [`HeapCore::mesh_pass`] for writers.
    pub unsafe fn mesh(&self) -> usize {
        let mut l = self.lock_local();
        // SAFETY: owner (caller), with the page lists held.
        unsafe {
            self.flush_caches(&mut l);
            self.release_empty_pages(&mut l, Access::Owner, Hollow::Now);
            self.mesh_pass(&mut l)
        }
    }

    /// Unmaps the withheld-slot records (the heap is going away).
    pub(crate) fn unmap_mesh_records(&self) {
        self.lock_local().records.unmap_all();
    }

    /// One mesh pass (see the module). Returns the OS pages that joined
    /// groups.
    ///
    /// # Safety
    /// The page lists are held (by the owner or a visitor); no thread
    /// writes to memory of this heap during the call (a store to a page
    /// being copied would be lost) unless the write barrier's handler is
    /// installed (`os/barrier.rs`), which makes such a store wait.
    pub(crate) unsafe fn mesh_pass(&self, l: &mut Local) -> usize {
        let Some(sharing) = self.source().sharing() else {
            return 0;
        };
        // SAFETY: per the caller.
        unsafe { self.leave_unused_groups(l, sharing) };
        let Some(mut scratch) = Scratch::map() else {
            return 0;
        };
        let mut joined = 0;
        for class in 0..CLASSES {
            scratch.n = 0;
            let current = self.current_page(class);
            let mut p = l.queues[class].head;
            while !p.is_null() {
                // SAFETY: queue entries are slab pages of this heap, with
                // the page lists held; the current page is left alone.
                unsafe {
                    if p != current {
                        (*p).mesh_candidates(|c| scratch.push(c));
                    }
                    p = (*p).next;
                }
            }
            if scratch.n < 2 {
                continue;
            }
            scratch.place_all(
                self.source().now_ms() ^ (class as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            );
            // SAFETY: per the caller.
            joined += unsafe { self.make_groups(l, &mut scratch, sharing) };
        }
        joined
    }

    /// Meshed OS pages with nothing in use leave their groups.
    ///
    /// # Safety
    /// As [`HeapCore::mesh_pass`].
    unsafe fn leave_unused_groups(&self, l: &mut Local, sharing: &dyn SharePages) {
        for class in 0..CLASSES {
            let current = self.current_page(class);
            let mut p = l.queues[class].head;
            while !p.is_null() {
                // SAFETY: as in `mesh_pass`.
                unsafe {
                    if p != current && (*p).meshed_pages() > 0 {
                        let left = (*p).leave_unused_meshed(|a| sharing.leave(a, false));
                        let bytes = left as u64 * os_page() as u64;
                        self.slab_committed.sub(bytes);
                        self.hollow_bytes.add(bytes);
                        self.give_record(l, p);
                    }
                    p = (*p).next;
                }
            }
        }
    }

    /// Makes the planned groups of `scratch`. Returns the OS pages that
    /// joined.
    ///
    /// # Safety
    /// As [`HeapCore::mesh_pass`]; `scratch` holds this heap's candidates,
    /// placed.
    unsafe fn make_groups(
        &self,
        l: &mut Local,
        s: &mut Scratch,
        sharing: &dyn SharePages,
    ) -> usize {
        // 1. Withhold the slots on every planned OS page, page by page (the
        //    candidates of a page are consecutive).
        let mut i = 0;
        while i < s.n as u32 {
            let page = s.cand(i).page;
            let mut end = i;
            let mut planned = 0;
            while end < s.n as u32 && s.cand(end).page == page {
                if s.planned(end) {
                    mark_meshed(s.cand(end), true);
                    planned += 1;
                }
                end += 1;
            }
            if planned > 0 {
                // SAFETY: a slab page of this heap, page lists held.
                let record = unsafe { (*page).mesh };
                let record = if record.is_null() {
                    l.records.take()
                } else {
                    record
                };
                if record.is_null() {
                    for j in i..end {
                        if s.planned(j) {
                            mark_meshed(s.cand(j), false);
                            s.plan(j).failed = true;
                        }
                    }
                } else {
                    // SAFETY: per the caller; the record is the page's.
                    unsafe { (*page).withhold_meshed(planned, record) };
                    for j in i..end {
                        if s.planned(j) {
                            s.plan(j).withheld = true;
                        }
                    }
                }
            }
            i = end;
        }
        // 2. Share and join, one group at a time under the barrier (other
        //    threads' stores to a page being copied wait).
        let mut joined = 0;
        for g in 0..s.ngroups as u32 {
            if s.group(g).members >= 2 {
                let barrier = raise_barrier();
                // SAFETY: per the caller.
                joined += unsafe { make_group(s, g, sharing) };
                if barrier {
                    lower_barrier();
                }
            }
        }
        // 3. Pages whose planned OS pages did not all join get the slots
        //    withheld for them back.
        let mut i = 0;
        while i < s.n as u32 {
            let page = s.cand(i).page;
            let mut failed = 0;
            while i < s.n as u32 && s.cand(i).page == page {
                failed += u32::from(s.plan(i).failed && s.plan(i).withheld);
                i += 1;
            }
            if failed > 0 {
                // SAFETY: per the caller.
                unsafe { (*page).restore_unmeshed(failed) };
                self.give_record(l, page);
            }
        }
        joined
    }

    /// Returns `page`'s withheld-slot record to the pool once it has no
    /// meshed OS page.
    fn give_record(&self, l: &mut Local, page: *mut Page) {
        // SAFETY: a slab page of this heap, page lists held.
        let r = unsafe { (*page).take_mesh_record() };
        if !r.is_null() {
            l.records.give(r);
        }
    }

    /// Before `page` (empty) is released: its meshed OS pages leave their
    /// groups, and its record goes back. Their commit bits are cleared.
    ///
    /// # Safety
    /// Owner only, with the page lists held.
    pub(super) unsafe fn leave_groups_before_release(&self, l: &mut Local, page: *mut Page) {
        // SAFETY: per the caller.
        if unsafe { (*page).meshed_pages() } == 0 {
            return;
        }
        let Some(sharing) = self.source().sharing() else {
            return;
        };
        // SAFETY: per the caller.
        let before = unsafe { (*page).meshed_pages() };
        // SAFETY: per the caller: empty, about to be released.
        let stuck = unsafe { (*page).leave_all_meshed(|a| sharing.leave(a, false)) };
        if stuck > 0 {
            // Reusing the span would write through to another group's
            // page. Only a kernel out of mappings refuses a remap.
            crate::fault::write_stderr(&[
                b"pagewise: the kernel refused to unmesh a page (mmap MAP_FIXED failed)\n",
            ]);
            std::process::abort();
        }
        self.slab_committed.sub(before as u64 * os_page() as u64);
        self.give_record(l, page);
    }
}

/// Raises the write barrier if its handler is installed (the global
/// allocator meshes); says whether it did.
fn raise_barrier() -> bool {
    #[cfg(target_os = "linux")]
    if crate::os::barrier::installed() {
        crate::os::barrier::raise();
        return true;
    }
    false
}

fn lower_barrier() {
    #[cfg(target_os = "linux")]
    crate::os::barrier::lower();
}

/// Sets or clears the `meshed` bit of a candidate's OS page.
fn mark_meshed(c: &Candidate, on: bool) {
    let addr = c.addr();
    // SAFETY: a slab page lies in a registered, mapped segment.
    let seg = unsafe { &*Segment::of(crate::memory::layout::segment_base(addr)) };
    if on {
        seg.set_meshed(seg.os_page(addr));
    } else {
        seg.clear_meshed(seg.os_page(addr));
    }
}

/// Shares the first member of group `g` that can found it (a page whose
/// earlier group still has members cannot) and joins the others to it; a
/// member that cannot join is marked failed (and its bit cleared). Returns
/// the OS pages that joined, the founder included.
///
/// # Safety
/// As [`HeapCore::mesh_pass`]; the members' slots are withheld.
unsafe fn make_group(s: &mut Scratch, g: u32, sharing: &dyn SharePages) -> usize {
    let mut founder = NONE;
    let mut m = s.group(g).first;
    while m != NONE {
        // SAFETY: per the caller.
        if !s.plan(m).failed && unsafe { sharing.share(s.cand(m).addr()) } {
            founder = m;
            break;
        }
        m = s.plan(m).next;
    }
    if founder == NONE {
        let first = s.group(g).first;
        fail_from(s, first);
        return 0;
    }
    let mut joined = 1;
    let mut m = s.group(g).first;
    while m != NONE {
        let c = *s.cand(m);
        if m != founder && !s.plan(m).failed {
            // SAFETY: `ranges` has room for every position of an OS page.
            let ranges = unsafe { core::slice::from_raw_parts_mut(s.ranges, MAX_POSITIONS) };
            // SAFETY: a slab page of this heap.
            let n = unsafe { (*c.page).live_ranges(c.k as usize, &c.live, ranges) };
            // SAFETY: per the caller; the group's bytes at these ranges hold
            // nothing of the others (the union was disjoint).
            if unsafe { sharing.join(s.cand(founder).addr(), c.addr(), &ranges[..n]) } {
                joined += 1;
            } else {
                mark_meshed(&c, false);
                s.plan(m).failed = true;
            }
        }
        m = s.plan(m).next;
    }
    if joined == 1 {
        // Alone: not worth a group; the group page's bytes go back to the
        // founder's own page (with whatever a member that failed after
        // its copy left in the founder's free slots: their keys are
        // rewritten by `restore_unmeshed`).
        // SAFETY: the founder's live slots are where they were.
        if unsafe { sharing.leave(s.cand(founder).addr(), true) } {
            mark_meshed(&s.cand(founder).clone(), false);
            s.plan(founder).failed = true;
            return 0;
        }
    }
    joined
}

/// Marks `from` and every member after it failed, clearing their bits.
fn fail_from(s: &mut Scratch, from: u32) {
    let mut m = from;
    while m != NONE {
        if !s.plan(m).failed {
            mark_meshed(&s.cand(m).clone(), false);
            s.plan(m).failed = true;
        }
        m = s.plan(m).next;
    }
}
