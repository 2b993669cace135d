//! `--plot`: RSS, committed and live bytes over the program's lifetime.

use crate::report::RunReport;
use plotters::prelude::*;
use std::path::Path;

/// Draws the samples of `r` as an SVG at `path`.
pub fn draw(r: &RunReport, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    const MIB: f64 = 1024.0 * 1024.0;
    let pts = &r.samples;
    let t_max = pts.iter().map(|p| p.t_ms).max().unwrap_or(0).max(1) as f64 / 1000.0;
    let y_max = pts
        .iter()
        .map(|p| p.rss.max(p.live).max(p.committed))
        .max()
        .unwrap_or(0) as f64
        / MIB;
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("pagewise run: {}", r.command_line),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..t_max, 0f64..(y_max * 1.3).max(1.0))?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("MiB")
        .draw()?;
    type Field = fn(&crate::report::Sample) -> u64;
    let series: [(&str, RGBColor, Field); 3] = [
        ("RSS", RED, |s| s.rss),
        ("committed", BLUE, |s| s.committed),
        ("live", GREEN, |s| s.live),
    ];
    for (name, color, get) in series {
        chart
            .draw_series(LineSeries::new(
                pts.iter()
                    .map(|p| (p.t_ms as f64 / 1000.0, get(p) as f64 / MIB)),
                color.stroke_width(2),
            ))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
