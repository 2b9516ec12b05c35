//! Writes featurized [`Batch`]es to a directory of zstd-compressed Parquet files.
//!
//! # Invariants
//!
//! * **Bounded memory.** Rows are handed to the Arrow writer as they come;
//!   it keeps at most one row group (`row_group_rows` rows, encoded and
//!   compressed) in memory before writing it out.
//! * **Order is kept.** Rows land in `part-00000.parquet`, `part-00001.parquet`,
//!   … in the order they were written; a new file starts after
//!   `rows_per_file` rows (when set). Sorting the file names gives the rows
//!   back in order.
//! * **No half files, no half datasets.** A file is written under a hidden
//!   temporary name (`.part-00000.parquet.tmp`) and keeps it when complete;
//!   [`ParquetWriter::finish`] renames every file at the end. Readers listing
//!   `*.parquet` never see a partial file, and a writer killed before it
//!   finishes (SIGKILL, out of memory) leaves no `*.parquet` file, so no
//!   dataset that looks complete but holds only the first files' rows; the
//!   next writer into the directory removes such temporaries when created.
//! * **No partial dataset.** [`ParquetWriter::abort`], and a
//!   [`ParquetWriter::finish`] that fails (a full disk), remove every file the
//!   writer made, complete or not, and the directory when the writer created it.
//! * Every file carries the [`SchemaDescription`] under
//!   [`METADATA_KEY`](super::METADATA_KEY).

use super::schema::{SchemaDescription, SparseKind};
use crate::error::SourceError;
use arrow_array::{ArrayRef, Float32Array, ListArray, RecordBatch, UInt64Array};
use arrow_buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{Field, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiderec_records::Batch;

/// Default rows per row group.
pub const DEFAULT_ROW_GROUP_ROWS: usize = 65_536;

/// How files are cut and compressed.
#[derive(Clone, Copy, Debug)]
pub struct WriterOptions {
    /// Rows per row group (the unit of work split across training workers).
    pub row_group_rows: usize,
    /// Start a new file after this many rows (`None`: one file).
    pub rows_per_file: Option<u64>,
    /// zstd level (1–22).
    pub zstd_level: i32,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions { row_group_rows: DEFAULT_ROW_GROUP_ROWS, rows_per_file: None, zstd_level: 3 }
    }
}

/// What a writer produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteSummary {
    /// The files written, in order.
    pub files: Vec<PathBuf>,
    /// Rows over all files.
    pub rows: u64,
    /// Row groups over all files.
    pub row_groups: usize,
}

struct OpenFile {
    writer: ArrowWriter<File>,
    tmp: PathBuf,
    path: PathBuf,
    rows: u64,
}

/// Whether `name` is one of the temporary names a writer gives its files
/// (`.part-NNNNN.parquet.tmp`).
fn is_temporary(name: &str) -> bool {
    name.strip_prefix(".part-")
        .and_then(|rest| rest.strip_suffix(".parquet.tmp"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Removes the temporary files a writer killed before it finished left in `dir`: the
/// names a new writer uses, so no file of an earlier run stays beside the new dataset.
fn remove_stale_temporaries(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_str().is_some_and(is_temporary) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Streams batches into `part-NNNNN.parquet` files; see the [module docs](self).
pub struct ParquetWriter {
    dir: PathBuf,
    description: SchemaDescription,
    schema: SchemaRef,
    props: WriterProperties,
    options: WriterOptions,
    current: Option<OpenFile>,
    /// Complete files still under their temporary names: `(temporary, final)`.
    complete: Vec<(PathBuf, PathBuf)>,
    summary: WriteSummary,
    /// Whether [`Self::create`] made `dir` (then a failed conversion removes it).
    created_dir: bool,
    /// The last source position written (line sources): positions never decrease.
    last_line_start: Option<u64>,
}

impl ParquetWriter {
    /// A writer into `dir` (created if missing). Errors: an invalid
    /// description or options, a `dir` that already holds `*.parquet` files
    /// (conversions never mix datasets), I/O.
    pub fn create(dir: &Path, description: SchemaDescription, options: WriterOptions) -> Result<Self, SourceError> {
        description
            .validate()
            .map_err(|source| SourceError::Description { path: dir.display().to_string(), source })?;
        if options.row_group_rows == 0 || options.rows_per_file == Some(0) {
            return Err(SourceError::config("row_group_rows", "row_group_rows and rows_per_file must be positive"));
        }
        let zstd =
            ZstdLevel::try_new(options.zstd_level).map_err(|e| SourceError::config("zstd_level", e.to_string()))?;
        let io_err = |source| SourceError::Io { path: dir.display().to_string(), source };
        let created_dir = !dir.exists();
        std::fs::create_dir_all(dir).map_err(io_err)?;
        if let Some(existing) = super::list_parquet_files(dir).ok().and_then(|f| f.into_iter().next()) {
            return Err(SourceError::schema(
                dir.display(),
                format!("already holds Parquet files ({}); convert into an empty directory", existing.display()),
            ));
        }
        remove_stale_temporaries(dir);
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(zstd))
            .set_max_row_group_row_count(Some(options.row_group_rows))
            .set_key_value_metadata(Some(vec![KeyValue::new(super::METADATA_KEY.into(), description.to_json())]))
            .build();
        Ok(ParquetWriter {
            dir: dir.to_path_buf(),
            schema: Arc::new(description.arrow_schema()),
            description,
            props,
            options,
            current: None,
            complete: Vec::new(),
            summary: WriteSummary::default(),
            created_dir,
            last_line_start: None,
        })
    }

    /// The description written into every file.
    pub fn description(&self) -> &SchemaDescription {
        &self.description
    }

    /// Rows written so far (including those of the open file).
    pub fn rows(&self) -> u64 {
        self.summary.rows
    }

    /// Appends every sample of `batch` (of the description's shape). A
    /// single-valued field with more than one id in a bag is an error, and so
    /// is a description with [`lines`](SchemaDescription::lines) (use
    /// [`write_with_line_starts`](Self::write_with_line_starts)) and, for a
    /// description with [`groups`](SchemaDescription::groups), a batch without
    /// one group per sample.
    pub fn write(&mut self, batch: &Batch) -> Result<(), SourceError> {
        self.write_rows(batch, None)
    }

    /// [`write`](Self::write) for a description with
    /// [`lines`](SchemaDescription::lines): `line_starts[i]` is sample `i`'s
    /// source position (see [`LineSource`](super::schema::LineSource)).
    pub fn write_with_line_starts(&mut self, batch: &Batch, line_starts: &[u64]) -> Result<(), SourceError> {
        self.write_rows(batch, Some(line_starts))
    }

    fn write_rows(&mut self, batch: &Batch, line_starts: Option<&[u64]>) -> Result<(), SourceError> {
        if self.description.lines.is_some() != line_starts.is_some()
            || line_starts.is_some_and(|l| l.len() != batch.len())
        {
            return Err(SourceError::config(
                "line_starts",
                format!(
                    "{} line starts for {} samples; the schema {} source positions",
                    line_starts.map_or(0, <[u64]>::len),
                    batch.len(),
                    if self.description.lines.is_some() { "has" } else { "has no" }
                ),
            ));
        }
        if let Some(starts) = line_starts {
            self.check_line_starts(starts)?;
        }
        let (num_dense, num_sparse) = self.description.shape();
        let num_sequences = self.description.sequences.len();
        if batch.num_dense != num_dense || batch.sparse.len() != num_sparse || batch.sequences.len() != num_sequences {
            return Err(SourceError::config(
                "batch",
                format!(
                    "batch has {} dense / {} sparse / {} sequence fields, the schema {num_dense} / {num_sparse} / \
                     {num_sequences}",
                    batch.num_dense,
                    batch.sparse.len(),
                    batch.sequences.len()
                ),
            ));
        }
        if self.description.groups && batch.groups.len() != batch.len() {
            return Err(SourceError::config(
                "batch",
                format!("{} groups for {} samples; the schema has user groups", batch.groups.len(), batch.len()),
            ));
        }
        let mut start = 0;
        while start < batch.len() {
            let room = match self.options.rows_per_file {
                Some(limit) => limit - self.current.as_ref().map_or(0, |f| f.rows),
                None => u64::MAX,
            };
            let end = batch.len().min(start.saturating_add(usize::try_from(room).unwrap_or(usize::MAX)));
            let record = self.record_batch(batch, start..end, line_starts)?;
            let file = self.open_file()?;
            file.writer
                .write(&record)
                .map_err(|source| SourceError::Parquet { path: file.tmp.display().to_string(), source })?;
            file.rows += (end - start) as u64;
            let file_rows = file.rows;
            self.summary.rows += (end - start) as u64;
            if self.options.rows_per_file.is_some_and(|limit| file_rows >= limit) {
                self.close_file()?;
            }
            start = end;
        }
        Ok(())
    }

    /// Line starts must not decrease (the rows of a line source are written in the
    /// order of its input: readers map byte ranges to rows by searching them) and
    /// must lie inside the input. Checked before anything of the batch is written.
    fn check_line_starts(&mut self, starts: &[u64]) -> Result<(), SourceError> {
        let total: u64 = self.description.lines.as_ref().map_or(0, |l| l.file_bytes.iter().sum());
        let mut last = self.last_line_start;
        for (i, &start) in starts.iter().enumerate() {
            let reason = if start >= total {
                format!("line start {start} of sample {i} lies past the input's {total} bytes")
            } else if last.is_some_and(|l| start < l) {
                format!(
                    "line start {start} of sample {i} comes before the previous sample's {}: the rows of a line \
                     source are written in the order of the input",
                    last.unwrap_or(0)
                )
            } else {
                last = Some(start);
                continue;
            };
            return Err(SourceError::config("line_starts", reason));
        }
        self.last_line_start = last;
        Ok(())
    }

    /// Closes the last file, gives every file its final name and returns what was
    /// written; on error, nothing of the dataset stays (see [`Self::abort`]).
    pub fn finish(mut self) -> Result<WriteSummary, SourceError> {
        match self.close_file().and_then(|()| self.publish()) {
            Ok(()) => Ok(std::mem::take(&mut self.summary)),
            Err(e) => {
                self.abort();
                Err(e)
            }
        }
    }

    /// Renames the complete files from their temporary names, in order; on error the
    /// files renamed so far are in the summary and the others still listed as complete,
    /// so [`Self::abort`] removes them all.
    fn publish(&mut self) -> Result<(), SourceError> {
        for (tmp, path) in &self.complete {
            std::fs::rename(tmp, path).map_err(|source| SourceError::Io { path: tmp.display().to_string(), source })?;
            self.summary.files.push(path.clone());
        }
        self.complete.clear();
        Ok(())
    }

    /// Removes every file written so far, complete or not, and the directory when
    /// [`Self::create`] made it: a failed conversion leaves no partial dataset.
    pub fn abort(mut self) {
        if let Some(f) = self.current.take() {
            drop(f.writer);
            let _ = std::fs::remove_file(&f.tmp);
        }
        for (tmp, _) in &self.complete {
            let _ = std::fs::remove_file(tmp);
        }
        for path in &self.summary.files {
            let _ = std::fs::remove_file(path);
        }
        if self.created_dir {
            // Only when empty: whatever else appeared there meanwhile is not the writer's.
            let _ = std::fs::remove_dir(&self.dir);
        }
    }

    fn open_file(&mut self) -> Result<&mut OpenFile, SourceError> {
        if self.current.is_none() {
            let name = format!("part-{:05}.parquet", self.complete.len());
            let path = self.dir.join(&name);
            let tmp = self.dir.join(format!(".{name}.tmp"));
            let file =
                File::create(&tmp).map_err(|source| SourceError::Io { path: tmp.display().to_string(), source })?;
            let writer = ArrowWriter::try_new(file, self.schema.clone(), Some(self.props.clone()))
                .map_err(|source| SourceError::Parquet { path: tmp.display().to_string(), source })?;
            self.current = Some(OpenFile { writer, tmp, path, rows: 0 });
        }
        Ok(self.current.as_mut().expect("opened above"))
    }

    fn close_file(&mut self) -> Result<(), SourceError> {
        let Some(f) = self.current.take() else { return Ok(()) };
        let closed =
            f.writer.close().map_err(|source| SourceError::Parquet { path: f.tmp.display().to_string(), source });
        let meta = closed.inspect_err(|_| {
            let _ = std::fs::remove_file(&f.tmp);
        })?;
        self.summary.row_groups += meta.num_row_groups();
        self.complete.push((f.tmp, f.path));
        Ok(())
    }

    /// A `List<UInt64>` column of the bags `offsets` delimits (`ids` starts at `offsets[0]`).
    fn list_column(&self, offsets: &[u32], ids: &[u64]) -> Result<ArrayRef, SourceError> {
        let base = offsets[0];
        let rel = offsets.iter().map(|&o| (o - base) as i32);
        let offsets = OffsetBuffer::new(ScalarBuffer::from(rel.collect::<Vec<i32>>()));
        let item = Arc::new(Field::new_list_field(arrow_schema::DataType::UInt64, true));
        let values = Arc::new(UInt64Array::from(ids.to_vec()));
        let list = ListArray::try_new(item, offsets, values, None)
            .map_err(|source| SourceError::Arrow { path: self.dir.display().to_string(), source })?;
        Ok(Arc::new(list))
    }

    /// Rows `range` of `batch` as an Arrow record batch of the schema.
    fn record_batch(
        &self,
        batch: &Batch,
        range: std::ops::Range<usize>,
        line_starts: Option<&[u64]>,
    ) -> Result<RecordBatch, SourceError> {
        let d = batch.num_dense;
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(1 + d + batch.sparse.len());
        columns.push(Arc::new(Float32Array::from(batch.labels[range.clone()].to_vec())));
        for k in 0..d {
            let values: Vec<f32> = range.clone().map(|r| batch.dense[r * d + k]).collect();
            columns.push(Arc::new(Float32Array::from(values)));
        }
        for (field, column) in batch.sparse.iter().zip(&self.description.sparse) {
            let offsets = &field.offsets[range.start..=range.end];
            let ids = &field.ids[offsets[0] as usize..offsets[offsets.len() - 1] as usize];
            match column.kind {
                SparseKind::Single => {
                    let mut values = Vec::with_capacity(range.len());
                    let mut valid = Vec::with_capacity(range.len());
                    for w in offsets.windows(2) {
                        match w[1] - w[0] {
                            0 => {
                                values.push(0);
                                valid.push(false);
                            }
                            1 => {
                                values.push(field.ids[w[0] as usize]);
                                valid.push(true);
                            }
                            n => {
                                return Err(SourceError::schema(
                                    self.dir.display(),
                                    format!("single-valued column `{}` got a bag of {n} ids", column.name),
                                ))
                            }
                        }
                    }
                    let nulls = valid.iter().any(|v| !v).then(|| NullBuffer::from(valid));
                    columns.push(Arc::new(UInt64Array::new(ScalarBuffer::from(values), nulls)));
                }
                SparseKind::List => columns.push(self.list_column(offsets, ids)?),
            }
        }
        for field in &batch.sequences {
            let offsets = &field.offsets[range.start..=range.end];
            let ids = &field.ids[offsets[0] as usize..offsets[offsets.len() - 1] as usize];
            columns.push(self.list_column(offsets, ids)?);
        }
        if self.description.groups {
            columns.push(Arc::new(UInt64Array::from(batch.groups[range.clone()].to_vec())));
        }
        if let Some(starts) = line_starts {
            columns.push(Arc::new(UInt64Array::from(starts[range].to_vec())));
        }
        RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(|source| SourceError::Arrow { path: self.dir.display().to_string(), source })
    }
}
