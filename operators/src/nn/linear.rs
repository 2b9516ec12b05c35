//! Fully connected layer `y = x·Wᵀ + b`.
//!
//! `W` is `[output × input]` row-major at `offset` in the model's flat
//! parameter buffer, followed by `b` (`output` values).

use super::gemm::{gemm, Op};
use super::gemm_packed::{gemm_packed, PackedRhs};
use super::Scalar;
use crate::rng::normal_f64;

/// A fully connected layer addressing its weights inside a flat buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Linear {
    /// Input width.
    pub input: usize,
    /// Output width.
    pub output: usize,
    /// Where `W` starts in the flat parameter buffer.
    pub offset: usize,
}

impl Linear {
    /// Number of parameters (`W` and `b`).
    pub fn num_params(&self) -> usize {
        self.output * self.input + self.output
    }

    fn bias_offset(&self) -> usize {
        self.offset + self.output * self.input
    }

    /// DLRM's initialisation: `W ~ N(0, 2/(in+out))`, `b ~ N(0, 1/out)`,
    /// drawn from counter-based randomness keyed by `(seed, tag)`.
    pub fn init<T: Scalar>(&self, params: &mut [T], seed: u64, tag: u64) {
        let w_std = (2.0 / (self.input + self.output) as f64).sqrt();
        let b_std = (1.0 / self.output as f64).sqrt();
        let nw = self.output * self.input;
        for (i, p) in params[self.offset..self.offset + nw].iter_mut().enumerate() {
            *p = T::from_f64(normal_f64(seed, tag, 0, i as u64) * w_std);
        }
        let bo = self.bias_offset();
        for (i, p) in params[bo..bo + self.output].iter_mut().enumerate() {
            *p = T::from_f64(normal_f64(seed, tag, 1, i as u64) * b_std);
        }
    }

    /// `y[batch × output] = x[batch × input] · Wᵀ + b`; `packed` is scratch
    /// space for `Wᵀ` (reused across calls, no allocation once large enough).
    ///
    /// The product runs on one of two kernels, chosen by shape from measurements
    /// (`examples/linear_forward.rs`): a general GEMM packs both operands every
    /// call and reads `W` across its rows to do so (the slow direction); the
    /// packed kernel transposes `W` once in 8 × 8 register tiles and reads `x`
    /// where it lies. At a worker's micro-batch of 64 rows the packed kernel is
    /// 1.2–1.5× faster on DLRM's layers; at 1,024 rows only on narrow outputs.
    #[inline(never)]
    pub fn forward<T: Scalar>(&self, params: &[T], x: &[T], batch: usize, y: &mut [T], packed: &mut PackedRhs<T>) {
        let w = &params[self.offset..self.offset + self.output * self.input];
        let b = &params[self.bias_offset()..self.bias_offset() + self.output];
        let y = &mut y[..batch * self.output];
        for row in y.chunks_exact_mut(self.output) {
            row.copy_from_slice(b);
        }
        if self.forward_is_packed::<T>(batch) {
            packed.pack(Op::T, self.input, self.output, w);
            gemm_packed(batch, x, self.input, packed, true, y, self.output);
        } else {
            gemm(Op::N, Op::T, batch, self.output, self.input, T::ONE, x, w, T::ONE, y);
        }
    }

    /// Whether [`forward`](Self::forward) uses the packed kernel for `batch` rows:
    /// only where it runs vectorized (not in `f64` or without AVX2), not for a
    /// reduction or an output too short to fill its vectors, and at large
    /// batches only for outputs of at most 64 (where the general GEMM's cache
    /// blocking of wide outputs wins).
    fn forward_is_packed<T: Scalar>(&self, batch: usize) -> bool {
        T::packed_panel_is_vectorized() && self.input >= 16 && self.output >= 8 && (batch <= 256 || self.output <= 64)
    }

    /// Writes `dW = dyᵀ·x` and `db = Σ dy` into `grads`, and `dx = dy·W` when asked.
    #[inline(never)]
    pub fn backward<T: Scalar>(
        &self,
        params: &[T],
        x: &[T],
        dy: &[T],
        batch: usize,
        grads: &mut [T],
        dx: Option<&mut [T]>,
    ) {
        let nw = self.output * self.input;
        let (gw, gb) = grads[self.offset..self.offset + nw + self.output].split_at_mut(nw);
        gemm(Op::T, Op::N, self.output, self.input, batch, T::ONE, dy, x, T::ZERO, gw);
        gb.fill(T::ZERO);
        for row in dy[..batch * self.output].chunks_exact(self.output) {
            for (g, &d) in gb.iter_mut().zip(row) {
                *g += d;
            }
        }
        if let Some(dx) = dx {
            let w = &params[self.offset..self.offset + nw];
            gemm(Op::N, Op::N, batch, self.input, self.output, T::ONE, dy, w, T::ZERO, dx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::gradcheck::check_gradients;

    #[test]
    fn linear_gradients_match_finite_differences() {
        let lin = Linear { input: 5, output: 3, offset: 2 };
        let batch = 4;
        let mut params = vec![0.0f64; 2 + lin.num_params()];
        lin.init(&mut params, 1, 0);
        let x: Vec<f64> = (0..batch * 5).map(|i| crate::rng::normal_f64(3, 0, i as u64, 0)).collect();
        let r: Vec<f64> = (0..batch * 3).map(|i| crate::rng::normal_f64(4, 0, i as u64, 0)).collect();
        // loss = Σ r ⊙ y, so dy = r.
        let loss = |p: &[f64], x: &[f64]| {
            let mut y = vec![0.0; batch * 3];
            lin.forward(p, x, batch, &mut y, &mut PackedRhs::default());
            y.iter().zip(&r).map(|(a, b)| a * b).sum::<f64>()
        };
        let mut grads = vec![0.0; params.len()];
        let mut dx = vec![0.0; x.len()];
        lin.backward(&params, &x, &r, batch, &mut grads, Some(&mut dx));
        check_gradients(&params[2..], &grads[2..], |p| {
            let mut full = params.clone();
            full[2..].copy_from_slice(p);
            loss(&full, &x)
        });
        check_gradients(&x, &dx, |xx| loss(&params, xx));
    }

    /// Both forward kernels (small batch: packed; large batch and wide output:
    /// general GEMM) agree with the plain definition.
    #[test]
    fn forward_kernels_agree_with_the_definition() {
        for (input, output, batch) in [(40, 24, 5), (40, 24, 300), (40, 100, 300), (7, 9, 3), (20, 3, 4)] {
            let lin = Linear { input, output, offset: 0 };
            let mut params = vec![0.0f32; lin.num_params()];
            lin.init(&mut params, 2, 0);
            let x: Vec<f32> = (0..batch * input).map(|i| crate::rng::normal_f64(8, 0, i as u64, 0) as f32).collect();
            let mut y = vec![0.0f32; batch * output];
            lin.forward(&params, &x, batch, &mut y, &mut PackedRhs::default());
            for b in 0..batch {
                for j in 0..output {
                    let want = params[input * output + j] as f64
                        + (0..input).map(|i| x[b * input + i] as f64 * params[j * input + i] as f64).sum::<f64>();
                    let got = y[b * output + j] as f64;
                    assert!(
                        (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "{input}->{output} b{batch}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
