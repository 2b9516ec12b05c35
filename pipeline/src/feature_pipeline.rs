//! The feature pipeline: how a run turns records into samples, recorded with its model.
//!
//! A model is only meaningful with the featurization it was trained on: the
//! same bytes hashed with another seed, into other table sizes or parsed as
//! another format give other rows. [`FeaturePipeline`] describes that
//! featurization completely (data format; the feature spec in full for `csv`
//! and `taobao-ad`; hash function and seed; table sizes; dense transforms;
//! sequence shape; crosses; for Parquet input the files' schema), and every
//! checkpoint's manifest carries it (`pipeline`, as JSON).
//!
//! Invariants:
//! * Two runs make the same samples from the same records exactly when their
//!   pipelines are equal, `labeled` aside (a test file without its label
//!   column is featurized like the labeled one) and the spec's `user` column
//!   aside (it groups per-user metrics and makes no feature).
//! * Commands that read a checkpoint featurize with its pipeline, never with
//!   defaults: `--resume` refuses a run whose pipeline differs and `eval` /
//!   `predict` refuse data of another format, each naming every difference.
//! * A manifest without a pipeline (written before pipelines were recorded)
//!   is "unknown": it still loads, and what is assumed is said on stderr.

use crate::config::{DataSpec, Resolved};
use crate::error::CheckpointAction;
use crate::{PipelineError, TrainSettings};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tiderec_operators::format::LineFormat;
use tiderec_operators::spec::{FeatureSpec, SpecFormat};
use tiderec_operators::train::TrainerConfig;
use tiderec_sinks::checkpoint::value_differences;
use tiderec_sources::amazon::AmazonDienFormat;
use tiderec_sources::avazu::AvazuFormat;
use tiderec_sources::criteo::{CriteoFeatures, CriteoFormat};
use tiderec_sources::parquet::SchemaDescription;
use tiderec_sources::unlabeled::Unlabeled;

/// Version of the [`FeaturePipeline`] layout written by this build.
pub const PIPELINE_VERSION: u32 = 1;

/// How a run makes features from records; see the [module docs](self).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeaturePipeline {
    /// [`PIPELINE_VERSION`] of the writer.
    pub version: u32,
    /// The data format as written in `FORMAT:PATH` (`criteo`, `avazu`, `csv`, `taobao-ad`,
    /// `amazon-dien`, `taobao-behavior`, `parquet`, `synthetic`, `synthetic-behavior`).
    pub format: String,
    /// The feature spec of `csv` and `taobao-ad` data, in full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<SpecRecord>,
    /// How values become row ids.
    pub hash: HashScheme,
    /// Rows of each of the data's sparse fields' tables, in field order (crosses not included).
    pub table_sizes: Vec<u64>,
    /// The dense features in sample order and the transform that makes each.
    pub dense: Vec<DenseTransform>,
    /// The behaviour sequences of the data, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequences: Option<SequenceRecord>,
    /// Longest behaviour history kept (`amazon-dien`, `taobao-behavior`, `synthetic-behavior`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_len: Option<usize>,
    /// Feature crosses `(a, b)` appended after the data's sparse fields (wide part only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub crosses: Vec<(usize, usize)>,
    /// Rows of each cross's table (with crosses only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_buckets: Option<u64>,
    /// Whether records carry a label (training data always does).
    pub labeled: bool,
    /// For `parquet` data: the files' schema (what `tiderec convert` recorded), without file sizes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parquet: Option<SchemaDescription>,
}

/// A feature spec and where it came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpecRecord {
    /// `preset:NAME`, or the TOML file's path as given.
    pub source: String,
    /// The spec, resolved to its fields.
    pub fields: FeatureSpec,
}

/// Hashing of values into table rows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashScheme {
    /// The hash function (see [`hash_function`]).
    pub function: String,
    /// The run's hashing seed (`--hash-seed`); field `f` hashes with `field_seed(seed, f)`.
    pub seed: u64,
}

/// One dense feature and its transform.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenseTransform {
    /// The column (or derived feature) it is made from.
    pub name: String,
    /// What is applied, e.g. `log1p(max(x, 0)); empty = 0`.
    pub transform: String,
}

/// The sequences of behaviour data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SequenceRecord {
    /// The table each sequence field reads.
    pub tables: Vec<usize>,
    /// The sparse field holding each sequence's target.
    pub targets: Vec<usize>,
    /// The longest sequence the data can hold, when the data says so.
    pub max_len: Option<usize>,
}

/// The hash function of a format's categorical values.
pub fn hash_function(format: &str) -> &'static str {
    match format {
        "criteo" => "hash_bucket: mix64(hex value ^ field seed), multiply-shift into the table",
        "synthetic" | "synthetic-behavior" => "none: generated ids",
        "parquet" => "none: ids stored at conversion (see parquet.seed)",
        _ => "token_bucket: seeded hash of the value's bytes, multiply-shift into the table",
    }
}

/// `spec`'s source as recorded: `preset:NAME` for a preset, else the path as given.
fn spec_source(given: &str) -> String {
    match given.strip_prefix("preset:") {
        Some(name) => format!("preset:{}", name.replace('-', "_")),
        None if FeatureSpec::preset(given, 1, 1).is_some() => format!("preset:{}", given.replace('-', "_")),
        None => given.to_string(),
    }
}

fn dense_of_spec(spec: &FeatureSpec) -> Vec<DenseTransform> {
    let dense = spec.dense.iter().map(|d| {
        let mut steps = Vec::new();
        if let Some((lo, hi)) = d.clamp {
            steps.push(format!("clamp to [{lo}, {hi}]"));
        }
        if d.log1p {
            steps.push("log1p(max(x, 0))".to_string());
        }
        let transform = if steps.is_empty() { "x".to_string() } else { steps.join(", then ") };
        DenseTransform { name: d.column.clone(), transform: format!("{transform}; empty = 0") }
    });
    let lists = spec.numeric_list.iter().map(|l| DenseTransform {
        name: l.column.clone(),
        transform: format!("{:?} of the `{}`-separated list", l.reduce, l.delimiter).to_lowercase(),
    });
    dense.chain(lists).collect()
}

/// The dense features of `data` of a format without a spec (criteo, avazu, amazon-dien,
/// parquet), as [`FeaturePipeline::of_run`] records them.
fn assumed_dense(data: &DataSpec) -> Vec<DenseTransform> {
    match data {
        DataSpec::Criteo(_) => (1..=13)
            .map(|i| DenseTransform { name: format!("I{i}"), transform: "log1p(max(x, 0)); empty = 0".into() })
            .collect(),
        DataSpec::Avazu(_) => {
            vec![DenseTransform { name: "hour".into(), transform: "hour of day (YYMMDDHH) / 23".into() }]
        }
        DataSpec::Parquet(p) => {
            p.0.description()
                .dense
                .iter()
                .map(|n| DenseTransform { name: n.clone(), transform: "as stored".into() })
                .collect()
        }
        _ => Vec::new(),
    }
}

/// What of a Parquet description decides the samples: not the input files' sizes (`lines`)
/// nor whether rows carry user groups (no feature).
fn featurization(d: &SchemaDescription) -> SchemaDescription {
    SchemaDescription { lines: None, groups: false, ..d.clone() }
}

impl FeaturePipeline {
    /// The pipeline of a training run (labeled records).
    pub fn of_run(settings: &TrainSettings, resolved: &Resolved) -> Self {
        let format = resolved.data.format().to_string();
        let spec = resolved.spec.as_ref().filter(|_| matches!(resolved.data, DataSpec::Csv(_) | DataSpec::TaobaoAd(_)));
        let spec = spec.map(|fields| SpecRecord {
            source: spec_source(settings.data.spec.as_deref().unwrap_or("preset:taobao_ad")),
            fields: fields.clone(),
        });
        let dense = match &resolved.data {
            DataSpec::Synthetic => {
                (1..=13).map(|i| DenseTransform { name: format!("I{i}"), transform: "generated".into() }).collect()
            }
            DataSpec::Csv(_) | DataSpec::TaobaoAd(_) => {
                spec.as_ref().map(|s| dense_of_spec(&s.fields)).unwrap_or_default()
            }
            other => assumed_dense(other),
        };
        let behavior = matches!(
            resolved.data,
            DataSpec::AmazonDien(_) | DataSpec::TaobaoBehavior(_) | DataSpec::SyntheticBehavior
        );
        let parquet = match &resolved.data {
            DataSpec::Parquet(p) => Some(featurization(p.0.description())),
            _ => None,
        };
        FeaturePipeline {
            version: PIPELINE_VERSION,
            hash: HashScheme { function: hash_function(&format).into(), seed: settings.hash_seed() },
            format,
            spec,
            table_sizes: resolved.data_table_sizes().to_vec(),
            dense,
            sequences: resolved.data.sequences(resolved.spec.as_ref()).map(|q| SequenceRecord {
                tables: q.tables,
                targets: q.targets,
                max_len: q.max_len,
            }),
            max_len: behavior.then_some(settings.data.max_len),
            cross_buckets: (!resolved.crosses.is_empty()).then(|| resolved.cross_buckets()),
            crosses: resolved.crosses.clone(),
            labeled: true,
            parquet,
        }
    }

    /// A manifest's pipeline: `None` when the manifest has none (an older checkpoint).
    pub fn from_manifest(value: Option<&Value>, path: &std::path::Path) -> Result<Option<Self>, PipelineError> {
        value
            .map(|v| {
                serde_json::from_value(v.clone()).map_err(|e| {
                    PipelineError::checkpoint(CheckpointAction::Read, Some(path.to_path_buf()), "manifest pipeline")
                        .with_source(e)
                })
            })
            .transpose()
    }

    /// This pipeline as manifest JSON.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a feature pipeline always serializes")
    }

    /// The format as a person names it: `csv (spec criteo)`, `criteo`, `parquet (from criteo)`.
    pub fn format_label(&self) -> String {
        match (&self.spec, &self.parquet) {
            (Some(s), _) => format!("{} (spec {})", self.format, s.source.strip_prefix("preset:").unwrap_or(&s.source)),
            (None, Some(p)) => format!("{} (from {})", self.format, p.format),
            (None, None) => self.format.clone(),
        }
    }

    /// Every difference between this (the checkpoint's) pipeline and `other` (`whose`: `run`,
    /// `data`), one line per field: `FIELD: checkpoint has X, run has Y`. A different format
    /// is one line (its other fields are then not compared); `labeled` and the spec's `user`
    /// column (not a feature) are not compared.
    pub fn differences(&self, other: &FeaturePipeline, whose: &str) -> Vec<String> {
        if self.format != other.format {
            return vec![format!(
                "format: checkpoint has {}, {whose} has {}",
                self.format_label(),
                other.format_label()
            )];
        }
        let strip = |p: &FeaturePipeline| {
            let mut v = p.to_value();
            if let Some(map) = v.as_object_mut() {
                map.remove("labeled");
                map.remove("version");
                // The spec is compared by content; where it came from is not part of the features,
                // nor is its user column (which only groups per-user metrics).
                if let Some(spec) = map.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.remove("source");
                    if let Some(fields) = spec.get_mut("fields").and_then(Value::as_object_mut) {
                        fields.remove("user");
                    }
                }
            }
            v
        };
        let mut out = Vec::new();
        let (a, b) = (strip(self), strip(other));
        if a.get("spec") != b.get("spec") {
            let name = |p: &FeaturePipeline| p.spec.as_ref().map_or_else(|| "none".to_string(), |s| s.source.clone());
            let (mine, theirs) = (name(self), name(other));
            out.push(match mine == theirs {
                true => format!("spec: {mine} (with its vocabularies) has changed since the checkpoint"),
                false => format!("spec: checkpoint has {mine}, {whose} has {theirs}"),
            });
        }
        out.extend(
            value_differences(&a, &b).into_iter().map(|(k, x, y)| format!("{k}: checkpoint has {x}, {whose} has {y}")),
        );
        out
    }

    /// Checks that this pipeline makes the inputs of the model `config` describes: as
    /// many dense features as the model reads, the data's tables followed by one table
    /// of `cross_buckets` rows per cross, and (for a model that reads sequences) the
    /// sequences in the tables the model reads them from. The error names every mismatch (a hand-edited manifest, say).
    pub fn check_model(&self, config: &TrainerConfig) -> Result<(), Vec<String>> {
        let mut out = Vec::new();
        let model = &config.model;
        if self.dense.len() != model.num_dense() {
            out.push(format!(
                "pipeline.dense: {} dense features, the model reads {}",
                self.dense.len(),
                model.num_dense()
            ));
        }
        let crosses = std::iter::repeat_n(self.cross_buckets.unwrap_or(1), self.crosses.len());
        let expected: Vec<u64> = self.table_sizes.iter().copied().chain(crosses).collect();
        if expected.len() != config.table_sizes.len() {
            out.push(format!(
                "table_sizes: the pipeline makes {} tables (with its crosses), the model reads {}",
                expected.len(),
                config.table_sizes.len()
            ));
        } else {
            let differ = expected.iter().zip(&config.table_sizes).enumerate().filter(|(_, (a, b))| a != b);
            out.extend(
                differ
                    .map(|(t, (a, b))| format!("table_sizes[{t}]: the pipeline's table has {a} rows, the model's {b}")),
            );
        }
        if let Some(seq) = self.sequences.as_ref().filter(|_| model.num_sequences() > 0) {
            if seq.tables != config.sequence_tables {
                out.push(format!(
                    "sequence_tables: the pipeline reads sequences from tables {:?}, the model from {:?}",
                    seq.tables, config.sequence_tables
                ));
            }
        }
        if out.is_empty() {
            Ok(())
        } else {
            Err(out)
        }
    }

    /// Checks that `data` can be featurized with this pipeline: the same format, and for
    /// Parquet the same schema; the error names every difference.
    pub fn check_data(&self, data: &DataSpec) -> Result<(), Vec<String>> {
        if data.format() != self.format {
            let hint = match (&self.spec, self.format.as_str()) {
                (Some(_), f) => format!(" (score it as --data {f}:PATH; the checkpoint's spec is used)"),
                (None, f) => format!(" (score {f} files)"),
            };
            return Err(vec![format!(
                "format: checkpoint has {}, data has {}{hint}",
                self.format_label(),
                data.format()
            )]);
        }
        if let (DataSpec::Parquet(p), Some(mine)) = (data, &self.parquet) {
            let theirs = featurization(p.0.description());
            if &theirs != mine {
                let a = serde_json::to_value(mine).unwrap_or_default();
                let b = serde_json::to_value(&theirs).unwrap_or_default();
                return Err(value_differences(&a, &b)
                    .into_iter()
                    .map(|(k, x, y)| format!("parquet.{k}: checkpoint has {x}, data has {y}"))
                    .collect());
            }
        }
        Ok(())
    }

    /// The line format of this pipeline's records; `labeled = false` reads lines without
    /// their label column (featurized as the labeled ones). `None` for formats that are not
    /// read line by line (Parquet, the generators, Taobao behaviour logs).
    pub fn line_format(&self, labeled: bool) -> Result<Option<Box<dyn LineFormat + Send>>, PipelineError> {
        fn boxed<F: LineFormat + Send + 'static>(f: F, label: Option<(usize, u8)>) -> Box<dyn LineFormat + Send> {
            match label {
                Some((column, delimiter)) => Box::new(Unlabeled::new(f, column, delimiter)),
                None => Box::new(f),
            }
        }
        let seed = self.hash.seed;
        let sizes = self.table_sizes.clone();
        Ok(Some(match self.format.as_str() {
            "criteo" => {
                boxed(CriteoFormat::new(CriteoFeatures { table_sizes: sizes, seed })?, (!labeled).then_some((0, b'\t')))
            }
            "avazu" => boxed(AvazuFormat::new(sizes, seed)?, (!labeled).then_some((1, b','))),
            "amazon-dien" => {
                let max_len = self.max_len.unwrap_or(TrainSettings::default().data.max_len);
                boxed(AmazonDienFormat::new(&sizes, seed, max_len)?, (!labeled).then_some((0, b'\t')))
            }
            "csv" | "taobao-ad" => {
                let spec = self.spec.as_ref().ok_or_else(|| {
                    PipelineError::checkpoint(
                        CheckpointAction::Read,
                        None,
                        format!("the `{}` pipeline records no feature spec", self.format),
                    )
                })?;
                let fields = &spec.fields;
                let label = (!labeled)
                    .then(|| {
                        let column = fields.columns.iter().position(|c| *c == fields.label.column)?;
                        let delimiter = tiderec_operators::spec::delimiter_byte(&fields.delimiter)?;
                        Some((column, delimiter))
                    })
                    .flatten();
                let format = SpecFormat::new(fields.clone(), seed)?;
                match label {
                    Some((column, delimiter)) => {
                        Box::new(Unlabeled::new(format, column, delimiter).with_label_name(&fields.label.column))
                    }
                    None => Box::new(format),
                }
            }
            _ => return Ok(None),
        }))
    }

    /// The pipeline assumed for a checkpoint that records none: `data`'s format with the
    /// checkpoint's seed as the hashing seed and its table sizes (only for formats that need
    /// nothing else: criteo, avazu, amazon-dien, parquet). The dense features and sequences
    /// are those the data makes (a Parquet file's as its description says), so that
    /// [`FeaturePipeline::check_model`] compares the data's shape with the model's.
    pub fn assumed(data: &DataSpec, seed: u64, table_sizes: &[u64], max_len: Option<usize>) -> Option<Self> {
        if !matches!(data, DataSpec::Criteo(_) | DataSpec::Avazu(_) | DataSpec::AmazonDien(_) | DataSpec::Parquet(_)) {
            return None;
        }
        let num_sparse = data.shape(None).1;
        let format = data.format().to_string();
        Some(FeaturePipeline {
            version: PIPELINE_VERSION,
            hash: HashScheme { function: hash_function(&format).into(), seed },
            format,
            spec: None,
            table_sizes: table_sizes.get(..num_sparse)?.to_vec(),
            dense: assumed_dense(data),
            sequences: data.sequences(None).map(|q| SequenceRecord {
                tables: q.tables,
                targets: q.targets,
                max_len: q.max_len,
            }),
            max_len,
            crosses: Vec::new(),
            cross_buckets: None,
            labeled: true,
            parquet: match data {
                DataSpec::Parquet(p) => Some(featurization(p.0.description())),
                _ => None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline_of(data: &str, spec: Option<&str>, hash_seed: Option<u64>) -> FeaturePipeline {
        let settings = {
            let mut s = TrainSettings::default();
            s.data.source = data.into();
            s.data.spec = spec.map(String::from);
            s.data.hash_seed = hash_seed;
            s.data.buckets = 100;
            s.model.kind = crate::settings::ModelKind::Lr;
            s
        };
        FeaturePipeline::of_run(&settings, &settings.validate().unwrap())
    }

    #[test]
    fn differences_name_the_format_the_spec_and_the_seed() {
        let csv = pipeline_of("csv:Cargo.toml", Some("preset:criteo"), None);
        let criteo = pipeline_of("criteo:Cargo.toml", None, None);
        assert_eq!(csv.differences(&csv, "run"), Vec::<String>::new());
        assert_eq!(csv.differences(&criteo, "run"), ["format: checkpoint has csv (spec criteo), run has criteo"]);
        let bare = pipeline_of("csv:Cargo.toml", Some("criteo"), None);
        assert_eq!(csv.differences(&bare, "run"), Vec::<String>::new(), "`criteo` is `preset:criteo`");
        let avazu_spec = pipeline_of("csv:Cargo.toml", Some("preset:avazu"), None);
        let d = csv.differences(&avazu_spec, "run");
        assert_eq!(d[0], "spec: checkpoint has preset:criteo, run has preset:avazu");
        assert!(d.iter().any(|l| l.starts_with("spec.fields.columns: checkpoint has")), "{d:?}");
        let mut no_user = pipeline_of("csv:Cargo.toml", Some("preset:elm"), None);
        let elm = no_user.clone();
        no_user.spec.as_mut().unwrap().fields.user = None;
        assert_eq!(elm.differences(&no_user, "run"), Vec::<String>::new(), "the user column is no feature");
        let seeded = pipeline_of("criteo:Cargo.toml", None, Some(7));
        assert_eq!(criteo.differences(&seeded, "run"), ["hash.seed: checkpoint has 42, run has 7"]);
        // Round trip through the manifest's JSON.
        let back = FeaturePipeline::from_manifest(Some(&csv.to_value()), std::path::Path::new("m")).unwrap();
        assert_eq!(back, Some(csv));
        assert_eq!(criteo.dense.len(), 13);
        assert_eq!(criteo.dense[0].transform, "log1p(max(x, 0)); empty = 0");
    }

    /// A spec's numbers (clamp, scale, boundaries) come back from the manifest's JSON, which
    /// has no infinity: a spec with an infinite clamp bound is refused before a run starts,
    /// naming the key, instead of writing a manifest no later command can read.
    #[test]
    fn spec_numbers_round_trip_through_the_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spec.toml");
        let text = r#"
delimiter = ","
columns = ["y", "x", "h"]
label = { column = "y" }
dense = [{ column = "x", clamp = [-1.5, 1e30], scale = "standardize", center = 0.25, width = 3.0 }]
categorical = [{ column = "h", buckets = 4, encoding = "bucketize", boundaries = [6.0, 12.0, 18.0] }]
"#;
        std::fs::write(&path, text).unwrap();
        let p = pipeline_of("csv:Cargo.toml", Some(path.to_str().unwrap()), None);
        assert_eq!(p.spec.as_ref().unwrap().fields.dense[0].clamp, Some((-1.5, 1e30)));
        let back = FeaturePipeline::from_manifest(Some(&p.to_value()), std::path::Path::new("m")).unwrap();
        assert_eq!(back, Some(p));
        std::fs::write(&path, text.replace("1e30", "inf")).unwrap();
        let e = crate::config::resolve_spec(path.to_str().unwrap(), 100, 10).unwrap_err().to_string();
        assert!(e.contains("spec.dense[0].clamp") && e.contains("spec.toml"), "{e}");
    }

    /// The pipeline assumed for a checkpoint without one describes the data as a run on it
    /// records it (dense features, sequences), so a model of another shape fails
    /// `check_model`, naming the dense widths.
    #[test]
    fn an_assumed_pipeline_has_the_datas_shape() {
        for data in ["criteo:Cargo.toml", "avazu:Cargo.toml"] {
            let run = pipeline_of(data, None, None);
            let spec = DataSpec::parse("data", data).unwrap();
            let assumed = FeaturePipeline::assumed(&spec, 42, &run.table_sizes, None).unwrap();
            assert_eq!(assumed.dense, run.dense, "{data}");
            assert_eq!(assumed.differences(&run, "run"), Vec::<String>::new(), "{data}");
        }
        let amazon = DataSpec::parse("data", "amazon-dien:Cargo.toml").unwrap();
        let assumed = FeaturePipeline::assumed(&amazon, 42, &[100; 5], Some(20)).unwrap();
        assert!(assumed.dense.is_empty());
        assert_eq!(assumed.sequences.as_ref().map(|q| q.tables.clone()), amazon.sequences(None).map(|q| q.tables));
        // A Criteo-shaped model (13 dense features) and data of none.
        let mut settings = TrainSettings::default();
        settings.data.source = "criteo:Cargo.toml".into();
        settings.data.buckets = 100;
        let resolved = settings.validate().unwrap();
        let config = crate::run::trainer_config(&settings, &resolved);
        let criteo = DataSpec::parse("data", "criteo:Cargo.toml").unwrap();
        let fits = FeaturePipeline::assumed(&criteo, 42, &config.table_sizes, None).unwrap();
        assert_eq!(fits.check_model(&config), Ok(()));
        let no_dense = FeaturePipeline { dense: Vec::new(), ..fits };
        let e = no_dense.check_model(&config).unwrap_err();
        assert_eq!(e, ["pipeline.dense: 0 dense features, the model reads 13"]);
    }
}
