//! Settings checked and turned into typed values.
//!
//! The settings themselves are declared in [`crate::settings`]; here
//! [`TrainSettings::validate`] checks every value before any work starts and
//! resolves the data, the model, the optimizers, the store and the exchange.

pub use crate::settings::ExchangeChoice;
use crate::settings::ModelKind;
use crate::PipelineError;
use std::path::PathBuf;
use std::sync::Arc;
use tiderec_operators::bad_record::BadRecordPolicy;
use tiderec_operators::exchange::TableExchange;
use tiderec_operators::nn::{DienConfig, DlrmConfig, FmConfig, Interest, ModelConfig};
use tiderec_operators::optim::{DenseOptimizerKind, SparseOptimizerKind};
use tiderec_operators::spec::FeatureSpec;
use tiderec_operators::store::{StoreConfig, StoreKind};
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
                    } else if path.is_dir() {
                        let files = tiderec_sources::parquet::list_parquet_files(&path)
                            .map_err(|e| PipelineError::config(key, e.to_string()))?;
                        paths.extend(files);
                    } else if path.exists() {
                        return Err(PipelineError::config(key, format!("{p} is not a regular file or a directory")));
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
                        let files = crate::paths::dir_files(&format!("--{key}"), &path)
                            .map_err(|e| PipelineError::config(key, e.to_string()))?;
                        paths.extend(files);
                    } else if path.is_file() {
                        paths.push(path);
                    } else if path.exists() {
                        return Err(PipelineError::config(key, format!("{p} is not a regular file or a directory")));
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

/// Whether data of `format` ([`DataSpec::format`]) reads a feature spec (`--spec`): only
/// `csv`; `taobao-ad` data reads its own preset.
pub fn reads_spec(format: &str) -> bool {
    format == "csv"
}

/// Why `--spec` does not apply to data of `format`.
pub fn spec_unread(format: &str) -> String {
    format!("describes `csv:` data, not `{format}`")
}

/// Whether `data`, with its feature spec `spec` (csv and taobao-ad data), reads the
/// `max_len` setting (`--max-len`): whether it has behaviour sequences (`synthetic-behavior`,
/// `amazon-dien`, `taobao-behavior`, Parquet files that store sequences, a spec's
/// `pooling = "none"` lists, see [`DataSpec::sequences`]) or id lists to cut (any list of a
/// spec, such as `taobao-ad`'s click sequence). Criteo, Avazu, the Criteo-shaped synthetic
/// stream, specs without lists and Parquet files without sequences have nothing it cuts.
///
/// The one rule for `max_len`, as [`reads_spec`] is for `spec`: [`TrainSettings::resolve`]
/// (`train`, `online`, `convert`) refuses a `max_len` that differs from its default (given
/// as a flag or in a `--config` file; the default is no refusal) for data it returns false
/// for, naming `max_len` and [`max_len_unread`].
pub fn reads_max_len(data: &DataSpec, spec: Option<&FeatureSpec>) -> bool {
    // `taobao-ad` data reads its preset, whose click sequence is a list (spec given or not).
    matches!(data, DataSpec::TaobaoAd(_)) || data.sequences(spec).is_some() || spec.is_some_and(|s| !s.list.is_empty())
}

/// Why `--max-len` does not apply to data of `format`.
pub fn max_len_unread(format: &str) -> String {
    format!("--max-len {}; remove it", max_len_reason(format))
}

/// What `max_len` does, and why data of `format` gives it nothing to do (the words of
/// [`max_len_unread`], and of the settings a run lists as unused).
pub fn max_len_reason(format: &str) -> String {
    format!(
        "keeps the most recent items of behaviour sequences and id lists, and this `{format}` data has no \
         sequences (nor lists) to cut"
    )
}

/// A `--spec` value: `preset:NAME`, a bare preset name (`elm`, `taobao-ad`, …)
/// or the path of a TOML file (validated; relative vocabulary paths are
/// taken relative to the file's folder, and the files read into the spec, so that
/// what trains and what a checkpoint records are the same tokens).
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
    let named = |e| match e {
        tiderec_operators::OperatorError::Config(tiderec_operators::ConfigError { key, reason }) => {
            PipelineError::config(format!("spec.{key}"), format!("{s}: {reason}"))
        }
        e => e.into(),
    };
    let mut spec = FeatureSpec::from_toml_in(&text, path.parent()).map_err(named)?;
    spec.inline_vocabularies().map_err(named)?;
    Ok(spec)
}

pub use crate::settings::{default_learning_rates, default_workers, TrainSettings};

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

/// The addresses of a hosts file's `text` (read from `path`), one `host:port` per line
/// (blank lines and `#` comments skipped): a line that is not `host:port` with a port
/// from 1 to 65535, or that repeats an earlier one, is refused naming the file and line.
fn host_lines(path: &std::path::Path, text: &str) -> Result<Vec<String>, PipelineError> {
    let mut hosts: Vec<(usize, String)> = Vec::new();
    for (n, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("{} line {n}: {line:?}", path.display());
        // An IPv6 host is bracketed (`[::1]:2101`); a host has no blanks.
        let host_ok = |h: &str| {
            !h.is_empty()
                && !h.contains(char::is_whitespace)
                && (!h.contains(':') || (h.starts_with('[') && h.ends_with(']')))
        };
        let port = line.rsplit_once(':').filter(|(host, _)| host_ok(host)).map(|(_, port)| port.parse::<u16>());
        match port {
            Some(Ok(p)) if p > 0 => {}
            _ => {
                return Err(PipelineError::config(
                    "hosts",
                    format!("{} is not host:port with a port from 1 to 65535", at()),
                ))
            }
        }
        if let Some((first, _)) = hosts.iter().find(|(_, h)| h.eq_ignore_ascii_case(line)) {
            return Err(PipelineError::config(
                "hosts",
                format!("{} repeats line {first}: every process needs an address of its own", at()),
            ));
        }
        hosts.push((n, line.to_string()));
    }
    Ok(hosts.into_iter().map(|(_, h)| h).collect())
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
    /// Checks every setting before any work starts.
    pub fn validate(&self) -> Result<Resolved, PipelineError> {
        let data = DataSpec::parse("data", &self.data.source)?;
        self.resolve(data)
    }

    /// [`Self::validate`] for `data` given directly (the online trainer's Kafka records
    /// are Criteo-shaped: `DataSpec::Criteo` with no files).
    pub fn resolve(&self, data: DataSpec) -> Result<Resolved, PipelineError> {
        self.check_ranges()?;
        let eval = self.data.eval.as_deref().map(|e| DataSpec::parse("eval", e)).transpose()?;
        if matches!(eval, Some(DataSpec::Synthetic)) {
            return Err(PipelineError::config("eval", "`synthetic` eval data comes from --eval-fraction"));
        }
        let spec = match (&data, self.data.spec.as_deref()) {
            (DataSpec::Csv(_), None) => {
                return Err(PipelineError::config(
                    "spec",
                    "`csv:` data needs --spec preset:NAME or --spec FILE.toml (see `tiderec spec list`)",
                ))
            }
            (DataSpec::TaobaoAd(_), None) => Some(FeatureSpec::taobao_ad(self.data.buckets, self.data.max_len)),
            (_, None) => None,
            // Never silently unused: other formats make their features their own way.
            (other, Some(_)) if !reads_spec(other.format()) => {
                return Err(PipelineError::config("spec", spec_unread(other.format())))
            }
            (_, Some(s)) => Some(resolve_spec(s, self.data.buckets, self.data.max_len)?),
        };
        let mut spec = spec;
        if let Some(spec) = &spec {
            spec.validate()?;
        }
        // Never silently unused either: a `max_len` given (other than its default) needs data
        // with sequences or lists to cut.
        if self.data.max_len != crate::settings::DEFAULT_MAX_LEN && !reads_max_len(&data, spec.as_ref()) {
            return Err(PipelineError::config("max_len", max_len_unread(data.format())));
        }
        if let Some(spec) = &mut spec {
            // Files learn what the spec leaves to learn (and the fitted spec is validated again).
            if let DataSpec::Csv(paths) | DataSpec::TaobaoAd(paths) = &data {
                // Never from the lines `--eval-fraction` holds out of the same files.
                let holdout = eval.is_none() && self.data.eval_fraction > 0.0;
                let span = if holdout { (0.0, 1.0 - self.data.eval_fraction) } else { (0.0, 1.0) };
                if let Some(note) = crate::spec_fit::fit(spec, paths, span, self.data.records.max_line_bytes)? {
                    eprintln!("{note}");
                }
            }
        }
        let shape = data.shape(spec.as_ref());
        if let (DataSpec::TaobaoBehavior(_), Some(_)) = (&data, &eval) {
            // Its samples come from the whole log at once, split in time order: other
            // files would never be read, and the training split would still lose its tail.
            return Err(PipelineError::config(
                "eval",
                "taobao-behavior samples are made from the training log and held out in time order: evaluate \
                 on its latest samples with --eval-fraction F, not on other files",
            ));
        }
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
        let bound = max_workers_per_process();
        if self.cluster.workers > bound {
            return Err(PipelineError::config(
                "workers",
                format!(
                    "{} threads in one process is more than {bound} (four per core, at least {MIN_WORKER_BOUND}): \
                     every worker holds its own dense model and buffers and a step waits for the slowest, so \
                     extra threads only slow the run; use --processes to spread workers over machines",
                    self.cluster.workers
                ),
            ));
        }
        if self.cluster.workers.saturating_mul(self.cluster.processes) > MAX_WORKERS_TOTAL {
            return Err(PipelineError::config(
                "workers",
                format!(
                    "{} workers × {} processes is more than {MAX_WORKERS_TOTAL} workers in all (every stage of a \
                     step exchanges one message between every pair of workers)",
                    self.cluster.workers, self.cluster.processes
                ),
            ));
        }
        self.data.records.validate()?;
        if crate::device::Devices::for_workers(&self.cluster.device, self.cluster.workers)?.any_cpu() {
            self.model.precision.check_cpu()?;
        }
        if self.cluster.process >= self.cluster.processes {
            return Err(PipelineError::config(
                "process",
                format!("process {} is not below processes {}", self.cluster.process, self.cluster.processes),
            ));
        }
        // Every worker reads its share of each batch: one with a share of 0 would read none
        // of its part of the data.
        let workers = self.cluster.workers * self.cluster.processes;
        for (key, size) in [("batch_size", self.run.batch_size), ("eval_batch_size", self.run.eval_batch_size)] {
            if size < workers {
                return Err(PipelineError::config(key, format!("{size} is smaller than the {workers} workers")));
            }
        }
        let optimizer = self.optimizer.dense;
        crate::hygiene::validate(self)?;
        let store = self.store_config()?;
        let exchange = self.exchange.strategy;
        if exchange == ExchangeChoice::Replicated && store.kind != StoreKind::Fixed {
            return Err(PipelineError::config("exchange", "`replicated` needs the fixed store (--store fixed)"));
        }
        let sparse_optimizer = self.optimizer.sparse;
        let policy = self.data.records.on_bad_record;
        let crosses = self.parse_crosses(num_sparse)?;
        let table_sizes = match &self.data.table_sizes {
            Some(s) if s.len() != num_sparse => {
                return Err(PipelineError::config(
                    "table_sizes",
                    format!("need {num_sparse} sizes for this data, got {}", s.len()),
                ))
            }
            Some(s) => s.clone(),
            None if data == DataSpec::Synthetic => {
                tiderec_sources::synthetic::SyntheticConfig::kaggle_like(self.run.seed, self.data.buckets).table_sizes
            }
            None if data == DataSpec::SyntheticBehavior => {
                tiderec_sources::synthetic_behavior::BehaviorConfig::standard(self.run.seed, self.data.max_len)
                    .table_sizes()
            }
            None => match (&spec, &data) {
                (Some(spec), DataSpec::Csv(_) | DataSpec::TaobaoAd(_)) => spec.table_sizes(),
                // Ids were bucketed at conversion: the files say into how many rows.
                (_, DataSpec::Parquet(p)) => p.0.description().table_sizes(),
                _ => vec![self.data.buckets; num_sparse],
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
        if self.checkpoints.checkpoint_dir.is_none() {
            for (key, set) in
                [("checkpoint_every", self.checkpoints.checkpoint_every.is_some()), ("resume", self.checkpoints.resume)]
            {
                if set {
                    return Err(PipelineError::config(key, "needs --checkpoint-dir DIR"));
                }
            }
        }
        let hosts = if self.cluster.processes > 1 {
            let path =
                self.cluster.hosts.as_ref().ok_or_else(|| {
                    PipelineError::config("hosts", "a cluster run (processes > 1) needs --hosts FILE")
                })?;
            let text = std::fs::read_to_string(path)
                .map_err(|e| PipelineError::config("hosts", format!("cannot read {}: {e}", path.display())))?;
            let hosts = host_lines(path, &text)?;
            if hosts.len() != self.cluster.processes {
                return Err(PipelineError::config(
                    "hosts",
                    format!("{} lists {} hosts for {} processes", path.display(), hosts.len(), self.cluster.processes),
                ));
            }
            hosts
        } else {
            Vec::new()
        };
        let table_sizes = [table_sizes, vec![self.data.buckets; crosses.len()]].concat();
        let sequences = data.sequences(spec.as_ref());
        let model = self.model_config_with(shape, sequences.as_ref())?;
        model.validate()?;
        let exchange_overrides = parse_exchange_tables(&self.exchange.tables, model.num_sparse())?;
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
            kind: self.store.kind,
            max_rows: self.store.max_rows,
            admit_count: self.store.admit_count,
            admit_prob: self.store.admit_prob,
            ttl_steps: self.store.ttl_steps,
            hot_rows: self.store.hot_rows,
            warmup: self.store.warmup,
            flush_every: self.store.flush_every,
            freq_source: self.store.freq_source,
            freq_window: self.store.freq_window,
            ..StoreConfig::default()
        };
        store.validate()?;
        Ok(store)
    }

    /// Parses `crosses` (`A:B` field-index pairs) against `num_sparse` fields of the data.
    fn parse_crosses(&self, num_sparse: usize) -> Result<Vec<(usize, usize)>, PipelineError> {
        if !self.model.crosses.is_empty() && !matches!(self.model.kind, ModelKind::Wdl | ModelKind::Lr) {
            return Err(PipelineError::config(
                "crosses",
                format!("feature crosses feed the wide part of wdl or lr, not `{}`", self.model.kind),
            ));
        }
        self.model
            .crosses
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
                dim: self.model.dim,
                num_sequences: q.tables.len(),
                target_fields: q.targets.clone(),
                max_len: q.max_len.unwrap_or(self.data.max_len),
                interest,
                mlp: self.model.mlp.clone(),
            })),
            None => Err(PipelineError::config(
                "model",
                format!(
                    "`{}` needs behaviour sequences: use --data synthetic-behavior, amazon-dien:PATH, \
                     taobao-behavior:PATH, or csv:PATH with a spec keeping lists as sequences \
                     (`pooling = \"none\"`, e.g. --spec preset:elm-dien)",
                    self.model.kind
                ),
            )),
        };
        // Crosses are extra sparse fields after the data's own, read only by the linear part.
        let wide_only = self.model.crosses.len();
        let fm = |dim, deep: Vec<usize>, fm| {
            ModelConfig::Fm(FmConfig { num_dense, num_sparse: num_sparse + wide_only, dim, deep, fm, wide_only })
        };
        Ok(match self.model.kind {
            ModelKind::Dlrm => ModelConfig::Dlrm(DlrmConfig {
                num_dense,
                num_sparse,
                dim: self.model.dim,
                bottom: self.model.bottom.clone(),
                top: self.model.top.clone(),
                self_interaction: self.model.self_interaction,
            }),
            ModelKind::Lr => fm(0, Vec::new(), true),
            ModelKind::Fm => fm(self.model.dim, Vec::new(), true),
            ModelKind::DeepFm => fm(self.model.dim, self.model.deep.clone(), true),
            ModelKind::Wdl => fm(self.model.dim, self.model.deep.clone(), false),
            ModelKind::Dien => dien(Interest::GruAttention)?,
            ModelKind::DienSum => dien(Interest::SumPooling)?,
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
        let mut s = {
            let mut s = TrainSettings::default();
            s.data.source = "csv:Cargo.toml".into();
            s.data.spec = Some(path.display().to_string());
            s
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
        s.model.kind = crate::settings::ModelKind::Dien;
        let r = s.validate().unwrap();
        assert_eq!(r.sequence_tables, [1], "the sequence reads the table of `t`, sparse field 1");
        match &r.model {
            ModelConfig::Dien(d) => assert_eq!((d.target_fields.as_slice(), d.max_len), (&[1][..], 5)),
            m => panic!("expected dien, got {}", m.name()),
        }
        s.model.kind = crate::settings::ModelKind::Dlrm;
        std::fs::write(&path, toml("max")).unwrap();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("pooling") && e.contains("spec.toml"), "{e}");
        s.data.spec = Some("preset:nope".into());
        assert!(s.validate().unwrap_err().to_string().contains("no preset"));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Settings that would be silently unused are refused: a spec for a format that reads
    /// none, evaluation files for samples derived from the training log.
    #[test]
    fn settings_that_data_would_not_read_are_refused() {
        let mut s = TrainSettings::default();
        s.data.source = "taobao-behavior:Cargo.toml".into();
        s.data.eval = Some("taobao-behavior:Cargo.toml".into());
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("`eval`") && e.contains("--eval-fraction"), "{e}");
        for source in
            ["synthetic", "synthetic-behavior", "criteo:Cargo.toml", "avazu:Cargo.toml", "taobao-ad:Cargo.toml"]
        {
            let mut s = TrainSettings::default();
            s.data.source = source.into();
            s.data.spec = Some("preset:criteo".into());
            let e = s.validate().unwrap_err().to_string();
            let format = source.split(':').next().unwrap();
            assert!(e.contains("`spec`") && e.contains(&format!("not `{format}`")), "{source}: {e}");
        }
    }

    /// `--max-len` cuts sequences and lists: data without any refuses it when given (not
    /// when left at its default), naming the setting and why; data with some takes it.
    #[test]
    fn max_len_is_refused_for_data_without_sequences_or_lists() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("records.txt");
        std::fs::write(&file, "").unwrap();
        let at = |format: &str| format!("{format}:{}", file.display());
        let settings = |source: &str, spec: Option<&str>, max_len: usize| {
            let mut s = TrainSettings::default();
            s.data.source = source.into();
            s.data.spec = spec.map(String::from);
            s.data.max_len = max_len;
            s
        };
        let toml = dir.path().join("spec.toml");
        std::fs::write(
            &toml,
            "delimiter = \",\"\ncolumns = [\"y\", \"c\", \"l\"]\nlabel = { column = \"y\" }\n\
             categorical = [{ column = \"c\", buckets = 7 }]\n\
             list = [{ column = \"l\", delimiter = \";\", max_len = 5, buckets = 7, pooling = \"sum\" }]\n",
        )
        .unwrap();
        let toml = toml.display().to_string();
        let none: [(String, Option<&str>); 5] = [
            ("synthetic".into(), None),
            (at("criteo"), None),
            (at("avazu"), None),
            (at("csv"), Some("preset:criteo")),
            (at("csv"), Some("avazu")),
        ];
        for (source, spec) in &none {
            let format = source.split(':').next().unwrap();
            let e = settings(source, *spec, 7).validate().unwrap_err().to_string();
            assert!(
                e.contains("`max_len`")
                    && e.contains("--max-len")
                    && e.contains(&format!("`{format}` data has no sequences")),
                "{source}: {e}"
            );
            // Left at its default, it is no refusal.
            let ok = settings(source, *spec, crate::settings::DEFAULT_MAX_LEN).validate();
            assert!(ok.as_ref().err().is_none_or(|e| !e.to_string().contains("max_len")), "{source}: {ok:?}");
        }
        // The run's data with sequences or lists takes it.
        let mut s = settings("synthetic-behavior", None, 7);
        s.model.kind = ModelKind::Dien;
        match s.validate().unwrap().model {
            ModelConfig::Dien(d) => assert_eq!(d.max_len, 7),
            m => panic!("expected dien, got {}", m.name()),
        }
        let some: [(String, Option<&str>); 7] = [
            ("synthetic-behavior".into(), None),
            (at("amazon-dien"), None),
            (at("taobao-behavior"), None),
            (at("taobao-ad"), None),
            (at("csv"), Some("preset:taobao_ad")),
            (at("csv"), Some("elm-dien")),
            (at("csv"), Some(toml.as_str())),
        ];
        for (source, spec) in &some {
            let data = DataSpec::parse("data", source).unwrap();
            let spec = spec.map(|s| resolve_spec(s, 100, 7).unwrap());
            assert!(reads_max_len(&data, spec.as_ref()), "{source}");
        }
        for (source, spec) in &none {
            let data = DataSpec::parse("data", source).unwrap();
            let spec = spec.map(|s| resolve_spec(s, 100, 7).unwrap());
            assert!(!reads_max_len(&data, spec.as_ref()), "{source}");
        }
        for (source, spec) in
            [(at("amazon-dien"), None), (at("taobao-behavior"), None), (at("csv"), Some(toml.as_str()))]
        {
            let mut s = settings(&source, spec, 7);
            s.model.kind = ModelKind::Lr;
            s.validate().unwrap();
        }
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
            ("batch_size", Box::new(|s| s.run.batch_size = 0)),
            (
                "eval_batch_size",
                Box::new(|s| {
                    s.cluster.workers = 4;
                    s.run.eval_batch_size = 2;
                }),
            ),
            ("data", Box::new(|s| s.data.source = "criteo:/no/such/file".into())),
            ("data", Box::new(|s| s.data.source = "parquet".into())),
            ("eval_fraction", Box::new(|s| s.data.eval_fraction = 1.5)),
            ("shuffle_block_bytes", Box::new(|s| s.data.shuffle_block_bytes = Some(0))),
            ("model.bottom", Box::new(|s| s.model.bottom = vec![64, 8])),
            ("hosts", Box::new(|s| s.cluster.processes = 2)),
            ("lr", Box::new(|s| s.optimizer.lr = Some(-1.0))),
            ("connect_timeout", Box::new(|s| s.cluster.connect_timeout = 0.0)),
            ("workers", Box::new(|s| s.cluster.workers = 100_000)),
            (
                "workers",
                Box::new(|s| {
                    s.cluster.workers = 4;
                    s.cluster.processes = 300;
                }),
            ),
            ("processes", Box::new(|s| s.cluster.processes = 2000)),
            ("lr", Box::new(|s| s.optimizer.lr = Some(f32::NAN))),
            ("connect_timeout", Box::new(|s| s.cluster.connect_timeout = 1e300)),
            ("table_sizes", Box::new(|s| s.data.table_sizes = Some(vec![0; 26]))),
            ("max_bad_fraction", Box::new(|s| s.data.records.max_bad_fraction = 1.5)),
            ("max_bad_fraction", Box::new(|s| s.data.records.max_bad_fraction = f64::NAN)),
            ("table_sizes", Box::new(|s| s.data.table_sizes = Some(vec![5; 3]))),
            ("crosses", Box::new(|s| s.model.crosses = vec!["0:1".into()])),
            (
                "crosses",
                Box::new(|s| {
                    s.model.kind = crate::settings::ModelKind::Wdl;
                    s.model.crosses = vec!["0:26".into()];
                }),
            ),
            ("resume", Box::new(|s| s.checkpoints.resume = true)),
            ("checkpoint_every", Box::new(|s| s.checkpoints.checkpoint_every = Some(5))),
            (
                "keep_checkpoints",
                Box::new(|s| {
                    s.checkpoints.checkpoint_dir = Some("ck".into());
                    s.checkpoints.keep_checkpoints = 0;
                }),
            ),
            (
                "`deep`: 0 is outside",
                Box::new(|s| {
                    s.model.kind = crate::settings::ModelKind::DeepFm;
                    s.model.deep = vec![0];
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
        assert_eq!((s.run.batch_size, s.cluster.connect_timeout), (256, 5.5));
        std::fs::write(&p, "batch_sise = 256\n").unwrap();
        let e = TrainSettings::from_toml_file(&p).unwrap_err().to_string();
        assert!(e.contains("batch_sise"), "{e}");
    }
}
