//! Which OS pages mesh, and when: the policy over `memory/mesh.rs` (which
//! slots a meshed page may use) and the page source's `SharePages` (which
//! virtual pages show which physical page). docs/design.md, "Meshing".
//!
//! A pass, run by the heap's owner with its page lists held:
//! 1. meshed OS pages on which nothing is in use any more leave their
//!    groups and become hollow;
//! 2. per size class, the sparse OS pages of the pages out of use are
//!    gathered (`Page::mesh_candidates`) and grouped (`heap/mesh_plan.rs`),
//!    as densely as the class's share of the kernel mapping budget allows:
//!    left over is split between classes by their candidates, half kept for
//!    later passes; groups made before (found through every meshed OS page
//!    of the class's pages, the full ones too) take new members where
//!    none of the positions their members may use is met;
//! 3. every group of two members or more is made: a planned OS page in a
//!    region advised huge takes the advice back (as a purge does); the
//!    groups are made in chunks of consecutive groups ([`CHUNK_JOINS`]
//!    candidates): the pages' slots on a chunk's planned OS pages are
//!    withheld first (their free list runs through memory that is about
//!    to show another page's bytes), then the founders' pages are shared
//!    and the others join page by page, each page's OS pages in address
//!    order (so a run's kernel mappings merge as it grows), copying their
//!    live slots; a member the kernel refuses gets its slots back. Between
//!    two chunks a thread waiting for the page lists has them: the chunks
//!    not begun, nothing withheld for them, are given up and the class is
//!    planned again after the pause.

use super::hollow::Hollow;
use super::mesh_plan::{Packing, Scratch, MAX_CANDIDATES, NONE};
use super::*;
use crate::memory::mesh::{Candidate, Withheld, MAX_POSITIONS};
use crate::os::source::{map_table, unmap_table, Leave, SharePages};
use crate::sync::lock::Guard;
use core::mem::size_of;
use core::ptr::NonNull;

/// Which pages a mesh pass may group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MeshWhen {
    /// Every sparse page that is no thread's current page (`mesh()`).
    Now,
    /// The background pass at this time (the source's clock): nothing
    /// while the heap has taken a new slab page within a decay period, and
    /// then only pages out of use for a decay period.
    IfQuiet(u64),
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

/// The locks a mesh pass's caller took before the heap's page lists,
/// which the pass lets go with them between two chunks of a round while another
/// thread waits for one of them.
pub(crate) trait Outer {
    /// Whether a thread waits for one of them.
    fn wanted(&self) -> bool;
    /// Lets them go (the page lists already are).
    fn let_go(&self);
    /// Takes them again, in the order they were taken.
    fn take_again(&self);
}

/// A pass that holds nothing but the page lists (an owner's).
pub(crate) struct HeldAlone;

impl Outer for HeldAlone {
    fn wanted(&self) -> bool {
        false
    }
    fn let_go(&self) {}
    fn take_again(&self) {}
}

/// Whether a mesh pass over the heap is under way, kept with the page
/// lists. A pass lets the lists go between two rounds for a thread that
/// waits for them ([`HeapCore::pause`]), and keeps across the pause the
/// old groups it loaded, checked against the source again only by their
/// member counts ([`Scratch::close_old`]). Another pass over the heap in
/// that pause (the purger's beside a `mesh()` call) could make members of
/// a group leave and others join it, its count unchanged and its positions
/// no longer those kept: the paused pass would then plan a candidate onto
/// a position a member uses, and the group page would hold two objects at
/// one address. So a pass that finds one under way leaves the heap to it.
pub(crate) struct PassUnderWay(bool);

impl PassUnderWay {
    pub(crate) const NONE: PassUnderWay = PassUnderWay(false);

    /// Marks a pass begun; false if one is under way already.
    fn begin(&mut self) -> bool {
        !core::mem::replace(&mut self.0, true)
    }

    fn end(&mut self) {
        self.0 = false;
    }
}

/// Members of the groups a pass makes at a time (a chunk of a round):
/// their slots are withheld, the groups made and the failures given back
/// before the next chunk's slots are withheld, and between two chunks a
/// thread that waits for the page lists has them. It waits behind one
/// chunk's copies and one group's, not a round's 4,096, and the chunks not
/// begun have nothing to give back.
const CHUNK_JOINS: usize = MAX_CANDIDATES / 16;

#[cfg(test)]
std::thread_local! {
    /// Candidates `gather` read on this thread (tests count the work a
    /// waiting thread waits behind).
    static GATHERED: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
    /// Candidates the pass's count read on this thread.
    static COUNTED: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
    /// Slab pages whose groups `load_old_groups` read on this thread.
    static LOADED: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

/// Times a pass let the page lists go for a waiting thread, process-wide.
static PAUSES: AtomicU64 = AtomicU64::new(0);

/// Mesh passes that made pages stop taking cached frees to mesh them,
/// process-wide: counted after the pages' slab words changed and before
/// the threads pass the barrier, so before any OS page is remapped.
static BEGUN: AtomicUsize = AtomicUsize::new(0);

/// [`BEGUN`] as of now, read before a page's slab word: a later read of
/// it through [`none_begun_since`] says whether a pass may have remapped
/// the page's OS pages meanwhile.
#[cfg(feature = "secure")]
#[inline(always)]
pub(crate) fn passes_begun() -> usize {
    BEGUN.load(Acquire)
}

/// Whether no mesh pass began since [`passes_begun`] said `begun`. A
/// reader of the page's memory between the two (the hardened free's check
/// of the word before a slot) read it on the page's own memory, never on
/// a group page, if so: a pass that remapped the OS page the read saw
/// counted itself and then made every thread pass a barrier before the
/// remap, so the read of the count after it sees that pass (the pairing
/// of `sync/asymmetric.rs`); and a pass counted before `begun` was read
/// had made the page uncacheable, which the slab word the reader read
/// after `begun` would have said (the page is cacheable again only once
/// no OS page of it is meshed, and not before the round that closed it
/// ends: `Page::end_mesh_round`).
#[cfg(feature = "secure")]
#[inline(always)]
pub(crate) fn none_begun_since(begun: usize) -> bool {
    crate::sync::asymmetric::light();
    BEGUN.load(Relaxed) == begun
}

/// [`PAUSES`] (`Stats::mesh_pauses`; meshing is Linux's).
#[cfg(target_os = "linux")]
pub(crate) fn pauses() -> u64 {
    PAUSES.load(Relaxed)
}

impl HeapCore {
    /// Empties the caches, releases empty pages and hollows the others
    /// (as `trim()` does to the pages), then makes a mesh pass, then
    /// hollows again (a meshed OS page withholds the free slots reaching
    /// into its neighbours, which may leave those all free or withheld).
    /// Returns the OS pages that joined groups.
    ///
    /// # Safety
    /// Owner only; as [`HeapCore::mesh_pass`] for writers.
    pub unsafe fn mesh(&self) -> usize {
        // SAFETY: per the caller.
        unsafe { self.mesh_holding(&HeldAlone) }
    }

    /// [`HeapCore::mesh`], its pass letting go of the page lists and what
    /// `outer` holds for a thread that waits for them.
    ///
    /// # Safety
    /// As [`HeapCore::mesh`].
    unsafe fn mesh_holding(&self, outer: &dyn Outer) -> usize {
        let mut l = self.lock_local();
        // SAFETY: owner (caller), with the page lists held.
        unsafe {
            self.flush_caches(&mut l);
            self.release_empty_pages(&mut l, Access::Owner, Hollow::Now);
            let joined = self.mesh_pass(&mut l, MeshWhen::Now, outer);
            self.release_empty_pages(&mut l, Access::Owner, Hollow::Now);
            joined
        }
    }

    /// What the background purger does to a quiet heap, by the source's
    /// clock: releases empty pages, hollows those out of use for a decay
    /// period, then a mesh pass over the pages out of use for a decay
    /// period if the heap has taken no new slab page for one
    /// ([`MeshWhen::IfQuiet`]). Returns the OS pages that joined groups.
    ///
    /// # Safety
    /// Owner only; as [`HeapCore::mesh_pass`] for writers.
    pub unsafe fn mesh_if_quiet(&self) -> usize {
        let mut l = self.lock_local();
        let now = self.source().now_ms();
        // SAFETY: owner (caller), with the page lists held.
        unsafe {
            self.flush_caches(&mut l);
            self.release_empty_pages(&mut l, Access::Owner, Hollow::IfStale(now));
            self.mesh_pass(&mut l, MeshWhen::IfQuiet(now), &HeldAlone)
        }
    }

    /// In a forked child: no pass is under way (one paused in the parent
    /// when the fork took the page lists has no thread here to end it).
    pub(crate) fn forget_mesh_pass_after_fork(&self) {
        self.lock_local().mesh_pass.end();
    }

    /// Unmaps the withheld-slot records (the heap is going away).
    pub(crate) fn unmap_mesh_records(&self) {
        self.lock_local().records.unmap_all();
    }

    /// One mesh pass (see the module) over the pages `when` allows, unless
    /// a pass over the heap is under way already ([`PassUnderWay`]).
    /// Returns the OS pages that joined groups.
    ///
    /// # Safety
    /// The page lists are held (by the owner or a visitor); no thread
    /// writes to memory of this heap during the call (a store to a page
    /// being copied would be lost) unless the write barrier's handler is
    /// installed (`os/barrier.rs`), which makes such a store wait.
    pub(crate) unsafe fn mesh_pass(
        &self,
        l: &mut Guard<'_, Local>,
        when: MeshWhen,
        outer: &dyn Outer,
    ) -> usize {
        let Some(sharing) = self.source().sharing() else {
            return 0;
        };
        if !l.mesh_pass.begin() {
            return 0;
        }
        // While it copies under the barrier, this thread runs no handler of
        // the program: one that stored into a page being copied would wait
        // for this very copy (`os/signals.rs`).
        #[cfg(target_os = "linux")]
        let mask = crate::os::barrier::installed().then(crate::os::signals::block_async);
        // The source may read what it checks before each copy once here.
        sharing.begin_pass();
        // SAFETY: per the caller.
        let joined = unsafe { self.mesh_classes(l, sharing, when, outer) };
        sharing.end_pass();
        #[cfg(target_os = "linux")]
        if let Some(mask) = mask {
            crate::os::signals::restore(mask);
        }
        l.mesh_pass.end();
        joined
    }

    /// Whether the heap has taken no new slab page for a decay period as of
    /// `now`: a heap still growing is running a phase whose sparse pages it
    /// will fill again, and a meshed page's free slots are withheld, so
    /// meshing it now would send its next allocations to fresh pages (a
    /// higher peak) and spend the mapping budget on groups that are not
    /// the program's last state.
    fn quiet_since_growing(&self, now: u64) -> bool {
        now >= self
            .slab_grown_at
            .get()
            .saturating_add(self.config.decay_ms())
    }

    /// Whether a pass `when` may group page `p` (not a current page; for a
    /// background pass, out of use for a decay period).
    ///
    /// # Safety
    /// A slab page of this heap, with the page lists held.
    unsafe fn may_mesh(&self, p: *mut Page, current: *mut Page, when: MeshWhen) -> bool {
        p != current
            && match when {
                MeshWhen::Now => true,
                // SAFETY: per the caller.
                MeshWhen::IfQuiet(now) => self.out_of_use_long_enough(unsafe { &mut *p }, now),
            }
    }

    /// [`HeapCore::mesh_pass`] with the source's sharing. Every class's
    /// candidates are planned in rounds of as many as the scratch holds
    /// until none is left: what a pass meshes is paced by what there is to
    /// gain and the mapping budget, not by the scratch memory's size.
    ///
    /// # Safety
    /// As [`HeapCore::mesh_pass`].
    unsafe fn mesh_classes(
        &self,
        l: &mut Guard<'_, Local>,
        sharing: &dyn SharePages,
        when: MeshWhen,
        outer: &dyn Outer,
    ) -> usize {
        // SAFETY: per the caller.
        unsafe { self.leave_unused_groups(l, sharing) };
        if let MeshWhen::IfQuiet(now) = when {
            if !self.quiet_since_growing(now) {
                return 0;
            }
        }
        let Some(mut scratch) = Scratch::map() else {
            return 0;
        };
        let wanted = || self.lists_wanted() || outer.wanted();
        let mut counts = [0usize; CLASSES];
        // SAFETY: per the caller.
        unsafe { self.count_candidates(l, when, &mut counts, &wanted, outer) };
        let total: usize = counts.iter().sum();
        let mut joined = 0;
        for (class, &count) in counts.iter().enumerate() {
            // One candidate meshes only with an old group.
            if count == 0 {
                continue;
            }
            // The class's share of what is left of the budget, by its
            // candidates, half kept for later passes; each round takes its
            // part of it by the candidates it plans.
            let (used, cap) = sharing.seam_budget();
            let class_share =
                (cap.saturating_sub(used) / 2) as u128 * count as u128 / total.max(1) as u128;
            let mut from = l.queues[class].head;
            let mut round = 0u64;
            // The class's groups are loaded once, at its first round with
            // candidates; each round adds those it made
            // (`Scratch::keep_made`), so a start over after a pause reads
            // none of the class's pages again, and plans with the same
            // groups as a pass no thread waited on.
            let mut loaded = false;
            let mut paused = false;
            // Candidates a round gathers at most: after a pause, a chunk's,
            // doubled by each round after it that no thread waited on (a
            // thread that waited once likely waits again: a round of 4,096
            // would be read and planned to make one chunk of it, the rest
            // given up and read again).
            let mut most = MAX_CANDIDATES;
            while !from.is_null() {
                // SAFETY: per the caller.
                from = unsafe { self.gather(class, from, when, &mut scratch, most, &wanted) };
                if scratch.n == 0 {
                    continue;
                }
                if !loaded {
                    // SAFETY: per the caller.
                    unsafe { self.load_old_groups(l, class, sharing, &mut scratch) };
                    loaded = true;
                } else if paused {
                    // A page released meanwhile left its groups: a group
                    // whose count changed stays closed for the pass (its
                    // positions loaded are still all its members may use:
                    // a meshed OS page's only shrink while it is meshed).
                    scratch.close_old(|at| (sharing.members(at), sharing.foundings(at)));
                }
                paused = false;
                if scratch.n < 2 && scratch.old == 0 {
                    continue;
                }
                // No more than what is left of the class's share: a class
                // that starts over after a pause plans its candidates again.
                let spent = sharing.seam_budget().0.saturating_sub(used) as u128;
                let share = (class_share * scratch.n as u128 / count as u128)
                    .min(class_share.saturating_sub(spent));
                let packing = Packing::choose(scratch.n, scratch.pages(), share as usize);
                round += 1;
                scratch.place_all(
                    self.source().now_ms()
                        ^ (class as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
                        ^ round.wrapping_mul(0xbf58_476d_1ce4_e5b9),
                    packing,
                );
                // SAFETY: per the caller.
                let made = unsafe { self.make_groups(l, &mut scratch, sharing, &wanted) };
                joined += made;
                // SAFETY: the candidates' pages are slab pages of this heap,
                // with the page lists held.
                scratch.keep_made(
                    |c| unsafe { (*c.page).owned_on(c.k as usize) },
                    |at| sharing.foundings(at),
                );
                #[cfg(test)]
                // SAFETY: per the caller.
                unsafe {
                    self.check_kept(l, class, sharing, &mut scratch)
                };
                if !wanted() {
                    most = (most * 2).min(MAX_CANDIDATES);
                } else {
                    // A thread of the program waits for the page lists (a
                    // slow path of its allocations) or for what the pass
                    // holds around them (a fork): it has them now, after
                    // the chunk of the round being made (the chunks not
                    // begun are given up), not after the whole pass.
                    self.pause(l, outer);
                    paused = true;
                    most = CHUNK_JOINS;
                    if made == 0 {
                        // Nothing meshed in this round: the rest of the
                        // class waits for the next pass (each start over
                        // follows a round that meshed, so they end).
                        break;
                    }
                    // The queue may have changed meanwhile: the class
                    // starts over (what meshed is no candidate any more;
                    // the groups given up are planned again, with those
                    // made as old groups they may join).
                    from = l.queues[class].head;
                }
            }
        }
        joined
    }

    /// Lets the page lists, and what `outer` holds, go until no thread waits
    /// for them (see [`Outer`]), then takes them again.
    fn pause(&self, l: &mut Guard<'_, Local>, outer: &dyn Outer) {
        PAUSES.fetch_add(1, Relaxed);
        l.pause(|| {
            outer.let_go();
            let mut spins = 0u32;
            while self.lists_wanted() || outer.wanted() {
                spins += 1;
                if spins < 64 {
                    core::hint::spin_loop();
                } else {
                    crate::sync::lock::yield_now();
                }
            }
            outer.take_again();
        });
    }

    /// Counts every class's candidates a pass `when` may group into
    /// `counts` (how the pass splits the mapping budget between classes),
    /// page by page. Once it has read a chunk's candidates ([`CHUNK_JOINS`])
    /// since the page lists were last let go, a thread `wanted` says waits
    /// for them has them after the page being read; the count then goes on
    /// in the same class past as many of its queue's pages as it had seen
    /// (followed by their links, not read again). The queue may have
    /// changed meanwhile, which only makes the count an estimate, as the
    /// counts are of pages that change anyway before their rounds.
    ///
    /// # Safety
    /// As [`HeapCore::mesh_pass`].
    unsafe fn count_candidates(
        &self,
        l: &mut Guard<'_, Local>,
        when: MeshWhen,
        counts: &mut [usize; CLASSES],
        wanted: &dyn Fn() -> bool,
        outer: &dyn Outer,
    ) {
        let mut read = 0usize;
        for (class, n) in counts.iter_mut().enumerate() {
            let mut seen = 0usize;
            'again: loop {
                let current = self.current_page(class);
                let mut p = l.queues[class].head;
                let mut at = 0usize;
                while !p.is_null() {
                    // SAFETY: queue entries are slab pages of this heap, with
                    // the page lists held; the current page is left alone.
                    unsafe {
                        if at >= seen && self.may_mesh(p, current, when) {
                            let before = read;
                            (*p).mesh_candidates(|_| read += 1);
                            *n += read - before;
                            #[cfg(test)]
                            COUNTED.with(|c| c.set(c.get() + read - before));
                        }
                        p = (*p).next;
                    }
                    at += 1;
                    if at > seen && read >= CHUNK_JOINS && wanted() {
                        self.pause(l, outer);
                        read = 0;
                        seen = at;
                        continue 'again;
                    }
                }
                break;
            }
        }
    }

    /// Fills `s` (emptied first) with the candidates of `class`'s pages
    /// from `from` on, whole pages only, as many as it holds or up to
    /// `most` (the page that reaches it included), or, once it
    /// holds a chunk's ([`CHUNK_JOINS`]), as many as it has when `wanted`
    /// says a thread waits for the page lists (reading the pages' free
    /// lists is most of a round's planning: the waiter then waits for
    /// that of a chunk, and one chunk made). Returns the page to go on
    /// from (null: the queue's end).
    ///
    /// # Safety
    /// As [`HeapCore::mesh_pass`]; `from` is on `class`'s queue.
    unsafe fn gather(
        &self,
        class: usize,
        from: *mut Page,
        when: MeshWhen,
        s: &mut Scratch,
        most: usize,
        wanted: &dyn Fn() -> bool,
    ) -> *mut Page {
        s.n = 0;
        s.overflowed = false;
        let current = self.current_page(class);
        let mut p = from;
        while !p.is_null() {
            // SAFETY: as in `candidates`.
            unsafe {
                if self.may_mesh(p, current, when) {
                    let before = s.n;
                    (*p).mesh_candidates(|c| s.push(c));
                    if s.overflowed && before > 0 {
                        // This page's candidates go into the next round.
                        s.n = before;
                        s.overflowed = false;
                        return p;
                    }
                    s.overflowed = false;
                    #[cfg(test)]
                    GATHERED.with(|g| g.set(g.get() + s.n - before));
                }
                p = (*p).next;
                if s.n >= most || s.n >= CHUNK_JOINS && wanted() {
                    return p;
                }
            }
        }
        null_mut()
    }

    /// Loads the groups `class`'s meshed OS pages are members of into `s`
    /// as old groups, with every position their members may use, from
    /// every page of the class (on its queue or the full list; the current
    /// page is on its queue); a group with a member elsewhere (a page of
    /// another heap) stays closed.
    ///
    /// # Safety
    /// As [`HeapCore::mesh_pass`].
    unsafe fn load_old_groups(
        &self,
        l: &Local,
        class: usize,
        sharing: &dyn SharePages,
        s: &mut Scratch,
    ) {
        s.clear_old();
        let mut load = |p: *mut Page| {
            #[cfg(test)]
            LOADED.with(|n| n.set(n.get() + 1));
            // SAFETY: a slab page of this heap, with the page lists held.
            unsafe {
                (*p).meshed_positions(|c| {
                    if let Some(at) = sharing.group_of(c.addr()) {
                        s.add_old(at, &c);
                    }
                })
            };
        };
        for queue in [&l.queues[class], &l.full] {
            let mut p = queue.head;
            while !p.is_null() {
                // SAFETY: queue entries are slab pages of this heap, with
                // the page lists held.
                unsafe {
                    if (*p).class as usize == class && (*p).meshed_pages() > 0 {
                        load(p);
                    }
                    p = (*p).next;
                }
            }
        }
        s.close_old(|at| (sharing.members(at), sharing.foundings(at)));
    }

    /// Checks that the old groups `s` kept over a round are those a load
    /// finds, as far as they matter: each open one has as many members,
    /// and its positions take in all of theirs (tests only).
    ///
    /// # Safety
    /// As [`HeapCore::mesh_pass`].
    #[cfg(test)]
    unsafe fn check_kept(
        &self,
        l: &Local,
        class: usize,
        sharing: &dyn SharePages,
        s: &mut Scratch,
    ) {
        let Some(mut fresh) = Scratch::map() else {
            return;
        };
        let loaded = LOADED.with(core::cell::Cell::get);
        // SAFETY: per the caller.
        unsafe { self.load_old_groups(l, class, sharing, &mut fresh) };
        LOADED.with(|n| n.set(loaded));
        for g in 0..s.old as u32 {
            let at = s.group(g).at;
            let (members, union, open, founded) = s.find_old(at).unwrap();
            if !open {
                continue;
            }
            let (m, u, _, _) = fresh.find_old(at).expect("a kept group exists");
            assert_eq!(members, m, "members of the group at {at:#x}");
            assert_eq!(
                founded,
                sharing.foundings(at),
                "foundings kept for the group at {at:#x}"
            );
            assert!(
                (0..MAX_POSITIONS).all(|j| !u.contains(j) || union.contains(j)),
                "a position of the group at {at:#x} not kept"
            );
        }
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
                        let left = (*p).leave_unused_meshed(|a| sharing.leave(a, Leave::Unused));
                        let bytes = left as u64 * os_page() as u64;
                        self.slab_committed.sub(bytes);
                        self.budget().uncharge(bytes as usize);
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
        wanted: &dyn Fn() -> bool,
    ) -> usize {
        // 0. Frees of the planned pages' slots stop going into thread
        //    caches, and every thread passes a barrier, before their free
        //    lists are checked: a cached free under way that read a page as
        //    cacheable has stored its key where the check finds it, or sees
        //    the change and frees past the cache, where a withheld slot is
        //    caught (`memory/cache_handshake.rs`).
        if !self.stop_caching_planned(s) {
            return 0;
        }
        // 1-3, chunk by chunk of consecutive groups (a leader's groups are
        //    consecutive), each of about `CHUNK_JOINS` members: nothing is
        //    withheld for a chunk before the one before it is made and its
        //    failures given back, so after each chunk a thread `wanted`
        //    says waits for the lists gets them with nothing to give back:
        //    the chunks not begun are given up (planned again after the
        //    pause, when the pages may have changed).
        let mut joined = 0;
        let mut g0 = 0u32;
        while (g0 as usize) < s.ngroups {
            let mut g1 = g0;
            let mut members = 0u32;
            while (g1 as usize) < s.ngroups && members < CHUNK_JOINS as u32 {
                // The candidates it takes (an old group counts members
                // of earlier passes too, which copy nothing now).
                if s.group(g1).made() {
                    let mut m = s.group(g1).first;
                    while m != NONE {
                        members += 1;
                        m = s.plan(m).next;
                    }
                }
                g1 += 1;
            }
            // SAFETY: per the caller.
            joined += unsafe { self.make_chunk(l, s, sharing, g0..g1) };
            g0 = g1;
            if (g0 as usize) < s.ngroups && wanted() {
                give_up_from(s, g0);
                break;
            }
        }
        // 4. The pages take cached frees again if nothing else keeps them
        //    from it (a meshed OS page's withheld slots do).
        end_mesh_rounds(s);
        joined
    }

    /// Makes the planned groups `chunk` of `s` (see `make_groups`).
    /// Returns the OS pages that joined.
    ///
    /// # Safety
    /// As `make_groups`, whose step 0 ran for these groups.
    unsafe fn make_chunk(
        &self,
        l: &mut Local,
        s: &mut Scratch,
        sharing: &dyn SharePages,
        chunk: core::ops::Range<u32>,
    ) -> usize {
        let ours = |s: &mut Scratch, i: u32| s.planned(i) && chunk.contains(&s.plan(i).group);
        // 0b. A planned OS page in a region advised huge takes the advice
        //    back first, as a purge does: its huge page splits (counted),
        //    and the kernel's background collapse leaves the region to
        //    small pages. Refused, the page does not mesh.
        for i in 0..s.n as u32 {
            if ours(s, i) && !s.plan(i).failed && !self.unadvise(s.cand(i).addr()) {
                s.plan(i).failed = true;
            }
        }
        // 1. Withhold the slots on the chunk's planned OS pages, page by
        //    page (the candidates of a page are consecutive).
        let mut i = 0;
        while i < s.n as u32 {
            let page = s.cand(i).page;
            let mut end = i;
            let mut planned = 0;
            while end < s.n as u32 && s.cand(end).page == page {
                if ours(s, end) && !s.plan(end).failed {
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
                        if ours(s, j) && !s.plan(j).failed {
                            mark_meshed(s.cand(j), false);
                            s.plan(j).failed = true;
                        }
                    }
                } else {
                    // SAFETY: per the caller; the record is the page's.
                    unsafe { (*page).withhold_meshed(planned, record) };
                    for j in i..end {
                        if ours(s, j) && !s.plan(j).failed {
                            s.plan(j).withheld = true;
                        }
                    }
                }
            }
            i = end;
        }
        // 2. Found the groups, then join their members page by page, each
        //    page's in address order (a run of pages joining a leader's
        //    groups merges into one kernel mapping as it goes), each copy
        //    under the barrier (other threads' stores to a page being
        //    copied wait); groups no member joined go back to their
        //    founders.
        for g in chunk.clone() {
            if s.group(g).made() && !s.group(g).old {
                // SAFETY: per the caller.
                unsafe { found_group(s, g, sharing) };
            }
        }
        for i in 0..s.n as u32 {
            if ours(s, i) && !s.plan(i).failed {
                // SAFETY: per the caller.
                unsafe { join_group(s, i, sharing) };
            }
        }
        let mut joined = 0;
        for g in chunk.clone() {
            if s.group(g).at != 0 {
                // SAFETY: per the caller.
                joined += unsafe { end_lone_group(s, g, sharing) };
            }
        }
        // 3. Pages whose planned OS pages of the chunk did not all join get
        //    the slots withheld for them back.
        let mut i = 0;
        while i < s.n as u32 {
            let page = s.cand(i).page;
            let mut failed = 0;
            while i < s.n as u32 && s.cand(i).page == page {
                failed += u32::from(ours(s, i) && s.plan(i).failed && s.plan(i).withheld);
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

    /// Takes the huge-page advice back from the region the OS page at
    /// `addr` (of a slab page of this heap) lies in, if it has it
    /// (`memory/huge_pages.rs`); false if the kernel refused.
    fn unadvise(&self, addr: usize) -> bool {
        // SAFETY: a slab page lies in a registered, mapped segment.
        let seg = unsafe { &*Segment::of(crate::memory::layout::segment_base(addr)) };
        crate::memory::huge_pages::before_purge(
            self.source(),
            &self.budget().huge,
            seg,
            addr,
            crate::memory::layout::os_page(),
        )
    }

    /// Makes every page with a planned OS page stop taking cached frees,
    /// then serializes the threads (see `make_groups`). False if the
    /// source could not: the pages are as they were and nothing meshes.
    fn stop_caching_planned(&self, s: &mut Scratch) -> bool {
        let mut any = false;
        for i in 0..s.n as u32 {
            if s.planned(i) {
                // SAFETY: a slab page of this heap (the caller's candidates),
                // page lists held.
                unsafe { (*s.cand(i).page).begin_mesh_round() };
                any = true;
            }
        }
        if !any {
            return true;
        }
        // After the words (release: a reader that sees the count sees
        // them), before the barrier (`none_begun_since`).
        BEGUN.fetch_add(1, Release);
        if self.source().serialize_threads() {
            self.spare_announced(s);
            return true;
        }
        end_mesh_rounds(s);
        false
    }

    /// Leaves out of the pass every planned OS page on which a thread has
    /// announced a free into its cache of a slot not in use (a second free
    /// under way, or a slot that went home since that thread's last free):
    /// run after the planned pages stopped taking cached frees and every
    /// thread passed a barrier, so a free that read a page's word as
    /// cacheable announced its slot before and shows here
    /// (`memory/cache_handshake.rs`). Its key and link, however late they
    /// are stored, land on the page's own memory, never on a group page
    /// where another member's object is. Only a heap of the global
    /// allocator has its slots freed into other threads' caches; an owned
    /// heap's only cache is its owner's, which is making this pass.
    fn spare_announced(&self, s: &mut Scratch) {
        if !self.global {
            return;
        }
        // The planned OS pages' span: most announcements are elsewhere.
        let (mut lo, mut hi) = (usize::MAX, 0);
        for i in 0..s.n as u32 {
            if s.planned(i) {
                lo = lo.min(s.cand(i).addr());
                hi = hi.max(s.cand(i).addr() + os_page());
            }
        }
        crate::global::heaps::for_each_heap(|h| {
            let at = h.announced_free();
            if at < lo || at >= hi {
                return;
            }
            for i in 0..s.n as u32 {
                if s.planned(i) && !s.plan(i).failed && s.cand(i).free_slot_at(at) {
                    s.plan(i).failed = true;
                }
            }
        });
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
        let stuck = unsafe { (*page).leave_all_meshed(|a| sharing.leave(a, Leave::Released)) };
        if stuck > 0 {
            // Reusing the span would write through to another group's
            // page. Only a kernel out of mappings refuses a remap.
            crate::fault::write_stderr(&[
                b"pagewise: the kernel refused to unmesh a page (mmap MAP_FIXED failed)\n",
            ]);
            std::process::abort();
        }
        self.slab_committed.sub(before as u64 * os_page() as u64);
        self.budget().uncharge(before as usize * os_page());
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

/// Gives up the planned groups of `s` from `g0` on (none begun: nothing
/// withheld for them, no bit set): their candidates are marked failed.
fn give_up_from(s: &mut Scratch, g0: u32) {
    for i in 0..s.n as u32 {
        if s.planned(i) && s.plan(i).group >= g0 {
            s.plan(i).failed = true;
        }
    }
}

/// Ends the mesh round of every page with a planned candidate in `s`
/// ([`Page::end_mesh_round`]).
fn end_mesh_rounds(s: &mut Scratch) {
    for i in 0..s.n as u32 {
        if s.planned(i) {
            // SAFETY: a slab page of the pass's heap (its candidates), page
            // lists held.
            unsafe { (*s.cand(i).page).end_mesh_round() };
        }
    }
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

/// Runs `f` with the write barrier raised, if its handler is installed.
fn under_barrier<R>(f: impl FnOnce() -> R) -> R {
    let barrier = raise_barrier();
    let r = f();
    if barrier {
        lower_barrier();
    }
    r
}

/// Shares the first member of group `g` that can found it (a page whose
/// earlier group still has members cannot); if none can, every member is
/// marked failed (and its bit cleared).
///
/// # Safety
/// As [`HeapCore::mesh_pass`]; the members' slots are withheld.
unsafe fn found_group(s: &mut Scratch, g: u32, sharing: &dyn SharePages) {
    let mut m = s.group(g).first;
    while m != NONE {
        let addr = s.cand(m).addr();
        // SAFETY: per the caller.
        if !s.plan(m).failed && under_barrier(|| unsafe { sharing.share(addr) }) {
            let group = s.group(g);
            group.founder = m;
            group.at = addr;
            group.joined = 1;
            return;
        }
        m = s.plan(m).next;
    }
    let first = s.group(g).first;
    fail_from(s, first);
}

/// Joins candidate `i` (planned, not its group's founder unless that) to
/// its group (new or old), copying its live slots; marks it failed if the
/// group was not founded or the source refuses.
///
/// # Safety
/// As [`found_group`].
unsafe fn join_group(s: &mut Scratch, i: u32, sharing: &dyn SharePages) {
    let g = s.plan(i).group;
    let (founder, at) = (s.group(g).founder, s.group(g).at);
    if founder == i {
        return;
    }
    let c = *s.cand(i);
    let joined = at != 0 && {
        // SAFETY: `ranges` has room for every position of an OS page.
        let ranges = unsafe { core::slice::from_raw_parts_mut(s.ranges, MAX_POSITIONS) };
        // SAFETY: a slab page of this heap.
        let n = unsafe { (*c.page).live_ranges(c.k as usize, &c.live, ranges) };
        // SAFETY: per the caller; the group's bytes at these ranges hold
        // nothing of the others (the union was disjoint, and an old group's
        // holds every position its members may use).
        under_barrier(|| unsafe { sharing.join(at, c.addr(), &ranges[..n]) })
    };
    if joined {
        s.group(g).joined += 1;
    } else {
        mark_meshed(&c, false);
        s.plan(i).failed = true;
    }
}

/// Returns the OS pages that joined group `g` (founded), the founder
/// included (of an old group: the candidates that joined it), or, if none
/// but the founder did, takes the group apart: the
/// group page's bytes go back to the founder's own page (with whatever a
/// member that failed after its copy left in the founder's free slots:
/// their keys are rewritten by `restore_unmeshed`).
///
/// # Safety
/// As [`found_group`].
unsafe fn end_lone_group(s: &mut Scratch, g: u32, sharing: &dyn SharePages) -> usize {
    let (founder, joined) = (s.group(g).founder, s.group(g).joined);
    if s.group(g).old || joined > 1 || s.group(g).members == 1 {
        return joined as usize;
    }
    let addr = s.cand(founder).addr();
    // SAFETY: the founder's live slots are where they were.
    if under_barrier(|| unsafe { sharing.leave(addr, Leave::Keep) }) {
        mark_meshed(&s.cand(founder).clone(), false);
        s.plan(founder).failed = true;
        return 0;
    }
    1
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::os::source::{PageSource, Purge, SyscallCounts};
    use crate::SharedPages;
    use core::alloc::Layout;
    use core::cell::Cell;

    /// `SharedPages`, counting the groups founded and the pages joined
    /// (attempts, refused ones too), refusing them while `refuse` is set.
    struct Counted {
        pages: SharedPages,
        shares: AtomicUsize,
        joins: AtomicUsize,
        refuse: AtomicBool,
    }

    // SAFETY: forwards to `SharedPages`.
    unsafe impl PageSource for Counted {
        fn map(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
            self.pages.map(size, align)
        }
        unsafe fn unmap(&self, ptr: NonNull<u8>, size: usize) {
            // SAFETY: forwarded.
            unsafe { self.pages.unmap(ptr, size) }
        }
        unsafe fn purge(&self, ptr: NonNull<u8>, size: usize, how: Purge) -> bool {
            // SAFETY: forwarded.
            unsafe { self.pages.purge(ptr, size, how) }
        }
        fn now_ms(&self) -> u64 {
            self.pages.now_ms()
        }
        fn syscalls(&self) -> SyscallCounts {
            self.pages.syscalls()
        }
        fn sharing(&self) -> Option<&dyn SharePages> {
            Some(self)
        }
    }

    // SAFETY: forwards to `SharedPages`.
    unsafe impl SharePages for Counted {
        unsafe fn share(&self, founder: usize) -> bool {
            self.shares.fetch_add(1, Relaxed);
            // SAFETY: forwarded.
            !self.refuse.load(Relaxed) && unsafe { self.pages.sharing().unwrap().share(founder) }
        }
        unsafe fn join(&self, founder: usize, member: usize, ranges: &[(usize, usize)]) -> bool {
            self.joins.fetch_add(1, Relaxed);
            !self.refuse.load(Relaxed)
                // SAFETY: forwarded.
                && unsafe { self.pages.sharing().unwrap().join(founder, member, ranges) }
        }
        unsafe fn leave(&self, member: usize, how: Leave) -> bool {
            // SAFETY: forwarded.
            unsafe { self.pages.sharing().unwrap().leave(member, how) }
        }
        fn group_of(&self, addr: usize) -> Option<usize> {
            self.pages.sharing().unwrap().group_of(addr)
        }
        fn members(&self, founder: usize) -> usize {
            self.pages.sharing().unwrap().members(founder)
        }
        fn foundings(&self, founder: usize) -> usize {
            self.pages.sharing().unwrap().foundings(founder)
        }
        fn shared(&self) -> (usize, usize) {
            self.pages.sharing().unwrap().shared()
        }
        fn seams(&self) -> usize {
            self.pages.sharing().unwrap().seams()
        }
    }

    /// A thread that always waits for the lists, again as soon as it had
    /// them; counts the pauses, and the OS pages copied (groups founded,
    /// members joined) between two of them, at most.
    struct Waiter<'a> {
        source: &'a Counted,
        away: Cell<bool>,
        copies_at: Cell<usize>,
        pauses: Cell<usize>,
        most_copied: Cell<usize>,
        gathered_at: Cell<usize>,
        most_gathered: Cell<usize>,
        counted_at: Cell<usize>,
        most_counted: Cell<usize>,
        loaded_at: Cell<usize>,
        /// Stretches between two pauses in which groups were loaded.
        loading_stretches: Cell<usize>,
        /// Waits only once the pass copied since it had the lists.
        after_copies: Cell<bool>,
    }

    impl Counted {
        fn copies(&self) -> usize {
            self.shares.load(Relaxed) + self.joins.load(Relaxed)
        }
    }

    impl Outer for Waiter<'_> {
        fn wanted(&self) -> bool {
            !self.away.get()
                && (!self.after_copies.get() || self.source.copies() > self.copies_at.get())
        }
        fn let_go(&self) {
            let copied = self.source.copies() - self.copies_at.get();
            self.most_copied.set(self.most_copied.get().max(copied));
            let gathered = GATHERED.with(Cell::get) - self.gathered_at.get();
            self.most_gathered
                .set(self.most_gathered.get().max(gathered));
            let counted = COUNTED.with(Cell::get) - self.counted_at.get();
            self.most_counted.set(self.most_counted.get().max(counted));
            if LOADED.with(Cell::get) > self.loaded_at.get() {
                self.loading_stretches.set(self.loading_stretches.get() + 1);
            }
            self.pauses.set(self.pauses.get() + 1);
            self.away.set(true);
        }
        fn take_again(&self) {
            self.away.set(false);
            self.copies_at.set(self.source.copies());
            self.gathered_at.set(GATHERED.with(Cell::get));
            self.counted_at.set(COUNTED.with(Cell::get));
            self.loaded_at.set(LOADED.with(Cell::get));
        }
    }

    /// 64-byte objects over `pages` OS pages, one kept per OS page at a
    /// random slot (its address and tag returned), the rest freed.
    fn sparse(heap: &crate::Heap<Counted>, pages: usize) -> Vec<(NonNull<u8>, u8)> {
        let l = Layout::from_size_align(64, 8).unwrap();
        let per = os_page() / 64;
        let all: Vec<NonNull<u8>> = (0..pages * per)
            .map(|_| heap.allocate(l).unwrap().cast())
            .collect();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut kept = Vec::new();
        for (j, chunk) in all.chunks(per).enumerate() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let keep = (seed % per as u64) as usize;
            for (i, &p) in chunk.iter().enumerate() {
                if i == keep {
                    let tag = j as u8 | 1;
                    // SAFETY: a live block of 64 bytes.
                    unsafe { p.as_ptr().write_bytes(tag, 64) };
                    kept.push((p, tag));
                } else {
                    // SAFETY: allocated above with `l`, freed once.
                    unsafe { heap.deallocate(p, l) };
                }
            }
        }
        kept
    }

    fn intact(kept: &[(NonNull<u8>, u8)]) -> bool {
        kept.iter().all(|&(p, tag)| {
            // SAFETY: live blocks of 64 bytes.
            unsafe { core::slice::from_raw_parts(p.as_ptr(), 64) }
                .iter()
                .all(|&b| b == tag)
        })
    }

    fn counted() -> Counted {
        Counted {
            pages: SharedPages::new(),
            shares: AtomicUsize::new(0),
            joins: AtomicUsize::new(0),
            refuse: AtomicBool::new(false),
        }
    }

    /// A thread that waits for the page lists while the pass makes groups
    /// waits behind one chunk's copies (and one group's), not the round's,
    /// though it waits again as soon as it had them; the pass plans the
    /// rest again after each pause and meshes as much as one no thread
    /// waited on, every kept object intact.
    #[test]
    fn a_waiting_thread_gets_the_lists_before_the_round_ends() {
        // A round: more than a give-up's copies and a group's.
        const PAGES: usize = 1024;
        let alone = crate::Heap::with_source(counted(), Default::default());
        let kept_alone = sparse(&alone, PAGES);
        // SAFETY: this thread is the heap's only user.
        let joined_alone = unsafe { alone.core().mesh() };
        assert!(intact(&kept_alone));
        assert!(joined_alone >= PAGES / 2, "{joined_alone} of {PAGES}");

        let heap = crate::Heap::with_source(counted(), Default::default());
        let kept = sparse(&heap, PAGES);
        let source = heap.core().source() as *const dyn PageSource as *const Counted;
        // SAFETY: the heap's source is the `Counted` it was made with.
        let source = unsafe { &*source };
        let waiter = Waiter {
            source,
            away: Cell::new(false),
            copies_at: Cell::new(0),
            pauses: Cell::new(0),
            most_copied: Cell::new(0),
            gathered_at: Cell::new(GATHERED.with(Cell::get)),
            most_gathered: Cell::new(0),
            counted_at: Cell::new(COUNTED.with(Cell::get)),
            most_counted: Cell::new(0),
            loaded_at: Cell::new(LOADED.with(Cell::get)),
            loading_stretches: Cell::new(0),
            after_copies: Cell::new(false),
        };
        // SAFETY: as above.
        let joined = unsafe { heap.core().mesh_holding(&waiter) };
        assert!(intact(&kept));
        let (pauses, founded) = (waiter.pauses.get(), source.shares.load(Relaxed));
        // A group has a member per slot position at most.
        let group = os_page() / 64 + 1;
        assert!(
            waiter.most_copied.get() <= CHUNK_JOINS + group,
            "{} OS pages copied between two pauses ({pauses} pauses, {founded} groups)",
            waiter.most_copied.get()
        );
        // Nor read more candidates' free lists than a chunk's and one slab
        // page's (of 64 KiB at most here: 16 OS pages).
        assert!(
            waiter.most_gathered.get() <= CHUNK_JOINS + 16,
            "{} candidates gathered between two pauses ({pauses} pauses)",
            waiter.most_gathered.get()
        );
        // A pause after each give-up's joins at most, and one for the end of
        // the round and of the class, and one a chunk of the count.
        assert!(
            (2..=2 * PAGES / CHUNK_JOINS + 2).contains(&pauses),
            "{pauses} pauses"
        );
        assert!(
            joined * 10 >= joined_alone * 9,
            "{joined} OS pages joined with a thread waiting, {joined_alone} without"
        );
        for (p, _) in kept_alone {
            // SAFETY: allocated with this layout, freed once.
            unsafe { alone.deallocate(p, Layout::from_size_align(64, 8).unwrap()) };
        }
        for (p, _) in kept {
            // SAFETY: as above.
            unsafe { heap.deallocate(p, Layout::from_size_align(64, 8).unwrap()) };
        }
    }

    fn waiter(source: &Counted) -> Waiter<'_> {
        Waiter {
            source,
            away: Cell::new(false),
            copies_at: Cell::new(source.copies()),
            pauses: Cell::new(0),
            most_copied: Cell::new(0),
            gathered_at: Cell::new(GATHERED.with(Cell::get)),
            most_gathered: Cell::new(0),
            counted_at: Cell::new(COUNTED.with(Cell::get)),
            most_counted: Cell::new(0),
            loaded_at: Cell::new(LOADED.with(Cell::get)),
            loading_stretches: Cell::new(0),
            after_copies: Cell::new(false),
        }
    }

    fn source_of(heap: &crate::Heap<Counted>) -> &Counted {
        let source = heap.core().source() as *const dyn PageSource as *const Counted;
        // SAFETY: the heap's source is the `Counted` it was made with.
        unsafe { &*source }
    }

    fn free_all(heap: &crate::Heap<Counted>, kept: Vec<(NonNull<u8>, u8)>) {
        for (p, _) in kept {
            // SAFETY: allocated with this layout, freed once.
            unsafe { heap.deallocate(p, Layout::from_size_align(64, 8).unwrap()) };
        }
    }

    /// A waiting thread that, each time it has the page lists, makes a
    /// mesh pass of its own over the same heap (as the purger's pass does
    /// beside a `mesh()` call): counts the OS pages that pass copied.
    struct PassingWaiter<'a> {
        heap: &'a crate::Heap<Counted>,
        waiter: Waiter<'a>,
        copied: Cell<usize>,
        joined: Cell<usize>,
    }

    impl Outer for PassingWaiter<'_> {
        fn wanted(&self) -> bool {
            self.waiter.wanted()
        }
        fn let_go(&self) {
            self.waiter.let_go();
            let source = source_of(self.heap);
            let before = source.copies();
            let mut l = self.heap.core().lock_local();
            // SAFETY: this thread is the heap's only user; the lists are
            // held for the pass.
            let joined = unsafe {
                self.heap
                    .core()
                    .mesh_pass(&mut l, MeshWhen::Now, &HeldAlone)
            };
            drop(l);
            self.joined.set(self.joined.get() + joined);
            self.copied
                .set(self.copied.get() + source.copies() - before);
        }
        fn take_again(&self) {
            self.waiter.take_again();
        }
    }

    /// A pass over a heap whose pass is paused (its page lists let go to a
    /// waiting thread) leaves the heap alone: the paused pass's old groups
    /// would not be the source's after its joins and leaves. The paused
    /// pass then meshes as much as ever, every kept object intact, and a
    /// pass once it ended meshes again.
    #[test]
    fn a_pass_leaves_a_heap_whose_pass_is_paused_alone() {
        const PAGES: usize = 1024;
        let heap = crate::Heap::with_source(counted(), Default::default());
        let kept = sparse(&heap, PAGES);
        let passing = PassingWaiter {
            heap: &heap,
            waiter: waiter(source_of(&heap)),
            copied: Cell::new(0),
            joined: Cell::new(0),
        };
        // SAFETY: this thread is the heap's only user.
        let joined = unsafe { heap.core().mesh_holding(&passing) };
        assert!(passing.waiter.pauses.get() > 0, "the pass never paused");
        assert_eq!(
            (passing.copied.get(), passing.joined.get()),
            (0, 0),
            "OS pages copied and joined by passes made in the pauses"
        );
        assert!(intact(&kept));
        assert!(joined >= PAGES / 2, "{joined} of {PAGES}");
        free_all(&heap, kept);

        // A child forked while a pass was paused has no pass under way.
        let kept = sparse(&heap, PAGES);
        assert!(heap.core().lock_local().mesh_pass.begin());
        heap.core().forget_mesh_pass_after_fork();
        // SAFETY: as above.
        let again = unsafe { heap.core().mesh() };
        assert!(
            again >= PAGES / 2,
            "{again} of {PAGES} after the fork's reset"
        );
        assert!(intact(&kept));
        free_all(&heap, kept);
    }

    /// Asked between two chunks of a round: the first time after the
    /// source refused every copy of the first chunk, notes which of the
    /// kept objects' pages take cached frees again (a page none of whose
    /// OS pages meshed), and lets the source copy from then on.
    struct ChunkWatcher<'a> {
        source: &'a Counted,
        kept: &'a [(NonNull<u8>, u8)],
        reopened: core::cell::RefCell<Vec<usize>>,
    }

    impl Outer for ChunkWatcher<'_> {
        fn wanted(&self) -> bool {
            if self.source.copies() > 0 && self.source.refuse.swap(false, Relaxed) {
                for &(p, _) in self.kept {
                    let addr = p.as_ptr() as usize;
                    // SAFETY: a live slot of a slab page of the heap, in a
                    // registered segment; the page is only read.
                    unsafe {
                        let seg = &*Segment::of(crate::memory::layout::segment_base(addr));
                        let page = seg.slab_page(addr);
                        if seg.slab_entry(addr).0 != 0 && (*page).meshed_pages() == 0 {
                            self.reopened.borrow_mut().push(page as usize);
                        }
                    }
                }
            }
            false
        }
        fn let_go(&self) {}
        fn take_again(&self) {}
    }

    /// A page whose OS pages a round means to mesh takes no cached frees
    /// until the round ends: the round told the threads once, at its
    /// start, so a page that took them again between two chunks (its
    /// candidates of the first all failed) and meshed in a later one could
    /// have a free under way into a cache store its link on a group page,
    /// over another member's object.
    #[test]
    fn a_page_takes_no_cached_frees_until_its_mesh_round_ends() {
        const PAGES: usize = 1024;
        let heap = crate::Heap::with_source(counted(), Default::default());
        let kept = sparse(&heap, PAGES);
        let source = source_of(&heap);
        source.refuse.store(true, Relaxed);
        let watcher = ChunkWatcher {
            source,
            kept: &kept,
            reopened: core::cell::RefCell::new(Vec::new()),
        };
        // SAFETY: this thread is the heap's only user.
        let joined = unsafe { heap.core().mesh_holding(&watcher) };
        assert!(!source.refuse.load(Relaxed), "the round had one chunk only");
        assert!(joined > 0, "nothing meshed after the first chunk");
        let mut reopened = watcher.reopened.borrow_mut();
        reopened.sort_unstable();
        reopened.dedup();
        let meshed_later = reopened
            .iter()
            // SAFETY: slab pages of the heap, still live (kept objects).
            .filter(|&&p| unsafe { (*(p as *const Page)).meshed_pages() } > 0)
            .count();
        assert_eq!(
            meshed_later,
            0,
            "pages that took cached frees between two chunks of a round, \
             then meshed in the same round ({} took them)",
            reopened.len()
        );
        assert!(intact(&kept));
        free_all(&heap, kept);

        // A round whose every copy is refused ends with every page taking
        // cached frees again but those with hollow slots (an OS page of
        // the second set may hold no kept object: its slots are carved in
        // a shuffled order, and hollowed before the pass).
        let kept = sparse(&heap, PAGES);
        source.refuse.store(true, Relaxed);
        // SAFETY: as above.
        assert_eq!(unsafe { heap.core().mesh() }, 0);
        source.refuse.store(false, Relaxed);
        let mut open = 0;
        for &(p, _) in &kept {
            let addr = p.as_ptr() as usize;
            // SAFETY: as in `ChunkWatcher::wanted`.
            let (seg, page) = unsafe {
                let seg = &*Segment::of(crate::memory::layout::segment_base(addr));
                (seg, &*seg.slab_page(addr))
            };
            if page.hollow_slots() == 0 {
                assert_ne!(seg.slab_entry(addr).0, 0, "a page left closed at {addr:#x}");
                open += 1;
            }
        }
        assert!(
            open * 2 > kept.len(),
            "{open} of {} objects' pages open",
            kept.len()
        );
        free_all(&heap, kept);
    }

    /// The pass's count of the classes' candidates lets a waiting thread
    /// have the page lists after a chunk's candidates (and one slab
    /// page's), not after every class's, and still ends.
    #[test]
    fn a_waiting_thread_waits_for_a_chunk_of_the_count() {
        const PAGES: usize = 1024;
        let heap = crate::Heap::with_source(counted(), Default::default());
        let kept = sparse(&heap, PAGES);
        let waiter = waiter(source_of(&heap));
        // SAFETY: this thread is the heap's only user.
        let joined = unsafe { heap.core().mesh_holding(&waiter) };
        assert!(intact(&kept));
        assert!(joined >= PAGES / 2, "{joined} of {PAGES}");
        assert!(
            waiter.most_counted.get() <= CHUNK_JOINS + 16,
            "{} candidates counted between two pauses ({} pauses)",
            waiter.most_counted.get(),
            waiter.pauses.get()
        );
        free_all(&heap, kept);
    }

    /// A class that starts over after a pause does not read its groups
    /// from its pages again: they are loaded once a pass, at its first
    /// round, however often a thread waits (the rounds after keep the
    /// groups made, checked against a load after each round); and the pass
    /// meshes about as much as one no thread waited on.
    #[test]
    fn a_start_over_after_a_pause_loads_no_group_again() {
        const PAGES: usize = 1024;
        let mut joined = [0usize; 2];
        let mut loads = [0usize; 2];
        for (w, joined) in joined.iter_mut().enumerate() {
            let heap = crate::Heap::with_source(counted(), Default::default());
            let first = sparse(&heap, PAGES);
            // SAFETY: this thread is the heap's only user.
            let made = unsafe { heap.core().mesh() };
            assert!(made >= PAGES / 2, "{made} of {PAGES}");
            // Late pages: candidates beside the groups made before.
            let late = sparse(&heap, PAGES);
            let waiter = waiter(source_of(&heap));
            waiter.away.set(w == 0);
            let before = LOADED.with(Cell::get);
            // SAFETY: as above.
            *joined = unsafe { heap.core().mesh_holding(&waiter) };
            loads[w] = LOADED.with(Cell::get) - before;
            assert!(intact(&first) && intact(&late));
            eprintln!(
                "waited on {}: {} joined, {} pages loaded, {} pauses",
                w == 1,
                *joined,
                loads[w],
                waiter.pauses.get()
            );
            if w == 1 {
                assert!(waiter.pauses.get() >= 4, "{} pauses", waiter.pauses.get());
                assert!(
                    waiter.loading_stretches.get() <= 1,
                    "groups loaded between {} pairs of pauses ({} pauses)",
                    waiter.loading_stretches.get(),
                    waiter.pauses.get()
                );
            }
            free_all(&heap, first);
            free_all(&heap, late);
        }
        assert!(loads[0] > 0);
        assert_eq!(loads[1], loads[0], "slab pages loaded, waited on and not");
        assert!(
            joined[1] * 20 >= joined[0] * 19,
            "{} OS pages joined with a thread waiting, {} without",
            joined[1],
            joined[0]
        );
    }

    /// A thread that comes to wait while the pass makes groups, not while
    /// it gathers them, each time: after the first pause a round gathers a
    /// chunk's candidates, not as many as the scratch holds, which would
    /// be read to make one chunk of them and given up. The pass reads each
    /// candidate's page less than twice.
    #[test]
    fn after_a_pause_a_round_gathers_a_chunk() {
        const PAGES: usize = 1024;
        let heap = crate::Heap::with_source(counted(), Default::default());
        let kept = sparse(&heap, PAGES);
        let waiter = waiter(source_of(&heap));
        waiter.after_copies.set(true);
        let before = GATHERED.with(Cell::get);
        // SAFETY: this thread is the heap's only user.
        let joined = unsafe { heap.core().mesh_holding(&waiter) };
        let gathered = GATHERED.with(Cell::get) - before;
        assert!(intact(&kept));
        assert!(joined >= PAGES / 2, "{joined} of {PAGES}");
        assert!(waiter.pauses.get() >= 3, "{} pauses", waiter.pauses.get());
        assert!(
            gathered < 2 * PAGES,
            "{gathered} candidates gathered for {PAGES} ({} pauses)",
            waiter.pauses.get()
        );
        free_all(&heap, kept);
    }
}
