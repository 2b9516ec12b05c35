//! The dense optimizers on the device against `optim::DenseOptimizer` for
//! several steps on odd lengths. Without a GPU every test prints why it skips.

mod common;

use common::{assert_close, device, get, normal, put};
use tiderec_gpu::optim::{DenseHyper, DenseKind, DenseOptimizer};
use tiderec_operators::optim::{self as cpu, DenseOptimizerKind, OptimizerParams};

#[test]
fn dense_optimizers_match_the_cpu_over_several_steps() {
    let Some(dev) = device() else { return };
    for (kind, dkind) in [
        (DenseOptimizerKind::Sgd, DenseKind::Sgd),
        (DenseOptimizerKind::Adagrad, DenseKind::Adagrad),
        (DenseOptimizerKind::Adam, DenseKind::Adam),
    ] {
        for n in [1usize, 1300, 100_003] {
            let mut hp = OptimizerParams::with_lr(0.01);
            hp.initial_accumulator = 0.05;
            let hyper = DenseHyper {
                lr: hp.lr,
                beta1: hp.beta1,
                beta2: hp.beta2,
                eps: hp.eps,
                initial_accumulator: hp.initial_accumulator,
            };
            let mut opt = cpu::DenseOptimizer::new(kind, hp, n);
            let mut dopt = DenseOptimizer::new(&dev, dkind, hyper, n).unwrap();
            let mut params = normal(50, n);
            let mut pd = put(&dev, &params);
            for step in 0..5u64 {
                let grads = normal(51 + step, n);
                let scale = 0.25;
                opt.apply_scaled(&mut params, &grads, scale);
                dopt.apply_scaled(&dev, &mut pd, &put(&dev, &grads), scale).unwrap();
                let what = format!("{kind:?} n{n} step {step}");
                assert_close(&format!("{what} params"), &get(&dev, &pd, n), &params);
                let state = opt.state(0);
                let (m, v) = dopt.moments();
                if let Some(m) = m {
                    assert_close(&format!("{what} m"), &get(&dev, m, n), &state.m);
                }
                if let Some(v) = v {
                    assert_close(&format!("{what} v"), &get(&dev, v, n), &state.v);
                }
                assert_eq!(dopt.steps(), state.t);
            }
        }
    }
}
