//! Synchronous hybrid-parallel training on timely dataflow.
//!
//! Every worker holds a full copy of the dense model (data parallel) and owns
//! the embedding rows that [`shard_of`](crate::routing::shard_of) assigns to it (model parallel). One
//! training step is one timely timestamp `t` and five exchanges:
//!
//! ```text
//! command@t ─► plan: de-duplicate ids per table, one request per owner
//!           ─► serve (at the owner): gather rows                    [rows]
//!           ─► compute (at home, after all W replies): forward/backward
//!           ─► update (at slice owner k, after all W gradient messages):
//!                 sparse rows owned by k ← Σ gradients / global batch
//!                 dense slice k ← optimizer(Σ slice-k gradients / global batch)
//!           ─► gather (everywhere, after all W slices): copy slices into the model
//! ```
//!
//! A deep model's `partial` exchange (DES first-layer shares) inserts one
//! stage between compute and update: homes send the partial results'
//! gradients, owners turn them into row gradients and add their share of the
//! first layer's weight gradient to their own dense gradient, and only then
//! does every worker send its dense slices.
//!
//! Who owns what, and how the two sides meet. A worker's state has three
//! parts, each behind its own `Rc<RefCell<…>>` that the trainer owns and
//! hands to the stages: the home side (`Home`, in `home/`: the current
//! micro-batch's lookup plan and the buffers of its forward and backward
//! pass), the owner side (`Owner`, in `owner.rs`: the embedding store, the
//! replicated rows, the dense optimizer of this worker's slice and what it
//! keeps of each request between serving it and applying its gradients), and
//! the dense replica (`Dense`, in `shared.rs`: the model with its flat
//! parameters and gradients, and the worker's index and worker count). Home
//! and owner never name each other: each stage in `dataflow.rs` borrows the
//! parts it needs and passes `Dense` to whichever side runs, and the home's
//! forward pass reads the owner's rows only through the read-only view
//! `LocalRows` (replicated rows, first-layer weights, the rows' sum of
//! squares) that the owner hands out. Everything else between them travels
//! as the messages of `messages.rs`. `clock.rs` times each stage of a step
//! ([`Trainer::step_times`]). `sync.rs` holds the rendezvous, the byte
//! ledger and the step outcome; where rows and dense slices live is decided
//! only by [`crate::routing`]; this file checks the configuration, builds
//! the parts and drives the steps.
//!
//! Invariants:
//! * Every worker sends exactly one message to every worker at every stage,
//!   so each stage knows a step is complete when it holds `W` messages for
//!   that timestamp; it never waits for a frontier.
//! * Owner `k` answers lookups of step `t + 1` only after applying the
//!   gradients of step `t`: a request of step `t + 1` is sent only after its
//!   sender gathered every slice of step `t`, and owner `k` sends its slice
//!   only after applying its sparse gradients. With first-layer shares the
//!   owner also waits until it has gathered step `t` itself (it reads the
//!   dense layer).
//! * Messages are combined in worker order, so a run is deterministic for a
//!   seed and worker count, and the parameters after step `t` are those of a
//!   single worker that trained on the union of the micro-batches, up to the
//!   reassociation of float sums.
//! * Gradients travel unnormalised; owners divide by the global batch size,
//!   which they learn from the same messages.
//! * A worker's failure is reported in the step it happened in (see
//!   `dataflow.rs`): its trainer returns the error from that step and every
//!   other worker sees [`StepStats::failed_workers`] in the same step's
//!   statistics; no worker runs a step the others do not.

use crate::bad_record::BadReason;
use crate::batch::Batch;
use crate::error::{FeatureCounts, FeatureSlot, ShapeError};
use crate::exchange::{ExchangeConfig, TableExchange};
use crate::metrics::EvalSet;
use crate::nn::{FmPartial, Model, ModelConfig};
use crate::optim::{DenseOptimizerKind, OptimizerParams, SparseOptimizerKind};
use crate::snapshot::WorkerSnapshot;
use crate::store::{DeviceStore, StoreConfig, StoreParams, StoreStats};
use crate::OperatorError;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::rc::Rc;
use timely::worker::Worker;

mod builder;
mod changed_rows;
mod clock;
mod dataflow;
mod engine;
mod home;
mod messages;
mod online;
mod operator;
mod owner;
mod shared;
mod sync;

pub use crate::routing::dense_slice;
pub use builder::{TrainerConfigBuilder, DEFAULT_SEED, DENSE_INITIAL_ACCUMULATOR, SPARSE_INITIAL_ACCUMULATOR};
pub use clock::StepTimes;
use dataflow::{CommandInput, Shared};
pub use engine::{EngineStep, NextBatch, StepEngine};
use home::Home;
pub use messages::{GradientMessage, LookupReply, LookupRequest, ParamUpdate};
pub use online::{OnlineStep, OnlineSummary};
pub use operator::{Train, TrainHandle};
use owner::Owner;
use shared::Dense;

/// Everything a worker needs to build its part of the training dataflow.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainerConfig {
    /// Model kind and shape.
    pub model: ModelConfig,
    /// Rows per embedding table (one per sparse field).
    pub table_sizes: Vec<u64>,
    /// Seed of every random initialisation.
    pub seed: u64,
    /// Optimizer of the dense parameters.
    pub dense_optimizer: DenseOptimizerKind,
    /// Its hyper-parameters.
    pub dense_hp: OptimizerParams,
    /// Optimizer of the embedding rows.
    pub sparse_optimizer: SparseOptimizerKind,
    /// Its hyper-parameters.
    pub sparse_hp: OptimizerParams,
    /// For each sequence field of the model, the table its ids index (a sequence
    /// of items shares the target item's table). Empty for models without sequences.
    #[serde(default)]
    pub sequence_tables: Vec<usize>,
    /// Where each worker keeps its embedding rows (default: the fixed dense table).
    #[serde(default)]
    pub store: StoreConfig,
    /// How each table's embeddings travel between workers (default: rows, nothing replicated).
    #[serde(default)]
    pub exchange: ExchangeConfig,
}

impl TrainerConfig {
    /// What worker `worker` of `workers` builds the store of the rows it owns from.
    pub fn store_params(&self, (worker, workers): (usize, usize)) -> StoreParams<'_> {
        StoreParams {
            worker,
            workers,
            dim: self.model.embedding_dim(),
            table_sizes: &self.table_sizes,
            seed: self.seed,
            optimizer: self.sparse_optimizer,
            hp: self.sparse_hp,
        }
    }

    /// Checks the configuration; errors name the key.
    pub fn validate(&self) -> Result<(), OperatorError> {
        self.model.validate()?;
        if self.table_sizes.len() != self.model.num_sparse() {
            return Err(OperatorError::config(
                "table_sizes",
                format!("{} table sizes for {} sparse fields", self.table_sizes.len(), self.model.num_sparse()),
            ));
        }
        if self.sequence_tables.len() != self.model.num_sequences() {
            return Err(OperatorError::config(
                "sequence_tables",
                format!(
                    "{} sequence tables for {} sequence fields",
                    self.sequence_tables.len(),
                    self.model.num_sequences()
                ),
            ));
        }
        if let Some(&t) = self.sequence_tables.iter().find(|&&t| t >= self.table_sizes.len()) {
            return Err(OperatorError::config(
                "sequence_tables",
                format!("table {t} does not exist ({} tables)", self.table_sizes.len()),
            ));
        }
        if let Some(t) = self.table_sizes.iter().position(|&n| n == 0) {
            return Err(OperatorError::config("table_sizes", format!("table {t} has zero rows")));
        }
        self.store.validate()?;
        self.exchange.validate(&self.model, &self.table_sizes, &self.store)?;
        self.dense_hp.validate("")?;
        self.sparse_hp.validate("sparse_")?;
        // FTRL divides by its learning rate: a schedule that reaches 0 makes every row inf or NaN.
        let decay = self.sparse_hp.schedule.decay;
        if let Some(why) = self.sparse_optimizer.refuses_decay_to_zero(decay.name()).filter(|_| decay.reaches_zero()) {
            return Err(OperatorError::config("lr_decay", why));
        }
        Ok(())
    }
}

/// What a step does with its micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepKind {
    /// Forward, backward and update.
    Train,
    /// Forward only; predictions are gathered on worker 0.
    Eval,
    /// No data; reports the parameters' sum of squares.
    Report,
}

/// Statistics of one step, summed over all workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepStats {
    /// Samples in the global batch.
    pub samples: u64,
    /// Σ BCE loss over the global batch.
    pub loss_sum: f64,
    /// Bytes every worker has sent to other workers in the steps before this one
    /// (cumulative; deterministic: each message counts toward its own step).
    pub bytes_sent: u64,
    /// Σ of squares of all parameters (only in `Report` steps).
    pub sum_squares: f64,
    /// Workers that reported a fatal error in this step, each counted once; the imperative
    /// trainer's callers stop every worker when it is non-zero. A failure found before the
    /// update (a batch that did not fit, a failed model pass, a store that failed serving
    /// its rows) leaves every parameter as it was; a store in another memory that failed
    /// updating its rows leaves them undefined, and the other owners' updates of the step stand.
    pub failed_workers: u64,
    /// Malformed records skipped so far, by [`BadReason::index`](crate::bad_record::BadReason::index) (cumulative).
    pub bad_records: [u64; BadReason::COUNT],
    /// Owners that found a non-finite value in this training step: the global loss (then
    /// no parameter was updated), their summed row gradients, the rows (values and
    /// optimizer state) and replicated rows they updated in CPU memory, or their updated
    /// dense slice.
    /// Every worker sees the same count; the model is ruined when it is non-zero.
    #[serde(default)]
    pub non_finite: u64,
    /// Workers asked to stop (SIGINT/SIGTERM) when they sent this step; every worker sees
    /// the same count, so all of them can stop after the same step.
    #[serde(default)]
    pub stop_requests: u64,
}

impl StepStats {
    /// Whether a training step with these statistics updated the parameters: it had
    /// samples, no worker failed in it and its loss was finite (otherwise every owner
    /// left every parameter as it was).
    pub fn updates_parameters(&self) -> bool {
        self.samples > 0 && self.failed_workers == 0 && self.loss_sum.is_finite()
    }

    fn add(&mut self, o: &StepStats) {
        self.samples += o.samples;
        self.loss_sum += o.loss_sum;
        self.bytes_sent += o.bytes_sent;
        self.sum_squares += o.sum_squares;
        self.failed_workers += o.failed_workers;
        self.non_finite += o.non_finite;
        self.stop_requests += o.stop_requests;
        for (a, b) in self.bad_records.iter_mut().zip(o.bad_records) {
            *a += b;
        }
    }
}

/// The command a worker feeds into the dataflow for one step.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Command {
    /// What to do.
    pub kind: StepKind,
    /// This worker's micro-batch.
    pub batch: Batch,
    /// This worker hit a fatal error and asks every worker to stop after this step.
    pub failed: bool,
    /// Malformed records this worker has skipped so far, by reason index.
    pub bad_records: [u64; BadReason::COUNT],
    /// Also gather a training step's predictions, made before its update, on worker 0
    /// (prequential evaluation: every batch is scored before it is trained on).
    #[serde(default)]
    pub score: bool,
    /// This worker was asked to stop (a signal); counted in [`StepStats::stop_requests`].
    #[serde(default)]
    pub stop: bool,
}

/// Drives one worker's share of synchronous training.
///
/// ```
/// use tiderec_operators::nn::{DlrmConfig, ModelConfig};
/// use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
/// use tiderec_operators::Batch;
///
/// let model = ModelConfig::Dlrm(DlrmConfig {
///     num_dense: 2, num_sparse: 1, dim: 4, bottom: vec![4], top: vec![1], self_interaction: false,
/// });
/// let config = TrainerConfig::builder(model, vec![10]).seed(1).lr(0.1).sparse_lr(0.1).build().unwrap();
/// timely::execute(timely::Config::process(2), move |worker| {
///     let mut trainer = Trainer::new(worker, &config).unwrap();
///     let mut batch = Batch::new(2, 1);
///     batch.labels.push(1.0);
///     batch.dense.extend([0.5, 1.0]);
///     batch.sparse[0].ids.push(worker.index() as u64);
///     batch.sparse[0].close_bag();
///     let stats = trainer.step(worker, StepKind::Train, batch).unwrap();
///     assert_eq!(stats.samples, 2); // one sample from each of the two workers
/// }).unwrap();
/// ```
pub struct Trainer {
    input: CommandInput,
    shared: Shared,
    config: TrainerConfig,
    step: u64,
    /// Training steps that updated the parameters (restored from checkpoints).
    train_steps: u64,
    bad_records: [u64; BadReason::COUNT],
    score_train: bool,
    stop_requested: bool,
    /// The engine that computes this worker's steps, if one does (see [`StepEngine`]).
    engine: Option<RefCell<engine::Engine>>,
    /// Steps the engine ran (not through the dataflow, whose steps `step` counts).
    engine_steps: u64,
}

impl Trainer {
    /// Builds this worker's part of the training dataflow.
    pub fn new(worker: &mut Worker, config: &TrainerConfig) -> Result<Self, OperatorError> {
        let model = config.model.build::<f32>(config.seed)?;
        Self::with_model(worker, config, model)
    }

    /// As [`Trainer::new`], with this worker's model built by the caller: `config.model`
    /// computing on a GPU, say, or a model of your own through the
    /// [`Model`] trait (the `custom_model` example), declared in the configuration as
    /// [`ModelConfig::Custom`] with the inputs it reads.
    /// The trainer takes the input shape from `config.model` (dense features, sparse and
    /// sequence fields, embedding width, which the model must read) and everything else
    /// from the model: its flat parameters are what it all-reduces, updates and snapshots.
    /// Every worker's model must start from the same parameters (for `config.model`,
    /// initialised from `config.seed`). A model without a DES partial form is refused
    /// when the exchange uses one.
    pub fn with_model(
        worker: &mut Worker,
        config: &TrainerConfig,
        model: Box<dyn Model<f32>>,
    ) -> Result<Self, OperatorError> {
        Self::build(worker, config, model, None)
    }

    /// As [`Trainer::with_model`], with the rows this worker owns in `store`, which
    /// holds them in another memory (a GPU worker's rows on its device, see
    /// [`DeviceStore`]) instead of the store `config.store` names. The store must
    /// hold every row this worker owns (`shard_of`), each starting as the fixed
    /// store starts it for the seed, under the configured row optimizer; a failure
    /// it reports in a step fails that step on every worker.
    pub fn with_model_and_store(
        worker: &mut Worker,
        config: &TrainerConfig,
        model: Box<dyn Model<f32>>,
        store: Box<dyn DeviceStore>,
    ) -> Result<Self, OperatorError> {
        Self::build(worker, config, model, Some(store))
    }

    fn build(
        worker: &mut Worker,
        config: &TrainerConfig,
        model: Box<dyn Model<f32>>,
        store: Option<Box<dyn DeviceStore>>,
    ) -> Result<Self, OperatorError> {
        let (shared, deep_partial) = prepare((worker.index(), worker.peers()), config, model, store)?;
        let input = dataflow::build(worker, &shared, deep_partial);
        Ok(Trainer {
            input,
            shared,
            config: config.clone(),
            step: 0,
            train_steps: 0,
            bad_records: [0; BadReason::COUNT],
            score_train: false,
            stop_requested: false,
            engine: None,
            engine_steps: 0,
        })
    }

    /// As [`Trainer::with_model`], with every training and evaluation step
    /// computed by `engine` (a GPU that holds the rows, the model and the
    /// optimizers, say); `model` is the host mirror of its dense model (see
    /// [`StepEngine`]). The engine starts from the state this trainer starts
    /// from. Only a trainer of one worker in all takes an engine.
    pub fn with_engine(
        worker: &mut Worker,
        config: &TrainerConfig,
        model: Box<dyn Model<f32>>,
        engine: Box<dyn StepEngine>,
    ) -> Result<Self, OperatorError> {
        if worker.peers() != 1 {
            return Err(OperatorError::config(
                "engine",
                format!("a step engine owns every row: it trains alone, not with {} workers", worker.peers()),
            ));
        }
        let mut trainer = Self::with_model(worker, config, model)?;
        trainer.engine = Some(RefCell::new(engine::Engine::new(engine, &config.table_sizes)));
        trainer.load_engine()?;
        Ok(trainer)
    }

    /// Runs one synchronous step with this worker's micro-batch (possibly
    /// empty) and returns the statistics summed over all workers. Every worker
    /// must call `step` the same number of times with the same `kind`.
    ///
    /// A batch that does not fit the model is an error here and a failed step
    /// for every other worker ([`StepStats::failed_workers`]), so no worker
    /// waits forever for this one. So is a failure of this worker's device
    /// found in the step (its model's backend in the passes, its store serving,
    /// updating or reporting its rows): [`OperatorError::Device`] here, the same
    /// step failed on every other worker, and no further step is needed for
    /// them to learn of it. A model that returns another number of logits than
    /// the batch has samples fails its step the same way, with
    /// [`OperatorError::ModelOutput`].
    pub fn step(&mut self, worker: &mut Worker, kind: StepKind, batch: Batch) -> Result<StepStats, OperatorError> {
        self.step_then_prepare(worker, kind, batch, || None)
    }

    /// [`step`](Self::step), and while a training or evaluation step runs on a
    /// [`StepEngine`], `next` gives the batch the next step is likely to be given, which
    /// the engine prepares (a GPU builds and uploads it while the device computes). The
    /// same steps as `step` whatever `next` gives; `next` is called at most once, and
    /// only for a training or evaluation step on an engine.
    pub fn step_then_prepare(
        &mut self,
        worker: &mut Worker,
        kind: StepKind,
        batch: Batch,
        mut next: impl FnMut() -> Option<Batch>,
    ) -> Result<StepStats, OperatorError> {
        if let Err(e) = self.check_batch(&batch) {
            self.step_failed(worker);
            return Err(e);
        }
        if self.engine.is_some() {
            let stats = self.engine_step(worker, kind, batch, &mut next)?;
            if kind == StepKind::Train && stats.updates_parameters() {
                self.train_steps += 1;
            }
            return Ok(stats);
        }
        let stats = self.run_dataflow(worker, kind, batch);
        self.dataflow_result(kind, stats)
    }

    /// The result of a step this worker ran through the dataflow: the failure of its
    /// device (its model's passes or its store) or of its model's output found in that
    /// step, which every other worker saw in the same step's
    /// [`StepStats::failed_workers`], as its error; else the statistics.
    fn dataflow_result(&mut self, kind: StepKind, stats: StepStats) -> Result<StepStats, OperatorError> {
        let model = self.shared.home.borrow_mut().take_failure();
        let store = self.shared.owner.borrow_mut().take_failure();
        if let Some(error) = model {
            return Err(error);
        }
        if let Some(message) = store {
            return Err(OperatorError::Device { worker: self.shared.dense.borrow().me(), message });
        }
        if kind == StepKind::Train && stats.updates_parameters() {
            self.train_steps += 1;
        }
        Ok(stats)
    }

    /// One step of this worker's dataflow.
    fn run_dataflow(&mut self, worker: &mut Worker, kind: StepKind, batch: Batch) -> StepStats {
        self.run(
            worker,
            Command {
                kind,
                batch,
                failed: false,
                bad_records: self.bad_records,
                score: self.score_train,
                stop: self.stop_requested,
            },
        )
    }

    /// Takes part in one step with no data while telling every worker that
    /// this one has failed; all workers see `failed_workers > 0` in the result
    /// and can stop together instead of waiting for each other forever.
    pub fn step_failed(&mut self, worker: &mut Worker) -> StepStats {
        let batch = self.empty_batch();
        self.run(
            worker,
            Command {
                kind: StepKind::Train,
                batch,
                failed: true,
                bad_records: self.bad_records,
                score: false,
                stop: self.stop_requested,
            },
        )
    }

    fn run(&mut self, worker: &mut Worker, command: Command) -> StepStats {
        const PARK: std::time::Duration = std::time::Duration::from_millis(1);
        let clock = self.shared.clock.clone();
        clock::timed_step(&clock, || {
            self.input.send(command);
            self.step += 1;
            self.input.advance_to(self.step);
            while self.shared.outcome.borrow().completed() < self.step {
                // Park while waiting for the other workers (a message wakes the thread), so a
                // waiting worker leaves its core to the others; at most `PARK` at a time, so a
                // wake-up that never comes costs a poll, never a hang.
                worker.step_or_park(Some(PARK));
            }
            self.shared.outcome.borrow().stats()
        })
    }

    /// A batch with no samples and the model's shape.
    fn empty_batch(&self) -> Batch {
        empty_batch(&self.config)
    }

    fn check_batch(&self, batch: &Batch) -> Result<(), OperatorError> {
        check_batch(&self.config, batch)
    }

    /// Lets this worker plan its lookups, pool its rows and sum its rows' gradients
    /// on a pool of `threads` threads of its own while its thread waits (1, the
    /// default, starts none and keeps the work on its thread; a step takes one
    /// thread per 8,192 ids): a worker with cores to spare, such as a GPU worker
    /// whose model runs on its device, keeps up with large batches. A step's
    /// results do not depend on it. A trainer whose steps an engine computes
    /// ([`Trainer::with_engine`]) starts none.
    pub fn set_host_threads(&mut self, threads: usize) {
        let threads = if self.engine.is_some() { 1 } else { threads };
        self.shared.home.borrow_mut().set_threads(threads);
    }

    /// Whether training steps also gather their predictions (made before the step's update)
    /// on worker 0, for [`Trainer::take_eval`]: prequential evaluation of a stream.
    pub fn set_score_training(&mut self, score: bool) {
        self.score_train = score;
    }

    /// Whether this worker asks every worker to stop; it travels with the next steps'
    /// messages and comes back as [`StepStats::stop_requests`] on every worker.
    pub fn set_stop_requested(&mut self, stop: bool) {
        self.stop_requested = stop;
    }

    /// Sets the cumulative malformed-record counts this worker reports with its next steps.
    pub fn set_bad_records(&mut self, counts: [u64; BadReason::COUNT]) {
        self.bad_records = counts;
    }

    /// Takes the predictions gathered by `Eval` steps so far (non-empty on worker 0 only).
    pub fn take_eval(&mut self) -> EvalSet {
        std::mem::take(&mut *self.shared.eval.borrow_mut())
    }

    /// L2 norm over all parameters, dense and embedding, as f64 (a `Report` step; collective).
    pub fn params_l2(&mut self, worker: &mut Worker) -> Result<f64, OperatorError> {
        let stats = self.step(worker, StepKind::Report, self.empty_batch())?;
        Ok(stats.sum_squares.sqrt())
    }

    /// Number of dense (model) parameters.
    pub fn num_dense_params(&self) -> usize {
        self.shared.dense.borrow().params().len()
    }

    /// This worker's copy of the dense parameters (with a [`StepEngine`], read from it).
    pub fn dense_params(&self) -> Result<Vec<f32>, OperatorError> {
        self.sync_host()?;
        Ok(self.shared.dense.borrow().params().to_vec())
    }

    /// Bytes this worker sent to other workers in the steps it has completed
    /// (the same figure whatever the timing of the other workers).
    pub fn bytes_sent(&self) -> u64 {
        self.shared.bytes.borrow().before(self.step)
    }

    /// Seconds this worker spent in its steps so far, in all and inside each
    /// stage of the dataflow; `StepTimes::since` of two readings times the steps between them.
    pub fn step_times(&self) -> StepTimes {
        *self.shared.clock.borrow()
    }

    /// Number of embedding rows this worker owns.
    pub fn owned_rows(&self) -> usize {
        self.shared.owner.borrow().num_rows()
    }

    /// This worker's embedding-store counters (lookups per tier, rows per tier, admissions, evictions).
    pub fn store_stats(&self) -> StoreStats {
        self.shared.owner.borrow().store_stats()
    }

    /// The configuration this trainer was built with.
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }

    /// Number of steps run so far.
    pub fn steps(&self) -> u64 {
        self.step + self.engine_steps
    }

    /// Training steps that updated the parameters, counting those of a restored checkpoint.
    pub fn train_steps(&self) -> u64 {
        self.train_steps
    }

    /// This worker's share of a checkpoint: its dense parameters (the same on
    /// every worker), the dense-optimizer state of its slice, every embedding
    /// row it owns with its optimizer slots, and the training step count.
    /// Between two steps this is a consistent cut: no update of the next step
    /// can reach this worker's rows before this worker sends its gradients.
    /// With a [`StepEngine`], the engine's state is read first; that can fail.
    pub fn snapshot(&self) -> Result<WorkerSnapshot, OperatorError> {
        self.sync_host()?;
        let dense = self.shared.dense.borrow();
        let part =
            self.shared.owner.borrow().snapshot(&dense, self.train_steps, (self.config.seed, &self.config.table_sizes));
        self.store_failed()?;
        Ok(part)
    }

    /// The failure a store in another memory recorded (reading its rows back, say), as an error.
    fn store_failed(&self) -> Result<(), OperatorError> {
        match self.shared.owner.borrow_mut().take_store_error() {
            Some(message) => Err(OperatorError::Device { worker: self.shared.dense.borrow().me(), message }),
            None => Ok(()),
        }
    }

    /// This worker's share of a checkpoint, from which the next delta counts:
    /// whole, like [`snapshot`](Self::snapshot), or with `parent` only the rows
    /// changed since the checkpoint of step `parent` (the previous checkpoint
    /// snapshot of this trainer, see [`checkpoint_mark`](Self::checkpoint_mark)),
    /// with the whole dense state. A consistent cut like `snapshot`.
    /// With a [`StepEngine`] the rows are those of the batches trained on it
    /// since `parent`, as the engine holds them.
    pub fn checkpoint_snapshot(&self, parent: Option<u64>) -> Result<WorkerSnapshot, OperatorError> {
        self.sync_host()?;
        let dense = self.shared.dense.borrow();
        let writer = (self.config.seed, &self.config.table_sizes[..]);
        if let Some(cell) = &self.engine {
            let whole = self.shared.owner.borrow().snapshot(&dense, self.train_steps, writer);
            return cell.borrow_mut().checkpoint_part(whole, parent);
        }
        let part = self.shared.owner.borrow_mut().checkpoint_snapshot(&dense, self.train_steps, writer, parent)?;
        self.store_failed()?;
        Ok(part)
    }

    /// The step of the last [`checkpoint_snapshot`](Self::checkpoint_snapshot)
    /// (`None` before the first one and after a restore): a delta can follow it.
    pub fn checkpoint_mark(&self) -> Option<u64> {
        if let Some(cell) = &self.engine {
            return cell.borrow().marked();
        }
        self.shared.owner.borrow().marked()
    }

    /// Rebuilds this worker's state from the parts of a checkpoint written by
    /// any number of workers (see [`crate::snapshot`]): the dense parameters,
    /// the dense-optimizer state of this worker's slice `dense_slice(len, me, W)`,
    /// the rows `shard_of` assigns to this worker, and the step count. The
    /// parts are checked completely first; on error nothing is changed.
    /// Not collective: every worker restores from the same parts on its own.
    pub fn restore(&mut self, parts: &[WorkerSnapshot]) -> Result<(), OperatorError> {
        {
            let mut dense = self.shared.dense.borrow_mut();
            let mut owner = self.shared.owner.borrow_mut();
            let writer = (self.config.seed, &self.config.table_sizes[..]);
            let step = owner.restore(&mut dense, parts, writer, self.config.dense_optimizer)?;
            self.train_steps = step;
        }
        self.load_engine()
    }
}

/// A worker's empty micro-batch for `config`'s model.
fn empty_batch(config: &TrainerConfig) -> Batch {
    let m = &config.model;
    Batch::with_sequences(m.num_dense(), m.num_sparse(), m.num_sequences())
}

/// Checks that `batch` fits `config`'s model: its feature counts, its bags, its ids
/// inside their tables.
fn check_batch(config: &TrainerConfig, batch: &Batch) -> Result<(), OperatorError> {
    let m = &config.model;
    if batch.num_dense != m.num_dense()
        || batch.sparse.len() != m.num_sparse()
        || batch.sequences.len() != m.num_sequences()
    {
        return Err(ShapeError::FeatureCounts {
            batch: FeatureCounts {
                dense: batch.num_dense,
                sparse: batch.sparse.len(),
                sequences: batch.sequences.len(),
            },
            model: FeatureCounts { dense: m.num_dense(), sparse: m.num_sparse(), sequences: m.num_sequences() },
        }
        .into());
    }
    batch.check()?;
    let tables = (0..m.num_sparse()).chain(config.sequence_tables.iter().copied());
    for ((k, field), t) in batch.sparse.iter().chain(&batch.sequences).enumerate().zip(tables) {
        if let Some(&id) = field.ids.iter().find(|&&id| id >= config.table_sizes[t]) {
            return Err(ShapeError::IdOutsideTable {
                slot: FeatureSlot::nth(k, m.num_sparse()),
                id,
                table: t,
                rows: config.table_sizes[t],
            }
            .into());
        }
    }
    for (f, field) in batch.sparse.iter().enumerate() {
        if config.exchange.table(f) == TableExchange::Partial {
            if let Some(i) = (0..field.len()).find(|&i| field.bag(i).len() > 1) {
                return Err(ShapeError::MultiIdPartial { field: f, sample: i, ids: field.bag(i).len() }.into());
            }
        }
    }
    if let Some(first) = batch.sequences.first() {
        let max = m.max_sequence_len();
        if let Some(i) = (0..batch.len()).find(|&i| first.bag(i).len() > max) {
            return Err(ShapeError::SequenceTooLong { sample: i, len: first.bag(i).len(), max_len: max }.into());
        }
    }
    Ok(())
}

/// Checks `config` and `model` and builds this worker's state (`me` of `workers`); also
/// whether a deep model's fields travel as partial results.
fn prepare(
    (me, workers): (usize, usize),
    config: &TrainerConfig,
    mut model: Box<dyn Model<f32>>,
    store: Option<Box<dyn DeviceStore>>,
) -> Result<(Shared, bool), OperatorError> {
    config.validate()?;
    // An invalid `TIDEREC_MAX_ISA` is refused, not run under a cap it did not name.
    crate::cpu::check().map_err(crate::ConfigError::from)?;
    crate::cpu::check_amx_emulation()?;
    check_model(config, model.as_mut())?;
    let partial = partial_form(config);
    let deep_partial = partial.is_some_and(|p| p.deep.is_some());
    Ok((shared_state((me, workers), config, partial, model, store)?, deep_partial))
}

/// Refuses a caller's model that does not fit the configuration: rows of another
/// width, another number of dense parameters than a built-in shape names, gradients
/// of another length than its parameters, or no partial form where the exchange
/// computes one.
fn check_model(config: &TrainerConfig, model: &mut dyn Model<f32>) -> Result<(), OperatorError> {
    let dim = config.model.embedding_dim();
    if model.embedding_dim() != dim {
        return Err(OperatorError::config(
            "model",
            format!("the worker's model reads rows of width {}, the shape {dim}", model.embedding_dim()),
        ));
    }
    // A built-in shape names every dense parameter: a model of another shape (other dense
    // inputs, layers or fields) has another count, and would misread every batch.
    let tensors = config.model.param_tensors();
    let expected: usize = tensors.iter().map(|t| t.len()).sum();
    if !tensors.is_empty() && model.params().len() != expected {
        return Err(OperatorError::config(
            "model",
            format!(
                "the worker's model has {} dense parameters, the configured {} shape {expected}",
                model.params().len(),
                config.model.name()
            ),
        ));
    }
    // The gradient is reduce-scattered by the parameters' slices: every slice must exist in it.
    if model.grads().len() != model.params().len() {
        return Err(OperatorError::config(
            "model",
            format!(
                "the worker's model has {} gradients for its {} dense parameters (they must be as many)",
                model.grads().len(),
                model.params().len()
            ),
        ));
    }
    if config.exchange.any_partial() && config.model.partial().is_some() && model.partial_model().is_none() {
        return Err(OperatorError::config(
            "exchange",
            "`partial` computes on the host: this worker's model has no partial form (use rows)",
        ));
    }
    Ok(())
}

/// The model's partial form when any field travels as partial results.
fn partial_form(config: &TrainerConfig) -> Option<FmPartial> {
    if config.exchange.any_partial() {
        config.model.partial()
    } else {
        None
    }
}

/// The table each lookup slot reads: sparse field `f` table `f`, sequence field `s` table `sequence_tables[s]`.
fn slot_tables(config: &TrainerConfig) -> Vec<usize> {
    (0..config.model.num_sparse()).chain(config.sequence_tables.iter().copied()).collect()
}

/// This worker's home side, owner side (with its rows initialised) and dense replica,
/// and the step bookkeeping the stages share.
fn shared_state(
    (me, workers): (usize, usize),
    config: &TrainerConfig,
    partial: Option<FmPartial>,
    model: Box<dyn Model<f32>>,
    store: Option<Box<dyn DeviceStore>>,
) -> Result<Shared, OperatorError> {
    let dense_len = model.params().len();
    let owner = Owner::new(config, slot_tables(config), partial, (me, workers), dense_len, store)?;
    let home = Home::new(config, slot_tables(config), partial, workers);
    Ok(Shared {
        home: Rc::new(RefCell::new(home)),
        owner: Rc::new(RefCell::new(owner)),
        dense: Rc::new(RefCell::new(Dense::new(model, me, workers))),
        outcome: Rc::default(),
        eval: Rc::default(),
        bytes: Rc::default(),
        clock: Rc::default(),
        next_step: Rc::default(),
    })
}
