//! Where `tiderec predict` writes its scores: CSV or Parquet, under a temporary
//! name until the run succeeded.
//!
//! Without `replace`, a scores file is never replaced: one found when the sink is created
//! is refused, and one made while the run works (by the user or another run) is refused
//! when the sink commits, with the same [`PathError::Exists`], the temporary file removed
//! and the file found left as it is. With `replace` the finished file is renamed over it.
//! A sink dropped before it committed (an error, a panic) removes its temporary file.
//!
//! CSV: a header `file,position,score` (`,label` for labeled input), then one
//! line per record; `score` is printed as the shortest text that reads back as
//! the same f32 (Rust's `{}`), `label` likewise. Parquet: the same columns
//! ([`tiderec_sources::parquet::scores`]). File names containing a comma, a
//! quote or a line break are quoted as CSV requires.

use crate::paths::PathError;
use crate::PipelineError;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use tiderec_sinks::checkpoint::write::sync_parent;
use tiderec_sinks::temp::{commit_new, temp_beside};
use tiderec_sources::parquet::scores::ScoreWriter;

/// The output file's format, from its extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreFormat {
    /// `.csv`
    Csv,
    /// `.parquet`
    Parquet,
}

impl ScoreFormat {
    /// `.csv` or `.parquet`; anything else is an error naming `--out`.
    pub fn of_path(path: &Path) -> Result<Self, PipelineError> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("csv") => Ok(ScoreFormat::Csv),
            Some("parquet") => Ok(ScoreFormat::Parquet),
            _ => Err(PipelineError::config(
                "out",
                format!("{}: the scores file must end in .csv or .parquet", path.display()),
            )),
        }
    }
}

enum Writer {
    Csv(BufWriter<std::fs::File>),
    Parquet(Box<ScoreWriter>),
}

/// An open scores file (CSV or Parquet; see [`crate::predict`]): never over a file found at
/// its path unless it replaces, and no temporary file left once dropped.
pub struct ScoreSink {
    out: PathBuf,
    tmp: PathBuf,
    /// `None` once committed or abandoned.
    writer: Option<Writer>,
    labeled: bool,
    replace: bool,
    line: String,
}

fn io_error(path: &Path, e: impl std::fmt::Display) -> PipelineError {
    PipelineError::config("out", format!("{}: {e}", path.display()))
}

/// The refusal of an existing scores file `out`, as `--out`.
fn exists(out: &Path) -> PipelineError {
    PathError::Exists { flag: "--out".into(), path: out.to_path_buf() }.into()
}

/// `field` as one CSV field.
fn csv_field(field: &str) -> std::borrow::Cow<'_, str> {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\"")).into()
    } else {
        field.into()
    }
}

impl ScoreSink {
    /// Creates the temporary file beside `out`; `labeled` adds the `label` column. Without
    /// `replace`, an existing `out` (a dangling symbolic link too) is refused here and again
    /// at [`ScoreSink::commit`].
    pub fn create(out: &Path, format: ScoreFormat, labeled: bool, replace: bool) -> Result<Self, PipelineError> {
        if !replace && std::fs::symlink_metadata(out).is_ok() {
            return Err(exists(out));
        }
        let tmp = temp_beside(out);
        let writer = Self::open(&tmp, format, labeled).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        Ok(ScoreSink { out: out.to_path_buf(), tmp, writer: Some(writer), labeled, replace, line: String::new() })
    }

    fn open(tmp: &Path, format: ScoreFormat, labeled: bool) -> Result<Writer, PipelineError> {
        Ok(match format {
            ScoreFormat::Csv => {
                let file = std::fs::File::create(tmp).map_err(|e| io_error(tmp, e))?;
                let mut w = BufWriter::new(file);
                let header = if labeled { "file,position,score,label\n" } else { "file,position,score\n" };
                w.write_all(header.as_bytes()).map_err(|e| io_error(tmp, e))?;
                Writer::Csv(w)
            }
            ScoreFormat::Parquet => Writer::Parquet(Box::new(ScoreWriter::create(tmp, labeled)?)),
        })
    }

    /// Appends one record's row.
    pub fn push(&mut self, file: &str, position: u64, score: f32, label: f32) -> Result<(), PipelineError> {
        let Some(writer) = &mut self.writer else {
            return Err(io_error(&self.tmp, "the scores file is closed"));
        };
        match writer {
            Writer::Csv(w) => {
                use std::fmt::Write as _;
                self.line.clear();
                let _ = write!(self.line, "{},{position},{score}", csv_field(file));
                if self.labeled {
                    let _ = write!(self.line, ",{label}");
                }
                self.line.push('\n');
                w.write_all(self.line.as_bytes()).map_err(|e| io_error(&self.tmp, e))
            }
            Writer::Parquet(w) => Ok(w.push(file, position, score, label)?),
        }
    }

    /// Finishes the file, syncs it, moves it to its name and syncs its directory, so the new
    /// name survives a crash: with `replace` renamed over whatever is there, without it only
    /// to a free name (a file found there is refused as [`PathError::Exists`] and kept). On
    /// error the temporary file is removed (a full disk leaves nothing behind).
    pub fn commit(mut self) -> Result<(), PipelineError> {
        let Some(writer) = self.writer.take() else {
            return Err(io_error(&self.tmp, "the scores file is closed"));
        };
        let finished = match writer {
            Writer::Csv(w) => w
                .into_inner()
                .map_err(|e| io_error(&self.tmp, e.error()))
                .and_then(|file| file.sync_all().map_err(|e| io_error(&self.tmp, e))),
            Writer::Parquet(w) => w.finish().map_err(PipelineError::from),
        };
        let moved = finished.and_then(|()| {
            if self.replace {
                std::fs::rename(&self.tmp, &self.out).map_err(|e| io_error(&self.out, e))
            } else {
                commit_new(&self.tmp, &self.out).map_err(|e| match e.kind() {
                    std::io::ErrorKind::AlreadyExists => exists(&self.out),
                    _ => io_error(&self.out, e),
                })
            }
        });
        if let Err(e) = moved {
            let _ = std::fs::remove_file(&self.tmp);
            return Err(e);
        }
        Ok(sync_parent(&self.out)?)
    }

    /// Removes the temporary file (after a failed run).
    pub fn abandon(mut self) {
        self.discard();
    }

    fn discard(&mut self) {
        if self.writer.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

impl Drop for ScoreSink {
    /// A sink that neither committed nor was abandoned (an early return, a panic) removes its
    /// temporary file.
    fn drop(&mut self) {
        self.discard();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        n.sort();
        n
    }

    fn filled(out: &Path, format: ScoreFormat, replace: bool) -> ScoreSink {
        let mut sink = ScoreSink::create(out, format, true, replace).unwrap();
        sink.push("a.txt", 1, 0.25, 1.0).unwrap();
        sink.push("a.txt", 2, 0.5, 0.0).unwrap();
        sink
    }

    /// Without `replace`, a scores file made after the sink was created and before it
    /// commits is refused as existing, kept byte for byte, and no temporary file stays;
    /// with `replace` it is replaced.
    #[test]
    fn a_file_made_during_the_run_is_kept_unless_replacing() {
        let dir = tempfile::tempdir().unwrap();
        for (name, format) in [("s.csv", ScoreFormat::Csv), ("s.parquet", ScoreFormat::Parquet)] {
            let out = dir.path().join(name);
            let sink = filled(&out, format, false);
            std::fs::write(&out, "the user's file\n").unwrap();
            let e = sink.commit().unwrap_err();
            assert!(
                matches!(&e, PipelineError::Paths(PathError::Exists { flag, path }) if flag == "--out" && *path == out),
                "{e:?}"
            );
            assert!(e.to_string().contains("--overwrite"), "{e}");
            assert_eq!(std::fs::read_to_string(&out).unwrap(), "the user's file\n");
            assert_eq!(names(dir.path()), [name], "no temporary file stays");
            // Refused when it is there from the start, before anything is written.
            let e = ScoreSink::create(&out, format, true, false).err().expect("refused");
            assert!(matches!(e, PipelineError::Paths(PathError::Exists { .. })), "{e:?}");
            assert_eq!(names(dir.path()), [name]);
            filled(&out, format, true).commit().unwrap();
            assert_ne!(std::fs::read(&out).unwrap(), b"the user's file\n", "replaced");
            assert_eq!(names(dir.path()), [name]);
            std::fs::remove_file(&out).unwrap();
        }
        let out = dir.path().join("s.csv");
        filled(&out, ScoreFormat::Csv, false).commit().unwrap();
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "file,position,score,label\na.txt,1,0.25,1\na.txt,2,0.5,0\n"
        );
    }

    /// A sink that never commits (dropped on an error path, or by a panic) leaves no
    /// temporary file; neither does an abandoned one.
    #[test]
    fn an_uncommitted_sink_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("s.csv");
        drop(filled(&out, ScoreFormat::Csv, false));
        assert_eq!(names(dir.path()), Vec::<String>::new());
        filled(&out, ScoreFormat::Csv, false).abandon();
        assert_eq!(names(dir.path()), Vec::<String>::new());
        let panicked = std::panic::catch_unwind(|| {
            let _sink = filled(&out, ScoreFormat::Csv, false);
            panic!("a failed forward pass");
        });
        assert!(panicked.is_err());
        assert_eq!(names(dir.path()), Vec::<String>::new());
    }
}
