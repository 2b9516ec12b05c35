//! The `pooling = "none"` lists of a line, read together: they describe one history of
//! events (item `k` of every list is event `k`), so they are split position by position.
//!
//! Invariants:
//! * The lists of a line have one length, counted in raw positions before anything is cut
//!   or skipped: `k` delimiters make `k + 1` positions, an empty field none. A line whose
//!   lists differ is malformed ([`BadReason::FieldCount`](crate::bad_record::BadReason),
//!   naming the first list whose length differs from the first list's), however long.
//! * A position where any list's item is empty is skipped in every list, so item `k` of
//!   one sequence always pairs with item `k` of the others.
//! * The first `max_len` positions kept are hashed ([`token_bucket`], each list with its
//!   own seed and table) and appended, one bag per list; a malformed line appends nothing.
//! * [`push_sequences`] equals its plain oracle [`push_sequences_scalar`] (split into
//!   owned vectors, compare, filter, truncate, hash) on every input.

use crate::batch::SparseField;
use crate::features::fused::token_bucket;

/// Most `pooling = "none"` lists in one spec (the joint walk's fixed arrays).
pub(super) const MAX_SEQUENCES: usize = 16;

/// A `pooling = "none"` list compiled: column, item delimiter, hashing seed, table rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SequenceList {
    pub col: usize,
    pub delimiter: u8,
    pub seed: u64,
    pub buckets: u64,
}

/// The rest of a list still to split: `None` once its last item is taken.
type Cursor<'a> = Option<&'a [u8]>;

/// The cursor at a field's start: an empty field has no position.
fn cursor(field: &[u8]) -> Cursor<'_> {
    (!field.is_empty()).then_some(field)
}

/// Takes the next item off `cursor`.
#[inline]
fn next_item<'a>(cursor: &mut Cursor<'a>, delimiter: u8) -> Option<&'a [u8]> {
    let rest = (*cursor)?;
    Some(match memchr::memchr(delimiter, rest) {
        Some(p) => {
            *cursor = Some(&rest[p + 1..]);
            &rest[..p]
        }
        None => {
            *cursor = None;
            rest
        }
    })
}

/// Positions left on `cursor` (delimiters counted with `memchr`'s vector scan).
fn positions_left(cursor: Cursor<'_>, delimiter: u8) -> usize {
    cursor.map_or(0, |rest| memchr::memchr_iter(delimiter, rest).count() + 1)
}

/// The first list (by index) whose `len` differs from list 0's, if any.
fn first_differing(lens: impl Iterator<Item = usize>) -> Option<usize> {
    let mut first = None;
    lens.enumerate().find(|&(_, n)| *first.get_or_insert(n) != n).map(|(k, _)| k)
}

/// Appends one bag per list of `lists` to `out` (one [`SparseField`] per list, in order) from
/// the line's `fields`, keeping at most `max_len` positions (see the [module docs](self)).
/// `Err(col)` names the column of the first list whose length differs from the first
/// list's; nothing is then appended.
///
/// # Panics
/// If `lists` has more than [`MAX_SEQUENCES`] entries, `out` fewer than `lists`, a column is
/// beyond `fields` or a table has no rows (a compiled spec has none of these).
pub(super) fn push_sequences(
    lists: &[SequenceList],
    fields: &[&[u8]],
    max_len: usize,
    out: &mut [SparseField],
) -> Result<(), usize> {
    let mut cursors: [Cursor; MAX_SEQUENCES] = [None; MAX_SEQUENCES];
    for (c, l) in cursors.iter_mut().zip(lists) {
        *c = cursor(fields[l.col]);
    }
    let cursors = &mut cursors[..lists.len()];
    let mut kept = 0;
    while kept < max_len {
        let mut items: [Option<&[u8]>; MAX_SEQUENCES] = [None; MAX_SEQUENCES];
        for ((item, c), l) in items.iter_mut().zip(cursors.iter_mut()).zip(lists) {
            *item = next_item(c, l.delimiter);
        }
        let items = &items[..lists.len()];
        if first_differing(items.iter().map(|i| i.is_some() as usize)).is_some() {
            return Err(rollback(lists, fields, out));
        }
        match items.first() {
            None | Some(None) => return close(lists, out),
            Some(Some(_)) if items.iter().any(|i| i.is_some_and(<[u8]>::is_empty)) => continue,
            Some(Some(_)) => {}
        }
        for ((item, l), seq) in items.iter().zip(lists).zip(out.iter_mut()) {
            seq.ids.push(token_bucket(l.seed, item.expect("every list has this position"), l.buckets));
        }
        kept += 1;
    }
    // `max_len` positions kept: the rest of each list is only counted.
    let left = cursors.iter().zip(lists).map(|(c, l)| positions_left(*c, l.delimiter));
    match first_differing(left) {
        Some(_) => Err(rollback(lists, fields, out)),
        None => close(lists, out),
    }
}

/// Closes the bag of each list: the line is read.
fn close(lists: &[SequenceList], out: &mut [SparseField]) -> Result<(), usize> {
    for seq in &mut out[..lists.len()] {
        seq.close_bag();
    }
    Ok(())
}

/// Drops the items appended since each list's last bag; the column of the first list whose
/// length differs from the first list's (the lengths counted again, in full).
fn rollback(lists: &[SequenceList], fields: &[&[u8]], out: &mut [SparseField]) -> usize {
    for seq in &mut out[..lists.len()] {
        let closed = *seq.offsets.last().expect("offsets start at 0") as usize;
        seq.ids.truncate(closed);
    }
    let lens = lists.iter().map(|l| positions_left(cursor(fields[l.col]), l.delimiter));
    lists[first_differing(lens).expect("the lengths differ")].col
}

/// The reference for [`push_sequences`], plainly: split each list into owned items,
/// compare the counts, drop the positions with an empty item, keep `max_len`, hash.
#[cfg(test)]
pub(super) fn push_sequences_scalar(
    lists: &[SequenceList],
    fields: &[&[u8]],
    max_len: usize,
    out: &mut [SparseField],
) -> Result<(), usize> {
    let split: Vec<Vec<Vec<u8>>> = lists
        .iter()
        .map(|l| match fields[l.col] {
            [] => Vec::new(),
            f => f.split(|b| *b == l.delimiter).map(<[u8]>::to_vec).collect(),
        })
        .collect();
    if let Some(k) = split.iter().position(|items| items.len() != split[0].len()) {
        return Err(lists[k].col);
    }
    let n = split.first().map_or(0, Vec::len);
    let kept: Vec<usize> = (0..n).filter(|&p| split.iter().all(|items| !items[p].is_empty())).take(max_len).collect();
    for ((items, l), seq) in split.iter().zip(lists).zip(out.iter_mut()) {
        seq.ids.extend(kept.iter().map(|&p| token_bucket(l.seed, &items[p], l.buckets)));
        seq.close_bag();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lists(n: usize) -> Vec<SequenceList> {
        (0..n).map(|k| SequenceList { col: k, delimiter: b';', seed: 7 + k as u64, buckets: 1000 }).collect()
    }

    /// Both readings of `fields`, each into a fresh batch holding one earlier line.
    fn both(fields: &[&[u8]], max_len: usize) -> [(Result<(), usize>, Vec<SparseField>); 2] {
        let l = lists(fields.len());
        [push_sequences, push_sequences_scalar].map(|push| {
            let mut out: Vec<SparseField> = (0..fields.len()).map(|_| SparseField::new()).collect();
            push(&l, &[&b"x"[..]; MAX_SEQUENCES][..fields.len()], 5, &mut out).unwrap();
            (push(&l, fields, max_len, &mut out), out)
        })
    }

    fn ids(items: &[&str], k: usize) -> Vec<u64> {
        items.iter().map(|t| token_bucket(7 + k as u64, t.as_bytes(), 1000)).collect()
    }

    fn line<const N: usize>(fields: [&str; N]) -> [&[u8]; N] {
        fields.map(str::as_bytes)
    }

    #[test]
    fn lengths_are_compared_before_cutting_and_skipping() {
        let (sixty, seventy) = (vec!["a"; 60].join(";"), vec!["b"; 70].join(";"));
        for (fields, col) in [
            (line([&sixty, &seventy]), 1),
            (line(["1;;3", "a;b"]), 1),
            (line(["", "a"]), 1),
            (line(["a;b;", "x;y"]), 1),
            (line(["a", ""]), 1),
        ] {
            for (got, out) in both(&fields, 50) {
                assert_eq!(got, Err(col), "{:?}", fields.map(|f| f.escape_ascii().to_string()));
                assert!(out.iter().all(|s| s.offsets.len() == 2 && s.ids.len() == 1), "nothing appended");
            }
        }
        for (got, _) in both(&line(["a", "a", "a;a"]), 1) {
            assert_eq!(got, Err(2), "the third list differs from the first");
        }
    }

    #[test]
    fn an_empty_item_skips_its_position_in_every_list() {
        for (got, out) in both(&line(["1;;3;4", "a;b;c;"]), 50) {
            got.unwrap();
            assert_eq!(out[0].bag(1), ids(&["1", "3"], 0), "`4` pairs with the empty item");
            assert_eq!(out[1].bag(1), ids(&["a", "c"], 1), "`b` pairs with the empty item");
        }
        for (got, out) in both(&line(["1;2;3;4", "a;b;c;d"]), 2) {
            got.unwrap();
            assert_eq!(out[0].bag(1), ids(&["1", "2"], 0));
            assert_eq!(out[1].bag(1), ids(&["a", "b"], 1));
        }
        for (got, out) in both(&line(["", ""]), 50) {
            got.unwrap();
            assert!(out[0].bag(1).is_empty() && out[1].bag(1).is_empty(), "no history");
        }
    }

    fn field() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(prop_oneof![3 => Just(b';'), 1 => Just(b'a'), 1 => Just(b'b')], 0..24)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        #[test]
        fn matches_the_oracle(fields in proptest::collection::vec(field(), 1..5), max_len in 0usize..8) {
            let fields: Vec<&[u8]> = fields.iter().map(Vec::as_slice).collect();
            let [(fast, a), (slow, b)] = both(&fields, max_len);
            prop_assert_eq!(fast, slow);
            prop_assert_eq!(a, b);
        }
    }
}
