//! Checkpoint targets: a real checkpoint written by the checkpoint writer,
//! with one of its files replaced by the fuzz input, loaded by
//! [`find_latest`] as a resumed run does.
//!
//! * [`checkpoint_manifest`]: the input is `manifest.json`; the tensor files
//!   are the writer's.
//! * [`checkpoint_tensors`]: the input's first byte picks the file (`dense`
//!   or a shard) and whether the manifest is fixed up to the new file's size
//!   and xxh3-128 checksum (so the safetensors parser sees the bytes) or left
//!   as written (so the checksum must reject them); the rest is the file.
//!
//! Invariant: loading never panics; a broken checkpoint is skipped with a
//! reason; a checkpoint that loads has one part per worker with tables whose
//! rows and optimizer slots match their ids.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tiderec_operators::optim::{DenseOptimizerKind, DenseOptimizerState};
use tiderec_operators::snapshot::{TableRows, WorkerSnapshot};
use tiderec_operators::train::dense_slice;
use tiderec_sinks::checkpoint::layout::{checkpoint_name, shard_file, DENSE_FILE, MANIFEST_FILE};
use tiderec_sinks::checkpoint::write::write_checkpoint;
use tiderec_sinks::checkpoint::{config_hash, find_latest, DataPosition, FileEntry, Manifest, TrainingProgress};

/// Step of the template checkpoint.
pub const STEP: u64 = 5;
const WORKERS: usize = 2;
const SIZES: [u64; 2] = [7, 3];
const DENSE: usize = 5;

/// The files of a valid checkpoint, as bytes.
#[derive(Clone)]
pub struct Template {
    /// `manifest.json`.
    pub manifest: Vec<u8>,
    /// `(name, bytes)` of `dense.safetensors` and every shard.
    pub files: Vec<(String, Vec<u8>)>,
}

/// The parts of a small 2-worker checkpoint.
fn parts() -> Vec<WorkerSnapshot> {
    (0..WORKERS)
        .map(|k| {
            let tables = SIZES
                .iter()
                .map(|&n| {
                    let ids: Vec<u64> = (0..n).filter(|&id| id as usize % WORKERS == k).collect();
                    TableRows {
                        rows: ids.iter().flat_map(|&id| [id as f32, -0.5]).collect(),
                        state: ids.iter().map(|&id| id as f32 * 0.25).collect(),
                        counts: ids.iter().map(|&id| id as u32).collect(),
                        hot: ids.iter().map(|_| tiderec_operators::snapshot::COLD).collect(),
                        last_seen: ids.iter().map(|&id| STEP - 1 - id % 3).collect(),
                        ids,
                        removed: Vec::new(),
                    }
                })
                .collect();
            let slice = dense_slice(DENSE, k, WORKERS);
            WorkerSnapshot {
                worker: k,
                workers: WORKERS,
                step: STEP,
                dim: 2,
                state_width: 1,
                dense_params: if k == 0 { (0..DENSE).map(|i| i as f32).collect() } else { Vec::new() },
                dense_optimizer: DenseOptimizerState {
                    kind: DenseOptimizerKind::Adam,
                    t: STEP,
                    offset: slice.start,
                    len: slice.len(),
                    m: slice.clone().map(|i| i as f32 * 0.1).collect(),
                    v: slice.map(|i| i as f32 * 0.01).collect(),
                },
                tables,
                updated_only: false,
                delta_of: None,
                seed: 1,
                table_sizes: Vec::new(),
                // Worker 0's admission sketch is written whole, worker 1's as its non-zero counters.
                admission: tiderec_operators::snapshot::SketchCounters::from_dense(
                    &(0..8 + 24 * k as u32)
                        .map(|c| if k == 0 { c % 3 + 1 } else { u32::from(c % 6 == 0) * c })
                        .collect::<Vec<_>>(),
                ),
            }
        })
        .collect()
}

/// A checkpoint written by [`write_checkpoint`], read back as bytes.
pub fn template() -> Template {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = serde_json::json!({"table_sizes": SIZES});
    let manifest = Manifest {
        format_version: tiderec_sinks::checkpoint::FORMAT_VERSION,
        step: STEP,
        epoch: 1,
        steps_in_epoch: 2,
        samples: 320,
        seed: 3,
        batch_size: 64,
        workers: WORKERS,
        config_hash: config_hash(&config),
        config,
        pipeline: None,
        data_position: DataPosition { epoch: 1, global_steps_in_epoch: 2, ..Default::default() },
        progress: TrainingProgress {
            loss_total: 1.5,
            loss_window: vec![(0.5, 64)],
            bad_records_before_epoch: vec![0; 5],
            ..Default::default()
        },
        files: BTreeMap::new(),
        delta: None,
        updated_only: false,
    };
    let (path, _) = write_checkpoint(dir.path(), &parts(), manifest, 3).expect("write the template checkpoint");
    let read = |name: &str| std::fs::read(path.join(name)).expect("read the template checkpoint");
    let names = std::iter::once(DENSE_FILE.to_string()).chain((0..WORKERS).map(shard_file));
    Template { manifest: read(MANIFEST_FILE), files: names.map(|n| (n.clone(), read(&n))).collect() }
}

thread_local! {
    static TEMPLATE: Template = template();
}

/// Writes a checkpoint directory `ckpt-<STEP>` under a fresh scratch root; returns the root.
fn write_dir(manifest: &[u8], files: &[(String, Vec<u8>)]) -> PathBuf {
    let root = crate::targets::scratch().join("checkpoints");
    let _ = std::fs::remove_dir_all(&root);
    let dir = root.join(checkpoint_name(STEP));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    std::fs::write(dir.join(MANIFEST_FILE), manifest).expect("write a scratch file");
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).expect("write a scratch file");
    }
    root
}

/// Loads the newest checkpoint of `root` and checks what loads.
fn load_and_check(root: &Path) {
    let search = find_latest(root).unwrap_or_else(|e| panic!("an existing directory is readable: {e}"));
    match search.found {
        Some(c) => {
            assert!(search.skipped.is_empty());
            assert_eq!(c.parts.len(), c.manifest.workers, "one part per worker");
            for p in &c.parts {
                for t in &p.tables {
                    assert_eq!(t.rows.len(), t.ids.len() * p.dim, "rows of a table");
                    assert_eq!(t.state.len(), t.ids.len() * p.state_width, "optimizer slots of a table");
                    assert!(t.counts.is_empty() || t.counts.len() == t.ids.len());
                    assert!(t.hot.is_empty() || t.hot.len() == t.ids.len());
                }
            }
        }
        None => assert_eq!(search.skipped.len(), 1, "the one checkpoint is skipped with a reason"),
    }
}

/// `manifest.json` replaced by the input.
pub fn checkpoint_manifest(data: &[u8]) {
    TEMPLATE.with(|t| {
        let root = write_dir(data, &t.files);
        load_and_check(&root);
    });
}

/// A tensor file replaced by the input (see the [module docs](self)).
pub fn checkpoint_tensors(data: &[u8]) {
    let Some((&selector, bytes)) = data.split_first() else { return };
    TEMPLATE.with(|t| {
        let mut files = t.files.clone();
        let k = selector as usize % files.len();
        files[k].1 = bytes.to_vec();
        let manifest = if selector & 0x80 != 0 {
            t.manifest.clone()
        } else {
            let mut m: Manifest = serde_json::from_slice(&t.manifest).expect("the template manifest parses");
            m.files.insert(
                files[k].0.clone(),
                FileEntry {
                    bytes: bytes.len() as u64,
                    xxh3_128: format!("{:032x}", xxhash_rust::xxh3::xxh3_128(bytes)),
                },
            );
            serde_json::to_vec(&m).expect("a manifest serializes")
        };
        let root = write_dir(&manifest, &files);
        load_and_check(&root);
    });
}

/// Seeds: the template's manifest, and each tensor file with a fixed-up manifest.
pub fn manifest_seeds() -> Vec<Vec<u8>> {
    TEMPLATE.with(|t| vec![t.manifest.clone()])
}

/// Seeds of [`checkpoint_tensors`]: every template file, with a fixed-up manifest.
pub fn tensor_seeds() -> Vec<Vec<u8>> {
    TEMPLATE.with(|t| {
        (0..t.files.len())
            .map(|k| {
                let mut s = vec![k as u8];
                s.extend_from_slice(&t.files[k].1);
                s
            })
            .collect()
    })
}
