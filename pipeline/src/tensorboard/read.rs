//! Reading event files back: the records of a file's bytes (TFRecord framing, each CRC
//! checked) and the events in them, the few fields this module writes.

use super::masked_crc;
use crate::PipelineError;
use std::path::Path;

/// One item of an event file, as [`Records`] reads it.
pub(super) enum Framed<'a> {
    /// A whole record: its bytes as framed, its data, and whether the data's CRC holds.
    Record { bytes: &'a [u8], data: &'a [u8], data_crc_ok: bool },
    /// A record cut short by the end of the file (the last item).
    Short,
    /// A length whose CRC fails at byte `at`: nothing from there on can be framed (the last item).
    Unframed { at: usize },
}

/// The records of an event file's bytes, in order.
pub(super) struct Records<'a> {
    bytes: &'a [u8],
    at: usize,
    done: bool,
}

impl<'a> Records<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Records { bytes, at: 0, done: false }
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Framed<'a>;

    fn next(&mut self) -> Option<Framed<'a>> {
        let bytes: &'a [u8] = self.bytes;
        let rest = &bytes[self.at..];
        if self.done || rest.is_empty() {
            return None;
        }
        let le32 = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
        if rest.len() < 12 {
            self.done = true;
            return Some(Framed::Short);
        }
        if le32(&rest[8..12]) != masked_crc(&rest[..8]) {
            self.done = true;
            return Some(Framed::Unframed { at: self.at });
        }
        let len = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
        let end = usize::try_from(len).ok().and_then(|l| l.checked_add(16)).filter(|&end| end <= rest.len());
        let Some(end) = end else {
            self.done = true;
            return Some(Framed::Short);
        };
        let data = &rest[12..end - 4];
        self.at += end;
        Some(Framed::Record { bytes: &rest[..end], data, data_crc_ok: le32(&rest[end - 4..end]) == masked_crc(data) })
    }
}

/// The fields of a protocol buffer message, in order: `(field, wire type, value)`, the value
/// a varint's for wire type 0 and the field's bytes otherwise; `None` at bytes that are no
/// field (a group, a field running past the end).
fn fields(mut data: &[u8]) -> impl Iterator<Item = Option<(u64, u8, u64, &[u8])>> {
    std::iter::from_fn(move || {
        if data.is_empty() {
            return None;
        }
        let field = (|| {
            let key = take_varint(&mut data)?;
            let (number, wire) = (key >> 3, (key & 7) as u8);
            Some(match wire {
                0 => (number, wire, take_varint(&mut data)?, &[][..]),
                1 => (number, wire, 0, take(&mut data, 8)?),
                2 => {
                    let n = usize::try_from(take_varint(&mut data)?).ok()?;
                    (number, wire, 0, take(&mut data, n)?)
                }
                5 => (number, wire, 0, take(&mut data, 4)?),
                _ => return None,
            })
        })();
        if field.is_none() {
            data = &[];
        }
        Some(field)
    })
}

/// Takes `n` bytes off the front of `data`.
fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let bytes = data.get(..n)?;
    *data = &data[n..];
    Some(bytes)
}

/// Reads a base-128 varint off the front of `data`.
fn take_varint(data: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for (i, &b) in data.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            *data = &data[i + 1..];
            return Some(v);
        }
    }
    None
}

/// The step of the `tensorflow.Event` in `data` (0 when it has none, as protocol buffers
/// read it; a negative step as 0), or `None` when `data` is no message.
pub(super) fn event_step(data: &[u8]) -> Option<u64> {
    let mut step = 0;
    for field in fields(data) {
        if let (2, 0, v, _) = field? {
            step = u64::try_from(v as i64).unwrap_or(0);
        }
    }
    Some(step)
}

/// One event read back from an event file ([`read_events`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Event {
    /// Seconds since the epoch when it was written.
    pub wall_time: f64,
    /// Its step.
    pub step: u64,
    /// The file version it names (the first event of a file), if any.
    pub file_version: Option<String>,
    /// Its scalar summaries: (tag, value).
    pub scalars: Vec<(String, f32)>,
}

/// The events of the event file at `path`, in order; a record cut short at the end (a run
/// still writing) is left out, and a record that fails its CRC or is no event is an error
/// naming the file and the record's offset.
pub fn read_events(path: &Path) -> Result<Vec<Event>, PipelineError> {
    let bytes = std::fs::read(path)
        .map_err(|e| PipelineError::config("tensorboard", format!("cannot read {}: {e}", path.display())))?;
    let bad = |at: usize, what: &str| {
        PipelineError::config("tensorboard", format!("{}: the record at byte {at} {what}", path.display()))
    };
    let mut events = Vec::new();
    let mut at = 0;
    for record in Records::new(&bytes) {
        let (bytes, data) = match record {
            Framed::Record { data_crc_ok: false, .. } => return Err(bad(at, "fails its data CRC")),
            Framed::Record { bytes, data, .. } => (bytes, data),
            Framed::Short => break,
            Framed::Unframed { at } => return Err(bad(at, "fails its length CRC")),
        };
        events.push(parse_event(data).ok_or_else(|| bad(at, "is no event"))?);
        at += bytes.len();
    }
    Ok(events)
}

/// The [`Event`] in `data`, or `None` when it is no event message.
fn parse_event(data: &[u8]) -> Option<Event> {
    let mut event = Event::default();
    for field in fields(data) {
        match field? {
            (1, 1, _, b) => event.wall_time = f64::from_le_bytes(b.try_into().ok()?),
            (2, 0, v, _) => event.step = u64::try_from(v as i64).unwrap_or(0),
            (3, 2, _, b) => event.file_version = Some(String::from_utf8(b.to_vec()).ok()?),
            (5, 2, _, summary) => {
                for value in fields(summary) {
                    let (1, 2, _, value) = value? else { continue };
                    let (mut tag, mut simple) = (None, None);
                    for f in fields(value) {
                        match f? {
                            (1, 2, _, b) => tag = Some(String::from_utf8(b.to_vec()).ok()?),
                            (2, 5, _, b) => simple = Some(f32::from_le_bytes(b.try_into().ok()?)),
                            _ => {}
                        }
                    }
                    if let (Some(tag), Some(v)) = (tag, simple) {
                        event.scalars.push((tag, v));
                    }
                }
            }
            _ => {}
        }
    }
    Some(event)
}
