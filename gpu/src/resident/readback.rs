//! Reading a device-resident worker's state back to the host: the rows its
//! training steps updated since the last read, or the rows asked for,
//! gathered on the device so that only they cross PCIe.
//!
//! ## Invariants
//!
//! * **Every updated row is marked.** Each training step sets, on the device,
//!   one bit per global row for every entry its row update reads (`mark_rows`,
//!   after the update, in the step's launches and so in its CUDA graph); a
//!   step skipped after a non-finite loss marks rows it left unchanged, which
//!   a read then repeats. The bits are cleared by a read of them
//!   ([`ResidentWorker::snapshot_trained`]) and by a load.
//! * **A step pays one small kernel for it.** The host notes nothing per step.
//! * **Bit for bit.** A row and its optimizer state come back as the device
//!   holds them (`crate::row_copy` copies, it computes nothing), so a part read
//!   here lists, for each row it names, the values of the whole snapshot.
//! * **Checked on the host.** Every id is checked against its table before a
//!   row number reaches the device.
//! * **Bounded.** Rows are gathered a bounded number at a time
//!   (`crate::row_copy::read_rows`) into buffers kept for the next read.

use super::ResidentWorker;
use crate::Device;
use crate::{check, GpuError};
use cudarc::driver::{CudaSlice, PushKernelArg};
use tiderec_operators::optim::SparseOptimizerKind;
use tiderec_operators::snapshot::{TableRows, WorkerSnapshot};

/// The `u32` words of a bit set of `rows` rows.
pub(super) fn trained_words(rows: usize) -> usize {
    rows.div_ceil(32)
}

impl ResidentWorker {
    /// This worker's state as a one-worker checkpoint part listing the rows
    /// training steps updated since the last call or load, as
    /// [`snapshot_rows`](Self::snapshot_rows) gives them (ids ascending); the
    /// marks are cleared. Waits for the device.
    pub fn snapshot_trained(&mut self) -> Result<WorkerSnapshot, GpuError> {
        let words = self.dev.download(&self.d_trained, self.d_trained.len())?;
        let rows = table_ids(&self.bases, &self.table_sizes, &words);
        let part = self.snapshot_rows(&rows)?;
        self.forget_trained()?;
        Ok(part)
    }

    /// Clears the marks of the rows trained (after a read, or a load).
    pub(super) fn forget_trained(&mut self) -> Result<(), GpuError> {
        self.dev.stream.memset_zeros(&mut self.d_trained).map_err(GpuError::driver("clearing the rows trained"))
    }

    /// This worker's state as a one-worker checkpoint part listing only the
    /// rows of `rows` (per table, ids ascending, each below its table's size),
    /// as updated rows (`updated_only`): each with its values and optimizer
    /// state as [`snapshot`](Self::snapshot) gives them, gathered on the device
    /// so that only these rows are copied; the dense parameters and optimizer
    /// state and the training steps whole. What a host mirror reads after some steps: the rows those
    /// steps trained.
    pub fn snapshot_rows(&mut self, rows: &[Vec<u64>]) -> Result<WorkerSnapshot, GpuError> {
        const OP: &str = "resident snapshot_rows";
        if rows.len() != self.table_sizes.len() {
            let tables = self.table_sizes.len();
            return Err(GpuError::shape(OP, format!("rows of {} tables asked from {tables}", rows.len())));
        }
        let mut tables = Vec::with_capacity(rows.len());
        for (t, ids) in rows.iter().enumerate() {
            let numbers = self.row_numbers(t, ids)?;
            let (values, mut state) = self.gather(&numbers)?;
            if self.sparse.0 == SparseOptimizerKind::Sgd {
                state.clear();
            }
            tables.push(TableRows { ids: ids.clone(), rows: values, state, ..TableRows::default() });
        }
        self.part(tables, true)
    }

    /// The global row numbers of table `t`'s `ids`, each checked against the table.
    fn row_numbers(&self, t: usize, ids: &[u64]) -> Result<Vec<u32>, GpuError> {
        let (size, base) = (self.table_sizes[t], self.bases[t]);
        ids.iter()
            .map(|&id| match id < size {
                // The whole row space fits in `u32` (`supports` checks).
                true => Ok((base + id) as u32),
                false => Err(GpuError::Index {
                    op: "resident snapshot_rows",
                    message: format!("table {t}: id {id} is not below {size}"),
                }),
            })
            .collect()
    }

    /// The rows (`numbers.len() × dim`) and optimizer states (one per row) of
    /// the global row numbers `numbers`, in their order.
    fn gather(&mut self, numbers: &[u32]) -> Result<(Vec<f32>, Vec<f32>), GpuError> {
        crate::row_copy::read_rows(&self.dev, &self.rows, numbers, &mut self.read_scratch)
    }
}

/// Per table (table `t` holds the global rows from `bases[t]`, `sizes[t]` of
/// them, in table order), the ids whose global rows `words` marks, ascending.
fn table_ids(bases: &[u64], sizes: &[u64], words: &[u32]) -> Vec<Vec<u64>> {
    let mut ids: Vec<Vec<u64>> = vec![Vec::new(); sizes.len()];
    let mut t = 0;
    for (k, &word) in words.iter().enumerate() {
        let mut set = word;
        while set != 0 {
            let row = k as u64 * 32 + u64::from(set.trailing_zeros());
            set &= set - 1;
            // The rows come in order: move on to the table that holds this one.
            while t + 1 < bases.len() && row >= bases[t + 1] {
                t += 1;
            }
            if t < sizes.len() && row >= bases[t] && row < bases[t] + sizes[t] {
                ids[t].push(row - bases[t]);
            }
        }
    }
    ids
}

/// Sets the bit of each of the first `n` global row numbers of `rows_of` in `bits`.
pub(super) fn mark_rows(
    dev: &Device,
    rows_of: &CudaSlice<u32>,
    n: usize,
    bits: &mut CudaSlice<u32>,
) -> Result<(), GpuError> {
    if n == 0 {
        return Ok(());
    }
    check::len("mark_rows", "rows_of", rows_of, n, || format!("{n} entries"))?;
    let n64 = n as u64;
    let mut launch = dev.stream.launch_builder(dev.function("mark_rows"));
    launch.arg(rows_of).arg(&n64).arg(bits);
    // SAFETY: `rows_of` holds n row numbers (checked above), each a global row
    // (checked by the host as it built them), and `bits` one bit per global row.
    unsafe { launch.launch(check::grid_for(n.min(1 << 22))) }.map_err(GpuError::driver("launching mark_rows"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_rows_go_back_to_their_tables_in_order() {
        // Tables of 30, 0, 5 and 40 rows: global rows 0–29, none, 30–34, 35–74.
        let (bases, sizes) = ([0, 30, 30, 35], [30, 0, 5, 40]);
        let mut words = vec![0u32; trained_words(75)];
        for row in [0u32, 29, 30, 34, 35, 63, 64, 74] {
            words[(row / 32) as usize] |= 1 << (row % 32);
        }
        let ids = table_ids(&bases, &sizes, &words);
        assert_eq!(ids, vec![vec![0, 29], vec![], vec![0, 4], vec![0, 28, 29, 39]]);
        assert_eq!(table_ids(&bases, &sizes, &[0; 3]), vec![Vec::<u64>::new(); 4]);
    }
}
