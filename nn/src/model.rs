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
//! the other models keep the defaults, which ignore sequences. Scoring runs
//! a model's batch-invariant forward ([`Model::set_batch_invariant`]), whose
//! logits do not depend on how samples are batched; training keeps the
//! default forward.

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
    /// From the next forward on, computes each sample's logit as it would be
    /// computed alone (`true`; scoring): in `fp32` it then depends on the
    /// sample's own inputs only, not on the batch it is in or its place there,
    /// so a score is the same at any batch size. `false` (the default) is
    /// training's forward, whose products choose their summation by the
    /// batch's rows; both agree within rounding, and bit for bit on 2 to 256
    /// rows. The default does nothing, for models whose forward computes every
    /// sample on its own already.
    fn set_batch_invariant(&mut self, on: bool) {
        let _ = on;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DienConfig, DlrmConfig, FmConfig, Interest, ModelConfig};
    use tiderec_records::rng::normal_f64;

    /// Samples' inputs: dense values, pooled rows and, per sample, its sequence rows.
    struct Samples<T> {
        dense: Vec<T>,
        pooled: Vec<T>,
        sequences: Vec<Vec<T>>,
        nd: usize,
        pooled_width: usize,
        seq_width: usize,
    }

    impl<T: Scalar> Samples<T> {
        fn new(config: &ModelConfig, embedding_dim: usize, n: usize) -> Self {
            let (nd, pooled_width) = (config.num_dense(), config.num_sparse() * embedding_dim);
            let seq_width = config.num_sequences() * embedding_dim;
            let val = |tag: u64, i: usize| T::from_f64(normal_f64(11, tag, i as u64, 0));
            // Lengths 0 to the longest allowed, so the chunks pad to different lengths.
            let longest = config.max_sequence_len();
            let sequences = (0..n)
                .map(|s| {
                    let len = if longest == 0 { 0 } else { (s * 7 + s / 3) % (longest + 1) };
                    (0..len * seq_width).map(|i| val(3 + s as u64, i)).collect()
                })
                .collect();
            Samples {
                dense: (0..n * nd).map(|i| val(1, i)).collect(),
                pooled: (0..n * pooled_width).map(|i| val(2, i)).collect(),
                sequences,
                nd,
                pooled_width,
                seq_width,
            }
        }

        /// The logits of samples `order`, forwarded `chunk` at a time, each chunk's sequences
        /// padded to its longest (as scoring lays them out).
        fn logits(&self, model: &mut dyn Model<T>, order: &[usize], chunk: usize) -> Vec<T> {
            let mut out = Vec::new();
            for part in order.chunks(chunk) {
                let dense: Vec<T> =
                    part.iter().flat_map(|&s| &self.dense[s * self.nd..(s + 1) * self.nd]).copied().collect();
                let w = self.pooled_width;
                let pooled: Vec<T> = part.iter().flat_map(|&s| &self.pooled[s * w..(s + 1) * w]).copied().collect();
                let lengths: Vec<usize> =
                    part.iter().map(|&s| self.sequences[s].len() / self.seq_width.max(1)).collect();
                let steps = lengths.iter().copied().max().unwrap_or(0);
                let mut rows = vec![T::ZERO; part.len() * steps * self.seq_width];
                for (b, &s) in part.iter().enumerate() {
                    let at = b * steps * self.seq_width;
                    rows[at..at + self.sequences[s].len()].copy_from_slice(&self.sequences[s]);
                }
                let seq = SequenceInput { rows: &rows, lengths: &lengths, steps };
                out.extend_from_slice(model.forward_sequences(&dense, &pooled, &seq, part.len()));
            }
            out
        }
    }

    /// A DLRM whose bottom MLP reads 13 dense features (matrixmultiply's class) and
    /// whose top MLP has a wide layer, LR, FM, DeepFM, Wide & Deep, DIEN and its
    /// sum-pooling form.
    fn configs() -> Vec<ModelConfig> {
        let dlrm = DlrmConfig {
            num_dense: 13,
            num_sparse: 4,
            dim: 8,
            bottom: vec![100, 8],
            top: vec![100, 4, 1],
            self_interaction: false,
        };
        let fm = FmConfig { num_dense: 3, num_sparse: 5, dim: 4, deep: vec![], fm: true, wide_only: 0 };
        let dien = DienConfig {
            num_dense: 2,
            num_sparse: 3,
            dim: 4,
            num_sequences: 2,
            target_fields: vec![1, 2],
            max_len: 6,
            interest: Interest::GruAttention,
            mlp: vec![80, 10],
        };
        vec![
            ModelConfig::Dlrm(dlrm),
            ModelConfig::Fm(FmConfig { dim: 0, ..fm.clone() }),
            ModelConfig::Fm(fm.clone()),
            ModelConfig::Fm(FmConfig { deep: vec![80, 20], ..fm.clone() }),
            ModelConfig::Fm(FmConfig { deep: vec![70], fm: false, ..fm }),
            ModelConfig::Dien(dien.clone()),
            ModelConfig::Dien(DienConfig { interest: Interest::SumPooling, ..dien }),
        ]
    }

    /// Every model's batch-invariant forward gives each sample the same logit, bit
    /// for bit, whether it is forwarded alone, among 7, among 300 (past the 256 rows
    /// where training's forward changes a product's class) or in reverse order; and
    /// that logit is training's forward's within rounding. In `f32` and in `f64`
    /// (no vector packed kernel: training's wide layers run the `gemm` crate past
    /// 256 rows).
    #[test]
    fn batch_invariant_logits_do_not_depend_on_the_batch() {
        for config in configs() {
            batch_invariant_logits::<f32>(&config, 1e-4);
            batch_invariant_logits::<f64>(&config, 1e-10);
        }
    }

    fn batch_invariant_logits<T: Scalar>(config: &ModelConfig, tolerance: f64) {
        let bits = |v: &[T]| v.iter().map(|x| x.to_f64().to_bits()).collect::<Vec<_>>();
        let what = format!("{} in {}", config.name(), std::any::type_name::<T>());
        let n = 300;
        let mut model = config.build::<T>(5).unwrap();
        let samples = Samples::<T>::new(config, model.embedding_dim(), n);
        let order: Vec<usize> = (0..n).collect();
        let training = samples.logits(model.as_mut(), &order, n);
        model.set_batch_invariant(true);
        let all = samples.logits(model.as_mut(), &order, n);
        for chunk in [1, 7] {
            assert_eq!(bits(&samples.logits(model.as_mut(), &order, chunk)), bits(&all), "{what}: chunks of {chunk}");
        }
        let reversed: Vec<usize> = order.iter().rev().copied().collect();
        let mut back = samples.logits(model.as_mut(), &reversed, n);
        back.reverse();
        assert_eq!(bits(&back), bits(&all), "{what}: samples reversed");
        for (k, (t, a)) in training.iter().zip(&all).enumerate() {
            let (t, a) = (t.to_f64(), a.to_f64());
            assert!((t - a).abs() <= tolerance * (1.0 + a.abs()), "{what} sample {k}: training {t}, invariant {a}");
        }
        model.set_batch_invariant(false);
        assert_eq!(
            bits(&samples.logits(model.as_mut(), &order, n)),
            bits(&training),
            "{what}: training's forward again"
        );
    }
}
