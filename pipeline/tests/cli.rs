//! The `tiderec` binary as a user runs it: real processes on 127.0.0.1.

mod common;

use common::{metrics, rel_diff, run_ok, shared_data, tiderec};
use std::net::TcpListener;

/// Two free TCP ports on 127.0.0.1 (released before use; the OS rarely hands them out again at once).
fn free_ports() -> (u16, u16) {
    let a = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    (a.local_addr().unwrap().port(), b.local_addr().unwrap().port())
}

const COMMON: &[&str] = &[
    "train",
    "--steps",
    "50",
    "--samples",
    "12800",
    "--batch-size",
    "256",
    "--eval-fraction",
    "0",
    "--buckets",
    "20000",
    "--seed",
    "11",
    "--progress",
    "none",
];

#[test]
fn two_processes_train_the_same_model_as_one_and_two_threads() {
    let dir = tempfile::tempdir().unwrap();
    let (p0, p1) = free_ports();
    let hosts = dir.path().join("hosts.txt");
    std::fs::write(&hosts, format!("127.0.0.1:{p0}\n127.0.0.1:{p1}\n")).unwrap();
    let m_proc = dir.path().join("procs.json");
    let children: Vec<_> = (0..2)
        .map(|i| {
            let mut c = tiderec();
            c.args(COMMON)
                .args(["--workers", "1", "--processes", "2", "--process", &i.to_string(), "--hosts"])
                .arg(&hosts);
            if i == 0 {
                c.arg("--metrics-json").arg(&m_proc);
            }
            c.spawn().expect("process starts")
        })
        .collect();
    for mut c in children {
        let status = c.wait().unwrap();
        assert!(status.success(), "a cluster process failed: {status}");
    }
    let m1 = dir.path().join("one.json");
    run_ok(tiderec().args(COMMON).args(["--workers", "1", "--metrics-json"]).arg(&m1));
    let m2 = dir.path().join("two.json");
    run_ok(tiderec().args(COMMON).args(["--workers", "2", "--metrics-json"]).arg(&m2));
    let (procs, one, two) = (metrics(&m_proc), metrics(&m1), metrics(&m2));
    assert_eq!(procs["workers"], 2);
    assert_eq!(procs["steps"], 50);
    for key in ["params_l2", "train_loss"] {
        let (a, b, c) = (one[key].as_f64().unwrap(), two[key].as_f64().unwrap(), procs[key].as_f64().unwrap());
        assert!(rel_diff(a, b) <= 1e-4, "{key}: 1 worker {a} vs 2 threads {b}");
        assert!(rel_diff(a, c) <= 1e-4, "{key}: 1 worker {a} vs 2 processes {c}");
    }
    // Two threads and two processes run the same arithmetic in the same order.
    assert_eq!(two["params_l2"], procs["params_l2"]);
}

#[test]
fn metrics_json_has_the_documented_fields() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.json");
    run_ok(
        tiderec()
            .args(["train", "--samples", "4096", "--batch-size", "256", "--progress", "lines", "--metrics-json"])
            .arg(&m),
    );
    let v = metrics(&m);
    for key in [
        "auc",
        "logloss",
        "accuracy",
        "ne",
        "calibration",
        "pr_auc",
        "train_loss",
        "samples",
        "steps",
        "samples_per_sec",
        "workers",
        "bad_records",
        "params_l2",
        "teacher_auc",
        "bytes_per_sample",
    ] {
        assert!(!v[key].is_null(), "missing `{key}` in {v}");
    }
    assert_eq!(v["samples"], 4096);
    assert_eq!(v["steps"], 16);
    assert!(v.get("gauc").is_some_and(|g| g.is_null()), "the synthetic stream names no user: {v}");
}

#[test]
fn bad_settings_fail_before_work_naming_the_key() {
    for (args, key) in [
        (vec!["train", "--batch-size", "0"], "batch_size"),
        (vec!["train", "--optimizer", "lbfgs"], "optimizer"),
        (vec!["train", "--data", "criteo:/definitely/missing.txt"], "/definitely/missing.txt"),
        (vec!["train", "--bottom", "64,8"], "model.bottom"),
        (vec!["train", "--processes", "2"], "hosts"),
    ] {
        let out = tiderec().args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key), "{args:?}: expected `{key}` in: {err}");
    }
    // Where a GPU worker keeps its rows is `device` or `host`; anything else fails, naming the variable.
    let out = tiderec().env("TIDEREC_GPU_ROWS", "gpu").args(["train", "--steps", "1"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("TIDEREC_GPU_ROWS") && err.contains("`gpu`"), "{err}");
    // So is whether it replays its steps as CUDA graphs: `on` or `off`.
    let out = tiderec().env("TIDEREC_GPU_GRAPHS", "yes").args(["train", "--steps", "1"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("TIDEREC_GPU_GRAPHS") && err.contains("`yes`"), "{err}");
    // And the threads a worker plans and pools on: `auto` or 1 to 1,024.
    for bad in ["0", "many", "-2", "1025"] {
        let out = tiderec().env("TIDEREC_HOST_THREADS", bad).args(["train", "--steps", "1"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let named = err.contains("TIDEREC_HOST_THREADS") && err.contains(&format!("`{bad}`"));
        assert!(!out.status.success() && named, "{bad}: {err}");
    }
}

/// A worker that plans and pools its batches on two threads trains the model it
/// trains on one (batches of 2,048 samples have enough entries for two threads).
#[test]
fn host_threads_change_no_result() {
    let run = |threads: &str| {
        let out = tiderec()
            .env("TIDEREC_HOST_THREADS", threads)
            .args(["train", "--workers", "1", "--batch-size", "2048", "--samples", "20480", "--progress", "none"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{threads}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = |key: &str| text.lines().find(|l| l.trim_start().starts_with(key)).map(str::to_owned);
        (line("params L2").expect("a params L2 line"), line("eval AUC").expect("an eval AUC line"))
    };
    assert_eq!(run("1"), run("2"));
}

#[test]
fn config_file_is_read_and_flags_override_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, "samples = 2048\nbatch_size = 512\nprogress = \"none\"\n").unwrap();
    let m = dir.path().join("m.json");
    run_ok(tiderec().args(["train", "--config"]).arg(&cfg).args(["--batch-size", "256", "--metrics-json"]).arg(&m));
    let v = metrics(&m);
    assert_eq!(v["samples"], 2048);
    assert_eq!(v["steps"], 8, "--batch-size 256 overrides the file's 512");
    std::fs::write(&cfg, "sampels = 5\n").unwrap();
    let out = tiderec().args(["train", "--config"]).arg(&cfg).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("sampels"));
}

#[test]
fn bad_records_are_skipped_and_written_or_fail_with_their_line() {
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
    let dead = dir.path().join("dead.tsv");
    let m = dir.path().join("m.json");
    run_ok(
        tiderec()
            .args(["train", "--progress", "none", "--eval-fraction", "0", "--data"])
            .arg(format!("criteo:{}", data.display()))
            // 2 of 100 records are malformed: above the default budget of 1%.
            .args(["--max-bad-fraction", "0.05"])
            .arg("--dead-letters")
            .arg(&dead)
            .arg("--metrics-json")
            .arg(&m),
    );
    let v = metrics(&m);
    assert_eq!(v["bad_records"], 2);
    assert_eq!(v["samples"], 98);
    let dl = std::fs::read_to_string(&dead).unwrap();
    assert_eq!(dl.lines().count(), 2, "{dl}");
    assert!(dl.lines().any(|l| l.split('\t').nth(1) == Some("10")), "{dl}");
    assert!(dl.lines().any(|l| l.split('\t').nth(1) == Some("20")), "{dl}");

    let out = tiderec()
        .args(["train", "--progress", "none", "--on-bad-record", "fail", "--workers", "2", "--data"])
        .arg(format!("criteo:{}", data.display()))
        .arg("--dead-letters")
        .arg(dir.path().join("dead2.tsv"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("corrupt.txt:10"), "the error names file and line: {err}");
}

#[test]
fn epochs_replay_files_and_odd_worker_counts_cover_every_row() {
    let Some(src) = shared_data("criteo/sample_train.txt") else { return };
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.json");
    // 100 rows, 3 workers sharing a global batch of 32 (micro-batches 10, 11, 11), two epochs.
    run_ok(
        tiderec()
            .args(["train", "--progress", "none", "--eval-fraction", "0", "--epochs", "2", "--workers", "3"])
            .args(["--batch-size", "32", "--data"])
            .arg(format!("criteo:{}", src.display()))
            .arg("--metrics-json")
            .arg(&m),
    );
    let v = metrics(&m);
    assert_eq!(v["samples"], 200, "every row once per epoch");
    assert_eq!(v["epochs"], 2);
    assert_eq!(v["workers"], 3);
}

#[test]
fn csv_data_with_a_toml_feature_spec_trains_on_real_avazu_rows() {
    let Some(src) = shared_data("avazu/train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("avazu.toml");
    std::fs::write(
        &spec,
        r#"
delimiter = ","
header = true
columns = ["id", "click", "hour", "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id",
           "app_domain", "app_category", "device_id", "device_ip", "device_model", "device_type",
           "device_conn_type", "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21"]
label = { column = "click" }
dense = [{ column = "C15", log1p = true }, { column = "C16", log1p = true }]
categorical = [
  { column = "site_id", buckets = 5000 }, { column = "app_id", buckets = 5000 },
  { column = "device_model", buckets = 5000 }, { column = "C14", buckets = 5000 },
  { column = "banner_pos", buckets = 8, encoding = "identity" },
]
"#,
    )
    .unwrap();
    let m = dir.path().join("m.json");
    run_ok(
        tiderec()
            .args(["train", "--progress", "none", "--model", "deepfm", "--eval-fraction", "0.2", "--spec"])
            .arg(&spec)
            .arg("--data")
            .arg(format!("csv:{}", src.display()))
            .arg("--metrics-json")
            .arg(&m),
    );
    let v = metrics(&m);
    assert_eq!(v["samples"].as_u64().unwrap() + v["eval_samples"].as_u64().unwrap(), 8999);
    assert_eq!(v["bad_records"], 0);
    assert!(v["auc"].as_f64().unwrap() > 0.62, "{v}");
    // A spec naming a missing column fails before any work, naming the key.
    std::fs::write(&spec, std::fs::read_to_string(&spec).unwrap().replace("column = \"C15\"", "column = \"C99\""))
        .unwrap();
    let out = tiderec()
        .args(["train", "--spec"])
        .arg(&spec)
        .arg("--data")
        .arg(format!("csv:{}", src.display()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("dense[0].column"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn generated_elm_lines_train_with_the_elm_preset() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("elm.csv");
    run_ok(tiderec().args(["generate", "elm", "--rows", "3000", "--list-scale", "2", "--out"]).arg(&data));
    let m = dir.path().join("m.json");
    run_ok(
        tiderec()
            .args(["train", "--progress", "none", "--spec", "elm", "--eval-fraction", "0.1", "--data"])
            .arg(format!("csv:{}", data.display()))
            .arg("--metrics-json")
            .arg(&m),
    );
    let v = metrics(&m);
    assert_eq!(v["samples"].as_u64().unwrap() + v["eval_samples"].as_u64().unwrap(), 3000);
    assert_eq!(v["bad_records"], 0);
}

/// `generate elm --overwrite` replaces its file only once the new one is whole: a write
/// that fails (here the file-size limit, `ulimit -f`, with SIGXFSZ ignored) leaves the
/// old file as it was and no temporary file.
#[test]
fn a_failed_generate_keeps_the_file_it_would_replace() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("elm.csv");
    run_ok(tiderec().args(["generate", "elm", "--rows", "10", "--out"]).arg(&data));
    let before = std::fs::read(&data).unwrap();
    let bin = tiderec().get_program().to_owned();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 64; exec \"$0\" generate elm --rows 100000 --overwrite --out \"$1\"")
        .arg(&bin)
        .arg(&data)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("cannot write"), "{stderr}");
    assert_eq!(std::fs::read(&data).unwrap(), before, "the old file is untouched");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file is left");
}

#[test]
fn dien_trains_on_elm_histories_kept_as_sequences() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("elm.csv");
    run_ok(tiderec().args(["generate", "elm", "--rows", "2000", "--out"]).arg(&data));
    let run = |model: &str, spec: &str| {
        let m = dir.path().join(format!("{model}-{spec}.json"));
        let out = tiderec()
            .args(["train", "--progress", "none", "--model", model, "--spec", spec, "--eval-fraction", "0.1"])
            .args(["--batch-size", "64", "--workers", "2", "--data"])
            .arg(format!("csv:{}", data.display()))
            .arg("--metrics-json")
            .arg(&m)
            .output()
            .unwrap();
        (out, m)
    };
    let (out, m) = run("dien", "elm-dien");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = metrics(&m);
    assert_eq!(v["samples"].as_u64().unwrap() + v["eval_samples"].as_u64().unwrap(), 2000);
    assert_eq!(v["bad_records"], 0);
    assert!(v["train_loss"].as_f64().unwrap().is_finite() && v["params_l2"].as_f64().unwrap() > 0.0);
    // The same data without sequences: dien refuses and says how to keep them.
    let (out, _) = run("dien", "elm");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("elm-dien"), "{err}");
    // A model without sequence inputs trains on the other fields of the elm-dien data.
    let (out, m) = run("dlrm", "elm-dien");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(metrics(&m)["bad_records"], 0);
}

#[test]
fn an_error_is_its_message_without_a_backtrace_unless_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-checkpoint");
    let export = |env: &[(&str, &str)]| {
        let mut c = tiderec();
        c.env_remove("RUST_LIB_BACKTRACE").env_remove("TIDEREC_BACKTRACE").envs(env.iter().copied());
        c.args(["export", "--checkpoint"]).arg(&missing).arg("--out").arg(dir.path().join("out"));
        common::run_err(&mut c)
    };
    // RUST_BACKTRACE set for a panic's sake: the error is still only its message and causes.
    let err = export(&[("RUST_BACKTRACE", "1")]);
    assert!(err.contains("Error: export failed") && err.contains("no-checkpoint"), "{err}");
    assert!(!err.contains("Stack backtrace"), "{err}");
    // Asked for: the backtrace of where the error was made follows it.
    let err = export(&[("TIDEREC_BACKTRACE", "1")]);
    assert!(err.contains("Error: export failed") && err.contains("Stack backtrace"), "{err}");
}

/// The help of `tiderec` with `args` (a command and `--help`).
fn help(args: &[&str]) -> String {
    let out = run_ok(tiderec().args(args).arg("--help"));
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The flags `help` lists, each with its placeholder (`--buckets <N>`, or the flag alone).
fn listed_flags(help: &str) -> Vec<(String, Option<String>)> {
    help.lines()
        .filter_map(|l| l.trim_start().trim_start_matches("-h, ").strip_prefix("--"))
        .map(|rest| {
            let flag = rest.split([' ', '[']).next().unwrap().to_string();
            let placeholder = rest[flag.len()..]
                .trim_start_matches("[=")
                .trim_start()
                .strip_prefix('<')
                .and_then(|p| p.split_once('>'))
                .map(|(p, _)| p.to_string());
            (flag, placeholder)
        })
        .collect()
}

#[test]
fn every_help_lists_what_its_command_takes_with_uniform_placeholders() {
    let commands: [&[&str]; 12] = [
        &["train"],
        &["convert"],
        &["online"],
        &["produce"],
        &["plot"],
        &["export"],
        &["eval"],
        &["predict"],
        &["serve"],
        &["generate", "elm"],
        &["spec", "show"],
        &["spec", "check"],
    ];
    for command in commands {
        let text = help(command);
        let flags = listed_flags(&text);
        assert!(flags.len() > 1, "{command:?}: no flags read from\n{text}");
        for (flag, placeholder) in &flags {
            // A placeholder clap made of the field's name (`--max-records <MAX_RECORDS>`) says
            // nothing a uniform one (`<N>`, `<SECONDS>`, `<FILE>`) would not say better.
            let made = flag.to_uppercase().replace('-', "_");
            if made == "SEED" {
                continue;
            }
            assert_ne!(placeholder.as_deref(), Some(made.as_str()), "{command:?}: --{flag}");
        }
    }
    let names = |command: &[&str]| -> Vec<String> { listed_flags(&help(command)).into_iter().map(|f| f.0).collect() };
    // `convert` shows its own flags beside the featurizing ones, and hides the training ones.
    let convert = names(&["convert"]);
    for flag in ["from", "to", "row-group-rows", "rows-per-file", "zstd-level", "buckets", "spec", "hash-seed"] {
        assert!(convert.iter().any(|f| f == flag), "convert --help lacks --{flag}: {convert:?}");
    }
    assert!(!convert.iter().any(|f| f == "model" || f == "epochs"), "{convert:?}");
    // `online` does not offer what it refuses, and still refuses it when given.
    let online = names(&["online"]);
    for flag in ["topic", "model", "checkpoint-dir", "window"] {
        assert!(online.iter().any(|f| f == flag), "online --help lacks --{flag}: {online:?}");
    }
    for flag in ["epochs", "steps", "data", "eval", "eval-fraction", "early-stop", "eval-every", "best-metric"] {
        assert!(!online.iter().any(|f| f == flag), "online --help offers --{flag}, which online refuses");
    }
    for given in [&["--early-stop", "2"][..], &["--best-metric", "logloss"], &["--epochs", "2"]] {
        let out = tiderec().args(["online", "--topic", "t", "--brokers", "127.0.0.1:1"]).args(given).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("does not apply to `online`"), "{given:?}: {err}");
    }
}

/// `--max-len` cuts behaviour sequences and id lists: given for data without any (as a flag
/// or in a `--config` file), `train` and `convert` refuse it naming it and why, before any
/// work; left at its default it is no refusal, and data with sequences takes it.
#[test]
fn max_len_is_refused_for_data_without_sequences() {
    let dir = tempfile::tempdir().unwrap();
    let criteo = dir.path().join("day_0.txt");
    let line = |i: usize| {
        let ints = (1..=13).map(|j| (i * j % 50).to_string());
        let cats = (0..26).map(|j| format!("{:08x}", (i * 31 + j * 7919) % 1000));
        std::iter::once((i % 2).to_string()).chain(ints).chain(cats).collect::<Vec<_>>().join("\t")
    };
    std::fs::write(&criteo, (0..64).map(line).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    let from = format!("criteo:{}", criteo.display());
    let out = dir.path().join("pq");
    let to = format!("parquet:{}", out.display());
    let config = dir.path().join("run.toml");
    std::fs::write(&config, "max_len = 5\n").unwrap();
    let config = config.display().to_string();
    let refused = |args: &[&str]| {
        let o = tiderec().args(args).args(["--progress", "none"]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!o.status.success(), "{args:?} should fail: {err}");
        assert!(
            err.contains("`max_len`") && err.contains("--max-len") && err.contains("has no sequences"),
            "{args:?}: {err}"
        );
    };
    refused(&["train", "--max-len", "5"]);
    refused(&["train", "--config", &config]);
    refused(&["train", "--data", &from, "--max-len", "5"]);
    refused(&["convert", "--from", &from, "--to", &to, "--max-len", "5"]);
    assert!(!out.exists(), "refused before the output directory is made");
    // Left at its default: Criteo converts, and Parquet files without sequences refuse it too.
    run_ok(tiderec().args(["convert", "--progress", "none", "--from", &from, "--to", &to]));
    refused(&["train", "--data", &to, "--max-len", "5"]);
    // Data with sequences takes it.
    let m = dir.path().join("dien.json");
    run_ok(
        tiderec()
            .args(["train", "--data", "synthetic-behavior", "--model", "dien", "--max-len", "5", "--progress", "none"])
            .args(["--samples", "512", "--batch-size", "256", "--steps", "1", "--eval-fraction", "0"])
            .arg("--metrics-json")
            .arg(&m),
    );
    assert_eq!(metrics(&m)["steps"], 1);
}

#[test]
fn one_default_per_setting_across_commands() {
    let default_of = |command: &[&str], flag: &str| -> String {
        let text = help(command);
        let at = text.find(&format!("--{flag} ")).unwrap_or_else(|| panic!("{command:?} lists --{flag}"));
        let rest = &text[at..];
        let end = rest[2..].find("\n      -").map_or(rest.len(), |e| e + 2);
        let entry = &rest[..end];
        let value = entry.split("[default: ").nth(1).unwrap_or_else(|| panic!("{command:?} --{flag}: {entry}"));
        value.split(']').next().unwrap().to_string()
    };
    for flag in ["buckets", "max-len"] {
        assert_eq!(default_of(&["spec", "show"], flag), default_of(&["train"], flag), "--{flag}");
        assert_eq!(default_of(&["spec", "check"], flag), default_of(&["convert"], flag), "--{flag}");
    }
    for flag in ["broker-timeout", "brokers"] {
        assert_eq!(default_of(&["produce"], flag), default_of(&["online"], flag), "--{flag}");
    }
}

#[test]
fn spec_check_learns_scales_from_data_and_warns_about_unscaled_wide_columns() {
    let Some(data) = shared_data("taobao_ad/train_sample.csv") else { return };
    let dir = tempfile::tempdir().unwrap();
    let columns = tiderec_operators::spec::TAOBAO_AD_COLUMNS.map(|c| format!("\"{c}\"")).join(", ");
    let spec = |dense: &str| {
        let path = dir.path().join("spec.toml");
        std::fs::write(
            &path,
            format!(
                "delimiter = \",\"\nheader = true\ncolumns = [{columns}]\nlabel = {{ column = \"clk\" }}\n\
                 dense = [{dense}]\ncategorical = [{{ column = \"userid\", buckets = 100 }}]\n"
            ),
        )
        .unwrap();
        path
    };
    let check = |path: &std::path::Path| {
        let out =
            run_ok(tiderec().args(["spec", "check"]).arg(path).arg("--data").arg(format!("csv:{}", data.display())));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Prices run into the hundreds: unscaled, a warning names the column and its range.
    let raw = check(&spec("{ column = \"price\" }"));
    assert!(
        raw.contains("warning: dense[0] (`price`) ranges over [") && raw.contains("scale = \"standardize\""),
        "{raw}"
    );
    // Log-scaled and standardized, the spec check learns the statistics and has no warning.
    let scaled = check(&spec("{ column = \"price\", log1p = true, scale = \"standardize\" }"));
    assert!(scaled.contains("spec: learned from 100 records: price center "), "{scaled}");
    assert!(!scaled.contains("warning"), "{scaled}");
}

#[test]
fn a_spec_learns_nothing_from_the_lines_held_out_for_evaluation() {
    let dir = tempfile::tempdir().unwrap();
    // The first half of the file (the trained part under --eval-fraction 0.5) has ages near
    // 10, the held-out half near 1,000: learning from both would center near 500.
    let data = dir.path().join("d.csv");
    // Lines of equal length, so the byte split falls between lines 100 and 101.
    let age = |i: usize| if i < 100 { 10 + (i % 2) * 2 } else { 1000 };
    let lines: String = (0..200).map(|i| format!("{},{:04}\n", i % 2, age(i))).collect();
    std::fs::write(&data, lines).unwrap();
    let spec = dir.path().join("spec.toml");
    std::fs::write(
        &spec,
        "delimiter = \",\"\ncolumns = [\"y\", \"age\"]\nlabel = { column = \"y\" }\n\
         dense = [{ column = \"age\", scale = \"standardize\" }]\n",
    )
    .unwrap();
    let out = run_ok(
        tiderec()
            .args(["train", "--progress", "none", "--model", "lr", "--steps", "1", "--batch-size", "8"])
            .args(["--eval-fraction", "0.5", "--spec"])
            .arg(&spec)
            .arg("--data")
            .arg(format!("csv:{}", data.display())),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("spec: learned from 100 records: age center 11 width 1"), "{err}");
}
