//! The interface every model implements, and the configuration that builds one.
//!
//! A model sees each sample as `num_dense` dense values and `num_sparse`
//! pooled embedding vectors of width `embedding_dim()`. Its dense
//! parameters live in one flat buffer (`params`, gradients in `grads`), so
//! the trainer can reduce-scatter, all-gather and checkpoint them without
//! knowing the model. Embedding rows are not part of the model: the trainer
//! owns them sharded across workers and hands the model pooled vectors.
//! Models that read behaviour sequences (DIEN) also get the sequences' rows
//! unpooled, padded to a common length, through the `*_sequences` methods;
//! the other models keep the defaults, which ignore sequences.

use super::deepfm::{Fm, FmConfig};
use super::dien::{Dien, DienConfig};
use super::dlrm::{Dlrm, DlrmConfig};
use super::fm_partial::FmPartial;
use super::precision::Precision;
use super::Scalar;
use crate::OperatorError;
use serde::{Deserialize, Serialize};

/// A trainable CTR model over dense features and pooled embeddings.
pub trait Model<T: Scalar>: Send {
    /// Dense parameters, in a fixed layout.
    fn params(&self) -> &[T];
    /// Mutable dense parameters (for optimizers and all-gathers).
    fn params_mut(&mut self) -> &mut [T];
    /// Gradients of the last `backward`, same layout as `params`.
    fn grads(&self) -> &[T];
    /// Parameters (mutable) and gradients at once, for fused updates.
    fn params_and_grads(&mut self) -> (&mut [T], &[T]);
    /// Mutable gradients (for gradient terms computed outside `backward`, such as DES partial results').
    fn grads_mut(&mut self) -> &mut [T];
    /// Width of each pooled embedding vector the model expects.
    fn embedding_dim(&self) -> usize;
    /// Logits for `dense: [B × num_dense]` and `pooled: [B × num_sparse × embedding_dim]`.
    fn forward(&mut self, dense: &[T], pooled: &[T], batch: usize) -> &[T];
    /// Back-propagates `dlogits` through the last `forward` (same inputs);
    /// fills `grads` and overwrites `dpooled`.
    fn backward(&mut self, dense: &[T], pooled: &[T], dlogits: &[T], dpooled: &mut [T]);
    /// Logits when the samples also carry behaviour sequences (ignored by default).
    fn forward_sequences(&mut self, dense: &[T], pooled: &[T], seq: &SequenceInput<T>, batch: usize) -> &[T] {
        let _ = seq;
        self.forward(dense, pooled, batch)
    }
    /// Backward of [`Model::forward_sequences`]; overwrites `dseq` (`[B × T × width]`).
    fn backward_sequences(
        &mut self,
        dense: &[T],
        pooled: &[T],
        seq: &SequenceInput<T>,
        dlogits: &[T],
        dpooled: &mut [T],
        dseq: &mut [T],
    ) {
        let _ = seq;
        dseq.fill(T::ZERO);
        self.backward(dense, pooled, dlogits, dpooled)
    }
    /// The model's DES partial-result form, when its embeddings can travel as
    /// partial results instead of rows (LR, FM, DeepFM, Wide & Deep).
    fn partial_model(&mut self) -> Option<&mut dyn PartialModel<T>> {
        None
    }
    /// The failure of the model's compute backend since the last call, if any
    /// (a device model's CUDA error; its passes since gave NaN logits and zero
    /// gradients). Host models never fail. The trainer checks after every step.
    fn take_error(&mut self) -> Option<String> {
        None
    }
    /// Runs the products of the model's MLPs in `precision` from the next
    /// `forward` on (see [`Precision`]). The default, for models without an
    /// MLP on the host, keeps `fp32` and refuses `bf16`.
    fn set_precision(&mut self, precision: Precision) -> Result<(), OperatorError> {
        match precision {
            Precision::Fp32 => Ok(()),
            Precision::Bf16 => Err(OperatorError::config(
                "precision",
                "bf16 applies to the products of a model's MLPs on the CPU; this model has none",
            )),
        }
    }
}

/// A model whose logit depends on the embedding rows only through per-sample
/// sums that owners can compute over their own rows (see [`FmPartial`]).
pub trait PartialModel<T: Scalar> {
    /// The partial result's shape.
    fn shape(&self) -> FmPartial;
    /// Logits for `dense: [B × num_dense]` and the summed partial results `partial: [B × width]`.
    fn forward_partial(&mut self, dense: &[T], partial: &[T], batch: usize) -> &[T];
    /// Back-propagates `dlogits` through the last `forward_partial`; fills the
    /// model's `grads` and overwrites `dpartial` (`[B × width]`).
    fn backward_partial(&mut self, dense: &[T], partial: &[T], dlogits: &[T], dpartial: &mut [T]);
}

/// The rows of a batch's sequence fields as a model reads them.
///
/// `rows` is `[B × steps × width]`: at step `t` of sample `b`, the rows of
/// every sequence field side by side (`width = num_sequences · dim`).
/// Positions at or past `lengths[b]` are padding (zeros).
#[derive(Clone, Copy, Debug)]
pub struct SequenceInput<'a, T> {
    /// Padded rows.
    pub rows: &'a [T],
    /// Valid steps per sample.
    pub lengths: &'a [usize],
    /// Padded length `T`.
    pub steps: usize,
}

/// Which model to train, with its shape.
///
/// Serialized with a `kind` tag naming the model: `dlrm`, `dien`, and for the
/// one [`FmConfig`] family `lr`, `fm`, `deepfm` or `wdl` after
/// [`FmConfig::name`]. Any of the four reads back as [`ModelConfig::Fm`] (the
/// shape decides the model), so configurations that wrote `"fm"` for all of
/// them still read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "TaggedModelConfig", into = "TaggedModelConfig")]
pub enum ModelConfig {
    /// DLRM: bottom MLP, dot interaction, top MLP.
    Dlrm(DlrmConfig),
    /// Logistic regression, factorization machine, DeepFM or Wide & Deep (see [`FmConfig`]).
    Fm(FmConfig),
    /// GRU interest extraction and attention over behaviour sequences (see [`DienConfig`]).
    Dien(DienConfig),
}

/// The serialized form of [`ModelConfig`]: one tag per model kind.
#[derive(Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum TaggedModelConfig {
    Dlrm(DlrmConfig),
    Lr(FmConfig),
    Fm(FmConfig),
    DeepFm(FmConfig),
    Wdl(FmConfig),
    Dien(DienConfig),
}

impl From<TaggedModelConfig> for ModelConfig {
    fn from(t: TaggedModelConfig) -> Self {
        match t {
            TaggedModelConfig::Dlrm(c) => ModelConfig::Dlrm(c),
            TaggedModelConfig::Lr(c)
            | TaggedModelConfig::Fm(c)
            | TaggedModelConfig::DeepFm(c)
            | TaggedModelConfig::Wdl(c) => ModelConfig::Fm(c),
            TaggedModelConfig::Dien(c) => ModelConfig::Dien(c),
        }
    }
}

impl From<ModelConfig> for TaggedModelConfig {
    fn from(m: ModelConfig) -> Self {
        match m {
            ModelConfig::Dlrm(c) => TaggedModelConfig::Dlrm(c),
            ModelConfig::Fm(c) => match c.name() {
                "lr" => TaggedModelConfig::Lr(c),
                "fm" => TaggedModelConfig::Fm(c),
                "deepfm" => TaggedModelConfig::DeepFm(c),
                _ => TaggedModelConfig::Wdl(c),
            },
            ModelConfig::Dien(c) => TaggedModelConfig::Dien(c),
        }
    }
}

impl ModelConfig {
    /// Dense features per sample.
    pub fn num_dense(&self) -> usize {
        match self {
            ModelConfig::Dlrm(c) => c.num_dense,
            ModelConfig::Fm(c) => c.num_dense,
            ModelConfig::Dien(c) => c.num_dense,
        }
    }

    /// Sparse fields per sample.
    pub fn num_sparse(&self) -> usize {
        match self {
            ModelConfig::Dlrm(c) => c.num_sparse,
            ModelConfig::Fm(c) => c.num_sparse,
            ModelConfig::Dien(c) => c.num_sparse,
        }
    }

    /// Sequence fields per sample (0 for models without behaviour sequences).
    pub fn num_sequences(&self) -> usize {
        match self {
            ModelConfig::Dien(c) => c.num_sequences,
            _ => 0,
        }
    }

    /// Longest sequence a sample may carry (0 without sequences).
    pub fn max_sequence_len(&self) -> usize {
        match self {
            ModelConfig::Dien(c) => c.max_len,
            _ => 0,
        }
    }

    /// Width of the embedding rows this model reads.
    pub fn embedding_dim(&self) -> usize {
        match self {
            ModelConfig::Dlrm(c) => c.dim,
            ModelConfig::Fm(c) => c.embedding_dim(),
            ModelConfig::Dien(c) => c.dim,
        }
    }

    /// The DES partial-result shape when the model supports that exchange (LR,
    /// FM, DeepFM and Wide & Deep without wide-only crosses), else `None`.
    pub fn partial(&self) -> Option<FmPartial> {
        match self {
            ModelConfig::Fm(c) => c.partial(),
            _ => None,
        }
    }

    /// A short name (`dlrm`, `lr`, `fm`, `deepfm`, `wdl`, `dien`, `dien-sum`).
    pub fn name(&self) -> &'static str {
        match self {
            ModelConfig::Dlrm(_) => "dlrm",
            ModelConfig::Fm(c) => c.name(),
            ModelConfig::Dien(c) => c.name(),
        }
    }

    /// `(input, output)` of every fully connected layer of the model's MLPs, in
    /// order (the shapes of its GEMMs, for [`kernel_choice`](super::kernel_choice)).
    pub fn mlp_layers(&self) -> Vec<(usize, usize)> {
        let chain = |first: usize, rest: &[usize], last: Option<usize>| {
            let widths: Vec<usize> = std::iter::once(first).chain(rest.iter().copied()).chain(last).collect();
            widths.windows(2).map(|w| (w[0], w[1])).collect::<Vec<_>>()
        };
        match self {
            ModelConfig::Dlrm(c) => {
                let interaction = super::interaction::DotInteraction {
                    num_sparse: c.num_sparse,
                    dim: c.dim,
                    self_interaction: c.self_interaction,
                };
                let mut layers = chain(c.num_dense, &c.bottom, None);
                layers.extend(chain(interaction.output_dim(), &c.top, None));
                layers
            }
            ModelConfig::Fm(c) if !c.deep.is_empty() => {
                chain(c.num_dense + (c.num_sparse - c.wide_only.min(c.num_sparse)) * c.dim, &c.deep, Some(1))
            }
            ModelConfig::Fm(_) => Vec::new(),
            ModelConfig::Dien(c) => chain(c.num_dense + c.num_sparse * c.dim + 2 * c.interest_dim(), &c.mlp, Some(1)),
        }
    }

    /// Checks the shape; errors name the offending key.
    pub fn validate(&self) -> Result<(), OperatorError> {
        match self {
            ModelConfig::Dlrm(c) => c.validate(),
            ModelConfig::Fm(c) => c.validate(),
            ModelConfig::Dien(c) => c.validate(),
        }
    }

    /// Builds and initialises the model from `seed`.
    pub fn build<T: Scalar>(&self, seed: u64) -> Result<Box<dyn Model<T>>, OperatorError> {
        Ok(match self {
            ModelConfig::Dlrm(c) => Box::new(Dlrm::<T>::new(c.clone(), seed)?),
            ModelConfig::Fm(c) => Box::new(Fm::<T>::new(c.clone(), seed)?),
            ModelConfig::Dien(c) => Box::new(Dien::<T>::new(c.clone(), seed)?),
        })
    }
}

impl<T: Scalar> Model<T> for Dlrm<T> {
    flat_buffer_accessors!();
    fn embedding_dim(&self) -> usize {
        self.config.dim
    }
    fn forward(&mut self, dense: &[T], pooled: &[T], batch: usize) -> &[T] {
        Dlrm::forward(self, dense, pooled, batch)
    }
    fn backward(&mut self, dense: &[T], pooled: &[T], dlogits: &[T], dpooled: &mut [T]) {
        Dlrm::backward(self, dense, pooled, dlogits, dpooled)
    }
    fn set_precision(&mut self, precision: Precision) -> Result<(), OperatorError> {
        Dlrm::set_precision(self, precision)
    }
}

impl<T: Scalar> Model<T> for Dien<T> {
    flat_buffer_accessors!();
    fn embedding_dim(&self) -> usize {
        self.config.dim
    }
    /// Without sequences every sample has an empty history.
    fn forward(&mut self, dense: &[T], pooled: &[T], batch: usize) -> &[T] {
        let lengths = vec![0; batch];
        Dien::forward(self, dense, pooled, &SequenceInput { rows: &[], lengths: &lengths, steps: 0 }, batch)
    }
    fn backward(&mut self, _dense: &[T], _pooled: &[T], dlogits: &[T], dpooled: &mut [T]) {
        let lengths = vec![0; dlogits.len()];
        Dien::backward(self, &SequenceInput { rows: &[], lengths: &lengths, steps: 0 }, dlogits, dpooled, &mut [])
    }
    fn forward_sequences(&mut self, dense: &[T], pooled: &[T], seq: &SequenceInput<T>, batch: usize) -> &[T] {
        Dien::forward(self, dense, pooled, seq, batch)
    }
    fn backward_sequences(
        &mut self,
        _dense: &[T],
        _pooled: &[T],
        seq: &SequenceInput<T>,
        dlogits: &[T],
        dpooled: &mut [T],
        dseq: &mut [T],
    ) {
        Dien::backward(self, seq, dlogits, dpooled, dseq)
    }
    fn set_precision(&mut self, precision: Precision) -> Result<(), OperatorError> {
        Dien::set_precision(self, precision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind of the FM family is written under its own name and reads back
    /// unchanged; the old form, `"fm"` for all four, still reads.
    #[test]
    fn the_serialized_kind_is_the_model_kind() {
        let base = FmConfig { num_dense: 13, num_sparse: 26, dim: 8, deep: vec![], fm: true, wide_only: 0 };
        for (config, kind) in [
            (FmConfig { dim: 0, ..base.clone() }, "lr"),
            (base.clone(), "fm"),
            (FmConfig { deep: vec![16], ..base.clone() }, "deepfm"),
            (FmConfig { deep: vec![16], fm: false, ..base.clone() }, "wdl"),
        ] {
            let m = ModelConfig::Fm(config);
            let v = serde_json::to_value(&m).unwrap();
            assert_eq!(v["kind"], kind);
            assert_eq!(m.name(), kind);
            assert_eq!(serde_json::from_value::<ModelConfig>(v.clone()).unwrap(), m);
            let mut old = v;
            old["kind"] = "fm".into();
            assert_eq!(serde_json::from_value::<ModelConfig>(old).unwrap(), m);
        }
        let dlrm = ModelConfig::Dlrm(super::super::DlrmConfig::kaggle());
        let v = serde_json::to_value(&dlrm).unwrap();
        assert_eq!(v["kind"], "dlrm");
        assert_eq!(serde_json::from_value::<ModelConfig>(v).unwrap(), dlrm);
    }

    /// The listed layers are the built model's: DLRM Kaggle's seven products, and
    /// their parameters (`in·out + out` each) are every dense parameter of the model.
    #[test]
    fn mlp_layers_are_the_models_gemm_shapes() {
        let config = ModelConfig::Dlrm(DlrmConfig::kaggle());
        let layers = config.mlp_layers();
        assert_eq!(layers, vec![(13, 512), (512, 256), (256, 64), (64, 16), (367, 512), (512, 256), (256, 1)]);
        let model = config.build::<f32>(1).unwrap();
        let listed: usize = layers.iter().map(|&(i, o)| i * o + o).sum();
        assert_eq!(listed, model.params().len());
    }
}
