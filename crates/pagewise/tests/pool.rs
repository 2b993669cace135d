//! Ref-counted pools: placement, exact waste accounting, handle lifetimes, W^X.

use pagewise::pool::{Allocation, Fit, PoolConfig, PoolStats, Pools, Protection};
use pagewise::{FakePages, PageSource};

const K: usize = 1 << 10;
const PS: usize = 64 * K;

fn fake() -> &'static FakePages {
    Box::leak(Box::new(FakePages::new()))
}

fn pools(pages: &'static FakePages, open: usize, fit: Fit) -> Pools<FakePages> {
    Pools::with_source(
        pages,
        PoolConfig {
            open_pools: open,
            fit,
            ..PoolConfig::default()
        },
    )
}

fn sums(s: &PoolStats) -> bool {
    s.allocated == s.asked_for + s.lwaste + s.swaste + s.nwaste + s.owaste
}

/// Three open pools with 4K, 14K and 34K left.
fn three_pools(p: &Pools<FakePages>) -> Vec<Allocation<FakePages>> {
    vec![
        p.alloc(60 * K).unwrap(),
        p.alloc(50 * K).unwrap(),
        p.alloc(30 * K).unwrap(),
    ]
}

#[test]
fn fits_choose_as_named() {
    for (fit, small, mid) in [(Fit::Best, 0, 1), (Fit::First, 0, 1), (Fit::Worst, 2, 2)] {
        let pages = fake();
        let p = pools(pages, 4, fit);
        let h = three_pools(&p);
        assert_eq!(p.stats().pools_created, 3);
        let a = p.alloc(3 * K).unwrap(); // fits all three
        assert!(a.same_pool(&h[small]), "{fit:?} small");
        let b = p.alloc(10 * K).unwrap(); // fits the 14K and 34K pools
        assert!(b.same_pool(&h[mid]), "{fit:?} mid");
        assert_eq!(pages.syscalls().mmap, 3);
        assert!(sums(&p.stats()));
    }
}

#[test]
fn best_fit_differs_from_first_fit() {
    let pages = fake();
    let p = pools(pages, 4, Fit::Best);
    let h = [p.alloc(30 * K).unwrap(), p.alloc(60 * K).unwrap()]; // 34K, 4K left
    assert!(p.alloc(4 * K).unwrap().same_pool(&h[1]));
    let pages = fake();
    let p = pools(pages, 4, Fit::First);
    let h = [p.alloc(30 * K).unwrap(), p.alloc(60 * K).unwrap()];
    assert!(p.alloc(4 * K).unwrap().same_pool(&h[0]));
}

#[test]
fn new_pool_replaces_an_open_one_only_when_roomier() {
    let pages = fake();
    let p = pools(pages, 1, Fit::Best);
    let _a = p.alloc(60 * K).unwrap(); // open: 4K left
    let _b = p.alloc(10 * K).unwrap(); // new pool with 54K left replaces it
    let s = p.stats();
    assert_eq!(
        (s.swaste, s.nwaste, s.owaste),
        (4 * K as u64, 0, 54 * K as u64)
    );
    let _c = p.alloc(60 * K).unwrap(); // new pool with 4K left: not kept
    let s = p.stats();
    assert_eq!(
        (s.swaste, s.nwaste, s.owaste),
        (4 * K as u64, 4 * K as u64, 54 * K as u64)
    );
    assert_eq!((s.allocated, s.asked_for), (3 * PS as u64, 130 * K as u64));
    assert!(sums(&s));
    assert_eq!(s.overallocation(), (3 * PS) as f64 / (130 * K) as f64);
}

#[test]
fn large_requests_get_their_own_pool() {
    let pages = fake();
    let p = pools(pages, 4, Fit::Best);
    let big = p.alloc(100_000).unwrap();
    let s = p.stats();
    // Its pool is the request rounded up to whole OS pages (25 of 4 KiB).
    let page = pagewise::layout::os_page();
    let size = 100_000usize.div_ceil(page) * page;
    assert_eq!(
        (s.large_pools, s.allocated, s.lwaste, s.owaste),
        (1, size as u64, size as u64 - 100_000, 0)
    );
    assert_eq!(big.pool_size(), size);
    // Exactly the threshold is still small.
    let edge = p.alloc(PS).unwrap();
    assert_eq!(p.stats().large_pools, 1);
    assert_eq!(edge.pool_size(), PS);
    // Not kept open: it dies with its handle.
    drop(big);
    assert_eq!(pages.syscalls().munmap, 1);
    assert!(sums(&p.stats()));
}

#[test]
fn granule_rounding_is_asked_for() {
    let pages = fake();
    let p = pools(pages, 4, Fit::Best);
    let a = p.alloc(1).unwrap();
    let b = p.alloc(0).unwrap();
    let c = p.alloc(33).unwrap();
    assert_eq!((a.len(), b.len(), c.len()), (16, 16, 48));
    assert_eq!(
        b.as_ptr().as_ptr() as usize - a.as_ptr().as_ptr() as usize,
        16
    );
    let s = p.stats();
    assert_eq!((s.requests, s.requested, s.asked_for), (3, 34, 80));
    assert!(sums(&s));
}

#[test]
fn accounting_sums_exactly_on_a_random_trace() {
    for fit in [Fit::First, Fit::Best, Fit::Worst] {
        for open in [1, 2, 4, 16] {
            let pages = fake();
            let p = pools(pages, open, fit);
            let mut live = Vec::new();
            let mut seed = 99u64 + open as u64;
            let mut created_bytes = 0u64;
            for i in 0..3000 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = (seed >> 33) as usize;
                let size = if r % 50 == 0 {
                    64 * K + r % (200 * K)
                } else {
                    100 + r % 4000
                };
                let before = p.stats().allocated;
                live.push(p.alloc(size).unwrap());
                created_bytes += p.stats().allocated - before;
                if i % 3 == 0 {
                    live.swap_remove(r % live.len());
                }
                let s = p.stats();
                assert!(sums(&s), "{fit:?} {open} step {i}: {s:?}");
                assert_eq!(s.live_bytes, pages.syscalls().mapped_bytes);
            }
            let s = p.stats();
            assert_eq!(s.allocated, created_bytes);
            assert_eq!(s.pools_created, pages.syscalls().mmap);
            assert!(s.owaste <= (open * PS) as u64);
            drop(live);
            drop(p);
            assert_eq!(pages.syscalls().mapped_bytes, 0);
            assert_eq!(pages.syscalls().munmap, pages.syscalls().mmap);
        }
    }
}

#[test]
fn open_pool_outlives_its_handles_while_the_allocator_holds_it() {
    let pages = fake();
    let p = pools(pages, 4, Fit::Best);
    let a = p.alloc(100).unwrap();
    drop(a);
    assert_eq!(pages.syscalls().munmap, 0, "still open");
    let b = p.alloc(100).unwrap(); // same pool, continues after `a`
    drop(p);
    assert_eq!(pages.syscalls().munmap, 0, "kept by `b`");
    assert_eq!(b.as_slice().len(), 112);
    drop(b);
    let c = pages.syscalls();
    assert_eq!((c.munmap, c.mapped_bytes), (1, 0));
}

#[test]
fn replaced_pool_is_freed_after_its_last_handle() {
    let pages = fake();
    let p = pools(pages, 1, Fit::Best);
    let a1 = p.alloc(30 * K).unwrap();
    let a2 = p.alloc(30 * K).unwrap(); // same pool, 4K left
    assert!(a1.same_pool(&a2));
    let b = p.alloc(10 * K).unwrap(); // replaces it
    assert!(!b.same_pool(&a1));
    assert_eq!(p.stats().live_pools, 2);
    drop(a1);
    assert_eq!(pages.syscalls().munmap, 0, "a2 still holds it");
    drop(a2);
    assert_eq!(pages.syscalls().munmap, 1);
    let s = p.stats();
    assert_eq!(
        (s.live_pools, s.live_bytes, s.peak_live_bytes),
        (1, PS as u64, 2 * PS as u64)
    );
    drop(b);
    assert_eq!(pages.syscalls().munmap, 1, "b's pool is still open");
    drop(p);
    assert_eq!(pages.syscalls().munmap, 2);
}

#[test]
fn handles_may_die_on_other_threads() {
    let pages = fake();
    let p = pools(pages, 2, Fit::Best);
    let hs: Vec<_> = (0..100).map(|i| p.alloc(1000 + i).unwrap()).collect();
    drop(p);
    let n_pools = pages.syscalls().mmap;
    std::thread::spawn(move || drop(hs)).join().unwrap();
    let c = pages.syscalls();
    assert_eq!((c.munmap, c.mapped_bytes), (n_pools, 0));
}

#[test]
fn executable_pools_are_never_writable_and_executable_at_once() {
    let pages = fake();
    let p = Pools::with_source(
        pages,
        PoolConfig {
            executable: true,
            ..PoolConfig::default()
        },
    );
    let mut a = p.alloc(32).unwrap();
    let b = p.alloc(32).unwrap();
    assert!(
        a.as_mut_slice().is_none(),
        "no unguarded slice in an executable pool"
    );
    assert_eq!(a.with_writable(|s| s.fill(0xC3)), Some(()));
    // A flip is refused while a write is in progress on the pool.
    assert_eq!(a.with_writable(|_| b.make_executable()), Some(false));
    assert!(b.make_executable());
    assert_eq!(
        a.protection(),
        Protection::ReadExecute,
        "the whole pool flips"
    );
    assert_eq!(a.with_writable(|_| ()), None);
    assert!(a.make_executable(), "already executable: no call");
    assert_eq!(p.stats().mprotect_calls, 1);
    assert!(a.make_writable());
    assert_eq!(a.with_writable(|s| s[0]), Some(0xC3));
    assert_eq!(p.stats().mprotect_calls, 2);
    // Non-executable allocators refuse to flip and make no call.
    let q = Pools::with_source(pages, PoolConfig::default());
    assert!(!q.alloc(1).unwrap().make_executable());
    assert_eq!(q.stats().mprotect_calls, 0);
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn executable_pool_runs_code() {
    let p = Pools::with_config(PoolConfig {
        executable: true,
        ..PoolConfig::default()
    });
    let mut code = p.alloc(6).unwrap();
    // mov eax, 42 ; ret
    code.with_writable(|b| b[..6].copy_from_slice(&[0xB8, 42, 0, 0, 0, 0xC3]))
        .unwrap();
    let calls = pagewise::pool::system_mprotect_calls();
    assert!(code.make_executable());
    assert!(pagewise::pool::system_mprotect_calls() > calls);
    // SAFETY: the bytes are a complete x86-64 function returning 42 in eax,
    // the page is read+execute, and the pool stays mapped while `code` lives.
    let f: extern "C" fn() -> i32 = unsafe { core::mem::transmute(code.as_ptr().as_ptr()) };
    assert_eq!(f(), 42);
    assert_eq!(p.stats().mprotect_calls, 1);
}
