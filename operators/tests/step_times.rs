//! The trainer's stage clock (`Trainer::step_times`): on every worker each stage a
//! training step runs takes time, the stages lie inside the steps' total, and a
//! reading taken between steps times the steps after it.

mod common;

use std::sync::{Arc, Mutex};
use tiderec_operators::train::{StepKind, StepTimes, Trainer};

#[test]
fn every_stage_of_a_step_is_timed_inside_the_steps_total() {
    for workers in [1, 2] {
        let config = common::config(common::dlrm());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let out = seen.clone();
        timely::execute(timely::Config::process(workers), move |worker| {
            let me = worker.index();
            let mut trainer = Trainer::new(worker, &config).unwrap();
            assert_eq!(trainer.step_times(), StepTimes::default(), "no step, no time");
            for step in 0..3 {
                trainer.step(worker, StepKind::Train, common::batch(me, step, 4)).unwrap();
            }
            let first = trainer.step_times();
            for step in 3..8 {
                trainer.step(worker, StepKind::Train, common::batch(me, step, 4)).unwrap();
            }
            let all = trainer.step_times();
            out.lock().unwrap().push((me, first, all));
        })
        .unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), workers);
        for (me, first, all) in seen.iter() {
            let stages = [all.plan, all.serve, all.forward_backward, all.apply, all.gather];
            assert!(stages.iter().all(|&s| s > 0.0), "worker {me} of {workers}: a stage not timed: {all:?}");
            assert_eq!(all.partial_backward, 0.0, "rows exchange: no partial stage: {all:?}");
            // Only the trainer steps these workers, so every stage ran inside a step.
            assert!(all.stages() <= all.total, "worker {me} of {workers}: stages outside the steps: {all:?}");
            assert_eq!(all.outside(), all.total - all.stages());
            let later = all.since(first);
            assert!(later.total > 0.0 && later.forward_backward > 0.0, "{later:?}");
            assert_eq!(later.total, all.total - first.total);
            assert!(first.total < all.total && first.forward_backward < all.forward_backward, "{first:?} {all:?}");
        }
    }
}
