//! Safe row-major GEMM on slices, with optional transposes.
//!
//! `c[m×n] = alpha · op(a) · op(b) + beta · c`, where `op(a)` is `m×k` and
//! `op(b)` is `k×n`. Transposes are expressed as strides, so no operand is
//! copied (matrixmultiply runs transposed operands at full speed).

use super::Scalar;

/// Whether an operand is used as stored or transposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// As stored (row-major).
    N,
    /// Transposed.
    T,
}

/// Row-major GEMM. `a` is stored `m×k` (or `k×m` for `Op::T`), `b` is stored
/// `k×n` (or `n×k` for `Op::T`), `c` is `m×n`.
///
/// # Panics
/// When a slice is shorter than its shape requires (a programming error, not a data error).
#[allow(clippy::too_many_arguments)]
pub fn gemm<T: Scalar>(
    op_a: Op,
    op_b: Op,
    m: usize,
    n: usize,
    k: usize,
    alpha: T,
    a: &[T],
    b: &[T],
    beta: T,
    c: &mut [T],
) {
    assert!(a.len() >= m * k, "gemm: a has {} values, needs {}", a.len(), m * k);
    assert!(b.len() >= k * n, "gemm: b has {} values, needs {}", b.len(), k * n);
    assert!(c.len() >= m * n, "gemm: c has {} values, needs {}", c.len(), m * n);
    if m == 0 || n == 0 {
        return;
    }
    let (rsa, csa) = match op_a {
        Op::N => (k as isize, 1),
        Op::T => (1, m as isize),
    };
    let (rsb, csb) = match op_b {
        Op::N => (n as isize, 1),
        Op::T => (1, k as isize),
    };
    // SAFETY: the asserts above bound every index the strides can reach.
    unsafe {
        T::gemm_raw(m, k, n, alpha, a.as_ptr(), rsa, csa, b.as_ptr(), rsb, csb, beta, c.as_mut_ptr(), n as isize, 1);
    }
}

/// Scalar reference GEMM: the oracle for [`gemm`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_reference<T: Scalar>(
    op_a: Op,
    op_b: Op,
    m: usize,
    n: usize,
    k: usize,
    alpha: T,
    a: &[T],
    b: &[T],
    beta: T,
    c: &mut [T],
) {
    for i in 0..m {
        for j in 0..n {
            let mut s = T::ZERO;
            for p in 0..k {
                let av = match op_a {
                    Op::N => a[i * k + p],
                    Op::T => a[p * m + i],
                };
                let bv = match op_b {
                    Op::N => b[p * n + j],
                    Op::T => b[j * k + p],
                };
                s += av * bv;
            }
            c[i * n + j] = alpha * s + beta * c[i * n + j];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn matches_reference(m in 0usize..9, n in 0usize..9, k in 0usize..9, ta in any::<bool>(), tb in any::<bool>(), seed in any::<u64>()) {
            let val = |i: usize| crate::rng::unit_f64(seed, i as u64, 0, 0) - 0.5;
            let a: Vec<f64> = (0..m * k).map(val).collect();
            let b: Vec<f64> = (0..k * n).map(|i| val(i + 1000)).collect();
            let c0: Vec<f64> = (0..m * n).map(|i| val(i + 2000)).collect();
            let (oa, ob) = (if ta { Op::T } else { Op::N }, if tb { Op::T } else { Op::N });
            let mut c1 = c0.clone();
            let mut c2 = c0.clone();
            gemm(oa, ob, m, n, k, 0.7, &a, &b, 0.3, &mut c1);
            gemm_reference(oa, ob, m, n, k, 0.7, &a, &b, 0.3, &mut c2);
            for (x, y) in c1.iter().zip(&c2) {
                prop_assert!((x - y).abs() < 1e-12);
            }
        }
    }
}
