//! Arena and block-pool behaviour, checked by counts (syscalls, bytes), never time.

use core::alloc::Layout;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pagewise::arena::{
    Arena, BlockPool, BlockPoolConfig, BlockPoolStats, FIRST_BLOCK, MAX_BLOCK_GROWTH,
};
use pagewise::{FakePages, PageSource, Purge, SyscallCounts};

const K: usize = 1 << 10;
const M: usize = 1 << 20;

fn fake() -> &'static FakePages {
    Box::leak(Box::new(FakePages::new()))
}

fn pool_on(pages: &'static FakePages, cap: usize, purge: Purge) -> Arc<BlockPool<FakePages>> {
    Arc::new(BlockPool::new(
        pages,
        BlockPoolConfig {
            cap_bytes: cap,
            purge,
        },
    ))
}

/// Serialises the tests that use the process-wide system arena pages, so their
/// counters can be compared exactly.
static SYSTEM: Mutex<()> = Mutex::new(());

/// Allocates `bytes` in 1000-byte pieces, writing each.
fn fill<S: PageSource>(a: &Arena<S>, bytes: usize) {
    for _ in 0..bytes / 1000 {
        a.alloc([0xA5u8; 1000]);
    }
}

#[test]
fn blocks_are_reused_across_arenas() {
    let pages = fake();
    let pool = pool_on(pages, 64 * M, Purge::Free);
    for _ in 0..10 {
        let a = Arena::with_pool(pool.clone());
        fill(&a, 100 * K); // 64 KiB + 128 KiB blocks
        assert_eq!(a.stats().blocks, 2);
        assert_eq!(a.allocated_bytes(), FIRST_BLOCK + 2 * FIRST_BLOCK);
    }
    let s = pool.stats();
    assert_eq!(
        (s.fresh_blocks, s.reused_blocks, s.returned_blocks),
        (2, 18, 20)
    );
    assert_eq!((s.pooled_blocks, s.pooled_bytes), (2, 192 * K));
    let c = pages.syscalls();
    assert_eq!((c.mmap, c.munmap, c.madvise), (2, 0, 20));
    assert_eq!(c.purged_bytes, 10 * 192 * K as u64);
    drop(pool);
    assert_eq!(pages.syscalls().mapped_bytes, 0);
    assert_eq!(pages.syscalls().munmap, 2);
}

#[test]
fn blocks_double_up_to_the_growth_cap() {
    let pages = fake();
    let pool = pool_on(pages, 0, Purge::Free);
    let a = Arena::with_pool(pool.clone());
    fill(&a, 20 * M);
    // 64K, 128K, ..., 4M (7 blocks, 8M - 64K in all), then 4 MiB blocks.
    let growth: usize = (0..7).map(|i| FIRST_BLOCK << i).sum();
    let s = a.stats();
    let extra = s.blocks - 7;
    assert_eq!(s.block_bytes, growth + extra * MAX_BLOCK_GROWTH);
    assert!(s.block_bytes >= 20 * M && s.block_bytes - 20 * M < MAX_BLOCK_GROWTH + 1000 * s.blocks);
    assert_eq!(s.fresh_blocks, s.blocks as u64);
    assert_eq!(pages.syscalls().mmap, s.blocks as u64);
    drop(a);
    let c = pages.syscalls();
    assert_eq!((c.munmap, c.mapped_bytes, c.madvise), (c.mmap, 0, 0));
}

#[test]
fn oversize_request_gets_its_own_block_and_keeps_the_current_one() {
    let pages = fake();
    let pool = pool_on(pages, 64 * M, Purge::Free);
    let a = Arena::with_pool(pool.clone());
    let x = a.alloc(1u64) as *mut u64 as usize;
    // The oversize block is the request rounded up to the OS page; the
    // request leaves it less room than the small block has.
    let page = pagewise::layout::os_page();
    let want = 10 * M + page - 8;
    let big = a.alloc_layout(Layout::from_size_align(want, 8).unwrap());
    let y = a.alloc(2u64) as *mut u64 as usize;
    assert_eq!(y, x + 8, "the small block stays current");
    assert_ne!(big.as_ptr() as usize, 0);
    let s = a.stats();
    assert_eq!((s.blocks, s.block_bytes), (2, FIRST_BLOCK + 10 * M + page));
    assert_eq!(s.requested_bytes, 16 + want);
}

#[test]
fn cap_evicts_the_oldest_blocks() {
    let pages = fake();
    let pool = pool_on(pages, 256 * K, Purge::Free);
    let a = Arena::with_pool(pool.clone());
    fill(&a, 300 * K); // 64K + 128K + 256K
    assert_eq!(a.stats().blocks, 3);
    drop(a); // gives 64K, 128K, then 256K: the first two are evicted
    let s = pool.stats();
    assert_eq!((s.pooled_blocks, s.pooled_bytes), (1, 256 * K));
    assert_eq!((s.evicted_blocks, s.unmapped_blocks), (2, 2));
    assert_eq!(s.unmapped_bytes, 192 * K as u64);
    assert_eq!(s.peak_pooled_bytes, 256 * K);
    let c = pages.syscalls();
    assert_eq!((c.munmap, c.mapped_bytes), (2, 256 * K as u64));
}

#[test]
fn block_larger_than_the_cap_is_unmapped_not_purged() {
    let pages = fake();
    let pool = pool_on(pages, 64 * K, Purge::Free);
    let a = Arena::with_pool(pool.clone());
    fill(&a, 100 * K); // 64K + 128K
    drop(a);
    let s = pool.stats();
    assert_eq!(
        (s.oversize_blocks, s.pooled_bytes, s.pooled_blocks),
        (1, 64 * K, 1)
    );
    let c = pages.syscalls();
    assert_eq!((c.madvise, c.munmap), (1, 1));
}

#[test]
fn zero_cap_disables_pooling() {
    let pages = fake();
    let pool = pool_on(pages, 0, Purge::Free);
    for _ in 0..3 {
        let a = Arena::with_pool(pool.clone());
        fill(&a, 10 * K);
    }
    let c = pages.syscalls();
    assert_eq!((c.mmap, c.munmap, c.madvise, c.mapped_bytes), (3, 3, 0, 0));
    assert_eq!(
        pool.stats(),
        BlockPoolStats {
            fresh_blocks: 3,
            returned_blocks: 3,
            oversize_blocks: 3,
            unmapped_blocks: 3,
            unmapped_bytes: 3 * FIRST_BLOCK as u64,
            ..BlockPoolStats::default()
        }
    );
}

/// FakePages whose purge can be made to fail.
struct FlakyPages {
    inner: FakePages,
    fail: AtomicBool,
}

// SAFETY: every call forwards to `FakePages`, which upholds the contract;
// a refused purge leaves memory untouched, which the contract allows.
unsafe impl PageSource for FlakyPages {
    fn map(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        self.inner.map(size, align)
    }
    unsafe fn unmap(&self, ptr: NonNull<u8>, size: usize) {
        // SAFETY: forwarded contract.
        unsafe { self.inner.unmap(ptr, size) }
    }
    unsafe fn purge(&self, ptr: NonNull<u8>, size: usize, how: Purge) -> bool {
        if self.fail.load(Ordering::Relaxed) {
            return false;
        }
        // SAFETY: forwarded contract.
        unsafe { self.inner.purge(ptr, size, how) }
    }
    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }
    fn syscalls(&self) -> SyscallCounts {
        self.inner.syscalls()
    }
}

#[test]
fn block_whose_purge_failed_is_not_pooled() {
    let pages: &'static FlakyPages = Box::leak(Box::new(FlakyPages {
        inner: FakePages::new(),
        fail: AtomicBool::new(true),
    }));
    let pool = Arc::new(BlockPool::new(pages, BlockPoolConfig::default()));
    let a = Arena::with_pool(pool.clone());
    fill(&a, 10 * K);
    drop(a);
    let s = pool.stats();
    assert_eq!(
        (s.purge_failures, s.pooled_blocks, s.unmapped_blocks),
        (1, 0, 1)
    );
    assert_eq!(pages.syscalls().mapped_bytes, 0);
    // Once purges work again, blocks are pooled.
    pages.fail.store(false, Ordering::Relaxed);
    let a = Arena::with_pool(pool.clone());
    fill(&a, 10 * K);
    drop(a);
    assert_eq!(pool.stats().pooled_blocks, 1);
}

#[test]
fn dontneed_pool_zeroes_and_counts_purged_bytes() {
    let pages = fake();
    let pool = pool_on(pages, 64 * M, Purge::DontNeed);
    let a = Arena::with_pool(pool.clone());
    fill(&a, 10 * K);
    drop(a);
    let b = Arena::with_pool(pool.clone());
    let p = b.alloc_layout(Layout::from_size_align(1000, 1).unwrap());
    // SAFETY: 1000 fresh bytes of ours; the block was purged with DontNeed,
    // which FakePages (like the kernel) makes read as zeros.
    let bytes = unsafe { core::slice::from_raw_parts(p.as_ptr(), 1000) };
    assert!(bytes.iter().all(|&b| b == 0));
    let c = pages.syscalls();
    assert_eq!(
        (c.mmap, c.madvise, c.purged_bytes),
        (1, 1, FIRST_BLOCK as u64)
    );
}

#[test]
fn reset_keeps_the_current_block_and_pools_the_rest() {
    let pages = fake();
    let pool = pool_on(pages, 64 * M, Purge::Free);
    let mut a = Arena::with_pool(pool.clone());
    fill(&a, 300 * K); // 64K + 128K + 256K
    a.reset();
    let s = a.stats();
    assert_eq!(
        (s.blocks, s.block_bytes, s.allocations, s.resets),
        (1, 256 * K, 0, 1)
    );
    assert_eq!(pool.stats().pooled_bytes, 192 * K);
    fill(&a, 200 * K); // fits in the kept block
    assert_eq!(pages.syscalls().mmap, 3);
    assert_eq!(a.stats().blocks, 1);
    fill(&a, 200 * K); // grows to 512K: a fresh block
    assert_eq!(pages.syscalls().mmap, 4);
}

#[test]
fn values_do_not_overlap_and_are_aligned() {
    let pages = fake();
    let a = Arena::with_pool(pool_on(pages, 64 * M, Purge::Free));
    let mut seen: Vec<(usize, usize, u8)> = Vec::new();
    let mut seed = 12345u64;
    for i in 0..5000 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let size = (seed >> 33) as usize % 3000;
        let align = 1usize << ((seed >> 20) % 14); // up to 8 KiB, above the OS page
        let p = a.alloc_layout(Layout::from_size_align(size, align).unwrap());
        assert_eq!(p.as_ptr() as usize % align, 0);
        // SAFETY: `size` fresh bytes of ours.
        unsafe { core::ptr::write_bytes(p.as_ptr(), i as u8, size) };
        seen.push((p.as_ptr() as usize, size, i as u8));
    }
    for &(p, size, v) in &seen {
        // SAFETY: still inside the live arena.
        let bytes = unsafe { core::slice::from_raw_parts(p as *const u8, size) };
        assert!(bytes.iter().all(|&b| b == v));
    }
    assert_eq!(a.stats().allocations, 5000);
}

#[test]
fn allocator_api2_collections_grow_in_place() {
    use allocator_api2::vec::Vec as AVec;
    let pages = fake();
    let a = Arena::with_pool(pool_on(pages, 64 * M, Purge::Free));
    let mut v: AVec<u64, _> = AVec::with_capacity_in(4, &a);
    let p0 = v.as_ptr();
    v.extend(0..1000u64);
    assert_eq!(v.as_ptr(), p0, "the last allocation grows in place");
    assert_eq!(v.iter().sum::<u64>(), 999 * 1000 / 2);
    let used = a.stats().requested_bytes;
    drop(v); // the last allocation is rolled back
    let w: AVec<u8, _> = AVec::with_capacity_in(16, &a);
    assert_eq!(w.as_ptr() as usize, p0 as usize);
    assert!(used >= 8000);
    let b = allocator_api2::boxed::Box::new_in([3u32; 10], &a);
    assert_eq!(b.iter().sum::<u32>(), 30);
}

#[test]
fn allocator_resizes_in_place_only_at_the_end() {
    use allocator_api2::alloc::Allocator;
    let pages = fake();
    let a = Arena::with_pool(pool_on(pages, 64 * M, Purge::Free));
    let alloc = &a;
    let l16 = Layout::from_size_align(16, 8).unwrap();
    let l64 = Layout::from_size_align(64, 8).unwrap();
    let x = alloc.allocate(l16).unwrap().cast::<u8>();
    // SAFETY: `x` is 16 fresh bytes of ours.
    unsafe { x.as_ptr().write_bytes(7, 16) };
    let y = alloc.allocate(l16).unwrap().cast::<u8>();
    // SAFETY: `x` was allocated with `l16` by this allocator; it is not the
    // last allocation, so growing it copies.
    let x2 = unsafe { alloc.grow(x, l16, l64) }.unwrap().cast::<u8>();
    assert_ne!(x2, x);
    // SAFETY: the first 16 bytes were copied from `x`.
    assert_eq!(
        unsafe { core::slice::from_raw_parts(x2.as_ptr(), 16) },
        &[7; 16]
    );
    // `x2` is now the last allocation: shrinking and freeing it move the end back.
    // SAFETY: `x2` was allocated with `l64` by this allocator.
    let x3 = unsafe { alloc.shrink(x2, l64, l16) }.unwrap().cast::<u8>();
    assert_eq!(x3, x2);
    // SAFETY: `x3` holds `l16`; after this it is not used.
    unsafe { alloc.deallocate(x3, l16) };
    let z = alloc.allocate(l16).unwrap().cast::<u8>();
    assert_eq!(z, x2, "the freed tail is reused");
    // Freeing something that is not last changes nothing.
    // SAFETY: `y` holds `l16` and is not used again.
    unsafe { alloc.deallocate(y, l16) };
    let w = alloc.allocate(l16).unwrap().cast::<u8>();
    assert_eq!(w.as_ptr() as usize, z.as_ptr() as usize + 16);
}

thread_local! {
    static TEST_POOL: std::cell::RefCell<Option<Arc<BlockPool<FakePages>>>> =
        const { std::cell::RefCell::new(None) };
}

#[test]
fn thread_exit_with_a_non_empty_pool_unmaps_its_blocks() {
    let pages = fake();
    std::thread::spawn(move || {
        let pool = pool_on(pages, 64 * M, Purge::Free);
        TEST_POOL.with(|t| *t.borrow_mut() = Some(pool.clone()));
        let a = Arena::with_pool(pool.clone());
        fill(&a, 300 * K);
        drop(a);
        assert_eq!(pool.stats().pooled_blocks, 3);
        assert_eq!(pages.syscalls().mapped_bytes, 448 * K as u64);
        // The thread exits holding its pool only in a thread-local.
    })
    .join()
    .unwrap();
    let c = pages.syscalls();
    assert_eq!((c.mmap, c.munmap, c.mapped_bytes), (3, 3, 0));
}

#[test]
fn thread_exit_frees_the_default_pool_for_real() {
    let _g = SYSTEM.lock().unwrap_or_else(|e| e.into_inner());
    let before = BlockPool::thread_default().source().syscalls();
    let (weak, pooled) = std::thread::spawn(|| {
        let a = Arena::new();
        fill(&a, 3 * M);
        a.alloc_layout(Layout::from_size_align(6 * M, 8).unwrap());
        drop(a);
        let pool = BlockPool::thread_default();
        let s = pool.stats();
        assert!(s.pooled_blocks > 0);
        (Arc::downgrade(&pool), s.pooled_bytes)
    })
    .join()
    .unwrap();
    assert!(weak.upgrade().is_none(), "the pool died with its thread");
    let after = BlockPool::thread_default().source().syscalls();
    assert_eq!(
        after.mapped_bytes, before.mapped_bytes,
        "every block was unmapped"
    );
    assert_eq!(after.mmap - before.mmap, after.munmap - before.munmap);
    assert!(pooled >= 3 * M);
}

#[test]
fn an_arena_sent_away_keeps_its_pool_alive_until_it_drops() {
    let pages = fake();
    let a = std::thread::spawn(move || {
        let pool = pool_on(pages, 64 * M, Purge::Free);
        TEST_POOL.with(|t| *t.borrow_mut() = Some(pool.clone()));
        let a = Arena::with_pool(pool);
        fill(&a, 100 * K);
        a
    })
    .join()
    .unwrap();
    assert_eq!(pages.syscalls().mapped_bytes, 192 * K as u64);
    fill(&a, 10 * K);
    drop(a); // blocks go back to the pool, whose last owner this was
    let c = pages.syscalls();
    assert_eq!((c.munmap, c.mapped_bytes), (2, 0));
}

#[test]
fn system_arena_churn_reuses_pooled_blocks() {
    let _g = SYSTEM.lock().unwrap_or_else(|e| e.into_inner());
    std::thread::spawn(|| {
        let pool = BlockPool::thread_default();
        let before = pool.source().syscalls();
        for _ in 0..20 {
            let a = Arena::new();
            fill(&a, 2 * M); // 64K..2M: 6 blocks, under the default cap
        }
        let after = pool.source().syscalls();
        assert_eq!(after.mmap - before.mmap, 6, "only the first arena maps");
        assert_eq!(pool.stats().reused_blocks, 19 * 6);
    })
    .join()
    .unwrap();
}
