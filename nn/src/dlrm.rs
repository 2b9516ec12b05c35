//! DLRM: bottom MLP over dense features, sum-pooled embedding bags, pairwise
//! dot interaction, top MLP producing one logit.
//!
//! The model holds only the dense part (both MLPs) in its flat parameter
//! buffer; embedding rows are sharded across workers and reach the model as
//! pooled vectors `[B × num_sparse × dim]`. `backward` returns the gradient
//! with respect to those pooled vectors, which the caller scatters back to rows.

use super::interaction::DotInteraction;
use super::mlp::{Mlp, MlpCache};
use super::model::Model;
use super::named::{mlp_tensors, ParamTensor};
use super::precision::Precision;
use super::Scalar;
use serde::{Deserialize, Serialize};
use tiderec_records::OperatorError;

/// Shape of a DLRM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DlrmConfig {
    /// Dense features per sample.
    pub num_dense: usize,
    /// Sparse fields (embedding tables) per sample.
    pub num_sparse: usize,
    /// Embedding dimension.
    pub dim: usize,
    /// Bottom MLP widths after the input (the last must equal `dim`).
    pub bottom: Vec<usize>,
    /// Top MLP widths after the interaction (the last must be 1).
    pub top: Vec<usize>,
    /// Include `⟨vᵢ, vᵢ⟩` in the interaction.
    pub self_interaction: bool,
}

impl DlrmConfig {
    /// The reference DLRM Kaggle shape: dim 16, bottom 13-512-256-64-16, top 512-256-1.
    pub fn kaggle() -> Self {
        DlrmConfig {
            num_dense: 13,
            num_sparse: 26,
            dim: 16,
            bottom: vec![512, 256, 64, 16],
            top: vec![512, 256, 1],
            self_interaction: false,
        }
    }

    /// Checks the shape; errors name the offending key.
    pub fn validate(&self) -> Result<(), OperatorError> {
        if self.dim == 0 {
            return Err(OperatorError::config("model.dim", "must be positive"));
        }
        if self.num_dense == 0 {
            return Err(OperatorError::config("model.num_dense", "DLRM needs at least one dense feature"));
        }
        match self.bottom.last() {
            Some(&w) if w == self.dim => {}
            _ => {
                return Err(OperatorError::config(
                    "model.bottom",
                    format!("the last bottom-MLP width must equal the embedding dim {}", self.dim),
                ))
            }
        }
        if self.top.last() != Some(&1) {
            return Err(OperatorError::config("model.top", "the last top-MLP width must be 1"));
        }
        if self.bottom.iter().chain(&self.top).any(|&w| w == 0) {
            return Err(OperatorError::config("model.bottom/top", "layer widths must be positive"));
        }
        Ok(())
    }
}

/// The layers of a DLRM of this shape at their places in the flat buffer:
/// the bottom MLP (ReLU after every layer), the interaction, the top MLP.
fn layers(config: &DlrmConfig) -> (Mlp, DotInteraction, Mlp) {
    let mut widths = vec![config.num_dense];
    widths.extend(&config.bottom);
    let bottom = Mlp::new(&widths, 0, true);
    let interaction =
        DotInteraction { num_sparse: config.num_sparse, dim: config.dim, self_interaction: config.self_interaction };
    let mut widths = vec![interaction.output_dim()];
    widths.extend(&config.top);
    let top = Mlp::new(&widths, bottom.num_params(), false);
    (bottom, interaction, top)
}

/// The named tensors of a DLRM's flat buffer: `bottom.<i>.*`, then `top.<i>.*`.
pub fn param_tensors(config: &DlrmConfig) -> Vec<ParamTensor> {
    let (bottom, _, top) = layers(config);
    [mlp_tensors("bottom", &bottom), mlp_tensors("top", &top)].concat()
}

/// Forward/backward workspace of a [`Dlrm`].
#[derive(Clone, Debug, Default)]
struct Workspace<T> {
    bottom: MlpCache<T>,
    top: MlpCache<T>,
    bottom_out: Vec<T>,
    inter_out: Vec<T>,
    logits: Vec<T>,
    d_inter: Vec<T>,
    d_bottom: Vec<T>,
}

/// The dense part of DLRM with its flat parameter and gradient buffers.
#[derive(Clone, Debug)]
pub struct Dlrm<T> {
    /// The shape.
    pub config: DlrmConfig,
    bottom: Mlp,
    interaction: DotInteraction,
    top: Mlp,
    /// All dense parameters, bottom MLP first.
    pub params: Vec<T>,
    /// Gradients of the last `backward`, same layout as `params`.
    pub grads: Vec<T>,
    ws: Workspace<T>,
    batch: usize,
}

impl<T: Scalar> Dlrm<T> {
    /// Builds and initialises a DLRM from `seed`.
    pub fn new(config: DlrmConfig, seed: u64) -> Result<Self, OperatorError> {
        config.validate()?;
        let (bottom, interaction, top) = layers(&config);
        let n = bottom.num_params() + top.num_params();
        let mut params = vec![T::ZERO; n];
        bottom.init(&mut params, seed, 1);
        top.init(&mut params, seed, 2);
        Ok(Dlrm {
            config,
            bottom,
            interaction,
            top,
            grads: vec![T::ZERO; n],
            params,
            ws: Workspace::default(),
            batch: 0,
        })
    }

    /// Number of dense parameters.
    pub fn num_params(&self) -> usize {
        self.params.len()
    }

    /// Runs both MLPs' products in `precision` (see [`MlpCache::set_precision`]).
    pub fn set_precision(&mut self, precision: super::Precision) -> Result<(), OperatorError> {
        self.ws.bottom.set_precision(precision)?;
        self.ws.top.set_precision(precision)
    }

    /// Logits for `dense: [B × num_dense]` and `pooled: [B × num_sparse × dim]`.
    pub fn forward(&mut self, dense: &[T], pooled: &[T], batch: usize) -> &[T] {
        self.batch = batch;
        let ws = &mut self.ws;
        let b_out = self.bottom.forward(&self.params, dense, batch, &mut ws.bottom);
        ws.bottom_out.clear();
        ws.bottom_out.extend_from_slice(b_out);
        ws.inter_out.resize(batch * self.interaction.output_dim(), T::ZERO);
        self.interaction.forward(&ws.bottom_out, pooled, batch, &mut ws.inter_out);
        let logits = self.top.forward(&self.params, &ws.inter_out, batch, &mut ws.top);
        ws.logits.clear();
        ws.logits.extend_from_slice(logits);
        &ws.logits
    }

    /// Back-propagates `dlogits` through the last `forward` (same `dense`
    /// and `pooled`); fills `self.grads` and writes `dpooled`.
    pub fn backward(&mut self, dense: &[T], pooled: &[T], dlogits: &[T], dpooled: &mut [T]) {
        let batch = self.batch;
        let ws = &mut self.ws;
        ws.d_inter.resize(batch * self.interaction.output_dim(), T::ZERO);
        self.top.backward(
            &self.params,
            &ws.inter_out,
            batch,
            &mut ws.top,
            dlogits,
            &mut self.grads,
            Some(&mut ws.d_inter),
        );
        ws.d_bottom.resize(batch * self.config.dim, T::ZERO);
        self.interaction.backward(&ws.bottom_out, pooled, &ws.d_inter, batch, &mut ws.d_bottom, dpooled);
        self.bottom.backward(&self.params, dense, batch, &mut ws.bottom, &ws.d_bottom, &mut self.grads, None);
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
    /// Both MLPs' products (the interaction computes each sample on its own).
    fn set_batch_invariant(&mut self, on: bool) {
        self.ws.bottom.set_batch_invariant(on);
        self.ws.top.set_batch_invariant(on);
    }
    fn set_precision(&mut self, precision: Precision) -> Result<(), OperatorError> {
        Dlrm::set_precision(self, precision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedding_bag::{pool_sum, pool_sum_backward};
    use crate::gradcheck::check_gradients;
    use crate::loss::{bce_with_logits_grad, bce_with_logits_sum};
    use tiderec_records::rng::normal_f64;

    fn tiny() -> DlrmConfig {
        DlrmConfig { num_dense: 3, num_sparse: 2, dim: 4, bottom: vec![5, 4], top: vec![6, 1], self_interaction: false }
    }

    #[test]
    fn validation_names_the_key() {
        let mut c = tiny();
        c.bottom = vec![5, 3];
        let e = Dlrm::<f32>::new(c, 0).unwrap_err().to_string();
        assert!(e.contains("model.bottom"), "{e}");
        let mut c = tiny();
        c.top = vec![6, 2];
        assert!(Dlrm::<f32>::new(c, 0).unwrap_err().to_string().contains("model.top"));
    }

    /// End to end: dense params and embedding rows against finite differences of the BCE loss.
    #[test]
    fn dlrm_end_to_end_gradients_match_finite_differences() {
        for self_interaction in [false, true] {
            let cfg = DlrmConfig { self_interaction, ..tiny() };
            let mut model = Dlrm::<f64>::new(cfg.clone(), 3).unwrap();
            let batch = 3;
            let dense: Vec<f64> = (0..batch * 3).map(|i| normal_f64(4, 0, i as u64, 0).abs()).collect();
            let labels = [1.0f32, 0.0, 1.0];
            // field 0: bags {0}, {1, 0}, {} ; field 1: bags {2}, {2}, {3}
            let offsets = [vec![0u32, 1, 3, 3], vec![0u32, 1, 2, 3]];
            let index = [vec![0u32, 1, 0], vec![2u32, 2, 3]];
            let dim = 4;
            let rows: Vec<f64> = (0..4 * dim).map(|i| normal_f64(5, 0, i as u64, 0) * 0.5).collect();
            let pool = |rows: &[f64]| {
                let mut pooled = vec![0.0; batch * 2 * dim];
                for f in 0..2 {
                    pool_sum(rows, dim, &offsets[f], &index[f], None, f, 2, &mut pooled);
                }
                pooled
            };
            let loss = |m: &mut Dlrm<f64>, rows: &[f64]| {
                let pooled = pool(rows);
                let logits = m.forward(&dense, &pooled, batch).to_vec();
                bce_with_logits_sum(&logits, &labels)
            };
            let pooled = pool(&rows);
            let logits = model.forward(&dense, &pooled, batch).to_vec();
            let mut dlogits = vec![0.0; batch];
            bce_with_logits_grad(&logits, &labels, 1.0, &mut dlogits);
            let mut dpooled = vec![0.0; pooled.len()];
            model.backward(&dense, &pooled, &dlogits, &mut dpooled);
            let mut drows = vec![0.0; rows.len()];
            for f in 0..2 {
                pool_sum_backward(&dpooled, dim, &offsets[f], &index[f], None, f, 2, &mut drows);
            }
            let grads = model.grads.clone();
            let params = model.params.clone();
            let mut probe = model.clone();
            check_gradients(&params, &grads, |p| {
                probe.params.copy_from_slice(p);
                loss(&mut probe, &rows)
            });
            let mut probe = model.clone();
            check_gradients(&rows, &drows, |r| loss(&mut probe, r));
        }
    }

    #[test]
    fn kaggle_shape_param_count() {
        let m = Dlrm::<f32>::new(DlrmConfig::kaggle(), 0).unwrap();
        // bottom 13-512-256-64-16, top 367-512-256-1
        let bottom = 13 * 512 + 512 + 512 * 256 + 256 + 256 * 64 + 64 + 64 * 16 + 16;
        let top = 367 * 512 + 512 + 512 * 256 + 256 + 256 + 1;
        assert_eq!(m.num_params(), bottom + top);
    }

    /// Under bf16 a DLRM tracks fp32 within bf16's precision (8 significant
    /// bits: about 2⁻⁹ relative error per rounded operand, a few layers deep):
    /// the logits, and the gradients of a bf16 backward through fp32's
    /// activations, differ from fp32's by under 2⁻⁶ in relative L2 norm (about
    /// 2⁻⁸ measured) without being equal (the bf16 products run). With its own
    /// forward, a ReLU whose input is within rounding of zero can switch, and
    /// the gradients differ by more (about 15% here, on random `dlogits` whose
    /// sums over the batch cancel), which is why training is judged by AUC
    /// (`pipeline/tests/precision.rs`). An `f64` model refuses bf16, and so
    /// does a CPU without AVX-512 BF16.
    #[test]
    fn bf16_tracks_fp32() {
        use crate::Precision;
        let cfg = DlrmConfig {
            num_dense: 13,
            num_sparse: 4,
            dim: 16,
            bottom: vec![64, 16],
            top: vec![64, 32, 1],
            self_interaction: false,
        };
        let mut fp32 = Dlrm::<f32>::new(cfg.clone(), 5).unwrap();
        let mut bf16 = fp32.clone();
        if let Err(e) = bf16.set_precision(Precision::Bf16) {
            assert!(!crate::bf16_pack::bf16_vector_available(), "{e}");
            assert!(e.to_string().contains("AVX-512 BF16"), "{e}");
            eprintln!("this CPU has no AVX-512 BF16: bf16 is refused ({e})");
            return;
        }
        let e = Dlrm::<f64>::new(cfg.clone(), 5).unwrap().set_precision(Precision::Bf16).unwrap_err();
        assert!(e.to_string().contains("f32 models only"), "{e}");
        let batch = 48;
        let dense: Vec<f32> = (0..batch * 13).map(|i| normal_f64(6, 0, i as u64, 0).abs() as f32).collect();
        let pooled: Vec<f32> = (0..batch * 4 * 16).map(|i| normal_f64(7, 0, i as u64, 0) as f32 * 0.5).collect();
        let dlogits: Vec<f32> = (0..batch).map(|i| normal_f64(8, 0, i as u64, 0) as f32).collect();
        let rel = |a: &[f32], b: &[f32]| {
            let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
            (d / n).sqrt()
        };
        let backward = |m: &mut Dlrm<f32>| {
            let mut dpooled = vec![0.0; pooled.len()];
            m.backward(&dense, &pooled, &dlogits, &mut dpooled);
            (m.grads.clone(), dpooled)
        };
        let l32 = fp32.forward(&dense, &pooled, batch).to_vec();
        let (g32, dp32) = backward(&mut fp32);
        let l16 = bf16.forward(&dense, &pooled, batch).to_vec();
        let (g16, dp16) = backward(&mut bf16);
        // A bf16 backward through fp32's forward: the same ReLU patterns.
        let mut mixed = Dlrm::<f32>::new(cfg, 5).unwrap();
        mixed.forward(&dense, &pooled, batch);
        mixed.set_precision(Precision::Bf16).unwrap();
        let (gm, dpm) = backward(&mut mixed);
        let (logits, grads, dpooled) = (rel(&l16, &l32), rel(&gm, &g32), rel(&dpm, &dp32));
        let (own_grads, own_dpooled) = (rel(&g16, &g32), rel(&dp16, &dp32));
        eprintln!(
            "relative L2 differences from fp32: logits {logits:e}; through fp32's activations: gradients \
             {grads:e}, pooled gradients {dpooled:e}; through bf16's own: {own_grads:e}, {own_dpooled:e}"
        );
        assert!(l16 != l32 && gm != g32, "the bf16 products ran");
        assert!(logits < 2f64.powi(-6), "logits {logits:e}");
        assert!(grads < 2f64.powi(-6), "gradients {grads:e}");
        assert!(dpooled < 2f64.powi(-6), "pooled gradients {dpooled:e}");
        assert!(own_grads < 0.5 && own_dpooled < 0.5, "bf16's own backward: {own_grads:e}, {own_dpooled:e}");
    }
}
