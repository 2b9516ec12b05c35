//! Learning-rate schedules: a warm-up followed by a decay, as a factor on an
//! optimizer's base learning rate.
//!
//! The factor of the update with index `s` (0 for the first training step,
//! counted over the whole run, restored from checkpoints) is
//! `warmup(s) × decay(s)`:
//! * `warmup(s) = (s + 1) / W` while `s < W`, else 1 (`W` = `warmup` steps; none when 0);
//! * with `a = s − W` the steps since the warm-up ended (0 during it) and
//!   `H` the decay's horizon in steps (counted from the first step, warm-up included):
//!   * `none`: 1;
//!   * `linear`: `1 − p` with `p = min(a / (H − W), 1)`, so the factor reaches 0 at step `H`;
//!   * `cosine`: `(1 + cos(π p)) / 2`, the same `p`;
//!   * `step`: `rate^⌊a / every⌋`.
//!
//! Invariants:
//! * The factor is a pure function of the schedule and the step, computed in
//!   f64 and rounded once to f32, so every worker, every worker count and a
//!   resumed run use the same learning rate at the same step.
//! * The default schedule (no warm-up, no decay) is the constant 1, and an
//!   optimizer with it uses its learning rate unchanged.
//! * Factors lie in `[0, 1]` (a `step` rate is at most 1).

use serde::{Deserialize, Serialize};
use tiderec_records::OperatorError;

/// How the learning rate decays after the warm-up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum LrDecay {
    /// Constant.
    #[default]
    None,
    /// Linearly to 0 at step `horizon`.
    Linear {
        /// Step at which the factor reaches 0 (warm-up included).
        horizon: u64,
    },
    /// Half a cosine period down to 0 at step `horizon`.
    Cosine {
        /// Step at which the factor reaches 0 (warm-up included).
        horizon: u64,
    },
    /// Multiplied by `rate` every `every` steps after the warm-up.
    Step {
        /// Steps between two decays.
        every: u64,
        /// Factor of each decay, in (0, 1].
        rate: f32,
    },
}

impl LrDecay {
    /// Whether the factor reaches 0 (at the horizon): `linear` and `cosine`.
    pub fn reaches_zero(&self) -> bool {
        matches!(self, LrDecay::Linear { .. } | LrDecay::Cosine { .. })
    }

    /// The decay's name, as a configuration writes its `kind`.
    pub fn name(&self) -> &'static str {
        match self {
            LrDecay::None => "none",
            LrDecay::Linear { .. } => "linear",
            LrDecay::Cosine { .. } => "cosine",
            LrDecay::Step { .. } => "step",
        }
    }
}

/// A warm-up and a decay (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// Steps of linear warm-up from `1/warmup` to 1 (0: none).
    #[serde(default)]
    pub warmup: u64,
    /// The decay after the warm-up.
    #[serde(default)]
    pub decay: LrDecay,
}

impl LrSchedule {
    /// True for the constant schedule (the default).
    pub fn is_constant(&self) -> bool {
        self.warmup == 0 && self.decay == LrDecay::None
    }

    /// Checks the schedule; errors name the key.
    pub fn validate(&self) -> Result<(), OperatorError> {
        match self.decay {
            LrDecay::None => {}
            LrDecay::Linear { horizon } | LrDecay::Cosine { horizon } => {
                if horizon <= self.warmup {
                    return Err(OperatorError::config(
                        "lr_decay_steps",
                        format!(
                            "the decay's horizon ({horizon} steps) must be longer than the warm-up ({} steps)",
                            self.warmup
                        ),
                    ));
                }
            }
            LrDecay::Step { every, rate } => {
                if every == 0 {
                    return Err(OperatorError::config("lr_decay_steps", "a step decay needs a positive interval"));
                }
                if !(rate.is_finite() && rate > 0.0 && rate <= 1.0) {
                    return Err(OperatorError::config("lr_decay_rate", format!("must be in (0, 1], got {rate}")));
                }
            }
        }
        Ok(())
    }

    /// The factor on the base learning rate of the update with index `step` (0-based).
    pub fn factor(&self, step: u64) -> f32 {
        if self.is_constant() {
            return 1.0;
        }
        let warm = if step < self.warmup { (step + 1) as f64 / self.warmup as f64 } else { 1.0 };
        let after = step.saturating_sub(self.warmup);
        let progress = |horizon: u64| (after as f64 / (horizon - self.warmup) as f64).min(1.0);
        let decay = match self.decay {
            LrDecay::None => 1.0,
            LrDecay::Linear { horizon } => 1.0 - progress(horizon),
            LrDecay::Cosine { horizon } => 0.5 * (1.0 + (std::f64::consts::PI * progress(horizon)).cos()),
            LrDecay::Step { every, rate } => (rate as f64).powf((after / every) as f64),
        };
        (warm * decay) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f32, b: f64) -> bool {
        (a as f64 - b).abs() < 1e-6
    }

    #[test]
    fn the_default_is_the_constant_one() {
        let s = LrSchedule::default();
        assert!(s.is_constant());
        assert!((0..1000).all(|t| s.factor(t) == 1.0));
    }

    #[test]
    fn warmup_rises_linearly_then_holds() {
        let s = LrSchedule { warmup: 4, decay: LrDecay::None };
        let f: Vec<f32> = (0..6).map(|t| s.factor(t)).collect();
        assert_eq!(f, vec![0.25, 0.5, 0.75, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn linear_and_cosine_reach_zero_at_the_horizon() {
        let lin = LrSchedule { warmup: 10, decay: LrDecay::Linear { horizon: 110 } };
        assert!(close(lin.factor(9), 1.0));
        assert!(close(lin.factor(10), 1.0));
        assert!(close(lin.factor(35), 0.75));
        assert!(close(lin.factor(60), 0.5));
        assert_eq!(lin.factor(110), 0.0);
        assert_eq!(lin.factor(500), 0.0, "stays at zero after the horizon");
        let cos = LrSchedule { warmup: 0, decay: LrDecay::Cosine { horizon: 100 } };
        assert!(close(cos.factor(0), 1.0));
        assert!(close(cos.factor(50), 0.5));
        assert!(close(cos.factor(25), 0.5 * (1.0 + std::f64::consts::FRAC_1_SQRT_2)));
        assert!(cos.factor(100).abs() < 1e-7);
        // Monotone non-increasing after the warm-up.
        for s in [lin, cos] {
            let f: Vec<f32> = (10..120).map(|t| s.factor(t)).collect();
            assert!(f.windows(2).all(|w| w[1] <= w[0]), "{s:?}");
        }
    }

    #[test]
    fn step_decay_multiplies_every_interval() {
        let s = LrSchedule { warmup: 2, decay: LrDecay::Step { every: 3, rate: 0.5 } };
        let f: Vec<f32> = (0..11).map(|t| s.factor(t)).collect();
        assert_eq!(f, vec![0.5, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25]);
    }

    #[test]
    fn bad_schedules_are_refused_naming_the_key() {
        let e = LrSchedule { warmup: 10, decay: LrDecay::Linear { horizon: 10 } }.validate().unwrap_err();
        assert!(e.to_string().contains("lr_decay_steps"), "{e}");
        let e = LrSchedule { warmup: 0, decay: LrDecay::Step { every: 5, rate: 1.5 } }.validate().unwrap_err();
        assert!(e.to_string().contains("lr_decay_rate"), "{e}");
        let e = LrSchedule { warmup: 0, decay: LrDecay::Step { every: 0, rate: 0.5 } }.validate().unwrap_err();
        assert!(e.to_string().contains("lr_decay_steps"), "{e}");
        assert!(LrSchedule { warmup: 3, decay: LrDecay::Cosine { horizon: 4 } }.validate().is_ok());
    }

    #[test]
    fn the_schedule_round_trips_through_json() {
        let s = LrSchedule { warmup: 3, decay: LrDecay::Step { every: 7, rate: 0.5 } };
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<LrSchedule>(&text).unwrap(), s);
    }
}
