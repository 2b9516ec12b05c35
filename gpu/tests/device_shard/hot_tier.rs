//! The tiered store with its hot tier on a GPU worker's device
//! (`tiderec_gpu::device_hot_tier`) against the CPU's tiered store of the
//! same worker: the same hot tier after every step (re-plans move rows in and
//! out of it), the same rows served (normwise 1e-5: hot rows are updated on
//! the device), the same checkpoint exports (ids, counts and hot slots
//! exactly; values normwise 1e-5), and a checkpoint of the CPU's store
//! restored into a device tier going on as the CPU's store; under SGD and
//! row-wise Adagrad, on one worker and as worker 1 of 2.

use crate::common::{assert_close, device, normal};
use tiderec_gpu::device_hot_tier::{device_tiered_store, supports, DeviceHotTier};
use tiderec_operators::nn::{DlrmConfig, ModelConfig};
use tiderec_operators::optim::SparseOptimizerKind;
use tiderec_operators::shard::shard_of;
use tiderec_operators::snapshot::TableRows;
use tiderec_operators::store::{
    DeviceStore, EmbeddingStore, OffloadedTieredStore, StoreConfig, StoreKind, TieredStore,
};

/// A tiered store with its hot tier on the device.
type OnDevice = OffloadedTieredStore<DeviceHotTier>;
use tiderec_operators::train::TrainerConfig;

const SIZES: [u64; 3] = [500, 3, 2000];
const DIM: usize = 8;

fn config(kind: SparseOptimizerKind) -> TrainerConfig {
    let model = ModelConfig::Dlrm(DlrmConfig {
        num_dense: 3,
        num_sparse: SIZES.len(),
        dim: DIM,
        bottom: vec![DIM],
        top: vec![4, 1],
        self_interaction: false,
    });
    let store =
        StoreConfig { kind: StoreKind::Tiered, hot_rows: 40, warmup: 2, flush_every: 3, ..StoreConfig::default() };
    let mut c =
        TrainerConfig::builder(model, SIZES.to_vec()).seed(5).sparse_optimizer(kind).sparse_lr(0.1).build().unwrap();
    c.store = store;
    c
}

fn cpu(c: &TrainerConfig, at: (usize, usize)) -> TieredStore {
    TieredStore::new(&c.store, &c.store_params(at))
}

/// Step `s`'s distinct ids of table `t` that worker `me` of `workers` owns, skewed towards small ids.
fn ids(t: usize, s: u64, (me, workers): (usize, usize)) -> Vec<u64> {
    let n = SIZES[t];
    let mut ids: Vec<u64> = (0..60u64)
        .map(|k| {
            let u = tiderec_operators::rng::unit_f64(3, s * 31 + t as u64, k, 0);
            ((n as f64).powf(u) as u64).saturating_sub(1).min(n - 1)
        })
        .filter(|&id| shard_of(t, id, workers) == me)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Asserts two exports list the same rows, counts and hot slots, with values within 1e-5.
fn assert_same_export(what: &str, got: &TableRows, want: &TableRows) {
    assert_eq!((&got.ids, &got.counts, &got.hot), (&want.ids, &want.counts, &want.hot), "{what}: rows");
    assert_close(&format!("{what}: values"), &got.rows, &want.rows);
    assert_close(&format!("{what}: state"), &got.state, &want.state);
}

/// One step on both at a learning rate that falls with the step (a schedule's, as the
/// trainer sets it before each step): lookups compared, the same updates, maintenance;
/// the hot tiers compared.
fn step(what: &str, (gpu, host): (&mut OnDevice, &mut TieredStore), s: u64, at: (usize, usize)) {
    let lr = 0.1 / (s + 1) as f32;
    gpu.set_lr(lr);
    host.set_lr(lr);
    let (mut rows, mut grads) = (Vec::new(), Vec::new());
    // Every table's rows at once on the device (as the owner asks for a request's rows), one by one on the CPU.
    let all: Vec<Vec<u64>> = (0..SIZES.len()).map(|t| ids(t, s, at)).collect();
    let lookups: Vec<(usize, &[u64])> = all.iter().enumerate().map(|(t, ids)| (t, &ids[..])).collect();
    let (mut got, mut want) = (Vec::new(), Vec::new());
    gpu.gather_many(&lookups, &mut got);
    for &(t, ids) in &lookups {
        host.gather(t, ids, &mut want);
    }
    assert_close(&format!("{what}: rows served in step {s}"), &got, &want);
    for (t, ids) in all.iter().enumerate() {
        let g = normal(s * 7 + t as u64, ids.len() * DIM);
        for (k, &id) in ids.iter().enumerate() {
            host.apply(t, id, &g[k * DIM..(k + 1) * DIM]);
            rows.push((t as u32, id));
        }
        grads.extend_from_slice(&g);
    }
    gpu.apply_rows(&rows, &grads);
    gpu.end_step(s + 1);
    host.end_step(s + 1);
    assert_eq!(gpu.take_error(), None, "{what}: step {s}");
    assert_eq!(gpu.hot_ids(), host.hot_ids(), "{what}: the hot tier after step {s}");
}

/// The configurations of this test keep their hot tier on the device (checked
/// without a GPU, so that the GPU run meets no configuration error).
#[test]
fn the_configurations_here_keep_their_hot_tier_on_the_device() {
    for kind in [SparseOptimizerKind::Sgd, SparseOptimizerKind::RowwiseAdagrad] {
        let c = config(kind);
        c.store.validate().unwrap();
        assert_eq!(supports(&c), Ok(()), "{kind}");
    }
    assert!(supports(&config(SparseOptimizerKind::LazyAdam)).is_err());
}

#[test]
fn a_hot_tier_on_the_device_trains_as_the_cpu_tiered_store() {
    let Some(dev) = device() else { return };
    for kind in [SparseOptimizerKind::Sgd, SparseOptimizerKind::RowwiseAdagrad] {
        let c = config(kind);
        assert_eq!(supports(&c), Ok(()));
        for at in [(0, 1), (1, 2)] {
            let what = format!("{kind} rows, worker {} of {}", at.0, at.1);
            let mut gpu = device_tiered_store(&dev, &c, at).unwrap();
            let mut host = cpu(&c, at);
            for s in 0..14u64 {
                step(&what, (&mut gpu, &mut host), s, at);
                if s % 4 == 3 {
                    for t in 0..SIZES.len() {
                        let w = format!("{what}: table {t} after step {s}");
                        assert_same_export(&format!("{w}, changes"), &gpu.export_changes(t), &host.export_changes(t));
                        assert_same_export(&w, &gpu.export_table(t), &host.export_table(t));
                    }
                    gpu.mark_checkpoint();
                    host.mark_checkpoint();
                }
            }
            let (g, h) = (gpu.stats(), host.stats());
            assert_eq!(g, h, "{what}: counters");
            assert!(h.replans >= 4 && h.moves > 0 && h.hot_hits > 0, "{what}: {h:?}");
            let (g, h) = (gpu.sum_of_squares(), host.sum_of_squares());
            assert!((g - h).abs() <= 1e-5 * h, "{what}: Σ squares {g} vs {h}");
            // The CPU's checkpoint restored into a fresh device tier goes on as the CPU's store.
            let parts: Vec<TableRows> = (0..SIZES.len()).map(|t| host.export_table(t)).collect();
            let mut resumed = device_tiered_store(&dev, &c, at).unwrap();
            resumed.reset(14);
            for (t, part) in parts.iter().enumerate() {
                for i in 0..part.ids.len() {
                    tiderec_operators::store::restore_row(&mut resumed, t, part, i).unwrap();
                }
            }
            for s in 14..20u64 {
                step(&format!("{what}, resumed"), (&mut resumed, &mut host), s, at);
            }
            for t in 0..SIZES.len() {
                assert_same_export(
                    &format!("{what}, resumed: table {t}"),
                    &resumed.export_table(t),
                    &host.export_table(t),
                );
            }
        }
    }
}
