//! The specs that the unit tests of the spec modules share: a small spec built by hand and
//! two TOML texts (numeric transforms; a vocabulary, a mean-pooled and a sequence list).

use super::{CategoricalSpec, DenseSpec, FeatureSpec, LabelSpec, ListReduce, ListSpec, NumericListSpec, Pooling};

/// Label, one clamped `log1p` dense column, a numeric list, a hashed user column and a list.
pub(super) fn tiny() -> FeatureSpec {
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

pub(super) const NUMERIC: &str = r#"
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

pub(super) const TOML: &str = r#"
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
