//! The report of `pagewise run`: the library's JSON (read with serde) and
//! its rendering as text.

use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// System call counts (`pagewise::SyscallCounts`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Syscalls {
    /// `mmap` calls.
    pub mmap: u64,
    /// `munmap` calls.
    pub munmap: u64,
    /// `madvise` calls.
    pub madvise: u64,
    /// Address space mapped at exit.
    pub mapped_bytes: u64,
    /// Highest address space mapped.
    pub peak_mapped_bytes: u64,
    /// Bytes given back with `madvise`.
    pub purged_bytes: u64,
}

/// Large or huge objects (`pagewise::ObjectStats`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Objects {
    /// Live objects.
    pub count: u64,
    /// Their usable bytes.
    pub bytes: u64,
    /// Their requested bytes.
    pub requested_bytes: u64,
}

/// One size class (`pagewise::ClassStats`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Class {
    /// Index in the size-class table.
    pub class: u32,
    /// Slot size in bytes.
    pub slot_size: u64,
    /// Slab pages.
    pub pages: u64,
    /// Slots holding live objects.
    pub live_slots: u64,
    /// Free slots in those pages.
    pub free_slots: u64,
    /// Of those, slots waiting in threads' caches.
    #[serde(default)]
    pub cached_slots: u64,
    /// Pages with no live slot.
    pub retained_pages: u64,
    /// Allocations served since start.
    pub total_allocs: u64,
    /// Frees since start (remote frees once collected).
    #[serde(default)]
    pub total_frees: u64,
    /// Estimated bytes requested by live objects.
    pub live_requested_bytes: u64,
}

/// The kernel's view, read by the library in the process at exit.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Os {
    /// VmRSS.
    pub vm_rss: u64,
    /// VmHWM (peak RSS).
    pub vm_hwm: u64,
    /// RssAnon.
    pub rss_anon: u64,
    /// RssFile.
    pub rss_file: u64,
    /// RssShmem.
    pub rss_shmem: u64,
    /// Resident bytes of pagewise's mappings (smaps).
    pub pagewise_rss: u64,
    /// Resident anonymous bytes outside pagewise (smaps).
    pub other_anon_rss: u64,
    /// Resident file-backed bytes (smaps).
    pub file_rss: u64,
}

/// The JSON document libpagewise.so writes at exit (`PAGEWISE_STATS_FILE`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct AllocatorReport {
    /// Format version.
    pub version: u32,
    /// Process id.
    pub pid: u32,
    /// System calls.
    pub syscalls: Syscalls,
    /// Address space reserved.
    pub reserved_bytes: u64,
    /// Bytes that may be resident (excluding metadata).
    pub committed_bytes: u64,
    /// Peak committed bytes.
    pub peak_committed_bytes: u64,
    /// Allocator metadata.
    pub metadata_bytes: u64,
    /// Usable bytes of live allocations.
    pub live_bytes: u64,
    /// Requested bytes of live allocations.
    pub live_requested_bytes: u64,
    /// Live allocations.
    pub live_allocations: u64,
    /// Committed free spans kept for reuse.
    pub retained_bytes: u64,
    /// Free slots in slab pages, still resident.
    pub free_slot_bytes: u64,
    /// Free OS pages purged inside slab pages that hold live objects (not
    /// resident; absent from reports of older libraries).
    #[serde(default)]
    pub hollow_bytes: u64,
    /// Bytes purged so far.
    pub purged_bytes: u64,
    /// Segments.
    pub segments: u64,
    /// Thread heaps.
    pub heaps: u64,
    /// Large objects.
    pub large: Objects,
    /// Huge objects.
    pub huge: Objects,
    /// Size classes that were used.
    pub classes: Vec<Class>,
    /// The kernel's figures.
    pub os: Os,
}

/// One sample taken while the program ran.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize)]
pub struct Sample {
    /// Milliseconds since the library was loaded.
    pub t_ms: u64,
    /// RSS.
    pub rss: u64,
    /// Live bytes.
    pub live: u64,
    /// Committed bytes.
    pub committed: u64,
}

/// Everything `pagewise run` knows after the program exits.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct RunReport {
    /// The command line.
    pub command: Vec<String>,
    /// Its process id.
    pub pid: u32,
    /// Its exit code (128 + signal if killed).
    pub exit_code: i32,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    /// Wall time.
    pub elapsed_ms: u64,
    /// Peak RSS from the kernel (wait4's ru_maxrss).
    pub peak_rss_bytes: u64,
    /// The library's report (absent if the program did not run exit handlers).
    pub allocator: Option<AllocatorReport>,
    /// Samples.
    pub samples: Vec<Sample>,
}

/// A category of resident memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Category {
    /// What it is.
    pub name: &'static str,
    /// Bytes (negative for the correction of committed-but-untouched memory).
    pub bytes: i64,
}

/// Every resident byte at exit, by category: pagewise's five from its
/// accounting; then, from the kernel's smaps, the correction for memory
/// pagewise committed that the program never touched (allocated, so
/// accounted, but never faulted in) or, if the kernel finds more resident
/// in pagewise's mappings than pagewise accounts for, that excess; then the
/// memory outside pagewise.
pub fn attribution(a: &AllocatorReport) -> Vec<Category> {
    let accounted = (a.committed_bytes + a.metadata_bytes) as i64;
    let resident = a.os.pagewise_rss as i64;
    let mut cats = vec![
        Category {
            name: "live (requested by the program)",
            bytes: a.live_requested_bytes as i64,
        },
        Category {
            name: "internal rounding (slot/page size)",
            bytes: a.live_bytes.saturating_sub(a.live_requested_bytes) as i64,
        },
        Category {
            name: "free slots in used pages",
            bytes: a.free_slot_bytes as i64,
        },
        Category {
            name: "retained empty pages",
            bytes: a.retained_bytes as i64,
        },
        Category {
            name: "allocator metadata",
            bytes: a.metadata_bytes as i64,
        },
    ];
    if accounted > resident {
        cats.push(Category {
            name: "minus: committed, never touched",
            bytes: resident - accounted,
        });
    } else if resident > accounted {
        cats.push(Category {
            name: "resident, not accounted (!)",
            bytes: resident - accounted,
        });
    }
    cats.push(Category {
        name: "outside pagewise: anonymous",
        bytes: a.os.other_anon_rss as i64,
    });
    cats.push(Category {
        name: "outside pagewise: file-backed",
        bytes: a.os.file_rss as i64,
    });
    cats
}

/// Attributed total and its difference from VmRSS, in percent.
pub fn attribution_error(a: &AllocatorReport) -> (u64, f64) {
    let total: i64 = attribution(a).iter().map(|c| c.bytes).sum();
    let total = total.max(0) as u64;
    let rss = a.os.vm_rss.max(1);
    (total, (total as f64 - rss as f64) / rss as f64 * 100.0)
}

/// pagewise's own accounting against the kernel: bytes accounted in its
/// mappings, bytes resident there, and the gap as a percentage of RSS.
pub fn accounting_gap(a: &AllocatorReport) -> (u64, u64, f64) {
    let accounted = a.committed_bytes + a.metadata_bytes;
    let resident = a.os.pagewise_rss;
    let gap = (accounted as f64 - resident as f64) / a.os.vm_rss.max(1) as f64 * 100.0;
    (accounted, resident, gap)
}

/// Bytes as a short human figure.
pub fn human(b: u64) -> String {
    if b < 1024 {
        return format!("{b} B");
    }
    let units = ["KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", units[u])
}

fn pct(part: i64, whole: u64) -> f64 {
    part as f64 * 100.0 / whole.max(1) as f64
}

/// A signed byte figure: `-37.2 MiB`.
fn human_signed(b: i64) -> String {
    if b < 0 {
        format!("-{}", human(b.unsigned_abs()))
    } else {
        human(b as u64)
    }
}

/// The text report.
pub fn render(r: &RunReport) -> String {
    let mut s = String::new();
    let _ = render_into(&mut s, r);
    s
}

fn render_into(s: &mut String, r: &RunReport) -> std::fmt::Result {
    let how = match r.signal {
        Some(sig) => format!("was killed by signal {sig}"),
        None => format!("exited with status {}", r.exit_code),
    };
    writeln!(s)?;
    writeln!(
        s,
        "pagewise run: `{}` (pid {}) {how} after {:.2} s",
        r.command.join(" "),
        r.pid,
        r.elapsed_ms as f64 / 1000.0
    )?;
    let Some(a) = &r.allocator else {
        writeln!(s, "  peak RSS {}", human(r.peak_rss_bytes))?;
        writeln!(
            s,
            "  no allocator report: the program ended without running exit handlers\n  (it was killed, or it left through _exit)"
        )?;
        return Ok(());
    };
    let peak_live = r.samples.iter().map(|x| x.live).max().unwrap_or(0);
    let peak_rss = r.peak_rss_bytes.max(a.os.vm_hwm);
    writeln!(s)?;
    writeln!(s, "Memory")?;
    writeln!(s, "  peak RSS        {:>11}", human(peak_rss))?;
    writeln!(
        s,
        "  final RSS       {:>11}   (at exit, /proc/self/status)",
        human(a.os.vm_rss)
    )?;
    writeln!(
        s,
        "  live            {:>11}   in {} allocations ({} requested)",
        human(a.live_bytes),
        a.live_allocations,
        human(a.live_requested_bytes)
    )?;
    if peak_live > 0 {
        writeln!(s, "  peak live       {:>11}   (sampled)", human(peak_live))?;
    }
    writeln!(
        s,
        "  committed       {:>11}   (peak {}), {} purged so far",
        human(a.committed_bytes),
        human(a.peak_committed_bytes),
        human(a.purged_bytes)
    )?;
    if a.hollow_bytes > 0 {
        writeln!(
            s,
            "  purged inside used pages {:>11}   (free OS pages of pages that hold live objects; not resident)",
            human(a.hollow_bytes)
        )?;
    }

    writeln!(s)?;
    writeln!(s, "Where the resident bytes are (at exit)")?;
    let cats = attribution(a);
    let (total, err) = attribution_error(a);
    for c in &cats {
        writeln!(
            s,
            "  {:<36} {:>11} {:>6.1}%",
            c.name,
            human_signed(c.bytes),
            pct(c.bytes, total)
        )?;
    }
    writeln!(s, "  {:-<56}", "")?;
    writeln!(
        s,
        "  {:<36} {:>11}   vs RSS {} from /proc: {:+.1}%",
        "attributed total",
        human(total),
        human(a.os.vm_rss),
        err
    )?;
    let (accounted, resident, gap) = accounting_gap(a);
    let why = if gap >= 0.0 {
        "committed pages the program has not touched yet"
    } else {
        "memory pagewise does not account for: please report it"
    };
    writeln!(
        s,
        "  pagewise accounts {} in its mappings, the kernel finds {} resident there\n  (difference {:+.1}% of RSS: {why})",
        human(accounted),
        human(resident),
        gap
    )?;

    writeln!(s)?;
    writeln!(s, "System calls")?;
    let c = &a.syscalls;
    writeln!(
        s,
        "  mmap {}  munmap {}  madvise {}   mapped {} (peak {}), purged {}",
        c.mmap,
        c.munmap,
        c.madvise,
        human(c.mapped_bytes),
        human(c.peak_mapped_bytes),
        human(c.purged_bytes)
    )?;

    writeln!(s)?;
    writeln!(s, "Busiest size classes (by allocations)")?;
    writeln!(
        s,
        "  {:>9} {:>12} {:>10} {:>8} {:>12}",
        "slot", "allocations", "live", "pages", "free slots"
    )?;
    let mut classes: Vec<&Class> = a.classes.iter().filter(|c| c.total_allocs > 0).collect();
    classes.sort_by_key(|k| std::cmp::Reverse(k.total_allocs));
    for k in classes.iter().take(8) {
        writeln!(
            s,
            "  {:>9} {:>12} {:>10} {:>8} {:>12}",
            human(k.slot_size),
            k.total_allocs,
            k.live_slots,
            k.pages,
            k.free_slots
        )?;
    }
    writeln!(
        s,
        "  large objects: {} live ({}); huge objects: {} live ({}); {} thread heaps",
        a.large.count,
        human(a.large.bytes),
        a.huge.count,
        human(a.huge.bytes),
        a.heaps
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> AllocatorReport {
        AllocatorReport {
            live_bytes: 1100,
            live_requested_bytes: 1000,
            free_slot_bytes: 500,
            retained_bytes: 4096,
            metadata_bytes: 300,
            committed_bytes: 1100 + 500 + 4096,
            classes: vec![
                Class {
                    slot_size: 16,
                    total_allocs: 5,
                    ..Default::default()
                },
                Class {
                    slot_size: 64,
                    total_allocs: 50,
                    ..Default::default()
                },
            ],
            os: Os {
                vm_rss: 10_000,
                pagewise_rss: 1100 + 500 + 4096 + 300,
                other_anon_rss: 2000,
                file_rss: 2004,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn attribution_adds_up_to_rss() {
        let a = sample();
        let (total, err) = attribution_error(&a);
        assert_eq!(total, 1000 + 100 + 500 + 4096 + 300 + 2000 + 2004);
        assert_eq!(total, 10_000);
        assert_eq!(err, 0.0);
    }

    #[test]
    fn untouched_allocations_are_a_named_correction() {
        let mut a = sample();
        // pagewise accounts 5996 bytes; the kernel finds only 3996 resident.
        a.os.pagewise_rss = 3996;
        a.os.vm_rss = 8000;
        let cats = attribution(&a);
        let fix = cats
            .iter()
            .find(|c| c.name.contains("never touched"))
            .unwrap();
        assert_eq!(fix.bytes, -2000);
        let (total, err) = attribution_error(&a);
        assert_eq!(total, 8000);
        assert_eq!(err, 0.0);
        let (accounted, resident, gap) = accounting_gap(&a);
        assert_eq!((accounted, resident, gap), (5996, 3996, 25.0));
    }

    #[test]
    fn renders_categories_and_busiest_class_first() {
        let r = RunReport {
            command: vec!["prog".into()],
            allocator: Some(sample()),
            ..Default::default()
        };
        let text = render(&r);
        assert!(text.contains("retained empty pages"), "{text}");
        assert!(text.contains("vs RSS 9.8 KiB from /proc: +0.0%"), "{text}");
        let i64 = text.find("64 B").unwrap();
        let i16 = text.find("16 B").unwrap();
        assert!(i64 < i16, "sorted by allocations:\n{text}");
    }

    #[test]
    fn says_when_there_is_no_allocator_report() {
        let r = RunReport {
            command: vec!["prog".into()],
            signal: Some(9),
            exit_code: 137,
            ..Default::default()
        };
        assert!(render(&r).contains("killed by signal 9"));
        assert!(render(&r).contains("no allocator report"));
    }
}
