//! Parquet written by `ParquetWriter` and read back by `ParquetReader`: the same
//! batches as the raw readers, every row read once per epoch across workers
//! (split inside row groups), and clear errors for files that do not fit.

mod parquet_common;

use arrow_array::{ArrayRef, Float32Array, Int64Array, RecordBatch};
use parquet::arrow::ArrowWriter;
use parquet_common::*;
use std::sync::Arc;
use tiderec_records::spec::FeatureSpec;
use tiderec_sources::criteo::{NUM_DENSE, NUM_SPARSE};
use tiderec_sources::parquet::dataset::row_group_order;
use tiderec_sources::parquet::{
    ParquetDataset, ParquetReader, SchemaDescription, SparseKind, WriterOptions, METADATA_KEY,
};
use tiderec_sources::SourceError;

fn options(row_group_rows: usize, rows_per_file: Option<u64>) -> WriterOptions {
    WriterOptions { row_group_rows, rows_per_file, ..WriterOptions::default() }
}

#[test]
fn criteo_round_trip_gives_the_tsv_readers_batches_in_order() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let tsv = criteo_batches(&src, 1000);
    assert_eq!(tsv.len(), 10);
    let description = SchemaDescription::criteo(&criteo_features().table_sizes, SEED);
    // 7,000 rows per file: part-00000 has row groups of 3,000, 3,000, 1,000; part-00001 3,000.
    let files = write(dir.path(), description.clone(), &tsv, options(3000, Some(7000)));
    assert_eq!(files.len(), 2);
    assert!(files[0].ends_with("part-00000.parquet") && files[1].ends_with("part-00001.parquet"));
    let dataset = Arc::new(ParquetDataset::open_dir(dir.path()).unwrap());
    assert_eq!(dataset.description(), &description);
    assert_eq!(dataset.total_rows(), 10_000);
    let rows: Vec<u64> = dataset.row_groups().iter().map(|g| g.rows).collect();
    assert_eq!(rows, [3000, 3000, 1000, 3000]);
    // Same batches, same order, batches spanning row groups and files included.
    assert_eq!(parquet_batches(&dataset, 0, 1, 1000, 0), tsv);
    let all = concat(&tsv, NUM_DENSE, NUM_SPARSE);
    assert_eq!(concat(&parquet_batches(&dataset, 0, 1, 777, 0), NUM_DENSE, NUM_SPARSE), all);
    // A later epoch reads the same rows in another row-group order.
    let shuffled = concat(&parquet_batches(&dataset, 0, 1, 1000, 1), NUM_DENSE, NUM_SPARSE);
    assert_eq!(shuffled.len(), all.len());
    assert_ne!(shuffled, all);
    let labels = |b: &tiderec_records::Batch| b.labels.iter().filter(|&&l| l == 1.0).count();
    assert_eq!(labels(&shuffled), labels(&all));
}

#[test]
fn workers_split_the_rows_of_every_epoch_inside_row_groups() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let tsv = criteo_batches(&src, 4096);
    let all = concat(&tsv, NUM_DENSE, NUM_SPARSE);
    // One file, ten row groups of 1,000 rows: fewer files than workers, and with 12
    // workers fewer row groups than workers.
    write(dir.path(), SchemaDescription::criteo(&criteo_features().table_sizes, SEED), &tsv, options(1000, None));
    let dataset = Arc::new(ParquetDataset::open_dir(dir.path()).unwrap());
    assert_eq!(dataset.row_groups().len(), 10);
    for workers in [2, 3, 4, 12] {
        for epoch in [0, 1, 2] {
            // The epoch's row groups in order form one sequence; worker w reads its
            // [N·w/W, N·(w+1)/W).
            let mut sequence = tiderec_records::Batch::new(NUM_DENSE, NUM_SPARSE);
            for g in row_group_order(10, epoch, SEED) {
                sequence.extend_from(&slice(&all, g * 1000..(g + 1) * 1000));
            }
            let mut total = 0;
            for w in 0..workers {
                let got = concat(&parquet_batches(&dataset, w, workers, 300, epoch), NUM_DENSE, NUM_SPARSE);
                let want = slice(&sequence, 10_000 * w / workers..10_000 * (w + 1) / workers);
                assert!(!got.is_empty(), "worker {w} of {workers} reads");
                assert_eq!(got, want, "worker {w} of {workers}, epoch {epoch}");
                total += got.len();
            }
            assert_eq!(total, 10_000);
        }
    }
}

#[test]
fn spans_hold_out_the_tail_of_every_row_group() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let tsv = criteo_batches(&src, 4096);
    let all = concat(&tsv, NUM_DENSE, NUM_SPARSE);
    write(dir.path(), SchemaDescription::criteo(&criteo_features().table_sizes, SEED), &tsv, options(2500, None));
    let dataset = Arc::new(ParquetDataset::open_dir(dir.path()).unwrap());
    let read = |span| {
        let mut r = ParquetReader::new(dataset.clone(), span, 0, 1, SEED, dataset.description().table_sizes()).unwrap();
        concat(&drain(|b| r.next_batch(b, 999).unwrap(), NUM_DENSE, NUM_SPARSE), NUM_DENSE, NUM_SPARSE)
    };
    let (train, eval) = (read((0.0, 0.8)), read((0.8, 1.0)));
    assert_eq!((train.len(), eval.len()), (8000, 2000));
    assert_eq!(dataset.rows_in_span((0.0, 0.8)), 8000);
    for g in 0..4 {
        assert_eq!(slice(&train, g * 2000..(g + 1) * 2000), slice(&all, g * 2500..g * 2500 + 2000));
        assert_eq!(slice(&eval, g * 500..(g + 1) * 500), slice(&all, g * 2500 + 2000..(g + 1) * 2500));
    }
}

#[test]
fn spec_lists_round_trip_as_list_columns() {
    let dir = tempfile::tempdir().unwrap();
    let src = elm_file(dir.path(), 700);
    let spec = FeatureSpec::elm(5000, 20);
    let lines = spec_batches(&src, &spec, 128);
    let description = SchemaDescription::from_spec(&spec, SEED);
    assert_eq!(description.sparse.iter().filter(|s| s.kind == SparseKind::List).count(), 10);
    let out = dir.path().join("pq");
    write(&out, description, &lines, options(300, Some(500)));
    let dataset = Arc::new(ParquetDataset::open_dir(&out).unwrap());
    assert_eq!(parquet_batches(&dataset, 0, 1, 128, 0), lines);
    let (d, s) = spec.shape();
    let all = concat(&lines, d, s);
    assert!(all.sparse[18..].iter().any(|f| (0..f.len()).any(|i| f.bag(i).len() > 1)), "multi-id bags exist");
    assert!(all.sparse[18..].iter().any(|f| (0..f.len()).any(|i| f.bag(i).is_empty())), "empty bags exist");
}

fn err_text(e: SourceError) -> String {
    e.to_string()
}

#[test]
fn unusable_inputs_are_errors_naming_file_and_column() {
    let dir = tempfile::tempdir().unwrap();
    // Missing directory, directory without Parquet files, a non-Parquet file named .parquet.
    let missing = dir.path().join("nope");
    let e = err_text(ParquetDataset::open_dir(&missing).unwrap_err());
    assert!(e.contains("nope"), "{e}");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(empty.join("notes.txt"), "x").unwrap();
    let e = err_text(ParquetDataset::open_dir(&empty).unwrap_err());
    assert!(e.contains("holds no *.parquet files"), "{e}");
    let fake = dir.path().join("fake");
    std::fs::create_dir(&fake).unwrap();
    std::fs::write(fake.join("x.parquet"), "label,I1\n1,2\n").unwrap();
    let e = err_text(ParquetDataset::open_dir(&fake).unwrap_err());
    assert!(e.contains("x.parquet"), "{e}");

    // A file whose metadata describes Criteo but lacks C7, and one where C7 has the wrong type.
    let description = SchemaDescription::criteo(&[100; 26], SEED);
    let write_with = |name: &str, c7: Option<ArrayRef>| {
        let mut cols: Vec<(String, ArrayRef)> = Vec::new();
        for (name, ty) in description.column_types() {
            let array: ArrayRef = match (name, &c7) {
                ("C7", Some(a)) => a.clone(),
                ("C7", None) => continue,
                _ => arrow_array::new_null_array(&ty, 2),
            };
            let array = if name == "label" || ty == arrow_schema::DataType::Float32 {
                Arc::new(Float32Array::from(vec![0.0, 1.0])) as ArrayRef
            } else {
                array
            };
            cols.push((name.to_string(), array));
        }
        let batch = RecordBatch::try_from_iter(cols).unwrap();
        let props = parquet::file::properties::WriterProperties::builder()
            .set_key_value_metadata(Some(vec![parquet::file::metadata::KeyValue::new(
                METADATA_KEY.to_string(),
                description.to_json(),
            )]))
            .build();
        let path = dir.path().join(name);
        let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        path
    };
    let no_c7 = write_with("no_c7.parquet", None);
    let e = err_text(ParquetDataset::open(&[no_c7]).unwrap_err());
    assert!(e.contains("no_c7.parquet") && e.contains("no column `C7`"), "{e}");
    let int_c7 = write_with("int_c7.parquet", Some(Arc::new(Int64Array::from(vec![1, 2]))));
    let e = err_text(ParquetDataset::open(&[int_c7]).unwrap_err());
    assert!(e.contains("int_c7.parquet") && e.contains("`C7` is Int64, expected UInt64"), "{e}");
    // Ids beyond the table size are caught when read, naming file, row group and column.
    let big = write_with("big.parquet", Some(Arc::new(arrow_array::UInt64Array::from(vec![5, 500]))));
    let dataset = Arc::new(ParquetDataset::open(&[big]).unwrap());
    let mut r = ParquetReader::new(dataset, (0.0, 1.0), 0, 1, SEED, vec![100; 26]).unwrap();
    let mut b = tiderec_records::Batch::new(NUM_DENSE, NUM_SPARSE);
    let e = err_text(r.next_batch(&mut b, 10).unwrap_err());
    assert!(e.contains("big.parquet (row group 0)") && e.contains("`C7`: row 2: id 500"), "{e}");

    // A file without tiderec metadata.
    let plain = dir.path().join("plain.parquet");
    let batch = RecordBatch::try_from_iter([("label", Arc::new(Float32Array::from(vec![1.0])) as ArrayRef)]).unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(&plain).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let e = err_text(ParquetDataset::open(&[plain]).unwrap_err());
    assert!(e.contains("plain.parquet") && e.contains(METADATA_KEY), "{e}");
}

#[test]
fn writer_refuses_a_directory_that_already_holds_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let description = SchemaDescription::criteo(&[100; 26], SEED);
    let mut b = tiderec_records::Batch::new(NUM_DENSE, NUM_SPARSE);
    b.labels.push(1.0);
    b.dense.resize(NUM_DENSE, 0.5);
    b.sparse.iter_mut().for_each(|f| f.close_bag());
    write(dir.path(), description.clone(), std::slice::from_ref(&b), options(10, None));
    let e = tiderec_sources::parquet::ParquetWriter::create(dir.path(), description, options(10, None));
    assert!(e.err().unwrap().to_string().contains("already holds Parquet files"));
}

/// Files cut by `rows_per_file` keep their hidden temporary names until the writer
/// finishes: a writer that never finishes (a killed conversion) leaves no `*.parquet`
/// file, so no dataset that looks complete with only its first files' rows.
#[test]
fn files_get_their_names_only_when_the_writer_finishes() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let batches = criteo_batches(&src, 1000);
    let description = SchemaDescription::criteo(&criteo_features().table_sizes, SEED);
    let mut w =
        tiderec_sources::parquet::ParquetWriter::create(dir.path(), description, options(500, Some(1000))).unwrap();
    for b in &batches[..3] {
        w.write(b).unwrap();
    }
    let names = |dir: &std::path::Path| {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    assert_eq!(names(dir.path()), [".part-00000.parquet.tmp", ".part-00001.parquet.tmp", ".part-00002.parquet.tmp"]);
    assert!(ParquetDataset::open_dir(dir.path()).is_err(), "no dataset before the end");
    // Dropped without finishing (as a killed process leaves it): still no `*.parquet` file.
    drop(w);
    assert!(names(dir.path()).iter().all(|n| n.starts_with('.')));
    // The next writer into the directory removes what the killed one left.
    let description = SchemaDescription::criteo(&criteo_features().table_sizes, SEED);
    let files = write(dir.path(), description, &batches[..1], options(500, Some(1000)));
    assert_eq!((names(dir.path()), files.len()), (vec!["part-00000.parquet".to_string()], 1));

    let done = tempfile::tempdir().unwrap();
    let files = write(
        done.path(),
        SchemaDescription::criteo(&criteo_features().table_sizes, SEED),
        &batches[..3],
        options(500, Some(1000)),
    );
    assert_eq!(names(done.path()), ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]);
    assert_eq!(files.len(), 3);
    assert_eq!(ParquetDataset::open_dir(done.path()).unwrap().total_rows(), 3000);
}

/// A behaviour batch: user, item, category and two histories per row; the
/// category history of `short_row` (if any) has one id fewer than its item history.
fn behavior_batch(rows: usize, short_row: Option<usize>) -> tiderec_records::Batch {
    let mut b = tiderec_records::Batch::with_sequences(0, 3, 2);
    for r in 0..rows {
        b.labels.push((r % 2) as f32);
        for (f, field) in b.sparse.iter_mut().enumerate() {
            field.ids.push((r * 3 + f) as u64 % [7, 7, 5][f]);
            field.close_bag();
        }
        let len = r % 4; // empty histories included
        for i in 0..len {
            b.sequences[0].ids.push(((r + i) % 7) as u64);
            if short_row != Some(r) || i + 1 < len {
                b.sequences[1].ids.push(((r * i) % 5) as u64);
            }
        }
        b.sequences[0].close_bag();
        b.sequences[1].close_bag();
    }
    b
}

fn read_behavior(dataset: &Arc<ParquetDataset>, max: usize) -> Result<tiderec_records::Batch, SourceError> {
    let mut reader = ParquetReader::new(dataset.clone(), (0.0, 1.0), 0, 1, SEED, vec![7, 7, 5])?;
    let mut all = tiderec_records::Batch::with_sequences(0, 3, 2);
    while reader.next_batch(&mut all, max)? > 0 {}
    Ok(all)
}

#[test]
fn behaviour_histories_round_trip_as_sequence_columns() {
    let dir = tempfile::tempdir().unwrap();
    let batch = behavior_batch(23, None);
    let description = SchemaDescription::behavior("amazon-dien", &[7, 7, 5], SEED);
    write(dir.path(), description.clone(), std::slice::from_ref(&batch), options(5, None));
    let dataset = Arc::new(ParquetDataset::open_dir(dir.path()).unwrap());
    assert_eq!(dataset.description(), &description);
    assert_eq!(dataset.row_groups().len(), 5);
    // Read in pieces that cross row groups: the same rows, histories in order.
    let back = read_behavior(&dataset, 3).unwrap();
    assert_eq!(back, batch);
    // A batch without the sequence fields does not fit this schema.
    let mut reader = ParquetReader::new(dataset.clone(), (0.0, 1.0), 0, 1, SEED, vec![7, 7, 5]).unwrap();
    let mut flat = tiderec_records::Batch::new(0, 3);
    assert!(reader.next_batch(&mut flat, 4).unwrap_err().to_string().contains("0 sequence fields, expected 0 / 3 / 2"));
}

#[test]
fn unequal_histories_and_out_of_range_history_ids_are_errors() {
    let description = SchemaDescription::behavior("amazon-dien", &[7, 7, 5], SEED);
    let dir = tempfile::tempdir().unwrap();
    // Row groups of 4: the bad row (the 7th) is the 3rd of its group, named by its row in the file.
    write(dir.path(), description.clone(), &[behavior_batch(10, Some(6))], options(4, None));
    let dataset = Arc::new(ParquetDataset::open_dir(dir.path()).unwrap());
    let e = read_behavior(&dataset, 4).unwrap_err().to_string();
    assert!(e.contains("history_categories") && e.contains("equal lengths") && e.contains("row 7: 1 ids"), "{e}");
    // An item-history id beyond the item table (the category table is smaller).
    let dir = tempfile::tempdir().unwrap();
    let mut small = description;
    small.sparse[1].table_size = 3;
    write(dir.path(), small, &[behavior_batch(10, None)], options(100, None));
    let dataset = Arc::new(ParquetDataset::open_dir(dir.path()).unwrap());
    let mut reader = ParquetReader::new(dataset, (0.0, 1.0), 0, 1, SEED, vec![7, 3, 5]).unwrap();
    let mut out = tiderec_records::Batch::with_sequences(0, 3, 2);
    let e = reader.next_batch(&mut out, 10).unwrap_err().to_string();
    assert!(e.contains("is not below the table size 3"), "{e}");
}

/// The batches `next` appends until it appends none (the rest of an epoch).
fn epoch_batches<R>(
    reader: &mut R,
    next: impl Fn(&mut R, &mut tiderec_records::Batch) -> usize,
) -> Vec<tiderec_records::Batch> {
    drain(|b| next(reader, b), NUM_DENSE, NUM_SPARSE)
}

#[test]
fn a_line_source_replays_the_shuffled_blocks_of_the_raw_files() {
    use tiderec_sources::criteo::{CriteoConfig, CriteoReader};
    use tiderec_sources::parquet::schema::LineSource;
    use tiderec_sources::parquet::ParquetWriter;
    use tiderec_sources::shuffle::BlockShuffle;
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    // Convert as `tiderec convert` does: every row with its line's start.
    let config = || CriteoConfig::new(criteo_features());
    let mut reader = CriteoReader::open(std::slice::from_ref(&src), 0, 1, config(), None).unwrap();
    reader.record_line_starts();
    let mut description = SchemaDescription::criteo(&criteo_features().table_sizes, SEED);
    description.lines = Some(LineSource { file_bytes: reader.file_bytes() });
    let mut writer = ParquetWriter::create(dir.path(), description, options(1500, Some(4000))).unwrap();
    loop {
        let mut b = tiderec_records::Batch::new(NUM_DENSE, NUM_SPARSE);
        if reader.next_batch(&mut b, 1000).unwrap() == 0 {
            break;
        }
        writer.write_with_line_starts(&b, &reader.take_line_starts()).unwrap();
    }
    writer.finish().unwrap();
    let dataset = Arc::new(ParquetDataset::open_dir(dir.path()).unwrap());
    assert!(dataset.line_source().is_some());
    let shuffle = Some(BlockShuffle::new(5, Some(20_000)).unwrap());
    for workers in 1..=3 {
        for w in 0..workers {
            let mut lines = CriteoReader::open(std::slice::from_ref(&src), w, workers, config(), None)
                .unwrap()
                .with_shuffle(shuffle);
            let sizes = dataset.description().table_sizes();
            let mut rows =
                ParquetReader::new(dataset.clone(), (0.0, 1.0), w, workers, SEED, sizes).unwrap().with_shuffle(shuffle);
            let mut first = None;
            for epoch in 0..3 {
                let a = epoch_batches(&mut lines, |r, b| r.next_batch(b, 333).unwrap());
                let b = epoch_batches(&mut rows, |r, b| r.next_batch(b, 333).unwrap());
                assert_eq!(a, b, "{workers} workers, worker {w}, epoch {epoch}");
                let all = concat(&a, NUM_DENSE, NUM_SPARSE);
                match &first {
                    None => first = Some(all),
                    Some(f) => assert_ne!(&all, f, "epoch {epoch} is shuffled"),
                }
                lines.rewind();
                rows.rewind();
            }
        }
    }
    // The files given in another order than written: refused, naming both row groups.
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    files.reverse();
    let reversed = Arc::new(ParquetDataset::open(&files).unwrap());
    let sizes = reversed.description().table_sizes();
    let e = ParquetReader::new(reversed, (0.0, 1.0), 0, 1, SEED, sizes).err().expect("refused").to_string();
    assert!(e.contains("in the order `tiderec convert` wrote them") && e.contains("part-"), "{e}");
}

/// A writer of a line source over one input file of `input_bytes` bytes.
fn line_writer(
    dir: &std::path::Path,
    input_bytes: u64,
    row_group_rows: usize,
) -> tiderec_sources::parquet::ParquetWriter {
    use tiderec_sources::parquet::schema::LineSource;
    let mut description = SchemaDescription::criteo(&[100; NUM_SPARSE], SEED);
    description.lines = Some(LineSource { file_bytes: vec![input_bytes] });
    tiderec_sources::parquet::ParquetWriter::create(dir, description, options(row_group_rows, None)).unwrap()
}

/// `rows` Criteo-shaped rows, one id per field.
fn criteo_rows(rows: usize) -> tiderec_records::Batch {
    let mut b = tiderec_records::Batch::new(NUM_DENSE, NUM_SPARSE);
    for r in 0..rows {
        b.labels.push((r % 2) as f32);
        b.dense.extend((0..NUM_DENSE).map(|j| (r + j) as f32));
        for (f, field) in b.sparse.iter_mut().enumerate() {
            field.ids.push(((r * 7 + f) % 100) as u64);
            field.close_bag();
        }
    }
    b
}

#[test]
fn the_writer_refuses_line_starts_that_decrease_or_lie_past_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = line_writer(dir.path(), 1000, 8);
    w.write_with_line_starts(&criteo_rows(3), &[0, 10, 20]).unwrap();
    // Below the previous batch's last position.
    let e = err_text(w.write_with_line_starts(&criteo_rows(2), &[30, 15]).unwrap_err());
    assert!(e.contains("line start 15 of sample 1") && e.contains("previous sample's 30"), "{e}");
    let e = err_text(w.write_with_line_starts(&criteo_rows(1), &[19]).unwrap_err());
    assert!(e.contains("line start 19 of sample 0") && e.contains("previous sample's 20"), "{e}");
    let e = err_text(w.write_with_line_starts(&criteo_rows(2), &[40, 1000]).unwrap_err());
    assert!(e.contains("line start 1000 of sample 1") && e.contains("input's 1000 bytes"), "{e}");
    // Nothing of a refused batch was written; equal positions are allowed.
    assert_eq!(w.rows(), 3);
    w.write_with_line_starts(&criteo_rows(2), &[20, 999]).unwrap();
    assert_eq!(w.finish().unwrap().rows, 5);
}

/// Rewrites the one file of `dir` with the parquet crate, its `_line_start`
/// column changed by `change` (row groups, schema and metadata kept), with column
/// statistics or without.
fn rewrite_line_starts(dir: &std::path::Path, row_group_rows: usize, statistics: bool, change: impl Fn(&mut Vec<u64>)) {
    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::properties::EnabledStatistics;
    use tiderec_sources::parquet::schema::LINE_START_COLUMN;
    let path = std::fs::read_dir(dir).unwrap().next().unwrap().unwrap().path();
    let builder = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap()).unwrap();
    let metadata = builder.metadata().file_metadata().key_value_metadata().cloned();
    let batches: Vec<RecordBatch> = builder.build().unwrap().map(Result::unwrap).collect();
    let schema = batches[0].schema();
    let at = schema.index_of(LINE_START_COLUMN).unwrap();
    let mut starts: Vec<u64> =
        batches.iter().flat_map(|b| b.column(at).as_primitive::<UInt64Type>().values().to_vec()).collect();
    change(&mut starts);
    let props = parquet::file::properties::WriterProperties::builder()
        .set_key_value_metadata(metadata)
        .set_max_row_group_row_count(Some(row_group_rows))
        .set_statistics_enabled(if statistics { EnabledStatistics::Chunk } else { EnabledStatistics::None })
        .build();
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema.clone(), Some(props)).unwrap();
    let mut used = 0;
    for b in &batches {
        let mut columns = b.columns().to_vec();
        let values = starts[used..used + b.num_rows()].to_vec();
        columns[at] = Arc::new(arrow_array::UInt64Array::from(values)) as ArrayRef;
        used += b.num_rows();
        w.write(&RecordBatch::try_new(schema.clone(), columns).unwrap()).unwrap();
    }
    w.close().unwrap();
}

/// A line source of 48 rows, lines 100 bytes apart, in row groups of 16, over an
/// input of 5,000 bytes: two workers split it at byte 2,500, inside row group 1.
fn three_row_groups_of_lines() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut w = line_writer(dir.path(), 5_000, 16);
    let starts: Vec<u64> = (0..48).map(|r| r * 100).collect();
    w.write_with_line_starts(&criteo_rows(48), &starts).unwrap();
    w.finish().unwrap();
    dir
}

/// Rewrites the one file of `dir` with its description's `lines.file_bytes` set to
/// `file_bytes` (rows, row groups of `row_group_rows` and the rest of the metadata kept),
/// as a damaged or crafted file would have them.
fn rewrite_file_bytes(dir: &std::path::Path, row_group_rows: usize, file_bytes: &[u64]) {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::metadata::KeyValue;
    let path = std::fs::read_dir(dir).unwrap().next().unwrap().unwrap().path();
    let builder = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap()).unwrap();
    let text = builder.metadata().file_metadata().key_value_metadata().unwrap()[0].value.clone().unwrap();
    let mut description: serde_json::Value = serde_json::from_str(&text).unwrap();
    description["lines"]["file_bytes"] = serde_json::json!(file_bytes);
    let batches: Vec<RecordBatch> = builder.build().unwrap().map(Result::unwrap).collect();
    let props = parquet::file::properties::WriterProperties::builder()
        .set_key_value_metadata(Some(vec![KeyValue::new(METADATA_KEY.to_string(), description.to_string())]))
        .set_max_row_group_row_count(Some(row_group_rows))
        .build();
    let schema = batches[0].schema();
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, Some(props)).unwrap();
    for b in &batches {
        w.write(b).unwrap();
    }
    w.close().unwrap();
}

/// Input sizes in a file's metadata that no input can have are refused when the dataset
/// is opened, naming the file: past 1 PiB (a shuffled epoch would be cut into some 2^36
/// blocks and abort), adding up past 2^64 (the split's byte arithmetic would wrap), or
/// below the rows' own positions. At the bound, a shuffled epoch reads every row.
#[test]
fn line_source_sizes_that_no_input_has_are_refused_naming_the_file() {
    use tiderec_sources::parquet::schema::MAX_INPUT_BYTES;
    let cases: [(&[u64], &str); 3] = [
        (&[1 << 60], "add up to 1152921504606846976 bytes"),
        (&[u64::MAX, 5_000], "add up to over 2^64 bytes"),
        (&[1_000], "(row group 0): the statistics of `_line_start` reach byte 1500, past the 1000 bytes"),
    ];
    for (file_bytes, want) in cases {
        let dir = three_row_groups_of_lines();
        rewrite_file_bytes(dir.path(), 16, file_bytes);
        let e = err_text(ParquetDataset::open_dir(dir.path()).unwrap_err());
        assert!(e.contains("part-00000.parquet") && e.contains(want), "{file_bytes:?}: {e}");
    }
    let dir = three_row_groups_of_lines();
    rewrite_file_bytes(dir.path(), 16, &[MAX_INPUT_BYTES]);
    let dataset = Arc::new(ParquetDataset::open_dir(dir.path()).unwrap());
    let shuffle = tiderec_sources::shuffle::BlockShuffle::new(3, Some(4096)).unwrap();
    let mut r =
        ParquetReader::new(dataset, (0.0, 1.0), 0, 1, SEED, vec![100; NUM_SPARSE]).unwrap().with_shuffle(Some(shuffle));
    let mut b = tiderec_records::Batch::new(NUM_DENSE, NUM_SPARSE);
    for epoch in 0..2 {
        b.clear();
        assert_eq!(r.next_batch(&mut b, 100).unwrap(), 48, "epoch {epoch}");
        r.rewind();
    }
}

#[test]
fn a_line_start_column_that_decreases_is_an_error_naming_the_row_group() {
    let dir = three_row_groups_of_lines();
    let open = |workers: usize| {
        let dataset = Arc::new(ParquetDataset::open_dir(dir.path()).unwrap());
        let sizes = dataset.description().table_sizes();
        ParquetReader::new(dataset, (0.0, 1.0), 0, workers, SEED, sizes).map(|_| ())
    };
    open(2).unwrap();
    // Rows 20 and 21 of row group 1 swapped: its first position and minimum stay.
    rewrite_line_starts(dir.path(), 16, true, |s| s.swap(20, 21));
    let e = err_text(open(2).unwrap_err());
    assert!(e.contains("part-00000.parquet (row group 1)"), "{e}");
    assert!(e.contains("decreases at row 5 of the row group (2000 after 2100)"), "{e}");
    // Row group 1's last row past the 5,000 bytes of the input: in no worker's range. Its
    // statistics say so when the dataset is opened; without them, the column when read.
    let dir = three_row_groups_of_lines();
    rewrite_line_starts(dir.path(), 16, true, |s| s[31] = 9_999);
    let e = err_text(ParquetDataset::open_dir(dir.path()).unwrap_err());
    assert!(e.contains("part-00000.parquet (row group 1)"), "{e}");
    assert!(e.contains("reach byte 9999, past the 5000 bytes of the input"), "{e}");
    rewrite_line_starts(dir.path(), 16, false, |s| s[31] = 9_999);
    let dataset = Arc::new(ParquetDataset::open_dir(dir.path()).unwrap());
    let sizes = dataset.description().table_sizes();
    let e = err_text(ParquetReader::new(dataset, (0.0, 1.0), 0, 2, SEED, sizes).map(|_| ()).unwrap_err());
    assert!(e.contains("part-00000.parquet (row group 1)"), "{e}");
    assert!(e.contains("holds 9999, past the 5000 bytes of the input"), "{e}");
}

#[test]
fn line_start_statistics_that_disagree_with_the_column_are_an_error() {
    let dir = three_row_groups_of_lines();
    // Row group 1's minimum, 1,600, changed to 1,500 wherever the footer holds it.
    let path = std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path();
    let mut bytes = std::fs::read(&path).unwrap();
    let footer_len = u32::from_le_bytes(bytes[bytes.len() - 8..bytes.len() - 4].try_into().unwrap()) as usize;
    let footer = bytes.len() - 8 - footer_len..bytes.len() - 8;
    let (from, to) = (1600i64.to_le_bytes(), 1500i64.to_le_bytes());
    let at: Vec<usize> = (footer.start..footer.end - 8).filter(|&i| bytes[i..i + 8] == from).collect();
    assert!(!at.is_empty(), "the footer holds the statistics");
    for i in at {
        bytes[i..i + 8].copy_from_slice(&to);
    }
    std::fs::write(&path, bytes).unwrap();
    let dataset = Arc::new(ParquetDataset::open_dir(dir.path()).unwrap());
    let sizes = dataset.description().table_sizes();
    let e = err_text(ParquetReader::new(dataset, (0.0, 1.0), 0, 2, SEED, sizes).map(|_| ()).unwrap_err());
    assert!(e.contains("part-00000.parquet (row group 1)"), "{e}");
    assert!(e.contains("give 1500 as its first position, the column holds 1600"), "{e}");
}
