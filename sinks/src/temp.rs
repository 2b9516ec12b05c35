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

/// Moves the finished temporary file `tmp` to `path` only if nothing is at `path`
/// (a file the user made or another run wrote while this one worked stays as it is):
/// `path` is linked to `tmp`'s contents, which the link makes visible whole, and the
/// temporary name is removed. An existing `path` gives [`std::io::ErrorKind::AlreadyExists`]
/// and leaves `tmp` in place for the caller to remove.
///
/// Where the file system cannot link (some network or FUSE file systems), an existing
/// `path` is refused just before a plain rename: a file created in that instant is
/// replaced, the one case this cannot rule out.
pub fn commit_new(tmp: &Path, path: &Path) -> std::io::Result<()> {
    match std::fs::hard_link(tmp, path) {
        Ok(()) => {
            // The contents are at `path` now; the temporary name is only a second link.
            let _ = std::fs::remove_file(tmp);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(e),
        Err(_) => {
            if std::fs::symlink_metadata(path).is_ok() {
                return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "the file exists"));
            }
            std::fs::rename(tmp, path)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_new_moves_a_file_into_a_free_name() {
        let dir = tempfile::tempdir().unwrap();
        let (tmp, out) = (dir.path().join("a.tmp"), dir.path().join("a"));
        std::fs::write(&tmp, b"scores").unwrap();
        commit_new(&tmp, &out).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"scores");
        assert!(!tmp.exists(), "the temporary name is gone");
    }

    #[test]
    fn commit_new_never_replaces_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let (tmp, out) = (dir.path().join("a.tmp"), dir.path().join("a"));
        std::fs::write(&tmp, b"scores").unwrap();
        std::fs::write(&out, b"the user's file").unwrap();
        let e = commit_new(&tmp, &out).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&out).unwrap(), b"the user's file");
        assert_eq!(std::fs::read(&tmp).unwrap(), b"scores", "the temporary file is left to the caller");
    }
}
