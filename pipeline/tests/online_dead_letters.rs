//! The dead-letter files of `tiderec online` across resumes that change the process count
//! (`dead.tsv` for one process, `dead.tsv.p<N>` for several) or spell `--dead-letters`
//! another way: whatever the sequence of runs resumed from a checkpoint, the union of the
//! dead-letter files holds every malformed record of the topic exactly once, as an
//! undisturbed run's file does.
//!
//! A run killed after a checkpoint is simulated deterministically: the run goes to the
//! topic's end and the checkpoints after the chosen one are deleted, so the resumed run
//! starts from that checkpoint while the dead-letter files hold the records read after it.
//! The broker is tansu on 127.0.0.1 (see `kafka.rs`).

mod common;
mod kafka_broker;

use common::{run_ok, tiderec};
use kafka_broker::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Records produced, and the malformed ones among them (every 25th line from line 7).
const RECORDS: usize = 1000;
const MALFORMED: usize = 40;

/// Flags every run of these tests shares.
const FLAGS: [&str; 7] =
    ["--checkpoint-every", "4", "--max-bad-fraction", "0.2", "--until-end", "--keep-checkpoints", "100"];

/// Writes `RECORDS` lines of the Criteo sample with `MALFORMED` of them replaced by a line
/// that is no record into `topic` (2 partitions, round robin). Returns the
/// `(kafka:TOPIC/PARTITION, offset)` of the malformed ones.
fn produce_with_malformed(broker: &Broker, topic: &str, dir: &Path) -> Option<BTreeMap<(String, u64), usize>> {
    let sample = criteo_sample()?;
    let text = std::fs::read_to_string(sample).unwrap();
    let mut lines: Vec<String> = text.lines().take(RECORDS).map(String::from).collect();
    assert_eq!(lines.len(), RECORDS);
    let mut expected = BTreeMap::new();
    for i in (7..RECORDS).step_by(25).take(MALFORMED) {
        lines[i] = format!("malformed record {i}");
        expected.insert((format!("kafka:{topic}/{}", i % 2), (i / 2) as u64), 1);
    }
    assert_eq!(expected.len(), MALFORMED);
    let file = dir.join(format!("{topic}.tsv"));
    std::fs::write(&file, lines.join("\n")).unwrap();
    assert_eq!(produce(broker, topic, &file, &["--partitions", "2"]), RECORDS as u64);
    Some(expected)
}

/// An online run over `topic` with its checkpoints, summary and, unless `dead_letters` says
/// otherwise, dead letters (`dead.tsv`) in `dir`.
fn online(broker: &Broker, topic: &str, dir: &Path, dead_letters: Option<&str>, extra: &[&str]) -> Command {
    let mut c = tiderec();
    c.args(["online", "--brokers", &broker.addr(), "--topic", topic, "--progress", "none"])
        .args(["--batch-size", "64", "--buckets", "5000", "--seed", "5", "--workers", "1"])
        .args(["--bottom", "64,16", "--top", "64,1", "--report-seconds", "0.2"])
        .args(FLAGS)
        .arg("--checkpoint-dir")
        .arg(dir.join("ckpt"))
        .arg("--summary-json")
        .arg(dir.join("summary.json"))
        .arg("--dead-letters");
    match dead_letters {
        Some(spelled) => c.arg(spelled),
        None => c.arg(dir.join("dead.tsv")),
    };
    c.args(extra);
    c
}

/// Runs `online(…)` as `processes` processes of one cluster on 127.0.0.1 (one process:
/// a plain run), each of which must succeed.
fn run_processes(broker: &Broker, topic: &str, dir: &Path, processes: usize, extra: &[&str]) {
    if processes == 1 {
        run_ok(&mut online(broker, topic, dir, None, extra));
        return;
    }
    std::fs::create_dir_all(dir).unwrap();
    let hosts = dir.join("hosts.txt");
    let list: String = (0..processes).map(|_| format!("127.0.0.1:{}\n", free_port())).collect();
    std::fs::write(&hosts, list).unwrap();
    let children: Vec<Child> = (0..processes)
        .map(|i| {
            let flags = ["--processes", &processes.to_string(), "--process", &i.to_string()];
            online(broker, topic, dir, None, &[extra, &flags[..]].concat())
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
}

/// The steps of the `ckpt-<step>` directories in `dir/ckpt`, sorted.
fn checkpoint_steps(dir: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(dir.join("ckpt"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str()?.strip_prefix("ckpt-")?.parse().ok())
        .collect();
    steps.sort_unstable();
    steps
}

/// Deletes the checkpoints after `step` (what a kill right after it would have left) and
/// checks that `step`'s is there.
fn keep_checkpoints_up_to(dir: &Path, step: u64) {
    let steps = checkpoint_steps(dir);
    assert!(steps.contains(&step), "no checkpoint of step {step}: {steps:?}");
    assert!(steps.iter().any(|&s| s > step), "nothing after step {step} to delete: {steps:?}");
    for s in steps.into_iter().filter(|&s| s > step) {
        std::fs::remove_dir_all(dir.join("ckpt").join(format!("ckpt-{s}"))).unwrap();
    }
}

/// The dead-letter files in `dir`: `dead.tsv` and `dead.tsv.p<N>`.
fn dead_letter_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().is_some_and(|n| n.starts_with("dead.tsv")))
        .collect();
    files.sort();
    files
}

/// How many times each `(source, offset)` occurs over the dead-letter files in `dir`.
fn dead_letters(dir: &Path) -> BTreeMap<(String, u64), usize> {
    let mut seen = BTreeMap::new();
    for file in dead_letter_files(dir) {
        for line in std::fs::read_to_string(&file).unwrap().lines() {
            let mut cols = line.split('\t');
            let source = cols.next().unwrap().to_string();
            let offset: u64 = cols.next().unwrap().parse().unwrap();
            *seen.entry((source, offset)).or_insert(0) += 1;
        }
    }
    seen
}

/// Asserts that the dead-letter files in `dir` hold exactly the `expected` records, once each.
fn assert_each_once(dir: &Path, expected: &BTreeMap<(String, u64), usize>, after: &str) {
    let found = dead_letters(dir);
    let twice: Vec<_> = found.iter().filter(|(_, &n)| n > 1).map(|(k, _)| k).collect();
    let lost: Vec<_> = expected.keys().filter(|k| !found.contains_key(k)).collect();
    let listing: Vec<(String, usize)> = dead_letter_files(dir)
        .iter()
        .map(|f| (f.display().to_string(), std::fs::read_to_string(f).unwrap().lines().count()))
        .collect();
    assert!(
        &found == expected,
        "{after}: {} lines over {listing:?}; {} records more than once {twice:?}, {} lost {lost:?}",
        found.values().sum::<usize>(),
        twice.len(),
        lost.len()
    );
}

/// Two processes checkpoint every 4 steps; after step 8 they are "killed" and the run is
/// resumed by one process, which in turn is "killed" after step 12 and resumed by two
/// processes: after each resume the malformed records are over `dead.tsv`, `dead.tsv.p0`
/// and `dead.tsv.p1` exactly once each, as in an undisturbed run's `dead.tsv`.
#[test]
fn dead_letters_are_each_kept_once_across_process_count_changes() {
    let broker = Broker::start();
    let base = tempfile::tempdir().unwrap();
    let Some(expected) = produce_with_malformed(&broker, "mixed", base.path()) else { return };

    let whole = base.path().join("whole");
    run_processes(&broker, "mixed", &whole, 1, &[]);
    assert_eq!(dead_letters(&whole), expected, "the undisturbed run's dead letters");
    let samples = summary(&whole)["samples"].clone();
    assert_eq!(samples, (RECORDS - MALFORMED) as u64);

    let dir = base.path().join("resumed");
    run_processes(&broker, "mixed", &dir, 2, &[]);
    assert_each_once(&dir, &expected, "two processes");
    keep_checkpoints_up_to(&dir, 8);
    run_processes(&broker, "mixed", &dir, 1, &["--resume"]);
    assert_eq!(summary(&dir)["samples"], samples);
    assert_each_once(&dir, &expected, "two processes, then one from step 8");
    keep_checkpoints_up_to(&dir, 12);
    run_processes(&broker, "mixed", &dir, 2, &["--resume"]);
    assert_eq!(summary(&dir)["samples"], samples);
    assert_each_once(&dir, &expected, "then two processes from the one process's step 12");
    assert_eq!(final_model(&dir).bad_records, MALFORMED as u64);
}

/// `--dead-letters` names the same file as `./dead.tsv`, `dead.tsv`, `../dead.tsv` from a
/// subdirectory, or its absolute path: a resume continues that file whatever the spelling.
#[test]
fn dead_letters_are_continued_whatever_the_spelling_of_their_path() {
    let broker = Broker::start();
    let base = tempfile::tempdir().unwrap();
    let Some(expected) = produce_with_malformed(&broker, "spelled", base.path()) else { return };
    let dir = base.path().join("run");
    let sub = dir.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let absolute = dir.join("dead.tsv").display().to_string();
    let runs: [(&Path, &str, Option<u64>); 4] = [
        (&dir, "./dead.tsv", None),
        (&dir, "dead.tsv", Some(4)),
        (&sub, "../dead.tsv", Some(8)),
        (&dir, &absolute, Some(12)),
    ];
    for (cwd, spelled, resume_after) in runs {
        let mut extra = Vec::new();
        if let Some(step) = resume_after {
            keep_checkpoints_up_to(&dir, step);
            extra.push("--resume");
        }
        run_ok(online(&broker, "spelled", &dir, Some(spelled), &extra).current_dir(cwd));
        assert_eq!(dead_letter_files(&dir), [dir.join("dead.tsv")]);
        assert_each_once(&dir, &expected, &format!("--dead-letters {spelled} in {}", cwd.display()));
    }
}
