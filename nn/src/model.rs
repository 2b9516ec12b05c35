//! The interface every model implements.
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

use super::fm_partial::FmPartial;
use super::precision::Precision;
use super::Scalar;
use tiderec_records::OperatorError;

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
    /// gradients). Host models never fail. The trainer checks right after a step's
    /// passes, so the step's owners learn of it before they update anything.
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
            Precision::Tf32 => precision.check_cpu(),
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
