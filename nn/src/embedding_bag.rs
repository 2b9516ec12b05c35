//! Sum-pooled (optionally weighted) embedding bags over gathered rows.
//!
//! A worker first gathers the distinct rows a batch needs (`unique`, `[U × dim]`);
//! each bag then refers to those rows by index. Pooling writes
//! `pooled[b, field, :] = Σ w[k] · unique[index[k], :]` for the bag's entries `k`,
//! where `w` is the field's per-entry weights ([`tiderec_records::SparseField::weights`],
//! `1/n` for mean pooling) or 1 for every entry when the field has none;
//! an empty bag pools to zeros.

use super::Scalar;

/// Pools one field: `offsets` (`B + 1`) delimit each sample's entries in `index`.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
pub fn pool_sum<T: Scalar>(
    unique: &[T],
    dim: usize,
    offsets: &[u32],
    index: &[u32],
    weights: Option<&[f32]>,
    field: usize,
    num_fields: usize,
    pooled: &mut [T],
) {
    let batch = offsets.len() - 1;
    for b in 0..batch {
        let out = &mut pooled[(b * num_fields + field) * dim..(b * num_fields + field + 1) * dim];
        out.fill(T::ZERO);
        let (lo, hi) = (offsets[b] as usize, offsets[b + 1] as usize);
        match weights {
            None => {
                for &u in &index[lo..hi] {
                    let row = &unique[u as usize * dim..(u as usize + 1) * dim];
                    for (o, &r) in out.iter_mut().zip(row) {
                        *o += r;
                    }
                }
            }
            Some(w) => {
                for (&u, &wk) in index[lo..hi].iter().zip(&w[lo..hi]) {
                    let wk = T::from_f64(wk as f64);
                    let row = &unique[u as usize * dim..(u as usize + 1) * dim];
                    for (o, &r) in out.iter_mut().zip(row) {
                        *o += wk * r;
                    }
                }
            }
        }
    }
}

/// The adjoint of [`pool_sum`]: adds each bag's gradient, times the entry's
/// weight, to its rows in `dunique`.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
pub fn pool_sum_backward<T: Scalar>(
    dpooled: &[T],
    dim: usize,
    offsets: &[u32],
    index: &[u32],
    weights: Option<&[f32]>,
    field: usize,
    num_fields: usize,
    dunique: &mut [T],
) {
    let batch = offsets.len() - 1;
    for b in 0..batch {
        let g = &dpooled[(b * num_fields + field) * dim..(b * num_fields + field + 1) * dim];
        let (lo, hi) = (offsets[b] as usize, offsets[b + 1] as usize);
        match weights {
            None => {
                for &u in &index[lo..hi] {
                    let row = &mut dunique[u as usize * dim..(u as usize + 1) * dim];
                    for (r, &gv) in row.iter_mut().zip(g) {
                        *r += gv;
                    }
                }
            }
            Some(w) => {
                for (&u, &wk) in index[lo..hi].iter().zip(&w[lo..hi]) {
                    let wk = T::from_f64(wk as f64);
                    let row = &mut dunique[u as usize * dim..(u as usize + 1) * dim];
                    for (r, &gv) in row.iter_mut().zip(g) {
                        *r += wk * gv;
                    }
                }
            }
        }
    }
}

/// Scalar oracle of weighted pooling: each bag's rows summed one by one in
/// f64 with explicit weights (1 when `weights` is `None`).
pub fn pool_oracle(
    unique: &[f64],
    dim: usize,
    offsets: &[u32],
    index: &[u32],
    weights: Option<&[f32]>,
) -> Vec<Vec<f64>> {
    (0..offsets.len() - 1)
        .map(|b| {
            (0..dim)
                .map(|j| {
                    (offsets[b] as usize..offsets[b + 1] as usize)
                        .map(|k| weights.map_or(1.0, |w| w[k] as f64) * unique[index[k] as usize * dim + j])
                        .sum()
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use proptest::prelude::*;
    use tiderec_records::rng::normal_f64;

    #[test]
    fn pooling_gradients_match_finite_differences() {
        let dim = 3;
        let unique: Vec<f64> = (0..4 * dim).map(|i| normal_f64(1, 0, i as u64, 0)).collect();
        // three samples: bag {0, 2, 2}, empty bag, bag {3}
        let offsets = [0u32, 3, 3, 4];
        let index = [0u32, 2, 2, 3];
        let r: Vec<f64> = (0..3 * 2 * dim).map(|i| normal_f64(2, 0, i as u64, 0)).collect();
        let loss = |u: &[f64]| {
            let mut pooled = vec![0.0; 3 * 2 * dim];
            pool_sum(u, dim, &offsets, &index, None, 1, 2, &mut pooled);
            pooled.iter().zip(&r).map(|(a, b)| a * b).sum::<f64>()
        };
        let mut du = vec![0.0; unique.len()];
        pool_sum_backward(&r, dim, &offsets, &index, None, 1, 2, &mut du);
        check_gradients(&unique, &du, loss);
        let mut pooled = vec![1.0; 3 * 2 * dim];
        pool_sum(&unique, dim, &offsets, &index, None, 1, 2, &mut pooled);
        assert!(pooled[(2 + 1) * dim..(2 + 2) * dim].iter().all(|&v| v == 0.0), "empty bag pools to zero");
    }

    #[test]
    fn mean_pooling_gradients_match_finite_differences() {
        let dim = 3;
        let unique: Vec<f64> = (0..4 * dim).map(|i| normal_f64(3, 0, i as u64, 0)).collect();
        // bags {0, 2, 2} (mean: 1/3 each), empty, {3, 1} with arbitrary weights
        let offsets = [0u32, 3, 3, 5];
        let index = [0u32, 2, 2, 3, 1];
        let weights = [1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 0.25, -1.5];
        let r: Vec<f64> = (0..3 * 2 * dim).map(|i| normal_f64(4, 0, i as u64, 0)).collect();
        let loss = |u: &[f64]| {
            let mut pooled = vec![0.0; 3 * 2 * dim];
            pool_sum(u, dim, &offsets, &index, Some(&weights), 0, 2, &mut pooled);
            pooled.iter().zip(&r).map(|(a, b)| a * b).sum::<f64>()
        };
        let mut du = vec![0.0; unique.len()];
        pool_sum_backward(&r, dim, &offsets, &index, Some(&weights), 0, 2, &mut du);
        check_gradients(&unique, &du, loss);
    }

    proptest! {
        #[test]
        fn weighted_pooling_matches_the_scalar_oracle(
            bags in proptest::collection::vec(proptest::collection::vec((0u32..6, -2.0f32..2.0), 0..7), 1..9),
            weighted in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let dim = 4;
            let unique: Vec<f32> = (0..6 * dim).map(|i| normal_f64(seed, 0, i as u64, 0) as f32).collect();
            let mut offsets = vec![0u32];
            let (mut index, mut weights) = (Vec::new(), Vec::new());
            for bag in &bags {
                for &(u, w) in bag {
                    index.push(u);
                    weights.push(w);
                }
                offsets.push(index.len() as u32);
            }
            let w = weighted.then_some(&weights[..]);
            let (b, f) = (bags.len(), 3);
            let mut pooled = vec![f32::NAN; b * f * dim];
            pool_sum(&unique, dim, &offsets, &index, w, 2, f, &mut pooled);
            let u64s: Vec<f64> = unique.iter().map(|&v| v as f64).collect();
            let want = pool_oracle(&u64s, dim, &offsets, &index, w);
            for (i, row) in want.iter().enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    let got = pooled[(i * f + 2) * dim + j] as f64;
                    prop_assert!((got - v).abs() <= 1e-4 * (1.0 + v.abs()), "bag {} dim {}: {} vs {}", i, j, got, v);
                }
            }
            // backward: d/d unique of Σ pooled · g equals Σ_k w_k g[bag(k)] at index[k]
            let g: Vec<f32> = (0..b * f * dim).map(|i| normal_f64(seed ^ 1, 0, i as u64, 0) as f32).collect();
            let mut du = vec![0.0f32; unique.len()];
            pool_sum_backward(&g, dim, &offsets, &index, w, 2, f, &mut du);
            let mut want_du = vec![0.0f64; unique.len()];
            for i in 0..b {
                for k in offsets[i] as usize..offsets[i + 1] as usize {
                    let wk = w.map_or(1.0, |w| w[k] as f64);
                    for j in 0..dim {
                        want_du[index[k] as usize * dim + j] += wk * g[(i * f + 2) * dim + j] as f64;
                    }
                }
            }
            for (a, e) in du.iter().zip(&want_du) {
                prop_assert!((*a as f64 - e).abs() <= 1e-4 * (1.0 + e.abs()));
            }
        }
    }
}
