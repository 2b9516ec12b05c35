//! The records of a JSON request body (`tiderec serve`'s `POST /score`): one
//! object, a JSON array of them, or one object per line (NDJSON).
//!
//! Invariants:
//! * A body is split, not parsed: each record is a byte range of the body
//!   ([`Records::ranges`]), read once later by the model's record format.
//! * Memory is bounded by the cap, whatever arrives: records are counted
//!   while the body is scanned and the scan stops at the first record over
//!   `max_records`, so a body of millions of records allocates at most
//!   `max_records + 1` ranges and never copies a record.
//! * Any bytes give a typed [`BodyError`] or records, never a panic: a body
//!   that is not JSON (non-UTF-8 bytes, a bare number) is read as lines, and
//!   each line is a record for the record format to accept or refuse.

use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::ops::Range;
use thiserror::Error;

/// Why a body holds no records to score.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Nothing but white space.
    #[error("no records")]
    Empty,
    /// More records than the cap.
    #[error("more than {max} records in one request (the cap is {max}, `--max-records`)")]
    TooMany {
        /// The cap.
        max: usize,
    },
    /// A body starting with `[` that is not a JSON array.
    #[error("the body is not a JSON array of records: {0}")]
    NotAnArray(String),
    /// A JSON value that is neither an object nor an array.
    #[error("the body is neither a record object nor an array of them")]
    NotRecords,
}

/// The records of one body, as byte ranges of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Records {
    /// Each record's bytes in the body, in order.
    pub ranges: Vec<Range<usize>>,
}

/// The records of `body`, at most `max_records` of them (see the module docs).
pub fn split_records(body: &[u8], max_records: usize) -> Result<Records, BodyError> {
    let Some(first) = body.iter().position(|b| !b.is_ascii_whitespace()) else { return Err(BodyError::Empty) };
    let ranges = match body[first] {
        b'[' => array(body, max_records)?,
        _ if serde_json::from_slice::<IgnoredAny>(body).is_ok() => {
            if body[first] != b'{' {
                return Err(BodyError::NotRecords);
            }
            let end = body.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(body.len(), |e| e + 1);
            std::iter::once(first..end).collect()
        }
        _ => lines(body, max_records)?,
    };
    if ranges.is_empty() {
        return Err(BodyError::Empty);
    }
    Ok(Records { ranges })
}

/// The elements of a JSON array, counted against the cap as they are read.
fn array(body: &[u8], max_records: usize) -> Result<Vec<Range<usize>>, BodyError> {
    struct Elements<'b> {
        base: usize,
        max: usize,
        over: &'b mut bool,
    }
    impl<'de> Visitor<'de> for Elements<'_> {
        type Value = Vec<Range<usize>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array of records")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(raw) = seq.next_element::<&'de RawValue>()? {
                if out.len() == self.max {
                    *self.over = true;
                    return Err(serde::de::Error::custom("over the cap"));
                }
                let start = raw.get().as_ptr() as usize - self.base;
                out.push(start..start + raw.get().len());
            }
            Ok(out)
        }
    }
    let mut over = false;
    let mut de = serde_json::Deserializer::from_slice(body);
    let visitor = Elements { base: body.as_ptr() as usize, max: max_records, over: &mut over };
    let parsed = de.deserialize_seq(visitor).and_then(|r| de.end().map(|()| r));
    match parsed {
        Ok(ranges) => Ok(ranges),
        Err(_) if over => Err(BodyError::TooMany { max: max_records }),
        Err(e) => Err(BodyError::NotAnArray(e.to_string())),
    }
}

/// The non-blank lines of `body` (one trailing `\r` dropped), counted against the cap.
fn lines(body: &[u8], max_records: usize) -> Result<Vec<Range<usize>>, BodyError> {
    let mut out = Vec::new();
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', body).chain(std::iter::once(body.len())) {
        let line = &body[start..end];
        let cut = usize::from(line.last() == Some(&b'\r'));
        if !line.iter().all(u8::is_ascii_whitespace) {
            if out.len() == max_records {
                return Err(BodyError::TooMany { max: max_records });
            }
            out.push(start..end - cut);
        }
        start = end + 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(body: &str, max: usize) -> Result<Vec<&str>, BodyError> {
        let r = split_records(body.as_bytes(), max)?;
        Ok(r.ranges.into_iter().map(|r| &body[r]).collect())
    }

    #[test]
    fn arrays_objects_and_lines_split_into_records() {
        assert_eq!(split(r#" [{"a": 1}, {"b": [2, 3]}] "#, 10).unwrap(), [r#"{"a": 1}"#, r#"{"b": [2, 3]}"#]);
        assert_eq!(split(" {\"a\": 1}\n", 10).unwrap(), ["{\"a\": 1}"]);
        assert_eq!(split("{\"a\": 1}\r\n\n  \n{\"b\": 2}", 10).unwrap(), ["{\"a\": 1}", "{\"b\": 2}"]);
        // Array elements of any JSON type are records, for the record format to refuse.
        assert_eq!(split("[1, \"x\"]", 10).unwrap(), ["1", "\"x\""]);
    }

    #[test]
    fn bad_bodies_are_typed_errors() {
        assert_eq!(split("", 10), Err(BodyError::Empty));
        assert_eq!(split(" \n\r\n ", 10), Err(BodyError::Empty));
        assert_eq!(split("[]", 10), Err(BodyError::Empty));
        assert_eq!(split("42", 10), Err(BodyError::NotRecords));
        assert!(matches!(split("[{}, ", 10), Err(BodyError::NotAnArray(_))));
        assert!(matches!(split("[{}] x", 10), Err(BodyError::NotAnArray(_))));
        let bytes = split_records(b"\xff\xfe{\n\x80", 10).unwrap();
        assert_eq!(bytes.ranges, [0..3, 4..5], "non-UTF-8 lines are records for the format to refuse");
    }

    #[test]
    fn the_cap_stops_the_count() {
        let many = format!("[{}{{}}]", "{},".repeat(99));
        assert_eq!(split(&many, 100).unwrap().len(), 100);
        assert_eq!(split(&many, 99), Err(BodyError::TooMany { max: 99 }));
        let lines = "{}\n".repeat(100);
        assert_eq!(split(&lines, 100).unwrap().len(), 100);
        assert_eq!(split(&lines, 99), Err(BodyError::TooMany { max: 99 }));
        let e = split(&many, 99).unwrap_err().to_string();
        assert!(e.contains("more than 99 records") && e.contains("--max-records"), "{e}");
    }
}
