//! `tiderec bench replay`: batch replay from Parquet against the raw Criteo TSV, in one run.
//!
//! 1. Converts a Criteo file to Parquet in a temporary directory (timed).
//! 2. Decode only: the Parquet reader's rows/s (footers read once; each pass
//!    decodes every row group into `Batch`es) against the TSV reader's
//!    lines/s over the same file (memory-mapped, page cache warm). Each is
//!    measured twice, alternating, for `seconds` each; the best pass counts.
//! 3. Training: `tiderec train` samples/s for the same model, seed, batch and
//!    steps from the Parquet files and from the TSV file (each run twice,
//!    alternating; the best counts). A small file is replayed over as many
//!    epochs as the steps need. Every worker needs row groups: with `W`
//!    workers, convert into at least `W` row groups (`--row-group-rows`).
//!
//! Ratios are Parquet over TSV: above 1 means Parquet is faster.

use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tiderec::convert::{convert, ConvertSettings};
use tiderec::{PipelineError, TrainSettings};
use tiderec_operators::bad_record::BadRecordPolicy;
use tiderec_operators::Batch;
use tiderec_sources::criteo::{CriteoConfig, CriteoFeatures, CriteoReader, NUM_DENSE, NUM_SPARSE};
use tiderec_sources::parquet::{ParquetDataset, ParquetReader, WriterOptions};

/// Settings of `tiderec bench replay`.
#[derive(Clone, Debug)]
pub struct ReplayBench {
    /// The Criteo TSV file.
    pub criteo: PathBuf,
    /// Rows per row group of the converted file.
    pub row_group_rows: usize,
    /// Rows per table.
    pub buckets: u64,
    /// Seconds per decode measurement.
    pub seconds: f64,
    /// Model trained in the training comparison.
    pub model: String,
    /// Global batch size of the training comparison.
    pub batch_size: usize,
    /// Worker threads of the training comparison.
    pub workers: usize,
    /// Training steps per run.
    pub steps: u64,
}

/// Result of `tiderec bench replay`.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayBenchResult {
    /// The Criteo file.
    pub file: String,
    /// Rows converted.
    pub rows: u64,
    /// Row groups of the converted file.
    pub row_groups: usize,
    /// Size of the TSV file.
    pub tsv_bytes: u64,
    /// Size of the Parquet file(s).
    pub parquet_bytes: u64,
    /// Conversion rows/s (parse, featurize, encode, zstd, write).
    pub convert_rows_per_sec: f64,
    /// Parquet reader rows/s, decode into batches only.
    pub parquet_read_rows_per_sec: f64,
    /// Criteo TSV reader lines/s, parse into batches only.
    pub tsv_read_lines_per_sec: f64,
    /// `parquet_read_rows_per_sec / tsv_read_lines_per_sec`.
    pub read_ratio: f64,
    /// Model of the training comparison.
    pub model: String,
    /// Global batch size.
    pub batch_size: usize,
    /// Worker threads.
    pub workers: usize,
    /// Training steps per run.
    pub steps: u64,
    /// Training samples/s from the Parquet files.
    pub train_parquet_samples_per_sec: f64,
    /// Training samples/s from the TSV file.
    pub train_tsv_samples_per_sec: f64,
    /// `train_parquet_samples_per_sec / train_tsv_samples_per_sec`.
    pub train_ratio: f64,
}

/// Best rows/s of `pass` (which returns the rows it read) repeated for about `seconds`.
fn rate(seconds: f64, mut pass: impl FnMut() -> Result<u64, PipelineError>) -> Result<f64, PipelineError> {
    let start = Instant::now();
    let mut best = 0.0f64;
    loop {
        let t = Instant::now();
        let rows = pass()?;
        best = best.max(rows as f64 / t.elapsed().as_secs_f64().max(1e-9));
        if start.elapsed().as_secs_f64() >= seconds {
            return Ok(best);
        }
    }
}

fn train_rate(settings: &TrainSettings) -> Result<f64, PipelineError> {
    let summary = tiderec::run::train(settings)?
        .ok_or_else(|| PipelineError::dataflow(tiderec::error::DataflowFailure::Incomplete, "no summary"))?;
    Ok(summary.samples_per_sec)
}

/// Runs the benchmark; the temporary Parquet directory is removed afterwards.
pub fn run_replay(bench: &ReplayBench) -> Result<ReplayBenchResult, PipelineError> {
    let tmp = std::env::temp_dir().join(format!("tiderec-bench-replay-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let result = run_in(bench, &tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn run_in(bench: &ReplayBench, tmp: &Path) -> Result<ReplayBenchResult, PipelineError> {
    let seed = 42;
    let dir = tmp.join("parquet");
    let tsv = format!("criteo:{}", bench.criteo.display());
    let base = {
        let mut s = TrainSettings::default();
        s.data.source = tsv.clone();
        s.run.seed = seed;
        s.data.buckets = bench.buckets;
        s.run.progress = tiderec::progress::ProgressMode::None;
        s.data.records.dead_letters = tmp.join("dead-letters.tsv");
        s
    };
    // 1. Convert.
    let writer = WriterOptions { row_group_rows: bench.row_group_rows, ..WriterOptions::default() };
    let converted = convert(&ConvertSettings { input: base.clone(), out: dir.clone(), writer })?;
    let tsv_bytes = std::fs::metadata(&bench.criteo)
        .map_err(|source| tiderec_sources::SourceError::Io { path: bench.criteo.display().to_string(), source })?
        .len();

    // 2. Decode only, alternating.
    let dataset = Arc::new(ParquetDataset::open_dir(&dir)?);
    let sizes = dataset.description().table_sizes();
    let parquet_pass = || {
        let mut reader = ParquetReader::new(dataset.clone(), (0.0, 1.0), 0, 1, seed, sizes.clone())?;
        let mut batch = Batch::new(NUM_DENSE, NUM_SPARSE);
        let mut rows = 0u64;
        loop {
            batch.clear();
            match reader.next_batch(&mut batch, 4096)? {
                0 => return Ok(rows),
                n => rows += n as u64,
            }
        }
    };
    let paths = [bench.criteo.clone()];
    let tsv_pass = || {
        let config = CriteoConfig {
            policy: BadRecordPolicy::Skip,
            ..CriteoConfig::new(CriteoFeatures::uniform(bench.buckets, seed))
        };
        let mut reader = CriteoReader::open(&paths, 0, 1, config, None)?;
        let mut batch = Batch::new(NUM_DENSE, NUM_SPARSE);
        loop {
            batch.clear();
            if reader.next_batch(&mut batch, 4096)? == 0 {
                return Ok(reader.lines_read());
            }
        }
    };
    let (mut parquet_read, mut tsv_read) = (0.0f64, 0.0f64);
    for _ in 0..2 {
        parquet_read = parquet_read.max(rate(bench.seconds, parquet_pass)?);
        tsv_read = tsv_read.max(rate(bench.seconds, tsv_pass)?);
    }

    // 3. Training, alternating.
    let train = {
        let mut s = base;
        s.model.kind = bench.model.parse()?;
        s.run.batch_size = bench.batch_size;
        s.cluster.workers = bench.workers;
        s.run.steps = Some(bench.steps);
        // Enough epochs for `steps` steps = a small file is replayed (Parquet row groups reshuffled).
        s.run.epochs = bench.steps.max(1);
        s.data.eval_fraction = 0.0;
        s
    };
    let from_parquet = {
        let mut s = train.clone();
        s.data.source = format!("parquet:{}", dir.display());
        s
    };
    let (mut train_parquet, mut train_tsv) = (0.0f64, 0.0f64);
    for _ in 0..2 {
        train_tsv = train_tsv.max(train_rate(&train)?);
        train_parquet = train_parquet.max(train_rate(&from_parquet)?);
    }
    Ok(ReplayBenchResult {
        file: bench.criteo.display().to_string(),
        rows: converted.rows,
        row_groups: converted.row_groups,
        tsv_bytes,
        parquet_bytes: converted.bytes_out,
        convert_rows_per_sec: converted.rows as f64 / converted.seconds.max(1e-9),
        parquet_read_rows_per_sec: parquet_read,
        tsv_read_lines_per_sec: tsv_read,
        read_ratio: parquet_read / tsv_read.max(1e-9),
        model: bench.model.clone(),
        batch_size: bench.batch_size,
        workers: bench.workers,
        steps: bench.steps,
        train_parquet_samples_per_sec: train_parquet,
        train_tsv_samples_per_sec: train_tsv,
        train_ratio: train_parquet / train_tsv.max(1e-9),
    })
}
