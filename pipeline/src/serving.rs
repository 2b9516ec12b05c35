//! A checkpoint's model outside of training: [`load`] (for `tiderec predict`, `eval`
//! and `serve`) and `tiderec export`.
//!
//! Both read a checkpoint (a `ckpt-<step>` directory, or a checkpoint directory whose
//! newest valid checkpoint is taken), check its parts as a resume does, merge every
//! worker's embedding rows into one table per field by id (whole for the fixed store,
//! the rows held for a store that holds only the rows it sees: [`embedding`]), and
//! rebuild the model from the configuration in its manifest, so neither needs the flags
//! of the run that wrote it. Scoring records is
//! `crate::predict`'s, which builds on this module (never the other way round).
//!
//! `export` writes a self-describing serving snapshot (`docs/export.md`): the
//! dense layers under PyTorch's names and layouts ([`tiderec_operators::nn::named`]),
//! the embedding tables named by field ([`tables`]), whole or as their trained
//! rows ([`compact`]), and `model.json` with the model kind, every tensor's
//! shape, the forward computation ([`describe`]) and the feature pipeline
//! ([`features`]).

pub mod compact;
pub mod describe;
pub mod embedding;
pub mod features;
pub mod names;
pub mod tables;

use crate::error::CheckpointAction;
use crate::feature_pipeline::FeaturePipeline;
use crate::PipelineError;
use embedding::{Absent, Table, TooLarge};
use serde::Serialize;
use std::path::Path;
use tiderec_operators::nn::ModelConfig;
use tiderec_operators::snapshot::{self, Expected};
use tiderec_operators::store::StoreKind;
use tiderec_operators::train::TrainerConfig;
use tiderec_sinks::checkpoint::export::{write_serving, Tensor, Values};
use tiderec_sinks::checkpoint::{self, Checkpoint};

/// A checkpoint's model, ready to score.
pub struct ServedModel {
    /// The trainer configuration (model, table sizes, seed).
    pub config: TrainerConfig,
    /// The step it was taken at.
    pub step: u64,
    /// Flat dense parameters.
    pub dense: Vec<f32>,
    /// Per table, its rows ([`Table::Whole`] for a store that holds every row, the rows the
    /// checkpoint lists for one that does not).
    pub tables: Vec<Table>,
    /// How the run made features (`None`: the manifest records none, an older checkpoint).
    pub pipeline: Option<FeaturePipeline>,
    /// Per table, the sorted ids of the rows the checkpoint lists (those training changed,
    /// or those a dynamic store held); kept only where asked for ([`load_listed`]).
    pub listed: Option<Vec<Vec<u64>>>,
    /// What the rows it does not list hold: their seeded initial values (a checkpoint of
    /// updated rows only, or a dynamic store's absent rows when it admits an id at its
    /// first sighting) or zeros (a dynamic store's absent rows when it admits later).
    pub unlisted: Unlisted,
}

/// What the rows a checkpoint does not list hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unlisted {
    /// Their seeded initial values ([`tiderec_operators::store::init_row`]).
    Seeded,
    /// Zeros.
    Zero,
}

fn checkpoint_error(path: &Path, reason: impl Into<String>) -> PipelineError {
    PipelineError::checkpoint(CheckpointAction::Read, Some(path.to_path_buf()), reason)
}

/// Loads the checkpoint at `path` (see the module docs).
pub fn load(path: &Path) -> Result<ServedModel, PipelineError> {
    load_with(path, false)
}

/// [`load`], keeping the ids of the rows the checkpoint lists ([`ServedModel::listed`]).
pub fn load_listed(path: &Path) -> Result<ServedModel, PipelineError> {
    load_with(path, true)
}

fn load_with(path: &Path, keep_ids: bool) -> Result<ServedModel, PipelineError> {
    let found = find(path)?;
    let config = config_of(&found)?;
    let pipeline = FeaturePipeline::from_manifest(found.manifest.pipeline.as_ref(), &found.path)?;
    if let Some(p) = &pipeline {
        p.check_model(&config).map_err(|differences| {
            checkpoint_error(
                &found.path,
                format!("its manifest's pipeline does not make its model's inputs: {}", differences.join("; ")),
            )
        })?;
    }
    let dense = check_parts(&found, &config)?;
    let (tables, unlisted) = tables_of(&found, &config)?;
    let listed = keep_ids.then(|| listed_ids(&found, config.table_sizes.len()));
    Ok(ServedModel { config, step: found.manifest.step, dense, tables, pipeline, listed, unlisted })
}

/// The checkpoint at `path`: the one there, or the newest valid one of the directory.
fn find(path: &Path) -> Result<Checkpoint, PipelineError> {
    if path.join(checkpoint::layout::MANIFEST_FILE).is_file() {
        let text = std::fs::read_to_string(path.join(checkpoint::layout::MANIFEST_FILE))
            .map_err(|e| checkpoint_error(path, "cannot read its manifest").with_source(e))?;
        let manifest: checkpoint::Manifest = serde_json::from_str(&text)
            .map_err(|e| checkpoint_error(path, "its manifest is not valid").with_source(e))?;
        if let Some(named) = named_step(path)?.filter(|&n| n != manifest.step) {
            return Err(checkpoint_error(
                path,
                format!(
                    "its name says step {named} but its manifest is of step {}: a renamed directory or a manifest \
                     from another checkpoint; name the checkpoint of the step wanted",
                    manifest.step
                ),
            ));
        }
        return checkpoint::load::load(path, manifest.step)
            .map_err(|e| checkpoint_error(path, "its files cannot be loaded").with_source(e));
    }
    let search = checkpoint::find_latest(path)?;
    for s in &search.skipped {
        eprintln!("warning: skipping checkpoint {}: {}", s.path.display(), s.reason);
    }
    search.found.ok_or_else(|| checkpoint_error(path, "holds no valid checkpoint"))
}

/// The step a checkpoint directory's name (`ckpt-<step>`, links resolved) says it holds;
/// `None` for a directory named otherwise (a copy, an export's source), whose manifest
/// says it alone.
fn named_step(path: &Path) -> Result<Option<u64>, PipelineError> {
    let resolved =
        std::fs::canonicalize(path).map_err(|e| checkpoint_error(path, "cannot resolve it").with_source(e))?;
    Ok(resolved.file_name().and_then(|n| n.to_str()).and_then(checkpoint::layout::step_of))
}

/// The trainer configuration of `found`'s manifest (its config with its seed), checked as
/// a run's settings are.
fn config_of(found: &Checkpoint) -> Result<TrainerConfig, PipelineError> {
    let mut config_json = found.manifest.config.clone();
    if let Some(map) = config_json.as_object_mut() {
        map.insert("seed".into(), found.manifest.seed.into());
    }
    let config: TrainerConfig = serde_json::from_value(config_json)
        .map_err(|e| checkpoint_error(&found.path, "manifest config").with_source(e))?;
    config.validate().map_err(|e| checkpoint_error(&found.path, format!("its manifest's config is not valid: {e}")))?;
    if let ModelConfig::Custom(_) = config.model {
        return Err(checkpoint_error(
            &found.path,
            "its model is a program's own (kind `custom`): that program builds it to score (Trainer::with_model)",
        ));
    }
    Ok(config)
}

/// Checks that the parts of `found` hold the model `config` and the manifest's seed
/// describe, as a resume checks them ([`snapshot::check_parts`]: every part's tables, their
/// sizes and row widths, the seed the rows a part leaves out are re-created from, ids
/// inside their tables, the dense parameters and their optimizer state), and returns the
/// dense parameters. A hand-edited manifest that no longer describes its files is refused
/// here, for every reader alike.
fn check_parts(found: &Checkpoint, config: &TrainerConfig) -> Result<Vec<f32>, PipelineError> {
    let dim = config.model.embedding_dim();
    let expected = Expected {
        table_sizes: &config.table_sizes,
        dim,
        state_width: config.sparse_optimizer.state_width(dim),
        dense_len: config.model.param_tensors().last().map_or(0, |t| t.range().end),
        dense_kind: config.dense_optimizer,
        every_row: config.store.kind == StoreKind::Fixed,
        seed: config.seed,
    };
    let checked = snapshot::check_parts(&found.parts, expected).map_err(|e| {
        checkpoint_error(
            &found.path,
            format!("its files do not hold the model its manifest describes (config and seed {})", config.seed),
        )
        .with_source(e)
    })?;
    Ok(checked.dense_params.to_vec())
}

/// The tables of `found`'s model of `config`, each row the checkpoint lists set (see
/// [`embedding`]), and what the other rows hold: what the trainer read for them.
fn tables_of(found: &Checkpoint, config: &TrainerConfig) -> Result<(Vec<Table>, Unlisted), PipelineError> {
    let dim = config.model.embedding_dim();
    // A checkpoint of updated rows only leaves the others at their seeded values.
    let seeded = found.parts.iter().any(|p| p.updated_only);
    let fixed = config.store.kind == StoreKind::Fixed;
    // A dynamic store reads a row it does not hold as the row it would admit: the seeded
    // one when it admits at the first sighting, zeros when it admits later.
    let unlisted = if seeded || (!fixed && config.store.admits_at_once()) { Unlisted::Seeded } else { Unlisted::Zero };
    let too_large = |e: TooLarge| checkpoint_error(&found.path, "its tables do not fit in memory").with_source(e);
    let mut tables = Vec::with_capacity(config.table_sizes.len());
    for (t, &n) in config.table_sizes.iter().enumerate() {
        let bound = tiderec_operators::store::init_bound(n);
        tables.push(if seeded {
            Table::Whole(seeded_table(config.seed, t, n, dim).map_err(too_large)?)
        } else if fixed {
            Table::Whole(embedding::zeroed(t, n, dim).map_err(too_large)?)
        } else if unlisted == Unlisted::Seeded {
            Table::held(Absent::Init { seed: config.seed, table: t, bound })
        } else {
            Table::held(Absent::Zero)
        });
    }
    for part in &found.parts {
        for (rows, table) in part.tables.iter().zip(&mut tables) {
            for (&id, row) in rows.ids.iter().zip(rows.rows.chunks_exact(dim.max(1))) {
                table.set_row(id, row);
            }
        }
    }
    Ok((tables, unlisted))
}

/// Per table (of `tables`), the sorted ids of the rows the parts of `found` list.
fn listed_ids(found: &Checkpoint, tables: usize) -> Vec<Vec<u64>> {
    let mut listed = vec![Vec::new(); tables];
    for part in &found.parts {
        for (ids, rows) in listed.iter_mut().zip(&part.tables) {
            ids.extend_from_slice(&rows.ids);
        }
    }
    for ids in &mut listed {
        ids.sort_unstable();
        ids.dedup();
    }
    listed
}

/// Every row of table `t` (`n` rows of `dim`) at its seeded initial values, as a
/// new fixed store holds them.
fn seeded_table(seed: u64, t: usize, n: u64, dim: usize) -> Result<Vec<f32>, TooLarge> {
    let bound = tiderec_operators::store::init_bound(n);
    let mut table = embedding::zeroed(t, n, dim)?;
    for (id, row) in table.chunks_exact_mut(dim.max(1)).enumerate() {
        tiderec_operators::store::init_row(seed, t, id as u64, bound, row);
    }
    Ok(table)
}

/// What `export` wrote.
#[derive(Clone, Debug, Serialize)]
pub struct ExportSummary {
    /// Step of the checkpoint.
    pub step: u64,
    /// Dense parameters.
    pub dense_params: usize,
    /// Embedding rows written, over all tables.
    pub embedding_rows: u64,
    /// Rows of all tables.
    pub table_rows: u64,
}

/// How `export` writes the embedding tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TableLayout {
    /// Every row: `embeddings.<field>` `[rows, dim]`, row `i` = id `i`.
    #[default]
    Whole,
    /// The rows the checkpoint lists only (those training changed, or a dynamic store's
    /// rows), `<tensor>.ids` and `<tensor>.rows`; `model.json`'s `compact_tables` says what
    /// every other row holds (its value re-created from the seed, or zeros).
    Listed,
}

/// Version of the serving snapshot's layout (named tensors, `model.json` sections).
pub const SERVING_FORMAT_VERSION: u32 = 3;

/// Writes the serving snapshot of the checkpoint at `checkpoint` into `out` (see the module
/// docs), its tables laid out as `layout` says.
pub fn export(checkpoint: &Path, out: &Path, layout: TableLayout) -> Result<ExportSummary, PipelineError> {
    let m = load_with(checkpoint, layout == TableLayout::Listed)?;
    let model = &m.config.model;
    let params = model.param_tensors();
    let pipeline = m.pipeline.as_ref();
    let names = names::input_names(
        model,
        pipeline.map(|p| p.format.as_str()),
        pipeline.and_then(|p| p.spec.as_ref()).map(|s| &s.fields),
    );
    let table_rows = m.config.table_sizes.iter().sum();
    // The ids each table's tensors keep (all of them where `listed` is `None`).
    let kept: Option<&Vec<Vec<u64>>> = m.listed.as_ref();
    let tables = tables::table_tensors(model, &names, table_values(checkpoint, &m.config, m.tables, kept)?);
    let mut tensors: Vec<Tensor> = params
        .iter()
        .map(|t| Tensor { name: t.name.clone(), shape: t.shape.clone(), values: Values::F32(&m.dense[t.range()]) })
        .collect();
    let mut shapes: serde_json::Map<String, serde_json::Value> =
        tensors.iter().map(|t| (t.name.clone(), serde_json::json!(t.shape))).collect();
    // A table tensor's whole shape, whatever rows it keeps.
    let whole_shape = |t: &tables::TableTensor| serde_json::json!([m.config.table_sizes[t.table], t.shape[1]]);
    shapes.extend(tables.iter().map(|t| (t.name.clone(), whole_shape(t))));
    match &kept {
        None => tensors.extend(tables.iter().map(|t| Tensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            values: Values::F32(&t.values),
        })),
        Some(ids) => {
            for t in &tables {
                let ids = &ids[t.table];
                tensors.push(Tensor {
                    name: format!("{}.ids", t.name),
                    shape: vec![ids.len()],
                    values: Values::U64(ids),
                });
                tensors.push(Tensor {
                    name: format!("{}.rows", t.name),
                    shape: vec![ids.len(), t.shape[1]],
                    values: Values::F32(&t.values),
                });
            }
        }
    }
    let mut config = serde_json::json!({
        "format": "tiderec-serving",
        "format_version": SERVING_FORMAT_VERSION,
        "step": m.step,
        "kind": model.name(),
        "model": model,
        "dense_features": names.dense,
        "sparse_fields": names.sparse,
        "sequence_fields": names.sequences,
        "tensors": shapes,
        "forward": describe::forward(model, &names, &m.config.sequence_tables),
        "output": {
            "logit": "the forward's logit (one value per record)",
            "probability": "sigmoid(logit) = 1 / (1 + exp(-logit)), the click probability",
        },
        "features": features::feature_pipeline(&m.config, m.pipeline.as_ref(), &names),
        "pipeline": m.pipeline,
    });
    if kept.is_some() {
        config["compact_tables"] = compact::section(&m.config, &tables, m.unlisted);
    }
    write_serving(out, &tensors, &config)?;
    let embedding_rows = kept.map_or(table_rows, |ids| ids.iter().map(|v| v.len() as u64).sum());
    Ok(ExportSummary { step: m.step, dense_params: m.dense.len(), embedding_rows, table_rows })
}

/// The values of each of `tables` (of a model of `config`, from `checkpoint`) as `export`
/// writes them: every row, row `i` = id `i`, or with `kept`, the rows of each table's kept
/// ids in their order. A table too large to be held whole is an error naming it.
fn table_values(
    checkpoint: &Path,
    config: &TrainerConfig,
    tables: Vec<Table>,
    kept: Option<&Vec<Vec<u64>>>,
) -> Result<Vec<Vec<f32>>, PipelineError> {
    let dim = config.model.embedding_dim();
    if let Some(ids) = kept {
        return Ok(tables.iter().zip(ids).map(|(table, ids)| table.rows_of(ids, dim)).collect());
    }
    let whole = |(t, table): (usize, Table)| {
        table.into_whole(t, config.table_sizes[t], dim).map_err(|e| {
            checkpoint_error(
                checkpoint,
                "its tables cannot be exported whole (--compact writes only the rows it lists)",
            )
            .with_source(e)
        })
    };
    tables.into_iter().enumerate().map(whole).collect()
}
