//! Ref-counted bump pools, the shape of SpiderMonkey's `ExecutableAllocator`
//! (a JIT's code pools): code-sized requests are bumped out of a few open pools, each
//! allocation is an [`Allocation`] handle that keeps its pool mapped, and a
//! pool is unmapped when its last handle (and the allocator, if the pool is
//! still open) lets go of it.
//!
//! Placement ([`Pools::alloc`]):
//! 1. the open pool chosen by [`Fit`] among those with room (default
//!    [`Fit::Best`]: the one with the least space that still fits, which keeps
//!    the roomy pools for the larger requests that would otherwise force a
//!    new pool);
//! 2. a request above [`PoolConfig::large_threshold`] gets a pool of its own,
//!    rounded up to the OS page;
//! 3. otherwise a new pool of [`PoolConfig::pool_size`]; it is kept open if
//!    fewer than [`PoolConfig::open_pools`] are open, else it replaces the open
//!    pool with the least space, but only if it will have more space left.
//!
//! Waste is accounted exactly as the seed names it, so that
//! `allocated == asked_for + lwaste + swaste + nwaste + owaste` always holds:
//! see [`PoolStats`].
//!
//! ```
//! use pagewise::pool::Pools;
//! let pools = Pools::new();
//! let mut code = pools.alloc(100).unwrap();
//! code.as_mut_slice().unwrap().fill(0x90);
//! let s = pools.stats();
//! assert_eq!(s.allocated, s.asked_for + s.lwaste + s.swaste + s.nwaste + s.owaste);
//! ```

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use allocator_api2::alloc::AllocError;

use crate::memory::layout::{align_up, os_page};
pub use crate::os::protect::{system_mprotect_calls, ProtectPages, Protection};
use crate::os::source::SystemPages;

/// Default size of a small pool: 64 KiB (the seed's conclusion, on every
/// platform).
///
/// ```
/// assert_eq!(pagewise::pool::DEFAULT_POOL_SIZE, 64 << 10);
/// ```
pub const DEFAULT_POOL_SIZE: usize = 64 << 10;

/// Default number of small pools kept open: 4, measured with
/// `examples/jit_pools.rs` (see `docs/defaults.md`).
///
/// ```
/// assert_eq!(pagewise::pool::DEFAULT_OPEN_POOLS, 4);
/// ```
pub const DEFAULT_OPEN_POOLS: usize = 4;

/// Default allocation granule: 16 bytes (requests are rounded up to it, so
/// every allocation is 16-aligned, as code entry points like).
///
/// ```
/// assert_eq!(pagewise::pool::DEFAULT_GRANULE, 16);
/// ```
pub const DEFAULT_GRANULE: usize = 16;

/// Which open pool serves a request that several can hold.
///
/// ```
/// assert_eq!(pagewise::pool::Fit::default(), pagewise::pool::Fit::Best);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fit {
    /// The first open pool (in opening order) with room.
    First,
    /// The open pool with the least room that still fits (the seed's winner).
    #[default]
    Best,
    /// The open pool with the most room.
    Worst,
}

/// How a [`Pools`] allocator places requests.
///
/// ```
/// use pagewise::pool::{Fit, PoolConfig};
/// let c = PoolConfig { fit: Fit::First, ..PoolConfig::default() };
/// assert_eq!(c.open_pools, pagewise::pool::DEFAULT_OPEN_POOLS);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Size of a small pool (a multiple of the OS page).
    pub pool_size: usize,
    /// Requests (after rounding to the granule) above this get a pool of their
    /// own. Clamped to `pool_size`.
    pub large_threshold: usize,
    /// How many small pools are kept open (at least 1).
    pub open_pools: usize,
    /// How an open pool is chosen.
    pub fit: Fit,
    /// Requests are rounded up to this power of two (at most the OS page).
    pub granule: usize,
    /// Whether handles may flip their pool to read+execute
    /// ([`Allocation::make_executable`]). Pages are always mapped read+write.
    pub executable: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            pool_size: DEFAULT_POOL_SIZE,
            large_threshold: DEFAULT_POOL_SIZE,
            open_pools: DEFAULT_OPEN_POOLS,
            fit: Fit::Best,
            granule: DEFAULT_GRANULE,
            executable: false,
        }
    }
}

/// Where the bytes of a [`Pools`] allocator went, in four named kinds of waste.
///
/// At every moment `allocated == asked_for + lwaste + swaste + nwaste + owaste`.
///
/// ```
/// use pagewise::pool::Pools;
/// let pools = Pools::new();
/// let _big = pools.alloc(100_000).unwrap(); // its own pool: whole OS pages
/// let s = pools.stats();
/// let page = pagewise::layout::os_page() as u64; // 25 pages of 4 KiB
/// assert_eq!(s.allocated, 100_000u64.div_ceil(page) * page);
/// assert_eq!(s.lwaste, s.allocated - 100_000);
/// assert_eq!(s.overallocation(), s.allocated as f64 / s.asked_for as f64);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Requests served.
    pub requests: u64,
    /// Bytes requested, as passed to [`Pools::alloc`].
    pub requested: u64,
    /// Bytes asked for: requests rounded up to the granule (what SpiderMonkey
    /// counted as `askedFor`).
    pub asked_for: u64,
    /// Bytes of every pool ever mapped.
    pub allocated: u64,
    /// Large-request rounding: a large pool's size minus its request.
    pub lwaste: u64,
    /// Space left in small pools when they were replaced by a roomier one.
    pub swaste: u64,
    /// Excess of new small pools that were not kept open (never used again).
    pub nwaste: u64,
    /// Unused tail of the pools open now (can still be used).
    pub owaste: u64,
    /// Pools mapped (small and large).
    pub pools_created: u64,
    /// Of which large (single-request) pools.
    pub large_pools: u64,
    /// Pools mapped now (open, or kept alive by handles).
    pub live_pools: u64,
    /// Bytes of the pools mapped now.
    pub live_bytes: u64,
    /// Highest value `live_bytes` has reached.
    pub peak_live_bytes: u64,
    /// `mprotect` calls made for this allocator's pools.
    pub mprotect_calls: u64,
}

impl PoolStats {
    /// The over-allocation factor: `allocated / asked_for` (the seed's 1.12×
    /// before, 1.02× with 4 best-fit pools). 1.0 when nothing was asked for.
    ///
    /// ```
    /// assert_eq!(pagewise::pool::PoolStats::default().overallocation(), 1.0);
    /// ```
    pub fn overallocation(&self) -> f64 {
        if self.asked_for == 0 {
            1.0
        } else {
            self.allocated as f64 / self.asked_for as f64
        }
    }

    /// The four waste categories added up (`allocated - asked_for`).
    ///
    /// ```
    /// let pools = pagewise::pool::Pools::new();
    /// let _a = pools.alloc(1000).unwrap();
    /// let s = pools.stats();
    /// assert_eq!(s.waste(), s.allocated - s.asked_for);
    /// ```
    pub fn waste(&self) -> u64 {
        self.lwaste + self.swaste + self.nwaste + self.owaste
    }
}

/// Counters a pool updates when it dies, after the allocator may be gone.
#[derive(Default)]
struct Shared {
    live_pools: AtomicU64,
    live_bytes: AtomicU64,
    peak_live_bytes: AtomicU64,
    mprotect_calls: AtomicU64,
}

/// One mapped pool. Shared (by `Arc`) between the allocator's open list and
/// every handle carved from it; unmapped when the last one drops.
struct Pool<S: ProtectPages + 'static> {
    source: &'static S,
    base: NonNull<u8>,
    size: usize,
    /// Bump offset; only changed under the allocator's lock.
    used: AtomicUsize,
    executable: bool,
    /// Current protection. Content writes hold it shared, flips exclusively.
    prot: RwLock<Protection>,
    shared: Arc<Shared>,
}

// SAFETY: the pool owns its mapping; handles write only their own disjoint
// ranges (through `&mut Allocation`), the bump offset is atomic, and the
// protection is behind a lock. `S: PageSource` is `Sync`.
unsafe impl<S: ProtectPages + 'static> Send for Pool<S> {}
// SAFETY: as above.
unsafe impl<S: ProtectPages + 'static> Sync for Pool<S> {}

impl<S: ProtectPages + 'static> Pool<S> {
    fn available(&self) -> usize {
        self.size - self.used.load(Relaxed)
    }
}

impl<S: ProtectPages + 'static> Drop for Pool<S> {
    fn drop(&mut self) {
        // SAFETY: the last `Arc` is gone, so no handle refers into the mapping,
        // which `source.map(size, ..)` returned.
        unsafe { self.source.unmap(self.base, self.size) };
        self.shared.live_pools.fetch_sub(1, Relaxed);
        self.shared.live_bytes.fetch_sub(self.size as u64, Relaxed);
    }
}

/// An allocation in a pool: `len` bytes at [`as_ptr`](Allocation::as_ptr),
/// valid while the handle lives. The handle keeps its pool mapped; dropping
/// it never frees the bytes individually (pools are bump-only).
///
/// ```
/// let pools = pagewise::pool::Pools::new();
/// let mut a = pools.alloc(5).unwrap();
/// a.as_mut_slice().unwrap()[..5].copy_from_slice(b"hello");
/// assert_eq!(&a.as_slice()[..5], b"hello");
/// assert_eq!(a.len(), 16); // rounded to the granule
/// ```
pub struct Allocation<S: ProtectPages + 'static = SystemPages> {
    pool: Arc<Pool<S>>,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the handle exclusively owns `ptr..ptr+len` inside a pool that is
// `Send + Sync`; shared access (`&Allocation`) only reads.
unsafe impl<S: ProtectPages + 'static> Send for Allocation<S> {}
// SAFETY: as above.
unsafe impl<S: ProtectPages + 'static> Sync for Allocation<S> {}

impl<S: ProtectPages + 'static> Allocation<S> {
    /// Start of the allocation (aligned to the granule).
    ///
    /// ```
    /// let a = pagewise::pool::Pools::new().alloc(1).unwrap();
    /// assert_eq!(a.as_ptr().as_ptr() as usize % 16, 0);
    /// ```
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length in bytes (the request rounded up to the granule).
    ///
    /// ```
    /// assert_eq!(pagewise::pool::Pools::new().alloc(17).unwrap().len(), 32);
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the allocation is empty (never: requests of 0 take a granule).
    ///
    /// ```
    /// assert!(!pagewise::pool::Pools::new().alloc(0).unwrap().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes (always readable: pages are read+write or read+execute).
    /// Fresh allocations read as zeros.
    ///
    /// ```
    /// let a = pagewise::pool::Pools::new().alloc(8).unwrap();
    /// assert_eq!(a.as_slice(), &[0u8; 16]);
    /// ```
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the range is inside the pool's live mapping (kept by
        // `self.pool`), readable under either protection, and only written
        // through `&mut self`.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable; `None` for executable pools, whose protection can
    /// change under a slice (use [`with_writable`](Allocation::with_writable)).
    ///
    /// ```
    /// let mut a = pagewise::pool::Pools::new().alloc(4).unwrap();
    /// a.as_mut_slice().unwrap()[0] = 1;
    /// assert_eq!(a.as_slice()[0], 1);
    /// ```
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        if self.pool.executable {
            return None;
        }
        // SAFETY: a non-executable pool stays read+write for its whole life;
        // the range is ours alone and `&mut self` excludes other access.
        Some(unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// Runs `f` on the writable bytes while the pool is read+write, holding
    /// off any flip to read+execute until it returns. `None` if the pool is
    /// read+execute now.
    ///
    /// ```
    /// use pagewise::pool::{PoolConfig, Pools};
    /// let pools = Pools::with_config(PoolConfig { executable: true, ..PoolConfig::default() });
    /// let mut code = pools.alloc(1).unwrap();
    /// assert_eq!(code.with_writable(|b| { b[0] = 0xC3; b.len() }), Some(16));
    /// assert!(code.make_executable());
    /// assert_eq!(code.with_writable(|b| b[0] = 0), None); // W^X
    /// ```
    pub fn with_writable<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let g = self.pool.prot.read().unwrap_or_else(|e| e.into_inner());
        if *g != Protection::ReadWrite {
            return None;
        }
        // SAFETY: the read lock keeps the pool read+write until `f` returns
        // (flips take the write lock); the range is ours alone.
        let bytes = unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) };
        Some(f(bytes))
    }

    /// The protection of this allocation's pool.
    ///
    /// ```
    /// use pagewise::pool::Protection;
    /// assert_eq!(pagewise::pool::Pools::new().alloc(1).unwrap().protection(), Protection::ReadWrite);
    /// ```
    pub fn protection(&self) -> Protection {
        *self.pool.prot.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Flips the whole pool this allocation lives in to read+execute (one
    /// `mprotect`). False if the pool is not executable, a write through
    /// [`with_writable`](Allocation::with_writable) is in progress, or the OS
    /// refused. Other allocations in the same pool flip with it.
    ///
    /// ```
    /// use pagewise::pool::{PoolConfig, Pools, Protection};
    /// let pools = Pools::with_config(PoolConfig { executable: true, ..PoolConfig::default() });
    /// let code = pools.alloc(64).unwrap();
    /// assert!(code.make_executable());
    /// assert_eq!(code.protection(), Protection::ReadExecute);
    /// assert!(!pools.alloc(64).unwrap().as_slice().is_empty());
    /// assert!(!Pools::new().alloc(1).unwrap().make_executable()); // not an executable allocator
    /// ```
    pub fn make_executable(&self) -> bool {
        self.set_protection(Protection::ReadExecute)
    }

    /// Flips the whole pool back to read+write (one `mprotect`), so code can be
    /// written or patched; nothing in the pool may run meanwhile.
    ///
    /// ```
    /// use pagewise::pool::{PoolConfig, Pools, Protection};
    /// let pools = Pools::with_config(PoolConfig { executable: true, ..PoolConfig::default() });
    /// let code = pools.alloc(64).unwrap();
    /// assert!(code.make_executable() && code.make_writable());
    /// assert_eq!(pools.stats().mprotect_calls, 2);
    /// ```
    pub fn make_writable(&self) -> bool {
        self.set_protection(Protection::ReadWrite)
    }

    fn set_protection(&self, prot: Protection) -> bool {
        let pool = &*self.pool;
        if !pool.executable {
            return false;
        }
        let Ok(mut g) = pool.prot.try_write() else {
            return false;
        };
        if *g == prot {
            return true;
        }
        pool.shared.mprotect_calls.fetch_add(1, Relaxed);
        // SAFETY: the whole pool mapping is page-aligned and live (we hold an
        // `Arc` to it). Writers hold the read lock, which we excluded; Rust
        // code never writes through `as_slice`, so no write races the flip.
        if unsafe { pool.source.protect(pool.base, pool.size, prot) } {
            *g = prot;
            true
        } else {
            false
        }
    }

    /// Size of the pool this allocation lives in.
    ///
    /// ```
    /// let pools = pagewise::pool::Pools::new();
    /// assert_eq!(pools.alloc(10).unwrap().pool_size(), 64 << 10);
    /// assert_eq!(pools.alloc(1 << 20).unwrap().pool_size(), 1 << 20);
    /// ```
    pub fn pool_size(&self) -> usize {
        self.pool.size
    }

    /// True if both allocations live in the same pool.
    ///
    /// ```
    /// let pools = pagewise::pool::Pools::new();
    /// let (a, b) = (pools.alloc(10).unwrap(), pools.alloc(10).unwrap());
    /// assert!(a.same_pool(&b));
    /// ```
    pub fn same_pool(&self, other: &Allocation<S>) -> bool {
        Arc::ptr_eq(&self.pool, &other.pool)
    }
}

impl<S: ProtectPages + 'static> core::fmt::Debug for Allocation<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Allocation")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("pool_size", &self.pool.size)
            .finish()
    }
}

struct State<S: ProtectPages + 'static> {
    /// Open small pools, in opening order (replacement keeps the slot).
    open: Vec<Arc<Pool<S>>>,
    stats: PoolStats,
}

/// The pool allocator: N open small pools, best-fit placement, exact waste
/// accounting. `Sync`; handles are `Send` and may outlive the allocator.
///
/// ```
/// use pagewise::pool::Pools;
/// let pools = Pools::new();
/// let a = pools.alloc(3000).unwrap();
/// let b = pools.alloc(200).unwrap();
/// drop(pools); // the open pool lives on in `a` and `b`
/// assert_eq!(a.len() + b.len(), 3008 + 208);
/// ```
pub struct Pools<S: ProtectPages + 'static = SystemPages> {
    source: &'static S,
    config: PoolConfig,
    state: Mutex<State<S>>,
    shared: Arc<Shared>,
}

/// The page source of [`Pools::new`] allocators.
static POOL_PAGES: SystemPages = SystemPages::new();

impl Pools<SystemPages> {
    /// An allocator with [`PoolConfig::default`] on the system's pages.
    ///
    /// ```
    /// assert_eq!(pagewise::pool::Pools::new().stats().allocated, 0);
    /// ```
    pub fn new() -> Self {
        Pools::with_config(PoolConfig::default())
    }

    /// An allocator with `config` on the system's pages.
    ///
    /// ```
    /// use pagewise::pool::{Fit, PoolConfig, Pools};
    /// let p = Pools::with_config(PoolConfig { fit: Fit::Worst, open_pools: 16, ..PoolConfig::default() });
    /// assert_eq!(p.config().open_pools, 16);
    /// ```
    pub fn with_config(config: PoolConfig) -> Self {
        Pools::with_source(&POOL_PAGES, config)
    }
}

impl Default for Pools<SystemPages> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: ProtectPages + 'static> Pools<S> {
    /// An allocator with `config` drawing pools from `source`.
    ///
    /// ```
    /// use pagewise::pool::{PoolConfig, Pools};
    /// use pagewise::{FakePages, PageSource};
    /// static PAGES: FakePages = FakePages::new();
    /// let pools = Pools::with_source(&PAGES, PoolConfig::default());
    /// let a = pools.alloc(10).unwrap();
    /// assert_eq!(PAGES.syscalls().mmap, 1);
    /// drop((a, pools));
    /// assert_eq!(PAGES.syscalls().munmap, 1);
    /// ```
    pub fn with_source(source: &'static S, mut config: PoolConfig) -> Self {
        config.pool_size = align_up(config.pool_size.max(1), os_page());
        config.large_threshold = config.large_threshold.min(config.pool_size);
        config.open_pools = config.open_pools.max(1);
        assert!(
            config.granule.is_power_of_two() && config.granule <= os_page(),
            "pool granule must be a power of two no larger than the OS page"
        );
        Pools {
            source,
            config,
            state: Mutex::new(State {
                open: Vec::new(),
                stats: PoolStats::default(),
            }),
            shared: Arc::new(Shared::default()),
        }
    }

    /// The configuration (after clamping).
    ///
    /// ```
    /// use pagewise::pool::{PoolConfig, Pools};
    /// let p = Pools::with_config(PoolConfig { open_pools: 0, ..PoolConfig::default() });
    /// assert_eq!(p.config().open_pools, 1);
    /// ```
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// A snapshot of the counters (`owaste` computed now).
    ///
    /// ```
    /// let pools = pagewise::pool::Pools::new();
    /// let _a = pools.alloc(1000).unwrap();
    /// assert_eq!(pools.stats().owaste, (64 << 10) - 1008);
    /// ```
    pub fn stats(&self) -> PoolStats {
        let g = self.lock();
        let mut s = g.stats;
        s.owaste = g.open.iter().map(|p| p.available() as u64).sum();
        s.live_pools = self.shared.live_pools.load(Relaxed);
        s.live_bytes = self.shared.live_bytes.load(Relaxed);
        s.peak_live_bytes = self.shared.peak_live_bytes.load(Relaxed);
        s.mprotect_calls = self.shared.mprotect_calls.load(Relaxed);
        s
    }

    fn lock(&self) -> MutexGuard<'_, State<S>> {
        // Every update under the lock leaves the state consistent before
        // anything that can panic, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn new_pool(&self, size: usize) -> Result<Arc<Pool<S>>, AllocError> {
        let base = self.source.map(size, os_page()).ok_or(AllocError)?;
        self.shared.live_pools.fetch_add(1, Relaxed);
        let live = self.shared.live_bytes.fetch_add(size as u64, Relaxed) + size as u64;
        self.shared.peak_live_bytes.fetch_max(live, Relaxed);
        Ok(Arc::new(Pool {
            source: self.source,
            base,
            size,
            used: AtomicUsize::new(0),
            executable: self.config.executable,
            prot: RwLock::new(Protection::ReadWrite),
            shared: self.shared.clone(),
        }))
    }

    /// Carves `n` bytes (which fit) from `pool`.
    fn carve(pool: &Arc<Pool<S>>, n: usize) -> Allocation<S> {
        let off = pool.used.load(Relaxed);
        debug_assert!(off + n <= pool.size);
        pool.used.store(off + n, Relaxed);
        Allocation {
            pool: pool.clone(),
            // SAFETY: `off + n <= size`, so the pointer is inside the mapping.
            ptr: unsafe { NonNull::new_unchecked(pool.base.as_ptr().add(off)) },
            len: n,
        }
    }

    /// Allocates `size` bytes (rounded up to the granule; 0 counts as 1).
    /// Fresh memory reads as zeros. Errors if the page source refuses.
    ///
    /// ```
    /// use pagewise::pool::Pools;
    /// let pools = Pools::new();
    /// let small = pools.alloc(4000).unwrap();
    /// let large = pools.alloc(200_000).unwrap(); // above the threshold: own pool
    /// assert!(!small.same_pool(&large));
    /// assert_eq!(pools.stats().large_pools, 1);
    /// ```
    pub fn alloc(&self, size: usize) -> Result<Allocation<S>, AllocError> {
        let g = self.config.granule;
        let n = size.max(1).checked_add(g - 1).ok_or(AllocError)? & !(g - 1);
        let mut st = self.lock();

        let fits = st
            .open
            .iter()
            .enumerate()
            .filter(|(_, p)| p.available() >= n);
        let chosen = match self.config.fit {
            Fit::First => fits.map(|(i, _)| i).next(),
            Fit::Best => fits.min_by_key(|(_, p)| p.available()).map(|(i, _)| i),
            Fit::Worst => fits.max_by_key(|(_, p)| p.available()).map(|(i, _)| i),
        };
        if let Some(i) = chosen {
            let a = Self::carve(&st.open[i], n);
            Self::count(&mut st.stats, size, n);
            return Ok(a);
        }

        if n > self.config.large_threshold {
            let psize = n.checked_add(os_page() - 1).ok_or(AllocError)? & !(os_page() - 1);
            let pool = self.new_pool(psize)?;
            let a = Self::carve(&pool, n);
            let s = &mut st.stats;
            Self::count(s, size, n);
            s.allocated += psize as u64;
            s.lwaste += (psize - n) as u64;
            s.pools_created += 1;
            s.large_pools += 1;
            return Ok(a);
        }

        let pool = self.new_pool(self.config.pool_size)?;
        let a = Self::carve(&pool, n);
        Self::count(&mut st.stats, size, n);
        st.stats.allocated += pool.size as u64;
        st.stats.pools_created += 1;
        if st.open.len() < self.config.open_pools {
            st.open.push(pool); // its tail is owaste while open
        } else {
            let (i_min, min_avail) = st
                .open
                .iter()
                .enumerate()
                .map(|(i, p)| (i, p.available()))
                .min_by_key(|&(_, avail)| avail)
                .expect("at least one open pool");
            if pool.available() > min_avail {
                st.stats.swaste += min_avail as u64;
                st.open[i_min] = pool; // the old pool lives on in its handles
            } else {
                st.stats.nwaste += pool.available() as u64;
            }
        }
        Ok(a)
    }

    fn count(s: &mut PoolStats, requested: usize, n: usize) {
        s.requests += 1;
        s.requested += requested as u64;
        s.asked_for += n as u64;
    }
}

impl<S: ProtectPages + 'static> core::fmt::Debug for Pools<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Pools")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}
