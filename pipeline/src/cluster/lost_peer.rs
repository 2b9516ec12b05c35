//! Recognising a lost process among timely's panics.
//!
//! Timely (0.32) reports a dropped connection by panicking: the receive or
//! send thread of the connection to process `p` (named `timely:recv-p` /
//! `timely:send-p`) panics with `timely communication error: …`, which
//! poisons the queues it shares with the workers, which then panic with
//! `MergeQueue poisoned.`, and joining the communication threads panics once
//! more (`Recv thread panic`). No thread waits forever, but none of the
//! messages names the process.
//!
//! [`install`] wraps the panic hook: the first communication-thread panic is
//! recorded as the lost process (and not printed) unless one is recorded
//! already ([`record`]: the heartbeats found a silent process), and once one is recorded
//! the cascade that follows on timely's threads is not printed either; every
//! other panic goes to the previous hook unchanged. The run then turns the
//! record into one error ([`lost`]).

use std::sync::{Mutex, OnceLock};

/// A process whose connection broke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lost {
    /// Its index.
    pub process: usize,
    /// What happened, as a clause (`its connection broke (timely communication error: …)`).
    pub cause: String,
}

static LOST: Mutex<Option<Lost>> = Mutex::new(None);
static INSTALLED: OnceLock<()> = OnceLock::new();

/// Panic messages of the cascade that follows a broken connection.
const CASCADE: &[&str] = &[
    "MergeQueue poisoned",
    "MergeQueue mutex poisoned",
    "Send thread panic",
    "Recv thread panic",
    "Worker panic",
    "Failed to receive MergeQueue",
    "failed to send MergeQueue",
    "timely communication error",
];

/// Installs the hook (once per process).
pub fn install() {
    INSTALLED.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = payload(info.payload());
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("");
            let remote = name.strip_prefix("timely:recv-").or_else(|| name.strip_prefix("timely:send-"));
            if let (Some(remote), true) = (remote, message.starts_with("timely communication error")) {
                if let Ok(process) = remote.parse() {
                    record(Lost { process, cause: format!("its connection broke ({message})") });
                    return;
                }
            }
            let recorded = LOST.lock().map(|l| l.is_some()).unwrap_or(true);
            if recorded && (name.starts_with("timely:") || CASCADE.iter().any(|c| message.contains(c))) {
                return;
            }
            previous(info);
        }));
    });
}

/// Records `lost` unless a lost process is recorded already.
pub fn record(lost: Lost) {
    LOST.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(lost);
}

/// The lost process, if a connection broke.
pub fn lost() -> Option<Lost> {
    LOST.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// A panic payload as text.
pub fn payload(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".into()
    }
}
