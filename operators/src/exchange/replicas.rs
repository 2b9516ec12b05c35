//! Hot rows held by every worker, updated in lockstep.
//!
//! Invariants:
//! * Every worker builds the same replica set, in the same order, from the
//!   same configuration, and initialises each row exactly as its owner's
//!   fixed store does (`(seed, table, id)` alone), so replicas start equal.
//! * A step's gradients of replicated rows reach every worker; each worker
//!   sums them per row in worker order (first-seen slot order, as an owner
//!   sums rows) and applies the same optimizer, so replicas stay bit-identical
//!   and equal to what the owner would compute for a sharded row.
//! * The trainer copies every updated replica back into its owner's store,
//!   so checkpoints and norms read the store as before.
//! * A restore puts every replica back to its initial state first
//!   ([`Replicas::reset`]), then loads those the checkpoint lists, as the
//!   owner's store does with its rows: a replica then holds what its owner's
//!   store holds.

use crate::optim::{apply_row_finite, OptimizerParams, SparseOptimizerKind};
use crate::snapshot::WorkerSnapshot;
use rustc_hash::FxHashMap;

/// The replicated hot rows of one worker, with their optimizer state.
#[derive(Clone, Debug)]
pub struct Replicas {
    dim: usize,
    state_width: usize,
    optimizer: SparseOptimizerKind,
    hp: OptimizerParams,
    index: Vec<FxHashMap<u64, u32>>,
    keys: Vec<(u32, u64)>,
    rows: Vec<f32>,
    state: Vec<f32>,
    /// Per replica, its slot in `scratch` during an update (`u32::MAX`: none).
    slot: Vec<u32>,
    /// Replicas with a gradient this step, in first-seen order.
    order: Vec<u32>,
    scratch: Vec<f32>,
}

impl Replicas {
    /// Replicas of `replicated[t]` for every table `t` (duplicates ignored), initialised like the fixed store.
    pub fn new(
        replicated: &[Vec<u64>],
        table_sizes: &[u64],
        seed: u64,
        dim: usize,
        optimizer: SparseOptimizerKind,
        hp: OptimizerParams,
    ) -> Self {
        let state_width = optimizer.state_width(dim);
        let mut r = Replicas {
            dim,
            state_width,
            optimizer,
            hp,
            index: vec![FxHashMap::default(); table_sizes.len()],
            keys: Vec::new(),
            rows: Vec::new(),
            state: Vec::new(),
            slot: Vec::new(),
            order: Vec::new(),
            scratch: Vec::new(),
        };
        for (t, ids) in replicated.iter().enumerate() {
            for &id in ids {
                if r.index[t].contains_key(&id) {
                    continue;
                }
                r.index[t].insert(id, r.keys.len() as u32);
                r.keys.push((t as u32, id));
            }
        }
        r.rows = vec![0.0; r.keys.len() * dim];
        r.state = vec![0.0; r.keys.len() * state_width];
        r.slot = vec![u32::MAX; r.keys.len()];
        // Every replica starts as its row starts in the store.
        r.reset(seed, table_sizes);
        r
    }

    /// Number of replicated rows.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when nothing is replicated.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The replica index of row `id` of `table`, if it is replicated.
    #[inline]
    pub fn find(&self, table: usize, id: u64) -> Option<u32> {
        if self.keys.is_empty() {
            return None;
        }
        self.index[table].get(&id).copied()
    }

    /// The `(table, id)` of replica `h`.
    #[inline]
    pub fn key(&self, h: u32) -> (usize, u64) {
        let (t, id) = self.keys[h as usize];
        (t as usize, id)
    }

    /// The current row of replica `h`.
    #[inline]
    pub fn row(&self, h: u32) -> &[f32] {
        let s = h as usize * self.dim;
        &self.rows[s..s + self.dim]
    }

    /// The optimizer state of replica `h`.
    #[inline]
    pub fn state(&self, h: u32) -> &[f32] {
        let s = h as usize * self.state_width;
        &self.state[s..s + self.state_width]
    }

    /// Adds one worker's summed gradient `g` of replica `h` to this step's sum.
    #[inline]
    pub fn add_grad(&mut self, h: u32, g: &[f32]) {
        let cell = &mut self.slot[h as usize];
        if *cell == u32::MAX {
            *cell = self.order.len() as u32;
            self.order.push(h);
            self.scratch.extend_from_slice(g);
        } else {
            let s = *cell as usize * self.dim;
            for (a, &v) in self.scratch[s..s + self.dim].iter_mut().zip(g) {
                *a += v;
            }
        }
    }

    /// Sets the row optimizer's learning rate for the next updates (a schedule's value).
    pub fn set_lr(&mut self, lr: f32) {
        self.hp.lr = lr;
    }

    /// Applies this step's summed gradients scaled by `scale` and returns the
    /// replicas that changed, in first-seen order, and whether every updated
    /// row and its optimizer state are finite (checked as each is written);
    /// clears the step's sums.
    pub fn apply(&mut self, scale: f32) -> (Vec<u32>, bool) {
        let d = self.dim;
        let mut finite = true;
        for (k, &h) in self.order.iter().enumerate() {
            let g = &mut self.scratch[k * d..(k + 1) * d];
            for v in g.iter_mut() {
                *v *= scale;
            }
            let h = h as usize;
            let row = &mut self.rows[h * d..(h + 1) * d];
            let st = &mut self.state[h * self.state_width..(h + 1) * self.state_width];
            finite &= apply_row_finite(self.optimizer, &self.hp, row, g, st);
            self.slot[h] = u32::MAX;
        }
        self.scratch.clear();
        (std::mem::take(&mut self.order), finite)
    }

    /// Puts every replica back to its initial row and optimizer state, as [`new`](Self::new)
    /// made it for `seed` and `table_sizes`, with no gradient pending (before a restore:
    /// a checkpoint does not list the rows no step had updated before it).
    pub fn reset(&mut self, seed: u64, table_sizes: &[u64]) {
        let (d, w) = (self.dim, self.state_width);
        for (h, &(t, id)) in self.keys.iter().enumerate() {
            let t = t as usize;
            let bound = crate::rng::init_bound(table_sizes[t]);
            crate::store::init_row(seed, t, id, bound, &mut self.rows[h * d..(h + 1) * d]);
            self.optimizer.init_state(&self.hp, &mut self.state[h * w..(h + 1) * w]);
        }
        self.slot.iter_mut().for_each(|s| *s = u32::MAX);
        self.order.clear();
        self.scratch.clear();
    }

    /// Loads every replicated row (and its state) found in the parts of a checkpoint.
    pub fn restore(&mut self, parts: &[WorkerSnapshot]) {
        let (d, w) = (self.dim, self.state_width);
        for part in parts {
            for (t, rows) in part.tables.iter().enumerate() {
                let Some(index) = self.index.get(t) else { continue };
                if index.is_empty() {
                    continue;
                }
                for (i, id) in rows.ids.iter().enumerate() {
                    if let Some(&h) = index.get(id) {
                        let h = h as usize;
                        self.rows[h * d..(h + 1) * d].copy_from_slice(&rows.rows[i * d..(i + 1) * d]);
                        self.state[h * w..(h + 1) * w].copy_from_slice(&rows.state[i * w..(i + 1) * w]);
                    }
                }
            }
        }
    }
}
