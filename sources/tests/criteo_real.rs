//! The Criteo reader against the real sample files in `shared/data`, corrupted
//! copies of them, and random Criteo-like files checked against a plain
//! `str::split` reference parser.

#[path = "../../tests/support/skip.rs"]
mod skip;

use proptest::prelude::*;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tiderec_records::bad_record::{BadReason, BadRecord, BadRecordPolicy, DeadLetterSink, MemoryDeadLetters};
use tiderec_records::features::{field_seed, hash_bucket};
use tiderec_records::Batch;
use tiderec_sources::criteo::{parse_line, CriteoConfig, CriteoFeatures, CriteoReader, NUM_DENSE, NUM_SPARSE};
use tiderec_sources::shuffle::BlockShuffle;
use tiderec_sources::SourceError;

const CRITEO_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/criteo");
const CRITEO_1TB_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/criteo_1tb");

/// The data directory, or `None` (with a message) when it is absent.
fn data_dir(dir: &str) -> Option<PathBuf> {
    skip::existing(PathBuf::from(dir))
}

fn features() -> CriteoFeatures {
    // Distinct table sizes per field so that a field mix-up would show.
    CriteoFeatures { table_sizes: (0..NUM_SPARSE as u64).map(|f| 1000 + 997 * f).collect(), seed: 42 }
}

fn config() -> CriteoConfig {
    CriteoConfig::new(features())
}

/// A dead-letter sink the test can inspect after handing it to a reader.
#[derive(Clone, Default)]
struct SharedMemory(Arc<Mutex<MemoryDeadLetters>>);

impl SharedMemory {
    fn records(&self) -> Vec<BadRecord> {
        self.0.lock().unwrap().records.clone()
    }
}

impl DeadLetterSink for SharedMemory {
    fn write(&mut self, record: &BadRecord) -> std::io::Result<()> {
        self.0.lock().unwrap().write(record)
    }
}

/// Reads everything worker `w` of `workers` owns, in batches of `batch`.
fn read_all(
    paths: &[PathBuf],
    w: usize,
    workers: usize,
    config: CriteoConfig,
    sink: Option<SharedMemory>,
    batch: usize,
) -> (Batch, CriteoReader) {
    let sink = sink.map(|s| Box::new(s) as Box<dyn DeadLetterSink>);
    let mut reader = CriteoReader::open(paths, w, workers, config, sink).unwrap();
    let mut out = Batch::new(NUM_DENSE, NUM_SPARSE);
    loop {
        let before = out.len();
        let n = reader.next_batch(&mut out, batch).unwrap();
        assert_eq!(out.len(), before + n);
        assert!(n <= batch);
        if n == 0 {
            break;
        }
    }
    out.check().unwrap();
    (out, reader)
}

fn empty_bags(b: &Batch) -> usize {
    b.sparse.iter().map(|f| (0..f.len()).filter(|&i| f.bag(i).is_empty()).count()).sum()
}

fn positives(b: &Batch) -> usize {
    b.labels.iter().filter(|&&l| l == 1.0).count()
}

#[test]
fn kaggle_sample_train() {
    let Some(dir) = data_dir(CRITEO_DIR) else { return };
    let path = dir.join("sample.train");
    let (b, reader) = read_all(std::slice::from_ref(&path), 0, 1, config(), None, 4096);
    assert_eq!(b.len(), 10_000);
    assert_eq!(positives(&b), 2_182);
    assert_eq!(reader.bad_counts().total(), 0);
    assert_eq!(reader.lines_read(), 10_000);
    b.check().unwrap();

    // Count empty categorical fields independently.
    let text = std::fs::read_to_string(&path).unwrap();
    let mut empty_cats = 0;
    let mut missing_ints = 0;
    for line in text.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), 40);
        empty_cats += fields[14..].iter().filter(|s| s.is_empty()).count();
        missing_ints += fields[1..14].iter().filter(|s| s.is_empty()).count();
    }
    assert!(empty_cats > 0);
    assert_eq!(empty_bags(&b), empty_cats);
    // Every non-empty bag holds exactly one in-range id.
    for (f, field) in b.sparse.iter().enumerate() {
        assert_eq!(field.ids.len(), 10_000 - (0..field.len()).filter(|&i| field.bag(i).is_empty()).count());
        assert!(field.ids.iter().all(|&id| id < features().table_sizes[f]));
    }
    // A missing integer is 0.0; present ones are >= 0 after log1p_clamped.
    assert!(b.dense.iter().all(|&x| x >= 0.0 && x.is_finite()));
    assert!(b.dense.iter().filter(|&&x| x == 0.0).count() >= missing_ints);
}

#[test]
fn criteo_1tb_day_0() {
    let Some(dir) = data_dir(CRITEO_1TB_DIR) else { return };
    let (b, reader) = read_all(&[dir.join("day_0.part.txt")], 0, 1, config(), None, 1000);
    assert_eq!(b.len(), 10_000);
    assert_eq!(positives(&b), 265);
    assert_eq!(reader.bad_counts().total(), 0);
}

#[test]
fn paddlerec_files_with_stripped_trailing_fields() {
    let Some(dir) = data_dir(CRITEO_DIR) else { return };
    for name in ["sample_test.txt", "PaddlePaddle-ctr_dnn-sample_train.txt", "sample_train.txt", "part-0"] {
        let path = dir.join(name);
        let sink = SharedMemory::default();
        let (b, reader) = read_all(std::slice::from_ref(&path), 0, 1, config(), Some(sink.clone()), 7);
        assert_eq!(b.len(), 100, "{name}");
        assert_eq!(reader.bad_counts().total(), 0, "{name}");
        assert!(sink.records().is_empty());
        // Absent trailing fields are empty bags.
        let text = std::fs::read_to_string(&path).unwrap();
        let empty_cats: usize = text
            .lines()
            .map(|l| {
                let fields: Vec<&str> = l.split('\t').collect();
                (14..40).filter(|&k| fields.get(k).is_none_or(|s| s.is_empty())).count()
            })
            .sum();
        assert_eq!(empty_bags(&b), empty_cats, "{name}");
    }
    let text = std::fs::read_to_string(dir.join("sample_test.txt")).unwrap();
    let (b, _) = read_all(&[dir.join("sample_test.txt")], 0, 1, config(), None, 4096);
    let pos = text.lines().filter(|l| l.starts_with("1\t")).count();
    assert_eq!(positives(&b), pos);
}

#[test]
fn worker_split_matches_single_reader() {
    let Some(dir) = data_dir(CRITEO_DIR) else { return };
    let paths: Vec<PathBuf> =
        ["sample_train.txt", "part-0", "sample_test.txt", "sample.train"].iter().map(|n| dir.join(n)).collect();
    let (whole, r) = read_all(&paths, 0, 1, config(), None, 4096);
    assert_eq!(whole.len(), 10_300);
    assert_eq!(r.lines_read(), 10_300);
    for workers in 1..=5 {
        let mut per_worker = Vec::new();
        let mut lines = 0;
        for w in 0..workers {
            let (b, r) = read_all(&paths, w, workers, config(), None, 333);
            lines += r.lines_read();
            per_worker.push(b);
        }
        assert_eq!(lines, 10_300, "W={workers}");
        // Ranges are in file order: per file, worker 0's lines, then worker 1's, ...
        // Rebuild the per-file order by reading each file separately.
        let mut concat = Batch::new(NUM_DENSE, NUM_SPARSE);
        for p in &paths {
            for w in 0..workers {
                let (b, _) = read_all(std::slice::from_ref(p), w, workers, config(), None, 4096);
                concat.extend_from(&b);
            }
        }
        assert_eq!(concat, whole, "W={workers}");
        // And each worker's multi-file batch is its per-file batches in file order.
        for (w, b) in per_worker.iter().enumerate() {
            let mut expect = Batch::new(NUM_DENSE, NUM_SPARSE);
            for p in &paths {
                expect.extend_from(&read_all(std::slice::from_ref(p), w, workers, config(), None, 4096).0);
            }
            assert_eq!(b, &expect, "W={workers} w={w}");
        }
    }
    // Far more workers than lines: most ranges are empty, nothing is lost or duplicated.
    let small = [dir.join("sample_train.txt")];
    let (one, _) = read_all(&small, 0, 1, config(), None, 4096);
    let mut concat = Batch::new(NUM_DENSE, NUM_SPARSE);
    for w in 0..1000 {
        concat.extend_from(&read_all(&small, w, 1000, config(), None, 4096).0);
    }
    assert_eq!(concat, one);
}

#[test]
fn rewind_reads_the_same_again() {
    let Some(dir) = data_dir(CRITEO_DIR) else { return };
    let paths = [dir.join("sample_train.txt"), dir.join("sample_test.txt")];
    let mut reader = CriteoReader::open(&paths, 1, 3, config(), None).unwrap();
    let mut a = Batch::new(NUM_DENSE, NUM_SPARSE);
    while reader.next_batch(&mut a, 10).unwrap() > 0 {}
    reader.rewind();
    let mut b = Batch::new(NUM_DENSE, NUM_SPARSE);
    while reader.next_batch(&mut b, 64).unwrap() > 0 {}
    assert!(!a.is_empty());
    assert_eq!(a, b);
    assert_eq!(reader.lines_read(), 2 * a.len() as u64);
}

/// Line starts of one epoch of `reader` (after `epoch` rewinds).
fn epoch_line_starts(reader: &mut CriteoReader) -> Vec<u64> {
    reader.record_line_starts();
    let mut b = Batch::new(NUM_DENSE, NUM_SPARSE);
    while reader.next_batch(&mut b, 256).unwrap() > 0 {
        b.clear();
    }
    reader.take_line_starts()
}

#[test]
fn shuffled_epochs_of_the_kaggle_sample_read_every_line_once() {
    let Some(dir) = data_dir(CRITEO_DIR) else { return };
    let paths = [dir.join("sample.train")];
    let shuffle = BlockShuffle::new(7, None).unwrap();
    for workers in 1..=3 {
        let mut lines = 0;
        for w in 0..workers {
            let mut reader =
                CriteoReader::open(&paths, w, workers, config(), None).unwrap().with_shuffle(Some(shuffle));
            let first = epoch_line_starts(&mut reader);
            let mut previous = first.clone();
            for _ in 1..=2 {
                reader.rewind();
                let mut starts = epoch_line_starts(&mut reader);
                assert_ne!(starts, previous, "{workers} workers, worker {w}: a shuffled epoch has another order");
                previous = starts.clone();
                starts.sort_unstable();
                assert_eq!(starts, first, "{workers} workers, worker {w}: every line once");
            }
            lines += first.len();
        }
        assert_eq!(lines, 10_000, "{workers} workers");
    }
}

#[test]
fn missing_and_empty_files() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-file.txt");
    let err = CriteoReader::open(&[missing], 0, 1, config(), None).err().expect("missing file must fail");
    assert!(matches!(err, SourceError::Io { .. }));
    assert!(err.to_string().contains("no-such-file.txt"), "{err}");

    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    let blank = dir.path().join("blank.txt");
    std::fs::write(&blank, b"\n\r\n\n").unwrap();
    for w in 0..3 {
        let (b, r) = read_all(&[empty.clone(), blank.clone()], w, 3, config(), None, 10);
        assert!(b.is_empty());
        assert_eq!(r.lines_read(), 0);
        assert_eq!(r.bad_counts().total(), 0);
    }
    let err = CriteoReader::open(std::slice::from_ref(&empty), 3, 3, config(), None).err().unwrap();
    assert!(matches!(err, SourceError::Config(_)));
    let bad_features = CriteoConfig::new(CriteoFeatures { table_sizes: vec![10; 25], seed: 0 });
    assert!(matches!(CriteoReader::open(&[empty], 0, 1, bad_features, None), Err(SourceError::Config(_))));
}

// ---------------------------------------------------------------------------
// Corrupted copies.

const MAX_LINE: usize = 1000;

/// One expected dead letter: 1-based line in the corrupted file, reason, field.
struct Corruption {
    line: u64,
    reason: BadReason,
    field: Option<usize>,
}

struct Corrupted {
    /// Lines of the corrupted file, without terminators.
    lines: Vec<String>,
    /// Indices (0-based) into `lines` of the good records.
    good: Vec<usize>,
    bad: Vec<Corruption>,
}

/// sample_train.txt with one corruption of each kind and an inserted empty line.
fn corrupt(original: &str) -> Corrupted {
    let mut lines: Vec<String> = original.lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 100);
    let set_field = |line: &mut String, k: usize, v: &str| {
        let mut f: Vec<&str> = line.split('\t').collect();
        f[k] = v;
        *line = f.join("\t");
    };
    set_field(&mut lines[4], 20, "zzzzzzzz"); // line 5: bad hex in C7
    set_field(&mut lines[11], 3, "abc"); // line 12: non-numeric I3
    set_field(&mut lines[19], 0, "2"); // line 20: label 2
    lines[32].push_str("\tdeadbeef"); // line 33: 41 fields
    lines[46] = lines[46].split('\t').take(30).collect::<Vec<_>>().join("\t"); // line 47: 30 fields
    set_field(&mut lines[59], 39, &"a".repeat(MAX_LINE)); // line 60: too long
    set_field(&mut lines[80], 2, "260.0"); // line 81: pandas float is not an integer
    lines.insert(69, String::new()); // an empty line: not a record, but it counts as a line
    let bad = vec![
        Corruption { line: 5, reason: BadReason::BadHex, field: Some(20) },
        Corruption { line: 12, reason: BadReason::BadInteger, field: Some(3) },
        Corruption { line: 20, reason: BadReason::BadLabel, field: Some(0) },
        Corruption { line: 33, reason: BadReason::FieldCount, field: None },
        Corruption { line: 47, reason: BadReason::FieldCount, field: None },
        Corruption { line: 60, reason: BadReason::TooLong, field: None },
        Corruption { line: 82, reason: BadReason::BadInteger, field: Some(2) },
    ];
    let bad_idx: Vec<usize> = bad.iter().map(|c| c.line as usize - 1).collect();
    let good = (0..lines.len()).filter(|i| !bad_idx.contains(i) && !lines[*i].is_empty()).collect();
    Corrupted { lines, good, bad }
}

/// Joins `lines` with `eol`, with or without a final terminator; returns the
/// bytes and the byte offset of each line.
fn join_lines(lines: &[String], eol: &str, final_eol: bool) -> (Vec<u8>, Vec<u64>) {
    let mut bytes = Vec::new();
    let mut offsets = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        offsets.push(bytes.len() as u64);
        bytes.extend_from_slice(l.as_bytes());
        if i + 1 < lines.len() || final_eol {
            bytes.extend_from_slice(eol.as_bytes());
        }
    }
    (bytes, offsets)
}

fn expected_batch(lines: &[String], idx: &[usize]) -> Batch {
    let f = features();
    let seeds = f.field_seeds();
    let mut b = Batch::new(NUM_DENSE, NUM_SPARSE);
    for &i in idx {
        parse_line(lines[i].as_bytes(), &f, &seeds, &mut b).unwrap();
    }
    b
}

fn corrupted_config(policy: BadRecordPolicy) -> CriteoConfig {
    CriteoConfig { max_line_bytes: MAX_LINE, policy, ..config() }
}

#[test]
fn crlf_copy_reads_like_lf() {
    let Some(dir) = data_dir(CRITEO_DIR) else { return };
    let path = dir.join("sample_train.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    let tmp = tempfile::tempdir().unwrap();
    let crlf = tmp.path().join("crlf.txt");
    std::fs::write(&crlf, join_lines(&lines, "\r\n", true).0).unwrap();
    let (lf, _) = read_all(&[path], 0, 1, config(), None, 4096);
    for workers in 1..=3 {
        let mut concat = Batch::new(NUM_DENSE, NUM_SPARSE);
        for w in 0..workers {
            let (b, r) = read_all(std::slice::from_ref(&crlf), w, workers, config(), None, 4096);
            assert_eq!(r.bad_counts().total(), 0);
            concat.extend_from(&b);
        }
        assert_eq!(concat, lf);
    }
}

#[test]
fn corrupted_copies_report_each_bad_line() {
    let Some(dir) = data_dir(CRITEO_DIR) else { return };
    let original = std::fs::read_to_string(dir.join("sample_train.txt")).unwrap();
    let c = corrupt(&original);
    let expect_good = expected_batch(&c.lines, &c.good);
    assert_eq!(expect_good.len(), 100 - c.bad.len());
    let tmp = tempfile::tempdir().unwrap();
    for (eol, final_eol) in [("\n", true), ("\r\n", true), ("\n", false), ("\r\n", false)] {
        let (bytes, offsets) = join_lines(&c.lines, eol, final_eol);
        let path = tmp.path().join(format!("corrupt-{}-{final_eol}.txt", eol.len()));
        std::fs::write(&path, &bytes).unwrap();
        let source = path.display().to_string();

        let mut reference_letters = None;
        for workers in 1..=4 {
            let sink = SharedMemory::default();
            let mut concat = Batch::new(NUM_DENSE, NUM_SPARSE);
            let mut counts = tiderec_records::bad_record::BadRecordCounts::default();
            let mut lines_read = 0;
            for w in 0..workers {
                let (b, r) = read_all(
                    std::slice::from_ref(&path),
                    w,
                    workers,
                    corrupted_config(BadRecordPolicy::Skip),
                    Some(sink.clone()),
                    16,
                );
                concat.extend_from(&b);
                counts.merge(r.bad_counts());
                lines_read += r.lines_read();
            }
            assert_eq!(concat, expect_good, "eol={eol:?} W={workers}");
            assert_eq!(lines_read, 100);
            let mut want = std::collections::BTreeMap::new();
            for bad in &c.bad {
                *want.entry(bad.reason.name().to_string()).or_insert(0u64) += 1;
            }
            assert_eq!(counts.by_reason, want);
            assert_eq!(counts.by_reason["field_count"], 2);
            assert_eq!(counts.by_reason["bad_integer"], 2);
            assert_eq!(counts.by_reason["too_long"], 1);

            let letters = sink.records();
            assert_eq!(letters.len(), c.bad.len());
            for (got, want) in letters.iter().zip(&c.bad) {
                let i = want.line as usize - 1;
                assert_eq!(got.source, source);
                assert_eq!(got.line, want.line, "eol={eol:?} W={workers}");
                assert_eq!(got.byte_offset, offsets[i]);
                assert_eq!(got.reason, want.reason);
                assert_eq!(got.field, want.field, "line {}", want.line);
                assert_eq!(got.raw, c.lines[i].as_bytes()[..got.raw.len()]);
                if want.reason != BadReason::TooLong {
                    assert_eq!(got.raw, c.lines[i].as_bytes());
                }
            }
            match &reference_letters {
                None => reference_letters = Some(letters),
                Some(r) => assert_eq!(&letters, r, "W={workers}"),
            }
        }

        // Fail policy: stops at the first bad line with the same information.
        let mut reader =
            CriteoReader::open(std::slice::from_ref(&path), 0, 1, corrupted_config(BadRecordPolicy::Fail), None)
                .unwrap();
        let mut out = Batch::new(NUM_DENSE, NUM_SPARSE);
        let err = loop {
            match reader.next_batch(&mut out, 3) {
                Ok(0) => panic!("no error under Fail"),
                Ok(_) => {}
                Err(e) => break e,
            }
        };
        match err {
            SourceError::BadRecord(r) => {
                assert_eq!(r.line, c.bad[0].line);
                assert_eq!(r.reason, c.bad[0].reason);
                assert_eq!(r.byte_offset, offsets[c.bad[0].line as usize - 1]);
                assert_eq!(r.source, source);
            }
            other => panic!("unexpected error {other}"),
        }
        out.check().unwrap();
        assert_eq!(out.len(), c.bad[0].line as usize - 1);
    }
}

#[test]
fn fail_policy_in_a_later_worker_range_reports_file_line() {
    let Some(dir) = data_dir(CRITEO_DIR) else { return };
    let original = std::fs::read_to_string(dir.join("sample_train.txt")).unwrap();
    let c = corrupt(&original);
    let (bytes, _) = join_lines(&c.lines, "\n", true);
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("c.txt");
    std::fs::write(&path, &bytes).unwrap();
    // Worker 1 of 2 starts after the middle of the file: its first bad line is line 60.
    let mut reader = CriteoReader::open(&[path], 1, 2, corrupted_config(BadRecordPolicy::Fail), None).unwrap();
    let mut out = Batch::new(NUM_DENSE, NUM_SPARSE);
    let err = loop {
        match reader.next_batch(&mut out, 4096) {
            Ok(0) => panic!("no error under Fail"),
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    let SourceError::BadRecord(r) = err else { panic!("unexpected error {err}") };
    let half = bytes.len() / 2;
    let start = half + bytes[half - 1..].iter().position(|&b| b == b'\n').unwrap();
    let first_line_of_w1 = bytes[..start].iter().filter(|&&b| b == b'\n').count() as u64 + 1;
    let expect = c.bad.iter().find(|b| b.line >= first_line_of_w1).unwrap();
    assert!(expect.line > 1);
    assert_eq!(r.line, expect.line);
    assert_eq!(r.reason, expect.reason);
}

// ---------------------------------------------------------------------------
// Random files against a reference parser.

#[derive(Clone, Debug)]
struct Row {
    label: u8,
    ints: Vec<Option<i64>>,
    cats: Vec<Option<u32>>,
    /// How many trailing fields to drop (only empty ones are dropped).
    strip: usize,
}

fn row() -> impl Strategy<Value = Row> {
    (
        0u8..=1,
        proptest::collection::vec(proptest::option::weighted(0.8, -100i64..100_000), NUM_DENSE),
        proptest::collection::vec(proptest::option::weighted(0.8, any::<u32>()), NUM_SPARSE),
        0usize..=3,
    )
        .prop_map(|(label, ints, mut cats, strip)| {
            if strip > 0 {
                for c in &mut cats[NUM_SPARSE - strip..] {
                    *c = None;
                }
            }
            Row { label, ints, cats, strip }
        })
}

fn render(r: &Row) -> String {
    let mut f = vec![r.label.to_string()];
    f.extend(r.ints.iter().map(|v| v.map_or(String::new(), |v| v.to_string())));
    f.extend(r.cats.iter().map(|v| v.map_or(String::new(), |v| format!("{v:08x}"))));
    f.truncate(40 - r.strip);
    f.join("\t")
}

/// A straightforward reference parser over `str::split`.
fn reference(text: &str, features: &CriteoFeatures) -> Batch {
    let mut b = Batch::new(NUM_DENSE, NUM_SPARSE);
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        assert!((37..=40).contains(&fields.len()));
        b.labels.push(fields[0].parse::<u8>().unwrap() as f32);
        for s in &fields[1..14] {
            let v = if s.is_empty() { 0.0 } else { (s.parse::<i64>().unwrap() as f32).max(0.0).ln_1p() };
            b.dense.push(v);
        }
        for f in 0..NUM_SPARSE {
            let s = fields.get(14 + f).copied().unwrap_or("");
            if !s.is_empty() {
                let v = u64::from_str_radix(s, 16).unwrap();
                b.sparse[f].ids.push(hash_bucket(field_seed(features.seed, f), v, features.table_sizes[f]));
            }
            b.sparse[f].close_bag();
        }
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn random_files_match_reference(
        rows in proptest::collection::vec(row(), 0..30),
        crlf in any::<bool>(),
        final_eol in any::<bool>(),
        workers in 1usize..5,
        batch in 1usize..20,
        seed in any::<u64>(),
    ) {
        let eol = if crlf { "\r\n" } else { "\n" };
        let lines: Vec<String> = rows.iter().map(render).collect();
        let (bytes, _) = join_lines(&lines, eol, final_eol);
        let text = String::from_utf8(bytes.clone()).unwrap();
        let features = CriteoFeatures { seed, ..features() };
        let expect = reference(&text, &features);
        prop_assert_eq!(expect.len(), rows.len());

        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("random.txt");
        std::fs::write(&path, &bytes).unwrap();
        let mut concat = Batch::new(NUM_DENSE, NUM_SPARSE);
        for w in 0..workers {
            let cfg = CriteoConfig::new(features.clone());
            let (b, r) = read_all(std::slice::from_ref(&path), w, workers, cfg, None, batch);
            prop_assert_eq!(r.bad_counts().total(), 0);
            concat.extend_from(&b);
        }
        prop_assert_eq!(concat, expect);
    }
}
