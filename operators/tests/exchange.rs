//! Exchange strategies inside the trainer: `partial` (DES) and hot-row
//! replication train the model of the plain `rows` exchange, on one worker and
//! on several, and checkpoints do not depend on the strategy.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tiderec_operators::exchange::ExchangeConfig;
use tiderec_operators::metrics::EvalSet;
use tiderec_operators::nn::{FmConfig, ModelConfig};
use tiderec_operators::optim::{DenseOptimizerKind, OptimizerParams, SparseOptimizerKind};
use tiderec_operators::snapshot::WorkerSnapshot;
use tiderec_operators::store::{StoreConfig, StoreKind};
use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
use tiderec_operators::{Batch, OperatorError, ShapeError};

const GLOBAL_BATCH: usize = 30;
const SIZES: [u64; 4] = [1000, 7, 5000, 300];

fn fm_config(exchange: ExchangeConfig, optimizer: SparseOptimizerKind) -> TrainerConfig {
    TrainerConfig {
        model: ModelConfig::Fm(FmConfig { num_dense: 2, num_sparse: 4, dim: 4, deep: vec![], fm: true, wide_only: 0 }),
        table_sizes: SIZES.to_vec(),
        seed: 5,
        dense_optimizer: DenseOptimizerKind::Adam,
        dense_hp: OptimizerParams::with_lr(0.01),
        sparse_optimizer: optimizer,
        sparse_hp: OptimizerParams::with_lr(0.05),
        sequence_tables: vec![],
        store: StoreConfig::default(),
        exchange,
    }
}

/// DeepFM (`fm`) or Wide & Deep: the FM's rows feed a deep part too.
fn deep_config(exchange: ExchangeConfig, fm: bool) -> TrainerConfig {
    TrainerConfig {
        model: ModelConfig::Fm(FmConfig { num_dense: 2, num_sparse: 4, dim: 4, deep: vec![6, 3], fm, wide_only: 0 }),
        ..fm_config(exchange, SparseOptimizerKind::RowwiseAdagrad)
    }
}

fn dlrm_config(exchange: ExchangeConfig) -> TrainerConfig {
    TrainerConfig { model: common::dlrm_four_fields(), ..fm_config(exchange, SparseOptimizerKind::RowwiseAdagrad) }
}

/// Worker `w`'s share of step `step`: skewed one-hot ids, some empty bags, a
/// weighted field (3); with `multi`, field 1 also has two-id bags.
fn micro_batch(step: u64, w: usize, workers: usize, multi: bool) -> Batch {
    let mut b = Batch::new(2, 4);
    for i in GLOBAL_BATCH * w / workers..GLOBAL_BATCH * (w + 1) / workers {
        let x = step * 131 + i as u64 * 17;
        b.labels.push(x.is_multiple_of(3) as u32 as f32);
        b.dense.extend([(x % 5) as f32 * 0.2, (x % 11) as f32 * 0.1]);
        for (t, n) in SIZES.into_iter().enumerate() {
            let field = &mut b.sparse[t];
            if x % 7 == t as u64 {
                // absent value: an empty bag
            } else if !x.is_multiple_of(3) {
                field.ids.push(x % 5);
            } else {
                field.ids.push((x * (t as u64 + 3) * 7919) % n);
            }
            if multi && t == 1 && x.is_multiple_of(4) {
                field.ids.push((x + 1) % n);
            }
            if t == 3 {
                let len = field.ids.len() - *field.offsets.last().unwrap() as usize;
                let ws = field.weights.get_or_insert_with(Vec::new);
                ws.resize(field.ids.len() - len, 1.0);
                ws.resize(field.ids.len(), 0.5 + (x % 4) as f32 * 0.25);
            }
            field.close_bag();
        }
    }
    b
}

struct Outcome {
    snapshots: Vec<WorkerSnapshot>,
    losses: Vec<f64>,
    eval: EvalSet,
    l2: f64,
    bytes: u64,
}

fn run(workers: usize, config: TrainerConfig, multi: bool, restore: Option<Arc<Vec<WorkerSnapshot>>>) -> Outcome {
    let out = Arc::new(Mutex::new(Vec::new()));
    let o = out.clone();
    timely::execute(timely::Config::process(workers), move |worker| {
        let mut trainer = Trainer::new(worker, &config).unwrap();
        if let Some(parts) = &restore {
            trainer.restore(parts).unwrap();
        }
        let mut losses = Vec::new();
        for step in 0..8 {
            let b = micro_batch(step, worker.index(), worker.peers(), multi);
            losses.push(trainer.step(worker, StepKind::Train, b).unwrap().loss_sum);
        }
        let b = micro_batch(100, worker.index(), worker.peers(), multi);
        trainer.step(worker, StepKind::Eval, b).unwrap();
        let l2 = trainer.params_l2(worker).unwrap();
        let bytes = trainer.bytes_sent();
        o.lock().unwrap().push((trainer.snapshot().unwrap(), losses, trainer.take_eval(), l2, bytes));
    })
    .unwrap();
    let mut parts = std::mem::take(&mut *out.lock().unwrap());
    parts.sort_by_key(|p| p.0.worker);
    Outcome {
        losses: parts[0].1.clone(),
        eval: parts[0].2.clone(),
        l2: parts[0].3,
        bytes: parts.iter().map(|p| p.4).sum(),
        snapshots: parts.into_iter().map(|p| p.0).collect(),
    }
}

/// Per row: its values, then its optimizer state.
type Rows = BTreeMap<(usize, u64), [Vec<f32>; 2]>;

fn rows_of(parts: &[WorkerSnapshot]) -> Rows {
    let mut rows = BTreeMap::new();
    for p in parts {
        for (t, table) in p.tables.iter().enumerate() {
            for (i, &id) in table.ids.iter().enumerate() {
                let v = table.rows[i * p.dim..(i + 1) * p.dim].to_vec();
                let s = table.state[i * p.state_width..(i + 1) * p.state_width].to_vec();
                rows.insert((t, id), [v, s]);
            }
        }
    }
    rows
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-12)
}

/// Same losses, norms, predictions and rows within `tol` (relative).
fn assert_same(what: &str, a: &Outcome, b: &Outcome, tol: f64) {
    for (s, (x, y)) in a.losses.iter().zip(&b.losses).enumerate() {
        assert!(rel(*x, *y) <= tol, "{what}: loss of step {s}: {x} vs {y}");
    }
    assert!(rel(a.l2, b.l2) <= tol, "{what}: params_l2 {} vs {}", a.l2, b.l2);
    assert_eq!(a.eval.probs.len(), b.eval.probs.len(), "{what}");
    for (x, y) in a.eval.probs.iter().zip(&b.eval.probs) {
        assert!(rel(*x as f64, *y as f64) <= tol, "{what}: prediction {x} vs {y}");
    }
    let (ra, rb) = (rows_of(&a.snapshots), rows_of(&b.snapshots));
    assert_eq!(ra.len(), rb.len());
    // Each value relative to its row's (or state's) largest: small entries carry the row's rounding.
    for (key, pair) in &ra {
        for (x, y) in pair.iter().zip(&rb[key]) {
            let scale = x.iter().chain(y).fold(1e-3f32, |m, v| m.max(v.abs())) as f64;
            for (u, v) in x.iter().zip(y) {
                assert!((u - v).abs() as f64 <= tol * scale, "{what}: row {key:?}: {x:?} vs {y:?}");
            }
        }
    }
}

fn partial(tables: &[usize]) -> ExchangeConfig {
    common::partial_exchange(SIZES.len(), tables)
}

/// The five hottest ids of every table replicated.
fn replicated() -> ExchangeConfig {
    common::replicated_exchange(&SIZES)
}

#[test]
fn partial_exchange_trains_the_rows_model_on_one_two_and_three_workers() {
    for optimizer in [SparseOptimizerKind::RowwiseAdagrad, SparseOptimizerKind::LazyAdam] {
        let rows = run(1, fm_config(ExchangeConfig::default(), optimizer), false, None);
        for workers in [1usize, 2, 3] {
            let rows_w = run(workers, fm_config(ExchangeConfig::default(), optimizer), false, None);
            assert_same(&format!("rows W={workers}"), &rows, &rows_w, 1e-5);
            for fields in [vec![0, 1, 2, 3], vec![0, 2]] {
                let what = format!("partial {fields:?} W={workers} {optimizer:?}");
                let out = run(workers, fm_config(partial(&fields), optimizer), false, None);
                assert_same(&what, &rows_w, &out, 1e-5);
                assert_same(&what, &rows, &out, 1e-5);
                if workers > 1 && fields.len() == 4 {
                    assert_ne!(out.bytes, rows_w.bytes, "{what}: partial results travel instead of rows");
                }
            }
        }
    }
}

/// With a deep part, owners return the first layer's share with the FM sums
/// and add their share of its weight gradient to their dense gradient.
#[test]
fn partial_exchange_of_deep_models_trains_the_rows_model() {
    for fm in [true, false] {
        let rows = run(1, deep_config(ExchangeConfig::default(), fm), false, None);
        for workers in [1usize, 2, 3] {
            let rows_w = run(workers, deep_config(ExchangeConfig::default(), fm), false, None);
            assert_same(&format!("deep rows W={workers}"), &rows, &rows_w, 1e-5);
            for fields in [vec![0, 1, 2, 3], vec![0, 2]] {
                let what = format!("deep fm={fm} partial {fields:?} W={workers}");
                let out = run(workers, deep_config(partial(&fields), fm), false, None);
                assert_same(&what, &rows_w, &out, 1e-5);
                assert_same(&what, &rows, &out, 1e-5);
                if workers > 1 {
                    assert_ne!(out.bytes, rows_w.bytes, "{what}: partial results travel instead of rows");
                }
            }
            // Partial fields beside replicated rows of the others.
            let mut mixed = replicated();
            mixed.tables = partial(&[0, 3]).tables;
            mixed.replicated[0].clear();
            mixed.replicated[3].clear();
            let out = run(workers, deep_config(mixed, fm), false, None);
            assert_same(&format!("deep fm={fm} partial + replicated W={workers}"), &rows, &out, 1e-5);
        }
    }
}

#[test]
fn replicated_hot_rows_train_the_rows_model_exactly() {
    for multi in [false, true] {
        for (name, cfg) in [
            ("dlrm", dlrm_config as fn(ExchangeConfig) -> TrainerConfig),
            ("fm", |e| fm_config(e, SparseOptimizerKind::LazyAdam)),
        ] {
            let one = run(1, cfg(ExchangeConfig::default()), multi, None);
            for workers in [1usize, 2, 3] {
                let rows = run(workers, cfg(ExchangeConfig::default()), multi, None);
                let hot = run(workers, cfg(replicated()), multi, None);
                // Replicas are summed and updated like owned rows: the same model, bit for bit.
                assert_eq!(rows.losses, hot.losses, "{name} W={workers}");
                assert_eq!(rows.l2.to_bits(), hot.l2.to_bits(), "{name} W={workers}");
                assert_eq!(rows_of(&rows.snapshots), rows_of(&hot.snapshots), "{name} W={workers}");
                assert_eq!(rows.eval.probs, hot.eval.probs);
                assert_same(&format!("{name} replicated W={workers} vs W=1"), &one, &hot, 1e-5);
            }
        }
    }
}

#[test]
fn checkpoints_do_not_depend_on_the_exchange() {
    let cfg = |e| fm_config(e, SparseOptimizerKind::RowwiseAdagrad);
    let base = run(2, cfg(ExchangeConfig::default()), false, None);
    let parts = Arc::new(base.snapshots.clone());
    // Resume the rows run's checkpoint with replicas (which must load the hot rows from it) and with partial.
    let rows = run(2, cfg(ExchangeConfig::default()), false, Some(parts.clone()));
    let hot = run(2, cfg(replicated()), false, Some(parts.clone()));
    let part = run(3, cfg(partial(&[0, 1, 2, 3])), false, Some(parts));
    assert_eq!(rows_of(&rows.snapshots), rows_of(&hot.snapshots));
    assert_eq!(rows.losses, hot.losses);
    assert_same("resumed partial W=3", &rows, &part, 1e-5);
    // A deep model's checkpoint resumes with partial results on another worker count.
    let deep = run(2, deep_config(ExchangeConfig::default(), true), false, None);
    let parts = Arc::new(deep.snapshots.clone());
    let rows = run(2, deep_config(ExchangeConfig::default(), true), false, Some(parts.clone()));
    let part = run(3, deep_config(partial(&[0, 1, 2, 3]), true), false, Some(parts));
    assert_same("resumed deep partial W=3", &rows, &part, 1e-5);
}

#[test]
fn invalid_exchanges_are_refused_with_their_key() {
    let check = |cfg: TrainerConfig, needle: &'static str| {
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    };
    check(dlrm_config(partial(&[0])), "exchange.tables");
    let mut wrong_len = partial(&[0]);
    wrong_len.tables.pop();
    check(fm_config(wrong_len, SparseOptimizerKind::Sgd), "exchange.tables");
    let mut dynamic = fm_config(replicated(), SparseOptimizerKind::Sgd);
    dynamic.store.kind = StoreKind::Dynamic;
    check(dynamic, "fixed store");
    let mut outside = replicated();
    outside.replicated[1] = vec![7];
    check(fm_config(outside, SparseOptimizerKind::Sgd), "outside table 1");
    let mut both = replicated();
    both.tables = partial(&[0]).tables;
    check(fm_config(both, SparseOptimizerKind::Sgd), "partial results");
    // A two-id bag in a partial field is refused at the step, naming the field and the sample.
    let cfg = fm_config(partial(&[1]), SparseOptimizerKind::Sgd);
    timely::execute(timely::Config::thread(), move |worker| {
        let mut trainer = Trainer::new(worker, &cfg).unwrap();
        let err = trainer.step(worker, StepKind::Train, micro_batch(0, 0, 1, true)).unwrap_err();
        assert!(
            matches!(err, OperatorError::Shape(ShapeError::MultiIdPartial { field: 1, sample: 0, ids: 2 })),
            "{err:?}"
        );
        let err = err.to_string();
        assert!(err.contains("field 1") && err.contains("at most one id"), "{err}");
    })
    .unwrap();
}
