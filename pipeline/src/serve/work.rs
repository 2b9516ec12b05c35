//! `work`: the messages the scoring thread is sent ([`Work`]) and what a
//! request gets back ([`Reply`]). Kept apart from the batcher, which reads
//! them, and the generations, which send releases, so neither imports the other.

use super::budget::Body;
use super::score::{Delta, Loaded};
use std::ops::Range;
use std::sync::mpsc::Sender;
use std::sync::Arc;

/// What the scoring thread is sent.
pub enum Work {
    /// Records to score.
    Score(Job),
    /// A newer model, taken between two batches.
    Swap(Box<Loaded>),
    /// The delta that follows the served checkpoint, applied between two batches.
    Delta(Box<Delta>),
    /// The last request holding a generation that is no longer current has ended.
    Released,
}

/// Records of one request (at most `max_batch` of them) and where their reply goes.
pub struct Job {
    /// The request's body (its budget is given back when the last job lets go of it).
    pub body: Arc<Body>,
    /// The records, as ranges of the body.
    pub records: Vec<Range<usize>>,
    /// The index in the request of the first of them.
    pub first: usize,
    /// The model generation the request pinned: the one that scores it.
    pub generation: u64,
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
