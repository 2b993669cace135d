//! The text report of `pagewise bench`: the summary first (each
//! allocator's ratio to the best of the others, and whether the run is
//! comparable with the published figures), then a section per workload.
//! Every line fits [`WIDTH`] characters unless `--wide` asks for every
//! column; the JSON file has every figure of every run.

use crate::published::{self, Published};
use crate::report::{machine, Cell, Summary};
use crate::runner::Plan;
use crate::text::{table, wrap, WIDTH};
use std::fmt::Write as _;
use std::time::Duration;

/// The report. `wide`: every column of the per-workload tables, whatever
/// their width.
pub(crate) fn render(plan: &Plan, s: &Summary, wall: Duration, wide: bool) -> String {
    let width = (!wide).then_some(WIDTH);
    let mut out = String::new();
    let (nproc, cpu, kernel) = machine();
    para(
        &mut out,
        &format!(
            "pagewise bench: scale {}, {} run(s) per allocator and workload, {:.0} s; {nproc} CPUs, {cpu}, Linux {kernel}",
            plan.scale.name(),
            plan.reps,
            wall.as_secs_f64()
        ),
    );
    let published = Published::get();
    summary(&mut out, plan, s, &published, width);
    failures(&mut out, s);
    details(&mut out, plan, s, wide, width);
    let sources: Vec<String> = plan
        .allocs
        .iter()
        .filter_map(|a| {
            s.cells
                .iter()
                .find(|c| c.allocator == a.label && !c.syscall_source.is_empty())
                .map(|c| format!("{}: {}", a.label, c.syscall_source))
        })
        .collect();
    out.push('\n');
    para(
        &mut out,
        &format!("How system calls are counted: {}", sources.join("; ")),
    );
    out
}

/// A paragraph wrapped to the report's width.
fn para(out: &mut String, text: &str) {
    out.push_str(&wrap(text.trim_end_matches('\n'), WIDTH));
    out.push('\n');
}

/// The summary: ratios to the best other allocator, marked where far from
/// the published ones, and whether this run can be compared with them.
fn summary(
    out: &mut String,
    plan: &Plan,
    s: &Summary,
    published: &Published,
    width: Option<usize>,
) {
    out.push_str("\n## Summary: ratio to the best other allocator\n\n");
    para(
        out,
        &format!(
            "ops/s: own / fastest other (> 1: faster than every other). RSS and memory: own / leanest other (< 1: leaner than every other); under 1 MiB counts as 1 MiB, so tiny footprints do not make huge ratios. Memory is what the process costs the machine: its proportional set size with memfd files counted by their blocks (RSS misses a page meshing remapped until it is touched again). Allocator-independent workloads ({}) are left out.",
            crate::workloads::ALLOCATOR_INDEPENDENT.join(", ")
        ),
    );
    let differs = published::differences(plan, published);
    out.push('\n');
    if differs.is_empty() {
        para(
            out,
            &format!(
                "Same settings as the published figures ({}): a ratio marked * is more than 1.5 times away from the published one (this machine or this build differs).",
                published::WHERE
            ),
        );
    } else {
        para(
            out,
            &format!(
                "NOT COMPARABLE with the published figures ({}, `pagewise bench` with no flags): {}. Its ratios can differ widely from the published ones (marked *: more than 1.5 times away); run `pagewise bench` without flags to compare.",
                published::WHERE,
                differs.join("; ")
            ),
        );
    }
    out.push('\n');
    let mut head: Vec<String> = vec!["workload".into(), "figure".into()];
    head.extend(plan.allocs.iter().map(|a| a.label.clone()));
    let mut rows = Vec::new();
    let mut far: Vec<String> = Vec::new();
    const MIB: f64 = 1024.0 * 1024.0;
    type Getter = fn(&Cell) -> Option<f64>;
    let figures: [(&str, Getter, bool); 4] = [
        ("ops/s", |c| c.ops_per_s.map(|x| x.median), true),
        (
            "peak RSS",
            |c| c.peak_rss_net.map(|x| x.median.max(MIB)),
            false,
        ),
        (
            "RSS after idle",
            |c| c.rss_idle_net.map(|x| x.median.max(MIB)),
            false,
        ),
        (
            "memory after idle",
            |c| c.memory_idle_net.map(|x| x.median.max(MIB)),
            false,
        ),
    ];
    for w in plan
        .workloads
        .iter()
        .filter(|w| !crate::workloads::allocator_independent(w))
    {
        for (fig, f, best_high) in figures {
            if fig.ends_with("after idle") && !plan.idles(w) {
                continue;
            }
            let mut row = vec![w.clone(), fig.to_string()];
            for a in &plan.allocs {
                let own = s.cell(w, &a.label).and_then(f);
                let others = plan
                    .allocs
                    .iter()
                    .filter(|b| b.label != a.label)
                    .filter_map(|b| s.cell(w, &b.label).and_then(f));
                let best = if best_high {
                    others.fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
                } else {
                    others.fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))))
                };
                row.push(match (own, best) {
                    (Some(o), Some(b)) if b > 0.0 => {
                        let r = o / b;
                        match published.ratio(w, fig, &a.label) {
                            Some(p) if published::far(r, p) => {
                                far.push(format!(
                                    "{w} {fig} of {}: {r:.2} here, {p:.2} published",
                                    a.label
                                ));
                                format!("{r:.2}*")
                            }
                            _ => format!("{r:.2}"),
                        }
                    }
                    (Some(_), _) => "—".into(),
                    // Ran, but without this figure (no idle run succeeded).
                    (None, _) if s.cell(w, &a.label).is_some_and(|c| c.runs_ok > 0) => "—".into(),
                    // Not run: the workload cannot run under it (redis
                    // under glibc).
                    (None, _) if s.cell(w, &a.label).is_none() => "n/a".into(),
                    _ => "fail".into(),
                });
            }
            rows.push(row);
        }
    }
    let head_ref: Vec<&str> = head.iter().map(|s| s.as_str()).collect();
    table(out, &head_ref, &rows, 2, width);
    if !far.is_empty() {
        out.push('\n');
        let shown = far.len().min(3);
        para(
            out,
            &format!(
                "* {} figure(s) more than 1.5 times away from the published ratio{}, for example {}.",
                far.len(),
                if differs.is_empty() { "" } else { " (not comparable: see above)" },
                far[..shown].join("; ")
            ),
        );
    }
}

/// The runs that failed, each with its error.
fn failures(out: &mut String, s: &Summary) {
    let failed: usize = s.cells.iter().map(|c| c.errors.len()).sum();
    if failed == 0 {
        return;
    }
    let _ = writeln!(out, "\n{failed} run(s) FAILED:");
    for c in &s.cells {
        for e in &c.errors {
            para(out, &format!("- {} under {}: {e}", c.workload, c.allocator));
        }
    }
}

/// A section per workload: its figures per allocator, its parts, its
/// named figures.
fn details(out: &mut String, plan: &Plan, s: &Summary, wide: bool, width: Option<usize>) {
    let idle = idle_label(plan.idle_ms);
    out.push_str("\n## Each workload\n\n");
    let columns = if wide {
        format!("Medians of the runs. RSS figures are net of the worker's RSS before the workload. min–max: of ops/s. RSS +{idle} idle: RSS after the idle period. memory after idle: what the process costs the machine then (PSS, memfd files by their blocks). live: bytes still allocated. util: live / RSS after the frees, after the idle period, and of memory after it. floor: live / (pages holding a live byte × 4 KiB). mmap/munmap/madvise: calls during the workload, the idle period NOT counted; idle syscalls: the calls made during the idle period (runs that waited it). minor faults: the idle period included.")
    } else {
        format!("Medians of the runs. RSS figures are net of the worker's RSS before the workload. after idle: RSS {idle} after the last free (runs that waited the idle period). live: bytes still allocated. util: live / RSS after idle. syscalls: mmap/munmap/madvise calls during the workload; the idle period is NOT counted (--wide shows its calls apart). faults: minor page faults, the idle period included. --wide adds min–max, ns/op, memory after idle, the other utilizations and the page floor; --json has every run.")
    };
    para(out, &columns);
    out.push('\n');
    para(out, &idle_rules(plan));
    for w in &plan.workloads {
        out.push('\n');
        para(out, &format!("### {w}: {}", crate::workloads::describe(w)));
        out.push('\n');
        if crate::workloads::allocator_independent(w) {
            let ran: Vec<&str> = plan
                .allocs_for(w)
                .into_iter()
                .map(|i| plan.allocs[i].label.as_str())
                .collect();
            para(
                out,
                &format!(
                    "Allocator-independent: the pools map their own pages and the figures are their accounting, so this runs once, under {}; the other allocators' columns would repeat the same figures.",
                    ran.join(", ")
                ),
            );
            out.push('\n');
        }
        main_table(out, plan, s, w, wide, width);
        parts_tables(out, plan, s, w, wide, width);
    }
}

/// `a/b/c` of a workload's or idle period's system calls.
fn calls(x: Option<crate::worker::Syscalls>) -> String {
    match x {
        Some(x) => format!("{}/{}/{}", count(x.mmap), count(x.munmap), count(x.madvise)),
        None => "n/a".into(),
    }
}

/// One line per allocator: speed, RSS, live bytes, system calls.
fn main_table(
    out: &mut String,
    plan: &Plan,
    s: &Summary,
    w: &str,
    wide: bool,
    width: Option<usize>,
) {
    let mut rows = Vec::new();
    for a in &plan.allocs {
        let Some(c) = s.cell(w, &a.label) else {
            continue;
        };
        let Some(ops) = c.ops_per_s else {
            rows.push(vec![a.label.clone(), "FAILED (see above)".into()]);
            continue;
        };
        let failed = if c.errors.is_empty() {
            String::new()
        } else {
            format!(" ({} failed)", c.errors.len())
        };
        let stat =
            |x: Option<crate::report::Stat>| x.map(|x| mib(x.median)).unwrap_or_else(|| "—".into());
        let live = c
            .live_bytes
            .filter(|&l| l > 0.0)
            .map(mib)
            .unwrap_or_else(|| "0".into());
        let sys = calls(c.syscalls_workload);
        let faults = short(c.minor_faults.unwrap_or(0.0));
        rows.push(if wide {
            vec![
                format!("{}{failed}", a.label),
                rate(ops.median),
                format!("{}–{}", short(ops.min), short(ops.max)),
                format!("{:.1}", c.ns_per_op.unwrap_or(0.0)),
                stat(c.peak_rss_net),
                stat(c.rss_after_free_net),
                stat(c.rss_idle_net),
                stat(c.memory_idle_net),
                live,
                format!(
                    "{} / {} / {}",
                    pct(c.utilization_after_free),
                    pct(c.utilization_idle),
                    pct(c.utilization_idle_pss)
                ),
                pct(c.page_floor),
                sys,
                calls(c.syscalls_idle),
                faults,
            ]
        } else {
            vec![
                format!("{}{failed}", a.label),
                rate(ops.median),
                stat(c.peak_rss_net),
                stat(c.rss_after_free_net),
                stat(c.rss_idle_net),
                live,
                pct(c.utilization_idle),
                sys,
                faults,
            ]
        });
    }
    if wide {
        let idle_head = format!("RSS +{} idle", idle_label(plan.idle_ms));
        table(
            out,
            &[
                "allocator",
                "ops/s",
                "min–max",
                "ns/op",
                "peak RSS",
                "RSS after frees",
                &idle_head,
                "memory after idle",
                "live",
                "util (after / idle / idle memory)",
                "floor",
                "mmap/munmap/madvise",
                "idle syscalls",
                "minor faults",
            ],
            &rows,
            1,
            width,
        );
    } else {
        table(
            out,
            &[
                "allocator",
                "ops/s",
                "peak RSS",
                "after frees",
                "after idle",
                "live",
                "util",
                "syscalls",
                "faults",
            ],
            &rows,
            1,
            width,
        );
    }
}

/// The workload's parts (and extra figures), then their named figures.
fn parts_tables(
    out: &mut String,
    plan: &Plan,
    s: &Summary,
    w: &str,
    wide: bool,
    width: Option<usize>,
) {
    let cells: Vec<&Cell> = plan
        .allocs
        .iter()
        .filter_map(|a| s.cell(w, &a.label))
        .collect();
    let with_peak = cells
        .iter()
        .any(|c| c.parts.iter().any(|p| p.peak_rss_net.is_some()));
    let mut head = vec!["allocator", "part", "ops/s"];
    if wide {
        head.extend(["ops/s p75", "ns/op"]);
    }
    if with_peak {
        head.push("peak RSS");
    }
    head.extend(["RSS at end", "live", "util"]);
    if wide {
        head.push("floor");
    }
    let mut prow = Vec::new();
    for c in &cells {
        for p in &c.parts {
            let mut row = vec![
                c.allocator.clone(),
                p.name.clone(),
                rate(p.ops_per_s.median),
            ];
            if wide {
                row.push(rate(p.ops_per_s.p75));
                row.push(format!("{:.1}", 1e9 / p.ops_per_s.median.max(1e-9)));
            }
            if with_peak {
                row.push(p.peak_rss_net.map(mib).unwrap_or_else(|| "—".into()));
            }
            row.extend([
                p.rss_net.map(mib).unwrap_or_else(|| "—".into()),
                p.live_bytes.map(mib).unwrap_or_else(|| "—".into()),
                pct(p.utilization),
            ]);
            if wide {
                row.push(pct(p.floor));
            }
            prow.push(row);
        }
        for (k, v) in &c.extra {
            prow.push(vec![c.allocator.clone(), k.clone(), extra_figure(*v)]);
        }
    }
    if prow.len() > cells.len() {
        out.push('\n');
        table(out, &head, &prow, 2, width);
    }
    // Named figures of the parts, one column per figure.
    let mut names: Vec<&str> = Vec::new();
    for c in &cells {
        for p in &c.parts {
            for (k, _) in &p.figures {
                if !names.contains(&k.as_str()) {
                    names.push(k);
                }
            }
        }
    }
    if names.is_empty() {
        return;
    }
    let mut frows = Vec::new();
    for c in &cells {
        for p in c.parts.iter().filter(|p| !p.figures.is_empty()) {
            let mut row = vec![c.allocator.clone(), p.name.clone()];
            for n in &names {
                row.push(
                    p.figures
                        .iter()
                        .find(|(k, _)| k == n)
                        .map(|(_, v)| figure(n, *v))
                        .unwrap_or_else(|| "—".into()),
                );
            }
            frows.push(row);
        }
    }
    let mut head = vec!["allocator", "part"];
    head.extend(names.iter().copied());
    out.push('\n');
    table(out, &head, &frows, 2, width);
}

fn rate(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2} G/s", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M/s", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k/s", v / 1e3)
    } else {
        format!("{v:.0} /s")
    }
}

fn short(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// An extra figure: small ones (ratios) with two decimals.
fn extra_figure(v: f64) -> String {
    if v.abs() < 100.0 && v.fract() != 0.0 {
        format!("{v:.2}")
    } else {
        short(v)
    }
}

fn mib(v: f64) -> String {
    format!("{:.1} MiB", v / (1024.0 * 1024.0))
}

fn pct(v: Option<f64>) -> String {
    v.map(|x| format!("{:.0}%", x * 100.0))
        .unwrap_or_else(|| "—".into())
}

fn count(v: u64) -> String {
    short(v as f64)
}

/// A part figure: factors to 3 decimals, MiB to 1, counts and bytes exact
/// (digits grouped by three, as in the docs).
fn figure(name: &str, v: f64) -> String {
    if name == "factor" {
        return format!("{v:.3}");
    }
    if name.ends_with("MiB") {
        return format!("{v:.1}");
    }
    let digits = format!("{}", v.round() as i64);
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 && ch.is_ascii_digit() {
            out.push(' ');
        }
        out.push(ch);
    }
    out
}

fn idle_label(ms: u64) -> String {
    if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

/// Which runs waited the idle period, and what each allocator does with
/// free memory meanwhile: an idle figure means little without both.
fn idle_rules(plan: &Plan) -> String {
    let mut out = String::new();
    if plan.idle_ms == 0 {
        out.push_str(
            "No idle period (--idle-ms 0): \"RSS after idle\" is read right after the frees.\n",
        );
        return out;
    }
    let which = if plan.idle_all {
        "every workload"
    } else {
        "the idle workloads only (--quick)"
    };
    let _ = writeln!(
        out,
        "Idle period: {} after the workload's last free, waited by the first {} run(s) of {which}, the process calling no allocator meanwhile; the idle column and util are from those runs, the other columns medians of all runs. Each allocator's own rule for free memory (default settings):",
        idle_label(plan.idle_ms),
        plan.idle_runs
    );
    for a in &plan.allocs {
        let Some(r) = crate::delays::purge_rule(a) else {
            let _ = writeln!(out, "- {}: not known (a library given by path)", a.label);
            continue;
        };
        let late = match r.delay_ms {
            Some(d) if d >= plan.idle_ms => {
                format!(
                    " LONGER than this idle period ({}): its idle figure is not final.",
                    idle_label(d)
                )
            }
            _ => String::new(),
        };
        let _ = writeln!(out, "- {}: {} [{}]{late}", a.label, r.rule, r.source);
    }
    out
}
