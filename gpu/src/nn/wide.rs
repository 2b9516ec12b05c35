//! The linear ("wide") part of `tiderec_operators::nn::deepfm::Fm` on the
//! device, and the reshaping between pooled rows `[w, v₁ … v_k]` and the deep
//! part's input `[x, v_1, …, v_fd]`. The linear part's parameters are the
//! first `1 + num_dense` values of the flat buffer: the bias, then one weight
//! per dense feature (the CPU's layout).

use crate::check::{self, grid_for};
use crate::nn::linear::column_reduce;
use crate::{Device, GpuError};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// The shape the wide kernels read: `batch` samples of `num_dense` dense
/// values and `num_fields` pooled rows of width `stride = 1 + dim`, of which
/// the first `deep_fields` feed the deep part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WideShape {
    /// Dense features per sample.
    pub num_dense: usize,
    /// Pooled rows per sample.
    pub num_fields: usize,
    /// Factor width `k` (the row is `1 + k` wide).
    pub dim: usize,
    /// Fields whose factors feed the deep part (all but the wide-only crosses).
    pub deep_fields: usize,
}

impl WideShape {
    fn stride(&self) -> usize {
        1 + self.dim
    }

    /// Width of one sample's deep input.
    pub fn deep_width(&self) -> usize {
        self.num_dense + self.deep_fields * self.dim
    }

    fn check_pooled(
        &self,
        op: &'static str,
        name: &str,
        pooled: &CudaSlice<f32>,
        batch: usize,
    ) -> Result<(), GpuError> {
        check::len(op, name, pooled, check::product(op, &[batch, self.num_fields, self.stride()])?, || {
            format!("batch {batch} × {} fields × {}", self.num_fields, self.stride())
        })
    }

    fn check_dense(&self, op: &'static str, dense: &CudaSlice<f32>, batch: usize) -> Result<(), GpuError> {
        check::len(op, "dense", dense, check::product(op, &[batch, self.num_dense])?, || {
            format!("batch {batch} × {}", self.num_dense)
        })
    }

    fn args(&self, op: &'static str, batch: usize) -> Result<[u32; 5], GpuError> {
        if self.deep_fields > self.num_fields {
            return Err(GpuError::shape(op, format!("{} deep fields of {}", self.deep_fields, self.num_fields)));
        }
        Ok([
            check::u32_of(op, "batch", batch)?,
            check::u32_of(op, "num_dense", self.num_dense)?,
            check::u32_of(op, "num_fields", self.num_fields)?,
            check::u32_of(op, "deep_fields", self.deep_fields)?,
            check::u32_of(op, "dim", self.dim)?,
        ])
    }

    /// `logits[b] = params[0] + Σⱼ x_bj·params[1 + j] + Σ_f w_bf`.
    pub fn forward(
        &self,
        dev: &Device,
        dense: &CudaSlice<f32>,
        pooled: &CudaSlice<f32>,
        params: &CudaSlice<f32>,
        batch: usize,
        logits: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        const OP: &str = "wide forward";
        let [b, nd, f, _, _] = self.args(OP, batch)?;
        self.check_dense(OP, dense, batch)?;
        self.check_pooled(OP, "pooled", pooled, batch)?;
        check::len(OP, "params", params, 1 + self.num_dense, || "the bias and the dense weights".into())?;
        check::len(OP, "logits", logits, batch, || format!("batch {batch}"))?;
        if batch == 0 {
            return Ok(());
        }
        let s = check::u32_of(OP, "stride", self.stride())?;
        let mut launch = dev.stream.launch_builder(dev.function("wide_forward"));
        launch.arg(dense).arg(pooled).arg(params).arg(&b).arg(&nd).arg(&f).arg(&s).arg(logits);
        // SAFETY: shapes checked above; one thread per sample.
        unsafe { launch.launch(grid_for(batch)) }.map_err(GpuError::driver("launching wide_forward"))?;
        Ok(())
    }

    /// Overwrites `grads[0]` with `Σ dlogits` and `grads[1 + j]` with `Σ_b x_bj·dlogits_b`,
    /// and `dpooled` with the first-order gradient (`dlogits_b` in every row's first slot, zeros elsewhere).
    pub fn backward(
        &self,
        dev: &Device,
        dense: &CudaSlice<f32>,
        dlogits: &CudaSlice<f32>,
        batch: usize,
        grads: &mut CudaSlice<f32>,
        dpooled: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        const OP: &str = "wide backward";
        let [b, _, f, _, _] = self.args(OP, batch)?;
        self.check_dense(OP, dense, batch)?;
        check::len(OP, "dlogits", dlogits, batch, || format!("batch {batch}"))?;
        check::len(OP, "grads", grads, 1 + self.num_dense, || "the bias and the dense weights".into())?;
        self.check_pooled(OP, "dpooled", dpooled, batch)?;
        // The bias: Σ_b dlogits[b]; dense weight j: Σ_b dense[b, j] · dlogits[b].
        column_reduce(dev, dlogits, None, batch, 1, grads, 0)?;
        column_reduce(dev, dense, Some(dlogits), batch, self.num_dense, grads, 1)?;
        let n = batch * self.num_fields * self.stride();
        if n == 0 {
            return Ok(());
        }
        let s = check::u32_of(OP, "stride", self.stride())?;
        let mut launch = dev.stream.launch_builder(dev.function("first_order_grad"));
        launch.arg(dlogits).arg(&b).arg(&f).arg(&s).arg(dpooled);
        // SAFETY: dpooled holds batch × fields × stride values (checked above).
        unsafe { launch.launch(grid_for(n)) }.map_err(GpuError::driver("launching first_order_grad"))?;
        Ok(())
    }

    /// The deep part's input `[batch × deep_width]`: each sample's dense values,
    /// then the factors of its first `deep_fields` rows.
    pub fn gather_deep_input(
        &self,
        dev: &Device,
        dense: &CudaSlice<f32>,
        pooled: &CudaSlice<f32>,
        batch: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        const OP: &str = "deep input gather";
        let [b, nd, f, fd, k] = self.args(OP, batch)?;
        self.check_dense(OP, dense, batch)?;
        self.check_pooled(OP, "pooled", pooled, batch)?;
        let n = check::product(OP, &[batch, self.deep_width()])?;
        check::len(OP, "out", out, n, || format!("batch {batch} × {}", self.deep_width()))?;
        if n == 0 {
            return Ok(());
        }
        let s = check::u32_of(OP, "stride", self.stride())?;
        let mut launch = dev.stream.launch_builder(dev.function("deep_input_gather"));
        launch.arg(dense).arg(pooled).arg(&b).arg(&nd).arg(&f).arg(&fd).arg(&k).arg(&s).arg(out);
        // SAFETY: shapes checked above; one thread per output value.
        unsafe { launch.launch(grid_for(n)) }.map_err(GpuError::driver("launching deep_input_gather"))?;
        Ok(())
    }

    /// Adds the factor part of the deep input's gradient `d_in` onto `dpooled`.
    pub fn scatter_deep_grad(
        &self,
        dev: &Device,
        d_in: &CudaSlice<f32>,
        batch: usize,
        dpooled: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        const OP: &str = "deep input scatter";
        let [b, nd, f, fd, k] = self.args(OP, batch)?;
        check::len(OP, "d_in", d_in, check::product(OP, &[batch, self.deep_width()])?, || {
            format!("batch {batch} × {}", self.deep_width())
        })?;
        self.check_pooled(OP, "dpooled", dpooled, batch)?;
        let n = batch * self.deep_fields * self.dim;
        if n == 0 {
            return Ok(());
        }
        let s = check::u32_of(OP, "stride", self.stride())?;
        let mut launch = dev.stream.launch_builder(dev.function("deep_input_scatter_add"));
        launch.arg(d_in).arg(&b).arg(&nd).arg(&f).arg(&fd).arg(&k).arg(&s).arg(dpooled);
        // SAFETY: shapes checked above; one thread per factor value.
        unsafe { launch.launch(grid_for(n)) }.map_err(GpuError::driver("launching deep_input_scatter_add"))?;
        Ok(())
    }
}

/// `a[i] += b[i]` over the first `n` values.
pub fn add_assign(dev: &Device, a: &mut CudaSlice<f32>, b: &CudaSlice<f32>, n: usize) -> Result<(), GpuError> {
    const OP: &str = "add";
    check::len(OP, "a", a, n, || format!("{n} values"))?;
    check::len(OP, "b", b, n, || format!("{n} values"))?;
    if n == 0 {
        return Ok(());
    }
    let n64 = n as u64;
    let mut launch = dev.stream.launch_builder(dev.function("add_assign"));
    launch.arg(a).arg(b).arg(&n64);
    // SAFETY: both buffers hold at least n values (checked above).
    unsafe { launch.launch(grid_for(n)) }.map_err(GpuError::driver("launching add_assign"))?;
    Ok(())
}
