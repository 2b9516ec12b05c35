//! Evaluation during training: the held-out split's evaluation steps, and the
//! figures shared from worker 0, recorded and acted on (best model, early stop).

use super::{dead_letters_path, step_with, Context};
use crate::budget::{self, Split, Tally};
use crate::data::WorkerData;
use crate::evaluation::{self, Tracker, Verdict};
use crate::progress::Progress;
use crate::read_ahead::MicroBatches;
use crate::PipelineError;
use std::time::Instant;
use tiderec_operators::bad_record::BadRecordCounts;
use tiderec_operators::collective::Collective;
use tiderec_operators::metrics::EvalSummary;
use tiderec_operators::train::{StepKind, Trainer};
use tiderec_operators::Batch;
use tiderec_sinks::metrics::Evaluation;

/// One worker's evaluation state during training.
pub(super) struct Evals {
    pub(super) tracker: Tracker,
    /// Sends worker 0's figures to every worker (built when the run has an eval split).
    pub(super) share: Option<Collective<evaluation::Shared>>,
    /// Print every evaluation (a run with more than its final one).
    pub(super) verbose: bool,
    /// Evaluations run by this process (only the first writes dead letters).
    pub(super) runs: u64,
    /// This worker's malformed eval records (the latest evaluation's; each reads the same split).
    pub(super) bad: BadRecordCounts,
    /// Seconds spent evaluating during training (not counted as training time).
    pub(super) seconds: f64,
    /// Bytes exchanged by evaluation steps (not counted per training sample).
    pub(super) bytes: u64,
    /// The global byte count before the latest evaluation, until the next training step reports its own.
    pub(super) bytes_from: Option<u64>,
    /// This worker's index among the process's workers.
    pub(super) local: usize,
}

impl Evals {
    /// This worker's evaluation state, going on from a resumed run's `history`; it shares the
    /// figures when the run `has_eval` (builds the collective then).
    pub(super) fn new(
        worker: &mut timely::worker::Worker,
        ctx: &Context,
        has_eval: bool,
        history: &[Evaluation],
    ) -> Self {
        let s = &ctx.settings;
        Evals {
            tracker: Tracker::new(s.run.best_metric, s.run.early_stop, history),
            share: has_eval.then(|| Collective::new(worker)),
            verbose: s.run.epochs > 1 || s.run.eval_every.is_some() || s.run.early_stop.is_some(),
            runs: 0,
            bad: BadRecordCounts::default(),
            seconds: 0.0,
            bytes: 0,
            bytes_from: None,
            local: worker.index() - s.cluster.process * s.cluster.workers,
        }
    }
}

/// Evaluates the model after global step `step` (`epoch` epochs completed), shares the
/// figures, records them and keeps the model when it is the best so far (early stopping
/// without checkpoints). `None` when a stop signal cut the evaluation short. Collective.
#[allow(clippy::too_many_arguments)]
pub(super) fn evaluation_point(
    evals: &mut Evals,
    trainer: &mut Trainer,
    worker: &mut timely::worker::Worker,
    ctx: &Context,
    batch: &mut Batch,
    progress: &Progress,
    step: u64,
    epoch: u64,
) -> Result<Option<Verdict>, PipelineError> {
    let began = Instant::now();
    let outcome = evaluate(trainer, worker, ctx, batch, evals.runs == 0)?;
    evals.runs += 1;
    evals.seconds += began.elapsed().as_secs_f64();
    let Some((summary, bad, bytes_before)) = outcome else { return Ok(None) };
    evals.bad = bad;
    evals.bytes_from = Some(bytes_before);
    let share = evals.share.as_mut().expect("built when the run has an eval split");
    let e = evaluation::share(share, worker, summary, step, epoch);
    if let Some(live) = ctx.live.as_ref().filter(|_| worker.index() == 0) {
        live.set_window(Some(&e.summary()));
    }
    let verdict = evals.tracker.record(e.clone());
    if verdict.improved && ctx.settings.run.early_stop.is_some() && ctx.checkpoint.is_none() {
        ctx.best.keep(evals.local, trainer)?;
    }
    if worker.index() == 0 && evals.verbose {
        let line = evaluation::describe(&e, verdict, &evals.tracker);
        match progress {
            Progress::None => eprintln!("{line}"),
            _ => progress.println(&line),
        }
    }
    Ok(Some(verdict))
}

/// Runs the evaluation steps over the held-out split (its dead letters written when
/// `dead_letters`). Returns worker 0's summary (`None` on the others or without eval
/// samples), this worker's malformed eval records and the global byte count before the
/// first evaluation step; `None` when a stop signal cut it short. Collective.
fn evaluate(
    trainer: &mut Trainer,
    worker: &mut timely::worker::Worker,
    ctx: &Context,
    batch: &mut Batch,
    dead_letters: bool,
) -> Result<Option<(Option<EvalSummary>, BadRecordCounts, u64)>, PipelineError> {
    let s = &ctx.settings;
    let eval_spec = ctx.resolved.eval.as_ref().unwrap_or(&ctx.resolved.data);
    let sink = if dead_letters { super::dead_letters(ctx) } else { None };
    let (me, peers) = (worker.index(), worker.peers());
    let opened = MicroBatches::open(super::read_ahead(ctx, me), sink, ctx.new_batch(), me, |sink| {
        WorkerData::for_spec(
            eval_spec,
            ctx.generator.as_ref().map(|g| (g, ctx.eval_range.clone())),
            ctx.eval_span,
            &ctx.criteo,
            s.run.eval_batch_size,
            me,
            peers,
            sink,
        )
    });
    let mut eval_data = match opened {
        Ok(d) => d,
        Err(e) => {
            trainer.step_failed(worker);
            return Err(e);
        }
    };
    // Eval steps carry the eval reader's counts only, so their sum is the split's own.
    let mut tally = Tally::default();
    let mut bytes_before = None;
    loop {
        let stats = step_with(
            trainer,
            worker,
            StepKind::Eval,
            &mut eval_data,
            batch,
            &BadRecordCounts::default(),
            &ctx.resolved,
            s.hash_seed(),
            &ctx.stop,
        )?;
        bytes_before.get_or_insert(stats.bytes_sent);
        if stats.stop_requests > 0 {
            // A partial evaluation would report a misleading AUC.
            trainer.take_eval();
            return Ok(None);
        }
        tally.bad = stats.bad_records;
        if stats.samples == 0 {
            break;
        }
        tally.good += stats.samples;
    }
    let bad = eval_data.bad_counts();
    eval_data.flush()?;
    // Separate eval data must yield samples; a held-out part is only held to the budget.
    let input = match &s.data.eval {
        Some(e) => e.clone(),
        None => format!("{} (held-out part)", s.data.source),
    };
    if s.data.eval.is_some() || tally.good + tally.bad_total() > 0 {
        budget::check(Split::Eval, &input, tally, s.data.records.max_bad_fraction, &dead_letters_path(s))?;
    }
    let eval = trainer.take_eval();
    let summary = (!eval.probs.is_empty()).then(|| eval.summary());
    Ok(Some((summary, bad, bytes_before.unwrap_or(0))))
}
