//! One loaded checkpoint, ready to featurize and score JSON records.
//!
//! Invariants:
//! * A [`Loaded`] featurizes records with the feature pipeline recorded in
//!   its checkpoint (format, spec, table sizes, `--hash-seed`), so a record is
//!   always hashed for the tables that look it up, also across a reload that
//!   changes them; it scores through the same [`Scorer`] as `eval` and
//!   `predict`.
//! * A record of a line format (Criteo included) is featurized by the
//!   checkpoint's line format on the line [`RecordShape`] makes of it, the
//!   format `predict` reads files with: an object and the same `line` score
//!   alike, and a value is read the same way as a JSON string or number. A
//!   model trained on Parquet files scores featurized rows ([`rows`]),
//!   decoded by the Parquet reader `predict` reads the files with.

use super::records::{RecordError, RecordShape};
use super::rows;
use crate::config::DataSpec;
use crate::feature_pipeline::FeaturePipeline;
use crate::predict::scorer::Scorer;
use crate::serving;
use crate::PipelineError;
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use tiderec_operators::Batch;
use tiderec_sources::lines::LineFormat;
use tiderec_sources::parquet::SchemaDescription;

/// A checkpoint's model with its record format.
pub struct Loaded {
    /// The checkpoint directory it came from.
    pub path: PathBuf,
    /// Its step.
    pub step: u64,
    /// The model's name (`dlrm`, `fm`, …).
    pub model_name: &'static str,
    scorer: Scorer,
    records: Records,
}

/// A delta checkpoint read as stored, for the model of its parent.
pub struct Delta {
    /// Its directory.
    pub path: std::path::PathBuf,
    /// Its step.
    pub step: u64,
    /// The step of the checkpoint it follows: the model it is applied onto must be that one.
    pub parent: u64,
    /// Its parts: the rows changed since the parent, the ids removed since, the dense parameters.
    pub parts: Vec<tiderec_operators::snapshot::WorkerSnapshot>,
}

/// How records become samples.
enum Records {
    /// Records of a line format: made into a line, parsed by the pipeline's format.
    Lines(Box<LineRecords>),
    /// Featurized rows of a Parquet schema; `max_len` is the longest sequence the model reads
    /// (each is cut to it as `predict` cuts the files' rows).
    Rows { description: Box<SchemaDescription>, table_sizes: Vec<u64>, max_len: Option<usize> },
}

/// Records of a line format.
struct LineRecords {
    shape: RecordShape,
    /// The pipeline's line format of labeled lines (the training files' lines).
    format: Box<dyn LineFormat + Send>,
    line: RefCell<Vec<u8>>,
}

impl Loaded {
    /// Loads the checkpoint at `path` (a `ckpt-<step>` directory, or a directory whose newest
    /// valid checkpoint is taken) and the format of the records it was trained on.
    pub fn load(path: &Path) -> Result<Loaded, PipelineError> {
        let served = serving::load(path)?;
        let found = if path.join(tiderec_sinks::checkpoint::layout::MANIFEST_FILE).is_file() {
            path.to_path_buf()
        } else {
            path.join(tiderec_sinks::checkpoint::layout::checkpoint_name(served.step))
        };
        let pipeline = match &served.pipeline {
            Some(p) => p.clone(),
            None => FeaturePipeline::assumed(
                &DataSpec::Criteo(Vec::new()),
                served.config.seed,
                &served.config.table_sizes,
                None,
            )
            .filter(|_| served.config.model.num_sequences() == 0)
            .ok_or_else(|| {
                PipelineError::config(
                    "checkpoint",
                    format!(
                        "{} records no feature pipeline (an older checkpoint) and its model is not Criteo-shaped: \
                         serve cannot tell what its records look like",
                        found.display()
                    ),
                )
            })?,
        };
        let records = match (&pipeline.parquet, RecordShape::of(&pipeline)?, pipeline.line_format(true)?) {
            (Some(description), _, _) => Records::Rows {
                description: Box::new(description.clone()),
                table_sizes: pipeline.table_sizes.clone(),
                max_len: Some(served.config.model.max_sequence_len()).filter(|&n| n > 0),
            },
            (None, Some(shape), Some(format)) => {
                Records::Lines(Box::new(LineRecords { shape, format, line: RefCell::new(Vec::new()) }))
            }
            _ => {
                return Err(PipelineError::config(
                    "checkpoint",
                    format!(
                        "{}: serve scores records of files (criteo, avazu, csv, taobao-ad, amazon-dien, parquet); \
                         this checkpoint was trained on {}",
                        found.display(),
                        pipeline.format_label()
                    ),
                ))
            }
        };
        let (step, model_name) = (served.step, served.config.model.name());
        let scorer = Scorer::new(served, &pipeline)?;
        Ok(Loaded { path: found, step, model_name, scorer, records })
    }

    /// Takes the delta of `step` at `path` (its parts as stored, see
    /// [`Scorer::apply_changes`]), which must follow this model's step (a delta sent after
    /// one that could not be applied does not): on error the model is unchanged.
    pub fn apply_delta(&mut self, delta: &Delta) -> Result<(), PipelineError> {
        if delta.parent != self.step {
            return Err(PipelineError::config(
                "checkpoint",
                format!("the delta follows step {}, the model served is step {}", delta.parent, self.step),
            ));
        }
        self.scorer.apply_changes(&delta.parts)?;
        (self.path, self.step) = (delta.path.clone(), delta.step);
        Ok(())
    }

    /// What `GET /schema` answers: the format of this model's records and their fields.
    pub fn describe(&self) -> serde_json::Value {
        match &self.records {
            Records::Lines(r) => r.shape.describe(),
            Records::Rows { description, .. } => rows::describe(description),
        }
    }

    /// One line saying what a record looks like.
    pub fn summary(&self) -> String {
        match &self.records {
            Records::Lines(r) => r.shape.summary(),
            Records::Rows { description, .. } => rows::summary(description),
        }
    }

    /// Appends the features of one JSON record to `out`; the error names the bad field.
    pub fn featurize(&self, record: &[u8], out: &mut Batch) -> Result<(), RecordError> {
        let LineRecords { shape, format, line } = match &self.records {
            Records::Lines(r) => &**r,
            Records::Rows { description, table_sizes, max_len } => {
                return rows::featurize(description, table_sizes, *max_len, record, out)
            }
        };
        let mut line = line.borrow_mut();
        let of = shape.line_of(record, &mut line)?;
        format.parse(&line, out).map_err(|e| shape.format_error(e, of))
    }

    /// An empty batch of this model's records' shape.
    pub fn batch(&self) -> Batch {
        match &self.records {
            Records::Lines(r) => {
                let (dense, sparse) = r.format.shape();
                Batch::with_sequences(dense, sparse, r.format.num_sequences())
            }
            Records::Rows { description, .. } => {
                let (dense, sparse) = description.shape();
                Batch::with_sequences(dense, sparse, description.sequences.len())
            }
        }
    }

    /// Click probabilities of every sample of `batch`, in order, appended to `out`.
    pub fn score(&mut self, batch: &mut Batch, out: &mut Vec<f32>) -> Result<(), PipelineError> {
        out.extend(self.scorer.probabilities(batch)?);
        Ok(())
    }
}
