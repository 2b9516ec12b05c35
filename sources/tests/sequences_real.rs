//! Behaviour-sequence sources on the real samples in ../shared/data: Amazon
//! DIEN-format files, the Taobao UserBehavior log and the Taobao display-ad CSV.

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::path::PathBuf;
use tiderec_records::bad_record::{BadReason, BadRecordPolicy, MemoryDeadLetters};
use tiderec_records::spec::{FeatureSpec, SpecFormat};
use tiderec_records::Batch;
use tiderec_sources::amazon::{AmazonDienFormat, NUM_SEQUENCES, NUM_SPARSE};
use tiderec_sources::lines::{LineReader, ReaderOptions};
use tiderec_sources::taobao::read_user_behavior;

fn data(rel: &str) -> Option<PathBuf> {
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data")).join(rel);
    skip::existing(p)
}

/// Reads every record of `paths` with `worker` of `workers`; returns the batch and the dead letters.
fn read_dien(paths: &[PathBuf], worker: usize, workers: usize, max_len: usize) -> (Batch, MemoryDeadLetters) {
    let format = AmazonDienFormat::new(&[1000, 100_000, 100], 5, max_len).unwrap();
    let dead = std::sync::Arc::new(std::sync::Mutex::new(MemoryDeadLetters::default()));
    struct Shared(std::sync::Arc<std::sync::Mutex<MemoryDeadLetters>>);
    impl tiderec_records::bad_record::DeadLetterSink for Shared {
        fn write(&mut self, r: &tiderec_records::bad_record::BadRecord) -> std::io::Result<()> {
            self.0.lock().unwrap().write(r)
        }
    }
    let mut reader = LineReader::open_format(
        paths,
        (0.0, 1.0),
        worker,
        workers,
        format,
        ReaderOptions::default(),
        Some(Box::new(Shared(dead.clone()))),
    )
    .unwrap();
    let mut all = Batch::with_sequences(0, NUM_SPARSE, NUM_SEQUENCES);
    let mut b = Batch::with_sequences(0, NUM_SPARSE, NUM_SEQUENCES);
    while reader.next_batch(&mut b, 7).unwrap() > 0 {
        all.extend_from(&b);
        b.clear();
    }
    drop(reader);
    let dead = std::mem::take(&mut *dead.lock().unwrap());
    (all, dead)
}

#[test]
fn amazon_dien_files_parse_completely_and_split_across_workers() {
    let (Some(test), Some(train)) = (data("amazon_dien/local_test"), data("amazon_dien/local_train")) else { return };
    let paths = vec![test.clone(), train];
    let (all, dead) = read_dien(&paths, 0, 1, 100);
    all.check().unwrap();
    assert!(dead.records.is_empty(), "{:?}", dead.records);
    assert_eq!(all.len(), 38 + 1);
    // Histories have as many items as the raw line has \x02-separated entries (CRLF stripped).
    let text = std::fs::read(&test).unwrap();
    for (i, line) in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()).enumerate() {
        let hist = line.split(|&b| b == b'\t').nth(4).unwrap();
        let n = hist.split(|&b| b == 0x02).count();
        assert_eq!(all.sequences[0].bag(i).len(), n, "line {}", i + 1);
        assert_eq!(all.sequences[1].bag(i).len(), n, "line {}", i + 1);
    }
    let labels: f32 = all.labels.iter().sum();
    assert!(labels > 0.0 && labels < all.len() as f32);
    // Two workers together read exactly the same records (worker 0's part of each file first).
    let one = std::slice::from_ref(&test);
    let (whole, _) = read_dien(one, 0, 1, 100);
    let (a, _) = read_dien(one, 0, 2, 100);
    let (b, _) = read_dien(one, 1, 2, 100);
    assert!(!a.is_empty() && !b.is_empty());
    let mut joined = a.clone();
    joined.extend_from(&b);
    assert_eq!(joined, whole);
    // A short max_len keeps the most recent events.
    let (short, _) = read_dien(&paths, 0, 1, 1);
    for i in 0..all.len() {
        let full = all.sequences[0].bag(i);
        assert_eq!(short.sequences[0].bag(i), &full[full.len().saturating_sub(1)..]);
    }
}

#[test]
fn corrupted_amazon_dien_lines_go_to_dead_letters_with_their_reason() {
    let Some(test) = data("amazon_dien/local_test") else { return };
    let text = std::fs::read(&test).unwrap();
    let mut lines: Vec<Vec<u8>> = text.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec).collect();
    lines[2][0] = b'7'; // label
    let cut = lines[5].iter().rposition(|&b| b == b'\t').unwrap();
    lines[5].truncate(cut); // a missing column
    lines[9].extend_from_slice(b"\x02extra"); // history lengths differ
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corrupt");
    std::fs::write(&path, lines.join(&b'\n')).unwrap();
    let (all, dead) = read_dien(&[path], 0, 1, 100);
    assert_eq!(all.len(), 38 - 3);
    let got: Vec<(u64, BadReason)> = dead.records.iter().map(|r| (r.line, r.reason)).collect();
    assert_eq!(got, [(3, BadReason::BadLabel), (6, BadReason::FieldCount), (10, BadReason::FieldCount)]);
}

#[test]
fn taobao_user_behavior_reads_every_complete_row_and_reports_the_truncated_one() {
    let Some(path) = data("taobao_user_behavior/UserBehavior.csv") else { return };
    let mut dead = MemoryDeadLetters::default();
    let (events, counts) =
        read_user_behavior(std::slice::from_ref(&path), BadRecordPolicy::Skip, 65_536, Some(&mut dead)).unwrap();
    let newlines = std::fs::read(&path).unwrap().iter().filter(|&&b| b == b'\n').count();
    assert_eq!(events.len(), newlines, "every complete line is an event");
    assert_eq!(counts.total(), 1);
    assert_eq!(dead.records.len(), 1);
    let bad = &dead.records[0];
    assert_eq!((bad.line, bad.reason), (newlines as u64 + 1, BadReason::FieldCount));
    assert_eq!(bad.raw, b"100370,1968385,1875258,pv");
    assert_eq!(events[0].user, 1);
    assert_eq!(events[0].time, 1511544070);
    assert!(events.iter().enumerate().all(|(i, e)| e.seq == i as u64));
    // Under `fail` the same row stops the read, naming its line.
    let e = read_user_behavior(&[path], BadRecordPolicy::Fail, 65_536, None).unwrap_err().to_string();
    assert!(e.contains(&format!(":{}", newlines + 1)) && e.contains("field_count"), "{e}");
}

#[test]
fn taobao_ad_preset_reads_the_joined_csv_samples() {
    for rel in ["taobao_ad/train_sample.csv", "taobao_ad/test_sample.csv"] {
        let Some(path) = data(rel) else { return };
        let format = SpecFormat::new(FeatureSpec::taobao_ad(10_000, 20), 1).unwrap();
        let (d, s) = tiderec_records::format::LineFormat::shape(&format);
        let mut reader = LineReader::open_format(
            &[path],
            (0.0, 1.0),
            0,
            1,
            format,
            ReaderOptions::default(),
            Some(Box::new(MemoryDeadLetters::default())),
        )
        .unwrap();
        let mut b = Batch::new(d, s);
        let n = reader.next_batch(&mut b, 1000).unwrap();
        b.check().unwrap();
        assert_eq!(n, 100, "{rel}: every row after the header");
        assert_eq!(reader.bad_counts().total(), 0, "{rel}");
        let absent_profiles = b.sparse[11].offsets.windows(2).filter(|w| w[0] == w[1]).count();
        assert!(absent_profiles > 0, "{rel}: empty pvalue_level values are absent, not fake ids");
        // Every `^`-separated click becomes one id (empty sequences are empty bags).
        let text = std::fs::read_to_string(data(rel).unwrap()).unwrap();
        let clicks: usize = text
            .lines()
            .skip(1)
            .map(|l| l.rsplit(',').next().unwrap())
            .filter(|c| !c.is_empty())
            .map(|c| c.split('^').count().min(20))
            .sum();
        assert_eq!(b.sparse[15].ids.len(), clicks, "{rel}");
        assert!(clicks > 0);
    }
}
