//! Embedding-bag pooling and sparse row updates on the device against the
//! CPU (`nn::embedding_bag`, `optim::apply_row` through `EmbeddingShard`),
//! with empty bags, one-row batches, batch 65,536, many duplicate ids and one
//! row with 10,000 duplicates, its run split into chunks and summed by one
//! warp. Without a GPU every test prints why it skips.

mod common;

use common::{assert_close, below, device, get, normal, put, uniform};
use tiderec_gpu::nn::embedding_bag::{pool_backward, pool_forward, Bags, PoolShape, Pooling};
use tiderec_gpu::sparse::{HotRows, RowTable, SparseRule, CHUNK};
use tiderec_gpu::GpuError;
use tiderec_operators::nn::embedding_bag as cpu;
use tiderec_operators::optim::{OptimizerParams, SparseOptimizerKind};
use tiderec_operators::shard::EmbeddingShard;

/// Bags for `batch` samples over `num_unique` rows: sizes 0..=max_bag (every
/// fourth bag empty), ids drawn with many repeats.
fn bags(seed: u64, batch: usize, num_unique: usize, max_bag: usize) -> (Vec<u32>, Vec<u32>) {
    let mut offsets = vec![0u32];
    let mut index = Vec::new();
    for b in 0..batch {
        let n = if b % 4 == 1 { 0 } else { below(seed, b, max_bag + 1) };
        for k in 0..n {
            index.push(below(seed + 1, index.len() * 7 + k, num_unique) as u32);
        }
        offsets.push(index.len() as u32);
    }
    (offsets, index)
}

#[test]
fn pooling_and_its_gradient_match_the_cpu_for_sum_mean_and_weights() {
    let Some(dev) = device() else { return };
    for (batch, num_unique, dim, max_bag, field, num_fields) in [
        (1, 1, 4, 3, 0, 1),
        (9, 6, 5, 6, 2, 3),
        (257, 40, 16, 9, 1, 26),
        (33, 1000, 33, 1, 0, 2),
        (65_536, 100_000, 16, 3, 5, 26),
    ] {
        let (offsets, index) = bags(30 + batch as u64, batch, num_unique, max_bag);
        let entries = index.len();
        let mean: Vec<f32> = (0..batch)
            .flat_map(|b| {
                let n = (offsets[b + 1] - offsets[b]) as usize;
                std::iter::repeat_n(1.0 / n.max(1) as f32, n)
            })
            .collect();
        let weights = uniform(31, entries, -2.0, 2.0);
        let unique = normal(32, num_unique * dim);
        let dpooled = normal(33, batch * num_fields * dim);
        let start = normal(34, num_unique * dim);
        let (od, id, ud, gd) = (put(&dev, &offsets), put(&dev, &index), put(&dev, &unique), put(&dev, &dpooled));
        let wd = put(&dev, &weights);
        let shape = PoolShape { dim, field, num_fields, num_unique };
        let b = Bags { offsets: &od, index: &id, batch, entries };
        for (name, cpu_w, pooling) in [
            ("sum", None, Pooling::Sum),
            ("mean", Some(&mean[..]), Pooling::Mean),
            ("weighted", Some(&weights[..]), Pooling::Weighted(&wd)),
        ] {
            let what = format!("pool {name} b{batch} U{num_unique} d{dim} entries {entries}");
            // Forward: other fields' slots keep what was there.
            let fill = normal(35, batch * num_fields * dim);
            let mut want = fill.clone();
            cpu::pool_sum(&unique, dim, &offsets, &index, cpu_w, field, num_fields, &mut want);
            let mut pd = put(&dev, &fill);
            pool_forward(&dev, &ud, b, pooling, shape, &mut pd).unwrap();
            let got = get(&dev, &pd, want.len());
            assert_close(&format!("{what} pooled"), &got, &want);
            for s in 0..batch {
                if offsets[s] == offsets[s + 1] {
                    let row = (s * num_fields + field) * dim;
                    assert!(got[row..row + dim].iter().all(|&v| v == 0.0), "{what}: empty bag {s} pools to zero");
                }
            }
            // Backward adds into the row gradients.
            let mut want_du = start.clone();
            cpu::pool_sum_backward(&dpooled, dim, &offsets, &index, cpu_w, field, num_fields, &mut want_du);
            let mut dud = put(&dev, &start);
            pool_backward(&dev, &gd, b, pooling, shape, &mut dud).unwrap();
            assert_close(&format!("{what} dunique"), &get(&dev, &dud, want_du.len()), &want_du);
        }
    }
}

#[test]
fn pooling_rejects_bad_indices_and_offsets_without_touching_memory() {
    let Some(dev) = device() else { return };
    let unique = put(&dev, &normal(40, 3 * 4));
    let shape = PoolShape { dim: 4, field: 0, num_fields: 1, num_unique: 3 };
    let mut pooled = dev.zeros::<f32>(2 * 4).unwrap();
    let offsets = put(&dev, &[0u32, 2, 3]);
    let index = put(&dev, &[0u32, 7, 1]);
    let b = Bags { offsets: &offsets, index: &index, batch: 2, entries: 3 };
    let err = pool_forward(&dev, &unique, b, Pooling::Sum, shape, &mut pooled).unwrap_err();
    assert!(matches!(err, GpuError::Index { .. }), "{err:?}");
    assert!(err.to_string().contains("row 7 at position 1 is not below 3"), "{err}");
    let bad_offsets = put(&dev, &[0u32, 3, 2]);
    let index = put(&dev, &[0u32, 1, 2]);
    let b = Bags { offsets: &bad_offsets, index: &index, batch: 2, entries: 3 };
    let err = pool_forward(&dev, &unique, b, Pooling::Sum, shape, &mut pooled).unwrap_err();
    assert!(err.to_string().contains("bag 1"), "{err}");
}

/// The CPU owner's step: each row's gradients summed in entry order (the
/// first copied), scaled once, applied once through the CPU shard.
fn cpu_step(shard: &mut EmbeddingShard, ids: &[u32], grads: &[f32], dim: usize, scale: f32) {
    let mut order: Vec<u32> = Vec::new();
    let mut sums: std::collections::HashMap<u32, Vec<f32>> = std::collections::HashMap::new();
    for (k, &id) in ids.iter().enumerate() {
        let g = &grads[k * dim..(k + 1) * dim];
        match sums.get_mut(&id) {
            Some(s) => s.iter_mut().zip(g).for_each(|(a, &v)| *a += v),
            None => {
                order.push(id);
                sums.insert(id, g.to_vec());
            }
        }
    }
    for id in order {
        let mut g = sums.remove(&id).unwrap();
        g.iter_mut().for_each(|v| *v *= scale);
        shard.apply(0, id as u64, &g);
    }
}

/// `entries` ids with many duplicates: 70% among rows 0..5, the rest anywhere.
fn skewed_ids(step: u64, entries: usize, num_rows: usize) -> Vec<u32> {
    (0..entries)
        .map(|k| {
            let r = below(42 + step, k, 1000);
            (if r < 700 { r % 5 } else { below(43 + step, k, num_rows) }).min(num_rows - 1) as u32
        })
        .collect()
}

/// `entries` ids of which `hot` are row 3, spread through the others.
fn one_hot_row(step: u64, entries: usize, hot: usize, num_rows: usize) -> Vec<u32> {
    let every = entries as f64 / hot as f64;
    (0..entries)
        .map(|k| {
            let is_hot = ((k + 1) as f64 / every).floor() > (k as f64 / every).floor();
            if is_hot {
                3
            } else {
                below(47 + step, k, num_rows) as u32
            }
        })
        .collect()
}

#[test]
fn sparse_updates_with_many_duplicate_ids_match_the_cpu() {
    let Some(dev) = device() else { return };
    // Hot rows split at the default length, at the shortest, and summed by one warp.
    for hot_rows in [HotRows::default(), HotRows::Split { min_run: 2 * CHUNK }, HotRows::OneWarp] {
        sparse_updates_match_the_cpu(&dev, hot_rows);
    }
}

fn sparse_updates_match_the_cpu(dev: &tiderec_gpu::Device, hot_rows: HotRows) {
    let dev = dev.clone();
    // `hot`: 0 for skewed ids, else how many of the entries are one row.
    for (kind, num_rows, dim, entries, hot) in [
        (SparseOptimizerKind::Sgd, 50, 16, 4000, 0),
        (SparseOptimizerKind::RowwiseAdagrad, 50, 16, 4000, 0),
        (SparseOptimizerKind::RowwiseAdagrad, 1, 7, 1, 0),
        (SparseOptimizerKind::RowwiseAdagrad, 70_000, 33, 20_000, 0),
        (SparseOptimizerKind::Sgd, 300, 1, 9, 0),
        (SparseOptimizerKind::RowwiseAdagrad, 1000, 16, 12_000, 10_000),
        (SparseOptimizerKind::Sgd, 1000, 16, 12_000, 10_000),
    ] {
        let mut hp = OptimizerParams::with_lr(0.05);
        hp.initial_accumulator = 0.1;
        let mut shard = EmbeddingShard::new(0, 1, dim, &[num_rows as u64], 41, kind, hp).expect("the table fits");
        let start = shard.export_table(0);
        // SGD keeps no per-row state; the device table still has its (unused) column.
        let state = if start.state.is_empty() { vec![0.0; num_rows] } else { start.state.clone() };
        let mut table = RowTable::upload(&dev, &start.rows, &state, dim).unwrap();
        table.set_hot_rows(hot_rows).unwrap();
        let rule = match kind {
            SparseOptimizerKind::Sgd => SparseRule::Sgd { lr: hp.lr },
            _ => SparseRule::RowwiseAdagrad { lr: hp.lr, eps: hp.eps },
        };
        for step in 0..3u64 {
            let ids =
                if hot == 0 { skewed_ids(step, entries, num_rows) } else { one_hot_row(step, entries, hot, num_rows) };
            assert!(hot == 0 || ids.iter().filter(|&&i| i == 3).count() >= hot, "row 3 appears {hot} times at least");
            let grads = normal(44 + step, entries * dim);
            let scale = 1.0 / 64.0;
            cpu_step(&mut shard, &ids, &grads, dim, scale);
            let (idd, gd) = (put(&dev, &ids), put(&dev, &grads));
            table.apply(&dev, rule, &idd, &gd, entries, scale).unwrap();
            let want = shard.export_table(0);
            let what = format!("{kind:?} {hot_rows:?} rows {num_rows} d{dim} entries {entries} hot {hot} step {step}");
            assert_close(&format!("{what} rows"), &get(&dev, &table.rows, num_rows * dim), &want.rows);
            if kind == SparseOptimizerKind::RowwiseAdagrad {
                assert_close(&format!("{what} accumulators"), &get(&dev, &table.state, num_rows), &want.state);
            }
        }
    }
}

/// Ids with row `r` repeated `n` times for each `(r, n)` of `runs`, the rest of
/// the `entries` spread over the rows of `others`, all in a scrambled order.
fn runs_of(runs: &[(u32, usize)], entries: usize, others: std::ops::Range<usize>) -> Vec<u32> {
    let mut ids: Vec<u32> = runs.iter().flat_map(|&(r, n)| std::iter::repeat_n(r, n)).collect();
    for k in ids.len()..entries {
        ids.push((others.start + below(51, k, others.len())) as u32);
    }
    let mut keyed: Vec<(usize, u32)> = ids.into_iter().enumerate().map(|(k, id)| (below(52, k, 1 << 30), id)).collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, id)| id).collect()
}

#[test]
fn hot_rows_split_into_chunks_agree_with_one_warp_and_are_the_same_every_run() {
    let Some(dev) = device() else { return };
    let (num_rows, dim, entries) = (5_000, 16, 65_536);
    // Runs around the thresholds (one short of a split, the shortest split, two
    // chunks and one more) and one row holding most of the batch.
    let min_run = 2 * CHUNK;
    let runs = [(0u32, min_run - 1), (1, min_run), (2, 2 * CHUNK + 1), (3, 40_000), (4, 3 * CHUNK - 7)];
    let ids = runs_of(&runs, entries, runs.len()..num_rows);
    for (r, n) in runs {
        assert_eq!(ids.iter().filter(|&&i| i == r).count(), n, "row {r} appears {n} times");
    }
    let grads = normal(53, entries * dim);
    let (idd, gd) = (put(&dev, &ids), put(&dev, &grads));
    let start = normal(54, num_rows * dim);
    let rule = SparseRule::RowwiseAdagrad { lr: 0.05, eps: 1e-8 };
    let run = |hot_rows: HotRows| {
        let mut table = RowTable::upload(&dev, &start, &vec![0.1; num_rows], dim).unwrap();
        table.set_hot_rows(hot_rows).unwrap();
        for _ in 0..2 {
            table.apply(&dev, rule, &idd, &gd, entries, 1.0 / 1024.0).unwrap();
        }
        (get(&dev, &table.rows, num_rows * dim), get(&dev, &table.state, num_rows))
    };
    let split = HotRows::Split { min_run };
    let (rows, state) = run(split);
    assert_eq!(run(split), (rows.clone(), state.clone()), "a split update is the same on every run");
    let (serial_rows, serial_state) = run(HotRows::OneWarp);
    for (r, _) in runs {
        let row = r as usize * dim..(r as usize + 1) * dim;
        assert_close(&format!("row {r} split vs one warp"), &rows[row.clone()], &serial_rows[row]);
        assert_close(
            &format!("row {r}'s accumulator"),
            &state[r as usize..=r as usize],
            &serial_state[r as usize..=r as usize],
        );
    }
    assert_close("every row", &rows, &serial_rows);
    // Rows of short runs take the same path either way: equal bit for bit.
    let cold = runs.len() * dim;
    assert_eq!(rows[cold..], serial_rows[cold..], "rows below the split are summed as before");
}

/// The default split at its threshold (a run one short of `min_run` and one
/// exactly as long), a split run of the largest id (the last of the sorted
/// ids) and entries that are no whole number of chunks: with one warp per run
/// (nothing split) every row and accumulator is the CPU owner's step bit for
/// bit, as the kernels sum in its order; split, the two split rows agree with
/// it to rounding and every other row is the one-warp row bit for bit.
#[test]
fn split_runs_at_the_default_threshold_and_at_the_end_of_the_sorted_ids() {
    let Some(dev) = device() else { return };
    let HotRows::Split { min_run } = HotRows::default() else { panic!("the default splits hot rows") };
    let (num_rows, dim, entries) = (3_000usize, 8usize, 20_037usize);
    assert_ne!(entries % CHUNK, 0);
    let last = num_rows - 1;
    let runs = [(0u32, min_run - 1), (1, min_run), (last as u32, min_run + 3 * CHUNK + 5)];
    let ids = runs_of(&runs, entries, 2..last);
    let mut hp = OptimizerParams::with_lr(0.05);
    hp.initial_accumulator = 0.1;
    let kind = SparseOptimizerKind::RowwiseAdagrad;
    let mut shard = EmbeddingShard::new(0, 1, dim, &[num_rows as u64], 61, kind, hp).expect("the table fits");
    let start = shard.export_table(0);
    let grads = normal(56, entries * dim);
    let (idd, gd, scale) = (put(&dev, &ids), put(&dev, &grads), 1.0 / 256.0);
    let rule = SparseRule::RowwiseAdagrad { lr: hp.lr, eps: hp.eps };
    let run = |hot_rows: HotRows| {
        let mut table = RowTable::upload(&dev, &start.rows, &start.state, dim).unwrap();
        table.set_hot_rows(hot_rows).unwrap();
        for _ in 0..2 {
            table.apply(&dev, rule, &idd, &gd, entries, scale).unwrap();
        }
        (get(&dev, &table.rows, num_rows * dim), get(&dev, &table.state, num_rows))
    };
    for _ in 0..2 {
        cpu_step(&mut shard, &ids, &grads, dim, scale);
    }
    let want = shard.export_table(0);
    let (one_rows, one_state) = run(HotRows::OneWarp);
    assert!(one_rows == want.rows, "one warp per run: every row as the CPU's, bit for bit");
    assert!(one_state == want.state, "one warp per run: every accumulator as the CPU's, bit for bit");
    let (rows, state) = run(HotRows::default());
    assert_close("split rows vs the CPU", &rows, &want.rows);
    assert_close("split accumulators vs the CPU", &state, &want.state);
    for r in (0..num_rows).filter(|&r| r != 1 && r != last) {
        let at = r * dim..(r + 1) * dim;
        assert_eq!(rows[at.clone()], one_rows[at], "row {r} is not split: the same as one warp's");
        assert_eq!(state[r], one_state[r], "row {r}'s accumulator");
    }
}

#[test]
fn a_hot_row_split_shorter_than_two_chunks_is_refused() {
    let Some(dev) = device() else { return };
    let mut table = RowTable::upload(&dev, &[0.0; 8], &[0.0; 2], 4).unwrap();
    let err = table.set_hot_rows(HotRows::Split { min_run: 2 * CHUNK - 1 }).unwrap_err();
    assert!(err.to_string().contains("is not between"), "{err}");
    assert_eq!(table.hot_rows(), HotRows::default(), "the setting is unchanged");
}

#[test]
fn sparse_update_rejects_an_id_outside_the_table_before_changing_it() {
    let Some(dev) = device() else { return };
    let rows = normal(45, 4 * 3);
    let mut table = RowTable::upload(&dev, &rows, &[0.0; 4], 3).unwrap();
    let (ids, grads) = (put(&dev, &[1u32, 4, 1]), put(&dev, &normal(46, 9)));
    let err = table.apply(&dev, SparseRule::Sgd { lr: 0.1 }, &ids, &grads, 3, 1.0).unwrap_err();
    assert!(err.to_string().contains("row 4 at position 1 is not below 4"), "{err}");
    assert_eq!(get(&dev, &table.rows, 12), rows, "nothing was updated");
}
