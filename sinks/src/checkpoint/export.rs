//! Serving snapshots (`tiderec export`): the model of a checkpoint without
//! its optimizer state, in one safetensors file plus its description.
//!
//! `model.safetensors` holds named tensors, F32 values and U64 ids (the caller
//! names them: the dense layers with PyTorch's names and layouts, one embedding
//! table per field, `[rows, dim]` with row `i` = id `i`, or its trained rows and
//! their ids); `model.json` holds the
//! description the caller builds (model kind, every tensor's shape, the
//! forward computation, the feature pipeline). Both are written to
//! temporary names in the directory, fsynced and renamed, so a reader never
//! sees a partly written file; a failed write (a full disk) removes the
//! temporary files, and the directory when the write created it.
//!
//! `model.json` marks a complete snapshot: it is renamed into place last, and
//! a snapshot it replaces loses its `model.json` (removed, the removal made
//! durable) before its `model.safetensors` is replaced, so a crash at any
//! moment leaves either a complete pair or a directory without `model.json`,
//! never the description of one snapshot beside the tensors of another. The
//! directory is fsynced after the renames.

use super::tensors::write;
use super::write::{sync_dir, sync_parent};
use crate::SinkError;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// File names of a serving snapshot.
pub const MODEL_FILE: &str = "model.safetensors";
/// Its configuration.
pub const CONFIG_FILE: &str = "model.json";

pub use super::tensors::{Tensor, Values};

/// Writes `dir/model.safetensors` (the `tensors`, in this order) and
/// `dir/model.json` (`config`), see the module docs. A tensor whose shape
/// does not match its values is an error naming it, before anything is written.
pub fn write_serving(dir: &Path, tensors: &[Tensor<'_>], config: &serde_json::Value) -> Result<(), SinkError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| SinkError::Io { path: path.clone(), source }
    };
    if let Some(t) = tensors.iter().find(|t| t.shape.iter().product::<usize>() != t.values.len()) {
        return Err(SinkError::Checkpoint {
            path: dir.join(MODEL_FILE).display().to_string(),
            reason: format!("tensor {} has shape {:?} but {} values", t.name, t.shape, t.values.len()),
        });
    }
    let created = !dir.exists();
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tmp_model = dir.join(format!(".{MODEL_FILE}.tmp"));
    let tmp_config = dir.join(format!(".{CONFIG_FILE}.tmp"));
    let written = write_both(dir, tensors, config, &tmp_model, &tmp_config);
    if written.is_err() {
        // Nothing half-written stays: the temporary files, and the directory if this call made it.
        let _ = std::fs::remove_file(&tmp_model);
        let _ = std::fs::remove_file(&tmp_config);
        if created {
            let _ = std::fs::remove_dir_all(dir);
        }
        return written;
    }
    // A directory this call made is made durable in its parent too; the export in it is
    // complete, so a failure here leaves it in place.
    if created {
        sync_parent(dir)?;
    }
    Ok(())
}

/// The writes of [`write_serving`]: both files under their temporary names, then renamed.
fn write_both(
    dir: &Path,
    tensors: &[Tensor<'_>],
    config: &serde_json::Value,
    tmp_model: &Path,
    tmp_config: &Path,
) -> Result<(), SinkError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| SinkError::Io { path: path.clone(), source }
    };
    let metadata = HashMap::from([("format".to_string(), "tiderec-serving".to_string())]);
    write(tmp_model, tensors, metadata)?;
    let text = serde_json::to_string_pretty(config)
        .map_err(|e| SinkError::Checkpoint { path: tmp_config.display().to_string(), reason: e.to_string() })?;
    let mut f = std::fs::File::create(tmp_config).map_err(io(tmp_config))?;
    f.write_all(text.as_bytes()).and_then(|_| f.sync_all()).map_err(io(tmp_config))?;
    replace(dir, tmp_model, tmp_config)
}

/// Renames the written temporary files into place in `dir`, `model.json` last, after an
/// earlier `model.json` is gone for good (see the module docs); then fsyncs `dir`.
fn replace(dir: &Path, tmp_model: &Path, tmp_config: &Path) -> Result<(), SinkError> {
    let config = dir.join(CONFIG_FILE);
    match std::fs::remove_file(&config) {
        Ok(()) => sync_dir(dir)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(SinkError::Io { path: config.display().to_string(), source }),
    }
    let model = dir.join(MODEL_FILE);
    std::fs::rename(tmp_model, &model).map_err(|source| SinkError::Io { path: model.display().to_string(), source })?;
    std::fs::rename(tmp_config, &config)
        .map_err(|source| SinkError::Io { path: config.display().to_string(), source })?;
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Named tensors and the description land under their final names, the
    /// temporary ones gone; a tensor whose shape does not match its values is
    /// refused by name before anything is written.
    #[test]
    fn writes_named_tensors_and_refuses_a_wrong_shape() {
        let dir = tempfile::tempdir().unwrap();
        let w = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let t = |name: &str, shape: Vec<usize>| Tensor { name: name.into(), shape, values: Values::F32(&w) };
        let out = dir.path().join("serve");
        write_serving(&out, &[t("bottom.0.weight", vec![2, 3])], &serde_json::json!({"kind": "dlrm"})).unwrap();
        let names: Vec<String> =
            std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        let bytes = std::fs::read(out.join(MODEL_FILE)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("bottom.0.weight").unwrap().shape(), [2, 3]);
        let bad = dir.path().join("bad");
        let e = write_serving(&bad, &[t("top.0.weight", vec![4, 2])], &serde_json::json!({})).unwrap_err();
        assert!(e.to_string().contains("top.0.weight") && e.to_string().contains("6 values"), "{e}");
        assert!(!bad.exists());
    }

    /// A snapshot written over another replaces both files; one whose tensors cannot take
    /// their name (here a directory holds it) leaves no `model.json`, the old one removed
    /// first, so the old description never stands beside other tensors.
    #[test]
    fn a_replaced_snapshot_loses_its_description_before_its_tensors() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("serve");
        let (a, b) = ([1.0f32, 2.0], [3.0f32, 4.0]);
        fn t(w: &[f32]) -> [Tensor<'_>; 1] {
            [Tensor { name: "w".into(), shape: vec![2], values: Values::F32(w) }]
        }
        write_serving(&out, &t(&a), &serde_json::json!({"kind": "a"})).unwrap();
        write_serving(&out, &t(&b), &serde_json::json!({"kind": "b"})).unwrap();
        let config = std::fs::read_to_string(out.join(CONFIG_FILE)).unwrap();
        assert!(config.contains("\"b\""), "{config}");
        let bytes = std::fs::read(out.join(MODEL_FILE)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("w").unwrap().data(), le_bytes(&b));
        std::fs::remove_file(out.join(MODEL_FILE)).unwrap();
        std::fs::create_dir_all(out.join(MODEL_FILE).join("held")).unwrap();
        assert!(write_serving(&out, &t(&a), &serde_json::json!({"kind": "c"})).is_err());
        let mut names: Vec<String> =
            std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, [MODEL_FILE], "no description, no temporary file");
    }

    fn le_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
}
