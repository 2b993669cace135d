//! Frame addresses to function, file and line, after the process has gone:
//! through the profile's module map to each file's own addresses, then the
//! file's DWARF (or its symbol table) with the `addr2line` crate (gimli's
//! symbolizer: inline frames, Rust and C++ demangling, split DWARF).

use super::Mapping;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One frame as a reader sees it (an address can stand for several, when
/// functions were inlined into it: innermost first).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub function: String,
    /// `file:line`, where debug info says.
    pub location: Option<String>,
    /// The module (file) the address is in.
    pub module: String,
    /// The return address.
    pub address: u64,
}

struct Module {
    loader: Option<addr2line::Loader>,
    /// Loadable segments: (file offset, file size, address).
    segments: Vec<(u64, u64, u64)>,
}

/// Symbolizes addresses of one process.
pub struct Symbolizer<'a> {
    mappings: &'a [Mapping],
    modules: HashMap<String, Module>,
    cache: HashMap<u64, Vec<Frame>>,
}

impl<'a> Symbolizer<'a> {
    pub fn new(mappings: &'a [Mapping]) -> Symbolizer<'a> {
        Symbolizer {
            mappings,
            modules: HashMap::new(),
            cache: HashMap::new(),
        }
    }

    /// The frames of return address `ip` (one, named by address, where
    /// nothing is known).
    pub fn frames(&mut self, ip: u64) -> Vec<Frame> {
        if let Some(f) = self.cache.get(&ip) {
            return f.clone();
        }
        let f = self.resolve(ip);
        self.cache.insert(ip, f.clone());
        f
    }

    fn resolve(&mut self, ip: u64) -> Vec<Frame> {
        let unknown = |module: &str, at: String| {
            vec![Frame {
                function: at,
                location: None,
                module: module.to_string(),
                address: ip,
            }]
        };
        let Some(m) = self.mappings.iter().find(|m| m.start <= ip && ip < m.end) else {
            return unknown("?", format!("{ip:#x}"));
        };
        // Where nothing names it: the module and the offset in its file,
        // which stay the same from run to run (the address does not).
        let mut file_offset = format!("{}+{:#x}", file_name(&m.path), ip - m.start + m.offset);
        let module = self
            .modules
            .entry(m.path.clone())
            .or_insert_with(|| load(&m.path));
        // A return address: the call is the instruction before it.
        let offset = ip - 1 - m.start + m.offset;
        let Some(&(file_off, _, vaddr)) = module
            .segments
            .iter()
            .find(|(o, size, _)| *o <= offset && offset < o + size)
        else {
            return unknown(&m.path, file_offset);
        };
        let probe = offset - file_off + vaddr;
        // The return address as the file's own (what `addr2line -e` takes).
        file_offset = format!("{}+{:#x}", file_name(&m.path), probe + 1);
        let Some(loader) = &module.loader else {
            return unknown(&m.path, file_offset);
        };
        let mut out = Vec::new();
        if let Ok(mut frames) = loader.find_frames(probe) {
            while let Ok(Some(f)) = frames.next() {
                let Some(name) = f
                    .function
                    .as_ref()
                    .and_then(|n| n.demangle().ok().map(|s| s.into_owned()))
                else {
                    continue;
                };
                let location = f
                    .location
                    .and_then(|l| Some(format!("{}:{}", l.file?, l.line?)));
                out.push(Frame {
                    function: name,
                    location,
                    module: m.path.clone(),
                    address: ip,
                });
            }
        }
        if out.is_empty() {
            if let Some(sym) = loader.find_symbol(probe) {
                let name = addr2line::demangle_auto(sym.into(), None).into_owned();
                out.push(Frame {
                    function: name,
                    location: None,
                    module: m.path.clone(),
                    address: ip,
                });
            }
        }
        if out.is_empty() {
            return unknown(&m.path, file_offset);
        }
        out
    }

    /// The stack of a site, outermost first, without the allocator's own
    /// frames (the innermost ones: pagewise, the malloc family, Rust's
    /// allocation shims, anything in libpagewise.so).
    pub fn stack(&mut self, frames: &[u64]) -> Vec<Frame> {
        let mut all: Vec<Frame> = frames.iter().flat_map(|&ip| self.frames(ip)).collect();
        let keep = all
            .iter()
            .position(|f| !is_allocator(&f.function) && !is_allocator_module(&f.module))
            .unwrap_or(all.len());
        all.drain(..keep);
        all.reverse();
        all
    }
}

/// Whether a function is the allocator's, not the program's.
pub fn is_allocator(function: &str) -> bool {
    const NAMES: [&str; 14] = [
        "malloc",
        "calloc",
        "realloc",
        "reallocarray",
        "free",
        "aligned_alloc",
        "posix_memalign",
        "memalign",
        "valloc",
        "pvalloc",
        "__rust_alloc",
        "__rust_alloc_zeroed",
        "__rust_realloc",
        "__libc_malloc",
    ];
    let f = function.trim_start_matches('<');
    // glibc's internal names, which the C library exports too (a frame
    // there may be named by either when the linker folds the two).
    let libc_alias = f
        .strip_prefix("__libc_")
        .is_some_and(|rest| NAMES.contains(&rest));
    libc_alias
        || f == "cfree"
        || f.starts_with("pagewise::")
        || f.starts_with("pw::")
        || f.starts_with("__rdl_")
        || f.starts_with("__rg_")
        || f.starts_with("operator new")
        || f.starts_with("_Unwind_")
        || NAMES.contains(&function)
}

/// The last component of a path.
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether a module is pagewise's C library (`libpagewise.so`, the
/// hardened `libpagewise_secure.so`): all its frames are the allocator's.
pub fn is_allocator_module(path: &str) -> bool {
    let name = file_name(path);
    name.starts_with("libpagewise") && name.contains(".so")
}

fn load(path: &str) -> Module {
    let data = std::fs::read(path).ok();
    let file = data.as_deref().and_then(|d| object::File::parse(d).ok());
    let segments = file
        .as_ref()
        .map(|file| {
            use object::{Object, ObjectSegment};
            file.segments()
                .map(|s| {
                    let (off, size) = s.file_range();
                    (off, size, s.address())
                })
                .collect()
        })
        .unwrap_or_default();
    // The names and lines from a detached debug file where there is one
    // (it has the same addresses), else from the file itself.
    let loader = file
        .as_ref()
        .and_then(|f| debug_file(Path::new(path), f))
        .and_then(|d| addr2line::Loader::new(d).ok())
        .or_else(|| addr2line::Loader::new(path).ok());
    Module { loader, segments }
}

/// Where the debug information of `path`, stripped from it, was put: the
/// places gdb looks, by the file's build ID under
/// `/usr/lib/debug/.build-id/` (Debian's `-dbg` and `-dbgsym` packages),
/// or by the name in its `.gnu_debuglink` (checked by its CRC) beside it,
/// in `.debug/` beside it, or under `/usr/lib/debug/` at its directory.
fn debug_file(path: &Path, file: &object::File<'_>) -> Option<PathBuf> {
    use object::Object;
    if let Ok(Some(id)) = file.build_id() {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        if hex.len() > 2 {
            let p = PathBuf::from(format!(
                "/usr/lib/debug/.build-id/{}/{}.debug",
                &hex[..2],
                &hex[2..]
            ));
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let (name, crc) = file.gnu_debuglink().ok()??;
    let name = std::str::from_utf8(name).ok()?;
    let dir = path.parent()?;
    let global = Path::new("/usr/lib/debug").join(dir.strip_prefix("/").unwrap_or(dir));
    [
        dir.join(name),
        dir.join(".debug").join(name),
        global.join(name),
    ]
    .into_iter()
    .find(|p| p != path && crc_of(p) == Some(crc))
}

/// The CRC-32 of a file's bytes (the one `.gnu_debuglink` records).
fn crc_of(path: &Path) -> Option<u32> {
    let bytes = std::fs::read(path).ok()?;
    let mut crc = flate2::Crc::new();
    crc.update(&bytes);
    Some(crc.sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocators_frames_are_told_by_name_and_module() {
        for f in [
            "malloc",
            "__libc_calloc",
            "__libc_malloc",
            "cfree",
            "pagewise::heap::x",
            "__rust_alloc",
        ] {
            assert!(is_allocator(f), "{f}");
        }
        for f in ["main", "zmalloc", "__libc_start_main", "my_calloc"] {
            assert!(!is_allocator(f), "{f}");
        }
        assert!(is_allocator_module("/opt/lib/libpagewise.so"));
        assert!(is_allocator_module("/t/release/libpagewise_secure.so"));
        assert!(!is_allocator_module("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(!is_allocator_module("/usr/bin/pagewise-user"));
    }

    #[test]
    fn a_frame_nothing_names_is_its_module_and_offset() {
        let maps = [Mapping {
            start: 0x7f00_0000_1000,
            end: 0x7f00_0000_9000,
            offset: 0x2000,
            executable: true,
            path: "/nonexistent/libgone.so.1".into(),
        }];
        let mut sym = Symbolizer::new(&maps);
        let f = &sym.frames(0x7f00_0000_1234)[0];
        assert_eq!(f.function, "libgone.so.1+0x2234");
        assert_eq!(f.module, "/nonexistent/libgone.so.1");
        assert_eq!(sym.frames(0x10)[0].function, "0x10", "in no mapping");
    }
}
