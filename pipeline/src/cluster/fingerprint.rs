//! What the processes of a cluster run must agree on, and the message naming
//! where they do not.
//!
//! A [`Fingerprint`] is an ordered list of `(setting, value)` pairs. It is
//! built from every key of [`TrainSettings`] (so a setting added later is
//! checked without being listed here) except [`MAY_DIFFER`], with the values
//! that name data files replaced by what the files are (format, file names and
//! sizes), so the same data mounted at different paths still agrees; the
//! resolved table sizes, the data's shape and the cluster's addresses are
//! added. The handshake puts the tiderec build first ([`with_build`]).
//!
//! `checkpoint_dir` is compared by its path, not by what it holds: worker 0
//! names the temporary directory of every checkpoint by its own path, and
//! every worker writes its shard there (see [`crate::checkpointing`]), so
//! every process must be given the same path; that the path is the same
//! directory on every host is checked apart ([`super::shared_dir`]).

use crate::config::{DataSpec, Resolved};
use crate::TrainSettings;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Settings that may legitimately differ between the processes of one run.
pub const MAY_DIFFER: &[&str] = &[
    // Who this process is, and where the hosts file lies.
    "process",
    "hosts",
    // Per-process outputs and their presentation.
    "metrics_json",
    "metrics_log",
    "tensorboard",
    "metrics_addr",
    "dead_letters",
    "progress",
    // Whether this process waits for each checkpoint's files; they are the same files.
    "checkpoint_sync",
    // How long this process waits for the others.
    "connect_timeout",
    // How much of its own machine's memory this process may use.
    "max_memory",
    // Where this process's workers compute: a model gives the same step on any device.
    "device",
];

/// `(setting, value)` pairs every process of a run must have equal.
pub type Fingerprint = Vec<(String, String)>;

/// The fingerprint of a `tiderec train` (or `online`) process with these settings.
pub fn of_train(settings: &TrainSettings, resolved: &Resolved) -> Fingerprint {
    let mut out = Fingerprint::new();
    // Through text, so `f32` settings read as written (0.01, not 0.009999999776482582).
    let value: serde_json::Value =
        serde_json::to_string(settings).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
    let keys: BTreeMap<String, serde_json::Value> = match value {
        serde_json::Value::Object(map) => map.into_iter().collect(),
        _ => BTreeMap::new(),
    };
    for (key, v) in keys {
        if MAY_DIFFER.contains(&key.as_str()) {
            continue;
        }
        let text = match key.as_str() {
            "data" => describe_data(&resolved.data),
            "eval" => resolved.eval.as_ref().map_or("none".into(), describe_data),
            "spec" => match &settings.data.spec {
                Some(s) if Path::new(s).is_file() => describe_files(&[PathBuf::from(s)]),
                Some(s) => s.clone(),
                None => "none".into(),
            },
            // Component by component and without `.`, so `ck/`, `./ck` and `ck` agree (whether
            // a relative path is one directory everywhere is the handshake's marker check).
            "checkpoint_dir" => settings.checkpoints.checkpoint_dir.as_ref().map_or("none".into(), |d| {
                let parts = d.components().filter(|c| !matches!(c, std::path::Component::CurDir));
                parts.collect::<PathBuf>().display().to_string()
            }),
            _ => compact(&v),
        };
        out.push((key, text));
    }
    out.push(("(resolved) data shape".into(), format!("{} dense, {} sparse", resolved.shape.0, resolved.shape.1)));
    out.push(("(resolved) table sizes".into(), format!("{:?}", resolved.table_sizes)));
    out.push(("(resolved) host addresses".into(), resolved.hosts.join(" ")));
    out
}

/// `print` with the build `identity` ([`super::build::identity`]) as its first entry, so
/// that processes of different builds see that difference first.
pub fn with_build(mut print: Fingerprint, identity: &str) -> Fingerprint {
    print.insert(0, (super::build::KEY.to_string(), identity.to_string()));
    print
}

/// A JSON value as one short line (strings without quotes).
fn compact(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "none".into(),
        other => other.to_string(),
    }
}

/// The data's format and its files (names and sizes, not paths).
fn describe_data(spec: &DataSpec) -> String {
    let files: Vec<PathBuf> = match spec {
        DataSpec::Synthetic | DataSpec::SyntheticBehavior => Vec::new(),
        DataSpec::Criteo(p)
        | DataSpec::Avazu(p)
        | DataSpec::Csv(p)
        | DataSpec::AmazonDien(p)
        | DataSpec::TaobaoBehavior(p)
        | DataSpec::TaobaoAd(p) => p.clone(),
        DataSpec::Parquet(p) => p.0.paths().map(Path::to_path_buf).collect(),
    };
    if files.is_empty() {
        spec.format().to_string()
    } else {
        format!("{}:{}", spec.format(), describe_files(&files))
    }
}

/// `name (N bytes, contents H)` of each file, comma-separated: `H` is the start of the
/// hash of the file's first and last MiB and its size (the checkpoints' input
/// fingerprint), so copies of one file that differ (shuffled lines, another day) differ.
fn describe_files(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|p| {
            let name = p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned());
            match tiderec_sinks::checkpoint::InputFile::of(p) {
                Ok(f) => format!("{name} ({} bytes, contents {})", f.bytes, &f.fingerprint[..12]),
                Err(_) => name,
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The settings on which `prints` (one per process, indexed by process) differ, one line
/// each: `setting: process 0 has A; process 1 has B` (processes with the same value are
/// grouped), and for the build `tiderec build: process 0 runs X; process 1 runs Y`, where a
/// process of a build older than this check, whose fingerprint has no build, runs "an
/// older build". Empty when all agree.
pub fn differences(prints: &[(usize, &Fingerprint)]) -> Vec<String> {
    let mut keys: Vec<&str> = Vec::new();
    for (_, f) in prints {
        for (k, _) in f.iter() {
            if !keys.contains(&k.as_str()) {
                keys.push(k);
            }
        }
    }
    let mut lines = Vec::new();
    for key in keys {
        // Value → the processes that have it, in order of first appearance.
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        let build = key == super::build::KEY;
        let absent = if build { "an older build (it names none)" } else { "(not set)" };
        for (process, f) in prints {
            let v = f.iter().find(|(k, _)| k == key).map_or_else(|| absent.to_string(), |(_, v)| v.clone());
            match groups.iter_mut().find(|(g, _)| *g == v) {
                Some((_, ps)) => ps.push(*process),
                None => groups.push((v, vec![*process])),
            }
        }
        if groups.len() > 1 {
            let parts: Vec<String> = groups
                .iter()
                .map(|(v, ps)| {
                    let who = ps.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
                    let (noun, verb) = match (ps.len() == 1, build) {
                        (true, false) => ("process", "has"),
                        (false, false) => ("processes", "have"),
                        (true, true) => ("process", "runs"),
                        (false, true) => ("processes", "run"),
                    };
                    format!("{noun} {who} {verb} {v}")
                })
                .collect();
            lines.push(format!("{key}: {}", parts.join("; ")));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn print(settings: &TrainSettings) -> Fingerprint {
        of_train(settings, &settings.validate().unwrap())
    }

    #[test]
    fn equal_settings_agree_and_per_process_ones_are_left_out() {
        let a = TrainSettings::default();
        let mut b = a.clone();
        b.run.progress = crate::progress::ProgressMode::None;
        b.run.metrics_json = Some("elsewhere.json".into());
        b.data.records.dead_letters = "other.tsv".into();
        assert!(differences(&[(0, &print(&a)), (1, &print(&b))]).is_empty());
    }

    #[test]
    fn every_differing_setting_is_named_with_both_values() {
        let a = TrainSettings::default();
        let mut b = a.clone();
        b.optimizer.lr = Some(0.01);
        b.run.seed = 7;
        let lines = differences(&[(0, &print(&a)), (1, &print(&b))]);
        assert!(lines.iter().any(|l| l.starts_with("lr: process 0 has none") && l.ends_with("process 1 has 0.01")));
        assert!(lines.iter().any(|l| l == "seed: process 0 has 42; process 1 has 7"), "{lines:?}");
        // The seed also changes the synthetic stream's table sizes.
        assert!(lines.iter().all(|l| l.starts_with("lr:") || l.starts_with("seed:") || l.starts_with("(resolved)")));
    }

    #[test]
    fn different_builds_are_named_first_with_what_each_process_runs() {
        let a = TrainSettings::default();
        let mut b = a.clone();
        b.run.seed = 7;
        let (pa, pb) = (print(&a), print(&b));
        let (x, y) =
            ("0.1.0 (build 000000000000000000000000000000aa)", "0.1.0 (build 000000000000000000000000000000bb)");
        let same = differences(&[(0, &with_build(pa.clone(), x)), (1, &with_build(pa.clone(), x))]);
        assert!(same.is_empty(), "{same:?}");
        let lines = differences(&[(0, &with_build(pa.clone(), x)), (1, &with_build(pb, y)), (2, &with_build(pa, y))]);
        assert_eq!(
            lines[0],
            "tiderec build: process 0 runs 0.1.0 (build 000000000000000000000000000000aa); processes 1, 2 run 0.1.0 \
             (build 000000000000000000000000000000bb)"
        );
        assert!(lines[1..].iter().any(|l| l.starts_with("seed: ")), "the settings follow: {lines:?}");
    }

    #[test]
    fn a_process_of_a_build_without_the_check_runs_an_older_build() {
        let p = print(&TrainSettings::default());
        let lines =
            differences(&[(0, &with_build(p.clone(), "0.2.0 (build 000000000000000000000000000000aa)")), (1, &p)]);
        assert_eq!(
            lines,
            ["tiderec build: process 0 runs 0.2.0 (build 000000000000000000000000000000aa); process 1 runs an older build (it \
              names none)"]
        );
    }

    #[test]
    fn the_checkpoint_directory_is_compared_by_its_path() {
        let mut a = TrainSettings::default();
        a.checkpoints.checkpoint_dir = Some("/shared/ck".into());
        let mut b = a.clone();
        b.checkpoints.checkpoint_dir = Some("/shared/ck/".into());
        assert!(differences(&[(0, &print(&a)), (1, &print(&b))]).is_empty(), "a trailing `/` is the same path");
        let (mut here, mut dot) = (a.clone(), a.clone());
        here.checkpoints.checkpoint_dir = Some("ck".into());
        dot.checkpoints.checkpoint_dir = Some("./ck/.".into());
        assert!(differences(&[(0, &print(&here)), (1, &print(&dot))]).is_empty(), "`./ck` is `ck`");
        b.checkpoints.checkpoint_dir = Some("/local/ck".into());
        let mut none = a.clone();
        none.checkpoints.checkpoint_dir = None;
        let lines = differences(&[(0, &print(&a)), (1, &print(&b)), (2, &print(&none))]);
        assert_eq!(lines, ["checkpoint_dir: process 0 has /shared/ck; process 1 has /local/ck; process 2 has none"]);
    }

    #[test]
    fn processes_with_the_same_value_are_grouped() {
        let a = TrainSettings::default();
        let mut b = a.clone();
        b.model.dim = 8;
        b.model.bottom = vec![64, 8];
        let (pa, pb) = (print(&a), print(&b));
        let lines = differences(&[(0, &pa), (1, &pb), (2, &pa)]);
        assert!(lines.contains(&"dim: processes 0, 2 have 16; process 1 has 8".to_string()), "{lines:?}");
    }
}
