//! Learning quality on synthetic data (against the hidden teacher) and on the
//! real Criteo sample.

mod common;

use std::io::Write;
use tiderec::TrainSettings;

#[test]
fn synthetic_auc_is_within_003_of_the_teacher() {
    let settings = TrainSettings { workers: 2, progress: "none".into(), ..TrainSettings::default() };
    let s = tiderec::run::train(&settings).unwrap().unwrap();
    let (auc, teacher) = (s.auc.unwrap(), s.teacher_auc.unwrap());
    eprintln!("model AUC {auc:.4}, teacher AUC {teacher:.4}");
    assert!(teacher > 0.75, "the teacher is informative: {teacher}");
    assert!(auc >= teacher - 0.03, "model AUC {auc} is not within 0.03 of the teacher's {teacher}");
    assert_eq!(s.eval_samples, 30_000);
}

#[test]
fn criteo_sample_train_reaches_auc_070() {
    let Some(path) = common::shared_data("criteo/sample.train") else { return };
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 10_000);
    let dir = tempfile::tempdir().unwrap();
    let (train, eval) = (dir.path().join("train.txt"), dir.path().join("eval.txt"));
    let mut f = std::fs::File::create(&train).unwrap();
    for l in &lines[..8000] {
        writeln!(f, "{l}").unwrap();
    }
    let mut f = std::fs::File::create(&eval).unwrap();
    for l in &lines[8000..] {
        writeln!(f, "{l}").unwrap();
    }
    let settings = TrainSettings {
        data: format!("criteo:{}", train.display()),
        eval: Some(format!("criteo:{}", eval.display())),
        progress: "none".into(),
        dead_letters: dir.path().join("dead.tsv"),
        ..TrainSettings::default()
    };
    let s = tiderec::run::train(&settings).unwrap().unwrap();
    eprintln!("criteo sample: AUC {:?}, logloss {:?}, {} samples", s.auc, s.logloss, s.samples);
    assert_eq!(s.eval_samples, 2000);
    assert_eq!(s.bad_records, 0);
    assert!(s.auc.unwrap() >= 0.70, "AUC {:?}", s.auc);
}
