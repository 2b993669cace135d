//! The block pool behind [`crate::Arena`]: released arena blocks are kept,
//! purged, for the next arena instead of going back to the OS.
//!
//! Policy (see `docs/defaults.md` for the measurements):
//! - **Exact-size reuse.** Arena blocks come in a few sizes (powers of two from
//!   [`FIRST_BLOCK`](crate::runtime::arena::FIRST_BLOCK) to
//!   [`MAX_BLOCK_GROWTH`](crate::runtime::arena::MAX_BLOCK_GROWTH), page multiples
//!   above), so a request is served only by a pooled block of exactly its
//!   size, most recently pooled first. Nothing is split, a small arena never
//!   pins a large block that a large arena will then map afresh, and the most
//!   recently released block is the one most likely still resident.
//! - **Capped in bytes.** When a block would push the pool over its cap the
//!   oldest pooled blocks are unmapped first; a block larger than the cap is
//!   unmapped at once.
//! - **Purged when pooled.** Every pooled block is `madvise`d with the pool's
//!   [`Purge`] advice; if the call fails the block is unmapped, not pooled
//!   (a failed purge would leave the pool holding dirty pages it believes
//!   clean).
//! - **Owned.** Pooled blocks belong to the [`BlockPool`] value, whose `Drop`
//!   unmaps them. The per-thread default pool is an `Arc` held by a
//!   thread-local and by every arena using it, so it is dropped, and its blocks
//!   unmapped, when the thread has exited *and* the last arena drawing from it
//!   is gone — whatever the order of the thread-local destructors (a
//!   thread-local `Vec` of raw blocks would leak: its destructor would free
//!   the `Vec` and strand the blocks).

use core::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::memory::layout::os_page;
use crate::os::source::{PageSource, Purge, SystemPages};

/// Default cap of a [`BlockPool`], in bytes: 64 MiB (per pool, so per thread
/// for the thread-default pools).
///
/// Measured with `examples/arena_churn.rs` (see `docs/defaults.md`):
/// with one 1–64 MiB arena alive at a time, a 64 MiB cap removes 97 % of the
/// page faults of unpooled arenas (3.1× faster); 96 MiB and above remove the
/// rest but then only hold more purged-but-resident (`MADV_FREE`) pages, the
/// seed's "too big a pool holds pages past the optimum".
///
/// ```
/// assert_eq!(pagewise::arena::DEFAULT_POOL_CAP, 64 << 20);
/// ```
pub const DEFAULT_POOL_CAP: usize = 64 << 20;

/// How a [`BlockPool`] behaves.
///
/// ```
/// use pagewise::arena::{BlockPoolConfig, DEFAULT_POOL_CAP};
/// use pagewise::Purge;
/// let c = BlockPoolConfig::default();
/// assert_eq!(c.cap_bytes, DEFAULT_POOL_CAP);
/// assert_eq!(c.purge, Purge::Free);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockPoolConfig {
    /// Most bytes of released blocks kept for reuse. 0 disables pooling.
    pub cap_bytes: usize,
    /// How pooled blocks are purged before they are kept.
    pub purge: Purge,
}

impl Default for BlockPoolConfig {
    fn default() -> Self {
        BlockPoolConfig {
            cap_bytes: DEFAULT_POOL_CAP,
            purge: Purge::Free,
        }
    }
}

/// Counters of a [`BlockPool`].
///
/// ```
/// use pagewise::arena::BlockPool;
/// let pool = BlockPool::thread_default();
/// let s = pool.stats();
/// assert!(s.pooled_bytes <= pool.config().cap_bytes);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockPoolStats {
    /// Blocks currently pooled.
    pub pooled_blocks: usize,
    /// Bytes currently pooled.
    pub pooled_bytes: usize,
    /// Highest value `pooled_bytes` has reached.
    pub peak_pooled_bytes: usize,
    /// Blocks handed out that were mapped fresh from the page source.
    pub fresh_blocks: u64,
    /// Blocks handed out that came from the pool.
    pub reused_blocks: u64,
    /// Blocks given back to the pool by arenas.
    pub returned_blocks: u64,
    /// Pooled blocks unmapped to stay under the cap (oldest first).
    pub evicted_blocks: u64,
    /// Returned blocks unmapped at once because they alone exceed the cap.
    pub oversize_blocks: u64,
    /// Returned blocks whose purge failed, and which were unmapped instead.
    pub purge_failures: u64,
    /// Blocks unmapped by this pool, for any reason (including drop and trim).
    pub unmapped_blocks: u64,
    /// Bytes unmapped by this pool.
    pub unmapped_bytes: u64,
}

struct FreeBlock {
    ptr: NonNull<u8>,
    size: usize,
}

struct Inner {
    /// Oldest first: reuse searches from the end, eviction takes the front.
    free: Vec<FreeBlock>,
    stats: BlockPoolStats,
}

// SAFETY: the pooled blocks are owned exclusively by the pool (no other
// pointer to them is used while they are pooled), so moving that ownership to
// another thread is sound.
unsafe impl Send for Inner {}

/// A capped pool of released arena blocks, shared by every arena drawing
/// from it (across threads: it is `Sync`, share it in an `Arc`).
///
/// ```
/// use std::sync::Arc;
/// use pagewise::arena::{Arena, BlockPool, BlockPoolConfig};
/// use pagewise::{FakePages, PageSource};
///
/// let pages: &'static FakePages = Box::leak(Box::new(FakePages::new()));
/// let pool = Arc::new(BlockPool::new(pages, BlockPoolConfig::default()));
/// {
///     let a = Arena::with_pool(pool.clone());
///     a.alloc([0u8; 100]);
/// } // the arena's block goes back to the pool
/// let b = Arena::with_pool(pool.clone());
/// b.alloc(1u64); // and is reused: no new mapping
/// assert_eq!(pool.stats().reused_blocks, 1);
/// assert_eq!(pages.syscalls().mmap, 1);
/// ```
pub struct BlockPool<S: PageSource + 'static = SystemPages> {
    source: &'static S,
    config: BlockPoolConfig,
    inner: Mutex<Inner>,
}

/// The page source of the per-thread default pools.
static ARENA_PAGES: SystemPages = SystemPages::new();

std::thread_local! {
    static THREAD_POOL: Arc<BlockPool<SystemPages>> =
        Arc::new(BlockPool::new(&ARENA_PAGES, BlockPoolConfig::default()));
}

impl BlockPool<SystemPages> {
    /// This thread's default pool (used by [`Arena::new`](crate::Arena::new)),
    /// with [`BlockPoolConfig::default`], drawing from one process-wide
    /// [`SystemPages`] whose counters [`source`](BlockPool::source) exposes.
    ///
    /// Once the thread has exited (and during its thread-local destructors) a
    /// fresh private pool is returned instead.
    ///
    /// ```
    /// use pagewise::arena::BlockPool;
    /// use std::sync::Arc;
    /// assert!(Arc::ptr_eq(&BlockPool::thread_default(), &BlockPool::thread_default()));
    /// ```
    pub fn thread_default() -> Arc<BlockPool<SystemPages>> {
        THREAD_POOL
            .try_with(Arc::clone)
            .unwrap_or_else(|_| Arc::new(BlockPool::new(&ARENA_PAGES, BlockPoolConfig::default())))
    }
}

impl<S: PageSource + 'static> BlockPool<S> {
    /// An empty pool drawing blocks from `source`.
    ///
    /// ```
    /// use pagewise::arena::{BlockPool, BlockPoolConfig};
    /// use pagewise::{Purge, SystemPages};
    /// static PAGES: SystemPages = SystemPages::new();
    /// let pool = BlockPool::new(&PAGES, BlockPoolConfig { cap_bytes: 8 << 20, purge: Purge::DontNeed });
    /// assert_eq!(pool.stats().pooled_bytes, 0);
    /// ```
    pub fn new(source: &'static S, config: BlockPoolConfig) -> Self {
        BlockPool {
            source,
            config,
            inner: Mutex::new(Inner {
                free: Vec::new(),
                stats: BlockPoolStats::default(),
            }),
        }
    }

    /// The pool's configuration.
    ///
    /// ```
    /// use pagewise::arena::{BlockPool, BlockPoolConfig};
    /// assert_eq!(*BlockPool::thread_default().config(), BlockPoolConfig::default());
    /// ```
    pub fn config(&self) -> &BlockPoolConfig {
        &self.config
    }

    /// The page source blocks come from (its syscall counters included).
    ///
    /// ```
    /// use pagewise::arena::BlockPool;
    /// use pagewise::PageSource;
    /// let pool = BlockPool::thread_default();
    /// let before = pool.source().syscalls().mmap;
    /// pagewise::Arena::new().alloc(1u8);
    /// assert!(pool.source().syscalls().mmap <= before + 1);
    /// ```
    pub fn source(&self) -> &'static S {
        self.source
    }

    /// A snapshot of the pool's counters.
    ///
    /// ```
    /// use pagewise::arena::{Arena, BlockPool};
    /// drop(Arena::new().alloc(7u8));
    /// let s = BlockPool::thread_default().stats();
    /// assert!(s.fresh_blocks + s.reused_blocks >= 1);
    /// ```
    pub fn stats(&self) -> BlockPoolStats {
        self.lock().stats
    }

    /// Unmaps every pooled block; returns the bytes given back to the OS.
    ///
    /// ```
    /// use pagewise::arena::{Arena, BlockPool};
    /// drop(Arena::new().alloc(7u8)); // one block is now pooled
    /// let pool = BlockPool::thread_default();
    /// assert!(pool.trim() > 0);
    /// assert_eq!(pool.stats().pooled_bytes, 0);
    /// ```
    pub fn trim(&self) -> usize {
        let drained: Vec<FreeBlock> = {
            let mut g = self.lock();
            g.stats.pooled_blocks = 0;
            g.stats.pooled_bytes = 0;
            core::mem::take(&mut g.free)
        };
        let bytes = drained.iter().map(|b| b.size).sum();
        self.unmap_blocks(drained);
        bytes
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the free list
        // inconsistent (every update is a push/remove plus counters), so a
        // poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A block of exactly `size` bytes (a multiple of the OS page), reused if
    /// one is pooled, else freshly mapped (then the flag is true). Its
    /// contents are unspecified.
    pub(crate) fn take(&self, size: usize) -> Option<(NonNull<u8>, bool)> {
        debug_assert!(size > 0 && size % os_page() == 0);
        {
            let mut g = self.lock();
            if let Some(i) = g.free.iter().rposition(|b| b.size == size) {
                let b = g.free.remove(i);
                g.stats.pooled_blocks -= 1;
                g.stats.pooled_bytes -= size;
                g.stats.reused_blocks += 1;
                return Some((b.ptr, false));
            }
        }
        let p = self.source.map(size, os_page())?;
        self.lock().stats.fresh_blocks += 1;
        Some((p, true))
    }

    /// Takes back a block handed out by [`take`](Self::take).
    ///
    /// # Safety
    /// `ptr..ptr+size` was returned by `take(size)` on this pool and holds no
    /// live data; the caller never uses it again.
    pub(crate) unsafe fn give(&self, ptr: NonNull<u8>, size: usize) {
        self.lock().stats.returned_blocks += 1;
        if size > self.config.cap_bytes {
            self.lock().stats.oversize_blocks += 1;
            self.unmap_blocks(vec![FreeBlock { ptr, size }]);
            return;
        }
        // SAFETY: the caller guarantees the block is a whole, page-aligned
        // mapping of our source with no live data.
        if !unsafe { self.source.purge(ptr, size, self.config.purge) } {
            self.lock().stats.purge_failures += 1;
            self.unmap_blocks(vec![FreeBlock { ptr, size }]);
            return;
        }
        let evicted = {
            let mut g = self.lock();
            let mut evict = 0;
            let mut bytes = g.stats.pooled_bytes;
            while bytes + size > self.config.cap_bytes {
                bytes -= g.free[evict].size;
                evict += 1;
            }
            let evicted: Vec<FreeBlock> = g.free.drain(..evict).collect();
            g.stats.evicted_blocks += evict as u64;
            g.free.push(FreeBlock { ptr, size });
            g.stats.pooled_blocks = g.free.len();
            g.stats.pooled_bytes = bytes + size;
            g.stats.peak_pooled_bytes = g.stats.peak_pooled_bytes.max(bytes + size);
            evicted
        };
        self.unmap_blocks(evicted);
    }

    /// Unmaps blocks that are no longer pooled (the lock is not held).
    fn unmap_blocks(&self, blocks: Vec<FreeBlock>) {
        if blocks.is_empty() {
            return;
        }
        let (n, bytes) = (blocks.len(), blocks.iter().map(|b| b.size).sum::<usize>());
        for b in blocks {
            // SAFETY: every block passed here is a whole mapping of our source
            // that the pool owned exclusively and has just stopped tracking.
            unsafe { self.source.unmap(b.ptr, b.size) };
        }
        let mut g = self.lock();
        g.stats.unmapped_blocks += n as u64;
        g.stats.unmapped_bytes += bytes as u64;
    }
}

impl<S: PageSource + 'static> Drop for BlockPool<S> {
    fn drop(&mut self) {
        // The pool owns its blocks: dropping it (thread exit for the default
        // pool, once no arena refers to it) gives them back for real.
        self.trim();
    }
}

impl<S: PageSource + 'static> core::fmt::Debug for BlockPool<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BlockPool")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}
