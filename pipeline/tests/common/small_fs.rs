//! A small file system for full-disk tests: a tmpfs of a given size, mounted on a
//! temporary directory for as long as the value lives.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A mounted tmpfs, unmounted (and its directory removed) when dropped.
pub struct SmallFs {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallFs {
    /// A tmpfs of `size` (as `mount -o size=` reads it: `64k`, `30M`), or `None`
    /// after [`super::skip::cannot_run`] where it cannot be mounted (only root may).
    pub fn mount(size: &str) -> Option<SmallFs> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("small");
        std::fs::create_dir(&path).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            super::skip::cannot_run("cannot mount a small tmpfs here (not root?)");
            return None;
        }
        Some(SmallFs { path, _dir: dir })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The names of every entry under it, recursively, sorted (hidden ones included).
    pub fn entries(&self) -> Vec<String> {
        fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                out.push(path.strip_prefix(root).unwrap().display().to_string());
                if path.is_dir() {
                    walk(&path, root, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.path, &self.path, &mut out);
        out.sort();
        out
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}
