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
//!   created new in `DIR` (made if missing): nothing of an earlier run is overwritten, and
//!   TensorBoard shows a resumed run's events after the interrupted run's.
//! * Every event is flushed when written, so a reader sees each complete record of a run
//!   still in progress.

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
    }
}
