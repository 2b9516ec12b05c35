//! Synchronous hybrid-parallel training on timely dataflow.
//!
//! Every worker holds a full copy of the dense model (data parallel) and owns
//! the embedding rows that [`shard_of`] assigns to it (model parallel). One
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
//! The code: `messages.rs` holds the wire types, `home.rs` the home side
//! (plan, forward, backward), `owner.rs` the owner side (serve, partial
//! backward, update), `sync.rs` the rendezvous and the byte ledger; this file
//! builds the dataflow and drives the steps.
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

use crate::bad_record::BadReason;
use crate::batch::Batch;
use crate::error::{FeatureCounts, FeatureSlot, ShapeError};
use crate::exchange::{narrow_ids, ExchangeConfig, Replicas, TableExchange, WireIds};
use crate::metrics::EvalSet;
use crate::nn::{DeepShares, DeepWeights, ModelConfig};
use crate::optim::{DenseOptimizer, DenseOptimizerKind, OptimizerParams, SparseOptimizerKind};
use crate::shard::shard_of;
use crate::snapshot::{check_parts, Expected, WorkerSnapshot};
use crate::store::{EmbeddingStore, Store, StoreConfig, StoreParams, StoreStats};
use crate::OperatorError;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::rc::Rc;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::generic::operator::Operator;
use timely::dataflow::operators::Capability;
use timely::dataflow::InputHandle;
use timely::scheduling::Activator;
use timely::worker::Worker;

mod home;
mod messages;
mod online;
mod owner;
mod sync;

use home::{Home, TablePlan};
pub use messages::{dense_slice, GradientMessage, LookupReply, LookupRequest, ParamUpdate};
pub use online::{OnlineStep, OnlineSummary};
use owner::{Owner, Slots};
use sync::{ByteLedger, Rendezvous};

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
    /// Workers that reported a fatal error in this step; every worker stops when it is non-zero.
    pub failed_workers: u64,
    /// Malformed records skipped so far, by [`BadReason::index`](crate::bad_record::BadReason::index) (cumulative).
    pub bad_records: [u64; BadReason::COUNT],
    /// Owners that found a non-finite value in this training step: the global loss (then
    /// no parameter was updated), their summed row gradients or their updated dense slice.
    /// Every worker sees the same count; the model is ruined when it is non-zero.
    #[serde(default)]
    pub non_finite: u64,
    /// Workers asked to stop (SIGINT/SIGTERM) when they sent this step; every worker sees
    /// the same count, so all of them can stop after the same step.
    #[serde(default)]
    pub stop_requests: u64,
}

impl StepStats {
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

/// The outcome of the last completed step on this worker.
#[derive(Default)]
struct Outcome {
    completed: u64,
    stats: StepStats,
}

/// Drives one worker's share of synchronous training.
///
/// ```
/// use tiderec_operators::nn::{DlrmConfig, ModelConfig};
/// use tiderec_operators::optim::*;
/// use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
/// use tiderec_operators::Batch;
///
/// let config = TrainerConfig {
///     model: ModelConfig::Dlrm(DlrmConfig {
///         num_dense: 2, num_sparse: 1, dim: 4, bottom: vec![4], top: vec![1], self_interaction: false,
///     }),
///     table_sizes: vec![10],
///     seed: 1,
///     dense_optimizer: DenseOptimizerKind::Sgd,
///     dense_hp: OptimizerParams::with_lr(0.1),
///     sparse_optimizer: SparseOptimizerKind::Sgd,
///     sparse_hp: OptimizerParams::with_lr(0.1),
///     sequence_tables: vec![],
///     store: Default::default(),
///     exchange: Default::default(),
/// };
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
    input: InputHandle<u64, CapacityContainerBuilder<Vec<Command>>>,
    outcome: Rc<RefCell<Outcome>>,
    home: Rc<RefCell<Home>>,
    owner: Rc<RefCell<Owner>>,
    eval: Rc<RefCell<EvalSet>>,
    bytes_sent: Rc<RefCell<ByteLedger>>,
    config: TrainerConfig,
    step: u64,
    /// Training steps that updated the parameters (restored from checkpoints).
    train_steps: u64,
    bad_records: [u64; BadReason::COUNT],
    score_train: bool,
    stop_requested: bool,
}

impl Trainer {
    /// Builds this worker's part of the training dataflow.
    pub fn new(worker: &mut Worker, config: &TrainerConfig) -> Result<Self, OperatorError> {
        let model = config.model.build::<f32>(config.seed)?;
        Self::with_model(worker, config, model)
    }

    /// As [`Trainer::new`], with this worker's model built by the caller: `config.model`
    /// computing on a GPU, say, or a model of your own through the
    /// [`Model`](crate::nn::Model) trait (the `custom_model` example). The trainer
    /// takes the input shape from `config.model` (dense features, sparse and sequence
    /// fields, embedding width, which the model must read) and everything else from
    /// the model: its flat parameters are what it all-reduces, updates and snapshots.
    /// Every worker's model must start from the same parameters (for `config.model`,
    /// initialised from `config.seed`). A model without a DES partial form is refused
    /// when the exchange uses one.
    pub fn with_model(
        worker: &mut Worker,
        config: &TrainerConfig,
        mut model: Box<dyn crate::nn::Model<f32>>,
    ) -> Result<Self, OperatorError> {
        config.validate()?;
        let me = worker.index();
        let workers = worker.peers();
        let dim = config.model.embedding_dim();
        if model.embedding_dim() != dim {
            return Err(OperatorError::config(
                "model",
                format!("the worker's model reads rows of width {}, the shape {dim}", model.embedding_dim()),
            ));
        }
        if config.exchange.any_partial() && config.model.partial().is_some() && model.partial_model().is_none() {
            return Err(OperatorError::config(
                "exchange",
                "`partial` computes on the host: this worker's model has no partial form (use rows)",
            ));
        }
        let slice = dense_slice(model.params().len(), me, workers);
        let partial_form = if config.exchange.any_partial() { config.model.partial() } else { None };
        let deep_partial = partial_form.is_some_and(|p| p.deep.is_some());
        let slot_tables: Vec<usize> =
            (0..config.model.num_sparse()).chain(config.sequence_tables.iter().copied()).collect();
        let store = Store::new(
            &config.store,
            &StoreParams {
                worker: me,
                workers,
                dim,
                table_sizes: &config.table_sizes,
                seed: config.seed,
                optimizer: config.sparse_optimizer,
                hp: config.sparse_hp,
            },
        )?;
        let slots = match &store {
            Store::Fixed(f) => Slots::Dense {
                workers: workers as u64,
                slots: (0..config.table_sizes.len()).map(|t| vec![u32::MAX; f.shard.local_len(t)]).collect(),
            },
            _ => Slots::Hashed(config.table_sizes.iter().map(|_| FxHashMap::default()).collect()),
        };
        let owner = Rc::new(RefCell::new(Owner {
            store,
            train_steps: 0,
            slot_tables: slot_tables.clone(),
            dense_optimizer: DenseOptimizer::new(config.dense_optimizer, config.dense_hp, slice.len()),
            dense_hp: config.dense_hp,
            sparse_hp: config.sparse_hp,
            pending: (0..workers)
                .map(|w| LookupRequest {
                    from: w as u32,
                    to: me as u32,
                    table_lens: Vec::new(),
                    ids: WireIds::default(),
                    partial: None,
                })
                .collect(),
            slots,
            scratch: Vec::new(),
            order: Vec::new(),
            replicas: Replicas::new(
                &config.exchange.replicated,
                &config.table_sizes,
                config.seed,
                dim,
                config.sparse_optimizer,
                config.sparse_hp,
            ),
            exchange: config.exchange.clone(),
            partial: partial_form,
            pending_rows: vec![Vec::new(); workers],
            pending_ids: vec![Vec::new(); workers],
            weights: DeepWeights::default(),
            wt_step: None,
            dwt: Vec::new(),
            shares: vec![DeepShares::default(); workers],
            pgrads: vec![Vec::new(); workers],
            pgrads_ready: false,
            held: Vec::new(),
            me,
            workers,
        }));
        let home = Rc::new(RefCell::new(Home {
            me,
            workers,
            dim,
            plans: slot_tables.iter().map(|_| TablePlan::default()).collect(),
            slot_tables,
            model,
            command: None,
            replies: vec![Vec::new(); workers],
            unique_rows: Vec::new(),
            dunique: Vec::new(),
            pooled: Vec::new(),
            dpooled: Vec::new(),
            seq_rows: Vec::new(),
            dseq: Vec::new(),
            seq_lengths: Vec::new(),
            dlogits: Vec::new(),
            seen: FxHashMap::default(),
            exchange: config.exchange.clone(),
            partial: partial_form,
            partial_replies: vec![Vec::new(); workers],
            partial_owners: vec![false; workers],
            psum: Vec::new(),
            dpsum: Vec::new(),
            dwt: Vec::new(),
            shares: DeepShares::default(),
            narrow_ids: narrow_ids(&config.table_sizes),
        }));
        let outcome = Rc::new(RefCell::new(Outcome::default()));
        let eval = Rc::new(RefCell::new(EvalSet::default()));
        let bytes_sent = Rc::new(RefCell::new(ByteLedger::default()));
        let mut input = InputHandle::new();

        worker.dataflow::<u64, _, _>(|scope| {
            let (home_a, owner_a, bytes_a) = (home.clone(), owner.clone(), bytes_sent.clone());
            let requests = input.to_stream(scope).unary::<CapacityContainerBuilder<Vec<LookupRequest>>, _, _, _>(
                Pipeline,
                "PlanLookups",
                move |_, _| {
                    move |input, output| {
                        input.for_each(|cap, data: &mut Vec<Command>| {
                            let t = *cap.least().expect("a message has a time");
                            let mut session = output.session(&cap);
                            for command in data.drain(..) {
                                let mut home = home_a.borrow_mut();
                                for request in home.plan(command, &owner_a.borrow().replicas) {
                                    if request.to as usize != home.me {
                                        bytes_a.borrow_mut().add(t, request.wire_bytes());
                                    }
                                    session.give(request);
                                }
                            }
                        });
                    }
                },
            );

            // With a deep model's partial exchange an owner computes first-layer products with
            // the dense parameters, so it serves step `t` only once it has gathered step `t − 1`
            // (a faster peer's request may arrive earlier); `GatherParams` wakes it up.
            let (owner_b, home_b, outcome_b, bytes_b) =
                (owner.clone(), home.clone(), outcome.clone(), bytes_sent.clone());
            let serve_waker: Rc<RefCell<Option<Activator>>> = Rc::default();
            let (waker_b, scope_b) = (serve_waker.clone(), scope);
            let replies = requests.unary::<CapacityContainerBuilder<Vec<LookupReply>>, _, _, _>(
                Exchange::new(|r: &LookupRequest| r.to as u64),
                "ServeLookups",
                move |_, info| {
                    *waker_b.borrow_mut() = Some(scope_b.activator_for(info.address.clone()));
                    let mut deferred: Vec<(Capability<u64>, LookupRequest)> = Vec::new();
                    move |input, output| {
                        let serve = |t: u64, request: LookupRequest| {
                            let mut owner = owner_b.borrow_mut();
                            let reply = owner.serve(&request, t, home_b.borrow().model.params());
                            if request.from != request.to {
                                bytes_b.borrow_mut().add(t, reply.wire_bytes());
                            }
                            let from = request.from as usize;
                            owner.pending[from] = request;
                            reply
                        };
                        input.for_each(|cap, data| {
                            let t = *cap.least().expect("a message has a time");
                            if deep_partial && outcome_b.borrow().completed < t {
                                let cap = cap.retain_least(0).expect("a message has a time");
                                deferred.extend(data.drain(..).map(|r| (cap.clone(), r)));
                                return;
                            }
                            let mut session = output.session(&cap);
                            for request in data.drain(..) {
                                session.give(serve(t, request));
                            }
                        });
                        if !deferred.is_empty() {
                            let completed = outcome_b.borrow().completed;
                            let (ready, waiting) = std::mem::take(&mut deferred)
                                .into_iter()
                                .partition::<Vec<_>, _>(|(cap, _)| *cap.time() <= completed);
                            deferred = waiting;
                            for (cap, request) in ready {
                                output.session(&cap).give(serve(*cap.time(), request));
                            }
                        }
                    }
                },
            );

            let (home_c, owner_c, bytes_c) = (home.clone(), owner.clone(), bytes_sent.clone());
            let mut stash_c = Rendezvous::<LookupReply>::new(workers);
            let gradients = replies.unary::<CapacityContainerBuilder<Vec<GradientMessage>>, _, _, _>(
                Exchange::new(|r: &LookupReply| r.to as u64),
                "ForwardBackward",
                move |_, _| {
                    move |input, output| {
                        input.for_each(|cap, data| {
                            let t = *cap.least().expect("a message has a time");
                            if let Some(mut replies) = stash_c.offer(t, data) {
                                replies.sort_by_key(|r| r.from);
                                let mut home = home_c.borrow_mut();
                                let before = bytes_c.borrow().before(t);
                                let messages = home.compute(replies, &owner_c.borrow(), before);
                                let mut session = output.session(&cap);
                                for m in messages {
                                    if m.to != m.from {
                                        bytes_c.borrow_mut().add(t, m.wire_bytes());
                                    }
                                    session.give(m);
                                }
                            }
                        });
                    }
                },
            );

            // A deep model's partial exchange: owners turn the partial results' gradients into
            // row gradients and their share of the first layer's weight gradient before any
            // worker sends its dense gradient, which therefore travels one stage later.
            let gradients = if deep_partial {
                let (home_p, owner_p, bytes_p) = (home.clone(), owner.clone(), bytes_sent.clone());
                let mut stash_p = Rendezvous::<GradientMessage>::new(workers);
                gradients.unary::<CapacityContainerBuilder<Vec<GradientMessage>>, _, _, _>(
                    Exchange::new(|m: &GradientMessage| m.to as u64),
                    "PartialBackward",
                    move |_, _| {
                        move |input, output| {
                            input.for_each(|cap, data| {
                                let t = *cap.least().expect("a message has a time");
                                if let Some(mut messages) = stash_p.offer(t, data) {
                                    messages.sort_by_key(|m| m.from);
                                    let mut home = home_p.borrow_mut();
                                    let dense = owner_p.borrow_mut().partial_backward(&mut home, messages);
                                    let mut session = output.session(&cap);
                                    for m in dense {
                                        if m.to != m.from {
                                            bytes_p.borrow_mut().add(t, m.wire_bytes());
                                        }
                                        session.give(m);
                                    }
                                }
                            });
                        }
                    },
                )
            } else {
                gradients
            };

            let (home_d, owner_d, eval_d, bytes_d) = (home.clone(), owner.clone(), eval.clone(), bytes_sent.clone());
            let mut stash_d = Rendezvous::<GradientMessage>::new(workers);
            let updates = gradients.unary::<CapacityContainerBuilder<Vec<ParamUpdate>>, _, _, _>(
                Exchange::new(|m: &GradientMessage| m.to as u64),
                "ApplyGradients",
                move |_, _| {
                    move |input, output| {
                        input.for_each(|cap, data| {
                            let t = *cap.least().expect("a message has a time");
                            if let Some(mut messages) = stash_d.offer(t, data) {
                                messages.sort_by_key(|m| m.from);
                                let mut home = home_d.borrow_mut();
                                let mut owner = owner_d.borrow_mut();
                                if deep_partial {
                                    messages = owner.with_held_messages(messages);
                                }
                                let updates = owner.apply(&mut home, &messages, &mut eval_d.borrow_mut());
                                let mut session = output.session(&cap);
                                for u in updates {
                                    bytes_d.borrow_mut().add(t, 4 * u.values.len() as u64);
                                    session.give(u);
                                }
                            }
                        });
                    }
                },
            );

            let (home_e, outcome_e, bytes_e) = (home.clone(), outcome.clone(), bytes_sent.clone());
            let mut stash_e = Rendezvous::<ParamUpdate>::new(workers);
            updates.sink(Exchange::new(|u: &ParamUpdate| u.to as u64), "GatherParams", move |(input, _frontier)| {
                input.for_each(|cap, data| {
                    let t = *cap.least().expect("a message has a time");
                    if let Some(updates) = stash_e.offer(t, data) {
                        let mut home = home_e.borrow_mut();
                        let mut stats = StepStats::default();
                        let mut non_finite = 0;
                        for u in &updates {
                            if !u.values.is_empty() {
                                let o = u.offset as usize;
                                home.model.params_mut()[o..o + u.values.len()].copy_from_slice(&u.values);
                            }
                            if u.from == 0 {
                                stats = u.stats;
                            }
                            non_finite += u.stats.non_finite;
                        }
                        stats.non_finite = non_finite;
                        bytes_e.borrow_mut().settle(t + 1);
                        let mut outcome = outcome_e.borrow_mut();
                        outcome.completed = t + 1;
                        outcome.stats = stats;
                        if let Some(waker) = serve_waker.borrow().as_ref() {
                            waker.activate();
                        }
                    }
                });
            });
        });

        Ok(Trainer {
            input,
            outcome,
            home,
            owner,
            eval,
            bytes_sent,
            config: config.clone(),
            step: 0,
            train_steps: 0,
            bad_records: [0; BadReason::COUNT],
            score_train: false,
            stop_requested: false,
        })
    }

    /// Runs one synchronous step with this worker's micro-batch (possibly
    /// empty) and returns the statistics summed over all workers. Every worker
    /// must call `step` the same number of times with the same `kind`.
    ///
    /// A batch that does not fit the model is an error here and a failed step
    /// for every other worker ([`StepStats::failed_workers`]), so no worker
    /// waits forever for this one.
    pub fn step(&mut self, worker: &mut Worker, kind: StepKind, batch: Batch) -> Result<StepStats, OperatorError> {
        if let Err(e) = self.check_batch(&batch) {
            self.step_failed(worker);
            return Err(e);
        }
        let stats = self.run(
            worker,
            Command {
                kind,
                batch,
                failed: false,
                bad_records: self.bad_records,
                score: self.score_train,
                stop: self.stop_requested,
            },
        );
        let device_error = self.home.borrow_mut().model.take_error();
        if let Some(e) = device_error {
            self.step_failed(worker);
            return Err(OperatorError::Device { worker: worker.index(), message: e });
        }
        if kind == StepKind::Train && stats.samples > 0 {
            self.train_steps += 1;
        }
        Ok(stats)
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
        self.input.send(command);
        self.step += 1;
        self.input.advance_to(self.step);
        while self.outcome.borrow().completed < self.step {
            worker.step();
        }
        self.outcome.borrow().stats
    }

    /// A batch with no samples and the model's shape.
    fn empty_batch(&self) -> Batch {
        let m = &self.config.model;
        Batch::with_sequences(m.num_dense(), m.num_sparse(), m.num_sequences())
    }

    fn check_batch(&self, batch: &Batch) -> Result<(), OperatorError> {
        let m = &self.config.model;
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
        let tables = (0..m.num_sparse()).chain(self.config.sequence_tables.iter().copied());
        for ((k, field), t) in batch.sparse.iter().chain(&batch.sequences).enumerate().zip(tables) {
            if let Some(&id) = field.ids.iter().find(|&&id| id >= self.config.table_sizes[t]) {
                return Err(ShapeError::IdOutsideTable {
                    slot: FeatureSlot::nth(k, m.num_sparse()),
                    id,
                    table: t,
                    rows: self.config.table_sizes[t],
                }
                .into());
            }
        }
        for (f, field) in batch.sparse.iter().enumerate() {
            if self.config.exchange.table(f) == TableExchange::Partial {
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
        std::mem::take(&mut *self.eval.borrow_mut())
    }

    /// L2 norm over all parameters, dense and embedding, as f64 (a `Report` step; collective).
    pub fn params_l2(&mut self, worker: &mut Worker) -> Result<f64, OperatorError> {
        let stats = self.step(worker, StepKind::Report, self.empty_batch())?;
        Ok(stats.sum_squares.sqrt())
    }

    /// This worker's copy of the dense parameters.
    pub fn dense_params(&self) -> Vec<f32> {
        self.home.borrow().model.params().to_vec()
    }

    /// Bytes this worker sent to other workers in the steps it has completed
    /// (the same figure whatever the timing of the other workers).
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent.borrow().before(self.step)
    }

    /// Number of embedding rows this worker owns.
    pub fn owned_rows(&self) -> usize {
        self.owner.borrow().store.num_rows()
    }

    /// This worker's embedding-store counters (lookups per tier, rows per tier, admissions, evictions).
    pub fn store_stats(&self) -> StoreStats {
        self.owner.borrow().store.stats()
    }

    /// The configuration this trainer was built with.
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }

    /// Number of steps run so far.
    pub fn steps(&self) -> u64 {
        self.step
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
    pub fn snapshot(&self) -> WorkerSnapshot {
        let home = self.home.borrow();
        let owner = self.owner.borrow();
        let params = home.model.params();
        let slice = dense_slice(params.len(), home.me, home.workers);
        WorkerSnapshot {
            worker: home.me,
            workers: home.workers,
            step: self.train_steps,
            dim: owner.store.dim(),
            state_width: owner.store.state_width(),
            dense_params: params.to_vec(),
            dense_optimizer: owner.dense_optimizer.state(slice.start),
            tables: (0..self.config.table_sizes.len()).map(|t| owner.store.export_table(t)).collect(),
        }
    }

    /// Rebuilds this worker's state from the parts of a checkpoint written by
    /// any number of workers (see [`crate::snapshot`]): the dense parameters,
    /// the dense-optimizer state of this worker's slice `dense_slice(len, me, W)`,
    /// the rows `shard_of` assigns to this worker, and the step count. The
    /// parts are checked completely first; on error nothing is changed.
    /// Not collective: every worker restores from the same parts on its own.
    pub fn restore(&mut self, parts: &[WorkerSnapshot]) -> Result<(), OperatorError> {
        let mut home = self.home.borrow_mut();
        let mut owner = self.owner.borrow_mut();
        let (me, w) = (home.me, home.workers);
        let dense_len = home.model.params().len();
        let expected = Expected {
            table_sizes: &self.config.table_sizes,
            dim: owner.store.dim(),
            state_width: owner.store.state_width(),
            dense_len,
            dense_kind: self.config.dense_optimizer,
            every_row: owner.store.holds_every_row(),
        };
        let checked = check_parts(parts, expected)?;
        let mine = checked.dense_optimizer.slice(dense_slice(dense_len, me, w));
        let dense_optimizer = DenseOptimizer::from_state(self.config.dense_hp, &mine)?;
        home.model.params_mut().copy_from_slice(checked.dense_params);
        owner.dense_optimizer = dense_optimizer;
        owner.store.reset(checked.step);
        owner.train_steps = checked.step;
        let (d, sw) = (expected.dim, expected.state_width);
        for part in parts {
            for (t, rows) in part.tables.iter().enumerate() {
                for (i, &id) in rows.ids.iter().enumerate() {
                    if shard_of(t, id, w) == me {
                        owner.store.set_row(
                            t,
                            id,
                            &rows.rows[i * d..(i + 1) * d],
                            &rows.state[i * sw..(i + 1) * sw],
                        )?;
                        if let Some((count, hot)) = rows.frequency(i) {
                            owner.store.set_frequency(t, id, count, hot);
                        }
                    }
                }
            }
        }
        owner.replicas.restore(parts);
        self.train_steps = checked.step;
        Ok(())
    }
}
