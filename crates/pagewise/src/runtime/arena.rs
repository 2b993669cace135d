//! Bump arenas for objects that die together (per request, per GC cohort,
//! per compilation), with their blocks pooled across arenas.
//!
//! An [`Arena`] hands out memory by bumping an offset in its current block,
//! frees nothing individually, and gives all its blocks back at once on
//! [`reset`](Arena::reset) (all but the current one) or drop. The blocks come
//! from a [`BlockPool`] shared by every arena of the thread (or any pool you
//! pass), so a program that creates and drops arenas in a loop reuses the same
//! pages instead of mapping and unmapping them each time.
//!
//! Compared with `bumpalo::Bump` (the Rust ecosystem's arena): the same
//! ergonomics (`alloc`, `alloc_with`, `alloc_slice_copy`, `alloc_str`,
//! `alloc_layout`, `reset`, `allocated_bytes`, and an
//! [`allocator_api2::alloc::Allocator`] impl for `&Arena` so `Vec`s and `Box`es
//! can live in it), plus what bumpalo lacks: blocks pooled across arenas (and
//! threads, with an explicit pool), blocks that come from pages rather than the
//! global allocator (so they can be purged and given back at page granularity),
//! and [`stats`](Arena::stats). Like bumpalo, values put in the arena are never
//! dropped.
//!
//! ```
//! use pagewise::Arena;
//! use allocator_api2::vec::Vec;
//!
//! let arena = Arena::new();
//! let x = arena.alloc(41u32);
//! *x += 1;
//! let s = arena.alloc_str("per-request scratch");
//! let mut v = Vec::new_in(&arena);
//! v.extend_from_slice(&[1u8, 2, 3]);
//! assert_eq!((*x, &*s, v.len()), (42, "per-request scratch", 3));
//! ```

use core::alloc::Layout;
use core::cell::{Cell, RefCell};
use core::ptr::NonNull;
use std::sync::Arc;

use allocator_api2::alloc::{AllocError, Allocator};

use crate::memory::layout::{align_up, os_page};
use crate::os::source::{PageSource, SystemPages};
pub use crate::runtime::block_pool::{
    BlockPool, BlockPoolConfig, BlockPoolStats, DEFAULT_POOL_CAP,
};

/// The examples of `docs/guide/runtimes.md`, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../../docs/guide/runtimes.md")]
pub struct DesignDocExamples;

/// Size of an arena's first block (unless [`Arena::with_capacity`] asks for
/// more): 64 KiB.
///
/// ```
/// assert_eq!(pagewise::arena::FIRST_BLOCK, 64 << 10);
/// ```
pub const FIRST_BLOCK: usize = 64 << 10;

/// Blocks double in size as an arena grows, up to this size (4 MiB); after
/// that every block has this size, so arenas of different sizes share the
/// same block sizes and the pool's exact-size reuse finds them. Requests
/// larger than this get a block of their own, rounded up to the OS page.
///
/// ```
/// assert_eq!(pagewise::arena::MAX_BLOCK_GROWTH, 4 << 20);
/// ```
pub const MAX_BLOCK_GROWTH: usize = 4 << 20;

/// Counters of one [`Arena`].
///
/// ```
/// let arena = pagewise::Arena::new();
/// arena.alloc([0u8; 100]);
/// let s = arena.stats();
/// assert_eq!((s.allocations, s.requested_bytes, s.blocks), (1, 100, 1));
/// assert_eq!(s.block_bytes, pagewise::arena::FIRST_BLOCK);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Allocations since creation or the last reset.
    pub allocations: u64,
    /// Bytes asked for (sum of `Layout::size`) since creation or the last reset.
    pub requested_bytes: usize,
    /// Blocks held.
    pub blocks: usize,
    /// Bytes of the blocks held (what [`Arena::allocated_bytes`] returns).
    pub block_bytes: usize,
    /// Blocks this arena took from its pool that the pool had to map fresh
    /// (the others were reused).
    pub fresh_blocks: u64,
    /// Times [`Arena::reset`] was called.
    pub resets: u64,
}

#[derive(Clone, Copy)]
struct Block {
    ptr: NonNull<u8>,
    size: usize,
}

/// A bump arena whose blocks come from a shared [`BlockPool`].
///
/// `Arena` is `Send` (move it to another thread; its blocks go back to the
/// pool they came from) but not `Sync`. Values allocated in it are not
/// dropped.
///
/// ```
/// use pagewise::Arena;
/// #[derive(Debug)]
/// struct Node<'a> { val: u32, next: Option<&'a Node<'a>> }
///
/// let arena = Arena::new();
/// let a = arena.alloc(Node { val: 1, next: None });
/// let b = arena.alloc(Node { val: 2, next: Some(a) });
/// assert_eq!(b.next.unwrap().val, 1);
/// ```
pub struct Arena<S: PageSource + 'static = SystemPages> {
    pool: Arc<BlockPool<S>>,
    /// Base of the current block (null before the first allocation).
    base: Cell<*mut u8>,
    /// Bump offset in the current block.
    off: Cell<usize>,
    /// Size of the current block (0 before the first allocation).
    cap: Cell<usize>,
    /// Blocks other than the current one.
    retired: RefCell<Vec<Block>>,
    /// Size of the next growth block.
    next_grow: Cell<usize>,
    stats: Cell<ArenaStats>,
}

// SAFETY: the arena owns its blocks exclusively (the raw pointers alias
// nothing outside it), the pool is `Send + Sync`, and `&Arena` is not `Send`
// because the arena is not `Sync` (the `Cell`s), so no two threads use it at
// once.
unsafe impl<S: PageSource + 'static> Send for Arena<S> {}

impl Arena<SystemPages> {
    /// An empty arena drawing from this thread's default pool
    /// ([`BlockPool::thread_default`]). No memory is taken until the first
    /// allocation.
    ///
    /// ```
    /// let arena = pagewise::Arena::new();
    /// assert_eq!(arena.allocated_bytes(), 0);
    /// ```
    pub fn new() -> Self {
        Arena::with_pool(BlockPool::thread_default())
    }

    /// An arena whose first block holds at least `bytes` (rounded up to the
    /// block sizes).
    ///
    /// ```
    /// let arena = pagewise::Arena::with_capacity(1 << 20);
    /// assert_eq!(arena.allocated_bytes(), 1 << 20);
    /// ```
    pub fn with_capacity(bytes: usize) -> Self {
        let a = Arena::new();
        a.reserve(bytes);
        a
    }
}

impl Default for Arena<SystemPages> {
    fn default() -> Self {
        Self::new()
    }
}

/// The block size for a request needing `need` bytes when the arena would
/// grow to `grow` (a power of two) next.
fn block_size_for(need: usize, grow: usize) -> Option<usize> {
    if need <= MAX_BLOCK_GROWTH {
        Some(need.next_power_of_two().max(grow))
    } else {
        need.checked_add(os_page() - 1)
            .map(|n| n & !(os_page() - 1))
    }
}

impl<S: PageSource + 'static> Arena<S> {
    /// An empty arena drawing blocks from `pool`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use pagewise::arena::{Arena, BlockPool, BlockPoolConfig};
    /// use pagewise::{FakePages, PageSource};
    /// static PAGES: FakePages = FakePages::new();
    /// let pool = Arc::new(BlockPool::new(&PAGES, BlockPoolConfig::default()));
    /// let arena = Arena::with_pool(pool);
    /// arena.alloc(1u8);
    /// assert_eq!(PAGES.syscalls().mmap, 1);
    /// ```
    pub fn with_pool(pool: Arc<BlockPool<S>>) -> Self {
        Arena {
            pool,
            base: Cell::new(core::ptr::null_mut()),
            off: Cell::new(0),
            cap: Cell::new(0),
            retired: RefCell::new(Vec::new()),
            next_grow: Cell::new(FIRST_BLOCK),
            stats: Cell::new(ArenaStats::default()),
        }
    }

    /// The pool this arena's blocks come from and go back to.
    ///
    /// ```
    /// use pagewise::arena::{Arena, BlockPool};
    /// use std::sync::Arc;
    /// assert!(Arc::ptr_eq(Arena::new().pool(), &BlockPool::thread_default()));
    /// ```
    pub fn pool(&self) -> &Arc<BlockPool<S>> {
        &self.pool
    }

    /// Makes sure the current block has at least `bytes` free, taking a new
    /// block if it has not.
    ///
    /// ```
    /// let arena = pagewise::Arena::new();
    /// arena.reserve(100_000);
    /// let blocks = arena.stats().blocks;
    /// arena.alloc([0u8; 90_000]);
    /// assert_eq!(arena.stats().blocks, blocks);
    /// ```
    pub fn reserve(&self, bytes: usize) {
        if self.cap.get() - self.off.get() >= bytes {
            return;
        }
        let size =
            block_size_for(bytes.max(1), self.next_grow.get()).expect("arena reserve overflow");
        let Some(ptr) = self.take_block(size) else {
            std::alloc::handle_alloc_error(
                Layout::from_size_align(size, os_page()).expect("layout"),
            );
        };
        self.install(Block { ptr, size }, 0);
    }

    /// Total bytes of the blocks this arena holds (as `bumpalo::Bump::allocated_bytes`).
    ///
    /// ```
    /// let arena = pagewise::Arena::new();
    /// arena.alloc(0u64);
    /// assert_eq!(arena.allocated_bytes(), pagewise::arena::FIRST_BLOCK);
    /// ```
    pub fn allocated_bytes(&self) -> usize {
        self.stats.get().block_bytes
    }

    /// A snapshot of the arena's counters.
    ///
    /// ```
    /// let mut arena = pagewise::Arena::new();
    /// arena.alloc(1u32);
    /// arena.reset();
    /// assert_eq!(arena.stats().resets, 1);
    /// assert_eq!(arena.stats().requested_bytes, 0);
    /// ```
    pub fn stats(&self) -> ArenaStats {
        self.stats.get()
    }

    /// Allocates memory for `layout`, or returns an error if the page source
    /// refuses. The memory's contents are unspecified.
    ///
    /// ```
    /// use core::alloc::Layout;
    /// let arena = pagewise::Arena::new();
    /// let p = arena.try_alloc_layout(Layout::from_size_align(24, 64).unwrap()).unwrap();
    /// assert_eq!(p.as_ptr() as usize % 64, 0);
    /// ```
    #[inline]
    pub fn try_alloc_layout(&self, layout: Layout) -> Result<NonNull<u8>, AllocError> {
        let base = self.base.get();
        let off = self.off.get();
        let addr = (base as usize).wrapping_add(off);
        let pad = align_up(addr, layout.align()).wrapping_sub(addr);
        let end = off
            .checked_add(pad)
            .and_then(|x| x.checked_add(layout.size()));
        match end {
            Some(end) if !base.is_null() && end <= self.cap.get() => {
                self.off.set(end);
                self.count(layout.size());
                // SAFETY: `off + pad <= end <= cap`, so the pointer is inside
                // (or one past the end of) the current block.
                Ok(unsafe { NonNull::new_unchecked(base.add(off + pad)) })
            }
            _ => self.alloc_slow(layout),
        }
    }

    /// Allocates memory for `layout`; aborts via
    /// [`handle_alloc_error`](std::alloc::handle_alloc_error) if the page
    /// source refuses.
    ///
    /// ```
    /// use core::alloc::Layout;
    /// let arena = pagewise::Arena::new();
    /// let p = arena.alloc_layout(Layout::new::<[u64; 4]>());
    /// assert_eq!(p.as_ptr() as usize % 8, 0);
    /// ```
    #[inline]
    pub fn alloc_layout(&self, layout: Layout) -> NonNull<u8> {
        match self.try_alloc_layout(layout) {
            Ok(p) => p,
            Err(_) => std::alloc::handle_alloc_error(layout),
        }
    }

    /// Moves `val` into the arena. It will not be dropped.
    ///
    /// ```
    /// let arena = pagewise::Arena::new();
    /// let v = arena.alloc([1u16; 8]);
    /// v[0] = 9;
    /// assert_eq!(v[..2], [9, 1]);
    /// ```
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub fn alloc<T>(&self, val: T) -> &mut T {
        self.alloc_with(|| val)
    }

    /// Allocates room for a `T` and writes `f()` into it (lets the compiler
    /// build large values in place).
    ///
    /// ```
    /// let arena = pagewise::Arena::new();
    /// let big = arena.alloc_with(|| [7u8; 1 << 16]);
    /// assert_eq!(big[65535], 7);
    /// ```
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_with<T, F: FnOnce() -> T>(&self, f: F) -> &mut T {
        let p = self.alloc_layout(Layout::new::<T>()).cast::<T>();
        // SAFETY: `p` is freshly allocated for a `T` (size and alignment from
        // `Layout::new::<T>()`), used by nothing else, and lives as long as
        // `&self`: blocks are only released by `reset(&mut self)` or drop.
        unsafe {
            p.as_ptr().write(f());
            &mut *p.as_ptr()
        }
    }

    /// Copies a slice into the arena.
    ///
    /// ```
    /// let arena = pagewise::Arena::new();
    /// let s = arena.alloc_slice_copy(&[1, 2, 3]);
    /// s[2] = 4;
    /// assert_eq!(s, &[1, 2, 4]);
    /// ```
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_slice_copy<T: Copy>(&self, src: &[T]) -> &mut [T] {
        let layout = Layout::for_value(src);
        let p = self.alloc_layout(layout).cast::<T>();
        // SAFETY: `p` is fresh memory for `src.len()` `T`s, disjoint from
        // `src`; `T: Copy` so a bitwise copy is a valid value, and the slice
        // lives as long as `&self` (see `alloc_with`).
        unsafe {
            core::ptr::copy_nonoverlapping(src.as_ptr(), p.as_ptr(), src.len());
            core::slice::from_raw_parts_mut(p.as_ptr(), src.len())
        }
    }

    /// Allocates a slice of `len` values made by `f(index)`.
    ///
    /// ```
    /// let arena = pagewise::Arena::new();
    /// let squares = arena.alloc_slice_fill_with(4, |i| i * i);
    /// assert_eq!(squares, &[0, 1, 4, 9]);
    /// ```
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_slice_fill_with<T, F: FnMut(usize) -> T>(&self, len: usize, mut f: F) -> &mut [T] {
        let layout = Layout::array::<T>(len).expect("arena slice overflow");
        let p = self.alloc_layout(layout).cast::<T>();
        for i in 0..len {
            // SAFETY: `i < len`, inside the fresh allocation for `len` `T`s.
            unsafe { p.as_ptr().add(i).write(f(i)) };
        }
        // SAFETY: all `len` elements were initialised above; the memory lives
        // as long as `&self` (see `alloc_with`). If `f` panicked we never get
        // here, and the written values are leaked, as arena values always are.
        unsafe { core::slice::from_raw_parts_mut(p.as_ptr(), len) }
    }

    /// Copies a string into the arena.
    ///
    /// ```
    /// let arena = pagewise::Arena::new();
    /// let s = arena.alloc_str("hello");
    /// s.make_ascii_uppercase();
    /// assert_eq!(s, "HELLO");
    /// ```
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_str(&self, src: &str) -> &mut str {
        let bytes = self.alloc_slice_copy(src.as_bytes());
        // SAFETY: the bytes are a copy of a valid `str`.
        unsafe { core::str::from_utf8_unchecked_mut(bytes) }
    }

    /// Frees everything allocated, keeping the current block for reuse and
    /// giving every other block back to the pool.
    ///
    /// ```
    /// let mut arena = pagewise::Arena::new();
    /// for _ in 0..100 {
    ///     arena.alloc([0u8; 4096]); // grows to several blocks
    /// }
    /// let kept = arena.stats().blocks;
    /// arena.reset();
    /// assert!(kept > 1);
    /// assert_eq!(arena.stats().blocks, 1);
    /// ```
    pub fn reset(&mut self) {
        let retired = core::mem::take(self.retired.get_mut());
        for b in &retired {
            // SAFETY: `&mut self` proves no reference into the arena is live;
            // the block came from `self.pool.take(b.size)`.
            unsafe { self.pool.give(b.ptr, b.size) };
        }
        self.off.set(0);
        let mut s = self.stats.get();
        s.allocations = 0;
        s.requested_bytes = 0;
        s.blocks = usize::from(!self.base.get().is_null());
        s.block_bytes = self.cap.get();
        s.resets += 1;
        self.stats.set(s);
    }

    #[inline]
    fn count(&self, bytes: usize) {
        let mut s = self.stats.get();
        s.allocations += 1;
        s.requested_bytes += bytes;
        self.stats.set(s);
    }

    fn take_block(&self, size: usize) -> Option<NonNull<u8>> {
        let (p, fresh) = self.pool.take(size)?;
        let mut s = self.stats.get();
        s.blocks += 1;
        s.block_bytes += size;
        s.fresh_blocks += u64::from(fresh);
        self.stats.set(s);
        if size <= MAX_BLOCK_GROWTH && size >= self.next_grow.get() {
            self.next_grow.set((size * 2).min(MAX_BLOCK_GROWTH));
        }
        Some(p)
    }

    /// Makes `b` (with `used` bytes already taken) the current block if it
    /// has at least as much room left as the current one; else retires it.
    fn install(&self, b: Block, used: usize) {
        let cur_left = self.cap.get() - self.off.get();
        let mut retired = self.retired.borrow_mut();
        if b.size - used >= cur_left {
            if let Some(old) = NonNull::new(self.base.get()) {
                retired.push(Block {
                    ptr: old,
                    size: self.cap.get(),
                });
            }
            self.base.set(b.ptr.as_ptr());
            self.cap.set(b.size);
            self.off.set(used);
        } else {
            retired.push(b);
        }
    }

    #[cold]
    fn alloc_slow(&self, layout: Layout) -> Result<NonNull<u8>, AllocError> {
        // Blocks are page-aligned: larger alignments may need padding.
        let slack = layout.align().saturating_sub(os_page());
        let need = layout.size().checked_add(slack).ok_or(AllocError)?;
        let size = block_size_for(need.max(1), self.next_grow.get()).ok_or(AllocError)?;
        let ptr = self.take_block(size).ok_or(AllocError)?;
        let addr = ptr.as_ptr() as usize;
        let pad = align_up(addr, layout.align()) - addr;
        self.install(Block { ptr, size }, pad + layout.size());
        self.count(layout.size());
        // SAFETY: `pad + size <= slack + size <= block size`, so the result is
        // inside the new block.
        Ok(unsafe { NonNull::new_unchecked(ptr.as_ptr().add(pad)) })
    }

    /// True if `ptr..ptr+size` is the most recent allocation in the current
    /// block (so it can be resized or freed in place).
    #[inline]
    fn is_last(&self, ptr: NonNull<u8>, size: usize) -> bool {
        let (base, p) = (self.base.get() as usize, ptr.as_ptr() as usize);
        // `p >= base` matters: a retired block may end exactly where the
        // current one starts (adjacent mappings), and its last allocation
        // must not be mistaken for the current block's.
        base != 0 && p >= base && p + size == base + self.off.get()
    }
}

impl<S: PageSource + 'static> Drop for Arena<S> {
    fn drop(&mut self) {
        self.reset();
        if let Some(p) = NonNull::new(self.base.get()) {
            // SAFETY: we are being dropped, so nothing refers into the block;
            // it came from `self.pool.take(cap)`.
            unsafe { self.pool.give(p, self.cap.get()) };
        }
    }
}

impl<S: PageSource + 'static> core::fmt::Debug for Arena<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Arena")
            .field("stats", &self.stats())
            .finish()
    }
}

// SAFETY: memory returned by `allocate` stays valid until the arena is reset
// or dropped, which needs `&mut Arena` and so cannot happen while a `&Arena`
// (this allocator) is alive; `deallocate`, `grow` and `shrink` only move the
// bump offset when the block is the most recent allocation, so no other live
// block is affected. Copies of `&Arena` are the same allocator.
unsafe impl<S: PageSource + 'static> Allocator for &Arena<S> {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let p = self.try_alloc_layout(layout)?;
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // Only the most recent allocation can be given back (bumpalo does the same).
        if self.is_last(ptr, layout.size()) {
            self.off.set(self.off.get() - layout.size());
        }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if self.is_last(ptr, old.size()) && ptr.as_ptr() as usize % new.align() == 0 {
            let start = self.off.get() - old.size();
            if let Some(end) = start
                .checked_add(new.size())
                .filter(|&e| e <= self.cap.get())
            {
                self.off.set(end);
                let mut s = self.stats.get();
                s.requested_bytes += new.size() - old.size();
                self.stats.set(s);
                return Ok(NonNull::slice_from_raw_parts(ptr, new.size()));
            }
        }
        let p = self.try_alloc_layout(new)?;
        // SAFETY: the caller guarantees `ptr` holds `old.size()` readable
        // bytes; `p` is a fresh, disjoint allocation of at least that size.
        unsafe { core::ptr::copy_nonoverlapping(ptr.as_ptr(), p.as_ptr(), old.size()) };
        Ok(NonNull::slice_from_raw_parts(p, new.size()))
    }

    unsafe fn grow_zeroed(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller's contract.
        let p = unsafe { self.grow(ptr, old, new)? };
        // SAFETY: `p` holds `new.size() >= old.size()` bytes of ours.
        unsafe {
            core::ptr::write_bytes(
                p.cast::<u8>().as_ptr().add(old.size()),
                0,
                new.size() - old.size(),
            )
        };
        Ok(p)
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if ptr.as_ptr() as usize % new.align() == 0 {
            if self.is_last(ptr, old.size()) {
                self.off.set(self.off.get() - (old.size() - new.size()));
            }
            return Ok(NonNull::slice_from_raw_parts(ptr, new.size()));
        }
        let p = self.try_alloc_layout(new)?;
        // SAFETY: `ptr` holds at least `new.size()` readable bytes; `p` is a
        // fresh, disjoint allocation of `new.size()` bytes.
        unsafe { core::ptr::copy_nonoverlapping(ptr.as_ptr(), p.as_ptr(), new.size()) };
        Ok(NonNull::slice_from_raw_parts(p, new.size()))
    }
}
