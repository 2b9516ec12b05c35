//! [`FeatureSpec::validate`] and its checks: every key of a spec is checked before any
//! data is read, and an error names the offending key (`dense[2].column`, `list[0].target`, …).
//!
//! Invariants: a valid spec reads only the columns it declares, each declared once by a
//! non-empty name; its delimiters are one byte, decoded by [`delimiter_byte`] alone (so
//! TOML's `"\\t"`, a backslash and a `t`, is a TAB wherever a delimiter is used); its
//! tables have rows; each encoding has exactly the settings it uses; every number it holds
//! is finite (a checkpoint records the spec as JSON, which has no infinity or NaN); its
//! `pooling = "none"` lists share one `max_len`; and it fits the per-line parser's fixed
//! arrays (`MAX_COLUMNS` columns, dense and categorical features each, at most
//! `MAX_SEQUENCES` sequence lists).

use super::sequence::MAX_SEQUENCES;
use super::{numeric, CategoricalSpec, DenseSpec, Encoding, FeatureSpec, ListSpec, Pooling};
use crate::OperatorError;

/// Most columns a spec line may have.
pub(super) const MAX_COLUMNS: usize = 256;

/// The byte a spec's delimiter text stands for: one byte as written, or TAB for `\t`
/// written as two characters, a backslash and a `t` (TOML `"\\t"`, as `tiderec spec show`
/// prints it); `None` for anything else.
/// Every reader of a spec's delimiters (the line, its lists, its numeric lists) decodes
/// them here.
pub fn delimiter_byte(text: &str) -> Option<u8> {
    match text.as_bytes() {
        [b] => Some(*b),
        b"\\t" => Some(b'\t'),
        _ => None,
    }
}

/// [`delimiter_byte`] of `s`; the error names `key`.
pub(super) fn one_byte(key: &str, s: &str) -> Result<u8, OperatorError> {
    delimiter_byte(s).ok_or_else(|| OperatorError::config(key, format!("`{s}` is not a single-byte delimiter")))
}

/// A dense column's clamp: finite bounds (`inf`, `nan` and values beyond `f32` such as
/// `1e39` are refused: a checkpoint records the spec as JSON, which has no infinity), `lo`
/// at most `hi`.
fn check_clamp(i: usize, d: &DenseSpec) -> Result<(), OperatorError> {
    let Some((lo, hi)) = d.clamp else { return Ok(()) };
    let key = format!("dense[{i}].clamp");
    if let Some(b) = [lo, hi].into_iter().find(|b| !b.is_finite()) {
        return Err(OperatorError::config(
            key,
            format!("bound {b} is not a finite number (for no bound on a side, give ±{:e})", f32::MAX),
        ));
    }
    if lo > hi {
        return Err(OperatorError::config(key, format!("{lo} > {hi}")));
    }
    Ok(())
}

/// A dense column's scale: `center` and `width` both or neither, only with `scale`, finite,
/// the width positive.
fn check_scale(i: usize, d: &DenseSpec) -> Result<(), OperatorError> {
    let key = |k: &str| format!("dense[{i}].{k}");
    match (d.scale, d.center, d.width) {
        (None, None, None) | (Some(_), None, None) => Ok(()),
        (None, _, _) => Err(OperatorError::config(key("scale"), "`center` and `width` need `scale`")),
        (Some(_), Some(_), None) => Err(OperatorError::config(key("width"), "`center` is given without `width`")),
        (Some(_), None, Some(_)) => Err(OperatorError::config(key("center"), "`width` is given without `center`")),
        (Some(_), Some(c), Some(w)) => {
            if !c.is_finite() {
                return Err(OperatorError::config(key("center"), format!("{c} is not a finite number")));
            }
            if !(w.is_finite() && w > 0.0) {
                return Err(OperatorError::config(key("width"), format!("{w} is not a finite positive number")));
            }
            Ok(())
        }
    }
}

/// The boundaries of a categorical column: required by `bucketize`, learned or given for
/// `quantile` (fitting in `buckets` rows), refused elsewhere.
fn check_boundaries(i: usize, c: &CategoricalSpec) -> Result<(), OperatorError> {
    let key = format!("categorical[{i}].boundaries");
    match (c.encoding, &c.boundaries) {
        (Encoding::Bucketize, None) => Err(OperatorError::config(key, "`encoding = \"bucketize\"` needs boundaries")),
        (Encoding::Quantile, None) if c.buckets < 2 => {
            Err(OperatorError::config(format!("categorical[{i}].buckets"), "quantile buckets need at least 2 rows"))
        }
        (Encoding::Bucketize | Encoding::Quantile, Some(b)) => {
            numeric::check_boundaries(b).map_err(|why| OperatorError::config(key.clone(), why))?;
            if (b.len() as u64) >= c.buckets {
                return Err(OperatorError::config(
                    format!("categorical[{i}].buckets"),
                    format!("{} rows cannot hold the {} buckets of {} boundaries", c.buckets, b.len() + 1, b.len()),
                ));
            }
            Ok(())
        }
        (_, Some(_)) => Err(OperatorError::config(key, "only `bucketize` and `quantile` encodings have boundaries")),
        _ => Ok(()),
    }
}

impl FeatureSpec {
    /// Checks the spec; errors name the key.
    pub fn validate(&self) -> Result<(), OperatorError> {
        one_byte("delimiter", &self.delimiter)?;
        let mut seen = std::collections::HashSet::new();
        for (i, c) in self.columns.iter().enumerate() {
            // An empty name would match every line as the header and read as a blank in errors.
            if c.is_empty() {
                return Err(OperatorError::config(
                    format!("columns[{i}]"),
                    "a column needs a name (a column no feature reads can have any name, e.g. `unused`)",
                ));
            }
            if !seen.insert(c.as_str()) {
                return Err(OperatorError::config(format!("columns[{i}]"), format!("column `{c}` appears twice")));
            }
        }
        let find = |key: String, c: &str| {
            if seen.contains(c) {
                Ok(())
            } else {
                Err(OperatorError::config(key, format!("no column `{c}` in `columns`")))
            }
        };
        find("label.column".into(), &self.label.column)?;
        if let Some(user) = &self.user {
            find("user".into(), user)?;
        }
        for (i, d) in self.dense.iter().enumerate() {
            find(format!("dense[{i}].column"), &d.column)?;
            check_clamp(i, d)?;
            check_scale(i, d)?;
        }
        for (i, n) in self.numeric_list.iter().enumerate() {
            find(format!("numeric_list[{i}].column"), &n.column)?;
            one_byte(&format!("numeric_list[{i}].delimiter"), &n.delimiter)?;
        }
        for (i, c) in self.categorical.iter().enumerate() {
            find(format!("categorical[{i}].column"), &c.column)?;
            if c.buckets == 0 {
                return Err(OperatorError::config(format!("categorical[{i}].buckets"), "must be positive"));
            }
            check_boundaries(i, c)?;
            let key = format!("categorical[{i}].vocabulary");
            match (c.encoding, &c.vocabulary) {
                (Encoding::Vocabulary, None) => {
                    return Err(OperatorError::config(key, "`encoding = \"vocabulary\"` needs a vocabulary"))
                }
                (Encoding::Vocabulary, Some(v)) => {
                    let n = v.load(&key)?.len() as u64;
                    if c.buckets < n + c.oov_buckets {
                        return Err(OperatorError::config(
                            format!("categorical[{i}].buckets"),
                            format!(
                                "{} rows cannot hold {n} vocabulary ids and {} oov buckets",
                                c.buckets, c.oov_buckets
                            ),
                        ));
                    }
                }
                (_, Some(_)) => {
                    return Err(OperatorError::config(key, "a vocabulary needs `encoding = \"vocabulary\"`"))
                }
                (_, None) if c.oov_buckets != 0 => {
                    return Err(OperatorError::config(
                        format!("categorical[{i}].oov_buckets"),
                        "only vocabulary encoding has oov buckets",
                    ))
                }
                _ => {}
            }
        }
        for (i, l) in self.list.iter().enumerate() {
            find(format!("list[{i}].column"), &l.column)?;
            one_byte(&format!("list[{i}].delimiter"), &l.delimiter)?;
            if l.buckets == 0 {
                return Err(OperatorError::config(format!("list[{i}].buckets"), "must be positive"));
            }
            if l.max_len == 0 {
                return Err(OperatorError::config(format!("list[{i}].max_len"), "must be positive"));
            }
            self.check_target(i, l)?;
        }
        // The per-line parser holds the fields and features of a line in fixed
        // arrays of MAX_COLUMNS entries; a column may feed several features.
        let (num_dense, _) = self.shape();
        for (key, n) in [("columns", self.columns.len()), ("dense", num_dense), ("categorical", self.categorical.len())]
        {
            if n > MAX_COLUMNS {
                return Err(OperatorError::config(key, format!("{n} entries, at most {MAX_COLUMNS}")));
            }
        }
        if let Some((i, _)) = self.sequence_lists().nth(MAX_SEQUENCES) {
            return Err(OperatorError::config(
                format!("list[{i}].pooling"),
                format!("at most {MAX_SEQUENCES} lists may be kept as sequences"),
            ));
        }
        self.check_sequence_lengths()?;
        if self.shape().1 == 0 && self.shape().0 == 0 {
            return Err(OperatorError::config("dense/categorical", "the spec defines no feature"));
        }
        Ok(())
    }

    /// The `pooling = "none"` lists of a line are one history of events, cut at one length:
    /// they must share `max_len` (else lines longer than the smaller one would all differ).
    fn check_sequence_lengths(&self) -> Result<(), OperatorError> {
        let mut lists = self.sequence_lists();
        let Some((first, head)) = lists.next() else { return Ok(()) };
        match lists.find(|(_, l)| l.max_len != head.max_len) {
            Some((i, l)) => Err(OperatorError::config(
                format!("list[{i}].max_len"),
                format!(
                    "{} differs from the {} of list[{first}]: the `pooling = \"none\"` lists of a line are one \
                     history, kept to one length",
                    l.max_len, head.max_len
                ),
            )),
            None => Ok(()),
        }
    }

    /// Checks list `i`'s `target` against its pooling (see [`ListSpec::target`]).
    fn check_target(&self, i: usize, l: &ListSpec) -> Result<(), OperatorError> {
        let key = format!("list[{i}].target");
        let Some(t) = &l.target else {
            return match l.pooling {
                Pooling::None => Err(OperatorError::config(
                    key,
                    "a `pooling = \"none\"` list needs `target`: the categorical column whose table its items share",
                )),
                _ => Ok(()),
            };
        };
        if l.pooling != Pooling::None {
            return Err(OperatorError::config(key, "only `pooling = \"none\"` lists have a target"));
        }
        let Some(c) = self.categorical.iter().find(|c| &c.column == t) else {
            return Err(OperatorError::config(key, format!("`{t}` is not a categorical column of this spec")));
        };
        if c.encoding != Encoding::Hash {
            return Err(OperatorError::config(key, format!("`{t}` must be hash-encoded to share its table")));
        }
        if c.buckets != l.buckets {
            return Err(OperatorError::config(
                format!("list[{i}].buckets"),
                format!(
                    "{} differs from the {} buckets of its target `{t}`, whose table it shares",
                    l.buckets, c.buckets
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::LineFormat;
    use crate::spec::fixtures::{tiny, NUMERIC, TOML};
    use crate::spec::SpecFormat;

    #[test]
    fn bad_scales_and_boundaries_are_refused_naming_the_key() {
        let cases = [
            ("scale = \"standardize\" }", "center = 1.0 }", "dense[0].scale"),
            ("scale = \"standardize\" }", "scale = \"standardize\", center = 1.0 }", "dense[0].width"),
            ("scale = \"standardize\" }", "scale = \"min_max\", center = 1.0, width = 0.0 }", "dense[0].width"),
            ("boundaries = [6.0, 12.0, 18.0]", "boundaries = [6.0, 6.0]", "categorical[1].boundaries"),
            ("boundaries = [6.0, 12.0, 18.0]", "boundaries = [1.0, 2.0, 3.0, 4.0]", "categorical[1].buckets"),
            ("boundaries = [6.0, 12.0, 18.0]", "", "categorical[1].boundaries"),
            ("encoding = \"quantile\"", "encoding = \"hash\"\nboundaries = [1.0]", "categorical[0].boundaries"),
        ];
        for (from, to, key) in cases {
            let text = NUMERIC.replacen(from, to, 1);
            assert_ne!(text, NUMERIC);
            let e = FeatureSpec::from_toml(&text).unwrap_err().to_string();
            assert!(e.contains(key), "{to}: {e}");
        }
    }

    /// A clamp bound that is no finite number (`inf`, `nan`, or `1e39`, which reads as
    /// `inf` in `f32`) is refused: the manifest's JSON would hold `null` for it, which no
    /// later reader of the checkpoint could load.
    #[test]
    fn non_finite_clamp_bounds_are_refused_naming_the_key() {
        for clamp in ["[0.0, inf]", "[-inf, 0.0]", "[nan, 1.0]", "[1e39, 2e39]", "[-1e39, 0.0]"] {
            let text = NUMERIC.replacen("{ column = \"age\",", &format!("{{ column = \"age\", clamp = {clamp},"), 1);
            assert_ne!(text, NUMERIC);
            let e = FeatureSpec::from_toml(&text).unwrap_err().to_string();
            assert!(e.contains("dense[0].clamp") && e.contains("not a finite number"), "{clamp}: {e}");
        }
        for clamp in [(0.0, f32::INFINITY), (f32::NEG_INFINITY, 1.0), (f32::NAN, f32::NAN)] {
            let mut s = tiny();
            s.dense[0].clamp = Some(clamp);
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains("dense[0].clamp"), "{clamp:?}: {e}");
        }
        let widest =
            NUMERIC.replacen("{ column = \"age\",", "{ column = \"age\", clamp = [-3.4028235e38, 3.4028235e38],", 1);
        let spec = FeatureSpec::from_toml(&widest).unwrap();
        assert_eq!(spec.dense[0].clamp, Some((f32::MIN, f32::MAX)), "the hint's bounds are valid");
    }

    /// A valid spec, fitted values and all, survives the JSON of a checkpoint's manifest
    /// (`pipeline.spec.fields`): every number in it is finite.
    #[test]
    fn a_valid_spec_round_trips_through_manifest_json() {
        let mut spec = FeatureSpec::from_toml(NUMERIC).unwrap();
        spec.dense[0].clamp = Some((f32::MIN, 1e30));
        spec.dense[0].center = Some(1.5);
        spec.dense[0].width = Some(2.0);
        spec.dense[1].center = Some(-0.25);
        spec.dense[1].width = Some(3.0e38);
        spec.categorical[0].boundaries = Some(vec![-1e-30, 0.5, 1e20]);
        spec.validate().unwrap();
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(serde_json::from_value::<FeatureSpec>(json).unwrap(), spec);
        // What validation keeps out: an infinite bound is written as `null` and never read back.
        spec.dense[0].clamp = Some((0.0, f32::INFINITY));
        assert!(serde_json::from_value::<FeatureSpec>(serde_json::to_value(&spec).unwrap()).is_err());
    }

    #[test]
    fn validation_names_the_key() {
        type Mutation = Box<dyn Fn(&mut FeatureSpec)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("label.column", Box::new(|s| s.label.column = "nope".into())),
            ("dense[0].column", Box::new(|s| s.dense[0].column = "nope".into())),
            ("dense[0].clamp", Box::new(|s| s.dense[0].clamp = Some((2.0, 1.0)))),
            ("list[0].delimiter", Box::new(|s| s.list[0].delimiter = ";;".into())),
            ("list[0].max_len", Box::new(|s| s.list[0].max_len = 0)),
            ("categorical[0].buckets", Box::new(|s| s.categorical[0].buckets = 0)),
            ("columns[1]", Box::new(|s| s.columns[1] = "y".into())),
            ("columns[0]", Box::new(|s| s.columns[0] = String::new())),
            ("user", Box::new(|s| s.user = Some("nope".into()))),
        ];
        for (key, mutate) in cases {
            let mut s = tiny();
            mutate(&mut s);
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(key), "expected `{key}` in {e}");
        }
        FeatureSpec::elm(1000, 50).validate().unwrap();
        assert_eq!(FeatureSpec::elm(1000, 50).shape(), (10, 28));
    }

    #[test]
    fn sequence_targets_are_checked() {
        let cases = [
            (TOML.replace("target = \"cat\"\n", ""), "list[1].target", "needs `target`"),
            (TOML.replace("target = \"cat\"", "target = \"dog\""), "list[1].target", "not a categorical"),
            (TOML.replace("target = \"cat\"", "target = \"city\""), "list[1].target", "hash-encoded"),
            (
                TOML.replace("buckets = 20\npooling", "buckets = 21\npooling"),
                "list[1].buckets",
                "21 differs from the 20",
            ),
            (TOML.replace("pooling = \"mean\"", "pooling = \"mean\"\ntarget = \"cat\""), "list[0].target", "only"),
        ];
        for (text, key, what) in cases {
            let e = FeatureSpec::from_toml(&text).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(what), "expected `{key}` and `{what}` in {e}");
        }
        let elm = FeatureSpec::preset("elm-dien", 1000, 20).unwrap();
        elm.validate().unwrap();
        assert_eq!(elm.sequence_lists().count(), 3);
        let targets: Vec<&str> = elm.sequence_targets().iter().map(|&f| elm.categorical[f].column.as_str()).collect();
        assert_eq!(targets, ["shop_id", "item_id", "category_1_id"]);
    }

    #[test]
    fn bad_toml_and_vocabularies_name_the_key() {
        let cases = [
            (TOML.replace("max_len = 4", "max_len = 0"), "list[0].max_len"),
            (TOML.replace("pooling = \"mean\"", "pooling = \"max\""), "pooling"),
            (TOML.replace("max_len = 4\n", ""), "max_len"),
            (TOML.replace("oov_buckets = 2", "oov_bucket = 2"), "oov_bucket"),
            (TOML.replace("buckets = 10\n", "buckets = 4\n"), "categorical[0].buckets"),
            (
                TOML.replace("[\"paris\", \"lyon\", \"nice\"]", "[\"paris\", \"lyon\", \"paris\"]"),
                "categorical[0].vocabulary",
            ),
            (TOML.replace("encoding = \"vocabulary\"\n", ""), "categorical[0].vocabulary"),
            (TOML.replace("vocabulary = [\"paris\", \"lyon\", \"nice\"]\n", ""), "categorical[0].vocabulary"),
            (TOML.replace("column = \"cats\"", "column = \"dogs\""), "list[1].column"),
        ];
        for (text, key) in cases {
            let e = FeatureSpec::from_toml(&text).unwrap_err().to_string();
            assert!(e.contains(key), "expected `{key}` in {e}");
        }
    }

    /// More dense or categorical features than the parser's fixed arrays hold
    /// (one column feeding many features) is a configuration error, not an
    /// index out of bounds on the first line.
    #[test]
    fn too_many_features_are_a_config_error() {
        for (table, key) in [
            ("[[dense]]\ncolumn = \"x\"\n", "dense"),
            ("[[categorical]]\ncolumn = \"x\"\nbuckets = 10\n", "categorical"),
        ] {
            let head = "delimiter = \",\"\ncolumns = [\"y\", \"x\"]\nlabel = { column = \"y\" }\n";
            let fits = format!("{head}{}", table.repeat(MAX_COLUMNS));
            let f = SpecFormat::new(FeatureSpec::from_toml(&fits).unwrap(), 1).unwrap();
            let mut b = f.empty_batch();
            f.parse(b"1,2", &mut b).unwrap();
            b.check().unwrap();
            let over = format!("{head}{}", table.repeat(MAX_COLUMNS + 1));
            let err = FeatureSpec::from_toml(&over).unwrap_err().to_string();
            assert!(err.contains(key) && err.contains("257 entries, at most 256"), "{err}");
        }
        let mut wide = tiny();
        wide.columns.extend((0..MAX_COLUMNS).map(|i| format!("extra{i}")));
        assert!(wide.validate().unwrap_err().to_string().contains("columns"));
    }
}
