//! Inputs that crashed a fuzz target, rebuilt by code (no data copied), run
//! through the same targets: each must now pass.

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::sync::Arc;
use tiderec_fuzz::checkpoint::manifest_seeds;
use tiderec_fuzz::seeds::{default_data_dir, seeds};
use tiderec_fuzz::{replay, target};

fn run(name: &str, input: &[u8]) {
    let t = target(name).expect("a target");
    if let Err(message) = replay(t.run, input) {
        panic!("{name} crashes: {message}");
    }
}

/// A spec whose one column feeds 257 categorical fields (or dense features)
/// made the line parser index past its 256-entry arrays.
#[test]
fn spec_with_more_features_than_the_parser_holds() {
    let head = "delimiter = \",\"\ncolumns = [\"y\", \"x\"]\nlabel = { column = \"y\" }\n";
    for table in ["[[categorical]]\ncolumn = \"x\"\nbuckets = 10\n", "[[dense]]\ncolumn = \"x\"\n"] {
        run("feature_spec_toml", format!("{head}{}", table.repeat(257)).as_bytes());
    }
}

/// A manifest whose worker count is 2^32 or u64::MAX made the loader list
/// that many file names (a 100 GB allocation, or a capacity overflow).
#[test]
fn manifest_with_a_huge_worker_count() {
    let manifest = String::from_utf8(manifest_seeds().remove(0)).unwrap();
    let needle = "\"workers\": 2,";
    assert!(manifest.contains(needle), "{manifest}");
    for workers in ["4294967296", "18446744073709551615"] {
        run("checkpoint_manifest", manifest.replace(needle, &format!("\"workers\": {workers},")).as_bytes());
    }
}

/// `lr = nan` in a settings file loaded as the default learning rate, and other
/// non-finite or out-of-range numbers as `invalid type: null` or not at all.
#[test]
fn settings_with_non_finite_or_out_of_range_numbers() {
    for text in ["lr = nan\n", "l2_dense = inf\n", "connect_timeout = 1e300\n", "workers = 30000\n"] {
        run("train_settings_toml", text.as_bytes());
        let e = tiderec::TrainSettings::from_toml_str(text).expect_err(text);
        assert!(e.reason.contains("is outside the allowed range"), "{text}: {e}");
    }
}

/// A settings table named by the empty key (`[""]`) was refused with a blank
/// key: "unknown setting ``".
#[test]
fn settings_with_an_empty_key() {
    for text in ["[\"\"]\n", "\"\" = 1\n"] {
        run("train_settings_toml", text.as_bytes());
        let e = tiderec::TrainSettings::from_toml_str(text).expect_err(text);
        assert_eq!(e.key, "\"\"", "{text}: {e}");
    }
}

/// A Parquet file whose footer declares 63 rows for a row group holding 4 read
/// to its end as if it had ended early: 12 rows of the 71 its metadata counts,
/// with no error and no bad record. The footer's row count of the DIEN seed's
/// second row group (written as the zigzag varint `8`) is set to 63 (`126`).
#[test]
fn parquet_footer_declaring_more_rows_than_its_data() {
    use tiderec_sources::parquet::{ParquetDataset, ParquetReader};
    let Some(data) = skip::existing(default_data_dir()) else { return };
    let mut file = seeds("parquet", &data).expect("parquet seeds").remove(1);
    const AT: usize = 3579;
    assert_eq!(file[AT], 8, "the DIEN seed changed: find the byte holding its second row group's row count");
    file[AT] = 126;
    run("parquet", &file);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("part-00000.parquet"), &file).unwrap();
    let dataset = ParquetDataset::open_dir(dir.path()).expect("the footer itself reads");
    let sizes = dataset.description().table_sizes();
    let (d, s) = dataset.description().shape();
    let mut reader = ParquetReader::new(Arc::new(dataset), (0.0, 1.0), 0, 1, 7, sizes).unwrap();
    assert_eq!(reader.rows_this_epoch(), 71);
    let mut batch = tiderec_operators::Batch::with_sequences(d, s, 2);
    let error = loop {
        batch.clear();
        match reader.next_batch(&mut batch, 512) {
            Ok(0) => panic!("the damaged row group read to its end without an error"),
            Ok(_) => {}
            Err(e) => break e.to_string(),
        }
    };
    assert!(error.contains("(row group 1)") && error.contains("metadata declares rows up to 67"), "{error}");
}

/// A line source whose `_line_start` chunk starts with a dictionary-encoded
/// data page and no dictionary page before it made the parquet crate panic
/// ("Decoder for dict should have been set") while the workers looked up their
/// rows: that lookup decoded the column without the reader's panic guard. The
/// line-source seed's first row group's data page of that column (30 bytes at
/// 3,016) is copied over its dictionary page (at 2,969).
#[test]
fn line_source_column_chunk_without_its_dictionary_page() {
    use tiderec_sources::parquet::{ParquetDataset, ParquetReader};
    let Some(data) = skip::existing(default_data_dir()) else { return };
    let mut file = seeds("parquet", &data).expect("parquet seeds").remove(2);
    const DICTIONARY: usize = 2969;
    const DATA: usize = 3016;
    // Page headers begin with the page type (thrift field 1): a dictionary page, then a data page.
    assert_eq!(
        (&file[DICTIONARY..DICTIONARY + 2], &file[DATA..DATA + 2]),
        (&[0x15, 0x04][..], &[0x15, 0x00][..]),
        "the line-source seed changed: find its first `_line_start` dictionary and data pages"
    );
    file.copy_within(DATA..DATA + 30, DICTIONARY);
    run("parquet", &file);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("part-00000.parquet"), &file).unwrap();
    let dataset = Arc::new(ParquetDataset::open_dir(dir.path()).expect("the footer itself reads"));
    assert!(dataset.line_source().is_some());
    let (sizes, (d, s)) = (dataset.description().table_sizes(), dataset.description().shape());
    // The second epoch of worker 0 of 2, in shuffled blocks of 256 bytes, looks
    // rows up in every row group: an error, not a panic.
    let read = || -> Result<(), tiderec_sources::SourceError> {
        let shuffle = tiderec_sources::shuffle::BlockShuffle::new(3, Some(256))?;
        let mut reader =
            ParquetReader::new(dataset.clone(), (0.0, 1.0), 0, 2, 7, sizes.clone())?.with_shuffle(Some(shuffle));
        let mut batch = tiderec_operators::Batch::new(d, s);
        for _ in 0..2 {
            while reader.next_batch(&mut batch, 512)? > 0 {}
            reader.rewind();
        }
        Ok(())
    };
    let error = read().expect_err("a damaged column").to_string();
    assert!(error.contains("part-00000.parquet (row group 0)") && error.contains("Parquet decoder failed"), "{error}");
}
