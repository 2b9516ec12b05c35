//! Finding and reading the newest valid checkpoint of a directory.
//!
//! A checkpoint is used only if its `manifest.json` parses, has this build's
//! format version and the step of its directory name, repeats in its data
//! position the epoch, steps in the epoch and worker count of its top level
//! (when it records them there), lists exactly the files
//! a checkpoint of its worker count has, and every file has the listed size
//! and xxh3-128 checksum and parses as the expected tensors. Anything else
//! (a torn write, a flipped byte, a deleted file) makes [`find_latest`] skip
//! it, with the reason, and try the next older one.
//!
//! A delta is used only with its whole chain: every checkpoint back to the
//! whole one it starts from (siblings in the same directory) must pass the same
//! checks, come from the same run (configuration hash, seed, batch size, worker
//! count) and follow its parent's step; the deltas are then applied in order
//! ([`apply_delta`]). So a damaged delta makes the later links of its chain
//! unusable too, and [`find_latest`] falls back to the link before it.
//!
//! Not every checkpoint skipped is damaged: one of a newer format version, or
//! one whose files could not be read for another reason than their absence, was
//! not judged ([`LoadError::is_damage`]); a run must not remove it as damaged.

use super::layout::{checkpoint_name, list_checkpoints, shard_file, DENSE_FILE, MANIFEST_FILE};
use super::manifest::{Manifest, FORMAT_VERSION, OLDEST_READABLE_VERSION};
use super::tensors::{checksum, Reader, TensorError};
use crate::SinkError;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use tiderec_operators::optim::{DenseOptimizerKind, DenseOptimizerState};
use tiderec_operators::snapshot::{apply_delta, SketchCounters, TableRows, WorkerSnapshot};
use tiderec_operators::train::dense_slice;
use tiderec_operators::RestoreError;

/// A verified checkpoint, read into memory.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// Its directory.
    pub path: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// One part per writing worker, in worker order, as
    /// [`Trainer::restore`](tiderec_operators::train::Trainer::restore) takes them
    /// (part 0 carries the dense parameters); whole parts, a delta's chain applied.
    pub parts: Vec<WorkerSnapshot>,
    /// The steps of the checkpoints read, the whole one first and this one last
    /// (one step for a whole checkpoint).
    pub chain: Vec<u64>,
}

/// A checkpoint that was passed over, and why.
#[derive(Debug)]
pub struct Skipped {
    /// Its directory.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: LoadError,
}

/// Why the checkpoint directory given to [`load`] is not used; each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The directory has no manifest (a torn write, or not a checkpoint).
    #[error("{MANIFEST_FILE} is missing")]
    NoManifest,
    /// A file of the checkpoint could not be read.
    #[error("cannot read {file}: {source}")]
    Read {
        /// The file, relative to the checkpoint directory.
        file: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The manifest is not JSON of a [`Manifest`].
    #[error("{MANIFEST_FILE} does not parse: {0}")]
    Manifest(#[source] serde_json::Error),
    /// The manifest was written by another format version.
    #[error("format version {version}, this build reads {OLDEST_READABLE_VERSION} to {FORMAT_VERSION}")]
    FormatVersion {
        /// The manifest's version.
        version: u32,
    },
    /// The manifest's step is not the step of the directory's name.
    #[error("the manifest is for step {manifest}, the directory for step {directory}")]
    Step {
        /// The manifest's step.
        manifest: u64,
        /// The step of the directory's name.
        directory: u64,
    },
    /// The manifest's own copies of the data position disagree (a damaged or edited manifest).
    #[error("{MANIFEST_FILE} disagrees with itself: `{field}` is {value}, `data_position.{copy}` is {copy_value}")]
    Position {
        /// The top-level field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The field of `data_position` that repeats it.
        copy: &'static str,
        /// That field's value.
        copy_value: u64,
    },
    /// The manifest lists another number of files than its worker count implies.
    #[error("the manifest lists {listed:?}; a checkpoint of {workers} workers has {} files", workers.saturating_add(1))]
    FileCount {
        /// The files it lists.
        listed: BTreeSet<String>,
        /// Its worker count.
        workers: usize,
    },
    /// The manifest lists other files than a checkpoint of its worker count has.
    #[error("the manifest lists {listed:?}; a checkpoint of {workers} workers has {expected:?}")]
    FileNames {
        /// The files it lists.
        listed: BTreeSet<String>,
        /// Its worker count.
        workers: usize,
        /// The files such a checkpoint has.
        expected: BTreeSet<String>,
    },
    /// A file's size differs from the manifest's.
    #[error("{file} has {bytes} bytes, the manifest says {expected}")]
    Size {
        /// The file.
        file: String,
        /// Its size in bytes.
        bytes: u64,
        /// The size the manifest lists.
        expected: u64,
    },
    /// A file's checksum differs from the manifest's.
    #[error("checksum mismatch in {file} (xxh3-128 {xxh3_128}, the manifest says {expected})")]
    Checksum {
        /// The file.
        file: String,
        /// Its xxh3-128, in hex.
        xxh3_128: String,
        /// The checksum the manifest lists.
        expected: String,
    },
    /// A delta whose chain is broken: a checkpoint it follows is missing or unusable.
    #[error("it is a delta, and {} of its chain cannot be used: {source}", .path.display())]
    Chain {
        /// The step of the unusable link.
        step: u64,
        /// Where the link was looked for.
        path: std::path::PathBuf,
        /// What is wrong with it.
        #[source]
        source: Box<LoadError>,
    },
    /// A link of a delta's chain is from another run or does not follow its parent.
    #[error("it is a delta, and {} of its chain {reason}", checkpoint_name(*.step))]
    ChainMismatch {
        /// The step of the link.
        step: u64,
        /// How it disagrees.
        reason: String,
    },
    /// A delta's changes do not apply onto the checkpoint it follows.
    #[error("the changes of {} do not apply: {source}", checkpoint_name(*.step))]
    Delta {
        /// The step of the delta.
        step: u64,
        /// Why.
        #[source]
        source: RestoreError,
    },
    /// A file matches the manifest but does not hold the tensors it should.
    #[error("{file}: {source}")]
    Tensors {
        /// The file.
        file: String,
        /// What is wrong inside it.
        #[source]
        source: TensorError,
    },
}

impl LoadError {
    /// Whether the checkpoint was judged damaged (torn, altered, incomplete, or a delta
    /// whose chain is). `false` when it could not be judged and may well be valid: written
    /// by another format version (a newer build's), or a file that exists but could not be
    /// read (permissions, an I/O error). A writer must never remove such a checkpoint as
    /// damaged.
    pub fn is_damage(&self) -> bool {
        match self {
            LoadError::FormatVersion { .. } => false,
            LoadError::Read { source, .. } => {
                matches!(source.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidData)
            }
            LoadError::Chain { source, .. } => source.is_damage(),
            _ => true,
        }
    }
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

/// Reads and verifies the checkpoint at `path` (named `ckpt-<step>`) and, for a
/// delta, its chain (see the module docs); the parts are whole. The error says
/// what is wrong.
pub fn load(path: &Path, step: u64) -> Result<Checkpoint, LoadError> {
    let newest = load_link(path, step)?;
    if newest.manifest.delta.is_none() {
        return Ok(newest);
    }
    let dir = chain_dir(path);
    let mut links = vec![newest];
    while let Some(link) = links.last().and_then(|c| c.manifest.delta) {
        let child = &links[links.len() - 1].manifest;
        let parent_path = dir.join(checkpoint_name(link.parent));
        let parent = load_link(&parent_path, link.parent).map_err(|source| LoadError::Chain {
            step: link.parent,
            path: parent_path,
            source: Box::new(source),
        })?;
        same_chain(child, &parent.manifest)?;
        links.push(parent);
    }
    let mut base = links.pop().expect("the chain holds its whole checkpoint");
    while let Some(next) = links.pop() {
        let step = next.manifest.step;
        apply_delta(&mut base.parts, next.parts).map_err(|source| LoadError::Delta { step, source })?;
        base.chain.push(step);
        (base.path, base.manifest) = (next.path, next.manifest);
    }
    for part in &mut base.parts {
        part.delta_of = None;
    }
    Ok(base)
}

/// The directory holding the siblings of the checkpoint at `path`: the parent of its
/// canonical path, so that a checkpoint named `.`, `..` or through a symbolic link finds
/// the chain beside the directory itself (`path` as given when it cannot be resolved).
fn chain_dir(path: &Path) -> std::path::PathBuf {
    let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| std::path::absolute(path).unwrap_or(path.into()));
    resolved.parent().map_or_else(|| Path::new(".").to_path_buf(), Path::to_path_buf)
}

/// Checks that `parent` is the checkpoint the delta `child` follows, from the same run.
fn same_chain(child: &Manifest, parent: &Manifest) -> Result<(), LoadError> {
    let link = child.delta.expect("only a delta has a parent");
    let mismatch = |reason: String| Err(LoadError::ChainMismatch { step: parent.step, reason });
    let parent_base = parent.delta.map_or(parent.step, |d| d.base);
    if parent.step >= child.step || parent_base != link.base {
        return mismatch(format!(
            "does not lead to step {} from the whole checkpoint of step {} (it is step {} of a chain from {})",
            child.step, link.base, parent.step, parent_base
        ));
    }
    let run = |m: &Manifest| (m.config_hash.clone(), m.seed, m.batch_size, m.workers);
    if run(parent) != run(child) {
        return mismatch(format!(
            "is from another run: (configuration hash, seed, batch size, workers) {:?}, the delta's {:?}",
            run(parent),
            run(child)
        ));
    }
    Ok(())
}

/// Checks that the fields a manifest holds twice, at its top level and in its data
/// position, agree: a resume trusts the data position, so a disagreement is damage.
fn check_position_copies(manifest: &Manifest) -> Result<(), LoadError> {
    let position = &manifest.data_position;
    let copies = [
        ("epoch", manifest.epoch, "epoch", position.epoch),
        ("steps_in_epoch", manifest.steps_in_epoch, "global_steps_in_epoch", position.global_steps_in_epoch),
        ("workers", manifest.workers as u64, "workers", position.workers.unwrap_or(manifest.workers) as u64),
    ];
    match copies.into_iter().find(|(_, value, _, copy_value)| value != copy_value) {
        Some((field, value, copy, copy_value)) => Err(LoadError::Position { field, value, copy, copy_value }),
        None => Ok(()),
    }
}

/// Reads and verifies the one checkpoint at `path` (named `ckpt-<step>`), as
/// stored: a delta's parts hold its changes only (see
/// [`WorkerSnapshot::delta_of`]), for a reader that holds the model of its parent.
pub fn load_link(path: &Path, step: u64) -> Result<Checkpoint, LoadError> {
    let text = match std::fs::read_to_string(path.join(MANIFEST_FILE)) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(LoadError::NoManifest),
        Err(source) => return Err(LoadError::Read { file: MANIFEST_FILE.into(), source }),
    };
    let manifest: Manifest = serde_json::from_str(&text).map_err(LoadError::Manifest)?;
    if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&manifest.format_version) {
        return Err(LoadError::FormatVersion { version: manifest.format_version });
    }
    if manifest.step != step {
        return Err(LoadError::Step { manifest: manifest.step, directory: step });
    }
    check_position_copies(&manifest)?;
    let workers = manifest.workers;
    let listed: BTreeSet<String> = manifest.files.keys().cloned().collect();
    // The count first: a corrupt worker count must not make the loader list
    // billions of file names (or overflow a capacity).
    if workers == 0 || listed.len() != workers.saturating_add(1) {
        return Err(LoadError::FileCount { listed, workers });
    }
    let expected: BTreeSet<String> =
        std::iter::once(DENSE_FILE.to_string()).chain((0..workers).map(shard_file)).collect();
    if listed != expected {
        return Err(LoadError::FileNames { listed, workers, expected });
    }
    let dense = read_verified(path, DENSE_FILE, &manifest)?;
    let (params, state) = parse_dense(&dense).map_err(in_file(DENSE_FILE))?;
    drop(dense);
    let mut parts = Vec::with_capacity(workers);
    for k in 0..workers {
        let name = shard_file(k);
        let bytes = read_verified(path, &name, &manifest)?;
        let tables = parse_shard(&bytes, k, &manifest).map_err(in_file(&name))?;
        parts.push(WorkerSnapshot {
            worker: k,
            workers,
            step,
            dim: tables.dim,
            state_width: tables.state_width,
            dense_params: if k == 0 { params.clone() } else { Vec::new() },
            dense_optimizer: state.slice(dense_slice(params.len(), k, workers)),
            tables: tables.tables,
            updated_only: manifest.updated_only,
            delta_of: manifest.delta.map(|d| d.parent),
            seed: tables.seed.unwrap_or(manifest.seed),
            table_sizes: tables.table_sizes,
            admission: tables.admission,
        });
    }
    Ok(Checkpoint { path: path.to_path_buf(), manifest, parts, chain: vec![step] })
}

/// Wraps a tensor error of `file`.
fn in_file(file: &str) -> impl FnOnce(TensorError) -> LoadError + '_ {
    move |source| LoadError::Tensors { file: file.to_string(), source }
}

/// The bytes of `name`, checked against the manifest's size and checksum.
fn read_verified(dir: &Path, name: &str, manifest: &Manifest) -> Result<Vec<u8>, LoadError> {
    let entry = &manifest.files[name];
    let bytes = std::fs::read(dir.join(name)).map_err(|source| LoadError::Read { file: name.into(), source })?;
    if bytes.len() as u64 != entry.bytes {
        return Err(LoadError::Size { file: name.into(), bytes: bytes.len() as u64, expected: entry.bytes });
    }
    let sum = checksum(&bytes);
    if sum != entry.xxh3_128 {
        return Err(LoadError::Checksum { file: name.into(), xxh3_128: sum, expected: entry.xxh3_128.clone() });
    }
    Ok(bytes)
}

fn parse_dense(bytes: &[u8]) -> Result<(Vec<f32>, DenseOptimizerState), TensorError> {
    let r = Reader::new(bytes)?;
    let kind_name = r.text("optimizer")?;
    let kind: DenseOptimizerKind = serde_json::from_value(serde_json::Value::String(kind_name.to_string()))
        .map_err(|_| TensorError::UnknownOptimizer { name: kind_name.into() })?;
    let n = one_dim(&r, "params")?;
    let params = r.f32s("params", &[n])?;
    let m = r.f32s("optimizer.m", &[one_dim(&r, "optimizer.m")?])?;
    let v = r.f32s("optimizer.v", &[one_dim(&r, "optimizer.v")?])?;
    let t = r.u64s("optimizer.t", &[1])?[0];
    let state = DenseOptimizerState { kind, t, offset: 0, len: n, m, v };
    state.check().map_err(TensorError::OptimizerState)?;
    Ok((params, state))
}

fn one_dim(r: &Reader<'_>, name: &str) -> Result<usize, TensorError> {
    match r.shape(name)?.as_slice() {
        [n] => Ok(*n),
        other => Err(TensorError::NotOneDimensional { name: name.into(), shape: other.to_vec() }),
    }
}

/// A delta's removed ids (absent in whole checkpoints).
fn removed(r: &Reader<'_>, name: &str) -> Result<Vec<u64>, TensorError> {
    if r.shape(name).is_err() {
        return Ok(Vec::new());
    }
    r.u64s(name, &[one_dim(r, name)?])
}

/// The admission sketch's counters of a shard, dense (`admission`) or as its
/// non-zero ones (`admission.index`, `admission.value`, `admission_len`), and
/// whether they are only a delta's changed ones (`admission_changes`); empty
/// without a sketch, and in older checkpoints. The store that takes them checks
/// their number and positions against its own sketch.
fn admission(r: &Reader<'_>) -> Result<SketchCounters, TensorError> {
    let changes_only = r.text("admission_changes").is_ok_and(|v| v == "true");
    if r.shape("admission").is_ok() {
        let dense = SketchCounters::from_dense(&r.u32s("admission", &[one_dim(r, "admission")?])?);
        return Ok(SketchCounters { changes_only, ..dense });
    }
    if r.shape("admission.index").is_err() {
        return Ok(SketchCounters::default());
    }
    let k = one_dim(r, "admission.index")?;
    Ok(SketchCounters {
        len: r.number("admission_len")? as usize,
        index: r.u32s("admission.index", &[k])?,
        value: r.u32s("admission.value", &[k])?,
        changes_only,
    })
}

/// The U64 `[n]` tensor `name`, or nothing where the checkpoint predates it.
fn optional_u64s(r: &Reader<'_>, name: &str, n: usize) -> Result<Vec<u64>, TensorError> {
    if r.shape(name).is_err() {
        return Ok(Vec::new());
    }
    r.u64s(name, &[n])
}

struct ShardTables {
    admission: SketchCounters,
    seed: Option<u64>,
    table_sizes: Vec<u64>,
    dim: usize,
    state_width: usize,
    tables: Vec<TableRows>,
}

fn parse_shard(bytes: &[u8], k: usize, manifest: &Manifest) -> Result<ShardTables, TensorError> {
    let r = Reader::new(bytes)?;
    let (worker, workers, step) = (r.number("worker")?, r.number("workers")?, r.number("step")?);
    if (worker, workers, step) != (k as u64, manifest.workers as u64, manifest.step) {
        return Err(TensorError::WrongWriter {
            worker,
            workers,
            step,
            expected_worker: k as u64,
            expected_workers: manifest.workers as u64,
            expected_step: manifest.step,
        });
    }
    let dim = r.number("dim")? as usize;
    let state_width = r.number("state_width")? as usize;
    let num_tables = r.number("tables")? as usize;
    let mut tables = Vec::with_capacity(num_tables.min(1 << 16));
    for t in 0..num_tables {
        let ids_name = format!("table.{t}.ids");
        let n = one_dim(&r, &ids_name)?;
        // Frequencies and hot slots are optional: checkpoints older than them still load.
        let narrow = |name: String| -> Result<Vec<u32>, TensorError> {
            optional_u64s(&r, &name, n)?
                .into_iter()
                .map(|value| u32::try_from(value).map_err(|_| TensorError::AboveU32 { name: name.clone(), value }))
                .collect()
        };
        tables.push(TableRows {
            ids: r.u64s(&ids_name, &[n])?,
            rows: r.f32s(&format!("table.{t}.rows"), &[n, dim])?,
            state: r.f32s(&format!("table.{t}.state"), &[n, state_width])?,
            counts: narrow(format!("table.{t}.counts"))?,
            hot: narrow(format!("table.{t}.hot"))?,
            last_seen: optional_u64s(&r, &format!("table.{t}.last_seen"), n)?,
            removed: removed(&r, &format!("table.{t}.removed"))?,
        });
    }
    // Recorded since checkpoints may list updated rows only; absent before.
    let table_sizes = match r.text("table_sizes") {
        Ok(text) => serde_json::from_str(text)
            .map_err(|_| TensorError::NotANumber { key: "table_sizes".into(), value: text.to_string() })?,
        Err(_) => Vec::new(),
    };
    let seed = r.number("seed").ok();
    let admission = admission(&r)?;
    Ok(ShardTables { admission, seed, table_sizes, dim, state_width, tables })
}
