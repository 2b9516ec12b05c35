//! `Trainer::snapshot` / `Trainer::restore`: an exact round trip at the same
//! worker count, and re-sharding of a 2-worker checkpoint into 1 and 3 workers
//! that keeps every row, every optimizer slot and the dense state.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tiderec_operators::nn::{DlrmConfig, ModelConfig};
use tiderec_operators::optim::{DenseOptimizerKind, DenseOptimizerState, OptimizerParams, SparseOptimizerKind};
use tiderec_operators::snapshot::WorkerSnapshot;
use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
use tiderec_operators::Batch;

mod common;

const GLOBAL_BATCH: usize = 12;

fn config(seed: u64, sparse: SparseOptimizerKind) -> TrainerConfig {
    TrainerConfig {
        model: ModelConfig::Dlrm(DlrmConfig {
            num_dense: 2,
            num_sparse: 3,
            dim: 4,
            bottom: vec![8, 4],
            top: vec![8, 1],
            self_interaction: false,
        }),
        table_sizes: vec![17, 5, 40],
        seed,
        dense_optimizer: DenseOptimizerKind::Adam,
        dense_hp: OptimizerParams::with_lr(0.01),
        sparse_optimizer: sparse,
        sparse_hp: OptimizerParams { initial_accumulator: 0.1, ..OptimizerParams::with_lr(0.05) },
        sequence_tables: vec![],
        store: Default::default(),
        exchange: Default::default(),
    }
}

/// Worker `w`'s share of the deterministic global batch of `step`.
fn micro_batch(step: u64, w: usize, workers: usize) -> Batch {
    let mut b = Batch::new(2, 3);
    for i in GLOBAL_BATCH * w / workers..GLOBAL_BATCH * (w + 1) / workers {
        let x = step * 31 + i as u64 * 7;
        b.labels.push(x.is_multiple_of(3) as u32 as f32);
        b.dense.extend([(x % 5) as f32 * 0.2, (x % 11) as f32 * 0.1]);
        for (t, n) in [17u64, 5, 40].into_iter().enumerate() {
            b.sparse[t].ids.push((x * (t as u64 + 3)) % n);
            if x.is_multiple_of(4) {
                b.sparse[t].ids.push((x + 1) % n); // a bag of two
            }
            b.sparse[t].close_bag();
        }
    }
    b
}

struct Outcome {
    /// Snapshots taken after `snapshot_at` steps, by worker.
    snapshots: Vec<WorkerSnapshot>,
    /// Parameter L2 norm at the end.
    l2: f64,
}

/// Trains `workers` workers from `restore` (or from scratch) for steps `first..last`,
/// snapshotting after step `snapshot_at` (or right after restoring when it equals `first`).
fn run(
    workers: usize,
    config: TrainerConfig,
    restore: Option<Arc<Vec<WorkerSnapshot>>>,
    first: u64,
    snapshot_at: u64,
    last: u64,
) -> Outcome {
    let snapshots = Arc::new(Mutex::new(Vec::new()));
    let l2 = Arc::new(Mutex::new(0.0));
    let (snaps, l2_out) = (snapshots.clone(), l2.clone());
    timely::execute(timely::Config::process(workers), move |worker| {
        let mut trainer = Trainer::new(worker, &config).unwrap();
        if let Some(parts) = &restore {
            trainer.restore(parts).unwrap();
            assert_eq!(trainer.train_steps(), first);
        }
        for step in first..last {
            if step == snapshot_at {
                snaps.lock().unwrap().push(trainer.snapshot().unwrap());
            }
            let b = micro_batch(step, worker.index(), worker.peers());
            trainer.step(worker, StepKind::Train, b).unwrap();
        }
        if last == snapshot_at {
            snaps.lock().unwrap().push(trainer.snapshot().unwrap());
        }
        let norm = trainer.params_l2(worker).unwrap();
        *l2_out.lock().unwrap() = norm;
    })
    .unwrap();
    let mut snapshots = std::mem::take(&mut *snapshots.lock().unwrap());
    snapshots.sort_by_key(|s| s.worker);
    let l2 = *l2.lock().unwrap();
    Outcome { snapshots, l2 }
}

/// Every row and slot of a checkpoint by (table, id), the dense parameters and the whole dense state.
type Merged = (BTreeMap<(usize, u64), (Vec<f32>, Vec<f32>)>, Vec<f32>, DenseOptimizerState);

fn merge(parts: &[WorkerSnapshot]) -> Merged {
    let mut rows = BTreeMap::new();
    for p in parts {
        for (t, table) in p.tables.iter().enumerate() {
            for (i, &id) in table.ids.iter().enumerate() {
                let (d, w) = (p.dim, p.state_width);
                let old = rows.insert(
                    (t, id),
                    (table.rows[i * d..(i + 1) * d].to_vec(), table.state[i * w..(i + 1) * w].to_vec()),
                );
                assert!(old.is_none(), "row {id} of table {t} in two parts");
            }
        }
    }
    let n = parts[0].dense_params.len();
    for p in parts {
        assert_eq!(p.dense_params, parts[0].dense_params, "every worker holds the same dense parameters");
    }
    let states: Vec<&DenseOptimizerState> = parts.iter().map(|p| &p.dense_optimizer).collect();
    (rows, parts[0].dense_params.clone(), DenseOptimizerState::concat(&states, n).unwrap())
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs())
}

#[test]
fn snapshot_then_restore_is_exact_and_reshards_across_worker_counts() {
    for sparse in [SparseOptimizerKind::RowwiseAdagrad, SparseOptimizerKind::LazyAdam] {
        let straight = run(2, config(1, sparse), None, 0, 6, 10);
        let parts = Arc::new(straight.snapshots.clone());
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].step, 6);
        let reference = merge(&parts);
        // The fixed store's parts list the rows some step updated; the rest keep their seeded values.
        assert!(parts.iter().all(|p| p.updated_only));
        assert!(!reference.0.is_empty() && reference.0.len() < 17 + 5 + 40, "{} rows", reference.0.len());
        assert_eq!(reference.2.t, 6, "six Adam updates");

        // Same worker count: restoring and snapshotting again gives the very same parts,
        // and training on gives the very same model as the run that was never interrupted.
        let resumed = run(2, config(1, sparse), Some(parts.clone()), 6, 6, 10);
        assert_eq!(resumed.snapshots, *parts, "{sparse:?}: snapshot → restore → snapshot is the identity");
        assert_eq!(resumed.l2, straight.l2, "{sparse:?}: resumed training is bit-identical");

        // Other worker counts: the same rows, slots and dense state, re-sharded.
        for workers in [1usize, 3] {
            let moved = run(workers, config(1, sparse), Some(parts.clone()), 6, 6, 10);
            assert_eq!(moved.snapshots.len(), workers);
            for s in &moved.snapshots {
                assert_eq!(s.workers, workers);
                for (t, table) in s.tables.iter().enumerate() {
                    assert!(table.ids.iter().all(|&id| tiderec_operators::shard::shard_of(t, id, workers) == s.worker));
                }
            }
            assert_eq!(merge(&moved.snapshots), reference, "{sparse:?}: W = 2 → W = {workers} keeps every value");
            let r = rel(moved.l2, straight.l2);
            assert!(
                r < 1e-5,
                "{sparse:?}: W = {workers} continues like W = 2: {} vs {} ({r:e})",
                moved.l2,
                straight.l2
            );
        }
    }
}

#[test]
fn a_checkpoint_of_another_shape_is_refused_and_changes_nothing() {
    let parts = Arc::new(run(2, config(1, SparseOptimizerKind::RowwiseAdagrad), None, 0, 3, 3).snapshots);
    let mut other = config(5, SparseOptimizerKind::RowwiseAdagrad);
    other.table_sizes[2] = 41;
    let errors = Arc::new(Mutex::new(Vec::new()));
    let e2 = errors.clone();
    let p2 = parts.clone();
    timely::execute(timely::Config::process(2), move |worker| {
        let mut trainer = Trainer::new(worker, &other).unwrap();
        let before = trainer.snapshot().unwrap();
        let e = trainer.restore(&p2).unwrap_err().to_string();
        assert_eq!(trainer.snapshot().unwrap(), before, "a refused restore leaves the trainer as it was");
        e2.lock().unwrap().push(e);
    })
    .unwrap();
    for e in errors.lock().unwrap().iter() {
        assert!(e.contains("tables of [17, 5, 40] rows") && e.contains("41"), "{e}");
    }
    // Rows left out of the parts are the writer's seeded rows: another seed is refused.
    let reseeded = config(77, SparseOptimizerKind::RowwiseAdagrad);
    let p3 = parts.clone();
    timely::execute(timely::Config::process(1), move |worker| {
        let mut trainer = Trainer::new(worker, &reseeded).unwrap();
        let e = trainer.restore(&p3).unwrap_err().to_string();
        assert!(e.contains("seeded with 1") && e.contains("77"), "{e}");
    })
    .unwrap();
    // The sparse optimizer's slot count is part of the shape as well.
    let lazy = config(5, SparseOptimizerKind::LazyAdam);
    timely::execute(timely::Config::process(1), move |worker| {
        let mut trainer = Trainer::new(worker, &lazy).unwrap();
        let e = trainer.restore(&parts).unwrap_err().to_string();
        assert!(e.contains("optimizer slots"), "{e}");
    })
    .unwrap();
}

/// A restore between two steps on every worker (not collective: each restores on its
/// own) is what every later step sees, whichever worker restores first: a worker that
/// finished its step and restored early sends its next requests while another is still
/// finishing the step before; that owner answers them only once it has begun the next
/// step, so after its own restore. Repeated, since the order of the workers varies from
/// run to run; the same losses and parameters as restoring before the first step.
#[test]
fn a_restore_between_steps_is_seen_by_every_later_step() {
    let c = config(9, SparseOptimizerKind::RowwiseAdagrad);
    let parts = Arc::new(run(3, c.clone(), None, 0, 6, 6).snapshots);
    // Restored before any step (nothing in flight): the reference.
    let fresh = run(3, c.clone(), Some(parts.clone()), 6, 9, 9);
    for round in 0..30 {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (out, c, parts) = (seen.clone(), c.clone(), parts.clone());
        timely::execute(timely::Config::process(3), move |worker| {
            let mut trainer = Trainer::new(worker, &c).unwrap();
            for step in 0..3 {
                trainer.step(worker, StepKind::Train, micro_batch(step, worker.index(), 3)).unwrap();
            }
            trainer.restore(&parts).unwrap();
            for step in 6..9 {
                trainer.step(worker, StepKind::Train, micro_batch(step, worker.index(), 3)).unwrap();
            }
            let l2 = trainer.params_l2(worker).unwrap();
            out.lock().unwrap().push((trainer.snapshot().unwrap(), l2));
        })
        .unwrap();
        let mut seen = std::mem::take(&mut *seen.lock().unwrap());
        seen.sort_by_key(|(s, _)| s.worker);
        let snapshots: Vec<WorkerSnapshot> = seen.iter().map(|(s, _)| s.clone()).collect();
        assert_eq!(merge(&snapshots), merge(&fresh.snapshots), "round {round}: the state after the restore");
        assert_eq!(seen[0].1.to_bits(), fresh.l2.to_bits(), "round {round}: params L2");
    }
}

/// A restore in place puts the replicated hot rows back too: after training steps that
/// update them, a restore of the step-0 checkpoint (whose parts list no row, none
/// having been trained) leaves every replica as a fresh trainer restored from the same
/// parts holds it. An evaluation step on the hot ids, then a training step and the
/// checkpoint after it, are the same bit for bit.
#[test]
fn a_restore_in_place_puts_the_replicated_rows_back() {
    let mut c = common::config(common::dlrm());
    c.sparse_optimizer = SparseOptimizerKind::RowwiseAdagrad;
    c.exchange = common::replicated_exchange(&c.table_sizes);
    let start = Arc::new(Mutex::new(Vec::new()));
    let (out, config) = (start.clone(), c.clone());
    timely::execute(timely::Config::process(2), move |worker| {
        let part = Trainer::new(worker, &config).unwrap().snapshot().unwrap();
        out.lock().unwrap().push(part);
    })
    .unwrap();
    let parts = Arc::new(std::mem::take(&mut *start.lock().unwrap()));
    assert!(parts.iter().all(|p| p.tables.iter().all(|t| t.ids.is_empty())), "no row trained at step 0");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    timely::execute(timely::Config::process(2), move |worker| {
        let me = worker.index();
        let mut trained = Trainer::new(worker, &c).unwrap();
        for s in 0..3 {
            trained.step(worker, StepKind::Train, common::batch(me, s, 3)).unwrap();
        }
        trained.restore(&parts).unwrap();
        let mut fresh = Trainer::new(worker, &c).unwrap();
        fresh.restore(&parts).unwrap();
        // Every id of both tables, the five hot ones among them.
        let eval = common::batch(me, 7, 10);
        let mut runs = Vec::new();
        for trainer in [&mut trained, &mut fresh] {
            let loss = trainer.step(worker, StepKind::Eval, eval.clone()).unwrap().loss_sum.to_bits();
            let probs: Vec<u32> = trainer.take_eval().probs.iter().map(|p| p.to_bits()).collect();
            trainer.step(worker, StepKind::Train, common::batch(me, 4, 3)).unwrap();
            runs.push((loss, probs, trainer.snapshot().unwrap()));
        }
        out.lock().unwrap().push((me, runs));
    })
    .unwrap();
    for (me, runs) in seen.lock().unwrap().iter() {
        assert_eq!((runs[0].0, &runs[0].1), (runs[1].0, &runs[1].1), "worker {me}: the evaluation");
        assert_eq!(runs[0].2, runs[1].2, "worker {me}: the checkpoint after a training step");
    }
}
