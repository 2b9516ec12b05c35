//! Runs that must refuse what would corrupt or crash them: sizes that overflow or do not fit
//! in memory, too many workers, mostly malformed or empty input, and input files truncated
//! while they are read. Every case is the release binary in a real process; every refusal is
//! a non-zero exit with a message, never a signal or a panic.

mod common;

use common::{metrics, refused, run_ok, shared_data, tiderec};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A small Criteo training run on `data` with `extra` flags.
fn train(data: &Path, extra: &[&str]) -> Command {
    let mut c = tiderec();
    c.args(["train", "--progress", "none", "--eval-fraction", "0", "--data"])
        .arg(format!("criteo:{}", data.display()))
        .args(extra);
    c
}

#[test]
fn table_sizes_that_overflow_or_exceed_memory_are_refused_before_allocating() {
    let Some(src) = shared_data("criteo/sample_train.txt") else { return };
    // 2^60 rows × 16 floats × 4 bytes wraps 64 bits (this was a segfault or a stack overflow).
    let err = refused(&mut train(&src, &["--buckets", "1152921504606846976"]));
    assert!(err.contains("does not fit") && err.contains("--buckets"), "{err}");
    // 4·10⁹ rows per table is 6.6 TB of rows: refused by the estimate (this was a worker panic).
    let err = refused(&mut train(&src, &["--buckets", "4000000000"]));
    assert!(err.contains("needs more memory than is available") && err.contains("--max-memory"), "{err}");
    // FM rows of 100,001 floats over 26 × 100,000 rows (this was killed for memory).
    let err = refused(&mut train(&src, &["--model", "fm", "--dim", "100000"]));
    assert!(err.contains("needs more memory"), "{err}");
}

#[test]
fn the_memory_estimate_is_printed_and_max_memory_bounds_or_lifts_the_check() {
    let Some(src) = shared_data("criteo/sample_train.txt") else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = run_ok(
        tiderec()
            .args(["train", "--progress", "lines", "--eval-fraction", "0", "--workers", "2", "--data"])
            .arg(format!("criteo:{}", src.display()))
            .args(["--dead-letters"])
            .arg(dir.path().join("d.tsv")),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().find(|l| l.starts_with("memory: ~")).unwrap_or_else(|| panic!("no estimate: {err}"));
    // 26 tables × 100,000 rows × 16 floats = 0.155 GiB of rows over both workers.
    assert!(line.contains("2 worker(s): tables 0.15 GiB") && line.contains("available"), "{line}");
    let err = refused(&mut train(&src, &["--max-memory", "64M"]));
    assert!(err.contains("available 0.06 GiB (--max-memory)"), "{err}");
    // The same run with the check lifted goes through.
    run_ok(train(&src, &["--max-memory", "unlimited", "--dead-letters"]).arg(dir.path().join("d2.tsv")));
    let err = refused(&mut train(&src, &["--max-memory", "lots"]));
    assert!(err.contains("max_memory"), "{err}");
}

#[test]
fn parquet_files_declaring_huge_tables_are_refused() {
    let Some(src) = shared_data("criteo/sample_train.txt") else { return };
    let dir = tempfile::tempdir().unwrap();
    let pq = dir.path().join("pq");
    // Conversion only hashes ids into 2^60 buckets; the files' schema then declares tables of 2^60 rows.
    run_ok(
        tiderec()
            .args(["convert", "--progress", "none", "--buckets", "1152921504606846976", "--from"])
            .arg(format!("criteo:{}", src.display()))
            .arg("--to")
            .arg(format!("parquet:{}", pq.display())),
    );
    let err = refused(
        tiderec()
            .args(["train", "--progress", "none", "--eval-fraction", "0", "--data"])
            .arg(format!("parquet:{}", pq.display())),
    );
    assert!(err.contains("does not fit") && err.contains("table_size"), "{err}");
}

#[test]
fn worker_counts_beyond_the_bounds_are_refused_naming_the_flag() {
    let Some(src) = shared_data("criteo/sample_train.txt") else { return };
    let err = refused(&mut train(&src, &["--workers", "1000", "--batch-size", "4096"]));
    assert!(err.contains("`workers`") && err.contains("four per core"), "{err}");
}

/// `criteo/sample_train.txt` with lines 10 and 20 broken (2 of 100 records malformed).
fn corrupted_copy(dir: &Path) -> Option<std::path::PathBuf> {
    let src = shared_data("criteo/sample_train.txt")?;
    let text = std::fs::read_to_string(src).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    lines[9] = lines[9].replacen('\t', "\tabc", 1); // I1 is not an integer
    lines[19] = format!("{}\tzz", lines[19]); // 41 fields
    let data = dir.join("corrupt.txt");
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    Some(data)
}

#[test]
fn a_bad_record_fraction_over_the_budget_fails_on_every_worker_and_process() {
    let dir = tempfile::tempdir().unwrap();
    let Some(data) = corrupted_copy(dir.path()) else { return };
    let dead = dir.path().join("dead.tsv");
    // 2% malformed against the default budget of 1%.
    for workers in ["1", "2"] {
        let err = refused(train(&data, &["--workers", workers, "--dead-letters"]).arg(&dead));
        for part in ["training input criteo:", "corrupt.txt", "2 of 100 records (2.00%)", "0.01", "dead.tsv"] {
            assert!(err.contains(part), "{workers} worker(s): `{part}` in: {err}");
        }
        assert!(err.contains("bad_integer 1") && err.contains("field_count 1"), "{err}");
        assert_eq!(std::fs::read_to_string(&dead).unwrap().lines().count(), 2, "both records written");
    }
    // Raised by the flag and by the TOML key, the same run succeeds.
    let m = dir.path().join("m.json");
    run_ok(train(&data, &["--max-bad-fraction", "0.05", "--metrics-json"]).arg(&m).arg("--dead-letters").arg(&dead));
    assert_eq!(metrics(&m)["bad_records"], 2);
    let config = dir.path().join("run.toml");
    std::fs::write(&config, "max_bad_fraction = 0.05\n").unwrap();
    run_ok(train(&data, &["--config"]).arg(&config).arg("--dead-letters").arg(&dead));
    // Two processes reach the same verdict: both exit non-zero, neither reports success.
    let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hosts = dir.path().join("hosts.txt");
    let ports = (a.local_addr().unwrap().port(), b.local_addr().unwrap().port());
    std::fs::write(&hosts, format!("127.0.0.1:{}\n127.0.0.1:{}\n", ports.0, ports.1)).unwrap();
    drop((a, b));
    let children: Vec<_> = (0..2)
        .map(|i| {
            train(&data, &["--workers", "1", "--processes", "2", "--process", &i.to_string(), "--hosts"])
                .arg(&hosts)
                .arg("--dead-letters")
                .arg(&dead)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (i, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "process {i}: {err}");
        assert!(err.contains("records (2.00%) are malformed"), "process {i}: {err}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("trained"), "process {i} reported success");
    }
}

#[test]
fn an_unlabeled_eval_file_fails_and_says_it_may_be_unlabeled() {
    let (Some(train_file), Some(test)) = (shared_data("criteo/sample_train.txt"), shared_data("criteo/sample.test"))
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = tiderec()
        .args(["train", "--progress", "none", "--data"])
        .arg(format!("criteo:{}", train_file.display()))
        .arg("--eval")
        .arg(format!("criteo:{}", test.display()))
        .arg("--dead-letters")
        .arg(dir.path().join("dead.tsv"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("eval AUC"), "no metrics on the wrong file");
    for part in ["evaluation input criteo:", "sample.test", "bad_label", "unlabeled", "dead.tsv"] {
        assert!(err.contains(part), "`{part}` in: {err}");
    }
}

#[test]
fn all_bad_or_empty_training_input_fails_naming_the_input() {
    let dir = tempfile::tempdir().unwrap();
    if let Some(test) = shared_data("avazu/test") {
        // The unlabeled Avazu test file: every line is one column short.
        let err = refused(
            tiderec()
                .args(["train", "--progress", "none", "--eval-fraction", "0", "--max-bad-fraction", "1", "--data"])
                .arg(format!("avazu:{}", test.display()))
                .arg("--dead-letters")
                .arg(dir.path().join("d.tsv")),
        );
        for part in ["training input avazu:", "1000 of 1000 records", "field_count 1000", "unlabeled"] {
            assert!(err.contains(part), "`{part}` in: {err}");
        }
    }
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let err = refused(&mut train(&empty, &[]));
    assert!(err.contains("training input criteo:") && err.contains("empty.txt") && err.contains("no samples"), "{err}");
    // An empty eval file given explicitly fails too, after training.
    if let Some(src) = shared_data("criteo/sample_train.txt") {
        let err = refused(
            tiderec()
                .args(["train", "--progress", "none", "--data"])
                .arg(format!("criteo:{}", src.display()))
                .arg("--eval")
                .arg(format!("criteo:{}", empty.display()))
                .arg("--dead-letters")
                .arg(dir.path().join("e.tsv")),
        );
        assert!(err.contains("evaluation input criteo:") && err.contains("no samples"), "{err}");
    }
}

#[test]
fn an_input_truncated_while_training_reads_it_is_an_error_naming_the_file() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.txt");
    let sample = std::fs::read(&src).unwrap();
    let mut f = std::io::BufWriter::new(std::fs::File::create(&big).unwrap());
    for _ in 0..30 {
        f.write_all(&sample).unwrap(); // 300,000 lines, 73 MB: far more than a few seconds of training
    }
    f.into_inner().unwrap().sync_all().unwrap();
    let mut child = tiderec()
        .args(["train", "--progress", "lines", "--eval-fraction", "0", "--workers", "1", "--data"])
        .arg(format!("criteo:{}", big.display()))
        .arg("--dead-letters")
        .arg(dir.path().join("d.tsv"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    // Another thread truncates the file once training reports its first steps (the reader is open).
    let path = big.clone();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        let mut truncated = false;
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap_or_default();
            if !truncated && line.starts_with("step ") {
                std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(1 << 20).unwrap();
                truncated = true;
            }
            all.push_str(&line);
            all.push('\n');
        }
        (truncated, all)
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(300) {
            child.kill().unwrap();
            panic!("the run went on for 5 minutes after its input was truncated");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (truncated, err) = reader.join().unwrap();
    assert!(truncated, "training never reported a step: {err}");
    assert_eq!(status.code(), Some(1), "an error exit, not a signal ({status:?}): {err}");
    assert!(err.contains("big.txt") && err.contains("changed while being read"), "{err}");
}
