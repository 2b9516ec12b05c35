//! A worker whose step fails must not leave the other workers waiting:
//! they see the failure in the step's statistics and can stop together.

use std::sync::{Arc, Mutex};
use tiderec_operators::error::FeatureSlot;
use tiderec_operators::nn::{DlrmConfig, ModelConfig};
use tiderec_operators::optim::{DenseOptimizerKind, OptimizerParams, SparseOptimizerKind};
use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
use tiderec_operators::{Batch, OperatorError, ShapeError};

fn config() -> TrainerConfig {
    TrainerConfig {
        model: ModelConfig::Dlrm(DlrmConfig {
            num_dense: 2,
            num_sparse: 1,
            dim: 4,
            bottom: vec![4],
            top: vec![1],
            self_interaction: false,
        }),
        table_sizes: vec![10],
        seed: 1,
        dense_optimizer: DenseOptimizerKind::Sgd,
        dense_hp: OptimizerParams::with_lr(0.1),
        sparse_optimizer: SparseOptimizerKind::Sgd,
        sparse_hp: OptimizerParams::with_lr(0.1),
        sequence_tables: vec![],
        store: Default::default(),
        exchange: Default::default(),
    }
}

fn sample(batch: &mut Batch, id: u64) {
    batch.labels.push(1.0);
    batch.dense.extend([0.5, 1.0]);
    batch.sparse[0].ids.push(id);
    batch.sparse[0].close_bag();
}

#[test]
fn a_batch_that_does_not_fit_the_model_fails_every_worker_instead_of_hanging() {
    let config = config();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    timely::execute(timely::Config::process(2), move |worker| {
        let me = worker.index();
        let mut trainer = Trainer::new(worker, &config).unwrap();
        let mut good = Batch::new(2, 1);
        sample(&mut good, me as u64);
        let first = trainer.step(worker, StepKind::Train, good.clone()).unwrap();
        assert_eq!((first.samples, first.failed_workers), (2, 0));
        // Worker 1 sends an id beyond its table; worker 0 a good batch.
        let mut batch = Batch::new(2, 1);
        sample(&mut batch, if me == 1 { 99 } else { 0 });
        let result = trainer.step(worker, StepKind::Train, batch);
        let outcome = match result {
            Ok(stats) => format!("ok, {} failed", stats.failed_workers),
            Err(e) => {
                let outside = ShapeError::IdOutsideTable { slot: FeatureSlot::Field(0), id: 99, table: 0, rows: 10 };
                assert!(matches!(&e, OperatorError::Shape(s) if *s == outside), "{e:?}");
                format!("error: {e}")
            }
        };
        out.lock().unwrap().push((me, outcome));
    })
    .unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen[0], (0, "ok, 1 failed".to_string()), "{seen:?}");
    assert!(seen[1].1.starts_with("error") && seen[1].1.contains("99"), "{seen:?}");
}
