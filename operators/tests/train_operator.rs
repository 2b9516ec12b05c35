//! Training as a timely operator (`Train::train`) against the imperative `Trainer`:
//! the same micro-batches give the same statistics and the same parameters, bit for
//! bit; a step a worker has no batch of is an empty micro-batch from it; the steps end
//! together whenever each worker closes its input; a batch that does not fit the model
//! fails its step on every worker and trains nothing; a non-finite step is the last.

use std::sync::mpsc;
use std::time::Duration;
use tiderec_operators::nn::{DlrmConfig, ModelConfig};
use tiderec_operators::train::{StepKind, StepStats, Train, Trainer, TrainerConfig};
use tiderec_operators::{Batch, DataflowError, OperatorError};
use timely::dataflow::operators::{Inspect, Probe};
use timely::dataflow::InputHandle;

mod common;

fn config() -> TrainerConfig {
    common::config(common::dlrm())
}

/// Worker `me`'s micro-batch of step `t`, or `None` where it has none (worker 1 at step 2).
fn batch(me: usize, t: u64) -> Option<Batch> {
    (!(me == 1 && t == 2)).then(|| common::batch(me, t, me as u64 + 2))
}

/// Worker 0's bad batch of step `t`: an id outside its table.
fn bad(me: usize, t: u64) -> bool {
    me == 0 && t == 4
}

fn micro_batch(config: &TrainerConfig, me: usize, t: u64) -> Option<Batch> {
    let mut b = batch(me, t)?;
    if bad(me, t) {
        b.sparse[0].ids[0] = config.table_sizes[0];
    }
    Some(b)
}

const STEPS: u64 = 8;

/// Per worker: every step's statistics and the final dense parameters.
type Run = Vec<(Vec<StepStats>, Vec<f32>)>;

/// The imperative trainer on `micro_batch`, leaving out the steps `skip` names on every worker.
fn imperative(skip: impl Fn(u64) -> bool + Send + Sync + 'static) -> Run {
    let config = config();
    let runs = timely::execute(timely::Config::process(2), move |worker| {
        let me = worker.index();
        let mut trainer = Trainer::new(worker, &config).unwrap();
        let mut stats = Vec::new();
        for t in (0..STEPS).filter(|&t| !skip(t)) {
            let b = micro_batch(&config, me, t).unwrap_or_else(|| Batch::new(2, 2));
            match trainer.step(worker, StepKind::Train, b) {
                Ok(s) => stats.push(s),
                Err(_) => {
                    assert!(bad(me, t), "only the bad batch fails");
                    stats.push(StepStats { failed_workers: 1, ..StepStats::default() });
                }
            }
        }
        (stats, trainer.dense_params().unwrap())
    })
    .unwrap();
    runs.join().into_iter().map(|r| r.unwrap()).collect()
}

/// One worker's side of an operator run.
struct OperatorRun {
    stats: Vec<StepStats>,
    params: Vec<f32>,
    errors: Vec<(u64, OperatorError)>,
    /// Whether the handle gave out a snapshot at the end.
    snapshot: bool,
    trained: u64,
}

/// The operator on two workers, each sending the batches `batches(me)` gives (at their
/// times, in order) and then closing its input before it takes a step. Fails, rather than
/// waits forever, when the workers do not finish within a minute.
fn operator(batches: impl Fn(usize) -> Vec<(u64, Batch)> + Send + Sync + 'static) -> Vec<OperatorRun> {
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let config = config();
        let runs = timely::execute(timely::Config::process(2), move |worker| {
            let me = worker.index();
            let mut input = InputHandle::new();
            let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
            let s = seen.clone();
            let (probe, handle) = worker.dataflow::<u64, _, _>(|scope| {
                let (steps, handle) = input.to_stream(scope).train(&config).unwrap();
                (steps.inspect(move |x: &StepStats| s.borrow_mut().push(*x)).probe().0, handle)
            });
            for (t, b) in batches(me) {
                input.advance_to(t);
                input.send(b);
            }
            input.close();
            while !probe.done() {
                worker.step();
            }
            let stats = seen.borrow().clone();
            OperatorRun {
                stats,
                params: handle.dense_params(),
                errors: handle.take_errors(),
                snapshot: handle.snapshot().is_ok(),
                trained: handle.trained_steps(),
            }
        })
        .unwrap();
        let runs: Vec<OperatorRun> = runs.join().into_iter().map(|r| r.unwrap()).collect();
        let _ = done.send(runs);
    });
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("every worker ends its steps (none waits for another forever)")
}

/// `micro_batch`'s batches of worker `me` for steps `0..STEPS`.
fn stream(me: usize) -> Vec<(u64, Batch)> {
    let config = config();
    (0..STEPS).filter_map(|t| micro_batch(&config, me, t).map(|b| (t, b))).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn the_operator_takes_the_steps_of_the_imperative_trainer() {
    let (expected, got) = (imperative(|_| false), operator(stream));
    // The failed step trains nothing: the run equals one without that step.
    let without = imperative(|t| t == 4);
    for me in 0..2 {
        let ((want_stats, want_params), run) = (&expected[me], &got[me]);
        assert_eq!(run.stats.len() as u64, STEPS, "worker {me}: one report per step");
        for (t, (a, b)) in want_stats.iter().zip(&run.stats).enumerate() {
            if a.failed_workers > 0 {
                assert_eq!(b.failed_workers, 1, "worker {me}, step {t}: the bad batch fails its step");
                continue;
            }
            assert_eq!((a.samples, a.loss_sum.to_bits()), (b.samples, b.loss_sum.to_bits()), "worker {me}, step {t}");
        }
        // Worker 1 had no batch at step 2: that step held worker 0's 2 samples only.
        assert_eq!(run.stats[2].samples, 2, "worker {me}");
        assert_eq!(bits(want_params), bits(&run.params), "worker {me}: the same parameters, bit for bit");
        assert_eq!(bits(&without[me].1), bits(&run.params), "worker {me}: the failed step trained nothing");
        assert_eq!(run.trained, STEPS - 1, "worker {me}: every step but the failed one trained");
        assert!(run.snapshot, "worker {me}");
    }
    assert_eq!((got[0].errors.len(), got[1].errors.len()), (1, 0), "worker 0 kept its bad batch's error");
    assert_eq!(got[0].errors[0].0, 4);
}

#[test]
fn a_worker_without_a_batch_in_the_last_step_ends_with_the_others() {
    // Worker 1 closes its input after step 6's batch: it saw nothing of step 7, which
    // worker 0 still has a batch of.
    let got = operator(|me| stream(me).into_iter().filter(|(t, _)| !(me == 1 && *t == STEPS - 1)).collect());
    for (me, run) in got.iter().enumerate() {
        assert_eq!(run.stats.len() as u64, STEPS, "worker {me}: every step, the last one too");
        assert_eq!(run.stats[STEPS as usize - 1].samples, 2, "worker {me}: the last step holds worker 0's batch");
    }
    assert_eq!(bits(&got[0].params), bits(&got[1].params), "one model on both workers");
}

#[test]
fn workers_that_close_without_a_batch_end_without_a_step() {
    let got = operator(|_| Vec::new());
    for run in &got {
        assert!(run.stats.is_empty() && run.errors.is_empty() && run.trained == 0);
    }
}

#[test]
fn a_broken_batch_beside_a_good_one_fails_its_step_and_panics_nothing() {
    let got = operator(|me| {
        let mut batches = stream(me);
        if me == 0 {
            // A sample whose bag is never closed: its offsets do not cover its ids.
            let mut broken = Batch::new(2, 2);
            broken.labels.push(1.0);
            broken.dense.extend([0.5, 0.5]);
            broken.sparse[0].ids.push(3);
            batches.insert(2, (1, broken));
        }
        batches
    });
    for (me, run) in got.iter().enumerate() {
        assert_eq!(run.stats.len() as u64, STEPS, "worker {me}");
        assert_eq!(run.stats[1].failed_workers, 1, "worker {me}: step 1 failed everywhere");
        assert_eq!(run.stats[4].failed_workers, 1, "worker {me}: and step 4 (an id outside its table)");
    }
    let steps: Vec<u64> = got[0].errors.iter().map(|(t, _)| *t).collect();
    assert_eq!(steps, [1, 4], "{:?}", got[0].errors);
}

#[test]
fn a_non_finite_step_is_the_last_and_its_model_is_not_handed_out() {
    let got = operator(|me| {
        let mut batches = stream(me);
        if me == 1 {
            // Finite values whose products overflow: a later step finds a non-finite value.
            let (_, step_3) = batches.iter_mut().find(|(t, _)| *t == 3).expect("worker 1 has a batch at step 3");
            step_3.dense.iter_mut().for_each(|v| *v = 3e38);
        }
        batches
    });
    let last = got[0].stats.len() - 1;
    assert!(last < STEPS as usize - 1, "the steps ended early: {:?}", got[0].stats);
    for (me, run) in got.iter().enumerate() {
        assert_eq!(run.stats.len(), last + 1, "worker {me}: the same steps on every worker");
        let ruined: Vec<usize> = (0..run.stats.len()).filter(|&t| run.stats[t].non_finite > 0).collect();
        assert_eq!(ruined, [last], "worker {me}: the first non-finite step is the last one");
        assert!(!run.snapshot, "worker {me}: no snapshot of a ruined model");
        let trained = run.stats.iter().filter(|s| s.updates_parameters()).count() as u64;
        assert_eq!(run.trained, trained, "worker {me}");
        let non_finite: Vec<_> = run.errors.iter().filter(|(_, e)| matches!(e, OperatorError::Dataflow(_))).collect();
        assert_eq!(non_finite.len(), 1, "worker {me}: {:?}", run.errors);
        assert_eq!(non_finite[0].0, last as u64);
        let step = last as u64 + 1;
        assert!(matches!(non_finite[0].1, OperatorError::Dataflow(DataflowError::NonFinite { step: s }) if s == step));
    }
}

#[test]
fn a_model_of_another_shape_is_refused_before_any_step() {
    let config = config();
    let ModelConfig::Dlrm(shape) = &config.model else { unreachable!("a DLRM") };
    let wider = ModelConfig::Dlrm(DlrmConfig { num_dense: shape.num_dense + 3, ..shape.clone() });
    let refused = timely::execute(timely::Config::thread(), move |worker| {
        let model = wider.build::<f32>(1).unwrap();
        match Trainer::with_model(worker, &config, model) {
            Err(OperatorError::Config(e)) => e.key,
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a model reading 5 dense values trains a config of 2"),
        }
    })
    .unwrap();
    assert_eq!(refused.join().pop().unwrap().unwrap(), "model");
}
