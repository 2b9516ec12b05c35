//! A resume continues the data it was trained on, or says why it cannot: through
//! the release binary, on Criteo samples copied into a temporary directory.

mod common;

use common::{checkpoint_entries, metrics, run_err, run_ok, shared_data, tiderec};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Writes lines `from..to` of the Criteo sample to `dir/name`.
fn lines_of_sample(dir: &Path, name: &str, from: usize, to: usize) -> Option<PathBuf> {
    let sample = shared_data("criteo/sample.train")?;
    let text = std::fs::read_to_string(sample).unwrap();
    let path = dir.join(name);
    let lines: Vec<&str> = text.lines().skip(from).take(to - from).collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    Some(path)
}

/// A small DLRM run on `data` with checkpoints in `ckpt`, metrics in `metrics`.
fn train(data: &Path, ckpt: &Path, metrics: &Path, extra: &[&str]) -> Command {
    let mut c = tiderec();
    c.args(["train", "--progress", "none", "--batch-size", "128", "--buckets", "5000", "--seed", "3"])
        .args(["--bottom", "32,16", "--top", "32,1", "--eval-fraction", "0"])
        .arg("--data")
        .arg(format!("criteo:{}", data.display()))
        .arg("--checkpoint-dir")
        .arg(ckpt)
        .arg("--metrics-json")
        .arg(metrics)
        .arg("--dead-letters")
        .arg(metrics.with_extension("dead.tsv"))
        .args(extra);
    c
}

#[test]
fn a_resume_on_other_data_is_refused_unless_new_data_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let (Some(a), Some(b)) =
        (lines_of_sample(dir.path(), "a.tsv", 0, 2048), lines_of_sample(dir.path(), "b.tsv", 4096, 5120))
    else {
        return;
    };
    let ckpt = dir.path().join("ckpt");
    let m = |name: &str| dir.path().join(format!("{name}.json"));
    // One epoch of a, stopped after 10 of its 16 steps.
    run_ok(&mut train(&a, &ckpt, &m("first"), &["--steps", "10", "--checkpoint-every", "5"]));
    let (steps, _) = checkpoint_entries(&ckpt);
    assert_eq!(steps.last(), Some(&10));

    // Other data: refused, naming both files, and nothing written.
    let err = run_err(&mut train(&b, &ckpt, &m("refused"), &["--resume"]));
    for part in ["trained on other data", "a.tsv", "b.tsv", "epoch 0, 10 steps into it", "--new-data"] {
        assert!(err.contains(part), "missing `{part}` in: {err}");
    }
    assert_eq!(checkpoint_entries(&ckpt).0, steps, "a refused resume writes no checkpoint");

    // The same bytes under another name and place resume where the run stopped.
    let moved = dir.path().join("moved");
    std::fs::create_dir(&moved).unwrap();
    std::fs::copy(&a, moved.join("copy.tsv")).unwrap();
    run_ok(&mut train(&moved.join("copy.tsv"), &ckpt, &m("moved"), &["--resume"]));
    let resumed = metrics(&m("moved"));
    assert_eq!(resumed["resumed_from_step"], 10, "{resumed}");
    assert_eq!(resumed["samples"], 2048, "the rest of the epoch, once: {resumed}");
    let epoch_steps = resumed["steps"].as_u64().unwrap();

    // --new-data keeps the model (the step count goes on) and reads b from its start.
    let out = run_ok(&mut train(&b, &ckpt, &m("new"), &["--resume", "--new-data"]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--new-data: keeping the model"));
    let new = metrics(&m("new"));
    assert_eq!(new["resumed_from_step"], epoch_steps, "{new}");
    assert!(new["steps"].as_u64().unwrap() >= epoch_steps + 8, "{new}");
    assert_eq!(new["samples"], 2048 + 1024, "all of b, once: {new}");

    // A changed file (one byte, same size) is other data too.
    let mut bytes = std::fs::read(&b).unwrap();
    let at = bytes.len() / 2;
    bytes[at] = if bytes[at] == b'1' { b'2' } else { b'1' };
    std::fs::write(&b, &bytes).unwrap();
    let err = run_err(&mut train(&b, &ckpt, &m("changed"), &["--resume", "--epochs", "2"]));
    assert!(err.contains("the same size, other contents"), "{err}");

    let err = run_err(&mut train(&b, &ckpt, &m("flag"), &["--new-data"]));
    assert!(err.contains("`new_data`") && err.contains("applies to --resume"), "{err}");
}

/// A feature spec over the Taobao display-ad CSV with a vocabulary file (relative to the spec).
const VOCAB_SPEC: &str = r#"
delimiter = ","
header = true
columns = ["clk", "time_stamp", "userid", "adgroup_id", "pid", "cate_id", "campaign_id", "customer", "brand",
           "price", "cms_segid", "cms_group_id", "final_gender_code", "age_level", "pvalue_level",
           "shopping_level", "occupation", "new_user_class_level", "click_sequence"]
label = { column = "clk" }
dense = [{ column = "price", log1p = true }]
categorical = [
  { column = "userid", buckets = 500 },
  { column = "cate_id", buckets = 500 },
  { column = "age_level", buckets = 8, encoding = "vocabulary", vocabulary = "ages.txt", oov_buckets = 1 },
]
"#;

#[test]
fn a_checkpoint_keeps_its_vocabularies_whatever_happens_to_the_files() {
    let (Some(train), Some(test)) =
        (shared_data("taobao_ad/train_sample.csv"), shared_data("taobao_ad/test_sample.csv"))
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let specs = dir.path().join("specs");
    std::fs::create_dir(&specs).unwrap();
    std::fs::write(specs.join("spec.toml"), VOCAB_SPEC).unwrap();
    let vocabulary = specs.join("ages.txt");
    std::fs::write(&vocabulary, "1\n2\n3\n4\n5\n6\n").unwrap();
    let ckpt = dir.path().join("ckpt");
    let train_cmd = |extra: &[&str]| {
        let mut c = tiderec();
        c.args(["train", "--progress", "none", "--model", "lr", "--batch-size", "16", "--epochs", "3", "--seed", "2"])
            .args(["--eval-fraction", "0", "--steps", "12"])
            .arg("--data")
            .arg(format!("csv:{}", train.display()))
            .arg("--spec")
            .arg(specs.join("spec.toml"))
            .arg("--checkpoint-dir")
            .arg(&ckpt)
            .arg("--dead-letters")
            .arg(dir.path().join("dead.tsv"))
            .args(extra);
        c
    };
    run_ok(&mut train_cmd(&[]));
    let predict = |out: &str, cwd: &Path| {
        let out = dir.path().join(out);
        run_ok(
            tiderec()
                .current_dir(cwd)
                .arg("predict")
                .arg("--checkpoint")
                .arg(&ckpt)
                .arg("--data")
                .arg(format!("csv:{}", test.display()))
                .arg("--out")
                .arg(&out)
                .arg("--dead-letters")
                .arg(dir.path().join("predict-dead.tsv")),
        );
        std::fs::read_to_string(out).unwrap()
    };
    let before = predict("before.csv", dir.path());

    // Two tokens swapped, then the file removed: scores from anywhere stay the model's.
    std::fs::write(&vocabulary, "2\n1\n3\n4\n5\n6\n").unwrap();
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    assert_eq!(predict("swapped.csv", &elsewhere), before, "a swapped vocabulary file changed the scores");
    let manifest = std::fs::read_to_string(ckpt.join("ckpt-12").join("manifest.json")).unwrap();
    let compact: String = manifest.split_whitespace().collect();
    assert!(compact.contains(r#""vocabulary":["1","2","3","4","5","6"]"#), "the tokens are in the manifest");

    // Resuming with the edited file is training with other features: refused, naming it.
    let err = run_err(&mut train_cmd(&["--resume"]));
    assert!(err.contains("spec.fields.categorical[2].vocabulary: checkpoint has [\"1\",\"2\""), "{err}");

    std::fs::remove_file(&vocabulary).unwrap();
    assert_eq!(predict("removed.csv", &elsewhere), before, "scoring needs no vocabulary file");
}
