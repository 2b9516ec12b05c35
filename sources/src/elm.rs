//! An Ele.me-shaped ("elm") line generator for feature-kernel benchmarks.
//!
//! No real elm rows are available, only the column list of the DeepRec
//! modelzoo / AtRec readers: 39 comma-separated columns ([`ELM_COLUMNS`]),
//! twelve of them `*_list` behaviour histories whose items are separated by
//! `;`. [`elm_line`] writes one such line:
//! * ids and small integer codes (`clicked`, `gender`, `is_supervip`, ranks,
//!   `hours`, `weekdays`, `times`, …) as decimal integers;
//! * `avg_price`, `ctr_30`, `total_amt_30` and the items of `price_list` and
//!   `timediff_list` as decimal numbers such as `12.5` or `0.037`;
//! * `shop_geohash_6`, `shop_geohash_12`, `geohash12` and the items of
//!   `shop_geohash6_list` as geohash strings (base-32 letters and digits);
//! * `time_type` and the items of `time_type_list` as one of lunch, night,
//!   dinner, tea, breakfast.
//!
//! The twelve lists of a line are one history, so they share one length,
//! uniform in `0..=50 · list_scale` (`list_scale` 1 is AtRec's "elm", 8 its
//! "elm_y_long"); a zero-length list is an empty field. A line depends only on
//! `(seed, index)`.
//!
//! A line is at most [`max_elm_line_bytes`]`(list_scale)` bytes (every value at
//! its widest, the lists at their longest), about 72 bytes per history item:
//! [`MAX_LIST_SCALE`] is the largest scale whose every line fits in the
//! readers' default line limit ([`DEFAULT_MAX_LINE_BYTES`], 64 KiB), so that
//! generated data trains with the default `--max-line-bytes`.

use crate::lines::DEFAULT_MAX_LINE_BYTES;
use tiderec_records::features::mix64;

/// The 39 column names, in order (shared with the `elm` feature-spec preset).
pub use tiderec_records::spec::ELM_COLUMNS;

/// Indices into [`ELM_COLUMNS`] of the twelve `;`-separated list columns.
pub const ELM_LIST_COLUMNS: [usize; 12] = [22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33];

/// Indices into [`ELM_COLUMNS`] of the list columns whose items are decimal
/// numbers (`price_list`, `timediff_list`).
pub const ELM_NUMERIC_LIST_COLUMNS: [usize; 2] = [27, 30];

/// The values of `time_type`.
pub const TIME_TYPES: [&str; 5] = ["lunch", "night", "dinner", "tea", "breakfast"];

const GEOHASH_ALPHABET: &[u8; 32] = b"0123456789bcdefghjkmnpqrstuvwxyz";

/// Longest history per unit of `list_scale`.
pub const HISTORY_PER_SCALE: usize = 50;

/// The largest `list_scale` whose lines all fit in [`DEFAULT_MAX_LINE_BYTES`] (the cap of
/// `tiderec generate elm --list-scale`).
pub const MAX_LIST_SCALE: usize = max_list_scale(DEFAULT_MAX_LINE_BYTES);

/// What one column holds.
#[derive(Clone, Copy)]
enum Kind {
    /// A decimal integer in `0..n`.
    Int(u64),
    /// A decimal number with an integer part in `0..n` and `d` decimals.
    Dec(u64, u32),
    /// A geohash of this many characters.
    Geohash(usize),
    /// One of [`TIME_TYPES`].
    TimeType,
    /// A `;`-separated list of items of the inner kind.
    List(&'static Kind),
}

const KINDS: [Kind; 39] = [
    Kind::Int(2),                       // clicked
    Kind::Int(10_000_000),              // user_id
    Kind::Int(3),                       // gender
    Kind::Int(400),                     // visit_city
    Kind::Dec(100, 1),                  // avg_price
    Kind::Int(2),                       // is_supervip
    Kind::Dec(1, 3),                    // ctr_30
    Kind::Int(200),                     // ord_30
    Kind::Dec(5_000, 1),                // total_amt_30
    Kind::Int(1_000_000),               // shop_id
    Kind::Int(10_000_000),              // item_id
    Kind::Int(400),                     // city_id
    Kind::Int(4_000),                   // district_id
    Kind::Int(100_000),                 // shop_aoi_id
    Kind::Geohash(6),                   // shop_geohash_6
    Kind::Geohash(12),                  // shop_geohash_12
    Kind::Int(100_000),                 // brand_id
    Kind::Int(100),                     // category_1_id
    Kind::Int(200_000),                 // merge_standard_food_id
    Kind::Int(10_000),                  // rank_7
    Kind::Int(10_000),                  // rank_30
    Kind::Int(10_000),                  // rank_90
    Kind::List(&Kind::Int(1_000_000)),  // shop_id_list
    Kind::List(&Kind::Int(10_000_000)), // item_id_list
    Kind::List(&Kind::Int(100)),        // category_1_id_list
    Kind::List(&Kind::Int(200_000)),    // merge_standard_food_id_list
    Kind::List(&Kind::Int(100_000)),    // brand_id_list
    Kind::List(&Kind::Dec(100, 1)),     // price_list
    Kind::List(&Kind::Int(100_000)),    // shop_aoi_id_list
    Kind::List(&Kind::Geohash(6)),      // shop_geohash6_list
    Kind::List(&Kind::Dec(10_000, 2)),  // timediff_list
    Kind::List(&Kind::Int(24)),         // hours_list
    Kind::List(&Kind::TimeType),        // time_type_list
    Kind::List(&Kind::Int(7)),          // weekdays_list
    Kind::Int(2_000_000_000),           // times
    Kind::Int(24),                      // hours
    Kind::TimeType,                     // time_type
    Kind::Int(7),                       // weekdays
    Kind::Geohash(12),                  // geohash12
];

/// Number of decimal digits of `v`.
const fn decimal_digits(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 10 {
        v /= 10;
        n += 1;
    }
    n
}

/// The most bytes one value of `kind` takes ([`push_value`]); for a list, one item's.
const fn widest(kind: &Kind) -> usize {
    match *kind {
        Kind::Int(n) => decimal_digits(n - 1),
        Kind::Dec(n, d) => decimal_digits(n - 1) + 1 + d as usize,
        Kind::Geohash(len) => len,
        Kind::TimeType => {
            let (mut i, mut most) = (0, 0);
            while i < TIME_TYPES.len() {
                if TIME_TYPES[i].len() > most {
                    most = TIME_TYPES[i].len();
                }
                i += 1;
            }
            most
        }
        Kind::List(item) => widest(item),
    }
}

/// The longest line [`elm_line`] writes with `list_scale`: every value at its widest, the
/// lists at their longest (`50 · list_scale` items), the 38 commas; no line terminator.
pub const fn max_elm_line_bytes(list_scale: usize) -> usize {
    let history = HISTORY_PER_SCALE * list_scale;
    let mut bytes = KINDS.len() - 1;
    let mut c = 0;
    while c < KINDS.len() {
        bytes += match KINDS[c] {
            Kind::List(item) => history * widest(item) + history.saturating_sub(1),
            kind => widest(&kind),
        };
        c += 1;
    }
    bytes
}

/// The largest `list_scale` (at least 1) whose lines all fit in `max_line_bytes`.
pub const fn max_list_scale(max_line_bytes: usize) -> usize {
    let mut scale = 1;
    while max_elm_line_bytes(scale + 1) <= max_line_bytes {
        scale += 1;
    }
    scale
}

/// A counter-based stream of 64-bit words keyed by `(seed, index)`.
struct Stream(u64);

impl Stream {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }

    /// Uniform in `0..n` (multiply-shift).
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

fn push_value(out: &mut Vec<u8>, kind: Kind, rng: &mut Stream) {
    match kind {
        Kind::Int(n) => push_u64(out, rng.below(n)),
        Kind::Dec(n, d) => {
            push_u64(out, rng.below(n));
            out.push(b'.');
            let scale = 10u64.pow(d);
            let frac = rng.below(scale);
            let mut digits = Vec::with_capacity(d as usize);
            push_u64(&mut digits, frac + scale);
            out.extend_from_slice(&digits[1..]);
        }
        Kind::Geohash(len) => {
            for _ in 0..len {
                out.push(GEOHASH_ALPHABET[rng.below(32) as usize]);
            }
        }
        Kind::TimeType => out.extend_from_slice(TIME_TYPES[rng.below(5) as usize].as_bytes()),
        Kind::List(_) => unreachable!("lists are written by elm_line"),
    }
}

/// Appends line `index` of the elm-shaped stream `seed` to `out`: the 39
/// columns of [`ELM_COLUMNS`] separated by `,`, with no line terminator.
/// `list_scale` sets the longest history, `50 · list_scale` items (1: "elm",
/// 8: "elm_y_long"); the line is at most [`max_elm_line_bytes`]`(list_scale)` bytes.
/// See the module docs for the value formats.
pub fn elm_line(seed: u64, index: u64, list_scale: usize, out: &mut Vec<u8>) {
    let mut rng = Stream(mix64(seed ^ mix64(index ^ 0x656c_6d5f_6c69_6e65)));
    let history = rng.below((HISTORY_PER_SCALE * list_scale) as u64 + 1) as usize;
    for (c, &kind) in KINDS.iter().enumerate() {
        if c > 0 {
            out.push(b',');
        }
        match kind {
            Kind::List(item) => {
                for i in 0..history {
                    if i > 0 {
                        out.push(b';');
                    }
                    push_value(out, *item, &mut rng);
                }
            }
            _ => push_value(out, kind, &mut rng),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_lists_and_determinism() {
        let mut longest = 0;
        for scale in [1usize, 8] {
            for index in 0..200u64 {
                let mut line = Vec::new();
                elm_line(7, index, scale, &mut line);
                let mut again = b"prefix".to_vec();
                elm_line(7, index, scale, &mut again);
                assert_eq!(&again[6..], &line[..], "deterministic per (seed, index), appended");
                let text = std::str::from_utf8(&line).unwrap();
                assert!(!text.contains('\n'));
                let cols: Vec<&str> = text.split(',').collect();
                assert_eq!(cols.len(), ELM_COLUMNS.len(), "{text}");
                let lengths: Vec<usize> = ELM_LIST_COLUMNS
                    .iter()
                    .map(|&c| if cols[c].is_empty() { 0 } else { cols[c].split(';').count() })
                    .collect();
                assert!(lengths.iter().all(|&n| n == lengths[0] && n <= 50 * scale), "{lengths:?}");
                longest = longest.max(lengths[0]);
                for (c, col) in cols.iter().enumerate() {
                    if !ELM_LIST_COLUMNS.contains(&c) {
                        assert!(!col.is_empty() && !col.contains(';'), "column {} = {col:?}", ELM_COLUMNS[c]);
                    }
                }
                for &c in &ELM_NUMERIC_LIST_COLUMNS {
                    for item in cols[c].split(';').filter(|s| !s.is_empty()) {
                        assert!(item.contains('.') && item.parse::<f32>().is_ok(), "{item}");
                    }
                }
                assert!(TIME_TYPES.contains(&cols[36]));
                assert!(cols[32].split(';').filter(|s| !s.is_empty()).all(|t| TIME_TYPES.contains(&t)));
                assert_eq!(cols[38].len(), 12);
            }
        }
        assert!(longest > 50, "elm_y_long histories go past 50 items");
        let (mut a, mut b) = (Vec::new(), Vec::new());
        elm_line(1, 0, 1, &mut a);
        elm_line(2, 0, 1, &mut b);
        assert_ne!(a, b, "the seed matters");
    }

    /// The widest value of each kind is what [`widest`] says: reached, never exceeded.
    #[test]
    fn values_are_at_most_as_wide_as_the_bound_says() {
        let mut rng = Stream(3);
        for kind in KINDS {
            let kind = match kind {
                Kind::List(item) => *item,
                kind => kind,
            };
            let most = (0..5000)
                .map(|_| {
                    let mut out = Vec::new();
                    push_value(&mut out, kind, &mut rng);
                    out.len()
                })
                .max();
            assert_eq!(most, Some(widest(&kind)));
        }
    }

    /// Lines at [`MAX_LIST_SCALE`] fit in the default 64 KiB line limit, the longest of
    /// them too (the bound holds for every line); one scale more, they need not. At the
    /// old `--list-scale` cap of 64 most lines were over the limit.
    #[test]
    fn lines_at_the_largest_list_scale_fit_in_the_default_line_limit() {
        assert_eq!(DEFAULT_MAX_LINE_BYTES, 64 * 1024);
        let bound = max_elm_line_bytes(MAX_LIST_SCALE);
        assert!(bound <= DEFAULT_MAX_LINE_BYTES && max_elm_line_bytes(MAX_LIST_SCALE + 1) > DEFAULT_MAX_LINE_BYTES);
        assert_eq!(MAX_LIST_SCALE, 18);
        let mut line = Vec::new();
        let mut longest = 0;
        for index in 0..2000 {
            line.clear();
            elm_line(11, index, MAX_LIST_SCALE, &mut line);
            assert!(line.len() <= bound, "line {index}: {} bytes, bound {bound}", line.len());
            longest = longest.max(line.len());
        }
        assert!(longest > bound * 9 / 10, "the bound is close: longest {longest} of {bound}");
        let over = (0..200)
            .filter(|&index| {
                line.clear();
                elm_line(11, index, 64, &mut line);
                line.len() > DEFAULT_MAX_LINE_BYTES
            })
            .count();
        assert!(over > 100, "{over} of 200 lines at scale 64 are over 64 KiB");
    }
}
