//! What a spec learns from its training data: the center and width of each scaled dense
//! column and the boundaries of each quantile column, from the values of a sample of lines
//! ([`SampleValues`]).
//!
//! Invariants: fitting fills only what [`FeatureSpec::unfitted`] names and keeps the values
//! given; the same sample gives the same spec; a fitted spec is validated again.

use super::validate::one_byte;
use super::{numeric, Encoding, FeatureSpec};
use crate::features::split::for_each_token;
use crate::OperatorError;

/// What a spec learns from its training data: scales and quantile boundaries.
impl FeatureSpec {
    /// The keys whose values are still to be learned (`dense[0].center`,
    /// `categorical[3].boundaries`): a spec with any cannot featurize records.
    pub fn unfitted(&self) -> Vec<String> {
        let dense = self.dense.iter().enumerate().filter(|(_, d)| d.scale.is_some() && d.center.is_none());
        let quantiles = self
            .categorical
            .iter()
            .enumerate()
            .filter(|(_, c)| c.encoding == Encoding::Quantile && c.boundaries.is_none());
        dense
            .map(|(i, _)| format!("dense[{i}].center"))
            .chain(quantiles.map(|(i, _)| format!("categorical[{i}].boundaries")))
            .collect()
    }

    /// The values of every dense column, after its clamp and `log1p` (before any scale), and
    /// of every categorical column, read as numbers, in the lines given, each with whether
    /// it is its file's first line: what fitting learns from. A line without exactly the
    /// spec's columns, a value that is not a finite number and a file's first line when it
    /// is the header ([`FeatureSpec::is_header`]) are passed over, as the readers of the
    /// data pass them over; any other line is a record, whatever it starts with.
    pub fn sample_values<'a>(&self, lines: impl IntoIterator<Item = (bool, &'a [u8])>) -> SampleValues {
        let delimiter = self.delimiter_byte();
        let index = |c: &str| self.columns.iter().position(|x| x == c);
        let dense: Vec<Option<usize>> = self.dense.iter().map(|d| index(&d.column)).collect();
        let categorical: Vec<Option<usize>> = self.categorical.iter().map(|c| index(&c.column)).collect();
        let mut out = SampleValues {
            rows: 0,
            dense: vec![Vec::new(); dense.len()],
            categorical: vec![Vec::new(); categorical.len()],
        };
        let n = self.columns.len();
        let mut fields: Vec<&[u8]> = Vec::with_capacity(n);
        for (first, line) in lines {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() || (first && self.is_header(line)) {
                continue;
            }
            fields.clear();
            for_each_token(line, delimiter, n + 1, |t| fields.push(t));
            if fields.len() != n {
                continue;
            }
            out.rows += 1;
            for ((d, col), values) in self.dense.iter().zip(&dense).zip(&mut out.dense) {
                values.extend(col.and_then(|col| d.unscaled(fields[col]).ok()).filter(|v| v.is_finite()));
            }
            for (col, values) in categorical.iter().zip(&mut out.categorical) {
                values.extend(col.and_then(|col| numeric::finite_number(fields[col])));
            }
        }
        out
    }

    /// Learns what [`Self::unfitted`] names from `sample` (of [`Self::sample_values`]):
    /// each scale's center and width, each quantile column's boundaries. Keys already
    /// given are kept. Errors name a key with no finite value to learn from.
    pub fn fit(&mut self, sample: &SampleValues) -> Result<(), OperatorError> {
        for (i, d) in self.dense.iter_mut().enumerate() {
            if let (Some(scale), None) = (d.scale, d.center) {
                let (center, width) = numeric::fit_scale(scale, &sample.dense[i]).ok_or_else(|| {
                    OperatorError::config(
                        format!("dense[{i}].center"),
                        format!("column `{}` has no number in the sample", d.column),
                    )
                })?;
                (d.center, d.width) = (Some(center), Some(width));
            }
        }
        for (i, c) in self.categorical.iter_mut().enumerate() {
            if c.encoding == Encoding::Quantile && c.boundaries.is_none() {
                if sample.categorical[i].is_empty() {
                    return Err(OperatorError::config(
                        format!("categorical[{i}].boundaries"),
                        format!("column `{}` has no number in the sample", c.column),
                    ));
                }
                c.boundaries = Some(numeric::quantile_boundaries(&sample.categorical[i], c.buckets));
            }
        }
        self.validate()
    }

    /// The delimiter as one byte (`\t` written as two characters is a tab).
    fn delimiter_byte(&self) -> u8 {
        one_byte("delimiter", &self.delimiter).unwrap_or(b'\t')
    }
}

/// Values of a sample of records, per column, as [`FeatureSpec::sample_values`] reads them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampleValues {
    /// Records read.
    pub rows: u64,
    /// Each dense column's values after clamp and `log1p`.
    pub dense: Vec<Vec<f32>>,
    /// Each categorical column's values that are finite numbers.
    pub categorical: Vec<Vec<f32>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bad_record::BadReason;
    use crate::format::LineFormat;
    use crate::spec::fixtures::NUMERIC;
    use crate::spec::SpecFormat;

    #[test]
    fn scales_and_buckets_are_learned_from_a_sample_and_applied_as_computed_by_hand() {
        let mut spec = FeatureSpec::from_toml(NUMERIC).unwrap();
        assert_eq!(spec.unfitted(), ["dense[0].center", "dense[1].center", "categorical[0].boundaries"]);
        let e = SpecFormat::new(spec.clone(), 1).unwrap_err().to_string();
        assert!(e.contains("dense[0].center") && e.contains("learned from the training data"), "{e}");
        let lines = ["y,age,price,hour", "0,20,0,1", "1,30,e,7", "0,40,3,13", "1,50,7,23", "0,bad,1,", "too,few"];
        let sample = spec.sample_values(lines.iter().enumerate().map(|(i, l)| (i == 0, l.as_bytes())));
        assert_eq!(sample.rows, 5, "the header and the short line are passed over");
        assert_eq!(sample.dense[0], [20.0, 30.0, 40.0, 50.0], "`bad` is no number");
        spec.fit(&sample).unwrap();
        assert!(spec.unfitted().is_empty());
        // age: mean 35, population std sqrt(125); price: ln(1 + p) over 0, ln 4, ln 8, ln 2 (e is no number).
        assert_eq!((spec.dense[0].center, spec.dense[0].width), (Some(35.0), Some(125f64.sqrt() as f32)));
        assert_eq!((spec.dense[1].center, spec.dense[1].width), (Some(0.0), Some(8f32.ln())));
        assert_eq!((spec.dense[2].center, spec.dense[2].width), (Some(0.0), Some(24.0)), "given values are kept");
        assert_eq!(spec.categorical[0].boundaries, Some(vec![30.0, 40.0, 50.0]), "quartiles of 20, 30, 40, 50");
        // The fitted spec round-trips through TOML (as the checkpoint records it).
        assert_eq!(FeatureSpec::from_toml(&spec.to_toml()).unwrap(), spec);
        let format = SpecFormat::new(spec, 1).unwrap();
        let mut b = format.empty_batch();
        format.parse(b"1,45,3,18", &mut b).unwrap();
        let want = [(45.0 - 35.0) / 125f64.sqrt() as f32, 4f32.ln() / 8f32.ln(), 18.0 / 24.0];
        assert_eq!(b.dense, want);
        assert_eq!(b.sparse[0].bag(0), [2], "45 is at or above 30 and 40");
        assert_eq!(b.sparse[1].bag(0), [3], "18 is at or above every boundary");
        format.parse(b"0,10,0,", &mut b).unwrap();
        assert_eq!(b.sparse[0].bag(1), [0]);
        assert!(b.sparse[1].bag(1).is_empty(), "an empty value is absent");
        assert_eq!(format.parse(b"0,10,0,x", &mut b), Err((BadReason::BadInteger, Some(3))));
        assert_eq!(
            format.parse(b"0,10,0,inf", &mut b),
            Err((BadReason::NonFinite, Some(3))),
            "the dense hour sees it first"
        );
    }

    /// With `header = true` only a file's first line can be its header: a record whose
    /// first value starts with the first column's name (`id_0001` under `id`) is sampled.
    #[test]
    fn only_a_files_first_line_is_its_header() {
        let text = NUMERIC.replace("[\"y\", \"age\"", "[\"a\", \"y\", \"age\"");
        let mut spec = FeatureSpec::from_toml(&text).unwrap();
        let files = [
            ["a,y,age,price,hour", "a1,0,20,1,1", "a2,1,40,1,1"],
            ["b3,0,60,1,1", "a,y,age,price,hour", "a4,1,80,1,1"],
        ];
        let lines = files.iter().flat_map(|f| f.iter().enumerate().map(|(i, l)| (i == 0, l.as_bytes())));
        let sample = spec.sample_values(lines);
        assert_eq!(sample.rows, 5, "the first file's header is passed over; the other lines are records");
        assert_eq!(sample.dense[0], [20.0, 40.0, 60.0, 80.0], "the header inside a file is no number");
        spec.fit(&sample).unwrap();
        assert_eq!(spec.dense[0].center, Some(50.0));
    }
}
