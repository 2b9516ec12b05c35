//! Pooling a step's rows into per-field vectors, and its adjoint: summing the
//! pooled vectors' gradient into each distinct row's gradient for the messages.
//!
//! On one thread a field's distinct rows are laid out and pooled in turn. On
//! several, each field's rows are laid out on some thread, the bags are pooled
//! by ranges of samples (a bag's entries are added in the same order), and each
//! field's row gradients are summed over all its entries on one thread, in the
//! one-thread order: the same values bit for bit.

use super::{placed_row, send_row_grad, Home, TablePlan};
use crate::batch::Batch;
use crate::exchange::{Replicas, TableExchange};
use crate::nn::embedding_bag::{pool_sum, pool_sum_backward};
use crate::train::GradientMessage;
use rayon::prelude::*;

impl Home {
    /// Whether sparse field `t` travels as rows (not as partial results).
    fn rows_field(&self, t: usize) -> bool {
        self.exchange.table(t) != TableExchange::Partial
    }

    /// `pooled = [B × F × d]`: each bag of each field summed from its rows, zero
    /// for a field exchanged as partial sums.
    pub(super) fn pool(&mut self, batch: &Batch, replicas: &Replicas) {
        let (b, f, d) = (batch.len(), batch.sparse.len(), self.dim);
        // Every slot is written below, so it is not cleared first.
        self.pooled.resize(b * f * d, 0.0);
        let entries = sparse_entries(batch);
        let threads = self.host.threads_for(entries);
        let Some(pool) = self.host.for_entries(entries).filter(|_| d > 0) else {
            return self.pool_on_one_thread(batch, replicas);
        };
        self.field_rows.resize_with(f, Vec::new);
        let (replies, plans, runs) = (&self.replies, &self.plans, &self.runs);
        let rows_fields: Vec<bool> = (0..f).map(|t| self.rows_field(t)).collect();
        let mut layouts: Vec<(usize, &mut Vec<f32>)> =
            self.field_rows.iter_mut().enumerate().filter(|&(t, _)| rows_fields[t] && runs[t].is_none()).collect();
        pool.install(|| {
            layouts.par_iter_mut().for_each(|(t, rows)| distinct_rows(&plans[*t], replies, replicas, d, rows))
        });
        let field_rows = &self.field_rows;
        let rows: Vec<Option<&[f32]>> = (0..f)
            .map(|t| {
                rows_fields[t].then(|| match runs[t] {
                    Some((o, first)) => &replies[o][first * d..(first + plans[t].place.len()) * d],
                    None => &field_rows[t][..],
                })
            })
            .collect();
        // A few ranges of samples a thread, so a slow thread holds up the others less.
        let per = b.div_ceil(4 * threads).max(1);
        pool.install(|| {
            self.pooled.par_chunks_mut(per * f * d).enumerate().for_each(|(i, out)| {
                let (start, n) = (i * per, out.len() / (f * d));
                for (t, rows) in rows.iter().enumerate() {
                    match rows {
                        None => out.chunks_exact_mut(d).skip(t).step_by(f).for_each(|slot| slot.fill(0.0)),
                        Some(rows) => {
                            let field = &batch.sparse[t];
                            let offsets = &field.offsets[start..=start + n];
                            pool_sum(rows, d, offsets, &plans[t].index, field.weights.as_deref(), t, f, out);
                        }
                    }
                }
            })
        });
    }

    fn pool_on_one_thread(&mut self, batch: &Batch, replicas: &Replicas) {
        let (f, d) = (batch.sparse.len(), self.dim);
        for (t, plan) in self.plans[..f].iter().enumerate() {
            if !self.rows_field(t) {
                for slot in self.pooled.chunks_exact_mut(d.max(1)).skip(t).step_by(f) {
                    slot.fill(0.0);
                }
                continue;
            }
            let rows: &[f32] = match self.runs[t] {
                Some((o, first)) => &self.replies[o][first * d..(first + plan.place.len()) * d],
                None => {
                    distinct_rows(plan, &self.replies, replicas, d, &mut self.unique_rows);
                    &self.unique_rows
                }
            };
            let (field, weights) = (&batch.sparse[t], batch.sparse[t].weights.as_deref());
            pool_sum(rows, d, &field.offsets, &plan.index, weights, t, f, &mut self.pooled);
        }
    }

    /// Sums `dpooled` into each `rows` field's distinct rows and puts them into the
    /// messages (an owner's row gradients, or every worker's for a replica).
    pub(super) fn pool_backward(&mut self, batch: &Batch, messages: &mut [GradientMessage]) {
        let (f, d) = (batch.sparse.len(), self.dim);
        let entries = sparse_entries(batch);
        let Some(pool) = self.host.for_entries(entries).filter(|_| d > 0) else {
            return self.pool_backward_on_one_thread(batch, messages);
        };
        self.field_grads.resize_with(f, Vec::new);
        let (plans, dpooled) = (&self.plans, &self.dpooled);
        let rows_fields: Vec<bool> = (0..f).map(|t| self.rows_field(t)).collect();
        let mut sums: Vec<(usize, &mut Vec<f32>)> =
            self.field_grads.iter_mut().enumerate().filter(|&(t, _)| rows_fields[t]).collect();
        pool.install(|| {
            sums.par_iter_mut().for_each(|(t, grads)| {
                let (t, field) = (*t, &batch.sparse[*t]);
                grads.clear();
                grads.resize(plans[t].unique.len() * d, 0.0);
                pool_sum_backward(dpooled, d, &field.offsets, &plans[t].index, field.weights.as_deref(), t, f, grads);
            })
        });
        for t in (0..f).filter(|&t| rows_fields[t]) {
            let grads = &self.field_grads[t];
            match self.runs[t] {
                Some((o, first)) => messages[o].sparse[first * d..first * d + grads.len()].copy_from_slice(grads),
                None => send_field_grads(messages, &self.plans[t], grads, d),
            }
        }
    }

    fn pool_backward_on_one_thread(&mut self, batch: &Batch, messages: &mut [GradientMessage]) {
        let (f, d) = (batch.sparse.len(), self.dim);
        for (t, plan) in self.plans[..f].iter().enumerate() {
            if !self.rows_field(t) {
                continue;
            }
            let field = &batch.sparse[t];
            let (offsets, weights) = (&field.offsets, field.weights.as_deref());
            if let Some((o, first)) = self.runs[t] {
                // The owner's row gradients, zero until now, summed where they are sent.
                let rows = first * d..(first + plan.place.len()) * d;
                let dunique = &mut messages[o].sparse[rows];
                pool_sum_backward(&self.dpooled, d, offsets, &plan.index, weights, t, f, dunique);
                continue;
            }
            self.dunique.clear();
            self.dunique.resize(plan.unique.len() * d, 0.0);
            pool_sum_backward(&self.dpooled, d, offsets, &plan.index, weights, t, f, &mut self.dunique);
            send_field_grads(messages, plan, &self.dunique, d);
        }
    }
}

/// `out` = the rows of `plan`'s distinct ids, one after another (from the
/// owners' replies or the local replicas).
fn distinct_rows(plan: &TablePlan, replies: &[Vec<f32>], replicas: &Replicas, d: usize, out: &mut Vec<f32>) {
    out.clear();
    for &place in &plan.place {
        out.extend_from_slice(placed_row(replies, replicas, place, d));
    }
}

/// Puts each of `plan`'s distinct rows' summed gradient (`grads`, one after
/// another) into the messages.
fn send_field_grads(messages: &mut [GradientMessage], plan: &TablePlan, grads: &[f32], d: usize) {
    for (u, &place) in plan.place.iter().enumerate() {
        send_row_grad(messages, place, &grads[u * d..(u + 1) * d]);
    }
}

/// The entries of `batch`'s sparse fields.
fn sparse_entries(batch: &Batch) -> usize {
    batch.sparse.iter().map(|field| field.ids.len()).sum()
}
