//! Attention pooling of a behaviour sequence against a target item (DIN/DIEN).
//!
//! For sample `b` with target `q` and keys `k_1 … k_L` (the first
//! `lengths[b]` of `T` padded positions):
//!
//! ```text
//! s_t = k_tᵀ · W · q          (bilinear score, W is D × D)
//! α   = softmax(s_1 … s_L)    (padding gets no weight)
//! out = Σ_t α_t · k_t          (an empty sequence pools to zeros)
//! ```
//!
//! `W` lives at `offset` in the flat parameter buffer.

use super::Scalar;

/// Bilinear softmax attention over `[B × T × D]` keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionPooling {
    /// Key / query width `D`.
    pub dim: usize,
    /// Where `W` starts in the flat parameter buffer.
    pub offset: usize,
}

/// Softmax weights kept for backward.
#[derive(Clone, Debug, Default)]
pub struct AttentionCache<T> {
    alpha: Vec<T>,
    wq: Vec<T>,
}

impl AttentionPooling {
    /// Number of parameters (`D²`).
    pub fn num_params(&self) -> usize {
        self.dim * self.dim
    }

    /// Identity-scaled initialisation `W = I / √D` (scores start as scaled dot products).
    pub fn init<T: Scalar>(&self, params: &mut [T]) {
        let d = self.dim;
        let w = &mut params[self.offset..self.offset + d * d];
        w.fill(T::ZERO);
        for i in 0..d {
            w[i * d + i] = T::from_f64(1.0 / (d as f64).sqrt());
        }
    }

    /// `out: [B × D]` from `query: [B × D]`, `keys: [B × T × D]`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward<T: Scalar>(
        &self,
        params: &[T],
        query: &[T],
        keys: &[T],
        lengths: &[usize],
        batch: usize,
        steps: usize,
        out: &mut [T],
        cache: &mut AttentionCache<T>,
    ) {
        let d = self.dim;
        let w = &params[self.offset..self.offset + d * d];
        cache.alpha.clear();
        cache.alpha.resize(batch * steps, T::ZERO);
        cache.wq.clear();
        cache.wq.resize(batch * d, T::ZERO);
        for b in 0..batch {
            let q = &query[b * d..(b + 1) * d];
            let wq = &mut cache.wq[b * d..(b + 1) * d];
            for i in 0..d {
                let mut s = T::ZERO;
                for j in 0..d {
                    s += w[i * d + j] * q[j];
                }
                wq[i] = s;
            }
            let len = lengths[b].min(steps);
            let o = &mut out[b * d..(b + 1) * d];
            o.fill(T::ZERO);
            if len == 0 {
                continue;
            }
            let alpha = &mut cache.alpha[b * steps..b * steps + len];
            let mut max = None::<T>;
            for (t, a) in alpha.iter_mut().enumerate() {
                let k = &keys[(b * steps + t) * d..(b * steps + t + 1) * d];
                let mut s = T::ZERO;
                for (x, y) in k.iter().zip(wq.iter()) {
                    s += *x * *y;
                }
                *a = s;
                max = Some(match max {
                    Some(m) if m >= s => m,
                    _ => s,
                });
            }
            let max = max.unwrap();
            let mut total = T::ZERO;
            for a in alpha.iter_mut() {
                *a = (*a - max).exp();
                total += *a;
            }
            for (t, a) in alpha.iter_mut().enumerate() {
                *a = *a / total;
                let k = &keys[(b * steps + t) * d..(b * steps + t + 1) * d];
                for (oi, &ki) in o.iter_mut().zip(k) {
                    *oi += *a * ki;
                }
            }
        }
    }

    /// Writes `dquery`, `dkeys` (overwritten) and the gradient of `W` (overwritten) from `dout`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: Scalar>(
        &self,
        params: &[T],
        query: &[T],
        keys: &[T],
        lengths: &[usize],
        batch: usize,
        steps: usize,
        dout: &[T],
        cache: &AttentionCache<T>,
        grads: &mut [T],
        dquery: &mut [T],
        dkeys: &mut [T],
    ) {
        let d = self.dim;
        let w = &params[self.offset..self.offset + d * d];
        let gw = &mut grads[self.offset..self.offset + d * d];
        gw.fill(T::ZERO);
        dquery[..batch * d].fill(T::ZERO);
        dkeys[..batch * steps * d].fill(T::ZERO);
        let mut ds = vec![T::ZERO; steps];
        let mut kbar = vec![T::ZERO; d];
        for b in 0..batch {
            let len = lengths[b].min(steps);
            let g = &dout[b * d..(b + 1) * d];
            let alpha = &cache.alpha[b * steps..b * steps + len];
            let wq = &cache.wq[b * d..(b + 1) * d];
            let q = &query[b * d..(b + 1) * d];
            // dα_t = ⟨g, k_t⟩; ds_t = α_t (dα_t − Σ α_u dα_u)
            let mut mean = T::ZERO;
            for t in 0..len {
                let k = &keys[(b * steps + t) * d..(b * steps + t + 1) * d];
                let mut da = T::ZERO;
                for (x, y) in g.iter().zip(k) {
                    da += *x * *y;
                }
                ds[t] = da;
                mean += alpha[t] * da;
            }
            // dk_t = α_t g + ds_t W q, and k̄ = Σ_t ds_t k_t, so that
            // dq = Wᵀ k̄ and dW += k̄ qᵀ cost O(D²) per sample, not per step.
            kbar.fill(T::ZERO);
            for t in 0..len {
                ds[t] = alpha[t] * (ds[t] - mean);
                let k = &keys[(b * steps + t) * d..(b * steps + t + 1) * d];
                let dk = &mut dkeys[(b * steps + t) * d..(b * steps + t + 1) * d];
                for c in 0..d {
                    dk[c] = alpha[t] * g[c] + ds[t] * wq[c];
                    kbar[c] += ds[t] * k[c];
                }
            }
            if len == 0 {
                continue;
            }
            let dq = &mut dquery[b * d..(b + 1) * d];
            for i in 0..d {
                let (row, ki) = (&w[i * d..(i + 1) * d], kbar[i]);
                for (o, &wij) in dq.iter_mut().zip(row) {
                    *o += ki * wij;
                }
                for (o, &qj) in gw[i * d..(i + 1) * d].iter_mut().zip(q) {
                    *o += ki * qj;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use tiderec_records::rng::normal_f64;

    #[test]
    fn attention_gradients_match_finite_differences() {
        let att = AttentionPooling { dim: 3, offset: 2 };
        let (batch, steps) = (3, 4);
        let mut params = vec![0.0f64; 2 + att.num_params()];
        for (i, p) in params.iter_mut().enumerate() {
            *p = normal_f64(1, 0, i as u64, 0) * 0.5;
        }
        let q: Vec<f64> = (0..batch * 3).map(|i| normal_f64(2, 0, i as u64, 0)).collect();
        let k: Vec<f64> = (0..batch * steps * 3).map(|i| normal_f64(3, 0, i as u64, 0)).collect();
        let lengths = [4, 1, 0];
        let r: Vec<f64> = (0..batch * 3).map(|i| normal_f64(4, 0, i as u64, 0)).collect();
        let loss = |p: &[f64], q: &[f64], k: &[f64]| {
            let mut out = vec![0.0; batch * 3];
            att.forward(p, q, k, &lengths, batch, steps, &mut out, &mut AttentionCache::default());
            out.iter().zip(&r).map(|(a, b)| a * b).sum::<f64>()
        };
        let mut cache = AttentionCache::default();
        let mut out = vec![0.0; batch * 3];
        att.forward(&params, &q, &k, &lengths, batch, steps, &mut out, &mut cache);
        assert!(out[6..].iter().all(|&v| v == 0.0), "an empty sequence pools to zeros");
        // A single key gets all the weight.
        for c in 0..3 {
            assert!((out[3 + c] - k[(steps) * 3 + c]).abs() < 1e-12);
        }
        let mut grads = vec![0.0; params.len()];
        let (mut dq, mut dk) = (vec![0.0; q.len()], vec![0.0; k.len()]);
        att.backward(&params, &q, &k, &lengths, batch, steps, &r, &cache, &mut grads, &mut dq, &mut dk);
        check_gradients(&params[2..], &grads[2..], |p| {
            let mut full = params.clone();
            full[2..].copy_from_slice(p);
            loss(&full, &q, &k)
        });
        check_gradients(&q, &dq, |x| loss(&params, x, &k));
        check_gradients(&k, &dk, |x| loss(&params, &q, x));
    }
}
