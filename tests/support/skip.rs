//! What a test does when something it needs is missing on this machine.
//!
//! Included by path (`#[path = ".../tests/support/skip.rs"] mod skip;`) from the
//! test targets of every crate, so the rule is written once: outside CI a test
//! that cannot run prints why and returns; under `CI=true`, where the test
//! command has installed everything the suite needs, it fails instead, so a
//! missing data set or tool can never pass silently.

/// True when running under CI (`CI=true`).
#[allow(dead_code)]
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Reports that a test cannot run because of `reason`: a printed note outside
/// CI (the caller then returns), a panic under `CI=true`.
#[allow(dead_code)]
pub fn cannot_run(reason: &str) {
    if in_ci() {
        panic!("CI=true and this test cannot run: {reason}");
    }
    eprintln!("skipping: {reason}");
}

/// `path` if it exists; otherwise [`cannot_run`] and `None`.
#[allow(dead_code)]
pub fn existing(path: std::path::PathBuf) -> Option<std::path::PathBuf> {
    if path.exists() {
        Some(path)
    } else {
        cannot_run(&format!("{} not found", path.display()));
        None
    }
}
