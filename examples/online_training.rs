//! Online training on an endless stream, watched and stopped by a callback.
//!
//! Each of two workers feeds [`Trainer::train_online`] its share of an
//! unbounded, seeded Criteo-shaped stream (in production, say, its Kafka
//! partitions). After every step the trainer calls back with the step's global
//! loss and, on worker 0, the predictions the model made for the step's
//! samples *before* training on them: prequential evaluation, every prediction
//! is of data the model had not seen. The callback keeps a sliding window of
//! those predictions, prints the window's AUC and log loss every 20 steps and
//! ends the run once the window's AUC reaches a target (or after a step
//! budget); the stop request reaches every worker, and all stop after the
//! same step.
//!
//! ```text
//! cargo run --release -p tiderec-examples --example online_training
//! ```

use std::collections::VecDeque;
use std::ops::ControlFlow;
use tiderec_operators::metrics::{auc, logloss};
use tiderec_operators::nn::{FmConfig, ModelConfig};
use tiderec_operators::optim::OptimizerParams;
use tiderec_operators::train::{OnlineStep, Trainer, TrainerConfig};
use tiderec_operators::Batch;
use tiderec_sources::synthetic::{SyntheticConfig, SyntheticCriteo, NUM_DENSE, NUM_SPARSE};

/// Timely workers (threads).
const WORKERS: usize = 2;
/// Samples per worker and step.
const MICRO: u64 = 256;
/// Predictions in the sliding window.
const WINDOW: usize = 5_000;
/// Window AUC at which the run stops.
const TARGET_AUC: f64 = 0.82;
/// Steps after which the run stops whatever the AUC.
const MAX_STEPS: u64 = 400;

/// The last `WINDOW` prequential predictions and their labels.
#[derive(Default)]
struct Window {
    probs: VecDeque<f32>,
    labels: VecDeque<f32>,
}

impl Window {
    fn extend(&mut self, probs: &[f32], labels: &[f32]) {
        self.probs.extend(probs);
        self.labels.extend(labels);
        while self.probs.len() > WINDOW {
            self.probs.pop_front();
            self.labels.pop_front();
        }
    }

    /// `(AUC, log loss)` of the window, once it is full.
    fn metrics(&mut self) -> Option<(f64, f64)> {
        if self.probs.len() < WINDOW {
            return None;
        }
        let (p, y) = (self.probs.make_contiguous(), self.labels.make_contiguous());
        Some((auc(p, y)?, logloss(p, y)))
    }
}

fn main() {
    let data = SyntheticCriteo::new(SyntheticConfig::kaggle_like(11, 10_000)).expect("valid synthetic config");
    let model = ModelConfig::Fm(FmConfig {
        num_dense: NUM_DENSE,
        num_sparse: NUM_SPARSE,
        dim: 8,
        deep: Vec::new(),
        fm: true,
        wide_only: 0,
    });
    let config = TrainerConfig::builder(model, data.config().table_sizes.clone())
        .seed(11)
        .dense_hp(OptimizerParams::with_lr(0.01))
        .sparse_hp(OptimizerParams::with_lr(0.1))
        .build()
        .expect("valid config");
    let results = timely::execute(timely::Config::process(WORKERS), move |worker| {
        let (me, peers) = (worker.index() as u64, worker.peers() as u64);
        let mut trainer = Trainer::new(worker, &config).expect("a valid configuration");
        // This worker's share of the stream: at step `t`, samples
        // `[(t·W + me)·MICRO, (t·W + me + 1)·MICRO)`. It never ends; the callback stops the run.
        let data = data.clone();
        let stream = (0u64..).map(move |t| {
            let start = (t * peers + me) * MICRO;
            let mut batch = Batch::new(NUM_DENSE, NUM_SPARSE);
            data.fill(start..start + MICRO, &mut batch);
            batch
        });
        let mut window = Window::default();
        let mut first = None;
        let mut last = None;
        let mut reached_at = None;
        let on_step = |s: &OnlineStep<'_>| {
            window.extend(&s.predictions.probs, &s.predictions.labels);
            if me != 0 {
                // Every worker sees the same statistics; only worker 0 holds predictions.
                return if s.step >= MAX_STEPS { ControlFlow::Break(()) } else { ControlFlow::Continue(()) };
            }
            let metrics = window.metrics();
            if let Some((a, l)) = metrics {
                first.get_or_insert((s.step, a));
                last = Some((s.step, a));
                if s.step.is_multiple_of(20) {
                    let loss = s.stats.loss_sum / s.stats.samples as f64;
                    println!("step {:4}: batch loss {loss:.4}, window AUC {a:.4}, window log loss {l:.4}", s.step);
                }
            }
            let reached = metrics.is_some_and(|(a, _)| a >= TARGET_AUC);
            if reached {
                reached_at.get_or_insert(s.step);
            }
            if reached || s.step >= MAX_STEPS {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        };
        let summary = trainer.train_online(worker, stream, on_step).expect("online training succeeds");
        (summary, first, last, reached_at)
    })
    .expect("timely starts")
    .join();
    let results: Vec<_> = results.into_iter().map(|r| r.expect("no worker panicked")).collect();
    let (summary, first, last, reached_at) = results[0];
    assert!(results.iter().all(|r| r.0 == summary), "every worker ends after the same step");
    assert!(summary.stopped, "the callback stopped the run");
    let ((s0, a0), (s1, a1)) = (first.expect("a full window"), last.expect("a full window"));
    match reached_at {
        Some(step) => println!("window AUC reached {TARGET_AUC} at step {step}"),
        None => println!("window AUC stayed below {TARGET_AUC} for {MAX_STEPS} steps"),
    }
    println!(
        "stopped after {} steps ({} samples, mean loss {:.4}); window AUC {a0:.4} at step {s0}, {a1:.4} at step {s1}",
        summary.steps,
        summary.samples,
        summary.loss_sum / summary.samples as f64
    );
    assert!(a1 > a0, "the prequential AUC did not rise: {a0:.4} -> {a1:.4}");
}
