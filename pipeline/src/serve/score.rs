//! One loaded checkpoint, ready to featurize and score JSON records.
//!
//! Invariant: a [`Loaded`] hashes records with the feature pipeline recorded
//! in its checkpoint (table sizes and `--hash-seed`), so a record is always
//! hashed for the tables that look it up, also across a reload that changes
//! them; it scores through the same [`Scorer`] as `eval` and `predict`.

use crate::config::DataSpec;
use crate::feature_pipeline::FeaturePipeline;
use crate::predict::scorer::Scorer;
use crate::serving;
use crate::PipelineError;
use std::path::{Path, PathBuf};
use tiderec_operators::Batch;
use tiderec_sources::criteo::{CriteoFeatures, NUM_DENSE, NUM_SPARSE};
use tiderec_sources::json::CriteoJsonFormat;
use tiderec_sources::lines::LineFormat;

/// A checkpoint's model with its record format.
pub struct Loaded {
    /// The checkpoint directory it came from.
    pub path: PathBuf,
    /// Its step.
    pub step: u64,
    /// The model's name (`dlrm`, `fm`, …).
    pub model_name: &'static str,
    scorer: Scorer,
    format: CriteoJsonFormat,
}

impl Loaded {
    /// Loads the checkpoint at `path` (a `ckpt-<step>` directory, or a directory whose newest
    /// valid checkpoint is taken) and checks that it was trained on Criteo-format records,
    /// whose JSON form it scores.
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
            .ok_or_else(|| not_criteo(&found, "a model that is not Criteo-shaped"))?,
        };
        if pipeline.format != "criteo" || served.config.model.num_sequences() > 0 {
            return Err(not_criteo(&found, &format!("`{}` records", pipeline.format_label())));
        }
        let features = CriteoFeatures { table_sizes: pipeline.table_sizes.clone(), seed: pipeline.hash.seed };
        let format = CriteoJsonFormat::unlabeled(features)?;
        let (step, model_name) = (served.step, served.config.model.name());
        let scorer = Scorer::new(served, &pipeline)?;
        Ok(Loaded { path: found, step, model_name, scorer, format })
    }

    /// Appends the features of one JSON record to `out`; the error names the bad field.
    pub fn featurize(&self, record: &[u8], out: &mut Batch) -> Result<(), String> {
        self.format.parse(record, out).map_err(|(reason, field)| match field {
            Some(0) => format!("{reason} in `label`"),
            Some(f) if f <= NUM_DENSE => format!("{reason} in `I{f}`"),
            Some(f) => format!("{reason} in `C{}`", f - NUM_DENSE),
            None => format!("{reason}: not a JSON object"),
        })
    }

    /// An empty batch of this model's shape.
    pub fn batch(&self) -> Batch {
        Batch::new(NUM_DENSE, NUM_SPARSE)
    }

    /// Click probabilities of every sample of `batch`, in order, appended to `out`.
    pub fn score(&mut self, batch: &mut Batch, out: &mut Vec<f32>) -> Result<(), PipelineError> {
        out.extend(self.scorer.probabilities(batch)?);
        Ok(())
    }
}

fn not_criteo(path: &Path, what: &str) -> PipelineError {
    PipelineError::config(
        "checkpoint",
        format!(
            "{}: serve scores Criteo records as JSON objects (I1..I13, C1..C26); this checkpoint was trained on {what}",
            path.display()
        ),
    )
}
