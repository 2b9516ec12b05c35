//! The home side of a worker: the lookup plan of its micro-batch, the
//! forward and backward pass on the worker's dense replica ([`Dense`], passed
//! in) and the gradients it sends. What it reads of the owner side comes in as
//! [`LocalRows`].
//!
//! Invariant: a step's plan, pooled vectors and row gradients do not depend on
//! the threads the home may use ([`Home::set_threads`]): each slot is planned
//! and its rows' gradients summed on one thread in the one-thread order, and each
//! bag is pooled on one thread, so the messages are the same bit for bit.

mod dedup;
mod pool;
mod threads;

use self::dedup::SlotJob;
use self::threads::HostThreads;
use super::shared::{Dense, LocalRows};
use super::{Command, GradientMessage, LookupReply, LookupRequest, StepKind, StepStats, TrainerConfig};
use crate::batch::{Batch, SparseField};
use crate::exchange::narrow_ids;
use crate::exchange::{ExchangeConfig, PartialLookup, PartialSlot, Replicas, TableExchange, WireIds};
use crate::metrics::EvalSet;
use crate::nn::loss::{bce_with_logits_grad, bce_with_logits_sum, sigmoid};
use crate::nn::{DeepShares, DeepWeights, FmPartial, Model, SequenceInput};
use crate::OperatorError;
use rayon::prelude::*;
use rustc_hash::FxHashMap;

/// Lookup plan of one slot (a sparse or a sequence field) of the current micro-batch.
#[derive(Default)]
struct TablePlan {
    /// Distinct ids, first-seen order.
    unique: Vec<u64>,
    /// For each occurrence in the batch, its index in `unique`.
    index: Vec<u32>,
    /// For each unique id, (owner, row position in that owner's reply) for a
    /// `rows` field, (owner, position among the field's ids in that owner's
    /// request) for a `partial` field, or ([`HOT`], replica) for a replicated row.
    place: Vec<(u32, u32)>,
}

impl TablePlan {
    /// `(owner, first position)` when every unique id's row lies in one owner's
    /// reply, in first-seen order and one after another (one worker without
    /// replicas always plans so): the rows are then that reply's slice, read
    /// and written in place instead of through a copy per row.
    fn one_run(&self) -> Option<(usize, usize)> {
        let &(owner, first) = self.place.first()?;
        let run = owner != HOT
            && self.place.iter().enumerate().all(|(u, &(o, pos))| o == owner && pos as usize == first as usize + u);
        run.then_some((owner as usize, first as usize))
    }
}

thread_local! {
    /// Scratch of the dedup on a home's pool thread.
    static SEEN: std::cell::RefCell<FxHashMap<u64, u32>> = std::cell::RefCell::default();
}

/// The owner marker of a replicated row in [`TablePlan::place`].
const HOT: u32 = u32::MAX;

/// The home side of a worker: the current micro-batch and the buffers of its
/// forward and backward pass.
pub(super) struct Home {
    dim: usize,
    /// The table of each lookup slot: sparse field `f` reads table `f`; sequence field `s` reads `sequence_tables[s]`.
    slot_tables: Vec<usize>,
    command: Option<Command>,
    plans: Vec<TablePlan>,
    /// Each plan's [`TablePlan::one_run`], found once as the plan is made.
    runs: Vec<Option<(usize, usize)>>,
    replies: Vec<Vec<f32>>,
    unique_rows: Vec<f32>,
    dunique: Vec<f32>,
    pooled: Vec<f32>,
    dpooled: Vec<f32>,
    seq_rows: Vec<f32>,
    dseq: Vec<f32>,
    seq_lengths: Vec<usize>,
    dlogits: Vec<f32>,
    /// Scratch of the dedup on the worker's thread.
    seen: FxHashMap<u64, u32>,
    /// The threads this home may plan, pool and sum gradients on.
    host: HostThreads,
    /// Each field's distinct rows, one after another (where pooled on several threads).
    field_rows: Vec<Vec<f32>>,
    /// Each field's distinct rows' gradients (where summed on several threads).
    field_grads: Vec<Vec<f32>>,
    exchange: ExchangeConfig,
    /// The model's partial form when any field travels as partial results.
    partial: Option<FmPartial>,
    /// Each owner's partial sums of the current step.
    partial_replies: Vec<Vec<f32>>,
    /// Workers that received partial entries (as their rows' owners) for the current step.
    partial_owners: Vec<bool>,
    psum: Vec<f32>,
    dpsum: Vec<f32>,
    /// The home's share of the first layer's factor-block gradient (its `rows` fields; deep partial only).
    dwt: Vec<f32>,
    /// The first-layer input of the `rows` fields' pooled vectors (deep partial only).
    shares: DeepShares<f32>,
    /// Ids travel in four bytes (every table has at most 2³² rows).
    narrow_ids: bool,
    /// The first failure of the model found in a step's passes (its backend's error, or
    /// logits of another count than the batch's samples), until the trainer takes it
    /// ([`take_failure`](Self::take_failure)).
    failure: Option<OperatorError>,
}

impl Home {
    /// A home for `config`'s model on one of `workers` workers; `partial` is the
    /// model's partial form when any field travels as partial results.
    pub(super) fn new(
        config: &TrainerConfig,
        slot_tables: Vec<usize>,
        partial: Option<FmPartial>,
        workers: usize,
    ) -> Self {
        Home {
            dim: config.model.embedding_dim(),
            plans: slot_tables.iter().map(|_| TablePlan::default()).collect(),
            runs: vec![None; slot_tables.len()],
            slot_tables,
            command: None,
            replies: vec![Vec::new(); workers],
            unique_rows: Vec::new(),
            dunique: Vec::new(),
            pooled: Vec::new(),
            dpooled: Vec::new(),
            seq_rows: Vec::new(),
            dseq: Vec::new(),
            seq_lengths: Vec::new(),
            dlogits: Vec::new(),
            seen: FxHashMap::default(),
            host: HostThreads::new(1),
            field_rows: Vec::new(),
            field_grads: Vec::new(),
            exchange: config.exchange.clone(),
            partial,
            partial_replies: vec![Vec::new(); workers],
            partial_owners: vec![false; workers],
            psum: Vec::new(),
            dpsum: Vec::new(),
            dwt: Vec::new(),
            shares: DeepShares::default(),
            narrow_ids: narrow_ids(&config.table_sizes),
            failure: None,
        }
    }

    /// The failure of the model found in the last step's passes, if any (that step
    /// failed on every worker): [`OperatorError::Device`] for its backend's error,
    /// [`OperatorError::ModelOutput`] for logits of another count than the samples.
    pub(super) fn take_failure(&mut self) -> Option<OperatorError> {
        self.failure.take()
    }

    /// De-duplicates the command's ids per table and builds one request per
    /// owner; replicated rows are not requested (every worker holds them).
    #[inline(never)]
    pub(super) fn plan(&mut self, dense: &Dense, command: Command, replicas: &Replicas) -> Vec<LookupRequest> {
        let (me, w) = (dense.me(), dense.workers());
        let num_tables = self.plans.len();
        let batch_len = command.batch.len();
        let mut requests: Vec<LookupRequest> = (0..w)
            .map(|o| LookupRequest {
                from: me as u32,
                to: o as u32,
                table_lens: vec![0; num_tables],
                ids: WireIds::default(),
                partial: self.partial.map(|_| PartialLookup { batch_len: batch_len as u32, slots: Vec::new() }),
            })
            .collect();
        self.partial_owners.iter_mut().for_each(|p| *p = false);
        let mut ids: Vec<Vec<u64>> = vec![Vec::new(); w];
        if command.kind != StepKind::Report {
            let num_sparse = command.batch.sparse.len();
            let fields: Vec<&SparseField> = command.batch.sparse.iter().chain(&command.batch.sequences).collect();
            self.dedup(&fields, num_sparse, replicas, w);
            let mut rows_at = vec![0u32; w];
            let mut segment = vec![0u32; w];
            for (k, field) in fields.iter().enumerate() {
                let partial = k < num_sparse && self.exchange.table(k) == TableExchange::Partial;
                let plan = &mut self.plans[k];
                for (s, owned) in segment.iter_mut().zip(&ids) {
                    *s = owned.len() as u32;
                }
                // Each owned id's position: in its owner's reply (`rows`), or among
                // the slot's ids in its owner's request (`partial`).
                for (place, &id) in plan.place.iter_mut().zip(&plan.unique) {
                    if place.0 == HOT {
                        continue;
                    }
                    let o = place.0 as usize;
                    place.1 = if partial {
                        ids[o].len() as u32 - segment[o]
                    } else {
                        rows_at[o] += 1;
                        rows_at[o] - 1
                    };
                    ids[o].push(id);
                    requests[o].table_lens[k] += 1;
                }
                self.runs[k] = plan.one_run();
                if partial {
                    let mut slots: Vec<PartialSlot> = requests
                        .iter()
                        .map(|r| PartialSlot::new(batch_len, r.table_lens[k] as usize, field.weights.is_some()))
                        .collect();
                    for i in 0..batch_len {
                        let start = field.offsets[i] as usize;
                        if start == field.offsets[i + 1] as usize {
                            continue;
                        }
                        let (o, pos) = plan.place[plan.index[start] as usize];
                        let weight = field.weights.as_ref().map_or(1.0, |ws| ws[start]);
                        slots[o as usize].push(i, pos, weight);
                        self.partial_owners[o as usize] = true;
                    }
                    for (r, slot) in requests.iter_mut().zip(slots) {
                        r.partial.as_mut().expect("partial exchange").slots.push(slot);
                    }
                }
            }
        }
        for (r, owned) in requests.iter_mut().zip(&ids) {
            r.ids = WireIds::encode(owned, self.narrow_ids);
        }
        self.command = Some(command);
        requests
    }

    /// Lets the home plan, pool and sum gradients on up to `threads` threads (at
    /// least 1; see [`HostThreads`]).
    pub(super) fn set_threads(&mut self, threads: usize) {
        self.host = HostThreads::new(threads);
    }

    /// Each slot's distinct ids, their indices and their owners or replicas
    /// ([`SlotJob`]): slot by slot, or on the home's threads for a large batch.
    fn dedup(&mut self, fields: &[&SparseField], num_sparse: usize, replicas: &Replicas, workers: usize) {
        let entries = fields.iter().map(|f| f.ids.len()).sum();
        let (exchange, slot_tables) = (&self.exchange, &self.slot_tables);
        let jobs = self.plans.iter_mut().zip(fields).enumerate().map(|(k, (plan, field))| SlotJob {
            plan,
            ids: &field.ids,
            table: slot_tables[k],
            partial: k < num_sparse && exchange.table(k) == TableExchange::Partial,
        });
        match self.host.for_entries(entries) {
            Some(pool) => {
                let mut jobs: Vec<SlotJob<'_>> = jobs.collect();
                // Each pool thread keeps its own map, warm from one step to the next.
                pool.install(|| {
                    jobs.par_iter_mut().for_each(|job| SEEN.with_borrow_mut(|seen| job.run(seen, replicas, workers)))
                });
            }
            None => jobs.for_each(|mut job| job.run(&mut self.seen, replicas, workers)),
        }
    }

    /// Lays the rows of the batch's sequence fields out as `[B × T × S·d]` in
    /// `seq_rows` (padded to the longest sequence `T` of this batch, which it
    /// returns) and their lengths in `seq_lengths`.
    fn gather_sequences(&mut self, batch: &Batch, replicas: &Replicas) -> usize {
        let (b, d, f) = (batch.len(), self.dim, batch.sparse.len());
        let s = batch.sequences.len();
        self.seq_lengths.clear();
        let Some(first) = batch.sequences.first() else {
            self.seq_rows.clear();
            return 0;
        };
        self.seq_lengths.extend((0..b).map(|i| first.bag(i).len()));
        let steps = self.seq_lengths.iter().copied().max().unwrap_or(0);
        let width = s * d;
        self.seq_rows.clear();
        self.seq_rows.resize(b * steps * width, 0.0);
        for (j, field) in batch.sequences.iter().enumerate() {
            let plan = &self.plans[f + j];
            for i in 0..b {
                let start = field.offsets[i] as usize;
                for t in 0..self.seq_lengths[i] {
                    let place = plan.place[plan.index[start + t] as usize];
                    let dst = (i * steps + t) * width + j * d;
                    self.seq_rows[dst..dst + d].copy_from_slice(placed_row(&self.replies, replicas, place, d));
                }
            }
        }
        steps
    }

    /// Sums `dseq` per distinct id of each sequence slot into the gradient messages.
    fn scatter_sequence_grads(&mut self, batch: &Batch, steps: usize, messages: &mut [GradientMessage]) {
        let (b, d, f) = (batch.len(), self.dim, batch.sparse.len());
        let width = batch.sequences.len() * d;
        for (j, field) in batch.sequences.iter().enumerate() {
            let plan = &self.plans[f + j];
            self.dunique.clear();
            self.dunique.resize(plan.unique.len() * d, 0.0);
            for i in 0..b {
                let start = field.offsets[i] as usize;
                for t in 0..self.seq_lengths[i] {
                    let u = plan.index[start + t] as usize;
                    let src = (i * steps + t) * width + j * d;
                    for (a, &g) in self.dunique[u * d..(u + 1) * d].iter_mut().zip(&self.dseq[src..src + d]) {
                        *a += g;
                    }
                }
            }
            for (u, &place) in plan.place.iter().enumerate() {
                send_row_grad(messages, place, &self.dunique[u * d..(u + 1) * d]);
            }
        }
    }

    /// Runs the step's model work once every reply is in; returns one message per worker.
    #[inline(never)]
    pub(super) fn compute(
        &mut self,
        dense: &mut Dense,
        replies: Vec<LookupReply>,
        rows: LocalRows<'_>,
        bytes_sent: u64,
    ) -> Vec<GradientMessage> {
        let command = self.command.take().expect("a command precedes its replies");
        let (w, me, d) = (dense.workers(), dense.me() as u32, self.dim);
        let replicas = rows.replicas();
        let mut messages: Vec<GradientMessage> = (0..w)
            .map(|o| GradientMessage {
                from: me,
                to: o as u32,
                kind: command.kind,
                stats: StepStats::default(),
                sparse: Vec::new(),
                dense: Vec::new(),
                eval: EvalSet::default(),
                partial: Vec::new(),
                hot: Vec::new(),
                hot_grads: Vec::new(),
                failed_replies: 0,
            })
            .collect();
        let batch = &command.batch;
        let b = batch.len();
        let failed_replies = replies.iter().filter(|r| r.failed).count() as u32;
        let mut stats = StepStats {
            samples: b as u64,
            bytes_sent,
            failed_workers: command.failed as u64,
            stop_requests: command.stop as u64,
            bad_records: command.bad_records,
            ..Default::default()
        };
        match command.kind {
            StepKind::Report => {
                stats.samples = 0;
                stats.sum_squares = rows.sum_of_squares();
                if me == 0 {
                    stats.sum_squares += dense.sum_of_squares();
                }
            }
            StepKind::Train | StepKind::Eval => {
                for (o, r) in replies.into_iter().enumerate() {
                    self.replies[o] = r.rows;
                    self.partial_replies[o] = r.partial;
                }
                let f = batch.sparse.len();
                self.pool(batch, replicas);
                let steps = self.gather_sequences(batch, replicas);
                let logits = match self.partial {
                    Some(part) => {
                        self.sum_partials(part, b, f, rows.weights());
                        let pm = dense.model_mut().partial_model().expect("validated: the model has a partial form");
                        pm.forward_partial(&batch.dense, &self.psum, b).to_vec()
                    }
                    None => {
                        let seq = SequenceInput { rows: &self.seq_rows, lengths: &self.seq_lengths, steps };
                        dense.model_mut().forward_sequences(&batch.dense, &self.pooled, &seq, b).to_vec()
                    }
                };
                // Logits of another count than the samples fail the step here, before the loss
                // or a backward pass reads them: the messages go out empty and flagged failed.
                if logits.len() != b {
                    let error = OperatorError::ModelOutput { worker: me as usize, logits: logits.len(), samples: b };
                    self.failure.get_or_insert(error);
                    stats.failed_workers = 1;
                    return finish(messages, stats, failed_replies);
                }
                stats.loss_sum = bce_with_logits_sum(&logits, &batch.labels);
                if command.kind == StepKind::Eval || command.score {
                    messages[0].eval = EvalSet {
                        probs: logits.iter().map(|&x| sigmoid(x)).collect(),
                        labels: batch.labels.clone(),
                        groups: batch.groups.clone(),
                    };
                }
                if command.kind == StepKind::Train {
                    self.dlogits.resize(b, 0.0);
                    bce_with_logits_grad(&logits, &batch.labels, 1.0, &mut self.dlogits);
                    self.dpooled.resize(b * f * d, 0.0);
                    self.dseq.resize(self.seq_rows.len(), 0.0);
                    match self.partial {
                        Some(part) => {
                            let model = dense.model_mut();
                            self.backward_partials(part, model, b, f, &batch.dense, rows.weights(), &mut messages)
                        }
                        None => {
                            let seq = SequenceInput { rows: &self.seq_rows, lengths: &self.seq_lengths, steps };
                            dense.model_mut().backward_sequences(
                                &batch.dense,
                                &self.pooled,
                                &seq,
                                &self.dlogits,
                                &mut self.dpooled,
                                &mut self.dseq,
                            );
                        }
                    }
                    for m in messages.iter_mut() {
                        let len = self.replies[m.to as usize].len();
                        m.sparse.resize(len, 0.0);
                    }
                    self.pool_backward(batch, &mut messages);
                    self.scatter_sequence_grads(batch, steps, &mut messages);
                    // The receiver's slice of the dense gradient; the sender's own slice stays in
                    // `model.grads`, where its owner (this worker) reads it without a copy. (A deep
                    // model's partial exchange sends it after the owners' partial backward.)
                    let dense_later = self.partial.is_some_and(|p| p.deep.is_some());
                    for m in messages.iter_mut().filter(|m| m.to != me && !dense_later) {
                        m.dense = dense.grad_slice_for(m.to as usize);
                    }
                }
            }
        }
        // A failure of the model's backend in this step's passes (its logits are NaN, its
        // gradients zero) is this worker's failure in the step: every owner sees it in
        // these messages and updates nothing.
        if let Some(message) = dense.model_mut().take_error() {
            self.failure.get_or_insert(OperatorError::Device { worker: me as usize, message });
            stats.failed_workers = 1;
        }
        finish(messages, stats, failed_replies)
    }

    /// The first layer whose share this home computes itself: a deep model's, when some
    /// of its `f` fields travel as rows (none when every field is partial).
    fn home_share(&self, part: FmPartial, f: usize) -> Option<crate::nn::FirstLayer> {
        part.deep.filter(|_| (0..f).any(|t| self.exchange.table(t) == TableExchange::Rows))
    }

    /// `psum = Σ_owners (their partial sums) + the partial sums of the `rows` fields' pooled vectors`.
    fn sum_partials(&mut self, part: FmPartial, b: usize, f: usize, weights: &DeepWeights<f32>) {
        let (pw, d) = (part.width(), self.dim);
        self.psum.clear();
        self.psum.resize(b * pw, 0.0);
        for reply in &self.partial_replies {
            if !reply.is_empty() {
                for (a, &v) in self.psum.iter_mut().zip(reply) {
                    *a += v;
                }
            }
        }
        // The home's own first-layer share: its `rows` fields' pooled vectors (none when all are partial).
        let home_deep = self.home_share(part, f);
        if let Some(l) = &home_deep {
            self.shares.reset(l, b);
        }
        for t in (0..f).filter(|&t| self.exchange.table(t) == TableExchange::Rows) {
            for i in 0..b {
                let row = &self.pooled[(i * f + t) * d..(i * f + t + 1) * d];
                part.accumulate(row, 1.0, &mut self.psum[i * pw..(i + 1) * pw]);
                if let Some(l) = &home_deep {
                    self.shares.add(l, i, t, &row[1..], 1.0);
                }
            }
        }
        if let Some(l) = &home_deep {
            self.shares.add_shares(l, weights, &mut self.psum, pw, part.fm_width());
        }
    }

    /// Backward through the partial form: the model's gradients, the partial
    /// sums' gradient for every owner that contributed, and `dpooled` of the
    /// `rows` fields (with a deep part, their share of the first layer's gradient too).
    #[allow(clippy::too_many_arguments)]
    fn backward_partials(
        &mut self,
        part: FmPartial,
        model: &mut dyn Model<f32>,
        b: usize,
        f: usize,
        dense: &[f32],
        weights: &DeepWeights<f32>,
        messages: &mut [GradientMessage],
    ) {
        let (pw, d) = (part.width(), self.dim);
        self.dpsum.resize(b * pw, 0.0);
        let pm = model.partial_model().expect("validated: the model has a partial form");
        pm.backward_partial(dense, &self.psum, &self.dlogits, &mut self.dpsum);
        self.dpooled.fill(0.0);
        let home_deep = self.home_share(part, f);
        if let Some(l) = &home_deep {
            self.dwt.clear();
            self.dwt.resize(l.block_len(), 0.0);
            self.shares.backward(l, weights, &self.dpsum, pw, part.fm_width(), &mut self.dwt);
            l.add_transposed_grads(&self.dwt, model.grads_mut());
        }
        for t in (0..f).filter(|&t| self.exchange.table(t) == TableExchange::Rows) {
            for i in 0..b {
                let at = (i * f + t) * d..(i * f + t + 1) * d;
                let (row, dp) = (&self.pooled[at.clone()], &self.dpsum[i * pw..(i + 1) * pw]);
                let dfactors = home_deep.as_ref().map(|l| self.shares.dfactors(l, i, t));
                part.row_grad_with(row, 1.0, dp, dfactors, &mut self.dpooled[at]);
            }
        }
        for m in messages.iter_mut() {
            if self.partial_owners[m.to as usize] {
                m.partial = self.dpsum.clone();
            }
        }
    }
}

/// The home's messages of a step, each carrying the step's statistics and the count of
/// failed replies.
fn finish(mut messages: Vec<GradientMessage>, stats: StepStats, failed_replies: u32) -> Vec<GradientMessage> {
    for m in messages.iter_mut() {
        m.stats = stats;
        m.failed_replies = failed_replies;
    }
    messages
}

/// The row a plan placed at `place`: in an owner's reply or a local replica.
#[inline]
fn placed_row<'a>(replies: &'a [Vec<f32>], replicas: &'a Replicas, place: (u32, u32), d: usize) -> &'a [f32] {
    match place {
        (HOT, h) => replicas.row(h),
        (o, pos) => &replies[o as usize][pos as usize * d..(pos as usize + 1) * d],
    }
}

/// Puts the summed gradient `g` of the row placed at `place` into the
/// messages: into its owner's row gradients, or, for a replicated row, into
/// every worker's message.
#[inline]
fn send_row_grad(messages: &mut [GradientMessage], place: (u32, u32), g: &[f32]) {
    match place {
        (HOT, h) => {
            for m in messages.iter_mut() {
                m.hot.push(h);
                m.hot_grads.extend_from_slice(g);
            }
        }
        (o, pos) => {
            let p = pos as usize * g.len();
            messages[o as usize].sparse[p..p + g.len()].copy_from_slice(g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(place: &[(u32, u32)]) -> TablePlan {
        TablePlan { unique: vec![0; place.len()], index: Vec::new(), place: place.to_vec() }
    }

    /// Only rows one after another in one owner's reply are one run; a
    /// replica, a second owner or a gap sends the rows through the copy.
    #[test]
    fn one_run_is_one_owners_rows_one_after_another() {
        assert_eq!(plan(&[(0, 7), (0, 8), (0, 9)]).one_run(), Some((0, 7)));
        assert_eq!(plan(&[(2, 0)]).one_run(), Some((2, 0)));
        assert_eq!(plan(&[]).one_run(), None);
        assert_eq!(plan(&[(0, 7), (0, 9)]).one_run(), None);
        assert_eq!(plan(&[(0, 8), (0, 7)]).one_run(), None);
        assert_eq!(plan(&[(0, 7), (1, 8)]).one_run(), None);
        assert_eq!(plan(&[(0, 7), (HOT, 8)]).one_run(), None);
        assert_eq!(plan(&[(HOT, 0), (HOT, 1)]).one_run(), None);
    }
}
