use super::*;
use crate::rng::unit_f64;
use crate::routing::shard_of;
use crate::{ConfigError, RestoreError};

const DIM: usize = 4;

fn params(worker: usize, workers: usize, sizes: &[u64], optimizer: SparseOptimizerKind) -> StoreParams<'_> {
    let mut hp = OptimizerParams::with_lr(0.1);
    hp.initial_accumulator = 0.01;
    StoreParams { worker, workers, dim: DIM, table_sizes: sizes, seed: 9, optimizer, hp }
}

fn config(kind: StoreKind) -> StoreConfig {
    StoreConfig { kind, hot_rows: 16, warmup: 3, flush_every: 4, ..StoreConfig::default() }
}

/// A Zipf-like id (rank `⌊n^u⌋` skews towards small ids) from a counter-based uniform.
fn skewed_id(n: u64, step: u64, k: u64) -> u64 {
    let u = unit_f64(3, step, k, 0);
    ((n as f64).powf(u) as u64).saturating_sub(1).min(n - 1)
}

/// `steps` steps of distinct ids per table and their gradients, the same for every store.
fn workload(sizes: &[u64], steps: u64, per_step: u64) -> Vec<Vec<(usize, Vec<u64>)>> {
    (0..steps)
        .map(|s| {
            sizes
                .iter()
                .enumerate()
                .map(|(t, &n)| {
                    let mut ids: Vec<u64> = (0..per_step).map(|k| skewed_id(n, s * 31 + t as u64, k)).collect();
                    ids.sort_unstable();
                    ids.dedup();
                    (t, ids)
                })
                .collect()
        })
        .collect()
}

fn grad(step: u64, t: usize, id: u64) -> Vec<f32> {
    (0..DIM).map(|c| (unit_f64(5, step, t as u64 * 1_000_003 + id, c as u64) as f32 - 0.5) * 0.3).collect()
}

/// Runs the workload on one worker's store: gathers (returned) and updates, with maintenance.
fn run(store: &mut dyn EmbeddingStore, work: &[Vec<(usize, Vec<u64>)>]) -> Vec<f32> {
    let mut seen = Vec::new();
    for (s, step) in work.iter().enumerate() {
        for (t, ids) in step {
            store.gather(*t, ids, &mut seen);
        }
        for (t, ids) in step {
            for &id in ids {
                store.apply(*t, id, &grad(s as u64, *t, id));
            }
        }
        store.end_step(s as u64 + 1);
    }
    seen
}

fn export_all(store: &dyn EmbeddingStore, tables: usize) -> Vec<TableRows> {
    (0..tables).map(|t| store.export_table(t)).collect()
}

/// The rows, optimizer state and counts of an export, without the hot-tier slots (which re-plans move).
fn values(mut tables: Vec<TableRows>) -> Vec<TableRows> {
    for t in &mut tables {
        t.hot.clear();
    }
    tables
}

/// Every row `sparse` holds equals the same row of `dense`, values and optimizer state.
fn assert_rows_match(sparse: &[TableRows], dense: &[TableRows], sw: usize) {
    for (t, (s, f)) in sparse.iter().zip(dense).enumerate() {
        for (i, id) in s.ids.iter().enumerate() {
            let j = f.ids.binary_search(id).expect("fixed table holds every id");
            assert_eq!(&s.rows[i * DIM..(i + 1) * DIM], &f.rows[j * DIM..(j + 1) * DIM], "table {t} row {id}");
            assert_eq!(&s.state[i * sw..(i + 1) * sw], &f.state[j * sw..(j + 1) * sw], "table {t} state {id}");
        }
    }
}

#[test]
fn dynamic_and_tiered_without_admission_or_eviction_equal_the_fixed_table() {
    let sizes = [500u64, 37, 2000];
    let work = workload(&sizes, 30, 40);
    for optimizer in [SparseOptimizerKind::RowwiseAdagrad, SparseOptimizerKind::LazyAdam, SparseOptimizerKind::Sgd] {
        let p = params(0, 1, &sizes, optimizer);
        let mut fixed = Store::new(&config(StoreKind::Fixed), &p).unwrap();
        let fixed_seen = run(&mut fixed, &work);
        let fixed_rows = export_all(&fixed, sizes.len());
        for kind in [StoreKind::Dynamic, StoreKind::Tiered] {
            let mut store = Store::new(&config(kind), &p).unwrap();
            let seen = run(&mut store, &work);
            assert_eq!(seen, fixed_seen, "{kind:?}/{optimizer:?}: every lookup bit-identical");
            let rows = export_all(&store, sizes.len());
            assert_rows_match(&rows, &fixed_rows, fixed.state_width());
            // Exactly the touched rows are held.
            let touched: usize = (0..sizes.len())
                .map(|t| {
                    let mut ids: Vec<u64> = work.iter().flat_map(|s| s[t].1.iter().copied()).collect();
                    ids.sort_unstable();
                    ids.dedup();
                    ids.len()
                })
                .sum();
            assert_eq!(store.num_rows(), touched);
            if kind == StoreKind::Tiered {
                let st = store.stats();
                assert!(st.hot_rows > 0 && st.hot_rows <= 16, "{st:?}");
                assert!(st.replans >= 7 && st.hot_hits > 0, "{st:?}");
                assert_eq!(st.lookups, st.hot_hits + st.cold_hits + st.misses);
            }
        }
    }
}

#[test]
fn a_store_on_two_workers_holds_the_rows_of_one() {
    let sizes = [300u64, 41];
    let work = workload(&sizes, 20, 30);
    for kind in [StoreKind::Dynamic, StoreKind::Tiered] {
        let mut one = Store::new(&config(kind), &params(0, 1, &sizes, SparseOptimizerKind::LazyAdam)).unwrap();
        run(&mut one, &work);
        let mut merged = vec![TableRows::default(); sizes.len()];
        for k in 0..2 {
            let mine: Vec<Vec<(usize, Vec<u64>)>> = work
                .iter()
                .map(|s| {
                    s.iter()
                        .map(|(t, ids)| (*t, ids.iter().copied().filter(|&id| shard_of(*t, id, 2) == k).collect()))
                        .collect()
                })
                .collect();
            let mut store = Store::new(&config(kind), &params(k, 2, &sizes, SparseOptimizerKind::LazyAdam)).unwrap();
            run(&mut store, &mine);
            for (t, part) in export_all(&store, sizes.len()).into_iter().enumerate() {
                merged[t].ids.extend(part.ids);
                merged[t].rows.extend(part.rows);
                merged[t].state.extend(part.state);
            }
        }
        let single = export_all(&one, sizes.len());
        let sw = one.state_width();
        for t in 0..sizes.len() {
            assert_eq!(merged[t].ids.len(), single[t].ids.len());
            let mut order: Vec<usize> = (0..merged[t].ids.len()).collect();
            order.sort_by_key(|&i| merged[t].ids[i]);
            for (j, &i) in order.iter().enumerate() {
                assert_eq!(merged[t].ids[i], single[t].ids[j]);
                assert_eq!(&merged[t].rows[i * DIM..(i + 1) * DIM], &single[t].rows[j * DIM..(j + 1) * DIM]);
                assert_eq!(&merged[t].state[i * sw..(i + 1) * sw], &single[t].state[j * sw..(j + 1) * sw]);
            }
        }
    }
}

/// Differential test of re-planning: a tiered store re-planned at every step
/// (hot set changing as frequencies shift) against a plain dynamic store fed
/// the same operations; after every step every row, every optimizer slot and
/// every lookup agree bit for bit, and each plan is the exact top-k.
/// One step of drifting Zipf lookups (step `s` favours ids near `10·(s / 10)`)
/// through both stores, which must gather the same rows; then every row's
/// gradient applied to both, reporting each `(table, id)` to `touched`.
fn drifting_step(
    s: u64,
    sizes: &[u64],
    tiered: &mut TieredStore,
    plain: &mut DynamicStore,
    mut touched: impl FnMut(usize, u64),
) {
    let step: Vec<(usize, Vec<u64>)> = sizes
        .iter()
        .enumerate()
        .map(|(t, &n)| {
            let mut ids: Vec<u64> = (0..25).map(|k| (skewed_id(n, s * 7 + t as u64, k) + 10 * (s / 10)) % n).collect();
            ids.sort_unstable();
            ids.dedup();
            (t, ids)
        })
        .collect();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (t, ids) in &step {
        tiered.gather(*t, ids, &mut a);
        plain.gather(*t, ids, &mut b);
    }
    assert_eq!(a, b, "step {s}: lookups");
    for (t, ids) in &step {
        for &id in ids {
            let g = grad(s, *t, id);
            tiered.apply(*t, id, &g);
            plain.apply(*t, id, &g);
            touched(*t, id);
        }
    }
}

#[test]
fn re_planning_moves_rows_and_state_without_changing_any_value() {
    let sizes = [400u64, 90];
    let cfg =
        StoreConfig { kind: StoreKind::Tiered, hot_rows: 12, warmup: 1, flush_every: 1, ..StoreConfig::default() };
    let p = params(0, 1, &sizes, SparseOptimizerKind::LazyAdam);
    let mut tiered = TieredStore::new(&cfg, &p);
    let mut plain = DynamicStore::new(&cfg, &p);
    let mut moves = 0;
    for s in 0..40u64 {
        drifting_step(s, &sizes, &mut tiered, &mut plain, |_, _| {});
        let before = values(export_all(&tiered, sizes.len()));
        tiered.end_step(s + 1);
        plain.end_step(s + 1);
        let after = values(export_all(&tiered, sizes.len()));
        assert_eq!(before, after, "step {s}: a re-plan changed a value");
        assert_eq!(after, values(export_all(&plain, sizes.len())), "step {s}: tiered differs from plain");
        // The hot set is the exact top-k by update count (ties by table, id).
        let mut all: Vec<(std::cmp::Reverse<u32>, u32, u64)> =
            plain.live_meta().map(|m| (std::cmp::Reverse(m.count), m.table, m.id)).collect();
        all.sort_unstable();
        let want: Vec<(usize, u64)> = all
            .iter()
            .filter(|p| p.0 .0 >= tiered::HOT_MIN_COUNT)
            .take(12)
            .map(|&(_, t, id)| (t as usize, id))
            .collect();
        assert_eq!(tiered.hot_ids(), want, "step {s}: hot set");
        moves = tiered.stats().moves;
    }
    assert!(moves > 12, "the hot set changed over time ({moves} moves)");
}

#[test]
fn lfu_eviction_keeps_rows_within_the_budget() {
    let sizes = [1_000_000u64, 1_000_000];
    let cfg = StoreConfig { kind: StoreKind::Dynamic, max_rows: Some(300), flush_every: 5, ..StoreConfig::default() };
    let mut store = DynamicStore::new(&cfg, &params(0, 1, &sizes, SparseOptimizerKind::RowwiseAdagrad));
    let g = [0.1f32; DIM];
    // A growing id space: every step brings 50 new ids per table and repeats id 0..10.
    for s in 0..200u64 {
        for t in 0..2 {
            for id in (0..10).chain(s * 50..s * 50 + 50) {
                store.apply(t, id, &g);
            }
        }
        store.end_step(s + 1);
        if (s + 1) % 5 == 0 {
            assert!(store.num_rows() <= 300, "step {s}: {} rows", store.num_rows());
        }
        assert!(store.num_rows() <= 300 + 5 * 2 * 60);
    }
    // The frequent ids survived; the slab never grew beyond the peak.
    for t in 0..2 {
        for id in 0..10 {
            assert!(store.slot(t, id).is_some(), "hot id {id} of table {t} evicted");
        }
    }
    let st = store.stats();
    assert!(st.evictions > 10_000, "{st:?}");
    assert!(store.meta.len() <= 300 + 5 * 2 * 60);
}

#[test]
fn ttl_evicts_rows_not_seen_for_ttl_steps() {
    let sizes = [1000u64];
    let cfg = StoreConfig { kind: StoreKind::Dynamic, ttl_steps: Some(3), flush_every: 1, ..StoreConfig::default() };
    let mut store = DynamicStore::new(&cfg, &params(0, 1, &sizes, SparseOptimizerKind::Sgd));
    let g = [0.1f32; DIM];
    store.apply(0, 1, &g); // step 0
    store.apply(0, 2, &g);
    store.end_step(1);
    for s in 1..4 {
        store.apply(0, 2, &g);
        store.end_step(s + 1);
        assert!(store.slot(0, 1).is_some(), "row 1 is evicted only after 3 idle steps (step {s})");
    }
    store.apply(0, 2, &g);
    store.end_step(5);
    assert!(store.slot(0, 1).is_none() && store.slot(0, 2).is_some());
    // An evicted id comes back with its seeded initial row.
    let mut row = Vec::new();
    store.gather(0, &[1], &mut row);
    let mut init = vec![0.0; DIM];
    init_row(9, 0, 1, 1.0 / (1000f32).sqrt(), &mut init);
    assert_eq!(row, init);
}

/// A hot row outlives the TTL like a cold one: it leaves the hot tier and the
/// store, and comes back as its seeded initial row; the rows still updated stay
/// hot. Both ways out: a re-plan that skips it, and an eviction step between re-plans.
#[test]
fn ttl_evicts_hot_rows_too() {
    let sizes = [1000u64];
    // (warmup, flush_every, ttl_steps, the first step after which row 1 is gone)
    for (warmup, flush_every, ttl, gone_after) in [(2u64, 1u64, 3u64, 5u64), (3, 4, 4, 7)] {
        let cfg = StoreConfig {
            kind: StoreKind::Tiered,
            hot_rows: 4,
            warmup,
            flush_every,
            ttl_steps: Some(ttl),
            ..StoreConfig::default()
        };
        let mut store = TieredStore::new(&cfg, &params(0, 1, &sizes, SparseOptimizerKind::Sgd));
        let g = [0.1f32; DIM];
        for s in 0..warmup {
            for id in 1..=4 {
                store.apply(0, id, &g);
            }
            store.end_step(s + 1);
        }
        assert_eq!(store.hot_len(), 4, "rows 1..=4 are hot after the warmup");
        for s in warmup..12 {
            for id in 2..=4 {
                store.apply(0, id, &g);
            }
            assert_eq!(store.relays_at(s + 1), store.plans_at(s + 1) || s == gone_after, "step {s}");
            store.end_step(s + 1);
            let held = store.export_table(0).ids;
            assert_eq!(held.contains(&1), s < gone_after, "warmup {warmup}: row 1 after step {s}");
        }
        assert_eq!(store.hot_ids(), vec![(0, 2), (0, 3), (0, 4)]);
        assert_eq!((store.num_rows(), store.stats().evictions), (3, 1));
        let mut row = Vec::new();
        store.gather(0, &[1], &mut row);
        let mut init = vec![0.0; DIM];
        init_row(9, 0, 1, 1.0 / (1000f32).sqrt(), &mut init);
        assert_eq!(row, init);
    }
}

#[test]
fn admission_by_count_admits_exactly_the_ids_seen_n_times() {
    let sizes = [10_000u64, 10_000];
    let cfg = StoreConfig { kind: StoreKind::Dynamic, admit_count: 3, ..StoreConfig::default() };
    let mut store = DynamicStore::new(&cfg, &params(0, 1, &sizes, SparseOptimizerKind::Sgd));
    let g = [1.0f32; DIM];
    // Id i of table t is seen in (i + t) % 5 steps.
    let seen = |t: usize, id: u64| (id as usize + t) % 5;
    for s in 0..5 {
        let mut zeros = Vec::new();
        for t in 0..2 {
            for id in 0..200u64 {
                if seen(t, id) > s {
                    if store.slot(t, id).is_none() {
                        store.gather(t, &[id], &mut zeros);
                    }
                    store.apply(t, id, &g);
                }
            }
        }
        assert!(zeros.iter().all(|&v| v == 0.0), "a non-admitted id reads as zeros");
        store.end_step(s as u64 + 1);
    }
    for t in 0..2 {
        for id in 0..200u64 {
            let n = seen(t, id);
            assert_eq!(store.slot(t, id).is_some(), n >= 3, "table {t} id {id} seen {n} times");
            if n >= 3 {
                // Admitted at its third sighting (initial row, no update), updated after.
                let mut init = vec![0.0; DIM];
                init_row(9, t, id, 0.01, &mut init);
                let s = store.slot(t, id).unwrap() as usize;
                let expect: Vec<f32> = init.iter().map(|v| v - 0.1 * (n - 3) as f32).collect();
                for (a, b) in store.row_at(s).iter().zip(&expect) {
                    assert!((a - b).abs() < 1e-6);
                }
            }
        }
    }
    let st = store.stats();
    assert_eq!(st.admissions as usize, store.num_rows());
    assert_eq!(st.rejections, (0..2).map(|t| (0..200).map(|id| seen(t, id).min(2) as u64).sum::<u64>()).sum::<u64>());
}

#[test]
fn admission_by_probability_is_seeded_and_near_p() {
    let sizes = [1_000_000u64];
    let cfg = StoreConfig { kind: StoreKind::Dynamic, admit_prob: Some(0.25), ..StoreConfig::default() };
    let p = params(0, 1, &sizes, SparseOptimizerKind::Sgd);
    let (mut a, mut b) = (DynamicStore::new(&cfg, &p), DynamicStore::new(&cfg, &p));
    for id in 0..20_000u64 {
        a.apply(0, id, &[0.0; DIM]);
        b.apply(0, id, &[0.0; DIM]);
    }
    assert_eq!(export_all(&a, 1), export_all(&b, 1));
    let frac = a.num_rows() as f64 / 20_000.0;
    assert!((frac - 0.25).abs() < 0.02, "{frac}");
}

#[test]
fn count_min_sketch_top_k_agrees_with_exact_counts_on_skewed_ids() {
    let mut sketch = CountMinSketch::new(1 << 14, 4, 1);
    let mut exact = rustc_hash::FxHashMap::<u64, u32>::default();
    for k in 0..200_000u64 {
        let id = skewed_id(1_000_000, 1, k);
        sketch.add(CountMinSketch::key(0, id));
        *exact.entry(id).or_default() += 1;
    }
    for (&id, &c) in &exact {
        assert!(sketch.estimate(CountMinSketch::key(0, id)) >= c);
    }
    let mut by_exact: Vec<(u32, u64)> = exact.iter().map(|(&id, &c)| (c, id)).collect();
    by_exact.sort_unstable_by(|a, b| b.cmp(a));
    let k = 100;
    // Compare the sets where the exact counts separate rank k from rank k + 1.
    let top: std::collections::BTreeSet<u64> = by_exact[..k].iter().map(|p| p.1).collect();
    let mut by_sketch: Vec<(u32, u64)> =
        exact.keys().map(|&id| (sketch.estimate(CountMinSketch::key(0, id)), id)).collect();
    by_sketch.sort_unstable_by(|a, b| b.cmp(a));
    let sketched: std::collections::BTreeSet<u64> = by_sketch[..k].iter().map(|p| p.1).collect();
    let common = top.intersection(&sketched).count();
    assert!(common >= k * 98 / 100, "{common} of the top {k} agree");
    for &(c, id) in &by_exact[..k] {
        let e = sketch.estimate(CountMinSketch::key(0, id));
        assert!((e - c) as f64 <= 0.01 * c as f64 + 2.0, "id {id}: {e} vs {c}");
    }
}

#[test]
fn tiered_with_a_sketch_picks_the_exact_hot_set_on_skewed_ids() {
    let sizes = [100_000u64];
    let work = workload(&sizes, 40, 400);
    let p = params(0, 1, &sizes, SparseOptimizerKind::Sgd);
    let exact_cfg =
        StoreConfig { kind: StoreKind::Tiered, hot_rows: 50, warmup: 40, flush_every: 100, ..StoreConfig::default() };
    let sketch_cfg = StoreConfig { freq_source: FrequencySource::Sketch, sketch_width: 1 << 16, ..exact_cfg.clone() };
    let (mut exact, mut sketched) = (TieredStore::new(&exact_cfg, &p), TieredStore::new(&sketch_cfg, &p));
    run(&mut exact, &work);
    run(&mut sketched, &work);
    let a: std::collections::BTreeSet<_> = exact.hot_ids().into_iter().collect();
    let b: std::collections::BTreeSet<_> = sketched.hot_ids().into_iter().collect();
    assert_eq!(a.len(), 50);
    assert!(a.intersection(&b).count() >= 48, "{} of 50", a.intersection(&b).count());
}

#[test]
fn dynamic_and_tiered_checkpoints_round_trip_across_worker_counts() {
    let sizes = [700u64, 50];
    let work = workload(&sizes, 15, 40);
    for kind in [StoreKind::Dynamic, StoreKind::Tiered] {
        let cfg = config(kind);
        let mut two: Vec<Store> =
            (0..2).map(|k| Store::new(&cfg, &params(k, 2, &sizes, SparseOptimizerKind::LazyAdam)).unwrap()).collect();
        for (k, store) in two.iter_mut().enumerate() {
            let mine: Vec<Vec<(usize, Vec<u64>)>> = work
                .iter()
                .map(|s| {
                    s.iter()
                        .map(|(t, ids)| (*t, ids.iter().copied().filter(|&id| shard_of(*t, id, 2) == k).collect()))
                        .collect()
                })
                .collect();
            run(store, &mine);
        }
        for w in [1usize, 2, 3] {
            let mut target: Vec<Store> = (0..w)
                .map(|k| Store::new(&cfg, &params(k, w, &sizes, SparseOptimizerKind::LazyAdam)).unwrap())
                .collect();
            for s in target.iter_mut() {
                s.reset(15);
            }
            let sw = two[0].state_width();
            for src in &two {
                for t in 0..sizes.len() {
                    let part = src.export_table(t);
                    for (i, &id) in part.ids.iter().enumerate() {
                        target[shard_of(t, id, w)]
                            .set_row(t, id, &part.rows[i * DIM..(i + 1) * DIM], &part.state[i * sw..(i + 1) * sw])
                            .unwrap();
                    }
                }
            }
            let total: usize = target.iter().map(|s| s.num_rows()).sum();
            assert_eq!(total, two.iter().map(|s| s.num_rows()).sum::<usize>());
            for t in 0..sizes.len() {
                for store in &target {
                    let part = store.export_table(t);
                    assert!(part.ids.windows(2).all(|p| p[0] < p[1]));
                    for (i, &id) in part.ids.iter().enumerate() {
                        let src = two[shard_of(t, id, 2)].export_table(t);
                        let j = src.ids.binary_search(&id).unwrap();
                        assert_eq!(&part.rows[i * DIM..(i + 1) * DIM], &src.rows[j * DIM..(j + 1) * DIM]);
                        assert_eq!(&part.state[i * sw..(i + 1) * sw], &src.state[j * sw..(j + 1) * sw]);
                    }
                }
            }
        }
        // Wrong owner or width is an error.
        let s = &mut two[0];
        assert!(s.set_row(0, 1, &[0.0; DIM], &[0.0; 9]).is_err());
        assert!(s.set_row(0, 0, &[0.0; 3], &[0.0; 9]).is_err());
        assert!(s.set_row(5, 0, &[0.0; DIM], &[0.0; 9]).is_err());
    }
}

/// Every store refuses a restored row with the same typed error, naming the table,
/// the row, the worker and the widths.
#[test]
fn a_row_restored_into_the_wrong_worker_is_a_typed_restore_error_in_every_store() {
    let sizes = [40u64, 9];
    let restore_error = |e: OperatorError| match e {
        OperatorError::Restore(r) => r,
        other => panic!("not a restore error: {other:?}"),
    };
    for kind in [StoreKind::Fixed, StoreKind::Dynamic, StoreKind::Tiered] {
        let mut store = Store::new(&config(kind), &params(1, 3, &sizes, SparseOptimizerKind::RowwiseAdagrad)).unwrap();
        let foreign = (0..9).find(|&id| shard_of(1, id, 3) != 1).unwrap();
        let own = (0..9).find(|&id| shard_of(1, id, 3) == 1).unwrap();
        let e = restore_error(store.set_row(1, foreign, &[0.0; DIM], &[0.0]).unwrap_err());
        assert_eq!(e, RestoreError::NotOwned { table: 1, id: foreign, worker: 1, workers: 3, rows: 9 }, "{kind:?}");
        let e = restore_error(store.set_row(1, 9, &[0.0; DIM], &[0.0]).unwrap_err());
        assert_eq!(e, RestoreError::NotOwned { table: 1, id: 9, worker: 1, workers: 3, rows: 9 }, "{kind:?}");
        let e = restore_error(store.set_row(1, own, &[0.0; 3], &[0.0; 2]).unwrap_err());
        let widths =
            RestoreError::RowWidths { table: 1, id: own, values: 3, slots: 2, expected_values: DIM, expected_slots: 1 };
        assert_eq!(e, widths, "{kind:?}");
        let e = restore_error(store.set_row(2, own, &[0.0; DIM], &[0.0]).unwrap_err());
        assert_eq!(e, RestoreError::NoSuchTable { table: 2 }, "{kind:?}");
        store.set_row(1, own, &[0.5; DIM], &[0.25]).unwrap();
    }
}

#[test]
fn bad_store_settings_name_the_key() {
    let bad = [
        (StoreConfig { kind: StoreKind::Dynamic, max_rows: Some(0), ..StoreConfig::default() }, "max_rows"),
        (StoreConfig { kind: StoreKind::Dynamic, admit_prob: Some(1.5), ..StoreConfig::default() }, "admit_prob"),
        (StoreConfig { kind: StoreKind::Dynamic, ttl_steps: Some(0), ..StoreConfig::default() }, "ttl_steps"),
        (StoreConfig { kind: StoreKind::Tiered, flush_every: 0, ..StoreConfig::default() }, "flush_every"),
        (StoreConfig { kind: StoreKind::Tiered, hot_rows: 0, ..StoreConfig::default() }, "hot_rows"),
        (StoreConfig { max_rows: Some(10), ..StoreConfig::default() }, "store"),
        (StoreConfig { kind: StoreKind::Tiered, freq_window: Some(5), ..StoreConfig::default() }, "freq_window"),
        (
            StoreConfig {
                kind: StoreKind::Tiered,
                freq_source: FrequencySource::Differential,
                freq_window: Some(0),
                ..StoreConfig::default()
            },
            "freq_window",
        ),
    ];
    for (cfg, key) in bad {
        match cfg.validate() {
            Err(OperatorError::Config(ConfigError { key: k, .. })) => assert_eq!(k, key),
            other => panic!("{key}: {other:?}"),
        }
    }
    assert_eq!("tiered".parse::<StoreKind>().unwrap(), StoreKind::Tiered);
    assert!("lru".parse::<StoreKind>().is_err());
    assert_eq!("differential".parse::<FrequencySource>().unwrap(), FrequencySource::Differential);
    assert!(
        matches!("exactly".parse::<FrequencySource>(), Err(OperatorError::Config(ConfigError { key, .. })) if key == "freq_source")
    );
}

/// The tiered store planned from differential-dataflow counts: every lookup
/// and row equals the fixed table's, and (no eviction, so the stream counts
/// are the rows' counts) every plan is the plan of the exact counts.
#[test]
fn tiered_planned_from_differential_counts_trains_the_fixed_model_with_the_exact_plans() {
    let sizes = [400u64, 90];
    let work = workload(&sizes, 30, 40);
    for optimizer in [SparseOptimizerKind::LazyAdam, SparseOptimizerKind::RowwiseAdagrad] {
        let p = params(0, 1, &sizes, optimizer);
        let exact_cfg =
            StoreConfig { kind: StoreKind::Tiered, hot_rows: 12, warmup: 2, flush_every: 1, ..StoreConfig::default() };
        let dd_cfg = StoreConfig { freq_source: FrequencySource::Differential, ..exact_cfg.clone() };
        let mut fixed = Store::new(&config(StoreKind::Fixed), &p).unwrap();
        let (mut exact, mut dd) = (TieredStore::new(&exact_cfg, &p), TieredStore::new(&dd_cfg, &p));
        for (s, step) in work.iter().enumerate() {
            let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
            for (t, ids) in step {
                fixed.gather(*t, ids, &mut a);
                exact.gather(*t, ids, &mut b);
                dd.gather(*t, ids, &mut c);
            }
            assert_eq!(c, a, "step {s}: lookups of the differential-planned store");
            assert_eq!(b, a);
            for (t, ids) in step {
                for &id in ids {
                    let g = grad(s as u64, *t, id);
                    fixed.apply(*t, id, &g);
                    exact.apply(*t, id, &g);
                    dd.apply(*t, id, &g);
                }
            }
            for store in [&mut fixed as &mut dyn EmbeddingStore, &mut exact, &mut dd] {
                store.end_step(s as u64 + 1);
            }
            assert_eq!(dd.hot_ids(), exact.hot_ids(), "step {s}: hot set");
        }
        assert_rows_match(&export_all(&dd, sizes.len()), &export_all(&fixed, sizes.len()), fixed.state_width());
        let st = dd.stats();
        assert!(st.hot_rows == 12 && st.replans == 29 && st.hot_hits > 0 && st.moves > 12, "{st:?}");
    }
}

/// A windowed differential source plans from the last `window` steps only:
/// each plan is the top-k of a from-scratch windowed count, the hot set
/// follows drifting ids, and values still equal a plain dynamic store's.
#[test]
fn a_windowed_differential_plan_is_the_top_k_of_the_last_steps() {
    let sizes = [400u64, 90];
    let window = 3;
    let cfg = StoreConfig {
        kind: StoreKind::Tiered,
        hot_rows: 12,
        warmup: 1,
        flush_every: 1,
        freq_source: FrequencySource::Differential,
        freq_window: Some(window),
        ..StoreConfig::default()
    };
    let p = params(0, 1, &sizes, SparseOptimizerKind::LazyAdam);
    let mut tiered = TieredStore::new(&cfg, &p);
    let mut plain = DynamicStore::new(&cfg, &p);
    let mut history: Vec<(crate::freq::RowKey, u64)> = Vec::new();
    let mut changed = 0;
    let mut last = Vec::new();
    for s in 0..40u64 {
        drifting_step(s, &sizes, &mut tiered, &mut plain, |t, id| history.push(((t as u32, id), s)));
        tiered.end_step(s + 1);
        plain.end_step(s + 1);
        let counts = crate::freq::counts_from_scratch(&history, s, Some(window));
        let mut all: Vec<(std::cmp::Reverse<i64>, u32, u64)> = plain
            .live_meta()
            .map(|m| (std::cmp::Reverse(counts.get(&(m.table, m.id)).copied().unwrap_or(0)), m.table, m.id))
            .filter(|p| p.0 .0 >= tiered::HOT_MIN_COUNT as i64)
            .collect();
        all.sort_unstable();
        let want: Vec<(usize, u64)> = all.iter().take(12).map(|&(_, t, id)| (t as usize, id)).collect();
        assert_eq!(tiered.hot_ids(), want, "step {s}: hot set");
        if tiered.hot_ids() != last {
            changed += 1;
        }
        last = tiered.hot_ids();
    }
    assert_eq!(values(export_all(&tiered, sizes.len())), values(export_all(&plain, sizes.len())));
    assert!(changed > 10, "the windowed hot set follows the drift ({changed} changes)");
}

/// A checkpoint of a tiered store carries each row's count and hot slot: a
/// store rebuilt from it (reset, set_row, set_frequency) has the same hot
/// tier and counts and goes on exactly as the original, for every frequency
/// source; the rebuilt store's export equals the original's.
#[test]
fn a_restored_tiered_store_keeps_its_hot_plan_and_frequencies() {
    let sizes = [400u64, 90];
    let work = workload(&sizes, 24, 40);
    for source in [FrequencySource::Exact, FrequencySource::Sketch, FrequencySource::Differential] {
        let cfg = StoreConfig {
            kind: StoreKind::Tiered,
            hot_rows: 12,
            warmup: 3,
            flush_every: 5,
            freq_source: source,
            sketch_width: 1 << 12,
            ..StoreConfig::default()
        };
        let p = params(0, 1, &sizes, SparseOptimizerKind::LazyAdam);
        let mut straight = TieredStore::new(&cfg, &p);
        let mut first = TieredStore::new(&cfg, &p);
        // 10 steps (the last plan at step 8), checkpoint, then 14 more.
        run(&mut first, &work[..10]);
        run(&mut straight, &work[..10]);
        let parts = export_all(&first, sizes.len());
        assert!(parts.iter().all(|t| t.counts.len() == t.ids.len() && t.hot.len() == t.ids.len()));
        assert_eq!(parts.iter().flat_map(|t| &t.hot).filter(|&&h| h != crate::snapshot::COLD).count(), 12);
        let mut resumed = TieredStore::new(&cfg, &p);
        resumed.reset(10);
        let sw = first.state_width();
        for (t, part) in parts.iter().enumerate() {
            for i in 0..part.ids.len() {
                super::restore_row(&mut resumed, t, part, i).unwrap();
            }
        }
        assert_eq!(export_all(&resumed, sizes.len()), parts, "{source:?}: the export before any step");
        // The rest of the run, step by step: same lookups, same hot tier after every step.
        for (s, step) in work.iter().enumerate().skip(10) {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for (t, ids) in step {
                straight.gather(*t, ids, &mut a);
                resumed.gather(*t, ids, &mut b);
            }
            assert_eq!(a, b);
            assert_eq!(resumed.hot_ids(), straight.hot_ids(), "{source:?}: step {s}");
            for (t, ids) in step {
                for &id in ids {
                    straight.apply(*t, id, &grad(s as u64, *t, id));
                    resumed.apply(*t, id, &grad(s as u64, *t, id));
                }
            }
            straight.end_step(s as u64 + 1);
            resumed.end_step(s as u64 + 1);
            assert_eq!(resumed.hot_ids(), straight.hot_ids(), "{source:?}: plan after step {s}");
        }
        assert_eq!(export_all(&resumed, sizes.len()), export_all(&straight, sizes.len()), "{source:?}");
        let (a, b) = (resumed.stats(), straight.stats());
        assert_eq!(a.hot_rows, b.hot_rows);
        assert!(b.replans >= 4);
        // Without frequencies (an old checkpoint) the same rows restore, all cold, counted once.
        let mut old = TieredStore::new(&cfg, &p);
        old.reset(10);
        for (t, part) in parts.iter().enumerate() {
            for (i, &id) in part.ids.iter().enumerate() {
                old.set_row(t, id, &part.rows[i * DIM..(i + 1) * DIM], &part.state[i * sw..(i + 1) * sw]).unwrap();
            }
        }
        assert_eq!(old.hot_len(), 0);
        assert!(export_all(&old, sizes.len()).iter().all(|t| t.counts.iter().all(|&c| c == 1)));
    }
}

/// The parts of one worker's tables, as [`crate::snapshot::apply_delta`] takes them.
fn as_part(tables: Vec<TableRows>, sw: usize, step: u64, delta_of: Option<u64>) -> crate::snapshot::WorkerSnapshot {
    crate::snapshot::WorkerSnapshot {
        worker: 0,
        workers: 1,
        step,
        dim: DIM,
        state_width: sw,
        dense_params: Vec::new(),
        dense_optimizer: crate::optim::DenseOptimizerState {
            kind: crate::optim::DenseOptimizerKind::Sgd,
            t: 0,
            offset: 0,
            len: 0,
            m: Vec::new(),
            v: Vec::new(),
        },
        tables,
        updated_only: false,
        delta_of,
        seed: 9,
        table_sizes: Vec::new(),
        admission: Default::default(),
    }
}

/// Every store: the export at a mark with the changes since applied onto it is
/// the export of now (values, optimizer state, counts and hot slots), through
/// evictions (dynamic) and re-plans (tiered); a second mark starts over.
#[test]
fn changes_since_a_mark_applied_onto_the_export_at_the_mark_give_the_export_of_now() {
    let sizes = [300u64, 37, 900];
    let work = workload(&sizes, 40, 30);
    let evicting = StoreConfig { max_rows: Some(120), ttl_steps: Some(6), ..config(StoreKind::Dynamic) };
    let replanning = StoreConfig { max_rows: Some(200), ..config(StoreKind::Tiered) };
    let expiring = StoreConfig { ttl_steps: Some(2), flush_every: 1, ..config(StoreKind::Tiered) };
    for cfg in [config(StoreKind::Fixed), evicting, replanning, expiring, config(StoreKind::Tiered)] {
        let p = params(0, 1, &sizes, SparseOptimizerKind::RowwiseAdagrad);
        let mut store = Store::new(&cfg, &p).unwrap();
        let sw = store.state_width();
        let mut chain = None;
        for (from, to) in [(0usize, 9usize), (9, 10), (10, 23), (23, 40)] {
            for (s, step) in work.iter().enumerate().take(to).skip(from) {
                for (t, ids) in step {
                    store.gather(*t, ids, &mut Vec::new());
                    for &id in ids {
                        store.apply(*t, id, &grad(s as u64, *t, id));
                    }
                }
                store.end_step(s as u64 + 1);
            }
            let now = export_all(&store, sizes.len());
            match chain.as_mut() {
                None => chain = Some(vec![as_part(now, sw, to as u64, None)]),
                Some(base) => {
                    let changes: Vec<TableRows> = (0..sizes.len()).map(|t| store.export_changes(t)).collect();
                    let changed: usize = changes.iter().map(|c| c.ids.len()).sum();
                    let held: usize = now.iter().map(|c| c.ids.len()).sum();
                    // One step changes few of the rows held.
                    assert!(to - from > 1 || changed < held / 2, "{:?}: a delta of {changed} rows of {held}", cfg.kind);
                    let delta = vec![as_part(changes, sw, to as u64, Some(base[0].step))];
                    crate::snapshot::apply_delta(base, delta).unwrap();
                    for (t, (got, want)) in base[0].tables.iter().zip(&now).enumerate() {
                        assert_eq!(got, want, "{:?}, table {t}, steps {from}..{to}", cfg.kind);
                    }
                }
            }
            store.mark_checkpoint();
        }
        let st = store.stats();
        match cfg.kind {
            StoreKind::Dynamic => assert!(st.evictions > 0, "{st:?}"),
            StoreKind::Tiered => assert!(st.replans > 2 && st.moves > 0, "{st:?}"),
            StoreKind::Fixed => {}
        }
        // Restoring the chain's result into a new store rebuilds the same state.
        let whole = chain.unwrap().remove(0).tables;
        let mut again = Store::new(&cfg, &p).unwrap();
        again.reset(40);
        for (t, rows) in whole.iter().enumerate() {
            for i in 0..rows.ids.len() {
                restore_row(&mut again, t, rows, i).unwrap();
            }
        }
        let strip = |tables: Vec<TableRows>| -> Vec<TableRows> {
            tables.into_iter().map(|t| TableRows { hot: Vec::new(), ..t }).collect()
        };
        assert_eq!(strip(export_all(&again, sizes.len())), strip(export_all(&store, sizes.len())), "{:?}", cfg.kind);
    }
}

/// The fixed store exports only the rows some update changed; a reset puts
/// exactly those back to their seeded values, so a compact checkpoint restored
/// into a trained store gives every row of the checkpointed one.
#[test]
fn the_fixed_store_exports_updated_rows_and_a_reset_reseeds_them() {
    let sizes = [500u64, 37];
    let work = workload(&sizes, 12, 20);
    let p = params(0, 1, &sizes, SparseOptimizerKind::LazyAdam);
    let mut trained = Store::new(&config(StoreKind::Fixed), &p).unwrap();
    run(&mut trained, &work[..6]);
    let compact = export_all(&trained, sizes.len());
    let Store::Fixed(f) = &trained else { unreachable!() };
    let full: Vec<TableRows> = (0..sizes.len()).map(|t| f.shard.export_table(t)).collect();
    let updated: usize = compact.iter().map(|t| t.ids.len()).sum();
    assert!(updated > 0 && updated < 537 / 2, "{updated} rows updated");
    // Train on, then restore the compact export: every row equals the full export.
    run(&mut trained, &work[6..]);
    trained.reset(6);
    let sw = trained.state_width();
    for (t, rows) in compact.iter().enumerate() {
        for (i, &id) in rows.ids.iter().enumerate() {
            trained.set_row(t, id, &rows.rows[i * DIM..(i + 1) * DIM], &rows.state[i * sw..(i + 1) * sw]).unwrap();
        }
    }
    let Store::Fixed(f) = &trained else { unreachable!() };
    for (t, want) in full.iter().enumerate() {
        assert_eq!(&f.shard.export_table(t), want, "table {t}");
    }
    assert_eq!(export_all(&trained, sizes.len()), compact);
}

/// A store restored from a checkpoint evicts and admits the rows the
/// uninterrupted store does: the checkpoint carries each row's count and
/// last-use step, which TTL eviction and the ties of LFU eviction read
/// (restored rows otherwise look used at the restore's step), and the
/// admission sketch's counters (ids seen but not yet admitted). The same
/// exports, counters and lookups.
#[test]
fn a_resumed_store_evicts_the_rows_the_uninterrupted_one_evicts() {
    let sizes = [300u64, 37, 900];
    let work = workload(&sizes, 40, 30);
    let evicting = StoreConfig { max_rows: Some(120), ttl_steps: Some(6), ..config(StoreKind::Dynamic) };
    let tiered = StoreConfig { max_rows: Some(150), ttl_steps: Some(7), ..config(StoreKind::Tiered) };
    let admitting = StoreConfig { admit_count: 3, sketch_width: 1 << 10, ..config(StoreKind::Dynamic) };
    let tiered_admitting = StoreConfig { admit_count: 2, sketch_width: 1 << 10, ..tiered };
    for cfg in [evicting, tiered, admitting, tiered_admitting] {
        let p = params(0, 1, &sizes, SparseOptimizerKind::RowwiseAdagrad);
        let (mut straight, mut first) = (Store::new(&cfg, &p).unwrap(), Store::new(&cfg, &p).unwrap());
        let at = 17;
        run(&mut straight, &work[..at]);
        run(&mut first, &work[..at]);
        let parts = export_all(&first, sizes.len());
        assert!(
            parts.iter().all(|t| t.last_seen.len() == t.ids.len()),
            "{:?}: the export has last-use steps",
            cfg.kind
        );
        let mut resumed = Store::new(&cfg, &p).unwrap();
        resumed.reset(at as u64);
        for (t, part) in parts.iter().enumerate() {
            for i in 0..part.ids.len() {
                restore_row(&mut resumed, t, part, i).unwrap();
            }
        }
        let admission = first.admission_counters();
        assert_eq!(admission.value.is_empty(), cfg.admit_count < 2, "{:?}: an admission sketch to keep", cfg.kind);
        resumed.set_admission_counters(&admission);
        let (before, admitted) = (straight.stats().evictions, straight.stats().admissions);
        for (s, step) in work.iter().enumerate().skip(at) {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for (t, ids) in step {
                straight.gather(*t, ids, &mut a);
                resumed.gather(*t, ids, &mut b);
            }
            assert_eq!(a, b, "{:?}: lookups of step {s}", cfg.kind);
            for (t, ids) in step {
                for &id in ids {
                    straight.apply(*t, id, &grad(s as u64, *t, id));
                    resumed.apply(*t, id, &grad(s as u64, *t, id));
                }
            }
            straight.end_step(s as u64 + 1);
            resumed.end_step(s as u64 + 1);
        }
        let (st, rs) = (straight.stats(), resumed.stats());
        if cfg.admit_count < 2 {
            assert!(st.evictions > before, "{:?}: rows are evicted after the restore", cfg.kind);
        } else {
            assert!(st.rejections > 0, "{:?}: ids wait for admission", cfg.kind);
        }
        assert_eq!(st.evictions - before, rs.evictions, "{:?}", cfg.kind);
        assert_eq!(st.admissions - admitted, rs.admissions, "{:?}", cfg.kind);
        assert_eq!(export_all(&resumed, sizes.len()), export_all(&straight, sizes.len()), "{:?}", cfg.kind);
    }
}

/// A sketch tracking changes lists, after a mark, exactly the counters that grew
/// since, with their values now; counters cleared, halved or replaced since the
/// mark make it give none (the whole sketch must travel) until the next mark. The
/// dynamic store's admission sketch tracks its changes, and a checkpoint mark
/// restarts them.
#[test]
fn a_tracking_sketch_lists_the_counters_that_grew_since_its_mark() {
    let mut sketch = CountMinSketch::new(64, 4, 5).track_changes();
    assert!(CountMinSketch::new(64, 4, 5).changes().is_none(), "not tracking");
    for key in 0..40u64 {
        sketch.add(key % 13);
    }
    sketch.mark();
    assert_eq!(sketch.changes().unwrap().index, Vec::<u32>::new(), "nothing since the mark");
    let before = sketch.counters().to_vec();
    for key in [3u64, 3, 90, 91, 3] {
        sketch.add(key);
    }
    sketch.add_n(7, 4);
    let changes = sketch.changes().unwrap();
    let grew: Vec<u32> = (0..before.len()).filter(|&c| sketch.counters()[c] != before[c]).map(|c| c as u32).collect();
    assert!(!grew.is_empty() && changes.changes_only && changes.len == before.len());
    assert_eq!(changes.index, grew, "exactly the counters that grew");
    assert!(changes.index.iter().zip(&changes.value).all(|(&c, &v)| sketch.counters()[c as usize] == v));
    let mut laid = SketchCounters::from_dense(&before);
    laid.overlay(&changes);
    assert_eq!(laid, SketchCounters::from_dense(sketch.counters()), "laid over the mark's counters: now's");
    let replace = |s: &mut CountMinSketch| assert!(s.set_counters(&SketchCounters::from_dense(&before)));
    let rewrites: [&dyn Fn(&mut CountMinSketch); 3] = [&CountMinSketch::halve, &CountMinSketch::clear, &replace];
    for rewrite in rewrites {
        let mut s = sketch.clone();
        rewrite(&mut s);
        assert!(s.changes().is_none(), "lowered counters travel whole");
        s.mark();
        assert!(s.changes().is_some_and(|c| c.index.is_empty()), "until the next mark");
    }
    let cfg = StoreConfig { kind: StoreKind::Dynamic, admit_count: 3, ..StoreConfig::default() };
    let mut store = DynamicStore::new(&cfg, &params(0, 1, &[1000], SparseOptimizerKind::Sgd));
    let mut out = Vec::new();
    store.gather(0, &[5, 6], &mut out);
    store.apply(0, 5, &[1.0; DIM]);
    assert!(store.admission_changes().is_some_and(|c| !c.index.is_empty()), "sightings since the start");
    store.mark_checkpoint();
    assert!(store.admission_changes().is_some_and(|c| c.index.is_empty()), "none since the mark");
    store.apply(0, 6, &[1.0; DIM]);
    assert!(store.admission_changes().is_some_and(|c| !c.index.is_empty()));
    assert!(FixedStore::new(
        EmbeddingShard::new(0, 1, DIM, &[10], 1, SparseOptimizerKind::Sgd, OptimizerParams::with_lr(0.1)).unwrap()
    )
    .admission_changes()
    .is_none());
}

/// The sum of squares (a run's `params_l2`) is a function of the rows held, not of the
/// order they came in: a resumed store inserts its rows in id order, a running one in the
/// order it met them.
#[test]
fn the_sum_of_squares_does_not_depend_on_the_order_rows_came_in() {
    let sizes = [1u64 << 40];
    let ids: Vec<u64> = (0..20_000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 24).collect();
    let value = |id: u64| [(id % 997) as f32 * 1e-3, 1.0 + (id % 13) as f32, 1e-4 * (id % 7) as f32, 3.0e3];
    for kind in [StoreKind::Dynamic, StoreKind::Tiered] {
        let sums: Vec<u64> = [false, true]
            .into_iter()
            .map(|reversed| {
                let mut store =
                    Store::new(&config(kind), &params(0, 1, &sizes, SparseOptimizerKind::RowwiseAdagrad)).unwrap();
                let order: Vec<u64> = if reversed { ids.iter().rev().copied().collect() } else { ids.clone() };
                for id in order {
                    store.set_row(0, id, &value(id), &[0.0]).unwrap();
                }
                store.sum_of_squares().to_bits()
            })
            .collect();
        assert_eq!(sums[0], sums[1], "{kind:?}");
    }
}

/// [`FiniteApply::apply_finite`] of whichever CPU store `store` is.
fn apply_finite(store: &mut Store, table: usize, id: u64, grad: &[f32]) -> bool {
    match store {
        Store::Fixed(s) => s.apply_finite(table, id, grad),
        Store::Dynamic(s) => s.apply_finite(table, id, grad),
        Store::Tiered(s) => s.apply_finite(table, id, grad),
        Store::Device(_) => unreachable!("the tests build CPU stores"),
    }
}

/// [`run`]'s workload through the checked update, each finite update asserted to report so.
fn run_checked(store: &mut Store, work: &[Vec<(usize, Vec<u64>)>]) {
    let mut seen = Vec::new();
    for (s, step) in work.iter().enumerate() {
        for (t, ids) in step {
            store.gather(*t, ids, &mut seen);
        }
        for (t, ids) in step {
            for &id in ids {
                assert!(apply_finite(store, *t, id, &grad(s as u64, *t, id)), "step {s}: row {id} of table {t}");
            }
        }
        store.end_step(s as u64 + 1);
    }
}

/// A row of table 0 of `store` in the hot tier and one outside it (any row
/// when the store has no tiers), both updated by the workload.
fn hot_and_cold_rows(store: &Store) -> (u64, u64) {
    let rows = store.export_table(0);
    let tier = |i: usize| rows.hot.get(i).copied();
    let hot = (0..rows.ids.len()).find(|&i| tier(i).is_none_or(|h| h != crate::snapshot::COLD));
    let cold = (0..rows.ids.len()).rev().find(|&i| tier(i).is_none_or(|h| h == crate::snapshot::COLD));
    (rows.ids[hot.expect("a hot row")], rows.ids[cold.expect("a cold row")])
}

/// Every CPU store's checked update writes exactly the values of `apply`, bit for bit.
#[test]
fn a_checked_update_writes_the_values_of_apply() {
    let sizes = [500u64, 37, 2000];
    let work = workload(&sizes, 12, 40);
    for optimizer in [SparseOptimizerKind::Sgd, SparseOptimizerKind::RowwiseAdagrad, SparseOptimizerKind::LazyAdam] {
        let p = params(0, 1, &sizes, optimizer);
        for kind in [StoreKind::Fixed, StoreKind::Dynamic, StoreKind::Tiered] {
            let (mut plain, mut checked) =
                (Store::new(&config(kind), &p).unwrap(), Store::new(&config(kind), &p).unwrap());
            run(&mut plain, &work);
            run_checked(&mut checked, &work);
            assert_eq!(export_all(&checked, sizes.len()), export_all(&plain, sizes.len()), "{kind:?}/{optimizer:?}");
        }
    }
}

/// A finite gradient that the learning rate turns into an infinite row is
/// reported by every CPU store, in either tier; the next finite update of
/// another row reports a finite row again.
#[test]
fn a_checked_update_reports_a_row_that_a_finite_gradient_made_infinite() {
    let sizes = [500u64, 37, 2000];
    let work = workload(&sizes, 12, 40);
    let p = params(0, 1, &sizes, SparseOptimizerKind::Sgd);
    for kind in [StoreKind::Fixed, StoreKind::Dynamic, StoreKind::Tiered] {
        let mut store = Store::new(&config(kind), &p).unwrap();
        run_checked(&mut store, &work);
        if kind == StoreKind::Tiered {
            assert!(store.stats().hot_rows > 0, "the workload fills the hot tier");
        }
        let (hot, cold) = hot_and_cold_rows(&store);
        assert_ne!(hot, cold);
        // SGD at learning rate 4: w − 4 · f32::MAX overflows.
        store.set_lr(4.0);
        let huge = [f32::MAX, 0.0, 0.0, 0.0];
        for id in [hot, cold] {
            assert!(!apply_finite(&mut store, 0, id, &huge), "{kind:?}: row {id}");
            let rows = store.export_table(0);
            let i = rows.ids.binary_search(&id).unwrap();
            assert!(rows.rows[i * DIM].is_infinite(), "{kind:?}: row {id} holds the update");
        }
        let finite_id = (0..500).find(|&id| id != hot && id != cold).unwrap();
        assert!(apply_finite(&mut store, 0, finite_id, &[1e-3; DIM]), "{kind:?}");
    }
}

/// Row-wise Adagrad whose accumulator a finite gradient overflows leaves the
/// row finite (its step becomes 0): the dynamic and tiered stores, which read
/// the optimizer state, report it, in either tier.
#[test]
fn a_checked_update_reports_an_optimizer_state_that_overflowed() {
    let sizes = [500u64, 37, 2000];
    let work = workload(&sizes, 12, 40);
    let p = params(0, 1, &sizes, SparseOptimizerKind::RowwiseAdagrad);
    for kind in [StoreKind::Fixed, StoreKind::Dynamic, StoreKind::Tiered] {
        let mut store = Store::new(&config(kind), &p).unwrap();
        run_checked(&mut store, &work);
        let (hot, cold) = hot_and_cold_rows(&store);
        for id in [hot, cold] {
            assert!(!apply_finite(&mut store, 0, id, &[3e38; DIM]), "{kind:?}: row {id}");
            let rows = store.export_table(0);
            let i = rows.ids.binary_search(&id).unwrap();
            assert!(rows.rows[i * DIM..(i + 1) * DIM].iter().all(|v| v.is_finite()), "{kind:?}: the row stays finite");
            assert!(rows.state[i].is_infinite(), "{kind:?}: the accumulator overflowed");
        }
    }
}
