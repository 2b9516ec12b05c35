//! The first half of a step's lookup plan: each slot's distinct ids in
//! first-seen order, each occurrence's index among them, and where each
//! distinct id's row comes from (an owner, or a local replica). Slots are
//! independent, so they are planned on the worker's threads; the positions
//! in the owners' requests, which depend on the slots before, are numbered
//! afterwards in slot order ([`super::Home::plan`]).

use super::{TablePlan, HOT};
use crate::exchange::Replicas;
use crate::routing::shard_of;
use rustc_hash::FxHashMap;

/// One slot's part of the plan to make.
pub(super) struct SlotJob<'a> {
    pub(super) plan: &'a mut TablePlan,
    /// The slot's ids, one per entry of the batch.
    pub(super) ids: &'a [u64],
    /// The table they index.
    pub(super) table: usize,
    /// The slot travels as partial results (no replica serves it).
    pub(super) partial: bool,
}

impl SlotJob<'_> {
    /// Fills the plan's `unique` and `index`, and `place` with `(owner, 0)` or
    /// `(HOT, replica)` per distinct id; `seen` is scratch.
    pub(super) fn run(&mut self, seen: &mut FxHashMap<u64, u32>, replicas: &Replicas, workers: usize) {
        let plan = &mut *self.plan;
        plan.unique.clear();
        plan.index.clear();
        plan.place.clear();
        seen.clear();
        for &id in self.ids {
            let next = plan.unique.len() as u32;
            let u = *seen.entry(id).or_insert_with(|| {
                plan.unique.push(id);
                next
            });
            plan.index.push(u);
        }
        let (table, partial) = (self.table, self.partial);
        plan.place.extend(plan.unique.iter().map(|&id| {
            let replica = if partial { None } else { replicas.find(table, id) };
            replica.map_or_else(|| (shard_of(table, id, workers) as u32, 0), |h| (HOT, h))
        }));
    }
}
