//! The operating system's own view of the process, read from /proc without
//! allocating, to check pagewise's accounting against it (the reports of
//! `crate::report`). Off Linux the files do not exist and every figure
//! reads zero.

/// Where pagewise maps its memory: the core's page source places its
/// mappings at aligned hints that start at 2 TiB and climb (`source.rs`:
/// `HINT_START`), falling back to a kernel-chosen address only when a hint
/// is refused. The range stops at 80 TiB, below where x86-64 Linux puts
/// position-independent executables and their brk heap (from
/// 0x5555_5555_4000, i.e. 85 TiB, plus randomisation); pagewise would need
/// 78 TiB of address space to reach it. Unnamed anonymous mappings that
/// start here, or that hold a registered pagewise segment, are pagewise's.
pub(crate) const PAGEWISE_RANGE: core::ops::Range<usize> =
    crate::os::source::HINT_START..crate::os::source::HINT_END;

/// Resident memory as the kernel reports it, in bytes.
///
/// ```
/// let os = pagewise::report::OsMemory::now();
/// # #[cfg(target_os = "linux")]
/// assert!(os.vm_rss > 0 && os.vm_hwm >= os.vm_rss);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OsMemory {
    /// `VmRSS` (/proc/self/status): resident set size now.
    pub vm_rss: u64,
    /// `VmHWM`: the peak resident set size.
    pub vm_hwm: u64,
    /// `RssAnon`: resident anonymous memory.
    pub rss_anon: u64,
    /// `RssFile`: resident file-backed memory.
    pub rss_file: u64,
    /// `RssShmem`: resident shared memory.
    pub rss_shmem: u64,
    /// Resident bytes of mappings in pagewise's address range (smaps).
    pub pagewise_rss: u64,
    /// Of those, bytes the kernel backs with huge pages (`AnonHugePages`).
    pub pagewise_huge_pages: u64,
    /// Resident anonymous bytes of other mappings: stacks, the loader's and
    /// libc's data, the program's .data/.bss, mappings it made itself.
    pub other_anon_rss: u64,
    /// Resident file-backed bytes of other mappings (code, read-only data).
    pub file_rss: u64,
    /// Page faults of the process so far that the kernel served without
    /// reading a file or swap (`ru_minflt` of `getrusage`): every first
    /// touch of an OS page (or of a huge page) pagewise committed counts
    /// one, and so does a touch of memory it purged and reuses. All
    /// threads, the program's own faults too.
    pub minor_faults: u64,
    /// Page faults that read a file or swap (`ru_majflt`).
    pub major_faults: u64,
}

/// Reads a whole small file into `buf`, returning the length read.
fn read_file(path: &[u8], buf: &mut [u8]) -> Option<usize> {
    // SAFETY: `path` is NUL-terminated (callers pass literals ending in \0).
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut len = 0;
    while len < buf.len() {
        // SAFETY: reading into the unused tail of our buffer.
        let n = unsafe { libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len) };
        if n <= 0 {
            break;
        }
        len += n as usize;
    }
    // SAFETY: `fd` is ours.
    unsafe { libc::close(fd) };
    Some(len)
}

/// Parses `Key:   1234 kB` lines: the value in bytes if `line` starts with `key`.
fn kb_field(line: &[u8], key: &[u8]) -> Option<u64> {
    let rest = line.strip_prefix(key)?;
    let mut v = 0u64;
    let mut seen = false;
    for &b in rest {
        if b.is_ascii_digit() {
            v = v.saturating_mul(10).saturating_add((b - b'0') as u64);
            seen = true;
        } else if seen {
            break;
        }
    }
    seen.then_some(v * 1024)
}

fn hex_prefix(s: &[u8]) -> Option<(usize, usize)> {
    let mut v = 0usize;
    let mut n = 0;
    for &b in s {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => break,
        };
        v = v.checked_mul(16)?.checked_add(d as usize)?;
        n += 1;
    }
    (n > 0).then_some((v, n))
}

/// The name the kernel gives the memfd files of a meshing heap
/// (`PAGEWISE_MESH=1`: `memfd_create("pagewise-mesh")`).
const MESH_FILE: &[u8] = b"/memfd:pagewise-mesh";

/// A smaps mapping header (`start-end perms offset dev inode [path]`): the
/// start address, and whether the mapping may be pagewise's: anonymous and
/// unnamed (no path and no `[heap]`/`[stack]`-style name), or a view of a
/// meshing heap's memfd file.
fn mapping_start(line: &[u8]) -> Option<(usize, bool)> {
    let (start, n) = hex_prefix(line)?;
    if line.get(n) != Some(&b'-') {
        return None;
    }
    let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
    let inode = fields.nth(4);
    let path = fields.next();
    let unnamed = inode == Some(b"0") && path.is_none();
    let mesh_file = path.is_some_and(|p| p.starts_with(MESH_FILE));
    Some((start, unnamed || mesh_file))
}

/// Accumulates smaps lines.
#[derive(Default)]
struct Smaps {
    in_pagewise: bool,
    rss: u64,
    anon: u64,
    huge: u64,
    out: OsMemory,
}

impl Smaps {
    fn line(&mut self, line: &[u8]) {
        if let Some((start, unnamed)) = mapping_start(line) {
            self.end_mapping();
            self.in_pagewise = unnamed
                && (PAGEWISE_RANGE.contains(&start) || crate::raw::owns(start as *const u8));
        } else if let Some(v) = kb_field(line, b"Rss:") {
            self.rss = v;
        } else if let Some(v) = kb_field(line, b"Anonymous:") {
            self.anon = v;
        } else if let Some(v) = kb_field(line, b"AnonHugePages:") {
            self.huge = v;
        }
    }

    fn end_mapping(&mut self) {
        if self.in_pagewise {
            self.out.pagewise_rss += self.rss;
            self.out.pagewise_huge_pages += self.huge;
        } else {
            let anon = self.anon.min(self.rss);
            self.out.other_anon_rss += anon;
            self.out.file_rss += self.rss - anon;
        }
        self.rss = 0;
        self.anon = 0;
        self.huge = 0;
    }
}

impl OsMemory {
    /// Reads /proc/self/status and /proc/self/smaps now (a few hundred
    /// microseconds: smaps lists every mapping). Fields that cannot be read
    /// stay zero. Allocates nothing.
    ///
    /// ```
    /// let os = pagewise::report::OsMemory::now();
    /// assert!(os.pagewise_rss <= os.vm_rss.max(os.pagewise_rss));
    /// ```
    pub fn now() -> OsMemory {
        os_memory()
    }
}

/// [`OsMemory::now`].
fn os_memory() -> OsMemory {
    let mut m = Smaps::default();
    read_smaps(&mut m);
    let mut out = m.out;
    (out.minor_faults, out.major_faults) = faults();
    let mut buf = [0u8; 8192];
    if let Some(n) = read_file(b"/proc/self/status\0", &mut buf) {
        for line in buf[..n].split(|&b| b == b'\n') {
            if let Some(v) = kb_field(line, b"VmRSS:") {
                out.vm_rss = v;
            } else if let Some(v) = kb_field(line, b"VmHWM:") {
                out.vm_hwm = v;
            } else if let Some(v) = kb_field(line, b"RssAnon:") {
                out.rss_anon = v;
            } else if let Some(v) = kb_field(line, b"RssFile:") {
                out.rss_file = v;
            } else if let Some(v) = kb_field(line, b"RssShmem:") {
                out.rss_shmem = v;
            }
        }
    }
    out
}

/// The process's minor and major page faults so far (zero if the kernel
/// will not say).
fn faults() -> (u64, u64) {
    #[cfg(miri)]
    return (0, 0);
    // SAFETY: `rusage` is plain integers, all-zero valid.
    let mut u: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: `u` is ours to fill; RUSAGE_SELF needs no more.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return (0, 0);
    }
    (u.ru_minflt as u64, u.ru_majflt as u64)
}

fn read_smaps(m: &mut Smaps) {
    // SAFETY: a NUL-terminated literal path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/smaps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return;
    }
    let mut buf = [0u8; 16384];
    let mut len = 0;
    loop {
        // SAFETY: reading into the unused tail of our buffer.
        let n = unsafe { libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len) };
        if n <= 0 {
            break;
        }
        len += n as usize;
        let mut start = 0;
        while let Some(nl) = buf[start..len].iter().position(|&b| b == b'\n') {
            m.line(&buf[start..start + nl]);
            start += nl + 1;
        }
        if start == 0 && len == buf.len() {
            // A line longer than the buffer (a very long path): skip it.
            len = 0;
            continue;
        }
        buf.copy_within(start..len, 0);
        len -= start;
    }
    if len > 0 {
        m.line(&buf[..len]);
    }
    m.end_mapping();
    // SAFETY: `fd` is ours.
    unsafe { libc::close(fd) };
}

/// Resident bytes now and, of them, the file-backed and shared ones
/// (`RssFile + RssShmem`), from /proc/self/statm: cheap, for sampling.
#[cfg(all(target_os = "linux", not(miri)))]
pub(crate) fn statm() -> (u64, u64) {
    let mut buf = [0u8; 128];
    let Some(n) = read_file(b"/proc/self/statm\0", &mut buf) else {
        return (0, 0);
    };
    let mut fields = buf[..n].split(|&b| b == b' ').map(|f| {
        f.iter()
            .take_while(|b| b.is_ascii_digit())
            .fold(0u64, |a, &b| {
                a.saturating_mul(10).saturating_add((b - b'0') as u64)
            })
    });
    let _size = fields.next();
    let resident = fields.next().unwrap_or(0);
    let shared = fields.next().unwrap_or(0);
    // statm counts the kernel's pages: the real page size, whatever the
    // `PAGEWISE_OS_PAGE` testing override makes pagewise use.
    // SAFETY: sysconf reads a constant; it does not allocate.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    (resident * page, shared * page)
}

/// The process's name (`/proc/self/comm`, at most 15 bytes, without its
/// newline) copied into `buf`; empty if it cannot be read.
pub(crate) fn comm(buf: &mut [u8; 64]) -> &[u8] {
    let n = read_file(b"/proc/self/comm\0", buf).unwrap_or(0);
    let mut s = &buf[..n];
    while let [rest @ .., b'\n'] = s {
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields() {
        assert_eq!(kb_field(b"VmRSS:\t  1234 kB", b"VmRSS:"), Some(1234 * 1024));
        assert_eq!(kb_field(b"VmHWM: 1 kB", b"VmRSS:"), None);
        assert_eq!(
            mapping_start(b"7f12ab-7f12ff rw-p 00000000 00:00 0 "),
            Some((0x7f12ab, true))
        );
        assert_eq!(
            mapping_start(b"5555-6666 r-xp 00026000 fe:00 326279     /usr/bin/bash"),
            Some((0x5555, false))
        );
        assert_eq!(
            mapping_start(b"5555-6666 rw-p 00000000 00:00 0     [heap]"),
            Some((0x5555, false))
        );
        assert_eq!(mapping_start(b"Rss: 4 kB"), None);
    }

    #[test]
    fn attributes_only_pagewise_mappings_to_pagewise() {
        // A position-independent executable (text, bss, brk heap) at 85 TiB
        // is not pagewise's; the reservation at 2 TiB is.
        let smaps = "\
20002000000-20042000000 rw-p 00000000 00:00 0 
Rss:                 144 kB
Anonymous:           144 kB
555555554000-555555583000 r--p 00000000 fe:00 326246                     /usr/bin/bash
Rss:                 188 kB
Anonymous:             0 kB
555555689000-555555693000 rw-p 00000000 00:00 0 
Rss:                  40 kB
Anonymous:            40 kB
555555693000-5555556b4000 rw-p 00000000 00:00 0                          [heap]
Rss:                  12 kB
Anonymous:            12 kB
7ffff7844000-7ffff799a000 r-xp 00026000 fe:00 326279                     /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                1008 kB
Anonymous:             0 kB
";
        let mut m = Smaps::default();
        for line in smaps.lines() {
            m.line(line.as_bytes());
        }
        m.end_mapping();
        assert_eq!(m.out.pagewise_rss, 144 * 1024);
        assert_eq!(m.out.other_anon_rss, 52 * 1024);
        assert_eq!(m.out.file_rss, (188 + 1008) * 1024);
    }

    #[cfg(all(target_os = "linux", not(miri)))]
    #[test]
    fn a_meshing_heaps_memfd_mappings_are_pagewises() {
        // With PAGEWISE_MESH=1 the heap is memfd files mapped shared
        // (meshed pages split the mapping); another memfd is not pagewise's.
        let smaps = "\
20002000000-20002010000 rw-s 00000000 00:01 2050                       /memfd:pagewise-mesh (deleted)
Rss:                  64 kB
Anonymous:             0 kB
20002010000-20002011000 rw-s 40010000 00:01 2050                       /memfd:pagewise-mesh (deleted)
Rss:                   4 kB
Anonymous:             0 kB
7f0000000000-7f0000100000 rw-s 00000000 00:01 2051                       /memfd:wayland (deleted)
Rss:                  32 kB
Anonymous:             0 kB
";
        let mut m = Smaps::default();
        for line in smaps.lines() {
            m.line(line.as_bytes());
        }
        m.end_mapping();
        assert_eq!(m.out.pagewise_rss, 68 * 1024);
        assert_eq!(m.out.file_rss, 32 * 1024);
    }

    #[cfg(not(miri))]
    #[test]
    fn reads_this_process() {
        // The two views are read a moment apart; they agree closely unless
        // another test's thread mapped or gave back memory in between (the
        // unit tests share the process): a few tries, each with both views.
        let agree = (0..8).any(|_| {
            let m = os_memory();
            assert!(m.vm_rss > 0 && m.vm_hwm >= m.vm_rss);
            let smaps_total = m.pagewise_rss + m.other_anon_rss + m.file_rss;
            smaps_total.abs_diff(m.vm_rss) < m.vm_rss / 10 + (1 << 20)
        });
        assert!(
            agree,
            "smaps and status disagree on the resident bytes in 8 tries"
        );
        let (rss, shared) = statm();
        assert!(rss > 0 && shared <= rss);
        let mut buf = [0u8; 64];
        // The test binary's name, cut to 15 bytes by the kernel.
        let name = comm(&mut buf);
        assert!(!name.is_empty() && name.len() <= 15, "{name:?}");
        assert!(!name.ends_with(b"\n"));
    }

    /// Every first touch of an OS page counts a minor fault, and the
    /// process report carries the count.
    #[test]
    #[cfg(target_os = "linux")]
    #[cfg_attr(miri, ignore = "getrusage and mmap")]
    fn a_first_touch_of_each_page_is_a_minor_fault() {
        // SAFETY: sysconf reads a constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let pages = 1024;
        let before = OsMemory::now().minor_faults;
        // SAFETY: a fresh private anonymous mapping, ours alone; small
        // pages asked for, so that each OS page faults by itself.
        unsafe {
            let p = libc::mmap(
                core::ptr::null_mut(),
                pages * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::madvise(p, pages * page, libc::MADV_NOHUGEPAGE);
            for i in 0..pages {
                p.cast::<u8>().add(i * page).write_volatile(1);
            }
            libc::munmap(p, pages * page);
        }
        let after = OsMemory::now();
        assert!(
            after.minor_faults >= before + pages as u64,
            "{before} then {}",
            after.minor_faults
        );
        let mut json = String::new();
        crate::report().write_json(&mut json).unwrap();
        assert!(json.contains("\"minor_faults\":"), "{json}");
    }
}
