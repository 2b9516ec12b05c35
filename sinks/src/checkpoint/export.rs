//! Serving snapshots (`tiderec export`): the model of a checkpoint without
//! its optimizer state, in one safetensors file plus its configuration.
//!
//! `model.safetensors` holds `dense` (F32 `[n]`, the flat dense parameters in
//! the model's own order) and one `table.<t>` (F32 `[rows, dim]`) per
//! embedding table, row `i` being id `i`; `model.json` holds the model and
//! table configuration, the seed that hashes raw categorical values into
//! ids, and the step. Both are written to temporary names, fsynced and
//! renamed.

use super::tensors::{write, Tensor, Values};
use crate::SinkError;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// File names of a serving snapshot.
pub const MODEL_FILE: &str = "model.safetensors";
/// Its configuration.
pub const CONFIG_FILE: &str = "model.json";

/// One embedding table, row-major `[rows, dim]`.
pub struct ExportTable<'a> {
    /// Rows (ids `0..rows`).
    pub rows: usize,
    /// Row width.
    pub dim: usize,
    /// `rows × dim` values.
    pub values: &'a [f32],
}

/// Writes `dir/model.safetensors` and `dir/model.json` (see the module docs).
pub fn write_serving(
    dir: &Path,
    dense: &[f32],
    tables: &[ExportTable<'_>],
    config: &serde_json::Value,
) -> Result<(), SinkError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| SinkError::Io { path: path.clone(), source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut list = vec![Tensor { name: "dense".into(), shape: vec![dense.len()], values: Values::F32(dense) }];
    for (t, table) in tables.iter().enumerate() {
        list.push(Tensor {
            name: format!("table.{t}"),
            shape: vec![table.rows, table.dim],
            values: Values::F32(table.values),
        });
    }
    let tmp_model = dir.join(format!(".{MODEL_FILE}.tmp"));
    let metadata = HashMap::from([("format".to_string(), "tiderec-serving".to_string())]);
    write(&tmp_model, &list, metadata)?;
    let tmp_config = dir.join(format!(".{CONFIG_FILE}.tmp"));
    let text = serde_json::to_string_pretty(config)
        .map_err(|e| SinkError::Checkpoint { path: tmp_config.display().to_string(), reason: e.to_string() })?;
    let mut f = std::fs::File::create(&tmp_config).map_err(io(&tmp_config))?;
    f.write_all(text.as_bytes()).and_then(|_| f.sync_all()).map_err(io(&tmp_config))?;
    std::fs::rename(&tmp_model, dir.join(MODEL_FILE)).map_err(io(dir))?;
    std::fs::rename(&tmp_config, dir.join(CONFIG_FILE)).map_err(io(dir))?;
    Ok(())
}
