//! Cutting the event files of a directory back to a step, for a resumed run (see the
//! parent module's invariants): only this module's files, each rewritten whole beside
//! itself and renamed over itself, records that cannot be read as events kept as they are.

use super::read::{event_step, Framed, Records};
use crate::PipelineError;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Whether `name` is that of an event file this module writes
/// (`events.out.tfevents.<seconds>.<host>.<pid>.<n>.tiderec`).
pub fn is_event_file_name(name: &str) -> bool {
    name.strip_prefix("events.out.tfevents.").and_then(|rest| rest.strip_suffix(".tiderec")).is_some_and(|id| {
        let parts: Vec<&str> = id.split('.').collect();
        parts.len() == 4
            && !parts[1].is_empty()
            && [parts[0], parts[2], parts[3]].iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// What [`cut_after`] did to the event files of a directory.
#[derive(Debug, Default, PartialEq)]
pub struct Cut {
    /// Files rewritten (with an event after the step).
    pub files: usize,
    /// Events removed (their step was after the cut).
    pub dropped: u64,
    /// Files with bytes that are no record (a length whose CRC fails), and where those
    /// bytes start: what follows is kept as it is.
    pub unframed: Vec<(PathBuf, usize)>,
}

/// Removes from the event files in `dir` ([`is_event_file_name`]; other files, links and
/// directories are left alone) the events of steps after `step`, keeping every other
/// record (the version event, the events of steps `≤ step`, records whose data fails its
/// CRC or is no event) as it is, in order. A file is rewritten only when an event goes:
/// whole, into a temporary file beside it (a name without `tfevents`, so TensorBoard never
/// reads it) that is synced and renamed over it (the directory synced too), so an interrupt
/// or a full disk leaves it as it was. A record cut short at the end (a killed writer) is
/// left out of a rewritten file; bytes that are no record are kept, with what follows them.
/// A missing `dir` has nothing to cut.
pub fn cut_after(dir: &Path, step: u64) -> Result<Cut, PipelineError> {
    let error = |what: &str, p: &Path, e: std::io::Error| {
        PipelineError::config("tensorboard", format!("cannot {what} {}: {e}", p.display()))
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Cut::default()),
        Err(e) => return Err(error("read", dir, e)),
    };
    let mut paths = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| error("read", dir, e))?;
        let is_file = entry.file_type().map_err(|e| error("read", &entry.path(), e))?.is_file();
        if is_file && entry.file_name().to_str().is_some_and(is_event_file_name) {
            paths.push(entry.path());
        }
    }
    paths.sort();
    let mut cut = Cut::default();
    for path in paths {
        let bytes = std::fs::read(&path).map_err(|e| error("read", &path, e))?;
        let records = Records::new(&bytes);
        let (mut kept, mut dropped) = (Vec::with_capacity(bytes.len()), 0u64);
        let mut rest = None;
        for record in records {
            match record {
                Framed::Record { bytes, data, data_crc_ok } => {
                    if data_crc_ok && event_step(data).is_some_and(|s| s > step) {
                        dropped += 1;
                    } else {
                        kept.extend_from_slice(bytes);
                    }
                }
                Framed::Short => {}
                Framed::Unframed { at } => rest = Some(at),
            }
        }
        if let Some(at) = rest {
            kept.extend_from_slice(&bytes[at..]);
            cut.unframed.push((path.clone(), at));
        }
        if dropped == 0 {
            continue;
        }
        replace(&path, &kept).map_err(|(what, p, e)| error(what, &p, e))?;
        cut.files += 1;
        cut.dropped += dropped;
    }
    if cut.files > 0 {
        tiderec_sinks::checkpoint::write::sync_dir(dir)?;
    }
    Ok(cut)
}

/// Replaces the file at `path` with `bytes` (its permissions kept): written to a temporary
/// file beside it, synced, and renamed over it; the temporary file is removed on failure.
fn replace(path: &Path, bytes: &[u8]) -> Result<(), (&'static str, PathBuf, std::io::Error)> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let id = name.strip_prefix("events.out.tfevents.").unwrap_or(name);
    let tmp = path.with_file_name(format!(".cut-{}-{id}", std::process::id()));
    let written = (|| {
        let permissions = std::fs::metadata(path).map_err(|e| ("read", path.to_path_buf(), e))?.permissions();
        let mut file = std::fs::File::create(&tmp).map_err(|e| ("create", tmp.clone(), e))?;
        file.write_all(bytes).map_err(|e| ("write", tmp.clone(), e))?;
        file.set_permissions(permissions).map_err(|e| ("write", tmp.clone(), e))?;
        file.sync_all().map_err(|e| ("write", tmp.clone(), e))?;
        std::fs::rename(&tmp, path).map_err(|e| ("replace", path.to_path_buf(), e))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
