//! Featurizing and training as operators of your own timely dataflow.
//!
//! Each worker feeds its share of the Criteo sample's lines into an input, 64 lines
//! per timestamp; tiderec's `featurize` operator turns each timestamp's lines into
//! one batch with the `criteo` feature spec, and the `train` operator trains a
//! small DLRM on them, one synchronous step per timestamp, reporting each step's
//! statistics on a stream. A probe on that stream tells the workers when to feed
//! more; the trainer's handle gives the model afterwards.
//!
//! ```text
//! cargo run --release -p tiderec-examples --example train_operators -- ../shared/data/criteo/sample.train
//! ```

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tiderec_operators::nn::{DlrmConfig, ModelConfig};
use tiderec_operators::spec::FeatureSpec;
use tiderec_operators::stream::Featurize;
use tiderec_operators::train::{StepStats, Train, TrainerConfig};
use timely::dataflow::operators::{Inspect, Probe};
use timely::dataflow::InputHandle;

/// Lines per worker and step.
const MICRO_BATCH: usize = 64;

fn main() {
    let path: PathBuf = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/criteo/sample.train"))
    });
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let lines: Arc<Vec<Vec<u8>>> =
        Arc::new(text.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec).collect());
    let buckets = 20_000;
    let spec = FeatureSpec::criteo(buckets);
    let model = ModelConfig::Dlrm(DlrmConfig { bottom: vec![64, 16], top: vec![64, 1], ..DlrmConfig::kaggle() });
    let config = TrainerConfig::builder(model, spec.table_sizes()).seed(3).build().expect("valid config");
    let losses = Arc::new(Mutex::new(Vec::new()));
    let seen = losses.clone();
    timely::execute(timely::Config::process(2), move |worker| {
        let (me, peers) = (worker.index(), worker.peers());
        let mut input = InputHandle::new();
        let seen = seen.clone();
        let (probe, handle) = worker.dataflow::<u64, _, _>(|scope| {
            let (batches, _dead) = input.to_stream(scope).featurize(&spec, 7, "criteo").expect("a valid spec");
            let (steps, handle) = batches.train(&config).expect("valid config");
            let report = steps.inspect(move |s: &StepStats| {
                if me == 0 {
                    seen.lock().unwrap().push(s.loss_sum / s.samples.max(1) as f64);
                }
            });
            (report.probe().0, handle)
        });
        // Worker `me` takes every `peers`-th chunk of lines; both take the same number of steps.
        let steps = lines.len() / (MICRO_BATCH * peers);
        for t in 0..steps as u64 {
            let chunk = (t as usize * peers + me) * MICRO_BATCH;
            for line in &lines[chunk..chunk + MICRO_BATCH] {
                input.send(line.clone());
            }
            input.advance_to(t + 1);
            // At most two steps in flight: the batches of later steps wait in the input.
            while probe.less_than(&t.saturating_sub(1)) {
                worker.step();
            }
        }
        input.close();
        while !probe.done() {
            worker.step();
        }
        assert!(handle.take_errors().is_empty(), "every batch fits the model");
        if me == 0 {
            let snapshot = handle.snapshot().expect("no step found a non-finite value");
            println!(
                "trained {} steps; worker 0 holds {} dense parameters",
                handle.trained_steps(),
                snapshot.dense_params.len()
            );
        }
    })
    .expect("timely starts");
    let losses = losses.lock().unwrap();
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    let (first, last) = (mean(&losses[..10]), mean(&losses[losses.len() - 10..]));
    println!("{} steps: mean loss {first:.4} over the first 10, {last:.4} over the last 10", losses.len());
    assert!(last < first, "the model learned: the loss fell");
}
