//! `--plot`: memory over the program's lifetime. For one process, its RSS,
//! committed and live bytes; for a tree, the whole tree's RSS (every
//! process's summed) and live bytes, with a line for each of the processes
//! of highest peak, and a note naming those the live line leaves out.

use crate::report::{human, ProcessReport, RunReport};
use crate::tree::{rss_series, sum_over_time};
use plotters::prelude::*;
use std::path::Path;

/// Processes drawn on lines of their own (the highest peaks).
const LINES: usize = 5;
const MIB: f64 = 1024.0 * 1024.0;

type Series = Vec<(u64, u64)>;

/// Draws `r` as an SVG at `path`.
pub fn draw(r: &RunReport, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let lines = if r.processes.len() > 1 {
        tree_lines(r)
    } else {
        process_lines(r)
    };
    let command = cut(&r.command_line, 72);
    let title = if r.processes.len() > 1 {
        format!(
            "pagewise run, the whole tree ({} processes): {command}",
            r.processes.len()
        )
    } else {
        format!("pagewise run: {command}")
    };
    render(path, &title, &lines, &missing_note(r))
}

/// `text` cut to `n` characters, with `...` at the cut.
fn cut(text: &str, n: usize) -> String {
    if text.chars().count() <= n {
        return text.to_string();
    }
    text.chars().take(n - 3).collect::<String>() + "..."
}

/// One line of the plot.
struct Line {
    label: String,
    color: RGBColor,
    width: u32,
    points: Series,
}

/// The single process: RSS, committed and live bytes.
fn process_lines(r: &RunReport) -> Vec<Line> {
    let pts = &r.samples;
    let field = |f: fn(&crate::report::Sample) -> u64| pts.iter().map(|p| (p.t_ms, f(p))).collect();
    let rss = match r.processes.first() {
        Some(p) if pts.is_empty() => rss_series(p),
        _ => field(|s| s.rss),
    };
    vec![
        line("RSS", RED, 2, rss),
        line("committed", BLUE, 2, field(|s| s.committed)),
        line("live", GREEN, 2, field(|s| s.live)),
    ]
}

fn line(label: &str, color: RGBColor, width: u32, points: Series) -> Line {
    Line {
        label: label.into(),
        color,
        width,
        points,
    }
}

/// The tree: its RSS and live bytes summed, and the processes of highest
/// peak one line each.
fn tree_lines(r: &RunReport) -> Vec<Line> {
    let procs = &r.processes;
    let all: Vec<Series> = procs.iter().map(rss_series).collect();
    let sampling: Vec<&ProcessReport> = procs.iter().filter(|p| !p.samples.is_empty()).collect();
    let live: Vec<Series> = sampling
        .iter()
        .map(|p| p.samples.iter().map(|s| (s.t_ms, s.live)).collect())
        .collect();
    let mut lines = vec![
        line(
            &format!("whole tree: RSS, {} processes summed", procs.len()),
            BLACK,
            3,
            sum_over_time(&all),
        ),
        line(
            &format!(
                "whole tree: live bytes, of the {} pagewise sampled",
                plural(sampling.len(), "process")
            ),
            GREEN,
            3,
            sum_over_time(&live),
        ),
    ];
    let mut big: Vec<(&ProcessReport, Series)> = procs
        .iter()
        .zip(all)
        .filter(|(_, s)| !s.is_empty())
        .collect();
    big.sort_by_key(|(p, _)| std::cmp::Reverse(p.peak_rss_bytes));
    let palette = [RED, BLUE, MAGENTA, CYAN, RGBColor(230, 140, 0)];
    for ((p, s), color) in big.into_iter().take(LINES).zip(palette) {
        let label = format!(
            "{} (pid {}): RSS, peak {}",
            p.name,
            p.pid,
            human(p.peak_rss_bytes)
        );
        lines.push(line(&label, color, 1, s));
    }
    lines
}

/// Which processes the live line leaves out, and why (empty for one
/// process, or if none): by reason, a few named.
fn missing_note(r: &RunReport) -> String {
    if r.processes.len() < 2 {
        return String::new();
    }
    let mut reasons: Vec<(&str, Vec<&ProcessReport>)> = Vec::new();
    for p in r.processes.iter().filter(|p| p.samples.is_empty()) {
        let why = if p.uses_pagewise == Some(false) {
            "not using pagewise"
        } else {
            "forked without exec, or too brief to sample"
        };
        match reasons.iter_mut().find(|(w, _)| *w == why) {
            Some((_, v)) => v.push(p),
            None => reasons.push((why, vec![p])),
        }
    }
    let parts: Vec<String> = reasons
        .iter()
        .map(|(why, v)| {
            let mut named: Vec<String> = v
                .iter()
                .take(3)
                .map(|p| format!("{} {}", p.name, p.pid))
                .collect();
            if v.len() > 3 {
                named.push(format!("{} more", v.len() - 3));
            }
            format!(
                "{} {why} ({})",
                plural(v.len(), "process"),
                named.join(", ")
            )
        })
        .collect();
    if parts.is_empty() {
        return String::new();
    }
    format!("Not in the live line: {}", parts.join("; "))
}

/// `n thing` or `n things`.
fn plural(n: usize, thing: &str) -> String {
    match (n, thing) {
        (1, _) => format!("1 {thing}"),
        (_, "process") => format!("{n} processes"),
        _ => format!("{n} {thing}s"),
    }
}

fn render(
    path: &Path,
    title: &str,
    lines: &[Line],
    note: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let t_max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .max()
        .unwrap_or(0)
        .max(1) as f64
        / 1000.0;
    let y_max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .max()
        .unwrap_or(0) as f64
        / MIB;
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let (chart_area, note_area) = root.split_vertically(510);
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..t_max, 0f64..(y_max * 1.4).max(1.0))?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("MiB")
        .draw()?;
    for l in lines {
        let color = l.color;
        chart
            .draw_series(LineSeries::new(
                l.points
                    .iter()
                    .map(|&(t, v)| (t as f64 / 1000.0, v as f64 / MIB)),
                color.stroke_width(l.width),
            ))?
            .label(l.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    if !note.is_empty() {
        note_area.draw(&Text::new(
            note.to_string(),
            (12, 6),
            ("sans-serif", 13).into_font(),
        ))?;
    }
    root.present()?;
    Ok(())
}
