//! Running a benchmark as several processes on 127.0.0.1: the parent picks a
//! free port per process, writes a hosts file, starts this binary once per
//! process with the same arguments plus `--process I --hosts FILE`, and
//! returns what process 0 printed. Every process computes the same inputs
//! from the same settings (the benchmarks are deterministic), so only the
//! timely connection differs between them.

use crate::PipelineError;
use std::ffi::OsString;
use std::net::TcpListener;
use std::process::{Command, Stdio};

/// Where one process of a multi-process benchmark stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessRole {
    /// This process's index.
    pub process: usize,
    /// Processes in all (1: everything in this process).
    pub processes: usize,
    /// `host:port` of every process, in process order (empty for one process).
    pub addresses: Vec<String>,
}

impl ProcessRole {
    /// The timely configuration of `threads` workers in this process.
    pub fn timely_config(&self, threads: usize) -> timely::Config {
        let communication = if self.processes > 1 {
            timely::CommunicationConfig::Cluster {
                threads,
                process: self.process,
                addresses: self.addresses.clone(),
                report: false,
                zerocopy: false,
            }
        } else if threads > 1 {
            timely::CommunicationConfig::Process(threads)
        } else {
            timely::CommunicationConfig::Thread
        };
        timely::Config { communication, worker: timely::WorkerConfig::default() }
    }

    /// Reads a hosts file (one `host:port` per line) for process `process` of `processes`.
    pub fn from_hosts(process: usize, processes: usize, hosts: &std::path::Path) -> Result<Self, PipelineError> {
        let text = std::fs::read_to_string(hosts)
            .map_err(|e| PipelineError::config("hosts", format!("{}: {e}", hosts.display())))?;
        let addresses: Vec<String> = text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
        if addresses.len() != processes {
            return Err(PipelineError::config(
                "hosts",
                format!("{} lists {} hosts for {processes} processes", hosts.display(), addresses.len()),
            ));
        }
        if process >= processes {
            return Err(PipelineError::config("process", format!("{process} is not below --processes {processes}")));
        }
        Ok(ProcessRole { process, processes, addresses })
    }
}

/// Starts `processes` copies of this binary with `args` (the benchmark's own
/// arguments, without `--process` / `--hosts`) connected on 127.0.0.1, waits
/// for all, and returns process 0's standard output. A process that fails
/// fails the run with its exit status and standard error.
pub fn run_local(processes: usize, args: &[OsString]) -> Result<Vec<u8>, PipelineError> {
    let exe = std::env::current_exe().map_err(|e| PipelineError::Dataflow(format!("cannot find this binary: {e}")))?;
    let ports = free_ports(processes)?;
    let dir = std::env::temp_dir().join(format!("tiderec-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| PipelineError::Dataflow(format!("{}: {e}", dir.display())))?;
    let hosts = dir.join("hosts.txt");
    let text: String = ports.iter().map(|p| format!("127.0.0.1:{p}\n")).collect();
    std::fs::write(&hosts, text).map_err(|e| PipelineError::Dataflow(format!("{}: {e}", hosts.display())))?;
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
            .map_err(|e| PipelineError::Dataflow(format!("cannot start process {i} ({}): {e}", exe.display())))?;
        children.push(child);
    }
    let mut first = Vec::new();
    let mut failures = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().map_err(|e| PipelineError::Dataflow(format!("process {i}: {e}")))?;
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
        Err(PipelineError::Dataflow(failures.join("; ")))
    }
}

/// `n` ports free on 127.0.0.1 right now (all held until every one is chosen, so they differ).
fn free_ports(n: usize) -> Result<Vec<u16>, PipelineError> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(|e| PipelineError::Dataflow(format!("no free port on 127.0.0.1: {e}")))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(|e| PipelineError::Dataflow(e.to_string()))
}
