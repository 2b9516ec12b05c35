//! Outputs that would overwrite inputs, through the release binary: every such run is refused
//! before anything is written, naming the flag and the path, and the input keeps its bytes;
//! an existing `predict --out`, `export --out`'s files, `plot --out`, `generate --out`,
//! `train --metrics-json` or `online --summary-json` is replaced only with `--overwrite`
//! (the last two also by a `--resume` run); `eval` and `predict` never empty a training
//! run's dead letters.

mod common;

use common::{run_err, run_ok, tiderec};
use std::path::{Path, PathBuf};

/// Quick training flags: a few small steps into small tables.
const QUICK: &[&str] = &["--batch-size", "16", "--buckets", "1000", "--progress", "none", "--steps", "3"];

/// `n` Criteo records (label, 13 integers, 26 hex categories), and one malformed line after
/// the first, so that a run has a dead letter to write.
fn criteo_records(n: usize) -> String {
    let mut text = String::new();
    for i in 0..n {
        let ints: Vec<String> = (0..13).map(|k| ((i * 7 + k * 3) % 11).to_string()).collect();
        let cats: Vec<String> = (0..26).map(|k| format!("{:08x}", (i * 31 + k * 17) % 97)).collect();
        text.push_str(&format!("{}\t{}\t{}\n", i % 2, ints.join("\t"), cats.join("\t")));
        if i == 0 {
            text.push_str("not a record\n");
        }
    }
    text
}

/// Writes `criteo_records(64)` to `dir/name`; returns the path and the bytes written.
fn records_file(dir: &Path, name: &str) -> (PathBuf, Vec<u8>) {
    let path = dir.join(name);
    let text = criteo_records(64);
    std::fs::write(&path, &text).unwrap();
    (path, text.into_bytes())
}

/// `criteo:PATH`.
fn criteo(path: &Path) -> String {
    format!("criteo:{}", path.display())
}

/// Trains a few steps on `data`, checkpointing into `dir/ck`; returns the checkpoint directory.
fn checkpoint(dir: &Path, data: &Path) -> PathBuf {
    let ck = dir.join("ck");
    run_ok(
        tiderec()
            .args(["train", "--max-bad-fraction", "0.5", "--data", &criteo(data)])
            .args(QUICK)
            .arg("--checkpoint-dir")
            .arg(&ck)
            .arg("--dead-letters")
            .arg(dir.join("train-dead.tsv")),
    );
    ck
}

/// Asserts that `err` names `flag` and `path`, and that `path` still holds `bytes`.
fn refused_and_intact(err: &str, flag: &str, path: &Path, bytes: &[u8]) {
    assert!(err.contains(flag) && err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("same file"), "{err}");
    assert_eq!(std::fs::read(path).unwrap(), bytes, "{} was changed", path.display());
}

#[test]
fn train_refuses_dead_letters_or_metrics_naming_an_input_and_leaves_it_intact() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (data, bytes) = records_file(d, "train.txt");
    let (eval, eval_bytes) = records_file(d, "eval.txt");
    let train = |extra: &[&str], output: &str, path: &Path| {
        run_err(tiderec().args(["train", "--max-bad-fraction", "0.5"]).args(QUICK).args(extra).arg(output).arg(path))
    };
    let on_data = ["--data".to_string(), criteo(&data)];
    let on_data = [on_data[0].as_str(), on_data[1].as_str()];
    let e = train(&on_data, "--dead-letters", &data);
    refused_and_intact(&e, "--dead-letters", &data, &bytes);
    let e = train(&on_data, "--metrics-json", &data);
    refused_and_intact(&e, "--metrics-json", &data, &bytes);
    let e = train(&on_data, "--metrics-log", &data);
    refused_and_intact(&e, "--metrics-log", &data, &bytes);
    let e = train(&[on_data[0], on_data[1], "--eval", &criteo(&eval)], "--dead-letters", &eval);
    refused_and_intact(&e, "--eval", &eval, &eval_bytes);
    // A directory of data stands for every file in it.
    let e = train(&["--data", &format!("criteo:{}", d.display())], "--dead-letters", &eval);
    refused_and_intact(&e, "--dead-letters", &eval, &eval_bytes);
    assert!(!d.join("tiderec-dead-letters.tsv").exists());
}

#[test]
fn links_to_an_input_are_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (data, bytes) = records_file(d, "train.txt");
    let hard = d.join("hard.tsv");
    std::fs::hard_link(&data, &hard).unwrap();
    let soft = d.join("soft.tsv");
    std::os::unix::fs::symlink(&data, &soft).unwrap();
    for link in [&hard, &soft] {
        let e = run_err(
            tiderec()
                .args(["train", "--max-bad-fraction", "0.5", "--data", &criteo(&data)])
                .args(QUICK)
                .arg("--dead-letters")
                .arg(link),
        );
        assert!(e.contains("--dead-letters") && e.contains(&link.display().to_string()), "{e}");
        assert_eq!(std::fs::read(&data).unwrap(), bytes, "{} was changed through {}", data.display(), link.display());
    }
}

#[test]
fn predict_refuses_an_out_naming_its_input_and_replaces_a_file_only_with_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (data, _) = records_file(d, "train.txt");
    let ck = checkpoint(d, &data);
    // Records in a file whose name says CSV, so that it is a valid --out.
    let (records, bytes) = records_file(d, "records.csv");
    let predict = |out: &Path, extra: &[&str]| {
        let mut cmd = tiderec();
        cmd.args(["predict", "--max-bad-fraction", "0.5", "--data", &criteo(&records)])
            .arg("--checkpoint")
            .arg(&ck)
            .arg("--dead-letters")
            .arg(d.join("predict-dead.tsv"))
            .arg("--out")
            .arg(out)
            .args(extra);
        cmd
    };
    let e = run_err(&mut predict(&records, &[]));
    refused_and_intact(&e, "--out", &records, &bytes);
    let e = run_err(&mut predict(&records, &["--overwrite"]));
    refused_and_intact(&e, "--out", &records, &bytes);
    let hard = d.join("hard.csv");
    std::fs::hard_link(&records, &hard).unwrap();
    let e = run_err(&mut predict(&hard, &["--overwrite"]));
    assert!(e.contains("--out") && e.contains("hard.csv"), "{e}");
    assert_eq!(std::fs::read(&records).unwrap(), bytes);
    // Dead letters naming the input of predict, or a checkpoint file, are refused too.
    let manifest = std::fs::read_dir(&ck).unwrap().next().unwrap().unwrap().path().join("manifest.json");
    let manifest_bytes = std::fs::read(&manifest).unwrap();
    for (path, bytes) in [(&records, &bytes), (&manifest, &manifest_bytes)] {
        let e = run_err(
            tiderec()
                .args(["eval", "--data", &criteo(&records)])
                .arg("--checkpoint")
                .arg(&ck)
                .arg("--dead-letters")
                .arg(path),
        );
        refused_and_intact(&e, "--dead-letters", path, bytes);
    }
    // An existing scores file is kept unless --overwrite is given.
    let out = d.join("scores.csv");
    std::fs::write(&out, "keep me\n").unwrap();
    let e = run_err(&mut predict(&out, &[]));
    assert!(e.contains("--out") && e.contains("scores.csv") && e.contains("--overwrite"), "{e}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep me\n");
    run_ok(&mut predict(&out, &["--overwrite"]));
    let scores = std::fs::read_to_string(&out).unwrap();
    assert!(scores.starts_with("file,position,score,label\n"), "{scores}");
    assert_eq!(scores.lines().count(), 65, "a header and one row per record");
}

#[test]
fn convert_export_and_plot_refuse_outputs_naming_their_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (data, bytes) = records_file(d, "train.txt");
    let e = run_err(
        tiderec()
            .args(["convert", "--max-bad-fraction", "0.5", "--from", &criteo(&data)])
            .arg("--to")
            .arg(format!("parquet:{}", d.join("pq").display()))
            .arg("--dead-letters")
            .arg(&data),
    );
    refused_and_intact(&e, "--dead-letters", &data, &bytes);
    assert!(!d.join("pq").exists(), "nothing was written");
    let e = run_err(
        tiderec().args(["convert", "--from", &criteo(&data), "--to"]).arg(format!("parquet:{}", data.display())),
    );
    refused_and_intact(&e, "--to", &data, &bytes);
    let ck = checkpoint(d, &data);
    let step = std::fs::read_dir(&ck).unwrap().next().unwrap().unwrap().path();
    let manifest = step.join("manifest.json");
    let manifest_bytes = std::fs::read(&manifest).unwrap();
    let e = run_err(tiderec().arg("export").arg("--checkpoint").arg(&step).arg("--out").arg(&manifest));
    refused_and_intact(&e, "--out", &manifest, &manifest_bytes);
    let log = d.join("metrics.jsonl");
    std::fs::write(&log, "{}\n").unwrap();
    let e = run_err(tiderec().arg("plot").arg("--metrics").arg(&log).arg("--out").arg(&log));
    refused_and_intact(&e, "--out", &log, b"{}\n");
}

/// Asserts that `err` refuses the existing `path` (named by `flag`) for want of `--overwrite`,
/// and that `path` still holds "keep me".
fn kept_without_overwrite(err: &str, flag: &str, path: &Path) {
    assert!(err.contains(flag) && err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("already exists") && err.contains("--overwrite"), "{err}");
    assert_eq!(std::fs::read_to_string(path).unwrap(), "keep me\n", "{} was changed", path.display());
}

#[test]
fn an_existing_metrics_json_is_replaced_only_with_overwrite_or_by_a_resumed_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (data, _) = records_file(d, "train.txt");
    let ck = d.join("ck");
    let train = |steps: &str, metrics: &Path, extra: &[&str]| {
        let mut cmd = tiderec();
        cmd.args(["train", "--max-bad-fraction", "0.5", "--data", &criteo(&data)])
            .args(["--batch-size", "16", "--buckets", "1000", "--progress", "none", "--steps", steps])
            .arg("--checkpoint-dir")
            .arg(&ck)
            .arg("--dead-letters")
            .arg(d.join("dead.tsv"))
            .arg("--metrics-json")
            .arg(metrics)
            .args(extra);
        cmd
    };
    let m = d.join("metrics.json");
    std::fs::write(&m, "keep me\n").unwrap();
    let e = run_err(&mut train("3", &m, &[]));
    kept_without_overwrite(&e, "--metrics-json", &m);
    assert!(!d.join("dead.tsv").exists() && !ck.exists(), "nothing was written");
    run_ok(&mut train("3", &m, &["--overwrite"]));
    assert_eq!(common::metrics(&m)["steps"], 3);
    // A resumed run continues the run that wrote the file and replaces it.
    run_ok(&mut train("6", &m, &["--resume"]));
    let resumed = common::metrics(&m);
    assert_eq!(resumed["resumed_from_step"], 3, "{resumed}");
    assert!(resumed["steps"].as_u64() > Some(3), "{resumed}");
}

#[test]
fn an_existing_metrics_log_is_kept_without_overwrite_or_resume() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = d.join("runs.jsonl");
    std::fs::write(&log, "keep me\n").unwrap();
    let train = |log: &Path, extra: &[&str]| {
        let mut cmd = tiderec();
        cmd.current_dir(d).arg("train").args(QUICK).arg("--metrics-log").arg(log).args(extra);
        cmd
    };
    let e = run_err(&mut train(&log, &[]));
    kept_without_overwrite(&e, "--metrics-log", &log);
    run_ok(&mut train(&log, &["--overwrite"]));
    let lines = std::fs::read_to_string(&log).unwrap();
    assert!(!lines.contains("keep me") && lines.lines().count() >= 2, "{lines}");
    // `--resume` continues the log even with no checkpoint to resume yet.
    let ck = d.join("ck").display().to_string();
    run_ok(&mut train(&log, &["--resume", "--checkpoint-dir", &ck]));
    let resumed = std::fs::read_to_string(&log).unwrap();
    assert!(resumed.starts_with(&lines) && resumed.len() > lines.len(), "appended:\n{resumed}");
    // A device holds nothing to lose.
    run_ok(&mut train(Path::new("/dev/null"), &[]));
}

#[test]
fn no_output_goes_into_a_directory_read_as_data() {
    let dir = tempfile::tempdir().unwrap();
    let days = dir.path().join("days");
    std::fs::create_dir_all(&days).unwrap();
    records_file(&days, "day0.txt");
    // Run inside it, the default dead-letter file would become the next run's data.
    let e = run_err(tiderec().current_dir(&days).args(["train", "--data", "criteo:."]).args(QUICK));
    assert!(e.contains("--dead-letters") && e.contains("reads as data"), "{e}");
    let e = run_err(
        tiderec()
            .current_dir(dir.path())
            .args(["train", "--data", "criteo:days", "--metrics-log", "days/log.jsonl"])
            .args(QUICK),
    );
    assert!(e.contains("--metrics-log") && e.contains("reads as data"), "{e}");
    let names: Vec<_> = std::fs::read_dir(&days).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["day0.txt"], "nothing was written");
}

#[test]
fn an_existing_summary_json_is_refused_before_the_broker_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let summary = dir.path().join("summary.json");
    std::fs::write(&summary, "keep me\n").unwrap();
    let online = |extra: &[&str]| {
        let mut cmd = tiderec();
        // No broker listens on port 1: a run that gets that far fails for want of one.
        cmd.args(["online", "--brokers", "127.0.0.1:1", "--topic", "clicks", "--broker-timeout", "0.5"])
            .args(["--progress", "none", "--dead-letters"])
            .arg(dir.path().join("dead.tsv"))
            .arg("--summary-json")
            .arg(&summary)
            .args(extra);
        cmd
    };
    let e = run_err(&mut online(&[]));
    kept_without_overwrite(&e, "--summary-json", &summary);
    for extra in [&["--overwrite"][..], &["--resume", "--checkpoint-dir", dir.path().join("ck").to_str().unwrap()]] {
        let e = run_err(&mut online(extra));
        assert!(!e.contains("already exists"), "{extra:?}: {e}");
    }
}

#[test]
fn plot_and_generate_replace_an_existing_out_only_with_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let lines = d.join("elm.csv");
    std::fs::write(&lines, "keep me\n").unwrap();
    let generate = |extra: &[&str]| {
        let mut cmd = tiderec();
        cmd.args(["generate", "elm", "--rows", "20", "--out"]).arg(&lines).args(extra);
        cmd
    };
    let e = run_err(&mut generate(&[]));
    kept_without_overwrite(&e, "--out", &lines);
    run_ok(&mut generate(&["--overwrite"]));
    assert_eq!(std::fs::read_to_string(&lines).unwrap().lines().count(), 20);
    // A metrics log to plot.
    let (data, _) = records_file(d, "train.txt");
    let log = d.join("steps.jsonl");
    run_ok(
        tiderec()
            .args(["train", "--max-bad-fraction", "0.5", "--data", &criteo(&data)])
            .args(QUICK)
            .arg("--dead-letters")
            .arg(d.join("dead.tsv"))
            .arg("--metrics-log")
            .arg(&log),
    );
    let png = d.join("curves.png");
    std::fs::write(&png, "keep me\n").unwrap();
    let plot = |extra: &[&str]| {
        let mut cmd = tiderec();
        cmd.args(["plot", "--metrics"]).arg(&log).arg("--out").arg(&png).args(extra);
        cmd
    };
    let e = run_err(&mut plot(&[]));
    kept_without_overwrite(&e, "--out", &png);
    run_ok(&mut plot(&["--overwrite"]));
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"), "a PNG replaced the file");
}

/// An existing export is replaced only with `--overwrite`: without it `export` stops before
/// writing, naming the flag and the existing file (either of the two), and both files keep
/// their bytes; with it both are replaced and no temporary file stays.
#[test]
fn export_replaces_an_existing_export_only_with_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (data, _) = records_file(d, "train.txt");
    let ck = checkpoint(d, &data);
    let out = d.join("serve");
    let export = |extra: &[&str]| {
        let mut cmd = tiderec();
        cmd.args(["export", "--checkpoint"]).arg(&ck).arg("--out").arg(&out).args(extra);
        cmd
    };
    run_ok(&mut export(&[]));
    let files = [out.join("model.safetensors"), out.join("model.json")];
    let bytes = files.clone().map(|f| std::fs::read(f).unwrap());
    let kept = |err: &str, named: &Path| {
        assert!(err.contains(&format!("--out {} already exists", named.display())), "{err}");
        assert!(err.contains("pass --overwrite"), "{err}");
        for (f, b) in files.iter().zip(&bytes) {
            assert_eq!(&std::fs::read(f).unwrap(), b, "{} was changed", f.display());
        }
    };
    for extra in [&[][..], &["--compact"]] {
        kept(&run_err(&mut export(extra)), &files[0]);
    }
    // The description alone is refused too.
    let tensors = d.join("tensors");
    std::fs::rename(&files[0], &tensors).unwrap();
    let e = run_err(&mut export(&[]));
    std::fs::rename(&tensors, &files[0]).unwrap();
    kept(&e, &files[1]);
    run_ok(&mut export(&["--compact", "--overwrite"]));
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(&files[1]).unwrap()).unwrap();
    assert!(config["compact_tables"].is_object(), "the compact export replaced the whole one");
    assert_ne!(std::fs::read(&files[0]).unwrap(), bytes[0], "the tensors were replaced");
    let mut names: Vec<String> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["model.json", "model.safetensors"], "no temporary file stays");
}

/// `eval` and `predict` never empty a dead-letter file they were not given: without
/// `--dead-letters` their malformed records go to files of their own (`eval`'s
/// `tiderec-eval-dead-letters.tsv`, `predict`'s beside its scores file), and the one a
/// training run wrote in the same directory keeps its bytes; named, it is replaced.
#[test]
fn scoring_commands_keep_a_training_runs_dead_letters_unless_given_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // One malformed line among 64 records.
    let (data, _) = records_file(d, "records.txt");
    let ck = checkpoint(d, &data);
    let training = d.join("tiderec-dead-letters.tsv");
    let kept = "train.txt\t7\t512\tbad_label\t0\tx\n";
    std::fs::write(&training, kept).unwrap();
    let score = |command: &str, extra: &[&str]| {
        let mut cmd = tiderec();
        cmd.current_dir(d)
            .args([command, "--max-bad-fraction", "0.5", "--data", &criteo(&data), "--checkpoint"])
            .arg(&ck)
            .args(extra);
        cmd
    };
    let one_dead_letter = |file: &str| {
        let text = std::fs::read_to_string(d.join(file)).unwrap();
        assert!(text.lines().count() == 1 && text.contains("not a record"), "{file}: {text}");
    };
    run_ok(&mut score("eval", &[]));
    assert_eq!(std::fs::read_to_string(&training).unwrap(), kept, "eval emptied the training run's dead letters");
    one_dead_letter("tiderec-eval-dead-letters.tsv");
    let o = run_ok(&mut score("predict", &["--out", "scores.csv"]));
    assert_eq!(std::fs::read_to_string(&training).unwrap(), kept, "predict emptied the training run's dead letters");
    one_dead_letter("scores.csv.dead-letters.tsv");
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("(listed in scores.csv.dead-letters.tsv)"), "{said}");
    run_ok(&mut score("eval", &["--dead-letters", "tiderec-dead-letters.tsv"]));
    one_dead_letter("tiderec-dead-letters.tsv");
}
