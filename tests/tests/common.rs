//! Shared helpers of the cross-crate tests.
#![allow(dead_code)]

#[path = "../support/skip.rs"]
pub mod skip;

#[path = "../support/shared.rs"]
mod shared;

#[allow(unused_imports)]
pub use shared::{rel_diff, shared_data};
