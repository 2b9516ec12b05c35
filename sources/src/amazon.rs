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
//! * The two histories are one list of events (item `k` and category `k` are
//!   event `k`). Histories of different lengths (counted as written: `k`
//!   delimiters make `k + 1` items) are a [`BadReason::FieldCount`] in the
//!   category field; an empty history field is an empty sequence.
//! * An event with an empty item or category (`a\x02\x02b` beside
//!   `x\x02y\x02z`) is skipped in both histories, so they stay aligned and an
//!   absent value never becomes an id (as `none` lists of a CSV spec do).
//! * Of the events left, only the most recent `max_len` are kept.

use crate::error::SourceError;
use crate::lines::{LineFormat, LineReader};
use tiderec_records::bad_record::BadReason;
use tiderec_records::features::field_seed;
use tiderec_records::features::fused::token_bucket;
use tiderec_records::features::split::split_exact;
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

    /// Appends the last `max_len` events of the aligned histories `items` and `categories`
    /// to the two sequences of the sample being written, and closes their bags.
    fn push_histories(&self, items: &[u8], categories: &[u8], out: &mut Batch) {
        let skip = events(items, categories).count().saturating_sub(self.max_len);
        for (item, category) in events(items, categories).skip(skip) {
            out.sequences[0].ids.push(self.bucket(SEQUENCE_TABLES[0], item));
            out.sequences[1].ids.push(self.bucket(SEQUENCE_TABLES[1], category));
        }
        out.sequences[0].close_bag();
        out.sequences[1].close_bag();
    }
}

/// The `(item, category)` events of two histories of as many items, oldest first, without
/// those with an empty item or category.
fn events<'a>(items: &'a [u8], categories: &'a [u8]) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
    let split = |history: &'a [u8]| history.split(|&b| b == HISTORY_DELIMITER);
    split(items).zip(split(categories)).filter(|(item, category)| !item.is_empty() && !category.is_empty())
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
        self.push_histories(fields[4], fields[5], out);
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

    /// An event with an empty item or category is skipped in both histories (never a
    /// shared "empty" id), so they stay aligned; `max_len` counts the events kept.
    #[test]
    fn an_event_with_an_empty_token_is_skipped_in_both_histories() {
        let f = AmazonDienFormat::new(&[10, 100, 10], 3, 2).unwrap();
        let items = |b: &Batch, i| b.sequences[0].bag(i).to_vec();
        let categories = |b: &Batch, i| b.sequences[1].bag(i).to_vec();
        let ids = |table, tokens: &[&[u8]]| tokens.iter().map(|t| f.bucket(table, t)).collect::<Vec<_>>();
        let mut b = batch();
        f.parse(b"1\tu\ti\tc\ta\x02\x02b\tx\x02\x02y", &mut b).unwrap();
        f.parse(b"1\tu\ti\tc\ta\x02\x02b\tx\x02z\x02y", &mut b).unwrap();
        f.parse(b"0\tu\ti\tc\ta\x02b\x02\x02c\tw\x02x\x02y\x02z", &mut b).unwrap();
        f.parse(b"0\tu\ti\tc\t\x02a\x02\tx\x02y\x02", &mut b).unwrap();
        b.check().unwrap();
        for i in 0..2 {
            assert_eq!(items(&b, i), ids(1, &[b"a", b"b"]), "line {i}");
            assert_eq!(categories(&b, i), ids(2, &[b"x", b"y"]), "line {i}");
        }
        assert_eq!((items(&b, 2), categories(&b, 2)), (ids(1, &[b"b", b"c"]), ids(2, &[b"x", b"z"])));
        assert_eq!((items(&b, 3), categories(&b, 3)), (ids(1, &[b"a"]), ids(2, &[b"y"])));
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
