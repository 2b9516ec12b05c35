//! Names of a served model's inputs: its dense features, sparse fields and sequences.
//!
//! A checkpoint records the model's shape and, in its feature pipeline, the
//! data format, not the data's column names, so the names come from those: a
//! model of 13 dense and 26 sparse fields without sequences reads Criteo
//! records (`I1`…`I13`, `C1`…`C26`); a model of a behaviour format
//! (`amazon-dien`, `taobao-behavior`, `synthetic-behavior`) reads `user`,
//! `item`, `category` and the sequences `item_history`, `category_history`;
//! an Avazu model the dense `hour` and the sparse `C1`, `banner_pos`, …, `C21`,
//! `hour_of_day` (the Kaggle header's names); a model of feature-spec data
//! (`csv`, `taobao-ad`) its spec's column names (dense, then numeric lists;
//! categorical, then pooled lists; sequence lists), a column read twice
//! suffixed with its position; any other model gets positional names (`dense_<j>`, `field_<i>`,
//! `sequence_<j>`, 0-based). Feature crosses (the last `wide_only` sparse
//! fields of LR and Wide & Deep) are `cross_<i>`.
//!
//! The sparse fields' names are unique (the tables' tensors are named after them, and
//! readers find a field by its name), and a cross's name is no other input's either: a
//! name already taken (a spec column `cross_0`, or `cross_1`, the name of a column
//! `cross` read twice) gets the first of `_1`, `_2`, … appended that is free. The data's
//! names are taken first, so a collision renames the cross (`cross_0_1`), never a column.
//! (A column both dense and categorical keeps its name in both lists: dense features
//! have no tensors of their own and are read by position.)

use tiderec_operators::nn::ModelConfig;
use tiderec_operators::spec::FeatureSpec;
use tiderec_sources::criteo::{NUM_DENSE, NUM_SPARSE};
use tiderec_sources::parquet::schema::avazu_sparse_names;

/// The names of a model's inputs, in the order the model reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputNames {
    /// One per dense feature.
    pub dense: Vec<String>,
    /// One per sparse field (the data's own fields, then the crosses).
    pub sparse: Vec<String>,
    /// One per sequence field the model reads.
    pub sequences: Vec<String>,
    /// Whether the names are Criteo's (the model reads Criteo records).
    pub criteo: bool,
}

/// Data formats whose samples are [`BEHAVIOR_FIELDS`] with [`BEHAVIOR_SEQUENCES`].
pub const BEHAVIOR_FORMATS: [&str; 3] = ["amazon-dien", "taobao-behavior", "synthetic-behavior"];
/// The sparse fields of a behaviour format's samples, in order.
pub const BEHAVIOR_FIELDS: [&str; 3] = ["user", "item", "category"];
/// The sequence fields of a behaviour format's samples, in order.
pub const BEHAVIOR_SEQUENCES: [&str; 2] = ["item_history", "category_history"];

/// The sparse fields that are feature crosses (wide-only), counted from the end.
pub fn crosses(model: &ModelConfig) -> usize {
    match model {
        ModelConfig::Fm(c) => c.wide_only,
        _ => 0,
    }
}

/// Whether `model` reads Criteo records (13 dense, 26 sparse fields, no sequences).
pub fn is_criteo_shaped(model: &ModelConfig) -> bool {
    model.num_dense() == NUM_DENSE && model.num_sparse() - crosses(model) == NUM_SPARSE && model.num_sequences() == 0
}

/// The names of `model`'s inputs, trained on data of `format` (`None`: not recorded) with
/// the feature spec `spec` (`csv`, `taobao-ad`); see the module docs.
pub fn input_names(model: &ModelConfig, format: Option<&str>, spec: Option<&FeatureSpec>) -> InputNames {
    let criteo = is_criteo_shaped(model);
    let own = model.num_sparse() - crosses(model);
    let (nd, ns) = (model.num_dense(), model.num_sequences());
    let shaped = |dense: usize, sparse: usize, sequences: usize| nd == dense && own == sparse && ns <= sequences;
    let strings = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let data: Option<(Vec<String>, Vec<String>, Vec<String>)> = match (format, spec) {
        _ if criteo => Some((
            (1..=nd).map(|j| format!("I{j}")).collect(),
            (1..=own).map(|i| format!("C{i}")).collect(),
            Vec::new(),
        )),
        (Some(f), _) if BEHAVIOR_FORMATS.contains(&f) && shaped(0, BEHAVIOR_FIELDS.len(), BEHAVIOR_SEQUENCES.len()) => {
            Some((Vec::new(), strings(&BEHAVIOR_FIELDS), strings(&BEHAVIOR_SEQUENCES)))
        }
        (Some("avazu"), _) if shaped(tiderec_sources::avazu::NUM_DENSE, tiderec_sources::avazu::NUM_SPARSE, 0) => {
            Some((vec!["hour".to_string()], avazu_sparse_names().collect(), Vec::new()))
        }
        (Some("csv" | "taobao-ad"), Some(spec)) => {
            let dense = spec.dense.iter().map(|d| &d.column).chain(spec.numeric_list.iter().map(|n| &n.column));
            let sparse = spec.categorical.iter().map(|c| &c.column).chain(spec.pooled_lists().map(|(_, l)| &l.column));
            let sequences = spec.sequence_lists().map(|(_, l)| &l.column);
            let (dense, sparse, sequences) = (distinct(dense), distinct(sparse), distinct(sequences));
            (dense.len() == nd && sparse.len() == own && sequences.len() >= ns).then_some((dense, sparse, sequences))
        }
        _ => None,
    };
    let (dense, mut sparse, sequences) = data.unwrap_or_else(|| {
        (
            (0..nd).map(|j| format!("dense_{j}")).collect(),
            (0..own).map(|i| format!("field_{i}")).collect(),
            (0..ns).map(|j| format!("sequence_{j}")).collect(),
        )
    });
    let sequences: Vec<String> = sequences.into_iter().take(ns).collect();
    for i in 0..crosses(model) {
        let taken = |name: &str| dense.iter().chain(&sparse).chain(&sequences).any(|n| n == name);
        let name = unused(format!("cross_{i}"), taken);
        sparse.push(name);
    }
    InputNames { dense, sparse, sequences, criteo }
}

/// `names` as they are, a repeated one (a column a spec reads twice) suffixed with its position
/// (made unique by [`unused`] when that name is taken too).
fn distinct<'a>(names: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (i, n) in names.enumerate() {
        let name = if out.contains(n) { unused(format!("{n}_{i}"), |m| out.iter().any(|o| o == m)) } else { n.clone() };
        out.push(name);
    }
    out
}

/// `name` if `taken` says it is free, else the first of `name_1`, `name_2`, … that is.
fn unused(name: String, taken: impl Fn(&str) -> bool) -> String {
    let mut candidate = name.clone();
    let mut k = 0u64;
    while taken(&candidate) {
        k += 1;
        candidate = format!("{name}_{k}");
    }
    candidate
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiderec_operators::nn::{DienConfig, DlrmConfig, FmConfig, Interest};

    #[test]
    fn criteo_shaped_models_get_criteo_names_and_others_positional_ones() {
        let n = input_names(&ModelConfig::Dlrm(DlrmConfig::kaggle()), Some("criteo"), None);
        assert!(n.criteo);
        assert_eq!((n.dense[12].as_str(), n.sparse[0].as_str(), n.sparse[25].as_str()), ("I13", "C1", "C26"));
        let wdl = FmConfig { num_dense: 13, num_sparse: 28, dim: 4, deep: vec![8], fm: false, wide_only: 2 };
        let n = input_names(&ModelConfig::Fm(wdl), None, None);
        assert!(n.criteo);
        assert_eq!(&n.sparse[25..], ["C26", "cross_0", "cross_1"]);
        let avazu = FmConfig { num_dense: 0, num_sparse: 22, dim: 4, deep: vec![], fm: true, wide_only: 0 };
        let n = input_names(&ModelConfig::Fm(avazu.clone()), Some("csv"), None);
        assert!(!n.criteo && n.dense.is_empty());
        assert_eq!(n.sparse[21], "field_21");
        let n = input_names(&ModelConfig::Fm(FmConfig { num_dense: 1, ..avazu }), Some("avazu"), None);
        assert_eq!(n.dense, ["hour"]);
        assert_eq!(
            (n.sparse[0].as_str(), n.sparse[1].as_str(), n.sparse[21].as_str()),
            ("C1", "banner_pos", "hour_of_day")
        );
    }

    #[test]
    fn behaviour_formats_name_their_fields_and_histories() {
        let dien = ModelConfig::Dien(DienConfig {
            num_dense: 0,
            num_sparse: 3,
            dim: 4,
            num_sequences: 2,
            target_fields: vec![1, 2],
            max_len: 5,
            interest: Interest::GruAttention,
            mlp: vec![8],
        });
        let n = input_names(&dien, Some("amazon-dien"), None);
        assert_eq!(
            (n.sparse.as_slice(), n.sequences.as_slice()),
            (&BEHAVIOR_FIELDS.map(String::from)[..], &BEHAVIOR_SEQUENCES.map(String::from)[..])
        );
        let n = input_names(&dien, Some("csv"), None);
        assert_eq!(n.sparse, ["field_0", "field_1", "field_2"]);
        assert_eq!(n.sequences, ["sequence_0", "sequence_1"]);
        let lr = FmConfig { num_dense: 0, num_sparse: 4, dim: 0, deep: vec![], fm: true, wide_only: 1 };
        let n = input_names(&ModelConfig::Fm(lr), Some("amazon-dien"), None);
        assert_eq!(n.sparse, ["user", "item", "category", "cross_0"]);
        assert!(n.sequences.is_empty());
    }

    /// Spec columns named like crosses, or like a twice-read column's suffixed name, keep
    /// their names; the crosses and the repeated column take the next free one.
    #[test]
    fn spec_columns_named_like_crosses_leave_every_sparse_name_distinct() {
        let spec = FeatureSpec::from_toml(
            r#"
delimiter = ","
columns = ["label", "x", "cross", "cross_0", "cross_1_1"]
label = { column = "label" }
dense = [{ column = "x" }]
categorical = [
  { column = "cross", buckets = 10 }, { column = "cross", buckets = 10 },
  { column = "cross_0", buckets = 10 }, { column = "cross_1_1", buckets = 10 },
]
"#,
        )
        .unwrap();
        // `cross` read twice is `cross`, `cross_1`; the crosses `cross_0` and `cross_1` are
        // both taken, and so is `cross_1_1`.
        let wdl = FmConfig { num_dense: 1, num_sparse: 4 + 3, dim: 4, deep: vec![8], fm: false, wide_only: 3 };
        let n = input_names(&ModelConfig::Fm(wdl), Some("csv"), Some(&spec));
        assert_eq!(n.dense, ["x"]);
        assert_eq!(n.sparse, ["cross", "cross_1", "cross_0", "cross_1_1", "cross_0_1", "cross_1_2", "cross_2"]);
        // Columns `label,x,cross_0,b` with one cross.
        let spec = FeatureSpec::from_toml(
            r#"
delimiter = ","
columns = ["label", "x", "cross_0", "b"]
label = { column = "label" }
dense = [{ column = "x" }]
categorical = [{ column = "cross_0", buckets = 10 }, { column = "b", buckets = 10 }]
"#,
        )
        .unwrap();
        let wdl = FmConfig { num_dense: 1, num_sparse: 3, dim: 4, deep: vec![8], fm: false, wide_only: 1 };
        let n = input_names(&ModelConfig::Fm(wdl), Some("csv"), Some(&spec));
        assert_eq!(n.sparse, ["cross_0", "b", "cross_0_1"]);
    }

    /// A twice-read column's suffixed name never repeats a column's own name.
    #[test]
    fn a_repeated_column_never_takes_another_columns_name() {
        let columns = ["a", "a_2", "a"].map(String::from);
        assert_eq!(distinct(columns.iter()), ["a", "a_2", "a_2_1"]);
        let columns = ["a", "a", "a_1"].map(String::from);
        assert_eq!(distinct(columns.iter()), ["a", "a_1", "a_1_2"]);
    }
}
