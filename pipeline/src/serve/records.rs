//! The JSON records `tiderec serve` scores: the columns of the records a
//! checkpoint was trained on, for every line format (`criteo`, `avazu`,
//! `csv` and `taobao-ad` with their spec, `amazon-dien`).
//!
//! A record is a JSON object keyed by the training format's column names
//! ([`RecordShape`], listed by `GET /schema`), or `{"line": TEXT}`: one line
//! of the training files, label column included. Either way the record
//! becomes one line of the training format, and the checkpoint's own line
//! format ([`FeaturePipeline::line_format`], the one `tiderec predict` reads
//! files with) featurizes it: a record scores exactly as the same line does
//! in `predict`. There is no second featurizer here, only the assembly of a
//! line.
//!
//! Invariants:
//! * An object's values go into the line verbatim: a string as its
//!   characters, a number as written in the JSON text, an array (list and
//!   sequence columns only) as its items joined with the list's separator. A
//!   missing key or `null` is an empty column, read as the format reads an
//!   empty column. A missing label is `0` (the score does not depend on it).
//! * A value that would change the line's columns (the column separator or
//!   a line break inside it, the list separator inside a list item), a
//!   value of the wrong JSON type, a key that names no column and a key
//!   given twice are refused, naming the field: no record is scored as
//!   something other than what was sent.
//! * `line` is the line form unless the format has a column of that name.

use crate::error::CheckpointAction;
use crate::feature_pipeline::FeaturePipeline;
use crate::PipelineError;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::collections::HashMap;
use tiderec_operators::bad_record::BadReason;
use tiderec_operators::spec::{delimiter_byte, Encoding, Pooling, AVAZU_COLUMNS};
use tiderec_sources::amazon::HISTORY_DELIMITER;

/// The key of a record given as one line of the training files.
pub const LINE_KEY: &str = "line";

/// One column of the training records.
#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    /// Its name: the record's key.
    pub name: String,
    /// The JSON value expected, as a person reads it (`integer`, `hex string`, `list of strings`, …).
    pub kind: &'static str,
    /// What it becomes: `label`, `dense`, `categorical`, `list`, `sequence` (several joined by
    /// `+`), or `none` (read, not a feature).
    pub feature: String,
    /// For list and sequence columns: the separator of the items in the line.
    pub separator: Option<u8>,
}

/// The columns of a checkpoint's training records and how a line is made of them.
#[derive(Clone, Debug)]
pub struct RecordShape {
    format: String,
    columns: Vec<Column>,
    delimiter: u8,
    label: usize,
    index: HashMap<String, usize>,
    transforms: HashMap<String, String>,
}

/// A record that cannot be made into a line: the field to blame and what is wrong.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordError {
    /// The key (or `line`); `None` when the record as a whole is wrong.
    pub field: Option<String>,
    /// What is wrong.
    pub reason: String,
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.field {
            // A key no plain name spells (empty, spaced, a control character) is shown as
            // its JSON string, so the message shows what was sent rather than a blank.
            Some(field) if !plain_name(field) => {
                write!(f, "{} in `{}`", self.reason, serde_json::Value::from(field.as_str()))
            }
            Some(field) => write!(f, "{} in `{field}`", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

/// Whether `field` reads as itself between backticks: ASCII letters, digits, `_`, `-` and `.`, not empty.
fn plain_name(field: &str) -> bool {
    !field.is_empty() && field.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn blame(field: &str, reason: impl Into<String>) -> RecordError {
    RecordError { field: Some(field.to_string()), reason: reason.into() }
}

/// Where a line came from: the record's `line`, or its columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineOf {
    /// `{"line": …}`.
    Line,
    /// An object of columns.
    Columns,
}

fn column(name: &str, kind: &'static str, feature: &str) -> Column {
    Column { name: name.to_string(), kind, feature: feature.to_string(), separator: None }
}

fn label(name: &str) -> Column {
    column(name, "0 or 1", "label")
}

impl RecordShape {
    /// The records of `pipeline`; `None` for formats that are not read line by line (Parquet,
    /// the generators, Taobao behaviour logs).
    pub fn of(pipeline: &FeaturePipeline) -> Result<Option<Self>, PipelineError> {
        let (columns, delimiter, label_column) = match pipeline.format.as_str() {
            "criteo" => {
                let ints = (1..=13).map(|i| column(&format!("I{i}"), "integer", "dense"));
                let cats = (1..=26).map(|i| column(&format!("C{i}"), "hex string", "categorical"));
                (std::iter::once(label("label")).chain(ints).chain(cats).collect(), b'\t', 0)
            }
            "avazu" => {
                let columns = AVAZU_COLUMNS
                    .iter()
                    .map(|&name| match name {
                        "id" => column(name, "string", "none"),
                        "click" => label(name),
                        "hour" => column(name, "YYMMDDHH", "dense+categorical"),
                        _ => column(name, "string", "categorical"),
                    })
                    .collect();
                (columns, b',', 1)
            }
            "amazon-dien" => {
                let history = |name: &str| Column {
                    separator: Some(HISTORY_DELIMITER),
                    ..column(name, "list of strings", "sequence")
                };
                let columns = vec![
                    label("label"),
                    column("user", "string", "categorical"),
                    column("item", "string", "categorical"),
                    column("category", "string", "categorical"),
                    history("history_items"),
                    history("history_categories"),
                ];
                (columns, b'\t', 0)
            }
            "csv" | "taobao-ad" => {
                let spec = &pipeline
                    .spec
                    .as_ref()
                    .ok_or_else(|| {
                        PipelineError::checkpoint(
                            CheckpointAction::Read,
                            None,
                            format!("the `{}` pipeline records no feature spec", pipeline.format),
                        )
                    })?
                    .fields;
                let columns = spec
                    .columns
                    .iter()
                    .map(|name| {
                        let mut c = column(name, "string", "none");
                        let mut features = Vec::new();
                        if *name == spec.label.column {
                            c.kind = "0 or 1";
                            features.push("label");
                        }
                        if spec.dense.iter().any(|d| d.column == *name) {
                            c.kind = "number";
                            features.push("dense");
                        }
                        if let Some(n) = spec.numeric_list.iter().find(|n| n.column == *name) {
                            (c.kind, c.separator) = ("list of numbers", delimiter_byte(&n.delimiter));
                            features.push("dense");
                        }
                        if let Some(k) = spec.categorical.iter().find(|k| k.column == *name) {
                            c.kind = match k.encoding {
                                Encoding::Identity => "integer",
                                Encoding::Bucketize | Encoding::Quantile => "number",
                                _ => "string",
                            };
                            features.push("categorical");
                        }
                        if let Some(l) = spec.list.iter().find(|l| l.column == *name) {
                            (c.kind, c.separator) = ("list of strings", delimiter_byte(&l.delimiter));
                            features.push(if l.pooling == Pooling::None { "sequence" } else { "list" });
                        }
                        if !features.is_empty() {
                            c.feature = features.join("+");
                        }
                        c
                    })
                    .collect::<Vec<_>>();
                let delimiter = delimiter_byte(&spec.delimiter).unwrap_or(b',');
                let label = spec.columns.iter().position(|c| *c == spec.label.column).unwrap_or(0);
                (columns, delimiter, label)
            }
            _ => return Ok(None),
        };
        let index = columns.iter().enumerate().map(|(i, c): (usize, &Column)| (c.name.clone(), i)).collect();
        let transforms = pipeline.dense.iter().map(|d| (d.name.clone(), d.transform.clone())).collect();
        Ok(Some(RecordShape {
            format: pipeline.format_label(),
            columns,
            delimiter,
            label: label_column,
            index,
            transforms,
        }))
    }

    /// The columns, in line order.
    #[cfg(test)]
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// The name of column `k` of a line (for a format's error).
    pub fn column_name(&self, k: usize) -> Option<&str> {
        self.columns.get(k).map(|c| c.name.as_str())
    }

    /// Writes the line of `record` (a JSON object) to `out`, and says whether it was given as
    /// `{"line": …}` or made of the record's columns.
    pub fn line_of(&self, record: &[u8], out: &mut Vec<u8>) -> Result<LineOf, RecordError> {
        out.clear();
        let fields = parse_object(record)?;
        if self.take_line(&fields, out)? {
            return Ok(LineOf::Line);
        }
        let mut values: Vec<Option<Vec<u8>>> = vec![None; self.columns.len()];
        for (key, raw) in &fields {
            let Some(&k) = self.index.get(key.as_str()) else {
                return Err(blame(
                    key,
                    format!("unknown field (the {} fields are listed by GET /schema)", self.format),
                ));
            };
            if values[k].is_some() {
                return Err(blame(key, "a field given twice"));
            }
            values[k] = Some(self.value(&self.columns[k], raw)?);
        }
        for (k, value) in values.iter().enumerate() {
            if k > 0 {
                out.push(self.delimiter);
            }
            match value {
                Some(v) => out.extend_from_slice(v),
                None if k == self.label => out.push(b'0'),
                None => {}
            }
        }
        Ok(LineOf::Columns)
    }

    /// The `line` of `fields` written to `out`, if they are of that form.
    fn take_line(&self, fields: &[(String, &RawValue)], out: &mut Vec<u8>) -> Result<bool, RecordError> {
        let line = fields.iter().find(|(k, _)| k == LINE_KEY).filter(|_| !self.index.contains_key(LINE_KEY));
        let Some((_, raw)) = line else { return Ok(false) };
        if fields.len() > 1 {
            let other = fields.iter().find(|(k, _)| k != LINE_KEY).map_or(LINE_KEY, |(k, _)| k.as_str());
            return Err(blame(other, "a field beside `line` (a record is a line or its fields, not both)"));
        }
        let line: String = serde_json::from_str(raw.get()).map_err(|_| blame(LINE_KEY, "not a string"))?;
        if line.bytes().any(|b| b == b'\n') {
            return Err(blame(LINE_KEY, "a line break (a record is one line)"));
        }
        out.extend_from_slice(line.as_bytes());
        Ok(true)
    }

    /// The text of `column`'s value `raw` in a line.
    fn value(&self, column: &Column, raw: &RawValue) -> Result<Vec<u8>, RecordError> {
        let name = column.name.as_str();
        let text = raw.get();
        match text.as_bytes().first() {
            Some(b'[') => {
                let Some(separator) = column.separator else {
                    return Err(blame(name, format!("a list where one value ({}) belongs", column.kind)));
                };
                let items: Vec<&RawValue> =
                    serde_json::from_str(text).map_err(|e| blame(name, format!("a bad list: {e}")))?;
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(separator);
                    }
                    let value = self.scalar(name, item)?.ok_or_else(|| blame(name, format!("null as item {i}")))?;
                    if let Some(b) = value.iter().find(|&&b| b == separator) {
                        return Err(blame(name, format!("item {i} holds the list separator {}", shown(*b))));
                    }
                    out.extend_from_slice(&value);
                }
                Ok(out)
            }
            _ => Ok(self.scalar(name, raw)?.unwrap_or_default()),
        }
    }

    /// A string's characters or a number's JSON text (`None` for `null`), checked not to hold
    /// the column separator or a line break.
    fn scalar(&self, name: &str, raw: &RawValue) -> Result<Option<Vec<u8>>, RecordError> {
        let text = raw.get();
        let value = match text.as_bytes().first() {
            Some(b'"') => serde_json::from_str::<String>(text).map_err(|e| blame(name, e.to_string()))?.into_bytes(),
            Some(b'-' | b'0'..=b'9') => text.as_bytes().to_vec(),
            Some(b'n') => return Ok(None),
            Some(b't' | b'f') => return Err(blame(name, "a boolean where a string or number belongs")),
            Some(b'[') => return Err(blame(name, "a list inside a list item")),
            _ => return Err(blame(name, "an object where a string or number belongs")),
        };
        if let Some(b) = value.iter().find(|&&b| b == self.delimiter || b == b'\n' || b == b'\r') {
            return Err(blame(name, format!("the value holds {}", shown(*b))));
        }
        Ok(Some(value))
    }

    /// The message of a format's error on a line made by [`RecordShape::line_of`].
    pub fn format_error(&self, (reason, field): (BadReason, Option<usize>), of: LineOf) -> RecordError {
        let name = field.and_then(|k| self.column_name(k));
        match (of, name) {
            (LineOf::Columns, Some(name)) => blame(name, reason.to_string()),
            (LineOf::Columns, None) => RecordError { field: None, reason: reason.to_string() },
            (LineOf::Line, Some(name)) => blame(LINE_KEY, format!("{reason} in column `{name}`")),
            (LineOf::Line, None) => blame(
                LINE_KEY,
                format!(
                    "{reason} ({} lines have {} columns separated by {})",
                    self.format,
                    self.columns.len(),
                    shown(self.delimiter)
                ),
            ),
        }
    }

    /// The description `GET /schema` answers: the format, each field with its JSON type and
    /// the feature it becomes, and the `line` form.
    pub fn describe(&self) -> Value {
        let fields: Vec<Value> = self
            .columns
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let mut v = json!({ "name": c.name, "type": c.kind, "feature": c.feature });
                if k == self.label {
                    v["optional"] = true.into();
                }
                if let Some(s) = c.separator {
                    v["separator"] = String::from(s as char).into();
                }
                if let Some(t) = self.transforms.get(&c.name) {
                    v["transform"] = t.clone().into();
                }
                v
            })
            .collect();
        json!({
            "format": self.format,
            "fields": fields,
            "line": format!(
                "{{\"line\": TEXT}}: one line of the training files, {} columns separated by {}, label included",
                self.columns.len(),
                shown(self.delimiter)
            ),
        })
    }

    /// One line saying what a record looks like, for the start-up message.
    pub fn summary(&self) -> String {
        const SHOWN: usize = 12;
        let mut names: Vec<String> = self.columns.iter().take(SHOWN).map(|c| c.name.clone()).collect();
        if self.columns.len() > SHOWN {
            names.push(format!("… {} fields", self.columns.len()));
        }
        format!(
            "records: {} JSON objects with fields {} ({} optional; GET /schema describes each), or {{\"line\": \"<one training line>\"}}",
            self.format,
            names.join(", "),
            self.columns[self.label].name
        )
    }
}

/// A byte as an error message shows it.
fn shown(b: u8) -> String {
    match b {
        b'\t' => "a tab".into(),
        b'\n' => "a line break".into(),
        b'\r' => "a carriage return".into(),
        HISTORY_DELIMITER => "`\\u0002`".into(),
        b => format!("`{}`", b as char),
    }
}

/// The key/value pairs of a JSON object, in order, duplicates kept.
fn parse_object(record: &[u8]) -> Result<Vec<(String, &RawValue)>, RecordError> {
    tiderec_sources::json_object::object_pairs(record)
        .map_err(|e| RecordError { field: None, reason: format!("not a JSON object: {e}") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DataSpec;
    use tiderec_operators::spec::FeatureSpec;

    fn pipeline(format: &str) -> FeaturePipeline {
        let data = match format {
            "avazu" => DataSpec::Avazu(Vec::new()),
            "amazon-dien" => DataSpec::AmazonDien(Vec::new()),
            _ => DataSpec::Criteo(Vec::new()),
        };
        FeaturePipeline::assumed(&data, 1, &[100; 26], Some(5)).unwrap()
    }

    fn line(shape: &RecordShape, record: &str) -> Result<(String, LineOf), RecordError> {
        let mut out = Vec::new();
        shape.line_of(record.as_bytes(), &mut out).map(|of| (String::from_utf8(out).unwrap(), of))
    }

    #[test]
    fn objects_become_lines_in_column_order() {
        let avazu = RecordShape::of(&pipeline("avazu")).unwrap().unwrap();
        let (l, of) = line(&avazu, r#"{"hour": 14102100, "C21": "79", "site_id": "1fbe01fe"}"#).unwrap();
        assert_eq!(of, LineOf::Columns);
        assert_eq!(l, ",0,14102100,,,1fbe01fe,,,,,,,,,,,,,,,,,,79");
        let (l, _) = line(&avazu, r#"{"click": 1, "C1": -2.50}"#).unwrap();
        assert_eq!(l, ",1,,-2.50,,,,,,,,,,,,,,,,,,,,", "a number as written");
        let (l, of) = line(&avazu, r#"{"line": "a,b"}"#).unwrap();
        assert_eq!((l.as_str(), of), ("a,b", LineOf::Line));
        let amazon = RecordShape::of(&pipeline("amazon-dien")).unwrap().unwrap();
        let (l, _) =
            line(&amazon, r#"{"user": "u", "history_items": ["a", "b"], "history_categories": "x\u0002y"}"#).unwrap();
        assert_eq!(l, "0\tu\t\t\ta\u{2}b\tx\u{2}y");
    }

    #[test]
    fn bad_values_name_their_field() {
        let avazu = RecordShape::of(&pipeline("avazu")).unwrap().unwrap();
        let cases = [
            (r#"{"site_id": "a,b"}"#, "the value holds `,` in `site_id`"),
            (r#"{"site_id": ["a"]}"#, "a list where one value (string) belongs in `site_id`"),
            (r#"{"site_id": true}"#, "a boolean where a string or number belongs in `site_id`"),
            (r#"{"site_id": {}}"#, "an object where a string or number belongs in `site_id`"),
            (r#"{"site": "a"}"#, "unknown field (the avazu fields are listed by GET /schema) in `site`"),
            (r#"{"": "a"}"#, "unknown field (the avazu fields are listed by GET /schema) in `\"\"`"),
            (r#"{"site\nid": "a"}"#, "unknown field (the avazu fields are listed by GET /schema) in `\"site\\nid\"`"),
            (r#"{"C1": "1", "C1": "2"}"#, "a field given twice in `C1`"),
            (
                r#"{"line": "a", "C1": "2"}"#,
                "a field beside `line` (a record is a line or its fields, not both) in `C1`",
            ),
            (r#"{"line": 3}"#, "not a string in `line`"),
            (r#"{"line": "a\nb"}"#, "a line break (a record is one line) in `line`"),
        ];
        for (record, want) in cases {
            assert_eq!(line(&avazu, record).unwrap_err().to_string(), want, "{record}");
        }
        assert!(line(&avazu, "[1]").unwrap_err().to_string().starts_with("not a JSON object"));
        let e = line(&avazu, "{} {}").unwrap_err();
        assert!(e.field.is_none() && e.reason.starts_with("not a JSON object"), "{e}");
        let amazon = RecordShape::of(&pipeline("amazon-dien")).unwrap().unwrap();
        assert_eq!(
            line(&amazon, r#"{"history_items": ["a\u0002b"]}"#).unwrap_err(),
            RecordError {
                field: Some("history_items".into()),
                reason: "item 0 holds the list separator `\\u0002`".into()
            }
        );
        assert_eq!(line(&amazon, r#"{"user": "a\tb"}"#).unwrap_err().to_string(), "the value holds a tab in `user`");
        assert_eq!(
            line(&amazon, r#"{"history_items": [["a", "b"]]}"#).unwrap_err().to_string(),
            "a list inside a list item in `history_items`"
        );
        assert_eq!(
            line(&amazon, r#"{"history_items": ["a", {"b": 1}]}"#).unwrap_err().to_string(),
            "an object where a string or number belongs in `history_items`"
        );
        // A format's error names the column, also inside a `line`.
        let e = avazu.format_error((BadReason::BadLabel, Some(1)), LineOf::Columns);
        assert_eq!(e.to_string(), "bad_label in `click`");
        let e = avazu.format_error((BadReason::BadInteger, Some(2)), LineOf::Line);
        assert_eq!(e.to_string(), "bad_integer in column `hour` in `line`");
    }

    #[test]
    fn a_spec_describes_its_columns() {
        let mut p = pipeline("criteo");
        p.format = "csv".into();
        let spec = FeatureSpec::taobao_ad(100, 5);
        p.spec = Some(crate::feature_pipeline::SpecRecord { source: "preset:taobao_ad".into(), fields: spec.clone() });
        let shape = RecordShape::of(&p).unwrap().unwrap();
        let names: Vec<&str> = shape.columns().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, spec.columns.iter().map(String::as_str).collect::<Vec<_>>());
        let of = |n: &str| shape.columns().iter().find(|c| c.name == n).unwrap().clone();
        assert_eq!((of("clk").kind, of("clk").feature.as_str()), ("0 or 1", "label"));
        assert_eq!((of("price").kind, of("price").feature.as_str()), ("number", "dense"));
        assert_eq!((of("time_stamp").feature.as_str(), of("userid").feature.as_str()), ("none", "categorical"));
        assert_eq!((of("click_sequence").feature.as_str(), of("click_sequence").separator), ("list", Some(b'^')));
        let (l, _) = line(&shape, r#"{"price": 3.9, "click_sequence": [1, "2"]}"#).unwrap();
        assert_eq!(l, format!("0{}3.9{}1^2", ",".repeat(9), ",".repeat(9)));
        let d = shape.describe();
        assert_eq!(d["fields"][0]["optional"], true);
        assert_eq!(d["fields"][18]["separator"], "^");
        assert!(shape.summary().contains("clk, time_stamp"), "{}", shape.summary());
    }
}
