//! `FeatureSpec`: the columns of a delimited dataset and how each becomes a feature.
//!
//! A spec names its columns in order and maps them to one label, dense
//! features (a number, optionally clamped, optionally `ln(1 + max(x, 0))`),
//! categorical fields (the value's bytes hashed into a table, or an integer
//! id used as is), multi-valued lists (split on their own delimiter, hashed,
//! truncated to `max_len` with early stop, sum-pooled by the trainer) and
//! numeric lists (split, parsed, reduced to their mean or sum: a dense
//! feature). Absent values are empty bags (zero rows), never fake ids.
//!
//! [`FeatureSpec::validate`] checks everything before any data is read and
//! names the offending key (`dense[2].column`, …). [`SpecFormat`] is the
//! resulting [`LineFormat`](crate::format::LineFormat): one pass over each
//! line with the fused kernels of [`crate::features`], no allocation per field.
//!
//! The types of a spec are here; its submodules load vocabularies, validate a
//! spec, hold the presets, compile a spec to its line format and fit the
//! transforms learned from the training data.

use crate::bad_record::BadReason;
use crate::OperatorError;
use serde::{Deserialize, Serialize};

mod fit;
#[cfg(test)]
mod fixtures;
mod format;
mod keys;
pub mod numeric;
mod presets;
mod sequence;
mod validate;
mod vocabulary;

pub use fit::SampleValues;
pub use format::SpecFormat;
pub use numeric::Scale;
pub use presets::{AVAZU_COLUMNS, CRITEO_NUM_DENSE, CRITEO_NUM_SPARSE, ELM_COLUMNS, TAOBAO_AD_COLUMNS};
pub use validate::delimiter_byte;
pub use vocabulary::{Vocabulary, VocabularyMap, MAX_TOKEN_BYTES, MAX_VOCABULARY_BYTES};

/// The label column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelSpec {
    /// Column name.
    pub column: String,
}

/// A dense numeric column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenseSpec {
    /// Column name.
    pub column: String,
    /// Apply `ln(1 + max(x, 0))` after clamping.
    #[serde(default)]
    pub log1p: bool,
    /// Clamp to `[lo, hi]` first: two finite bounds, `lo ≤ hi`.
    #[serde(default, deserialize_with = "clamp_bounds")]
    pub clamp: Option<(f32, f32)>,
    /// Scale last, to `(v − center) / width` ([`numeric`]): `standardize` or `min_max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<Scale>,
    /// The scale's center (the mean, or the minimum); learned from the training data when
    /// not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub center: Option<f32>,
    /// The scale's width (the standard deviation, or the range); learned with `center`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<f32>,
}

/// Reads a clamp as exactly two bounds (a tuple would take the first two of `[0, 1, 2]`).
fn clamp_bounds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<(f32, f32)>, D::Error> {
    match Option::<Vec<f32>>::deserialize(d)? {
        None => Ok(None),
        Some(v) => match v[..] {
            [lo, hi] => Ok(Some((lo, hi))),
            _ => Err(serde::de::Error::invalid_length(v.len(), &"two bounds, [lo, hi]")),
        },
    }
}

impl DenseSpec {
    /// A column read as a number, `ln(1 + max(x, 0))` when `log1p`, without clamp or scale.
    pub fn new(column: &str, log1p: bool) -> Self {
        DenseSpec { column: column.into(), log1p, clamp: None, scale: None, center: None, width: None }
    }

    /// `(center, width)` when the column is scaled and both are known.
    pub fn fitted_scale(&self) -> Option<(f32, f32)> {
        self.scale.and(self.center.zip(self.width))
    }

    /// The value of `raw` after the clamp and `log1p`, before any scale: empty is 0; text
    /// that is no number is [`BadReason::BadInteger`]; `inf`, `NaN` and values beyond `f32`
    /// (`1e40`) are [`BadReason::NonFinite`] before a clamp could hide them.
    #[inline]
    pub fn unscaled(&self, raw: &[u8]) -> Result<f32, BadReason> {
        let mut v =
            if raw.is_empty() { 0.0 } else { fast_float2::parse::<f32, _>(raw).map_err(|_| BadReason::BadInteger)? };
        if !v.is_finite() {
            return Err(BadReason::NonFinite);
        }
        if let Some((lo, hi)) = self.clamp {
            v = v.clamp(lo, hi);
        }
        if self.log1p {
            v = crate::features::log1p_clamped(v);
        }
        Ok(v)
    }
}

/// How a categorical value becomes a row id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Seeded hash of the value's bytes, modulo the table size.
    #[default]
    Hash,
    /// The value is a non-negative integer id below the table size.
    Identity,
    /// The value is looked up in a vocabulary (`vocabulary`): token `k` is id
    /// `k`; an out-of-vocabulary token hashes into one of `oov_buckets` extra
    /// ids after the vocabulary, or is an absent value (empty bag) when
    /// `oov_buckets` is 0.
    Vocabulary,
    /// The value is a number; its id is the number of `boundaries` at or below it (bucket
    /// `k` holds `boundaries[k−1] ≤ v < boundaries[k]`).
    Bucketize,
    /// As `bucketize`, with up to `buckets − 1` boundaries at the quantiles of the training
    /// data (learned when `boundaries` is not given).
    Quantile,
}

/// How the ids of a multi-valued list reach the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// The bag's embedding rows are summed.
    #[default]
    Sum,
    /// The rows are averaged (each id weighted `1/n`; an empty bag pools to zeros).
    Mean,
    /// Not pooled: the list is kept, in order, as a behaviour sequence field
    /// (`Batch::sequences`) for models with sequence inputs. The `none` lists of a
    /// spec describe the same events, item `k` of each being event `k`: they share
    /// `max_len`, and on every line they must have the same number of items, counted
    /// before any cut (`k` delimiters, `k + 1` items; an empty field none), else the
    /// line is malformed (`field_count`). An event with an empty item in any list is
    /// skipped in all of them.
    None,
}

/// A single-valued categorical column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CategoricalSpec {
    /// Column name.
    pub column: String,
    /// Table rows.
    pub buckets: u64,
    /// Hash (default), identity or vocabulary.
    #[serde(default)]
    pub encoding: Encoding,
    /// The vocabulary of `encoding = "vocabulary"`: a file path or an inline list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocabulary: Option<Vocabulary>,
    /// Extra ids for out-of-vocabulary tokens (0: such a token is an absent value).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub oov_buckets: u64,
    /// The boundaries of `bucketize` and `quantile`: finite, strictly ascending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundaries: Option<Vec<f32>>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_sum(p: &Pooling) -> bool {
    *p == Pooling::Sum
}

impl CategoricalSpec {
    /// A hashed column.
    pub fn hashed(column: &str, buckets: u64) -> Self {
        CategoricalSpec {
            column: column.into(),
            buckets,
            encoding: Encoding::Hash,
            vocabulary: None,
            oov_buckets: 0,
            boundaries: None,
        }
    }
}

/// A multi-valued categorical column (a behaviour list).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListSpec {
    /// Column name.
    pub column: String,
    /// Item delimiter (one byte).
    pub delimiter: String,
    /// Keep at most this many items (the first ones).
    pub max_len: usize,
    /// Table rows.
    pub buckets: u64,
    /// `sum` (default), `mean` or `none` (kept as a sequence).
    #[serde(default, skip_serializing_if = "is_sum")]
    pub pooling: Pooling,
    /// For `pooling = "none"` only, and required there: the hashed categorical
    /// column whose table the sequence's items share. Items are hashed like that
    /// column's values (same seed, same `buckets`), so an item equal to a
    /// target value is the same row; sequence models (`dien`) attend against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// How a numeric list becomes one dense value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListReduce {
    /// Mean of the items (0 when empty).
    Mean,
    /// Sum of the items.
    Sum,
}

/// A numeric list column reduced to one dense feature.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NumericListSpec {
    /// Column name.
    pub column: String,
    /// Item delimiter (one byte).
    pub delimiter: String,
    /// Mean or sum.
    pub reduce: ListReduce,
}

/// The whole spec.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureSpec {
    /// Column delimiter (one byte; `\t` allowed).
    pub delimiter: String,
    /// Whether files start with a header line (skipped).
    #[serde(default)]
    pub header: bool,
    /// Column names, in order.
    pub columns: Vec<String>,
    /// The label.
    pub label: LabelSpec,
    /// The column naming the user of a sample, for per-user metrics (GAUC): each sample's
    /// [`Batch::groups`](crate::batch::Batch::groups) entry is the
    /// [`group_key`](crate::metrics::group_key) of its value. Not a feature by itself
    /// (a categorical field may read the same column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Dense features, in order.
    #[serde(default)]
    pub dense: Vec<DenseSpec>,
    /// Numeric lists (each one more dense feature, after `dense`).
    #[serde(default)]
    pub numeric_list: Vec<NumericListSpec>,
    /// Categorical fields, in order.
    #[serde(default)]
    pub categorical: Vec<CategoricalSpec>,
    /// Multi-valued fields (after `categorical`).
    #[serde(default)]
    pub list: Vec<ListSpec>,
}

impl FeatureSpec {
    /// Whether `line` is the spec's header line: with `header = true`, a line starting
    /// with the first column's name (the rule for a file's first line, and for
    /// `tiderec produce` replaying files into a topic).
    pub fn is_header(&self, line: &[u8]) -> bool {
        self.header && self.columns.first().is_some_and(|c| line.starts_with(c.as_bytes()))
    }

    /// `(dense features, sparse fields)` of the samples (lists with
    /// `pooling = "none"` are sequence fields, not sparse fields).
    pub fn shape(&self) -> (usize, usize) {
        (self.dense.len() + self.numeric_list.len(), self.categorical.len() + self.pooled_lists().count())
    }

    /// Rows of each sparse field's table, in field order.
    pub fn table_sizes(&self) -> Vec<u64> {
        self.categorical.iter().map(|c| c.buckets).chain(self.pooled_lists().map(|(_, l)| l.buckets)).collect()
    }

    /// The lists pooled into sparse fields (`sum`, `mean`) with their index in `list`.
    pub fn pooled_lists(&self) -> impl Iterator<Item = (usize, &ListSpec)> {
        self.list.iter().enumerate().filter(|(_, l)| l.pooling != Pooling::None)
    }

    /// For each sequence list (`pooling = "none"`, in order), the index of its
    /// target among the sparse fields (the categorical column it shares a table with).
    /// Call on a validated spec; a list without a valid target is skipped.
    pub fn sequence_targets(&self) -> Vec<usize> {
        self.sequence_lists()
            .filter_map(|(_, l)| l.target.as_ref())
            .filter_map(|t| self.categorical.iter().position(|c| &c.column == t))
            .collect()
    }

    /// The lists kept as sequence fields (`pooling = "none"`) with their index in `list`.
    pub fn sequence_lists(&self) -> impl Iterator<Item = (usize, &ListSpec)> {
        self.list.iter().enumerate().filter(|(_, l)| l.pooling == Pooling::None)
    }

    /// Parses a TOML spec and validates it; errors name the key path
    /// (`categorical[0].buckets`, TOML type errors included, which also give the line and
    /// column).
    pub fn from_toml(text: &str) -> Result<Self, OperatorError> {
        Self::from_toml_in(text, None)
    }

    /// As [`FeatureSpec::from_toml`], with relative vocabulary file paths
    /// taken relative to `base` (the spec file's folder).
    pub fn from_toml_in(text: &str, base: Option<&std::path::Path>) -> Result<Self, OperatorError> {
        let mut spec: FeatureSpec =
            toml::from_str(text).map_err(|e| OperatorError::config(keys::error_key(text, &e), e.to_string()))?;
        if let Some(base) = base {
            for c in &mut spec.categorical {
                if let Some(Vocabulary::File(path)) = &mut c.vocabulary {
                    if std::path::Path::new(path.as_str()).is_relative() {
                        *path = base.join(&*path).display().to_string();
                    }
                }
            }
        }
        spec.validate()?;
        Ok(spec)
    }

    /// Reads every vocabulary file into the spec ([`Vocabulary::inlined`]) and validates
    /// the result (a file's token count against its table): the spec then stands alone,
    /// as a model records it.
    pub fn inline_vocabularies(&mut self) -> Result<(), OperatorError> {
        for (i, c) in self.categorical.iter_mut().enumerate() {
            if let Some(v) = &c.vocabulary {
                c.vocabulary = Some(v.inlined(&format!("categorical[{i}].vocabulary"))?);
            }
        }
        self.validate()
    }

    /// The spec as TOML (what `from_toml` reads back).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a feature spec always serializes")
    }
}
