//! The float types layers are generic over.

use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

/// `f32` or `f64`: arithmetic plus the matching GEMM kernel.
pub trait Scalar:
    Copy
    + Default
    + Debug
    + PartialOrd
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
{
    /// Additive identity.
    const ZERO: Self;
    /// Multiplicative identity.
    const ONE: Self;
    /// Converts from f64 (rounding for f32).
    fn from_f64(v: f64) -> Self;
    /// Converts to f64 exactly.
    fn to_f64(self) -> f64;
    /// `e^self`.
    fn exp(self) -> Self;
    /// Natural logarithm of `1 + self`.
    fn ln_1p(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// The larger of two values.
    fn max(self, other: Self) -> Self;
    /// `self · a + b` rounded once (a fused multiply-add: one instruction on
    /// every CPU tiderec targets, so a vector kernel's lane and this scalar
    /// oracle agree bit for bit).
    fn mul_add(self, a: Self, b: Self) -> Self;
    /// `e^self` computed with arithmetic only, so loops over it vectorise:
    /// a Cephes-style polynomial for `f32` (relative error about 2e-7, input
    /// clamped to ±88), the exact `exp` for `f64`.
    fn exp_fast(self) -> Self;
    /// Raw strided GEMM: `C = alpha·A·B + beta·C` with `A: m×k`, `B: k×n`.
    ///
    /// # Safety
    /// The strides must address memory inside the three buffers.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );

    /// One panel of [`gemm_packed`](super::gemm_packed::gemm_packed) (an
    /// implementation hook of the kernels, not for callers).
    #[doc(hidden)]
    fn packed_panel(p: super::gemm_packed::PanelProduct<'_, Self>);

    /// A row group times every panel with a given kernel (`f32`; `f64` has
    /// only the portable one).
    ///
    /// # Panics
    /// When the CPU does not run `kernel`.
    #[doc(hidden)]
    fn packed_span_with(kernel: super::gemm_packed::PanelKernel, span: super::gemm_packed::PanelSpan<'_, Self>);

    /// `c[m×n] = op(a)·b` in matrixmultiply's summation order on the packed kernel,
    /// then, with a mask laid out as `c`, zeroed where the mask is not positive
    /// (a ReLU's backward), and its column sums added to the third part of `c` if given
    /// ([`MmOrderOut`](super::gemm_packed::MmOrderOut)), `b` (`k × n`, rows `ldb` apart) read where it lies
    /// (`gemm_mm_order_in_place`) or copied a run at a time (`gemm_mm_order_f32`),
    /// as `kernel` says; `tail` is scratch for a last narrow panel or the copied runs; `f32` only: callers ask
    /// [`packed_panel_is_vectorized`](Self::packed_panel_is_vectorized) first).
    ///
    /// # Panics
    /// For `f64`, which has no vector packed kernel.
    #[allow(clippy::too_many_arguments)]
    fn gemm_mm_order(
        kernel: super::gemm_packed::MmOrderKernel,
        m: usize,
        a: &[Self],
        lda: usize,
        a_step: usize,
        b: (usize, usize, &[Self], usize),
        tail: &mut super::gemm_packed::PackedRhs<Self>,
        c: super::gemm_packed::MmOrderOut<'_, Self>,
        ldc: usize,
    );

    /// Whether [`packed_panel`](Self::packed_panel) runs a vector kernel on this
    /// CPU (callers that could use a general GEMM instead ask first).
    fn packed_panel_is_vectorized() -> bool;

    /// Packs rows `first .. first + width` of `b` (`n × k`, row-major) as the
    /// columns of a panel `k × pw` (the transposed packing of
    /// [`PackedRhs`](super::gemm_packed::PackedRhs)); padding columns are left as they are.
    fn pack_transposed(b: &[Self], k: usize, first: usize, width: usize, pw: usize, panel: &mut [Self]);

    /// The slice as `f32` values when `Self` is `f32` (the bf16 products read
    /// and write `f32` only), `None` otherwise.
    fn as_f32(v: &[Self]) -> Option<&[f32]>;

    /// [`as_f32`](Self::as_f32) for a mutable slice.
    fn as_f32_mut(v: &mut [Self]) -> Option<&mut [f32]>;
}

macro_rules! impl_scalar {
    ($t:ty, $gemm:path, $exp_fast:expr, $block:path, $block_with:expr, $mm_order:expr, $vectorized:expr, $pack_t:path, $as_f32:path, $as_f32_mut:path) => {
        impl Scalar for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline]
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            #[inline]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline]
            fn max(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            #[inline(always)]
            fn mul_add(self, a: Self, b: Self) -> Self {
                <$t>::mul_add(self, a, b)
            }
            #[inline(always)]
            fn exp_fast(self) -> Self {
                $exp_fast(self)
            }
            #[inline]
            unsafe fn gemm_raw(
                m: usize,
                k: usize,
                n: usize,
                alpha: Self,
                a: *const Self,
                rsa: isize,
                csa: isize,
                b: *const Self,
                rsb: isize,
                csb: isize,
                beta: Self,
                c: *mut Self,
                rsc: isize,
                csc: isize,
            ) {
                $gemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc)
            }
            #[inline]
            fn packed_panel(p: super::gemm_packed::PanelProduct<'_, Self>) {
                $block(p)
            }
            #[inline]
            fn packed_span_with(
                kernel: super::gemm_packed::PanelKernel,
                span: super::gemm_packed::PanelSpan<'_, Self>,
            ) {
                $block_with(kernel, span)
            }
            #[inline]
            fn gemm_mm_order(
                kernel: super::gemm_packed::MmOrderKernel,
                m: usize,
                a: &[Self],
                lda: usize,
                a_step: usize,
                b: (usize, usize, &[Self], usize),
                tail: &mut super::gemm_packed::PackedRhs<Self>,
                c: super::gemm_packed::MmOrderOut<'_, Self>,
                ldc: usize,
            ) {
                $mm_order(kernel, m, a, lda, a_step, b, tail, c, ldc)
            }
            #[inline]
            fn packed_panel_is_vectorized() -> bool {
                $vectorized
            }
            #[inline]
            fn pack_transposed(b: &[Self], k: usize, first: usize, width: usize, pw: usize, panel: &mut [Self]) {
                $pack_t(b, k, first, width, pw, panel)
            }
            #[inline]
            fn as_f32(v: &[Self]) -> Option<&[f32]> {
                $as_f32(v)
            }
            #[inline]
            fn as_f32_mut(v: &mut [Self]) -> Option<&mut [f32]> {
                $as_f32_mut(v)
            }
        }
    };
}

impl_scalar!(
    f32,
    matrixmultiply::sgemm,
    exp_f32_poly,
    super::gemm_packed::packed_panel_f32,
    super::gemm_packed::packed_span_f32_with,
    super::gemm_packed::gemm_mm_order_f32,
    super::gemm_packed::PanelKernel::best() != super::gemm_packed::PanelKernel::Portable,
    super::gemm_packed::pack_transposed_f32,
    Some,
    Some
);
impl_scalar!(
    f64,
    matrixmultiply::dgemm,
    f64::exp,
    super::gemm_packed::packed_panel_portable::<f64>,
    |_, span: super::gemm_packed::PanelSpan<'_, f64>| span.each(super::gemm_packed::packed_panel_portable::<f64>),
    |_,
     _,
     _: &[f64],
     _,
     _,
     _: (usize, usize, &[f64], usize),
     _: &mut super::gemm_packed::PackedRhs<f64>,
     _: super::gemm_packed::MmOrderOut<'_, f64>,
     _| { panic!("gemm_mm_order: f64 has no vector packed kernel") },
    false,
    super::gemm_packed::pack_transposed_portable::<f64>,
    not_f32,
    not_f32_mut
);

fn not_f32(_: &[f64]) -> Option<&[f32]> {
    None
}

fn not_f32_mut(_: &mut [f64]) -> Option<&mut [f32]> {
    None
}

/// `e^x` for `f32` from `2^k · p(r)`, `x = k·ln2 + r`, `|r| ≤ ln2/2`.
#[inline(always)]
fn exp_f32_poly(x: f32) -> f32 {
    let x = x.clamp(-87.3, 88.3);
    let k = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = x - k * 0.693_359_4 + k * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // SAFETY: `x` is clamped, so `k` is an integer in [-126, 128): no overflow, no NaN.
    // (A plain `as i32` is a saturating conversion, which stops LLVM from vectorizing
    // the loops that call this.)
    let k = unsafe { k.to_int_unchecked::<i32>() };
    y * f32::from_bits(((k + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_matches_std() {
        let mut worst = 0.0f64;
        for i in -8700..=8800 {
            let x = i as f32 * 0.01;
            let (a, b) = (x.exp_fast() as f64, (x as f64).exp());
            worst = worst.max((a - b).abs() / b);
        }
        assert!(worst < 1e-6, "relative error {worst}");
        assert!((-1000.0f32).exp_fast() >= 0.0 && (1000.0f32).exp_fast().is_finite());
    }
}
