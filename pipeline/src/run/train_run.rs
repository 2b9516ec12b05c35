//! One worker's training run: the epochs of training steps, the evaluations and
//! checkpoints between them, and the run summary at the end (see the parent
//! module for the collective order every worker keeps).

use super::eval_steps::{evaluation_point, Evals};
use super::{
    dead_letters_path, derived_bad, diverged, open_train_data, progress_display, restore, skip_to_position, step_with,
    training_progress, Context, Reports, LOSS_WINDOW,
};
use crate::budget::{self, Split, Tally};
use crate::checkpointing::{Checkpointer, Position};
use crate::evaluation::Verdict;
use crate::metrics_log::{MetricsLog, MetricsRecord};
use crate::progress::Progress;
use crate::read_ahead::MicroBatches;
use crate::settings::BestMetric;
use crate::PipelineError;
use std::collections::VecDeque;
use std::time::Instant;
use tiderec_operators::bad_record::{BadRecordCounts, ReasonCounts};
use tiderec_operators::store::StoreStats;
use tiderec_operators::train::{StepKind, StepStats, Trainer};
use tiderec_operators::Batch;
use tiderec_sinks::checkpoint::Manifest;
use tiderec_sinks::metrics::{Evaluation, RunSummary};

/// Where the epoch loop goes after a training step.
enum Flow {
    /// On to the next step of the epoch.
    Next,
    /// To the end of the epoch (no worker had data left).
    EndOfEpoch,
    /// Out of the epochs (an early stop or a stop signal).
    Stop,
}

/// One worker's training run: its trainer, its data, and the running state of the epochs.
pub(super) struct TrainRun<'a> {
    ctx: &'a Context,
    /// This worker's index.
    me: usize,
    trainer: Trainer,
    checkpointer: Checkpointer,
    /// The manifest of the checkpoint the run resumed from.
    resumed: Option<Manifest>,
    train_data: MicroBatches,
    progress: Progress,
    batch: Batch,
    /// The malformed records counted before the first step ([`derived_bad`]).
    derived_bad: BadRecordCounts,
    steps: u64,
    samples: u64,
    epochs: u64,
    loss_total: f64,
    reports: Reports,
    last_checkpoint: Option<Instant>,
    /// The last [`LOSS_WINDOW`] training steps' loss sums and samples.
    window: VecDeque<(f64, u64)>,
    steps_in_epoch: u64,
    bad_before_epoch: ReasonCounts,
    samples_at_start: u64,
    /// Samples trained on other data before this data (`--new-data`), which the
    /// bad-record budget leaves out.
    samples_before_data: u64,
    /// Malformed training records over all workers, as of the last training step.
    train_bad_global: ReasonCounts,
    dead_letters_file: std::path::PathBuf,
    /// The run evaluates during training (it has an eval split).
    has_eval: bool,
    evals: Evals,
    stopped_early: Option<u64>,
    bytes_at_end: u64,
    interrupted: bool,
    start: Instant,
}

impl<'a> TrainRun<'a> {
    /// Sets up this worker's run: its trainer and checkpointer, the restored checkpoint, the
    /// training data at the run's position, the progress display, the reports and the
    /// evaluations. Collective.
    pub(super) fn open(worker: &mut timely::worker::Worker, ctx: &'a Context) -> Result<Self, PipelineError> {
        let me = worker.index();
        let s = &ctx.settings;
        let devices = crate::device::Devices::for_workers(&s.cluster.device, s.cluster.workers)?;
        let mut trainer = devices.trainer(worker, &ctx.trainer, s.cluster.workers, s.model.precision)?;
        let mut checkpointer = Checkpointer::new(worker, ctx.checkpoint.clone(), &ctx.trainer, s.run.batch_size as u64);
        // Before anything else collective: every worker restores, then all agree on the step.
        let resumed = restore(worker, &mut trainer, &mut checkpointer, ctx)?.map(|c| c.manifest.clone());
        let mut train_data = open_train_data(worker, &mut trainer, ctx)?;
        let progress = progress_display(me, ctx);
        let mut batch = ctx.new_batch();
        let derived_bad = derived_bad(me, resumed.as_ref(), ctx);
        let (mut steps, mut samples, mut epochs, mut loss_total) = (0u64, 0u64, 0u64, 0.0f64);
        let reports = match me {
            0 => {
                // `--resume` appends even when there was no checkpoint to resume: the file
                // was let through as the log of the run it continues.
                let log = MetricsLog::for_run(&s.run, resumed.as_ref().map(|m| m.step), s.checkpoints.resume, false)?;
                Reports::new(log, ctx.live.clone())
            }
            _ => Reports::new(None, None),
        };
        let mut window: VecDeque<(f64, u64)> = VecDeque::with_capacity(LOSS_WINDOW);
        let mut steps_in_epoch = 0u64;
        let bad_before_epoch = derived_bad.to_array();
        if let Some(m) = &resumed {
            (steps, samples, epochs, loss_total) = (m.step, m.samples, m.data_position.epoch, m.progress.loss_total);
            let keep_from = m.progress.loss_window.len().saturating_sub(LOSS_WINDOW);
            window.extend(&m.progress.loss_window[keep_from..]);
            steps_in_epoch = m.data_position.global_steps_in_epoch;
            skip_to_position(worker, &mut trainer, &mut train_data, &mut batch, epochs, steps_in_epoch)?;
        }
        ctx.cluster.finished_step(steps);
        let dead_letters_file = dead_letters_path(s);
        // Evaluations during training (see `crate::evaluation`): every worker takes the same decisions.
        let has_eval = ctx.resolved.eval.is_some() || s.data.eval_fraction > 0.0;
        let history = resumed.as_ref().map_or(&[][..], |m| &m.progress.evaluations[..]);
        let evals = Evals::new(worker, ctx, has_eval, history);
        Ok(TrainRun {
            ctx,
            me,
            trainer,
            checkpointer,
            train_data,
            progress,
            batch,
            derived_bad,
            steps,
            samples,
            epochs,
            loss_total,
            reports,
            last_checkpoint: None,
            window,
            steps_in_epoch,
            bad_before_epoch,
            samples_at_start: samples,
            samples_before_data: samples_before_data(resumed.as_ref(), s.checkpoints.new_data),
            train_bad_global: ReasonCounts::default(),
            dead_letters_file,
            has_eval,
            stopped_early: evals.tracker.stopped().then_some(steps),
            evals,
            bytes_at_end: 0,
            interrupted: false,
            start: Instant::now(),
            resumed,
        })
    }

    /// The epochs: training steps with their checkpoints and evaluations, and the end of each
    /// epoch, until the last epoch, `--steps`, an early stop or a stop signal. Collective.
    pub(super) fn train(&mut self, worker: &mut timely::worker::Worker) -> Result<(), PipelineError> {
        let s = &self.ctx.settings;
        'epochs: while self.epochs < s.run.epochs && self.stopped_early.is_none() {
            loop {
                if s.run.steps.is_some_and(|max| self.steps >= max) {
                    break 'epochs;
                }
                match self.step(worker)? {
                    Flow::Next => {}
                    Flow::EndOfEpoch => break,
                    Flow::Stop => break 'epochs,
                }
            }
            self.end_epoch(worker)?;
            if self.interrupted || self.stopped_early.is_some() {
                break;
            }
        }
        Ok(())
    }

    /// One training step and what follows it: its counts, its reports, the checkpoints, and
    /// an evaluation when one is due. Collective.
    fn step(&mut self, worker: &mut timely::worker::Worker) -> Result<Flow, PipelineError> {
        let Some(stats) = self.train_step(worker)? else { return Ok(Flow::EndOfEpoch) };
        self.count(&stats);
        if self.me == 0 {
            self.report_step(&stats)?;
        }
        self.poll_checkpoints(worker)?;
        let s = &self.ctx.settings;
        let mut verdict = Verdict { improved: false, stop: false };
        if self.has_eval && !self.interrupted && s.run.eval_every.is_some_and(|n| self.steps.is_multiple_of(n)) {
            verdict = self.evaluation(worker)?;
        }
        // An improvement is checkpointed at once (replacing a checkpoint of this step
        // written before the evaluation), so `DIR/best` can name it.
        if self.checkpointer.due_every(self.steps) || (verdict.improved && self.checkpointer.enabled()) {
            self.checkpoint(worker)?;
        }
        if verdict.stop {
            self.stopped_early = Some(self.steps);
            return Ok(Flow::Stop);
        }
        if self.interrupted {
            return Ok(Flow::Stop);
        }
        Ok(Flow::Next)
    }

    /// Runs a training step on this worker's next micro-batch and takes in the step's global
    /// figures: `None` when no worker had data left (the end of the epoch), an error when the
    /// step diverged. Collective.
    fn train_step(&mut self, worker: &mut timely::worker::Worker) -> Result<Option<StepStats>, PipelineError> {
        let ctx = self.ctx;
        let stats = step_with(
            &mut self.trainer,
            worker,
            StepKind::Train,
            &mut self.train_data,
            &mut self.batch,
            &self.derived_bad,
            &ctx.resolved,
            ctx.settings.hash_seed(),
            &ctx.stop,
        )?;
        self.train_bad_global = stats.bad_records;
        if stats.non_finite > 0 {
            return Err(diverged(worker, &mut self.checkpointer, self.steps + 1, &stats));
        }
        self.interrupted |= stats.stop_requests > 0;
        if let Some(from) = self.evals.bytes_from.take() {
            self.evals.bytes += stats.bytes_sent.saturating_sub(from);
        }
        if stats.samples == 0 {
            // Every worker's counts after the whole epoch (the empty step read to its end).
            self.bad_before_epoch = stats.bad_records;
            return Ok(None);
        }
        Ok(Some(stats))
    }

    /// Counts a training step in: the step, its samples, its loss and the bytes sent.
    fn count(&mut self, stats: &StepStats) {
        self.steps += 1;
        self.steps_in_epoch += 1;
        self.ctx.cluster.finished_step(self.steps);
        self.samples += stats.samples;
        self.loss_total += stats.loss_sum;
        self.bytes_at_end = stats.bytes_sent - self.evals.bytes;
        if self.window.len() == LOSS_WINDOW {
            self.window.pop_front();
        }
        self.window.push_back((stats.loss_sum, stats.samples));
    }

    /// Worker 0's progress display and reports of a training step.
    fn report_step(&mut self, stats: &StepStats) -> Result<(), PipelineError> {
        let (l, n) = self.window.iter().fold((0.0, 0u64), |a, b| (a.0 + b.0, a.1 + b.1));
        let trained = self.samples - self.samples_at_start;
        let rate = trained as f64 / (self.start.elapsed().as_secs_f64() - self.evals.seconds);
        self.progress.update(
            self.steps,
            self.samples,
            l / n.max(1) as f64,
            rate,
            stats.bytes_sent as f64 / trained.max(1) as f64,
            stats.bad_records.iter().sum(),
        );
        if !self.reports.is_empty() {
            let last = self.evals.tracker.last();
            let mut record = MetricsRecord {
                time_s: self.start.elapsed().as_secs_f64(),
                step: self.steps,
                samples: self.samples,
                samples_per_sec: rate,
                loss: l / n.max(1) as f64,
                lag: 0,
                checkpoint_age_s: self.last_checkpoint.map(|t| t.elapsed().as_secs_f64()),
                bad_records: stats.bad_records.iter().sum(),
                epoch: Some(self.epochs),
                evaluated_step: last.map(|e| e.step),
                best_step: self.evals.tracker.best().map(|e| e.step),
                ..Default::default()
            };
            record.set_window(last.map(Evaluation::summary).as_ref());
            self.reports.step(record, stats.samples, last.map(|e| e.step))?;
        }
        Ok(())
    }

    /// Lets the checkpoint in flight go on; worker 0 notes one that became durable.
    fn poll_checkpoints(&mut self, worker: &mut timely::worker::Worker) -> Result<(), PipelineError> {
        self.checkpointer.poll(worker)?;
        if self.checkpointer.take_durable().is_some() && self.me == 0 {
            self.last_checkpoint = Some(Instant::now());
            if let Some(live) = &self.ctx.live {
                live.checkpointed();
            }
        }
        Ok(())
    }

    /// Evaluates the model after the current step ([`evaluation_point`]); an evaluation cut
    /// short by a stop signal marks the run interrupted and gives the verdict of no change.
    /// Collective.
    fn evaluation(&mut self, worker: &mut timely::worker::Worker) -> Result<Verdict, PipelineError> {
        let (ctx, progress) = (self.ctx, &self.progress);
        match evaluation_point(
            &mut self.evals,
            &mut self.trainer,
            worker,
            ctx,
            &mut self.batch,
            progress,
            self.steps,
            self.epochs,
        )? {
            Some(v) => Ok(v),
            None => {
                self.interrupted = true;
                Ok(Verdict { improved: false, stop: false })
            }
        }
    }

    /// Writes a checkpoint of the run's current position. Collective.
    fn checkpoint(&mut self, worker: &mut timely::worker::Worker) -> Result<(), PipelineError> {
        let at = Position {
            step: self.steps,
            epoch: self.epochs,
            steps_in_epoch: self.steps_in_epoch,
            samples: self.samples,
            progress: training_progress(
                self.loss_total,
                &self.window,
                &self.bad_before_epoch,
                &self.evals.tracker,
                self.samples_before_data,
            ),
            ..Default::default()
        };
        self.checkpointer.write(worker, &self.trainer, &at)
    }

    /// Holds the training input to the bad-record budget as of the last training step (not
    /// with `--steps 0`).
    fn check_train(&self) -> Result<(), PipelineError> {
        let s = &self.ctx.settings;
        match s.run.steps {
            Some(0) => Ok(()),
            _ => budget::check(
                Split::Train,
                &s.data.source,
                // Samples derived up front are held to the budget by the records they came from.
                Tally {
                    good: self.ctx.derived_records.unwrap_or(self.samples - self.samples_before_data),
                    bad: self.train_bad_global,
                },
                s.data.records.max_bad_fraction,
                &self.dead_letters_file,
            ),
        }
    }

    /// The end of an epoch: the bad-record check, the rewind of the data, the epoch's
    /// evaluation (unless one of this step exists) and its checkpoint. Collective.
    fn end_epoch(&mut self, worker: &mut timely::worker::Worker) -> Result<(), PipelineError> {
        // Before the epoch's checkpoint: a mostly malformed input stops the run here.
        self.check_train()?;
        self.epochs += 1;
        self.steps_in_epoch = 0;
        if let Err(e) = self.train_data.rewind() {
            // Its reading thread is gone: the other workers stop with this one.
            self.trainer.step_failed(worker);
            return Err(e);
        }
        let mut verdict = Verdict { improved: false, stop: false };
        if self.has_eval && !self.interrupted && self.evals.tracker.last().map(|e| e.step) != Some(self.steps) {
            verdict = self.evaluation(worker)?;
        }
        if self.checkpointer.due_at_boundary(self.steps) || (verdict.improved && self.checkpointer.enabled()) {
            self.checkpoint(worker)?;
        }
        if verdict.stop {
            self.stopped_early = Some(self.steps);
        }
        Ok(())
    }

    /// The end of training: the bad-record check, the run's last evaluation, its last report
    /// and checkpoint, and the wait for the checkpoints in flight. Collective.
    pub(super) fn end_of_run(&mut self, worker: &mut timely::worker::Worker) -> Result<(), PipelineError> {
        self.check_train()?;
        // The end of the run (`--steps`, mid-epoch): its evaluation, unless one of this step exists.
        let mut improved = false;
        if self.has_eval
            && !self.interrupted
            && self.stopped_early.is_none()
            && self.evals.tracker.last().map(|e| e.step) != Some(self.steps)
        {
            let verdict = self.evaluation(worker)?;
            if verdict.stop {
                self.stopped_early = Some(self.steps);
            }
            improved = verdict.improved;
        }
        self.reports.finish(self.evals.tracker.last(), self.evals.tracker.best().map(|e| e.step))?;
        // The end of the run is a checkpoint too, unless one of this step exists; an improving
        // last evaluation is checkpointed even then (replacing the step's checkpoint written
        // before it), so `DIR/best` names the summary's best step. An early stop goes back to
        // the best step's model instead, whose checkpoint `DIR/best` names.
        if self.stopped_early.is_none()
            && (self.checkpointer.due_at_boundary(self.steps) || (improved && self.checkpointer.enabled()))
        {
            self.checkpoint(worker)?;
        }
        self.checkpointer.finish(worker)
    }

    /// After an early stop: goes back to the best step's model, which worker 0 names.
    pub(super) fn restore_best(&mut self) -> Result<(), PipelineError> {
        let Some(at) = self.stopped_early else { return Ok(()) };
        let (ctx, s) = (self.ctx, &self.ctx.settings);
        let dir = ctx.checkpoint.as_ref().map(|c| c.dir.as_path());
        ctx.best.restore(&mut self.trainer, dir)?;
        if self.me == 0 {
            let best = self.evals.tracker.best();
            eprintln!(
                "early stopping: {} evaluations without improvement; stopped after step {at}; the model is that of \
                 step {} (epoch {}, {} {}){}",
                self.evals.tracker.since_best(),
                best.map_or(0, |b| b.step),
                best.map_or(0, |b| b.epoch),
                s.run.best_metric,
                best.and_then(|b| if s.run.best_metric == BestMetric::Auc { b.auc } else { b.logloss })
                    .map_or("n/a".into(), |v| format!("{v:.4}")),
                dir.map_or(String::new(), |d| format!(", checkpoint {}", d.join("best").display())),
            );
        }
        Ok(())
    }
    /// Seconds spent training so far, evaluations not counted.
    pub(super) fn train_seconds(&self) -> f64 {
        self.start.elapsed().as_secs_f64() - self.evals.seconds
    }

    /// Ends the progress display.
    pub(super) fn finish_progress(&self) {
        self.progress.finish();
    }

    /// The run's report step, which sums every worker's malformed records and parameters;
    /// worker 0 returns the run's summary. Collective.
    pub(super) fn report(
        mut self,
        worker: &mut timely::worker::Worker,
        train_seconds: f64,
    ) -> Result<Option<RunSummary>, PipelineError> {
        let ctx = self.ctx;
        let mut train_bad = self.train_data.bad_counts();
        train_bad.merge(&self.derived_bad);
        self.train_data.flush()?;
        let mut all_bad = train_bad;
        all_bad.merge(&self.evals.bad);
        self.trainer.set_bad_records(all_bad.to_array());
        let m = &ctx.trainer.model;
        let report = self.trainer.step(
            worker,
            StepKind::Report,
            Batch::with_sequences(m.num_dense(), m.num_sparse(), m.num_sequences()),
        )?;
        ctx.store_stats.lock().unwrap_or_else(|e| e.into_inner()).add(&self.trainer.store_stats());
        if self.me != 0 {
            return Ok(None);
        }
        Ok(Some(self.summary(&report, worker.peers(), train_seconds)))
    }

    /// Worker 0's summary of the run, with the figures of the report step (`report`).
    fn summary(&self, report: &StepStats, workers: usize, train_seconds: f64) -> RunSummary {
        let tracker = &self.evals.tracker;
        let (steps, samples) = (self.steps, self.samples);
        // The final figures: the best evaluation's after an early stop, else the evaluation of
        // the last step (none when a signal cut the run short).
        let last = tracker.last().filter(|e| e.step == steps && !self.interrupted);
        let last = if self.stopped_early.is_some() { tracker.best() } else { last };
        let has_eval_samples = last.is_some_and(|e| e.samples > 0);
        let final_eval = last.filter(|_| has_eval_samples);
        let (l, n) = self.window.iter().fold((0.0, 0u64), |a, b| (a.0 + b.0, a.1 + b.1));
        let bad = BadRecordCounts::from_array(report.bad_records);
        let checkpointer = &self.checkpointer;
        RunSummary {
            auc: final_eval.map(|e| e.auc.unwrap_or(f64::NAN)),
            logloss: final_eval.and_then(|e| e.logloss),
            accuracy: final_eval.and_then(|e| e.accuracy),
            ne: final_eval.and_then(|e| e.ne),
            calibration: final_eval.and_then(|e| e.calibration),
            pr_auc: final_eval.and_then(|e| e.pr_auc),
            gauc: final_eval.and_then(|e| e.gauc),
            train_loss: l / n.max(1) as f64,
            train_loss_mean: self.loss_total / samples.max(1) as f64,
            samples,
            steps,
            samples_per_sec: (samples - self.samples_at_start) as f64 / train_seconds.max(1e-9),
            workers,
            bad_records: bad.total(),
            bad_records_by_reason: bad.by_reason,
            params_l2: report.sum_squares.sqrt(),
            teacher_auc: None,
            bytes_per_sample: self.bytes_at_end as f64 / (samples - self.samples_at_start).max(1) as f64,
            eval_samples: final_eval.map_or(0, |e| e.samples),
            epochs: self.epochs,
            train_seconds,
            dense_params: self.trainer.num_dense_params() as u64,
            embedding_rows: self.ctx.resolved.table_sizes.iter().sum(),
            checkpoints_written: checkpointer.written,
            checkpoint_seconds: checkpointer.seconds,
            checkpoint_write_seconds: checkpointer.write_seconds,
            checkpoint_overlap_steps: checkpointer.overlap_steps,
            resumed_from_step: self.resumed.as_ref().map(|m| m.step),
            interrupted_at_step: self.interrupted.then_some(steps),
            store: StoreStats::default(),
            config: serde_json::Value::Null,
            evaluations: tracker.history().to_vec(),
            best_step: tracker.best().map(|b| b.step),
            early_stopped_at_step: self.stopped_early,
        }
    }
}

/// The samples a run resuming `resumed` trained on other data before its data: all of
/// them under `--new-data`, else those its checkpoint recorded.
fn samples_before_data(resumed: Option<&Manifest>, new_data: bool) -> u64 {
    match resumed {
        None => 0,
        Some(m) if new_data => m.samples,
        Some(m) => m.progress.samples_before_data.min(m.samples),
    }
}
