//! Fully connected layers and MLPs on the device, mirroring
//! `tiderec_operators::nn::linear::Linear` and `nn::mlp::Mlp`: `W` is
//! `[output × input]` row-major at `offset` in the flat parameter buffer,
//! followed by `b`; `backward` overwrites the layer's gradient ranges.

use crate::blas::{gemm, Op};
use crate::check::{self, grid_for};
use crate::{Device, GpuError};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

/// One fully connected layer `y = x·Wᵀ + b` inside a flat parameter buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Linear {
    /// Input width.
    pub input: usize,
    /// Output width.
    pub output: usize,
    /// Where `W` starts in the flat parameter buffer.
    pub offset: usize,
}

impl Linear {
    /// Number of parameters (`W` and `b`).
    pub fn num_params(&self) -> usize {
        self.output * self.input + self.output
    }

    fn weights(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.output * self.input
    }

    fn bias(&self) -> std::ops::Range<usize> {
        let s = self.weights().end;
        s..s + self.output
    }

    fn check(&self, op: &'static str, params: &CudaSlice<f32>, name: &str) -> Result<(), GpuError> {
        check::positive(op, "input", self.input)?;
        check::positive(op, "output", self.output)?;
        let end = self.offset + self.num_params();
        check::len(op, name, params, end, || format!("layer {}→{} at offset {}", self.input, self.output, self.offset))
    }

    /// `y[batch × output] = act(x[batch × input] · Wᵀ + b)`, `act` a ReLU when
    /// `relu`: one sgemm, then the bias add and the ReLU in one pass.
    pub fn forward(
        &self,
        dev: &Device,
        params: &CudaSlice<f32>,
        x: &CudaSlice<f32>,
        batch: usize,
        relu: bool,
        y: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        const OP: &str = "linear forward";
        self.check(OP, params, "params")?;
        check::len(OP, "x", x, check::product(OP, &[batch, self.input])?, || {
            format!("batch {batch} × {}", self.input)
        })?;
        let n = check::product(OP, &[batch, self.output])?;
        check::len(OP, "y", y, n, || format!("batch {batch} × {}", self.output))?;
        if batch == 0 {
            return Ok(());
        }
        let w = params.slice(self.weights());
        gemm(
            dev,
            OP,
            (Op::N, Op::T),
            (batch, self.output, self.input),
            x,
            self.input,
            &w,
            self.input,
            0.0,
            y,
            self.output,
        )?;
        bias_act(dev, y, params, self.bias().start, batch, self.output, relu)
    }

    /// `dW = dyᵀ·x` and `db = Σ dy` into `grads` (overwritten), and
    /// `dx = dy·W` when asked.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        dev: &Device,
        params: &CudaSlice<f32>,
        x: &CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        batch: usize,
        grads: &mut CudaSlice<f32>,
        dx: Option<&mut CudaSlice<f32>>,
    ) -> Result<(), GpuError> {
        const OP: &str = "linear backward";
        self.check(OP, params, "params")?;
        self.check(OP, grads, "grads")?;
        check::len(OP, "x", x, check::product(OP, &[batch, self.input])?, || {
            format!("batch {batch} × {}", self.input)
        })?;
        check::len(OP, "dy", dy, check::product(OP, &[batch, self.output])?, || {
            format!("batch {batch} × {}", self.output)
        })?;
        if let Some(dx) = &dx {
            check::len(OP, "dx", *dx, batch * self.input, || format!("batch {batch} × {}", self.input))?;
        }
        {
            let mut gw = grads.slice_mut(self.weights());
            if batch == 0 {
                dev.stream.memset_zeros(&mut gw).map_err(GpuError::driver("zeroing a gradient"))?;
            } else {
                gemm(
                    dev,
                    OP,
                    (Op::T, Op::N),
                    (self.output, self.input, batch),
                    dy,
                    self.output,
                    x,
                    self.input,
                    0.0,
                    &mut gw,
                    self.input,
                )?;
            }
        }
        column_sum(dev, dy, batch, self.output, grads, self.bias().start)?;
        if let Some(dx) = dx {
            if batch > 0 {
                let w = params.slice(self.weights());
                gemm(
                    dev,
                    OP,
                    (Op::N, Op::N),
                    (batch, self.input, self.output),
                    dy,
                    self.output,
                    &w,
                    self.input,
                    0.0,
                    dx,
                    self.input,
                )?;
            }
        }
        Ok(())
    }
}

/// `y[r, c] = act(y[r, c] + params[bias + c])` over `rows × cols`.
fn bias_act(
    dev: &Device,
    y: &mut CudaSlice<f32>,
    params: &CudaSlice<f32>,
    bias: usize,
    rows: usize,
    cols: usize,
    relu: bool,
) -> Result<(), GpuError> {
    const OP: &str = "bias and activation";
    let (r, c) = (check::u32_of(OP, "rows", rows)?, check::u32_of(OP, "cols", cols)?);
    let b = params.slice(bias..bias + cols);
    let relu = relu as i32;
    let mut launch = dev.stream.launch_builder(dev.function("bias_act_rows"));
    launch.arg(y).arg(&b).arg(&r).arg(&c).arg(&relu);
    // SAFETY: `y` holds rows × cols values and `b` cols (checked by the callers); the kernel stays below rows × cols.
    unsafe { launch.launch(grid_for(rows * cols)) }.map_err(GpuError::driver("launching bias_act_rows"))?;
    Ok(())
}

/// `g ← g · [out > 0]` over the first `n` values (the ReLU's backward, as the CPU's).
pub fn relu_backward(dev: &Device, g: &mut CudaSlice<f32>, out: &CudaSlice<f32>, n: usize) -> Result<(), GpuError> {
    const OP: &str = "relu backward";
    check::len(OP, "g", g, n, || format!("{n} values"))?;
    check::len(OP, "out", out, n, || format!("{n} values"))?;
    if n == 0 {
        return Ok(());
    }
    let n64 = n as u64;
    let mut launch = dev.stream.launch_builder(dev.function("relu_backward"));
    launch.arg(g).arg(out).arg(&n64);
    // SAFETY: both buffers hold at least n values (checked above).
    unsafe { launch.launch(grid_for(n)) }.map_err(GpuError::driver("launching relu_backward"))?;
    Ok(())
}

/// `out[at + c] = Σ_r a[r, c]` for the `rows × cols` row-major `a` (the bias
/// gradient; a fixed summation order, the same on every run).
pub fn column_sum(
    dev: &Device,
    a: &CudaSlice<f32>,
    rows: usize,
    cols: usize,
    out: &mut CudaSlice<f32>,
    at: usize,
) -> Result<(), GpuError> {
    column_reduce(dev, a, None, rows, cols, out, at)
}

/// Rows per chunk of the first pass of [`column_reduce`] (at least; more when
/// the chunks would exceed the grid's second dimension).
const CHUNK_ROWS: usize = 256;

/// `out[at + c] = Σ_r w[r] · a[r, c]` (`Σ_r a[r, c]` without `w`) for the
/// `rows × cols` row-major `a`, in a fixed order: per chunk of rows, then the
/// chunks in order (see `column_reduce_chunks` in `linear.cu`).
pub(crate) fn column_reduce(
    dev: &Device,
    a: &CudaSlice<f32>,
    w: Option<&CudaSlice<f32>>,
    rows: usize,
    cols: usize,
    out: &mut CudaSlice<f32>,
    at: usize,
) -> Result<(), GpuError> {
    const OP: &str = "column sum";
    check::len(OP, "a", a, check::product(OP, &[rows, cols])?, || format!("{rows} × {cols}"))?;
    check::len(OP, "out", out, at + cols, || format!("{cols} sums at {at}"))?;
    if let Some(w) = w {
        check::len(OP, "weights", w, rows, || format!("{rows} rows"))?;
    }
    if cols == 0 {
        return Ok(());
    }
    let chunk_rows = CHUNK_ROWS.max(rows.div_ceil(u16::MAX as usize));
    let chunks = rows.div_ceil(chunk_rows).max(1);
    let (r, c) = (check::u32_of(OP, "rows", rows)?, check::u32_of(OP, "cols", cols)?);
    let (k32, chunk32) = (check::u32_of(OP, "chunks", chunks)?, check::u32_of(OP, "chunk rows", chunk_rows)?);
    // The partial sums live in the device's scratch, grown when too small: every
    // value the finish reads, the chunks kernel writes first, and both are
    // queued on the device's one stream while the lock is held.
    let mut scratch = dev.reduce_scratch.lock().unwrap_or_else(|p| p.into_inner());
    let partial = dev.grown(&mut scratch, chunks * cols)?;
    let weighted = w.is_some() as i32;
    let cfg = LaunchConfig { grid_dim: (c.div_ceil(32), k32, 1), block_dim: (32, 8, 1), shared_mem_bytes: 0 };
    let mut launch = dev.stream.launch_builder(dev.function("column_reduce_chunks"));
    launch.arg(a).arg(w.unwrap_or(a)).arg(&weighted).arg(&r).arg(&c).arg(&chunk32).arg(&mut *partial);
    // SAFETY: `a` holds rows × cols values, `w` (when used) rows, `partial` at least
    // chunks × cols (checked above); the block is the (32, 8) the kernel assumes.
    unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching column_reduce_chunks"))?;
    let mut sums = out.slice_mut(at..at + cols);
    let mut launch = dev.stream.launch_builder(dev.function("column_reduce_finish"));
    launch.arg(&*partial).arg(&k32).arg(&c).arg(&mut sums);
    // SAFETY: `partial` holds at least chunks × cols values, `sums` cols.
    unsafe { launch.launch(grid_for(cols)) }.map_err(GpuError::driver("launching column_reduce_finish"))?;
    Ok(())
}

/// A stack of [`Linear`] layers with ReLU between them (and after the last
/// when `relu_last`), laid out in the flat buffer as the CPU's `Mlp::new`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mlp {
    /// The layers in order.
    pub layers: Vec<Linear>,
    /// Whether the last layer is followed by a ReLU.
    pub relu_last: bool,
}

/// The activations an [`Mlp`] keeps from `forward` for `backward`.
#[derive(Debug, Default)]
pub struct MlpCache {
    outs: Vec<CudaSlice<f32>>,
    batch: usize,
    /// The backward's two gradient buffers, taking turns layer by layer; kept
    /// from step to step and grown when a batch needs more.
    dgrads: Vec<CudaSlice<f32>>,
}

impl MlpCache {
    /// The output of the last forward (`[batch × output]`).
    pub fn output(&self) -> Option<&CudaSlice<f32>> {
        self.outs.last()
    }
}

impl Mlp {
    /// Layers for `widths` whose weights start at `offset`.
    pub fn new(widths: &[usize], offset: usize, relu_last: bool) -> Self {
        let mut layers = Vec::new();
        let mut off = offset;
        for w in widths.windows(2) {
            let l = Linear { input: w[0], output: w[1], offset: off };
            off += l.num_params();
            layers.push(l);
        }
        Mlp { layers, relu_last }
    }

    /// Total parameters of all layers.
    pub fn num_params(&self) -> usize {
        self.layers.iter().map(Linear::num_params).sum()
    }

    fn relu_after(&self, i: usize) -> bool {
        i + 1 < self.layers.len() || self.relu_last
    }

    /// Runs the stack on `x[batch × input]`; the output is `cache.output()`.
    pub fn forward(
        &self,
        dev: &Device,
        params: &CudaSlice<f32>,
        x: &CudaSlice<f32>,
        batch: usize,
        cache: &mut MlpCache,
    ) -> Result<(), GpuError> {
        if self.layers.is_empty() {
            return Err(GpuError::shape("mlp forward", "the MLP has no layers"));
        }
        cache.batch = batch;
        cache.outs.truncate(self.layers.len());
        for (i, l) in self.layers.iter().enumerate() {
            let need = check::product("mlp forward", &[batch, l.output])?.max(1);
            if cache.outs.len() <= i {
                cache.outs.push(dev.zeros(need)?);
            } else if cache.outs[i].len() < need {
                cache.outs[i] = dev.zeros(need)?;
            }
            let (done, rest) = cache.outs.split_at_mut(i);
            let input = if i == 0 { x } else { &done[i - 1] };
            l.forward(dev, params, input, batch, self.relu_after(i), &mut rest[0])?;
        }
        Ok(())
    }

    /// Back-propagates `dout` through the last forward: layer gradients into
    /// `grads` (overwritten), the input gradient into `dx` when asked. The
    /// gradients between layers live in `cache`'s buffers, which a backward
    /// allocates only when a batch is larger than any before.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        dev: &Device,
        params: &CudaSlice<f32>,
        x: &CudaSlice<f32>,
        cache: &mut MlpCache,
        dout: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        dx: Option<&mut CudaSlice<f32>>,
    ) -> Result<(), GpuError> {
        const OP: &str = "mlp backward";
        let n = self.layers.len();
        if n == 0 || cache.outs.len() < n {
            return Err(GpuError::shape(OP, "backward without a forward of this MLP"));
        }
        let batch = cache.batch;
        let last = &self.layers[n - 1];
        let size = check::product(OP, &[batch, last.output])?;
        check::len(OP, "dout", dout, size, || format!("batch {batch} × {}", last.output))?;
        // Every layer's output gradient, and every input gradient but the first layer's.
        let widest = self.layers.iter().map(|l| l.output).max().unwrap_or(0);
        let need = check::product(OP, &[batch, widest])?.max(1);
        if cache.dgrads.len() < 2 || cache.dgrads[0].len() < need {
            cache.dgrads = vec![dev.zeros(need)?, dev.zeros(need)?];
        }
        let MlpCache { outs, dgrads, .. } = cache;
        let (first, second) = dgrads.split_at_mut(1);
        let (mut grad, mut below) = (&mut first[0], &mut second[0]);
        if size > 0 {
            dev.stream
                .memcpy_dtod(&dout.slice(..size), &mut grad.slice_mut(..size))
                .map_err(GpuError::driver("copying the output gradient"))?;
        }
        let mut dx = dx;
        for i in (0..n).rev() {
            let l = &self.layers[i];
            if self.relu_after(i) {
                relu_backward(dev, grad, &outs[i], batch * l.output)?;
            }
            let input = if i == 0 { x } else { &outs[i - 1] };
            if i == 0 {
                l.backward(dev, params, input, grad, batch, grads, dx.as_deref_mut())?;
            } else {
                l.backward(dev, params, input, grad, batch, grads, Some(&mut *below))?;
                std::mem::swap(&mut grad, &mut below);
            }
        }
        Ok(())
    }
}
