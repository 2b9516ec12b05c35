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
//!   several epochs both counts grow together. `good` counts the records the
//!   malformed ones are records of: samples of line formats, but the good log
//!   lines of samples derived up front (`taobao-behavior`, whose events make
//!   about two samples each).
//! * A split with malformed records and no good one fails whatever the budget,
//!   saying that no record was readable and naming the first malformed record
//!   (from the dead-letter file, when it is a regular file already written) or
//!   else the most frequent reason.

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
    /// Good records read: samples, or the log lines that derived samples come from.
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
    if bad > 0 && tally.good == 0 {
        return Err(PipelineError::BadInput {
            split: split.name(),
            input: input.to_string(),
            reason: none_readable(&tally, dead_letters, split),
        });
    }
    if bad > 0 && fraction > max_fraction {
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

/// The error of a split whose every record is malformed: no budget lets it through, and the
/// first malformed record (or, where the dead-letter file cannot tell it, the most frequent
/// reason) says why.
fn none_readable(tally: &Tally, dead_letters: &Path, split: Split) -> String {
    let bad = tally.bad_total();
    let counts = BadRecordCounts::from_array(tally.bad);
    let by_reason: Vec<String> = counts.by_reason.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let why = match first_dead_letter(dead_letters) {
        Some(first) => format!("the first is {first}"),
        None => {
            let (reason, _) = counts.by_reason.iter().max_by_key(|&(_, &n)| n).expect("bad > 0");
            format!("most of them {reason}")
        }
    };
    format!(
        "no record was readable: {bad} of {bad} records (100.00%) are malformed ({}; {why}), which no \
         --max-bad-fraction lets through; they are listed in {}{}",
        by_reason.join(", "),
        dead_letters.display(),
        hint(tally, split)
    )
}

/// The first record of the dead-letter file at `path` as `FILE:LINE (REASON in field F)`;
/// `None` when it is no regular file (never read from a pipe) or holds no complete line yet.
fn first_dead_letter(path: &Path) -> Option<String> {
    use std::io::{BufRead, Read};
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let file = std::fs::File::open(path).ok()?;
    let mut line = Vec::new();
    std::io::BufReader::new(file.take(64 * 1024)).read_until(b'\n', &mut line).ok()?;
    let line = line.strip_suffix(b"\n")?;
    let mut fields = line.split(|&b| b == b'\t');
    let source = tiderec_sinks::dead_letters::unescape(fields.next()?)?;
    let number = fields.next()?;
    let _offset = fields.next()?;
    let (reason, field) = (fields.next()?, fields.next()?);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let field = if field == b"-" { String::new() } else { format!(" in field {}", text(field)) };
    Some(format!("{}:{} ({}{field})", text(&source), text(number), text(reason)))
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

    /// With no good record the error says none was readable, naming the first malformed
    /// record from the dead-letter file (or the most frequent reason without one), not a
    /// fraction over the budget.
    #[test]
    fn no_readable_record_names_the_first_malformed_one() {
        let dir = tempfile::tempdir().unwrap();
        let dead = dir.path().join("dead.tsv");
        std::fs::write(&dead, "data/test.txt\t1\t0\tbad_label\t0\t12\\t3\nsecond\t2\t9\tbad_hex\t20\tx\n").unwrap();
        let t = tally(0, &[(BadReason::BadLabel, 200), (BadReason::BadHex, 1)]);
        let e = check(Split::Convert, "criteo:data/test.txt", t, 1.0, &dead).unwrap_err().to_string();
        for part in [
            "conversion input criteo:data/test.txt",
            "no record was readable",
            "201 of 201 records (100.00%) are malformed (bad_hex 1, bad_label 200; ",
            "the first is data/test.txt:1 (bad_label in field 0)), which no --max-bad-fraction lets through",
            "unlabeled",
        ] {
            assert!(e.contains(part), "`{part}` in: {e}");
        }
        assert!(!e.contains("allows"), "{e}");
        // No dead-letter file (or not yet written): the most frequent reason.
        let t = tally(0, &[(BadReason::FieldCount, 3), (BadReason::BadHex, 1)]);
        let e = check(Split::Train, "avazu:t", t, 1.0, &dir.path().join("none.tsv")).unwrap_err().to_string();
        assert!(e.contains("no record was readable") && e.contains("most of them field_count"), "{e}");
    }

    #[test]
    fn an_empty_split_fails_naming_the_input() {
        let e = check(Split::Train, "csv:empty.csv", Tally::default(), 0.5, Path::new("d")).unwrap_err().to_string();
        assert!(e.contains("training input csv:empty.csv") && e.contains("no samples"), "{e}");
    }
}
