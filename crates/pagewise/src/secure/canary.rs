//! The tail word and the canary: how a block of the hardened build says
//! where its requested bytes end, and how a write past them is seen.
//!
//! ```text
//! | requested bytes | canary (8 to 15 bytes) | slack | tail |
//! | requested bytes                 | canary (0 to 6) | spare byte count |
//! ```
//!
//! A block whose slot leaves eight spare bytes or more gets a tail word:
//! the last eight bytes of the usable block, which hold the
//! distance from the end of the request to the tail, its halves swapped and
//! encoded with the process's secret and the block's address: the word's
//! low half, which an overflow reaches first, holds the distance's high
//! half, zero in any block below 4 GiB, so a change there decodes to a
//! distance longer than the block. Canary bytes come from the same secret and are
//! never zero, so a string's terminator written one byte too far is caught.
//!
//! A slot that leaves one to seven bytes spare (the request takes that
//! class rather than the next: an eight-byte tail word would move it up)
//! gets a short tail instead: its last byte says how many bytes are
//! spare, encoded with the same mask (the tail word's own last byte, with
//! its low three bits flipped: never the tail word's, never zero), and the
//! bytes between the request and it are canary bytes. A free reads the
//! slot's last word either way and tells the two apart by that byte. A
//! request must leave at least one byte spare: a slot it fills exactly
//! would have nothing after it to check.
//!
//! The canary is written and checked a word at a time, two words at most:
//! the byte at offset `i` of a block is the pattern's byte `i % 8`, so the
//! canary runs from the request's end to the word boundary after the next
//! one, and the first word (which may hold the request's last bytes) is
//! merged under a mask. A linear overflow writes the canary's first byte
//! first, so a longer canary would only catch writes that skip it; the two
//! words are what a free reads and a wipe clears, on lines the program
//! has just used.

use super::secret_now;
use super::TAIL;
use crate::fault::Misuse;
use crate::memory::size_class::SMALL_MAX;

/// Bytes every request leaves spare in its block, at least: its last byte
/// is the allocator's (a short tail's count, or the tail word's last).
pub const MIN_SLACK: usize = 1;

/// Canary bytes after a request, at most (to the next word boundary past
/// this many): the first of them is what a linear overflow writes first.
const CANARY_MAX: usize = 8;

/// The top bit of every tail word: no valid one is 0 (the wipe's mark of
/// a freed block), nor has its last byte zeroed by a string terminator.
const TOP: usize = 1 << (usize::BITS - 1);

/// The keys of the block at one address, from one load of the secret and
/// one multiplication: its tail word's mask and canary pattern
/// ([`marks`]) and the mask of a freed slot's mark (`wipe.rs`). A free
/// and a hand-out compute them once for the block and pass them to each
/// check that needs them.
#[derive(Clone, Copy)]
pub struct Keys(usize);

impl Keys {
    /// The keys of the block at `addr`.
    #[inline(always)]
    pub fn of(addr: usize) -> Keys {
        Keys((secret_now() ^ addr).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    /// The tail word's mask (never with its top bit clear, nor that of
    /// its low byte: the byte a short tail's count is encoded with has its
    /// top bit set in either byte order) and the canary's pattern word (no
    /// zero byte).
    #[inline(always)]
    fn marks(self) -> (usize, u64) {
        let h = self.0;
        (
            h | TOP | 0x80,
            (h.rotate_left(29) as u64) | 0x0101_0101_0101_0101,
        )
    }

    /// What a freed slot's mark is XORed with (`wipe.rs`): the tail word's
    /// mask ([`Keys::marks`]), which the free's checks and the hand-out's
    /// arming compute anyway (never with its top bit clear: no mark is 0,
    /// a fresh slot's). A mask of its own would hide little more: a
    /// program that reads its own block's tail word learns this one (the
    /// hash but two bits), and so any other made from the hash but for
    /// four guesses; a mark and a free slot's tail word, XORed together,
    /// give only their two known values.
    #[inline(always)]
    pub fn mark_mask(self) -> usize {
        self.marks().0
    }
}

/// What a block at `addr` is checked with ([`Keys::marks`]).
#[inline(always)]
fn marks(addr: usize) -> (usize, u64) {
    Keys::of(addr).marks()
}

/// The last byte in memory of the tail word mask `mask`, as the top byte
/// of a little-endian word: a tail word of a block below 16 MiB ends with
/// it (its distance's byte there is zero), a short tail with it XORed with
/// the spare bytes' count.
#[inline(always)]
fn last_byte(mask: usize) -> u64 {
    u64::from_le(mask as u64) >> 56
}

/// Whether a request of `size` bytes in a block of `u` usable bytes gets a
/// short tail (fewer than eight bytes spare; only slots have one).
#[inline(always)]
fn is_short(size: usize, u: usize) -> bool {
    u - size < TAIL
}

/// Whether a block of `u` usable bytes holds a request of `size` bytes
/// with the bytes its checks need after it: one at least in a slot (a
/// short tail), eight (the tail word) in a larger block.
#[inline(always)]
pub fn fits(size: usize, u: usize) -> bool {
    size < u && (u - size >= TAIL || u <= SMALL_MAX)
}

/// The bytes of the last word of a block (as a little-endian word) that
/// a short tail of `spare` bytes holds: its top `spare` bytes.
#[inline(always)]
fn short_mask(spare: usize) -> u64 {
    !0u64 << (8 * (TAIL - spare))
}

/// The last word of a block (as a little-endian word) with a short tail of
/// `spare` bytes, under [`short_mask`]: canary bytes, then the count. The
/// canary bytes are the pattern's with the count in their high nibble, so
/// a count changed to another (by a write that skipped the canary) makes
/// each canary byte the new count covers differ from the one expected,
/// and none is zero (the pattern's bytes are odd).
#[inline(always)]
fn short_word(mask: usize, pat: u64, spare: usize) -> u64 {
    let canary = pat ^ (0x1010_1010_1010_1010 * spare as u64);
    (canary & !(0xff << 56)) | ((last_byte(mask) ^ spare as u64) << 56)
}

/// The spare bytes' count a block's last word `last` (little-endian)
/// holds if it is a short tail (1 to 7), else 0 or more than 7.
#[inline(always)]
fn short_spare(mask: usize, last: u64) -> usize {
    ((last >> 56) ^ last_byte(mask)) as usize
}

/// A word with its halves swapped (its own inverse).
#[inline(always)]
fn swap(x: usize) -> usize {
    x.rotate_left(usize::BITS / 2)
}

/// Where the canary ends in a block of `u` usable bytes holding `size`:
/// a word boundary, at most [`CANARY_MAX`] bytes past the request's last
/// word, never into the tail.
#[inline(always)]
fn canary_end(size: usize, u: usize) -> usize {
    // No overflow: `size` is below `u`, a block's size.
    (((size + 7) & !7) + CANARY_MAX).min(u - TAIL)
}

/// The bytes a wipe must clear in a block of `u` bytes that held `size`:
/// the request and its canary (the tail word is cleared on its own; a
/// short tail is the block's last bytes).
#[inline(always)]
pub fn written(size: usize, u: usize) -> usize {
    if is_short(size, u) {
        u
    } else {
        canary_end(size, u)
    }
}

/// The mask of the bytes of the word at `size & !7` that belong to the
/// canary (the request owns the ones below `size`).
#[inline(always)]
fn first_mask(size: usize) -> u64 {
    !0u64 << (8 * (size & 7))
}

/// Writes the tail word and the canary of a block of `u` usable bytes at
/// `p` holding a request of `size` bytes, with the block's keys `keys`.
/// With `keep`, the request's bytes are kept; without, those of its last
/// word below `size` are zeroed (the block's owner has not written them
/// yet, and a zeroed block stays zeroed), so that the canary is only
/// written, not read: reading it first would fault a fresh page in twice,
/// once to read and once to write.
///
/// # Safety
/// `p` is a live block of `u` bytes the caller may write, `u` a multiple
/// of 8, which [`fits`] `size`; `keys` are `Keys::of(p)`.
#[inline(always)]
pub unsafe fn arm_keyed(p: *mut u8, size: usize, u: usize, keep: bool, keys: Keys) {
    debug_assert!(u % 8 == 0 && fits(size, u));
    if is_short(size, u) {
        // SAFETY: the block's last word (caller: `u >= TAIL`).
        let last = if keep {
            unsafe { word(p, u - TAIL) }
        } else {
            0
        };
        // SAFETY: forwarded.
        unsafe { arm_short(p, size, u, last, keys) };
    } else {
        // SAFETY: forwarded.
        unsafe { arm_long(p, size, u, keep, keys) };
    }
}

/// [`arm_keyed`] with the keys of `p` (the unit tests').
///
/// # Safety
/// As [`arm_keyed`].
#[cfg(test)]
unsafe fn arm(p: *mut u8, size: usize, u: usize, keep: bool) {
    // SAFETY: forwarded.
    unsafe { arm_keyed(p, size, u, keep, Keys::of(p as usize)) }
}

/// Writes the short tail of a request of `size` bytes into the last word
/// of the block of `u` bytes at `p`, in one store, over `last`: what the
/// word holds below `size` (the request's bytes there, or zero).
///
/// # Safety
/// As [`arm_keyed`], for a request [`is_short`] says ends in a short tail.
#[inline(always)]
unsafe fn arm_short(p: *mut u8, size: usize, u: usize, last: u64, keys: Keys) {
    let (mask, pat) = keys.marks();
    let spare = u - size;
    let m = short_mask(spare);
    // SAFETY: the block's last word (caller).
    unsafe {
        put(
            p,
            u - TAIL,
            (last & !m) | (short_word(mask, pat, spare) & m),
        )
    };
}

/// Writes the canary and the tail word of a request of `size` bytes that
/// leaves eight bytes or more spare in the block of `u` bytes at `p`;
/// with `keep`, the request's bytes in the canary's first word are kept.
///
/// # Safety
/// As [`arm_keyed`], for a request that is not [`is_short`].
#[inline(always)]
unsafe fn arm_long(p: *mut u8, size: usize, u: usize, keep: bool, keys: Keys) {
    let (mask, pat) = keys.marks();
    let end = canary_end(size, u);
    let mut at = size & !7;
    // SAFETY: the words written lie in [size & !7, end) and the tail, all
    // inside the block (caller); with `keep`, the first one's bytes below
    // `size` are written back as they were.
    unsafe {
        if at < end {
            let w = if keep && size & 7 != 0 {
                word(p, at)
            } else {
                0
            };
            let m = first_mask(size);
            put(p, at, (w & !m) | (pat & m));
            at += 8;
            // Two words at most: `end <= (size & !7) + 16`.
            if at < end {
                put(p, at, pat);
            }
        }
        p.add(u - TAIL)
            .cast::<usize>()
            .write_unaligned(swap(u - TAIL - size) ^ mask);
    }
}

/// Re-arms the live block of `u` bytes at `p` in place, from a request of
/// `old` bytes to one of `size` (a `realloc` that keeps the block): the
/// request's bytes below both are kept, the old canary's are cleared (a
/// block grown over them would show the program the secret pattern), and
/// the new canary and tail are written. The block's last word changes in
/// one store, from the old tail to the new: a thread freeing the block
/// after this one reads that word at any moment (the word before its own
/// block must be a tail), and a word half rewritten, the old request's
/// bytes with the old short tail cleared, would read as an underflow.
///
/// # Safety
/// As [`arm_keyed`], with the block armed for `old` until now.
#[inline]
pub unsafe fn rearm(p: *mut u8, old: usize, size: usize, u: usize) {
    let keys = Keys::of(p as usize);
    let last = u - TAIL;
    // The old canary below the last word.
    let below = written(old, u).min(last);
    // SAFETY: the bytes [old, below) lie in the block, below its last word.
    if old < below {
        unsafe { super::unchecked::zero(p.add(old), below - old) };
    }
    if is_short(size, u) {
        // The last word as the new request finds it: the old request's
        // bytes there kept (a short tail's), the rest (the old canary and
        // count, or the old tail word) cleared.
        let kept = old.saturating_sub(last);
        let w = if kept == 0 {
            0
        } else {
            // SAFETY: the block's last word.
            unsafe { word(p, last) & !(!0u64 << (8 * kept)) }
        };
        // SAFETY: forwarded.
        unsafe { arm_short(p, size, u, w, keys) };
    } else {
        // SAFETY: forwarded; the canary's first word keeps the request's
        // bytes, which are the old request's or, past `old`, cleared above.
        unsafe { arm_long(p, size, u, true, keys) };
    }
}

/// The distance a free slot's tail word holds (encoded as a live one's
/// is): longer than any block, so no live tail word is a free one, with a
/// bit set below the top one, so that the top byte stays nonzero too.
const FREE_GAP: usize = 1 << (usize::BITS / 2 - 2);

/// The tail word of a free slot at `addr` (freed, or carved and never
/// handed out): a value the block before it must not change either.
#[inline(always)]
pub fn free_tail(addr: usize) -> usize {
    Keys::of(addr).free_tail()
}

impl Keys {
    /// [`free_tail`] of the block these are the keys of.
    #[inline(always)]
    pub fn free_tail(self) -> usize {
        swap(FREE_GAP) ^ self.marks().0
    }
}

/// Whether `word`, read at the end of the slot of `u` bytes at `addr`, is
/// a tail word the allocator wrote there: a live block's, a free slot's,
/// or zero (its OS page was purged). Anything else was written by the
/// program: past the end of that slot, or before the start of the next.
#[inline(always)]
pub fn is_tail(addr: usize, u: usize, word: usize) -> bool {
    let (mask, pat) = marks(addr);
    // A live block's tail word first, on its own (the common case, one
    // comparison), then a purged page's zero and a free slot's tail.
    if swap(word ^ mask) <= u - TAIL {
        return true;
    }
    if word == 0 || word == swap(FREE_GAP) ^ mask {
        return true;
    }
    let last = u64::from_le(word as u64);
    let spare = short_spare(mask, last);
    (1..TAIL).contains(&spare)
        && u <= SMALL_MAX
        && (last ^ short_word(mask, pat, spare)) & short_mask(spare) == 0
}

/// The word at offset `at` of `p`, as the canary's byte order sees it.
///
/// # Safety
/// Eight bytes at `p + at` are readable.
#[inline(always)]
unsafe fn word(p: *const u8, at: usize) -> u64 {
    // SAFETY: per the caller.
    u64::from_le(unsafe { p.add(at).cast::<u64>().read_unaligned() })
}

/// Writes `w` at offset `at` of `p`.
///
/// # Safety
/// Eight bytes at `p + at` are writable.
#[inline(always)]
unsafe fn put(p: *mut u8, at: usize, w: u64) {
    // SAFETY: per the caller.
    unsafe { p.add(at).cast::<u64>().write_unaligned(w.to_le()) }
}

/// [`verify_keyed`] with the keys of `p`.
///
/// # Safety
/// As [`verify_keyed`].
#[cfg(test)]
unsafe fn verify(p: *const u8, u: usize) -> Result<usize, (Misuse, usize)> {
    // SAFETY: forwarded.
    unsafe { verify_keyed(p, u, Keys::of(p as usize)) }
}

/// Checks the tail word (or short tail) and the canary of a block of `u`
/// usable bytes at `p`: the requested size, or the misuse and the address
/// it was found at. A tail word of 0 is a block the hardened free already
/// wiped (freed twice); any other that does not decode, or a canary byte
/// changed, is a write past the end (the address: the first byte found
/// changed).
///
/// # Safety
/// `p` is a block of `u >= TAIL` bytes the caller may read, `u` a
/// multiple of 8; `keys` are `Keys::of(p)`.
#[inline(always)]
pub unsafe fn verify_keyed(p: *const u8, u: usize, keys: Keys) -> Result<usize, (Misuse, usize)> {
    // SAFETY: forwarded.
    unsafe { verify_found(p, u, keys) }.map(|f| f.size)
}

/// What [`verify_found`] found in a block: the requested size, and the
/// bytes a wipe must clear ([`written`]), known on the way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    /// The bytes the program asked for.
    pub size: usize,
    /// `written(size, u)`.
    pub written: usize,
}

/// [`verify_keyed`], with the bytes a wipe must clear too (a free needs
/// both, and the check computes the second on its way).
///
/// # Safety
/// As [`verify_keyed`].
#[inline(always)]
pub unsafe fn verify_found(p: *const u8, u: usize, keys: Keys) -> Result<Found, (Misuse, usize)> {
    // SAFETY: the tail word is the block's last TAIL bytes (caller).
    let tail = unsafe { p.add(u - TAIL).cast::<usize>().read_unaligned() };
    let (mask, pat) = keys.marks();
    let gap = swap(tail ^ mask);
    // A live tail word first (a short tail never decodes as one: its
    // count's byte lands in the distance's top half).
    if tail == 0 || gap > u - TAIL {
        return short_or_refused(p, u, tail, mask, pat);
    }
    let size = u - TAIL - gap;
    let end = canary_end(size, u);
    let mut at = size & !7;
    let mut diff = 0u64;
    // SAFETY: the canary's words, inside the block below the tail.
    unsafe {
        if at < end {
            diff = (word(p, at) ^ pat) & first_mask(size);
            at += 8;
            if at < end {
                diff |= word(p, at) ^ pat;
            }
        }
    }
    if diff != 0 {
        // SAFETY: as above.
        return Err((Misuse::Overflow, unsafe {
            first_changed(p, size, end, pat)
        }));
    }
    // A tail word leaves eight bytes spare or more: no short tail.
    Ok(Found { size, written: end })
}

/// [`verify_keyed`] of a block whose last word is no live tail word: a short
/// tail's count and canary checked, else what the word says is wrong.
#[inline(always)]
fn short_or_refused(
    p: *const u8,
    u: usize,
    tail: usize,
    mask: usize,
    pat: u64,
) -> Result<Found, (Misuse, usize)> {
    if tail == 0 || swap(tail ^ mask) == FREE_GAP {
        // Wiped (a large block) or a free slot's: freed already.
        return Err((Misuse::DoubleFree, p as usize));
    }
    let last = u64::from_le(tail as u64);
    let spare = short_spare(mask, last);
    if !(1..TAIL).contains(&spare) || u > SMALL_MAX {
        return Err((Misuse::Overflow, p as usize + (u - TAIL)));
    }
    let diff = (last ^ short_word(mask, pat, spare)) & short_mask(spare);
    if diff != 0 {
        let first = (diff.trailing_zeros() / 8) as usize;
        return Err((Misuse::Overflow, p as usize + u - TAIL + first));
    }
    // A short tail: the block's last bytes are the allocator's.
    Ok(Found {
        size: u - spare,
        written: u,
    })
}

/// The address of the first canary byte of `p` that does not match.
///
/// # Safety
/// As [`verify_keyed`], which found one.
#[cold]
unsafe fn first_changed(p: *const u8, size: usize, end: usize, pat: u64) -> usize {
    let bytes = pat.to_le_bytes();
    (size..end)
        // SAFETY: inside the canary (caller).
        .find(|&i| unsafe { *p.add(i) } != bytes[i % 8])
        .map_or(p as usize + size, |i| p as usize + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test block, 16-byte aligned like every pagewise block.
    #[repr(C, align(16))]
    struct Buf([u8; 512]);

    #[test]
    fn every_byte_of_the_canary_and_the_tail_is_checked() {
        crate::memory::block::init_secret();
        let mut buf = Buf([0; 512]);
        let p = buf.0.as_mut_ptr();
        for u in [16, 32, 48, 112, 160, 512] {
            for size in 0..=u - TAIL {
                // SAFETY (all below): `p` has 512 bytes, u <= 512.
                unsafe {
                    p.write_bytes(0xa5, u);
                    arm(p, size, u, true);
                    assert_eq!(verify(p, u), Ok(size), "u {u} size {size}");
                    let found = verify_found(p, u, Keys::of(p as usize));
                    let written = written(size, u);
                    assert_eq!(found, Ok(Found { size, written }), "u {u} size {size}");
                    assert!(
                        (0..size).all(|i| *p.add(i) == 0xa5),
                        "u {u} size {size}: the request's bytes are kept"
                    );
                    let end = canary_end(size, u);
                    assert!(end >= (size + CANARY_MAX).min(u - TAIL));
                    // The slack is not checked; the tail's high half is checked
                    // only through the canary it would move.
                    for i in (size..end).chain(u - TAIL..u - TAIL / 2) {
                        for v in [0u8, b'x', *p.add(i) ^ 1] {
                            let old = *p.add(i);
                            if v == old {
                                continue;
                            }
                            *p.add(i) = v;
                            let r = verify(p, u);
                            *p.add(i) = old;
                            let at = p as usize + i.min(u - TAIL);
                            assert_eq!(
                                r,
                                Err((Misuse::Overflow, at)),
                                "u {u} size {size} byte {i} = {v:#x}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_block_rearmed_in_place_keeps_its_bytes_and_clears_the_old_canary() {
        crate::memory::block::init_secret();
        let mut buf = Buf([0; 512]);
        let p = buf.0.as_mut_ptr();
        for u in [16, 32, 64, 112, 160, 512] {
            for old in (0..u).filter(|&s| fits(s, u)) {
                for size in (0..u).filter(|&s| fits(s, u)) {
                    // SAFETY (all below): `p` has 512 bytes, u <= 512.
                    unsafe {
                        p.write_bytes(0xa4, u);
                        arm(p, old, u, true);
                        rearm(p, old, size, u);
                        let what = format!("u {u} from {old} to {size}");
                        assert_eq!(verify(p, u), Ok(size), "{what}");
                        let kept = old.min(size);
                        assert!((0..kept).all(|i| *p.add(i) == 0xa4), "{what}: kept");
                        // (The slack past the old canary holds what it held.)
                        let canary = kept..size.min(written(old, u));
                        assert!(
                            canary.clone().all(|i| *p.add(i) == 0),
                            "{what}: the old canary is not shown in {canary:?}"
                        );
                        let last = p.add(u - TAIL).cast::<usize>().read_unaligned();
                        assert!(is_tail(p as usize, u, last), "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn every_byte_of_a_short_tail_is_checked() {
        crate::memory::block::init_secret();
        let mut buf = Buf([0; 512]);
        let p = buf.0.as_mut_ptr();
        for u in [16, 32, 48, 112, 160, 512] {
            for size in u - TAIL + 1..u {
                assert!(fits(size, u) && is_short(size, u));
                // SAFETY (all below): `p` has 512 bytes, u <= 512.
                unsafe {
                    // An even byte: no canary byte is one.
                    p.write_bytes(0xa4, u);
                    arm(p, size, u, true);
                    assert_eq!(verify(p, u), Ok(size), "u {u} size {size}");
                    let found = verify_found(p, u, Keys::of(p as usize));
                    let written = written(size, u);
                    assert_eq!(found, Ok(Found { size, written }), "u {u} size {size}");
                    assert!((0..size).all(|i| *p.add(i) == 0xa4), "kept");
                    assert!((size..u).all(|i| *p.add(i) != 0), "no zero byte");
                    // The count's byte has its top bit set: no text byte
                    // written there passes for a count.
                    assert!(*p.add(u - 1) >= 0x80, "u {u} size {size}");
                    let last = p.add(u - TAIL).cast::<usize>().read_unaligned();
                    assert!(is_tail(p as usize, u, last), "u {u} size {size}");
                    for i in size..u {
                        for v in [0u8, b'x', *p.add(i) ^ 1] {
                            let old = *p.add(i);
                            if v == old {
                                continue;
                            }
                            *p.add(i) = v;
                            let r = verify(p, u);
                            let w = p.add(u - TAIL).cast::<usize>().read_unaligned();
                            let tail = is_tail(p as usize, u, w);
                            *p.add(i) = old;
                            assert!(
                                matches!(r, Err((Misuse::Overflow, _))),
                                "u {u} size {size} byte {i} = {v:#x}: {r:?}"
                            );
                            assert!(!tail, "u {u} size {size} byte {i} = {v:#x}");
                        }
                    }
                }
            }
            assert!(!fits(u, u), "a request leaves a byte spare");
        }
        // Past a slot's sizes, a block keeps its tail word.
        assert!(fits(SMALL_MAX + 4096 - TAIL, SMALL_MAX + 4096));
        assert!(!fits(SMALL_MAX + 4096 - 1, SMALL_MAX + 4096));
    }

    #[test]
    fn a_short_tails_count_changed_changes_what_every_canary_byte_must_be() {
        crate::memory::block::init_secret();
        for addr in [0x2000_0000_0010usize, 0x7f00_1234_5670, 0x10_0000] {
            let (mask, pat) = marks(addr);
            for a in 1..TAIL {
                let wa = short_word(mask, pat, a);
                // The canary bytes: the pattern's, the count in the high
                // nibble; the count's byte: the tail word's last, XORed.
                for i in 8 - a..7 {
                    let byte = (wa >> (8 * i)) as u8;
                    assert_eq!(byte ^ (pat >> (8 * i)) as u8, (a as u8) << 4);
                }
                assert_eq!(short_spare(mask, wa), a);
                for b in (1..TAIL).filter(|&b| b != a) {
                    let d = wa ^ short_word(mask, pat, b);
                    assert!(
                        (0..8).all(|i| (d >> (8 * i)) as u8 != 0),
                        "counts {a} and {b}: every byte differs"
                    );
                }
            }
        }
    }

    #[test]
    fn canary_bytes_are_never_zero_and_a_wiped_tail_is_a_double_free() {
        crate::memory::block::init_secret();
        let mut buf = Buf([0xa5; 512]);
        let p = buf.0.as_mut_ptr();
        // SAFETY: inside the test's buffer.
        unsafe {
            arm(p, 3, 64, false);
            assert_eq!(&buf.0[..3], [0; 3], "zeroed, not kept");
            p.write_bytes(0xa5, 3);
            arm(p, 3, 64, true);
            assert_eq!(&buf.0[..3], [0xa5; 3], "kept");
            assert!((3..56).all(|i| *p.add(i) != 0));
            p.add(56).cast::<usize>().write(0);
            assert_eq!(verify(p, 64), Err((Misuse::DoubleFree, p as usize)));
        }
    }
}
