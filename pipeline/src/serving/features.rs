//! The `features` section of `model.json`: how a raw record becomes the model's input.
//!
//! The checkpoint's feature pipeline (`pipeline` in `model.json`) records the
//! format, `--hash-seed`, `--max-len` and the crosses; this section spells the
//! featurization out for a reader in another language, completely (the bytes
//! hashed, the hash functions with their constants, the per-field seeds, the
//! reduction to a row, dense transforms, histories, missing values and
//! malformed records), for five formats: Criteo TSV (a Criteo-shaped model, see
//! [`super::names::is_criteo_shaped`], of `criteo` data or of a checkpoint
//! that records no pipeline), Avazu CSV (`avazu`), the DIEN sample format
//! (`amazon-dien`), feature-spec records (`csv`, `taobao-ad`: every column's
//! role, transform and table from the recorded spec, vocabularies inlined) and
//! the featurized rows of Parquet files (`parquet`: the columns by name).
//! `scripts/reference_scorer.py` rebuilds all of them. Any other format gets its name,
//! a note, the table sizes and the seed (its spec is in `pipeline`).
//!
//! Feature crosses are spelled out in any format's section (`crosses`: the
//! field pairs, the cross hash with its constants, the rows) when the
//! checkpoint records its pipeline; a checkpoint that records none cannot say
//! which pairs were crossed, and the section says so.
//!
//! Every 64-bit constant is written as a `0x`-prefixed hex string, which every
//! JSON reader keeps exact.

use super::names::{crosses, InputNames};
use crate::feature_pipeline::FeaturePipeline;
use crate::TrainSettings;
use serde_json::{json, Value};
use tiderec_operators::features::cross::{CROSS_ROTATE, CROSS_SALT, MAX_PAIRS};
use tiderec_operators::features::field_seed;
use tiderec_operators::spec::{delimiter_byte, Encoding, FeatureSpec, Pooling, AVAZU_COLUMNS};
use tiderec_operators::train::TrainerConfig;
use tiderec_sources::amazon::{HISTORY_DELIMITER, NUM_COLUMNS, SEQUENCE_TABLES};
use tiderec_sources::criteo::{MIN_FIELDS, NUM_FIELDS};
use tiderec_sources::parquet::schema::{GROUP_COLUMN, LINE_START_COLUMN};
use tiderec_sources::parquet::{SchemaDescription, SparseKind};

/// The MurmurHash3 finaliser's multipliers (`tiderec_operators::features::mix64`).
const MIX64_M1: u64 = 0xff51_afd7_ed55_8ccd;
const MIX64_M2: u64 = 0xc4ce_b9fe_1a85_ec53;
/// The constant of `field_seed`.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The byte a spec's delimiter stands for, as a one-character string (`"\\t"` as written in
/// a spec is a TAB); a validated spec has no other.
fn delimiter_text(written: &str) -> String {
    delimiter_byte(written).map_or_else(|| written.to_string(), |b| char::from(b).to_string())
}

fn hex(v: u64) -> String {
    format!("{v:#018x}")
}

/// The `features` section for a served model with input names `names`, trained on records
/// of `pipeline` (`None`: an older checkpoint that records none).
pub fn feature_pipeline(config: &TrainerConfig, pipeline: Option<&FeaturePipeline>, names: &InputNames) -> Value {
    let hash_seed = pipeline.map_or(config.seed, |p| p.hash.seed);
    let mut section = match pipeline {
        _ if names.criteo && pipeline.is_none_or(|p| p.format == "criteo") => criteo(config, hash_seed, names),
        Some(p) if p.format == "amazon-dien" => amazon_dien(config, p, names),
        Some(p) if p.format == "avazu" => avazu(config, p, names),
        Some(FeaturePipeline { format, parquet: Some(d), hash, .. }) if format == "parquet" => {
            parquet_rows(d, hash.seed, names)
        }
        Some(FeaturePipeline { format, spec: Some(spec), hash, .. }) if format == "csv" || format == "taobao-ad" => {
            spec_records(format, &spec.fields, hash.seed, names)
        }
        Some(p) => json!({
            "format": p.format,
            "note": unspelled(&p.format),
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
    };
    if crosses(&config.model) > 0 {
        section["crosses"] = crosses_section(pipeline, names, crosses(&config.model));
    }
    section
}

/// Why the records of `format` are not spelled out.
fn unspelled(format: &str) -> String {
    let why = match format {
        "parquet" => "Parquet files of an older checkpoint, which records no schema",
        "synthetic" | "synthetic-behavior" => "generated samples have no records to read",
        "taobao-behavior" => "its samples are derived from a whole behaviour log by a dataflow, not record by record",
        _ => "this format is not spelled out",
    };
    format!(
        "records are spelled out for criteo, avazu, amazon-dien, feature-spec (csv, taobao-ad) and parquet data; {why} \
         (`pipeline` records how they were featurized)"
    )
}

/// The steps of `mix64` (the MurmurHash3 finaliser) with its constants.
pub(super) fn mix64_steps() -> Value {
    json!({
        "steps": "x ^= x >> 33; x = x * m1 mod 2^64; x ^= x >> 33; x = x * m2 mod 2^64; x ^= x >> 33",
        "m1": hex(MIX64_M1),
        "m2": hex(MIX64_M2),
    })
}

/// `mix64` and `field_seed` with their constants.
fn mix64_section(hash_seed: u64) -> Value {
    json!({
        "mix64": mix64_steps(),
        "hash_seed": hash_seed,
        "field_seed": {
            "formula": "field_seed(s, i) = mix64(s ^ mix64(golden ^ i)), i a 0-based index",
            "golden": hex(GOLDEN),
        },
    })
}

/// The crosses appended after the data's sparse fields: which pairs, and how a cross id is made.
fn crosses_section(pipeline: Option<&FeaturePipeline>, names: &InputNames, count: usize) -> Value {
    let cross_names = &names.sparse[names.sparse.len() - count..];
    let Some(p) = pipeline.filter(|p| p.crosses.len() == cross_names.len()) else {
        return json!({
            "fields": cross_names,
            "note": "the checkpoint records no feature pipeline, so which field pairs were crossed is unknown: \
                     the crosses cannot be rebuilt from here",
        });
    };
    let pairs: Vec<Value> = p
        .crosses
        .iter()
        .zip(cross_names)
        .map(|(&(a, b), name)| json!({"field": name, "a": names.sparse[a], "b": names.sparse[b]}))
        .collect();
    json!({
        "fields": cross_names,
        "pairs": p.crosses,
        "named": pairs,
        "rows": p.cross_buckets.unwrap_or(1),
        "max_pairs": MAX_PAIRS,
        "ids": "a cross of fields a and b (0-based indices among the data's sparse fields) pairs every row id x of \
                field a with every row id y of field b (the ids after hashing into the fields' tables), x outer and \
                y inner in bag order, at most max_pairs per record; a missing value on either side gives no cross \
                id (an empty bag)",
        "hash": {
            "formula": "id = (mix64(v ^ s_c) * rows) >> 64 with v = mix64(x) ^ rotl64(y, rotate) and \
                        s_c = field_seed(hash_seed ^ salt, c), c the 0-based index of the cross; the product is \
                        taken in 128 bits",
            "salt": hex(CROSS_SALT),
            "rotate": CROSS_ROTATE,
        },
        "model": "a cross is a sparse field of the wide part only: its first_order.<cross> weights enter the \
                  first_order term; it has no factor",
    })
}

/// The tables of the data's own sparse fields, each with its rows and its hashing seed.
fn token_tables(config: &TrainerConfig, names: &InputNames, hash_seed: u64) -> Vec<Value> {
    let own = names.sparse.len() - crosses(&config.model);
    (0..own)
        .map(|t| {
            json!({
                "name": names.sparse[t],
                "table": t,
                "rows": config.table_sizes[t],
                "seed": hex(field_seed(hash_seed, t)),
            })
        })
        .collect()
}

/// The XXH3 token hash of the byte formats (`records/src/features/fused.rs`).
fn token_hash(hash_seed: u64) -> Value {
    let mut hash = mix64_section(hash_seed);
    hash["function"] = json!("xxh3_64_with_seed");
    hash["token_hash"] = json!(
        "h = XXH3_64bits_withSeed(token, table_seed) of xxHash 0.8 (the 64-bit XXH3 hash, its default secret), \
         over the token's raw bytes"
    );
    hash["table_seed"] = json!("field_seed(hash_seed, t), t the 0-based table index (tables[t].seed)");
    hash["bucket"] = json!("row = (h * rows) >> 64, the product taken in 128 bits: a row in 0..rows");
    hash
}

/// Avazu CSV (`sources/src/avazu.rs`): 21 categorical columns and the hour of day.
fn avazu(config: &TrainerConfig, p: &FeaturePipeline, names: &InputNames) -> Value {
    let hour_column = 2;
    let own = names.sparse.len() - crosses(&config.model);
    let categorical: Vec<Value> = (0..own)
        .map(|f| {
            let column = if f + 1 == own { hour_column } else { 3 + f };
            json!({"name": names.sparse[f], "column": column, "table": f})
        })
        .collect();
    json!({
        "format": "avazu",
        "record": {
            "separator": ",",
            "columns": AVAZU_COLUMNS,
            "columns_count": AVAZU_COLUMNS.len(),
            "label_column": 1,
            "label": "exactly `0` or `1`",
            "header_prefix": "id,",
            "header": "a file's first line starting with `id,` is its header, not a record",
            "line_end": "LF; a CR before it is dropped; a missing final newline is fine; an empty line is no record",
            "unlabeled": "a line without the label column (column 1) is featurized as the same line with a `0` there",
        },
        "dense": [{
            "name": names.dense.first(),
            "column": hour_column,
            "transform": "hour is YYMMDDHH, exactly 8 ASCII digits with HH ≤ 23; the feature is float32(HH) / 23 in \
                          float32",
        }],
        "tables": token_tables(config, names, p.hash.seed),
        "categorical": categorical,
        "categorical_values": "columns C1 … C21 (3 to 23): the value's raw bytes, an empty value an empty bag; \
                               hour_of_day: the one byte HH (0 to 23), never missing",
        "hash": token_hash(p.hash.seed),
        "pooling": "sum of the rows of a field's ids (a field has at most one id)",
        "bad_records": "a line without exactly 24 comma-separated fields (23 unlabeled), with another label, or \
                        whose hour is not YYMMDDHH is malformed and not scored; `id` is not read",
    })
}

/// The records of a feature spec (`records/src/spec.rs`, `SpecFormat`).
fn spec_records(format: &str, spec: &FeatureSpec, hash_seed: u64, names: &InputNames) -> Value {
    let column = |c: &str| spec.columns.iter().position(|x| x == c);
    let nc = spec.categorical.len();
    let dense: Vec<Value> = spec
        .dense
        .iter()
        .enumerate()
        .map(|(j, d)| {
            json!({
                "name": names.dense[j],
                "column": column(&d.column),
                "clamp": d.clamp,
                "log1p": d.log1p,
                "scale": d.fitted_scale().map(|(center, width)| json!({"center": center, "width": width})),
            })
        })
        .collect();
    let numeric: Vec<Value> = spec
        .numeric_list
        .iter()
        .enumerate()
        .map(|(k, n)| {
            json!({
                "name": names.dense[spec.dense.len() + k],
                "column": column(&n.column),
                "delimiter": delimiter_text(&n.delimiter),
                "reduce": n.reduce,
            })
        })
        .collect();
    let categorical: Vec<Value> = spec
        .categorical
        .iter()
        .enumerate()
        .map(|(f, c)| {
            let mut v = json!({
                "name": names.sparse[f],
                "column": column(&c.column),
                "table": f,
                "rows": c.buckets,
                "encoding": c.encoding,
                "seed_index": f,
                "seed": hex(field_seed(hash_seed, f)),
                "oov_buckets": c.oov_buckets,
            });
            if let Some(b) = &c.boundaries {
                v["boundaries"] = json!(b);
            }
            if c.encoding == Encoding::Vocabulary {
                match c.vocabulary.as_ref().map(|voc| voc.load(&format!("categorical[{f}].vocabulary"))) {
                    Some(Ok(map)) => {
                        let mut tokens: Vec<(&Vec<u8>, &u64)> = map.iter().collect();
                        tokens.sort_by_key(|&(_, &id)| id);
                        let text: Option<Vec<&str>> = tokens.iter().map(|(t, _)| std::str::from_utf8(t).ok()).collect();
                        match text {
                            Some(text) => v["vocabulary"] = json!(text),
                            None => v["note"] = json!("the vocabulary holds tokens that are not UTF-8 text"),
                        }
                    }
                    Some(Err(e)) => v["note"] = json!(format!("the vocabulary could not be read at export: {e}")),
                    None => v["note"] = json!("no vocabulary recorded"),
                }
            }
            v
        })
        .collect();
    let (mut pooled, mut sequences) = (0, 0);
    let lists: Vec<Value> = spec
        .list
        .iter()
        .map(|l| {
            let seed_index = match &l.target {
                Some(t) => spec.categorical.iter().position(|c| &c.column == t).unwrap_or(0),
                None => nc + pooled,
            };
            let (slot, name) = if l.pooling == Pooling::None {
                sequences += 1;
                (sequences - 1, names.sequences.get(sequences - 1).cloned().unwrap_or_else(|| l.column.clone()))
            } else {
                pooled += 1;
                (nc + pooled - 1, names.sparse[nc + pooled - 1].clone())
            };
            json!({
                "name": name,
                "column": column(&l.column),
                "delimiter": delimiter_text(&l.delimiter),
                "max_len": l.max_len,
                "rows": l.buckets,
                "pooling": l.pooling,
                "target": l.target,
                "slot": slot,
                "seed_index": seed_index,
                "seed": hex(field_seed(hash_seed, seed_index)),
            })
        })
        .collect();
    let separator = delimiter_text(&spec.delimiter);
    json!({
        "format": format,
        "record": {
            "separator": separator,
            "columns": spec.columns,
            "label_column": column(&spec.label.column),
            "label": "exactly `0` or `1`",
            "header": spec.header,
            "header_rule": "with `header`, a file's first line starting with columns[0] (for unlabeled files: or doing \
                            so once the label column's name is inserted) is its header, not a record",
            "line_end": "LF; a CR before it is dropped; a missing final newline is fine; an empty line is no record",
            "fields": "the line split on the separator byte (no quoting); exactly one field per column",
            "unlabeled": "a line without the label column is featurized as the same line with a `0` there",
        },
        "dense": dense,
        "dense_rules": "a value is parsed as float32 (Rust's `str::parse::<f32>` syntax: optional sign, digits with an \
                        optional point and exponent, or inf / infinity / nan); empty is 0.0; a value that is not a \
                        number or not finite is a malformed record; then `clamp` to [lo, hi] if given, then \
                        `log1p`: float32 ln(1 + max(x, 0)), then `scale` if given: float32((x - center) / width) in \
                        float32 arithmetic; a non-finite result is a malformed record",
        "numeric_lists": numeric,
        "numeric_list_rules": "the column split on its delimiter, empty tokens skipped, each token parsed as a float32 \
                               (a token that is not a number makes the record malformed); the values summed in \
                               float64 in order; `sum`: float32(sum), `mean`: float32(sum / n), 0.0 without a value; \
                               a non-finite result is a malformed record. Numeric lists come after the dense columns",
        "categorical": categorical,
        "categorical_rules": "an empty value is an empty bag. `hash`: row = bucket(token, seed, rows). `identity`: the \
                              value is a decimal integer (optional sign, 1 to 18 digits) in 0..rows, else the record is \
                              malformed. `vocabulary`: token k of `vocabulary` is row k; another token is row \
                              len(vocabulary) + bucket(token, seed, oov_buckets), or an empty bag without oov buckets. \
                              `bucketize` and `quantile`: the value parsed as a float32 as dense values are (not a \
                              finite number: the record is malformed); row = the number of `boundaries` at or below it",
        "lists": lists,
        "list_rules": "`sum` and `mean` lists: the column split on its one-byte delimiter, empty tokens \
                       dropped, the first max_len tokens kept, each hashed: row = bucket(token, seed, rows); they \
                       are sparse fields after the categorical ones (`slot`: the field's index); a `mean` list \
                       weighs each of its n rows float32(1 / n). `none` lists are sequences (`slot`: the \
                       sequence's index), hashed like their `target` field (its seed and rows: one table), and are \
                       read together, position by position: each column split on its delimiter into positions (k \
                       delimiters give k + 1, an empty column none); all of them must have one number of \
                       positions, else the record is malformed; a position where any of them has an empty token is \
                       skipped in all; the first max_len positions left are kept",
        "hash": token_hash(hash_seed),
        "bucket": "bucket(token, seed, n) = (XXH3_64bits_withSeed(token, seed) * n) >> 64; each item's seed is \
                   field_seed(hash_seed, seed_index)",
    })
}

/// The DIEN sample format (`sources/src/amazon.rs`, `records/src/features/fused.rs`).
fn amazon_dien(config: &TrainerConfig, p: &FeaturePipeline, names: &InputNames) -> Value {
    let hash_seed = p.hash.seed;
    let max_len = p.max_len.unwrap_or(TrainSettings::default().data.max_len);
    let own = names.sparse.len() - crosses(&config.model);
    let categorical: Vec<Value> =
        (0..own).map(|f| json!({"name": names.sparse[f], "column": 1 + f, "table": f})).collect();
    let sequences: Vec<Value> = SEQUENCE_TABLES
        .iter()
        .enumerate()
        .map(|(s, &t)| {
            let name = names.sequences.get(s).cloned().unwrap_or_else(|| format!("{}_history", names.sparse[t]));
            json!({"name": name, "column": 1 + own + s, "table": t, "read_by_model": s < names.sequences.len()})
        })
        .collect();
    json!({
        "format": "amazon-dien",
        "record": {
            "separator": "\t",
            "columns": ["label", "user", "item", "category", "item_history", "category_history"],
            "columns_count": NUM_COLUMNS,
            "history_delimiter": format!("{HISTORY_DELIMITER:#04x}"),
            "line_end": "LF; a CR before it is dropped; a missing final newline is fine; an empty line is no record",
            "label": "exactly `0` or `1`",
            "unlabeled": "a line without the label column is featurized as the same line with a `0` label",
        },
        "tables": token_tables(config, names, hash_seed),
        "categorical": categorical,
        "sequences": sequences,
        "max_len": max_len,
        "histories": "the two histories are one list of events (token k of each is event k): each is split on the \
                      delimiter byte as bytes (k delimiters give k + 1 tokens); an event whose item or category token \
                      is empty is skipped in both; an empty history is an empty sequence; of the n events left, the \
                      last max_len (the most recent) are kept, in order, oldest first",
        "hash": token_hash(hash_seed),
        "missing": "an empty user, item or category value is an empty bag: it adds no row (its pooled vector is zero)",
        "pooling": "sum of the rows of a field's ids (a field has at most one id)",
        "bad_records": "a line without exactly 6 TAB-separated fields, with another label, or whose two histories hold \
                        different numbers of delimiters (or one is empty and the other not) is malformed and not \
                        scored",
    })
}

/// The featurized rows of Parquet files (`tiderec convert`, `sources/src/parquet`): columns,
/// not bytes, so nothing is hashed but the crosses.
fn parquet_rows(d: &SchemaDescription, hash_seed: u64, names: &InputNames) -> Value {
    let sparse: Vec<Value> = d
        .sparse
        .iter()
        .enumerate()
        .map(|(f, c)| {
            let kind = match c.kind {
                SparseKind::Single => "single",
                SparseKind::List => "list",
            };
            json!({"name": c.name, "column": c.name, "field": names.sparse.get(f), "kind": kind, "rows": c.table_size})
        })
        .collect();
    let sequences: Vec<Value> = d
        .sequences
        .iter()
        .enumerate()
        .map(|(s, q)| {
            json!({
                "name": q.name,
                "column": q.name,
                "table": q.table,
                "target": q.target,
                "read_by_model": s < names.sequences.len(),
            })
        })
        .collect();
    json!({
        "format": "parquet",
        "converted_from": d.format,
        "rows": "one record per Parquet row, featurized when the files were written: the columns hold the model's \
                 inputs, not raw values; a reader takes them by name (e.g. pyarrow) in file order, rows numbered from \
                 0 within each file",
        "label": {"column": d.label, "type": "float32, 1 a click"},
        "dense": d.dense.iter().map(|n| json!({"name": n, "column": n, "type": "float32, as stored"})).collect::<Vec<_>>(),
        "sparse": sparse,
        "sparse_values": "a `single` column holds one uint64 row id or null (an empty bag); a `list` column a list of \
                          uint64 row ids (a bag, summed); every id is below its field's rows",
        "sequences": sequences,
        "sequence_values": "a list of uint64 row ids of field `table`'s table, oldest first, used as stored",
        "other_columns": format!("`{LINE_START_COLUMN}` (a row's source position) and `{GROUP_COLUMN}` (its user's key) are no features"),
        "hash": mix64_section(hash_seed),
    })
}

/// The Criteo TSV featurization (`sources/src/criteo.rs`, `records/src/features`).
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
    let mut hash = mix64_section(hash_seed);
    hash["value"] = json!(
        "the field's bytes (1 to 16 hex digits, either case) read as a hexadecimal unsigned 64-bit integer v; \
         `68fd1e64` is v = 0x68fd1e64"
    );
    hash["bucket"] = json!(
        "row = (mix64(v ^ field_seed(hash_seed, f)) * rows) >> 64, f the categorical field's 0-based index (C1 is \
         0), the product taken in 128 bits: a row in 0..rows"
    );
    json!({
        "format": "criteo-tsv",
        "inferred": "from the checkpoint's feature pipeline (`criteo`) or, when it records none, from the model's \
                     shape (13 dense, 26 sparse fields)",
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
        "hash": hash,
        "missing": "an empty categorical field is an empty bag: it adds no row (its pooled vector and first-order \
                    weight are zero)",
        "pooling": "sum of the rows of a field's ids (a Criteo field has at most one id)",
        "bad_records": "a line with another field count, another label, a dense field that is not an integer or a \
                        categorical field that is not 1 to 16 hex digits is malformed and not scored",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiderec_operators::features::cross::cross_id;
    use tiderec_operators::features::{hash_bucket, mix64};

    /// `mix64` as the section spells it, from the section's constants.
    fn spelled_mix64(mut x: u64) -> u64 {
        x ^= x >> 33;
        x = x.wrapping_mul(MIX64_M1);
        x ^= x >> 33;
        x = x.wrapping_mul(MIX64_M2);
        x ^ (x >> 33)
    }

    /// The hashes as spelled out (constants and formulas) are the ones the readers use.
    #[test]
    fn spelled_out_hashes_equal_the_readers() {
        let spelled_seed = |s: u64, i: u64| spelled_mix64(s ^ spelled_mix64(GOLDEN ^ i));
        let spelled_bucket =
            |seed: u64, v: u64, rows: u64| ((spelled_mix64(v ^ seed) as u128 * rows as u128) >> 64) as u64;
        for (i, &v) in [0u64, 1, 0x68fd_1e64, u64::MAX, 0x1234_5678_9abc_def0].iter().enumerate() {
            assert_eq!(spelled_mix64(v), mix64(v));
            assert_eq!(spelled_seed(v, i as u64), field_seed(v, i));
            assert_eq!(spelled_bucket(field_seed(42, i), v, 1000), hash_bucket(field_seed(42, i), v, 1000));
            let (x, y) = (v % 977, v.rotate_left(7) % 3001);
            let spelled_cross = spelled_bucket(
                spelled_seed(42 ^ CROSS_SALT, i as u64),
                spelled_mix64(x) ^ y.rotate_left(CROSS_ROTATE),
                500,
            );
            assert_eq!(spelled_cross, cross_id(42, i, x, y, 500));
        }
    }
}
