//! A trainer with a step engine (`Trainer::with_engine`) against the same
//! trainer without one: the engine here computes the one-worker step on the
//! CPU from the public kernels (pooling, the model, the row and dense
//! optimizers), so what is tested is the trainer's side — training and
//! evaluation steps handed to the engine, report steps and snapshots on the
//! host mirror brought up to date, a restore handed back to the engine, the
//! step counts — and the engine contract a GPU engine implements.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tiderec_operators::nn::embedding_bag::pool_sum;
use tiderec_operators::nn::loss::{bce_with_logits_grad, bce_with_logits_sum};
use tiderec_operators::nn::{DlrmConfig, Model, ModelConfig};
use tiderec_operators::optim::{DenseOptimizer, DenseOptimizerKind, SparseOptimizerKind};
use tiderec_operators::rng::unit_f64;
use tiderec_operators::shard::EmbeddingShard;
use tiderec_operators::snapshot::{TableRows, WorkerSnapshot};
use tiderec_operators::train::{EngineStep, NextBatch, StepEngine, StepKind, Trainer, TrainerConfig};
use tiderec_operators::Batch;

const SIZES: [u64; 3] = [40, 7, 300];

/// The one-worker training step on the CPU, written out.
struct CpuEngine {
    config: TrainerConfig,
    model: Box<dyn Model<f32>>,
    shard: EmbeddingShard,
    optimizer: DenseOptimizer,
    steps: u64,
    logits: Vec<f32>,
    pooled: Vec<f32>,
    /// The batch the last step was handed for the next one.
    prepared: Option<Batch>,
    /// Per table, the rows trained since the last `save_changed` or `load`.
    trained: Vec<BTreeSet<u64>>,
}

thread_local! {
    /// Training steps whose batch the step before had prepared, on this thread.
    static PREPARED_HITS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// The rows each `save_changed` on this thread read back.
    static ASKED: std::cell::RefCell<Vec<Vec<Vec<u64>>>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Build engines without their own `save_changed` ([`WholeReads`]) on this thread.
    static WHOLE_READS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl CpuEngine {
    fn new(config: &TrainerConfig) -> Self {
        let model = config.model.build::<f32>(config.seed).unwrap();
        let n = model.params().len();
        CpuEngine {
            shard: shard(config),
            optimizer: DenseOptimizer::new(config.dense_optimizer, config.dense_hp, n),
            model,
            config: config.clone(),
            steps: 0,
            logits: Vec::new(),
            pooled: Vec::new(),
            prepared: None,
            trained: vec![BTreeSet::new(); config.table_sizes.len()],
        }
    }

    fn forward(&mut self, batch: &Batch) {
        let (b, f, d) = (batch.len(), batch.sparse.len(), self.shard.dim);
        self.pooled = vec![0.0; b * f * d];
        for (t, field) in batch.sparse.iter().enumerate() {
            let rows: Vec<f32> = field.ids.iter().flat_map(|&id| self.shard.row(t, id).to_vec()).collect();
            let index: Vec<u32> = (0..field.ids.len() as u32).collect();
            pool_sum(&rows, d, &field.offsets, &index, field.weights.as_deref(), t, f, &mut self.pooled);
        }
        self.logits = self.model.forward(&batch.dense, &self.pooled, b).to_vec();
    }
}

fn shard(config: &TrainerConfig) -> EmbeddingShard {
    let dim = config.model.embedding_dim();
    EmbeddingShard::new(0, 1, dim, &config.table_sizes, config.seed, config.sparse_optimizer, config.sparse_hp).unwrap()
}

impl StepEngine for CpuEngine {
    fn train(&mut self, batch: &Batch, _keep_logits: bool) -> Result<EngineStep, String> {
        let (b, d) = (batch.len(), self.shard.dim);
        self.forward(batch);
        let loss_sum = bce_with_logits_sum(&self.logits, &batch.labels);
        let mut dlogits = vec![0.0; b];
        bce_with_logits_grad(&self.logits, &batch.labels, 1.0, &mut dlogits);
        let mut dpooled = vec![0.0; self.pooled.len()];
        self.model.backward(&batch.dense, &self.pooled, &dlogits, &mut dpooled);
        let scale = 1.0 / b as f32;
        let f = batch.sparse.len();
        for (t, field) in batch.sparse.iter().enumerate() {
            let (mut order, mut sums): (Vec<u64>, HashMap<u64, Vec<f32>>) = (Vec::new(), HashMap::new());
            for i in 0..b {
                for k in field.offsets[i] as usize..field.offsets[i + 1] as usize {
                    let w = field.weights.as_ref().map_or(1.0, |w| w[k]);
                    let g = &dpooled[(i * f + t) * d..(i * f + t + 1) * d];
                    let id = field.ids[k];
                    let acc = sums.entry(id).or_insert_with(|| {
                        order.push(id);
                        vec![0.0; d]
                    });
                    for (a, &v) in acc.iter_mut().zip(g) {
                        *a += if field.weights.is_some() { w * v } else { v };
                    }
                }
            }
            self.trained[t].extend(order.iter().copied());
            for id in order {
                let mut g = sums.remove(&id).unwrap();
                g.iter_mut().for_each(|v| *v *= scale);
                self.shard.apply(t, id, &g);
            }
        }
        let (params, grads) = self.model.params_and_grads();
        self.optimizer.apply_sum_scaled(params, &[grads], scale);
        self.steps += 1;
        Ok(EngineStep { loss_sum, non_finite: !loss_sum.is_finite() })
    }

    fn train_then_prepare(&mut self, batch: &Batch, keep: bool, next: NextBatch<'_>) -> Result<EngineStep, String> {
        if self.prepared.take().as_ref() == Some(batch) {
            PREPARED_HITS.with(|h| h.set(h.get() + 1));
        }
        let step = self.train(batch, keep)?;
        self.prepared = next();
        Ok(step)
    }

    fn predict(&mut self, batch: &Batch) -> Result<(), String> {
        self.predict_then_prepare(batch, &mut || None)
    }

    fn predict_then_prepare(&mut self, batch: &Batch, next: NextBatch<'_>) -> Result<(), String> {
        // A step on another batch drops what was prepared, as a GPU's staging does.
        if self.prepared.take().as_ref() == Some(batch) {
            PREPARED_HITS.with(|h| h.set(h.get() + 1));
        }
        self.forward(batch);
        self.prepared = next();
        Ok(())
    }

    fn logits(&self) -> &[f32] {
        &self.logits
    }

    fn save(&mut self) -> Result<WorkerSnapshot, String> {
        let c = &self.config;
        Ok(WorkerSnapshot {
            worker: 0,
            workers: 1,
            step: self.steps,
            dim: self.shard.dim,
            state_width: self.shard.state_width(),
            dense_params: self.model.params().to_vec(),
            dense_optimizer: self.optimizer.state(0),
            tables: (0..c.table_sizes.len()).map(|t| self.shard.export_table(t)).collect(),
            updated_only: false,
            delta_of: None,
            seed: c.seed,
            table_sizes: c.table_sizes.clone(),
            admission: Default::default(),
        })
    }

    /// Reads only the rows trained since, as an engine that keeps its rows elsewhere does.
    fn save_changed(&mut self) -> Result<WorkerSnapshot, String> {
        let rows: Vec<Vec<u64>> =
            self.trained.iter_mut().map(|ids| std::mem::take(ids).into_iter().collect()).collect();
        ASKED.with(|a| a.borrow_mut().push(rows.clone()));
        let mut part = WorkerSnapshot { tables: Vec::new(), updated_only: true, ..self.save()? };
        for (t, ids) in rows.iter().enumerate() {
            let mut table = TableRows::default();
            ids.iter().for_each(|&id| self.shard.push_row(t, id, &mut table));
            part.tables.push(table);
        }
        Ok(part)
    }

    fn load(&mut self, part: &WorkerSnapshot) -> Result<(), String> {
        self.trained.iter_mut().for_each(BTreeSet::clear);
        self.shard = shard(&self.config);
        let (d, w) = (part.dim, part.state_width);
        for (t, table) in part.tables.iter().enumerate() {
            for (k, &id) in table.ids.iter().enumerate() {
                let state = &table.state[k * w..(k + 1) * w];
                self.shard.set_row(t, id, &table.rows[k * d..(k + 1) * d], state).map_err(|e| e.to_string())?;
            }
        }
        self.model.params_mut().copy_from_slice(&part.dense_params);
        self.optimizer =
            DenseOptimizer::from_state(self.config.dense_hp, &part.dense_optimizer).map_err(|e| e.to_string())?;
        self.steps = part.step;
        Ok(())
    }
}

/// The CPU engine with the contract's default `save_changed`: every row, every time.
struct WholeReads(CpuEngine);

impl StepEngine for WholeReads {
    fn train(&mut self, batch: &Batch, keep_logits: bool) -> Result<EngineStep, String> {
        self.0.train(batch, keep_logits)
    }
    fn train_then_prepare(&mut self, batch: &Batch, keep: bool, next: NextBatch<'_>) -> Result<EngineStep, String> {
        self.0.train_then_prepare(batch, keep, next)
    }
    fn predict(&mut self, batch: &Batch) -> Result<(), String> {
        self.0.predict(batch)
    }
    fn logits(&self) -> &[f32] {
        self.0.logits()
    }
    fn save(&mut self) -> Result<WorkerSnapshot, String> {
        self.0.save()
    }
    fn load(&mut self, part: &WorkerSnapshot) -> Result<(), String> {
        self.0.load(part)
    }
}

fn config(adaptive: bool) -> TrainerConfig {
    let model = ModelConfig::Dlrm(DlrmConfig {
        num_dense: 2,
        num_sparse: SIZES.len(),
        dim: 4,
        bottom: vec![8, 4],
        top: vec![6, 1],
        self_interaction: false,
    });
    let mut b = TrainerConfig::builder(model, SIZES.to_vec()).seed(3).lr(0.05).sparse_lr(0.05);
    if !adaptive {
        b = b.dense_optimizer(DenseOptimizerKind::Sgd).sparse_optimizer(SparseOptimizerKind::Sgd);
    }
    b.build().unwrap()
}

/// Batch `step`: field 0 holds 0–2 ids per bag, field 2 is mean-pooled.
fn batch(step: u64, n: usize) -> Batch {
    let mut b = Batch::new(2, SIZES.len());
    let u = |i: usize, what: u64, j: u64| unit_f64(step, i as u64, what, j);
    for i in 0..n {
        b.labels.push((u(i, 0, 0) < 0.4) as u8 as f32);
        b.dense.extend((0..2).map(|j| u(i, 1, j) as f32));
        for (t, f) in b.sparse.iter_mut().enumerate() {
            let ids = if t == 0 { (u(i, 2, 0) * 3.0) as u64 } else { 1 + (t == 2) as u64 };
            for j in 0..ids {
                f.ids.push(((u(i, 3 + t as u64, j) * SIZES[t] as f64) as u64).min(SIZES[t] - 1));
            }
            if t == 2 {
                f.close_bag_mean();
            } else {
                f.close_bag();
            }
        }
    }
    b
}

/// The size of training batch `s` of [`run`]: step 4's is empty.
fn train_len(s: u64) -> usize {
    if s == 4 {
        0
    } else {
        24
    }
}

/// One worker's trainer for `config`, with the CPU engine or without one.
fn trainer(worker: &mut timely::worker::Worker, config: &TrainerConfig, with_engine: bool) -> Trainer {
    if with_engine {
        let model = config.model.build::<f32>(config.seed).unwrap();
        let engine: Box<dyn StepEngine> = match WHOLE_READS.with(|w| w.get()) {
            true => Box::new(WholeReads(CpuEngine::new(config))),
            false => Box::new(CpuEngine::new(config)),
        };
        Trainer::with_engine(worker, config, model, engine).unwrap()
    } else {
        Trainer::new(worker, config).unwrap()
    }
}

/// What a run shows: losses, the evaluation's predictions, params L2, the final snapshot, step counts.
type Seen = (Vec<f64>, Vec<f32>, f64, WorkerSnapshot, (u64, u64));

/// 20 training steps, an evaluation, a report, 10 more steps and a snapshot;
/// with `resume`, the second stretch starts from `resume` instead.
fn run(config: &TrainerConfig, with_engine: bool, resume: Option<WorkerSnapshot>) -> Seen {
    run_with(config, with_engine, resume, Arc::new(|_| None))
}

/// What training step `s` is handed as the batch to prepare.
type Next = Arc<dyn Fn(u64) -> Option<Batch> + Send + Sync>;

/// [`run`], each of the first 20 training steps handed `next(s)` as the batch to prepare.
fn run_with(config: &TrainerConfig, with_engine: bool, resume: Option<WorkerSnapshot>, next: Next) -> Seen {
    let config = config.clone();
    timely::execute_directly(move |worker| {
        let mut trainer = trainer(worker, &config, with_engine);
        let mut losses = Vec::new();
        for s in 0..20 {
            let step = trainer.step_then_prepare(worker, StepKind::Train, batch(s, train_len(s)), || next(s));
            losses.push(step.unwrap().loss_sum);
        }
        losses.push(trainer.step(worker, StepKind::Eval, batch(100, 30)).unwrap().loss_sum);
        let probs = trainer.take_eval().probs;
        let l2 = trainer.params_l2(worker).unwrap();
        if let Some(part) = &resume {
            trainer.restore(std::slice::from_ref(part)).unwrap();
        }
        for s in 20..30 {
            losses.push(trainer.step(worker, StepKind::Train, batch(s, 24)).unwrap().loss_sum);
        }
        let snapshot = trainer.checkpoint_snapshot(None).unwrap();
        (losses, probs, l2, snapshot, (trainer.steps(), trainer.train_steps()))
    })
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1e-12)
}

fn assert_same(what: &str, engine: &Seen, host: &Seen) {
    assert_eq!(engine.0.len(), host.0.len());
    for (k, (a, b)) in engine.0.iter().zip(&host.0).enumerate() {
        assert!(close(*a, *b), "{what}: loss of step {k}: {a} vs {b}");
    }
    assert_eq!(engine.1.len(), host.1.len(), "{what}: evaluated samples");
    assert!(engine.1.iter().zip(&host.1).all(|(a, b)| (a - b).abs() <= 1e-6), "{what}: predictions differ");
    assert!(close(engine.2, host.2), "{what}: params L2 {} vs {}", engine.2, host.2);
    assert_eq!(engine.4, host.4, "{what}: steps and training steps");
    assert_eq!(engine.3.step, host.3.step, "{what}: the snapshot's step");
    // Both snapshots list the rows training changed (the engine's mirror holds
    // the rows read back from the engine over the seeded rest), with the same
    // values, and the same dense parameters.
    let (e, h) = (&engine.3, &host.3);
    assert!(e.dense_params.iter().zip(&h.dense_params).all(|(a, b)| (a - b).abs() <= 1e-6), "{what}: dense");
    assert_eq!(e.updated_only, h.updated_only, "{what}: updated rows only");
    for (t, (te, th)) in e.tables.iter().zip(&h.tables).enumerate() {
        assert_eq!(te.ids, th.ids, "{what}: the rows of table {t}");
        assert!(te.rows.iter().zip(&th.rows).all(|(x, y)| (x - y).abs() <= 1e-6), "{what}: table {t}'s rows");
        assert!(te.state.iter().zip(&th.state).all(|(x, y)| (x - y).abs() <= 1e-6), "{what}: table {t}'s state");
    }
}

#[test]
fn a_trainer_with_an_engine_trains_as_the_trainer_without() {
    for adaptive in [false, true] {
        let c = config(adaptive);
        let what = if adaptive { "adaptive" } else { "sgd" };
        assert_same(what, &run(&c, true, None), &run(&c, false, None));
    }
}

/// An engine that reads back every row each time (the default `save_changed`) keeps
/// the mirror as one that reads back the rows it trained: the mirror then lists every row.
#[test]
fn an_engine_reading_back_every_row_trains_as_the_trainer_without() {
    let c = config(true);
    WHOLE_READS.with(|w| w.set(true));
    let whole = run(&c, true, None);
    WHOLE_READS.with(|w| w.set(false));
    let host = run(&c, false, None);
    let rows = |s: &Seen| s.3.tables.iter().map(|t| t.ids.len() as u64).sum::<u64>();
    assert_eq!(rows(&whole), SIZES.iter().sum::<u64>(), "the mirror lists every row read back");
    assert!(rows(&host) < rows(&whole));
    // The rows both list agree; `assert_same` wants the same rows listed.
    let mut trimmed = whole.clone();
    for (te, th) in trimmed.3.tables.iter_mut().zip(&host.3.tables) {
        let (d, w) = (c.model.embedding_dim(), whole.3.state_width);
        let keep: Vec<usize> = th.ids.iter().map(|id| te.ids.iter().position(|x| x == id).unwrap()).collect();
        te.rows = keep.iter().flat_map(|&k| te.rows[k * d..(k + 1) * d].to_vec()).collect();
        te.state = keep.iter().flat_map(|&k| te.state[k * w..(k + 1) * w].to_vec()).collect();
        te.ids = th.ids.clone();
    }
    trimmed.3.updated_only = host.3.updated_only;
    assert_same("whole reads", &trimmed, &host);
}

/// Every training step handed its successor to prepare (a wrong one at step 9, nothing at
/// step 12) trains as without: the engine starts from the prepared batch where it equals
/// the step's, and never after an evaluation step or a wrong one.
#[test]
fn preparing_the_next_batch_changes_no_step() {
    let c = config(true);
    let next = |s: u64| match s {
        9 => Some(batch(77, 24)),
        12 => None,
        _ => Some(batch(s + 1, train_len(s + 1))),
    };
    PREPARED_HITS.with(|h| h.set(0));
    let prepared = run_with(&c, true, None, Arc::new(next));
    let hits = PREPARED_HITS.with(|h| h.get());
    assert_same("prepared", &prepared, &run(&c, false, None));
    // Steps 1–19 start from the batch the step before prepared, but for step 4 (empty:
    // no engine step, so step 5's batch was not prepared either), step 10 (step 9 prepared
    // another) and step 13 (step 12 prepared none). Step 20's batch, prepared by step 19,
    // is dropped by the evaluation step in between.
    assert_eq!(hits, 19 - 4, "steps that started from the prepared batch");
    // Without an engine, `next` is never asked.
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let counting = move |s: u64| {
        counter.fetch_add(1, Ordering::Relaxed);
        next(s)
    };
    assert_same("no engine", &run_with(&c, false, None, Arc::new(counting)), &run(&c, false, None));
    assert_eq!(asked.load(Ordering::Relaxed), 0);
}

/// Evaluation steps prepare the next batch too, and start from one a step before
/// prepared, whatever the kinds on either side: the same losses and predictions as
/// steps handed nothing to prepare.
#[test]
fn evaluation_steps_prepare_and_start_from_prepared_batches() {
    let c = config(true);
    // (kind, batch, the batch handed to prepare)
    let e = |k: u64| batch(200 + k, 9);
    let t = |k: u64| batch(k, 24);
    let plan = [
        (StepKind::Train, t(0), Some(e(0))),
        (StepKind::Eval, e(0), Some(e(1))),
        (StepKind::Eval, e(1), Some(t(1))),
        (StepKind::Train, t(1), Some(e(9))),
        (StepKind::Eval, e(2), None),
        (StepKind::Eval, e(3), Some(e(3))),
        (StepKind::Eval, e(3), None),
    ];
    let steps = |prepare: bool| {
        let (c, plan) = (c.clone(), plan.clone());
        timely::execute_directly(move |worker| {
            PREPARED_HITS.with(|h| h.set(0));
            let mut trainer = trainer(worker, &c, true);
            let mut seen = Vec::new();
            for (kind, b, next) in plan {
                let n = if prepare { next } else { None };
                seen.push(trainer.step_then_prepare(worker, kind, b, move || n.clone()).unwrap().loss_sum);
                if kind == StepKind::Eval {
                    seen.extend(trainer.take_eval().probs.iter().map(|&p| f64::from(p)));
                }
            }
            (seen, PREPARED_HITS.with(|h| h.get()))
        })
    };
    let ((prepared, hits), (plain, none)) = (steps(true), steps(false));
    assert_eq!(prepared, plain, "the same losses and predictions, bit for bit");
    // e(0), e(1), t(1) and the second e(3) start from what the step before prepared;
    // e(2) does not (t(1) prepared e(9)).
    assert_eq!((hits, none), (4, 0));
}

#[test]
fn a_restore_reaches_the_engine_and_its_snapshot_restores_without_one() {
    let c = config(true);
    let (.., part, _) = run(&c, false, None);
    let (engine, host) = (run(&c, true, Some(part.clone())), run(&c, false, Some(part)));
    assert_same("restored", &engine, &host);
    // The engine trainer's snapshot continues on a trainer without an engine.
    let (.., from_engine, _) = run(&c, true, None);
    let resumed = run(&c, false, Some(from_engine.clone()));
    let direct = run(&c, false, Some(run(&c, false, None).3));
    assert_same("resumed from an engine's snapshot", &resumed, &direct);
}

/// The host mirror is brought up to date once per read after training (not again
/// while nothing trained), each time from the rows the engine trained since, and
/// then trains on as the trainer without an engine (see the tests above).
#[test]
fn the_mirror_reads_back_only_the_rows_trained_since_it_was_last_read() {
    let c = config(true);
    let (asked, expected) = timely::execute_directly(move |worker| {
        ASKED.with(|a| a.borrow_mut().clear());
        let mut trainer = trainer(worker, &c, true);
        let mut expected: Vec<Vec<Vec<u64>>> = Vec::new();
        let mut since = vec![BTreeSet::new(); SIZES.len()];
        for s in 0..7 {
            let b = batch(s, 24);
            for (t, field) in b.sparse.iter().enumerate() {
                since[t].extend(field.ids.iter().copied());
            }
            trainer.step(worker, StepKind::Train, b).unwrap();
            if s % 3 == 2 {
                // A report step reads the mirror; a snapshot right after reads nothing more.
                trainer.params_l2(worker).unwrap();
                trainer.snapshot().unwrap();
                expected.push(since.iter_mut().map(|ids| std::mem::take(ids).into_iter().collect()).collect());
            }
        }
        trainer.checkpoint_snapshot(None).unwrap();
        expected.push(since.into_iter().map(|ids| ids.into_iter().collect()).collect());
        (ASKED.with(|a| a.take()), expected)
    });
    assert_eq!(asked.len(), 3, "one read per report after training, and one for the checkpoint");
    assert_eq!(asked, expected);
    // The rows of a table of 300 trained in three steps are few of them: that is the point.
    assert!(asked[0][2].len() < SIZES[2] as usize / 2, "{} rows", asked[0][2].len());
}

#[test]
fn an_engine_trains_alone() {
    let c = config(false);
    let errors = timely::execute(timely::Config::process(2), move |worker| {
        let model = c.model.build::<f32>(c.seed).unwrap();
        Trainer::with_engine(worker, &c, model, Box::new(CpuEngine::new(&c))).err().map(|e| e.to_string())
    })
    .unwrap()
    .join();
    for e in errors {
        let e = e.unwrap().expect("refused");
        assert!(e.contains("engine") && e.contains("2 workers"), "{e}");
    }
}

/// Checkpoint parts after each step, each a delta of the one before where the
/// trainer offers a parent, with a restore before the fifth step; and the
/// whole snapshot beside each.
fn checkpoints(c: &TrainerConfig, with_engine: bool) -> Vec<(Option<u64>, WorkerSnapshot, WorkerSnapshot)> {
    let c = c.clone();
    timely::execute_directly(move |worker| {
        let mut trainer = trainer(worker, &c, with_engine);
        let mut seen = Vec::new();
        for s in 0..7 {
            if s == 4 {
                let whole = trainer.snapshot().unwrap();
                trainer.restore(&[whole]).unwrap();
            }
            trainer.step(worker, StepKind::Train, batch(s, if s == 2 { 0 } else { 24 })).unwrap();
            trainer.step(worker, StepKind::Eval, batch(100 + s, 10)).unwrap();
            let parent = trainer.checkpoint_mark();
            let part = trainer.checkpoint_snapshot(parent).unwrap();
            seen.push((parent, part, trainer.snapshot().unwrap()));
        }
        seen
    })
}

/// A trainer with an engine writes the deltas a trainer without one writes:
/// the same parents, the same rows of every table (values to 1e-6), and its
/// chain of deltas applied onto its last whole checkpoint gives its whole state.
#[test]
fn a_trainer_with_an_engine_writes_the_deltas_of_one_without() {
    for adaptive in [false, true] {
        let c = config(adaptive);
        let (engine, host) = (checkpoints(&c, true), checkpoints(&c, false));
        let parents: Vec<_> = engine.iter().map(|(p, part, _)| (*p, part.delta_of)).collect();
        let want = [(None, None), (Some(1), Some(1)), (Some(2), Some(2)), (Some(2), Some(2))];
        assert_eq!(parents[..4], want, "adaptive {adaptive}: a delta of each checkpoint");
        // The restore starts a new chain: whole, then deltas again.
        assert_eq!(parents[4..], [(None, None), (Some(4), Some(4)), (Some(5), Some(5))], "adaptive {adaptive}");
        let host_parents: Vec<_> = host.iter().map(|(p, part, _)| (*p, part.delta_of)).collect();
        assert_eq!(parents, host_parents, "adaptive {adaptive}: parents with and without an engine");
        let mut chain: Option<WorkerSnapshot> = None;
        for (k, ((_, e, e_whole), (_, h, _))) in engine.iter().zip(&host).enumerate() {
            if e.delta_of.is_some() {
                for (t, (te, th)) in e.tables.iter().zip(&h.tables).enumerate() {
                    assert_eq!(te.ids, th.ids, "adaptive {adaptive}, checkpoint {k}: rows of table {t}");
                    assert!(te.rows.iter().zip(&th.rows).all(|(a, b)| (a - b).abs() <= 1e-6), "checkpoint {k}");
                    assert!(te.state.iter().zip(&th.state).all(|(a, b)| (a - b).abs() <= 1e-6), "checkpoint {k}");
                }
                let rows = |p: &WorkerSnapshot| p.tables.iter().map(|t| t.ids.len()).sum::<usize>();
                assert!(rows(e) < rows(e_whole), "checkpoint {k}: a delta lists fewer rows than the whole state");
                let base = chain.as_mut().expect("a delta follows a whole checkpoint");
                tiderec_operators::snapshot::apply_delta(std::slice::from_mut(base), vec![e.clone()]).unwrap();
            } else {
                chain = Some(e.clone());
            }
            let merged = chain.as_ref().unwrap();
            assert_eq!(merged.tables, e_whole.tables, "adaptive {adaptive}, checkpoint {k}: the chain's rows");
            assert_eq!(merged.dense_params, e_whole.dense_params, "checkpoint {k}: dense");
        }
    }
}
