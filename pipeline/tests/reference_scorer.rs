//! `scripts/reference_scorer.py` (NumPy, from `model.json` and `model.safetensors`
//! alone) against `tiderec predict` on the same checkpoint, for every model kind
//! (LR, FM, DeepFM, Wide & Deep and DLRM on real Criteo records, LR and Wide & Deep
//! with feature crosses, DIEN and its sum-pooling baseline on real behaviour
//! histories, models trained on converted Parquet rows), record by record within 1e-5;
//! and `scripts/torch_model.py` (the export loaded into a PyTorch `nn.Module` by its
//! tensor names) on every one of those records within 1e-6 of `predict`.

mod common;

use common::{run_ok, scorer_python_ready, script, shared_data, skip, tiderec};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::Command;

fn scorer() -> PathBuf {
    script("reference_scorer.py")
}

/// `tiderec predict`'s rows for the Criteo records of `file` (malformed ones dead-lettered).
fn predict_scores(ckpt: &Path, file: &Path, unlabeled: bool, out: &Path) -> Vec<Row> {
    predict_format(ckpt, "criteo", file, unlabeled, out)
}

/// `tiderec predict`'s rows for the `format` records of `file` (malformed ones dead-lettered).
fn predict_format(ckpt: &Path, format: &str, file: &Path, unlabeled: bool, out: &Path) -> Vec<Row> {
    let mut cmd = tiderec();
    cmd.args(["predict", "--checkpoint"]).arg(ckpt).arg("--data").arg(format!("{format}:{}", file.display()));
    cmd.arg("--out").arg(out).arg("--dead-letters").arg(out.with_extension("dead.tsv"));
    if unlabeled {
        cmd.arg("--unlabeled");
    }
    run_ok(&mut cmd);
    read_rows(out, unlabeled)
}

/// One row of the scorer's CSV.
struct Row {
    file: String,
    position: usize,
    score: f64,
    label: Option<f32>,
    /// The PyTorch module's score of the same record (the reference scorer's rows).
    torch: Option<f64>,
}

/// Runs the reference scorer and the PyTorch module on `files`; returns the reference's
/// rows (the header checked) with the module's score of each, which scored the same
/// records (file, position, label).
fn python_scores(model: &Path, files: &[&Path], unlabeled: bool, out: &Path) -> Vec<Row> {
    let run = |name: &str, out: &Path| {
        let mut cmd = Command::new("python3");
        cmd.arg(script(name)).arg("--model").arg(model).arg("--out").arg(out).args(["--batch-size", "64"]);
        if unlabeled {
            cmd.arg("--unlabeled");
        }
        let o = cmd.args(files).output().unwrap();
        assert!(o.status.success(), "{name} failed: {}", String::from_utf8_lossy(&o.stderr));
        read_rows(out, unlabeled)
    };
    let mut rows = run("reference_scorer.py", out);
    let torch = run("torch_model.py", &out.with_extension("torch.csv"));
    assert_eq!(
        rows.len(),
        torch.len(),
        "the PyTorch module scored {} records, the reference {}",
        torch.len(),
        rows.len()
    );
    for (r, t) in rows.iter_mut().zip(torch) {
        assert_eq!((&r.file, r.position, r.label), (&t.file, t.position, t.label), "the PyTorch module's records");
        r.torch = Some(t.score);
    }
    rows
}

/// The reference scorer run on `model` and `data` where it must refuse: it exits 2
/// with a message and no traceback, which is returned.
fn refusal(model: &Path, data: &Path, out: &Path) -> String {
    let o = Command::new("python3").arg(scorer()).arg("--model").arg(model).arg("--out").arg(out).arg(data).output();
    let o = o.unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(!err.contains("Traceback"), "a refusal, not a crash: {err}");
    err
}

/// The rows of a `file,position,score[,label]` CSV (the header checked).
fn read_rows(out: &Path, unlabeled: bool) -> Vec<Row> {
    let text = std::fs::read_to_string(out).unwrap();
    let mut lines = text.lines();
    let header = if unlabeled { "file,position,score" } else { "file,position,score,label" };
    assert_eq!(lines.next(), Some(header));
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            Row {
                file: cells[0].to_string(),
                position: cells[1].parse().unwrap(),
                score: cells[2].parse().unwrap(),
                label: cells.get(3).map(|s| s.parse().unwrap()),
                torch: None,
            }
        })
        .collect()
}

/// The model.json of an export.
/// Trains with `args` (after `train --progress none`) on `data`, checkpointing to
/// `dir/ckpt-NAME`, and exports the newest checkpoint to `dir/serve-NAME`; returns both.
fn train_and_export(dir: &Path, name: &str, data: &str, args: &[&str]) -> (PathBuf, PathBuf) {
    let suffix = if name.is_empty() { String::new() } else { format!("-{name}") };
    let ckpt = dir.join(format!("ckpt{suffix}"));
    run_ok(
        tiderec()
            .args(["train", "--progress", "none"])
            .args(args)
            .arg("--data")
            .arg(data)
            .arg("--checkpoint-dir")
            .arg(&ckpt),
    );
    let serve = dir.join(format!("serve{suffix}"));
    run_ok(tiderec().args(["export", "--checkpoint"]).arg(&ckpt).arg("--out").arg(&serve));
    (ckpt, serve)
}

/// Writes `train.tsv`, the first `train` lines, and `score.tsv`, the lines of
/// `held` with the malformed `bad` inserted as its third record.
fn sample_split(dir: &Path, lines: &[&str], train: usize, held: Range<usize>, bad: String) -> (PathBuf, PathBuf) {
    let train_file = dir.join("train.tsv");
    std::fs::write(&train_file, lines[..train].join("\n")).unwrap();
    let mut held: Vec<String> = lines[held].iter().map(|s| s.to_string()).collect();
    held.insert(2, bad);
    let score_file = dir.join("score.tsv");
    std::fs::write(&score_file, held.join("\n") + "\n").unwrap();
    (train_file, score_file)
}

/// [`train_and_export`] of a small `kind` model (3,000 buckets, 60 steps of 128) with `flags` on `data`.
fn train_small(dir: &Path, kind: &str, data: &str, flags: &[&str]) -> (PathBuf, PathBuf) {
    let common = ["--model", kind, "--buckets", "3000", "--steps", "60", "--batch-size", "128", "--sparse-lr", "0.05"];
    train_and_export(dir, kind, data, &[&common[..], flags].concat())
}

fn model_json(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("model.json")).unwrap()).unwrap()
}

/// Every model kind trained a few steps on the Criteo sample, exported, scored
/// by the Python reference from the export alone and by the library from the
/// checkpoint: the same probabilities within 1e-5, record by record, a
/// malformed record skipped by both at the same place, and `model.json`
/// naming the true kind and the tensors by layer and field.
#[test]
fn the_reference_scorer_matches_the_library_for_every_model_kind() {
    let Some(train) = shared_data("criteo/sample.train") else { return };
    if !scorer_python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&train).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // 400 held-out records with a malformed one (a bad label) at line 3.
    let (train_file, score_file) =
        sample_split(dir.path(), &lines, 8000, 8000..8400, format!("7{}", &lines[8002][1..]));

    let kinds: [(&str, &[&str]); 5] = [
        ("lr", &[]),
        ("fm", &["--dim", "8"]),
        ("deepfm", &["--dim", "8", "--deep", "32,16"]),
        ("wdl", &["--dim", "8", "--deep", "32,16", "--sparse-optimizer", "ftrl-adagrad"]),
        ("dlrm", &["--dim", "8", "--bottom", "32,8", "--top", "32,1"]),
    ];
    for (kind, flags) in kinds {
        let (ckpt, serve) = train_small(dir.path(), kind, &format!("criteo:{}", train_file.display()), flags);

        let config = model_json(&serve);
        assert_eq!(config["kind"], kind);
        assert_eq!(config["model"]["kind"], kind);
        let tensors = &config["tensors"];
        match kind {
            "dlrm" => {
                assert_eq!(tensors["bottom.0.weight"], serde_json::json!([32, 13]));
                assert_eq!(tensors["top.0.weight"], serde_json::json!([32, 8 + 26 * 27 / 2]));
                assert_eq!(tensors["embeddings.C26"], serde_json::json!([3000, 8]));
            }
            "lr" => {
                assert_eq!(tensors["linear.weight"], serde_json::json!([1, 13]));
                assert_eq!(tensors["first_order.C1"], serde_json::json!([3000, 1]));
                assert!(tensors.get("embeddings.C1").is_none());
            }
            _ => {
                assert_eq!(tensors["first_order.C1"], serde_json::json!([3000, 1]));
                assert_eq!(tensors["embeddings.C1"], serde_json::json!([3000, 8]));
                assert_eq!(tensors.get("deep.0.weight").is_some(), kind != "fm", "{kind}: {tensors}");
            }
        }

        let want = predict_scores(&ckpt, &score_file, false, &dir.path().join(format!("{kind}-predict.csv")));
        let rows = python_scores(&serve, &[&score_file], false, &dir.path().join(format!("{kind}.csv")));
        let expected: Vec<usize> = (1..=401).filter(|&p| p != 3).collect();
        assert_same_scores(kind, &score_file, &rows, &want, &expected);

        if kind == "deepfm" {
            unlabeled_records_score_like_predict(&ckpt, &serve, dir.path());
        }
    }
}

/// The reference's rows equal predict's: the same records (`positions`, line numbers with
/// the malformed ones skipped) of `file`, the same labels, probabilities within 1e-5 of
/// each other (the PyTorch module's within 1e-6), and a trained model's probabilities
/// spread over more than 1e-3. Returns the reference's largest difference.
fn assert_same_scores(what: &str, file: &Path, rows: &[Row], want: &[Row], positions: &[usize]) -> f64 {
    assert_torch_scores(what, rows, want);
    assert_eq!(
        want.len(),
        rows.len(),
        "{what}: tiderec predict scored {} records, the reference {}",
        want.len(),
        rows.len()
    );
    let got: Vec<usize> = rows.iter().map(|r| r.position).collect();
    assert_eq!(got, positions, "{what}: positions are line numbers, the malformed lines skipped");
    let mut worst = 0.0f64;
    for (r, w) in rows.iter().zip(want) {
        assert_eq!((&r.file, r.position), (&w.file, w.position));
        assert_eq!(r.file, file.display().to_string());
        assert_eq!(r.label, w.label, "{what}: label of line {}", r.position);
        worst = worst.max((r.score - w.score).abs());
    }
    assert!(worst <= 1e-5, "{what}: the reference's probabilities differ from predict's by up to {worst:e}");
    let (lo, hi) = want.iter().fold((1.0f64, 0.0f64), |(lo, hi), w| (lo.min(w.score), hi.max(w.score)));
    assert!(hi - lo > 1e-3, "{what}: a trained model tells records apart ({lo}..{hi})");
    eprintln!("{what}: {} records, largest difference {worst:e}, probabilities {lo:.4}..{hi:.4}", rows.len());
    worst
}

/// The PyTorch module's probabilities are within 1e-6 of predict's, record by record.
fn assert_torch_scores(what: &str, rows: &[Row], want: &[Row]) {
    let mut worst = 0.0f64;
    for (r, w) in rows.iter().zip(want) {
        let torch = r.torch.unwrap_or_else(|| panic!("{what}: no PyTorch score of line {}", r.position));
        worst = worst.max((torch - w.score).abs());
    }
    assert!(worst <= 1e-6, "{what}: the PyTorch module's probabilities differ from predict's by up to {worst:e}");
    eprintln!("{what}: the PyTorch module within {worst:e} of predict");
}

/// Kaggle's unlabeled test records (`--unlabeled`) score as `tiderec predict --unlabeled` scores them.
fn unlabeled_records_score_like_predict(ckpt: &Path, serve: &Path, dir: &Path) {
    let Some(test) = shared_data("criteo/sample.test") else { return };
    let text = std::fs::read_to_string(test).unwrap();
    let lines: Vec<&str> = text.lines().take(200).collect();
    let unlabeled = dir.join("test.tsv");
    std::fs::write(&unlabeled, lines.join("\n")).unwrap();
    let want = predict_scores(ckpt, &unlabeled, true, &dir.join("test-predict.csv"));
    let rows = python_scores(serve, &[&unlabeled], true, &dir.join("test.csv"));
    assert_eq!((rows.len(), want.len()), (200, 200));
    assert_torch_scores("unlabeled Kaggle test records", &rows, &want);
    for (r, w) in rows.iter().zip(&want) {
        assert!(r.label.is_none() && w.label.is_none());
        assert_eq!(r.position, w.position);
        assert!((r.score - w.score).abs() < 1e-5, "line {}: {} vs {}", r.position, r.score, w.score);
    }
}

/// A model the scorer cannot rebuild from Criteo records is refused with a
/// message naming why, not scored wrongly: a malformed model.json version.
#[test]
fn the_reference_scorer_refuses_an_unknown_format_version() {
    if !scorer_python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.json"), r#"{"format": "tiderec-serving", "format_version": 1}"#).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ").unwrap();
    let data = dir.path().join("d.tsv");
    std::fs::write(&data, "").unwrap();
    let err = refusal(dir.path(), &data, &dir.path().join("o.csv"));
    assert!(err.contains("version 1"), "{err}");
}

/// LR and Wide & Deep with feature crosses of Criteo fields: model.json names the crossed
/// pairs and spells out the cross hash, and the reference rebuilds the cross ids from it
/// and scores like predict; with the pairs swapped in model.json it does not (the crosses
/// count, and their order matters).
#[test]
fn the_reference_scorer_rebuilds_the_feature_crosses_of_lr_and_wdl() {
    let Some(train) = shared_data("criteo/sample.train") else { return };
    if !scorer_python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&train).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // 300 held-out records with a malformed one (a non-hex category) at line 3.
    let mut fields: Vec<&str> = lines[8002].split('\t').collect();
    fields[15] = "zz"; // C2, a crossed field
    let (train_file, score_file) = sample_split(dir.path(), &lines, 6000, 8000..8300, fields.join("\t"));
    let positions: Vec<usize> = (1..=301).filter(|&p| p != 3).collect();

    for (kind, flags) in [("lr", &[][..]), ("wdl", &["--dim", "8", "--deep", "32,16"][..])] {
        let (ckpt, serve) = train_and_export(
            dir.path(),
            kind,
            &format!("criteo:{}", train_file.display()),
            &[
                &[
                    "--model",
                    kind,
                    "--buckets",
                    "3000",
                    "--steps",
                    "40",
                    "--batch-size",
                    "128",
                    "--sparse-lr",
                    "0.05",
                    "--crosses",
                    "0:1,2:5,13:25",
                ][..],
                flags,
            ]
            .concat(),
        );
        let config = model_json(&serve);
        assert_eq!(config["kind"], kind);
        let crosses = &config["features"]["crosses"];
        assert_eq!(crosses["pairs"], serde_json::json!([[0, 1], [2, 5], [13, 25]]));
        assert_eq!(crosses["named"][2], serde_json::json!({"field": "cross_2", "a": "C14", "b": "C26"}));
        assert_eq!(crosses["rows"], 3000);
        assert_eq!(config["sparse_fields"][28], "cross_2");
        assert_eq!(config["tensors"]["first_order.cross_2"], serde_json::json!([3000, 1]));
        assert!(config["tensors"].get("embeddings.cross_0").is_none(), "a cross has no factor");

        let want = predict_scores(&ckpt, &score_file, false, &dir.path().join(format!("{kind}-predict.csv")));
        let rows = python_scores(&serve, &[&score_file], false, &dir.path().join(format!("{kind}.csv")));
        assert_same_scores(&format!("{kind} with crosses"), &score_file, &rows, &want, &positions);

        // The same export with the first pair swapped: other cross ids, other scores.
        let mut swapped = config.clone();
        swapped["features"]["crosses"]["pairs"][0] = serde_json::json!([1, 0]);
        let other = dir.path().join(format!("swapped-{kind}"));
        std::fs::create_dir(&other).unwrap();
        std::fs::copy(serve.join("model.safetensors"), other.join("model.safetensors")).unwrap();
        std::fs::write(other.join("model.json"), swapped.to_string()).unwrap();
        let rows = python_scores(&other, &[&score_file], false, &dir.path().join(format!("{kind}-swapped.csv")));
        let moved = rows.iter().zip(&want).map(|(r, w)| (r.score - w.score).abs()).fold(0.0, f64::max);
        assert!(moved > 1e-4, "{kind}: crossing C2 × C1 instead of C1 × C2 changes nothing ({moved:e})");
    }
}

/// FM and Wide & Deep with a cross, trained on the real Avazu sample: model.json names the
/// fields as Kaggle's header does and spells out the Avazu featurization (XXH3 of each
/// value's bytes, the hour of day as a dense feature and as a field); the reference
/// scores held-out lines (after their header, one malformed) and Kaggle's unlabeled test
/// lines within 1e-5 of `tiderec predict`.
#[test]
fn the_reference_scorer_reproduces_avazu_models() {
    let Some(train) = shared_data("avazu/train") else { return };
    let Some(test) = shared_data("avazu/test") else { return };
    if !scorer_python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&train).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let train_file = dir.path().join("train.csv");
    std::fs::write(&train_file, lines[..8000].join("\n") + "\n").unwrap();
    // The header, then 300 held-out records with a malformed one (hour 24) at line 4.
    let mut held: Vec<String> =
        std::iter::once(lines[0]).chain(lines[8000..8300].iter().copied()).map(String::from).collect();
    let bad = held[3].replacen(",14102100,", ",14102124,", 1);
    held.insert(3, bad);
    let score_file = dir.path().join("score.csv");
    std::fs::write(&score_file, held.join("\n") + "\n").unwrap();
    let positions: Vec<usize> = (2..=302).filter(|&p| p != 4).collect();
    let test_text = std::fs::read_to_string(&test).unwrap();
    let unlabeled_file = dir.path().join("test.csv");
    std::fs::write(&unlabeled_file, test_text.lines().take(201).collect::<Vec<_>>().join("\n")).unwrap();

    let kinds: [(&str, &[&str]); 2] =
        [("fm", &["--dim", "8"]), ("wdl", &["--dim", "8", "--deep", "32,16", "--crosses", "2:5"])];
    for (kind, flags) in kinds {
        let (ckpt, serve) = train_small(dir.path(), kind, &format!("avazu:{}", train_file.display()), flags);
        let config = model_json(&serve);
        assert_eq!(config["kind"], kind);
        assert_eq!(config["features"]["format"], "avazu");
        assert_eq!(config["dense_features"], serde_json::json!(["hour"]));
        assert_eq!(config["sparse_fields"][2], "site_id");
        assert_eq!(config["sparse_fields"][21], "hour_of_day");
        assert_eq!(config["tensors"]["embeddings.site_id"], serde_json::json!([3000, 8]));
        if kind == "wdl" {
            let named = &config["features"]["crosses"]["named"][0];
            assert_eq!(named, &serde_json::json!({"field": "cross_0", "a": "site_id", "b": "app_id"}));
        }

        let want = predict_format(&ckpt, "avazu", &score_file, false, &dir.path().join(format!("{kind}-p.csv")));
        let rows = python_scores(&serve, &[&score_file], false, &dir.path().join(format!("{kind}.csv")));
        assert_same_scores(&format!("avazu {kind}"), &score_file, &rows, &want, &positions);

        let want = predict_format(&ckpt, "avazu", &unlabeled_file, true, &dir.path().join(format!("{kind}-u-p.csv")));
        let rows = python_scores(&serve, &[&unlabeled_file], true, &dir.path().join(format!("{kind}-u.csv")));
        let all: Vec<usize> = (2..=201).collect();
        assert_same_scores(&format!("avazu {kind}, unlabeled"), &unlabeled_file, &rows, &want, &all);
    }
}

/// DIEN sample lines (`label, user, item, category, item history, category history`,
/// histories joined by `\x02`) made from the real Taobao UserBehavior events: per user
/// (file order), every fifth event is the target of a positive record whose history is
/// the user's events before it, oldest first (at most 40, so many are longer than the
/// models' `--max-len`, and the first has none), followed by a negative record whose
/// target is the item of another event of the log.
fn behaviour_lines(log: &Path, limit: usize) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap();
    let events: Vec<Vec<&str>> =
        text.lines().map(|l| l.split(',').collect::<Vec<_>>()).filter(|f| f.len() == 5).collect();
    let mut out = Vec::new();
    let mut start = 0;
    while start < events.len() && out.len() < limit {
        let user = events[start][0];
        let end = start + events[start..].iter().take_while(|e| e[0] == user).count();
        let mine = &events[start..end];
        for i in (0..mine.len()).step_by(5) {
            let history = &mine[i.saturating_sub(40)..i];
            let items: Vec<&str> = history.iter().map(|e| e[1]).collect();
            let cats: Vec<&str> = history.iter().map(|e| e[2]).collect();
            let (items, cats) = (items.join("\x02"), cats.join("\x02"));
            let other = &events[(start + i) * 7919 % events.len()];
            out.push(format!("1\t{user}\t{}\t{}\t{items}\t{cats}", mine[i][1], mine[i][2]));
            out.push(format!("0\t{user}\t{}\t{}\t{items}\t{cats}", other[1], other[2]));
        }
        start = end;
    }
    out.truncate(limit);
    out
}

/// DIEN (GRU + attention) and its sum-pooling baseline, trained one epoch on DIEN sample
/// lines of real Taobao behaviour histories and exported: model.json names the GRU's
/// tensors as `torch.nn.GRU` does, the sequences, their tables and `max_len`, and
/// spells out the amazon-dien featurization; the reference rebuilds the model and the
/// featurization (XXH3 hashing, histories cut to their most recent `max_len` events)
/// from the export alone and scores held-out lines (one malformed: its histories differ
/// in length), their unlabeled form and the real Amazon DIEN test lines within 1e-5 of
/// `tiderec predict`. LR with crosses of XXH3-hashed fields scores the same lines alike.
#[test]
fn the_reference_scorer_reproduces_dien_and_dien_sum_on_real_histories() {
    let Some(log) = shared_data("taobao_user_behavior/UserBehavior.csv") else { return };
    let Some(amazon) = shared_data("amazon_dien/local_test") else { return };
    if !scorer_python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lines = behaviour_lines(&log, 2800);
    assert_eq!(lines.len(), 2800);
    let train_file = dir.path().join("train.dien");
    std::fs::write(&train_file, lines[..2400].join("\n") + "\n").unwrap();
    let mut held: Vec<String> = lines[2400..].to_vec();
    assert!(held.iter().any(|l| l.ends_with("\t\t")), "a record without history is held out");
    let bad = format!("{}\x021", held[1]); // one more category than items
    held.insert(2, bad);
    // An event with an empty item (and its category beside it) is skipped in both histories.
    let k = (4..held.len()).find(|&k| held[k].split('\t').nth(4).is_some_and(|h| h.contains('\x02'))).unwrap();
    let mut f: Vec<String> = held[k].split('\t').map(String::from).collect();
    // Among the most recent events, which the histories' cut to --max-len keeps.
    let last = |h: &str| h.rfind('\x02').unwrap();
    let (i, c) = (last(&f[4]), last(&f[5]));
    f[4].insert(i, '\x02');
    f[5].insert_str(c, "\x027");
    held[k] = f.join("\t");
    let score_file = dir.path().join("score.dien");
    std::fs::write(&score_file, held.join("\n") + "\n").unwrap();
    let positions: Vec<usize> = (1..=401).filter(|&p| p != 3).collect();
    let unlabeled: Vec<String> = held
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 2)
        .map(|(_, l)| l.split_once('\t').unwrap().1.to_string())
        .collect();
    let unlabeled_file = dir.path().join("unlabeled.dien");
    std::fs::write(&unlabeled_file, unlabeled.join("\n") + "\n").unwrap();
    let amazon_lines = std::fs::read_to_string(&amazon).unwrap().lines().count();

    for kind in ["dien", "dien-sum"] {
        let (ckpt, serve) = train_and_export(
            dir.path(),
            kind,
            &format!("amazon-dien:{}", train_file.display()),
            &[
                "--model",
                kind,
                "--buckets",
                "5000",
                "--epochs",
                "1",
                "--batch-size",
                "64",
                "--dim",
                "4",
                "--mlp",
                "16,8",
                "--max-len",
                "12",
                "--lr",
                "0.01",
                "--sparse-lr",
                "0.1",
            ],
        );
        let config = model_json(&serve);
        assert_eq!(config["kind"], kind);
        assert_eq!(config["sparse_fields"], serde_json::json!(["user", "item", "category"]));
        assert_eq!(config["sequence_fields"], serde_json::json!(["item_history", "category_history"]));
        let t = &config["tensors"];
        let e = 2 * 4; // two sequence fields of width 4
        assert_eq!(t["embeddings.item"], serde_json::json!([5000, 4]));
        assert_eq!(t["mlp.0.weight"], serde_json::json!([16, 3 * 4 + 2 * e]));
        let fw = &config["forward"];
        assert_eq!(fw["sequences"]["tables"], serde_json::json!(["embeddings.item", "embeddings.category"]));
        assert_eq!(fw["sequences"]["max_len"], 12);
        assert_eq!(fw["q"]["fields"], serde_json::json!(["item", "category"]));
        let features = &config["features"];
        assert_eq!(features["format"], "amazon-dien");
        assert_eq!(features["max_len"], 12);
        assert_eq!(features["hash"]["function"], "xxh3_64_with_seed");
        if kind == "dien" {
            assert_eq!(t["gru.weight_ih_l0"], serde_json::json!([3 * e, e]));
            assert_eq!(t["gru.weight_hh_l0"], serde_json::json!([3 * e, e]));
            assert_eq!(t["gru.bias_ih_l0"], serde_json::json!([3 * e]));
            assert_eq!(t["attention.weight"], serde_json::json!([e, e]));
            assert_eq!(fw["interest"]["kind"], "gru-attention");
            assert_eq!(fw["interest"]["gru"]["gate_order"], serde_json::json!(["r", "z", "n"]));
        } else {
            assert!(t.get("gru.weight_ih_l0").is_none());
            assert_eq!(fw["interest"]["kind"], "sum-pooling");
        }

        let want = predict_format(&ckpt, "amazon-dien", &score_file, false, &dir.path().join(format!("{kind}-p.csv")));
        let rows = python_scores(&serve, &[&score_file], false, &dir.path().join(format!("{kind}.csv")));
        assert_same_scores(kind, &score_file, &rows, &want, &positions);

        let want =
            predict_format(&ckpt, "amazon-dien", &unlabeled_file, true, &dir.path().join(format!("{kind}-u-p.csv")));
        let rows = python_scores(&serve, &[&unlabeled_file], true, &dir.path().join(format!("{kind}-u.csv")));
        let all: Vec<usize> = (1..=400).collect();
        assert_same_scores(&format!("{kind}, unlabeled"), &unlabeled_file, &rows, &want, &all);

        let want = predict_format(&ckpt, "amazon-dien", &amazon, false, &dir.path().join(format!("{kind}-a-p.csv")));
        let rows = python_scores(&serve, &[&amazon], false, &dir.path().join(format!("{kind}-a.csv")));
        let all: Vec<usize> = (1..=amazon_lines).collect();
        assert_same_scores(&format!("{kind}, Amazon DIEN test lines"), &amazon, &rows, &want, &all);
    }

    // LR on the same lines reads no history; its crosses (user × item, item × category)
    // pair XXH3-hashed ids.
    let (ckpt, serve) = train_and_export(
        dir.path(),
        "lr",
        &format!("amazon-dien:{}", train_file.display()),
        &[
            "--model",
            "lr",
            "--buckets",
            "5000",
            "--epochs",
            "1",
            "--batch-size",
            "64",
            "--sparse-lr",
            "0.1",
            "--crosses",
            "0:1,1:2",
        ],
    );
    let config = model_json(&serve);
    assert_eq!(config["sparse_fields"], serde_json::json!(["user", "item", "category", "cross_0", "cross_1"]));
    assert_eq!(
        config["features"]["crosses"]["named"][1],
        serde_json::json!({"field": "cross_1", "a": "item", "b": "category"})
    );
    let want = predict_format(&ckpt, "amazon-dien", &score_file, false, &dir.path().join("lr-p.csv"));
    let rows = python_scores(&serve, &[&score_file], false, &dir.path().join("lr.csv"));
    assert_same_scores("lr with crosses on DIEN lines", &score_file, &rows, &want, &positions);
}

/// A feature spec over the Taobao display-ad CSV using every kind of column: dense values
/// (one clamped, two scaled by statistics learned from the training file), a numeric list,
/// hashed, identity, vocabulary (with oov buckets), quantile and bucketized categoricals, a
/// mean-pooled list and the click sequence as a DIEN history of ad groups.
const TAOBAO_SPEC: &str = r#"
delimiter = ","
header = true
columns = ["clk", "time_stamp", "userid", "adgroup_id", "pid", "cate_id", "campaign_id", "customer", "brand",
           "price", "cms_segid", "cms_group_id", "final_gender_code", "age_level", "pvalue_level",
           "shopping_level", "occupation", "new_user_class_level", "click_sequence"]
label = { column = "clk" }
dense = [
  { column = "price", log1p = true, scale = "standardize" },
  { column = "shopping_level", clamp = [1.0, 2.5] },
  { column = "cms_segid", scale = "min_max" },
]
numeric_list = [{ column = "click_sequence", delimiter = "^", reduce = "mean" }]
categorical = [
  { column = "userid", buckets = 500 },
  { column = "adgroup_id", buckets = 3000 },
  { column = "cate_id", buckets = 500 },
  { column = "brand", buckets = 500 },
  { column = "pid", buckets = 50 },
  { column = "cms_group_id", buckets = 20, encoding = "identity" },
  { column = "age_level", buckets = 8, encoding = "vocabulary", vocabulary = ["2", "3", "4"], oov_buckets = 3 },
  { column = "price", buckets = 6, encoding = "quantile" },
  { column = "new_user_class_level", buckets = 4, encoding = "bucketize", boundaries = [2.0, 3.0, 4.0] },
]
list = [
  { column = "click_sequence", delimiter = "^", max_len = 4, buckets = 3000, pooling = "none", target = "adgroup_id" },
  { column = "click_sequence", delimiter = "^", max_len = 3, buckets = 700, pooling = "mean" },
]
"#;

/// Feature-spec records: DIEN, `dien-sum` and Wide & Deep with a cross, trained on the
/// Taobao display-ad sample with [`TAOBAO_SPEC`] (`csv:` data with `--spec`), and LR on
/// the `taobao-ad` preset: model.json names the fields by the spec's columns and
/// spells the spec out (vocabulary inlined); the reference scores the held-out sample
/// (after its header, one malformed line) and its unlabeled form within 1e-5 of
/// `tiderec predict`.
#[test]
fn the_reference_scorer_reproduces_models_of_feature_spec_records() {
    let Some(train) = shared_data("taobao_ad/train_sample.csv") else { return };
    let Some(test) = shared_data("taobao_ad/test_sample.csv") else { return };
    if !scorer_python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("taobao.toml");
    std::fs::write(&spec, TAOBAO_SPEC).unwrap();
    let text = std::fs::read_to_string(&test).unwrap();
    let mut held: Vec<String> = text.lines().map(String::from).collect();
    // Line 3: an identity id beyond its 20 rows (malformed under the spec).
    let mut fields: Vec<String> = held[2].split(',').map(String::from).collect();
    fields[11] = "21".into();
    held.insert(2, fields.join(","));
    let score_file = dir.path().join("score.csv");
    std::fs::write(&score_file, held.join("\n") + "\n").unwrap();
    let positions: Vec<usize> = (2..=held.len()).filter(|&p| p != 3).collect();
    let unlabeled: Vec<String> = held
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 2)
        .map(|(_, l)| l.split_once(',').unwrap().1.to_string())
        .collect();
    let unlabeled_file = dir.path().join("unlabeled.csv");
    std::fs::write(&unlabeled_file, unlabeled.join("\n") + "\n").unwrap();
    let all: Vec<usize> = (2..=unlabeled.len()).collect();

    let spec_arg = spec.display().to_string();
    let with_spec = ["--spec", spec_arg.as_str()];
    let kinds: [(&str, &str, &str, Vec<&str>); 4] = [
        ("dien", "dien", "csv", [&with_spec[..], &["--dim", "4", "--mlp", "16", "--max-len", "4"]].concat()),
        ("dien-sum", "dien-sum", "csv", [&with_spec[..], &["--dim", "4", "--mlp", "16", "--max-len", "4"]].concat()),
        ("wdl", "wdl", "csv", [&with_spec[..], &["--dim", "4", "--deep", "16", "--crosses", "0:1"]].concat()),
        ("lr-preset", "lr", "taobao-ad", vec![]),
    ];
    for (name, kind, format, flags) in kinds {
        let (ckpt, serve) = train_and_export(
            dir.path(),
            name,
            &format!("{format}:{}", train.display()),
            &[
                &[
                    "--model",
                    kind,
                    "--buckets",
                    "1000",
                    "--epochs",
                    "3",
                    "--batch-size",
                    "16",
                    "--lr",
                    "0.01",
                    "--sparse-lr",
                    "0.1",
                ][..],
                &flags[..],
            ]
            .concat(),
        );
        let config = model_json(&serve);
        assert_eq!(config["kind"], kind);
        let features = &config["features"];
        assert_eq!(features["format"], format);
        if name == "lr-preset" {
            assert_eq!(config["sparse_fields"][0], "userid");
            assert_eq!(config["sparse_fields"][15], "click_sequence");
        } else {
            let dense = serde_json::json!(["price", "shopping_level", "cms_segid", "click_sequence"]);
            assert_eq!(config["dense_features"], dense);
            // The learned scales and quantile boundaries are spelled out.
            let scale = &features["dense"][0]["scale"];
            assert!(scale["width"].as_f64().unwrap() > 0.0 && scale["center"].as_f64().unwrap() > 0.0, "{scale}");
            assert_eq!(features["dense"][1]["scale"], serde_json::Value::Null);
            let quantiles = features["categorical"][7]["boundaries"].as_array().unwrap().len();
            assert!((1..=5).contains(&quantiles), "{}", features["categorical"][7]);
            assert_eq!(features["categorical"][8]["boundaries"], serde_json::json!([2.0, 3.0, 4.0]));
            assert_eq!(config["sparse_fields"][6], "age_level");
            assert_eq!(features["categorical"][6]["vocabulary"], serde_json::json!(["2", "3", "4"]));
            assert_eq!(features["lists"][1]["pooling"], "mean");
        }
        if kind.starts_with("dien") {
            assert_eq!(config["sequence_fields"], serde_json::json!(["click_sequence"]));
            assert_eq!(config["forward"]["sequences"]["tables"], serde_json::json!(["embeddings.adgroup_id"]));
            assert_eq!(config["forward"]["q"]["fields"], serde_json::json!(["adgroup_id"]));
        }

        let want = predict_format(&ckpt, format, &score_file, false, &dir.path().join(format!("{name}-p.csv")));
        let rows = python_scores(&serve, &[&score_file], false, &dir.path().join(format!("{name}.csv")));
        // The preset hashes `cms_group_id`: line 3 is a record like any other there.
        let lines: Vec<usize> = if name == "lr-preset" { (2..=held.len()).collect() } else { positions.clone() };
        assert_same_scores(&format!("{format} {name}"), &score_file, &rows, &want, &lines);

        let want = predict_format(&ckpt, format, &unlabeled_file, true, &dir.path().join(format!("{name}-u-p.csv")));
        let rows = python_scores(&serve, &[&unlabeled_file], true, &dir.path().join(format!("{name}-u.csv")));
        assert_same_scores(&format!("{format} {name}, unlabeled"), &unlabeled_file, &rows, &want, &all);
    }
}

/// A model whose records model.json does not spell out (here DLRM on converted Parquet
/// files) is refused with a message naming the format, not scored.
#[test]
fn the_reference_scorer_refuses_records_model_json_does_not_spell_out() {
    let Some(part) = shared_data("criteo/part-0") else { return };
    if !scorer_python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, serve) =
        train_and_export(dir.path(), "", "synthetic", &["--model", "lr", "--buckets", "1000", "--steps", "3"]);
    assert_eq!(model_json(&serve)["features"]["format"], "synthetic");
    let err = refusal(&serve, &part, &dir.path().join("o.csv"));
    assert!(err.contains("'synthetic'"), "{err}");
}

/// Converts `from` (`FORMAT:PATH`) to Parquet in `dir/NAME` with `flags`; returns the directory.
fn convert(dir: &Path, name: &str, from: &str, flags: &[&str]) -> PathBuf {
    let pq = dir.join(name);
    run_ok(
        tiderec()
            .args(["convert", "--progress", "none"])
            .args(flags)
            .args(["--from", from])
            .arg("--to")
            .arg(format!("parquet:{}", pq.display())),
    );
    pq
}

/// Models trained on Parquet files (`tiderec convert` output) score their featurized rows:
/// Wide & Deep with feature crosses on Criteo rows in two files and DIEN on Amazon
/// histories, the reference (given the directory) within 1e-5 of `predict`, row by row
/// with the same 0-based positions; a row file of another schema is refused.
#[test]
fn the_reference_scorer_reads_the_rows_of_models_trained_on_parquet() {
    let (Some(criteo), Some(amazon)) = (shared_data("criteo/sample.train"), shared_data("amazon_dien/local_test"))
    else {
        return;
    };
    if !scorer_python_ready() {
        return;
    }
    let pyarrow = Command::new("python3").args(["-c", "import pyarrow"]).output().is_ok_and(|o| o.status.success());
    if !pyarrow {
        skip::cannot_run("python3 without pyarrow (pip install pyarrow)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = std::fs::read_to_string(criteo).unwrap();
    let head = d.join("head.tsv");
    std::fs::write(&head, text.lines().take(3000).collect::<Vec<_>>().join("\n")).unwrap();
    let criteo_pq = convert(
        d,
        "criteo-pq",
        &format!("criteo:{}", head.display()),
        &["--buckets", "3000", "--rows-per-file", "2000"],
    );
    let amazon_pq = convert(d, "amazon-pq", &format!("amazon-dien:{}", amazon.display()), &["--buckets", "500"]);
    let runs = [
        ("wdl", &criteo_pq, vec!["--crosses", "0:1,2:5", "--buckets", "3000"]),
        ("dien", &amazon_pq, vec!["--buckets", "500", "--batch-size", "8"]),
    ];
    for (kind, pq, flags) in runs {
        let data = format!("parquet:{}", pq.display());
        let (ckpt, serve) =
            train_and_export(d, kind, &data, &[&["--model", kind, "--epochs", "2"][..], &flags].concat());
        assert_eq!(model_json(&serve)["features"]["format"], "parquet");
        let want = predict_format(&ckpt, "parquet", pq, false, &d.join(format!("{kind}-predict.csv")));
        let rows = python_scores(&serve, &[pq.as_path()], false, &d.join(format!("{kind}-reference.csv")));
        assert_eq!(rows.len(), want.len(), "{kind}: one score per row");
        let mut worst = 0.0f64;
        for (r, w) in rows.iter().zip(&want) {
            assert_eq!((&r.file, r.position, r.label), (&w.file, w.position, w.label), "{kind}");
            worst = worst.max((r.score - w.score).abs());
        }
        assert!(worst <= 1e-5, "{kind}: the reference differs from predict by up to {worst:e}");
        assert_torch_scores(&format!("{kind} on parquet"), &rows, &want);
        let (lo, hi) = want.iter().fold((1.0f64, 0.0f64), |(lo, hi), w| (lo.min(w.score), hi.max(w.score)));
        assert!(hi - lo > 1e-3, "{kind}: a trained model tells rows apart ({lo}..{hi})");
        eprintln!("{kind} on parquet: {} rows, largest difference {worst:e}", rows.len());
    }
    assert_eq!(parquet_files(&criteo_pq), 2, "the Criteo rows span two files");
    let err = refusal(&d.join("serve-wdl"), &amazon_pq, &d.join("o.csv"));
    assert!(err.contains("no column"), "{err}");
}

/// The `.parquet` files in `dir`.
fn parquet_files(dir: &Path) -> usize {
    let paths = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path());
    paths.filter(|p| p.extension().is_some_and(|x| x == "parquet")).count()
}

/// The scorer's XXH3-64 (written from the specification) equals the one tiderec hashes
/// tokens with, for every input length from 0 to 300 bytes (every branch of XXH3,
/// the long-input loop with a seeded secret included) and seeds 0, 1 and a large one.
#[test]
fn the_reference_xxh3_equals_the_token_hash_for_every_length_branch() {
    if !scorer_python_ready() {
        return;
    }
    let seeds = [0u64, 1, 0x9e37_79b9_7f4a_7c15];
    let inputs: Vec<Vec<u8>> = (0..=300usize).map(|n| (0..n).map(|i| (i * 131 + n * 7 + 3) as u8).collect()).collect();
    let mut want = String::new();
    for seed in seeds {
        for input in &inputs {
            want.push_str(&format!("{}\n", tiderec_operators::features::fused::token_hash(seed, input)));
        }
    }
    let script = format!(
        "import sys; sys.path.insert(0, {dir:?}); import reference_scorer as r\n\
         inputs = [bytes((i * 131 + n * 7 + 3) % 256 for i in range(n)) for n in range(301)]\n\
         for seed in {seeds:?}:\n    for x in inputs:\n        print(r.xxh3_64(x, seed))\n",
        dir = scorer().parent().unwrap().display().to_string(),
    );
    let o = Command::new("python3").args(["-c", &script]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = String::from_utf8(o.stdout).unwrap();
    for (k, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        assert_eq!(g, w, "seed {:#x}, {} bytes", seeds[k / inputs.len()], k % inputs.len());
    }
    assert_eq!(got.lines().count(), want.lines().count());
}

/// `export --compact` writes only the rows training changed, and the reference scorer
/// rebuilds the whole tables from them and the seed bit for bit (every tensor equal to
/// the whole export's, rows no record reached included): DLRM on the fixed store, and
/// Wide & Deep with crosses (first-order weights and factors split from one row) on the
/// dynamic store, whose absent rows are seeded (admitted at the first sighting) or zeros
/// (admitted at the second).
#[test]
fn a_compact_export_rebuilds_the_whole_tables_bit_for_bit() {
    let Some(sample) = shared_data("criteo/sample.train") else { return };
    if !scorer_python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = format!("criteo:{}", sample.display());
    let text = std::fs::read_to_string(&sample).unwrap();
    let head = d.join("head.tsv");
    std::fs::write(&head, text.lines().take(1000).collect::<Vec<_>>().join("\n")).unwrap();
    let quick = ["--steps", "20", "--batch-size", "128", "--buckets", "100000"];
    let wdl = ["--model", "wdl", "--crosses", "0:1", "--store", "dynamic"];
    let runs = [
        ("dlrm", vec!["--model", "dlrm"], "init"),
        ("wdl", wdl.to_vec(), "init"),
        ("wdl-admitted", [&wdl[..], &["--admit-count", "2"]].concat(), "zero"),
    ];
    for (kind, flags, others) in runs {
        let (ckpt, whole) = train_and_export(d, kind, &data, &[&quick[..], &flags].concat());
        let compact = d.join(format!("compact-{kind}"));
        let out = run_ok(tiderec().args(["export", "--compact", "--checkpoint"]).arg(&ckpt).arg("--out").arg(&compact));
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("listed embedding rows of"), "{said}");
        let size = |p: &Path| std::fs::metadata(p.join("model.safetensors")).unwrap().len();
        let (w, c) = (size(&whole), size(&compact));
        assert!(c * 10 < w, "{kind}: the compact export ({c} bytes) is not a tenth of the whole one ({w})");
        let tables = &model_json(&compact)["compact_tables"];
        assert!(tables["tensors"].as_object().is_some_and(|t| !t.is_empty()));
        assert_eq!(tables["others"], others, "{kind}");
        let script = "import sys; sys.path.insert(0, sys.argv[1]); import numpy as np, reference_scorer as r\n\
                      a, b = r.load(sys.argv[2])[1], r.load(sys.argv[3])[1]\n\
                      assert sorted(a) == sorted(b), (sorted(a), sorted(b))\n\
                      bad = [k for k in a if a[k].dtype != b[k].dtype or not np.array_equal(a[k], b[k])]\n\
                      assert not bad, bad\n\
                      print(len(a), sum(v.size for v in a.values()))";
        let o = Command::new("python3")
            .args(["-c", script])
            .arg(scorer().parent().unwrap())
            .arg(&whole)
            .arg(&compact)
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{kind}: the rebuilt tables differ: {stderr}");
        eprintln!("{kind}: {w} vs {c} bytes; tensors and values equal: {stdout}");
        let a = python_scores(&whole, &[head.as_path()], false, &d.join(format!("{kind}-whole.csv")));
        let b = python_scores(&compact, &[head.as_path()], false, &d.join(format!("{kind}-compact.csv")));
        let same = |x: &Row, y: &Row| x.score == y.score && x.torch == y.torch;
        assert!(a.iter().zip(&b).all(|(x, y)| same(x, y)) && a.len() == b.len(), "{kind}: the same scores");
    }
}

/// A labeled line that lost its label (39 fields, `I1` of 0 or 1, `C1` of decimal digits
/// only) would read shifted, `I1` as the label and `C1` as `I13`: `tiderec predict` and the
/// reference both refuse it at the same place and score every other record alike, the first
/// one behind a UTF-8 byte order mark included.
#[test]
fn a_line_without_its_label_is_skipped_and_a_byte_order_mark_passed_over_by_both_scorers() {
    let Some(train) = shared_data("criteo/sample.train") else { return };
    if !scorer_python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&train).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut fields: Vec<String> = lines[8002].split('\t').skip(1).map(String::from).collect();
    (fields[0], fields[13]) = ("1".into(), "12345678".into());
    assert_eq!(fields.len(), 39);
    let (train_file, score_file) = sample_split(dir.path(), &lines, 8000, 8000..8100, fields.join("\t"));
    let with_bom = [&b"\xEF\xBB\xBF"[..], &std::fs::read(&score_file).unwrap()].concat();
    std::fs::write(&score_file, with_bom).unwrap();
    let (ckpt, serve) = train_small(dir.path(), "lr", &format!("criteo:{}", train_file.display()), &[]);
    let want = predict_scores(&ckpt, &score_file, false, &dir.path().join("predict.csv"));
    let rows = python_scores(&serve, &[&score_file], false, &dir.path().join("reference.csv"));
    let expected: Vec<usize> = (1..=101).filter(|&p| p != 3).collect();
    assert_same_scores("lr, a line without its label, a BOM", &score_file, &rows, &want, &expected);
}
