//! CUDA graphs of the device-resident worker's training step: the step's
//! launches captured once per staging slot and batch shape (at most
//! [`MAX_GRAPHS`] graphs kept), then replayed as one graph launch instead of
//! some seventy kernel launches.
//!
//! ## Invariants
//!
//! * **A replay queues what an uncaptured step would.** A step is captured
//!   only after a step of the same slot and shape ran uncaptured with no
//!   device buffer allocated since: every workspace then fits, so nothing is
//!   allocated while the stream captures, and the launches captured are the
//!   ones that step made.
//! * **No graph outlives a buffer it names.** A graph names buffers by
//!   address; any allocation through the device (a buffer grown for a larger
//!   batch, a restore, an evaluation batch of a new size) drops every graph,
//!   and every shape must run uncaptured once more before it is captured again.
//! * **What changes from step to step is read from device memory.** The
//!   batch (in its slot's buffers), the learning rates and Adam's bias
//!   corrections (written by launches queued before the graph's) are read by
//!   the replayed kernels; a step's host-side effects, such as counting it,
//!   happen outside the captured region.
//! * **Off by default.** [`Graphs::on`] turns them on; the phase clock,
//!   which waits for the device inside a step, keeps them off.

use super::staging::Shape;
use crate::{Device, GpuError};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use std::collections::{HashMap, HashSet};

/// A staging slot and the shape of its batch: what one graph replays.
pub(super) type Key = (usize, Shape);

/// Graphs kept at most: each holds its launches' parameters in device
/// memory, and batches whose shapes seldom repeat (behaviour sequences of
/// varying lengths, multi-hot fields) would otherwise capture one per shape.
/// Past it a new shape's steps run their launches as they are.
const MAX_GRAPHS: usize = 16;
/// Shapes remembered as ready for a capture at most (past it the list starts over).
const MAX_WARM: usize = 1024;

/// How many steps ran as graphs, and how many graphs were captured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GraphCounts {
    /// Graphs captured (each one replayed at once for the step that captured it).
    pub captured: u64,
    /// Steps run by launching a graph, the capturing steps included.
    pub replayed: u64,
    /// Captures that failed; the first turns graphs off (the step ran its launches instead).
    pub failed: u64,
}

/// A captured step: its graph and where it leaves the step's loss in `d_loss`.
struct Captured {
    graph: CudaGraph,
    loss_at: usize,
}

/// Which graphs may be replayed and which keys may be captured next, by the
/// device's allocation count (the bookkeeping of [`Graphs`], without CUDA).
struct Book<G> {
    captured: HashMap<Key, G>,
    /// Keys that ran uncaptured since the allocation count was `generation`.
    warm: HashSet<Key>,
    generation: u64,
}

impl<G> Default for Book<G> {
    fn default() -> Self {
        Book { captured: HashMap::new(), warm: HashSet::new(), generation: 0 }
    }
}

/// What a step of a key should do, by the [`Book`].
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Queue,
    Capture,
    Replay,
}

impl<G> Book<G> {
    /// Forgets everything when the allocation count moved to `generation`.
    fn at(&mut self, generation: u64) {
        if generation != self.generation {
            self.clear();
            self.generation = generation;
        }
    }

    fn clear(&mut self) {
        self.captured.clear();
        self.warm.clear();
    }

    /// The step of `key` with the allocation count at `generation`.
    fn decide(&mut self, generation: u64, key: Key) -> Decision {
        self.at(generation);
        if self.captured.contains_key(&key) {
            Decision::Replay
        } else if self.warm.contains(&key) && self.captured.len() < MAX_GRAPHS {
            Decision::Capture
        } else {
            Decision::Queue
        }
    }

    /// `key` ran uncaptured, leaving the allocation count at `generation`.
    fn ran(&mut self, generation: u64, key: Key) {
        self.at(generation);
        if self.warm.len() >= MAX_WARM {
            self.warm.clear();
        }
        self.warm.insert(key);
    }
}

/// The worker's graphs and what they may be captured from (see the module docs).
#[derive(Default)]
pub(super) struct Graphs {
    on: bool,
    book: Book<Captured>,
    counts: GraphCounts,
}

/// What [`Graphs::plan`] says a step should do.
pub(super) enum Plan {
    /// Queue the step's launches on the stream as they are.
    Queue,
    /// Capture the step's launches into a graph and launch it.
    Capture,
    /// The step's graph was launched; the loss is at this index.
    Launched(usize),
}

impl Graphs {
    /// Turns graphs on or off (off drops every graph).
    pub(super) fn set_on(&mut self, on: bool) {
        self.on = on;
        self.clear();
    }

    /// Whether graphs are on.
    pub(super) fn on(&self) -> bool {
        self.on
    }

    /// Steps run as graphs and graphs captured so far.
    pub(super) fn counts(&self) -> GraphCounts {
        self.counts
    }

    /// A capture failed: counted, and graphs turn off, so no later step
    /// captures (and launches) its work twice.
    pub(super) fn capture_failed(&mut self) {
        self.counts.failed += 1;
        self.set_on(false);
    }

    /// Drops every graph and forgets which shapes ran (the buffers they name may change).
    pub(super) fn clear(&mut self) {
        self.book.clear();
    }

    /// Decides the step of `key` (graphs on and the phase clock off); launches
    /// its graph when it has one. Drops every graph first when `dev` has
    /// allocated a buffer since the last step.
    pub(super) fn plan(&mut self, dev: &Device, key: Key) -> Result<Plan, GpuError> {
        Ok(match self.book.decide(dev.allocations(), key) {
            Decision::Queue => Plan::Queue,
            Decision::Capture => Plan::Capture,
            Decision::Replay => {
                let c = &self.book.captured[&key];
                c.graph.launch().map_err(GpuError::driver("launching a step's CUDA graph"))?;
                self.counts.replayed += 1;
                Plan::Launched(c.loss_at)
            }
        })
    }

    /// Notes that the step of `key` ran uncaptured: it may be captured next
    /// time, unless it allocated (then every other key must run again first).
    pub(super) fn ran(&mut self, dev: &Device, key: Key) {
        self.book.ran(dev.allocations(), key);
    }

    /// Starts capturing `dev`'s stream for the step of `key`; what is
    /// queued until [`end_capture`](Self::end_capture) is captured, not run.
    pub(super) fn begin_capture(&mut self, dev: &Device) -> Result<Capturing, GpuError> {
        dev.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(GpuError::driver("starting to capture a step's CUDA graph"))?;
        Ok(Capturing { allocations: dev.allocations() })
    }

    /// Ends the capture [`begin_capture`](Self::begin_capture) started, keeps
    /// the graph for `key` and launches it; `queued` is how queueing the step
    /// went (where it leaves its loss). Fails, keeping no graph, when queueing
    /// failed or allocated while capturing.
    pub(super) fn end_capture(
        &mut self,
        dev: &Device,
        key: Key,
        started: Capturing,
        queued: Result<usize, GpuError>,
    ) -> Result<usize, GpuError> {
        // The capture ends whatever happened, so the stream is usable again.
        let ended = dev.stream.end_capture(CUgraphInstantiate_flags(0));
        let loss_at = queued?;
        let graph = ended
            .map_err(GpuError::driver("capturing a step's CUDA graph"))?
            .ok_or_else(|| GpuError::shape("CUDA graph", "the captured step holds no work"))?;
        if dev.allocations() != started.allocations {
            self.clear();
            return Err(GpuError::shape("CUDA graph", "a device buffer was allocated while the step was captured"));
        }
        graph.launch().map_err(GpuError::driver("launching a step's CUDA graph"))?;
        self.counts.captured += 1;
        self.counts.replayed += 1;
        self.book.captured.insert(key, Captured { graph, loss_at });
        Ok(loss_at)
    }
}

/// A capture under way: the allocation count when it started.
#[must_use = "a capture must be ended"]
pub(super) struct Capturing {
    allocations: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(batch: usize) -> Shape {
        Shape { batch, fields: 4, entries: batch * 4, ..Shape::default() }
    }

    /// Steps of `(slot, batch, allocation count after the step's staging,
    /// allocation count after its launches)` through a book, the decisions made.
    fn walk(book: &mut Book<()>, steps: &[(usize, usize, u64, u64)]) -> Vec<Decision> {
        steps
            .iter()
            .map(|&(slot, batch, staged, after)| {
                let key = (slot, shape(batch));
                let d = book.decide(staged, key);
                match d {
                    Decision::Queue => book.ran(after, key),
                    Decision::Capture => {
                        book.captured.insert(key, ());
                    }
                    Decision::Replay => {}
                }
                d
            })
            .collect()
    }

    #[test]
    fn equal_batches_in_two_slots_are_captured_once_their_buffers_fit_then_replayed() {
        use Decision::*;
        let mut book = Book::default();
        // Slot 0's first step allocates everything; slot 1's staging allocates its own buffers.
        let d = walk(&mut book, &[(0, 64, 5, 9), (1, 64, 12, 12), (0, 64, 12, 12), (1, 64, 12, 12)]);
        assert_eq!(d, [Queue, Queue, Queue, Capture]);
        let d = walk(&mut book, &[(0, 64, 12, 12), (1, 64, 12, 12), (0, 64, 12, 12)]);
        assert_eq!(d, [Capture, Replay, Replay]);
    }

    #[test]
    fn any_allocation_drops_every_graph_and_every_warm_key() {
        use Decision::*;
        let mut book = Book::default();
        walk(&mut book, &[(0, 64, 1, 1), (1, 64, 1, 1), (0, 64, 1, 1), (1, 64, 1, 1)]);
        // A larger batch grows the buffers: the graphs of 64 name freed memory.
        let d = walk(&mut book, &[(0, 1000, 3, 7), (1, 64, 7, 7), (0, 64, 7, 7), (1, 64, 7, 7)]);
        assert_eq!(d, [Queue, Queue, Queue, Capture]);
        // An allocation between steps (an evaluation, a restore) too, even for a captured key.
        assert_eq!(book.decide(8, (1, shape(64))), Queue);
        assert!(book.captured.is_empty() && book.warm.is_empty());
    }

    #[test]
    fn past_the_most_graphs_new_shapes_run_their_launches() {
        use Decision::*;
        let mut book = Book::default();
        let steps: Vec<_> = (0..MAX_GRAPHS + 3).flat_map(|b| [(0, b + 1, 1, 1), (0, b + 1, 1, 1)]).collect();
        let d = walk(&mut book, &steps);
        let captures = d.iter().filter(|&d| *d == Capture).count();
        assert_eq!(captures, MAX_GRAPHS, "{d:?}");
        assert_eq!(book.captured.len(), MAX_GRAPHS);
        // A captured shape still replays; a shape past the cap keeps running its launches.
        assert_eq!(book.decide(1, (0, shape(1))), Replay);
        assert_eq!(book.decide(1, (0, shape(MAX_GRAPHS + 2))), Queue);
    }

    #[test]
    fn a_step_that_allocated_is_warm_alone() {
        use Decision::*;
        let mut book = Book::default();
        walk(&mut book, &[(0, 64, 1, 1), (0, 32, 1, 1)]);
        // The step of 128 allocates while it runs: it is warm, the others must run again.
        let d = walk(&mut book, &[(0, 128, 1, 2), (0, 64, 2, 2), (0, 128, 2, 2), (0, 64, 2, 2)]);
        assert_eq!(d, [Queue, Queue, Capture, Capture]);
        assert_eq!(book.decide(2, (0, shape(32))), Queue);
    }
}
