//! The library's own reports: a text summary and the JSON document that
//! `pagewise run` reads. Both format a `Stats` snapshot (a plain `Copy`
//! struct) and the OS figures through `core::fmt` into fixed buffers.

use crate::out::Bytes;
use crate::proc::OsMemory;
use core::fmt::{self, Write};
use pw::Stats;

/// Version of the JSON document (bumped when a field changes meaning).
pub const JSON_VERSION: u32 = 1;

/// Writes the JSON document.
pub fn json(w: &mut impl Write, s: &Stats, os: &OsMemory) -> fmt::Result {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    // SAFETY: getppid has no preconditions.
    let ppid = unsafe { libc::getppid() };
    write!(
        w,
        "{{\"version\":{JSON_VERSION},\"pid\":{pid},\"ppid\":{ppid},\"comm\":"
    )?;
    let mut buf = [0u8; 64];
    json_string(w, crate::proc::comm(&mut buf))?;
    w.write_str(",")?;
    let c = &s.syscalls;
    write!(
        w,
        "\"syscalls\":{{\"mmap\":{},\"munmap\":{},\"madvise\":{},\"mapped_bytes\":{},\"peak_mapped_bytes\":{},\"purged_bytes\":{}}},",
        c.mmap, c.munmap, c.madvise, c.mapped_bytes, c.peak_mapped_bytes, c.purged_bytes
    )?;
    write!(
        w,
        "\"reserved_bytes\":{},\"committed_bytes\":{},\"peak_committed_bytes\":{},\"metadata_bytes\":{},\"live_bytes\":{},\"live_requested_bytes\":{},\"live_allocations\":{},\"retained_bytes\":{},\"free_slot_bytes\":{},\"hollow_bytes\":{},\"purged_bytes\":{},\"meshed_bytes\":{},\"mesh_saved_bytes\":{},\"mesh_mappings\":{},\"segments\":{},\"heaps\":{},",
        s.reserved_bytes,
        s.committed_bytes,
        s.peak_committed_bytes,
        s.metadata_bytes,
        s.live_bytes,
        s.live_requested_bytes,
        s.live_allocations,
        s.retained_bytes,
        s.free_slot_bytes,
        s.hollow_bytes,
        s.purged_bytes,
        s.meshed_bytes,
        s.mesh_saved_bytes,
        s.mesh_mappings,
        s.segments,
        s.heaps
    )?;
    // Huge pages (`PAGEWISE_THP`): asked for, backed now, split by purges.
    write!(
        w,
        "\"thp\":{{\"advised_bytes\":{},\"backed_bytes\":{},\"splits\":{},\"hugepage_calls\":{},\"nohugepage_calls\":{}}},",
        s.thp_bytes, os.pagewise_huge_pages, s.thp_splits, c.hugepage, c.nohugepage
    )?;
    for (name, o) in [("large", &s.large), ("huge", &s.huge)] {
        write!(
            w,
            "\"{name}\":{{\"count\":{},\"bytes\":{},\"requested_bytes\":{}}},",
            o.count, o.bytes, o.requested_bytes
        )?;
    }
    w.write_str("\"classes\":[")?;
    let mut first = true;
    for (i, k) in s.classes.iter().enumerate() {
        if k.total_allocs == 0 && k.pages == 0 {
            continue;
        }
        if !first {
            w.write_str(",")?;
        }
        first = false;
        write!(
            w,
            "{{\"class\":{i},\"slot_size\":{},\"pages\":{},\"live_slots\":{},\"free_slots\":{},\"cached_slots\":{},\"retained_pages\":{},\"total_allocs\":{},\"total_frees\":{},\"live_requested_bytes\":{}}}",
            k.slot_size,
            k.pages,
            k.live_slots,
            k.free_slots,
            k.cached_slots,
            k.retained_pages,
            k.total_allocs,
            k.total_frees,
            k.live_requested_bytes
        )?;
    }
    write!(
        w,
        "],\"os\":{{\"vm_rss\":{},\"vm_hwm\":{},\"rss_anon\":{},\"rss_file\":{},\"rss_shmem\":{},\"pagewise_rss\":{},\"other_anon_rss\":{},\"file_rss\":{}}}}}",
        os.vm_rss,
        os.vm_hwm,
        os.rss_anon,
        os.rss_file,
        os.rss_shmem,
        os.pagewise_rss,
        os.other_anon_rss,
        os.file_rss
    )
}

/// Writes `bytes` as a JSON string: UTF-8 kept, quotes, backslashes and
/// control characters escaped, and each byte that is not UTF-8 (a process
/// name is bytes, and the kernel cuts it at 15 without regard for
/// characters) written as U+FFFD.
fn json_string(w: &mut impl Write, bytes: &[u8]) -> fmt::Result {
    w.write_str("\"")?;
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => w.write_str("\\\"")?,
                '\\' => w.write_str("\\\\")?,
                c if (c as u32) < 0x20 || c == '\x7f' => write!(w, "\\u{:04x}", c as u32)?,
                c => w.write_char(c)?,
            }
        }
        for _ in chunk.invalid() {
            w.write_char('\u{fffd}')?;
        }
    }
    w.write_str("\"")
}

/// Writes the text summary.
pub fn text(w: &mut impl Write, s: &Stats, os: &OsMemory) -> fmt::Result {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let rounding = s.live_bytes.saturating_sub(s.live_requested_bytes);
    let heap = s.committed_bytes + s.metadata_bytes;
    writeln!(w, "pagewise report (pid {pid})")?;
    writeln!(
        w,
        "  RSS {} (peak {}), pagewise mappings resident {}",
        Bytes(os.vm_rss),
        Bytes(os.vm_hwm),
        Bytes(os.pagewise_rss)
    )?;
    writeln!(
        w,
        "  live {} in {} allocations ({} requested)",
        Bytes(s.live_bytes),
        s.live_allocations,
        Bytes(s.live_requested_bytes)
    )?;
    writeln!(w, "  pagewise committed + metadata {}:", Bytes(heap))?;
    let rows = [
        ("live (requested)", s.live_requested_bytes),
        ("internal rounding", rounding),
        ("free slots in used pages", s.free_slot_bytes),
        ("retained empty pages", s.retained_bytes),
        ("metadata", s.metadata_bytes),
    ];
    for (name, v) in rows {
        writeln!(w, "    {name:<26} {:>12}", Bytes(v))?;
    }
    if s.hollow_bytes > 0 {
        writeln!(
            w,
            "  purged inside used pages {} (free OS pages of pages holding live objects; not resident)",
            Bytes(s.hollow_bytes)
        )?;
    }
    if s.meshed_bytes > 0 {
        writeln!(
            w,
            "  meshed {} of OS pages sharing physical pages, {} saved, {} kernel mappings added (PAGEWISE_MESH; counted once in PSS, once per page in RSS)",
            Bytes(s.meshed_bytes),
            Bytes(s.mesh_saved_bytes),
            s.mesh_mappings
        )?;
    }
    if s.thp_bytes > 0 || os.pagewise_huge_pages > 0 || s.thp_splits > 0 {
        writeln!(
            w,
            "  huge pages: {} asked for ({} madvise), {} backed by the kernel, {} split by purges",
            Bytes(s.thp_bytes),
            s.syscalls.hugepage,
            Bytes(os.pagewise_huge_pages),
            s.thp_splits
        )?;
    }
    writeln!(
        w,
        "  outside pagewise: anonymous {}, file-backed {}",
        Bytes(os.other_anon_rss),
        Bytes(os.file_rss)
    )?;
    let c = &s.syscalls;
    writeln!(
        w,
        "  syscalls: mmap {} munmap {} madvise {}; mapped {} (peak {}), purged {}",
        c.mmap,
        c.munmap,
        c.madvise,
        Bytes(c.mapped_bytes),
        Bytes(c.peak_mapped_bytes),
        Bytes(c.purged_bytes)
    )?;
    writeln!(
        w,
        "  large objects {} ({}), huge objects {} ({}), heaps {}, segments {}",
        s.large.count,
        Bytes(s.large.bytes),
        s.huge.count,
        Bytes(s.huge.bytes),
        s.heaps,
        s.segments
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::out::SliceWriter;

    #[test]
    fn json_is_complete_and_balanced() {
        let mut s = Stats::ZERO;
        s.classes[3].total_allocs = 7;
        s.classes[3].slot_size = 32;
        s.classes[3].cached_slots = 5;
        s.classes[3].total_frees = 6;
        let mut buf = vec![0u8; 8192];
        let mut w = SliceWriter::new(&mut buf);
        json(&mut w, &s, &OsMemory::default()).unwrap();
        let text = core::str::from_utf8(w.written()).unwrap();
        assert!(text.contains("\"classes\":[{\"class\":3,\"slot_size\":32"));
        assert!(text.contains("\"cached_slots\":5,"), "{text}");
        assert!(text.contains("\"total_frees\":6,"), "{text}");
        assert!(text.contains(",\"thp\":{\"advised_bytes\":0,"), "{text}");
        assert_eq!(text.matches('{').count(), text.matches('}').count());
        assert!(text.ends_with("}}"));
        let pid = std::process::id();
        assert!(text.starts_with(&format!("{{\"version\":1,\"pid\":{pid},\"ppid\":")));
        assert!(text.contains(",\"comm\":\""), "{text}");
    }

    #[test]
    fn json_strings_are_escaped() {
        let mut buf = [0u8; 64];
        let mut w = SliceWriter::new(&mut buf);
        json_string(&mut w, "a\"b\\c\né".as_bytes()).unwrap();
        assert_eq!(w.written(), r#""a\"b\\c\u000aé""#.as_bytes());
        let mut w = SliceWriter::new(&mut buf);
        json_string(&mut w, b"x\xc3").unwrap();
        assert_eq!(w.written(), "\"x\u{fffd}\"".as_bytes());
    }
}
