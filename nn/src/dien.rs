//! A DIEN-like model: interest extraction over a behaviour sequence with a
//! GRU, attention pooling against the target, and an MLP on top.
//!
//! Each sample brings `num_sequences` behaviour sequences (e.g. the items and
//! the categories a user interacted with, oldest first) as embedding rows,
//! and the same number of *target* fields among its sparse fields (the
//! candidate item and its category). Step `t` of the sequence is the
//! concatenation of the rows of every sequence field, width `E = S·dim`;
//! the target is the concatenation of the target fields' pooled rows, also
//! of width `E`. Per sample:
//!
//! ```text
//! h_1 … h_L = GRU(x_1 … x_L)                    (hidden width E, split cell)
//! k_t       = h_t + x_t                         (interest state, residual to the behaviour)
//! u         = Σ_t softmax_t(k_tᵀ W q) · k_t     (attention with the target q)
//! logit     = MLP([dense, pooled fields, u, u ⊙ q])
//! ```
//!
//! The residual path keeps the behaviour itself visible to the attention (a
//! repeated item still matches its target exactly) while the GRU adds what
//! came before it. With [`Interest::SumPooling`] the GRU and the attention
//! are replaced by `u = Σ_t x_t`: the baseline the GRU + attention variant
//! must beat.
//!
//! Parameters in the flat buffer: GRU, then attention `W`, then the MLP. A
//! sequence longer than `max_len` is not accepted (sources keep the most
//! recent `max_len` events); positions past a sample's length are padding
//! and get no weight and no gradient.

use super::attention::{AttentionCache, AttentionPooling};
use super::gru::{Gru, GruCache};
use super::mlp::{Mlp, MlpCache};
use super::model::{Model, SequenceInput};
use super::named::{mlp_tensors, ParamTensor};
use super::precision::Precision;
use super::Scalar;
use serde::{Deserialize, Serialize};
use tiderec_records::OperatorError;

/// How the behaviour sequence becomes one interest vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Interest {
    /// GRU interest extraction, then attention pooling against the target (DIEN-like).
    GruAttention,
    /// Sum of the sequence's rows (the baseline).
    SumPooling,
}

/// Shape of a DIEN-like model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DienConfig {
    /// Dense features per sample.
    pub num_dense: usize,
    /// Sparse fields per sample (the targets among them).
    pub num_sparse: usize,
    /// Embedding dimension.
    pub dim: usize,
    /// Sequence fields per sample.
    pub num_sequences: usize,
    /// For each sequence field, the sparse field holding its target (e.g. target item, target category).
    pub target_fields: Vec<usize>,
    /// Longest sequence a sample may carry.
    pub max_len: usize,
    /// GRU + attention, or sum pooling.
    pub interest: Interest,
    /// Hidden widths of the MLP; the output layer (1) is added.
    pub mlp: Vec<usize>,
}

impl DienConfig {
    /// Width `E` of one sequence step and of the interest vector.
    pub fn interest_dim(&self) -> usize {
        self.num_sequences * self.dim
    }

    /// Checks the shape; errors name the offending key.
    pub fn validate(&self) -> Result<(), OperatorError> {
        if self.dim == 0 {
            return Err(OperatorError::config("model.dim", "must be positive"));
        }
        if self.num_sequences == 0 {
            return Err(OperatorError::config("model.num_sequences", "DIEN needs at least one sequence field"));
        }
        if self.target_fields.len() != self.num_sequences {
            return Err(OperatorError::config(
                "model.target_fields",
                format!("{} target fields for {} sequence fields", self.target_fields.len(), self.num_sequences),
            ));
        }
        if let Some(&f) = self.target_fields.iter().find(|&&f| f >= self.num_sparse) {
            return Err(OperatorError::config(
                "model.target_fields",
                format!("field {f} does not exist ({} sparse fields)", self.num_sparse),
            ));
        }
        if self.max_len == 0 {
            return Err(OperatorError::config("model.max_len", "must be positive"));
        }
        if self.mlp.contains(&0) {
            return Err(OperatorError::config("model.mlp", "layer widths must be positive"));
        }
        Ok(())
    }

    /// `dien`, or `dien-sum` for the sum-pooling baseline.
    pub fn name(&self) -> &'static str {
        match self.interest {
            Interest::GruAttention => "dien",
            Interest::SumPooling => "dien-sum",
        }
    }
}

/// The layers of this shape at their places in the flat buffer: the GRU and
/// the attention (both of zero size with sum pooling), then the MLP.
fn layers(config: &DienConfig) -> (Gru, AttentionPooling, Mlp) {
    let e = config.interest_dim();
    let with_gru = config.interest == Interest::GruAttention;
    let gru = Gru { input: e, hidden: e, offset: 0 };
    let gru_params = if with_gru { gru.num_params() } else { 0 };
    let attention = AttentionPooling { dim: e, offset: gru_params };
    let att_params = if with_gru { attention.num_params() } else { 0 };
    let mut widths = vec![config.num_dense + config.num_sparse * config.dim + 2 * e];
    widths.extend(&config.mlp);
    widths.push(1);
    let mlp = Mlp::new(&widths, gru_params + att_params, false);
    (gru, attention, mlp)
}

/// The named tensors of the flat buffer: with the GRU, `gru.weight_ih_l0`
/// (`[3E, E]`), `gru.weight_hh_l0` (`[3E, E]`), `gru.bias_ih_l0`,
/// `gru.bias_hh_l0` (`[3E]`, gate rows `r, z, n` as in `torch.nn.GRU`) and
/// `attention.weight` (`[E, E]`); then `mlp.<i>.*`.
pub fn param_tensors(config: &DienConfig) -> Vec<ParamTensor> {
    let (gru, attention, mlp) = layers(config);
    let mut out = Vec::new();
    if config.interest == Interest::GruAttention {
        let (h, i) = (gru.hidden, gru.input);
        for (name, shape, range) in [
            ("gru.weight_ih_l0", vec![3 * h, i], gru.w_ih()),
            ("gru.weight_hh_l0", vec![3 * h, h], gru.w_hh()),
            ("gru.bias_ih_l0", vec![3 * h], gru.b_ih()),
            ("gru.bias_hh_l0", vec![3 * h], gru.b_hh()),
        ] {
            out.push(ParamTensor { name: name.into(), shape, offset: range.start });
        }
        out.push(ParamTensor {
            name: "attention.weight".into(),
            shape: vec![attention.dim; 2],
            offset: attention.offset,
        });
    }
    out.extend(mlp_tensors("mlp", &mlp));
    out
}

/// Activations of the last forward.
#[derive(Clone, Debug, Default)]
struct Workspace<T> {
    gru: GruCache<T>,
    attention: AttentionCache<T>,
    mlp: MlpCache<T>,
    query: Vec<T>,
    keys: Vec<T>,
    interest: Vec<T>,
    mlp_in: Vec<T>,
    logits: Vec<T>,
    lengths: Vec<usize>,
}

/// The dense part of the DIEN-like model with its flat parameter and gradient buffers.
#[derive(Clone, Debug)]
pub struct Dien<T> {
    /// The shape.
    pub config: DienConfig,
    gru: Gru,
    attention: AttentionPooling,
    mlp: Mlp,
    /// All dense parameters: GRU, attention, MLP (GRU and attention are empty with sum pooling).
    pub params: Vec<T>,
    /// Gradients of the last `backward`, same layout as `params`.
    pub grads: Vec<T>,
    ws: Workspace<T>,
    batch: usize,
    steps: usize,
}

impl<T: Scalar> Dien<T> {
    /// Runs the MLP's products in `precision` (the GRU and the attention stay `f32`).
    pub fn set_precision(&mut self, precision: super::Precision) -> Result<(), OperatorError> {
        self.ws.mlp.set_precision(precision)
    }

    /// Builds and initialises the model from `seed`.
    pub fn new(config: DienConfig, seed: u64) -> Result<Self, OperatorError> {
        config.validate()?;
        let with_gru = config.interest == Interest::GruAttention;
        let (gru, attention, mlp) = layers(&config);
        let n = mlp.layers[0].offset + mlp.num_params();
        let mut params = vec![T::ZERO; n];
        if with_gru {
            gru.init(&mut params, seed, 11);
            attention.init(&mut params);
        }
        mlp.init(&mut params, seed, 12);
        Ok(Dien {
            config,
            gru,
            attention,
            mlp,
            grads: vec![T::ZERO; n],
            params,
            ws: Workspace::default(),
            batch: 0,
            steps: 0,
        })
    }

    fn mlp_input_width(&self) -> usize {
        self.mlp.input()
    }

    /// Logits for `dense [B × num_dense]`, `pooled [B × num_sparse × dim]` and the sequences.
    pub fn forward(&mut self, dense: &[T], pooled: &[T], seq: &SequenceInput<T>, batch: usize) -> &[T] {
        let c = &self.config;
        let (d, e, f) = (c.dim, c.interest_dim(), c.num_sparse);
        let steps = seq.steps;
        self.batch = batch;
        self.steps = steps;
        let ws = &mut self.ws;
        ws.lengths.clear();
        ws.lengths.extend_from_slice(&seq.lengths[..batch]);
        // The target q: the target fields' pooled rows side by side.
        ws.query.resize(batch * e, T::ZERO);
        for b in 0..batch {
            for (s, &tf) in c.target_fields.iter().enumerate() {
                let src = &pooled[(b * f + tf) * d..(b * f + tf + 1) * d];
                ws.query[b * e + s * d..b * e + (s + 1) * d].copy_from_slice(src);
            }
        }
        ws.interest.clear();
        ws.interest.resize(batch * e, T::ZERO);
        match c.interest {
            Interest::SumPooling => {
                for b in 0..batch {
                    let out = &mut ws.interest[b * e..(b + 1) * e];
                    for t in 0..ws.lengths[b] {
                        for (o, &x) in out.iter_mut().zip(&seq.rows[(b * steps + t) * e..(b * steps + t + 1) * e]) {
                            *o += x;
                        }
                    }
                }
            }
            Interest::GruAttention if steps > 0 => {
                self.gru.forward(&self.params, seq.rows, &ws.lengths, batch, steps, &mut ws.gru);
                // Keys [B × T × E]: the time-major states h_1 … h_T plus the step's input.
                ws.keys.resize(batch * steps * e, T::ZERO);
                for t in 0..steps {
                    let state = ws.gru.state(t + 1, e);
                    for b in 0..batch {
                        let at = (b * steps + t) * e;
                        for ((o, &h), &x) in
                            ws.keys[at..at + e].iter_mut().zip(&state[b * e..(b + 1) * e]).zip(&seq.rows[at..at + e])
                        {
                            *o = h + x;
                        }
                    }
                }
                self.attention.forward(
                    &self.params,
                    &ws.query,
                    &ws.keys,
                    &ws.lengths,
                    batch,
                    steps,
                    &mut ws.interest,
                    &mut ws.attention,
                );
            }
            Interest::GruAttention => {}
        }
        // MLP input: [dense, pooled, u, u ⊙ q].
        let width = self.mlp.input();
        let nd = c.num_dense;
        ws.mlp_in.resize(batch * width, T::ZERO);
        for b in 0..batch {
            let row = &mut ws.mlp_in[b * width..(b + 1) * width];
            row[..nd].copy_from_slice(&dense[b * nd..(b + 1) * nd]);
            row[nd..nd + f * d].copy_from_slice(&pooled[b * f * d..(b + 1) * f * d]);
            let (u, q) = (&ws.interest[b * e..(b + 1) * e], &ws.query[b * e..(b + 1) * e]);
            row[nd + f * d..nd + f * d + e].copy_from_slice(u);
            for (k, o) in row[nd + f * d + e..].iter_mut().enumerate() {
                *o = u[k] * q[k];
            }
        }
        let out = self.mlp.forward(&self.params, &ws.mlp_in, batch, &mut ws.mlp);
        ws.logits.clear();
        ws.logits.extend_from_slice(out);
        &ws.logits
    }

    /// Back-propagates `dlogits` through the last `forward` (same inputs); fills
    /// `grads` and overwrites `dpooled` and `dseq` (`[B × T × E]`, zero on padding).
    pub fn backward(&mut self, seq: &SequenceInput<T>, dlogits: &[T], dpooled: &mut [T], dseq: &mut [T]) {
        let c = &self.config;
        let (d, e, f, nd) = (c.dim, c.interest_dim(), c.num_sparse, c.num_dense);
        let (batch, steps) = (self.batch, self.steps);
        let width = self.mlp_input_width();
        let ws = &mut self.ws;
        let mut dx = vec![T::ZERO; batch * width];
        self.mlp.backward(&self.params, &ws.mlp_in, batch, &mut ws.mlp, dlogits, &mut self.grads, Some(&mut dx));
        let mut dinterest = vec![T::ZERO; batch * e];
        let mut dquery = vec![T::ZERO; batch * e];
        for b in 0..batch {
            let row = &dx[b * width..(b + 1) * width];
            dpooled[b * f * d..(b + 1) * f * d].copy_from_slice(&row[nd..nd + f * d]);
            let (du, dprod) = (&row[nd + f * d..nd + f * d + e], &row[nd + f * d + e..]);
            let (u, q) = (&ws.interest[b * e..(b + 1) * e], &ws.query[b * e..(b + 1) * e]);
            for k in 0..e {
                dinterest[b * e + k] = du[k] + dprod[k] * q[k];
                dquery[b * e + k] = dprod[k] * u[k];
            }
        }
        dseq[..batch * steps * e].fill(T::ZERO);
        match c.interest {
            Interest::SumPooling => {
                for b in 0..batch {
                    for t in 0..ws.lengths[b] {
                        dseq[(b * steps + t) * e..(b * steps + t + 1) * e]
                            .copy_from_slice(&dinterest[b * e..(b + 1) * e]);
                    }
                }
            }
            Interest::GruAttention if steps > 0 => {
                let mut dq_att = vec![T::ZERO; batch * e];
                let mut dkeys = vec![T::ZERO; batch * steps * e];
                self.attention.backward(
                    &self.params,
                    &ws.query,
                    &ws.keys,
                    &ws.lengths,
                    batch,
                    steps,
                    &dinterest,
                    &ws.attention,
                    &mut self.grads,
                    &mut dq_att,
                    &mut dkeys,
                );
                for (a, &g) in dquery.iter_mut().zip(&dq_att) {
                    *a += g;
                }
                let mut dstates = vec![T::ZERO; steps * batch * e];
                for t in 0..steps {
                    for b in 0..batch {
                        dstates[(t * batch + b) * e..(t * batch + b + 1) * e]
                            .copy_from_slice(&dkeys[(b * steps + t) * e..(b * steps + t + 1) * e]);
                    }
                }
                self.gru.backward(&self.params, seq.rows, &ws.lengths, &ws.gru, &dstates, &mut self.grads, dseq);
                // The residual path: keys depend on the inputs directly (padding keys get no gradient).
                for b in 0..batch {
                    for t in 0..ws.lengths[b] {
                        let at = (b * steps + t) * e;
                        for (g, &dk) in dseq[at..at + e].iter_mut().zip(&dkeys[at..at + e]) {
                            *g += dk;
                        }
                    }
                }
            }
            Interest::GruAttention => {
                let n = self.gru.num_params() + self.attention.num_params();
                self.grads[..n].fill(T::ZERO);
            }
        }
        for b in 0..batch {
            for (s, &tf) in c.target_fields.iter().enumerate() {
                let dst = &mut dpooled[(b * f + tf) * d..(b * f + tf + 1) * d];
                for (a, &g) in dst.iter_mut().zip(&dquery[b * e + s * d..b * e + (s + 1) * d]) {
                    *a += g;
                }
            }
        }
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
    /// The MLP's products: the GRU's products sum each row on its own whatever
    /// the rows (the packed kernel), the attention and the pooling run sample by
    /// sample, and padding past a sample's length is never read.
    fn set_batch_invariant(&mut self, on: bool) {
        self.ws.mlp.set_batch_invariant(on);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use crate::loss::{bce_with_logits_grad, bce_with_logits_sum};
    use tiderec_records::rng::normal_f64;

    fn config(interest: Interest) -> DienConfig {
        DienConfig {
            num_dense: 2,
            num_sparse: 3,
            dim: 2,
            num_sequences: 2,
            target_fields: vec![1, 2],
            max_len: 4,
            interest,
            mlp: vec![5],
        }
    }

    fn end_to_end_gradients(interest: Interest) {
        let cfg = config(interest);
        let (batch, steps, e) = (3, 4, cfg.interest_dim());
        let mut model = Dien::<f64>::new(cfg.clone(), 5).unwrap();
        // Perturb the parameters so no gradient is trivially zero.
        for (i, p) in model.params.iter_mut().enumerate() {
            *p += 0.1 * normal_f64(3, 1, i as u64, 0);
        }
        let dense: Vec<f64> = (0..batch * 2).map(|i| normal_f64(4, 0, i as u64, 0)).collect();
        let pooled: Vec<f64> = (0..batch * 3 * 2).map(|i| normal_f64(4, 1, i as u64, 0)).collect();
        let lengths = [4usize, 0, 2];
        let mut rows: Vec<f64> = (0..batch * steps * e).map(|i| normal_f64(4, 2, i as u64, 0)).collect();
        for (b, &len) in lengths.iter().enumerate() {
            rows[(b * steps + len) * e..(b + 1) * steps * e].fill(0.0);
        }
        let labels = [1.0f32, 0.0, 1.0];
        let loss = |m: &mut Dien<f64>, pooled: &[f64], rows: &[f64]| {
            let seq = SequenceInput { rows, lengths: &lengths, steps };
            let logits = m.forward(&dense, pooled, &seq, batch).to_vec();
            bce_with_logits_sum(&logits, &labels)
        };
        let seq = SequenceInput { rows: &rows, lengths: &lengths, steps };
        let logits = model.forward(&dense, &pooled, &seq, batch).to_vec();
        let mut dlogits = vec![0.0; batch];
        bce_with_logits_grad(&logits, &labels, 1.0, &mut dlogits);
        let mut dpooled = vec![0.0; pooled.len()];
        let mut dseq = vec![0.0; rows.len()];
        model.backward(&seq, &dlogits, &mut dpooled, &mut dseq);
        let (params, grads) = (model.params.clone(), model.grads.clone());
        let mut probe = model.clone();
        check_gradients(&params, &grads, |p| {
            probe.params.copy_from_slice(p);
            loss(&mut probe, &pooled, &rows)
        });
        let mut probe = model.clone();
        check_gradients(&pooled, &dpooled, |p| loss(&mut probe, p, &rows));
        let mut probe = model.clone();
        check_gradients(&rows, &dseq, |r| loss(&mut probe, &pooled, r));
        // Padding gets no gradient.
        assert!(dseq[steps * e..2 * steps * e].iter().all(|&g| g == 0.0));
    }

    #[test]
    fn gru_attention_gradients_match_finite_differences() {
        end_to_end_gradients(Interest::GruAttention);
    }

    #[test]
    fn sum_pooling_gradients_match_finite_differences() {
        end_to_end_gradients(Interest::SumPooling);
    }

    #[test]
    fn padding_does_not_change_the_output() {
        let cfg = config(Interest::GruAttention);
        let e = cfg.interest_dim();
        let mut model = Dien::<f64>::new(cfg, 1).unwrap();
        let dense = vec![0.3, -0.2];
        let pooled: Vec<f64> = (0..6).map(|i| i as f64 * 0.1).collect();
        let rows: Vec<f64> = (0..2 * e).map(|i| (i as f64 * 0.37).sin()).collect();
        let short = model.forward(&dense, &pooled, &SequenceInput { rows: &rows, lengths: &[2], steps: 2 }, 1)[0];
        let mut padded = rows.clone();
        padded.extend(std::iter::repeat_n(9.0, 2 * e));
        let long = model.forward(&dense, &pooled, &SequenceInput { rows: &padded, lengths: &[2], steps: 4 }, 1)[0];
        assert!((short - long).abs() < 1e-12, "{short} vs {long}");
    }

    #[test]
    fn bad_shapes_name_the_key() {
        let mut c = config(Interest::GruAttention);
        c.target_fields = vec![0];
        assert!(c.validate().unwrap_err().to_string().contains("model.target_fields"));
        let mut c = config(Interest::GruAttention);
        c.target_fields = vec![0, 7];
        assert!(c.validate().unwrap_err().to_string().contains("does not exist"));
    }
}
