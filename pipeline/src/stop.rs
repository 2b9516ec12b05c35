//! SIGINT and SIGTERM: a clean stop first, an immediate one on the second signal.
//!
//! [`stop_flag`] installs the handlers once per process and returns the flag
//! they set. `train`, `convert` and `online` read it between steps:
//!
//! * the first signal sets the flag; the run finishes the step it is in,
//!   writes its checkpoint (when checkpointing is on) and its metrics, and
//!   exits 0;
//! * a signal that arrives while the flag is set ends the process at once
//!   with status 130, writing nothing more.
//!
//! Workers of a training run agree on the step to stop after: each worker's
//! step command carries the flag as read when it was sent, and every worker
//! gets the same count back in the step's statistics
//! ([`StepStats::stop_requests`](tiderec_operators::train::StepStats::stop_requests)),
//! so all workers of all processes stop after the same step, with no extra
//! round of messages.

use crate::error::DataflowFailure;
use crate::PipelineError;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// Exit status of the immediate stop (a second signal).
pub const SECOND_SIGNAL_EXIT: i32 = 130;

static FLAG: Mutex<Option<Arc<AtomicBool>>> = Mutex::new(None);

/// The process's stop flag, installing the SIGINT/SIGTERM handlers on first use.
pub fn stop_flag() -> Result<Arc<AtomicBool>, PipelineError> {
    let mut slot = FLAG.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(flag) = slot.as_ref() {
        return Ok(flag.clone());
    }
    let flag = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Registered first, so it sees the flag as it was before this signal.
        signal_hook::flag::register_conditional_shutdown(signal, SECOND_SIGNAL_EXIT, flag.clone())
            .and_then(|_| signal_hook::flag::register(signal, flag.clone()))
            .map_err(|e| {
                PipelineError::dataflow(DataflowFailure::Thread, "cannot install the signal handler").with_source(e)
            })?;
    }
    *slot = Some(flag.clone());
    Ok(flag)
}
