//! Line-oriented readers: one worker's line-aligned byte ranges of files.
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
//! * **Epochs.** Epoch 0 reads the ranges in file order. With a
//!   [`BlockShuffle`] ([`LineReader::with_shuffle`]), every later epoch reads
//!   the blocks of the ranges in that epoch's permutation ([`crate::shuffle`]);
//!   a block is read by the same rule as a range (the lines whose first byte
//!   lies in it), so a shuffled epoch reads every line of the ranges exactly
//!   once, and the order is a function of the files' sizes, the worker, the
//!   shuffle and the epoch only.
//! * **Records are never lost.** Every non-empty line of a range is either
//!   appended to the output batch or rejected as a bad record; empty lines and
//!   a header line at the start of a file (as the format recognises it) are
//!   skipped silently. A UTF-8 byte order mark at byte 0 of a file is no part
//!   of its first line ([`strip_bom`]): the header check and the parse see the
//!   line without it.
//! * **Bad records are counted and reported** by [`BadReason`], with the
//!   file, 1-based line number within the file, byte offset and raw bytes,
//!   to the [`DeadLetterSink`] under [`BadRecordPolicy::Skip`], or as
//!   [`SourceError::BadRecord`] under [`BadRecordPolicy::Fail`]. A bad line
//!   never leaves a partial sample in the output batch.
//! * **A file that changes while it is read is an error, never a signal.**
//!   Files are read with positioned reads (`pread`) into a window of
//!   [`WINDOW_BYTES`], not memory-mapped: a mapped file truncated by another
//!   process would kill the reader with `SIGBUS`. Every refill of the window
//!   checks the file against its length and modification time at the first
//!   open, and so does every reopening (below), which also checks that the
//!   name still leads to the same file (device and inode on Unix); a short
//!   read, a smaller or larger file, a new modification time, a file removed
//!   or replaced is [`SourceError::Changed`] naming the file. (Bytes already in
//!   the window when the file changes are parsed as they were read.)
//! * **One input file open at a time.** [`LineReader::open_format`] opens each
//!   file once, to learn its length and align its range, and closes it; a file
//!   is reopened when one of its ranges is entered and closed when a range of
//!   another file is entered or the epoch ends. So a reader holds at most one
//!   descriptor of its inputs, however many files a directory has, and a
//!   process with many workers and readers stays far below the open-file limit.

use crate::error::SourceError;
use crate::shuffle::{epoch_ranges, worker_bytes, BlockShuffle, ByteRange};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use tiderec_records::bad_record::{BadReason, BadRecord, BadRecordCounts, BadRecordPolicy, DeadLetterSink};
use tiderec_records::Batch;

/// Default longest accepted line: 64 KiB.
pub const DEFAULT_MAX_LINE_BYTES: usize = 64 * 1024;
/// At most this many bytes of an over-long line are kept in its [`BadRecord::raw`].
pub const MAX_RAW_BYTES: usize = 4096;
/// Bytes read per refill of a reader's window (more when a line may be longer).
pub const WINDOW_BYTES: usize = 1 << 20;

pub use tiderec_records::format::LineFormat;

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

/// An input file as this reader first saw it: the reference every later handle on it is
/// checked against.
struct FileInfo {
    /// Where it is (reopened from there for each of its ranges).
    path: PathBuf,
    /// Name used in bad records and errors.
    name: String,
    /// Length at the first open; bytes beyond it (appended later) are not read.
    len: usize,
    modified: Option<SystemTime>,
    /// Device and inode (Unix), so that a file replaced under its name is noticed.
    identity: Option<(u64, u64)>,
}

impl FileInfo {
    /// Opens `path` and records what the file is; returns the open handle too.
    fn open(path: &Path) -> Result<(Self, File), SourceError> {
        let io_err = |source| SourceError::Io { path: path.display().to_string(), source };
        let file = File::open(path).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        let len = usize::try_from(meta.len()).map_err(|_| {
            SourceError::config("data", format!("{} is larger than this machine's address space", path.display()))
        })?;
        let info = FileInfo {
            path: path.to_path_buf(),
            name: path.display().to_string(),
            len,
            modified: meta.modified().ok(),
            identity: identity(&meta),
        };
        Ok((info, file))
    }

    /// Opens the file again; [`SourceError::Changed`] when it is gone or no longer the file
    /// first opened (another length, modification time or inode).
    fn reopen(&self) -> Result<File, SourceError> {
        let changed = |reason: String| SourceError::Changed { path: self.name.clone(), reason };
        let io_err = |source| SourceError::Io { path: self.name.clone(), source };
        let file = File::open(&self.path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => changed("it was removed or renamed".into()),
            _ => io_err(e),
        })?;
        let meta = file.metadata().map_err(io_err)?;
        let len = meta.len();
        if len < self.len as u64 {
            return Err(changed(format!("it shrank from {} to {len} bytes", self.len)));
        }
        if len > self.len as u64 {
            return Err(changed(format!("it was modified (it grew from {} to {len} bytes)", self.len)));
        }
        if identity(&meta) != self.identity {
            return Err(changed("it was replaced by another file".into()));
        }
        if meta.modified().ok() != self.modified {
            return Err(changed("it was modified".into()));
        }
        Ok(file)
    }
}

/// The device and inode of a file (Unix only).
fn identity(meta: &std::fs::Metadata) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

/// An open handle on an input file, read against what the file was at the first open.
#[derive(Clone, Copy)]
struct Source<'a> {
    info: &'a FileInfo,
    file: &'a File,
}

impl Source<'_> {
    /// The file's length at the first open.
    fn len(&self) -> usize {
        self.info.len
    }

    /// Fills `buf` with the bytes at `offset` (all of them below `len`); a short read or
    /// a file that no longer has its length or modification time is [`SourceError::Changed`].
    fn read_exact_at(&self, buf: &mut [u8], offset: usize) -> Result<(), SourceError> {
        let name = &self.info.name;
        let changed = |reason: String| SourceError::Changed { path: name.clone(), reason };
        read_at(self.file, buf, offset as u64).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => changed(format!(
                "it ended before byte {} of the {} it had when opened (truncated?)",
                offset + buf.len(),
                self.len()
            )),
            _ => SourceError::Io { path: name.clone(), source: e },
        })?;
        let meta = self.file.metadata().map_err(|source| SourceError::Io { path: name.clone(), source })?;
        if (meta.len() as usize) < self.len() {
            return Err(changed(format!("it shrank from {} to {} bytes", self.len(), meta.len())));
        }
        if meta.modified().ok() != self.info.modified {
            return Err(changed("it was modified".into()));
        }
        Ok(())
    }

    /// The first line start at or after `pos`: `pos` itself if it is 0, the end of the file, or
    /// just after a `\n`; otherwise the byte after the next `\n`. Reads as needed.
    fn align_to_line(&self, pos: usize, scratch: &mut Vec<u8>) -> Result<usize, SourceError> {
        if pos == 0 || pos >= self.len() {
            return Ok(pos.min(self.len()));
        }
        Ok(self.find_newline(pos - 1, scratch)?.map_or(self.len(), |i| i + 1))
    }

    /// Offset of the first `\n` at or after `from`, if any. Reads 4 KiB first, then twice
    /// as much each time up to [`WINDOW_BYTES`] (a line is usually found in the first read).
    fn find_newline(&self, mut from: usize, scratch: &mut Vec<u8>) -> Result<Option<usize>, SourceError> {
        let mut chunk = 4096;
        while from < self.len() {
            let n = (self.len() - from).min(chunk);
            scratch.resize(n, 0);
            self.read_exact_at(scratch, from)?;
            if let Some(i) = memchr::memchr(b'\n', scratch) {
                return Ok(Some(from + i));
            }
            from += n;
            chunk = (chunk * 2).min(WINDOW_BYTES);
        }
        Ok(None)
    }

    /// Number of `\n` bytes before `pos`, counted from the nearest known offset before it
    /// in `known` (offset → newlines before it), which then knows `pos` too.
    fn newlines_before(
        &self,
        pos: usize,
        known: &mut BTreeMap<usize, u64>,
        scratch: &mut Vec<u8>,
    ) -> Result<u64, SourceError> {
        let (&from, &before) = known.range(..=pos).next_back().unwrap_or((&0, &0));
        let count = before + self.newlines_between(from, pos, scratch)?;
        known.insert(pos, count);
        Ok(count)
    }

    /// Number of `\n` bytes in `[from, end)`.
    fn newlines_between(&self, mut from: usize, end: usize, scratch: &mut Vec<u8>) -> Result<u64, SourceError> {
        let mut count = 0;
        while from < end {
            let n = (end - from).min(WINDOW_BYTES);
            scratch.resize(n, 0);
            self.read_exact_at(scratch, from)?;
            count += count_newlines(scratch);
            from += n;
        }
        Ok(count)
    }
}

/// The handle `held` keeps, made that of file `index` (described by `info`): the one held
/// when it is that file's, else — after the one held is closed — the file reopened and
/// checked against `info` ([`FileInfo::reopen`]). So a reader holds at most one file open.
fn hold<'a>(held: &'a mut Option<(usize, File)>, index: usize, info: &'a FileInfo) -> Result<Source<'a>, SourceError> {
    let file = match held.take() {
        Some((i, file)) if i == index => file,
        previous => {
            drop(previous);
            info.reopen()?
        }
    };
    let (_, file) = held.insert((index, file));
    Ok(Source { info, file })
}

/// Positioned read of all of `buf` at `offset`; `UnexpectedEof` when the file ends first.
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = file;
        f.seek(SeekFrom::Start(offset))?;
        f.read_exact(buf)
    }
}

/// One file and this reader's byte range in it.
struct FileRange {
    /// The file as first opened (it is open only while one of its ranges is read).
    info: FileInfo,
    /// First byte of the first line of the range.
    start: usize,
    /// One past the last byte at which a line of this range may start.
    end: usize,
    /// Offsets of the file whose number of preceding `\n` is known (computed on first
    /// need, for line numbers), with that number.
    newlines: BTreeMap<usize, u64>,
    /// Bytes of the files before this one (its position in their concatenation).
    base: u64,
}

/// The range being read, line-aligned.
#[derive(Clone, Copy, Debug)]
struct Entered {
    /// First byte of its first line.
    start: usize,
    /// One past the last byte at which one of its lines may start.
    end: usize,
    /// Number of `\n` before `start` (computed on first need).
    newlines_before: Option<u64>,
}

impl FileRange {
    /// The whole file's length in bytes.
    fn len(&self) -> usize {
        self.info.len
    }
}

/// The bytes `[offset, offset + buf.len())` of file `file` of a reader.
#[derive(Default)]
struct Window {
    file: usize,
    offset: usize,
    buf: Vec<u8>,
}

impl Window {
    /// Makes the window hold `[pos, min(pos + want, len))` of `source` (file number `file`),
    /// keeping the bytes it already holds from `pos` on.
    fn fill(&mut self, file: usize, source: Source<'_>, pos: usize, want: usize) -> Result<(), SourceError> {
        let upto = source.len().min(pos.saturating_add(want));
        let held_end = self.offset + self.buf.len();
        let keep = if self.file == file && self.offset <= pos && pos <= held_end {
            self.buf.copy_within(pos - self.offset.., 0);
            held_end - pos
        } else {
            0
        };
        let keep = keep.min(upto - pos);
        self.buf.resize(upto - pos, 0);
        source.read_exact_at(&mut self.buf[keep..], pos + keep)?;
        self.file = file;
        self.offset = pos;
        Ok(())
    }

    /// True when the window holds `[pos, min(pos + want, len))` of file `file`.
    fn holds(&self, file: usize, pos: usize, want: usize, len: usize) -> bool {
        self.file == file && self.offset <= pos && self.offset + self.buf.len() >= len.min(pos.saturating_add(want))
    }
}

/// The first line start at or after `pos`: `pos` itself if it is 0, the end of
/// `data`, or just after a `\n`; otherwise the byte after the next `\n`.
#[cfg(test)]
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
    /// The part of every file read: `(from, to)` fractions of its bytes.
    span: (f64, f64),
    /// This reader's worker and the number of workers.
    worker: usize,
    workers: usize,
    /// The shuffle of the epochs after the first, if any.
    shuffle: Option<BlockShuffle>,
    /// The current epoch (0-based).
    epoch: u64,
    /// This epoch's byte ranges, in reading order.
    plan: Vec<ByteRange>,
    /// Index into `plan` of the range being read.
    cur: usize,
    /// The open handle of the file of the range being read (or last read), with the file's
    /// index: the only input file this reader holds open.
    held: Option<(usize, File)>,
    /// The range `plan[cur]` line-aligned, once reading it began.
    entered: Option<Entered>,
    /// Byte position of the next line in the current range's file.
    pos: usize,
    /// Lines (including empty ones) passed since the current range's start.
    lines_in_range: u64,
    /// Bytes of the ranges finished in this epoch.
    bytes_done: u64,
    /// The bytes being parsed.
    window: Window,
    /// Buffer of scans outside the window (over-long lines, line numbers).
    scratch: Vec<u8>,
    /// With [`record_line_starts`](Self::record_line_starts): the position of every good
    /// line appended since the last [`take_line_starts`](Self::take_line_starts).
    line_starts: Option<Vec<u64>>,
    /// With [`record_positions`](Self::record_positions): the file and line of every good
    /// line appended since the last [`take_positions`](Self::take_positions).
    positions: Option<Vec<RecordPosition>>,
}

/// Where a record came from: the index of its file among the reader's files, and its
/// position in that file (a 1-based line number for line files, a 0-based row for Parquet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordPosition {
    /// Index of the file, in the order the files were given.
    pub file: usize,
    /// 1-based line number (line files) or 0-based row index (Parquet).
    pub position: u64,
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
    /// or read; [`SourceError::Config`] for a bad span, `workers == 0` or
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
            return Err(SourceError::config("span", format!("{span:?} is not within [0, 1]")));
        }
        if workers == 0 || worker >= workers {
            return Err(SourceError::config("workers", format!("worker {worker} of {workers}")));
        }
        let mut files: Vec<FileRange> = Vec::with_capacity(paths.len());
        let mut scratch = Vec::new();
        for path in paths {
            let mut range = Self::open_range(path, span, worker, workers, &mut scratch)?;
            range.base = files.last().map_or(0, |f| f.base + f.len() as u64);
            files.push(range);
        }
        let mut reader = LineReader {
            files,
            format,
            options,
            dead_letters,
            counts: BadRecordCounts::default(),
            lines_read: 0,
            span,
            worker,
            workers,
            shuffle: None,
            epoch: 0,
            plan: Vec::new(),
            cur: 0,
            held: None,
            entered: None,
            pos: 0,
            lines_in_range: 0,
            bytes_done: 0,
            window: Window { file: usize::MAX, ..Window::default() },
            scratch,
            line_starts: None,
            positions: None,
        };
        reader.start_epoch(0);
        Ok(reader)
    }

    /// Reads the epochs after the first in the blocks of `shuffle` (`None`: every epoch
    /// in file order, the default); see the [module docs](self). Restarts the current epoch.
    pub fn with_shuffle(mut self, shuffle: Option<BlockShuffle>) -> Self {
        self.shuffle = shuffle;
        self.start_epoch(self.epoch);
        self
    }

    fn open_range(
        path: &Path,
        span: (f64, f64),
        worker: usize,
        workers: usize,
        scratch: &mut Vec<u8>,
    ) -> Result<FileRange, SourceError> {
        let (info, file) = FileInfo::open(path)?;
        let source = Source { info: &info, file: &file };
        let bytes = worker_bytes(info.len as u64, span, worker, workers);
        let start = source.align_to_line(bytes.start as usize, scratch)?;
        let end = source.align_to_line(bytes.end as usize, scratch)?;
        // Closed until one of its ranges is read: a reader holds one input file open at a time.
        drop(file);
        Ok(FileRange { info, start, end, newlines: BTreeMap::new(), base: 0 })
    }

    /// Starts over from the beginning of this reader's ranges in the next epoch (shuffled
    /// after the first with [`with_shuffle`](Self::with_shuffle)).
    /// Bad-record counts and [`lines_read`](Self::lines_read) keep accumulating.
    pub fn rewind(&mut self) {
        self.start_epoch(self.epoch + 1);
    }

    /// The current epoch (0-based): the number of [`rewind`](Self::rewind)s.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Positions the reader at the start of epoch `epoch`.
    fn start_epoch(&mut self, epoch: u64) {
        let sizes = self.file_bytes();
        self.epoch = epoch;
        self.plan = epoch_ranges(&sizes, self.span, self.worker, self.workers, epoch, self.shuffle);
        self.cur = 0;
        self.held = None;
        self.entered = None;
        self.pos = 0;
        self.lines_in_range = 0;
        self.bytes_done = 0;
    }

    /// The range `plan[cur]`, line-aligned; reading it begins at its start.
    fn enter(&mut self) -> Result<Entered, SourceError> {
        if let Some(entered) = self.entered {
            return Ok(entered);
        }
        let range = &self.plan[self.cur];
        let info = &self.files[range.file].info;
        let (start, end) = if info.len == 0 {
            (0, 0)
        } else {
            let s = hold(&mut self.held, range.file, info)?;
            (
                s.align_to_line(range.bytes.start as usize, &mut self.scratch)?,
                s.align_to_line(range.bytes.end as usize, &mut self.scratch)?,
            )
        };
        self.pos = start;
        self.lines_in_range = 0;
        Ok(*self.entered.insert(Entered { start, end, newlines_before: None }))
    }

    /// Goes on to the next range; at the end of the epoch flushes the dead letters.
    fn leave(&mut self) -> Result<(), SourceError> {
        if let Some(done) = self.entered.take() {
            self.bytes_done += (done.end - done.start) as u64;
        }
        self.cur += 1;
        self.lines_in_range = 0;
        if self.cur == self.plan.len() {
            // End of the epoch: close the last file, make the dead letters durable.
            self.held = None;
            if let Some(sink) = self.dead_letters.as_deref_mut() {
                sink.flush().map_err(|source| SourceError::DeadLetter { source })?;
            }
        }
        Ok(())
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
        let current = self.entered.map_or(0, |r| self.pos.min(r.end).saturating_sub(r.start));
        self.bytes_done + current as u64
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

    /// From now on, records the file and 1-based line number of every good line appended
    /// (header and empty lines count as lines, as in a text editor).
    pub fn record_positions(&mut self) {
        self.positions.get_or_insert_with(Vec::new);
    }

    /// The positions recorded since the last call, one per good line, in order.
    pub fn take_positions(&mut self) -> Vec<RecordPosition> {
        self.positions.as_mut().map(std::mem::take).unwrap_or_default()
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
        crate::error::check_batch_shape(out, num_dense, num_sparse, num_sequences)?;
        let mut appended = 0;
        while appended < max && self.cur < self.plan.len() {
            let mut range = self.enter()?;
            let read = self.read_range(&mut range, out, max - appended);
            self.entered = Some(range);
            appended += read?;
            if appended < max {
                // The current range is exhausted.
                self.leave()?;
            }
        }
        debug_assert!(out.check().is_ok());
        Ok(appended)
    }

    /// Reads up to `max` good records from the current range, `range` line-aligned;
    /// returns fewer only when it is exhausted.
    fn read_range(&mut self, range: &mut Entered, out: &mut Batch, max: usize) -> Result<usize, SourceError> {
        let LineReader {
            files,
            format,
            options,
            dead_letters,
            counts,
            lines_read,
            plan,
            cur,
            held,
            pos,
            lines_in_range,
            window,
            scratch,
            line_starts,
            positions,
            ..
        } = self;
        let file_index = plan[*cur].file;
        let FileRange { info, newlines, base: file_base, .. } = &mut files[file_index];
        if info.len == 0 {
            return Ok(0);
        }
        let source = hold(held, file_index, info)?;
        let (len, end) = (source.len(), range.end);
        let max_line = options.max_line_bytes;
        // A line is found within `need` bytes of its start (+1 for a '\r', +1 for the '\n').
        let need = max_line.saturating_add(2);
        // The window also holds the head of an over-long line, kept in its bad record.
        let held = need.max(MAX_RAW_BYTES);
        let want = held.max(WINDOW_BYTES);
        let mut appended = 0;
        let mut p = *pos;
        let mut lines = *lines_in_range;
        let mut good = 0u64;
        let result = loop {
            if appended >= max || p >= end {
                break Ok(());
            }
            if !window.holds(file_index, p, held, len) {
                // Up to `held` past the range's last line start is all it can need.
                if let Err(e) = window.fill(file_index, source, p, want.min((end - p).saturating_add(held))) {
                    break Err(e);
                }
            }
            let data = &window.buf[p - window.offset..];
            let line_start = p;
            let window_end = data.len().min(need);
            let (line, next, too_long) = match memchr::memchr(b'\n', &data[..window_end]) {
                Some(i) => (strip_cr(&data[..i]), p + i + 1, strip_cr(&data[..i]).len() > max_line),
                None if p + window_end == len => {
                    let line = strip_cr(&data[..window_end]);
                    (line, len, line.len() > max_line)
                }
                None => {
                    // Over-long line: skip to its end; only its head is kept.
                    let (line_end, next) = match source.find_newline(p + window_end, scratch) {
                        Ok(Some(i)) => (i, i + 1),
                        Ok(None) => (len, len),
                        Err(e) => break Err(e),
                    };
                    let line_len = line_end - p;
                    let head = &data[..line_len.min(MAX_RAW_BYTES)];
                    (if line_len <= MAX_RAW_BYTES { strip_cr(head) } else { head }, next, true)
                }
            };
            p = next;
            lines += 1;
            let line = if line_start == 0 { strip_bom(line) } else { line };
            if line.is_empty() || (line_start == 0 && format.is_header(line)) {
                continue;
            }
            let result = if too_long { Err((BadReason::TooLong, None)) } else { format.parse(line, out) };
            let start = range.start;
            let mut base = |known: &mut Option<u64>, scratch: &mut Vec<u8>| match *known {
                Some(n) => Ok(n),
                None => source.newlines_before(start, &mut *newlines, scratch).map(|n| *known.insert(n)),
            };
            let Err((reason, field)) = result else {
                appended += 1;
                good += 1;
                if let Some(starts) = line_starts.as_mut() {
                    starts.push(*file_base + line_start as u64);
                }
                if let Some(positions) = positions.as_mut() {
                    match base(&mut range.newlines_before, scratch) {
                        Ok(n) => positions.push(RecordPosition { file: file_index, position: n + lines }),
                        Err(e) => break Err(e),
                    }
                }
                continue;
            };
            *lines_read += good + 1;
            good = 0;
            counts.add(reason);
            let base = match base(&mut range.newlines_before, scratch) {
                Ok(n) => n,
                Err(e) => break Err(e),
            };
            let raw_len = if too_long { line.len().min(MAX_RAW_BYTES) } else { line.len() };
            let record = BadRecord {
                source: info.name.clone(),
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
                            break Err(SourceError::DeadLetter { source });
                        }
                    }
                }
                BadRecordPolicy::Fail => break Err(SourceError::BadRecord(record)),
            }
        };
        *lines_read += good;
        *pos = p;
        *lines_in_range = lines;
        result.map(|()| appended)
    }
}

/// The UTF-8 byte order mark (`EF BB BF`) some editors and exporters write at the start of a text file.
pub const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// A file's first line without a leading UTF-8 byte order mark ([`UTF8_BOM`]): every reader
/// of line files strips it there, so a header is still recognised and a first record still
/// parses. Only a file's first line may be passed: elsewhere the bytes are data.
pub fn strip_bom(first_line: &[u8]) -> &[u8] {
    first_line.strip_prefix(UTF8_BOM).unwrap_or(first_line)
}

/// `line` without a final `\r`.
fn strip_cr(line: &[u8]) -> &[u8] {
    match line {
        [rest @ .., b'\r'] => rest,
        _ => line,
    }
}

/// Number of `\n` bytes in `data`.
pub(crate) fn count_newlines(data: &[u8]) -> u64 {
    // Chunked so that the inner count vectorises and cannot overflow.
    data.chunks(1 << 16).map(|c| c.iter().filter(|&&b| b == b'\n').count() as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::criteo::{CriteoConfig, CriteoFeatures, CriteoReader, NUM_DENSE, NUM_SPARSE};
    use tiderec_records::bad_record::MemoryDeadLetters;

    /// A valid 40-field Criteo line, different for every `i`.
    fn line(i: usize) -> String {
        let mut f = vec![(i % 2).to_string()];
        f.extend((0..13).map(|j| ((i * 31 + j) % 1000).to_string()));
        f.extend((0..26).map(|j| format!("{:08x}", (i * 7919 + j * 104_729) as u32)));
        f.join("\t")
    }

    fn open(path: &Path, workers: usize, worker: usize) -> CriteoReader {
        let config = CriteoConfig::new(CriteoFeatures::uniform(1000, 3));
        let sink: Box<dyn DeadLetterSink> = Box::new(MemoryDeadLetters::default());
        CriteoReader::open(&[path.to_path_buf()], worker, workers, config, Some(sink)).unwrap()
    }

    /// Reads the rest of `reader`'s ranges; returns the records read.
    fn read_all(reader: &mut CriteoReader) -> Result<usize, SourceError> {
        let mut out = Batch::new(NUM_DENSE, NUM_SPARSE);
        let mut total = 0;
        loop {
            out.clear();
            match reader.next_batch(&mut out, 1000)? {
                0 => return Ok(total),
                n => total += n,
            }
        }
    }

    /// Line starts and (file, line number) of every good line of one epoch of `reader`.
    fn epoch_lines(reader: &mut CriteoReader) -> (Vec<u64>, Vec<(usize, u64)>) {
        reader.record_line_starts();
        reader.record_positions();
        read_all(reader).unwrap();
        let positions = reader.take_positions().into_iter().map(|p| (p.file, p.position)).collect();
        (reader.take_line_starts(), positions)
    }

    fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
        v.sort_unstable();
        v
    }

    /// A UTF-8 byte order mark at byte 0 is no part of the first line: the first Criteo record
    /// parses, an Avazu header is still a header; one later in the file is data.
    #[test]
    fn a_byte_order_mark_at_the_start_of_a_file_is_stripped() {
        let dir = tempfile::tempdir().unwrap();
        let criteo = dir.path().join("bom.txt");
        let text = format!("\u{feff}{}\n{}\n", line(0), line(1));
        assert!(text.as_bytes().starts_with(UTF8_BOM));
        std::fs::write(&criteo, &text).unwrap();
        for workers in [1, 2] {
            let total: usize = (0..workers).map(|w| read_all(&mut open(&criteo, workers, w)).unwrap()).sum();
            assert_eq!(total, 2, "{workers} workers");
        }
        let mut reader = open(&criteo, 1, 0);
        read_all(&mut reader).unwrap();
        assert_eq!(reader.bad_counts().total(), 0);
        // Elsewhere the bytes are data: a BOM at the start of a later line makes it bad.
        std::fs::write(&criteo, format!("{}\n\u{feff}{}\n", line(0), line(1))).unwrap();
        let mut reader = open(&criteo, 1, 0);
        assert_eq!(read_all(&mut reader).unwrap(), 1);
        assert_eq!(reader.bad_counts().total(), 1);

        let avazu = dir.path().join("bom.csv");
        let row = "1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,\
                   a99f214a,ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79";
        let header = "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,\
                      device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21";
        std::fs::write(&avazu, format!("\u{feff}{header}\r\n{row}\r\n")).unwrap();
        let format = crate::avazu::AvazuFormat::new(vec![1000; crate::avazu::NUM_SPARSE], 1).unwrap();
        let mut reader = LineReader::open_format(
            std::slice::from_ref(&avazu),
            (0.0, 1.0),
            0,
            1,
            format,
            ReaderOptions::default(),
            None,
        )
        .unwrap();
        let mut out = Batch::new(crate::avazu::NUM_DENSE, crate::avazu::NUM_SPARSE);
        assert_eq!(reader.next_batch(&mut out, 10).unwrap(), 1);
        assert_eq!(reader.bad_counts().total(), 0, "the header is no bad record");
    }

    #[test]
    fn a_shuffled_epoch_reads_every_line_once_in_another_order() {
        let dir = tempfile::tempdir().unwrap();
        // Three files, one empty, with CRLF, empty and bad lines (whose line numbers count).
        let (mut paths, mut good) = (Vec::new(), 0);
        for (f, count) in [(0, 700), (1, 0), (2, 1300)] {
            let mut text = String::new();
            for i in 0..count {
                match i % 97 {
                    13 => text.push_str("not a criteo line\n"),
                    14 => text.push('\n'),
                    _ => {
                        text.push_str(&(line(f * 10_000 + i) + if i % 5 == 0 { "\r\n" } else { "\n" }));
                        good += 1;
                    }
                }
            }
            let path = dir.path().join(format!("part-{f}.txt"));
            std::fs::write(&path, text).unwrap();
            paths.push(path);
        }
        let config = || CriteoConfig::new(CriteoFeatures::uniform(1000, 3));
        let open = |w, workers| CriteoReader::open(&paths, w, workers, config(), None).unwrap();
        let shuffle = BlockShuffle::new(11, Some(4096)).unwrap();
        for workers in 1..=3 {
            let mut all = Vec::new();
            for w in 0..workers {
                let mut plain = open(w, workers);
                let (starts, positions) = epoch_lines(&mut plain);
                plain.rewind();
                assert_eq!(epoch_lines(&mut plain), (starts.clone(), positions.clone()), "unshuffled epochs repeat");
                let mut shuffled = open(w, workers).with_shuffle(Some(shuffle));
                assert_eq!(epoch_lines(&mut shuffled), (starts.clone(), positions.clone()), "epoch 0 is file order");
                let mut previous = starts.clone();
                for epoch in 1..=2 {
                    shuffled.rewind();
                    assert_eq!(shuffled.epoch(), epoch);
                    let (s, p) = epoch_lines(&mut shuffled);
                    assert_ne!(s, previous, "{workers} workers, worker {w}, epoch {epoch}: another order");
                    assert_eq!(sorted(s.clone()), starts, "every line once, {workers} workers, worker {w}");
                    assert_eq!(sorted(p), sorted(positions.clone()), "the same line numbers");
                    previous = s;
                }
                assert_eq!(shuffled.bytes_read(), shuffled.bytes_total(), "progress ends at the total");
                all.extend(starts);
            }
            assert_eq!(all.len(), good, "{workers} workers read every good line");
            assert_eq!(sorted(all.clone()).windows(2).filter(|p| p[0] == p[1]).count(), 0, "once");
        }
    }

    #[test]
    fn file_alignment_matches_the_slice_oracle() {
        let dir = tempfile::tempdir().unwrap();
        let data = b"ab\ncd\n\nef\r\nlonger line\n\n\nz";
        let path = dir.path().join("a.txt");
        std::fs::write(&path, data).unwrap();
        let (info, file) = FileInfo::open(&path).unwrap();
        let source = Source { info: &info, file: &file };
        let mut scratch = Vec::new();
        for pos in 0..=data.len() + 2 {
            assert_eq!(source.align_to_line(pos, &mut scratch).unwrap(), align_to_line(data, pos), "at {pos}");
        }
        let mut known = BTreeMap::new();
        for pos in [9, 3, data.len(), 0, 12] {
            let want = count_newlines(&data[..pos]);
            assert_eq!(source.newlines_before(pos, &mut known, &mut scratch).unwrap(), want, "before {pos}");
        }
    }

    #[test]
    fn lines_across_window_refills_and_an_over_long_line_spanning_windows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.txt");
        let mut text = String::new();
        let mut n = 0;
        // About 3.5 windows of lines, one over-long line of 2.5 windows in the middle, CRLF on some.
        while text.len() < WINDOW_BYTES * 3 / 2 {
            text.push_str(&line(n));
            text.push_str(if n % 3 == 0 { "\r\n" } else { "\n" });
            n += 1;
        }
        let long_line_no = n + 1;
        text.push_str(&"7".repeat(WINDOW_BYTES * 5 / 2));
        text.push('\n');
        let mut after = 0;
        while text.len() < WINDOW_BYTES * 7 / 2 {
            text.push_str(&line(n + after));
            text.push('\n');
            after += 1;
        }
        std::fs::write(&path, &text).unwrap();
        for workers in [1, 3] {
            let mut total = 0;
            let mut bad = Vec::new();
            for w in 0..workers {
                let mut reader = open(&path, workers, w);
                total += read_all(&mut reader).unwrap();
                bad.extend(reader.bad_counts().by_reason.clone());
            }
            assert_eq!(total, n + after, "{workers} workers read every good line once");
            assert_eq!(bad, vec![("too_long".to_string(), 1)], "{workers} workers");
        }
        // The over-long line's record: its line number and its head.
        let config = CriteoConfig::new(CriteoFeatures::uniform(1000, 3));
        let reader = CriteoReader::open(
            std::slice::from_ref(&path),
            0,
            1,
            CriteoConfig { policy: BadRecordPolicy::Fail, ..config },
            None,
        );
        match read_all(&mut reader.unwrap()) {
            Err(SourceError::BadRecord(r)) => {
                assert_eq!((r.line, r.reason, r.raw.len()), (long_line_no as u64, BadReason::TooLong, MAX_RAW_BYTES));
            }
            other => panic!("expected the over-long line, got {other:?}"),
        }
    }

    #[test]
    fn a_file_truncated_or_rewritten_while_read_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("input.txt");
        let text: String = (0..40_000).map(|i| line(i) + "\n").collect();
        assert!(text.len() > 4 * WINDOW_BYTES);
        std::fs::write(&path, &text).unwrap();
        let mut out = Batch::new(NUM_DENSE, NUM_SPARSE);

        // Truncated after the first window was read.
        let mut reader = open(&path, 1, 0);
        assert_eq!(reader.next_batch(&mut out, 100).unwrap(), 100);
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(WINDOW_BYTES as u64 / 2).unwrap();
        let e = read_all(&mut reader).unwrap_err();
        assert!(matches!(e, SourceError::Changed { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("input.txt") && msg.contains("changed while being read"), "{msg}");

        // Rewritten in place with the same length: the modification time gives it away.
        std::fs::write(&path, &text).unwrap();
        let mut reader = open(&path, 1, 0);
        assert_eq!(reader.next_batch(&mut out, 100).unwrap(), 100);
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, b"1", 0).unwrap();
        file.set_modified(SystemTime::now() + std::time::Duration::from_secs(5)).unwrap();
        let msg = read_all(&mut reader).unwrap_err().to_string();
        assert!(msg.contains("input.txt") && msg.contains("modified"), "{msg}");

        // Appended to: a change as well (an input must stay as it was while it is read).
        std::fs::write(&path, &text).unwrap();
        let mut reader = open(&path, 1, 0);
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        std::io::Write::write_all(&mut f, line(7).as_bytes()).unwrap();
        let e = read_all(&mut reader).unwrap_err().to_string();
        assert!(e.contains("modified"), "an append changes the file too: {e}");
    }

    /// Descriptors this process holds open on files under `dir` (`None` without `/proc`).
    fn open_under(dir: &Path) -> Option<usize> {
        let fds = std::fs::read_dir("/proc/self/fd").ok()?;
        Some(fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok()).filter(|t| t.starts_with(dir)).count())
    }

    /// Writes `count` one-line Criteo files `part-NNNNN` into `dir`; returns their paths.
    fn part_files(dir: &Path, count: usize) -> Vec<PathBuf> {
        let path = |i: usize| dir.join(format!("part-{i:05}"));
        (0..count).map(|i| std::fs::write(path(i), line(i) + "\n").map(|()| path(i)).unwrap()).collect()
    }

    /// A directory of 300 part files read by up to 3 workers (a process would need a
    /// descriptor per file and reader if readers kept their files open): each reader
    /// holds at most one of them open, at any point of a plain or a shuffled epoch,
    /// and the workers read every line exactly once per epoch.
    #[test]
    fn a_reader_holds_one_input_file_open_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let paths = part_files(&root, 300);
        let Some(before) = open_under(&root) else { return };
        assert_eq!(before, 0);
        let sizes: Vec<u64> = paths.iter().map(|p| std::fs::metadata(p).unwrap().len()).collect();
        let want: Vec<u64> = sizes.iter().scan(0, |at, &len| Some(std::mem::replace(at, *at + len))).collect();
        let shuffle = BlockShuffle::new(5, Some(4096)).unwrap();
        let config = || CriteoConfig::new(CriteoFeatures::uniform(1000, 3));
        for workers in 1..=3 {
            let mut readers: Vec<CriteoReader> = (0..workers)
                .map(|w| CriteoReader::open(&paths, w, workers, config(), None).unwrap().with_shuffle(Some(shuffle)))
                .collect();
            assert_eq!(open_under(&root), Some(0), "opening a reader leaves no file open");
            for epoch in 0..3 {
                let mut starts = Vec::new();
                let mut out = Batch::new(NUM_DENSE, NUM_SPARSE);
                for reader in &mut readers {
                    reader.record_line_starts();
                    while reader.next_batch(&mut out, 1).unwrap() > 0 {
                        let open = open_under(&root).unwrap();
                        assert!(open <= workers, "{workers} readers hold {open} files open (epoch {epoch})");
                    }
                    starts.extend(reader.take_line_starts());
                    reader.rewind();
                }
                assert_eq!(open_under(&root), Some(0), "a finished epoch leaves no file open");
                assert_eq!(sorted(starts), want, "{workers} workers, epoch {epoch}: every line once");
            }
        }
    }

    /// A file is reopened for each of its ranges: removed, replaced under its name (same
    /// length and modification time) or appended to since it was first opened is an error
    /// naming it, as a change under an open handle is.
    #[test]
    fn a_file_changed_while_closed_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let paths = part_files(dir.path(), 3);
        let open = || CriteoReader::open(&paths, 0, 1, CriteoConfig::new(CriteoFeatures::uniform(1000, 3)), None);
        let text = std::fs::read(&paths[1]).unwrap();
        // Every version of the file gets this modification time.
        let modified = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let replace = |with: &[u8]| {
            let tmp = dir.path().join("tmp");
            std::fs::write(&tmp, with).unwrap();
            std::fs::File::options().write(true).open(&tmp).unwrap().set_modified(modified).unwrap();
            std::fs::rename(&tmp, &paths[1]).unwrap();
        };
        let other: Vec<u8> = text.iter().map(|&b| if b == b'0' { b'1' } else { b }).collect();
        for what in ["removed", "replaced", "modified"] {
            replace(&text);
            let mut reader = open().unwrap();
            match what {
                "removed" => std::fs::remove_file(&paths[1]).unwrap(),
                "replaced" => replace(&other),
                _ => {
                    let mut f = std::fs::OpenOptions::new().append(true).open(&paths[1]).unwrap();
                    std::io::Write::write_all(&mut f, b"1\n").unwrap();
                }
            }
            let e = read_all(&mut reader).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, SourceError::Changed { .. }), "{what}: {msg}");
            assert!(msg.contains("part-00001") && msg.contains(what), "{what}: {msg}");
        }
    }
}
