//! The Avazu reader on the real samples in ../shared/data/avazu.

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::path::PathBuf;
use tiderec_records::bad_record::MemoryDeadLetters;
use tiderec_records::Batch;
use tiderec_sources::avazu::{open_avazu, AvazuFormat, NUM_DENSE, NUM_SPARSE};
use tiderec_sources::lines::ReaderOptions;

fn data(rel: &str) -> Option<PathBuf> {
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/avazu")).join(rel);
    skip::existing(p)
}

fn read_all(path: &PathBuf, worker: usize, workers: usize) -> (Batch, u64) {
    let format = AvazuFormat::new(vec![50_000; NUM_SPARSE], 3).unwrap();
    let mut r = open_avazu(
        std::slice::from_ref(path),
        (0.0, 1.0),
        worker,
        workers,
        format,
        ReaderOptions::default(),
        Some(Box::new(MemoryDeadLetters::default())),
    )
    .unwrap();
    let mut all = Batch::new(NUM_DENSE, NUM_SPARSE);
    let mut b = Batch::new(NUM_DENSE, NUM_SPARSE);
    loop {
        b.clear();
        if r.next_batch(&mut b, 1000).unwrap() == 0 {
            break;
        }
        all.extend_from(&b);
    }
    (all, r.bad_counts().total())
}

#[test]
fn train_sample_reads_every_row_and_skips_the_header() {
    let Some(path) = data("train") else { return };
    let (b, bad) = read_all(&path, 0, 1);
    b.check().unwrap();
    assert_eq!(b.len(), 8999);
    assert_eq!(b.labels.iter().filter(|&&y| y == 1.0).count(), 1563);
    assert_eq!(bad, 0);
    assert!(b.sparse.iter().all(|f| f.ids.len() == 8999), "no Avazu value is empty");
    // All rows are hour 14102100: hour of day 0.
    assert!(b.dense.iter().all(|&h| h == 0.0));
    // Worker splits partition the rows.
    for w in 2..=4 {
        let mut union = Batch::new(NUM_DENSE, NUM_SPARSE);
        for k in 0..w {
            union.extend_from(&read_all(&path, k, w).0);
        }
        assert_eq!(union, b, "{w} workers");
    }
}

#[test]
fn unlabeled_test_file_is_rejected_line_by_line() {
    let Some(path) = data("test") else { return };
    let (b, bad) = read_all(&path, 0, 1);
    assert_eq!(b.len(), 0);
    assert_eq!(bad, 1000, "23-column lines are field-count errors; the header is skipped");
}
