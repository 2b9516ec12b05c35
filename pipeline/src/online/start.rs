//! Where a `--start latest` run began: the recorded start.
//!
//! `--start latest` starts a partition without a checkpointed offset at its end. Probed
//! again by every start, that end moves on with the topic: a run killed before its first
//! checkpoint and started again would begin at the new end, and the records produced
//! between the two starts would be neither trained nor dead-lettered. So the first start
//! decides, once, and the decision is kept in the checkpoint directory:
//!
//! * A run with `--start latest` and a checkpoint directory resolves the start of every
//!   partition without a checkpointed offset (each worker its own partitions), gathers
//!   them, and global worker 0 writes them to [`FILE_NAME`] in the checkpoint directory
//!   (written whole: a temporary file, fsynced, renamed, the directory fsynced) before
//!   any worker votes for the first step. No record is trained before the file is durable.
//! * The record names the topic, its partition count, and the step of the checkpoint the
//!   run resumed (`None`: a fresh run, the usual case). A later start that resumes the
//!   same step (or, like the first, no checkpoint) takes the recorded offsets for its
//!   partitions without a checkpointed offset, and says so in one line on stderr; a
//!   checkpoint's offsets always win. A record of another step is stale and ignored.
//! * The offsets are per partition, the whole topic's, so a start with another process
//!   or worker count reads them alike: each worker takes those of the partitions it owns.
//! * A record of the same step for another topic, or naming partitions the topic no
//!   longer has, is an error naming the file, never a silent start at the new end.
//!   Partitions added since start at their end and are added to the record.
//! * Once the run's first checkpoint is durable its offsets are the lineage's, and worker
//!   0 removes the file. A crash between the two leaves a record of an older step, which
//!   the next start ignores.
//! * `--start earliest` writes no record; it ignores one (with a warning), as it reads
//!   partitions without a checkpointed offset from their oldest records anyway.

use crate::PipelineError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The record's name in the checkpoint directory.
pub(super) const FILE_NAME: &str = "start-latest.json";

/// The version of the record's layout.
const VERSION: u32 = 1;

/// Where the partitions of a `--start latest` run without a checkpointed offset began.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct StartRecord {
    /// The layout ([`VERSION`]).
    pub version: u32,
    /// The topic.
    pub topic: String,
    /// The topic's partitions when the record was written.
    pub partitions: usize,
    /// The step of the checkpoint the run resumed (`None`: it resumed none).
    pub after_step: Option<u64>,
    /// The processes of the run that wrote it (for the reader's information: the offsets
    /// are per partition, and any process count reads them).
    pub processes: usize,
    /// The workers per process of the run that wrote it (the same).
    pub workers: usize,
    /// Partition → its first offset.
    pub offsets: BTreeMap<i32, i64>,
}

impl StartRecord {
    /// The record of a run on `topic` (`partitions` partitions) that resumed the checkpoint
    /// of `after_step` (`None`: none) with `(processes, workers)`, whose partitions without
    /// a checkpointed offset start at `offsets`.
    pub fn new(
        topic: &str,
        partitions: usize,
        after_step: Option<u64>,
        (processes, workers): (usize, usize),
        offsets: BTreeMap<i32, i64>,
    ) -> Self {
        StartRecord { version: VERSION, topic: topic.to_string(), partitions, after_step, processes, workers, offsets }
    }
}

/// The record's path in the checkpoint directory `dir`.
pub(super) fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// The record in `dir`, if there is one. A file that cannot be read or is not a record is
/// an error naming it (it is written whole, so only another hand can have changed it).
pub(super) fn load(dir: &Path) -> Result<Option<StartRecord>, PipelineError> {
    let path = path(dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unreadable(&path, &e.to_string())),
    };
    let record: StartRecord = serde_json::from_str(&text).map_err(|e| unreadable(&path, &e.to_string()))?;
    if record.version != VERSION {
        return Err(unreadable(&path, &format!("layout version {} (this build reads {VERSION})", record.version)));
    }
    if let Some((p, o)) = record.offsets.iter().find(|(&p, &o)| p < 0 || p as usize >= record.partitions || o < 0) {
        return Err(unreadable(
            &path,
            &format!("partition {p} at offset {o} is not one of its {} partitions", record.partitions),
        ));
    }
    Ok(Some(record))
}

fn unreadable(path: &Path, why: &str) -> PipelineError {
    PipelineError::config(
        "start",
        format!(
            "{} is not a readable record of where a `--start latest` run began ({why}); it keeps the records \
             produced since that start from being skipped: restore it, or remove it to start at the partitions' \
             current ends",
            path.display()
        ),
    )
}

/// The recorded offsets a run on `topic` (with `partitions` partitions now) that resumed the
/// checkpoint of `after_step` starts its partitions without a checkpointed offset from:
/// `None` when the record is of another step (stale); an error when it is of this step but
/// of another topic, or of partitions the topic no longer has.
pub(super) fn applicable<'a>(
    record: &'a StartRecord,
    dir: &Path,
    topic: &str,
    partitions: usize,
    after_step: Option<u64>,
) -> Result<Option<&'a BTreeMap<i32, i64>>, PipelineError> {
    if record.after_step != after_step {
        return Ok(None);
    }
    let file = path(dir);
    if record.topic != topic {
        return Err(PipelineError::config(
            "topic",
            format!(
                "{} records where a `--start latest` run on topic `{}` began, which wrote no checkpoint since; this \
                 run reads `{topic}`: run on `{}` to train the records produced since that start, or give another \
                 --checkpoint-dir (or remove the file) to start afresh",
                file.display(),
                record.topic,
                record.topic
            ),
        ));
    }
    let highest = record.offsets.keys().next_back().map_or(0, |&p| p as usize + 1);
    if record.partitions.max(highest) > partitions {
        return Err(PipelineError::config(
            "start",
            format!(
                "{} records where a `--start latest` run began on {} partitions of topic `{topic}`, which now has \
                 {partitions}: the topic was re-created or lost partitions, and the records of the missing ones are \
                 not on the broker; remove the file to start at the partitions' current ends",
                file.display(),
                record.partitions
            ),
        ));
    }
    Ok(Some(&record.offsets))
}

/// The one line a run starting from the recorded `offsets` (in `dir`) prints.
pub(super) fn resumed_line(dir: &Path, offsets: &BTreeMap<i32, i64>) -> String {
    const SHOWN: usize = 8;
    let mut list: Vec<String> = offsets.iter().take(SHOWN).map(|(p, o)| format!("{p} at {o}")).collect();
    if offsets.len() > SHOWN {
        list.push(format!("… {} more", offsets.len() - SHOWN));
    }
    format!(
        "--start latest: partitions without a checkpointed offset start where the first start without a checkpoint \
         found the topic's end, recorded in {} (partition {})",
        path(dir).display(),
        list.join(", ")
    )
}

/// Writes `record` to `dir` whole: a temporary file beside it, fsynced, renamed over it,
/// the directory fsynced; a failure leaves the previous record (or none) in place.
pub(super) fn write(dir: &Path, record: &StartRecord) -> Result<(), PipelineError> {
    let path = path(dir);
    let tmp = tiderec_sinks::temp::temp_beside(&path);
    let io = |source| PipelineError::Sink(tiderec_sinks::SinkError::Io { path: path.display().to_string(), source });
    let json = serde_json::to_vec_pretty(record).map_err(|e| io(std::io::Error::other(e)))?;
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(&json)?;
        f.write_all(b"\n")?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|_| std::fs::rename(&tmp, &path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    tiderec_sinks::checkpoint::write::sync_dir(dir)?;
    Ok(())
}

/// Removes the record from `dir`, once a checkpoint holds the offsets (a warning when it
/// cannot: a record left of an older step is ignored by later starts).
pub(super) fn remove(dir: &Path) {
    let path = path(dir);
    let removed = match std::fs::remove_file(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => Err(tiderec_sinks::SinkError::Io { path: path.display().to_string(), source: e }),
        Ok(()) => tiderec_sinks::checkpoint::write::sync_dir(dir),
    };
    if let Err(e) = removed {
        eprintln!(
            "warning: {} stays ({e}); a checkpoint holds the offsets now, and later starts ignore it",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(after_step: Option<u64>) -> StartRecord {
        StartRecord {
            version: VERSION,
            topic: "clicks".into(),
            partitions: 2,
            after_step,
            processes: 2,
            workers: 1,
            offsets: BTreeMap::from([(0, 500), (1, 480)]),
        }
    }

    #[test]
    fn a_record_is_written_whole_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), None);
        write(dir.path(), &record(None)).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(record(None)));
        let names: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names, vec![FILE_NAME.to_string()], "no temporary file is left");
        write(dir.path(), &record(Some(40))).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(record(Some(40))), "replaced whole");
        remove(dir.path());
        assert_eq!(load(dir.path()).unwrap(), None);
        remove(dir.path());
    }

    #[test]
    fn a_damaged_record_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path(dir.path()), "{\"version\": 1, \"topic\": ").unwrap();
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(e.contains(FILE_NAME) && e.contains("`start`"), "{e}");
        let mut bad = record(None);
        bad.offsets.insert(2, 7);
        std::fs::write(path(dir.path()), serde_json::to_string(&bad).unwrap()).unwrap();
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("partition 2 at offset 7"), "{e}");
    }

    #[test]
    fn a_record_of_this_step_applies_and_one_of_another_step_is_ignored() {
        let dir = Path::new("/ck");
        let r = record(None);
        assert_eq!(applicable(&r, dir, "clicks", 2, None).unwrap(), Some(&r.offsets));
        assert_eq!(applicable(&r, dir, "clicks", 3, None).unwrap(), Some(&r.offsets), "partitions added");
        assert_eq!(applicable(&r, dir, "clicks", 2, Some(10)).unwrap(), None);
        assert_eq!(applicable(&r, dir, "other", 1, Some(10)).unwrap(), None, "stale: not judged");
        let r = record(Some(10));
        assert_eq!(applicable(&r, dir, "clicks", 2, Some(10)).unwrap(), Some(&r.offsets));
        assert_eq!(applicable(&r, dir, "clicks", 2, None).unwrap(), None);
    }

    #[test]
    fn another_topic_or_lost_partitions_are_refused_naming_the_file() {
        let dir = Path::new("/ck");
        let r = record(None);
        let e = applicable(&r, dir, "views", 2, None).unwrap_err().to_string();
        assert!(e.contains("/ck/start-latest.json") && e.contains("`clicks`") && e.contains("`views`"), "{e}");
        let e = applicable(&r, dir, "clicks", 1, None).unwrap_err().to_string();
        assert!(e.contains("/ck/start-latest.json") && e.contains("on 2 partitions") && e.contains("now has 1"), "{e}");
    }

    #[test]
    fn the_line_names_the_file_and_the_offsets() {
        let line = resumed_line(Path::new("/ck"), &record(None).offsets);
        assert!(line.contains("/ck/start-latest.json") && line.contains("partition 0 at 500, 1 at 480"), "{line}");
        let many: BTreeMap<i32, i64> = (0..10).map(|p| (p, 5)).collect();
        assert!(resumed_line(Path::new("/ck"), &many).ends_with("7 at 5, … 2 more)"));
    }
}
