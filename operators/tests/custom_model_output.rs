//! A caller's model (`ModelConfig::Custom`, handed to `Trainer::with_model`) whose
//! outputs have other sizes than the trainer needs: gradients shorter than its
//! parameters are refused when the trainer is built, and logits fewer than the
//! batch's samples fail that step with a typed error on its worker and as a failed
//! step on every other worker, neither panicking nor hanging.

use std::sync::{Arc, Mutex};
use tiderec_operators::nn::{Model, ModelConfig, ModelInputs};
use tiderec_operators::train::Trainer;
use tiderec_operators::OperatorError;

mod common;

const DIM: usize = 4;

/// A linear model over the dense features and the pooled rows:
/// parameters `[b, w (2 dense), v (2 fields × DIM)]`. From its `short_from`-th
/// forward on it returns one logit fewer than the batch has samples; its
/// gradients are `missing` values shorter than its parameters.
struct Linear {
    params: Vec<f32>,
    grads: Vec<f32>,
    logits: Vec<f32>,
    forwards: usize,
    short_from: usize,
}

impl Linear {
    fn new(short_from: usize, missing: usize) -> Self {
        let n = 1 + 2 + 2 * DIM;
        Linear { params: vec![0.1; n], grads: vec![0.0; n - missing], logits: Vec::new(), forwards: 0, short_from }
    }
}

impl Model<f32> for Linear {
    fn params(&self) -> &[f32] {
        &self.params
    }
    fn params_mut(&mut self) -> &mut [f32] {
        &mut self.params
    }
    fn grads(&self) -> &[f32] {
        &self.grads
    }
    fn params_and_grads(&mut self) -> (&mut [f32], &[f32]) {
        (&mut self.params, &self.grads)
    }
    fn grads_mut(&mut self) -> &mut [f32] {
        &mut self.grads
    }
    fn embedding_dim(&self) -> usize {
        DIM
    }
    fn forward(&mut self, dense: &[f32], pooled: &[f32], batch: usize) -> &[f32] {
        self.forwards += 1;
        let (w, v) = self.params[1..].split_at(2);
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        self.logits = (0..batch)
            .map(|s| {
                let row = 2 * DIM;
                self.params[0] + dot(w, &dense[s * 2..s * 2 + 2]) + dot(v, &pooled[s * row..(s + 1) * row])
            })
            .collect();
        if self.forwards >= self.short_from {
            self.logits.pop();
        }
        &self.logits
    }
    fn backward(&mut self, dense: &[f32], pooled: &[f32], dlogits: &[f32], dpooled: &mut [f32]) {
        let row = 2 * DIM;
        self.grads.fill(0.0);
        dpooled.fill(0.0);
        for (s, &g) in dlogits.iter().enumerate() {
            self.grads[0] += g;
            for k in 0..2 {
                self.grads[1 + k] += g * dense[s * 2 + k];
            }
            for c in 0..row {
                self.grads[3 + c] += g * pooled[s * row + c];
                dpooled[s * row + c] = g * self.params[3 + c];
            }
        }
    }
}

fn shape() -> ModelConfig {
    ModelConfig::Custom(ModelInputs::new(2, 2, DIM))
}

/// Trains `workers` workers for up to 6 steps; worker `bad`'s model returns too few
/// logits from its third forward (step 2) on. Each worker's line, in worker order.
fn run_with_short_logits(workers: usize, bad: usize) -> Vec<String> {
    let config = common::config(shape());
    common::within(60, move || {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let out = seen.clone();
        timely::execute(timely::Config::process(workers), move |worker| {
            let me = worker.index();
            let model = Box::new(Linear::new(if me == bad { 3 } else { usize::MAX }, 0));
            let mut trainer = Trainer::with_model(worker, &config, model).unwrap();
            let failure = common::first_failure(worker, &mut trainer, 6, |s| common::batch(me, s, 3));
            let typed = |e: &OperatorError| {
                matches!(e, OperatorError::ModelOutput { worker, logits: 2, samples: 3 } if *worker == bad)
            };
            let line = common::failure_line(failure, typed);
            out.lock().unwrap().push((me, line, trainer.train_steps()));
        })
        .unwrap();
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        seen.into_iter()
            .map(|(me, line, trained)| {
                assert_eq!(trained, 2, "worker {me}: the failed step trained nothing");
                line
            })
            .collect()
    })
}

#[test]
fn too_few_logits_fail_the_step_with_a_typed_error_on_one_worker() {
    let lines = run_with_short_logits(1, 0);
    assert_eq!(lines, ["step 2: error: the model of worker 0 returned 2 logits for a batch of 3 samples"]);
}

#[test]
fn too_few_logits_fail_the_same_step_on_every_worker() {
    let lines = run_with_short_logits(2, 1);
    assert_eq!(
        lines,
        ["step 2: 1 failed", "step 2: error: the model of worker 1 returned 2 logits for a batch of 3 samples"]
    );
}

#[test]
fn gradients_shorter_than_the_parameters_are_refused_on_every_worker() {
    for workers in [1, 2] {
        let config = common::config(shape());
        let errors = common::within(60, move || {
            timely::execute(timely::Config::process(workers), move |worker| {
                let model = Box::new(Linear::new(usize::MAX, 1));
                Trainer::with_model(worker, &config, model).err().map(|e| e.to_string())
            })
            .unwrap()
            .join()
        });
        assert_eq!(errors.len(), workers);
        for e in errors {
            let e = e.expect("no panic").expect("refused");
            assert_eq!(
                e,
                "invalid configuration `model`: the worker's model has 10 gradients for its 11 dense parameters \
                 (they must be as many)"
            );
        }
    }
}
