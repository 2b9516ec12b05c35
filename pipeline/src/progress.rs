//! Progress of a long run: a bar on a terminal, plain periodic lines otherwise.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Reports training progress on stderr.
pub enum Progress {
    /// An indicatif bar (terminal).
    Bar(ProgressBar),
    /// One line every few seconds (logs, CI).
    Lines { last: Instant, every: Duration, total: Option<u64> },
    /// Silent.
    None,
}

impl Progress {
    /// `mode` is `auto`, `bar`, `lines` or `none`; `total` is the number of steps when known.
    pub fn new(mode: &str, total: Option<u64>) -> Self {
        let bar = match mode {
            "bar" => true,
            "auto" => std::io::stderr().is_terminal(),
            "none" => return Progress::None,
            _ => false,
        };
        if bar {
            let pb = match total {
                Some(n) => ProgressBar::new(n),
                None => ProgressBar::new_spinner(),
            };
            pb.set_draw_target(ProgressDrawTarget::stderr_with_hz(5));
            let template = if total.is_some() {
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} steps  {msg}  eta {eta}"
            } else {
                "{spinner} [{elapsed_precise}] {pos} steps  {msg}"
            };
            pb.set_style(ProgressStyle::with_template(template).expect("valid template"));
            Progress::Bar(pb)
        } else {
            Progress::Lines { last: Instant::now(), every: Duration::from_secs(2), total }
        }
    }

    /// Reports that `steps` steps are done, with the running loss, throughput,
    /// bytes exchanged per sample and bad records so far.
    pub fn update(
        &mut self,
        steps: u64,
        samples: u64,
        loss: f64,
        samples_per_sec: f64,
        bytes_per_sample: f64,
        bad: u64,
    ) {
        let mut msg = format!(
            "loss {loss:.4}  {samples} samples  {samples_per_sec:.0} samples/s  {bytes_per_sample:.0} B/sample"
        );
        if bad > 0 {
            msg.push_str(&format!("  {bad} bad records"));
        }
        match self {
            Progress::Bar(pb) => {
                pb.set_position(steps);
                pb.set_message(msg);
            }
            Progress::Lines { last, every, total } => {
                if last.elapsed() >= *every {
                    *last = Instant::now();
                    match total {
                        Some(t) => eprintln!("step {steps}/{t}  {msg}"),
                        None => eprintln!("step {steps}  {msg}"),
                    }
                }
            }
            Progress::None => {}
        }
    }

    /// Prints a message without breaking the bar.
    pub fn println(&self, line: &str) {
        match self {
            Progress::Bar(pb) => pb.println(line),
            Progress::Lines { .. } => eprintln!("{line}"),
            Progress::None => {}
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Progress::Bar(pb) = self {
            pb.finish_and_clear();
        }
    }
}
