//! A served model's embedding tables in memory.
//!
//! A table of a store that holds every row (the fixed store) is held whole, row `i` at
//! id `i`. A table of a store that holds only the rows it sees (dynamic, tiered) is held
//! as its rows by id: such a table may have far more rows than any memory holds (its
//! `--buckets` only bound the ids), and only the rows the checkpoint lists are stored.
//!
//! Invariants:
//! * A row a [`Table::Held`] does not list reads as its [`Absent`] says, as the store
//!   that trained it reads a row it does not hold: the row's seeded initial value for a
//!   dynamic store that admits an id at its first sighting, zeros for one that admits
//!   later (the rows the checkpoint loader gives them: [`crate::serving`]).
//! * A table is made whole ([`zeroed`], [`Table::into_whole`]) only after its size is
//!   checked: a row count times a width that overflows, or that exceeds the memory
//!   available, is a [`TooLarge`] error naming the table, its rows and the bytes it
//!   needs, never an abort or a wrapped size.

use rustc_hash::FxHashMap;
use std::collections::hash_map::Entry;

/// One embedding table of a served model (see the [module docs](self)).
#[derive(Clone, Debug)]
pub enum Table {
    /// Every row: `rows × dim` values, row `i` = id `i`.
    Whole(Vec<f32>),
    /// The rows listed: row `id` is `rows[index[id] · dim ..][..dim]`; every other row
    /// reads as `absent` says. A cleared row is removed (the last row takes its place), so
    /// memory follows the rows listed, not every id ever listed.
    Held {
        /// Each listed id's place in `rows`.
        index: FxHashMap<u64, usize>,
        /// The id of each place of `rows`.
        ids: Vec<u64>,
        /// The listed rows, `dim` values each.
        rows: Vec<f32>,
        /// What every other row reads as.
        absent: Absent,
    },
}

/// What a row a [`Table::Held`] does not list reads as.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Absent {
    /// Zeros.
    Zero,
    /// Its seeded initial value ([`tiderec_operators::store::init_row`]) in table `table`.
    Init {
        /// The trainer's seed.
        seed: u64,
        /// The table.
        table: usize,
        /// The table's initialisation bound ([`tiderec_operators::store::init_bound`]).
        bound: f32,
    },
}

impl Absent {
    /// Appends the value of absent row `id` (`dim` values) to `out`.
    fn append(self, id: u64, dim: usize, out: &mut Vec<f32>) {
        let start = out.len();
        out.resize(start + dim, 0.0);
        if let Absent::Init { seed, table, bound } = self {
            tiderec_operators::store::init_row(seed, table, id, bound, &mut out[start..]);
        }
    }
}

/// A table that cannot be held whole in memory.
#[derive(Debug, thiserror::Error)]
#[error("table {table} has {rows} rows of {dim} values: held whole, it needs {}", needs(*.bytes, *.available))]
pub struct TooLarge {
    /// The table.
    pub table: usize,
    /// Its rows.
    pub rows: u64,
    /// Values per row.
    pub dim: usize,
    /// Bytes it needs whole (`None`: more than 64 bits count, or than this machine addresses).
    pub bytes: Option<u64>,
    /// The memory available and where that figure comes from, when known.
    pub available: Option<(u64, &'static str)>,
}

fn needs(bytes: Option<u64>, available: Option<(u64, &'static str)>) -> String {
    match (bytes, available) {
        (None, _) => "more bytes than this machine can address".into(),
        (Some(b), Some((a, from))) => {
            format!("{b} bytes ({}), more than the {} available ({from})", crate::memory::gib(b), crate::memory::gib(a))
        }
        (Some(b), None) => format!("{b} bytes ({}), more than could be allocated", crate::memory::gib(b)),
    }
}

/// `rows × dim` zeros for table `table`, its size checked against the address space and
/// the memory available before anything is allocated.
pub fn zeroed(table: usize, rows: u64, dim: usize) -> Result<Vec<f32>, TooLarge> {
    let len = usize::try_from(rows).ok().and_then(|n| n.checked_mul(dim));
    let bytes = len.and_then(|l| u64::try_from(l).ok()).and_then(|l| l.checked_mul(4));
    let available = crate::memory::available();
    let too_large = || TooLarge { table, rows, dim, bytes, available };
    let (Some(len), Some(b)) = (len, bytes) else { return Err(too_large()) };
    if available.is_some_and(|(a, _)| b > a) {
        return Err(too_large());
    }
    let mut values = Vec::new();
    values.try_reserve_exact(len).map_err(|_| too_large())?;
    values.resize(len, 0.0);
    Ok(values)
}

impl Table {
    /// A table of no rows yet, holding only the rows [set](Self::set_row) later; every
    /// other row reads as `absent`.
    pub fn held(absent: Absent) -> Self {
        Table::Held { index: FxHashMap::default(), ids: Vec::new(), rows: Vec::new(), absent }
    }

    /// Row `id` (`dim` values); `None` for a row a held table does not list (see
    /// [`append_row`](Self::append_row) for its value). The id must be below the table's rows.
    pub fn row(&self, id: u64, dim: usize) -> Option<&[f32]> {
        match self {
            Table::Whole(values) => Some(&values[id as usize * dim..(id as usize + 1) * dim]),
            Table::Held { index, rows, .. } => index.get(&id).map(|&k| &rows[k * dim..(k + 1) * dim]),
        }
    }

    /// Appends row `id` (`dim` values) to `out`: a row a held table does not list as its
    /// [`Absent`] says.
    pub fn append_row(&self, id: u64, dim: usize, out: &mut Vec<f32>) {
        match (self.row(id, dim), self) {
            (Some(row), _) => out.extend_from_slice(row),
            (None, Table::Held { absent, .. }) => absent.append(id, dim, out),
            (None, Table::Whole(_)) => unreachable!("a whole table has every row"),
        }
    }

    /// Sets row `id` to `values` (a row's width of them).
    pub fn set_row(&mut self, id: u64, values: &[f32]) {
        let dim = values.len();
        match self {
            Table::Whole(whole) => whole[id as usize * dim..(id as usize + 1) * dim].copy_from_slice(values),
            Table::Held { index, ids, rows, .. } => match index.entry(id) {
                Entry::Occupied(e) => rows[e.get() * dim..(e.get() + 1) * dim].copy_from_slice(values),
                Entry::Vacant(e) => {
                    e.insert(ids.len());
                    ids.push(id);
                    rows.extend_from_slice(values);
                }
            },
        }
    }

    /// Forgets row `id` (a row its store dropped): a held table reads it as absent again,
    /// a whole one as zeros.
    pub fn clear_row(&mut self, id: u64, dim: usize) {
        match self {
            Table::Whole(whole) => whole[id as usize * dim..(id as usize + 1) * dim].fill(0.0),
            Table::Held { index, ids, rows, .. } => {
                let Some(k) = index.remove(&id) else { return };
                let last = ids.len() - 1;
                if k != last {
                    rows.copy_within(last * dim..(last + 1) * dim, k * dim);
                    ids[k] = ids[last];
                    index.insert(ids[k], k);
                }
                ids.pop();
                rows.truncate(last * dim);
            }
        }
    }

    /// The values stored: every row of a whole table, the listed rows of a held one.
    pub fn values(&self) -> &[f32] {
        match self {
            Table::Whole(values) | Table::Held { rows: values, .. } => values,
        }
    }

    /// The rows of `ids` (each below the table's rows), in that order: `ids.len() × dim` values.
    pub fn rows_of(&self, ids: &[u64], dim: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(ids.len() * dim);
        for &id in ids {
            self.append_row(id, dim, &mut out);
        }
        out
    }

    /// Every row of this table, table `table` of `rows` rows of `dim`: `rows × dim` values,
    /// row `i` = id `i`. A held table is made whole by [`zeroed`], so one too large for
    /// memory is an error.
    pub fn into_whole(self, table: usize, rows: u64, dim: usize) -> Result<Vec<f32>, TooLarge> {
        match self {
            Table::Whole(values) => Ok(values),
            Table::Held { index, rows: held, absent, .. } => {
                let mut whole = zeroed(table, rows, dim)?;
                if let Absent::Init { seed, table, bound } = absent {
                    for (id, row) in whole.chunks_exact_mut(dim.max(1)).enumerate() {
                        tiderec_operators::store::init_row(seed, table, id as u64, bound, row);
                    }
                }
                for (&id, &k) in &index {
                    whole[id as usize * dim..(id as usize + 1) * dim].copy_from_slice(&held[k * dim..(k + 1) * dim]);
                }
                Ok(whole)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held table reads its listed rows as a whole table does and every other row as
    /// zeros; set, cleared and re-set rows read alike in both.
    #[test]
    fn held_and_whole_tables_read_the_same_rows() {
        let dim = 2;
        let mut whole = Table::Whole(zeroed(0, 5, dim).unwrap());
        let mut held = Table::held(Absent::Zero);
        for table in [&mut whole, &mut held] {
            table.set_row(3, &[1.0, 2.0]);
            table.set_row(0, &[3.0, 4.0]);
            table.set_row(4, &[5.0, 6.0]);
            table.clear_row(4, dim);
            table.set_row(3, &[7.0, 8.0]);
        }
        let ids = [0, 1, 2, 3, 4, 3];
        assert_eq!(whole.rows_of(&ids, dim), held.rows_of(&ids, dim));
        assert_eq!(held.rows_of(&ids, dim), [3., 4., 0., 0., 0., 0., 7., 8., 0., 0., 7., 8.]);
        assert_eq!(held.values().len(), 2 * dim, "only the listed rows are stored, a cleared one forgotten");
        for table in [&mut whole, &mut held] {
            table.clear_row(0, dim);
            table.clear_row(1, dim);
            table.set_row(4, &[9.0, 9.5]);
            table.set_row(2, &[1.5, 2.5]);
            // Not the last row: the last one takes its place.
            table.clear_row(3, dim);
        }
        assert_eq!(whole.rows_of(&ids, dim), held.rows_of(&ids, dim));
        assert_eq!(held.rows_of(&[2, 4], dim), [1.5, 2.5, 9.0, 9.5]);
        assert_eq!(held.values().len(), 2 * dim);
        assert_eq!(held.into_whole(0, 5, dim).unwrap(), whole.into_whole(0, 5, dim).unwrap());
    }

    /// A held table whose absent rows are seeded reads every row it does not list, and
    /// every row it cleared, as its initial value, and is made whole alike.
    #[test]
    fn a_seeded_held_table_reads_absent_rows_as_their_initial_values() {
        let (dim, n, seed) = (3, 6u64, 11);
        let bound = tiderec_operators::store::init_bound(n);
        let mut init = vec![0.0; n as usize * dim];
        for (id, row) in init.chunks_exact_mut(dim).enumerate() {
            tiderec_operators::store::init_row(seed, 2, id as u64, bound, row);
        }
        assert!(init.iter().all(|v| *v != 0.0 && v.abs() <= bound));
        let mut whole = Table::Whole(init.clone());
        let mut held = Table::held(Absent::Init { seed, table: 2, bound });
        for table in [&mut whole, &mut held] {
            table.set_row(4, &[1.0, 2.0, 3.0]);
            table.set_row(1, &[4.0, 5.0, 6.0]);
        }
        held.clear_row(1, dim);
        whole.set_row(1, &init[dim..2 * dim]);
        let ids = [0, 1, 2, 3, 4, 5, 4];
        assert_eq!(held.rows_of(&ids, dim), whole.rows_of(&ids, dim));
        assert_eq!(held.rows_of(&[5], dim), &init[5 * dim..]);
        assert_eq!(held.into_whole(2, n, dim).unwrap(), whole.into_whole(2, n, dim).unwrap());
    }

    /// A table too large for memory, or whose size overflows, is an error naming it.
    #[test]
    fn a_table_too_large_is_an_error_naming_it() {
        let e = zeroed(3, u64::MAX, 16).unwrap_err();
        assert_eq!((e.table, e.rows, e.bytes), (3, u64::MAX, None));
        assert!(e.to_string().starts_with("table 3 has 18446744073709551615 rows of 16 values"), "{e}");
        let e = Table::held(Absent::Zero).into_whole(7, 1 << 60, 8).unwrap_err();
        assert!(e.to_string().contains("table 7 has 1152921504606846976 rows"), "{e}");
    }
}
