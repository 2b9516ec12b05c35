//! Avazu CTR CSV (Kaggle): `id,click,hour,C1,banner_pos,…,C21`, 24 columns, header line.
//!
//! * `id` (a uint64 that can exceed i64) is not a feature and is not parsed.
//! * `click` is the label (`0` or `1`).
//! * `hour` is `YYMMDDHH`; its hour of day becomes one dense feature
//!   (`HH / 23`) and one categorical field.
//! * The 21 other columns (`C1`, `banner_pos`, site/app/device ids, `C14`…`C21`)
//!   are categorical: the raw bytes of each value are hashed with a seeded
//!   per-field hash into that field's table (no parsing, no allocation). An
//!   empty value is an empty bag.
//!
//! So a sample has 1 dense feature and 22 sparse fields ([`NUM_DENSE`],
//! [`NUM_SPARSE`]). The unlabeled Kaggle `test` file has 23 columns and is
//! rejected line by line as [`BadReason::FieldCount`].

use crate::error::SourceError;
use crate::lines::{LineFormat, LineReader, ReaderOptions};
use std::path::PathBuf;
use tiderec_records::bad_record::{BadReason, DeadLetterSink};
use tiderec_records::features::field_seed;
use tiderec_records::features::fused::token_bucket;
use tiderec_records::features::split::split_exact;
use tiderec_records::Batch;

/// Columns of a labeled line.
pub const NUM_COLUMNS: usize = 24;
/// Dense features per sample (hour of day).
pub const NUM_DENSE: usize = 1;
/// Sparse fields per sample: the 21 categorical columns and the hour of day.
pub const NUM_SPARSE: usize = 22;

/// The Avazu line format with per-field table sizes.
#[derive(Clone, Debug)]
pub struct AvazuFormat {
    table_sizes: Vec<u64>,
    seeds: Vec<u64>,
}

impl AvazuFormat {
    /// `table_sizes` has one entry per sparse field ([`NUM_SPARSE`]); errors name a bad size.
    pub fn new(table_sizes: Vec<u64>, seed: u64) -> Result<Self, SourceError> {
        if table_sizes.len() != NUM_SPARSE || table_sizes.contains(&0) {
            return Err(SourceError::config(
                "table_sizes",
                format!("Avazu needs {NUM_SPARSE} positive table sizes, got {table_sizes:?}"),
            ));
        }
        let seeds = (0..NUM_SPARSE).map(|f| field_seed(seed, f)).collect();
        Ok(AvazuFormat { table_sizes, seeds })
    }
}

impl LineFormat for AvazuFormat {
    fn shape(&self) -> (usize, usize) {
        (NUM_DENSE, NUM_SPARSE)
    }

    fn is_header(&self, line: &[u8]) -> bool {
        line.starts_with(b"id,")
    }

    fn parse(&self, line: &[u8], out: &mut Batch) -> Result<(), (BadReason, Option<usize>)> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let fields = split_exact::<NUM_COLUMNS>(line, b',').ok_or((BadReason::FieldCount, None))?;
        let label = match fields[1] {
            b"0" => 0.0,
            b"1" => 1.0,
            _ => return Err((BadReason::BadLabel, Some(1))),
        };
        let hour = match fields[2] {
            [_, _, _, _, _, _, h1 @ b'0'..=b'2', h2 @ b'0'..=b'9'] if (h1 - b'0') * 10 + (h2 - b'0') < 24 => {
                (h1 - b'0') * 10 + (h2 - b'0')
            }
            _ => return Err((BadReason::BadInteger, Some(2))),
        };
        if !fields[2].iter().all(u8::is_ascii_digit) {
            return Err((BadReason::BadInteger, Some(2)));
        }
        out.labels.push(label);
        out.dense.push(hour as f32 / 23.0);
        for (f, value) in fields[3..].iter().enumerate() {
            let bag = &mut out.sparse[f];
            if !value.is_empty() {
                bag.ids.push(token_bucket(self.seeds[f], value, self.table_sizes[f]));
            }
            bag.close_bag();
        }
        let last = NUM_SPARSE - 1;
        out.sparse[last].ids.push(token_bucket(self.seeds[last], &[hour], self.table_sizes[last]));
        out.sparse[last].close_bag();
        Ok(())
    }
}

/// Reads Avazu CSV files, one worker's share of each (see [`crate::lines`]).
pub type AvazuReader = LineReader<AvazuFormat>;

/// Opens an Avazu reader for worker `worker` of `workers` over `span` of each file.
pub fn open_avazu(
    paths: &[PathBuf],
    span: (f64, f64),
    worker: usize,
    workers: usize,
    format: AvazuFormat,
    options: ReaderOptions,
    dead_letters: Option<Box<dyn DeadLetterSink>>,
) -> Result<AvazuReader, SourceError> {
    LineReader::open_format(paths, span, worker, workers, format, options, dead_letters)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &[u8] = b"1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79";

    #[test]
    fn parses_a_line_and_rejects_bad_ones() {
        let f = AvazuFormat::new(vec![1000; NUM_SPARSE], 1).unwrap();
        let mut b = Batch::new(NUM_DENSE, NUM_SPARSE);
        f.parse(LINE, &mut b).unwrap();
        b.check().unwrap();
        assert_eq!(b.labels, [0.0]);
        assert_eq!(b.dense, [0.0]);
        assert!(b.sparse.iter().all(|s| s.bag(0).len() == 1 && s.ids[0] < 1000));
        // Same value, same field → same id; other field → (almost surely) another id.
        let mut c = Batch::new(NUM_DENSE, NUM_SPARSE);
        f.parse(LINE, &mut c).unwrap();
        assert_eq!(b, c);
        let text = std::str::from_utf8(LINE).unwrap();
        let bad_label = text.replacen(",0,14102100", ",2,14102100", 1);
        assert_eq!(f.parse(bad_label.as_bytes(), &mut c), Err((BadReason::BadLabel, Some(1))));
        let bad_hour = text.replacen("14102100", "141021x0", 1);
        assert_eq!(f.parse(bad_hour.as_bytes(), &mut c), Err((BadReason::BadInteger, Some(2))));
        let unlabeled = text.replacen(",0,", ",", 1);
        assert_eq!(f.parse(unlabeled.as_bytes(), &mut c), Err((BadReason::FieldCount, None)));
        assert_eq!(c.len(), 1, "bad lines append nothing");
        assert!(f.is_header(b"id,click,hour"));
    }
}
