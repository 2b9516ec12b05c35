//! The main test of the design: W workers train the same model as one
//! worker on the same global batches, and a run is deterministic.

mod common;

use common::rel_diff;
use tiderec::progress::ProgressMode;
use tiderec::TrainSettings;
use tiderec_operators::optim::SparseOptimizerKind;

fn fifty_steps_of(model: &str, workers: usize, optimizer: &str, lr: f32) -> tiderec_sinks::metrics::RunSummary {
    fifty_steps_with(model, workers, optimizer, lr, "rowwise-adagrad", 0.05)
}

fn fifty_steps_with(
    model: &str,
    workers: usize,
    optimizer: &str,
    lr: f32,
    sparse_optimizer: &str,
    sparse_lr: f32,
) -> tiderec_sinks::metrics::RunSummary {
    let settings = {
        let mut s = TrainSettings::default();
        s.model.kind = model.parse().unwrap();
        s.cluster.workers = workers;
        s.run.steps = Some(50);
        s.data.samples = 50 * 256;
        s.run.batch_size = 256;
        s.data.eval_fraction = 0.0;
        s.data.buckets = 20_000;
        s.optimizer.dense = optimizer.parse().unwrap();
        s.optimizer.sparse = sparse_optimizer.parse().unwrap();
        s.optimizer.sparse_lr = Some(sparse_lr);
        s.optimizer.lr = Some(lr);
        s.run.progress = ProgressMode::None;
        s.run.seed = 11;
        s
    };
    tiderec::run::train(&settings).unwrap().expect("single-process runs return a summary")
}

fn fifty_steps(workers: usize, optimizer: &str, lr: f32) -> tiderec_sinks::metrics::RunSummary {
    fifty_steps_of("dlrm", workers, optimizer, lr)
}

#[test]
fn every_model_trains_the_same_on_one_and_two_workers() {
    for model in ["lr", "fm", "deepfm"] {
        let one = fifty_steps_of(model, 1, "adam", 0.001);
        let two = fifty_steps_of(model, 2, "adam", 0.001);
        let dl2 = rel_diff(one.params_l2, two.params_l2);
        let dloss = rel_diff(one.train_loss_mean, two.train_loss_mean);
        eprintln!("{model}: params_l2 {} vs {} (rel {dl2:e}), loss rel {dloss:e}", one.params_l2, two.params_l2);
        assert!(dl2 <= 1e-4 && dloss <= 1e-4, "{model}: {dl2:e} {dloss:e}");
        assert_eq!(one.samples, two.samples);
    }
}

#[test]
fn every_row_optimizer_trains_the_same_on_one_and_two_workers() {
    let cases =
        [("wdl", "ftrl-adagrad", 0.05), ("deepfm", "lazy-adam", 0.001), ("lr", "ftrl", 0.5), ("dlrm", "sgd", 0.05)];
    for (model, sparse, sparse_lr) in cases {
        let one = fifty_steps_with(model, 1, "adam", 0.001, sparse, sparse_lr);
        let two = fifty_steps_with(model, 2, "adam", 0.001, sparse, sparse_lr);
        let dl2 = rel_diff(one.params_l2, two.params_l2);
        let dloss = rel_diff(one.train_loss_mean, two.train_loss_mean);
        eprintln!(
            "{model}/{sparse}: params_l2 {} vs {} (rel {dl2:e}), loss rel {dloss:e}",
            one.params_l2, two.params_l2
        );
        assert!(dl2 <= 1e-4 && dloss <= 1e-4, "{model}/{sparse}: {dl2:e} {dloss:e}");
    }
}

#[test]
fn one_and_two_worker_threads_train_the_same_model() {
    for (optimizer, lr) in [("adagrad", 0.01), ("adam", 0.001), ("sgd", 0.1)] {
        let one = fifty_steps(1, optimizer, lr);
        let two = fifty_steps(2, optimizer, lr);
        assert_eq!(one.steps, 50);
        assert_eq!(two.steps, 50);
        assert_eq!(one.samples, two.samples);
        assert_eq!(two.workers, 2);
        let dl2 = rel_diff(one.params_l2, two.params_l2);
        let dloss = rel_diff(one.train_loss_mean, two.train_loss_mean);
        eprintln!("{optimizer}: params_l2 {} vs {} (rel {dl2:e}), loss rel {dloss:e}", one.params_l2, two.params_l2);
        assert!(dl2 <= 1e-4, "{optimizer}: params_l2 differs: {} vs {}", one.params_l2, two.params_l2);
        assert!(dloss <= 1e-4, "{optimizer}: train loss differs: {} vs {}", one.train_loss_mean, two.train_loss_mean);
        // Training moved the parameters (the comparison is not between two untouched models).
        assert!(two.bytes_per_sample > 0.0 && one.bytes_per_sample == 0.0);
    }
}

#[test]
fn dien_trains_the_same_on_one_and_two_workers() {
    for model in ["dien", "dien-sum"] {
        let run = |workers| {
            let settings = {
                let mut s = TrainSettings::default();
                s.data.source = "synthetic-behavior".into();
                s.model.kind = model.parse().unwrap();
                s.cluster.workers = workers;
                s.run.steps = Some(50);
                s.data.samples = 50 * 256;
                s.run.batch_size = 256;
                s.data.eval_fraction = 0.0;
                s.run.progress = ProgressMode::None;
                s.run.seed = 5;
                s
            };
            tiderec::run::train(&settings).unwrap().expect("single-process runs return a summary")
        };
        let (one, two) = (run(1), run(2));
        let dl2 = rel_diff(one.params_l2, two.params_l2);
        let dloss = rel_diff(one.train_loss_mean, two.train_loss_mean);
        eprintln!("{model}: params_l2 {} vs {} (rel {dl2:e}), loss rel {dloss:e}", one.params_l2, two.params_l2);
        assert!(dl2 <= 1e-4 && dloss <= 1e-4, "{model}: {dl2:e} {dloss:e}");
        assert_eq!(one.samples, 50 * 256);
        assert!(two.bytes_per_sample > 0.0);
    }
}

#[test]
fn wide_and_deep_with_crosses_trains_the_same_on_one_and_two_workers() {
    let run = |workers, crosses: &[&str]| {
        let settings = {
            let mut s = TrainSettings::default();
            s.model.kind = "wdl".parse().unwrap();
            s.optimizer.sparse = SparseOptimizerKind::FtrlAdagrad;
            s.model.crosses = crosses.iter().map(|c| c.to_string()).collect();
            s.cluster.workers = workers;
            s.run.steps = Some(50);
            s.data.samples = 50 * 256;
            s.run.batch_size = 256;
            s.data.eval_fraction = 0.0;
            s.data.buckets = 20_000;
            s.run.progress = ProgressMode::None;
            s.run.seed = 13;
            s
        };
        tiderec::run::train(&settings).unwrap().expect("single-process runs return a summary")
    };
    let crosses = ["0:1", "2:5", "6:13"];
    let (one, two) = (run(1, &crosses), run(2, &crosses));
    let dl2 = rel_diff(one.params_l2, two.params_l2);
    let dloss = rel_diff(one.train_loss_mean, two.train_loss_mean);
    eprintln!("wdl + crosses: params_l2 {} vs {} (rel {dl2:e}), loss rel {dloss:e}", one.params_l2, two.params_l2);
    assert!(dl2 <= 1e-4 && dloss <= 1e-4, "{dl2:e} {dloss:e}");
    // The crosses are real extra tables: three more tables' rows, and training touched them.
    let plain = run(1, &[]);
    assert_eq!(one.embedding_rows, plain.embedding_rows + 3 * 20_000);
    assert_ne!(one.params_l2, plain.params_l2);
}

#[test]
fn training_is_deterministic_for_a_seed_and_worker_count() {
    let a = fifty_steps(2, "adagrad", 0.001);
    let b = fifty_steps(2, "adagrad", 0.001);
    assert_eq!(a.params_l2.to_bits(), b.params_l2.to_bits());
    assert_eq!(a.train_loss_mean.to_bits(), b.train_loss_mean.to_bits());
}
