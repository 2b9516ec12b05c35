//! Sum-pooled embedding bags over gathered rows.
//!
//! A worker first gathers the distinct rows a batch needs (`unique`, `[U × dim]`);
//! each bag then refers to those rows by index. Pooling writes
//! `pooled[b, field, :] = Σ unique[index[k], :]` for the bag's entries `k`;
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
    field: usize,
    num_fields: usize,
    pooled: &mut [T],
) {
    let batch = offsets.len() - 1;
    for b in 0..batch {
        let out = &mut pooled[(b * num_fields + field) * dim..(b * num_fields + field + 1) * dim];
        out.fill(T::ZERO);
        for &u in &index[offsets[b] as usize..offsets[b + 1] as usize] {
            let row = &unique[u as usize * dim..(u as usize + 1) * dim];
            for (o, &r) in out.iter_mut().zip(row) {
                *o += r;
            }
        }
    }
}

/// The adjoint of [`pool_sum`]: adds each bag's gradient to its rows in `dunique`.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
pub fn pool_sum_backward<T: Scalar>(
    dpooled: &[T],
    dim: usize,
    offsets: &[u32],
    index: &[u32],
    field: usize,
    num_fields: usize,
    dunique: &mut [T],
) {
    let batch = offsets.len() - 1;
    for b in 0..batch {
        let g = &dpooled[(b * num_fields + field) * dim..(b * num_fields + field + 1) * dim];
        for &u in &index[offsets[b] as usize..offsets[b + 1] as usize] {
            let row = &mut dunique[u as usize * dim..(u as usize + 1) * dim];
            for (r, &gv) in row.iter_mut().zip(g) {
                *r += gv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::gradcheck::check_gradients;
    use crate::rng::normal_f64;

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
            pool_sum(u, dim, &offsets, &index, 1, 2, &mut pooled);
            pooled.iter().zip(&r).map(|(a, b)| a * b).sum::<f64>()
        };
        let mut du = vec![0.0; unique.len()];
        pool_sum_backward(&r, dim, &offsets, &index, 1, 2, &mut du);
        check_gradients(&unique, &du, loss);
        let mut pooled = vec![1.0; 3 * 2 * dim];
        pool_sum(&unique, dim, &offsets, &index, 1, 2, &mut pooled);
        assert!(pooled[(2 + 1) * dim..(2 + 2) * dim].iter().all(|&v| v == 0.0), "empty bag pools to zero");
    }
}
