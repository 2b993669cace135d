//! The page source: the one place where pagewise talks to the operating system.
//!
//! Everything above this module is policy (which pages to keep, which to give
//! back, when). Everything in this module is mechanism: map address space,
//! unmap it, purge pages, read a clock. Keeping the boundary this small lets the
//! policy be tested against [`FakePages`] (counted exactly, time under the
//! test's control, runnable under Miri) and lets later work (memfd-backed
//! reservations for meshing) swap the mechanism without touching the policy.
//!
//! Every call that reaches the kernel is counted in [`SyscallCounts`].

#[cfg(target_os = "linux")]
pub use crate::os::shared::SharedPages;
use crate::os::thp::{ThpMode, HUGE_PAGE};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};

/// How purged pages are given back to the kernel.
///
/// ```
/// use pagewise::Purge;
/// assert_eq!(Purge::default(), Purge::DontNeed);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Purge {
    /// `MADV_DONTNEED`: the pages leave RSS at once and read back as zeros.
    /// The default, because users and monitors read RSS (mimalloc #776).
    /// On macOS, where no `madvise` does that, fresh pages are mapped over
    /// the range instead (same effect).
    #[default]
    DontNeed,
    /// `MADV_FREE` (on Linux and macOS): the kernel takes the pages only
    /// under memory pressure; until then they may keep their contents.
    /// Cheaper to reuse, but RSS does not drop until the kernel needs memory.
    Free,
}

/// Counts of the memory system calls a page source has made.
///
/// ```
/// use pagewise::PageSource;
/// let s = pagewise::SystemPages::new();
/// assert_eq!(s.syscalls().mmap, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SyscallCounts {
    /// `mmap` calls (including failed ones).
    pub mmap: u64,
    /// `munmap` calls, including those that trim an over-sized mapping.
    pub munmap: u64,
    /// `madvise` calls.
    pub madvise: u64,
    /// Bytes currently mapped (address space held from the OS).
    pub mapped_bytes: u64,
    /// Highest value `mapped_bytes` has reached.
    pub peak_mapped_bytes: u64,
    /// Total bytes passed to `madvise` for purging.
    pub purged_bytes: u64,
    /// Calls that made every thread of the process pass a memory barrier
    /// (`membarrier`), one each time a slab page stops taking frees into
    /// thread caches before its free OS pages are given back.
    pub barriers: u64,
    /// `madvise(MADV_HUGEPAGE)` calls: 2 MiB regions of the heap asked to
    /// be backed by huge pages (not counted in `madvise`, which counts
    /// purges).
    pub hugepage: u64,
    /// `madvise(MADV_NOHUGEPAGE)` calls: such regions given back to small
    /// pages before a purge inside them, and, where the kernel's own
    /// setting is `always`, each new reservation (and, meshing, each
    /// mapping at its first huge page, so that a region given back merges
    /// with its neighbours again).
    pub nohugepage: u64,
}

/// The counters behind [`SyscallCounts`], shared by every source.
#[derive(Default)]
pub struct SyscallCounters {
    pub(crate) mmap: AtomicU64,
    pub(crate) munmap: AtomicU64,
    pub(crate) madvise: AtomicU64,
    pub(crate) mapped: AtomicU64,
    pub(crate) peak_mapped: AtomicU64,
    pub(crate) purged: AtomicU64,
    pub(crate) barriers: AtomicU64,
    pub(crate) hugepage: AtomicU64,
    pub(crate) nohugepage: AtomicU64,
}

impl SyscallCounters {
    /// Counters at zero (usable in a `static`).
    pub const fn new() -> Self {
        SyscallCounters {
            mmap: AtomicU64::new(0),
            munmap: AtomicU64::new(0),
            madvise: AtomicU64::new(0),
            mapped: AtomicU64::new(0),
            peak_mapped: AtomicU64::new(0),
            purged: AtomicU64::new(0),
            barriers: AtomicU64::new(0),
            hugepage: AtomicU64::new(0),
            nohugepage: AtomicU64::new(0),
        }
    }
    pub(crate) fn mapped(&self, bytes: usize) {
        let now = self.mapped.fetch_add(bytes as u64, Relaxed) + bytes as u64;
        self.peak_mapped.fetch_max(now, Relaxed);
    }
    pub(crate) fn unmapped(&self, bytes: usize) {
        self.mapped.fetch_sub(bytes as u64, Relaxed);
    }
    pub(crate) fn advised(&self, huge: bool) {
        if huge {
            self.hugepage.fetch_add(1, Relaxed);
        } else {
            self.nohugepage.fetch_add(1, Relaxed);
        }
    }
    /// A snapshot of the counts.
    pub fn snapshot(&self) -> SyscallCounts {
        SyscallCounts {
            mmap: self.mmap.load(Relaxed),
            munmap: self.munmap.load(Relaxed),
            madvise: self.madvise.load(Relaxed),
            mapped_bytes: self.mapped.load(Relaxed),
            peak_mapped_bytes: self.peak_mapped.load(Relaxed),
            purged_bytes: self.purged.load(Relaxed),
            barriers: self.barriers.load(Relaxed),
            hugepage: self.hugepage.load(Relaxed),
            nohugepage: self.nohugepage.load(Relaxed),
        }
    }
}

/// Where pagewise gets its memory.
///
/// # Safety
/// Implementations must return from [`map`](PageSource::map) memory that is
/// readable, writable, zero-filled, aligned to `align`, exclusively owned by
/// the caller until passed back to [`unmap`](PageSource::unmap), and never
/// obtained from the global allocator (pagewise may *be* the global allocator).
/// After a successful [`purge`](PageSource::purge) with [`Purge::DontNeed`]
/// the range must read as zeros.
pub unsafe trait PageSource: Sync {
    /// Maps `size` bytes (a multiple of the OS page,
    /// [`crate::layout::os_page`]) aligned to `align` (a power of two, at
    /// least the OS page). Returns `None` when the OS refuses.
    fn map(&self, size: usize, align: usize) -> Option<NonNull<u8>>;
    /// Returns a mapping (or a page-aligned part of one) to the OS.
    ///
    /// # Safety
    /// `ptr..ptr+size` was returned by `map` and is not used afterwards.
    unsafe fn unmap(&self, ptr: NonNull<u8>, size: usize);
    /// Tells the OS the contents of `ptr..ptr+size` are no longer needed.
    /// Returns false if the OS refused; the caller then keeps treating the
    /// range as committed.
    ///
    /// # Safety
    /// The range is page-aligned (start and length multiples of
    /// [`crate::layout::os_page`]), inside a live mapping, and holds no
    /// live data.
    unsafe fn purge(&self, ptr: NonNull<u8>, size: usize, how: Purge) -> bool;
    /// Milliseconds on a monotonic clock (the decay timer's time base).
    fn now_ms(&self) -> u64;
    /// The counts of calls made so far.
    fn syscalls(&self) -> SyscallCounts;
    /// The rare side of the asymmetric fence (`sync/asymmetric.rs`):
    /// makes every other running thread of the process execute a full
    /// memory barrier, so that a store this thread made before the call
    /// and a load it makes after pair with the compiler-only fences of the
    /// free fast path. Returns false if it could not (the kernel lacks
    /// `membarrier`); then a free racing the purge of its own slot's OS
    /// page may go unreported (design.md, "A hollow slot never enters a
    /// thread cache"). By default the kernel's `membarrier` on Linux, and
    /// nothing elsewhere.
    ///
    /// ```
    /// use pagewise::PageSource;
    /// let s = pagewise::SystemPages::new();
    /// let ordered = s.serialize_threads();
    /// assert_eq!(s.syscalls().barriers, ordered as u64);
    /// ```
    fn serialize_threads(&self) -> bool {
        serialize_with_os()
    }
    /// Whether OS pages of this source can share physical pages, and how
    /// (meshing: `SharedPages`, on Linux).
    /// None by default.
    fn sharing(&self) -> Option<&dyn SharePages> {
        None
    }
    /// What the kernel does with huge pages in this source's mappings
    /// (read once per process for [`SystemPages`]). `Never` by default:
    /// a source that says so is never asked for them.
    ///
    /// ```
    /// use pagewise::{thp::ThpMode, FakePages, PageSource};
    /// assert_eq!(FakePages::new().thp(), ThpMode::Never);
    /// assert_eq!(FakePages::with_thp(ThpMode::Madvise).thp(), ThpMode::Madvise);
    /// ```
    fn thp(&self) -> ThpMode {
        ThpMode::Never
    }
    /// Advises `ptr..ptr+size` (whole 2 MiB huge pages of a mapping of
    /// this source) to be backed by huge pages (`huge`: `MADV_HUGEPAGE`)
    /// or never to be (`MADV_NOHUGEPAGE`), counted in
    /// [`SyscallCounts::hugepage`] and [`SyscallCounts::nohugepage`].
    /// Returns whether the OS accepted; by default nothing is called and
    /// the answer is no.
    ///
    /// ```
    /// use pagewise::{thp::ThpMode, FakePages, PageSource};
    /// let fake = FakePages::with_thp(ThpMode::Madvise);
    /// let p = fake.map(32 << 20, 32 << 20).unwrap();
    /// // SAFETY: our mapping.
    /// unsafe {
    ///     assert!(fake.advise_huge(p, 2 << 20, true));
    ///     assert!(fake.advise_huge(p, 2 << 20, false));
    ///     fake.unmap(p, 32 << 20);
    /// }
    /// assert_eq!((fake.syscalls().hugepage, fake.syscalls().nohugepage), (1, 1));
    /// ```
    ///
    /// # Safety
    /// The range is inside a live mapping of this source.
    unsafe fn advise_huge(&self, ptr: NonNull<u8>, size: usize, huge: bool) -> bool {
        let _ = (ptr, size, huge);
        false
    }
}

/// How an OS page leaves its mesh group ([`SharePages::leave`]).
///
/// A page that leaves from the middle of a run of pages showing consecutive
/// group pages splits the kernel's mapping of the run in three, so leaving
/// is refused when the process's budget of mappings is spent, except when
/// the page's whole slab page is being released: its OS pages then leave in
/// address order, each one mending the split the one before it made, so the
/// mappings grow by one at most, and shrink once the last has left.
///
/// ```
/// # #[cfg(target_os = "linux")] {
/// use pagewise::source::{Leave, PageSource, SharedPages};
/// let pages = SharedPages::new();
/// let p = pages.map(1 << 25, 1 << 25).unwrap().as_ptr() as usize;
/// let sharing = pages.sharing().unwrap();
/// // SAFETY: our mapping, one thread, nothing live on the pages.
/// unsafe {
///     assert!(sharing.share(p));
///     assert!(sharing.leave(p, Leave::Unused));
///     assert_eq!(sharing.group_of(p), None);
/// }
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leave {
    /// Nothing on the page is live, and its slab page stays in use: the
    /// page reads as zeros afterwards.
    Unused,
    /// The page's bytes come along (a group that found no other member).
    Keep,
    /// The slab page is being released: every meshed OS page of it
    /// leaves, in address order; never refused for the budget (a slab
    /// page that stays meshed could not be reused).
    Released,
}

/// What meshing asks of a page source: OS pages that share a physical
/// page. Offered by `SharedPages` (Linux) through [`PageSource::sharing`].
///
/// Addresses are OS-page aligned and inside the source's live mappings.
///
/// # Safety
/// Implementations keep every byte a caller copied or left in place
/// visible at the same virtual address: only the contents the caller says
/// are its own move, and nothing else of another page is lost.
pub unsafe trait SharePages {
    /// Starts a group with the OS page at `founder` as its only member: its
    /// bytes are copied to the group's physical page and the page is mapped
    /// there. False if it cannot (a group keyed by this page still lives,
    /// the mapping budget is spent, or the kernel refused); nothing changed.
    ///
    /// # Safety
    /// No thread writes to the page during the call.
    unsafe fn share(&self, founder: usize) -> bool;
    /// Copies `ranges` (offsets and lengths inside the OS page at `member`)
    /// to the same offsets of the physical page of the group `founder`
    /// founded, and maps `member` there. False if it cannot; nothing
    /// changed.
    ///
    /// # Safety
    /// No thread writes to either page during the call; the group's bytes
    /// at `ranges` hold nothing of its other members; `member` is no group's
    /// member.
    unsafe fn join(&self, founder: usize, member: usize, ranges: &[(usize, usize)]) -> bool;
    /// Maps `member` back to its own page, and frees the group's physical
    /// page if no member is left. The own page reads as zeros, or, with
    /// [`Leave::Keep`], as the page read before the call. False if the
    /// kernel refused, or (but for [`Leave::Released`]) if the page would
    /// split a kernel mapping past the mapping budget; the page stays a
    /// member.
    ///
    /// # Safety
    /// `member` is a member of a group; nothing on it is live any more, or
    /// with [`Leave::Keep`], no thread writes to it during the call.
    unsafe fn leave(&self, member: usize, how: Leave) -> bool;
    /// The founder of the group the OS page at `addr` is a member of.
    fn group_of(&self, addr: usize) -> Option<usize>;
    /// Members of the group the OS page at `founder` founded (0: none
    /// lives). A source that cannot say answers 0, and no group it keeps
    /// takes a member in a later pass.
    fn members(&self, founder: usize) -> usize {
        let _ = founder;
        0
    }
    /// Groups the OS page at `founder` has founded so far (it founds
    /// another once its group ended): a group loaded earlier is still the
    /// same group only while this is unchanged, whatever its member count
    /// says. A source that cannot say answers 0.
    fn foundings(&self, founder: usize) -> usize {
        let _ = founder;
        0
    }
    /// OS pages that are group members now, and groups (physical pages).
    fn shared(&self) -> (usize, usize);
    /// Kernel mappings the groups add now: boundaries inside the source's
    /// mappings where neighbouring OS pages show file pages that are not
    /// consecutive (or that the kernel does not merge for another reason,
    /// such as other huge-page advice). 0 unless the source counts them.
    fn seams(&self) -> usize {
        0
    }
    /// The mapping budget, process-wide: seams of every source now, and
    /// the most allowed. Unlimited unless the source counts them.
    fn seam_budget(&self) -> (usize, usize) {
        (0, usize::MAX)
    }
    /// Guards the kernel would not put back after a remap, so far
    /// (`SharedPages::guards_lost`). 0 unless the source has guards.
    fn guards_lost(&self) -> u64 {
        0
    }
    /// Registrations with the userfaultfd the kernel refused, so far
    /// (`SharedPages::registrations_refused`). 0 unless the source
    /// registers its pages.
    fn registrations_refused(&self) -> u64 {
        0
    }
    /// A mesh pass begins: what the source checks before every copy and
    /// cannot change unnoticed in the meantime (the file size limit) it
    /// may read once here, until [`SharePages::end_pass`]. Nothing by
    /// default.
    ///
    /// ```
    /// use pagewise::source::{PageSource, SharePages, SharedPages};
    /// let pages = SharedPages::new();
    /// let sharing = pages.sharing().unwrap();
    /// sharing.begin_pass();
    /// sharing.end_pass();
    /// ```
    fn begin_pass(&self) {}
    /// The mesh pass [`SharePages::begin_pass`] began is over: every copy
    /// checks for itself again.
    ///
    /// ```
    /// use pagewise::source::{PageSource, SharePages, SharedPages};
    /// let pages = SharedPages::new();
    /// pages.sharing().unwrap().end_pass();
    /// ```
    fn end_pass(&self) {}
}

// SAFETY: forwards every call to a source that upholds the contract.
unsafe impl<T: PageSource + ?Sized> PageSource for &'static T {
    fn map(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        (**self).map(size, align)
    }
    unsafe fn unmap(&self, ptr: NonNull<u8>, size: usize) {
        // SAFETY: forwarded.
        unsafe { (**self).unmap(ptr, size) }
    }
    unsafe fn purge(&self, ptr: NonNull<u8>, size: usize, how: Purge) -> bool {
        // SAFETY: forwarded.
        unsafe { (**self).purge(ptr, size, how) }
    }
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
    fn syscalls(&self) -> SyscallCounts {
        (**self).syscalls()
    }
    fn sharing(&self) -> Option<&dyn SharePages> {
        (**self).sharing()
    }
    fn serialize_threads(&self) -> bool {
        (**self).serialize_threads()
    }
    fn thp(&self) -> ThpMode {
        (**self).thp()
    }
    unsafe fn advise_huge(&self, ptr: NonNull<u8>, size: usize, huge: bool) -> bool {
        // SAFETY: forwarded.
        unsafe { (**self).advise_huge(ptr, size, huge) }
    }
}

/// The kernel's `membarrier` where there is one.
pub(crate) fn serialize_with_os() -> bool {
    #[cfg(all(target_os = "linux", not(miri)))]
    return crate::os::membarrier::serialize_threads();
    #[cfg(not(all(target_os = "linux", not(miri))))]
    false
}

/// The real page source: anonymous private mappings from the kernel.
///
/// Alignment is obtained without over-mapping in the common case: mappings are
/// requested at a hint address that is already aligned and advances past each
/// mapping, so the kernel's answer is aligned. Only when the kernel places the
/// mapping elsewhere does the source fall back to mapping `size + align` once
/// and trimming both ends (the system-call amplifier of allocators that map
/// and trim every time, here a rare event rather than one per page turnover).
///
/// ```
/// use pagewise::{PageSource, SystemPages, Purge};
/// let pages = SystemPages::new();
/// let p = pages.map(1 << 22, 1 << 22).unwrap();
/// assert_eq!(p.as_ptr() as usize % (1 << 22), 0);
/// // SAFETY: the mapping is ours and holds no live data.
/// unsafe {
///     assert!(pages.purge(p, pagewise::layout::os_page(), Purge::DontNeed));
///     pages.unmap(p, 1 << 22);
/// }
/// assert_eq!(pages.syscalls().madvise, 1);
/// ```
pub struct SystemPages {
    counters: SyscallCounters,
}

/// The next aligned address to hint at, shared by every `SystemPages` so
/// that independent sources (heaps, arena pools) do not hint at the same
/// ranges and fall back to over-mapping.
static HINT: AtomicUsize = AtomicUsize::new(HINT_START);

/// Where the aligned-hint search starts: 2 TiB, far above the heap and the
/// usual mmap area, below the 47-bit user address limit.
pub const HINT_START: usize = 2 << 40;
/// Where it wraps around: 80 TiB, below where Linux places PIE executables
/// (about 85 TiB) and the stack.
pub const HINT_END: usize = 80 << 40;

impl SystemPages {
    /// A source with fresh counters.
    pub const fn new() -> Self {
        SystemPages {
            counters: SyscallCounters::new(),
        }
    }

    fn mmap_at(&self, hint: usize, size: usize) -> Option<usize> {
        self.counters.mmap.fetch_add(1, Relaxed);
        // SAFETY: an anonymous private mapping without MAP_FIXED never replaces
        // existing mappings; the hint is only a hint.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        self.counters.mapped(size);
        Some(p as usize)
    }

    fn munmap_raw(&self, addr: usize, size: usize) {
        if size == 0 {
            return;
        }
        self.counters.munmap.fetch_add(1, Relaxed);
        // SAFETY: callers pass page-aligned ranges of mappings this source made
        // and no longer uses.
        let rc = unsafe { libc::munmap(addr as *mut libc::c_void, size) };
        if rc == 0 {
            self.counters.unmapped(size);
        }
    }
}

impl Default for SystemPages {
    fn default() -> Self {
        Self::new()
    }
}

/// Claims the next aligned hint, so concurrent callers (every source of
/// the process) try disjoint ranges.
pub(crate) fn next_hint(size: usize, align: usize) -> usize {
    let mut cur = HINT.load(Relaxed);
    loop {
        let start = (cur + align - 1) & !(align - 1);
        let next = if start + size > HINT_END {
            HINT_START
        } else {
            start + size
        };
        match HINT.compare_exchange_weak(cur, next, Relaxed, Relaxed) {
            Ok(_) => return start,
            Err(seen) => cur = seen,
        }
    }
}

/// Anonymous private memory for pagewise's own tables (zeroed; never the
/// global allocator), or `None`. Not counted: the tables it serves
/// (meshing's) are counted where they are used.
pub(crate) fn map_table(bytes: usize) -> Option<NonNull<u8>> {
    // SAFETY: no MAP_FIXED: replaces nothing.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(p.cast())
}

/// Returns memory of [`map_table`].
///
/// # Safety
/// `p..p+bytes` came from `map_table` and is no longer used.
pub(crate) unsafe fn unmap_table(p: NonNull<u8>, bytes: usize) {
    // SAFETY: per the caller.
    unsafe { libc::munmap(p.as_ptr().cast(), bytes) };
}

/// Milliseconds on the decay timer's clock ([`CLOCK`]).
pub(crate) fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer and CLOCK a clock every
    // supported OS has.
    unsafe { libc::clock_gettime(CLOCK, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Whether a purge of `size` bytes at `ptr` starts on an OS page boundary
/// and covers whole OS pages ([`crate::layout::os_page`]): sources refuse
/// any other purge, as a kernel whose pages are that size refuses a
/// misaligned `madvise` (`EINVAL`). Pagewise never asks for one; the check
/// is what makes a test at a `PAGEWISE_OS_PAGE` override fail if it did.
#[inline]
fn page_aligned(ptr: NonNull<u8>, size: usize) -> bool {
    let mask = crate::memory::layout::os_page() - 1;
    (ptr.as_ptr() as usize | size) & mask == 0
}

/// The decay timer's clock. Linux: CLOCK_MONOTONIC_COARSE, a vDSO read (no
/// kernel entry) with ~4 ms resolution, plenty for a timer measured in
/// hundreds of milliseconds. Elsewhere (macOS) the portable CLOCK_MONOTONIC.
#[cfg(target_os = "linux")]
const CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC_COARSE;
#[cfg(not(target_os = "linux"))]
const CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC;

/// Purges `p..p+size` the way `how` says, returning whether the OS did.
///
/// Linux (and other systems where `MADV_DONTNEED` discards): `DontNeed` is
/// `MADV_DONTNEED`, which drops the pages from RSS at once and makes a
/// private anonymous range read back as zeros; `Free` is `MADV_FREE`.
///
/// # Safety
/// The range is page-aligned, inside a live mapping of ours, no live data.
#[cfg(not(target_vendor = "apple"))]
unsafe fn purge_range(p: *mut u8, size: usize, how: Purge) -> bool {
    let advice = match how {
        Purge::DontNeed => libc::MADV_DONTNEED,
        Purge::Free => libc::MADV_FREE,
    };
    // SAFETY: per the caller.
    unsafe { libc::madvise(p.cast(), size, advice) == 0 }
}

/// macOS has no `madvise` that discards at once: its `MADV_DONTNEED` and
/// `MADV_FREE` are hints after which the pages keep their contents until
/// (and unless) the kernel takes them, so neither gives what `DontNeed`
/// promises (RSS drops now, the range reads as zeros, which the known-zero
/// logic of `alloc_zeroed`/`calloc` and of segment headers relies on).
/// `DontNeed` therefore maps fresh anonymous pages over the range
/// (`mmap(MAP_FIXED)`, as jemalloc decommits on macOS): the old pages are
/// freed at once and the range reads as zeros. XNU restores the old
/// mapping if such an overwrite fails, so a refusal leaves the range
/// committed, as the trait expects. `Free` is `MADV_FREE` (contents kept
/// until the kernel needs the pages; nothing assumes they read as zeros).
/// `MADV_FREE_REUSABLE` (what Apple's malloc uses) would drop the pages from
/// the task's footprint sooner but needs `MADV_FREE_REUSE` on every reuse
/// to keep the accounting right, a call on the allocation path pagewise
/// does not make.
///
/// # Safety
/// The range is page-aligned, inside a live mapping of ours, no live data.
#[cfg(target_vendor = "apple")]
unsafe fn purge_range(p: *mut u8, size: usize, how: Purge) -> bool {
    match how {
        // SAFETY: per the caller the range is ours and unused, so replacing
        // its pages (MAP_FIXED) destroys nothing anyone reads.
        Purge::DontNeed => unsafe {
            libc::mmap(
                p.cast(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANON | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            ) == p.cast()
        },
        // SAFETY: per the caller.
        Purge::Free => unsafe { libc::madvise(p.cast(), size, libc::MADV_FREE) == 0 },
    }
}

// SAFETY: mappings are fresh anonymous private mappings (zero-filled, RW),
// aligned by construction below, and never come from the global allocator.
// A `DontNeed` purge makes the range read back as zeros (`purge_range`).
unsafe impl PageSource for SystemPages {
    fn map(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        let hint = next_hint(size, align);
        let p = self.mmap_at(hint, size)?;
        if p % align == 0 {
            return NonNull::new(p as *mut u8);
        }
        // The kernel put it elsewhere: map once with slack and trim the ends.
        self.munmap_raw(p, size);
        let p = self.mmap_at(0, size + align)?;
        let start = (p + align - 1) & !(align - 1);
        self.munmap_raw(p, start - p);
        self.munmap_raw(start + size, p + align - start);
        NonNull::new(start as *mut u8)
    }

    unsafe fn unmap(&self, ptr: NonNull<u8>, size: usize) {
        self.munmap_raw(ptr.as_ptr() as usize, size);
    }

    unsafe fn purge(&self, ptr: NonNull<u8>, size: usize, how: Purge) -> bool {
        // One purge is one call, counted as `madvise` on every OS (on macOS
        // a `DontNeed` purge is an `mmap`, see `purge_range`).
        self.counters.madvise.fetch_add(1, Relaxed);
        if !page_aligned(ptr, size) {
            // What a kernel with pages of `os_page()` bytes answers
            // (EINVAL): with the `PAGEWISE_OS_PAGE` override on a kernel
            // with smaller pages, the call would succeed and hide the bug.
            return false;
        }
        // SAFETY: the caller guarantees the range is page-aligned, mapped by
        // us, and holds no live data.
        let ok = unsafe { purge_range(ptr.as_ptr(), size, how) };
        if ok {
            self.counters.purged.fetch_add(size as u64, Relaxed);
        }
        ok
    }

    fn now_ms(&self) -> u64 {
        monotonic_ms()
    }

    fn syscalls(&self) -> SyscallCounts {
        self.counters.snapshot()
    }

    fn serialize_threads(&self) -> bool {
        let ok = serialize_with_os();
        if ok {
            self.counters.barriers.fetch_add(1, Relaxed);
        }
        ok
    }

    fn thp(&self) -> ThpMode {
        crate::os::thp::system_mode()
    }

    unsafe fn advise_huge(&self, ptr: NonNull<u8>, size: usize, huge: bool) -> bool {
        self.counters.advised(huge);
        // SAFETY: per the caller, a range of our mapping; advice changes
        // no contents.
        huge_aligned(ptr, size) && unsafe { crate::os::thp::advise(ptr.as_ptr(), size, huge) }
    }
}

/// Whether a huge-page advice for `size` bytes at `ptr` covers whole
/// 2 MiB huge pages (pagewise never asks for another; both sources refuse).
#[inline]
pub(crate) fn huge_aligned(ptr: NonNull<u8>, size: usize) -> bool {
    size > 0 && (ptr.as_ptr() as usize | size) & (HUGE_PAGE - 1) == 0
}

/// Makes the `size` bytes at `ptr` read as zeros, as a fresh mapping and a
/// `MADV_DONTNEED` purge read. On Linux the OS pages inside go back to the
/// kernel ([`drop_pages`]); writing zeros instead faults in every page of
/// every 32 MiB fake segment, which was most of a heap test's time (the
/// model test spent 80 % of its 83 s in the kernel doing that). Elsewhere
/// and under Miri (which runs no system call), zeros are written.
///
/// # Safety
/// The range must be memory the caller owns, with nothing live in it.
unsafe fn zero_as_the_kernel_would(ptr: NonNull<u8>, size: usize) {
    #[cfg(all(any(target_os = "linux", target_os = "android"), not(miri)))]
    // SAFETY: the caller's range, nothing live in it.
    if unsafe { drop_pages(ptr, size) } {
        return;
    }
    // SAFETY: the caller's range, nothing live in it.
    unsafe { core::ptr::write_bytes(ptr.as_ptr(), 0, size) };
}

/// `MADV_DONTNEED` on the whole OS pages inside the range (memory from the
/// system allocator is private and anonymous, as a mapping is, so they then
/// read as zeros) and zeros written on the partial pages at its edges;
/// false, with nothing done, if the kernel refuses.
///
/// # Safety
/// The range must be memory the caller owns, with nothing live in it.
#[cfg(all(any(target_os = "linux", target_os = "android"), not(miri)))]
unsafe fn drop_pages(ptr: NonNull<u8>, size: usize) -> bool {
    let page = crate::memory::layout::os_page();
    let (start, end) = (ptr.as_ptr() as usize, ptr.as_ptr() as usize + size);
    let (lo, hi) = ((start + page - 1) & !(page - 1), end & !(page - 1));
    if lo >= hi {
        return false;
    }
    // SAFETY: whole pages inside the caller's range, nothing live in them.
    if unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED) } != 0 {
        return false;
    }
    // SAFETY: the partial pages before `lo` and after `hi`, in the range.
    unsafe {
        core::ptr::write_bytes(ptr.as_ptr(), 0, lo - start);
        core::ptr::write_bytes(hi as *mut u8, 0, end - hi);
    }
    true
}

/// The one alignment every fake mapping gets (the segment size); larger
/// alignments are refused, as a kernel might refuse a mapping.
pub const FAKE_ALIGN: usize = crate::memory::layout::SEGMENT;

/// A page source for tests: memory from the system allocator, a clock the
/// test moves by hand, and the same counters as [`SystemPages`].
///
/// It lets the policy above be checked exactly (every "syscall" is counted,
/// time is deterministic) and run under Miri, which cannot run `mmap`.
///
/// ```
/// use pagewise::{FakePages, PageSource};
/// let fake = FakePages::new();
/// fake.advance_ms(250);
/// assert_eq!(fake.now_ms(), 250);
/// ```
pub struct FakePages {
    clock: AtomicU64,
    counters: SyscallCounters,
    thp: AtomicU8,
}

impl FakePages {
    /// A source with the clock at zero, which says the kernel gives no
    /// huge pages ([`ThpMode::Never`]).
    pub const fn new() -> Self {
        Self::with_thp(ThpMode::Never)
    }
    /// A source with the clock at zero that says the kernel's huge-page
    /// mode is `mode` (the policy above then asks it for huge pages as
    /// it would ask the kernel; the fake only counts the advice).
    pub const fn with_thp(mode: ThpMode) -> Self {
        FakePages {
            clock: AtomicU64::new(0),
            counters: SyscallCounters::new(),
            thp: AtomicU8::new(mode as u8),
        }
    }
    /// Moves the fake clock forward.
    pub fn advance_ms(&self, ms: u64) {
        self.clock.fetch_add(ms, Relaxed);
    }
}

impl Default for FakePages {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: memory comes from `std::alloc::System` (not the global allocator),
// zeroed and aligned as asked; purge with DontNeed writes zeros, as the
// kernel's MADV_DONTNEED would make the range read.
unsafe impl PageSource for FakePages {
    fn map(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        self.counters.mmap.fetch_add(1, Relaxed);
        // Every fake mapping uses one alignment so `unmap` can rebuild the layout.
        if align > FAKE_ALIGN {
            return None;
        }
        let layout = core::alloc::Layout::from_size_align(size, FAKE_ALIGN).ok()?;
        // SAFETY: size is non-zero (callers map whole pages).
        let p =
            NonNull::new(unsafe { std::alloc::GlobalAlloc::alloc(&std::alloc::System, layout) })?;
        // SAFETY: the `size` bytes at `p` were just allocated for us.
        unsafe { zero_as_the_kernel_would(p, size) };
        self.counters.mapped(size);
        Some(p)
    }

    unsafe fn unmap(&self, ptr: NonNull<u8>, size: usize) {
        // The fake cannot split an allocation: it only accepts whole mappings,
        // which is all pagewise ever unmaps.
        self.counters.munmap.fetch_add(1, Relaxed);
        self.counters.unmapped(size);
        let layout = core::alloc::Layout::from_size_align(size, FAKE_ALIGN).expect("fake layout");
        // SAFETY: the caller returns a whole mapping made by `map` with this
        // size, and `map` used FAKE_ALIGN for every mapping.
        unsafe { std::alloc::GlobalAlloc::dealloc(&std::alloc::System, ptr.as_ptr(), layout) };
    }

    unsafe fn purge(&self, ptr: NonNull<u8>, size: usize, how: Purge) -> bool {
        self.counters.madvise.fetch_add(1, Relaxed);
        if !page_aligned(ptr, size) {
            // Refused as a kernel with pages of `os_page()` bytes would.
            return false;
        }
        self.counters.purged.fetch_add(size as u64, Relaxed);
        if how == Purge::DontNeed {
            // SAFETY: the caller guarantees the range is ours and holds no live data.
            unsafe { zero_as_the_kernel_would(ptr, size) };
        }
        true
    }

    fn now_ms(&self) -> u64 {
        self.clock.load(Relaxed)
    }

    fn syscalls(&self) -> SyscallCounts {
        self.counters.snapshot()
    }

    fn thp(&self) -> ThpMode {
        ThpMode::from_u8(self.thp.load(Relaxed))
    }

    /// Counted as the real source counts it; refused unless the range is
    /// whole huge pages.
    unsafe fn advise_huge(&self, ptr: NonNull<u8>, size: usize, huge: bool) -> bool {
        self.counters.advised(huge);
        huge_aligned(ptr, size)
    }

    /// Counted as the real source counts it; the kernel's `membarrier`
    /// where there is one (the fake's memory is real memory that real
    /// threads share), and under Miri, which runs no system call, a
    /// `SeqCst` fence.
    fn serialize_threads(&self) -> bool {
        self.counters.barriers.fetch_add(1, Relaxed);
        if !serialize_with_os() {
            core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
        }
        true
    }
}
