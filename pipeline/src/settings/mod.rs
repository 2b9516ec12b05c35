//! Run settings: each declared once, read from a TOML file and from flags.
//!
//! A setting is one field of one concern's struct ([`DataSettings`], [`ModelSettings`],
//! [`OptimizerSettings`], [`StoreSettings`], [`ExchangeSettings`], [`RunSettings`],
//! [`ClusterSettings`], [`CheckpointSettings`]). That field's type, its doc comment (which is
//! also its `--help` text), its flag and its TOML key are declared there, and its default in
//! the struct's `Default`; nothing else lists settings.
//!
//! Invariants:
//! * A setting's TOML key, its serde name and its clap id are the same snake_case word, and
//!   its flag is that word in kebab-case (`exchange_tables` is spelled `--exchange-table`).
//! * The TOML file is flat: the concerns are flattened, so a file says `dim = 32`, not
//!   `[model] dim = 32`; a key that names no setting is refused, naming the key.
//! * Precedence is default < file < flag: [`Flags::settings`] starts from the defaults
//!   (or the file) and overwrites exactly the settings whose flags were given — no flag has a
//!   clap default, so an absent flag never overwrites the file.
//! * Every numeric setting has a [`range::Range`], declared next to its field; the flag's
//!   parser, the TOML file's deserialisation and [`TrainSettings::check_ranges`] (settings
//!   built in code) all check it, so no setting is checked for one origin only.
//! * Checks beyond a single value's range happen in one place, [`TrainSettings::validate`]
//!   (values that depend on each other or on the machine) and [`crate::applicable::check`]
//!   (settings that the run would ignore).

mod checkpoints;
mod cluster;
mod data;
mod exchange;
mod flags;
mod model;
pub(crate) mod named;
mod optimizer;
pub mod range;
mod run;
mod store;

pub use checkpoints::CheckpointSettings;
pub use cluster::{default_workers, ClusterSettings};
pub use data::{
    DataSettings, ReadAheadMode, RecordPolicy, DEFAULT_BUCKETS, DEFAULT_HASH_SEED, DEFAULT_MAX_LEN, MAX_SAMPLES,
};
pub use exchange::{ExchangeChoice, ExchangeSettings};
pub use flags::{All, ConvertFlags, Featurizing, Flags, OverDefaults, Subset, TrainFlags};
pub use model::{ModelKind, ModelSettings};
pub use optimizer::{DecayKind, OptimizerSettings};
pub use run::{BestMetric, MemoryLimit, ProgressMode, RunSettings};
pub use store::StoreSettings;

use crate::PipelineError;
use clap::Args;
use serde::{Deserialize, Serialize};
use std::path::Path;
use tiderec_operators::ConfigError;

/// All settings of a `tiderec train` (and `online`) run, by concern.
#[derive(Clone, Debug, Default, PartialEq, Args, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainSettings {
    /// Training and evaluation data.
    #[command(flatten)]
    #[serde(flatten)]
    pub data: DataSettings,
    /// The model.
    #[command(flatten)]
    #[serde(flatten)]
    pub model: ModelSettings,
    /// Optimizers and learning-rate schedule.
    #[command(flatten)]
    #[serde(flatten)]
    pub optimizer: OptimizerSettings,
    /// The embedding store.
    #[command(flatten)]
    #[serde(flatten)]
    pub store: StoreSettings,
    /// The exchange between workers.
    #[command(flatten)]
    #[serde(flatten)]
    pub exchange: ExchangeSettings,
    /// Length, batches, seed, evaluation and reports.
    #[command(flatten)]
    #[serde(flatten)]
    pub run: RunSettings,
    /// Workers, devices and processes.
    #[command(flatten)]
    #[serde(flatten)]
    pub cluster: ClusterSettings,
    /// Checkpoints.
    #[command(flatten)]
    #[serde(flatten)]
    pub checkpoints: CheckpointSettings,
}

impl TrainSettings {
    /// Every setting's key (TOML key, serde name and clap id alike).
    pub fn keys() -> Vec<String> {
        match serde_json::to_value(TrainSettings::default()) {
            Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }

    /// Loads a TOML file over the defaults; unknown keys and bad values are errors naming the key.
    pub fn from_toml_file(path: &Path) -> Result<Self, PipelineError> {
        let file_error = |reason: String| PipelineError::ConfigFile { path: path.display().to_string(), reason };
        let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
        Self::from_toml_str(&text).map_err(|e| file_error(e.to_string()))
    }

    /// [`Self::from_toml_file`] for the file's text.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::new("settings", e.to_string()))?;
        let known = Self::keys();
        // Named as the file writes them: an empty or spaced key (`[""]`) is quoted, not blank.
        let unknown: Vec<String> = table.keys().filter(|k| !known.contains(k)).map(|k| toml_key(k)).collect();
        if let Some(first) = unknown.first() {
            let list = unknown.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
            return Err(ConfigError::new(
                first.as_str(),
                format!(
                    "unknown setting{} {list} (the settings are the long flags of `tiderec train --help`, with _ for -)",
                    if unknown.len() == 1 { "" } else { "s" }
                ),
            ));
        }
        Self::from_table(table)
    }

    /// The settings of a TOML table of known keys over the defaults, every value read through
    /// its field's type and range; a bad value is an error naming its key.
    ///
    /// Values stay TOML values until their field reads them, so `nan` and `inf` reach the
    /// ranges (which refuse them) rather than becoming something else on the way.
    fn from_table(table: toml::Table) -> Result<Self, ConfigError> {
        let read = |table: toml::Table| toml::Value::Table(table).try_into::<TrainSettings>();
        match read(table.clone()) {
            Ok(settings) => Ok(settings),
            // Find the key with the bad value: the first that fails on its own.
            Err(whole) => Err(table
                .into_iter()
                .find_map(|(key, v)| {
                    // No setting takes a table: `[optimizer]` over `lr = …` reads as a value of
                    // `optimizer`, and serde's message alone ("unknown variant `lr`") misleads.
                    let nested = if v.is_table() {
                        " (the settings are top-level keys, the long flags with _ for -: no setting takes a table)"
                    } else {
                        ""
                    };
                    let fails = read(toml::Table::from_iter([(key.clone(), v)])).err();
                    fails.map(|e| ConfigError::new(key, format!("{}{nested}", e.message())))
                })
                .unwrap_or_else(|| ConfigError::new("settings", whole.message()))),
        }
    }

    /// Every setting checked against its type and range, as a TOML file's would be: for
    /// settings built or changed in code.
    pub fn check_ranges(&self) -> Result<(), ConfigError> {
        let table = toml::Table::try_from(self).map_err(|e| ConfigError::new("settings", e.to_string()))?;
        Self::from_table(table).map(drop)
    }

    /// The seed of feature hashing: `hash_seed`, or [`DEFAULT_HASH_SEED`] when it is not set
    /// (never `seed`: runs that compare seeds compare models of the same features).
    pub fn hash_seed(&self) -> u64 {
        self.data.hash_seed.unwrap_or(DEFAULT_HASH_SEED)
    }

    /// The dense learning rate: `lr`, or the model's default.
    pub fn dense_lr(&self) -> f32 {
        self.optimizer.lr.unwrap_or(default_learning_rates(self.model.kind).0)
    }

    /// The embedding learning rate: `sparse_lr`, or the model's default.
    pub fn embedding_lr(&self) -> f32 {
        self.optimizer.sparse_lr.unwrap_or(default_learning_rates(self.model.kind).1)
    }
}

/// Clap's parser of a setting with a fixed set of values: its `FromStr`, whose error names them.
fn parse<T: std::str::FromStr>(text: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    text.parse::<T>().map_err(|e| e.to_string())
}

/// The dense and the embedding learning rate of `model` when `lr` / `sparse_lr` are not set
/// (declared with the models: [`tiderec_operators::nn::model_config::default_learning_rates`]).
pub fn default_learning_rates(model: ModelKind) -> (f32, f32) {
    tiderec_operators::nn::model_config::default_learning_rates(model.name())
        .expect("every model kind has default learning rates")
}

/// `key` as a TOML file writes it: bare where TOML allows a bare key (ASCII
/// letters, digits, `_` and `-`), otherwise quoted as the `toml` crate writes
/// a string (`"batch size"`, `'a"b'`), so an empty key reads `""` rather than nothing.
fn toml_key(key: &str) -> String {
    let bare = !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        key.to_string()
    } else {
        toml::Value::String(key.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, Command};
    use tiderec_operators::bad_record::BadRecordPolicy;

    #[test]
    fn the_placeholders_of_named_settings_list_exactly_their_choices() {
        let cmd = TrainSettings::augment_args(Command::new("t"));
        let placeholder = |id: &str| {
            let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap_or_else(|| panic!("no --{id}"));
            arg.get_value_names().unwrap_or_default().iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" ")
        };
        let join = |names: Vec<&str>| names.join("|");
        assert_eq!(placeholder("model"), join(ModelKind::ALL.iter().map(|k| k.name()).collect()));
        assert_eq!(placeholder("lr_decay"), join(DecayKind::ALL.iter().map(|k| k.name()).collect()));
        assert_eq!(placeholder("progress"), join(ProgressMode::ALL.iter().map(|k| k.name()).collect()));
        assert_eq!(placeholder("read_ahead"), join(ReadAheadMode::ALL.iter().map(|k| k.name()).collect()));
    }

    #[test]
    fn flags_override_the_file_and_absent_flags_do_not() {
        let dir = std::env::temp_dir().join(format!("tiderec-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("run.toml");
        std::fs::write(&file, "dim = 32\nresume = true\nbottom = [64, 32]\nstore = \"tiered\"\n").unwrap();
        let config = file.to_str().unwrap();
        let s = TrainFlags::parse_from(["--config", config, "--dim", "8", "--exchange-table", "3=rows"])
            .unwrap()
            .settings()
            .unwrap();
        assert_eq!(s.model.dim, 8, "a flag wins over the file");
        assert!(s.checkpoints.resume, "an absent boolean flag keeps the file's true");
        assert_eq!(s.model.bottom, vec![64, 32], "an absent list flag keeps the file's list");
        assert_eq!(s.store.kind, tiderec_operators::store::StoreKind::Tiered);
        assert_eq!(s.exchange.tables, vec!["3=rows".to_string()]);
        assert_eq!(s.run.batch_size, TrainSettings::default().run.batch_size, "untouched settings keep defaults");
        let s = TrainFlags::parse_from(["--config", config, "--resume=false", "--self-interaction"])
            .unwrap()
            .settings()
            .unwrap();
        assert!(!s.checkpoints.resume && s.model.self_interaction);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn convert_takes_the_featurizing_settings_and_refuses_the_others() {
        let s = ConvertFlags::parse_from(["--seed", "7", "--buckets", "99"]).unwrap().settings().unwrap();
        assert_eq!((s.run.seed, s.data.buckets), (7, 99));
        let e = ConvertFlags::parse_from(["--seed", "7", "--dim", "8", "--lr", "0.1"]).unwrap().settings().unwrap_err();
        let e = e.to_string();
        assert!(e.contains("--dim, --lr do not apply to `convert`"), "{e}");
    }

    #[test]
    fn a_record_policy_over_its_defaults_takes_only_the_flags_given() {
        let parse = |args: &[&str]| {
            let cmd = OverDefaults::<RecordPolicy>::augment_args(Command::new("score").no_binary_name(true));
            let m = cmd.try_get_matches_from(args).unwrap();
            <OverDefaults<RecordPolicy> as clap::FromArgMatches>::from_arg_matches(&m).unwrap().0
        };
        assert_eq!(parse(&[]), RecordPolicy::default());
        assert_eq!(parse(&[]), TrainSettings::default().data.records, "scoring and training share the defaults");
        let p = parse(&["--max-line-bytes", "4096", "--on-bad-record", "fail"]);
        assert_eq!((p.max_line_bytes, p.on_bad_record), (4096, BadRecordPolicy::Fail));
        assert_eq!(p.dead_letters, RecordPolicy::default().dead_letters, "an absent flag keeps its default");
        let cmd = || OverDefaults::<RecordPolicy>::augment_args(Command::new("score").no_binary_name(true));
        for (args, flag) in [
            (["--max-bad-fraction", "1.5"], "--max-bad-fraction"),
            (["--max-bad-fraction", "NaN"], "--max-bad-fraction"),
            (["--max-line-bytes", "63"], "--max-line-bytes"),
        ] {
            let e = cmd().try_get_matches_from(args).unwrap_err().to_string();
            assert!(e.contains(flag) && e.contains(args[1]) && e.contains("allowed range"), "{e}");
        }
        let built = RecordPolicy { max_line_bytes: 63, ..RecordPolicy::default() };
        let e = built.validate().unwrap_err().to_string();
        assert!(e.contains("`max_line_bytes`") && e.contains("[64, "), "{e}");
    }

    #[test]
    fn no_flags_give_the_defaults() {
        assert_eq!(TrainFlags::parse_from(Vec::<String>::new()).unwrap().settings().unwrap(), TrainSettings::default());
    }

    #[test]
    fn every_setting_is_a_flag_and_a_key() {
        let cmd = TrainFlags::augment_args(Command::new("train"));
        let mut ids: Vec<String> =
            cmd.get_arguments().map(|a| a.get_id().to_string()).filter(|id| id != "config").collect();
        let mut keys = TrainSettings::keys();
        ids.sort();
        keys.sort();
        assert_eq!(ids, keys);
    }

    #[test]
    fn non_finite_and_out_of_range_values_are_refused_naming_key_value_and_range() {
        for (line, key, shown, range) in [
            ("lr = nan", "lr", "NaN", "(0, 1000]"),
            ("sparse_lr = inf", "sparse_lr", "inf", "(0, 1000]"),
            ("l2_dense = nan", "l2_dense", "NaN", "[0, 1000]"),
            ("eval_fraction = -inf", "eval_fraction", "-inf", "[0, 1)"),
            ("connect_timeout = 1e300", "connect_timeout", "1e300", "(0, 1e6]"),
            ("batch_size = 0", "batch_size", "0", "[1, 16777216]"),
            ("table_sizes = [5, 0]", "table_sizes", "0", "[1, "),
            ("bottom = [64, 0]", "bottom", "0", "[1, 1048576]"),
            ("workers = 30000", "workers", "30000", "[1, 1024]"),
            ("shuffle_block_bytes = 0", "shuffle_block_bytes", "0", "[4096, 1099511627776]"),
            ("shuffle_block_bytes = 2000000000000", "shuffle_block_bytes", "2000000000000", "[4096, 1099511627776]"),
        ] {
            let e = TrainSettings::from_toml_str(&format!("dim = 8\n{line}")).unwrap_err().to_string();
            let want = format!("`{key}`: {shown} is outside the allowed range {range}");
            assert!(e.contains(&want), "{line}: {e}");
            let flag = format!("--{}", key.replace('_', "-"));
            let value = line.split(" = ").nth(1).unwrap().trim_matches(['[', ']']).replace(' ', "");
            let e = TrainFlags::parse_from([format!("{flag}={value}")]).unwrap_err().to_string();
            assert!(e.contains(&flag) && e.contains(&format!("{shown} is outside the allowed range {range}")), "{e}");
        }
        let mut built = TrainSettings::default();
        built.optimizer.lr = Some(f32::INFINITY);
        let e = built.check_ranges().unwrap_err().to_string();
        assert!(e.contains("`lr`: inf is outside"), "settings built in code are checked too: {e}");
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let e = TrainSettings::from_toml_str("dimm = 3\nbatch_size = 4").unwrap_err().to_string();
        assert!(e.contains("unknown setting `dimm`"), "{e}");
        // Keys no bare TOML key spells are quoted as TOML writes them.
        for (text, shown) in
            [("[\"\"]", "`\"\"`"), ("\"batch size\" = 4", "`\"batch size\"`"), ("\"a\\\"b\" = 1", "`'a\"b'`")]
        {
            let e = TrainSettings::from_toml_str(text).unwrap_err();
            assert_eq!(format!("`{}`", e.key), shown, "{text}");
            assert!(e.to_string().contains(&format!("unknown setting {shown}")), "{text}: {e}");
        }
        let e = TrainSettings::from_toml_str("batch_size = \"big\"").unwrap_err().to_string();
        assert!(e.contains("`batch_size`"), "{e}");
        // A table where a setting is (a nested section) says that settings are flat.
        for text in ["[optimizer]\nlr = 0.1\n", "batch_size = { value = 4 }\n"] {
            let e = TrainSettings::from_toml_str(text).unwrap_err();
            assert!(e.reason.contains("no setting takes a table"), "{text}: {e}");
        }
        let e = TrainSettings::from_toml_str("optimizer = \"lbfgs\"").unwrap_err();
        assert!(!e.reason.contains("table"), "a plain bad value gets no table hint: {e}");
        for (key, value) in [
            ("optimizer", "lbfgs"),
            ("best_metric", "accuracy"),
            ("store", "lru"),
            ("exchange", "all"),
            ("model", "xgboost"),
            ("on_bad_record", "ignore"),
            ("lr_decay", "exponential"),
            ("progress", "fancy"),
            ("max_memory", "lots"),
        ] {
            let e = TrainSettings::from_toml_str(&format!("{key} = \"{value}\"")).unwrap_err().to_string();
            assert!(e.contains(&format!("`{key}`")) && e.contains(value), "{key}: {e}");
            let e = TrainFlags::parse_from([format!("--{}", key.replace('_', "-")), value.to_string()]).unwrap_err();
            assert!(e.to_string().contains(value), "--{key}: {e}");
        }
        let s = TrainSettings::from_toml_str("batch_size = 4\nmodel = \"fm\"").unwrap();
        assert_eq!((s.run.batch_size, s.model.kind.name()), (4, "fm"));
    }
}
