//! The geometry of pagewise's address space: OS pages, slices, segments.
//!
//! ```text
//! reservation (1 GiB of address space, mapped once, kept until trim/drop)
//! └── segment (32 MiB, aligned to 32 MiB: ptr & !(SEGMENT-1) finds its header)
//!     ├── slices 0-1: segment header (slice descriptors, commit bitmap)
//!     └── slices 2..512 (64 KiB each), grouped into spans:
//!         ├── slab page: one size class, 1..16 slices
//!         ├── large object: any number of slices
//!         └── free span: retained (dirty) or purged (clean)
//! ```
//! Objects above [`LARGE_MAX`] get a "huge" segment run of their own.

use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The smallest OS page pagewise works with: fixed-size structures indexed
/// by OS page (the commit bitmap of a segment) are sized for it. A kernel
/// with smaller pages (none that pagewise builds for) gets 4 KiB units,
/// which are whole numbers of its pages.
pub const MIN_OS_PAGE: usize = 4096;
/// log2 of [`MIN_OS_PAGE`].
pub const MIN_OS_PAGE_SHIFT: usize = 12;
/// The largest OS page pagewise works with: one [`SLICE`], the unit spans
/// are made of, so every span boundary is a page boundary.
pub const MAX_OS_PAGE: usize = SLICE;
/// log2 of [`SLICE`].
pub const SLICE_SHIFT: usize = 16;
/// The unit spans are measured in: 64 KiB.
pub const SLICE: usize = 1 << SLICE_SHIFT;
/// log2 of [`SEGMENT`].
pub const SEGMENT_SHIFT: usize = 25;
/// A segment: 32 MiB, aligned to its size, so a pointer finds its header by masking.
pub const SEGMENT: usize = 1 << SEGMENT_SHIFT;
/// Slices per segment, header slice included.
pub const SLICES_PER_SEGMENT: usize = SEGMENT / SLICE;
/// The most OS pages a segment can have (at [`MIN_OS_PAGE`]): the size of
/// the commit bitmap, of which the first [`os_pages_per_segment`] bits are used.
pub const MAX_OS_PAGES_PER_SEGMENT: usize = SEGMENT / MIN_OS_PAGE;
/// Largest object served from spans inside a segment (a segment less its
/// header, at most two slices); larger ones are huge. Up to a whole segment,
/// so that buffers of a few MiB to tens of MiB share one best-fit pool and
/// one retention FIFO, whatever their size, rather than a 20 MiB object
/// waiting in a run of its own that a 10 MiB one cannot use.
pub const LARGE_MAX: usize = SEGMENT - 2 * SLICE;
/// Largest alignment a span inside a segment can honour by splitting.
pub const LARGE_ALIGN_MAX: usize = SEGMENT / 4;

/// Rounds `x` up to a multiple of the power of two `to`.
#[inline]
pub const fn align_up(x: usize, to: usize) -> usize {
    (x + to - 1) & !(to - 1)
}

/// `x` unchanged, but out of the optimizer's sight: no instruction of its
/// own, yet what it returns is a value computed once, which the compiler
/// neither recomputes from its inputs in another form nor folds into the
/// expressions that use it. Where it rewrites `(a & m) >> s` as
/// `(a >> s) & (m >> s)` this keeps the masked value's register in use
/// rather than shifting and masking the address over again.
#[inline(always)]
pub(crate) fn opaque(x: usize) -> usize {
    #[cfg(all(not(miri), any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let mut x = x;
        // SAFETY: the template is a comment: no instruction runs, no memory
        // or flag is touched; the register holds `x` in and out.
        unsafe {
            core::arch::asm!(
                "/* {0} */",
                inout(reg) x,
                options(pure, nomem, nostack, preserves_flags)
            )
        };
        x
    }
    #[cfg(not(all(not(miri), any(target_arch = "x86_64", target_arch = "aarch64"))))]
    x
}

/// The segment an address belongs to (if it belongs to one).
#[inline]
pub fn segment_base(addr: usize) -> usize {
    addr & !(SEGMENT - 1)
}

/// log2 of the OS page, 0 until it is first read.
static OS_PAGE_SHIFT: AtomicUsize = AtomicUsize::new(0);

/// The OS page: the unit of commit tracking, of carving slab pages and of
/// purging, and the alignment of `valloc`. Read at run time, once, before
/// the first segment is made (see [`os_page_shift`]), and fixed after.
///
/// ```
/// let page = pagewise::layout::os_page();
/// assert!(page.is_power_of_two());
/// assert!((pagewise::layout::MIN_OS_PAGE..=pagewise::layout::MAX_OS_PAGE).contains(&page));
/// ```
#[inline]
pub fn os_page() -> usize {
    1 << os_page_shift()
}

/// log2 of [`os_page`]. The first call (whichever thread makes it: any path
/// that maps, carves, commits or purges) reads the page size from the
/// system (`sysconf(_SC_PAGESIZE)`; 4096 under Miri) and the testing
/// override `PAGEWISE_OS_PAGE` with `getenv`, without allocating, and
/// publishes it; racing first calls compute the same value, and the first
/// store wins, so every caller sees one page size for the process's life.
/// Read only on slow paths (carving, committing, purging, rounding large
/// and huge sizes): the thread cache's allocate and free never read it.
#[inline]
pub fn os_page_shift() -> usize {
    let s = OS_PAGE_SHIFT.load(Relaxed);
    if s != 0 {
        return s;
    }
    init_os_page()
}

/// OS pages per slice.
#[inline]
pub fn os_pages_per_slice() -> usize {
    SLICE >> os_page_shift()
}

/// OS pages per segment (one bit each in the commit bitmap).
#[inline]
pub fn os_pages_per_segment() -> usize {
    SEGMENT >> os_page_shift()
}

#[cold]
fn init_os_page() -> usize {
    let real = system_page();
    let var = crate::config::Variable::OsPage;
    let over = var.raw();
    let mut buf = [0u8; 20];
    let page = match choose_os_page(real, over) {
        Ok(page) => page,
        Err(PageRefusal::Override(page)) => {
            crate::config::warn::malformed(var, over.unwrap_or_default(), var.accepted());
            page
        }
        Err(PageRefusal::System) => {
            crate::fault::write_stderr(&[
                b"pagewise: unsupported OS page size of ",
                decimal(real, &mut buf),
                b" bytes (pagewise needs a power of two of at most 64 KiB); aborting\n",
            ]);
            std::process::abort();
        }
    };
    let shift = page.trailing_zeros() as usize;
    match OS_PAGE_SHIFT.compare_exchange(0, shift, Relaxed, Relaxed) {
        Ok(_) => shift,
        Err(first) => first,
    }
}

/// Why [`choose_os_page`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageRefusal {
    /// The override is malformed or out of range: the page to use instead
    /// (the system's), after a one-line message.
    Override(usize),
    /// The system's page is not one pagewise can work with (not a power of
    /// two, or above [`MAX_OS_PAGE`]): pagewise aborts with a one-line message.
    System,
}

/// The page size pagewise uses, given the system's (`real`) and the value
/// of `PAGEWISE_OS_PAGE`, if set: a size ([`crate::config::parse_size`]
/// syntax, `16K`) that is a power of two, a multiple of the system's page,
/// and at most [`MAX_OS_PAGE`]. A system page below [`MIN_OS_PAGE`] counts
/// as [`MIN_OS_PAGE`] (a whole number of its pages).
///
/// ```
/// use pagewise::layout::{choose_os_page, PageRefusal};
/// assert_eq!(choose_os_page(4096, None), Ok(4096));
/// assert_eq!(choose_os_page(4096, Some(b"16K")), Ok(16384));
/// assert_eq!(choose_os_page(4096, Some(b"64KiB")), Ok(65536));
/// assert_eq!(choose_os_page(16384, Some(b"4K")), Err(PageRefusal::Override(16384)));
/// assert_eq!(choose_os_page(4096, Some(b"128K")), Err(PageRefusal::Override(4096)));
/// assert_eq!(choose_os_page(4096, Some(b"12K")), Err(PageRefusal::Override(4096)));
/// assert_eq!(choose_os_page(2048, None), Ok(4096));
/// assert_eq!(choose_os_page(1 << 17, None), Err(PageRefusal::System));
/// assert_eq!(choose_os_page(12288, None), Err(PageRefusal::System));
/// ```
pub fn choose_os_page(real: usize, over: Option<&[u8]>) -> Result<usize, PageRefusal> {
    if !real.is_power_of_two() || real > MAX_OS_PAGE {
        return Err(PageRefusal::System);
    }
    let real = real.max(MIN_OS_PAGE);
    let Some(text) = over else {
        return Ok(real);
    };
    match crate::config::parse_size(text) {
        Some(p) if p.is_power_of_two() && p as usize >= real && p as usize <= MAX_OS_PAGE => {
            Ok(p as usize)
        }
        _ => Err(PageRefusal::Override(real)),
    }
}

/// The system's page size.
#[cfg(not(miri))]
pub(crate) fn system_page() -> usize {
    // SAFETY: sysconf reads a constant of the system; it does not allocate.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n <= 0 {
        MIN_OS_PAGE
    } else {
        n as usize
    }
}

/// Under Miri (no `sysconf`): the common 4 KiB.
#[cfg(miri)]
pub(crate) fn system_page() -> usize {
    MIN_OS_PAGE
}

/// `x` in decimal, in `buf`.
fn decimal(mut x: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (x % 10) as u8;
        x /= 10;
        if x == 0 {
            return &buf[i..];
        }
    }
}
