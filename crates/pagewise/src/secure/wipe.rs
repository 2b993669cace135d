//! Wiping freed blocks.
//!
//! The hardened free zeroes a block's first [`WIPE_MAX`] bytes and its
//! tail word (the heap writes the free lists' link and key after), and the
//! allocation that hands it out again clears the link and key: the next
//! owner never sees the last one's bytes there, and a second free of the
//! block finds the tail word zero (`canary.rs`).
//!
//! Writes after free are not checked at the next allocation: a mark left in
//! a freed block cannot tell it apart from the same bytes after its span was
//! used at another offset (by a large object, or another class's slots) and
//! made again at this one, which would report a write that never happened.

/// Bytes wiped at each free: all of a block up to this size (every slot of
/// the small classes, to 4 KiB), the first part of bigger ones (their tail
/// word is wiped too).
const WIPE_MAX: usize = 4096;

/// The words the heap keeps in a free slot (its link and its key).
const LINKS: usize = 16;

/// Wipes a block of `u` usable bytes at `p` that is being freed.
///
/// # Safety
/// `p` is a live block of `u >= 16` bytes the caller may write.
pub unsafe fn wipe(p: *mut u8, u: usize) {
    // SAFETY: inside the block (caller).
    unsafe {
        core::ptr::write_bytes(p, 0, u.min(WIPE_MAX));
        if u > WIPE_MAX {
            p.add(u - super::TAIL).cast::<usize>().write_unaligned(0);
        }
    }
}

/// Clears what the heap left in a block just handed out (the free lists'
/// link and key, which would tell the program where other blocks are).
///
/// # Safety
/// As [`wipe`].
pub unsafe fn clear_links(p: *mut u8, u: usize) {
    // SAFETY: inside the block (caller).
    unsafe { core::ptr::write_bytes(p, 0, u.min(LINKS)) };
}
