//! `Trainer::with_model_and_store`: the rows a worker owns in a store of the
//! caller's (`DeviceStore`, as a GPU worker keeps its rows on its device). The
//! store here keeps them on the host, behind the batched interface, so what is
//! tested is the trainer's side: any mix of such workers and plain ones trains
//! bit for bit as plain workers do (losses, parameters, checkpoints, a restore
//! from one to the other, the single-sender and the summing update paths), and
//! a failure the store reports inside a step fails that step on its worker and
//! on every other. The tiered store with its hot tier in another memory
//! (`OffloadedTieredStore`, here over `HostHotTier`) trains as plain tiered
//! workers do, checkpoints included.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use tiderec_operators::optim::SparseOptimizerKind;
use tiderec_operators::shard::EmbeddingShard;
use tiderec_operators::snapshot::{TableRows, WorkerSnapshot, COLD};
use tiderec_operators::store::{
    DeviceStore, EmbeddingStore, FixedStore, HostHotTier, OffloadedTieredStore, StoreConfig, StoreKind, StoreStats,
    TieredStore,
};
use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
use tiderec_operators::{Batch, OperatorError};

mod common;

use common::{config, dlrm};

/// The fixed store behind the batched interface; it reports a failure after
/// `fail_after` batched updates, or after `fail_serving_after` batched reads (and its
/// gathers then give zeros).
#[derive(Debug)]
struct HostBacked {
    inner: FixedStore,
    applied: usize,
    fail_after: Option<usize>,
    served: usize,
    fail_serving_after: Option<usize>,
    failed: bool,
    reported: bool,
    /// Set by a test: the next read of changed rows fails, and the failure is reported.
    lose_changes: Rc<Cell<bool>>,
    lost: Cell<bool>,
}

impl HostBacked {
    fn new(config: &TrainerConfig, (me, workers): (usize, usize), fail_after: Option<usize>) -> Self {
        let dim = config.model.embedding_dim();
        let (kind, hp) = (config.sparse_optimizer, config.sparse_hp);
        let shard = EmbeddingShard::new(me, workers, dim, &config.table_sizes, config.seed, kind, hp).unwrap();
        let (lose_changes, lost) = (Rc::default(), Cell::new(false));
        HostBacked {
            inner: FixedStore::new(shard),
            applied: 0,
            fail_after,
            served: 0,
            fail_serving_after: None,
            failed: false,
            reported: false,
            lose_changes,
            lost,
        }
    }
}

impl EmbeddingStore for HostBacked {
    fn dim(&self) -> usize {
        self.inner.dim()
    }
    fn state_width(&self) -> usize {
        self.inner.state_width()
    }
    fn gather(&mut self, table: usize, ids: &[u64], out: &mut Vec<f32>) {
        if self.failed {
            out.resize(out.len() + ids.len() * self.dim(), 0.0);
        } else {
            self.inner.gather(table, ids, out)
        }
    }
    fn gather_many(&mut self, lookups: &[(usize, &[u64])], out: &mut Vec<f32>) {
        self.served += 1;
        if self.fail_serving_after.is_some_and(|n| self.served > n) {
            self.failed = true;
        }
        for &(table, ids) in lookups {
            self.gather(table, ids, out);
        }
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
        if self.lose_changes.replace(false) || self.lost.get() {
            self.lost.set(true);
            return TableRows::default();
        }
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

impl DeviceStore for HostBacked {
    fn apply_rows(&mut self, rows: &[(u32, u64)], grads: &[f32]) {
        self.applied += 1;
        if self.fail_after.is_some_and(|n| self.applied > n) {
            self.failed = true;
            return;
        }
        let d = self.dim();
        for (k, &(t, id)) in rows.iter().enumerate() {
            self.inner.apply(t as usize, id, &grads[k * d..(k + 1) * d]);
        }
    }
    fn take_error(&mut self) -> Option<String> {
        if self.lost.replace(false) {
            return Some("CUDA device 3: the changed rows could not be read back".into());
        }
        (self.failed && !std::mem::replace(&mut self.reported, true))
            .then(|| "CUDA device 3: an injected failure".to_string())
    }
}

/// Worker `me`'s micro-batch of step `s`: the fixtures' batches, with every
/// third one repeating an id across the workers so that owners sum senders.
fn batch(me: usize, s: u64) -> Batch {
    common::batch(if s.is_multiple_of(3) { 0 } else { me }, s, 4)
}

/// What a run shows: per worker, its losses (bits), params L2 (bits) and final snapshot.
type Seen = Vec<(usize, Vec<u64>, u64, WorkerSnapshot)>;

/// Builds worker `me` of `workers`'s store behind the batched interface.
type MakeStore = fn(&TrainerConfig, (usize, usize)) -> Box<dyn DeviceStore>;

/// The fixed store behind the batched interface.
fn fixed(config: &TrainerConfig, at: (usize, usize)) -> Box<dyn DeviceStore> {
    Box::new(HostBacked::new(config, at, None))
}

/// The tiered store with its hot tier in a memory of its own.
fn tiered(config: &TrainerConfig, (worker, workers): (usize, usize)) -> Box<dyn DeviceStore> {
    let (dim, optimizer) = (config.model.embedding_dim(), config.sparse_optimizer);
    let memory = HostHotTier::new(dim, optimizer.state_width(dim));
    let store = TieredStore::new(&config.store, &config.store_params((worker, workers)));
    Box::new(OffloadedTieredStore::new(store, memory).unwrap())
}

/// `workers` workers, those in `boxed` with their rows behind the batched
/// store `make` builds, 8 training steps and an evaluation step; with
/// `resume`, restored from those parts after step 4.
fn run(
    (config, make): (&TrainerConfig, MakeStore),
    workers: usize,
    boxed: &'static [usize],
    resume: Option<Vec<WorkerSnapshot>>,
) -> Seen {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (out, config) = (seen.clone(), config.clone());
    timely::execute(timely::Config::process(workers), move |worker| {
        let (me, model) = (worker.index(), config.model.build(config.seed).unwrap());
        let mut trainer = if boxed.contains(&me) {
            Trainer::with_model_and_store(worker, &config, model, make(&config, (me, workers))).unwrap()
        } else {
            Trainer::with_model(worker, &config, model).unwrap()
        };
        let mut losses = Vec::new();
        for s in 0..8 {
            if s == 4 {
                if let Some(parts) = &resume {
                    trainer.restore(parts).unwrap();
                }
            }
            losses.push(trainer.step(worker, StepKind::Train, batch(me, s)).unwrap().loss_sum.to_bits());
        }
        losses.push(trainer.step(worker, StepKind::Eval, batch(me, 50)).unwrap().loss_sum.to_bits());
        let l2 = trainer.params_l2(worker).unwrap().to_bits();
        let part = trainer.checkpoint_snapshot(None).unwrap();
        out.lock().unwrap().push((me, losses, l2, part));
    })
    .unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by_key(|s| s.0);
    seen
}

/// SGD and row-wise Adagrad rows, each under the fixed store behind the
/// batched interface and under the tiered store with its hot tier elsewhere
/// (re-planned every other step from the second, so that rows move in and out
/// of the hot tier within the run).
fn configs() -> Vec<(String, TrainerConfig, MakeStore)> {
    let mut out = Vec::new();
    for rows in [SparseOptimizerKind::Sgd, SparseOptimizerKind::RowwiseAdagrad] {
        let mut c = config(dlrm());
        c.sparse_optimizer = rows;
        out.push((format!("{rows} rows, fixed store"), c.clone(), fixed as MakeStore));
        c.store =
            StoreConfig { kind: StoreKind::Tiered, hot_rows: 6, warmup: 2, flush_every: 2, ..StoreConfig::default() };
        out.push((format!("{rows} rows, hot tier elsewhere"), c, tiered as MakeStore));
    }
    out
}

#[test]
fn workers_with_their_rows_in_a_device_store_train_as_plain_workers() {
    for (name, c, make) in configs() {
        for (workers, boxed) in [(1, &[0][..]), (2, &[1][..]), (2, &[0, 1][..]), (3, &[0, 2][..])] {
            let (got, want) = (run((&c, make), workers, boxed, None), run((&c, make), workers, &[], None));
            assert_eq!(got, want, "{name}: {workers} workers, {boxed:?} in device stores");
            if c.store.kind == StoreKind::Tiered {
                let hot = got.iter().flat_map(|s| &s.3.tables).flat_map(|t| &t.hot).filter(|&&h| h != COLD).count();
                assert!(hot > 0 && hot <= 6 * workers, "{name}: {hot} hot rows on {workers} workers");
            }
        }
    }
}

#[test]
fn checkpoints_move_between_device_stores_and_plain_workers() {
    for (name, c, make) in configs() {
        let parts: Vec<WorkerSnapshot> = run((&c, make), 2, &[], None).into_iter().map(|s| s.3).collect();
        let boxed_parts: Vec<WorkerSnapshot> = run((&c, make), 2, &[0, 1], None).into_iter().map(|s| s.3).collect();
        assert_eq!(boxed_parts, parts, "{name}: the same checkpoint");
        // Resumed on three workers, one of them plain, from either side's parts.
        let from_plain = run((&c, make), 3, &[0, 1], Some(parts.clone()));
        assert_eq!(from_plain, run((&c, make), 3, &[], Some(parts)), "{name}: resumed");
        let from_boxed = run((&c, make), 3, &[2], Some(boxed_parts.clone()));
        assert_eq!(from_boxed, run((&c, make), 3, &[], Some(boxed_parts)), "{name}");
    }
}

#[test]
fn a_failing_device_store_fails_its_step_and_stops_every_worker() {
    let c = config(dlrm());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    timely::execute(timely::Config::process(2), move |worker| {
        let (me, model) = (worker.index(), c.model.build(c.seed).unwrap());
        let mut trainer = if me == 1 {
            let store = Box::new(HostBacked::new(&c, (me, 2), Some(2)));
            Trainer::with_model_and_store(worker, &c, model, store).unwrap()
        } else {
            Trainer::with_model(worker, &c, model).unwrap()
        };
        let failure = common::first_failure(worker, &mut trainer, 6, |s| batch(me, s));
        let device = |e: &OperatorError| matches!(e, OperatorError::Device { worker: 1, message } if message.contains("CUDA device 3"));
        out.lock().unwrap().push((me, common::failure_line(failure, device)));
    })
    .unwrap();
    let mut seen = seen.lock().unwrap().clone();
    common::assert_worker_1_failed_in_step_2(&mut seen, "CUDA device 3: an injected failure");
}

/// Where worker 1's store fails in step 2, if it does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum StoreFailure {
    None,
    /// Serving the step's rows (its fifth batched read, two per step).
    Serving,
    /// Updating the step's rows (its third batched update).
    Updating,
}

/// Two workers, worker 1 with its rows in a store that fails as `failure` says;
/// every worker stops at its first step that did not train cleanly, as the pipeline
/// does. Per worker: that step and its outcome as a line, its dense parameters and
/// checkpoint share, and its training steps.
fn stop_at_failure(
    c: &TrainerConfig,
    failure: StoreFailure,
    steps: u64,
) -> Vec<(usize, String, Vec<f32>, WorkerSnapshot, u64)> {
    let c = c.clone();
    common::within(60, move || {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let out = seen.clone();
        timely::execute(timely::Config::process(2), move |worker| {
            let (me, model) = (worker.index(), c.model.build(c.seed).unwrap());
            let mut trainer = if me == 1 {
                let fail_after = (failure == StoreFailure::Updating).then_some(2);
                let mut store = HostBacked::new(&c, (me, 2), fail_after);
                store.fail_serving_after = (failure == StoreFailure::Serving).then_some(4);
                Trainer::with_model_and_store(worker, &c, model, Box::new(store)).unwrap()
            } else {
                Trainer::with_model(worker, &c, model).unwrap()
            };
            let line = match common::until_first_bad_step(worker, &mut trainer, steps, |s| batch(me, s)) {
                None => String::new(),
                Some((s, Ok(stats))) => format!("step {s}: {} failed", stats.failed_workers),
                Some((s, Err(e))) => {
                    assert!(matches!(&e, OperatorError::Device { worker: 1, .. }), "{e:?}");
                    format!("step {s}: error: {e}")
                }
            };
            let (params, part) = (trainer.dense_params().unwrap(), trainer.snapshot().unwrap());
            out.lock().unwrap().push((me, line, params, part, trainer.train_steps()));
        })
        .unwrap();
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_by_key(|s| s.0);
        seen
    })
}

/// A store that fails serving or updating the rows of step 2 fails that step on every
/// worker: each returns from it (worker 1 with its device's error, worker 0 told of
/// one failed worker), none waits for another step. One that failed serving its rows
/// changed no parameter in it: each worker's dense parameters and checkpoint share
/// equal those of a run that stopped before it.
#[test]
fn a_store_failing_in_a_step_fails_that_step_on_every_worker() {
    let c = config(dlrm());
    let clean = stop_at_failure(&c, StoreFailure::None, 2);
    for failure in [StoreFailure::Serving, StoreFailure::Updating] {
        let seen = stop_at_failure(&c, failure, 6);
        assert_eq!(seen[0].1, "step 2: 1 failed", "{failure:?}");
        let error = "step 2: error: compute device error on worker 1: CUDA device 3: an injected failure";
        assert_eq!(seen[1].1, error, "{failure:?}");
        for (s, c) in seen.iter().zip(&clean) {
            assert_eq!(s.4, 2, "{failure:?}: worker {}: two training steps", s.0);
            if failure == StoreFailure::Serving {
                assert_eq!((&s.2, &s.3), (&c.2, &c.3), "worker {}: the failed step updated nothing", s.0);
            }
        }
    }
}

/// A checkpoint whose rows a store in another memory could not read back fails
/// with the device's message and leaves the delta mark where it was: the next
/// delta still counts from the last good checkpoint, and equals the plain
/// worker's.
#[test]
fn a_checkpoint_the_store_could_not_read_back_leaves_the_mark() {
    let c = config(dlrm());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    timely::execute(timely::Config::process(1), move |worker| {
        let mut runs = Vec::new();
        for boxed in [false, true] {
            let model = c.model.build(c.seed).unwrap();
            let store = HostBacked::new(&c, (0, 1), None);
            let lose = store.lose_changes.clone();
            let mut trainer = if boxed {
                Trainer::with_model_and_store(worker, &c, model, Box::new(store)).unwrap()
            } else {
                Trainer::with_model(worker, &c, model).unwrap()
            };
            let mut parts = Vec::new();
            for s in 0..6 {
                trainer.step(worker, StepKind::Train, batch(0, s)).unwrap();
                if s == 1 {
                    parts.push(trainer.checkpoint_snapshot(None).unwrap());
                }
                if s == 4 && boxed {
                    lose.set(true);
                    let e = trainer.checkpoint_snapshot(Some(2)).unwrap_err();
                    assert!(e.to_string().contains("could not be read back"), "{e}");
                    assert_eq!(trainer.checkpoint_mark(), Some(2), "the mark stays at the last good checkpoint");
                }
            }
            parts.push(trainer.checkpoint_snapshot(Some(2)).unwrap());
            runs.push(parts);
        }
        out.lock().unwrap().push(runs);
    })
    .unwrap();
    let runs = seen.lock().unwrap().pop().unwrap();
    assert_eq!(runs[0], runs[1], "the delta after a failed one equals the plain worker's");
}
