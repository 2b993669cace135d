//! A heap's side of the transfer cache (`memory/transfer.rs`): the older
//! half of an overflowing thread cache goes there as one batch, and a class
//! with no free slot in the heap's pages takes a batch before a new page.
//! Global heaps only: an owned `Heap`'s slots never leave it.

use super::remote::send_home;
use super::*;
use crate::memory::transfer::{Batch, GLOBAL};

impl HeapCore {
    /// Passes all but the `keep` most recent cached slots of `class` to
    /// the transfer cache, or home to their pages if it is full.
    ///
    /// # Safety
    /// Owner only, with its page lists held; a global heap.
    pub(super) unsafe fn pass_older(&self, l: &mut Local, class: usize, keep: u32) {
        debug_assert!(self.global);
        // SAFETY: owner only (caller).
        let (head, count) = unsafe { self.class(class).take_older(keep) };
        if count == 0 {
            return;
        }
        let at_ms = self.source().now_ms();
        if let Err(b) = GLOBAL.put(class, Batch { head, count, at_ms }) {
            // SAFETY: `count` cached slots detached from our cache.
            unsafe { send_home(Some((self, l)), b.head, b.count) };
        }
    }

    /// Takes a batch of `class` from the transfer cache into this heap's
    /// (empty) cache and allocates its first slot; null if there is none.
    ///
    /// # Safety
    /// Owner only; a global heap.
    pub(super) unsafe fn alloc_from_transfer(&self, class: usize) -> *mut u8 {
        debug_assert!(self.global);
        let state = self.class(class);
        if state.cached() != 0 {
            return null_mut(); // (the slow path comes with an empty cache)
        }
        let Some(b) = GLOBAL.take(class) else {
            return null_mut();
        };
        // SAFETY: owner only; the batch holds `count` cached slots of this
        // class, which are now ours.
        unsafe {
            state.install(b.head, b.count);
            state.pop() as *mut u8
        }
    }
}

/// Sends every batch of the transfer cache put at or before `cutoff_ms`
/// home to its pages (all of them with `u64::MAX`): the purger's pass,
/// `trim()`, and the memory limit (which must not wait: `wait` false skips
/// a class another thread is using). The calling thread need not have a
/// heap: every slot goes to its page as a remote free, which the page's
/// heap (or a visitor of an abandoned one) takes in.
pub fn send_home_older_than(cutoff_ms: u64, wait: bool) {
    GLOBAL.drain(cutoff_ms, wait, |_, b| {
        // SAFETY: a batch taken off the transfer cache: `count` cached
        // slots no one else holds, of global heaps' pages (never freed).
        unsafe { send_home(None, b.head, b.count) }
    });
}
