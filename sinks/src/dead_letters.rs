//! Dead-letter files: malformed input records, one per line.
//!
//! Each [`BadRecord`] becomes one line of six TAB-separated columns:
//!
//! ```text
//! source \t line \t byte_offset \t reason \t field \t raw
//! ```
//!
//! `reason` is [`BadReason::name`](tiderec_operators::bad_record::BadReason::name),
//! `field` the 0-based field index or `-`, and `source` and `raw` are escaped
//! with [`escape`] (`\t`, `\n`, `\r`, `\\` and every byte outside printable
//! ASCII as `\xNN`), so the file always holds exactly one record per line and
//! [`unescape`] gives the original bytes back.
//!
//! [`FileDeadLetters`] creates its file lazily, when the first record arrives:
//! a run without bad records leaves no file behind, and
//! [`FileDeadLetters::remove_unwritten`] removes one an earlier run left at its path
//! for a command whose file lists only its last run's records. [`SharedDeadLetters`]
//! lets the worker threads of one process write to the same sink.

use crate::error::SinkError;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use tiderec_operators::bad_record::{BadRecord, DeadLetterSink};

/// Appends `bytes` to `out`, escaping `\t`, `\n`, `\r`, `\\` as two-character
/// sequences and any other byte outside `0x20..=0x7e` as `\xNN` (lowercase hex).
pub fn escape(bytes: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        match b {
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x20..=0x7e => out.push(b),
            _ => out.extend_from_slice(&[b'\\', b'x', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]),
        }
    }
}

/// Inverse of [`escape`]; `None` on a malformed escape sequence.
pub fn unescape(bytes: &[u8]) -> Option<Vec<u8>> {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        match bytes.get(i + 1)? {
            b't' => out.push(b'\t'),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b'\\' => out.push(b'\\'),
            b'x' => {
                let hi = hex(*bytes.get(i + 2)?)?;
                let lo = hex(*bytes.get(i + 3)?)?;
                out.push(hi << 4 | lo);
                i += 2;
            }
            _ => return None,
        }
        i += 2;
    }
    Some(out)
}

/// Appends the dead-letter line of `record` (with its final `\n`) to `out`.
pub fn format_record(record: &BadRecord, out: &mut Vec<u8>) {
    escape(record.source.as_bytes(), out);
    let field = record.field.map_or_else(|| "-".to_string(), |f| f.to_string());
    // Writing into a Vec cannot fail.
    let _ = write!(out, "\t{}\t{}\t{}\t{}\t", record.line, record.byte_offset, record.reason.name(), field);
    escape(&record.raw, out);
    out.push(b'\n');
}

/// A dead-letter file, created (truncating any previous one, unless
/// [`FileDeadLetters::never_replacing`]) when the first record arrives, or continued from a
/// checkpoint's length of it ([`FileDeadLetters::continue_at`]). Buffered: call
/// [`DeadLetterSink::flush`] to make the records durable; dropping the sink flushes the
/// buffer but not to disk.
#[derive(Debug)]
pub struct FileDeadLetters {
    path: PathBuf,
    writer: Option<BufWriter<File>>,
    written: u64,
    /// The file's length once the buffer is written: bytes kept plus lines written.
    len: u64,
    line: Vec<u8>,
    /// Whether the first record may replace a file found at `path`.
    replace: bool,
}

impl FileDeadLetters {
    /// A sink writing to `path`; nothing is created until the first record.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileDeadLetters { path: path.into(), writer: None, written: 0, len: 0, line: Vec::new(), replace: true }
    }

    /// This sink, creating its file only where none is: when a file is at the path as the
    /// first record arrives (one made after the caller checked), that record's write fails
    /// with [`io::ErrorKind::AlreadyExists`], naming the path, and the file is left as it is.
    pub fn never_replacing(self) -> Self {
        FileDeadLetters { replace: false, ..self }
    }

    /// Removes the file at the path when this sink has created none: one an earlier run left
    /// there, which lists other records than this run's. Only a regular file is removed (not
    /// a device, a pipe or a symbolic link). Returns whether a file was removed.
    pub fn remove_unwritten(&self) -> Result<bool, SinkError> {
        let named = |source| SinkError::Io { path: self.path.display().to_string(), source };
        if self.writer.is_some() {
            return Ok(false);
        }
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if m.is_file() => match std::fs::remove_file(&self.path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(named(e)),
            },
            Ok(_) => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(named(e)),
        }
    }

    /// Continues the file of an interrupted run whose checkpoint found it `kept` bytes
    /// long: those bytes (the records dead-lettered before the checkpoint) stay, anything
    /// after them (records after it, which the resumed run reads again) is cut, and new
    /// records are appended. A file shorter than `kept`, or missing, was changed since:
    /// it is continued as it is, and the returned warning says so. Call before any write.
    /// With `kept` 0 no file is created: one that is there is emptied, and the first
    /// record creates it as usual.
    pub fn continue_at(&mut self, kept: u64) -> Result<Option<String>, SinkError> {
        let named = |source| SinkError::Io { path: self.path.display().to_string(), source };
        if kept == 0 {
            // Only a regular file is emptied (not a device, a pipe or a missing link target).
            if std::fs::metadata(&self.path).is_ok_and(|m| m.is_file()) {
                OpenOptions::new().write(true).open(&self.path).and_then(|f| f.set_len(0)).map_err(named)?;
            }
            return Ok(None);
        }
        let file = OpenOptions::new().write(true).create(true).truncate(false).open(&self.path).map_err(named)?;
        let found = file.metadata().map_err(named)?.len();
        let warning = if found < kept {
            self.len = found;
            Some(format!(
                "the dead-letter file {} holds {found} bytes, the checkpoint counted {kept}: it was changed since; \
                 new records are appended to it",
                self.path.display()
            ))
        } else {
            file.set_len(kept).map_err(named)?;
            self.len = kept;
            None
        };
        let mut writer = BufWriter::new(file);
        writer.seek(SeekFrom::Start(self.len)).map_err(named)?;
        self.writer = Some(writer);
        Ok(warning)
    }

    /// Makes every record written so far durable and returns the file's length
    /// (0 while no file was created): what a checkpoint records.
    pub fn durable_len(&mut self) -> Result<u64, SinkError> {
        self.finish()?;
        Ok(self.len)
    }

    /// The file this sink writes to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of records written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// True once the file has been created.
    pub fn is_created(&self) -> bool {
        self.writer.is_some()
    }

    /// Flushes and syncs the file, reporting failure as a [`SinkError`] naming it.
    pub fn finish(&mut self) -> Result<(), SinkError> {
        DeadLetterSink::flush(self).map_err(|source| SinkError::Io { path: self.path.display().to_string(), source })
    }

    fn named(&self, e: io::Error) -> io::Error {
        io::Error::new(e.kind(), format!("{}: {e}", self.path.display()))
    }
}

impl DeadLetterSink for FileDeadLetters {
    fn write(&mut self, record: &BadRecord) -> io::Result<()> {
        if self.writer.is_none() {
            let mut options = OpenOptions::new();
            options.write(true);
            if self.replace {
                options.create(true).truncate(true);
            } else {
                options.create_new(true);
            }
            let file = options.open(&self.path).map_err(|e| self.named(e))?;
            self.writer = Some(BufWriter::new(file));
        }
        self.line.clear();
        format_record(record, &mut self.line);
        let result = self.writer.as_mut().expect("created above").write_all(&self.line);
        result.map_err(|e| self.named(e))?;
        self.written += 1;
        self.len += self.line.len() as u64;
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        if let Some(w) = self.writer.as_mut() {
            let result = w.flush().and_then(|()| w.get_ref().sync_data());
            result.map_err(|e| self.named(e))?;
        }
        Ok(())
    }
}

/// A dead-letter sink shared by the worker threads of one process: a cheap
/// [`Clone`] handle on one `Arc<Mutex<S>>`, itself a [`DeadLetterSink`].
/// Each record is written under the lock, so lines never interleave.
#[derive(Debug)]
pub struct SharedDeadLetters<S: DeadLetterSink = FileDeadLetters> {
    inner: Arc<Mutex<S>>,
}

impl<S: DeadLetterSink> Clone for SharedDeadLetters<S> {
    fn clone(&self) -> Self {
        SharedDeadLetters { inner: Arc::clone(&self.inner) }
    }
}

impl<S: DeadLetterSink> SharedDeadLetters<S> {
    /// Shares `sink`.
    pub fn new(sink: S) -> Self {
        SharedDeadLetters { inner: Arc::new(Mutex::new(sink)) }
    }

    /// Locks the shared sink (e.g. to inspect it). A panic of another holder
    /// does not make the sink unusable.
    pub fn lock(&self) -> MutexGuard<'_, S> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl SharedDeadLetters<FileDeadLetters> {
    /// A shared [`FileDeadLetters`] writing to `path` (created lazily).
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self::new(FileDeadLetters::new(path))
    }
}

impl<S: DeadLetterSink> DeadLetterSink for SharedDeadLetters<S> {
    fn write(&mut self, record: &BadRecord) -> io::Result<()> {
        self.lock().write(record)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.lock().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiderec_operators::bad_record::BadReason;

    fn record(line: u64, raw: &[u8]) -> BadRecord {
        BadRecord {
            source: "dir/train\t1.txt".into(),
            line,
            byte_offset: line * 100,
            reason: BadReason::BadHex,
            field: if line & 1 == 0 { Some(17) } else { None },
            raw: raw.to_vec(),
        }
    }

    #[test]
    fn escape_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255u8).collect();
        let mut e = Vec::new();
        escape(&all, &mut e);
        assert!(e.iter().all(|&b| (0x20..=0x7e).contains(&b)));
        assert_eq!(unescape(&e).unwrap(), all);
        assert_eq!(unescape(b"a\\"), None);
        assert_eq!(unescape(b"\\q"), None);
        assert_eq!(unescape(b"\\x4"), None);
    }

    /// A continued file keeps the checkpoint's bytes, drops what came after them and
    /// appends; its durable length counts both. A file shorter than the checkpoint's
    /// count is continued as it is, with a warning.
    #[test]
    fn a_continued_file_keeps_the_checkpoints_bytes_and_appends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dead.tsv");
        let mut first = FileDeadLetters::new(&path);
        assert_eq!(first.durable_len().unwrap(), 0);
        first.write(&record(1, b"one")).unwrap();
        let kept = first.durable_len().unwrap();
        assert_eq!(kept, std::fs::metadata(&path).unwrap().len());
        first.write(&record(2, b"after the checkpoint")).unwrap();
        first.finish().unwrap();
        let mut again = FileDeadLetters::new(&path);
        assert_eq!(again.continue_at(kept).unwrap(), None);
        again.write(&record(2, b"read again")).unwrap();
        let len = again.durable_len().unwrap();
        let text = String::from_utf8(std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(len, text.len() as u64);
        let raws: Vec<&str> = text.lines().map(|l| l.rsplit('\t').next().unwrap()).collect();
        assert_eq!(raws, ["one", "read again"]);
        let mut changed = FileDeadLetters::new(&path);
        let warning = changed.continue_at(len + 10).unwrap().expect("a warning");
        assert!(warning.contains("changed since"), "{warning}");
        changed.write(&record(3, b"three")).unwrap();
        assert_eq!(changed.durable_len().unwrap(), std::fs::metadata(&path).unwrap().len());
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 3, "nothing cut");
        // A checkpoint that counted none: what came after it goes, and no file is made.
        assert_eq!(FileDeadLetters::new(&path).continue_at(0).unwrap(), None);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        let missing = dir.path().join("missing.tsv");
        let mut none = FileDeadLetters::new(&missing);
        assert_eq!(none.continue_at(0).unwrap(), None);
        assert_eq!(none.durable_len().unwrap(), 0);
        assert!(!missing.exists());
    }

    #[test]
    fn file_is_lazy_and_one_line_per_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dead.tsv");
        let mut sink = FileDeadLetters::new(&path);
        sink.flush().unwrap();
        assert!(!path.exists(), "no record, no file");
        assert!(!sink.is_created());
        let raws: [&[u8]; 3] = [b"1\t2\tzz\r", b"line\nbreak\\", &[0, 0xff, b'a']];
        for (i, raw) in raws.iter().enumerate() {
            sink.write(&record(i as u64 + 1, raw)).unwrap();
        }
        sink.finish().unwrap();
        assert_eq!(sink.written(), 3);
        let text = std::fs::read(&path).unwrap();
        let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 3);
        for (i, l) in lines.iter().enumerate() {
            let cols: Vec<&[u8]> = l.split(|&b| b == b'\t').collect();
            assert_eq!(cols.len(), 6);
            assert_eq!(unescape(cols[0]).unwrap(), b"dir/train\t1.txt");
            assert_eq!(cols[1], (i + 1).to_string().as_bytes());
            assert_eq!(cols[2], ((i + 1) * 100).to_string().as_bytes());
            assert_eq!(cols[3], b"bad_hex");
            assert_eq!(cols[4], if i % 2 == 1 { &b"17"[..] } else { &b"-"[..] });
            assert_eq!(unescape(cols[5]).unwrap(), raws[i]);
        }
        assert_eq!(lines[0], &b"dir/train\\t1.txt\t1\t100\tbad_hex\t-\t1\\t2\\tzz\\r"[..]);
    }

    #[test]
    fn shared_across_threads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dead.tsv");
        let shared = SharedDeadLetters::file(&path);
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let mut sink = shared.clone();
                std::thread::spawn(move || {
                    for i in 0..250 {
                        sink.write(&record(t * 1000 + i, b"x\ty")).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let mut sink = shared.clone();
        sink.flush().unwrap();
        assert_eq!(shared.lock().written(), 1000);
        let text = std::fs::read_to_string(&path).unwrap();
        let mut nums: Vec<u64> = text.lines().map(|l| l.split('\t').nth(1).unwrap().parse().unwrap()).collect();
        assert_eq!(nums.len(), 1000);
        nums.sort_unstable();
        nums.dedup();
        assert_eq!(nums.len(), 1000);
    }

    /// A sink that wrote nothing removes the file an earlier run left at its path (a regular
    /// file only); one that wrote keeps its own. A never-replacing sink refuses a file found
    /// at its first record and leaves it as it is.
    #[test]
    fn an_earlier_runs_file_is_removed_or_kept_as_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dead.tsv");
        std::fs::write(&path, "an earlier run's record\n").unwrap();
        let mut own = FileDeadLetters::new(&path);
        own.write(&record(1, b"this run's")).unwrap();
        own.finish().unwrap();
        assert!(!own.remove_unwritten().unwrap(), "a file this sink wrote stays");
        assert!(std::fs::read_to_string(&path).unwrap().contains("this run's"));
        let clean = FileDeadLetters::new(&path);
        assert!(clean.remove_unwritten().unwrap());
        assert!(!path.exists(), "the earlier run's file is gone");
        assert!(!clean.remove_unwritten().unwrap(), "nothing to remove");
        #[cfg(unix)]
        {
            let target = dir.path().join("target.tsv");
            std::fs::write(&target, "kept\n").unwrap();
            std::os::unix::fs::symlink(&target, &path).unwrap();
            assert!(!FileDeadLetters::new(&path).remove_unwritten().unwrap(), "a link is no file of a run");
            assert!(std::fs::symlink_metadata(&path).is_ok());
            std::fs::remove_file(&path).unwrap();
        }
        std::fs::write(&path, "the user's file\n").unwrap();
        let mut refusing = FileDeadLetters::new(&path).never_replacing();
        let e = refusing.write(&record(2, b"x")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert!(e.to_string().contains("dead.tsv"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "the user's file\n");
        std::fs::remove_file(&path).unwrap();
        let mut fresh = FileDeadLetters::new(&path).never_replacing();
        fresh.write(&record(3, b"y")).unwrap();
        fresh.write(&record(4, b"z")).unwrap();
        fresh.finish().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
    }

    #[test]
    fn unwritable_path_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("dead.tsv");
        let mut sink = FileDeadLetters::new(&path);
        let err = sink.write(&record(1, b"x")).unwrap_err();
        assert!(err.to_string().contains("missing-dir"), "{err}");
    }
}
