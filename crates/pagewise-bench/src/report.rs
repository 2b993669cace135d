//! Medians, tables and the JSON file.

use crate::runner::{Plan, RunRecord};
use crate::util::PAGE;
use crate::worker::{Syscalls, WorkerResult};
use serde::Serialize;
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
    /// mmap/munmap/madvise from the workload's start to the end of the
    /// idle period (medians of all runs).
    pub syscalls: Option<Syscalls>,
    /// Those made during the workload, the idle period not counted.
    #[serde(default)]
    pub syscalls_workload: Option<Syscalls>,
    /// Those made during the idle period (runs that waited it).
    #[serde(default)]
    pub syscalls_idle: Option<Syscalls>,
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

/// Medians of each count, if every run has them (and there is a run).
fn median_syscalls(runs: impl Iterator<Item = Option<Syscalls>>) -> Option<Syscalls> {
    let runs: Vec<Syscalls> = runs.collect::<Option<_>>()?;
    if runs.is_empty() {
        return None;
    }
    let m = |f: fn(&Syscalls) -> u64| med(runs.iter().map(|s| f(s) as f64)).unwrap_or(0.0) as u64;
    Some(Syscalls {
        mmap: m(|s| s.mmap),
        munmap: m(|s| s.munmap),
        madvise: m(|s| s.madvise),
    })
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
            let syscalls_workload = median_syscalls(ok.iter().map(|r| r.syscalls_workload));
            let syscalls_idle = median_syscalls(idled.iter().map(|r| {
                let (all, work) = (r.syscalls?, r.syscalls_workload?);
                Some(Syscalls {
                    mmap: all.mmap.saturating_sub(work.mmap),
                    munmap: all.munmap.saturating_sub(work.munmap),
                    madvise: all.madvise.saturating_sub(work.madvise),
                })
            }));
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
                syscalls_workload,
                syscalls_idle,
                syscall_source,
                minor_faults: minor,
                parts,
                extra,
            });
        }
    }
    Summary { cells }
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
