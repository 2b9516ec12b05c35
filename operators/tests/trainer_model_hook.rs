//! `Trainer::with_model`: a worker's model built by the caller (a GPU
//! worker's). The host model through the hook trains exactly as through
//! `Trainer::new`; a model whose compute backend reports a failure fails
//! that worker's step with the backend's message and stops every worker; a
//! model without a partial form is refused for the partial exchange.

use std::sync::{Arc, Mutex};
use tiderec_operators::exchange::{ExchangeConfig, TableExchange};
use tiderec_operators::nn::{FmConfig, Model, ModelConfig, PartialModel};
use tiderec_operators::train::{StepKind, Trainer};
use tiderec_operators::{Batch, OperatorError};

mod common;

use common::{config, dlrm};

fn batch(me: usize, step: u64) -> Batch {
    common::batch(me, step, 3)
}

/// A host model whose compute backend fails at its `fail_at`-th forward:
/// from then on its passes give NaN logits and it reports the failure once,
/// as a device model does.
struct FailingBackend {
    inner: Box<dyn Model<f32>>,
    forwards: usize,
    fail_at: usize,
    nan: Vec<f32>,
    reported: bool,
}

impl Model<f32> for FailingBackend {
    fn params(&self) -> &[f32] {
        self.inner.params()
    }
    fn params_mut(&mut self) -> &mut [f32] {
        self.inner.params_mut()
    }
    fn grads(&self) -> &[f32] {
        self.inner.grads()
    }
    fn params_and_grads(&mut self) -> (&mut [f32], &[f32]) {
        self.inner.params_and_grads()
    }
    fn grads_mut(&mut self) -> &mut [f32] {
        self.inner.grads_mut()
    }
    fn embedding_dim(&self) -> usize {
        self.inner.embedding_dim()
    }
    fn forward(&mut self, dense: &[f32], pooled: &[f32], batch: usize) -> &[f32] {
        self.forwards += 1;
        if self.forwards >= self.fail_at {
            self.nan = vec![f32::NAN; batch];
            return &self.nan;
        }
        self.inner.forward(dense, pooled, batch)
    }
    fn backward(&mut self, dense: &[f32], pooled: &[f32], dlogits: &[f32], dpooled: &mut [f32]) {
        if self.forwards >= self.fail_at {
            self.inner.grads_mut().fill(0.0);
            dpooled.fill(0.0);
            return;
        }
        self.inner.backward(dense, pooled, dlogits, dpooled)
    }
    fn take_error(&mut self) -> Option<String> {
        (self.forwards >= self.fail_at && !std::mem::replace(&mut self.reported, true))
            .then(|| "CUDA device 7: an injected failure".to_string())
    }
}

#[test]
fn a_host_model_through_the_hook_trains_as_through_new() {
    let config = config(dlrm());
    let params = Arc::new(Mutex::new(Vec::new()));
    let out = params.clone();
    timely::execute(timely::Config::process(2), move |worker| {
        let me = worker.index();
        let mut a = Trainer::new(worker, &config).unwrap();
        let mut b = Trainer::with_model(worker, &config, config.model.build(config.seed).unwrap()).unwrap();
        for step in 0..5 {
            let sa = a.step(worker, StepKind::Train, batch(me, step)).unwrap();
            let sb = b.step(worker, StepKind::Train, batch(me, step)).unwrap();
            assert_eq!(sa.loss_sum.to_bits(), sb.loss_sum.to_bits(), "step {step}");
        }
        let (la, lb) = (a.params_l2(worker).unwrap(), b.params_l2(worker).unwrap());
        out.lock().unwrap().push((a.dense_params().unwrap(), b.dense_params().unwrap(), la, lb));
    })
    .unwrap();
    for (a, b, la, lb) in params.lock().unwrap().iter() {
        assert_eq!(a, b);
        assert_eq!(la.to_bits(), lb.to_bits());
    }
}

#[test]
fn a_failing_compute_backend_fails_its_step_and_stops_every_worker() {
    let config = config(dlrm());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    timely::execute(timely::Config::process(2), move |worker| {
        let me = worker.index();
        let model = config.model.build(config.seed).unwrap();
        let model: Box<dyn Model<f32>> = if me == 1 {
            Box::new(FailingBackend { inner: model, forwards: 0, fail_at: 3, nan: Vec::new(), reported: false })
        } else {
            model
        };
        let mut trainer = Trainer::with_model(worker, &config, model).unwrap();
        let failure = common::first_failure(worker, &mut trainer, 6, |s| batch(me, s));
        let device = |e: &OperatorError| matches!(e, OperatorError::Device { worker: 1, message } if message.starts_with("CUDA device 7"));
        out.lock().unwrap().push((me, common::failure_line(failure, device)));
    })
    .unwrap();
    let mut seen = seen.lock().unwrap().clone();
    common::assert_worker_1_failed_in_step_2(&mut seen, "CUDA device 7: an injected failure");
}

/// Worker 1's model fails in step 2 (its third forward); every worker stops at its
/// first step that did not train cleanly, as the pipeline does. Every worker returns
/// from that same step (worker 1 with its device's error, worker 0 told of one failed
/// worker), and the step changed no parameter: each worker's dense parameters and
/// checkpoint share equal those of a run that stopped before it.
#[test]
fn a_failing_compute_backend_fails_the_same_step_everywhere_and_updates_nothing() {
    let config = config(dlrm());
    let run = |fail_at: Option<usize>, steps: u64| {
        let config = config.clone();
        common::within(60, move || {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let out = seen.clone();
            timely::execute(timely::Config::process(2), move |worker| {
                let me = worker.index();
                let model = config.model.build(config.seed).unwrap();
                let model: Box<dyn Model<f32>> = match fail_at {
                    Some(fail_at) if me == 1 => Box::new(FailingBackend {
                        inner: model,
                        forwards: 0,
                        fail_at,
                        nan: Vec::new(),
                        reported: false,
                    }),
                    _ => model,
                };
                let mut trainer = Trainer::with_model(worker, &config, model).unwrap();
                let line = match common::until_first_bad_step(worker, &mut trainer, steps, |s| batch(me, s)) {
                    None => String::new(),
                    Some((s, Ok(stats))) => format!("step {s}: {} failed", stats.failed_workers),
                    Some((s, Err(e))) => {
                        let device = matches!(&e, OperatorError::Device { worker: 1, .. });
                        assert!(device, "{e:?}");
                        format!("step {s}: error: {e}")
                    }
                };
                let state = (trainer.dense_params().unwrap(), trainer.snapshot().unwrap());
                out.lock().unwrap().push((me, line, state, trainer.train_steps()));
            })
            .unwrap();
            let mut seen = seen.lock().unwrap().clone();
            seen.sort_by_key(|s| s.0);
            seen
        })
    };
    let failed = run(Some(3), 6);
    assert_eq!(failed[0].1, "step 2: 1 failed");
    assert_eq!(failed[1].1, "step 2: error: compute device error on worker 1: CUDA device 7: an injected failure");
    let clean = run(None, 2);
    for (f, c) in failed.iter().zip(&clean) {
        assert_eq!(f.2, c.2, "worker {}: the failed step updated nothing", f.0);
        assert_eq!(f.3, 2, "worker {}: two training steps", f.0);
    }
}

/// A model without a partial form (as a device model).
struct NoPartial(Box<dyn Model<f32>>);

impl Model<f32> for NoPartial {
    fn params(&self) -> &[f32] {
        self.0.params()
    }
    fn params_mut(&mut self) -> &mut [f32] {
        self.0.params_mut()
    }
    fn grads(&self) -> &[f32] {
        self.0.grads()
    }
    fn params_and_grads(&mut self) -> (&mut [f32], &[f32]) {
        self.0.params_and_grads()
    }
    fn grads_mut(&mut self) -> &mut [f32] {
        self.0.grads_mut()
    }
    fn embedding_dim(&self) -> usize {
        self.0.embedding_dim()
    }
    fn forward(&mut self, dense: &[f32], pooled: &[f32], batch: usize) -> &[f32] {
        self.0.forward(dense, pooled, batch)
    }
    fn backward(&mut self, dense: &[f32], pooled: &[f32], dlogits: &[f32], dpooled: &mut [f32]) {
        self.0.backward(dense, pooled, dlogits, dpooled)
    }
    fn partial_model(&mut self) -> Option<&mut dyn PartialModel<f32>> {
        None
    }
}

#[test]
fn a_model_without_a_partial_form_is_refused_for_the_partial_exchange() {
    let fm = ModelConfig::Fm(FmConfig { num_dense: 2, num_sparse: 2, dim: 3, deep: vec![], fm: true, wide_only: 0 });
    let mut config = config(fm);
    config.exchange = ExchangeConfig { tables: vec![TableExchange::Partial; 2], replicated: vec![] };
    timely::execute(timely::Config::thread(), move |worker| {
        let model = Box::new(NoPartial(config.model.build(config.seed).unwrap()));
        let err = Trainer::with_model(worker, &config, model).err().expect("refused");
        assert!(err.to_string().contains("`exchange`") && err.to_string().contains("partial form"), "{err}");
        // With its partial form the same model is accepted.
        assert!(Trainer::with_model(worker, &config, config.model.build(config.seed).unwrap()).is_ok());
    })
    .unwrap();
}
