//! Exporting a checkpoint and scoring with it from your own program.
//!
//! Two workers train a small DLRM on a seeded synthetic stream for 40 steps, then
//! evaluate held-out samples (gathered on worker 0) and hand back their
//! [`Trainer::snapshot`]s. The program writes them as a checkpoint
//! (`tiderec-sinks`), exports it for serving ([`tiderec::serving::export`]:
//! `model.safetensors` under PyTorch's names and layouts, and `model.json`), loads
//! the checkpoint again as a scorer ([`Loaded`], what `tiderec serve` answers
//! with) and scores the same held-out samples. The scores equal the trainer's own
//! within 1e-6 (the scorer's products run in one batch, the trainer's in two
//! halves, so a kernel of another summation order may be chosen).
//!
//! ```text
//! cargo run --release -p tiderec-examples --example export_score [-- DIR]
//! ```
//!
//! The export is what `scripts/torch_model.py` loads as a PyTorch `nn.Module` and
//! `scripts/reference_scorer.py` rebuilds in NumPy.

use std::path::PathBuf;
use tiderec::serve::Loaded;
use tiderec::serving::{export, TableLayout};
use tiderec_operators::nn::{DlrmConfig, ModelConfig};
use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
use tiderec_operators::Batch;
use tiderec_sinks::checkpoint::manifest::Manifest;
use tiderec_sinks::checkpoint::write::write_checkpoint;
use tiderec_sources::synthetic::{SyntheticConfig, SyntheticCriteo, NUM_DENSE, NUM_SPARSE};

/// Samples of one step, over all workers.
const BATCH: u64 = 240;
/// Training steps.
const STEPS: u64 = 40;
/// Held-out samples, after every trained one.
const HELD_OUT: u64 = 400;

fn main() {
    // A directory of this run's own: the one given (new or empty), or a temporary one.
    let given = std::env::args().nth(1).map(PathBuf::from);
    let dir =
        given.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("tiderec-export-{}", std::process::id())));
    if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()) {
        eprintln!("{} is not empty: give a new or empty directory", dir.display());
        std::process::exit(2);
    }
    let data = SyntheticCriteo::new(SyntheticConfig::kaggle_like(7, 5000)).expect("valid synthetic config");
    let model = ModelConfig::Dlrm(DlrmConfig { bottom: vec![32, 16], top: vec![32, 1], ..DlrmConfig::kaggle() });
    let config = TrainerConfig::builder(model, data.config().table_sizes.clone()).seed(7).build().expect("valid");

    // 1. Train, evaluate the held-out samples, hand back the parts.
    let (c, d) = (config.clone(), data.clone());
    let results = timely::execute(timely::Config::process(2), move |worker| {
        let (me, peers) = (worker.index() as u64, worker.peers() as u64);
        let mut trainer = Trainer::new(worker, &c).expect("valid config");
        let micro = BATCH / peers;
        for step in 0..STEPS {
            let start = step * BATCH + me * micro;
            let mut batch = Batch::new(NUM_DENSE, NUM_SPARSE);
            d.fill(start..start + micro, &mut batch);
            trainer.step(worker, StepKind::Train, batch).expect("a batch of the model's shape");
        }
        // Worker w evaluates the w-th share of the held-out samples; worker 0 gathers them in worker order.
        let share = HELD_OUT / peers;
        let mut held_out = Batch::new(NUM_DENSE, NUM_SPARSE);
        d.fill(held_out_start() + me * share..held_out_start() + (me + 1) * share, &mut held_out);
        trainer.step(worker, StepKind::Eval, held_out).expect("a batch of the model's shape");
        let eval = trainer.take_eval();
        (trainer.snapshot().expect("a host trainer's state"), (me == 0).then_some(eval.probs))
    })
    .expect("timely starts")
    .join();
    let mut parts = Vec::new();
    let mut trained_scores = Vec::new();
    for r in results {
        let (part, probs) = r.expect("no worker panicked");
        parts.push(part);
        trained_scores.extend(probs.unwrap_or_default());
    }

    // 2. Write the checkpoint and export it.
    std::fs::create_dir_all(&dir).expect("a checkpoint directory");
    let (path, _) = write_checkpoint(&dir, &parts, Manifest::for_trainer(&config, STEPS, BATCH), 3)
        .expect("the checkpoint is written");
    let serve_dir = dir.join("serve");
    let summary = export(&path, &serve_dir, TableLayout::Whole).expect("the checkpoint exports");
    println!(
        "exported step {} to {}: {} dense parameters, {} embedding rows",
        summary.step,
        serve_dir.display(),
        summary.dense_params,
        summary.embedding_rows
    );
    let model_json = std::fs::read_to_string(serve_dir.join("model.json")).expect("model.json is written");
    assert!(model_json.contains("\"bottom.0.weight\"") && model_json.contains("\"embeddings.C1\""));

    // 3. Load the checkpoint as a scorer and score the held-out samples in one batch.
    let mut loaded = Loaded::load(&path).expect("the checkpoint loads");
    let mut batch = loaded.batch();
    data.fill(held_out_start()..held_out_start() + HELD_OUT, &mut batch);
    let mut scores = Vec::new();
    loaded.score(&mut batch, &mut scores).expect("the samples score");
    assert_eq!(scores.len(), trained_scores.len(), "one score per held-out sample");
    let worst = scores.iter().zip(&trained_scores).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let (lo, hi) = scores.iter().fold((1.0f32, 0.0f32), |(lo, hi), &p| (lo.min(p), hi.max(p)));
    println!(
        "scored {} held-out samples with the {} model of step {}: probabilities {lo:.4}..{hi:.4}, \
         largest difference from the trainer's own {worst:e}",
        scores.len(),
        loaded.model_name,
        loaded.step
    );
    assert!(worst <= 1e-6, "the loaded model scores like the trained one (difference {worst:e})");
    assert!(hi - lo > 1e-3, "a trained model tells samples apart");
    if given.is_none() {
        std::fs::remove_dir_all(&dir).expect("the temporary directory is removed");
    }
}

/// The first held-out sample: the one after every trained sample.
fn held_out_start() -> u64 {
    STEPS * BATCH
}
