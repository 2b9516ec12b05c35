//! Fixtures shared by the trainer tests: a tiny configuration and deterministic
//! micro-batches of two dense features and two sparse fields over 10-row tables.

#![allow(dead_code)]

use tiderec_operators::exchange::{ExchangeConfig, TableExchange};
use tiderec_operators::nn::{DlrmConfig, ModelConfig};
use tiderec_operators::optim::{DenseOptimizerKind, OptimizerParams, SparseOptimizerKind};
use tiderec_operators::train::{StepKind, StepStats, Trainer, TrainerConfig};
use tiderec_operators::{Batch, OperatorError};

/// `model` with 10-row tables, Adam on the dense weights and SGD on the rows.
pub fn config(model: ModelConfig) -> TrainerConfig {
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

/// A DLRM on 2 dense features and 2 sparse fields of width 4.
pub fn dlrm() -> ModelConfig {
    ModelConfig::Dlrm(DlrmConfig {
        num_dense: 2,
        num_sparse: 2,
        dim: 4,
        bottom: vec![4],
        top: vec![3, 1],
        self_interaction: false,
    })
}

/// A DLRM on 2 dense features and 4 sparse fields of width 4 (the exchange tests' shape).
pub fn dlrm_four_fields() -> ModelConfig {
    ModelConfig::Dlrm(DlrmConfig {
        num_dense: 2,
        num_sparse: 4,
        dim: 4,
        bottom: vec![8, 4],
        top: vec![8, 1],
        self_interaction: false,
    })
}

/// Worker `me`'s micro-batch of step `step`: `samples` samples whose labels, values and ids
/// depend on the worker and the step.
pub fn batch(me: usize, step: u64, samples: u64) -> Batch {
    let mut b = Batch::new(2, 2);
    for i in 0..samples {
        b.labels.push(((i + step) % 2) as f32);
        b.dense.extend([0.5 + i as f32, 1.0 - step as f32 * 0.1]);
        for (t, f) in b.sparse.iter_mut().enumerate() {
            f.ids.push((me as u64 * 3 + i + t as u64 + step) % 10);
            f.close_bag();
        }
    }
    b
}

/// Trains `trainer` on `batch(s)` for steps `0..steps` until a step fails: on this
/// worker (`Err`) or on another (`Ok`, how many failed); the step, or `None` when
/// none failed.
pub fn first_failure(
    worker: &mut timely::worker::Worker,
    trainer: &mut Trainer,
    steps: u64,
    batch: impl Fn(u64) -> Batch,
) -> Option<(u64, Result<u64, OperatorError>)> {
    for s in 0..steps {
        match trainer.step(worker, StepKind::Train, batch(s)) {
            Ok(stats) if stats.failed_workers > 0 => return Some((s, Ok(stats.failed_workers))),
            Ok(_) => {}
            Err(e) => return Some((s, Err(e))),
        }
    }
    None
}

/// Trains `trainer` on `batch(s)` for steps `0..steps` and stops after the first step
/// that did not train cleanly, as the pipeline's loops do: an error on this worker, or
/// statistics with a failed worker or a non-finite value. That step and its result, or
/// `None` when every step trained.
pub fn until_first_bad_step(
    worker: &mut timely::worker::Worker,
    trainer: &mut Trainer,
    steps: u64,
    batch: impl Fn(u64) -> Batch,
) -> Option<(u64, Result<StepStats, OperatorError>)> {
    for s in 0..steps {
        match trainer.step(worker, StepKind::Train, batch(s)) {
            Ok(stats) if stats.failed_workers == 0 && stats.non_finite == 0 => {}
            other => return Some((s, other)),
        }
    }
    None
}

/// Runs `f` on a thread of its own and returns its result; panics when it has not
/// returned within `secs` seconds (workers waiting for each other forever).
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(out) => out,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("no result within {secs} s: the workers hang"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("the run panicked"),
    }
}

/// [`first_failure`] as one line (`step S: N failed`, `step S: error: E`, or empty),
/// an error first checked by `expected`.
pub fn failure_line(
    failure: Option<(u64, Result<u64, OperatorError>)>,
    expected: impl Fn(&OperatorError) -> bool,
) -> String {
    match failure {
        Some((s, Ok(n))) => format!("step {s}: {n} failed"),
        Some((s, Err(e))) => {
            assert!(expected(&e), "{e:?}");
            format!("step {s}: error: {e}")
        }
        None => String::new(),
    }
}

/// Two workers' lines of [`failure_line`] when worker 1's device failed in step 2 with
/// `message`: the error there, and worker 0 told in the same step.
pub fn assert_worker_1_failed_in_step_2(seen: &mut [(usize, String)], message: &str) {
    seen.sort();
    assert_eq!(seen[1], (1, format!("step 2: error: compute device error on worker 1: {message}")), "{seen:?}");
    assert_eq!(seen[0], (0, "step 2: 1 failed".into()), "{seen:?}");
}

/// `fields` sparse fields exchanging rows, but those in `partial`, which
/// exchange partial results.
pub fn partial_exchange(fields: usize, partial: &[usize]) -> ExchangeConfig {
    let mut tables = vec![TableExchange::Rows; fields];
    for &f in partial {
        tables[f] = TableExchange::Partial;
    }
    ExchangeConfig { tables, replicated: vec![] }
}

/// The five hottest ids (the lowest, under the tests' skewed ids) of every table of `sizes` replicated.
pub fn replicated_exchange(sizes: &[u64]) -> ExchangeConfig {
    ExchangeConfig { tables: vec![], replicated: sizes.iter().map(|&n| (0..5.min(n)).collect()).collect() }
}
