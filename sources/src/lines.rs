//! Line-oriented readers: one worker's line-aligned byte ranges of memory-mapped files.
//!
//! A [`LineReader`] handles everything that does not depend on the record
//! format — ranges, line splitting, CRLF, over-long lines, line numbers,
//! bad-record counting, dead letters, epochs — and hands each line to a
//! [`LineFormat`], which parses it into a [`Batch`] without allocating.
//! Criteo ([`crate::criteo`]) and Avazu ([`crate::avazu`]) are such formats.
//!
//! # Invariants
//!
//! * **Disjoint, line-aligned ranges.** Worker `w` of `W` owns, in every file
//!   of length `len`, the byte range `[len·w/W, len·(w+1)/W)` (of the file's
//!   `span` when one is given). A line belongs to the range in which its
//!   *first byte* lies. The ranges of the `W` workers partition the lines of
//!   each file.
//! * **Records are never lost.** Every non-empty line of a range is either
//!   appended to the output batch or rejected as a bad record; empty lines and
//!   a header line at the start of a file (as the format recognises it) are
//!   skipped silently.
//! * **Bad records are counted and reported** by [`BadReason`], with the
//!   file, 1-based line number within the file, byte offset and raw bytes,
//!   to the [`DeadLetterSink`] under [`BadRecordPolicy::Skip`], or as
//!   [`SourceError::BadRecord`] under [`BadRecordPolicy::Fail`]. A bad line
//!   never leaves a partial sample in the output batch.

use crate::error::SourceError;
use memmap2::Mmap;
use std::fs::File;
use std::path::{Path, PathBuf};
use tiderec_operators::bad_record::{BadReason, BadRecord, BadRecordCounts, BadRecordPolicy, DeadLetterSink};
use tiderec_operators::Batch;

/// Default longest accepted line: 64 KiB.
pub const DEFAULT_MAX_LINE_BYTES: usize = 64 * 1024;
/// At most this many bytes of an over-long line are kept in its [`BadRecord::raw`].
pub const MAX_RAW_BYTES: usize = 4096;

pub use tiderec_operators::format::LineFormat;

/// Format-independent reader settings.
#[derive(Clone, Copy, Debug)]
pub struct ReaderOptions {
    /// Longest accepted line in bytes, without its terminator; longer lines are [`BadReason::TooLong`].
    pub max_line_bytes: usize,
    /// What to do with malformed lines.
    pub policy: BadRecordPolicy,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions { max_line_bytes: DEFAULT_MAX_LINE_BYTES, policy: BadRecordPolicy::Skip }
    }
}

/// One file and this reader's byte range in it.
struct FileRange {
    /// Name used in bad records.
    source: String,
    /// `None` for an empty file.
    map: Option<Mmap>,
    /// First byte of the first line of the range.
    start: usize,
    /// One past the last byte at which a line of this range may start.
    end: usize,
    /// Number of `\n` before `start` (computed on first need).
    newlines_before: Option<u64>,
    /// Bytes of the files before this one (its position in their concatenation).
    base: u64,
}

impl FileRange {
    /// The whole file's length in bytes.
    fn len(&self) -> usize {
        self.map.as_deref().map_or(0, <[u8]>::len)
    }
}

/// The first line start at or after `pos`: `pos` itself if it is 0, the end of
/// `data`, or just after a `\n`; otherwise the byte after the next `\n`.
pub(crate) fn align_to_line(data: &[u8], pos: usize) -> usize {
    if pos == 0 || pos >= data.len() {
        return pos.min(data.len());
    }
    match memchr::memchr(b'\n', &data[pos - 1..]) {
        Some(i) => pos + i,
        None => data.len(),
    }
}

/// Reads line-oriented files in format `F`, one worker's share of each; see the [module docs](self).
pub struct LineReader<F> {
    files: Vec<FileRange>,
    format: F,
    options: ReaderOptions,
    dead_letters: Option<Box<dyn DeadLetterSink>>,
    counts: BadRecordCounts,
    lines_read: u64,
    /// Index of the file being read.
    cur: usize,
    /// Byte position of the next line in the current file.
    pos: usize,
    /// Lines (including empty ones) passed since the current range's start.
    lines_in_range: u64,
    /// With [`record_line_starts`](Self::record_line_starts): the position of every good
    /// line appended since the last [`take_line_starts`](Self::take_line_starts).
    line_starts: Option<Vec<u64>>,
}

impl<F: LineFormat> LineReader<F> {
    /// Opens `paths` for worker `worker` of `workers`, reading lines in `format`.
    ///
    /// Of each file the part `span = (from, to)` (fractions of its bytes,
    /// line-aligned; `(0, 1)` for all of it) is split among the workers: this
    /// reader covers `[lo + (hi−lo)·worker/workers, lo + (hi−lo)·(worker+1)/workers)`,
    /// line-aligned. Spans `(0, f)` and `(f, 1)` partition every file's lines.
    ///
    /// Errors: [`SourceError::Io`] naming the path if a file cannot be opened
    /// or mapped; [`SourceError::Config`] for a bad span, `workers == 0` or
    /// `worker >= workers`. An empty file yields no records.
    #[allow(clippy::too_many_arguments)]
    pub fn open_format(
        paths: &[PathBuf],
        span: (f64, f64),
        worker: usize,
        workers: usize,
        format: F,
        options: ReaderOptions,
        dead_letters: Option<Box<dyn DeadLetterSink>>,
    ) -> Result<Self, SourceError> {
        if !(0.0 <= span.0 && span.0 <= span.1 && span.1 <= 1.0) {
            return Err(SourceError::Config { key: "span".into(), reason: format!("{span:?} is not within [0, 1]") });
        }
        if workers == 0 || worker >= workers {
            return Err(SourceError::Config { key: "workers".into(), reason: format!("worker {worker} of {workers}") });
        }
        let mut files: Vec<FileRange> = Vec::with_capacity(paths.len());
        for path in paths {
            let mut range = Self::open_range(path, span, worker, workers)?;
            range.base = files.last().map_or(0, |f| f.base + f.len() as u64);
            files.push(range);
        }
        Ok(LineReader {
            files,
            format,
            options,
            dead_letters,
            counts: BadRecordCounts::default(),
            lines_read: 0,
            cur: 0,
            pos: 0,
            lines_in_range: 0,
            line_starts: None,
        }
        .rewound())
    }

    fn open_range(path: &Path, span: (f64, f64), worker: usize, workers: usize) -> Result<FileRange, SourceError> {
        let io_err = |source| SourceError::Io { path: path.display().to_string(), source };
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len() as usize;
        let map = if len == 0 {
            None
        } else {
            // SAFETY: the map is read-only; input files must not be modified
            // while they are being read (the usual contract of mmap readers).
            let map = unsafe { Mmap::map(&file) }.map_err(io_err)?;
            #[cfg(unix)]
            let _ = map.advise(memmap2::Advice::Sequential);
            Some(map)
        };
        let data: &[u8] = map.as_deref().unwrap_or(&[]);
        let lo = (data.len() as f64 * span.0).round() as usize;
        let hi = if span.1 >= 1.0 { data.len() } else { (data.len() as f64 * span.1).round() as usize };
        let split = |w: usize| lo + ((hi - lo) as u128 * w as u128 / workers as u128) as usize;
        let start = align_to_line(data, split(worker));
        let end = align_to_line(data, split(worker + 1));
        Ok(FileRange { source: path.display().to_string(), map, start, end, newlines_before: None, base: 0 })
    }

    fn rewound(mut self) -> Self {
        self.rewind();
        self
    }

    /// Starts over from the beginning of this reader's ranges (next epoch).
    /// Bad-record counts and [`lines_read`](Self::lines_read) keep accumulating.
    pub fn rewind(&mut self) {
        self.cur = 0;
        self.pos = self.files.first().map_or(0, |f| f.start);
        self.lines_in_range = 0;
    }

    /// Bad records seen so far, by reason (accumulated over epochs).
    pub fn bad_counts(&self) -> &BadRecordCounts {
        &self.counts
    }

    /// Lines read so far, good plus bad (empty lines excluded), accumulated over epochs.
    pub fn lines_read(&self) -> u64 {
        self.lines_read
    }

    /// Bytes of this reader's ranges passed in the current epoch (for progress).
    pub fn bytes_read(&self) -> u64 {
        let done: usize = self.files[..self.cur.min(self.files.len())].iter().map(|f| f.end - f.start).sum();
        let current = self.files.get(self.cur).map_or(0, |f| self.pos.min(f.end).saturating_sub(f.start));
        (done + current) as u64
    }

    /// Bytes of this reader's ranges (line starts), over all files.
    pub fn bytes_total(&self) -> u64 {
        self.files.iter().map(|f| (f.end - f.start) as u64).sum()
    }

    /// From now on, records the position of every good line appended: the byte offset
    /// of its first byte in the concatenation of the files (for `tiderec convert`, so
    /// that replay can split rows across workers as this reader splits lines).
    pub fn record_line_starts(&mut self) {
        self.line_starts.get_or_insert_with(Vec::new);
    }

    /// The positions recorded since the last call, one per good line, in order.
    pub fn take_line_starts(&mut self) -> Vec<u64> {
        self.line_starts.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The byte length of every file, in order.
    pub fn file_bytes(&self) -> Vec<u64> {
        self.files.iter().map(|f| f.len() as u64).collect()
    }

    /// The dead-letter sink, if any (e.g. to flush it).
    pub fn dead_letters(&mut self) -> Option<&mut (dyn DeadLetterSink + 'static)> {
        self.dead_letters.as_deref_mut()
    }

    /// The record format.
    pub fn format(&self) -> &F {
        &self.format
    }

    /// Appends up to `max` good records to `out` (which must have the
    /// format's shape) and returns how many were appended; 0 (with
    /// `max > 0`) means this reader's ranges are exhausted until [`rewind`](Self::rewind).
    ///
    /// Under [`BadRecordPolicy::Fail`] the first bad line returns
    /// [`SourceError::BadRecord`]; the records appended before it stay in `out`.
    /// When the last range is exhausted the dead-letter sink is flushed; a
    /// sink failure is [`SourceError::DeadLetter`].
    pub fn next_batch(&mut self, out: &mut Batch, max: usize) -> Result<usize, SourceError> {
        let (num_dense, num_sparse) = self.format.shape();
        let num_sequences = self.format.num_sequences();
        if out.num_dense != num_dense || out.sparse.len() != num_sparse || out.sequences.len() != num_sequences {
            return Err(SourceError::Config {
                key: "batch".into(),
                reason: format!(
                    "batch has {} dense / {} sparse / {} sequence fields, expected {num_dense} / {num_sparse} / \
                     {num_sequences}",
                    out.num_dense,
                    out.sparse.len(),
                    out.sequences.len()
                ),
            });
        }
        let mut appended = 0;
        while appended < max && self.cur < self.files.len() {
            appended += self.read_file(out, max - appended)?;
            if appended < max {
                // The current range is exhausted: go to the next file.
                self.cur += 1;
                self.pos = self.files.get(self.cur).map_or(0, |f| f.start);
                self.lines_in_range = 0;
                if self.cur == self.files.len() {
                    // End of the epoch: make the dead letters durable.
                    if let Some(sink) = self.dead_letters.as_deref_mut() {
                        sink.flush().map_err(|source| SourceError::DeadLetter { source })?;
                    }
                }
            }
        }
        debug_assert!(out.check().is_ok());
        Ok(appended)
    }

    /// Reads up to `max` good records from the current file; returns fewer
    /// only when its range is exhausted.
    fn read_file(&mut self, out: &mut Batch, max: usize) -> Result<usize, SourceError> {
        let LineReader {
            files,
            format,
            options,
            dead_letters,
            counts,
            lines_read,
            cur,
            pos,
            lines_in_range,
            line_starts,
        } = self;
        let file = &mut files[*cur];
        let data: &[u8] = file.map.as_deref().unwrap_or(&[]);
        let end = file.end;
        let max_line = options.max_line_bytes;
        let mut appended = 0;
        let mut p = *pos;
        let mut lines = *lines_in_range;
        let mut good = 0u64;
        while appended < max && p < end {
            let line_start = p;
            // Look for the terminator no further than the line limit allows
            // (+1 for a '\r', +1 for the '\n' itself).
            let window_end = data.len().min(p.saturating_add(max_line).saturating_add(2));
            let (line, next, too_long) = match memchr::memchr(b'\n', &data[p..window_end]) {
                Some(i) => {
                    let mut line = &data[p..p + i];
                    if let [rest @ .., b'\r'] = line {
                        line = rest;
                    }
                    (line, p + i + 1, line.len() > max_line)
                }
                None if window_end == data.len() => {
                    let mut line = &data[p..];
                    if let [rest @ .., b'\r'] = line {
                        line = rest;
                    }
                    (line, data.len(), line.len() > max_line)
                }
                None => {
                    // Over-long line: skip to its end; only its head is kept.
                    let (line_end, next) = match memchr::memchr(b'\n', &data[window_end..]) {
                        Some(i) => (window_end + i, window_end + i + 1),
                        None => (data.len(), data.len()),
                    };
                    let mut line = &data[p..line_end];
                    if let [rest @ .., b'\r'] = line {
                        line = rest;
                    }
                    (line, next, true)
                }
            };
            p = next;
            lines += 1;
            if line.is_empty() || (line_start == 0 && format.is_header(line)) {
                continue;
            }
            let result = if too_long { Err((BadReason::TooLong, None)) } else { format.parse(line, out) };
            match result {
                Ok(()) => {
                    appended += 1;
                    good += 1;
                    if let Some(starts) = line_starts.as_mut() {
                        starts.push(file.base + line_start as u64);
                    }
                }
                Err((reason, field)) => {
                    *lines_read += good + 1;
                    good = 0;
                    counts.add(reason);
                    let base = *file.newlines_before.get_or_insert_with(|| count_newlines(&data[..file.start]));
                    let raw_len = if too_long { line.len().min(MAX_RAW_BYTES) } else { line.len() };
                    let record = BadRecord {
                        source: file.source.clone(),
                        line: base + lines,
                        byte_offset: line_start as u64,
                        reason,
                        field,
                        raw: line[..raw_len].to_vec(),
                    };
                    match options.policy {
                        BadRecordPolicy::Skip => {
                            if let Some(sink) = dead_letters.as_deref_mut() {
                                if let Err(source) = sink.write(&record) {
                                    *pos = p;
                                    *lines_in_range = lines;
                                    return Err(SourceError::DeadLetter { source });
                                }
                            }
                        }
                        BadRecordPolicy::Fail => {
                            *pos = p;
                            *lines_in_range = lines;
                            return Err(SourceError::BadRecord(record));
                        }
                    }
                }
            }
        }
        *lines_read += good;
        *pos = p;
        *lines_in_range = lines;
        Ok(appended)
    }
}

/// Number of `\n` bytes in `data`.
pub(crate) fn count_newlines(data: &[u8]) -> u64 {
    // Chunked so that the inner count vectorises and cannot overflow.
    data.chunks(1 << 16).map(|c| c.iter().filter(|&&b| b == b'\n').count() as u64).sum()
}
