//! Medians, tables and the JSON file.

use crate::runner::{Plan, RunRecord};
use crate::util::PAGE;
use crate::worker::{Syscalls, WorkerResult};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

/// Median, min, max and upper quartile of one figure over the runs.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Upper quartile (nearest rank). On a workload whose runs fall into a
    /// fast and a slow mode for reasons outside the allocator (the 2-thread
    /// server on 2 CPUs, when the scheduler puts both threads on one CPU for
    /// a while), it tracks the fast mode where the median jumps between them.
    pub p75: f64,
}

impl Stat {
    fn of(mut v: Vec<f64>) -> Option<Stat> {
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Stat {
            median,
            min: v[0],
            max: v[n - 1],
            p75: v[(3 * n).div_ceil(4) - 1],
        })
    }
}

/// Medians of one sub-part.
#[derive(Clone, Debug, Serialize)]
pub struct PartSummary {
    pub name: String,
    pub ops_per_s: Stat,
    pub rss_net: Option<f64>,
    pub live_bytes: Option<f64>,
    pub floor: Option<f64>,
    pub utilization: Option<f64>,
    /// Peak RSS during the part, net of the worker's baseline (parts that
    /// measured it).
    pub peak_rss_net: Option<f64>,
    /// Medians of the part's named figures.
    pub figures: Vec<(String, f64)>,
}

/// Medians of one (workload, allocator) pair. RSS figures are net of the
/// worker's RSS before the workload.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub workload: String,
    pub allocator: String,
    pub runs_ok: usize,
    pub errors: Vec<String>,
    pub ops_per_s: Option<Stat>,
    pub ns_per_op: Option<f64>,
    pub peak_rss_net: Option<Stat>,
    pub rss_after_free_net: Option<Stat>,
    pub rss_idle_net: Option<Stat>,
    /// Memory the process costs the machine after the idle period, net of
    /// its start (`util::memory_of`: PSS, memfd files by their blocks).
    #[serde(default)]
    pub memory_idle_net: Option<Stat>,
    pub live_bytes: Option<f64>,
    /// live / net RSS right after the frees.
    pub utilization_after_free: Option<f64>,
    /// live / net RSS after the idle period.
    pub utilization_idle: Option<f64>,
    /// live / net memory after the idle period (`memory_idle_net`: a page
    /// shared by meshing counts once, touched or not).
    pub utilization_idle_pss: Option<f64>,
    /// live / (pages holding a live byte × page size).
    pub page_floor: Option<f64>,
    pub syscalls: Option<Syscalls>,
    pub syscall_source: String,
    pub minor_faults: Option<f64>,
    pub parts: Vec<PartSummary>,
    pub extra: Vec<(String, f64)>,
}

/// Everything derived from the runs.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub cells: Vec<Cell>,
}

impl Summary {
    pub fn cell(&self, workload: &str, alloc: &str) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.workload == workload && c.allocator == alloc)
    }
}

fn net(v: u64, base: u64) -> f64 {
    v.saturating_sub(base) as f64
}

fn med(v: impl Iterator<Item = f64>) -> Option<f64> {
    Stat::of(v.collect()).map(|s| s.median)
}

fn ratio(live: f64, rss: f64) -> Option<f64> {
    (live > 0.0 && rss > 0.0).then(|| live / rss)
}

pub(crate) fn summarize(plan: &Plan, records: &[RunRecord]) -> Summary {
    let mut cells = Vec::new();
    for w in &plan.workloads {
        for a in &plan.allocs {
            let runs: Vec<&RunRecord> = records
                .iter()
                .filter(|r| &r.workload == w && r.allocator == a.label)
                .collect();
            if runs.is_empty() {
                // Not run: an allocator-independent workload runs under one
                // allocator only.
                continue;
            }
            let ok: Vec<&WorkerResult> = runs.iter().filter_map(|r| r.result.as_ref()).collect();
            let errors: Vec<String> = runs.iter().filter_map(|r| r.error.clone()).collect();
            let per =
                |f: &dyn Fn(&WorkerResult) -> f64| Stat::of(ok.iter().map(|r| f(r)).collect());
            let ops = per(&|r| r.ops as f64 / (r.elapsed_ns as f64 / 1e9));
            let ns_per_op = med(ok.iter().map(|r| r.elapsed_ns as f64 / r.ops.max(1) as f64));
            let peak = per(&|r| net(r.peak_rss, r.baseline_rss));
            let after = per(&|r| net(r.rss_after_free, r.baseline_rss));
            // Only runs that waited the idle period say anything about it.
            let idled: Vec<&WorkerResult> = ok
                .iter()
                .copied()
                .filter(|r| r.idle_ms as f64 >= plan.idle_ms as f64 * 0.9)
                .collect();
            let idle = Stat::of(
                idled
                    .iter()
                    .map(|r| net(r.rss_idle, r.baseline_rss))
                    .collect(),
            );
            let memory_idle = Stat::of(
                idled
                    .iter()
                    .filter_map(|r| Some(net(r.pss_idle?, r.pss_baseline?)))
                    .collect(),
            );
            let live = med(ok.iter().map(|r| r.live_bytes as f64));
            let util_after = med(ok
                .iter()
                .filter_map(|r| ratio(r.live_bytes as f64, net(r.rss_after_free, r.baseline_rss))));
            let util_idle = med(idled
                .iter()
                .filter_map(|r| ratio(r.live_bytes as f64, net(r.rss_idle, r.baseline_rss))));
            let util_idle_pss = med(idled.iter().filter_map(|r| {
                let (base, idle) = (r.pss_baseline?, r.pss_idle?);
                ratio(r.live_bytes as f64, net(idle, base))
            }));
            let floor = med(ok.iter().filter_map(|r| {
                r.floor_pages
                    .map(|p| r.live_bytes as f64 / (p as f64 * PAGE as f64))
            }));
            let syscalls = if ok.iter().all(|r| r.syscalls.is_some()) && !ok.is_empty() {
                let m = |f: &dyn Fn(&Syscalls) -> u64| {
                    med(ok.iter().map(|r| f(&r.syscalls.expect("checked")) as f64)).unwrap_or(0.0)
                        as u64
                };
                Some(Syscalls {
                    mmap: m(&|s| s.mmap),
                    munmap: m(&|s| s.munmap),
                    madvise: m(&|s| s.madvise),
                })
            } else {
                None
            };
            let syscall_source = ok
                .first()
                .map(|r| r.syscall_source.clone())
                .unwrap_or_default();
            let minor = med(ok.iter().map(|r| r.minor_faults as f64));
            let mut parts = Vec::new();
            if let Some(first) = ok.first() {
                for (i, p) in first.parts.iter().enumerate() {
                    let ps: Vec<(&WorkerResult, &crate::workloads::Part)> = ok
                        .iter()
                        .filter_map(|r| r.parts.get(i).map(|p| (*r, p)))
                        .collect();
                    let ops_per_s = Stat::of(
                        ps.iter()
                            .map(|(_, p)| p.ops as f64 / (p.ns.max(1) as f64 / 1e9))
                            .collect(),
                    )
                    .unwrap_or_default();
                    let rss_net = med(ps
                        .iter()
                        .filter_map(|(r, p)| p.rss.map(|x| net(x, r.baseline_rss))));
                    let live_bytes = med(ps
                        .iter()
                        .filter_map(|(_, p)| p.live_bytes.map(|x| x as f64)));
                    let floor = med(ps.iter().filter_map(|(_, p)| {
                        Some(p.live_bytes? as f64 / (p.floor_pages? as f64 * PAGE as f64))
                    }));
                    let utilization = med(ps.iter().filter_map(|(r, p)| {
                        ratio(p.live_bytes? as f64, net(p.rss?, r.baseline_rss))
                    }));
                    let peak_rss_net = med(ps
                        .iter()
                        .filter_map(|(r, p)| p.peak_rss.map(|x| net(x, r.baseline_rss))));
                    let figures = p
                        .figures
                        .iter()
                        .filter_map(|(k, _)| {
                            med(ps.iter().filter_map(|(_, p)| {
                                p.figures.iter().find(|(kk, _)| kk == k).map(|(_, v)| *v)
                            }))
                            .map(|v| (k.clone(), v))
                        })
                        .collect();
                    parts.push(PartSummary {
                        name: p.name.clone(),
                        ops_per_s,
                        rss_net,
                        live_bytes,
                        floor,
                        utilization,
                        peak_rss_net,
                        figures,
                    });
                }
            }
            // Every figure any run reported (some only after the idle
            // period: redis's fragmentation), in first-seen order, each the
            // median of the runs that reported it.
            let mut keys: Vec<&String> = Vec::new();
            for (k, _) in ok.iter().flat_map(|r| r.extra.iter()) {
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
            let mut extra = Vec::new();
            for k in keys {
                let v = med(ok
                    .iter()
                    .filter_map(|r| r.extra.iter().find(|(kk, _)| kk == k).map(|(_, v)| *v)));
                if let Some(v) = v {
                    extra.push((k.clone(), v));
                }
            }
            cells.push(Cell {
                workload: w.clone(),
                allocator: a.label.clone(),
                runs_ok: ok.len(),
                errors,
                ops_per_s: ops,
                ns_per_op,
                peak_rss_net: peak,
                rss_after_free_net: after,
                rss_idle_net: idle,
                memory_idle_net: memory_idle,
                live_bytes: live,
                utilization_after_free: util_after,
                utilization_idle: util_idle,
                utilization_idle_pss: util_idle_pss,
                page_floor: floor,
                syscalls,
                syscall_source,
                minor_faults: minor,
                parts,
                extra,
            });
        }
    }
    Summary { cells }
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

/// A markdown table with aligned columns.
fn table(out: &mut String, head: &[&str], rows: &[Vec<String>]) {
    let n = head.len();
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |out: &mut String, cells: &[String]| {
        out.push('|');
        for (i, c) in cells.iter().enumerate() {
            let pad = w[i] - c.chars().count();
            if i == 0 {
                let _ = write!(out, " {c}{} |", " ".repeat(pad));
            } else {
                let _ = write!(out, " {}{c} |", " ".repeat(pad));
            }
        }
        out.push('\n');
    };
    line(out, &head.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    out.push('|');
    for (i, wi) in w.iter().enumerate() {
        if i == 0 {
            let _ = write!(out, "{}|", "-".repeat(wi + 2));
        } else {
            let _ = write!(out, "{}:|", "-".repeat(wi + 1));
        }
    }
    out.push('\n');
    for r in rows {
        line(out, r);
    }
}

fn idle_label(ms: u64) -> String {
    if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

pub(crate) fn machine() -> (usize, String, String) {
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    (nproc, cpu, kernel)
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

pub(crate) fn render(plan: &Plan, s: &Summary, wall: Duration) -> String {
    let mut out = String::new();
    let (nproc, cpu, kernel) = machine();
    let _ = writeln!(
        out,
        "pagewise bench: scale {}, {} run(s) per allocator and workload, {:.0} s; {nproc} CPUs, {cpu}, Linux {kernel}",
        plan.scale.name(),
        plan.reps,
        wall.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "RSS is net of the worker's RSS before the workload; idle = {}; util = live / RSS, and live / memory (what the process costs the machine: PSS with memfd files by their blocks; RSS misses a meshed page until it is touched); floor = live / (pages holding a live byte × 4 KiB).",
        idle_label(plan.idle_ms)
    );
    out.push_str(&idle_rules(plan));
    for w in &plan.workloads {
        let _ = writeln!(out, "\n## {w}: {}\n", crate::workloads::describe(w));
        if crate::workloads::allocator_independent(w) {
            let ran: Vec<&str> = plan
                .allocs_for(w)
                .into_iter()
                .map(|i| plan.allocs[i].label.as_str())
                .collect();
            let _ = writeln!(
                out,
                "Allocator-independent: the pools map their own pages and the figures are their accounting, so this runs once, under {}; the other allocators' columns would repeat the same figures.\n",
                ran.join(", ")
            );
        }
        let mut rows = Vec::new();
        for a in &plan.allocs {
            let Some(c) = s.cell(w, &a.label) else {
                continue;
            };
            let Some(ops) = c.ops_per_s else {
                rows.push(vec![
                    a.label.clone(),
                    format!("FAILED: {}", c.errors.first().cloned().unwrap_or_default()),
                ]);
                continue;
            };
            let sys = match c.syscalls {
                Some(x) => format!("{}/{}/{}", count(x.mmap), count(x.munmap), count(x.madvise)),
                None => "n/a".into(),
            };
            let failed = if c.errors.is_empty() {
                String::new()
            } else {
                format!(" ({} failed)", c.errors.len())
            };
            rows.push(vec![
                format!("{}{failed}", a.label),
                rate(ops.median),
                format!("{}–{}", short(ops.min), short(ops.max)),
                format!("{:.1}", c.ns_per_op.unwrap_or(0.0)),
                mib(c.peak_rss_net.map(|x| x.median).unwrap_or(0.0)),
                mib(c.rss_after_free_net.map(|x| x.median).unwrap_or(0.0)),
                c.rss_idle_net
                    .map(|x| mib(x.median))
                    .unwrap_or_else(|| "—".into()),
                c.memory_idle_net
                    .map(|x| mib(x.median))
                    .unwrap_or_else(|| "—".into()),
                c.live_bytes
                    .filter(|&l| l > 0.0)
                    .map(mib)
                    .unwrap_or_else(|| "0".into()),
                format!(
                    "{} / {} / {}",
                    pct(c.utilization_after_free),
                    pct(c.utilization_idle),
                    pct(c.utilization_idle_pss)
                ),
                pct(c.page_floor),
                sys,
                short(c.minor_faults.unwrap_or(0.0)),
            ]);
        }
        let idle_head = format!("RSS +{} idle", idle_label(plan.idle_ms));
        table(
            &mut out,
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
                "minor faults",
            ],
            &rows,
        );
        // Sub-parts.
        let cells: Vec<&Cell> = plan
            .allocs
            .iter()
            .filter_map(|a| s.cell(w, &a.label))
            .collect();
        let with_peak = cells
            .iter()
            .any(|c| c.parts.iter().any(|p| p.peak_rss_net.is_some()));
        let mut prow = Vec::new();
        for c in &cells {
            for p in &c.parts {
                let mut row = vec![
                    c.allocator.clone(),
                    p.name.clone(),
                    rate(p.ops_per_s.median),
                    rate(p.ops_per_s.p75),
                    format!("{:.1}", 1e9 / p.ops_per_s.median.max(1e-9)),
                ];
                if with_peak {
                    row.push(p.peak_rss_net.map(mib).unwrap_or_else(|| "—".into()));
                }
                row.extend([
                    p.rss_net.map(mib).unwrap_or_else(|| "—".into()),
                    p.live_bytes.map(mib).unwrap_or_else(|| "—".into()),
                    pct(p.utilization),
                    pct(p.floor),
                ]);
                prow.push(row);
            }
            for (k, v) in &c.extra {
                let mut row = vec![c.allocator.clone(), k.clone(), extra_figure(*v)];
                row.resize(if with_peak { 10 } else { 9 }, String::new());
                prow.push(row);
            }
        }
        if prow.len() > cells.len() {
            out.push('\n');
            let mut head = vec!["allocator", "part", "ops/s", "ops/s p75", "ns/op"];
            if with_peak {
                head.push("peak RSS");
            }
            head.extend(["RSS at end", "live", "util", "floor"]);
            table(&mut out, &head, &prow);
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
        if !names.is_empty() {
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
            table(&mut out, &head, &frows);
        }
    }
    // Summary: each allocator against the best *other* allocator.
    let _ = writeln!(
        out,
        "\n## Summary: ratio to the best other allocator\n\nops/s: own / fastest other (> 1: faster than every other). RSS and memory: own / leanest other (< 1: leaner than every other); under 1 MiB counts as 1 MiB, so tiny footprints do not make huge ratios. Memory is what the process costs the machine: its proportional set size with memfd files counted by their blocks (RSS misses a page meshing remapped until it is touched again). Allocator-independent workloads ({}) are left out.\n",
        crate::workloads::ALLOCATOR_INDEPENDENT.join(", ")
    );
    let mut head: Vec<String> = vec!["workload".into(), "figure".into()];
    head.extend(plan.allocs.iter().map(|a| a.label.clone()));
    let mut rows = Vec::new();
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
                    (Some(o), Some(b)) if b > 0.0 => format!("{:.2}", o / b),
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
    table(&mut out, &head_ref, &rows);
    let failed: usize = s.cells.iter().map(|c| c.errors.len()).sum();
    if failed > 0 {
        let _ = writeln!(out, "\n{failed} run(s) FAILED:");
        for c in &s.cells {
            for e in &c.errors {
                let _ = writeln!(out, "- {} under {}: {e}", c.workload, c.allocator);
            }
        }
    }
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
    let _ = writeln!(out, "\nsyscall counts: {}", sources.join("; "));
    out
}

#[derive(Serialize)]
struct JsonOut<'a> {
    version: u32,
    command: Vec<String>,
    machine: JsonMachine,
    scale: &'static str,
    runs_per: usize,
    idle_ms: u64,
    /// How many runs (the first ones) waited the idle period, and whether
    /// every workload did (false: only the idle-focused ones, --quick).
    idle_runs: usize,
    idle_all: bool,
    /// Each allocator's rule for free memory, as the report prints it.
    purge_rules: Vec<(String, Option<crate::delays::PurgeRule>)>,
    wall_s: f64,
    allocators: &'a [crate::runner::AllocSpec],
    workloads: &'a [String],
    /// Workloads run under one allocator only, and which.
    allocator_independent: Vec<(String, String)>,
    runs: &'a [RunRecord],
    summary: &'a Summary,
}

#[derive(Serialize)]
struct JsonMachine {
    nproc: usize,
    cpu: String,
    kernel: String,
}

pub(crate) fn write_json(
    path: &Path,
    plan: &Plan,
    records: &[RunRecord],
    s: &Summary,
    wall: Duration,
) -> anyhow::Result<()> {
    let (nproc, cpu, kernel) = machine();
    let out = JsonOut {
        version: 1,
        command: std::env::args().collect(),
        machine: JsonMachine { nproc, cpu, kernel },
        scale: plan.scale.name(),
        runs_per: plan.reps,
        idle_ms: plan.idle_ms,
        idle_runs: plan.idle_runs,
        idle_all: plan.idle_all,
        purge_rules: plan
            .allocs
            .iter()
            .map(|a| (a.label.clone(), crate::delays::purge_rule(a)))
            .collect(),
        wall_s: wall.as_secs_f64(),
        allocators: &plan.allocs,
        workloads: &plan.workloads,
        allocator_independent: plan
            .workloads
            .iter()
            .filter(|w| crate::workloads::allocator_independent(w))
            .flat_map(|w| {
                plan.allocs_for(w)
                    .into_iter()
                    .map(move |i| (w.clone(), plan.allocs[i].label.clone()))
            })
            .collect(),
        runs: records,
        summary: s,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let f = std::io::BufWriter::new(std::fs::File::create(path)?);
    serde_json::to_writer_pretty(f, &out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Stat;

    #[test]
    fn stat_gives_median_extremes_and_upper_quartile() {
        let s = Stat::of(vec![4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.p75), (2.5, 1.0, 4.0, 3.0));
        let s = Stat::of(vec![5.0, 1.0, 4.0, 2.0, 3.0]).unwrap();
        assert_eq!((s.median, s.p75), (3.0, 4.0));
        // A bimodal series: the quartile stays in the fast mode.
        let s = Stat::of(vec![100.0, 250.0, 255.0, 104.0, 260.0, 101.0, 258.0]).unwrap();
        assert_eq!((s.median, s.p75), (250.0, 258.0));
        assert_eq!(Stat::of(vec![7.0]).unwrap().p75, 7.0);
        assert!(Stat::of(vec![]).is_none());
    }
}
