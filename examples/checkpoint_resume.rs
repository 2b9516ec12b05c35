//! Checkpointing and resuming a trainer from your own program, through `tiderec-sinks`.
//!
//! Two workers train a small DLRM on a seeded synthetic stream for 30 steps; each
//! returns its [`Trainer::snapshot`] from `timely::execute`, and the program writes
//! them as one checkpoint directory ([`write_checkpoint`]: every file hashed and
//! fsynced, the directory renamed into place, the manifest from
//! [`Manifest::for_trainer`]). A second `timely::execute` finds the newest valid
//! checkpoint ([`find_latest`]), checks that it fits the configuration, restores it
//! and trains 30 more steps on the same stream. Its model is bit for bit that of one
//! uninterrupted 60-step run. (`Trainer::restore` also takes parts written by another
//! number of workers, resharding the rows; the model is then equal up to the order in
//! which the workers' gradients are summed.)
//!
//! ```text
//! cargo run --release -p tiderec-examples --example checkpoint_resume [-- DIR]
//! ```

use std::path::PathBuf;
use tiderec_operators::nn::{DlrmConfig, ModelConfig};
use tiderec_operators::snapshot::WorkerSnapshot;
use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
use tiderec_operators::Batch;
use tiderec_sinks::checkpoint::manifest::Manifest;
use tiderec_sinks::checkpoint::{find_latest, write::write_checkpoint};
use tiderec_sources::synthetic::{SyntheticConfig, SyntheticCriteo, NUM_DENSE, NUM_SPARSE};

/// Samples of one step, over all workers.
const BATCH: u64 = 240;
/// Steps before the checkpoint, and after it.
const STEPS: u64 = 30;

/// Trains steps `from..to` of the stream on this worker's share of each step's batch.
fn train(worker: &mut timely::worker::Worker, trainer: &mut Trainer, data: &SyntheticCriteo, from: u64, to: u64) {
    let (me, peers) = (worker.index() as u64, worker.peers() as u64);
    let micro = BATCH / peers;
    for step in from..to {
        let start = step * BATCH + me * micro;
        let mut batch = Batch::new(NUM_DENSE, NUM_SPARSE);
        data.fill(start..start + micro, &mut batch);
        trainer.step(worker, StepKind::Train, batch).expect("a batch of the model's shape");
    }
}

fn main() {
    // A directory of this run's own: the one given (new or empty), or a temporary one.
    let given = std::env::args().nth(1).map(PathBuf::from);
    let dir =
        given.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("tiderec-ckpt-{}", std::process::id())));
    if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()) {
        eprintln!("{} is not empty: give a new or empty directory", dir.display());
        std::process::exit(2);
    }
    let data = SyntheticCriteo::new(SyntheticConfig::kaggle_like(5, 5000)).expect("valid synthetic config");
    let model = ModelConfig::Dlrm(DlrmConfig { bottom: vec![32, 16], top: vec![32, 1], ..DlrmConfig::kaggle() });
    let config = TrainerConfig::builder(model, data.config().table_sizes.clone()).seed(5).build().expect("valid");

    // 1. Two workers train 30 steps and hand back their parts; the program writes the checkpoint.
    let (c, d) = (config.clone(), data.clone());
    let parts: Vec<WorkerSnapshot> = timely::execute(timely::Config::process(2), move |worker| {
        let mut trainer = Trainer::new(worker, &c).expect("valid config");
        train(worker, &mut trainer, &d, 0, STEPS);
        trainer.snapshot().expect("a host trainer's state")
    })
    .expect("timely starts")
    .join()
    .into_iter()
    .map(|r| r.expect("no worker panicked"))
    .collect();
    std::fs::create_dir_all(&dir).expect("a checkpoint directory");
    let manifest = Manifest::for_trainer(&config, STEPS, BATCH);
    let (path, _) = write_checkpoint(&dir, &parts, manifest, 3).expect("the checkpoint is written");
    println!("wrote {} ({} parts)", path.display(), parts.len());

    // 2. The workers resume from the newest valid checkpoint and train 30 more steps.
    let found = find_latest(&dir).expect("a readable directory").found.expect("a valid checkpoint");
    let recorded = tiderec_sinks::checkpoint::manifest::recorded_config(&config);
    found.manifest.check_compatible(&found.path, &recorded, config.seed, BATCH).expect("the run's configuration");
    let step = found.manifest.step;
    let (c, d) = (config.clone(), data.clone());
    let resumed = timely::execute(timely::Config::process(2), move |worker| {
        let mut trainer = Trainer::new(worker, &c).expect("valid config");
        trainer.restore(&found.parts).expect("the parts fit the model");
        train(worker, &mut trainer, &d, step, 2 * STEPS);
        trainer.params_l2(worker).expect("all workers agree")
    })
    .expect("timely starts")
    .join();

    // 3. The same 60 steps without a break, for comparison.
    let (c, d) = (config.clone(), data.clone());
    let straight = timely::execute(timely::Config::process(2), move |worker| {
        let mut trainer = Trainer::new(worker, &c).expect("valid config");
        train(worker, &mut trainer, &d, 0, 2 * STEPS);
        trainer.params_l2(worker).expect("all workers agree")
    })
    .expect("timely starts")
    .join();
    let l2 = |r: Vec<Result<f64, String>>| r.into_iter().next().expect("a worker").expect("no worker panicked");
    let (resumed, straight) = (l2(resumed), l2(straight));
    println!("resumed from step {step}: params L2 {resumed:.12}; uninterrupted: {straight:.12}");
    assert_eq!(resumed, straight, "the resumed model is the uninterrupted one");
    if given.is_none() {
        std::fs::remove_dir_all(&dir).expect("the temporary checkpoint directory is removed");
    }
}
