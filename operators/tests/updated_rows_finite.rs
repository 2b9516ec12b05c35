//! A finite gradient that the sparse learning rate turns into an infinite
//! embedding row ruins the model as surely as a non-finite loss: the step that
//! wrote the row reports it (`StepStats::non_finite`) on every worker, for
//! every CPU store and for the replicated hot rows, and a training operator
//! ends its run there with `DataflowError::NonFinite` and hands out no model.
//! The loss and the gradients of that step are finite, so only the check of
//! the updated rows can tell.

use std::cell::RefCell;
use std::rc::Rc;
use tiderec_operators::optim::{OptimizerParams, SparseOptimizerKind};
use tiderec_operators::store::{StoreConfig, StoreKind};
use tiderec_operators::train::{StepKind, StepStats, Train, Trainer, TrainerConfig};
use tiderec_operators::{Batch, DataflowError, OperatorError};
use timely::dataflow::operators::{Inspect, Probe};
use timely::dataflow::InputHandle;

mod common;

/// The tests' DLRM with SGD on the rows at the largest finite learning rate:
/// its first update makes rows infinite from gradients well inside f32.
fn config(store: StoreKind) -> TrainerConfig {
    let mut config = common::config(common::dlrm());
    config.sparse_optimizer = SparseOptimizerKind::Sgd;
    config.sparse_hp = OptimizerParams::with_lr(f32::MAX);
    config.store = StoreConfig { kind: store, hot_rows: 4, warmup: 1, flush_every: 1, ..StoreConfig::default() };
    config
}

/// Worker `me`'s micro-batch of step `t`: the shared fixtures' batch with
/// dense features large enough that some row gradient exceeds 1 in magnitude.
fn batch(me: usize, t: u64) -> Batch {
    let mut b = common::batch(me, t, 3);
    b.dense.iter_mut().for_each(|v| *v *= 100.0);
    b
}

/// Each worker's statistics of the first training step of `config` on `workers` workers.
fn first_step(config: TrainerConfig, workers: usize, batch: fn(usize, u64) -> Batch) -> Vec<StepStats> {
    let runs = timely::execute(timely::Config::process(workers), move |worker| {
        let me = worker.index();
        let mut trainer = Trainer::new(worker, &config).unwrap();
        trainer.step(worker, StepKind::Train, batch(me, 0)).unwrap()
    })
    .unwrap();
    runs.join().into_iter().map(|r| r.unwrap()).collect()
}

/// The step that overflowed a row trained (its loss was finite) and is non-finite on every worker.
fn assert_ruined(stats: &[StepStats], what: &str) {
    for (me, s) in stats.iter().enumerate() {
        assert!(s.loss_sum.is_finite() && s.updates_parameters(), "{what}, worker {me}: the loss is finite: {s:?}");
        assert!(s.non_finite > 0, "{what}, worker {me}: the overflowing update is reported: {s:?}");
        assert_eq!(s.non_finite, stats[0].non_finite, "{what}: every worker sees the same count");
    }
}

#[test]
fn a_row_that_a_finite_gradient_makes_infinite_ruins_the_step_in_every_cpu_store() {
    for store in [StoreKind::Fixed, StoreKind::Dynamic, StoreKind::Tiered] {
        // One worker applies its own rows in place; two sum each row over both first.
        for workers in [1, 2] {
            assert_ruined(&first_step(config(store), workers, batch), &format!("{store}, {workers} worker(s)"));
        }
    }
}

/// Worker `me`'s batch of step `t` reading replicated ids only (below 5).
fn hot_batch(me: usize, t: u64) -> Batch {
    let mut b = batch(me, t);
    b.sparse.iter_mut().for_each(|f| f.ids.iter_mut().for_each(|id| *id %= 5));
    b
}

#[test]
fn a_replicated_row_that_a_finite_gradient_makes_infinite_ruins_the_step() {
    let mut config = config(StoreKind::Fixed);
    config.exchange = common::replicated_exchange(&config.table_sizes);
    for workers in [1, 2] {
        assert_ruined(&first_step(config.clone(), workers, hot_batch), &format!("replicas, {workers} worker(s)"));
    }
}

/// One worker's side of a training operator's run.
struct Run {
    stats: Vec<StepStats>,
    errors: Vec<(u64, OperatorError)>,
    snapshot: bool,
}

/// `config` trained as an operator on 2 workers, each sending `steps` batches.
fn operator(config: TrainerConfig, steps: u64) -> Vec<Run> {
    let runs = timely::execute(timely::Config::process(2), move |worker| {
        let me = worker.index();
        let mut input = InputHandle::new();
        let seen = Rc::new(RefCell::new(Vec::new()));
        let s = seen.clone();
        let (probe, handle) = worker.dataflow::<u64, _, _>(|scope| {
            let (steps, handle) = input.to_stream(scope).train(&config).unwrap();
            (steps.inspect(move |x: &StepStats| s.borrow_mut().push(*x)).probe().0, handle)
        });
        for t in 0..steps {
            input.advance_to(t);
            input.send(batch(me, t));
        }
        input.close();
        while !probe.done() {
            worker.step();
        }
        let stats = seen.borrow().clone();
        Run { stats, errors: handle.take_errors(), snapshot: handle.snapshot().is_ok() }
    })
    .unwrap();
    runs.join().into_iter().map(|r| r.unwrap()).collect()
}

#[test]
fn a_training_operator_stops_at_the_step_that_made_a_row_infinite() {
    for store in [StoreKind::Fixed, StoreKind::Dynamic] {
        for (me, run) in operator(config(store), 4).iter().enumerate() {
            assert_eq!(run.stats.len(), 1, "{store}, worker {me}: the first step is the last: {:?}", run.stats);
            assert_ruined(&run.stats, &format!("{store}, worker {me}"));
            assert!(!run.snapshot, "{store}, worker {me}: no snapshot of a ruined model");
            assert_eq!(run.errors.len(), 1, "{store}, worker {me}: {:?}", run.errors);
            let (t, e) = &run.errors[0];
            assert_eq!(*t, 0, "{store}, worker {me}");
            assert!(
                matches!(e, OperatorError::Dataflow(DataflowError::NonFinite { step: 1 })),
                "{store}, worker {me}: {e}"
            );
            assert!(e.to_string().contains("step 1 found a non-finite"), "{store}, worker {me}: {e}");
        }
    }
}
