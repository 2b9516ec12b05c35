//! Seed corpora: slices of the real data samples (read from the data
//! directory at run time, never copied into the repository) and inputs made
//! by the code itself where no sample exists (JSON records, Parquet files,
//! checkpoints, feature specs, elm lines).

use std::path::{Path, PathBuf};

/// The data directory: `../shared/data` relative to the repository.
pub fn default_data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data")
}

/// Lines per seed cut from a data file.
const LINES_PER_SEED: usize = 4;
/// Seeds cut from one data file.
const SEEDS_PER_FILE: usize = 8;

/// Seeds cut from `data/rel`: the first lines in groups of [`LINES_PER_SEED`]
/// (the header, if any, starts the first seed).
fn file_seeds(data: &Path, rel: &str) -> Result<Vec<Vec<u8>>, String> {
    let path = data.join(rel);
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let lines: Vec<&[u8]> = bytes.split_inclusive(|&b| b == b'\n').take(LINES_PER_SEED * SEEDS_PER_FILE).collect();
    Ok(lines.chunks(LINES_PER_SEED).map(|c| c.concat()).collect())
}

fn files(data: &Path, rels: &[&str]) -> Result<Vec<Vec<u8>>, String> {
    let mut seeds = Vec::new();
    for rel in rels {
        seeds.extend(file_seeds(data, rel)?);
    }
    Ok(seeds)
}

/// Lines of the elm generator (no elm sample exists).
fn elm_seeds() -> Vec<Vec<u8>> {
    (0..SEEDS_PER_FILE as u64)
        .map(|s| {
            let mut out = Vec::new();
            for i in 0..2 {
                tiderec_sources::elm::elm_line(s, i, 1, &mut out);
                out.push(b'\n');
            }
            out
        })
        .collect()
}

/// JSON records of Criteo lines, plus hand-made objects.
/// Request bodies of `tiderec serve`: arrays, NDJSON, one object, many records, non-finite
/// numbers and bytes that are not UTF-8.
fn body_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = vec![
        br#"[{"I1": 3, "C1": "68fd1e64"}, {"line": "0\t1\t2"}]"#.to_vec(),
        b"{\"I1\": 1}\r\n\n{\"I2\": 1e999}\n  \n{\"price\": -Infinity}\n".to_vec(),
        br#"  {"a": NaN, "b": [1, 2, {"c": null}]}  "#.to_vec(),
        b"[\xff\xfe, {\"x\": \"\xc3\x28\"}]\n\x80\x81".to_vec(),
        b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]".to_vec(),
        b"42".to_vec(),
        b"[]".to_vec(),
    ];
    let mut many = b"[{}".to_vec();
    many.extend(b",{}".repeat(5000));
    many.push(b']');
    seeds.push(many);
    seeds.push(b"{}\n".repeat(5000));
    seeds
}

/// Chunked request bodies of `tiderec serve`: extensions, trailers, many small chunks, sizes
/// over the limits, and malformed size lines.
fn chunked_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = vec![
        b"5\r\nhello\r\n0\r\n\r\n".to_vec(),
        b"1a;name=\"v\"\r\nabcdefghijklmnopqrstuvwxyz\r\n000\r\nTrailer: x\r\n\r\nGET / HTTP/1.1\r\n".to_vec(),
        b"FFFFFFFFFFFFFFFFF\r\n".to_vec(),
        b"1000\r\n".to_vec(),
        b"zz\r\n".to_vec(),
        b"5\nhello\n0\n\n".to_vec(),
        b"0\r\nno colon\r\n\r\n".to_vec(),
    ];
    let mut many = b"1\r\nx\r\n".repeat(600);
    many.extend_from_slice(b"0\r\n\r\n");
    seeds.push(many);
    let mut big = b"7FF \t;e\r\n".to_vec();
    big.extend(std::iter::repeat_n(b'{', 0x7ff));
    big.extend_from_slice(b"\r\n0\r\n\r\n");
    seeds.push(big);
    seeds
}

fn json_seeds(data: &Path) -> Result<Vec<Vec<u8>>, String> {
    let mut seeds: Vec<Vec<u8>> = vec![
        br#"{"label": 1, "I1": 5, "C1": "", "C3": null, "C26": "0a", "extra": [1]}"#.to_vec(),
        br#"{"label": 0, "I13": -3, "C2": "68fd1e64"}"#.to_vec(),
    ];
    for chunk in file_seeds(data, "criteo/sample_train.txt")? {
        let mut s = Vec::new();
        for line in chunk.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            if let Some(json) = tiderec_sources::json::criteo_line_to_json(line) {
                s.extend_from_slice(json.as_bytes());
                s.push(b'\n');
            }
        }
        seeds.push(s);
    }
    Ok(seeds)
}

/// Parquet files written by the crate's writer: Criteo samples (several row
/// groups), DIEN samples (sequence columns) and the Criteo samples as a line
/// source (each row's `_line_start`, as `convert` writes it).
fn parquet_seeds(data: &Path) -> Result<Vec<Vec<u8>>, String> {
    use tiderec_operators::format::LineFormat;
    use tiderec_operators::Batch;
    use tiderec_sources::parquet::schema::LineSource;
    use tiderec_sources::parquet::{ParquetWriter, SchemaDescription, WriterOptions};
    let mut seeds = Vec::new();
    let criteo = tiderec_sources::criteo::CriteoFormat::new(tiderec_sources::criteo::CriteoFeatures::uniform(1000, 7))
        .map_err(|e| e.to_string())?;
    let amazon =
        tiderec_sources::amazon::AmazonDienFormat::new(&[1000, 5000, 100], 7, 20).map_err(|e| e.to_string())?;
    let cases: [(&dyn LineFormat, &str, SchemaDescription, bool); 3] = [
        (&criteo, "criteo/sample_train.txt", SchemaDescription::criteo(&[1000; 26], 7), false),
        (&amazon, "amazon_dien/local_test", SchemaDescription::behavior("amazon-dien", &[1000, 5000, 100], 7), false),
        (&criteo, "criteo/sample_train.txt", SchemaDescription::criteo(&[1000; 26], 7), true),
    ];
    for (format, rel, mut description, lines) in cases {
        let (d, s) = format.shape();
        let mut batch = Batch::with_sequences(d, s, format.num_sequences());
        // Each parsed row's line start in the chunks as one input.
        let (mut starts, mut at) = (Vec::new(), 0u64);
        for chunk in file_seeds(data, rel)?.iter().take(3) {
            for line in chunk.split_inclusive(|&b| b == b'\n') {
                let before = batch.len();
                let text = line.strip_suffix(b"\n").unwrap_or(line);
                if !text.is_empty() {
                    let _ = format.parse(text, &mut batch);
                }
                starts.extend(std::iter::repeat_n(at, batch.len() - before));
                at += line.len() as u64;
            }
        }
        if lines {
            description.lines = Some(LineSource { file_bytes: vec![at] });
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let options = WriterOptions { row_group_rows: 4, rows_per_file: None, zstd_level: 1 };
        let mut writer = ParquetWriter::create(dir.path(), description, options).map_err(|e| e.to_string())?;
        match lines {
            true => writer.write_with_line_starts(&batch, &starts),
            false => writer.write(&batch),
        }
        .map_err(|e| e.to_string())?;
        writer.finish().map_err(|e| e.to_string())?;
        for entry in std::fs::read_dir(dir.path()).map_err(|e| e.to_string())? {
            let path = entry.map_err(|e| e.to_string())?.path();
            seeds.push(std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?);
        }
    }
    Ok(seeds)
}

/// Run settings files: a valid one, and non-finite and out-of-range values of each kind of
/// numeric setting (float, optional float, count, list of counts, duration).
fn settings_seeds() -> Vec<Vec<u8>> {
    [
        "model = \"deepfm\"\ndim = 8\ndeep = [32, 16]\nlr = 0.01\nbatch_size = 256\nconnect_timeout = 5.5\n\
         table_sizes = [10, 20]\nmax_bad_fraction = 0.5\nstore = \"tiered\"\nhot_rows = 100\n",
        "lr = nan\n",
        "sparse_lr = inf\n",
        "l2_dense = -inf\n",
        "eval_fraction = 1.0\n",
        "connect_timeout = 1e300\n",
        "batch_size = 0\n",
        "workers = 30000\n",
        "table_sizes = [1, 0]\n",
        "bottom = [64, 18446744073709551615]\n",
        "admit_prob = 0.0\nmax_rows = -1\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

/// Every preset as TOML, and a hand-made spec using every kind of column.
fn spec_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = tiderec_operators::spec::FeatureSpec::PRESETS
        .iter()
        .filter_map(|name| tiderec_operators::spec::FeatureSpec::preset(name, 1000, 20))
        .map(|s| s.to_toml().into_bytes())
        .collect();
    seeds.push(
        br#"delimiter = ","
header = true
columns = ["y", "price", "prices", "user", "items", "city"]
label = { column = "y" }

[[dense]]
column = "price"
log1p = true
clamp = [0.0, 100.0]

[[numeric_list]]
column = "prices"
delimiter = ";"
reduce = "mean"

[[categorical]]
column = "user"
buckets = 100

[[categorical]]
column = "city"
buckets = 10
encoding = "vocabulary"
vocabulary = ["paris", "rome"]
oov_buckets = 2

[[list]]
column = "items"
delimiter = ";"
buckets = 50
max_len = 5
pooling = "mean"
"#
        .to_vec(),
    );
    seeds
}

/// The seeds of target `name` (see [`crate::targets::TARGETS`]); an error
/// names a missing data file.
pub fn seeds(name: &str, data: &Path) -> Result<Vec<Vec<u8>>, String> {
    match name {
        "criteo_tsv" => files(
            data,
            &["criteo/sample_train.txt", "criteo/part-0", "criteo_1tb/day_0.part.txt", "criteo/criteo_sample.txt"],
        ),
        "avazu_csv" | "csv_avazu" => files(data, &["avazu/train", "avazu/test", "avazu/avazu_sample.txt"]),
        "csv_criteo" => files(data, &["criteo/sample_train.txt", "criteo_1tb/day_0.part.txt"]),
        "csv_elm" | "csv_elm_dien" => Ok(elm_seeds()),
        "taobao_ad" => files(data, &["taobao_ad/train_sample.csv", "taobao_ad/test_sample.csv"]),
        "taobao_behavior" => files(data, &["taobao_user_behavior/UserBehavior.csv"]),
        "amazon_dien" => files(data, &["amazon_dien/local_test", "amazon_dien/local_train"]),
        "json_records" => json_seeds(data),
        "serve_request_body" => Ok(body_seeds()),
        "serve_chunked_body" => Ok(chunked_seeds()),
        "parquet" => parquet_seeds(data),
        "checkpoint_manifest" => Ok(crate::checkpoint::manifest_seeds()),
        "checkpoint_tensors" => Ok(crate::checkpoint::tensor_seeds()),
        "feature_spec_toml" => Ok(spec_seeds()),
        "train_settings_toml" => Ok(settings_seeds()),
        "tiered_hot_tier" => Ok(crate::stores::seeds()),
        other => Err(format!("no target `{other}`")),
    }
}

/// Whether target `name`'s seeds come from the data directory.
pub fn needs_data(name: &str) -> bool {
    !matches!(
        name,
        "csv_elm"
            | "csv_elm_dien"
            | "serve_request_body"
            | "serve_chunked_body"
            | "checkpoint_manifest"
            | "checkpoint_tensors"
            | "tiered_hot_tier"
            | "feature_spec_toml"
            | "train_settings_toml"
    )
}
