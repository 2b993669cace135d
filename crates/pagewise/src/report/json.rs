//! The JSON documents: [`Stats::write_json`] (the allocator's figures) and
//! [`Report::write_json`] (the process's document: the same figures with
//! the pid, the process name and the kernel's view, as `PAGEWISE_STATS_FILE`
//! and `pagewise run` use). Written through `core::fmt`, so into any
//! fixed buffer, without the `serde` feature and without allocating.

use super::Report;
use crate::stats::Stats;
use core::fmt::{self, Write};

/// Version of the process document (bumped when a field changes meaning).
///
/// ```
/// assert_eq!(pagewise::report::JSON_VERSION, 1);
/// ```
pub const JSON_VERSION: u32 = 1;

impl Stats {
    /// Writes the figures as one JSON object: every counter of [`Stats`]
    /// under its field name in the process document, and the size classes
    /// that were ever used, as `"classes":[{"class":3,"slot_size":32,...}]`.
    /// Allocates nothing, so it may be written from anywhere (a signal
    /// reporter, an exit handler) into a fixed buffer.
    ///
    /// ```
    /// let s = pagewise::stats();
    /// let mut json = String::new();
    /// s.write_json(&mut json).unwrap();
    /// let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    /// assert_eq!(v["committed_bytes"], s.committed_bytes);
    /// ```
    pub fn write_json(&self, w: &mut impl Write) -> fmt::Result {
        w.write_str("{")?;
        write_fields(w, self, None)?;
        w.write_str("}")
    }
}

impl Report {
    /// Writes the process document, the one `PAGEWISE_STATS_FILE` holds
    /// and `pagewise run` reads: `version` ([`JSON_VERSION`]), `pid`,
    /// `ppid`, `comm`, the fields of [`Stats::write_json`], and `os`, the
    /// kernel's figures ([`OsMemory`](super::OsMemory)). Allocates nothing.
    ///
    /// ```
    /// let r = pagewise::report();
    /// let mut json = String::new();
    /// r.write_json(&mut json).unwrap();
    /// let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    /// assert_eq!(v["pid"], std::process::id());
    /// assert_eq!(v["live_bytes"], r.stats.live_bytes);
    /// ```
    pub fn write_json(&self, w: &mut impl Write) -> fmt::Result {
        write!(
            w,
            "{{\"version\":{JSON_VERSION},\"pid\":{},\"ppid\":{},\"comm\":",
            self.pid, self.ppid
        )?;
        json_string(w, self.comm())?;
        w.write_str(",")?;
        write_fields(w, &self.stats, Some(self.os.pagewise_huge_pages))?;
        let os = &self.os;
        write!(
            w,
            ",\"os\":{{\"vm_rss\":{},\"vm_hwm\":{},\"rss_anon\":{},\"rss_file\":{},\"rss_shmem\":{},\"pagewise_rss\":{},\"other_anon_rss\":{},\"file_rss\":{},\"minor_faults\":{},\"major_faults\":{}}}}}",
            os.vm_rss,
            os.vm_hwm,
            os.rss_anon,
            os.rss_file,
            os.rss_shmem,
            os.pagewise_rss,
            os.other_anon_rss,
            os.file_rss,
            os.minor_faults,
            os.major_faults
        )
    }
}

/// The allocator's fields, without the braces around them.
/// The fields of a [`Stats`]; `backed`, where the kernel was asked, the
/// bytes of pagewise's mappings it backs with huge pages.
fn write_fields(w: &mut impl Write, s: &Stats, backed: Option<u64>) -> fmt::Result {
    let c = &s.syscalls;
    write!(
        w,
        "\"syscalls\":{{\"mmap\":{},\"munmap\":{},\"madvise\":{},\"mapped_bytes\":{},\"peak_mapped_bytes\":{},\"purged_bytes\":{}}},",
        c.mmap, c.munmap, c.madvise, c.mapped_bytes, c.peak_mapped_bytes, c.purged_bytes
    )?;
    write!(
        w,
        "\"reserved_bytes\":{},\"committed_bytes\":{},\"peak_committed_bytes\":{},\"metadata_bytes\":{},\"live_bytes\":{},\"live_requested_bytes\":{},\"live_allocations\":{},\"retained_bytes\":{},\"free_slot_bytes\":{},\"hollow_bytes\":{},\"purged_bytes\":{},\"purged_by\":{{\"decay\":{},\"budget\":{},\"reclaim\":{},\"trim\":{},\"limit\":{},\"hollow\":{},\"huge_reuse\":{}}},\"meshed_bytes\":{},\"mesh_saved_bytes\":{},\"mesh_mappings\":{},\"mesh_guards_lost\":{},\"mesh_registrations_refused\":{},\"mesh_waits\":{},\"mesh_longest_wait_us\":{},\"mesh_pauses\":{},\"segments\":{},\"heaps\":{},",
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
        s.purged_by.decay,
        s.purged_by.budget,
        s.purged_by.reclaim,
        s.purged_by.trim,
        s.purged_by.limit,
        s.purged_by.hollow,
        s.purged_by.huge_reuse,
        s.meshed_bytes,
        s.mesh_saved_bytes,
        s.mesh_mappings,
        s.mesh_guards_lost,
        s.mesh_registrations_refused,
        s.mesh_waits,
        s.mesh_longest_wait_us,
        s.mesh_pauses,
        s.segments,
        s.heaps
    )?;
    // Huge pages (`PAGEWISE_THP`): asked for, backed now, split by purges.
    write!(w, "\"thp\":{{\"advised_bytes\":{},", s.thp_bytes)?;
    if let Some(b) = backed {
        write!(w, "\"backed_bytes\":{b},")?;
    }
    write!(
        w,
        "\"splits\":{},\"hugepage_calls\":{},\"nohugepage_calls\":{}}},",
        s.thp_splits, c.hugepage, c.nohugepage
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
    w.write_str("]")
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{OsMemory, SliceWriter};

    #[test]
    fn json_is_complete_and_balanced() {
        let mut s = Stats::ZERO;
        s.classes[3].total_allocs = 7;
        s.classes[3].slot_size = 32;
        s.classes[3].cached_slots = 5;
        s.classes[3].total_frees = 6;
        s.purged_bytes = 12;
        s.purged_by.reclaim = 8;
        s.purged_by.hollow = 4;
        s.mesh_waits = 9;
        s.mesh_longest_wait_us = 1500;
        s.mesh_pauses = 2;
        let r = Report::of(s, OsMemory::default());
        let mut buf = vec![0u8; 8192];
        let mut w = SliceWriter::new(&mut buf);
        r.write_json(&mut w).unwrap();
        let text = core::str::from_utf8(w.written()).unwrap();
        assert!(text.contains("\"classes\":[{\"class\":3,\"slot_size\":32"));
        assert!(text.contains("\"cached_slots\":5,"), "{text}");
        assert!(text.contains("\"total_frees\":6,"), "{text}");
        assert!(text.contains(",\"thp\":{\"advised_bytes\":0,"), "{text}");
        assert!(
            text.contains("\"purged_bytes\":12,\"purged_by\":{\"decay\":0,\"budget\":0,\"reclaim\":8,\"trim\":0,\"limit\":0,\"hollow\":4,\"huge_reuse\":0},"),
            "{text}"
        );
        assert!(
            text.contains(",\"mesh_waits\":9,\"mesh_longest_wait_us\":1500,\"mesh_pauses\":2,"),
            "{text}"
        );
        assert_eq!(text.matches('{').count(), text.matches('}').count());
        assert!(text.ends_with("}}"));
        let pid = std::process::id();
        assert!(text.starts_with(&format!("{{\"version\":1,\"pid\":{pid},\"ppid\":")));
        assert!(text.contains(",\"comm\":\""), "{text}");

        let mut buf = vec![0u8; 8192];
        let mut w = SliceWriter::new(&mut buf);
        s.write_json(&mut w).unwrap();
        let text = core::str::from_utf8(w.written()).unwrap();
        assert!(text.starts_with("{\"syscalls\":{"), "{text}");
        assert!(text.ends_with("}]}"), "{text}");
        assert!(!text.contains("\"pid\""), "the allocator's figures only");
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
