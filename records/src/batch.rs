//! Columnar micro-batches of samples.
//!
//! A [`Batch`] holds `len()` samples: one label each, a row-major `[B × D]`
//! block of dense features and one CSR bag per sparse field. Bag `i` of a
//! field is `ids[offsets[i]..offsets[i + 1]]`; `offsets` always has `B + 1`
//! entries and starts at 0. An absent categorical value is an empty bag.
//!
//! Behaviour sequences (a user's recent items, categories, …) are kept in
//! `sequences`, one CSR list per sequence field, with the same layout as a
//! sparse field but where order matters: ids run oldest first. All sequence
//! fields of one sample have the same length (item `t` of every field
//! describes the same event), which [`Batch::check`] enforces.
//!
//! `groups` is not a feature: when the format names a user column it holds
//! each sample's user ([`group_key`](crate::metrics::group_key)), for
//! per-user metrics; otherwise it is empty. It is either empty or has one
//! entry per sample.
//!
//! Labels, dense values and bag weights are finite numbers: one NaN or infinity
//! would ruin every parameter it reaches, so [`Batch::check`] refuses it, naming
//! the sample and the value. Labels lie in `[0, 1]`: 0 or 1 for a click, or a soft
//! label (a probability) between them; the binary cross-entropy the models train
//! means nothing for a label outside, such as a `±1` label, which [`Batch::check`]
//! refuses naming the sample and the label.

use serde::{Deserialize, Serialize};

/// One sparse field of a batch as a CSR bag list.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SparseField {
    /// `B + 1` offsets into `ids`, starting at 0.
    pub offsets: Vec<u32>,
    /// Row ids (already bucketed into the field's table).
    pub ids: Vec<u64>,
    /// Optional per-id pooling weights (`ids.len()` of them; `None` means every
    /// weight is 1). Mean pooling writes `1/n` for each of a bag's `n` ids.
    #[serde(default)]
    pub weights: Option<Vec<f32>>,
}

impl SparseField {
    /// An empty field with zero bags.
    pub fn new() -> Self {
        SparseField { offsets: vec![0], ids: Vec::new(), weights: None }
    }

    /// Ids of bag `i`.
    #[inline]
    pub fn bag(&self, i: usize) -> &[u64] {
        &self.ids[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// Number of bags.
    #[inline]
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// True when the field holds no bags.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes the current bag (the ids pushed since the last close).
    #[inline]
    pub fn close_bag(&mut self) {
        self.offsets.push(self.ids.len() as u32);
    }

    /// Closes the current bag giving each of its ids the weight `1/n` (mean
    /// pooling); an empty bag stays empty. Earlier unweighted ids get weight 1.
    pub fn close_bag_mean(&mut self) {
        let start = *self.offsets.last().unwrap() as usize;
        let n = self.ids.len() - start;
        let w = self.weights.get_or_insert_with(Vec::new);
        w.resize(start, 1.0);
        w.resize(start + n, 1.0 / n.max(1) as f32);
        self.close_bag();
    }

    /// Weights of bag `i` (`None` when the field is unweighted).
    #[inline]
    pub fn bag_weights(&self, i: usize) -> Option<&[f32]> {
        self.weights.as_deref().map(|w| &w[self.offsets[i] as usize..self.offsets[i + 1] as usize])
    }

    /// Appends bag `i` of `src` (ids and weights) as one new bag.
    pub fn push_bag_from(&mut self, src: &SparseField, i: usize) {
        let start = self.ids.len();
        self.ids.extend_from_slice(src.bag(i));
        match (src.bag_weights(i), &mut self.weights) {
            (Some(w), mine) => {
                let mine = mine.get_or_insert_with(Vec::new);
                mine.resize(start, 1.0);
                mine.extend_from_slice(w);
            }
            (None, Some(mine)) => mine.resize(self.ids.len(), 1.0),
            (None, None) => {}
        }
        self.close_bag();
    }

    /// Removes all bags, keeping the allocations.
    pub fn clear(&mut self) {
        self.offsets.clear();
        self.offsets.push(0);
        self.ids.clear();
        if let Some(w) = &mut self.weights {
            w.clear();
        }
    }
}

/// A columnar micro-batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// One label per sample, in `[0, 1]`: 0 or 1, or a soft label between them.
    pub labels: Vec<f32>,
    /// Number of dense features per sample.
    pub num_dense: usize,
    /// Row-major `[B × num_dense]` dense features.
    pub dense: Vec<f32>,
    /// One CSR bag list per sparse field.
    pub sparse: Vec<SparseField>,
    /// One CSR list per sequence field (oldest first; equal lengths per sample across fields).
    #[serde(default)]
    pub sequences: Vec<SparseField>,
    /// Each sample's user ([`group_key`](crate::metrics::group_key)) when the format names a
    /// user column; empty otherwise. Not a feature: per-user metrics group by it.
    #[serde(default)]
    pub groups: Vec<u64>,
}

impl Batch {
    /// An empty batch with the given shape.
    pub fn new(num_dense: usize, num_sparse: usize) -> Self {
        Batch {
            labels: Vec::new(),
            num_dense,
            dense: Vec::new(),
            sparse: (0..num_sparse).map(|_| SparseField::new()).collect(),
            sequences: Vec::new(),
            groups: Vec::new(),
        }
    }

    /// An empty batch that also carries `num_sequences` sequence fields.
    pub fn with_sequences(num_dense: usize, num_sparse: usize, num_sequences: usize) -> Self {
        let mut b = Batch::new(num_dense, num_sparse);
        b.sequences = (0..num_sequences).map(|_| SparseField::new()).collect();
        b
    }

    /// Number of samples.
    #[inline]
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when the batch holds no samples.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Removes all samples, keeping the shape and the allocations.
    pub fn clear(&mut self) {
        self.labels.clear();
        self.dense.clear();
        self.groups.clear();
        for f in self.sparse.iter_mut().chain(&mut self.sequences) {
            f.clear();
        }
    }

    /// Appends sample `i` of `other` (same shape) to `self`.
    pub fn push_from(&mut self, other: &Batch, i: usize) {
        debug_assert_eq!(self.num_dense, other.num_dense);
        self.labels.push(other.labels[i]);
        let d = self.num_dense;
        self.dense.extend_from_slice(&other.dense[i * d..(i + 1) * d]);
        for (dst, src) in self.sparse.iter_mut().zip(&other.sparse) {
            dst.push_bag_from(src, i);
        }
        for (dst, src) in self.sequences.iter_mut().zip(&other.sequences) {
            dst.push_bag_from(src, i);
        }
        if let Some(&g) = other.groups.get(i).filter(|_| other.groups.len() == other.len()) {
            self.groups.push(g);
        }
    }

    /// Appends all samples of `other` (same shape).
    pub fn extend_from(&mut self, other: &Batch) {
        for i in 0..other.len() {
            self.push_from(other, i);
        }
    }

    /// Checks the invariants of the [module docs](self): dense length, offsets, weights,
    /// equal sequence lengths per sample, groups (none, or one per sample), finite
    /// labels, dense values and weights, and labels in `[0, 1]`. Used by tests,
    /// readers in debug builds and `Trainer::step` (in `tiderec-operators`) on every batch it
    /// is handed.
    pub fn check(&self) -> Result<(), BatchError> {
        let b = self.len();
        if self.dense.len() != b * self.num_dense {
            return Err(BatchError::Dense { values: self.dense.len(), expected: b * self.num_dense });
        }
        if !self.groups.is_empty() && self.groups.len() != b {
            return Err(BatchError::Groups { groups: self.groups.len(), samples: b });
        }
        if let Some(i) = self.labels.iter().position(|y| !y.is_finite()) {
            return Err(BatchError::NonFinite { sample: i, value: BatchValue::Label });
        }
        if let Some(i) = self.labels.iter().position(|y| !(0.0..=1.0).contains(y)) {
            return Err(BatchError::LabelOutOfRange { sample: i, label: self.labels[i] });
        }
        if let Some(k) = self.dense.iter().position(|v| !v.is_finite()) {
            return Err(BatchError::NonFinite {
                sample: k / self.num_dense,
                value: BatchValue::Dense(k % self.num_dense),
            });
        }
        let named = self.sparse.iter().enumerate().map(|(f, s)| (BatchField::Sparse(f), s));
        let sequences = self.sequences.iter().enumerate().map(|(f, s)| (BatchField::Sequence(f), s));
        for (field, s) in named.chain(sequences) {
            if s.offsets.len() != b + 1 || s.offsets[0] != 0 {
                return Err(BatchError::Offsets { field, offsets: s.offsets.len(), samples: b });
            }
            if decreases(&s.offsets) || s.offsets[b] as usize != s.ids.len() {
                return Err(BatchError::Bags { field, ids: s.ids.len() });
            }
            if let Some(w) = &s.weights {
                if w.len() != s.ids.len() {
                    return Err(BatchError::Weights { field, weights: w.len(), ids: s.ids.len() });
                }
                if let Some(k) = w.iter().position(|v| !v.is_finite()) {
                    let sample = s.offsets.partition_point(|&o| o as usize <= k) - 1;
                    return Err(BatchError::NonFinite { sample, value: BatchValue::Weight(field) });
                }
            }
        }
        if let Some(first) = self.sequences.first() {
            for (f, s) in self.sequences.iter().enumerate().skip(1) {
                if let Some(i) = (0..b).find(|&i| s.bag(i).len() != first.bag(i).len()) {
                    return Err(BatchError::SequenceLengths {
                        sample: i,
                        sequence: f,
                        items: s.bag(i).len(),
                        first: first.bag(i).len(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Whether some offset is below the one before it. Branch-free over the
/// whole slice (a check that passes reads everything anyway), so it runs in
/// vector lanes: [`Batch::check`] runs on every batch a trainer takes.
fn decreases(offsets: &[u32]) -> bool {
    let (before, after) = (&offsets[..offsets.len().saturating_sub(1)], offsets.get(1..).unwrap_or(&[]));
    before.iter().zip(after).fold(false, |bad, (a, b)| bad | (a > b))
}

/// A field of a [`Batch`], as named in a [`BatchError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchField {
    /// Sparse field `i` (`Batch::sparse[i]`).
    Sparse(usize),
    /// Sequence field `i` (`Batch::sequences[i]`).
    Sequence(usize),
}

impl std::fmt::Display for BatchField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchField::Sparse(i) => write!(f, "field {i}"),
            BatchField::Sequence(i) => write!(f, "sequence {i}"),
        }
    }
}

/// A value of a sample of a [`Batch`], as named in [`BatchError::NonFinite`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchValue {
    /// The label.
    Label,
    /// Dense feature `i`.
    Dense(usize),
    /// A bag weight of a field.
    Weight(BatchField),
}

impl std::fmt::Display for BatchValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchValue::Label => write!(f, "the label"),
            BatchValue::Dense(i) => write!(f, "dense feature {i}"),
            BatchValue::Weight(field) => write!(f, "a weight of {field}"),
        }
    }
}

/// A broken invariant of a [`Batch`], found by [`Batch::check`].
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum BatchError {
    /// `dense` does not hold `len() × num_dense` values.
    #[error("dense has {values} values, expected {expected}")]
    Dense {
        /// Values in `dense`.
        values: usize,
        /// `len() × num_dense`.
        expected: usize,
    },
    /// `groups` is neither empty nor one entry per sample.
    #[error("{groups} groups for {samples} samples")]
    Groups {
        /// Entries in `groups`.
        groups: usize,
        /// Samples in the batch.
        samples: usize,
    },
    /// A field's `offsets` does not have `len() + 1` entries starting at 0.
    #[error("{field}: {offsets} offsets for {samples} samples")]
    Offsets {
        /// The field.
        field: BatchField,
        /// Entries in its `offsets`.
        offsets: usize,
        /// Samples in the batch.
        samples: usize,
    },
    /// A field's offsets decrease somewhere or do not end at `ids.len()`.
    #[error("{field}: offsets not monotone or not ending at ids.len() ({ids})")]
    Bags {
        /// The field.
        field: BatchField,
        /// Entries in its `ids`.
        ids: usize,
    },
    /// A field's `weights` do not pair one with each id.
    #[error("{field}: {weights} weights for {ids} ids")]
    Weights {
        /// The field.
        field: BatchField,
        /// Entries in its `weights`.
        weights: usize,
        /// Entries in its `ids`.
        ids: usize,
    },
    /// A sample's sequence fields have different lengths.
    #[error("sample {sample}: sequence {sequence} has {items} items but sequence 0 has {first}")]
    SequenceLengths {
        /// The sample.
        sample: usize,
        /// The sequence field that differs from sequence 0.
        sequence: usize,
        /// Its items in this sample.
        items: usize,
        /// Sequence 0's items in this sample.
        first: usize,
    },
    /// A label, dense value or bag weight is NaN or infinite: it would ruin the model.
    #[error("sample {sample}: {value} is not a finite number")]
    NonFinite {
        /// The sample.
        sample: usize,
        /// Which of its values.
        value: BatchValue,
    },
    /// A label is outside `[0, 1]` (a `±1` label, say): binary cross-entropy needs a
    /// click probability.
    #[error("sample {sample}: the label {label} is outside [0, 1]")]
    LabelOutOfRange {
        /// The sample.
        sample: usize,
        /// Its label (a finite number: a NaN or infinite one is [`BatchError::NonFinite`]).
        label: f32,
    },
}

/// Equality is total: the one float a [`BatchError`] holds, the label of
/// [`BatchError::LabelOutOfRange`], is finite.
impl Eq for BatchError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_that_decrease_or_miss_the_ids_are_refused_naming_the_field() {
        assert!(!decreases(&[]) && !decreases(&[0]) && !decreases(&[0, 0, 3, 3, 7]));
        assert!(decreases(&[0, 2, 1, 3]) && decreases(&[0, 5, 5, 4]));
        let mut b = Batch::new(0, 2);
        for i in 0..40u64 {
            b.labels.push(0.0);
            for s in &mut b.sparse {
                s.ids.extend(0..i % 3);
                s.close_bag();
            }
        }
        b.check().unwrap();
        let mut down = b.clone();
        down.sparse[1].offsets.swap(17, 18);
        assert!(down.sparse[1].offsets[17] > down.sparse[1].offsets[18], "the swap makes a decrease");
        assert_eq!(down.check(), Err(BatchError::Bags { field: BatchField::Sparse(1), ids: b.sparse[1].ids.len() }));
        let mut short = b.clone();
        short.sparse[0].ids.pop();
        assert!(matches!(short.check(), Err(BatchError::Bags { field: BatchField::Sparse(0), .. })));
    }

    #[test]
    fn a_value_that_is_not_finite_is_refused_naming_its_sample() {
        let mut b = Batch::new(3, 1);
        for i in 0..4u64 {
            b.labels.push((i % 2) as f32);
            b.dense.extend([0.5, 1.5, 2.5]);
            b.sparse[0].ids.extend([i, i + 1]);
            b.sparse[0].close_bag();
        }
        b.sparse[0].weights = Some(vec![1.0; 8]);
        b.check().unwrap();
        let nonfinite = |sample, value| Err(BatchError::NonFinite { sample, value });
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut label = b.clone();
            label.labels[2] = bad;
            assert_eq!(label.check(), nonfinite(2, BatchValue::Label));
            let mut dense = b.clone();
            dense.dense[3 * 3 + 1] = bad;
            assert_eq!(dense.check(), nonfinite(3, BatchValue::Dense(1)));
            let mut weight = b.clone();
            weight.sparse[0].weights.as_mut().unwrap()[5] = bad;
            assert_eq!(weight.check(), nonfinite(2, BatchValue::Weight(BatchField::Sparse(0))));
        }
        let mut dense = b.clone();
        dense.dense[0] = f32::NAN;
        assert_eq!(dense.check().unwrap_err().to_string(), "sample 0: dense feature 0 is not a finite number");
    }

    #[test]
    fn a_label_outside_zero_one_is_refused_naming_its_sample_and_value() {
        let mut b = Batch::new(0, 0);
        b.labels.extend([0.0, 1.0, 0.25, 1.0]);
        b.check().expect("0, 1 and soft labels between them are labels");
        for bad in [-1.0, 2.0, 1.0 + f32::EPSILON, -0.0001] {
            let mut out = b.clone();
            out.labels[3] = bad;
            assert_eq!(out.check(), Err(BatchError::LabelOutOfRange { sample: 3, label: bad }));
        }
        b.labels[1] = -1.0;
        assert_eq!(b.check().unwrap_err().to_string(), "sample 1: the label -1 is outside [0, 1]");
    }

    #[test]
    fn push_and_extend_keep_invariants() {
        let mut a = Batch::new(2, 2);
        a.labels.push(1.0);
        a.dense.extend([1.0, 2.0]);
        a.sparse[0].ids.push(7);
        a.sparse[0].close_bag();
        a.sparse[1].close_bag();
        a.check().unwrap();
        let mut b = Batch::new(2, 2);
        b.extend_from(&a);
        b.extend_from(&a);
        b.check().unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(b.sparse[0].bag(1), &[7]);
        assert!(b.sparse[1].bag(1).is_empty());
        b.clear();
        assert!(b.is_empty());
        b.check().unwrap();
    }

    #[test]
    fn groups_follow_their_samples() {
        let mut a = Batch::new(0, 0);
        a.labels.extend([1.0, 0.0]);
        a.groups.extend([7, 8]);
        a.check().unwrap();
        let mut b = Batch::new(0, 0);
        b.push_from(&a, 1);
        b.extend_from(&a);
        assert_eq!(b.groups, [8, 7, 8]);
        b.check().unwrap();
        b.groups.pop();
        assert_eq!(b.check(), Err(BatchError::Groups { groups: 2, samples: 3 }));
        b.clear();
        assert!(b.groups.is_empty());
        b.extend_from(&Batch { labels: vec![1.0], ..Batch::new(0, 0) });
        assert!(b.groups.is_empty(), "samples without a user add no group");
        b.check().unwrap();
    }

    #[test]
    fn weights_follow_their_bags() {
        let mut a = Batch::new(0, 1);
        for bag in [&[1u64, 2, 3][..], &[], &[4]] {
            a.labels.push(0.0);
            a.sparse[0].ids.extend_from_slice(bag);
            a.sparse[0].close_bag_mean();
        }
        a.check().unwrap();
        assert_eq!(a.sparse[0].weights.as_deref(), Some(&[1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 1.0][..]));
        let mut b = Batch::new(0, 1);
        b.labels.push(1.0);
        b.sparse[0].ids.push(9);
        b.sparse[0].close_bag();
        b.extend_from(&a);
        b.check().unwrap();
        assert_eq!(b.sparse[0].bag_weights(0), Some(&[1.0][..]), "unweighted bags get weight 1");
        assert_eq!(b.sparse[0].bag_weights(3), Some(&[1.0][..]));
        assert_eq!(b.sparse[0].bag_weights(1).unwrap().len(), 3);
        b.clear();
        b.check().unwrap();
    }
}
