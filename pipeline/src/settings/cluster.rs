//! Workers, devices and processes.

use super::range::ranged;
use clap::Args;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Where the run's workers are: threads, devices, processes.
#[derive(Clone, Debug, PartialEq, Args, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterSettings {
    /// Worker threads per process (default: one per core, at most 4).
    #[arg(long, required = false, value_name = "N", value_parser = workers::RANGE)]
    #[serde(deserialize_with = "workers::deserialize")]
    pub workers: usize,
    /// Compute device of each worker: cpu, cuda:N, or one entry per worker such as
    /// cuda:0,cpu (one entry applies to every worker). GPU workers run the model's forward and
    /// backward on the device; stores, exchange and optimizer stay on the host.
    #[arg(long, required = false, value_name = "cpu|cuda:N,…")]
    pub device: String,
    /// Processes in a cluster run.
    #[arg(long, required = false, value_name = "N", value_parser = processes::RANGE)]
    #[serde(deserialize_with = "processes::deserialize")]
    pub processes: usize,
    /// This process's index (0-based).
    #[arg(long, required = false, value_name = "I", value_parser = process::RANGE)]
    #[serde(deserialize_with = "process::deserialize")]
    pub process: usize,
    /// File listing one host:port per process.
    #[arg(long, value_name = "FILE")]
    pub hosts: Option<PathBuf>,
    /// Seconds to wait for the other processes to connect and agree at start-up.
    #[arg(long, required = false, value_name = "SECONDS", value_parser = connect_timeout::RANGE)]
    #[serde(deserialize_with = "connect_timeout::deserialize")]
    pub connect_timeout: f64,
}

// The ranges of the numeric settings above, one per setting.
ranged!(workers: usize, closed(1, MAX_THREADS));
ranged!(processes: usize, closed(1, MAX_THREADS));
ranged!(process: usize, closed(0, MAX_THREADS - 1));
ranged!(connect_timeout: f64, above(0.0, MAX_SECONDS));

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
