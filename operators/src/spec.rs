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
use crate::OperatorError;
use serde::{Deserialize, Serialize};

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
}

/// A single-valued categorical column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CategoricalSpec {
    /// Column name.
    pub column: String,
    /// Table rows.
    pub buckets: u64,
    /// Hash (default) or identity.
    #[serde(default)]
    pub encoding: Encoding,
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
    /// `(dense features, sparse fields)` of the samples.
    pub fn shape(&self) -> (usize, usize) {
        (self.dense.len() + self.numeric_list.len(), self.categorical.len() + self.list.len())
    }

    /// Rows of each sparse field's table, in field order.
    pub fn table_sizes(&self) -> Vec<u64> {
        self.categorical.iter().map(|c| c.buckets).chain(self.list.iter().map(|l| l.buckets)).collect()
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
        for (i, d) in self.dense.iter().enumerate() {
            find(format!("dense[{i}].column"), &d.column)?;
            if let Some((lo, hi)) = d.clamp {
                if lo.partial_cmp(&hi) != Some(std::cmp::Ordering::Less) && lo != hi {
                    return Err(OperatorError::config(format!("dense[{i}].clamp"), format!("{lo} > {hi}")));
                }
            }
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
            dense: dense_cols.iter().map(|c| DenseSpec { column: c.to_string(), log1p: true, clamp: None }).collect(),
            numeric_list: ["price_list", "timediff_list"]
                .iter()
                .map(|c| NumericListSpec { column: c.to_string(), delimiter: ";".into(), reduce: ListReduce::Mean })
                .collect(),
            categorical: categorical_cols
                .iter()
                .map(|c| CategoricalSpec { column: c.to_string(), buckets, encoding: Encoding::Hash })
                .collect(),
            list: list_cols
                .iter()
                .map(|c| ListSpec { column: c.to_string(), delimiter: ";".into(), max_len, buckets })
                .collect(),
        }
    }
}

impl FeatureSpec {
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
            dense: vec![DenseSpec { column: "price".into(), log1p: true, clamp: None }],
            numeric_list: Vec::new(),
            categorical: categorical_cols
                .iter()
                .map(|c| CategoricalSpec { column: c.to_string(), buckets, encoding: Encoding::Hash })
                .collect(),
            list: vec![ListSpec { column: "click_sequence".into(), delimiter: "^".into(), max_len, buckets }],
        }
    }
}

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

/// A validated spec compiled to column indices: the [`LineFormat`] of a spec.
#[derive(Clone, Debug)]
pub struct SpecFormat {
    spec: FeatureSpec,
    delimiter: u8,
    label: usize,
    dense: Vec<usize>,
    numeric: Vec<(usize, u8, Reduce)>,
    categorical: Vec<(usize, u64, u64, Encoding)>,
    lists: Vec<(usize, u8, u64, u64, usize)>,
}

impl SpecFormat {
    /// Compiles `spec` (validated here) with hashing seeds derived from `seed`.
    pub fn new(spec: FeatureSpec, seed: u64) -> Result<Self, OperatorError> {
        spec.validate()?;
        let index = |c: &str| spec.columns.iter().position(|x| x == c).expect("validated");
        let delimiter = one_byte("delimiter", &spec.delimiter)?;
        let nc = spec.categorical.len();
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
            categorical: spec
                .categorical
                .iter()
                .enumerate()
                .map(|(f, c)| (index(&c.column), field_seed(seed, f), c.buckets, c.encoding))
                .collect(),
            lists: spec
                .list
                .iter()
                .enumerate()
                .map(|(k, l)| {
                    (index(&l.column), l.delimiter.as_bytes()[0], field_seed(seed, nc + k), l.buckets, l.max_len)
                })
                .collect(),
            spec,
        })
    }

    /// The spec this format was compiled from.
    pub fn spec(&self) -> &FeatureSpec {
        &self.spec
    }
}

/// Most columns a spec line may have.
const MAX_COLUMNS: usize = 256;

impl LineFormat for SpecFormat {
    fn shape(&self) -> (usize, usize) {
        self.spec.shape()
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
            let raw = fields[col];
            let mut v = if raw.is_empty() {
                0.0
            } else {
                fast_float2::parse::<f32, _>(raw).map_err(|_| (BadReason::BadInteger, Some(col)))?
            };
            if let Some((lo, hi)) = d.clamp {
                v = v.clamp(lo, hi);
            }
            if d.log1p {
                v = crate::features::log1p_clamped(v);
            }
            dense[k] = v;
        }
        for (k, &(col, delim, reduce)) in self.numeric.iter().enumerate() {
            let v = split_parse_reduce(fields[col], delim, reduce, usize::MAX)
                .map_err(|_| (BadReason::BadInteger, Some(col)))?;
            dense[self.dense.len() + k] = v.unwrap_or(0.0);
        }
        let mut ids = [0u64; MAX_COLUMNS];
        for (f, &(col, seed, buckets, encoding)) in self.categorical.iter().enumerate() {
            let raw = fields[col];
            ids[f] = match (raw.is_empty(), encoding) {
                (true, _) => u64::MAX,
                (false, Encoding::Hash) => token_bucket(seed, raw, buckets),
                (false, Encoding::Identity) => match crate::features::parse_i64(raw) {
                    Some(v) if v >= 0 && (v as u64) < buckets => v as u64,
                    _ => return Err((BadReason::BadInteger, Some(col))),
                },
            };
        }
        out.labels.push(label);
        out.dense.extend_from_slice(&dense[..nd]);
        for (f, &id) in ids[..self.categorical.len()].iter().enumerate() {
            let bag = &mut out.sparse[f];
            if id != u64::MAX {
                bag.ids.push(id);
            }
            bag.close_bag();
        }
        let nc = self.categorical.len();
        for (k, &(col, delim, seed, buckets, max_len)) in self.lists.iter().enumerate() {
            let bag = &mut out.sparse[nc + k];
            split_hash_bucket(fields[col], delim, seed, buckets, max_len, true, &mut bag.ids);
            bag.close_bag();
        }
        Ok(())
    }
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
            dense: vec![DenseSpec { column: "price".into(), log1p: true, clamp: Some((0.0, 100.0)) }],
            numeric_list: vec![NumericListSpec {
                column: "prices".into(),
                delimiter: ";".into(),
                reduce: ListReduce::Mean,
            }],
            categorical: vec![CategoricalSpec { column: "user".into(), buckets: 1000, encoding: Encoding::Hash }],
            list: vec![ListSpec { column: "items".into(), delimiter: ";".into(), max_len: 2, buckets: 50 }],
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
        assert!(f.is_header(b"y,price,prices,user,items"));
        assert_eq!(f.parse(b"2,1,1,u,a", &mut b), Err((BadReason::BadLabel, Some(0))));
        assert_eq!(f.parse(b"1,x,1,u,a", &mut b), Err((BadReason::BadInteger, Some(1))));
        assert_eq!(f.parse(b"1,1,1;z,u,a", &mut b), Err((BadReason::BadInteger, Some(2))));
        assert_eq!(f.parse(b"1,1,1,u", &mut b), Err((BadReason::FieldCount, None)));
        assert_eq!(b.len(), 2, "bad lines append nothing");
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
    }
}
