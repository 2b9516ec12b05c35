//! Finiteness checks: the guard between a diverging run and its checkpoints.
//!
//! [`all_finite`] is the kernel (branch-free over blocks, so it vectorizes:
//! `x · 0` is `0` for every finite `x` and NaN for ±∞ and NaN);
//! [`all_finite_scalar`] is its oracle. Both answer the same for every input.

/// Lanes summed side by side.
const LANES: usize = 16;

/// True when no value of `xs` is infinite or NaN.
#[inline]
pub fn all_finite(xs: &[f32]) -> bool {
    let mut acc = [0.0f32; LANES];
    let blocks = xs.chunks_exact(LANES);
    let tail = blocks.remainder();
    for block in blocks {
        for (a, &x) in acc.iter_mut().zip(block) {
            *a += x * 0.0;
        }
    }
    for (a, &x) in acc.iter_mut().zip(tail) {
        *a += x * 0.0;
    }
    acc.iter().all(|a| *a == 0.0)
}

/// The reference for [`all_finite`].
pub fn all_finite_scalar(xs: &[f32]) -> bool {
    xs.iter().all(|x| x.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_equals_oracle_at_every_position_and_length() {
        for len in 0..70 {
            let base: Vec<f32> = (0..len).map(|i| (i as f32 - 30.0) * 1e36).collect();
            assert!(all_finite(&base) && all_finite_scalar(&base), "len {len}");
            for at in 0..len {
                for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
                    let mut xs = base.clone();
                    xs[at] = bad;
                    assert!(!all_finite(&xs), "len {len}, {bad} at {at}");
                    assert_eq!(all_finite(&xs), all_finite_scalar(&xs));
                }
            }
        }
        // Largest finite values stay finite (no overflow from the check itself).
        assert!(all_finite(&[f32::MAX; 40]) && all_finite(&[f32::MIN; 3]));
    }
}
