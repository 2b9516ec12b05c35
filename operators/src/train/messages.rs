//! The messages of a training step's stages and their sizes on the wire.
//!
//! Every message names its sender and its receiver ([`Routed`]); the stages
//! route on the receiver, combine in sender order, and count the bytes of
//! every message whose receiver is another worker.

use super::{StepKind, StepStats};
use crate::exchange::{PartialLookup, WireIds};
use crate::metrics::EvalSet;
use serde::{Deserialize, Serialize};

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

/// A message that travels from one worker to another in a training stage.
pub(super) trait Routed: timely::ExchangeData {
    /// Sender and receiver.
    fn route(&self) -> (u32, u32);
    /// Bytes on the wire.
    fn wire_bytes(&self) -> u64;
}

/// Implements [`Routed`] for a message with `from` and `to` fields, given its size on the wire.
macro_rules! routed {
    ($message:ty, |$m:ident| $bytes:expr) => {
        impl Routed for $message {
            fn route(&self) -> (u32, u32) {
                (self.from, self.to)
            }
            fn wire_bytes(&self) -> u64 {
                let $m = self;
                $bytes
            }
        }
    };
}

routed!(LookupRequest, |m| m.ids.wire_bytes()
    + 4 * m.table_lens.len() as u64
    + m.partial.as_ref().map_or(0, PartialLookup::wire_bytes));

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
    /// The owner's store (in another memory) failed serving these rows, which are then
    /// zeros: the step fails on every worker.
    #[serde(default)]
    pub failed: bool,
}

routed!(LookupReply, |m| 4 * (m.rows.len() + m.partial.len()) as u64);

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
    /// Predictions of an `Eval` step, with the batch's groups (sent to worker 0 only).
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
    /// Replies to the sender whose owner's store failed serving them ([`LookupReply::failed`]):
    /// then no owner updates anything in the step.
    #[serde(default)]
    pub failed_replies: u32,
}

// A fixed 32 bytes for the header and statistics, and the payload.
routed!(GradientMessage, |m| {
    let floats = m.sparse.len() + m.dense.len() + m.partial.len() + m.hot_grads.len();
    4 * (floats + m.hot.len() + 2 * m.eval.probs.len() + 2 * m.eval.groups.len()) as u64 + 32
});

/// A dense slice after its owner's update, broadcast to every worker.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ParamUpdate {
    /// Slice owner.
    pub from: u32,
    /// Receiver.
    pub to: u32,
    /// The step's statistics, summed over the homes' messages, except two counts that
    /// are this owner's own and that the receiver sums over all owners:
    /// `non_finite` (this owner found a non-finite value) and `failed_workers` (this
    /// owner's worker failed in the step: its home, its model or its store).
    pub stats: StepStats,
    /// Offset of the slice in the flat dense buffer.
    pub offset: u64,
    /// The updated values (empty when nothing changed or `to == from`).
    pub values: Vec<f32>,
}

// The values only (the statistics ride along uncounted).
routed!(ParamUpdate, |m| 4 * m.values.len() as u64);
