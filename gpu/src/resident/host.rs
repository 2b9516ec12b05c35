//! The host side of a device-resident step: a batch's global row numbers,
//! field-major bag offsets and entry weights, built in parallel over the
//! fields for large batches; and its behaviour sequences' row numbers as bags
//! of one step each, after the fields' entries.
//!
//! Invariants: every row number is below its table's size (checked here, so
//! the device never checks); the fields' offsets start at 0, never decrease
//! and end at the number of field entries (the batch is checked first); the
//! sequences' offsets continue from there to the number of all entries.

use crate::GpuError;
use tiderec_operators::Batch;

const OP: &str = "resident batch";

/// Entries from which the fields are filled on several threads.
const PARALLEL_ENTRIES: usize = 1 << 17;

/// Threads at most for one batch.
const MAX_THREADS: usize = 8;

/// What a batch's upload needs room for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    /// Ids over every field.
    pub(super) entries: usize,
    /// Some field has entry weights.
    pub(super) weighted: bool,
    /// Ids over every behaviour sequence.
    pub(super) seq_entries: usize,
    /// The longest sequence of the batch (every sequence field has the same lengths).
    pub(super) steps: usize,
}

/// Checks `batch` and says how large its upload is.
pub(super) fn layout(batch: &Batch) -> Result<Layout, GpuError> {
    batch.check().map_err(|e| GpuError::shape(OP, e.to_string()))?;
    let entries: usize = batch.sparse.iter().map(|s| s.ids.len()).sum();
    let seq_entries: usize = batch.sequences.iter().map(|s| s.ids.len()).sum();
    if entries + seq_entries > u32::MAX as usize {
        return Err(GpuError::shape(
            OP,
            format!("{entries} entries and {seq_entries} sequence steps in one batch exceed 32-bit offsets"),
        ));
    }
    let steps = batch.sequences.first().map_or(0, |s| (0..batch.len()).map(|i| s.bag(i).len()).max().unwrap_or(0));
    Ok(Layout { entries, weighted: batch.sparse.iter().any(|s| s.weights.is_some()), seq_entries, steps })
}

/// Where [`fill_sequences`] writes: the sequences' row numbers (`seq_entries`),
/// `steps · sequences · batch + 1` offsets, and each sample's sequence length.
pub(super) struct SeqOut<'a> {
    pub(super) rows: &'a mut [u32],
    pub(super) offsets: &'a mut [u32],
    pub(super) lengths: &'a mut [u32],
}

/// The behaviour sequences of `batch` (sequence `j` over table
/// `tables[j]`) as bags of one row or none, so the fields' pooling lays them
/// out as the models read them (`[batch × steps × sequences · dim]`, zeros
/// past a sample's length): bag `(t · S + j) · batch + i` holds step `t` of
/// sample `i`'s sequence `j` when `t` is below its length. The rows follow the
/// fields' `start` entries, in bag order; fails naming the sequence and the id
/// for an id outside its table. Writes `out` front to back only.
pub(super) fn fill_sequences(
    batch: &Batch,
    (tables, sizes, bases): (&[usize], &[u64], &[u64]),
    (start, steps): (usize, usize),
    out: SeqOut<'_>,
) -> Result<(), GpuError> {
    let (b, seqs) = (batch.len(), &batch.sequences);
    let Some(first) = seqs.first() else { return Ok(()) };
    if tables.len() != seqs.len() || out.offsets.len() != steps * seqs.len() * b + 1 || out.lengths.len() != b {
        return Err(GpuError::shape(
            OP,
            format!(
                "an upload of {} sequence offsets for {} sequences × {steps} steps × {b}",
                out.offsets.len(),
                seqs.len()
            ),
        ));
    }
    for (len, i) in out.lengths.iter_mut().zip(0..b) {
        *len = first.bag(i).len() as u32;
    }
    let mut at = start;
    out.offsets[0] = at as u32;
    let mut offsets = out.offsets[1..].iter_mut();
    for t in 0..steps {
        for (j, seq) in seqs.iter().enumerate() {
            let table = tables[j];
            let (&size, &base) = sizes.get(table).zip(bases.get(table)).ok_or_else(|| {
                GpuError::shape(OP, format!("sequence {j} reads table {table}, past the {} tables", sizes.len()))
            })?;
            for i in 0..b {
                let bag = seq.bag(i);
                if let Some(&id) = bag.get(t) {
                    if id >= size {
                        return Err(GpuError::Index {
                            op: OP,
                            message: format!("sequence {j}: id {id} is not below {size}"),
                        });
                    }
                    let slot = out
                        .rows
                        .get_mut(at - start)
                        .ok_or_else(|| GpuError::shape(OP, "too few sequence rows in the upload"))?;
                    *slot = (base + id) as u32;
                    at += 1;
                }
                *offsets.next().ok_or_else(|| GpuError::shape(OP, "too few sequence offsets"))? = at as u32;
            }
        }
    }
    if at - start != out.rows.len() {
        return Err(GpuError::shape(OP, format!("{} sequence rows for an upload of {}", at - start, out.rows.len())));
    }
    Ok(())
}

/// Where [`fill`] writes: `entries` row numbers, `fields · batch + 1` offsets,
/// and `entries` weights when the batch is weighted (else none).
pub(super) struct Out<'a> {
    pub(super) rows: &'a mut [u32],
    pub(super) offsets: &'a mut [u32],
    pub(super) weights: &'a mut [f32],
}

/// Global row numbers, field-major bag offsets and entry weights of `batch`
/// (checked by [`layout`], whose sizes `out` has; table `t`'s rows from
/// `bases[t]` on); fails naming the field and the id for an id outside its
/// table. Writes `out` front to back only (it may be write-combined memory).
pub(super) fn fill(batch: &Batch, sizes: &[u64], bases: &[u64], out: Out<'_>) -> Result<(), GpuError> {
    let (b, fields) = (batch.len(), &batch.sparse);
    let total = out.rows.len();
    if out.offsets.len() != fields.len() * b + 1 || sizes.len() < fields.len() || bases.len() < fields.len() {
        return Err(GpuError::shape(
            OP,
            format!("an upload of {} offsets for {} fields × {b}", out.offsets.len(), fields.len()),
        ));
    }
    out.offsets[0] = 0;
    // Each field's segments of `rows` and of `offsets[1..]`, and where its entries start.
    let mut jobs = Vec::with_capacity(fields.len());
    let (mut rows, mut offsets, mut start) = (out.rows, &mut out.offsets[1..], 0u32);
    for (t, field) in fields.iter().enumerate() {
        if field.ids.len() > rows.len() {
            return Err(GpuError::shape(OP, format!("an upload of {total} entries for more")));
        }
        let (r, rest) = rows.split_at_mut(field.ids.len());
        let (o, more) = offsets.split_at_mut(b);
        jobs.push(Field {
            t,
            ids: &field.ids,
            bags: &field.offsets[1..],
            base: bases[t],
            size: sizes[t],
            start,
            rows: r,
            offsets: o,
        });
        start += field.ids.len() as u32;
        (rows, offsets) = (rest, more);
    }
    let threads = if total < PARALLEL_ENTRIES {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, MAX_THREADS).min(jobs.len())
    };
    if threads <= 1 {
        jobs.iter_mut().try_for_each(Field::fill)?;
    } else {
        let per = jobs.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let handles: Vec<_> = jobs
                .chunks_mut(per)
                .map(|group| scope.spawn(move || group.iter_mut().try_for_each(Field::fill)))
                .collect();
            handles.into_iter().try_for_each(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        })?;
    }
    if !out.weights.is_empty() {
        let mut at = 0;
        for field in fields {
            let n = field.ids.len();
            let dst =
                out.weights.get_mut(at..at + n).ok_or_else(|| GpuError::shape(OP, "too few weights in the upload"))?;
            match &field.weights {
                Some(w) => dst.copy_from_slice(w),
                None => dst.fill(1.0),
            }
            at += n;
        }
    }
    Ok(())
}

/// One field's share of [`fill`].
struct Field<'a> {
    t: usize,
    ids: &'a [u64],
    /// The field's offsets after the first (which is 0).
    bags: &'a [u32],
    base: u64,
    size: u64,
    /// Entries of the fields before this one.
    start: u32,
    rows: &'a mut [u32],
    offsets: &'a mut [u32],
}

impl Field<'_> {
    fn fill(&mut self) -> Result<(), GpuError> {
        // One pass converts and finds the largest id; a batch with an id past
        // its table is refused after it (its rows are never uploaded).
        let (base, mut largest) = (self.base, 0u64);
        for (r, &id) in self.rows.iter_mut().zip(self.ids) {
            largest = largest.max(id);
            *r = base.wrapping_add(id) as u32;
        }
        if !self.ids.is_empty() && largest >= self.size {
            let id = self.ids.iter().copied().find(|&id| id >= self.size).unwrap_or_default();
            let (t, n) = (self.t, self.size);
            return Err(GpuError::Index { op: OP, message: format!("field {t}: id {id} is not below {n}") });
        }
        let start = self.start;
        for (o, &x) in self.offsets.iter_mut().zip(self.bags) {
            *o = start + x;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two fields over tables of 5 and 3 rows (bases 0 and 5): field 0 with an
    /// empty bag, field 1 mean-pooled.
    fn small() -> Batch {
        let mut b = Batch::new(0, 2);
        for (ids0, ids1) in [(&[4u64, 0][..], &[2u64][..]), (&[], &[0, 1, 2]), (&[3], &[])] {
            b.labels.push(0.0);
            b.sparse[0].ids.extend_from_slice(ids0);
            b.sparse[0].close_bag();
            b.sparse[1].ids.extend_from_slice(ids1);
            b.sparse[1].close_bag_mean();
        }
        b
    }

    /// A batch's upload: rows, offsets, weights and whether it is weighted.
    type Upload = (Vec<u32>, Vec<u32>, Vec<f32>, bool);

    /// The upload of `b`.
    fn filled(b: &Batch, sizes: &[u64], bases: &[u64]) -> Result<Upload, GpuError> {
        let Layout { entries, weighted, .. } = layout(b)?;
        let mut rows = vec![0; entries];
        let mut offsets = vec![0; b.sparse.len() * b.len() + 1];
        let mut weights = vec![0.0; if weighted { entries } else { 0 }];
        fill(b, sizes, bases, Out { rows: &mut rows, offsets: &mut offsets, weights: &mut weights })?;
        Ok((rows, offsets, weights, weighted))
    }

    #[test]
    fn rows_offsets_and_weights_are_field_major() {
        let (rows, offsets, weights, weighted) = filled(&small(), &[5, 3], &[0, 5]).unwrap();
        assert_eq!(rows, [4, 0, 3, 7, 5, 6, 7]);
        assert_eq!(offsets, [0, 2, 2, 3, 4, 7, 7]);
        assert!(weighted);
        assert_eq!(weights, [1.0, 1.0, 1.0, 1.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0]);
    }

    /// Three samples over two tables of 5 and 3 rows (bases 0 and 5): one
    /// field, and two sequences (over tables 1 and 0) of lengths 2, 0 and 3.
    fn with_sequences() -> Batch {
        let mut b = Batch::new(0, 1);
        b.sequences = vec![tiderec_operators::SparseField::new(), tiderec_operators::SparseField::new()];
        for (i, len) in [2usize, 0, 3].into_iter().enumerate() {
            b.labels.push(0.0);
            b.sparse[0].ids.push(i as u64);
            b.sparse[0].close_bag();
            for t in 0..len {
                b.sequences[0].ids.push(((i + t) % 3) as u64);
                b.sequences[1].ids.push((4 - t) as u64);
            }
            b.sequences[0].close_bag();
            b.sequences[1].close_bag();
        }
        b
    }

    /// A sequences' upload: rows, offsets, lengths.
    type SeqUpload = (Vec<u32>, Vec<u32>, Vec<u32>);

    /// The sequences' upload of `b` after `start` field entries.
    fn sequences_of(b: &Batch, start: usize) -> Result<SeqUpload, GpuError> {
        let Layout { seq_entries, steps, .. } = layout(b)?;
        let (mut rows, mut offsets, mut lengths) =
            (vec![0; seq_entries], vec![0; steps * b.sequences.len() * b.len() + 1], vec![0; b.len()]);
        let out = SeqOut { rows: &mut rows, offsets: &mut offsets, lengths: &mut lengths };
        fill_sequences(b, (&[1, 0], &[5, 3], &[0, 5]), (start, steps), out)?;
        Ok((rows, offsets, lengths))
    }

    #[test]
    fn sequence_steps_are_bags_of_one_row_by_step_then_sequence_then_sample() {
        let b = with_sequences();
        assert_eq!(layout(&b).unwrap(), Layout { entries: 3, weighted: false, seq_entries: 10, steps: 3 });
        let (rows, offsets, lengths) = sequences_of(&b, 3).unwrap();
        assert_eq!(lengths, [2, 0, 3]);
        // Bag (t · 2 + j) · 3 + i: sequence 0 over table 1 (base 5), sequence 1 over table 0.
        // t = 0: seq 0 of samples 0, 2 -> ids 0, 2; seq 1 -> ids 4, 4. t = 1: ids 1, 0 and 3, 3.
        // t = 2: sample 2 only: id 1 and 2.
        assert_eq!(rows, [5, 7, 4, 4, 6, 5, 3, 3, 6, 2]);
        assert_eq!(offsets, [3, 4, 4, 5, 6, 6, 7, 8, 8, 9, 10, 10, 11, 11, 11, 12, 12, 12, 13]);
        // The models' layout: pooling bag (f', i) lands at (i · 6 + f') · dim = ((i · 3 + t) · 2 + j) · dim.
        let (t, j, i) = (1, 1, 2);
        let bag = (t * 2 + j) * 3 + i;
        assert_eq!(rows[(offsets[bag] - 3) as usize], 3, "step 1 of sample 2's sequence 1 is id 3 of table 0");
    }

    #[test]
    fn a_sequence_id_outside_its_table_names_the_sequence_and_the_id() {
        let mut b = with_sequences();
        b.sequences[0].ids[3] = 3;
        let e = sequences_of(&b, 3).unwrap_err().to_string();
        assert!(e.contains("sequence 0") && e.contains("id 3") && e.contains("below 3"), "{e}");
    }

    #[test]
    fn an_id_outside_its_table_names_the_field_and_the_id() {
        let mut b = small();
        b.sparse[1].ids[2] = 3;
        let e = filled(&b, &[5, 3], &[0, 5]).unwrap_err().to_string();
        assert!(e.contains("field 1") && e.contains("id 3") && e.contains("below 3"), "{e}");
    }

    #[test]
    fn a_large_batch_filled_on_threads_equals_the_serial_definition() {
        let (n, sizes) = (20_000usize, [1000u64, 7, 50_000, 3, 1 << 20, 9, 11, 13, 17]);
        let mut b = Batch::new(0, sizes.len());
        for i in 0..n as u64 {
            b.labels.push(0.0);
            for (t, f) in b.sparse.iter_mut().enumerate() {
                for j in 0..(i + t as u64) % 3 {
                    f.ids.push(tiderec_operators::features::mix64(i * 31 + j + t as u64) % sizes[t]);
                }
                f.close_bag();
            }
        }
        let entries: usize = b.sparse.iter().map(|f| f.ids.len()).sum();
        assert!(entries >= PARALLEL_ENTRIES, "{entries} entries stay on one thread");
        let bases: Vec<u64> = sizes.iter().scan(0, |at, &s| Some(std::mem::replace(at, *at + s))).collect();
        let (got_rows, got_offsets, _, weighted) = filled(&b, &sizes, &bases).unwrap();
        let (mut rows, mut offsets) = (Vec::new(), vec![0u32]);
        for (t, f) in b.sparse.iter().enumerate() {
            let start = rows.len() as u32;
            rows.extend(f.ids.iter().map(|&id| (bases[t] + id) as u32));
            offsets.extend(f.offsets[1..].iter().map(|&o| start + o));
        }
        assert_eq!((got_rows, got_offsets, weighted), (rows, offsets, false));
    }
}
