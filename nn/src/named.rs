//! A model's flat parameter buffer as named tensors, with PyTorch's names and layouts.
//!
//! Every dense parameter of a model lives in one flat buffer (see
//! [`super::model`]); this module says which range of it is which tensor, so
//! an export can write them under names a PyTorch user recognises:
//!
//! | tensor | shape | PyTorch counterpart |
//! |---|---|---|
//! | `<mlp>.<i>.weight` | `[out, in]` | `nn.Linear(in, out).weight` (`y = x·Wᵀ + b`) |
//! | `<mlp>.<i>.bias` | `[out]` | `nn.Linear(in, out).bias` |
//! | `linear.weight` | `[1, num_dense]` | the dense part of LR's `nn.Linear(num_dense, 1)` |
//! | `linear.bias` | `[1]` | its bias (the global bias of LR, FM, DeepFM, W&D) |
//! | `gru.weight_ih_l0` | `[3H, I]` | `nn.GRU(I, H).weight_ih_l0`, rows stacked `r, z, n` |
//! | `gru.weight_hh_l0` | `[3H, H]` | `nn.GRU(I, H).weight_hh_l0`, same gate order |
//! | `gru.bias_ih_l0`, `gru.bias_hh_l0` | `[3H]` | the GRU's biases |
//! | `attention.weight` | `[E, E]` | `W` of the bilinear score `kᵀ·W·q` |
//!
//! `<i>` counts the linear layers of one MLP from 0 (a ReLU follows each but,
//! for the top/deep MLPs, the last). Invariant (tested for every model kind):
//! the tensors of [`ModelConfig::param_tensors`](crate::ModelConfig::param_tensors) tile the flat buffer exactly,
//! in order, with no gap and no overlap, and they are computed from the same
//! layer structures the models build, so they cannot drift apart.

use super::mlp::Mlp;

/// One tensor inside a model's flat parameter buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamTensor {
    /// PyTorch-style name (`bottom.0.weight`, `gru.weight_ih_l0`, …).
    pub name: String,
    /// Row-major shape.
    pub shape: Vec<usize>,
    /// Where its first value sits in the flat buffer.
    pub offset: usize,
}

impl ParamTensor {
    /// Number of values.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its range in the flat buffer.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// `<prefix>.<i>.weight` (`[out, in]`) and `<prefix>.<i>.bias` (`[out]`) of every layer of `mlp`.
pub fn mlp_tensors(prefix: &str, mlp: &Mlp) -> Vec<ParamTensor> {
    let mut out = Vec::with_capacity(2 * mlp.layers.len());
    for (i, l) in mlp.layers.iter().enumerate() {
        out.push(ParamTensor {
            name: format!("{prefix}.{i}.weight"),
            shape: vec![l.output, l.input],
            offset: l.offset,
        });
        out.push(ParamTensor {
            name: format!("{prefix}.{i}.bias"),
            shape: vec![l.output],
            offset: l.offset + l.output * l.input,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::{DienConfig, DlrmConfig, FmConfig, Interest, ModelConfig};

    fn configs() -> Vec<ModelConfig> {
        let fm = |dim, deep: Vec<usize>, fm, wide_only| {
            ModelConfig::Fm(FmConfig { num_dense: 13, num_sparse: 26, dim, deep, fm, wide_only })
        };
        let dien = |interest| {
            ModelConfig::Dien(DienConfig {
                num_dense: 2,
                num_sparse: 3,
                dim: 4,
                num_sequences: 2,
                target_fields: vec![0, 2],
                max_len: 5,
                interest,
                mlp: vec![7, 3],
            })
        };
        vec![
            ModelConfig::Dlrm(DlrmConfig::kaggle()),
            ModelConfig::Dlrm(DlrmConfig { self_interaction: true, ..DlrmConfig::kaggle() }),
            fm(0, vec![], true, 0),
            fm(8, vec![], true, 0),
            fm(8, vec![16, 4], true, 0),
            fm(8, vec![16, 4], false, 0),
            fm(8, vec![16], false, 2),
            ModelConfig::Fm(FmConfig { num_dense: 0, num_sparse: 3, dim: 2, deep: vec![], fm: true, wide_only: 0 }),
            dien(Interest::GruAttention),
            dien(Interest::SumPooling),
        ]
    }

    /// The named tensors tile the flat buffer of the built model exactly, in order.
    #[test]
    fn tensors_tile_the_flat_buffer_of_every_model_kind() {
        for config in configs() {
            let n = config.build::<f32>(1).unwrap().params().len();
            let tensors = config.param_tensors();
            let mut at = 0;
            for t in &tensors {
                assert_eq!(t.offset, at, "{}: {} starts at {} not {at}", config.name(), t.name, t.offset);
                assert!(!t.is_empty(), "{}: {} is empty", config.name(), t.name);
                at = t.range().end;
            }
            assert_eq!(at, n, "{}: tensors cover {at} of {n} parameters", config.name());
            let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), tensors.len(), "{}: duplicate names", config.name());
        }
    }

    /// Shapes are PyTorch's: `bottom.0.weight` is `[out, in]`, the GRU's weights `[3H, I]`.
    #[test]
    fn shapes_follow_pytorch() {
        let t = ModelConfig::Dlrm(DlrmConfig::kaggle()).param_tensors();
        assert_eq!((t[0].name.as_str(), t[0].shape.as_slice()), ("bottom.0.weight", &[512, 13][..]));
        assert_eq!((t[1].name.as_str(), t[1].shape.as_slice()), ("bottom.0.bias", &[512][..]));
        let top = t.iter().find(|t| t.name == "top.0.weight").unwrap();
        assert_eq!(top.shape, [512, 16 + 26 * 27 / 2]);
        let dien = &configs()[8];
        let t = dien.param_tensors();
        let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            &names[..5],
            ["gru.weight_ih_l0", "gru.weight_hh_l0", "gru.bias_ih_l0", "gru.bias_hh_l0", "attention.weight"]
        );
        assert_eq!(t[0].shape, [24, 8]);
        assert_eq!(t[4].shape, [8, 8]);
        assert_eq!(t[5].shape, [7, 2 + 3 * 4 + 2 * 8]);
        let lr = configs()[2].param_tensors();
        let names: Vec<&str> = lr.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["linear.bias", "linear.weight"]);
        assert_eq!(lr[1].shape, [1, 13]);
    }
}
