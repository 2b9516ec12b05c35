//! Every repository path the README, `docs/` and the scripts name exists: a
//! source file that moved or a script that was renamed fails here, not when a
//! reader follows the path.
//!
//! A path is a word that starts with one of the repository's top-level
//! directories (`nn/`, `scripts/`, …, never `target/`) and ends in a file
//! extension or a `/` (a directory). Units such as `records/s` and prefixes
//! such as `gpu/tests/conformance_` end in neither, so they are not paths.

use super::documented_commands::{documents, root};
use std::path::PathBuf;

/// The top-level directories a documented path may start with.
fn top_directories() -> Vec<String> {
    let mut tops: Vec<String> = std::fs::read_dir(root())
        .expect("the repository is readable")
        .map(|e| e.expect("a repository entry"))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|name| !name.starts_with('.') && name != "target")
        .collect();
    tops.sort();
    tops
}

/// The README, `docs/`'s Markdown and `scripts/`' Python and shell scripts.
fn documents_and_scripts() -> Vec<PathBuf> {
    let mut files = documents();
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(root().join("scripts"))
        .expect("scripts/ is readable")
        .map(|e| e.expect("a scripts/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "py" || e == "sh"))
        .collect();
    scripts.sort();
    files.extend(scripts);
    files
}

/// A character a path may hold.
fn in_path(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

/// Whether `word` names a file (its last component has an extension) or a directory.
fn is_path(word: &str) -> bool {
    let last = word.rsplit('/').next().unwrap_or_default();
    word.ends_with('/')
        || last.rsplit_once('.').is_some_and(|(stem, ext)| {
            !stem.is_empty() && (1..=5).contains(&ext.len()) && ext.chars().all(|c| c.is_ascii_alphanumeric())
        })
}

/// The paths `line` names under one of `tops`, in order.
fn paths_in(line: &str, tops: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    let mut before = None;
    while let Some(c) = rest.chars().next() {
        let starts = before.is_none_or(|b: char| !in_path(b))
            && tops.iter().any(|t| rest.strip_prefix(t.as_str()).is_some_and(|r| r.starts_with('/')));
        if starts {
            let end = rest.find(|c: char| !in_path(c)).unwrap_or(rest.len());
            let word = rest[..end].trim_end_matches('.');
            if is_path(word) {
                found.push(word.to_string());
            }
            before = rest[..end].chars().last();
            rest = &rest[end..];
            continue;
        }
        before = Some(c);
        rest = &rest[c.len_utf8()..];
    }
    found
}

#[test]
fn every_documented_path_exists() {
    let tops = top_directories();
    assert!(tops.iter().any(|t| t == "scripts") && tops.iter().any(|t| t == "nn"), "top directories: {tops:?}");
    let (mut checked, mut missing) = (0, Vec::new());
    for file in documents_and_scripts() {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let name = file.strip_prefix(root()).unwrap_or(&file).display().to_string();
        for (i, line) in text.lines().enumerate() {
            for path in paths_in(line, &tops) {
                checked += 1;
                if !root().join(&path).exists() {
                    missing.push(format!("{name}:{}: {path}", i + 1));
                }
            }
        }
    }
    // An extractor that finds nothing would pass every document.
    assert!(checked >= 100, "only {checked} documented paths found");
    assert!(missing.is_empty(), "documented paths that do not exist:\n{}", missing.join("\n"));
}

#[test]
fn paths_are_found_as_written() {
    let tops = ["gpu", "nn", "pipeline", "records", "scripts"].map(String::from);
    let line = "See `nn/src/gemm.rs` and pipeline/src/cli/, then scripts/test.sh. \
                20,000 records/s; gpu/tests/conformance_*; xnn/src/a.rs; ../shared/nn/x.md; nn/docs";
    assert_eq!(paths_in(line, &tops), ["nn/src/gemm.rs", "pipeline/src/cli/", "scripts/test.sh"]);
    // A path that does not exist is reported, so the test above can fail.
    assert!(!root().join("nn/src/no_such_module.rs").exists());
}
