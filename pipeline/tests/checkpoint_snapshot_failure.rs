//! A checkpoint whose snapshot fails on one worker, through the library with two timely
//! workers in this process: the rows of every worker live in a store behind the batched
//! (device) interface, which reports a failure when the failing worker takes its snapshot.
//! Every worker leaves the checkpoint in the same round with the same error naming the step
//! and the failed worker, nothing waits forever, the temporary directory is gone, and the
//! checkpoint written before is untouched and loads.

mod common;

use common::checkpoint_entries as entries;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tiderec::checkpointing::{CheckpointOptions, Checkpointer, Position};
use tiderec::error::CheckpointAction;
use tiderec::PipelineError;
use tiderec_operators::nn::{DlrmConfig, ModelConfig};
use tiderec_operators::optim::{DenseOptimizerKind, OptimizerParams, SparseOptimizerKind};
use tiderec_operators::shard::EmbeddingShard;
use tiderec_operators::snapshot::TableRows;
use tiderec_operators::store::{DeviceStore, EmbeddingStore, FixedStore, StoreStats};
use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
use tiderec_operators::{Batch, OperatorError};

/// Samples per worker and step.
const SAMPLES: u64 = 4;
/// How long the workers of one run may take, hangs included.
const LIMIT: Duration = Duration::from_secs(60);
/// What the failing store reports.
const INJECTED: &str = "CUDA device 1: the rows could not be read back";

/// A DLRM on 2 dense features and 2 sparse fields of width 4 over 10-row tables.
fn config() -> TrainerConfig {
    let model = ModelConfig::Dlrm(DlrmConfig {
        num_dense: 2,
        num_sparse: 2,
        dim: 4,
        bottom: vec![4],
        top: vec![3, 1],
        self_interaction: false,
    });
    TrainerConfig {
        table_sizes: vec![10; model.num_sparse()],
        model,
        seed: 1,
        dense_optimizer: DenseOptimizerKind::Adam,
        dense_hp: OptimizerParams::with_lr(0.05),
        sparse_optimizer: SparseOptimizerKind::Sgd,
        sparse_hp: OptimizerParams::with_lr(0.1),
        sequence_tables: vec![],
        store: Default::default(),
        exchange: Default::default(),
    }
}

/// Worker `me`'s micro-batch of step `step`.
fn batch(me: usize, step: u64) -> Batch {
    let mut b = Batch::new(2, 2);
    for i in 0..SAMPLES {
        b.labels.push(((i + step) % 2) as f32);
        b.dense.extend([0.5 + i as f32, 1.0 - step as f32 * 0.1]);
        for (t, f) in b.sparse.iter_mut().enumerate() {
            f.ids.push((me as u64 * 3 + i + t as u64 + step) % 10);
            f.close_bag();
        }
    }
    b
}

/// The fixed store behind the batched interface; once `armed`, the next check for a
/// failure (the one a checkpoint snapshot makes) reports one.
#[derive(Debug)]
struct FailingStore {
    inner: FixedStore,
    armed: Rc<Cell<bool>>,
}

impl FailingStore {
    fn new(config: &TrainerConfig, (me, workers): (usize, usize), armed: Rc<Cell<bool>>) -> Self {
        let dim = config.model.embedding_dim();
        let (kind, hp) = (config.sparse_optimizer, config.sparse_hp);
        let shard = EmbeddingShard::new(me, workers, dim, &config.table_sizes, config.seed, kind, hp).unwrap();
        FailingStore { inner: FixedStore::new(shard), armed }
    }
}

impl EmbeddingStore for FailingStore {
    fn dim(&self) -> usize {
        self.inner.dim()
    }
    fn state_width(&self) -> usize {
        self.inner.state_width()
    }
    fn gather(&mut self, table: usize, ids: &[u64], out: &mut Vec<f32>) {
        self.inner.gather(table, ids, out)
    }
    fn apply(&mut self, table: usize, id: u64, grad: &[f32]) {
        self.inner.apply(table, id, grad)
    }
    fn set_lr(&mut self, lr: f32) {
        self.inner.set_lr(lr)
    }
    fn end_step(&mut self, completed: u64) {
        self.inner.end_step(completed)
    }
    fn export_table(&self, table: usize) -> TableRows {
        self.inner.export_table(table)
    }
    fn exports_updated_only(&self) -> bool {
        self.inner.exports_updated_only()
    }
    fn mark_checkpoint(&mut self) {
        self.inner.mark_checkpoint()
    }
    fn export_changes(&self, table: usize) -> TableRows {
        self.inner.export_changes(table)
    }
    fn reset(&mut self, completed: u64) {
        self.inner.reset(completed)
    }
    fn set_row(&mut self, table: usize, id: u64, row: &[f32], state: &[f32]) -> Result<(), OperatorError> {
        self.inner.set_row(table, id, row, state)
    }
    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }
    fn num_rows(&self) -> usize {
        self.inner.num_rows()
    }
    fn sum_of_squares(&self) -> f64 {
        self.inner.sum_of_squares()
    }
    fn holds_every_row(&self) -> bool {
        self.inner.holds_every_row()
    }
}

impl DeviceStore for FailingStore {
    fn apply_rows(&mut self, rows: &[(u32, u64)], grads: &[f32]) {
        let d = self.dim();
        for (k, &(t, id)) in rows.iter().enumerate() {
            self.inner.apply(t as usize, id, &grads[k * d..(k + 1) * d]);
        }
    }
    fn take_error(&mut self) -> Option<String> {
        self.armed.replace(false).then(|| INJECTED.to_string())
    }
}

/// What a worker's error said: its step, its worker and its message.
#[derive(Clone, Debug)]
struct Failure {
    write: bool,
    step: Option<u64>,
    worker: Option<usize>,
    message: String,
}

impl From<PipelineError> for Failure {
    fn from(e: PipelineError) -> Self {
        let message = e.to_string();
        match e {
            PipelineError::Checkpoint { action, step, worker, .. } => {
                Failure { write: action == CheckpointAction::Write, step, worker, message }
            }
            _ => Failure { write: false, step: None, worker: None, message },
        }
    }
}

/// What one worker saw: the first checkpoint's outcome, the second's, and (worker 0) the
/// first checkpoint's files right after it was written.
type Seen = (usize, Result<(), Failure>, Result<(), Failure>, Option<BTreeMap<PathBuf, Vec<u8>>>);

/// Every file under `dir` with its bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.insert(path.clone(), std::fs::read(&path).unwrap());
        }
    }
    out
}

fn options(dir: &Path, sync: bool) -> CheckpointOptions {
    CheckpointOptions {
        dir: dir.to_path_buf(),
        every: Some(2),
        keep: 3,
        deltas: 4,
        delta_share: 1.0,
        sync,
        pipeline: None,
        inputs: vec![],
        shuffle: None,
    }
}

fn at(step: u64) -> Position {
    Position { step, steps_in_epoch: step, samples: step * 2 * SAMPLES, ..Default::default() }
}

/// Trains `trainer` on steps `from..to`, polling `checkpointer` after each.
fn train(
    worker: &mut timely::worker::Worker,
    trainer: &mut Trainer,
    checkpointer: &mut Checkpointer,
    (from, to): (u64, u64),
) -> Result<(), PipelineError> {
    for s in from..to {
        trainer.step(worker, StepKind::Train, batch(worker.index(), s)).map_err(PipelineError::from)?;
        checkpointer.poll(worker)?;
    }
    Ok(())
}

/// Two workers write the checkpoint of step 2, then that of step 4, whose snapshot fails
/// on worker `failing`; returns what each worker saw, or `None` when they did not all finish
/// within [`LIMIT`].
fn run(dir: &Path, failing: usize, sync: bool) -> Option<Vec<Seen>> {
    let (tx, rx) = mpsc::channel::<Seen>();
    let dir = dir.to_path_buf();
    // The workers run on their own threads, so that a hang is seen rather than waited out.
    std::thread::spawn(move || {
        let _ = timely::execute(timely::Config::process(2), move |worker| {
            let (me, config) = (worker.index(), config());
            let armed = Rc::new(Cell::new(false));
            let store = Box::new(FailingStore::new(&config, (me, worker.peers()), armed.clone()));
            let model = config.model.build(config.seed).unwrap();
            let mut trainer = Trainer::with_model_and_store(worker, &config, model, store).unwrap();
            let mut checkpointer = Checkpointer::new(worker, Some(options(&dir, sync)), &config, 2 * SAMPLES);
            let first = train(worker, &mut trainer, &mut checkpointer, (0, 2))
                .and_then(|_| checkpointer.write(worker, &trainer, &at(2)))
                .and_then(|_| checkpointer.finish(worker));
            let before = (me == 0).then(|| files(&dir.join("ckpt-2")));
            let second = train(worker, &mut trainer, &mut checkpointer, (2, 4)).and_then(|_| {
                armed.set(me == failing);
                checkpointer.write(worker, &trainer, &at(4))?;
                train(worker, &mut trainer, &mut checkpointer, (4, 8))?;
                checkpointer.finish(worker)
            });
            let _ = tx.send((me, first.map_err(Failure::from), second.map_err(Failure::from), before));
        });
    });
    let deadline = Instant::now() + LIMIT;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).ok()?);
    }
    seen.sort_by_key(|s| s.0);
    Some(seen)
}

#[test]
fn a_snapshot_failing_on_one_worker_fails_the_checkpoint_on_every_worker() {
    for sync in [false, true] {
        for failing in [1, 0] {
            let case = format!("snapshot failing on worker {failing}, --checkpoint-sync {sync}");
            let tmp = tempfile::tempdir().unwrap();
            let ck = tmp.path().join("ck");
            std::fs::create_dir(&ck).unwrap();
            let Some(seen) = run(&ck, failing, sync) else {
                panic!("{case}: the workers did not all finish within {LIMIT:?}");
            };
            for (me, first, second, _) in &seen {
                assert!(first.is_ok(), "{case}: worker {me}: {first:?}");
                let e = second.clone().expect_err(&format!("{case}: worker {me} went on"));
                assert!(e.write && e.step == Some(4) && e.worker == Some(failing), "{case}: worker {me}: {e:?}");
                assert!(e.message.contains("snapshot") && e.message.contains(INJECTED), "{case}: {}", e.message);
            }
            assert_eq!(seen[0].2.as_ref().unwrap_err().message, seen[1].2.as_ref().unwrap_err().message, "{case}");
            // No temporary directory is left, and the checkpoint written before is untouched.
            assert_eq!(entries(&ck), (vec![2], vec![]), "{case}");
            assert_eq!(Some(files(&ck.join("ckpt-2"))), seen[0].3, "{case}");
            let search = tiderec_sinks::checkpoint::find_latest(&ck).unwrap();
            assert!(search.skipped.is_empty(), "{case}");
            let found = search.found.expect("ckpt-2 loads");
            assert_eq!((found.manifest.step, found.parts.len()), (2, 2), "{case}");
            restores(found.parts);
        }
    }
}

/// `parts` restore into a trainer of one worker.
fn restores(parts: Vec<tiderec_operators::snapshot::WorkerSnapshot>) {
    timely::execute(timely::Config::thread(), move |worker| {
        let config = config();
        let mut trainer = Trainer::with_model(worker, &config, config.model.build(config.seed).unwrap()).unwrap();
        trainer.restore(&parts).expect("the checkpoint restores");
    })
    .unwrap();
}
