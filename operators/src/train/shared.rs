//! What the home and owner sides of a worker share, passed to both as arguments.
//!
//! [`Dense`] is the worker's replica of the dense model with the worker's
//! place among the workers; the trainer owns it. The home side runs the
//! forward and backward pass on it and sends other workers their slices of its
//! gradient; the owner side updates this worker's slice
//! ([`dense_slice`]`(len, me, W)`) in place and broadcasts it. [`LocalRows`]
//! is the narrow read-only view of the owner side's state that the home side
//! needs in a step: the rows every worker replicates, the first-layer weights
//! the owner loaded for the step, and the sum of squares of the owned rows.

use super::dense_slice;
use crate::exchange::Replicas;
use crate::nn::{DeepWeights, Model};
use crate::store::{EmbeddingStore, Store};
use std::ops::Range;

/// One worker's replica of the dense model and the worker's place among the workers.
pub(super) struct Dense {
    model: Box<dyn Model<f32>>,
    me: usize,
    workers: usize,
}

impl Dense {
    pub(super) fn new(model: Box<dyn Model<f32>>, me: usize, workers: usize) -> Self {
        Dense { model, me, workers }
    }

    /// This worker's index.
    pub(super) fn me(&self) -> usize {
        self.me
    }

    /// Number of workers.
    pub(super) fn workers(&self) -> usize {
        self.workers
    }

    pub(super) fn model_mut(&mut self) -> &mut dyn Model<f32> {
        &mut *self.model
    }

    /// The flat dense parameters.
    pub(super) fn params(&self) -> &[f32] {
        self.model.params()
    }

    /// The range of the flat buffer that worker `k` updates.
    pub(super) fn slice_of(&self, k: usize) -> Range<usize> {
        dense_slice(self.model.params().len(), k, self.workers)
    }

    /// The range of the flat buffer that this worker updates.
    pub(super) fn own_slice(&self) -> Range<usize> {
        self.slice_of(self.me)
    }

    /// Worker `to`'s slice of this worker's dense gradient (to send it there).
    pub(super) fn grad_slice_for(&self, to: usize) -> Vec<f32> {
        self.model.grads()[self.slice_of(to)].to_vec()
    }

    /// Copies a slice owner's updated values, starting at `offset`, into the replica.
    pub(super) fn write(&mut self, offset: usize, values: &[f32]) {
        self.model.params_mut()[offset..offset + values.len()].copy_from_slice(values);
    }

    /// Σ of squares of the dense parameters.
    pub(super) fn sum_of_squares(&self) -> f64 {
        self.model.params().iter().map(|&v| v as f64 * v as f64).sum::<f64>()
    }
}

/// What the home side reads of the owner side's state during a step.
#[derive(Clone, Copy)]
pub(super) struct LocalRows<'a> {
    store: &'a Store,
    replicas: &'a Replicas,
    weights: &'a DeepWeights<f32>,
}

impl<'a> LocalRows<'a> {
    pub(super) fn new(store: &'a Store, replicas: &'a Replicas, weights: &'a DeepWeights<f32>) -> Self {
        LocalRows { store, replicas, weights }
    }

    /// The hot rows every worker holds.
    pub(super) fn replicas(&self) -> &'a Replicas {
        self.replicas
    }

    /// The deep part's first-layer factor block as the owner side loaded it for this
    /// step (a deep model's `partial` exchange only; empty otherwise).
    pub(super) fn weights(&self) -> &'a DeepWeights<f32> {
        self.weights
    }

    /// Σ of squares of the rows this worker owns.
    pub(super) fn sum_of_squares(&self) -> f64 {
        self.store.sum_of_squares()
    }
}
