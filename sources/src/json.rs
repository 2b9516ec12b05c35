//! Criteo-shaped records as JSON objects, the `json` record format of Kafka topics.
//!
//! One record is one object: `"label"` (0 or 1; optional in the
//! [unlabeled](CriteoJsonFormat::unlabeled) form), `"I1"`…`"I13"` (integers) and
//! `"C1"`…`"C26"` (hexadecimal strings). A missing key, `null` or `""` is an
//! absent value (a zero dense feature, an empty bag). Other keys are ignored by
//! [`LineFormat::parse`] (a topic's producers may add their own), and refused by
//! [`CriteoJsonFormat::parse_record`], which names the first one (for a library user who
//! scores objects and wants a misspelt key refused; `tiderec serve` reads Criteo objects
//! through their TSV line instead, with its own unknown-key check).
//! The features are those of the TSV format ([`crate::criteo`]), so a record
//! trains the same whether it arrives as a TSV line or as JSON.
//!
//! Parsing is simd-json's tape over a reused scratch buffer: strings and keys
//! point into the record, nothing is allocated per field, and every key/value
//! pair is seen as written (a DOM would keep one of two equal keys). A record
//! that is not a JSON object counts as [`BadReason::FieldCount`], and so does a key given
//! twice (naming its field: the record has a field too many); a bad label,
//! integer or hex value as the TSV format's reasons, naming the same field
//! index (0 = label, 1..=13 = `I1..I13`, 14..=39 = `C1..C26`); a number beyond
//! `f32` in an `I` field (`1e40`) as [`BadReason::NonFinite`]. (JSON has no
//! `NaN` or `Infinity`: such a record is not JSON.)
//!
//! Labels and integers are those of the TSV format: the label is the number
//! `0` or `1` as written (`-0`, `0.0` or `1e0` is a [`BadReason::BadLabel`]),
//! and an `I` value an integer that the TSV format's
//! [`parse_dense_integer`] reads when written in decimal (at most 18 digits),
//! so a 19-digit integer is a [`BadReason::BadInteger`] in both.
//! [`criteo_line_to_json`] writes a TSV label or integer as a JSON number only
//! when the TSV format accepts it (`+1`, `01` or `-0` as a label, `1.5` as an
//! integer stay strings, which the JSON format refuses for the same reason):
//! a line and its JSON object train the same or are refused alike.

use crate::criteo::{
    dense_feature, parse_dense_integer, parse_label, push_sample, sparse_feature, CriteoFeatures, NUM_DENSE, NUM_SPARSE,
};
use crate::lines::LineFormat;
use crate::SourceError;
use simd_json::prelude::*;
use simd_json::{Buffers, ValueType};
use std::cell::RefCell;
use tiderec_records::bad_record::BadReason;
use tiderec_records::Batch;

/// Criteo records as JSON objects (see the [module docs](self)).
pub struct CriteoJsonFormat {
    features: CriteoFeatures,
    seeds: [u64; NUM_SPARSE],
    labeled: bool,
    scratch: RefCell<(Vec<u8>, Buffers)>,
}

impl CriteoJsonFormat {
    /// The format for these features; errors name a bad table size.
    pub fn new(features: CriteoFeatures) -> Result<Self, SourceError> {
        features.validate()?;
        let seeds = features.field_seeds();
        Ok(CriteoJsonFormat { features, seeds, labeled: true, scratch: RefCell::new((Vec::new(), Buffers::default())) })
    }

    /// The format for records to score: `"label"` may be absent (the sample's label is then 0);
    /// when present it must still be 0 or 1.
    pub fn unlabeled(features: CriteoFeatures) -> Result<Self, SourceError> {
        Ok(CriteoJsonFormat { labeled: false, ..Self::new(features)? })
    }
}

/// Why one JSON record was refused by [`CriteoJsonFormat::parse_record`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonRecordError {
    /// A bad value, as [`LineFormat::parse`] reports it: the reason and the field index.
    Bad(BadReason, Option<usize>),
    /// A key that is none of `label`, `I1`…`I13`, `C1`…`C26`.
    UnknownKey(String),
}

impl From<(BadReason, Option<usize>)> for JsonRecordError {
    fn from((reason, field): (BadReason, Option<usize>)) -> Self {
        JsonRecordError::Bad(reason, field)
    }
}

/// The index of `name` among `prefix1..prefixN` (`"I7"` → 6), if it is one.
fn column(name: &str, prefix: u8, n: usize) -> Option<usize> {
    let rest = name.as_bytes().strip_prefix(&[prefix])?;
    if rest.is_empty() || rest.len() > 2 || rest[0] == b'0' || !rest.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let k = rest.iter().fold(0usize, |a, &d| a * 10 + (d - b'0') as usize);
    (1..=n).contains(&k).then(|| k - 1)
}

/// The field index of key `name` (0 = `label`, 1..=13 = `I1..I13`, 14..=39 = `C1..C26`), if
/// it is one.
fn field_index(name: &str) -> Option<usize> {
    if name == "label" {
        return Some(0);
    }
    column(name, b'I', NUM_DENSE).map(|j| 1 + j).or_else(|| column(name, b'C', NUM_SPARSE).map(|f| 1 + NUM_DENSE + f))
}

impl LineFormat for CriteoJsonFormat {
    fn shape(&self) -> (usize, usize) {
        (NUM_DENSE, NUM_SPARSE)
    }

    fn parse(&self, line: &[u8], out: &mut Batch) -> Result<(), (BadReason, Option<usize>)> {
        self.parse_object(line, out, false).map_err(|e| match e {
            JsonRecordError::Bad(reason, field) => (reason, field),
            // Not produced when unknown keys are ignored; kept total rather than a panic.
            JsonRecordError::UnknownKey(_) => (BadReason::FieldCount, None),
        })
    }
}

impl CriteoJsonFormat {
    /// Parses one record as [`LineFormat::parse`] does, but refuses a key that is not a field.
    pub fn parse_record(&self, line: &[u8], out: &mut Batch) -> Result<(), JsonRecordError> {
        self.parse_object(line, out, true)
    }

    /// Appends the sample of one record to `out`; with `refuse_unknown`, a key that is not a
    /// field is an error naming it.
    fn parse_object(&self, line: &[u8], out: &mut Batch, refuse_unknown: bool) -> Result<(), JsonRecordError> {
        let mut scratch = self.scratch.borrow_mut();
        let (buf, buffers) = &mut *scratch;
        buf.clear();
        buf.extend_from_slice(line);
        let tape = simd_json::to_tape_with_buffers(buf, buffers).map_err(|_| (BadReason::FieldCount, None))?;
        let value = tape.as_value();
        let Some(object) = value.as_object() else { return Err((BadReason::FieldCount, None).into()) };
        let mut label = None;
        let mut dense = [0.0f32; NUM_DENSE];
        let mut ids = [u64::MAX; NUM_SPARSE];
        // Bit k: field k (0 = label, 1..=13 = I1..I13, 14..=39 = C1..C26) was given.
        let mut given = 0u64;
        for (key, v) in object.iter() {
            match field_index(key) {
                Some(field) if given & (1 << field) != 0 => return Err((BadReason::FieldCount, Some(field)).into()),
                Some(field) => given |= 1 << field,
                None if refuse_unknown => return Err(JsonRecordError::UnknownKey(key.to_string())),
                None => {}
            }
            if v.is_null() || v.as_str() == Some("") {
                continue;
            }
            if key == "label" {
                // The number `0` or `1` as written, like a TSV label: simd-json types an
                // integer written with a minus sign as signed (`-0` is `I64(0)`, `0` is
                // `U64(0)`) and one with a fraction or an exponent as a float (`0.0`, `1e0`).
                label = match (v.value_type(), v.as_u64()) {
                    (ValueType::U64, Some(0)) => Some(0.0f32),
                    (ValueType::U64, Some(1)) => Some(1.0),
                    _ => return Err((BadReason::BadLabel, Some(0)).into()),
                };
            } else if let Some(j) = column(key, b'I', NUM_DENSE) {
                match v.as_i64() {
                    Some(x) if is_tsv_integer(x) => dense[j] = dense_feature(x),
                    Some(_) => return Err((BadReason::BadInteger, Some(1 + j)).into()),
                    // A number beyond f32 (`1e40`) is non-finite as a feature; other non-integers are not integers.
                    None if v.as_f64().is_some_and(|x| !(x as f32).is_finite()) => {
                        return Err((BadReason::NonFinite, Some(1 + j)).into())
                    }
                    None => return Err((BadReason::BadInteger, Some(1 + j)).into()),
                }
            } else if let Some(f) = column(key, b'C', NUM_SPARSE) {
                let field = 1 + NUM_DENSE + f;
                let s = v.as_str().ok_or((BadReason::BadHex, Some(field)))?;
                if !s.is_empty() {
                    ids[f] = sparse_feature(s.as_bytes(), self.seeds[f], self.features.table_sizes[f])
                        .ok_or((BadReason::BadHex, Some(field)))?;
                }
            }
        }
        let label = match label {
            Some(l) => l,
            None if !self.labeled => 0.0,
            None => return Err((BadReason::BadLabel, Some(0)).into()),
        };
        push_sample(out, label, &dense, &ids);
        Ok(())
    }
}

/// Whether the TSV format reads `x`, written in decimal, as `x` ([`parse_dense_integer`]).
fn is_tsv_integer(x: i64) -> bool {
    use std::io::Write;
    let mut buf = [0u8; 24];
    let mut rest = &mut buf[..];
    // 24 bytes hold every i64 ("-9223372036854775808" is 20).
    let written = write!(rest, "{x}").map(|()| 24 - rest.len());
    written.is_ok_and(|n| parse_dense_integer(&buf[..n]) == Some(x))
}

/// The JSON value of a TSV field: the number `number` gives of it, else its text (a string
/// the JSON format refuses where a number is expected).
fn json_value(field: &[u8], number: impl Fn(&[u8]) -> Option<i64>) -> serde_json::Value {
    match number(field) {
        Some(v) => v.into(),
        None => String::from_utf8_lossy(field).into_owned().into(),
    }
}

/// The JSON object of one Criteo TSV line (for `tiderec produce --format json`), or
/// `None` when the line has fewer than 37 or more than 40 fields.
pub fn criteo_line_to_json(line: &[u8]) -> Option<String> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let fields: Vec<&[u8]> = line.split(|&b| b == b'\t').collect();
    if !(37..=1 + NUM_DENSE + NUM_SPARSE).contains(&fields.len()) {
        return None;
    }
    let mut object = serde_json::Map::new();
    // The label and integers as the TSV format reads them: `+1`, `01` are no label there.
    let label = json_value(fields[0], |f| parse_label(f).map(|l| l as i64));
    object.insert("label".into(), label);
    for (k, f) in fields.iter().enumerate().skip(1) {
        if f.is_empty() {
            continue;
        }
        let (name, value) = if k <= NUM_DENSE {
            (format!("I{k}"), json_value(f, parse_dense_integer))
        } else {
            (format!("C{}", k - NUM_DENSE), json_value(f, |_| None))
        };
        object.insert(name, value);
    }
    Some(serde_json::Value::Object(object).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::criteo::CriteoFormat;

    fn features() -> CriteoFeatures {
        CriteoFeatures::uniform(1000, 7)
    }

    #[test]
    fn json_equals_tsv_on_real_lines() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/criteo/sample.train");
        let Ok(text) = std::fs::read(path) else { return };
        let (tsv, json) = (CriteoFormat::new(features()).unwrap(), CriteoJsonFormat::new(features()).unwrap());
        let (mut a, mut b) = (Batch::new(NUM_DENSE, NUM_SPARSE), Batch::new(NUM_DENSE, NUM_SPARSE));
        let mut n = 0;
        for line in text.split(|&c| c == b'\n').filter(|l| !l.is_empty()).take(500) {
            let r = tsv.parse(line, &mut a).map(|_| ());
            let j = criteo_line_to_json(line).map(|s| json.parse(s.as_bytes(), &mut b).map(|_| ()));
            assert_eq!(Some(r), j, "{}", String::from_utf8_lossy(line));
            n += 1;
        }
        assert!(n > 100);
        assert_eq!(a.labels, b.labels);
        assert_eq!(a.dense, b.dense);
        for (x, y) in a.sparse.iter().zip(&b.sparse) {
            assert_eq!(x.ids, y.ids);
            assert_eq!(x.offsets, y.offsets);
        }
    }

    /// A valid Criteo TSV line with `label` and `I3` replaced.
    fn tsv_line(label: &str, i3: &str) -> String {
        let mut f = vec![label.to_string()];
        f.extend((1..=13).map(|i| if i == 3 { i3.to_string() } else { (i * 7).to_string() }));
        f.extend((1..=26).map(|c| format!("{:08x}", c * 7919)));
        f.join("\t")
    }

    /// Edge labels and integers: the TSV line and its JSON object (`tiderec produce`) are
    /// accepted alike, with the same sample, or refused alike, for the same reason and field.
    #[test]
    fn tsv_lines_and_their_json_accept_the_same_labels_and_integers() {
        let (tsv, json) = (CriteoFormat::new(features()).unwrap(), CriteoJsonFormat::new(features()).unwrap());
        let labels = ["0", "1", "+1", "01", "-0", "+0", "00", "2", "-1", "1.0", " 1", "true", ""];
        let integers = [
            "0",
            "-0",
            "+5",
            "007",
            "-12",
            "999999999999999999",
            "-999999999999999999",
            "1000000000000000000",
            "1234567890123456789",
            "9223372036854775807",
            "-9223372036854775808",
            "18446744073709551616",
            "1.5",
            "1e3",
            "+",
            "-",
            "0x10",
            "",
        ];
        let cases = labels.iter().map(|l| (*l, "4")).chain(integers.iter().map(|i| ("1", *i)));
        let (mut accepted, mut refused) = (0, 0);
        for (label, i3) in cases {
            let line = tsv_line(label, i3);
            let (mut a, mut b) = (Batch::new(NUM_DENSE, NUM_SPARSE), Batch::new(NUM_DENSE, NUM_SPARSE));
            let object = criteo_line_to_json(line.as_bytes()).unwrap();
            let (t, j) = (tsv.parse(line.as_bytes(), &mut a), json.parse(object.as_bytes(), &mut b));
            assert_eq!(t, j, "label {label:?}, I3 {i3:?}: {object}");
            assert_eq!((&a.labels, &a.dense), (&b.labels, &b.dense), "label {label:?}, I3 {i3:?}");
            if t.is_ok() {
                accepted += 1
            } else {
                refused += 1
            }
        }
        assert_eq!((accepted, refused), (10, 21));
        // JSON records take the integers a TSV line may hold, no more: 18 digits.
        let mut b = Batch::new(NUM_DENSE, NUM_SPARSE);
        for x in ["1000000000000000000", "-1000000000000000000", "9223372036854775807", "-9223372036854775808"] {
            let record = format!(r#"{{"label": 1, "I3": {x}}}"#);
            assert_eq!(json.parse(record.as_bytes(), &mut b), Err((BadReason::BadInteger, Some(3))), "{record}");
        }
        json.parse(br#"{"label": 1, "I3": -999999999999999999, "I4": 999999999999999999}"#, &mut b).unwrap();
        // `""` is an absent value in every field (a zero dense feature), as documented.
        json.parse(br#"{"label": 0, "I3": ""}"#, &mut b).unwrap();
        assert_eq!(b.dense[NUM_DENSE + 2], 0.0);
    }

    #[test]
    fn malformed_objects_name_the_field() {
        let json = CriteoJsonFormat::new(features()).unwrap();
        let mut b = Batch::new(NUM_DENSE, NUM_SPARSE);
        let cases: [(&str, (BadReason, Option<usize>)); 12] = [
            (r#"{"label": 0, "label": 1}"#, (BadReason::FieldCount, Some(0))),
            (r#"{"label": 1, "I4": 2, "I4": 3}"#, (BadReason::FieldCount, Some(4))),
            (r#"{"label": 1, "C26": "0a", "C26": null}"#, (BadReason::FieldCount, Some(39))),
            ("not json", (BadReason::FieldCount, None)),
            ("[1,2]", (BadReason::FieldCount, None)),
            (r#"{"I1": 3}"#, (BadReason::BadLabel, Some(0))),
            (r#"{"label": 2}"#, (BadReason::BadLabel, Some(0))),
            (r#"{"label": 1, "I4": "x"}"#, (BadReason::BadInteger, Some(4))),
            (r#"{"label": 0, "C2": "zz"}"#, (BadReason::BadHex, Some(15))),
            (r#"{"label": 0, "I2": 1e40}"#, (BadReason::NonFinite, Some(2))),
            (r#"{"label": 0, "I13": -1e300}"#, (BadReason::NonFinite, Some(13))),
            (r#"{"label": 0, "I3": NaN}"#, (BadReason::FieldCount, None)),
        ];
        for (text, want) in cases {
            assert_eq!(json.parse(text.as_bytes(), &mut b), Err(want), "{text}");
        }
        // A full record (beyond the size where the object becomes a hash map) with a key repeated.
        let full: Vec<String> = std::iter::once("\"label\": 1".to_string())
            .chain((1..=13).map(|i| format!("\"I{i}\": {i}")))
            .chain((1..=26).map(|c| format!("\"C{c}\": \"0a\"")))
            .collect();
        let repeated = format!("{{{}, \"I7\": 9}}", full.join(", "));
        assert_eq!(json.parse(repeated.as_bytes(), &mut b), Err((BadReason::FieldCount, Some(7))), "{repeated}");
        assert!(b.is_empty());
        json.parse(br#"{"label": 1, "I1": 5, "C1": "", "C3": null, "C26": "0a", "extra": [1]}"#, &mut b).unwrap();
        b.check().unwrap();
        assert_eq!(b.labels, vec![1.0]);
        assert!((b.dense[0] - 6f32.ln()).abs() < 1e-6);
        assert!(b.sparse[0].bag(0).is_empty() && b.sparse[2].bag(0).is_empty());
        assert_eq!(b.sparse[25].bag(0).len(), 1);
    }

    /// The label is the number `0` or `1` as written: a sign, a fraction or an exponent make
    /// it another text (`-0`, `0.0`, `1e0`), refused as the TSV format refuses that text, in
    /// both forms and naming the label's field (0).
    #[test]
    fn a_label_is_the_number_0_or_1_as_written() {
        let (labeled, unlabeled) =
            (CriteoJsonFormat::new(features()).unwrap(), CriteoJsonFormat::unlabeled(features()).unwrap());
        let tsv = CriteoFormat::new(features()).unwrap();
        let mut b = Batch::new(NUM_DENSE, NUM_SPARSE);
        for label in ["-0", "-0.0", "0.0", "1.0", "-1", "1e0", "0e0", "-0e0", "10e-1", "0E1", "true", r#""0""#] {
            let record = format!(r#"{{"I1": 5, "label": {label}, "C26": "0a"}}"#);
            for format in [&labeled, &unlabeled] {
                assert_eq!(format.parse(record.as_bytes(), &mut b), Err((BadReason::BadLabel, Some(0))), "{record}");
                let refused = format.parse_record(record.as_bytes(), &mut b);
                assert_eq!(refused, Err(JsonRecordError::Bad(BadReason::BadLabel, Some(0))), "{record}");
            }
            let line = tsv_line(label, "4");
            assert_eq!(tsv.parse(line.as_bytes(), &mut b), Err((BadReason::BadLabel, Some(0))), "{line}");
        }
        assert!(b.is_empty(), "a refused record appends nothing");
        // JSON whitespace around the number is no part of it.
        for (label, want) in [("0", 0.0), ("1", 1.0), (" 0 ", 0.0), ("\n1\t", 1.0)] {
            let record = format!(r#"{{"label":{label}, "I1": 5}}"#);
            labeled.parse(record.as_bytes(), &mut b).unwrap();
            unlabeled.parse_record(record.as_bytes(), &mut b).unwrap();
            assert_eq!(b.labels[b.len() - 2..], [want, want], "{record}");
        }
    }

    #[test]
    fn unlabeled_records_score_without_a_label_but_not_with_a_bad_one() {
        let json = CriteoJsonFormat::unlabeled(features()).unwrap();
        let labeled = CriteoJsonFormat::new(features()).unwrap();
        let (mut a, mut b) = (Batch::new(NUM_DENSE, NUM_SPARSE), Batch::new(NUM_DENSE, NUM_SPARSE));
        json.parse(br#"{"I1": 5, "C26": "0a"}"#, &mut a).unwrap();
        labeled.parse(br#"{"label": 0, "I1": 5, "C26": "0a"}"#, &mut b).unwrap();
        assert_eq!(a.labels, b.labels);
        assert_eq!(a.dense, b.dense);
        assert_eq!(a.sparse[25].bag(0), b.sparse[25].bag(0));
        let mut c = Batch::new(NUM_DENSE, NUM_SPARSE);
        assert_eq!(json.parse(br#"{"label": 3}"#, &mut c), Err((BadReason::BadLabel, Some(0))));
    }

    #[test]
    fn records_to_score_refuse_keys_that_are_not_fields_and_topics_ignore_them() {
        let json = CriteoJsonFormat::unlabeled(features()).unwrap();
        let mut b = Batch::new(NUM_DENSE, NUM_SPARSE);
        for (text, key) in
            [(r#"{"c1": "0a"}"#, "c1"), (r#"{"I1": 5, "I14": 1}"#, "I14"), (r#"{"C0": "", "I1": 5}"#, "C0")]
        {
            assert_eq!(
                json.parse_record(text.as_bytes(), &mut b),
                Err(JsonRecordError::UnknownKey(key.into())),
                "{text}"
            );
            // The topic form reads the same record, ignoring the key.
            json.parse(text.as_bytes(), &mut b).unwrap();
        }
        assert_eq!(b.len(), 3);
        let bad = json.parse_record(br#"{"I2": "x", "extra": 1}"#, &mut b);
        assert_eq!(bad, Err(JsonRecordError::Bad(BadReason::BadInteger, Some(2))));
        json.parse_record(br#"{"label": 1, "I1": 5, "C26": "0a"}"#, &mut b).unwrap();
        assert_eq!(b.len(), 4);
    }

    #[test]
    fn column_names() {
        assert_eq!(column("I1", b'I', 13), Some(0));
        assert_eq!(column("I13", b'I', 13), Some(12));
        assert_eq!(column("I14", b'I', 13), None);
        assert_eq!(column("I01", b'I', 13), None);
        assert_eq!(column("C26", b'C', 26), Some(25));
        assert_eq!(column("C", b'C', 26), None);
        assert_eq!(column("label", b'C', 26), None);
    }
}
