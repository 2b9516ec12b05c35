//! The bounded fuzzing run of the test command: every target, seeded from
//! the data samples, for a fixed time and number of executions. A crash
//! fails the test naming the target and the file holding the input.

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::time::Duration;
use tiderec_fuzz::seeds::{default_data_dir, needs_data, seeds};
use tiderec_fuzz::{crash_dir, run, target, Budget};

/// Seconds per target (two test threads share two cores).
const SECONDS: f64 = 3.0;
/// Executions per target at most.
const EXECS: u64 = 20_000;
/// The mutation seed: the sequence of inputs is the same on every run.
const RNG_SEED: u64 = 0x0074_6964_6572_6563;

fn fuzz(name: &str) {
    let data = default_data_dir();
    if needs_data(name) && skip::existing(data.clone()).is_none() {
        return;
    }
    let corpus = seeds(name, &data).unwrap_or_else(|e| panic!("{name}: seeds: {e}"));
    assert!(!corpus.is_empty(), "{name}: no seeds");
    let t = target(name).expect("a target");
    let budget =
        Budget { max_execs: EXECS, max_time: Duration::from_secs_f64(SECONDS), hang_after: Duration::from_secs(20) };
    let report = run(name, t.run, corpus, budget, RNG_SEED, &crash_dir());
    eprintln!("{name}: {} seeds, {} execs in {:.1} s", report.seeds, report.execs, report.elapsed.as_secs_f64());
    if let Some(c) = report.crash {
        panic!("fuzz target {name} crashed on the input in {}: {}", c.path.display(), c.message);
    }
    assert!(report.execs > report.seeds as u64, "{name}: mutants ran");
}

macro_rules! bounded {
    ($($name:ident),* $(,)?) => {
        $( #[test] fn $name() { fuzz(stringify!($name)); } )*
    };
}

bounded!(
    criteo_tsv,
    avazu_csv,
    csv_criteo,
    csv_avazu,
    csv_elm,
    csv_elm_dien,
    taobao_ad,
    taobao_behavior,
    amazon_dien,
    json_records,
    serve_request_body,
    serve_chunked_body,
    parquet,
    checkpoint_manifest,
    checkpoint_tensors,
    feature_spec_toml,
    train_settings_toml,
    tiered_hot_tier,
);

#[test]
fn every_target_has_a_bounded_run() {
    let here = include_str!("bounded.rs");
    for t in tiderec_fuzz::TARGETS {
        assert!(here.contains(&format!("    {},\n", t.name)), "{} has no bounded run", t.name);
    }
}
