//! One worker's share of a [`ParquetDataset`], decoded into [`Batch`]es.
//!
//! The reader walks the row ranges that
//! [`ParquetDataset::worker_segments`] gives its worker in the current epoch
//! (inside row groups, so every worker reads whatever the number of row
//! groups), decodes only the projected columns (label, dense, sparse: those
//! the schema names, matched by name) in chunks of at most [`DECODE_ROWS`]
//! rows, and appends them to the caller's batch. A micro-batch may span row
//! groups and files.
//!
//! # Invariants
//!
//! * With one worker and a full span, epoch 0 yields the rows of the files in
//!   file order, row groups in order: the same samples in the same order as the
//!   raw files they were converted from.
//! * Later epochs: files of other writers visit their row groups in a permutation of
//!   the seed and the epoch; files converted from line files keep the raw files'
//!   order, or with a [`BlockShuffle`] ([`ParquetReader::with_shuffle`]) read the
//!   blocks a line reader with that shuffle reads, in its order. The order is a
//!   function of the dataset, the worker, the shuffle and the epoch only.
//! * Memory is bounded by one decoded chunk per reader (plus the pages of the
//!   row group being read), whatever the file sizes.
//! * Data the schema forbids is an error naming the file, row group and
//!   column, never a panic: a null or non-finite label or one outside
//!   `[0, 1]`, an id not below its table size, and corrupt pages (a panic of
//!   the parquet decoder is caught and becomes such an error). Null dense values read as 0,
//!   null sparse values (and null list items) as absent.
//! * A row with an infinite or NaN dense value is a bad record
//!   ([`BadReason::NonFinite`], the file and its 1-based row number as the
//!   line, the column as the field): counted and dead-lettered under
//!   [`BadRecordPolicy::Skip`], an error under [`BadRecordPolicy::Fail`],
//!   never appended.
//! * With a bound on sequences ([`ParquetReader::with_max_len`], and for
//!   [`append_chunk`] its `max_len`), a behaviour sequence longer than its
//!   column's cut ([`SequenceColumn::cut`]) is cut as the line format the rows
//!   were made from cuts it (a spec list keeps its first ids, a behaviour
//!   history its last, the most recent), so no row holds a sequence longer
//!   than the model reads; the ids cut off are still checked against the table.

use super::dataset::{ParquetDataset, Segment};
use super::decode::decode_next;
use super::schema::{Keep, SchemaDescription, SequenceColumn, SparseKind, GROUP_COLUMN};
use crate::error::SourceError;
use crate::lines::RecordPosition;
use crate::shuffle::{epoch_ranges, BlockShuffle};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use parquet::arrow::arrow_reader::{
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use std::fs::File;
use std::sync::Arc;
use tiderec_records::bad_record::{BadReason, BadRecord, BadRecordCounts, BadRecordPolicy, DeadLetterSink};
use tiderec_records::finite::all_finite;
use tiderec_records::{Batch, SparseField};

/// Rows decoded at a time.
pub const DECODE_ROWS: usize = 8192;

struct Current {
    /// Index into the global row-group list.
    group: usize,
    reader: ParquetRecordBatchReader,
    chunk: Option<RecordBatch>,
    /// Next row of `chunk`.
    row: usize,
    /// Row of the file (0-based) of the first row of `chunk`, or of the next chunk.
    file_row: u64,
    /// Row of the file after the group's last row to read, as its metadata declares.
    end_row: u64,
}

/// Reads one worker's row groups of a dataset; see the [module docs](self).
pub struct ParquetReader {
    dataset: Arc<ParquetDataset>,
    span: (f64, f64),
    worker: usize,
    workers: usize,
    /// Seed of the row-group permutation of files without line sources.
    seed: u64,
    /// Whether files without line sources permute their row groups after epoch 0.
    shuffle_row_groups: bool,
    /// The block shuffle of line sources, if any.
    blocks: Option<BlockShuffle>,
    table_sizes: Vec<u64>,
    epoch: u64,
    /// This epoch's rows of this worker.
    mine: Vec<Segment>,
    /// A line source's rows of this epoch are yet to be found (then `mine` holds
    /// another epoch's rows: as many, in another order).
    replan: bool,
    next_group: usize,
    current: Option<Current>,
    rows_read: u64,
    policy: BadRecordPolicy,
    dead_letters: Option<Box<dyn DeadLetterSink>>,
    counts: BadRecordCounts,
    /// With [`record_positions`](Self::record_positions): the file and 0-based row of
    /// every row appended since the last [`take_positions`](Self::take_positions).
    positions: Option<Vec<RecordPosition>>,
    /// The longest sequence the model reads ([`with_max_len`](Self::with_max_len)).
    max_len: Option<usize>,
}

impl ParquetReader {
    /// Worker `worker` of `workers` over rows `span` of every row group (see
    /// [`span_rows`](super::dataset::span_rows)); `seed` drives the per-epoch shuffle, and every id
    /// read must be below its field's entry of `table_sizes`.
    pub fn new(
        dataset: Arc<ParquetDataset>,
        span: (f64, f64),
        worker: usize,
        workers: usize,
        seed: u64,
        table_sizes: Vec<u64>,
    ) -> Result<Self, SourceError> {
        if !(0.0 <= span.0 && span.0 <= span.1 && span.1 <= 1.0) {
            return Err(SourceError::config("span", format!("{span:?} is not within [0, 1]")));
        }
        if workers == 0 || worker >= workers {
            return Err(SourceError::config("workers", format!("worker {worker} of {workers}")));
        }
        let d = dataset.description();
        if table_sizes.len() != d.sparse.len() {
            return Err(SourceError::config(
                "table_sizes",
                format!("{} table sizes for {} sparse columns", table_sizes.len(), d.sparse.len()),
            ));
        }
        let mine = dataset.worker_segments(span, 0, seed, worker, workers)?;
        Ok(ParquetReader {
            dataset,
            span,
            worker,
            workers,
            seed,
            shuffle_row_groups: true,
            blocks: None,
            table_sizes,
            epoch: 0,
            mine,
            replan: false,
            next_group: 0,
            current: None,
            rows_read: 0,
            policy: BadRecordPolicy::Skip,
            dead_letters: None,
            counts: BadRecordCounts::default(),
            positions: None,
            max_len: None,
        })
    }

    /// Cuts every behaviour sequence to what a model whose sequences hold at most `max_len`
    /// ids reads, as the rows' line format cuts it ([`SequenceColumn::cut`]); without this
    /// call, sequences are read whole (only a recorded `max_len` bounds them).
    pub fn with_max_len(mut self, max_len: usize) -> Self {
        self.max_len = Some(max_len);
        self
    }

    /// What to do with rows holding a non-finite dense value, and where to send them
    /// (by default they are skipped and counted only).
    pub fn with_bad_records(mut self, policy: BadRecordPolicy, dead_letters: Option<Box<dyn DeadLetterSink>>) -> Self {
        self.policy = policy;
        self.dead_letters = dead_letters;
        self
    }

    /// Replaces the shuffle of the epochs after the first: `None` reads every epoch in
    /// epoch 0's order; `Some(shuffle)` permutes the row groups of files without line
    /// sources with its seed and reads line sources in its blocks (see the [module
    /// docs](self)). Without this call, only the row groups are permuted, with the seed
    /// given to [`new`](Self::new). Restarts the current epoch.
    pub fn with_shuffle(mut self, shuffle: Option<BlockShuffle>) -> Self {
        self.shuffle_row_groups = shuffle.is_some();
        self.seed = shuffle.map_or(self.seed, |s| s.seed());
        self.blocks = shuffle;
        self.start_epoch();
        self
    }

    /// Bad rows seen so far, by reason (accumulated over epochs).
    pub fn bad_counts(&self) -> &BadRecordCounts {
        &self.counts
    }

    /// The dead-letter sink, if any (e.g. to flush it).
    pub fn dead_letters(&mut self) -> Option<&mut (dyn DeadLetterSink + 'static)> {
        self.dead_letters.as_deref_mut()
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<ParquetDataset> {
        &self.dataset
    }

    /// The current epoch (0-based).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Rows this worker reads in the current epoch.
    pub fn rows_this_epoch(&self) -> u64 {
        self.mine.iter().map(|s| s.rows.end - s.rows.start).sum()
    }

    /// Rows read so far, accumulated over epochs.
    pub fn rows_read(&self) -> u64 {
        self.rows_read
    }

    /// Starts the next epoch: files without line sources are re-split in that epoch's
    /// row-group order; line sources are read in the blocks of that epoch (see
    /// [`with_shuffle`](Self::with_shuffle)).
    pub fn rewind(&mut self) {
        self.epoch += 1;
        self.start_epoch();
    }

    /// Positions the reader at the start of the current epoch; a line source's rows are
    /// found at the next read (it reads the dataset).
    fn start_epoch(&mut self) {
        if self.dataset.line_source().is_some() {
            self.replan = true;
        } else {
            let epoch = if self.shuffle_row_groups { self.epoch } else { 0 };
            self.mine = self.dataset.row_segments(self.span, epoch, self.seed, self.worker, self.workers);
        }
        self.next_group = 0;
        self.current = None;
    }

    /// This epoch's rows of a line source, when they are yet to be found.
    fn plan_lines(&mut self) -> Result<(), SourceError> {
        if !self.replan {
            return Ok(());
        }
        let Some(source) = self.dataset.line_source() else { return Ok(()) };
        let (span, worker, workers) = (self.span, self.worker, self.workers);
        let ranges = epoch_ranges(&source.file_bytes, span, worker, workers, self.epoch, self.blocks);
        self.mine = self.dataset.line_segments(&ranges)?;
        self.replan = false;
        Ok(())
    }

    /// From now on, records the file index and 0-based row of every row appended.
    pub fn record_positions(&mut self) {
        self.positions.get_or_insert_with(Vec::new);
    }

    /// The positions recorded since the last call, one per appended row, in order.
    pub fn take_positions(&mut self) -> Vec<RecordPosition> {
        self.positions.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Appends up to `max` samples to `out` (of the schema's shape) and
    /// returns how many; 0 (with `max > 0`) means this worker's row groups
    /// are exhausted until [`rewind`](Self::rewind). After an error the
    /// contents of `out` are unspecified.
    pub fn next_batch(&mut self, out: &mut Batch, max: usize) -> Result<usize, SourceError> {
        let (num_dense, num_sparse) = self.dataset.description().shape();
        let num_sequences = self.dataset.description().sequences.len();
        crate::error::check_batch_shape(out, num_dense, num_sparse, num_sequences)?;
        self.plan_lines()?;
        let mut appended = 0;
        while appended < max {
            let Some(cur) = self.current.as_mut() else {
                if !self.open_next_group()? {
                    break;
                }
                continue;
            };
            match &cur.chunk {
                Some(chunk) if cur.row < chunk.num_rows() => {
                    let k = (chunk.num_rows() - cur.row).min(max - appended);
                    let (dataset, group) = (&self.dataset, cur.group);
                    let place = || dataset.group_name(group);
                    let ctx = Ctx {
                        description: dataset.description(),
                        table_sizes: &self.table_sizes,
                        max_len: self.max_len,
                        place: &place,
                        first_row: Some(cur.file_row),
                    };
                    let rows = cur.row..cur.row + k;
                    let mut from = rows.start;
                    let (file, file_row) = (self.dataset.row_groups()[cur.group].file, cur.file_row);
                    let mut note = |from: usize, to: usize| {
                        if let Some(p) = self.positions.as_mut() {
                            p.extend((from..to).map(|r| RecordPosition { file, position: file_row + r as u64 }));
                        }
                    };
                    for (r, column) in non_finite_rows(&ctx, chunk, rows.clone())? {
                        append_rows(&ctx, chunk, from, r - from, out)?;
                        note(from, r);
                        appended += r - from;
                        from = r + 1;
                        let path = &dataset.files[dataset.row_groups()[group].file].path;
                        let record = bad_row(&ctx, path, chunk, r, column, cur.file_row + r as u64);
                        self.counts.add(record.reason);
                        if self.policy == BadRecordPolicy::Fail {
                            return Err(SourceError::BadRecord(record));
                        }
                        if let Some(sink) = self.dead_letters.as_deref_mut() {
                            sink.write(&record).map_err(|source| SourceError::DeadLetter { source })?;
                        }
                    }
                    append_rows(&ctx, chunk, from, rows.end - from, out)?;
                    note(from, rows.end);
                    appended += rows.end - from;
                    cur.row = rows.end;
                }
                _ => match decode_next(&mut cur.reader) {
                    Ok(Some(Ok(chunk))) => {
                        cur.file_row += cur.chunk.as_ref().map_or(0, |c| c.num_rows() as u64);
                        cur.chunk = Some(chunk);
                        cur.row = 0;
                    }
                    Ok(Some(Err(source))) => {
                        return Err(SourceError::Arrow { path: self.dataset.group_name(cur.group), source });
                    }
                    Ok(None) => {
                        // Fewer rows than the footer declares: a damaged file, not an early end.
                        let ended = cur.file_row + cur.chunk.as_ref().map_or(0, |c| c.num_rows() as u64);
                        if ended != cur.end_row {
                            let (path, end) = (self.dataset.group_name(cur.group), cur.end_row);
                            self.current = None;
                            return Err(SourceError::schema(
                                path,
                                format!("its data ends at row {ended} of the file, its metadata declares rows up to {end} (a damaged file)"),
                            ));
                        }
                        self.current = None
                    }
                    Err(reason) => {
                        let path = self.dataset.group_name(cur.group);
                        self.current = None;
                        return Err(SourceError::schema(path, reason));
                    }
                },
            }
        }
        self.rows_read += appended as u64;
        debug_assert!(out.check().is_ok());
        Ok(appended)
    }

    /// Opens this worker's next non-empty row group; false when there is none.
    fn open_next_group(&mut self) -> Result<bool, SourceError> {
        while self.next_group < self.mine.len() {
            let Segment { group: index, rows } = self.mine[self.next_group].clone();
            self.next_group += 1;
            let g = self.dataset.row_groups()[index];
            if rows.is_empty() {
                continue;
            }
            let file = &self.dataset.files[g.file];
            let handle = File::open(&file.path)
                .map_err(|source| SourceError::Io { path: file.path.display().to_string(), source })?;
            let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(handle, file.meta.clone())
                .with_projection(file.projection.clone())
                .with_row_groups(vec![g.group])
                .with_batch_size(DECODE_ROWS);
            if rows.start > 0 || rows.end < g.rows {
                let selectors = vec![
                    RowSelector::skip(rows.start as usize),
                    RowSelector::select((rows.end - rows.start) as usize),
                    RowSelector::skip((g.rows - rows.end) as usize),
                ];
                builder = builder.with_row_selection(RowSelection::from(selectors));
            }
            let reader = builder
                .build()
                .map_err(|source| SourceError::Parquet { path: self.dataset.group_name(index), source })?;
            let file_row = self.dataset.first_row_in_file(index) + rows.start;
            let end_row = self.dataset.first_row_in_file(index) + rows.end;
            self.current = Some(Current { group: index, reader, chunk: None, row: 0, file_row, end_row });
            return Ok(true);
        }
        Ok(false)
    }
}

/// What decoding rows needs: their schema, the table sizes that bound their ids, and where
/// they come from (for messages).
struct Ctx<'a> {
    description: &'a SchemaDescription,
    table_sizes: &'a [u64],
    /// The longest sequence the model reads, if known.
    max_len: Option<usize>,
    place: &'a dyn Fn() -> String,
    /// The file row (0-based) of the chunk's first row; `None` for rows from elsewhere
    /// ([`append_chunk`]), which their caller names.
    first_row: Option<u64>,
}

impl Ctx<'_> {
    fn err(&self, column: &str, reason: impl std::fmt::Display) -> SourceError {
        SourceError::schema((self.place)(), format!("column `{column}`: {reason}"))
    }

    fn column<'b>(&self, chunk: &'b RecordBatch, name: &str) -> Result<&'b Arc<dyn Array>, SourceError> {
        chunk.column_by_name(name).ok_or_else(|| self.err(name, "missing"))
    }

    /// [`err`](Self::err) about chunk row `r`, named `row N` (1-based, in its file); rows
    /// from elsewhere are named by their caller.
    fn err_at(&self, column: &str, r: usize, reason: impl std::fmt::Display) -> SourceError {
        match self.first_row {
            Some(first) => self.err(column, format!("row {}: {reason}", first + r as u64 + 1)),
            None => self.err(column, reason),
        }
    }

    fn check_id(&self, column: &str, field: usize, id: u64, r: usize) -> Result<u64, SourceError> {
        if id < self.table_sizes[field] {
            Ok(id)
        } else {
            Err(self.err_at(column, r, format!("id {id} is not below the table size {}", self.table_sizes[field])))
        }
    }
}

/// The rows of `rows` whose dense values are not all finite, with the first such column
/// (an index into the schema's dense columns), in order. Null values do not count.
fn non_finite_rows(
    ctx: &Ctx,
    chunk: &RecordBatch,
    rows: std::ops::Range<usize>,
) -> Result<Vec<(usize, usize)>, SourceError> {
    let d = ctx.description;
    let mut bad: Vec<(usize, usize)> = Vec::new();
    for (j, name) in d.dense.iter().enumerate() {
        let col =
            ctx.column(chunk, name)?.as_primitive_opt::<Float32Type>().ok_or_else(|| ctx.err(name, "not Float32"))?;
        let vals = &col.values()[rows.clone()];
        if all_finite(vals) {
            continue;
        }
        for (i, v) in vals.iter().enumerate() {
            let r = rows.start + i;
            if !v.is_finite() && !col.is_null(r) && !bad.iter().any(|&(b, _)| b == r) {
                bad.push((r, j));
            }
        }
    }
    bad.sort_unstable();
    Ok(bad)
}

/// The bad record of row `r` of `chunk` (row `file_row` of the file at `path`), whose dense
/// column `j` is not finite.
fn bad_row(ctx: &Ctx, path: &std::path::Path, chunk: &RecordBatch, r: usize, j: usize, file_row: u64) -> BadRecord {
    let d = ctx.description;
    let value = chunk
        .column_by_name(&d.dense[j])
        .and_then(|c| c.as_primitive_opt::<Float32Type>().map(|c| c.value(r)))
        .unwrap_or(f32::NAN);
    BadRecord {
        source: path.display().to_string(),
        line: file_row + 1,
        byte_offset: 0,
        reason: BadReason::NonFinite,
        field: Some(1 + j),
        raw: format!("row {} {}={value}", file_row + 1, d.dense[j]).into_bytes(),
    }
}

/// Appends every row of `chunk` (columns of `description`, matched by name; ids bounded by
/// `table_sizes`) to `out` as [`ParquetReader`] appends the rows of a file, its sequences cut
/// for a model reading at most `max_len` ids of each (see
/// [`ParquetReader::with_max_len`]): the rows of a featurized dataset that come from
/// elsewhere (`tiderec serve`'s records). `source` names them in errors. A row with a
/// non-finite dense value is an error, not a bad record to skip; after an error the contents
/// of `out` are unspecified.
pub fn append_chunk(
    description: &SchemaDescription,
    table_sizes: &[u64],
    max_len: Option<usize>,
    chunk: &RecordBatch,
    source: &str,
    out: &mut Batch,
) -> Result<(), SourceError> {
    let place = || source.to_string();
    let ctx = Ctx { description, table_sizes, max_len, place: &place, first_row: None };
    let rows = 0..chunk.num_rows();
    if let Some(&(r, j)) = non_finite_rows(&ctx, chunk, rows.clone())?.first() {
        let at = if rows.end > 1 { format!(" in row {r}") } else { String::new() };
        return Err(ctx.err(&description.dense[j], format!("{} value{at}", BadReason::NonFinite)));
    }
    append_rows(&ctx, chunk, 0, rows.end, out)
}

/// Appends rows `row..row + k` of `chunk` to `out`.
fn append_rows(ctx: &Ctx, chunk: &RecordBatch, row: usize, k: usize, out: &mut Batch) -> Result<(), SourceError> {
    let d = ctx.description;
    let rows = row..row + k;
    // Label.
    let labels = ctx
        .column(chunk, &d.label)?
        .as_primitive_opt::<Float32Type>()
        .ok_or_else(|| ctx.err(&d.label, "not Float32"))?;
    if let Some(r) = rows.clone().find(|&r| labels.null_count() > 0 && labels.is_null(r)) {
        return Err(ctx.err_at(&d.label, r, "null label"));
    }
    let values = &labels.values()[rows.clone()];
    if let Some(i) = values.iter().position(|v| !(0.0..=1.0).contains(v)) {
        return Err(ctx.err_at(&d.label, rows.start + i, format!("label {} is not in [0, 1]", values[i])));
    }
    out.labels.extend_from_slice(values);
    // User groups (not a feature).
    if d.groups {
        let keys = ctx
            .column(chunk, GROUP_COLUMN)?
            .as_primitive_opt::<UInt64Type>()
            .ok_or_else(|| ctx.err(GROUP_COLUMN, "not UInt64"))?;
        if let Some(r) = rows.clone().find(|&r| keys.null_count() > 0 && keys.is_null(r)) {
            return Err(ctx.err_at(GROUP_COLUMN, r, "null group"));
        }
        out.groups.extend_from_slice(&keys.values()[rows.clone()]);
    }
    // Dense, row-major.
    let nd = d.num_dense;
    let base = out.dense.len();
    out.dense.resize(base + k * nd, 0.0);
    for (j, name) in d.dense.iter().enumerate() {
        let col =
            ctx.column(chunk, name)?.as_primitive_opt::<Float32Type>().ok_or_else(|| ctx.err(name, "not Float32"))?;
        let vals = col.values();
        let has_nulls = col.null_count() > 0;
        for (i, r) in rows.clone().enumerate() {
            out.dense[base + i * nd + j] = if has_nulls && col.is_null(r) { 0.0 } else { vals[r] };
        }
    }
    // Sparse.
    for (f, (spec, field)) in d.sparse.iter().zip(out.sparse.iter_mut()).enumerate() {
        let name = &spec.name;
        let col = ctx.column(chunk, name)?;
        match spec.kind {
            SparseKind::Single => {
                let ids = col.as_primitive_opt::<UInt64Type>().ok_or_else(|| ctx.err(name, "not UInt64"))?;
                let vals = ids.values();
                let has_nulls = ids.null_count() > 0;
                for r in rows.clone() {
                    if !(has_nulls && ids.is_null(r)) {
                        field.ids.push(ctx.check_id(name, f, vals[r], r)?);
                    }
                    field.close_bag();
                }
            }
            SparseKind::List => append_list(ctx, col, name, f, rows.clone(), None, field)?,
        }
    }
    // Sequences: lists in their table's id space, cut as their format cuts them, of equal
    // lengths within a row.
    let firsts: Vec<usize> = out.sequences.iter().map(|s| s.offsets.len() - 1).collect();
    for (spec, field) in d.sequences.iter().zip(out.sequences.iter_mut()) {
        let SequenceColumn { name, table, .. } = spec;
        let cut = spec.cut(ctx.max_len);
        append_list(ctx, ctx.column(chunk, name)?, name, *table, rows.clone(), cut, field)?;
    }
    if d.sequences.len() > 1 {
        for (i, r) in rows.enumerate() {
            let lens: Vec<u32> =
                out.sequences.iter().zip(&firsts).map(|(s, &b)| s.offsets[b + i + 1] - s.offsets[b + i]).collect();
            if let Some(k) = lens.iter().position(|&l| l != lens[0]) {
                return Err(ctx.err_at(
                    &d.sequences[k].name,
                    r,
                    format!(
                        "{} ids, but `{}` has {} (the sequences of a row have equal lengths)",
                        lens[k], d.sequences[0].name, lens[0]
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Appends rows `rows` of the `List<UInt64>` column `col` (named `name`, ids
/// bounded by field `f`'s table) to `field`, one bag per row; with a `cut`, at most
/// that many ids of each row, the first or the last (null items do not count). Every
/// id is checked, kept or not.
fn append_list(
    ctx: &Ctx,
    col: &Arc<dyn Array>,
    name: &str,
    f: usize,
    rows: std::ops::Range<usize>,
    cut: Option<(usize, Keep)>,
    field: &mut SparseField,
) -> Result<(), SourceError> {
    let list = col.as_list_opt::<i32>().ok_or_else(|| ctx.err(name, "not List<UInt64>"))?;
    let items = list.values().as_primitive_opt::<UInt64Type>().ok_or_else(|| ctx.err(name, "not List<UInt64>"))?;
    let offsets = list.value_offsets();
    let item_nulls = items.null_count() > 0;
    let present = |i: &usize| !(item_nulls && items.is_null(*i));
    for r in rows {
        if !list.is_null(r) {
            let all = offsets[r] as usize..offsets[r + 1] as usize;
            let kept = match cut {
                None => 0..usize::MAX,
                Some((n, Keep::First)) => 0..n,
                Some((n, Keep::Last)) => {
                    let len = if item_nulls { all.clone().filter(present).count() } else { all.len() };
                    len.saturating_sub(n)..len
                }
            };
            for (k, i) in all.filter(present).enumerate() {
                let id = ctx.check_id(name, f, items.value(i), r)?;
                if kept.contains(&k) {
                    field.ids.push(id);
                }
            }
        }
        field.close_bag();
    }
    Ok(())
}
