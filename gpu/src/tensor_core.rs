//! The reduced-precision GEMMs of [`Device::with_precision`]: tf32 and bf16
//! products on the tensor cores, fp32 accumulation and fp32 results.
//!
//! * **bf16**: both operands are rounded to bf16 (to nearest, ties to even,
//!   as the CPU's `round_bf16`) into staging buffers, then `cublasGemmEx`
//!   multiplies them with `CUBLAS_COMPUTE_32F`.
//! * **tf32**: the operands stay fp32 and cuBLAS rounds them
//!   (`CUBLAS_COMPUTE_32F_FAST_TF32`).
//!
//! Tensor-core kernels need 16-byte aligned rows: an operand or a result
//! whose pointer or row stride is not is staged in a buffer whose rows are
//! (padded with zeros past the row), and a staged result is copied back. So
//! the odd widths of a model (13 dense features, DLRM's 367-wide interaction,
//! a 1-wide output) do not push cuBLAS onto its SIMT fp32 kernels.
//!
//! Invariants: the staging buffers belong to one device (one stream), only
//! grow, and are used between two calls on that stream only, so stream order
//! keeps one product's staging from the next's.

use crate::check::grid_for;
use crate::{Device, GpuError};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, DeviceRepr, PushKernelArg, ValidAsZeroBits};
use tiderec_operators::nn::Precision;

/// Bytes a tensor-core operand's rows and pointer are aligned to.
const ALIGN_BYTES: usize = 16;

/// The staging buffers of one device's reduced-precision products.
#[derive(Debug, Default)]
pub(crate) struct Staging {
    a16: Option<CudaSlice<u16>>,
    b16: Option<CudaSlice<u16>>,
    a32: Option<CudaSlice<f32>>,
    b32: Option<CudaSlice<f32>>,
    c32: Option<CudaSlice<f32>>,
}

/// A row-major product's shape, as [`crate::gemm`] takes it (`ta`, `tb`:
/// whether A and B are used transposed).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub ta: bool,
    pub tb: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub beta: f32,
}

/// `n` rounded up to a multiple of `to`.
fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// Whether rows at `ptr`, `ld` values of `bytes` apart, are tensor-core aligned.
fn aligned(ptr: u64, ld: usize, bytes: usize) -> bool {
    ptr.is_multiple_of(ALIGN_BYTES as u64) && (ld * bytes).is_multiple_of(ALIGN_BYTES)
}

/// `slot`, grown to at least `len` values; its device pointer.
fn grown<T: DeviceRepr + ValidAsZeroBits>(
    dev: &Device,
    slot: &mut Option<CudaSlice<T>>,
    len: usize,
) -> Result<u64, GpuError> {
    Ok(dev.grown(slot, len)?.device_ptr(&dev.stream).0)
}

/// One staging copy: `rows × cols` values from `src` (row stride `ld_src`)
/// to `dst` (row stride `ld_dst`); `pad` for `copy_rows_f32` (1: zero the
/// columns past `cols`, 0: leave them), none for `pack_rows_bf16`.
struct Args {
    src: u64,
    ld_src: u64,
    rows: u32,
    cols: u32,
    ld_dst: u64,
    pad: Option<i32>,
    dst: u64,
}

impl Args {
    fn new(
        (src, ld_src): (u64, usize),
        (rows, cols): (usize, usize),
        (dst, ld_dst): (u64, usize),
        pad: Option<i32>,
    ) -> Result<Args, GpuError> {
        let u32_of = |v: usize| crate::check::u32_of("tensor-core staging", "rows or cols", v);
        Ok(Args {
            src,
            ld_src: ld_src as u64,
            rows: u32_of(rows)?,
            cols: u32_of(cols)?,
            ld_dst: ld_dst as u64,
            pad,
            dst,
        })
    }

    /// Launches `kernel` (one of the two staging kernels) on these arguments.
    fn launch(&self, dev: &Device, kernel: &CudaFunction) -> Result<(), GpuError> {
        let mut launch = dev.stream.launch_builder(kernel);
        launch.arg(&self.src).arg(&self.ld_src).arg(&self.rows).arg(&self.cols).arg(&self.ld_dst);
        if let Some(pad) = &self.pad {
            launch.arg(pad);
        }
        launch.arg(&self.dst);
        let items = self.rows as usize * self.ld_dst as usize;
        // SAFETY: `src` holds `rows` rows of `ld_src` (at least `cols` values used
        // each) and `dst` `rows` rows of `ld_dst` (checked by the callers); the
        // kernel stays below both.
        unsafe { launch.launch(grid_for(items)) }.map_err(GpuError::driver("launching a staging kernel"))?;
        Ok(())
    }
}

/// A stored `rows × cols` operand at `ptr` (row stride `ld`) made ready for
/// the tensor cores: its pointer, row stride and data type.
fn operand(
    dev: &Device,
    slot16: &mut Option<CudaSlice<u16>>,
    slot32: &mut Option<CudaSlice<f32>>,
    (ptr, ld): (u64, usize),
    (rows, cols): (usize, usize),
) -> Result<(u64, usize, cudaDataType), GpuError> {
    match dev.precision {
        Precision::Bf16 => {
            let ld2 = round_up(cols, ALIGN_BYTES / 2);
            let dst = grown(dev, slot16, rows * ld2)?;
            Args::new((ptr, ld), (rows, cols), (dst, ld2), None)?.launch(dev, dev.function("pack_rows_bf16"))?;
            Ok((dst, ld2, cudaDataType::CUDA_R_16BF))
        }
        _ if aligned(ptr, ld, 4) => Ok((ptr, ld, cudaDataType::CUDA_R_32F)),
        _ => {
            let ld2 = round_up(cols, ALIGN_BYTES / 4);
            let dst = grown(dev, slot32, rows * ld2)?;
            Args::new((ptr, ld), (rows, cols), (dst, ld2), Some(1))?.launch(dev, dev.function("copy_rows_f32"))?;
            Ok((dst, ld2, cudaDataType::CUDA_R_32F))
        }
    }
}

/// The product of [`crate::gemm`] in the device's reduced precision.
///
/// # Safety
/// `a`, `b` and `c` point to buffers on the device's stream holding the spans
/// `s` describes (checked by the caller), valid until this call returns.
pub(crate) unsafe fn gemm(dev: &Device, op: &'static str, s: &Shape, a: u64, b: u64, c: u64) -> Result<(), GpuError> {
    let mut guard = dev.staging.lock().unwrap_or_else(|p| p.into_inner());
    let st = &mut *guard;
    let stored = |t: bool, rows: usize, cols: usize| if t { (cols, rows) } else { (rows, cols) };
    let (pa, lda, ta_type) = operand(dev, &mut st.a16, &mut st.a32, (a, s.lda), stored(s.ta, s.m, s.k))?;
    let (pb, ldb, tb_type) = operand(dev, &mut st.b16, &mut st.b32, (b, s.ldb), stored(s.tb, s.k, s.n))?;
    // A result whose rows are not aligned is computed into padded rows and copied back.
    let staged_c = !aligned(c, s.ldc, 4);
    let (pc, ldc) = if staged_c {
        let ld2 = round_up(s.n, ALIGN_BYTES / 4);
        let dst = grown(dev, &mut st.c32, s.m * ld2)?;
        if s.beta != 0.0 {
            Args::new((c, s.ldc), (s.m, s.n), (dst, ld2), Some(1))?.launch(dev, dev.function("copy_rows_f32"))?;
        }
        (dst, ld2)
    } else {
        (c, s.ldc)
    };
    let compute = match dev.precision {
        Precision::Tf32 => cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        _ => cublasComputeType_t::CUBLAS_COMPUTE_32F,
    };
    let trans = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
    let int =
        |v: usize| i32::try_from(v).map_err(|_| GpuError::shape(op, format!("{v} exceeds cuBLAS's 32-bit sizes")));
    let (alpha, beta) = (1.0f32, s.beta);
    // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: B first, m and n swapped.
    // SAFETY: every pointer holds its span (the caller's, or a staging buffer
    // grown to it above); alpha and beta outlive the call, which only queues work.
    unsafe {
        cudarc::cublas::sys::cublasGemmEx(
            *dev.blas.handle(),
            trans(s.tb),
            trans(s.ta),
            int(s.n)?,
            int(s.m)?,
            int(s.k)?,
            (&alpha as *const f32).cast(),
            pb as *const std::ffi::c_void,
            tb_type,
            int(ldb.max(1))?,
            pa as *const std::ffi::c_void,
            ta_type,
            int(lda.max(1))?,
            (&beta as *const f32).cast(),
            pc as *mut std::ffi::c_void,
            cudaDataType::CUDA_R_32F,
            int(ldc.max(1))?,
            compute,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
        )
    }
    .result()
    .map_err(GpuError::blas(op))?;
    if staged_c {
        Args::new((pc, ldc), (s.m, s.n), (c, s.ldc), Some(0))?.launch(dev, dev.function("copy_rows_f32"))?;
    }
    Ok(())
}
