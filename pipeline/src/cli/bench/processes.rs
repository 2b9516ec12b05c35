//! Running a benchmark as several processes on 127.0.0.1: the parent picks a
//! free port per process, writes a hosts file, starts this binary once per
//! process with the same arguments plus `--process I --hosts FILE`, and
//! returns what process 0 printed. Every process computes the same inputs
//! from the same settings (the benchmarks are deterministic), so only the
//! timely connection differs between them.

use std::ffi::OsString;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use tiderec::error::DataflowFailure;
use tiderec::PipelineError;

/// Starts `processes` copies of this binary with `args` (the benchmark's own
/// arguments, without `--process` / `--hosts`) connected on 127.0.0.1, waits
/// for all, and returns process 0's standard output. A process that fails
/// fails the run with its exit status and standard error.
pub fn run_local(processes: usize, args: &[OsString]) -> Result<Vec<u8>, PipelineError> {
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
    let mut children = Vec::with_capacity(processes);
    for i in 0..processes {
        let child = Command::new(&exe)
            .args(args)
            .arg("--process")
            .arg(i.to_string())
            .arg("--hosts")
            .arg(&hosts)
            .stdout(if i == 0 { Stdio::piped() } else { Stdio::null() })
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                PipelineError::dataflow(DataflowFailure::Start, format!("cannot start process {i} ({})", exe.display()))
                    .with_source(e)
            })?;
        children.push(child);
    }
    let mut first = Vec::new();
    let mut failures = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let out = child
            .wait_with_output()
            .map_err(|e| PipelineError::dataflow(DataflowFailure::Panicked, format!("process {i}")).with_source(e))?;
        if !out.status.success() {
            failures.push(format!("process {i} ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
        }
        if i == 0 {
            // Timely's networking prints its connection retries on standard output; keep the report only.
            let text = String::from_utf8_lossy(&out.stdout);
            first = text
                .lines()
                .filter(|l| !l.starts_with("awaiting connections"))
                .flat_map(|l| [l, "\n"])
                .collect::<String>()
                .into_bytes();
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    if failures.is_empty() {
        Ok(first)
    } else {
        Err(PipelineError::dataflow(DataflowFailure::PeerFailed, failures.join("; ")))
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
