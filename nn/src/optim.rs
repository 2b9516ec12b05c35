//! Optimizers for dense parameter slices and for embedding rows.
//!
//! Dense optimizers own the state of exactly the slice they update, so the
//! worker that owns slice `k` of the reduce-scatter holds the optimizer state
//! of slice `k` and nothing else. Sparse optimizers update one row at a time
//! from the row's summed gradient; row-wise Adagrad keeps one accumulator per row.
//! Every `apply` takes the already-averaged gradient.
//!
//! An L2 penalty `l2_penalty` (the gradient of `(λ/2)·‖w‖²`) is added to the
//! gradient of each parameter an update touches: the whole dense slice, and
//! only the rows a step touched for the sparse optimizers (lazy). With the
//! default `λ = 0` the update rules run unchanged. The learning-rate
//! schedule ([`crate::schedule`]) travels with the hyper-parameters; the
//! trainer sets each step's learning rate with [`DenseOptimizer::set_lr`] and
//! its stores' counterparts.
//!
//! Without a penalty the dense update loops run in `dense_kernels` (scalar
//! definitions and AVX-512F versions equal to them bit for bit).

mod dense_kernels;

use crate::schedule::LrSchedule;
use serde::{Deserialize, Serialize};
use std::str::FromStr;
use tiderec_records::finite::all_finite;
use tiderec_records::{OperatorError, RestoreError};

/// Dense optimizer kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenseOptimizerKind {
    /// Plain SGD.
    Sgd,
    /// Adagrad (per-element accumulator).
    Adagrad,
    /// Adam with bias correction.
    Adam,
}

impl FromStr for DenseOptimizerKind {
    type Err = OperatorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sgd" => Ok(Self::Sgd),
            "adagrad" => Ok(Self::Adagrad),
            "adam" => Ok(Self::Adam),
            _ => Err(OperatorError::config("optimizer", format!("unknown dense optimizer `{s}` (sgd, adagrad, adam)"))),
        }
    }
}

impl std::fmt::Display for DenseOptimizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sgd => "sgd",
            Self::Adagrad => "adagrad",
            Self::Adam => "adam",
        })
    }
}

/// Sparse (embedding row) optimizer kinds. Every kind updates only the rows a
/// step touched ("lazy"); its per-row state has [`SparseOptimizerKind::state_width`] values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SparseOptimizerKind {
    /// Plain SGD on the touched rows.
    Sgd,
    /// Row-wise Adagrad: one accumulator of the mean squared gradient per row.
    RowwiseAdagrad,
    /// Lazy Adam: Adam moments per element, bias correction by the row's own step count.
    LazyAdam,
    /// FTRL-Proximal (McMahan et al.) per element, with `l1`, `l2` and `ftrl_beta`.
    Ftrl,
    /// Wide & Deep rows `[w, v…]`: FTRL on the first column (the wide weight),
    /// row-wise Adagrad on the others (the deep factors).
    FtrlAdagrad,
}

impl SparseOptimizerKind {
    /// Optimizer state values per row of width `dim`.
    pub fn state_width(self, dim: usize) -> usize {
        match self {
            SparseOptimizerKind::Sgd => 0,
            SparseOptimizerKind::RowwiseAdagrad => 1,
            SparseOptimizerKind::LazyAdam => 2 * dim + 1,
            SparseOptimizerKind::Ftrl => 2 * dim,
            SparseOptimizerKind::FtrlAdagrad => 3,
        }
    }

    /// The initial state of one row.
    pub fn init_state(self, hp: &OptimizerParams, state: &mut [f32]) {
        state.fill(0.0);
        match self {
            SparseOptimizerKind::RowwiseAdagrad => state[0] = hp.initial_accumulator,
            SparseOptimizerKind::FtrlAdagrad => state[2] = hp.initial_accumulator,
            _ => {}
        }
    }
}

impl FromStr for SparseOptimizerKind {
    type Err = OperatorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sgd" => Ok(Self::Sgd),
            "rowwise-adagrad" | "row-wise-adagrad" | "adagrad" => Ok(Self::RowwiseAdagrad),
            "lazy-adam" | "adam" => Ok(Self::LazyAdam),
            "ftrl" => Ok(Self::Ftrl),
            "ftrl-adagrad" => Ok(Self::FtrlAdagrad),
            _ => Err(OperatorError::config(
                "sparse_optimizer",
                format!("unknown sparse optimizer `{s}` (sgd, rowwise-adagrad, lazy-adam, ftrl, ftrl-adagrad)"),
            )),
        }
    }
}

impl SparseOptimizerKind {
    /// Why this optimizer refuses a learning-rate decay that reaches 0 (`decay`, by name),
    /// or `None` when it takes one: FTRL divides each weight's sums by its learning rate.
    pub fn refuses_decay_to_zero(self, decay: &str) -> Option<String> {
        matches!(self, Self::Ftrl | Self::FtrlAdagrad).then(|| {
            format!(
                "{self} divides each weight's sums by --sparse-lr (FTRL's alpha): a {decay} decay reaches 0 and \
                 would make every weight NaN; use `step` decay or none"
            )
        })
    }
}

impl std::fmt::Display for SparseOptimizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sgd => "sgd",
            Self::RowwiseAdagrad => "rowwise-adagrad",
            Self::LazyAdam => "lazy-adam",
            Self::Ftrl => "ftrl",
            Self::FtrlAdagrad => "ftrl-adagrad",
        })
    }
}

/// Hyper-parameters shared by the optimizers.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptimizerParams {
    /// Learning rate.
    pub lr: f32,
    /// Adam β₁.
    pub beta1: f32,
    /// Adam β₂.
    pub beta2: f32,
    /// Denominator guard.
    pub eps: f32,
    /// Initial Adagrad accumulator.
    pub initial_accumulator: f32,
    /// FTRL L1 strength.
    pub l1: f32,
    /// FTRL L2 strength.
    pub l2: f32,
    /// FTRL β (the learning-rate schedule's offset).
    pub ftrl_beta: f32,
    /// L2 penalty λ added to the gradient as `λ·w` (0: none). Left out of JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub l2_penalty: f32,
    /// Warm-up and decay of `lr` over the training steps. Left out of JSON when constant.
    #[serde(default, skip_serializing_if = "LrSchedule::is_constant")]
    pub schedule: LrSchedule,
}

fn is_zero(x: &f32) -> bool {
    *x == 0.0
}

impl OptimizerParams {
    /// Defaults with the given learning rate.
    pub fn with_lr(lr: f32) -> Self {
        OptimizerParams {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            initial_accumulator: 0.0,
            l1: 0.0,
            l2: 0.0,
            ftrl_beta: 1.0,
            l2_penalty: 0.0,
            schedule: LrSchedule::default(),
        }
    }

    /// Checks the values no optimizer can use; `prefix` names the keys (`""`, `"sparse_"`).
    pub fn validate(&self, prefix: &str) -> Result<(), OperatorError> {
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(OperatorError::config(
                format!("{prefix}lr"),
                format!("learning rate must be positive, got {}", self.lr),
            ));
        }
        let non_negative = [("l2_penalty", self.l2_penalty), ("ftrl_l1", self.l1), ("ftrl_l2", self.l2)];
        for (key, v) in non_negative.into_iter().chain([("ftrl_beta", self.ftrl_beta)]) {
            if !(v.is_finite() && v >= 0.0) {
                return Err(OperatorError::config(format!("{prefix}{key}"), format!("must be ≥ 0, got {v}")));
            }
        }
        self.schedule.validate()
    }
}

/// State and update rule for one dense slice.
#[derive(Clone, Debug)]
pub struct DenseOptimizer {
    kind: DenseOptimizerKind,
    hp: OptimizerParams,
    len: usize,
    m: Vec<f32>,
    v: Vec<f32>,
    t: u64,
}

/// The state of a dense optimizer over the slice `[offset, offset + len)` of
/// the flat dense buffer, as written to and read from checkpoints.
///
/// Invariants (checked by [`DenseOptimizerState::check`]): `m` has `len`
/// values for Adam and none otherwise; `v` has `len` values for Adam and
/// Adagrad and none for SGD. `t` is the number of updates applied, the same
/// for every slice of one model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DenseOptimizerState {
    /// The optimizer.
    pub kind: DenseOptimizerKind,
    /// Updates applied so far (Adam's bias correction).
    pub t: u64,
    /// First parameter of the slice in the flat buffer.
    pub offset: usize,
    /// Parameters in the slice.
    pub len: usize,
    /// First moments (Adam).
    pub m: Vec<f32>,
    /// Second moments (Adam) or accumulators (Adagrad).
    pub v: Vec<f32>,
}

impl DenseOptimizerState {
    /// Checks the widths of `m` and `v` against `kind` and `len`.
    pub fn check(&self) -> Result<(), OperatorError> {
        let (m, v) = match self.kind {
            DenseOptimizerKind::Sgd => (0, 0),
            DenseOptimizerKind::Adagrad => (0, self.len),
            DenseOptimizerKind::Adam => (self.len, self.len),
        };
        if self.m.len() != m || self.v.len() != v {
            return Err(RestoreError::OptimizerMoments {
                optimizer: self.kind.to_string(),
                len: self.len,
                offset: self.offset,
                first: self.m.len(),
                second: self.v.len(),
                expected_first: m,
                expected_second: v,
            }
            .into());
        }
        Ok(())
    }

    /// Joins slices that tile `[0, n)` (in any order, empty slices allowed) into one state over `[0, n)`.
    pub fn concat(parts: &[&DenseOptimizerState], n: usize) -> Result<DenseOptimizerState, OperatorError> {
        let mut sorted: Vec<&DenseOptimizerState> = parts.to_vec();
        sorted.sort_by_key(|p| (p.offset, p.len));
        let Some(first) = sorted.first() else {
            return Err(RestoreError::NoOptimizerState.into());
        };
        let mut out =
            DenseOptimizerState { kind: first.kind, t: first.t, offset: 0, len: 0, m: Vec::new(), v: Vec::new() };
        for p in sorted {
            p.check()?;
            if p.kind != out.kind || p.t != out.t {
                return Err(RestoreError::OptimizerSlicesDisagree {
                    optimizer: out.kind.to_string(),
                    t: out.t,
                    other_optimizer: p.kind.to_string(),
                    other_t: p.t,
                }
                .into());
            }
            if p.offset != out.len {
                return Err(RestoreError::OptimizerSlicesGap { start: p.offset, expected: out.len }.into());
            }
            out.len += p.len;
            out.m.extend_from_slice(&p.m);
            out.v.extend_from_slice(&p.v);
        }
        if out.len != n {
            return Err(RestoreError::OptimizerCoverage { covered: out.len, params: n }.into());
        }
        Ok(out)
    }

    /// The state of the sub-slice `range` (offsets relative to this state's buffer).
    pub fn slice(&self, range: std::ops::Range<usize>) -> DenseOptimizerState {
        let part = |x: &[f32]| if x.is_empty() { Vec::new() } else { x[range.clone()].to_vec() };
        DenseOptimizerState {
            kind: self.kind,
            t: self.t,
            offset: self.offset + range.start,
            len: range.len(),
            m: part(&self.m),
            v: part(&self.v),
        }
    }
}

impl DenseOptimizer {
    /// State for a slice of `len` parameters.
    pub fn new(kind: DenseOptimizerKind, hp: OptimizerParams, len: usize) -> Self {
        let (m, v) = match kind {
            DenseOptimizerKind::Sgd => (Vec::new(), Vec::new()),
            DenseOptimizerKind::Adagrad => (Vec::new(), vec![hp.initial_accumulator; len]),
            DenseOptimizerKind::Adam => (vec![0.0; len], vec![0.0; len]),
        };
        DenseOptimizer { kind, hp, len, m, v, t: 0 }
    }

    /// An optimizer that continues from `state` (a checkpoint) with hyper-parameters `hp`.
    pub fn from_state(hp: OptimizerParams, state: &DenseOptimizerState) -> Result<Self, OperatorError> {
        state.check()?;
        Ok(DenseOptimizer { kind: state.kind, hp, len: state.len, m: state.m.clone(), v: state.v.clone(), t: state.t })
    }

    /// This optimizer's state, for a slice starting at `offset` of the flat buffer.
    pub fn state(&self, offset: usize) -> DenseOptimizerState {
        DenseOptimizerState { kind: self.kind, t: self.t, offset, len: self.len, m: self.m.clone(), v: self.v.clone() }
    }

    /// Sets the learning rate of the next updates (a schedule's value; the other
    /// hyper-parameters stay).
    pub fn set_lr(&mut self, lr: f32) {
        self.hp.lr = lr;
    }

    /// Parameters in the slice this optimizer updates.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty slice.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Updates `params` in place from the averaged gradient `grads`.
    pub fn apply(&mut self, params: &mut [f32], grads: &[f32]) {
        self.apply_scaled(params, grads, 1.0);
    }

    /// Updates `params` from `scale · Σ parts` (the parts summed in order),
    /// reducing and updating block by block so the summed gradient never
    /// leaves the L1 cache. The result equals summing into a buffer first.
    pub fn apply_sum_scaled(&mut self, params: &mut [f32], parts: &[&[f32]], scale: f32) {
        self.apply_parts(params, parts, scale, false);
    }

    /// [`apply_sum_scaled`](Self::apply_sum_scaled), and whether every updated
    /// parameter is finite (a finite gradient that an extreme learning rate
    /// turns into an infinite parameter). Each block is checked right after its
    /// update, while it is still in cache, instead of in a pass of its own
    /// over the slice; the updates are the same.
    pub fn apply_sum_scaled_finite(&mut self, params: &mut [f32], parts: &[&[f32]], scale: f32) -> bool {
        self.apply_parts(params, parts, scale, true)
    }

    /// The update from `scale · Σ parts`, block by block. With `check` it
    /// returns whether every updated parameter is finite; without, `true`.
    fn apply_parts(&mut self, params: &mut [f32], parts: &[&[f32]], scale: f32, check: bool) -> bool {
        const BLOCK: usize = 512;
        /// Values per block of a lone part's update checked while in cache (64 KiB).
        const CHECKED_BLOCK: usize = 16_384;
        assert!(parts.iter().all(|p| p.len() == params.len()), "gradient parts must match the slice");
        let Some((first, rest)) = parts.split_first() else { return true };
        let finite_at = |params: &[f32], range: std::ops::Range<usize>| !check || all_finite(&params[range]);
        let mut finite = true;
        if rest.is_empty() {
            if !check {
                self.apply_scaled(params, first, scale);
                return true;
            }
            // Each parameter's update reads only its own values: blocks give the same updates.
            self.t += 1;
            let t = self.t;
            for start in (0..params.len()).step_by(CHECKED_BLOCK) {
                let end = (start + CHECKED_BLOCK).min(params.len());
                self.update_range(params, start, &first[start..end], scale, t);
                finite = finite && finite_at(params, start..end);
            }
            return finite;
        }
        self.t += 1;
        let t = self.t;
        let mut block = [0.0f32; BLOCK];
        let mut start = 0;
        while start < params.len() {
            let end = (start + BLOCK).min(params.len());
            let g = &mut block[..end - start];
            // The first two parts in one pass (the same sums, in the same order, as
            // copying the first and adding the second).
            let (second, more) = rest.split_first().expect("at least two parts");
            for ((a, &x), &y) in g.iter_mut().zip(&first[start..end]).zip(&second[start..end]) {
                *a = x + y;
            }
            for part in more {
                for (a, &v) in g.iter_mut().zip(&part[start..end]) {
                    *a += v;
                }
            }
            self.update_range(params, start, g, scale, t);
            finite = finite && finite_at(params, start..end);
            start = end;
        }
        finite
    }

    /// Updates `params` in place from the gradient `scale · grads` (the
    /// averaging is fused into the update; no scaled copy is made).
    pub fn apply_scaled(&mut self, params: &mut [f32], grads: &[f32], scale: f32) {
        assert_eq!(params.len(), grads.len());
        self.t += 1;
        let t = self.t;
        self.update_range(params, 0, grads, scale, t);
    }

    /// The update rule on `params[start..start + grads.len()]` at step `t`.
    fn update_range(&mut self, params: &mut [f32], start: usize, grads: &[f32], scale: f32, t: u64) {
        let l2 = self.hp.l2_penalty;
        if l2 == 0.0 {
            self.kernels(params, start, grads, scale, t);
        } else {
            self.rule(params, start, grads, t, |g, p| g * scale + l2 * p);
        }
    }

    /// The update rule with the gradient `grad(g, p)` of a raw gradient `g` at parameter `p`.
    #[inline(always)]
    fn rule(&mut self, params: &mut [f32], start: usize, grads: &[f32], t: u64, grad: impl Fn(f32, f32) -> f32) {
        let params = &mut params[start..start + grads.len()];
        let OptimizerParams { lr, beta1, beta2, eps, .. } = self.hp;
        match self.kind {
            DenseOptimizerKind::Sgd => {
                for (p, &g) in params.iter_mut().zip(grads) {
                    *p -= lr * grad(g, *p);
                }
            }
            DenseOptimizerKind::Adagrad => {
                let v = &mut self.v[start..start + grads.len()];
                for ((p, &g), v) in params.iter_mut().zip(grads).zip(v) {
                    let g = grad(g, *p);
                    *v += g * g;
                    *p -= lr * g / (v.sqrt() + eps);
                }
            }
            DenseOptimizerKind::Adam => {
                let (step, bc2_sqrt) = adam_bias_correction(lr, beta1, beta2, t);
                let m = &mut self.m[start..start + grads.len()];
                let v = &mut self.v[start..start + grads.len()];
                for (((p, &g), m), v) in params.iter_mut().zip(grads).zip(m).zip(v) {
                    let g = grad(g, *p);
                    *m = beta1 * *m + (1.0 - beta1) * g;
                    *v = beta2 * *v + (1.0 - beta2) * g * g;
                    *p -= step * *m / (v.sqrt() / bc2_sqrt + eps);
                }
            }
        }
    }

    /// The update rule with the gradient `scale · g`, on the vector kernels.
    fn kernels(&mut self, params: &mut [f32], start: usize, grads: &[f32], scale: f32, t: u64) {
        let params = &mut params[start..start + grads.len()];
        let OptimizerParams { lr, beta1, beta2, eps, .. } = self.hp;
        match self.kind {
            DenseOptimizerKind::Sgd => dense_kernels::sgd(params, grads, lr, scale),
            DenseOptimizerKind::Adagrad => {
                dense_kernels::adagrad(params, grads, &mut self.v[start..start + grads.len()], lr, eps, scale)
            }
            DenseOptimizerKind::Adam => {
                let (step, bc2_sqrt) = adam_bias_correction(lr, beta1, beta2, t);
                let m = &mut self.m[start..start + grads.len()];
                let v = &mut self.v[start..start + grads.len()];
                dense_kernels::adam(
                    params,
                    grads,
                    m,
                    v,
                    dense_kernels::AdamStep { beta1, beta2, step, bc2_sqrt, eps, scale },
                );
            }
        }
    }
}

/// Adam's step size `lr / (1 − β₁ᵗ)` and `√(1 − β₂ᵗ)` at step `t`.
fn adam_bias_correction(lr: f32, beta1: f32, beta2: f32, t: u64) -> (f32, f32) {
    let t = t.min(i32::MAX as u64) as i32;
    (lr / (1.0 - beta1.powi(t)), (1.0 - beta2.powi(t)).sqrt())
}

/// Applies one sparse update to `row` from its averaged gradient `grad`;
/// `state` is the row's optimizer state (`kind.state_width(row.len())` values).
/// With `hp.l2_penalty = λ > 0` the gradient is `grad + λ·row` (row before the update).
#[inline]
pub fn apply_row(kind: SparseOptimizerKind, hp: &OptimizerParams, row: &mut [f32], grad: &[f32], state: &mut [f32]) {
    let l2 = hp.l2_penalty;
    if l2 == 0.0 {
        row_rule(kind, hp, row, grad, state, |g, _| g);
    } else {
        row_rule(kind, hp, row, grad, state, |g, w| g + l2 * w);
    }
}

/// [`apply_row`], and whether the updated row and its optimizer state are
/// finite (a finite gradient that an extreme learning rate, an overflowing
/// accumulator or a row near `f32::MAX` turns into an infinity or NaN). The row
/// is checked right after its update, while it is still in L1, instead of in
/// a pass of its own; the values are those of [`apply_row`], bit for bit.
#[inline]
pub fn apply_row_finite(
    kind: SparseOptimizerKind,
    hp: &OptimizerParams,
    row: &mut [f32],
    grad: &[f32],
    state: &mut [f32],
) -> bool {
    apply_row(kind, hp, row, grad, state);
    short_finite(row) & short_finite(state)
}

/// Whether no value of a row-sized slice is infinite or NaN: one branch-free pass that
/// vectorizes at the call site (a row of 16 values is one AVX-512 compare), where
/// [`all_finite`]'s lanes cost more than the row to set up and reduce.
#[inline(always)]
fn short_finite(xs: &[f32]) -> bool {
    xs.iter().fold(true, |ok, x| ok & x.is_finite())
}

/// The row update rules with the gradient `pen(g, w)` of a raw gradient `g` at weight `w`.
#[inline(always)]
fn row_rule(
    kind: SparseOptimizerKind,
    hp: &OptimizerParams,
    row: &mut [f32],
    grad: &[f32],
    state: &mut [f32],
    pen: impl Fn(f32, f32) -> f32 + Copy,
) {
    match kind {
        SparseOptimizerKind::Sgd => {
            for (r, &g) in row.iter_mut().zip(grad) {
                *r -= hp.lr * pen(g, *r);
            }
        }
        SparseOptimizerKind::RowwiseAdagrad => rowwise_adagrad(hp, row, grad, &mut state[0], pen),
        SparseOptimizerKind::LazyAdam => {
            let d = row.len();
            let (m, rest) = state.split_at_mut(d);
            let (v, t) = rest.split_at_mut(d);
            t[0] += 1.0;
            let bc1 = 1.0 - hp.beta1.powf(t[0]);
            let bc2 = 1.0 - hp.beta2.powf(t[0]);
            for (((r, &g), m), v) in row.iter_mut().zip(grad).zip(m).zip(v) {
                let g = pen(g, *r);
                *m = hp.beta1 * *m + (1.0 - hp.beta1) * g;
                *v = hp.beta2 * *v + (1.0 - hp.beta2) * g * g;
                *r -= hp.lr * (*m / bc1) / ((*v / bc2).sqrt() + hp.eps);
            }
        }
        SparseOptimizerKind::Ftrl => {
            let d = row.len();
            let (z, n) = state.split_at_mut(d);
            for (((r, &g), z), n) in row.iter_mut().zip(grad).zip(z).zip(n) {
                let g = pen(g, *r);
                ftrl(hp, r, g, z, n);
            }
        }
        SparseOptimizerKind::FtrlAdagrad => {
            let (z, rest) = state.split_at_mut(1);
            let (n, acc) = rest.split_at_mut(1);
            let g0 = pen(grad[0], row[0]);
            ftrl(hp, &mut row[0], g0, &mut z[0], &mut n[0]);
            if row.len() > 1 {
                rowwise_adagrad(hp, &mut row[1..], &grad[1..], &mut acc[0], pen);
            }
        }
    }
}

#[inline(always)]
fn rowwise_adagrad(
    hp: &OptimizerParams,
    row: &mut [f32],
    grad: &[f32],
    accumulator: &mut f32,
    pen: impl Fn(f32, f32) -> f32,
) {
    let mean_sq = row.iter().zip(grad).map(|(&w, &g)| pen(g, w) * pen(g, w)).sum::<f32>() / grad.len() as f32;
    *accumulator += mean_sq;
    let scale = hp.lr / (accumulator.sqrt() + hp.eps);
    for (r, &g) in row.iter_mut().zip(grad) {
        *r -= scale * pen(g, *r);
    }
}

/// One FTRL-Proximal coordinate update; the weight is recomputed from `z` and `n`.
#[inline]
fn ftrl(hp: &OptimizerParams, w: &mut f32, g: f32, z: &mut f32, n: &mut f32) {
    let n_new = *n + g * g;
    let sigma = (n_new.sqrt() - n.sqrt()) / hp.lr;
    *z += g - sigma * *w;
    *n = n_new;
    *w = if z.abs() <= hp.l1 { 0.0 } else { -(*z - z.signum() * hp.l1) / ((hp.ftrl_beta + n.sqrt()) / hp.lr + hp.l2) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quadratic_descends(kind: DenseOptimizerKind, lr: f32) {
        // minimise Σ (p - 3)²
        let mut opt = DenseOptimizer::new(kind, OptimizerParams::with_lr(lr), 4);
        let mut p = vec![0.0f32; 4];
        for _ in 0..2000 {
            let g: Vec<f32> = p.iter().map(|x| 2.0 * (x - 3.0)).collect();
            opt.apply(&mut p, &g);
        }
        for x in p {
            assert!((x - 3.0).abs() < 1e-2, "{kind:?}: {x}");
        }
    }

    #[test]
    fn dense_optimizers_minimise_a_quadratic() {
        quadratic_descends(DenseOptimizerKind::Sgd, 0.1);
        quadratic_descends(DenseOptimizerKind::Adagrad, 0.5);
        quadratic_descends(DenseOptimizerKind::Adam, 0.05);
    }

    #[test]
    fn blocked_sum_update_equals_summing_first() {
        for kind in [DenseOptimizerKind::Sgd, DenseOptimizerKind::Adagrad, DenseOptimizerKind::Adam] {
            let n = 1300; // spans several blocks and a partial one
            let parts: Vec<Vec<f32>> = (0..3)
                .map(|k| (0..n).map(|i| tiderec_records::rng::unit_f64(k, i as u64, 0, 0) as f32 - 0.5).collect())
                .collect();
            let mut sum = parts[0].clone();
            for p in &parts[1..] {
                for (a, &b) in sum.iter_mut().zip(p) {
                    *a += b;
                }
            }
            let hp = OptimizerParams::with_lr(0.01);
            let (mut a, mut b) = (DenseOptimizer::new(kind, hp, n), DenseOptimizer::new(kind, hp, n));
            let (mut pa, mut pb) = (vec![0.3f32; n], vec![0.3f32; n]);
            for _ in 0..3 {
                a.apply_scaled(&mut pa, &sum, 0.25);
                let refs: Vec<&[f32]> = parts.iter().map(|p| &p[..]).collect();
                b.apply_sum_scaled(&mut pb, &refs, 0.25);
            }
            assert_eq!(pa, pb, "{kind:?}");
        }
    }

    /// The checked update is the unchecked one, bit for bit, one part or
    /// several, over blocks and a partial one; it says whether any updated
    /// parameter is not finite, wherever that parameter lies (first value,
    /// inside a later block, last value).
    #[test]
    fn checked_update_equals_the_update_and_finds_any_non_finite_parameter() {
        let n = 40_000; // past two checked blocks of a lone part
        let value = |k: u64, i: usize| tiderec_records::rng::unit_f64(k, i as u64, 0, 0) as f32 - 0.5;
        for kind in [DenseOptimizerKind::Sgd, DenseOptimizerKind::Adagrad, DenseOptimizerKind::Adam] {
            for parts in [1, 3] {
                let grads: Vec<Vec<f32>> = (0..parts).map(|k| (0..n).map(|i| value(k, i)).collect()).collect();
                let refs: Vec<&[f32]> = grads.iter().map(|g| &g[..]).collect();
                let hp = OptimizerParams::with_lr(0.01);
                let (mut a, mut b) = (DenseOptimizer::new(kind, hp, n), DenseOptimizer::new(kind, hp, n));
                let (mut pa, mut pb): (Vec<f32>, Vec<f32>) = ((0..n).map(|i| value(9, i)).collect(), vec![0.0; n]);
                pb.copy_from_slice(&pa);
                for _ in 0..2 {
                    a.apply_sum_scaled(&mut pa, &refs, 0.5);
                    assert!(b.apply_sum_scaled_finite(&mut pb, &refs, 0.5), "{kind:?}, {parts} part(s)");
                }
                assert_eq!(pa, pb, "{kind:?}, {parts} part(s)");
                for at in [0, 20_000, n - 1] {
                    for bad in [f32::NAN, f32::INFINITY] {
                        let mut params = pb.clone();
                        params[at] = bad;
                        let mut opt = DenseOptimizer::new(kind, hp, n);
                        assert!(!opt.apply_sum_scaled_finite(&mut params, &refs, 0.5), "{kind:?}: {bad} at {at}");
                    }
                }
            }
        }
    }

    #[test]
    fn adam_first_step_is_lr_times_sign() {
        let mut opt = DenseOptimizer::new(DenseOptimizerKind::Adam, OptimizerParams::with_lr(0.01), 2);
        let mut p = vec![1.0f32, 1.0];
        opt.apply(&mut p, &[0.5, -2.0]);
        assert!((p[0] - 0.99).abs() < 1e-6 && (p[1] - 1.01).abs() < 1e-6, "{p:?}");
    }

    #[test]
    fn rowwise_adagrad_matches_formula() {
        let hp = OptimizerParams::with_lr(0.1);
        let mut row = vec![1.0f32, 2.0];
        let mut acc = [0.0];
        apply_row(SparseOptimizerKind::RowwiseAdagrad, &hp, &mut row, &[3.0, 4.0], &mut acc);
        let acc = acc[0];
        assert!((acc - 12.5).abs() < 1e-6);
        let s = 0.1 / (12.5f32.sqrt() + 1e-8);
        assert!((row[0] - (1.0 - s * 3.0)).abs() < 1e-6 && (row[1] - (2.0 - s * 4.0)).abs() < 1e-6);
    }

    #[test]
    fn lazy_adam_first_step_is_lr_times_sign_and_counts_row_steps() {
        let hp = OptimizerParams::with_lr(0.01);
        let kind = SparseOptimizerKind::LazyAdam;
        let mut state = vec![0.0; kind.state_width(2)];
        let mut row = vec![1.0f32, 1.0];
        apply_row(kind, &hp, &mut row, &[0.5, -2.0], &mut state);
        assert!((row[0] - 0.99).abs() < 1e-6 && (row[1] - 1.01).abs() < 1e-6, "{row:?}");
        assert_eq!(state[4], 1.0, "the row's own step count");
    }

    #[test]
    fn ftrl_matches_the_closed_form_and_l1_zeroes_weights() {
        let mut hp = OptimizerParams::with_lr(0.1);
        let (mut w, mut z, mut n) = (0.0f32, 0.0f32, 0.0f32);
        ftrl(&hp, &mut w, 2.0, &mut z, &mut n);
        // n = 4, σ = 2/0.1 = 20, z = 2 − 20·0 = 2, w = −2 / ((1 + 2)/0.1) = −1/15
        assert!((n - 4.0).abs() < 1e-6 && (z - 2.0).abs() < 1e-6 && (w + 1.0 / 15.0).abs() < 1e-6, "{w} {z} {n}");
        hp.l1 = 5.0;
        let (mut w, mut z, mut n) = (0.3f32, 0.0f32, 0.0f32);
        ftrl(&hp, &mut w, 0.5, &mut z, &mut n);
        assert_eq!(w, 0.0, "|z| <= l1 gives an exact zero");
        // The split kind: FTRL on column 0, Adagrad on the rest.
        let kind = SparseOptimizerKind::FtrlAdagrad;
        let hp = OptimizerParams::with_lr(0.1);
        let mut state = vec![0.0; kind.state_width(3)];
        let mut row = vec![0.0f32, 1.0, 1.0];
        apply_row(kind, &hp, &mut row, &[2.0, 3.0, 4.0], &mut state);
        assert!((row[0] + 1.0 / 15.0).abs() < 1e-6);
        let s = 0.1 / (12.5f32.sqrt() + 1e-8);
        assert!((row[1] - (1.0 - 3.0 * s)).abs() < 1e-6 && (row[2] - (1.0 - 4.0 * s)).abs() < 1e-6);
    }

    #[test]
    fn dense_state_round_trips_and_reslices() {
        for kind in [DenseOptimizerKind::Sgd, DenseOptimizerKind::Adagrad, DenseOptimizerKind::Adam] {
            let hp = OptimizerParams::with_lr(0.01);
            let n = 10;
            let grads: Vec<f32> = (0..n).map(|i| i as f32 * 0.1 - 0.3).collect();
            // Two slices [0, 4) and [4, 10), stepped twice.
            let (mut a, mut b) = (DenseOptimizer::new(kind, hp, 4), DenseOptimizer::new(kind, hp, 6));
            let mut p = vec![0.5f32; n];
            for _ in 0..2 {
                a.apply(&mut p[..4], &grads[..4]);
                b.apply(&mut p[4..], &grads[4..]);
            }
            let (sa, sb) = (a.state(0), b.state(4));
            let whole = DenseOptimizerState::concat(&[&sb, &sa], n).unwrap();
            assert_eq!((whole.t, whole.len), (2, n));
            // Round trip: an optimizer restored from its state continues identically.
            let mut restored = DenseOptimizer::from_state(hp, &sb).unwrap();
            let (mut p1, mut p2) = (p.clone(), p.clone());
            b.apply(&mut p1[4..], &grads[4..]);
            restored.apply(&mut p2[4..], &grads[4..]);
            assert_eq!(p1, p2, "{kind:?}");
            // Re-slicing into three parts and joining again gives the same state.
            let thirds: Vec<DenseOptimizerState> = [0..3, 3..6, 6..10].into_iter().map(|r| whole.slice(r)).collect();
            assert_eq!(thirds[1].offset, 3);
            let again = DenseOptimizerState::concat(&thirds.iter().collect::<Vec<_>>(), n).unwrap();
            assert_eq!(again, whole);
            // Gaps, overlaps and wrong lengths are errors, not panics.
            assert!(DenseOptimizerState::concat(&[&thirds[0], &thirds[2]], n).is_err());
            assert!(DenseOptimizerState::concat(&[&whole], n + 1).is_err());
        }
        let bad = DenseOptimizerState {
            kind: DenseOptimizerKind::Adam,
            t: 1,
            offset: 0,
            len: 3,
            m: vec![0.0; 3],
            v: vec![0.0; 2],
        };
        assert!(DenseOptimizer::from_state(OptimizerParams::with_lr(0.1), &bad).is_err());
    }

    #[test]
    fn l2_penalty_adds_lambda_w_to_every_gradient() {
        // SGD with a zero gradient: w ← w − lr·λ·w, dense and sparse alike.
        let hp = OptimizerParams { l2_penalty: 0.5, ..OptimizerParams::with_lr(0.1) };
        let mut dense = DenseOptimizer::new(DenseOptimizerKind::Sgd, hp, 2);
        let mut p = vec![2.0f32, -4.0];
        dense.apply(&mut p, &[0.0, 0.0]);
        assert_eq!(p, vec![2.0 * 0.95, -4.0 * 0.95]);
        let mut row = vec![2.0f32, -4.0];
        apply_row(SparseOptimizerKind::Sgd, &hp, &mut row, &[0.0, 0.0], &mut []);
        assert_eq!(row, vec![2.0 * 0.95, -4.0 * 0.95]);
        // Every kind: the penalised update equals the plain update of `g + λ·w`.
        for kind in [
            SparseOptimizerKind::Sgd,
            SparseOptimizerKind::RowwiseAdagrad,
            SparseOptimizerKind::LazyAdam,
            SparseOptimizerKind::Ftrl,
            SparseOptimizerKind::FtrlAdagrad,
        ] {
            let plain = OptimizerParams::with_lr(0.1);
            let (w, g) = ([0.3f32, -0.2, 0.7], [0.1f32, 0.4, -0.3]);
            let mut st_a = vec![0.0; kind.state_width(3)];
            let mut st_b = st_a.clone();
            let (mut a, mut b) = (w.to_vec(), w.to_vec());
            apply_row(kind, &hp, &mut a, &g, &mut st_a);
            let folded: Vec<f32> = g.iter().zip(&w).map(|(g, w)| g + 0.5 * w).collect();
            apply_row(kind, &plain, &mut b, &folded, &mut st_b);
            assert_eq!(a, b, "{kind:?}");
        }
        for kind in [DenseOptimizerKind::Sgd, DenseOptimizerKind::Adagrad, DenseOptimizerKind::Adam] {
            let (w, g) = ([0.3f32, -0.2, 0.7], [0.1f32, 0.4, -0.3]);
            let (mut a, mut b) = (w.to_vec(), w.to_vec());
            DenseOptimizer::new(kind, hp, 3).apply(&mut a, &g);
            let folded: Vec<f32> = g.iter().zip(&w).map(|(g, w)| g + 0.5 * w).collect();
            DenseOptimizer::new(kind, OptimizerParams::with_lr(0.1), 3).apply(&mut b, &folded);
            assert_eq!(a, b, "{kind:?}");
        }
    }

    #[test]
    fn a_row_update_reports_an_infinite_row_or_state_with_the_values_of_apply_row() {
        let kinds = [
            SparseOptimizerKind::Sgd,
            SparseOptimizerKind::RowwiseAdagrad,
            SparseOptimizerKind::LazyAdam,
            SparseOptimizerKind::Ftrl,
            SparseOptimizerKind::FtrlAdagrad,
        ];
        for kind in kinds {
            let hp = OptimizerParams::with_lr(0.1);
            let fresh = || {
                let mut state = vec![0.0; kind.state_width(3)];
                kind.init_state(&hp, &mut state);
                (vec![0.3f32, -0.2, 0.7], state)
            };
            // Finite updates, then the same values as `apply_row`.
            let ((mut a, mut sa), (mut b, mut sb)) = (fresh(), fresh());
            for g in [[0.1f32, 0.4, -0.3], [-2.0, 0.5, 1.0]] {
                assert!(apply_row_finite(kind, &hp, &mut a, &g, &mut sa), "{kind:?}");
                apply_row(kind, &hp, &mut b, &g, &mut sb);
            }
            assert_eq!((bits(&a), bits(&sa)), (bits(&b), bits(&sb)), "{kind:?}");
            // A finite gradient whose square overflows the accumulators (or, for
            // SGD, whose step overflows the row).
            let (mut row, mut state) = fresh();
            let huge = OptimizerParams::with_lr(f32::MAX);
            assert!(!apply_row_finite(kind, &huge, &mut row, &[3e38, 1.0, -1.0], &mut state), "{kind:?}");
        }
        // Row-wise Adagrad whose accumulator overflows leaves the row finite: the state tells.
        let hp = OptimizerParams::with_lr(0.1);
        let (mut row, mut acc) = (vec![0.5f32, 0.5], [0.0f32]);
        assert!(!apply_row_finite(SparseOptimizerKind::RowwiseAdagrad, &hp, &mut row, &[3e38, 3e38], &mut acc));
        assert!(row.iter().all(|v| v.is_finite()) && acc[0].is_infinite(), "{row:?} {acc:?}");
        // A row near f32::MAX pushed past it by an ordinary step.
        let (mut row, mut none) = (vec![f32::MAX, 0.0], []);
        assert!(!apply_row_finite(SparseOptimizerKind::Sgd, &hp, &mut row, &[-1e33, 0.0], &mut none));
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn set_lr_changes_the_step_size() {
        let mut opt = DenseOptimizer::new(DenseOptimizerKind::Sgd, OptimizerParams::with_lr(0.1), 1);
        let mut p = vec![1.0f32];
        opt.set_lr(0.05);
        opt.apply(&mut p, &[2.0]);
        assert_eq!(p, vec![0.9]);
    }

    #[test]
    fn hyper_parameters_are_validated_naming_the_key() {
        let ok = OptimizerParams::with_lr(0.1);
        assert!(ok.validate("sparse_").is_ok());
        let e = OptimizerParams { l2_penalty: -1.0, ..ok }.validate("sparse_").unwrap_err();
        assert!(e.to_string().contains("sparse_l2_penalty"), "{e}");
        let e = OptimizerParams { l1: f32::NAN, ..ok }.validate("sparse_").unwrap_err();
        assert!(e.to_string().contains("sparse_ftrl_l1"), "{e}");
        let e = OptimizerParams { lr: 0.0, ..ok }.validate("").unwrap_err();
        assert!(e.to_string().contains("lr"), "{e}");
        // Defaults stay out of JSON, so configurations written before these keys existed still match.
        let text = serde_json::to_string(&ok).unwrap();
        assert!(!text.contains("l2_penalty") && !text.contains("schedule"), "{text}");
        assert_eq!(serde_json::from_str::<OptimizerParams>(&text).unwrap(), ok);
    }

    #[test]
    fn names_parse_and_errors_name_key() {
        assert_eq!("adam".parse::<DenseOptimizerKind>().unwrap(), DenseOptimizerKind::Adam);
        assert!("lbfgs".parse::<DenseOptimizerKind>().unwrap_err().to_string().contains("optimizer"));
        assert_eq!("rowwise-adagrad".parse::<SparseOptimizerKind>().unwrap(), SparseOptimizerKind::RowwiseAdagrad);
    }
}
