//! Scores of `tiderec predict` as a Parquet file.
//!
//! Columns, in order: `file` (utf8, the input file as given), `position`
//! (uint64: the 1-based line of a text file, the 0-based row of a Parquet
//! file), `score` (float32, the probability) and, only when the input carried
//! labels, `label` (float32). Rows are written in the order they are pushed;
//! every [`ROWS_PER_GROUP`] rows make one row group (zstd-compressed).

use crate::error::SourceError;
use arrow_array::{ArrayRef, Float32Array, RecordBatch, StringArray, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows buffered before they are written as one row group.
pub const ROWS_PER_GROUP: usize = 64 * 1024;

/// Writes `file, position, score[, label]` rows; see the [module docs](self).
pub struct ScoreWriter {
    path: PathBuf,
    schema: SchemaRef,
    writer: ArrowWriter<File>,
    labeled: bool,
    files: Vec<String>,
    positions: Vec<u64>,
    scores: Vec<f32>,
    labels: Vec<f32>,
}

impl ScoreWriter {
    /// Creates `path` (replacing it); `labeled` adds the `label` column.
    pub fn create(path: &Path, labeled: bool) -> Result<Self, SourceError> {
        let mut fields = vec![
            Field::new("file", DataType::Utf8, false),
            Field::new("position", DataType::UInt64, false),
            Field::new("score", DataType::Float32, false),
        ];
        if labeled {
            fields.push(Field::new("label", DataType::Float32, false));
        }
        let schema: SchemaRef = Arc::new(Schema::new(fields));
        let name = path.display().to_string();
        let file = File::create(path).map_err(|source| SourceError::Io { path: name.clone(), source })?;
        let zstd = ZstdLevel::try_new(3).map_err(|source| SourceError::Parquet { path: name.clone(), source })?;
        let props = WriterProperties::builder().set_compression(Compression::ZSTD(zstd)).build();
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(props))
            .map_err(|source| SourceError::Parquet { path: name, source })?;
        Ok(ScoreWriter {
            path: path.to_path_buf(),
            schema,
            writer,
            labeled,
            files: Vec::new(),
            positions: Vec::new(),
            scores: Vec::new(),
            labels: Vec::new(),
        })
    }

    /// Adds one row (`label` is ignored unless the writer is labeled).
    pub fn push(&mut self, file: &str, position: u64, score: f32, label: f32) -> Result<(), SourceError> {
        self.files.push(file.to_string());
        self.positions.push(position);
        self.scores.push(score);
        if self.labeled {
            self.labels.push(label);
        }
        if self.scores.len() >= ROWS_PER_GROUP {
            self.flush_rows()?;
        }
        Ok(())
    }

    fn flush_rows(&mut self) -> Result<(), SourceError> {
        if self.scores.is_empty() {
            return Ok(());
        }
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(std::mem::take(&mut self.files))),
            Arc::new(UInt64Array::from(std::mem::take(&mut self.positions))),
            Arc::new(Float32Array::from(std::mem::take(&mut self.scores))),
        ];
        if self.labeled {
            columns.push(Arc::new(Float32Array::from(std::mem::take(&mut self.labels))));
        }
        let path = self.path.display().to_string();
        let batch = RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(|source| SourceError::Arrow { path: path.clone(), source })?;
        self.writer.write(&batch).map_err(|source| SourceError::Parquet { path: path.clone(), source })?;
        self.writer.flush().map_err(|source| SourceError::Parquet { path, source })
    }

    /// Writes the buffered rows and the footer, and syncs the file.
    pub fn finish(mut self) -> Result<(), SourceError> {
        self.flush_rows()?;
        let path = self.path.display().to_string();
        let file = self.writer.into_inner().map_err(|source| SourceError::Parquet { path: path.clone(), source })?;
        file.sync_all().map_err(|source| SourceError::Io { path, source })
    }
}
