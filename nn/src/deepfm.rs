//! Logistic regression, factorization machine, DeepFM and Wide & Deep in one model.
//!
//! Every embedding row is `[w, v₁ … v_k]`: a first-order weight followed by
//! a factor vector (so one table per field serves both terms, and DeepFM's
//! deep part shares the factors with the FM part, as in the paper). Per sample:
//!
//! ```text
//! logit = b + Σⱼ aⱼ·xⱼ + Σ_f w_f                     (LR: k = 0)
//!       + ½ Σ_c [(Σ_f v_fc)² − Σ_f v_fc²]             (FM: k > 0)
//!       + MLP([x, v_1, …, v_F])                       (DeepFM: `deep` non-empty)
//! ```
//!
//! Wide & Deep is the same model without the FM term (`fm = false`): the
//! wide part is the linear term over the ids' first-order weights (trained
//! with FTRL via the `ftrl-adagrad` row optimizer), the deep part the MLP
//! over the factors. Feature crosses ([`tiderec_records::features::cross`]) enter as
//! the last `wide_only` sparse fields: only their first-order weight counts
//! (the wide part); the deep part and the FM term skip them.
//!
//! Dense features enter the linear term (and the deep part's input).

use super::deep_partial::FirstLayer;
use super::fm::FmInteraction;
use super::fm_partial::FmPartial;
use super::gemm::{gemm, Op};
use super::mlp::{Mlp, MlpCache};
use super::model::PartialModel;
use super::named::{mlp_tensors, ParamTensor};
use super::relu::{relu_backward_in_place, relu_in_place};
use super::Scalar;
use serde::{Deserialize, Serialize};
use tiderec_records::rng::normal_f64;
use tiderec_records::OperatorError;

/// Shape of an LR / FM / DeepFM model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FmConfig {
    /// Dense features per sample.
    pub num_dense: usize,
    /// Sparse fields per sample.
    pub num_sparse: usize,
    /// Factor width `k` (0: logistic regression).
    pub dim: usize,
    /// Hidden widths of the deep part (empty: no deep part). The output layer (1) is added.
    pub deep: Vec<usize>,
    /// Include the FM second-order term (false for Wide & Deep).
    #[serde(default = "default_true")]
    pub fm: bool,
    /// The last `wide_only` sparse fields (feature crosses) feed only the linear part.
    #[serde(default)]
    pub wide_only: usize,
}

fn default_true() -> bool {
    true
}

impl FmConfig {
    /// `lr`, `fm`, `deepfm` or `wdl`.
    pub fn name(&self) -> &'static str {
        match (self.dim, self.deep.is_empty(), self.fm) {
            (0, _, _) => "lr",
            (_, true, true) => "fm",
            (_, true, false) => "lr",
            (_, false, true) => "deepfm",
            (_, false, false) => "wdl",
        }
    }

    /// Row width: the first-order weight plus the factor.
    pub fn embedding_dim(&self) -> usize {
        1 + self.dim
    }

    /// The DES partial-result form (every shape but one with wide-only crosses):
    /// the FM sums, and the deep part's first-layer share when there is a deep part.
    pub fn partial(&self) -> Option<FmPartial> {
        if self.wide_only > 0 {
            return None;
        }
        let deep = self.deep.first().map(|&hidden| FirstLayer {
            offset: 1 + self.num_dense,
            input: self.num_dense + self.num_sparse * self.dim,
            hidden,
            skip: self.num_dense,
            dim: self.dim,
            fields: self.num_sparse,
        });
        Some(FmPartial { dim: self.dim, fm: self.fm, deep })
    }

    /// Checks the shape; errors name the offending key.
    pub fn validate(&self) -> Result<(), OperatorError> {
        if !self.deep.is_empty() && self.dim == 0 {
            return Err(OperatorError::config("model.deep", "DeepFM needs a factor width (dim > 0)"));
        }
        if self.deep.contains(&0) {
            return Err(OperatorError::config("model.deep", "layer widths must be positive"));
        }
        if self.wide_only > self.num_sparse {
            return Err(OperatorError::config(
                "model.wide_only",
                format!("{} wide-only fields but {} sparse fields", self.wide_only, self.num_sparse),
            ));
        }
        if self.wide_only > 0 && self.fm && self.dim > 0 {
            return Err(OperatorError::config(
                "crosses",
                "feature crosses feed the wide (linear) part of wdl or lr, not an FM term",
            ));
        }
        if self.num_dense + self.num_sparse == 0 {
            return Err(OperatorError::config("model", "a model needs at least one feature"));
        }
        Ok(())
    }
}

/// The deep part of this shape, after the linear term's `1 + num_dense`
/// parameters: `[dense, factors of the non-wide-only fields] → deep… → 1`.
fn deep_mlp(config: &FmConfig) -> Option<Mlp> {
    (!config.deep.is_empty()).then(|| {
        let mut widths = vec![config.num_dense + (config.num_sparse - config.wide_only) * config.dim];
        widths.extend(&config.deep);
        widths.push(1);
        Mlp::new(&widths, 1 + config.num_dense, false)
    })
}

/// The named tensors of the flat buffer: `linear.bias` (`[1]`, the global
/// bias), `linear.weight` (`[1, num_dense]`, absent without dense features),
/// then `deep.<i>.*` when there is a deep part.
pub fn param_tensors(config: &FmConfig) -> Vec<ParamTensor> {
    let mut out = vec![ParamTensor { name: "linear.bias".into(), shape: vec![1], offset: 0 }];
    if config.num_dense > 0 {
        out.push(ParamTensor { name: "linear.weight".into(), shape: vec![1, config.num_dense], offset: 1 });
    }
    if let Some(mlp) = deep_mlp(config) {
        out.extend(mlp_tensors("deep", &mlp));
    }
    out
}

/// The LR / FM / DeepFM model.
#[derive(Clone, Debug)]
pub struct Fm<T> {
    config: FmConfig,
    fm: Option<FmInteraction>,
    deep: Option<Mlp>,
    /// The deep part after its first layer (the partial form computes that layer from partial results).
    deep_rest: Option<Mlp>,
    params: Vec<T>,
    grads: Vec<T>,
    cache: MlpCache<T>,
    deep_in: Vec<T>,
    d_deep_in: Vec<T>,
    fm_out: Vec<T>,
    logits: Vec<T>,
    /// The first layer's dense columns (or their gradient), `[hidden × num_dense]`.
    first_dense: Vec<T>,
    batch: usize,
}

impl<T: Scalar> Fm<T> {
    /// Builds and initialises the model: linear weights `N(0, 0.01²)`, bias 0, deep part as DLRM's MLPs.
    pub fn new(config: FmConfig, seed: u64) -> Result<Self, OperatorError> {
        config.validate()?;
        let linear = 1 + config.num_dense;
        let deep = deep_mlp(&config);
        let n = linear + deep.as_ref().map_or(0, Mlp::num_params);
        let mut params = vec![T::ZERO; n];
        for (j, p) in params[1..linear].iter_mut().enumerate() {
            *p = T::from_f64(normal_f64(seed, 3, 0, j as u64) * 0.01);
        }
        if let Some(mlp) = &deep {
            mlp.init(&mut params, seed, 4);
        }
        let fm = (config.dim > 0 && config.fm).then(|| FmInteraction {
            num_fields: config.num_sparse,
            dim: config.dim,
            stride: config.embedding_dim(),
            offset: 1,
        });
        let deep_rest = deep.as_ref().map(|m| Mlp { layers: m.layers[1..].to_vec(), relu_last: m.relu_last });
        Ok(Fm {
            config,
            fm,
            deep,
            deep_rest,
            grads: vec![T::ZERO; n],
            params,
            cache: MlpCache::default(),
            deep_in: Vec::new(),
            d_deep_in: Vec::new(),
            fm_out: Vec::new(),
            logits: Vec::new(),
            first_dense: Vec::new(),
            batch: 0,
        })
    }

    /// The shape.
    pub fn config(&self) -> &FmConfig {
        &self.config
    }

    /// Fields whose factors feed the FM term and the deep part (all but the wide-only crosses).
    fn deep_fields(&self) -> usize {
        self.config.num_sparse - self.config.wide_only
    }

    /// `logits = b + x·a` (the bias and the dense part of the linear term, one GEMV).
    fn linear_forward(&mut self, dense: &[T], batch: usize) {
        let nd = self.config.num_dense;
        self.logits.clear();
        self.logits.resize(batch, self.params[0]);
        gemm(Op::N, Op::N, batch, 1, nd, T::ONE, dense, &self.params[1..1 + nd], T::ONE, &mut self.logits);
    }

    /// Gradients of the bias and the dense weights: `db = Σ dlogits`, `da = xᵀ·dlogits`.
    fn linear_backward(&mut self, dense: &[T], dl: &[T]) {
        let (nd, batch) = (self.config.num_dense, dl.len());
        let mut db = T::ZERO;
        for &g in dl {
            db += g;
        }
        self.grads[0] = db;
        gemm(Op::T, Op::N, nd, 1, batch, T::ONE, dense, dl, T::ZERO, &mut self.grads[1..1 + nd]);
    }

    fn build_deep_input(&mut self, dense: &[T], pooled: &[T], batch: usize) {
        let (nd, f, k, e) =
            (self.config.num_dense, self.config.num_sparse, self.config.dim, self.config.embedding_dim());
        let fd = self.deep_fields();
        let width = nd + fd * k;
        self.deep_in.resize(batch * width, T::ZERO);
        for b in 0..batch {
            let row = &mut self.deep_in[b * width..(b + 1) * width];
            row[..nd].copy_from_slice(&dense[b * nd..(b + 1) * nd]);
            for fi in 0..fd {
                let src = (b * f + fi) * e + 1;
                row[nd + fi * k..nd + (fi + 1) * k].copy_from_slice(&pooled[src..src + k]);
            }
        }
    }
}

impl<T: Scalar> super::model::Model<T> for Fm<T> {
    flat_buffer_accessors!();
    fn partial_model(&mut self) -> Option<&mut dyn PartialModel<T>> {
        (self.config.wide_only == 0).then_some(self as &mut dyn PartialModel<T>)
    }
    fn embedding_dim(&self) -> usize {
        self.config.embedding_dim()
    }
    /// The deep part's products (DeepFM, Wide & Deep); LR and FM have no MLP and refuse bf16.
    fn set_precision(&mut self, precision: super::Precision) -> Result<(), OperatorError> {
        if self.deep.is_none() && precision != super::Precision::Fp32 {
            return Err(OperatorError::config(
                "precision",
                format!("bf16 applies to the products of a model's MLPs; {} has none", self.config.name()),
            ));
        }
        self.cache.set_precision(precision)
    }
    /// The deep part's products (the linear term is one dot product per sample,
    /// the FM term is computed sample by sample).
    fn set_batch_invariant(&mut self, on: bool) {
        self.cache.set_batch_invariant(on);
    }

    fn forward(&mut self, dense: &[T], pooled: &[T], batch: usize) -> &[T] {
        self.batch = batch;
        let (f, e) = (self.config.num_sparse, self.config.embedding_dim());
        self.linear_forward(dense, batch);
        for (b, l) in self.logits.iter_mut().enumerate() {
            for fi in 0..f {
                *l += pooled[(b * f + fi) * e];
            }
        }
        if let Some(fm) = &self.fm {
            self.fm_out.resize(batch, T::ZERO);
            fm.forward(pooled, batch, &mut self.fm_out);
            for (l, &v) in self.logits.iter_mut().zip(&self.fm_out) {
                *l += v;
            }
        }
        if self.deep.is_some() {
            self.build_deep_input(dense, pooled, batch);
            let mlp = self.deep.as_ref().unwrap();
            let out = mlp.forward(&self.params, &self.deep_in, batch, &mut self.cache);
            for (l, &v) in self.logits.iter_mut().zip(out) {
                *l += v;
            }
        }
        &self.logits
    }

    fn backward(&mut self, dense: &[T], pooled: &[T], dlogits: &[T], dpooled: &mut [T]) {
        let batch = self.batch;
        let (nd, f, k, e) =
            (self.config.num_dense, self.config.num_sparse, self.config.dim, self.config.embedding_dim());
        let dl = &dlogits[..batch];
        self.linear_backward(dense, dl);
        let dpooled = &mut dpooled[..batch * f * e];
        dpooled.fill(T::ZERO);
        for (b, &g) in dl.iter().enumerate() {
            for fi in 0..f {
                dpooled[(b * f + fi) * e] = g;
            }
        }
        if let Some(fm) = &self.fm {
            fm.backward(pooled, dl, batch, dpooled);
        }
        if let Some(mlp) = &self.deep {
            let fd = self.config.num_sparse - self.config.wide_only;
            let width = nd + fd * k;
            self.d_deep_in.resize(batch * width, T::ZERO);
            mlp.backward(
                &self.params,
                &self.deep_in,
                batch,
                &mut self.cache,
                dl,
                &mut self.grads,
                Some(&mut self.d_deep_in),
            );
            for (rows, d_in) in dpooled.chunks_exact_mut(f * e).zip(self.d_deep_in.chunks_exact(width)) {
                for (row, d) in rows.chunks_exact_mut(e).zip(d_in[nd..].chunks_exact(k)).take(fd) {
                    for (r, &v) in row[1..].iter_mut().zip(d) {
                        *r += v;
                    }
                }
            }
        }
    }
}

impl<T: Scalar> Fm<T> {
    /// The first layer's activations `relu(b + W_x·x + Σ shares)` into `deep_in` (`[B × hidden]`).
    fn first_layer_from_partial(&mut self, l: FirstLayer, fw: usize, dense: &[T], partial: &[T], batch: usize) {
        let (h, nd, pw) = (l.hidden, l.skip, fw + l.hidden);
        let bias = &self.params[l.offset + h * l.input..l.offset + h * l.input + h];
        self.deep_in.resize(batch * h, T::ZERO);
        for (z, p) in self.deep_in.chunks_exact_mut(h).zip(partial.chunks_exact(pw)) {
            for ((z, &s), &b) in z.iter_mut().zip(&p[fw..]).zip(bias) {
                *z = s + b;
            }
        }
        if nd > 0 {
            self.first_dense.clear();
            for o in 0..h {
                let at = l.offset + o * l.input;
                self.first_dense.extend_from_slice(&self.params[at..at + nd]);
            }
            gemm(Op::N, Op::T, batch, h, nd, T::ONE, dense, &self.first_dense, T::ONE, &mut self.deep_in);
        }
        relu_in_place(&mut self.deep_in);
    }

    /// Backward of [`first_layer_from_partial`](Self::first_layer_from_partial) and the
    /// layers after it: the deep part's gradients (the first layer's factor columns
    /// zero: owners add theirs) and `∂L/∂z` into each sample's partial gradient after `fw`.
    fn first_layer_backward(&mut self, l: FirstLayer, fw: usize, dense: &[T], dl: &[T], dpartial: &mut [T]) {
        let (h, nd, pw, batch) = (l.hidden, l.skip, fw + l.hidden, dl.len());
        let rest = self.deep_rest.as_ref().expect("a deep part has layers after its first");
        self.d_deep_in.resize(batch * h, T::ZERO);
        rest.backward(
            &self.params,
            &self.deep_in,
            batch,
            &mut self.cache,
            dl,
            &mut self.grads,
            Some(&mut self.d_deep_in),
        );
        relu_backward_in_place(&mut self.d_deep_in, &self.deep_in);
        for (dp, dz) in dpartial.chunks_exact_mut(pw).zip(self.d_deep_in.chunks_exact(h)) {
            dp[fw..].copy_from_slice(dz);
        }
        let bias = l.offset + h * l.input;
        self.grads[bias..bias + h].fill(T::ZERO);
        for dz in self.d_deep_in.chunks_exact(h) {
            for (g, &v) in self.grads[bias..bias + h].iter_mut().zip(dz) {
                *g += v;
            }
        }
        self.first_dense.clear();
        self.first_dense.resize(h * nd, T::ZERO);
        if nd > 0 {
            gemm(Op::T, Op::N, h, nd, batch, T::ONE, &self.d_deep_in, dense, T::ZERO, &mut self.first_dense);
        }
        for o in 0..h {
            let row = &mut self.grads[l.offset + o * l.input..l.offset + (o + 1) * l.input];
            row[..nd].copy_from_slice(&self.first_dense[o * nd..(o + 1) * nd]);
            row[nd..].fill(T::ZERO);
        }
    }
}

impl<T: Scalar> PartialModel<T> for Fm<T> {
    fn shape(&self) -> FmPartial {
        self.config.partial().expect("partial_model checked the shape")
    }

    fn forward_partial(&mut self, dense: &[T], partial: &[T], batch: usize) -> &[T] {
        self.batch = batch;
        let part = self.shape();
        let (pw, fw) = (part.width(), part.fm_width());
        self.linear_forward(dense, batch);
        for (b, l) in self.logits.iter_mut().enumerate() {
            *l += part.logit(&partial[b * pw..(b + 1) * pw]);
        }
        if let Some(l) = part.deep {
            self.first_layer_from_partial(l, fw, dense, partial, batch);
            let rest = self.deep_rest.as_ref().expect("a deep part has layers after its first");
            let out = rest.forward(&self.params, &self.deep_in, batch, &mut self.cache);
            for (l, &v) in self.logits.iter_mut().zip(out) {
                *l += v;
            }
        }
        &self.logits
    }

    fn backward_partial(&mut self, dense: &[T], partial: &[T], dlogits: &[T], dpartial: &mut [T]) {
        let batch = self.batch;
        let part = self.shape();
        let pw = part.width();
        let dl = &dlogits[..batch];
        self.linear_backward(dense, dl);
        for (b, &g) in dl.iter().enumerate() {
            part.logit_grad(&partial[b * pw..(b + 1) * pw], g, &mut dpartial[b * pw..(b + 1) * pw]);
        }
        if let Some(l) = part.deep {
            self.first_layer_backward(l, part.fm_width(), dense, dl, &mut dpartial[..batch * pw]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use crate::loss::{bce_with_logits_grad, bce_with_logits_sum};
    use crate::ModelConfig;

    const LABELS: [f32; 3] = [1.0, 0.0, 1.0];

    /// Seeded inputs of a 3-sample batch, and one forward + backward: (dense, pooled, logits, dlogits, dpooled).
    #[allow(clippy::type_complexity)]
    fn forward_backward(
        model: &mut dyn super::super::model::Model<f64>,
        nd: usize,
        f: usize,
        e: usize,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let batch = LABELS.len();
        let dense: Vec<f64> = (0..batch * nd).map(|i| normal_f64(6, 0, i as u64, 0).abs()).collect();
        let pooled: Vec<f64> = (0..batch * f * e).map(|i| normal_f64(7, 0, i as u64, 0) * 0.5).collect();
        let logits = model.forward(&dense, &pooled, batch).to_vec();
        let mut dl = vec![0.0; batch];
        bce_with_logits_grad(&logits, &LABELS, 1.0, &mut dl);
        let mut dp = vec![0.0; pooled.len()];
        model.backward(&dense, &pooled, &dl, &mut dp);
        (dense, pooled, logits, dl, dp)
    }

    fn check_model(config: ModelConfig) {
        let mut model = config.build::<f64>(5).unwrap();
        let (nd, f, e) = (config.num_dense(), config.num_sparse(), config.embedding_dim());
        let (batch, labels) = (LABELS.len(), LABELS);
        let (dense, pooled, _, _, dp) = forward_backward(model.as_mut(), nd, f, e);
        let grads = model.grads().to_vec();
        let params = model.params().to_vec();
        check_gradients(&params, &grads, |p| {
            model.params_mut().copy_from_slice(p);
            let l = model.forward(&dense, &pooled, batch).to_vec();
            bce_with_logits_sum(&l, &labels)
        });
        model.params_mut().copy_from_slice(&params);
        check_gradients(&pooled, &dp, |x| {
            let l = model.forward(&dense, x, batch).to_vec();
            bce_with_logits_sum(&l, &labels)
        });
    }

    #[test]
    fn lr_fm_deepfm_gradients_match_finite_differences() {
        let cases = [
            (0, vec![], true, 0),
            (3, vec![], true, 0),
            (3, vec![5, 4], true, 0),
            (3, vec![5, 4], false, 0),
            (3, vec![5, 4], false, 2),
            (0, vec![], true, 1),
        ];
        for (dim, deep, fm, wide_only) in cases {
            let cfg = FmConfig { num_dense: 2, num_sparse: 4, dim, deep, fm, wide_only };
            check_model(ModelConfig::Fm(cfg));
        }
    }

    /// The partial form gives the same logits and gradients as the pooled form
    /// (f64), with and without a deep part, with and without dense features.
    #[test]
    fn partial_form_equals_the_pooled_form() {
        use crate::model::Model;
        let cases = [
            (2, 3, vec![], true),
            (2, 0, vec![], true),
            (2, 3, vec![], false),
            (2, 3, vec![5, 4], true),
            (2, 3, vec![5], false),
            (0, 3, vec![6, 2], true),
        ];
        for (nd, dim, deep, fm) in cases {
            let what = format!("nd {nd} dim {dim} deep {deep:?} fm {fm}");
            let cfg = FmConfig { num_dense: nd, num_sparse: 4, dim, deep, fm, wide_only: 0 };
            let config = ModelConfig::Fm(cfg.clone());
            let part = config.partial().expect("no crosses: a partial form");
            let mut model = Fm::<f64>::new(cfg, 5).unwrap();
            let (f, e, batch) = (4, dim + 1, LABELS.len());
            let (dense, pooled, logits, dl, dp) = forward_backward(&mut model, nd, f, e);
            let grads = model.grads().to_vec();

            let mut wt = Vec::new();
            if let Some(l) = part.deep {
                l.load_transposed(model.params(), &mut wt);
            }
            let pw = part.width();
            let mut sums = vec![0.0; batch * pw];
            for b in 0..batch {
                for fi in 0..f {
                    let row = &pooled[(b * f + fi) * e..(b * f + fi + 1) * e];
                    part.accumulate_field(&wt, fi, row, 1.0, &mut sums[b * pw..(b + 1) * pw]);
                }
            }
            let pm = model.partial_model().unwrap();
            let logits2 = pm.forward_partial(&dense, &sums, batch).to_vec();
            for (a, b) in logits.iter().zip(&logits2) {
                assert!((a - b).abs() < 1e-12, "{what}: logit {a} vs {b}");
            }
            let mut dsums = vec![0.0; sums.len()];
            pm.backward_partial(&dense, &sums, &dl, &mut dsums);
            let mut grads2 = model.grads().to_vec();
            let mut drow = vec![0.0; e];
            let mut dwt = vec![0.0; wt.len()];
            for b in 0..batch {
                for fi in 0..f {
                    let span = (b * f + fi) * e..(b * f + fi + 1) * e;
                    let dpb = &dsums[b * pw..(b + 1) * pw];
                    part.row_grad_field(&wt, fi, &pooled[span.clone()], 1.0, dpb, &mut drow, &mut dwt);
                    for (x, y) in drow.iter().zip(&dp[span]) {
                        assert!((x - y).abs() < 1e-12, "{what}: row gradient {x} vs {y}");
                    }
                }
            }
            if let Some(l) = part.deep {
                l.add_transposed_grads(&dwt, &mut grads2);
            }
            for (i, (a, b)) in grads.iter().zip(&grads2).enumerate() {
                assert!((a - b).abs() < 1e-12, "{what}: parameter {i}: {a} vs {b}");
            }
        }
        let crossed = FmConfig { num_dense: 2, num_sparse: 4, dim: 3, deep: vec![4], fm: false, wide_only: 1 };
        assert!(ModelConfig::Fm(crossed).partial().is_none());
    }

    #[test]
    fn names_and_validation() {
        let c = FmConfig { num_dense: 13, num_sparse: 26, dim: 0, deep: vec![], fm: true, wide_only: 0 };
        assert_eq!(c.name(), "lr");
        assert_eq!(FmConfig { dim: 8, ..c.clone() }.name(), "fm");
        assert_eq!(FmConfig { dim: 8, deep: vec![64], ..c.clone() }.name(), "deepfm");
        assert_eq!(FmConfig { dim: 8, deep: vec![64], fm: false, ..c.clone() }.name(), "wdl");
        assert!(FmConfig { deep: vec![64], ..c.clone() }.validate().unwrap_err().to_string().contains("model.deep"));
        let crossed_fm = FmConfig { dim: 8, wide_only: 2, ..c.clone() };
        assert!(crossed_fm.validate().unwrap_err().to_string().contains("crosses"));
        assert!(FmConfig { wide_only: 27, ..c }.validate().unwrap_err().to_string().contains("model.wide_only"));
    }
}
