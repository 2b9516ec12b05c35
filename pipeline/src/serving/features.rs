//! The `features` section of `model.json`: how a raw record becomes the model's input.
//!
//! The checkpoint's feature pipeline (`pipeline` in `model.json`) records the
//! format and `--hash-seed`; this section spells the featurization out for a
//! reader in another language. [`feature_pipeline`] writes it from the model's
//! shape: a Criteo-shaped model (see
//! [`super::names::is_criteo_shaped`]) reads Criteo TSV records, and the
//! section spells out that featurization completely (the bytes hashed, the
//! per-field seeds, the reduction to a row, the dense transform, missing
//! values and malformed records), enough to rebuild it in another language
//! (`scripts/reference_scorer.py` does). Any other model gets `"format":
//! "unrecorded"` with the table sizes and the seed. Feature crosses are not
//! recorded (which field pairs were crossed), so a crossed model's section
//! says so.
//!
//! Every 64-bit constant is written as a `0x`-prefixed hex string, which every
//! JSON reader keeps exact.

use super::names::{crosses, InputNames};
use crate::feature_pipeline::FeaturePipeline;
use serde_json::{json, Value};
use tiderec_operators::features::field_seed;
use tiderec_operators::train::TrainerConfig;
use tiderec_sources::criteo::{MIN_FIELDS, NUM_FIELDS};

fn hex(v: u64) -> String {
    format!("{v:#018x}")
}

/// The `features` section for a served model with input names `names`, trained on records
/// of `pipeline` (`None`: an older checkpoint that records none).
pub fn feature_pipeline(config: &TrainerConfig, pipeline: Option<&FeaturePipeline>, names: &InputNames) -> Value {
    let hash_seed = pipeline.map_or(config.seed, |p| p.hash.seed);
    match pipeline {
        _ if names.criteo && pipeline.is_none_or(|p| p.format == "criteo") => criteo(config, hash_seed, names),
        Some(p) => json!({
            "format": p.format,
            "note": "spelled out for Criteo TSV only; the `pipeline` key holds this format's spec, \
                     hash function and transforms",
            "hash_seed": hash_seed,
            "table_sizes": config.table_sizes,
        }),
        None => json!({
            "format": "unrecorded",
            "note": "the checkpoint does not record the data format of a model that is not Criteo-shaped \
                     (13 dense and 26 sparse fields): its fields have positional names",
            "hash_seed": hash_seed,
            "table_sizes": config.table_sizes,
        }),
    }
}

/// The Criteo TSV featurization (`sources/src/criteo.rs`, `operators/src/features`).
fn criteo(config: &TrainerConfig, hash_seed: u64, names: &InputNames) -> Value {
    let own = names.sparse.len() - crosses(&config.model);
    let dense: Vec<Value> =
        names.dense.iter().enumerate().map(|(j, n)| json!({"name": n, "column": 1 + j, "input": j})).collect();
    let categorical: Vec<Value> = names.sparse[..own]
        .iter()
        .enumerate()
        .map(|(f, n)| {
            json!({
                "name": n,
                "column": 1 + names.dense.len() + f,
                "field_index": f,
                "rows": config.table_sizes[f],
                "seed": hex(field_seed(hash_seed, f)),
            })
        })
        .collect();
    let columns: Vec<&str> = std::iter::once("label")
        .chain(names.dense.iter().map(String::as_str))
        .chain(names.sparse[..own].iter().map(String::as_str))
        .collect();
    let mut section = json!({
        "format": "criteo-tsv",
        "inferred": "from the model's shape (13 dense, 26 sparse fields): the checkpoint does not record the format",
        "record": {
            "separator": "\t",
            "columns": columns,
            "max_fields": NUM_FIELDS,
            "min_fields": MIN_FIELDS,
            "short_lines": "a line of 37 to 39 fields lacks trailing categorical fields; they are missing values",
            "line_end": "LF; a CR before it is dropped; a missing final newline is fine; an empty line is no record",
            "label": "exactly `0` or `1`",
        },
        "dense": dense,
        "dense_transform": {
            "parse": "an optional sign (`-` or `+`) and 1 to 18 decimal digits, as a signed 64-bit integer v",
            "transform": "float32(log1p(max(float32(v), 0))): the natural log of 1 + v in float32, negatives clamped to 0",
            "missing": "an empty field enters the model as 0.0",
        },
        "categorical": categorical,
        "hash": {
            "value": "the field's bytes (1 to 16 hex digits, either case) read as a hexadecimal unsigned 64-bit integer v; \
                      `68fd1e64` is v = 0x68fd1e64",
            "mix64": {
                "steps": "x ^= x >> 33; x = x * m1 mod 2^64; x ^= x >> 33; x = x * m2 mod 2^64; x ^= x >> 33",
                "m1": hex(0xff51_afd7_ed55_8ccd),
                "m2": hex(0xc4ce_b9fe_1a85_ec53),
            },
            "hash_seed": hash_seed,
            "field_seed": {
                "formula": "mix64(hash_seed ^ mix64(golden ^ f)), f the 0-based index of the categorical field (C1 is 0)",
                "golden": hex(0x9e37_79b9_7f4a_7c15),
            },
            "bucket": "(mix64(v ^ field_seed) * rows) >> 64, the product taken in 128 bits: a row in 0..rows",
        },
        "missing": "an empty categorical field is an empty bag: it adds no row (its pooled vector and first-order \
                    weight are zero)",
        "pooling": "sum of the rows of a field's ids (a Criteo field has at most one id)",
        "bad_records": "a line with another field count, another label, a dense field that is not an integer or a \
                        categorical field that is not 1 to 16 hex digits is malformed and not scored",
    });
    if own < names.sparse.len() {
        section["crosses"] = json!({
            "fields": names.sparse[own..],
            "note": "feature crosses of field pairs: the checkpoint does not record which pairs, so they cannot be rebuilt from here",
        });
    }
    section
}
