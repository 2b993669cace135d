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

/// The library's huge pages (`PAGEWISE_THP`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct HugePages {
    /// Bytes of 2 MiB regions pagewise asked to be huge pages, now.
    pub advised_bytes: u64,
    /// Bytes of pagewise's mappings the kernel backs with huge pages.
    pub backed_bytes: u64,
    /// Huge pages split by purges so far.
    pub splits: u64,
    /// `madvise(MADV_HUGEPAGE)` calls.
    pub hugepage_calls: u64,
    /// `madvise(MADV_NOHUGEPAGE)` calls.
    pub nohugepage_calls: u64,
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
    /// Page faults served without I/O (`ru_minflt`), the whole process.
    #[serde(default)]
    pub minor_faults: u64,
    /// Page faults that read a file or swap (`ru_majflt`).
    #[serde(default)]
    pub major_faults: u64,
}

/// The JSON document libpagewise.so writes at exit (`PAGEWISE_STATS_FILE`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct AllocatorReport {
    /// Format version.
    pub version: u32,
    /// Process id.
    pub pid: u32,
    /// Its parent when it exited (absent from reports of older libraries).
    #[serde(default)]
    pub ppid: u32,
    /// Its name (`/proc/self/comm`; absent from reports of older libraries).
    #[serde(default)]
    pub comm: String,
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
    /// OS pages sharing physical pages with others (`PAGEWISE_MESH`;
    /// absent from reports of older libraries).
    #[serde(default)]
    pub meshed_bytes: u64,
    /// Physical memory meshing saves (absent from older reports).
    #[serde(default)]
    pub mesh_saved_bytes: u64,
    /// Kernel mappings meshing adds (absent from older reports).
    #[serde(default)]
    pub mesh_mappings: u64,
    /// Guard pages the kernel would not put back after meshing made a
    /// page at their place (absent from older reports).
    #[serde(default)]
    pub mesh_guards_lost: u64,
    /// Userfaultfd registrations of remapped pages the kernel refused
    /// (absent from older reports).
    #[serde(default)]
    pub mesh_registrations_refused: u64,
    /// Stores that waited for a meshed page's copy (absent from older
    /// reports).
    #[serde(default)]
    pub mesh_waits: u64,
    /// The longest of those waits, in microseconds (absent from older
    /// reports).
    #[serde(default)]
    pub mesh_longest_wait_us: u64,
    /// Times a mesh pass let the page lists go for a waiting thread
    /// (absent from older reports).
    #[serde(default)]
    pub mesh_pauses: u64,
    /// Bytes purged so far.
    pub purged_bytes: u64,
    /// Huge pages (absent from older reports).
    #[serde(default)]
    pub thp: HugePages,
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
    /// Milliseconds since `pagewise run` started the program.
    pub t_ms: u64,
    /// RSS.
    pub rss: u64,
    /// Usable bytes of live objects.
    pub live: u64,
    /// Committed bytes.
    pub committed: u64,
    /// Requested bytes of live objects (0 from older libraries, as are the
    /// fields below).
    #[serde(default)]
    pub live_requested: u64,
    /// Free slots in slab pages.
    #[serde(default)]
    pub free_slot: u64,
    /// Retained empty pages.
    #[serde(default)]
    pub retained: u64,
    /// Allocator metadata.
    #[serde(default)]
    pub metadata: u64,
    /// Resident file-backed and shared bytes (statm).
    #[serde(default)]
    pub file_rss: u64,
    /// Whether the library wrote the fields above (not in the JSON).
    #[serde(skip)]
    pub detailed: bool,
}

/// One process of the program's tree: what pagewise saw of it (its parent,
/// its command, how it ended, its peak RSS) and, if it ran pagewise's exit
/// handler, its library's report.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ProcessReport {
    /// Process id.
    pub pid: u32,
    /// The process that started it (0 for the program itself, or if
    /// unknown).
    pub ppid: u32,
    /// Its name: `/proc/<pid>/comm` when it ended, or the command as typed
    /// for the top process if nothing else is known.
    pub name: String,
    /// Its command line (its last image's; a forked child that did not
    /// exec has its parent's).
    #[serde(default)]
    pub command_line: String,
    /// Its peak RSS: `VmHWM` read when it exited (the highest of its
    /// images), else the kernel's `ru_maxrss` at its end (which includes
    /// its children's), else the library's `VmHWM`, else the highest sample.
    #[serde(default)]
    pub peak_rss_bytes: u64,
    /// Its RSS when it exited, if known.
    #[serde(default)]
    pub final_rss_bytes: Option<u64>,
    /// Its exit code, if it exited.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The signal that killed it, if one did.
    #[serde(default)]
    pub signal: Option<i32>,
    /// How it ended, and why it has no library report if it has none
    /// (`exit 0`, `ended by _exit(0): no report`, `killed by SIGKILL`,
    /// `exit 0; not using pagewise: static binary`).
    #[serde(default)]
    pub ending: String,
    /// Whether libpagewise was loaded in it when it ended (None: unknown).
    #[serde(default)]
    pub uses_pagewise: Option<bool>,
    /// When it started and ended, in ms since the run's start (as far as
    /// pagewise saw: the end is None if it was still running).
    #[serde(default)]
    pub start_ms: u64,
    /// See `start_ms`.
    #[serde(default)]
    pub end_ms: Option<u64>,
    /// Its RSS as `pagewise run` read it from /proc while it ran:
    /// `[ms since the start, bytes]` (every process, library or not).
    #[serde(default)]
    pub rss_samples: Vec<(u64, u64)>,
    /// The library's report (absent if it did not run exit handlers, or the
    /// library never loaded in it).
    pub allocator: Option<AllocatorReport>,
    /// Its samples.
    pub samples: Vec<Sample>,
    /// The sample with the highest RSS (if the samples carry the breakdown).
    pub peak: Option<Sample>,
}

impl ProcessReport {
    /// Picks [`ProcessReport::peak`] from the samples.
    pub fn find_peak(&mut self) {
        self.peak = self
            .samples
            .iter()
            .filter(|s| s.detailed)
            // The first of equal highs.
            .min_by_key(|s| std::cmp::Reverse(s.rss))
            .copied();
    }
}

/// Everything `pagewise run` knows after the program exits.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct RunReport {
    /// The command line.
    pub command: Vec<String>,
    /// The command line as a shell would need it typed (quoted).
    pub command_line: String,
    /// Its process id.
    pub pid: u32,
    /// Its exit code (128 + signal if killed).
    pub exit_code: i32,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    /// Wall time until the top process exited.
    pub elapsed_ms: u64,
    /// The highest peak RSS of any one process of the tree (the largest
    /// of the processes' `peak_rss_bytes`; without `traced`, getrusage of
    /// the children pagewise waited for).
    pub peak_rss_bytes: u64,
    /// The top process's library report (as in `processes[0]`).
    pub allocator: Option<AllocatorReport>,
    /// The top process's samples (as in `processes[0]`).
    pub samples: Vec<Sample>,
    /// Every process of the tree (with `traced`; else every one that left
    /// a report or samples): the top one first, then its descendants,
    /// parents before children.
    #[serde(default)]
    pub processes: Vec<ProcessReport>,
    /// Why the top process sent no report, if it did not.
    #[serde(default)]
    pub no_report: Option<String>,
    /// Set if pagewise stopped waiting for descendants still running (^C).
    #[serde(default)]
    pub stopped_waiting: bool,
    /// pagewise's own pid: the parent of descendants orphaned by their
    /// parent's exit (it is their subreaper).
    #[serde(default)]
    pub pagewise_pid: u32,
    /// Whether pagewise followed the whole tree (ptrace): every process is
    /// then in `processes`, however it ended. If not, only those that left
    /// a report or samples are.
    #[serde(default)]
    pub traced: bool,
    /// Why it could not follow the tree, if it could not.
    #[serde(default)]
    pub trace_error: Option<String>,
}

/// A category of resident memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Category {
    /// What it is.
    pub name: &'static str,
    /// Bytes.
    pub bytes: u64,
}

/// Resident bytes by category, and the committed bytes among them that
/// were never touched (counted in the categories, not resident).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Breakdown {
    /// The categories (none negative).
    pub cats: Vec<Category>,
    /// Bytes pagewise counts in its categories that the kernel does not find
    /// resident: committed (allocated, or kept) but never touched.
    pub untouched: u64,
}

impl Breakdown {
    /// What the categories come to, less the untouched bytes: the resident
    /// total.
    pub fn total(&self) -> u64 {
        let sum: u64 = self.cats.iter().map(|c| c.bytes).sum();
        sum.saturating_sub(self.untouched)
    }
}

fn breakdown(
    pagewise: [(&'static str, u64); 5],
    accounted: u64,
    resident: u64,
    outside_anon: u64,
    outside_file: u64,
) -> Breakdown {
    let mut cats: Vec<Category> = pagewise
        .iter()
        .map(|&(name, bytes)| Category { name, bytes })
        .collect();
    if resident > accounted {
        cats.push(Category {
            name: "resident, not accounted (!)",
            bytes: resident - accounted,
        });
    }
    cats.push(Category {
        name: "outside pagewise: anonymous",
        bytes: outside_anon,
    });
    cats.push(Category {
        name: "outside pagewise: file-backed",
        bytes: outside_file,
    });
    Breakdown {
        cats,
        untouched: accounted.saturating_sub(resident),
    }
}

/// Every resident byte at exit, by category: pagewise's five from its
/// accounting; if the kernel finds more resident in pagewise's mappings
/// than pagewise accounts for, that excess; then, from the kernel's smaps,
/// the memory outside pagewise. Memory pagewise committed that the program
/// never touched (allocated, so accounted, but never faulted in) is
/// [`Breakdown::untouched`], not a line.
pub fn attribution(a: &AllocatorReport) -> Breakdown {
    breakdown(
        [
            ("live objects (requested size)", a.live_requested_bytes),
            (
                "internal rounding (slot/page size)",
                a.live_bytes.saturating_sub(a.live_requested_bytes),
            ),
            ("free slots in used pages", a.free_slot_bytes),
            ("retained empty pages", a.retained_bytes),
            ("allocator metadata", a.metadata_bytes),
        ],
        a.committed_bytes + a.metadata_bytes,
        a.os.pagewise_rss,
        a.os.other_anon_rss,
        a.os.file_rss,
    )
}

/// The same categories at a sample (the one with the highest RSS). The
/// kernel's side comes from statm, which splits resident memory only into
/// anonymous and file-backed: pagewise's categories are taken as resident
/// up to the anonymous bytes, the anonymous rest is outside pagewise, and
/// what pagewise counts beyond the anonymous bytes was never touched.
pub fn peak_attribution(s: &Sample) -> Breakdown {
    let rounding = s.live.saturating_sub(s.live_requested);
    let accounted = s.live_requested + rounding + s.free_slot + s.retained + s.metadata;
    let anon = s.rss.saturating_sub(s.file_rss);
    breakdown(
        [
            ("live objects (requested size)", s.live_requested),
            ("internal rounding (slot/page size)", rounding),
            ("free slots in used pages", s.free_slot),
            ("retained empty pages", s.retained),
            ("allocator metadata", s.metadata),
        ],
        accounted,
        accounted.min(anon),
        anon.saturating_sub(accounted),
        s.file_rss,
    )
}

/// Attributed total and its difference from VmRSS, in percent.
#[cfg(test)]
pub fn attribution_error(a: &AllocatorReport) -> (u64, f64) {
    let total = attribution(a).total();
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

fn pct(part: u64, whole: u64) -> f64 {
    part as f64 * 100.0 / whole.max(1) as f64
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
    let line = if r.command_line.is_empty() {
        r.command.join(" ")
    } else {
        r.command_line.clone()
    };
    writeln!(s)?;
    writeln!(
        s,
        "pagewise run: {line} (pid {}) {how} after {:.2} s",
        r.pid,
        r.elapsed_ms as f64 / 1000.0
    )?;
    if r.stopped_waiting {
        writeln!(
            s,
            "  (stopped waiting for descendants still running after it: their reports are missing)"
        )?;
    }
    // Reports from before `processes` existed carry only the top one.
    let single;
    let procs: &[ProcessReport] = if r.processes.is_empty() {
        single = [ProcessReport {
            pid: r.pid,
            name: r.command.first().cloned().unwrap_or_default(),
            allocator: r.allocator.clone(),
            samples: r.samples.clone(),
            ..Default::default()
        }];
        &single
    } else {
        &r.processes
    };
    if procs.len() == 1 {
        return render_process(s, r, &procs[0]);
    }
    let detailed = crate::tree_text::detailed(procs);
    crate::tree_text::summary(s, r, procs)?;
    crate::tree_text::table(s, r, procs, &detailed)?;
    for &i in &detailed {
        let p = &procs[i];
        writeln!(s)?;
        let parent = if p.pid == r.pid {
            "the command".to_string()
        } else if p.ppid == 0 {
            "parent unknown".to_string()
        } else {
            format!("child of {}", p.ppid)
        };
        writeln!(s, "== `{}` (pid {}, {parent}) ==", p.name, p.pid)?;
        render_process(s, r, p)?;
    }
    let reported = procs.iter().filter(|p| p.allocator.is_some()).count();
    if reported > detailed.len() {
        writeln!(s)?;
        writeln!(
            s,
            "({} more reports are in the table only: their heaps were small; --json has every report)",
            reported - detailed.len()
        )?;
    }
    Ok(())
}

use crate::tree_text::total_allocs;

fn render_process(s: &mut String, r: &RunReport, p: &ProcessReport) -> std::fmt::Result {
    let top = p.pid == r.pid;
    let Some(a) = &p.allocator else {
        let sampled = p.samples.iter().map(|x| x.rss).max();
        if r.traced && p.peak_rss_bytes > 0 {
            writeln!(
                s,
                "  peak RSS {} (this process alone)",
                human(p.peak_rss_bytes)
            )?;
        } else if let Some(rss) = sampled {
            writeln!(s, "  peak RSS {} (sampled: this process alone)", human(rss))?;
        } else if top {
            writeln!(
                s,
                "  peak RSS {} (of it or of a descendant it waited for: wait4)",
                human(r.peak_rss_bytes)
            )?;
        }
        match &r.no_report {
            Some(why) if top => writeln!(s, "  {why}")?,
            _ if r.traced && !p.ending.is_empty() => {
                writeln!(s, "  no allocator report: {}", p.ending)?
            }
            _ => writeln!(
                s,
                "  no allocator report: the program ended without running exit handlers\n  (it was killed, or it left through _exit)"
            )?,
        }
        return Ok(());
    };
    let peak_live = p.samples.iter().map(|x| x.live).max().unwrap_or(0);
    writeln!(s)?;
    writeln!(s, "Memory")?;
    writeln!(
        s,
        "  peak RSS        {:>11}   (VmHWM: this process alone)",
        human(a.os.vm_hwm)
    )?;
    writeln!(
        s,
        "  final RSS       {:>11}   (at exit, /proc/self/status)",
        human(a.os.vm_rss)
    )?;
    writeln!(
        s,
        "  live objects    {:>11}   {} objects at exit ({} requested)",
        human(a.live_bytes),
        a.live_allocations,
        human(a.live_requested_bytes)
    )?;
    if peak_live > 0 {
        writeln!(s, "  peak live       {:>11}   (sampled)", human(peak_live))?;
    }
    writeln!(
        s,
        "  allocations so far {:>8}   (in size classes, since start; large and huge objects are counted live only)",
        total_allocs(a)
    )?;
    writeln!(
        s,
        "  committed       {:>11}   (peak {}), {} purged so far",
        human(a.committed_bytes),
        human(a.peak_committed_bytes),
        human(a.purged_bytes)
    )?;
    writeln!(
        s,
        "  page faults     {:>11}   minor ({} major): first touches of memory, and of memory purged and used again",
        a.os.minor_faults, a.os.major_faults
    )?;
    if a.hollow_bytes > 0 {
        writeln!(
            s,
            "  purged inside used pages {:>11}   (free OS pages of pages that hold live objects; not resident)",
            human(a.hollow_bytes)
        )?;
    }
    if a.thp.advised_bytes > 0 || a.thp.backed_bytes > 0 || a.thp.splits > 0 {
        writeln!(
            s,
            "  huge pages      {:>11}   asked for ({} madvise), {} backed by the kernel, {} split by purges",
            human(a.thp.advised_bytes),
            a.thp.hugepage_calls,
            human(a.thp.backed_bytes),
            a.thp.splits
        )?;
    }
    if a.meshed_bytes > 0 {
        writeln!(
            s,
            "  meshed          {:>11}   ({} saved: OS pages sharing physical pages in {} kernel mappings more; RSS still counts each)",
            human(a.meshed_bytes),
            human(a.mesh_saved_bytes),
            a.mesh_mappings
        )?;
    }
    if a.mesh_guards_lost > 0 || a.mesh_registrations_refused > 0 {
        writeln!(
            s,
            "  meshing refused {} guard pages not put back (those mappings stop meshing), {} userfaultfd registrations (stores there wait through mprotect)",
            a.mesh_guards_lost,
            a.mesh_registrations_refused
        )?;
    }
    if a.mesh_waits > 0 || a.mesh_pauses > 0 {
        writeln!(
            s,
            "  meshing's waits {} stores waited for a page's copy (longest {:.1} ms), {} passes let the page lists go for a waiting thread",
            a.mesh_waits,
            a.mesh_longest_wait_us as f64 / 1000.0,
            a.mesh_pauses
        )?;
    }

    if let Some(pk) = &p.peak {
        writeln!(s)?;
        writeln!(
            s,
            "Where the resident bytes were at the peak (the sample with the highest RSS, at {:.2} s)",
            pk.t_ms as f64 / 1000.0
        )?;
        let b = peak_attribution(pk);
        render_breakdown(s, &b, pk.rss, ("sampled RSS", ""))?;
        if a.os.vm_hwm > pk.rss {
            writeln!(
                s,
                "  (the true peak, VmHWM {}, fell between samples; anonymous and file-backed from statm)",
                human(a.os.vm_hwm)
            )?;
        }
    }

    writeln!(s)?;
    writeln!(s, "Where the resident bytes are at exit")?;
    let b = attribution(a);
    render_breakdown(s, &b, a.os.vm_rss, ("RSS", " from /proc"))?;
    let (accounted, resident, gap) = accounting_gap(a);
    if gap < 0.0 {
        writeln!(
            s,
            "  pagewise accounts {} in its mappings, the kernel finds {} resident there:\n  memory pagewise does not account for, please report it",
            human(accounted),
            human(resident),
        )?;
    }

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
    writeln!(s, "Busiest size classes (by allocations so far)")?;
    writeln!(
        s,
        "  {:>9} {:>19} {:>13} {:>8} {:>12}",
        "slot", "allocations so far", "live objects", "pages", "free slots"
    )?;
    let mut classes: Vec<&Class> = a.classes.iter().filter(|c| c.total_allocs > 0).collect();
    classes.sort_by_key(|k| std::cmp::Reverse(k.total_allocs));
    for k in classes.iter().take(8) {
        writeln!(
            s,
            "  {:>9} {:>19} {:>13} {:>8} {:>12}",
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

/// The lines of a breakdown, its total against `rss`, and the untouched
/// bytes as a note.
fn render_breakdown(
    s: &mut String,
    b: &Breakdown,
    rss: u64,
    (rss_name, rss_source): (&str, &str),
) -> std::fmt::Result {
    let total = b.total();
    // Percentages of the lines' sum, which exceeds the total by the
    // untouched bytes.
    let sum: u64 = b.cats.iter().map(|c| c.bytes).sum();
    for c in &b.cats {
        writeln!(
            s,
            "  {:<36} {:>11} {:>6.1}%",
            c.name,
            human(c.bytes),
            pct(c.bytes, sum)
        )?;
    }
    writeln!(s, "  {:-<56}", "")?;
    let err = (total as f64 - rss as f64) / rss.max(1) as f64 * 100.0;
    writeln!(
        s,
        "  {:<36} {:>11}   vs {rss_name} {}{rss_source}: {:+.1}%",
        "attributed total",
        human(total),
        human(rss),
        err
    )?;
    if b.untouched > 0 {
        writeln!(
            s,
            "  note: committed but never touched: {} (in the lines above, but not resident:\n  \
             allocated or kept by pagewise, never written by the program; the total leaves it out)",
            human(b.untouched)
        )?;
    }
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
        let b = attribution(&a);
        assert!(b.cats.iter().all(|c| !c.name.contains("never touched")));
        assert_eq!(b.untouched, 2000);
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
    fn shows_what_the_kernel_refused_meshing_only_when_it_did() {
        let line = "meshing refused";
        let mut r = RunReport {
            command: vec!["prog".into()],
            allocator: Some(sample()),
            ..Default::default()
        };
        assert!(!render(&r).contains(line), "{}", render(&r));
        let a = r.allocator.as_mut().unwrap();
        a.mesh_guards_lost = 1;
        a.mesh_registrations_refused = 2;
        let text = render(&r);
        assert!(
            text.contains("meshing refused 1 guard pages not put back"),
            "{text}"
        );
        assert!(text.contains(", 2 userfaultfd registrations"), "{text}");
    }

    #[test]
    fn shows_meshings_waits_only_when_anything_waited() {
        let line = "meshing's waits";
        let mut r = RunReport {
            command: vec!["prog".into()],
            allocator: Some(sample()),
            ..Default::default()
        };
        assert!(!render(&r).contains(line), "{}", render(&r));
        let a = r.allocator.as_mut().unwrap();
        a.mesh_waits = 5;
        a.mesh_longest_wait_us = 12_340;
        a.mesh_pauses = 2;
        let text = render(&r);
        assert!(
            text.contains(
                "meshing's waits 5 stores waited for a page's copy (longest 12.3 ms), 2 passes"
            ),
            "{text}"
        );
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
