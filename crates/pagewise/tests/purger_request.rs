//! The first slab page a heap takes asks for the background purger, and in
//! the C library the next allocation starts it, whatever its size: until
//! then `malloc` finds its thread cache declining (the small sizes through
//! a table that the request points at the state that caches nothing, so
//! that their fast path tests for no request). (Its own test binary, one
//! test: the purger starts once per process.)

use pagewise::{purger, raw};

#[test]
fn a_request_for_the_purger_sends_mallocs_past_their_cache_until_it_starts() {
    // SAFETY: 16 is a power of two; every block is freed once.
    unsafe {
        // The process's first allocation: a heap, a slab page, a request.
        let p = raw::malloc(16, 16);
        assert!(purger::poll_pending(), "the slab page asked for the purger");
        raw::free(p);
        assert!(raw::malloc_cached(16, 16).is_null(), "declined while asked");
        assert!(raw::malloc_cached(1000, 16).is_null());
        assert!(raw::malloc_cached(4096, 16).is_null());
        assert!(purger::poll_pending(), "the fast path starts nothing");
        // The slow path starts it (or finds it turned off) and takes the
        // cached slot; then the cache serves again.
        let q = raw::malloc(16, 16);
        assert_eq!(q, p, "the slow path takes the cached slot");
        assert!(!purger::poll_pending());
        raw::free(q);
        assert_eq!(raw::malloc_cached(16, 16), p);
        raw::free(p);
    }
}
