//! The scoring thread: requests batched across connections, and the model swap.
//!
//! Invariants:
//! * Every job gets exactly one reply: its scores, in record order, with the
//!   step of the model that scored all of them; or the first bad record.
//! * A reload never fails or drops a request: the new model is loaded off
//!   this thread and taken between two batches, so each batch is scored by
//!   one model.
//! * A job joins a batch only whole, and a batch closes when it holds
//!   `max_batch` records or `max_wait` after its first job arrived.
//! * A batch is counted in [`ServingState`] before its answers are sent, so
//!   a client holding its answer sees its records counted.

use super::score::Loaded;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiderec_operators::Batch;

/// One request's records and where its reply goes.
pub struct Job {
    /// Raw JSON records, one per element.
    pub records: Vec<Vec<u8>>,
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
    /// Reloads done so far.
    pub reloads: u64,
    /// The model's records, as `GET /schema` describes them.
    #[serde(skip)]
    pub schema: Arc<serde_json::Value>,
}

/// Batching limits.
#[derive(Clone, Copy, Debug)]
pub struct BatchLimits {
    /// Most records in one forward pass.
    pub max_batch: usize,
    /// Longest wait for more jobs after the first one of a batch.
    pub max_wait: Duration,
}

/// Runs until every sender of `jobs` is gone. `pending` holds a newer model for it to take.
pub fn run(
    mut model: Loaded,
    jobs: Receiver<Job>,
    pending: Arc<Mutex<Option<Loaded>>>,
    state: Arc<Mutex<ServingState>>,
    limits: BatchLimits,
) {
    let mut batch = model.batch();
    let mut one = model.batch();
    let mut scores = Vec::new();
    let mut taken: Vec<(Sender<Reply>, usize)> = Vec::new();
    while let Ok(first) = jobs.recv() {
        if let Some(newer) = pending.lock().unwrap_or_else(|e| e.into_inner()).take() {
            model = newer;
            batch = model.batch();
            one = model.batch();
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            s.step = model.step;
            s.checkpoint = model.path.display().to_string();
            s.model = model.model_name.to_string();
            s.schema = Arc::new(model.describe());
            s.reloads += 1;
        }
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
            // A timeout or a closed channel ends the batch.
            next = jobs.recv_timeout(left).ok();
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
                Ok(()) => Reply::Scored { step: model.step, scores: scores[at..at + n].to_vec() },
                Err(e) => Reply::Failed(e.to_string()),
            });
            at += n;
        }
    }
}

/// Featurizes `job` into `batch` whole, or replies with its first bad record.
fn add(model: &Loaded, job: Job, batch: &mut Batch, one: &mut Batch, taken: &mut Vec<(Sender<Reply>, usize)>) {
    one.clear();
    for (index, record) in job.records.iter().enumerate() {
        if let Err(reason) = model.featurize(record, one) {
            let _ = job.reply.send(Reply::BadRecord { index, reason: reason.to_string() });
            return;
        }
    }
    batch.extend_from(one);
    taken.push((job.reply, job.records.len()));
}
