//! `device`: where each worker of this process computes its model.
//!
//! The setting is `cpu` (the default) or a comma-separated list of `cpu` and
//! `cuda:N` entries. One entry applies to every worker of the process;
//! otherwise the list has exactly one entry per worker, and worker `i` of the
//! process takes entry `i` (`cuda:0,cpu`: worker 0 on GPU 0, worker 1 on the
//! CPU). Several workers may name the same GPU.
//!
//! A GPU worker that trains alone (one worker in all, a built-in model, the
//! fixed store, SGD or row-wise Adagrad rows, no L2 penalty) keeps
//! everything on its device: rows, pooling, the
//! model and both optimizers (`tiderec_gpu::resident`, as the trainer's step
//! engine); the host mirrors its state for reports and checkpoints
//! (`TIDEREC_GPU_ROWS=host` keeps its rows on the host instead, as a baseline;
//! `TIDEREC_GPU_HOT_ROWS=one-warp` sums a hot row's duplicates on one warp
//! instead of splitting the run, another baseline; each training step is
//! replayed as a CUDA graph unless `TIDEREC_GPU_GRAPHS=off`).
//! Any other GPU worker runs its
//! model's forward and backward on the device (see `tiderec_gpu::model`) and,
//! under the `rows` exchange and SGD or row-wise Adagrad rows, keeps the rows
//! it owns there too: all of them under the fixed store
//! (`tiderec_gpu::device_shard`), the hot tier under the tiered store, whose
//! plan and cold tier stay on the host (`tiderec_gpu::device_hot_tier`);
//! served and updated on the device (`TIDEREC_GPU_ROWS=host` keeps them on
//! the host). Everything else — the pooling, the exchange, the dense optimizer,
//! checkpoints — stays on the host and is the same for every worker, so a CPU
//! and a GPU worker train one model together. Under the DES partial exchange
//! a GPU worker's model runs its partial form on the device (the home's
//! forward and backward from the summed partial results) and its rows stay on
//! the host, where the owners compute their shares.
//! Every CUDA device named is opened, and the model built on it, before any
//! worker starts ([`Devices::preflight`]): a machine without a driver, a
//! missing device or a model without a device form fails at once with the
//! device and the reason.

use crate::PipelineError;
use std::fmt;
use tiderec_gpu::device_hot_tier::{self, device_tiered_store};
use tiderec_gpu::device_shard::DeviceShard;
use tiderec_gpu::sparse::HotRows;
use tiderec_gpu::Device;
use tiderec_operators::nn::{Model, Precision};
use tiderec_operators::store::DeviceStore;
use tiderec_operators::train::{Trainer, TrainerConfig};
use timely::worker::Worker;

/// One worker's compute device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerDevice {
    /// The host's cores.
    Cpu,
    /// CUDA device `N`.
    Cuda(usize),
}

impl fmt::Display for WorkerDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerDevice::Cpu => write!(f, "cpu"),
            WorkerDevice::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// The parsed `device` setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Devices {
    list: Vec<WorkerDevice>,
    /// A GPU worker that trains alone keeps its rows on the host too.
    host_rows: bool,
    /// How a device-resident worker sums a hot row's duplicates.
    hot_rows: HotRows,
    /// A device-resident worker replays its training steps as CUDA graphs.
    graphs: bool,
    /// `TIDEREC_HOST_THREADS` (`None`: `auto`, see [`Devices::host_threads`]).
    host_threads: Option<usize>,
}

impl Devices {
    /// Parses `cpu`, `cuda:N` or a comma-separated list of them; errors name the key `device`.
    pub fn parse(s: &str) -> Result<Self, PipelineError> {
        let entry = |e: &str| match e.trim() {
            "cpu" => Ok(WorkerDevice::Cpu),
            other => {
                other.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()).map(WorkerDevice::Cuda).ok_or_else(
                    || PipelineError::config("device", format!("`{other}` is not cpu or cuda:N (N a device number)")),
                )
            }
        };
        let list = s.split(',').map(entry).collect::<Result<Vec<_>, _>>()?;
        Ok(Devices {
            list,
            host_rows: rows_on_host()?,
            hot_rows: hot_rows()?,
            graphs: graphs()?,
            host_threads: host_threads_env()?,
        })
    }

    /// Parses the setting and checks it against this process's `workers`.
    pub fn for_workers(s: &str, workers: usize) -> Result<Self, PipelineError> {
        let d = Devices::parse(s)?;
        if d.list.len() != 1 && d.list.len() != workers {
            return Err(PipelineError::config(
                "device",
                format!(
                    "{} entries for {workers} workers: give one device for every worker, or one entry for all",
                    d.list.len()
                ),
            ));
        }
        Ok(d)
    }

    /// The device of local worker `i` (the one entry, or entry `i`).
    pub fn worker(&self, i: usize) -> WorkerDevice {
        if self.list.len() == 1 {
            self.list[0]
        } else {
            self.list[i]
        }
    }

    /// Every GPU worker keeps its rows on the host: one that trains alone also its
    /// pooling and optimizers, one among several the rows it owns (a baseline for
    /// benchmarks, as `TIDEREC_GPU_ROWS=host`).
    pub fn keep_rows_on_host(mut self) -> Self {
        self.host_rows = true;
        self
    }

    /// The threads local worker `i` of a process's `workers` plans its lookups, pools
    /// its bags and sums its rows' gradients on: `TIDEREC_HOST_THREADS`, or else its
    /// share of the cores for a GPU worker (its model runs on the device, so the
    /// host's work is its step's) and one for a CPU worker (whose step is mostly
    /// its model's products: spreading the rest cost it 2–3% on two cores).
    pub fn host_threads(&self, i: usize, workers: usize) -> usize {
        match (self.host_threads, self.worker(i)) {
            (Some(n), _) => n,
            (None, WorkerDevice::Cpu) => 1,
            (None, WorkerDevice::Cuda(_)) => cores_per_worker(workers),
        }
    }

    /// Whether the GPU workers of a trainer of `workers` workers among several
    /// keep the rows they own on their devices under `config` (all of them, or
    /// the tiered store's hot tier).
    pub fn owned_rows_on_device(&self, config: &TrainerConfig, workers: usize) -> bool {
        self.any_cuda() && !self.host_rows && rows_fit_the_device(config, workers)
    }

    /// Whether any worker computes on a GPU.
    pub fn any_cuda(&self) -> bool {
        self.list.iter().any(|d| *d != WorkerDevice::Cpu)
    }

    /// Whether any worker computes on the CPU.
    pub fn any_cpu(&self) -> bool {
        self.list.contains(&WorkerDevice::Cpu)
    }

    /// Opens every CUDA device named and builds the model on it once, so a
    /// missing driver or device, or a model without a device form, fails
    /// before any worker starts.
    pub fn preflight(&self, config: &TrainerConfig) -> Result<(), PipelineError> {
        let mut seen = Vec::new();
        for &d in &self.list {
            if let WorkerDevice::Cuda(n) = d {
                if !seen.contains(&n) {
                    seen.push(n);
                    build_on(n, config, Precision::Fp32)?;
                }
            }
        }
        Ok(())
    }

    /// Builds this worker's trainer with its model on its device, its MLP
    /// products in `precision` (a CPU model's MLPs; every GEMM of a GPU
    /// worker, see `tiderec_gpu::Device::with_precision`), planning and pooling
    /// its batches on [`host_threads`](Self::host_threads).
    ///
    /// Should the device model fail here after a successful [`preflight`](Self::preflight),
    /// the worker still joins the dataflow with a host model and fails its
    /// first step, so that its peers stop instead of waiting for it.
    pub fn trainer(
        &self,
        worker: &mut Worker,
        config: &TrainerConfig,
        workers: usize,
        precision: Precision,
    ) -> Result<Trainer, PipelineError> {
        let mut trainer = self.trainer_on_device(worker, config, workers, precision)?;
        trainer.set_host_threads(self.host_threads(worker.index() % workers, workers));
        Ok(trainer)
    }

    fn trainer_on_device(
        &self,
        worker: &mut Worker,
        config: &TrainerConfig,
        workers: usize,
        precision: Precision,
    ) -> Result<Trainer, PipelineError> {
        match self.worker(worker.index() % workers) {
            WorkerDevice::Cpu if precision == Precision::Fp32 => Ok(Trainer::new(worker, config)?),
            WorkerDevice::Cpu => {
                let mut model = config.model.build::<f32>(config.seed)?;
                model.set_precision(precision)?;
                Ok(Trainer::with_model(worker, config, model)?)
            }
            WorkerDevice::Cuda(n) if worker.peers() == 1 && !self.host_rows && resident_eligible(config) => {
                let engine = Device::open(n)
                    .and_then(|dev| dev.with_precision(precision))
                    .and_then(|dev| tiderec_gpu::resident::ResidentWorker::new(&dev, config))
                    .and_then(|mut engine| engine.set_hot_rows(self.hot_rows).map(|()| engine))
                    .map_err(|e| PipelineError::config("device", format!("cuda:{n}: {e}")))?;
                let mut engine = engine;
                engine.set_graphs(self.graphs);
                let mirror = config.model.build::<f32>(config.seed)?;
                Ok(Trainer::with_engine(worker, config, mirror, Box::new(engine))?)
            }
            // A failure is this worker's error alone, not a failed step: the other workers
            // are in the restore's collective by now. Its process ends with it (see
            // `cluster::failure`).
            WorkerDevice::Cuda(n) => match self.among_several(n, worker, config, precision)? {
                (model, Some(rows)) => Ok(Trainer::with_model_and_store(worker, config, model, rows)?),
                (model, None) => Ok(Trainer::with_model(worker, config, model)?),
            },
        }
    }

    /// A GPU worker among several (or one whose configuration the device-resident
    /// worker does not train): its model on device `n` and, unless `TIDEREC_GPU_ROWS=host`
    /// or the configuration keeps them on the host ([`owned_rows`]), the
    /// rows it owns on the same device.
    fn among_several(
        &self,
        n: usize,
        worker: &Worker,
        config: &TrainerConfig,
        precision: Precision,
    ) -> Result<GpuParts, PipelineError> {
        let device = WorkerDevice::Cuda(n);
        let named = |e: tiderec_gpu::GpuError| PipelineError::config("device", format!("{device}: {e}"));
        let dev = Device::open(n).and_then(|d| d.with_precision(precision)).map_err(named)?;
        let model = tiderec_gpu::model::build(&config.model, config.seed, &dev).map_err(named)?;
        let (me, peers) = (worker.index(), worker.peers());
        if self.host_rows {
            return Ok((model, None));
        }
        let rows = owned_rows(&dev, config, (me, peers)).map_err(named)?;
        Ok((model, rows))
    }
}

/// Whether a GPU worker among `workers` keeps rows it owns on its device under `config`.
fn rows_fit_the_device(config: &TrainerConfig, workers: usize) -> bool {
    DeviceShard::supports(config, workers).is_ok() || device_hot_tier::supports(config).is_ok()
}

/// The store of the rows worker `me` of `peers` owns on `dev`: every row
/// ([`DeviceShard`]) under the fixed store, the hot tier
/// ([`device_tiered_store`]) under the tiered store; `None` where `config`
/// keeps them on the host (another store, another exchange, another row optimizer).
fn owned_rows(
    dev: &Device,
    config: &TrainerConfig,
    (me, peers): (usize, usize),
) -> Result<Option<Box<dyn DeviceStore>>, tiderec_gpu::GpuError> {
    if DeviceShard::supports(config, peers).is_ok() {
        return Ok(Some(Box::new(DeviceShard::new(dev, config, (me, peers))?)));
    }
    if device_hot_tier::supports(config).is_ok() {
        return Ok(Some(Box::new(device_tiered_store(dev, config, (me, peers))?)));
    }
    Ok(None)
}

/// A GPU worker's model on its device, and the rows it owns there when they are.
type GpuParts = (Box<dyn Model<f32>>, Option<Box<dyn DeviceStore>>);

/// The environment variable that says where a GPU worker keeps its rows:
/// `device` (the default: one training alone keeps everything on its device,
/// one among several the rows it owns) or `host` (rows, pooling and row
/// updates on the host; a baseline).
pub const GPU_ROWS_ENV: &str = "TIDEREC_GPU_ROWS";

/// Whether `TIDEREC_GPU_ROWS` asks for rows on the host; any value but
/// `device` and `host` is an error naming the variable.
fn rows_on_host() -> Result<bool, PipelineError> {
    env_choice(GPU_ROWS_ENV, &[("device", false), ("host", true)])
}

/// The environment variable that says how a device-resident worker's row
/// update sums a hot row's duplicates: `split` (the default: whole chunks of
/// the run summed in parallel, then their sums in order) or `one-warp` (every
/// run summed in entry order by one warp; a baseline).
pub const GPU_HOT_ROWS_ENV: &str = "TIDEREC_GPU_HOT_ROWS";

/// The hot-row setting `TIDEREC_GPU_HOT_ROWS` asks for; any value but `split`
/// and `one-warp` is an error naming the variable.
pub fn hot_rows() -> Result<HotRows, PipelineError> {
    env_choice(GPU_HOT_ROWS_ENV, &[("split", HotRows::default()), ("one-warp", HotRows::OneWarp)])
}

/// The environment variable that says whether a device-resident worker runs
/// each training step as a CUDA graph: `on` (the default: captured once per
/// batch shape, then replayed; the same steps bit for bit, and faster where the
/// host's launching bounds a step) or `off` (the step's kernels launched one by
/// one, a baseline).
pub const GPU_GRAPHS_ENV: &str = "TIDEREC_GPU_GRAPHS";

/// Whether `TIDEREC_GPU_GRAPHS` asks for CUDA graphs (on when it is not set);
/// any value but `on` and `off` is an error naming the variable.
pub fn graphs() -> Result<bool, PipelineError> {
    env_choice(GPU_GRAPHS_ENV, &[("on", true), ("off", false)])
}

/// The environment variable that sets the threads each worker plans its lookups,
/// pools its bags and sums its rows' gradients on: `auto` (the default: a GPU
/// worker's share of the cores, [`cores_per_worker`], and one for a CPU worker) or a
/// number of threads for every worker (1: none but its own; a baseline). Results do
/// not depend on it.
pub const HOST_THREADS_ENV: &str = "TIDEREC_HOST_THREADS";

/// The threads `TIDEREC_HOST_THREADS` asks for (`None`: `auto`); anything but
/// `auto` and a whole number from 1 to 1,024 is an error naming the variable.
pub fn host_threads_env() -> Result<Option<usize>, PipelineError> {
    match std::env::var(HOST_THREADS_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(v) if v == "auto" => Ok(None),
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(Some(n)),
            _ => Err(PipelineError::config(
                HOST_THREADS_ENV,
                format!("`{v}` is not auto or a number of threads from 1 to 1024"),
            )),
        },
        Err(e) => Err(PipelineError::config(HOST_THREADS_ENV, e.to_string())),
    }
}

/// The value of the environment variable `var` among `choices` (name, value):
/// the first one's when `var` is not set; any other name is an error naming
/// the variable and the names it takes.
fn env_choice<T: Copy>(var: &str, choices: &[(&str, T)]) -> Result<T, PipelineError> {
    match std::env::var(var) {
        Err(std::env::VarError::NotPresent) => Ok(choices[0].1),
        Ok(v) => choices.iter().find(|(name, _)| *name == v).map(|&(_, value)| value).ok_or_else(|| {
            let names: Vec<&str> = choices.iter().map(|&(name, _)| name).collect();
            PipelineError::config(var, format!("`{v}` is not {}", names.join(" or ")))
        }),
        Err(e) => Err(PipelineError::config(var, e.to_string())),
    }
}

/// Whether a GPU worker that trains alone can keep everything on its device
/// (`tiderec_gpu::resident`): a configuration that path trains.
fn resident_eligible(config: &TrainerConfig) -> bool {
    tiderec_gpu::resident::ResidentWorker::supports(config).is_ok()
}

/// Opens CUDA device `n` with its GEMMs in `precision` and builds `config`'s model on it.
fn build_on(n: usize, config: &TrainerConfig, precision: Precision) -> Result<Box<dyn Model<f32>>, PipelineError> {
    let device = WorkerDevice::Cuda(n);
    let dev = Device::open(n)
        .and_then(|d| d.with_precision(precision))
        .map_err(|e| PipelineError::config("device", format!("{device}: {e}")))?;
    tiderec_gpu::model::build(&config.model, config.seed, &dev)
        .map_err(|e| PipelineError::config("device", format!("{device}: {e}")))
}

/// This machine's share of the cores for each of a process's `workers` workers, at
/// least 1 (the worker's own): what a worker may spread its host work over while
/// its core, or its GPU, would otherwise wait.
pub fn cores_per_worker(workers: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / workers.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU worker spreads its host work over its share of the cores, a CPU worker
    /// keeps it on its thread, unless `TIDEREC_HOST_THREADS` sets every worker's.
    #[test]
    fn gpu_workers_take_their_share_of_the_cores_and_cpu_workers_one() {
        let set = host_threads_env().unwrap();
        let d = Devices::parse("cuda:0,cpu").unwrap();
        assert_eq!(d.host_threads(0, 2), set.unwrap_or(cores_per_worker(2)));
        assert_eq!(d.host_threads(1, 2), set.unwrap_or(1));
        assert_eq!(Devices::parse("cuda:1").unwrap().host_threads(0, 1), set.unwrap_or(cores_per_worker(1)));
        assert!(cores_per_worker(1) >= cores_per_worker(2) && cores_per_worker(1_000_000) == 1);
    }

    #[test]
    fn parses_lists_and_names_the_key() {
        assert_eq!(Devices::parse("cpu").unwrap().list, [WorkerDevice::Cpu]);
        assert_eq!(
            Devices::parse("cuda:0, cpu,cuda:3").unwrap().list,
            [WorkerDevice::Cuda(0), WorkerDevice::Cpu, WorkerDevice::Cuda(3)]
        );
        for bad in ["gpu", "cuda:", "cuda:x", "", "cpu,,cpu", "cuda:-1"] {
            let e = Devices::parse(bad).unwrap_err().to_string();
            assert!(e.contains("`device`"), "{bad}: {e}");
        }
    }

    #[test]
    fn one_entry_serves_every_worker_else_one_per_worker() {
        let one = Devices::for_workers("cuda:1", 4).unwrap();
        assert!((0..4).all(|i| one.worker(i) == WorkerDevice::Cuda(1)));
        let two = Devices::for_workers("cuda:0,cpu", 2).unwrap();
        assert_eq!((two.worker(0), two.worker(1)), (WorkerDevice::Cuda(0), WorkerDevice::Cpu));
        assert!(two.any_cuda() && !Devices::parse("cpu").unwrap().any_cuda());
        let e = Devices::for_workers("cuda:0,cpu", 3).unwrap_err().to_string();
        assert!(e.contains("`device`") && e.contains("2 entries for 3 workers"), "{e}");
    }

    /// The fixed store keeps every owned row on the device, the tiered store
    /// its hot tier; the other stores, row optimizers and exchanges keep them on the host.
    #[test]
    fn which_rows_a_gpu_worker_keeps_on_its_device() {
        use tiderec_operators::nn::{DlrmConfig, ModelConfig};
        use tiderec_operators::optim::SparseOptimizerKind;
        use tiderec_operators::store::StoreKind;
        let model = ModelConfig::Dlrm(DlrmConfig {
            num_dense: 2,
            num_sparse: 2,
            dim: 4,
            bottom: vec![4],
            top: vec![2, 1],
            self_interaction: false,
        });
        let base = TrainerConfig::builder(model, vec![50, 60]).build().unwrap();
        let with = |f: &dyn Fn(&mut TrainerConfig)| {
            let mut c = base.clone();
            f(&mut c);
            c
        };
        let tiered = with(&|c| c.store.kind = StoreKind::Tiered);
        for (c, on_device) in [
            (base.clone(), true),
            (tiered.clone(), true),
            (with(&|c| c.sparse_optimizer = SparseOptimizerKind::RowwiseAdagrad), true),
            (with(&|c| c.store.kind = StoreKind::Dynamic), false),
            (with(&|c| c.sparse_optimizer = SparseOptimizerKind::LazyAdam), false),
            (with(&|c| c.sparse_hp.l2_penalty = 1e-4), false),
            (with(&|c| c.exchange.replicated = vec![vec![1, 2], vec![]]), false),
        ] {
            let what = format!("{} store, {} rows", c.store.kind, c.sparse_optimizer);
            assert_eq!(rows_fit_the_device(&c, 2), on_device, "{what}");
            let gpu = Devices::parse("cuda:0").unwrap();
            assert_eq!(gpu.owned_rows_on_device(&c, 2), on_device, "{what}");
            assert!(!gpu.keep_rows_on_host().owned_rows_on_device(&c, 2), "{what}: TIDEREC_GPU_ROWS=host");
            assert!(!Devices::parse("cpu").unwrap().owned_rows_on_device(&c, 2), "{what}: no GPU worker");
        }
        assert!(device_hot_tier::supports(&tiered).is_ok() && device_hot_tier::supports(&base).is_err());
    }
}
