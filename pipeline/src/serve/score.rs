//! One loaded checkpoint, ready to featurize and score JSON records.
//!
//! Invariant: a [`Loaded`] scores with the features it was trained with (the
//! table sizes and hashing seed of its checkpoint), so a record is always
//! hashed for the tables that look it up, also across a reload that changes
//! them.

use crate::serving::{self, ServedModel};
use crate::PipelineError;
use std::path::{Path, PathBuf};
use tiderec_operators::nn::loss::sigmoid;
use tiderec_operators::nn::Model;
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
    served: ServedModel,
    net: Box<dyn Model<f32>>,
    format: CriteoJsonFormat,
    pooled: Vec<f32>,
}

impl Loaded {
    /// Loads the checkpoint at `path` (a `ckpt-<step>` directory, or a directory whose newest
    /// valid checkpoint is taken) and checks that it scores Criteo-shaped JSON records.
    pub fn load(path: &Path) -> Result<Loaded, PipelineError> {
        let served = serving::load(path)?;
        let cfg = &served.config.model;
        if cfg.num_sequences() > 0 || cfg.num_sparse() != NUM_SPARSE || cfg.num_dense() != NUM_DENSE {
            return Err(PipelineError::config(
                "checkpoint",
                format!(
                    "{}: serve scores Criteo-shaped models (13 dense and 26 sparse fields, no crosses or sequences)",
                    path.display()
                ),
            ));
        }
        let mut net = cfg.build::<f32>(served.config.seed)?;
        if net.params().len() != served.dense.len() {
            return Err(PipelineError::Checkpoint(format!(
                "{}: {} dense parameters, the model has {}",
                path.display(),
                served.dense.len(),
                net.params().len()
            )));
        }
        net.params_mut().copy_from_slice(&served.dense);
        let features = CriteoFeatures { table_sizes: served.config.table_sizes.clone(), seed: served.config.seed };
        let format = CriteoJsonFormat::unlabeled(features)?;
        let found = if path.join(tiderec_sinks::checkpoint::layout::MANIFEST_FILE).is_file() {
            path.to_path_buf()
        } else {
            path.join(tiderec_sinks::checkpoint::layout::checkpoint_name(served.step))
        };
        Ok(Loaded { path: found, step: served.step, model_name: cfg.name(), served, net, format, pooled: Vec::new() })
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
    pub fn score(&mut self, batch: &Batch, out: &mut Vec<f32>) {
        let b = batch.len();
        if b == 0 {
            return;
        }
        let dim = self.served.config.model.embedding_dim();
        self.pooled.clear();
        self.pooled.resize(b * NUM_SPARSE * dim, 0.0);
        for (f, field) in batch.sparse.iter().enumerate() {
            let table = &self.served.tables[f];
            for s in 0..b {
                let at = (s * NUM_SPARSE + f) * dim;
                let dst = &mut self.pooled[at..at + dim];
                for &id in field.bag(s) {
                    let row = &table[id as usize * dim..(id as usize + 1) * dim];
                    dst.iter_mut().zip(row).for_each(|(o, &r)| *o += r);
                }
            }
        }
        let logits = self.net.forward(&batch.dense, &self.pooled, b);
        out.extend(logits.iter().map(|&x| sigmoid(x)));
    }
}
