//! The DIEN-like model on the device, mirroring
//! `tiderec_operators::nn::dien::Dien`: the target query from the target
//! fields' pooled rows; the interest from a GRU over the behaviour sequence
//! and attention against the query (keys = states + inputs), or the sum of
//! the sequence's rows; then the MLP over `[x, pooled, u, u ⊙ q]`. Parameters:
//! GRU, attention `W`, MLP (the first two absent with sum pooling).

use super::{Buffer, DeviceNet, Sequences};
use crate::check::{self, grid_for};
use crate::nn::attention::{AttentionCache, AttentionPooling};
use crate::nn::gru::{Gru, GruCache};
use crate::nn::linear::{Mlp, MlpCache};
use crate::nn::wide::add_assign;
use crate::{Device, GpuError};
use cudarc::driver::{CudaSlice, LaunchArgs, PushKernelArg};
use tiderec_operators::nn::{DienConfig, Interest};

const OP: &str = "device dien";

/// The device computation of a DIEN-like model.
pub struct DeviceDien {
    num_dense: usize,
    num_sparse: usize,
    dim: usize,
    seqs: usize,
    /// The GRU and the attention (GRU + attention interest), or `None` (sum pooling).
    gru: Option<(Gru, AttentionPooling)>,
    mlp: Mlp,
    targets: CudaSlice<u32>,
    gru_cache: GruCache,
    att_cache: AttentionCache,
    mlp_cache: MlpCache,
    query: Buffer,
    keys: Buffer,
    interest: Buffer,
    mlp_in: Buffer,
    dx: Buffer,
    dinterest: Buffer,
    dquery: Buffer,
    dq_att: Buffer,
    dkeys: Buffer,
    dstates: Buffer,
    batch: usize,
    steps: usize,
}

impl DeviceDien {
    /// The layers of `config`, in the CPU model's parameter layout.
    pub fn new(dev: &Device, config: &DienConfig) -> Result<Self, GpuError> {
        let e = config.interest_dim();
        let with_gru = config.interest == Interest::GruAttention;
        let gru = Gru { input: e, hidden: e, offset: 0 };
        let attention = AttentionPooling { dim: e, offset: gru.num_params() };
        let skip = if with_gru { gru.num_params() + attention.num_params() } else { 0 };
        let mut widths = vec![config.num_dense + config.num_sparse * config.dim + 2 * e];
        widths.extend(&config.mlp);
        widths.push(1);
        let targets: Vec<u32> =
            config.target_fields.iter().map(|&t| check::u32_of(OP, "target field", t)).collect::<Result<_, _>>()?;
        Ok(DeviceDien {
            num_dense: config.num_dense,
            num_sparse: config.num_sparse,
            dim: config.dim,
            seqs: config.num_sequences,
            gru: with_gru.then_some((gru, attention)),
            mlp: Mlp::new(&widths, skip, false),
            targets: dev.upload(&targets)?,
            gru_cache: GruCache::default(),
            att_cache: AttentionCache::default(),
            mlp_cache: MlpCache::default(),
            query: Buffer::new(dev)?,
            keys: Buffer::new(dev)?,
            interest: Buffer::new(dev)?,
            mlp_in: Buffer::new(dev)?,
            dx: Buffer::new(dev)?,
            dinterest: Buffer::new(dev)?,
            dquery: Buffer::new(dev)?,
            dq_att: Buffer::new(dev)?,
            dkeys: Buffer::new(dev)?,
            dstates: Buffer::new(dev)?,
            batch: 0,
            steps: 0,
        })
    }

    fn e(&self) -> usize {
        self.seqs * self.dim
    }

    fn width(&self) -> usize {
        self.num_dense + self.num_sparse * self.dim + 2 * self.e()
    }

    /// The kernel shape arguments `(batch, steps, e)` as `u32`.
    fn shape(&self, batch: usize, steps: usize) -> Result<[u32; 3], GpuError> {
        check::product(OP, &[batch, steps.max(1), self.width()])?;
        Ok([check::u32_of(OP, "batch", batch)?, check::u32_of(OP, "steps", steps)?, check::u32_of(OP, "e", self.e())?])
    }
}

/// Launches the kernel `l` was built for over `n` threads (none when `n` is 0).
fn go(mut l: LaunchArgs<'_>, name: &'static str, n: usize) -> Result<(), GpuError> {
    if n == 0 {
        return Ok(());
    }
    // SAFETY: every caller sizes its buffers for the `n` threads' indices (reserved by
    // `Buffer::reserve` or checked by the model wrapper) and each kernel returns past `n`.
    unsafe { l.launch(grid_for(n)) }.map_err(GpuError::driver(name))?;
    Ok(())
}

impl DeviceNet for DeviceDien {
    fn sequence_width(&self) -> usize {
        self.e()
    }

    fn forward(
        &mut self,
        dev: &Device,
        params: &CudaSlice<f32>,
        dense: &CudaSlice<f32>,
        pooled: &CudaSlice<f32>,
        seq: Sequences<'_>,
        batch: usize,
    ) -> Result<&CudaSlice<f32>, GpuError> {
        let (e, steps) = (self.e(), seq.steps);
        let [b, t, eu] = self.shape(batch, steps)?;
        let (f, d, s) = (self.num_sparse as u32, self.dim as u32, self.seqs as u32);
        self.batch = batch;
        self.steps = steps;
        let query = self.query.reserve(dev, batch * e)?;
        {
            let mut l = dev.stream.launch_builder(dev.function("dien_query"));
            l.arg(pooled).arg(&self.targets).arg(&b).arg(&f).arg(&d).arg(&s).arg(&mut *query);
            go(l, "dien_query", batch * e)?;
        }
        let interest = self.interest.reserve(dev, batch * e)?;
        match &self.gru {
            None => {
                let mut l = dev.stream.launch_builder(dev.function("dien_sum_pool"));
                l.arg(seq.rows).arg(seq.lengths).arg(&b).arg(&t).arg(&eu).arg(&mut *interest);
                go(l, "dien_sum_pool", batch * e)?;
            }
            Some((gru, attention)) if steps > 0 => {
                gru.forward(dev, params, seq.rows, seq.lengths, batch, steps, &mut self.gru_cache)?;
                let states =
                    self.gru_cache.states.as_ref().ok_or_else(|| GpuError::shape(OP, "the GRU kept no states"))?;
                let keys = self.keys.reserve(dev, batch * steps * e)?;
                {
                    let mut l = dev.stream.launch_builder(dev.function("dien_keys"));
                    l.arg(states).arg(seq.rows).arg(&b).arg(&t).arg(&eu).arg(&mut *keys);
                    go(l, "dien_keys", batch * steps * e)?;
                }
                attention.forward(
                    dev,
                    params,
                    &self.query.0,
                    &self.keys.0,
                    seq.lengths,
                    batch,
                    steps,
                    interest,
                    &mut self.att_cache,
                )?;
            }
            Some(_) => dev.stream.memset_zeros(interest).map_err(GpuError::driver("zeroing the interest"))?,
        }
        let (nd, fd) = (self.num_dense as u32, (self.num_sparse * self.dim) as u32);
        let width = self.width();
        let mlp_in = self.mlp_in.reserve(dev, batch * width)?;
        {
            let mut l = dev.stream.launch_builder(dev.function("dien_mlp_input"));
            l.arg(dense)
                .arg(pooled)
                .arg(&self.interest.0)
                .arg(&self.query.0)
                .arg(&b)
                .arg(&nd)
                .arg(&fd)
                .arg(&eu)
                .arg(&mut *mlp_in);
            go(l, "dien_mlp_input", batch * width)?;
        }
        self.mlp.forward(dev, params, &self.mlp_in.0, batch, &mut self.mlp_cache)?;
        self.mlp_cache.output().ok_or_else(|| GpuError::shape(OP, "the MLP has no output"))
    }

    fn backward(
        &mut self,
        dev: &Device,
        params: &CudaSlice<f32>,
        _dense: &CudaSlice<f32>,
        _pooled: &CudaSlice<f32>,
        seq: Sequences<'_>,
        dlogits: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        dpooled: &mut CudaSlice<f32>,
        dseq: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let (batch, steps, e) = (self.batch, self.steps, self.e());
        let [b, t, eu] = self.shape(batch, steps)?;
        let (f, d, s) = (self.num_sparse as u32, self.dim as u32, self.seqs as u32);
        let (nd, fd) = (self.num_dense as u32, (self.num_sparse * self.dim) as u32);
        let width = self.width();
        let dx = self.dx.reserve(dev, batch * width)?;
        self.mlp.backward(dev, params, &self.mlp_in.0, &mut self.mlp_cache, dlogits, grads, Some(dx))?;
        {
            let mut l = dev.stream.launch_builder(dev.function("dien_dx_pooled"));
            l.arg(&self.dx.0).arg(&b).arg(&nd).arg(&fd).arg(&eu).arg(&mut *dpooled);
            go(l, "dien_dx_pooled", batch * self.num_sparse * self.dim)?;
        }
        let dinterest = self.dinterest.reserve(dev, batch * e)?;
        let dquery = self.dquery.reserve(dev, batch * e)?;
        {
            let mut l = dev.stream.launch_builder(dev.function("dien_dx_interest"));
            l.arg(&self.dx.0)
                .arg(&self.interest.0)
                .arg(&self.query.0)
                .arg(&b)
                .arg(&nd)
                .arg(&fd)
                .arg(&eu)
                .arg(&mut *dinterest)
                .arg(&mut *dquery);
            go(l, "dien_dx_interest", batch * e)?;
        }
        match &self.gru {
            None => {
                let mut l = dev.stream.launch_builder(dev.function("dien_sum_pool_backward"));
                l.arg(&self.dinterest.0).arg(seq.lengths).arg(&b).arg(&t).arg(&eu).arg(&mut *dseq);
                go(l, "dien_sum_pool_backward", batch * steps * e)?;
            }
            Some((gru, attention)) if steps > 0 => {
                let dq_att = self.dq_att.reserve(dev, batch * e)?;
                let dkeys = self.dkeys.reserve(dev, batch * steps * e)?;
                attention.backward(
                    dev,
                    params,
                    &self.query.0,
                    &self.keys.0,
                    seq.lengths,
                    &self.dinterest.0,
                    &mut self.att_cache,
                    grads,
                    dq_att,
                    dkeys,
                )?;
                add_assign(dev, &mut self.dquery.0, &self.dq_att.0, batch * e)?;
                let dstates = self.dstates.reserve(dev, batch * steps * e)?;
                {
                    let mut l = dev.stream.launch_builder(dev.function("dien_keys_to_states"));
                    l.arg(&self.dkeys.0).arg(&b).arg(&t).arg(&eu).arg(&mut *dstates);
                    go(l, "dien_keys_to_states", batch * steps * e)?;
                }
                gru.backward(dev, params, seq.rows, seq.lengths, &mut self.gru_cache, &self.dstates.0, grads, dseq)?;
                {
                    let mut l = dev.stream.launch_builder(dev.function("dien_residual"));
                    l.arg(&self.dkeys.0).arg(seq.lengths).arg(&b).arg(&t).arg(&eu).arg(&mut *dseq);
                    go(l, "dien_residual", batch * steps * e)?;
                }
            }
            Some((gru, attention)) => {
                let n = gru.num_params() + attention.num_params();
                let mut head = grads.slice_mut(..n);
                dev.stream.memset_zeros(&mut head).map_err(GpuError::driver("zeroing the GRU's gradient"))?;
            }
        }
        {
            let mut l = dev.stream.launch_builder(dev.function("dien_target_grad"));
            l.arg(&self.dquery.0).arg(&self.targets).arg(&b).arg(&f).arg(&d).arg(&s).arg(&mut *dpooled);
            go(l, "dien_target_grad", batch * self.dim)
        }
    }
}
