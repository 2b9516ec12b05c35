//! Run settings: defaults, the TOML file (`--config`) and validation.
//!
//! Every setting has a default, so `tiderec train` with no arguments trains
//! on the built-in synthetic stream. A TOML file may set any field (unknown
//! keys are rejected, naming the key); command-line flags override the file.
//! [`TrainSettings::validate`] runs before any work starts.

use crate::PipelineError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiderec_operators::bad_record::BadRecordPolicy;
use tiderec_operators::exchange::TableExchange;
use tiderec_operators::nn::{DienConfig, DlrmConfig, FmConfig, Interest, ModelConfig};
use tiderec_operators::optim::{DenseOptimizerKind, SparseOptimizerKind};
use tiderec_operators::spec::FeatureSpec;
use tiderec_operators::store::{FrequencySource, StoreConfig, StoreKind};
use tiderec_sources::parquet::ParquetDataset;

/// Where samples come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataSpec {
    /// The built-in synthetic Criteo-shaped stream with a hidden teacher.
    Synthetic,
    /// Criteo TSV files (Kaggle `train.txt` layout or 1TB day files).
    Criteo(Vec<PathBuf>),
    /// Avazu CSV files (Kaggle `train` layout, with header).
    Avazu(Vec<PathBuf>),
    /// Delimited files described by a feature spec (`--spec`).
    Csv(Vec<PathBuf>),
    /// The built-in synthetic behaviour stream (DIEN-shaped, with a hidden teacher).
    SyntheticBehavior,
    /// Amazon files in the DIEN `local_train_splitByUser` format.
    AmazonDien(Vec<PathBuf>),
    /// Taobao UserBehavior logs, turned into DIEN samples by a differential-dataflow operator.
    TaobaoBehavior(Vec<PathBuf>),
    /// Taobao display-ad joined CSV (the `taobao-ad` feature-spec preset).
    TaobaoAd(Vec<PathBuf>),
    /// Featurized Parquet files (`tiderec convert`), footers read and columns checked.
    Parquet(ParquetData),
}

/// How the behaviour sequences of a data format map onto its tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceShape {
    /// The table each sequence field reads.
    pub tables: Vec<usize>,
    /// The sparse field holding each sequence's target.
    pub targets: Vec<usize>,
    /// The longest sequence the data can hold, when the data says so (spec
    /// lists cut at their `max_len`); otherwise the `max_len` setting.
    pub max_len: Option<usize>,
}

/// An opened [`ParquetDataset`], shared by the workers; equal when the files are.
#[derive(Clone, Debug)]
pub struct ParquetData(pub Arc<ParquetDataset>);

impl PartialEq for ParquetData {
    fn eq(&self, other: &Self) -> bool {
        self.0.paths().eq(other.0.paths())
    }
}

impl Eq for ParquetData {}

impl DataSpec {
    /// `(dense features, sparse fields)` of the samples this data produces
    /// (`spec` gives the shape of `csv` data).
    pub fn shape(&self, spec: Option<&FeatureSpec>) -> (usize, usize) {
        match self {
            DataSpec::Synthetic | DataSpec::Criteo(_) => (13, 26),
            DataSpec::Avazu(_) => (tiderec_sources::avazu::NUM_DENSE, tiderec_sources::avazu::NUM_SPARSE),
            DataSpec::Csv(_) | DataSpec::TaobaoAd(_) => spec.map_or((0, 0), FeatureSpec::shape),
            DataSpec::SyntheticBehavior | DataSpec::AmazonDien(_) | DataSpec::TaobaoBehavior(_) => {
                (0, tiderec_sources::synthetic_behavior::NUM_SPARSE)
            }
            DataSpec::Parquet(p) => p.0.description().shape(),
        }
    }

    /// The behaviour sequences of this data, if it has any: every sequence
    /// format has `[user, target item, target category]` sparse fields and
    /// `[history items, history categories]` sequences; Parquet files say
    /// theirs in their description; spec-described data (`spec`) has one per
    /// `pooling = "none"` list, reading its target's table.
    pub fn sequences(&self, spec: Option<&FeatureSpec>) -> Option<SequenceShape> {
        use tiderec_sources::synthetic_behavior::{SEQUENCE_TABLES, TARGET_FIELDS};
        match self {
            DataSpec::SyntheticBehavior | DataSpec::AmazonDien(_) | DataSpec::TaobaoBehavior(_) => {
                Some(SequenceShape { tables: SEQUENCE_TABLES.to_vec(), targets: TARGET_FIELDS.to_vec(), max_len: None })
            }
            DataSpec::Parquet(p) => {
                let q = &p.0.description().sequences;
                (!q.is_empty()).then(|| SequenceShape {
                    tables: q.iter().map(|s| s.table).collect(),
                    targets: q.iter().map(|s| s.target).collect(),
                    max_len: q.iter().map(|s| s.max_len).max().flatten(),
                })
            }
            DataSpec::Csv(_) | DataSpec::TaobaoAd(_) => {
                let spec = spec?;
                let targets = spec.sequence_targets();
                (!targets.is_empty()).then(|| SequenceShape {
                    tables: targets.clone(),
                    targets,
                    max_len: spec.sequence_lists().map(|(_, l)| l.max_len).max(),
                })
            }
            _ => None,
        }
    }

    /// True for the built-in generators.
    pub fn is_synthetic(&self) -> bool {
        matches!(self, DataSpec::Synthetic | DataSpec::SyntheticBehavior)
    }

    /// The format name as written in `FORMAT:PATH`.
    pub fn format(&self) -> &'static str {
        match self {
            DataSpec::Synthetic => "synthetic",
            DataSpec::SyntheticBehavior => "synthetic-behavior",
            DataSpec::Criteo(_) => "criteo",
            DataSpec::Avazu(_) => "avazu",
            DataSpec::Csv(_) => "csv",
            DataSpec::AmazonDien(_) => "amazon-dien",
            DataSpec::TaobaoBehavior(_) => "taobao-behavior",
            DataSpec::TaobaoAd(_) => "taobao-ad",
            DataSpec::Parquet(_) => "parquet",
        }
    }

    /// Parses `synthetic`, `synthetic-behavior` or `FORMAT:PATH[,PATH…]`; a directory stands
    /// for its files, sorted (for `parquet`, its `*.parquet` files, whose footers are read here).
    pub fn parse(key: &str, s: &str) -> Result<Self, PipelineError> {
        if s == "synthetic" {
            return Ok(DataSpec::Synthetic);
        }
        if s == "synthetic-behavior" {
            return Ok(DataSpec::SyntheticBehavior);
        }
        let Some((format, rest)) = s.split_once(':') else {
            return Err(PipelineError::config(key, format!("`{s}` is not `synthetic` or `FORMAT:PATH[,PATH…]`")));
        };
        match format {
            "parquet" => {
                let mut paths = Vec::new();
                for p in rest.split(',').filter(|p| !p.is_empty()) {
                    let path = PathBuf::from(p);
                    if path.is_file() {
                        paths.push(path);
                    } else if path.exists() {
                        let files = tiderec_sources::parquet::list_parquet_files(&path)
                            .map_err(|e| PipelineError::config(key, e.to_string()))?;
                        paths.extend(files);
                    } else {
                        return Err(PipelineError::config(key, format!("no such file or directory: {p}")));
                    }
                }
                if paths.is_empty() {
                    return Err(PipelineError::config(key, format!("`{s}` names no files")));
                }
                let dataset = ParquetDataset::open(&paths).map_err(|e| PipelineError::config(key, e.to_string()))?;
                Ok(DataSpec::Parquet(ParquetData(Arc::new(dataset))))
            }
            "criteo" | "avazu" | "csv" | "amazon-dien" | "taobao-behavior" | "taobao-ad" => {
                let mut paths = Vec::new();
                for p in rest.split(',').filter(|p| !p.is_empty()) {
                    let path = PathBuf::from(p);
                    if path.is_dir() {
                        let mut files: Vec<PathBuf> = std::fs::read_dir(&path)
                            .map_err(|e| PipelineError::config(key, format!("cannot list {p}: {e}")))?
                            .filter_map(|e| e.ok().map(|e| e.path()))
                            .filter(|p| p.is_file())
                            .collect();
                        files.sort();
                        paths.extend(files);
                    } else if path.is_file() {
                        paths.push(path);
                    } else {
                        return Err(PipelineError::config(key, format!("no such file or directory: {p}")));
                    }
                }
                if paths.is_empty() {
                    return Err(PipelineError::config(key, format!("`{s}` names no files")));
                }
                Ok(match format {
                    "criteo" => DataSpec::Criteo(paths),
                    "avazu" => DataSpec::Avazu(paths),
                    "amazon-dien" => DataSpec::AmazonDien(paths),
                    "taobao-behavior" => DataSpec::TaobaoBehavior(paths),
                    "taobao-ad" => DataSpec::TaobaoAd(paths),
                    _ => DataSpec::Csv(paths),
                })
            }
            other => Err(PipelineError::config(
                key,
                format!(
                    "unknown data format `{other}` (synthetic, synthetic-behavior, criteo, avazu, csv, \
                     amazon-dien, taobao-behavior, taobao-ad, parquet)"
                ),
            )),
        }
    }
}

/// A `--spec` value: `preset:NAME`, a bare preset name (`elm`, `taobao-ad`, …)
/// or the path of a TOML file (validated; relative vocabulary paths are
/// taken relative to the file's folder).
pub fn resolve_spec(s: &str, buckets: u64, max_len: usize) -> Result<FeatureSpec, PipelineError> {
    let unknown = |name: &str| {
        PipelineError::config("spec", format!("no preset `{name}`; presets: {}", FeatureSpec::PRESETS.join(", ")))
    };
    if let Some(name) = s.strip_prefix("preset:") {
        return FeatureSpec::preset(name, buckets, max_len).ok_or_else(|| unknown(name));
    }
    if let Some(spec) = FeatureSpec::preset(s, buckets, max_len) {
        return Ok(spec);
    }
    let path = std::path::Path::new(s);
    let text =
        std::fs::read_to_string(path).map_err(|e| PipelineError::config("spec", format!("cannot read {s}: {e}")))?;
    FeatureSpec::from_toml_in(&text, path.parent()).map_err(|e| match e {
        tiderec_operators::OperatorError::Config(tiderec_operators::ConfigError { key, reason }) => {
            PipelineError::config(format!("spec.{key}"), format!("{s}: {reason}"))
        }
        e => e.into(),
    })
}

/// All settings of a `tiderec train` run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainSettings {
    /// `synthetic`, `synthetic-behavior` or `FORMAT:PATH[,PATH…]` (criteo, avazu, csv, taobao-ad,
    /// taobao-behavior, amazon-dien, parquet).
    pub data: String,
    /// Feature spec of `csv:` data: `elm` (the Ele.me preset) or a TOML file.
    pub spec: Option<String>,
    /// Held-out data (`criteo:PATH`); without it `eval_fraction` of the data is held out.
    pub eval: Option<String>,
    /// Fraction held out for evaluation when `eval` is not given.
    pub eval_fraction: f64,
    /// Training samples per epoch of the synthetic stream.
    pub samples: u64,
    /// Passes over the training data.
    pub epochs: u64,
    /// Stop after this many training steps.
    pub steps: Option<u64>,
    /// Global batch size (the union of all workers' micro-batches).
    pub batch_size: usize,
    /// Batch size of evaluation steps.
    pub eval_batch_size: usize,
    /// Seed of data generation, initialisation and shuffles (and of hashing unless `hash_seed` is set).
    pub seed: u64,
    /// Seed of feature hashing (record values into table rows); `None`: the value of `seed`.
    /// Recorded in every checkpoint's feature pipeline.
    pub hash_seed: Option<u64>,
    /// How embeddings travel between workers: `rows`, `partial` (DES partial results; lr, fm,
    /// deepfm and wdl), `replicated` (each table's hottest `replicate` fraction held by every
    /// worker) or `auto` (the cost model's per-table choice, measured on the first `plan_steps`
    /// batches).
    pub exchange: String,
    /// Per-table overrides of the exchange, `"T=STRATEGY"` (`rows`, `partial` or
    /// `replicated`), applied after `exchange` (and after `auto`'s plan).
    pub exchange_tables: Vec<String>,
    /// Fraction of each table's rows to replicate (`replicated`, `auto`).
    pub replicate: f64,
    /// Global batches the exchange planner counts ids on (`replicated`, `auto`).
    pub plan_steps: u64,
    /// Dense learning rate (`None`: the model's default, [`default_learning_rates`]).
    pub lr: Option<f32>,
    /// Embedding learning rate (`None`: the model's default, [`default_learning_rates`]).
    pub sparse_lr: Option<f32>,
    /// Dense optimizer: sgd, adagrad, adam.
    pub optimizer: String,
    /// Embedding optimizer: sgd, rowwise-adagrad, lazy-adam, ftrl, ftrl-adagrad.
    pub sparse_optimizer: String,
    /// Worker threads per process.
    pub workers: usize,
    /// Compute device of each worker of this process: `cpu`, `cuda:N`, or a list with one
    /// entry per worker (`cuda:0,cpu`); one entry applies to every worker (see `crate::device`).
    pub device: String,
    /// Processes in a cluster run.
    pub processes: usize,
    /// This process's index in a cluster run.
    pub process: usize,
    /// File with one `host:port` per process.
    pub hosts: Option<PathBuf>,
    /// Seconds a cluster process waits for the others to connect and agree at start-up.
    pub connect_timeout: f64,
    /// Rows per table (every table), unless `table_sizes` is given.
    pub buckets: u64,
    /// Rows of each of the 26 tables.
    pub table_sizes: Option<Vec<u64>>,
    /// Model: dlrm, lr, fm, deepfm, wdl, dien or dien-sum.
    pub model: String,
    /// Longest behaviour history kept per sample (sequence data; the most recent events).
    pub max_len: usize,
    /// Embedding dimension (DLRM) or factor width (FM, DeepFM).
    pub dim: usize,
    /// Bottom MLP widths after the 13 inputs (last = `dim`).
    pub bottom: Vec<usize>,
    /// Top MLP widths after the interaction (last = 1).
    pub top: Vec<usize>,
    /// Include self-interaction terms (DLRM).
    pub self_interaction: bool,
    /// Hidden widths of the deep part (DeepFM, Wide & Deep).
    pub deep: Vec<usize>,
    /// Hidden widths of DIEN's MLP (the paper's 200-80 by default).
    pub mlp: Vec<usize>,
    /// Feature crosses for the wide part of `wdl` / `lr`: `A:B` pairs of sparse-field indices.
    pub crosses: Vec<String>,
    /// `skip` or `fail` on a malformed record.
    pub on_bad_record: String,
    /// Dead-letter file for malformed records.
    pub dead_letters: PathBuf,
    /// Fail the run when more than this fraction of the training records, or of the
    /// evaluation records, is malformed (skipped records / records read, over all workers).
    pub max_bad_fraction: f64,
    /// Refuse to start when the memory estimate exceeds this: `auto` (what the system
    /// reports available), `unlimited`, or a size per process such as `8G`.
    pub max_memory: String,
    /// Longest accepted input line in bytes.
    pub max_line_bytes: usize,
    /// Write the final summary here as JSON.
    pub metrics_json: Option<PathBuf>,
    /// Append one JSON line of metrics per report to this file (`tiderec plot` reads it):
    /// `train` about once a second and after every evaluation, `online` every `--report-seconds`.
    pub metrics_log: Option<PathBuf>,
    /// `auto` (bar on a terminal, lines otherwise), `bar`, `lines` or `none`.
    pub progress: String,
    /// Directory of the checkpoints (`ckpt-<step>` directories); none: no checkpoints.
    pub checkpoint_dir: Option<PathBuf>,
    /// Write a checkpoint every this many global steps (besides every epoch end and the run's end).
    pub checkpoint_every: Option<u64>,
    /// Checkpoints kept in `checkpoint_dir` (older ones are removed).
    pub keep_checkpoints: usize,
    /// Write each checkpoint before training goes on, instead of in the background.
    pub checkpoint_sync: bool,
    /// Continue from the newest valid checkpoint in `checkpoint_dir` (fresh, with a warning, if none).
    pub resume: bool,
    /// Embedding store: `fixed` (dense tables), `dynamic` (hash table with admission and
    /// eviction) or `tiered` (frequency-aware hot tier over a dynamic cold tier).
    pub store: String,
    /// Row budget per worker of a dynamic / tiered store (LFU eviction beyond it).
    pub max_rows: Option<u64>,
    /// Admit an id once seen in this many training steps (dynamic / tiered; ≤ 1: at once).
    pub admit_count: u32,
    /// Admit an unseen id with this probability per sighting (dynamic / tiered).
    pub admit_prob: Option<f64>,
    /// Evict rows not updated for this many training steps (dynamic / tiered).
    pub ttl_steps: Option<u64>,
    /// Hot-tier rows per worker (tiered).
    pub hot_rows: usize,
    /// Training steps of frequency counting before the first hot-tier plan (tiered).
    pub warmup: u64,
    /// Store maintenance interval in training steps: eviction, hot-tier re-planning.
    pub flush_every: u64,
    /// Frequencies of the hot-tier plan (tiered): `exact` (per-row counts), `sketch`
    /// (count-min sketch) or `differential` (differential-dataflow `count`).
    pub freq_source: String,
    /// Count only the last this many training steps (`freq_source = differential`).
    pub freq_window: Option<u64>,
    /// Also evaluate every this many global training steps (besides every epoch's end).
    pub eval_every: Option<u64>,
    /// Stop after this many evaluations without improvement, keeping the best model.
    pub early_stop: Option<u64>,
    /// The figure that ranks evaluations: `auc` (higher is better) or `logloss` (lower).
    pub best_metric: String,
    /// Steps of linear learning-rate warm-up (0: none).
    pub lr_warmup: u64,
    /// Learning-rate decay after the warm-up: `none`, `linear`, `cosine` or `step`.
    pub lr_decay: String,
    /// `linear`/`cosine`: the step at which the rate reaches 0 (default: the run's length,
    /// when known); `step`: the interval between two decays.
    pub lr_decay_steps: Option<u64>,
    /// `step`: the factor of each decay.
    pub lr_decay_rate: f32,
    /// L2 penalty on the dense weights (added to their gradient as `λ·w`).
    pub l2_dense: f32,
    /// L2 penalty on the embedding rows a step touches.
    pub l2_embedding: f32,
    /// FTRL's L1 strength (sparse optimizers `ftrl`, `ftrl-adagrad`).
    pub ftrl_l1: f32,
    /// FTRL's L2 strength.
    pub ftrl_l2: f32,
    /// FTRL's β.
    pub ftrl_beta: f32,
}

impl Default for TrainSettings {
    fn default() -> Self {
        TrainSettings {
            data: "synthetic".into(),
            spec: None,
            eval: None,
            eval_fraction: 0.1,
            samples: 300_000,
            epochs: 1,
            steps: None,
            batch_size: 128,
            eval_batch_size: 4096,
            seed: 42,
            hash_seed: None,
            exchange: "rows".into(),
            exchange_tables: Vec::new(),
            replicate: 0.01,
            plan_steps: 4,
            lr: None,
            sparse_lr: None,
            optimizer: "adam".into(),
            sparse_optimizer: "rowwise-adagrad".into(),
            workers: default_workers(),
            device: "cpu".into(),
            processes: 1,
            process: 0,
            hosts: None,
            connect_timeout: 60.0,
            buckets: 100_000,
            table_sizes: None,
            model: "dlrm".into(),
            max_len: 20,
            dim: 16,
            bottom: vec![512, 256, 64, 16],
            top: vec![512, 256, 1],
            self_interaction: false,
            deep: vec![400, 400, 400],
            mlp: vec![200, 80],
            crosses: Vec::new(),
            on_bad_record: "skip".into(),
            dead_letters: PathBuf::from("tiderec-dead-letters.tsv"),
            max_bad_fraction: 0.01,
            max_memory: "auto".into(),
            max_line_bytes: 64 * 1024,
            metrics_json: None,
            metrics_log: None,
            progress: "auto".into(),
            checkpoint_dir: None,
            checkpoint_every: None,
            keep_checkpoints: 3,
            checkpoint_sync: false,
            resume: false,
            store: "fixed".into(),
            max_rows: None,
            admit_count: 0,
            admit_prob: None,
            ttl_steps: None,
            hot_rows: StoreConfig::default().hot_rows,
            warmup: StoreConfig::default().warmup,
            flush_every: StoreConfig::default().flush_every,
            freq_source: "exact".into(),
            freq_window: None,
            eval_every: None,
            early_stop: None,
            best_metric: "auc".into(),
            lr_warmup: 0,
            lr_decay: "none".into(),
            lr_decay_steps: None,
            lr_decay_rate: 0.5,
            l2_dense: 0.0,
            l2_embedding: 0.0,
            ftrl_l1: 0.0,
            ftrl_l2: 0.0,
            ftrl_beta: 1.0,
        }
    }
}

/// The dense and the embedding learning rate of `model` when `lr` / `sparse_lr` are not set.
///
/// Chosen by measurement: on the real Criteo sample (first 8,000 rows train, last 2,000
/// eval, one epoch, batch 128, seeds 1–3) each pair is the best of a grid of dense rates
/// 0.0003–0.01 and embedding rates 0.002–0.1 within 0.005 AUC (docs/training.md).
pub fn default_learning_rates(model: &str) -> (f32, f32) {
    match model {
        "lr" => (0.01, 0.05),
        "fm" => (0.01, 0.01),
        "deepfm" | "wdl" => (0.001, 0.01),
        _ => (0.001, 0.05),
    }
}

impl TrainSettings {
    /// The dense learning rate: `lr`, or the model's default.
    pub fn dense_lr(&self) -> f32 {
        self.lr.unwrap_or(default_learning_rates(&self.model).0)
    }

    /// The embedding learning rate: `sparse_lr`, or the model's default.
    pub fn embedding_lr(&self) -> f32 {
        self.sparse_lr.unwrap_or(default_learning_rates(&self.model).1)
    }
}

/// One worker per available core, at most 4.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(4)
}

/// Most worker threads one process may run: four per core, and at least [`MIN_WORKER_BOUND`].
///
/// Every worker holds its own replica of the dense model and its own step buffers, and a
/// synchronous step waits for the slowest worker, so threads beyond the cores only add
/// memory and scheduling delay; four per core leaves room for oversubscribed test runs.
pub fn max_workers_per_process() -> usize {
    (4 * std::thread::available_parallelism().map_or(1, |n| n.get())).max(MIN_WORKER_BOUND)
}

/// The per-process worker bound on machines with few cores.
pub const MIN_WORKER_BOUND: usize = 16;

/// Most workers of a run over all processes: every stage of a step sends one message from
/// every worker to every worker, `W²` messages per stage.
pub const MAX_WORKERS_TOTAL: usize = 1024;

/// Settings checked and turned into typed values.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// Training data.
    pub data: DataSpec,
    /// Evaluation data, if separate.
    pub eval: Option<DataSpec>,
    /// Dense optimizer.
    pub optimizer: DenseOptimizerKind,
    /// Embedding optimizer.
    pub sparse_optimizer: SparseOptimizerKind,
    /// Bad-record policy.
    pub policy: BadRecordPolicy,
    /// Table sizes.
    pub table_sizes: Vec<u64>,
    /// Host addresses of a cluster run.
    pub hosts: Vec<String>,
    /// The model.
    pub model: ModelConfig,
    /// `(dense features, sparse fields)` of the data.
    pub shape: (usize, usize),
    /// The feature spec of `csv:` data.
    pub spec: Option<FeatureSpec>,
    /// The table of each sequence field the model reads (empty unless the model is DIEN).
    pub sequence_tables: Vec<usize>,
    /// Feature crosses appended after the data's sparse fields (wide part only).
    pub crosses: Vec<(usize, usize)>,
    /// The embedding store.
    pub store: StoreConfig,
    /// The exchange strategy to set up.
    pub exchange: ExchangeChoice,
    /// Per-table overrides of it, in table order.
    pub exchange_overrides: Vec<(usize, TableOverride)>,
}

/// One table's exchange, forced by `exchange_tables`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableOverride {
    /// Rows, nothing replicated.
    Rows,
    /// DES partial results.
    Partial,
    /// The table's hottest `replicate` fraction on every worker.
    Replicated,
}

impl TableOverride {
    /// How the table's embeddings travel (a replicated table's other rows travel as rows).
    pub fn exchange(self) -> TableExchange {
        if self == TableOverride::Partial {
            TableExchange::Partial
        } else {
            TableExchange::Rows
        }
    }
}

/// Parses `exchange_tables` entries `"T=STRATEGY"` for `tables` sparse fields; errors name the key and the entry.
fn parse_exchange_tables(entries: &[String], tables: usize) -> Result<Vec<(usize, TableOverride)>, PipelineError> {
    let mut out: Vec<(usize, TableOverride)> = Vec::new();
    for entry in entries {
        let bad = |why: String| PipelineError::config("exchange_tables", format!("`{entry}`: {why}"));
        let (t, strategy) = entry.split_once('=').ok_or_else(|| bad("expected TABLE=STRATEGY, e.g. 3=rows".into()))?;
        let t: usize = t.trim().parse().map_err(|_| bad(format!("`{}` is not a table index", t.trim())))?;
        if t >= tables {
            return Err(bad(format!("table {t} does not exist ({tables} sparse fields)")));
        }
        let strategy = match strategy.trim() {
            "rows" => TableOverride::Rows,
            "partial" => TableOverride::Partial,
            "replicated" => TableOverride::Replicated,
            other => return Err(bad(format!("`{other}` is not rows, partial or replicated"))),
        };
        if out.iter().any(|&(u, _)| u == t) {
            return Err(bad(format!("table {t} is set twice")));
        }
        out.push((t, strategy));
    }
    out.sort_by_key(|&(t, _)| t);
    Ok(out)
}

/// The `exchange` setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExchangeChoice {
    /// Rows everywhere.
    Rows,
    /// Every field as DES partial results.
    Partial,
    /// The hottest rows of every table replicated.
    Replicated,
    /// The cost model's choice per table.
    Auto,
}

impl std::str::FromStr for ExchangeChoice {
    type Err = PipelineError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "rows" => ExchangeChoice::Rows,
            "partial" => ExchangeChoice::Partial,
            "replicated" => ExchangeChoice::Replicated,
            "auto" => ExchangeChoice::Auto,
            other => {
                return Err(PipelineError::config(
                    "exchange",
                    format!("`{other}` is not rows, partial, replicated or auto"),
                ))
            }
        })
    }
}

impl Resolved {
    /// The table sizes of the data's own sparse fields (without the crosses' tables).
    pub fn data_table_sizes(&self) -> &[u64] {
        &self.table_sizes[..self.shape.1]
    }

    /// Rows of each cross's table.
    pub fn cross_buckets(&self) -> u64 {
        self.table_sizes.get(self.shape.1).copied().unwrap_or(1)
    }
}

impl TrainSettings {
    /// The seed of feature hashing: `hash_seed`, or `seed` when it is not set.
    pub fn hash_seed(&self) -> u64 {
        self.hash_seed.unwrap_or(self.seed)
    }

    /// Loads a TOML file; unknown keys and bad types are errors naming the key.
    pub fn from_toml_file(path: &Path) -> Result<Self, PipelineError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PipelineError::ConfigFile { path: path.display().to_string(), reason: e.to_string() })?;
        toml::from_str(&text)
            .map_err(|e| PipelineError::ConfigFile { path: path.display().to_string(), reason: e.to_string() })
    }

    /// Checks every setting before any work starts.
    pub fn validate(&self) -> Result<Resolved, PipelineError> {
        let data = DataSpec::parse("data", &self.data)?;
        self.resolve(data)
    }

    /// [`Self::validate`] for `data` given directly (the online trainer's Kafka records
    /// are Criteo-shaped: `DataSpec::Criteo` with no files).
    pub fn resolve(&self, data: DataSpec) -> Result<Resolved, PipelineError> {
        let eval = self.eval.as_deref().map(|e| DataSpec::parse("eval", e)).transpose()?;
        if matches!(eval, Some(DataSpec::Synthetic)) {
            return Err(PipelineError::config("eval", "`synthetic` eval data comes from --eval-fraction"));
        }
        let spec = match (&data, self.spec.as_deref()) {
            (DataSpec::Csv(_), None) => {
                return Err(PipelineError::config(
                    "spec",
                    "`csv:` data needs --spec preset:NAME or --spec FILE.toml (see `tiderec spec list`)",
                ))
            }
            (DataSpec::TaobaoAd(_), None) => Some(FeatureSpec::taobao_ad(self.buckets, self.max_len)),
            (_, None) => None,
            (_, Some(s)) => Some(resolve_spec(s, self.buckets, self.max_len)?),
        };
        if let Some(spec) = &spec {
            spec.validate()?;
        }
        let shape = data.shape(spec.as_ref());
        if let Some(e) = &eval {
            if e.shape(spec.as_ref()) != shape || std::mem::discriminant(e) != std::mem::discriminant(&data) {
                return Err(PipelineError::config("eval", "eval data must have the training data's format"));
            }
            if let (DataSpec::Parquet(t), DataSpec::Parquet(e)) = (&data, e) {
                if !t.0.description().same_layout(e.0.description()) {
                    return Err(PipelineError::config(
                        "eval",
                        "eval Parquet files must have the training files' sparse kinds and table sizes",
                    ));
                }
            }
        }
        let (_, num_sparse) = shape;
        if !(0.0..1.0).contains(&self.eval_fraction) {
            return Err(PipelineError::config(
                "eval_fraction",
                format!("must be in [0, 1), got {}", self.eval_fraction),
            ));
        }
        if self.batch_size == 0 {
            return Err(PipelineError::config("batch_size", "must be positive"));
        }
        if self.eval_batch_size == 0 {
            return Err(PipelineError::config("eval_batch_size", "must be positive"));
        }
        if self.epochs == 0 {
            return Err(PipelineError::config("epochs", "must be positive"));
        }
        if self.max_len == 0 {
            return Err(PipelineError::config("max_len", "must be positive"));
        }
        if self.samples == 0 && data.is_synthetic() {
            return Err(PipelineError::config("samples", "must be positive"));
        }
        if self.workers == 0 {
            return Err(PipelineError::config("workers", "must be positive"));
        }
        let bound = max_workers_per_process();
        if self.workers > bound {
            return Err(PipelineError::config(
                "workers",
                format!(
                    "{} threads in one process is more than {bound} (four per core, at least {MIN_WORKER_BOUND}): \
                     every worker holds its own dense model and buffers and a step waits for the slowest, so \
                     extra threads only slow the run; use --processes to spread workers over machines",
                    self.workers
                ),
            ));
        }
        if self.workers.saturating_mul(self.processes) > MAX_WORKERS_TOTAL {
            return Err(PipelineError::config(
                "workers",
                format!(
                    "{} workers × {} processes is more than {MAX_WORKERS_TOTAL} workers in all (every stage of a \
                     step exchanges one message between every pair of workers)",
                    self.workers, self.processes
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.max_bad_fraction) {
            return Err(PipelineError::config(
                "max_bad_fraction",
                format!("must be in [0, 1], got {}", self.max_bad_fraction),
            ));
        }
        self.max_memory.parse::<crate::memory::MemoryLimit>()?;
        crate::device::Devices::for_workers(&self.device, self.workers)?;
        if self.processes == 0 || self.process >= self.processes {
            return Err(PipelineError::config(
                "process",
                format!("process {} is not below processes {}", self.process, self.processes),
            ));
        }
        if self.batch_size < self.workers * self.processes {
            return Err(PipelineError::config(
                "batch_size",
                format!("{} is smaller than the {} workers", self.batch_size, self.workers * self.processes),
            ));
        }
        let optimizer: DenseOptimizerKind = self.optimizer.parse()?;
        crate::hygiene::validate(self)?;
        let store = self.store_config()?;
        let exchange: ExchangeChoice = self.exchange.parse()?;
        if !(0.0..1.0).contains(&self.replicate) {
            return Err(PipelineError::config("replicate", format!("must be in [0, 1), got {}", self.replicate)));
        }
        if self.plan_steps == 0 {
            return Err(PipelineError::config("plan_steps", "must be at least 1"));
        }
        if exchange == ExchangeChoice::Replicated && store.kind != StoreKind::Fixed {
            return Err(PipelineError::config("exchange", "`replicated` needs the fixed store (--store fixed)"));
        }
        let sparse_optimizer: SparseOptimizerKind = self.sparse_optimizer.parse()?;
        let policy = match self.on_bad_record.as_str() {
            "skip" => BadRecordPolicy::Skip,
            "fail" => BadRecordPolicy::Fail,
            other => return Err(PipelineError::config("on_bad_record", format!("`{other}` is not skip or fail"))),
        };
        if !matches!(self.progress.as_str(), "auto" | "bar" | "lines" | "none") {
            return Err(PipelineError::config(
                "progress",
                format!("`{}` is not auto, bar, lines or none", self.progress),
            ));
        }
        if self.buckets == 0 {
            return Err(PipelineError::config("buckets", "must be positive"));
        }
        let crosses = self.parse_crosses(num_sparse)?;
        let table_sizes = match &self.table_sizes {
            Some(s) if s.len() != num_sparse => {
                return Err(PipelineError::config(
                    "table_sizes",
                    format!("need {num_sparse} sizes for this data, got {}", s.len()),
                ))
            }
            Some(s) if s.contains(&0) => return Err(PipelineError::config("table_sizes", "sizes must be positive")),
            Some(s) => s.clone(),
            None if data == DataSpec::Synthetic => {
                tiderec_sources::synthetic::SyntheticConfig::kaggle_like(self.seed, self.buckets).table_sizes
            }
            None if data == DataSpec::SyntheticBehavior => {
                tiderec_sources::synthetic_behavior::BehaviorConfig::standard(self.seed, self.max_len).table_sizes()
            }
            None => match (&spec, &data) {
                (Some(spec), DataSpec::Csv(_) | DataSpec::TaobaoAd(_)) => spec.table_sizes(),
                // Ids were bucketed at conversion: the files say into how many rows.
                (_, DataSpec::Parquet(p)) => p.0.description().table_sizes(),
                _ => vec![self.buckets; num_sparse],
            },
        };
        if let DataSpec::Parquet(p) = &data {
            let stored = p.0.description().table_sizes();
            if let Some((f, (have, need))) = table_sizes.iter().zip(&stored).enumerate().find(|(_, (h, n))| h < n) {
                return Err(PipelineError::config(
                    "table_sizes",
                    format!("sparse field {f} gets {have} rows, but the Parquet files bucket it into {need}"),
                ));
            }
        }
        if self.checkpoint_dir.is_none() {
            for (key, set) in [("checkpoint_every", self.checkpoint_every.is_some()), ("resume", self.resume)] {
                if set {
                    return Err(PipelineError::config(key, "needs --checkpoint-dir DIR"));
                }
            }
        }
        if self.checkpoint_every == Some(0) {
            return Err(PipelineError::config("checkpoint_every", "must be positive"));
        }
        if self.keep_checkpoints == 0 {
            return Err(PipelineError::config("keep_checkpoints", "must be positive"));
        }
        if self.max_line_bytes < 64 {
            return Err(PipelineError::config("max_line_bytes", "must be at least 64"));
        }
        for (key, lr) in [("lr", self.lr), ("sparse_lr", self.sparse_lr)] {
            if let Some(lr) = lr {
                if !(lr.is_finite() && lr > 0.0) {
                    return Err(PipelineError::config(key, format!("must be a positive number, got {lr}")));
                }
            }
        }
        if !(self.connect_timeout.is_finite() && self.connect_timeout > 0.0) {
            return Err(PipelineError::config(
                "connect_timeout",
                format!("must be a positive number of seconds, got {}", self.connect_timeout),
            ));
        }
        let hosts = if self.processes > 1 {
            let path = self
                .hosts
                .as_ref()
                .ok_or_else(|| PipelineError::config("hosts", "a cluster run (processes > 1) needs --hosts FILE"))?;
            let text = std::fs::read_to_string(path)
                .map_err(|e| PipelineError::config("hosts", format!("cannot read {}: {e}", path.display())))?;
            let hosts: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(String::from)
                .collect();
            if hosts.len() != self.processes {
                return Err(PipelineError::config(
                    "hosts",
                    format!("{} lists {} hosts for {} processes", path.display(), hosts.len(), self.processes),
                ));
            }
            hosts
        } else {
            Vec::new()
        };
        let table_sizes = [table_sizes, vec![self.buckets; crosses.len()]].concat();
        let sequences = data.sequences(spec.as_ref());
        let model = self.model_config_with(shape, sequences.as_ref())?;
        model.validate()?;
        let exchange_overrides = parse_exchange_tables(&self.exchange_tables, model.num_sparse())?;
        if exchange_overrides.iter().any(|&(_, o)| o == TableOverride::Replicated) && store.kind != StoreKind::Fixed {
            return Err(PipelineError::config("exchange_tables", "`replicated` needs the fixed store (--store fixed)"));
        }
        if exchange_overrides.iter().any(|&(_, o)| o == TableOverride::Partial) && model.partial().is_none() {
            return Err(PipelineError::config(
                "exchange_tables",
                format!(
                    "`partial` needs lr, fm, deepfm or wdl without crosses; `{}` has no partial form",
                    model.name()
                ),
            ));
        }
        if exchange == ExchangeChoice::Partial && model.partial().is_none() {
            return Err(PipelineError::config(
                "exchange",
                format!(
                    "`partial` needs a model whose logit reads the rows through per-sample sums and a first \
                     layer (lr, fm, deepfm or wdl without crosses); `{}` has none",
                    model.name()
                ),
            ));
        }
        let sequence_tables = match (&sequences, model.num_sequences()) {
            (Some(q), n) if n > 0 => q.tables.clone(),
            _ => Vec::new(),
        };
        Ok(Resolved {
            data,
            eval,
            optimizer,
            sparse_optimizer,
            policy,
            table_sizes,
            hosts,
            model,
            shape,
            spec,
            sequence_tables,
            crosses,
            store,
            exchange,
            exchange_overrides,
        })
    }

    /// The embedding-store settings, checked (errors name the key).
    pub fn store_config(&self) -> Result<StoreConfig, PipelineError> {
        let store = StoreConfig {
            kind: self.store.parse::<StoreKind>()?,
            max_rows: self.max_rows,
            admit_count: self.admit_count,
            admit_prob: self.admit_prob,
            ttl_steps: self.ttl_steps,
            hot_rows: self.hot_rows,
            warmup: self.warmup,
            flush_every: self.flush_every,
            freq_source: self.freq_source.parse::<FrequencySource>()?,
            freq_window: self.freq_window,
            ..StoreConfig::default()
        };
        store.validate()?;
        Ok(store)
    }

    /// Parses `crosses` (`A:B` field-index pairs) against `num_sparse` fields of the data.
    fn parse_crosses(&self, num_sparse: usize) -> Result<Vec<(usize, usize)>, PipelineError> {
        if !self.crosses.is_empty() && !matches!(self.model.as_str(), "wdl" | "lr") {
            return Err(PipelineError::config(
                "crosses",
                format!("feature crosses feed the wide part of wdl or lr, not `{}`", self.model),
            ));
        }
        self.crosses
            .iter()
            .map(|c| {
                let pair = c.split_once(':').and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
                match pair {
                    Some((a, b)) if a < num_sparse && b < num_sparse && a != b => Ok((a, b)),
                    _ => Err(PipelineError::config(
                        "crosses",
                        format!("`{c}` is not `A:B` with two different field indices below {num_sparse}"),
                    )),
                }
            })
            .collect()
    }

    /// The model these settings describe, for Criteo-shaped data (13 dense, 26 sparse).
    pub fn model_config(&self) -> Result<ModelConfig, PipelineError> {
        self.model_config_for((13, 26))
    }

    /// The model these settings describe for samples of `(dense, sparse)` shape.
    pub fn model_config_for(&self, shape: (usize, usize)) -> Result<ModelConfig, PipelineError> {
        self.model_config_with(shape, None)
    }

    /// The model these settings describe for samples of `(dense, sparse)` shape
    /// with the given behaviour sequences (needed by `dien` and `dien-sum`).
    pub fn model_config_with(
        &self,
        shape: (usize, usize),
        sequences: Option<&SequenceShape>,
    ) -> Result<ModelConfig, PipelineError> {
        let (num_dense, num_sparse) = shape;
        let dien = |interest| match sequences {
            Some(q) => Ok(ModelConfig::Dien(DienConfig {
                num_dense,
                num_sparse,
                dim: self.dim,
                num_sequences: q.tables.len(),
                target_fields: q.targets.clone(),
                max_len: q.max_len.unwrap_or(self.max_len),
                interest,
                mlp: self.mlp.clone(),
            })),
            None => Err(PipelineError::config(
                "model",
                format!(
                    "`{}` needs behaviour sequences: use --data synthetic-behavior, amazon-dien:PATH, \
                     taobao-behavior:PATH, or csv:PATH with a spec keeping lists as sequences \
                     (`pooling = \"none\"`, e.g. --spec preset:elm-dien)",
                    self.model
                ),
            )),
        };
        // Crosses are extra sparse fields after the data's own, read only by the linear part.
        let wide_only = self.crosses.len();
        let fm = |dim, deep: Vec<usize>, fm| {
            ModelConfig::Fm(FmConfig { num_dense, num_sparse: num_sparse + wide_only, dim, deep, fm, wide_only })
        };
        Ok(match self.model.as_str() {
            "dlrm" => ModelConfig::Dlrm(DlrmConfig {
                num_dense,
                num_sparse,
                dim: self.dim,
                bottom: self.bottom.clone(),
                top: self.top.clone(),
                self_interaction: self.self_interaction,
            }),
            "lr" => fm(0, Vec::new(), true),
            "fm" => fm(self.dim, Vec::new(), true),
            "deepfm" => fm(self.dim, self.deep.clone(), true),
            "wdl" => fm(self.dim, self.deep.clone(), false),
            "dien" => dien(Interest::GruAttention)?,
            "dien-sum" => dien(Interest::SumPooling)?,
            other => {
                return Err(PipelineError::config(
                    "model",
                    format!("unknown model `{other}` (dlrm, lr, fm, deepfm, wdl, dien, dien-sum)"),
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_resolve_presets_and_files_and_sequence_lists() {
        for name in ["preset:criteo", "avazu", "preset:elm_y_long", "elm", "taobao-ad", "preset:taobao_ad"] {
            resolve_spec(name, 1000, 20).unwrap();
        }
        let e = resolve_spec("preset:movielens", 1000, 20).unwrap_err().to_string();
        assert!(e.contains("spec") && e.contains("criteo, avazu"), "{e}");
        let dir = std::env::temp_dir().join(format!("tiderec-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("v.txt"), "a\nb\n").unwrap();
        let toml = |pooling: &str| {
            format!(
                "delimiter = \",\"\ncolumns = [\"y\", \"d\", \"c\", \"l\"]\nlabel = {{ column = \"y\" }}\ndense = [{{ column = \"d\" }}]\n\
                 categorical = [{{ column = \"c\", buckets = 3, encoding = \"vocabulary\", vocabulary = \"v.txt\", oov_buckets = 1 }}]\n\
                 list = [{{ column = \"l\", delimiter = \";\", max_len = 5, buckets = 10, pooling = \"{pooling}\" }}]\n"
            )
        };
        let path = dir.join("spec.toml");
        std::fs::write(&path, toml("mean")).unwrap();
        let spec = resolve_spec(path.to_str().unwrap(), 1000, 20).unwrap();
        assert_eq!(spec.table_sizes(), [3, 10], "the vocabulary file was found next to the spec");
        let mut s = TrainSettings {
            data: "csv:Cargo.toml".into(),
            spec: Some(path.display().to_string()),
            ..Default::default()
        };
        s.validate().unwrap();
        std::fs::write(&path, toml("none")).unwrap();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("list[0].target"), "a sequence without a target: {e}");
        // With a hashed target of the same size, `dien` reads the list as a sequence of the target's table.
        let text = toml("none")
            .replace("buckets = 10, pooling", "buckets = 7, target = \"t\", pooling")
            .replace("\"l\"]", "\"l\", \"t\"]")
            .replace("oov_buckets = 1 }]", "oov_buckets = 1 }, { column = \"t\", buckets = 7 }]");
        std::fs::write(&path, text).unwrap();
        s.model = "dien".into();
        let r = s.validate().unwrap();
        assert_eq!(r.sequence_tables, [1], "the sequence reads the table of `t`, sparse field 1");
        match &r.model {
            ModelConfig::Dien(d) => assert_eq!((d.target_fields.as_slice(), d.max_len), (&[1][..], 5)),
            m => panic!("expected dien, got {}", m.name()),
        }
        s.model = "dlrm".into();
        std::fs::write(&path, toml("max")).unwrap();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("pooling") && e.contains("spec.toml"), "{e}");
        s.spec = Some("preset:nope".into());
        assert!(s.validate().unwrap_err().to_string().contains("no preset"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn defaults_validate() {
        let r = TrainSettings::default().validate().unwrap();
        assert_eq!(r.data, DataSpec::Synthetic);
        assert_eq!(r.table_sizes.len(), 26);
    }

    #[test]
    fn errors_name_the_key() {
        type Mutation = Box<dyn Fn(&mut TrainSettings)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("batch_size", Box::new(|s| s.batch_size = 0)),
            ("optimizer", Box::new(|s| s.optimizer = "lbfgs".into())),
            ("on_bad_record", Box::new(|s| s.on_bad_record = "ignore".into())),
            ("data", Box::new(|s| s.data = "criteo:/no/such/file".into())),
            ("data", Box::new(|s| s.data = "parquet".into())),
            ("eval_fraction", Box::new(|s| s.eval_fraction = 1.5)),
            ("model.bottom", Box::new(|s| s.bottom = vec![64, 8])),
            ("hosts", Box::new(|s| s.processes = 2)),
            ("lr", Box::new(|s| s.lr = Some(-1.0))),
            ("connect_timeout", Box::new(|s| s.connect_timeout = 0.0)),
            ("workers", Box::new(|s| s.workers = 100_000)),
            ("workers", Box::new(|s| s.processes = 2000)),
            ("max_bad_fraction", Box::new(|s| s.max_bad_fraction = 1.5)),
            ("max_bad_fraction", Box::new(|s| s.max_bad_fraction = f64::NAN)),
            ("max_memory", Box::new(|s| s.max_memory = "lots".into())),
            ("table_sizes", Box::new(|s| s.table_sizes = Some(vec![5; 3]))),
            ("model", Box::new(|s| s.model = "xgboost".into())),
            ("crosses", Box::new(|s| s.crosses = vec!["0:1".into()])),
            (
                "crosses",
                Box::new(|s| {
                    s.model = "wdl".into();
                    s.crosses = vec!["0:26".into()];
                }),
            ),
            ("resume", Box::new(|s| s.resume = true)),
            ("checkpoint_every", Box::new(|s| s.checkpoint_every = Some(5))),
            (
                "keep_checkpoints",
                Box::new(|s| {
                    s.checkpoint_dir = Some("ck".into());
                    s.keep_checkpoints = 0;
                }),
            ),
            (
                "model.deep",
                Box::new(|s| {
                    s.model = "deepfm".into();
                    s.deep = vec![0];
                }),
            ),
        ];
        for (key, mutate) in cases {
            let mut s = TrainSettings::default();
            mutate(&mut s);
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(key), "expected `{key}` in: {e}");
        }
    }

    #[test]
    fn toml_rejects_unknown_keys() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "batch_size = 256\nlr = 0.1\nconnect_timeout = 5.5\n").unwrap();
        let s = TrainSettings::from_toml_file(&p).unwrap();
        assert_eq!((s.batch_size, s.connect_timeout), (256, 5.5));
        std::fs::write(&p, "batch_sise = 256\n").unwrap();
        let e = TrainSettings::from_toml_file(&p).unwrap_err().to_string();
        assert!(e.contains("batch_sise"), "{e}");
    }
}
