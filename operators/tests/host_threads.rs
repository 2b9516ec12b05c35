//! `Trainer::set_host_threads`: a worker that plans its lookups, pools its rows
//! and sums its rows' gradients on several threads takes the steps of one
//! thread bit for bit (losses, predictions, the parameters' norm, every row
//! with its optimizer state), under every exchange (rows, partial results,
//! replicated hot rows), with weighted, empty and multi-id bags and behaviour
//! sequences, on one worker and on two.

mod common;

use std::sync::{Arc, Mutex};
use tiderec_operators::exchange::ExchangeConfig;
use tiderec_operators::nn::{DienConfig, FmConfig, Interest, ModelConfig};
use tiderec_operators::optim::{DenseOptimizerKind, OptimizerParams, SparseOptimizerKind};
use tiderec_operators::snapshot::WorkerSnapshot;
use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
use tiderec_operators::Batch;

/// Samples per worker and step: with four fields, enough entries for four threads
/// (a thread takes at least 8,192).
const SAMPLES: u64 = 9_000;
const SIZES: [u64; 4] = [20_000, 7, 50_000, 300];

fn config(model: ModelConfig, exchange: ExchangeConfig) -> TrainerConfig {
    let sequence_tables = if model.num_sequences() > 0 { vec![2] } else { vec![] };
    TrainerConfig {
        model,
        table_sizes: SIZES.to_vec(),
        seed: 7,
        dense_optimizer: DenseOptimizerKind::Adam,
        dense_hp: OptimizerParams::with_lr(0.01),
        sparse_optimizer: SparseOptimizerKind::RowwiseAdagrad,
        sparse_hp: OptimizerParams::with_lr(0.05),
        sequence_tables,
        store: Default::default(),
        exchange,
    }
}

fn dlrm() -> ModelConfig {
    common::dlrm_four_fields()
}

fn deepfm() -> ModelConfig {
    ModelConfig::Fm(FmConfig { num_dense: 2, num_sparse: 4, dim: 4, deep: vec![6, 3], fm: true, wide_only: 0 })
}

fn dien() -> ModelConfig {
    ModelConfig::Dien(DienConfig {
        num_dense: 2,
        num_sparse: 4,
        dim: 4,
        num_sequences: 1,
        target_fields: vec![2],
        max_len: 5,
        interest: Interest::SumPooling,
        mlp: vec![6],
    })
}

fn partial(tables: &[usize]) -> ExchangeConfig {
    common::partial_exchange(SIZES.len(), tables)
}

/// The five hottest ids of every table replicated.
fn replicated() -> ExchangeConfig {
    common::replicated_exchange(&SIZES)
}

/// Worker `w`'s micro-batch of step `step`: skewed ids, empty bags (an absent
/// value), two-id bags in field 1, weights in field 3, and, for a model reading
/// one, a sequence of up to four ids of table 2.
fn micro_batch(step: u64, w: usize, sequences: usize) -> Batch {
    let mut b = Batch::with_sequences(2, SIZES.len(), sequences);
    for i in 0..SAMPLES {
        let x = step * 1_000_003 + (w as u64 * SAMPLES + i) * 17;
        b.labels.push(x.is_multiple_of(3) as u32 as f32);
        b.dense.extend([(x % 5) as f32 * 0.2, (x % 11) as f32 * 0.1]);
        for (t, n) in SIZES.into_iter().enumerate() {
            let field = &mut b.sparse[t];
            if x % 7 != t as u64 {
                field.ids.push(if x.is_multiple_of(3) { x % 5 } else { (x * (t as u64 + 3) * 7919) % n });
            }
            if t == 1 && x.is_multiple_of(4) {
                field.ids.push((x + 1) % n);
            }
            if t == 3 {
                let ws = field.weights.get_or_insert_with(Vec::new);
                ws.resize(field.ids.len(), 0.5 + (x % 4) as f32 * 0.25);
            }
            field.close_bag();
        }
        for field in &mut b.sequences {
            for k in 0..x % 5 {
                field.ids.push((x / 3 + k * 31) % SIZES[2]);
            }
            field.close_bag();
        }
    }
    b
}

#[derive(Debug, PartialEq)]
struct Outcome {
    losses: Vec<u64>,
    probs: Vec<u32>,
    l2: u64,
    snapshots: Vec<WorkerSnapshot>,
    /// Every row, optimizer state and dense value of the snapshots, as bits (`==` on
    /// floats would take −0 for +0).
    bits: Vec<u32>,
}

fn bits(parts: &[WorkerSnapshot]) -> Vec<u32> {
    let tables = parts.iter().flat_map(|p| &p.tables).flat_map(|t| t.rows.iter().chain(&t.state));
    let dense =
        parts.iter().flat_map(|p| p.dense_params.iter().chain(&p.dense_optimizer.m).chain(&p.dense_optimizer.v));
    tables.chain(dense).map(|v| v.to_bits()).collect()
}

fn run(workers: usize, threads: usize, config: &TrainerConfig) -> Outcome {
    let out = Arc::new(Mutex::new(Vec::new()));
    let (o, config) = (out.clone(), config.clone());
    timely::execute(timely::Config::process(workers), move |worker| {
        let mut trainer = Trainer::new(worker, &config).unwrap();
        trainer.set_host_threads(threads);
        let sequences = config.model.num_sequences();
        let mut losses = Vec::new();
        for step in 0..4 {
            let b = micro_batch(step, worker.index(), sequences);
            losses.push(trainer.step(worker, StepKind::Train, b).unwrap().loss_sum.to_bits());
        }
        trainer.step(worker, StepKind::Eval, micro_batch(100, worker.index(), sequences)).unwrap();
        let probs = trainer.take_eval().probs.iter().map(|p| p.to_bits()).collect::<Vec<_>>();
        let l2 = trainer.params_l2(worker).unwrap().to_bits();
        o.lock().unwrap().push((worker.index(), losses, probs, l2, trainer.snapshot().unwrap()));
    })
    .unwrap();
    let mut parts = std::mem::take(&mut *out.lock().unwrap());
    parts.sort_by_key(|p| p.0);
    let (losses, probs, l2) = (parts[0].1.clone(), parts[0].2.clone(), parts[0].3);
    let snapshots: Vec<WorkerSnapshot> = parts.into_iter().map(|p| p.4).collect();
    Outcome { losses, probs, l2, bits: bits(&snapshots), snapshots }
}

#[test]
fn steps_on_several_threads_equal_steps_on_one_bit_for_bit() {
    let cases = [
        ("dlrm rows", config(dlrm(), ExchangeConfig::default())),
        ("dlrm replicated", config(dlrm(), replicated())),
        ("deepfm partial [0, 2]", config(deepfm(), partial(&[0, 2]))),
        ("deepfm partial [0, 2, 3]", config(deepfm(), partial(&[0, 2, 3]))),
        ("dien-sum", config(dien(), ExchangeConfig::default())),
    ];
    for (what, config) in &cases {
        for workers in [1, 2] {
            let one = run(workers, 1, config);
            assert!(one.probs.len() as u64 == SAMPLES * workers as u64 && one.losses.len() == 4, "{what}");
            for threads in [2, 4] {
                let several = run(workers, threads, config);
                assert!(several == one, "{what}, {workers} worker(s): {threads} threads differ from one");
            }
        }
    }
}
