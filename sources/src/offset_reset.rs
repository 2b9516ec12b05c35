//! `--on-offset-reset`: what a Kafka run does when a partition no longer holds the
//! position it stands at. Declared outside the `kafka` feature so that settings can
//! name it in any build; the detection is `kafka::reset`.

use std::fmt;
use std::str::FromStr;

/// What a run does when a partition no longer holds the position it stands at
/// (`--on-offset-reset`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnOffsetReset {
    /// Stop with an error naming the partition, the position and the broker's offsets.
    #[default]
    Fail,
    /// Restart the partition at its oldest record (re-reads what the broker holds).
    Earliest,
    /// Restart the partition at its end (only records produced from now on).
    Latest,
}

impl FromStr for OnOffsetReset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fail" => Ok(OnOffsetReset::Fail),
            "earliest" => Ok(OnOffsetReset::Earliest),
            "latest" => Ok(OnOffsetReset::Latest),
            other => Err(format!("`{other}` is not an offset-reset policy: use fail, earliest or latest")),
        }
    }
}

impl fmt::Display for OnOffsetReset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OnOffsetReset::Fail => "fail",
            OnOffsetReset::Earliest => "earliest",
            OnOffsetReset::Latest => "latest",
        })
    }
}
