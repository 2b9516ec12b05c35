//! The fuzz targets: one `fn(&[u8])` per reader, driving its public entry
//! point the way the `tiderec` binary does and asserting its invariants.
//!
//! Invariants checked (a violated one panics, which the driver reports as a crash):
//! * no panic, hang or abort, whatever the bytes;
//! * line readers: every non-empty line (one trailing `\r` dropped, a
//!   first-line header excluded) is either a record of the batch or a
//!   counted bad record, over any worker count and over the two spans of a
//!   held-out fraction; `lines_read` is their sum; every id is below its table;
//!   each dead letter names the 1-based line and byte offset where its raw
//!   bytes are; under `fail` the reader stops with the first of them as a
//!   typed [`SourceError::BadRecord`]; the batch passes [`Batch::check`];
//! * record parsers: a record either appends exactly one sample or nothing;
//! * serve's chunked bodies: within the limit and the memory accepted, and a
//!   decoded body chunked again decodes to itself
//! * serve's request bodies: records are ordered, non-blank, disjoint ranges
//!   of the body, never more than the cap;
//! * Parquet and checkpoints: bad bytes are typed errors (or skip reasons),
//!   and what loads has consistent shapes;
//! * run settings: a file with a non-finite number is refused, and what loads passes
//!   every setting's range.
//!
//! Scratch files live in one temporary directory per thread.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tiderec_operators::bad_record::{BadRecord, BadRecordPolicy, DeadLetterSink};
use tiderec_operators::format::LineFormat;
use tiderec_operators::spec::{FeatureSpec, SpecFormat, Vocabulary};
use tiderec_operators::Batch;
use tiderec_sources::lines::{LineReader, ReaderOptions, MAX_RAW_BYTES};
use tiderec_sources::SourceError;

thread_local! {
    static SCRATCH: tempfile::TempDir = tempfile::Builder::new()
        .prefix("tiderec-fuzz-")
        .tempdir()
        .expect("a temporary directory for fuzz inputs");
}

/// This thread's scratch directory.
pub fn scratch() -> PathBuf {
    SCRATCH.with(|d| d.path().to_path_buf())
}

/// Writes `data` to the scratch file `name` and returns its path.
fn scratch_file(name: &str, data: &[u8]) -> PathBuf {
    let path = scratch().join(name);
    std::fs::write(&path, data).expect("write a scratch file");
    path
}

/// A dead-letter sink whose records stay readable after the reader is done.
#[derive(Clone, Default)]
struct SharedDeadLetters(Arc<Mutex<Vec<BadRecord>>>);

impl DeadLetterSink for SharedDeadLetters {
    fn write(&mut self, record: &BadRecord) -> std::io::Result<()> {
        self.0.lock().expect("not poisoned").push(record.clone());
        Ok(())
    }
}

/// Asserts that every id of `batch` is below its table: `sparse` sizes per
/// sparse field, `sequences` per sequence field.
pub fn check_ids(batch: &Batch, sparse: &[u64], sequences: &[u64]) {
    assert_eq!(batch.sparse.len(), sparse.len(), "sparse fields");
    assert_eq!(batch.sequences.len(), sequences.len(), "sequence fields");
    let fields = batch.sparse.iter().zip(sparse).chain(batch.sequences.iter().zip(sequences));
    for (f, (field, &size)) in fields.enumerate() {
        if let Some(id) = field.ids.iter().find(|&&id| id >= size) {
            panic!("field {f}: id {id} is not below its table size {size}");
        }
    }
}

/// The table sizes of a spec's sparse and sequence fields.
pub fn spec_tables(spec: &FeatureSpec) -> (Vec<u64>, Vec<u64>) {
    (spec.table_sizes(), spec.sequence_lists().map(|(_, l)| l.buckets).collect())
}

/// One line of a file: byte offset, bytes without `\n` and one `\r`.
struct Line<'a> {
    offset: usize,
    bytes: &'a [u8],
}

/// The lines of `data` the way line readers see them.
fn lines(data: &[u8]) -> Vec<Line<'_>> {
    let mut out = Vec::new();
    let mut offset = 0;
    for raw in data.split(|&b| b == b'\n') {
        if offset >= data.len() {
            break;
        }
        let bytes = raw.strip_suffix(b"\r").unwrap_or(raw);
        out.push(Line { offset, bytes });
        offset += raw.len() + 1;
    }
    out
}

/// Reads all of `data` with `format` as `workers` readers and checks the
/// line readers' invariants (see the [module docs](self)).
pub fn check_line_reader<F: LineFormat + Clone>(data: &[u8], format: F, tables: (&[u64], &[u64])) {
    let path = scratch_file("input.txt", data);
    let all = lines(data);
    let records: Vec<&Line<'_>> =
        all.iter().filter(|l| !(l.bytes.is_empty() || (l.offset == 0 && format.is_header(l.bytes)))).collect();
    let (num_dense, num_sparse) = format.shape();
    let num_sequences = format.num_sequences();
    let empty = || Batch::with_sequences(num_dense, num_sparse, num_sequences);
    let workers = 1 + data.len() % 3;
    let (mut good, mut bad) = (0u64, 0u64);
    let sink = SharedDeadLetters::default();
    for worker in 0..workers {
        let mut reader = LineReader::open_format(
            std::slice::from_ref(&path),
            (0.0, 1.0),
            worker,
            workers,
            format.clone(),
            ReaderOptions::default(),
            Some(Box::new(sink.clone())),
        )
        .expect("an existing file opens");
        let mut batch = empty();
        let mut appended = 0u64;
        loop {
            match reader.next_batch(&mut batch, 7) {
                Ok(0) => break,
                Ok(n) => appended += n as u64,
                Err(e) => panic!("under `skip` with an in-memory sink the reader failed: {e}"),
            }
        }
        batch.check().unwrap_or_else(|e| panic!("inconsistent batch: {e}"));
        check_ids(&batch, tables.0, tables.1);
        assert_eq!(batch.len() as u64, appended, "records appended vs. batch length");
        let worker_bad = reader.bad_counts().total();
        assert_eq!(reader.lines_read(), appended + worker_bad, "lines_read = good + bad");
        good += appended;
        bad += worker_bad;
    }
    assert_eq!(
        good + bad,
        records.len() as u64,
        "every non-empty line is a record or a bad record ({workers} workers)"
    );
    // The spans `(0, f)` and `(f, 1)` (a held-out fraction) partition the lines too.
    let f = 0.1 + (data.len() % 8) as f64 / 10.0;
    let mut split = 0u64;
    for span in [(0.0, f), (f, 1.0)] {
        let mut reader = LineReader::open_format(
            std::slice::from_ref(&path),
            span,
            0,
            1,
            format.clone(),
            ReaderOptions::default(),
            None,
        )
        .expect("an existing file opens");
        let mut batch = empty();
        loop {
            match reader.next_batch(&mut batch, 64) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => panic!("under `skip` the reader failed: {e}"),
            }
        }
        split += reader.lines_read();
    }
    assert_eq!(split, records.len() as u64, "spans (0, {f}) and ({f}, 1) partition the lines");
    let letters = sink.0.lock().expect("not poisoned").clone();
    assert_eq!(letters.len() as u64, bad, "one dead letter per bad record");
    for r in &letters {
        let line = all
            .get((r.line as usize).wrapping_sub(1))
            .unwrap_or_else(|| panic!("dead letter names line {} of a {}-line file", r.line, all.len()));
        assert_eq!(r.byte_offset, line.offset as u64, "byte offset of line {}", r.line);
        let keep = r.raw.len().min(MAX_RAW_BYTES);
        assert!(
            line.bytes.starts_with(&r.raw) && (r.raw.len() == line.bytes.len() || keep == MAX_RAW_BYTES),
            "dead letter of line {} holds other bytes",
            r.line
        );
    }
    // Under `fail` one reader stops at the first bad line, naming it.
    let mut reader = LineReader::open_format(
        std::slice::from_ref(&path),
        (0.0, 1.0),
        0,
        1,
        format,
        ReaderOptions { policy: BadRecordPolicy::Fail, ..ReaderOptions::default() },
        None,
    )
    .expect("an existing file opens");
    let mut batch = empty();
    let first_bad = loop {
        match reader.next_batch(&mut batch, 64) {
            Ok(0) => break None,
            Ok(_) => {}
            Err(SourceError::BadRecord(r)) => break Some(r),
            Err(e) => panic!("under `fail` the reader failed with something other than a bad record: {e}"),
        }
    };
    let first_letter = letters.iter().min_by_key(|r| r.line);
    assert_eq!(first_bad.as_ref().map(|r| r.line), first_letter.map(|r| r.line), "`fail` stops at the first bad line");
}

/// The Criteo TSV reader (`--data criteo:FILE`).
pub fn criteo_tsv(data: &[u8]) {
    use tiderec_sources::criteo::{CriteoFeatures, CriteoFormat};
    let format = CriteoFormat::new(CriteoFeatures::uniform(1000, 7)).expect("valid features");
    check_line_reader(data, format, (&[1000; 26], &[]));
}

/// The Avazu CSV reader (`--data avazu:FILE`).
pub fn avazu_csv(data: &[u8]) {
    use tiderec_sources::avazu::{AvazuFormat, NUM_SPARSE};
    let format = AvazuFormat::new(vec![1000; NUM_SPARSE], 7).expect("valid table sizes");
    check_line_reader(data, format, (&[1000; NUM_SPARSE], &[]));
}

/// The Amazon reviews DIEN-sample reader (`--data amazon-dien:FILE`).
pub fn amazon_dien(data: &[u8]) {
    use tiderec_sources::amazon::{AmazonDienFormat, SEQUENCE_TABLES};
    let sizes = [1000, 5000, 100];
    let format = AmazonDienFormat::new(&sizes, 7, 20).expect("valid table sizes");
    check_line_reader(data, format, (&sizes, &SEQUENCE_TABLES.map(|t| sizes[t])));
}

/// The CSV feature-spec reader (`--data csv:FILE --spec preset:NAME`) with a preset.
fn csv_preset(data: &[u8], name: &str) {
    let spec = FeatureSpec::preset(name, 1000, 20).expect("a known preset");
    let (sparse, sequences) = spec_tables(&spec);
    check_line_reader(data, SpecFormat::new(spec, 7).expect("presets are valid"), (&sparse, &sequences));
}

/// `csv:` with the `criteo` preset.
pub fn csv_criteo(data: &[u8]) {
    csv_preset(data, "criteo");
}

/// `csv:` with the `avazu` preset.
pub fn csv_avazu(data: &[u8]) {
    csv_preset(data, "avazu");
}

/// `csv:` with the `elm` preset.
pub fn csv_elm(data: &[u8]) {
    csv_preset(data, "elm");
}

/// `csv:` with the `elm_dien` preset (sequence fields).
pub fn csv_elm_dien(data: &[u8]) {
    csv_preset(data, "elm_dien");
}

/// The Taobao display-ad reader (`--data taobao-ad:FILE`: the `taobao_ad` spec).
pub fn taobao_ad(data: &[u8]) {
    csv_preset(data, "taobao_ad");
}

/// The Taobao UserBehavior reader and the DIEN samples derived from it (`--data taobao-behavior:FILE`).
pub fn taobao_behavior(data: &[u8]) {
    use tiderec_operators::behavior::SampleConfig;
    use tiderec_sources::taobao::{derive_samples, read_user_behavior, samples_to_batch};
    let path = scratch_file("behavior.csv", data);
    // A line is a row unless it is empty (`\r\n` included); none is over the limit here.
    let rows = data.split(|&b| b == b'\n').filter(|l| !l.is_empty() && *l != b"\r").count();
    const MAX_LINE: usize = 1 << 30;
    let mut sink = SharedDeadLetters::default();
    let (events, counts) =
        read_user_behavior(std::slice::from_ref(&path), BadRecordPolicy::Skip, MAX_LINE, Some(&mut sink))
            .unwrap_or_else(|e| panic!("under `skip` the reader failed: {e}"));
    assert_eq!(events.len() as u64 + counts.total(), rows as u64, "every non-empty row is an event or a bad record");
    assert_eq!(sink.0.lock().expect("not poisoned").len() as u64, counts.total(), "one dead letter per bad record");
    match read_user_behavior(std::slice::from_ref(&path), BadRecordPolicy::Fail, MAX_LINE, None) {
        Ok((e, c)) => assert!(counts.total() == 0 && c.total() == 0 && e == events, "`fail` reads what `skip` reads"),
        Err(SourceError::BadRecord(r)) => assert!(r.line >= 1 && counts.total() > 0),
        Err(e) => panic!("under `fail` the reader failed with something other than a bad record: {e}"),
    }
    if !events.is_empty() && events.len() <= 4096 {
        let samples = derive_samples(&events, SampleConfig { max_len: 20, groups: 4, seed: 1 });
        let batch = samples_to_batch(&samples, &[1000, 5000, 100], 1);
        batch.check().unwrap_or_else(|e| panic!("inconsistent batch: {e}"));
        check_ids(&batch, &[1000, 5000, 100], &[5000, 100]);
        assert_eq!(batch.len(), samples.len());
    }
}

/// The JSON record parser (`--format json` Kafka payloads): each line of
/// `data` as one payload, then all of `data` as one.
pub fn json_records(data: &[u8]) {
    use tiderec_sources::criteo::{CriteoFeatures, NUM_DENSE, NUM_SPARSE};
    use tiderec_sources::json::CriteoJsonFormat;
    let format = CriteoJsonFormat::new(CriteoFeatures::uniform(1000, 7)).expect("valid features");
    let mut batch = Batch::new(NUM_DENSE, NUM_SPARSE);
    for payload in data.split(|&b| b == b'\n').chain(std::iter::once(data)) {
        let before = batch.len();
        match format.parse(payload, &mut batch) {
            Ok(()) => assert_eq!(batch.len(), before + 1, "a good record appends one sample"),
            Err(_) => assert_eq!(batch.len(), before, "a bad record appends nothing"),
        }
        batch.check().unwrap_or_else(|e| panic!("inconsistent batch: {e}"));
    }
    check_ids(&batch, &[1000; NUM_SPARSE], &[]);
}

/// The chunked body decoder of `tiderec serve`: `data` as the bytes after a request head,
/// under a limit and a memory budget. A decoded body is within the limit, no longer than the
/// input, and what `grow` accepted covers it without passing the limit; a body over the limit
/// names it; a refusal came from an ask past the budget; and a decoded body, chunked again,
/// decodes to itself.
pub fn serve_chunked_body(data: &[u8]) {
    use tiderec::serve::{read_chunked, ChunkedError};
    const MAX: usize = 4096;
    const BUDGET: usize = 2048;
    let mut grown = 0;
    let decoded = read_chunked(&mut &data[..], MAX, |n| {
        grown += n;
        grown <= BUDGET
    });
    match decoded {
        Ok(body) => {
            assert!(body.len() <= MAX && body.len() <= data.len(), "{} bytes from {}", body.len(), data.len());
            assert!(body.len() <= grown && grown <= MAX.min(BUDGET), "{} bytes, {grown} accepted", body.len());
            let mut again = format!("{:X};x=y\r\n", body.len()).into_bytes();
            again.extend_from_slice(&body);
            again.extend_from_slice(b"\r\n0\r\nT: v\r\n\r\n");
            let round = read_chunked(&mut &again[..], MAX, |_| true).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(round, body, "a decoded body chunked again decodes to itself");
        }
        Err(ChunkedError::TooLarge { max }) => assert_eq!(max, MAX, "the limit named"),
        Err(ChunkedError::Refused) => assert!(grown > BUDGET, "refused with {grown} of {BUDGET} asked"),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// The request body parser of `tiderec serve` (`POST /score`): `data` as one body, split
/// under two caps. Its records are byte ranges in order, each non-blank, inside the body and
/// not overlapping; at most the cap of them, and a body refused as over the cap under a
/// small cap holds more records than that cap (it is split whole under a cap above it).
pub fn serve_request_body(data: &[u8]) {
    use tiderec_sources::request_body::{split_records, BodyError};
    for max in [3, 1 << 20] {
        match split_records(data, max) {
            Ok(records) => {
                assert!(!records.ranges.is_empty() && records.ranges.len() <= max, "1..={max} records");
                let mut end = 0;
                for r in &records.ranges {
                    assert!(end <= r.start && r.start < r.end && r.end <= data.len(), "range {r:?} after {end}");
                    assert!(!data[r.clone()].iter().all(u8::is_ascii_whitespace), "a blank record {r:?}");
                    end = r.end;
                }
            }
            Err(BodyError::TooMany { max: m }) => {
                assert_eq!(m, max, "the cap named");
                if let Ok(all) = split_records(data, 1 << 20) {
                    assert!(all.ranges.len() > max, "{} records refused under the cap {max}", all.ranges.len());
                }
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}

/// The Parquet reader (`--data parquet:DIR`): `data` as the one file of a
/// directory, opened and read to the end; a line source (rows with their
/// `_line_start`) is then read by two workers, unshuffled and in shuffled
/// blocks, two epochs each: where they read to the end, every row once.
pub fn parquet(data: &[u8]) {
    use tiderec_sources::parquet::{ParquetDataset, ParquetReader};
    let dir = scratch().join("parquet");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    let path = dir.join("part-00000.parquet");
    std::fs::write(&path, data).expect("write a scratch file");
    let Ok(dataset) = ParquetDataset::open_dir(&dir) else { return };
    let dataset = Arc::new(dataset);
    let description = dataset.description().clone();
    let open = |worker, workers| {
        ParquetReader::new(dataset.clone(), (0.0, 1.0), worker, workers, 7, description.table_sizes())
    };
    let Ok(mut reader) = open(0, 1) else { return };
    let expected = reader.rows_this_epoch();
    // A row with a non-finite dense value is a counted bad record, not a sample.
    let Some(rows) = parquet_epoch(&mut reader, &description) else { return };
    assert_eq!(rows, expected, "a file that reads to the end yields all its rows (bad ones counted)");
    if dataset.line_source().is_none() {
        return;
    }
    let shuffle = tiderec_sources::shuffle::BlockShuffle::new(3, Some(256)).expect("a block size");
    for shuffle in [None, Some(shuffle)] {
        let Ok(mut readers) =
            (0..2).map(|w| open(w, 2).map(|r| r.with_shuffle(shuffle))).collect::<Result<Vec<_>, _>>()
        else {
            return;
        };
        for epoch in 0..2 {
            let mut read = 0;
            for reader in &mut readers {
                let Some(rows) = parquet_epoch(reader, &description) else { return };
                read += rows;
                reader.rewind();
            }
            assert_eq!(read, expected, "two workers read every row once (epoch {epoch}, {shuffle:?})");
        }
    }
}

/// The rows of one epoch of `reader` (samples and counted bad records), each
/// batch checked; `None` where the reader fails.
fn parquet_epoch(
    reader: &mut tiderec_sources::parquet::ParquetReader,
    description: &tiderec_sources::parquet::SchemaDescription,
) -> Option<u64> {
    let (num_dense, num_sparse) = description.shape();
    let mut batch = Batch::with_sequences(num_dense, num_sparse, description.sequences.len());
    let bad_before = reader.bad_counts().total();
    let mut read = 0u64;
    loop {
        batch.clear();
        match reader.next_batch(&mut batch, 512) {
            Ok(0) => return Some(read + reader.bad_counts().total() - bad_before),
            Ok(n) => {
                read += n as u64;
                assert_eq!(batch.len(), n, "rows appended vs. batch length");
                batch.check().unwrap_or_else(|e| panic!("inconsistent batch: {e}"));
                let sequences: Vec<u64> =
                    description.sequences.iter().map(|s| description.sparse[s.table].table_size).collect();
                check_ids(&batch, &description.table_sizes(), &sequences);
            }
            Err(_) => return None,
        }
    }
}

/// The feature-spec TOML parser (`--spec FILE`), then the format it compiles
/// to on a line of ones and an empty line.
pub fn feature_spec_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(spec) = FeatureSpec::from_toml(text) else { return };
    let again = FeatureSpec::from_toml(&spec.to_toml()).unwrap_or_else(|e| panic!("a valid spec's TOML fails: {e}"));
    assert_eq!(again.to_toml(), spec.to_toml(), "TOML round trip");
    if spec.categorical.iter().any(|c| matches!(c.vocabulary, Some(Vocabulary::File(_)))) {
        return;
    }
    let Ok(format) = SpecFormat::new(spec.clone(), 1) else { return };
    let delimiter = match spec.delimiter.as_str() {
        "\\t" => "\t".to_string(),
        d => d.to_string(),
    };
    let ones = vec!["1"; spec.columns.len()].join(&delimiter);
    let empties = vec![""; spec.columns.len()].join(&delimiter);
    let mut batch = format.empty_batch();
    for line in [ones.as_bytes(), empties.as_bytes()] {
        let before = batch.len();
        match format.parse(line, &mut batch) {
            Ok(()) => assert_eq!(batch.len(), before + 1),
            Err(_) => assert_eq!(batch.len(), before),
        }
        batch.check().unwrap_or_else(|e| panic!("inconsistent batch: {e}"));
    }
    let (sparse, sequences) = spec_tables(&spec);
    check_ids(&batch, &sparse, &sequences);
}

/// The run settings' TOML reader (`tiderec train --config FILE`): a file holding NaN or an
/// infinity anywhere is an error, and settings that load pass every range and read back
/// the same from their own TOML.
pub fn train_settings_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let loaded = tiderec::TrainSettings::from_toml_str(text);
    let non_finite = text.parse::<toml::Table>().is_ok_and(|t| t.values().any(has_non_finite));
    let settings = match loaded {
        Ok(s) => s,
        Err(e) => {
            assert!(!e.key.is_empty() && !e.reason.is_empty(), "an error names the key and the reason: {e}");
            return;
        }
    };
    assert!(!non_finite, "a non-finite number was accepted: {settings:?}");
    settings.check_ranges().unwrap_or_else(|e| panic!("loaded settings outside their ranges: {e}"));
    let again = toml::to_string(&settings).unwrap_or_else(|e| panic!("loaded settings do not write: {e}"));
    let back = tiderec::TrainSettings::from_toml_str(&again).unwrap_or_else(|e| panic!("{again}\nreads back as {e}"));
    assert_eq!(back, settings, "TOML round trip");
}

/// True when `v` is or holds a NaN or infinite float.
fn has_non_finite(v: &toml::Value) -> bool {
    match v {
        toml::Value::Float(f) => !f.is_finite(),
        toml::Value::Array(a) => a.iter().any(has_non_finite),
        toml::Value::Table(t) => t.values().any(has_non_finite),
        _ => false,
    }
}

pub use crate::checkpoint::{checkpoint_manifest, checkpoint_tensors};

/// A target by name.
pub struct Target {
    /// Its name (crash files and `--target` use it).
    pub name: &'static str,
    /// The function.
    pub run: fn(&[u8]),
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target { name: "criteo_tsv", run: criteo_tsv },
    Target { name: "avazu_csv", run: avazu_csv },
    Target { name: "csv_criteo", run: csv_criteo },
    Target { name: "csv_avazu", run: csv_avazu },
    Target { name: "csv_elm", run: csv_elm },
    Target { name: "csv_elm_dien", run: csv_elm_dien },
    Target { name: "taobao_ad", run: taobao_ad },
    Target { name: "taobao_behavior", run: taobao_behavior },
    Target { name: "amazon_dien", run: amazon_dien },
    Target { name: "json_records", run: json_records },
    Target { name: "serve_request_body", run: serve_request_body },
    Target { name: "serve_chunked_body", run: serve_chunked_body },
    Target { name: "parquet", run: parquet },
    Target { name: "checkpoint_manifest", run: checkpoint_manifest },
    Target { name: "checkpoint_tensors", run: checkpoint_tensors },
    Target { name: "feature_spec_toml", run: feature_spec_toml },
    Target { name: "train_settings_toml", run: train_settings_toml },
    Target { name: "tiered_hot_tier", run: crate::stores::tiered_hot_tier },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}
