//! Numeric settings outside their ranges: every one is refused before any work starts, from a
//! flag and from a `--config` file alike, with a message naming the flag or key, the value and
//! the allowed range; never a panic, a hang, an abort or a silent default.

mod common;

use common::{refused, tiderec};
use std::process::Command;

#[test]
fn non_finite_floats_in_a_config_file_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for (line, key, value, range) in [
        // `lr = nan` used to train with the model's default learning rate.
        ("lr = nan", "lr", "NaN", "(0, 1000]"),
        ("sparse_lr = inf", "sparse_lr", "inf", "(0, 1000]"),
        // Other float keys said `invalid type: null`.
        ("l2_dense = nan", "l2_dense", "NaN", "[0, 1000]"),
        ("connect_timeout = inf", "connect_timeout", "inf", "(0, 1e6]"),
        ("connect_timeout = 1e300", "connect_timeout", "1e300", "(0, 1e6]"),
        ("max_bad_fraction = -inf", "max_bad_fraction", "-inf", "[0, 1]"),
    ] {
        let config = dir.path().join("run.toml");
        std::fs::write(&config, format!("{line}\n")).unwrap();
        let err = refused(
            tiderec()
                .args(["train", "--progress", "none", "--samples", "1000", "--steps", "1", "--config"])
                .arg(&config),
        );
        let want = format!("`{key}`: {value} is outside the allowed range {range}");
        assert!(err.contains(&want) && err.contains("run.toml"), "{line}: {err}");
    }
}

#[test]
fn out_of_range_flags_are_refused_naming_flag_value_and_range() {
    let train = ["train", "--progress", "none"];
    let serve = ["serve", "--checkpoint", "no-such-checkpoint"];
    let predict = ["predict", "--checkpoint", "no-such-checkpoint", "--data", "criteo:x", "--out", "o.csv"];
    let cases: Vec<(Vec<&str>, &str, &str)> = vec![
        ([&train[..], &["--lr", "nan"]].concat(), "--lr", "NaN is outside the allowed range (0, 1000]"),
        // A panic converting to a duration.
        (
            [&train[..], &["--connect-timeout", "1e300"]].concat(),
            "--connect-timeout",
            "1e300 is outside the allowed range (0, 1e6]",
        ),
        (
            vec!["online", "--topic", "t", "--broker-timeout", "1e300"],
            "--broker-timeout",
            "1e300 is outside the allowed range [0.001, 1e6]",
        ),
        // Reports a thousand times a millisecond made online training 100× slower.
        (
            vec!["online", "--topic", "t", "--report-seconds", "1e-300"],
            "--report-seconds",
            "1e-300 is outside the allowed range [0.01, 1e6]",
        ),
        (
            vec!["produce", "--topic", "t", "--from", "criteo:x", "--broker-timeout", "inf"],
            "--broker-timeout",
            "inf is outside",
        ),
        // An abort spawning the threads.
        ([&serve[..], &["--threads", "30000"]].concat(), "--threads", "30000 is outside the allowed range [1, 1024]"),
        (
            [&serve[..], &["--reload-every", "1e300"]].concat(),
            "--reload-every",
            "1e300 is outside the allowed range [0, 1e6]",
        ),
        // Every request waited hours for a batch to fill.
        (
            [&serve[..], &["--max-wait-us", "10000000000"]].concat(),
            "--max-wait-us",
            "10000000000 is outside the allowed range [0, 1000000]",
        ),
        // No body could ever be read.
        (
            [&serve[..], &["--max-body-memory", "0"]].concat(),
            "--max-body-memory",
            "0 is outside the allowed range [1, 1099511627776]",
        ),
        // Accepted, and read as 1.
        ([&predict[..], &["--batch-size", "0"]].concat(), "--batch-size", "0 is outside the allowed range [1, "),
        (
            ["convert", "--from", "criteo:x", "--to", "parquet:y", "--zstd-level", "99"].to_vec(),
            "--zstd-level",
            "99 is outside the allowed range [1, 22]",
        ),
        // `bench` flags: a zero or non-finite measuring time, no workers, a replicated share over 1.
        (vec!["bench", "gru", "--seconds", "nan"], "--seconds", "NaN is outside the allowed range (0, 1e6]"),
        (vec!["bench", "dlrm", "--workers", "0"], "--workers", "0 is outside the allowed range [1, 1024]"),
        (vec!["bench", "dlrm", "--zipf=-1"], "--zipf", "-1 is outside the allowed range [0, 100]"),
        (vec!["bench", "exchange", "--replicate", "2"], "--replicate", "2 is outside the allowed range [0, 1]"),
        (vec!["bench", "cache", "--hot-rows", "1024,0"], "--hot-rows", "0 is outside the allowed range [1, "),
        (vec!["bench", "kernels", "--rounds", "0"], "--rounds", "0 is outside the allowed range [1, 1000]"),
    ];
    for (args, flag, want) in cases {
        let err = refused(tiderec().args(&args));
        assert!(err.contains(flag) && err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn devices_fifos_and_subdirectories_as_data_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    // These said "no such file or directory".
    for data in ["/dev/zero".to_string(), fifo.display().to_string()] {
        for command in [&["train", "--progress", "none"][..], &["convert", "--to", "parquet:out"][..]] {
            let flag = if command[0] == "convert" { "--from" } else { "--data" };
            let err = refused(tiderec().args(command).arg(flag).arg(format!("criteo:{data}")));
            assert!(err.contains(&data) && err.contains("not a regular file"), "{command:?} {data}: {err}");
        }
    }
    // A subdirectory of a data directory was skipped silently.
    let data = dir.path().join("days");
    std::fs::create_dir_all(data.join("day1")).unwrap();
    std::fs::write(data.join("day0.txt"), "1\t2\n").unwrap();
    let err =
        refused(tiderec().args(["train", "--progress", "none", "--data"]).arg(format!("criteo:{}", data.display())));
    assert!(err.contains("day1") && err.contains("would not be read"), "{err}");
}

#[test]
fn a_vocabulary_that_is_a_device_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("spec.toml");
    std::fs::write(
        &spec,
        "delimiter = \",\"\ncolumns = [\"y\", \"c\"]\nlabel = { column = \"y\" }\n\
         categorical = [{ column = \"c\", buckets = 3, encoding = \"vocabulary\", vocabulary = \"/dev/zero\" }]\n",
    )
    .unwrap();
    // This read /dev/zero until memory ran out.
    let err = refused(tiderec().args(["spec", "check"]).arg(&spec));
    assert!(err.contains("/dev/zero") && err.contains("not a regular file"), "{err}");
}
