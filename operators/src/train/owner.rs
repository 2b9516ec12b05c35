//! The owner side of a worker: serving its embedding rows (or their partial
//! results), applying their gradients and its slice of the dense update on
//! the worker's dense replica ([`Dense`], passed in). The home side reads its
//! state only through [`Owner::rows`].
//!
//! A training step checks what it writes: the summed row gradients, each
//! updated row as it is written ([`FiniteApply`]: values and optimizer state),
//! each updated replica and the dense slice. Any
//! infinity or NaN among them marks the step non-finite
//! ([`StepStats::non_finite`]). The rows of a store in another memory
//! ([`Store::Device`]) are not read back, nor the cold rows of a tiered store
//! whose hot tier is in another memory; only their gradients are checked.
//!
//! A store in another memory is asked for its failures inside the step: after
//! serving each request (the reply is then marked failed, and every owner
//! learns of it from the requester's gradient messages before updating) and
//! after updating its rows. The first failure is kept for the trainer, and the
//! owner counts its worker once in its parameter updates' `failed_workers`
//! when its home or its store failed in the step.

use super::shared::{Dense, LocalRows};
use super::{GradientMessage, LookupReply, LookupRequest, ParamUpdate, StepKind, StepStats, TrainerConfig};
use crate::exchange::{accumulate_slot, slot_row_grads, ExchangeConfig, Replicas, TableExchange, WireIds};
use crate::finite::all_finite;
use crate::metrics::EvalSet;
use crate::nn::{DeepShares, DeepWeights, FmPartial};
use crate::optim::{DenseOptimizer, DenseOptimizerKind, OptimizerParams};
use crate::routing::shard_of;
use crate::shard::EmbeddingShard;
use crate::snapshot::{admission_for, check_parts, Expected, SketchCounters, WorkerSnapshot};
use crate::store::{restore_row, DeviceStore, EmbeddingStore, FiniteApply, Store, StoreStats};
use crate::OperatorError;
use rustc_hash::FxHashMap;

/// Per table, where a row's summed gradient sits in `Owner::scratch` during an update.
enum Slots {
    /// Indexed by the fixed table's local row `id / W`; `u32::MAX` when unused.
    Dense { workers: u64, slots: Vec<Vec<u32>> },
    /// Keyed by id (dynamic and tiered stores, whose ids are not dense); emptied after each update.
    Hashed(Vec<FxHashMap<u64, u32>>),
}

/// The owner side of a worker: its embedding rows and its dense optimizer slice.
pub(super) struct Owner {
    store: Store,
    /// Training steps applied (the store's maintenance clock).
    train_steps: u64,
    /// The table of each lookup slot: sparse field `f` reads table `f`; sequence field `s` reads `sequence_tables[s]`.
    slot_tables: Vec<usize>,
    /// No two lookup slots read one table: then one sender's ids are distinct
    /// within each table (its home de-duplicates each slot's ids).
    distinct_tables: bool,
    dense_optimizer: DenseOptimizer,
    /// The base hyper-parameters (learning rates before their schedules).
    dense_hp: OptimizerParams,
    sparse_hp: OptimizerParams,
    /// The last request of each worker, kept to apply the gradients that answer it.
    pending: Vec<LookupRequest>,
    /// Each row's slot in `scratch` during an update.
    slots: Slots,
    /// Summed gradients of the step's distinct rows, in first-seen order.
    scratch: Vec<f32>,
    /// The `(table, id)` of each row in `scratch`.
    order: Vec<(u32, u64)>,
    /// Hot rows every worker holds (empty unless the exchange replicates rows).
    replicas: Replicas,
    exchange: ExchangeConfig,
    partial: Option<FmPartial>,
    /// Per requester, the rows of its last request's partial fields (read again for their gradients).
    pending_rows: Vec<Vec<f32>>,
    /// Per requester, the decoded ids of its last request.
    pending_ids: Vec<Vec<u64>>,
    /// The deep part's first-layer factor block ([`crate::nn::FirstLayer`]),
    /// as of the parameters of step `wt_step` (a deep model's `partial` exchange only).
    weights: DeepWeights<f32>,
    wt_step: Option<u64>,
    /// This owner's share of that block's gradient in the current step.
    dwt: Vec<f32>,
    /// Per requester, its micro-batch's first-layer input from this owner's rows.
    shares: Vec<DeepShares<f32>>,
    /// Per requester, the row gradients of its partial fields in the current step, in request order.
    pgrads: Vec<Vec<f32>>,
    /// Whether `pgrads` holds the current step's (set by the partial backward stage).
    pgrads_ready: bool,
    /// The homes' messages of the current step, held from the partial backward
    /// stage until the dense gradients arrive (a deep model's `partial` exchange only).
    held: Vec<GradientMessage>,
    /// The step of the last checkpoint snapshot, which the store's changes count from
    /// (`None` since the owner was built or restored).
    marked: Option<u64>,
    /// The first failure of a store in another memory found in a step (serving,
    /// updating or reporting its rows), until the trainer takes it.
    failure: Option<String>,
    /// Whether the store failed in the current step (read and cleared by [`apply`](Self::apply)).
    failed_in_step: bool,
}

impl Slots {
    /// Empty slots for `store`'s tables.
    fn for_store(store: &Store, table_sizes: &[u64], workers: usize) -> Self {
        match store {
            Store::Fixed(f) => Slots::Dense {
                workers: workers as u64,
                slots: (0..table_sizes.len()).map(|t| vec![u32::MAX; f.shard.local_len(t)]).collect(),
            },
            _ => Slots::Hashed(table_sizes.iter().map(|_| FxHashMap::default()).collect()),
        }
    }
}

impl Owner {
    /// The owner side of worker `me` of `workers` for `config`, with its rows
    /// initialised; `partial` is the model's partial form when any field travels
    /// as partial results, and `dense_len` the length of the dense buffer.
    pub(super) fn new(
        config: &TrainerConfig,
        slot_tables: Vec<usize>,
        partial: Option<FmPartial>,
        (me, workers): (usize, usize),
        dense_len: usize,
        device_store: Option<Box<dyn DeviceStore>>,
    ) -> Result<Self, OperatorError> {
        let dim = config.model.embedding_dim();
        let store = match device_store {
            Some(store) => Store::Device(store),
            None => Store::new(&config.store, &config.store_params((me, workers)))?,
        };
        let slice = super::dense_slice(dense_len, me, workers);
        Ok(Owner {
            slots: Slots::for_store(&store, &config.table_sizes, workers),
            store,
            train_steps: 0,
            marked: None,
            distinct_tables: distinct(&slot_tables),
            slot_tables,
            dense_optimizer: DenseOptimizer::new(config.dense_optimizer, config.dense_hp, slice.len()),
            dense_hp: config.dense_hp,
            sparse_hp: config.sparse_hp,
            pending: (0..workers)
                .map(|w| LookupRequest {
                    from: w as u32,
                    to: me as u32,
                    table_lens: Vec::new(),
                    ids: WireIds::default(),
                    partial: None,
                })
                .collect(),
            scratch: Vec::new(),
            order: Vec::new(),
            replicas: Replicas::new(
                &config.exchange.replicated,
                &config.table_sizes,
                config.seed,
                dim,
                config.sparse_optimizer,
                config.sparse_hp,
            ),
            exchange: config.exchange.clone(),
            partial,
            pending_rows: vec![Vec::new(); workers],
            pending_ids: vec![Vec::new(); workers],
            weights: DeepWeights::default(),
            wt_step: None,
            dwt: Vec::new(),
            shares: vec![DeepShares::default(); workers],
            pgrads: vec![Vec::new(); workers],
            pgrads_ready: false,
            held: Vec::new(),
            failure: None,
            failed_in_step: false,
        })
    }

    /// What the home side reads of this owner during a step.
    pub(super) fn rows(&self) -> LocalRows<'_> {
        LocalRows::new(&self.store, &self.replicas, &self.weights)
    }

    /// Number of embedding rows this worker owns.
    pub(super) fn num_rows(&self) -> usize {
        self.store.num_rows()
    }

    /// The store's counters.
    pub(super) fn store_stats(&self) -> StoreStats {
        self.store.stats()
    }

    /// The first failure of a store in another memory since the last call (see
    /// [`DeviceStore`]): found in a step, or recorded since (reading rows for a snapshot).
    pub(super) fn take_store_error(&mut self) -> Option<String> {
        self.failure.take().or_else(|| match &mut self.store {
            Store::Device(s) => s.take_error(),
            _ => None,
        })
    }

    /// The failure of a store in another memory found in the last step, if any (that
    /// step failed on every worker).
    pub(super) fn take_failure(&mut self) -> Option<String> {
        self.failure.take()
    }

    /// Whether a store in another memory recorded a failure since the last check: one
    /// found in a step makes it this worker's failed step, and the first is kept for the
    /// trainer ([`take_failure`](Self::take_failure)).
    pub(super) fn check_store(&mut self) -> bool {
        let Store::Device(s) = &mut self.store else { return false };
        let Some(e) = s.take_error() else { return false };
        self.failure.get_or_insert(e);
        self.failed_in_step = true;
        true
    }

    /// This worker's share of a checkpoint after `step` training steps: the dense
    /// parameters, the dense-optimizer state of its slice and every row of its
    /// `num_tables` tables with their optimizer slots.
    pub(super) fn snapshot(&self, dense: &Dense, step: u64, writer: (u64, &[u64])) -> WorkerSnapshot {
        self.snapshot_with(dense, step, writer, self.store.admission_counters())
    }

    /// [`snapshot`](Self::snapshot) with the admission counters given.
    fn snapshot_with(
        &self,
        dense: &Dense,
        step: u64,
        (seed, table_sizes): (u64, &[u64]),
        admission: SketchCounters,
    ) -> WorkerSnapshot {
        let num_tables = table_sizes.len();
        WorkerSnapshot {
            worker: dense.me(),
            workers: dense.workers(),
            step,
            dim: self.store.dim(),
            state_width: self.store.state_width(),
            dense_params: dense.params().to_vec(),
            dense_optimizer: self.dense_optimizer.state(dense.own_slice().start),
            tables: (0..num_tables).map(|t| self.store.export_table(t)).collect(),
            updated_only: self.store.exports_updated_only(),
            delta_of: None,
            seed,
            table_sizes: table_sizes.to_vec(),
            admission,
        }
    }

    /// The step of the last checkpoint snapshot changes count from, if any.
    pub(super) fn marked(&self) -> Option<u64> {
        self.marked
    }

    /// A checkpoint's share after `step` steps: whole ([`snapshot`](Self::snapshot))
    /// or, with `parent` (which must be the last mark), the delta since the
    /// checkpoint of `parent`; either way changes count from here on.
    pub(super) fn checkpoint_snapshot(
        &mut self,
        dense: &Dense,
        step: u64,
        writer: (u64, &[u64]),
        parent: Option<u64>,
    ) -> Result<WorkerSnapshot, OperatorError> {
        let num_tables = writer.1.len();
        // A delta's admission counters: those that grew since the mark, where the store tells.
        let changes = parent.and_then(|_| self.store.admission_changes());
        let admission = changes.unwrap_or_else(|| self.store.admission_counters());
        let mut part = self.snapshot_with(dense, step, writer, admission);
        if let Some(p) = parent {
            if self.marked != Some(p) {
                return Err(super::changed_rows::not_the_mark(p, self.marked));
            }
            part.tables = (0..num_tables).map(|t| self.store.export_changes(t)).collect();
            part.delta_of = Some(p);
        }
        // A store in another memory that failed to give its rows back fails the
        // checkpoint before the mark moves, so the next delta still counts from the last good one.
        if let Some(message) = self.take_store_error() {
            return Err(OperatorError::Device { worker: dense.me(), message });
        }
        self.store.mark_checkpoint();
        self.marked = Some(step);
        Ok(part)
    }

    /// Rebuilds this worker's state from the parts of a checkpoint (see
    /// [`Trainer::restore`](super::Trainer::restore)) and returns its training step count.
    /// The parts are checked completely first; on error nothing is changed.
    pub(super) fn restore(
        &mut self,
        dense: &mut Dense,
        parts: &[WorkerSnapshot],
        writer: (u64, &[u64]),
        dense_kind: DenseOptimizerKind,
    ) -> Result<u64, OperatorError> {
        let step = self.set_state(dense, parts, writer, dense_kind, true)?;
        // The replicas a checkpoint does not list (never trained before it) start as the
        // store's rows do, not as this owner's training left them.
        self.replicas.reset(writer.0, writer.1);
        self.replicas.restore(parts);
        Ok(step)
    }

    /// Overwrites the rows `part` lists (a one-worker part of updated rows, as a
    /// step engine reads the rows it trained since the last read) and the whole
    /// dense state and step count; every other row keeps its value. Checked like
    /// [`restore`](Self::restore) first; on error nothing is changed.
    pub(super) fn patch(
        &mut self,
        dense: &mut Dense,
        part: &WorkerSnapshot,
        writer: (u64, &[u64]),
        dense_kind: DenseOptimizerKind,
    ) -> Result<u64, OperatorError> {
        self.set_state(dense, std::slice::from_ref(part), writer, dense_kind, false)
    }

    /// Checks `parts`, sets the dense state and step count from them and each
    /// row they list that this worker owns; with `reset`, every other row goes
    /// back to its initial state first. Returns the training step count.
    fn set_state(
        &mut self,
        dense: &mut Dense,
        parts: &[WorkerSnapshot],
        (seed, table_sizes): (u64, &[u64]),
        dense_kind: DenseOptimizerKind,
        reset: bool,
    ) -> Result<u64, OperatorError> {
        let (me, w) = (dense.me(), dense.workers());
        let expected = Expected {
            table_sizes,
            dim: self.store.dim(),
            state_width: self.store.state_width(),
            dense_len: dense.params().len(),
            dense_kind,
            every_row: self.store.holds_every_row(),
            seed,
        };
        let checked = check_parts(parts, expected)?;
        let mine = checked.dense_optimizer.slice(dense.own_slice());
        let dense_optimizer = DenseOptimizer::from_state(self.dense_hp, &mine)?;
        dense.write(0, checked.dense_params);
        self.dense_optimizer = dense_optimizer;
        if reset {
            self.store.reset(checked.step);
            self.marked = None;
        }
        self.train_steps = checked.step;
        for part in parts {
            for (t, rows) in part.tables.iter().enumerate() {
                for (i, &id) in rows.ids.iter().enumerate() {
                    if shard_of(t, id, w) == me {
                        restore_row(&mut self.store, t, rows, i)?;
                    }
                }
            }
        }
        if reset {
            self.store.set_admission_counters(&admission_for(parts, me, w));
        }
        Ok(checked.step)
    }

    /// Answers one request of step `t`: the rows of its `rows` fields and this
    /// owner's share of the partial results of its `partial` fields; keeps the
    /// request to apply the gradients that answer it. `dense` holds the
    /// parameters after step `t − 1` (read only by a deep model's partial fields).
    pub(super) fn serve(&mut self, request: LookupRequest, t: u64, dense: &Dense) -> LookupReply {
        let e = self.store.dim();
        if let Some(l) = self.partial.and_then(|p| p.deep) {
            if self.wt_step != Some(t) {
                self.weights.load(&l, dense.params());
                self.wt_step = Some(t);
            }
        }
        let from = request.from as usize;
        let mut rows = Vec::with_capacity(request.ids.len() * e);
        let mut all_ids = std::mem::take(&mut self.pending_ids[from]);
        request.ids.decode_into(&mut all_ids);
        let mut partial_rows = std::mem::take(&mut self.pending_rows[from]);
        partial_rows.clear();
        let mut partial = Vec::new();
        let deep = self.partial.and_then(|p| p.deep);
        let batch_len = request.partial.as_ref().map_or(0, |p| p.batch_len as usize);
        if let Some(l) = &deep {
            self.shares[from].reset(l, batch_len);
        }
        let (mut start, mut pj) = (0usize, 0usize);
        match self.exchange.any_partial() {
            false => {
                // Every table as rows: the request's rows in one call (one read of a store in another memory).
                let lookups: Vec<(usize, &[u64])> = (request.table_lens.iter().enumerate())
                    .map(|(k, &n)| {
                        start += n as usize;
                        (self.slot_tables[k], &all_ids[start - n as usize..start])
                    })
                    .collect();
                self.store.gather_many(&lookups, &mut rows);
            }
            true => {
                for (k, &n) in request.table_lens.iter().enumerate() {
                    let t = self.slot_tables[k];
                    let ids = &all_ids[start..start + n as usize];
                    if self.exchange.table(k) == TableExchange::Partial {
                        let first = partial_rows.len();
                        self.store.gather(t, ids, &mut partial_rows);
                        let slot =
                            request.partial.as_ref().and_then(|p| p.slots.get(pj).map(|s| (p.batch_len as usize, s)));
                        if let (Some(part), Some((b, slot))) = (self.partial, slot) {
                            if !slot.index.is_empty() {
                                partial.resize(b * part.width(), 0.0);
                                let shares = deep.map(|_| &mut self.shares[from]);
                                accumulate_slot(part, k, slot, &partial_rows[first..], e, &mut partial, shares);
                            }
                        }
                        pj += 1;
                    } else {
                        self.store.gather(t, ids, &mut rows);
                    }
                    start += n as usize;
                }
            }
        }
        if let (Some(l), Some(part)) = (&deep, self.partial) {
            if !partial.is_empty() {
                self.shares[from].add_shares(l, &self.weights, &mut partial, part.width(), part.fm_width());
            }
        }
        self.pending_rows[from] = partial_rows;
        self.pending_ids[from] = all_ids;
        // Its rows are zeros: the reply tells the requester, whose messages tell every owner.
        let failed = self.check_store();
        let reply = LookupReply { from: request.to, to: request.from, rows, partial, failed };
        self.pending[from] = request;
        reply
    }

    /// Row gradients of every sender's partial fields from the partial results'
    /// gradients in `messages` (into `pgrads`, summed over each sender's samples
    /// in sample order) and, with a deep part, this owner's share of the first
    /// layer's factor-block gradient (into `dwt`).
    fn partial_row_grads(&mut self, messages: &[GradientMessage]) {
        let d = self.store.dim();
        let Some(part) = self.partial else { return };
        self.dwt.clear();
        self.dwt.resize(part.deep.map_or(0, |l| l.block_len()), 0.0);
        for m in messages {
            let from = m.from as usize;
            if let Some(l) = part.deep.as_ref().filter(|_| !m.partial.is_empty()) {
                self.shares[from].backward(l, &self.weights, &m.partial, part.width(), part.fm_width(), &mut self.dwt);
            }
            let (request, rows) = (&self.pending[from], &self.pending_rows[from]);
            let pgrads = &mut self.pgrads[from];
            pgrads.clear();
            let (mut prow_at, mut pj) = (0usize, 0usize);
            for (k, &n) in request.table_lens.iter().enumerate() {
                if self.exchange.table(k) != TableExchange::Partial {
                    continue;
                }
                let n = n as usize;
                let start = pgrads.len();
                pgrads.resize(start + n * d, 0.0);
                let slot = request.partial.as_ref().and_then(|p| p.slots.get(pj));
                if let Some(slot) = slot.filter(|_| !m.partial.is_empty()) {
                    let rows = &rows[prow_at * d..(prow_at + n) * d];
                    let shares = part.deep.map(|_| &self.shares[from]);
                    slot_row_grads(part, k, slot, rows, d, &m.partial, &mut pgrads[start..], shares);
                }
                prow_at += n;
                pj += 1;
            }
        }
        self.pgrads_ready = true;
    }

    /// The partial backward stage of a deep model's `partial` exchange: row
    /// gradients and this owner's share of the first layer's gradient (added to
    /// the worker's dense gradient), then the dense gradient's slices for every
    /// worker. Holds the homes' `messages` for [`with_held_messages`](Self::with_held_messages).
    pub(super) fn partial_backward(
        &mut self,
        dense: &mut Dense,
        messages: Vec<GradientMessage>,
    ) -> Vec<GradientMessage> {
        let kind = messages.first().map_or(StepKind::Train, |m| m.kind);
        if kind == StepKind::Train {
            self.partial_row_grads(&messages);
            if let Some(l) = self.partial.and_then(|p| p.deep) {
                l.add_transposed_grads(&self.dwt, dense.model_mut().grads_mut());
            }
        }
        self.held = messages;
        let (me, w) = (dense.me(), dense.workers());
        (0..w)
            .map(|to| GradientMessage {
                from: me as u32,
                to: to as u32,
                kind,
                stats: StepStats::default(),
                sparse: Vec::new(),
                dense: if kind == StepKind::Train && to != me { dense.grad_slice_for(to) } else { Vec::new() },
                eval: EvalSet::default(),
                partial: Vec::new(),
                hot: Vec::new(),
                hot_grads: Vec::new(),
                failed_replies: 0,
            })
            .collect()
    }

    /// The homes' messages held by [`partial_backward`](Self::partial_backward),
    /// each with the dense gradient slice its sender sent afterwards (`dense`, in worker order).
    pub(super) fn with_held_messages(&mut self, dense: Vec<GradientMessage>) -> Vec<GradientMessage> {
        let mut held = std::mem::take(&mut self.held);
        assert_eq!(held.len(), dense.len(), "one held message per dense gradient message");
        for (h, d) in held.iter_mut().zip(dense) {
            assert_eq!(h.from, d.from, "held and dense messages in worker order");
            h.dense = d.dense;
        }
        held
    }

    /// Sets the learning rates of this training step's updates from the schedules at
    /// `train_steps` (the update's index over the whole run; a constant schedule changes nothing).
    fn set_learning_rates(&mut self) {
        let (dense, sparse) = (self.dense_hp, self.sparse_hp);
        if !dense.schedule.is_constant() {
            self.dense_optimizer.set_lr(dense.lr * dense.schedule.factor(self.train_steps));
        }
        if !sparse.schedule.is_constant() {
            let lr = sparse.lr * sparse.schedule.factor(self.train_steps);
            self.store.set_lr(lr);
            self.replicas.set_lr(lr);
        }
    }

    /// The row gradients of one sender whose rows are distinct per table: each
    /// row's sum is its own gradient, applied where it lies in the message (the
    /// same values as [`sum_and_apply`](Self::sum_and_apply) without gathering
    /// them into `scratch`). Returns whether every gradient and every updated
    /// row is finite (see [`FiniteApply`]; a device store's rows are not read back).
    fn apply_one_sender(&mut self, m: &GradientMessage, scale: f32, d: usize) -> bool {
        let segments =
            segments(m, (&self.pending, &self.pending_ids, &self.pgrads), (&self.exchange, &self.slot_tables), d);
        let grads_finite = segments.iter().all(|(_, _, g)| all_finite(g));
        self.scratch.clear();
        self.scratch.resize(d, 0.0);
        let rows_finite = match &mut self.store {
            Store::Fixed(s) => apply_segments(s, &segments, &mut self.scratch, scale),
            Store::Dynamic(s) => apply_segments(s, &segments, &mut self.scratch, scale),
            Store::Tiered(s) => apply_segments(s, &segments, &mut self.scratch, scale),
            Store::Device(s) => {
                // Every row at once: the segments' rows in order, each gradient scaled.
                self.order.clear();
                self.scratch.clear();
                for &(t, ids, grads) in &segments {
                    self.order.extend(ids.iter().map(|&id| (t as u32, id)));
                    self.scratch.extend(grads.iter().map(|&g| g * scale));
                }
                s.apply_rows(&self.order, &self.scratch);
                true
            }
        };
        grads_finite && rows_finite
    }

    /// Sums each row's gradients over the senders in `scratch` (in sender
    /// order), then applies each sum once. Returns whether every sum and every
    /// updated row is finite (see [`FiniteApply`]; a device store's rows are not read back).
    fn sum_and_apply(&mut self, messages: &[GradientMessage], scale: f32, d: usize) -> bool {
        self.scratch.clear();
        self.order.clear();
        for m in messages {
            let segments =
                segments(m, (&self.pending, &self.pending_ids, &self.pgrads), (&self.exchange, &self.slot_tables), d);
            for (t, ids, grads) in segments {
                match &mut self.slots {
                    Slots::Dense { workers, slots } => {
                        let (w, slots) = (*workers, &mut slots[t]);
                        for (k, &id) in ids.iter().enumerate() {
                            if let Some(&ahead) = ids.get(k + 8) {
                                if let Some(sl) = slots.get((ahead / w) as usize..) {
                                    crate::huge::prefetch(sl.as_ptr());
                                }
                            }
                            add_row(
                                t,
                                id,
                                &grads[k * d..(k + 1) * d],
                                &mut slots[(id / w) as usize],
                                &mut self.order,
                                &mut self.scratch,
                            );
                        }
                    }
                    Slots::Hashed(maps) => {
                        let map = &mut maps[t];
                        for (k, &id) in ids.iter().enumerate() {
                            let cell = map.entry(id).or_insert(u32::MAX);
                            add_row(t, id, &grads[k * d..(k + 1) * d], cell, &mut self.order, &mut self.scratch);
                        }
                    }
                }
            }
        }
        // The summed row gradients, one pass over the rows this step touched.
        let grads_finite = all_finite(&self.scratch);
        let rows_finite = match &mut self.store {
            Store::Fixed(s) => apply_rows(s, &self.order, &mut self.scratch, scale, d),
            Store::Dynamic(s) => apply_rows(s, &self.order, &mut self.scratch, scale, d),
            Store::Tiered(s) => apply_rows(s, &self.order, &mut self.scratch, scale, d),
            Store::Device(s) => {
                self.scratch.iter_mut().for_each(|v| *v *= scale);
                s.apply_rows(&self.order, &self.scratch);
                true
            }
        };
        match &mut self.slots {
            Slots::Dense { workers, slots } => {
                for &(t, id) in &self.order {
                    slots[t as usize][(id / *workers) as usize] = u32::MAX;
                }
            }
            Slots::Hashed(maps) => maps.iter_mut().for_each(|m| m.clear()),
        }
        grads_finite && rows_finite
    }

    /// Sums the step's gradients of the replicated rows over `messages` (in
    /// worker order), applies them to the replicas and writes each owned
    /// result into the store. Returns whether every updated replica (values
    /// and optimizer state) is finite.
    fn apply_replicas(&mut self, messages: &[GradientMessage], scale: f32, (me, w, d): (usize, usize, usize)) -> bool {
        for m in messages {
            for (i, &h) in m.hot.iter().enumerate() {
                self.replicas.add_grad(h, &m.hot_grads[i * d..(i + 1) * d]);
            }
        }
        let (changed, finite) = self.replicas.apply(scale);
        for h in changed {
            let (row, state) = (self.replicas.row(h), self.replicas.state(h));
            let (t, id) = self.replicas.key(h);
            if shard_of(t, id, w) == me {
                // An owned id below the table size: the fixed store accepts it.
                let _ = self.store.set_row(t, id, row, state);
            }
        }
        finite
    }

    /// Applies the step's gradients this worker owns and returns its dense slice for every worker.
    #[inline(never)]
    pub(super) fn apply(
        &mut self,
        dense: &mut Dense,
        messages: &[GradientMessage],
        eval: &mut EvalSet,
    ) -> Vec<ParamUpdate> {
        let (me, w, d) = (dense.me(), dense.workers(), self.store.dim());
        let mut stats = StepStats::default();
        for m in messages {
            stats.add(&m.stats);
        }
        // Whether this owner's worker failed before the update: its home (a batch that did
        // not fit, a failed pass) or its store serving the step's rows. Every owner sees
        // every such failure in the homes' messages (a failed serve in the replies' count).
        let home_failed = messages.iter().any(|m| m.from as usize == me && m.stats.failed_workers > 0);
        if messages.iter().any(|m| m.failed_replies > 0) {
            stats.failed_workers = stats.failed_workers.max(1);
        }
        let slice = dense.own_slice();
        let mut changed = false;
        let is_train = messages.first().is_some_and(|m| m.kind == StepKind::Train);
        // A non-finite loss (the same sum on every owner) leaves every parameter as it was;
        // the step reports it and the caller stops (see `StepStats::non_finite`). So does a
        // failed worker: a step that failed before the update trains nothing on any worker.
        let loss_finite = stats.loss_sum.is_finite();
        stats.non_finite = 0;
        if is_train && stats.samples > 0 && !loss_finite {
            stats.non_finite = 1;
        }
        if is_train && stats.updates_parameters() {
            let scale = 1.0 / stats.samples as f32;
            self.set_learning_rates();
            // Sparse rows: sum each row's gradient over workers (in worker order), then update
            // once; a lone sender's rows are each its own sum, applied where they lie. Each
            // updated row is checked as it is written, as the dense slice is below.
            if !self.pgrads_ready {
                self.partial_row_grads(messages);
            }
            let rows_finite = if messages.len() == 1 && self.distinct_tables {
                self.apply_one_sender(&messages[0], scale, d)
            } else {
                self.sum_and_apply(messages, scale, d)
            };
            // Replicated rows: every worker sums every sender's gradients in worker order and
            // applies them to its replica; the owner also writes the result into its store.
            let replicas_finite = self.replicas.is_empty() || self.apply_replicas(messages, scale, (me, w, d));
            self.train_steps += 1;
            self.store.end_step(self.train_steps);
            // A store in another memory that failed updating its rows fails the step on this
            // worker (below); the other owners' updates of the step stand.
            self.check_store();
            // Dense slice: reduce in worker order block by block, averaging inside the optimizer.
            // This worker's own part is read in place from its model's gradients.
            let (params, grads) = dense.model_mut().params_and_grads();
            let own = &grads[slice.clone()];
            let parts: Vec<&[f32]> =
                messages.iter().map(|m| if m.from as usize == me { own } else { &m.dense[..] }).collect();
            // The updated slice checked as it is updated: catches a finite gradient that an
            // extreme learning rate turns into an infinite parameter.
            let dense_finite = self.dense_optimizer.apply_sum_scaled_finite(&mut params[slice.clone()], &parts, scale);
            if !rows_finite || !replicas_finite || !dense_finite {
                stats.non_finite = 1;
            }
            changed = true;
        }
        self.pgrads_ready = false;
        // This owner's worker is counted once among the step's failed workers (the gather
        // sums the owners' counts), whichever of its parts failed.
        stats.failed_workers = u64::from(home_failed || std::mem::take(&mut self.failed_in_step));
        for m in messages {
            eval.extend_from(&m.eval);
        }
        (0..w)
            .map(|to| ParamUpdate {
                from: me as u32,
                to: to as u32,
                stats,
                offset: slice.start as u64,
                values: if changed && to != me { dense.params()[slice.clone()].to_vec() } else { Vec::new() },
            })
            .collect()
    }
}

/// The rows of `m` as `(table, ids, gradients)` per lookup slot of the
/// request it answers (`pending`, `pending_ids` and `pgrads` indexed by
/// sender); a partial slot's gradients are in `pgrads`, the others in the message.
#[allow(clippy::type_complexity)]
fn segments<'a>(
    m: &'a GradientMessage,
    (pending, pending_ids, pgrads): (&[LookupRequest], &'a [Vec<u64>], &'a [Vec<f32>]),
    (exchange, slot_tables): (&ExchangeConfig, &[usize]),
    d: usize,
) -> Vec<(usize, &'a [u64], &'a [f32])> {
    let from = m.from as usize;
    let (request_ids, pgrads) = (&pending_ids[from], &pgrads[from]);
    let (mut start, mut row_at, mut prow_at) = (0usize, 0usize, 0usize);
    let mut out = Vec::with_capacity(pending[from].table_lens.len());
    for (k, &n) in pending[from].table_lens.iter().enumerate() {
        let n = n as usize;
        let grads: &[f32] = if exchange.table(k) == TableExchange::Partial {
            prow_at += n;
            &pgrads[(prow_at - n) * d..prow_at * d]
        } else {
            row_at += n;
            &m.sparse[(row_at - n) * d..row_at * d]
        };
        out.push((slot_tables[k], &request_ids[start..start + n], grads));
        start += n;
    }
    out
}

/// Whether every table appears once in `tables`.
fn distinct(tables: &[usize]) -> bool {
    let mut seen = vec![false; tables.iter().max().map_or(0, |&t| t + 1)];
    tables.iter().all(|&t| !std::mem::replace(&mut seen[t], true))
}

/// Adds the gradient `g` of row `id` of table `t` into `scratch`: a new slot
/// (recorded in `cell` and `order`) the first time the row appears in this
/// step, else onto its slot. `cell` is `u32::MAX` while the row has no slot.
#[inline(always)]
fn add_row(t: usize, id: u64, g: &[f32], cell: &mut u32, order: &mut Vec<(u32, u64)>, scratch: &mut Vec<f32>) {
    if *cell == u32::MAX {
        *cell = order.len() as u32;
        order.push((t as u32, id));
        scratch.extend_from_slice(g);
    } else {
        let s = *cell as usize * g.len();
        for (a, &v) in scratch[s..s + g.len()].iter_mut().zip(g) {
            *a += v;
        }
    }
}

/// Scales each summed row gradient by `scale` and applies it, prefetching a few
/// rows ahead. Returns whether every updated row is finite (each checked as it is written).
#[inline]
fn apply_rows<S: FiniteApply>(store: &mut S, order: &[(u32, u64)], scratch: &mut [f32], scale: f32, d: usize) -> bool {
    let mut finite = true;
    for (slot, &(t, id)) in order.iter().enumerate() {
        if let Some(&(ta, ida)) = order.get(slot + EmbeddingShard::PREFETCH_AHEAD) {
            store.prefetch_row(ta as usize, ida);
        }
        let g = &mut scratch[slot * d..(slot + 1) * d];
        for v in g.iter_mut() {
            *v *= scale;
        }
        finite &= store.apply_finite(t as usize, id, g);
    }
    finite
}

/// Applies each segment's `(table, ids, gradients)` row by row, each gradient
/// scaled by `scale` into `row` first, prefetching a few rows ahead (into the
/// next segment at a segment's end). Returns whether every updated row is
/// finite (each checked as it is written).
fn apply_segments<S: FiniteApply>(
    store: &mut S,
    segments: &[(usize, &[u64], &[f32])],
    row: &mut [f32],
    scale: f32,
) -> bool {
    let d = row.len();
    let mut finite = true;
    const AHEAD: usize = EmbeddingShard::PREFETCH_AHEAD;
    for (s, &(t, ids, grads)) in segments.iter().enumerate() {
        for (k, &id) in ids.iter().enumerate() {
            match ids.get(k + AHEAD) {
                Some(&ahead) => store.prefetch_row(t, ahead),
                None => {
                    if let Some(&(tn, next, _)) = segments.get(s + 1) {
                        if let Some(&ahead) = next.get(k + AHEAD - ids.len()) {
                            store.prefetch_row(tn, ahead);
                        }
                    }
                }
            }
            for (r, &g) in row.iter_mut().zip(&grads[k * d..(k + 1) * d]) {
                *r = g * scale;
            }
            finite &= store.apply_finite(t, id, row);
        }
    }
    finite
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::SparseOptimizerKind;
    use crate::store::FixedStore;

    fn store() -> FixedStore {
        let hp = OptimizerParams::with_lr(0.3);
        FixedStore::new(
            EmbeddingShard::new(0, 1, 4, &[50, 7, 90], 11, SparseOptimizerKind::RowwiseAdagrad, hp).unwrap(),
        )
    }

    /// One sender's rows applied in place equal them gathered into `scratch` and
    /// applied from there, bit for bit, across segment ends and prefetches.
    #[test]
    fn rows_applied_in_place_equal_rows_applied_from_their_sums() {
        let d = 4;
        let ids: [Vec<u64>; 3] = [(0..40).map(|i| (i * 7) % 50).collect(), vec![3, 0, 6], (0..60).rev().collect()];
        let grads: Vec<Vec<f32>> = ids
            .iter()
            .map(|ids| (0..ids.len() * d).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect())
            .collect();
        let segments: Vec<(usize, &[u64], &[f32])> =
            ids.iter().zip(&grads).enumerate().map(|(t, (i, g))| (t, &i[..], &g[..])).collect();
        let (mut direct, mut summed) = (store(), store());
        assert!(apply_segments(&mut direct, &segments, &mut [0.0; 4], 0.25), "finite rows");
        let (mut order, mut scratch) = (Vec::new(), Vec::new());
        for &(t, ids, grads) in &segments {
            for (k, &id) in ids.iter().enumerate() {
                let mut new_row = u32::MAX;
                add_row(t, id, &grads[k * d..(k + 1) * d], &mut new_row, &mut order, &mut scratch);
            }
        }
        assert!(apply_rows(&mut summed, &order, &mut scratch, 0.25, d), "finite rows");
        for (t, ids) in ids.iter().enumerate() {
            let (a, b) = (direct.export_table(t), summed.export_table(t));
            assert_eq!(a.ids.len(), ids.len(), "table {t}: every row updated");
            assert_eq!(a.ids, b.ids);
            assert!(a.rows.iter().zip(&b.rows).all(|(x, y)| x.to_bits() == y.to_bits()), "table {t} rows");
            assert!(a.state.iter().zip(&b.state).all(|(x, y)| x.to_bits() == y.to_bits()), "table {t} state");
        }
    }

    #[test]
    fn tables_read_by_two_slots_are_not_distinct() {
        assert!(distinct(&[0, 1, 2]));
        assert!(distinct(&[]));
        assert!(!distinct(&[0, 1, 1]));
        assert!(!distinct(&[2, 0, 2]));
    }
}
