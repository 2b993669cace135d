//! SVG charts (plotters, SVG backend only).

use crate::report::Summary;
use crate::runner::{Plan, RunRecord};
use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use std::path::Path;

/// Workloads whose RSS-over-time chart is drawn.
const TIMELINES: &[&str] = &[
    "phases",
    "block-cohorts",
    "arena-on-malloc",
    "threads",
    "arena-churn",
    "idle-threads-exit",
    "idle-handoff",
    "idle-thread-rounds",
    "big-buffers",
];

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotters: {e:?}")
}

/// Writes every chart; returns how many files were written.
pub(crate) fn write_all(
    dir: &Path,
    plan: &Plan,
    records: &[RunRecord],
    s: &Summary,
) -> Result<usize> {
    std::fs::create_dir_all(dir)?;
    let mut n = 0;
    for w in &plan.workloads {
        throughput(&dir.join(format!("throughput-{w}.svg")), w, plan, s)?;
        n += 1;
        if TIMELINES.contains(&w.as_str()) {
            timeline(&dir.join(format!("rss-{w}.svg")), w, plan, records)?;
            n += 1;
        }
    }
    Ok(n)
}

fn throughput(path: &Path, w: &str, plan: &Plan, s: &Summary) -> Result<()> {
    let labels: Vec<String> = plan.allocs.iter().map(|a| a.label.clone()).collect();
    let stats: Vec<Option<crate::report::Stat>> = labels
        .iter()
        .map(|l| s.cell(w, l).and_then(|c| c.ops_per_s))
        .collect();
    let ymax = stats
        .iter()
        .flatten()
        .map(|x| x.max)
        .fold(0.0f64, f64::max)
        .max(1.0)
        / 1e6
        * 1.15;
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let n = labels.len() as u32;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{w}: throughput (median, min–max)"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d((0u32..n).into_segmented(), 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc("M ops/s")
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                labels.get(*i as usize).cloned().unwrap_or_default()
            }
            SegmentValue::Last => String::new(),
        })
        .draw()
        .map_err(err)?;
    for (i, st) in stats.iter().enumerate() {
        let Some(st) = st else { continue };
        let i = i as u32;
        let color = Palette99::pick(i as usize);
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), st.median / 1e6),
            ],
            color.filled(),
        );
        bar.set_margin(0, 0, 18, 18);
        chart.draw_series(std::iter::once(bar)).map_err(err)?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![
                    (SegmentValue::CenterOf(i), st.min / 1e6),
                    (SegmentValue::CenterOf(i), st.max / 1e6),
                ],
                BLACK.stroke_width(2),
            )))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

fn timeline(path: &Path, w: &str, plan: &Plan, records: &[RunRecord]) -> Result<()> {
    // The first successful run of each allocator.
    let series: Vec<(String, Vec<(f64, f64)>)> = plan
        .allocs
        .iter()
        .filter_map(|a| {
            let r = records
                .iter()
                .filter(|r| r.workload == w && r.allocator == a.label)
                .find_map(|r| r.result.as_ref())?;
            let pts = r
                .samples
                .iter()
                .filter(|(ms, _)| *ms >= r.start_ms)
                .map(|(ms, rss)| {
                    (
                        (ms - r.start_ms) / 1e3,
                        rss.saturating_sub(r.baseline_rss) as f64 / (1024.0 * 1024.0),
                    )
                })
                .collect();
            Some((a.label.clone(), pts))
        })
        .collect();
    let xmax = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.0))
        .fold(0.0f64, f64::max)
        .max(0.01);
    let ymax = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.1))
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.1;
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{w}: RSS over time (net of baseline; first run, then its idle period)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the workload started")
        .y_desc("RSS, MiB")
        .draw()
        .map_err(err)?;
    for (i, (label, pts)) in series.into_iter().enumerate() {
        let color = Palette99::pick(i);
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
