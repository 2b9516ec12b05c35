//! The wire format and the owner-side kernels of the `partial` exchange.
//!
//! A home sends each owner, per partial field, the distinct ids it owns (in
//! the packed request, like `rows`) plus which samples hold one of them
//! ([`PartialSlot::present`], one bit per sample) and, for each such sample
//! in order, the index of its id among that field's ids ([`PartialSlot::index`],
//! two bytes each when the field sends at most 65,536 ids to this owner)
//! and its pooling weight if the field is weighted. The owner answers with
//! `B × width` partial sums and later receives `B × width` gradients of them.

use crate::nn::{DeepShares, FmPartial};
use serde::{Deserialize, Serialize};

/// Positions of ids among a field's requested ids, as narrow as they fit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdIndex {
    /// At most 65,536 ids.
    Narrow(Vec<u16>),
    /// More.
    Wide(Vec<u32>),
}

impl IdIndex {
    #[inline]
    fn get(&self, j: usize) -> usize {
        match self {
            IdIndex::Narrow(v) => v[j] as usize,
            IdIndex::Wide(v) => v[j] as usize,
        }
    }

    /// Number of positions.
    pub fn len(&self) -> usize {
        match self {
            IdIndex::Narrow(v) => v.len(),
            IdIndex::Wide(v) => v.len(),
        }
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn wire_bytes(&self) -> u64 {
        match self {
            IdIndex::Narrow(v) => 2 * v.len() as u64,
            IdIndex::Wide(v) => 4 * v.len() as u64,
        }
    }
}

/// One partial field of a request: which samples use which of the field's requested ids.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartialSlot {
    /// Bit `i` set: sample `i` has an id owned by the receiver in this field.
    pub present: Vec<u64>,
    /// For each present sample in order, the position of its id in the field's ids of the request.
    pub index: IdIndex,
    /// For each present sample in order, its pooling weight (`None`: all 1).
    pub weights: Option<Vec<f32>>,
}

impl PartialSlot {
    /// An empty slot for a batch of `batch` samples whose field sends `ids` ids to the receiver.
    pub fn new(batch: usize, ids: usize, weighted: bool) -> Self {
        let index = if ids <= 1 << 16 { IdIndex::Narrow(Vec::new()) } else { IdIndex::Wide(Vec::new()) };
        PartialSlot { present: vec![0; batch.div_ceil(64)], index, weights: weighted.then(Vec::new) }
    }

    /// Records that sample `sample` (given in increasing order) uses id `index` with `weight`.
    #[inline]
    pub fn push(&mut self, sample: usize, index: u32, weight: f32) {
        self.present[sample / 64] |= 1 << (sample % 64);
        match &mut self.index {
            IdIndex::Narrow(v) => v.push(index as u16),
            IdIndex::Wide(v) => v.push(index),
        }
        if let Some(w) = &mut self.weights {
            w.push(weight);
        }
    }

    /// The present samples in increasing order, with their id index and weight.
    pub fn entries(&self) -> impl Iterator<Item = (usize, usize, f32)> + '_ {
        let samples = self.present.iter().enumerate().flat_map(|(word, &bits)| {
            let mut bits = bits;
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    word * 64 + b
                })
            })
        });
        samples.enumerate().map(move |(j, sample)| {
            let w = self.weights.as_ref().map_or(1.0, |w| w[j]);
            (sample, self.index.get(j), w)
        })
    }

    /// Bytes on the wire.
    pub fn wire_bytes(&self) -> u64 {
        8 * self.present.len() as u64 + self.index.wire_bytes() + 4 * self.weights.as_ref().map_or(0, Vec::len) as u64
    }
}

/// The partial fields of one request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PartialLookup {
    /// Samples in the requester's micro-batch.
    pub batch_len: u32,
    /// One per partial field, in field order (empty for steps without data).
    pub slots: Vec<PartialSlot>,
}

impl PartialLookup {
    /// Bytes on the wire.
    pub fn wire_bytes(&self) -> u64 {
        4 + self.slots.iter().map(PartialSlot::wire_bytes).sum::<u64>()
    }

    /// Whether any sample uses a row of the receiver.
    pub fn any(&self) -> bool {
        self.slots.iter().any(|s| !s.index.is_empty())
    }
}

/// Adds the contributions of field `field`'s `rows` (`e` values each, in the
/// request's order) to the partial sums `out: [B × width]`: the FM sums here,
/// the deep part's first-layer input into `shares` (whose
/// [`DeepShares::add_shares`] adds the layer's share once every field is in).
pub fn accumulate_slot(
    part: FmPartial,
    field: usize,
    slot: &PartialSlot,
    rows: &[f32],
    e: usize,
    out: &mut [f32],
    mut shares: Option<&mut DeepShares<f32>>,
) {
    let pw = part.width();
    for (sample, u, w) in slot.entries() {
        let row = &rows[u * e..(u + 1) * e];
        part.accumulate(row, w, &mut out[sample * pw..(sample + 1) * pw]);
        if let (Some(l), Some(sh)) = (part.deep.as_ref(), shares.as_deref_mut()) {
            sh.add(l, sample, field, &row[1..], w);
        }
    }
}

/// Sums the row gradients of field `field` from the partial sums' gradients
/// `dp: [B × width]` into `dunique` (`e` values per requested id), in sample
/// order; with a deep part, `shares` holds the first layer's input gradients
/// (after [`DeepShares::backward`]).
#[allow(clippy::too_many_arguments)]
pub fn slot_row_grads(
    part: FmPartial,
    field: usize,
    slot: &PartialSlot,
    rows: &[f32],
    e: usize,
    dp: &[f32],
    dunique: &mut [f32],
    shares: Option<&DeepShares<f32>>,
) {
    let pw = part.width();
    let mut drow = vec![0.0f32; e];
    for (sample, u, w) in slot.entries() {
        let row = &rows[u * e..(u + 1) * e];
        let dfactors = part.deep.as_ref().zip(shares).map(|(l, sh)| sh.dfactors(l, sample, field));
        part.row_grad_with(row, w, &dp[sample * pw..(sample + 1) * pw], dfactors, &mut drow);
        for (a, &g) in dunique[u * e..(u + 1) * e].iter_mut().zip(&drow) {
            *a += g;
        }
    }
}
