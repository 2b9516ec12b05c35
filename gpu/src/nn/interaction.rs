//! DLRM's dot interaction on the device, mirroring
//! `tiderec_operators::nn::interaction::DotInteraction`: per sample the
//! output is the bottom output `z₀` followed by `⟨zᵢ, zⱼ⟩` for `j < i` (`j ≤ i`
//! with self-interaction) in the lower triangle's row order, `⟨z₀, z₀⟩` last
//! with self-interaction.

use crate::check;
use crate::{Device, GpuError};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// Samples (one warp each) per block of the interaction kernels, where their
/// shared memory fits: enough resident warps per SM to hide the loads' latency.
const SAMPLES_PER_BLOCK: usize = 8;

/// The interaction of one dense vector with `num_sparse` pooled embeddings,
/// with its pair table on the device.
#[derive(Debug)]
pub struct DotInteraction {
    /// Pooled embeddings per sample.
    pub num_sparse: usize,
    /// Vector width.
    pub dim: usize,
    /// Whether `⟨zᵢ, zᵢ⟩` terms are included.
    pub self_interaction: bool,
    pair_i: CudaSlice<u32>,
    pair_j: CudaSlice<u32>,
    num_pairs: usize,
}

/// The pairs `(i, j)` in the order of the output (the CPU's order).
pub fn pair_order(num_sparse: usize, self_interaction: bool) -> Vec<(u32, u32)> {
    let n = num_sparse + 1;
    let mut pairs = Vec::new();
    for i in 1..n {
        let upto = if self_interaction { i + 1 } else { i };
        for j in 0..upto {
            pairs.push((i as u32, j as u32));
        }
    }
    if self_interaction {
        pairs.push((0, 0));
    }
    pairs
}

impl DotInteraction {
    /// The interaction's shape, with its pair table uploaded to `dev`.
    pub fn new(dev: &Device, num_sparse: usize, dim: usize, self_interaction: bool) -> Result<Self, GpuError> {
        const OP: &str = "dot interaction";
        check::positive(OP, "dim", dim)?;
        let n = num_sparse + 1;
        let smem = (n * dim + n * n) * 4;
        if smem > check::MAX_SHARED {
            return Err(GpuError::shape(
                OP,
                format!(
                    "{n} vectors of width {dim} need {smem} bytes of shared memory per sample, at most {}",
                    check::MAX_SHARED
                ),
            ));
        }
        let pairs = pair_order(num_sparse, self_interaction);
        let pi: Vec<u32> = pairs.iter().map(|p| p.0).collect();
        let pj: Vec<u32> = pairs.iter().map(|p| p.1).collect();
        Ok(DotInteraction {
            num_sparse,
            dim,
            self_interaction,
            pair_i: dev.upload(&pi)?,
            pair_j: dev.upload(&pj)?,
            num_pairs: pairs.len(),
        })
    }

    /// Dot products per sample.
    pub fn num_pairs(&self) -> usize {
        self.num_pairs
    }

    /// Output width per sample: `dim + num_pairs`.
    pub fn output_dim(&self) -> usize {
        self.dim + self.num_pairs
    }

    fn check_inputs(
        &self,
        op: &'static str,
        dense: &CudaSlice<f32>,
        pooled: &CudaSlice<f32>,
        batch: usize,
    ) -> Result<(), GpuError> {
        let d = self.dim;
        check::len(op, "dense", dense, check::product(op, &[batch, d])?, || format!("batch {batch} × {d}"))?;
        check::len(op, "pooled", pooled, check::product(op, &[batch, self.num_sparse, d])?, || {
            format!("batch {batch} × {} × {d}", self.num_sparse)
        })?;
        check::u32_of(op, "batch", batch)?;
        Ok(())
    }

    /// `out[batch × output_dim]` from `dense[batch × dim]` and `pooled[batch × num_sparse × dim]`.
    pub fn forward(
        &self,
        dev: &Device,
        dense: &CudaSlice<f32>,
        pooled: &CudaSlice<f32>,
        batch: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        const OP: &str = "dot interaction forward";
        self.check_inputs(OP, dense, pooled, batch)?;
        check::len(OP, "out", out, check::product(OP, &[batch, self.output_dim()])?, || {
            format!("batch {batch} × {}", self.output_dim())
        })?;
        if batch == 0 {
            return Ok(());
        }
        let n = self.num_sparse + 1;
        // One warp per sample, rows `dim | 1` floats apart (see interaction.cu).
        let cfg = check::warps_sharing_memory(OP, batch, n * (self.dim | 1) * 4, SAMPLES_PER_BLOCK)?;
        let (b, f, d, p) = (batch as u32, self.num_sparse as u32, self.dim as u32, self.num_pairs as u32);
        let mut launch = dev.stream.launch_builder(dev.function("interaction_forward"));
        launch.arg(dense).arg(pooled).arg(&self.pair_i).arg(&self.pair_j).arg(&b).arg(&f).arg(&d).arg(&p).arg(out);
        // SAFETY: the buffers hold the shapes checked above; the pair table has num_pairs entries below n.
        unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching interaction_forward"))?;
        Ok(())
    }

    /// `ddense` and `dpooled` (overwritten) from `dout[batch × output_dim]`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        dev: &Device,
        dense: &CudaSlice<f32>,
        pooled: &CudaSlice<f32>,
        dout: &CudaSlice<f32>,
        batch: usize,
        ddense: &mut CudaSlice<f32>,
        dpooled: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        const OP: &str = "dot interaction backward";
        self.check_inputs(OP, dense, pooled, batch)?;
        let d = self.dim;
        check::len(OP, "dout", dout, check::product(OP, &[batch, self.output_dim()])?, || {
            format!("batch {batch} × {}", self.output_dim())
        })?;
        check::len(OP, "ddense", ddense, batch * d, || format!("batch {batch} × {d}"))?;
        check::len(OP, "dpooled", dpooled, batch * self.num_sparse * d, || {
            format!("batch {batch} × {} × {d}", self.num_sparse)
        })?;
        if batch == 0 {
            return Ok(());
        }
        let n = self.num_sparse + 1;
        let cfg = check::warps_sharing_memory(OP, batch, (n * d + n * n) * 4, SAMPLES_PER_BLOCK)?;
        let (b, f, dd, p) = (batch as u32, self.num_sparse as u32, d as u32, self.num_pairs as u32);
        let mut launch = dev.stream.launch_builder(dev.function("interaction_backward"));
        launch
            .arg(dense)
            .arg(pooled)
            .arg(dout)
            .arg(&self.pair_i)
            .arg(&self.pair_j)
            .arg(&b)
            .arg(&f)
            .arg(&dd)
            .arg(&p)
            .arg(ddense)
            .arg(dpooled);
        // SAFETY: as in `forward`, with dout, ddense and dpooled checked above.
        unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching interaction_backward"))?;
        Ok(())
    }
}
