//! The bad-record budget and the empty-input checks of a run.
//!
//! A run that skips malformed records (`--on-bad-record skip`) must still not
//! report success on input that is mostly not what it claims to be: an
//! unlabeled test file, another format, another delimiter. After each split
//! (training, evaluation) the run compares the malformed records of that split
//! with the records it read, over all workers, and fails when their fraction
//! exceeds `--max-bad-fraction`; a split that yields no sample at all fails too.
//!
//! # Invariants
//!
//! * The checks read only global counts (the collective step statistics every
//!   worker receives identically), so every worker of every process reaches
//!   the same verdict after the same step and all stop together with the same
//!   error; no extra round is needed.
//! * The fraction is `bad / (bad + good)`, over every epoch read so far: with
//!   several epochs both counts grow together.

use crate::PipelineError;
use std::path::Path;
use tiderec_operators::bad_record::{BadRecordCounts, ReasonCounts};

/// Which part of the input a check is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// The training input (`--data`).
    Train,
    /// The evaluation input (`--eval`, or the held-out part of `--data`).
    Eval,
    /// The input of `tiderec convert` (`--from`).
    Convert,
    /// The input of `tiderec predict` (`--data`).
    Predict,
}

impl Split {
    /// `training` or `evaluation`.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "training",
            Split::Eval => "evaluation",
            Split::Convert => "conversion",
            Split::Predict => "prediction",
        }
    }
}

/// One split's counts over all workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Samples read (good records).
    pub good: u64,
    /// Malformed records skipped, by [`BadReason::index`](tiderec_operators::bad_record::BadReason::index).
    pub bad: ReasonCounts,
}

impl Tally {
    /// Malformed records in all.
    pub fn bad_total(&self) -> u64 {
        self.bad.iter().sum()
    }

    /// `bad / (bad + good)`; 0 when nothing was read.
    pub fn bad_fraction(&self) -> f64 {
        let bad = self.bad_total();
        let all = bad + self.good;
        if all == 0 {
            0.0
        } else {
            bad as f64 / all as f64
        }
    }
}

/// Fails when `tally` is over the budget `max_fraction`, or when the split read no sample.
///
/// `input` names the input as the user gave it (`criteo:/data/day_0`); `dead_letters` is
/// where the skipped records were written.
pub fn check(
    split: Split,
    input: &str,
    tally: Tally,
    max_fraction: f64,
    dead_letters: &Path,
) -> Result<(), PipelineError> {
    let bad = tally.bad_total();
    let fraction = tally.bad_fraction();
    if bad > 0 && (fraction > max_fraction || tally.good == 0) {
        let counts = BadRecordCounts::from_array(tally.bad);
        let by_reason: Vec<String> = counts.by_reason.iter().map(|(k, v)| format!("{k} {v}")).collect();
        return Err(PipelineError::BadInput {
            split: split.name(),
            input: input.to_string(),
            reason: format!(
                "{bad} of {} records ({:.2}%) are malformed ({}), more than --max-bad-fraction {max_fraction} \
                 allows; they are listed in {}{}",
                bad + tally.good,
                100.0 * fraction,
                by_reason.join(", "),
                dead_letters.display(),
                hint(&tally, split)
            ),
        });
    }
    if tally.good == 0 {
        return Err(PipelineError::BadInput {
            split: split.name(),
            input: input.to_string(),
            reason: "no samples were read: the input is empty (or its share of the files holds no line)".into(),
        });
    }
    Ok(())
}

/// A guess at what is wrong when one reason dominates the malformed records.
fn hint(tally: &Tally, split: Split) -> String {
    let unlabeled = if split == Split::Predict { " (`predict --unlabeled` reads files without labels)" } else { "" };
    let text = hint_text(tally);
    if text.is_empty() {
        String::new()
    } else {
        format!("{text}{unlabeled}")
    }
}

fn hint_text(tally: &Tally) -> &'static str {
    use tiderec_operators::bad_record::BadReason;
    let bad = tally.bad_total();
    let share = |r: BadReason| tally.bad[r.index()] as f64 / bad.max(1) as f64;
    if share(BadReason::BadLabel) > 0.5 {
        ". Most of them have no 0/1 label in the label column: the file may be unlabeled (a test file \
         without the label column, such as Kaggle's test.txt) or of another format"
    } else if share(BadReason::FieldCount) > 0.5 {
        ". Most of them have a number of fields the format does not allow: the file may be unlabeled \
         (one column short), of another format, or use another delimiter"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiderec_operators::bad_record::BadReason;

    fn tally(good: u64, bad: &[(BadReason, u64)]) -> Tally {
        let mut t = Tally { good, bad: ReasonCounts::default() };
        for &(r, n) in bad {
            t.bad[r.index()] = n;
        }
        t
    }

    #[test]
    fn within_budget_passes_and_over_budget_fails_with_counts_and_path() {
        let dl = Path::new("dead.tsv");
        check(Split::Train, "criteo:a", tally(99, &[(BadReason::BadHex, 1)]), 0.01, dl).unwrap();
        check(Split::Train, "criteo:a", tally(10, &[]), 0.0, dl).unwrap();
        let e =
            check(Split::Train, "criteo:a", tally(98, &[(BadReason::BadHex, 2)]), 0.01, dl).unwrap_err().to_string();
        for part in ["training input criteo:a", "2 of 100 records (2.00%)", "bad_hex 2", "0.01", "dead.tsv"] {
            assert!(e.contains(part), "`{part}` in: {e}");
        }
        assert!(!e.contains("unlabeled"), "no hint for scattered bad values: {e}");
    }

    #[test]
    fn all_bad_fails_even_with_an_unlimited_budget_and_hints_at_unlabeled_files() {
        let t = tally(0, &[(BadReason::BadLabel, 900), (BadReason::BadInteger, 100)]);
        let e = check(Split::Eval, "criteo:t", t, 1.0, Path::new("d")).unwrap_err().to_string();
        assert!(e.contains("evaluation input criteo:t") && e.contains("unlabeled"), "{e}");
        let t = tally(0, &[(BadReason::FieldCount, 10)]);
        let e = check(Split::Train, "avazu:t", t, 1.0, Path::new("d")).unwrap_err().to_string();
        assert!(e.contains("number of fields"), "{e}");
    }

    #[test]
    fn an_empty_split_fails_naming_the_input() {
        let e = check(Split::Train, "csv:empty.csv", Tally::default(), 0.5, Path::new("d")).unwrap_err().to_string();
        assert!(e.contains("training input csv:empty.csv") && e.contains("no samples"), "{e}");
    }
}
