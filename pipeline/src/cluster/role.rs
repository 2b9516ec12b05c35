//! One process's place in a cluster run, and the timely configuration of its
//! workers. A single process (`processes == 1`) has no addresses and runs its
//! workers as threads (or on the calling thread for one worker).

use crate::PipelineError;

/// Where one process of a run stands among the processes of a cluster.
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
