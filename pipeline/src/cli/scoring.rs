//! What reads a checkpoint's model: `tiderec export`, `serve`, `eval` and
//! `predict`, their flags and what they run.

use super::fmt_opt;
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;
use tiderec::paths::{self, Named};
use tiderec::settings::range::{self, Range};
use tiderec::settings::{OverDefaults, RecordPolicy};

#[derive(Args)]
pub(crate) struct ExportArgs {
    /// A ckpt-<step> directory, or a checkpoint directory (its newest valid checkpoint).
    #[arg(long, value_name = "PATH")]
    checkpoint: PathBuf,
    /// Directory to write model.safetensors and model.json into (not within a checkpoint directory).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Write only the embedding rows the checkpoint lists, those training changed
    /// (`<tensor>.ids` and `<tensor>.rows`); model.json says what the others hold, their
    /// values re-created from the seed (docs/export.md).
    #[arg(long)]
    compact: bool,
    /// Replace model.safetensors and model.json when --out holds them (refused otherwise).
    #[arg(long)]
    overwrite: bool,
}

#[derive(Args)]
pub(crate) struct ServeArgs {
    /// A ckpt-<step> directory (served as it is), or a checkpoint directory: its newest valid
    /// checkpoint is served and each newer one is loaded as it appears.
    #[arg(long, value_name = "PATH")]
    checkpoint: PathBuf,
    /// Address to listen on (port 0: any free port; the address is printed).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8080")]
    addr: String,
    /// Connections open at once, one thread each (one more is answered 503).
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = Range::<usize>::closed("threads", 1, range::MAX_THREADS))]
    threads: usize,
    /// Connections open at once from one client address (one more gets 429; GET /health is
    /// still answered).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = Range::<usize>::closed("max_connections_per_ip", 1, range::MAX_THREADS))]
    max_connections_per_ip: usize,
    /// Most records in one request (more: 413), 1 to 16,777,216.
    #[arg(long, value_name = "N", default_value_t = 65_536, value_parser = Range::<usize>::closed("max_records", 1, 1 << 24))]
    max_records: usize,
    /// Largest request body in bytes, Content-Length or chunked (more: 413).
    #[arg(long, value_name = "BYTES", default_value_t = tiderec::serve::DEFAULT_MAX_BODY_BYTES, value_parser = Range::<usize>::closed("max_body_bytes", 1, 1 << 32))]
    max_body_bytes: usize,
    /// Bytes of request bodies held at once across all connections, at least --max-body-bytes (a
    /// request whose body does not fit in what is left gets 503 with Retry-After).
    #[arg(long, value_name = "BYTES", default_value_t = tiderec::serve::DEFAULT_MAX_BODY_MEMORY, value_parser = Range::<usize>::closed("max_body_memory", 1, 1 << 40))]
    max_body_memory: usize,
    /// Seconds to receive a request, head and body, from its first byte (then 408), and the
    /// longest idle time of a kept-alive connection.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0, value_parser = Range::<f64>::above("read_timeout", 0.0, 3600.0))]
    read_timeout: f64,
    /// Most records scored in one forward pass.
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = Range::<usize>::closed("max_batch", 1, 1 << 20))]
    max_batch: usize,
    /// Microseconds to wait for more requests after the first one of a batch (at most one second).
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 500, value_parser = Range::<u64>::closed("max_wait_us", 0, 1_000_000))]
    max_wait_us: u64,
    /// Seconds between looks for a newer checkpoint (0: never reload).
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, value_parser = Range::<f64>::closed("reload_every", 0.0, range::MAX_SECONDS))]
    reload_every: f64,
}

/// What `eval` and `predict` read.
#[derive(Args)]
pub(crate) struct ScoreArgs {
    /// A ckpt-<step> directory, or a checkpoint directory (its newest valid checkpoint).
    #[arg(long, value_name = "PATH")]
    checkpoint: PathBuf,
    /// Records to score: FORMAT:PATH[,PATH…] in the checkpoint's format (criteo, avazu, csv, taobao-ad,
    /// amazon-dien, parquet); csv and taobao-ad use the checkpoint's spec.
    #[arg(long, value_name = "FORMAT:PATH,…")]
    data: String,
    /// Records scored per forward pass.
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = Range::<usize>::closed("batch_size", 1, range::MAX_BATCH))]
    batch_size: usize,
    /// The malformed-record settings, as in `train`.
    #[command(flatten)]
    records: RecordFlags,
}

/// The malformed-record flags of `eval` and `predict`, as in `train`, and whether
/// `--dead-letters` was given: without it, a scoring command writes a dead-letter file of
/// its own, never the one a training run in the same directory wrote.
struct RecordFlags {
    policy: RecordPolicy,
    dead_letters_given: bool,
}

const DEAD_LETTERS_HELP: &str = "Dead-letter file for malformed records [default: predict: beside --out, \
                                 OUT.dead-letters.tsv; eval: tiderec-eval-dead-letters.tsv]. A default file \
                                 lists the last run's malformed records: a run without any removes one an \
                                 earlier run left (predict: only with --overwrite)";

impl Args for RecordFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        OverDefaults::<RecordPolicy>::augment_args(cmd).mut_arg("dead_letters", |a| a.help(DEAD_LETTERS_HELP))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        OverDefaults::<RecordPolicy>::augment_args_for_update(cmd)
            .mut_arg("dead_letters", |a| a.help(DEAD_LETTERS_HELP))
    }
}

impl clap::FromArgMatches for RecordFlags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let OverDefaults(policy) = OverDefaults::from_arg_matches(matches)?;
        Ok(RecordFlags { policy, dead_letters_given: dead_letters_given(matches) })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.policy.update_from_arg_matches(matches)?;
        self.dead_letters_given |= dead_letters_given(matches);
        Ok(())
    }
}

fn dead_letters_given(matches: &clap::ArgMatches) -> bool {
    matches.value_source("dead_letters") == Some(clap::parser::ValueSource::CommandLine)
}

impl ScoreArgs {
    /// The checkpoint's files and the records' files.
    fn inputs(&self) -> anyhow::Result<Vec<Named>> {
        let mut inputs = paths::tree_files("--checkpoint", &self.checkpoint)?;
        inputs.extend(paths::data_files("--data", &self.data)?);
        Ok(inputs)
    }

    /// The options of a scoring pass, its dead letters in `dead_letters` unless
    /// `--dead-letters` was given.
    fn options(&self, labeled: bool, dead_letters: PathBuf) -> anyhow::Result<tiderec::predict::ScoreOptions> {
        self.records.policy.validate()?;
        let mut records = self.records.policy.clone();
        if !self.records.dead_letters_given {
            records.dead_letters = dead_letters;
        }
        Ok(tiderec::predict::ScoreOptions {
            checkpoint: self.checkpoint.clone(),
            data: self.data.clone(),
            batch_size: self.batch_size,
            labeled,
            records,
            span: (0.0, 1.0),
            own_dead_letters: !self.records.dead_letters_given,
        })
    }
}

#[derive(Args)]
pub(crate) struct EvalArgs {
    #[command(flatten)]
    score: ScoreArgs,
    /// Score only the last fraction F of every file: the records `train --eval-fraction F`
    /// evaluated on (its split of line files by bytes, of Parquet files as replay splits them).
    #[arg(long, value_name = "F", value_parser = Range::<f64>::above("eval_fraction", 0.0, 1.0))]
    eval_fraction: Option<f64>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct PredictArgs {
    #[command(flatten)]
    score: ScoreArgs,
    /// Scores file: FILE.csv or FILE.parquet (columns file, position, score, and label for labeled input).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Replace --out, and its default dead-letter file OUT.dead-letters.tsv, when they exist
    /// (refused otherwise, also when one appears during the run).
    #[arg(long)]
    overwrite: bool,
    /// The records have no label column (test files such as Criteo's test.txt or Avazu's test).
    #[arg(long)]
    unlabeled: bool,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
}

/// `tiderec export`: writes a checkpoint's model as a serving snapshot.
pub(crate) fn run_export(a: ExportArgs) -> anyhow::Result<()> {
    use tiderec::serving::TableLayout;
    use tiderec_sinks::checkpoint::export::{
        remove_stale_staging, write_serving_staged, StagedError, CONFIG_FILE, MODEL_FILE,
    };
    let outputs = [&a.out, &a.out.join(MODEL_FILE), &a.out.join(CONFIG_FILE)].map(|p| Named::new("--out", p));
    paths::check_outputs(&paths::tree_files("--checkpoint", &a.checkpoint)?, &outputs)?;
    paths::check_outside_checkpoints(&Named::new("--checkpoint", &a.checkpoint), &outputs[0])?;
    for file in &outputs[1..] {
        paths::check_new(file, a.overwrite)?;
    }
    report_stale_staging(&remove_stale_staging(&a.out));
    let layout = if a.compact { TableLayout::Listed } else { TableLayout::Whole };
    // Written whole into a staging directory in --out, then moved into place: without
    // --overwrite over nothing, whenever a file appeared at its name.
    let staged =
        write_serving_staged(&a.out, a.overwrite, |staging| tiderec::serving::export(&a.checkpoint, staging, layout));
    let s = match staged {
        Ok(s) => s,
        Err(StagedError::Exists { path }) => return Err(paths::PathError::Exists { flag: "--out".into(), path }.into()),
        Err(StagedError::Write(e)) => return Err(anyhow::Error::new(e).context("export failed")),
        Err(StagedError::Sink(e)) => return Err(anyhow::Error::new(e).context("export failed")),
    };
    let rows = match layout {
        TableLayout::Whole => format!("{} embedding rows", s.embedding_rows),
        TableLayout::Listed => format!("{} listed embedding rows of {}", s.embedding_rows, s.table_rows),
    };
    println!("exported step {}: {} dense parameters, {rows} to {}", s.step, s.dense_params, a.out.display());
    Ok(())
}

/// Says on stderr which staging directories of killed exports were removed, in one line,
/// and warns of each that could not be.
fn report_stale_staging(stale: &tiderec_sinks::checkpoint::export::StaleStaging) {
    if !stale.removed.is_empty() {
        let names: Vec<String> = stale.removed.iter().map(|p| p.display().to_string()).collect();
        match names.len() {
            1 => eprintln!("removed {}, the staging directory of a killed export", names[0]),
            n => eprintln!("removed {n} staging directories of killed exports: {}", names.join(", ")),
        }
    }
    for e in &stale.failed {
        eprintln!("warning: cannot remove the staging directory of a killed export: {e}");
    }
}

/// `tiderec serve`: scores records over HTTP until a stop signal.
pub(crate) fn run_serve(a: ServeArgs) -> anyhow::Result<()> {
    let mut options = tiderec::serve::ServeOptions::new(a.checkpoint, a.addr);
    options.threads = a.threads;
    options.max_connections_per_ip = a.max_connections_per_ip;
    options.max_records = a.max_records;
    options.max_body_bytes = a.max_body_bytes;
    options.max_body_memory = a.max_body_memory;
    options.read_timeout = range::seconds("read_timeout", a.read_timeout)?;
    options.limits.max_batch = a.max_batch;
    options.limits.max_wait = std::time::Duration::from_micros(a.max_wait_us);
    let reload_every = range::seconds("reload_every", a.reload_every)?;
    options.reload_every = (!reload_every.is_zero()).then_some(reload_every);
    let stop = tiderec::stop::stop_flag()?;
    tiderec::serve::run(&options, &stop).context("serve failed")?;
    Ok(())
}

/// `tiderec eval`: scores labeled records and prints the metrics.
pub(crate) fn run_eval(a: EvalArgs) -> anyhow::Result<()> {
    let mut options = a.score.options(true, tiderec::predict::EVAL_DEAD_LETTERS.into())?;
    let dead_letters = Named::new("--dead-letters", &options.records.dead_letters);
    paths::check_outputs(&a.score.inputs()?, &[dead_letters])?;
    if let Some(f) = a.eval_fraction {
        options = options.held_out(f);
    }
    let r = tiderec::predict::eval(&options).context("eval failed")?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "step {}: {} samples, AUC {}, logloss {}, accuracy {}, NE {}, calibration {}, PR-AUC {}, GAUC {}, \
             {} bad records",
            r.step,
            r.samples,
            fmt_opt(r.auc),
            fmt_opt(r.logloss),
            fmt_opt(r.accuracy),
            fmt_opt(r.ne),
            fmt_opt(r.calibration),
            fmt_opt(r.pr_auc),
            fmt_opt(r.gauc),
            r.bad_records
        );
    }
    Ok(())
}

/// `tiderec predict`: writes one score per record.
pub(crate) fn run_predict(a: PredictArgs) -> anyhow::Result<()> {
    let out = Named::new("--out", &a.out);
    let options = a.score.options(!a.unlabeled, tiderec::predict::dead_letters_beside(&a.out))?;
    let dead_letters = Named::new("--dead-letters", &options.records.dead_letters);
    paths::check_outputs(&a.score.inputs()?, &[out.clone(), dead_letters.clone()])?;
    let checkpoint = Named::new("--checkpoint", &a.score.checkpoint);
    for output in [&out, &dead_letters] {
        paths::check_outside_checkpoints(&checkpoint, output)?;
    }
    paths::check_new(&out, a.overwrite)?;
    let r = tiderec::predict::predict(&options, &a.out, a.overwrite).context("predict failed")?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "step {}: scored {} records in {:.2} s ({:.0} records/s), {} bad records{}; scores in {}",
            r.step,
            r.records,
            r.seconds,
            r.records_per_sec,
            r.bad_records,
            if r.bad_records > 0 {
                format!(" (listed in {})", options.records.dead_letters.display())
            } else {
                String::new()
            },
            a.out.display()
        );
    }
    Ok(())
}
