//! What only the `tiderec` binary needs, kept out of the library: each
//! subcommand's flags and the code that runs it and prints its results
//! (`train` and `plot` in `main.rs`; [`online`] and `produce`, [`scoring`]'s
//! `export`, `serve`, `eval` and `predict`, [`data`]'s `convert`, `generate`
//! and `spec`), the benchmarks (`tiderec bench …`, their flags and reports)
//! and the PNG curves of `tiderec plot`. They build on the library's public
//! API like any other program would.

pub mod bench;
pub mod data;
pub mod online;
pub mod plot;
pub mod scoring;

/// A metric to four places, or `n/a` where there is none.
pub(crate) fn fmt_opt(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |x| format!("{x:.4}"))
}
