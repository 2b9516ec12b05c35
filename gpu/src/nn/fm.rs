//! The factorization machine's second-order term on the device, mirroring
//! `tiderec_operators::nn::fm::FmInteraction`: the factor of field `f` of
//! sample `b` is `rows[(b·F + f)·stride + offset ..][..dim]`.

use crate::check::{self, grid_for};
use crate::{Device, GpuError};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// FM second-order interaction over `num_fields` vectors of width `dim`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FmInteraction {
    /// Fields per sample.
    pub num_fields: usize,
    /// Factor width.
    pub dim: usize,
    /// Distance between consecutive field rows.
    pub stride: usize,
    /// Position of the factor inside a row.
    pub offset: usize,
}

impl FmInteraction {
    fn check(&self, op: &'static str, rows: &CudaSlice<f32>, batch: usize) -> Result<[u32; 5], GpuError> {
        if self.offset + self.dim > self.stride {
            return Err(GpuError::shape(
                op,
                format!(
                    "a factor at {} of width {} does not fit rows of stride {}",
                    self.offset, self.dim, self.stride
                ),
            ));
        }
        check::len(op, "rows", rows, check::product(op, &[batch, self.num_fields, self.stride])?, || {
            format!("batch {batch} × {} fields × stride {}", self.num_fields, self.stride)
        })?;
        Ok([
            check::u32_of(op, "batch", batch)?,
            check::u32_of(op, "num_fields", self.num_fields)?,
            check::u32_of(op, "dim", self.dim)?,
            check::u32_of(op, "stride", self.stride)?,
            check::u32_of(op, "offset", self.offset)?,
        ])
    }

    /// `out[b] = ½ Σ_c [(Σ_f v_fc)² − Σ_f v_fc²]`; `scratch` holds `batch × dim` values.
    pub fn forward(
        &self,
        dev: &Device,
        rows: &CudaSlice<f32>,
        batch: usize,
        scratch: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        const OP: &str = "fm forward";
        let [b, f, d, s, o] = self.check(OP, rows, batch)?;
        check::len(OP, "scratch", scratch, batch * self.dim, || format!("batch {batch} × {}", self.dim))?;
        check::len(OP, "out", out, batch, || format!("batch {batch}"))?;
        if batch == 0 {
            return Ok(());
        }
        let mut launch = dev.stream.launch_builder(dev.function("fm_forward"));
        launch.arg(rows).arg(&b).arg(&f).arg(&d).arg(&s).arg(&o).arg(scratch).arg(out);
        // SAFETY: shapes checked above; one thread per sample.
        unsafe { launch.launch(grid_for(batch)) }.map_err(GpuError::driver("launching fm_forward"))?;
        Ok(())
    }

    /// Adds `dout[b] · (Σ_f v_fc − v_fc)` to the factor part of `drows`.
    pub fn backward(
        &self,
        dev: &Device,
        rows: &CudaSlice<f32>,
        dout: &CudaSlice<f32>,
        batch: usize,
        drows: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        const OP: &str = "fm backward";
        let [b, f, d, s, o] = self.check(OP, rows, batch)?;
        check::len(OP, "dout", dout, batch, || format!("batch {batch}"))?;
        check::len(OP, "drows", drows, batch * self.num_fields * self.stride, || "as rows".into())?;
        if batch == 0 || self.dim == 0 {
            return Ok(());
        }
        let mut launch = dev.stream.launch_builder(dev.function("fm_backward"));
        launch.arg(rows).arg(dout).arg(&b).arg(&f).arg(&d).arg(&s).arg(&o).arg(drows);
        // SAFETY: shapes checked above; one thread per (sample, column).
        unsafe { launch.launch(grid_for(batch * self.dim)) }.map_err(GpuError::driver("launching fm_backward"))?;
        Ok(())
    }
}
