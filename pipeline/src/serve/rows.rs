//! The records of a model trained on Parquet files (`tiderec convert`): the
//! featurized rows of its schema, as JSON objects ([`json_row`]), described
//! for `GET /schema` and the start-up message.
//!
//! Such a model's features were made at conversion; its records are those
//! features (a dense column's transformed value, a sparse column's row id),
//! exactly what `tiderec predict` reads from the files, decoded by the same
//! reader.

use super::records::RecordError;
use serde_json::{json, Value};
use tiderec_sources::parquet::json_row;
use tiderec_sources::parquet::{SchemaDescription, SparseKind};

/// The description `GET /schema` answers for rows of `d`.
pub fn describe(d: &SchemaDescription) -> Value {
    let mut fields = vec![json!({ "name": d.label, "type": "number in [0, 1]", "feature": "label", "optional": true })];
    fields.extend(d.dense.iter().map(|n| json!({ "name": n, "type": "number", "feature": "dense" })));
    fields.extend(d.sparse.iter().map(|s| {
        let (kind, feature) = match s.kind {
            SparseKind::Single => ("id", "categorical"),
            SparseKind::List => ("list of ids", "list"),
        };
        json!({ "name": s.name, "type": kind, "feature": feature, "table_size": s.table_size })
    }));
    fields.extend(d.sequences.iter().map(|q| {
        let table = &d.sparse[q.table];
        json!({ "name": q.name, "type": "list of ids", "feature": "sequence", "table_size": table.table_size })
    }));
    if d.groups {
        let name = tiderec_sources::parquet::schema::GROUP_COLUMN;
        fields
            .push(json!({ "name": name, "type": "group key", "feature": "user (read, not scored)", "optional": true }));
    }
    json!({
        "format": format!("parquet (from {})", d.format),
        "fields": fields,
        "rows": "featurized rows, as the converted files hold them: ids below each table's size, dense values transformed",
    })
}

/// One line saying what a record looks like, for the start-up message.
pub fn summary(d: &SchemaDescription) -> String {
    let names: Vec<&str> = std::iter::once(d.label.as_str())
        .chain(d.dense.iter().map(String::as_str))
        .chain(d.sparse.iter().map(|s| s.name.as_str()))
        .chain(d.sequences.iter().map(|s| s.name.as_str()))
        .collect();
    let shown = names.iter().take(12).copied().collect::<Vec<_>>().join(", ");
    let more = if names.len() > 12 { format!(", … {} fields", names.len()) } else { String::new() };
    format!(
        "records: featurized rows of parquet (from {}) as JSON objects with fields {shown}{more} ({} optional; dense \
         values as converted, ids as numbers; GET /schema describes each)",
        d.format, d.label
    )
}

/// Appends the row `record` to `out`, its sequences cut to the `max_len` the model reads (as
/// its format cuts them); the error names the bad field.
pub fn featurize(
    d: &SchemaDescription,
    table_sizes: &[u64],
    max_len: Option<usize>,
    record: &[u8],
    out: &mut tiderec_operators::Batch,
) -> Result<(), RecordError> {
    json_row::append_json_row(d, table_sizes, max_len, record, out)
        .map_err(|e| RecordError { field: e.field, reason: e.reason })
}
