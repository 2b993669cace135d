//! The remote-free protocol: slots freed by a thread other than their
//! page's owner, and slots going home from a thread cache.
//!
//! - A slot of another heap's page goes onto the page's `thread_free` list
//!   with one CAS (one per run of slots of the same page).
//! - The first such free into a page on its owner's full list goes to the
//!   heap's `delayed` list instead, so the owner notices the page has room
//!   again; the `DELAYED`/`NOTIFIED` state in `thread_free` settles the race
//!   (`memory::page`).
//! - The owner takes `thread_free` lists whole (one CAS) and the `delayed`
//!   list whole (one swap), and only then touches the slots.
//!
//! A slot of another heap's page freed into this thread's cache is checked
//! for a double free ([`Block::mark_free`]) [`PENDING`] such frees later,
//! not at once: its line was last written by the core that allocated it,
//! and the free's load of the slot's key waited for that line, where the
//! free's stores alone do not (the larson-like server freeing what other
//! threads allocated was 10-12 % slower with the load). Meanwhile the slot
//! waits in [`Pending`], in no list, so it cannot be handed out unchecked;
//! the free stores into it at once, so that its line is on its way when
//! the check comes. A slot freed twice meets its first copy's key when its
//! second copy is checked, as on the immediate path.

use super::free::lookup_page;
use super::*;
use crate::memory::segment::STATE_SHIFT;

impl HeapCore {
    /// Sends the cached slots of `class` back to their pages, all but the
    /// `keep` most recent.
    ///
    /// # Safety
    /// Owner only.
    pub(super) unsafe fn flush_cache(&self, class: usize, keep: u32) {
        // SAFETY: owner only; the detached list holds live slots of this
        // class, of this heap's pages or other heaps' (which outlive them).
        unsafe {
            let mut b = self.class(class).take_older(keep);
            // Slots of one page of another heap that come in a row go home
            // as one chain, with one CAS (a producer's objects often come
            // from the same page).
            let mut run = RemoteRun::EMPTY;
            while !b.is_null() {
                let next = (*b).next;
                // Owner and page from the segment header's read-mostly
                // fields, not from the descriptor, which its owner rewrites
                // on every allocation (cached slots passed the free checks).
                let seg = &*Segment::of(crate::memory::layout::segment_base(b as usize));
                let page = seg.slab_page(b as usize);
                if seg.heap == self.me() {
                    let _ = self.free_local(page, b);
                } else if page == run.page {
                    (*run.last).next = b;
                    run.last = b;
                    run.count += 1;
                } else {
                    run.send();
                    run = RemoteRun {
                        page,
                        first: b,
                        last: b,
                        count: 1,
                    };
                }
                b = next;
            }
            run.send();
        }
    }

    /// Empties every class's cache (pending slots first). Owner only.
    pub(super) unsafe fn flush_caches(&self) {
        // SAFETY: owner only (caller).
        unsafe { self.settle_pending() };
        for class in 0..CLASSES {
            // SAFETY: owner only (caller).
            unsafe { self.flush_cache(class, 0) };
        }
    }

    /// Handles frees that other threads made into pages on the full list.
    pub(super) unsafe fn process_delayed(&self) {
        if self.delayed.load(Relaxed).is_null() {
            return;
        }
        crate::sync::perturb::point();
        let mut b = self.delayed.swap(null_mut(), Acquire);
        while !b.is_null() {
            // SAFETY: the delayed list holds slots of this heap's pages,
            // pushed by `free_remote`; we own the list after the swap.
            unsafe {
                let next = (*b).next;
                let seg = &*Segment::of(crate::memory::layout::segment_base(b as usize));
                let page = lookup_page(seg, b as usize);
                let _ = self.free_local(page, b);
                b = next;
            }
        }
    }

    /// Takes in every slot other threads freed into this heap's pages
    /// (the owner would on its next slow paths), so counters show them as
    /// free. Owner only.
    pub unsafe fn collect_remote(&self) {
        // SAFETY: owner only (caller); queue and full-list entries are slab
        // pages of this heap, and collecting moves no page between lists.
        unsafe {
            self.process_delayed();
            for class in 0..CLASSES {
                let mut p = self.local().queues[class].head;
                while !p.is_null() {
                    let n = (*p).collect_thread_free();
                    self.class(class).returned.add(n as u64);
                    p = (*p).next;
                }
            }
            let mut p = self.local().full.head;
            while !p.is_null() {
                let n = (*p).collect_thread_free();
                self.class((*p).class as usize).returned.add(n as u64);
                p = (*p).next;
            }
        }
    }
}

/// Other heaps' slots freed into this thread's cache whose check waits.
pub const PENDING: usize = 8;

/// Where `Pending` keeps a slot's class state offset (`cache_free`'s
/// `state_at`) next to its address: registered segments lie below 2^47
/// (`registry`), so the top 16 bits of a slot's address are 0.
const STATE_AT_SHIFT: u32 = 48;
const _: () = assert!((CLASSES + 1) << STATE_SHIFT < 1 << (usize::BITS - STATE_AT_SHIFT));
const ADDR_MASK: usize = (1 << STATE_AT_SHIFT) - 1;

/// The last [`PENDING`] slots of other heaps' pages that this thread freed
/// into its cache, not checked yet (owner only). Each entry is the slot's
/// address with its class state's offset in the top bits, or 0.
pub(super) struct Pending {
    slots: [usize; PENDING],
    at: usize,
}

impl Pending {
    pub(super) const EMPTY: Pending = Pending {
        slots: [0; PENDING],
        at: 0,
    };

    /// Whether a slot is pending (the latest entry is one: they are
    /// settled all at once or oldest first).
    #[inline]
    pub(super) fn any(&self) -> bool {
        self.slots[self.at.wrapping_sub(1) % PENDING] != 0
    }
}

impl HeapCore {
    /// Frees a slot of another heap's page into this thread's cache, its
    /// check deferred: it takes the place of the oldest pending slot, which
    /// is checked and cached now.
    ///
    /// # Safety
    /// Owner only, not inside another heap operation; `block` starts a
    /// live slot (of two words at least) of a slab page of another thread
    /// heap of the global allocator, whose class state is `state_at` bytes
    /// into `states`.
    #[inline(always)]
    pub(super) unsafe fn free_pending(&self, block: *mut Block, state_at: usize) {
        // SAFETY: owner only (caller); the borrow of `pending` ends before
        // any other use of `local`. The slot is ours to write (caller).
        unsafe {
            let p = &mut self.local().pending;
            let i = p.at % PENDING;
            let old = p.slots[i];
            p.slots[i] = block as usize | state_at << STATE_AT_SHIFT;
            p.at = i + 1;
            // Ask for the line now, without waiting for it: it is here by
            // the time the slot is checked.
            prefetch_for_write(block);
            (*block).next = null_mut();
            if old != 0 {
                self.settle(old);
            }
        }
    }

    /// Checks a slot taken out of `Pending` and caches it.
    ///
    /// # Safety
    /// Owner only, not inside another heap operation; `entry` was in
    /// `Pending` (and no longer is).
    #[inline(never)]
    unsafe fn settle(&self, entry: usize) {
        let block = (entry & ADDR_MASK) as *mut Block;
        let state_at = entry >> STATE_AT_SHIFT;
        // SAFETY: `state_at` is the offset of a class state in `states`
        // (`cache_free`); the slot is a live slot of that class, freed by
        // this thread, in no list (per the caller).
        unsafe {
            let state = &*((self.states.as_ptr() as *const u8).add(state_at) as *const ClassState);
            if !Block::mark_free(block) {
                misuse(Misuse::DoubleFree, block as usize);
            }
            if !state.push(block) {
                self.cache_full((state_at >> STATE_SHIFT) - 1, block);
            }
        }
    }

    /// Checks and caches every pending slot: before the caches are emptied
    /// (thread exit, `trim`) and on the allocation slow path, so a pending
    /// double free is caught soon even if the thread stops freeing.
    ///
    /// # Safety
    /// Owner only, between operations.
    pub(super) unsafe fn settle_pending(&self) {
        for i in 0..PENDING {
            // SAFETY: owner only (caller); each entry leaves `Pending` before
            // it is settled (settling may flush caches and come back here).
            unsafe {
                let p = &mut self.local().pending;
                let entry = core::mem::replace(&mut p.slots[i], 0);
                if entry != 0 {
                    self.settle(entry);
                }
            }
        }
    }
}

/// Starts bringing `block`'s line into this core's cache, to be written.
#[inline(always)]
fn prefetch_for_write(block: *mut Block) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and never faults.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_ET0 }>(block as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = block;
}

/// Consecutive slots of one page of another heap, linked first to last.
pub(super) struct RemoteRun {
    page: *mut Page,
    first: *mut Block,
    last: *mut Block,
    count: usize,
}

impl RemoteRun {
    const EMPTY: RemoteRun = RemoteRun {
        page: null_mut(),
        first: null_mut(),
        last: null_mut(),
        count: 0,
    };

    /// Frees the run to its page (nothing if empty).
    ///
    /// # Safety
    /// The run holds live slots of `page`, whose heap outlives them.
    unsafe fn send(&mut self) {
        if self.page.is_null() {
            return;
        }
        // SAFETY: per the caller; the chain ends at `last`.
        unsafe {
            (*self.last).next = null_mut();
            let mut first = self.first;
            let mut count = self.count;
            // A page on its owner's full list takes the first slot through
            // the heap's delayed list (`free_remote`); the rest go on.
            while !(*self.page).push_remote_chain(first, self.last, count) {
                let rest = (*first).next;
                (*first).next = null_mut();
                free_to_delayed(self.page, first);
                if rest.is_null() {
                    break;
                }
                first = rest;
                count -= 1;
            }
        }
        *self = RemoteRun::EMPTY;
    }
}

/// Frees a slot of a page owned by another thread's heap.
///
/// # Safety
/// `block` is a live slot of `page`; the page's heap outlives it.
#[inline]
pub(super) unsafe fn free_remote(page: *mut Page, block: *mut Block) {
    // SAFETY: per the caller.
    unsafe {
        if !(*page).push_remote(block) {
            free_to_delayed(page, block);
        }
    }
}

/// Puts a slot on its heap's delayed list: the first remote free into a
/// page on the owner's full list, which tells the owner the page has room.
///
/// # Safety
/// `block` is a live slot of `page`, whose heap outlives it; `push_remote`
/// just claimed the notification for it.
unsafe fn free_to_delayed(page: *mut Page, block: *mut Block) {
    // SAFETY: per the caller.
    unsafe {
        let heap = &*((*page).heap as *const HeapCore);
        let mut head = heap.delayed.load(Relaxed);
        loop {
            crate::sync::perturb::point();
            (*block).next = head;
            match heap
                .delayed
                .compare_exchange_weak(head, block, Release, Relaxed)
            {
                Ok(_) => return,
                Err(seen) => head = seen,
            }
        }
    }
}
