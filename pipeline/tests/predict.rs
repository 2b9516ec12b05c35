//! `tiderec predict` and `tiderec eval` on real files through the release binary: one
//! score per record with its file and position, featurized by the checkpoint's
//! recorded pipeline; data of another pipeline refused; `--hash-seed`.

mod common;

use common::{run_err, run_ok, shared_data, tiderec};
use std::path::{Path, PathBuf};

/// Quick training flags: a few small steps into small tables.
const QUICK: &[&str] = &["--batch-size", "16", "--buckets", "1000", "--progress", "none"];

/// Trains `steps` steps on `data` with `extra` flags, checkpointing into `dir/name`; returns the
/// checkpoint directory.
fn train_steps(dir: &Path, name: &str, data: &str, steps: u64, extra: &[&str]) -> PathBuf {
    let ck = dir.join(name);
    run_ok(
        tiderec()
            .args(["train", "--data", data, "--steps", &steps.to_string()])
            .args(QUICK)
            .args(extra)
            .arg("--checkpoint-dir")
            .arg(&ck)
            .arg("--dead-letters")
            .arg(dir.join(format!("{name}-dead.tsv"))),
    );
    ck
}

/// The checkpoint in the directory `ck` of a run that wrote one.
fn newest_checkpoint(ck: &Path) -> PathBuf {
    std::fs::read_dir(ck)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("ckpt-")))
        .expect("a checkpoint was written")
}

/// Three steps of [`train_steps`].
fn train(dir: &Path, name: &str, data: &str, extra: &[&str]) -> PathBuf {
    train_steps(dir, name, data, 3, extra)
}

/// One row of a scores file.
#[derive(Debug, PartialEq)]
struct Row {
    file: String,
    position: u64,
    score: f32,
    label: Option<f32>,
}

/// `predict --checkpoint ck --data data --out dir/out.csv` with `extra` (replacing the scores of an
/// earlier call); returns the header and rows.
fn predict(ck: &Path, data: &str, dir: &Path, extra: &[&str]) -> (String, Vec<Row>, String) {
    let out = dir.join("out.csv");
    let o = run_ok(
        tiderec()
            .args(["predict", "--overwrite", "--data", data, "--batch-size", "7"])
            .arg("--checkpoint")
            .arg(ck)
            .arg("--out")
            .arg(&out)
            .arg("--dead-letters")
            .arg(dir.join("predict-dead.tsv"))
            .args(extra),
    );
    let text = std::fs::read_to_string(&out).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap().to_string();
    let labeled = header.ends_with(",label");
    let rows = lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), if labeled { 4 } else { 3 }, "{l}");
            Row {
                file: f[0].to_string(),
                position: f[1].parse().unwrap(),
                score: f[2].parse().unwrap(),
                label: labeled.then(|| f[3].parse().unwrap()),
            }
        })
        .collect();
    (header, rows, String::from_utf8_lossy(&o.stdout).into_owned())
}

/// 1-based numbers of the non-empty lines of `path` (after a header line when `header`).
fn record_lines(path: &Path, header: bool) -> Vec<u64> {
    let bytes = std::fs::read(path).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    text.split('\n')
        .enumerate()
        .filter(|(i, l)| !(l.trim_end_matches('\r').is_empty() || header && *i == 0))
        .map(|(i, _)| i as u64 + 1)
        .collect()
}

/// `eval --json` of `ck` on `data`.
fn eval(ck: &Path, data: &str, dir: &Path) -> serde_json::Value {
    let o = run_ok(
        tiderec()
            .args(["eval", "--json", "--batch-size", "5", "--data", data])
            .arg("--checkpoint")
            .arg(ck)
            .arg("--dead-letters")
            .arg(dir.join("eval-dead.tsv")),
    );
    serde_json::from_slice(&o.stdout).expect("eval prints JSON")
}

/// The user of each line of `lines` in `path`: the group key of field `column` of the line,
/// split on `delimiter`.
fn users(path: &Path, lines: &[u64], (column, delimiter): (usize, char)) -> Vec<u64> {
    let text = std::fs::read_to_string(path).unwrap();
    let all: Vec<&str> = text.split('\n').collect();
    let user = |line: u64| all[line as usize - 1].split(delimiter).nth(column).unwrap().as_bytes();
    lines.iter().map(|&l| tiderec_operators::metrics::group_key(user(l))).collect()
}

/// Predicts `path` (records on `lines`) as `format`, and checks rows, positions, scores and
/// that eval's metrics are those of predict's probabilities: GAUC by the user of field
/// `user` (column, delimiter) of each line, none without one.
fn check_format(dir: &Path, ck: &Path, format: &str, path: &Path, lines: &[u64], user: Option<(usize, char)>) {
    let data = format!("{format}:{}", path.display());
    let (header, rows, _) = predict(ck, &data, dir, &[]);
    assert_eq!(header, "file,position,score,label", "{format}");
    assert_eq!(rows.len(), lines.len(), "{format}: one score per record");
    for (row, &line) in rows.iter().zip(lines) {
        assert_eq!((row.file.as_str(), row.position), (path.to_str().unwrap(), line), "{format}");
        assert!(row.score > 0.0 && row.score < 1.0, "{format}: {row:?}");
    }
    let probs: Vec<f32> = rows.iter().map(|r| r.score).collect();
    let labels: Vec<f32> = rows.iter().map(|r| r.label.unwrap()).collect();
    assert!(labels.iter().all(|&y| y == 0.0 || y == 1.0), "{format}: labels are the records'");
    let e = eval(ck, &data, dir);
    assert_eq!(e["samples"], lines.len() as u64, "{format}");
    assert_eq!(e["logloss"].as_f64().unwrap(), tiderec_operators::metrics::logloss(&probs, &labels), "{format}");
    assert_eq!(e["auc"].as_f64(), tiderec_operators::metrics::auc(&probs, &labels), "{format}");
    use tiderec_operators::metrics::{average_precision, calibration, gauc, normalized_entropy};
    // To 1e-12: JSON's decimal may come back an ulp off.
    let close = |key: &str, want: Option<f64>| match (e[key].as_f64(), want) {
        (Some(a), Some(b)) => assert!((a - b).abs() <= 1e-12, "{format}: {key} {a} vs {b}"),
        (a, b) => assert_eq!(a, b, "{format}: {key}"),
    };
    close("ne", normalized_entropy(&probs, &labels));
    close("calibration", calibration(&probs, &labels));
    close("pr_auc", average_precision(&probs, &labels));
    let groups = user.map(|u| users(path, lines, u));
    let want = groups.and_then(|g| gauc(&probs, &labels, &g));
    close("gauc", want);
    assert_eq!(want.is_some(), user.is_some(), "{format}: GAUC is defined exactly with a user column");
}

#[test]
fn predict_scores_every_record_of_every_line_format_as_eval_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(criteo) = shared_data("criteo/sample_train.txt") else { return };
    let Some(avazu) = shared_data("avazu/avazu_sample.txt") else { return };
    let Some(taobao) = shared_data("taobao_ad/train_sample.csv") else { return };
    let Some(amazon) = shared_data("amazon_dien/local_test") else { return };
    // The user columns: taobao-ad's `userid`, amazon-dien's user; Criteo and Avazu have none.
    type Case<'a> = (&'a str, &'a Path, bool, Vec<&'a str>, Option<(usize, char)>);
    let cases: Vec<Case> = vec![
        ("criteo", &criteo, false, vec![], None),
        ("avazu", &avazu, true, vec![], None),
        ("csv", &criteo, false, vec!["--spec", "preset:criteo"], None),
        ("taobao-ad", &taobao, true, vec![], Some((2, ','))),
        ("amazon-dien", &amazon, false, vec!["--model", "dien"], Some((1, '\t'))),
    ];
    for (format, path, header, extra, user) in cases {
        let data = format!("{format}:{}", path.display());
        let ck = train(d, &format!("ck-{format}"), &data, &extra);
        check_format(d, &ck, format, path, &record_lines(path, header), user);
    }
}

#[test]
fn predict_on_converted_parquet_keys_rows_by_file_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(part) = shared_data("criteo/part-0") else { return };
    let out = d.join("pq");
    run_ok(
        tiderec()
            .args(["convert", "--progress", "none", "--buckets", "1000", "--rows-per-file", "60"])
            .arg("--from")
            .arg(format!("criteo:{}", part.display()))
            .arg("--to")
            .arg(format!("parquet:{}", out.display())),
    );
    let data = format!("parquet:{}", out.display());
    let ck = train(d, "ck", &data, &[]);
    let (_, rows, _) = predict(&ck, &data, d, &[]);
    assert_eq!(rows.len(), 100, "every row of both files");
    let files: Vec<String> =
        ["part-00000.parquet", "part-00001.parquet"].iter().map(|f| out.join(f).display().to_string()).collect();
    for (i, row) in rows.iter().enumerate() {
        let (file, position) = if i < 60 { (&files[0], i) } else { (&files[1], i - 60) };
        assert_eq!((&row.file, row.position), (file, position as u64), "0-based rows within each file");
    }
    // The same rows as the TSV, scored by a model trained on the same ids: the labels match line by line.
    let text = std::fs::read_to_string(&part).unwrap();
    let labels: Vec<f32> = text.lines().map(|l| l[..1].parse().unwrap()).collect();
    assert_eq!(rows.iter().map(|r| r.label.unwrap()).collect::<Vec<_>>(), labels);
    let probs: Vec<f32> = rows.iter().map(|r| r.score).collect();
    let e = eval(&ck, &data, d);
    assert_eq!(e["logloss"].as_f64().unwrap(), tiderec_operators::metrics::logloss(&probs, &labels));
    // Data converted with another hashing seed is another pipeline.
    let other = d.join("pq7");
    run_ok(
        tiderec()
            .args(["convert", "--progress", "none", "--buckets", "1000", "--hash-seed", "7"])
            .arg("--from")
            .arg(format!("criteo:{}", part.display()))
            .arg("--to")
            .arg(format!("parquet:{}", other.display())),
    );
    let e = run_err(
        tiderec()
            .args(["predict", "--data", &format!("parquet:{}", other.display())])
            .arg("--checkpoint")
            .arg(&ck)
            .arg("--out")
            .arg(d.join("x.csv")),
    );
    assert!(e.contains("parquet.seed: checkpoint has 42, data has 7"), "{e}");
}

#[test]
fn predict_writes_the_same_rows_to_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(path) = shared_data("criteo/sample_train.txt") else { return };
    let data = format!("criteo:{}", path.display());
    let ck = train(d, "ck", &data, &[]);
    let (_, rows, _) = predict(&ck, &data, d, &[]);
    let out = d.join("scores.parquet");
    run_ok(tiderec().args(["predict", "--data", &data]).arg("--checkpoint").arg(&ck).arg("--out").arg(&out));
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float32Type, UInt64Type};
    let file = std::fs::File::open(&out).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap();
    let mut read = Vec::new();
    for batch in reader {
        let b = batch.unwrap();
        let names: Vec<String> = b.schema().fields().iter().map(|f| f.name().clone()).collect();
        assert_eq!(names, ["file", "position", "score", "label"]);
        let (f, p) = (b.column(0).as_string::<i32>(), b.column(1).as_primitive::<UInt64Type>());
        let (s, l) = (b.column(2).as_primitive::<Float32Type>(), b.column(3).as_primitive::<Float32Type>());
        for i in 0..b.num_rows() {
            read.push(Row {
                file: f.value(i).to_string(),
                position: p.value(i),
                score: s.value(i),
                label: Some(l.value(i)),
            });
        }
    }
    assert_eq!(read, rows, "Parquet and CSV hold the same rows, scores bit for bit");
}

#[test]
fn predict_reads_unlabeled_files_as_their_labeled_records() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(train_file) = shared_data("criteo/sample_train.txt") else { return };
    let Some(test_file) = shared_data("criteo/sample.test") else { return };
    let data = format!("criteo:{}", train_file.display());
    let ck = train(d, "ck", &data, &[]);
    let (_, labeled, _) = predict(&ck, &data, d, &[]);
    // The same records without their label column score the same, bit for bit.
    let text = std::fs::read_to_string(&train_file).unwrap();
    let stripped: String = text.lines().map(|l| format!("{}\n", l.split_once('\t').unwrap().1)).collect();
    let unlabeled_file = d.join("unlabeled.tsv");
    std::fs::write(&unlabeled_file, stripped).unwrap();
    let (header, unlabeled, _) = predict(&ck, &format!("criteo:{}", unlabeled_file.display()), d, &["--unlabeled"]);
    assert_eq!(header, "file,position,score", "no label column for unlabeled input");
    assert_eq!(unlabeled.len(), labeled.len());
    for (a, b) in unlabeled.iter().zip(&labeled) {
        assert_eq!((a.position, a.score), (b.position, b.score));
    }
    // Kaggle's test file (39 columns, no label): every record scored.
    let test = format!("criteo:{}", test_file.display());
    let (_, rows, stdout) = predict(&ck, &test, d, &["--unlabeled"]);
    assert_eq!(rows.len(), 10_000, "{stdout}");
    assert!(rows.iter().enumerate().all(|(i, r)| r.position == i as u64 + 1 && r.score > 0.0 && r.score < 1.0));
    assert!(stdout.contains("scored 10000 records") && stdout.contains("0 bad records"), "{stdout}");
    // Without --unlabeled the test file is refused, with a pointer to the flag.
    let e = run_err(
        tiderec()
            .args(["predict", "--data", &test])
            .arg("--checkpoint")
            .arg(&ck)
            .arg("--out")
            .arg(d.join("refused.csv"))
            .arg("--dead-letters")
            .arg(d.join("refused-dead.tsv")),
    );
    assert!(e.contains("--unlabeled") && e.contains("malformed"), "{e}");
    assert!(!d.join("refused.csv").exists(), "a failed run leaves no scores file");
    // eval needs labels: the same file is refused there too.
    let e = run_err(
        tiderec()
            .args(["eval", "--data", &test])
            .arg("--checkpoint")
            .arg(&ck)
            .arg("--dead-letters")
            .arg(d.join("eval-dead.tsv")),
    );
    assert!(e.contains("evaluation input") && e.contains("unlabeled"), "{e}");
    // Taobao-ad without its first column (the `clk` label): the header is still recognised.
    let Some(taobao) = shared_data("taobao_ad/test_sample.csv") else { return };
    let taobao_data = format!("taobao-ad:{}", taobao.display());
    let ck = train(d, "ck-taobao", &taobao_data, &[]);
    let (_, labeled, _) = predict(&ck, &taobao_data, d, &[]);
    let text = std::fs::read_to_string(&taobao).unwrap();
    let stripped: String = text.lines().map(|l| format!("{}\n", l.split_once(',').unwrap().1)).collect();
    let unlabeled_file = d.join("taobao-unlabeled.csv");
    std::fs::write(&unlabeled_file, stripped).unwrap();
    let (_, unlabeled, stdout) = predict(&ck, &format!("taobao-ad:{}", unlabeled_file.display()), d, &["--unlabeled"]);
    assert!(stdout.contains("0 bad records"), "{stdout}");
    assert_eq!(
        unlabeled.iter().map(|r| (r.position, r.score)).collect::<Vec<_>>(),
        labeled.iter().map(|r| (r.position, r.score)).collect::<Vec<_>>()
    );
    // Avazu's test file: the header is skipped, records are keyed by their line.
    let Some(avazu_train) = shared_data("avazu/avazu_sample.txt") else { return };
    let Some(avazu_test) = shared_data("avazu/test") else { return };
    let ck = train(d, "ck-avazu", &format!("avazu:{}", avazu_train.display()), &[]);
    let (_, rows, _) = predict(&ck, &format!("avazu:{}", avazu_test.display()), d, &["--unlabeled"]);
    assert_eq!(rows.iter().map(|r| r.position).collect::<Vec<_>>(), record_lines(&avazu_test, true));
}

#[test]
fn malformed_records_are_dead_lettered_and_never_silently_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(path) = shared_data("criteo/sample_train.txt") else { return };
    let data = format!("criteo:{}", path.display());
    let ck = train(d, "ck", &data, &[]);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().take(30).map(String::from).collect();
    lines[10] = format!("x{}", &lines[10][1..]); // line 11: no 0/1 label
    lines.insert(20, String::new()); // line 21: empty, neither scored nor bad
    let file = d.join("with-bad.tsv");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let input = format!("criteo:{}", file.display());
    let (_, rows, stdout) = predict(&ck, &input, d, &["--max-bad-fraction", "0.1"]);
    let positions: Vec<u64> = rows.iter().map(|r| r.position).collect();
    let expected: Vec<u64> = (1..=31).filter(|&l| l != 11 && l != 21).collect();
    assert_eq!(positions, expected);
    assert!(stdout.contains("scored 29 records") && stdout.contains("1 bad records"), "{stdout}");
    let dead = std::fs::read_to_string(d.join("predict-dead.tsv")).unwrap();
    assert_eq!(dead.lines().count(), 1, "{dead}");
    assert!(dead.contains("\t11\t") && dead.contains("bad_label"), "{dead}");
    // Over the budget: an error naming the input, no output.
    let out = d.join("over.csv");
    let e = run_err(
        tiderec()
            .args(["predict", "--data", &input])
            .arg("--checkpoint")
            .arg(&ck)
            .arg("--out")
            .arg(&out)
            .arg("--dead-letters")
            .arg(d.join("over-dead.tsv")),
    );
    assert!(e.contains("prediction input") && e.contains("1 of 30 records"), "{e}");
    assert!(!out.exists());
}

#[test]
fn a_checkpoint_refuses_records_and_runs_of_another_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(path) = shared_data("criteo/sample_train.txt") else { return };
    let csv = format!("csv:{}", path.display());
    let criteo = format!("criteo:{}", path.display());
    let ck = train(d, "ck", &csv, &["--spec", "preset:criteo"]);
    let manifest = newest_checkpoint(&ck).join("manifest.json");
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    let p = &m["pipeline"];
    assert_eq!((p["format"].as_str(), p["spec"]["source"].as_str()), (Some("csv"), Some("preset:criteo")));
    assert_eq!(p["spec"]["fields"]["dense"][0]["log1p"], true, "the spec is recorded in full");
    assert_eq!(p["hash"]["seed"], 42);
    // Scoring Criteo records with a model of csv + criteo-spec features is refused, for eval and predict.
    for cmd in [&["eval"][..], &["predict", "--out", d.join("x.csv").to_str().unwrap()][..]] {
        let e = run_err(tiderec().args(cmd).args(["--data", &criteo]).arg("--checkpoint").arg(&ck));
        assert!(e.contains("format: checkpoint has csv (spec criteo), data has criteo"), "{e}");
    }
    // Resuming with another format, another spec or another hashing seed names the difference.
    let resume = |data: &str, extra: &[&str]| {
        run_err(
            tiderec()
                .args(["train", "--resume", "--steps", "5", "--data", data])
                .args(QUICK)
                .args(extra)
                .arg("--checkpoint-dir")
                .arg(&ck)
                .arg("--dead-letters")
                .arg(d.join("resume-dead.tsv")),
        )
    };
    let e = resume(&criteo, &[]);
    assert!(e.contains("format: checkpoint has csv (spec criteo), run has criteo"), "{e}");
    let spec = d.join("my-spec.toml");
    let shown = run_ok(tiderec().args(["spec", "show", "criteo", "--buckets", "1000"]));
    let toml = String::from_utf8(shown.stdout).unwrap().replacen("log1p = true", "log1p = false", 1);
    std::fs::write(&spec, toml).unwrap();
    let e = resume(&csv, &["--spec", spec.to_str().unwrap()]);
    assert!(e.contains(&format!("spec: checkpoint has preset:criteo, run has {}", spec.display())), "{e}");
    assert!(e.contains("spec.fields.dense[0].log1p: checkpoint has true, run has false"), "{e}");
    let e = resume(&csv, &["--spec", "preset:criteo", "--hash-seed", "7"]);
    assert!(e.contains("hash.seed: checkpoint has 42, run has 7"), "{e}");
    // The same pipeline resumes.
    run_ok(
        tiderec()
            .args(["train", "--resume", "--steps", "5", "--data", &csv, "--spec", "preset:criteo"])
            .args(QUICK)
            .arg("--checkpoint-dir")
            .arg(&ck)
            .arg("--dead-letters")
            .arg(d.join("resume-dead.tsv")),
    );
}

#[test]
fn a_manifest_without_a_pipeline_still_loads_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(path) = shared_data("criteo/sample_train.txt") else { return };
    let data = format!("criteo:{}", path.display());
    let ck = train(d, "ck", &data, &[]);
    let before = eval(&ck, &data, d);
    // Remove the pipeline, as a checkpoint written before it was recorded.
    let manifest = newest_checkpoint(&ck).join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    assert!(m.as_object_mut().unwrap().remove("pipeline").is_some());
    std::fs::write(&manifest, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    let o = run_ok(
        tiderec()
            .args(["eval", "--json", "--batch-size", "5", "--data", &data])
            .arg("--checkpoint")
            .arg(&ck)
            .arg("--dead-letters")
            .arg(d.join("eval-dead.tsv")),
    );
    let after: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(after, before, "the checkpoint's seed and table sizes featurize Criteo as the run did");
    assert!(String::from_utf8_lossy(&o.stderr).contains("records no feature pipeline"));
    // Spec formats cannot be featurized without the recorded spec.
    let e = run_err(
        tiderec()
            .args(["predict", "--data", &format!("csv:{}", path.display())])
            .arg("--checkpoint")
            .arg(&ck)
            .arg("--out")
            .arg(d.join("x.csv")),
    );
    assert!(e.contains("records no feature pipeline") && e.contains("spec is unknown"), "{e}");
    // Resuming it works, with a warning that the data could not be checked.
    let o = run_ok(
        tiderec()
            .args(["train", "--resume", "--steps", "5", "--data", &data])
            .args(QUICK)
            .arg("--checkpoint-dir")
            .arg(&ck)
            .arg("--dead-letters")
            .arg(d.join("resume-dead.tsv")),
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("records no feature pipeline"));
}

#[test]
fn hash_seed_changes_ids_but_not_initialisation_and_seed_not_ids() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(path) = shared_data("criteo/sample_train.txt") else { return };
    let data = format!("criteo:{}", path.display());
    // Step 0: the initial model only.
    let at_init = |name: &str, extra: &[&str]| {
        let ck = train_steps(d, name, &data, 0, extra);
        let step = ck.join("ckpt-0");
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(step.join("manifest.json")).unwrap()).unwrap();
        (ck, step, manifest)
    };
    let (ck_a, a, ma) = at_init("a", &[]);
    let (ck_b, b, mb) = at_init("b", &["--hash-seed", "7"]);
    let (ck_c, _, mc) = at_init("c", &["--hash-seed", "42"]);
    let (_, _, md) = at_init("d", &["--seed", "3"]);
    assert_eq!((ma["seed"].as_u64(), ma["pipeline"]["hash"]["seed"].as_u64()), (Some(42), Some(42)));
    assert_eq!((mb["seed"].as_u64(), mb["pipeline"]["hash"]["seed"].as_u64()), (Some(42), Some(7)));
    assert_eq!(ma["pipeline"], mc["pipeline"], "the default hash seed is 42");
    // Another --seed initialises another model of the same features.
    assert_eq!((md["seed"].as_u64(), md["pipeline"]["hash"]["seed"].as_u64()), (Some(3), Some(42)));
    assert_eq!(ma["pipeline"], md["pipeline"], "--seed leaves the hashing alone");
    // The same initial parameters, byte for byte.
    for e in std::fs::read_dir(&a).unwrap() {
        let name = e.unwrap().file_name();
        if name != "manifest.json" {
            assert_eq!(std::fs::read(a.join(&name)).unwrap(), std::fs::read(b.join(&name)).unwrap(), "{name:?}");
        }
    }
    // Other ids: the same records read other rows, so they score differently.
    let (_, sa, _) = predict(&ck_a, &data, d, &[]);
    let (_, sb, _) = predict(&ck_b, &data, d, &[]);
    let (_, sc, _) = predict(&ck_c, &data, d, &[]);
    assert_eq!(sa, sc);
    assert!(sa.iter().zip(&sb).filter(|(x, y)| x.score != y.score).count() > 90, "ids moved");
}

#[test]
fn every_batch_scores_with_crosses_or_sequences_the_model_does_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(avazu) = shared_data("avazu/avazu_sample.txt") else { return };
    let Some(amazon) = shared_data("amazon_dien/local_test") else { return };
    // Batches of 7 records: the batch that scored crosses, or skipped sequences, is filled again.
    type Case<'a> = (&'a str, &'a Path, bool, Vec<&'a str>, Option<(usize, char)>);
    let cases: Vec<Case> = vec![
        ("avazu", &avazu, true, vec!["--model", "wdl", "--crosses", "0:1,3:4"], None),
        ("amazon-dien", &amazon, false, vec!["--model", "lr"], Some((1, '\t'))),
    ];
    for (format, path, header, extra, user) in cases {
        let data = format!("{format}:{}", path.display());
        let ck = train(d, &format!("ck-{format}"), &data, &extra);
        check_format(d, &ck, format, path, &record_lines(path, header), user);
    }
}

#[test]
fn eval_with_the_training_eval_fraction_scores_exactly_the_held_out_records() {
    let Some(sample) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&sample).unwrap();
    let lines: Vec<&str> = text.lines().take(3000).collect();
    let part = dir.path().join("part.tsv");
    std::fs::write(&part, lines.join("\n") + "\n").unwrap();
    let data = format!("criteo:{}", part.display());
    let m = dir.path().join("m.json");
    let ck = dir.path().join("ck");
    run_ok(
        tiderec()
            .args(["train", "--data", &data, "--eval-fraction", "0.25", "--workers", "2"])
            .args(QUICK)
            .arg("--checkpoint-dir")
            .arg(&ck)
            .arg("--metrics-json")
            .arg(&m),
    );
    let trained = common::metrics(&m);
    let held_out = |extra: &[&str]| {
        let o = run_ok(
            tiderec()
                .args(["eval", "--json", "--data", &data])
                .args(extra)
                .arg("--checkpoint")
                .arg(&ck)
                .arg("--dead-letters")
                .arg(dir.path().join("eval-dead.tsv")),
        );
        serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("eval prints JSON")
    };
    let e = held_out(&["--eval-fraction", "0.25"]);
    assert_eq!(e["samples"], trained["eval_samples"], "{e}\n{trained}");
    for key in ["auc", "logloss"] {
        let (a, b) = (e[key].as_f64().unwrap(), trained[key].as_f64().unwrap());
        assert!((a - b).abs() < 1e-6, "{key}: eval {a}, train {b}");
    }
    // Without the flag every record is scored.
    let all = held_out(&[]);
    assert_eq!(all["samples"].as_u64().unwrap(), 3000);
    assert_eq!(trained["samples"].as_u64().unwrap() + trained["eval_samples"].as_u64().unwrap(), 3000);
    // A fraction outside (0, 1] is refused naming the flag.
    let out = tiderec().args(["eval", "--data", &data, "--eval-fraction", "0"]).arg("--checkpoint").arg(&ck).output();
    let err = String::from_utf8_lossy(&out.unwrap().stderr).into_owned();
    assert!(err.contains("eval_fraction") || err.contains("--eval-fraction"), "{err}");
}

/// The names of the entries of `dir` that start with `prefix`, sorted.
fn entries(dir: &Path, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}

/// An older checkpoint (no pipeline in its manifest) of a 13-dense DLRM, asked to score
/// Parquet files without dense columns: a clear error naming both widths and the input,
/// a non-zero exit without a panic, and no scores file, temporary or not.
#[test]
fn an_older_checkpoint_refuses_records_without_its_dense_features() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(path) = shared_data("criteo/sample_train.txt") else { return };
    let data = format!("criteo:{}", path.display());
    let ck = train(d, "ck", &data, &["--model", "dlrm"]);
    let manifest = newest_checkpoint(&ck).join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    assert!(m.as_object_mut().unwrap().remove("pipeline").is_some());
    std::fs::write(&manifest, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    // Criteo's spec without its dense features: the same 26 categorical fields of 1000 rows.
    let shown = run_ok(tiderec().args(["spec", "show", "criteo", "--buckets", "1000"]));
    let spec: String = String::from_utf8(shown.stdout)
        .unwrap()
        .split("\n\n")
        .filter(|block| !block.starts_with("[[dense]]"))
        .collect::<Vec<_>>()
        .join("\n\n");
    assert!(!spec.contains("[[dense]]") && spec.contains("[[categorical]]"), "{spec}");
    let spec_file = d.join("no-dense.toml");
    std::fs::write(&spec_file, spec).unwrap();
    let pq = d.join("pq");
    run_ok(
        tiderec()
            .args(["convert", "--progress", "none", "--from", &format!("csv:{}", path.display())])
            .arg("--spec")
            .arg(&spec_file)
            .arg("--to")
            .arg(format!("parquet:{}", pq.display())),
    );
    let input = format!("parquet:{}", pq.display());
    for cmd in [&["predict", "--out", "scores.csv"][..], &["eval"][..]] {
        let o =
            tiderec().current_dir(d).args(cmd).args(["--data", &input]).arg("--checkpoint").arg(&ck).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && o.status.code() != Some(101), "{cmd:?}: a clean failure: {stderr}");
        assert!(!stderr.contains("panicked"), "{cmd:?}: {stderr}");
        assert!(
            stderr.contains("0 dense features, the model reads 13") && stderr.contains(&input),
            "{cmd:?}: {stderr}"
        );
        assert_eq!(entries(d, "scores.csv"), Vec::<String>::new(), "{cmd:?}: no scores file, not even a temporary one");
    }
}

/// The dead-letter file `predict` and `eval` write unless told lists the malformed records
/// of the last run: a clean rerun that replaces the scores (`--overwrite`) removes an
/// earlier run's, as a clean `eval` removes its own. Without `--overwrite` an existing one is
/// refused like an existing scores file; a file named with `--dead-letters` is left alone.
#[test]
fn a_clean_rerun_leaves_no_earlier_runs_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(path) = shared_data("criteo/sample_train.txt") else { return };
    let data = format!("criteo:{}", path.display());
    let ck = train(d, "ck", &data, &[]);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().take(40).map(String::from).collect();
    let clean = d.join("clean.txt");
    std::fs::write(&clean, lines.join("\n") + "\n").unwrap();
    for k in [3, 17, 29] {
        lines[k] = format!("x{}", &lines[k][1..]);
    }
    let tricky = d.join("tricky.txt");
    std::fs::write(&tricky, lines.join("\n") + "\n").unwrap();
    let score = |command: &str, input: &Path, extra: &[&str]| {
        let mut cmd = tiderec();
        cmd.current_dir(d)
            .args([command, "--max-bad-fraction", "0.2", "--data", &format!("criteo:{}", input.display())])
            .arg("--checkpoint")
            .arg(&ck)
            .args(extra);
        cmd
    };
    let dead = d.join("st.csv.dead-letters.tsv");
    let o = run_ok(&mut score("predict", &tricky, &["--out", "st.csv"]));
    assert!(String::from_utf8_lossy(&o.stdout).contains("3 bad records"));
    assert_eq!(std::fs::read_to_string(&dead).unwrap().lines().count(), 3);
    // Without --overwrite neither the scores nor their dead letters are replaced.
    std::fs::remove_file(d.join("st.csv")).unwrap();
    let e = run_err(&mut score("predict", &clean, &["--out", "st.csv"]));
    assert!(e.contains("st.csv.dead-letters.tsv already exists") && e.contains("--overwrite"), "{e}");
    assert_eq!(std::fs::read_to_string(&dead).unwrap().lines().count(), 3, "kept");
    assert!(!d.join("st.csv").exists());
    run_ok(&mut score("predict", &tricky, &["--out", "st.csv", "--overwrite"]));
    let o = run_ok(&mut score("predict", &clean, &["--out", "st.csv", "--overwrite"]));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("scored 40 records")
            && String::from_utf8_lossy(&o.stdout).contains("0 bad records")
    );
    assert!(!dead.exists(), "the earlier run's dead letters describe another input");
    assert_eq!(entries(d, "st.csv"), ["st.csv"]);
    // A file named with --dead-letters is the caller's: a clean run leaves it alone.
    let named = d.join("named.tsv");
    std::fs::write(&named, "kept\n").unwrap();
    run_ok(&mut score("predict", &clean, &["--out", "st.csv", "--overwrite", "--dead-letters", "named.tsv"]));
    assert_eq!(std::fs::read_to_string(&named).unwrap(), "kept\n");
    // eval's own file likewise.
    let eval_dead = d.join("tiderec-eval-dead-letters.tsv");
    run_ok(&mut score("eval", &tricky, &[]));
    assert_eq!(std::fs::read_to_string(&eval_dead).unwrap().lines().count(), 3);
    run_ok(&mut score("eval", &clean, &["--dead-letters", "named.tsv"]));
    assert_eq!(std::fs::read_to_string(&eval_dead).unwrap().lines().count(), 3, "another file was named");
    run_ok(&mut score("eval", &clean, &[]));
    assert!(!eval_dead.exists());
}

#[test]
fn scores_and_dead_letters_within_a_checkpoint_directory_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(path) = shared_data("criteo/sample_train.txt") else { return };
    let data = format!("criteo:{}", path.display());
    let ck = train(d, "ck", &data, &[]);
    let listing = |dir: &Path| {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    };
    let before = listing(&ck);
    let scores_elsewhere = d.join("scores.csv");
    for (out, dead) in [
        (ck.join("scores.csv"), d.join("dead.tsv")),
        (newest_checkpoint(&ck).join("scores.csv"), d.join("dead.tsv")),
        (scores_elsewhere.clone(), ck.join("dead.tsv")),
    ] {
        let err = run_err(
            tiderec()
                .args(["predict", "--data", &data, "--checkpoint"])
                .arg(&ck)
                .arg("--out")
                .arg(&out)
                .arg("--dead-letters")
                .arg(&dead),
        );
        assert!(err.contains("is within") && err.contains(&ck.file_name().unwrap().to_string_lossy()[..]), "{err}");
        assert_eq!(listing(&ck), before, "nothing written into the checkpoint directory");
        assert!(!scores_elsewhere.exists(), "no scores written: {err}");
    }
    // Beside the checkpoint directory, the same run scores.
    run_ok(tiderec().args(["predict", "--data", &data, "--checkpoint"]).arg(&ck).arg("--out").arg(&scores_elsewhere));
    assert!(scores_elsewhere.exists());
}
