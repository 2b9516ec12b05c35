//! Binary cross-entropy on logits, computed stably.

use super::Scalar;

/// `Σᵢ BCE(σ(logitᵢ), labelᵢ)` in f64, using `max(x,0) − x·y + ln(1 + e^{−|x|})`.
pub fn bce_with_logits_sum<T: Scalar>(logits: &[T], labels: &[f32]) -> f64 {
    logits
        .iter()
        .zip(labels)
        .map(|(&x, &y)| {
            let x = x.to_f64();
            x.max(0.0) - x * y as f64 + (-x.abs()).exp().ln_1p()
        })
        .sum()
}

/// The logistic function, stable for large `|x|`.
#[inline]
pub fn sigmoid<T: Scalar>(x: T) -> T {
    if x >= T::ZERO {
        T::ONE / (T::ONE + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::ONE + e)
    }
}

/// `1 / (1 + e^{−x})` without branches (vectorises); saturates cleanly at both ends.
#[inline(always)]
pub fn sigmoid_fast<T: Scalar>(x: T) -> T {
    T::ONE / (T::ONE + (-x).exp_fast())
}

/// `d/dlogit Σ BCE = σ(logit) − label`, scaled by `scale`, written into `grad`.
pub fn bce_with_logits_grad<T: Scalar>(logits: &[T], labels: &[f32], scale: T, grad: &mut [T]) {
    for ((g, &x), &y) in grad.iter_mut().zip(logits).zip(labels) {
        *g = (sigmoid(x) - T::from_f64(y as f64)) * scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;

    #[test]
    fn bce_gradient_and_stability() {
        let logits = [-3.0f64, -0.2, 0.0, 0.7, 40.0];
        let labels = [0.0f32, 1.0, 1.0, 0.0, 1.0];
        let mut g = vec![0.0; 5];
        bce_with_logits_grad(&logits, &labels, 1.0, &mut g);
        check_gradients(&logits, &g, |x| bce_with_logits_sum(x, &labels));
        assert!(bce_with_logits_sum(&[1000.0f32], &[0.0]).is_finite());
        assert!((bce_with_logits_sum(&[0.0f64], &[1.0]) - 2f64.ln()).abs() < 1e-12);
    }
}
