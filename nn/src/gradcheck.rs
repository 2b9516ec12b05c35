//! Central finite differences in f64, the oracle for every `backward`.

/// Asserts that `analytic[i]` equals `d loss / d x[i]` by central differences,
/// within a mixed absolute/relative tolerance of 1e-6.
pub fn check_gradients(x: &[f64], analytic: &[f64], mut loss: impl FnMut(&[f64]) -> f64) {
    assert_eq!(x.len(), analytic.len());
    let eps = 1e-6;
    let mut probe = x.to_vec();
    for i in 0..x.len() {
        let orig = probe[i];
        probe[i] = orig + eps;
        let up = loss(&probe);
        probe[i] = orig - eps;
        let down = loss(&probe);
        probe[i] = orig;
        let numeric = (up - down) / (2.0 * eps);
        let err = (numeric - analytic[i]).abs();
        let scale = numeric.abs().max(analytic[i].abs()).max(1.0);
        assert!(err / scale < 1e-6, "gradient {i}: analytic {} vs numeric {} (err {err:e})", analytic[i], numeric);
    }
}
