//! Corrupt Parquet files are errors, never panics: a small file written by
//! `ParquetWriter`, then every byte of it changed in turn (its high bit
//! flipped; in the footer also set to 0xFF), each copy opened and read to
//! the end. Among these copies
//! are a column chunk whose offset in the footer turns negative and a page
//! whose definition levels claim more values than the page holds, which
//! made the parquet decoder panic.

use std::sync::Arc;
use tiderec_records::Batch;
use tiderec_sources::parquet::schema::LineSource;
use tiderec_sources::parquet::{ParquetDataset, ParquetReader, ParquetWriter, SchemaDescription, WriterOptions};
use tiderec_sources::shuffle::BlockShuffle;

/// A Criteo-shaped batch of `rows` rows with some absent values (null pages).
fn batch(rows: usize) -> Batch {
    let mut b = Batch::new(13, 26);
    for r in 0..rows {
        b.labels.push((r % 2) as f32);
        b.dense.extend((0..13).map(|j| ((r * 13 + j) % 7) as f32));
        for (f, field) in b.sparse.iter_mut().enumerate() {
            if (r + f) % 3 != 0 {
                field.ids.push(((r * 31 + f * 7) % 100) as u64);
            }
            field.close_bag();
        }
    }
    b
}

/// Opens and reads `dir` to the end; `Ok(rows)` or the error's text.
fn read_all(dir: &std::path::Path) -> Result<u64, String> {
    read_worker(dir, 0, 1, None)
}

/// Opens `dir` and reads worker `worker` of `workers`'s rows to the end (two
/// epochs with a shuffle); `Ok(rows)` or the error's text.
fn read_worker(
    dir: &std::path::Path,
    worker: usize,
    workers: usize,
    shuffle: Option<BlockShuffle>,
) -> Result<u64, String> {
    let dataset = ParquetDataset::open_dir(dir).map_err(|e| e.to_string())?;
    let sizes = dataset.description().table_sizes();
    let mut reader = ParquetReader::new(Arc::new(dataset), (0.0, 1.0), worker, workers, 7, sizes)
        .map_err(|e| e.to_string())?
        .with_shuffle(shuffle);
    let mut out = Batch::new(13, 26);
    let mut rows = 0;
    for epoch in 0..if shuffle.is_some() { 2 } else { 1 } {
        if epoch > 0 {
            reader.rewind();
        }
        loop {
            out.clear();
            match reader.next_batch(&mut out, 64) {
                Ok(0) => break,
                Ok(n) => rows += n as u64,
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    Ok(rows)
}

#[test]
fn every_single_byte_corruption_is_an_error_or_a_clean_read() {
    let written = tempfile::tempdir().unwrap();
    let options = WriterOptions { row_group_rows: 8, rows_per_file: None, zstd_level: 1 };
    let mut w = ParquetWriter::create(written.path(), SchemaDescription::criteo(&[100; 26], 7), options).unwrap();
    w.write(&batch(8)).unwrap();
    w.finish().unwrap();
    let file = std::fs::read_dir(written.path()).unwrap().next().unwrap().unwrap().path();
    let good = std::fs::read(&file).unwrap();
    assert_eq!(read_all(written.path()), Ok(8));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("part-00000.parquet");
    // The footer: its length is the 4 bytes before the closing magic.
    let footer_len = u32::from_le_bytes(good[good.len() - 8..good.len() - 4].try_into().unwrap()) as usize;
    let footer = good.len() - 8 - footer_len;
    let (mut errors, mut clean) = (0, 0);
    for at in 0..good.len() {
        let values: &[u8] = if at >= footer { &[good[at] ^ 0x80, 0xFF] } else { &[good[at] ^ 0x80] };
        for &value in values {
            let mut bytes = good.clone();
            bytes[at] = value;
            std::fs::write(&path, &bytes).unwrap();
            match read_all(dir.path()) {
                Ok(_) => clean += 1,
                Err(e) => {
                    assert!(e.contains("part-00000.parquet"), "the error names the file: {e}");
                    errors += 1;
                }
            }
        }
    }
    assert!(errors > 0 && clean > 0, "{errors} errors, {clean} clean reads");
}

/// The same for a line source (rows with their `_line_start`, as `convert`
/// writes them) read by two workers in shuffled blocks: the workers look up
/// the rows of their byte ranges in the `_line_start` column, a decode of its
/// own, and where both read to the end they read every row once. Every byte of
/// that column's chunks is changed in turn (the test above covers the footer).
#[test]
fn every_single_byte_corruption_of_a_line_source_is_an_error_or_a_clean_read() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let written = tempfile::tempdir().unwrap();
    let options = WriterOptions { row_group_rows: 8, rows_per_file: None, zstd_level: 1 };
    let mut description = SchemaDescription::criteo(&[100; 26], 7);
    description.lines = Some(LineSource { file_bytes: vec![2_400] });
    let mut w = ParquetWriter::create(written.path(), description, options).unwrap();
    let starts: Vec<u64> = (0..24).map(|r| r * 100).collect();
    w.write_with_line_starts(&batch(24), &starts).unwrap();
    w.finish().unwrap();
    let file = std::fs::read_dir(written.path()).unwrap().next().unwrap().unwrap().path();
    let good = std::fs::read(&file).unwrap();
    // The byte ranges of the `_line_start` column's chunks.
    let meta = SerializedFileReader::new(std::fs::File::open(&file).unwrap()).unwrap().metadata().clone();
    let leaf = (0..meta.file_metadata().schema_descr().num_columns())
        .find(|&c| meta.file_metadata().schema_descr().column(c).name() == "_line_start")
        .expect("the column");
    let bytes_to_change: Vec<usize> = (0..meta.num_row_groups())
        .flat_map(|g| {
            let (start, len) = meta.row_group(g).column(leaf).byte_range();
            start as usize..(start + len) as usize
        })
        .collect();
    let shuffle = Some(BlockShuffle::new(3, Some(500)).unwrap());
    let both = |dir: &std::path::Path| -> Result<u64, String> {
        Ok(read_worker(dir, 0, 2, shuffle)? + read_worker(dir, 1, 2, shuffle)?)
    };
    assert_eq!(both(written.path()), Ok(48), "24 rows, two epochs");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("part-00000.parquet");
    let (mut errors, mut clean) = (0, 0);
    for at in bytes_to_change {
        let mut bytes = good.clone();
        bytes[at] ^= 0x80;
        std::fs::write(&path, &bytes).unwrap();
        match both(dir.path()) {
            Ok(rows) => {
                // Rows with a non-finite dense value are bad records, not rows read.
                let one = read_worker(dir.path(), 0, 1, shuffle);
                assert!(one.as_ref().is_ok_and(|&r| r == rows), "byte {at}: two workers {rows}, one {one:?}");
                clean += 1;
            }
            Err(e) => {
                assert!(e.contains("part-00000.parquet"), "byte {at}: the error names the file: {e}");
                errors += 1;
            }
        }
    }
    assert!(errors > 0 && clean > 0, "{errors} errors, {clean} clean reads");
}
