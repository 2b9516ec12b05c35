//! Throughput of the Criteo TSV reader: `next_batch` over ~100k real Kaggle
//! lines (sample.train repeated ten times), batch 4096, one thread.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;
use tiderec_records::Batch;
use tiderec_sources::criteo::{CriteoConfig, CriteoFeatures, CriteoReader, NUM_DENSE, NUM_SPARSE};

const SAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/criteo/sample.train");
const REPEAT: usize = 10;
const BATCH: usize = 4096;

fn bench_reader(c: &mut Criterion) {
    let sample = match std::fs::read(SAMPLE) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skipping criteo_reader bench: cannot read {SAMPLE}: {e}");
            return;
        }
    };
    let lines = sample.iter().filter(|&&b| b == b'\n').count() * REPEAT;
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    for _ in 0..REPEAT {
        file.write_all(&sample).expect("write temp file");
    }
    file.flush().expect("flush temp file");
    let paths: Vec<PathBuf> = vec![file.path().to_path_buf()];

    let features = CriteoFeatures { table_sizes: vec![1 << 20; NUM_SPARSE], seed: 1 };
    let mut reader = CriteoReader::open(&paths, 0, 1, CriteoConfig::new(features), None).expect("open");
    let mut out = Batch::new(NUM_DENSE, NUM_SPARSE);

    let mut group = c.benchmark_group("criteo_reader");
    group.throughput(Throughput::Elements(lines as u64));
    group.sample_size(20);
    group.bench_function(format!("next_batch_{BATCH}_{lines}_lines"), |b| {
        b.iter(|| {
            reader.rewind();
            let mut total = 0;
            loop {
                out.clear();
                let n = reader.next_batch(&mut out, BATCH).expect("read");
                if n == 0 {
                    break;
                }
                total += n;
                black_box(&out);
            }
            assert_eq!(total, lines);
            total
        })
    });
    group.finish();
}

criterion_group!(benches, bench_reader);
criterion_main!(benches);
