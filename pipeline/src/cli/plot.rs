//! `tiderec plot`: the curves of a run's JSON-lines metrics log, drawn to a
//! PNG against training samples: training loss with the evaluation's (`train`) or
//! the prequential window's (`online`) log loss and NE; its AUC, PR-AUC and GAUC;
//! the throughput; and, online, the lag. A train log's evaluations are marked, its
//! epoch boundaries drawn grey and its best evaluation green. A figure the log never
//! holds is left out.
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

/// One curve: its legend, its points `(samples, value)`, its colour, and whether each
/// point is marked (evaluations).
struct Series {
    label: String,
    points: Vec<(f64, f64)>,
    color: RGBColor,
    marked: bool,
}

/// One panel: its title, what its y axis measures (with units), its curves.
struct Panel {
    title: &'static str,
    y_desc: &'static str,
    series: Vec<Series>,
}

/// What a metrics log draws, before any drawing: the panels, the samples at which each
/// epoch after the first begins (`train`), and the best evaluation's samples and label.
struct Figure {
    panels: Vec<Panel>,
    epoch_starts: Vec<f64>,
    best: Option<(f64, String)>,
}

/// The figure of `records`. A `train` log (its records carry epochs) names its figures
/// `eval` and marks each evaluation, the epoch boundaries and the best evaluation; an
/// `online` log names them `window` and adds a panel of the lag. Curves the log never
/// holds are left out.
fn figure(records: &[MetricsRecord]) -> Figure {
    let train = records.iter().any(|r| r.epoch.is_some());
    let samples = |r: &MetricsRecord| r.samples as f64;
    // The first report after each evaluation holds its figures (a train log); every report
    // holds the window's (an online log).
    let fresh: Vec<&MetricsRecord> = match train {
        true => {
            let mut seen = None;
            records
                .iter()
                .filter(|r| {
                    r.evaluated_step.is_some() && std::mem::replace(&mut seen, r.evaluated_step) != r.evaluated_step
                })
                .collect()
        }
        false => records.iter().collect(),
    };
    let name = if train { "eval" } else { "window" };
    let series = |label: &str, figure: fn(&MetricsRecord) -> Option<f64>, color: RGBColor| Series {
        label: format!("{name} {label}"),
        points: fresh.iter().filter_map(|r| Some((samples(r), figure(r)?))).collect(),
        color,
        marked: train,
    };
    let every = |label: &str, figure: fn(&MetricsRecord) -> f64, color: RGBColor| Series {
        label: label.to_string(),
        points: records.iter().map(|r| (samples(r), figure(r))).collect(),
        color,
        marked: false,
    };
    let mut panels = vec![
        Panel {
            title: "loss",
            y_desc: "log loss (nats); NE (ratio)",
            series: vec![
                every("train loss", |r| r.loss, BLUE),
                series("logloss", |r| r.window_logloss, RED),
                series("NE", |r| r.window_ne, MAGENTA),
            ],
        },
        Panel {
            title: "ranking",
            y_desc: "area under the curve",
            series: vec![
                series("AUC", |r| r.window_auc, GREEN),
                series("PR-AUC", |r| r.window_pr_auc, CYAN),
                series("GAUC", |r| r.window_gauc, BLACK),
            ],
        },
        Panel {
            title: "throughput",
            y_desc: "samples / s",
            series: vec![every("training samples / s", |r| r.samples_per_sec, BLUE)],
        },
    ];
    if !train {
        panels.push(Panel {
            title: "lag",
            y_desc: "records behind",
            series: vec![every("records behind the partitions' ends", |r| r.lag as f64, RED)],
        });
    }
    for panel in &mut panels {
        panel.series.retain(|s| !s.points.is_empty());
    }
    let epoch_starts = records
        .windows(2)
        .filter(|w| matches!((w[0].epoch, w[1].epoch), (Some(a), Some(b)) if b > a))
        .map(|w| samples(&w[1]))
        .collect();
    let best_step = records.last().and_then(|r| r.best_step);
    let best = best_step.and_then(|step| {
        let r = fresh.iter().find(|r| r.evaluated_step == Some(step))?;
        let auc = r.window_auc.map_or(String::new(), |a| format!(", AUC {a:.4}"));
        Some((samples(r), format!("best: step {step}{auc}")))
    });
    Figure { panels, epoch_starts, best }
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
    let fig = figure(&records);
    let height = 300 * fig.panels.len() as u32;
    let root = BitMapBackend::new(out, (1000, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_error(out, e))?;
    let x_max = records.iter().map(|r| r.samples as f64).fold(1.0, f64::max);
    for (area, panel) in root.split_evenly((fig.panels.len(), 1)).iter().zip(&fig.panels) {
        draw_panel(area, panel, &fig, x_max, text).map_err(|e| draw_error(out, e))?;
    }
    root.present().map_err(|e| draw_error(out, e))?;
    Ok(records.len())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// One panel: its curves, evaluation marks, epoch boundaries (grey) and the best
/// evaluation (green), with labelled axes when a font was found.
fn draw_panel(area: &Area, panel: &Panel, fig: &Figure, x_max: f64, text: bool) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let points = panel.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).filter(|v| v.is_finite());
    let (lo, hi) = points.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    let (lo, hi) = if lo.is_finite() { (lo, hi.max(lo + 1e-6)) } else { (0.0, 1.0) };
    let (lo, hi) = (lo - (hi - lo) * 0.05, hi + (hi - lo) * 0.05);
    let mut builder = ChartBuilder::on(area);
    builder.margin(12).x_label_area_size(if text { 36 } else { 0 }).y_label_area_size(if text { 80 } else { 0 });
    if text {
        builder.caption(panel.title, ("sans-serif", 20));
    }
    let mut chart = builder.build_cartesian_2d(0.0..x_max, lo..hi).map_err(|x| e(&x))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("training samples")
            .y_desc(panel.y_desc)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| if y.abs() >= 100.0 { format!("{y:.0}") } else { format!("{y:.3}") })
            .label_style(("sans-serif", 14));
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw().map_err(|x| e(&x))?;
    let grey = RGBColor(90, 90, 90);
    let vertical = |x: f64| PathElement::new(vec![(x, lo), (x, hi)], grey.stroke_width(2));
    let drawn = chart.draw_series(fig.epoch_starts.iter().map(|&x| vertical(x))).map_err(|x| e(&x))?;
    if text && !fig.epoch_starts.is_empty() {
        drawn.label("epoch start").legend(move |(x, y)| PathElement::new(vec![(x, y - 6), (x, y + 6)], grey));
    }
    if let Some((x, label)) = &fig.best {
        let drawn = chart
            .draw_series(std::iter::once(PathElement::new(vec![(*x, lo), (*x, hi)], GREEN.stroke_width(1))))
            .map_err(|x| e(&x))?;
        if text {
            drawn.label(label.as_str()).legend(|(x, y)| PathElement::new(vec![(x, y - 6), (x, y + 6)], GREEN));
        }
    }
    for s in &panel.series {
        let color = s.color;
        let drawn = chart.draw_series(LineSeries::new(s.points.clone(), color.stroke_width(2))).map_err(|x| e(&x))?;
        if text {
            drawn.label(s.label.as_str()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        if s.marked {
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(|x| e(&x))?;
        }
    }
    if text {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(|x| e(&x))?;
    }
    Ok(())
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
        // Without epochs the log is an online one: a lag panel below the throughput.
        assert_eq!(figure(&read_log(&log_path).unwrap()).panels.len(), 4);
        let empty = dir.path().join("empty.jsonl");
        std::fs::write(&empty, "").unwrap();
        assert!(plot_metrics(&empty, &out).unwrap_err().to_string().contains("holds no reports"));
    }

    /// A train log: 2 epochs of 10 reports, an evaluation at steps 5, 10 (best) and 15.
    fn train_log() -> Vec<MetricsRecord> {
        (1..=20u64)
            .map(|step| {
                let evaluated = [5, 10, 15].into_iter().rev().find(|&e| e <= step);
                let auc = evaluated.map(|e| if e == 10 { 0.75 } else { 0.7 });
                MetricsRecord {
                    step,
                    samples: step * 100,
                    loss: 0.6,
                    epoch: Some((step - 1) / 10),
                    evaluated_step: evaluated,
                    best_step: evaluated.map(|e| e.min(10)),
                    window_auc: auc,
                    window_logloss: auc.map(|a| 1.0 - a),
                    ..Default::default()
                }
            })
            .collect()
    }

    #[test]
    fn a_train_log_names_evaluations_and_marks_them_the_epochs_and_the_best() {
        let fig = figure(&train_log());
        let titles: Vec<&str> = fig.panels.iter().map(|p| p.title).collect();
        assert_eq!(titles, ["loss", "ranking", "throughput"], "no lag panel in train");
        let labels: Vec<&str> = fig.panels.iter().flat_map(|p| p.series.iter().map(|s| s.label.as_str())).collect();
        assert_eq!(labels, ["train loss", "eval logloss", "eval AUC", "training samples / s"]);
        let auc = &fig.panels[1].series[0];
        assert!(auc.marked);
        assert_eq!(auc.points, [(500.0, 0.7), (1000.0, 0.75), (1500.0, 0.7)], "one point per evaluation");
        assert_eq!(fig.epoch_starts, [1100.0]);
        assert_eq!(fig.best, Some((1000.0, "best: step 10, AUC 0.7500".to_string())));
        assert!(fig.panels.iter().all(|p| !p.y_desc.is_empty()));
        let online: Vec<MetricsRecord> = train_log()
            .into_iter()
            .map(|r| MetricsRecord { epoch: None, evaluated_step: None, best_step: None, ..r })
            .collect();
        let fig = figure(&online);
        assert_eq!(fig.panels[1].series[0].label, "window AUC");
        assert_eq!(fig.panels[1].series[0].points.len(), 16, "every report holds the window");
        assert!(fig.epoch_starts.is_empty() && fig.best.is_none());
        assert_eq!(fig.panels.last().unwrap().y_desc, "records behind");
    }
}
