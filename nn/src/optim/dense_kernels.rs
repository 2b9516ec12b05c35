//! The dense optimizers' update loops: a scalar definition of each (the
//! oracle) and an AVX-512F version used when the CPU has it.
//!
//! Invariant: each vector kernel performs, lane by lane, exactly the scalar
//! definition's operations in the same order (no fused multiply-add, no
//! reassociation; division and square root are correctly rounded in both), so
//! the two give equal results bit for bit and the choice never changes a run.
//! Loops whose length is not a multiple of sixteen finish with the scalar code.

/// `p ← p − lr·(g·scale)`.
pub fn sgd_scalar(params: &mut [f32], grads: &[f32], lr: f32, scale: f32) {
    for (p, g) in params.iter_mut().zip(grads) {
        *p -= lr * (g * scale);
    }
}

/// `g ← g·scale; v ← v + g²; p ← p − lr·g / (√v + eps)`.
pub fn adagrad_scalar(params: &mut [f32], grads: &[f32], v: &mut [f32], lr: f32, eps: f32, scale: f32) {
    for ((p, g), v) in params.iter_mut().zip(grads).zip(v) {
        let g = g * scale;
        *v += g * g;
        *p -= lr * g / (v.sqrt() + eps);
    }
}

/// The constants of one Adam step.
#[derive(Clone, Copy, Debug)]
pub struct AdamStep {
    /// `β₁`.
    pub beta1: f32,
    /// `β₂`.
    pub beta2: f32,
    /// `lr / (1 − β₁ᵗ)`.
    pub step: f32,
    /// `√(1 − β₂ᵗ)`.
    pub bc2_sqrt: f32,
    /// `ε`.
    pub eps: f32,
    /// The gradient's scale.
    pub scale: f32,
}

/// `g ← g·scale; m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g·g; p ← p − step·m / (√v / √bc₂ + eps)`.
pub fn adam_scalar(params: &mut [f32], grads: &[f32], m: &mut [f32], v: &mut [f32], c: AdamStep) {
    let AdamStep { beta1, beta2, step, bc2_sqrt, eps, scale } = c;
    for (((p, g), m), v) in params.iter_mut().zip(grads).zip(m).zip(v) {
        let g = g * scale;
        *m = beta1 * *m + (1.0 - beta1) * g;
        *v = beta2 * *v + (1.0 - beta2) * g * g;
        *p -= step * *m / (v.sqrt() / bc2_sqrt + eps);
    }
}

/// Whether the AVX-512F kernels run here: the CPU has AVX-512F and
/// `TIDEREC_MAX_ISA` allows it ([`tiderec_records::cpu`]).
#[inline]
pub fn has_avx512() -> bool {
    tiderec_records::cpu::has(tiderec_records::cpu::Feature::Avx512F)
}

/// [`sgd_scalar`], on 512-bit vectors where the CPU has them.
pub fn sgd(params: &mut [f32], grads: &[f32], lr: f32, scale: f32) {
    let n = params.len().min(grads.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F is present; the kernel reads and writes the first `n` values of each slice.
        let done = unsafe { x86::sgd(&mut params[..n], &grads[..n], lr, scale) };
        return sgd_scalar(&mut params[done..n], &grads[done..n], lr, scale);
    }
    sgd_scalar(&mut params[..n], &grads[..n], lr, scale)
}

/// [`adagrad_scalar`], on 512-bit vectors where the CPU has them.
pub fn adagrad(params: &mut [f32], grads: &[f32], v: &mut [f32], lr: f32, eps: f32, scale: f32) {
    let n = params.len().min(grads.len()).min(v.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: as in `sgd`.
        let done = unsafe { x86::adagrad(&mut params[..n], &grads[..n], &mut v[..n], lr, eps, scale) };
        return adagrad_scalar(&mut params[done..n], &grads[done..n], &mut v[done..n], lr, eps, scale);
    }
    adagrad_scalar(&mut params[..n], &grads[..n], &mut v[..n], lr, eps, scale)
}

/// [`adam_scalar`], on 512-bit vectors where the CPU has them.
pub fn adam(params: &mut [f32], grads: &[f32], m: &mut [f32], v: &mut [f32], c: AdamStep) {
    let n = params.len().min(grads.len()).min(m.len()).min(v.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: as in `sgd`.
        let done = unsafe { x86::adam(&mut params[..n], &grads[..n], &mut m[..n], &mut v[..n], c) };
        return adam_scalar(&mut params[done..n], &grads[done..n], &mut m[done..n], &mut v[done..n], c);
    }
    adam_scalar(&mut params[..n], &grads[..n], &mut m[..n], &mut v[..n], c)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::AdamStep;
    use std::arch::x86_64::*;

    /// Whole vectors of sixteen only; returns how many values were updated.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sgd(params: &mut [f32], grads: &[f32], lr: f32, scale: f32) -> usize {
        let n = params.len() / 16 * 16;
        let (lr, scale) = (_mm512_set1_ps(lr), _mm512_set1_ps(scale));
        let (p, g) = (params.as_mut_ptr(), grads.as_ptr());
        for i in (0..n).step_by(16) {
            let gv = _mm512_mul_ps(_mm512_loadu_ps(g.add(i)), scale);
            let pv = _mm512_sub_ps(_mm512_loadu_ps(p.add(i)), _mm512_mul_ps(lr, gv));
            _mm512_storeu_ps(p.add(i), pv);
        }
        n
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn adagrad(
        params: &mut [f32],
        grads: &[f32],
        v: &mut [f32],
        lr: f32,
        eps: f32,
        scale: f32,
    ) -> usize {
        let n = params.len() / 16 * 16;
        let (lr, eps, scale) = (_mm512_set1_ps(lr), _mm512_set1_ps(eps), _mm512_set1_ps(scale));
        let (p, g, vp) = (params.as_mut_ptr(), grads.as_ptr(), v.as_mut_ptr());
        for i in (0..n).step_by(16) {
            let gv = _mm512_mul_ps(_mm512_loadu_ps(g.add(i)), scale);
            let vv = _mm512_add_ps(_mm512_loadu_ps(vp.add(i)), _mm512_mul_ps(gv, gv));
            _mm512_storeu_ps(vp.add(i), vv);
            let den = _mm512_add_ps(_mm512_sqrt_ps(vv), eps);
            let pv = _mm512_sub_ps(_mm512_loadu_ps(p.add(i)), _mm512_div_ps(_mm512_mul_ps(lr, gv), den));
            _mm512_storeu_ps(p.add(i), pv);
        }
        n
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn adam(params: &mut [f32], grads: &[f32], m: &mut [f32], v: &mut [f32], c: AdamStep) -> usize {
        let n = params.len() / 16 * 16;
        let b1 = _mm512_set1_ps(c.beta1);
        let b2 = _mm512_set1_ps(c.beta2);
        let one_b1 = _mm512_set1_ps(1.0 - c.beta1);
        let one_b2 = _mm512_set1_ps(1.0 - c.beta2);
        let (step, bc2_sqrt) = (_mm512_set1_ps(c.step), _mm512_set1_ps(c.bc2_sqrt));
        let (eps, scale) = (_mm512_set1_ps(c.eps), _mm512_set1_ps(c.scale));
        let (p, g, mp, vp) = (params.as_mut_ptr(), grads.as_ptr(), m.as_mut_ptr(), v.as_mut_ptr());
        for i in (0..n).step_by(16) {
            let gv = _mm512_mul_ps(_mm512_loadu_ps(g.add(i)), scale);
            let mv = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(mp.add(i))), _mm512_mul_ps(one_b1, gv));
            // (1 − β₂)·g·g groups left to right, as in the scalar definition.
            let vv = _mm512_add_ps(
                _mm512_mul_ps(b2, _mm512_loadu_ps(vp.add(i))),
                _mm512_mul_ps(_mm512_mul_ps(one_b2, gv), gv),
            );
            _mm512_storeu_ps(mp.add(i), mv);
            _mm512_storeu_ps(vp.add(i), vv);
            let den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vv), bc2_sqrt), eps);
            let pv = _mm512_sub_ps(_mm512_loadu_ps(p.add(i)), _mm512_div_ps(_mm512_mul_ps(step, mv), den));
            _mm512_storeu_ps(p.add(i), pv);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn values(seed: u64, n: usize, spread: f64) -> Vec<f32> {
        (0..n).map(|i| ((tiderec_records::rng::unit_f64(seed, i as u64, 0, 0) - 0.5) * spread) as f32).collect()
    }

    proptest! {
        /// Every kernel equals its scalar definition bit for bit, on lengths
        /// around the vector width, over several steps (state carried).
        #[test]
        fn vector_updates_equal_the_scalar_definitions(n in 0usize..70, seed in any::<u64>(), lr in 1e-4f32..1.0, scale in 1e-3f32..1.0) {
            let p0 = values(seed, n, 2.0);
            let (mut p1, mut p2) = (p0.clone(), p0.clone());
            let v0: Vec<f32> = values(seed ^ 1, n, 1.0).iter().map(|x| x.abs()).collect();
            let (mut v1, mut v2) = (v0.clone(), v0.clone());
            let m0 = values(seed ^ 2, n, 0.2);
            let (mut m1, mut m2) = (m0.clone(), m0.clone());
            let (mut q1, mut q2) = (p0.clone(), p0.clone());
            let (mut r1, mut r2) = (p0.clone(), p0.clone());
            let (mut w1, mut w2) = (v0.clone(), v0.clone());
            for t in 1..4 {
                let g = values(seed ^ (10 + t), n, 3.0);
                sgd(&mut p1, &g, lr, scale);
                sgd_scalar(&mut p2, &g, lr, scale);
                adagrad(&mut q1, &g, &mut v1, lr, 1e-8, scale);
                adagrad_scalar(&mut q2, &g, &mut v2, lr, 1e-8, scale);
                let c = AdamStep { beta1: 0.9, beta2: 0.999, step: lr / (1.0 - 0.9f32.powi(t as i32)), bc2_sqrt: (1.0 - 0.999f32.powi(t as i32)).sqrt(), eps: 1e-8, scale };
                adam(&mut r1, &g, &mut m1, &mut w1, c);
                adam_scalar(&mut r2, &g, &mut m2, &mut w2, c);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&p1), bits(&p2));
            prop_assert_eq!(bits(&q1), bits(&q2));
            prop_assert_eq!(bits(&v1), bits(&v2));
            prop_assert_eq!(bits(&r1), bits(&r2));
            prop_assert_eq!(bits(&m1), bits(&m2));
            prop_assert_eq!(bits(&w1), bits(&w2));
        }
    }

    /// A long slice (mostly whole vectors) through Adagrad, the DLRM default:
    /// equal bit for bit; where the CPU lacks AVX-512F both sides are the
    /// scalar definition, which the test says.
    #[test]
    fn long_adagrad_update_equals_the_scalar_definition() {
        if !has_avx512() {
            eprintln!("no AVX-512F on this CPU: the comparison is scalar against scalar");
        }
        let n = 475_985;
        let g = values(3, n, 0.1);
        let (mut p1, mut v1) = (values(4, n, 1.0), vec![0.1f32; n]);
        let (mut p2, mut v2) = (p1.clone(), v1.clone());
        adagrad(&mut p1, &g, &mut v1, 0.01, 1e-8, 1.0 / 128.0);
        adagrad_scalar(&mut p2, &g, &mut v2, 0.01, 1e-8, 1.0 / 128.0);
        assert!(p1.iter().zip(&p2).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(v1.iter().zip(&v2).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert_ne!(p1, values(4, n, 1.0), "the update changed the parameters");
    }
}
