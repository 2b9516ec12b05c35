//! Amazon reviews in the DIEN pipeline's sample format
//! (`local_train_splitByUser` / `local_test_splitByUser`):
//!
//! ```text
//! label \t user \t item \t category \t hist_items \t hist_categories
//! ```
//!
//! with the histories joined by `\x02` (oldest first) and CRLF line ends.
//!
//! * `label` is `0` or `1`.
//! * The user, the target item and its category become three sparse fields;
//!   the item and category histories become two sequence fields that read
//!   the item and the category tables ([`SEQUENCE_TABLES`]), so a history
//!   item and the same target item share one embedding row.
//! * Values are hashed from their raw bytes with a seeded per-table hash.
//! * The user column is also each sample's group ([`group_key`] in
//!   `Batch::groups`), for per-user metrics.
//! * Only the most recent `max_len` history events are kept.
//! * An empty history field is an empty sequence. Histories of different
//!   lengths are a [`BadReason::FieldCount`] in the category field.

use crate::error::SourceError;
use crate::lines::{LineFormat, LineReader};
use tiderec_records::bad_record::BadReason;
use tiderec_records::features::field_seed;
use tiderec_records::features::fused::token_bucket;
use tiderec_records::features::split::{for_each_token, split_exact};
use tiderec_records::metrics::group_key;
use tiderec_records::Batch;

pub use crate::synthetic_behavior::{NUM_SEQUENCES, NUM_SPARSE, SEQUENCE_TABLES, TARGET_FIELDS};

/// Columns of a line.
pub const NUM_COLUMNS: usize = 6;
/// Separator of history items.
pub const HISTORY_DELIMITER: u8 = 0x02;

/// The DIEN sample format with its table sizes (user, item, category).
#[derive(Clone, Debug)]
pub struct AmazonDienFormat {
    table_sizes: [u64; 3],
    seeds: [u64; 3],
    max_len: usize,
}

impl AmazonDienFormat {
    /// `table_sizes` are the user, item and category tables; errors name a bad setting.
    pub fn new(table_sizes: &[u64], seed: u64, max_len: usize) -> Result<Self, SourceError> {
        let sizes: [u64; 3] = table_sizes.try_into().ok().filter(|s: &[u64; 3]| !s.contains(&0)).ok_or_else(|| {
            SourceError::config(
                "table_sizes",
                format!("DIEN samples need 3 positive table sizes (user, item, category), got {table_sizes:?}"),
            )
        })?;
        if max_len == 0 {
            return Err(SourceError::config("max_len", "must be positive"));
        }
        Ok(AmazonDienFormat { table_sizes: sizes, seeds: [0, 1, 2].map(|t| field_seed(seed, t)), max_len })
    }

    fn bucket(&self, table: usize, token: &[u8]) -> u64 {
        token_bucket(self.seeds[table], token, self.table_sizes[table])
    }

    /// Appends the last `max_len` items of `history` hashed into `table`; returns how many.
    fn push_history(&self, history: &[u8], table: usize, out: &mut Vec<u64>) -> usize {
        if history.is_empty() {
            return 0;
        }
        let total = memchr::memchr_iter(HISTORY_DELIMITER, history).count() + 1;
        let skip = total.saturating_sub(self.max_len);
        let mut i = 0;
        for_each_token(history, HISTORY_DELIMITER, usize::MAX, |t| {
            if i >= skip {
                out.push(self.bucket(table, t));
            }
            i += 1;
        });
        total - skip
    }
}

impl LineFormat for AmazonDienFormat {
    fn shape(&self) -> (usize, usize) {
        (0, NUM_SPARSE)
    }

    fn num_sequences(&self) -> usize {
        NUM_SEQUENCES
    }

    fn parse(&self, line: &[u8], out: &mut Batch) -> Result<(), (BadReason, Option<usize>)> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let fields = split_exact::<NUM_COLUMNS>(line, b'\t').ok_or((BadReason::FieldCount, None))?;
        let label = match fields[0] {
            b"0" => 0.0,
            b"1" => 1.0,
            _ => return Err((BadReason::BadLabel, Some(0))),
        };
        let items_before = memchr::memchr_iter(HISTORY_DELIMITER, fields[4]).count();
        let cats_before = memchr::memchr_iter(HISTORY_DELIMITER, fields[5]).count();
        if items_before != cats_before || fields[4].is_empty() != fields[5].is_empty() {
            return Err((BadReason::FieldCount, Some(5)));
        }
        out.labels.push(label);
        out.groups.push(group_key(fields[1]));
        for (f, value) in fields[1..4].iter().enumerate() {
            if !value.is_empty() {
                let id = self.bucket(f, value);
                out.sparse[f].ids.push(id);
            }
            out.sparse[f].close_bag();
        }
        for (s, value) in fields[4..6].iter().enumerate() {
            let seq = &mut out.sequences[s];
            self.push_history(value, SEQUENCE_TABLES[s], &mut seq.ids);
            seq.close_bag();
        }
        Ok(())
    }
}

/// Reads DIEN-format files, one worker's share of each (see [`crate::lines`]).
pub type AmazonDienReader = LineReader<AmazonDienFormat>;

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> Batch {
        Batch::with_sequences(0, NUM_SPARSE, NUM_SEQUENCES)
    }

    #[test]
    fn parses_the_documented_line() {
        let f = AmazonDienFormat::new(&[1000, 5000, 50], 3, 20).unwrap();
        let mut b = batch();
        f.parse(b"0\tA38AAPXSJN4C5G\t0001714384\tBooks\t0000015393\x020000230022\tdefault_cat\x02Books\r", &mut b)
            .unwrap();
        b.check().unwrap();
        assert_eq!(b.labels, [0.0]);
        assert_eq!(b.groups, [group_key(b"A38AAPXSJN4C5G")], "the user is the sample's group");
        assert_eq!(b.sequences[0].bag(0), &[f.bucket(1, b"0000015393"), f.bucket(1, b"0000230022")]);
        assert_eq!(b.sequences[1].bag(0), &[f.bucket(2, b"default_cat"), f.bucket(2, b"Books")]);
        // The target category and a history category share the table: same id.
        assert_eq!(b.sparse[2].bag(0), &[f.bucket(2, b"Books")]);
        assert_eq!(b.sequences[1].bag(0)[1], b.sparse[2].bag(0)[0]);
    }

    #[test]
    fn keeps_the_most_recent_events() {
        let f = AmazonDienFormat::new(&[10, 100, 10], 3, 2).unwrap();
        let mut b = batch();
        f.parse(b"1\tu\ti\tc\ta\x02b\x02c\tx\x02y\x02z", &mut b).unwrap();
        assert_eq!(b.sequences[0].bag(0), &[f.bucket(1, b"b"), f.bucket(1, b"c")]);
        assert_eq!(b.sequences[1].bag(0), &[f.bucket(2, b"y"), f.bucket(2, b"z")]);
        f.parse(b"1\tu\ti\tc\t\t", &mut b).unwrap();
        assert!(b.sequences[0].bag(1).is_empty());
        b.check().unwrap();
    }

    #[test]
    fn rejects_malformed_lines_without_appending() {
        let f = AmazonDienFormat::new(&[10, 100, 10], 3, 5).unwrap();
        let mut b = batch();
        assert_eq!(f.parse(b"2\tu\ti\tc\ta\tx", &mut b), Err((BadReason::BadLabel, Some(0))));
        assert_eq!(f.parse(b"1\tu\ti\tc\ta", &mut b), Err((BadReason::FieldCount, None)));
        assert_eq!(f.parse(b"1\tu\ti\tc\ta\x02b\tx", &mut b), Err((BadReason::FieldCount, Some(5))));
        assert_eq!(f.parse(b"1\tu\ti\tc\ta\t", &mut b), Err((BadReason::FieldCount, Some(5))));
        assert!(b.is_empty() && b.groups.is_empty());
        b.check().unwrap();
        assert!(AmazonDienFormat::new(&[1, 2], 0, 5).unwrap_err().to_string().contains("table_sizes"));
    }
}
