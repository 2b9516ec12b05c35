//! Prequential ("test-then-train") evaluation of a stream: every training
//! batch is scored by the model as it was before the batch's update, and
//! AUC and log loss are reported over a rolling window of the most recent
//! predictions.
//!
//! Invariant: the window holds at most `capacity` `(prediction, label)`
//! pairs, the newest ones, in arrival order; its log loss is kept as a
//! running sum, its AUC is computed exactly (by sorting) when asked for.

use std::collections::VecDeque;
use tiderec_operators::metrics::auc;

/// Rolling AUC and log loss over the last `capacity` predictions.
#[derive(Clone, Debug)]
pub struct PrequentialWindow {
    capacity: usize,
    window: VecDeque<(f32, f32)>,
    loss_sum: f64,
    /// Predictions seen in total.
    pub seen: u64,
}

fn bce(p: f32, y: f32) -> f64 {
    let p = (p as f64).clamp(1e-7, 1.0 - 1e-7);
    -(y as f64 * p.ln() + (1.0 - y as f64) * (1.0 - p).ln())
}

impl PrequentialWindow {
    /// An empty window of `capacity` predictions (at least 1).
    pub fn new(capacity: usize) -> Self {
        PrequentialWindow { capacity: capacity.max(1), window: VecDeque::new(), loss_sum: 0.0, seen: 0 }
    }

    /// Adds predictions `probs` of `labels`, dropping the oldest beyond the capacity.
    pub fn extend(&mut self, probs: &[f32], labels: &[f32]) {
        for (&p, &y) in probs.iter().zip(labels) {
            if self.window.len() == self.capacity {
                if let Some((op, oy)) = self.window.pop_front() {
                    self.loss_sum -= bce(op, oy);
                }
            }
            self.window.push_back((p, y));
            self.loss_sum += bce(p, y);
            self.seen += 1;
        }
        // Re-sum now and then so cancellation errors do not accumulate.
        if self.seen % (16 * self.capacity as u64 + 1) < probs.len() as u64 {
            self.loss_sum = self.window.iter().map(|&(p, y)| bce(p, y)).sum();
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

    /// Mean log loss over the window (`None` when empty).
    pub fn logloss(&self) -> Option<f64> {
        (!self.window.is_empty()).then(|| self.loss_sum / self.window.len() as f64)
    }

    /// Exact AUC over the window (`None` when it holds one class only).
    pub fn auc(&self) -> Option<f64> {
        let (probs, labels): (Vec<f32>, Vec<f32>) = self.window.iter().copied().unzip();
        auc(&probs, &labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiderec_operators::metrics::logloss;

    #[test]
    fn equals_the_batch_metrics_of_the_last_predictions() {
        let n = 1000;
        let probs: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 + 0.0005).collect();
        let labels: Vec<f32> = (0..n).map(|i| ((i * 31 + i / 3) % 3 == 0) as u32 as f32).collect();
        let mut w = PrequentialWindow::new(300);
        for chunk in (0..n).collect::<Vec<_>>().chunks(37) {
            let (a, b) = (chunk[0], chunk[chunk.len() - 1] + 1);
            w.extend(&probs[a..b], &labels[a..b]);
        }
        assert_eq!(w.len(), 300);
        assert_eq!(w.seen, n as u64);
        let tail = n - 300;
        assert_eq!(w.auc(), auc(&probs[tail..], &labels[tail..]));
        let want = logloss(&probs[tail..], &labels[tail..]);
        assert!((w.logloss().unwrap() - want).abs() < 1e-6, "{:?} vs {want}", w.logloss());
    }

    #[test]
    fn empty_and_one_class() {
        let mut w = PrequentialWindow::new(10);
        assert!(w.is_empty() && w.logloss().is_none() && w.auc().is_none());
        w.extend(&[0.2, 0.7], &[1.0, 1.0]);
        assert!(w.auc().is_none());
        assert!(w.logloss().is_some());
    }
}
