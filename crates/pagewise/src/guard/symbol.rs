//! Function names for a report, found in the process without allocating:
//! the loaded object that holds an address (`dl_iterate_phdr`), then the
//! function symbol around it in that object's ELF symbol tables (`.symtab`,
//! which Rust and most C builds keep unless stripped, else `.dynsym`), read
//! from the file mapped read-only. Rust's legacy mangling is decoded;
//! other names are written as they are. A stripped binary's own functions
//! get no name here: its report keeps the addresses and object offsets,
//! which `addr2line` or `eu-addr2line` resolve with its debug symbols.
//!
//! Only the reporter calls it (one thread at a time, `report.rs`): its
//! cache of mapped objects is a plain static.

use core::ffi::{c_char, c_int, c_void, CStr};
use core::fmt::{self, Write};

/// A function symbol around an address.
pub struct Found {
    /// The raw (mangled) name.
    pub name: &'static [u8],
    /// The function's first address, in the process.
    pub start: usize,
    /// The object's path.
    pub object: &'static str,
}

/// The function symbol around `addr`, if its object has one.
pub fn lookup(addr: usize) -> Option<Found> {
    let (bias, object, path) = object_of(addr)?;
    let elf = mapped(bias, path)?;
    let (name, value) = elf.function_at((addr - bias) as u64)?;
    Some(Found {
        name,
        start: bias + value as usize,
        object,
    })
}

/// Whether `addr` is in the allocator's own code (its library, or its
/// functions in a program that links it): the frames a report leaves out
/// of the top of a stack.
pub fn is_allocator(addr: usize) -> bool {
    let Some((_, object, _)) = object_of(addr) else {
        return false;
    };
    if object.ends_with("libpagewise.so") || object.ends_with("libpagewise_secure.so") {
        return true;
    }
    lookup(addr).is_some_and(|s| contains(s.name, b"pagewise") || is_rust_alloc_shim(s.name))
}

/// Whether `name` is one of the global allocator's entry points that Rust
/// generates (`__rust_alloc` and its kin, and the `__rg_` functions they
/// call), named plainly or in the v0 scheme current toolchains use for
/// them (`_RNvCs…_7___rustc14___rust_dealloc`).
fn is_rust_alloc_shim(name: &[u8]) -> bool {
    [
        b"__rust_alloc" as &[u8],
        b"__rust_dealloc",
        b"__rust_realloc",
        b"__rg_",
    ]
    .iter()
    .any(|shim| contains(name, shim))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Writes `name` demangled (Rust's legacy scheme) or as it is.
pub fn write_name(out: &mut impl Write, name: &[u8]) -> fmt::Result {
    if let Some(parts) = legacy_rust(name) {
        return parts.write(out);
    }
    write_bytes(out, name)
}

fn write_bytes(out: &mut impl Write, b: &[u8]) -> fmt::Result {
    match core::str::from_utf8(b) {
        Ok(s) => out.write_str(s),
        Err(_) => out.write_str("?"),
    }
}

/// A legacy-mangled Rust path: `_ZN` (`<len><ident>`)+ `E`.
struct Legacy<'a> {
    body: &'a [u8],
}

fn legacy_rust(name: &[u8]) -> Option<Legacy<'_>> {
    let body = name.strip_prefix(b"_ZN")?.strip_suffix(b"E")?;
    // Checked once here, so that `write` can trust the lengths.
    let mut rest = body;
    while !rest.is_empty() {
        rest = next_ident(rest)?.1;
    }
    Some(Legacy { body })
}

fn next_ident(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let len: usize = core::str::from_utf8(&b[..digits]).ok()?.parse().ok()?;
    let rest = &b[digits..];
    (len <= rest.len()).then(|| (&rest[..len], &rest[len..]))
}

impl Legacy<'_> {
    fn write(&self, out: &mut impl Write) -> fmt::Result {
        let mut rest = self.body;
        let mut first = true;
        while let Some((ident, r)) = next_ident(rest) {
            rest = r;
            // The last part is a hash (`h` and 16 hex digits): left out.
            if rest.is_empty() && is_hash(ident) {
                break;
            }
            if !first {
                out.write_str("::")?;
            }
            first = false;
            write_ident(out, ident)?;
        }
        Ok(())
    }
}

fn is_hash(ident: &[u8]) -> bool {
    ident.len() == 17 && ident[0] == b'h' && ident[1..].iter().all(u8::is_ascii_hexdigit)
}

/// One part, its escapes (`$LT$`, `..`, `$u20$`, ...) decoded.
fn write_ident(out: &mut impl Write, ident: &[u8]) -> fmt::Result {
    // A part that starts with an escape is written `_$...`.
    let mut s = if ident.starts_with(b"_$") {
        &ident[1..]
    } else {
        ident
    };
    while !s.is_empty() {
        if s.starts_with(b"..") {
            out.write_str("::")?;
            s = &s[2..];
            continue;
        }
        if s[0] == b'$' {
            if let Some(end) = s[1..].iter().position(|&b| b == b'$') {
                let code = &s[1..1 + end];
                if let Some(c) = escape(code) {
                    out.write_char(c)?;
                    s = &s[end + 2..];
                    continue;
                }
            }
        }
        out.write_char(s[0] as char)?;
        s = &s[1..];
    }
    Ok(())
}

fn escape(code: &[u8]) -> Option<char> {
    Some(match code {
        b"LT" => '<',
        b"GT" => '>',
        b"RF" => '&',
        b"BP" => '*',
        b"C" => ',',
        b"SP" => '@',
        _ => {
            let hex = code.strip_prefix(b"u")?;
            let v = u32::from_str_radix(core::str::from_utf8(hex).ok()?, 16).ok()?;
            char::from_u32(v)?
        }
    })
}

/// The loaded object holding `addr`: its load bias, its name to show, and
/// the path to open.
fn object_of(addr: usize) -> Option<(usize, &'static str, &'static CStr)> {
    struct Search {
        addr: usize,
        bias: usize,
        name: *const c_char,
        hit: bool,
    }
    extern "C" fn each(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the `Search` passed below; `info` describes a
        // loaded object, its program headers mapped with it.
        let (s, info) = unsafe { (&mut *(data as *mut Search), &*info) };
        for k in 0..info.dlpi_phnum as usize {
            // SAFETY: `dlpi_phnum` headers at `dlpi_phdr`.
            let ph = unsafe { &*info.dlpi_phdr.add(k) };
            let lo = (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize);
            if ph.p_type == libc::PT_LOAD && s.addr.wrapping_sub(lo) < ph.p_memsz as usize {
                s.bias = info.dlpi_addr as usize;
                s.name = info.dlpi_name;
                s.hit = true;
                return 1;
            }
        }
        0
    }
    let mut s = Search {
        addr,
        bias: 0,
        name: core::ptr::null(),
        hit: false,
    };
    // SAFETY: `each` only reads the headers it is given and writes `s`.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut s as *mut Search as *mut c_void) };
    if !s.hit {
        return None;
    }
    // SAFETY: a loaded object's name lives as long as it stays loaded (the
    // process is about to end); the main program's is empty.
    let name = (!s.name.is_null()).then(|| unsafe { CStr::from_ptr(s.name) });
    // The main program's is empty (glibc) or this path (musl, static).
    match name {
        Some(n) if !n.is_empty() && n != c"/proc/self/exe" => {
            Some((s.bias, n.to_str().unwrap_or("?"), n))
        }
        _ => Some((s.bias, main_program(), c"/proc/self/exe")),
    }
}

static mut EXE: [u8; 512] = [0; 512];
static mut EXE_LEN: usize = 0;

/// The main program's path (`/proc/self/exe`'s target).
fn main_program() -> &'static str {
    // SAFETY: reporter only (module comment); the buffer is written once,
    // before its first read.
    unsafe {
        let buf = &mut *core::ptr::addr_of_mut!(EXE);
        if EXE_LEN == 0 {
            let n = libc::readlink(
                c"/proc/self/exe".as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            );
            EXE_LEN = if n > 0 { n as usize } else { usize::MAX };
        }
        if EXE_LEN == usize::MAX {
            return "?";
        }
        core::str::from_utf8(&buf[..EXE_LEN]).unwrap_or("?")
    }
}

/// An object's file, mapped read-only.
#[derive(Clone, Copy)]
struct Elf {
    base: *const u8,
    len: usize,
}

/// Objects mapped so far, by load bias (never unmapped: a report ends the
/// process).
static mut MAPPED: [(usize, Option<Elf>); 16] = [(usize::MAX, None); 16];

fn mapped(bias: usize, path: &CStr) -> Option<Elf> {
    // SAFETY: reporter only (module comment).
    let cache = unsafe { &mut *core::ptr::addr_of_mut!(MAPPED) };
    if let Some((_, e)) = cache.iter().find(|(b, _)| *b == bias) {
        return *e;
    }
    let e = map_file(path);
    if let Some(slot) = cache.iter_mut().find(|(b, _)| *b == usize::MAX) {
        *slot = (bias, e);
    }
    e
}

fn map_file(path: &CStr) -> Option<Elf> {
    // SAFETY: plain system calls on a path; the mapping is read-only and
    // private, and the descriptor is closed once it is made.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let mut st: libc::stat = core::mem::zeroed();
        let ok = libc::fstat(fd, &mut st) == 0 && st.st_size > 64;
        let len = st.st_size as usize;
        let p = if ok {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                fd,
                0,
            )
        } else {
            libc::MAP_FAILED
        };
        libc::close(fd);
        (p != libc::MAP_FAILED).then_some(Elf {
            base: p as *const u8,
            len,
        })
    }
}

const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;

impl Elf {
    /// `len` bytes at `off`, if in the file.
    fn bytes(&self, off: u64, len: u64) -> Option<&'static [u8]> {
        let end = off.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: in the mapping (checked), which is never unmapped.
        Some(unsafe { core::slice::from_raw_parts(self.base.add(off as usize), len as usize) })
    }

    fn u16(&self, off: u64) -> Option<u16> {
        Some(u16::from_le_bytes(self.bytes(off, 2)?.try_into().ok()?))
    }

    fn u32(&self, off: u64) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(off, 4)?.try_into().ok()?))
    }

    fn u64(&self, off: u64) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(off, 8)?.try_into().ok()?))
    }

    /// The function symbol whose range holds `vaddr` (an address in the
    /// object's own numbering): its name and its first address.
    fn function_at(&self, vaddr: u64) -> Option<(&'static [u8], u64)> {
        // A 64-bit little-endian ELF file (every platform pagewise runs on).
        if self.bytes(0, 6)? != b"\x7fELF\x02\x01" {
            return None;
        }
        let shoff = self.u64(0x28)?;
        let shentsize = self.u16(0x3a)? as u64;
        let shnum = self.u16(0x3c)? as u64;
        let section = |i: u64| shoff + i * shentsize;
        let find = |kind: u32| (0..shnum).find(|&i| self.u32(section(i) + 4) == Some(kind));
        let table = find(SHT_SYMTAB).or_else(|| find(SHT_DYNSYM))?;
        let sh = section(table);
        let (off, size, entsize) = (
            self.u64(sh + 0x18)?,
            self.u64(sh + 0x20)?,
            self.u64(sh + 0x38)?,
        );
        let strtab = section(self.u32(sh + 0x28)? as u64);
        let (str_off, str_size) = (self.u64(strtab + 0x18)?, self.u64(strtab + 0x20)?);
        if entsize < 24 {
            return None;
        }
        let mut best: Option<(u32, u64)> = None;
        for k in 0..size / entsize {
            let s = off + k * entsize;
            let info = self.bytes(s + 4, 1)?[0];
            let shndx = self.u16(s + 6)?;
            let (value, len) = (self.u64(s + 8)?, self.u64(s + 16)?);
            let kind = info & 0xf;
            if (kind == STT_FUNC || kind == STT_GNU_IFUNC)
                && shndx != 0
                && vaddr >= value
                && vaddr - value < len.max(1)
                && best.is_none_or(|(_, v)| value > v)
            {
                best = Some((self.u32(s)?, value));
            }
        }
        let (name, value) = best?;
        let names = self.bytes(str_off, str_size)?;
        let from = names.get(name as usize..)?;
        let end = from.iter().position(|&b| b == 0)?;
        Some((&from[..end], value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct S(std::string::String);
    impl Write for S {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0.push_str(s);
            Ok(())
        }
    }

    fn shown(name: &[u8]) -> std::string::String {
        let mut s = S(std::string::String::new());
        write_name(&mut s, name).unwrap();
        s.0
    }

    #[test]
    fn the_global_allocators_entry_points_are_told_in_either_scheme() {
        for shim in [
            &b"__rust_dealloc"[..],
            b"__rust_alloc_zeroed",
            b"__rg_alloc",
            b"_RNvCsfLfy6EI15iL_7___rustc14___rust_dealloc",
            b"_RNvCsfLfy6EI15iL_7___rustc12___rust_alloc",
            b"_RNvCsfLfy6EI15iL_7___rustc14___rust_realloc",
        ] {
            assert!(is_rust_alloc_shim(shim), "{}", shown(shim));
        }
        for other in [
            &b"main"[..],
            b"malloc",
            b"_RINvNtNtCsjrHSEGnQ3l9_3std3sys9backtrace28___rust_begin_short_backtraceB1b_",
            b"_ZN5alloc5alloc7dealloc17h0123456789abcdefE",
        ] {
            assert!(!is_rust_alloc_shim(other), "{}", shown(other));
        }
    }

    #[test]
    fn legacy_rust_names_are_decoded_and_other_names_kept() {
        assert_eq!(
            shown(b"_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(
            shown(b"_ZN58_$LT$alloc..string..String$u20$as$u20$core..fmt..Debug$GT$3fmt17h0123456789abcdefE"),
            "<alloc::string::String as core::fmt::Debug>::fmt"
        );
        assert_eq!(shown(b"overflow_by_one"), "overflow_by_one");
        assert_eq!(shown(b"_ZN3fooE"), "foo");
        assert_eq!(shown(b"_ZNK3foo3barEv"), "_ZNK3foo3barEv", "C++: as it is");
    }

    #[inline(never)]
    fn a_function_with_a_name() -> usize {
        a_function_with_a_name as *const () as usize
    }

    #[test]
    fn a_function_of_this_program_is_found_by_name() {
        let f = a_function_with_a_name();
        let s = lookup(f + 1).expect("the test binary keeps its symbols");
        let mut out = S(std::string::String::new());
        write_name(&mut out, s.name).unwrap();
        assert!(out.0.ends_with("a_function_with_a_name"), "{}", out.0);
        assert_eq!(s.start, f);
        assert!(s.object.contains("pagewise"), "{}", s.object);
        assert!(is_allocator(f + 1), "a pagewise function");
        let strlen = libc::strlen as *const () as usize;
        assert!(!is_allocator(strlen + 1), "libc's");
    }
}
