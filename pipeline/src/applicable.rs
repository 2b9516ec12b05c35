//! Settings that do not apply to the command, model or data of a run are refused.
//!
//! A setting counts as given when its value differs from its default (from a
//! flag or from the `--config` file alike); a given setting that the run
//! would ignore is an error naming the setting and what it needs, so a typo
//! in a model name or a flag meant for another model never trains silently
//! with something else. Every refusal of a run is reported at once.

use crate::settings::ExchangeChoice;
use crate::settings::{DecayKind, ModelKind};
use crate::{PipelineError, TrainSettings};
use tiderec_operators::store::StoreKind;

/// The command the settings are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum For {
    /// `tiderec train`.
    Train,
    /// `tiderec online`: the records come from Kafka, the run from its own flags.
    Online,
}

/// Settings of `train` that `online` refuses, each with the reason; `online --help` hides them.
pub const NOT_ONLINE: &[(&str, &str)] = &[
    ("data", "online reads its records from --topic"),
    ("eval", "online reads its records from --topic"),
    ("eval_fraction", "online reads its records from --topic"),
    ("samples", "online reads its records from --topic"),
    ("no_shuffle", "online reads the topic's records in their order, once"),
    ("shuffle_block_bytes", "online reads the topic's records in their order, once"),
    ("read_ahead", "online reads the topic's records as its steps ask for them"),
    ("epochs", "online trains until stopped or, with --until-end, until the topic's end"),
    ("steps", "online trains until stopped or, with --until-end, until the topic's end"),
    ("metrics_json", "online writes its summary with --summary-json"),
    ("eval_every", PREQUENTIAL),
    ("early_stop", PREQUENTIAL),
    ("best_metric", PREQUENTIAL),
    ("eval_batch_size", PREQUENTIAL),
];

/// Why the settings of separate evaluations do not apply to `online`.
const PREQUENTIAL: &str = "online evaluates prequentially, each record before it trains on it (--window)";

/// What a setting needs, when the run does not have it.
fn needs(key: &str, s: &TrainSettings, command: For) -> Option<String> {
    let kind = s.model.kind;
    let model = kind.name();
    let data_format = s.data.source.split(':').next().unwrap_or("");
    let dien = kind.is_dien();
    let on_model = |ok: bool, models: &str| (!ok).then(|| format!("applies to {models}, not --model {model}"));
    if command == For::Online {
        if let Some((_, why)) = NOT_ONLINE.iter().find(|(k, _)| *k == key) {
            return Some(format!("does not apply to `online`: {why}"));
        }
    }
    match key {
        "bottom" | "top" | "self_interaction" => on_model(kind == ModelKind::Dlrm, "dlrm"),
        "deep" => on_model(kind.has_deep_part(), "deepfm and wdl"),
        "mlp" => on_model(dien, "dien and dien-sum"),
        "dim" => on_model(model != "lr", "every model but lr (one weight per id)"),
        // Online records take a spec with `--format csv`, which the stream settings check.
        "spec" if command == For::Online => None,
        "spec" => (!crate::config::reads_spec(data_format)).then(|| crate::config::spec_unread(data_format)),
        "max_len" => max_len_unread(s, command),
        "samples" => (!matches!(data_format, "synthetic" | "synthetic-behavior"))
            .then(|| "sets the size of the synthetic streams; files are read whole".to_string()),
        "eval_fraction" => {
            s.data.eval.is_some().then(|| "holds data out when there is no --eval; --eval is given".into())
        }
        "no_shuffle" | "shuffle_block_bytes"
            if matches!(data_format, "synthetic" | "synthetic-behavior" | "taobao-behavior") =>
        {
            Some(format!(
                "shuffles the epochs of files, not of `{data_format}` samples, which every epoch reads in order"
            ))
        }
        "shuffle_block_bytes" => {
            s.data.no_shuffle.then(|| "sets the blocks of shuffled epochs; --no-shuffle is given".into())
        }
        "max_rows" | "admit_count" | "admit_prob" | "ttl_steps" | "flush_every" => {
            (!matches!(s.store.kind, StoreKind::Dynamic | StoreKind::Tiered))
                .then(|| format!("applies to --store dynamic or tiered, not {}", s.store.kind))
        }
        "hot_rows" | "warmup" | "freq_source" | "freq_window" => {
            (s.store.kind != StoreKind::Tiered).then(|| format!("applies to --store tiered, not {}", s.store.kind))
        }
        "replicate" | "plan_steps" => {
            (!matches!(s.exchange.strategy, ExchangeChoice::Replicated | ExchangeChoice::Auto)
                && !s.exchange.tables.iter().any(|t| t.contains("replicated")))
            .then(|| {
                format!(
                    "applies to --exchange replicated or auto (or a replicated --exchange-table), not {}",
                    s.exchange.strategy
                )
            })
        }
        "checkpoint_every"
        | "keep_checkpoints"
        | "checkpoint_deltas"
        | "checkpoint_delta_share"
        | "checkpoint_sync"
        | "resume" => s.checkpoints.checkpoint_dir.is_none().then(|| "needs --checkpoint-dir".to_string()),
        "new_data" => (!s.checkpoints.resume).then(|| "applies to --resume".to_string()),
        "lr_decay_steps" => (s.optimizer.lr_decay == DecayKind::None)
            .then(|| "sets the horizon of --lr-decay linear, cosine or step; there is none".into()),
        "lr_decay_rate" => (s.optimizer.lr_decay != DecayKind::Step)
            .then(|| format!("applies to --lr-decay step, not {}", s.optimizer.lr_decay)),
        "precision" => {
            if !(dien || kind == ModelKind::Dlrm || kind.has_deep_part()) {
                on_model(false, "the MLPs of dlrm, deepfm, wdl, dien and dien-sum")
            } else {
                None
            }
        }
        "process" | "hosts" | "connect_timeout" => {
            (s.cluster.processes <= 1).then(|| "applies to runs of several processes (--processes)".to_string())
        }
        _ => None,
    }
}

/// Why `max_len` does not apply to the data of a run with `s`: the condition of
/// [`crate::config::reads_max_len`], by which [`TrainSettings::resolve`] refuses a `max_len`
/// given for data without behaviour sequences or id lists to cut. `online`'s records are
/// Criteo-shaped (`--format criteo` or `json`) without a spec and read by it with one
/// (`--format csv`); a spec the data does not read is none (it is refused as `spec`). `None`
/// as well when the data or the spec cannot be read here: their own errors name them.
fn max_len_unread(s: &TrainSettings, command: For) -> Option<String> {
    use crate::config::{max_len_reason, reads_max_len, reads_spec, resolve_spec, DataSpec};
    let data = match command {
        For::Online if s.data.spec.is_some() => DataSpec::Csv(Vec::new()),
        For::Online => DataSpec::Criteo(Vec::new()),
        For::Train => DataSpec::parse("data", &s.data.source).ok()?,
    };
    // `taobao-ad` data reads its preset's lists with or without a spec (`reads_max_len`).
    let spec = match (&data, s.data.spec.as_deref()) {
        (other, Some(_)) if !reads_spec(other.format()) => None,
        (_, Some(spec)) => Some(resolve_spec(spec, s.data.buckets, s.data.max_len).ok()?),
        (_, None) => None,
    };
    (!reads_max_len(&data, spec.as_ref())).then(|| format!("(--max-len) {}", max_len_reason(data.format())))
}

/// Refuses every setting of `settings` that differs from its default and does not apply (see the module docs).
pub fn check(settings: &TrainSettings, command: For) -> Result<(), PipelineError> {
    let given = serde_json::to_value(settings).map_err(|e| PipelineError::config("settings", e.to_string()))?;
    let default = serde_json::to_value(TrainSettings::default()).unwrap_or_default();
    let (Some(given), Some(default)) = (given.as_object(), default.as_object()) else { return Ok(()) };
    // `workers` defaults to the machine's cores; it applies everywhere, like every key without a rule.
    let refused: Vec<String> = given
        .iter()
        .filter(|(key, value)| default.get(key.as_str()) != Some(value))
        .filter_map(|(key, _)| needs(key, settings, command).map(|why| format!("`{key}` {why}")))
        .collect();
    if refused.is_empty() {
        return Ok(());
    }
    let n = refused.len();
    Err(PipelineError::config(
        "settings",
        format!(
            "{} given but unused by this run (remove {}): {}",
            if n == 1 { "a setting is" } else { "settings are" },
            if n == 1 { "it" } else { "them" },
            refused.join("; ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(edit: impl FnOnce(&mut TrainSettings), command: For) -> String {
        let mut s = TrainSettings::default();
        edit(&mut s);
        check(&s, command).err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn defaults_and_applicable_settings_pass() {
        assert_eq!(refused(|_| {}, For::Train), "");
        assert_eq!(refused(|_| {}, For::Online), "");
        assert_eq!(refused(|s| s.model.bottom = vec![64, 16], For::Train), "");
        assert_eq!(
            refused(
                |s| {
                    s.model.kind = crate::settings::ModelKind::DeepFm;
                    s.model.deep = vec![64];
                    s.data.source = "csv:x.csv".into();
                    s.data.spec = Some("preset:criteo".into());
                },
                For::Train
            ),
            ""
        );
        assert_eq!(
            refused(
                |s| {
                    s.store.kind = StoreKind::Tiered;
                    s.store.hot_rows = 7;
                    s.store.max_rows = Some(100);
                },
                For::Train
            ),
            ""
        );
    }

    #[test]
    fn settings_the_run_ignores_are_named() {
        let e = refused(
            |s| {
                s.model.kind = crate::settings::ModelKind::Lr;
                s.model.bottom = vec![64, 16];
                s.model.dim = 8;
            },
            For::Train,
        );
        assert!(e.contains("`bottom` applies to dlrm, not --model lr"), "{e}");
        assert!(e.contains("`dim` applies to every model but lr"), "{e}");
        let e = refused(
            |s| {
                s.data.source = "criteo:day_0".into();
                s.data.no_shuffle = true;
                s.data.shuffle_block_bytes = Some(1 << 20);
            },
            For::Train,
        );
        assert!(e.contains("`shuffle_block_bytes` sets the blocks of shuffled epochs; --no-shuffle is given"), "{e}");
        assert!(!e.contains("`no_shuffle`"), "{e}");
        let e = refused(|s| s.data.no_shuffle = true, For::Train);
        assert!(e.contains("`no_shuffle` shuffles the epochs of files, not of `synthetic` samples"), "{e}");
        let e = refused(|s| s.data.no_shuffle = true, For::Online);
        assert!(e.contains("`no_shuffle` does not apply to `online`"), "{e}");
        let e = refused(
            |s| {
                s.data.source = "criteo:a.tsv".into();
                s.data.spec = Some("preset:criteo".into());
            },
            For::Train,
        );
        assert!(e.contains("`spec` describes `csv:` data, not `criteo`"), "{e}");
        let e = refused(
            |s| {
                s.data.eval = Some("criteo:b.tsv".into());
                s.data.eval_fraction = 0.2;
            },
            For::Train,
        );
        assert!(e.contains("`eval_fraction` holds data out when there is no --eval"), "{e}");
        let e = refused(|s| s.store.hot_rows = 5, For::Train);
        assert!(e.contains("`hot_rows` applies to --store tiered, not fixed"), "{e}");
        let e = refused(|s| s.checkpoints.resume = true, For::Train);
        assert!(e.contains("`resume` needs --checkpoint-dir"), "{e}");
        let e = refused(
            |s| {
                s.model.kind = crate::settings::ModelKind::Fm;
                s.model.precision = tiderec_operators::nn::Precision::Bf16;
            },
            For::Train,
        );
        assert!(e.contains("`precision` applies to the MLPs of dlrm"), "{e}");
        for precision in [tiderec_operators::nn::Precision::Bf16, tiderec_operators::nn::Precision::Tf32] {
            let e = refused(
                |s| {
                    s.cluster.device = "cuda:0".into();
                    s.model.precision = precision;
                },
                For::Train,
            );
            assert!(!e.contains("`precision`"), "{precision} on a GPU worker: {e}");
        }
        for model in [ModelKind::Dlrm, ModelKind::DeepFm, ModelKind::Wdl, ModelKind::Dien] {
            let e = refused(
                |s| {
                    s.model.kind = model;
                    s.model.precision = tiderec_operators::nn::Precision::Bf16;
                },
                For::Train,
            );
            assert!(!e.contains("`precision`"), "{model}: {e}");
        }
    }

    /// `max_len` is listed for data without behaviour sequences or id lists to cut, on the
    /// condition on which resolving the settings refuses it, and left alone at its default.
    #[test]
    fn max_len_is_listed_for_data_without_sequences_or_lists() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("records.txt");
        std::fs::write(&file, "").unwrap();
        let at = |format: &str| format!("{format}:{}", file.display());
        let cases: [(String, Option<&str>, bool); 10] = [
            ("synthetic".into(), None, false),
            (at("criteo"), None, false),
            (at("avazu"), None, false),
            (at("csv"), Some("preset:criteo"), false),
            // A spec the data does not read (refused as `spec`) gives it no lists.
            (at("criteo"), Some("elm-dien"), false),
            ("synthetic-behavior".into(), None, true),
            (at("amazon-dien"), None, true),
            (at("taobao-ad"), None, true),
            (at("csv"), Some("preset:taobao_ad"), true),
            (at("csv"), Some("elm-dien"), true),
        ];
        let unused = |s: &TrainSettings| check(s, For::Train).err().map(|e| e.to_string()).unwrap_or_default();
        for (source, spec, reads) in cases {
            let settings = |max_len: usize| {
                let mut s = TrainSettings::default();
                s.data.source = source.clone();
                s.data.spec = spec.map(String::from);
                s.data.max_len = max_len;
                s
            };
            let format = source.split(':').next().unwrap();
            let e = unused(&settings(7));
            let why = format!(
                "`max_len` (--max-len) keeps the most recent items of behaviour sequences and id lists, and this \
                 `{format}` data has no sequences (nor lists) to cut"
            );
            assert_eq!(e.contains(&why), !reads, "{source} {spec:?}: {e}");
            assert_eq!(e.contains("`max_len`"), !reads, "{source} {spec:?}: {e}");
            assert!(!unused(&settings(crate::settings::DEFAULT_MAX_LEN)).contains("`max_len`"), "{source}");
            // The condition of the refusal of resolving the settings (the spec, refused first, left out).
            let mut s = settings(7);
            s.data.spec = s.data.spec.filter(|_| crate::config::reads_spec(format));
            let resolved = s.validate();
            let refused_there = matches!(&resolved, Err(PipelineError::Config(c)) if c.key == "max_len");
            assert_eq!(refused_there, !reads, "{source} {spec:?}: {:?}", resolved.err());
        }
        // Listed with the other settings the run does not use, all at once.
        let e = refused(
            |s| {
                s.data.max_len = 7;
                s.store.hot_rows = 5;
            },
            For::Train,
        );
        assert!(e.contains("settings are given but unused"), "{e}");
        assert!(e.contains("`max_len` (--max-len) keeps") && e.contains("`hot_rows` applies to --store tiered"), "{e}");
        // `online`'s records are Criteo-shaped without a spec; with one (`--format csv`), its lists decide.
        for (spec, reads) in [(None, false), (Some("preset:criteo"), false), (Some("elm-dien"), true)] {
            let e = refused(
                |s| {
                    s.data.spec = spec.map(String::from);
                    s.data.max_len = 7;
                },
                For::Online,
            );
            assert_eq!(e.contains("`max_len`"), !reads, "{spec:?}: {e}");
        }
    }

    #[test]
    fn online_refuses_the_settings_of_file_runs() {
        let e = refused(
            |s| {
                s.run.epochs = 3;
                s.run.metrics_json = Some("m.json".into());
                s.data.source = "criteo:a.tsv".into();
            },
            For::Online,
        );
        for key in ["`epochs`", "`metrics_json`", "`data`"] {
            assert!(e.contains(key), "{key}: {e}");
        }
        assert!(e.contains("--summary-json"), "{e}");
        assert_eq!(refused(|s| s.run.epochs = 3, For::Train), "");
    }
}
