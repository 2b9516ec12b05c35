//! The scoring thread: requests batched across connections, and the model swap.
//!
//! Invariants:
//! * Every job gets exactly one reply: its scores, in record order, with the
//!   step of the model that scored all of them; or the first bad record.
//! * A reload never fails or drops a request: the new model is loaded off
//!   this thread and taken between two batches, so each batch is scored by
//!   one model; it is published in [`ServingState`] when taken, also when no
//!   request is waiting.
//! * A job joins a batch only whole, and a batch holds at most `max_batch`
//!   records (a job holds at most that many; one that does not fit starts
//!   the next batch). A batch closes when full or `max_wait` after its
//!   first job arrived.
//! * A delta ([`Work::Delta`]) is applied whole between two batches, or not at
//!   all (then [`ServingState::stale`] asks the watcher for a whole load), so no
//!   request is ever scored by a half-applied one; it is applied only onto the
//!   model of the step it follows, so after one that failed, none is applied
//!   until a whole load.
//! * A batch is counted in [`ServingState`] before its answers are sent, so
//!   a client holding its answer sees its records counted.

use super::budget::Body;
use super::score::{Delta, Loaded};
use std::ops::Range;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiderec_operators::Batch;

/// What the scoring thread is sent.
pub enum Work {
    /// Records to score.
    Score(Job),
    /// A newer model, taken between two batches.
    Swap(Box<Loaded>),
    /// The delta that follows the served checkpoint, applied between two batches.
    Delta(Box<Delta>),
}

/// Records of one request (at most `max_batch` of them) and where their reply goes.
pub struct Job {
    /// The request's body (its budget is given back when the last job lets go of it).
    pub body: Arc<Body>,
    /// The records, as ranges of the body.
    pub records: Vec<Range<usize>>,
    /// The index in the request of the first of them.
    pub first: usize,
    /// The reply channel.
    pub reply: Sender<Reply>,
}

/// What a request gets back.
#[derive(Debug)]
pub enum Reply {
    /// Scores in record order, and the step of the model that gave them.
    Scored {
        /// Step of the checkpoint.
        step: u64,
        /// How many models were taken before the one that scored (a request scored in
        /// several jobs checks that one model scored them all).
        generation: u64,
        /// Click probabilities.
        scores: Vec<f32>,
    },
    /// The model could not score the batch (a shape the checkpoint does not fit); the message says why.
    Failed(String),
    /// A record could not be featurized; nothing of the request was scored.
    BadRecord {
        /// Index of the record in the request.
        index: usize,
        /// What was wrong.
        reason: String,
    },
}

/// The model currently served, as readers outside the scoring thread see it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ServingState {
    /// Step of the checkpoint.
    pub step: u64,
    /// Its directory.
    pub checkpoint: String,
    /// Model name.
    pub model: String,
    /// Records scored so far.
    pub records: u64,
    /// Batches scored so far.
    pub batches: u64,
    /// Reloads done so far (whole checkpoints loaded).
    pub reloads: u64,
    /// Deltas applied onto the served model so far.
    pub deltas: u64,
    /// A delta could not be applied: the watcher must load the newest checkpoint whole.
    #[serde(skip)]
    pub stale: bool,
    /// Why the model served may be out of date (its checkpoint was deleted, or a delta could
    /// not be applied); cleared when a checkpoint is loaded whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// A checkpoint newer than the one served that cannot be loaded, set and cleared by the
    /// watcher alone (`/health` shows it in `warning`, see [`ServingState::warnings`]).
    #[serde(skip)]
    pub load_failure: Option<String>,
    /// The model's records, as `GET /schema` describes them.
    #[serde(skip)]
    pub schema: Arc<serde_json::Value>,
}

impl ServingState {
    /// Every warning of the state in one line (`None` when there is none).
    pub fn warnings(&self) -> Option<String> {
        let all: Vec<&str> = self.warning.iter().chain(&self.load_failure).map(String::as_str).collect();
        (!all.is_empty()).then(|| all.join("; "))
    }
}

/// Batching limits.
#[derive(Clone, Copy, Debug)]
pub struct BatchLimits {
    /// Most records in one forward pass.
    pub max_batch: usize,
    /// Longest wait for more jobs after the first one of a batch.
    pub max_wait: Duration,
}

/// Runs until every sender of `work` is gone.
pub fn run(mut model: Loaded, work: Receiver<Work>, state: Arc<Mutex<ServingState>>, limits: BatchLimits) {
    let mut batch = model.batch();
    let mut one = model.batch();
    let mut scores = Vec::new();
    let mut taken: Vec<(Sender<Reply>, usize)> = Vec::new();
    let mut generation = 0u64;
    let mut carry = None;
    while let Some(first) = carry.take().or_else(|| work.recv().ok()) {
        let first = match first {
            Work::Swap(newer) => {
                model = *newer;
                batch = model.batch();
                one = model.batch();
                generation += 1;
                swapped(&model, &state);
                continue;
            }
            Work::Delta(delta) => {
                match model.apply_delta(&delta) {
                    Ok(()) => {
                        generation += 1;
                        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                        (s.step, s.checkpoint) = (model.step, model.path.display().to_string());
                        s.deltas += 1;
                    }
                    Err(e) => {
                        let warning = format!("cannot apply the delta {}: {e}", delta.path.display());
                        eprintln!("warning: serve: {warning}; loading the newest checkpoint whole");
                        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                        (s.warning, s.stale) = (Some(warning), true);
                    }
                }
                continue;
            }
            Work::Score(job) => job,
        };
        batch.clear();
        taken.clear();
        let deadline = Instant::now() + limits.max_wait;
        let mut next = Some(first);
        while let Some(job) = next.take() {
            add(&model, job, &mut batch, &mut one, &mut taken);
            if batch.len() >= limits.max_batch {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            // A timeout or a closed channel ends the batch; a swap, or a job that does not fit,
            // ends it and starts the next.
            match work.recv_timeout(left) {
                Ok(Work::Score(job)) if batch.len() + job.records.len() <= limits.max_batch => next = Some(job),
                Ok(other) => carry = Some(other),
                Err(_) => {}
            }
        }
        if batch.is_empty() {
            continue;
        }
        scores.clear();
        let scored = model.score(&mut batch, &mut scores);
        // Counted before the answers go out: a client that has its answer sees it counted.
        {
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            s.records += batch.len() as u64;
            s.batches += 1;
        }
        let mut at = 0;
        for (reply, n) in taken.drain(..) {
            let _ = reply.send(match &scored {
                Ok(()) => Reply::Scored { step: model.step, generation, scores: scores[at..at + n].to_vec() },
                Err(e) => Reply::Failed(e.to_string()),
            });
            at += n;
        }
    }
}

/// Publishes the model just taken in `state`.
fn swapped(model: &Loaded, state: &Mutex<ServingState>) {
    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
    s.step = model.step;
    s.checkpoint = model.path.display().to_string();
    s.model = model.model_name.to_string();
    s.schema = Arc::new(model.describe());
    s.reloads += 1;
    s.warning = None;
}

/// Featurizes `job` into `batch` whole, or replies with its first bad record.
fn add(model: &Loaded, job: Job, batch: &mut Batch, one: &mut Batch, taken: &mut Vec<(Sender<Reply>, usize)>) {
    one.clear();
    for (k, range) in job.records.iter().enumerate() {
        let record = job.body.get(range.clone()).unwrap_or_default();
        if let Err(reason) = model.featurize(record, one) {
            let _ = job.reply.send(Reply::BadRecord { index: job.first + k, reason: reason.to_string() });
            return;
        }
    }
    batch.extend_from(one);
    taken.push((job.reply, job.records.len()));
}
