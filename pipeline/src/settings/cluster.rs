//! Workers, devices and processes.

use clap::Args;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Where the run's workers are: threads, devices, processes.
#[derive(Clone, Debug, PartialEq, Args, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterSettings {
    /// Worker threads per process (default: one per core, at most 4).
    #[arg(long, required = false, value_name = "N")]
    pub workers: usize,
    /// Compute device of each worker: cpu, cuda:N, or one entry per worker such as
    /// cuda:0,cpu (one entry applies to every worker). GPU workers run the model's forward and
    /// backward on the device; stores, exchange and optimizer stay on the host.
    #[arg(long, required = false, value_name = "DEVICE")]
    pub device: String,
    /// Processes in a cluster run.
    #[arg(long, required = false, value_name = "N")]
    pub processes: usize,
    /// This process's index (0-based).
    #[arg(long, required = false, value_name = "I")]
    pub process: usize,
    /// File listing one host:port per process.
    #[arg(long, value_name = "FILE")]
    pub hosts: Option<PathBuf>,
    /// Seconds to wait for the other processes to connect and agree at start-up.
    #[arg(long, required = false, value_name = "SECS")]
    pub connect_timeout: f64,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            workers: default_workers(),
            device: "cpu".into(),
            processes: 1,
            process: 0,
            hosts: None,
            connect_timeout: 60.0,
        }
    }
}

/// One worker per available core, at most 4.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(4)
}
