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
//! Invariants:
//! * Every worker sends exactly one message to every worker at every stage,
//!   so each stage knows a step is complete when it holds `W` messages for
//!   that timestamp; it never waits for a frontier.
//! * Owner `k` answers lookups of step `t + 1` only after applying the
//!   gradients of step `t`: a request of step `t + 1` is sent only after its
//!   sender gathered every slice of step `t`, and owner `k` sends its slice
//!   only after applying its sparse gradients.
//! * Messages are combined in worker order, so a run is deterministic for a
//!   seed and worker count, and the parameters after step `t` are those of a
//!   single worker that trained on the union of the micro-batches, up to the
//!   reassociation of float sums.
//! * Gradients travel unnormalised; owners divide by the global batch size,
//!   which they learn from the same messages.

use crate::batch::Batch;
use crate::exchange::{
    accumulate_slot, narrow_ids, slot_row_grads, ExchangeConfig, PartialLookup, PartialSlot, Replicas, TableExchange,
    WireIds,
};
use crate::metrics::EvalSet;
use crate::nn::embedding_bag::{pool_sum, pool_sum_backward};
use crate::nn::loss::{bce_with_logits_grad, bce_with_logits_sum, sigmoid};
use crate::nn::{DeepShares, DeepWeights, FmPartial, Model, ModelConfig, SequenceInput};
use crate::optim::{DenseOptimizer, DenseOptimizerKind, OptimizerParams, SparseOptimizerKind};
use crate::shard::shard_of;
use crate::snapshot::{check_parts, Expected, WorkerSnapshot};
use crate::store::{EmbeddingStore, Store, StoreConfig, StoreParams, StoreStats};
use crate::OperatorError;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::generic::operator::Operator;
use timely::dataflow::operators::Capability;
use timely::dataflow::InputHandle;
use timely::scheduling::Activator;
use timely::worker::Worker;

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
        for (key, hp) in [("lr", &self.dense_hp), ("sparse_lr", &self.sparse_hp)] {
            if !(hp.lr.is_finite() && hp.lr > 0.0) {
                return Err(OperatorError::config(key, format!("learning rate must be positive, got {}", hp.lr)));
            }
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
    /// Workers that reported a fatal error in this step; every worker stops when it is non-zero.
    pub failed_workers: u64,
    /// Malformed records skipped so far, by [`BadReason::index`](crate::bad_record::BadReason::index) (cumulative).
    pub bad_records: [u64; 5],
}

impl StepStats {
    fn add(&mut self, o: &StepStats) {
        self.samples += o.samples;
        self.loss_sum += o.loss_sum;
        self.bytes_sent += o.bytes_sent;
        self.sum_squares += o.sum_squares;
        self.failed_workers += o.failed_workers;
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
    pub bad_records: [u64; 5],
    /// Also gather a training step's predictions, made before its update, on worker 0
    /// (prequential evaluation: every batch is scored before it is trained on).
    #[serde(default)]
    pub score: bool,
}

/// Ids one worker needs from one owner, packed over all tables.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LookupRequest {
    /// Requesting worker.
    pub from: u32,
    /// Owner.
    pub to: u32,
    /// Number of ids per lookup slot (the sparse fields, then the sequence fields).
    pub table_lens: Vec<u32>,
    /// The ids, slot after slot, distinct within a slot.
    pub ids: WireIds,
    /// Which samples use which ids of the partial fields (`partial` exchange only).
    #[serde(default)]
    pub partial: Option<PartialLookup>,
}

impl LookupRequest {
    /// Bytes on the wire.
    fn wire_bytes(&self) -> u64 {
        self.ids.wire_bytes()
            + 4 * self.table_lens.len() as u64
            + self.partial.as_ref().map_or(0, PartialLookup::wire_bytes)
    }
}

/// Rows answering a [`LookupRequest`], in the request's order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LookupReply {
    /// Owner.
    pub from: u32,
    /// Requesting worker.
    pub to: u32,
    /// `dim` values per requested id of the `rows` fields.
    pub rows: Vec<f32>,
    /// The owner's share of the partial results, `B × width` (`partial` exchange only).
    #[serde(default)]
    pub partial: Vec<f32>,
}

impl LookupReply {
    /// Bytes on the wire.
    fn wire_bytes(&self) -> u64 {
        4 * (self.rows.len() + self.partial.len()) as u64
    }
}

/// One worker's contribution to another worker's updates in a step.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GradientMessage {
    /// Sender (home of the micro-batch).
    pub from: u32,
    /// Receiver (row owner and dense-slice owner).
    pub to: u32,
    /// What the step does.
    pub kind: StepKind,
    /// The sender's statistics for this step.
    pub stats: StepStats,
    /// Gradients of the rows the sender requested from the receiver, in request order (unnormalised).
    pub sparse: Vec<f32>,
    /// The receiver's slice of the sender's dense gradient (unnormalised).
    pub dense: Vec<f32>,
    /// Predictions of an `Eval` step (sent to worker 0 only).
    pub eval: EvalSet,
    /// Gradient of the partial results, `B × width`, for their owner (`partial` exchange only).
    #[serde(default)]
    pub partial: Vec<f32>,
    /// Replicated rows the sender touched (sent to every worker) …
    #[serde(default)]
    pub hot: Vec<u32>,
    /// … and their summed gradients, `dim` values each (unnormalised).
    #[serde(default)]
    pub hot_grads: Vec<f32>,
}

impl GradientMessage {
    /// Bytes on the wire (a fixed 32 for the header and statistics).
    fn wire_bytes(&self) -> u64 {
        let floats = self.sparse.len() + self.dense.len() + self.partial.len() + self.hot_grads.len();
        4 * (floats + self.hot.len() + 2 * self.eval.probs.len()) as u64 + 32
    }
}

/// A dense slice after its owner's update, broadcast to every worker.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ParamUpdate {
    /// Slice owner.
    pub from: u32,
    /// Receiver.
    pub to: u32,
    /// Global statistics of the step.
    pub stats: StepStats,
    /// Offset of the slice in the flat dense buffer.
    pub offset: u64,
    /// The updated values (empty when nothing changed or `to == from`).
    pub values: Vec<f32>,
}

/// The range of the flat dense buffer whose optimizer state worker `k` owns.
pub fn dense_slice(len: usize, k: usize, workers: usize) -> std::ops::Range<usize> {
    len * k / workers..len * (k + 1) / workers
}

/// Lookup plan of one slot (a sparse or a sequence field) of the current micro-batch.
#[derive(Default)]
struct TablePlan {
    /// Distinct ids, first-seen order.
    unique: Vec<u64>,
    /// For each occurrence in the batch, its index in `unique`.
    index: Vec<u32>,
    /// For each unique id, (owner, row position in that owner's reply) for a
    /// `rows` field, (owner, position among the field's ids in that owner's
    /// request) for a `partial` field, or ([`HOT`], replica) for a replicated row.
    place: Vec<(u32, u32)>,
}

/// The owner marker of a replicated row in [`TablePlan::place`].
const HOT: u32 = u32::MAX;

/// The home side of a worker: its model replica and the current micro-batch.
struct Home {
    me: usize,
    workers: usize,
    dim: usize,
    /// The table of each lookup slot: sparse field `f` reads table `f`; sequence field `s` reads `sequence_tables[s]`.
    slot_tables: Vec<usize>,
    model: Box<dyn Model<f32>>,
    command: Option<Command>,
    plans: Vec<TablePlan>,
    replies: Vec<Vec<f32>>,
    unique_rows: Vec<f32>,
    dunique: Vec<f32>,
    pooled: Vec<f32>,
    dpooled: Vec<f32>,
    seq_rows: Vec<f32>,
    dseq: Vec<f32>,
    seq_lengths: Vec<usize>,
    dlogits: Vec<f32>,
    seen: FxHashMap<u64, u32>,
    exchange: ExchangeConfig,
    /// The model's partial form when any field travels as partial results.
    partial: Option<FmPartial>,
    /// Each owner's partial sums of the current step.
    partial_replies: Vec<Vec<f32>>,
    /// Owners that received partial entries for the current step.
    partial_owners: Vec<bool>,
    psum: Vec<f32>,
    dpsum: Vec<f32>,
    /// The home's share of the first layer's factor-block gradient (its `rows` fields; deep partial only).
    dwt: Vec<f32>,
    /// The first-layer input of the `rows` fields' pooled vectors (deep partial only).
    shares: DeepShares<f32>,
    /// Ids travel in four bytes (every table has at most 2³² rows).
    narrow_ids: bool,
}

/// Per table, where a row's summed gradient sits in `Owner::scratch` during an update.
enum Slots {
    /// Indexed by the fixed table's local row `id / W`; `u32::MAX` when unused.
    Dense { workers: u64, slots: Vec<Vec<u32>> },
    /// Keyed by id (dynamic and tiered stores, whose ids are not dense); emptied after each update.
    Hashed(Vec<FxHashMap<u64, u32>>),
}

/// The owner side of a worker: its embedding rows and its dense optimizer slice.
struct Owner {
    store: Store,
    /// Training steps applied (the store's maintenance clock).
    train_steps: u64,
    /// The table of each lookup slot (as in [`Home`]).
    slot_tables: Vec<usize>,
    dense_optimizer: DenseOptimizer,
    /// The last request of each worker, kept to apply the gradients that answer it.
    pending: Vec<LookupRequest>,
    /// Each row's slot in `scratch` during an update.
    slots: Slots,
    /// Summed gradients of the step's distinct rows, in first-seen order.
    scratch: Vec<f32>,
    /// The `(table, id)` of each row in `scratch`.
    order: Vec<(u32, u64)>,
    /// Hot rows every worker holds (empty unless the exchange replicates rows).
    replicas: Replicas,
    exchange: ExchangeConfig,
    partial: Option<FmPartial>,
    /// Per requester, the rows of its last request's partial fields (read again for their gradients).
    pending_rows: Vec<Vec<f32>>,
    /// Per requester, the decoded ids of its last request.
    pending_ids: Vec<Vec<u64>>,
    /// The deep part's first-layer factor block ([`crate::nn::FirstLayer`]),
    /// as of the parameters of step `wt_step` (a deep model's `partial` exchange only).
    weights: DeepWeights<f32>,
    wt_step: Option<u64>,
    /// This owner's share of that block's gradient in the current step.
    dwt: Vec<f32>,
    /// Per requester, its micro-batch's first-layer input from this owner's rows.
    shares: Vec<DeepShares<f32>>,
    /// Per requester, the row gradients of its partial fields in the current step, in request order.
    pgrads: Vec<Vec<f32>>,
    /// Whether `pgrads` holds the current step's (set by the partial backward stage).
    pgrads_ready: bool,
    /// The homes' messages of the current step, held from the partial backward
    /// stage until the dense gradients arrive (a deep model's `partial` exchange only).
    held: Vec<GradientMessage>,
    me: usize,
    workers: usize,
}

/// Bytes this worker sent to other workers, by the step (timestamp) of each
/// message. A worker may serve a faster peer's next step before its own step
/// completes, so a plain running counter read at a step boundary would depend
/// on timing; counting per step keeps every figure deterministic.
#[derive(Default)]
struct ByteLedger {
    /// Bytes of steps that are still open here (a message of step `t` can be sent until this worker completes `t`).
    open: std::collections::BTreeMap<u64, u64>,
    /// Bytes of the steps before `settled_through`.
    settled: u64,
    settled_through: u64,
}

impl ByteLedger {
    fn add(&mut self, t: u64, bytes: u64) {
        debug_assert!(t >= self.settled_through, "a message of step {t} after that step completed");
        *self.open.entry(t).or_default() += bytes;
    }

    /// Bytes of the steps before `t`.
    fn before(&self, t: u64) -> u64 {
        self.settled + self.open.range(..t).map(|(_, b)| b).sum::<u64>()
    }

    /// Folds the steps before `t` (all complete) into the settled total.
    fn settle(&mut self, t: u64) {
        let later = self.open.split_off(&t);
        self.settled += self.open.values().sum::<u64>();
        self.open = later;
        self.settled_through = self.settled_through.max(t);
    }
}

/// Collects the `W` messages each worker sends a stage for one timestamp.
struct Rendezvous<M> {
    workers: usize,
    stash: HashMap<u64, Vec<M>>,
}

impl<M> Rendezvous<M> {
    fn new(workers: usize) -> Self {
        Rendezvous { workers, stash: HashMap::new() }
    }

    /// Adds the messages of timestamp `t`; returns all `W` of them once complete.
    fn offer(&mut self, t: u64, data: &mut Vec<M>) -> Option<Vec<M>> {
        let entry = self.stash.entry(t).or_default();
        entry.append(data);
        if entry.len() == self.workers {
            self.stash.remove(&t)
        } else {
            None
        }
    }
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
    bad_records: [u64; 5],
    score_train: bool,
}

impl Trainer {
    /// Builds this worker's part of the training dataflow.
    pub fn new(worker: &mut Worker, config: &TrainerConfig) -> Result<Self, OperatorError> {
        config.validate()?;
        let me = worker.index();
        let workers = worker.peers();
        let dim = config.model.embedding_dim();
        let model = config.model.build::<f32>(config.seed)?;
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
                        for u in &updates {
                            if !u.values.is_empty() {
                                let o = u.offset as usize;
                                home.model.params_mut()[o..o + u.values.len()].copy_from_slice(&u.values);
                            }
                            if u.from == 0 {
                                stats = u.stats;
                            }
                        }
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
            bad_records: [0; 5],
            score_train: false,
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
            Command { kind, batch, failed: false, bad_records: self.bad_records, score: self.score_train },
        );
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
            Command { kind: StepKind::Train, batch, failed: true, bad_records: self.bad_records, score: false },
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
            return Err(OperatorError::Shape(format!(
                "batch has {} dense / {} sparse / {} sequence features, the model expects {} / {} / {}",
                batch.num_dense,
                batch.sparse.len(),
                batch.sequences.len(),
                m.num_dense(),
                m.num_sparse(),
                m.num_sequences()
            )));
        }
        batch.check().map_err(OperatorError::Shape)?;
        let tables = (0..m.num_sparse()).chain(self.config.sequence_tables.iter().copied());
        for ((k, field), t) in batch.sparse.iter().chain(&batch.sequences).enumerate().zip(tables) {
            if let Some(&id) = field.ids.iter().find(|&&id| id >= self.config.table_sizes[t]) {
                return Err(OperatorError::Shape(format!(
                    "id {id} of {} is outside its table {t} of {} rows",
                    slot_name(k, m.num_sparse()),
                    self.config.table_sizes[t]
                )));
            }
        }
        for (f, field) in batch.sparse.iter().enumerate() {
            if self.config.exchange.table(f) == TableExchange::Partial {
                if let Some(i) = (0..field.len()).find(|&i| field.bag(i).len() > 1) {
                    return Err(OperatorError::Shape(format!(
                        "field {f} travels as partial results (exchange `partial`), which needs at most one id \
                         per sample, but sample {i} has {}; use `rows` for this field",
                        field.bag(i).len()
                    )));
                }
            }
        }
        if let Some(first) = batch.sequences.first() {
            let max = m.max_sequence_len();
            if let Some(i) = (0..batch.len()).find(|&i| first.bag(i).len() > max) {
                return Err(OperatorError::Shape(format!(
                    "sample {i} has a sequence of {} items, longer than the model's max_len {max}",
                    first.bag(i).len()
                )));
            }
        }
        Ok(())
    }

    /// Whether training steps also gather their predictions (made before the step's update)
    /// on worker 0, for [`Trainer::take_eval`]: prequential evaluation of a stream.
    pub fn set_score_training(&mut self, score: bool) {
        self.score_train = score;
    }

    /// Sets the cumulative malformed-record counts this worker reports with its next steps.
    pub fn set_bad_records(&mut self, counts: [u64; 5]) {
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

/// `field f` for a sparse slot, `sequence s` for a sequence slot.
fn slot_name(k: usize, num_sparse: usize) -> String {
    if k < num_sparse {
        format!("field {k}")
    } else {
        format!("sequence {}", k - num_sparse)
    }
}

impl Home {
    /// De-duplicates the command's ids per table and builds one request per
    /// owner; replicated rows are not requested (every worker holds them).
    #[inline(never)]
    fn plan(&mut self, command: Command, replicas: &Replicas) -> Vec<LookupRequest> {
        let w = self.workers;
        let num_tables = self.plans.len();
        let batch_len = command.batch.len();
        let mut requests: Vec<LookupRequest> = (0..w)
            .map(|o| LookupRequest {
                from: self.me as u32,
                to: o as u32,
                table_lens: vec![0; num_tables],
                ids: WireIds::default(),
                partial: self.partial.map(|_| PartialLookup { batch_len: batch_len as u32, slots: Vec::new() }),
            })
            .collect();
        self.partial_owners.iter_mut().for_each(|p| *p = false);
        let mut ids: Vec<Vec<u64>> = vec![Vec::new(); w];
        if command.kind != StepKind::Report {
            let num_sparse = command.batch.sparse.len();
            let mut rows_at = vec![0u32; w];
            let mut segment = vec![0u32; w];
            for (k, field) in command.batch.sparse.iter().chain(&command.batch.sequences).enumerate() {
                let t = self.slot_tables[k];
                let partial = k < num_sparse && self.exchange.table(k) == TableExchange::Partial;
                let plan = &mut self.plans[k];
                plan.unique.clear();
                plan.index.clear();
                plan.place.clear();
                self.seen.clear();
                for &id in &field.ids {
                    let next = plan.unique.len() as u32;
                    let u = *self.seen.entry(id).or_insert_with(|| {
                        plan.unique.push(id);
                        next
                    });
                    plan.index.push(u);
                }
                for (s, owned) in segment.iter_mut().zip(&ids) {
                    *s = owned.len() as u32;
                }
                for &id in &plan.unique {
                    if !partial {
                        if let Some(h) = replicas.find(t, id) {
                            plan.place.push((HOT, h));
                            continue;
                        }
                    }
                    let o = shard_of(t, id, w);
                    if partial {
                        plan.place.push((o as u32, ids[o].len() as u32 - segment[o]));
                    } else {
                        plan.place.push((o as u32, rows_at[o]));
                        rows_at[o] += 1;
                    }
                    ids[o].push(id);
                    requests[o].table_lens[k] += 1;
                }
                if partial {
                    let mut slots: Vec<PartialSlot> = requests
                        .iter()
                        .map(|r| PartialSlot::new(batch_len, r.table_lens[k] as usize, field.weights.is_some()))
                        .collect();
                    for i in 0..batch_len {
                        let start = field.offsets[i] as usize;
                        if start == field.offsets[i + 1] as usize {
                            continue;
                        }
                        let (o, pos) = plan.place[plan.index[start] as usize];
                        let weight = field.weights.as_ref().map_or(1.0, |ws| ws[start]);
                        slots[o as usize].push(i, pos, weight);
                        self.partial_owners[o as usize] = true;
                    }
                    for (r, slot) in requests.iter_mut().zip(slots) {
                        r.partial.as_mut().expect("partial exchange").slots.push(slot);
                    }
                }
            }
        }
        for (r, owned) in requests.iter_mut().zip(&ids) {
            r.ids = WireIds::encode(owned, self.narrow_ids);
        }
        self.command = Some(command);
        requests
    }

    /// Lays the rows of the batch's sequence fields out as `[B × T × S·d]` in
    /// `seq_rows` (padded to the longest sequence `T` of this batch, which it
    /// returns) and their lengths in `seq_lengths`.
    fn gather_sequences(&mut self, batch: &Batch, replicas: &Replicas) -> usize {
        let (b, d, f) = (batch.len(), self.dim, batch.sparse.len());
        let s = batch.sequences.len();
        self.seq_lengths.clear();
        let Some(first) = batch.sequences.first() else {
            self.seq_rows.clear();
            return 0;
        };
        self.seq_lengths.extend((0..b).map(|i| first.bag(i).len()));
        let steps = self.seq_lengths.iter().copied().max().unwrap_or(0);
        let width = s * d;
        self.seq_rows.clear();
        self.seq_rows.resize(b * steps * width, 0.0);
        for (j, field) in batch.sequences.iter().enumerate() {
            let plan = &self.plans[f + j];
            for i in 0..b {
                let start = field.offsets[i] as usize;
                for t in 0..self.seq_lengths[i] {
                    let place = plan.place[plan.index[start + t] as usize];
                    let dst = (i * steps + t) * width + j * d;
                    self.seq_rows[dst..dst + d].copy_from_slice(placed_row(&self.replies, replicas, place, d));
                }
            }
        }
        steps
    }

    /// Sums `dseq` per distinct id of each sequence slot into the gradient messages.
    fn scatter_sequence_grads(&mut self, batch: &Batch, steps: usize, messages: &mut [GradientMessage]) {
        let (b, d, f) = (batch.len(), self.dim, batch.sparse.len());
        let width = batch.sequences.len() * d;
        for (j, field) in batch.sequences.iter().enumerate() {
            let plan = &self.plans[f + j];
            self.dunique.clear();
            self.dunique.resize(plan.unique.len() * d, 0.0);
            for i in 0..b {
                let start = field.offsets[i] as usize;
                for t in 0..self.seq_lengths[i] {
                    let u = plan.index[start + t] as usize;
                    let src = (i * steps + t) * width + j * d;
                    for (a, &g) in self.dunique[u * d..(u + 1) * d].iter_mut().zip(&self.dseq[src..src + d]) {
                        *a += g;
                    }
                }
            }
            for (u, &place) in plan.place.iter().enumerate() {
                send_row_grad(messages, place, &self.dunique[u * d..(u + 1) * d]);
            }
        }
    }

    /// Runs the step's model work once every reply is in; returns one message per worker.
    #[inline(never)]
    fn compute(&mut self, replies: Vec<LookupReply>, owner: &Owner, bytes_sent: u64) -> Vec<GradientMessage> {
        let command = self.command.take().expect("a command precedes its replies");
        let (w, me, d) = (self.workers, self.me as u32, self.dim);
        let (store, replicas) = (&owner.store, &owner.replicas);
        let n_params = self.model.params().len();
        let mut messages: Vec<GradientMessage> = (0..w)
            .map(|o| GradientMessage {
                from: me,
                to: o as u32,
                kind: command.kind,
                stats: StepStats::default(),
                sparse: Vec::new(),
                dense: Vec::new(),
                eval: EvalSet::default(),
                partial: Vec::new(),
                hot: Vec::new(),
                hot_grads: Vec::new(),
            })
            .collect();
        let batch = &command.batch;
        let b = batch.len();
        let mut stats = StepStats {
            samples: b as u64,
            bytes_sent,
            failed_workers: command.failed as u64,
            bad_records: command.bad_records,
            ..Default::default()
        };
        match command.kind {
            StepKind::Report => {
                stats.samples = 0;
                stats.sum_squares = store.sum_of_squares();
                if self.me == 0 {
                    stats.sum_squares += self.model.params().iter().map(|&v| v as f64 * v as f64).sum::<f64>();
                }
            }
            StepKind::Train | StepKind::Eval => {
                for (o, r) in replies.into_iter().enumerate() {
                    self.replies[o] = r.rows;
                    self.partial_replies[o] = r.partial;
                }
                let f = batch.sparse.len();
                self.pooled.clear();
                self.pooled.resize(b * f * d, 0.0);
                for (t, plan) in self.plans[..f].iter().enumerate() {
                    if self.exchange.table(t) == TableExchange::Partial {
                        continue;
                    }
                    self.unique_rows.clear();
                    for &place in &plan.place {
                        self.unique_rows.extend_from_slice(placed_row(&self.replies, replicas, place, d));
                    }
                    let (field, weights) = (&batch.sparse[t], batch.sparse[t].weights.as_deref());
                    pool_sum(&self.unique_rows, d, &field.offsets, &plan.index, weights, t, f, &mut self.pooled);
                }
                let steps = self.gather_sequences(batch, replicas);
                let logits = match self.partial {
                    Some(part) => {
                        self.sum_partials(part, b, f, &owner.weights);
                        let pm = self.model.partial_model().expect("validated: the model has a partial form");
                        pm.forward_partial(&batch.dense, &self.psum, b).to_vec()
                    }
                    None => {
                        let seq = SequenceInput { rows: &self.seq_rows, lengths: &self.seq_lengths, steps };
                        self.model.forward_sequences(&batch.dense, &self.pooled, &seq, b).to_vec()
                    }
                };
                stats.loss_sum = bce_with_logits_sum(&logits, &batch.labels);
                if command.kind == StepKind::Eval || command.score {
                    messages[0].eval =
                        EvalSet { probs: logits.iter().map(|&x| sigmoid(x)).collect(), labels: batch.labels.clone() };
                }
                if command.kind == StepKind::Train {
                    self.dlogits.resize(b, 0.0);
                    bce_with_logits_grad(&logits, &batch.labels, 1.0, &mut self.dlogits);
                    self.dpooled.resize(b * f * d, 0.0);
                    self.dseq.resize(self.seq_rows.len(), 0.0);
                    match self.partial {
                        Some(part) => self.backward_partials(part, b, f, &batch.dense, &owner.weights, &mut messages),
                        None => {
                            let seq = SequenceInput { rows: &self.seq_rows, lengths: &self.seq_lengths, steps };
                            self.model.backward_sequences(
                                &batch.dense,
                                &self.pooled,
                                &seq,
                                &self.dlogits,
                                &mut self.dpooled,
                                &mut self.dseq,
                            );
                        }
                    }
                    for m in messages.iter_mut() {
                        let len = self.replies[m.to as usize].len();
                        m.sparse.resize(len, 0.0);
                    }
                    for (t, plan) in self.plans[..f].iter().enumerate() {
                        if self.exchange.table(t) == TableExchange::Partial {
                            continue;
                        }
                        self.dunique.clear();
                        self.dunique.resize(plan.unique.len() * d, 0.0);
                        pool_sum_backward(
                            &self.dpooled,
                            d,
                            &batch.sparse[t].offsets,
                            &plan.index,
                            batch.sparse[t].weights.as_deref(),
                            t,
                            f,
                            &mut self.dunique,
                        );
                        for (u, &place) in plan.place.iter().enumerate() {
                            send_row_grad(&mut messages, place, &self.dunique[u * d..(u + 1) * d]);
                        }
                    }
                    self.scatter_sequence_grads(batch, steps, &mut messages);
                    // The receiver's slice of the dense gradient; the sender's own slice stays in
                    // `model.grads`, where its owner (this worker) reads it without a copy. (A deep
                    // model's partial exchange sends it after the owners' partial backward.)
                    let dense_later = self.partial.is_some_and(|p| p.deep.is_some());
                    for m in messages.iter_mut().filter(|m| m.to != me && !dense_later) {
                        m.dense = self.model.grads()[dense_slice(n_params, m.to as usize, w)].to_vec();
                    }
                }
            }
        }
        for m in messages.iter_mut() {
            m.stats = stats;
        }
        messages
    }

    /// `psum = Σ_owners (their partial sums) + the partial sums of the `rows` fields' pooled vectors`.
    fn sum_partials(&mut self, part: FmPartial, b: usize, f: usize, weights: &DeepWeights<f32>) {
        let (pw, d) = (part.width(), self.dim);
        self.psum.clear();
        self.psum.resize(b * pw, 0.0);
        for reply in &self.partial_replies {
            if !reply.is_empty() {
                for (a, &v) in self.psum.iter_mut().zip(reply) {
                    *a += v;
                }
            }
        }
        // The home's own first-layer share: its `rows` fields' pooled vectors (none when all are partial).
        let home_deep = part.deep.filter(|_| (0..f).any(|t| self.exchange.table(t) == TableExchange::Rows));
        if let Some(l) = &home_deep {
            self.shares.reset(l, b);
        }
        for t in (0..f).filter(|&t| self.exchange.table(t) == TableExchange::Rows) {
            for i in 0..b {
                let row = &self.pooled[(i * f + t) * d..(i * f + t + 1) * d];
                part.accumulate(row, 1.0, &mut self.psum[i * pw..(i + 1) * pw]);
                if let Some(l) = &home_deep {
                    self.shares.add(l, i, t, &row[1..], 1.0);
                }
            }
        }
        if let Some(l) = &home_deep {
            self.shares.add_shares(l, weights, &mut self.psum, pw, part.fm_width());
        }
    }

    /// Backward through the partial form: the model's gradients, the partial
    /// sums' gradient for every owner that contributed, and `dpooled` of the
    /// `rows` fields (with a deep part, their share of the first layer's gradient too).
    #[allow(clippy::too_many_arguments)]
    fn backward_partials(
        &mut self,
        part: FmPartial,
        b: usize,
        f: usize,
        dense: &[f32],
        weights: &DeepWeights<f32>,
        messages: &mut [GradientMessage],
    ) {
        let (pw, d) = (part.width(), self.dim);
        self.dpsum.resize(b * pw, 0.0);
        let pm = self.model.partial_model().expect("validated: the model has a partial form");
        pm.backward_partial(dense, &self.psum, &self.dlogits, &mut self.dpsum);
        self.dpooled.fill(0.0);
        let home_deep = part.deep.filter(|_| (0..f).any(|t| self.exchange.table(t) == TableExchange::Rows));
        if let Some(l) = &home_deep {
            self.dwt.clear();
            self.dwt.resize(l.block_len(), 0.0);
            self.shares.backward(l, weights, &self.dpsum, pw, part.fm_width(), &mut self.dwt);
            l.add_transposed_grads(&self.dwt, self.model.grads_mut());
        }
        for t in (0..f).filter(|&t| self.exchange.table(t) == TableExchange::Rows) {
            for i in 0..b {
                let at = (i * f + t) * d..(i * f + t + 1) * d;
                let (row, dp) = (&self.pooled[at.clone()], &self.dpsum[i * pw..(i + 1) * pw]);
                let dfactors = home_deep.as_ref().map(|l| self.shares.dfactors(l, i, t));
                part.row_grad_with(row, 1.0, dp, dfactors, &mut self.dpooled[at]);
            }
        }
        for m in messages.iter_mut() {
            if self.partial_owners[m.to as usize] {
                m.partial = self.dpsum.clone();
            }
        }
    }
}

impl Owner {
    /// Answers one request: the rows of its `rows` fields and this owner's
    /// share of the partial results of its `partial` fields.
    /// `params` are the dense parameters after step `t − 1` (read only by a deep model's partial fields).
    fn serve(&mut self, request: &LookupRequest, t: u64, params: &[f32]) -> LookupReply {
        let e = self.store.dim();
        if let Some(l) = self.partial.and_then(|p| p.deep) {
            if self.wt_step != Some(t) {
                self.weights.load(&l, params);
                self.wt_step = Some(t);
            }
        }
        let from = request.from as usize;
        let mut rows = Vec::with_capacity(request.ids.len() * e);
        let mut all_ids = std::mem::take(&mut self.pending_ids[from]);
        request.ids.decode_into(&mut all_ids);
        let mut partial_rows = std::mem::take(&mut self.pending_rows[from]);
        partial_rows.clear();
        let mut partial = Vec::new();
        let deep = self.partial.and_then(|p| p.deep);
        let batch_len = request.partial.as_ref().map_or(0, |p| p.batch_len as usize);
        if let Some(l) = &deep {
            self.shares[from].reset(l, batch_len);
        }
        let (mut start, mut pj) = (0usize, 0usize);
        for (k, &n) in request.table_lens.iter().enumerate() {
            let t = self.slot_tables[k];
            let ids = &all_ids[start..start + n as usize];
            if self.exchange.table(k) == TableExchange::Partial {
                let first = partial_rows.len();
                self.store.gather(t, ids, &mut partial_rows);
                let slot = request.partial.as_ref().and_then(|p| p.slots.get(pj).map(|s| (p.batch_len as usize, s)));
                if let (Some(part), Some((b, slot))) = (self.partial, slot) {
                    if !slot.index.is_empty() {
                        partial.resize(b * part.width(), 0.0);
                        let shares = deep.map(|_| &mut self.shares[from]);
                        accumulate_slot(part, k, slot, &partial_rows[first..], e, &mut partial, shares);
                    }
                }
                pj += 1;
            } else {
                self.store.gather(t, ids, &mut rows);
            }
            start += n as usize;
        }
        if let (Some(l), Some(part)) = (&deep, self.partial) {
            if !partial.is_empty() {
                self.shares[from].add_shares(l, &self.weights, &mut partial, part.width(), part.fm_width());
            }
        }
        self.pending_rows[from] = partial_rows;
        self.pending_ids[from] = all_ids;
        LookupReply { from: request.to, to: request.from, rows, partial }
    }

    /// Row gradients of every sender's partial fields from the partial results'
    /// gradients in `messages` (into `pgrads`, summed over each sender's samples
    /// in sample order) and, with a deep part, this owner's share of the first
    /// layer's factor-block gradient (into `dwt`).
    fn partial_row_grads(&mut self, messages: &[GradientMessage]) {
        let d = self.store.dim();
        let Some(part) = self.partial else { return };
        self.dwt.clear();
        self.dwt.resize(part.deep.map_or(0, |l| l.block_len()), 0.0);
        for m in messages {
            let from = m.from as usize;
            if let Some(l) = part.deep.as_ref().filter(|_| !m.partial.is_empty()) {
                self.shares[from].backward(l, &self.weights, &m.partial, part.width(), part.fm_width(), &mut self.dwt);
            }
            let (request, rows) = (&self.pending[from], &self.pending_rows[from]);
            let pgrads = &mut self.pgrads[from];
            pgrads.clear();
            let (mut prow_at, mut pj) = (0usize, 0usize);
            for (k, &n) in request.table_lens.iter().enumerate() {
                if self.exchange.table(k) != TableExchange::Partial {
                    continue;
                }
                let n = n as usize;
                let start = pgrads.len();
                pgrads.resize(start + n * d, 0.0);
                let slot = request.partial.as_ref().and_then(|p| p.slots.get(pj));
                if let Some(slot) = slot.filter(|_| !m.partial.is_empty()) {
                    let rows = &rows[prow_at * d..(prow_at + n) * d];
                    let shares = part.deep.map(|_| &self.shares[from]);
                    slot_row_grads(part, k, slot, rows, d, &m.partial, &mut pgrads[start..], shares);
                }
                prow_at += n;
                pj += 1;
            }
        }
        self.pgrads_ready = true;
    }

    /// The partial backward stage of a deep model's `partial` exchange: row
    /// gradients and this owner's share of the first layer's gradient (added to
    /// the worker's dense gradient), then the dense gradient's slices for every
    /// worker. Holds the homes' `messages` for [`with_held_messages`](Self::with_held_messages).
    fn partial_backward(&mut self, home: &mut Home, messages: Vec<GradientMessage>) -> Vec<GradientMessage> {
        let kind = messages.first().map_or(StepKind::Train, |m| m.kind);
        if kind == StepKind::Train {
            self.partial_row_grads(&messages);
            if let Some(l) = self.partial.and_then(|p| p.deep) {
                l.add_transposed_grads(&self.dwt, home.model.grads_mut());
            }
        }
        self.held = messages;
        let (me, w, n) = (self.me, self.workers, home.model.params().len());
        (0..w)
            .map(|to| GradientMessage {
                from: me as u32,
                to: to as u32,
                kind,
                stats: StepStats::default(),
                sparse: Vec::new(),
                dense: if kind == StepKind::Train && to != me {
                    home.model.grads()[dense_slice(n, to, w)].to_vec()
                } else {
                    Vec::new()
                },
                eval: EvalSet::default(),
                partial: Vec::new(),
                hot: Vec::new(),
                hot_grads: Vec::new(),
            })
            .collect()
    }

    /// The homes' messages held by [`partial_backward`](Self::partial_backward),
    /// each with the dense gradient slice its sender sent afterwards (`dense`, in worker order).
    fn with_held_messages(&mut self, dense: Vec<GradientMessage>) -> Vec<GradientMessage> {
        let mut held = std::mem::take(&mut self.held);
        assert_eq!(held.len(), dense.len(), "one held message per dense gradient message");
        for (h, d) in held.iter_mut().zip(dense) {
            assert_eq!(h.from, d.from, "held and dense messages in worker order");
            h.dense = d.dense;
        }
        held
    }

    /// Applies the step's gradients this worker owns and returns its dense slice for every worker.
    #[inline(never)]
    fn apply(&mut self, home: &mut Home, messages: &[GradientMessage], eval: &mut EvalSet) -> Vec<ParamUpdate> {
        let (me, w, d) = (home.me, home.workers, home.dim);
        let mut stats = StepStats::default();
        for m in messages {
            stats.add(&m.stats);
        }
        let slice = dense_slice(home.model.params().len(), me, w);
        let mut changed = false;
        let is_train = messages.first().is_some_and(|m| m.kind == StepKind::Train);
        if is_train && stats.samples > 0 {
            let scale = 1.0 / stats.samples as f32;
            // Sparse rows: sum each row's gradient over workers (in worker order), then update once.
            self.scratch.clear();
            self.order.clear();
            if !self.pgrads_ready {
                self.partial_row_grads(messages);
            }
            for m in messages {
                let request = &self.pending[m.from as usize];
                let request_ids = &self.pending_ids[m.from as usize];
                let pgrads = &self.pgrads[m.from as usize];
                let (mut start, mut row_at, mut prow_at) = (0usize, 0usize, 0usize);
                for (k, &n) in request.table_lens.iter().enumerate() {
                    let t = self.slot_tables[k];
                    let n = n as usize;
                    let ids = &request_ids[start..start + n];
                    let grads: &[f32] = if self.exchange.table(k) == TableExchange::Partial {
                        prow_at += n;
                        &pgrads[(prow_at - n) * d..prow_at * d]
                    } else {
                        row_at += n;
                        &m.sparse[(row_at - n) * d..row_at * d]
                    };
                    match &mut self.slots {
                        Slots::Dense { workers, slots } => {
                            let (w, slots) = (*workers, &mut slots[t]);
                            for (k, &id) in ids.iter().enumerate() {
                                if let Some(&ahead) = ids.get(k + 8) {
                                    if let Some(sl) = slots.get((ahead / w) as usize..) {
                                        crate::huge::prefetch(sl.as_ptr());
                                    }
                                }
                                add_row(
                                    t,
                                    id,
                                    &grads[k * d..(k + 1) * d],
                                    &mut slots[(id / w) as usize],
                                    &mut self.order,
                                    &mut self.scratch,
                                );
                            }
                        }
                        Slots::Hashed(maps) => {
                            let map = &mut maps[t];
                            for (k, &id) in ids.iter().enumerate() {
                                let cell = map.entry(id).or_insert(u32::MAX);
                                add_row(t, id, &grads[k * d..(k + 1) * d], cell, &mut self.order, &mut self.scratch);
                            }
                        }
                    }
                    start += n;
                }
            }
            match &mut self.store {
                Store::Fixed(s) => apply_rows(s, &self.order, &mut self.scratch, scale, d),
                Store::Dynamic(s) => apply_rows(s, &self.order, &mut self.scratch, scale, d),
                Store::Tiered(s) => apply_rows(s, &self.order, &mut self.scratch, scale, d),
            }
            match &mut self.slots {
                Slots::Dense { workers, slots } => {
                    for &(t, id) in &self.order {
                        slots[t as usize][(id / *workers) as usize] = u32::MAX;
                    }
                }
                Slots::Hashed(maps) => maps.iter_mut().for_each(|m| m.clear()),
            }
            // Replicated rows: every worker sums every sender's gradients in worker order and
            // applies them to its replica; the owner also writes the result into its store.
            if !self.replicas.is_empty() {
                for m in messages {
                    for (i, &h) in m.hot.iter().enumerate() {
                        self.replicas.add_grad(h, &m.hot_grads[i * d..(i + 1) * d]);
                    }
                }
                for h in self.replicas.apply(scale) {
                    let (t, id) = self.replicas.key(h);
                    if shard_of(t, id, self.workers) == self.me {
                        // An owned id below the table size: the fixed store accepts it.
                        let _ = self.store.set_row(t, id, self.replicas.row(h), self.replicas.state(h));
                    }
                }
            }
            self.train_steps += 1;
            self.store.end_step(self.train_steps);
            // Dense slice: reduce in worker order block by block, averaging inside the optimizer.
            // This worker's own part is read in place from its model's gradients.
            let (params, grads) = home.model.params_and_grads();
            let own = &grads[slice.clone()];
            let parts: Vec<&[f32]> =
                messages.iter().map(|m| if m.from as usize == me { own } else { &m.dense[..] }).collect();
            self.dense_optimizer.apply_sum_scaled(&mut params[slice.clone()], &parts, scale);
            changed = true;
        }
        self.pgrads_ready = false;
        for m in messages {
            eval.probs.extend_from_slice(&m.eval.probs);
            eval.labels.extend_from_slice(&m.eval.labels);
        }
        (0..w)
            .map(|to| ParamUpdate {
                from: me as u32,
                to: to as u32,
                stats,
                offset: slice.start as u64,
                values: if changed && to != me { home.model.params()[slice.clone()].to_vec() } else { Vec::new() },
            })
            .collect()
    }
}

/// The row a plan placed at `place`: in an owner's reply or a local replica.
#[inline]
fn placed_row<'a>(replies: &'a [Vec<f32>], replicas: &'a Replicas, place: (u32, u32), d: usize) -> &'a [f32] {
    match place {
        (HOT, h) => replicas.row(h),
        (o, pos) => &replies[o as usize][pos as usize * d..(pos as usize + 1) * d],
    }
}

/// Puts the summed gradient `g` of the row placed at `place` into the
/// messages: into its owner's row gradients, or, for a replicated row, into
/// every worker's message.
#[inline]
fn send_row_grad(messages: &mut [GradientMessage], place: (u32, u32), g: &[f32]) {
    match place {
        (HOT, h) => {
            for m in messages.iter_mut() {
                m.hot.push(h);
                m.hot_grads.extend_from_slice(g);
            }
        }
        (o, pos) => {
            let p = pos as usize * g.len();
            messages[o as usize].sparse[p..p + g.len()].copy_from_slice(g);
        }
    }
}

/// Adds the gradient `g` of row `id` of table `t` into `scratch`: a new slot
/// (recorded in `cell` and `order`) the first time the row appears in this
/// step, else onto its slot. `cell` is `u32::MAX` while the row has no slot.
#[inline(always)]
fn add_row(t: usize, id: u64, g: &[f32], cell: &mut u32, order: &mut Vec<(u32, u64)>, scratch: &mut Vec<f32>) {
    if *cell == u32::MAX {
        *cell = order.len() as u32;
        order.push((t as u32, id));
        scratch.extend_from_slice(g);
    } else {
        let s = *cell as usize * g.len();
        for (a, &v) in scratch[s..s + g.len()].iter_mut().zip(g) {
            *a += v;
        }
    }
}

/// Scales each summed row gradient by `scale` and applies it, prefetching a few rows ahead.
#[inline]
fn apply_rows<S: EmbeddingStore>(store: &mut S, order: &[(u32, u64)], scratch: &mut [f32], scale: f32, d: usize) {
    for (slot, &(t, id)) in order.iter().enumerate() {
        if let Some(&(ta, ida)) = order.get(slot + 8) {
            store.prefetch_row(ta as usize, ida);
        }
        let g = &mut scratch[slot * d..(slot + 1) * d];
        for v in g.iter_mut() {
            *v *= scale;
        }
        store.apply(t as usize, id, g);
    }
}
