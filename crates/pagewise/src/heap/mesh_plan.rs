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

use crate::memory::layout::os_page;
use crate::memory::mesh::{Candidate, Positions, MAX_POSITIONS};
use crate::os::source::{map_table, unmap_table};
use core::mem::size_of;
use core::ptr::NonNull;

/// Candidates one class gives a pass at most.
pub(super) const MAX_CANDIDATES: usize = 4096;
/// Open groups a candidate is tried against.
const PROBES: usize = 64;
/// No group.
pub(super) const NONE: u32 = u32::MAX;

/// A group being planned: its first member, the last one (members are
/// chained through `next`), its phase and the union of live positions;
/// once made, the member that founded it and how many joined.
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
}

impl Group {
    /// Whether the group is to be made.
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
    /// Room for the live byte ranges of one OS page.
    pub(super) ranges: *mut (usize, usize),
    /// Candidates pushed.
    pub(super) n: usize,
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
            MAX_CANDIDATES * size_of::<Group>(),
            MAX_CANDIDATES * size_of::<u32>(),
            MAX_POSITIONS * size_of::<(usize, usize)>(),
        ];
        let mut offsets = [0; 6];
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
            n: 0,
            ngroups: 0,
            nleaders: 0,
            packing: Packing::Whole,
        })
    }

    /// Adds a candidate (page by page, a page's in `k` order);
    /// past the capacity it is dropped.
    pub(super) fn push(&mut self, c: Candidate) {
        if self.n < MAX_CANDIDATES {
            // SAFETY: `n` is below the capacity mapped for candidates.
            unsafe { self.cands.add(self.n).write(c) };
            self.n += 1;
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
        self.packing = packing;
        self.ngroups = 0;
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
        self.plan(last).next = i;
        self.plan(i).group = g;
    }

    /// Puts candidate `i` in the first recent group of its phase it fits,
    /// or a new one.
    fn place(&mut self, i: u32) {
        let lowest = self.ngroups.saturating_sub(PROBES);
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
        // SAFETY: at most one group per candidate, below the capacity.
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
