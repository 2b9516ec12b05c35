//! Embedding stores inside the trainer: the dynamic (admission and eviction
//! off) and tiered stores train the model of the fixed table, on one worker
//! and on two; a dynamic / tiered checkpoint restores exactly, re-sharded
//! across worker counts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tiderec_operators::nn::{DlrmConfig, ModelConfig};
use tiderec_operators::optim::{DenseOptimizerKind, OptimizerParams, SparseOptimizerKind};
use tiderec_operators::snapshot::WorkerSnapshot;
use tiderec_operators::store::{FrequencySource, StoreConfig, StoreKind, StoreStats};
use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
use tiderec_operators::{Batch, OperatorError, RestoreError};

const GLOBAL_BATCH: usize = 24;
const SIZES: [u64; 3] = [1000, 7, 5000];

fn config(kind: StoreKind) -> TrainerConfig {
    TrainerConfig {
        model: ModelConfig::Dlrm(DlrmConfig {
            num_dense: 2,
            num_sparse: 3,
            dim: 4,
            bottom: vec![8, 4],
            top: vec![8, 1],
            self_interaction: false,
        }),
        table_sizes: SIZES.to_vec(),
        seed: 3,
        dense_optimizer: DenseOptimizerKind::Adam,
        dense_hp: OptimizerParams::with_lr(0.01),
        sparse_optimizer: SparseOptimizerKind::LazyAdam,
        sparse_hp: OptimizerParams::with_lr(0.05),
        sequence_tables: vec![],
        store: StoreConfig { kind, hot_rows: 10, warmup: 2, flush_every: 3, ..StoreConfig::default() },
        exchange: Default::default(),
    }
}

/// Worker `w`'s share of the global batch of `step`: skewed ids (a few hot, a long tail).
fn micro_batch(step: u64, w: usize, workers: usize) -> Batch {
    let mut b = Batch::new(2, 3);
    for i in GLOBAL_BATCH * w / workers..GLOBAL_BATCH * (w + 1) / workers {
        let x = step * 131 + i as u64 * 17;
        b.labels.push(x.is_multiple_of(3) as u32 as f32);
        b.dense.extend([(x % 5) as f32 * 0.2, (x % 11) as f32 * 0.1]);
        for (t, n) in SIZES.into_iter().enumerate() {
            let hot = !x.is_multiple_of(3);
            b.sparse[t].ids.push(if hot { x % 5 } else { (x * (t as u64 + 3) * 7919) % n });
            if x.is_multiple_of(4) {
                b.sparse[t].ids.push((x + 1) % n);
            }
            b.sparse[t].close_bag();
        }
    }
    b
}

struct Outcome {
    snapshots: Vec<WorkerSnapshot>,
    stats: StoreStats,
    loss: f64,
}

fn run(
    workers: usize,
    config: TrainerConfig,
    restore: Option<Arc<Vec<WorkerSnapshot>>>,
    first: u64,
    last: u64,
) -> Outcome {
    let snapshots = Arc::new(Mutex::new(Vec::new()));
    let stats = Arc::new(Mutex::new(StoreStats::default()));
    let loss = Arc::new(Mutex::new(0.0));
    let (snaps, st, lo) = (snapshots.clone(), stats.clone(), loss.clone());
    timely::execute(timely::Config::process(workers), move |worker| {
        let mut trainer = Trainer::new(worker, &config).unwrap();
        if let Some(parts) = &restore {
            trainer.restore(parts).unwrap();
        }
        let mut total = 0.0;
        for step in first..last {
            let b = micro_batch(step, worker.index(), worker.peers());
            total += trainer.step(worker, StepKind::Train, b).unwrap().loss_sum;
        }
        snaps.lock().unwrap().push(trainer.snapshot().unwrap());
        st.lock().unwrap().add(&trainer.store_stats());
        *lo.lock().unwrap() = total;
    })
    .unwrap();
    let mut snapshots = std::mem::take(&mut *snapshots.lock().unwrap());
    snapshots.sort_by_key(|s| s.worker);
    let stats = *stats.lock().unwrap();
    let loss = *loss.lock().unwrap();
    Outcome { snapshots, stats, loss }
}

type Rows = BTreeMap<(usize, u64), (Vec<f32>, Vec<f32>)>;

fn rows_of(parts: &[WorkerSnapshot]) -> Rows {
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
    rows
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * x.abs().max(y.abs()).max(1e-3))
}

#[test]
fn dynamic_and_tiered_stores_train_the_fixed_tables_model_on_one_and_two_workers() {
    assert!(rows_of(&run(1, config(StoreKind::Fixed), None, 0, 0).snapshots).is_empty(), "nothing updated yet");
    let mut per_store = Vec::new();
    for workers in [1usize, 2] {
        let fixed = run(workers, config(StoreKind::Fixed), None, 0, 12);
        // The fixed store's snapshot lists the rows some step updated (the rest keep their seeded values).
        let fixed_rows = rows_of(&fixed.snapshots);
        assert!(fixed.snapshots.iter().all(|p| p.updated_only));
        for kind in [StoreKind::Dynamic, StoreKind::Tiered] {
            let out = run(workers, config(kind), None, 0, 12);
            let rows = rows_of(&out.snapshots);
            // The same dense model and loss, bit for bit (same operations in the same order).
            assert_eq!(out.snapshots[0].dense_params, fixed.snapshots[0].dense_params, "{kind:?} W={workers}");
            assert_eq!(out.loss.to_bits(), fixed.loss.to_bits(), "{kind:?} W={workers}");
            // The store holds exactly the rows the fixed table updated, with the same values.
            let total = SIZES.iter().sum::<u64>() as usize;
            assert!(rows.len() > 20 && rows.len() < total / 10, "{} rows held", rows.len());
            assert_eq!(rows, fixed_rows, "{kind:?} W={workers}");
            if kind == StoreKind::Tiered {
                assert!(out.stats.replans > 0 && out.stats.hot_hits > 0 && out.stats.hot_rows > 0, "{:?}", out.stats);
            }
            assert_eq!(out.stats.lookups, out.stats.hot_hits + out.stats.cold_hits + out.stats.misses);
            per_store.push((kind, workers, rows, out.loss));
        }
    }
    // W = 2 equals W = 1 for each store, up to float reassociation.
    for kind in [StoreKind::Dynamic, StoreKind::Tiered] {
        let one = per_store.iter().find(|p| p.0 == kind && p.1 == 1).unwrap();
        let two = per_store.iter().find(|p| p.0 == kind && p.1 == 2).unwrap();
        assert_eq!(one.2.len(), two.2.len());
        for (key, (r1, s1)) in &one.2 {
            let (r2, s2) = &two.2[key];
            assert!(close(r1, r2, 1e-5) && close(s1, s2, 1e-5), "{kind:?}: row {key:?} {r1:?} vs {r2:?}");
        }
        assert!((one.3 - two.3).abs() <= 1e-5 * one.3.abs(), "{kind:?}: loss {} vs {}", one.3, two.3);
    }
}

/// The tiered store planned from differential-dataflow counts (a private
/// dataflow per worker, fed by the store's update stream) inside the trainer:
/// the fixed table's model bit for bit, and the plans (so the hit counters) of
/// the exact counts, on one worker and on two.
#[test]
fn a_tiered_store_planned_by_differential_counts_trains_the_fixed_model() {
    for workers in [1usize, 2] {
        let fixed = run(workers, config(StoreKind::Fixed), None, 0, 12);
        let exact = run(workers, config(StoreKind::Tiered), None, 0, 12);
        let mut cfg = config(StoreKind::Tiered);
        cfg.store.freq_source = FrequencySource::Differential;
        let dd = run(workers, cfg.clone(), None, 0, 12);
        assert_eq!(dd.snapshots[0].dense_params, fixed.snapshots[0].dense_params, "W={workers}");
        assert_eq!(dd.loss.to_bits(), fixed.loss.to_bits(), "W={workers}");
        assert_eq!(rows_of(&dd.snapshots), rows_of(&exact.snapshots), "W={workers}");
        assert_eq!(dd.stats, exact.stats, "W={workers}: same plans, same hits");
        assert!(dd.stats.hot_hits > 0 && dd.stats.replans > 0, "{:?}", dd.stats);
        // A window of 2 steps plans differently, never changing a value.
        cfg.store.freq_window = Some(2);
        let windowed = run(workers, cfg, None, 0, 12);
        assert_eq!(windowed.snapshots[0].dense_params, fixed.snapshots[0].dense_params);
        assert_eq!(rows_of(&windowed.snapshots), rows_of(&exact.snapshots));
    }
}

#[test]
fn dynamic_and_tiered_checkpoints_restore_exactly_across_worker_counts() {
    for kind in [StoreKind::Dynamic, StoreKind::Tiered] {
        let straight = run(2, config(kind), None, 0, 12);
        let half = run(2, config(kind), None, 0, 6);
        let parts = Arc::new(half.snapshots);
        // Same worker count: bit-identical continuation.
        let resumed = run(2, config(kind), Some(parts.clone()), 6, 12);
        assert_eq!(rows_of(&resumed.snapshots), rows_of(&straight.snapshots), "{kind:?}");
        assert_eq!(resumed.snapshots[0].dense_params, straight.snapshots[0].dense_params);
        assert_eq!(resumed.snapshots[0].step, 12);
        // Another worker count (and the other sparse store): equal up to reassociation.
        let other = if kind == StoreKind::Dynamic { StoreKind::Tiered } else { StoreKind::Dynamic };
        for (w, k) in [(1usize, kind), (3, other)] {
            let resharded = run(w, config(k), Some(parts.clone()), 6, 12);
            let (a, b) = (rows_of(&resharded.snapshots), rows_of(&straight.snapshots));
            assert_eq!(a.len(), b.len(), "{kind:?} → W={w}");
            for (key, (r, s)) in &b {
                let (r2, s2) = &a[key];
                assert!(close(r, r2, 1e-5) && close(s, s2, 1e-5), "{kind:?} → W={w}: row {key:?}");
            }
        }
        // A partial checkpoint cannot restore into the fixed table.
        let cfg = config(StoreKind::Fixed);
        let p = parts.clone();
        timely::execute(timely::Config::thread(), move |worker| {
            let mut trainer = Trainer::new(worker, &cfg).unwrap();
            let err = trainer.restore(&p).unwrap_err();
            assert!(
                matches!(err, OperatorError::Restore(RestoreError::MissingRows { present, rows, .. }) if present < rows),
                "{err:?}"
            );
            let err = err.to_string();
            assert!(err.contains("rows are in the checkpoint"), "{err}");
        })
        .unwrap();
    }
}

/// A resumed tiered store keeps its hot plan and frequencies (carried in the
/// snapshot): the halves' hot and cold hits add up to the uninterrupted run's,
/// so the resumed run neither warms up again nor plans differently; for every
/// frequency source, on two workers.
#[test]
fn a_resumed_tiered_store_keeps_its_plan_and_frequencies() {
    for source in [FrequencySource::Exact, FrequencySource::Sketch, FrequencySource::Differential] {
        let mut cfg = config(StoreKind::Tiered);
        cfg.store.freq_source = source;
        let straight = run(2, cfg.clone(), None, 0, 12);
        // Step 7 is no plan boundary (plans at 2, 5, 8, 11): the hot tier restored is the one planned at 5.
        let half = run(2, cfg.clone(), None, 0, 7);
        assert!(half.snapshots.iter().all(|p| p.tables.iter().all(|t| t.counts.len() == t.ids.len())));
        let resumed = run(2, cfg, Some(Arc::new(half.snapshots)), 7, 12);
        assert_eq!(rows_of(&resumed.snapshots), rows_of(&straight.snapshots), "{source:?}");
        assert_eq!(resumed.snapshots[0].dense_params, straight.snapshots[0].dense_params, "{source:?}");
        let (a, b) = (half.stats, resumed.stats);
        assert_eq!(
            (a.hot_hits + b.hot_hits, a.cold_hits + b.cold_hits, a.misses + b.misses),
            (straight.stats.hot_hits, straight.stats.cold_hits, straight.stats.misses),
            "{source:?}: {a:?} + {b:?} vs {:?}",
            straight.stats
        );
        assert!(b.hot_hits > 0 && b.hot_rows == straight.stats.hot_rows, "{source:?}: {b:?}");
        for (x, y) in resumed.snapshots.iter().zip(&straight.snapshots) {
            for (s, t) in x.tables.iter().zip(&y.tables) {
                assert_eq!((&s.counts, &s.hot), (&t.counts, &t.hot), "{source:?}: counts and hot slots");
            }
        }
    }
}

#[test]
fn admission_and_eviction_bound_the_rows_inside_the_trainer() {
    let mut cfg = config(StoreKind::Dynamic);
    cfg.store.max_rows = Some(8);
    cfg.store.admit_count = 2;
    let out = run(2, cfg, None, 0, 12);
    let rows = rows_of(&out.snapshots);
    // Training ends at step 12, a maintenance boundary (flush_every 3): each worker holds ≤ 8 rows.
    for p in &out.snapshots {
        assert!(p.tables.iter().map(|t| t.ids.len()).sum::<usize>() <= 8);
    }
    assert!(out.stats.evictions > 0 && out.stats.rejections > 0 && out.stats.admissions > 0, "{:?}", out.stats);
    assert_eq!(rows.len() as u64, out.stats.cold_rows);
}
