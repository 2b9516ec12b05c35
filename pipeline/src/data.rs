//! Each worker's share of the training and evaluation data.
//!
//! The global batch of a step is the union of the workers' micro-batches in
//! worker order. For the synthetic stream, step `s` covers samples
//! `[s·B, (s+1)·B)` and worker `w` of `W` takes the `w`-th of `W` equal
//! parts, so every worker count sees the same global batches. Samples
//! derived up front (Taobao behaviour logs, [`IndexedSamples::Table`]) are
//! split the same way. For files, each worker reads its own line-aligned byte range of every file and
//! contributes up to `B·(w+1)/W − B·w/W` samples per step. For Parquet,
//! each worker reads its share of the rows, split inside row groups
//! (`tiderec_sources::parquet::ParquetDataset::worker_segments`): files
//! converted from line files are split exactly as the raw files would be, so
//! they train on the same global batches for every worker count.
//!
//! The training split is shuffled after the first epoch ([`WorkerData::with_shuffle`],
//! `tiderec_sources::shuffle`): line files and their conversions in blocks of each
//! worker's byte ranges, other Parquet files by row group. Evaluation splits are
//! opened afresh for every evaluation and read in file order.

use crate::config::DataSpec;
use crate::error::DataflowFailure;
use crate::PipelineError;
use std::path::PathBuf;
use std::sync::Arc;
use tiderec_operators::bad_record::{BadRecordCounts, BadRecordPolicy, DeadLetterSink};
use tiderec_operators::spec::SpecFormat;
use tiderec_operators::Batch;
use tiderec_sources::amazon::{AmazonDienFormat, AmazonDienReader};
use tiderec_sources::avazu::{open_avazu, AvazuFormat, AvazuReader};
use tiderec_sources::criteo::{CriteoConfig, CriteoFeatures, CriteoReader};
use tiderec_sources::lines::{LineReader, ReaderOptions};
use tiderec_sources::parquet::ParquetReader;
use tiderec_sources::shuffle::BlockShuffle;
use tiderec_sources::synthetic::SyntheticCriteo;
use tiderec_sources::synthetic_behavior::SyntheticBehavior;

/// Samples addressable by a global index: any worker can produce any range.
// One value per worker and run: boxing the generator would only add an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum IndexedSamples {
    /// The synthetic Criteo-shaped stream.
    Criteo(SyntheticCriteo),
    /// The synthetic behaviour stream (DIEN-shaped).
    Behavior(SyntheticBehavior),
    /// Samples derived before training (e.g. from a Taobao behaviour log), in order.
    Table(Arc<Batch>),
}

impl IndexedSamples {
    /// Appends samples `range` to `out`; returns the teacher's probabilities (empty for a table).
    pub fn fill(&self, range: std::ops::Range<u64>, out: &mut Batch) -> Vec<f64> {
        match self {
            IndexedSamples::Criteo(g) => g.fill(range, out),
            IndexedSamples::Behavior(g) => g.fill(range, out),
            IndexedSamples::Table(t) => {
                let end = range.end.min(t.len() as u64);
                for i in range.start.min(end)..end {
                    out.push_from(t, i as usize);
                }
                Vec::new()
            }
        }
    }

    /// True when samples come with a teacher probability.
    pub fn has_teacher(&self) -> bool {
        !matches!(self, IndexedSamples::Table(_))
    }
}

/// Worker `worker`'s share of a global batch of `batch` samples (the shares add up to `batch`).
pub fn micro_batch(batch: usize, worker: usize, workers: usize) -> usize {
    batch * (worker + 1) / workers - batch * worker / workers
}

/// First index of the synthetic evaluation split (disjoint from any training range:
/// `--samples` is at most this many).
pub const SYNTHETIC_EVAL_BASE: u64 = crate::settings::MAX_SAMPLES;

/// One worker's reader over a training or evaluation split.
pub enum WorkerData {
    /// A range of a synthetic stream or of samples derived up front.
    Synthetic {
        /// The generator.
        generator: Box<IndexedSamples>,
        /// Global sample range of the split.
        range: std::ops::Range<u64>,
        /// Next global sample of the split.
        cursor: u64,
        /// Global batch size.
        batch: u64,
        /// This worker.
        worker: u64,
        /// All workers.
        workers: u64,
        /// Threads that generate a micro-batch (the worker's share of the cores).
        threads: usize,
    },
    /// This worker's byte ranges of Criteo files.
    Criteo {
        /// The reader.
        reader: Box<CriteoReader>,
        /// Samples per step from this worker.
        micro: usize,
    },
    /// This worker's byte ranges of files described by a feature spec.
    Spec {
        /// The reader.
        reader: Box<LineReader<SpecFormat>>,
        /// Samples per step from this worker.
        micro: usize,
    },
    /// This worker's byte ranges of Avazu files.
    Avazu {
        /// The reader.
        reader: Box<AvazuReader>,
        /// Samples per step from this worker.
        micro: usize,
    },
    /// This worker's byte ranges of DIEN-format files.
    AmazonDien {
        /// The reader.
        reader: Box<AmazonDienReader>,
        /// Samples per step from this worker.
        micro: usize,
    },
    /// This worker's row groups of featurized Parquet files.
    Parquet {
        /// The reader.
        reader: Box<ParquetReader>,
        /// Samples per step from this worker.
        micro: usize,
    },
}

/// How record files (Criteo, Avazu) are read.
#[derive(Clone, Debug)]
pub struct CriteoOptions {
    /// Hashing seed.
    pub seed: u64,
    /// Seed of the per-epoch shuffle of Parquet row groups.
    pub shuffle_seed: u64,
    /// The shuffle of the training data's epochs after the first (`None`: `--no-shuffle`),
    /// given to the training reader by [`WorkerData::with_shuffle`].
    pub shuffle: Option<BlockShuffle>,
    /// The feature spec of `csv:` data.
    pub spec: Option<tiderec_operators::spec::FeatureSpec>,
    /// Hashing into tables.
    pub features: CriteoFeatures,
    /// Longest behaviour history kept (sequence formats), and read from Parquet rows: the
    /// model's, when it reads sequences.
    pub max_len: usize,
    /// Longest accepted line.
    pub max_line_bytes: usize,
    /// Skip or fail on bad records.
    pub policy: BadRecordPolicy,
}

impl CriteoOptions {
    /// The reading options of a resolved run: hashing with `settings.hash_seed()`, shuffles with `settings.seed`.
    pub fn for_run(resolved: &crate::config::Resolved, settings: &crate::TrainSettings) -> Result<Self, PipelineError> {
        let seed = settings.hash_seed();
        let shuffle = match settings.data.no_shuffle {
            true => None,
            false => Some(BlockShuffle::new(settings.run.seed, settings.data.shuffle_block_bytes)?),
        };
        Ok(CriteoOptions {
            features: CriteoFeatures { table_sizes: resolved.data_table_sizes().to_vec(), seed },
            max_len: match resolved.model.max_sequence_len() {
                0 => settings.data.max_len,
                n => n,
            },
            max_line_bytes: settings.data.records.max_line_bytes,
            policy: resolved.policy,
            seed,
            shuffle_seed: settings.run.seed,
            shuffle,
            spec: resolved.spec.clone(),
        })
    }
}

/// Samples a generator thread makes at least: fewer would spend more on starting it than it saves.
const MIN_SAMPLES_PER_THREAD: u64 = 1024;

/// The threads each of `workers` workers may generate indexed samples on: this
/// machine's share of the cores per worker, at least 1 (the worker's own). A worker
/// generates its micro-batch before its step, while its core would otherwise wait,
/// so a worker with cores to spare (a GPU worker training alone) is not held to
/// one core's generating speed.
fn generator_threads(workers: usize) -> usize {
    crate::device::cores_per_worker(workers)
}

/// Appends samples `range` of `generator` to `out`, made on up to `threads`
/// threads (the caller's one of them), each making a contiguous part of at least
/// [`MIN_SAMPLES_PER_THREAD`] samples. A sample depends only on its index, so the
/// batch is the one a single thread makes.
fn fill_in_parallel(generator: &IndexedSamples, range: std::ops::Range<u64>, out: &mut Batch, threads: usize) {
    let len = range.end - range.start;
    let parts = (threads as u64).min(len / MIN_SAMPLES_PER_THREAD).max(1);
    if parts == 1 {
        generator.fill(range, out);
        return;
    }
    let bound = |k: u64| range.start + len * k / parts;
    let mut empty = out.clone();
    empty.clear();
    let tails: Vec<Batch> = std::thread::scope(|scope| {
        let handles: Vec<_> = (1..parts)
            .map(|k| {
                let mut part = empty.clone();
                scope.spawn(move || {
                    generator.fill(bound(k)..bound(k + 1), &mut part);
                    part
                })
            })
            .collect();
        generator.fill(bound(0)..bound(1), out);
        handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    for part in &tails {
        out.extend_from(part);
    }
}

impl WorkerData {
    /// This worker's share of the synthetic samples `range`, in global batches of `batch`.
    pub fn synthetic(
        generator: IndexedSamples,
        range: std::ops::Range<u64>,
        batch: usize,
        worker: usize,
        workers: usize,
    ) -> Self {
        WorkerData::Synthetic {
            generator: Box::new(generator),
            cursor: range.start,
            range,
            batch: batch as u64,
            worker: worker as u64,
            workers: workers as u64,
            threads: generator_threads(workers),
        }
    }

    /// This worker's share of `span` (fractions of each file's bytes) of Criteo `paths`.
    #[allow(clippy::too_many_arguments)]
    pub fn criteo(
        paths: &[PathBuf],
        span: (f64, f64),
        options: &CriteoOptions,
        batch: usize,
        worker: usize,
        workers: usize,
        dead_letters: Option<Box<dyn DeadLetterSink>>,
    ) -> Result<Self, PipelineError> {
        let config = CriteoConfig {
            features: options.features.clone(),
            max_line_bytes: options.max_line_bytes,
            policy: options.policy,
        };
        let reader = CriteoReader::open_span(paths, span, worker, workers, config, dead_letters)?;
        Ok(WorkerData::Criteo { reader: Box::new(reader), micro: micro_batch(batch, worker, workers) })
    }

    /// Builds the reader for `spec`; `eval` picks the held-out part.
    #[allow(clippy::too_many_arguments)]
    pub fn for_spec(
        spec: &DataSpec,
        synthetic: Option<(&IndexedSamples, std::ops::Range<u64>)>,
        span: (f64, f64),
        options: &CriteoOptions,
        batch: usize,
        worker: usize,
        workers: usize,
        dead_letters: Option<Box<dyn DeadLetterSink>>,
    ) -> Result<Self, PipelineError> {
        match spec {
            DataSpec::Synthetic | DataSpec::SyntheticBehavior | DataSpec::TaobaoBehavior(_) => {
                let (g, range) = synthetic.expect("indexed data comes with its generator");
                Ok(Self::synthetic(g.clone(), range, batch, worker, workers))
            }
            DataSpec::AmazonDien(paths) => {
                let format = AmazonDienFormat::new(&options.features.table_sizes, options.seed, options.max_len)?;
                let reader_options = ReaderOptions { max_line_bytes: options.max_line_bytes, policy: options.policy };
                let reader =
                    LineReader::open_format(paths, span, worker, workers, format, reader_options, dead_letters)?;
                Ok(WorkerData::AmazonDien { reader: Box::new(reader), micro: micro_batch(batch, worker, workers) })
            }
            DataSpec::Criteo(paths) => Self::criteo(paths, span, options, batch, worker, workers, dead_letters),
            DataSpec::Csv(paths) | DataSpec::TaobaoAd(paths) => {
                let spec = options.spec.clone().expect("validated: csv data has a spec");
                let format = SpecFormat::new(spec, options.seed)?;
                let reader_options = ReaderOptions { max_line_bytes: options.max_line_bytes, policy: options.policy };
                let reader =
                    LineReader::open_format(paths, span, worker, workers, format, reader_options, dead_letters)?;
                Ok(WorkerData::Spec { reader: Box::new(reader), micro: micro_batch(batch, worker, workers) })
            }
            DataSpec::Avazu(paths) => {
                let format = AvazuFormat::new(options.features.table_sizes.clone(), options.seed)?;
                let reader_options = ReaderOptions { max_line_bytes: options.max_line_bytes, policy: options.policy };
                let reader = open_avazu(paths, span, worker, workers, format, reader_options, dead_letters)?;
                Ok(WorkerData::Avazu { reader: Box::new(reader), micro: micro_batch(batch, worker, workers) })
            }
            DataSpec::Parquet(data) => {
                let sizes = options.features.table_sizes.clone();
                let reader = ParquetReader::new(data.0.clone(), span, worker, workers, options.shuffle_seed, sizes)?
                    .with_bad_records(options.policy, dead_letters)
                    .with_max_len(options.max_len);
                Ok(WorkerData::Parquet { reader: Box::new(reader), micro: micro_batch(batch, worker, workers) })
            }
        }
    }

    /// Reads the epochs after the first as `shuffle` says (`None`: all in epoch 0's order).
    /// Indexed samples are read in order whatever it says.
    pub fn with_shuffle(self, shuffle: Option<BlockShuffle>) -> Self {
        match self {
            WorkerData::Criteo { reader, micro } => {
                WorkerData::Criteo { reader: Box::new(reader.with_shuffle(shuffle)), micro }
            }
            WorkerData::Avazu { reader, micro } => {
                WorkerData::Avazu { reader: Box::new(reader.with_shuffle(shuffle)), micro }
            }
            WorkerData::Spec { reader, micro } => {
                WorkerData::Spec { reader: Box::new(reader.with_shuffle(shuffle)), micro }
            }
            WorkerData::AmazonDien { reader, micro } => {
                WorkerData::AmazonDien { reader: Box::new(reader.with_shuffle(shuffle)), micro }
            }
            WorkerData::Parquet { reader, micro } => {
                WorkerData::Parquet { reader: Box::new(reader.with_shuffle(shuffle)), micro }
            }
            synthetic @ WorkerData::Synthetic { .. } => synthetic,
        }
    }

    /// Appends this worker's next micro-batch to `out` (cleared first); 0 samples means the split is exhausted.
    pub fn next_micro_batch(&mut self, out: &mut Batch) -> Result<usize, PipelineError> {
        out.clear();
        match self {
            WorkerData::Synthetic { generator, range, cursor, batch, worker, workers, threads } => {
                if *cursor >= range.end {
                    return Ok(0);
                }
                let lo = *cursor;
                let hi = (lo + *batch).min(range.end);
                *cursor = hi;
                let len = hi - lo;
                let mine = lo + len * *worker / *workers..lo + len * (*worker + 1) / *workers;
                fill_in_parallel(generator, mine, out, *threads);
                Ok(out.len())
            }
            WorkerData::Criteo { reader, micro } => Ok(reader.next_batch(out, *micro)?),
            WorkerData::Avazu { reader, micro } => Ok(reader.next_batch(out, *micro)?),
            WorkerData::Spec { reader, micro } => Ok(reader.next_batch(out, *micro)?),
            WorkerData::AmazonDien { reader, micro } => Ok(reader.next_batch(out, *micro)?),
            WorkerData::Parquet { reader, micro } => Ok(reader.next_batch(out, *micro)?),
        }
    }

    /// Passes over this worker's share of the next `steps` global steps, as if
    /// they had been read (resuming at a checkpoint's data position). The
    /// indexed splits jump there; readers of files read and discard that many
    /// micro-batches (`scratch` is their buffer), so the position, the
    /// skipped bad records and the dead letters are exactly those of a run
    /// that read them.
    pub fn skip_steps(&mut self, steps: u64, scratch: &mut Batch) -> Result<(), PipelineError> {
        if let WorkerData::Synthetic { range, cursor, batch, .. } = self {
            *cursor = cursor.saturating_add(steps.saturating_mul(*batch)).min(range.end.max(*cursor));
            return Ok(());
        }
        for _ in 0..steps {
            self.next_micro_batch(scratch)?;
        }
        scratch.clear();
        Ok(())
    }

    /// True when a step may produce no samples on this worker although others still have data.
    pub fn is_exhausted(&self) -> bool {
        match self {
            WorkerData::Synthetic { range, cursor, .. } => *cursor >= range.end,
            WorkerData::Criteo { .. }
            | WorkerData::Avazu { .. }
            | WorkerData::Spec { .. }
            | WorkerData::AmazonDien { .. } => false,
            WorkerData::Parquet { .. } => false,
        }
    }

    /// Starts the split over (next epoch).
    pub fn rewind(&mut self) {
        match self {
            WorkerData::Synthetic { range, cursor, .. } => *cursor = range.start,
            WorkerData::Criteo { reader, .. } => reader.rewind(),
            WorkerData::Avazu { reader, .. } => reader.rewind(),
            WorkerData::Spec { reader, .. } => reader.rewind(),
            WorkerData::AmazonDien { reader, .. } => reader.rewind(),
            WorkerData::Parquet { reader, .. } => reader.rewind(),
        }
    }

    /// Bad records skipped so far.
    pub fn bad_counts(&self) -> BadRecordCounts {
        match self {
            WorkerData::Synthetic { .. } => BadRecordCounts::default(),
            WorkerData::Parquet { reader, .. } => reader.bad_counts().clone(),
            WorkerData::Criteo { reader, .. } => reader.bad_counts().clone(),
            WorkerData::Avazu { reader, .. } => reader.bad_counts().clone(),
            WorkerData::Spec { reader, .. } => reader.bad_counts().clone(),
            WorkerData::AmazonDien { reader, .. } => reader.bad_counts().clone(),
        }
    }

    /// `(bytes passed, bytes in all)` of a line reader's ranges in this epoch (progress of `convert`).
    pub fn bytes_progress(&self) -> Option<(u64, u64)> {
        match self {
            WorkerData::Criteo { reader, .. } => Some((reader.bytes_read(), reader.bytes_total())),
            WorkerData::Avazu { reader, .. } => Some((reader.bytes_read(), reader.bytes_total())),
            WorkerData::Spec { reader, .. } => Some((reader.bytes_read(), reader.bytes_total())),
            WorkerData::AmazonDien { reader, .. } => Some((reader.bytes_read(), reader.bytes_total())),
            WorkerData::Synthetic { .. } | WorkerData::Parquet { .. } => None,
        }
    }

    /// Makes a line reader record the position of every sample it appends (see
    /// [`LineReader::record_line_starts`](tiderec_sources::lines::LineReader::record_line_starts));
    /// returns the input files' sizes, or `None` for data that is not read from line files.
    pub fn record_line_starts(&mut self) -> Option<Vec<u64>> {
        macro_rules! on {
            ($r:expr) => {{
                $r.record_line_starts();
                Some($r.file_bytes())
            }};
        }
        match self {
            WorkerData::Criteo { reader, .. } => on!(reader),
            WorkerData::Avazu { reader, .. } => on!(reader),
            WorkerData::Spec { reader, .. } => on!(reader),
            WorkerData::AmazonDien { reader, .. } => on!(reader),
            WorkerData::Synthetic { .. } | WorkerData::Parquet { .. } => None,
        }
    }

    /// The positions of the samples appended since the last call (after [`Self::record_line_starts`]).
    pub fn take_line_starts(&mut self) -> Vec<u64> {
        match self {
            WorkerData::Criteo { reader, .. } => reader.take_line_starts(),
            WorkerData::Avazu { reader, .. } => reader.take_line_starts(),
            WorkerData::Spec { reader, .. } => reader.take_line_starts(),
            WorkerData::AmazonDien { reader, .. } => reader.take_line_starts(),
            WorkerData::Synthetic { .. } | WorkerData::Parquet { .. } => Vec::new(),
        }
    }

    /// Flushes the dead-letter sink, if any.
    pub fn flush(&mut self) -> Result<(), PipelineError> {
        let sink = match self {
            WorkerData::Criteo { reader, .. } => reader.dead_letters(),
            WorkerData::Avazu { reader, .. } => reader.dead_letters(),
            WorkerData::Spec { reader, .. } => reader.dead_letters(),
            WorkerData::AmazonDien { reader, .. } => reader.dead_letters(),
            WorkerData::Parquet { reader, .. } => reader.dead_letters(),
            WorkerData::Synthetic { .. } => None,
        };
        if let Some(dl) = sink {
            dl.flush().map_err(|e| {
                PipelineError::dataflow(DataflowFailure::Output, "cannot flush dead letters").with_source(e)
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{fill_in_parallel, IndexedSamples, MIN_SAMPLES_PER_THREAD};
    use tiderec_operators::Batch;
    use tiderec_sources::synthetic::{SyntheticConfig, SyntheticCriteo, NUM_DENSE, NUM_SPARSE};
    use tiderec_sources::synthetic_behavior::{BehaviorConfig, SyntheticBehavior};

    #[test]
    fn samples_made_on_several_threads_equal_those_made_on_one() {
        let criteo = SyntheticCriteo::new(SyntheticConfig::kaggle_like(9, 1000)).unwrap();
        let behavior = SyntheticBehavior::new(BehaviorConfig::standard(9, 20)).unwrap();
        for (generator, empty) in [
            (IndexedSamples::Criteo(criteo), Batch::new(NUM_DENSE, NUM_SPARSE)),
            (IndexedSamples::Behavior(behavior), Batch::with_sequences(0, 3, 2)),
        ] {
            // Parts of uneven length, a remainder, and a range too short to split.
            for range in [17..17 + 3 * MIN_SAMPLES_PER_THREAD + 5, 3..3 + MIN_SAMPLES_PER_THREAD + 1] {
                let mut one = empty.clone();
                generator.fill(range.clone(), &mut one);
                for threads in [2, 3, 7] {
                    let mut many = empty.clone();
                    fill_in_parallel(&generator, range.clone(), &mut many, threads);
                    assert_eq!(many, one, "{threads} threads, samples {range:?}");
                }
            }
        }
    }
}
