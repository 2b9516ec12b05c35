//! `tiderec convert`: raw record files → featurized Parquet files.
//!
//! The input is read by the same readers as `tiderec train --data` (one
//! reader over all files, in order), so a converted dataset holds exactly the
//! samples training would see, hashed with the same `--seed` and table sizes
//! (`--buckets`, `table_sizes`, or the spec's buckets). Samples go through in
//! chunks of [`CHUNK_ROWS`] to a [`ParquetWriter`]: memory stays bounded by one
//! chunk plus one row group whatever the input size.
//!
//! Where the records name a user (a spec's `user` column, amazon-dien's and
//! taobao-behavior's user), each row keeps its user's group key (the
//! `_group` column), so training on the files reports GAUC as training on the
//! records does.
//!
//! Malformed lines are counted and written to the dead-letter file exactly as
//! in training, and conversion goes on; under `--on-bad-record fail` it stops
//! with the reader's `file:line` error. A conversion that fails (that error,
//! an over-budget input, a full disk) removes every Parquet file it wrote,
//! complete or not: a failed conversion leaves no partial dataset.
//!
//! One conversion at a time per output directory: before reading any input,
//! `convert` locks `DIR/.lock` ([`crate::dir_lock`]) until it returns; a
//! second conversion into the same directory is refused at start, naming the
//! one that holds it, instead of replacing its files as it goes. Taking the
//! lock creates a missing `DIR`; a conversion that fails then removes the
//! `DIR` it created (and the missing parents it created), lock file and all,
//! when nothing but the lock file is left in it
//! ([`DirLock::remove_created`]); in a `DIR` that was there before it removes
//! only the files it wrote. The lock file stays beside a converted
//! dataset (and in a `DIR` that existed), naming its last holder; readers of
//! the dataset list only `*.parquet` files (see the [`crate::dir_lock`] docs
//! for why it is not removed).
//!
//! SIGINT/SIGTERM ([`crate::stop`]) stops after the chunk being written: the
//! output is closed as after the last input line, so the directory holds
//! complete Parquet files with the first [`ConvertSummary::rows`] samples of
//! the input (a valid dataset, reported as interrupted), and no temporary
//! file. A second signal exits at once with status 130. Files get their
//! names only when the conversion ends, so a conversion that exits that way,
//! or is killed, leaves its files under hidden temporary names and no
//! `*.parquet` file: never a dataset that looks complete with only its first
//! files' rows. The next conversion into the directory removes them.

use crate::config::DataSpec;
use crate::data::{CriteoOptions, IndexedSamples, WorkerData};
use crate::dir_lock::{DirLock, LOCK_FILE};
use crate::progress::{Progress, Unit};
use crate::{PipelineError, TrainSettings};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tiderec_operators::bad_record::{BadRecordCounts, DeadLetterSink};
use tiderec_operators::spec::Pooling;
use tiderec_operators::{Batch, ConfigError};
use tiderec_sinks::dead_letters::SharedDeadLetters;
use tiderec_sources::parquet::schema::LineSource;
use tiderec_sources::parquet::{ParquetWriter, SchemaDescription, WriterOptions};

/// Samples read and written at a time.
pub const CHUNK_ROWS: usize = 8192;

/// What to convert, and how.
#[derive(Clone, Debug)]
pub struct ConvertSettings {
    /// The input as `data` (`criteo:`, `avazu:` or `csv:` with `spec`), and
    /// the feature settings: `seed`, `buckets`/`table_sizes`, `spec`,
    /// `max_line_bytes`, `on_bad_record`, `dead_letters`, `progress`.
    pub input: TrainSettings,
    /// Output directory.
    pub out: PathBuf,
    /// Row groups, files, compression.
    pub writer: WriterOptions,
}

/// What a conversion did.
#[derive(Clone, Debug, Serialize)]
pub struct ConvertSummary {
    /// Output directory.
    pub out: String,
    /// Rows written.
    pub rows: u64,
    /// Files written.
    pub files: usize,
    /// Row groups written.
    pub row_groups: usize,
    /// Malformed input records skipped.
    pub bad_records: u64,
    /// Skipped records by reason.
    pub bad_records_by_reason: BTreeMap<String, u64>,
    /// Input bytes.
    pub bytes_in: u64,
    /// Output bytes (all files).
    pub bytes_out: u64,
    /// Wall time.
    pub seconds: f64,
    /// A signal stopped the conversion: the output holds only the first `rows` samples.
    pub interrupted: bool,
}

/// `parquet:DIR` → `DIR`.
pub fn parse_target(key: &str, s: &str) -> Result<PathBuf, PipelineError> {
    match s.split_once(':') {
        Some(("parquet", dir)) if !dir.is_empty() => Ok(PathBuf::from(dir)),
        _ => Err(PipelineError::config(key, format!("`{s}` is not `parquet:DIR`"))),
    }
}

/// Converts `settings.input.data.source` into Parquet files in `settings.out`.
pub fn convert(settings: &ConvertSettings) -> Result<ConvertSummary, PipelineError> {
    let start = Instant::now();
    // Only the input and feature settings matter; neutralize the training-only ones
    // (the model too: LR takes any shape, with or without dense features).
    let input = {
        let mut s = settings.input.clone();
        s.model.kind = crate::settings::ModelKind::Lr;
        s.data.eval = None;
        s.data.eval_fraction = 0.0;
        s.cluster.workers = 1;
        s.cluster.processes = 1;
        s.cluster.process = 0;
        s.cluster.hosts = None;
        s
    };
    let resolved = input.validate().map_err(|e| match e {
        PipelineError::Config(ConfigError { key, reason }) if key == "data" => PipelineError::config("from", reason),
        e => e,
    })?;
    if let Some((i, _)) = resolved.spec.iter().flat_map(|s| s.pooled_lists()).find(|(_, l)| l.pooling == Pooling::Mean)
    {
        return Err(PipelineError::config(
            format!("spec.list[{i}].pooling"),
            "Parquet files keep no pooling weights: convert `mean` lists as `sum` and train from the text files",
        ));
    }
    let description = match (&resolved.data, &resolved.spec) {
        (DataSpec::Criteo(_), _) => SchemaDescription::criteo(resolved.data_table_sizes(), input.hash_seed()),
        (DataSpec::Avazu(_), _) => SchemaDescription::avazu(resolved.data_table_sizes(), input.hash_seed()),
        (DataSpec::Csv(_) | DataSpec::TaobaoAd(_), Some(spec)) => SchemaDescription::from_spec(spec, input.hash_seed()),
        (DataSpec::AmazonDien(_) | DataSpec::TaobaoBehavior(_), _) => {
            SchemaDescription::behavior(resolved.data.format(), resolved.data_table_sizes(), input.hash_seed())
        }
        (other, _) => {
            return Err(PipelineError::config(
                "from",
                format!(
                    "cannot convert `{}` data: convert reads criteo, avazu, csv, taobao-ad, amazon-dien and \
                     taobao-behavior files",
                    other.format()
                ),
            ))
        }
    };
    // Held until the conversion returns: no other conversion writes the directory meanwhile.
    // Taking it creates a missing directory, so the writer below always finds it there: the
    // lock, not the writer, knows whether this conversion made it.
    let lock = DirLock::acquire(&settings.out, LOCK_FILE, "tiderec convert")?;
    let converted = write(settings, &input, &resolved, description, start);
    if converted.is_err() {
        // The writer removed every file it made; a directory made here goes too (lock file
        // and all) when nothing else is in it.
        lock.remove_created();
    }
    converted
}

/// The conversion once the directory is locked: reads the input and writes the files.
fn write(
    settings: &ConvertSettings,
    input: &TrainSettings,
    resolved: &crate::config::Resolved,
    description: SchemaDescription,
    start: Instant,
) -> Result<ConvertSummary, PipelineError> {
    let options = CriteoOptions::for_run(resolved, input)?;
    let dead = SharedDeadLetters::file(input.data.records.dead_letters.clone());
    let sink: Box<dyn DeadLetterSink> = Box::new(dead.clone());
    // Taobao behaviour logs become samples all at once (as in training); they are then
    // read back in chunks like any indexed data.
    // Their budget counts the log's good lines, not the samples derived from them.
    let (derived, derived_bad, derived_records) = match &resolved.data {
        DataSpec::TaobaoBehavior(paths) => {
            let table = crate::run::behavior_table(paths, input, resolved, &dead)?;
            let rows = table.samples.len() as u64;
            (Some((IndexedSamples::Table(Arc::new(table.samples)), rows)), table.bad, Some(table.records))
        }
        _ => (None, BadRecordCounts::default(), None),
    };
    let indexed = derived.as_ref().map(|(t, rows)| (t, 0..*rows));
    let mut data = WorkerData::for_spec(&resolved.data, indexed, (0.0, 1.0), &options, CHUNK_ROWS, 0, 1, Some(sink))?;
    // Rows of line files keep their source positions: replay splits them across workers
    // exactly as training from the raw files does.
    let mut description = description;
    description.lines = data.record_line_starts().map(|file_bytes| LineSource { file_bytes });
    // Rows keep their user where the records name one (GAUC when training on the files).
    description.groups = matches!(resolved.data, DataSpec::AmazonDien(_) | DataSpec::TaobaoBehavior(_))
        || resolved.spec.as_ref().is_some_and(|s| s.user.is_some());
    let sequences = description.sequences.len();
    let mut writer = ParquetWriter::create(&settings.out, description, settings.writer)?;
    let (num_dense, num_sparse) = resolved.shape;
    let mut batch = Batch::with_sequences(num_dense, num_sparse, sequences);
    let bytes_in = match &resolved.data {
        // Derived up front: the input is the log files.
        DataSpec::TaobaoBehavior(paths) => {
            paths.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum()
        }
        _ => data.bytes_progress().map_or(0, |(_, total)| total),
    };
    let mut progress = Progress::with_unit(input.run.progress, Some(bytes_in), Unit::Bytes);
    let stop = crate::stop::stop_flag()?;
    let mut interrupted = false;
    let result = loop {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            interrupted = true;
            break Ok(());
        }
        match data.next_micro_batch(&mut batch) {
            Ok(0) => break Ok(()),
            Ok(_) => {
                let written = if writer.description().lines.is_some() {
                    writer.write_with_line_starts(&batch, &data.take_line_starts())
                } else {
                    writer.write(&batch)
                };
                if let Err(e) = written {
                    break Err(PipelineError::from(e));
                }
            }
            Err(e) => break Err(e),
        }
        let bad = data.bad_counts().total();
        let msg = format!("{} rows  {bad} bad records", writer.rows());
        progress.advance(data.bytes_progress().map_or(0, |(done, _)| done), &msg);
    };
    progress.finish();
    let flushed = data.flush();
    let dead_finished = dead.lock().finish();
    let mut bad = data.bad_counts();
    bad.merge(&derived_bad);
    // A mostly malformed input, or any error, leaves no files behind.
    let tally = crate::budget::Tally { good: derived_records.unwrap_or(writer.rows()), bad: bad.to_array() };
    let checked = result.and(flushed).and(dead_finished.map_err(PipelineError::from)).and_then(|()| {
        crate::budget::check(
            crate::budget::Split::Convert,
            &input.data.source,
            tally,
            input.data.records.max_bad_fraction,
            &input.data.records.dead_letters,
        )
    });
    if let Err(e) = checked {
        writer.abort();
        return Err(e);
    }
    let written = writer.finish()?;
    let bytes_out = written.files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
    Ok(ConvertSummary {
        out: settings.out.display().to_string(),
        rows: written.rows,
        files: written.files.len(),
        row_groups: written.row_groups,
        bad_records: bad.total(),
        bad_records_by_reason: bad.by_reason,
        bytes_in,
        bytes_out,
        seconds: start.elapsed().as_secs_f64(),
        interrupted,
    })
}
