//! The parquet crate's record-batch decoder behind a panic guard.
//!
//! Invariant: no read of a Parquet file's data in this crate calls
//! [`ParquetRecordBatchReader::next`] directly; each goes through
//! [`decode_next`], so a malformed page that makes the decoder panic is an
//! error naming the file, never a crashed process.

use arrow_array::RecordBatch;
use parquet::arrow::arrow_reader::ParquetRecordBatchReader;

/// The decoder's next chunk, or why it failed on corrupt data: the parquet
/// crate panics on some malformed pages (definition levels claiming more
/// values than the page holds, a negative offset, a dictionary-encoded page
/// whose dictionary is missing), and such a panic becomes this error instead
/// of taking the process down.
pub(crate) fn decode_next(
    reader: &mut ParquetRecordBatchReader,
) -> Result<Option<Result<RecordBatch, arrow_schema::ArrowError>>, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reader.next())).map_err(|payload| {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        format!("corrupt data: the Parquet decoder failed ({what})")
    })
}
