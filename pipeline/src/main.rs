//! The `tiderec` command line.

mod cli;
#[cfg(test)]
mod documented_commands;
#[cfg(test)]
mod documented_paths;

use anyhow::Context;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use clap::{Args, Parser, Subcommand};
use cli::bench::command::BenchCommand;
use cli::data::{run_convert, run_generate_elm, run_spec_check, run_spec_list, run_spec_show};
use cli::data::{ConvertArgs, GenerateCommand, SpecCommand};
use cli::fmt_opt;
use cli::online::{run_online, run_produce, OnlineArgs, ProduceArgs};
use cli::scoring::{run_eval, run_export, run_predict, run_serve, EvalArgs, ExportArgs, PredictArgs, ServeArgs};
use std::path::PathBuf;
use tiderec::paths::{self, Named};
use tiderec::run_files;
use tiderec::settings::TrainFlags;
use tiderec::TrainSettings;

/// The command line: one subcommand and its flags.
#[derive(Parser)]
#[command(name = "tiderec", version, about = "Streaming CTR training on timely dataflow")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model (DLRM, LR, FM, DeepFM, Wide & Deep, DIEN) on synthetic data, raw record files or converted
    /// Parquet.
    Train(Box<TrainArgs>),
    /// Convert raw record files (criteo, avazu, csv + spec) to featurized Parquet for batch replay.
    Convert(Box<ConvertArgs>),
    /// Train continuously from a Kafka topic (prequential evaluation, exactly-once checkpoints).
    Online(Box<OnlineArgs>),
    /// Replay Criteo files into a Kafka topic (creates the topic if needed).
    Produce(ProduceArgs),
    /// Draw loss, NE, AUC, PR-AUC and GAUC curves from a `train` or `online` `--metrics-log` file to a PNG.
    Plot(PlotArgs),
    /// Write a checkpoint's model as a serving snapshot (safetensors + model config JSON).
    Export(ExportArgs),
    /// Score labeled records with a checkpoint's model (AUC, logloss, NE, calibration, PR-AUC, GAUC),
    /// featurized by its pipeline.
    Eval(EvalArgs),
    /// Write one score per record (CSV or Parquet), featurized by the checkpoint's pipeline.
    Predict(PredictArgs),
    /// Score JSON records over HTTP with a checkpoint's model, following a checkpoint directory.
    Serve(ServeArgs),
    /// Measure throughput.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Write generated datasets (no real Ele.me rows exist; this writes elm-shaped ones).
    #[command(subcommand)]
    Generate(GenerateCommand),
    /// Feature-spec presets: list them, or print one as TOML to start a spec from.
    #[command(subcommand)]
    Spec(SpecCommand),
}

/// Flags of `tiderec train`: every setting, plus `--overwrite`.
#[derive(Args)]
struct TrainArgs {
    /// Replace --metrics-json when it exists (refused otherwise, unless --resume).
    #[arg(long)]
    overwrite: bool,
    #[command(flatten)]
    train: TrainFlags,
}

#[derive(Args)]
struct PlotArgs {
    /// JSON-lines metrics file written by `train --metrics-log` or `online --metrics-log`.
    #[arg(long, value_name = "FILE")]
    metrics: PathBuf,
    /// PNG to write.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Replace --out when it exists (refused otherwise).
    #[arg(long)]
    overwrite: bool,
}

/// Keeps freed memory mapped instead of returning it to the system after a delay.
///
/// A training step frees and re-allocates the same large buffers (the GEMM's
/// packing space among them); with mimalloc's default the pages are purged
/// between steps and come back as fresh (zero-filled, often 2 MiB) page faults:
/// about 18 per DLRM step at batch 1,024, 2–3% of the step. The process keeps
/// its peak footprint instead, as a training process's caching allocator
/// would. `MIMALLOC_PURGE_DELAY` in the environment still wins.
fn keep_freed_memory_mapped() {
    // `mi_option_purge_delay` in mimalloc v3's `mi_option_e` (include/mimalloc.h); the
    // Rust bindings (libmimalloc-sys 0.1.49, locked) name options only up to 14.
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a process-wide allocator option (an integer the allocator reads
        // when it decides to purge); no allocation is in flight on another thread yet.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
}

/// The command line, with every `train`/`online` setting's default shown in `--help`.
///
/// Those flags are `Option`s (a flag overrides the `--config` file only when given), so clap
/// knows no default for them; the defaults come from [`TrainSettings::default`], the one
/// place they are declared, and are appended to each flag's help.
fn parse_cli() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let defaults = serde_json::to_value(TrainSettings::default()).unwrap_or_default();
    let show = |v: &serde_json::Value| match v {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(a) if a.is_empty() => None,
        serde_json::Value::Array(a) => Some(
            a.iter().map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string)).collect::<Vec<_>>().join(","),
        ),
        serde_json::Value::Bool(false) => None,
        other => Some(other.to_string()),
    };
    let annotate = |cmd: clap::Command| {
        cmd.mut_args(|arg| {
            let key = arg.get_id().as_str().to_string();
            let already = arg.get_help().is_some_and(|h| h.to_string().contains("default"));
            match defaults.get(&key).and_then(show) {
                Some(value) if !already && !arg.is_required_set() && arg.get_default_values().is_empty() => {
                    let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                    arg.help(format!("{help} [default: {value}]"))
                }
                _ => arg,
            }
        })
    };
    let cmd = Cli::command()
        .mut_subcommand("train", annotate)
        .mut_subcommand("online", |c| {
            // Settings `online` refuses (it says why when one is given) are not offered.
            annotate(c).mut_args(|arg| {
                let refused = tiderec::applicable::NOT_ONLINE.iter().any(|(k, _)| *k == arg.get_id().as_str());
                if refused {
                    arg.hide(true)
                } else {
                    arg
                }
            })
        })
        .mut_subcommand("convert", annotate)
        .mut_subcommand("eval", annotate)
        .mut_subcommand("predict", annotate);
    let matches = cmd.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// An error's output is the error and its causes; the backtrace of where it was made
/// only with `TIDEREC_BACKTRACE=1`, not whenever `RUST_BACKTRACE` is set for a panic's.
/// `RUST_LIB_BACKTRACE`, which errors read before `RUST_BACKTRACE`, still wins.
fn errors_without_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        let wanted = std::env::var("TIDEREC_BACKTRACE").is_ok_and(|v| v != "0" && !v.is_empty());
        // Set before any thread starts (the first thing `main` does).
        std::env::set_var("RUST_LIB_BACKTRACE", if wanted { "1" } else { "0" });
    }
}

/// `tiderec train`: checks the settings and the files, trains, and prints the run's summary
/// (process 0).
fn run_train(a: TrainArgs) -> anyhow::Result<()> {
    let settings = a.train.settings()?;
    tiderec::applicable::check(&settings, tiderec::applicable::For::Train)?;
    let inputs = run_files::train_inputs(&settings, a.train.config_path())?;
    let outputs = run_files::train_outputs(&settings);
    paths::check_outputs(&inputs, &outputs)?;
    paths::check_outside(&run_files::train_data_dirs(&settings), &outputs)?;
    run_files::check_replaced(&settings, None, a.overwrite)?;
    let data = settings.data.source.clone();
    let workers = settings.cluster.workers * settings.cluster.processes;
    eprintln!(
        "tiderec train: {} on {data}, {workers} worker(s), batch {}, {} optimizer, seed {}",
        settings.model.kind, settings.run.batch_size, settings.optimizer.dense, settings.run.seed
    );
    let summary = tiderec::run::train(&settings).context("training failed")?;
    let Some(s) = summary else {
        eprintln!("process {} finished; process 0 reports the metrics", settings.cluster.process);
        return Ok(());
    };
    print_train_summary(&settings, &s);
    Ok(())
}

/// Prints the summary of a `train` run.
fn print_train_summary(settings: &TrainSettings, s: &tiderec_sinks::metrics::RunSummary) {
    println!("trained {} samples in {} steps ({} epochs) on {} worker(s)", s.samples, s.steps, s.epochs, s.workers);
    println!("  train loss      {:.4} (last steps), {:.4} (run mean)", s.train_loss, s.train_loss_mean);
    println!("  eval AUC        {}   (teacher AUC {})", fmt_opt(s.auc), fmt_opt(s.teacher_auc));
    println!(
        "  eval logloss    {}   NE {}   calibration {}",
        fmt_opt(s.logloss),
        fmt_opt(s.ne),
        fmt_opt(s.calibration)
    );
    println!("  eval PR-AUC     {}   GAUC {}", fmt_opt(s.pr_auc), fmt_opt(s.gauc));
    println!("  eval accuracy   {}   on {} samples", fmt_opt(s.accuracy), s.eval_samples);
    println!("  throughput      {:.0} samples/s   ({:.1} s training)", s.samples_per_sec, s.train_seconds);
    println!("  exchanged       {:.1} bytes/sample", s.bytes_per_sample);
    println!("  params L2       {:.6}", s.params_l2);
    println!("  bad records     {} {:?}", s.bad_records, s.bad_records_by_reason);
    let st = &s.store;
    println!(
        "  store ({})  {} lookups: {:.1}% hot, {:.1}% cold, {:.1}% miss; rows {} hot + {} cold",
        settings.store.kind,
        st.lookups,
        100.0 * st.hot_hits as f64 / st.lookups.max(1) as f64,
        100.0 * st.cold_hits as f64 / st.lookups.max(1) as f64,
        100.0 * st.misses as f64 / st.lookups.max(1) as f64,
        st.hot_rows,
        st.cold_rows
    );
    if settings.store.kind != tiderec_operators::store::StoreKind::Fixed {
        println!(
            "                  {} admitted, {} updates rejected, {} evicted, {} re-plans moving {} rows",
            st.admissions, st.rejections, st.evictions, st.replans, st.moves
        );
    }
    if let Some(step) = s.resumed_from_step {
        println!("  resumed from    step {step}");
    }
    if s.evaluations.len() > 1 {
        let best = s.evaluations.iter().find(|e| Some(e.step) == s.best_step);
        println!(
            "  evaluations     {}; best at step {} (epoch {}, AUC {}, logloss {}){}",
            s.evaluations.len(),
            best.map_or("n/a".into(), |b| b.step.to_string()),
            best.map_or("n/a".into(), |b| b.epoch.to_string()),
            fmt_opt(best.and_then(|b| b.auc)),
            fmt_opt(best.and_then(|b| b.logloss)),
            s.early_stopped_at_step
                .map_or(String::new(), |at| format!("; stopped early after step {at}, the model is the best's"))
        );
    }
    if s.checkpoints_written > 0 {
        println!(
            "  checkpoints     {} written: training stalled {:.2} s, writing took {:.2} s ({} steps trained \
             meanwhile)",
            s.checkpoints_written, s.checkpoint_seconds, s.checkpoint_write_seconds, s.checkpoint_overlap_steps
        );
    }
    if let Some(p) = &settings.run.metrics_json {
        println!("  metrics written to {}", p.display());
    }
}

/// `tiderec plot`: draws a metrics log's curves to a PNG.
fn run_plot(a: PlotArgs) -> anyhow::Result<()> {
    let out = Named::new("--out", &a.out);
    paths::check_outputs(&[Named::new("--metrics", &a.metrics)], std::slice::from_ref(&out))?;
    paths::check_new(&out, a.overwrite)?;
    let n = cli::plot::plot_metrics(&a.metrics, &a.out).context("plot failed")?;
    println!("plotted {n} reports from {} to {}", a.metrics.display(), a.out.display());
    Ok(())
}

fn main() -> anyhow::Result<()> {
    errors_without_backtraces();
    keep_freed_memory_mapped();
    let cli = parse_cli();
    // An invalid cap on the vector extensions is refused before any kernel runs.
    tiderec_operators::cpu::check()?;
    tiderec_operators::cpu::check_amx_emulation()?;
    match cli.command {
        Command::Train(args) => run_train(*args)?,
        Command::Online(args) => run_online(*args)?,
        Command::Produce(a) => run_produce(a)?,
        Command::Plot(a) => run_plot(a)?,
        Command::Export(a) => run_export(a)?,
        Command::Serve(a) => run_serve(a)?,
        Command::Eval(a) => run_eval(a)?,
        Command::Predict(a) => run_predict(a)?,
        Command::Spec(SpecCommand::List) => run_spec_list(),
        Command::Spec(SpecCommand::Show(a)) => run_spec_show(a)?,
        Command::Spec(SpecCommand::Check(a)) => run_spec_check(a)?,
        Command::Generate(GenerateCommand::Elm(a)) => run_generate_elm(a)?,
        Command::Convert(args) => run_convert(*args)?,
        Command::Bench(command) => cli::bench::command::run(command)?,
    }
    Ok(())
}
