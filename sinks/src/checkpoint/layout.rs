//! Names in a checkpoint directory, and listing the checkpoints of a directory.
//!
//! ```text
//! DIR/ckpt-<step>/manifest.json
//!                /dense.safetensors
//!                /shard-<k>.safetensors        k = 0 … workers-1
//! DIR/.tmp-ckpt-<step>-<pid>/                  a checkpoint being written
//! DIR/.old-ckpt-<step>-<pid>/                  a replaced one, being removed (restored
//!                                              if its replacement never got the name)
//! DIR/best -> ckpt-<step>                      the best evaluated checkpoint (a relative symlink)
//! ```
//!
//! Only `ckpt-<digits>` directories are checkpoints; everything else is
//! ignored when loading. `best` exists once a run with evaluations has
//! checkpointed its best step; pruning never removes the checkpoint it names.

use crate::SinkError;
use std::path::{Path, PathBuf};

/// The dense parameters and the dense-optimizer state.
pub const DENSE_FILE: &str = "dense.safetensors";
/// The manifest.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Prefix of a checkpoint being written.
pub const TEMP_PREFIX: &str = ".tmp-ckpt-";
/// Prefix of a checkpoint being replaced.
pub const OLD_PREFIX: &str = ".old-ckpt-";

/// The symbolic link naming the best evaluated checkpoint.
pub const BEST_LINK: &str = "best";

/// The step of the checkpoint `DIR/best` names, if the link exists and names a checkpoint.
pub fn best_step(dir: &Path) -> Option<u64> {
    let target = std::fs::read_link(dir.join(BEST_LINK)).ok()?;
    step_of(target.file_name()?.to_str()?)
}

/// The shard file of worker `k`.
pub fn shard_file(k: usize) -> String {
    format!("shard-{k}.safetensors")
}

/// The directory name of the checkpoint of `step`.
pub fn checkpoint_name(step: u64) -> String {
    format!("ckpt-{step}")
}

/// The step of a checkpoint directory name (`ckpt-<digits>`).
pub fn step_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("ckpt-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The step of a replaced checkpoint's name (`.old-ckpt-<step>-<pid>`).
pub fn replaced_step(name: &str) -> Option<u64> {
    let (step, pid) = name.strip_prefix(OLD_PREFIX)?.split_once('-')?;
    pid.parse::<u32>().ok()?;
    step_of(&format!("ckpt-{step}"))
}

/// The process id in a temporary name (`.tmp-ckpt-<step>-<pid>`, `.old-ckpt-<step>-<pid>`).
pub fn temp_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(TEMP_PREFIX).or_else(|| name.strip_prefix(OLD_PREFIX))?;
    rest.rsplit_once('-')?.1.parse().ok()
}

/// The checkpoints in `dir`, oldest (lowest step) first; an absent `dir` has none.
pub fn list_checkpoints(dir: &Path) -> Result<Vec<(u64, PathBuf)>, SinkError> {
    let read = |source| SinkError::Read { path: dir.display().to_string(), source };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(read(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(read)?;
        if let Some(step) = entry.file_name().to_str().and_then(step_of) {
            if entry.path().is_dir() {
                out.push((step, entry.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        assert_eq!(step_of("ckpt-30"), Some(30));
        assert_eq!(step_of(&checkpoint_name(7)), Some(7));
        for bad in ["ckpt-", "ckpt-3a", "ckpt--1", ".tmp-ckpt-3-44", "xckpt-3"] {
            assert_eq!(step_of(bad), None, "{bad}");
        }
        assert_eq!(temp_pid(".tmp-ckpt-30-4411"), Some(4411));
        assert_eq!(temp_pid(".old-ckpt-30-12"), Some(12));
        assert_eq!(temp_pid("ckpt-30"), None);
        assert_eq!(replaced_step(".old-ckpt-30-12"), Some(30));
        for bad in [".old-ckpt-30", ".old-ckpt-x-12", ".tmp-ckpt-30-12", "ckpt-30"] {
            assert_eq!(replaced_step(bad), None, "{bad}");
        }
    }

    #[test]
    fn listing_is_sorted_by_step_and_ignores_other_entries() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["ckpt-100", "ckpt-20", "ckpt-3", ".tmp-ckpt-40-1", "notes"] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        std::fs::write(dir.path().join("ckpt-50"), b"a file, not a checkpoint").unwrap();
        let steps: Vec<u64> = list_checkpoints(dir.path()).unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(steps, vec![3, 20, 100]);
        assert!(list_checkpoints(&dir.path().join("absent")).unwrap().is_empty());
    }
}
