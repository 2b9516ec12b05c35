//! Every file of `examples/configs/` trains as it is, from the repository
//! root, and reaches the AUC its `# expect: auc >= X` line states.

mod common;

use common::{metrics, run_ok, shared_data, tiderec};
use std::path::Path;

#[test]
fn every_example_config_runs_and_reaches_its_stated_auc() {
    if shared_data("criteo/sample.train").is_none() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut configs: Vec<_> = std::fs::read_dir(root.join("examples/configs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    configs.sort();
    assert!(configs.len() >= 15, "{configs:?}");
    let mut failures = Vec::new();
    for config in &configs {
        let name = config.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(config).unwrap();
        let floor: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("# expect: auc >= "))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no `# expect: auc >= X` line"));
        let m = dir.path().join(format!("{name}.json"));
        run_ok(
            tiderec()
                .current_dir(root)
                .args(["train", "--progress", "none", "--config"])
                .arg(config)
                .arg("--metrics-json")
                .arg(&m)
                .arg("--dead-letters")
                .arg(dir.path().join(format!("{name}-dead.tsv"))),
        );
        let auc = metrics(&m)["auc"].as_f64().unwrap();
        eprintln!("{name}: AUC {auc:.4} (expected at least {floor})");
        if auc < floor {
            failures.push(format!("{name}: AUC {auc:.4} below {floor}"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
