//! A set of Parquet files read as one dataset, and its split across workers.
//!
//! [`ParquetDataset::open`] reads every file's footer once (shared by all
//! workers of a process through an `Arc`), takes the [`SchemaDescription`]
//! from the files' key-value metadata and checks that every file has every
//! column it names, with the right type. It then enumerates all
//! `(file, row group)` pairs in file order: the *global row-group list*.
//!
//! # Splitting rows across workers
//!
//! [`ParquetDataset::worker_segments`] gives each worker its rows as
//! [`Segment`]s (row ranges inside row groups), so every worker reads
//! whatever the number of files and row groups:
//!
//! * **Line sources** (files written by `tiderec convert` from line files,
//!   whose rows carry their source position, [`LineSource`]): exactly the
//!   split of the line readers over the raw files. In each input file of
//!   `len` bytes, `span = (a, b)` covers bytes `[lo, hi)` with
//!   `lo = round(len·a)`, `hi = round(len·b)` (`len` when `b = 1`), and worker
//!   `w` of `W` takes the rows whose line starts in
//!   `[lo + (hi−lo)·w/W, lo + (hi−lo)·(w+1)/W)`, file after file
//!   ([`crate::shuffle::worker_ranges`]). In a shuffled epoch the worker reads
//!   the rows of each block of those ranges in the order the line readers read
//!   the blocks ([`crate::shuffle::epoch_ranges`], mapped to rows by
//!   [`ParquetDataset::line_segments`]). So `W` workers replaying the files
//!   train on the same global batches, in the same order, as `W` workers
//!   reading the raw files, in every epoch.
//! * **Other files**: the rows `span_rows(n, span)` of every row group, row
//!   groups in the epoch's order ([`row_group_order`]: file order in epoch 0,
//!   a permutation derived from the seed and the epoch later, the same on
//!   every worker), form one sequence of `N` rows; worker `w` takes its
//!   `[N·w/W, N·(w+1)/W)`.
//!
//! # Invariants
//!
//! * **Every row in the span is read by exactly one worker per epoch**, and
//!   the workers' shares differ by at most one row (other files) or follow
//!   the byte split of the raw files (line sources).
//! * **Spans partition rows.** Spans `(0, f)` and `(f, 1)` partition the rows:
//!   [`span_rows`] keeps rows `[round(n·from), round(n·to))` of a row group of
//!   `n` rows; line sources split the input files' bytes as the line readers
//!   do. That is how `--eval-fraction` holds out data.
//! * Files are used in the order given; [`list_parquet_files`] sorts by name.
//! * **Every column chunk the reader decodes has a codec it can decompress**
//!   (uncompressed, snappy, gzip, lz4, lz4_raw, zstd): a brotli or LZO chunk
//!   is refused when the dataset is opened, naming the file, row group,
//!   column and codec, not after training has started.
//! * **A line source describes an input that can exist.** Its input sizes add
//!   up, without overflow, to at most
//!   [`MAX_INPUT_BYTES`](super::schema::MAX_INPUT_BYTES) (checked with the
//!   description), and [`ParquetDataset::open`] refuses a file whose
//!   `_line_start` statistics reach past them, naming the file and row group;
//!   the positions themselves are checked when read. So a damaged size never
//!   wraps the byte arithmetic of the split, nor cuts a shuffled epoch into
//!   more blocks than memory holds ([`crate::shuffle::MAX_BLOCKS`] bounds them too).

use super::decode::decode_next;
use super::schema::{LineSource, SchemaDescription, SparseKind, GROUP_COLUMN, LINE_START_COLUMN, METADATA_KEY};
use crate::error::SourceError;
use crate::shuffle::{permutation, share_start, worker_ranges, ByteRange};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::ColumnChunkMetaData;
use std::fs::File;
use std::path::{Path, PathBuf};

/// The `*.parquet` files of `dir` (hidden files excluded), sorted by name.
///
/// Errors name `dir`: it does not exist or cannot be listed, is not a
/// directory, or holds no Parquet file.
pub fn list_parquet_files(dir: &Path) -> Result<Vec<PathBuf>, SourceError> {
    let io_err = |source| SourceError::Io { path: dir.display().to_string(), source };
    let meta = std::fs::metadata(dir).map_err(io_err)?;
    if !meta.is_dir() {
        return Err(SourceError::schema(dir.display(), "is not a directory"));
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err)? {
        let path = entry.map_err(io_err)?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.ends_with(".parquet") && !name.starts_with('.') && path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(SourceError::schema(dir.display(), "holds no *.parquet files"));
    }
    files.sort();
    Ok(files)
}

/// One row group of the global list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowGroupRef {
    /// Index of the file in [`ParquetDataset::paths`].
    pub file: usize,
    /// Row group within the file.
    pub group: usize,
    /// Rows in the row group.
    pub rows: u64,
}

pub(crate) struct DatasetFile {
    pub(crate) path: PathBuf,
    pub(crate) meta: ArrowReaderMetadata,
    /// The label, dense and sparse columns of the description, nothing else.
    pub(crate) projection: ProjectionMask,
    /// The projection on [`LINE_START_COLUMN`] and its leaf index, when the file has it.
    line_start: Option<(ProjectionMask, usize)>,
}

/// Rows `rows` of entry `group` of the global row-group list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Index into [`ParquetDataset::row_groups`].
    pub group: usize,
    /// Rows within the row group.
    pub rows: std::ops::Range<u64>,
}

/// Parquet files read as one dataset; see the [module docs](self).
pub struct ParquetDataset {
    pub(crate) files: Vec<DatasetFile>,
    groups: Vec<RowGroupRef>,
    /// Row index (over all files) of the first row of each entry of `groups`.
    starts: Vec<u64>,
    description: SchemaDescription,
    total_rows: u64,
}

impl std::fmt::Debug for ParquetDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetDataset")
            .field("files", &self.paths().collect::<Vec<_>>())
            .field("row_groups", &self.groups.len())
            .field("rows", &self.total_rows)
            .field("description", &self.description)
            .finish()
    }
}

impl ParquetDataset {
    /// [`list_parquet_files`] of `dir`, then [`open`](Self::open).
    pub fn open_dir(dir: &Path) -> Result<Self, SourceError> {
        Self::open(&list_parquet_files(dir)?)
    }

    /// Reads the footers of `paths` (in this order).
    ///
    /// The description is the `tiderec.schema` metadata of the first file
    /// that has one; every other file that has one must agree. Errors name
    /// the file: unreadable, not Parquet, bad metadata, no file with
    /// metadata, a missing column or one of the wrong type.
    pub fn open(paths: &[PathBuf]) -> Result<Self, SourceError> {
        if paths.is_empty() {
            return Err(SourceError::schema("parquet data", "no files given"));
        }
        let mut metas = Vec::with_capacity(paths.len());
        let mut description: Option<(SchemaDescription, &Path)> = None;
        for path in paths {
            let file =
                File::open(path).map_err(|source| SourceError::Io { path: path.display().to_string(), source })?;
            let meta = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new())
                .map_err(|source| SourceError::Parquet { path: path.display().to_string(), source })?;
            let kv = meta.metadata().file_metadata().key_value_metadata();
            let text = kv.and_then(|kv| kv.iter().find(|e| e.key == METADATA_KEY)).and_then(|e| e.value.as_deref());
            if let Some(text) = text {
                let d = SchemaDescription::from_json(text)
                    .map_err(|source| SourceError::Description { path: path.display().to_string(), source })?;
                match &description {
                    None => description = Some((d, path)),
                    Some((first, first_path)) if *first != d => {
                        return Err(SourceError::schema(
                            path.display(),
                            format!("its `{METADATA_KEY}` differs from that of {}", first_path.display()),
                        ))
                    }
                    Some(_) => {}
                }
            }
            metas.push(meta);
        }
        let Some((description, _)) = description else {
            return Err(SourceError::schema(
                paths[0].display(),
                format!(
                    "none of the {} file(s) has `{METADATA_KEY}` key-value metadata; write them with `tiderec \
                     convert` or add the JSON schema description (see docs/data.md)",
                    paths.len()
                ),
            ));
        };
        let mut files = Vec::with_capacity(paths.len());
        let mut groups = Vec::new();
        for (index, (path, meta)) in paths.iter().zip(metas).enumerate() {
            let projection = check_columns(path, &meta, &description)?;
            let line_start = line_start_column(path, &meta, &description)?;
            if let (Some(lines), Some((_, leaf))) = (&description.lines, &line_start) {
                check_line_start_statistics(path, &meta, *leaf, lines)?;
            }
            for (g, rg) in meta.metadata().row_groups().iter().enumerate() {
                // The decoder asserts on these (a corrupt footer): name the file instead.
                for (leaf, c) in rg.columns().iter().enumerate() {
                    if projection.leaf_included(leaf) || line_start.as_ref().is_some_and(|(_, l)| *l == leaf) {
                        check_codec(path, g, c)?;
                    }
                    let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
                    if start < 0 || c.compressed_size() < 0 {
                        return Err(SourceError::schema(
                            path.display(),
                            format!(
                                "row group {g}, column `{}`: the footer gives a negative byte range ({start}, {} bytes)",
                                c.column_path(),
                                c.compressed_size()
                            ),
                        ));
                    }
                }
                let rows = u64::try_from(rg.num_rows()).map_err(|_| {
                    SourceError::schema(path.display(), format!("row group {g} has {} rows", rg.num_rows()))
                })?;
                groups.push(RowGroupRef { file: index, group: g, rows });
            }
            files.push(DatasetFile { path: path.clone(), meta, projection, line_start });
        }
        let starts: Vec<u64> = groups.iter().scan(0, |at, g| Some(std::mem::replace(at, *at + g.rows))).collect();
        let total_rows = groups.iter().map(|g| g.rows).sum();
        Ok(ParquetDataset { files, groups, starts, description, total_rows })
    }

    /// The input files' sizes when every file's rows carry their source positions.
    pub fn line_source(&self) -> Option<&LineSource> {
        self.description.lines.as_ref().filter(|_| self.files.iter().all(|f| f.line_start.is_some()))
    }

    /// The rows worker `worker` of `workers` reads in `epoch`, in reading order, without
    /// a shuffle of line sources (see the [module docs](self)).
    pub fn worker_segments(
        &self,
        span: (f64, f64),
        epoch: u64,
        seed: u64,
        worker: usize,
        workers: usize,
    ) -> Result<Vec<Segment>, SourceError> {
        if let Some(source) = self.line_source() {
            return self.line_segments(&worker_ranges(&source.file_bytes, span, worker, workers));
        }
        Ok(self.row_segments(span, epoch, seed, worker, workers))
    }

    /// The rows of a line source whose line starts in each of `ranges` (byte ranges of the
    /// input files, [`LineSource::file_bytes`]), range after range: what a line reader reads
    /// of them, in the same order. Each row group's line starts are read at most once.
    pub fn line_segments(&self, ranges: &[ByteRange]) -> Result<Vec<Segment>, SourceError> {
        let Some(source) = self.line_source() else {
            return Err(SourceError::schema(self.name(), "its rows carry no source positions (`_line_start`)"));
        };
        let bases = file_bases(&source.file_bytes)
            .ok_or_else(|| SourceError::schema(self.name(), "the input sizes of its line source add up past 2^64"))?;
        let global = |r: &ByteRange| -> Result<std::ops::Range<u64>, SourceError> {
            let base = bases
                .get(r.file)
                .copied()
                .ok_or_else(|| SourceError::schema(self.name(), format!("input file {} of {}", r.file, bases.len())))?;
            let at = |offset: u64| {
                base.checked_add(offset).ok_or_else(|| {
                    SourceError::schema(self.name(), format!("byte {offset} of input file {} is past 2^64", r.file))
                })
            };
            Ok(at(r.bytes.start)?..at(r.bytes.end)?)
        };
        let bytes = ranges.iter().map(global).collect::<Result<Vec<_>, _>>()?;
        let mut targets: Vec<u64> = bytes.iter().flat_map(|b| [b.start, b.end]).collect();
        targets.sort_unstable();
        targets.dedup();
        let rows = self.first_rows_at(&targets)?;
        let row_of = |t: u64| rows[targets.partition_point(|&x| x < t)];
        let row_ranges = bytes.iter().map(|b| {
            let (from, to) = (row_of(b.start), row_of(b.end));
            from..to.max(from)
        });
        Ok(self.segments_of(row_ranges))
    }

    /// The dataset's name in errors: its first file.
    fn name(&self) -> String {
        self.files.first().map_or_else(String::new, |f| f.path.display().to_string())
    }

    /// The split of files without line sources (see the [module docs](self)).
    pub fn row_segments(&self, span: (f64, f64), epoch: u64, seed: u64, worker: usize, workers: usize) -> Vec<Segment> {
        let part = |lo: u64, hi: u64, k: usize| share_start(lo, hi, k, workers);
        let order = row_group_order(self.groups.len(), epoch, seed);
        let total: u64 = order.iter().map(|&g| span_rows(self.groups[g].rows, span).count() as u64).sum();
        let (from, to) = (part(0, total, worker), part(0, total, worker + 1));
        let mut segments = Vec::new();
        let mut at = 0u64;
        for g in order {
            let rows = span_rows(self.groups[g].rows, span);
            let n = rows.end - rows.start;
            let (a, b) = (from.max(at), to.min(at + n));
            if a < b {
                segments.push(Segment { group: g, rows: rows.start + (a - at)..rows.start + (b - at) });
            }
            at += n;
        }
        segments
    }

    /// Global row ranges (row indices over all files in order) as segments.
    fn segments_of(&self, ranges: impl IntoIterator<Item = std::ops::Range<u64>>) -> Vec<Segment> {
        let mut segments = Vec::new();
        for r in ranges.into_iter().filter(|r| !r.is_empty()) {
            let first = self.starts.partition_point(|&s| s <= r.start).saturating_sub(1);
            for g in first..self.groups.len() {
                let (start, rows) = (self.starts[g], self.groups[g].rows);
                if start >= r.end {
                    break;
                }
                let (a, b) = (r.start.max(start), r.end.min(start + rows));
                if a < b {
                    segments.push(Segment { group: g, rows: a - start..b - start });
                }
            }
        }
        segments
    }

    /// For each of the ascending `targets`, the first row (index over all files) whose line
    /// starts at or after that byte of the input, or the number of rows when there is none.
    /// Reads row-group statistics, and the line-start column of each row group needed once.
    fn first_rows_at(&self, targets: &[u64]) -> Result<Vec<u64>, SourceError> {
        self.check_group_order()?;
        let mut held: Option<(usize, Vec<u64>)> = None;
        let mut rows = Vec::with_capacity(targets.len());
        for &target in targets {
            let Some(g) = self.group_below(target)? else {
                rows.push(0);
                continue;
            };
            if held.as_ref().is_none_or(|(h, _)| *h != g) {
                let starts = self.line_starts(g, 0..self.groups[g].rows)?;
                self.check_first_line_start(g, starts.first().copied())?;
                held = Some((g, starts));
            }
            let starts = held.as_ref().map_or(&[][..], |(_, starts)| starts.as_slice());
            let i = starts.partition_point(|&s| s < target) as u64;
            rows.push(self.starts[g] + i.min(self.groups[g].rows));
        }
        Ok(rows)
    }

    /// `path (row group g)` of an entry of the global list, for messages.
    pub(super) fn group_name(&self, index: usize) -> String {
        let g = self.row_groups()[index];
        format!("{} (row group {})", self.files[g.file].path.display(), g.group)
    }

    /// The search over row groups ([`Self::group_below`]) needs their first line starts to
    /// rise through the dataset, as `tiderec convert` writes them: files given in another
    /// order (or row groups whose statistics say otherwise) are refused, naming both groups.
    fn check_group_order(&self) -> Result<(), SourceError> {
        let mut before: Option<(usize, u64)> = None;
        for g in 0..self.groups.len() {
            let Some(first) = self.first_line_start(g)? else { continue };
            if let Some((p, prev)) = before.filter(|&(_, prev)| first < prev) {
                let reason = format!(
                    "its rows start at byte {first} of the input, before those of {} (byte {prev}): the files of \
                     converted line data are read in the order `tiderec convert` wrote them (give the directory, or \
                     the files in that order)",
                    self.group_name(p)
                );
                return Err(SourceError::schema(self.group_name(g), reason));
            }
            before = Some((g, first));
        }
        Ok(())
    }

    /// The last non-empty row group whose first line start is below byte `target` (the
    /// first row at or after the target is in it or just after it), if any. Reads
    /// row-group statistics.
    fn group_below(&self, target: u64) -> Result<Option<usize>, SourceError> {
        // The non-empty row groups whose first line start is below the target form a prefix.
        let mut lo = 0usize;
        let mut hi = self.groups.len();
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.first_line_start(mid)? {
                Some(first) if first < target => lo = mid + 1,
                Some(_) => hi = mid,
                // An empty row group: decide by the nearest non-empty one before it.
                None => match (0..mid).rev().find(|&g| self.groups[g].rows > 0) {
                    Some(g) if self.first_line_start(g)?.is_some_and(|f| f < target) => lo = mid + 1,
                    _ => hi = mid,
                },
            }
        }
        // Row group `lo - 1` (if any) starts below the target: the answer is in it or at `lo`.
        Ok((0..lo).rev().find(|&g| self.groups[g].rows > 0))
    }

    /// The search for the row group of a byte ([`Self::group_below`]) reads row-group
    /// statistics: their minimum, where they give one, must be the first position the
    /// column holds.
    fn check_first_line_start(&self, g: usize, first: Option<u64>) -> Result<(), SourceError> {
        let declared = self.statistics_min(g);
        if declared.is_none() || declared == first {
            return Ok(());
        }
        let r = self.groups[g];
        let show = |v: Option<u64>| v.map_or_else(|| "none".to_string(), |v| v.to_string());
        let reason = format!(
            "the statistics of `{LINE_START_COLUMN}` give {} as its first position, the column holds {} (a damaged \
             file)",
            show(declared),
            show(first)
        );
        Err(SourceError::schema(format!("{} (row group {})", self.files[r.file].path.display(), r.group), reason))
    }

    /// The first line start of row group `g`: its statistics' minimum (the column is
    /// non-decreasing), else its first value; `None` for an empty row group.
    fn first_line_start(&self, g: usize) -> Result<Option<u64>, SourceError> {
        if self.groups[g].rows == 0 {
            return Ok(None);
        }
        match self.statistics_min(g) {
            Some(min) => Ok(Some(min)),
            None => Ok(self.line_starts(g, 0..1)?.first().copied()),
        }
    }

    /// The minimum of row group `g`'s `_line_start` statistics, where the footer gives
    /// one (never for an empty row group).
    fn statistics_min(&self, g: usize) -> Option<u64> {
        let r = self.groups[g];
        let file = &self.files[r.file];
        let leaf = file.line_start.as_ref().map(|(_, leaf)| *leaf).expect("line sources have the column");
        match file.meta.metadata().row_group(r.group).column(leaf).statistics() {
            Some(parquet::file::statistics::Statistics::Int64(s)) if r.rows > 0 => s.min_opt().map(|&min| min as u64),
            _ => None,
        }
    }

    /// Line starts of rows `rows` of row group `g`. A column that gives fewer rows
    /// than asked for, positions that decrease, or a position past the input is an
    /// error naming the file and the row group: mapping byte ranges to rows searches
    /// these positions, so a damaged column would silently read some rows twice and
    /// skip others (a row past the input is in no worker's range).
    fn line_starts(&self, g: usize, rows: std::ops::Range<u64>) -> Result<Vec<u64>, SourceError> {
        use arrow_array::cast::AsArray;
        use parquet::arrow::arrow_reader::{ParquetRecordBatchReaderBuilder, RowSelection, RowSelector};
        let r = self.groups[g];
        let file = &self.files[r.file];
        let (projection, _) = file.line_start.clone().expect("line sources have the column");
        let name = || format!("{} (row group {})", file.path.display(), r.group);
        let handle = File::open(&file.path)
            .map_err(|source| SourceError::Io { path: file.path.display().to_string(), source })?;
        let selection = RowSelection::from(vec![
            RowSelector::skip(rows.start as usize),
            RowSelector::select((rows.end - rows.start) as usize),
            RowSelector::skip((r.rows - rows.end) as usize),
        ]);
        let mut reader = ParquetRecordBatchReaderBuilder::new_with_metadata(handle, file.meta.clone())
            .with_projection(projection)
            .with_row_groups(vec![r.group])
            .with_row_selection(selection)
            .build()
            .map_err(|source| SourceError::Parquet { path: name(), source })?;
        let mut out = Vec::with_capacity((rows.end - rows.start) as usize);
        while let Some(chunk) = decode_next(&mut reader).map_err(|what| SourceError::schema(name(), what))? {
            let chunk = chunk.map_err(|source| SourceError::Arrow { path: name(), source })?;
            let col = chunk
                .column(0)
                .as_primitive_opt::<arrow_array::types::UInt64Type>()
                .ok_or_else(|| SourceError::schema(name(), format!("column `{LINE_START_COLUMN}` is not UInt64")))?;
            out.extend_from_slice(col.values());
        }
        let wanted = rows.end - rows.start;
        if out.len() as u64 != wanted {
            let reason = format!("its `{LINE_START_COLUMN}` column gave {} of the {wanted} rows asked for", out.len());
            return Err(SourceError::schema(name(), format!("{reason} (a damaged file)")));
        }
        if let Some(i) = out.windows(2).position(|w| w[1] < w[0]) {
            let (row, a, b) = (rows.start + i as u64 + 1, out[i], out[i + 1]);
            let reason = format!(
                "`{LINE_START_COLUMN}` decreases at row {row} of the row group ({b} after {a}): source positions \
                 never decrease in a file that `tiderec convert` wrote (a damaged or rewritten file)"
            );
            return Err(SourceError::schema(name(), reason));
        }
        let input = self.line_source().and_then(LineSource::total_bytes).unwrap_or(u64::MAX);
        if let Some(&last) = out.last().filter(|&&last| last >= input) {
            let reason = format!(
                "`{LINE_START_COLUMN}` holds {last}, past the {input} bytes of the input its metadata describes (a \
                 damaged file)"
            );
            return Err(SourceError::schema(name(), reason));
        }
        Ok(out)
    }

    /// What the files hold.
    pub fn description(&self) -> &SchemaDescription {
        &self.description
    }

    /// The files, in reading order.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|f| f.path.as_path())
    }

    /// Row of its file (0-based) of the first row of entry `index` of the global list.
    pub fn first_row_in_file(&self, index: usize) -> u64 {
        let file = self.groups[index].file;
        let first_of_file = self.groups.iter().position(|g| g.file == file).unwrap_or(index);
        self.starts[index] - self.starts[first_of_file]
    }

    /// The global row-group list (file order, then row-group order).
    pub fn row_groups(&self) -> &[RowGroupRef] {
        &self.groups
    }

    /// Rows over all files.
    pub fn total_rows(&self) -> u64 {
        self.total_rows
    }

    /// Rows of all files within `span` of each row group (see [`span_rows`]).
    pub fn rows_in_span(&self, span: (f64, f64)) -> u64 {
        self.groups.iter().map(|g| span_rows(g.rows, span).count() as u64).sum()
    }
}

/// The offset of each input file in the concatenation of the files; `None` when they add
/// up past `u64::MAX` (never for a valid description).
fn file_bases(file_bytes: &[u64]) -> Option<Vec<u64>> {
    let mut at = 0u64;
    file_bytes
        .iter()
        .map(|&len| {
            let base = at;
            at = at.checked_add(len)?;
            Some(base)
        })
        .collect()
}

/// Refuses a file whose [`LINE_START_COLUMN`] (leaf `leaf`) statistics give a row group a
/// position at or past the end of the input `lines` describes, naming the file and row group.
fn check_line_start_statistics(
    path: &Path,
    meta: &ArrowReaderMetadata,
    leaf: usize,
    lines: &LineSource,
) -> Result<(), SourceError> {
    let input = lines.total_bytes().unwrap_or(u64::MAX);
    for (g, rg) in meta.metadata().row_groups().iter().enumerate() {
        let max = match rg.columns().get(leaf).and_then(|c| c.statistics()) {
            Some(parquet::file::statistics::Statistics::Int64(s)) if rg.num_rows() > 0 => {
                s.max_opt().map(|&m| m as u64)
            }
            _ => None,
        };
        if let Some(max) = max.filter(|&max| max >= input) {
            let reason = format!(
                "the statistics of `{LINE_START_COLUMN}` reach byte {max}, past the {input} bytes of the input its \
                 `lines.file_bytes` describe (a damaged file)"
            );
            return Err(SourceError::schema(format!("{} (row group {g})", path.display()), reason));
        }
    }
    Ok(())
}

/// The projection on the file's [`LINE_START_COLUMN`] and its leaf index, when `d` has a
/// line source and the file the column (`UInt64`); a column of another type is an error.
fn line_start_column(
    path: &Path,
    meta: &ArrowReaderMetadata,
    d: &SchemaDescription,
) -> Result<Option<(ProjectionMask, usize)>, SourceError> {
    if d.lines.is_none() {
        return Ok(None);
    }
    let Ok(index) = meta.schema().index_of(LINE_START_COLUMN) else { return Ok(None) };
    let ty = meta.schema().field(index).data_type();
    if ty != &DataType::UInt64 {
        return Err(SourceError::schema(
            path.display(),
            format!("column `{LINE_START_COLUMN}` is {ty}, expected UInt64"),
        ));
    }
    let leaf = meta.parquet_schema().columns().iter().position(|c| c.path().string() == LINE_START_COLUMN);
    Ok(leaf.map(|leaf| (ProjectionMask::roots(meta.parquet_schema(), [index]), leaf)))
}

/// Checks that the file has every column of `d` with its type; returns the projection on them.
fn check_columns(
    path: &Path,
    meta: &ArrowReaderMetadata,
    d: &SchemaDescription,
) -> Result<ProjectionMask, SourceError> {
    let schema = meta.schema();
    let mut roots = Vec::new();
    for (i, (name, want)) in d.column_types().into_iter().enumerate() {
        let Ok(index) = schema.index_of(name) else {
            let role = if i == 0 {
                "label"
            } else if i <= d.num_dense {
                "dense"
            } else if i <= d.num_dense + d.sparse.len() {
                "sparse"
            } else {
                "sequence"
            };
            return Err(SourceError::schema(
                path.display(),
                format!("no column `{name}` (the schema's {role} column)"),
            ));
        };
        let ty = schema.field(index).data_type();
        let ok = match d.sparse.get(i.wrapping_sub(1 + d.num_dense)) {
            _ if i <= d.num_dense => ty == &DataType::Float32,
            Some(sparse) => sparse.kind.accepts(ty),
            None => SparseKind::List.accepts(ty),
        };
        if !ok {
            return Err(SourceError::schema(path.display(), format!("column `{name}` is {ty}, expected {want}")));
        }
        roots.push(index);
    }
    if d.groups {
        let index = schema.index_of(GROUP_COLUMN).map_err(|_| {
            SourceError::schema(path.display(), format!("no column `{GROUP_COLUMN}` (the schema's user groups)"))
        })?;
        let ty = schema.field(index).data_type();
        if ty != &DataType::UInt64 {
            return Err(SourceError::schema(
                path.display(),
                format!("column `{GROUP_COLUMN}` is {ty}, expected UInt64"),
            ));
        }
        roots.push(index);
    }
    Ok(ProjectionMask::roots(meta.parquet_schema(), roots))
}

/// Refuses a column chunk the reader will decode but this build cannot decompress (brotli,
/// LZO), naming the file, row group, column and codec: when the dataset is opened, not when
/// its rows are first read, after training has started.
fn check_codec(path: &Path, group: usize, chunk: &ColumnChunkMetaData) -> Result<(), SourceError> {
    use parquet::basic::Compression;
    let codec = match chunk.compression() {
        Compression::UNCOMPRESSED
        | Compression::SNAPPY
        | Compression::GZIP(_)
        | Compression::LZ4
        | Compression::LZ4_RAW
        | Compression::ZSTD(_) => return Ok(()),
        Compression::BROTLI(_) => "brotli",
        Compression::LZO => "lzo",
    };
    Err(SourceError::schema(
        path.display(),
        format!(
            "row group {group}, column `{}` is compressed with {codec}, which tiderec does not read (it reads \
             uncompressed, snappy, gzip, lz4 and zstd Parquet files): rewrite the files with one of those codecs",
            chunk.column_path()
        ),
    ))
}

/// The rows `[round(n·from), round(n·to))` of a row group of `rows` rows (to `rows` when `to ≥ 1`).
pub fn span_rows(rows: u64, span: (f64, f64)) -> std::ops::Range<u64> {
    let at = |f: f64| if f >= 1.0 { rows } else { ((rows as f64 * f).round() as u64).min(rows) };
    let (lo, hi) = (at(span.0), at(span.1));
    lo..hi.max(lo)
}

/// The order of `n` row groups in `epoch`: file order in epoch 0, a
/// permutation seeded by `seed` and `epoch` afterwards (Fisher–Yates, [`permutation`]).
pub fn row_group_order(n: usize, epoch: u64, seed: u64) -> Vec<usize> {
    permutation(n, epoch, seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_orders_are_permutations_file_order_first() {
        for n in [0, 1, 2, 5, 10, 37] {
            for epoch in 0..4 {
                let mut order = row_group_order(n, epoch, 7);
                if epoch == 0 {
                    assert_eq!(order, (0..n).collect::<Vec<_>>());
                }
                order.sort_unstable();
                assert_eq!(order, (0..n).collect::<Vec<_>>(), "n {n} epoch {epoch}");
            }
        }
        // Later epochs are shuffled, deterministically, differently per epoch and seed.
        let e1 = row_group_order(50, 1, 7);
        assert_eq!(e1, row_group_order(50, 1, 7));
        assert_ne!(e1, (0..50).collect::<Vec<_>>());
        assert_ne!(e1, row_group_order(50, 2, 7));
        assert_ne!(e1, row_group_order(50, 1, 8));
    }

    #[test]
    fn spans_partition_rows() {
        for rows in [0u64, 1, 2, 7, 1000, 65_536] {
            for f in [0.0, 0.1, 0.5, 0.8, 0.999] {
                let (a, b) = (span_rows(rows, (0.0, f)), span_rows(rows, (f, 1.0)));
                assert_eq!(a.start, 0);
                assert_eq!(a.end, b.start);
                assert_eq!(b.end, rows);
            }
        }
    }
}
