//! What only the `tiderec` binary needs, kept out of the library: the
//! benchmarks (`tiderec bench …`, their flags and reports) and the PNG curves
//! of `tiderec plot`. They build on the library's public API like any other
//! program would.

pub mod bench;
pub mod plot;
