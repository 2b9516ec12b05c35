//! The command-line contract of `scripts/reference_scorer.py` and `scripts/torch_model.py`
//! (their scores are compared with `tiderec predict` in `reference_scorer.rs`): `--out`
//! never destroys an input and replaces an existing file only with `--overwrite`, and is
//! written whole or not at all; an input that is mostly malformed (Kaggle's unlabeled
//! test records read as labeled ones) fails as `tiderec predict` fails on it, writing
//! nothing; and `torch_model.py` loads models whose fields are named like attributes of
//! `nn.Module` (`type`, `to`, `training`, `forward`) with `state_dict()` keys equal to the
//! tensor names of `model.safetensors`.

mod common;

use common::{run_ok, scorer_python_ready, script, shared_data, tiderec};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SCRIPTS: [&str; 2] = ["reference_scorer.py", "torch_model.py"];

/// Runs the script `name` on the export `model`, writing `out`, with `args` (flags, then files).
fn score(name: &str, model: &Path, out: &Path, args: &[&OsStr]) -> Output {
    let mut cmd = Command::new("python3");
    cmd.arg(script(name)).arg("--model").arg(model).arg("--out").arg(out);
    for a in args {
        cmd.arg(a);
    }
    cmd.output().unwrap()
}

/// The stderr of a run that must have refused: exit status 2, a message, no traceback.
fn refused(name: &str, o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{name} must refuse: {err}");
    assert!(!err.contains("Traceback"), "{name}: a refusal, not a crash: {err}");
    err
}

/// The stderr of a run that must have succeeded.
fn succeeded(name: &str, o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{name} failed: {err}");
    err
}

/// The names in `dir` that are temporary files of a script (`NAME.tmp-PID`).
fn temporaries(dir: &Path) -> Vec<String> {
    let names = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned());
    names.filter(|n| n.contains(".tmp-")).collect()
}

/// An LR export of a few steps on the first 300 Criteo sample records, in `dir/serve`,
/// and those records in `dir/records.tsv`.
fn criteo_export(dir: &Path, train: &Path) -> (PathBuf, PathBuf) {
    let text = std::fs::read_to_string(train).unwrap();
    let records = dir.join("records.tsv");
    std::fs::write(&records, text.lines().take(300).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    let ckpt = dir.join("ckpt");
    run_ok(
        tiderec()
            .args(["train", "--progress", "none", "--model", "lr", "--buckets", "1000", "--steps", "5"])
            .arg("--data")
            .arg(format!("criteo:{}", records.display()))
            .arg("--checkpoint-dir")
            .arg(&ckpt),
    );
    let serve = dir.join("serve");
    run_ok(tiderec().args(["export", "--checkpoint"]).arg(&ckpt).arg("--out").arg(&serve));
    (serve, records)
}

/// `--out` naming an input (the record file itself, a symbolic link to it, a file of the
/// model) is refused with exit status 2 by both scripts, `--overwrite` or not, and the
/// input is left byte for byte as it was.
#[test]
fn an_out_that_is_an_input_is_refused_and_the_input_kept() {
    let Some(train) = shared_data("criteo/sample.train") else { return };
    if !scorer_python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (serve, records) = criteo_export(dir.path(), &train);
    let before = std::fs::read(&records).unwrap();
    let model_json = serve.join("model.json");
    let model_before = std::fs::read(&model_json).unwrap();
    let link = dir.path().join("link.tsv");
    std::os::unix::fs::symlink(&records, &link).unwrap();
    for name in SCRIPTS {
        for overwrite in [false, true] {
            let mut args: Vec<&OsStr> = if overwrite { vec!["--overwrite".as_ref()] } else { vec![] };
            args.push(records.as_os_str());
            for out in [&records, &link] {
                let err = refused(name, &score(name, &serve, out, &args));
                assert!(err.contains("is the same file as the input") && err.contains("records.tsv"), "{err}");
                assert_eq!(std::fs::read(&records).unwrap(), before, "{name}: the input is unchanged");
            }
            let err = refused(name, &score(name, &serve, &model_json, &args));
            assert!(err.contains("is the same file as the input") && err.contains("(from --model)"), "{err}");
            assert_eq!(std::fs::read(&model_json).unwrap(), model_before, "{name}: model.json is unchanged");
        }
    }
    assert!(temporaries(dir.path()).is_empty(), "{:?}", temporaries(dir.path()));
}

/// An existing `--out` is refused without `--overwrite` (naming the flag to pass) and left
/// as it was; with `--overwrite` it is replaced by the whole CSV, no temporary file left
/// beside it. A file that appears at `--out` while the records are scored is not replaced
/// either (`commit_new`, the last step of a run without `--overwrite`).
#[test]
fn an_existing_out_is_replaced_only_with_overwrite() {
    let Some(train) = shared_data("criteo/sample.train") else { return };
    if !scorer_python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (serve, records) = criteo_export(dir.path(), &train);
    for name in SCRIPTS {
        let out = dir.path().join(format!("{name}.csv"));
        std::fs::write(&out, "the user's file\n").unwrap();
        let err = refused(name, &score(name, &serve, &out, &[records.as_ref()]));
        assert!(err.contains("already exists: pass --overwrite to replace it"), "{err}");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "the user's file\n", "{name}: --out is unchanged");

        succeeded(name, &score(name, &serve, &out, &["--overwrite".as_ref(), records.as_ref()]));
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(text.starts_with("file,position,score,label\n"), "{text}");
        assert_eq!(text.lines().count(), 301, "{name}: a header and 300 scores");

        // A fresh name is written without --overwrite.
        let fresh = dir.path().join(format!("{name}-fresh.csv"));
        succeeded(name, &score(name, &serve, &fresh, &[records.as_ref()]));
        assert_eq!(std::fs::read_to_string(&fresh).unwrap(), text);
        assert!(temporaries(dir.path()).is_empty(), "{:?}", temporaries(dir.path()));
    }

    let (tmp, out) = (dir.path().join("late.csv.tmp-1"), dir.path().join("late.csv"));
    std::fs::write(&tmp, "scores\n").unwrap();
    std::fs::write(&out, "made meanwhile\n").unwrap();
    let check = "import sys; sys.path.insert(0, sys.argv[1]); import reference_scorer as r\n\
                 try:\n    r.commit_new(sys.argv[2], sys.argv[3])\n\
                 except r.ScorerError as e:\n    print(e)\nelse:\n    sys.exit('replaced')";
    let o = Command::new("python3")
        .args(["-c", check])
        .arg(script("reference_scorer.py").parent().unwrap())
        .arg(&tmp)
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("already exists"));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "made meanwhile\n");
}

/// Kaggle's unlabeled test records read as labeled ones (no `--unlabeled`): nearly all are
/// malformed, so both scripts fail as `tiderec predict` does (the counts by kind,
/// `--max-bad-fraction`, the hint at unlabeled files) and write nothing; with
/// `--unlabeled` every record is scored. A run that stops on an error after scoring a
/// file (the next one is missing) writes nothing either, and an empty input is no success.
#[test]
fn a_mostly_malformed_input_fails_and_leaves_no_output() {
    let Some(train) = shared_data("criteo/sample.train") else { return };
    let Some(test) = shared_data("criteo/sample.test") else { return };
    if !scorer_python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (serve, records) = criteo_export(dir.path(), &train);
    let text = std::fs::read_to_string(&test).unwrap();
    let unlabeled = dir.path().join("test.tsv");
    std::fs::write(&unlabeled, text.lines().take(1000).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    let empty = dir.path().join("empty.tsv");
    std::fs::write(&empty, "").unwrap();
    for name in SCRIPTS {
        let out = dir.path().join(format!("{name}.csv"));
        let err = refused(name, &score(name, &serve, &out, &[unlabeled.as_ref()]));
        for part in ["of 1000 records", "are malformed (", "bad_label", "--max-bad-fraction 0.01", "unlabeled"] {
            assert!(err.contains(part), "{name}: `{part}` in: {err}");
        }
        assert!(!out.exists(), "{name}: nothing written");

        let missing = dir.path().join("missing.tsv");
        let err = refused(name, &score(name, &serve, &out, &[records.as_ref(), missing.as_ref()]));
        assert!(err.contains("missing.tsv"), "{err}");
        assert!(!out.exists(), "{name}: nothing written after an error");

        let err = refused(name, &score(name, &serve, &out, &[empty.as_ref()]));
        assert!(err.contains("no records were read"), "{err}");
        assert!(!out.exists(), "{name}: nothing written for an empty input");
        assert!(temporaries(dir.path()).is_empty(), "{:?}", temporaries(dir.path()));

        succeeded(name, &score(name, &serve, &out, &["--unlabeled".as_ref(), unlabeled.as_ref()]));
        let scores = std::fs::read_to_string(&out).unwrap();
        assert!(scores.starts_with("file,position,score\n"), "{scores}");
        assert_eq!(scores.lines().count(), 1001, "{name}: every unlabeled record is scored");
    }
}

/// A feature spec over the Taobao display-ad CSV naming its columns like attributes of
/// `nn.Module` (`type`, `to`, `training`, `forward`); `to` is also DIEN's target and the
/// table of its click-sequence history.
const ATTRIBUTE_SPEC: &str = r#"
delimiter = ","
header = true
columns = ["clk", "time_stamp", "type", "to", "training", "cate_id", "campaign_id", "customer", "forward",
           "price", "cms_segid", "cms_group_id", "final_gender_code", "age_level", "pvalue_level",
           "shopping_level", "occupation", "new_user_class_level", "click_sequence"]
label = { column = "clk" }
dense = [{ column = "price", log1p = true }]
categorical = [
  { column = "type", buckets = 500 },
  { column = "to", buckets = 3000 },
  { column = "training", buckets = 50 },
  { column = "forward", buckets = 500 },
  { column = "cate_id", buckets = 500 },
]
list = [
  { column = "click_sequence", delimiter = "^", max_len = 4, buckets = 3000, pooling = "none", target = "to" },
]
"#;

/// Wide & Deep and DIEN on [`ATTRIBUTE_SPEC`]: `torch_model.load` builds the module, whose
/// `state_dict()` keys are exactly the tensor names of `model.safetensors` (in it, every
/// value equal), which a second module loads strictly, while the module's own `type`,
/// `to`, `training` and `forward` are still `nn.Module`'s; `torch_model.py` scores the
/// held-out records within 1e-6 of `tiderec predict`.
#[test]
fn torch_model_loads_fields_named_like_module_attributes() {
    let Some(train) = shared_data("taobao_ad/train_sample.csv") else { return };
    let Some(test) = shared_data("taobao_ad/test_sample.csv") else { return };
    if !scorer_python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let spec = d.join("spec.toml");
    std::fs::write(&spec, ATTRIBUTE_SPEC).unwrap();
    let check = "import sys; sys.path.insert(0, sys.argv[1])\n\
                 import numpy as np, torch, torch_model\n\
                 from safetensors.numpy import load_file\n\
                 tensors = load_file(sys.argv[2] + '/model.safetensors')\n\
                 model = torch_model.load(sys.argv[2])\n\
                 state = model.state_dict()\n\
                 assert sorted(state) == sorted(tensors), (sorted(state), sorted(tensors))\n\
                 bad = [k for k in tensors if not np.array_equal(state[k].numpy(), tensors[k])]\n\
                 assert not bad, bad\n\
                 other = torch_model.load(sys.argv[2])\n\
                 with torch.no_grad():\n    [p.zero_() for p in other.parameters()]\n\
                 other.load_state_dict(state, strict=True)\n\
                 assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), state.values()))\n\
                 for name in ('type', 'to', 'training', 'forward'):\n\
                 \x20   assert 'embeddings.' + name in state, name\n\
                 assert model.training is False and callable(model.type) and callable(model.embeddings.to)\n\
                 assert model.to(torch.float64).embeddings.type_.dtype == torch.float64\n\
                 print(len(state))";
    for (kind, flags) in [("wdl", ["--deep", "16"]), ("dien", ["--mlp", "16"])] {
        let ckpt = d.join(format!("ckpt-{kind}"));
        run_ok(
            tiderec()
                .args(["train", "--progress", "none", "--model", kind, "--spec"])
                .arg(&spec)
                .args(["--dim", "4", "--buckets", "1000", "--epochs", "2", "--batch-size", "16"])
                .args(flags)
                .arg("--data")
                .arg(format!("csv:{}", train.display()))
                .arg("--checkpoint-dir")
                .arg(&ckpt),
        );
        let serve = d.join(format!("serve-{kind}"));
        run_ok(tiderec().args(["export", "--checkpoint"]).arg(&ckpt).arg("--out").arg(&serve));
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(serve.join("model.json")).unwrap()).unwrap();
        assert_eq!(config["sparse_fields"][0], "type", "{kind}");
        assert!(config["tensors"].get("embeddings.training").is_some(), "{kind}: {}", config["tensors"]);

        let o = Command::new("python3")
            .args(["-c", check])
            .arg(script("torch_model.py").parent().unwrap())
            .arg(&serve)
            .output()
            .unwrap();
        let err = succeeded(&format!("{kind}: torch_model.load"), &o);
        eprintln!("{kind}: {} tensors loaded by name {err}", String::from_utf8_lossy(&o.stdout).trim());

        let want = d.join(format!("{kind}-predict.csv"));
        run_ok(
            tiderec()
                .args(["predict", "--checkpoint"])
                .arg(&ckpt)
                .arg("--data")
                .arg(format!("csv:{}", test.display()))
                .arg("--out")
                .arg(&want),
        );
        let got = d.join(format!("{kind}-torch.csv"));
        succeeded("torch_model.py", &score("torch_model.py", &serve, &got, &[test.as_ref()]));
        let scores = |p: &Path| -> Vec<(String, f64)> {
            let text = std::fs::read_to_string(p).unwrap();
            text.lines()
                .skip(1)
                .map(|l| {
                    let c: Vec<&str> = l.split(',').collect();
                    (c[1].to_string(), c[2].parse().unwrap())
                })
                .collect()
        };
        let (got, want) = (scores(&got), scores(&want));
        assert_eq!(got.len(), want.len(), "{kind}: one score per record");
        assert!(got.len() >= 90, "{kind}: {} records scored", got.len());
        for ((gp, g), (wp, w)) in got.iter().zip(&want) {
            assert_eq!(gp, wp, "{kind}: positions");
            assert!((g - w).abs() <= 1e-6, "{kind}: line {gp}: {g} vs predict's {w}");
        }
    }
}
