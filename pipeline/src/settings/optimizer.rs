//! Optimizers, learning rates, their schedule and regularisation.

use super::range::ranged;
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
    #[arg(long, value_name = "RATE", value_parser = lr::RANGE)]
    #[serde(deserialize_with = "lr::deserialize")]
    pub lr: Option<f32>,
    /// Embedding learning rate (default per model: dlrm, lr, dien 0.05; fm, deepfm, wdl 0.01).
    #[arg(long, value_name = "RATE", value_parser = sparse_lr::RANGE)]
    #[serde(deserialize_with = "sparse_lr::deserialize")]
    pub sparse_lr: Option<f32>,
    /// Steps of linear learning-rate warm-up (0: none).
    #[arg(long, required = false, value_name = "STEPS", value_parser = lr_warmup::RANGE)]
    #[serde(deserialize_with = "lr_warmup::deserialize")]
    pub lr_warmup: u64,
    /// Learning-rate decay after the warm-up: none, linear or cosine (to 0 at --lr-decay-steps,
    /// by default the run's length when known), step (× --lr-decay-rate every --lr-decay-steps steps).
    #[arg(long, required = false, value_name = "none|linear|cosine|step", value_parser = super::parse::<DecayKind>)]
    pub lr_decay: DecayKind,
    /// linear/cosine: the step at which the rate reaches 0; step: the interval between decays.
    #[arg(long, value_name = "N", value_parser = lr_decay_steps::RANGE)]
    #[serde(deserialize_with = "lr_decay_steps::deserialize")]
    pub lr_decay_steps: Option<u64>,
    /// step decay: the factor of each decay.
    #[arg(long, required = false, value_name = "F", value_parser = lr_decay_rate::RANGE)]
    #[serde(deserialize_with = "lr_decay_rate::deserialize")]
    pub lr_decay_rate: f32,
    /// L2 penalty λ on the dense weights (λ·w added to their gradient).
    #[arg(long, required = false, value_name = "λ", value_parser = l2_dense::RANGE)]
    #[serde(deserialize_with = "l2_dense::deserialize")]
    pub l2_dense: f32,
    /// L2 penalty λ on the embedding rows each step touches.
    #[arg(long, required = false, value_name = "λ", value_parser = l2_embedding::RANGE)]
    #[serde(deserialize_with = "l2_embedding::deserialize")]
    pub l2_embedding: f32,
    /// FTRL's L1 strength (sparse optimizers ftrl, ftrl-adagrad).
    #[arg(long, required = false, value_name = "L1", value_parser = ftrl_l1::RANGE)]
    #[serde(deserialize_with = "ftrl_l1::deserialize")]
    pub ftrl_l1: f32,
    /// FTRL's L2 strength.
    #[arg(long, required = false, value_name = "L2", value_parser = ftrl_l2::RANGE)]
    #[serde(deserialize_with = "ftrl_l2::deserialize")]
    pub ftrl_l2: f32,
    /// FTRL's β.
    #[arg(long, required = false, value_name = "BETA", value_parser = ftrl_beta::RANGE)]
    #[serde(deserialize_with = "ftrl_beta::deserialize")]
    pub ftrl_beta: f32,
}

// The ranges of the numeric settings above, one per setting.
ranged!(lr: f32, above(0.0, 1000.0));
ranged!(sparse_lr: f32, above(0.0, 1000.0));
ranged!(lr_warmup: u64, closed(0, MAX_STEPS));
ranged!(lr_decay_steps: u64, closed(1, MAX_STEPS));
ranged!(lr_decay_rate: f32, above(0.0, 1.0));
ranged!(l2_dense: f32, closed(0.0, 1000.0));
ranged!(l2_embedding: f32, closed(0.0, 1000.0));
ranged!(ftrl_l1: f32, closed(0.0, 1e6));
ranged!(ftrl_l2: f32, closed(0.0, 1e6));
ranged!(ftrl_beta: f32, closed(0.0, 1e6));

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
