//! Tools the workloads share: a small RNG, bookkeeping arrays that live
//! outside the allocator under test, and readings from `/proc/self`.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};

/// OS page size assumed by the page floor (x86-64 and aarch64 Linux default).
pub const PAGE: usize = 4096;

/// wyrand: fast, good enough for workload shapes, reproducible from a seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = (self.0 as u128).wrapping_mul((self.0 ^ 0xe703_7ed1_a0b4_28db) as u128);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// Uniform in `0..n` (n > 0).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    #[inline]
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `[0, 1)`.
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A live object as the harness tracks it: address and requested size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Obj {
    /// Address returned by the allocator.
    pub addr: usize,
    /// Requested size in bytes.
    pub size: usize,
}

/// Alignment of every workload allocation (what a Rust `Box<[u64]>` asks).
pub const ALIGN: usize = 8;

/// Allocates `size` bytes through the global allocator and writes `touch`
/// bytes of it (at least the first byte), like a program initialising it.
#[inline]
pub fn new_obj(size: usize, touch: usize) -> Obj {
    let layout = Layout::from_size_align(size, ALIGN).expect("layout");
    // SAFETY: size > 0 for every workload (callers never ask 0).
    let p = unsafe { alloc(layout) };
    if p.is_null() {
        handle_alloc_error(layout);
    }
    let n = touch.clamp(1, size);
    // SAFETY: `p` points to `size` >= `n` writable bytes.
    unsafe { core::ptr::write_bytes(p, 0xa5, n) };
    Obj {
        addr: std::hint::black_box(p) as usize,
        size,
    }
}

/// Writes one byte per OS page of the object (as a copying collector or a
/// buffer fill would), so every page is committed.
#[inline]
pub fn touch_pages(o: Obj) {
    let mut off = 0;
    while off < o.size {
        // SAFETY: `off < size`, the object is live and writable.
        unsafe { core::ptr::write_volatile((o.addr + off) as *mut u8, 1) };
        off += PAGE;
    }
}

/// Frees an object made by [`new_obj`].
#[inline]
pub fn free_obj(o: Obj) {
    let layout = Layout::from_size_align(o.size, ALIGN).expect("layout");
    // SAFETY: `o` came from `new_obj` with this layout and is freed once.
    unsafe { dealloc(o.addr as *mut u8, layout) };
}

/// A fixed-capacity array mapped straight from the OS with `MAP_POPULATE`,
/// so the harness's own bookkeeping neither goes through the allocator under
/// test nor changes RSS during the measured part: it is resident before the
/// baseline is read.
pub struct MmapVec<T: Copy> {
    ptr: *mut T,
    len: usize,
    cap: usize,
}

// SAFETY: the array owns its mapping; `T: Copy + Send` values move with it.
unsafe impl<T: Copy + Send> Send for MmapVec<T> {}

impl<T: Copy> MmapVec<T> {
    /// An empty array with room for `cap` elements, pages resident.
    pub fn with_capacity(cap: usize) -> MmapVec<T> {
        let bytes = (cap.max(1) * core::mem::size_of::<T>()).div_ceil(PAGE) * PAGE;
        // The raw system call, not libc's `mmap`: workers interpose that
        // symbol to count the allocator's calls, and these are not its.
        // SAFETY: anonymous private mapping, no address hint.
        let p = unsafe {
            libc::syscall(
                libc::SYS_mmap,
                core::ptr::null_mut::<libc::c_void>(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            ) as *mut libc::c_void
        };
        assert!(
            p != libc::MAP_FAILED,
            "bookkeeping mmap of {bytes} bytes failed"
        );
        MmapVec {
            ptr: p.cast(),
            len: 0,
            cap,
        }
    }

    /// Appends (panics when full: capacities are computed from the workload).
    #[inline]
    pub fn push(&mut self, v: T) {
        assert!(
            self.len < self.cap,
            "MmapVec capacity {} exceeded",
            self.cap
        );
        // SAFETY: `len < cap`, inside the mapping.
        unsafe { self.ptr.add(self.len).write(v) };
        self.len += 1;
    }

    /// Removes and returns the last element.
    #[inline]
    pub fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        // SAFETY: the element at `len` was written by `push`.
        Some(unsafe { self.ptr.add(self.len).read() })
    }

    /// Forgets the contents (keeps the mapping).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `len` initialised elements at `ptr`.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The elements, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: `len` initialised elements at `ptr`, uniquely borrowed.
        unsafe { core::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Keeps the elements for which `keep` is true (order kept).
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        let mut w = 0;
        for r in 0..self.len {
            // SAFETY: `r < len`.
            let v = unsafe { self.ptr.add(r).read() };
            if keep(&v) {
                // SAFETY: `w <= r < len`.
                unsafe { self.ptr.add(w).write(v) };
                w += 1;
            }
        }
        self.len = w;
    }
}

impl<T: Copy> Drop for MmapVec<T> {
    fn drop(&mut self) {
        let bytes = (self.cap.max(1) * core::mem::size_of::<T>()).div_ceil(PAGE) * PAGE;
        // SAFETY: the mapping made in `with_capacity`, unmapped once (raw
        // call, as in `with_capacity`).
        unsafe { libc::syscall(libc::SYS_munmap, self.ptr, bytes) };
    }
}

/// A set of page numbers (open addressing, outside the allocator).
pub struct PageSet {
    slots: MmapVec<u64>,
    mask: usize,
    len: usize,
}

impl PageSet {
    /// Room for about `n` pages.
    pub fn with_capacity(n: usize) -> PageSet {
        let cap = (n.max(16) * 2).next_power_of_two();
        let mut slots = MmapVec::with_capacity(cap);
        for _ in 0..cap {
            slots.push(0);
        }
        PageSet {
            slots,
            mask: cap - 1,
            len: 0,
        }
    }

    /// Inserts page `page`; true if it was not there.
    pub fn insert(&mut self, page: usize) -> bool {
        assert!(self.len * 4 < self.slots.len() * 3, "PageSet full");
        let key = page as u64 + 1;
        let mut i = (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20) as usize & self.mask;
        let s = self.slots.as_mut_slice();
        loop {
            if s[i] == key {
                return false;
            }
            if s[i] == 0 {
                s[i] = key;
                self.len += 1;
                return true;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Pages in the set.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Number of distinct OS pages holding at least one byte of a live object:
/// no page-granular allocator can hold these objects in fewer pages.
pub fn pages_touched(objs: &[Obj]) -> u64 {
    let spanned: usize = objs
        .iter()
        .map(|o| (o.addr + o.size - 1) / PAGE - o.addr / PAGE + 1)
        .sum();
    let mut set = PageSet::with_capacity(spanned + 16);
    for o in objs {
        let first = o.addr / PAGE;
        let last = (o.addr + o.size - 1) / PAGE;
        for p in first..=last {
            set.insert(p);
        }
    }
    set.len() as u64
}

/// Reads `/proc/self/statm` and `/proc/self/status` without allocating
/// (the sampler thread must not perturb the allocator it watches).
pub struct ProcReader {
    statm: File,
    status: File,
    /// `/proc/self/smaps_rollup` (Linux 4.14 and later).
    smaps: Option<File>,
    page: u64,
}

impl ProcReader {
    /// Opens the files.
    pub fn open() -> io::Result<ProcReader> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
        Ok(ProcReader {
            statm: File::open("/proc/self/statm")?,
            status: File::open("/proc/self/status")?,
            smaps: File::open("/proc/self/smaps_rollup").ok(),
            page,
        })
    }

    /// Resident set size in bytes.
    pub fn rss(&mut self) -> u64 {
        let mut buf = [0u8; 256];
        let n = read_all(&mut self.statm, &mut buf);
        // Second field: resident pages.
        let mut fields = buf[..n].split(|&b| b == b' ');
        fields.next();
        fields.next().map(parse_u64).unwrap_or(0) * self.page
    }

    /// Peak RSS (`VmHWM`) in bytes.
    pub fn hwm(&mut self) -> u64 {
        self.status_field(b"VmHWM:")
    }

    /// Proportional set size (`Pss` of smaps_rollup) in bytes: a page
    /// mapped at several addresses of the process counts once, as it does
    /// in the memory the machine has (meshing maps pages so; RSS counts
    /// such a page at every address). `None` where the kernel lacks it.
    pub fn pss(&mut self) -> Option<u64> {
        let f = self.smaps.as_mut()?;
        let mut buf = [0u8; 4096];
        let n = read_all(f, &mut buf);
        field(&buf[..n], b"Pss:")
    }

    /// The memory this process costs the machine ([`memory_of`]).
    pub fn memory(&mut self) -> Option<u64> {
        let pss = self.pss()?;
        Some(memory_from(pss, None))
    }

    fn status_field(&mut self, key: &[u8]) -> u64 {
        let mut buf = [0u8; 4096];
        let n = read_all(&mut self.status, &mut buf);
        for line in buf[..n].split(|&b| b == b'\n') {
            if let Some(rest) = line.strip_prefix(key) {
                let digits: &[u8] = rest
                    .split(|b| !b.is_ascii_digit())
                    .find(|s| !s.is_empty())
                    .unwrap_or(b"0");
                return parse_u64(digits) * 1024;
            }
        }
        0
    }
}

/// The memory process `pid` (this one if `None`) costs the machine, in
/// bytes: its proportional set size, except that the pages of its memfd
/// files (meshing's shared memory) count by the files' blocks instead of by
/// what is mapped. A meshed page that nothing has touched since it was
/// remapped is in no page table, so PSS and RSS both miss it, though the
/// file holds it. `None` where the kernel lacks smaps_rollup.
pub fn memory_of(pid: Option<u32>) -> Option<u64> {
    let dir = proc_dir(pid);
    let mut f = File::open(format!("{dir}/smaps_rollup")).ok()?;
    let mut buf = [0u8; 4096];
    let n = read_all(&mut f, &mut buf);
    Some(memory_from(field(&buf[..n], b"Pss:")?, pid))
}

fn proc_dir(pid: Option<u32>) -> String {
    match pid {
        Some(pid) => format!("/proc/{pid}"),
        None => "/proc/self".to_string(),
    }
}

/// `pss` with the memfd mappings' share taken out and the memfd files'
/// blocks put in.
fn memory_from(pss: u64, pid: Option<u32>) -> u64 {
    let dir = proc_dir(pid);
    let mapped = File::open(format!("{dir}/smaps"))
        .map(memfd_pss)
        .unwrap_or(0);
    pss.saturating_sub(mapped) + memfd_blocks(&dir)
}

/// The `Pss` of the memfd mappings in an smaps file, read through a fixed
/// buffer (a process with tens of thousands of mappings has an smaps file
/// of tens of MiB).
fn memfd_pss(mut f: File) -> u64 {
    let mut buf = [0u8; 1 << 16];
    let (mut held, mut in_memfd, mut sum) = (0, false, 0);
    loop {
        let n = match f.read(&mut buf[held..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => held + n,
        };
        let mut start = 0;
        while let Some(end) = buf[start..n].iter().position(|&b| b == b'\n') {
            let line = &buf[start..start + end];
            if line
                .first()
                .is_some_and(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            {
                // A mapping's header: "start-end perms offset dev inode path".
                in_memfd = line.windows(7).any(|w| w == b"/memfd:");
            } else if in_memfd {
                sum += field(line, b"Pss:").unwrap_or(0);
            }
            start += end + 1;
        }
        buf.copy_within(start..n, 0);
        held = n - start;
        if held == buf.len() {
            held = 0; // a line longer than the buffer: not a field of ours
        }
    }
    sum
}

/// Bytes the kernel holds for the memfd files open in the process of
/// `dir` (each file once).
fn memfd_blocks(dir: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(fds) = std::fs::read_dir(format!("{dir}/fd")) else {
        return 0;
    };
    let mut seen = std::collections::BTreeSet::new();
    fds.filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("/memfd:"))
        })
        .filter_map(|e| std::fs::metadata(e.path()).ok())
        .filter(|m| seen.insert((m.dev(), m.ino())))
        .map(|m| m.blocks() * 512)
        .sum()
}

/// The kB figure of the line starting with `key`, in bytes.
fn field(text: &[u8], key: &[u8]) -> Option<u64> {
    let line = text
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(key))?;
    let digits = line
        .split(|b| !b.is_ascii_digit())
        .find(|s| !s.is_empty())?;
    Some(parse_u64(digits) * 1024)
}

fn read_all(f: &mut File, buf: &mut [u8]) -> usize {
    if f.seek(SeekFrom::Start(0)).is_err() {
        return 0;
    }
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    n
}

fn parse_u64(s: &[u8]) -> u64 {
    s.iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0u64, |a, &b| a * 10 + (b - b'0') as u64)
}

/// Resets the kernel's peak-RSS mark (`VmHWM`) to the current RSS, so the
/// peak read later belongs to the workload (Linux >= 4.0). Returns false if
/// the kernel refused.
pub fn reset_hwm() -> bool {
    std::fs::write("/proc/self/clear_refs", b"5").is_ok()
}

/// Minor page faults of the process so far.
pub fn minor_faults() -> u64 {
    // SAFETY: `ru` is a valid out-parameter.
    unsafe {
        let mut ru: libc::rusage = core::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru.ru_minflt as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn memory_counts_a_memfds_pages_once_mapped_twice_or_not_at_all() {
        let Some(before) = memory_of(None) else {
            return; // no smaps_rollup (Linux < 4.14): nothing to check
        };
        // SAFETY: plain system calls on a file of ours; the two mappings
        // are ours and unmapped before the file is closed.
        unsafe {
            let fd = libc::memfd_create(c"memory-test".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0);
            let len = 16 * MIB as usize;
            assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0);
            let chunk = vec![7u8; len];
            assert_eq!(
                libc::pwrite(fd, chunk.as_ptr().cast(), len, 0),
                len as isize
            );
            drop(chunk);
            let held = memory_of(None).unwrap();
            // Mapped at two addresses, one touched, one not.
            let map = || {
                let p = libc::mmap(
                    core::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    fd,
                    0,
                );
                assert_ne!(p, libc::MAP_FAILED);
                p as *const u8
            };
            let (a, b) = (map(), map());
            let sum: u64 = (0..len).step_by(4096).map(|i| *a.add(i) as u64).sum();
            assert_eq!(sum, 7 * (len as u64 / 4096));
            let mapped = memory_of(None).unwrap();
            libc::munmap(a as *mut libc::c_void, len);
            libc::munmap(b as *mut libc::c_void, len);
            libc::close(fd);
            let grew = |x: u64| x.saturating_sub(before) as f64 / MIB as f64;
            // Other test threads allocate meanwhile: a MiB either way.
            for (what, g) in [("unmapped", grew(held)), ("mapped", grew(mapped))] {
                assert!((15.0..=18.0).contains(&g), "{what}: grew {g:.1} MiB");
            }
        }
    }
}
