//! Shared helpers of the cross-crate tests.
#![allow(dead_code)]

#[path = "../support/skip.rs"]
pub mod skip;

use std::path::PathBuf;

/// `../shared/data/<rel>` beside the repository, or `None` (with a note) when absent.
pub fn shared_data(rel: &str) -> Option<PathBuf> {
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data")).join(rel);
    skip::existing(p)
}

/// Relative difference of two values.
pub fn rel_diff(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-12)
}
