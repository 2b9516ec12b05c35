//! The built-in specs of public CTR datasets (Criteo, Avazu, Ele.me, Taobao display ads)
//! and their column lists.
//!
//! Invariants: every preset validates and round-trips through TOML; its columns are the
//! dataset's, in file order; each table has the `buckets` rows asked for.

use super::{CategoricalSpec, DenseSpec, FeatureSpec, LabelSpec, ListReduce, ListSpec, NumericListSpec, Pooling};

impl FeatureSpec {
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

    /// The preset for Ele.me ("elm") lines: the DeepRec/AtRec column list, ids and
    /// codes hashed, prices and rates dense (`log1p`), the ten id lists hashed and
    /// sum-pooled (at most `max_len` items), `price_list` and `timediff_list` averaged.
    pub fn elm(buckets: u64, max_len: usize) -> Self {
        let columns: Vec<String> = ELM_COLUMNS.iter().map(|s| s.to_string()).collect();
        let dense_cols = ["avg_price", "ctr_30", "ord_30", "total_amt_30", "rank_7", "rank_30", "rank_90", "times"];
        let mean_lists = ["price_list", "timediff_list"];
        // Every other column but the label: `_list` columns are id lists, the others ids,
        // in column order.
        let (list_cols, categorical_cols): (Vec<&str>, Vec<&str>) = ELM_COLUMNS[1..]
            .iter()
            .copied()
            .filter(|c| !dense_cols.contains(c) && !mean_lists.contains(c))
            .partition(|c| c.ends_with("_list"));
        FeatureSpec {
            delimiter: ",".into(),
            header: false,
            columns,
            label: LabelSpec { column: "clicked".into() },
            dense: dense_cols.iter().map(|c| DenseSpec::new(c, true)).collect(),
            numeric_list: mean_lists
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Batch;
    use crate::format::LineFormat;
    use crate::metrics::group_key;
    use crate::spec::SpecFormat;

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
}
