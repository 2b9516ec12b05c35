//! A differential target over the embedding stores: the bytes are a store
//! configuration and a sequence of operations (training steps of lookups and
//! updates, checkpoint marks, exports, changes since a mark, restores from an
//! export, learning-rate changes), run on a [`TieredStore`] and on an
//! [`OffloadedTieredStore`] over [`HostHotTier`] (the tiered store with its
//! hot tier in another memory, as a GPU worker keeps it).
//!
//! Invariant: the two give the same lookups, hot tiers, exports, changes,
//! sums of squares and counters, bit for bit, and the other memory reports no
//! failure.

use tiderec_operators::optim::{OptimizerParams, SparseOptimizerKind};
use tiderec_operators::snapshot::TableRows;
use tiderec_operators::store::{
    restore_row, DeviceStore, EmbeddingStore, FrequencySource, HostHotTier, OffloadedTieredStore, StoreConfig,
    StoreKind, StoreParams, TieredStore,
};

/// Row width.
const DIM: usize = 3;
/// Table sizes: small, so that rows repeat and plans move them.
const SIZES: [u64; 2] = [40, 9];

/// Reads the input one byte at a time (zeros past its end).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The store configuration and row optimizer the first bytes choose.
fn configure(b: &mut Bytes<'_>) -> (StoreConfig, SparseOptimizerKind) {
    let source =
        [FrequencySource::Exact, FrequencySource::Sketch, FrequencySource::Differential][b.next() as usize % 3];
    let optimizer = [
        SparseOptimizerKind::Sgd,
        SparseOptimizerKind::RowwiseAdagrad,
        SparseOptimizerKind::Ftrl,
        SparseOptimizerKind::LazyAdam,
    ][b.next() as usize % 4];
    let budget = b.next();
    let window = b.next();
    let config = StoreConfig {
        kind: StoreKind::Tiered,
        hot_rows: 1 + b.next() as usize % 12,
        warmup: u64::from(b.next() % 5),
        flush_every: 1 + u64::from(b.next() % 4),
        freq_source: source,
        freq_window: (source == FrequencySource::Differential && window % 2 == 1).then_some(1 + u64::from(window % 7)),
        max_rows: budget.is_multiple_of(3).then_some(4 + u64::from(budget % 40)),
        sketch_width: 64,
        ..StoreConfig::default()
    };
    (config, optimizer)
}

/// Every table's export of `store`.
fn exports(store: &dyn EmbeddingStore) -> Vec<TableRows> {
    (0..SIZES.len()).map(|t| store.export_table(t)).collect()
}

/// Runs the operations the bytes give on both stores and compares them (see the module docs).
pub fn tiered_hot_tier(data: &[u8]) {
    let mut b = Bytes(data);
    let (config, optimizer) = configure(&mut b);
    let mut hp = OptimizerParams::with_lr(0.1);
    hp.initial_accumulator = 0.01;
    let p = StoreParams { worker: 0, workers: 1, dim: DIM, table_sizes: &SIZES, seed: 3, optimizer, hp };
    let mut plain = TieredStore::new(&config, &p);
    let memory = HostHotTier::new(DIM, optimizer.state_width(DIM));
    let mut other =
        OffloadedTieredStore::new(TieredStore::new(&config, &p), memory).expect("a hot tier of the rows' width");
    let mut completed = 0u64;
    while !b.is_empty() {
        match b.next() % 8 {
            0..=3 => {
                // A training step: lookups of up to 7 ids per table, then each distinct id updated.
                // The plain store looks up table by table, the other every table at once.
                let (mut rows, mut grads) = (Vec::new(), Vec::new());
                let lookups: Vec<Vec<u64>> =
                    SIZES.iter().map(|&n| (0..b.next() % 8).map(|_| u64::from(b.next()) % n).collect()).collect();
                let (mut x, mut y) = (Vec::new(), Vec::new());
                for (t, ids) in lookups.iter().enumerate() {
                    plain.gather(t, ids, &mut x);
                }
                let all: Vec<(usize, &[u64])> = lookups.iter().enumerate().map(|(t, ids)| (t, &ids[..])).collect();
                other.gather_many(&all, &mut y);
                assert_eq!(bits(&x), bits(&y), "lookups in step {completed}");
                for (t, ids) in lookups.iter().enumerate() {
                    let mut distinct = ids.clone();
                    distinct.sort_unstable();
                    distinct.dedup();
                    for id in distinct {
                        let g: Vec<f32> = (0..DIM).map(|_| (f32::from(b.next()) - 128.0) / 256.0).collect();
                        plain.apply(t, id, &g);
                        rows.push((t as u32, id));
                        grads.extend_from_slice(&g);
                    }
                }
                other.apply_rows(&rows, &grads);
                completed += 1;
                plain.end_step(completed);
                other.end_step(completed);
                assert_eq!(plain.hot_ids(), other.hot_ids(), "the hot tier after step {completed}");
            }
            4 => {
                plain.mark_checkpoint();
                other.mark_checkpoint();
            }
            5 => {
                for t in 0..SIZES.len() {
                    assert_eq!(plain.export_changes(t), other.export_changes(t), "changes of table {t}");
                }
            }
            6 => {
                // A restore of the plain store's export into both, after a reset.
                let parts = exports(&plain);
                assert_eq!(parts, exports(&other), "the export before a restore");
                assert!(parts.iter().all(|p| p.counts.len() == p.ids.len() && p.last_seen.len() == p.ids.len()));
                for store in [&mut plain as &mut dyn EmbeddingStore, &mut other] {
                    store.reset(completed);
                    for (t, part) in parts.iter().enumerate() {
                        for i in 0..part.ids.len() {
                            restore_row(store, t, part, i).expect("a row of the store's own export");
                        }
                    }
                }
            }
            _ => {
                let lr = 0.01 + f32::from(b.next()) / 512.0;
                plain.set_lr(lr);
                other.set_lr(lr);
            }
        }
        assert_eq!(other.take_error(), None);
    }
    assert_eq!(exports(&plain), exports(&other), "the final export");
    assert_eq!(plain.sum_of_squares().to_bits(), other.sum_of_squares().to_bits(), "Σ squares");
    assert_eq!(plain.stats(), other.stats(), "the counters");
}

/// The bits of `v`, so that a NaN equals itself.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Seeds: configurations over every frequency source and row optimizer, each
/// with steps that repeat rows (so plans fill the hot tier), marks, changes,
/// exports and a restore between steps.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (k, source) in (0u8..3).enumerate() {
        for optimizer in 0u8..4 {
            let mut s = vec![source, optimizer, 3 * k as u8, 1, 6, 1, 2];
            for step in 0u8..12 {
                // Op 0, each table's ids, then a gradient per distinct id of each table.
                s.push(0);
                let tables = [vec![1, 2, 3, step % 5], vec![0, 7]];
                for ids in &tables {
                    s.push(ids.len() as u8);
                    s.extend(ids);
                }
                for ids in &tables {
                    let mut distinct = ids.clone();
                    distinct.sort_unstable();
                    distinct.dedup();
                    s.extend((0..distinct.len() * DIM).map(|g| (g as u8).wrapping_mul(37).wrapping_add(step)));
                }
                if step % 4 == 3 {
                    s.extend([5, 4]);
                }
                if step == 7 {
                    s.push(6);
                }
                if step == 9 {
                    s.extend([7, 90]);
                }
            }
            out.push(s);
        }
    }
    out
}
