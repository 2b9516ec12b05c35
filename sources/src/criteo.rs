//! Criteo TSV reader: Kaggle DAC `train.txt` and the 1TB click-log day files.
//!
//! Each line is `label, I1..I13, C1..C26`, TAB separated (40 fields). The
//! reader reads each file through a window of positioned reads
//! ([`LineReader`], not a memory map) and parses lines
//! in place: no copy per line, no allocation per field, no UTF-8 validation.
//!
//! # Invariants
//!
//! * **Disjoint, line-aligned ranges.** Worker `w` of `W` owns, in every file
//!   of length `len`, the byte range `[len·w/W, len·(w+1)/W)`. A line belongs
//!   to the range in which its *first byte* lies (it may end beyond the range).
//!   The ranges of the `W` workers therefore partition the lines of each file:
//!   concatenating the records of workers `0, 1, …, W-1` (each reading its
//!   files in the given order) gives, per file, exactly the records of a single
//!   reader.
//! * **Records are never lost.** Every non-empty line of a range is either
//!   appended to the output batch (a *good* record) or rejected as a *bad*
//!   record; empty lines (after stripping a `\r`) are skipped silently and are
//!   neither.
//! * **Bad records are counted and reported.** Each rejected line is counted in
//!   [`BadRecordCounts`](tiderec_records::bad_record::BadRecordCounts) by [`BadReason`] and, under
//!   [`BadRecordPolicy::Skip`], written to the [`DeadLetterSink`] (if any) with
//!   its file path, 1-based line number *within the file*, byte offset and raw
//!   bytes; under [`BadRecordPolicy::Fail`] the reader returns
//!   [`SourceError::BadRecord`] carrying the same record. A bad line never
//!   leaves a partial sample in the output batch.
//!
//! # Format rules
//!
//! * The label must be exactly `0` or `1`.
//! * `I1..I13`: empty → `0.0` (missing); otherwise a decimal integer (an
//!   optional `+` or `-` and 1 to 18 digits, no decimal point:
//!   [`parse_dense_integer`]) transformed with [`log1p_clamped`].
//! * `C1..C26`: empty → empty bag; otherwise up to 16 hex digits, bucketed with
//!   [`hash_bucket`] under the field's seed ([`field_seed`]) into
//!   `table_sizes[f]` rows — a single-id bag.
//! * Lines with 37 to 40 fields are accepted: some copies (PaddleRec) strip
//!   trailing empty fields, so absent trailing fields are empty categories.
//!   Only `C` fields can be missing that way, so in a line of fewer than 40
//!   fields the field at `I13`'s place is an integer or empty, never a
//!   categorical hash: a line whose field 13 is 8 hex digits is
//!   [`BadReason::FieldCount`] there ([`shifted_hash`]). That is the shape of
//!   a line of an unlabeled test file (39 fields, `I1..I13, C1..C26`), whose
//!   `C1` would otherwise be read as `I13` and `I1` as the label. (Such a line
//!   with an empty `C1` and an `I1` of 0 or 1 has the shape of a labeled line
//!   whose last field was stripped, and is read as one.)
//! * LF and CRLF line endings and a missing final newline are all accepted.

use crate::error::SourceError;
use crate::lines::{LineFormat, LineReader, ReaderOptions};
use std::path::PathBuf;
use tiderec_records::bad_record::{BadReason, BadRecordPolicy, DeadLetterSink};
use tiderec_records::features::{field_seed, hash_bucket, log1p_clamped, parse_hex, parse_i64};
use tiderec_records::Batch;

/// Number of dense (integer) features, `I1..I13`.
pub const NUM_DENSE: usize = tiderec_records::spec::CRITEO_NUM_DENSE;
/// Number of sparse (categorical) features, `C1..C26`.
pub const NUM_SPARSE: usize = tiderec_records::spec::CRITEO_NUM_SPARSE;
/// Number of fields of a complete line: label, dense, sparse.
pub const NUM_FIELDS: usize = 1 + NUM_DENSE + NUM_SPARSE;
/// Fewest fields a line may have (trailing empty categories stripped).
pub const MIN_FIELDS: usize = 37;
pub use crate::lines::{DEFAULT_MAX_LINE_BYTES, MAX_RAW_BYTES};

/// Feature configuration: per-field embedding table sizes and the hashing seed.
#[derive(Clone, Debug)]
pub struct CriteoFeatures {
    /// Number of rows of the table of each categorical field (26 entries, all > 0).
    pub table_sizes: Vec<u64>,
    /// Run seed from which the per-field hashing seeds are derived.
    pub seed: u64,
}

impl CriteoFeatures {
    /// The same table size for all 26 fields.
    pub fn uniform(table_size: u64, seed: u64) -> Self {
        CriteoFeatures { table_sizes: vec![table_size; NUM_SPARSE], seed }
    }

    /// The hashing seed of each categorical field, as [`parse_line`] wants them.
    pub fn field_seeds(&self) -> [u64; NUM_SPARSE] {
        std::array::from_fn(|f| field_seed(self.seed, f))
    }

    /// Checks that there are 26 table sizes, none of them zero.
    pub fn validate(&self) -> Result<(), SourceError> {
        if self.table_sizes.len() != NUM_SPARSE {
            return Err(SourceError::config(
                "table_sizes",
                format!("{} entries, expected {NUM_SPARSE}", self.table_sizes.len()),
            ));
        }
        if let Some(f) = self.table_sizes.iter().position(|&s| s == 0) {
            return Err(SourceError::config("table_sizes", format!("table of field C{} has size 0", f + 1)));
        }
        Ok(())
    }
}

/// Reader configuration.
#[derive(Clone, Debug)]
pub struct CriteoConfig {
    /// Feature hashing setup.
    pub features: CriteoFeatures,
    /// Longest accepted line in bytes, without its terminator; longer lines are
    /// [`BadReason::TooLong`]. Default [`DEFAULT_MAX_LINE_BYTES`].
    pub max_line_bytes: usize,
    /// What to do with malformed lines.
    pub policy: BadRecordPolicy,
}

impl CriteoConfig {
    /// A configuration with the default line limit and [`BadRecordPolicy::Skip`].
    pub fn new(features: CriteoFeatures) -> Self {
        CriteoConfig { features, max_line_bytes: DEFAULT_MAX_LINE_BYTES, policy: BadRecordPolicy::Skip }
    }
}

/// The Criteo line format (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct CriteoFormat {
    features: CriteoFeatures,
    seeds: [u64; NUM_SPARSE],
}

impl CriteoFormat {
    /// The format for these features; errors name a bad table size.
    pub fn new(features: CriteoFeatures) -> Result<Self, SourceError> {
        features.validate()?;
        let seeds = features.field_seeds();
        Ok(CriteoFormat { features, seeds })
    }
}

impl LineFormat for CriteoFormat {
    fn shape(&self) -> (usize, usize) {
        (NUM_DENSE, NUM_SPARSE)
    }
    fn parse(&self, line: &[u8], out: &mut Batch) -> Result<(), (BadReason, Option<usize>)> {
        parse_line(line, &self.features, &self.seeds, out)
    }
}

/// Reads Criteo TSV files, one worker's share of each; see the [module docs](self).
pub type CriteoReader = LineReader<CriteoFormat>;

impl LineReader<CriteoFormat> {
    /// Opens `paths` for worker `worker` of `workers` (see [`LineReader::open_span`]).
    ///
    /// Errors: [`SourceError::Io`] naming the path if a file cannot be opened
    /// or read; [`SourceError::Config`] for `workers == 0`,
    /// `worker >= workers` or invalid features. An empty file yields no records.
    pub fn open(
        paths: &[PathBuf],
        worker: usize,
        workers: usize,
        config: CriteoConfig,
        dead_letters: Option<Box<dyn DeadLetterSink>>,
    ) -> Result<Self, SourceError> {
        Self::open_span(paths, (0.0, 1.0), worker, workers, config, dead_letters)
    }

    /// Like [`open`](Self::open), restricted to the part `span = (from, to)`
    /// of each file (fractions of its bytes, line-aligned), which is then
    /// split among the workers. Spans `(0, f)` and `(f, 1)` partition every
    /// file's lines, which is how `--eval-fraction` holds out data.
    pub fn open_span(
        paths: &[PathBuf],
        span: (f64, f64),
        worker: usize,
        workers: usize,
        config: CriteoConfig,
        dead_letters: Option<Box<dyn DeadLetterSink>>,
    ) -> Result<Self, SourceError> {
        let options = ReaderOptions { max_line_bytes: config.max_line_bytes, policy: config.policy };
        let format = CriteoFormat::new(config.features)?;
        LineReader::open_format(paths, span, worker, workers, format, options, dead_letters)
    }
}

/// `log1p_clamped(v as f32)` for `v` in `0..LOG1P_TABLE_LEN`: most Criteo
/// counts are small, and a table lookup is much cheaper than `log1pf`.
const LOG1P_TABLE_LEN: usize = 4096;

fn log1p_table() -> &'static [f32; LOG1P_TABLE_LEN] {
    static TABLE: std::sync::OnceLock<Box<[f32; LOG1P_TABLE_LEN]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| Box::new(std::array::from_fn(|v| log1p_clamped(v as f32))))
}

/// The dense feature of integer `v`: `ln(1 + max(v, 0))`.
#[inline]
pub fn dense_feature(v: i64) -> f32 {
    dense_feature_with(log1p_table(), v)
}

#[inline]
fn dense_feature_with(table: &[f32; LOG1P_TABLE_LEN], v: i64) -> f32 {
    match table.get(v as u64 as usize) {
        Some(&x) => x,
        None => log1p_clamped(v as f32),
    }
}

/// The bucket of categorical hex value `hex` in a table of `table_size` rows hashed with
/// `field_seed`; `None` when `hex` is not hexadecimal.
#[inline]
pub fn sparse_feature(hex: &[u8], field_seed: u64, table_size: u64) -> Option<u64> {
    let parsed = match <&[u8; 8]>::try_from(hex) {
        Ok(s8) => parse_hex8(s8),
        Err(_) => parse_hex(hex),
    };
    parsed.map(|v| hash_bucket(field_seed, v, table_size))
}

/// Hex digit value of each byte; 0xFF for a non-hex byte.
static HEX_DIGIT: [u8; 256] = {
    let mut t = [0xFFu8; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = match b as u8 {
            c @ b'0'..=b'9' => c - b'0',
            c @ b'a'..=b'f' => c - b'a' + 10,
            c @ b'A'..=b'F' => c - b'A' + 10,
            _ => 0xFF,
        };
        b += 1;
    }
    t
};

/// [`parse_hex`] for the common 8-digit case, branch-free over the digits.
#[inline]
fn parse_hex8(s: &[u8; 8]) -> Option<u64> {
    let mut v = 0u64;
    let mut bad = 0u8;
    for &b in s {
        let d = HEX_DIGIT[b as usize];
        bad |= d;
        v = (v << 4) | (d & 0x0F) as u64;
    }
    (bad & 0x80 == 0).then_some(v)
}

/// `0x80` in each byte of `w` that equals `\t`, 0 elsewhere (exact, no false positives).
#[inline(always)]
fn tab_bytes(w: u64) -> u64 {
    const LOW7: u64 = 0x7F7F_7F7F_7F7F_7F7F;
    let x = w ^ 0x0909_0909_0909_0909;
    !(((x & LOW7) + LOW7) | x | LOW7)
}

/// Bit `i` set iff `block[i]` is a TAB.
#[inline(always)]
fn tab_bits(block: &[u8; 64]) -> u64 {
    let mut bits = 0u64;
    for (j, w) in block.chunks_exact(8).enumerate() {
        let m = tab_bytes(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        // Gathers the 0x80 flags of the 8 bytes into 8 consecutive bits.
        bits |= ((m >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) << (8 * j);
    }
    bits
}

/// Stores the positions of the TABs of `line` in `ends` and returns their
/// number; `None` if there are more than `NUM_FIELDS - 1`.
#[inline]
fn find_tabs(line: &[u8], ends: &mut [usize; NUM_FIELDS]) -> Option<usize> {
    let mut tabs = 0usize;
    let mut push_all = |mut bits: u64, base: usize| -> Option<()> {
        while bits != 0 {
            if tabs == NUM_FIELDS - 1 {
                return None;
            }
            ends[tabs] = base + bits.trailing_zeros() as usize;
            tabs += 1;
            bits &= bits - 1;
        }
        Some(())
    };
    let mut blocks = line.chunks_exact(64);
    let mut base = 0;
    for block in &mut blocks {
        push_all(tab_bits(block.try_into().expect("64 bytes")), base)?;
        base += 64;
    }
    let rest = blocks.remainder();
    if !rest.is_empty() {
        let mut block = [0u8; 64];
        block[..rest.len()].copy_from_slice(rest);
        push_all(tab_bits(&block), base)?;
    }
    Some(tabs)
}

/// Parses one line (no line terminator; a trailing `\r` is tolerated) and
/// appends it as one sample to `out` (shape 13 dense / 26 sparse).
///
/// `seeds` are the per-field hashing seeds, [`CriteoFeatures::field_seeds`].
/// On error nothing is appended and the reason is returned with the 0-based
/// index of the offending field within the line (0 = label, 1..=13 =
/// `I1..I13`, 14..=39 = `C1..C26`), where one field is to blame.
/// Allocation-free apart from growing `out`.
pub fn parse_line(
    line: &[u8],
    features: &CriteoFeatures,
    seeds: &[u64; NUM_SPARSE],
    out: &mut Batch,
) -> Result<(), (BadReason, Option<usize>)> {
    let line = match line {
        [rest @ .., b'\r'] => rest,
        _ => line,
    };
    // ends[k] = one past the last byte of field k.
    let mut ends = [0usize; NUM_FIELDS];
    let tabs = match find_tabs(line, &mut ends) {
        Some(t) => t,
        None => return Err((BadReason::FieldCount, None)),
    };
    ends[tabs] = line.len();
    let nfields = tabs + 1;
    if nfields < MIN_FIELDS {
        return Err((BadReason::FieldCount, None));
    }
    let field = |k: usize| -> &[u8] {
        let start = if k == 0 { 0 } else { ends[k - 1] + 1 };
        &line[start..ends[k]]
    };

    let label = parse_label(field(0)).ok_or((BadReason::BadLabel, Some(0)))?;
    if nfields < NUM_FIELDS && shifted_hash(field(NUM_DENSE)) {
        return Err((BadReason::FieldCount, Some(NUM_DENSE)));
    }
    let log_table = log1p_table();
    let mut dense = [0.0f32; NUM_DENSE];
    for (j, d) in dense.iter_mut().enumerate() {
        let s = field(1 + j);
        if !s.is_empty() {
            match parse_dense_integer(s) {
                Some(v) => *d = dense_feature_with(log_table, v),
                None => return Err((BadReason::BadInteger, Some(1 + j))),
            }
        }
    }
    // u64::MAX marks an empty bag (bucket ids are < table size <= u64::MAX).
    let mut ids = [u64::MAX; NUM_SPARSE];
    let present = nfields - 1 - NUM_DENSE;
    for (f, id) in ids.iter_mut().enumerate().take(present) {
        let k = 1 + NUM_DENSE + f;
        let s = field(k);
        if !s.is_empty() {
            match sparse_feature(s, seeds[f], features.table_sizes[f]) {
                Some(v) => *id = v,
                None => return Err((BadReason::BadHex, Some(k))),
            }
        }
    }

    push_sample(out, label, &dense, &ids);
    Ok(())
}

/// Whether the field at `I13`'s place of a short line is a categorical hash (8 hex
/// digits): the line then lacks a leading column (an unlabeled line, its `C1` here), not
/// trailing empty categories. An 8-digit decimal `I13` in a short line is refused with it.
#[inline]
pub fn shifted_hash(field: &[u8]) -> bool {
    field.len() == 8 && field.iter().all(u8::is_ascii_hexdigit)
}

/// The label of a line: exactly `0` or `1` (not `+1`, `01`, `-0`).
#[inline]
pub fn parse_label(field: &[u8]) -> Option<f32> {
    match field {
        b"0" => Some(0.0),
        b"1" => Some(1.0),
        _ => None,
    }
}

/// The integer of a non-empty `I` field: an optional sign and 1 to 18 decimal digits
/// ([`parse_i64`]); `None` for anything else (then the line is [`BadReason::BadInteger`]).
#[inline]
pub fn parse_dense_integer(field: &[u8]) -> Option<i64> {
    parse_i64(field)
}

/// Appends one Criteo sample; `u64::MAX` in `ids` marks an absent value (an empty bag).
pub(crate) fn push_sample(out: &mut Batch, label: f32, dense: &[f32; NUM_DENSE], ids: &[u64; NUM_SPARSE]) {
    out.labels.push(label);
    out.dense.extend_from_slice(dense);
    for (sf, &id) in out.sparse.iter_mut().zip(ids) {
        if id != u64::MAX {
            sf.ids.push(id);
        }
        sf.close_bag();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lines::{align_to_line, count_newlines};

    fn features() -> CriteoFeatures {
        CriteoFeatures::uniform(1000, 7)
    }

    fn line40() -> String {
        let mut f = vec!["1".to_string()];
        f.extend((0..13).map(|i| if i == 2 { String::new() } else { (i as i64 - 1).to_string() }));
        f.extend((0..26).map(|i| if i % 5 == 0 { String::new() } else { format!("{:08x}", i * 7919) }));
        f.join("\t")
    }

    #[test]
    fn parses_a_full_line() {
        let feats = features();
        let seeds = feats.field_seeds();
        let mut b = Batch::new(NUM_DENSE, NUM_SPARSE);
        parse_line(line40().as_bytes(), &feats, &seeds, &mut b).unwrap();
        b.check().unwrap();
        assert_eq!(b.labels, vec![1.0]);
        assert_eq!(b.dense[0], 0.0); // -1 clamps to 0
        assert_eq!(b.dense[1], 0.0);
        assert_eq!(b.dense[2], 0.0); // missing
        assert!((b.dense[3] - 2f32.ln_1p()).abs() < 1e-6); // value 2
        assert!(b.sparse[0].bag(0).is_empty());
        assert_eq!(b.sparse[1].bag(0), &[hash_bucket(seeds[1], 7919, 1000)]);
    }

    #[test]
    fn rejects_without_partial_append() {
        let feats = features();
        let seeds = feats.field_seeds();
        let mut b = Batch::new(NUM_DENSE, NUM_SPARSE);
        let good = line40();
        let bad_hex = good.replacen("00001eef", "0000zeef", 1);
        assert_ne!(good, bad_hex);
        assert_eq!(parse_line(bad_hex.as_bytes(), &feats, &seeds, &mut b), Err((BadReason::BadHex, Some(15))));
        let bad_int = good.replacen("\t3\t", "\t3.0\t", 1);
        assert_eq!(parse_line(bad_int.as_bytes(), &feats, &seeds, &mut b), Err((BadReason::BadInteger, Some(5))));
        let bad_label = format!("2{}", &good[1..]);
        assert_eq!(parse_line(bad_label.as_bytes(), &feats, &seeds, &mut b), Err((BadReason::BadLabel, Some(0))));
        let long = format!("{good}\t");
        assert_eq!(parse_line(long.as_bytes(), &feats, &seeds, &mut b), Err((BadReason::FieldCount, None)));
        assert_eq!(parse_line(b"1\t2\t3", &feats, &seeds, &mut b), Err((BadReason::FieldCount, None)));
        assert!(b.is_empty());
        b.check().unwrap();
        // Stripped trailing fields and CRLF.
        let stripped: Vec<&str> = good.split('\t').take(37).collect();
        let stripped = format!("{}\r", stripped.join("\t"));
        parse_line(stripped.as_bytes(), &feats, &seeds, &mut b).unwrap();
        assert!(b.sparse[25].bag(0).is_empty() && b.sparse[24].bag(0).is_empty());
        b.check().unwrap();
    }

    #[test]
    fn an_unlabeled_line_is_never_read_shifted_as_a_labeled_one() {
        let feats = features();
        let seeds = feats.field_seeds();
        let mut b = Batch::new(NUM_DENSE, NUM_SPARSE);
        // I1..I13, C1..C26 with I1 = 1 and an all-digit C1: shifted, it would parse.
        let mut f: Vec<String> = vec!["1".into()];
        f.extend((1..13).map(|i| i.to_string()));
        f.push("05139164".into());
        f.extend((1..26).map(|i| format!("{:08x}", i * 7919)));
        let unlabeled = f.join("\t");
        assert_eq!(unlabeled.split('\t').count(), 39);
        assert_eq!(
            parse_line(unlabeled.as_bytes(), &feats, &seeds, &mut b),
            Err((BadReason::FieldCount, Some(NUM_DENSE)))
        );
        // Stripped to 37 or 38 fields, the same.
        for keep in [37, 38] {
            let short = f[..keep].join("\t");
            assert_eq!(parse_line(short.as_bytes(), &feats, &seeds, &mut b), Err((BadReason::FieldCount, Some(13))));
        }
        assert!(b.is_empty());
        // A labeled line of 39 fields (C26 stripped) whose I13 is an integer or empty is read.
        let mut labeled: Vec<String> = vec!["0".into()];
        labeled.extend(f[..38].iter().cloned());
        for i13 in ["1234", ""] {
            labeled[13] = i13.to_string();
            parse_line(labeled.join("\t").as_bytes(), &feats, &seeds, &mut b).unwrap();
        }
        assert_eq!(b.len(), 2);
        // A complete line's I13 may be any integer.
        labeled[13] = "12345678".into();
        labeled.push("0000abcd".into());
        parse_line(labeled.join("\t").as_bytes(), &feats, &seeds, &mut b).unwrap();
        assert_eq!(b.len(), 3);
        b.check().unwrap();
    }

    #[test]
    fn fast_paths_match_helpers() {
        let mut ends = [0usize; NUM_FIELDS];
        for len in 0..200 {
            let line: Vec<u8> =
                (0..len).map(|i| if (i * 7 + len) % 5 == 0 { b'\t' } else { b'a' + (i % 26) as u8 }).collect();
            let want: Vec<usize> = line.iter().enumerate().filter(|(_, &b)| b == b'\t').map(|(i, _)| i).collect();
            match find_tabs(&line, &mut ends) {
                Some(n) => assert_eq!(&ends[..n], &want[..]),
                None => assert!(want.len() >= NUM_FIELDS),
            }
        }
        // Bytes that differ from TAB in one bit, or are 0x89, are not TABs.
        let tricky: Vec<u8> = [0x08, 0x0b, 0x0d, 0x19, 0x29, 0x49, 0x89, 0x00, 0xff, b'\t'].repeat(8);
        let n = find_tabs(&tricky, &mut ends).unwrap();
        assert_eq!(n, 8);
        assert_eq!(&ends[..n], &[9, 19, 29, 39, 49, 59, 69, 79]);
        for v in 0..LOG1P_TABLE_LEN {
            assert_eq!(log1p_table()[v].to_bits(), log1p_clamped(v as f32).to_bits());
        }
        for b in 0..=255u8 {
            for pos in 0..8 {
                let mut s = *b"0aF9c3E7";
                s[pos] = b;
                assert_eq!(parse_hex8(&s), parse_hex(&s), "{s:?}");
            }
        }
    }

    #[test]
    fn alignment() {
        let data = b"ab\ncd\n\nef";
        assert_eq!(align_to_line(data, 0), 0);
        assert_eq!(align_to_line(data, 1), 3);
        assert_eq!(align_to_line(data, 3), 3);
        assert_eq!(align_to_line(data, 4), 6);
        assert_eq!(align_to_line(data, 6), 6);
        assert_eq!(align_to_line(data, 7), 7);
        assert_eq!(align_to_line(data, 8), 9);
        assert_eq!(align_to_line(data, 9), 9);
        assert_eq!(count_newlines(data), 3);
    }
}
