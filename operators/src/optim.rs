//! Optimizers for dense parameter slices and for embedding rows.
//!
//! Dense optimizers own the state of exactly the slice they update, so the
//! worker that owns slice `k` of the reduce-scatter holds the optimizer state
//! of slice `k` and nothing else. Sparse optimizers update one row at a time
//! from the row's summed gradient; row-wise Adagrad keeps one accumulator per row.
//! Every `apply` takes the already-averaged gradient.

use crate::OperatorError;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// Dense optimizer kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenseOptimizerKind {
    /// Plain SGD.
    Sgd,
    /// Adagrad (per-element accumulator).
    Adagrad,
    /// Adam with bias correction.
    Adam,
}

impl FromStr for DenseOptimizerKind {
    type Err = OperatorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sgd" => Ok(Self::Sgd),
            "adagrad" => Ok(Self::Adagrad),
            "adam" => Ok(Self::Adam),
            _ => Err(OperatorError::config("optimizer", format!("unknown dense optimizer `{s}` (sgd, adagrad, adam)"))),
        }
    }
}

/// Sparse (embedding row) optimizer kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SparseOptimizerKind {
    /// Plain SGD on the touched rows.
    Sgd,
    /// Row-wise Adagrad: one accumulator of the mean squared gradient per row.
    RowwiseAdagrad,
}

impl FromStr for SparseOptimizerKind {
    type Err = OperatorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sgd" => Ok(Self::Sgd),
            "rowwise-adagrad" | "row-wise-adagrad" | "adagrad" => Ok(Self::RowwiseAdagrad),
            _ => Err(OperatorError::config(
                "sparse_optimizer",
                format!("unknown sparse optimizer `{s}` (sgd, rowwise-adagrad)"),
            )),
        }
    }
}

/// Hyper-parameters shared by the optimizers.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptimizerParams {
    /// Learning rate.
    pub lr: f32,
    /// Adam β₁.
    pub beta1: f32,
    /// Adam β₂.
    pub beta2: f32,
    /// Denominator guard.
    pub eps: f32,
    /// Initial Adagrad accumulator.
    pub initial_accumulator: f32,
}

impl OptimizerParams {
    /// Defaults with the given learning rate.
    pub fn with_lr(lr: f32) -> Self {
        OptimizerParams { lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, initial_accumulator: 0.0 }
    }
}

/// State and update rule for one dense slice.
#[derive(Clone, Debug)]
pub struct DenseOptimizer {
    kind: DenseOptimizerKind,
    hp: OptimizerParams,
    m: Vec<f32>,
    v: Vec<f32>,
    t: u64,
}

impl DenseOptimizer {
    /// State for a slice of `len` parameters.
    pub fn new(kind: DenseOptimizerKind, hp: OptimizerParams, len: usize) -> Self {
        let (m, v) = match kind {
            DenseOptimizerKind::Sgd => (Vec::new(), Vec::new()),
            DenseOptimizerKind::Adagrad => (Vec::new(), vec![hp.initial_accumulator; len]),
            DenseOptimizerKind::Adam => (vec![0.0; len], vec![0.0; len]),
        };
        DenseOptimizer { kind, hp, m, v, t: 0 }
    }

    /// Updates `params` in place from the averaged gradient `grads`.
    pub fn apply(&mut self, params: &mut [f32], grads: &[f32]) {
        self.apply_scaled(params, grads, 1.0);
    }

    /// Updates `params` in place from the gradient `scale · grads` (the
    /// averaging is fused into the update; no scaled copy is made).
    pub fn apply_scaled(&mut self, params: &mut [f32], grads: &[f32], scale: f32) {
        assert_eq!(params.len(), grads.len());
        self.t += 1;
        let OptimizerParams { lr, beta1, beta2, eps, .. } = self.hp;
        match self.kind {
            DenseOptimizerKind::Sgd => {
                for (p, g) in params.iter_mut().zip(grads) {
                    *p -= lr * (g * scale);
                }
            }
            DenseOptimizerKind::Adagrad => {
                for ((p, g), v) in params.iter_mut().zip(grads).zip(&mut self.v) {
                    let g = g * scale;
                    *v += g * g;
                    *p -= lr * g / (v.sqrt() + eps);
                }
            }
            DenseOptimizerKind::Adam => {
                let bc1 = 1.0 - beta1.powi(self.t.min(i32::MAX as u64) as i32);
                let bc2 = 1.0 - beta2.powi(self.t.min(i32::MAX as u64) as i32);
                let step = lr / bc1;
                let bc2_sqrt = bc2.sqrt();
                for (((p, g), m), v) in params.iter_mut().zip(grads).zip(&mut self.m).zip(&mut self.v) {
                    let g = g * scale;
                    *m = beta1 * *m + (1.0 - beta1) * g;
                    *v = beta2 * *v + (1.0 - beta2) * g * g;
                    *p -= step * *m / (v.sqrt() / bc2_sqrt + eps);
                }
            }
        }
    }
}

/// Applies one sparse update to `row` from its averaged gradient `grad`;
/// `accumulator` is the row's Adagrad state (unused by SGD).
#[inline]
pub fn apply_row(
    kind: SparseOptimizerKind,
    hp: &OptimizerParams,
    row: &mut [f32],
    grad: &[f32],
    accumulator: &mut f32,
) {
    match kind {
        SparseOptimizerKind::Sgd => {
            for (r, g) in row.iter_mut().zip(grad) {
                *r -= hp.lr * g;
            }
        }
        SparseOptimizerKind::RowwiseAdagrad => {
            let mean_sq = grad.iter().map(|g| g * g).sum::<f32>() / grad.len() as f32;
            *accumulator += mean_sq;
            let scale = hp.lr / (accumulator.sqrt() + hp.eps);
            for (r, g) in row.iter_mut().zip(grad) {
                *r -= scale * g;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quadratic_descends(kind: DenseOptimizerKind, lr: f32) {
        // minimise Σ (p - 3)²
        let mut opt = DenseOptimizer::new(kind, OptimizerParams::with_lr(lr), 4);
        let mut p = vec![0.0f32; 4];
        for _ in 0..2000 {
            let g: Vec<f32> = p.iter().map(|x| 2.0 * (x - 3.0)).collect();
            opt.apply(&mut p, &g);
        }
        for x in p {
            assert!((x - 3.0).abs() < 1e-2, "{kind:?}: {x}");
        }
    }

    #[test]
    fn dense_optimizers_minimise_a_quadratic() {
        quadratic_descends(DenseOptimizerKind::Sgd, 0.1);
        quadratic_descends(DenseOptimizerKind::Adagrad, 0.5);
        quadratic_descends(DenseOptimizerKind::Adam, 0.05);
    }

    #[test]
    fn adam_first_step_is_lr_times_sign() {
        let mut opt = DenseOptimizer::new(DenseOptimizerKind::Adam, OptimizerParams::with_lr(0.01), 2);
        let mut p = vec![1.0f32, 1.0];
        opt.apply(&mut p, &[0.5, -2.0]);
        assert!((p[0] - 0.99).abs() < 1e-6 && (p[1] - 1.01).abs() < 1e-6, "{p:?}");
    }

    #[test]
    fn rowwise_adagrad_matches_formula() {
        let hp = OptimizerParams::with_lr(0.1);
        let mut row = vec![1.0f32, 2.0];
        let mut acc = 0.0;
        apply_row(SparseOptimizerKind::RowwiseAdagrad, &hp, &mut row, &[3.0, 4.0], &mut acc);
        assert!((acc - 12.5).abs() < 1e-6);
        let s = 0.1 / (12.5f32.sqrt() + 1e-8);
        assert!((row[0] - (1.0 - s * 3.0)).abs() < 1e-6 && (row[1] - (2.0 - s * 4.0)).abs() < 1e-6);
    }

    #[test]
    fn names_parse_and_errors_name_key() {
        assert_eq!("adam".parse::<DenseOptimizerKind>().unwrap(), DenseOptimizerKind::Adam);
        assert!("lbfgs".parse::<DenseOptimizerKind>().unwrap_err().to_string().contains("optimizer"));
        assert_eq!("rowwise-adagrad".parse::<SparseOptimizerKind>().unwrap(), SparseOptimizerKind::RowwiseAdagrad);
    }
}
