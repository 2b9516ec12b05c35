//! `manifest.json`: what a checkpoint holds, where training stood, and the
//! checksum of every other file.
//!
//! Invariants:
//! * `files` names every other file of the directory (`dense.safetensors`
//!   and `shard-0.safetensors … shard-{workers-1}.safetensors`) with its size
//!   and xxh3-128 checksum; a checkpoint whose files do not match is corrupt.
//! * `config_hash` is [`config_hash`] of `config`: the model, table sizes and
//!   optimizers (kinds and hyper-parameters), not the seed or the data.
//! * `pipeline` is how the run made features from records (format, spec,
//!   hashing seed, table sizes, transforms: the binary's feature-pipeline
//!   record, kept here as JSON); absent in checkpoints written before it was
//!   recorded, which then featurize as "unknown".
//! * `data_position` is where the data readers resume: for file and generated
//!   data the epoch and the number of global steps taken in it; a Kafka
//!   source records its per-partition offsets in `kafka_offsets`, and in
//!   `kafka_last_records` a fingerprint of the record before each offset, and
//!   in `dead_letter_bytes` how much of each dead-letter file holds the records
//!   dead-lettered before them;
//!   `inputs` lists the data files a file position counts in, and `workers`
//!   the workers (of all processes) that read them.

use crate::SinkError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use tiderec_operators::store::StoreConfig;
use tiderec_operators::train::TrainerConfig;

/// Version of the checkpoint layout written by this build: 2 adds deltas
/// ([`Manifest::delta`]) and checkpoints of updated rows only
/// ([`Manifest::updated_only`]), which a reader of version 1 must not take for
/// whole checkpoints; 3 lets a delta hold only the admission-sketch counters
/// that grew since its parent (`admission_changes`), which a reader of version 2
/// would take for the whole sketch.
pub const FORMAT_VERSION: u32 = 3;

/// The oldest layout this build reads (version 1: whole checkpoints only).
pub const OLDEST_READABLE_VERSION: u32 = 1;

/// Where a delta sits in its chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaLink {
    /// The step of the checkpoint this one holds the changes since (a whole one or a delta).
    pub parent: u64,
    /// The step of the whole checkpoint the chain starts from.
    pub base: u64,
}

/// The manifest of one checkpoint (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// Global training steps taken (parameter updates).
    pub step: u64,
    /// Epochs completed before the current one.
    pub epoch: u64,
    /// Global steps taken in the current epoch.
    pub steps_in_epoch: u64,
    /// Training samples seen so far (all workers, all epochs).
    pub samples: u64,
    /// Seed of the run (data generation, hashing, shuffles).
    pub seed: u64,
    /// Global batch size: the data position counts steps of this many samples.
    pub batch_size: u64,
    /// Workers of the run that wrote the checkpoint (one shard file each).
    pub workers: usize,
    /// [`config_hash`] of `config`.
    pub config_hash: String,
    /// The model, table sizes and optimizers, as JSON.
    pub config: Value,
    /// How features were made from records (see the module docs); `None` when not recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<Value>,
    /// Where the data readers resume.
    pub data_position: DataPosition,
    /// Running training statistics, so a resumed run reports what an uninterrupted one would.
    pub progress: TrainingProgress,
    /// Every other file of the checkpoint, by name.
    pub files: BTreeMap<String, FileEntry>,
    /// A delta: its shards hold only the rows changed since `parent` (and the
    /// ids removed since); the dense file is whole. `None`: a whole checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<DeltaLink>,
    /// The shards leave out the rows never updated, which hold their seeded
    /// initial values (the fixed store). Of a chain, its base says it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub updated_only: bool,
}

/// Where the data readers resume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DataPosition {
    /// Epoch of the readers (Parquet shuffles depend on it).
    pub epoch: u64,
    /// Global steps already read in that epoch.
    pub global_steps_in_epoch: u64,
    /// Workers of all processes that read the data to this position: readers of files
    /// split them between the workers by position, so only the same count can continue
    /// inside an epoch. `None` in checkpoints written before it was recorded, whose
    /// [`Manifest::workers`] (one shard file per worker) says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// `topic/partition` → next offset, for a Kafka source (empty for files).
    #[serde(default)]
    pub kafka_offsets: BTreeMap<String, i64>,
    /// `topic/partition` → fingerprint (xxh3-64, 16 hex digits) of the record just before
    /// the partition's next offset, so that a resumed run notices a re-created topic.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kafka_last_records: BTreeMap<String, String>,
    /// The `--data` files the position counts in, in reading order (see
    /// [`super::inputs`]); empty for generated data, Kafka, and checkpoints written
    /// before they were recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<super::inputs::InputFile>,
    /// How the epochs after the first read those files (`in file order`, `in blocks of …`):
    /// a resume inside such an epoch must read the rest of it the same way. `None` for
    /// generated data, Kafka, and checkpoints written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle: Option<String>,
    /// Dead-letter file (its absolute path on the machine, links resolved; older
    /// checkpoints hold the name the run was given) → its length in bytes at the
    /// checkpoint, for a Kafka source: the records dead-lettered before the offsets, made
    /// durable with the checkpoint. It lists the files of every earlier run of the
    /// lineage, not only those this run wrote. A resumed run keeps those bytes of each
    /// and drops the rest (records after the offsets, read again). Empty for files.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dead_letter_bytes: BTreeMap<String, u64>,
}

/// Running statistics of the training loop at the checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingProgress {
    /// Σ training loss over all steps so far.
    pub loss_total: f64,
    /// `(Σ loss, samples)` of the last steps (the running loss window), oldest first.
    pub loss_window: Vec<(f64, u64)>,
    /// Malformed records skipped before the current epoch, by reason index.
    pub bad_records_before_epoch: Vec<u64>,
    /// The evaluations so far, in order (the early-stopping state is derived from them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evaluations: Vec<crate::metrics::Evaluation>,
    /// The step of the best evaluation so far; a checkpoint of that step is the one `DIR/best` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_step: Option<u64>,
    /// Samples trained on other data before the data the run reads now (a `--new-data`
    /// resume of a Kafka source): the bad-record budget counts from there.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub samples_before_data: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Size and checksum of one file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Length in bytes.
    pub bytes: u64,
    /// xxh3-128 of the whole file, 32 lowercase hex digits.
    pub xxh3_128: String,
}

/// The hash of a configuration: xxh3-64 of its compact JSON, 16 hex digits.
pub fn config_hash(config: &Value) -> String {
    let text = serde_json::to_string(config).unwrap_or_default();
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
}

/// Values longer than this are shortened in difference reports.
const SHOWN: usize = 120;

fn shown(v: Option<&Value>) -> String {
    let s = v.map_or_else(|| "absent".to_string(), Value::to_string);
    if s.chars().count() > SHOWN {
        format!("{}…", s.chars().take(SHOWN).collect::<String>())
    } else {
        s
    }
}

/// Every leaf where `a` and `b` differ, as `(path, a's value, b's value)`: objects are
/// compared key by key (the path joins keys with `.`; `config` names a difference at the
/// top), anything else as a whole; values are shortened JSON, `absent` for a missing key.
pub fn value_differences(a: &Value, b: &Value) -> Vec<(String, String, String)> {
    fn walk(path: &str, a: Option<&Value>, b: Option<&Value>, out: &mut Vec<(String, String, String)>) {
        if let (Some(Value::Object(x)), Some(Value::Object(y))) = (a, b) {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let sub = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                walk(&sub, x.get(k), y.get(k), out);
            }
        } else if let (Some(Value::Array(x)), Some(Value::Array(y)), true) = (a, b, a != b) {
            // Lists of objects of one length (a spec's columns) differ item by item.
            if x.len() == y.len() && x.iter().chain(y).all(Value::is_object) {
                for (i, (u, v)) in x.iter().zip(y).enumerate() {
                    walk(&format!("{path}[{i}]"), Some(u), Some(v), out);
                }
            } else {
                let name = if path.is_empty() { "config" } else { path };
                out.push((name.to_string(), shown(a), shown(b)));
            }
        } else if a != b {
            let name = if path.is_empty() { "config" } else { path };
            out.push((name.to_string(), shown(a), shown(b)));
        }
    }
    let mut out = Vec::new();
    walk("", Some(a), Some(b), &mut out);
    out
}

/// Every place where `now` differs from `checkpoint`, as `path: X in the checkpoint, Y now`.
pub fn config_differences(checkpoint: &Value, now: &Value) -> Vec<String> {
    value_differences(checkpoint, now)
        .into_iter()
        .map(|(name, a, b)| format!("{name}: {a} in the checkpoint, {b} now"))
        .collect()
}

/// The configuration a manifest records of a trainer (and compares a resumed run's
/// with): the trainer configuration without the seed (which the manifest holds
/// separately), without the exchange (a run may resume with another) and without the
/// store settings when they are the default (the fixed store).
pub fn recorded_config(config: &TrainerConfig) -> Value {
    // Through text, so f32 hyper-parameters read `0.001`, not their f64 widening.
    let text = serde_json::to_string(config).unwrap_or_default();
    let mut v: Value = serde_json::from_str(&text).unwrap_or_default();
    if let Some(map) = v.as_object_mut() {
        map.remove("seed");
        map.remove("exchange");
        // Checkpoints written before stores existed still match.
        if config.store == StoreConfig::default() {
            map.remove("store");
        }
    }
    v
}

impl Manifest {
    /// The manifest of a checkpoint of a trainer of `config` at `step`, with global batch
    /// size `batch_size`, for a program that writes checkpoints itself
    /// ([`write_checkpoint`](super::write::write_checkpoint) fills in `files`, `workers`
    /// and `updated_only` from the parts, [`Trainer::snapshot`](tiderec_operators::train::Trainer::snapshot)'s):
    /// no feature pipeline, no delta, the data position at `step` steps into the first
    /// epoch and the progress empty, for the caller to change where it knows better.
    pub fn for_trainer(config: &TrainerConfig, step: u64, batch_size: u64) -> Manifest {
        let recorded = recorded_config(config);
        Manifest {
            format_version: FORMAT_VERSION,
            step,
            epoch: 0,
            steps_in_epoch: step,
            samples: step * batch_size,
            seed: config.seed,
            batch_size,
            workers: 0,
            config_hash: config_hash(&recorded),
            config: recorded,
            pipeline: None,
            data_position: DataPosition { global_steps_in_epoch: step, ..DataPosition::default() },
            progress: TrainingProgress::default(),
            files: BTreeMap::new(),
            delta: None,
            updated_only: false,
        }
    }

    /// The workers (of all processes) that read the data to [`Manifest::data_position`]:
    /// as recorded there, or else one per shard file.
    pub fn data_workers(&self) -> usize {
        self.data_position.workers.unwrap_or(self.workers)
    }

    /// Checks that this checkpoint can continue a run with `config`, `seed`
    /// and `batch_size`; the error names every difference.
    pub fn check_compatible(&self, path: &Path, config: &Value, seed: u64, batch_size: u64) -> Result<(), SinkError> {
        let mut differences = config_differences(&self.config, config);
        if differences.is_empty() && self.config_hash != config_hash(config) {
            differences.push(format!(
                "config_hash: {} in the checkpoint, {} now",
                self.config_hash,
                config_hash(config)
            ));
        }
        if self.seed != seed {
            differences.push(format!("seed: {} in the checkpoint, {seed} now", self.seed));
        }
        if self.batch_size != batch_size {
            differences.push(format!("batch_size: {} in the checkpoint, {batch_size} now", self.batch_size));
        }
        if differences.is_empty() {
            Ok(())
        } else {
            Err(SinkError::Incompatible { path: path.display().to_string(), differences: differences.join("; ") })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_of_objects_differ_item_by_item() {
        let a =
            serde_json::json!({"spec": {"categorical": [{"column": "a"}, {"column": "b", "vocabulary": ["1", "2"]}]}});
        let b =
            serde_json::json!({"spec": {"categorical": [{"column": "a"}, {"column": "b", "vocabulary": ["2", "1"]}]}});
        let d = value_differences(&a, &b);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].0, "spec.categorical[1].vocabulary");
        let c = serde_json::json!({"spec": {"categorical": [{"column": "a"}]}});
        assert_eq!(value_differences(&a, &c)[0].0, "spec.categorical", "another length: the list as a whole");
    }

    #[test]
    fn differences_name_the_key() {
        let a = json!({"model": {"Dlrm": {"top": [512, 256, 1], "dim": 16}}, "table_sizes": [10, 20], "lr": 0.001});
        let b = json!({"model": {"Dlrm": {"top": [256, 1], "dim": 16}}, "table_sizes": [10, 20], "lr": 0.001});
        assert_eq!(config_differences(&a, &a), Vec::<String>::new());
        assert_eq!(config_differences(&a, &b), vec!["model.Dlrm.top: [512,256,1] in the checkpoint, [256,1] now"]);
        let c = json!({"model": {"Fm": {}}, "table_sizes": [10, 20]});
        let d = config_differences(&a, &c);
        assert!(d.iter().any(|x| x.starts_with("model.Dlrm: ")), "{d:?}");
        assert!(d.iter().any(|x| x.starts_with("lr: 0.001 in the checkpoint, absent now")), "{d:?}");
        assert_ne!(config_hash(&a), config_hash(&b));
        assert_eq!(config_hash(&a), config_hash(&a.clone()));
    }

    #[test]
    fn compatibility_checks_config_seed_and_batch() {
        let config = json!({"table_sizes": [10]});
        let m = Manifest {
            format_version: FORMAT_VERSION,
            step: 3,
            epoch: 0,
            steps_in_epoch: 3,
            samples: 30,
            seed: 1,
            batch_size: 10,
            workers: 1,
            config_hash: config_hash(&config),
            config: config.clone(),
            pipeline: None,
            data_position: DataPosition::default(),
            progress: TrainingProgress::default(),
            files: BTreeMap::new(),
            delta: None,
            updated_only: false,
        };
        let p = Path::new("ck/ckpt-3");
        m.check_compatible(p, &config, 1, 10).unwrap();
        let e = m.check_compatible(p, &json!({"table_sizes": [11]}), 2, 20).unwrap_err().to_string();
        for needle in ["ck/ckpt-3", "table_sizes: [10] in the checkpoint, [11] now", "seed: 1", "batch_size: 10"] {
            assert!(e.contains(needle), "`{needle}` in {e}");
        }
        // A manifest round-trips through JSON, with an empty Kafka offset map by default.
        let text = serde_json::to_string(&m).unwrap();
        assert!(text.contains("\"kafka_offsets\":{}"), "{text}");
        assert_eq!(serde_json::from_str::<Manifest>(&text).unwrap(), m);
    }
}
