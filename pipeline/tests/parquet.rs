//! `tiderec convert` and `tiderec train --data parquet:DIR` as a user runs them.

mod common;

use common::{rel_diff, run_err, run_ok, shared_data, tiderec, train_metrics as train};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `tiderec convert --from FROM --to parquet:OUT` plus `extra` flags, quietly.
fn convert(from: &str, out: &Path, extra: &[&str]) -> Command {
    let mut c = tiderec();
    c.args(["convert", "--progress", "none", "--from", from, "--to"]).arg(format!("parquet:{}", out.display()));
    c.args(extra);
    c
}

fn parquet_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn training_from_converted_parquet_matches_training_from_the_tsv() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pq");
    let criteo = format!("criteo:{}", src.display());
    // Several files and row groups: batches cross both boundaries. Converted under the
    // default seed, trained under --seed 7: the hashing does not follow --seed.
    let stdout = run_ok(&mut convert(
        &criteo,
        &out,
        &["--buckets", "20000", "--row-group-rows", "1500", "--rows-per-file", "4000"],
    ))
    .stdout;
    let stdout = String::from_utf8_lossy(&stdout);
    assert!(stdout.contains("converted 10000 rows into 3 file(s), 8 row group(s)"), "{stdout}");
    assert_eq!(parquet_files(&out).len(), 3);
    let common = ["--workers", "1", "--seed", "7", "--buckets", "20000", "--batch-size", "256", "--steps", "30"];
    let common: Vec<&str> = common.iter().copied().chain(["--eval-fraction", "0"]).collect();
    let tsv = train(&criteo, dir.path(), "tsv", &common);
    let pq = train(&format!("parquet:{}", out.display()), dir.path(), "pq", &common);
    assert_eq!(tsv["samples"], 7680);
    assert_eq!(pq["samples"], tsv["samples"]);
    for key in ["params_l2", "train_loss"] {
        let (a, b) = (tsv[key].as_f64().unwrap(), pq[key].as_f64().unwrap());
        assert!(rel_diff(a, b) <= 1e-6, "{key}: TSV {a} vs Parquet {b}");
    }
    // A held-out eval split and a separate eval set both work.
    let held =
        train(&format!("parquet:{}", out.display()), dir.path(), "held", &["--eval-fraction", "0.2", "--model", "lr"]);
    assert_eq!(held["samples"].as_u64().unwrap() + held["eval_samples"].as_u64().unwrap(), 10_000);
    let eval = format!("parquet:{}", out.join("part-00002.parquet").display());
    let sep = train(&format!("parquet:{}", out.display()), dir.path(), "sep", &["--eval", &eval, "--model", "lr"]);
    assert_eq!((sep["samples"].as_u64(), sep["eval_samples"].as_u64()), (Some(10_000), Some(2_000)));
}

/// Converts behaviour data `from` (lists as `List<UInt64>` sequence columns), then trains
/// DIEN from the raw file and from the Parquet files: the same samples in the same order
/// give the same model.
fn behavior_round_trip(from: &str, convert_flags: &[&str], train_flags: &[&str], rows: u64, bad: u64) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pq");
    let stdout =
        run_ok(&mut convert(from, &out, &[&["--seed", "3", "--buckets", "5000"], convert_flags].concat())).stdout;
    let stdout = String::from_utf8_lossy(&stdout);
    assert!(stdout.contains(&format!("converted {rows} rows")), "{stdout}");
    assert!(stdout.contains(&format!("bad records     {bad}")), "{stdout}");
    let common = [&["--model", "dien", "--workers", "1", "--seed", "3", "--buckets", "5000"], train_flags].concat();
    let raw = train(from, dir.path(), "raw", &common);
    let pq = train(&format!("parquet:{}", out.display()), dir.path(), "pq", &common);
    assert!(raw["samples"].as_u64().unwrap() > 0);
    for key in ["samples", "steps", "eval_samples"] {
        assert_eq!(raw[key], pq[key], "{from}: {key}");
    }
    for key in ["params_l2", "train_loss", "train_loss_mean"] {
        let (a, b) = (raw[key].as_f64().unwrap(), pq[key].as_f64().unwrap());
        assert!(rel_diff(a, b) <= 1e-6, "{from}: {key}: raw {a} vs Parquet {b}");
    }
    // The files describe their sequences, so `dien` needs no other flag; a model that
    // reads no sequences trains on them too.
    let lr = train(
        &format!("parquet:{}", out.display()),
        dir.path(),
        "lr",
        &["--model", "lr", "--steps", "3", "--batch-size", "8"],
    );
    assert_eq!(lr["steps"], 3);
}

#[test]
fn amazon_dien_files_convert_with_their_histories_and_replay_to_the_same_model() {
    let Some(src) = shared_data("amazon_dien/local_test") else { return };
    let from = format!("amazon-dien:{}", src.display());
    // 38 rows in row groups of 10: batches of 8 cross row groups.
    behavior_round_trip(&from, &["--row-group-rows", "10"], &["--batch-size", "8", "--eval-fraction", "0"], 38, 0);
}

#[test]
fn taobao_user_behavior_samples_convert_and_replay_to_the_same_model() {
    let Some(src) = shared_data("taobao_user_behavior/UserBehavior.csv") else { return };
    let from = format!("taobao-behavior:{}", src.display());
    // The derived samples (one truncated log line skipped), several files and row groups.
    let convert_flags = ["--row-group-rows", "20000", "--rows-per-file", "100000"];
    let train_flags = ["--batch-size", "256", "--steps", "40", "--eval-fraction", "0"];
    behavior_round_trip(&from, &convert_flags, &train_flags, 168_597, 1);
}

#[test]
fn one_file_with_several_row_groups_feeds_three_workers() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pq");
    run_ok(&mut convert(&format!("criteo:{}", src.display()), &out, &["--row-group-rows", "1000"]));
    assert_eq!(parquet_files(&out).len(), 1, "one file, ten row groups");
    let data = format!("parquet:{}", out.display());
    let args = ["--workers", "3", "--batch-size", "300", "--eval-fraction", "0", "--model", "lr", "--epochs", "2"];
    let v = train(&data, dir.path(), "w3", &args);
    assert_eq!(v["workers"], 3);
    assert_eq!(v["samples"], 20_000, "every row once per epoch");
    assert_eq!(v["epochs"], 2);
    // Each worker reads about a third of the rows (split inside row groups, as the raw file's
    // bytes are split) at 100 samples per step: 34 steps per epoch. Were any worker idle,
    // the busiest one would need 50 or more.
    let steps = v["steps"].as_u64().unwrap();
    assert!((68..=72).contains(&steps), "{steps} steps: all three workers read");
}

#[test]
fn malformed_rows_go_to_the_dead_letters_and_the_good_ones_are_converted() {
    let Some(src) = shared_data("criteo/sample_train.txt") else { return };
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(src).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let mut fields: Vec<String> = lines[9].split('\t').map(String::from).collect();
    fields[1] = "abc".into(); // line 10: I1 is not an integer
    lines[9] = fields.join("\t");
    lines[19] = format!("{}\tzz", lines[19]); // line 20: 41 fields
    let data = dir.path().join("corrupt.txt");
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    let from = format!("criteo:{}", data.display());
    let out = dir.path().join("pq");
    let dead = dir.path().join("dead.tsv");
    // 2 of 100 records are malformed: above the default budget of 1%.
    let flags = ["--row-group-rows", "16", "--max-bad-fraction", "0.05"];
    let stdout = run_ok(convert(&from, &out, &flags).arg("--dead-letters").arg(&dead)).stdout;
    assert!(String::from_utf8_lossy(&stdout).contains("converted 98 rows"), "{}", String::from_utf8_lossy(&stdout));
    let dl = std::fs::read_to_string(&dead).unwrap();
    assert_eq!(dl.lines().count(), 2, "{dl}");
    let cols = |n: &str| dl.lines().map(|l| l.split('\t').collect::<Vec<_>>()).find(|c| c[1] == n).unwrap();
    assert_eq!(cols("10")[3], "bad_integer");
    assert_eq!(cols("20")[3], "field_count");
    assert!(cols("10")[0].ends_with("corrupt.txt"));
    let v = train(&format!("parquet:{}", out.display()), dir.path(), "t", &["--eval-fraction", "0", "--model", "lr"]);
    assert_eq!(v["samples"], 98, "every good row was written");
    assert_eq!(v["bad_records"], 0);

    // Under `fail` the conversion stops at the first bad line, naming it, and leaves no Parquet file.
    let out2 = dir.path().join("pq2");
    let err =
        run_err(convert(&from, &out2, &["--on-bad-record", "fail"]).arg("--dead-letters").arg(dir.path().join("d2")));
    assert!(err.contains("corrupt.txt:10"), "the error names file and line: {err}");
    assert!(parquet_files(&out2).is_empty());

    // Unless told, the dead letters go beside the output, never over a training run's file.
    let training_letters = dir.path().join("tiderec-dead-letters.tsv");
    std::fs::write(&training_letters, "a training run's dead letters\n").unwrap();
    let out3 = dir.path().join("pq3");
    run_ok(convert(&from, &out3, &flags).current_dir(dir.path()));
    assert_eq!(std::fs::read_to_string(&training_letters).unwrap(), "a training run's dead letters\n");
    let beside = std::fs::read_to_string(dir.path().join("pq3.dead-letters.tsv")).unwrap();
    assert_eq!(beside.lines().count(), 2, "{beside}");
    // A feature spec describes csv records: with Criteo files it is refused, not ignored.
    let err = run_err(&mut convert(&from, &dir.path().join("pq4"), &["--spec", "preset:criteo"]));
    assert!(err.contains("`spec`") && err.contains("not `criteo`"), "{err}");
    // Nothing is written into a directory read as data.
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir).unwrap();
    std::fs::copy(&data, data_dir.join("corrupt.txt")).unwrap();
    let err = run_err(&mut convert(&format!("criteo:{}", data_dir.display()), &data_dir, &[]));
    assert!(err.contains("--to") && err.contains("--from"), "{err}");
    assert_eq!(std::fs::read_dir(&data_dir).unwrap().count(), 1, "nothing was written there");
}

#[test]
fn avazu_and_spec_data_convert_and_train() {
    let dir = tempfile::tempdir().unwrap();
    if let Some(src) = shared_data("avazu/train") {
        let out = dir.path().join("avazu");
        run_ok(&mut convert(
            &format!("avazu:{}", src.display()),
            &out,
            &["--row-group-rows", "2000", "--buckets", "5000"],
        ));
        let v = train(
            &format!("parquet:{}", out.display()),
            dir.path(),
            "avazu",
            &["--eval-fraction", "0.2", "--model", "lr"],
        );
        assert_eq!(v["samples"].as_u64().unwrap() + v["eval_samples"].as_u64().unwrap(), 8999);
    }
    let elm = dir.path().join("elm.csv");
    run_ok(tiderec().args(["generate", "elm", "--rows", "1500", "--out"]).arg(&elm));
    let out = dir.path().join("elm");
    run_ok(&mut convert(
        &format!("csv:{}", elm.display()),
        &out,
        &["--spec", "elm", "--row-group-rows", "400", "--buckets", "5000"],
    ));
    // No --spec at training: the schema comes from the files.
    let v = train(
        &format!("parquet:{}", out.display()),
        dir.path(),
        "elm",
        &["--eval-fraction", "0", "--model", "fm", "--workers", "2"],
    );
    assert_eq!(v["samples"], 1500);
    // Histories kept as sequences travel as list columns; the files tell `dien` their tables and length.
    let seq = dir.path().join("elm-dien");
    run_ok(&mut convert(
        &format!("csv:{}", elm.display()),
        &seq,
        &["--spec", "elm-dien", "--row-group-rows", "400", "--buckets", "5000", "--seed", "5"],
    ));
    // One worker, same seed: the model trained from the files is the model trained from the lines.
    let one = ["--eval-fraction", "0", "--model", "dien", "--workers", "1", "--seed", "5", "--batch-size", "100"];
    let csv = train(
        &format!("csv:{}", elm.display()),
        dir.path(),
        "elm-dien-csv",
        &[&one[..], &["--spec", "elm-dien", "--buckets", "5000"]].concat(),
    );
    let pq = train(&format!("parquet:{}", seq.display()), dir.path(), "elm-dien", &one);
    assert_eq!((pq["samples"].as_u64(), pq["bad_records"].as_u64()), (Some(1500), Some(0)));
    for key in ["params_l2", "train_loss"] {
        let (a, b) = (csv[key].as_f64().unwrap(), pq[key].as_f64().unwrap());
        assert!(rel_diff(a, b) <= 1e-6, "{key}: CSV {a} vs Parquet {b}");
    }
    let two = train(
        &format!("parquet:{}", seq.display()),
        dir.path(),
        "elm-dien-2",
        &[&one[..5], &["2"], &one[6..]].concat(),
    );
    assert_eq!(two["samples"], 1500);
    // Converting Parquet, or to something else than parquet:DIR, is refused naming the key.
    let err = run_err(&mut convert(&format!("parquet:{}", out.display()), &dir.path().join("x"), &[]));
    assert!(err.contains("from"), "{err}");
    let err = run_err(tiderec().args([
        "convert",
        "--from",
        &format!("csv:{}", elm.display()),
        "--spec",
        "elm",
        "--to",
        "csv:x",
    ]));
    assert!(err.contains("`to`"), "{err}");
}

#[test]
fn unusable_parquet_input_fails_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(empty.join("README.txt"), "no parquet here").unwrap();
    let fake = dir.path().join("fake");
    std::fs::create_dir(&fake).unwrap();
    std::fs::write(fake.join("x.parquet"), "label,I1\n0,1\n").unwrap();
    for (path, expect) in
        [(&missing, "no such file or directory"), (&empty, "holds no *.parquet files"), (&fake, "x.parquet")]
    {
        let err = run_err(
            tiderec().args(["train", "--progress", "none", "--data"]).arg(format!("parquet:{}", path.display())),
        );
        assert!(err.contains(expect) && err.contains("`data`"), "{}: expected `{expect}` in: {err}", path.display());
    }
}
