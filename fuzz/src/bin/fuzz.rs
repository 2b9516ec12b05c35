//! The long fuzzing run: `fuzz --target NAME|all --seconds N [--seed S] [--data DIR]`,
//! `fuzz --target NAME --replay FILE` to run one saved input, or
//! `fuzz --target NAME --dump-seeds DIR` to write its seed corpus.
//!
//! Prints one line per target: executions, executions per second, and the
//! crash file if one was found (the exit status is then 1).

use std::path::PathBuf;
use std::time::Duration;
use tiderec_fuzz::seeds::{default_data_dir, seeds};
use tiderec_fuzz::{crash_dir, replay, run, target, Budget, TARGETS};

fn usage() -> ! {
    let names: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
    eprintln!(
        "usage: fuzz --target NAME|all [--seconds N] [--execs N] [--seed S] [--data DIR] [--replay FILE] [--dump-seeds DIR]\ntargets: {}",
        names.join(", ")
    );
    std::process::exit(2)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut dump = None::<PathBuf>;
    let (mut name, mut seconds, mut execs, mut seed, mut data, mut replay_file) =
        (None, 60.0f64, u64::MAX, 1u64, default_data_dir(), None::<PathBuf>);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--target" => name = Some(value()),
            "--seconds" => seconds = value().parse().unwrap_or_else(|_| usage()),
            "--execs" => execs = value().parse().unwrap_or_else(|_| usage()),
            "--seed" => seed = value().parse().unwrap_or_else(|_| usage()),
            "--data" => data = PathBuf::from(value()),
            "--replay" => replay_file = Some(PathBuf::from(value())),
            "--dump-seeds" => dump = Some(PathBuf::from(value())),
            _ => usage(),
        }
    }
    let name = name.unwrap_or_else(|| usage());
    if let Some(dir) = dump {
        let corpus = seeds(&name, &data).unwrap_or_else(|e| {
            eprintln!("{name}: no seeds: {e}");
            std::process::exit(2)
        });
        std::fs::create_dir_all(&dir).expect("create the seed directory");
        for (i, s) in corpus.iter().enumerate() {
            std::fs::write(dir.join(format!("{name}-{i}.bin")), s).expect("write a seed");
        }
        println!("{name}: {} seeds written to {}", corpus.len(), dir.display());
        return;
    }
    if let Some(file) = replay_file {
        let t = target(&name).unwrap_or_else(|| usage());
        let bytes = std::fs::read(&file).unwrap_or_else(|e| {
            eprintln!("cannot read {}: {e}", file.display());
            std::process::exit(2)
        });
        match replay(t.run, &bytes) {
            Ok(()) => println!("{name}: {} runs cleanly", file.display()),
            Err(m) => {
                println!("{name}: {} crashes: {m}", file.display());
                std::process::exit(1)
            }
        }
        return;
    }
    let chosen: Vec<_> =
        if name == "all" { TARGETS.iter().collect() } else { vec![target(&name).unwrap_or_else(|| usage())] };
    let mut failed = false;
    for t in chosen {
        let corpus = match seeds(t.name, &data) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{}: no seeds: {e}", t.name);
                failed = true;
                continue;
            }
        };
        let budget = Budget {
            max_execs: execs,
            max_time: Duration::from_secs_f64(seconds),
            hang_after: Duration::from_secs(20),
        };
        let report = run(t.name, t.run, corpus, budget, seed, &crash_dir());
        let secs = report.elapsed.as_secs_f64();
        print!(
            "{}: {} seeds, {} execs in {:.1} s ({:.0}/s)",
            t.name,
            report.seeds,
            report.execs,
            secs,
            report.execs as f64 / secs.max(1e-9)
        );
        match report.crash {
            Some(c) => {
                println!(", CRASH {}: {}", c.path.display(), c.message);
                failed = true;
            }
            None => println!(", no crash"),
        }
    }
    if failed {
        std::process::exit(1);
    }
}
