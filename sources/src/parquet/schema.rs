//! The schema of a featurized Parquet dataset and its JSON description.
//!
//! A converted file holds the featurized [`Batch`](tiderec_records::Batch),
//! one sample per row:
//!
//! | column | Arrow type | meaning |
//! |---|---|---|
//! | `label` | `Float32`, not null | the label (0 or 1) |
//! | one per dense feature | `Float32` | the featurized value (after `log1p`, clamping, …); null reads as 0 |
//! | one per single-valued sparse field | `UInt64`, nullable | the row id, already bucketed; null = absent (empty bag) |
//! | one per multi-valued sparse field | `List<UInt64>` | the bag's row ids; null or empty = empty bag |
//! | one per behaviour-sequence field | `List<UInt64>` | the history's row ids, oldest first, in its table's id space; null = empty |
//! | `_group`, when the description has [`groups`](SchemaDescription::groups) | `UInt64`, not null | the row's user ([`group_key`](tiderec_records::metrics::group_key)), for per-user metrics; not a feature |
//!
//! The file's key-value metadata holds a [`SchemaDescription`] as JSON under
//! [`METADATA_KEY`]: the source format, the column names in `Batch` order,
//! the kind of each sparse field and its table size, and the hashing seed.
//! Training reads only this, so it needs neither the original spec nor the
//! raw files.
//!
//! # Invariants
//!
//! * A valid description ([`SchemaDescription::validate`]) has
//!   `num_dense == dense.len()`, unique column names (the label included) and
//!   positive table sizes; every sequence names a sparse field as its
//!   table and as its target.
//! * Every id stored in a sequence column is below its table's size, and the
//!   sequences of one row have equal lengths (checked when reading).
//! * Every id stored in a sparse column is below that field's `table_size`.
//! * A line source's input ([`LineSource::file_bytes`]) adds up to at most
//!   [`MAX_INPUT_BYTES`] (1 PiB, far beyond any real input, so a damaged size
//!   is refused rather than cut into more shuffle blocks than memory holds),
//!   computed without overflow; every `_line_start` lies below it.
//! * Column order in a file does not matter: columns are matched by name, and
//!   other columns are ignored.

pub use crate::error::DescriptionError;
use arrow_schema::{DataType, Field, Schema};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use tiderec_records::spec::FeatureSpec;
use tiderec_records::spec::{AVAZU_COLUMNS, CRITEO_NUM_DENSE, CRITEO_NUM_SPARSE};

/// Key of the JSON [`SchemaDescription`] in a file's key-value metadata.
pub const METADATA_KEY: &str = "tiderec.schema";

/// Version of the description format written by this crate.
pub const SCHEMA_VERSION: u32 = 1;

/// Name of the label column.
pub const LABEL_COLUMN: &str = "label";

/// Name of the column holding each row's [`LineSource`] position.
pub const LINE_START_COLUMN: &str = "_line_start";

/// The most bytes the input of a line source may have, over all its files: 1 PiB (a real
/// input is a few terabytes; positions must also fit the `INT64` Parquet stores them as).
pub const MAX_INPUT_BYTES: u64 = 1 << 50;

/// Name of the column holding each row's user group key (`Batch::groups`), when the
/// description has [`groups`](SchemaDescription::groups).
pub const GROUP_COLUMN: &str = "_group";

/// Where the rows of a dataset converted from line files (Criteo, Avazu, CSV, …) came
/// from, so that replay splits them across workers exactly as the line readers split
/// the raw files. The [`LINE_START_COLUMN`] (`UInt64`, not null) holds, for every row,
/// the byte offset of its source line's first byte in the concatenation of the input
/// files: non-decreasing over the dataset's rows in file order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineSource {
    /// Byte length of each input file, in reading order.
    pub file_bytes: Vec<u64>,
}

impl LineSource {
    /// The bytes of all input files; `None` when they add up past `u64::MAX`.
    pub fn total_bytes(&self) -> Option<u64> {
        self.file_bytes.iter().try_fold(0u64, |total, &len| total.checked_add(len))
    }

    /// Checks that the input adds up to at most [`MAX_INPUT_BYTES`].
    pub fn validate(&self) -> Result<(), DescriptionError> {
        match self.total_bytes() {
            Some(total) if total <= MAX_INPUT_BYTES => Ok(()),
            total => Err(DescriptionError::InputBytes {
                total: total.map_or_else(|| "over 2^64".to_string(), |t| t.to_string()),
                files: self.file_bytes.len(),
                max: MAX_INPUT_BYTES,
            }),
        }
    }
}

/// How a sparse field is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SparseKind {
    /// At most one id per sample: nullable `UInt64`.
    Single,
    /// Any number of ids per sample: `List<UInt64>`.
    List,
}

/// One sparse field of the description.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SparseColumn {
    /// Column name.
    pub name: String,
    /// Single- or multi-valued.
    pub kind: SparseKind,
    /// Rows of the field's embedding table; every stored id is below it.
    pub table_size: u64,
}

/// One behaviour-sequence field of the description (DIEN-style data).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SequenceColumn {
    /// Column name.
    pub name: String,
    /// The sparse field whose table the history ids index (and whose size bounds them).
    pub table: usize,
    /// The sparse field holding the target the history is attended against.
    pub target: usize,
    /// The longest history stored, when the writer bounded it (a spec list's `max_len`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_len: Option<usize>,
}

/// Which ids of a behaviour sequence longer than its bound are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// The first ones, as a spec list's line parser keeps its first `max_len` tokens.
    First,
    /// The last ones (the most recent), as the behaviour formats keep a history's latest events.
    Last,
}

impl SequenceColumn {
    /// How many ids of this column a model whose sequences hold at most `model_max_len` reads,
    /// and which of a longer sequence, as the line format the rows were made from cuts it: a
    /// column with a recorded `max_len` (a spec list) keeps its first ids, at most that many
    /// (and at most `model_max_len`); one without (a behaviour history: `amazon-dien`, …) keeps
    /// its last `model_max_len`. `None`: nothing bounds it.
    pub fn cut(&self, model_max_len: Option<usize>) -> Option<(usize, Keep)> {
        match (self.max_len, model_max_len) {
            (Some(n), m) => Some((m.map_or(n, |m| n.min(m)), Keep::First)),
            (None, Some(m)) => Some((m, Keep::Last)),
            (None, None) => None,
        }
    }
}

/// What a featurized Parquet dataset holds; stored as JSON under [`METADATA_KEY`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaDescription {
    /// [`SCHEMA_VERSION`].
    pub version: u32,
    /// The raw format the rows were converted from (`criteo`, `avazu`, `csv`, or another writer's name).
    pub format: String,
    /// Seed of the per-field hashing at conversion time, when known.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Label column name.
    pub label: String,
    /// Number of dense features (`dense.len()`).
    pub num_dense: usize,
    /// Dense column names, in `Batch` order.
    pub dense: Vec<String>,
    /// Sparse fields, in `Batch` order.
    pub sparse: Vec<SparseColumn>,
    /// Behaviour-sequence fields, in `Batch` order (none for most formats).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sequences: Vec<SequenceColumn>,
    /// The input files' sizes when rows carry their source positions ([`LineSource`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<LineSource>,
    /// Whether rows carry their user's group key in [`GROUP_COLUMN`] (the source records
    /// name a user): read back into `Batch::groups`, for per-user metrics.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub groups: bool,
}

/// The Avazu sparse field names: the 21 categorical columns of the Kaggle
/// header after `hour` ([`AVAZU_COLUMNS`]), then the hour of day as a categorical field.
pub fn avazu_sparse_names() -> impl Iterator<Item = String> {
    AVAZU_COLUMNS[3..].iter().map(|s| s.to_string()).chain(std::iter::once("hour_of_day".to_string()))
}

impl SchemaDescription {
    fn new(format: &str, seed: u64, dense: Vec<String>, sparse: Vec<SparseColumn>) -> Self {
        SchemaDescription {
            version: SCHEMA_VERSION,
            format: format.into(),
            seed: Some(seed),
            label: LABEL_COLUMN.into(),
            num_dense: dense.len(),
            dense,
            sparse,
            sequences: Vec::new(),
            lines: None,
            groups: false,
        }
    }

    fn singles(names: impl IntoIterator<Item = String>, table_sizes: &[u64]) -> Vec<SparseColumn> {
        names
            .into_iter()
            .zip(table_sizes)
            .map(|(name, &table_size)| SparseColumn { name, kind: SparseKind::Single, table_size })
            .collect()
    }

    /// Criteo: dense `I1..I13`, single-valued `C1..C26` with these table sizes.
    pub fn criteo(table_sizes: &[u64], seed: u64) -> Self {
        let dense = (1..=CRITEO_NUM_DENSE).map(|i| format!("I{i}")).collect();
        let sparse = Self::singles((1..=CRITEO_NUM_SPARSE).map(|i| format!("C{i}")), table_sizes);
        Self::new("criteo", seed, dense, sparse)
    }

    /// Avazu: dense `hour` (hour of day / 23), the single-valued fields of [`avazu_sparse_names`].
    pub fn avazu(table_sizes: &[u64], seed: u64) -> Self {
        let sparse = Self::singles(avazu_sparse_names(), table_sizes);
        Self::new("avazu", seed, vec!["hour".into()], sparse)
    }

    /// Behaviour data (`amazon-dien`, `taobao-behavior`, `synthetic-behavior`):
    /// single-valued `user`, `item`, `category` with these table sizes, and the
    /// sequences `history_items` (item table) and `history_categories`
    /// (category table), whose targets are `item` and `category`.
    pub fn behavior(format: &str, table_sizes: &[u64], seed: u64) -> Self {
        let names = ["user", "item", "category"].map(String::from);
        let mut d = Self::new(format, seed, Vec::new(), Self::singles(names, table_sizes));
        d.sequences = vec![
            SequenceColumn { name: "history_items".into(), table: 1, target: 1, max_len: None },
            SequenceColumn { name: "history_categories".into(), table: 2, target: 2, max_len: None },
        ];
        d
    }

    /// A feature spec: its `dense` then `numeric_list` columns; its `categorical`
    /// (single) then pooled `list` (list) columns, with the spec's bucket counts;
    /// its `pooling = "none"` lists as sequences reading their target's table; user
    /// groups when the spec names a `user` column.
    pub fn from_spec(spec: &FeatureSpec, seed: u64) -> Self {
        let dense =
            spec.dense.iter().map(|d| d.column.clone()).chain(spec.numeric_list.iter().map(|n| n.column.clone()));
        let single = spec.categorical.iter().map(|c| SparseColumn {
            name: c.column.clone(),
            kind: SparseKind::Single,
            table_size: c.buckets,
        });
        let list = spec.pooled_lists().map(|(_, l)| SparseColumn {
            name: l.column.clone(),
            kind: SparseKind::List,
            table_size: l.buckets,
        });
        let mut d = Self::new("csv", seed, dense.collect(), single.chain(list).collect());
        d.sequences = spec
            .sequence_lists()
            .zip(spec.sequence_targets())
            .map(|((_, l), target)| SequenceColumn {
                name: l.column.clone(),
                table: target,
                target,
                max_len: Some(l.max_len),
            })
            .collect();
        d.groups = spec.user.is_some();
        d
    }

    /// `(dense features, sparse fields)` of the samples.
    pub fn shape(&self) -> (usize, usize) {
        (self.num_dense, self.sparse.len())
    }

    /// Table size of each sparse field, in field order.
    pub fn table_sizes(&self) -> Vec<u64> {
        self.sparse.iter().map(|s| s.table_size).collect()
    }

    /// Whether samples of `other` fit the same model: same shape, sparse kinds and table sizes (names may differ).
    pub fn same_layout(&self, other: &SchemaDescription) -> bool {
        self.shape() == other.shape()
            && self
                .sequences
                .iter()
                .map(|s| (s.table, s.target))
                .eq(other.sequences.iter().map(|s| (s.table, s.target)))
            && self.sparse.iter().zip(&other.sparse).all(|(a, b)| a.kind == b.kind && a.table_size == b.table_size)
    }

    /// Checks the [invariants](self); the error names the column or count at fault.
    pub fn validate(&self) -> Result<(), DescriptionError> {
        if self.version != SCHEMA_VERSION {
            return Err(DescriptionError::Version { version: self.version, supported: SCHEMA_VERSION });
        }
        if self.num_dense != self.dense.len() {
            return Err(DescriptionError::DenseCount { num_dense: self.num_dense, named: self.dense.len() });
        }
        if self.dense.is_empty() && self.sparse.is_empty() {
            return Err(DescriptionError::NoFeatures);
        }
        let mut seen = HashSet::new();
        if self.lines.is_some() {
            seen.insert(LINE_START_COLUMN);
        }
        if self.groups {
            seen.insert(GROUP_COLUMN);
        }
        let names = std::iter::once(&self.label)
            .chain(&self.dense)
            .chain(self.sparse.iter().map(|s| &s.name))
            .chain(self.sequences.iter().map(|s| &s.name));
        for name in names {
            if !seen.insert(name.as_str()) {
                return Err(DescriptionError::DuplicateColumn { column: name.clone() });
            }
        }
        if let Some(lines) = &self.lines {
            lines.validate()?;
        }
        if let Some(s) = self.sparse.iter().find(|s| s.table_size == 0) {
            return Err(DescriptionError::EmptyTable { column: s.name.clone() });
        }
        let fields = self.sparse.len();
        if let Some(s) = self.sequences.iter().find(|s| s.table >= fields || s.target >= fields) {
            return Err(DescriptionError::SequenceField {
                column: s.name.clone(),
                table: s.table,
                target: s.target,
                fields,
            });
        }
        Ok(())
    }

    /// The JSON text stored under [`METADATA_KEY`].
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a description always serializes")
    }

    /// Parses and [validates](Self::validate) a description.
    pub fn from_json(text: &str) -> Result<Self, DescriptionError> {
        let d: SchemaDescription =
            serde_json::from_str(text).map_err(|source| DescriptionError::Json { key: METADATA_KEY, source })?;
        d.validate()?;
        Ok(d)
    }

    /// The Arrow type a column of this description must have.
    pub fn column_types(&self) -> Vec<(&str, DataType)> {
        let mut cols = vec![(self.label.as_str(), DataType::Float32)];
        cols.extend(self.dense.iter().map(|d| (d.as_str(), DataType::Float32)));
        cols.extend(self.sparse.iter().map(|s| (s.name.as_str(), s.kind.data_type())));
        cols.extend(self.sequences.iter().map(|s| (s.name.as_str(), SparseKind::List.data_type())));
        cols
    }

    /// The Arrow schema written by [`ParquetWriter`](super::ParquetWriter), with the description in its metadata.
    pub fn arrow_schema(&self) -> Schema {
        let fields: Vec<Field> = self
            .column_types()
            .into_iter()
            .enumerate()
            .map(|(i, (name, ty))| {
                // Label and dense values are never null; sparse values may be.
                Field::new(name, ty, i > self.num_dense)
            })
            .chain(self.groups.then(|| Field::new(GROUP_COLUMN, DataType::UInt64, false)))
            .chain(self.lines.is_some().then(|| Field::new(LINE_START_COLUMN, DataType::UInt64, false)))
            .collect();
        Schema::new_with_metadata(fields, HashMap::from([(METADATA_KEY.to_string(), self.to_json())]))
    }
}

impl SparseKind {
    /// `UInt64` or `List<UInt64>`.
    pub fn data_type(self) -> DataType {
        match self {
            SparseKind::Single => DataType::UInt64,
            SparseKind::List => DataType::List(std::sync::Arc::new(Field::new_list_field(DataType::UInt64, true))),
        }
    }

    /// Whether a column of type `ty` can be read as this kind (a list's item field name does not matter).
    pub fn accepts(self, ty: &DataType) -> bool {
        match (self, ty) {
            (SparseKind::Single, DataType::UInt64) => true,
            (SparseKind::List, DataType::List(item)) => item.data_type() == &DataType::UInt64,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate_and_round_trip_through_json() {
        let c = SchemaDescription::criteo(&[7; 26], 3);
        c.validate().unwrap();
        assert_eq!(c.shape(), (13, 26));
        assert_eq!(c.dense[12], "I13");
        assert_eq!(c.sparse[25].name, "C26");
        assert_eq!(SchemaDescription::from_json(&c.to_json()).unwrap(), c);
        let a = SchemaDescription::avazu(&[5; 22], 1);
        a.validate().unwrap();
        assert_eq!(a.shape(), (1, 22));
        let e = SchemaDescription::from_spec(&FeatureSpec::elm(100, 5), 1);
        e.validate().unwrap();
        assert_eq!(e.shape(), (10, 28));
        assert_eq!(e.sparse.iter().filter(|s| s.kind == SparseKind::List).count(), 10);
        assert!(e.groups, "the elm spec names its user column");
        assert!(!e.same_layout(&c));
        assert_eq!(c.arrow_schema().fields().len(), 40);
        assert!(!c.to_json().contains("sequences"), "files without sequences keep their old description");
        let b = SchemaDescription::behavior("amazon-dien", &[10, 20, 5], 2);
        b.validate().unwrap();
        assert_eq!(b.shape(), (0, 3));
        assert_eq!(SchemaDescription::from_json(&b.to_json()).unwrap(), b);
        let schema = b.arrow_schema();
        assert_eq!(schema.fields().len(), 6);
        assert_eq!(schema.field(5).name(), "history_categories");
        assert!(SparseKind::List.accepts(schema.field(5).data_type()));
        assert!(!b.to_json().contains("groups"), "files without groups keep their old description");
        let grouped = SchemaDescription { groups: true, ..b };
        assert_eq!(SchemaDescription::from_json(&grouped.to_json()).unwrap(), grouped);
        assert_eq!(grouped.arrow_schema().field(6).name(), GROUP_COLUMN);
    }

    /// A line source's input adds up, without overflow, to at most `MAX_INPUT_BYTES`.
    #[test]
    fn line_source_sizes_past_the_bound_or_overflowing_are_refused() {
        let with = |file_bytes: Vec<u64>| {
            let mut c = SchemaDescription::criteo(&[7; 26], 3);
            c.lines = Some(LineSource { file_bytes });
            c.validate().map_err(|e| e.to_string())
        };
        assert_eq!(with(vec![MAX_INPUT_BYTES - 5, 5]), Ok(()));
        let e = with(vec![MAX_INPUT_BYTES, 1]).unwrap_err();
        assert!(e.contains("lines.file_bytes") && e.contains(&(MAX_INPUT_BYTES + 1).to_string()), "{e}");
        let e = with(vec![u64::MAX, 1, 2]).unwrap_err();
        assert!(e.contains("3 input file(s) add up to over 2^64 bytes"), "{e}");
        assert_eq!(LineSource { file_bytes: vec![u64::MAX, 1] }.total_bytes(), None);
    }

    #[test]
    fn invalid_descriptions_say_why() {
        let mut c = SchemaDescription::criteo(&[7; 26], 3);
        c.dense[1] = "C3".into();
        assert!(c.validate().unwrap_err().to_string().contains("`C3` appears twice"));
        let mut c = SchemaDescription::criteo(&[7; 26], 3);
        c.num_dense = 12;
        assert!(c.validate().unwrap_err().to_string().contains("num_dense"));
        let mut c = SchemaDescription::criteo(&[7; 26], 3);
        c.sparse[4].table_size = 0;
        assert!(c.validate().unwrap_err().to_string().contains("C5"));
        assert!(SchemaDescription::from_json("{").unwrap_err().to_string().contains(METADATA_KEY));
        let mut b = SchemaDescription::behavior("amazon-dien", &[10, 20, 5], 2);
        b.sequences[1].table = 3;
        assert!(b.validate().unwrap_err().to_string().contains("`history_categories`"));
        let mut b = SchemaDescription::behavior("amazon-dien", &[10, 20, 5], 2);
        b.sequences[0].name = "item".into();
        assert!(b.validate().unwrap_err().to_string().contains("`item` appears twice"));
    }
}
