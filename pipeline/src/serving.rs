//! `tiderec export` and `tiderec eval`: a checkpoint's model outside of training.
//!
//! Both read a checkpoint (a `ckpt-<step>` directory, or a checkpoint directory whose
//! newest valid checkpoint is taken), merge every worker's embedding rows into whole
//! tables by id, and rebuild the model from the configuration in its manifest, so
//! neither needs the flags of the run that wrote it. `eval` scores records with a
//! single-threaded forward pass ([`ServedModel::score_batch`]: pooled sums of the
//! rows, then the model), the same computation as a training step's prediction.
//!
//! `export` writes a self-describing serving snapshot (`docs/export.md`): the
//! dense layers under PyTorch's names and layouts ([`tiderec_operators::nn::named`]),
//! the embedding tables named by field ([`tables`]), and `model.json` with the
//! model kind, every tensor's shape, the forward computation ([`describe`]) and
//! the feature pipeline ([`features`]).

pub mod describe;
pub mod features;
pub mod names;
pub mod tables;

use crate::config::DataSpec;
use crate::PipelineError;
use serde::Serialize;
use std::path::Path;
use tiderec_operators::bad_record::BadRecordPolicy;
use tiderec_operators::metrics::{auc, logloss};
use tiderec_operators::nn::loss::sigmoid;
use tiderec_operators::nn::Model;
use tiderec_operators::train::TrainerConfig;
use tiderec_operators::Batch;
use tiderec_sinks::checkpoint::export::{write_serving, ServingTensor};
use tiderec_sinks::checkpoint::{self, Checkpoint};
use tiderec_sources::criteo::{CriteoConfig, CriteoFeatures, CriteoReader, NUM_DENSE, NUM_SPARSE};

/// A checkpoint's model, ready to score.
pub struct ServedModel {
    /// The trainer configuration (model, table sizes, seed).
    pub config: TrainerConfig,
    /// The step it was taken at.
    pub step: u64,
    /// Flat dense parameters.
    pub dense: Vec<f32>,
    /// Per table, `rows × dim` values (row `i` = id `i`).
    pub tables: Vec<Vec<f32>>,
}

fn checkpoint_error(path: &Path, reason: impl std::fmt::Display) -> PipelineError {
    PipelineError::Checkpoint(format!("{}: {reason}", path.display()))
}

/// Loads the checkpoint at `path` (see the module docs).
pub fn load(path: &Path) -> Result<ServedModel, PipelineError> {
    let found: Checkpoint = if path.join(checkpoint::layout::MANIFEST_FILE).is_file() {
        let text = std::fs::read_to_string(path.join(checkpoint::layout::MANIFEST_FILE))
            .map_err(|e| checkpoint_error(path, e))?;
        let manifest: checkpoint::Manifest = serde_json::from_str(&text).map_err(|e| checkpoint_error(path, e))?;
        checkpoint::load::load(path, manifest.step).map_err(|e| checkpoint_error(path, e))?
    } else {
        let search = checkpoint::find_latest(path)?;
        for s in &search.skipped {
            eprintln!("warning: skipping checkpoint {}: {}", s.path.display(), s.reason);
        }
        search.found.ok_or_else(|| checkpoint_error(path, "holds no valid checkpoint"))?
    };
    let mut config_json = found.manifest.config.clone();
    if let Some(map) = config_json.as_object_mut() {
        map.insert("seed".into(), found.manifest.seed.into());
    }
    let config: TrainerConfig = serde_json::from_value(config_json)
        .map_err(|e| checkpoint_error(&found.path, format!("manifest config: {e}")))?;
    let dim = config.model.embedding_dim();
    let mut tables: Vec<Vec<f32>> = config.table_sizes.iter().map(|&n| vec![0.0; n as usize * dim]).collect();
    let mut dense = Vec::new();
    for part in &found.parts {
        if !part.dense_params.is_empty() {
            dense = part.dense_params.clone();
        }
        for (t, rows) in part.tables.iter().enumerate() {
            let table = tables
                .get_mut(t)
                .ok_or_else(|| checkpoint_error(&found.path, format!("table {t} beyond the config")))?;
            for (k, &id) in rows.ids.iter().enumerate() {
                let at = id as usize * dim;
                let dst = table
                    .get_mut(at..at + dim)
                    .ok_or_else(|| checkpoint_error(&found.path, format!("id {id} beyond table {t}")))?;
                dst.copy_from_slice(&rows.rows[k * dim..(k + 1) * dim]);
            }
        }
    }
    Ok(ServedModel { config, step: found.manifest.step, dense, tables })
}

impl ServedModel {
    /// The model, built from the configuration with the checkpoint's dense parameters.
    pub fn build_model(&self) -> Result<Box<dyn Model<f32>>, PipelineError> {
        let mut model = self.config.model.build::<f32>(self.config.seed)?;
        if model.params().len() != self.dense.len() {
            return Err(PipelineError::Checkpoint(format!(
                "step {}: {} dense parameters for a model of {}",
                self.step,
                self.dense.len(),
                model.params().len()
            )));
        }
        model.params_mut().copy_from_slice(&self.dense);
        Ok(model)
    }

    /// Appends to `probs` the click probability of every sample of `batch`
    /// (no sequences): the sum of each field's rows, then `model`'s logit,
    /// then the sigmoid. `pooled` is scratch space.
    pub fn score_batch(&self, model: &mut dyn Model<f32>, batch: &Batch, pooled: &mut Vec<f32>, probs: &mut Vec<f32>) {
        let (b, fields, dim) = (batch.len(), batch.sparse.len(), self.config.model.embedding_dim());
        pooled.clear();
        pooled.resize(b * fields * dim, 0.0);
        for (f, field) in batch.sparse.iter().enumerate() {
            for s in 0..b {
                let out = &mut pooled[(s * fields + f) * dim..(s * fields + f + 1) * dim];
                for &id in field.bag(s) {
                    let row = &self.tables[f][id as usize * dim..(id as usize + 1) * dim];
                    out.iter_mut().zip(row).for_each(|(o, &r)| *o += r);
                }
            }
        }
        let logits = model.forward(&batch.dense, pooled, b);
        probs.extend(logits.iter().map(|&x| sigmoid(x)));
    }
}

/// What `export` wrote.
#[derive(Clone, Debug, Serialize)]
pub struct ExportSummary {
    /// Step of the checkpoint.
    pub step: u64,
    /// Dense parameters.
    pub dense_params: usize,
    /// Embedding rows over all tables.
    pub embedding_rows: u64,
}

/// Version of the serving snapshot's layout (named tensors, `model.json` sections).
pub const SERVING_FORMAT_VERSION: u32 = 2;

/// Writes the serving snapshot of the checkpoint at `checkpoint` into `out` (see the module docs).
pub fn export(checkpoint: &Path, out: &Path) -> Result<ExportSummary, PipelineError> {
    let m = load(checkpoint)?;
    let model = &m.config.model;
    let params = model.param_tensors();
    if params.last().map_or(0, |t| t.range().end) != m.dense.len() {
        return Err(checkpoint_error(checkpoint, "dense parameters do not match the model"));
    }
    let names = names::input_names(model);
    let tables = tables::table_tensors(model, &names, m.tables);
    let mut tensors: Vec<ServingTensor> = params
        .iter()
        .map(|t| ServingTensor { name: t.name.clone(), shape: t.shape.clone(), values: &m.dense[t.range()] })
        .collect();
    tensors.extend(tables.iter().map(|t| ServingTensor {
        name: t.name.clone(),
        shape: t.shape.clone(),
        values: &t.values,
    }));
    let shapes: serde_json::Map<String, serde_json::Value> =
        tensors.iter().map(|t| (t.name.clone(), serde_json::json!(t.shape))).collect();
    let config = serde_json::json!({
        "format": "tiderec-serving",
        "format_version": SERVING_FORMAT_VERSION,
        "step": m.step,
        "kind": model.name(),
        "model": model,
        "dense_features": names.dense,
        "sparse_fields": names.sparse,
        "tensors": shapes,
        "forward": describe::forward(model, &names),
        "output": {
            "logit": "the forward's logit (one value per record)",
            "probability": "sigmoid(logit) = 1 / (1 + exp(-logit)), the click probability",
        },
        "features": features::feature_pipeline(&m.config, &names),
    });
    write_serving(out, &tensors, &config)?;
    Ok(ExportSummary { step: m.step, dense_params: m.dense.len(), embedding_rows: m.config.table_sizes.iter().sum() })
}

/// What `eval` measured.
#[derive(Clone, Debug, Serialize)]
pub struct EvalReport {
    /// Step of the checkpoint.
    pub step: u64,
    /// Records scored.
    pub samples: u64,
    /// Exact AUC (`None` with one class only).
    pub auc: Option<f64>,
    /// Mean log loss.
    pub logloss: f64,
    /// Malformed records skipped.
    pub bad_records: u64,
}

/// Scores `data` (`criteo:PATH[,PATH…]`) with the checkpoint's model.
pub fn eval(checkpoint: &Path, data: &str, batch_size: usize) -> Result<EvalReport, PipelineError> {
    let m = load(checkpoint)?;
    let paths = match DataSpec::parse("data", data)? {
        DataSpec::Criteo(paths) => paths,
        other => {
            return Err(PipelineError::config(
                "data",
                format!("eval reads criteo:PATH records, not {}", other.format()),
            ))
        }
    };
    let model_cfg = &m.config.model;
    if model_cfg.num_sequences() > 0 || model_cfg.num_sparse() != NUM_SPARSE || model_cfg.num_dense() != NUM_DENSE {
        return Err(PipelineError::config(
            "checkpoint",
            "eval scores Criteo-shaped models (13 dense, 26 sparse fields, no crosses or sequences)",
        ));
    }
    let mut model = m.build_model()?;
    let features = CriteoFeatures { table_sizes: m.config.table_sizes.clone(), seed: m.config.seed };
    let config = CriteoConfig { policy: BadRecordPolicy::Skip, ..CriteoConfig::new(features) };
    let mut reader = CriteoReader::open(&paths, 0, 1, config, None)?;
    let (mut probs, mut labels) = (Vec::new(), Vec::new());
    let mut batch = Batch::new(NUM_DENSE, NUM_SPARSE);
    let mut pooled = Vec::new();
    loop {
        batch.clear();
        let n = reader.next_batch(&mut batch, batch_size.max(1))?;
        if n == 0 {
            break;
        }
        m.score_batch(model.as_mut(), &batch, &mut pooled, &mut probs);
        labels.extend_from_slice(&batch.labels);
    }
    Ok(EvalReport {
        step: m.step,
        samples: probs.len() as u64,
        auc: auc(&probs, &labels),
        logloss: logloss(&probs, &labels),
        bad_records: reader.bad_counts().total(),
    })
}
