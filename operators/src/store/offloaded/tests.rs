use super::*;
use crate::rng::unit_f64;
use crate::snapshot::COLD;
use crate::store::{FrequencySource, StoreConfig, StoreKind, StoreParams};

const DIM: usize = 4;

fn params(sizes: &[u64], optimizer: SparseOptimizerKind) -> StoreParams<'_> {
    let mut hp = OptimizerParams::with_lr(0.1);
    hp.initial_accumulator = 0.01;
    StoreParams { worker: 0, workers: 1, dim: DIM, table_sizes: sizes, seed: 9, optimizer, hp }
}

fn offloaded(cfg: &StoreConfig, p: &StoreParams<'_>) -> OffloadedTieredStore<HostHotTier> {
    let memory = HostHotTier::new(DIM, p.optimizer.state_width(DIM));
    OffloadedTieredStore::new(TieredStore::new(cfg, p), memory).unwrap()
}

/// Step `s`'s distinct ids per table, skewed towards small ids.
fn step_ids(sizes: &[u64], s: u64) -> Vec<(usize, Vec<u64>)> {
    sizes
        .iter()
        .enumerate()
        .map(|(t, &n)| {
            let mut ids: Vec<u64> = (0..40)
                .map(|k| ((n as f64).powf(unit_f64(3, s * 31 + t as u64, k, 0)) as u64).saturating_sub(1).min(n - 1))
                .collect();
            ids.sort_unstable();
            ids.dedup();
            (t, ids)
        })
        .collect()
}

fn grad(step: u64, t: usize, id: u64) -> Vec<f32> {
    (0..DIM).map(|c| (unit_f64(5, step, t as u64 * 1_000_003 + id, c as u64) as f32 - 0.5) * 0.3).collect()
}

/// One training step on both stores: the same lookups (compared), the tiered
/// store's updates one by one and the offloaded store's in one batch, then maintenance.
fn step_both(a: &mut TieredStore, b: &mut OffloadedTieredStore<HostHotTier>, sizes: &[u64], s: u64, what: &str) {
    let ids = step_ids(sizes, s);
    for (t, ids) in &ids {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        a.gather(*t, ids, &mut x);
        b.gather(*t, ids, &mut y);
        assert_eq!(x, y, "{what}: lookups of table {t} in step {s}");
    }
    // Every table at once, as the owner asks for one request's rows.
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for (t, ids) in &ids {
        a.gather(*t, ids, &mut x);
    }
    let all: Vec<(usize, &[u64])> = ids.iter().map(|(t, ids)| (*t, &ids[..])).collect();
    b.gather_many(&all, &mut y);
    assert_eq!(x, y, "{what}: the lookups of every table at once in step {s}");
    let (mut rows, mut grads) = (Vec::new(), Vec::new());
    for (t, ids) in &ids {
        for &id in ids {
            let g = grad(s, *t, id);
            a.apply(*t, id, &g);
            rows.push((*t as u32, id));
            grads.extend_from_slice(&g);
        }
    }
    b.apply_rows(&rows, &grads);
    a.end_step(s + 1);
    b.end_step(s + 1);
    assert_eq!(b.take_error(), None, "{what}");
    assert_eq!(a.hot_ids(), b.hot_ids(), "{what}: hot tier after step {s}");
}

fn exports(store: &dyn EmbeddingStore, tables: usize) -> Vec<TableRows> {
    (0..tables).map(|t| store.export_table(t)).collect()
}

fn changes(store: &dyn EmbeddingStore, tables: usize) -> Vec<TableRows> {
    (0..tables).map(|t| store.export_changes(t)).collect()
}

/// Every frequency source and row optimizer, with and without a row budget:
/// the same lookups every step, the same hot tier after every step, and the
/// same exports, changes, sums and counters at checkpoints taken while the hot
/// rows' current values are in the other memory.
#[test]
fn a_hot_tier_in_another_memory_trains_the_tiered_stores_model_bit_for_bit() {
    let sizes = [400u64, 90, 1500];
    let optimizers = [SparseOptimizerKind::Sgd, SparseOptimizerKind::RowwiseAdagrad, SparseOptimizerKind::LazyAdam];
    for source in [FrequencySource::Exact, FrequencySource::Sketch, FrequencySource::Differential] {
        for (o, &optimizer) in optimizers.iter().enumerate() {
            let cfg = StoreConfig {
                kind: StoreKind::Tiered,
                hot_rows: 24,
                warmup: 3,
                flush_every: 5,
                freq_source: source,
                sketch_width: 1 << 12,
                max_rows: (o == 1).then_some(300),
                ..StoreConfig::default()
            };
            let what = format!("{source:?}, {optimizer:?}, budget {:?}", cfg.max_rows);
            let p = params(&sizes, optimizer);
            let (mut a, mut b) = (TieredStore::new(&cfg, &p), offloaded(&cfg, &p));
            for s in 0..31 {
                step_both(&mut a, &mut b, &sizes, s, &what);
                if s % 7 == 6 {
                    assert_eq!(changes(&b, sizes.len()), changes(&a, sizes.len()), "{what}: changes after step {s}");
                    assert_eq!(exports(&b, sizes.len()), exports(&a, sizes.len()), "{what}: export after step {s}");
                    assert_eq!(b.sum_of_squares().to_bits(), a.sum_of_squares().to_bits(), "{what}");
                    a.mark_checkpoint();
                    b.mark_checkpoint();
                }
            }
            assert_eq!(b.stats(), a.stats(), "{what}");
            let st = a.stats();
            assert!(st.replans >= 5 && st.moves > 0 && st.hot_hits > 0, "{what}: {st:?}");
            assert_eq!(b.num_rows(), a.num_rows());
        }
    }
}

/// A checkpoint of a tiered store restored into a store with its hot tier
/// elsewhere (reset, rows, frequencies and hot slots) goes on as the tiered
/// store it was taken from; and the reverse.
#[test]
fn checkpoints_move_between_the_tiered_store_and_a_hot_tier_elsewhere() {
    let sizes = [400u64, 90];
    let cfg =
        StoreConfig { kind: StoreKind::Tiered, hot_rows: 12, warmup: 3, flush_every: 5, ..StoreConfig::default() };
    let p = params(&sizes, SparseOptimizerKind::RowwiseAdagrad);
    let restore = |into: &mut dyn EmbeddingStore, parts: &[TableRows], step: u64| {
        into.reset(step);
        for (t, part) in parts.iter().enumerate() {
            for i in 0..part.ids.len() {
                crate::store::restore_row(into, t, part, i).unwrap();
            }
        }
    };
    let (mut straight, mut elsewhere) = (TieredStore::new(&cfg, &p), offloaded(&cfg, &p));
    for s in 0..10 {
        step_both(&mut straight, &mut elsewhere, &sizes, s, "before the checkpoint");
    }
    let parts = exports(&straight, sizes.len());
    assert_eq!(parts.iter().flat_map(|t| &t.hot).filter(|&&h| h != COLD).count(), 12);
    // Into a store with its hot tier elsewhere that trained on other rows first.
    let mut resumed = offloaded(&cfg, &p);
    let mut other = TieredStore::new(&cfg, &p);
    for s in 40..50 {
        step_both(&mut other, &mut resumed, &sizes, s, "other rows");
    }
    restore(&mut resumed, &parts, 10);
    assert_eq!(exports(&resumed, sizes.len()), parts, "the export before any step");
    // Then on; after three steps the other memory's export goes into a tiered
    // store, which goes on as the two others.
    let mut again = TieredStore::new(&cfg, &p);
    for s in 10..13 {
        step_both(&mut straight, &mut resumed, &sizes, s, "after the restore");
    }
    restore(&mut again, &exports(&resumed, sizes.len()), 13);
    assert_eq!(exports(&again, sizes.len()), exports(&straight, sizes.len()), "the tiered store restored");
    for s in 13..24 {
        step_both(&mut straight, &mut resumed, &sizes, s, "after the restore");
        for (t, ids) in step_ids(&sizes, s) {
            again.gather(t, &ids, &mut Vec::new());
            for id in ids {
                again.apply(t, id, &grad(s, t, id));
            }
        }
        again.end_step(s + 1);
    }
    let now = exports(&straight, sizes.len());
    assert_eq!(exports(&resumed, sizes.len()), now);
    assert_eq!(exports(&again, sizes.len()), now);
}

/// A memory that fails every call (every load, with `loads_only`) after the first `works` ones.
#[derive(Debug)]
struct Failing {
    inner: HostHotTier,
    works: usize,
    loads_only: bool,
}

impl Failing {
    fn check(&mut self) -> Result<(), String> {
        if self.loads_only {
            return Ok(());
        }
        self.count()
    }
    fn count(&mut self) -> Result<(), String> {
        match self.works.checked_sub(1) {
            Some(n) => {
                self.works = n;
                Ok(())
            }
            None => Err("the device fell off the bus".into()),
        }
    }
}

impl HotTierMemory for Failing {
    type Error = String;
    fn dim(&self) -> usize {
        DIM
    }
    fn load(&mut self, rows: &[f32], state: &[f32]) -> Result<(), String> {
        self.count()?;
        self.inner.load(rows, state).map_err(|e| match e {})
    }
    fn read_all(&mut self, rows: &mut [f32], state: &mut [f32]) -> Result<(), String> {
        self.check()?;
        self.inner.read_all(rows, state).map_err(|e| match e {})
    }
    fn read(&mut self, slots: &[u32], out: &mut Vec<f32>) -> Result<(), String> {
        self.check()?;
        self.inner.read(slots, out).map_err(|e| match e {})
    }
    fn update(
        &mut self,
        slots: &[u32],
        grads: &[f32],
        kind: SparseOptimizerKind,
        hp: &OptimizerParams,
    ) -> Result<(), String> {
        self.check()?;
        self.inner.update(slots, grads, kind, hp).map_err(|e| match e {})
    }
}

/// A memory that fails is reported once, with what was being done: a lookup
/// still gives a row of zeros for each hot row, and nothing panics.
#[test]
fn a_failing_memory_is_reported_with_what_failed() {
    let sizes = [50u64];
    let cfg =
        StoreConfig { kind: StoreKind::Tiered, hot_rows: 8, warmup: 2, flush_every: 100, ..StoreConfig::default() };
    let p = params(&sizes, SparseOptimizerKind::Sgd);
    let memory = Failing { inner: HostHotTier::new(DIM, 0), works: 4, loads_only: false };
    let mut store = OffloadedTieredStore::new(TieredStore::new(&cfg, &p), memory).unwrap();
    let ids: Vec<u64> = (0..10).collect();
    let g = vec![0.5; ids.len() * DIM];
    let rows: Vec<(u32, u64)> = ids.iter().map(|&id| (0, id)).collect();
    for s in 0..2 {
        store.gather(0, &ids, &mut Vec::new());
        store.apply_rows(&rows, &g);
        store.end_step(s + 1);
    }
    assert_eq!(store.hot_ids().len(), 8);
    assert_eq!(store.take_error(), None);
    // Loaded empty (1), loaded after the plan (2), read (3), updated (4); then every call fails.
    for _ in 0..2 {
        let mut out = Vec::new();
        store.gather(0, &ids, &mut out);
        assert_eq!(out.len(), ids.len() * DIM);
        store.apply_rows(&rows, &g);
    }
    let mut out = Vec::new();
    store.gather(0, &ids, &mut out);
    assert!(out[..8 * DIM].iter().all(|&v| v == 0.0), "hot rows read as zeros after a failure");
    assert_eq!(store.take_error().as_deref(), Some("serving hot rows: the device fell off the bus"));
    store.apply_rows(&rows, &g);
    let _ = store.export_table(0);
    assert_eq!(store.take_error().as_deref(), Some("updating hot rows: the device fell off the bus"));
    assert_eq!(store.take_error(), None);
}

/// A memory the hot tier cannot be loaded into: the failure is reported once,
/// and the host copy serves and is updated meanwhile, so lookups and exports
/// stay the tiered store's (nothing reads the memory's old contents).
#[test]
fn while_the_memory_cannot_be_loaded_the_host_copy_serves() {
    let sizes = [400u64, 90, 1500];
    let cfg =
        StoreConfig { kind: StoreKind::Tiered, hot_rows: 24, warmup: 3, flush_every: 5, ..StoreConfig::default() };
    let p = params(&sizes, SparseOptimizerKind::RowwiseAdagrad);
    let (mut a, mut b) = (TieredStore::new(&cfg, &p), offloaded(&cfg, &p));
    // Loaded empty (1), loaded after the first plan (2), then no load succeeds.
    let memory = Failing { inner: HostHotTier::new(DIM, p.optimizer.state_width(DIM)), works: 2, loads_only: true };
    let mut c = OffloadedTieredStore::new(TieredStore::new(&cfg, &p), memory).unwrap();
    for s in 0..12 {
        let ids = step_ids(&sizes, s);
        let mut want = Vec::new();
        for (t, ids) in &ids {
            b.gather(*t, ids, &mut want);
        }
        step_both(&mut a, &mut b, &sizes, s, "a working memory");
        let (mut x, mut rows, mut grads) = (Vec::new(), Vec::new(), Vec::new());
        for (t, ids) in &ids {
            c.gather(*t, ids, &mut x);
            for &id in ids {
                rows.push((*t as u32, id));
                grads.extend(grad(s, *t, id));
            }
        }
        c.apply_rows(&rows, &grads);
        c.end_step(s + 1);
        assert_eq!(x, want, "lookups of step {s}");
        if s < 8 {
            assert_eq!(c.take_error(), None, "step {s}");
        } else if s == 8 {
            let e = c.take_error().expect("the load after the plan of step 8 failed");
            assert!(e.starts_with("loading the hot rows: the device fell off the bus"), "{e}");
        }
        assert_eq!(c.hot_ids(), a.hot_ids(), "step {s}");
    }
    assert_eq!(exports(&c, sizes.len()), exports(&a, sizes.len()));
}
