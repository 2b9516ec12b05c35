//! [`SpecFormat`]: a valid, fitted spec compiled to column indices, and its
//! [`LineFormat`] parse of one line into a [`Batch`].
//!
//! Invariants: a line is split once into fixed arrays (`MAX_COLUMNS` entries), with no
//! allocation per field; every delimiter is decoded by [`super::delimiter_byte`]; a bad
//! line appends nothing to the batch; an absent value is an empty bag, never a fake id;
//! hashing seeds derive from the format's seed and the field's index, and a sequence list
//! hashes with its target's seed into its target's table; the sequence lists of a line are
//! read together, position by position ([`super::sequence`]).

use super::sequence::{push_sequences, SequenceList};
use super::validate::{one_byte, MAX_COLUMNS};
use super::{numeric, Encoding, FeatureSpec, ListReduce, Pooling, VocabularyMap};
use crate::bad_record::BadReason;
use crate::batch::Batch;
use crate::features::field_seed;
use crate::features::fused::{split_hash_bucket, split_parse_reduce, token_bucket, Reduce};
use crate::features::split::for_each_token;
use crate::format::LineFormat;
use crate::metrics::group_key;
use crate::OperatorError;

/// A categorical column compiled: column index, hashing seed, table rows, encoding.
#[derive(Clone, Debug)]
struct CategoricalColumn {
    col: usize,
    seed: u64,
    buckets: u64,
    encoding: Encoding,
    /// The loaded vocabulary (vocabulary encoding only).
    vocabulary: Option<std::sync::Arc<VocabularyMap>>,
    oov_buckets: u64,
    /// The boundaries of `bucketize` and `quantile` (empty for the other encodings).
    boundaries: Vec<f32>,
}

impl CategoricalColumn {
    /// The id of a non-empty value; `Ok(None)` for an out-of-vocabulary token
    /// without oov buckets (an absent value).
    #[inline]
    fn id(&self, raw: &[u8]) -> Result<Option<u64>, ()> {
        match self.encoding {
            Encoding::Hash => Ok(Some(token_bucket(self.seed, raw, self.buckets))),
            Encoding::Identity => match crate::features::parse_i64(raw) {
                Some(v) if v >= 0 && (v as u64) < self.buckets => Ok(Some(v as u64)),
                _ => Err(()),
            },
            Encoding::Bucketize | Encoding::Quantile => {
                numeric::finite_number(raw).map(|v| Some(numeric::bucket_of(&self.boundaries, v))).ok_or(())
            }
            Encoding::Vocabulary => {
                let vocab = self.vocabulary.as_ref().expect("compiled with its vocabulary");
                Ok(match vocab.get(raw) {
                    Some(&id) => Some(id),
                    None if self.oov_buckets > 0 => {
                        Some(vocab.len() as u64 + token_bucket(self.seed, raw, self.oov_buckets))
                    }
                    None => None,
                })
            }
        }
    }
}

/// A pooled list column compiled (`sum` or `mean`).
#[derive(Clone, Debug)]
struct ListColumn {
    col: usize,
    delimiter: u8,
    seed: u64,
    buckets: u64,
    max_len: usize,
    pooling: Pooling,
    /// Index of its field in `Batch::sparse`.
    slot: usize,
}

/// A validated spec compiled to column indices: the [`LineFormat`] of a spec.
///
/// Lists with `pooling = "mean"` carry per-id weights `1/n`
/// ([`crate::SparseField::weights`]); lists with `pooling = "none"` go to
/// `Batch::sequences`, in spec order, read together position by position (see
/// [`Pooling::None`]), and the format reports them through [`LineFormat::num_sequences`].
#[derive(Clone, Debug)]
pub struct SpecFormat {
    spec: FeatureSpec,
    delimiter: u8,
    label: usize,
    dense: Vec<usize>,
    numeric: Vec<(usize, u8, Reduce)>,
    categorical: Vec<CategoricalColumn>,
    lists: Vec<ListColumn>,
    /// The `pooling = "none"` lists, in spec order, and the `max_len` they share.
    sequences: Vec<SequenceList>,
    sequence_len: usize,
    /// The user column (`spec.user`), whose value's key goes to `Batch::groups`.
    user: Option<usize>,
}

/// The index of column `name` in a validated spec.
fn column(spec: &FeatureSpec, name: &str) -> usize {
    spec.columns.iter().position(|x| x == name).expect("validated")
}

/// The categorical columns of a validated spec, vocabularies loaded.
fn categorical_columns(spec: &FeatureSpec, seed: u64) -> Result<Vec<CategoricalColumn>, OperatorError> {
    let mut out = Vec::with_capacity(spec.categorical.len());
    for (f, c) in spec.categorical.iter().enumerate() {
        let vocabulary = match &c.vocabulary {
            Some(v) => Some(std::sync::Arc::new(v.load(&format!("categorical[{f}].vocabulary"))?)),
            None => None,
        };
        out.push(CategoricalColumn {
            col: column(spec, &c.column),
            seed: field_seed(seed, f),
            buckets: c.buckets,
            encoding: c.encoding,
            vocabulary,
            oov_buckets: c.oov_buckets,
            boundaries: c.boundaries.clone().unwrap_or_default(),
        });
    }
    Ok(out)
}

/// The pooled lists and the sequence lists of a validated spec. Pooled lists keep the seeds
/// they had before sequences existed (after the categorical fields); a sequence hashes like
/// its target, whose table it shares.
fn list_columns(spec: &FeatureSpec, seed: u64) -> Result<(Vec<ListColumn>, Vec<SequenceList>), OperatorError> {
    let nc = spec.categorical.len();
    let (mut pooled, mut sequences) = (Vec::new(), Vec::new());
    for (i, l) in spec.list.iter().enumerate() {
        let delimiter = one_byte(&format!("list[{i}].delimiter"), &l.delimiter)?;
        let col = column(spec, &l.column);
        match &l.target {
            Some(t) if l.pooling == Pooling::None => {
                let target = spec.categorical.iter().position(|c| &c.column == t).expect("validated");
                sequences.push(SequenceList { col, delimiter, seed: field_seed(seed, target), buckets: l.buckets });
            }
            _ => pooled.push(ListColumn {
                col,
                delimiter,
                seed: field_seed(seed, nc + pooled.len()),
                buckets: l.buckets,
                max_len: l.max_len,
                pooling: l.pooling,
                slot: nc + pooled.len(),
            }),
        }
    }
    Ok((pooled, sequences))
}

/// The numeric lists of a validated spec: column, item delimiter, reduction.
fn numeric_columns(spec: &FeatureSpec) -> Result<Vec<(usize, u8, Reduce)>, OperatorError> {
    let compile = |(i, n): (usize, &super::NumericListSpec)| {
        let delimiter = one_byte(&format!("numeric_list[{i}].delimiter"), &n.delimiter)?;
        let reduce = if n.reduce == ListReduce::Mean { Reduce::Mean } else { Reduce::Sum };
        Ok((column(spec, &n.column), delimiter, reduce))
    };
    spec.numeric_list.iter().enumerate().map(compile).collect()
}

impl SpecFormat {
    /// Compiles `spec` (validated here, vocabularies loaded) with hashing seeds derived from `seed`.
    pub fn new(spec: FeatureSpec, seed: u64) -> Result<Self, OperatorError> {
        spec.validate()?;
        if let Some(key) = spec.unfitted().into_iter().next() {
            return Err(OperatorError::config(
                key,
                "is learned from the training data (`train` and `convert` learn it from the first rows of --data), \
                 or given in the spec",
            ));
        }
        let (lists, sequences) = list_columns(&spec, seed)?;
        let sequence_len = spec.sequence_lists().map(|(_, l)| l.max_len).next().unwrap_or(0);
        Ok(SpecFormat {
            delimiter: one_byte("delimiter", &spec.delimiter)?,
            label: column(&spec, &spec.label.column),
            dense: spec.dense.iter().map(|d| column(&spec, &d.column)).collect(),
            numeric: numeric_columns(&spec)?,
            categorical: categorical_columns(&spec, seed)?,
            lists,
            sequence_len,
            sequences,
            user: spec.user.as_deref().map(|u| column(&spec, u)),
            spec,
        })
    }

    /// The spec this format was compiled from.
    pub fn spec(&self) -> &FeatureSpec {
        &self.spec
    }

    /// An empty batch of this format's shape (sequence fields included).
    pub fn empty_batch(&self) -> Batch {
        let (d, s) = self.spec.shape();
        Batch::with_sequences(d, s, self.sequences.len())
    }

    /// The dense values of a line (`dense`, then the numeric lists) into `out`; the error
    /// names the reason and the column.
    fn dense_values(&self, fields: &[&[u8]], out: &mut [f32]) -> Result<(), (BadReason, Option<usize>)> {
        for (k, (&col, d)) in self.dense.iter().zip(&self.spec.dense).enumerate() {
            let mut v = d.unscaled(fields[col]).map_err(|reason| (reason, Some(col)))?;
            if let Some((center, width)) = d.fitted_scale() {
                v = numeric::scaled(v, center, width);
            }
            if !v.is_finite() {
                return Err((BadReason::NonFinite, Some(col)));
            }
            out[k] = v;
        }
        for (k, &(col, delim, reduce)) in self.numeric.iter().enumerate() {
            let v = split_parse_reduce(fields[col], delim, reduce, usize::MAX)
                .map_err(|_| (BadReason::BadInteger, Some(col)))?;
            if v.is_some_and(|v| !v.is_finite()) {
                return Err((BadReason::NonFinite, Some(col)));
            }
            out[self.dense.len() + k] = v.unwrap_or(0.0);
        }
        Ok(())
    }
}

impl LineFormat for SpecFormat {
    fn shape(&self) -> (usize, usize) {
        self.spec.shape()
    }

    fn num_sequences(&self) -> usize {
        self.sequences.len()
    }

    fn is_header(&self, line: &[u8]) -> bool {
        self.spec.is_header(line)
    }

    fn parse(&self, line: &[u8], out: &mut Batch) -> Result<(), (BadReason, Option<usize>)> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let n = self.spec.columns.len();
        if n > MAX_COLUMNS {
            return Err((BadReason::FieldCount, None));
        }
        let mut fields: [&[u8]; MAX_COLUMNS] = [&[]; MAX_COLUMNS];
        let mut count = 0;
        for_each_token(line, self.delimiter, n + 1, |t| {
            if count < n {
                fields[count] = t;
            }
            count += 1;
        });
        if count != n {
            return Err((BadReason::FieldCount, None));
        }
        let label = match fields[self.label] {
            b"0" => 0.0,
            b"1" => 1.0,
            _ => return Err((BadReason::BadLabel, Some(self.label))),
        };
        // Parse every dense value before appending anything, so a bad line appends nothing.
        let nd = self.dense.len() + self.numeric.len();
        let mut dense = [0.0f32; MAX_COLUMNS];
        self.dense_values(&fields[..n], &mut dense)?;
        let mut ids = [0u64; MAX_COLUMNS];
        for (f, c) in self.categorical.iter().enumerate() {
            let raw = fields[c.col];
            ids[f] = if raw.is_empty() {
                u64::MAX
            } else {
                c.id(raw).map_err(|_| (BadReason::BadInteger, Some(c.col)))?.unwrap_or(u64::MAX)
            };
        }
        // Sequence lists first: they are the last thing that can reject the line.
        if !self.sequences.is_empty() {
            if out.sequences.len() != self.sequences.len() {
                return Err((BadReason::FieldCount, None));
            }
            push_sequences(&self.sequences, &fields[..n], self.sequence_len, &mut out.sequences)
                .map_err(|col| (BadReason::FieldCount, Some(col)))?;
        }
        out.labels.push(label);
        if let Some(col) = self.user {
            out.groups.push(group_key(fields[col]));
        }
        out.dense.extend_from_slice(&dense[..nd]);
        for (f, &id) in ids[..self.categorical.len()].iter().enumerate() {
            let bag = &mut out.sparse[f];
            if id != u64::MAX {
                bag.ids.push(id);
            }
            close(bag);
        }
        for l in &self.lists {
            let bag = &mut out.sparse[l.slot];
            split_hash_bucket(fields[l.col], l.delimiter, l.seed, l.buckets, l.max_len, true, &mut bag.ids);
            if l.pooling == Pooling::Mean {
                bag.close_bag_mean();
            } else {
                close(bag);
            }
        }
        Ok(())
    }
}

/// Closes a bag, keeping the weights aligned when the field is weighted
/// (a batch shared with mean-pooled samples).
#[inline]
fn close(bag: &mut crate::batch::SparseField) {
    if let Some(w) = &mut bag.weights {
        w.resize(bag.ids.len(), 1.0);
    }
    bag.close_bag();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::fixtures::{tiny, TOML};

    #[test]
    fn parses_against_a_plain_reference() {
        let f = SpecFormat::new(tiny(), 9).unwrap();
        assert_eq!(f.shape(), (2, 2));
        let mut b = Batch::new(2, 2);
        f.parse(b"1,250,2;4;,u7,a;b;c", &mut b).unwrap();
        f.parse(b"0,,,,", &mut b).unwrap();
        b.check().unwrap();
        assert_eq!(b.labels, [1.0, 0.0]);
        assert!((b.dense[0] - 101f32.ln()).abs() < 1e-6, "clamped to 100 then log1p");
        assert_eq!(b.dense[1], 3.0, "mean of 2 and 4, empty item skipped");
        assert_eq!(&b.dense[2..], &[0.0, 0.0]);
        assert_eq!(b.sparse[0].bag(0), &[token_bucket(field_seed(9, 0), b"u7", 1000)]);
        let s = field_seed(9, 1);
        assert_eq!(b.sparse[1].bag(0), &[token_bucket(s, b"a", 50), token_bucket(s, b"b", 50)], "max_len 2");
        assert!(b.sparse[0].bag(1).is_empty() && b.sparse[1].bag(1).is_empty(), "absent values are empty bags");
        assert_eq!(b.groups, [group_key(b"u7"), group_key(b"")], "the user column's keys");
        assert!(f.is_header(b"y,price,prices,user,items"));
        assert_eq!(f.parse(b"2,1,1,u,a", &mut b), Err((BadReason::BadLabel, Some(0))));
        assert_eq!(f.parse(b"1,x,1,u,a", &mut b), Err((BadReason::BadInteger, Some(1))));
        assert_eq!(f.parse(b"1,1,1;z,u,a", &mut b), Err((BadReason::BadInteger, Some(2))));
        assert_eq!(f.parse(b"1,1,1,u", &mut b), Err((BadReason::FieldCount, None)));
        assert_eq!(b.len(), 2, "bad lines append nothing");
        assert_eq!(b.groups.len(), 2, "bad lines append no group");
    }

    #[test]
    fn non_finite_values_are_bad_records_even_under_a_clamp() {
        let f = SpecFormat::new(tiny(), 9).unwrap();
        let mut b = Batch::new(2, 2);
        for (line, col) in [
            (&b"1,inf,1,u,a"[..], 1),
            (b"1,-inf,1,u,a", 1),
            (b"1,NaN,1,u,a", 1),
            (b"1,1e40,1,u,a", 1),
            (b"1,1,2;inf,u,a", 2),
            (b"1,1,nan,u,a", 2),
            (b"1,1,1e39;1,u,a", 2),
        ] {
            assert_eq!(f.parse(line, &mut b), Err((BadReason::NonFinite, Some(col))), "{}", line.escape_ascii());
        }
        assert_eq!(b.len(), 0, "bad lines append nothing");
        f.parse(b"1,3e38,3e38,u,a", &mut b).unwrap();
        assert!(b.dense.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn toml_spec_with_vocabulary_mean_and_sequence_lists() {
        let spec = FeatureSpec::from_toml(TOML).unwrap();
        assert_eq!(spec.shape(), (0, 3), "the `none` list is a sequence, not a sparse field");
        assert_eq!(spec.table_sizes(), [10, 20, 100]);
        assert_eq!(spec.sequence_targets(), [1], "`cats` shares the table of `cat`, sparse field 1");
        let f = SpecFormat::new(spec.clone(), 1).unwrap();
        assert_eq!(f.num_sequences(), 1);
        let mut b = f.empty_batch();
        f.parse(b"1,lyon,a;b;c,x;y;z,y", &mut b).unwrap();
        f.parse(b"0,berlin,,,", &mut b).unwrap();
        f.parse(b"0,,a,x,", &mut b).unwrap();
        b.check().unwrap();
        assert_eq!(b.sparse[0].bag(0), &[1], "lyon is token 1");
        let oov = b.sparse[0].bag(1)[0];
        assert!((3..5).contains(&oov), "berlin hashes into the oov buckets 3..5, got {oov}");
        assert!(b.sparse[0].bag(2).is_empty(), "empty value is absent");
        assert_eq!(b.sparse[2].bag_weights(0), Some(&[1.0 / 3.0; 3][..]), "mean pooling weights");
        assert_eq!(b.sparse[2].bag_weights(1), Some(&[][..]));
        assert_eq!(b.sparse[2].bag_weights(2), Some(&[1.0][..]));
        assert_eq!(b.sequences[0].bag(0).len(), 3);
        assert_eq!(b.sequences[0].bag(0)[0], b.sequences[0].bag(2)[0], "same token, same id");
        assert_eq!(b.sequences[0].bag(0)[1], b.sparse[1].bag(0)[0], "item `y` is the target's row for `y`");
        assert_eq!(b.sequences[0].bag(0)[1], token_bucket(field_seed(1, 1), b"y", 20));
        // Without oov buckets an unknown token is an absent value.
        let mut s2 = spec.clone();
        s2.categorical[0].oov_buckets = 0;
        let f2 = SpecFormat::new(s2, 1).unwrap();
        let mut b2 = f2.empty_batch();
        f2.parse(b"1,berlin,a,x,", &mut b2).unwrap();
        assert!(b2.sparse[0].bag(0).is_empty());
        // The TOML round-trips.
        assert_eq!(FeatureSpec::from_toml(&spec.to_toml()).unwrap(), spec);
    }

    /// The TOML spec with `items` a second sequence list (sharing `cats`' `max_len` of 3).
    fn two_sequences() -> SpecFormat {
        let mut spec = FeatureSpec::from_toml(TOML).unwrap();
        spec.list[0].pooling = Pooling::None;
        spec.list[0].target = Some("cat".into());
        spec.list[0].buckets = 20;
        spec.list[0].max_len = 3;
        SpecFormat::new(spec, 1).unwrap()
    }

    #[test]
    fn sequence_lists_must_agree_in_length() {
        let f = two_sequences();
        assert_eq!(f.shape(), (0, 2));
        assert_eq!(f.num_sequences(), 2);
        let mut b = f.empty_batch();
        f.parse(b"1,lyon,a;b,x;y,c", &mut b).unwrap();
        assert_eq!(f.parse(b"1,lyon,a;b,x,c", &mut b), Err((BadReason::FieldCount, Some(3))));
        b.check().unwrap();
        assert_eq!(b.len(), 1, "the bad line appended nothing");
        assert_eq!(b.sequences[0].bag(0).len(), 2);
    }

    /// Lengths are compared as written, before `max_len` cuts them and before empty items
    /// are skipped; an empty item skips its event in every list, keeping the pairs aligned.
    #[test]
    fn sequence_lengths_count_raw_items_and_keep_pairs_aligned() {
        let f = two_sequences();
        let mut b = f.empty_batch();
        for (items, cats) in [("a;b;c;d", "x;y;z"), ("a;b;c;d;e;f", "x;y;z;w"), ("a;;c", "x;y"), ("a;b;", "x;y")] {
            let line = format!("1,lyon,{items},{cats},c");
            assert_eq!(f.parse(line.as_bytes(), &mut b), Err((BadReason::FieldCount, Some(3))), "{line}");
        }
        assert_eq!(b.len(), 0, "bad lines append nothing");
        f.parse(b"1,lyon,a;;c;d;e,x;y;z;w;v,c", &mut b).unwrap();
        f.parse(b"1,lyon,a;b;c;d,x;y;z;,c", &mut b).unwrap();
        b.check().unwrap();
        let ids = |tokens: &[&str]| -> Vec<u64> {
            tokens.iter().map(|t| token_bucket(field_seed(1, 1), t.as_bytes(), 20)).collect()
        };
        assert_eq!(b.sequences[0].bag(0), ids(&["a", "c", "d"]), "the event with an empty item is skipped");
        assert_eq!(b.sequences[1].bag(0), ids(&["x", "z", "w"]), "`y` is skipped with it, `z` pairs with `c`");
        assert_eq!(b.sequences[0].bag(1), ids(&["a", "b", "c"]), "cut at max_len 3");
        assert_eq!(b.sequences[1].bag(1), ids(&["x", "y", "z"]));
    }

    /// A list delimiter written `"\\t"` (a backslash and a `t`, as `spec show` prints the
    /// line's) is a TAB for lists, numeric lists and sequences alike, as validation reads it.
    #[test]
    fn escaped_tab_list_delimiters_split_on_tab() {
        let text = r#"
delimiter = ","
columns = ["y", "items", "prices", "cat", "cats"]
label = { column = "y" }
categorical = [{ column = "cat", buckets = 30 }]
numeric_list = [{ column = "prices", delimiter = "\\t", reduce = "sum" }]
list = [
  { column = "items", delimiter = "\\t", max_len = 5, buckets = 100 },
  { column = "cats", delimiter = "\\t", max_len = 5, buckets = 30, pooling = "none", target = "cat" },
]
"#;
        let spec = FeatureSpec::from_toml(text).unwrap();
        assert_eq!(spec.list[0].delimiter, "\\t", "two characters");
        let f = SpecFormat::new(spec, 3).unwrap();
        let mut b = f.empty_batch();
        f.parse(b"1,a\tb,1\t2.5,c,x\\y\tz", &mut b).unwrap();
        b.check().unwrap();
        assert_eq!(b.dense, [3.5]);
        let (items, cats) = (field_seed(3, 1), field_seed(3, 0));
        assert_eq!(b.sparse[1].bag(0), [token_bucket(items, b"a", 100), token_bucket(items, b"b", 100)]);
        assert_eq!(b.sequences[0].bag(0), [token_bucket(cats, b"x\\y", 30), token_bucket(cats, b"z", 30)]);
    }

    /// The sequence lists of a line are cut at one `max_len`: lists that differ in it are
    /// refused when the spec is validated, not on every long line.
    #[test]
    fn sequence_lists_share_max_len() {
        let mut spec = two_sequences().spec().clone();
        spec.list[0].max_len = 4;
        let e = spec.validate().unwrap_err().to_string();
        assert!(e.contains("list[1].max_len") && e.contains("3 differs from the 4 of list[0]"), "{e}");
        let text = TOML.replace("max_len = 3", "max_len = 2");
        FeatureSpec::from_toml(&text).unwrap();
    }
}
