//! Learning quality on synthetic data (against the hidden teacher) and on the
//! real Criteo sample.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use tiderec::progress::ProgressMode;
use tiderec::TrainSettings;

#[test]
fn synthetic_auc_is_within_003_of_the_teacher() {
    let settings = {
        let mut s = TrainSettings::default();
        s.cluster.workers = 2;
        s.run.progress = ProgressMode::None;
        s
    };
    let s = tiderec::run::train(&settings).unwrap().unwrap();
    let (auc, teacher) = (s.auc.unwrap(), s.teacher_auc.unwrap());
    eprintln!("model AUC {auc:.4}, teacher AUC {teacher:.4}");
    assert!(teacher > 0.75, "the teacher is informative: {teacher}");
    assert!(auc >= teacher - 0.03, "model AUC {auc} is not within 0.03 of the teacher's {teacher}");
    assert_eq!(s.eval_samples, 30_000);
}

/// Writes the first 8,000 rows of `sample.train` and the last 2,000 to two files in `dir`.
fn split_sample_train(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let path = common::shared_data("criteo/sample.train")?;
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 10_000);
    let (train, eval) = (dir.join("train.txt"), dir.join("eval.txt"));
    for (file, rows) in [(&train, &lines[..8000]), (&eval, &lines[8000..])] {
        let mut f = std::io::BufWriter::new(std::fs::File::create(file).unwrap());
        for l in rows {
            writeln!(f, "{l}").unwrap();
        }
    }
    Some((train, eval))
}

fn criteo_settings(dir: &Path, train: &Path, eval: &Path) -> TrainSettings {
    let mut s = TrainSettings::default();
    s.data.source = format!("criteo:{}", train.display());
    s.data.eval = Some(format!("criteo:{}", eval.display()));
    s.run.progress = ProgressMode::None;
    s.data.records.dead_letters = dir.join("dead.tsv");
    s
}

#[test]
fn criteo_sample_train_reaches_auc_070() {
    let dir = tempfile::tempdir().unwrap();
    let Some((train, eval)) = split_sample_train(dir.path()) else { return };
    let s = tiderec::run::train(&criteo_settings(dir.path(), &train, &eval)).unwrap().unwrap();
    eprintln!("criteo sample: AUC {:?}, logloss {:?}, {} samples", s.auc, s.logloss, s.samples);
    assert_eq!(s.eval_samples, 2000);
    assert_eq!(s.bad_records, 0);
    assert!(s.auc.unwrap() >= 0.70, "AUC {:?}", s.auc);
}

#[test]
fn deepfm_and_wide_deep_match_or_beat_dlrm_on_the_criteo_sample() {
    let dir = tempfile::tempdir().unwrap();
    let Some((train, eval)) = split_sample_train(dir.path()) else { return };
    let auc_of = |model: &str, sparse_optimizer: &str, sparse_lr: f32| {
        let settings = {
            let mut s = criteo_settings(dir.path(), &train, &eval);
            s.model.kind = model.parse().unwrap();
            s.optimizer.sparse = sparse_optimizer.parse().unwrap();
            s.optimizer.sparse_lr = Some(sparse_lr);
            s
        };
        tiderec::run::train(&settings).unwrap().unwrap().auc.unwrap()
    };
    let dlrm = auc_of("dlrm", "rowwise-adagrad", 0.01);
    let deepfm = auc_of("deepfm", "rowwise-adagrad", 0.01);
    // Wide & Deep: FTRL on the wide weights, row-wise Adagrad on the deep factors.
    let wdl = auc_of("wdl", "ftrl-adagrad", 0.05);
    let lr = auc_of("lr", "rowwise-adagrad", 0.05);
    eprintln!("criteo sample AUC: deepfm {deepfm:.4}, wdl {wdl:.4}, dlrm {dlrm:.4}, lr {lr:.4}");
    assert!(deepfm >= dlrm, "DeepFM {deepfm} below DLRM {dlrm}");
    assert!(wdl >= dlrm, "Wide&Deep {wdl} below DLRM {dlrm}");
    assert!(lr >= 0.70, "LR {lr}");
}

#[test]
fn avazu_sample_trains_to_auc_068() {
    let Some(path) = common::shared_data("avazu/train") else { return };
    let dir = tempfile::tempdir().unwrap();
    for model in ["dlrm", "deepfm"] {
        let settings = {
            let mut s = TrainSettings::default();
            s.model.kind = model.parse().unwrap();
            s.data.source = format!("avazu:{}", path.display());
            s.data.eval_fraction = 0.2;
            s.run.progress = ProgressMode::None;
            s.data.records.dead_letters = dir.path().join("dead.tsv");
            s
        };
        let s = tiderec::run::train(&settings).unwrap().unwrap();
        eprintln!("avazu {model}: AUC {:?} on {} eval samples", s.auc, s.eval_samples);
        assert_eq!(s.samples + s.eval_samples, 8999, "every row trains or evaluates once");
        assert_eq!(s.bad_records, 0);
        assert!(s.auc.unwrap() >= 0.68, "{model}: AUC {:?}", s.auc);
    }
}

fn behavior_run(data: &str, model: &str, extra: impl FnOnce(&mut TrainSettings)) -> tiderec_sinks::metrics::RunSummary {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = {
        let mut s = TrainSettings::default();
        s.data.source = data.into();
        s.model.kind = model.parse().unwrap();
        s.cluster.workers = 2;
        s.run.progress = ProgressMode::None;
        s.data.records.dead_letters = dir.path().join("dead.tsv");
        s
    };
    extra(&mut settings);
    tiderec::run::train(&settings).unwrap().unwrap()
}

#[test]
fn dien_gets_within_003_of_the_teacher_and_beats_sum_pooling_on_synthetic_behaviour() {
    let samples = |s: &mut TrainSettings| s.data.samples = 200_000;
    let dien = behavior_run("synthetic-behavior", "dien", samples);
    let sum = behavior_run("synthetic-behavior", "dien-sum", samples);
    let (a, b, teacher) = (dien.auc.unwrap(), sum.auc.unwrap(), dien.teacher_auc.unwrap());
    eprintln!("synthetic behaviour: dien AUC {a:.4}, dien-sum AUC {b:.4}, teacher {teacher:.4}");
    assert_eq!(teacher, sum.teacher_auc.unwrap(), "same eval split");
    assert!(a >= teacher - 0.03, "dien AUC {a} is not within 0.03 of the teacher's {teacher}");
    assert!(a > b + 0.01, "GRU + attention ({a}) should beat sum pooling ({b}) on order-dependent labels");
}

#[test]
fn dien_beats_sum_pooling_on_taobao_user_behavior_samples() {
    let Some(path) = common::shared_data("taobao_user_behavior/UserBehavior.csv") else { return };
    let data = format!("taobao-behavior:{}", path.display());
    let dien = behavior_run(&data, "dien", |_| {});
    let sum = behavior_run(&data, "dien-sum", |_| {});
    let (a, b) = (dien.auc.unwrap(), sum.auc.unwrap());
    eprintln!("taobao UserBehavior: dien AUC {a:.4}, dien-sum AUC {b:.4}, {} eval samples", dien.eval_samples);
    // The truncated last line of the sample is the one malformed record.
    assert_eq!(dien.bad_records, 1);
    assert_eq!(dien.bad_records_by_reason.get("field_count"), Some(&1));
    assert_eq!(dien.eval_samples, sum.eval_samples);
    assert!(dien.eval_samples > 10_000);
    assert!(a > b, "dien ({a}) should beat sum pooling ({b})");
    assert!(a > 0.8, "dien AUC {a}");
}
