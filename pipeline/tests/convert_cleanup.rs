//! What `tiderec convert` leaves in its output directory: the dataset and its lock file
//! after a success; after a failure, nothing of a directory it created, and everything that
//! was in a directory that existed (see `tiderec::dir_lock` for why the lock file stays).

mod common;

use common::{run_err, run_ok, tiderec};
use std::path::Path;
use std::process::Command;

/// Criteo lines: `good` well-formed ones, then `bad` whose `I1` is not an integer.
fn criteo(path: &Path, good: usize, bad: usize) {
    let line = |i: usize, first: &str| {
        let ints = (1..=13).map(|j| if j == 1 { first.to_string() } else { (i * j % 50).to_string() });
        let cats = (0..26).map(|j| format!("{:08x}", (i * 31 + j * 7919) % 1000));
        std::iter::once((i % 2).to_string()).chain(ints).chain(cats).collect::<Vec<_>>().join("\t")
    };
    let lines: Vec<String> =
        (0..good).map(|i| line(i, "3")).chain((0..bad).map(|i| line(good + i, "not-a-number"))).collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// `tiderec convert --from criteo:FROM --to parquet:OUT` quietly, plus `extra` flags.
fn convert(from: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut c = tiderec();
    c.args(["convert", "--progress", "none", "--from"])
        .arg(format!("criteo:{}", from.display()))
        .arg("--to")
        .arg(format!("parquet:{}", out.display()))
        .args(extra);
    c
}

/// The names in `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

#[test]
fn a_converted_directory_holds_the_dataset_and_its_lock_file_only() {
    let dir = tempfile::tempdir().unwrap();
    let from = dir.path().join("day_0.txt");
    criteo(&from, 200, 0);
    let out = dir.path().join("new/pq");
    run_ok(&mut convert(&from, &out, &["--rows-per-file", "150"]));
    // The lock file stays by design (`tiderec::dir_lock`), naming its last holder.
    assert_eq!(entries(&out), [".lock", "part-00000.parquet", "part-00001.parquet"]);
    let holder = tiderec::dir_lock::Holder::read(&out.join(tiderec::dir_lock::LOCK_FILE));
    assert_eq!(holder.command.as_deref(), Some("tiderec convert"));
}

#[test]
fn a_failed_convert_removes_the_directory_it_created() {
    let dir = tempfile::tempdir().unwrap();
    let from = dir.path().join("day_0.txt");
    // 5 of 205 records are malformed: over the default budget of 1%, found after the good
    // rows are written (and removed), or at once under `--on-bad-record fail`.
    criteo(&from, 200, 5);
    let dead = dir.path().join("dead.tsv");
    let dead = dead.to_str().unwrap();
    for (name, flags) in [
        ("budget", &["--dead-letters", dead][..]),
        ("fail", &["--dead-letters", dead, "--on-bad-record", "fail"]),
        ("complete files first", &["--dead-letters", dead, "--row-group-rows", "16", "--rows-per-file", "32"]),
    ] {
        let out = dir.path().join("made/here/pq");
        let err = run_err(&mut convert(&from, &out, flags));
        assert!(err.contains("day_0.txt"), "{name}: {err}");
        // `made/here/pq` and the parents made for it are gone, lock file and all.
        assert!(!dir.path().join("made").exists(), "{name}: {:?}", entries(dir.path()));
        let _ = std::fs::remove_file(dir.path().join("dead.tsv"));
        assert_eq!(entries(dir.path()), ["day_0.txt"], "{name}");
    }
    // The dead letters beside a new directory (its default place) stay, as evidence; the
    // directory goes.
    let out = dir.path().join("pq");
    run_err(&mut convert(&from, &out, &[]));
    assert_eq!(entries(dir.path()), ["day_0.txt", "pq.dead-letters.tsv"]);
}

#[test]
fn a_failed_convert_into_an_existing_directory_leaves_what_was_there() {
    let dir = tempfile::tempdir().unwrap();
    let from = dir.path().join("day_0.txt");
    criteo(&from, 200, 5);
    let out = dir.path().join("pq");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("README"), "the user's notes\n").unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    for target in [&out, &empty] {
        let flags = ["--row-group-rows", "16", "--rows-per-file", "32"];
        let err = run_err(convert(&from, target, &flags).arg("--dead-letters").arg(dir.path().join("dead.tsv")));
        assert!(err.contains("day_0.txt"), "{err}");
    }
    // What was there is there, untouched; no Parquet file nor temporary is left; the lock
    // file stays (a directory the user made is never removed).
    assert_eq!(entries(&out), [".lock", "README"]);
    assert_eq!(std::fs::read_to_string(out.join("README")).unwrap(), "the user's notes\n");
    assert_eq!(entries(&empty), [".lock"]);
    // And the directory takes a conversion again.
    std::fs::remove_file(out.join("README")).unwrap();
    criteo(&from, 200, 0);
    run_ok(&mut convert(&from, &out, &[]));
    assert_eq!(entries(&out), [".lock", "part-00000.parquet"]);
}
