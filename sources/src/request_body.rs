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
//!   that is not UTF-8 is refused with the offset of its first bad byte
//!   ([`BodyError::NotUtf8`]); one that is not JSON is read as lines, each
//!   line a record for the record format to accept or refuse, when its first
//!   line is a whole JSON value or broken before its end (a `NaN` in a line
//!   of NDJSON); one whose first line ends inside a value (a pretty-printed
//!   object) is one value, refused whole ([`BodyError::NotJson`]).
//! * `NaN` and `Infinity` (JSON numbers in some encoders, not in JSON) are
//!   named as such: an array or a value of several lines holding one is
//!   refused with [`BodyError::NonFinite`], and [`non_finite`] finds one in
//!   a refused record so that its refusal can say so.

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
    /// A body that is not JSON, as one value (its first line ends inside it), nor lines.
    #[error("the body is not valid JSON: {0}")]
    NotJson(String),
    /// A JSON value that is neither an object nor an array.
    #[error("the body is neither a record object nor an array of them")]
    NotRecords,
    /// Bytes that are not UTF-8 (JSON text is).
    #[error("the body is not UTF-8 (byte offset {offset})")]
    NotUtf8 {
        /// The offset of the first byte that is not.
        offset: usize,
    },
    /// A JSON array, or a value of several lines, holding `NaN` or `Infinity`.
    #[error("the body is {0}")]
    NonFinite(NonFinite),
}

/// A `NaN` or `Infinity` where a JSON value belongs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NonFinite {
    /// The token as written (`NaN`, `-Infinity`, …).
    pub token: String,
    /// Its byte offset in the text searched.
    pub offset: usize,
    /// The key of the value, when it is one of an object.
    pub key: Option<String>,
}

impl std::fmt::Display for NonFinite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not valid JSON: NaN/Infinity are not JSON numbers (`{}`", self.token)?;
        match &self.key {
            Some(key) => write!(f, " in `{key}`, byte offset {})", self.offset),
            None => write!(f, " at byte offset {})", self.offset),
        }
    }
}

/// The records of one body, as byte ranges of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Records {
    /// Each record's bytes in the body, in order.
    pub ranges: Vec<Range<usize>>,
}

/// The records of `body`, at most `max_records` of them (see the module docs).
pub fn split_records(body: &[u8], max_records: usize) -> Result<Records, BodyError> {
    if let Err(e) = std::str::from_utf8(body) {
        return Err(BodyError::NotUtf8 { offset: e.valid_up_to() });
    }
    let Some(first) = body.iter().position(|b| !b.is_ascii_whitespace()) else { return Err(BodyError::Empty) };
    let ranges = match body[first] {
        b'[' => array(body, max_records)?,
        _ => match serde_json::from_slice::<IgnoredAny>(body) {
            Ok(_) if body[first] != b'{' => return Err(BodyError::NotRecords),
            Ok(_) => {
                let end = body.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(body.len(), |e| e + 1);
                std::iter::once(first..end).collect()
            }
            Err(e) if first_line_is_cut(&body[first..]) => {
                return Err(non_finite(body).map_or_else(|| BodyError::NotJson(e.to_string()), BodyError::NonFinite))
            }
            Err(_) => lines(body, max_records)?,
        },
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
        Err(e) => Err(non_finite(body).map_or_else(|| BodyError::NotAnArray(e.to_string()), BodyError::NonFinite)),
    }
}

/// Whether the first line of `text` (which starts with its first non-blank byte) ends inside
/// a JSON value that goes on in the lines after it: the body is then one value written on
/// several lines, not one record per line. Not when that line is a whole value, or is broken
/// before its end (each line is then a record, for the record format to refuse or not).
fn first_line_is_cut(text: &[u8]) -> bool {
    let line = &text[..memchr::memchr(b'\n', text).unwrap_or(text.len())];
    line.len() < text.len() && serde_json::from_slice::<IgnoredAny>(line).is_err_and(|e| e.is_eof())
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

/// The first `NaN`, `Infinity` or `inf` (any case, `Infinity` and `inf` with an optional sign)
/// outside the strings of JSON-like `text`, with the key it is the value of. Only a refused
/// record is searched: in JSON text each of them is an error.
pub fn non_finite(text: &[u8]) -> Option<NonFinite> {
    let (mut in_string, mut escaped) = (false, false);
    let (mut string_start, mut last_string, mut key) = (0, None, None);
    for (i, &b) in text.iter().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => {
                    in_string = false;
                    last_string = Some(string_start..i);
                }
                b'\n' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => (in_string, string_start) = (true, i + 1),
            b':' => key = last_string.clone(),
            b'{' | b',' | b'[' => key = None,
            b'n' | b'N' | b'i' | b'I' => {
                if let Some(found) = non_finite_at(text, i) {
                    let key = key.map(|k: std::ops::Range<usize>| String::from_utf8_lossy(&text[k]).into_owned());
                    return Some(NonFinite { key, ..found });
                }
            }
            _ => {}
        }
    }
    None
}

/// The non-finite token starting at `i` (or at the sign before it), if one does.
fn non_finite_at(text: &[u8], i: usize) -> Option<NonFinite> {
    let word = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.';
    let end = i + text[i..].iter().take_while(|b| word(b)).count();
    let token = &text[i..end];
    let signed = [&b"infinity"[..], b"inf"].iter().any(|t| token.eq_ignore_ascii_case(t));
    if !(signed || token.eq_ignore_ascii_case(b"nan")) {
        return None;
    }
    let start = match i.checked_sub(1).map(|k| text[k]) {
        Some(b'-' | b'+') if signed => i - 1,
        Some(b) if word(&b) => return None,
        _ => i,
    };
    if start > 0 && word(&text[start - 1]) {
        return None;
    }
    Some(NonFinite { token: String::from_utf8_lossy(&text[start..end]).into_owned(), offset: start, key: None })
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
        assert_eq!(split_records(b"\xff\xfe{\n\x80", 10), Err(BodyError::NotUtf8 { offset: 0 }));
        let e = split_records(b"{\"a\": \"\xc3\x28\"}", 10).unwrap_err();
        assert_eq!(e.to_string(), "the body is not UTF-8 (byte offset 7)");
        let e = split(r#"[{"a": 1}, {"I1": NaN}]"#, 10).unwrap_err().to_string();
        assert_eq!(e, "the body is not valid JSON: NaN/Infinity are not JSON numbers (`NaN` in `I1`, byte offset 18)");
        // An object or lines holding NaN are records, refused by the record format.
        assert_eq!(split("{\"I1\": NaN}\n{}", 10).unwrap(), ["{\"I1\": NaN}", "{}"]);
    }

    /// A pretty-printed object is one value, not lines: what is wrong in it is named, never
    /// a line of it (`{`) refused as a record.
    #[test]
    fn a_value_of_several_lines_is_refused_whole_naming_what_is_wrong() {
        let e = split("{\n  \"I1\": NaN\n}", 10).unwrap_err();
        let n = NonFinite { token: "NaN".into(), offset: 10, key: Some("I1".into()) };
        assert_eq!(e, BodyError::NonFinite(n));
        assert_eq!(
            e.to_string(),
            "the body is not valid JSON: NaN/Infinity are not JSON numbers (`NaN` in `I1`, byte offset 10)"
        );
        let e = split("\r\n {\r\n  \"I1\": 1,\r\n  \"I2\": -Infinity\r\n}\r\n", 10).unwrap_err().to_string();
        assert!(e.contains("(`-Infinity` in `I2`"), "{e}");
        let e = split("{\n  \"I1\": 1,\n}", 10).unwrap_err();
        assert_eq!(e.to_string(), "the body is not valid JSON: key must be a string at line 3 column 1");
        // Pretty-printed and valid: one record.
        assert_eq!(split("{\n  \"I1\": 1\n}\n", 10).unwrap(), ["{\n  \"I1\": 1\n}"]);
        // A first line broken before its end is a line of NDJSON: each line is a record.
        assert_eq!(split("{\"I1\": NaN\n{}", 10).unwrap(), ["{\"I1\": NaN", "{}"]);
        assert_eq!(split("{\"I1\": NaN,\n\"I2\": 1}", 10).unwrap(), ["{\"I1\": NaN,", "\"I2\": 1}"]);
    }

    #[test]
    fn non_finite_tokens_are_found_outside_strings() {
        let found = |text: &str| non_finite(text.as_bytes()).map(|n| (n.token, n.offset, n.key));
        assert_eq!(found(r#"{"I1": NaN}"#), Some(("NaN".into(), 7, Some("I1".into()))));
        assert_eq!(found(r#"{"a": 1, "b": -Infinity}"#), Some(("-Infinity".into(), 14, Some("b".into()))));
        assert_eq!(found(r#"[1, inf]"#), Some(("inf".into(), 4, None)));
        assert_eq!(found(r#"{"a": [1, +INF]}"#), Some(("+INF".into(), 10, None)));
        assert_eq!(found(r#"{"x": "NaN", "y\"": nan}"#), Some(("nan".into(), 20, Some("y\\\"".into()))));
        for none in
            [r#"{"a": "NaN Infinity"}"#, r#"{"nan": 1, "Infinity": 2}"#, "[null, true, 1e5]", "{\"a\": -NaN1}", "x_nan"]
        {
            assert_eq!(found(none), None, "{none}");
        }
        let n = non_finite(br#"{"price": NaN}"#).unwrap();
        assert_eq!(
            n.to_string(),
            "not valid JSON: NaN/Infinity are not JSON numbers (`NaN` in `price`, byte offset 10)"
        );
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
