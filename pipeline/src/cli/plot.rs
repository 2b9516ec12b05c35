//! `tiderec plot`: the curves of a run's JSON-lines metrics log, drawn to a
//! PNG: training loss, the window's log loss and NE in one panel, its AUC,
//! PR-AUC and GAUC in the other (a figure the log never holds is left out).
//!
//! Text is drawn with a TrueType font found on the system (DejaVu Sans or
//! Liberation Sans, the Debian defaults); without one, the curves are drawn
//! without labels and a warning says so.

use plotters::prelude::*;
use std::path::Path;
use std::sync::OnceLock;
use tiderec::metrics_log::{read_log, MetricsRecord};
use tiderec::PipelineError;

const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Registers a system font for plotters' "sans-serif" once; false when none was found.
fn register_font() -> bool {
    static FOUND: OnceLock<bool> = OnceLock::new();
    *FOUND.get_or_init(|| {
        for path in FONT_PATHS {
            if let Ok(bytes) = std::fs::read(path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

fn draw_error(out: &Path, e: impl std::fmt::Display) -> PipelineError {
    PipelineError::config("out", format!("cannot draw {}: {e}", out.display()))
}

/// Draws the curves of `metrics` (a `--metrics-log` file) to `out`; returns the number of reports.
pub fn plot_metrics(metrics: &Path, out: &Path) -> Result<usize, PipelineError> {
    let records = read_log(metrics)?;
    if records.is_empty() {
        return Err(PipelineError::config("metrics", format!("{} holds no reports", metrics.display())));
    }
    let text = register_font();
    if !text {
        eprintln!("warning: no TrueType font found ({}); drawing without labels", FONT_PATHS.join(", "));
    }
    let root = BitMapBackend::new(out, (1000, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_error(out, e))?;
    let (upper, lower) = root.split_vertically(350);
    let samples = |r: &MetricsRecord| r.samples as f64;
    let x_max = records.iter().map(samples).fold(1.0, f64::max);
    type Series<'a> = (&'a str, Vec<(f64, f64)>, RGBColor);
    let curve = |figure: fn(&MetricsRecord) -> Option<f64>| -> Vec<(f64, f64)> {
        records.iter().filter_map(|r| Some((samples(r), figure(r)?))).collect()
    };
    let panels: [(&str, Vec<Series>); 2] = [
        (
            "loss",
            vec![
                ("train loss", records.iter().map(|r| (samples(r), r.loss)).collect(), BLUE),
                ("window logloss", curve(|r| r.window_logloss), RED),
                ("window NE", curve(|r| r.window_ne), MAGENTA),
            ],
        ),
        (
            "ranking",
            vec![
                ("window AUC", curve(|r| r.window_auc), GREEN),
                ("window PR-AUC", curve(|r| r.window_pr_auc), CYAN),
                ("window GAUC", curve(|r| r.window_gauc), BLACK),
            ],
        ),
    ];
    for (area, (name, series)) in [upper, lower].iter().zip(panels) {
        let series: Vec<Series> = series.into_iter().filter(|s| !s.1.is_empty()).collect();
        let points = series.iter().flat_map(|s| s.1.iter().map(|p| p.1)).filter(|v| v.is_finite());
        let (lo, hi) = points.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
        let (lo, hi) = if lo.is_finite() { (lo, hi.max(lo + 1e-6)) } else { (0.0, 1.0) };
        let pad = (hi - lo) * 0.05;
        let mut builder = ChartBuilder::on(area);
        builder.margin(12).x_label_area_size(if text { 36 } else { 0 }).y_label_area_size(if text { 60 } else { 0 });
        if text {
            builder.caption(name, ("sans-serif", 20));
        }
        let mut chart =
            builder.build_cartesian_2d(0.0..x_max, (lo - pad)..(hi + pad)).map_err(|e| draw_error(out, e))?;
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc("samples").label_style(("sans-serif", 14));
        } else {
            mesh.disable_x_axis().disable_y_axis();
        }
        mesh.draw().map_err(|e| draw_error(out, e))?;
        for (label, points, color) in series {
            let drawn =
                chart.draw_series(LineSeries::new(points, color.stroke_width(2))).map_err(|e| draw_error(out, e))?;
            if text {
                drawn.label(label).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            }
        }
        if text {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .label_font(("sans-serif", 14))
                .draw()
                .map_err(|e| draw_error(out, e))?;
        }
    }
    root.present().map_err(|e| draw_error(out, e))?;
    Ok(records.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiderec::metrics_log::MetricsLog;

    #[test]
    fn draws_a_png_from_a_log() {
        let dir = tempfile::tempdir().unwrap();
        let log_path = dir.path().join("m.jsonl");
        let mut log = MetricsLog::create(&log_path, false).unwrap();
        for i in 0..20u64 {
            let r = MetricsRecord {
                step: i,
                samples: i * 128,
                loss: 0.7 - i as f64 * 0.01,
                window_auc: (i > 0).then_some(0.6 + i as f64 * 0.01),
                window_logloss: Some(0.69 - i as f64 * 0.005),
                window_ne: Some(0.95 - i as f64 * 0.005),
                window_pr_auc: (i > 0).then_some(0.3 + i as f64 * 0.01),
                ..Default::default()
            };
            log.write(&r).unwrap();
        }
        let out = dir.path().join("curves.png");
        assert_eq!(plot_metrics(&log_path, &out).unwrap(), 20);
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 5_000, "{} bytes", bytes.len());
        let empty = dir.path().join("empty.jsonl");
        std::fs::write(&empty, "").unwrap();
        assert!(plot_metrics(&empty, &out).unwrap_err().to_string().contains("holds no reports"));
    }
}
