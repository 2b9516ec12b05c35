//! Training as a timely operator: [`Train::train`] on a stream of micro-batches in
//! your own dataflow, the same stages as [`Trainer::step`](super::Trainer::step).
//!
//! Invariants:
//! * **Timestamps are steps.** A batch at time `t` is this worker's micro-batch of
//!   step `t`, and steps run in time order from 0. Every worker takes part in every
//!   step up to its input's frontier: a step for which a worker received no batch
//!   (its frontier passed `t`) gets an empty micro-batch from it, so no worker ever
//!   waits for a batch that will not come, and a gap in the times costs one empty
//!   step per missing time. Several batches of one worker at one time are one
//!   micro-batch, in arrival order.
//! * **The steps end together.** Each worker's command of a step says whether it has
//!   anything after it (its input closed, no later batch); the steps end after the
//!   first step in which no worker has, on every worker, whenever each closed its
//!   input and whatever of each other's frontiers they saw. A step in which no worker
//!   had a batch and every input was closed ends the steps and is not reported.
//! * **One step at a time.** Step `t + 1` enters the stages once step `t` has
//!   completed on this worker, as with the imperative trainer.
//! * **The same steps as the imperative trainer.** Each step is a
//!   [`StepKind::Train`] step of the stages [`Trainer`](super::Trainer) runs: the
//!   same micro-batches give the same parameters (tested).
//! * **A bad batch fails its step everywhere.** A batch that does not fit the model
//!   (checked before it joins the step's other batches) makes its step a failed one
//!   for every worker (`failed_workers` in that step's statistics, nothing trained on
//!   any worker) and its error is kept in the [`TrainHandle`]. So does a failure of
//!   the worker's model in its passes (a device model's; its loss is then not finite,
//!   which also ends the steps).
//! * **Never on a ruined model.** A step that found a non-finite loss, gradient or
//!   parameter ([`StepStats::non_finite`]) is the last on every worker, and each keeps a
//!   [`DataflowError::NonFinite`] error.
//! * The output holds each completed step's [`StepStats`], summed over all workers,
//!   once per worker, at the step's time.

use super::dataflow::{self, Shared};
use super::{check_batch, empty_batch, prepare, Command, StepKind, StepStats, TrainerConfig};
use crate::bad_record::BadReason;
use crate::batch::Batch;
use crate::metrics::EvalSet;
use crate::nn::Model;
use crate::snapshot::WorkerSnapshot;
use crate::{DataflowError, OperatorError};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::operator::Operator;
use timely::dataflow::{Stream, StreamVec};

/// Trains on a stream of micro-batches whose timestamps are step numbers (from 0).
///
/// A batch at time `t` is this worker's micro-batch of step `t`. Every worker takes part
/// in every step up to its input's frontier, with an empty micro-batch where it has
/// none, until no worker has anything more: a worker may close its input at any time.
/// Steps enter the training stages one at a time, the stages of
/// [`Trainer::step`](super::Trainer::step), with the same results for the same
/// micro-batches. A batch that does not fit the model fails its step on every worker
/// (`failed_workers`, nothing trained); its error is kept in the [`TrainHandle`]. A
/// non-finite step is the last one (its error is kept too).
pub trait Train<'scope> {
    /// Trains `config.model` (initialised from `config.seed`) on this worker's batches.
    /// Returns the statistics of every completed step and a handle on the trainer's state.
    /// Errors (a configuration that does not validate) name the key, before any data flows.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use timely::dataflow::operators::{Input, Inspect, Probe};
    /// use timely::dataflow::InputHandle;
    /// use tiderec_operators::nn::{DlrmConfig, ModelConfig};
    /// use tiderec_operators::train::{Train, TrainerConfig};
    /// use tiderec_operators::Batch;
    ///
    /// let model = ModelConfig::Dlrm(DlrmConfig {
    ///     num_dense: 1, num_sparse: 1, dim: 4, bottom: vec![4], top: vec![1], self_interaction: false,
    /// });
    /// let config = TrainerConfig::builder(model, vec![10]).build().unwrap();
    /// let samples = Arc::new(Mutex::new(Vec::new()));
    /// let seen = samples.clone();
    /// timely::execute(timely::Config::process(2), move |worker| {
    ///     let mut input = InputHandle::new();
    ///     let seen = seen.clone();
    ///     let probe = worker.dataflow::<u64, _, _>(|scope| {
    ///         let (steps, _handle) = input.to_stream(scope).train(&config).unwrap();
    ///         let me = scope.index();
    ///         steps.inspect(move |s| if me == 0 { seen.lock().unwrap().push(s.samples) }).probe().0
    ///     });
    ///     for step in 0..3u64 {
    ///         // One sample per worker and step; worker 1 sends nothing at step 1.
    ///         if !(worker.index() == 1 && step == 1) {
    ///             let mut batch = Batch::new(1, 1);
    ///             batch.labels.push(1.0);
    ///             batch.dense.push(0.5);
    ///             batch.sparse[0].ids.push(step);
    ///             batch.sparse[0].close_bag();
    ///             input.send(batch);
    ///         }
    ///         input.advance_to(step + 1);
    ///     }
    ///     input.close();
    ///     while !probe.done() {
    ///         worker.step();
    ///     }
    /// }).unwrap();
    /// assert_eq!(*samples.lock().unwrap(), vec![2, 1, 2]);
    /// ```
    fn train(self, config: &TrainerConfig) -> Result<(StreamVec<'scope, u64, StepStats>, TrainHandle), OperatorError>;

    /// As [`train`](Train::train), with this worker's model built by the caller (see
    /// [`Trainer::with_model`](super::Trainer::with_model)).
    fn train_with_model(
        self,
        config: &TrainerConfig,
        model: Box<dyn Model<f32>>,
    ) -> Result<(StreamVec<'scope, u64, StepStats>, TrainHandle), OperatorError>;
}

impl<'scope> Train<'scope> for StreamVec<'scope, u64, Batch> {
    fn train(self, config: &TrainerConfig) -> Result<(StreamVec<'scope, u64, StepStats>, TrainHandle), OperatorError> {
        let model = config.model.build::<f32>(config.seed)?;
        self.train_with_model(config, model)
    }

    fn train_with_model(
        self,
        config: &TrainerConfig,
        model: Box<dyn Model<f32>>,
    ) -> Result<(StreamVec<'scope, u64, StepStats>, TrainHandle), OperatorError> {
        let scope = self.scope();
        let workers = scope.peers();
        let (shared, deep_partial) = prepare((scope.index(), workers), config, model, None)?;
        let errors: Rc<RefCell<Vec<(u64, OperatorError)>>> = Rc::default();
        let commands = commands(self, config.clone(), &shared, errors.clone());
        let stats = dataflow::stages(commands, &shared, deep_partial, workers);
        let handle = TrainHandle {
            shared,
            config: config.clone(),
            errors: errors.clone(),
            trained: Rc::default(),
            ruined: Rc::default(),
        };
        let (trained, ruined) = (handle.trained.clone(), handle.ruined.clone());
        let home = handle.shared.home.clone();
        let stats = stats.unary::<CapacityContainerBuilder<Vec<StepStats>>, _, _, _>(Pipeline, "Trained", |_, _| {
            move |input, output| {
                input.for_each(|cap, data: &mut Vec<StepStats>| {
                    // A failure of this worker's model in the step (the step failed everywhere).
                    if let Some(error) = home.borrow_mut().take_failure() {
                        let t = *cap.least().expect("a message has a time");
                        errors.borrow_mut().push((t, error));
                    }
                    *trained.borrow_mut() += data.iter().filter(|s| s.updates_parameters()).count() as u64;
                    if data.iter().any(|s| s.non_finite > 0) && ruined.get().is_none() {
                        ruined.set(Some(*cap.least().expect("a message has a time") + 1));
                    }
                    // The step in which every worker said it had nothing more and none sent
                    // anything only ends the steps: it is no step of the caller's.
                    data.retain(|s| !(s.stop_requests == workers as u64 && s.samples == 0 && s.failed_workers == 0));
                    output.session(&cap).give_container(data);
                });
            }
        });
        Ok((stats, handle))
    }
}

/// This worker's step commands: its batches of each step merged into one, an empty
/// one for each step it has no batch of, a failed one for a batch that does not fit.
///
/// Each command tells every worker whether this one has anything after it (its input
/// closed, no later batch): the steps end after the first step in which no worker has,
/// or after a step that found a non-finite value (every worker sees the same summed
/// statistics, so all of them end after the same step whatever they saw of each
/// other's frontiers).
fn commands<'scope>(
    batches: StreamVec<'scope, u64, Batch>,
    config: TrainerConfig,
    shared: &Shared,
    errors: Rc<RefCell<Vec<(u64, OperatorError)>>>,
) -> Stream<'scope, u64, Vec<Command>> {
    let (scope, outcome, waker) = (batches.scope(), shared.outcome.clone(), shared.next_step.clone());
    let workers = scope.peers() as u64;
    batches.unary_frontier::<CapacityContainerBuilder<Vec<Command>>, _, _, _>(Pipeline, "Steps", move |cap, info| {
        // Woken when a step completes: the stages take one step at a time.
        *waker.borrow_mut() = Some(scope.activator_for(info.address.clone()));
        let mut next = Some(cap);
        let mut steps = Steps::default();
        move |(input, frontier), output| {
            input.for_each(|cap, data: &mut Vec<Batch>| {
                let t = *cap.least().expect("a message has a time");
                // Once the steps have ended, later batches have no step to join.
                if next.is_none() {
                    data.clear();
                    return;
                }
                for batch in data.drain(..) {
                    if let Err(e) = steps.add(&config, t, batch) {
                        errors.borrow_mut().push((t, e));
                    }
                }
            });
            while let Some(cap) = next.as_mut() {
                let t = *cap.time();
                // One step at a time: the step before has completed here.
                if outcome.borrow().completed() < t {
                    break;
                }
                if t > 0 {
                    let last = outcome.borrow().stats();
                    if last.non_finite > 0 {
                        errors.borrow_mut().push((t - 1, DataflowError::NonFinite { step: t }.into()));
                    }
                    if last.non_finite > 0 || last.stop_requests == workers {
                        next = None;
                        break;
                    }
                }
                let closed = frontier.is_empty();
                if !closed && frontier.less_equal(&t) {
                    break;
                }
                let (batch, failed) = steps.take(&config, t);
                let mut command = step_command(batch, failed);
                command.stop = closed && steps.is_empty();
                output.session(&*cap).give(command);
                cap.downgrade(&(t + 1));
            }
        }
    })
}

/// This worker's batches of the steps it has not sent yet, and the steps a batch
/// that did not fit has failed.
#[derive(Default)]
struct Steps {
    pending: BTreeMap<u64, Batch>,
    failed: BTreeSet<u64>,
}

impl Steps {
    /// Adds a batch of step `t` (after those of `t` before it), or fails the step when it
    /// does not fit the model or the step's other batches; checked before it is merged.
    fn add(&mut self, config: &TrainerConfig, t: u64, batch: Batch) -> Result<(), OperatorError> {
        if self.failed.contains(&t) {
            return Ok(());
        }
        let fits = check_batch(config, &batch).and_then(|()| match self.pending.get(&t) {
            Some(merged) if !same_shape(merged, &batch) => {
                Err(OperatorError::config("batch", "batches of one step differ in shape"))
            }
            _ => Ok(()),
        });
        match fits {
            Ok(()) => match self.pending.get_mut(&t) {
                Some(merged) => merged.extend_from(&batch),
                None => {
                    self.pending.insert(t, batch);
                }
            },
            Err(e) => {
                self.pending.remove(&t);
                self.failed.insert(t);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Step `t`'s micro-batch (empty where there is none) and whether the step failed here.
    fn take(&mut self, config: &TrainerConfig, t: u64) -> (Batch, bool) {
        let failed = self.failed.remove(&t);
        let batch = self.pending.remove(&t).filter(|_| !failed).unwrap_or_else(|| empty_batch(config));
        (batch, failed)
    }

    /// Whether no later step has a batch or a failure here.
    fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.failed.is_empty()
    }
}

/// Whether two batches have the same features (so one extends the other).
fn same_shape(a: &Batch, b: &Batch) -> bool {
    a.num_dense == b.num_dense && a.sparse.len() == b.sparse.len() && a.sequences.len() == b.sequences.len()
}

fn step_command(batch: Batch, failed: bool) -> Command {
    Command { kind: StepKind::Train, batch, failed, bad_records: [0; BadReason::COUNT], score: false, stop: false }
}

/// This worker's side of a [`Train::train`] operator: its state between steps.
///
/// Read it between steps (when a probe on the operator's output has passed the step):
/// a snapshot taken while a step is under way mixes two steps.
pub struct TrainHandle {
    shared: Shared,
    config: TrainerConfig,
    errors: Rc<RefCell<Vec<(u64, OperatorError)>>>,
    trained: Rc<RefCell<u64>>,
    /// The step (1-based) that found a non-finite value, once one has.
    ruined: Rc<Cell<Option<u64>>>,
}

impl TrainHandle {
    /// This worker's share of the model, as [`Trainer::snapshot`](super::Trainer::snapshot)
    /// (for `tiderec-sinks`' checkpoints).
    ///
    /// Errors: [`DataflowError::NonFinite`] once a step has found a non-finite loss,
    /// gradient or parameter: a ruined model is never handed out to be kept.
    pub fn snapshot(&self) -> Result<WorkerSnapshot, OperatorError> {
        if let Some(step) = self.ruined.get() {
            return Err(DataflowError::NonFinite { step }.into());
        }
        let dense = self.shared.dense.borrow();
        let writer = (self.config.seed, &self.config.table_sizes[..]);
        Ok(self.shared.owner.borrow().snapshot(&dense, *self.trained.borrow(), writer))
    }

    /// This worker's copy of the dense parameters.
    pub fn dense_params(&self) -> Vec<f32> {
        self.shared.dense.borrow().params().to_vec()
    }

    /// The errors of this worker's batches and model so far, each with its step (each step failed).
    pub fn take_errors(&self) -> Vec<(u64, OperatorError)> {
        std::mem::take(&mut *self.errors.borrow_mut())
    }

    /// Steps that updated the parameters ([`StepStats::updates_parameters`]).
    pub fn trained_steps(&self) -> u64 {
        *self.trained.borrow()
    }

    /// The predictions gathered so far (on worker 0; empty for training steps).
    pub fn take_eval(&self) -> EvalSet {
        std::mem::take(&mut *self.shared.eval.borrow_mut())
    }
}
