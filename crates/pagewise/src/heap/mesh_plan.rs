//! How a mesh pass groups the OS pages it found (`heap/mesh.rs` makes the
//! groups): which OS pages share a physical page, chosen so that the pass
//! saves memory without spending the kernel's mappings (`os/shared.rs`
//! counts them against a third of `vm.max_map_count`).
//!
//! Candidates come page by page, a page's in address order, one per
//! sparse OS page of a slab page. How they are placed is the [`Packing`]:
//! - [`Packing::Free`]: each OS page on its own, in a shuffled order, in
//!   the first of the last [`PROBES`] groups of its phase whose live
//!   positions it does not meet (Mesh's SplitMesher probes 64). The
//!   densest, and each member costs up to two kernel mappings.
//! - the others place slab page by slab page, in a shuffled order of
//!   pages: a page joins the *leader* page (one whose OS pages all founded
//!   groups; the last [`PROBES`] are tried) whose groups take the most of
//!   its OS pages at the same indices, so the page shows the leader's
//!   consecutive group pages, one kernel mapping; the packing says how
//!   many of its OS pages may miss (each costs two mappings), and those are
//!   placed one by one; a page no leader takes well enough becomes a
//!   leader.
//!
//! A pass picks, per size class, the densest packing whose mappings fit the
//! class's share of what is left of the budget.
//!
//! Groups made by earlier passes (*old* groups, loaded first with
//! [`Scratch::add_old`]) take new members too: a candidate placed on its
//! own (every one under [`Packing::Free`], the misses of the others) tries
//! the old groups of its phase first, up to [`PROBES`] of them. An old
//! group's positions are every position any of its members may use (in
//! use, free or hollow: all but the withheld ones), and a group is only
//! tried if the page source counts as many members as the heap found
//! ([`Scratch::close_old`]): a member the heap did not see, whose objects
//! the new member's copy could overwrite, keeps the group closed.

use crate::memory::layout::os_page;
use crate::memory::mesh::{Candidate, Positions, MAX_POSITIONS};
use crate::os::source::{map_table, unmap_table};
use core::mem::size_of;
use core::ptr::NonNull;

/// Candidates one class gives a pass at most.
pub(super) const MAX_CANDIDATES: usize = 4096;
/// Old groups one round loads at most (more are left closed).
const MAX_OLD: usize = MAX_CANDIDATES;
/// Slots of the table of old groups by address (a power of two, at least
/// twice [`MAX_OLD`]).
const OLD_SLOTS: usize = 2 * MAX_OLD;
/// The phase of an old group that takes no member.
const CLOSED: u32 = u32::MAX;
/// Open groups a candidate is tried against.
const PROBES: usize = 64;
/// No group.
pub(super) const NONE: u32 = u32::MAX;

/// A group being planned: its first member, the last one (members are
/// chained through `next`; `NONE` for an old group no candidate joined
/// yet), its phase and the union of live positions; once made, the member
/// that founded it and how many joined.
#[derive(Clone, Copy)]
pub(super) struct Group {
    pub(super) first: u32,
    last: u32,
    pub(super) members: u32,
    phase: u32,
    union: Positions,
    /// Made even with one member: it is a leader page's, between groups of
    /// that page that others join, and sharing it keeps the leader's run
    /// of group pages one kernel mapping.
    alone: bool,
    pub(super) founder: u32,
    pub(super) joined: u32,
    /// The address of the OS page that founded it (the source's key for
    /// the group), once founded; 0 before.
    pub(super) at: usize,
    /// Made by an earlier pass: it exists, with members not among the
    /// candidates, and `joined` counts the candidates that joined it.
    pub(super) old: bool,
    /// Of an old group: the groups its founder had founded when the group
    /// was loaded or made (`SharePages::foundings`; [`UNREAD`] before the
    /// first [`Scratch::close_old`] of a loaded one).
    founded: usize,
}

/// [`Group::founded`] not read yet.
const UNREAD: usize = usize::MAX;

impl Group {
    /// Whether the group is to be made (an old group counts its members
    /// loaded: with a candidate, two at least).
    pub(super) fn made(&self) -> bool {
        self.members >= 2 || self.alone
    }
}

/// A candidate's place in the plan.
#[derive(Clone, Copy)]
pub(super) struct Plan {
    pub(super) group: u32,
    pub(super) next: u32,
    /// Its slots were withheld for the group.
    pub(super) withheld: bool,
    /// It did not join (the kernel refused, or its group came to nothing).
    pub(super) failed: bool,
}

/// The scratch memory of one pass (anonymous, mapped per pass).
/// Candidates are pushed page by page, a page's in address order.
pub(super) struct Scratch {
    base: NonNull<u8>,
    bytes: usize,
    cands: *mut Candidate,
    plans: *mut Plan,
    /// First candidates of pages, in the order they are placed.
    order: *mut u32,
    groups: *mut Group,
    /// First candidates of leader pages.
    leaders: *mut u32,
    /// Old groups by address: index + 1 (0: empty), open addressing.
    old_slots: *mut u32,
    /// The old groups as they were before the round's placing (which adds
    /// members that may still fail), for [`Scratch::keep_made`].
    saved: *mut Group,
    /// Old groups, at the start of `groups`.
    pub(super) old: usize,
    /// The old group the next candidate placed on its own tries first.
    probe: usize,
    /// Room for the live byte ranges of one OS page.
    pub(super) ranges: *mut (usize, usize),
    /// Candidates pushed.
    pub(super) n: usize,
    /// A candidate was dropped since this was last cleared (no room).
    pub(super) overflowed: bool,
    pub(super) ngroups: usize,
    nleaders: usize,
    packing: Packing,
}

/// How a pass places one size class's candidates (see the module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Packing {
    /// Each OS page on its own.
    Free,
    /// By slab page; half of a page's OS pages may miss its leader's groups.
    Half,
    /// By slab page; a quarter may miss.
    Quarter,
    /// By slab page; one may miss.
    One,
    /// Whole slab pages only: two mappings a page at most.
    Whole,
}

impl Packing {
    /// The densest packing whose mappings for `n` candidates on `pages`
    /// slab pages fit in `share`.
    pub(super) fn choose(n: usize, pages: usize, share: usize) -> Packing {
        [Packing::Free, Packing::Half, Packing::Quarter, Packing::One]
            .into_iter()
            .find(|p| p.mappings(n, pages) <= share)
            .unwrap_or(Packing::Whole)
    }

    /// Kernel mappings a pass placing `n` candidates of `pages` slab pages
    /// this way adds at most (a page's ends, two per OS page off its run).
    fn mappings(self, n: usize, pages: usize) -> usize {
        match self {
            Packing::Free => 2 * n,
            Packing::Half => 2 * pages + n,
            Packing::Quarter => 2 * pages + n / 2,
            Packing::One => 4 * pages,
            Packing::Whole => 2 * pages,
        }
    }

    /// How many of a page's `n` candidates may miss its leader's groups.
    fn misses(self, n: u32) -> u32 {
        match self {
            Packing::Free | Packing::Half => n / 2,
            Packing::Quarter => n / 4,
            Packing::One => 1,
            Packing::Whole => 0,
        }
    }
}

impl Scratch {
    /// Maps the scratch memory of a pass.
    pub(super) fn map() -> Option<Scratch> {
        let parts = [
            MAX_CANDIDATES * size_of::<Candidate>(),
            MAX_CANDIDATES * size_of::<Plan>(),
            MAX_CANDIDATES * size_of::<u32>(),
            (MAX_OLD + MAX_CANDIDATES) * size_of::<Group>(),
            MAX_CANDIDATES * size_of::<u32>(),
            MAX_POSITIONS * size_of::<(usize, usize)>(),
            OLD_SLOTS * size_of::<u32>(),
            MAX_OLD * size_of::<Group>(),
        ];
        let mut offsets = [0; 8];
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
            leaders: p(4).cast(),
            ranges: p(5).cast(),
            old_slots: p(6).cast(),
            saved: p(7).cast(),
            old: 0,
            probe: 0,
            n: 0,
            overflowed: false,
            ngroups: 0,
            nleaders: 0,
            packing: Packing::Whole,
        })
    }

    /// Adds a candidate (page by page, a page's in `k` order);
    /// past the capacity it is dropped, and `overflowed` set.
    pub(super) fn push(&mut self, c: Candidate) {
        if self.n < MAX_CANDIDATES {
            // SAFETY: `n` is below the capacity mapped for candidates.
            unsafe { self.cands.add(self.n).write(c) };
            self.n += 1;
        } else {
            self.overflowed = true;
        }
    }

    pub(super) fn cand(&self, i: u32) -> &Candidate {
        // SAFETY: `i` < `n`, written by `push`.
        unsafe { &*self.cands.add(i as usize) }
    }

    pub(super) fn plan(&mut self, i: u32) -> &mut Plan {
        // SAFETY: `i` < `n`, written by `place`.
        unsafe { &mut *self.plans.add(i as usize) }
    }

    pub(super) fn group(&mut self, g: u32) -> &mut Group {
        // SAFETY: `g` < `ngroups`, written by `place`.
        unsafe { &mut *self.groups.add(g as usize) }
    }

    /// The end of the page whose candidates start at `i` (its last + 1).
    fn page_end(&self, i: u32) -> u32 {
        let page = self.cand(i).page;
        let mut e = i + 1;
        while (e as usize) < self.n && self.cand(e).page == page {
            e += 1;
        }
        e
    }

    /// Forgets the old groups (before they are loaded for a round).
    pub(super) fn clear_old(&mut self) {
        self.old = 0;
        self.probe = 0;
        // SAFETY: `OLD_SLOTS` entries mapped for the table.
        unsafe { core::ptr::write_bytes(self.old_slots, 0, OLD_SLOTS) };
    }

    /// Loads one member of the old group founded at `at`: `c.live` are
    /// the positions it may use. Members of a group with more old groups
    /// loaded than [`MAX_OLD`] are left out (that group stays closed).
    pub(super) fn add_old(&mut self, at: usize, c: &Candidate) {
        let mut h = (at / os_page()).wrapping_mul(0x9e37_79b9) % OLD_SLOTS;
        loop {
            // SAFETY: `h` < `OLD_SLOTS`.
            let slot = unsafe { &mut *self.old_slots.add(h) };
            if *slot == 0 {
                if self.old == MAX_OLD {
                    return;
                }
                let g = self.old;
                // SAFETY: below `MAX_OLD`, inside the groups' room.
                unsafe {
                    self.groups.add(g).write(Group {
                        first: NONE,
                        last: NONE,
                        members: 1,
                        phase: c.phase,
                        union: c.live,
                        alone: false,
                        founder: NONE,
                        joined: 0,
                        at,
                        old: true,
                        founded: UNREAD,
                    })
                };
                *slot = g as u32 + 1;
                self.old += 1;
                return;
            }
            let g = *slot - 1;
            if self.group(g).at == at {
                let group = self.group(g);
                if group.phase != c.phase {
                    group.phase = CLOSED;
                }
                group.union.union(&c.live);
                group.members += 1;
                return;
            }
            h = (h + 1) % OLD_SLOTS;
        }
    }

    /// Closes every old group whose member count (the page source's, the
    /// first of `source(at)`) is not the count loaded: a member not loaded
    /// could be overwritten by a new member's copy; or whose founder has
    /// founded another group since it was loaded or made (the second): the
    /// group ended and its key went to a new one, which may count as many
    /// members at other positions (another heap's pass may found it while
    /// this one's is paused). The first call after a load records the
    /// foundings.
    pub(super) fn close_old(&mut self, source: impl Fn(usize) -> (usize, usize)) {
        for g in 0..self.old as u32 {
            let group = self.group(g);
            let (members, founded) = source(group.at);
            if members != group.members as usize
                || group.founded != UNREAD && founded != group.founded
            {
                group.phase = CLOSED;
            } else {
                group.founded = founded;
            }
        }
    }

    /// After a round's groups were made (or given up): the groups that
    /// exist now become the old groups of the class's next round, as
    /// `load` of their members' pages would find them, without reading
    /// the class's pages again: each old group as it was loaded, with the
    /// candidates that joined it; each new group founded and not taken
    /// apart, with its members that joined. `owned(c)` is every position
    /// candidate `c`'s page may use on its OS page now that it joined (the
    /// page's, as `Page::meshed_positions` says), and `founded(at)` the
    /// source's foundings of a new group's founder. A group past
    /// [`MAX_OLD`] is left out (closed, as a load leaves it).
    pub(super) fn keep_made(
        &mut self,
        owned: impl Fn(&Candidate) -> Positions,
        founded: impl Fn(usize) -> usize,
    ) {
        for g in 0..self.old as u32 {
            // SAFETY: below `old`, saved by `place_all`.
            let mut kept = unsafe { self.saved.add(g as usize).read() };
            let mut m = self.group(g).first;
            while m != NONE {
                if self.joined(m) {
                    kept.union.union(&owned(self.cand(m)));
                    kept.members += 1;
                }
                m = self.plan(m).next;
            }
            *self.group(g) = kept;
        }
        let mut old = self.old;
        for g in self.old as u32..self.ngroups as u32 {
            let group = *self.group(g);
            if old == MAX_OLD || group.at == 0 || !group.made() || !self.joined(group.founder) {
                continue;
            }
            let mut kept = Group {
                first: NONE,
                last: NONE,
                members: 0,
                phase: group.phase,
                union: Positions::EMPTY,
                alone: false,
                founder: NONE,
                joined: 0,
                at: group.at,
                old: true,
                founded: founded(group.at),
            };
            let mut m = group.first;
            while m != NONE {
                if self.joined(m) {
                    kept.union.union(&owned(self.cand(m)));
                    kept.members += 1;
                }
                m = self.plan(m).next;
            }
            // At or below `g`: written after it was read.
            *self.group(old as u32) = kept;
            old += 1;
        }
        self.old = old;
        self.ngroups = old;
    }

    /// Whether candidate `m` joined its group: its slots were withheld
    /// for it and it did not fail (a round whose pages could not stop
    /// taking cached frees withheld nothing).
    fn joined(&mut self, m: u32) -> bool {
        let plan = *self.plan(m);
        plan.withheld && !plan.failed
    }

    /// The old group founded at `at`, if loaded: its members, positions,
    /// whether it is open, and its founder's foundings as kept.
    #[cfg(test)]
    pub(super) fn find_old(&mut self, at: usize) -> Option<(u32, Positions, bool, usize)> {
        (0..self.old as u32)
            .map(|g| *self.group(g))
            .find(|g| g.at == at)
            .map(|g| (g.members, g.union, g.phase != CLOSED, g.founded))
    }

    /// Slab pages pushed: the first candidate of each is written to
    /// `order`; every plan is cleared.
    fn index_pages(&mut self) -> usize {
        let mut pages = 0;
        let mut i = 0;
        while (i as usize) < self.n {
            // SAFETY: at most one page per candidate, below the capacity.
            unsafe { self.order.add(pages).write(i) };
            pages += 1;
            let end = self.page_end(i);
            for j in i..end {
                *self.plan(j) = Plan {
                    group: NONE,
                    next: NONE,
                    withheld: false,
                    failed: false,
                };
            }
            i = end;
        }
        pages
    }

    /// Slab pages among the candidates pushed.
    pub(super) fn pages(&self) -> usize {
        (1..self.n as u32)
            .filter(|&i| self.cand(i).page != self.cand(i - 1).page)
            .count()
            + usize::from(self.n > 0)
    }

    /// Places every candidate as `packing` says, in an order shuffled by a
    /// xorshift from `seed`.
    pub(super) fn place_all(&mut self, seed: u64, packing: Packing) {
        // SAFETY: `old` <= `MAX_OLD` groups, the room of both.
        unsafe { core::ptr::copy_nonoverlapping(self.groups, self.saved, self.old) };
        self.packing = packing;
        self.ngroups = self.old;
        self.nleaders = 0;
        let pages = self.index_pages();
        if packing == Packing::Free {
            for i in 0..self.n {
                // SAFETY: below the capacity.
                unsafe { self.order.add(i).write(i as u32) };
            }
            self.shuffle_order(self.n, seed);
            for k in 0..self.n {
                // SAFETY: below `n`.
                let i = unsafe { *self.order.add(k) };
                self.place(i);
            }
            return;
        }
        self.shuffle_order(pages, seed);
        for k in 0..pages {
            // SAFETY: below `pages`.
            let start = unsafe { *self.order.add(k) };
            self.place_page(start, self.page_end(start));
        }
        for l in 0..self.nleaders {
            // SAFETY: below `nleaders`.
            let start = unsafe { *self.leaders.add(l) };
            self.fill_holes(start);
        }
    }

    /// Shuffles `order[..len]` (a xorshift from `seed`).
    fn shuffle_order(&mut self, len: usize, mut seed: u64) {
        seed |= 1;
        for i in (1..len).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let j = (seed % (i as u64 + 1)) as usize;
            // SAFETY: both below `len`, at most the capacity.
            unsafe { core::ptr::swap(self.order.add(i), self.order.add(j)) };
        }
    }

    /// Makes the lone groups of the leader page whose candidates start at
    /// `start` that lie between groups of it others joined: left out, each
    /// would split the leader's run in three kernel mappings.
    fn fill_holes(&mut self, start: u32) {
        let end = self.page_end(start);
        let joined = |s: &mut Self, i: u32| {
            let g = s.plan(i).group;
            s.group(g).members >= 2
        };
        let Some(lo) = (start..end).find(|&i| joined(self, i)) else {
            return;
        };
        let hi = (start..end).rev().find(|&i| joined(self, i)).unwrap_or(lo);
        for i in lo..hi {
            let g = self.plan(i).group;
            if self.group(g).members == 1 {
                self.group(g).alone = true;
            }
        }
    }

    /// Places the candidates `start..end` of one page: with the leader
    /// whose groups take most of them at the same OS page indices (if the
    /// rest are few enough for the packing), the rest one by one; or, if
    /// no leader takes enough, as a new leader founding a group for each.
    fn place_page(&mut self, start: u32, end: u32) {
        let (leader, taken) = self.best_leader(start, end);
        if leader == NONE || taken + self.packing.misses(end - start) < end - start {
            for i in start..end {
                self.found(i);
            }
            // SAFETY: at most one leader per page, below the capacity.
            unsafe { self.leaders.add(self.nleaders).write(start) };
            self.nleaders += 1;
            return;
        }
        let lend = self.page_end(leader);
        let (mut i, mut j) = (start, leader);
        while i < end && j < lend {
            let (k, lk) = (self.cand(i).k, self.cand(j).k);
            if k == lk {
                let g = self.plan(j).group;
                if self.fits(g, i) {
                    self.add(g, i);
                }
            }
            if k <= lk {
                i += 1;
            }
            if lk <= k {
                j += 1;
            }
        }
        for i in start..end {
            if self.plan(i).group == NONE {
                self.place(i);
            }
        }
    }

    /// The leader page (its first candidate) among the last [`PROBES`]
    /// whose groups would take most of the candidates `start..end` at the
    /// same OS page indices, and how many; `NONE` if there is no leader.
    fn best_leader(&mut self, start: u32, end: u32) -> (u32, u32) {
        let mut best = (NONE, 0);
        let lowest = self.nleaders.saturating_sub(PROBES);
        for l in (lowest..self.nleaders).rev() {
            // SAFETY: below `nleaders`.
            let leader = unsafe { *self.leaders.add(l) };
            let lend = self.page_end(leader);
            let (mut i, mut j, mut taken) = (start, leader, 0);
            while i < end && j < lend {
                let (k, lk) = (self.cand(i).k, self.cand(j).k);
                if k == lk {
                    let g = self.plan(j).group;
                    taken += u32::from(self.fits(g, i));
                }
                if k <= lk {
                    i += 1;
                }
                if lk <= k {
                    j += 1;
                }
            }
            if best.0 == NONE || taken > best.1 {
                best = (leader, taken);
            }
            if taken == end - start {
                break;
            }
        }
        best
    }

    /// Whether candidate `i` may join group `g`: same phase, and none of
    /// its live positions taken.
    fn fits(&mut self, g: u32, i: u32) -> bool {
        let c = *self.cand(i);
        let group = self.group(g);
        group.phase == c.phase && group.union.disjoint(&c.live)
    }

    /// Adds candidate `i` to group `g` (as its last member).
    fn add(&mut self, g: u32, i: u32) {
        let live = self.cand(i).live;
        let group = self.group(g);
        group.union.union(&live);
        group.members += 1;
        let last = core::mem::replace(&mut group.last, i);
        if last == NONE {
            group.first = i;
        } else {
            self.plan(last).next = i;
        }
        self.plan(i).group = g;
    }

    /// Puts candidate `i` in the first old group of its phase it fits
    /// (trying [`PROBES`], from where the last candidate went), else the
    /// first recent new group, else a new one.
    fn place(&mut self, i: u32) {
        let tries = self.old.min(PROBES);
        for t in 0..tries {
            let g = (self.probe + t) % self.old;
            if self.fits(g as u32, i) {
                self.probe = g;
                self.add(g as u32, i);
                return;
            }
        }
        if self.old > 0 {
            self.probe = (self.probe + tries) % self.old;
        }
        let lowest = self.ngroups.saturating_sub(PROBES).max(self.old);
        for g in (lowest..self.ngroups).rev() {
            if self.fits(g as u32, i) {
                self.add(g as u32, i);
                return;
            }
        }
        self.found(i);
    }

    /// Starts a group with candidate `i` as its only member.
    fn found(&mut self, i: u32) {
        let c = *self.cand(i);
        let g = self.ngroups as u32;
        // SAFETY: at most `MAX_OLD` old groups, then one per candidate:
        // below the capacity.
        unsafe {
            self.groups.add(self.ngroups).write(Group {
                first: i,
                last: i,
                members: 1,
                phase: c.phase,
                union: c.live,
                alone: false,
                founder: NONE,
                joined: 0,
                at: 0,
                old: false,
                founded: UNREAD,
            })
        };
        self.ngroups += 1;
        self.plan(i).group = g;
    }

    /// Whether candidate `i` is planned into a group that is to be made.
    pub(super) fn planned(&mut self, i: u32) -> bool {
        let g = self.plan(i).group;
        g != NONE && self.group(g).made()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: mapped by `map`, no longer used.
        unsafe { unmap_table(self.base, self.bytes) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::page::Page;

    /// `pages` fake slab pages of 16 OS pages, one live slot (of 64) on
    /// each OS page at a random position. The page pointers only tell the
    /// pages apart: planning never follows them.
    fn sparse(s: &mut Scratch, pages: usize, mut seed: u64) {
        s.n = 0;
        for p in 0..pages {
            for k in 0..16 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let mut live = Positions::EMPTY;
                live.insert((seed % 64) as usize);
                s.push(Candidate {
                    page: (0x1000 * (p + 1)) as *mut Page,
                    k,
                    phase: 0,
                    live,
                });
            }
        }
    }

    /// (groups with members, OS pages placed off their leader's groups).
    fn shape(s: &mut Scratch) -> (usize, usize) {
        let groups = (0..s.ngroups as u32)
            .filter(|&g| s.group(g).members >= 2)
            .count();
        let mut off = 0;
        for i in 0..s.n as u32 {
            let g = s.plan(i).group;
            let first = s.group(g).first;
            // A member of a group founded at another index of its page, or
            // at the same index of a page that is not the leader of the
            // group its page's first OS page joined, costs mappings.
            let lead = s.plan(i - s.cand(i).k).group;
            let lead_first = s.group(lead).first;
            let lead_page = s.cand(lead_first).page;
            if s.cand(first).k != s.cand(i).k || s.cand(first).page != lead_page {
                off += 1;
            }
        }
        (groups, off)
    }

    #[test]
    #[cfg_attr(miri, ignore)] // maps its scratch memory
    fn packed_whole_pages_mesh_onto_a_leaders_groups() {
        let mut s = Scratch::map().unwrap();
        sparse(&mut s, 64, 0x5eed);
        s.place_all(7, Packing::Whole);
        let (groups, off) = shape(&mut s);
        assert_eq!(
            off, 0,
            "every OS page joins its leader's group at its index"
        );
        assert!(groups <= 64 * 16 / 3, "{groups} groups for 1024 OS pages");
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn looser_packings_are_denser_and_cost_more_mappings() {
        let mut s = Scratch::map().unwrap();
        let mut seen = Vec::new();
        for packing in [
            Packing::Whole,
            Packing::One,
            Packing::Quarter,
            Packing::Half,
            Packing::Free,
        ] {
            sparse(&mut s, 64, 0x5eed);
            s.place_all(7, packing);
            seen.push((packing, shape(&mut s)));
        }
        for w in seen.windows(2) {
            let ((a, (ga, oa)), (b, (gb, ob))) = (w[0], w[1]);
            assert!(gb < ga && ob > oa, "{a:?} -> {b:?}: {seen:?}");
        }
    }

    /// A candidate of its own fake page at OS page index 0.
    fn at(page: usize, positions: &[usize], phase: u32) -> Candidate {
        let mut live = Positions::EMPTY;
        for &j in positions {
            live.insert(j);
        }
        Candidate {
            page: page as *mut Page,
            k: 0,
            phase,
            live,
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)] // maps its scratch memory
    fn old_groups_take_candidates_that_meet_none_of_their_members_positions() {
        let mut s = Scratch::map().unwrap();
        let page = os_page();
        for seed in 1..8 {
            s.clear_old();
            // Old group 0: two members, at positions {1, 2} and {3}.
            s.add_old(page, &at(0x1000, &[1, 2], 0));
            s.add_old(page, &at(0x2000, &[3], 0));
            // Old group 1: one member loaded, but the source counts two.
            s.add_old(2 * page, &at(0x3000, &[9], 0));
            // Old group 2: members of two phases.
            s.add_old(3 * page, &at(0x4000, &[20], 0));
            s.add_old(3 * page, &at(0x5000, &[21], 16));
            // Old group 3: complete, one member.
            s.add_old(4 * page, &at(0x6000, &[30], 16));
            s.close_old(|at| (if at == 4 * page { 1 } else { 2 }, 0));
            assert_eq!(s.old, 4);
            s.n = 0;
            // Each meets group 0; would fit group 1 or 2 were they open;
            // meets the other.
            s.push(at(0x7000, &[2, 8], 0));
            s.push(at(0x8000, &[4], 0)); // fits group 0
            s.push(at(0x9000, &[5], 16)); // fits group 3 only
            s.push(at(0xa000, &[1, 8, 22], 0));
            s.place_all(seed, Packing::Free);
            let groups = [0, 1, 2, 3].map(|i| s.plan(i).group);
            assert_eq!(groups[1], 0, "seed {seed}");
            assert_eq!(groups[2], 3, "seed {seed}");
            assert!(groups[0] >= 4 && groups[3] >= 4, "seed {seed}: {groups:?}");
            assert!(s.planned(1) && s.planned(2) && !s.planned(0) && !s.planned(3));
            assert_eq!((s.group(0).first, s.group(0).members), (1, 3));
            assert_eq!((s.group(3).first, s.group(3).members), (2, 2));
        }
    }

    /// A kept group whose founder founded another group since (the first
    /// ended, and its key went to the new one) is closed though the new
    /// one counts as many members: they are not the members loaded, and
    /// their positions are not the ones kept.
    #[test]
    #[cfg_attr(miri, ignore)] // maps its scratch memory
    fn a_kept_group_whose_key_founded_another_since_is_closed() {
        let mut s = Scratch::map().unwrap();
        let page = os_page();
        s.clear_old();
        s.add_old(page, &at(0x1000, &[1], 0));
        s.add_old(page, &at(0x2000, &[2], 0));
        s.add_old(2 * page, &at(0x3000, &[1], 0));
        s.add_old(2 * page, &at(0x4000, &[2], 0));
        // Loaded: both founded once.
        s.close_old(|_| (2, 1));
        // After a pause: the group at `page` ended, and its key founded
        // another of two members; the other is as it was.
        s.close_old(|at| (2, if at == page { 2 } else { 1 }));
        s.n = 0;
        s.push(at(0x5000, &[3], 0));
        s.push(at(0x6000, &[4], 0));
        s.place_all(1, Packing::Free);
        let groups = [0, 1].map(|i| s.plan(i).group);
        assert!(!groups.contains(&0), "{groups:?}: joined the closed group");
        assert!(groups.contains(&1), "{groups:?}: the open group took none");
    }

    #[test]
    #[cfg_attr(miri, ignore)] // maps its scratch memory
    fn old_groups_are_found_again_when_their_addresses_collide() {
        let mut s = Scratch::map().unwrap();
        s.clear_old();
        // Every one of these addresses lands in the same slot of the table.
        let key = |i: usize| (i + 1) * OLD_SLOTS * os_page();
        for i in 0..100 {
            s.add_old(key(i), &at(0x1000, &[i % 7], 0));
        }
        for i in 0..100 {
            s.add_old(key(i), &at(0x2000, &[7 + i % 7], 0));
        }
        assert_eq!(s.old, 100);
        for g in 0..100u32 {
            let group = *s.group(g);
            assert_eq!((group.at, group.members), (key(g as usize), 2));
        }
        // Past `MAX_OLD` groups, the others are left out.
        s.clear_old();
        for i in 0..MAX_OLD + 10 {
            s.add_old((i + 1) * os_page(), &at(0x1000, &[0], 0));
        }
        assert_eq!(s.old, MAX_OLD);
    }

    #[test]
    #[cfg_attr(miri, ignore)] // maps its scratch memory
    fn a_candidate_that_fits_none_of_the_probed_old_groups_moves_the_probe_on() {
        let mut s = Scratch::map().unwrap();
        s.clear_old();
        // 100 old groups: the first 64 hold position 5, the others not.
        for g in 0..100 {
            let taken: &[usize] = if g < PROBES { &[5] } else { &[6] };
            s.add_old((g + 1) * os_page(), &at(0x1000 * (g + 1), taken, 0));
        }
        s.close_old(|_| (1, 0));
        s.n = 0;
        s.push(at(0x100_0000, &[5], 0));
        s.push(at(0x200_0000, &[5], 0));
        s.place_all(3, Packing::Free);
        // The first placed tries groups 0-63 and founds a new one; the
        // second starts where those tries ended, and joins group 64.
        let mut groups = [s.plan(0).group, s.plan(1).group];
        groups.sort();
        assert_eq!(groups, [PROBES as u32, 100], "{groups:?}");
    }

    #[test]
    fn the_densest_packing_that_fits_the_share_is_chosen() {
        // 4,096 candidates on 256 slab pages.
        let at = |share| Packing::choose(4096, 256, share);
        assert_eq!(
            [
                at(usize::MAX),
                at(8192),
                at(8191),
                at(4608),
                at(2560),
                at(1024),
                at(0)
            ],
            [
                Packing::Free,
                Packing::Free,
                Packing::Half,
                Packing::Half,
                Packing::Quarter,
                Packing::One,
                Packing::Whole
            ]
        );
        assert_eq!(
            (Packing::Half.misses(16), Packing::Quarter.misses(16)),
            (8, 4)
        );
    }
}
