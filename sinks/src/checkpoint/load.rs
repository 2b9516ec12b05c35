//! Finding and reading the newest valid checkpoint of a directory.
//!
//! A checkpoint is used only if its `manifest.json` parses, has this build's
//! format version and the step of its directory name, lists exactly the files
//! a checkpoint of its worker count has, and every file has the listed size
//! and xxh3-128 checksum and parses as the expected tensors. Anything else
//! (a torn write, a flipped byte, a deleted file) makes [`find_latest`] skip
//! it, with the reason, and try the next older one.

use super::layout::{list_checkpoints, shard_file, DENSE_FILE, MANIFEST_FILE};
use super::manifest::{Manifest, FORMAT_VERSION};
use super::tensors::{checksum, Reader};
use crate::SinkError;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use tiderec_operators::optim::{DenseOptimizerKind, DenseOptimizerState};
use tiderec_operators::snapshot::{TableRows, WorkerSnapshot};
use tiderec_operators::train::dense_slice;

/// A verified checkpoint, read into memory.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// Its directory.
    pub path: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// One part per writing worker, in worker order, as
    /// [`Trainer::restore`](tiderec_operators::train::Trainer::restore) takes them
    /// (part 0 carries the dense parameters).
    pub parts: Vec<WorkerSnapshot>,
}

/// A checkpoint that was passed over, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Its directory.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

/// The outcome of [`find_latest`].
#[derive(Debug, Default)]
pub struct Search {
    /// The newest valid checkpoint, if any.
    pub found: Option<Checkpoint>,
    /// Newer checkpoints that were skipped, newest first.
    pub skipped: Vec<Skipped>,
}

/// The newest valid checkpoint in `dir` (none if `dir` does not exist); only
/// an unreadable `dir` is an error.
pub fn find_latest(dir: &Path) -> Result<Search, SinkError> {
    let mut search = Search::default();
    for (step, path) in list_checkpoints(dir)?.into_iter().rev() {
        match load(&path, step) {
            Ok(c) => {
                search.found = Some(c);
                break;
            }
            Err(reason) => search.skipped.push(Skipped { path, reason }),
        }
    }
    Ok(search)
}

/// Reads and verifies the checkpoint at `path` (named `ckpt-<step>`); the error says what is wrong.
pub fn load(path: &Path, step: u64) -> Result<Checkpoint, String> {
    let manifest_path = path.join(MANIFEST_FILE);
    let text = match std::fs::read_to_string(&manifest_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(format!("{MANIFEST_FILE} is missing")),
        Err(e) => return Err(format!("cannot read {MANIFEST_FILE}: {e}")),
    };
    let manifest: Manifest = serde_json::from_str(&text).map_err(|e| format!("{MANIFEST_FILE} does not parse: {e}"))?;
    if manifest.format_version != FORMAT_VERSION {
        return Err(format!("format version {}, this build reads {FORMAT_VERSION}", manifest.format_version));
    }
    if manifest.step != step {
        return Err(format!("the manifest is for step {}, the directory for step {step}", manifest.step));
    }
    let workers = manifest.workers;
    let listed: BTreeSet<String> = manifest.files.keys().cloned().collect();
    // The count first: a corrupt worker count must not make the loader list
    // billions of file names (or overflow a capacity).
    if workers == 0 || listed.len() != workers.saturating_add(1) {
        return Err(format!(
            "the manifest lists {listed:?}; a checkpoint of {workers} workers has {} files",
            workers.saturating_add(1)
        ));
    }
    let expected: BTreeSet<String> =
        std::iter::once(DENSE_FILE.to_string()).chain((0..workers).map(shard_file)).collect();
    if listed != expected {
        return Err(format!("the manifest lists {listed:?}; a checkpoint of {workers} workers has {expected:?}"));
    }
    let dense = read_verified(path, DENSE_FILE, &manifest)?;
    let (params, state) = parse_dense(&dense).map_err(|e| format!("{DENSE_FILE}: {e}"))?;
    drop(dense);
    let mut parts = Vec::with_capacity(workers);
    for k in 0..workers {
        let name = shard_file(k);
        let bytes = read_verified(path, &name, &manifest)?;
        let tables = parse_shard(&bytes, k, &manifest).map_err(|e| format!("{name}: {e}"))?;
        parts.push(WorkerSnapshot {
            worker: k,
            workers,
            step,
            dim: tables.dim,
            state_width: tables.state_width,
            dense_params: if k == 0 { params.clone() } else { Vec::new() },
            dense_optimizer: state.slice(dense_slice(params.len(), k, workers)),
            tables: tables.tables,
        });
    }
    Ok(Checkpoint { path: path.to_path_buf(), manifest, parts })
}

/// The bytes of `name`, checked against the manifest's size and checksum.
fn read_verified(dir: &Path, name: &str, manifest: &Manifest) -> Result<Vec<u8>, String> {
    let entry = &manifest.files[name];
    let bytes = std::fs::read(dir.join(name)).map_err(|e| format!("cannot read {name}: {e}"))?;
    if bytes.len() as u64 != entry.bytes {
        return Err(format!("{name} has {} bytes, the manifest says {}", bytes.len(), entry.bytes));
    }
    let sum = checksum(&bytes);
    if sum != entry.xxh3_128 {
        return Err(format!("checksum mismatch in {name} (xxh3-128 {sum}, the manifest says {})", entry.xxh3_128));
    }
    Ok(bytes)
}

fn parse_dense(bytes: &[u8]) -> Result<(Vec<f32>, DenseOptimizerState), String> {
    let r = Reader::new(bytes)?;
    let kind_name = r.text("optimizer")?;
    let kind: DenseOptimizerKind = serde_json::from_value(serde_json::Value::String(kind_name.to_string()))
        .map_err(|_| format!("unknown dense optimizer `{kind_name}`"))?;
    let n = one_dim(&r, "params")?;
    let params = r.f32s("params", &[n])?;
    let m = r.f32s("optimizer.m", &[one_dim(&r, "optimizer.m")?])?;
    let v = r.f32s("optimizer.v", &[one_dim(&r, "optimizer.v")?])?;
    let t = r.u64s("optimizer.t", &[1])?[0];
    let state = DenseOptimizerState { kind, t, offset: 0, len: n, m, v };
    state.check().map_err(|e| e.to_string())?;
    Ok((params, state))
}

fn one_dim(r: &Reader<'_>, name: &str) -> Result<usize, String> {
    match r.shape(name)?.as_slice() {
        [n] => Ok(*n),
        other => Err(format!("tensor `{name}` has shape {other:?}, expected one dimension")),
    }
}

struct ShardTables {
    dim: usize,
    state_width: usize,
    tables: Vec<TableRows>,
}

fn parse_shard(bytes: &[u8], k: usize, manifest: &Manifest) -> Result<ShardTables, String> {
    let r = Reader::new(bytes)?;
    let (worker, workers, step) = (r.number("worker")?, r.number("workers")?, r.number("step")?);
    if (worker, workers, step) != (k as u64, manifest.workers as u64, manifest.step) {
        return Err(format!(
            "written by worker {worker} of {workers} at step {step}, expected worker {k} of {} at step {}",
            manifest.workers, manifest.step
        ));
    }
    let dim = r.number("dim")? as usize;
    let state_width = r.number("state_width")? as usize;
    let num_tables = r.number("tables")? as usize;
    let mut tables = Vec::with_capacity(num_tables.min(1 << 16));
    for t in 0..num_tables {
        let ids_name = format!("table.{t}.ids");
        let n = one_dim(&r, &ids_name)?;
        // Frequencies and hot slots are optional: checkpoints older than them still load.
        let narrow = |name: String| -> Result<Vec<u32>, String> {
            if r.shape(&name).is_err() {
                return Ok(Vec::new());
            }
            r.u64s(&name, &[n])?
                .into_iter()
                .map(|v| u32::try_from(v).map_err(|_| format!("tensor `{name}` holds {v}, above u32")))
                .collect()
        };
        tables.push(TableRows {
            ids: r.u64s(&ids_name, &[n])?,
            rows: r.f32s(&format!("table.{t}.rows"), &[n, dim])?,
            state: r.f32s(&format!("table.{t}.state"), &[n, state_width])?,
            counts: narrow(format!("table.{t}.counts"))?,
            hot: narrow(format!("table.{t}.hot"))?,
        });
    }
    Ok(ShardTables { dim, state_width, tables })
}
