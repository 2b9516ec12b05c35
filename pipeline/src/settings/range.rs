//! The allowed values of numeric settings.
//!
//! A numeric setting of [`TrainSettings`](super::TrainSettings) declares its [`Range`] once,
//! next to its field, with `ranged!`: `ranged!(batch_size: usize, closed(1, MAX_BATCH))`
//! makes a module `batch_size` holding the range (`batch_size::RANGE`, the field's clap
//! `value_parser`) and `batch_size::deserialize` (the field's serde `deserialize_with`).
//! A flag outside the settings (`serve --threads`, `predict --batch-size`) takes a
//! [`Range`] as its `value_parser` directly.
//!
//! Invariants:
//! * A flag, a TOML key and a setting built in code are checked against the same range:
//!   clap parses the flag through it, a TOML file is deserialised through it, and
//!   `TrainSettings::validate` reads the settings again through their TOML form.
//! * NaN and the infinities are outside every range.
//! * A refusal names the key (or the flag), the value and the range.
//! * A duration's range ends at or below [`MAX_SECONDS`], so [`seconds`] of a value in it is a
//!   [`Duration`] and adding it to an [`Instant`](std::time::Instant) cannot overflow.

use serde::de::{DeserializeOwned, Deserializer, Error as _};
use std::ffi::OsStr;
use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;
use tiderec_operators::ConfigError;

/// The longest duration any setting takes, in seconds (about 11.6 days).
pub const MAX_SECONDS: f64 = 1e6;

/// The largest count of training steps, samples or evaluations a setting takes (2⁴⁸).
pub const MAX_STEPS: u64 = 1 << 48;

/// The largest batch, in records (2²⁴).
pub const MAX_BATCH: usize = 1 << 24;

/// The widest layer or embedding (2²⁰).
pub const MAX_WIDTH: usize = 1 << 20;

/// The most rows of one embedding table (2⁶²; what fits in memory is checked by the estimate).
pub const MAX_ROWS: u64 = 1 << 62;

/// The most workers, threads or processes a setting takes.
pub const MAX_THREADS: usize = 1024;

/// A number type a setting can have.
pub trait Number:
    Copy + PartialOrd + Display + FromStr<Err: Display> + DeserializeOwned + Send + Sync + 'static
{
    /// False for NaN and the infinities.
    fn is_finite_number(self) -> bool {
        true
    }

    /// The number as a message shows it (`1e300`, not three hundred digits).
    fn show(self) -> String {
        self.to_string()
    }
}

/// A float as a message shows it: in scientific notation when very large or very small.
fn show_float(v: f64) -> String {
    let a = v.abs();
    if a.is_finite() && a != 0.0 && !(1e-4..1e6).contains(&a) {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

macro_rules! integers {
    ($($t:ty),*) => { $(impl Number for $t {})* };
}
integers!(u16, u32, u64, usize, i32, i64);

impl Number for f32 {
    fn is_finite_number(self) -> bool {
        self.is_finite()
    }

    fn show(self) -> String {
        show_float(self.into())
    }
}

impl Number for f64 {
    fn is_finite_number(self) -> bool {
        self.is_finite()
    }

    fn show(self) -> String {
        show_float(self)
    }
}

/// The values a numeric setting `key` may take: `min` to `max`, each end included unless open.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range<T> {
    key: &'static str,
    min: T,
    max: T,
    min_open: bool,
    max_open: bool,
}

impl<T> Range<T> {
    /// `[min, max]`.
    pub const fn closed(key: &'static str, min: T, max: T) -> Self {
        Range { key, min, max, min_open: false, max_open: false }
    }

    /// `(min, max]`: above `min`.
    pub const fn above(key: &'static str, min: T, max: T) -> Self {
        Range { key, min, max, min_open: true, max_open: false }
    }

    /// `[min, max)`: below `max`.
    pub const fn below(key: &'static str, min: T, max: T) -> Self {
        Range { key, min, max, min_open: false, max_open: true }
    }

    /// The setting's key.
    pub fn key(&self) -> &'static str {
        self.key
    }
}

impl<T: Number> Range<T> {
    /// True when `v` is a finite number within the range.
    pub fn contains(&self, v: T) -> bool {
        let above_min = if self.min_open { v > self.min } else { v >= self.min };
        let below_max = if self.max_open { v < self.max } else { v <= self.max };
        v.is_finite_number() && above_min && below_max
    }

    /// `v`, or an error naming the key, `v` and the range.
    pub fn check(&self, v: T) -> Result<T, ConfigError> {
        if self.contains(v) {
            Ok(v)
        } else {
            Err(ConfigError::new(self.key, format!("{} is outside the allowed range {self}", v.show())))
        }
    }

    /// `text` as a number within the range.
    pub fn parse(&self, text: &str) -> Result<T, ConfigError> {
        let v = text
            .trim()
            .parse::<T>()
            .map_err(|e| ConfigError::new(self.key, format!("`{text}` is not a number in {self}: {e}")))?;
        self.check(v)
    }

    /// Serde's `deserialize_with` of a field of this range: `T`, `Option<T>`, `Vec<T>` or
    /// `Option<Vec<T>>`, every number checked.
    pub fn deserialize<'de, D: Deserializer<'de>, V: Checked<T>>(&self, d: D) -> Result<V, D::Error> {
        let v = V::deserialize(d)?;
        v.check_in(self).map_err(|e| D::Error::custom(e.reason))?;
        Ok(v)
    }
}

impl<T: Number> Display for Range<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let open = if self.min_open { '(' } else { '[' };
        let close = if self.max_open { ')' } else { ']' };
        write!(f, "{open}{}, {}{close}", self.min.show(), self.max.show())
    }
}

impl<T: Number> clap::builder::TypedValueParser for Range<T> {
    type Value = T;

    fn parse_ref(&self, cmd: &clap::Command, arg: Option<&clap::Arg>, value: &OsStr) -> Result<T, clap::Error> {
        let text = value.to_string_lossy();
        self.parse(&text).map_err(|e| {
            let flag = arg.map_or_else(|| self.key.to_string(), |a| a.to_string());
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value '{text}' for '{flag}': {}\n", e),
            )
            .with_cmd(cmd)
        })
    }
}

/// A field shape whose numbers a [`Range`] checks.
pub trait Checked<T>: DeserializeOwned {
    /// Every number of `self` within `range`.
    fn check_in(&self, range: &Range<T>) -> Result<(), ConfigError>;
}

impl<T: Number> Checked<T> for T {
    fn check_in(&self, range: &Range<T>) -> Result<(), ConfigError> {
        range.check(*self).map(drop)
    }
}

impl<T: Number> Checked<T> for Option<T> {
    fn check_in(&self, range: &Range<T>) -> Result<(), ConfigError> {
        self.iter().try_for_each(|v| v.check_in(range))
    }
}

impl<T: Number> Checked<T> for Vec<T> {
    fn check_in(&self, range: &Range<T>) -> Result<(), ConfigError> {
        self.iter().try_for_each(|v| v.check_in(range))
    }
}

impl<T: Number> Checked<T> for Option<Vec<T>> {
    fn check_in(&self, range: &Range<T>) -> Result<(), ConfigError> {
        self.iter().try_for_each(|v| v.check_in(range))
    }
}

/// `secs` as a [`Duration`]; a value of a duration's range (finite, at most [`MAX_SECONDS`])
/// always converts, anything else is an error naming `key`.
pub fn seconds(key: &str, secs: f64) -> Result<Duration, ConfigError> {
    if secs.is_nan() || secs > MAX_SECONDS {
        return Err(ConfigError::new(key, format!("{secs} seconds is more than {MAX_SECONDS}")));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| ConfigError::new(key, format!("{secs} seconds: {e}")))
}

/// Declares the range of the numeric setting `key` next to its field: a module `key` with
/// `RANGE` (the field's clap `value_parser`) and `deserialize` (its serde `deserialize_with`).
///
/// `ranged!(key: TYPE, closed(MIN, MAX))`; `above` and `below` open the lower or upper end.
macro_rules! ranged {
    ($key:ident: $t:ty, $kind:ident($min:expr, $max:expr)) => {
        #[doc = concat!("The range of `", stringify!($key), "`.")]
        pub(crate) mod $key {
            #[allow(unused_imports)]
            use super::*;
            #[allow(unused_imports)]
            use $crate::settings::range::*;

            /// The setting's allowed values.
            pub const RANGE: $crate::settings::range::Range<$t> =
                $crate::settings::range::Range::$kind(stringify!($key), $min, $max);

            /// The field read from a file, refused outside [`RANGE`].
            pub fn deserialize<'de, D, V>(d: D) -> Result<V, D::Error>
            where
                D: serde::Deserializer<'de>,
                V: $crate::settings::range::Checked<$t>,
            {
                RANGE.deserialize(d)
            }
        }
    };
}

pub(crate) use ranged;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_refuse_non_finite_and_out_of_range_values_naming_them() {
        let lr = Range::above("lr", 0.0f32, 1000.0);
        assert_eq!(lr.parse("0.5").unwrap(), 0.5);
        for text in ["nan", "NaN", "inf", "-inf", "0", "1e30", "-1"] {
            let e = lr.parse(text).unwrap_err().to_string();
            assert!(e.contains("`lr`") && e.contains("(0, 1000]"), "{text}: {e}");
        }
        let e = lr.parse("fast").unwrap_err().to_string();
        assert!(e.contains("`fast` is not a number"), "{e}");
        let f = Range::below("eval_fraction", 0.0f64, 1.0);
        assert!(f.contains(0.0) && f.contains(0.99) && !f.contains(1.0));
        let n = Range::closed("threads", 1usize, 1024);
        assert!(n.contains(1) && n.contains(1024) && !n.contains(0) && !n.contains(30000));
        assert_eq!(n.to_string(), "[1, 1024]");
        let e = Range::closed("reload_every", 0.0, MAX_SECONDS).parse("1e300").unwrap_err().to_string();
        assert!(e.contains("1e300 is outside the allowed range [0, 1e6]"), "{e}");
    }

    #[test]
    fn seconds_in_range_convert_and_others_are_errors() {
        assert_eq!(seconds("t", 1.5).unwrap(), Duration::from_millis(1500));
        for bad in [1e300, f64::INFINITY, f64::NAN, -1.0] {
            assert!(seconds("t", bad).is_err(), "{bad}");
        }
    }
}
