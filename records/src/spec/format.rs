//! [`SpecFormat`]: a valid, fitted spec compiled to column indices, and its
//! [`LineFormat`] parse of one line into a [`Batch`].
//!
//! Invariants: a line is split once into fixed arrays (`MAX_COLUMNS` entries), with no
//! allocation per field; a bad line appends nothing to the batch; an absent value is an
//! empty bag, never a fake id; hashing seeds derive from the format's seed and the field's
//! index, and a sequence list hashes with its target's seed into its target's table.

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

/// A list column compiled.
#[derive(Clone, Debug)]
struct ListColumn {
    col: usize,
    delimiter: u8,
    seed: u64,
    buckets: u64,
    max_len: usize,
    pooling: Pooling,
    /// Index of its field in `Batch::sparse` (pooled) or `Batch::sequences` (`none`).
    slot: usize,
}

/// A validated spec compiled to column indices: the [`LineFormat`] of a spec.
///
/// Lists with `pooling = "mean"` carry per-id weights `1/n`
/// ([`crate::SparseField::weights`]); lists with `pooling = "none"` go to
/// `Batch::sequences`, in spec order, and the format reports them through
/// [`LineFormat::num_sequences`].
#[derive(Clone, Debug)]
pub struct SpecFormat {
    spec: FeatureSpec,
    delimiter: u8,
    label: usize,
    dense: Vec<usize>,
    numeric: Vec<(usize, u8, Reduce)>,
    categorical: Vec<CategoricalColumn>,
    lists: Vec<ListColumn>,
    num_sequences: usize,
    /// The user column (`spec.user`), whose value's key goes to `Batch::groups`.
    user: Option<usize>,
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
        let index = |c: &str| spec.columns.iter().position(|x| x == c).expect("validated");
        let delimiter = one_byte("delimiter", &spec.delimiter)?;
        let nc = spec.categorical.len();
        let mut categorical = Vec::with_capacity(nc);
        for (f, c) in spec.categorical.iter().enumerate() {
            let vocabulary = match &c.vocabulary {
                Some(v) => Some(std::sync::Arc::new(v.load(&format!("categorical[{f}].vocabulary"))?)),
                None => None,
            };
            categorical.push(CategoricalColumn {
                col: index(&c.column),
                seed: field_seed(seed, f),
                buckets: c.buckets,
                encoding: c.encoding,
                vocabulary,
                oov_buckets: c.oov_buckets,
                boundaries: c.boundaries.clone().unwrap_or_default(),
            });
        }
        let (mut pooled, mut sequences) = (0, 0);
        let lists = spec
            .list
            .iter()
            .map(|l| {
                let slot = if l.pooling == Pooling::None { &mut sequences } else { &mut pooled };
                let here = *slot;
                *slot += 1;
                ListColumn {
                    col: index(&l.column),
                    delimiter: l.delimiter.as_bytes()[0],
                    // Pooled lists keep the seeds they had before sequences existed;
                    // sequences hash like their target, whose table they share.
                    seed: match &l.target {
                        Some(t) => {
                            field_seed(seed, spec.categorical.iter().position(|c| &c.column == t).expect("validated"))
                        }
                        None => field_seed(seed, nc + here),
                    },
                    buckets: l.buckets,
                    max_len: l.max_len,
                    pooling: l.pooling,
                    slot: if l.pooling == Pooling::None { here } else { nc + here },
                }
            })
            .collect();
        Ok(SpecFormat {
            delimiter,
            label: index(&spec.label.column),
            dense: spec.dense.iter().map(|d| index(&d.column)).collect(),
            numeric: spec
                .numeric_list
                .iter()
                .map(|n| {
                    let r = if n.reduce == ListReduce::Mean { Reduce::Mean } else { Reduce::Sum };
                    (index(&n.column), n.delimiter.as_bytes()[0], r)
                })
                .collect(),
            categorical,
            lists,
            num_sequences: sequences,
            user: spec.user.as_deref().map(index),
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
        Batch::with_sequences(d, s, self.num_sequences)
    }
}

impl LineFormat for SpecFormat {
    fn shape(&self) -> (usize, usize) {
        self.spec.shape()
    }

    fn num_sequences(&self) -> usize {
        self.num_sequences
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
        for (k, (&col, d)) in self.dense.iter().zip(&self.spec.dense).enumerate() {
            let mut v = d.unscaled(fields[col]).map_err(|reason| (reason, Some(col)))?;
            if let Some((center, width)) = d.fitted_scale() {
                v = numeric::scaled(v, center, width);
            }
            if !v.is_finite() {
                return Err((BadReason::NonFinite, Some(col)));
            }
            dense[k] = v;
        }
        for (k, &(col, delim, reduce)) in self.numeric.iter().enumerate() {
            let v = split_parse_reduce(fields[col], delim, reduce, usize::MAX)
                .map_err(|_| (BadReason::BadInteger, Some(col)))?;
            if v.is_some_and(|v| !v.is_finite()) {
                return Err((BadReason::NonFinite, Some(col)));
            }
            dense[self.dense.len() + k] = v.unwrap_or(0.0);
        }
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
        if self.num_sequences > 0 {
            if out.sequences.len() != self.num_sequences {
                return Err((BadReason::FieldCount, None));
            }
            let mut len = None;
            for l in self.lists.iter().filter(|l| l.pooling == Pooling::None) {
                let seq = &mut out.sequences[l.slot];
                let start = seq.ids.len();
                split_hash_bucket(fields[l.col], l.delimiter, l.seed, l.buckets, l.max_len, true, &mut seq.ids);
                let n = seq.ids.len() - start;
                if *len.get_or_insert(n) != n {
                    for s in out.sequences.iter_mut() {
                        let closed = *s.offsets.last().unwrap() as usize;
                        s.ids.truncate(closed);
                    }
                    return Err((BadReason::FieldCount, Some(l.col)));
                }
            }
            for s in out.sequences.iter_mut() {
                s.close_bag();
            }
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
        for l in self.lists.iter().filter(|l| l.pooling != Pooling::None) {
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

    #[test]
    fn sequence_lists_must_agree_in_length() {
        let mut spec = FeatureSpec::from_toml(TOML).unwrap();
        spec.list[0].pooling = Pooling::None;
        spec.list[0].target = Some("cat".into());
        spec.list[0].buckets = 20;
        let f = SpecFormat::new(spec, 1).unwrap();
        assert_eq!(f.shape(), (0, 2));
        assert_eq!(f.num_sequences(), 2);
        let mut b = f.empty_batch();
        f.parse(b"1,lyon,a;b,x;y,c", &mut b).unwrap();
        assert_eq!(f.parse(b"1,lyon,a;b,x,c", &mut b), Err((BadReason::FieldCount, Some(3))));
        b.check().unwrap();
        assert_eq!(b.len(), 1, "the bad line appended nothing");
        assert_eq!(b.sequences[0].bag(0).len(), 2);
    }
}
