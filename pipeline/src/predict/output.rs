//! Where `tiderec predict` writes its scores: CSV or Parquet, under a temporary
//! name until the run succeeded.
//!
//! CSV: a header `file,position,score` (`,label` for labeled input), then one
//! line per record; `score` is printed as the shortest text that reads back as
//! the same f32 (Rust's `{}`), `label` likewise. Parquet: the same columns
//! ([`tiderec_sources::parquet::scores`]). File names containing a comma, a
//! quote or a line break are quoted as CSV requires.

use crate::PipelineError;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use tiderec_sinks::checkpoint::write::sync_parent;
use tiderec_sinks::temp::temp_beside;
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

/// An open scores file (CSV or Parquet; see [`crate::predict`]).
pub struct ScoreSink {
    out: PathBuf,
    tmp: PathBuf,
    writer: Writer,
    labeled: bool,
    line: String,
}

fn io_error(path: &Path, e: impl std::fmt::Display) -> PipelineError {
    PipelineError::config("out", format!("{}: {e}", path.display()))
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
    /// Creates the temporary file beside `out`; `labeled` adds the `label` column.
    pub fn create(out: &Path, format: ScoreFormat, labeled: bool) -> Result<Self, PipelineError> {
        let tmp = temp_beside(out);
        let writer = Self::open(&tmp, format, labeled).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        Ok(ScoreSink { out: out.to_path_buf(), tmp, writer, labeled, line: String::new() })
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
        match &mut self.writer {
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

    /// Finishes the file, syncs it, renames it to its name and syncs its directory, so the
    /// new name survives a crash; on error the temporary file is removed (a full disk leaves
    /// nothing behind).
    pub fn commit(self) -> Result<(), PipelineError> {
        let finished = match self.writer {
            Writer::Csv(w) => w
                .into_inner()
                .map_err(|e| io_error(&self.tmp, e.error()))
                .and_then(|file| file.sync_all().map_err(|e| io_error(&self.tmp, e))),
            Writer::Parquet(w) => w.finish().map_err(PipelineError::from),
        };
        finished.and_then(|()| std::fs::rename(&self.tmp, &self.out).map_err(|e| io_error(&self.out, e))).inspect_err(
            |_| {
                let _ = std::fs::remove_file(&self.tmp);
            },
        )?;
        Ok(sync_parent(&self.out)?)
    }

    /// Removes the temporary file (after a failed run).
    pub fn abandon(self) {
        drop(self.writer);
        let _ = std::fs::remove_file(&self.tmp);
    }
}
