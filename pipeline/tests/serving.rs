//! `tiderec export` and `tiderec eval` on a checkpoint written by `train`.

mod common;

use common::{metrics, refused, run_err, run_ok, shared_data, tiderec};

#[test]
fn eval_reproduces_the_training_runs_evaluation_and_export_writes_the_model() {
    let Some(train) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    // Hold out the last 2,000 lines as a separate file.
    let text = std::fs::read_to_string(&train).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let (head, tail) = lines.split_at(lines.len() - 2000);
    let (train_file, eval_file) = (dir.path().join("train.tsv"), dir.path().join("eval.tsv"));
    std::fs::write(&train_file, head.join("\n")).unwrap();
    std::fs::write(&eval_file, tail.join("\n")).unwrap();
    let ckpt = dir.path().join("ckpt");
    let m = dir.path().join("m.json");
    run_ok(
        tiderec()
            .args([
                "train",
                "--buckets",
                "5000",
                "--bottom",
                "64,16",
                "--top",
                "64,1",
                "--progress",
                "none",
                "--workers",
                "2",
            ])
            .arg("--data")
            .arg(format!("criteo:{}", train_file.display()))
            .arg("--eval")
            .arg(format!("criteo:{}", eval_file.display()))
            .arg("--checkpoint-dir")
            .arg(&ckpt)
            .arg("--metrics-json")
            .arg(&m),
    );
    let trained = metrics(&m);
    let out = run_ok(
        tiderec()
            .args(["eval", "--json", "--checkpoint"])
            .arg(&ckpt)
            .arg("--data")
            .arg(format!("criteo:{}", eval_file.display())),
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["samples"], 2000);
    assert_eq!(trained["eval_samples"], 2000);
    let (a, b) = (r["auc"].as_f64().unwrap(), trained["auc"].as_f64().unwrap());
    assert!((a - b).abs() < 1e-6, "eval AUC {a} vs training's {b}");
    let (a, b) = (r["logloss"].as_f64().unwrap(), trained["logloss"].as_f64().unwrap());
    assert!((a - b).abs() < 1e-5, "eval logloss {a} vs training's {b}");
    // The text report carries the accuracy too.
    let text = run_ok(
        tiderec()
            .args(["eval", "--checkpoint"])
            .arg(&ckpt)
            .arg("--data")
            .arg(format!("criteo:{}", eval_file.display())),
    );
    let accuracy = format!("accuracy {:.4}", r["accuracy"].as_f64().unwrap());
    assert!(String::from_utf8_lossy(&text.stdout).contains(&accuracy), "{}", String::from_utf8_lossy(&text.stdout));

    let serve = dir.path().join("serve");
    run_ok(tiderec().args(["export", "--checkpoint"]).arg(&ckpt).arg("--out").arg(&serve));
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(serve.join("model.json")).unwrap()).unwrap();
    assert_eq!((config["kind"].as_str(), config["model"]["kind"].as_str()), (Some("dlrm"), Some("dlrm")));
    assert_eq!(config["features"]["categorical"].as_array().unwrap().len(), 26);
    let bytes = std::fs::read(serve.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header["embeddings.C26"]["shape"], serde_json::json!([5000, 16]));
    assert_eq!(header["bottom.0.weight"]["shape"], serde_json::json!([64, 13]));
    assert_eq!(header["top.1.weight"]["shape"], serde_json::json!([1, 64]));
    // Every tensor is in model.json with its shape, and the file holds exactly their values.
    let shapes = config["tensors"].as_object().unwrap();
    let mut values = 0;
    for (name, shape) in shapes {
        assert_eq!(&header[name]["shape"], shape, "{name}");
        values += shape.as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).product::<u64>();
    }
    assert_eq!(shapes.len() + 1, header.as_object().unwrap().len(), "the tensors and the metadata");
    let dense = values - 26 * 5000 * 16;
    assert_eq!(dense, (13 * 64 + 64) + (64 * 16 + 16) + (16 + 26 * 27 / 2) * 64 + 64 + 64 + 1);
    assert_eq!(bytes.len() as u64, 8 + n as u64 + 4 * values);

    let err =
        run_err(tiderec().args(["eval", "--checkpoint"]).arg(dir.path().join("nothing")).args(["--data", "criteo:x"]));
    assert!(err.contains("nothing"), "{err}");
}

/// A dynamic store reads an id it does not hold (never seen, not yet admitted, or
/// evicted) as the row it would admit: its seeded initial row when it admits at the
/// first sighting, zeros when it admits later. `eval` of its checkpoint reads those rows
/// alike, so it reproduces the training run's own evaluation, held-out ids included.
#[test]
fn eval_of_a_dynamic_store_reproduces_the_training_runs_evaluation() {
    let Some(train) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (train_file, eval_file) = split_sample(&train, d);
    let admissions: [&[&str]; 3] = [&[], &["--ttl-steps", "3", "--flush-every", "2"], &["--admit-count", "2"]];
    for (k, admission) in admissions.into_iter().enumerate() {
        let (ckpt, m) = (d.join(format!("ckpt-{k}")), d.join(format!("m-{k}.json")));
        run_ok(
            tiderec()
                .args(["train", "--store", "dynamic", "--buckets", "100000", "--bottom", "32,16", "--top", "32,1"])
                .args(["--batch-size", "128", "--progress", "none"])
                .args(admission)
                .arg("--data")
                .arg(format!("criteo:{}", train_file.display()))
                .arg("--eval")
                .arg(format!("criteo:{}", eval_file.display()))
                .arg("--checkpoint-dir")
                .arg(&ckpt)
                .arg("--metrics-json")
                .arg(&m)
                .arg("--dead-letters")
                .arg(d.join(format!("dead-{k}.tsv"))),
        );
        let trained = metrics(&m);
        let out = run_ok(
            tiderec()
                .args(["eval", "--json", "--checkpoint"])
                .arg(&ckpt)
                .arg("--data")
                .arg(format!("criteo:{}", eval_file.display()))
                .arg("--dead-letters")
                .arg(d.join(format!("eval-dead-{k}.tsv"))),
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!((r["samples"].as_u64(), trained["eval_samples"].as_u64()), (Some(1000), Some(1000)));
        let (a, b) = (r["auc"].as_f64().unwrap(), trained["auc"].as_f64().unwrap());
        assert!((a - b).abs() < 1e-6, "{admission:?}: eval AUC {a} vs training's {b}");
        let (a, b) = (r["logloss"].as_f64().unwrap(), trained["logloss"].as_f64().unwrap());
        assert!((a - b).abs() < 1e-5, "{admission:?}: eval logloss {a} vs training's {b}");
    }
}

/// The first 2,000 lines of the Criteo sample `train` as `train.tsv` in `d`, the next 1,000
/// as `eval.tsv`.
fn split_sample(train: &std::path::Path, d: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let text = std::fs::read_to_string(train).unwrap();
    let lines: Vec<&str> = text.lines().take(3000).collect();
    let (head, tail) = lines.split_at(2000);
    let (train_file, eval_file) = (d.join("train.tsv"), d.join("eval.tsv"));
    std::fs::write(&train_file, head.join("\n")).unwrap();
    std::fs::write(&eval_file, tail.join("\n")).unwrap();
    (train_file, eval_file)
}

/// A change to a manifest's JSON.
type Edit = fn(&mut serde_json::Value);

/// Rewrites the manifest of the checkpoint `ckpt` with `edit`.
fn edit_manifest(ckpt: &std::path::Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = ckpt.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut m);
    std::fs::write(&path, m.to_string()).unwrap();
}

#[test]
fn a_hand_edited_manifest_is_refused_by_export_and_eval_alike() {
    let Some(train) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = format!("criteo:{}", train.display());
    let ckpt = dir.path().join("ckpt");
    run_ok(
        tiderec()
            .args(["train", "--buckets", "500", "--bottom", "32,16", "--top", "32,1", "--steps", "20"])
            .args(["--progress", "none", "--data", &data, "--checkpoint-dir"])
            .arg(&ckpt),
    );
    let step = ckpt.join("ckpt-20");
    let edits: [(&str, Edit); 4] = [
        ("table_sizes[3]", |m| m["config"]["table_sizes"][3] = 501.into()),
        // The rows no step changed are re-created from the seed: another seed scores other rows.
        ("seeded with 42", |m| m["seed"] = 7.into()),
        ("pipeline.dense", |m| {
            m["pipeline"]["dense"].as_array_mut().unwrap().pop();
        }),
        ("dense parameters", |m| m["config"]["model"]["top"] = serde_json::json!([16, 1])),
    ];
    for (k, (named, edit)) in edits.into_iter().enumerate() {
        let copy = dir.path().join(format!("edited-{k}"));
        std::fs::create_dir(&copy).unwrap();
        for entry in std::fs::read_dir(&step).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
        }
        edit_manifest(&copy, edit);
        let out = dir.path().join(format!("export-{k}"));
        let err = run_err(tiderec().args(["export", "--checkpoint"]).arg(&copy).arg("--out").arg(&out));
        assert!(err.contains(named) && err.contains(&copy.display().to_string()), "{named}: {err}");
        assert!(!out.exists(), "{named}: export wrote {}", out.display());
        let err = run_err(tiderec().args(["eval", "--checkpoint"]).arg(&copy).args(["--data", &data]));
        assert!(err.contains(named), "{named}: {err}");
    }
}

/// A dynamic store holds only the rows it sees, so its tables may have far more rows than
/// memory holds: `eval` and `predict` score with the rows the checkpoint lists (the same
/// probabilities), `export --compact` writes them with the tables' whole shapes, and a
/// whole `export` is refused naming the table and the memory it would need, an exit status
/// and not a signal, before anything is written.
#[test]
fn a_dynamic_store_of_huge_tables_scores_without_holding_them_whole() {
    let Some(train) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (train_file, eval_file) = split_sample(&train, d);
    let ckpt = d.join("ckpt");
    run_ok(
        tiderec()
            .args(["train", "--store", "dynamic", "--buckets", "4000000000", "--max-rows", "100000"])
            .args(["--steps", "20", "--batch-size", "64", "--progress", "none"])
            .arg("--data")
            .arg(format!("criteo:{}", train_file.display()))
            .arg("--checkpoint-dir")
            .arg(&ckpt)
            .arg("--dead-letters")
            .arg(d.join("train-dead.tsv")),
    );
    let data = format!("criteo:{}", eval_file.display());
    let out = run_ok(
        tiderec()
            .args(["eval", "--json", "--data", &data, "--checkpoint"])
            .arg(&ckpt)
            .arg("--dead-letters")
            .arg(d.join("eval-dead.tsv")),
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["samples"], 1000);
    let scores = d.join("scores.csv");
    run_ok(tiderec().args(["predict", "--data", &data, "--checkpoint"]).arg(&ckpt).arg("--out").arg(&scores));
    let (probs, labels): (Vec<f32>, Vec<f32>) = std::fs::read_to_string(&scores)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[2].parse::<f32>().unwrap(), f[3].parse::<f32>().unwrap())
        })
        .unzip();
    assert_eq!(probs.len(), 1000);
    let auc = tiderec_operators::metrics::auc(&probs, &labels).unwrap();
    assert!(auc > 0.55 && r["auc"].as_f64() == Some(auc), "predict's AUC {auc}, eval's {}", r["auc"]);

    let whole = d.join("whole");
    let err = refused(tiderec().args(["export", "--checkpoint"]).arg(&ckpt).arg("--out").arg(&whole));
    assert!(err.contains("table 0 has 4000000000 rows of 16 values") && err.contains("--compact"), "{err}");
    assert!(err.contains("256000000000 bytes"), "{err}");
    assert!(!whole.exists(), "export wrote {}", whole.display());
    let compact = d.join("compact");
    run_ok(tiderec().args(["export", "--compact", "--checkpoint"]).arg(&ckpt).arg("--out").arg(&compact));
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(compact.join("model.json")).unwrap()).unwrap();
    assert_eq!(config["tensors"]["embeddings.C1"], serde_json::json!([4000000000u64, 16]));
    // The store admits ids at their first sighting, so the rows it does not hold read as their seeded values.
    assert_eq!(config["compact_tables"]["others"], "init");
}
