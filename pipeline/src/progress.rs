//! Progress of a long run: a bar on a terminal, plain periodic lines otherwise.
//!
//! The bar counts one [`Unit`]: training steps (synthetic data, where the
//! number of steps is known), samples (Parquet replay, where the rows are
//! known from the files' metadata) or input bytes (`tiderec convert`). With a
//! known total it shows an ETA.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// What the position and total of a [`Progress`] count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Training steps.
    Steps,
    /// Training samples.
    Samples,
    /// Input bytes.
    Bytes,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Steps => "steps",
            Unit::Samples => "samples",
            Unit::Bytes => "bytes",
        }
    }
}

pub use crate::settings::ProgressMode;

/// Reports progress on stderr.
pub enum Progress {
    /// An indicatif bar (terminal).
    Bar(ProgressBar, Unit),
    /// One line every few seconds (logs, CI).
    Lines {
        /// When the last line was printed.
        last: Instant,
        /// Time between lines.
        every: Duration,
        /// The total, when known (for the percentage).
        total: Option<u64>,
        /// What the position counts.
        unit: Unit,
    },
    /// Silent.
    None,
}

impl Progress {
    /// `total` is the number of steps when known.
    pub fn new(mode: ProgressMode, total: Option<u64>) -> Self {
        Self::with_unit(mode, total, Unit::Steps)
    }

    /// Like [`new`](Self::new), counting `unit`.
    pub fn with_unit(mode: ProgressMode, total: Option<u64>, unit: Unit) -> Self {
        let bar = match mode {
            ProgressMode::Bar => true,
            ProgressMode::Auto => std::io::stderr().is_terminal(),
            ProgressMode::None => return Progress::None,
            ProgressMode::Lines => false,
        };
        if bar {
            let pb = match total {
                Some(n) => ProgressBar::new(n),
                None => ProgressBar::new_spinner(),
            };
            pb.set_draw_target(ProgressDrawTarget::stderr_with_hz(5));
            let template = match (total.is_some(), unit) {
                (true, Unit::Bytes) => {
                    "{spinner} [{elapsed_precise}] {bar:30} {bytes}/{total_bytes} ({bytes_per_sec})  {msg}  eta {eta}"
                }
                (true, Unit::Steps) => "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} steps  {msg}  eta {eta}",
                (true, Unit::Samples) => "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} samples  {msg}  eta {eta}",
                (false, Unit::Bytes) => "{spinner} [{elapsed_precise}] {bytes}  {msg}",
                (false, Unit::Steps) => "{spinner} [{elapsed_precise}] {pos} steps  {msg}",
                (false, Unit::Samples) => "{spinner} [{elapsed_precise}] {pos} samples  {msg}",
            };
            pb.set_style(ProgressStyle::with_template(template).expect("valid template"));
            Progress::Bar(pb, unit)
        } else {
            Progress::Lines { last: Instant::now(), every: Duration::from_secs(2), total, unit }
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
        let mut msg = format!("loss {loss:.4}  {samples_per_sec:.0} samples/s  {bytes_per_sample:.0} B/sample");
        if bad > 0 {
            msg.push_str(&format!("  {bad} bad records"));
        }
        let (position, msg) = match self.unit() {
            Unit::Samples => (samples, format!("step {steps}  {msg}")),
            _ => (steps, format!("{samples} samples  {msg}")),
        };
        self.advance(position, &msg);
    }

    /// Sets the position (in the bar's unit) and the message.
    pub fn advance(&mut self, position: u64, msg: &str) {
        match self {
            Progress::Bar(pb, _) => {
                pb.set_position(position);
                pb.set_message(msg.to_string());
            }
            Progress::Lines { last, every, total, unit } => {
                if last.elapsed() >= *every {
                    *last = Instant::now();
                    match (total, *unit) {
                        (Some(t), Unit::Steps) => eprintln!("step {position}/{t}  {msg}"),
                        (None, Unit::Steps) => eprintln!("step {position}  {msg}"),
                        (Some(t), unit) => eprintln!("{position}/{t} {}  {msg}", unit.name()),
                        (None, unit) => eprintln!("{position} {}  {msg}", unit.name()),
                    }
                }
            }
            Progress::None => {}
        }
    }

    fn unit(&self) -> Unit {
        match self {
            Progress::Bar(_, unit) | Progress::Lines { unit, .. } => *unit,
            Progress::None => Unit::Steps,
        }
    }

    /// Prints a message without breaking the bar.
    pub fn println(&self, line: &str) {
        match self {
            Progress::Bar(pb, _) => pb.println(line),
            Progress::Lines { .. } => eprintln!("{line}"),
            Progress::None => {}
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Progress::Bar(pb, _) = self {
            pb.finish_and_clear();
        }
    }
}
