//! One device-resident GPU worker (`tiderec_gpu::resident`) against one CPU
//! worker of the timely trainer: the same configuration, seed and batches give
//! the same losses and parameters, step after step.
//!
//! With plain SGD the loss of every step and the L2 norm of all parameters
//! (dense and embedding) after 50 steps agree within a relative 1e-4, for
//! every model the device path trains, on bags of several ids, empty bags and
//! mean-pooled (weighted) bags, at batch 1 and 65,536 and with one row
//! repeated 20,000 times (twice in each of 10,000 samples). Under the default adaptive optimizers two runs on
//! the GPU are equal bit for bit, and the difference to the CPU is printed.
//! A device checkpoint restores on a CPU worker with the same parameters, and
//! the rows a host mirror reads back (those trained since it last did) are the
//! checkpoint's rows bit for bit.
//! Steps staged ahead (the next batch built and uploaded while the device runs
//! the step before, a training or an evaluation step) equal steps taken one at a
//! time, bit for bit. A step whose
//! loss is not finite (the device skips its updates, the host does not wait for
//! the loss) changes nothing and does not count, staged or not. Steps replayed
//! as CUDA graphs equal steps launched kernel by kernel, bit for bit, through
//! new batch shapes, a non-finite loss, an evaluation and a restore. DIEN
//! (GRU and attention, or sum pooling) over behaviour sequences of every
//! length from none to its longest, on a batch whose sequences are all empty
//! too, trains as on one CPU worker, with and without CUDA graphs.

mod common;

use common::device;
use tiderec_gpu::resident::{ResidentStep, ResidentWorker};
use tiderec_operators::nn::{DienConfig, DlrmConfig, FmConfig, Interest, ModelConfig};
use tiderec_operators::optim::{DenseOptimizerKind, SparseOptimizerKind};
use tiderec_operators::rng::unit_f64;
use tiderec_operators::snapshot::WorkerSnapshot;
use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
use tiderec_operators::{Batch, SparseField};

const TOLERANCE: f64 = 1e-4;
const SIZES: [u64; 4] = [97, 1, 1000, 13];

fn models() -> Vec<(&'static str, ModelConfig)> {
    let fm = |dim, deep: Vec<usize>, fm, wide_only| {
        ModelConfig::Fm(FmConfig { num_dense: 3, num_sparse: SIZES.len(), dim, deep, fm, wide_only })
    };
    vec![
        (
            "dlrm",
            ModelConfig::Dlrm(DlrmConfig {
                num_dense: 3,
                num_sparse: SIZES.len(),
                dim: 8,
                bottom: vec![16, 8],
                top: vec![12, 1],
                self_interaction: false,
            }),
        ),
        ("lr", fm(0, vec![], true, 0)),
        ("fm", fm(6, vec![], true, 0)),
        ("deepfm", fm(6, vec![20, 10], true, 0)),
        ("wdl", fm(6, vec![20, 10], false, 2)),
    ]
}

fn config(model: ModelConfig, adaptive: bool) -> TrainerConfig {
    config_with(model, adaptive, Vec::new())
}

/// [`config`] with behaviour sequences over `sequence_tables` (the builder
/// checks them against the model, so they are given before it builds).
fn config_with(model: ModelConfig, adaptive: bool, sequence_tables: Vec<usize>) -> TrainerConfig {
    let mut b = TrainerConfig::builder(model, SIZES.to_vec()).seed(11).lr(0.05).sparse_lr(0.05);
    if !adaptive {
        b = b.dense_optimizer(DenseOptimizerKind::Sgd).sparse_optimizer(SparseOptimizerKind::Sgd);
    }
    b.sequence_tables(sequence_tables).build().unwrap()
}

/// Every configuration these tests train builds, and the device-resident
/// worker takes it (checked without a GPU, so that the GPU run meets no
/// configuration error).
#[test]
fn every_configuration_of_these_tests_is_one_the_resident_worker_takes() {
    for adaptive in [false, true] {
        for (name, model) in models() {
            let c = config(model, adaptive);
            assert_eq!(ResidentWorker::supports(&c), Ok(()), "{name}");
        }
        for (name, model) in dien_models() {
            let c = dien_config(model, adaptive);
            assert_eq!(ResidentWorker::supports(&c), Ok(()), "{name}");
        }
    }
}

/// Batch `step` of `n` samples: field 0 holds 0–3 ids per bag (some empty),
/// field 2 is mean-pooled, the others hold one id; with `hot`, every id of
/// field 2 is row 7.
fn batch(step: u64, n: usize, hot: bool) -> Batch {
    let mut b = Batch::new(3, SIZES.len());
    let u = |i: usize, what: u64, j: u64| unit_f64(step, i as u64, what, j);
    for i in 0..n {
        b.labels.push((u(i, 0, 0) < 0.3) as u8 as f32);
        b.dense.extend((0..3).map(|j| (u(i, 1, j) * 4.0 - 1.0) as f32));
        for (t, f) in b.sparse.iter_mut().enumerate() {
            let ids = if t == 0 { (u(i, 2, 0) * 4.0) as u64 } else { 1 + (t == 2) as u64 };
            for j in 0..ids {
                let id = if hot && t == 2 { 7 } else { (u(i, 3 + t as u64, j) * SIZES[t] as f64) as u64 };
                f.ids.push(id.min(SIZES[t] - 1));
            }
            if t == 2 {
                f.close_bag_mean();
            } else {
                f.close_bag();
            }
        }
    }
    b
}

/// Losses of each step and the final params L2 of one CPU worker.
fn cpu_run(config: &TrainerConfig, batches: &[Batch]) -> (Vec<f64>, f64) {
    let (config, batches) = (config.clone(), batches.to_vec());
    timely::execute_directly(move |worker| {
        let mut trainer = Trainer::new(worker, &config).unwrap();
        let losses = batches
            .iter()
            .map(|b| trainer.step(worker, StepKind::Train, b.clone()).unwrap().loss_sum)
            .collect::<Vec<_>>();
        (losses, trainer.params_l2(worker).unwrap())
    })
}

/// The same on the device.
fn gpu_run(dev: &tiderec_gpu::Device, config: &TrainerConfig, batches: &[Batch]) -> (Vec<f64>, f64) {
    let mut w = ResidentWorker::new(dev, config).unwrap();
    let losses = batches
        .iter()
        .map(|b| {
            let out = w.train(b, false).unwrap();
            assert!(!out.non_finite, "a non-finite value");
            out.loss_sum
        })
        .collect();
    (losses, w.sum_squares().unwrap().sqrt())
}

fn rel(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / b.abs().max(f64::MIN_POSITIVE)
    }
}

fn assert_same(what: &str, gpu: &(Vec<f64>, f64), cpu: &(Vec<f64>, f64)) {
    let worst = gpu.0.iter().zip(&cpu.0).map(|(&g, &c)| rel(g, c)).fold(0.0, f64::max);
    let l2 = rel(gpu.1, cpu.1);
    println!(
        "{what}: params L2 {:.9} vs CPU {:.9}: relative {l2:.2e}; largest loss difference {worst:.2e}",
        gpu.1, cpu.1
    );
    assert!(l2 <= TOLERANCE && worst <= TOLERANCE, "{what}: params L2 {l2:.2e}, loss {worst:.2e} > {TOLERANCE:e}");
}

#[test]
fn one_resident_worker_trains_as_one_cpu_worker() {
    let Some(dev) = device() else { return };
    let batches: Vec<Batch> = (0..50).map(|s| batch(s, if s == 3 { 1 } else { 64 }, false)).collect();
    for (name, model) in models() {
        let c = config(model.clone(), false);
        assert_same(&format!("{name}, sgd"), &gpu_run(&dev, &c, &batches), &cpu_run(&c, &batches));
        let c = config(model, true);
        let (a, b) = (gpu_run(&dev, &c, &batches), gpu_run(&dev, &c, &batches));
        assert_eq!(a, b, "{name}: two adaptive runs on the device differ");
        let cpu = cpu_run(&c, &batches);
        println!("{name}, adaptive: params L2 relative difference to the CPU {:.2e} (deterministic)", rel(a.1, cpu.1));
    }
}

/// The sequences' tables of [`dien_models`]: the tables of sparse fields 2 and 3.
const SEQUENCE_TABLES: [usize; 2] = [2, 3];

fn dien_models() -> Vec<(&'static str, ModelConfig)> {
    let dien = |interest| {
        ModelConfig::Dien(DienConfig {
            num_dense: 3,
            num_sparse: SIZES.len(),
            dim: 6,
            num_sequences: SEQUENCE_TABLES.len(),
            target_fields: SEQUENCE_TABLES.to_vec(),
            max_len: 7,
            interest,
            mlp: vec![20, 10],
        })
    };
    vec![("dien", dien(Interest::GruAttention)), ("dien-sum", dien(Interest::SumPooling))]
}

fn dien_config(model: ModelConfig, adaptive: bool) -> TrainerConfig {
    config_with(model, adaptive, SEQUENCE_TABLES.to_vec())
}

/// [`batch`] with two behaviour sequences over the tables of fields 2 and 3,
/// of lengths 0 to 7 (all empty with `empty`).
fn sequence_batch(step: u64, n: usize, empty: bool) -> Batch {
    let mut b = batch(step, n, false);
    b.sequences = vec![SparseField::new(), SparseField::new()];
    for i in 0..n {
        let len = if empty { 0 } else { (i as u64 + step) % 8 };
        for t in 0..len {
            for (j, seq) in b.sequences.iter_mut().enumerate() {
                let size = SIZES[SEQUENCE_TABLES[j]];
                seq.ids.push(((unit_f64(step, i as u64, 20 + j as u64, t) * size as f64) as u64).min(size - 1));
            }
        }
        b.sequences.iter_mut().for_each(SparseField::close_bag);
    }
    b
}

#[test]
fn dien_on_one_resident_worker_trains_as_on_one_cpu_worker() {
    let Some(dev) = device() else { return };
    let batches: Vec<Batch> = (0..50).map(|s| sequence_batch(s, if s == 3 { 1 } else { 64 }, s == 7)).collect();
    for (name, model) in dien_models() {
        let c = dien_config(model.clone(), false);
        assert_same(&format!("{name}, sgd"), &gpu_run(&dev, &c, &batches), &cpu_run(&c, &batches));
        let c = dien_config(model, true);
        let (a, b) = (gpu_run(&dev, &c, &batches), gpu_run(&dev, &c, &batches));
        assert_eq!(a, b, "{name}: two adaptive runs on the device differ");
        // CUDA graphs: the same steps, bit for bit, on repeated shapes (captured, then replayed).
        let again: Vec<&Batch> = [0, 1, 0, 1, 0, 1, 0, 1, 2, 2, 2, 2].iter().map(|&k| &batches[10 + k]).collect();
        let mut plain = ResidentWorker::new(&dev, &c).unwrap();
        let mut graphs = ResidentWorker::new(&dev, &c).unwrap();
        graphs.set_graphs(true);
        let want: Vec<_> = again.iter().map(|b| plain.train(b, false).unwrap()).collect();
        assert_eq!(graphs.train_all(again.iter().copied()).unwrap(), want, "{name}: graph steps");
        assert_eq!(graphs.dense_params().unwrap(), plain.dense_params().unwrap(), "{name}: dense parameters");
        assert!(graphs.graph_counts().replayed > 0, "{name}: no step ran as a graph");
    }
    // A sequence past the model's longest is refused, naming the sample.
    let (_, model) = dien_models().swap_remove(0);
    let mut w = ResidentWorker::new(&dev, &dien_config(model, true)).unwrap();
    let mut long = sequence_batch(0, 2, false);
    long.sequences = vec![SparseField::new(), SparseField::new()];
    for seq in long.sequences.iter_mut() {
        seq.close_bag();
        seq.ids.extend([0; 8]);
        seq.close_bag();
    }
    let e = w.train(&long, false).unwrap_err().to_string();
    assert!(e.contains("sample 1") && e.contains("8 steps"), "{e}");
}

#[test]
fn a_large_batch_and_a_row_repeated_ten_thousand_times() {
    let Some(dev) = device() else { return };
    let (_, model) = models().swap_remove(0);
    let c = config(model, false);
    let batches = vec![batch(1, 65_536, false), batch(2, 10_000, true), batch(3, 65_536, false)];
    assert_same("dlrm, batch 65,536 and a hot row", &gpu_run(&dev, &c, &batches), &cpu_run(&c, &batches));
}

#[test]
fn staged_steps_equal_one_step_at_a_time() {
    let Some(dev) = device() else { return };
    // Sizes that grow, shrink, are empty and grow again: the staging slots reallocate
    // while the other slot's step may still run.
    let sizes = [64, 1, 0, 3000, 64, 20_000, 5, 64, 64, 70_000, 2];
    let batches: Vec<Batch> = sizes.iter().enumerate().map(|(s, &n)| batch(s as u64, n, s == 5)).collect();
    for (name, model) in models() {
        let c = config(model, true);
        let mut one = ResidentWorker::new(&dev, &c).unwrap();
        let single: Vec<_> = batches.iter().map(|b| one.train(b, false).unwrap()).collect();
        let mut all = ResidentWorker::new(&dev, &c).unwrap();
        let staged = all.train_all(&batches).unwrap();
        assert_eq!(staged, single, "{name}: the outcomes of staged steps");
        assert_eq!(all.dense_params().unwrap(), one.dense_params().unwrap(), "{name}: dense parameters");
        for t in 0..SIZES.len() {
            assert_eq!(all.table(t).unwrap(), one.table(t).unwrap(), "{name}: table {t}");
        }
        assert_eq!(all.train_steps(), one.train_steps(), "{name}: training steps");
        // A batch staged and never launched is dropped; an evaluation between steps changes nothing.
        let probe = batch(99, 300, false);
        all.stage(&batches[0]).unwrap();
        let before = one.predict(&probe).unwrap().to_vec();
        assert_eq!(all.predict(&probe).unwrap(), &before[..], "{name}: predictions");
        assert_eq!(all.train(&batches[1], false).unwrap(), one.train(&batches[1], false).unwrap(), "{name}");
        assert!(all.finish().is_err(), "{name}: finishing twice");
        // The logits a training step keeps are its forward's, before its update.
        let before = one.predict(&probe).unwrap().to_vec();
        one.train(&probe, true).unwrap();
        assert_eq!(one.logits(), &before[..], "{name}: the logits kept by a training step");
        assert_ne!(one.predict(&probe).unwrap(), &before[..], "{name}: the step changed the model");
    }
}

/// Each step handed the next batch to stage while it runs trains as one step at a time:
/// where the next step's batch is the prepared one, another one (the preparation
/// dropped), nothing, a batch that cannot be staged (left to its own step, which refuses
/// it), and an evaluation between two steps.
#[test]
fn steps_preparing_the_next_batch_equal_one_step_at_a_time() {
    let Some(dev) = device() else { return };
    let sizes = [64, 1, 0, 3000, 64, 20_000, 5, 64, 64, 70_000, 2];
    let batches: Vec<Batch> = sizes.iter().enumerate().map(|(s, &n)| batch(s as u64, n, s == 5)).collect();
    let mut bad = batch(50, 8, false);
    bad.sparse[1].ids[0] = SIZES[1];
    let probe = batch(99, 300, false);
    for (name, model) in models() {
        let c = config(model, true);
        let mut one = ResidentWorker::new(&dev, &c).unwrap();
        let mut ahead = ResidentWorker::new(&dev, &c).unwrap();
        for (s, b) in batches.iter().enumerate() {
            let expected = one.train(b, false).unwrap();
            let mut next = || match s {
                3 => Some(batch(77, 64, false)),
                6 => None,
                7 => Some(bad.clone()),
                _ => batches.get(s + 1).cloned(),
            };
            let got = ahead.train_then_prepare(b, false, &mut next).unwrap();
            assert_eq!(got, expected, "{name}: step {s}");
            if s == 4 {
                assert_eq!(ahead.predict(&probe).unwrap(), one.predict(&probe).unwrap(), "{name}: predictions");
            }
        }
        assert!(ahead.train(&bad, false).is_err() && one.train(&bad, false).is_err(), "{name}: an id past its table");
        assert_eq!(ahead.dense_params().unwrap(), one.dense_params().unwrap(), "{name}: dense parameters");
        for t in 0..SIZES.len() {
            assert_eq!(ahead.table(t).unwrap(), one.table(t).unwrap(), "{name}: table {t}");
        }
        assert_eq!(ahead.train_steps(), one.train_steps(), "{name}: training steps");
    }
}

/// Evaluation steps that stage the next batch while the device computes the logits
/// give the logits of evaluations one at a time, bit for bit, and the training steps
/// around them (one starting from a batch an evaluation staged) the same steps: through
/// an evaluation staging another evaluation's batch, a training step's, a wrong one,
/// nothing, an empty batch and one that cannot be staged.
#[test]
fn evaluations_preparing_the_next_batch_equal_evaluations_one_at_a_time() {
    let Some(dev) = device() else { return };
    let evals: Vec<Batch> =
        [40, 3000, 0, 1, 512].iter().enumerate().map(|(k, &n)| batch(300 + k as u64, n, false)).collect();
    let trains: Vec<Batch> = (0..3).map(|s| batch(s, 256, false)).collect();
    let mut bad = batch(51, 8, false);
    bad.sparse[1].ids[0] = SIZES[1];
    for (name, model) in models() {
        let c = config(model, true);
        let mut one = ResidentWorker::new(&dev, &c).unwrap();
        let mut ahead = ResidentWorker::new(&dev, &c).unwrap();
        let train = |k: usize, next: Option<Batch>, one: &mut ResidentWorker, ahead: &mut ResidentWorker| {
            let expected = one.train(&trains[k], false).unwrap();
            let got = ahead.train_then_prepare(&trains[k], false, &mut || next.clone()).unwrap();
            assert_eq!(got, expected, "{name}: training step {k}");
        };
        train(0, Some(evals[0].clone()), &mut one, &mut ahead);
        // What evaluation k hands on to prepare.
        let nexts = [Some(evals[1].clone()), Some(evals[2].clone()), Some(bad.clone()), None, Some(trains[1].clone())];
        for (k, b) in evals.iter().enumerate() {
            let expected = one.predict(b).unwrap().to_vec();
            let got = ahead.predict_then_prepare(b, &mut || nexts[k].clone()).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            assert_eq!(bits(got), bits(&expected), "{name}: evaluation {k}");
            if k == 2 {
                train(2, Some(batch(77, 64, false)), &mut one, &mut ahead);
            }
        }
        train(1, None, &mut one, &mut ahead);
        assert!(ahead.predict(&bad).is_err() && one.predict(&bad).is_err(), "{name}: an id past its table");
        assert_eq!(ahead.dense_params().unwrap(), one.dense_params().unwrap(), "{name}: dense parameters");
        for t in 0..SIZES.len() {
            assert_eq!(ahead.table(t).unwrap(), one.table(t).unwrap(), "{name}: table {t}");
        }
    }
}

#[test]
fn a_device_checkpoint_restores_on_a_cpu_worker() {
    let Some(dev) = device() else { return };
    let (_, model) = models().swap_remove(3);
    let c = config(model, true);
    let mut w = ResidentWorker::new(&dev, &c).unwrap();
    for s in 0..20 {
        w.train(&batch(s, 32, false), false).unwrap();
    }
    let snapshot = w.snapshot().unwrap();
    let l2 = w.sum_squares().unwrap().sqrt();
    let after: Vec<Batch> = (20..30).map(|s| batch(s, 32, false)).collect();
    let gpu_losses: Vec<f64> = after.iter().map(|b| w.train(b, false).unwrap().loss_sum).collect();
    let (cpu_l2, cpu_losses) = timely::execute_directly(move |worker| {
        let mut trainer = Trainer::new(worker, &c).unwrap();
        trainer.restore(&[snapshot]).unwrap();
        let l2 = trainer.params_l2(worker).unwrap();
        let losses: Vec<f64> =
            after.iter().map(|b| trainer.step(worker, StepKind::Train, b.clone()).unwrap().loss_sum).collect();
        (l2, losses)
    });
    println!("restored on the CPU: params L2 {cpu_l2:.9} vs {l2:.9}");
    assert!(rel(cpu_l2, l2) <= 1e-12, "restored params L2 {cpu_l2} vs {l2}");
    for (g, c) in gpu_losses.iter().zip(&cpu_losses) {
        assert!(rel(*g, *c) <= TOLERANCE, "loss after the restore: device {g} vs CPU {c}");
    }
}

/// The rows a host mirror reads back (`snapshot_rows`, gathered on the device) are
/// the whole snapshot's rows at those ids, bit for bit, with its optimizer state, its
/// dense state and its step count, under SGD and row-wise Adagrad; an id past its
/// table is an error naming both. `snapshot_trained` lists the rows of the batches
/// trained since it was last called (none right after, none after a load).
#[test]
fn rows_read_back_are_the_whole_snapshots_rows_bit_for_bit() {
    let Some(dev) = device() else { return };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for adaptive in [false, true] {
        let (_, model) = models().swap_remove(3);
        let mut w = ResidentWorker::new(&dev, &config(model, adaptive)).unwrap();
        for s in 0..5 {
            w.train(&batch(s, 32, false), false).unwrap();
        }
        let whole = w.snapshot().unwrap();
        let asked: Vec<Vec<u64>> = SIZES.iter().map(|&n| (0..n).filter(|id| id % 3 != 1).collect()).collect();
        let part = w.snapshot_rows(&asked).unwrap();
        assert!(part.updated_only && !whole.updated_only, "adaptive {adaptive}");
        assert_eq!(part.step, whole.step);
        assert_eq!(bits(&part.dense_params), bits(&whole.dense_params), "adaptive {adaptive}: dense");
        assert_eq!(part.dense_optimizer, whole.dense_optimizer, "adaptive {adaptive}: dense optimizer");
        let (d, sw) = (whole.dim, whole.state_width);
        for (t, ids) in asked.iter().enumerate() {
            let (p, all) = (&part.tables[t], &whole.tables[t]);
            assert_eq!(&p.ids, ids, "adaptive {adaptive}: table {t}");
            for (k, &id) in ids.iter().enumerate() {
                let i = id as usize;
                assert_eq!(bits(&p.rows[k * d..(k + 1) * d]), bits(&all.rows[i * d..(i + 1) * d]), "row {t}/{id}");
                assert_eq!(bits(&p.state[k * sw..(k + 1) * sw]), bits(&all.state[i * sw..(i + 1) * sw]), "{t}/{id}");
            }
        }
        let mut past = asked.clone();
        past[2].push(SIZES[2]);
        let e = w.snapshot_rows(&past).unwrap_err().to_string();
        assert!(e.contains("table 2") && e.contains(&format!("id {}", SIZES[2])), "{e}");
        // The rows the steps trained, marked on the device: those of the five batches.
        let trained = w.snapshot_trained().unwrap();
        let ids_of = |batches: &[Batch]| -> Vec<Vec<u64>> {
            let mut ids = vec![std::collections::BTreeSet::new(); SIZES.len()];
            for b in batches {
                b.sparse.iter().enumerate().for_each(|(t, f)| ids[t].extend(f.ids.iter().copied()));
            }
            ids.into_iter().map(|s| s.into_iter().collect()).collect()
        };
        let five: Vec<Batch> = (0..5).map(|s| batch(s, 32, false)).collect();
        let want = w.snapshot_rows(&ids_of(&five)).unwrap();
        assert_eq!(trained.tables, want.tables, "adaptive {adaptive}: the rows trained");
        let none = w.snapshot_trained().unwrap();
        assert!(none.tables.iter().all(|t| t.ids.is_empty()), "adaptive {adaptive}: read twice");
        let sixth = batch(5, 32, false);
        w.train(&sixth, false).unwrap();
        let trained = w.snapshot_trained().unwrap();
        assert_eq!(trained.tables, w.snapshot_rows(&ids_of(&[sixth])).unwrap().tables, "after one more step");
        w.train(&batch(6, 32, false), false).unwrap();
        w.load(&whole).unwrap();
        let none = w.snapshot_trained().unwrap();
        assert!(none.tables.iter().all(|t| t.ids.is_empty()), "adaptive {adaptive}: after a load");
    }
}

#[test]
fn a_non_finite_loss_updates_nothing_and_does_not_count() {
    let Some(dev) = device() else { return };
    let good: Vec<Batch> = (0..4).map(|s| batch(s, 256, s == 1)).collect();
    // A NaN row that only the bad batch reads makes its loss NaN under every
    // model (a batch's own values are checked finite before it reaches the device).
    let mut bad = batch(50, 256, false);
    let poisoned = read_an_unread_row(&good.iter().collect::<Vec<_>>(), &mut bad, 7);
    let mixed = [&good[0], &good[1], &bad, &good[2], &good[3]];
    for (name, model) in models() {
        // Adaptive optimizers: Adam's bias correction counts the steps applied.
        let c = config(model, true);
        let fresh = || poison(ResidentWorker::new(&dev, &c).unwrap(), poisoned);
        let mut clean = fresh();
        let want: Vec<_> = good.iter().map(|b| clean.train(b, false).unwrap()).collect();
        let mut one = fresh();
        let singles: Vec<_> = mixed.iter().map(|b| one.train(b, false).unwrap()).collect();
        let mut ahead = fresh();
        let staged = ahead.train_all(mixed.iter().copied()).unwrap();
        for (how, outs, w) in [("one at a time", &singles, &one), ("staged", &staged, &ahead)] {
            let skipped = outs[2];
            assert!(
                skipped.non_finite && skipped.loss_sum.is_nan() && skipped.samples == 256,
                "{name} {how}: {skipped:?}"
            );
            let rest: Vec<_> = outs.iter().enumerate().filter(|&(i, _)| i != 2).map(|(_, s)| *s).collect();
            assert_eq!(rest, want, "{name} {how}: the finite steps' outcomes");
            assert_eq!(w.train_steps(), clean.train_steps(), "{name} {how}: training steps");
            assert_eq!(w.dense_params().unwrap(), clean.dense_params().unwrap(), "{name} {how}: dense parameters");
            for t in 0..SIZES.len() {
                assert_eq!(table_bits(w, t), table_bits(&clean, t), "{name} {how}: table {t}");
            }
        }
    }
}

/// The table of the row [`poison`] fills with NaN.
const POISONED_TABLE: usize = 2;

/// Points sample `sample` of `bad` at a row of [`POISONED_TABLE`] that none
/// of `others` reads, and gives that row's id.
fn read_an_unread_row(others: &[&Batch], bad: &mut Batch, sample: usize) -> u64 {
    let read: std::collections::HashSet<u64> =
        others.iter().flat_map(|b| b.sparse[POISONED_TABLE].ids.iter().copied()).collect();
    let id = (0..SIZES[POISONED_TABLE]).find(|id| !read.contains(id)).expect("a row no other batch reads");
    let f = &mut bad.sparse[POISONED_TABLE];
    let (lo, hi) = (f.offsets[sample] as usize, f.offsets[sample + 1] as usize);
    assert!(hi > lo, "sample {sample} reads the table");
    f.ids[lo..hi].fill(id);
    id
}

/// `w` with row `id` of [`POISONED_TABLE`] set to NaN (through a checkpoint
/// part, as a run would resume it).
fn poison(mut w: ResidentWorker, id: u64) -> ResidentWorker {
    let mut part = w.snapshot().unwrap();
    set_row(&mut part, id, f32::NAN);
    w.load(&part).unwrap();
    w
}

/// Sets every value of row `id` of [`POISONED_TABLE`] in `part` to `x`.
fn set_row(part: &mut WorkerSnapshot, id: u64, x: f32) {
    let d = part.dim;
    part.tables[POISONED_TABLE].rows[id as usize * d..(id as usize + 1) * d].fill(x);
}

/// Table `t`'s rows and optimizer state as bits, so that equal NaN rows compare equal.
fn table_bits(w: &ResidentWorker, t: usize) -> (Vec<u32>, Vec<u32>) {
    let (rows, state) = w.table(t).unwrap();
    (rows.iter().map(|x| x.to_bits()).collect(), state.iter().map(|x| x.to_bits()).collect())
}

/// What two runs of the same steps must agree on, bit for bit: samples, the
/// non-finite flag and the loss's bits, a NaN loss as any NaN (its payload is
/// not fixed, and NaN != NaN would fail equal runs).
fn outcomes(steps: &[ResidentStep]) -> Vec<(u64, bool, Option<u64>)> {
    steps.iter().map(|s| (s.samples, s.non_finite, (!s.loss_sum.is_nan()).then(|| s.loss_sum.to_bits()))).collect()
}

/// `b` with other labels, dense values and ids in the same bags: the same shape, other data.
fn same_shape_other_data(b: &Batch, step: u64) -> Batch {
    let mut o = b.clone();
    for (i, l) in o.labels.iter_mut().enumerate() {
        *l = (unit_f64(step, i as u64, 0, 0) < 0.5) as u8 as f32;
    }
    for (i, x) in o.dense.iter_mut().enumerate() {
        *x = (unit_f64(step, i as u64, 1, 0) * 3.0 - 1.5) as f32;
    }
    for (t, f) in o.sparse.iter_mut().enumerate() {
        for id in f.ids.iter_mut() {
            *id = (*id + 1 + step) % SIZES[t];
        }
    }
    o
}

#[test]
fn graph_steps_equal_launched_steps_bit_for_bit() {
    let Some(dev) = device() else { return };
    let a = batch(0, 256, false);
    let a2 = same_shape_other_data(&a, 1);
    let hot = batch(1, 2000, true);
    let hot2 = same_shape_other_data(&hot, 2);
    let mut bad = same_shape_other_data(&a, 3);
    let large = batch(2, 3000, false);
    let probe = batch(9, 77, false);
    // The NaN row is mended (set to zeros) in the restore between the two runs of steps.
    let poisoned = read_an_unread_row(&[&a, &a2, &hot, &hot2, &probe], &mut bad, 7);
    // Shapes that repeat (the two staging slots take turns, so a shape's
    // graphs are captured at its fourth and fifth steps, then replayed on the
    // other batch of that shape), a non-finite loss on a replayed graph, and a
    // larger batch that grows the buffers (every graph dropped, then captured again).
    let first: Vec<&Batch> =
        vec![&a, &a2, &a, &a2, &a, &a, &a2, &bad, &a2, &a, &hot, &hot2, &hot, &hot2, &hot, &hot, &hot2, &a2, &a];
    let second: Vec<&Batch> = vec![&large, &a, &a2, &a, &a2, &a, &a2, &a2, &a, &hot, &hot2, &hot, &hot2, &hot];
    for (name, model) in models() {
        let c = config(model, true);
        let fresh = || poison(ResidentWorker::new(&dev, &c).unwrap(), poisoned);
        let (mut plain, mut one, mut ahead) = (fresh(), fresh(), fresh());
        one.set_graphs(true);
        ahead.set_graphs(true);
        let want: Vec<_> = first.iter().map(|b| plain.train(b, false).unwrap()).collect();
        let singles: Vec<_> = first.iter().map(|b| one.train(b, false).unwrap()).collect();
        let staged = ahead.train_all(first.iter().copied()).unwrap();
        assert!(want[7].non_finite, "{name}: the step reading the NaN row");
        assert_eq!(outcomes(&singles), outcomes(&want), "{name}: graph steps one at a time");
        assert_eq!(outcomes(&staged), outcomes(&want), "{name}: graph steps staged ahead");
        // An evaluation of a new size (buffers grow) and a restore between steps.
        let logits = plain.predict(&probe).unwrap().to_vec();
        let mut part = plain.snapshot().unwrap();
        set_row(&mut part, poisoned, 0.0);
        for (how, w) in [("one at a time", &mut one), ("staged", &mut ahead)] {
            assert_eq!(w.predict(&probe).unwrap(), &logits[..], "{name} {how}: predictions");
            w.load(&part).unwrap();
        }
        plain.load(&part).unwrap();
        let want: Vec<_> = second.iter().map(|b| plain.train(b, true).unwrap()).collect();
        let singles: Vec<_> = second.iter().map(|b| one.train(b, true).unwrap()).collect();
        assert_eq!(one.logits(), plain.logits(), "{name}: the logits a graph step keeps");
        let staged = ahead.train_all(second.iter().copied()).unwrap();
        assert_eq!(singles, want, "{name}: graph steps one at a time after the restore");
        assert_eq!(staged, want, "{name}: graph steps staged ahead after the restore");
        for (how, w) in [("one at a time", &one), ("staged", &ahead)] {
            assert_eq!(w.train_steps(), plain.train_steps(), "{name} {how}: training steps");
            assert_eq!(w.dense_params().unwrap(), plain.dense_params().unwrap(), "{name} {how}: dense parameters");
            for t in 0..SIZES.len() {
                assert_eq!(table_bits(w, t), table_bits(&plain, t), "{name} {how}: table {t}");
            }
            let counts = w.graph_counts();
            println!("{name} {how}: {counts:?} over {} steps", first.len() + second.len());
            assert!(counts.captured >= 4 && counts.replayed >= 10, "{name} {how}: graphs barely used: {counts:?}");
            assert_eq!(counts.failed, 0, "{name} {how}: a capture failed");
        }
        assert_eq!(plain.graph_counts(), Default::default(), "{name}: graphs are off by default");
    }
}

#[test]
fn an_id_outside_its_table_is_an_error_naming_it() {
    let Some(dev) = device() else { return };
    let (_, model) = models().swap_remove(0);
    let mut w = ResidentWorker::new(&dev, &config(model, false)).unwrap();
    let mut b = batch(0, 4, false);
    b.sparse[1].ids[2] = 1;
    let e = w.train(&b, false).unwrap_err().to_string();
    assert!(e.contains("field 1") && e.contains("id 1"), "{e}");
    assert!(w.train(&batch(1, 4, false), false).is_ok(), "the worker is usable after a refused batch");
}

/// Under `--precision tf32` and `bf16` (`Device::with_precision`) the worker
/// trains DLRM (plain SGD) within the products' rounding of the fp32 run:
/// losses and params L2 after 50 steps differ from it, and from each other,
/// by less than 1%.
#[test]
fn reduced_precision_training_stays_near_fp32() {
    use tiderec_operators::nn::Precision;
    let Some(dev) = device() else { return };
    let batches: Vec<Batch> = (0..50).map(|s| batch(s, 256, false)).collect();
    let (_, dlrm) = models().into_iter().find(|(n, _)| *n == "dlrm").unwrap();
    let c = config(dlrm, false);
    let exact = gpu_run(&dev, &c, &batches);
    let mut runs = Vec::new();
    for p in [Precision::Tf32, Precision::Bf16] {
        let run = gpu_run(&dev.clone().with_precision(p).unwrap(), &c, &batches);
        runs.push(run.clone());
        let worst = run.0.iter().zip(&exact.0).map(|(&g, &c)| rel(g, c)).fold(0.0, f64::max);
        let l2 = rel(run.1, exact.1);
        println!("dlrm {p}: params L2 relative to fp32 {l2:.2e}, largest loss difference {worst:.2e}");
        assert!(run != exact, "{p}: the same as fp32 to the bit; the precision did not apply");
        assert!(l2 < 1e-2 && worst < 1e-2, "{p}: params L2 {l2:.2e}, loss {worst:.2e} from fp32");
    }
    assert!(runs[0] != runs[1], "tf32 and bf16 trained the same numbers: one of them did not apply");
}
