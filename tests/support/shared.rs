//! Helpers the test targets of several crates share, included by path
//! (`#[path = ".../tests/support/shared.rs"] mod shared;`) next to `skip.rs`,
//! which the includer must also have as `skip`.

use std::path::PathBuf;

/// `../shared/data/<rel>` beside the repository (every crate sits one level
/// below the repository root), or `None` with a note ([`super::skip::existing`]).
#[allow(dead_code)]
pub fn shared_data(rel: &str) -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data").join(rel);
    super::skip::existing(p)
}

/// Relative difference of two values.
#[allow(dead_code)]
pub fn rel_diff(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-12)
}
