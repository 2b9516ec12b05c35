//! Record formats: how one line of text becomes one sample of a [`Batch`].
//!
//! A format parses in place, without allocating per field, and either
//! appends exactly one sample or appends nothing and says why
//! ([`BadReason`], and the field to blame where there is one). File readers
//! (`tiderec-sources`), the [`ParseRecords`](crate::stream::ParseRecords)
//! timely operator and future Kafka consumers all share this contract.

use crate::bad_record::BadReason;
use crate::batch::Batch;

/// A record format: how one line becomes one sample.
pub trait LineFormat {
    /// `(dense features, sparse fields)` of the samples it produces.
    fn shape(&self) -> (usize, usize);
    /// Sequence fields of the samples it produces (0 unless the format carries behaviour histories).
    fn num_sequences(&self) -> usize {
        0
    }
    /// Appends the sample of `line` (no terminator; a trailing `\r` may remain)
    /// to `out`, or says why it cannot, naming the field where one is to blame.
    /// On error nothing may have been appended.
    fn parse(&self, line: &[u8], out: &mut Batch) -> Result<(), (BadReason, Option<usize>)>;
    /// Whether `line`, the first line of a file, is a header to skip.
    fn is_header(&self, line: &[u8]) -> bool {
        let _ = line;
        false
    }
}

/// A boxed format (chosen at run time) is a format.
impl<F: LineFormat + ?Sized> LineFormat for Box<F> {
    fn shape(&self) -> (usize, usize) {
        (**self).shape()
    }
    fn num_sequences(&self) -> usize {
        (**self).num_sequences()
    }
    fn parse(&self, line: &[u8], out: &mut Batch) -> Result<(), (BadReason, Option<usize>)> {
        (**self).parse(line, out)
    }
    fn is_header(&self, line: &[u8]) -> bool {
        (**self).is_header(line)
    }
}
