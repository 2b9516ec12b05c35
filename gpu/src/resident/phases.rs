//! Timing the phases of a device-resident step (see
//! [`ResidentWorker::time_phases`](super::ResidentWorker::time_phases)): the
//! host waits for the device at the end of each phase, so the phases add up to
//! more than an untimed step.

use serde::Serialize;
use std::time::Instant;

/// Milliseconds spent in each phase of the timed steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PhaseTimes {
    /// Building row numbers and bag offsets on the host.
    pub host: f64,
    /// Copying the batch to the device.
    pub upload: f64,
    /// Pooling the rows into per-field vectors.
    pub pool: f64,
    /// The model's forward pass.
    pub forward: f64,
    /// The loss, read back (and the logits, when kept).
    pub loss: f64,
    /// The BCE gradient and the model's backward pass.
    pub backward: f64,
    /// Entry gradients, the sort and the row updates.
    pub rows: f64,
    /// The dense optimizer and the finiteness flag, read back.
    pub dense: f64,
}

impl PhaseTimes {
    /// Every phase times `f` (per step: `1 / steps`).
    pub fn scaled(self, f: f64) -> PhaseTimes {
        let PhaseTimes { host, upload, pool, forward, loss, backward, rows, dense } = self;
        PhaseTimes {
            host: host * f,
            upload: upload * f,
            pool: pool * f,
            forward: forward * f,
            loss: loss * f,
            backward: backward * f,
            rows: rows * f,
            dense: dense * f,
        }
    }
}

#[derive(Clone, Copy)]
pub(super) enum Phase {
    Host,
    Upload,
    Pool,
    Forward,
    Loss,
    Backward,
    Rows,
    Dense,
}

/// Books the time between marks to phases.
#[derive(Default)]
pub(super) struct PhaseClock {
    last: Option<Instant>,
    pub(super) times: PhaseTimes,
}

impl PhaseClock {
    pub(super) fn start(&mut self) {
        self.last = Some(Instant::now());
    }

    pub(super) fn book(&mut self, phase: Phase) {
        let now = Instant::now();
        let ms = self.last.map_or(0.0, |t| (now - t).as_secs_f64() * 1e3);
        self.last = Some(now);
        let t = &mut self.times;
        *match phase {
            Phase::Host => &mut t.host,
            Phase::Upload => &mut t.upload,
            Phase::Pool => &mut t.pool,
            Phase::Forward => &mut t.forward,
            Phase::Loss => &mut t.loss,
            Phase::Backward => &mut t.backward,
            Phase::Rows => &mut t.rows,
            Phase::Dense => &mut t.dense,
        } += ms;
    }
}
