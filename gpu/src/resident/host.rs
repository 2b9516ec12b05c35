//! The host side of a device-resident step: a batch's global row numbers,
//! field-major bag offsets and entry weights, built in parallel over the
//! fields for large batches.
//!
//! Invariants: every row number is below its table's size (checked here, so
//! the device never checks); the offsets start at 0, never decrease and end at
//! the number of entries (the batch is checked first).

use crate::GpuError;
use tiderec_operators::Batch;

/// Entries from which the fields are filled on several threads.
const PARALLEL_ENTRIES: usize = 1 << 17;

/// Threads at most for one batch.
const MAX_THREADS: usize = 8;

/// The host side of a batch's upload, reused from step to step.
#[derive(Default)]
pub(super) struct HostBatch {
    pub(super) rows: Vec<u32>,
    pub(super) offsets: Vec<u32>,
    pub(super) weights: Vec<f32>,
    pub(super) weighted: bool,
}

impl HostBatch {
    /// Global row numbers, field-major bag offsets and entry weights of `batch`
    /// (table `t`'s rows from `bases[t]` on); fails naming the field and the id
    /// for an id outside its table.
    pub(super) fn fill(&mut self, batch: &Batch, sizes: &[u64], bases: &[u64]) -> Result<(), GpuError> {
        const OP: &str = "resident batch";
        batch.check().map_err(|e| GpuError::shape(OP, e.to_string()))?;
        let (b, fields) = (batch.len(), &batch.sparse);
        let total: usize = fields.iter().map(|s| s.ids.len()).sum();
        if total > u32::MAX as usize {
            return Err(GpuError::shape(OP, format!("{total} entries in one batch exceed 32-bit offsets")));
        }
        self.rows.resize(total, 0);
        self.offsets.resize(fields.len() * b + 1, 0);
        self.offsets[0] = 0;
        // Each field's segments of `rows` and of `offsets[1..]`, and where its entries start.
        let mut jobs = Vec::with_capacity(fields.len());
        let (mut rows, mut offsets, mut start) = (&mut self.rows[..], &mut self.offsets[1..], 0u32);
        for (t, field) in fields.iter().enumerate() {
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
        self.weighted = fields.iter().any(|s| s.weights.is_some());
        self.weights.clear();
        if self.weighted {
            for field in fields {
                match &field.weights {
                    Some(w) => self.weights.extend_from_slice(w),
                    None => self.weights.resize(self.weights.len() + field.ids.len(), 1.0),
                }
            }
        }
        Ok(())
    }
}

/// One field's share of [`HostBatch::fill`].
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
        if self.ids.iter().copied().max().is_some_and(|m| m >= self.size) {
            let id = self.ids.iter().copied().find(|&id| id >= self.size).unwrap_or_default();
            let (t, n) = (self.t, self.size);
            return Err(GpuError::Index {
                op: "resident batch",
                message: format!("field {t}: id {id} is not below {n}"),
            });
        }
        let base = self.base;
        for (r, &id) in self.rows.iter_mut().zip(self.ids) {
            *r = (base + id) as u32;
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

    #[test]
    fn rows_offsets_and_weights_are_field_major() {
        let mut h = HostBatch::default();
        h.fill(&small(), &[5, 3], &[0, 5]).unwrap();
        assert_eq!(h.rows, [4, 0, 3, 7, 5, 6, 7]);
        assert_eq!(h.offsets, [0, 2, 2, 3, 4, 7, 7]);
        assert!(h.weighted);
        assert_eq!(h.weights, [1.0, 1.0, 1.0, 1.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0]);
    }

    #[test]
    fn an_id_outside_its_table_names_the_field_and_the_id() {
        let mut b = small();
        b.sparse[1].ids[2] = 3;
        let e = HostBatch::default().fill(&b, &[5, 3], &[0, 5]).unwrap_err().to_string();
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
        let mut h = HostBatch::default();
        h.fill(&b, &sizes, &bases).unwrap();
        let (mut rows, mut offsets) = (Vec::new(), vec![0u32]);
        for (t, f) in b.sparse.iter().enumerate() {
            let start = rows.len() as u32;
            rows.extend(f.ids.iter().map(|&id| (bases[t] + id) as u32));
            offsets.extend(f.offsets[1..].iter().map(|&o| start + o));
        }
        assert_eq!((h.rows, h.offsets, h.weighted), (rows, offsets, false));
    }
}
