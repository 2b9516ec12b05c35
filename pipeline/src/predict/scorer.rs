//! The batched forward pass of a checkpoint's model: the one scoring path of
//! `tiderec eval`, `tiderec predict` and `tiderec serve`.
//!
//! For each batch it does what a training step's prediction does on one
//! worker: skips the sequence fields the model does not read, appends the
//! crosses of the pipeline (for the pass only: the batch keeps its records'
//! shape, to be cleared and refilled), gathers each field's distinct rows, pools them
//! with [`pool_sum`] (the trainer's kernel, with the fields' pooling weights),
//! lays the sequences out padded to the batch's longest, and runs the model's
//! forward in its batch-invariant form ([`Model::set_batch_invariant`]).
//!
//! Invariant: a record's probability depends on the record alone (and the
//! model, this machine's kernels and the build), never on the batch it is
//! scored in or its place there: pooling and the padding of sequences are per
//! record, and every product of the forward sums each row the same way at any
//! row count. Single-threaded.

use crate::error::CheckpointAction;
use crate::feature_pipeline::FeaturePipeline;
use crate::serving::embedding::Table;
use crate::serving::ServedModel;
use crate::PipelineError;
use rustc_hash::FxHashMap;
use tiderec_operators::features::cross::append_crosses;
use tiderec_operators::nn::embedding_bag::pool_sum;
use tiderec_operators::nn::loss::sigmoid;
use tiderec_operators::nn::{Model, SequenceInput};
use tiderec_operators::snapshot::WorkerSnapshot;
use tiderec_operators::{Batch, SparseField};

/// A loaded model ready to score batches; see the [module docs](self).
pub struct Scorer {
    model: Box<dyn Model<f32>>,
    tables: Vec<Table>,
    table_sizes: Vec<u64>,
    dim: usize,
    num_sequences: usize,
    model_dense: usize,
    model_sparse: usize,
    sequence_tables: Vec<usize>,
    crosses: Vec<(usize, usize)>,
    cross_buckets: u64,
    hash_seed: u64,
    pooled: Vec<f32>,
    unique: Vec<f32>,
    index: Vec<u32>,
    seq_rows: Vec<f32>,
    seq_lengths: Vec<usize>,
}

/// The checkpoint's model does not match its own parts (`Read`) or the records (`Score`).
fn shape_error(action: CheckpointAction, what: String) -> PipelineError {
    PipelineError::checkpoint(action, None, what)
}

impl Scorer {
    /// The scorer of `model`, featurized by `pipeline` (its crosses and hashing seed).
    pub fn new(model: ServedModel, pipeline: &FeaturePipeline) -> Result<Self, PipelineError> {
        let cfg = &model.config;
        let mut net = cfg.model.build::<f32>(cfg.seed)?;
        if net.params().len() != model.dense.len() {
            return Err(shape_error(
                CheckpointAction::Read,
                format!(
                    "the checkpoint holds {} dense parameters, its model needs {}",
                    model.dense.len(),
                    net.params().len()
                ),
            ));
        }
        net.params_mut().copy_from_slice(&model.dense);
        net.set_batch_invariant(true);
        Ok(Scorer {
            model: net,
            dim: cfg.model.embedding_dim(),
            num_sequences: cfg.model.num_sequences(),
            model_dense: cfg.model.num_dense(),
            model_sparse: cfg.model.num_sparse(),
            sequence_tables: cfg.sequence_tables.clone(),
            table_sizes: cfg.table_sizes.clone(),
            tables: model.tables,
            crosses: pipeline.crosses.clone(),
            cross_buckets: pipeline.cross_buckets.unwrap_or(1),
            hash_seed: pipeline.hash.seed,
            pooled: Vec::new(),
            unique: Vec::new(),
            index: Vec::new(),
            seq_rows: Vec::new(),
            seq_lengths: Vec::new(),
        })
    }

    /// Applies a delta's parts (as stored: the rows changed since the checkpoint this
    /// scorer holds, the ids removed since, the whole dense parameters), all checked
    /// before anything is written, so on error the scorer is unchanged. A removed
    /// row reads as zeros, as rows a checkpoint does not hold do.
    pub fn apply_changes(&mut self, parts: &[WorkerSnapshot]) -> Result<(), PipelineError> {
        let bad = |what: String| Err(shape_error(CheckpointAction::Read, what));
        let dense = parts.iter().find(|p| !p.dense_params.is_empty()).map(|p| &p.dense_params);
        let Some(dense) = dense.filter(|d| d.len() == self.model.params().len()) else {
            return bad(format!("the delta carries no dense parameters for the model's {}", self.model.params().len()));
        };
        let dim = self.dim;
        for p in parts {
            if p.dim != dim || p.tables.len() != self.tables.len() {
                return bad(format!(
                    "the delta's part of worker {} has {} tables of rows of {}, the model {} of {dim}",
                    p.worker,
                    p.tables.len(),
                    p.dim,
                    self.tables.len()
                ));
            }
            for (t, rows) in p.tables.iter().enumerate() {
                let n = self.table_sizes[t];
                if rows.rows.len() != rows.ids.len() * dim || rows.ids.iter().chain(&rows.removed).any(|&id| id >= n) {
                    return bad(format!("the delta's table {t} (worker {}) does not fit {n} rows of {dim}", p.worker));
                }
            }
        }
        self.model.params_mut().copy_from_slice(dense);
        for p in parts {
            for (t, rows) in p.tables.iter().enumerate() {
                let table = &mut self.tables[t];
                for &id in &rows.removed {
                    table.clear_row(id, dim);
                }
                for (&id, row) in rows.ids.iter().zip(rows.rows.chunks_exact(dim.max(1))) {
                    table.set_row(id, row);
                }
            }
        }
        Ok(())
    }

    /// The rows of table `t` for `field`'s ids, distinct, and each entry's index among them.
    fn gather(&mut self, field: &SparseField, t: usize, name: &str) -> Result<(), PipelineError> {
        let (dim, rows) = (self.dim, self.table_sizes.get(t).copied().unwrap_or(0));
        self.unique.clear();
        self.index.clear();
        let mut seen: FxHashMap<u64, u32> = FxHashMap::default();
        for &id in &field.ids {
            if id >= rows {
                return Err(shape_error(
                    CheckpointAction::Score,
                    format!("{name}: id {id} is outside its table {t} of {rows} rows"),
                ));
            }
            let next = seen.len() as u32;
            let k = *seen.entry(id).or_insert_with(|| {
                self.tables[t].append_row(id, dim, &mut self.unique);
                next
            });
            self.index.push(k);
        }
        Ok(())
    }

    /// What differs between records of `dense` dense features, `sparse` sparse fields (the
    /// records' own, before the pipeline's crosses) and `sequences` sequence fields and what
    /// the model reads, in words; `None` when the model reads such records (sequence fields
    /// beyond those it reads are left unread).
    pub fn shape_mismatch(&self, dense: usize, sparse: usize, sequences: usize) -> Option<String> {
        let crosses = self.crosses.len();
        let fits =
            dense == self.model_dense && sparse + crosses == self.model_sparse && sequences >= self.num_sequences;
        (!fits).then(|| {
            let besides = match crosses {
                0 => String::new(),
                n => format!(" (besides the pipeline's {n} crosses)"),
            };
            format!(
                "the records have {dense} dense features, {sparse} sparse and {sequences} sequence fields; the model \
                 reads {} dense features, {} sparse{besides} and {} sequence fields",
                self.model_dense,
                self.model_sparse.saturating_sub(crosses),
                self.num_sequences
            )
        })
    }

    /// The probabilities (sigmoid of the logits) of `batch`'s samples, in order. A batch of
    /// another shape than the model reads ([`Scorer::shape_mismatch`], or dense values that
    /// are not `num_dense` per sample) is an error. The crosses of the pipeline are appended
    /// to the batch for the pass and removed after it, so the batch keeps its records' shape
    /// and can be cleared and filled again; sequence fields the model does not read are left
    /// unread.
    pub fn probabilities(&mut self, batch: &mut Batch) -> Result<Vec<f32>, PipelineError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mismatch = self.shape_mismatch(batch.num_dense, batch.sparse.len(), batch.sequences.len());
        if let Some(what) = mismatch {
            return Err(shape_error(CheckpointAction::Score, what));
        }
        if batch.dense.len() != batch.len() * self.model_dense {
            return Err(shape_error(
                CheckpointAction::Score,
                format!(
                    "the batch holds {} dense values for {} records of {} dense features",
                    batch.dense.len(),
                    batch.len(),
                    self.model_dense
                ),
            ));
        }
        let fields = batch.sparse.len();
        if !self.crosses.is_empty() {
            append_crosses(batch, &self.crosses, self.hash_seed, self.cross_buckets);
        }
        let probabilities = self.forward(batch);
        batch.sparse.truncate(fields);
        probabilities
    }

    fn forward(&mut self, batch: &Batch) -> Result<Vec<f32>, PipelineError> {
        let (b, f, d) = (batch.len(), batch.sparse.len(), self.dim);
        self.pooled.clear();
        self.pooled.resize(b * f * d, 0.0);
        for t in 0..f {
            let field = &batch.sparse[t];
            self.gather(field, t, &format!("sparse field {t}"))?;
            let weights = field.weights.as_deref();
            pool_sum(&self.unique, d, &field.offsets, &self.index, weights, t, f, &mut self.pooled);
        }
        let steps = self.lay_out_sequences(b, &batch.sequences[..self.num_sequences])?;
        let seq = SequenceInput { rows: &self.seq_rows, lengths: &self.seq_lengths, steps };
        let logits = self.model.forward_sequences(&batch.dense, &self.pooled, &seq, b);
        Ok(logits.iter().map(|&x| sigmoid(x)).collect())
    }

    /// `[B × T × S·d]` rows of the `b` samples' `sequences`, padded to the longest `T` of the
    /// batch (returned).
    fn lay_out_sequences(&mut self, b: usize, sequences: &[SparseField]) -> Result<usize, PipelineError> {
        let (d, s) = (self.dim, sequences.len());
        self.seq_lengths.clear();
        self.seq_rows.clear();
        let Some(first) = sequences.first() else { return Ok(0) };
        self.seq_lengths.extend((0..b).map(|i| first.bag(i).len()));
        let steps = self.seq_lengths.iter().copied().max().unwrap_or(0);
        let width = s * d;
        self.seq_rows.resize(b * steps * width, 0.0);
        for (j, field) in sequences.iter().enumerate() {
            let t = self.sequence_tables[j];
            self.gather(field, t, &format!("sequence field {j}"))?;
            for i in 0..b {
                let start = field.offsets[i] as usize;
                for step in 0..self.seq_lengths[i] {
                    let u = self.index[start + step] as usize;
                    let dst = (i * steps + step) * width + j * d;
                    self.seq_rows[dst..dst + d].copy_from_slice(&self.unique[u * d..(u + 1) * d]);
                }
            }
        }
        Ok(steps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serving::Unlisted;
    use crate::TrainSettings;

    /// The scorer of an untrained DLRM of Criteo's shape (13 dense features, 26 sparse
    /// fields of 50 rows).
    fn criteo_scorer() -> Scorer {
        let mut s = TrainSettings::default();
        s.data.source = "criteo:Cargo.toml".into();
        s.data.buckets = 50;
        s.model.dim = 4;
        s.model.bottom = vec![8, 4];
        s.model.top = vec![8, 1];
        let resolved = s.validate().unwrap();
        let config = crate::run::trainer_config(&s, &resolved);
        let params = config.model.build::<f32>(config.seed).unwrap().params().len();
        let tables = config.table_sizes.iter().map(|&n| Table::Whole(vec![0.01; n as usize * 4])).collect();
        let pipeline = FeaturePipeline::of_run(&s, &resolved);
        let model = ServedModel {
            config,
            step: 0,
            dense: vec![0.0; params],
            tables,
            pipeline: Some(pipeline.clone()),
            listed: None,
            unlisted: Unlisted::Seeded,
        };
        Scorer::new(model, &pipeline).unwrap()
    }

    /// `records` samples of `dense` dense features and 26 sparse fields, one id each.
    fn batch(records: usize, dense: usize) -> Batch {
        let mut b = Batch::new(dense, 26);
        for i in 0..records {
            b.labels.push(0.0);
            b.dense.extend(std::iter::repeat_n(0.5, dense));
            for f in &mut b.sparse {
                f.ids.push(i as u64 % 50);
                f.offsets.push(f.ids.len() as u32);
            }
        }
        b
    }

    /// Records without the model's dense features are an error naming both widths, not a
    /// panic of the forward pass; records of the model's shape score.
    #[test]
    fn records_of_another_dense_width_are_refused() {
        let mut scorer = criteo_scorer();
        assert_eq!(scorer.shape_mismatch(13, 26, 0), None);
        let e = scorer.probabilities(&mut batch(3, 0)).unwrap_err().to_string();
        assert!(e.contains("the records have 0 dense features") && e.contains("reads 13 dense features"), "{e}");
        let mut wrong = batch(3, 13);
        wrong.dense.pop();
        let e = scorer.probabilities(&mut wrong).unwrap_err().to_string();
        assert!(e.contains("38 dense values for 3 records of 13 dense features"), "{e}");
        let why = scorer.shape_mismatch(13, 25, 0).expect("a missing sparse field");
        assert!(why.contains("25 sparse") && why.contains("26 sparse"), "{why}");
        let probs = scorer.probabilities(&mut batch(3, 13)).unwrap();
        assert_eq!(probs.len(), 3);
        assert!(probs.iter().all(|p| p.is_finite() && *p > 0.0 && *p < 1.0), "{probs:?}");
    }
}
