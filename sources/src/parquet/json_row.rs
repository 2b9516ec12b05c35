//! Rows of a featurized dataset given as JSON objects (the records `tiderec
//! serve` scores with a model trained on Parquet files).
//!
//! A row is an object keyed by the column names of the
//! [`SchemaDescription`]: `label` (a number; optional, 0 when left out),
//! each dense column a number (the featurized value), each single-valued
//! sparse column an id (a non-negative integer), each multi-valued sparse
//! column and each behaviour sequence an array of ids (oldest first). A
//! missing key or `null` is a null value. The rows become one Arrow batch of
//! the description's columns, which [`append_chunk`] appends as the reader
//! appends a file's rows (the same null handling, id bounds, label checks and
//! cut of sequences longer than the model reads); only the JSON-to-Arrow
//! typing is done here.
//!
//! Invariants: a key that names no column and a value of the wrong JSON type
//! are errors naming the key, never a null; a key given twice in one row is an
//! error naming it (as in the line formats' records), never one value taken
//! over the other.

use super::reader::append_chunk;
use super::schema::{SchemaDescription, SparseKind};
use crate::error::SourceError;
use arrow_array::builder::{ListBuilder, UInt64Builder};
use arrow_array::{Array, ArrayRef, Float32Array, RecordBatch, UInt64Array};
use arrow_schema::{Field, Schema};
use serde_json::Value;
use std::collections::HashSet;
use std::sync::Arc;
use tiderec_records::Batch;

/// A row that does not fit the description: the key to blame (if one is) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowError {
    /// The key.
    pub field: Option<String>,
    /// What is wrong.
    pub reason: String,
}

fn blame(field: &str, reason: impl Into<String>) -> RowError {
    RowError { field: Some(field.to_string()), reason: reason.into() }
}

/// How a column's values are typed.
#[derive(Clone, Copy)]
enum Kind {
    Number,
    Id,
    Ids,
}

/// The columns of `description` with how each is typed, in its order.
fn columns(description: &SchemaDescription) -> Vec<(&str, Kind)> {
    let mut out = vec![(description.label.as_str(), Kind::Number)];
    out.extend(description.dense.iter().map(|d| (d.as_str(), Kind::Number)));
    out.extend(
        description
            .sparse
            .iter()
            .map(|s| (s.name.as_str(), if s.kind == SparseKind::Single { Kind::Id } else { Kind::Ids })),
    );
    out.extend(description.sequences.iter().map(|s| (s.name.as_str(), Kind::Ids)));
    out
}

/// Appends the row `record` (a JSON object) to `out` (of the description's shape); ids are
/// bounded by `table_sizes`, and each sequence is cut for a model reading at most `max_len`
/// ids of it (see [`SequenceColumn::cut`](super::schema::SequenceColumn::cut)). The error
/// names the key; after an error the contents of `out` are unspecified.
pub fn append_json_row(
    description: &SchemaDescription,
    table_sizes: &[u64],
    max_len: Option<usize>,
    record: &[u8],
    out: &mut Batch,
) -> Result<(), RowError> {
    let cols = columns(description);
    let mut row = vec![Value::Null; cols.len()];
    for (key, value) in object_pairs(record)? {
        // The user's group key of a row as converted files hold it (a description recorded
        // without it reads such rows too): checked, not a feature.
        if key == super::schema::GROUP_COLUMN {
            if !(value.is_null() || value.is_u64()) {
                return Err(blame(&key, format!("{value} is not a group key (a non-negative integer)")));
            }
            continue;
        }
        let k = cols.iter().position(|(name, _)| *name == key).ok_or_else(|| {
            blame(&key, "unknown field (the columns of the model's Parquet schema are listed by GET /schema)")
        })?;
        row[k] = value;
    }
    if row[0].is_null() {
        row[0] = Value::from(0.0);
    }
    let id = |name: &str, v: &Value| match v {
        Value::Null => Ok(None),
        v => v.as_u64().map(Some).ok_or_else(|| blame(name, format!("{v} is not an id (a non-negative integer)"))),
    };
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(cols.len());
    for (&(name, kind), v) in cols.iter().zip(&row) {
        arrays.push(match kind {
            Kind::Number => {
                let x = match v {
                    Value::Null => None,
                    v => Some(v.as_f64().ok_or_else(|| blame(name, format!("{v} is not a number")))? as f32),
                };
                Arc::new(Float32Array::from(vec![x]))
            }
            Kind::Id => Arc::new(UInt64Array::from(vec![id(name, v)?])),
            Kind::Ids => {
                let mut list = ListBuilder::new(UInt64Builder::new());
                match v {
                    Value::Null => list.append_null(),
                    Value::Array(items) => {
                        for item in items {
                            list.values().append_option(id(name, item)?);
                        }
                        list.append(true);
                    }
                    v => return Err(blame(name, format!("{v} is not an array of ids"))),
                }
                Arc::new(list.finish())
            }
        });
    }
    let fields: Vec<Field> =
        cols.iter().zip(&arrays).map(|(&(name, _), array)| Field::new(name, array.data_type().clone(), true)).collect();
    let chunk = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
        .map_err(|e| RowError { field: None, reason: e.to_string() })?;
    append_chunk(description, table_sizes, max_len, &chunk, "the record", out).map_err(row_error)
}

/// The key/value pairs of the JSON object `record`, in order; a key given twice is an error
/// naming it.
fn object_pairs(record: &[u8]) -> Result<Vec<(String, Value)>, RowError> {
    let pairs = crate::json_object::object_pairs::<Value>(record)
        .map_err(|e| RowError { field: None, reason: format!("not a JSON object: {e}") })?;
    let mut seen = HashSet::with_capacity(pairs.len());
    match pairs.iter().find(|(key, _)| !seen.insert(key.as_str())) {
        Some((key, _)) => Err(blame(key, "a field given twice")),
        None => Ok(pairs),
    }
}

/// The reader's error on a chunk of JSON rows, with the column it names as the field.
fn row_error(e: SourceError) -> RowError {
    match e {
        SourceError::Schema { reason, .. } => match reason.strip_prefix("column `").and_then(|r| r.split_once("`: ")) {
            Some((field, reason)) => blame(field, reason),
            None => RowError { field: None, reason },
        },
        e => RowError { field: None, reason: e.to_string() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(d: &SchemaDescription) -> Batch {
        let (dense, sparse) = d.shape();
        Batch::with_sequences(dense, sparse, d.sequences.len())
    }

    #[test]
    fn rows_append_as_the_reader_appends_them() {
        let d = SchemaDescription::behavior("amazon-dien", &[10, 20, 5], 1);
        let mut out = batch(&d);
        let rows: [&[u8]; 2] = [
            br#"{"user": 3, "item": 7, "category": 2, "history_items": [1, 2], "history_categories": [0, 4]}"#,
            br#"{"label": 1, "item": null, "history_items": [], "history_categories": []}"#,
        ];
        for row in rows {
            append_json_row(&d, &d.table_sizes(), Some(20), row, &mut out).unwrap();
        }
        out.check().unwrap();
        assert_eq!(out.labels, [0.0, 1.0]);
        assert_eq!((out.sparse[0].bag(0), out.sparse[1].bag(1)), (&[3u64][..], &[][..]));
        assert_eq!((out.sequences[0].bag(0), out.sequences[1].bag(0)), (&[1u64, 2][..], &[0u64, 4][..]));
    }

    #[test]
    fn bad_rows_name_the_field() {
        let d = SchemaDescription::criteo(&[10; 26], 1);
        let bad = |row: &[u8]| append_json_row(&d, &d.table_sizes(), None, row, &mut batch(&d)).unwrap_err();
        assert_eq!(bad(br#"{"C3": -1}"#), blame("C3", "-1 is not an id (a non-negative integer)"));
        assert_eq!(bad(br#"{"I2": "x"}"#), blame("I2", "\"x\" is not a number"));
        assert_eq!(bad(br#"{"C3": [1]}"#), blame("C3", "[1] is not an id (a non-negative integer)"));
        assert_eq!(bad(br#"{"C3": 10}"#), blame("C3", "id 10 is not below the table size 10"));
        assert_eq!(bad(br#"{"I1": 1e40}"#), blame("I1", "non_finite value"));
        assert_eq!(bad(br#"{"label": 2}"#), blame("label", "label 2 is not in [0, 1]"));
        assert_eq!(bad(br#"{"X": 1}"#).field.as_deref(), Some("X"));
        assert!(bad(b"[1]").reason.starts_with("not a JSON object"));
        assert_eq!(bad(br#"{"_group": -3}"#), blame("_group", "-3 is not a group key (a non-negative integer)"));
        // A key given twice is refused, whichever value would have been kept.
        assert_eq!(bad(br#"{"C3": 3, "C3": 4}"#), blame("C3", "a field given twice"));
        assert_eq!(bad(br#"{"I1": null, "C1": 1, "I1": 2}"#), blame("I1", "a field given twice"));
        assert_eq!(bad(br#"{"_group": 1, "_group": 1}"#), blame("_group", "a field given twice"));
        assert!(bad(br#"{"C3": 3} x"#).reason.starts_with("not a JSON object"));
        // A row as converted files hold it, with its user's group key: read, not scored.
        append_json_row(&d, &d.table_sizes(), None, br#"{"_group": 77, "C3": 1}"#, &mut batch(&d)).unwrap();
    }

    #[test]
    fn sequences_longer_than_the_model_reads_are_cut_as_their_format_cuts_them() {
        // Behaviour histories keep their most recent (last) ids, as `amazon-dien` lines do.
        let d = SchemaDescription::behavior("amazon-dien", &[10, 20, 5], 1);
        let mut out = batch(&d);
        let row = br#"{"history_items": [1, 2, null, 3, 4, 5], "history_categories": [0, 1, 2, 3, 4]}"#;
        append_json_row(&d, &d.table_sizes(), Some(3), row, &mut out).unwrap();
        assert_eq!((out.sequences[0].bag(0), out.sequences[1].bag(0)), (&[3u64, 4, 5][..], &[2u64, 3, 4][..]));
        // An id cut off is still checked against its table.
        let row = br#"{"history_items": [99, 2], "history_categories": [0, 1]}"#;
        let e = append_json_row(&d, &d.table_sizes(), Some(1), row, &mut batch(&d)).unwrap_err();
        assert_eq!(e, blame("history_items", "id 99 is not below the table size 20"));
        // A spec list's sequence keeps its first `max_len` ids, as the spec's line parser does.
        let mut d = SchemaDescription::behavior("csv", &[10, 20, 5], 1);
        d.sequences.iter_mut().for_each(|s| s.max_len = Some(2));
        let mut out = batch(&d);
        let row = br#"{"history_items": [1, 2, 3], "history_categories": [4, 3, 2]}"#;
        append_json_row(&d, &d.table_sizes(), Some(2), row, &mut out).unwrap();
        assert_eq!((out.sequences[0].bag(0), out.sequences[1].bag(0)), (&[1u64, 2][..], &[4u64, 3][..]));
        // Without a bound, a sequence is read whole.
        let mut out = batch(&d);
        d.sequences.iter_mut().for_each(|s| s.max_len = None);
        append_json_row(&d, &d.table_sizes(), None, row, &mut out).unwrap();
        assert_eq!(out.sequences[0].bag(0), &[1u64, 2, 3][..]);
    }
}
