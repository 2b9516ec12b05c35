//! Row-major single-precision GEMM on cuBLAS.
//!
//! cuBLAS is column-major; a row-major `C[m×n] = op(A)·op(B)` is the
//! column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ`, so B goes first and `m`, `n` swap. The
//! handle is in pedantic fp32 math mode (no TF32) unless the device was given
//! a reduced precision ([`Device::with_precision`]): then every product runs
//! on the tensor cores ([`crate::tensor_core`]).

use crate::check;
use crate::{Device, GpuError};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{Gemm, GemmConfig};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use tiderec_operators::nn::Precision;

/// Whether an operand is used as stored or transposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// As stored.
    N,
    /// Transposed.
    T,
}

/// Values an operand of `rows × cols` (as used, after `op`) stored row-major
/// with leading dimension `ld` occupies.
fn span(op: Op, rows: usize, cols: usize, ld: usize) -> usize {
    let (r, c) = if op == Op::N { (rows, cols) } else { (cols, rows) };
    if r == 0 || c == 0 {
        0
    } else {
        (r - 1) * ld + c
    }
}

/// Row-major `C[m×n] = op(A)[m×k] · op(B)[k×n] + beta · C`, with leading
/// dimensions (row lengths as stored) `lda`, `ldb`, `ldc`.
#[allow(clippy::too_many_arguments)]
pub fn gemm<A: DevicePtr<f32>, B: DevicePtr<f32>, C: DevicePtrMut<f32>>(
    dev: &Device,
    op: &'static str,
    (ta, tb): (Op, Op),
    (m, n, k): (usize, usize, usize),
    a: &A,
    lda: usize,
    b: &B,
    ldb: usize,
    beta: f32,
    c: &mut C,
    ldc: usize,
) -> Result<(), GpuError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    let a_cols = if ta == Op::N { k } else { m };
    let b_cols = if tb == Op::N { n } else { k };
    if lda < a_cols || ldb < b_cols || ldc < n {
        return Err(GpuError::shape(
            op,
            format!("leading dimensions {lda}, {ldb}, {ldc} below the stored row lengths {a_cols}, {b_cols}, {n}"),
        ));
    }
    check::len(op, "A", a, span(ta, m, k, lda), || format!("{m}×{k}, ld {lda}"))?;
    check::len(op, "B", b, span(tb, k, n, ldb), || format!("{k}×{n}, ld {ldb}"))?;
    check::len(op, "C", c, span(Op::N, m, n, ldc), || format!("{m}×{n}, ld {ldc}"))?;
    let int = |name: &str, v: usize| {
        i32::try_from(v).map_err(|_| GpuError::shape(op, format!("`{name}` = {v} exceeds cuBLAS's 32-bit sizes")))
    };
    let trans = |o: Op| if o == Op::N { cublasOperation_t::CUBLAS_OP_N } else { cublasOperation_t::CUBLAS_OP_T };
    let cfg = GemmConfig {
        transa: trans(tb),
        transb: trans(ta),
        m: int("n", n)?,
        n: int("m", m)?,
        k: int("k", k)?,
        alpha: 1.0f32,
        lda: int("ldb", ldb.max(1))?,
        ldb: int("lda", lda.max(1))?,
        beta,
        ldc: int("ldc", ldc.max(1))?,
    };
    if dev.precision == Precision::Fp32 {
        // SAFETY: the spans of A, B and C were checked against their buffers above,
        // and all three are on the device's stream (cuBLAS orders them there).
        return unsafe { dev.blas.gemm(cfg, b, a, c) }.map_err(GpuError::blas(op));
    }
    let stream = &dev.stream;
    let ((pa, _ga), (pb, _gb), (pc, _gc)) = (a.device_ptr(stream), b.device_ptr(stream), c.device_ptr_mut(stream));
    let shape = crate::tensor_core::Shape { ta: ta == Op::T, tb: tb == Op::T, m, n, k, lda, ldb, ldc, beta };
    // SAFETY: as above: the three spans were checked, and the pointers stay
    // valid while their guards live (to the end of this function).
    unsafe { crate::tensor_core::gemm(dev, op, &shape, pa, pb, pc) }
}
