//! Training hygiene settings: the learning-rate schedule, L2 penalties, FTRL's
//! strengths, and when to evaluate and stop (`eval_every`, `early_stop`,
//! `best_metric`). This module checks them and turns them into the trainer's
//! hyper-parameters; [`crate::evaluation`] runs the evaluations.
//!
//! Invariants:
//! * Every default leaves the trainer configuration as it was without these
//!   settings: a constant schedule, no penalty, FTRL's former defaults.
//! * The schedule is the same for the dense and the sparse optimizers and is
//!   part of their hyper-parameters, so it is recorded in (and checked against)
//!   checkpoint manifests, and a resumed run continues it at its step.

pub use crate::settings::BestMetric;
use crate::settings::DecayKind;
use crate::{PipelineError, TrainSettings};
use tiderec_operators::optim::SparseOptimizerKind;
use tiderec_operators::schedule::{LrDecay, LrSchedule};
use tiderec_operators::train::TrainerConfig;

/// Checks the hygiene settings of `s` against each other (each one's range is checked by
/// [`TrainSettings::check_ranges`]); errors name the key.
pub fn validate(s: &TrainSettings) -> Result<(), PipelineError> {
    let horizon = matches!(s.optimizer.lr_decay, DecayKind::Linear | DecayKind::Cosine);
    if let Some(h) = s.optimizer.lr_decay_steps.filter(|&h| horizon && h <= s.optimizer.lr_warmup) {
        return Err(PipelineError::config(
            "lr_decay_steps",
            format!(
                "the decay's horizon ({h} steps) must be longer than the warm-up ({} steps)",
                s.optimizer.lr_warmup
            ),
        ));
    }
    if s.optimizer.lr_decay == DecayKind::Step && s.optimizer.lr_decay_steps.is_none() {
        return Err(PipelineError::config("lr_decay_steps", "`step` decay needs the interval: --lr-decay-steps N"));
    }
    let ftrl_set = s.optimizer.ftrl_l1 != 0.0 || s.optimizer.ftrl_l2 != 0.0 || s.optimizer.ftrl_beta != 1.0;
    let sparse = s.optimizer.sparse;
    if ftrl_set && !matches!(sparse, SparseOptimizerKind::Ftrl | SparseOptimizerKind::FtrlAdagrad) {
        return Err(PipelineError::config(
            "ftrl_l1",
            format!(
                "ftrl_l1, ftrl_l2 and ftrl_beta apply to the ftrl and ftrl-adagrad sparse optimizers, not {}",
                s.optimizer.sparse
            ),
        ));
    }
    let to_zero = matches!(s.optimizer.lr_decay, DecayKind::Linear | DecayKind::Cosine);
    if let Some(why) = sparse.refuses_decay_to_zero(&s.optimizer.lr_decay.to_string()).filter(|_| to_zero) {
        return Err(PipelineError::config("lr_decay", why));
    }
    let has_eval = s.data.eval.is_some() || s.data.eval_fraction > 0.0;
    for (key, set) in [("early_stop", s.run.early_stop.is_some()), ("eval_every", s.run.eval_every.is_some())] {
        if set && !has_eval {
            return Err(PipelineError::config(
                key,
                "needs an evaluation split: --eval FILES or --eval-fraction F (greater than 0)",
            ));
        }
    }
    if s.run.early_stop.is_some() && s.cluster.processes > 1 && s.checkpoints.checkpoint_dir.is_none() {
        return Err(PipelineError::config(
            "early_stop",
            "a multi-process run restores its best model from a checkpoint: add --checkpoint-dir",
        ));
    }
    Ok(())
}

/// The learning-rate schedule of `s`; `run_steps` is the run's length in
/// training steps when it is known up front (generated data, Parquet, `--steps`),
/// the default horizon of a `linear` or `cosine` decay.
pub fn lr_schedule(s: &TrainSettings, run_steps: Option<u64>) -> Result<LrSchedule, PipelineError> {
    let horizon = || {
        s.optimizer.lr_decay_steps.or(run_steps).ok_or_else(|| {
            PipelineError::config(
                "lr_decay_steps",
                format!(
                    "`{}` decay needs its horizon: the run's length is not known before reading {} (pass \
                     --lr-decay-steps N, or --steps N)",
                    s.optimizer.lr_decay, s.data.source
                ),
            )
        })
    };
    let decay = match s.optimizer.lr_decay {
        DecayKind::None => LrDecay::None,
        DecayKind::Linear => LrDecay::Linear { horizon: horizon()? },
        DecayKind::Cosine => LrDecay::Cosine { horizon: horizon()? },
        DecayKind::Step => {
            LrDecay::Step { every: s.optimizer.lr_decay_steps.unwrap_or(0), rate: s.optimizer.lr_decay_rate }
        }
    };
    let schedule = LrSchedule { warmup: s.optimizer.lr_warmup, decay };
    schedule.validate()?;
    Ok(schedule)
}

/// Sets the penalties and FTRL's strengths of `s` on `config`'s hyper-parameters.
pub fn apply_penalties(s: &TrainSettings, config: &mut TrainerConfig) {
    config.dense_hp.l2_penalty = s.optimizer.l2_dense;
    config.sparse_hp.l2_penalty = s.optimizer.l2_embedding;
    config.sparse_hp.l1 = s.optimizer.ftrl_l1;
    config.sparse_hp.l2 = s.optimizer.ftrl_l2;
    config.sparse_hp.ftrl_beta = s.optimizer.ftrl_beta;
}

/// Sets `schedule` on both optimizers of `config`.
pub fn apply_schedule(schedule: LrSchedule, config: &mut TrainerConfig) {
    config.dense_hp.schedule = schedule;
    config.sparse_hp.schedule = schedule;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(edit: impl FnOnce(&mut TrainSettings), key: &str) {
        let mut s = TrainSettings::default();
        edit(&mut s);
        let e = s.validate().expect_err(key).to_string();
        assert!(e.contains(key), "{key}: {e}");
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        assert!(validate(&TrainSettings::default()).is_ok());
        refused(|s| s.optimizer.l2_dense = -0.1, "l2_dense");
        refused(|s| s.optimizer.l2_embedding = f32::NAN, "l2_embedding");
        refused(|s| s.optimizer.ftrl_l1 = -1.0, "ftrl_l1");
        refused(|s| s.run.early_stop = Some(0), "early_stop");
        refused(|s| s.run.eval_every = Some(0), "eval_every");
        refused(
            |s| {
                s.optimizer.lr_decay = DecayKind::Step;
                s.optimizer.lr_decay_steps = Some(10);
                s.optimizer.lr_decay_rate = 2.0;
            },
            "lr_decay_rate",
        );
        refused(|s| s.optimizer.lr_decay = DecayKind::Step, "lr_decay_steps");
        refused(|s| s.optimizer.ftrl_l2 = 1.0, "ftrl");
        for sparse in [SparseOptimizerKind::Ftrl, SparseOptimizerKind::FtrlAdagrad] {
            for decay in [DecayKind::Linear, DecayKind::Cosine] {
                refused(
                    |s| {
                        s.optimizer.sparse = sparse;
                        s.optimizer.lr_decay = decay;
                        s.optimizer.lr_decay_steps = Some(100);
                    },
                    "lr_decay",
                );
            }
            let mut warm = TrainSettings::default();
            (warm.optimizer.sparse, warm.optimizer.lr_warmup) = (sparse, 10);
            assert!(validate(&warm).is_ok(), "a warm-up never reaches 0");
        }
        refused(
            |s| {
                s.data.eval_fraction = 0.0;
                s.run.early_stop = Some(2);
            },
            "early_stop",
        );
        let mut ok = {
            let mut s = TrainSettings::default();
            s.optimizer.sparse = SparseOptimizerKind::Ftrl;
            s.optimizer.ftrl_l1 = 1.0;
            s
        };
        assert!(validate(&ok).is_ok());
        ok.run.early_stop = Some(3);
        assert!(validate(&ok).is_ok());
    }

    #[test]
    fn the_schedule_takes_the_run_length_unless_given() {
        let s = {
            let mut s = TrainSettings::default();
            s.optimizer.lr_decay = DecayKind::Cosine;
            s.optimizer.lr_warmup = 5;
            s
        };
        assert_eq!(lr_schedule(&s, Some(100)).unwrap().decay, LrDecay::Cosine { horizon: 100 });
        let e = lr_schedule(&s, None).unwrap_err().to_string();
        assert!(e.contains("lr_decay_steps"), "{e}");
        let given = {
            let mut s = s.clone();
            s.optimizer.lr_decay_steps = Some(40);
            s
        };
        assert_eq!(lr_schedule(&given, Some(100)).unwrap().decay, LrDecay::Cosine { horizon: 40 });
        let short = {
            let mut s = s;
            s.optimizer.lr_decay_steps = Some(5);
            s
        };
        assert!(lr_schedule(&short, None).unwrap_err().to_string().contains("lr_decay_steps"));
        assert!(lr_schedule(&TrainSettings::default(), None).unwrap().is_constant());
    }
}
