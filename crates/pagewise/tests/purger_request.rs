//! The first slab page a heap takes asks for the background purger, and in
//! the C library the next allocation starts it, whatever its size: until
//! then `malloc` finds its thread cache declining (the small sizes through
//! a table that the request points at the state that caches nothing, so
//! that their fast path tests for no request). The hardened build's fast
//! path finds its class through the same table, and declines past the
//! cache too (its class's current page). A thread without a heap is
//! declined as well. (Its own test binary, one test: the purger starts
//! once per process; the hardened package runs it too.)

#[cfg(pagewise_secure_package)]
extern crate pagewise_secure as pagewise;

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
        // cached slot; then the cache serves again. (The hardened build
        // keeps a freed slot in the thread's quarantine: the next comes
        // from the class's page, past the cache, which the fast path takes
        // once the request is gone.)
        let q = raw::malloc(16, 16);
        assert!(!purger::poll_pending());
        #[cfg(not(feature = "secure"))]
        {
            assert_eq!(q, p, "the slow path takes the cached slot");
            raw::free(q);
            assert_eq!(raw::malloc_cached(16, 16), p);
            raw::free(p);
        }
        #[cfg(feature = "secure")]
        {
            assert!(!q.is_null());
            let r = raw::malloc_cached(16, 16);
            assert!(!r.is_null(), "the fast path serves again");
            raw::free(q);
            raw::free(r);
        }
    }
    // A thread without a heap finds none on the fast path, with no request
    // pending (the empty heap's caches are empty, and the hardened build's
    // way past its cache declines it): the slow path makes the heap.
    std::thread::spawn(|| {
        // SAFETY: 16 is a power of two; the block is freed once.
        unsafe {
            assert!(!purger::poll_pending());
            assert!(raw::malloc_cached(16, 16).is_null(), "no heap yet");
            assert!(raw::malloc_cached(2000, 16).is_null(), "no heap yet");
            let p = raw::malloc(16, 16);
            assert!(!p.is_null());
            raw::free(p);
        }
    })
    .join()
    .unwrap();
}
