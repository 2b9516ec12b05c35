//! Where a worker's step time goes: the seconds spent inside each stage's work
//! and the seconds spent inside the trainer's steps in all, summed over the steps.
//!
//! What a step's time outside every stage (`total` minus the stages,
//! [`StepTimes::outside`]) is: waiting at a rendezvous for the other workers'
//! messages, moving messages between workers and timely's scheduling. On one
//! worker it is the dataflow's own overhead; what it grows by with more workers
//! is the cost of the rendezvous.
//!
//! The clock reads the monotonic clock twice per stage run and per step (tens of
//! nanoseconds each against steps of milliseconds), so it is always on and never
//! changes a result.
//!
//! Invariants: every field only grows. Stage work runs only while the worker is
//! stepped; when the trainer is the only one stepping it (as in `tiderec bench`
//! and `tiderec train`), every stage's time lies inside `total`, including work
//! done during one step for another (lookups of a faster peer's next step), so
//! the stages sum to at most `total`.

use serde::Serialize;
use std::cell::RefCell;
use std::time::Instant;

/// A stage of the training dataflow (`dataflow.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// Splitting a micro-batch's ids into one lookup request per owner.
    Plan,
    /// An owner gathering the rows a request asks for.
    Serve,
    /// The forward and backward pass, and the gradients' messages to owners.
    ForwardBackward,
    /// A deep model's partial exchange: owners turning partial-result gradients into row gradients.
    PartialBackward,
    /// An owner summing the gradients it was sent and updating its rows and its dense slice.
    Apply,
    /// Copying every owner's updated dense slice into this worker's replica.
    Gather,
}

impl Stage {
    /// The timely operator's name.
    pub(super) fn name(self) -> &'static str {
        match self {
            Stage::Plan => "PlanLookups",
            Stage::Serve => "ServeLookups",
            Stage::ForwardBackward => "ForwardBackward",
            Stage::PartialBackward => "PartialBackward",
            Stage::Apply => "ApplyGradients",
            Stage::Gather => "GatherParams",
        }
    }
}

/// Seconds one worker spent in its training steps, in all and inside each stage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StepTimes {
    /// Inside the trainer's steps (`Trainer::step` and the collective steps built on it).
    pub total: f64,
    /// Planning lookups: one request per owner.
    pub plan: f64,
    /// Serving lookups: gathering the requested rows (this worker as an owner).
    pub serve: f64,
    /// Forward and backward pass, row gradients and dense-gradient slices to their owners.
    pub forward_backward: f64,
    /// A deep model's partial exchange at the owners (zero otherwise).
    pub partial_backward: f64,
    /// Applying gradients as an owner: summing the workers' messages, row updates, the
    /// dense optimizer on this worker's slice (the reduce half of the all-reduce).
    pub apply: f64,
    /// Copying the owners' updated dense slices into the replica (the gather half).
    pub gather: f64,
}

impl StepTimes {
    /// Seconds inside the stages.
    pub fn stages(&self) -> f64 {
        self.plan + self.serve + self.forward_backward + self.partial_backward + self.apply + self.gather
    }

    /// Seconds inside the steps but outside every stage: waiting at rendezvous,
    /// moving messages, timely's scheduling (never negative).
    pub fn outside(&self) -> f64 {
        (self.total - self.stages()).max(0.0)
    }

    /// The times of the steps since `earlier` (an earlier reading of the same clock).
    pub fn since(&self, earlier: &StepTimes) -> StepTimes {
        self.zip(earlier, |a, b| a - b)
    }

    /// Every field times `factor` (per step, in milliseconds: `1e3 / steps`).
    pub fn scaled(&self, factor: f64) -> StepTimes {
        self.zip(self, |a, _| a * factor)
    }

    fn zip(&self, o: &StepTimes, f: impl Fn(f64, f64) -> f64) -> StepTimes {
        StepTimes {
            total: f(self.total, o.total),
            plan: f(self.plan, o.plan),
            serve: f(self.serve, o.serve),
            forward_backward: f(self.forward_backward, o.forward_backward),
            partial_backward: f(self.partial_backward, o.partial_backward),
            apply: f(self.apply, o.apply),
            gather: f(self.gather, o.gather),
        }
    }

    fn slot(&mut self, stage: Stage) -> &mut f64 {
        match stage {
            Stage::Plan => &mut self.plan,
            Stage::Serve => &mut self.serve,
            Stage::ForwardBackward => &mut self.forward_backward,
            Stage::PartialBackward => &mut self.partial_backward,
            Stage::Apply => &mut self.apply,
            Stage::Gather => &mut self.gather,
        }
    }
}

/// Runs `work`, adding its seconds to `stage` on `clock` (not borrowed while `work` runs).
pub(super) fn timed<R>(clock: &RefCell<StepTimes>, stage: Stage, work: impl FnOnce() -> R) -> R {
    let start = Instant::now();
    let out = work();
    *clock.borrow_mut().slot(stage) += start.elapsed().as_secs_f64();
    out
}

/// Runs `work`, adding its seconds to the steps' total on `clock`.
pub(super) fn timed_step<R>(clock: &RefCell<StepTimes>, work: impl FnOnce() -> R) -> R {
    let start = Instant::now();
    let out = work();
    clock.borrow_mut().total += start.elapsed().as_secs_f64();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_is_the_total_less_the_stages_and_since_subtracts_every_field() {
        let clock = RefCell::new(StepTimes::default());
        timed_step(&clock, || {
            timed(&clock, Stage::ForwardBackward, || std::thread::sleep(std::time::Duration::from_millis(5)));
            timed(&clock, Stage::Gather, || ());
            std::thread::sleep(std::time::Duration::from_millis(3));
        });
        let t = *clock.borrow();
        assert!(t.forward_backward >= 0.005, "{t:?}");
        assert!(t.outside() >= 0.003, "{t:?}");
        assert!((t.total - t.stages() - t.outside()).abs() < 1e-12, "{t:?}");
        assert_eq!(t.since(&t), StepTimes::default());
        let half = t.scaled(0.5);
        assert_eq!(half.forward_backward, t.forward_backward * 0.5);
        assert_eq!(half.total, t.total * 0.5);
        assert_eq!(t.since(&half).gather, t.gather - half.gather);
    }
}
