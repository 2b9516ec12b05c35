//! `Trainer::train_online`: the steps it takes and the callback it makes.
//! Workers with uneven input run until every worker's input is exhausted; a
//! callback's stop request on one worker ends the run on every worker after the
//! same step; the predictions handed to the callback are the global batch's,
//! made before the update; and the parameters are those of plain `step` calls.

use std::ops::ControlFlow;
use tiderec_operators::error::FeatureCounts;
use tiderec_operators::metrics::EvalSet;
use tiderec_operators::train::{OnlineSummary, StepKind, Trainer, TrainerConfig};
use tiderec_operators::{Batch, DataflowError, OperatorError, ShapeError};

mod common;

fn config() -> TrainerConfig {
    common::config(common::dlrm())
}

/// Worker `me`'s micro-batch of step `step`: `me + 2` samples.
fn batch(me: usize, step: u64) -> Batch {
    common::batch(me, step, me as u64 + 2)
}

/// What one worker saw: each callback's step, samples and predictions, the summary and the parameters.
struct Seen {
    steps: Vec<(u64, u64, EvalSet)>,
    summary: OnlineSummary,
    params: Vec<f32>,
}

/// Runs `train_online` on two workers; worker `k` has `batches[k]` batches and its callback
/// asks to stop after step `stop_at[k]` (if any).
fn run_online(batches: [u64; 2], stop_at: [Option<u64>; 2]) -> Vec<Seen> {
    let config = config();
    timely::execute(timely::Config::process(2), move |worker| {
        let me = worker.index();
        let mut trainer = Trainer::new(worker, &config).unwrap();
        let mut steps = Vec::new();
        let summary = trainer
            .train_online(worker, (0..batches[me]).map(|t| batch(me, t)), |s| {
                steps.push((s.step, s.stats.samples, s.predictions.clone()));
                match stop_at[me] {
                    Some(k) if s.step >= k => ControlFlow::Break(()),
                    _ => ControlFlow::Continue(()),
                }
            })
            .unwrap();
        Seen { steps, summary, params: trainer.dense_params().unwrap() }
    })
    .unwrap()
    .join()
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

#[test]
fn uneven_inputs_run_until_every_worker_is_exhausted() {
    let seen = run_online([5, 3], [None, None]);
    for s in &seen {
        assert_eq!(s.summary.steps, 5);
        assert!(!s.summary.stopped);
        // Steps 1–3 have both workers' samples (2 + 3), steps 4–5 worker 0's only.
        let samples: Vec<u64> = s.steps.iter().map(|(_, n, _)| *n).collect();
        assert_eq!(samples, [5, 5, 5, 2, 2]);
        assert_eq!(s.summary.samples, 19);
        assert_eq!(s.steps.iter().map(|(k, _, _)| *k).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    }
    // Worker 0 gets every sample's prediction, a probability, with its label; worker 1 none.
    for (_, n, eval) in &seen[0].steps {
        assert_eq!(eval.probs.len() as u64, *n);
        assert_eq!(eval.labels.len() as u64, *n);
        assert!(eval.probs.iter().all(|p| (0.0..=1.0).contains(p)));
    }
    assert!(seen[1].steps.iter().all(|(_, _, e)| e.probs.is_empty()));
    assert_eq!(seen[0].summary, seen[1].summary);
    assert_eq!(seen[0].params, seen[1].params);
}

#[test]
fn a_stop_request_on_one_worker_ends_the_run_on_every_worker_after_the_same_step() {
    let seen = run_online([20, 20], [None, Some(2)]);
    for s in &seen {
        // Worker 1 asks after step 2; step 3 carries the request and is the last.
        assert_eq!(s.summary.steps, 3);
        assert!(s.summary.stopped);
        assert_eq!(s.steps.len(), 3);
        assert_eq!(s.summary.samples, 15);
    }
    assert_eq!(seen[0].params, seen[1].params);
}

#[test]
fn online_training_trains_as_plain_steps_and_scores_before_each_update() {
    let online = run_online([4, 4], [None, None]);
    let config = config();
    let plain = timely::execute(timely::Config::process(2), move |worker| {
        let me = worker.index();
        let mut trainer = Trainer::new(worker, &config).unwrap();
        let mut before = Vec::new();
        for t in 0..4 {
            // The predictions of step `t` are those of the parameters after step `t - 1`.
            trainer.step(worker, StepKind::Eval, batch(me, t)).unwrap();
            before.push(trainer.take_eval());
            trainer.step(worker, StepKind::Train, batch(me, t)).unwrap();
        }
        (before, trainer.dense_params().unwrap())
    })
    .unwrap()
    .join()
    .into_iter()
    .map(|r| r.unwrap())
    .collect::<Vec<_>>();
    assert_eq!(online[0].params, plain[0].1, "the same parameters as plain training steps");
    for ((_, _, got), want) in online[0].steps.iter().zip(&plain[0].0) {
        assert_eq!(got, want, "prequential predictions are made before the step's update");
    }
}

#[test]
fn a_batch_that_does_not_fit_fails_its_worker_and_stops_the_others() {
    let config = config();
    let results = timely::execute(timely::Config::process(2), move |worker| {
        let me = worker.index();
        let mut trainer = Trainer::new(worker, &config).unwrap();
        let stream = (0..5u64).map(move |t| if me == 1 && t == 2 { Batch::new(3, 2) } else { batch(me, t) });
        let mut calls = 0;
        let result = trainer.train_online(worker, stream, |_| {
            calls += 1;
            ControlFlow::Continue(())
        });
        (result.map(|s| s.steps), calls)
    })
    .unwrap()
    .join()
    .into_iter()
    .map(|r| r.unwrap())
    .collect::<Vec<_>>();
    match &results[1].0 {
        Err(OperatorError::Shape(ShapeError::FeatureCounts { batch, model })) => {
            assert_eq!(*batch, FeatureCounts { dense: 3, sparse: 2, sequences: 0 });
            assert_eq!(*model, FeatureCounts { dense: 2, sparse: 2, sequences: 0 });
        }
        other => panic!("worker 1: {other:?}"),
    }
    match &results[0].0 {
        Err(OperatorError::Dataflow(e)) => {
            assert_eq!(*e, DataflowError::StepFailed { step: 3, failed_workers: 1 });
            assert_eq!(e.to_string(), "1 worker(s) failed at online step 3");
        }
        other => panic!("worker 0: {other:?}"),
    }
    assert_eq!((results[0].1, results[1].1), (2, 2), "both called back for the two good steps only");
}
