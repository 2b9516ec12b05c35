//! Non-finite numbers never reach the model, and a run whose model becomes
//! non-finite fails instead of reporting success: every reader with float
//! input rejects `inf`, `NaN` and values beyond `f32` as `non_finite` bad
//! records (file and line in the dead letters), and a diverging run exits
//! non-zero naming the step and the last good checkpoint.

mod common;

use common::{metrics, run_err, run_ok, tiderec};
use std::path::{Path, PathBuf};
use std::process::Command;
use tiderec_operators::Batch;
use tiderec_sources::parquet::{ParquetWriter, SchemaDescription, WriterOptions};

/// `tiderec train --data DATA` on a tiny LR run, with its dead letters and metrics in `dir`.
fn train_cmd(data: &str, dir: &Path, extra: &[&str]) -> Command {
    let mut c = tiderec();
    // The files are mostly bad records on purpose: the budget must not stop the run.
    c.args(["train", "--progress", "none", "--model", "lr", "--eval-fraction", "0", "--batch-size", "4"])
        .args(["--max-bad-fraction", "0.9", "--data", data])
        .args(extra)
        .arg("--dead-letters")
        .arg(dir.join("dead.tsv"))
        .arg("--metrics-json")
        .arg(dir.join("m.json"));
    c
}

/// `(source, line, reason, field)` of every dead letter.
fn dead_letters(dir: &Path) -> Vec<(String, u64, String, String)> {
    std::fs::read_to_string(dir.join("dead.tsv"))
        .expect("dead letters written")
        .lines()
        .map(|l| {
            let c: Vec<&str> = l.split('\t').collect();
            (c[0].to_string(), c[1].parse().unwrap(), c[3].to_string(), c[4].to_string())
        })
        .collect()
}

fn write(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}

/// Trains on `file` (data `kind`, extra flags) and checks that exactly the lines `bad`
/// (1-based, with the field of each) were rejected as `non_finite`, and `good` trained.
fn assert_non_finite_lines(kind: &str, file: &Path, extra: &[&str], bad: &[(u64, usize)], good: u64, dir: &Path) {
    run_ok(&mut train_cmd(&format!("{kind}:{}", file.display()), dir, extra));
    let m = metrics(&dir.join("m.json"));
    assert_eq!(m["bad_records_by_reason"]["non_finite"], bad.len() as u64, "{kind}: {m}");
    assert_eq!(m["bad_records"], bad.len() as u64, "{kind}: no other reason");
    assert_eq!(m["samples"], good, "{kind}: the other rows train");
    assert!(m["params_l2"].as_f64().unwrap().is_finite());
    // Workers write their dead letters concurrently: compare them in line order.
    let mut letters = dead_letters(dir);
    letters.sort_by_key(|l| l.1);
    let want: Vec<(String, u64, String, String)> = bad
        .iter()
        .map(|&(line, field)| (file.display().to_string(), line, "non_finite".to_string(), field.to_string()))
        .collect();
    assert_eq!(letters, want, "{kind}: dead letters name the file, line and field");
}

#[test]
fn spec_csv_values_that_are_not_finite_are_bad_records_with_their_line() {
    let dir = tempfile::tempdir().unwrap();
    let spec = write(
        &dir.path().join("spec.toml"),
        r#"
delimiter = ","
header = true
columns = ["y", "price", "prices", "user"]
label = { column = "y" }
dense = [{ column = "price", log1p = true, clamp = [0.0, 100.0] }]
numeric_list = [{ column = "prices", delimiter = ";", reduce = "sum" }]
categorical = [{ column = "user", buckets = 100 }]
"#,
    );
    // Line 1 is the header. Under a clamp, `inf` would become 100: it is rejected first.
    let csv = write(
        &dir.path().join("data.csv"),
        "y,price,prices,user\n1,2.5,1;2,a\n0,inf,1,b\n1,3,1,c\n0,NaN,1,d\n1,1e40,1,e\n0,4,1;inf,f\n1,-inf,1,g\n\
         0,5,3e38;3e38,h\n1,6,7,i\n",
    );
    let spec_arg = spec.display().to_string();
    let bad = [(3, 1), (5, 1), (6, 1), (7, 2), (8, 1), (9, 2)];
    assert_non_finite_lines("csv", &csv, &["--spec", &spec_arg], &bad, 3, dir.path());
}

#[test]
fn taobao_ad_prices_that_are_not_finite_are_bad_records() {
    let dir = tempfile::tempdir().unwrap();
    let header = "clk,time_stamp,userid,adgroup_id,pid,cate_id,campaign_id,customer,brand,price,cms_segid,\
                  cms_group_id,final_gender_code,age_level,pvalue_level,shopping_level,occupation,\
                  new_user_class_level,click_sequence";
    let row = |price: &str| {
        format!("0,2017-05-06 00:00:00,874257,172298,430548_1007,5443,160194,864,339907,{price},0,3,2,3,,3,0,,170301^573514")
    };
    let text: Vec<String> =
        std::iter::once(header.to_string()).chain(["3.9", "inf", "189.0", "nan", "1e40", "12"].map(row)).collect();
    let csv = write(&dir.path().join("ad.csv"), &(text.join("\n") + "\n"));
    // `price` is column 9.
    assert_non_finite_lines("taobao-ad", &csv, &[], &[(3, 9), (5, 9), (6, 9)], 3, dir.path());
}

#[test]
fn parquet_dense_values_that_are_not_finite_are_bad_records_with_their_row() {
    let dir = tempfile::tempdir().unwrap();
    let pq = dir.path().join("pq");
    let description = SchemaDescription::criteo(&[50; 26], 1);
    let mut batch = Batch::new(13, 26);
    let values = [1.0, f32::INFINITY, 2.0, f32::NAN, 3.0, f32::NEG_INFINITY, 4.0, 5.0];
    for (i, &v) in values.iter().enumerate() {
        batch.labels.push((i % 2) as f32);
        batch.dense.extend((0..13).map(|k| if k == 4 { v } else { 0.5 }));
        for (f, field) in batch.sparse.iter_mut().enumerate() {
            field.ids.push(((i + f) % 50) as u64);
            field.close_bag();
        }
    }
    let mut writer = ParquetWriter::create(&pq, description, WriterOptions::default()).unwrap();
    writer.write(&batch).unwrap();
    let file = writer.finish().unwrap().files.remove(0);
    // Rows 2, 4 and 6 (1-based) hold the bad values, in dense column I5 (field 5).
    assert_non_finite_lines("parquet", &file, &[], &[(2, 5), (4, 5), (6, 5)], 5, dir.path());
    // Under `--on-bad-record fail` the first one stops the run, naming the row.
    let err = run_err(&mut train_cmd(
        &format!("parquet:{}", file.display()),
        dir.path(),
        &["--on-bad-record", "fail", "--overwrite"],
    ));
    assert!(err.contains(&format!("{}:2", file.display())) && err.contains("non_finite"), "{err}");
}

/// The default synthetic run with plain SGD at the largest learning rate (1000: the loss is
/// NaN by step 3) and extra flags.
fn diverging(extra: &[&str]) -> Command {
    let mut c = tiderec();
    c.args(["train", "--progress", "none", "--samples", "20480", "--batch-size", "256"])
        .args(["--optimizer", "sgd", "--sparse-optimizer", "sgd", "--lr", "1000", "--sparse-lr", "1000"])
        .args(extra);
    c
}

#[test]
fn a_diverging_run_fails_naming_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.json");
    let err = run_err(diverging(&["--metrics-json"]).arg(&m));
    assert!(err.contains("training diverged at step "), "{err}");
    assert!(err.contains("no checkpoint was written (no --checkpoint-dir)"), "{err}");
    assert!(!err.contains("AUC") && !m.exists(), "no metrics of a ruined model: {err}");
}

#[test]
fn a_diverging_run_names_its_last_good_checkpoint_and_writes_none_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let ck_arg = ck.display().to_string();
    for workers in ["1", "2"] {
        let _ = std::fs::remove_dir_all(&ck);
        let err =
            run_err(&mut diverging(&["--workers", workers, "--checkpoint-dir", &ck_arg, "--checkpoint-every", "1"]));
        let step: u64 = err
            .split("training diverged at step ")
            .nth(1)
            .and_then(|r| r.split(':').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("the step is named: {err}"));
        // Every entry but the lock file, which stays.
        let mut names: Vec<String> = std::fs::read_dir(&ck)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !tiderec::dir_lock::is_lock_file(n))
            .collect();
        names.sort();
        let last = format!("ckpt-{}", step - 1);
        if step > 1 {
            assert!(err.contains(&ck.join(&last).display().to_string()), "names {last}: {err}");
            assert!(names.contains(&last), "{last} is on disk: {names:?}");
        } else {
            assert!(err.contains("no checkpoint was written before it"), "{err}");
        }
        // Nothing of the diverged step or later, and no half-written checkpoint.
        for n in &names {
            let s: u64 = n.strip_prefix("ckpt-").and_then(|s| s.parse().ok()).unwrap_or(u64::MAX);
            assert!(s < step, "W = {workers}: {n} written at or after the diverged step {step}");
        }
    }
}

/// A record the model scores `NaN` or infinite stops `predict` and `eval` with an error
/// naming its file and line, never a `NaN` row in a scores file or a metric of a ruined
/// pass: dense values of `±3e38` are finite, taken as given by a spec without transforms,
/// and overflow the layers of a model trained on values in [0, 1].
#[test]
fn a_non_finite_score_stops_predict_and_eval_naming_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let columns: Vec<String> = (0..8).map(|k| format!("d{k}")).collect();
    let quoted: Vec<String> = columns.iter().map(|c| format!("\"{c}\"")).collect();
    let dense: Vec<String> = columns.iter().map(|c| format!("{{ column = \"{c}\" }}")).collect();
    let spec = write(
        &d.join("spec.toml"),
        &format!(
            "delimiter = \",\"\nheader = true\ncolumns = [\"y\", {}, \"user\"]\nlabel = {{ column = \"y\" }}\n\
             dense = [{}]\ncategorical = [{{ column = \"user\", buckets = 50 }}]\n",
            quoted.join(", "),
            dense.join(", ")
        ),
    );
    let header = format!("y,{},user\n", columns.join(","));
    let row = |label: usize, values: &[String], user: usize| format!("{label},{},u{user}\n", values.join(","));
    let rows: String = (0..400)
        .map(|i| {
            let v: Vec<f32> = (0..8).map(|k| ((i * (37 + 6 * k)) % 100) as f32 / 100.0).collect();
            row(usize::from(v[0] + v[1] > 1.0), &v.iter().map(f32::to_string).collect::<Vec<_>>(), i % 31)
        })
        .collect();
    let train = write(&d.join("train.csv"), &format!("{header}{rows}"));
    let ck = d.join("ck");
    run_ok(
        tiderec()
            .args(["train", "--progress", "none", "--workers", "2", "--steps", "30", "--batch-size", "16", "--spec"])
            .arg(&spec)
            .arg("--data")
            .arg(format!("csv:{}", train.display()))
            .arg("--checkpoint-dir")
            .arg(&ck)
            .arg("--dead-letters")
            .arg(d.join("train-dead.tsv")),
    );
    // Line 2 is an ordinary record; lines 3 to 18 hold ±3e38 in every column, the signs
    // mixed in 16 ways.
    let huge: String = (0..16u64)
        .map(|p| {
            let sign = |k: u64| if ((p * 2_654_435_761 + k * 40_503) >> 7) & 1 == 1 { "3e38" } else { "-3e38" };
            row(p as usize % 2, &(0..8).map(|k| sign(k).to_string()).collect::<Vec<_>>(), p as usize)
        })
        .collect();
    let ordinary = row(1, &vec!["0.5".to_string(); 8], 1);
    let huge = write(&d.join("huge.csv"), &format!("{header}{ordinary}{huge}"));
    let data = format!("csv:{}", huge.display());
    let named = |err: &str| {
        let at = (3..=18).find(|l| err.contains(&format!("{} line {l}: the model's score is ", huge.display())));
        assert!(at.is_some() && err.contains("not a finite number"), "the file and line are named: {err}");
    };
    let out = d.join("scores.csv");
    let score = |command: &str| {
        let mut c = tiderec();
        c.args([command, "--data", &data, "--checkpoint"]).arg(&ck).arg("--dead-letters").arg(d.join("dead.tsv"));
        c
    };
    named(&run_err(score("predict").arg("--out").arg(&out)));
    let left: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("scores.csv"))
        .collect();
    assert!(left.is_empty(), "no scores file, not even a temporary one: {left:?}");
    let o = score("eval").output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(!o.status.success() && !stdout.contains("logloss"), "no metrics of a ruined pass: {stdout}");
    named(&stderr);
}
