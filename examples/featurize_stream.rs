//! Featurizing a stream of raw lines inside your own timely dataflow.
//!
//! Lines (here generated Ele.me-shaped records; in production, say, Kafka
//! messages) flow through tiderec's `featurize` operator with the `elm`
//! feature spec: each timestamp's lines become one columnar `Batch`, and every
//! malformed line becomes a dead letter on a second stream. Nothing else of
//! tiderec (trainer, CLI, files) is involved.
//!
//! ```text
//! cargo run --release -p tiderec-examples --example featurize_stream
//! ```

use std::sync::{Arc, Mutex};
use tiderec_operators::spec::FeatureSpec;
use tiderec_operators::stream::Featurize;
use tiderec_operators::Batch;
use tiderec_sources::elm::elm_line;
use timely::dataflow::operators::{Exchange, Inspect, ToStream};

fn main() {
    let totals = Arc::new(Mutex::new((0usize, 0usize, 0usize)));
    let t = totals.clone();
    timely::execute(timely::Config::process(2), move |worker| {
        let me = worker.index();
        let t = t.clone();
        worker.dataflow::<u64, _, _>(|scope| {
            // Each worker makes 1,000 lines and breaks every 100th one.
            let lines: Vec<Vec<u8>> = (0..1000u64)
                .map(|i| {
                    let mut line = Vec::new();
                    elm_line(7, me as u64 * 1000 + i, 1, &mut line);
                    if i % 100 == 99 {
                        line.truncate(line.len() / 2);
                    }
                    line
                })
                .collect();
            let spec = FeatureSpec::elm(100_000, 50);
            let (batches, dead) = lines
                .to_stream(scope)
                .exchange(|line: &Vec<u8>| line.len() as u64)
                .featurize(&spec, 7, "elm")
                .expect("a valid preset");
            let (t1, t2) = (t.clone(), t.clone());
            batches.inspect(move |b: &Batch| {
                let mut t = t1.lock().unwrap();
                t.0 += b.len();
                t.1 += b.sparse.iter().map(|f| f.ids.len()).sum::<usize>();
            });
            dead.inspect(move |_| t2.lock().unwrap().2 += 1);
        });
    })
    .expect("timely starts");
    let (samples, ids, bad) = *totals.lock().unwrap();
    println!("{samples} samples featurized ({ids} sparse ids), {bad} dead letters");
    assert_eq!(samples + bad, 2000, "every line is a sample or a dead letter");
}
