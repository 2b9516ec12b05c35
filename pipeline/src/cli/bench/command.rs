//! The `tiderec bench` subcommands: their flags, and each one's run and report.

use super::dlrm::{kaggle_dlrm, run_dlrm, DlrmBench};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use tiderec::settings::range::{self, Range};
use tiderec::TrainSettings;
use tiderec_operators::nn::ModelConfig;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Kaggle-shaped DLRM training samples/s (26 × 100k tables, dim 16).
    Dlrm(DlrmArgs),
    /// Training samples/s of any model (26 × 100k tables, default shapes).
    Model(ModelArgs),
    /// GRU forward + backward: split cell (AtRec) vs unsplit cell, same run.
    Gru(GruArgs),
    /// Sequence-feature kernels (split, fused split-hash-bucket / split-parse-mean) vs unfused pipelines.
    Features(FeaturesArgs),
    /// Batch replay: convert a Criteo file to Parquet, then Parquet vs TSV reading and training speed.
    Replay(ReplayArgs),
    /// Embedding stores: tiered (hot tier) vs plain hash store hit ratio and speed on Zipf ids;
    /// with --growing N, N records of a growing id space through a row budget (rows and RSS over time).
    Cache(CacheArgs),
    /// Exchange strategies (rows, DES partial results, replicated hot rows, the planner's choice):
    /// bytes per sample and samples/s of each in one run.
    Exchange(ExchangeArgs),
    /// `tiderec serve` under a concurrent load from this process: requests/s, records/s, p50/p99 latency.
    Serve(ServeBenchArgs),
    /// GEMM kernels: every candidate's GFLOP/s on each MLP product of a model, the one training
    /// chooses, the CPU and its vector extensions, and the bound the products put on a step.
    Kernels(KernelsArgs),
}

#[derive(Args)]
pub(crate) struct ServeBenchArgs {
    /// A ckpt-<step> directory, or a checkpoint directory, to serve.
    #[arg(long)]
    checkpoint: PathBuf,
    /// Criteo TSV file whose first records (as JSON objects) make the requests.
    #[arg(long)]
    criteo: PathBuf,
    /// Concurrent connections.
    #[arg(long, default_value_t = 16, value_parser = Range::<usize>::closed("clients", 1, range::MAX_THREADS))]
    clients: usize,
    /// Records per request.
    #[arg(long, default_value_t = 1, value_parser = Range::<usize>::closed("records_per_request", 1, range::MAX_BATCH))]
    records_per_request: usize,
    /// Measured seconds (after one second of warm-up).
    #[arg(long, default_value_t = 10.0, value_parser = Range::<f64>::above("seconds", 0.0, range::MAX_SECONDS))]
    seconds: f64,
    /// The server's --max-batch.
    #[arg(long, default_value_t = 512, value_parser = Range::<usize>::closed("max_batch", 1, range::MAX_BATCH))]
    max_batch: usize,
    /// The server's --max-wait-us.
    #[arg(long, default_value_t = 500, value_parser = Range::<u64>::closed("max_wait_us", 0, 1_000_000))]
    max_wait_us: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct KernelsArgs {
    /// dlrm (the Kaggle shape of `bench dlrm`) or any model of `bench model`.
    #[arg(long, default_value = "dlrm")]
    model: String,
    /// Rows per product (one worker's micro-batch).
    #[arg(long, default_value_t = 2048, value_parser = Range::<usize>::closed("rows", 1, range::MAX_BATCH))]
    rows: usize,
    /// Seconds per candidate and round.
    #[arg(long, default_value_t = 0.05, value_parser = Range::<f64>::above("seconds", 0.0, range::MAX_SECONDS))]
    seconds: f64,
    /// Alternating rounds (the median is shown).
    #[arg(long, default_value_t = 5, value_parser = Range::<usize>::closed("rounds", 1, 1000))]
    rounds: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct ExchangeArgs {
    /// Model: fm, deepfm, wdl or dlrm.
    #[arg(long, default_value = "fm")]
    model: String,
    /// Hidden widths of the deep part of deepfm and wdl (the first is the width of their partial results).
    #[arg(long, value_delimiter = ',', default_value = "400,400", value_parser = Range::<usize>::closed("deep", 1, range::MAX_WIDTH))]
    deep: Vec<usize>,
    /// Samples: `zipf` (synthetic Criteo-shaped, Zipf ranks) or `criteo:PATH`.
    #[arg(long, default_value = "zipf")]
    data: String,
    /// Zipf exponent of the synthetic ids.
    #[arg(long, default_value_t = 1.05, value_parser = Range::<f64>::above("zipf", 0.0, 100.0))]
    zipf: f64,
    /// Global batch size.
    #[arg(long, default_value_t = 2048, value_parser = Range::<usize>::closed("batch_size", 1, range::MAX_BATCH))]
    batch_size: usize,
    /// Workers in all.
    #[arg(long, default_value_t = 2, value_parser = Range::<usize>::closed("workers", 1, range::MAX_THREADS))]
    workers: usize,
    /// Split the workers over this many processes on 127.0.0.1 (started by this command).
    #[arg(long, default_value_t = 1, value_parser = Range::<usize>::closed("processes", 1, range::MAX_THREADS))]
    processes: usize,
    /// Set by a multi-process run for the processes it starts.
    #[arg(long, hide = true, requires = "hosts", value_parser = Range::<usize>::closed("process", 0, range::MAX_THREADS - 1))]
    process: Option<usize>,
    /// Set by a multi-process run for the processes it starts.
    #[arg(long, hide = true, requires = "process")]
    hosts: Option<std::path::PathBuf>,
    /// With --processes: seconds the processes may run in all before they are stopped and
    /// the run fails (a process that never connects leaves the others waiting).
    #[arg(long, default_value_t = 1800.0, value_parser = Range::<f64>::closed("timeout", 0.1, 86_400.0))]
    timeout: f64,
    /// Timed steps per strategy.
    #[arg(long, default_value_t = 20, value_parser = Range::<u64>::closed("steps", 1, range::MAX_STEPS))]
    steps: u64,
    /// Untimed steps per strategy.
    #[arg(long, default_value_t = 3, value_parser = Range::<u64>::closed("warmup", 0, range::MAX_STEPS))]
    warmup: u64,
    /// Rows of the largest table.
    #[arg(long, default_value_t = 100_000, value_parser = Range::<u64>::closed("rows", 1, range::MAX_ROWS))]
    rows: u64,
    /// Embedding dimension.
    #[arg(long, default_value_t = 16, value_parser = Range::<usize>::closed("dim", 1, range::MAX_WIDTH))]
    dim: usize,
    /// Fraction of each table's rows to replicate (0: skip replication).
    #[arg(long, default_value_t = 0.01, value_parser = Range::<f64>::closed("replicate", 0.0, 1.0))]
    replicate: f64,
    /// Steps of ids the planner counts.
    #[arg(long, default_value_t = 4, value_parser = Range::<u64>::closed("plan_steps", 1, range::MAX_STEPS))]
    plan_steps: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct CacheArgs {
    /// Hot-tier sizes to compare, rows.
    #[arg(long, value_delimiter = ',', default_value = "1024,16384,65536,262144,1048576", value_parser = Range::<usize>::closed("hot_rows", 1, 1 << 40))]
    hot_rows: Vec<usize>,
    /// Samples per step (one owner's de-duplicated lookups and updates).
    #[arg(long, default_value_t = 4096, value_parser = Range::<usize>::closed("batch_size", 1, range::MAX_BATCH))]
    batch_size: usize,
    /// Steps replayed per store (the first --warmup untimed).
    #[arg(long, default_value_t = 120, value_parser = Range::<usize>::closed("steps", 1, 1 << 40))]
    steps: usize,
    /// Untimed counting steps before the tiered store's plan.
    #[arg(long, default_value_t = 40, value_parser = Range::<usize>::closed("warmup", 0, 1 << 40))]
    warmup: usize,
    /// Embedding dimension.
    #[arg(long, default_value_t = 16, value_parser = Range::<usize>::closed("dim", 1, range::MAX_WIDTH))]
    dim: usize,
    /// Instead: stream N records with a growing id space through a dynamic store.
    #[arg(long, value_name = "N", value_parser = Range::<u64>::closed("growing", 1, range::MAX_STEPS))]
    growing: Option<u64>,
    /// Row budget of the --growing run (0: unbounded).
    #[arg(long, default_value_t = 2_000_000, value_parser = Range::<u64>::closed("max_rows", 0, range::MAX_ROWS))]
    max_rows: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct ReplayArgs {
    /// Criteo TSV file to convert and replay.
    #[arg(long, default_value = "../shared/data/criteo/sample.train")]
    criteo: PathBuf,
    /// Rows per row group of the converted file.
    #[arg(long, default_value_t = 65_536, value_parser = Range::<usize>::closed("row_group_rows", 1, 1 << 30))]
    row_group_rows: usize,
    /// Rows per embedding table.
    #[arg(long, default_value_t = 100_000, value_parser = Range::<u64>::closed("buckets", 1, range::MAX_ROWS))]
    buckets: u64,
    /// Seconds per decode measurement (each reader is measured twice, alternating).
    #[arg(long, default_value_t = 1.0, value_parser = Range::<f64>::above("seconds", 0.0, range::MAX_SECONDS))]
    seconds: f64,
    /// Model of the training comparison: dlrm, lr, fm, deepfm or wdl.
    #[arg(long, default_value = "dlrm")]
    model: String,
    /// Global batch size of the training comparison.
    #[arg(long, default_value_t = 128, value_parser = Range::<usize>::closed("batch_size", 1, range::MAX_BATCH))]
    batch_size: usize,
    /// Worker threads of the training comparison.
    #[arg(long, default_value_t = 1, value_parser = Range::<usize>::closed("workers", 1, range::MAX_THREADS))]
    workers: usize,
    /// Training steps per run (each source is trained twice, alternating).
    #[arg(long, default_value_t = 150, value_parser = Range::<u64>::closed("steps", 1, range::MAX_STEPS))]
    steps: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct FeaturesArgs {
    /// Seconds per measurement (each kernel is measured twice, alternating).
    #[arg(long, default_value_t = 0.5, value_parser = Range::<f64>::above("seconds", 0.0, range::MAX_SECONDS))]
    seconds: f64,
    /// Criteo TSV file to measure as well (skipped when absent).
    #[arg(long, default_value = "../shared/data/criteo/sample.train")]
    criteo: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct GruArgs {
    /// Sequences per batch.
    #[arg(long, default_value_t = 256, value_parser = Range::<usize>::closed("batch_size", 1, range::MAX_BATCH))]
    batch_size: usize,
    /// Time steps per sequence (history length).
    #[arg(long, default_value_t = 50, value_parser = Range::<usize>::closed("steps", 1, 1 << 20))]
    steps: usize,
    /// Input width (item + category embedding).
    #[arg(long, default_value_t = 36, value_parser = Range::<usize>::closed("input", 1, range::MAX_WIDTH))]
    input: usize,
    /// Hidden width.
    #[arg(long, default_value_t = 36, value_parser = Range::<usize>::closed("hidden", 1, range::MAX_WIDTH))]
    hidden: usize,
    /// Seconds of timing per cell, spread over 9 alternating rounds.
    #[arg(long, default_value_t = 4.0, value_parser = Range::<f64>::above("seconds", 0.0, range::MAX_SECONDS))]
    seconds: f64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct ModelArgs {
    /// dlrm, lr, fm, deepfm, wdl, dien or dien-sum (the last two on synthetic behaviour histories).
    #[arg(long, default_value = "dlrm")]
    model: String,
    #[command(flatten)]
    common: DlrmArgs,
}

#[derive(Args)]
pub(crate) struct DlrmArgs {
    /// Global batch size.
    #[arg(long, default_value_t = 128, value_parser = Range::<usize>::closed("batch_size", 1, range::MAX_BATCH))]
    batch_size: usize,
    /// Worker threads.
    #[arg(long, default_value_t = 1, value_parser = Range::<usize>::closed("workers", 1, range::MAX_THREADS))]
    workers: usize,
    /// Timed steps (default: enough for about 200k samples, at least 50).
    #[arg(long, value_parser = Range::<u64>::closed("steps", 1, range::MAX_STEPS))]
    steps: Option<u64>,
    /// Untimed warm-up steps.
    #[arg(long, default_value_t = 20, value_parser = Range::<u64>::closed("warmup", 0, range::MAX_STEPS))]
    warmup: u64,
    /// Rows per table.
    #[arg(long, default_value_t = 100_000, value_parser = Range::<u64>::closed("rows", 1, range::MAX_ROWS))]
    rows: u64,
    /// Dense optimizer (sgd, adagrad, adam).
    #[arg(long, default_value = "adagrad")]
    optimizer: String,
    /// Compute device of each worker: cpu, cuda:N, or one entry per worker (cuda:0,cpu).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Precision of the MLPs' products: fp32, bf16 (on a CPU, needs AVX-512 BF16) or tf32 (GPU
    /// workers only); on a GPU worker bf16 and tf32 apply to every GEMM.
    #[arg(long, default_value = "fp32", value_name = "fp32|bf16|tf32")]
    precision: String,
    /// Run the workers as independent single-worker trainers (own model and tables,
    /// nothing exchanged), timed together: the machine's ceiling for that many workers.
    #[arg(long)]
    independent: bool,
    /// Keep the GPU workers' rows on the host: one training alone also keeps its pooling
    /// and optimizers there, one among several the rows it owns (by default they live
    /// on the device; a baseline, as TIDEREC_GPU_ROWS=host).
    #[arg(long)]
    host_rows: bool,
    /// With one device-resident GPU worker: time each phase of its steps
    /// (waiting for the device after each phase, so steps run slower).
    #[arg(long)]
    phases: bool,
    /// Skew the ids: Zipf(S)-like per table, id 0 the most frequent (0: uniform).
    #[arg(long, default_value_t = 0.0, value_name = "S", value_parser = Range::<f64>::closed("zipf", 0.0, 100.0))]
    zipf: f64,
    /// Train under the tiered store with K hot rows per worker (planned during the warm-up,
    /// re-planned every 50 steps) instead of the fixed table; a GPU worker keeps its hot tier
    /// on the device.
    #[arg(long, value_name = "K", value_parser = Range::<usize>::closed("hot_rows", 1, u32::MAX as usize / 2))]
    hot_rows: Option<usize>,
}

fn print_features(r: &super::features::FeaturesBenchResult) {
    println!(
        "feature kernels: avx2 {}, {} s per measurement x 2, criteo {}",
        r.avx2,
        r.seconds,
        r.criteo_file.as_deref().unwrap_or("not found")
    );
    println!("pipelines (MB/s, records/s):");
    println!(
        "  {:<11} {:>7} {:>8} | {:>17} | {:>17} | {:>17} | {:>17} | {:>8} {:>8}",
        "dataset", "records", "B/rec", "fused", "unfused", "str::split", "for_each_token", "fus/unf", "tok/str"
    );
    for p in &r.pipelines {
        let t = |t: &super::features::Throughput| format!("{:7.0} {:9.0}", t.mb_per_sec, t.records_per_sec);
        println!(
            "  {:<11} {:>7} {:>8.0} | {} | {} | {} | {} | {:>7.2}x {:>7.2}x",
            p.dataset,
            p.records,
            p.mean_record_bytes,
            t(&p.fused),
            t(&p.unfused),
            t(&p.str_split),
            t(&p.token_split),
            p.fused_vs_unfused,
            p.token_split_vs_str_split
        );
    }
    println!("delimiter positions per field (MB/s, fields/s):");
    println!(
        "  {:<19} {:>7} {:>7} {:>6} | {:>18} | {:>18} | {:>18} | {:>8} {:>8}",
        "fields", "count", "B/field", "delims", "split_positions", "byte loop", "memchr_iter", "vs byte", "vs memchr"
    );
    for f in &r.field_splits {
        let t = |t: &super::features::Throughput| format!("{:7.0} {:10.0}", t.mb_per_sec, t.records_per_sec);
        println!(
            "  {:<19} {:>7} {:>7.1} {:>6.1} | {} | {} | {} | {:>7.2}x {:>8.2}x",
            f.fields,
            f.count,
            f.mean_field_bytes,
            f.mean_delimiters,
            t(&f.simd),
            t(&f.bytes),
            t(&f.memchr),
            f.simd_vs_bytes,
            f.simd_vs_memchr
        );
    }
}

/// The model of `tiderec bench model --model NAME`: the CLI's default shapes
/// (DIEN's on synthetic behaviour histories).
fn bench_model(name: &str) -> anyhow::Result<tiderec_operators::nn::ModelConfig> {
    let settings = {
        let mut s = TrainSettings::default();
        s.model.kind = name.parse()?;
        s
    };
    Ok(if settings.model.kind.is_dien() {
        let data = tiderec::config::DataSpec::SyntheticBehavior;
        settings.model_config_with(data.shape(None), data.sequences(None).as_ref())?
    } else {
        settings.model_config()?
    })
}

/// Runs one `tiderec bench` command and prints its report (text, or one JSON object with `--json`).
pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Dlrm(a) => run_training(kaggle_dlrm(), a)?,
        BenchCommand::Model(m) => run_training(bench_model(&m.model)?, m.common)?,
        BenchCommand::Serve(a) => {
            let bench = super::serve::ServeBench {
                binary: std::env::current_exe()?,
                checkpoint: a.checkpoint,
                criteo: a.criteo,
                clients: a.clients,
                records_per_request: a.records_per_request,
                seconds: a.seconds,
                max_batch: a.max_batch,
                max_wait_us: a.max_wait_us,
            };
            let r = super::serve::run(&bench)?;
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "serve: {} clients x {} records/request: {:.0} requests/s, {:.0} records/s, latency p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; {:.1} records per server batch",
                    r.clients, r.records_per_request, r.requests_per_sec, r.records_per_sec, r.p50_ms, r.p99_ms, r.max_ms, r.mean_server_batch
                );
            }
        }
        BenchCommand::Gru(g) => {
            let r = super::gru::run_gru(g.batch_size, g.steps, g.input, g.hidden, g.seconds);
            if g.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "gru batch {} steps {} input {} hidden {}: split {:.0} seq/s, unsplit {:.0} seq/s, speedup {:.2}x (median of 9 rounds; rounds {:.2}–{:.2}x)",
                    r.batch_size,
                    r.steps,
                    r.input,
                    r.hidden,
                    r.split_sequences_per_sec,
                    r.unsplit_sequences_per_sec,
                    r.speedup,
                    r.speedup_range[0],
                    r.speedup_range[1]
                );
            }
        }
        BenchCommand::Cache(a) => {
            if let Some(records) = a.growing {
                let budget = (a.max_rows > 0).then_some(a.max_rows);
                let r = super::cache::run_growing(records, budget, a.dim, a.batch_size, 20)?;
                if a.json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    println!(
                        "growing id space: {} records, dim {}, row budget {}, {:.0} records/s (RSS {:.0} MiB before)",
                        r.records,
                        r.dim,
                        r.max_rows.map_or("none".to_string(), |m| m.to_string()),
                        r.records_per_sec,
                        r.rss_start_mib
                    );
                    println!(
                        "  {:>11} {:>12} {:>10} {:>12} {:>9}",
                        "records", "admitted", "rows", "evicted", "RSS MiB"
                    );
                    for p in &r.points {
                        println!(
                            "  {:>11} {:>12} {:>10} {:>12} {:>9.0}",
                            p.records, p.admitted, p.rows, p.evicted, p.rss_mib
                        );
                    }
                }
                return Ok(());
            }
            let bench = super::cache::CacheBench {
                hot_sizes: a.hot_rows,
                batch_size: a.batch_size,
                steps: a.steps,
                warmup: a.warmup,
                dim: a.dim,
                seed: 7,
            };
            let r = super::cache::run_cache(&bench)?;
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "cache: synthetic Criteo (Zipf 1.1, Kaggle cardinalities), batch {}, {} timed steps, dim {}, {} rows held",
                    bench.batch_size,
                    bench.steps - bench.warmup,
                    bench.dim,
                    r.rows
                );
                println!(
                    "  {:>9} {:>9} {:>8} | {:>14} {:>14} | {:>12} {:>12} | {:>7}",
                    "hot rows",
                    "hot MiB",
                    "hot hit",
                    "tiered smp/s",
                    "hash smp/s",
                    "tiered op/s",
                    "hash op/s",
                    "speedup"
                );
                for s in &r.sizes {
                    println!(
                        "  {:>9} {:>9.1} {:>7.1}% | {:>14.0} {:>14.0} | {:>12.3e} {:>12.3e} | {:>6.2}x",
                        s.hot_rows,
                        s.hot_bytes as f64 / (1 << 20) as f64,
                        100.0 * s.hot_hit_ratio,
                        s.tiered_samples_per_sec,
                        s.hash_samples_per_sec,
                        s.tiered_ops_per_sec,
                        s.hash_ops_per_sec,
                        s.speedup
                    );
                }
            }
        }
        BenchCommand::Exchange(a) if a.processes > 1 && a.process.is_none() => {
            // Start the processes with this command's own arguments; process 0 prints the report.
            let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
            let out = super::processes::run_local(a.processes, &args, std::time::Duration::from_secs_f64(a.timeout))?;
            std::io::Write::write_all(&mut std::io::stdout(), &out)?;
        }
        BenchCommand::Exchange(a) => {
            use super::exchange::{run_exchange, ExchangeBench, ExchangeData};
            use tiderec::cluster::ProcessRole;
            let data = match a.data.split_once(':') {
                None if a.data == "zipf" => ExchangeData::Zipf(a.zipf),
                Some(("criteo", path)) => ExchangeData::Criteo(path.into()),
                _ => anyhow::bail!("--data must be `zipf` or `criteo:PATH`, got `{}`", a.data),
            };
            let bench = ExchangeBench {
                model: a.model,
                deep: a.deep,
                data,
                batch_size: a.batch_size,
                workers: a.workers,
                role: match (a.process, &a.hosts) {
                    (Some(process), Some(hosts)) => ProcessRole::from_hosts(process, a.processes, hosts)?,
                    _ => ProcessRole { process: 0, processes: 1, addresses: Vec::new() },
                },
                warmup: a.warmup,
                steps: a.steps,
                rows: a.rows,
                dim: a.dim,
                replicate: a.replicate,
                plan_steps: a.plan_steps,
                seed: 7,
            };
            let r = run_exchange(&bench)?;
            if bench.role.process > 0 {
                // Process 0 reports for all.
            } else if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print!("{}", r.describe());
            }
        }
        BenchCommand::Replay(a) => {
            let bench = super::replay::ReplayBench {
                criteo: a.criteo,
                row_group_rows: a.row_group_rows,
                buckets: a.buckets,
                seconds: a.seconds,
                model: a.model,
                batch_size: a.batch_size,
                workers: a.workers,
                steps: a.steps,
            };
            let r = super::replay::run_replay(&bench)?;
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "replay of {}: {} rows, {} row group(s); TSV {} bytes, Parquet {} bytes ({:.2}x smaller)",
                    r.file,
                    r.rows,
                    r.row_groups,
                    r.tsv_bytes,
                    r.parquet_bytes,
                    r.tsv_bytes as f64 / r.parquet_bytes.max(1) as f64
                );
                println!("  convert           {:>12.0} rows/s", r.convert_rows_per_sec);
                println!(
                    "  decode only       {:>12.0} rows/s Parquet  vs {:>10.0} lines/s TSV   ratio {:.2}x",
                    r.parquet_read_rows_per_sec, r.tsv_read_lines_per_sec, r.read_ratio
                );
                println!(
                    "  train {} b{} w{} {:>8.0} samples/s Parquet vs {:>10.0} samples/s TSV ratio {:.2}x ({} steps)",
                    r.model,
                    r.batch_size,
                    r.workers,
                    r.train_parquet_samples_per_sec,
                    r.train_tsv_samples_per_sec,
                    r.train_ratio,
                    r.steps
                );
            }
        }
        BenchCommand::Kernels(k) => {
            if k.rows == 0 || k.rounds == 0 || !k.seconds.is_finite() || k.seconds <= 0.0 {
                anyhow::bail!("--rows, --rounds and --seconds must be positive");
            }
            let model = if k.model == "dlrm" { kaggle_dlrm() } else { bench_model(&k.model)? };
            let r = super::kernels::run_kernels(&model, k.rows, k.seconds, k.rounds);
            if k.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                super::kernels::print_kernels(&r);
            }
        }
        BenchCommand::Features(f) => {
            let r = super::features::run_features(f.seconds, &f.criteo);
            if f.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print_features(&r);
            }
        }
    }
    Ok(())
}

/// `bench dlrm` and `bench model`: `model` trained at the shapes of `a`.
fn run_training(model: ModelConfig, a: DlrmArgs) -> anyhow::Result<()> {
    let steps = a.steps.unwrap_or_else(|| (200_000 / a.batch_size as u64).max(50));
    let bench = DlrmBench {
        batch_size: a.batch_size,
        workers: a.workers,
        warmup_steps: a.warmup,
        steps,
        rows: a.rows,
        optimizer: a.optimizer.parse()?,
        model,
        device: a.device.clone(),
        precision: a.precision.parse()?,
        independent: a.independent,
        host_rows: a.host_rows,
        phases: a.phases,
        zipf: a.zipf,
        hot_rows: a.hot_rows,
    };
    let r = run_dlrm(&bench)?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{} batch {} workers {}{}{}: {:.0} samples/s ({:.2} ms/step, {} steps, {:.0} bytes/sample exchanged)",
            r.model,
            r.batch_size,
            r.workers,
            if r.independent { " (independent trainers)" } else { "" },
            if r.precision == "fp32" { String::new() } else { format!(" {}", r.precision) },
            r.samples_per_sec,
            r.ms_per_step,
            r.steps,
            r.bytes_per_sample
        );
        let mean = |f: fn(&tiderec_operators::train::StepTimes) -> f64| {
            r.stage_ms.iter().map(f).sum::<f64>() / r.stage_ms.len().max(1) as f64
        };
        println!(
            "  per step and worker: {:.2} ms in the trainer: forward/backward {:.2}, lookups planned and served \
             {:.2}, gradients applied {:.2}, dense slices gathered {:.2}, outside the stages (rendezvous) {:.2}",
            mean(|t| t.total),
            mean(|t| t.forward_backward + t.partial_backward),
            mean(|t| t.plan + t.serve),
            mean(|t| t.apply),
            mean(|t| t.gather),
            mean(|t| t.outside())
        );
        if let Some(g) = &r.gru {
            println!(
                "  its GRU (batch {}, {} steps, {}→{}): split cell {:.0} seq/s, unsplit {:.0} seq/s, {:.2}×",
                g.batch_size,
                g.steps,
                g.input,
                g.hidden,
                g.split_sequences_per_sec,
                g.unsplit_sequences_per_sec,
                g.speedup
            );
        }
    }
    Ok(())
}
