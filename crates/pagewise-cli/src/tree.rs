//! The processes of a run: what the tracer saw of each (parent, command,
//! how it ended, peak RSS, RSS over time) joined, by pid, with what its
//! library wrote (the exit report `stats.PID.json` and the samples
//! `samples.PID.txt` in the run's directory). Without the tracer, the
//! processes are those that left a report or samples.

use crate::report::{AllocatorReport, ProcessReport, Sample};
use crate::rss_sampler::Reading;
use crate::trace::{signal_name, Traced};
use std::path::Path;

/// Every process of the run, the top one (`top`, always present) first,
/// then in tree order (parents before children, siblings by pid).
/// `traced`: the tracer's processes (empty without it); `readings`: its
/// RSS readings; `start_ms`: the run's start on the samples' clock.
pub fn processes(
    work: &Path,
    top: u32,
    command: &std::ffi::OsStr,
    traced: &[Traced],
    readings: &[Reading],
    start_ms: u64,
) -> Vec<ProcessReport> {
    let mut procs: Vec<ProcessReport> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for t in traced {
        seen.insert(t.pid);
        procs.push(process(work, t.pid, Some(t), start_ms));
    }
    for pid in std::iter::once(top).chain(pids_with_files(work)) {
        if seen.insert(pid) {
            procs.push(process(work, pid, None, start_ms));
        }
    }
    for (i, p) in procs.iter_mut().enumerate() {
        p.rss_samples = readings
            .iter()
            .filter(|r| r.pid == p.pid)
            .map(|r| (r.t_ms, r.rss))
            .collect();
        // The tracer's reading at its exit ends the line.
        if let Some(t) = traced.get(i).filter(|t| t.pid == p.pid) {
            if let (Some(rss), Some(end)) = (t.final_rss, t.end_ms) {
                if p.rss_samples.last().is_none_or(|&(last, _)| last < end) {
                    p.rss_samples.push((end, rss));
                }
            }
        }
        if p.name.is_empty() {
            p.name = if p.pid == top {
                Path::new(command)
                    .file_name()
                    .unwrap_or(command)
                    .to_string_lossy()
                    .into_owned()
            } else {
                "?".into()
            };
        }
    }
    tree_order(procs, top)
}

/// The pids of the reports and sample files in `work`.
fn pids_with_files(work: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    if let Ok(dir) = std::fs::read_dir(work) {
        for e in dir.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let pid = name
                .strip_prefix("stats.")
                .and_then(|n| n.strip_suffix(".json"))
                .or_else(|| {
                    name.strip_prefix("samples.")
                        .and_then(|n| n.strip_suffix(".txt"))
                })
                .and_then(|n| n.parse::<u32>().ok());
            pids.extend(pid);
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// One process: its library's files, and the tracer's view if any.
fn process(work: &Path, pid: u32, t: Option<&Traced>, start_ms: u64) -> ProcessReport {
    let allocator = read_allocator_report(&work.join(format!("stats.{pid}.json")));
    let samples = read_samples(&work.join(format!("samples.{pid}.txt")), start_ms);
    let sampled_peak = samples.iter().map(|s| s.rss).max();
    let mut p = ProcessReport {
        pid,
        ppid: allocator.as_ref().map_or(0, |a| a.ppid),
        name: allocator
            .as_ref()
            .map(|a| a.comm.clone())
            .unwrap_or_default(),
        peak_rss_bytes: allocator
            .as_ref()
            .map(|a| a.os.vm_hwm)
            .or(sampled_peak)
            .unwrap_or(0),
        final_rss_bytes: allocator.as_ref().map(|a| a.os.vm_rss),
        ending: if allocator.is_some() {
            "report at exit".into()
        } else {
            "no report".into()
        },
        uses_pagewise: (allocator.is_some() || !samples.is_empty()).then_some(true),
        allocator,
        samples,
        ..Default::default()
    };
    if let Some(t) = t {
        join_traced(&mut p, t);
    }
    p.find_peak();
    p
}

/// What the tracer knows, over what the library's files say.
fn join_traced(p: &mut ProcessReport, t: &Traced) {
    p.ppid = t.ppid;
    if !t.comm.is_empty() {
        p.name = t.comm.clone();
    }
    p.command_line = t
        .command
        .iter()
        .map(|w| crate::run::shell_word(w))
        .collect::<Vec<_>>()
        .join(" ");
    if let Some(peak) = t.peak_rss.or(t.maxrss) {
        p.peak_rss_bytes = peak;
    }
    if t.final_rss.is_some() {
        p.final_rss_bytes = t.final_rss;
    }
    p.start_ms = t.start_ms;
    p.end_ms = t.end_ms;
    if t.loaded.is_some() {
        p.uses_pagewise = t.loaded;
    } else if t.static_image {
        p.uses_pagewise = Some(false);
    }
    if let Some(status) = t.status {
        if libc::WIFEXITED(status) {
            p.exit_code = Some(libc::WEXITSTATUS(status));
        } else if libc::WIFSIGNALED(status) {
            p.signal = Some(libc::WTERMSIG(status));
        }
    }
    p.ending = ending(p, t);
}

/// How the process ended, and why it has no report if it has none.
fn ending(p: &ProcessReport, t: &Traced) -> String {
    let how = match (p.exit_code, p.signal) {
        (_, Some(sig)) => format!("killed by {}", signal_name(sig)),
        (Some(code), None) if p.allocator.is_none() && p.uses_pagewise == Some(true) => {
            // Exit handlers write the report: this one ran none.
            return format!("ended by _exit({code}): no report");
        }
        (Some(code), None) => format!("exit {code}"),
        (None, None) => return "still running when pagewise stopped waiting".into(),
    };
    if p.allocator.is_some() || p.uses_pagewise == Some(true) {
        return how;
    }
    let why = if t.static_image {
        "static binary".to_string()
    } else if p.uses_pagewise == Some(false) {
        match &t.exe {
            Some(exe) if crate::elf::is_secure_exec(exe) => "set-user-ID program".into(),
            _ => "LD_PRELOAD did not reach it".into(),
        }
    } else {
        // Killed before its exit could be seen: nothing says more.
        return how;
    };
    format!("{how}; not using pagewise: {why}")
}

/// A process's RSS over time: pagewise run's readings, else its library's
/// samples.
pub fn rss_series(p: &ProcessReport) -> Vec<(u64, u64)> {
    if !p.rss_samples.is_empty() {
        return p.rss_samples.clone();
    }
    p.samples.iter().map(|s| (s.t_ms, s.rss)).collect()
}

/// The sum of `series` over time: at every time any of them has a point,
/// each adds its latest value, from its first point to its last.
pub fn sum_over_time(series: &[Vec<(u64, u64)>]) -> Vec<(u64, u64)> {
    let mut times: Vec<u64> = series.iter().flatten().map(|&(t, _)| t).collect();
    times.sort_unstable();
    times.dedup();
    let mut next = vec![0usize; series.len()];
    times
        .into_iter()
        .map(|t| {
            let mut sum = 0;
            for (s, i) in series.iter().zip(&mut next) {
                while *i < s.len() && s[*i].0 <= t {
                    *i += 1;
                }
                let alive = *i > 0 && s.last().is_some_and(|&(end, _)| t <= end);
                if alive {
                    sum += s[*i - 1].1;
                }
            }
            (t, sum)
        })
        .collect()
}

/// The whole tree's RSS over time (every process's, summed).
pub fn tree_rss(procs: &[ProcessReport]) -> Vec<(u64, u64)> {
    let series: Vec<_> = procs.iter().map(rss_series).collect();
    sum_over_time(&series)
}

/// Tree order: the top first; then, repeatedly, the children of what is
/// placed; then the rest (parents unknown) by pid.
fn tree_order(mut procs: Vec<ProcessReport>, top: u32) -> Vec<ProcessReport> {
    let i = procs.iter().position(|p| p.pid == top).unwrap_or(0);
    let first = procs.remove(i);
    let mut rest = procs;
    rest.sort_by_key(|p| (p.start_ms, p.pid));
    let mut placed = vec![first];
    let mut i = 0;
    while i < placed.len() {
        let parent = placed[i].pid;
        let (kids, others): (Vec<_>, Vec<_>) = rest.into_iter().partition(|p| p.ppid == parent);
        rest = others;
        for (k, kid) in kids.into_iter().enumerate() {
            placed.insert(i + 1 + k, kid);
        }
        i += 1;
    }
    placed.extend(rest);
    placed
}

/// The library's report, or None if there is none (or it is unreadable:
/// a process killed while writing it; said on stderr).
fn read_allocator_report(path: &Path) -> Option<AllocatorReport> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text) {
        Ok(a) => Some(a),
        Err(e) => {
            eprintln!(
                "pagewise: ignoring malformed report {}: {e}",
                path.display()
            );
            None
        }
    }
}

/// Reads the sample lines, with times made relative to `start_ms`: four
/// fields from every library, nine (the breakdown) from current ones.
fn read_samples(path: &Path, start_ms: u64) -> Vec<Sample> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let mut samples: Vec<Sample> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<u64> = l
                .split(' ')
                .map(|x| x.parse().ok())
                .collect::<Option<_>>()?;
            let detailed = f.len() >= 9;
            let at = |i: usize| if detailed { f[i] } else { 0 };
            (f.len() >= 4).then(|| Sample {
                t_ms: f[0].saturating_sub(start_ms),
                rss: f[1],
                live: f[2],
                committed: f[3],
                live_requested: at(4),
                free_slot: at(5),
                retained: at(6),
                metadata: at(7),
                file_rss: at(8),
                detailed,
            })
        })
        .collect();
    // Successive images of one pid append in time order; the exit sample
    // may race the sampler thread's last line.
    samples.sort_by_key(|s| s.t_ms);
    samples
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traced(status: i32) -> Traced {
        Traced {
            pid: 7,
            status: Some(status),
            ..Default::default()
        }
    }

    fn report(t: &Traced, with_report: bool, loaded: Option<bool>) -> String {
        let mut p = ProcessReport {
            allocator: with_report.then(AllocatorReport::default),
            ..Default::default()
        };
        let mut t = t.clone();
        t.loaded = loaded;
        join_traced(&mut p, &t);
        p.ending
    }

    #[test]
    fn says_how_each_process_ended() {
        // Exit statuses as wait(2) encodes them.
        let exit = |code: i32| code << 8;
        assert_eq!(report(&traced(exit(0)), true, Some(true)), "exit 0");
        assert_eq!(
            report(&traced(exit(3)), false, Some(true)),
            "ended by _exit(3): no report"
        );
        assert_eq!(report(&traced(9), false, None), "killed by SIGKILL");
        let mut s = traced(exit(5));
        s.static_image = true;
        assert_eq!(
            report(&s, false, Some(false)),
            "exit 5; not using pagewise: static binary"
        );
        assert_eq!(
            report(&traced(exit(0)), false, Some(false)),
            "exit 0; not using pagewise: LD_PRELOAD did not reach it"
        );
        let mut running = traced(0);
        running.status = None;
        assert!(report(&running, false, Some(true)).contains("still running"));
    }

    #[test]
    fn sums_series_while_each_lasts() {
        let a = vec![(0, 10), (20, 30)];
        let b = vec![(10, 1), (30, 2)];
        // b is not counted before its first point, a not after its last.
        assert_eq!(
            sum_over_time(&[a, b]),
            [(0, 10), (10, 11), (20, 31), (30, 2)]
        );
    }

    #[test]
    fn orders_parents_before_children() {
        let p = |pid, ppid| ProcessReport {
            pid,
            ppid,
            ..Default::default()
        };
        let order: Vec<u32> = tree_order(vec![p(5, 1), p(3, 2), p(2, 0), p(4, 2)], 2)
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(order, [2, 3, 4, 5]);
    }
}
