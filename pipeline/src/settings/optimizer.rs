//! Optimizers, learning rates, their schedule and regularisation.

use clap::Args;
use serde::{Deserialize, Serialize};
use tiderec_operators::optim::{DenseOptimizerKind, SparseOptimizerKind};

/// How the dense weights and the embedding rows are updated.
#[derive(Clone, Debug, PartialEq, Args, Serialize, Deserialize)]
#[serde(default)]
pub struct OptimizerSettings {
    /// Dense optimizer: sgd, adagrad, adam.
    #[arg(long = "optimizer", id = "optimizer", required = false, value_name = "sgd|adagrad|adam", value_parser = super::parse::<DenseOptimizerKind>)]
    #[serde(rename = "optimizer")]
    pub dense: DenseOptimizerKind,
    /// Embedding optimizer: sgd, rowwise-adagrad, lazy-adam, ftrl, ftrl-adagrad.
    #[arg(long = "sparse-optimizer", id = "sparse_optimizer", required = false, value_name = "OPTIMIZER", value_parser = super::parse::<SparseOptimizerKind>)]
    #[serde(rename = "sparse_optimizer")]
    pub sparse: SparseOptimizerKind,
    /// Dense learning rate (default per model: dlrm, deepfm, wdl, dien 0.001; lr, fm 0.01).
    #[arg(long, value_name = "RATE")]
    pub lr: Option<f32>,
    /// Embedding learning rate (default per model: dlrm, lr, dien 0.05; fm, deepfm, wdl 0.01).
    #[arg(long, value_name = "RATE")]
    pub sparse_lr: Option<f32>,
    /// Steps of linear learning-rate warm-up (0: none).
    #[arg(long, required = false, value_name = "STEPS")]
    pub lr_warmup: u64,
    /// Learning-rate decay after the warm-up: none, linear or cosine (to 0 at --lr-decay-steps,
    /// by default the run's length when known), step (× --lr-decay-rate every --lr-decay-steps steps).
    #[arg(long, required = false, value_name = "none|linear|cosine|step", value_parser = super::parse::<DecayKind>)]
    pub lr_decay: DecayKind,
    /// linear/cosine: the step at which the rate reaches 0; step: the interval between decays.
    #[arg(long, value_name = "N")]
    pub lr_decay_steps: Option<u64>,
    /// step decay: the factor of each decay.
    #[arg(long, required = false, value_name = "F")]
    pub lr_decay_rate: f32,
    /// L2 penalty λ on the dense weights (λ·w added to their gradient).
    #[arg(long, required = false, value_name = "λ")]
    pub l2_dense: f32,
    /// L2 penalty λ on the embedding rows each step touches.
    #[arg(long, required = false, value_name = "λ")]
    pub l2_embedding: f32,
    /// FTRL's L1 strength (sparse optimizers ftrl, ftrl-adagrad).
    #[arg(long, required = false, value_name = "L1")]
    pub ftrl_l1: f32,
    /// FTRL's L2 strength.
    #[arg(long, required = false, value_name = "L2")]
    pub ftrl_l2: f32,
    /// FTRL's β.
    #[arg(long, required = false, value_name = "BETA")]
    pub ftrl_beta: f32,
}

impl Default for OptimizerSettings {
    fn default() -> Self {
        OptimizerSettings {
            dense: DenseOptimizerKind::Adam,
            sparse: SparseOptimizerKind::RowwiseAdagrad,
            lr: None,
            sparse_lr: None,
            lr_warmup: 0,
            lr_decay: DecayKind::None,
            lr_decay_steps: None,
            lr_decay_rate: 0.5,
            l2_dense: 0.0,
            l2_embedding: 0.0,
            ftrl_l1: 0.0,
            ftrl_l2: 0.0,
            ftrl_beta: 1.0,
        }
    }
}

super::named::named_setting! {
    /// The shape of the learning-rate decay after the warm-up (`lr_decay`); its
    /// horizon, interval and rate are separate settings.
    pub enum DecayKind for "lr_decay" {
        /// Constant.
        None = "none",
        /// Linearly to 0 at `lr_decay_steps` (by default the run's length).
        Linear = "linear",
        /// Half a cosine to 0 at `lr_decay_steps` (by default the run's length).
        Cosine = "cosine",
        /// Times `lr_decay_rate` every `lr_decay_steps` steps.
        Step = "step",
    }
}
