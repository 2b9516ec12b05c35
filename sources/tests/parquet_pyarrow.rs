//! Parquet written by another writer (pyarrow): same columns in another order,
//! snappy instead of zstd, other row groups, one extra column. The reader must
//! give back exactly the batches of the file tiderec wrote.
//!
//! Needs `python3` with `pyarrow` (`scripts/test.sh` installs it); without it
//! the test prints why and returns, or fails under `CI=true`.

mod parquet_common;

use parquet_common::*;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use tiderec_records::spec::FeatureSpec;
use tiderec_sources::parquet::{ParquetDataset, SchemaDescription, WriterOptions};

fn pyarrow_available() -> bool {
    let ok = Command::new("python3").args(["-c", "import pyarrow"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        parquet_common::skip::cannot_run("`python3 -c 'import pyarrow'` fails (run `pip install pyarrow`)");
    }
    ok
}

/// Rewrites `src` into `dst` with `scripts/parquet_rewrite_pyarrow.py`.
fn rewrite(src: &Path, dst: &Path, row_group_rows: usize) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/parquet_rewrite_pyarrow.py");
    let out = Command::new("python3").arg(script).arg(src).arg(dst).arg(row_group_rows.to_string()).output().unwrap();
    assert!(out.status.success(), "pyarrow rewrite failed: {}", String::from_utf8_lossy(&out.stderr));
}

fn check(batches: &[tiderec_records::Batch], description: SchemaDescription, chunk: usize, groups: usize) {
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("ours");
    let files = write(&ours, description.clone(), batches, WriterOptions::default());
    assert_eq!(files.len(), 1);
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    rewrite(&files[0], &theirs.join("pyarrow.parquet"), 1500);
    let dataset = Arc::new(ParquetDataset::open_dir(&theirs).unwrap());
    assert_eq!(dataset.description(), &description, "the description survives the rewrite");
    assert_eq!(dataset.row_groups().len(), groups, "pyarrow's own row groups");
    assert_eq!(parquet_batches(&dataset, 0, 1, chunk, 0), batches);
}

#[test]
fn criteo_rows_rewritten_by_pyarrow_read_back_the_same() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    if !pyarrow_available() {
        return;
    }
    let batches = criteo_batches(&src, 1000);
    check(&batches, SchemaDescription::criteo(&criteo_features().table_sizes, SEED), 1000, 7);
}

#[test]
fn list_columns_rewritten_by_pyarrow_read_back_the_same() {
    if !pyarrow_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = FeatureSpec::elm(5000, 20);
    let batches = spec_batches(&elm_file(dir.path(), 2000), &spec, 500);
    check(&batches, SchemaDescription::from_spec(&spec, SEED), 500, 2);
}
