//! Running a benchmark as several processes on 127.0.0.1: the parent picks a
//! free port per process, writes a hosts file, starts this binary once per
//! process with the same arguments plus `--process I --hosts FILE`, and
//! returns what process 0 printed. Every process computes the same inputs
//! from the same settings (the benchmarks are deterministic), so only the
//! timely connection differs between them.
//!
//! Invariants: the parent never waits forever and never leaves a child behind.
//! A child that cannot be started, or that ends unsuccessfully (a process that
//! dies before it connects would leave the others waiting for it forever),
//! stops every other child at once and fails the run naming it; past the
//! deadline every child still running is stopped and the run fails naming
//! them. Each child's output is read while it runs, so no pipe fills up.

use std::ffi::OsString;
use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tiderec::error::DataflowFailure;
use tiderec::PipelineError;

/// A started child, its output read by threads of its own.
struct Running {
    child: Child,
    stdout: Option<JoinHandle<Vec<u8>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
}

impl Running {
    /// Kills the child (if it still runs) and reaps it.
    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Everything the child wrote to standard error (once it has ended).
    fn stderr(&mut self) -> String {
        let bytes = self.stderr.take().and_then(|h| h.join().ok()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).trim().to_string()
    }
}

/// A thread reading `pipe` to its end.
fn drain(pipe: Option<impl Read + Send + 'static>) -> Option<JoinHandle<Vec<u8>>> {
    let mut pipe = pipe?;
    Some(std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = pipe.read_to_end(&mut out);
        out
    }))
}

/// Starts `processes` copies of this binary with `args` (the benchmark's own
/// arguments, without `--process` / `--hosts`) connected on 127.0.0.1, waits
/// for all at most `timeout`, and returns process 0's standard output. A
/// process that fails, or a run past `timeout`, stops every process and fails
/// the run naming it with its exit status and standard error.
pub fn run_local(processes: usize, args: &[OsString], timeout: Duration) -> Result<Vec<u8>, PipelineError> {
    let exe = std::env::current_exe()
        .map_err(|e| PipelineError::dataflow(DataflowFailure::Start, "cannot find this binary").with_source(e))?;
    let ports = free_ports(processes)?;
    let dir = std::env::temp_dir().join(format!("tiderec-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| {
        PipelineError::dataflow(DataflowFailure::Output, format!("cannot create {}", dir.display())).with_source(e)
    })?;
    let hosts = dir.join("hosts.txt");
    let text: String = ports.iter().map(|p| format!("127.0.0.1:{p}\n")).collect();
    std::fs::write(&hosts, text).map_err(|e| {
        PipelineError::dataflow(DataflowFailure::Output, format!("cannot write {}", hosts.display())).with_source(e)
    })?;
    let mut children: Vec<Running> = Vec::with_capacity(processes);
    for i in 0..processes {
        let spawned = Command::new(&exe)
            .args(args)
            .arg("--process")
            .arg(i.to_string())
            .arg("--hosts")
            .arg(&hosts)
            .stdout(if i == 0 { Stdio::piped() } else { Stdio::null() })
            .stderr(Stdio::piped())
            .spawn();
        match spawned {
            Ok(mut child) => {
                let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
                children.push(Running { child, stdout, stderr });
            }
            Err(e) => {
                children.iter_mut().for_each(Running::stop);
                std::fs::remove_dir_all(&dir).ok();
                let what = format!("cannot start process {i} ({}); the processes started were stopped", exe.display());
                return Err(PipelineError::dataflow(DataflowFailure::Start, what).with_source(e));
            }
        }
    }
    let ended = wait_all(&mut children, timeout);
    children.iter_mut().for_each(Running::stop);
    std::fs::remove_dir_all(&dir).ok();
    ended?;
    // Timely's networking prints its connection retries on standard output; keep the report only.
    let out = children[0].stdout.take().and_then(|h| h.join().ok()).unwrap_or_default();
    let text = String::from_utf8_lossy(&out);
    Ok(text
        .lines()
        .filter(|l| !l.starts_with("awaiting connections"))
        .flat_map(|l| [l, "\n"])
        .collect::<String>()
        .into_bytes())
}

/// Waits until every child has ended successfully, the first one ends otherwise (an
/// error naming it), or `timeout` passes (an error naming those still running).
fn wait_all(children: &mut [Running], timeout: Duration) -> Result<(), PipelineError> {
    let deadline = Instant::now() + timeout;
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; children.len()];
    loop {
        for (i, r) in children.iter_mut().enumerate() {
            if statuses[i].is_some() {
                continue;
            }
            let status = r.child.try_wait().map_err(|e| {
                PipelineError::dataflow(DataflowFailure::Panicked, format!("cannot wait for process {i}"))
                    .with_source(e)
            })?;
            match status {
                Some(s) if !s.success() => {
                    let why = format!("process {i} ({s}): {}; the other processes were stopped", r.stderr());
                    return Err(PipelineError::dataflow(DataflowFailure::PeerFailed, why));
                }
                other => statuses[i] = other,
            }
        }
        if statuses.iter().all(Option::is_some) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let running: Vec<String> =
                statuses.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(i, _)| format!("process {i}")).collect();
            let why = format!(
                "{} still running after {} s (--timeout): stopped; a process that never connects leaves the others \
                 waiting",
                running.join(", "),
                timeout.as_secs_f64()
            );
            return Err(PipelineError::dataflow(DataflowFailure::Incomplete, why));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `n` ports free on 127.0.0.1 right now (all held until every one is chosen, so they differ).
fn free_ports(n: usize) -> Result<Vec<u16>, PipelineError> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(|e| PipelineError::dataflow(DataflowFailure::Start, "no free port on 127.0.0.1").with_source(e))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(|e| PipelineError::dataflow(DataflowFailure::Start, "no free port on 127.0.0.1").with_source(e))
}
