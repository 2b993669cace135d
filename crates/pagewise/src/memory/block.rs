//! A free slot: its link, and the key that says where it is free.
//!
//! Every free slot holds in its second word a key derived from a
//! per-process secret and its own address: the *cache key* while it waits
//! in a thread cache, the *page key* while it waits in its page's lists (the
//! free list, a remote-free list, a heap's delayed list); every allocation
//! clears it. A live object holds neither unless the program wrote that
//! value there itself, which it can learn only by reading freed memory (and
//! a copy of a freed slot's bytes elsewhere carries the wrong address): so
//! a slot found with the wrong key was freed twice, with no confirming scan
//! (glibc's tcache key, made exact), and pagewise aborts ([`crate::fault`]).
//!
//! Where it is checked: a free into a thread cache stores the cache key
//! blind (loading the slot would wait for a line another core may have
//! written last); the cache's pop checks the cache key on the line it reads
//! for the link; a flush moves each slot from the cache key to the page key,
//! checking it; a page's pop checks the page key, and a page released as
//! empty checks every slot of its free list once; a free past the cache
//! checks that the slot holds neither key. A slot freed twice into a cache
//! has one key for its two copies: the pop or flush that meets the second
//! copy finds it cleared or already turned into the page key.
//!
//! This is why no slot is smaller than two words (`size_class::MIN_SLOT`).

use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// A free slot, linked through its first word, keyed in its second.
#[repr(C)]
pub struct Block {
    /// Next free slot, encoded in the hardened build ([`Block::next`]).
    next: *mut Block,
    /// [`key_of`] this slot while it is free; anything else while live.
    key: usize,
}

/// The per-process secret behind every key (0 until the first heap is
/// made; no slot exists before that).
pub(crate) static SECRET: AtomicUsize = AtomicUsize::new(0);

/// Draws the secret, once per process (later calls keep it). Allocates
/// nothing: the kernel's random bytes for the process ([`crate::os::random`]).
pub fn init_secret() {
    if SECRET.load(Relaxed) != 0 {
        return;
    }
    let _ = SECRET.compare_exchange(0, secret_from(random_word()), Relaxed, Relaxed);
}

/// The secret made of a random word: odd, so no key is 0; with its top
/// bit set ([`SECRET_BITS`]); and with the page tag's bit set, so the tag always clears a bit of the cache key (a
/// key that merely ORed the tag in would equal the cache key in every
/// process, not in half of them). A function of its own so that a test
/// can give it fixed words: its mutants are then caught every run, not
/// only when the kernel's random bytes happen to expose them.
fn secret_from(word: usize) -> usize {
    word | SECRET_BITS
}

/// The bits every secret has: the lowest (odd), [`PAGE_TAG`]'s, and the
/// top one, so that every key's last byte in memory (its top byte: a slot
/// address has none) is nonzero: a string's terminator written one byte
/// before a free 16-byte slot's neighbour lands on that byte and always
/// changes the key (the hardened build reads that key as the word before
/// the neighbour). A literal, checked against the tag by a unit test:
/// written `1 | PAGE_TAG`, its mutation into the equal `1 ^ PAGE_TAG` is
/// one no test can catch.
const SECRET_BITS: usize = 0x8000_0000_0000_0003;

/// The per-process secret, drawn if it was not yet (the unit tests'; the
/// hardened build reads it without the draw, `crate::secure::secret_now`).
#[cfg(any(test, feature = "secure"))]
#[cfg_attr(not(test), allow(dead_code))]
pub fn secret() -> usize {
    init_secret();
    SECRET.load(Relaxed)
}

/// The kernel's random bytes; under Miri, a fixed word (an interpreter
/// run is meant to be repeatable). One function for both, so that a
/// mutation of it is always one the tests can see.
fn random_word() -> usize {
    #[cfg(miri)]
    let word = 0x9e37_79b9_7f4a_7c15;
    #[cfg(not(miri))]
    let word = crate::os::random::random_word();
    word
}

/// Told apart from the cache key in the page key: flips a bit the
/// address (16-byte aligned) does not have, so no slot's page key is any
/// slot's cache key, and neither is ever 0 (the secret is odd).
const PAGE_TAG: usize = 2;

/// The tag bits in which the free keys differ from the cache key: the
/// page key's, and a bit no key has (a word with it is taken for a free
/// key too: as unlikely in a live slot as the keys). A literal, checked by
/// a unit test.
#[cfg_attr(not(feature = "secure"), allow(dead_code))]
const FREE_TAGS: usize = 6;

/// The key a free slot at `addr` holds in a thread cache.
#[inline(always)]
fn cache_key(addr: usize) -> usize {
    SECRET.load(Relaxed) ^ addr
}

/// The key a free slot at `addr` holds in its page's lists (free list,
/// remote-free list, delayed list).
#[inline(always)]
fn page_key(addr: usize) -> usize {
    SECRET.load(Relaxed) ^ addr ^ PAGE_TAG
}

/// What a slot found without its free key where a list kept it is
/// reported as: a double free in the default build (a second copy of the
/// slot in the lists); a corrupted free list in the hardened build, which
/// reports a double free at the second free itself, so that only a write
/// after free can have changed the key.
pub const KEY_LOST: crate::fault::Misuse = if cfg!(feature = "secure") {
    crate::fault::Misuse::CorruptedFreeList
} else {
    crate::fault::Misuse::DoubleFree
};

impl Block {
    /// The next free slot after `block` in the list that holds it. The
    /// hardened build stores links encoded (`crate::secure::link`), and
    /// aborts here
    /// ([`crate::fault::Misuse::CorruptedFreeList`]) if the link does not
    /// decode: a write after free changed it.
    ///
    /// # Safety
    /// `block` is a free slot the caller may read, whose link was written
    /// by [`Block::set_next`].
    #[inline(always)]
    pub unsafe fn next(block: *const Block) -> *mut Block {
        // SAFETY: per the caller.
        let word = unsafe { (*block).next };
        #[cfg(feature = "secure")]
        {
            let Some(next) = crate::secure::link::decode(block as usize, word as usize) else {
                crate::fault::misuse(crate::fault::Misuse::CorruptedFreeList, block as usize)
            };
            next as *mut Block
        }
        #[cfg(not(feature = "secure"))]
        word
    }

    /// Links `block` to `next` (null: the end of a list).
    ///
    /// # Safety
    /// `block` is a slot of at least two words that the caller may write.
    #[inline(always)]
    pub unsafe fn set_next(block: *mut Block, next: *mut Block) {
        #[cfg(feature = "secure")]
        let next = crate::secure::link::encode(block as usize, next as usize) as *mut Block;
        // SAFETY: per the caller.
        unsafe { (*block).next = next };
    }

    /// Marks a slot as freed into a thread cache: a blind store, no check
    /// (the free fast path must not wait for the slot's line). A slot
    /// already free is caught when it is taken out of the cache again
    /// ([`Block::take_cached`], [`Block::cached_to_page`]).
    ///
    /// # Safety
    /// `block` is a slot of at least two words that the caller may write.
    #[inline(always)]
    pub unsafe fn mark_cached(block: *mut Block) {
        // SAFETY: per the caller.
        unsafe { (*block).key = cache_key(block as usize) };
    }

    /// Whether a slot popped from a thread cache holds the cache key (false:
    /// the slot was freed twice, or written after its free).
    ///
    /// # Safety
    /// `block` is a slot of at least two words that the caller may read.
    #[inline(always)]
    pub unsafe fn is_cached(block: *const Block) -> bool {
        // SAFETY: per the caller.
        unsafe { (*block).key == cache_key(block as usize) }
    }

    /// Whether a slot popped from a page's free list holds the page key.
    ///
    /// # Safety
    /// As [`Block::is_cached`].
    #[inline(always)]
    pub unsafe fn is_in_page(block: *const Block) -> bool {
        // SAFETY: per the caller.
        unsafe { (*block).key == page_key(block as usize) }
    }

    /// Moves a slot's key from the cache's to the page's (a slot going
    /// from a thread cache to its page), returning false (and changing
    /// nothing) if it did not hold the cache key: a second copy of a slot
    /// whose first copy already went to its page, or a slot a pop handed
    /// out while another copy stayed cached.
    ///
    /// # Safety
    /// As [`Block::mark_cached`].
    #[inline(always)]
    pub unsafe fn cached_to_page(block: *mut Block) -> bool {
        // SAFETY: per the caller.
        unsafe {
            if !Block::is_cached(block) {
                return false;
            }
            (*block).key = page_key(block as usize);
        }
        true
    }

    /// Marks a slot freed past the cache (to its page), returning false
    /// (and marking nothing) if it was free already, in a cache or in a
    /// page's lists.
    ///
    /// # Safety
    /// As [`Block::mark_cached`].
    #[inline(always)]
    pub unsafe fn mark_free(block: *mut Block) -> bool {
        // SAFETY: per the caller.
        unsafe {
            let k = (*block).key;
            if k == cache_key(block as usize) || k == page_key(block as usize) {
                return false;
            }
            Block::mark_in_page(block);
        }
        true
    }

    /// Gives a slot the page key without a check (a slot carved fresh, or
    /// one whose key was just checked).
    ///
    /// # Safety
    /// As [`Block::mark_cached`].
    #[inline(always)]
    pub unsafe fn mark_in_page(block: *mut Block) {
        // SAFETY: per the caller.
        unsafe { (*block).key = page_key(block as usize) };
    }

    /// Whether a slot holds either free key: it is free, in a thread cache
    /// or in its page's lists (a block handed to `free` that answers true
    /// was freed already).
    ///
    /// # Safety
    /// As [`Block::is_cached`].
    #[cfg(feature = "secure")]
    #[inline(always)]
    pub unsafe fn is_free(block: *const Block) -> bool {
        // SAFETY: per the caller.
        Block::is_free_key(block as usize, unsafe { (*block).key })
    }

    /// Whether `key`, a word read where the slot at `addr` keeps its key,
    /// is one of its free keys ([`Block::is_free`] of a word read once: a
    /// check that reads the key while another thread may change it judges
    /// the value it read, not a second load of the slot). In every build,
    /// so that the default build's unit tests check it too.
    #[cfg_attr(not(feature = "secure"), allow(dead_code))]
    #[inline(always)]
    pub fn is_free_key(addr: usize, key: usize) -> bool {
        // The three keys differ from `cache_key` only in the tag bits: one
        // compare under a mask (which also takes a fourth tag, 6, that no
        // slot is given: as unlikely in a live slot as the three).
        (key ^ cache_key(addr)) & !FREE_TAGS == 0
    }

    /// Stores a raw 0 in a slot's link word (the hardened build's cache
    /// leaves it so in its newest slot until the next push links it).
    ///
    /// # Safety
    /// As [`Block::mark_cached`].
    #[cfg(feature = "secure")]
    #[inline(always)]
    pub unsafe fn clear_link(block: *mut Block) {
        // SAFETY: per the caller.
        unsafe { (*block).next = core::ptr::null_mut() };
    }

    /// A slot's link word as stored (not decoded).
    ///
    /// # Safety
    /// As [`Block::is_cached`].
    #[cfg(feature = "secure")]
    #[inline(always)]
    pub unsafe fn raw_link(block: *const Block) -> usize {
        // SAFETY: per the caller.
        unsafe { (*block).next as usize }
    }

    /// Gives a slot the page key as [`Block::mark_in_page`] does, for a
    /// slot of `slot` bytes whose bytes no free wrote: carved fresh, or
    /// given back by meshing with another page's bytes in it. The hardened
    /// build also writes what its free would have (`crate::secure`): clears
    /// its third word, where a free leaves the mark that says how far it
    /// zeroed the slot (a stale mark left there by an earlier use of the
    /// memory would check bytes no free zeroed), and writes a free slot's
    /// tail word, which the next slot's free checks.
    ///
    /// # Safety
    /// As [`Block::mark_cached`], for all `slot` bytes.
    #[inline(always)]
    pub unsafe fn mark_carved(block: *mut Block, slot: usize) {
        // SAFETY: per the caller.
        unsafe {
            Block::mark_in_page(block);
            #[cfg(feature = "secure")]
            crate::secure::carved(block.cast(), slot);
        }
        let _ = slot;
    }

    /// Marks a slot live (about to be handed out).
    ///
    /// # Safety
    /// As [`Block::mark_free`].
    #[inline(always)]
    pub unsafe fn mark_live(block: *mut Block) {
        // SAFETY: per the caller.
        unsafe { (*block).key = 0 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots of a test-local buffer, two words each, 16-byte aligned.
    #[repr(C, align(16))]
    struct Slots([[usize; 2]; 4]);

    #[test]
    fn the_secret_is_drawn_once_and_odd() {
        let s = secret();
        assert_eq!(s & 1, 1, "odd, so that no key is 0");
        // A random word has bits beyond the three fixed ones (all 61
        // clear once in 2^61 draws).
        assert_ne!(s & !SECRET_BITS, 0, "drawn, not a constant: {s:#x}");
        init_secret();
        assert_eq!(SECRET.load(Relaxed), s, "later calls keep the secret");
    }

    #[test]
    fn the_secret_keeps_the_word_and_sets_the_three_fixed_bits() {
        let top = 1 << (usize::BITS - 1);
        assert_eq!(SECRET_BITS, top | 1 | PAGE_TAG, "the odd, top and tag bits");
        assert_eq!(secret_from(0), top | 1 | PAGE_TAG);
        assert_eq!(secret_from(!0), !0, "no bit of the word is cleared");
        assert_eq!(secret_from(0x5a50), 0x5a50 | top | 1 | PAGE_TAG);
        assert_eq!(secret_from(1 | PAGE_TAG), top | 1 | PAGE_TAG);
        // Every key of a slot (below 2^56) ends in a nonzero byte.
        for a in [0x10usize, 0x7f12_3456_7890, 0xff_ffff_fff0] {
            let s = secret_from(0);
            for key in [s ^ a, s ^ a ^ PAGE_TAG] {
                assert_ne!(key.to_le_bytes()[7], 0, "{a:#x}");
            }
        }
    }

    #[test]
    fn keys_differ_by_address_and_by_list() {
        let s = secret();
        // Addresses one bit apart, for every bit a 16-byte-aligned slot
        // address can have: a copy of a freed slot's key elsewhere is not
        // that slot's key (a secret that only ORs or ANDs in the address
        // would give many addresses one key).
        let base = 0x7f12_3456_7890usize & !15;
        for bit in 4..48 {
            let (a, b) = (base, base ^ (1 << bit));
            assert_ne!(cache_key(a), cache_key(b), "bit {bit}");
            assert_ne!(page_key(a), page_key(b), "bit {bit}");
            assert_ne!(cache_key(a), page_key(b), "bit {bit}");
        }
        assert_eq!(s & PAGE_TAG, PAGE_TAG, "the tag's bit is set: {s:#x}");
        for a in (0..64).map(|i| base + 16 * i) {
            let (c, p) = (cache_key(a), page_key(a));
            assert_ne!(c, p, "the cache key is not the page key");
            // Neither is a value a live object plausibly holds: a small
            // integer, or a pointer to the slot itself (a list sentinel
            // linking to itself).
            for live in [0, 1, 2, 3, a, a ^ PAGE_TAG, a + 8] {
                assert!(c != live && p != live, "{a:#x}: {live:#x}, secret {s:#x}");
            }
        }
    }

    #[test]
    fn a_word_is_a_free_key_only_if_it_is_one_of_the_slots_three() {
        assert_eq!(FREE_TAGS, PAGE_TAG | 4);
        init_secret();
        let base = 0x7f12_3456_7890usize & !15;
        for a in (0..64).map(|i| base + 16 * i) {
            let c = cache_key(a);
            for key in [c, page_key(a), c ^ 4] {
                assert!(Block::is_free_key(a, key), "{a:#x}: {key:#x}");
            }
            // Live values, another slot's keys, a key a bit off.
            let other = a + 16;
            for live in [0, 1, 2, a, a + 8, !0, c ^ 1, c ^ 8, c ^ (1 << 63)]
                .into_iter()
                .chain([cache_key(other), page_key(other)])
            {
                assert!(!Block::is_free_key(a, live), "{a:#x}: {live:#x}");
            }
        }
    }

    #[test]
    fn live_values_are_not_keys_and_keys_move_between_lists() {
        init_secret();
        let mut slots = Slots([[0; 2]; 4]);
        let base = slots.0.as_mut_ptr();
        // SAFETY (all blocks below): test-local slots of two words, reached
        // only through `base`.
        let b = |i: usize| unsafe { base.add(i) } as *mut Block;
        unsafe {
            // Live objects whose second word holds a small integer or the
            // slot's own address are freed (past the cache) as live slots.
            for (i, live) in [0usize, 1, 2, b(3) as usize].into_iter().enumerate() {
                (*b(i)).key = live;
                assert!(Block::mark_free(b(i)), "second word {live:#x}");
            }
            // Freed: in its page's lists, not in a cache; a second free
            // past the cache is refused.
            let x = b(0);
            assert!(Block::is_in_page(x) && !Block::is_cached(x));
            assert!(!Block::mark_free(x), "freed twice");
            assert!(!Block::cached_to_page(x), "not cached");
            // Live again, then freed into a cache: cached, not in a page;
            // refused past the cache; moved to the page once.
            Block::mark_live(x);
            assert!(!Block::is_in_page(x) && !Block::is_cached(x));
            Block::mark_cached(x);
            assert!(Block::is_cached(x) && !Block::is_in_page(x));
            assert!(!Block::mark_free(x), "freed again while cached");
            assert!(Block::cached_to_page(x));
            assert!(Block::is_in_page(x) && !Block::is_cached(x));
            assert!(!Block::cached_to_page(x), "moved once");
            // Another slot's key copied in is not this slot's key.
            let y = b(1);
            Block::mark_live(y);
            (*y).key = (*x).key;
            assert!(!Block::is_in_page(y) && !Block::is_cached(y));
            assert!(Block::mark_free(y), "a copied key");
        }
    }
}
