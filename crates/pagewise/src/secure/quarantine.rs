//! The quarantine: a freed slot is not handed out again until
//! [`SLOTS`] more frees of the same thread have come after it, so a
//! pointer freed and used again (a use after free) does not find the same
//! address in someone else's hands at once.
//!
//! Each thread heap keeps a ring of the slots it freed last, checked,
//! zeroed and marked by the hardened free. A slot's first two words are
//! left zero, since the record of blocks handed out (`live.rs`) says it
//! is free; only where that record was refused does the slot hold the
//! quarantine key in its second word (`Block::mark_quarantined`: a second
//! free of one is then a double free by its key), and a 16-byte slot,
//! whose second word is the one before the next slot (which that slot's
//! free checks); the ring says which do ([`KEYED`]). The free that pushes a slot in takes the oldest out and
//! frees it to the thread cache, after checking that nothing wrote over
//! the heap's words a free leaves in it (its zeroed first word, and its
//! zeroed second word or its key): the rest of it is checked when it is
//! handed out again. Beside each slot the ring keeps
//! the slab word its free read (`Segment::slab_word`): the slot's class
//! and page, which the way into the cache then only compares with the
//! word read again (`HeapCore::free_seen_to_cache`), rather than looking
//! the slot up a second time.

use crate::fault::{misuse, Misuse};
use crate::memory::page::Block;
use core::cell::{Cell, UnsafeCell};
use core::mem::size_of;
use core::ptr::null_mut;

/// Slots a thread keeps out of use after freeing them.
pub const SLOTS: usize = 16;

/// A quarantined slot and the slab word its free read, with [`KEYED`]
/// set in the word if the slot holds the quarantine key.
pub type Held = (*mut Block, usize);

/// The bit of a held slot's word that says the slot holds the quarantine
/// key (its segment's record of blocks handed out was refused, or it is a
/// 16-byte slot); without it, the slot's second word is zero. No slab word
/// has it: they are 32 bits ([`word_of`]).
pub const KEYED: usize = 1 << (usize::BITS - 1);

/// The slab word of a held slot's word (without [`KEYED`]): its low 32
/// bits, as the slab table holds them.
#[inline(always)]
pub fn word_of(held: usize) -> usize {
    held as u32 as usize
}

/// A thread heap's ring of quarantined slots (owner only).
pub struct Quarantine {
    ring: UnsafeCell<[Held; SLOTS]>,
    /// The byte offset in `ring` of the position the next slot goes to
    /// (the oldest slot's): a multiple of a held slot's size, below the
    /// ring's.
    next: Cell<usize>,
}

impl Quarantine {
    /// An empty quarantine.
    pub const fn new() -> Quarantine {
        Quarantine {
            ring: UnsafeCell::new([(null_mut(), 0); SLOTS]),
            next: Cell::new(0),
        }
    }

    /// Puts `b` in, with the slab word `word` its free read (and [`KEYED`]
    /// if `b` holds the quarantine key), returning the slot it displaces
    /// (the oldest), checked, and its word, or a null slot while the ring
    /// is filling.
    ///
    /// # Safety
    /// Owner only; `b` is a slot freed and zeroed, marked quarantined if
    /// `word` has [`KEYED`], its second word zero if not.
    #[inline(always)]
    pub unsafe fn swap(&self, b: *mut Block, word: usize) -> Held {
        // `next` is the byte offset of the position in the ring, kept
        // below the ring's size as it is stored: used as it is loaded, it
        // needs no bound check and no scaling.
        let at = self.next.get();
        self.next
            .set((at + size_of::<Held>()) % size_of::<[Held; SLOTS]>());
        // SAFETY: owner only (caller); `at` is a multiple of a held
        // slot's size below the ring's (`new`, and the store above).
        let old = unsafe {
            let slot = self.ring.get().cast::<u8>().add(at).cast::<Held>();
            core::mem::replace(&mut *slot, (b, word))
        };
        if !old.0.is_null() {
            // SAFETY: a slot this ring held, still out of use.
            unsafe { check_words(old) };
        }
        old
    }

    /// Takes every slot out, checked, oldest first, with its word (for
    /// `free`).
    ///
    /// # Safety
    /// Owner only.
    pub unsafe fn drain(&self, mut free: impl FnMut(Held)) {
        for k in 0..SLOTS {
            let i = (self.next.get() / size_of::<Held>() + k) % SLOTS;
            // SAFETY: owner only (caller).
            let held = unsafe { core::mem::replace(&mut (*self.ring.get())[i], (null_mut(), 0)) };
            if !held.0.is_null() {
                // SAFETY: as in `swap`.
                unsafe { check_words(held) };
                free(held);
            }
        }
    }
}

/// Aborts unless the quarantined slot `b` still holds what the free left
/// in its first two words: both zero, or (with [`KEYED`] in `word`) a
/// zeroed link and the quarantine key.
///
/// # Safety
/// `(b, word)` is a quarantined slot (two words at least, resident) and
/// the word the ring held with it.
#[inline(always)]
unsafe fn check_words((b, word): Held) {
    // SAFETY: per the caller.
    let [link, key] = unsafe { b.cast::<[usize; 2]>().read() };
    if link | key != 0 || word & KEYED != 0 {
        // SAFETY: as above.
        unsafe { check_keyed(b, link, word) };
    }
}

/// [`check_words`] of a slot whose words are not both zero, or that holds
/// the quarantine key: aborts unless the ring says it holds the key, its
/// link is zero and its key intact.
///
/// # Safety
/// As [`check_words`].
#[cold]
#[inline(never)]
unsafe fn check_keyed(b: *mut Block, link: usize, word: usize) {
    // SAFETY: per the caller.
    if word & KEYED == 0 || link != 0 || !unsafe { Block::is_quarantined(b) } {
        misuse(Misuse::WriteAfterFree, b as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ring gives back the slot put in [`SLOTS`] puts before, round
    /// after round (its position wraps at the ring's end), and a drain
    /// takes the rest out oldest first.
    #[test]
    fn each_slot_leaves_after_slots_more_and_a_drain_takes_the_rest_oldest_first() {
        let mut slots = [[0usize; 2]; 3 * SLOTS + 5];
        let at = |k: usize, slots: &mut [[usize; 2]]| slots[k].as_mut_ptr().cast::<Block>();
        let q = Quarantine::new();
        for k in 0..slots.len() {
            let b = at(k, &mut slots);
            // SAFETY: owner only; each slot zeroed and put in once.
            let (old, word) = unsafe { q.swap(b, k) };
            if k < SLOTS {
                assert!(old.is_null(), "put {k}: the ring was filling");
            } else {
                assert_eq!(old, at(k - SLOTS, &mut slots), "put {k}");
                assert_eq!(word, k - SLOTS, "put {k}: its word");
            }
        }
        let mut left = [0usize; SLOTS];
        let mut n = 0;
        // SAFETY: owner only.
        unsafe {
            q.drain(|(_, word)| {
                left[n] = word;
                n += 1;
            })
        };
        assert_eq!(n, SLOTS);
        let first = slots.len() - SLOTS;
        assert!(
            left.iter().enumerate().all(|(i, &w)| w == first + i),
            "{left:?}"
        );
    }
}
