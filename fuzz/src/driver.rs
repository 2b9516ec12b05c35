//! The fuzzing loop: seeds first, then seeded mutants, each input run under
//! `catch_unwind` on a worker thread watched for hangs.
//!
//! A panic (an assertion of a target included) or an input that runs longer
//! than [`Budget::hang_after`] is a crash: the input is written to
//! `crash_dir/<target>-<hash>.bin` and reported with the panic message, and
//! the run stops (with `TIDEREC_FUZZ_BACKTRACE` set, the message carries
//! the panic's backtrace). An abort (a failed allocation) cannot be caught: the
//! input being run is always also in `crash_dir/<target>-in-flight.bin`,
//! removed when the run ends normally, so after an abort it names the input.
//! The loop is deterministic for a seed; only the number of
//! executions in a time-bounded run depends on the machine.

use crate::mutate::{mutate, Rng};
use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Once;
use std::time::{Duration, Instant};

/// How long a run may go on.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Stop after this many executions (seeds included).
    pub max_execs: u64,
    /// Stop after this much time.
    pub max_time: Duration,
    /// One input running longer than this is a hang.
    pub hang_after: Duration,
}

/// A crashing input.
#[derive(Clone, Debug)]
pub struct Crash {
    /// Where the input was written.
    pub path: PathBuf,
    /// The panic message and location, or the hang's duration.
    pub message: String,
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Inputs executed (seeds and mutants).
    pub execs: u64,
    /// Seeds in the corpus.
    pub seeds: usize,
    /// The crash that stopped the run, if any.
    pub crash: Option<Crash>,
    /// Time spent.
    pub elapsed: Duration,
}

thread_local! {
    /// Set on fuzzing worker threads: their panics are recorded here instead of printed.
    static PANIC: RefCell<Option<Option<String>>> = const { RefCell::new(None) };
}

/// Installs (once) a panic hook that records the panics of fuzzing workers
/// and leaves every other thread to the default hook.
fn install_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let handled = PANIC.with(|p| {
                let mut p = p.borrow_mut();
                match p.as_mut() {
                    Some(slot) => {
                        let what = info
                            .payload()
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| info.payload().downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "(non-string panic)".into());
                        let place = info.location().map(|l| l.to_string()).unwrap_or_default();
                        let mut message = format!("{what} at {place}");
                        if std::env::var_os("TIDEREC_FUZZ_BACKTRACE").is_some() {
                            message.push_str(&format!("\n{}", std::backtrace::Backtrace::force_capture()));
                        }
                        *slot = Some(message);
                        true
                    }
                    None => false,
                }
            });
            if !handled {
                default(info);
            }
        }));
    });
}

/// FNV-1a of `data`, naming crash files.
fn hash(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Writes a crashing input and describes it.
fn save(crash_dir: &Path, target: &str, data: &[u8], message: String) -> Crash {
    let path = crash_dir.join(format!("{target}-{:016x}.bin", hash(data)));
    let written = std::fs::create_dir_all(crash_dir).and_then(|_| std::fs::write(&path, data));
    let message = match written {
        Ok(()) => message,
        Err(e) => format!("{message} (and the input could not be written to {}: {e})", path.display()),
    };
    Crash { path, message }
}

/// Runs `target` on every seed, then on mutants of the seeds, until `budget`
/// is spent or an input crashes. `rng_seed` fixes the sequence of mutants.
pub fn run(
    name: &str,
    target: fn(&[u8]),
    seeds: Vec<Vec<u8>>,
    budget: Budget,
    rng_seed: u64,
    crash_dir: &Path,
) -> Report {
    install_hook();
    let (to_worker, inputs) = mpsc::channel::<Vec<u8>>();
    let (to_driver, results) = mpsc::channel::<Option<String>>();
    let worker = std::thread::Builder::new()
        .name(format!("fuzz-{name}"))
        .spawn(move || {
            PANIC.with(|p| *p.borrow_mut() = Some(None));
            for input in inputs {
                // A panic caught inside the target (and turned into an error there) leaves no message.
                PANIC.with(|p| *p.borrow_mut() = Some(None));
                let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| target(&input)));
                let message = match outcome {
                    Ok(()) => None,
                    Err(_) => Some(
                        PANIC
                            .with(|p| p.borrow_mut().as_mut().and_then(Option::take))
                            .unwrap_or_else(|| "panic".into()),
                    ),
                };
                if to_driver.send(message).is_err() {
                    break;
                }
            }
        })
        .expect("spawn a fuzzing thread");
    let _ = std::fs::create_dir_all(crash_dir);
    let in_flight = crash_dir.join(format!("{name}-in-flight.bin"));
    let start = Instant::now();
    let mut report = Report { seeds: seeds.len(), ..Report::default() };
    let mut rng = Rng::new(rng_seed);
    // Recent mutants that did not crash: mutating them again stacks changes.
    let mut recent: Vec<Vec<u8>> = Vec::new();
    let mut i = 0usize;
    while report.execs < budget.max_execs && start.elapsed() < budget.max_time {
        let input = if i < seeds.len() {
            seeds[i].clone()
        } else if seeds.is_empty() {
            mutate(&mut rng, &[], &seeds)
        } else if !recent.is_empty() && rng.one_in(4) {
            let base = recent[rng.below(recent.len())].clone();
            mutate(&mut rng, &base, &seeds)
        } else {
            let base = &seeds[rng.below(seeds.len())];
            mutate(&mut rng, base, &seeds)
        };
        i += 1;
        // An abort (a failed allocation) cannot be caught: the input in flight stays on disk.
        let _ = std::fs::write(&in_flight, &input);
        if to_worker.send(input.clone()).is_err() {
            report.crash = Some(save(crash_dir, name, &input, "the fuzzing thread died".into()));
            break;
        }
        report.execs += 1;
        match results.recv_timeout(budget.hang_after) {
            Ok(None) => {
                if i > seeds.len() {
                    if recent.len() < 64 {
                        recent.push(input);
                    } else {
                        let k = rng.below(recent.len());
                        recent[k] = input;
                    }
                }
            }
            Ok(Some(message)) => {
                report.crash = Some(save(crash_dir, name, &input, message));
                break;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let message = format!("hang: no result after {:?}", budget.hang_after);
                report.crash = Some(save(crash_dir, name, &input, message));
                let _ = std::fs::remove_file(&in_flight);
                // The worker is stuck in the target: leave it; the process exits without it.
                report.elapsed = start.elapsed();
                return report;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                report.crash = Some(save(crash_dir, name, &input, "the fuzzing thread died".into()));
                break;
            }
        }
    }
    drop(to_worker);
    let _ = worker.join();
    let _ = std::fs::remove_file(&in_flight);
    report.elapsed = start.elapsed();
    report
}

/// Runs `target` once on `data` under the same panic capture (replaying a crash file).
pub fn replay(target: fn(&[u8]), data: &[u8]) -> Result<(), String> {
    let budget = Budget { max_execs: 1, max_time: Duration::from_secs(3600), hang_after: Duration::from_secs(60) };
    let dir = std::env::temp_dir();
    let report = run("replay", target, vec![data.to_vec()], budget, 0, &dir);
    match report.crash {
        Some(c) => {
            let _ = std::fs::remove_file(&c.path);
            Err(c.message)
        }
        None => Ok(()),
    }
}
