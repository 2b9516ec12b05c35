//! A GPU worker that trains alone with everything on the device: its
//! embedding rows with their optimizer state, the pooling, the dense model
//! with its gradients and optimizer state.
//!
//! Per training step the host uploads the batch (global row numbers, bag
//! offsets, entry weights, dense values, labels) and reads back three numbers
//! once the step is done: the loss sum (the step's result), the guard the
//! device set from it (a non-finite loss skips every update, on the device,
//! so the host queues the whole step without waiting) and a flag that some
//! entry gradient or updated dense parameter is not finite (and the logits,
//! when a prequential score keeps them). Nothing else crosses PCIe between
//! checkpoints, and a checkpoint (or any read of the state by the host) reads
//! the rows trained since the last read, marked on the device by each step
//! (see `readback`).
//!
//! ## Invariants
//!
//! * **The CPU worker's step, on the device.** One step is the single CPU
//!   worker's step of `tiderec_operators::train` with the fixed store and the
//!   `rows` exchange: pool each bag in entry order, forward, BCE gradient with
//!   scale 1, backward, then sum each row's entry gradients in entry order,
//!   scale by `1 / batch` and update the row once; the dense optimizer takes
//!   the gradient scaled by `1 / batch`. The learning rates follow the
//!   schedules by the count of training steps, as the owner's do. A
//!   non-finite loss updates nothing.
//! * **The CPU's starting point and layouts.** The rows start as the fixed
//!   store of one worker starts for the seed, the dense parameters as the CPU
//!   model's, and every table lives in one device buffer in table order (row
//!   `id` of table `t` is global row `base[t] + id`), so the host reads a table
//!   back as the fixed store of one worker holds it.
//! * **Checked on the host.** Row numbers are checked against their tables
//!   while the host builds them; the device never needs a flag read for them.
//! * **What it trains.** Every built-in model (DLRM, LR, FM, DeepFM, Wide &
//!   Deep, and DIEN over its behaviour sequences), SGD or row-wise Adagrad
//!   rows, no L2 penalty, every table in one `u32` row space.
//!   [`ResidentWorker::supports`] says why a configuration is refused; such a
//!   run trains through the host path.
//! * **Sequences are bags of one step.** Step `t` of a sample's sequence `j`
//!   is a bag of one row (none past the sample's length) pooled by the
//!   fields' kernel into the `[batch × steps × sequences · dim]` layout the
//!   models read; its gradient comes back through the same bags, after the
//!   fields' entries, and each row's entries — fields' first, then the
//!   sequences' in step order — are summed in that order and the row updated
//!   once. Where a row repeats within a sequence or across fields and
//!   sequences the CPU trainer sums it in another order, so the two agree to
//!   rounding there, not bit for bit.
//! * **A step's launches depend on its batch's shape only.** What changes
//!   with the step's count (the learning rates, Adam's bias corrections) is
//!   written to device memory before the step is queued, so the step may be
//!   captured as a CUDA graph and replayed ([`ResidentWorker::set_graphs`];
//!   the `graphs` module states when).

mod graphs;
mod host;
mod phases;
mod readback;
mod staging;

use crate::model::{net, Buffer, DeviceNet, Sequences};
use crate::optim::{kind_of, DenseHyper, DenseOptimizer};
use crate::sparse::{HotRows, RowTable, SparseRule};
use crate::{check, Device, GpuError};
use cudarc::driver::{CudaSlice, PushKernelArg};
pub use graphs::GraphCounts;
use graphs::{Graphs, Plan};
pub use phases::PhaseTimes;
use phases::{Phase, PhaseClock};
use staging::{Shape, Staging};
use tiderec_operators::optim::{DenseOptimizerState, OptimizerParams, SparseOptimizerKind};
use tiderec_operators::shard::EmbeddingShard;
use tiderec_operators::snapshot::{TableRows, WorkerSnapshot};
use tiderec_operators::train::{EngineStep, NextBatch, StepEngine, TrainerConfig};
use tiderec_operators::Batch;

/// The outcome of one training step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ResidentStep {
    /// Samples trained on.
    pub samples: u64,
    /// Σ BCE loss over the batch (before the update), in fp64.
    pub loss_sum: f64,
    /// The loss, an entry gradient or an updated dense parameter was not finite
    /// (with a non-finite loss nothing was updated).
    pub non_finite: bool,
}

/// A step [`ResidentWorker::launch`] queued, for [`ResidentWorker::finish`].
#[derive(Clone, Copy, Debug)]
struct Pending {
    samples: u64,
    /// Where the step's loss lies in `d_loss`.
    loss_at: usize,
    /// Read the step's logits back once it is done.
    keep_logits: bool,
}

/// One worker's whole model on one GPU (see the module docs).
pub struct ResidentWorker {
    dev: Device,
    net: Box<dyn DeviceNet>,
    num_dense: usize,
    dim: usize,
    table_sizes: Vec<u64>,
    /// First global row of each table.
    bases: Vec<u64>,
    seed: u64,
    rows: RowTable,
    sparse: (SparseOptimizerKind, OptimizerParams),
    dense_hp: OptimizerParams,
    params: CudaSlice<f32>,
    grads: CudaSlice<f32>,
    optimizer: DenseOptimizer,
    train_steps: u64,
    staging: Staging,
    /// The step launched and not yet finished.
    pending: Option<Pending>,
    /// The batch staged by [`train_then_prepare`](ResidentWorker::train_then_prepare)
    /// for the next step, while nothing else has been staged since.
    prepared: Option<Batch>,
    /// The loss's partial sums and total (`bce_sum_queued`).
    d_loss: CudaSlice<f64>,
    /// Set on the device when the step's loss is not finite: its updates skip themselves.
    d_skip: CudaSlice<u32>,
    d_pooled: Buffer,
    d_dpooled: Buffer,
    d_logits: Buffer,
    d_dlogits: Buffer,
    d_entry_grads: Buffer,
    d_flag: CudaSlice<u32>,
    /// One bit per global row: the rows training steps updated since the host
    /// last read them back (`readback`) or the worker was loaded.
    d_trained: CudaSlice<u32>,
    /// The buffers reading rows back reuses.
    read_scratch: crate::row_copy::RowScratch,
    /// The table each behaviour sequence reads (none for a model without them).
    seq_tables: Vec<usize>,
    /// The longest sequence the model takes.
    max_steps: usize,
    /// The sequences' rows (`[batch × steps × sequences · dim]`) and their gradient.
    d_seq: Buffer,
    d_dseq: Buffer,
    logits: Vec<f32>,
    /// Phase timing, when asked for.
    clock: Option<PhaseClock>,
    /// The training step's CUDA graphs, when on.
    graphs: Graphs,
}

impl ResidentWorker {
    /// Why `config` cannot train on one device-resident worker, if it cannot.
    pub fn supports(config: &TrainerConfig) -> Result<(), String> {
        if config.sequence_tables.len() != config.model.num_sequences() {
            return Err(format!(
                "{} sequence tables for a model of {} behaviour sequences",
                config.sequence_tables.len(),
                config.model.num_sequences()
            ));
        }
        // The rows as one worker's device shard holds them: every row, here.
        crate::device_shard::DeviceShard::supports(config, 1)?;
        if config.dense_hp.l2_penalty != 0.0 {
            return Err("an L2 penalty on the dense parameters is applied on the host".into());
        }
        Ok(())
    }

    /// Builds `config`'s model and rows on `dev` as one CPU worker starts them for the seed.
    pub fn new(dev: &Device, config: &TrainerConfig) -> Result<Self, GpuError> {
        Self::supports(config).map_err(GpuError::Unsupported)?;
        let net = net(&config.model, dev)?
            .ok_or_else(|| GpuError::Unsupported("this model has no device-resident form".into()))?;
        let cpu = config.model.build::<f32>(config.seed).map_err(|e| GpuError::Unsupported(format!("model: {e}")))?;
        let dim = config.model.embedding_dim();
        let sparse = (config.sparse_optimizer, config.sparse_hp);
        // A workspace of the worker's own for cuBLAS, with or without graphs, so both pick the same GEMMs.
        dev.fix_blas_workspace()?;
        let Seeded { rows, state, bases } = seeded_rows(dim, &config.table_sizes, config.seed, sparse)?;
        let total_rows = state.len();
        let table = RowTable::upload(dev, &rows, &state, dim)?;
        drop((rows, state));
        let params = dev.upload(cpu.params())?;
        let n = cpu.params().len();
        let optimizer = DenseOptimizer::new(dev, kind_of(config.dense_optimizer), hyper(&config.dense_hp), n)?;
        Ok(ResidentWorker {
            net,
            num_dense: config.model.num_dense(),
            dim,
            table_sizes: config.table_sizes.clone(),
            bases,
            seed: config.seed,
            rows: table,
            sparse: (config.sparse_optimizer, config.sparse_hp),
            dense_hp: config.dense_hp,
            grads: dev.zeros(n)?,
            params,
            optimizer,
            train_steps: 0,
            staging: Staging::new(dev)?,
            pending: None,
            prepared: None,
            d_pooled: Buffer::new(dev)?,
            d_dpooled: Buffer::new(dev)?,
            d_logits: Buffer::new(dev)?,
            d_dlogits: Buffer::new(dev)?,
            d_entry_grads: Buffer::new(dev)?,
            d_flag: dev.zeros(1)?,
            d_trained: dev.zeros(readback::trained_words(total_rows))?,
            read_scratch: Default::default(),
            d_loss: dev.zeros(1)?,
            d_skip: dev.zeros(1)?,
            seq_tables: config.sequence_tables.clone(),
            max_steps: config.model.max_sequence_len(),
            d_seq: Buffer::new(dev)?,
            d_dseq: Buffer::new(dev)?,
            logits: Vec::new(),
            clock: None,
            graphs: Graphs::default(),
            dev: dev.clone(),
        })
    }

    /// Sets how the row update sums a hot row's duplicates (kept across a restore).
    pub fn set_hot_rows(&mut self, hot_rows: HotRows) -> Result<(), GpuError> {
        self.graphs.clear();
        self.rows.set_hot_rows(hot_rows)
    }

    /// Runs each training step as a CUDA graph (`on`), or as the kernel
    /// launches it is made of (the default). Both give the same steps bit for
    /// bit. A graph is captured for each staging slot and batch shape once
    /// that shape has run without one; it is replayed while no device buffer
    /// is allocated (a larger batch, a restore, an evaluation batch of a new
    /// size drop every graph). The phase clock runs steps without graphs.
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs.set_on(on);
    }

    /// Steps run as CUDA graphs and graphs captured so far.
    pub fn graph_counts(&self) -> GraphCounts {
        self.graphs.counts()
    }

    /// Training steps applied so far.
    pub fn train_steps(&self) -> u64 {
        self.train_steps
    }

    /// The logits of the last [`train`](Self::train) with `keep_logits`, or of the last [`predict`](Self::predict).
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Trains one step on `batch`; with `keep_logits` the logits made before
    /// the update are kept for [`logits`](Self::logits) (prequential scoring).
    pub fn train(&mut self, batch: &Batch, keep_logits: bool) -> Result<ResidentStep, GpuError> {
        self.train_then_prepare(batch, keep_logits, &mut || None)
    }

    /// [`train`](Self::train) on `batch` and, once its step is queued, stages the batch
    /// `next` gives (built on the host and uploaded while the device runs the step), so
    /// that a following step on an equal batch starts at once. That step compares the
    /// batches: any other batch is staged as `train` stages it. A batch `next` gives that
    /// cannot be staged is left to the step that trains it, which reports why. The same
    /// steps as `train` on each batch.
    pub fn train_then_prepare(
        &mut self,
        batch: &Batch,
        keep_logits: bool,
        next: NextBatch<'_>,
    ) -> Result<ResidentStep, GpuError> {
        if self.prepared.take().as_ref() != Some(batch) {
            self.stage(batch)?;
        }
        self.launch(keep_logits)?;
        if let Some(batch) = next() {
            if self.stage(&batch).is_ok() {
                self.prepared = Some(batch);
            }
        }
        self.finish()
    }

    /// Trains one step on each batch in turn, building and uploading the next
    /// batch while the device runs the step before; the steps' outcomes in order.
    /// The same steps as [`train`](Self::train) on each batch.
    pub fn train_all<'a>(
        &mut self,
        batches: impl IntoIterator<Item = &'a Batch>,
    ) -> Result<Vec<ResidentStep>, GpuError> {
        let mut batches = batches.into_iter();
        let mut out = Vec::new();
        let Some(first) = batches.next() else { return Ok(out) };
        self.stage(first)?;
        loop {
            self.launch(false)?;
            let next = batches.next();
            if let Some(batch) = next {
                if let Err(e) = self.stage(batch) {
                    // The launched step is finished (and its count settled) before the failure is told.
                    self.finish()?;
                    return Err(e);
                }
            }
            out.push(self.finish()?);
            if next.is_none() {
                return Ok(out);
            }
        }
    }

    /// Builds `batch`'s upload on the host and starts copying it to the device
    /// (a batch staged before and not launched is dropped). The device may
    /// still be running the step before.
    pub fn stage(&mut self, batch: &Batch) -> Result<(), GpuError> {
        // Whatever was prepared or staged is dropped, so a batch that fails here leaves none.
        self.prepared = None;
        self.staging.unstage();
        let (f, nd) = (batch.sparse.len(), self.num_dense);
        let seqs = self.seq_tables.len();
        if batch.num_dense != nd || f != self.table_sizes.len() || batch.sequences.len() != seqs {
            return Err(GpuError::shape(
                "resident batch",
                format!(
                    "a batch of {} dense values, {f} sparse and {} sequence fields for a model of {nd} dense, {} \
                     sparse and {seqs} sequence fields",
                    batch.num_dense,
                    batch.sequences.len(),
                    self.table_sizes.len()
                ),
            ));
        }
        if let Some(clock) = &mut self.clock {
            self.dev.synchronize()?;
            clock.start();
        }
        if let Some(first) = batch.sequences.first() {
            // From the offsets alone, so that a malformed batch reaches the staging's check, not a panic.
            let len_of = |w: &[u32]| w[1].saturating_sub(w[0]) as usize;
            if let Some((i, w)) = first.offsets.windows(2).enumerate().find(|(_, w)| len_of(w) > self.max_steps) {
                let len = len_of(w);
                return Err(GpuError::shape(
                    "resident batch",
                    format!(
                        "sample {i}'s behaviour sequence of {len} steps is longer than the model's {}",
                        self.max_steps
                    ),
                ));
            }
        }
        self.staging.stage(&self.dev, batch, (&self.table_sizes, &self.bases, &self.seq_tables))?;
        if let Some(clock) = &mut self.clock {
            clock.book(Phase::Host);
            self.staging.synchronize()?;
            clock.book(Phase::Upload);
        }
        Ok(())
    }

    /// Queues the staged batch's whole training step on the device without
    /// waiting for it (a non-finite loss updates nothing: the device skips the
    /// updates). [`finish`](Self::finish) gives the outcome, and with
    /// `keep_logits` reads back the logits the step made before its update.
    pub fn launch(&mut self, keep_logits: bool) -> Result<(), GpuError> {
        self.pending = None;
        let shape = self.take()?;
        let queued = self.queue_step(shape, keep_logits);
        // The slot is free once whatever was queued of the step is done, even when it failed.
        let released = self.staging.release(&self.dev);
        queued.and(released)
    }

    /// [`launch`](Self::launch) once the staged batch is the current one.
    fn queue_step(&mut self, shape: Shape, keep_logits: bool) -> Result<(), GpuError> {
        let b = shape.batch;
        if b == 0 {
            self.logits.clear();
            self.pending = Some(Pending { samples: 0, loss_at: 0, keep_logits });
            return Ok(());
        }
        // A failure here counts nothing (the dense optimizer's count included: `stage_step` takes back its own).
        self.stage_updates()?;
        let queued = if self.graphs.on() && self.clock.is_none() {
            self.queue_by_graph(shape)
        } else {
            self.queue_launches(shape)
        };
        let at = match queued {
            Ok(at) => at,
            Err(e) => {
                // The step is not counted: the dense optimizer's step count goes back too.
                self.optimizer.forget_step();
                return Err(e);
            }
        };
        // Counted now, so the next step's schedules follow; `finish` takes it back if the device skipped it.
        self.train_steps += 1;
        // The logits stay in `d_logits` (nothing in the step writes it again): `finish` reads them.
        self.pending = Some(Pending { samples: b as u64, loss_at: at, keep_logits });
        Ok(())
    }

    /// Queues the writes of this step's learning rates (and Adam's bias
    /// corrections) to the device, where the updates read them: the only
    /// values of a step that change with its count rather than its batch.
    fn stage_updates(&mut self) -> Result<(), GpuError> {
        let (kind, hp) = self.sparse;
        let lr = hp.lr * hp.schedule.factor(self.train_steps);
        let rule = match kind {
            SparseOptimizerKind::Sgd => SparseRule::Sgd { lr },
            _ => SparseRule::RowwiseAdagrad { lr, eps: hp.eps },
        };
        self.rows.stage_rule(&self.dev, rule)?;
        self.optimizer.set_lr(self.dense_hp.lr * self.dense_hp.schedule.factor(self.train_steps));
        self.optimizer.stage_step(&self.dev)
    }

    /// The step's launches as one CUDA graph: replayed when this slot and
    /// shape have one, captured when they ran before without one, queued as
    /// they are otherwise (see `graphs`). Where the step leaves its loss.
    fn queue_by_graph(&mut self, shape: Shape) -> Result<usize, GpuError> {
        let key = (self.staging.current_slot(), shape);
        match self.graphs.plan(&self.dev, key)? {
            Plan::Launched(at) => Ok(at),
            Plan::Capture => {
                let started = self.graphs.begin_capture(&self.dev)?;
                let queued = self.queue_launches(shape);
                match self.graphs.end_capture(&self.dev, key, started, queued) {
                    Ok(at) => Ok(at),
                    // Nothing of the capture ran and it changed nothing on the host but
                    // buffer sizes: the step's launches are queued as they are (a buffer
                    // the capture refused is allocated now), and a failure they meet again
                    // is the step's. Graphs stay off from here (`GraphCounts::failed`).
                    Err(_) => {
                        self.graphs.capture_failed();
                        self.queue_launches(shape)
                    }
                }
            }
            Plan::Queue => {
                let at = self.queue_launches(shape)?;
                self.graphs.ran(&self.dev, key);
                Ok(at)
            }
        }
    }

    /// Queues every launch of a training step on the current batch (the
    /// step's per-step values staged before): pooling, forward, loss and its
    /// guard, backward, the row and dense updates. Where the step leaves its
    /// loss in `d_loss`. It changes nothing on the host but the sizes of
    /// buffers, so its launches can be captured and replayed.
    fn queue_launches(&mut self, shape: Shape) -> Result<usize, GpuError> {
        use crate::nn::loss::{bce_sum_len, bce_sum_queued, loss_guard};
        let b = shape.batch;
        self.forward(shape)?;
        if self.d_loss.len() < bce_sum_len(b) {
            self.d_loss = self.dev.zeros(bce_sum_len(b))?;
        }
        let labels = &self.staging.current().labels.0;
        let at = bce_sum_queued(&self.dev, &self.d_logits.0, labels, b, &mut self.d_loss)?;
        // The guard also clears the finiteness flag the updates set.
        loss_guard(&self.dev, (&self.d_loss, at), &mut self.d_skip, &mut self.d_flag)?;
        self.mark(Phase::Loss)?;
        self.backward(shape)?;
        self.update(shape)?;
        Ok(at)
    }

    /// Waits for the step [`launch`](Self::launch) queued and gives its outcome.
    pub fn finish(&mut self) -> Result<ResidentStep, GpuError> {
        let Pending { samples, loss_at: at, keep_logits } =
            self.pending.take().ok_or_else(|| GpuError::shape("resident step", "no step is running"))?;
        if samples == 0 {
            return Ok(ResidentStep::default());
        }
        let (mut loss, mut skip, mut flag) = ([0f64], [0u32], [0u32]);
        let stream = &self.dev.stream;
        let read = GpuError::driver("reading the step's outcome");
        stream.memcpy_dtoh(&self.d_loss.slice(at..at + 1), &mut loss).map_err(read)?;
        stream.memcpy_dtoh(&self.d_skip, &mut skip).map_err(GpuError::driver("reading the loss guard"))?;
        stream.memcpy_dtoh(&self.d_flag, &mut flag).map_err(GpuError::driver("reading the finiteness flag"))?;
        self.dev.synchronize()?;
        self.mark(Phase::Dense)?;
        if keep_logits {
            self.download_logits(samples as usize)?;
        }
        let skipped = skip[0] != 0;
        if skipped {
            // The device updated nothing: the step does not count.
            self.train_steps -= 1;
            self.optimizer.forget_step();
        }
        Ok(ResidentStep { samples, loss_sum: loss[0], non_finite: skipped || flag[0] != 0 })
    }

    /// The logits of `batch` under the current parameters (an evaluation step).
    pub fn predict(&mut self, batch: &Batch) -> Result<&[f32], GpuError> {
        self.predict_then_prepare(batch, &mut || None)
    }

    /// [`predict`](Self::predict), and while the device runs the forward pass, stages
    /// the batch `next` gives for the step after, as
    /// [`train_then_prepare`](Self::train_then_prepare) does: a following step (an
    /// evaluation or a training step) on an equal batch starts from it. An evaluation
    /// step on the batch a step before prepared starts from that one. The same logits
    /// as `predict`.
    pub fn predict_then_prepare(&mut self, batch: &Batch, next: NextBatch<'_>) -> Result<&[f32], GpuError> {
        self.logits.clear();
        if self.prepared.take().as_ref() != Some(batch) {
            self.stage(batch)?;
        }
        let shape = self.take()?;
        let queued = if shape.batch > 0 { self.forward(shape) } else { Ok(()) };
        // The slot is free once the forward pass is done, even when queueing it failed.
        let released = self.staging.release(&self.dev);
        queued.and(released)?;
        if let Some(batch) = next() {
            if self.stage(&batch).is_ok() {
                self.prepared = Some(batch);
            }
        }
        if shape.batch > 0 {
            self.download_logits(shape.batch)?;
        }
        Ok(&self.logits)
    }

    /// The staged batch becomes the current one (the compute stream waits for its upload).
    /// Whatever batch was prepared is the one taken now (or none is staged):
    /// none is left prepared for a later step.
    fn take(&mut self) -> Result<Shape, GpuError> {
        self.prepared = None;
        Ok(self.staging.take(&self.dev)?.shape)
    }

    /// Times each phase of the next steps (waiting for the device after each,
    /// which slows the step down), or stops timing.
    pub fn time_phases(&mut self, on: bool) {
        self.clock = on.then(PhaseClock::default);
    }

    /// Milliseconds spent in each phase since [`time_phases`](Self::time_phases)
    /// turned the timing on (zeros when it is off).
    pub fn phase_ms(&self) -> PhaseTimes {
        self.clock.as_ref().map_or_else(PhaseTimes::default, |c| c.times)
    }

    /// Ends `phase` when timing: waits for the device and books the time since the last mark.
    fn mark(&mut self, phase: Phase) -> Result<(), GpuError> {
        if let Some(clock) = &mut self.clock {
            self.dev.synchronize()?;
            clock.book(phase);
        }
        Ok(())
    }

    /// Pooling (of the fields, and of the sequences' steps) and the forward
    /// pass over the current batch; the logits stay on the device (the first
    /// `batch` values of `d_logits`).
    fn forward(&mut self, shape: Shape) -> Result<(), GpuError> {
        const OP: &str = "resident forward";
        let (b, f, d) = (shape.batch, shape.fields, self.dim);
        let dev = &self.dev;
        let slot = self.staging.current();
        let pooled = self.d_pooled.reserve(dev, b * f * d)?;
        pool(dev, (&self.rows.rows, d), &slot.rows.0, field_bags(slot, shape), pooled)?;
        let seq_len = b * shape.steps * shape.sequences * d;
        let seq_rows = self.d_seq.reserve(dev, seq_len)?;
        if seq_len > 0 {
            pool(dev, (&self.rows.rows, d), &slot.rows.0, sequence_bags(slot, shape), seq_rows)?;
        }
        self.mark(Phase::Pool)?;
        let dev = &self.dev;
        let slot = self.staging.current();
        let seq = Sequences { rows: &self.d_seq.0, lengths: &slot.lengths.0, steps: shape.steps };
        let out = self.net.forward(dev, &self.params, &slot.dense.0, &self.d_pooled.0, seq, b)?;
        check::len(OP, "logits", out, b, || format!("batch {b}"))?;
        let logits = self.d_logits.reserve(dev, b)?;
        dev.stream
            .memcpy_dtod(&out.slice(..b), &mut logits.slice_mut(..b))
            .map_err(GpuError::driver("copying the logits"))?;
        self.mark(Phase::Forward)
    }

    /// The BCE gradient (scale 1), the model's backward, and the gradient of
    /// every entry of the batch: the fields' entries, then the sequences'.
    fn backward(&mut self, shape: Shape) -> Result<(), GpuError> {
        let (b, f, d) = (shape.batch, shape.fields, self.dim);
        let dev = &self.dev;
        let slot = self.staging.current();
        let dlogits = self.d_dlogits.reserve(dev, b)?;
        crate::nn::loss::bce_grad(dev, &self.d_logits.0, &slot.labels.0, b, 1.0, dlogits)?;
        self.d_dpooled.reserve(dev, b * f * d)?;
        self.d_dseq.reserve(dev, b * shape.steps * shape.sequences * d)?;
        let seq = Sequences { rows: &self.d_seq.0, lengths: &slot.lengths.0, steps: shape.steps };
        self.net.backward(
            dev,
            &self.params,
            &slot.dense.0,
            &self.d_pooled.0,
            seq,
            &self.d_dlogits.0,
            &mut self.grads,
            &mut self.d_dpooled.0,
            &mut self.d_dseq.0,
        )?;
        self.mark(Phase::Backward)?;
        let dev = &self.dev;
        let slot = self.staging.current();
        let grads = self.d_entry_grads.reserve(dev, (shape.entries + shape.seq_entries).max(1) * d)?;
        entry_grads(dev, (&self.d_dpooled.0, d), field_bags(slot, shape), grads)?;
        if shape.seq_entries > 0 {
            entry_grads(dev, (&self.d_dseq.0, d), sequence_bags(slot, shape), grads)?;
        }
        Ok(())
    }

    /// Queues the step's updates for the current batch with the values
    /// [`stage_updates`](Self::stage_updates) wrote: rows, then the dense
    /// optimizer (both skipped by the device when the loss guard is set), and
    /// the flag that an entry gradient or an updated dense parameter is not
    /// finite (read by [`finish`](Self::finish)).
    fn update(&mut self, shape: Shape) -> Result<(), GpuError> {
        let (d, entries, b) = (self.dim, shape.entries + shape.seq_entries, shape.batch);
        let dev = &self.dev;
        flag_nonfinite(dev, &self.d_entry_grads.0, entries * d, &mut self.d_flag)?;
        let scale = 1.0 / b as f32;
        let slot = self.staging.current();
        let skip = Some(&self.d_skip);
        self.rows.queue_in_range(dev, (&slot.rows.0, &self.d_entry_grads.0, entries), scale, skip)?;
        readback::mark_rows(dev, &slot.rows.0, entries, &mut self.d_trained)?;
        self.mark(Phase::Rows)?;
        let dev = &self.dev;
        self.optimizer.queue_update(dev, &mut self.params, &self.grads, scale, Some(&self.d_skip))?;
        flag_nonfinite(dev, &self.params, self.params.len(), &mut self.d_flag)
    }

    fn download_logits(&mut self, b: usize) -> Result<(), GpuError> {
        self.logits = self.dev.download(&self.d_logits.0, b)?;
        Ok(())
    }

    /// The dense parameters (waits for the stream).
    pub fn dense_params(&self) -> Result<Vec<f32>, GpuError> {
        self.dev.download(&self.params, self.params.len())
    }

    /// Table `t`'s rows (`rows × dim`) and optimizer state (one value per row
    /// for row-wise Adagrad, none for SGD), as one CPU worker holds them.
    pub fn table(&self, t: usize) -> Result<(Vec<f32>, Vec<f32>), GpuError> {
        let (lo, n, d) = (self.bases[t] as usize, self.table_sizes[t] as usize, self.dim);
        let mut rows = vec![0.0; n * d];
        let mut state = vec![0.0; n];
        if n > 0 {
            let stream = &self.dev.stream;
            stream
                .memcpy_dtoh(&self.rows.rows.slice(lo * d..(lo + n) * d), &mut rows)
                .map_err(GpuError::driver("copying rows from the device"))?;
            stream
                .memcpy_dtoh(&self.rows.state.slice(lo..lo + n), &mut state)
                .map_err(GpuError::driver("copying row state from the device"))?;
            self.dev.synchronize()?;
        }
        if self.sparse.0 == SparseOptimizerKind::Sgd {
            state.clear();
        }
        Ok((rows, state))
    }

    /// Σ of squares of every parameter, dense and embedding, in fp64 (as the
    /// CPU trainer's report step sums them; waits for the stream).
    pub fn sum_squares(&self) -> Result<f64, GpuError> {
        let mut sum: f64 = self.dense_params()?.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        for t in 0..self.table_sizes.len() {
            sum += self.table(t)?.0.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>();
        }
        Ok(sum)
    }

    /// A device error as the trainer reports it: naming the device.
    fn named(&self, e: GpuError) -> String {
        format!("CUDA device {}: {e}", self.dev.ordinal())
    }

    /// Continues from the part of a one-worker checkpoint of this model (rows it
    /// does not list, when it lists updated rows only, start from the seed);
    /// nothing changes when the part does not fit.
    pub fn load(&mut self, part: &WorkerSnapshot) -> Result<(), GpuError> {
        const OP: &str = "resident load";
        let (d, n) = (self.dim, self.params.len());
        let fits = part.workers == 1
            && part.dim == d
            && part.state_width == self.sparse.0.state_width(d)
            && part.dense_params.len() == n
            && part.tables.len() == self.table_sizes.len()
            && (part.table_sizes.is_empty() || part.table_sizes == self.table_sizes)
            && part.delta_of.is_none();
        if !fits {
            return Err(GpuError::shape(
                OP,
                format!(
                    "a part of {} workers, width {}, {} dense parameters and {} tables for a worker of width {d}, \
                     {n} dense parameters and {} tables",
                    part.workers,
                    part.dim,
                    part.dense_params.len(),
                    part.tables.len(),
                    self.table_sizes.len()
                ),
            ));
        }
        let Seeded { mut rows, mut state, .. } = seeded_rows(d, &self.table_sizes, self.seed, self.sparse)?;
        let sw = part.state_width;
        for (t, table) in part.tables.iter().enumerate() {
            if table.rows.len() != table.ids.len() * d || table.state.len() != table.ids.len() * sw {
                return Err(GpuError::shape(OP, format!("table {t}: rows or optimizer state do not match its ids")));
            }
            for (k, &id) in table.ids.iter().enumerate() {
                if id >= self.table_sizes[t] {
                    return Err(GpuError::Index {
                        op: OP,
                        message: format!("table {t}: id {id} is not below {}", self.table_sizes[t]),
                    });
                }
                let g = (self.bases[t] + id) as usize;
                rows[g * d..(g + 1) * d].copy_from_slice(&table.rows[k * d..(k + 1) * d]);
                if sw > 0 {
                    state[g] = table.state[k * sw];
                }
            }
        }
        let optimizer = DenseOptimizer::from_host(&self.dev, hyper(&self.dense_hp), &part.dense_optimizer)?;
        if optimizer.len() != n {
            return Err(GpuError::shape(
                OP,
                format!("dense optimizer state of {} for {n} parameters", optimizer.len()),
            ));
        }
        self.graphs.clear();
        let hot_rows = self.rows.hot_rows();
        self.rows = RowTable::upload(&self.dev, &rows, &state, d)?;
        self.rows.set_hot_rows(hot_rows)?;
        self.params = self.dev.upload(&part.dense_params)?;
        self.optimizer = optimizer;
        self.train_steps = part.step;
        self.forget_trained()?;
        Ok(())
    }

    /// This worker's whole state as a one-worker checkpoint part listing every
    /// row, which any number of CPU or GPU workers can restore from.
    pub fn snapshot(&self) -> Result<WorkerSnapshot, GpuError> {
        let mut tables = Vec::with_capacity(self.table_sizes.len());
        for t in 0..self.table_sizes.len() {
            let (rows, state) = self.table(t)?;
            tables.push(TableRows { ids: (0..self.table_sizes[t]).collect(), rows, state, ..TableRows::default() });
        }
        self.part(tables, false)
    }

    /// A one-worker checkpoint part of `tables` (every row, or with
    /// `updated_only` some) with the whole dense state and the step count.
    fn part(&self, tables: Vec<TableRows>, updated_only: bool) -> Result<WorkerSnapshot, GpuError> {
        let dense_optimizer: DenseOptimizerState = self.optimizer.to_host(&self.dev, 0)?;
        Ok(WorkerSnapshot {
            worker: 0,
            workers: 1,
            step: self.train_steps,
            dim: self.dim,
            state_width: self.sparse.0.state_width(self.dim),
            dense_params: self.dense_params()?,
            dense_optimizer,
            tables,
            updated_only,
            delta_of: None,
            seed: self.seed,
            table_sizes: self.table_sizes.clone(),
            admission: Default::default(),
        })
    }
}

/// One set of bags of a staged batch, as the pooling kernels read them:
/// `fields · batch` bags (field-major) of entries of the slot's `rows`.
struct Bags<'a> {
    offsets: &'a CudaSlice<u32>,
    weights: &'a CudaSlice<f32>,
    weighted: bool,
    batch: usize,
    fields: usize,
}

/// The sparse fields' bags of `slot`, a batch of `shape`.
fn field_bags(slot: &staging::Slot, shape: Shape) -> Bags<'_> {
    Bags {
        offsets: &slot.offsets.0,
        weights: &slot.weights.0,
        weighted: shape.weighted,
        batch: shape.batch,
        fields: shape.fields,
    }
}

/// The sequences' bags of `slot`: one per step and sequence (`steps · sequences`
/// fields, none weighted), so pooling lays the steps' rows out as the models
/// read them (see `host::fill_sequences`).
fn sequence_bags(slot: &staging::Slot, shape: Shape) -> Bags<'_> {
    Bags {
        offsets: &slot.seq_offsets.0,
        weights: &slot.weights.0,
        weighted: false,
        batch: shape.batch,
        fields: shape.steps * shape.sequences,
    }
}

impl Bags<'_> {
    /// Row width, batch, fields and whether entries are weighted, as the kernels take them.
    fn args(&self, op: &'static str, dim: usize) -> Result<(u32, u32, u32, i32), GpuError> {
        Ok((
            check::u32_of(op, "dim", dim)?,
            check::u32_of(op, "batch", self.batch)?,
            check::u32_of(op, "fields", self.fields)?,
            self.weighted as i32,
        ))
    }
}

/// Pools `bags` of rows `rows_of` of `table` (rows of `dim`) into `pooled`,
/// sample-major (`[batch × fields × dim]`).
fn pool(
    dev: &Device,
    (table, dim): (&CudaSlice<f32>, usize),
    rows_of: &CudaSlice<u32>,
    bags: Bags<'_>,
    pooled: &mut CudaSlice<f32>,
) -> Result<(), GpuError> {
    const OP: &str = "resident pooling";
    let (d32, b32, f32_, weighted) = bags.args(OP, dim)?;
    let n = check::product(OP, &[bags.batch, bags.fields, dim])?;
    check::len(OP, "pooled", pooled, n, || format!("{} bags × {dim}", bags.batch * bags.fields))?;
    let mut launch = dev.stream.launch_builder(dev.function("resident_pool"));
    launch
        .arg(table)
        .arg(&d32)
        .arg(bags.offsets)
        .arg(rows_of)
        .arg(bags.weights)
        .arg(&weighted)
        .arg(&b32)
        .arg(&f32_)
        .arg(pooled);
    // SAFETY: every row number was checked below its table on the host, the offsets
    // (fields·batch + 1, ascending, into `rows_of`) were built there with the weights
    // (one per entry when weighted); `pooled` holds batch·fields·dim values (checked).
    unsafe { launch.launch(check::grid_for(n)) }.map_err(GpuError::driver("launching resident_pool"))?;
    Ok(())
}

/// The gradient of every entry of `bags` from the pooled gradient `dpooled`
/// (rows of `dim`, laid out as [`pool`] writes), into `grads` at the entries'
/// places (entry `k` at `k · dim`).
fn entry_grads(
    dev: &Device,
    (dpooled, dim): (&CudaSlice<f32>, usize),
    bags: Bags<'_>,
    grads: &mut CudaSlice<f32>,
) -> Result<(), GpuError> {
    const OP: &str = "resident entry gradients";
    let (d32, b32, f32_, weighted) = bags.args(OP, dim)?;
    let n = check::product(OP, &[bags.batch, bags.fields, dim])?;
    check::len(OP, "dpooled", dpooled, n, || format!("{} bags × {dim}", bags.batch * bags.fields))?;
    let mut launch = dev.stream.launch_builder(dev.function("resident_entry_grads"));
    launch.arg(dpooled).arg(&d32).arg(bags.offsets).arg(bags.weights).arg(&weighted).arg(&b32).arg(&f32_).arg(grads);
    // SAFETY: dpooled holds batch·fields·dim values (checked); the offsets (fields·batch
    // + 1, ascending) end at most at the entries `grads` holds rows for (sized by the
    // caller for the fields' and the sequences' entries), with one weight per entry when weighted.
    unsafe { launch.launch(check::grid_for(n)) }.map_err(GpuError::driver("launching resident_entry_grads"))?;
    Ok(())
}

/// Every table's rows and optimizer state, one after the other, and the first row of each table.
struct Seeded {
    rows: Vec<f32>,
    /// One value per row (zero for SGD).
    state: Vec<f32>,
    bases: Vec<u64>,
}

/// The rows as one CPU worker's fixed store starts them for `seed`.
fn seeded_rows(
    dim: usize,
    table_sizes: &[u64],
    seed: u64,
    (kind, hp): (SparseOptimizerKind, OptimizerParams),
) -> Result<Seeded, GpuError> {
    let shard = EmbeddingShard::new(0, 1, dim, table_sizes, seed, kind, hp)
        .map_err(|e| GpuError::Unsupported(format!("embedding rows: {e}")))?;
    let (mut rows, mut state) = (Vec::new(), Vec::new());
    let mut bases = Vec::with_capacity(table_sizes.len());
    for t in 0..table_sizes.len() {
        bases.push(state.len() as u64);
        let table = shard.export_table(t);
        rows.extend_from_slice(&table.rows);
        if table.state.is_empty() {
            state.resize(state.len() + table.ids.len(), 0.0);
        } else {
            state.extend_from_slice(&table.state);
        }
    }
    Ok(Seeded { rows, state, bases })
}

impl StepEngine for ResidentWorker {
    fn train(&mut self, batch: &Batch, keep_logits: bool) -> Result<EngineStep, String> {
        let r = ResidentWorker::train(self, batch, keep_logits).map_err(|e| self.named(e))?;
        Ok(EngineStep { loss_sum: r.loss_sum, non_finite: r.non_finite })
    }
    fn train_then_prepare(&mut self, batch: &Batch, keep: bool, next: NextBatch<'_>) -> Result<EngineStep, String> {
        let r = ResidentWorker::train_then_prepare(self, batch, keep, next).map_err(|e| self.named(e))?;
        Ok(EngineStep { loss_sum: r.loss_sum, non_finite: r.non_finite })
    }
    fn predict(&mut self, batch: &Batch) -> Result<(), String> {
        ResidentWorker::predict(self, batch).map(|_| ()).map_err(|e| self.named(e))
    }
    fn predict_then_prepare(&mut self, batch: &Batch, next: NextBatch<'_>) -> Result<(), String> {
        ResidentWorker::predict_then_prepare(self, batch, next).map(|_| ()).map_err(|e| self.named(e))
    }
    fn logits(&self) -> &[f32] {
        &self.logits
    }
    fn save(&mut self) -> Result<WorkerSnapshot, String> {
        self.snapshot().map_err(|e| self.named(e))
    }
    fn save_changed(&mut self) -> Result<WorkerSnapshot, String> {
        self.snapshot_trained().map_err(|e| self.named(e))
    }
    fn load(&mut self, part: &WorkerSnapshot) -> Result<(), String> {
        ResidentWorker::load(self, part).map_err(|e| self.named(e))
    }
}

/// Sets `flag` when any of the first `n` values of `x` is not finite.
fn flag_nonfinite(dev: &Device, x: &CudaSlice<f32>, n: usize, flag: &mut CudaSlice<u32>) -> Result<(), GpuError> {
    if n == 0 {
        return Ok(());
    }
    let n64 = n as u64;
    let mut launch = dev.stream.launch_builder(dev.function("flag_nonfinite"));
    launch.arg(x).arg(&n64).arg(flag);
    // SAFETY: `x` holds at least n values (its callers pass its length or less), the flag one.
    unsafe { launch.launch(check::grid_for(n.min(1 << 22))) }.map_err(GpuError::driver("launching flag_nonfinite"))?;
    Ok(())
}

/// The device optimizer's hyper-parameters from the host's.
fn hyper(hp: &OptimizerParams) -> DenseHyper {
    DenseHyper { lr: hp.lr, beta1: hp.beta1, beta2: hp.beta2, eps: hp.eps, initial_accumulator: hp.initial_accumulator }
}
