//! Evaluation metrics over predicted probabilities and 0/1 labels.
//!
//! Each metric is a free function over slices: [`auc`], [`logloss`],
//! [`accuracy`], [`normalized_entropy`], [`calibration`],
//! [`average_precision`] (PR-AUC) and [`gauc`] (per-user AUC). [`EvalSet`]
//! gathers predictions and [`EvalSet::summary`] computes all of them at once.
//!
//! Invariants:
//! * Metrics are computed over the merged predictions of all workers, never
//!   averaged across workers.
//! * A label above 0.5 is a positive. Scores, labels (and groups) are paired
//!   by position; entries of a longer slice beyond the shortest are ignored.
//! * A metric that is undefined for the data (one class only, no positives,
//!   no samples, a NaN score among the ranked ones) is `None`, never NaN or a
//!   made-up value.
//! * Rankings are exact: samples are sorted by score, and tied scores are one
//!   threshold (AUC gives them their average rank, PR-AUC counts them
//!   together), as scikit-learn's `roc_auc_score` and
//!   `average_precision_score` do.
//! * Every sample is ranked, however many: the sort orders indices of 32 bits
//!   (half the memory and cache footprint) while they can name every sample
//!   (`narrow_indices`), and of a machine word beyond, never truncated ones.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

/// Samples paired by position: the length of the shortest slice.
fn paired(scores: &[f32], labels: &[f32]) -> usize {
    scores.len().min(labels.len())
}

fn is_positive(y: f32) -> bool {
    y > 0.5
}

/// Whether a score of the first `n` is NaN: NaN has no rank, so no ranking metric is defined.
fn any_nan(scores: &[f32], n: usize) -> bool {
    scores[..n].iter().any(|s| s.is_nan())
}

/// The index of a sample in the orders the ranking metrics sort: `u32` or `usize`.
trait SampleIndex: Copy {
    /// The index `i`, which the caller checked fits ([`narrow_indices`] for `u32`).
    fn of(i: usize) -> Self;
    /// The index as a position in the slices.
    fn at(self) -> usize;
}

impl SampleIndex for u32 {
    fn of(i: usize) -> Self {
        debug_assert!(u32::try_from(i).is_ok(), "sample {i} has no u32 index");
        i as u32
    }
    fn at(self) -> usize {
        self as usize
    }
}

impl SampleIndex for usize {
    fn of(i: usize) -> Self {
        i
    }
    fn at(self) -> usize {
        self
    }
}

/// Whether `u32` indices name every one of `n` samples (`0..n`), so a ranking may sort
/// those rather than `usize` ones: up to `u32::MAX` samples (one short of `2³²`, which
/// keeps the test simple and loses nothing).
fn narrow_indices(n: usize) -> bool {
    u32::try_from(n).is_ok()
}

/// Calls `$f::<u32>` or `$f::<usize>` with `$args`, as [`narrow_indices`]`($n)` decides.
macro_rules! by_index_width {
    ($n:expr, $f:ident($($args:expr),*)) => {
        if narrow_indices($n) { $f::<u32>($($args),*) } else { $f::<usize>($($args),*) }
    };
}

/// The indices `0..n`, each of the type `I`.
fn indices<I: SampleIndex>(n: usize) -> Vec<I> {
    (0..n).map(I::of).collect()
}

/// Exact ROC AUC; `None` when the labels contain only one class or a score is NaN.
///
/// Sorts by score and gives tied scores their average rank (the
/// Mann–Whitney statistic): the probability that a random positive scores
/// above a random negative, ties counting one half.
pub fn auc(scores: &[f32], labels: &[f32]) -> Option<f64> {
    let n = paired(scores, labels);
    if any_nan(scores, n) {
        return None;
    }
    by_index_width!(n, auc_with(scores, labels, n))
}

/// [`auc`] of the first `n` samples, sorting indices of type `I`.
fn auc_with<I: SampleIndex>(scores: &[f32], labels: &[f32], n: usize) -> Option<f64> {
    let mut order: Vec<I> = indices(n);
    order.sort_unstable_by(|&a, &b| scores[a.at()].total_cmp(&scores[b.at()]));
    auc_of_sorted(&order, scores, labels)
}

/// AUC of the samples `order` names, which are sorted by ascending score.
fn auc_of_sorted<I: SampleIndex>(order: &[I], scores: &[f32], labels: &[f32]) -> Option<f64> {
    let positives = order.iter().filter(|&&k| is_positive(labels[k.at()])).count() as f64;
    let negatives = order.len() as f64 - positives;
    if positives == 0.0 || negatives == 0.0 {
        return None;
    }
    // Sum of ranks of positives, ties sharing their average rank.
    let mut rank_sum = 0.0f64;
    for (start, end) in tie_runs(order, scores) {
        let avg_rank = (start + end - 1) as f64 / 2.0 + 1.0;
        let tied_positives = order[start..end].iter().filter(|&&k| is_positive(labels[k.at()])).count();
        rank_sum += avg_rank * tied_positives as f64;
    }
    Some((rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives))
}

/// The runs `start..end` of equal scores in `order` (sorted by score).
fn tie_runs<'a, I: SampleIndex>(order: &'a [I], scores: &'a [f32]) -> impl Iterator<Item = (usize, usize)> + 'a {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start == order.len() {
            return None;
        }
        let score = scores[order[start].at()];
        let len = order[start..].iter().take_while(|&&k| scores[k.at()] == score).count().max(1);
        let run = (start, start + len);
        start += len;
        Some(run)
    })
}

/// Mean binary log loss of probabilities, clamped to `[1e-7, 1 - 1e-7]`; 0 without samples.
pub fn logloss(probs: &[f32], labels: &[f32]) -> f64 {
    let n = paired(probs, labels);
    if n == 0 {
        return 0.0;
    }
    probs.iter().zip(labels).map(|(&p, &y)| sample_logloss(p, y)).sum::<f64>() / n as f64
}

/// The log loss of one prediction `p` of label `y`, `p` clamped to `[1e-7, 1 - 1e-7]`.
pub fn sample_logloss(p: f32, y: f32) -> f64 {
    let p = (p as f64).clamp(1e-7, 1.0 - 1e-7);
    if is_positive(y) {
        -p.ln()
    } else {
        -(1.0 - p).ln()
    }
}

/// Fraction of samples where `p > 0.5` agrees with the label; 0 without samples.
pub fn accuracy(probs: &[f32], labels: &[f32]) -> f64 {
    let n = paired(probs, labels);
    if n == 0 {
        return 0.0;
    }
    probs.iter().zip(labels).filter(|(&p, &y)| (p > 0.5) == is_positive(y)).count() as f64 / n as f64
}

/// The observed click-through rate: the fraction of positive labels; `None` without labels.
pub fn ctr(labels: &[f32]) -> Option<f64> {
    (!labels.is_empty()).then(|| labels.iter().filter(|&&y| is_positive(y)).count() as f64 / labels.len() as f64)
}

/// The entropy in nats of a click with probability `p`: `-(p ln p + (1 - p) ln(1 - p))`,
/// 0 at `p = 0` and `p = 1`.
pub fn binary_entropy(p: f64) -> f64 {
    let term = |q: f64| if q > 0.0 { -q * q.ln() } else { 0.0 };
    term(p) + term(1.0 - p)
}

/// Normalized entropy: the mean [`logloss`] divided by the entropy of the observed CTR
/// ([`binary_entropy`] of [`ctr`]), i.e. the log loss relative to always predicting the
/// CTR (below 1 is better than that). `None` with one class only (the entropy is 0) or
/// no samples.
pub fn normalized_entropy(probs: &[f32], labels: &[f32]) -> Option<f64> {
    let n = paired(probs, labels);
    let entropy = binary_entropy(ctr(&labels[..n])?);
    (entropy > 0.0).then(|| logloss(&probs[..n], &labels[..n]) / entropy)
}

/// Calibration: the mean prediction divided by the observed CTR ([`ctr`]); 1 is
/// calibrated, above 1 over-predicts. `None` without positives (or samples).
pub fn calibration(probs: &[f32], labels: &[f32]) -> Option<f64> {
    let n = paired(probs, labels);
    let ctr = ctr(&labels[..n]).filter(|&c| c > 0.0)?;
    let mean = probs[..n].iter().map(|&p| p as f64).sum::<f64>() / n as f64;
    Some(mean / ctr)
}

/// Average precision, the area under the precision-recall curve, exactly as
/// scikit-learn's `average_precision_score`: `Σₙ (Rₙ − Rₙ₋₁) Pₙ` over the
/// thresholds `n`, which are the distinct scores in descending order (tied
/// scores are one threshold), `Pₙ` and `Rₙ` the precision and recall of
/// predicting positive at and above it, and `R₀ = 0`. `None` without positives or
/// with a NaN score.
pub fn average_precision(scores: &[f32], labels: &[f32]) -> Option<f64> {
    let n = paired(scores, labels);
    if any_nan(scores, n) {
        return None;
    }
    by_index_width!(n, average_precision_with(scores, labels, n))
}

/// [`average_precision`] of the first `n` samples, sorting indices of type `I`.
fn average_precision_with<I: SampleIndex>(scores: &[f32], labels: &[f32], n: usize) -> Option<f64> {
    let mut order: Vec<I> = indices(n);
    order.sort_unstable_by(|&a, &b| scores[b.at()].total_cmp(&scores[a.at()]));
    let positives = order.iter().filter(|&&k| is_positive(labels[k.at()])).count() as f64;
    if positives == 0.0 {
        return None;
    }
    let (mut true_positives, mut recall_before, mut sum) = (0.0f64, 0.0f64, 0.0f64);
    for (start, end) in tie_runs(&order, scores) {
        true_positives += order[start..end].iter().filter(|&&k| is_positive(labels[k.at()])).count() as f64;
        let precision = true_positives / end as f64;
        let recall = true_positives / positives;
        sum += (recall - recall_before) * precision;
        recall_before = recall;
    }
    Some(sum)
}

/// Group AUC: the mean of each user's [`auc`] over the users whose samples hold both
/// classes, weighted by the user's number of samples (impressions). `groups[i]` is
/// sample `i`'s user ([`group_key`]); `None` when no user has both classes or a score
/// is NaN.
pub fn gauc(scores: &[f32], labels: &[f32], groups: &[u64]) -> Option<f64> {
    let n = paired(scores, labels).min(groups.len());
    if any_nan(scores, n) {
        return None;
    }
    by_index_width!(n, gauc_with(scores, labels, groups, n))
}

/// [`gauc`] of the first `n` samples, sorting indices of type `I`.
fn gauc_with<I: SampleIndex>(scores: &[f32], labels: &[f32], groups: &[u64], n: usize) -> Option<f64> {
    let mut order: Vec<I> = indices(n);
    order.sort_unstable_by(|&a, &b| {
        let (a, b) = (a.at(), b.at());
        groups[a].cmp(&groups[b]).then(scores[a].total_cmp(&scores[b]))
    });
    let (mut weighted, mut weight) = (0.0f64, 0.0f64);
    for user in order.chunk_by(|&a, &b| groups[a.at()] == groups[b.at()]) {
        if let Some(a) = auc_of_sorted(user, scores, labels) {
            weighted += a * user.len() as f64;
            weight += user.len() as f64;
        }
    }
    (weight > 0.0).then(|| weighted / weight)
}

/// The group key of a user id (its bytes as they stand in the record): equal ids have
/// equal keys, and different ids collide with probability about 2⁻⁶⁴ (xxh3, unseeded).
pub fn group_key(user: &[u8]) -> u64 {
    xxh3_64(user)
}

/// Predictions and labels gathered for evaluation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalSet {
    /// Predicted probabilities.
    pub probs: Vec<f32>,
    /// 0/1 labels.
    pub labels: Vec<f32>,
    /// Each sample's user ([`group_key`]) when the data names a user column, for
    /// [`gauc`]; empty otherwise.
    #[serde(default)]
    pub groups: Vec<u64>,
}

/// The metrics of an [`EvalSet`] (`None`: undefined for these samples).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalSummary {
    /// Exact ROC AUC ([`auc`]).
    pub auc: Option<f64>,
    /// Mean log loss ([`logloss`]).
    pub logloss: Option<f64>,
    /// Accuracy at threshold 0.5 ([`accuracy`]).
    pub accuracy: Option<f64>,
    /// Normalized entropy ([`normalized_entropy`]).
    pub ne: Option<f64>,
    /// Mean prediction over observed CTR ([`calibration`]).
    pub calibration: Option<f64>,
    /// Average precision ([`average_precision`]).
    pub pr_auc: Option<f64>,
    /// Impression-weighted per-user AUC ([`gauc`]); `None` without groups.
    pub gauc: Option<f64>,
    /// Number of samples.
    pub samples: u64,
}

impl EvalSet {
    /// Appends the predictions of `other`; groups are kept only while every sample has one.
    pub fn extend_from(&mut self, other: &EvalSet) {
        let grouped = self.groups.len() == self.probs.len() && other.groups.len() == other.probs.len();
        self.probs.extend_from_slice(&other.probs);
        self.labels.extend_from_slice(&other.labels);
        if grouped {
            self.groups.extend_from_slice(&other.groups);
        } else {
            self.groups.clear();
        }
    }

    /// Computes every metric of [`EvalSummary`]; GAUC only when every sample has a group.
    pub fn summary(&self) -> EvalSummary {
        let (p, y) = (&self.probs[..], &self.labels[..]);
        let n = paired(p, y);
        let has_groups = n > 0 && self.groups.len() == n;
        let finite = |v: Option<f64>| v.filter(|x| x.is_finite());
        EvalSummary {
            auc: finite(auc(p, y)),
            logloss: finite((n > 0).then(|| logloss(p, y))),
            accuracy: finite((n > 0 && !any_nan(p, n)).then(|| accuracy(p, y))),
            ne: finite(normalized_entropy(p, y)),
            calibration: finite(calibration(p, y)),
            pr_auc: finite(average_precision(p, y)),
            gauc: finite(has_groups.then(|| gauc(p, y, &self.groups)).flatten()),
            samples: n as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// O(P·N) pair counting: the oracle for `auc`.
    fn auc_pairs(s: &[f32], y: &[f32]) -> Option<f64> {
        let (mut num, mut den) = (0.0, 0.0);
        for i in 0..s.len() {
            for j in 0..s.len() {
                if y[i] > 0.5 && y[j] < 0.5 {
                    den += 1.0;
                    num += if s[i] > s[j] {
                        1.0
                    } else if s[i] == s[j] {
                        0.5
                    } else {
                        0.0
                    };
                }
            }
        }
        if den == 0.0 {
            None
        } else {
            Some(num / den)
        }
    }

    /// O(n²) average precision straight from its definition: for every distinct score,
    /// highest first, the precision and recall of predicting positive at and above it.
    fn average_precision_direct(s: &[f32], y: &[f32]) -> Option<f64> {
        let positives = y.iter().filter(|&&v| v > 0.5).count() as f64;
        if positives == 0.0 {
            return None;
        }
        let mut thresholds: Vec<f32> = s.to_vec();
        thresholds.sort_by(|a, b| b.total_cmp(a));
        thresholds.dedup();
        let (mut sum, mut recall_before) = (0.0, 0.0);
        for t in thresholds {
            let predicted: Vec<usize> = (0..s.len()).filter(|&i| s[i] >= t).collect();
            let hits = predicted.iter().filter(|&&i| y[i] > 0.5).count() as f64;
            let (precision, recall) = (hits / predicted.len() as f64, hits / positives);
            sum += (recall - recall_before) * precision;
            recall_before = recall;
        }
        Some(sum)
    }

    /// GAUC by grouping into a map and pair-counting each user.
    fn gauc_direct(s: &[f32], y: &[f32], g: &[u64]) -> Option<f64> {
        let mut users: BTreeMap<u64, (Vec<f32>, Vec<f32>)> = BTreeMap::new();
        for i in 0..s.len() {
            let u = users.entry(g[i]).or_default();
            u.0.push(s[i]);
            u.1.push(y[i]);
        }
        let (mut num, mut den) = (0.0, 0.0);
        for (s, y) in users.values() {
            if let Some(a) = auc_pairs(s, y) {
                num += a * s.len() as f64;
                den += s.len() as f64;
            }
        }
        (den > 0.0).then(|| num / den)
    }

    /// Samples with scores on a coarse grid (many ties), labels and users.
    fn samples() -> impl Strategy<Value = (Vec<f32>, Vec<f32>, Vec<u64>)> {
        proptest::collection::vec((0u8..6, any::<bool>(), 0u64..5), 0..60).prop_map(|v| {
            let s = v.iter().map(|x| x.0 as f32 / 5.0).collect();
            let y = v.iter().map(|x| x.1 as u8 as f32).collect();
            let g = v.iter().map(|x| x.2).collect();
            (s, y, g)
        })
    }

    fn close(a: Option<f64>, b: Option<f64>) -> bool {
        match (a, b) {
            (Some(a), Some(b)) => (a - b).abs() < 1e-12,
            (a, b) => a == b,
        }
    }

    proptest! {
        #[test]
        fn auc_matches_pair_counting((s, y, _) in samples()) {
            prop_assert!(close(auc(&s, &y), auc_pairs(&s, &y)), "{:?} vs {:?}", auc(&s, &y), auc_pairs(&s, &y));
        }

        #[test]
        fn average_precision_matches_its_definition((s, y, _) in samples()) {
            let (fast, direct) = (average_precision(&s, &y), average_precision_direct(&s, &y));
            prop_assert!(close(fast, direct), "{fast:?} vs {direct:?}");
        }

        #[test]
        fn gauc_matches_grouped_pair_counting((s, y, g) in samples()) {
            let (fast, direct) = (gauc(&s, &y, &g), gauc_direct(&s, &y, &g));
            prop_assert!(close(fast, direct), "{fast:?} vs {direct:?}");
        }

        #[test]
        fn wide_indices_rank_as_narrow_ones((s, y, g) in samples()) {
            let n = s.len();
            prop_assert_eq!(auc_with::<usize>(&s, &y, n), auc_with::<u32>(&s, &y, n));
            prop_assert_eq!(average_precision_with::<usize>(&s, &y, n), average_precision_with::<u32>(&s, &y, n));
            prop_assert_eq!(gauc_with::<usize>(&s, &y, &g, n), gauc_with::<u32>(&s, &y, &g, n));
        }

        #[test]
        fn one_user_gauc_is_auc((s, y, _) in samples()) {
            prop_assert!(close(gauc(&s, &y, &vec![7; s.len()]), auc(&s, &y)));
        }

        #[test]
        fn normalized_entropy_and_calibration_match_their_formulas((s, y, _) in samples()) {
            let n = s.len() as f64;
            let positives = y.iter().filter(|&&v| v > 0.5).count() as f64;
            let p = positives / n;
            let loss: f64 = s.iter().zip(&y).map(|(&q, &v)| {
                let q = (q as f64).clamp(1e-7, 1.0 - 1e-7);
                if v > 0.5 { -q.ln() } else { -(1.0 - q).ln() }
            }).sum::<f64>() / n;
            let ne = (positives > 0.0 && positives < n).then(|| loss / -(p * p.ln() + (1.0 - p) * (1.0 - p).ln()));
            let mean = s.iter().map(|&q| q as f64).sum::<f64>() / n;
            let cal = (positives > 0.0).then(|| mean / p);
            let tol = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) => (a - b).abs() <= 1e-12 * a.abs().max(1.0),
                (a, b) => a == b,
            };
            prop_assert!(tol(normalized_entropy(&s, &y), ne), "{:?} vs {ne:?}", normalized_entropy(&s, &y));
            prop_assert!(tol(calibration(&s, &y), cal), "{:?} vs {cal:?}", calibration(&s, &y));
        }
    }

    #[test]
    fn u32_indices_only_while_they_name_every_sample() {
        for n in [0, 1, 1 << 20, u32::MAX as usize] {
            assert!(narrow_indices(n), "{n}");
        }
        // Beyond, a u32 index would wrap (n as u32 is n mod 2³²): word-sized ones rank them.
        #[cfg(target_pointer_width = "64")]
        for n in [u32::MAX as usize + 1, u32::MAX as usize + 2, 6_000_000_000, usize::MAX] {
            assert!(!narrow_indices(n), "{n}");
        }
    }

    #[test]
    fn logloss_and_accuracy() {
        let p = [0.9f32, 0.2];
        let y = [1.0f32, 0.0];
        assert!((logloss(&p, &y) - (-(0.9f64.ln()) - 0.8f64.ln()) / 2.0).abs() < 1e-6);
        assert_eq!(accuracy(&p, &y), 1.0);
    }

    #[test]
    fn normalized_entropy_by_hand() {
        // CTR 1/4: entropy −(¼ ln ¼ + ¾ ln ¾); predicting the CTR everywhere scores exactly 1.
        let y = [1.0f32, 0.0, 0.0, 0.0];
        let ne = normalized_entropy(&[0.25; 4], &y).unwrap();
        assert!((ne - 1.0).abs() < 1e-7, "{ne}");
        // Predictions 0.5, 0.5, 0.1, 0.1: log loss (ln 2 + ln 2 + 2 ln(10/9)) / 4.
        let p = [0.5f32, 0.5, 0.1, 0.1];
        let loss = (2.0 * 2f64.ln() + 2.0 * (1.0 / 0.9f64).ln()) / 4.0;
        let entropy = -(0.25 * 0.25f64.ln() + 0.75 * 0.75f64.ln());
        assert!((normalized_entropy(&p, &y).unwrap() - loss / entropy).abs() < 1e-7);
        assert_eq!(normalized_entropy(&p, &[1.0; 4]), None, "one class: the entropy is 0");
        assert_eq!(normalized_entropy(&[], &[]), None);
    }

    #[test]
    fn calibration_by_hand() {
        // Mean prediction 0.3, CTR 0.25.
        let c = calibration(&[0.6, 0.2, 0.2, 0.2], &[1.0, 0.0, 0.0, 0.0]).unwrap();
        assert!((c - 1.2).abs() < 1e-7, "{c}");
        assert_eq!(calibration(&[0.6, 0.2], &[0.0, 0.0]), None, "no positives");
        assert_eq!(calibration(&[], &[]), None);
    }

    #[test]
    fn average_precision_by_hand() {
        // scikit-learn's documented example: average_precision_score([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]).
        let ap = average_precision(&[0.1, 0.4, 0.35, 0.8], &[0.0, 0.0, 1.0, 1.0]).unwrap();
        assert!((ap - 0.8333333333333333).abs() < 1e-12, "{ap}");
        // One threshold for all: precision = CTR.
        assert_eq!(average_precision(&[0.5; 4], &[1.0, 0.0, 0.0, 0.0]), Some(0.25));
        assert_eq!(average_precision(&[0.5, 0.7], &[0.0, 0.0]), None);
    }

    #[test]
    fn gauc_by_hand() {
        // User 1: AUC 1 over 3 impressions; user 2: AUC 0.5 (a tie) over 2; user 3: one class, left out.
        let s = [0.9f32, 0.1, 0.2, 0.4, 0.4, 0.3, 0.8];
        let y = [1.0f32, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0];
        let g = [1u64, 1, 1, 2, 2, 3, 3];
        let want = (3.0 * 1.0 + 2.0 * 0.5) / 5.0;
        assert!((gauc(&s, &y, &g).unwrap() - want).abs() < 1e-12);
        assert_eq!(gauc(&s[5..], &y[5..], &g[5..]), None, "no user has both classes");
        assert_eq!(gauc(&[], &[], &[]), None);
    }

    #[test]
    fn a_nan_score_leaves_every_metric_over_it_undefined() {
        for nan in [f32::NAN, -f32::NAN] {
            let (s, y, g) = ([nan, 0.1, 0.7, 0.2], [1.0, 0.0, 1.0, 0.0], [1, 1, 1, 1]);
            assert_eq!((auc(&s, &y), average_precision(&s, &y), gauc(&s, &y, &g)), (None, None, None));
            let set = EvalSet { probs: s.to_vec(), labels: y.to_vec(), groups: g.to_vec() };
            let summary = set.summary();
            assert_eq!((summary.auc, summary.pr_auc, summary.gauc), (None, None, None));
            assert_eq!((summary.logloss, summary.accuracy, summary.ne, summary.calibration), (None, None, None, None));
            assert_eq!(summary.samples, 4);
        }
    }

    #[test]
    fn summary_holds_every_metric_and_gauc_only_with_groups() {
        let mut set = EvalSet { probs: vec![0.9, 0.1, 0.4, 0.6], labels: vec![1.0, 0.0, 1.0, 0.0], groups: vec![] };
        let s = set.summary();
        assert_eq!(s.samples, 4);
        assert_eq!(s.auc, Some(0.75));
        assert!(s.ne.is_some() && s.calibration.is_some() && s.pr_auc.is_some());
        assert_eq!(s.gauc, None);
        set.groups = vec![1, 1, 2, 2];
        assert_eq!(set.summary().gauc, Some(0.5));
        let empty = EvalSet::default().summary();
        assert_eq!(empty, EvalSummary::default());
    }

    #[test]
    fn extending_keeps_groups_only_when_all_have_them() {
        let grouped = EvalSet { probs: vec![0.5], labels: vec![1.0], groups: vec![3] };
        let mut all = EvalSet::default();
        all.extend_from(&grouped);
        all.extend_from(&grouped);
        assert_eq!(all.groups, [3, 3]);
        all.extend_from(&EvalSet { probs: vec![0.5], labels: vec![0.0], groups: vec![] });
        assert!(all.groups.is_empty() && all.probs.len() == 3);
        assert_eq!(group_key(b"874257"), group_key(b"874257"));
        assert_ne!(group_key(b"874257"), group_key(b"874258"));
    }
}
