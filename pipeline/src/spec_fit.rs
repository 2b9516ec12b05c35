//! A feature spec's learned values — the center and width of each scaled dense column, the
//! boundaries of each quantile column — taken from the first records of the training files.
//!
//! Invariants:
//! * The sample is the first [`FIT_LINES`] lines of the files' training span, in their
//!   order: a line belongs to the span when its first byte lies before the span's end
//!   ([`span_bytes`]), as the readers split a file, so lines held out for evaluation by
//!   `--eval-fraction` are never learned from. Each file's
//!   header (its first line, when it is one, as the readers of the data skip it), empty
//!   lines, lines without the spec's columns and values that are no finite numbers are
//!   passed over. Every process and every run on the same files learns the same
//!   values, whatever the worker count, and a resumed run learns what its checkpoint holds.
//! * A line longer than `max_line_bytes` is passed over without being held in memory.
//! * Values the spec gives are kept; the learned ones are recorded in the run's checkpoints
//!   (the manifest's resolved spec), which `predict`, `eval`, `serve` and `export` read.

use crate::PipelineError;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use tiderec_operators::spec::{FeatureSpec, SampleValues};
use tiderec_sources::shuffle::span_bytes;

/// Lines read for the sample.
pub const FIT_LINES: usize = 100_000;

/// Learns what `spec` leaves to learn from the first lines of `paths` within the training
/// `span` of each file (fractions of its bytes, as `--eval-fraction` splits it: `(0, 1)`
/// when nothing is held out); returns a one-line note of what was learned, or `None` when
/// the spec gives everything.
pub fn fit(
    spec: &mut FeatureSpec,
    paths: &[PathBuf],
    span: (f64, f64),
    max_line_bytes: usize,
) -> Result<Option<String>, PipelineError> {
    if spec.unfitted().is_empty() {
        return Ok(None);
    }
    if paths.is_empty() {
        return Err(PipelineError::config(
            "spec",
            format!(
                "{} must be given in the spec: there are no files to learn them from (online records); give \
                 each column's `center` and `width`, or its `boundaries`, e.g. those `tiderec spec check SPEC \
                 --data csv:FILE` prints",
                spec.unfitted().join(", ")
            ),
        ));
    }
    let lines = first_lines(paths, span, FIT_LINES, max_line_bytes)?;
    let sample = spec.sample_values(lines.iter().map(|(first, l)| (*first, l.as_slice())));
    fit_sample(spec, &sample, lines.len()).map(Some)
}

/// [`fit`] on the values of a sample of `lines` lines.
fn fit_sample(spec: &mut FeatureSpec, sample: &SampleValues, lines: usize) -> Result<String, PipelineError> {
    let missing = spec.unfitted();
    spec.fit(sample).map_err(|e| {
        PipelineError::config(
            "spec",
            format!("learning {} from the first {lines} lines of the data: {e}", missing.join(", ")),
        )
    })?;
    Ok(describe(spec, sample.rows))
}

/// Dense values beyond this magnitude after their transforms make training unstable (an
/// unscaled age of 16 to 80 years feeds the first layer inputs 50 times those of a
/// standardized one).
pub const UNSTABLE_MAGNITUDE: f32 = 10.0;

/// For `tiderec spec check --data`: the learned values of `spec` (as [`fit`]) and a warning
/// for each dense column whose values reach [`UNSTABLE_MAGNITUDE`] after all its
/// transforms, over the first lines of `paths`.
pub fn check_ranges(
    spec: &mut FeatureSpec,
    paths: &[PathBuf],
    max_line_bytes: usize,
) -> Result<(Option<String>, Vec<String>), PipelineError> {
    let lines = first_lines(paths, (0.0, 1.0), FIT_LINES, max_line_bytes)?;
    // The sample holds the values before any scale, which fitting does not change.
    let sample = spec.sample_values(lines.iter().map(|(first, l)| (*first, l.as_slice())));
    let learned = match spec.unfitted().is_empty() {
        true => None,
        false => Some(fit_sample(spec, &sample, lines.len())?),
    };
    let mut warnings = Vec::new();
    for (i, (d, values)) in spec.dense.iter().zip(&sample.dense).enumerate() {
        let scaled = values.iter().map(|&v| match d.fitted_scale() {
            Some((center, width)) => tiderec_operators::spec::numeric::scaled(v, center, width),
            None => v,
        });
        let (lo, hi) = scaled.fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
        if lo <= hi && lo.abs().max(hi.abs()) >= UNSTABLE_MAGNITUDE {
            warnings.push(format!(
                "dense[{i}] (`{}`) ranges over [{lo}, {hi}] after its transforms in the first {} records: inputs this \
                 large make training unstable; add `scale = \"standardize\"` or `scale = \"min_max\"` (after \
                 `log1p = true` for a long tail)",
                d.column, sample.rows
            ));
        }
    }
    Ok((learned, warnings))
}

/// The learned values, as a note for the run's log.
fn describe(spec: &FeatureSpec, rows: u64) -> String {
    let dense = spec.dense.iter().filter_map(|d| {
        let (center, width) = d.fitted_scale()?;
        Some(format!("{} center {center} width {width}", d.column))
    });
    let buckets =
        spec.categorical.iter().filter(|c| c.encoding == tiderec_operators::spec::Encoding::Quantile).map(|c| {
            let b = c.boundaries.as_deref().unwrap_or_default();
            format!("{} {} quantile boundaries", c.column, b.len())
        });
    let learned: Vec<String> = dense.chain(buckets).collect();
    format!("spec: learned from {rows} records: {}", learned.join("; "))
}

/// Up to `limit` lines of `paths` in order, without their line ends, each with whether it
/// is its file's first line: the lines starting within `span` of each file's bytes
/// ([`span_bytes`]); longer lines than `max_line_bytes` are skipped.
fn first_lines(
    paths: &[PathBuf],
    span: (f64, f64),
    limit: usize,
    max_line_bytes: usize,
) -> Result<Vec<(bool, Vec<u8>)>, PipelineError> {
    let mut lines = Vec::new();
    for path in paths {
        let io = |e: std::io::Error| PipelineError::config("data", format!("cannot read {}: {e}", path.display()));
        let file = std::fs::File::open(path).map_err(io)?;
        let bytes = span_bytes(file.metadata().map_err(io)?.len(), span);
        let mut reader = BufReader::new(file);
        let mut line = Vec::new();
        let mut first = true;
        // Offset of the next line's first byte.
        let mut at = 0u64;
        while lines.len() < limit && at < bytes.end {
            line.clear();
            let n = reader.by_ref().take(max_line_bytes as u64 + 1).read_until(b'\n', &mut line).map_err(io)?;
            if n == 0 {
                break;
            }
            at += n as u64;
            let ended = line.last() == Some(&b'\n');
            let is_first = std::mem::replace(&mut first, false);
            if !ended && line.len() > max_line_bytes {
                at += reader.skip_until(b'\n').map_err(io)? as u64;
                continue;
            }
            if ended {
                line.pop();
            }
            let kept = if is_first { tiderec_sources::lines::strip_bom(&line) } else { &line };
            lines.push((is_first, kept.to_vec()));
        }
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_is_the_first_lines_and_over_long_ones_are_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.csv"), dir.path().join("b.csv"));
        std::fs::write(&a, format!("1,2\n{}\n3,4", "9".repeat(100))).unwrap();
        std::fs::write(&b, "5,6\r\n7,8\n").unwrap();
        let all = (0.0, 1.0);
        let lines = first_lines(&[a.clone(), b.clone()], all, 10, 50).unwrap();
        let want = [(true, &b"1,2"[..]), (false, b"3,4"), (true, b"5,6\r"), (false, b"7,8")];
        assert_eq!(lines, want.map(|(first, l)| (first, l.to_vec())));
        assert_eq!(first_lines(&[a, b], all, 2, 50).unwrap().len(), 2);
        let e = first_lines(&[dir.path().join("none")], all, 1, 50).unwrap_err().to_string();
        assert!(e.contains("none"), "{e}");
    }

    #[test]
    fn lines_held_out_for_evaluation_are_not_in_the_sample() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.csv");
        // Ten lines of 4 bytes: a span ending at 0.5 holds the lines starting before byte 20.
        let text: String = (0..10).map(|i| format!("{i},{i}\n")).collect();
        std::fs::write(&a, &text).unwrap();
        let lines = first_lines(std::slice::from_ref(&a), (0.0, 0.5), 100, 50).unwrap();
        let got: Vec<&[u8]> = lines.iter().map(|(_, l)| l.as_slice()).collect();
        assert_eq!(got, [&b"0,0"[..], b"1,1", b"2,2", b"3,3", b"4,4"]);
        // A span ending inside a line keeps that line, as the readers do.
        assert_eq!(first_lines(std::slice::from_ref(&a), (0.0, 0.42), 100, 50).unwrap().len(), 5);
        // An over-long line counts its bytes too.
        std::fs::write(&a, format!("{}\n1,1\n2,2\n", "9".repeat(60))).unwrap();
        let lines = first_lines(std::slice::from_ref(&a), (0.0, 0.9), 100, 50).unwrap();
        assert_eq!(lines, [(false, b"1,1".to_vec())]);
    }
}
