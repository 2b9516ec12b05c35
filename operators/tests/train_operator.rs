//! Training as a timely operator (`Train::train`) against the imperative `Trainer`:
//! the same micro-batches give the same statistics and the same parameters, bit for
//! bit; a step a worker has no batch of is an empty micro-batch from it; a batch
//! that does not fit the model fails its step on every worker and trains nothing.

use std::sync::{Arc, Mutex};
use tiderec_operators::train::{StepKind, StepStats, Train, Trainer, TrainerConfig};
use tiderec_operators::Batch;
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

fn imperative() -> Run {
    let config = config();
    let runs = timely::execute(timely::Config::process(2), move |worker| {
        let me = worker.index();
        let mut trainer = Trainer::new(worker, &config).unwrap();
        let mut stats = Vec::new();
        for t in 0..STEPS {
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

fn operator() -> (Run, Vec<usize>) {
    let config = config();
    let errors = Arc::new(Mutex::new(vec![0; 2]));
    let counted = errors.clone();
    let runs = timely::execute(timely::Config::process(2), move |worker| {
        let me = worker.index();
        let mut input = InputHandle::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let (probe, handle) = worker.dataflow::<u64, _, _>(|scope| {
            let (steps, handle) = input.to_stream(scope).train(&config).unwrap();
            (steps.inspect(move |x: &StepStats| s.lock().unwrap().push(*x)).probe().0, handle)
        });
        for t in 0..STEPS {
            if let Some(b) = micro_batch(&config, me, t) {
                input.send(b);
            }
            input.advance_to(t + 1);
        }
        input.close();
        while !probe.done() {
            worker.step();
        }
        counted.lock().unwrap()[me] = handle.take_errors().len();
        let stats = seen.lock().unwrap().clone();
        (stats, handle.dense_params())
    })
    .unwrap();
    let runs = runs.join().into_iter().map(|r| r.unwrap()).collect();
    let errors = errors.lock().unwrap().clone();
    (runs, errors)
}

#[test]
fn the_operator_takes_the_steps_of_the_imperative_trainer() {
    let (expected, (got, errors)) = (imperative(), operator());
    for me in 0..2 {
        let ((want_stats, want_params), (got_stats, got_params)) = (&expected[me], &got[me]);
        assert_eq!(got_stats.len() as u64, STEPS, "worker {me}: one report per step");
        for (t, (a, b)) in want_stats.iter().zip(got_stats).enumerate() {
            if a.failed_workers > 0 {
                assert_eq!(b.failed_workers, 1, "worker {me}, step {t}: the bad batch fails its step");
                continue;
            }
            assert_eq!((a.samples, a.loss_sum.to_bits()), (b.samples, b.loss_sum.to_bits()), "worker {me}, step {t}");
        }
        // Worker 1 had no batch at step 2: that step held worker 0's 2 samples only.
        assert_eq!(got_stats[2].samples, 2, "worker {me}");
        assert_eq!(
            want_params.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            got_params.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "worker {me}: the same parameters, bit for bit"
        );
    }
    assert_eq!(errors, vec![1, 0], "worker 0 kept its bad batch's error");
}
