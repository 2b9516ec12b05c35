//! Temporary names for files written whole and then renamed into place.
//!
//! Invariant: a temporary name belongs to one process and one file, so writing it
//! never truncates another file or another run's temporary file.

use std::path::{Path, PathBuf};

/// A temporary name beside `path` that is this process's own (`NAME.tmp-PID`): no other
/// file or run uses it, so writing it and renaming it over `path` replaces nothing else.
pub fn temp_beside(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", std::process::id()));
    path.with_file_name(name)
}
