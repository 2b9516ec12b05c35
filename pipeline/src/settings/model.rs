//! The model and its shape.

use super::range::ranged;
use clap::Args;
use serde::{Deserialize, Serialize};
use tiderec_operators::nn::Precision;

/// Which model is trained and the widths of its parts.
#[derive(Clone, Debug, PartialEq, Args, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelSettings {
    /// Model: dlrm, lr, fm, deepfm, wdl (Wide & Deep),
    /// dien (GRU + attention over behaviour histories) or dien-sum (its sum-pooling baseline).
    #[arg(long = "model", id = "model", required = false, value_name = "dlrm|lr|fm|deepfm|wdl|dien|dien-sum", value_parser = super::parse::<ModelKind>)]
    #[serde(rename = "model")]
    pub kind: ModelKind,
    /// Embedding dimension (DLRM) or factor width (FM, DeepFM).
    #[arg(long, required = false, value_name = "N", value_parser = dim::RANGE)]
    #[serde(deserialize_with = "dim::deserialize")]
    pub dim: usize,
    /// Bottom MLP widths after the dense inputs (DLRM; the last equals --dim).
    #[arg(long, value_delimiter = ',', value_name = "N,N,…", value_parser = bottom::RANGE)]
    #[serde(deserialize_with = "bottom::deserialize")]
    pub bottom: Vec<usize>,
    /// Top MLP widths after the interaction (DLRM; the last is 1).
    #[arg(long, value_delimiter = ',', value_name = "N,N,…", value_parser = top::RANGE)]
    #[serde(deserialize_with = "top::deserialize")]
    pub top: Vec<usize>,
    /// Include self-interaction terms in the dot interaction (DLRM).
    #[arg(long, required = false, num_args = 0..=1, default_missing_value = "true", require_equals = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub self_interaction: bool,
    /// Hidden widths of the DeepFM / Wide & Deep deep part.
    #[arg(long, value_delimiter = ',', value_name = "N,N,…", value_parser = deep::RANGE)]
    #[serde(deserialize_with = "deep::deserialize")]
    pub deep: Vec<usize>,
    /// Hidden widths of DIEN's MLP.
    #[arg(long, value_delimiter = ',', value_name = "N,N,…", value_parser = mlp::RANGE)]
    #[serde(deserialize_with = "mlp::deserialize")]
    pub mlp: Vec<usize>,
    /// Feature crosses for the wide part of wdl / lr: sparse-field index pairs, e.g. 0:1,2:5.
    #[arg(long, value_delimiter = ',', value_name = "A:B,…")]
    pub crosses: Vec<String>,
    /// Precision of the MLPs' products: fp32, or bf16 (bf16 operands, fp32 accumulation and fp32
    /// master weights; on a CPU worker it needs AVX-512 BF16), or tf32 (GPU workers only). On a GPU
    /// worker bf16 and tf32 apply to every GEMM, on tensor cores.
    #[arg(long, required = false, value_name = "fp32|bf16|tf32", value_parser = super::parse::<Precision>)]
    pub precision: Precision,
}

// The ranges of the numeric settings above, one per setting.
ranged!(dim: usize, closed(1, MAX_WIDTH));
ranged!(bottom: usize, closed(1, MAX_WIDTH));
ranged!(top: usize, closed(1, MAX_WIDTH));
ranged!(deep: usize, closed(1, MAX_WIDTH));
ranged!(mlp: usize, closed(1, MAX_WIDTH));

impl Default for ModelSettings {
    fn default() -> Self {
        ModelSettings {
            kind: ModelKind::Dlrm,
            dim: 16,
            bottom: vec![512, 256, 64, 16],
            top: vec![512, 256, 1],
            self_interaction: false,
            deep: vec![400, 400, 400],
            mlp: vec![200, 80],
            crosses: Vec::new(),
            precision: Precision::Fp32,
        }
    }
}

super::named::named_setting! {
    /// The models `--model` names. Every match on a model's name goes through this
    /// enum: [`ModelKind::name`] is the one spelling of each (in flags, TOML files,
    /// checkpoints' settings and messages).
    pub enum ModelKind for "model" {
        /// DLRM: bottom MLP, dot interaction, top MLP.
        Dlrm = "dlrm",
        /// Logistic regression.
        Lr = "lr",
        /// Factorization machine.
        Fm = "fm",
        /// DeepFM: FM and a deep MLP over the same embeddings.
        DeepFm = "deepfm",
        /// Wide & Deep: a linear part and a deep MLP.
        Wdl = "wdl",
        /// DIEN-like: GRU interest extraction and attention over behaviour histories.
        Dien = "dien",
        /// DIEN's sum-pooling baseline (no GRU, no attention).
        DienSum = "dien-sum",
    }
}

impl ModelKind {
    /// DIEN or its sum-pooling baseline: the models that read behaviour sequences.
    pub fn is_dien(self) -> bool {
        matches!(self, ModelKind::Dien | ModelKind::DienSum)
    }

    /// DeepFM or Wide & Deep: the FM family with a deep MLP.
    pub fn has_deep_part(self) -> bool {
        matches!(self, ModelKind::DeepFm | ModelKind::Wdl)
    }
}
