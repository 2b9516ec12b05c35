//! The `parse_records` timely operator with the real Criteo format equals the file reader.

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tiderec_records::stream::ParseRecords;
use tiderec_records::Batch;
use tiderec_sources::criteo::{CriteoConfig, CriteoFeatures, CriteoFormat, CriteoReader, NUM_DENSE, NUM_SPARSE};
use timely::dataflow::operators::{Inspect, ToStream};

#[test]
fn parse_records_on_a_stream_equals_the_file_reader() {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/criteo/sample_test.txt"));
    if !path.exists() {
        skip::cannot_run(&format!("{} not found", path.display()));
        return;
    }
    let features = CriteoFeatures::uniform(10_000, 5);
    let mut reader =
        CriteoReader::open(std::slice::from_ref(&path), 0, 1, CriteoConfig::new(features.clone()), None).unwrap();
    let mut expected = Batch::new(NUM_DENSE, NUM_SPARSE);
    while reader.next_batch(&mut expected, 1000).unwrap() > 0 {}

    let mut lines: Vec<Vec<u8>> = std::fs::read(&path).unwrap().split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
    lines.retain(|l| !l.is_empty());
    lines.push(b"not\ta\tcriteo\tline".to_vec());
    let got = Arc::new(Mutex::new(Batch::new(NUM_DENSE, NUM_SPARSE)));
    let bad = Arc::new(Mutex::new(Vec::new()));
    let (g, b) = (got.clone(), bad.clone());
    timely::example(move |scope| {
        let (batches, dead) = lines.to_stream(scope).parse_records(CriteoFormat::new(features).unwrap(), "stream");
        batches.inspect(move |batch: &Batch| g.lock().unwrap().extend_from(batch));
        dead.inspect(move |r| b.lock().unwrap().push(r.line));
    });
    assert_eq!(*got.lock().unwrap(), expected);
    assert_eq!(expected.len(), 100);
    assert_eq!(*bad.lock().unwrap(), vec![101]);
}
