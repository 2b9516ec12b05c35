//! The rows a GPU worker among several owns, on its device
//! (`tiderec_gpu::device_shard::DeviceShard`), against the CPU's fixed store
//! of the same worker: the same rows served bit for bit, the same rows after
//! batched updates under SGD and row-wise Adagrad (normwise 1e-5), the same
//! checkpoint exports (updated rows, then the changes since a mark), a restore
//! (rows written, sent up together) and a reset to the seeded rows; an id the
//! worker does not own, or past its table, is recorded as a failure naming it
//! and changes nothing. The tiered store's hot tier on the device is checked
//! against the CPU's tiered store in `hot_tier` (one test executable for both).

mod common;
#[path = "device_shard/hot_tier.rs"]
mod hot_tier;

use common::{assert_close, device, normal};
use tiderec_gpu::device_shard::DeviceShard;
use tiderec_operators::nn::{DlrmConfig, ModelConfig};
use tiderec_operators::optim::SparseOptimizerKind;
use tiderec_operators::shard::{shard_of, EmbeddingShard};
use tiderec_operators::store::{DeviceStore, EmbeddingStore, FixedStore};
use tiderec_operators::train::TrainerConfig;

const SIZES: [u64; 4] = [97, 1, 1000, 13];

fn config(kind: SparseOptimizerKind) -> TrainerConfig {
    let model = ModelConfig::Dlrm(DlrmConfig {
        num_dense: 3,
        num_sparse: SIZES.len(),
        dim: 8,
        bottom: vec![8],
        top: vec![4, 1],
        self_interaction: false,
    });
    TrainerConfig::builder(model, SIZES.to_vec()).seed(5).sparse_optimizer(kind).sparse_lr(0.1).build().unwrap()
}

fn cpu(c: &TrainerConfig, (me, workers): (usize, usize)) -> FixedStore {
    let shard = EmbeddingShard::new(me, workers, 8, &c.table_sizes, c.seed, c.sparse_optimizer, c.sparse_hp);
    FixedStore::new(shard.unwrap())
}

/// The ids of every table worker `me` of `workers` owns, a few times over in an odd order.
fn owned(me: usize, workers: usize, step: u64) -> Vec<(u32, u64)> {
    let mut rows = Vec::new();
    for (t, &n) in SIZES.iter().enumerate() {
        for id in (0..n).filter(|&id| shard_of(t, id, workers) == me) {
            if !(id * 7 + step * 3 + t as u64).is_multiple_of(4) {
                rows.push((t as u32, id));
            }
        }
    }
    rows.reverse();
    rows
}

/// The configurations of these tests keep their rows on the device (checked
/// without a GPU, so that the GPU run meets no configuration error).
#[test]
fn the_configurations_here_keep_their_rows_on_the_device() {
    for kind in [SparseOptimizerKind::Sgd, SparseOptimizerKind::RowwiseAdagrad] {
        for workers in 1..=3 {
            assert_eq!(DeviceShard::supports(&config(kind), workers), Ok(()), "{kind}, {workers} workers");
        }
    }
}

#[test]
fn a_worker_s_rows_on_the_device_train_as_its_fixed_store() {
    let Some(dev) = device() else { return };
    for kind in [SparseOptimizerKind::Sgd, SparseOptimizerKind::RowwiseAdagrad] {
        let c = config(kind);
        for (me, workers) in [(0, 1), (1, 2), (2, 3)] {
            let what = format!("{kind} worker {me} of {workers}");
            let mut gpu = DeviceShard::new(&dev, &c, (me, workers)).unwrap();
            let mut host = cpu(&c, (me, workers));
            for step in 0..4u64 {
                let rows = owned(me, workers, step);
                let grads = normal(step, rows.len() * 8);
                let lr = 0.1 / (step + 1) as f32;
                gpu.set_lr(lr);
                host.set_lr(lr);
                gpu.apply_rows(&rows, &grads);
                for (k, &(t, id)) in rows.iter().enumerate() {
                    host.apply(t as usize, id, &grads[k * 8..(k + 1) * 8]);
                }
                assert_eq!(gpu.take_error(), None, "{what}");
                if step == 1 {
                    host.mark_checkpoint();
                    gpu.mark_checkpoint();
                }
            }
            for (t, &size) in SIZES.iter().enumerate() {
                let ids: Vec<u64> = (0..size).filter(|&id| shard_of(t, id, workers) == me).collect();
                let (mut got, mut want) = (Vec::new(), Vec::new());
                gpu.gather(t, &ids, &mut got);
                host.gather(t, &ids, &mut want);
                assert_close(&format!("{what}: table {t}"), &got, &want);
                let exports =
                    [(gpu.export_table(t), host.export_table(t)), (gpu.export_changes(t), host.export_changes(t))];
                for (g, h) in exports {
                    assert_eq!(g.ids, h.ids, "{what}: table {t}'s rows exported");
                    assert_close(&format!("{what}: table {t} exported"), &g.rows, &h.rows);
                    assert_close(&format!("{what}: table {t}'s state"), &g.state, &h.state);
                }
            }
            // Every table's rows at once (one request's lookups, some repeated), bit for bit as one by one.
            let ids: Vec<Vec<u64>> = (0..SIZES.len())
                .map(|t| {
                    owned(me, workers, 9).into_iter().filter(|&(u, _)| u as usize == t).map(|(_, id)| id).collect()
                })
                .collect();
            let lookups: Vec<(usize, &[u64])> = ids.iter().enumerate().map(|(t, ids)| (t, &ids[..])).collect();
            let (mut together, mut apart) = (Vec::new(), Vec::new());
            gpu.gather_many(&lookups, &mut together);
            for &(t, ids) in lookups.iter().chain(&lookups[..1]) {
                gpu.gather(t, ids, &mut apart);
            }
            gpu.gather_many(&lookups[..1], &mut together);
            assert_eq!(together, apart, "{what}: every table's rows at once");
            let (g, h) = (gpu.sum_of_squares(), host.sum_of_squares());
            assert!((g - h).abs() <= 1e-5 * h, "{what}: Σ squares {g} vs {h}");
            assert_eq!(gpu.num_rows(), host.num_rows(), "{what}: rows counted as the fixed store counts them");
            assert_eq!(gpu.stats().hot_rows, host.stats().hot_rows, "{what}: rows reported");
        }
    }
}

#[test]
fn a_restore_and_a_reset_reach_the_device() {
    let Some(dev) = device() else { return };
    let c = config(SparseOptimizerKind::RowwiseAdagrad);
    let (me, workers) = (1, 2);
    let mut gpu = DeviceShard::new(&dev, &c, (me, workers)).unwrap();
    let fresh = cpu(&c, (me, workers));
    let ids: Vec<u64> = (0..SIZES[2]).filter(|&id| shard_of(2, id, workers) == me).collect();
    // Rows written twice keep the second values; the rows go up before the next read.
    for (k, &id) in ids.iter().enumerate().filter(|(k, _)| k % 3 == 0) {
        gpu.set_row(2, id, &[k as f32; 8], &[0.5]).unwrap();
        gpu.set_row(2, id, &[-(k as f32); 8], &[k as f32]).unwrap();
    }
    let exported = gpu.export_table(2);
    let want: Vec<u64> = ids.iter().enumerate().filter(|(k, _)| k % 3 == 0).map(|(_, &id)| id).collect();
    assert_eq!(exported.ids, want, "the rows written, as updated");
    for (k, id) in exported.ids.iter().enumerate() {
        let at = ids.iter().position(|x| x == id).unwrap();
        assert_eq!(exported.rows[k * 8..(k + 1) * 8], [-(at as f32); 8], "row {id}");
        assert_eq!(exported.state[k], at as f32, "row {id}'s accumulator");
    }
    let mut served = Vec::new();
    gpu.gather(2, &ids[..4], &mut served);
    assert_eq!(served[..8], [0.0; 8], "the first row as written");
    gpu.reset(0);
    let (mut got, mut seeded) = (Vec::new(), Vec::new());
    gpu.gather(2, &ids, &mut got);
    let mut fresh = fresh;
    fresh.gather(2, &ids, &mut seeded);
    assert_eq!(got, seeded, "a reset gives the seeded rows back");
    assert!(gpu.export_table(2).ids.is_empty(), "and no row is updated");
    // The accumulators went back too: an update after the reset equals the fresh store's.
    let rows: Vec<(u32, u64)> = ids.iter().map(|&id| (2, id)).collect();
    let grads = normal(7, rows.len() * 8);
    gpu.apply_rows(&rows, &grads);
    for (k, &(t, id)) in rows.iter().enumerate() {
        fresh.apply(t as usize, id, &grads[k * 8..(k + 1) * 8]);
    }
    let (g, h) = (gpu.export_table(2), fresh.export_table(2));
    assert_eq!(g.ids, h.ids, "the rows updated after the reset");
    assert_close("rows updated after the reset", &g.rows, &h.rows);
    assert_close("accumulators after the reset", &g.state, &h.state);
    // Resets one after another, and a row written between two, before anything goes up:
    // every row seeded again, none updated.
    let fresh_rows = |store: &mut FixedStore| {
        store.reset(0);
        let mut rows = Vec::new();
        store.gather(2, &ids, &mut rows);
        rows
    };
    let seeded_again = fresh_rows(&mut fresh);
    assert_eq!(seeded_again, seeded, "the fixed store's reset");
    for between in [false, true] {
        gpu.apply_rows(&rows, &grads);
        gpu.reset(0);
        if between {
            gpu.set_row(2, ids[1], &[3.0; 8], &[2.0]).unwrap();
        }
        gpu.reset(0);
        let mut got = Vec::new();
        gpu.gather(2, &ids, &mut got);
        assert_eq!(got, seeded, "two resets (a row written between: {between})");
        assert!(gpu.export_table(2).ids.is_empty(), "no row updated (a row written between: {between})");
    }
    assert_eq!(gpu.take_error(), None);
}

#[test]
fn an_id_not_owned_here_is_a_failure_naming_it_and_changes_nothing() {
    let Some(dev) = device() else { return };
    let c = config(SparseOptimizerKind::Sgd);
    let mut gpu = DeviceShard::new(&dev, &c, (0, 2)).unwrap();
    let other = (0..SIZES[0]).find(|&id| shard_of(0, id, 2) == 1).unwrap();
    let mine = (0..SIZES[0]).find(|&id| shard_of(0, id, 2) == 0).unwrap();
    let mut before = Vec::new();
    gpu.gather(0, &[mine], &mut before);
    gpu.apply_rows(&[(0, mine), (0, other)], &[1.0; 16]);
    let e = gpu.take_error().expect("a failure");
    assert!(e.contains("CUDA device") && e.contains(&format!("row {other} is not owned by worker 0")), "{e}");
    let mut after = Vec::new();
    gpu.gather(0, &[mine], &mut after);
    assert_eq!(before, after, "nothing was updated");
    let mut out = vec![7.0];
    gpu.gather(0, &[SIZES[0]], &mut out);
    assert_eq!(out, [7.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], "zeros in place of the row");
    let e = gpu.take_error().expect("a failure");
    assert!(e.contains(&format!("id {} is not below {}", SIZES[0], SIZES[0])), "{e}");
    assert!(gpu.set_row(0, other, &[0.0; 8], &[]).is_err(), "a restore of a row owned elsewhere");
}
