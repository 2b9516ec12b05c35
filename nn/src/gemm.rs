//! Safe row-major GEMM on slices, with optional transposes.
//!
//! `c[m×n] = alpha · op(a) · op(b) + beta · c`, where `op(a)` is `m×k` and
//! `op(b)` is `k×n`. Transposes are expressed as strides, so no operand is
//! copied (matrixmultiply runs transposed operands at full speed).
//!
//! [`gemm_nt_acc`] is the one product that runs on another crate's kernels:
//! a layer's forward `x·Wᵀ` over many rows and wide outputs, where the `gemm`
//! crate measured 10–25% faster than matrixmultiply on DLRM's layers (which
//! packs both of these operands element by element); matrixmultiply stays
//! faster on both backward products.

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
    if n == 1 || m == 1 {
        // Matrix–vector shapes (a layer of width 1): packing for a GEMM kernel costs more than the work.
        gemv_shapes(op_a, op_b, m, n, k, alpha, a, b, beta, c);
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

/// `c[m×n] = alpha · a[m×k] · bᵀ + beta · c` (`b` stored `n × k`, a layer's
/// `x·Wᵀ`) where each row of `c` is the value [`gemm()`] gives it among two rows or
/// more, whatever `m`: one row runs matrixmultiply too instead of [`gemm()`]'s
/// dot products (another summation order), and `n == 1` runs [`gemm()`]'s
/// per-row dot products at every `m`. So a row's entries do not depend on how
/// many rows are computed with it, or where it lies among them.
///
/// # Panics
/// When a slice is shorter than its shape requires.
#[allow(clippy::too_many_arguments)]
pub fn gemm_nt_rows<T: Scalar>(m: usize, n: usize, k: usize, alpha: T, a: &[T], b: &[T], beta: T, c: &mut [T]) {
    if m != 1 || n == 1 {
        return gemm(Op::N, Op::T, m, n, k, alpha, a, b, beta, c);
    }
    assert!(a.len() >= k, "gemm_nt_rows: a has {} values, needs {k}", a.len());
    assert!(b.len() >= k * n, "gemm_nt_rows: b has {} values, needs {}", b.len(), k * n);
    assert!(c.len() >= n, "gemm_nt_rows: c has {} values, needs {n}", c.len());
    // SAFETY: the asserts bound every index the strides reach: a is one row of k, op(b) = bᵀ
    // is k × n read from b (n × k row-major: row stride 1, column stride k), c one row of n.
    unsafe {
        let (k_i, n_i) = (k as isize, n as isize);
        T::gemm_raw(1, k, n, alpha, a.as_ptr(), k_i, 1, b.as_ptr(), 1, k_i, beta, c.as_mut_ptr(), n_i, 1);
    }
}

/// `c[m×n] += a[m×k] · bᵀ`, with `b` stored `n × k` (a layer's `x·Wᵀ`), on
/// the `gemm` crate's kernels, single-threaded. Same operands and result as
/// `gemm(Op::N, Op::T, m, n, k, 1, a, b, 1, c)`, up to the order of the sums.
///
/// # Panics
/// When a slice is shorter than its shape requires.
pub fn gemm_nt_acc<T: Scalar>(m: usize, n: usize, k: usize, a: &[T], b: &[T], c: &mut [T]) {
    assert!(a.len() >= m * k, "gemm_nt_acc: a has {} values, needs {}", a.len(), m * k);
    assert!(b.len() >= k * n, "gemm_nt_acc: b has {} values, needs {}", b.len(), k * n);
    assert!(c.len() >= m * n, "gemm_nt_acc: c has {} values, needs {}", c.len(), m * n);
    if m == 0 || n == 0 {
        return;
    }
    let (n_i, k_i) = (n as isize, k as isize);
    // SAFETY: the asserts bound every index the strides reach: c is m × n row-major
    // (column stride 1, row stride n), a is m × k row-major, and op(b) = bᵀ is k × n
    // read from b (n × k row-major) with column stride k and row stride 1. T is f32
    // or f64, both of which the crate implements. `dst := 1·dst + 1·a·bᵀ`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n_i,
            true,
            a.as_ptr(),
            1,
            k_i,
            b.as_ptr(),
            k_i,
            1,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// `n == 1` or `m == 1`: dot products and row updates over contiguous data where possible.
#[allow(clippy::too_many_arguments)]
fn gemv_shapes<T: Scalar>(
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
    let scale = |c: &mut [T]| {
        if beta == T::ZERO {
            c.fill(T::ZERO);
        } else if beta != T::ONE {
            c.iter_mut().for_each(|v| *v *= beta);
        }
    };
    let c = &mut c[..m * n];
    if n == 1 && op_a == Op::N {
        // c[i] = alpha·⟨a_i, b⟩ (b is a k-vector whatever op_b says).
        for (i, ci) in c.iter_mut().enumerate() {
            let d = super::interaction::dot(&a[i * k..(i + 1) * k], &b[..k]);
            *ci = alpha * d + if beta == T::ZERO { T::ZERO } else { beta * *ci };
        }
    } else if m == 1 && op_b == Op::N {
        // c = alpha·Σ_p a[p]·b_p (a is a k-vector whatever op_a says).
        scale(c);
        for p in 0..k {
            let ap = alpha * a[p];
            for (cj, &bv) in c.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *cj += ap * bv;
            }
        }
    } else if m == 1 {
        // op_b == T: c[j] = alpha·⟨a, b_j⟩ with b stored n×k.
        for (j, cj) in c.iter_mut().enumerate() {
            let d = super::interaction::dot(&a[..k], &b[j * k..(j + 1) * k]);
            *cj = alpha * d + if beta == T::ZERO { T::ZERO } else { beta * *cj };
        }
    } else {
        // n == 1, op_a == T: a stored k×m, c = alpha·Σ_p b[p]·a_p.
        scale(c);
        for p in 0..k {
            let bp = alpha * b[p];
            for (ci, &av) in c.iter_mut().zip(&a[p * m..(p + 1) * m]) {
                *ci += bp * av;
            }
        }
    }
}

/// Scalar reference GEMM: the oracle for [`gemm()`].
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
            let val = |i: usize| tiderec_records::rng::unit_f64(seed, i as u64, 0, 0) - 0.5;
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

    /// Against the reference, accumulating onto a non-zero `c`, on shapes from
    /// one row or column to DLRM's widths (kernel edges in both directions).
    #[test]
    fn gemm_nt_acc_equals_the_reference() {
        let val = |seed: u64, i: usize| tiderec_records::rng::unit_f64(seed, i as u64, 0, 0) - 0.5;
        for (m, n, k) in [(1, 1, 1), (3, 17, 5), (33, 9, 40), (300, 65, 20), (257, 130, 367), (1030, 256, 16)] {
            let a: Vec<f64> = (0..m * k).map(|i| val(1, i)).collect();
            let b: Vec<f64> = (0..n * k).map(|i| val(2, i)).collect();
            let c0: Vec<f64> = (0..m * n).map(|i| val(3, i)).collect();
            let mut want = c0.clone();
            gemm_reference(Op::N, Op::T, m, n, k, 1.0, &a, &b, 1.0, &mut want);
            let mut got = c0.clone();
            gemm_nt_acc(m, n, k, &a, &b, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 1e-12 * w.abs().max(1.0), "{m}x{n}x{k} [{i}]: {g} vs {w}");
            }
            let (af, bf) =
                (a.iter().map(|&v| v as f32).collect::<Vec<_>>(), b.iter().map(|&v| v as f32).collect::<Vec<_>>());
            let mut gotf: Vec<f32> = c0.iter().map(|&v| v as f32).collect();
            gemm_nt_acc(m, n, k, &af, &bf, &mut gotf);
            for (i, (g, w)) in gotf.iter().zip(&want).enumerate() {
                assert!((*g as f64 - w).abs() <= 1e-4 * w.abs().max(1.0), "f32 {m}x{n}x{k} [{i}]: {g} vs {w}");
            }
        }
    }
}
