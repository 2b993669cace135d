//! The published figures (the summary table of docs/benchmarks.md, from
//! one full run, whose pagewise column the README shows) and whether a run is comparable with them: a `--quick` run, fewer
//! runs, a shorter idle period or other allocators give ratios that can
//! differ widely, and the report says so.

use crate::runner::Plan;
use crate::workloads::Scale;

/// The published run's settings: `pagewise bench` with no flags.
pub const RUNS: usize = 5;
/// Its idle period (the default with jemalloc among the allocators).
pub const IDLE_MS: u64 = 12_000;
/// Where the figures are published, as the report names it.
pub const WHERE: &str = "docs/benchmarks.md's summary, one full run";

/// The published summary table (markdown, as in docs/benchmarks.md).
const TABLE: &str = include_str!("published.md");

/// The published ratios: (workload, figure, allocator) to ratio.
pub struct Published {
    /// The allocators, in the table's order.
    pub allocs: Vec<String>,
    rows: Vec<(String, String, Vec<Option<f64>>)>,
}

impl Published {
    /// The table compiled into this program.
    pub fn get() -> Published {
        Published::parse(TABLE)
    }

    /// Reads a summary table (`| workload | figure | alloc… |`), ignoring
    /// every other line.
    pub fn parse(text: &str) -> Published {
        let mut allocs = Vec::new();
        let mut rows = Vec::new();
        for line in text.lines().filter(|l| l.starts_with('|')) {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            if cells.len() < 3 || cells[0].starts_with('-') {
                continue;
            }
            if cells[0] == "workload" {
                allocs = cells[2..].iter().map(|s| s.to_string()).collect();
                continue;
            }
            let values = cells[2..].iter().map(|v| v.parse().ok()).collect();
            rows.push((cells[0].to_string(), cells[1].to_string(), values));
        }
        Published { allocs, rows }
    }

    /// The published ratio of `alloc` for `figure` of `workload`.
    pub fn ratio(&self, workload: &str, figure: &str, alloc: &str) -> Option<f64> {
        let col = self.allocs.iter().position(|a| a == alloc)?;
        let (_, _, values) = self
            .rows
            .iter()
            .find(|(w, f, _)| w == workload && f == figure)?;
        *values.get(col)?
    }

    /// Every row, as (workload, figure, values).
    #[cfg(test)]
    pub fn rows(&self) -> impl Iterator<Item = (&str, &str, &[Option<f64>])> {
        self.rows
            .iter()
            .map(|(w, f, v)| (w.as_str(), f.as_str(), v.as_slice()))
    }
}

/// How `plan` differs from the published run (empty: comparable).
pub fn differences(plan: &Plan, published: &Published) -> Vec<String> {
    let mut d = Vec::new();
    if plan.scale != Scale::Full {
        d.push(format!(
            "its workloads are {} ({}), not full size",
            plan.scale.name(),
            if plan.scale == Scale::Quick {
                "--quick"
            } else {
                "--scale"
            }
        ));
    }
    if plan.reps != RUNS {
        d.push(format!("{} run(s) per allocator, not {RUNS}", plan.reps));
    }
    if plan.idle_ms != IDLE_MS || !plan.idle_all {
        let which = if plan.idle_all {
            "every workload"
        } else {
            "the idle workloads only"
        };
        d.push(format!(
            "an idle period of {} ms in {which}, not {} s in every workload",
            plan.idle_ms,
            IDLE_MS / 1000
        ));
    }
    let labels: Vec<&str> = plan.allocs.iter().map(|a| a.label.as_str()).collect();
    if labels
        != published
            .allocs
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    {
        d.push(format!(
            "other allocators ({}; a ratio is to the best of the others)",
            labels.join(", ")
        ));
    }
    d
}

/// Whether `own` is far enough from `published` to say so: more than
/// 1.5 times apart (either way), ratios under 0.1 apart aside.
pub fn far(own: f64, published: f64) -> bool {
    let (lo, hi) = if own < published {
        (own, published)
    } else {
        (published, own)
    };
    hi - lo >= 0.1 && (lo <= 0.0 || hi / lo > 1.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_compiled_table() {
        let p = Published::get();
        assert_eq!(p.allocs[0], "pagewise");
        assert_eq!(p.ratio("block-cohorts", "ops/s", "pagewise"), Some(0.82));
        assert_eq!(p.ratio("block-cohorts", "ops/s", "hoard"), None);
        assert!(p.rows().count() >= 40);
    }

    /// The figures the bench compares with are the ones users read: the
    /// README's summary table (or, if the README has none, the first one
    /// of docs/benchmarks.md) row for row.
    #[test]
    fn the_compiled_table_is_the_published_one() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let published = ["README.md", "docs/benchmarks.md"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(root.join(f)).ok())
            .map(|text| Published::parse(&first_summary_table(&text)))
            .find(|p| !p.allocs.is_empty())
            .expect("a summary table in README.md or docs/benchmarks.md");
        let ours = Published::get();
        assert_eq!(ours.allocs, published.allocs);
        let rows = |p: &Published| -> Vec<String> { p.rows().map(|r| format!("{r:?}")).collect() };
        assert_eq!(
            rows(&ours),
            rows(&published),
            "crates/pagewise-bench/src/published.md must be the published summary table"
        );
    }

    /// The README's short table (`| `workload` | what it models | ops/s |
    /// peak RSS | RSS after idle |`) shows pagewise's published ratios.
    #[test]
    fn the_readmes_short_table_shows_pagewises_published_ratios() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let p = Published::get();
        let mut rows = 0;
        for line in readme.lines().filter(|l| l.starts_with("| `")) {
            let c: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let workload = c[0].trim_matches('`');
            if p.ratio(workload, "ops/s", "pagewise").is_none() {
                continue; // a table of something else
            }
            for (cell, figure) in c[2..].iter().zip(["ops/s", "peak RSS", "RSS after idle"]) {
                assert_eq!(
                    cell.parse::<f64>().ok(),
                    p.ratio(workload, figure, "pagewise"),
                    "README, {workload} {figure}"
                );
            }
            rows += 1;
        }
        let workloads = p.rows().filter(|(_, f, _)| *f == "ops/s").count();
        assert_eq!(
            rows, workloads,
            "every workload of the summary in the README"
        );
    }

    /// The lines of the first table whose header starts `| workload | figure`.
    fn first_summary_table(text: &str) -> String {
        let is_head = |l: &str| {
            let c: Vec<&str> = l.split('|').map(str::trim).collect();
            c.len() > 3 && c[1] == "workload" && c[2] == "figure"
        };
        text.lines()
            .skip_while(|l| !is_head(l))
            .take_while(|l| l.starts_with('|'))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn far_means_half_again_apart() {
        assert!(far(0.26, 0.82));
        assert!(!far(0.9, 1.1));
        assert!(!far(0.01, 0.07), "both tiny");
        assert!(far(3.0, 1.0));
    }
}
