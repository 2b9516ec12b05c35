//! Helpers shared by the Parquet tests: read raw files into batches, write and read Parquet.
#![allow(dead_code)]

#[path = "../../../tests/support/skip.rs"]
pub mod skip;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiderec_records::spec::{FeatureSpec, SpecFormat};
use tiderec_records::Batch;
use tiderec_sources::criteo::{CriteoConfig, CriteoFeatures, CriteoReader, NUM_DENSE, NUM_SPARSE};
use tiderec_sources::lines::{LineFormat, LineReader, ReaderOptions};
use tiderec_sources::parquet::{ParquetDataset, ParquetReader, ParquetWriter, SchemaDescription, WriterOptions};

pub const SEED: u64 = 42;

/// `../shared/data/<rel>` beside the repository, or `None` (with a note) when absent.
pub fn shared_data(rel: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data").join(rel);
    skip::existing(p)
}

/// Distinct table sizes per field, so that a field mix-up would show.
pub fn criteo_features() -> CriteoFeatures {
    CriteoFeatures { table_sizes: (0..NUM_SPARSE as u64).map(|f| 1000 + 997 * f).collect(), seed: SEED }
}

/// The batches of `chunk` samples the Criteo TSV reader produces for `path`.
pub fn criteo_batches(path: &Path, chunk: usize) -> Vec<Batch> {
    let mut reader =
        CriteoReader::open(&[path.to_path_buf()], 0, 1, CriteoConfig::new(criteo_features()), None).unwrap();
    drain(|b| reader.next_batch(b, chunk).unwrap(), NUM_DENSE, NUM_SPARSE)
}

/// The batches of `chunk` samples a spec reader produces for `path`.
pub fn spec_batches(path: &Path, spec: &FeatureSpec, chunk: usize) -> Vec<Batch> {
    let format = SpecFormat::new(spec.clone(), SEED).unwrap();
    let (d, s) = format.shape();
    let mut reader =
        LineReader::open_format(&[path.to_path_buf()], (0.0, 1.0), 0, 1, format, ReaderOptions::default(), None)
            .unwrap();
    drain(|b| reader.next_batch(b, chunk).unwrap(), d, s)
}

/// Calls `next` on fresh batches until it yields 0 samples.
pub fn drain(mut next: impl FnMut(&mut Batch) -> usize, d: usize, s: usize) -> Vec<Batch> {
    let mut out = Vec::new();
    loop {
        let mut b = Batch::new(d, s);
        if next(&mut b) == 0 {
            return out;
        }
        b.check().unwrap();
        out.push(b);
    }
}

/// Writes `batches` into `dir` and returns the summary's files.
pub fn write(dir: &Path, description: SchemaDescription, batches: &[Batch], options: WriterOptions) -> Vec<PathBuf> {
    let mut w = ParquetWriter::create(dir, description, options).unwrap();
    for b in batches {
        w.write(b).unwrap();
    }
    let summary = w.finish().unwrap();
    assert_eq!(summary.rows, batches.iter().map(|b| b.len() as u64).sum::<u64>());
    summary.files
}

/// Every batch of `chunk` samples worker `w` of `workers` reads in epoch 0 (after `epochs` rewinds).
pub fn parquet_batches(
    dataset: &Arc<ParquetDataset>,
    w: usize,
    workers: usize,
    chunk: usize,
    epochs: u64,
) -> Vec<Batch> {
    let d = dataset.description();
    let (nd, ns) = d.shape();
    let mut reader = ParquetReader::new(dataset.clone(), (0.0, 1.0), w, workers, SEED, d.table_sizes()).unwrap();
    for _ in 0..epochs {
        reader.rewind();
    }
    drain(|b| reader.next_batch(b, chunk).unwrap(), nd, ns)
}

/// All samples of `batches` in one batch.
pub fn concat(batches: &[Batch], d: usize, s: usize) -> Batch {
    let mut all = Batch::new(d, s);
    for b in batches {
        all.extend_from(b);
    }
    all
}

/// Rows `range` of `b`.
pub fn slice(b: &Batch, range: std::ops::Range<usize>) -> Batch {
    let mut out = Batch::new(b.num_dense, b.sparse.len());
    for i in range {
        out.push_from(b, i);
    }
    out
}

/// `count` elm-shaped lines in a file of `dir`.
pub fn elm_file(dir: &Path, count: u64) -> PathBuf {
    let mut text = Vec::new();
    for i in 0..count {
        tiderec_sources::elm::elm_line(SEED, i, 2, &mut text);
        text.push(b'\n');
    }
    let path = dir.join("elm.csv");
    std::fs::write(&path, text).unwrap();
    path
}
