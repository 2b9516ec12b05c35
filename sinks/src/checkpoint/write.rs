//! Writing one checkpoint directory, durably, and pruning old ones.
//!
//! The steps, in the order a run takes them (the pipeline spreads them over
//! its workers, see `tiderec::checkpointing`):
//! 1. [`create_temp`]: `DIR/.tmp-ckpt-<step>-<pid>`, fresh;
//! 2. [`write_shard`] per worker and [`write_dense`] once: each file is
//!    written in one pass, hashed as it is written, and fsynced;
//! 3. [`commit`]: `manifest.json` (with every file's size and checksum) is
//!    written and fsynced, then the directory is fsynced, renamed to
//!    `ckpt-<step>`, and `DIR` is fsynced, so the new name is durable;
//! 4. [`prune`]: only then are older checkpoints removed.
//!
//! A crash at any point leaves either a complete `ckpt-<step>` or none (a
//! temporary directory, which loading ignores and the next prune removes).
//! Replacing a checkpoint of the same step renames the old one to
//! `.old-ckpt-<step>-<pid>` first; a crash before the new one takes the name
//! leaves that as the only copy, which [`restore_replaced`] (on resume, and
//! before every prune) renames back instead of removing. A delta never replaces
//! the checkpoint it follows ([`commit`] refuses it).

use super::layout::{
    best_step, checkpoint_name, replaced_step, shard_file, step_of, temp_pid, BEST_LINK, DENSE_FILE, MANIFEST_FILE,
    OLD_PREFIX, TEMP_PREFIX,
};
use super::manifest::{FileEntry, Manifest};
use super::tensors::{self, Tensor, Values};
use crate::SinkError;
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use tiderec_operators::optim::DenseOptimizerState;
use tiderec_operators::snapshot::WorkerSnapshot;

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> SinkError + '_ {
    move |source| SinkError::Io { path: path.display().to_string(), source }
}

/// Fsyncs a directory, so the names created, renamed or removed in it are durable.
pub fn sync_dir(dir: &Path) -> Result<(), SinkError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_error(dir))
}

/// Fsyncs the directory `path` is in (`.` for a bare name), so its name is durable.
pub fn sync_parent(path: &Path) -> Result<(), SinkError> {
    sync_dir(path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")))
}

/// Creates the empty temporary directory of the checkpoint of `step` in `dir`
/// (`.tmp-ckpt-<step>-<pid>`, replacing a leftover of the same name).
pub fn create_temp(dir: &Path, step: u64) -> Result<PathBuf, SinkError> {
    let tmp = dir.join(format!("{TEMP_PREFIX}{step}-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io_error(&tmp))?;
    }
    std::fs::create_dir(&tmp).map_err(io_error(&tmp))?;
    Ok(tmp)
}

fn meta(pairs: &[(&str, String)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

/// Writes `shard-<k>.safetensors` of `part` into `tmp`: per table `t`,
/// `table.<t>.ids` (U64 `[n]`), `table.<t>.rows` (F32 `[n, dim]`) and
/// `table.<t>.state` (F32 `[n, state_width]`), and where the store keeps
/// them `table.<t>.counts`, `table.<t>.hot` and `table.<t>.last_seen` (U64
/// `[n]`: frequencies, hot-tier slots, `u32::MAX` for cold rows, and the step
/// of each row's last update; older checkpoints lack them);
/// a delta's part adds `table.<t>.removed` (U64 `[r]`: the ids removed since its parent);
/// a store that admits ids by count adds its count-min sketch's counters, row
/// by row: `admission` (U32 `[n]`), or, where fewer than half are non-zero,
/// `admission.index` and `admission.value` (U32 `[k]`: the non-zero ones) with
/// the metadata `admission_len` (`n`); a delta's part holds only the counters
/// that grew since its parent (the others zero in the dense form), marked by the
/// metadata `admission_changes` (`true`).
pub fn write_shard(tmp: &Path, part: &WorkerSnapshot) -> Result<(String, FileEntry), SinkError> {
    let name = shard_file(part.worker);
    let mut list = Vec::with_capacity(5 * part.tables.len());
    let widened: Vec<(Vec<u64>, Vec<u64>)> = part
        .tables
        .iter()
        .map(|t| (t.counts.iter().map(|&c| c as u64).collect(), t.hot.iter().map(|&h| h as u64).collect()))
        .collect();
    for (t, table) in part.tables.iter().enumerate() {
        let n = table.ids.len();
        list.push(Tensor { name: format!("table.{t}.ids"), shape: vec![n], values: Values::U64(&table.ids) });
        list.push(Tensor {
            name: format!("table.{t}.rows"),
            shape: vec![n, part.dim],
            values: Values::F32(&table.rows),
        });
        list.push(Tensor {
            name: format!("table.{t}.state"),
            shape: vec![n, part.state_width],
            values: Values::F32(&table.state),
        });
        let (counts, hot) = &widened[t];
        if !counts.is_empty() {
            list.push(Tensor { name: format!("table.{t}.counts"), shape: vec![n], values: Values::U64(counts) });
        }
        if !hot.is_empty() {
            list.push(Tensor { name: format!("table.{t}.hot"), shape: vec![n], values: Values::U64(hot) });
        }
        if !table.last_seen.is_empty() {
            list.push(Tensor {
                name: format!("table.{t}.last_seen"),
                shape: vec![n],
                values: Values::U64(&table.last_seen),
            });
        }
        if part.delta_of.is_some() {
            list.push(Tensor {
                name: format!("table.{t}.removed"),
                shape: vec![table.removed.len()],
                values: Values::U64(&table.removed),
            });
        }
    }
    // The admission sketch: its non-zero counters where they are fewer than half, else all of them.
    let counters = &part.admission;
    let dense_counters = (counters.index.len() * 2 >= counters.len).then(|| {
        let mut dense = vec![0u32; counters.len];
        counters.write_into(&mut dense);
        dense
    });
    match &dense_counters {
        _ if counters.is_empty() => {}
        Some(dense) => {
            list.push(Tensor { name: "admission".into(), shape: vec![dense.len()], values: Values::U32(dense) });
        }
        None => {
            let k = counters.index.len();
            list.push(Tensor { name: "admission.index".into(), shape: vec![k], values: Values::U32(&counters.index) });
            list.push(Tensor { name: "admission.value".into(), shape: vec![k], values: Values::U32(&counters.value) });
        }
    }
    let mut metadata = vec![
        ("format", "tiderec-shard".into()),
        ("worker", part.worker.to_string()),
        ("workers", part.workers.to_string()),
        ("step", part.step.to_string()),
        ("dim", part.dim.to_string()),
        ("state_width", part.state_width.to_string()),
        ("tables", part.tables.len().to_string()),
        ("seed", part.seed.to_string()),
        ("table_sizes", serde_json::to_string(&part.table_sizes).unwrap_or_default()),
    ];
    if !counters.is_empty() && dense_counters.is_none() {
        metadata.push(("admission_len", counters.len.to_string()));
    }
    if !counters.is_empty() && counters.changes_only {
        metadata.push(("admission_changes", "true".into()));
    }
    let entry = tensors::write(&tmp.join(&name), &list, meta(&metadata))?;
    Ok((name, entry))
}

/// Writes `dense.safetensors` into `tmp`: `params` (F32 `[n]`), the dense
/// optimizer's `optimizer.m` and `optimizer.v` (F32, empty where the
/// optimizer keeps none) and `optimizer.t` (U64 `[1]`, updates applied).
pub fn write_dense(
    tmp: &Path,
    step: u64,
    params: &[f32],
    state: &DenseOptimizerState,
) -> Result<(String, FileEntry), SinkError> {
    let t = [state.t];
    let list = [
        Tensor { name: "params".into(), shape: vec![params.len()], values: Values::F32(params) },
        Tensor { name: "optimizer.m".into(), shape: vec![state.m.len()], values: Values::F32(&state.m) },
        Tensor { name: "optimizer.v".into(), shape: vec![state.v.len()], values: Values::F32(&state.v) },
        Tensor { name: "optimizer.t".into(), shape: vec![1], values: Values::U64(&t) },
    ];
    let kind = serde_json::to_value(state.kind).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
    let metadata = meta(&[("format", "tiderec-dense".into()), ("step", step.to_string()), ("optimizer", kind)]);
    let entry = tensors::write(&tmp.join(DENSE_FILE), &list, metadata)?;
    Ok((DENSE_FILE.to_string(), entry))
}

/// Writes `manifest.json` into `tmp`, makes the directory durable and
/// renames it to `dir/ckpt-<step>` (replacing an existing checkpoint of that
/// step); returns the final path, and a warning for each thing that went wrong
/// only after the new checkpoint was durable under its name (the replaced
/// directory could not be removed: it costs disk space, never correctness).
///
/// A delta must follow an earlier step: a manifest whose delta parent is its own
/// step (or later) is refused before anything is renamed, since replacing
/// `ckpt-<step>` would remove the very checkpoint the delta needs.
pub fn commit(dir: &Path, tmp: &Path, manifest: &Manifest) -> Result<(PathBuf, Vec<String>), SinkError> {
    if let Some(link) = manifest.delta.filter(|link| link.parent >= manifest.step) {
        return Err(SinkError::Checkpoint {
            path: tmp.display().to_string(),
            reason: format!(
                "the checkpoint of step {} is a delta of {}: a delta follows an earlier checkpoint (refusing to \
                 replace {} with a delta of itself)",
                manifest.step,
                checkpoint_name(link.parent),
                dir.join(checkpoint_name(manifest.step)).display()
            ),
        });
    }
    let path = tmp.join(MANIFEST_FILE);
    let text = serde_json::to_string_pretty(manifest)
        .map_err(|e| SinkError::Checkpoint { path: path.display().to_string(), reason: e.to_string() })?;
    let mut f = File::options().write(true).create_new(true).open(&path).map_err(io_error(&path))?;
    f.write_all(text.as_bytes()).and_then(|_| f.write_all(b"\n")).map_err(io_error(&path))?;
    f.sync_all().map_err(io_error(&path))?;
    sync_dir(tmp)?;
    let target = dir.join(checkpoint_name(manifest.step));
    let old = dir.join(format!("{OLD_PREFIX}{}-{}", manifest.step, std::process::id()));
    let replaced = target.exists();
    if replaced {
        // A leftover of an earlier process of the same id (a container's trainer is often
        // process 1 on every start), whose `ckpt-<step>` exists: a copy no one needs, in
        // the way of the rename.
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(io_error(&old))?;
        }
        std::fs::rename(&target, &old).map_err(io_error(&target))?;
    }
    if let Err(e) = std::fs::rename(tmp, &target) {
        // Put the replaced checkpoint back under its name (a crash before this is
        // undone by [`restore_replaced`]).
        if replaced {
            let _ = std::fs::rename(&old, &target);
        }
        return Err(io_error(&target)(e));
    }
    sync_dir(dir)?;
    let mut warnings = Vec::new();
    if replaced {
        if let Err(e) = std::fs::remove_dir_all(&old) {
            warnings.push(format!(
                "{} is durable, but the checkpoint it replaced, {}, could not be removed: {e}",
                target.display(),
                old.display()
            ));
        }
    }
    Ok((target, warnings))
}

/// Undoes replacements of a checkpoint that a crash interrupted: a
/// `.old-ckpt-<step>-<pid>` whose `ckpt-<step>` is missing is the only copy of
/// that checkpoint (its replacement never got the name), so it is renamed back
/// to `ckpt-<step>`, whichever process id it names (an earlier process may have
/// had this one's: a container's trainer is often process 1 on every start; no
/// caller has a replacement of its own in flight). One whose `ckpt-<step>` exists is left
/// (the replacement is durable; [`prune`] removes it). Returns a line per
/// checkpoint restored and per rename that failed. Only a writer that holds the
/// directory (a run resuming, [`prune`]) may call it: renaming under a run that
/// is replacing a checkpoint would make its rename fail.
pub fn restore_replaced(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut notes = Vec::new();
    let mut restored = false;
    let mut olds: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            replaced_step(&name).map(|step| (step, e.path()))
        })
        .collect();
    olds.sort();
    for (step, old) in olds {
        let target = dir.join(checkpoint_name(step));
        if target.exists() {
            continue;
        }
        match std::fs::rename(&old, &target) {
            Ok(()) => {
                restored = true;
                notes.push(format!(
                    "restored {} from {}, left by a replacement that did not finish",
                    target.display(),
                    old.display()
                ));
            }
            // Another process of the run restored it first.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && target.exists() => {}
            Err(e) => notes.push(format!("cannot restore {} from {}: {e}", target.display(), old.display())),
        }
    }
    if restored {
        if let Err(e) = sync_dir(dir) {
            notes.push(e.to_string());
        }
    }
    notes
}

/// Points `dir/best` at the (durable) checkpoint of `step`: a relative symlink
/// created under a temporary name and renamed over the old one, so the link
/// always names a whole checkpoint.
pub fn mark_best(dir: &Path, step: u64) -> Result<(), SinkError> {
    let tmp = dir.join(format!(".best-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(checkpoint_name(step), &tmp).map_err(io_error(&tmp))?;
    let link = dir.join(BEST_LINK);
    std::fs::rename(&tmp, &link).map_err(io_error(&link))?;
    sync_dir(dir)
}

/// After the checkpoint of `step` is durable: removes the checkpoints older
/// than the newest `keep` up to `step`, every checkpoint with a later step
/// (left by an interrupted run that this one replaces: had one of them been
/// valid, the run would have resumed from it), and temporary directories of
/// other processes (killed runs). The checkpoint `dir/best` names is kept
/// (and not counted among the `keep`), and so is every checkpoint a kept
/// delta's chain needs, back to its whole checkpoint. Returns a warning per entry that could
/// not be removed; a leftover costs disk space, never correctness.
pub fn prune(dir: &Path, step: u64, keep: usize) -> Vec<String> {
    // A replaced checkpoint whose replacement never got its name is a checkpoint, not litter.
    let mut warnings = restore_replaced(dir);
    let best = best_step(dir);
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => return vec![format!("cannot list {} to prune it: {e}", dir.display())],
    };
    let mut kept: Vec<(u64, PathBuf)> = Vec::new();
    let mut remove: Vec<PathBuf> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(s) = step_of(&name) {
            if Some(s) == best && s <= step {
                continue;
            }
            if s > step {
                remove.push(entry.path());
            } else {
                kept.push((s, entry.path()));
            }
        } else if temp_pid(&name).is_some_and(|pid| pid != std::process::id()) {
            remove.push(entry.path());
        }
    }
    kept.sort();
    let excess = kept.len().saturating_sub(keep.max(1));
    let mut needed: BTreeSet<u64> = kept[excess..].iter().map(|(s, _)| *s).collect();
    needed.extend(best.filter(|&b| b <= step));
    // Every link the chains of the kept checkpoints need.
    let mut frontier: Vec<u64> = needed.iter().copied().collect();
    while let Some(s) = frontier.pop() {
        if let Some(parent) = parent_of(&dir.join(checkpoint_name(s))) {
            if needed.insert(parent) {
                frontier.push(parent);
            }
        }
    }
    remove.extend(kept.into_iter().filter(|(s, _)| !needed.contains(s)).map(|(_, p)| p));
    for path in remove {
        if let Err(e) = std::fs::remove_dir_all(&path) {
            warnings.push(format!("cannot remove old checkpoint {}: {e}", path.display()));
        }
    }
    if let Err(e) = sync_dir(dir) {
        warnings.push(e.to_string());
    }
    warnings
}

/// The step of the checkpoint a delta at `path` follows (`None`: a whole
/// checkpoint, or a manifest that cannot be read, whose chain is broken anyway).
fn parent_of(path: &Path) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Link {
        delta: Option<super::manifest::DeltaLink>,
    }
    let text = std::fs::read_to_string(path.join(MANIFEST_FILE)).ok()?;
    serde_json::from_str::<Link>(&text).ok()?.delta.map(|d| d.parent)
}

/// All steps at once, for a program that holds every part (tests, single-threaded tools,
/// the `checkpoint_resume` example): writes the parts and the dense file of `parts`
/// (worker 0's dense parameters, the dense-optimizer slices joined), fills in
/// `manifest.files`, `manifest.workers` and `manifest.updated_only` (whether the parts
/// leave out the rows never updated), commits and prunes to `keep`. Returns the
/// checkpoint's path and the prune warnings.
pub fn write_checkpoint(
    dir: &Path,
    parts: &[WorkerSnapshot],
    mut manifest: Manifest,
    keep: usize,
) -> Result<(PathBuf, Vec<String>), SinkError> {
    let bad = |reason: String| SinkError::Checkpoint { path: dir.display().to_string(), reason };
    let first = parts.first().ok_or_else(|| bad("no parts to write".into()))?;
    let states: Vec<&DenseOptimizerState> = parts.iter().map(|p| &p.dense_optimizer).collect();
    let state = DenseOptimizerState::concat(&states, first.dense_params.len()).map_err(|e| bad(e.to_string()))?;
    let tmp = create_temp(dir, manifest.step)?;
    manifest.files.clear();
    for part in parts {
        let (name, entry) = write_shard(&tmp, part)?;
        manifest.files.insert(name, entry);
    }
    let (name, entry) = write_dense(&tmp, manifest.step, &first.dense_params, &state)?;
    manifest.files.insert(name, entry);
    manifest.workers = parts.len();
    manifest.updated_only = parts.iter().any(|p| p.updated_only);
    let (path, mut warnings) = commit(dir, &tmp, &manifest)?;
    warnings.extend(prune(dir, manifest.step, keep));
    Ok((path, warnings))
}
