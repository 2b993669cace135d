//! glibc's introspection calls, answered with pagewise's figures:
//! `mallinfo2` and `mallinfo`, `malloc_stats`, `malloc_info`, `mallopt`.
//! The field mapping is tabled in docs/guide/observing-memory.md.

use core::ffi::{c_int, c_void};
use core::fmt::Write;

/// glibc's `struct mallinfo2`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Mallinfo2 {
    /// Committed bytes outside huge objects (glibc: non-mmapped space).
    pub arena: usize,
    /// Free slots in slab pages (glibc: free chunks).
    pub ordblks: usize,
    /// Free slots in thread caches (glibc: fastbin chunks).
    pub smblks: usize,
    /// Huge objects (glibc: mmapped chunks).
    pub hblks: usize,
    /// Bytes of huge objects (glibc: mmapped bytes).
    pub hblkhd: usize,
    /// Peak committed bytes (glibc: unused, 0).
    pub usmblks: usize,
    /// Bytes of free slots in thread caches (glibc: fastbin bytes).
    pub fsmblks: usize,
    /// Live bytes outside huge objects (glibc: allocated bytes).
    pub uordblks: usize,
    /// Committed free bytes: free slots and retained spans (glibc: free bytes).
    pub fordblks: usize,
    /// Retained bytes, what `malloc_trim` gives back (glibc: top chunk).
    pub keepcost: usize,
}

/// glibc's legacy `struct mallinfo` (int fields).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Mallinfo {
    /// As [`Mallinfo2::arena`], saturated at `INT_MAX`.
    pub arena: c_int,
    /// As [`Mallinfo2::ordblks`], saturated.
    pub ordblks: c_int,
    /// As [`Mallinfo2::smblks`], saturated.
    pub smblks: c_int,
    /// As [`Mallinfo2::hblks`], saturated.
    pub hblks: c_int,
    /// As [`Mallinfo2::hblkhd`], saturated.
    pub hblkhd: c_int,
    /// As [`Mallinfo2::usmblks`], saturated.
    pub usmblks: c_int,
    /// As [`Mallinfo2::fsmblks`], saturated.
    pub fsmblks: c_int,
    /// As [`Mallinfo2::uordblks`], saturated.
    pub uordblks: c_int,
    /// As [`Mallinfo2::fordblks`], saturated.
    pub fordblks: c_int,
    /// As [`Mallinfo2::keepcost`], saturated.
    pub keepcost: c_int,
}

fn cached(s: &pw::Stats) -> (u64, u64) {
    s.classes.iter().fold((0, 0), |(n, b), c| {
        (n + c.cached_slots, b + c.cached_slots * c.slot_size)
    })
}

fn info2(s: &pw::Stats) -> Mallinfo2 {
    let free_slots: u64 = s.classes.iter().map(|c| c.free_slots).sum();
    let (cached_n, cached_b) = cached(s);
    let z = |x: u64| x as usize;
    Mallinfo2 {
        arena: z(s.committed_bytes.saturating_sub(s.huge.bytes)),
        ordblks: z(free_slots),
        smblks: z(cached_n),
        hblks: z(s.huge.count),
        hblkhd: z(s.huge.bytes),
        usmblks: z(s.peak_committed_bytes),
        fsmblks: z(cached_b),
        uordblks: z(s.live_bytes.saturating_sub(s.huge.bytes)),
        fordblks: z(s.free_slot_bytes + s.retained_bytes),
        keepcost: z(s.retained_bytes),
    }
}

/// glibc's `mallinfo2`, from pagewise's counters (see docs/guide/observing-memory.md).
#[no_mangle]
pub extern "C" fn mallinfo2() -> Mallinfo2 {
    info2(&pw::stats())
}

/// glibc's legacy `mallinfo`: [`mallinfo2`] with each field saturated at
/// `INT_MAX`.
#[no_mangle]
pub extern "C" fn mallinfo() -> Mallinfo {
    let m = mallinfo2();
    let i = |x: usize| x.min(c_int::MAX as usize) as c_int;
    Mallinfo {
        arena: i(m.arena),
        ordblks: i(m.ordblks),
        smblks: i(m.smblks),
        hblks: i(m.hblks),
        hblkhd: i(m.hblkhd),
        usmblks: i(m.usmblks),
        fsmblks: i(m.fsmblks),
        uordblks: i(m.uordblks),
        fordblks: i(m.fordblks),
        keepcost: i(m.keepcost),
    }
}

/// glibc's `malloc_stats`: pagewise's report on stderr (formatted on the
/// stack, written with `write(2)`: nothing allocates, no lock is held
/// while writing).
#[no_mangle]
pub extern "C" fn malloc_stats() {
    crate::pagewise_stats_print(2);
}

/// Writes the XML of [`malloc_info`].
fn info_xml(w: &mut impl Write, s: &pw::Stats) -> core::fmt::Result {
    let m = info2(s);
    let (cached_n, cached_b) = cached(s);
    let free_slots = m.ordblks as u64;
    let current = s.committed_bytes + s.metadata_bytes;
    writeln!(w, "<malloc version=\"1\">")?;
    writeln!(w, "<heap nr=\"0\">")?;
    writeln!(w, "<sizes>")?;
    let mut from = 1;
    for c in s.classes.iter() {
        if c.free_slots > 0 {
            writeln!(
                w,
                "<size from=\"{from}\" to=\"{}\" total=\"{}\" count=\"{}\"/>",
                c.slot_size,
                c.free_slots * c.slot_size,
                c.free_slots
            )?;
        }
        from = c.slot_size + 1;
    }
    writeln!(w, "</sizes>")?;
    writeln!(
        w,
        "<total type=\"fast\" count=\"{cached_n}\" size=\"{cached_b}\"/>"
    )?;
    let rest = s.free_slot_bytes.saturating_sub(cached_b) + s.retained_bytes;
    let rest_n = free_slots - cached_n.min(free_slots);
    writeln!(
        w,
        "<total type=\"rest\" count=\"{rest_n}\" size=\"{rest}\"/>"
    )?;
    writeln!(w, "<system type=\"current\" size=\"{current}\"/>")?;
    writeln!(
        w,
        "<system type=\"max\" size=\"{}\"/>",
        s.peak_committed_bytes
    )?;
    writeln!(w, "<aspace type=\"total\" size=\"{}\"/>", s.reserved_bytes)?;
    writeln!(w, "<aspace type=\"mprotect\" size=\"{current}\"/>")?;
    writeln!(w, "</heap>")?;
    writeln!(
        w,
        "<total type=\"fast\" count=\"{cached_n}\" size=\"{cached_b}\"/>"
    )?;
    writeln!(
        w,
        "<total type=\"rest\" count=\"{rest_n}\" size=\"{rest}\"/>"
    )?;
    writeln!(
        w,
        "<total type=\"mmap\" count=\"{}\" size=\"{}\"/>",
        s.huge.count, s.huge.bytes
    )?;
    writeln!(w, "<system type=\"current\" size=\"{current}\"/>")?;
    writeln!(
        w,
        "<system type=\"max\" size=\"{}\"/>",
        s.peak_committed_bytes
    )?;
    writeln!(w, "<aspace type=\"total\" size=\"{}\"/>", s.reserved_bytes)?;
    writeln!(w, "<aspace type=\"mprotect\" size=\"{current}\"/>")?;
    writeln!(
        w,
        "<pagewise live=\"{}\" live_allocations=\"{}\" committed=\"{}\" retained=\"{}\" metadata=\"{}\" purged=\"{}\" heaps=\"{}\"/>",
        s.live_bytes, s.live_allocations, s.committed_bytes, s.retained_bytes, s.metadata_bytes, s.purged_bytes, s.heaps
    )?;
    writeln!(w, "</malloc>")
}

extern "C" {
    fn fwrite(ptr: *const c_void, size: usize, n: usize, stream: *mut c_void) -> usize;
}

/// glibc's `malloc_info`: pagewise's figures as XML shaped like glibc's
/// (`<malloc version="1">`, one `<heap nr="0">` for the whole process,
/// free slots by size class as `<size>`, thread caches as the "fast" total,
/// huge objects as "mmap", plus a `<pagewise .../>` element), written to
/// `stream`. Returns 0; `EINVAL` for `options != 0` (as glibc) or a null
/// stream. The text is formatted in a stack buffer first, so the `FILE`'s
/// own buffer (which stdio may `malloc`) is allocated with no pagewise
/// lock held.
///
/// # Safety
/// `stream` is null or a valid `FILE *`.
#[no_mangle]
pub unsafe extern "C" fn malloc_info(options: c_int, stream: *mut c_void) -> c_int {
    if options != 0 || stream.is_null() {
        return libc::EINVAL;
    }
    let s = pw::stats();
    let mut buf = [0u8; 16 << 10];
    let mut w = crate::out::SliceWriter::new(&mut buf);
    let _ = info_xml(&mut w, &s);
    let n = w.written().len();
    // SAFETY: `n` initialised bytes of our buffer; a valid stream (caller).
    unsafe { fwrite(buf.as_ptr().cast(), 1, n, stream) };
    0
}

/// glibc's `M_TRIM_THRESHOLD`.
pub const M_TRIM_THRESHOLD: c_int = -1;
/// glibc's `M_ARENA_MAX`.
pub const M_ARENA_MAX: c_int = -8;

/// glibc's `mallopt`, for the parameters with a pagewise meaning:
/// `M_TRIM_THRESHOLD` (free memory above it goes back to the OS) sets the
/// retention ceiling (`retain_max`, `PAGEWISE_RETAIN_MAX`) to `value`
/// bytes and returns 1 (0 for a negative value). Every other parameter
/// returns 0 and changes nothing: `M_ARENA_MAX` because pagewise has no
/// arenas to cap (one heap per thread, each used by its thread alone, and
/// heaps of exited threads reused), the others because their mechanism
/// (fastbins, `sbrk` padding, an `mmap` threshold, perturbing) does not
/// exist. glibc returns 1 for unknown parameters; 0 here tells the caller
/// that nothing changed.
#[no_mangle]
pub extern "C" fn mallopt(param: c_int, value: c_int) -> c_int {
    match param {
        M_TRIM_THRESHOLD if value >= 0 => {
            let mut digits = [0u8; 20];
            let text = crate::out::decimal(value as usize, &mut digits);
            // SAFETY: ASCII digits.
            let text = unsafe { core::str::from_utf8_unchecked(text) };
            pw::options::set("retain_max", text).is_ok() as c_int
        }
        _ => 0,
    }
}
