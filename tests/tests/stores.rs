//! Embedding stores through the whole pipeline: `--store dynamic` (admission
//! and eviction off) and `--store tiered` train the model of `--store fixed`
//! (same loss and AUC within 1e-5), on one worker and on two; bad store
//! settings fail before any work, naming the key.

mod common;

use common::rel_diff;
use tiderec::progress::ProgressMode;
use tiderec::TrainSettings;
use tiderec_operators::store::StoreKind;

fn run(store: &str, workers: usize) -> tiderec_sinks::metrics::RunSummary {
    let settings = {
        let mut s = TrainSettings::default();
        s.model.kind = "deepfm".parse().unwrap();
        s.store.kind = store.parse().unwrap();
        s.store.hot_rows = 2000;
        s.store.warmup = 5;
        s.store.flush_every = 10;
        s.cluster.workers = workers;
        s.run.steps = Some(40);
        s.data.samples = 40 * 256;
        s.run.batch_size = 256;
        s.data.eval_fraction = 0.1;
        s.data.buckets = 20_000;
        s.run.progress = ProgressMode::None;
        s.run.seed = 17;
        s
    };
    tiderec::run::train(&settings).unwrap().expect("single-process runs return a summary")
}

#[test]
fn dynamic_and_tiered_stores_train_the_fixed_model_on_one_and_two_workers() {
    for workers in [1, 2] {
        let fixed = run("fixed", workers);
        for store in ["dynamic", "tiered"] {
            let s = run(store, workers);
            let dloss = rel_diff(fixed.train_loss_mean, s.train_loss_mean);
            let dauc = rel_diff(fixed.auc.unwrap(), s.auc.unwrap());
            let dlog = rel_diff(fixed.logloss.unwrap(), s.logloss.unwrap());
            eprintln!(
                "{store} W={workers}: loss {} vs {}, AUC {:?} vs {:?}, {} rows held, {:?}",
                s.train_loss_mean, fixed.train_loss_mean, s.auc, fixed.auc, s.embedding_rows, s.store
            );
            assert!(dloss <= 1e-5 && dauc <= 1e-5 && dlog <= 1e-5, "{store} W={workers}: {dloss:e} {dauc:e} {dlog:e}");
            assert!(s.embedding_rows < fixed.embedding_rows, "only touched rows are held");
            assert_eq!(s.store.admissions, s.embedding_rows);
            if store == "tiered" {
                assert!(s.store.hot_hits > s.store.cold_hits, "{:?}", s.store);
            }
            // W = 2 equals W = 1 for this store.
            if workers == 2 {
                let one = run(store, 1);
                assert!(rel_diff(one.train_loss_mean, s.train_loss_mean) <= 1e-5);
                assert!(rel_diff(one.auc.unwrap(), s.auc.unwrap()) <= 1e-5);
            }
        }
    }
}

#[test]
fn bad_store_settings_fail_naming_the_key() {
    type Case = (fn(&mut TrainSettings), &'static str);
    let cases: [Case; 4] = [
        (|s| s.store.max_rows = Some(5), "store"),
        (
            |s| {
                s.store.kind = StoreKind::Dynamic;
                s.store.admit_prob = Some(2.0)
            },
            "admit_prob",
        ),
        (
            |s| {
                s.store.kind = StoreKind::Tiered;
                s.store.flush_every = 0
            },
            "flush_every",
        ),
        (
            |s| {
                s.store.kind = StoreKind::Tiered;
                s.store.hot_rows = 0
            },
            "hot_rows",
        ),
    ];
    for (set, key) in cases {
        let mut s = {
            let mut s = TrainSettings::default();
            s.run.progress = ProgressMode::None;
            s
        };
        set(&mut s);
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains(&format!("`{key}`")), "{key}: {err}");
    }
    // The TOML keys are the flags' names.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.toml");
    std::fs::write(
        &path,
        "store = \"tiered\"\nhot_rows = 100\nwarmup = 3\nflush_every = 7\nmax_rows = 1000\nttl_steps = 50\n",
    )
    .unwrap();
    let s = TrainSettings::from_toml_file(&path).unwrap();
    let store = s.store_config().unwrap();
    assert_eq!((store.hot_rows, store.warmup, store.flush_every, store.max_rows), (100, 3, 7, Some(1000)));
}
