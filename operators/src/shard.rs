//! Row ownership and the per-worker embedding shard.
//!
//! [`shard_of`] (defined in [`crate::routing`], re-exported here) is the one
//! routing function: lookups, gradients, checkpoint writes and restores all
//! use it. Row `id` of table `t` lives on worker `(id + t) mod W` at local
//! index `id / W`; within one owner those local indices are distinct, so a
//! shard stores its rows densely with no hashing.
//! Rows are initialised from `(seed, table, id)` alone, so the initial model
//! is the same for every worker count.

use crate::huge::{prefetch_lines, HugeTables};
use crate::optim::{apply_row, apply_row_finite, OptimizerParams, SparseOptimizerKind};
use crate::rng::row_uniform;
use crate::snapshot::TableRows;
use crate::OperatorError;

pub use crate::routing::shard_of;

/// Refuses a place among the workers or a row width no store can hold: no workers,
/// a worker index not below the worker count, or rows 0 wide. Errors name the key
/// (`workers`, `worker`, `dim`).
pub fn check_placement(worker: usize, workers: usize, dim: usize) -> Result<(), OperatorError> {
    if workers == 0 {
        return Err(OperatorError::config("workers", "rows are sharded over at least 1 worker, got 0"));
    }
    if worker >= workers {
        return Err(OperatorError::config("worker", format!("worker {worker} is not below the {workers} workers")));
    }
    if dim == 0 {
        return Err(OperatorError::config("dim", "embedding rows are at least 1 wide, got 0"));
    }
    Ok(())
}

/// The rows of every table that one worker owns, with their optimizer state.
#[derive(Debug)]
pub struct EmbeddingShard {
    /// This worker.
    pub worker: usize,
    /// Number of workers.
    pub workers: usize,
    /// Row width.
    pub dim: usize,
    /// Logical rows per table.
    pub table_sizes: Vec<u64>,
    /// Per table, `dim` values per local row.
    rows: HugeTables,
    /// Per table, `state_width` optimizer values per local row (huge pages too:
    /// an update reads and writes its row's state at a random place, as the row).
    state: HugeTables,
    state_width: usize,
    optimizer: SparseOptimizerKind,
    hp: OptimizerParams,
    /// Seed of the row initialisation.
    seed: u64,
    /// Optimizer state of a row never updated.
    initial_state: Vec<f32>,
}

impl EmbeddingShard {
    /// Allocates and initialises this worker's rows: `U(−1/√n, 1/√n)` for a table of `n` rows
    /// (the DLRM reference initialisation).
    ///
    /// All tables' rows share one huge-page map, and all their optimizer states another
    /// (the crate-private `HugeTables`, each starting on a 2 MiB boundary).
    ///
    /// Errors: [`OperatorError::Config`] when `workers` is 0, `worker` is not below it or
    /// `dim` is 0 ([`check_placement`]); [`OperatorError::Memory`] naming the table when its
    /// rows or optimizer state do not fit in the address space, or naming the rows or the
    /// state when the system cannot allocate them.
    pub fn new(
        worker: usize,
        workers: usize,
        dim: usize,
        table_sizes: &[u64],
        seed: u64,
        optimizer: SparseOptimizerKind,
        hp: OptimizerParams,
    ) -> Result<Self, OperatorError> {
        check_placement(worker, workers, dim)?;
        let state_width = optimizer.state_width(dim);
        let (mut row_lens, mut state_lens) = (Vec::new(), Vec::new());
        for (t, &n) in table_sizes.iter().enumerate() {
            let too_big = |what: &str| {
                OperatorError::memory(
                    format!("embedding table {t}"),
                    format!(
                        "{n} rows, {} on this worker, × {what} do not fit in this machine's address space",
                        n.div_ceil(workers as u64)
                    ),
                )
            };
            let local = usize::try_from(n.div_ceil(workers as u64)).map_err(|_| too_big("rows"))?;
            row_lens.push(local.checked_mul(dim).ok_or_else(|| too_big(&format!("dim {dim}")))?);
            state_lens.push(
                local
                    .checked_mul(state_width)
                    .ok_or_else(|| too_big(&format!("optimizer state width {state_width}")))?,
            );
        }
        let mut rows = HugeTables::zeroed(&row_lens, "embedding tables")?;
        let mut state = HugeTables::zeroed(&state_lens, "optimizer state of the embedding tables")?;
        for (t, &n) in table_sizes.iter().enumerate() {
            let bound = crate::rng::init_bound(n);
            for (l, row) in rows.table_mut(t).chunks_exact_mut(dim).enumerate() {
                let id = Self::id_of(t, l, worker, workers);
                if id < n {
                    for (c, v) in row.iter_mut().enumerate() {
                        *v = row_uniform(seed, t, id, c, bound);
                    }
                }
            }
            for row_state in state.table_mut(t).chunks_exact_mut(state_width.max(1)) {
                optimizer.init_state(&hp, row_state);
            }
        }
        let mut initial_state = vec![0.0; state_width];
        if state_width > 0 {
            optimizer.init_state(&hp, &mut initial_state);
        }
        Ok(EmbeddingShard {
            worker,
            workers,
            dim,
            table_sizes: table_sizes.to_vec(),
            rows,
            state,
            state_width,
            optimizer,
            hp,
            seed,
            initial_state,
        })
    }

    /// The global id stored at local index `local` of `table` on `worker` of
    /// `workers` (the inverse of `shard_of` and the local index `id / workers`).
    ///
    /// # Panics
    /// When `workers` is 0 (a division by zero), as [`shard_of`].
    pub fn id_of(table: usize, local: usize, worker: usize, workers: usize) -> u64 {
        let w = workers as u64;
        let residue = (worker as u64 + w - table as u64 % w) % w;
        local as u64 * w + residue
    }

    #[inline]
    fn local(&self, table: usize, id: u64) -> usize {
        debug_assert_eq!(shard_of(table, id, self.workers), self.worker, "row routed to the wrong owner");
        (id / self.workers as u64) as usize
    }

    /// The row of `id` in `table`; `id` must be owned here and below the table size.
    #[inline]
    pub fn row(&self, table: usize, id: u64) -> &[f32] {
        let l = self.local(table, id);
        &self.rows.table(table)[l * self.dim..(l + 1) * self.dim]
    }

    /// Rows prefetched ahead of the one being copied or updated. Rows sit at
    /// random places in tables far larger than the caches, and the work per
    /// row (a 64-byte copy, a row-wise Adagrad update) is a few dozen cycles
    /// against a few hundred for a miss: 16 rows ahead took the row updates
    /// from 3.8% to 2.2% of a DLRM step at batch 2,048 (8 ahead before; 32 no
    /// better than 16).
    pub const PREFETCH_AHEAD: usize = 16;

    /// Appends the rows of `ids` to `out`, prefetching a few rows ahead.
    pub fn gather(&self, table: usize, ids: &[u64], out: &mut Vec<f32>) {
        let d = self.dim;
        let rows = self.rows.table(table);
        let w = self.workers as u64;
        out.reserve(ids.len() * d);
        for (k, &id) in ids.iter().enumerate() {
            if let Some(&ahead) = ids.get(k + Self::PREFETCH_AHEAD) {
                let l = (ahead / w) as usize * d;
                if let Some(row) = rows.get(l..l + d) {
                    prefetch_lines(row);
                }
            }
            let l = (id / w) as usize;
            out.extend_from_slice(&rows[l * d..(l + 1) * d]);
        }
    }

    /// Hints that row `id` of `table` (and its optimizer state) will be updated soon.
    #[inline]
    pub fn prefetch_row(&self, table: usize, id: u64) {
        let local = (id / self.workers as u64) as usize;
        if let Some(r) = self.rows.table(table).get(local * self.dim..(local + 1) * self.dim) {
            prefetch_lines(r);
        }
        if let Some(a) = self.state.table(table).get(local * self.state_width..(local + 1) * self.state_width) {
            prefetch_lines(a);
        }
    }

    /// Local row index of `id` (dense per table), for per-row scratch arrays.
    #[inline]
    pub fn local_index(&self, table: usize, id: u64) -> usize {
        self.local(table, id)
    }

    /// Local rows of `table` held here (the length of a per-row scratch array).
    pub fn local_len(&self, table: usize) -> usize {
        self.rows.table(table).len() / self.dim.max(1)
    }

    /// Sets the row optimizer's learning rate for the next updates.
    pub fn set_lr(&mut self, lr: f32) {
        self.hp.lr = lr;
    }

    /// Applies the averaged gradient `grad` to row `id` of `table`.
    #[inline]
    pub fn apply(&mut self, table: usize, id: u64, grad: &[f32]) {
        let (optimizer, hp) = (self.optimizer, self.hp);
        let (row, state) = self.row_and_state(table, id);
        apply_row(optimizer, &hp, row, grad, state);
    }

    /// [`apply`](Self::apply), and whether the updated row and its optimizer state are
    /// all finite (checked while they are in L1; the values written are `apply`'s).
    #[inline]
    pub fn apply_finite(&mut self, table: usize, id: u64, grad: &[f32]) -> bool {
        let (optimizer, hp) = (self.optimizer, self.hp);
        let (row, state) = self.row_and_state(table, id);
        apply_row_finite(optimizer, &hp, row, grad, state)
    }

    /// The row of `id` and its optimizer state, for an update.
    #[inline]
    fn row_and_state(&mut self, table: usize, id: u64) -> (&mut [f32], &mut [f32]) {
        let l = self.local(table, id);
        let (d, w) = (self.dim, self.state_width);
        let row = &mut self.rows.table_mut(table)[l * d..(l + 1) * d];
        let state = &mut self.state.table_mut(table)[l * w..(l + 1) * w];
        (row, state)
    }

    /// Σ of squares of every row this worker owns, in f64.
    pub fn sum_of_squares(&self) -> f64 {
        let mut s = 0.0f64;
        for (t, table) in self.rows.tables().enumerate() {
            for (l, row) in table.chunks_exact(self.dim).enumerate() {
                if Self::id_of(t, l, self.worker, self.workers) < self.table_sizes[t] {
                    s += row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>();
                }
            }
        }
        s
    }

    /// Number of rows (over all tables) held here.
    pub fn num_rows(&self) -> usize {
        self.rows.tables().map(|r| r.len() / self.dim.max(1)).sum()
    }

    /// Optimizer state values per row.
    pub fn state_width(&self) -> usize {
        self.state_width
    }

    /// The optimizer of the rows.
    pub fn optimizer(&self) -> SparseOptimizerKind {
        self.optimizer
    }

    /// Every row of `table` this worker owns (ids below the table size, in
    /// increasing order), with its optimizer state: a checkpoint's share of the table.
    pub fn export_table(&self, table: usize) -> TableRows {
        let (d, w, n) = (self.dim, self.state_width, self.table_sizes[table]);
        let local = self.local_len(table);
        let mut out = TableRows::default();
        for l in 0..local {
            let id = Self::id_of(table, l, self.worker, self.workers);
            if id >= n {
                break; // ids grow with the local index
            }
            out.ids.push(id);
            out.rows.extend_from_slice(&self.rows.table(table)[l * d..(l + 1) * d]);
            out.state.extend_from_slice(&self.state.table(table)[l * w..(l + 1) * w]);
        }
        out
    }

    /// Sets row `id` of `table` (owned here, below the table size) back to its
    /// seeded initial values and fresh optimizer state.
    pub fn reinit_row(&mut self, table: usize, id: u64) {
        let (d, w) = (self.dim, self.state_width);
        let l = self.local(table, id);
        let bound = crate::rng::init_bound(self.table_sizes[table]);
        crate::rng::init_row(self.seed, table, id, bound, &mut self.rows.table_mut(table)[l * d..(l + 1) * d]);
        self.state.table_mut(table)[l * w..(l + 1) * w].copy_from_slice(&self.initial_state);
    }

    /// The global id stored at local index `local` of `table` here.
    pub fn id_at(&self, table: usize, local: usize) -> u64 {
        Self::id_of(table, local, self.worker, self.workers)
    }

    /// Row `id` of `table` (owned here) with its optimizer state appended to `out`.
    pub fn push_row(&self, table: usize, id: u64, out: &mut TableRows) {
        let (d, w) = (self.dim, self.state_width);
        let l = self.local(table, id);
        out.ids.push(id);
        out.rows.extend_from_slice(&self.rows.table(table)[l * d..(l + 1) * d]);
        out.state.extend_from_slice(&self.state.table(table)[l * w..(l + 1) * w]);
    }

    /// Overwrites row `id` of `table` and its optimizer state (restoring a
    /// checkpoint). The row must be owned here and the widths must match.
    pub fn set_row(&mut self, table: usize, id: u64, row: &[f32], state: &[f32]) -> Result<(), OperatorError> {
        let (d, w) = (self.dim, self.state_width);
        crate::snapshot::check_row((self.worker, self.workers, d, w), &self.table_sizes, table, id, row, state)?;
        let l = (id / self.workers as u64) as usize;
        self.rows.table_mut(table)[l * d..(l + 1) * d].copy_from_slice(row);
        self.state.table_mut(table)[l * w..(l + 1) * w].copy_from_slice(state);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rows_do_not_depend_on_worker_count() {
        let sizes = [7u64, 1, 12];
        let hp = OptimizerParams::with_lr(0.1);
        let one = EmbeddingShard::new(0, 1, 3, &sizes, 5, SparseOptimizerKind::Sgd, hp).unwrap();
        for w in 2..5 {
            let shards: Vec<_> = (0..w)
                .map(|k| EmbeddingShard::new(k, w, 3, &sizes, 5, SparseOptimizerKind::Sgd, hp).unwrap())
                .collect();
            for (t, &n) in sizes.iter().enumerate() {
                for id in 0..n {
                    assert_eq!(shards[shard_of(t, id, w)].row(t, id), one.row(t, id));
                }
            }
            let total: f64 = shards.iter().map(|s| s.sum_of_squares()).sum();
            assert!((total - one.sum_of_squares()).abs() < 1e-9);
        }
    }

    #[test]
    fn export_and_set_row_round_trip_across_worker_counts() {
        let sizes = [7u64, 1, 12];
        let hp = OptimizerParams::with_lr(0.1);
        let kind = SparseOptimizerKind::LazyAdam;
        let mut two: Vec<_> = (0..2).map(|k| EmbeddingShard::new(k, 2, 3, &sizes, 5, kind, hp).unwrap()).collect();
        // Make every row and slot distinct: one update per row.
        for (t, &n) in sizes.iter().enumerate() {
            for id in 0..n {
                let g = [id as f32 * 0.1 + 0.01, -(t as f32) - 0.5, 0.25];
                two[shard_of(t, id, 2)].apply(t, id, &g);
            }
        }
        for w in [1usize, 2, 3] {
            let mut target: Vec<_> =
                (0..w).map(|k| EmbeddingShard::new(k, w, 3, &sizes, 99, kind, hp).unwrap()).collect();
            for src in &two {
                for t in 0..sizes.len() {
                    let part = src.export_table(t);
                    let sw = src.state_width();
                    for (i, &id) in part.ids.iter().enumerate() {
                        let dst = &mut target[shard_of(t, id, w)];
                        dst.set_row(t, id, &part.rows[i * 3..(i + 1) * 3], &part.state[i * sw..(i + 1) * sw]).unwrap();
                    }
                }
            }
            for (t, &n) in sizes.iter().enumerate() {
                let mut seen = 0;
                for shard in &target {
                    let part = shard.export_table(t);
                    assert!(part.ids.windows(2).all(|p| p[0] < p[1]));
                    for (i, &id) in part.ids.iter().enumerate() {
                        let src = two[shard_of(t, id, 2)].export_table(t);
                        let j = src.ids.iter().position(|&x| x == id).unwrap();
                        assert_eq!(&part.rows[i * 3..(i + 1) * 3], &src.rows[j * 3..(j + 1) * 3]);
                        let sw = kind.state_width(3);
                        assert_eq!(&part.state[i * sw..(i + 1) * sw], &src.state[j * sw..(j + 1) * sw]);
                        seen += 1;
                    }
                }
                assert_eq!(seen, n, "every row of table {t} exported once at W = {w}");
            }
        }
        // A row routed to the wrong owner or of the wrong width is an error, not a panic.
        let s = &mut two[0];
        let sw = s.state_width();
        assert!(s.set_row(0, 1, &[0.0; 3], &vec![0.0; sw]).is_err());
        assert!(s.set_row(0, 0, &[0.0; 2], &vec![0.0; sw]).is_err());
        assert!(s.set_row(0, 100, &[0.0; 3], &vec![0.0; sw]).is_err());
        assert!(s.set_row(9, 0, &[0.0; 3], &vec![0.0; sw]).is_err());
    }

    proptest! {
        #[test]
        fn local_indices_are_distinct_per_owner(w in 1usize..7, t in 0usize..30, a in 0u64..1000, b in 0u64..1000) {
            if a != b && shard_of(t, a, w) == shard_of(t, b, w) {
                prop_assert_ne!(a / w as u64, b / w as u64);
            }
            let owner = shard_of(t, a, w);
            prop_assert_eq!(EmbeddingShard::id_of(t, (a / w as u64) as usize, owner, w), a);
        }
    }
}
