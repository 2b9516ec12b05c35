//! A command's outputs checked against its inputs before anything is written.
//!
//! Invariants:
//! * No output of a command is the same file as one of its inputs: same device and
//!   inode when both exist (a hard link or a symbolic link to an input is that input),
//!   the same canonical path otherwise. Such a command is refused by
//!   [`check_outputs`] before any output is opened for writing, naming the output's
//!   flag, its path, and the input's flag and file.
//! * No two outputs of a command are the same file (one would overwrite the other).
//!   Outputs that are devices, FIFOs or sockets (`/dev/null`) are not compared: writing
//!   to them replaces nothing.
//! * A single-file output that is replaced wholesale is not replaced unless asked:
//!   [`check_new`] refuses an existing one without `--overwrite`.
//!
//! Inputs are files: the files of each `--data`-like `FORMAT:PATH[,PATH…]` (a directory
//! stands for every file in it), spec files and the vocabulary files they name, and
//! every file under a checkpoint directory that is read.

use std::path::{Path, PathBuf};
use thiserror::Error;

/// A path a command reads or writes, with the flag that named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    /// The flag (or settings key, spelled as its flag), e.g. `--dead-letters`.
    pub flag: String,
    /// The file (for an input given as a directory, one file in it).
    pub path: PathBuf,
}

impl Named {
    /// `path`, named by `flag`.
    pub fn new(flag: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        Named { flag: flag.into(), path: path.into() }
    }
}

/// Why a command's outputs are refused.
#[derive(Debug, Error)]
pub enum PathError {
    /// An output is the same file as an input.
    #[error(
        "{output} {} is the same file as the input {} (from {input}): writing it would destroy the input; \
         nothing was written, choose another path for {output}",
        .output_path.display(),
        .input_path.display()
    )]
    OutputIsInput {
        /// The output's flag.
        output: String,
        /// The output as given.
        output_path: PathBuf,
        /// The input's flag.
        input: String,
        /// The input file.
        input_path: PathBuf,
    },
    /// An output would be written into a directory read as data.
    #[error(
        "{output} {} would be written into {}, which {input} reads as data: the next run on that directory would \
         read it as records; nothing was written",
        .output_path.display(),
        .dir.display()
    )]
    OutputInDataDir {
        /// The output's flag.
        output: String,
        /// The output as given.
        output_path: PathBuf,
        /// The input's flag.
        input: String,
        /// The data directory.
        dir: PathBuf,
    },
    /// An output (directory or file) within a tiderec checkpoint directory (or one checkpoint).
    #[error(
        "{output} {} is within {}, {what}: files written there would mix with the checkpoints that training \
         writes and resuming reads; nothing was written, choose a path outside it",
        .output_path.display(),
        .dir.display()
    )]
    OutputInCheckpointDir {
        /// The output's flag.
        output: String,
        /// The output as given.
        output_path: PathBuf,
        /// The checkpoint directory (or checkpoint), canonical.
        dir: PathBuf,
        /// What it is (the one an input flag reads, or another run's).
        what: String,
    },
    /// Two outputs are the same file.
    #[error(
        "{first} {} and {second} {} are the same file: one output would overwrite the other; nothing was \
         written, choose another path for {second}",
        .first_path.display(),
        .second_path.display()
    )]
    SharedOutput {
        /// The first output's flag.
        first: String,
        /// The first output as given.
        first_path: PathBuf,
        /// The second output's flag.
        second: String,
        /// The second output as given.
        second_path: PathBuf,
    },
    /// A single-file output exists and `--overwrite` was not given.
    #[error("{flag} {} already exists: pass --overwrite to replace it", .path.display())]
    Exists {
        /// The output's flag.
        flag: String,
        /// The existing file.
        path: PathBuf,
    },
    /// A data path that exists but is a device, a FIFO or a socket.
    #[error("{} (read for {flag}) is not a regular file or a directory", .path.display())]
    NotRegular {
        /// The input's flag.
        flag: String,
        /// The path.
        path: PathBuf,
    },
    /// A data directory holding entries that would not be read.
    #[error(
        "{} (read for {flag}) holds {}, which would not be read (only the files directly in a data directory \
         are): name them as FORMAT:PATH,PATH or move them out",
        .path.display(),
        .entries.iter().map(|e| e.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    UnreadEntries {
        /// The input's flag.
        flag: String,
        /// The directory.
        path: PathBuf,
        /// Its subdirectories and other entries that are not regular files.
        entries: Vec<PathBuf>,
    },
    /// An input directory could not be listed.
    #[error("cannot list {} (read for {flag}): {source}", .path.display())]
    Unlistable {
        /// The input's flag.
        flag: String,
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Refuses an output that is the same file as an input or as an earlier output.
pub fn check_outputs(inputs: &[Named], outputs: &[Named]) -> Result<(), PathError> {
    let inputs: Vec<(&Named, Identity)> = inputs.iter().map(|n| (n, Identity::of(&n.path))).collect();
    let mut seen: Vec<(&Named, Identity)> = Vec::with_capacity(outputs.len());
    for output in outputs {
        let id = Identity::of(&output.path);
        if id.special {
            continue;
        }
        if let Some((input, _)) = inputs.iter().find(|(_, i)| i.same(&id)) {
            return Err(PathError::OutputIsInput {
                output: output.flag.clone(),
                output_path: output.path.clone(),
                input: input.flag.clone(),
                input_path: input.path.clone(),
            });
        }
        if let Some((first, _)) = seen.iter().find(|(_, i)| i.same(&id)) {
            return Err(PathError::SharedOutput {
                first: first.flag.clone(),
                first_path: first.path.clone(),
                second: output.flag.clone(),
                second_path: output.path.clone(),
            });
        }
        seen.push((output, id));
    }
    Ok(())
}

/// Refuses an existing `output` unless `overwrite` (a dangling symbolic link exists too).
pub fn check_new(output: &Named, overwrite: bool) -> Result<(), PathError> {
    if !overwrite && std::fs::symlink_metadata(&output.path).is_ok() {
        return Err(PathError::Exists { flag: output.flag.clone(), path: output.path.clone() });
    }
    Ok(())
}

/// [`check_new`] for an output written in place, never renamed over: a device or a pipe
/// (`/dev/stdout`, a FIFO) holds nothing to lose, so writing to it is no overwrite.
pub fn check_new_in_place(output: &Named, overwrite: bool) -> Result<(), PathError> {
    let special = std::fs::metadata(&output.path).is_ok_and(|m| is_special(&m));
    check_new(output, overwrite || special)
}

/// Whether a path is neither a file nor a directory (a device, a FIFO, a socket).
fn is_special(meta: &std::fs::Metadata) -> bool {
    !meta.is_file() && !meta.is_dir()
}

/// What makes two paths the same file.
struct Identity {
    /// Device and inode, when the path exists (symbolic links followed).
    inode: Option<(u64, u64)>,
    /// The canonical path; for a path that does not exist, its nearest existing ancestor's
    /// canonical path with the rest appended.
    canonical: PathBuf,
    /// The path exists and is neither a file nor a directory (a device, a FIFO, a socket).
    special: bool,
}

impl Identity {
    fn of(path: &Path) -> Self {
        let meta = std::fs::metadata(path).ok();
        Identity {
            inode: meta.as_ref().and_then(inode),
            canonical: canonical(path),
            special: meta.as_ref().is_some_and(is_special),
        }
    }

    fn same(&self, other: &Identity) -> bool {
        match (self.inode, other.inode) {
            (Some(a), Some(b)) => a == b,
            _ => self.canonical == other.canonical,
        }
    }
}

#[cfg(unix)]
fn inode(m: &std::fs::Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn inode(_m: &std::fs::Metadata) -> Option<(u64, u64)> {
    None
}

/// `path` canonicalized as far as it exists; a symbolic link to a path that does
/// not exist (yet) stands for its target, which writing through it creates.
fn canonical(path: &Path) -> PathBuf {
    canonical_within(path, 40)
}

/// [`canonical`], following at most `links` dangling symbolic links (a loop of them
/// ends as the last link's own path).
fn canonical_within(path: &Path, links: u32) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(path) {
        return c;
    }
    let dangling = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    if let (true, Some(target), true) = (dangling, std::fs::read_link(path).ok(), links > 0) {
        let base = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        return canonical_within(&base.join(target), links - 1);
    }
    match (path.parent(), path.file_name()) {
        // `NEW/..` once `NEW` is made (a directory, or a dangling link's target) is its parent.
        (Some(parent), None) if path.ends_with("..") => {
            let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
            let mut c = canonical_within(parent, links);
            c.pop();
            c
        }
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
            canonical_within(parent, links).join(name)
        }
        _ => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    }
}

/// The files of a `--data`-like value, named by `flag`: each path of `FORMAT:PATH[,PATH…]`,
/// a directory standing for the files in it; none for `synthetic` and other values without
/// paths. Paths that do not exist are kept (the reader reports them).
pub fn data_files(flag: &str, value: &str) -> Result<Vec<Named>, PathError> {
    let Some((_, paths)) = value.split_once(':') else { return Ok(Vec::new()) };
    let mut files = Vec::new();
    for p in paths.split(',').filter(|p| !p.is_empty()) {
        let path = PathBuf::from(p);
        if path.is_dir() {
            files.extend(dir_files(flag, &path)?.into_iter().map(|f| Named::new(flag, f)));
        } else if path.exists() && !path.is_file() {
            return Err(PathError::NotRegular { flag: flag.to_string(), path });
        } else {
            files.push(Named::new(flag, path));
        }
    }
    Ok(files)
}

/// The directories among a data value's paths (`criteo:DIR`), named by `flag`.
pub fn data_dirs(flag: &str, value: &str) -> Vec<Named> {
    let Some((_, paths)) = value.split_once(':') else { return Vec::new() };
    paths.split(',').filter(|p| !p.is_empty() && Path::new(p).is_dir()).map(|p| Named::new(flag, p)).collect()
}

/// Refuses an output file directly in one of `dirs` (directories read as data, whose
/// every file is a data file).
pub fn check_outside(dirs: &[Named], outputs: &[Named]) -> Result<(), PathError> {
    for output in outputs {
        let id = Identity::of(&output.path);
        if id.special {
            continue;
        }
        let Some(parent) = id.canonical.parent() else { continue };
        if let Some(dir) = dirs.iter().find(|d| canonical(&d.path) == parent) {
            return Err(PathError::OutputInDataDir {
                output: output.flag.clone(),
                output_path: output.path.clone(),
                input: dir.flag.clone(),
                dir: dir.path.clone(),
            });
        }
    }
    Ok(())
}

/// Refuses an output directory at or under a tiderec checkpoint directory or a checkpoint
/// (`ckpt-<step>` holding a manifest), seen through symbolic links and `..`: the directory
/// `checkpoint` names (a checkpoint directory, or the one holding the checkpoint it names),
/// and any other that holds a checkpoint, as the output's nearest such ancestor.
pub fn check_outside_checkpoints(checkpoint: &Named, output: &Named) -> Result<(), PathError> {
    let out = canonical(&output.path);
    let refuse = |dir: PathBuf, what: String| PathError::OutputInCheckpointDir {
        output: output.flag.clone(),
        output_path: output.path.clone(),
        dir,
        what,
    };
    if checkpoint.path.is_dir() {
        let given = canonical(&checkpoint.path);
        let root = match given.parent() {
            Some(parent) if is_checkpoint(&given) => parent.to_path_buf(),
            _ => given,
        };
        if out.starts_with(&root) {
            let what = format!("the checkpoint directory that {} {} reads", checkpoint.flag, checkpoint.path.display());
            return Err(refuse(root, what));
        }
    }
    for dir in out.ancestors() {
        if is_checkpoint(dir) {
            return Err(refuse(dir.to_path_buf(), "a tiderec checkpoint".into()));
        }
        if holds_checkpoint(dir) {
            return Err(refuse(dir.to_path_buf(), "a tiderec checkpoint directory".into()));
        }
    }
    Ok(())
}

/// Whether `dir` is one checkpoint: `ckpt-<step>`, holding its manifest.
fn is_checkpoint(dir: &Path) -> bool {
    use tiderec_sinks::checkpoint::layout::{step_of, MANIFEST_FILE};
    dir.file_name().and_then(|n| n.to_str()).and_then(step_of).is_some() && dir.join(MANIFEST_FILE).is_file()
}

/// Whether `dir` is a checkpoint directory: it holds a checkpoint (an unreadable one holds none).
fn holds_checkpoint(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    entries.flatten().any(|e| e.file_type().is_ok_and(|t| t.is_dir()) && is_checkpoint(&e.path()))
}

/// The files directly in `dir` (symbolic links followed), sorted: what a directory given
/// as data (for `flag`) stands for, here and where the data is read (`config`). Entries
/// whose names start with `.` or `_` are no data (`is_hidden`) and are passed over, as
/// the Parquet listing passes over hidden files. Any other subdirectory or entry that is
/// not a regular file is an error naming it, so that no data is left out silently.
pub fn dir_files(flag: &str, dir: &Path) -> Result<Vec<PathBuf>, PathError> {
    let unlistable = |source| PathError::Unlistable { flag: flag.to_string(), path: dir.to_path_buf(), source };
    let (mut files, mut others) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(dir).map_err(unlistable)? {
        let entry = entry.map_err(unlistable)?;
        if is_hidden(&entry.file_name()) {
            continue;
        }
        let path = entry.path();
        if path.is_file() {
            files.push(path);
        } else {
            others.push(path);
        }
    }
    if !others.is_empty() {
        others.sort();
        return Err(PathError::UnreadEntries { flag: flag.to_string(), path: dir.to_path_buf(), entries: others });
    }
    files.sort();
    Ok(files)
}

/// Whether a directory entry named `name` is no data: a hidden file (`.part-0000.crc`, an
/// editor's swap file, a lock file) or a marker or metadata entry (Spark's `_SUCCESS`,
/// `_temporary`).
fn is_hidden(name: &std::ffi::OsStr) -> bool {
    matches!(name.as_encoded_bytes().first(), Some(b'.' | b'_'))
}

/// Every file under `dir` (a checkpoint directory or one `ckpt-<step>`), named by `flag`; `dir`
/// itself when it is a file, nothing when it does not exist. `dir` itself may be a symbolic
/// link (`--checkpoint DIR/best`); symbolic links to directories inside it (a checkpoint
/// directory's `best`) are not followed: their targets are listed anyway.
pub fn tree_files(flag: &str, dir: &Path) -> Result<Vec<Named>, PathError> {
    const MAX_DEPTH: usize = 4;
    let mut files = Vec::new();
    let mut pending = vec![(dir.to_path_buf(), 0)];
    while let Some((path, depth)) = pending.pop() {
        let meta = if depth == 0 { std::fs::metadata(&path) } else { std::fs::symlink_metadata(&path) };
        let Ok(meta) = meta else { continue };
        if !meta.is_dir() {
            if path.is_file() {
                files.push(Named::new(flag, path));
            }
            continue;
        }
        if depth == MAX_DEPTH {
            continue;
        }
        let unlistable = |source| PathError::Unlistable { flag: flag.to_string(), path: path.clone(), source };
        for entry in std::fs::read_dir(&path).map_err(unlistable)? {
            pending.push((entry.map_err(unlistable)?.path(), depth + 1));
        }
    }
    Ok(files)
}

/// A `--spec` value's files: none for a preset; the TOML file and the vocabulary files it
/// names (relative to its folder) otherwise.
pub fn spec_files(value: &str) -> Vec<Named> {
    use tiderec_operators::spec::{FeatureSpec, Vocabulary};
    let bare = value.strip_prefix("preset:").unwrap_or(value);
    if FeatureSpec::PRESETS.contains(&bare) || value.starts_with("preset:") {
        return Vec::new();
    }
    let path = Path::new(value);
    let mut files = vec![Named::new("--spec", path)];
    let Ok(text) = std::fs::read_to_string(path) else { return files };
    if let Ok(spec) = FeatureSpec::from_toml_in(&text, path.parent()) {
        files.extend(spec.categorical.iter().filter_map(|c| match &c.vocabulary {
            Some(Vocabulary::File(f)) => Some(Named::new("--spec", f.as_str())),
            _ => None,
        }));
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(flag: &str, path: &Path) -> Named {
        Named::new(flag, path)
    }

    #[test]
    fn an_output_naming_an_input_is_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("train.txt");
        std::fs::write(&data, "1\t2\n").unwrap();
        let e = check_outputs(&[named("--data", &data)], &[named("--dead-letters", &data)]).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, PathError::OutputIsInput { .. }), "{e:?}");
        assert!(text.contains("--dead-letters") && text.contains("--data") && text.contains("train.txt"), "{text}");
        let other = dir.path().join("dead.tsv");
        check_outputs(&[named("--data", &data)], &[named("--dead-letters", &other)]).unwrap();
    }

    #[test]
    fn links_and_other_spellings_of_an_input_are_the_input() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("train.txt");
        std::fs::write(&data, "1\t2\n").unwrap();
        let hard = dir.path().join("hard.txt");
        std::fs::hard_link(&data, &hard).unwrap();
        let spelled = dir.path().join("sub").join("..").join("train.txt");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut outputs = vec![hard, spelled];
        #[cfg(unix)]
        {
            let soft = dir.path().join("soft.txt");
            std::os::unix::fs::symlink(&data, &soft).unwrap();
            outputs.push(soft);
        }
        for out in outputs {
            let e = check_outputs(&[named("--data", &data)], &[named("--out", &out)]);
            assert!(matches!(e, Err(PathError::OutputIsInput { .. })), "{}: {e:?}", out.display());
        }
    }

    #[test]
    fn outputs_that_do_not_exist_yet_compare_by_canonical_path() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("new.tsv");
        let b = dir.path().join(".").join("new.tsv");
        let e = check_outputs(&[], &[named("--dead-letters", &a), named("--metrics-log", &b)]).unwrap_err();
        assert!(matches!(e, PathError::SharedOutput { .. }), "{e:?}");
        assert!(e.to_string().contains("--dead-letters") && e.to_string().contains("--metrics-log"), "{e}");
        let c = dir.path().join("other.tsv");
        check_outputs(&[], &[named("--dead-letters", &a), named("--metrics-log", &c)]).unwrap();
    }

    /// A symbolic link to a file not written yet is the file it will write: two outputs
    /// through it, or through a chain or loop of such links, are refused.
    #[cfg(unix)]
    #[test]
    fn a_dangling_link_is_the_output_it_points_at() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = dir.path().join("metrics.json");
        let link = dir.path().join("dl.tsv");
        std::os::unix::fs::symlink("metrics.json", &link).unwrap();
        let e = check_outputs(&[], &[named("--dead-letters", &link), named("--metrics-json", &metrics)]);
        assert!(matches!(e, Err(PathError::SharedOutput { .. })), "{e:?}");
        let chained = dir.path().join("chained.tsv");
        std::os::unix::fs::symlink(&link, &chained).unwrap();
        let e = check_outputs(&[], &[named("--dead-letters", &chained), named("--metrics-json", &metrics)]);
        assert!(matches!(e, Err(PathError::SharedOutput { .. })), "{e:?}");
        let (x, y) = (dir.path().join("x"), dir.path().join("y"));
        std::os::unix::fs::symlink(&y, &x).unwrap();
        std::os::unix::fs::symlink(&x, &y).unwrap();
        check_outputs(&[], &[named("--dead-letters", &x), named("--metrics-json", &metrics)]).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn devices_are_not_compared() {
        let null = Path::new("/dev/null");
        check_outputs(&[named("--data", null)], &[named("--dead-letters", null), named("--metrics-log", null)])
            .unwrap();
    }

    #[test]
    fn an_existing_output_needs_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let out = named("--out", &dir.path().join("scores.csv"));
        check_new(&out, false).unwrap();
        std::fs::write(&out.path, "x").unwrap();
        let e = check_new(&out, false).unwrap_err().to_string();
        assert!(e.contains("--out") && e.contains("scores.csv") && e.contains("--overwrite"), "{e}");
        check_new(&out, true).unwrap();
    }

    #[test]
    fn data_values_list_their_files_and_directories_their_contents() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.txt"), dir.path().join("b.txt"));
        std::fs::write(&a, "").unwrap();
        std::fs::write(&b, "").unwrap();
        let value = format!("criteo:{},{}", a.display(), dir.path().display());
        let mut files: Vec<PathBuf> = data_files("--data", &value).unwrap().into_iter().map(|n| n.path).collect();
        files.sort();
        assert_eq!(files, vec![a.clone(), a, b]);
        assert!(data_files("--data", "synthetic").unwrap().is_empty());
    }

    /// Hidden, marker and metadata entries (`.crc` files, swap files, `_SUCCESS`,
    /// `_temporary/`) are no data: passed over, neither read nor refused.
    #[test]
    fn hidden_and_underscore_entries_of_a_data_directory_are_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join("part-0000");
        std::fs::write(&part, "").unwrap();
        for name in [".part-0000.crc", ".part-0000.swp", "_SUCCESS"] {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        std::fs::create_dir(dir.path().join("_temporary")).unwrap();
        std::fs::create_dir(dir.path().join(".git")).unwrap();
        assert_eq!(dir_files("--data", dir.path()).unwrap(), vec![part.clone()]);
        let value = format!("criteo:{}", dir.path().display());
        let files: Vec<PathBuf> = data_files("--data", &value).unwrap().into_iter().map(|n| n.path).collect();
        assert_eq!(files, vec![part]);
    }

    #[test]
    fn subdirectories_and_devices_as_data_are_errors_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "").unwrap();
        std::fs::create_dir(dir.path().join("day2")).unwrap();
        let e = data_files("--data", &format!("criteo:{}", dir.path().display())).unwrap_err().to_string();
        assert!(e.contains("day2") && e.contains("would not be read") && e.contains("--data"), "{e}");
        let e = data_files("--data", "criteo:/dev/zero").unwrap_err().to_string();
        assert!(e.contains("/dev/zero") && e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn checkpoint_trees_list_every_file_and_a_missing_one_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let ckpt = dir.path().join("ckpt-3");
        std::fs::create_dir(&ckpt).unwrap();
        std::fs::write(ckpt.join("manifest.json"), "{}").unwrap();
        let files = tree_files("--checkpoint", dir.path()).unwrap();
        assert_eq!(files, vec![named("--checkpoint", &ckpt.join("manifest.json"))]);
        assert!(tree_files("--checkpoint", &dir.path().join("missing")).unwrap().is_empty());
        // Given as a link (`DIR/best`), the directory's files are still inputs.
        let best = dir.path().join("best");
        std::os::unix::fs::symlink(&ckpt, &best).unwrap();
        let files = tree_files("--checkpoint", &best).unwrap();
        assert_eq!(files, vec![named("--checkpoint", &best.join("manifest.json"))]);
    }

    #[test]
    fn an_output_in_a_data_directory_is_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("days");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("day0.txt"), "1\t2\n").unwrap();
        let value = format!("criteo:{},{}", data.display(), data.join("day0.txt").display());
        let dirs = data_dirs("--data", &value);
        assert_eq!(dirs, vec![named("--data", &data)]);
        // Spelled through `..`, and as a file that does not exist yet.
        let inside = data.join("..").join("days").join("dead.tsv");
        let e = check_outside(&dirs, &[named("--dead-letters", &inside)]).unwrap_err().to_string();
        assert!(e.contains("--dead-letters") && e.contains(&data.display().to_string()) && e.contains("--data"), "{e}");
        check_outside(&dirs, &[named("--dead-letters", &dir.path().join("dead.tsv"))]).unwrap();
        check_outside(&dirs, &[named("--metrics-log", Path::new("/dev/null"))]).unwrap();
    }

    /// An output directory at or under a checkpoint directory is refused however it is
    /// spelled (through `..` after directories not made yet, through a link), naming the flag
    /// that reads it when it is the exported one; a sibling directory is not.
    #[cfg(unix)]
    #[test]
    fn an_output_within_a_checkpoint_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("ck");
        std::fs::create_dir_all(ck.join("ckpt-3")).unwrap();
        std::fs::write(ck.join("ckpt-3").join("manifest.json"), "{}").unwrap();
        let ck_real = std::fs::canonicalize(&ck).unwrap();
        let given = named("--checkpoint", &ck.join("ckpt-3"));
        let spelled = dir.path().join("new").join("deeper").join("..").join("..").join("ck").join("serve");
        std::os::unix::fs::symlink(&ck, dir.path().join("alias")).unwrap();
        for out in [ck.clone(), ck.join("ckpt-3"), spelled, dir.path().join("alias").join("serve")] {
            let e = check_outside_checkpoints(&given, &named("--out", &out)).unwrap_err();
            assert!(matches!(&e, PathError::OutputInCheckpointDir { dir, .. } if *dir == ck_real), "{e:?}");
            let text = e.to_string();
            assert!(text.contains(&out.display().to_string()) && text.contains("--checkpoint"), "{text}");
        }
        // Another checkpoint directory than the one exported is refused too.
        let other = named("--checkpoint", &dir.path().join("elsewhere"));
        let e = check_outside_checkpoints(&other, &named("--out", &ck.join("serve"))).unwrap_err();
        assert!(e.to_string().contains("a tiderec checkpoint directory"), "{e}");
        check_outside_checkpoints(&given, &named("--out", &dir.path().join("serve"))).unwrap();
    }

    #[test]
    fn a_spec_file_and_its_vocabularies_are_inputs_and_presets_none() {
        assert!(spec_files("preset:criteo").is_empty() && spec_files("criteo").is_empty());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cities.txt"), "paris\nlyon\n").unwrap();
        let spec = dir.path().join("spec.toml");
        let text = "delimiter = \",\"\nheader = false\ncolumns = [\"label\", \"city\"]\nlabel = { column = \"label\" }\n\n[[categorical]]\n\
                    column = \"city\"\nbuckets = 10\nencoding = \"vocabulary\"\nvocabulary = \"cities.txt\"\n";
        std::fs::write(&spec, text).unwrap();
        let files: Vec<PathBuf> = spec_files(spec.to_str().unwrap()).into_iter().map(|n| n.path).collect();
        assert_eq!(files, vec![spec.clone(), dir.path().join("cities.txt")], "{text}");
    }
}
