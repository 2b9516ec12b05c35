//! Malformed input: what went wrong, where, and what to do about it.
//!
//! Readers never panic on data. Each malformed record becomes a
//! [`BadRecord`] that is counted by [`BadReason`] and handed to a
//! [`DeadLetterSink`]; with [`BadRecordPolicy::Fail`] the reader returns an
//! error carrying the same information instead.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Why a record was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum BadReason {
    /// The record has a number of fields the format does not allow.
    FieldCount,
    /// A label is not 0 or 1.
    BadLabel,
    /// An integer field holds something other than a decimal integer.
    BadInteger,
    /// A categorical field holds something other than hex digits.
    BadHex,
    /// The record is longer than the configured limit.
    TooLong,
    /// A numeric value is infinite or NaN, overflows `f32` (`1e40`), or becomes
    /// non-finite after its transform; training on it would ruin the model.
    NonFinite,
}

impl BadReason {
    /// Number of reasons (the length of the count arrays exchanged between workers).
    pub const COUNT: usize = 6;

    /// Every reason, in the order of [`BadReason::index`].
    pub const ALL: [BadReason; BadReason::COUNT] = [
        BadReason::FieldCount,
        BadReason::BadLabel,
        BadReason::BadInteger,
        BadReason::BadHex,
        BadReason::TooLong,
        BadReason::NonFinite,
    ];

    /// Position of this reason in [`BadReason::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// A stable snake_case name, used in metrics and dead-letter files.
    pub fn name(self) -> &'static str {
        match self {
            BadReason::FieldCount => "field_count",
            BadReason::BadLabel => "bad_label",
            BadReason::BadInteger => "bad_integer",
            BadReason::BadHex => "bad_hex",
            BadReason::TooLong => "too_long",
            BadReason::NonFinite => "non_finite",
        }
    }
}

impl fmt::Display for BadReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Counts indexed by [`BadReason::index`], as exchanged between workers.
pub type ReasonCounts = [u64; BadReason::COUNT];

/// One malformed record and where it was found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BadRecord {
    /// The file (or topic/partition) it came from.
    pub source: String,
    /// 1-based line number in that file.
    pub line: u64,
    /// Byte offset of the line's first byte.
    pub byte_offset: u64,
    /// What is wrong with it.
    pub reason: BadReason,
    /// 0-based index of the offending field, where one field is to blame.
    pub field: Option<usize>,
    /// The raw record (possibly truncated for very long lines).
    pub raw: Vec<u8>,
}

impl fmt::Display for BadRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{} (byte {}): {}", self.source, self.line, self.byte_offset, self.reason)?;
        if let Some(field) = self.field {
            write!(f, " in field {field}")?;
        }
        Ok(())
    }
}

/// What a reader does with a malformed record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum BadRecordPolicy {
    /// Count it, send it to the dead-letter sink and go on.
    #[default]
    #[serde(rename = "skip", alias = "Skip")]
    Skip,
    /// Stop with an error naming the record.
    #[serde(rename = "fail", alias = "Fail")]
    Fail,
}

impl BadRecordPolicy {
    /// The name in flags and files: `skip` or `fail`.
    pub fn name(self) -> &'static str {
        match self {
            BadRecordPolicy::Skip => "skip",
            BadRecordPolicy::Fail => "fail",
        }
    }
}

impl std::fmt::Display for BadRecordPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BadRecordPolicy {
    type Err = crate::ConfigError;

    fn from_str(s: &str) -> Result<Self, crate::ConfigError> {
        match s {
            "skip" => Ok(BadRecordPolicy::Skip),
            "fail" => Ok(BadRecordPolicy::Fail),
            other => Err(crate::ConfigError::new("on_bad_record", format!("`{other}` is not skip or fail"))),
        }
    }
}

/// Where malformed records go. Implementations must not lose a record they accepted.
pub trait DeadLetterSink: Send {
    /// Stores one record.
    fn write(&mut self, record: &BadRecord) -> std::io::Result<()>;
    /// Makes everything written so far durable.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A sink that keeps records in memory (tests, small runs).
#[derive(Default, Debug)]
pub struct MemoryDeadLetters {
    /// Every record written, in order.
    pub records: Vec<BadRecord>,
}

impl DeadLetterSink for MemoryDeadLetters {
    fn write(&mut self, record: &BadRecord) -> std::io::Result<()> {
        self.records.push(record.clone());
        Ok(())
    }
}

/// Counts of bad records by reason; mergeable across workers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BadRecordCounts {
    /// Count per reason name.
    pub by_reason: BTreeMap<String, u64>,
}

impl BadRecordCounts {
    /// Counts one record.
    pub fn add(&mut self, reason: BadReason) {
        *self.by_reason.entry(reason.name().to_string()).or_default() += 1;
    }
    /// Adds another set of counts.
    pub fn merge(&mut self, other: &BadRecordCounts) {
        for (k, v) in &other.by_reason {
            *self.by_reason.entry(k.clone()).or_default() += v;
        }
    }
    /// Total over all reasons.
    pub fn total(&self) -> u64 {
        self.by_reason.values().sum()
    }

    /// Counts as a fixed array indexed by [`BadReason::index`] (for exchange between workers).
    pub fn to_array(&self) -> ReasonCounts {
        let mut a = [0; BadReason::COUNT];
        for r in BadReason::ALL {
            a[r.index()] = self.by_reason.get(r.name()).copied().unwrap_or(0);
        }
        a
    }

    /// The inverse of [`BadRecordCounts::to_array`]; zero counts are left out.
    pub fn from_array(a: ReasonCounts) -> Self {
        let mut c = BadRecordCounts::default();
        for r in BadReason::ALL {
            if a[r.index()] > 0 {
                c.by_reason.insert(r.name().to_string(), a[r.index()]);
            }
        }
        c
    }
}
