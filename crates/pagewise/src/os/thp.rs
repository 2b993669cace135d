//! Transparent huge pages: what the kernel offers, asking for them, and
//! how many back pagewise's memory now.
//!
//! Linux backs a 2 MiB-aligned part of an anonymous mapping with one huge
//! page when its `enabled` setting allows it: `always` (any mapping),
//! `madvise` (only ranges a program advised with `MADV_HUGEPAGE`, the
//! common distribution default) or `never`. A huge page costs one page
//! fault instead of 512 and one TLB entry instead of 512, but it is resident
//! whole as soon as one byte of it is touched: the policy of which parts of
//! the heap get one is in `memory/huge_pages.rs`; this file only reads the
//! setting and makes the calls.

use core::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// The huge page pagewise works with: the PMD size of x86-64 and of arm64
/// with 4 KiB pages. A kernel whose PMD huge page is another size (arm64
/// with 16 or 64 KiB pages) gets no advice at all ([`system_mode`] says
/// `Never`).
pub const HUGE_PAGE: usize = 2 << 20;
/// log2 of [`HUGE_PAGE`].
pub const HUGE_PAGE_SHIFT: usize = 21;

/// The `PAGEWISE_THP` setting: whether pagewise asks for huge pages.
///
/// ```
/// assert_eq!(pagewise::Thp::default(), pagewise::Thp::Auto);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum Thp {
    /// Follow the system: where the kernel grants huge pages on request
    /// (`madvise`) or everywhere (`always`), pagewise asks for them on the
    /// dense parts of the heap only, and under `always` tells the kernel
    /// to leave the rest alone (`MADV_NOHUGEPAGE` on each reservation), so
    /// a sparse page never pins 2 MiB; under `never`, or where the setting
    /// cannot be read, nothing.
    #[default]
    Auto = 0,
    /// No huge pages: never `MADV_HUGEPAGE`; under the kernel's own
    /// `always`, `MADV_NOHUGEPAGE` on each reservation, so that the kernel
    /// backs none either; elsewhere no advice at all.
    Never = 1,
    /// Ask for every 2 MiB region a slab page starts in, however small the
    /// heap, and make the calls even where the system setting reads
    /// `never` or cannot be read: fewer page faults for more memory.
    Always = 2,
}

impl Thp {
    /// The setting stored as `u8` (`Thp as u8`); `Auto` for anything else.
    pub(crate) const fn from_u8(v: u8) -> Thp {
        match v {
            1 => Thp::Never,
            2 => Thp::Always,
            _ => Thp::Auto,
        }
    }
}

/// What the kernel does with anonymous memory, for 2 MiB pages.
///
/// ```
/// use pagewise::thp::ThpMode;
/// let mode = pagewise::thp::system_mode();
/// assert!(matches!(mode, ThpMode::Never | ThpMode::Madvise | ThpMode::Always));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ThpMode {
    /// No huge pages (the setting says `never`, the process disabled them
    /// with `prctl(PR_SET_THP_DISABLE)`, the PMD page is not 2 MiB, or the
    /// setting cannot be read).
    Never = 1,
    /// Huge pages where a program asks (`MADV_HUGEPAGE`).
    Madvise = 2,
    /// Huge pages everywhere but where a program refuses them
    /// (`MADV_NOHUGEPAGE`).
    Always = 3,
}

impl ThpMode {
    pub(crate) const fn from_u8(v: u8) -> ThpMode {
        match v {
            2 => ThpMode::Madvise,
            3 => ThpMode::Always,
            _ => ThpMode::Never,
        }
    }
}

/// The mode read at the first call (0: not read yet).
static MODE: AtomicU8 = AtomicU8::new(0);

/// The kernel's mode for this process, read once (at the first call, from
/// `/sys/kernel/mm/transparent_hugepage/`: the 2 MiB size's own `enabled`
/// unless it says `inherit`, else the global one; `hpage_pmd_size` must be
/// 2 MiB; and `prctl(PR_GET_THP_DISABLE)`), without allocating. Racing
/// first calls read the same files; any answer is the same.
pub fn system_mode() -> ThpMode {
    let m = MODE.load(Relaxed);
    if m != 0 {
        return ThpMode::from_u8(m);
    }
    let mode = read_mode();
    MODE.store(mode as u8, Relaxed);
    mode
}

#[cfg(all(target_os = "linux", not(miri)))]
fn read_mode() -> ThpMode {
    // SAFETY: PR_GET_THP_DISABLE takes no pointer arguments.
    if unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) } == 1 {
        return ThpMode::Never;
    }
    let mut buf = [0u8; 96];
    let pmd = read_file(
        b"/sys/kernel/mm/transparent_hugepage/hpage_pmd_size\0",
        &mut buf,
    );
    if pmd.map(|s| s.trim_ascii()) != Some(&b"2097152"[..]) {
        return ThpMode::Never;
    }
    let own = read_file(
        b"/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/enabled\0",
        &mut buf,
    )
    .and_then(selected);
    if let Some(word) = own.filter(|w| *w != b"inherit") {
        return mode_of(Some(word));
    }
    let mut buf = [0u8; 96];
    mode_of(
        read_file(b"/sys/kernel/mm/transparent_hugepage/enabled\0", &mut buf).and_then(selected),
    )
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn read_mode() -> ThpMode {
    ThpMode::Never
}

/// The mode a word of the setting names.
#[cfg(all(target_os = "linux", not(miri)))]
fn mode_of(word: Option<&[u8]>) -> ThpMode {
    match word {
        Some(b"always") => ThpMode::Always,
        Some(b"madvise") => ThpMode::Madvise,
        _ => ThpMode::Never,
    }
}

/// The word in brackets of a sysfs choice (`always [madvise] never`).
#[cfg_attr(not(all(target_os = "linux", not(miri))), allow(dead_code))]
fn selected(text: &[u8]) -> Option<&[u8]> {
    let open = text.iter().position(|&b| b == b'[')?;
    let close = open + text[open..].iter().position(|&b| b == b']')?;
    Some(&text[open + 1..close])
}

/// Reads up to `buf.len()` bytes of the file at `path` (NUL-terminated).
#[cfg(all(target_os = "linux", not(miri)))]
fn read_file<'a>(path: &[u8], buf: &'a mut [u8]) -> Option<&'a [u8]> {
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    (n > 0).then(|| &buf[..n as usize])
}

/// Advises `ptr..ptr+len` (2 MiB-aligned, inside a mapping of ours) to be
/// backed by huge pages (`huge`), or never to be (`MADV_NOHUGEPAGE`).
/// Returns whether the kernel accepted.
///
/// # Safety
/// The range is inside a live anonymous mapping the caller owns.
#[cfg(all(target_os = "linux", not(miri)))]
pub(crate) unsafe fn advise(ptr: *mut u8, len: usize, huge: bool) -> bool {
    let advice = if huge {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    // SAFETY: per the caller; the advice changes no contents.
    unsafe { libc::madvise(ptr.cast(), len, advice) == 0 }
}

/// No huge pages to ask for here.
///
/// # Safety
/// None: nothing is called.
#[cfg(not(all(target_os = "linux", not(miri))))]
pub(crate) unsafe fn advise(_ptr: *mut u8, _len: usize, _huge: bool) -> bool {
    false
}

/// Bytes of pagewise's segments the kernel backs with huge pages now: the
/// `AnonHugePages` of every mapping in `/proc/self/smaps` that holds a
/// segment pagewise uses. Reads the file in pieces on the stack (it does
/// not allocate, so the C library's report may call it); `None` where it
/// cannot be read (not Linux, no `/proc`). Costs a pass over the process's
/// mappings: for reports and tests, not for a hot loop.
///
/// ```
/// let v: Vec<u8> = vec![1; 8 << 20];
/// let backed = pagewise::thp::heap_huge_page_bytes();
/// # #[cfg(target_os = "linux")]
/// assert!(backed.is_some());
/// # drop(v);
/// ```
pub fn heap_huge_page_bytes() -> Option<u64> {
    #[cfg(all(target_os = "linux", not(miri)))]
    return smaps_huge_bytes(|start, end| {
        let first = start >> crate::memory::layout::SEGMENT_SHIFT;
        let last = (end - 1) >> crate::memory::layout::SEGMENT_SHIFT;
        (first..=last).any(|s| {
            crate::memory::registry::header_of(s << crate::memory::layout::SEGMENT_SHIFT).is_some()
        })
    });
    #[cfg(not(all(target_os = "linux", not(miri))))]
    None
}

/// Sums `AnonHugePages` over the mappings of `/proc/self/smaps` for which
/// `ours(start, end)` says yes.
#[cfg(all(target_os = "linux", not(miri)))]
fn smaps_huge_bytes(mut ours: impl FnMut(usize, usize) -> bool) -> Option<u64> {
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe {
        libc::open(
            c"/proc/self/smaps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 4096];
    let mut have = 0; // bytes of an unfinished line at the front of `buf`
    let mut counting = false;
    let mut total = 0u64;
    loop {
        // SAFETY: the tail of `buf` is writable.
        let n = unsafe { libc::read(fd, buf[have..].as_mut_ptr().cast(), buf.len() - have) };
        if n <= 0 {
            break;
        }
        let end = have + n as usize;
        let mut line_start = 0;
        while let Some(nl) = buf[line_start..end].iter().position(|&b| b == b'\n') {
            let line = &buf[line_start..line_start + nl];
            if let Some(range) = mapping_range(line) {
                counting = ours(range.0, range.1);
            } else if counting {
                if let Some(kb) = line.strip_prefix(b"AnonHugePages:") {
                    total += leading_number(kb.trim_ascii_start()) * 1024;
                }
            }
            line_start += nl + 1;
        }
        // Keep the unfinished line; a line longer than the buffer (a
        // mapping's path) is dropped, which loses nothing we count.
        have = end - line_start;
        if have == buf.len() {
            have = 0;
        } else {
            buf.copy_within(line_start..end, 0);
        }
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    Some(total)
}

/// The address range of a mapping's first line in smaps
/// (`7f00-7f10 rw-p ...`), if `line` is one.
#[cfg(all(target_os = "linux", not(miri)))]
fn mapping_range(line: &[u8]) -> Option<(usize, usize)> {
    let dash = line.iter().position(|&b| b == b'-')?;
    let space = line.iter().position(|&b| b == b' ')?;
    if space < dash {
        return None;
    }
    Some((hex(&line[..dash])?, hex(&line[dash + 1..space])?))
}

#[cfg(all(target_os = "linux", not(miri)))]
fn hex(s: &[u8]) -> Option<usize> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    s.iter().try_fold(0usize, |acc, &b| {
        let d = (b as char).to_digit(16)?;
        Some(acc << 4 | d as usize)
    })
}

#[cfg(all(target_os = "linux", not(miri)))]
fn leading_number(s: &[u8]) -> u64 {
    s.iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0u64, |acc, &b| acc * 10 + (b - b'0') as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selected_word() {
        assert_eq!(selected(b"always [madvise] never\n"), Some(&b"madvise"[..]));
        assert_eq!(selected(b"[always] madvise never"), Some(&b"always"[..]));
        assert_eq!(selected(b"always madvise never"), None);
    }

    #[cfg(all(target_os = "linux", not(miri)))]
    #[test]
    fn smaps_lines() {
        assert_eq!(
            mapping_range(b"7f0000000000-7f0000200000 rw-p 00000000 00:00 0"),
            Some((0x7f00_0000_0000, 0x7f00_0020_0000))
        );
        assert_eq!(mapping_range(b"AnonHugePages:      2048 kB"), None);
        assert_eq!(leading_number(b"2048 kB"), 2048);
        // The whole file parses: every mapping counted gives a multiple of
        // 2 MiB, and nothing is more than the process maps.
        let all = smaps_huge_bytes(|_, _| true).unwrap();
        assert_eq!(all % HUGE_PAGE as u64, 0);
    }
}
