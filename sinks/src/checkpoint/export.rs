//! Serving snapshots (`tiderec export`): the model of a checkpoint without
//! its optimizer state, in one safetensors file plus its description.
//!
//! `model.safetensors` holds named tensors, F32 values and U64 ids (the caller
//! names them, each name once: the dense layers with PyTorch's names and layouts, one
//! embedding table per field, `[rows, dim]` with row `i` = id `i`, or its trained rows
//! and their ids); `model.json` holds the
//! description the caller builds (model kind, every tensor's shape, the
//! forward computation, the feature pipeline). Both are written to
//! temporary names of this process's own in the directory
//! ([`temp_beside`]: `.model.safetensors.tmp-<pid>`, `.model.json.tmp-<pid>`), fsynced
//! and renamed, so a reader never sees a partly written file, and neither a stray file
//! of another name (one a killed run left) nor a concurrent run's temporary file is
//! written, refused or removed; a failed write (a full disk) removes this run's
//! temporary files, and the directory when the write created it.
//!
//! `model.json` marks a complete snapshot: it is moved into place last, so a crash at
//! any moment leaves either a complete pair or a directory without `model.json`,
//! never the description of one snapshot beside the tensors of another. The
//! directory is fsynced after the renames. How a snapshot already there is treated:
//!
//! * [`write_serving`] replaces it: the old `model.json` is removed (the removal made
//!   durable) before its `model.safetensors` is replaced.
//! * [`write_serving_staged`] without `overwrite` replaces nothing, whenever it
//!   appeared: the snapshot is written whole into a staging directory of this
//!   process's own inside the target (`.export.tmp-<pid>`), then each file is moved
//!   into place only if nothing is at its name ([`commit_new`]), `model.safetensors`
//!   first; a `model.json` found there at the end removes the `model.safetensors` this
//!   run just moved in, so nothing of the run stays beside it. Either way the
//!   conflict is [`StagedError::Exists`]. With `overwrite` it replaces as
//!   [`write_serving`] does.
//!
//! A staging directory outlives its run only when the process is killed;
//! [`remove_stale_staging`] removes those of dead processes, on the caller's request
//! (`tiderec export` asks before each export), and no other file.

use super::tensors::write;
use super::write::{sync_dir, sync_parent};
use crate::temp::{commit_new, temp_beside};
use crate::SinkError;
use std::collections::HashMap;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

/// File names of a serving snapshot.
pub const MODEL_FILE: &str = "model.safetensors";
/// Its configuration.
pub const CONFIG_FILE: &str = "model.json";
/// The staging directory of [`write_serving_staged`] in the target, before [`temp_beside`]'s
/// per-process suffix.
const STAGING: &str = ".export";

pub use super::tensors::{Tensor, Values};

/// Writes `dir/model.safetensors` (the `tensors`, in this order) and
/// `dir/model.json` (`config`), replacing a snapshot there, see the module docs. A tensor
/// whose shape does not match its values, or whose name another tensor has, is an error
/// naming it, before anything is written.
pub fn write_serving(dir: &Path, tensors: &[Tensor<'_>], config: &serde_json::Value) -> Result<(), SinkError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| SinkError::Io { path: path.clone(), source }
    };
    if let Some(t) = tensors.iter().find(|t| t.shape.iter().product::<usize>() != t.values.len()) {
        return Err(SinkError::Checkpoint {
            path: dir.join(MODEL_FILE).display().to_string(),
            reason: format!("tensor {} has shape {:?} but {} values", t.name, t.shape, t.values.len()),
        });
    }
    let created = !dir.exists();
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let (tmp_model, tmp_config) = temporary_names(dir);
    let written = write_both(tensors, config, &tmp_model, &tmp_config)
        .and_then(|()| commit(dir, &tmp_model, &tmp_config, true).map_err(Commit::into_sink));
    if written.is_err() {
        // Nothing half-written stays: this run's temporary files, and the directory if this
        // call made it.
        let _ = std::fs::remove_file(&tmp_model);
        let _ = std::fs::remove_file(&tmp_config);
        if created {
            let _ = std::fs::remove_dir_all(dir);
        }
        return written;
    }
    // A directory this call made is made durable in its parent too; the export in it is
    // complete, so a failure here leaves it in place.
    if created {
        sync_parent(dir)?;
    }
    Ok(())
}

/// Why [`write_serving_staged`] left no snapshot of its own in the target.
#[derive(Debug, thiserror::Error)]
pub enum StagedError<E> {
    /// A file of the snapshot is in the target (without `overwrite`): it was there before,
    /// or appeared while the snapshot was written; it is left as it is.
    #[error("{} already exists", .path.display())]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// The caller's write of the snapshot into the staging directory failed.
    #[error(transparent)]
    Write(E),
    /// Making the target or moving the snapshot into it failed.
    #[error(transparent)]
    Sink(#[from] SinkError),
}

/// Writes a serving snapshot into `dir` by way of a staging directory: `write` is given
/// a fresh directory of this process's own inside `dir` and writes the snapshot there
/// (with [`write_serving`]); then its two files are moved into `dir`, replacing a
/// snapshot there only with `overwrite` (see the module docs). Returns what `write`
/// returns. On any error nothing of this run stays: the staging directory is removed,
/// and `dir` too when this call made it and it is empty.
pub fn write_serving_staged<T, E>(
    dir: &Path,
    overwrite: bool,
    write: impl FnOnce(&Path) -> Result<T, E>,
) -> Result<T, StagedError<E>> {
    let io = |source| SinkError::Io { path: dir.display().to_string(), source };
    let created = !dir.exists();
    std::fs::create_dir_all(dir).map_err(io)?;
    let staging = temp_beside(&dir.join(STAGING));
    // The name holds this process's id: one there is a dead run's that had the same id.
    let _ = std::fs::remove_dir_all(&staging);
    let done = match write(&staging) {
        Ok(value) => match commit(dir, &staging.join(MODEL_FILE), &staging.join(CONFIG_FILE), overwrite) {
            Ok(()) => Ok(value),
            Err(Commit::Exists(path)) => Err(StagedError::Exists { path }),
            Err(Commit::Failed(e)) => Err(StagedError::Sink(e)),
        },
        Err(e) => Err(StagedError::Write(e)),
    };
    let _ = std::fs::remove_dir_all(&staging);
    match done {
        Ok(value) => {
            if created {
                sync_parent(dir)?;
            }
            Ok(value)
        }
        Err(e) => {
            if created {
                // Only when empty: another run may have written into it meanwhile.
                let _ = std::fs::remove_dir(dir);
            }
            Err(e)
        }
    }
}

/// The staging directories of killed exports found in a target by [`remove_stale_staging`].
#[derive(Debug, Default)]
pub struct StaleStaging {
    /// Those removed.
    pub removed: Vec<PathBuf>,
    /// Those that could not be removed, and why.
    pub failed: Vec<SinkError>,
}

/// Removes from `dir` the staging directories [`write_serving_staged`] left when its process
/// was killed: a directory (not a link) named exactly `.export.tmp-<pid>` whose process is
/// gone. Nothing else is touched: not another name, not this process's own, and not one
/// whose process lives (a concurrent export) or whose liveness cannot be told (without
/// Linux's `/proc`, every process counts as alive). A `dir` that cannot be listed has none.
pub fn remove_stale_staging(dir: &Path) -> StaleStaging {
    let mut stale = StaleStaging::default();
    let Ok(entries) = std::fs::read_dir(dir) else { return stale };
    for entry in entries.flatten() {
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let pid = entry.file_name().to_str().and_then(staging_pid);
        if !(is_dir && pid.is_some_and(|pid| pid != std::process::id() && process_is_gone(pid))) {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_dir_all(&path) {
            Ok(()) => stale.removed.push(path),
            Err(source) => stale.failed.push(SinkError::Io { path: path.display().to_string(), source }),
        }
    }
    stale
}

/// The process id of a staging directory's name, as [`temp_beside`] spells it
/// (`.export.tmp-<pid>`, the pid in decimal without leading zeros).
fn staging_pid(name: &str) -> Option<u32> {
    let digits = name.strip_prefix(STAGING)?.strip_prefix(".tmp-")?;
    let pid: u32 = digits.parse().ok()?;
    (pid > 0 && pid.to_string() == digits).then_some(pid)
}

/// Whether no process has id `pid`: `/proc/<pid>` is absent while `/proc` is mounted.
#[cfg(target_os = "linux")]
fn process_is_gone(pid: u32) -> bool {
    let absent = |p: &str| std::fs::symlink_metadata(p).is_err_and(|e| e.kind() == ErrorKind::NotFound);
    !absent("/proc/self") && absent(&format!("/proc/{pid}"))
}

/// Elsewhere a process's liveness is not told: every one counts as alive.
#[cfg(not(target_os = "linux"))]
fn process_is_gone(_pid: u32) -> bool {
    false
}

/// This process's temporary names for the two files in `dir`.
fn temporary_names(dir: &Path) -> (PathBuf, PathBuf) {
    (temp_beside(&dir.join(format!(".{MODEL_FILE}"))), temp_beside(&dir.join(format!(".{CONFIG_FILE}"))))
}

/// The writes of [`write_serving`]: both files under their temporary names.
fn write_both(
    tensors: &[Tensor<'_>],
    config: &serde_json::Value,
    tmp_model: &Path,
    tmp_config: &Path,
) -> Result<(), SinkError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| SinkError::Io { path: path.clone(), source }
    };
    // The names hold this process's id: files there are a dead run's that had the same id.
    let _ = std::fs::remove_file(tmp_model);
    let metadata = HashMap::from([("format".to_string(), "tiderec-serving".to_string())]);
    write(tmp_model, tensors, metadata)?;
    let text = serde_json::to_string_pretty(config)
        .map_err(|e| SinkError::Checkpoint { path: tmp_config.display().to_string(), reason: e.to_string() })?;
    let mut f = std::fs::File::create(tmp_config).map_err(io(tmp_config))?;
    f.write_all(text.as_bytes()).and_then(|_| f.sync_all()).map_err(io(tmp_config))
}

/// Why [`commit`] moved nothing into place (or took back what it moved).
#[derive(Debug)]
enum Commit {
    /// The file at this path was there, and was not to be replaced.
    Exists(PathBuf),
    /// Anything else.
    Failed(SinkError),
}

impl Commit {
    /// As a [`SinkError`]: an existing file is an [`ErrorKind::AlreadyExists`] one.
    fn into_sink(self) -> SinkError {
        match self {
            Commit::Exists(path) => {
                SinkError::Io { path: path.display().to_string(), source: ErrorKind::AlreadyExists.into() }
            }
            Commit::Failed(e) => e,
        }
    }
}

impl From<SinkError> for Commit {
    fn from(e: SinkError) -> Self {
        Commit::Failed(e)
    }
}

/// Moves the finished files `model` and `config` to `dir/model.safetensors` and
/// `dir/model.json`, `model.json` last; `replace`: over the files there, the old
/// `model.json` removed for good first; otherwise never over a file (see the module docs).
/// Then fsyncs `dir`. The sources left behind on an error are the caller's to remove.
fn commit(dir: &Path, model: &Path, config: &Path, replace: bool) -> Result<(), Commit> {
    let (model_path, config_path) = (dir.join(MODEL_FILE), dir.join(CONFIG_FILE));
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| Commit::Failed(SinkError::Io { path: path.clone(), source })
    };
    if replace {
        match std::fs::remove_file(&config_path) {
            Ok(()) => sync_dir(dir)?,
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(source) => return Err(io(&config_path)(source)),
        }
        std::fs::rename(model, &model_path).map_err(io(&model_path))?;
        std::fs::rename(config, &config_path).map_err(io(&config_path))?;
        return Ok(sync_dir(dir)?);
    }
    // A description already there is refused before the tensors move in beside it.
    if std::fs::symlink_metadata(&config_path).is_ok() {
        return Err(Commit::Exists(config_path));
    }
    let ours = identity(model);
    match commit_new(model, &model_path) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => return Err(Commit::Exists(model_path)),
        Err(source) => return Err(io(&model_path)(source)),
    }
    if let Err(e) = commit_new(config, &config_path) {
        // The tensors just moved in go again, unless another run has replaced them since.
        if ours.is_some() && identity(&model_path) == ours {
            let _ = std::fs::remove_file(&model_path);
        }
        let _ = sync_dir(dir);
        return Err(match e.kind() {
            ErrorKind::AlreadyExists => Commit::Exists(config_path),
            _ => io(&config_path)(e),
        });
    }
    Ok(sync_dir(dir)?)
}

/// The device and inode of the file at `path` (`None`: it cannot be read).
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Named tensors and the description land under their final names, the
    /// temporary ones gone; a tensor whose shape does not match its values is
    /// refused by name before anything is written.
    #[test]
    fn writes_named_tensors_and_refuses_a_wrong_shape() {
        let dir = tempfile::tempdir().unwrap();
        let w = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let t = |name: &str, shape: Vec<usize>| Tensor { name: name.into(), shape, values: Values::F32(&w) };
        let out = dir.path().join("serve");
        write_serving(&out, &[t("bottom.0.weight", vec![2, 3])], &serde_json::json!({"kind": "dlrm"})).unwrap();
        let names: Vec<String> =
            std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        let bytes = std::fs::read(out.join(MODEL_FILE)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("bottom.0.weight").unwrap().shape(), [2, 3]);
        let bad = dir.path().join("bad");
        let e = write_serving(&bad, &[t("top.0.weight", vec![4, 2])], &serde_json::json!({})).unwrap_err();
        assert!(e.to_string().contains("top.0.weight") && e.to_string().contains("6 values"), "{e}");
        assert!(!bad.exists());
    }

    /// A snapshot written over another replaces both files; one whose tensors cannot take
    /// their name (here a directory holds it) leaves no `model.json`, the old one removed
    /// first, so the old description never stands beside other tensors.
    #[test]
    fn a_replaced_snapshot_loses_its_description_before_its_tensors() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("serve");
        let (a, b) = ([1.0f32, 2.0], [3.0f32, 4.0]);
        fn t(w: &[f32]) -> [Tensor<'_>; 1] {
            [Tensor { name: "w".into(), shape: vec![2], values: Values::F32(w) }]
        }
        write_serving(&out, &t(&a), &serde_json::json!({"kind": "a"})).unwrap();
        write_serving(&out, &t(&b), &serde_json::json!({"kind": "b"})).unwrap();
        let config = std::fs::read_to_string(out.join(CONFIG_FILE)).unwrap();
        assert!(config.contains("\"b\""), "{config}");
        let bytes = std::fs::read(out.join(MODEL_FILE)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("w").unwrap().data(), le_bytes(&b));
        std::fs::remove_file(out.join(MODEL_FILE)).unwrap();
        std::fs::create_dir_all(out.join(MODEL_FILE).join("held")).unwrap();
        assert!(write_serving(&out, &t(&a), &serde_json::json!({"kind": "c"})).is_err());
        let mut names: Vec<String> =
            std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, [MODEL_FILE], "no description, no temporary file");
    }

    /// The names in `dir`, sorted.
    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    /// Files under the temporary names of another run (or of a killed one) are neither in
    /// the way nor removed, by a write that succeeds or by one that fails.
    #[test]
    fn files_under_other_temporary_names_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("serve");
        std::fs::create_dir(&out).unwrap();
        let strays = [".model.safetensors.tmp", ".model.json.tmp", ".model.safetensors.tmp-1", ".export.tmp-1"];
        for name in strays {
            std::fs::write(out.join(name), name).unwrap();
        }
        let w = [1.0f32, 2.0];
        let t = [Tensor { name: "w".into(), shape: vec![2], values: Values::F32(&w) }];
        write_serving(&out, &t, &serde_json::json!({"kind": "a"})).unwrap();
        let bad = [Tensor { name: "w".into(), shape: vec![3], values: Values::F32(&w) }];
        assert!(write_serving(&out, &bad, &serde_json::json!({})).is_err());
        std::fs::remove_file(out.join(CONFIG_FILE)).unwrap();
        std::fs::remove_file(out.join(MODEL_FILE)).unwrap();
        write_serving_staged(&out, false, |staging| write_serving(staging, &t, &serde_json::json!({"kind": "b"})))
            .unwrap();
        let mut want: Vec<String> = strays.iter().map(|s| s.to_string()).collect();
        want.extend([CONFIG_FILE.to_string(), MODEL_FILE.to_string()]);
        want.sort();
        assert_eq!(listing(&out), want);
        for name in strays {
            assert_eq!(std::fs::read_to_string(out.join(name)).unwrap(), name);
        }
    }

    /// Without `overwrite`, a file that appears at either name after the export starts and
    /// before its commit is kept as it is and refused by name; nothing of the run stays.
    /// With `overwrite`, the snapshot there is replaced.
    #[test]
    fn a_file_that_appears_before_the_commit_is_kept_and_refused() {
        let dir = tempfile::tempdir().unwrap();
        let w = [1.0f32, 2.0];
        let t = [Tensor { name: "w".into(), shape: vec![2], values: Values::F32(&w) }];
        for name in [CONFIG_FILE, MODEL_FILE] {
            let out = dir.path().join(format!("serve-{name}"));
            let e = write_serving_staged(&out, false, |staging| {
                write_serving(staging, &t, &serde_json::json!({"kind": "a"}))?;
                std::fs::write(out.join(name), "the user's file")
                    .map_err(|source| SinkError::Io { path: name.to_string(), source })
            })
            .unwrap_err();
            assert!(matches!(&e, StagedError::Exists { path } if path == &out.join(name)), "{e:?}");
            assert!(e.to_string().contains(name), "{e}");
            assert_eq!(std::fs::read_to_string(out.join(name)).unwrap(), "the user's file");
            assert_eq!(listing(&out), [name], "only the user's file");
            // A snapshot already there is refused too, and replaced with `overwrite`.
            std::fs::remove_file(out.join(name)).unwrap();
            write_serving_staged(&out, false, |s| write_serving(s, &t, &serde_json::json!({"kind": "a"}))).unwrap();
            let e = write_serving_staged(&out, false, |s| write_serving(s, &t, &serde_json::json!({"kind": "b"})))
                .unwrap_err();
            assert!(matches!(e, StagedError::Exists { .. }), "{e:?}");
            assert!(std::fs::read_to_string(out.join(CONFIG_FILE)).unwrap().contains("\"a\""));
            write_serving_staged(&out, true, |s| write_serving(s, &t, &serde_json::json!({"kind": "b"}))).unwrap();
            assert!(std::fs::read_to_string(out.join(CONFIG_FILE)).unwrap().contains("\"b\""));
            assert_eq!(listing(&out), [CONFIG_FILE, MODEL_FILE]);
        }
    }

    /// The commit itself, on files written before a `model.json` appeared: refused, the
    /// file kept, the written files left to the caller; and tensors that moved in are
    /// taken back when their description cannot follow.
    #[test]
    fn the_commit_never_leaves_tensors_without_their_description() {
        let dir = tempfile::tempdir().unwrap();
        let w = [1.0f32, 2.0];
        let t = [Tensor { name: "w".into(), shape: vec![2], values: Values::F32(&w) }];
        let (model, config) = temporary_names(dir.path());
        write_both(&t, &serde_json::json!({"kind": "a"}), &model, &config).unwrap();
        std::fs::write(dir.path().join(CONFIG_FILE), "the user's file").unwrap();
        let e = commit(dir.path(), &model, &config, false).unwrap_err();
        assert!(matches!(&e, Commit::Exists(p) if p == &dir.path().join(CONFIG_FILE)), "{e:?}");
        assert_eq!(std::fs::read_to_string(dir.path().join(CONFIG_FILE)).unwrap(), "the user's file");
        assert!(!dir.path().join(MODEL_FILE).exists() && model.exists() && config.exists());
        std::fs::remove_file(dir.path().join(CONFIG_FILE)).unwrap();
        // The description's move fails (its file is gone): the tensors moved in go again.
        std::fs::remove_file(&config).unwrap();
        assert!(matches!(commit(dir.path(), &model, &config, false), Err(Commit::Failed(_))));
        assert!(listing(dir.path()).is_empty(), "{:?}", listing(dir.path()));
    }

    /// A failed write leaves nothing: not the staging directory, not the directory the
    /// call made.
    #[test]
    fn a_failed_staged_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("serve");
        let e = write_serving_staged(&out, false, |_| Err::<(), _>("no checkpoint")).unwrap_err();
        assert!(matches!(e, StagedError::Write("no checkpoint")), "{e:?}");
        assert!(!out.exists());
        std::fs::create_dir(&out).unwrap();
        let w = [1.0f32];
        let bad = [Tensor { name: "w".into(), shape: vec![2], values: Values::F32(&w) }];
        let e = write_serving_staged(&out, false, |s| write_serving(s, &bad, &serde_json::json!({}))).unwrap_err();
        assert!(matches!(e, StagedError::Write(SinkError::Checkpoint { .. })), "{e:?}");
        assert!(listing(&out).is_empty());
    }

    /// Only staging directories named as this module names them are recognised, by their pid.
    #[test]
    fn staging_names_parse_exactly() {
        assert_eq!(staging_pid(".export.tmp-4411"), Some(4411));
        for other in
            [".export.tmp-", ".export.tmp-04411", ".export.tmp-0", ".export.tmp-12x", ".export.tmp4411", "export.tmp-1"]
        {
            assert_eq!(staging_pid(other), None, "{other}");
        }
        let ours = temp_beside(Path::new(STAGING));
        assert_eq!(staging_pid(ours.to_str().unwrap()), Some(std::process::id()));
    }

    fn le_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
}
