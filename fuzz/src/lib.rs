//! # tiderec-fuzz
//!
//! Fuzz targets for every tiderec reader and loader, and the seeded mutation
//! fuzzer that drives them.
//!
//! * [`targets`]: one `fn(&[u8])` per input format (Criteo TSV, Avazu CSV,
//!   the CSV feature-spec reader with each preset, the Taobao readers, the
//!   Amazon DIEN reader, JSON records, Parquet, feature-spec TOML) and
//!   [`checkpoint`] (manifest and safetensors files under the checkpoint
//!   loader), each asserting its reader's invariants; and [`stores`], a
//!   differential target running the tiered store beside the tiered store
//!   with its hot tier in another memory.
//! * [`seeds`]: seed corpora from the data samples in `../shared/data` and
//!   from the code itself.
//! * [`mutate`]: the deterministic mutator; [`driver`]: the loop that runs
//!   seeds and mutants under `catch_unwind`, detects hangs and writes
//!   crashing inputs to files.
//!
//! The bounded run is `cargo test --release -p tiderec-fuzz`; the long run is
//! `cargo run --release -p tiderec-fuzz --bin fuzz -- --target NAME --seconds N`.

pub mod checkpoint;
pub mod driver;
pub mod mutate;
pub mod seeds;
pub mod stores;
pub mod targets;

pub use driver::{replay, run, Budget, Crash, Report};
pub use targets::{target, Target, TARGETS};

/// Where crashing inputs are written: `$TIDEREC_FUZZ_CRASH_DIR`, or
/// `target/fuzz-crashes` of the workspace.
pub fn crash_dir() -> std::path::PathBuf {
    match std::env::var_os("TIDEREC_FUZZ_CRASH_DIR") {
        Some(d) => d.into(),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz-crashes"),
    }
}
