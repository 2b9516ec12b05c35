//! `train --tensorboard DIR` resumed from a checkpoint: the events are read back from the
//! event files (`tiderec::tensorboard::read_events`), each `(tag, step)` once.

mod common;

use common::{run_ok, tiderec};
use std::collections::BTreeMap;
use std::path::Path;
use tiderec::tensorboard::{is_event_file_name, read_events};

/// `(tag, step)` → the values of the scalars of every event file in `dir` (one each when
/// nothing repeats), and how many event files there are.
fn scalars(dir: &Path) -> (BTreeMap<(String, u64), Vec<f32>>, usize) {
    let (mut out, mut files) = (BTreeMap::new(), 0);
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !is_event_file_name(&name) {
            continue;
        }
        files += 1;
        for event in read_events(&dir.join(&name)).unwrap() {
            for (tag, value) in event.scalars {
                out.entry((tag, event.step)).or_insert_with(Vec::new).push(value);
            }
        }
    }
    (out, files)
}

#[test]
fn a_resumed_run_writes_each_tag_and_step_once_and_keeps_the_events_up_to_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (tb, ck, log) = (dir.path().join("tb"), dir.path().join("ck"), dir.path().join("steps.jsonl"));
    let train = |extra: &[&str]| {
        let mut cmd = tiderec();
        cmd.current_dir(dir.path())
            .args(["train", "--samples", "10240", "--batch-size", "256", "--eval-fraction", "0", "--buckets"])
            .args(["20000", "--seed", "11", "--progress", "none", "--steps", "8", "--checkpoint-every", "5"])
            .arg("--checkpoint-dir")
            .arg(&ck)
            .arg("--tensorboard")
            .arg(&tb)
            .arg("--metrics-log")
            .arg(&log)
            .args(extra);
        run_ok(&mut cmd)
    };
    // A run checkpointed at step 5 logs on to step 8; its checkpoint of step 8 never made it
    // (killed first, say), so the resumed run starts after step 5 and logs steps 6 to 8 again.
    train(&[]);
    let (first, files) = scalars(&tb);
    assert_eq!(files, 1);
    let steps: Vec<u64> = first.keys().filter(|(tag, _)| tag == "train/loss").map(|(_, s)| *s).collect();
    assert!(steps.first() == Some(&1) && steps.last() == Some(&8), "{steps:?}");
    assert!(first.values().all(|v| v.len() == 1), "{first:?}");
    std::fs::remove_dir_all(ck.join("ckpt-8")).unwrap();
    // A file beside the events that is none of tiderec's stays as it is.
    let foreign = tb.join("events.out.tfevents.1.elsewhere");
    std::fs::write(&foreign, b"not ours").unwrap();

    let out = train(&["--resume"]);
    let (resumed, files) = scalars(&tb);
    assert_eq!(files, 2, "the resumed run's own file beside the first");
    let repeated: Vec<_> = resumed.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(repeated.is_empty(), "each (tag, step) once: {repeated:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("after step 5 from 1 file(s), which the resumed run writes again"), "{stderr}");
    let kept: BTreeMap<_, _> = first.iter().filter(|((_, step), _)| *step <= 5).collect();
    let now: BTreeMap<_, _> = resumed.iter().filter(|((_, step), _)| *step <= 5).collect();
    assert!(!kept.is_empty());
    assert_eq!(now, kept, "the events up to the checkpoint stay, with their values");
    let steps: Vec<u64> = resumed.keys().filter(|(tag, _)| tag == "train/loss").map(|(_, s)| *s).collect();
    assert_eq!(steps.last(), Some(&8), "{steps:?}");
    assert_eq!(std::fs::read(&foreign).unwrap(), b"not ours");
    let names: Vec<_> = std::fs::read_dir(&tb).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 3, "no temporary file left: {names:?}");
}
