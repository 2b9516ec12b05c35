//! Every example program runs to completion: each is started as its own
//! process (the binary `cargo test` builds beside the test, in
//! `target/<profile>/examples/`), must exit 0 (the examples assert what they
//! show: the model learned, the run stopped, every line was accounted for) and
//! must print its result line; `own_dataflow`'s DLRM must learn from the Criteo
//! sample (held-out AUC above 0.65).

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::path::PathBuf;
use std::process::Command;

/// The example binary `name`, built by `cargo test` (or `cargo build --examples`) with this test's profile.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/examples_run-… → target/<profile>/examples/<name>
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("a target directory");
    let path = profile_dir.join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "{} is missing: `cargo test` builds the examples with the tests; after `cargo test --test examples_run` \
         alone, build them with `cargo build --release -p tiderec-examples --examples`",
        path.display()
    );
    path
}

/// Runs example `name` with `args` and returns its standard output; panics, with its
/// output, unless it exits 0.
fn run(name: &str, args: &[&str]) -> String {
    let out = Command::new(example(name)).args(args).output().expect("the example starts");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name} failed ({}):\n{stdout}\n{stderr}", out.status);
    stdout.into_owned()
}

#[test]
fn checkpoint_resume_continues_bit_for_bit() {
    let dir = std::env::temp_dir().join(format!("tiderec-example-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = run("checkpoint_resume", &[dir.to_str().unwrap()]);
    assert!(out.contains("wrote") && out.contains("ckpt-30"), "{out}");
    assert!(out.contains("resumed from step 30"), "{out}");
    assert!(dir.join("ckpt-30/manifest.json").is_file(), "the checkpoint is a directory of its own");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn export_score_scores_like_the_trainer() {
    let dir = std::env::temp_dir().join(format!("tiderec-example-export-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = run("export_score", &[dir.to_str().unwrap()]);
    assert!(out.contains("exported step 40") && out.contains("scored 400 held-out samples"), "{out}");
    let model_json = std::fs::read_to_string(dir.join("serve/model.json")).unwrap();
    assert!(model_json.contains("\"kind\": \"dlrm\"") || model_json.contains("\"kind\":\"dlrm\""), "{model_json}");
    assert!(dir.join("serve/model.safetensors").is_file());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn custom_model_learns() {
    let out = run("custom_model", &[]);
    assert!(out.contains("held-out AUC"), "{out}");
}

#[test]
fn online_training_stops_from_its_callback() {
    let out = run("online_training", &[]);
    assert!(out.contains("window AUC reached"), "{out}");
    assert!(out.contains("stopped after"), "{out}");
}

#[test]
fn featurize_stream_accounts_for_every_line() {
    let out = run("featurize_stream", &[]);
    assert!(out.contains("1980 samples featurized") && out.contains("20 dead letters"), "{out}");
}

#[test]
fn own_dataflow_trains_and_evaluates_on_criteo() {
    let data = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/criteo/sample.train"));
    let Some(data) = skip::existing(data) else { return };
    let out = run("own_dataflow", &[data.to_str().expect("a UTF-8 path")]);
    let auc: f64 = out
        .split("AUC ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no AUC in {out}"));
    assert!(auc > 0.65, "the DLRM did not learn from the Criteo sample: AUC {auc}");
}

#[test]
fn featurize_and_train_as_operators_learn_on_criteo() {
    let data = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/criteo/sample.train"));
    let Some(data) = skip::existing(data) else { return };
    let out = run("train_operators", &[data.to_str().unwrap()]);
    assert!(out.contains("trained 78 steps") && out.contains("over the last 10"), "{out}");
}
