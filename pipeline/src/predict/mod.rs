//! `tiderec predict` and `tiderec eval`: a checkpoint's model scoring records.
//!
//! Both read the records of `--data FORMAT:PATH[,PATH…]` with the
//! checkpoint's feature pipeline ([`FeaturePipeline`]; data of another format
//! is refused, naming the difference), in file order, in batches, and score
//! each batch with the one [`Scorer`]. `predict` writes one row per record —
//! its file, its position (1-based line of a text file, 0-based row of a
//! Parquet file), its probability and, for labeled input, its label — to CSV
//! or Parquet; `eval` reduces the same probabilities to AUC, log loss, NE,
//! calibration, PR-AUC and, where the pipeline names a user column, GAUC.
//!
//! Invariants:
//! * Nothing is silently dropped: every record of the input is scored or is a
//!   bad record (counted, written to the dead-letter file, held to
//!   `--max-bad-fraction`); header and empty lines are neither.
//! * Every score is a finite probability: a record the model scores `NaN` or infinite
//!   (values far outside those it was trained on overflow its layers) stops the run with
//!   an error naming its file and position.
//! * The output is written under a temporary name and renamed only when the
//!   run succeeded, so a failed run (an error or a panic) leaves no partial output file.
//! * Without `overwrite`, `predict` replaces no file: an existing scores file is refused
//!   before anything is read, and one made while the run works is refused when the scores
//!   are committed ([`PathError::Exists`] either way; the file found is kept). With it the
//!   scores file is replaced.
//! * Records of another shape than the model reads (dense features, sparse or sequence
//!   fields) are refused before the first forward pass, with an error naming the input and
//!   both shapes, also for a checkpoint that records no feature pipeline.
//! * A command's own dead-letter file ([`ScoreOptions::own_dead_letters`]: `predict`'s
//!   beside its scores file, `eval`'s [`EVAL_DEAD_LETTERS`]) lists the malformed records of
//!   the last run that wrote its outputs, or is absent when that run had none: a run that
//!   dead-letters nothing removes one an earlier run left (`predict` when its scores are
//!   committed, `eval` when its pass succeeded). `predict` without `overwrite` treats it as
//!   it treats the scores file: one that exists is refused before anything is read, and one
//!   made during the run is neither truncated nor removed. A dead-letter file the caller
//!   named is created when the first record arrives (truncating one that is there) and
//!   otherwise left alone, as in training.
//! * Deterministic: one thread, records in file order, batches of a fixed size.

mod eval;
mod output;
pub mod scorer;

pub use eval::{eval, EvalReport};
pub use output::{ScoreFormat, ScoreSink};
pub use scorer::Scorer;

use crate::budget::{self, Split, Tally};
use crate::config::DataSpec;
use crate::error::CheckpointAction;
use crate::feature_pipeline::FeaturePipeline;
use crate::paths::PathError;
use crate::settings::RecordPolicy;
use crate::PipelineError;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tiderec_operators::bad_record::{BadRecordCounts, DeadLetterSink};
use tiderec_operators::format::LineFormat;
use tiderec_operators::Batch;
use tiderec_sinks::dead_letters::{FileDeadLetters, SharedDeadLetters};
use tiderec_sources::lines::{LineReader, ReaderOptions, RecordPosition};
use tiderec_sources::parquet::ParquetReader;

/// How to read and score records.
#[derive(Clone, Debug)]
pub struct ScoreOptions {
    /// A `ckpt-<step>` directory, or a checkpoint directory (its newest valid checkpoint).
    pub checkpoint: PathBuf,
    /// `FORMAT:PATH[,PATH…]`.
    pub data: String,
    /// Records per forward pass.
    pub batch_size: usize,
    /// The records carry their label column.
    pub labeled: bool,
    /// Malformed records: skip or fail, the dead-letter file, the budget, the longest line.
    pub records: RecordPolicy,
    /// The part of every file read, as fractions `(from, to)`: of each line file's bytes
    /// (line-aligned, as `train` splits them), of each `convert`ed file's source bytes, or of
    /// the rows of every row group of other Parquet files. `(0, 1)` reads everything;
    /// [`ScoreOptions::held_out`] makes the part `train --eval-fraction F` evaluates on.
    pub span: (f64, f64),
    /// `records.dead_letters` is the command's own file, not one the caller named:
    /// `predict`'s beside its scores file ([`dead_letters_beside`]), `eval`'s
    /// [`EVAL_DEAD_LETTERS`]. A run that dead-letters nothing removes one an earlier run left
    /// there, and `predict` without `overwrite` refuses an existing one (see the
    /// [module docs](self)).
    pub own_dead_letters: bool,
}

/// Where `eval` (and a pass of [`ScoreOptions::new`]) writes malformed records unless told:
/// a file of its own, never the one a training run in the same directory writes.
pub const EVAL_DEAD_LETTERS: &str = "tiderec-eval-dead-letters.tsv";

/// Where `predict` writes the malformed records of its scores file `out` unless told:
/// beside it, `OUT.dead-letters.tsv` (`scores.csv.dead-letters.tsv`).
pub fn dead_letters_beside(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".dead-letters.tsv");
    out.with_file_name(name)
}

impl ScoreOptions {
    /// Defaults for everything but the checkpoint and the data; the dead letters go to
    /// [`EVAL_DEAD_LETTERS`], the scoring pass's own file.
    pub fn new(checkpoint: &Path, data: &str) -> Self {
        let d = crate::TrainSettings::default();
        ScoreOptions {
            checkpoint: checkpoint.to_path_buf(),
            data: data.to_string(),
            batch_size: d.run.eval_batch_size,
            labeled: true,
            records: RecordPolicy { dead_letters: EVAL_DEAD_LETTERS.into(), ..d.data.records },
            span: (0.0, 1.0),
            own_dead_letters: true,
        }
    }

    /// Reads only the part of the data that `train --eval-fraction fraction` held out, the
    /// last `fraction` of every file (0 < `fraction` ≤ 1).
    pub fn held_out(self, fraction: f64) -> Self {
        ScoreOptions { span: (1.0 - fraction, 1.0), ..self }
    }
}

/// The records of the data, in file order, each with its file and position.
enum Records {
    Lines(LineReader<Box<dyn LineFormat + Send>>),
    Parquet(ParquetReader),
}

impl Records {
    fn next_batch(&mut self, out: &mut Batch, max: usize) -> Result<usize, PipelineError> {
        Ok(match self {
            Records::Lines(r) => r.next_batch(out, max)?,
            Records::Parquet(r) => r.next_batch(out, max)?,
        })
    }

    fn take_positions(&mut self) -> Vec<RecordPosition> {
        match self {
            Records::Lines(r) => r.take_positions(),
            Records::Parquet(r) => r.take_positions(),
        }
    }

    /// A record's file and position in words: `FILE line N` of a text file, `FILE row N` of
    /// a Parquet file (`names` are the files).
    fn locate(&self, p: &RecordPosition, names: &[String]) -> String {
        let unit = match self {
            Records::Lines(_) => "line",
            Records::Parquet(_) => "row",
        };
        format!("{} {unit} {}", names[p.file], p.position)
    }

    fn bad_counts(&self) -> BadRecordCounts {
        match self {
            Records::Lines(r) => r.bad_counts().clone(),
            Records::Parquet(r) => r.bad_counts().clone(),
        }
    }
}

/// What one scoring pass did.
#[derive(Clone, Debug, Serialize)]
pub struct ScoreSummary {
    /// Step of the checkpoint.
    pub step: u64,
    /// Records scored.
    pub records: u64,
    /// Malformed records skipped (and dead-lettered).
    pub bad_records: u64,
    /// Skipped records by reason.
    pub bad_records_by_reason: std::collections::BTreeMap<String, u64>,
    /// Seconds from opening the checkpoint to the last score.
    pub seconds: f64,
    /// Records scored per second.
    pub records_per_sec: f64,
}

/// The checkpoint's model and pipeline, and the data's records read with that pipeline.
fn open(
    options: &ScoreOptions,
    sink: &SharedDeadLetters,
) -> Result<(u64, Scorer, Records, Vec<String>), PipelineError> {
    let model = crate::serving::load(&options.checkpoint)?;
    let data = DataSpec::parse("data", &options.data)?;
    let pipeline = match &model.pipeline {
        Some(p) => {
            p.check_data(&data).map_err(|differences| {
                PipelineError::config(
                    "data",
                    format!(
                        "{} cannot be featurized as the checkpoint's records: {}",
                        options.data,
                        differences.join("; ")
                    ),
                )
            })?;
            p.clone()
        }
        None => {
            let max_len = match &model.config.model {
                tiderec_operators::nn::ModelConfig::Dien(d) => Some(d.max_len),
                _ => None,
            };
            let assumed = FeaturePipeline::assumed(&data, model.config.seed, &model.config.table_sizes, max_len)
                .ok_or_else(|| {
                    PipelineError::config(
                        "checkpoint",
                        format!(
                            "{} records no feature pipeline (an older checkpoint), and `{}` data cannot be \
                             featurized without one (its spec is unknown)",
                            options.checkpoint.display(),
                            data.format()
                        ),
                    )
                })?;
            assumed.check_model(&model.config).map_err(|differences| {
                unfit(
                    options,
                    model.step,
                    format!(
                        "it records no feature pipeline (an older checkpoint), and the records of {} do not make \
                         its model's inputs: {}",
                        options.data,
                        differences.join("; ")
                    ),
                )
            })?;
            eprintln!(
                "warning: {} records no feature pipeline (an older checkpoint): featurizing {} as `{}` with hash \
                 seed {} and the checkpoint's table sizes, unchecked",
                options.checkpoint.display(),
                options.data,
                data.format(),
                model.config.seed
            );
            assumed
        }
    };
    let step = model.step;
    let (records, names) = match &data {
        DataSpec::Parquet(p) => {
            if !options.labeled {
                return Err(PipelineError::config(
                    "unlabeled",
                    "Parquet files from `tiderec convert` always carry labels",
                ));
            }
            let sizes = pipeline.table_sizes.clone();
            let names = p.0.paths().map(|p| p.display().to_string()).collect();
            let sink: Box<dyn DeadLetterSink> = Box::new(sink.clone());
            let mut reader = ParquetReader::new(p.0.clone(), options.span, 0, 1, 0, sizes)?
                .with_bad_records(options.records.on_bad_record, Some(sink));
            let max_len = model.config.model.max_sequence_len();
            if max_len > 0 {
                reader = reader.with_max_len(max_len);
            }
            reader.record_positions();
            (Records::Parquet(reader), names)
        }
        DataSpec::Criteo(paths)
        | DataSpec::Avazu(paths)
        | DataSpec::Csv(paths)
        | DataSpec::TaobaoAd(paths)
        | DataSpec::AmazonDien(paths) => {
            let format = pipeline.line_format(options.labeled)?.ok_or_else(|| {
                PipelineError::config("data", format!("`{}` records are not read line by line", data.format()))
            })?;
            let reader_options =
                ReaderOptions { max_line_bytes: options.records.max_line_bytes, policy: options.records.on_bad_record };
            let sink: Box<dyn DeadLetterSink> = Box::new(sink.clone());
            let mut reader = LineReader::open_format(paths, options.span, 0, 1, format, reader_options, Some(sink))?;
            reader.record_positions();
            (Records::Lines(reader), paths.iter().map(|p| p.display().to_string()).collect())
        }
        DataSpec::TaobaoBehavior(_) => {
            return Err(PipelineError::config(
                "data",
                "taobao-behavior logs are not scored record by record: each sample is derived from a user's \
                 earlier events, so no score belongs to one line; convert the derived samples \
                 (`tiderec convert --from taobao-behavior:PATH`) and score the Parquet files",
            ))
        }
        DataSpec::Synthetic | DataSpec::SyntheticBehavior => {
            return Err(PipelineError::config(
                "data",
                "the synthetic generators have no records to key scores by; score files (FORMAT:PATH)",
            ))
        }
    };
    let scorer = Scorer::new(model, &pipeline)?;
    Ok((step, scorer, records, names))
}

/// One batch of scored records.
#[derive(Clone, Copy, Debug)]
pub struct Scored<'a> {
    /// The input files' names (`positions` index them).
    pub names: &'a [String],
    /// Each record's file and position.
    pub positions: &'a [RecordPosition],
    /// Each record's probability.
    pub probs: &'a [f32],
    /// Each record's label (0 for unlabeled input).
    pub labels: &'a [f32],
    /// Each record's user ([`group_key`](tiderec_operators::metrics::group_key)) when the
    /// pipeline names a user column; empty otherwise.
    pub groups: &'a [u64],
}

/// Reads and scores every record of `options.data`, handing each batch's records
/// ([`Scored`]) to `on_batch`; the bad-record budget is checked at the end. Malformed
/// records go to `options.records.dead_letters`, created when the first one arrives; an
/// earlier run's file there is left as it is when none does.
pub fn score(
    options: &ScoreOptions,
    split: Split,
    on_batch: impl FnMut(Scored<'_>) -> Result<(), PipelineError>,
) -> Result<ScoreSummary, PipelineError> {
    pass(options, split, &SharedDeadLetters::file(options.records.dead_letters.clone()), on_batch)
}

/// [`score`], its malformed records written to `sink`.
fn pass(
    options: &ScoreOptions,
    split: Split,
    sink: &SharedDeadLetters,
    mut on_batch: impl FnMut(Scored<'_>) -> Result<(), PipelineError>,
) -> Result<ScoreSummary, PipelineError> {
    let start = Instant::now();
    let (step, mut scorer, mut records, names) = open(options, sink)?;
    let (dense, sparse, sequences) = match &records {
        Records::Lines(r) => {
            let (dense, sparse) = r.format().shape();
            (dense, sparse, r.format().num_sequences())
        }
        Records::Parquet(r) => {
            let d = r.dataset().description();
            let (dense, sparse) = d.shape();
            (dense, sparse, d.sequences.len())
        }
    };
    if let Some(why) = scorer.shape_mismatch(dense, sparse, sequences) {
        return Err(unfit(options, step, format!("{}: {why}", options.data)));
    }
    let mut batch = Batch::with_sequences(dense, sparse, sequences);
    let mut scored = 0u64;
    loop {
        batch.clear();
        if records.next_batch(&mut batch, options.batch_size.max(1))? == 0 {
            break;
        }
        let positions = records.take_positions();
        let labels = batch.labels.clone();
        let groups = std::mem::take(&mut batch.groups);
        let probs = scorer.probabilities(&mut batch)?;
        debug_assert_eq!(positions.len(), probs.len());
        if let Some(k) = probs.iter().position(|p| !p.is_finite()) {
            return Err(non_finite(options, step, records.locate(&positions[k], &names), probs[k]));
        }
        on_batch(Scored { names: &names, positions: &positions, probs: &probs, labels: &labels, groups: &groups })?;
        scored += probs.len() as u64;
    }
    sink.lock().finish()?;
    let bad = records.bad_counts();
    let tally = Tally { good: scored, bad: bad.to_array() };
    budget::check(split, &options.data, tally, options.records.max_bad_fraction, &options.records.dead_letters)?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(ScoreSummary {
        step,
        records: scored,
        bad_records: bad.total(),
        bad_records_by_reason: bad.by_reason.clone(),
        seconds,
        records_per_sec: scored as f64 / seconds.max(1e-9),
    })
}

/// The error of records of `options.data` that the model of the checkpoint of `step` does
/// not read (`reason` says why).
fn unfit(options: &ScoreOptions, step: u64, reason: String) -> PipelineError {
    PipelineError::Checkpoint {
        action: CheckpointAction::Score,
        path: Some(options.checkpoint.clone()),
        step: Some(step),
        worker: None,
        reason,
        source: None,
    }
}

/// The error of the record at `at` whose probability `score` is not finite.
fn non_finite(options: &ScoreOptions, step: u64, at: String, score: f32) -> PipelineError {
    PipelineError::Checkpoint {
        action: CheckpointAction::Score,
        path: Some(options.checkpoint.clone()),
        step: Some(step),
        worker: None,
        reason: format!(
            "{at}: the model's score is {score}, not a finite number (its values may be far outside those the model \
             was trained on)"
        ),
        source: None,
    }
}

/// Scores `options.data` into `out` (`.csv` or `.parquet`), replacing an existing `out`
/// (and the run's own dead-letter file) only with `overwrite`; see the [module docs](self).
pub fn predict(options: &ScoreOptions, out: &Path, overwrite: bool) -> Result<ScoreSummary, PipelineError> {
    let format = ScoreFormat::of_path(out)?;
    let mut scores = ScoreSink::create(out, format, options.labeled, overwrite)?;
    let dead_letters = &options.records.dead_letters;
    let keep_dead_letters = options.own_dead_letters && !overwrite;
    if keep_dead_letters && std::fs::symlink_metadata(dead_letters).is_ok() {
        return Err(PathError::Exists { flag: "--dead-letters".into(), path: dead_letters.clone() }.into());
    }
    let mut file = FileDeadLetters::new(dead_letters.clone());
    if keep_dead_letters {
        file = file.never_replacing();
    }
    let sink = SharedDeadLetters::new(file);
    let result = pass(options, Split::Predict, &sink, |b| {
        for (k, (p, &score)) in b.positions.iter().zip(b.probs).enumerate() {
            scores.push(&b.names[p.file], p.position, score, b.labels[k])?;
        }
        Ok(())
    });
    match result {
        Ok(summary) => {
            scores.commit()?;
            if options.own_dead_letters && overwrite {
                sink.lock().remove_unwritten()?;
            }
            Ok(summary)
        }
        Err(e) => {
            scores.abandon();
            Err(e)
        }
    }
}
