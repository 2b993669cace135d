//! The text of a run of several processes, before any process's details:
//! the whole tree in a few lines, then a table with a line per process
//! (processes that share a name, beyond a screenful, one line per name),
//! bounded however many processes the program starts; every process is in
//! `--json`.

use crate::report::{human, AllocatorReport, ProcessReport, RunReport};
use std::fmt::Write;

/// Processes given their full details at most (the busiest heaps).
pub const DETAILED: usize = 4;
/// Up to this many processes, the table has a line for each.
const ROWS: usize = 12;
/// Lines for groups of processes at most, the rest counted in one line.
const GROUPS: usize = 10;
/// A heap this size (peak committed bytes) or larger gets details, if it
/// is also 1 % of the tree's.
const BUSY_HEAP: u64 = 1 << 20;

/// Allocations served since start, in every size class.
pub fn total_allocs(a: &AllocatorReport) -> u64 {
    a.classes.iter().map(|c| c.total_allocs).sum()
}

/// The processes given full details (indices into `procs`, in tree
/// order): every one with a report if there are few; else those whose heap
/// mattered (1 MiB and 1 % of the tree's heaps at their peak), the
/// busiest first, at most [`DETAILED`].
pub fn detailed(procs: &[ProcessReport]) -> Vec<usize> {
    let reported: Vec<usize> = (0..procs.len())
        .filter(|&i| procs[i].allocator.is_some())
        .collect();
    if reported.len() <= DETAILED {
        return reported;
    }
    let heap = |i: usize| {
        procs[i]
            .allocator
            .as_ref()
            .map_or(0, |a| a.peak_committed_bytes)
    };
    let total: u64 = reported.iter().map(|&i| heap(i)).sum();
    let mut busy: Vec<usize> = reported
        .into_iter()
        .filter(|&i| heap(i) >= BUSY_HEAP.max(total / 100))
        .collect();
    busy.sort_by_key(|&i| std::cmp::Reverse(heap(i)));
    busy.truncate(DETAILED);
    busy.sort_unstable();
    busy
}

/// The whole tree in a few lines.
pub fn summary(s: &mut String, r: &RunReport, procs: &[ProcessReport]) -> std::fmt::Result {
    let reports = procs.iter().filter(|p| p.allocator.is_some()).count();
    let mut missing: Vec<(&str, usize)> = Vec::new();
    for p in procs.iter().filter(|p| p.allocator.is_none()) {
        let kind = if p.ending.contains("not using pagewise") {
            "not using pagewise"
        } else if p.ending.contains("_exit") {
            "ended by _exit"
        } else if p.signal.is_some() {
            "killed by a signal"
        } else if p.end_ms.is_none() && r.traced {
            "still running"
        } else {
            "no report"
        };
        match missing.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => missing.push((kind, 1)),
        }
    }
    writeln!(s)?;
    let without = if missing.is_empty() {
        String::new()
    } else {
        let parts: Vec<String> = missing.iter().map(|(k, n)| format!("{n} {k}")).collect();
        format!(
            "; {} without one: {}",
            procs.len() - reports,
            parts.join(", ")
        )
    };
    writeln!(
        s,
        "Whole tree: {} processes, {reports} with a report{without}",
        procs.len()
    )?;
    if let Some(big) = procs.iter().max_by_key(|p| p.peak_rss_bytes) {
        writeln!(
            s,
            "  largest peak RSS  {:>10}  `{}` (pid {})",
            human(big.peak_rss_bytes),
            big.name,
            big.pid
        )?;
    }
    let tree_peak = crate::tree::tree_rss(procs)
        .iter()
        .map(|&(_, v)| v)
        .max()
        .unwrap_or(0);
    if tree_peak > 0 {
        writeln!(
            s,
            "  tree's peak RSS   {:>10}  every process's at once (sampled; shared pages count in each)",
            human(tree_peak)
        )?;
    }
    let live: u64 = procs
        .iter()
        .filter_map(|p| p.allocator.as_ref())
        .map(|a| a.live_bytes)
        .sum();
    let objects: u64 = procs
        .iter()
        .filter_map(|p| p.allocator.as_ref())
        .map(|a| a.live_allocations)
        .sum();
    let most = procs
        .iter()
        .filter_map(|p| Some((p, p.allocator.as_ref()?.live_bytes)))
        .max_by_key(|&(_, b)| b);
    let most = match most {
        Some((p, b)) if b > 0 && reports > 1 => {
            format!("; most in `{}` (pid {}): {}", p.name, p.pid, human(b))
        }
        _ => String::new(),
    };
    writeln!(
        s,
        "  live at exit      {:>10}  {objects} allocations never freed, in the {reports} reports{most}",
        human(live)
    )?;
    if let Some(e) = &r.trace_error {
        writeln!(
            s,
            "  (pagewise could not follow the process tree ({e}): processes that left\n  \
             neither a report nor samples are missing; `pagewise run --no-trace` says so too)"
        )?;
    } else if !r.traced {
        writeln!(
            s,
            "  (--no-trace: processes that left neither a report nor samples are missing)"
        )?;
    }
    Ok(())
}

/// The table: a line per process, or per name for many.
pub fn table(
    s: &mut String,
    r: &RunReport,
    procs: &[ProcessReport],
    detailed: &[usize],
) -> std::fmt::Result {
    writeln!(s)?;
    writeln!(
        s,
        "  {:>7} {:>7}  {:<15} {:>10} {:>13} {:>11}  how it ended",
        "pid", "parent", "name", "peak RSS", "live at exit", "allocations"
    )?;
    // One line each for a screenful; beyond, the top process, the detailed
    // ones and those killed by a signal each, the rest by name.
    let alone = |i: usize| {
        procs.len() <= ROWS || i == 0 || detailed.contains(&i) || procs[i].signal.is_some()
    };
    let mut groups: Vec<(&str, Vec<&ProcessReport>)> = Vec::new();
    for (i, p) in procs.iter().enumerate() {
        if !alone(i) {
            match groups.iter_mut().find(|(n, _)| *n == p.name) {
                Some((_, g)) => g.push(p),
                None => groups.push((&p.name, vec![p])),
            }
        }
    }
    for (i, p) in procs.iter().enumerate() {
        if alone(i) {
            row(s, r, p)?;
        }
    }
    let mut left = 0;
    for (k, (name, g)) in groups.iter().enumerate() {
        if k >= GROUPS {
            left += g.len();
        } else if g.len() == 1 {
            row(s, r, g[0])?;
        } else {
            group(s, name, g)?;
        }
    }
    if left > 0 {
        writeln!(
            s,
            "  ... and {left} more processes under {} other names (--json has each)",
            groups.len() - GROUPS
        )?;
    }
    Ok(())
}

fn row(s: &mut String, r: &RunReport, p: &ProcessReport) -> std::fmt::Result {
    let parent = if p.pid == r.pid || p.ppid == 0 {
        "-".to_string()
    } else {
        p.ppid.to_string()
    };
    let (live, allocs) = match &p.allocator {
        Some(a) => (human(a.live_bytes), total_allocs(a).to_string()),
        None => ("-".into(), "-".into()),
    };
    let peak = if p.peak_rss_bytes > 0 {
        human(p.peak_rss_bytes)
    } else {
        "-".into()
    };
    writeln!(
        s,
        "  {:>7} {:>7}  {:<15} {:>10} {:>13} {:>11}  {}",
        p.pid,
        parent,
        short(&p.name, 15),
        peak,
        live,
        allocs,
        p.ending
    )
}

/// One line for processes of one name: their count, the highest peak,
/// the sums, and how they ended.
fn group(s: &mut String, name: &str, g: &[&ProcessReport]) -> std::fmt::Result {
    let peak = g.iter().map(|p| p.peak_rss_bytes).max().unwrap_or(0);
    let reports: Vec<&AllocatorReport> = g.iter().filter_map(|p| p.allocator.as_ref()).collect();
    let live: u64 = reports.iter().map(|a| a.live_bytes).sum();
    let allocs: u64 = reports.iter().map(|a| total_allocs(a)).sum();
    let mut endings: Vec<(&str, usize)> = Vec::new();
    for p in g {
        match endings.iter_mut().find(|(e, _)| *e == p.ending) {
            Some((_, n)) => *n += 1,
            None => endings.push((&p.ending, 1)),
        }
    }
    let how = if endings.len() == 1 {
        format!("each {}", endings[0].0)
    } else {
        endings
            .iter()
            .map(|(e, n)| format!("{n}: {e}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let count = format!("{} × ", g.len());
    writeln!(
        s,
        "  {:>15}  {:<15} {:>10} {:>13} {:>11}  {how}",
        "",
        count.clone() + &short(name, 15usize.saturating_sub(count.chars().count()).max(4)),
        format!("≤ {}", human(peak)),
        human(live),
        allocs
    )
}

/// `text` cut to `n` characters (with `~` at the cut).
fn short(text: &str, n: usize) -> String {
    if text.chars().count() <= n {
        return text.to_string();
    }
    let mut t: String = text.chars().take(n - 1).collect();
    t.push('~');
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(pid: u32, name: &str, heap: Option<u64>) -> ProcessReport {
        ProcessReport {
            pid,
            ppid: 1,
            name: name.into(),
            peak_rss_bytes: 3 << 20,
            ending: "exit 0".into(),
            allocator: heap.map(|h| AllocatorReport {
                peak_committed_bytes: h,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn details_go_to_busy_heaps_only_when_there_are_many() {
        let few = vec![
            proc(1, "sh", None),
            proc(2, "a", Some(10)),
            proc(3, "b", Some(10)),
        ];
        assert_eq!(detailed(&few), [1, 2]);
        let mut many: Vec<_> = (0..40).map(|i| proc(i, "true", Some(8 << 10))).collect();
        many[7].allocator.as_mut().unwrap().peak_committed_bytes = 50 << 20;
        assert_eq!(detailed(&many), [7]);
    }

    #[test]
    fn many_processes_of_one_name_are_one_line() {
        let mut procs = vec![proc(1, "sh", None)];
        procs.extend((2..42).map(|i| proc(i, "true", Some(8 << 10))));
        let r = RunReport {
            pid: 1,
            ..Default::default()
        };
        let mut s = String::new();
        table(&mut s, &r, &procs, &[]).unwrap();
        assert_eq!(s.lines().count(), 4, "{s}");
        assert!(s.contains("40 × true"), "{s}");
        assert!(s.contains("each exit 0"), "{s}");
    }

    #[test]
    fn names_are_cut_to_their_column() {
        assert_eq!(short("python3", 15), "python3");
        assert_eq!(short("a-very-long-process-name", 8), "a-very-~");
    }
}
