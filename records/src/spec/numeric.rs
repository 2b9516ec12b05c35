//! Numeric transforms of a spec learned from a sample: scales of dense values and bucket
//! boundaries of numeric columns read as categories.
//!
//! Invariants:
//! * A scale maps `v` to `(v − center) / width` in `f32` arithmetic, exactly as written, so
//!   any reader (the NumPy reference scorer included) reproduces it bit for bit; `width` is
//!   finite and positive (a constant column gets width 1, its values all become 0).
//! * Bucket `k` of boundaries `b` holds the values `b[k−1] ≤ v < b[k]`: the id of `v` is the
//!   number of boundaries at or below it, so ids run from 0 to `b.len()`; boundaries are
//!   finite and strictly ascending.
//! * Fitting is a pure function of the values in their order of reading: the same sample
//!   gives the same statistics, whoever reads it.

use serde::{Deserialize, Serialize};

/// How a dense value is scaled, after its clamp and `log1p`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    /// `center` the sample's mean, `width` its standard deviation.
    Standardize,
    /// `center` the sample's minimum, `width` its range: the sample maps onto `[0, 1]`.
    MinMax,
}

/// The finite `f32` that `raw` spells, if any (the number of a bucketized column).
#[inline]
pub fn finite_number(raw: &[u8]) -> Option<f32> {
    fast_float2::parse::<f32, _>(raw).ok().filter(|v| v.is_finite())
}

/// `(v − center) / width` in `f32`.
#[inline]
pub fn scaled(v: f32, center: f32, width: f32) -> f32 {
    (v - center) / width
}

/// The `(center, width)` of `scale` over `values` (non-finite ones are skipped), or `None`
/// without a finite value. Sums are in `f64`, in the values' order.
pub fn fit_scale(scale: Scale, values: &[f32]) -> Option<(f32, f32)> {
    let finite = values.iter().copied().filter(|v| v.is_finite());
    let (center, width) = match scale {
        Scale::Standardize => {
            let (mut n, mut sum) = (0u64, 0f64);
            for v in finite.clone() {
                n += 1;
                sum += v as f64;
            }
            if n == 0 {
                return None;
            }
            let mean = sum / n as f64;
            let var = finite.map(|v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
            (mean as f32, var.sqrt() as f32)
        }
        Scale::MinMax => {
            let (lo, hi) = finite.fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
            if lo > hi {
                return None;
            }
            (lo, hi - lo)
        }
    };
    let width = if width.is_finite() && width > 0.0 { width } else { 1.0 };
    Some((center, width))
}

/// The id of `v` among `boundaries`: how many of them are at or below `v`.
#[inline]
pub fn bucket_of(boundaries: &[f32], v: f32) -> u64 {
    boundaries.partition_point(|&b| b <= v) as u64
}

/// The scalar oracle of [`bucket_of`]: a linear count.
pub fn bucket_of_scalar(boundaries: &[f32], v: f32) -> u64 {
    boundaries.iter().filter(|&&b| b <= v).count() as u64
}

/// Boundaries cutting `values` (non-finite ones skipped) into at most `buckets` groups of
/// about equal count: the values at ranks `⌊k·n / buckets⌋` of the sorted sample for
/// `k = 1 … buckets − 1`, repeated values kept once (a value cannot split its own
/// group) and the smallest value dropped (nothing lies below it). Empty without values.
///
/// Time and memory are `O(n log n)` in the `n` values, whatever `buckets` (up to
/// `u64::MAX`): only the at most `n` distinct ranks are visited.
pub fn quantile_boundaries(values: &[f32], buckets: u64) -> Vec<f32> {
    let mut sorted: Vec<f32> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() || buckets < 2 {
        return Vec::new();
    }
    sorted.sort_by(f32::total_cmp);
    let mut cuts: Vec<f32> = quantile_ranks(sorted.len(), buckets).map(|r| sorted[r]).collect();
    cuts.dedup();
    cuts.retain(|&b| b > sorted[0]);
    cuts
}

/// The distinct ranks `⌊k·n / buckets⌋` for `k = 1 … buckets − 1`, ascending (`n ≥ 1`,
/// `buckets ≥ 2`). Rank `r < n` is one exactly when the least `k` reaching it,
/// `max(1, ⌈r·buckets / n⌉)`, is below `buckets` and does not overshoot it; so at most `n`
/// ranks are looked at, not `buckets − 1` (which may be 10¹²).
fn quantile_ranks(n: usize, buckets: u64) -> impl Iterator<Item = usize> {
    let (n128, b) = (n as u128, buckets as u128);
    (0..n).filter(move |&r| {
        let k = (r as u128 * b).div_ceil(n128).max(1);
        k < b && k * n128 / b == r as u128
    })
}

/// Checks boundaries given or learned: finite and strictly ascending; the error says why.
pub fn check_boundaries(boundaries: &[f32]) -> Result<(), String> {
    if let Some(b) = boundaries.iter().find(|b| !b.is_finite()) {
        return Err(format!("{b} is not a finite number"));
    }
    if let Some(w) = boundaries.windows(2).find(|w| w[0] >= w[1]) {
        return Err(format!("not strictly ascending: {} then {}", w[0], w[1]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standardize_and_min_max_by_hand() {
        let v = [1.0f32, 2.0, 3.0, 4.0, f32::NAN];
        // mean 2.5, population variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25.
        assert_eq!(fit_scale(Scale::Standardize, &v), Some((2.5, 1.25f64.sqrt() as f32)));
        assert_eq!(fit_scale(Scale::MinMax, &v), Some((1.0, 3.0)));
        assert_eq!(scaled(4.0, 1.0, 3.0), 1.0);
        // A constant column has width 1; no finite value, no statistics.
        assert_eq!(fit_scale(Scale::Standardize, &[7.0, 7.0]), Some((7.0, 1.0)));
        assert_eq!(fit_scale(Scale::MinMax, &[7.0]), Some((7.0, 1.0)));
        assert_eq!(fit_scale(Scale::MinMax, &[f32::INFINITY]), None);
    }

    #[test]
    fn buckets_count_the_boundaries_at_or_below_and_match_the_oracle() {
        let b = [0.0f32, 1.5, 10.0];
        for (v, id) in [(-1.0, 0), (0.0, 1), (1.0, 1), (1.5, 2), (9.9, 2), (10.0, 3), (1e30, 3)] {
            assert_eq!(bucket_of(&b, v), id, "{v}");
        }
        let mut state = 7u64;
        for _ in 0..2000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let v = ((state >> 33) as f32 / 2f32.powi(31)) * 24.0 - 12.0;
            assert_eq!(bucket_of(&b, v), bucket_of_scalar(&b, v));
            assert_eq!(bucket_of(&[], v), 0);
        }
    }

    #[test]
    fn quantiles_cut_equal_counts_and_skip_repeats() {
        let v: Vec<f32> = (0..100).map(|i| i as f32).collect();
        assert_eq!(quantile_boundaries(&v, 4), vec![25.0, 50.0, 75.0]);
        let ids: Vec<u64> = v.iter().map(|&x| bucket_of(&quantile_boundaries(&v, 4), x)).collect();
        for k in 0..4 {
            assert_eq!(ids.iter().filter(|&&i| i == k).count(), 25);
        }
        // Mostly zeros: one cut where the zeros end, none below the smallest value.
        let skewed: Vec<f32> = (0..10).map(|i| if i < 8 { 0.0 } else { i as f32 }).collect();
        assert_eq!(quantile_boundaries(&skewed, 5), vec![8.0]);
        assert!(quantile_boundaries(&[], 5).is_empty());
        assert!(check_boundaries(&quantile_boundaries(&v, 7)).is_ok());
        assert!(check_boundaries(&[1.0, 1.0]).unwrap_err().contains("ascending"));
        assert!(check_boundaries(&[f32::NAN]).unwrap_err().contains("finite"));
    }

    /// The old formula, `buckets − 1` ranks then dedup: the oracle for small bucket counts.
    fn quantile_oracle(values: &[f32], buckets: u64) -> Vec<f32> {
        let mut sorted: Vec<f32> = values.iter().copied().filter(|v| v.is_finite()).collect();
        if sorted.is_empty() || buckets < 2 {
            return Vec::new();
        }
        sorted.sort_by(f32::total_cmp);
        let n = sorted.len() as u128;
        let mut cuts: Vec<f32> = (1..buckets as u128).map(|k| sorted[(k * n / buckets as u128) as usize]).collect();
        cuts.dedup();
        cuts.retain(|&b| b > sorted[0]);
        cuts
    }

    /// A huge bucket count (`buckets = 1000000000000` in a spec) visits only the sample's
    /// ranks: it returns at once, with every value above the smallest as a boundary, as a
    /// bucket count just above the sample's size gives.
    #[test]
    fn huge_bucket_counts_cost_only_the_sample() {
        let start = std::time::Instant::now();
        assert_eq!(quantile_boundaries(&[1.0, 2.0, 3.0], 1 << 40), vec![2.0, 3.0]);
        assert_eq!(quantile_boundaries(&[3.0, 1.0, 2.0], u64::MAX), quantile_oracle(&[1.0, 2.0, 3.0], 4));
        assert_eq!(quantile_boundaries(&[5.0; 7], 1_000_000_000_000), Vec::<f32>::new());
        assert!(start.elapsed() < std::time::Duration::from_secs(1), "{:?}", start.elapsed());
        let mut state = 11u64;
        for n in [1usize, 2, 3, 7, 10, 64, 100] {
            let values: Vec<f32> = (0..n)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((state >> 40) % 13) as f32
                })
                .collect();
            for buckets in [2u64, 3, 4, 5, 9, 10, 11, 63, 64, 65, 99, 100, 101, 250] {
                let want = quantile_oracle(&values, buckets);
                assert_eq!(quantile_boundaries(&values, buckets), want, "n {n} buckets {buckets}");
            }
        }
    }
}
