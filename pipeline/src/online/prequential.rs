//! Prequential ("test-then-train") evaluation of a stream: every training
//! batch is scored by the model as it was before the batch's update, and the
//! evaluation metrics ([`EvalSummary`]: AUC, log loss, NE, calibration,
//! PR-AUC and, where the records name a user, GAUC) are reported over a
//! rolling window of the most recent predictions.
//!
//! Invariants: the window holds at most `capacity` predictions, the newest
//! ones, in arrival order, each with its label and its user's group key when
//! the records carry one; its metrics are those of exactly these predictions,
//! computed when asked for ([`EvalSet::summary`]), so they equal the batch
//! metrics of the same predictions. GAUC is reported only while every
//! prediction in the window has a group.

use std::collections::VecDeque;
use tiderec_operators::metrics::{EvalSet, EvalSummary};

/// One prediction: probability, label and the user's group key (if any).
type Prediction = (f32, f32, Option<u64>);

/// The metrics of the last `capacity` predictions.
#[derive(Clone, Debug)]
pub struct PrequentialWindow {
    capacity: usize,
    window: VecDeque<Prediction>,
    /// Predictions seen in total.
    pub seen: u64,
}

impl PrequentialWindow {
    /// An empty window of `capacity` predictions (at least 1).
    pub fn new(capacity: usize) -> Self {
        PrequentialWindow { capacity: capacity.max(1), window: VecDeque::new(), seen: 0 }
    }

    /// Adds the predictions of `set` (with their groups when it has one per prediction),
    /// dropping the oldest beyond the capacity.
    pub fn extend(&mut self, set: &EvalSet) {
        let grouped = set.groups.len() == set.probs.len();
        for (i, (&p, &y)) in set.probs.iter().zip(&set.labels).enumerate() {
            if self.window.len() == self.capacity {
                self.window.pop_front();
            }
            self.window.push_back((p, y, set.groups.get(i).copied().filter(|_| grouped)));
            self.seen += 1;
        }
    }

    /// Predictions in the window.
    pub fn len(&self) -> usize {
        self.window.len()
    }

    /// True before the first prediction.
    pub fn is_empty(&self) -> bool {
        self.window.is_empty()
    }

    /// The predictions of the window as one set (groups only when every one has a group).
    pub fn eval_set(&self) -> EvalSet {
        let probs = self.window.iter().map(|w| w.0).collect();
        let labels = self.window.iter().map(|w| w.1).collect();
        let groups = self.window.iter().map(|w| w.2).collect::<Option<Vec<u64>>>().unwrap_or_default();
        EvalSet { probs, labels, groups }
    }

    /// Every metric over the window (all `None` while it is empty).
    pub fn summary(&self) -> EvalSummary {
        self.eval_set().summary()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(probs: &[f32], labels: &[f32], groups: &[u64]) -> EvalSet {
        EvalSet { probs: probs.to_vec(), labels: labels.to_vec(), groups: groups.to_vec() }
    }

    #[test]
    fn equals_the_batch_metrics_of_the_last_predictions() {
        let n = 1000;
        let probs: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 + 0.0005).collect();
        let labels: Vec<f32> = (0..n).map(|i| ((i * 31 + i / 3) % 3 == 0) as u32 as f32).collect();
        let groups: Vec<u64> = (0..n).map(|i| (i % 17) as u64).collect();
        let mut w = PrequentialWindow::new(300);
        for chunk in (0..n).collect::<Vec<_>>().chunks(37) {
            let (a, b) = (chunk[0], chunk[chunk.len() - 1] + 1);
            w.extend(&set(&probs[a..b], &labels[a..b], &groups[a..b]));
        }
        assert_eq!(w.len(), 300);
        assert_eq!(w.seen, n as u64);
        let tail = n - 300;
        let want = set(&probs[tail..], &labels[tail..], &groups[tail..]).summary();
        assert_eq!(w.summary(), want);
        assert!(want.gauc.is_some() && want.pr_auc.is_some() && want.ne.is_some() && want.calibration.is_some());
    }

    #[test]
    fn gauc_needs_a_group_for_every_prediction_in_the_window() {
        let mut w = PrequentialWindow::new(4);
        w.extend(&set(&[0.2, 0.7], &[0.0, 1.0], &[]));
        w.extend(&set(&[0.3, 0.6], &[0.0, 1.0], &[5, 5]));
        assert!(w.summary().auc.is_some());
        assert_eq!(w.summary().gauc, None, "two predictions have no group");
        w.extend(&set(&[0.1, 0.9], &[0.0, 1.0], &[6, 6]));
        assert_eq!(w.summary().gauc, Some(1.0), "the ungrouped ones left the window");
    }

    #[test]
    fn empty_and_one_class() {
        let mut w = PrequentialWindow::new(10);
        assert!(w.is_empty());
        assert_eq!(w.summary(), EvalSummary::default());
        w.extend(&set(&[0.2, 0.7], &[1.0, 1.0], &[]));
        let s = w.summary();
        assert!(s.auc.is_none() && s.ne.is_none(), "one class");
        assert!(s.logloss.is_some() && s.calibration.is_some() && s.pr_auc.is_some());
    }
}
