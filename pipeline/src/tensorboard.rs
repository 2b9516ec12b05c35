//! TensorBoard event files (`--tensorboard DIR`): every line of the metrics log as scalars.
//!
//! An event file is a sequence of records, each `length` (u64, little-endian), the masked
//! CRC-32C of those 8 bytes, `length` bytes of a serialized `tensorflow.Event` protocol
//! buffer and their masked CRC-32C. The first event names the file version
//! (`brain.Event:2`); each later one holds one step's scalar summaries (`tag`,
//! `simple_value`). The messages are written field by field here: three message types of
//! a few scalar fields do not need a code generator.
//!
//! Invariants:
//! * Each run writes a file of its own, `events.out.tfevents.<seconds>.<host>.<pid>.<n>.tiderec`,
//!   created new in `DIR` (made if missing): a fresh run overwrites nothing of an earlier
//!   run, a resumed one only cuts their events after its checkpoint (below), and
//!   TensorBoard shows a resumed run's events after the interrupted run's.
//! * Every event is flushed when written, so a reader sees each complete record of a run
//!   still in progress.
//! * A resumed run repeats no `(tag, step)` of the runs it continues. A run resumed from the
//!   checkpoint of step `S` first removes the events of steps after `S` from the event files
//!   of earlier runs in `DIR` (what the interrupted run logged after its checkpoint is done,
//!   and logged, again), as the metrics log is cut ([`EventFile::resume`], [`cut_after`]).
//!   Only the files named as this module names them, directly in `DIR`, are read; one is
//!   rewritten whole beside itself, under a name without `tfevents` (which TensorBoard
//!   never reads), synced and renamed over itself, so a reader sees the file as it was or
//!   as it is cut, never a part of it. Records that cannot be read as events are kept
//!   as they are.

mod cut;
mod read;

pub use cut::{cut_after, is_event_file_name, Cut};
pub use read::{read_events, Event};

use crate::error::DataflowFailure;
use crate::PipelineError;
use std::io::Write;
use std::path::{Path, PathBuf};

/// An event file being written.
pub struct EventFile {
    file: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
}

impl EventFile {
    /// Creates a new event file in `dir` (made if missing) and writes its version event.
    pub fn create(dir: &Path) -> Result<Self, PipelineError> {
        let error = |what: &str, e: std::io::Error| {
            PipelineError::config("tensorboard", format!("cannot {what} {}: {e}", dir.display()))
        };
        std::fs::create_dir_all(dir).map_err(|e| error("create", e))?;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let host: String = host.trim().chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
        static FILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let name = format!(
            "events.out.tfevents.{}.{}.{}.{}.tiderec",
            now.as_secs(),
            if host.is_empty() { "localhost" } else { &host },
            std::process::id(),
            FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let path = dir.join(name);
        let file =
            std::fs::OpenOptions::new().write(true).create_new(true).open(&path).map_err(|e| error("write in", e))?;
        let mut events = EventFile { file: std::io::BufWriter::new(file), path };
        let mut version = Vec::new();
        put_double(&mut version, 1, wall_time());
        put_bytes(&mut version, 3, b"brain.Event:2");
        events.write_record(&version)?;
        Ok(events)
    }

    /// [`EventFile::create`] for a run resumed from the checkpoint of step `step`: the events
    /// of later steps are first removed from the event files of earlier runs in `dir`
    /// ([`cut_after`]), which the resumed run then writes again in its own file.
    pub fn resume(dir: &Path, step: u64) -> Result<Self, PipelineError> {
        let cut = cut_after(dir, step)?;
        if cut.dropped > 0 {
            eprintln!(
                "tensorboard {}: removed {} event(s) after step {step} from {} file(s), which the resumed run \
                 writes again",
                dir.display(),
                cut.dropped,
                cut.files
            );
        }
        for (path, at) in &cut.unframed {
            eprintln!(
                "warning: tensorboard {}: no record can be read from byte {at} on; kept as it is",
                path.display()
            );
        }
        Self::create(dir)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one event of `scalars` (tag, value) at `step`; non-finite values are left out.
    pub fn scalars(&mut self, step: u64, scalars: &[(&str, f64)]) -> Result<(), PipelineError> {
        let mut summary = Vec::new();
        for &(tag, value) in scalars.iter().filter(|(_, v)| v.is_finite()) {
            let mut v = Vec::new();
            put_bytes(&mut v, 1, tag.as_bytes());
            put_float(&mut v, 2, value as f32);
            put_bytes(&mut summary, 1, &v);
        }
        let mut event = Vec::new();
        put_double(&mut event, 1, wall_time());
        put_varint_field(&mut event, 2, step);
        put_bytes(&mut event, 5, &summary);
        self.write_record(&event)
    }

    /// Frames `data` as a record and flushes it.
    fn write_record(&mut self, data: &[u8]) -> Result<(), PipelineError> {
        let len = (data.len() as u64).to_le_bytes();
        let mut record = Vec::with_capacity(data.len() + 16);
        record.extend_from_slice(&len);
        record.extend_from_slice(&masked_crc(&len).to_le_bytes());
        record.extend_from_slice(data);
        record.extend_from_slice(&masked_crc(data).to_le_bytes());
        self.file.write_all(&record).and_then(|_| self.file.flush()).map_err(|e| {
            PipelineError::dataflow(
                DataflowFailure::Output,
                format!("cannot write the TensorBoard events {}", self.path.display()),
            )
            .with_source(e)
        })
    }
}

/// Seconds since the epoch, as events carry them.
fn wall_time() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The CRC-32C of `data`, masked as TFRecord framing does (so that a CRC of CRCs differs).
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// A base-128 varint.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Field `field` as a varint (wire type 0).
fn put_varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    put_varint(out, u64::from(field) << 3);
    put_varint(out, v);
}

/// Field `field` as a little-endian double (wire type 1).
fn put_double(out: &mut Vec<u8>, field: u32, v: f64) {
    put_varint(out, u64::from(field) << 3 | 1);
    out.extend_from_slice(&v.to_le_bytes());
}

/// Field `field` as length-delimited bytes: a string or a message (wire type 2).
fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_varint(out, u64::from(field) << 3 | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Field `field` as a little-endian float (wire type 5).
fn put_float(out: &mut Vec<u8>, field: u32, v: f32) {
    put_varint(out, u64::from(field) << 3 | 5);
    out.extend_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::read::{Framed, Records};
    use super::*;

    #[test]
    fn varints_fields_and_the_crc_mask_are_the_protocols() {
        let mut v = Vec::new();
        put_varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02], "the protocol buffers documentation's example");
        let mut f = Vec::new();
        put_varint_field(&mut f, 2, 150);
        assert_eq!(f, [0x10, 0x96, 0x01]);
        let mut s = Vec::new();
        put_bytes(&mut s, 1, b"testing");
        assert_eq!(s, [0x0a, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g']);
        // CRC-32C check value of "123456789" is 0xE3069283 (RFC 3720), masked as TFRecord does.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xe306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8));
    }

    #[test]
    fn a_file_is_framed_records_and_never_replaces_another() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = EventFile::create(&dir.path().join("tb")).unwrap();
        a.scalars(3, &[("train/loss", 0.5), ("eval/auc", f64::NAN)]).unwrap();
        let bytes = std::fs::read(a.path()).unwrap();
        let mut at = 0;
        let mut records = 0;
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            assert_eq!(u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()), masked_crc(&bytes[at..at + 8]));
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc(data));
            at += 16 + len;
            records += 1;
        }
        assert_eq!(records, 2);
        assert!(bytes.windows(10).any(|w| w == b"train/loss"));
        assert!(!bytes.windows(8).any(|w| w == b"eval/auc"), "a NaN is left out");
        let b = EventFile::create(&dir.path().join("tb")).unwrap();
        assert_ne!(a.path(), b.path(), "the same second and process still get two files");
        assert!(is_event_file_name(&a.path().file_name().unwrap().to_string_lossy()));
        let events = read_events(a.path()).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        assert_eq!((events[1].step, &events[1].scalars[..]), (3, &[("train/loss".to_string(), 0.5f32)][..]));
    }

    #[test]
    fn event_file_names_are_this_modules_only() {
        assert!(is_event_file_name("events.out.tfevents.1700000000.my-host.42.0.tiderec"));
        for name in [
            "events.out.tfevents.1700000000.my-host.42.0",
            "events.out.tfevents.1700000000.my-host.42.0.tiderec.tmp-7",
            "events.out.tfevents.1700000000.my.host.42.0.tiderec",
            "events.out.tfevents.x.my-host.42.0.tiderec",
            ".cut-7-1700000000.my-host.42.0.tiderec",
            "notes.txt",
        ] {
            assert!(!is_event_file_name(name), "{name}");
        }
    }

    /// Every (step, tag, value) of the event files in `dir` (not links), file by file in name order.
    fn scalars_in(dir: &Path) -> Vec<(u64, String, f32)> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_file())
            .map(|e| e.file_name().into_string().unwrap())
            .filter(|n| is_event_file_name(n))
            .collect();
        names.sort();
        names
            .iter()
            .flat_map(|n| read_events(&dir.join(n)).unwrap())
            .flat_map(|e| e.scalars.into_iter().map(move |(tag, v)| (e.step, tag, v)))
            .collect()
    }

    #[test]
    fn a_resumed_run_removes_the_later_events_of_earlier_files_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let tb = dir.path().join("tb");
        // A first run logs steps 1 to 8; its checkpoint is of step 5.
        let mut first = EventFile::create(&tb).unwrap();
        for step in 1..=8 {
            first.scalars(step, &[("train/loss", step as f64 / 10.0), ("train/samples", step as f64)]).unwrap();
        }
        // It was killed in the middle of a record.
        let mut tail = std::fs::read(first.path()).unwrap()[16..30].to_vec();
        tail[..8].copy_from_slice(&100u64.to_le_bytes());
        let crc = masked_crc(&tail[..8]);
        tail[8..12].copy_from_slice(&crc.to_le_bytes());
        std::fs::OpenOptions::new().append(true).open(first.path()).unwrap().write_all(&tail).unwrap();
        let first_path = first.path().to_path_buf();
        drop(first);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&first_path, std::fs::Permissions::from_mode(0o640)).unwrap();
        }
        let before = read_events(&first_path).unwrap();
        assert_eq!(before.len(), 9);
        // Files that are not this module's event files, with the same records, stay as they are.
        let foreign = [tb.join("events.out.tfevents.1.other-writer"), tb.join("notes.txt")];
        for f in &foreign {
            std::fs::copy(&first_path, f).unwrap();
        }
        #[cfg(unix)]
        std::os::unix::fs::symlink(&foreign[0], tb.join("events.out.tfevents.2.host.3.4.tiderec")).unwrap();
        let foreign_bytes = std::fs::read(&foreign[0]).unwrap();

        let mut resumed = EventFile::resume(&tb, 5).unwrap();
        let after = read_events(&first_path).unwrap();
        assert_eq!(after[..], before[..6], "the version event and steps 1 to 5, as they were");
        let rewritten = std::fs::read(&first_path).unwrap();
        assert!(Records::new(&rewritten).all(|r| matches!(r, Framed::Record { .. })), "the record cut short goes");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&first_path).unwrap().permissions().mode() & 0o777, 0o640);
        }
        for step in 6..=9 {
            resumed.scalars(step, &[("train/loss", step as f64 / 100.0)]).unwrap();
        }
        let resumed_path = resumed.path().to_path_buf();
        drop(resumed);
        for f in &foreign {
            assert_eq!(std::fs::read(f).unwrap(), foreign_bytes, "{}", f.display());
        }
        let mut names: Vec<_> = std::fs::read_dir(&tb).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names.len(), if cfg!(unix) { 5 } else { 4 }, "no temporary file left: {names:?}");

        // Resumed again from step 7: the first file has nothing after it and is left as it is.
        let first_bytes = std::fs::read(&first_path).unwrap();
        drop(EventFile::resume(&tb, 7).unwrap());
        assert_eq!(std::fs::read(&first_path).unwrap(), first_bytes);
        assert_eq!(read_events(&resumed_path).unwrap().iter().map(|e| e.step).collect::<Vec<_>>(), [0, 6, 7]);
        let scalars = scalars_in(&tb);
        let mut keys: Vec<_> = scalars.iter().map(|(step, tag, _)| (*step, tag.clone())).collect();
        let n = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), n, "each (step, tag) once: {scalars:?}");
        let loss: Vec<_> =
            scalars.iter().filter(|(_, tag, _)| tag == "train/loss").map(|(step, _, v)| (*step, *v)).collect();
        assert_eq!(loss, [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4), (5, 0.5), (6, 0.06), (7, 0.07)]);
        // A directory not made yet has nothing to cut.
        assert_eq!(cut_after(&dir.path().join("missing"), 0).unwrap(), Cut::default());
    }

    #[test]
    fn records_that_cannot_be_read_as_events_are_kept_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let mut events = EventFile::create(dir.path()).unwrap();
        for step in [1, 2, 3] {
            events.scalars(step, &[("train/loss", 0.5)]).unwrap();
        }
        let path = events.path().to_path_buf();
        drop(events);
        let mut bytes = std::fs::read(&path).unwrap();
        let spans: Vec<(usize, usize)> = {
            let mut at = 0;
            Records::new(&bytes)
                .map(|r| {
                    let Framed::Record { bytes, .. } = r else { panic!("whole records") };
                    at += bytes.len();
                    (at - bytes.len(), at)
                })
                .collect()
        };
        assert_eq!(spans.len(), 4);
        // The event of step 3 fails its data CRC: it is kept, step unknown.
        let (start, end) = spans[3];
        bytes[end - 1] ^= 0xff;
        // Bytes that are no record (a length failing its CRC), with an event of step 9 after them.
        let unframed = bytes.len();
        bytes.extend_from_slice(&[7u8; 12]);
        let mut late = Vec::new();
        put_varint_field(&mut late, 2, 9);
        let len = (late.len() as u64).to_le_bytes();
        bytes.extend_from_slice(&len);
        bytes.extend_from_slice(&masked_crc(&len).to_le_bytes());
        bytes.extend_from_slice(&late);
        bytes.extend_from_slice(&masked_crc(&late).to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        assert!(read_events(&path).unwrap_err().to_string().contains(&format!("byte {start}")));
        let cut = cut_after(dir.path(), 1).unwrap();
        assert_eq!(cut, Cut { files: 1, dropped: 1, unframed: vec![(path.clone(), unframed)] });
        let (a, b) = spans[2];
        let mut want = bytes[..a].to_vec();
        want.extend_from_slice(&bytes[b..]);
        assert_eq!(std::fs::read(&path).unwrap(), want, "only the event of step 2 goes");
    }
}
