//! Reusing tiderec operators inside your own timely program.
//!
//! The program reads Criteo TSV lines with tiderec's reader (each worker its
//! own byte range of the file), trains a small DLRM with tiderec's
//! synchronous trainer, and scores a held-out part — all in a dataflow you
//! own, without the `tiderec` CLI, Kafka, Parquet or CUDA.
//!
//! ```text
//! cargo run --release -p tiderec-examples --example own_dataflow -- ../shared/data/criteo/sample.train
//! ```

use std::path::PathBuf;
use tiderec_operators::metrics::auc;
use tiderec_operators::nn::{DlrmConfig, ModelConfig};
use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
use tiderec_operators::Batch;
use tiderec_sources::criteo::{CriteoConfig, CriteoFeatures, CriteoReader};

fn main() {
    let path: PathBuf = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/criteo/sample.train"))
    });
    let rows = 20_000u64;
    // DLRM over 26 tables; the optimizers and learning rates are `tiderec train`'s defaults.
    let model = ModelConfig::Dlrm(DlrmConfig { bottom: vec![64, 16], top: vec![64, 1], ..DlrmConfig::kaggle() });
    let config = TrainerConfig::builder(model, vec![rows; 26]).seed(3).build().expect("valid config");
    timely::execute(timely::Config::process(2), move |worker| {
        let (me, peers) = (worker.index(), worker.peers());
        let features = CriteoFeatures { table_sizes: vec![rows; 26], seed: 3 };
        // The first 80% of the file trains, the rest evaluates.
        let open = |span| {
            CriteoReader::open_span(
                std::slice::from_ref(&path),
                span,
                me,
                peers,
                CriteoConfig::new(features.clone()),
                None,
            )
            .expect("readable Criteo file")
        };
        let (mut train, mut eval) = (open((0.0, 0.8)), open((0.8, 1.0)));
        let mut trainer = Trainer::new(worker, &config).expect("valid config");
        for (reader, kind, micro) in [(&mut train, StepKind::Train, 64), (&mut eval, StepKind::Eval, 1024)] {
            loop {
                let mut batch = Batch::new(13, 26);
                reader.next_batch(&mut batch, micro).expect("no bad records in this file");
                // Every worker steps, with or without data, until a step has no data anywhere.
                if trainer.step(worker, kind, batch).expect("valid batch").samples == 0 {
                    break;
                }
            }
        }
        let eval = trainer.take_eval();
        if me == 0 {
            println!(
                "{} eval samples, AUC {:.4}",
                eval.probs.len(),
                auc(&eval.probs, &eval.labels).unwrap_or(f64::NAN)
            );
        }
    })
    .expect("timely starts");
}
