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
//! resulting [`LineFormat`]: one pass over each line with the fused kernels
//! of [`crate::features`], no allocation per field.

use crate::bad_record::BadReason;
use crate::batch::Batch;
use crate::features::field_seed;
use crate::features::fused::{split_hash_bucket, split_parse_reduce, token_bucket, Reduce};
use crate::features::split::for_each_token;
use crate::format::LineFormat;
use crate::metrics::group_key;
use crate::OperatorError;
use serde::{Deserialize, Serialize};

pub mod numeric;
pub use numeric::Scale;

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
    /// Clamp to `[lo, hi]` first.
    #[serde(default)]
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

/// A vocabulary: a file with one token per line, or the tokens inline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Vocabulary {
    /// Path of a file with one token per line (a trailing `\r` is dropped).
    File(String),
    /// The tokens, in id order.
    Inline(Vec<String>),
}

/// Token → id map of a loaded vocabulary.
pub type VocabularyMap = rustc_hash::FxHashMap<Vec<u8>, u64>;

/// The largest vocabulary file read (256 MiB: tens of millions of tokens).
pub const MAX_VOCABULARY_BYTES: u64 = 256 << 20;

/// The longest token of a vocabulary file, in bytes.
pub const MAX_TOKEN_BYTES: usize = 64 << 10;

/// The bytes of vocabulary file `path`: a regular file of at most [`MAX_VOCABULARY_BYTES`]
/// (a device, a FIFO or a file growing past the bound is refused, not read forever).
fn read_vocabulary_file(key: &str, path: &str) -> Result<Vec<u8>, OperatorError> {
    use std::io::Read;
    let error = |why: String| OperatorError::config(key, format!("vocabulary {path}: {why}"));
    let meta = std::fs::metadata(path)
        .map_err(|e| OperatorError::config(key, format!("cannot read vocabulary {path}: {e}")))?;
    if !meta.is_file() {
        return Err(error("not a regular file".into()));
    }
    let too_large = || error(format!("larger than {MAX_VOCABULARY_BYTES} bytes"));
    if meta.len() > MAX_VOCABULARY_BYTES {
        return Err(too_large());
    }
    let file = std::fs::File::open(path)
        .map_err(|e| OperatorError::config(key, format!("cannot read vocabulary {path}: {e}")))?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_VOCABULARY_BYTES + 1).read_to_end(&mut bytes).map_err(|e| error(e.to_string()))?;
    if bytes.len() as u64 > MAX_VOCABULARY_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

impl Vocabulary {
    /// Loads the tokens (id = position); errors name `key`, and for a file its path and line.
    pub fn load(&self, key: &str) -> Result<VocabularyMap, OperatorError> {
        let mut map = VocabularyMap::default();
        let mut add = |token: &[u8], place: &dyn Fn() -> String| -> Result<(), OperatorError> {
            if token.is_empty() {
                return Err(OperatorError::config(key, format!("{}: empty token", place())));
            }
            let next = map.len() as u64;
            if let Some(first) = map.insert(token.to_vec(), next) {
                return Err(OperatorError::config(
                    key,
                    format!("{}: token `{}` already has id {first}", place(), String::from_utf8_lossy(token)),
                ));
            }
            Ok(())
        };
        match self {
            Vocabulary::Inline(tokens) => {
                for (i, t) in tokens.iter().enumerate() {
                    add(t.as_bytes(), &|| format!("item {i}"))?;
                }
            }
            Vocabulary::File(path) => {
                let bytes = read_vocabulary_file(key, path)?;
                for (i, line) in file_tokens(key, path, &bytes)?.into_iter().enumerate() {
                    add(line, &|| format!("{path}:{}", i + 1))?;
                }
            }
        }
        if map.is_empty() {
            return Err(OperatorError::config(key, "the vocabulary is empty"));
        }
        Ok(map)
    }

    /// The same vocabulary with a file's tokens read into the spec ([`Vocabulary::Inline`]),
    /// so that a spec recorded with a model does not depend on the file, its later
    /// edits or the working directory. The tokens must be UTF-8 text; errors name
    /// `key`, the file and the line.
    pub fn inlined(&self, key: &str) -> Result<Vocabulary, OperatorError> {
        let Vocabulary::File(path) = self else { return Ok(self.clone()) };
        let bytes = read_vocabulary_file(key, path)?;
        let mut tokens = Vec::new();
        for (i, line) in file_tokens(key, path, &bytes)?.into_iter().enumerate() {
            let token = std::str::from_utf8(line).map_err(|_| {
                OperatorError::config(
                    key,
                    format!("{path}:{}: the token is not UTF-8 text (a model keeps its vocabulary as text)", i + 1),
                )
            })?;
            tokens.push(token.to_string());
        }
        Ok(Vocabulary::Inline(tokens))
    }
}

/// The tokens of a vocabulary file's `bytes`, one per line in id order (a trailing `\r`
/// dropped), each at most [`MAX_TOKEN_BYTES`]; errors name `key`, `path` and the line.
fn file_tokens<'a>(key: &str, path: &str, bytes: &'a [u8]) -> Result<Vec<&'a [u8]>, OperatorError> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if body.is_empty() {
        return Err(OperatorError::config(key, format!("{path}: the vocabulary is empty")));
    }
    let mut tokens = Vec::new();
    for (i, line) in body.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() > MAX_TOKEN_BYTES {
            return Err(OperatorError::config(
                key,
                format!("{path}:{}: a token of {} bytes is longer than {MAX_TOKEN_BYTES}", i + 1, line.len()),
            ));
        }
        tokens.push(line);
    }
    Ok(tokens)
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
    /// (`Batch::sequences`) for models with sequence inputs. All `none` lists of
    /// a spec must have the same number of items on every line (they describe
    /// the same events); a line where they differ is malformed.
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
    /// [`Batch::groups`] entry is the [`group_key`] of its value. Not a feature by itself
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

fn one_byte(key: &str, s: &str) -> Result<u8, OperatorError> {
    match s.as_bytes() {
        [b] => Ok(*b),
        b"\\t" => Ok(b'\t'),
        _ => Err(OperatorError::config(key, format!("`{s}` is not a single-byte delimiter"))),
    }
}

impl FeatureSpec {
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

    /// The lists kept as sequence fields (`pooling = "none"`) with their index in `list`.
    pub fn sequence_lists(&self) -> impl Iterator<Item = (usize, &ListSpec)> {
        self.list.iter().enumerate().filter(|(_, l)| l.pooling == Pooling::None)
    }

    /// Parses a TOML spec and validates it; errors name the key (TOML errors
    /// also give the line and column).
    pub fn from_toml(text: &str) -> Result<Self, OperatorError> {
        Self::from_toml_in(text, None)
    }

    /// As [`FeatureSpec::from_toml`], with relative vocabulary file paths
    /// taken relative to `base` (the spec file's folder).
    pub fn from_toml_in(text: &str, base: Option<&std::path::Path>) -> Result<Self, OperatorError> {
        let mut spec: FeatureSpec = toml::from_str(text).map_err(|e| {
            let msg = e.message().to_string();
            let key = msg
                .split('`')
                .nth(1)
                .filter(|_| msg.starts_with("unknown field") || msg.starts_with("missing field"))
                .unwrap_or("spec")
                .to_string();
            OperatorError::config(key, e.to_string())
        })?;
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

    /// The names [`FeatureSpec::preset`] knows.
    pub const PRESETS: [&'static str; 6] = ["criteo", "avazu", "elm", "elm_y_long", "elm_dien", "taobao_ad"];

    /// A preset by name (`-` and `_` are interchangeable): `criteo`, `avazu`,
    /// `elm`, `elm_y_long` (elm with 8× longer lists), `elm_dien` (elm whose
    /// shop, item and category histories stay sequences for `dien`) or
    /// `taobao_ad`, with `buckets` rows per table and lists cut at `max_len`
    /// items (the elm presets use 50 and elm_y_long 400 regardless).
    pub fn preset(name: &str, buckets: u64, max_len: usize) -> Option<Self> {
        match name.replace('-', "_").as_str() {
            "criteo" => Some(FeatureSpec::criteo(buckets)),
            "avazu" => Some(FeatureSpec::avazu(buckets)),
            "elm" => Some(FeatureSpec::elm(buckets, 50)),
            "elm_y_long" => Some(FeatureSpec::elm(buckets, 400)),
            "elm_dien" => Some(FeatureSpec::elm_dien(buckets)),
            "taobao_ad" => Some(FeatureSpec::taobao_ad(buckets, max_len)),
            _ => None,
        }
    }

    /// Criteo Kaggle / 1TB lines: TAB-separated `label, I1..I13, C1..C26`, no
    /// header; counts dense with `ln(1 + max(x, 0))`, categories hashed (as
    /// bytes, so ids differ from the dedicated Criteo reader's, which parses the hex).
    pub fn criteo(buckets: u64) -> Self {
        let ints: Vec<String> = (1..=CRITEO_NUM_DENSE).map(|i| format!("I{i}")).collect();
        let cats: Vec<String> = (1..=CRITEO_NUM_SPARSE).map(|i| format!("C{i}")).collect();
        FeatureSpec {
            delimiter: "\\t".into(),
            header: false,
            columns: std::iter::once("label".to_string())
                .chain(ints.iter().cloned())
                .chain(cats.iter().cloned())
                .collect(),
            label: LabelSpec { column: "label".into() },
            dense: ints.iter().map(|c| DenseSpec::new(c, true)).collect(),
            numeric_list: Vec::new(),
            categorical: cats.iter().map(|c| CategoricalSpec::hashed(c, buckets)).collect(),
            list: Vec::new(),
            user: None,
        }
    }

    /// Avazu CSV (with its header): `click` is the label, `id` is not a
    /// feature, and the 22 other columns (`hour` as its full `YYMMDDHH` value)
    /// are hashed categorical fields.
    pub fn avazu(buckets: u64) -> Self {
        FeatureSpec {
            delimiter: ",".into(),
            header: true,
            columns: AVAZU_COLUMNS.iter().map(|s| s.to_string()).collect(),
            label: LabelSpec { column: "click".into() },
            dense: Vec::new(),
            numeric_list: Vec::new(),
            categorical: AVAZU_COLUMNS[2..].iter().map(|c| CategoricalSpec::hashed(c, buckets)).collect(),
            list: Vec::new(),
            user: None,
        }
    }

    /// Checks the spec; errors name the key.
    pub fn validate(&self) -> Result<(), OperatorError> {
        one_byte("delimiter", &self.delimiter)?;
        let mut seen = std::collections::HashSet::new();
        for (i, c) in self.columns.iter().enumerate() {
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
            if let Some((lo, hi)) = d.clamp {
                if lo.partial_cmp(&hi) != Some(std::cmp::Ordering::Less) && lo != hi {
                    return Err(OperatorError::config(format!("dense[{i}].clamp"), format!("{lo} > {hi}")));
                }
            }
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
        if self.shape().1 == 0 && self.shape().0 == 0 {
            return Err(OperatorError::config("dense/categorical", "the spec defines no feature"));
        }
        Ok(())
    }

    /// The preset for Ele.me ("elm") lines: the DeepRec/AtRec column list, ids and
    /// codes hashed, prices and rates dense (`log1p`), the ten id lists hashed and
    /// sum-pooled (at most `max_len` items), `price_list` and `timediff_list` averaged.
    pub fn elm(buckets: u64, max_len: usize) -> Self {
        let columns: Vec<String> = ELM_COLUMNS.iter().map(|s| s.to_string()).collect();
        let dense_cols = ["avg_price", "ctr_30", "ord_30", "total_amt_30", "rank_7", "rank_30", "rank_90", "times"];
        let categorical_cols = [
            "user_id",
            "gender",
            "visit_city",
            "is_supervip",
            "shop_id",
            "item_id",
            "city_id",
            "district_id",
            "shop_aoi_id",
            "shop_geohash_6",
            "shop_geohash_12",
            "brand_id",
            "category_1_id",
            "merge_standard_food_id",
            "hours",
            "time_type",
            "weekdays",
            "geohash12",
        ];
        let list_cols = [
            "shop_id_list",
            "item_id_list",
            "category_1_id_list",
            "merge_standard_food_id_list",
            "brand_id_list",
            "shop_aoi_id_list",
            "shop_geohash6_list",
            "hours_list",
            "time_type_list",
            "weekdays_list",
        ];
        FeatureSpec {
            delimiter: ",".into(),
            header: false,
            columns,
            label: LabelSpec { column: "clicked".into() },
            dense: dense_cols.iter().map(|c| DenseSpec::new(c, true)).collect(),
            numeric_list: ["price_list", "timediff_list"]
                .iter()
                .map(|c| NumericListSpec { column: c.to_string(), delimiter: ";".into(), reduce: ListReduce::Mean })
                .collect(),
            categorical: categorical_cols.iter().map(|c| CategoricalSpec::hashed(c, buckets)).collect(),
            list: list_cols
                .iter()
                .map(|c| ListSpec {
                    column: c.to_string(),
                    delimiter: ";".into(),
                    max_len,
                    buckets,
                    pooling: Pooling::Sum,
                    target: None,
                })
                .collect(),
            user: Some("user_id".into()),
        }
    }
}

impl FeatureSpec {
    /// The elm preset with the shop, item and category histories kept as
    /// sequences (`pooling = "none"`, at most 50 items, the first ones) whose
    /// targets are the candidate's `shop_id`, `item_id` and `category_1_id`;
    /// the other lists stay sum-pooled. The histories of an elm line are one
    /// list of events, so the three sequences always have one length.
    pub fn elm_dien(buckets: u64) -> Self {
        let mut spec = FeatureSpec::elm(buckets, 50);
        for (list, target) in
            [("shop_id_list", "shop_id"), ("item_id_list", "item_id"), ("category_1_id_list", "category_1_id")]
        {
            let l = spec.list.iter_mut().find(|l| l.column == list).expect("an elm list");
            l.pooling = Pooling::None;
            l.target = Some(target.into());
        }
        spec
    }

    /// The Taobao display-ad joined CSV (FuxiCTR's `train_sample.csv` layout,
    /// with its header): `clk` is the label, `price` the one dense feature,
    /// the ad and user-profile ids categorical (an empty profile field is an
    /// absent value), and `click_sequence` a `^`-separated list of at most
    /// `max_len` ids. `time_stamp` is not a feature.
    pub fn taobao_ad(buckets: u64, max_len: usize) -> Self {
        let categorical_cols = [
            "userid",
            "adgroup_id",
            "pid",
            "cate_id",
            "campaign_id",
            "customer",
            "brand",
            "cms_segid",
            "cms_group_id",
            "final_gender_code",
            "age_level",
            "pvalue_level",
            "shopping_level",
            "occupation",
            "new_user_class_level",
        ];
        FeatureSpec {
            delimiter: ",".into(),
            header: true,
            columns: TAOBAO_AD_COLUMNS.iter().map(|s| s.to_string()).collect(),
            label: LabelSpec { column: "clk".into() },
            dense: vec![DenseSpec::new("price", true)],
            numeric_list: Vec::new(),
            categorical: categorical_cols.iter().map(|c| CategoricalSpec::hashed(c, buckets)).collect(),
            list: vec![ListSpec {
                column: "click_sequence".into(),
                delimiter: "^".into(),
                max_len,
                buckets,
                pooling: Pooling::Sum,
                target: None,
            }],
            user: Some("userid".into()),
        }
    }
}

/// Dense (integer) features of a Criteo line, `I1..I13`.
pub const CRITEO_NUM_DENSE: usize = 13;
/// Sparse (categorical) features of a Criteo line, `C1..C26`.
pub const CRITEO_NUM_SPARSE: usize = 26;

/// The 24 columns of a labeled Avazu CSV, in order.
pub const AVAZU_COLUMNS: [&str; 24] = [
    "id",
    "click",
    "hour",
    "C1",
    "banner_pos",
    "site_id",
    "site_domain",
    "site_category",
    "app_id",
    "app_domain",
    "app_category",
    "device_id",
    "device_ip",
    "device_model",
    "device_type",
    "device_conn_type",
    "C14",
    "C15",
    "C16",
    "C17",
    "C18",
    "C19",
    "C20",
    "C21",
];

/// The 19 columns of the joined Taobao display-ad CSV, in order.
pub const TAOBAO_AD_COLUMNS: [&str; 19] = [
    "clk",
    "time_stamp",
    "userid",
    "adgroup_id",
    "pid",
    "cate_id",
    "campaign_id",
    "customer",
    "brand",
    "price",
    "cms_segid",
    "cms_group_id",
    "final_gender_code",
    "age_level",
    "pvalue_level",
    "shopping_level",
    "occupation",
    "new_user_class_level",
    "click_sequence",
];

/// The 39 columns of the Ele.me dataset, in order.
pub const ELM_COLUMNS: [&str; 39] = [
    "clicked",
    "user_id",
    "gender",
    "visit_city",
    "avg_price",
    "is_supervip",
    "ctr_30",
    "ord_30",
    "total_amt_30",
    "shop_id",
    "item_id",
    "city_id",
    "district_id",
    "shop_aoi_id",
    "shop_geohash_6",
    "shop_geohash_12",
    "brand_id",
    "category_1_id",
    "merge_standard_food_id",
    "rank_7",
    "rank_30",
    "rank_90",
    "shop_id_list",
    "item_id_list",
    "category_1_id_list",
    "merge_standard_food_id_list",
    "brand_id_list",
    "price_list",
    "shop_aoi_id_list",
    "shop_geohash6_list",
    "timediff_list",
    "hours_list",
    "time_type_list",
    "weekdays_list",
    "times",
    "hours",
    "time_type",
    "weekdays",
    "geohash12",
];

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
    /// of every categorical column, read as numbers, in the lines given: what fitting
    /// learns from. A line without exactly the spec's columns, the header and a value that
    /// is not a finite number are passed over.
    pub fn sample_values<'a>(&self, lines: impl IntoIterator<Item = &'a [u8]>) -> SampleValues {
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
        for line in lines {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() || (self.header && line.starts_with(self.columns[0].as_bytes())) {
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

/// Most columns a spec line may have.
const MAX_COLUMNS: usize = 256;
/// Most `pooling = "none"` lists in one spec.
const MAX_SEQUENCES: usize = 16;

impl LineFormat for SpecFormat {
    fn shape(&self) -> (usize, usize) {
        self.spec.shape()
    }

    fn num_sequences(&self) -> usize {
        self.num_sequences
    }

    fn is_header(&self, line: &[u8]) -> bool {
        self.spec.header && line.starts_with(self.spec.columns[0].as_bytes())
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

    fn tiny() -> FeatureSpec {
        FeatureSpec {
            delimiter: ",".into(),
            header: true,
            columns: ["y", "price", "prices", "user", "items"].iter().map(|s| s.to_string()).collect(),
            label: LabelSpec { column: "y".into() },
            dense: vec![DenseSpec { clamp: Some((0.0, 100.0)), ..DenseSpec::new("price", true) }],
            numeric_list: vec![NumericListSpec {
                column: "prices".into(),
                delimiter: ";".into(),
                reduce: ListReduce::Mean,
            }],
            categorical: vec![CategoricalSpec::hashed("user", 1000)],
            list: vec![ListSpec {
                column: "items".into(),
                delimiter: ";".into(),
                max_len: 2,
                buckets: 50,
                pooling: Pooling::Sum,
                target: None,
            }],
            user: Some("user".into()),
        }
    }

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

    const NUMERIC: &str = r#"
delimiter = ","
header = true
columns = ["y", "age", "price", "hour"]
label = { column = "y" }
dense = [
  { column = "age", scale = "standardize" },
  { column = "price", log1p = true, scale = "min_max" },
  { column = "hour", scale = "min_max", center = 0.0, width = 24.0 },
]

[[categorical]]
column = "age"
buckets = 4
encoding = "quantile"

[[categorical]]
column = "hour"
buckets = 4
encoding = "bucketize"
boundaries = [6.0, 12.0, 18.0]
"#;

    #[test]
    fn scales_and_buckets_are_learned_from_a_sample_and_applied_as_computed_by_hand() {
        let mut spec = FeatureSpec::from_toml(NUMERIC).unwrap();
        assert_eq!(spec.unfitted(), ["dense[0].center", "dense[1].center", "categorical[0].boundaries"]);
        let e = SpecFormat::new(spec.clone(), 1).unwrap_err().to_string();
        assert!(e.contains("dense[0].center") && e.contains("learned from the training data"), "{e}");
        let lines = ["y,age,price,hour", "0,20,0,1", "1,30,e,7", "0,40,3,13", "1,50,7,23", "0,bad,1,", "too,few"];
        let sample = spec.sample_values(lines.iter().map(|l| l.as_bytes()));
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
    fn taobao_ad_preset_parses_the_documented_row() {
        let spec = FeatureSpec::taobao_ad(1000, 20);
        spec.validate().unwrap();
        let f = SpecFormat::new(spec, 4).unwrap();
        assert_eq!(f.shape(), (1, 16));
        let mut b = Batch::new(1, 16);
        assert!(f.is_header(b"clk,time_stamp,userid,adgroup_id,pid,cate_id,campaign_id,customer,brand,price,cms_segid,cms_group_id,final_gender_code,age_level,pvalue_level,shopping_level,occupation,new_user_class_level,click_sequence"));
        f.parse(
            b"0,2017-05-06 00:00:00,874257,172298,430548_1007,5443,160194,864,339907,3.9,0,3,2,3,,3,0,,170301^573514",
            &mut b,
        )
        .unwrap();
        b.check().unwrap();
        assert_eq!(b.labels, [0.0]);
        assert!((b.dense[0] - 4.9f32.ln()).abs() < 1e-6);
        assert!(b.sparse[11].bag(0).is_empty(), "empty pvalue_level is absent");
        assert!(b.sparse[14].bag(0).is_empty(), "empty new_user_class_level is absent");
        assert_eq!(b.sparse[15].bag(0).len(), 2, "two clicked ids");
        assert_eq!(b.groups, [group_key(b"874257")], "userid is the user column");
    }

    const TOML: &str = r#"
delimiter = ","
header = false
columns = ["y", "city", "items", "cats", "cat"]
label = { column = "y" }

[[categorical]]
column = "city"
buckets = 10
encoding = "vocabulary"
vocabulary = ["paris", "lyon", "nice"]
oov_buckets = 2

[[categorical]]
column = "cat"
buckets = 20

[[list]]
column = "items"
delimiter = ";"
max_len = 4
buckets = 100
pooling = "mean"

[[list]]
column = "cats"
delimiter = ";"
max_len = 3
buckets = 20
pooling = "none"
target = "cat"
"#;

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

    #[test]
    fn vocabulary_files_name_path_and_line() {
        let dir = std::env::temp_dir().join(format!("tiderec-vocab-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.txt");
        std::fs::write(&good, "paris\r\nlyon\nnice\n").unwrap();
        let map = Vocabulary::File(good.display().to_string()).load("k").unwrap();
        assert_eq!((map[&b"paris"[..]], map[&b"lyon"[..]], map[&b"nice"[..]]), (0, 1, 2));
        let bad = dir.join("bad.txt");
        std::fs::write(&bad, "a\nb\n\nc\n").unwrap();
        let e = Vocabulary::File(bad.display().to_string()).load("k").unwrap_err().to_string();
        assert!(e.contains(&format!("{}:3", bad.display())) && e.contains("empty"), "{e}");
        std::fs::write(&bad, "a\nb\na\n").unwrap();
        let e = Vocabulary::File(bad.display().to_string()).load("k").unwrap_err().to_string();
        assert!(e.contains(&format!("{}:3", bad.display())) && e.contains("already has id 0"), "{e}");
        let missing = dir.join("missing.txt").display().to_string();
        let e = Vocabulary::File(missing.clone()).load("categorical[0].vocabulary").unwrap_err().to_string();
        assert!(e.contains(&missing) && e.contains("categorical[0].vocabulary"), "{e}");
        // A device, a file past the size bound and a token past the length bound are refused.
        let e = Vocabulary::File("/dev/zero".into()).load("k").unwrap_err().to_string();
        assert!(e.contains("/dev/zero") && e.contains("not a regular file"), "{e}");
        let huge = dir.join("huge.txt");
        std::fs::File::create(&huge).unwrap().set_len(MAX_VOCABULARY_BYTES + 1).unwrap();
        let e = Vocabulary::File(huge.display().to_string()).load("k").unwrap_err().to_string();
        assert!(e.contains("huge.txt") && e.contains("larger than"), "{e}");
        std::fs::write(&bad, format!("a\n{}\n", "x".repeat(MAX_TOKEN_BYTES + 1))).unwrap();
        let e = Vocabulary::File(bad.display().to_string()).load("k").unwrap_err().to_string();
        assert!(e.contains(&format!("{}:2", bad.display())) && e.contains("longer than"), "{e}");
        // A spec whose vocabulary file is missing fails validation before any work.
        let text = TOML.replace("[\"paris\", \"lyon\", \"nice\"]", &format!("{:?}", good.display().to_string()));
        FeatureSpec::from_toml(&text).unwrap();
        let text = TOML.replace("[\"paris\", \"lyon\", \"nice\"]", &format!("{missing:?}"));
        assert!(FeatureSpec::from_toml(&text).unwrap_err().to_string().contains("missing.txt"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn every_preset_round_trips_through_toml() {
        for name in FeatureSpec::PRESETS {
            let spec = FeatureSpec::preset(name, 1000, 20).unwrap();
            spec.validate().unwrap();
            let text = spec.to_toml();
            assert_eq!(FeatureSpec::from_toml(&text).unwrap(), spec, "{name}:\n{text}");
        }
        assert!(FeatureSpec::preset("elm-y-long", 10, 1).unwrap().list[0].max_len == 400);
        assert!(FeatureSpec::preset("nope", 10, 1).is_none());
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
