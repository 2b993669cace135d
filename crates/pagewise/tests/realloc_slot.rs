//! `realloc` of a slot to a size another class serves moves it through the
//! thread cache, as a `malloc` and a `free` would: the new slot is the one
//! the cache holds for the new size, the old slot goes into the cache of
//! its class, the bytes move, and the thread's allocated and freed bytes
//! count exactly the two slots. A resize the slot still serves keeps the
//! block where it is. (python3 trims every string it formats this way.)
//!
//! The default build's: the hardened build hands freed slots out again in
//! a random order after a quarantine, so no resize gets the cache's slot.
#![cfg(not(feature = "secure"))]

use pagewise::raw;
use pagewise::size_class::{class_of, SLOT_SIZE};
use pagewise::thread::{allocated_bytes, freed_bytes};

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

fn slot(size: usize) -> u64 {
    SLOT_SIZE[class_of(size)] as u64
}

#[test]
fn a_slot_resized_to_another_class_moves_through_the_thread_cache() {
    // SAFETY: blocks are live from their allocation to their one free (or
    // the realloc that takes them); 16 is a power of two.
    unsafe {
        // Warm the thread's heap and both classes' caches: a slot of the
        // small class, freed, is what the cache hands out next.
        let small = raw::malloc(50, 16);
        let big = raw::malloc(150, 16);
        assert!(!small.is_null() && !big.is_null());
        raw::free(small);
        for i in 0..150 {
            big.add(i).write(i as u8);
        }
        let (a0, f0) = (allocated_bytes(), freed_bytes());
        // Shrunk to less than half its slot: it moves, into the cached slot.
        let moved = raw::realloc(big, 50, 16);
        assert_eq!(moved, small, "the new slot comes from the thread cache");
        for i in 0..50 {
            assert_eq!(moved.add(i).read(), i as u8);
        }
        assert_eq!(
            allocated_bytes() - a0,
            slot(50),
            "one slot of the new class"
        );
        assert_eq!(freed_bytes() - f0, slot(150), "the old slot");
        // The old slot went into its class's cache: the next request of
        // that class gets it back.
        let again = raw::malloc(150, 16);
        assert_eq!(again, big, "the old slot waits in the thread cache");
        // Resizes the slot still serves keep the block and count nothing.
        let (a1, f1) = (allocated_bytes(), freed_bytes());
        let same = raw::realloc(again, slot(150) as usize, 16);
        assert_eq!(same, again, "grown within its slot");
        let same = raw::realloc(same, 100, 16);
        assert_eq!(same, again, "shrunk by less than half");
        assert_eq!((allocated_bytes() - a1, freed_bytes() - f1), (0, 0));
        // Grown past its slot: a slot of the larger class, the bytes kept.
        let grown = raw::realloc(moved, 400, 16);
        assert_ne!(grown, moved);
        for i in 0..50 {
            assert_eq!(grown.add(i).read(), i as u8);
        }
        raw::free(grown);
        raw::free(same);
    }
}
