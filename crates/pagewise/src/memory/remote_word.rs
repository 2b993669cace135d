//! The remote-free word of a slab page (`Page::thread_free`): the list of
//! slots other threads freed into the page, its length, and the page's
//! full state, in one atomic word.
//!
//! ```text
//!   bits 0..3   state: 0, DELAYED or NOTIFIED (bit 2 spare)
//!   bits 3..32  slots on the list (0: empty)
//!   bits 32..64 offset of the list's first slot from its segment's base
//! ```
//!
//! One word, so the owner takes list and count together and, when its page
//! runs dry, never walks a list whose slots other cores wrote last (a chain
//! of cache misses). The state settles the race between a page going onto
//! its heap's full list and a remote free arriving:
//! - state 0: remote frees go onto the list;
//! - [`DELAYED`]: the page is on the owner's full list; the next remote free
//!   takes the state to [`NOTIFIED`] *instead of* pushing, and tells the
//!   owner through the heap's `delayed` list (`heap/remote.rs`);
//! - [`NOTIFIED`]: the owner was told; later frees go onto the list again.
//!
//! Invariants, model-checked with loom on this very code (the functions are
//! generic over the atomic word for that purpose; the models are at the end
//! of this file, run with `RUSTFLAGS="--cfg loom" cargo test --release -p
//! pagewise --lib loom`): every
//! slot pushed is taken exactly once; a page marked full with no slot
//! pending gets exactly one notification for the first free after it; a
//! page never becomes full while slots are pending.

use crate::sync::word::Word;
use core::sync::atomic::Ordering::*;

/// State: the page is on its heap's full list; the next remote free must
/// tell the owner, through the heap's `delayed` list, that it has room.
pub const DELAYED: usize = 1;
/// State: the owner has been told; further remote frees go onto the list,
/// so the heap-wide list sees one slot per full page.
pub const NOTIFIED: usize = 2;
const STATE: usize = 3;
const FLAGS: usize = 7;
const COUNT_SHIFT: u32 = 3;
const COUNT_MASK: usize = ((1 << 29) - 1) << COUNT_SHIFT;
const HEAD_SHIFT: u32 = 32;

/// A list of remote frees: its first slot's offset from the segment base
/// and its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct List {
    /// Offset of the first slot from its segment's base.
    pub first: usize,
    /// Slots on the list (at least 1).
    pub count: usize,
}

#[inline(always)]
fn list_of(w: usize) -> Option<List> {
    let count = (w & COUNT_MASK) >> COUNT_SHIFT;
    (count != 0).then_some(List {
        first: w >> HEAD_SHIFT,
        count,
    })
}

#[inline(always)]
fn word_of(flags: usize, list: List) -> usize {
    debug_assert!(list.count << COUNT_SHIFT <= COUNT_MASK);
    (list.first << HEAD_SHIFT) | (list.count << COUNT_SHIFT) | flags
}

/// Pushes a chain of `count` slots whose first is at offset `first`, with
/// one CAS (retried on contention). Before each attempt `link` is called
/// with the list the chain must end in (`None`: empty), and must make the
/// chain's last slot point at that list's first slot. Returns false,
/// without pushing, when the page was full (`DELAYED`): the caller must
/// notify the owner with the chain's first slot and push the rest.
#[inline]
pub fn push<W: Word>(
    word: &W,
    first: usize,
    count: usize,
    mut link: impl FnMut(Option<List>),
) -> bool {
    crate::sync::perturb::point();
    let mut w = word.load(Relaxed);
    loop {
        if w & STATE == DELAYED {
            let claimed = (w & !STATE) | NOTIFIED;
            match word.cas_weak(w, claimed, AcqRel, Relaxed) {
                Ok(_) => return false,
                Err(seen) => {
                    w = seen;
                    continue;
                }
            }
        }
        let old = list_of(w);
        link(old);
        let new = List {
            first,
            count: count + old.map_or(0, |l| l.count),
        };
        match word.cas_weak(w, word_of(w & FLAGS, new), Release, Relaxed) {
            Ok(_) => return true,
            Err(seen) => w = seen,
        }
    }
}

/// Takes the whole list (the owner), leaving the state as it was. The
/// Acquire makes the slots' links, written before their push, visible.
#[inline]
pub fn take<W: Word>(word: &W) -> Option<List> {
    crate::sync::perturb::point();
    let mut w = word.load(Relaxed);
    loop {
        let list = list_of(w)?;
        match word.cas_weak(w, w & FLAGS, Acquire, Relaxed) {
            Ok(_) => return Some(list),
            Err(seen) => w = seen,
        }
    }
}

/// How many slots the list holds now (a snapshot: pushes go on).
pub fn pending_count<W: Word>(word: &W) -> usize {
    (word.load(Acquire) & COUNT_MASK) >> COUNT_SHIFT
}

/// Whether slots are waiting on the list.
#[inline]
pub fn pending<W: Word>(word: &W) -> bool {
    word.load(Relaxed) & COUNT_MASK != 0
}

/// Marks the page full (the owner, whose page has no free slot): from now
/// on the first remote free notifies the owner. Fails, changing nothing,
/// if slots are pending: the owner must take them instead.
#[inline]
pub fn try_mark_full<W: Word>(word: &W) -> bool {
    loop {
        crate::sync::perturb::point();
        let w = word.load(Relaxed);
        if w & COUNT_MASK != 0 {
            return false;
        }
        if word
            .cas_weak(w, (w & !STATE) | DELAYED, AcqRel, Relaxed)
            .is_ok()
        {
            return true;
        }
    }
}

/// Clears the full state (the owner, taking the page off its full list):
/// remote frees go onto the list again.
#[inline]
pub fn clear_full<W: Word>(word: &W) {
    crate::sync::perturb::point();
    word.fetch_and(!STATE, AcqRel);
}

#[cfg(all(test, loom))]
mod loom_model {
    //! The protocol under every interleaving loom finds, on a page of a few
    //! slots whose links are loom cells (so a link read before the CAS that
    //! publishes it is reported as a race), with the heap's `delayed` list
    //! run by the allocator's own functions (`memory/delayed.rs`).
    use super::*;
    use crate::memory::delayed;
    use core::ptr::null_mut;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{AtomicPtr, AtomicUsize};
    use loom::sync::Arc;

    /// A slot: its link, the next slot's index + 1 (0: none).
    type Link = UnsafeCell<usize>;

    struct Page {
        word: AtomicUsize,
        delayed: AtomicPtr<Link>,
        links: Vec<Link>,
    }

    // SAFETY: the raw pointers are slots' identities, followed only through
    // loom's cells.
    unsafe impl Send for Page {}
    // SAFETY: as above.
    unsafe impl Sync for Page {}

    impl Page {
        fn new(slots: usize) -> Arc<Page> {
            Arc::new(Page {
                word: AtomicUsize::new(0),
                delayed: AtomicPtr::new(null_mut()),
                links: (0..slots).map(|_| UnsafeCell::new(0)).collect(),
            })
        }

        fn set_link(&self, slot: usize, next: usize) {
            // SAFETY: loom checks the access.
            self.links[slot].with_mut(|l| unsafe { *l = next });
        }

        fn link(&self, slot: usize) -> usize {
            // SAFETY: loom checks the access.
            self.links[slot].with(|l| unsafe { *l })
        }

        /// The slot `plus_one - 1` as a node of the delayed list (0: null).
        fn node(&self, plus_one: usize) -> *mut Link {
            match plus_one {
                0 => null_mut(),
                i => &self.links[i - 1] as *const Link as *mut Link,
            }
        }

        /// The slot a node of the delayed list is, + 1 (0 for null).
        fn plus_one(&self, node: *mut Link) -> usize {
            (0..self.links.len())
                .find(|&i| self.node(i + 1) == node)
                .map_or(0, |i| i + 1)
        }

        /// A remote free of `slot` (its offset is its index).
        fn free_remote(&self, slot: usize) {
            let pushed = push(&self.word, slot, 1, |old| {
                self.set_link(slot, old.map_or(0, |l| l.first + 1))
            });
            if !pushed {
                delayed::push(&self.delayed, self.node(slot + 1), |head| {
                    self.set_link(slot, self.plus_one(head))
                });
            }
        }

        /// The owner takes the page's list; the slots it held.
        fn take_list(&self) -> Vec<usize> {
            let mut out = Vec::new();
            if let Some(l) = take(&self.word) {
                let mut s = l.first;
                for i in 0..l.count {
                    out.push(s);
                    if i + 1 < l.count {
                        s = self.link(s) - 1;
                    }
                }
            }
            out
        }

        /// The owner takes the heap's delayed list; the slots it held.
        fn take_delayed(&self) -> Vec<usize> {
            let mut out = Vec::new();
            // SAFETY: the nodes are this page's slots.
            unsafe {
                delayed::take_each(
                    &self.delayed,
                    |b| self.node(self.link(self.plus_one(b) - 1)),
                    |b| out.push(self.plus_one(b) - 1),
                )
            };
            out
        }
    }

    fn sorted(mut v: Vec<usize>) -> Vec<usize> {
        v.sort();
        v
    }

    /// The owner marks its page full while two other threads free slots
    /// into it: every slot comes back exactly once, and a page left full
    /// with slots pending has told its owner.
    #[test]
    fn marking_full_races_remote_frees() {
        loom::model(|| {
            let p = Page::new(2);
            let frees: Vec<_> = (0..2)
                .map(|slot| {
                    let p = p.clone();
                    loom::thread::spawn(move || p.free_remote(slot))
                })
                .collect();
            let mut got = Vec::new();
            let full = try_mark_full(&p.word);
            if !full {
                got.extend(p.take_list());
            }
            for f in frees {
                f.join().unwrap();
            }
            let notified = p.take_delayed();
            let pending = p.take_list();
            if full && !pending.is_empty() {
                assert!(
                    !notified.is_empty(),
                    "slots pending on a full page, owner not told"
                );
            }
            if !full {
                assert!(notified.is_empty(), "a page never marked full notified");
            }
            got.extend(notified);
            got.extend(pending);
            assert_eq!(sorted(got), vec![0, 1], "each slot back exactly once");
        });
    }

    /// A full page: the first remote free notifies the owner, who takes the
    /// page off its full list (clears the state) and collects, while a
    /// second free arrives.
    #[test]
    fn a_notified_owner_clears_full_and_collects() {
        loom::model(|| {
            let p = Page::new(3);
            assert!(try_mark_full(&p.word));
            let frees: Vec<_> = (0..2)
                .map(|slot| {
                    let p = p.clone();
                    loom::thread::spawn(move || p.free_remote(slot))
                })
                .collect();
            let mut got = p.take_delayed();
            if !got.is_empty() {
                clear_full(&p.word);
                got.extend(p.take_list());
            }
            for f in frees {
                f.join().unwrap();
            }
            let late_notice = p.take_delayed();
            let pending = p.take_list();
            // Whatever is still pending must be reachable: either the owner
            // cleared the state (the page is back on its queue) or it was
            // told.
            if !pending.is_empty() {
                assert!(
                    !got.is_empty() || !late_notice.is_empty(),
                    "pending slots on a full page nobody was told about"
                );
            }
            got.extend(late_notice);
            got.extend(pending);
            assert_eq!(sorted(got), vec![0, 1]);
        });
    }

    /// Chains: two threads push runs of two slots; the owner takes lists
    /// meanwhile. Counts and links stay consistent.
    #[test]
    fn chains_and_takes_interleave() {
        loom::model(|| {
            let p = Page::new(4);
            let pushers: Vec<_> = [0usize, 2]
                .into_iter()
                .map(|first| {
                    let p = p.clone();
                    loom::thread::spawn(move || {
                        // The chain first -> first + 1, linked before the push.
                        p.set_link(first, first + 2);
                        assert!(push(&p.word, first, 2, |old| {
                            p.set_link(first + 1, old.map_or(0, |l| l.first + 1))
                        }));
                    })
                })
                .collect();
            let mut got = p.take_list();
            for t in pushers {
                t.join().unwrap();
            }
            got.extend(p.take_list());
            assert_eq!(sorted(got), vec![0, 1, 2, 3]);
        });
    }
}
