//! Unlabeled records of a labeled line format (test files without their label column).
//!
//! [`Unlabeled`] wraps a [`LineFormat`] whose lines carry a label in column
//! `column` (0-based, columns separated by `delimiter`): it parses a line that
//! lacks that column as the inner format would parse the same line with a `0`
//! label inserted there. So an unlabeled record is featurized exactly as the
//! labeled one (same hashing, same transforms); its sample's label is `0` and
//! means nothing. A field the inner format blames is reported by its index in
//! the unlabeled line. A first line is a header when the inner format takes it
//! for one as read or, given the label column's name
//! ([`Unlabeled::with_label_name`]), with that name inserted.

use std::cell::RefCell;
use tiderec_records::bad_record::BadReason;
use tiderec_records::format::LineFormat;
use tiderec_records::Batch;

/// A labeled format reading lines without their label column; see the [module docs](self).
pub struct Unlabeled<F> {
    inner: F,
    column: usize,
    delimiter: u8,
    /// The label column's name, to recognise a header without it.
    label_name: Option<Vec<u8>>,
    /// The line with its placeholder label (reused between lines).
    scratch: RefCell<Vec<u8>>,
}

impl<F: LineFormat> Unlabeled<F> {
    /// `inner` reading lines whose label column `column`, separated by `delimiter`, is absent.
    pub fn new(inner: F, column: usize, delimiter: u8) -> Self {
        Unlabeled { inner, column, delimiter, label_name: None, scratch: RefCell::new(Vec::new()) }
    }

    /// Also recognises a header line that lacks the label column named `name`.
    pub fn with_label_name(mut self, name: &str) -> Self {
        self.label_name = Some(name.as_bytes().to_vec());
        self
    }
}

/// `line` with the field `0` inserted as column `column` into `out`; `None` when the line
/// has fewer than `column` columns.
pub fn insert_column(line: &[u8], column: usize, delimiter: u8, out: &mut Vec<u8>) -> Option<()> {
    insert_field(line, column, delimiter, b"0", out)
}

/// `line` with `value` inserted as column `column` into `out`; `None` when the line has
/// fewer than `column` columns.
fn insert_field(line: &[u8], column: usize, delimiter: u8, value: &[u8], out: &mut Vec<u8>) -> Option<()> {
    out.clear();
    if column == 0 {
        out.extend_from_slice(value);
        out.push(delimiter);
        out.extend_from_slice(line);
        return Some(());
    }
    match memchr::memchr_iter(delimiter, line).nth(column - 1) {
        Some(i) => {
            out.extend_from_slice(&line[..=i]);
            out.extend_from_slice(value);
            out.push(delimiter);
            out.extend_from_slice(&line[i + 1..]);
        }
        // The label was the last column.
        None if memchr::memchr_iter(delimiter, line).count() == column - 1 => {
            out.extend_from_slice(line);
            out.push(delimiter);
            out.extend_from_slice(value);
        }
        None => return None,
    }
    Some(())
}

impl<F: LineFormat> LineFormat for Unlabeled<F> {
    fn shape(&self) -> (usize, usize) {
        self.inner.shape()
    }

    fn num_sequences(&self) -> usize {
        self.inner.num_sequences()
    }

    fn parse(&self, line: &[u8], out: &mut Batch) -> Result<(), (BadReason, Option<usize>)> {
        let mut scratch = self.scratch.borrow_mut();
        if insert_column(line, self.column, self.delimiter, &mut scratch).is_none() {
            return Err((BadReason::FieldCount, None));
        }
        self.inner
            .parse(&scratch, out)
            .map_err(|(reason, field)| (reason, field.map(|f| if f > self.column { f - 1 } else { f })))
    }

    fn is_header(&self, line: &[u8]) -> bool {
        if self.inner.is_header(line) {
            return true;
        }
        let Some(name) = &self.label_name else { return false };
        let mut scratch = self.scratch.borrow_mut();
        insert_field(line, self.column, self.delimiter, name, &mut scratch).is_some() && self.inner.is_header(&scratch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::avazu::{AvazuFormat, NUM_DENSE as AVAZU_DENSE, NUM_SPARSE as AVAZU_SPARSE};
    use crate::criteo::{CriteoFeatures, CriteoFormat, NUM_DENSE, NUM_SPARSE};

    #[test]
    fn inserts_the_label_column() {
        let mut out = Vec::new();
        insert_column(b"a\tb", 0, b'\t', &mut out).unwrap();
        assert_eq!(out, b"0\ta\tb");
        insert_column(b"id,h,c", 1, b',', &mut out).unwrap();
        assert_eq!(out, b"id,0,h,c");
        insert_column(b"a,b", 2, b',', &mut out).unwrap();
        assert_eq!(out, b"a,b,0", "the label was the last column");
        assert!(insert_column(b"a", 2, b',', &mut out).is_none(), "too few columns");
    }

    #[test]
    fn unlabeled_lines_featurize_as_labeled_ones() {
        let criteo = || CriteoFormat::new(CriteoFeatures::uniform(1000, 3)).unwrap();
        let features = "1\t2\t\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13\t".to_string() + &["68fd1e64"; 26].join("\t");
        let (mut labeled, mut unlabeled) = (Batch::new(NUM_DENSE, NUM_SPARSE), Batch::new(NUM_DENSE, NUM_SPARSE));
        criteo().parse(format!("0\t{features}").as_bytes(), &mut labeled).unwrap();
        Unlabeled::new(criteo(), 0, b'\t').parse(features.as_bytes(), &mut unlabeled).unwrap();
        assert_eq!(labeled, unlabeled);
        // A bad integer is blamed on its column of the unlabeled line.
        let bad = features.replacen("\t4\t", "\tx\t", 1);
        let e = Unlabeled::new(criteo(), 0, b'\t').parse(bad.as_bytes(), &mut unlabeled).unwrap_err();
        assert_eq!(e, (BadReason::BadInteger, Some(3)));
        assert_eq!(unlabeled.len(), 1, "a bad line appends nothing");
        let avazu = || AvazuFormat::new(vec![100; AVAZU_SPARSE], 1).unwrap();
        let line = "1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,\
                    a99f214a,ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79";
        let (mut a, mut b) = (Batch::new(AVAZU_DENSE, AVAZU_SPARSE), Batch::new(AVAZU_DENSE, AVAZU_SPARSE));
        avazu().parse(line.as_bytes(), &mut a).unwrap();
        let wrapped = Unlabeled::new(avazu(), 1, b',');
        wrapped.parse(line.replacen(",0,", ",", 1).as_bytes(), &mut b).unwrap();
        assert_eq!(a, b);
        assert!(wrapped.is_header(b"id,hour,C1"));
        // A spec whose header starts with the label column: recognised once the name is known.
        let spec = tiderec_records::spec::FeatureSpec::taobao_ad(100, 5);
        let header = "time_stamp,userid";
        let plain = Unlabeled::new(tiderec_records::spec::SpecFormat::new(spec.clone(), 1).unwrap(), 0, b',');
        assert!(!plain.is_header(header.as_bytes()));
        let named =
            Unlabeled::new(tiderec_records::spec::SpecFormat::new(spec, 1).unwrap(), 0, b',').with_label_name("clk");
        assert!(named.is_header(header.as_bytes()));
    }
}
