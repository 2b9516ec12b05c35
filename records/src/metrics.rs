//! Evaluation metrics over predicted probabilities and 0/1 labels.
//!
//! [`auc`] is exact: it sorts by score and gives tied scores their average
//! rank (the Mann–Whitney statistic). Metrics are computed over the merged
//! predictions of all workers, never averaged across workers.

use serde::{Deserialize, Serialize};

/// Exact ROC AUC; `None` when the labels contain only one class.
pub fn auc(scores: &[f32], labels: &[f32]) -> Option<f64> {
    assert_eq!(scores.len(), labels.len());
    let mut order: Vec<u32> = (0..scores.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| scores[a as usize].total_cmp(&scores[b as usize]));
    let positives = labels.iter().filter(|&&y| y > 0.5).count() as f64;
    let negatives = labels.len() as f64 - positives;
    if positives == 0.0 || negatives == 0.0 {
        return None;
    }
    // Sum of ranks of positives, ties sharing their average rank.
    let mut rank_sum = 0.0f64;
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1] as usize] == scores[order[i] as usize] {
            j += 1;
        }
        let avg_rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            if labels[k as usize] > 0.5 {
                rank_sum += avg_rank;
            }
        }
        i = j + 1;
    }
    Some((rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives))
}

/// Mean binary log loss of probabilities, clamped away from 0 and 1.
pub fn logloss(probs: &[f32], labels: &[f32]) -> f64 {
    if probs.is_empty() {
        return 0.0;
    }
    let eps = 1e-7f64;
    probs
        .iter()
        .zip(labels)
        .map(|(&p, &y)| {
            let p = (p as f64).clamp(eps, 1.0 - eps);
            if y > 0.5 {
                -p.ln()
            } else {
                -(1.0 - p).ln()
            }
        })
        .sum::<f64>()
        / probs.len() as f64
}

/// Fraction of samples where `p > 0.5` agrees with the label.
pub fn accuracy(probs: &[f32], labels: &[f32]) -> f64 {
    if probs.is_empty() {
        return 0.0;
    }
    probs.iter().zip(labels).filter(|(&p, &y)| (p > 0.5) == (y > 0.5)).count() as f64 / probs.len() as f64
}

/// Predictions and labels gathered for evaluation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalSet {
    /// Predicted probabilities.
    pub probs: Vec<f32>,
    /// 0/1 labels.
    pub labels: Vec<f32>,
}

/// Summary of an [`EvalSet`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalSummary {
    /// Exact AUC (NaN with one class only).
    pub auc: f64,
    /// Mean log loss.
    pub logloss: f64,
    /// Accuracy at threshold 0.5.
    pub accuracy: f64,
    /// Number of samples.
    pub samples: u64,
}

impl EvalSet {
    /// Computes AUC, log loss and accuracy.
    pub fn summary(&self) -> EvalSummary {
        EvalSummary {
            auc: auc(&self.probs, &self.labels).unwrap_or(f64::NAN),
            logloss: logloss(&self.probs, &self.labels),
            accuracy: accuracy(&self.probs, &self.labels),
            samples: self.probs.len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    proptest! {
        #[test]
        fn auc_matches_pair_counting(v in proptest::collection::vec((0u8..6, any::<bool>()), 0..60)) {
            let s: Vec<f32> = v.iter().map(|x| x.0 as f32 / 5.0).collect();
            let y: Vec<f32> = v.iter().map(|x| x.1 as u8 as f32).collect();
            match (auc(&s, &y), auc_pairs(&s, &y)) {
                (Some(a), Some(b)) => prop_assert!((a - b).abs() < 1e-12),
                (a, b) => prop_assert_eq!(a, b),
            }
        }
    }

    #[test]
    fn logloss_and_accuracy() {
        let p = [0.9f32, 0.2];
        let y = [1.0f32, 0.0];
        assert!((logloss(&p, &y) - (-(0.9f64.ln()) - 0.8f64.ln()) / 2.0).abs() < 1e-6);
        assert_eq!(accuracy(&p, &y), 1.0);
    }
}
