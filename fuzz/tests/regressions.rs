//! Inputs that crashed a fuzz target, rebuilt by code (no data copied), run
//! through the same targets: each must now pass.

use tiderec_fuzz::checkpoint::manifest_seeds;
use tiderec_fuzz::{replay, target};

fn run(name: &str, input: &[u8]) {
    let t = target(name).expect("a target");
    if let Err(message) = replay(t.run, input) {
        panic!("{name} crashes: {message}");
    }
}

/// A spec whose one column feeds 257 categorical fields (or dense features)
/// made the line parser index past its 256-entry arrays.
#[test]
fn spec_with_more_features_than_the_parser_holds() {
    let head = "delimiter = \",\"\ncolumns = [\"y\", \"x\"]\nlabel = { column = \"y\" }\n";
    for table in ["[[categorical]]\ncolumn = \"x\"\nbuckets = 10\n", "[[dense]]\ncolumn = \"x\"\n"] {
        run("feature_spec_toml", format!("{head}{}", table.repeat(257)).as_bytes());
    }
}

/// A manifest whose worker count is 2^32 or u64::MAX made the loader list
/// that many file names (a 100 GB allocation, or a capacity overflow).
#[test]
fn manifest_with_a_huge_worker_count() {
    let manifest = String::from_utf8(manifest_seeds().remove(0)).unwrap();
    let needle = "\"workers\": 2,";
    assert!(manifest.contains(needle), "{manifest}");
    for workers in ["4294967296", "18446744073709551615"] {
        run("checkpoint_manifest", manifest.replace(needle, &format!("\"workers\": {workers},")).as_bytes());
    }
}

/// `lr = nan` in a settings file loaded as the default learning rate, and other
/// non-finite or out-of-range numbers as `invalid type: null` or not at all.
#[test]
fn settings_with_non_finite_or_out_of_range_numbers() {
    for text in ["lr = nan\n", "l2_dense = inf\n", "connect_timeout = 1e300\n", "workers = 30000\n"] {
        run("train_settings_toml", text.as_bytes());
        let e = tiderec::TrainSettings::from_toml_str(text).expect_err(text);
        assert!(e.reason.contains("is outside the allowed range"), "{text}: {e}");
    }
}

/// A settings table named by the empty key (`[""]`) was refused with a blank
/// key: "unknown setting ``".
#[test]
fn settings_with_an_empty_key() {
    for text in ["[\"\"]\n", "\"\" = 1\n"] {
        run("train_settings_toml", text.as_bytes());
        let e = tiderec::TrainSettings::from_toml_str(text).expect_err(text);
        assert_eq!(e.key, "\"\"", "{text}: {e}");
    }
}
