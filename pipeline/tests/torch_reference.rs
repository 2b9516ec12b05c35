//! `scripts/torch_reference.py` and `scripts/bench_vs_torch.py` without
//! PyTorch: the reference's parameter counts against those of the models
//! `tiderec bench` trains, and the driver's report of a side that fails.

mod common;

use common::{run_ok, skip, tiderec};
use std::path::PathBuf;
use std::process::Command;

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts").join(name)
}

/// `python3`, or `None` (with a note; a failure under CI) when it is missing.
fn python3() -> Option<Command> {
    match Command::new("python3").arg("--version").output() {
        Ok(o) if o.status.success() => Some(Command::new("python3")),
        _ => {
            skip::cannot_run("python3 not found");
            None
        }
    }
}

fn json(bytes: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(bytes);
    let line = text.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON in {text}"));
    serde_json::from_str(line).unwrap()
}

/// The reference's shape (read with `import torch` made to fail, so it needs no
/// PyTorch) has the dense and embedding parameter counts of the model `tiderec
/// bench` builds; the reference itself refuses to run when its PyTorch model's
/// counts differ from these.
#[test]
fn the_torch_reference_has_the_parameter_counts_of_the_benched_models() {
    let Some(_) = python3() else { return };
    let path = script("torch_reference.py");
    for model in ["dlrm", "deepfm", "dien"] {
        let mut bench = tiderec();
        match model {
            "dlrm" => bench.args(["bench", "dlrm"]),
            m => bench.args(["bench", "model", "--model", m]),
        };
        bench.args(["--batch-size", "8", "--steps", "1", "--warmup", "0", "--rows", "1000", "--json"]);
        let tide = json(&run_ok(&mut bench).stdout);
        let blocked = format!(
            "import runpy, sys; sys.modules['torch'] = None; \
             sys.argv = ['torch_reference.py', '--model', '{model}', '--rows', '1000', '--print-config']; \
             runpy.run_path({:?}, run_name='__main__')",
            path.display().to_string()
        );
        let out = python3().unwrap().args(["-c", &blocked]).output().unwrap();
        assert!(out.status.success(), "{model}: {}", String::from_utf8_lossy(&out.stderr));
        let torch = json(&out.stdout);
        for key in ["dense_params", "embedding_params"] {
            assert!(tide[key].as_u64().unwrap() > 0, "{model}: {key} missing from tiderec's JSON: {tide}");
            assert_eq!(tide[key], torch[key], "{model} {key}: tiderec {tide} vs reference {torch}");
        }
    }
}

/// The driver runs tiderec, shows a PyTorch side that fails in its table
/// (here an interpreter that exits 1), and exits with status 1.
#[test]
fn bench_vs_torch_reports_a_failing_side_in_its_table() {
    let Some(mut py) = python3() else { return };
    let out = py
        .arg(script("bench_vs_torch.py"))
        .args(["--tiderec", env!("CARGO_BIN_EXE_tiderec"), "--python", "false"])
        .args(["--rounds", "1", "--batch-size", "8", "--steps", "2", "--warmup", "0", "--rows", "1000"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "stdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr));
    let row = stdout.lines().find(|l| l.starts_with("| 1 |")).unwrap_or_else(|| panic!("no round row: {stdout}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    let tiderec_rate: f64 = cells[2].replace(',', "").parse().unwrap_or_else(|_| panic!("tiderec figure: {row}"));
    assert!(tiderec_rate > 0.0, "{row}");
    assert!(cells[3].starts_with("failed: exit 1"), "{row}");
    assert!(stdout.contains("Failed: torch"), "{stdout}");
}
