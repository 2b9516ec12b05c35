//! The scoring thread: requests batched across connections, and the model swap.
//!
//! Invariants:
//! * Every job gets exactly one reply: its scores, in record order, with the
//!   step of the model that scored all of them; or the first bad record.
//! * Every job is scored by the model of the generation its request pinned
//!   when it started (`generations.rs`): a batch holds jobs of one
//!   generation, so one request's records are all scored by one model,
//!   whatever reloads happen meanwhile. A job of a generation not made yet
//!   (its delta waits for the requests of the previous one) waits, and is
//!   scored once it is made.
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
//!   until a whole load. It is applied only once no request holds the model it
//!   changes, which is never changed under a request.
//! * A batch is counted in [`ServingState`] before its answers are sent, so
//!   a client holding its answer sees its records counted.

use super::generations::{Generations, Models};
use super::score::{Delta, Loaded};
use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiderec_operators::Batch;

pub use super::work::{Job, Reply, Work};

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

/// Runs until every sender of `work` is gone, scoring each job with the model of its
/// generation (`first` is generation 0 of `generations`).
pub fn run(
    first: Loaded,
    generations: Arc<Generations>,
    work: Receiver<Work>,
    state: Arc<Mutex<ServingState>>,
    limits: BatchLimits,
) {
    let mut models = Models::new(first, generations);
    let mut buffers: Option<(u64, Batch, Batch)> = None;
    let mut scores = Vec::new();
    let mut taken: Vec<(Sender<Reply>, usize)> = Vec::new();
    // Work taken from the channel and not handled yet, then jobs whose model was made since.
    let mut pending: VecDeque<Work> = VecDeque::new();
    // Jobs of a generation whose delta waits.
    let mut waiting: Vec<Job> = Vec::new();
    while let Some(first) = pending.pop_front().or_else(|| work.recv().ok()) {
        let first = match first {
            Work::Swap(newer) => {
                swapped(&newer, &state);
                models.swap(*newer);
                continue;
            }
            Work::Delta(delta) => {
                models.delta(delta, |model, delta, current| apply(model, delta, current, &state));
                wake(&mut models, &mut waiting, &mut pending);
                continue;
            }
            Work::Released => {
                models.released(|model, delta, current| apply(model, delta, current, &state));
                wake(&mut models, &mut waiting, &mut pending);
                continue;
            }
            Work::Score(job) => job,
        };
        let generation = first.generation;
        let Some(model) = models.get(generation) else {
            waiting.push(first);
            continue;
        };
        let (batch, one) = shaped(&mut buffers, generation, model);
        batch.clear();
        taken.clear();
        let deadline = Instant::now() + limits.max_wait;
        let mut next = Some(first);
        while let Some(job) = next.take() {
            add(model, job, batch, one, &mut taken);
            if batch.len() >= limits.max_batch {
                break;
            }
            // A timeout or a closed channel ends the batch; a swap, a job of another generation
            // or one that does not fit ends it and starts the next.
            match next_work(&mut pending, &work, deadline) {
                Some(Work::Score(job))
                    if job.generation == generation && batch.len() + job.records.len() <= limits.max_batch =>
                {
                    next = Some(job)
                }
                Some(other) => pending.push_front(other),
                None => {}
            }
        }
        if batch.is_empty() {
            continue;
        }
        scores.clear();
        let scored = model.score(batch, &mut scores);
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

/// The next work of a batch being filled: what is pending, else what arrives on `work` before
/// `deadline` (`None` past it, or once every sender is gone).
fn next_work(pending: &mut VecDeque<Work>, work: &Receiver<Work>, deadline: Instant) -> Option<Work> {
    pending.pop_front().or_else(|| work.recv_timeout(deadline.saturating_duration_since(Instant::now())).ok())
}

/// The batch buffers for records of `model`, of generation `generation` (made anew for
/// another generation, whose records may have another shape).
fn shaped<'b>(
    buffers: &'b mut Option<(u64, Batch, Batch)>,
    generation: u64,
    model: &Loaded,
) -> (&'b mut Batch, &'b mut Batch) {
    if buffers.as_ref().is_some_and(|(made, _, _)| *made != generation) {
        *buffers = None;
    }
    let (_, batch, one) = buffers.get_or_insert_with(|| (generation, model.batch(), model.batch()));
    (batch, one)
}

/// Moves the waiting jobs whose model is made to `pending`, in the order they came.
fn wake(models: &mut Models<Loaded>, waiting: &mut Vec<Job>, pending: &mut VecDeque<Work>) {
    let (ready, still): (Vec<Job>, Vec<Job>) =
        std::mem::take(waiting).into_iter().partition(|job| models.get(job.generation).is_some());
    *waiting = still;
    pending.extend(ready.into_iter().map(Work::Score));
}

/// Applies `delta` onto `model`, publishing the model in `state` when its generation is
/// `current` (else a later one, already published, superseded it).
fn apply(model: &mut Loaded, delta: &Delta, current: bool, state: &Mutex<ServingState>) {
    match model.apply_delta(delta) {
        Ok(()) => {
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            if current {
                (s.step, s.checkpoint) = (model.step, model.path.display().to_string());
            }
            s.deltas += 1;
        }
        Err(e) => {
            let warning = format!("cannot apply the delta {}: {e}", delta.path.display());
            eprintln!("warning: serve: {warning}; loading the newest checkpoint whole");
            if current {
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                (s.warning, s.stale) = (Some(warning), true);
            }
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
