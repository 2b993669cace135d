//! The human report: `Display` for [`Stats`] (the allocator's lines) and
//! for [`Report`] (the process report of `PAGEWISE_STATS=1`: a header, the
//! kernel's view, and the allocator's lines indented under it). A dozen
//! lines, whatever the number of size classes; the classes are in the
//! JSON document.

use super::writer::{Bytes, Indent};
use super::Report;
use crate::stats::Stats;
use core::fmt::{self, Write};

/// The allocator's lines: what is live, where the committed bytes went,
/// the system calls made, the large and huge objects.
///
/// ```
/// let s = pagewise::stats();
/// let text = s.to_string();
/// assert!(text.starts_with("live "), "{text}");
/// assert!(text.contains("free slots in used pages"));
/// assert!(text.lines().count() < 16, "short: no table of size classes");
/// ```
impl fmt::Display for Stats {
    fn fmt(&self, w: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self;
        let rounding = s.live_bytes.saturating_sub(s.live_requested_bytes);
        let heap = s.committed_bytes + s.metadata_bytes;
        writeln!(
            w,
            "live {} in {} allocations ({} requested)",
            Bytes(s.live_bytes),
            s.live_allocations,
            Bytes(s.live_requested_bytes)
        )?;
        writeln!(w, "pagewise committed + metadata {}:", Bytes(heap))?;
        let rows = [
            ("live (requested)", s.live_requested_bytes),
            ("internal rounding", rounding),
            ("free slots in used pages", s.free_slot_bytes),
            ("retained empty pages", s.retained_bytes),
            ("metadata", s.metadata_bytes),
        ];
        for (name, v) in rows {
            writeln!(w, "  {name:<26} {:>10}", Bytes(v))?;
        }
        if s.hollow_bytes > 0 {
            writeln!(
                w,
                "purged inside used pages {} (free OS pages of pages holding live objects; not resident)",
                Bytes(s.hollow_bytes)
            )?;
        }
        if s.meshed_bytes > 0 {
            writeln!(
                w,
                "meshed {} of OS pages sharing physical pages, {} saved, {} kernel mappings added (PAGEWISE_MESH; counted once in PSS, once per page in RSS)",
                Bytes(s.meshed_bytes),
                Bytes(s.mesh_saved_bytes),
                s.mesh_mappings
            )?;
        }
        if s.mesh_guards_lost > 0 || s.mesh_registrations_refused > 0 {
            writeln!(
                w,
                "meshing refused by the kernel: {} guard pages not put back (those mappings stop meshing), {} userfaultfd registrations (those mappings' stores wait through mprotect)",
                s.mesh_guards_lost,
                s.mesh_registrations_refused
            )?;
        }
        if s.mesh_waits > 0 || s.mesh_pauses > 0 {
            writeln!(
                w,
                "meshing's waits: {} stores waited for a page's copy (longest {}.{:03} ms), {} passes let the page lists go for a waiting thread",
                s.mesh_waits,
                s.mesh_longest_wait_us / 1000,
                s.mesh_longest_wait_us % 1000,
                s.mesh_pauses
            )?;
        }
        let c = &s.syscalls;
        writeln!(
            w,
            "syscalls: mmap {} munmap {} madvise {}; mapped {} (peak {}), purged {}",
            c.mmap,
            c.munmap,
            c.madvise,
            Bytes(c.mapped_bytes),
            Bytes(c.peak_mapped_bytes),
            Bytes(c.purged_bytes)
        )?;
        if s.purged_bytes > 0 {
            let p = &s.purged_by;
            writeln!(
                w,
                "purged {}: decay {}, budget {}, reclaim for another heap {}, trim {}, limit {}, hollow {}, huge reuse {}",
                Bytes(s.purged_bytes),
                Bytes(p.decay),
                Bytes(p.budget),
                Bytes(p.reclaim),
                Bytes(p.trim),
                Bytes(p.limit),
                Bytes(p.hollow),
                Bytes(p.huge_reuse)
            )?;
        }
        writeln!(
            w,
            "large objects {} ({}), huge objects {} ({}), heaps {}, segments {}",
            s.large.count,
            Bytes(s.large.bytes),
            s.huge.count,
            Bytes(s.huge.bytes),
            s.heaps,
            s.segments
        )
    }
}

/// The process report: what `PAGEWISE_STATS=1` prints at exit.
///
/// ```
/// let text = pagewise::report().to_string();
/// assert!(text.starts_with(&format!("pagewise report (pid {})\n", std::process::id())));
/// assert!(text.contains("\n  RSS "));
/// assert!(text.contains("\n    free slots in used pages"));
/// ```
impl fmt::Display for Report {
    fn fmt(&self, w: &mut fmt::Formatter<'_>) -> fmt::Result {
        let os = &self.os;
        writeln!(w, "pagewise report (pid {})", self.pid)?;
        writeln!(
            w,
            "  RSS {} (peak {}), pagewise mappings resident {}",
            Bytes(os.vm_rss),
            Bytes(os.vm_hwm),
            Bytes(os.pagewise_rss)
        )?;
        writeln!(
            w,
            "  outside pagewise: anonymous {}, file-backed {}",
            Bytes(os.other_anon_rss),
            Bytes(os.file_rss)
        )?;
        writeln!(
            w,
            "  page faults: {} minor, {} major (the whole process)",
            os.minor_faults, os.major_faults
        )?;
        let s = &self.stats;
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
        let mut indented = Indent {
            out: w,
            at_line_start: true,
        };
        write!(indented, "{}", self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{OsMemory, SliceWriter};

    #[test]
    fn text_lines_line_up() {
        let mut s = Stats::ZERO;
        s.live_bytes = 3 << 20;
        s.live_requested_bytes = 5 << 19;
        s.committed_bytes = 4 << 20;
        s.free_slot_bytes = 1 << 20;
        s.metadata_bytes = 64 << 10;
        let os = OsMemory {
            minor_faults: 1234,
            major_faults: 5,
            ..OsMemory::default()
        };
        let r = Report::of(s, os);
        let mut buf = vec![0u8; 4096];
        let mut w = SliceWriter::new(&mut buf);
        write!(w, "{r}").unwrap();
        let text = core::str::from_utf8(w.written()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[3],
            "  page faults: 1234 minor, 5 major (the whole process)"
        );
        assert_eq!(
            lines[4],
            "  live 3.0 MiB in 0 allocations (2.5 MiB requested)"
        );
        assert_eq!(lines[5], "  pagewise committed + metadata 4.1 MiB:");
        assert_eq!(lines[6], "    live (requested)              2.5 MiB");
        assert_eq!(lines[8], "    free slots in used pages      1.0 MiB");
        assert_eq!(lines[10], "    metadata                     64.0 KiB");
        assert_eq!(lines.len(), 13, "{text}");
    }

    #[test]
    fn what_the_kernel_refused_meshing_is_shown_when_it_refused_anything() {
        let text = |s: Stats| {
            let r = Report::of(s, OsMemory::default());
            let mut buf = vec![0u8; 4096];
            let mut w = SliceWriter::new(&mut buf);
            write!(w, "{r}").unwrap();
            std::string::String::from(core::str::from_utf8(w.written()).unwrap())
        };
        assert!(!text(Stats::ZERO).contains("refused"));
        let mut s = Stats::ZERO;
        s.mesh_guards_lost = 2;
        assert!(
            text(s).contains("\n  meshing refused by the kernel: 2 guard pages not put back (those mappings stop meshing), 0 userfaultfd registrations (those mappings' stores wait through mprotect)\n"),
            "{}",
            text(s)
        );
        let mut s = Stats::ZERO;
        s.mesh_registrations_refused = 3;
        assert!(
            text(s).contains(
                ": 0 guard pages not put back (those mappings stop meshing), 3 userfaultfd"
            ),
            "{}",
            text(s)
        );
    }

    #[test]
    fn meshings_waits_are_shown_when_anything_waited() {
        let text = |s: Stats| {
            let r = Report::of(s, OsMemory::default());
            let mut buf = vec![0u8; 4096];
            let mut w = SliceWriter::new(&mut buf);
            write!(w, "{r}").unwrap();
            std::string::String::from(core::str::from_utf8(w.written()).unwrap())
        };
        assert!(!text(Stats::ZERO).contains("waits"));
        let mut s = Stats::ZERO;
        s.mesh_waits = 4;
        s.mesh_longest_wait_us = 2_345;
        assert!(
            text(s).contains("\n  meshing's waits: 4 stores waited for a page's copy (longest 2.345 ms), 0 passes let the page lists go for a waiting thread\n"),
            "{}",
            text(s)
        );
        let mut s = Stats::ZERO;
        s.mesh_pauses = 3;
        assert!(
            text(s).contains("(longest 0.000 ms), 3 passes let"),
            "{}",
            text(s)
        );
    }

    #[test]
    fn purges_are_shown_by_cause() {
        let mut s = Stats::ZERO;
        s.purged_bytes = 3 << 20;
        s.purged_by.budget = 1 << 20;
        s.purged_by.reclaim = 2 << 20;
        let r = Report::of(s, OsMemory::default());
        let mut buf = vec![0u8; 4096];
        let mut w = SliceWriter::new(&mut buf);
        write!(w, "{r}").unwrap();
        let text = core::str::from_utf8(w.written()).unwrap();
        assert!(
            text.contains("  purged 3.0 MiB: decay 0 B, budget 1.0 MiB, reclaim for another heap 2.0 MiB, trim 0 B, limit 0 B, hollow 0 B, huge reuse 0 B\n"),
            "{text}"
        );
    }
}
