//! The host side of a device-resident step: a batch's global row numbers,
//! field-major bag offsets and entry weights, built in parallel over the
//! fields for large batches.
//!
//! Invariants: every row number is below its table's size (checked here, so
//! the device never checks); the offsets start at 0, never decrease and end at
//! the number of entries (the batch is checked first).

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
}

/// Checks `batch` and says how large its upload is.
pub(super) fn layout(batch: &Batch) -> Result<Layout, GpuError> {
    batch.check().map_err(|e| GpuError::shape(OP, e.to_string()))?;
    let entries: usize = batch.sparse.iter().map(|s| s.ids.len()).sum();
    if entries > u32::MAX as usize {
        return Err(GpuError::shape(OP, format!("{entries} entries in one batch exceed 32-bit offsets")));
    }
    Ok(Layout { entries, weighted: batch.sparse.iter().any(|s| s.weights.is_some()) })
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
        let Layout { entries, weighted } = layout(b)?;
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
