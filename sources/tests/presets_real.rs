//! Every feature-spec preset parses, validates and featurizes real lines from
//! `../shared/data` (elm and elm_y_long, which have no real rows, featurize
//! lines of the elm-shaped generator), and every TOML the presets print reads back.

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::path::PathBuf;
use tiderec_records::format::LineFormat;
use tiderec_records::spec::{FeatureSpec, Pooling, SpecFormat};
use tiderec_records::Batch;

fn data(rel: &str) -> Option<Vec<u8>> {
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data")).join(rel);
    match std::fs::read(&p) {
        Ok(b) => Some(b),
        Err(e) => {
            skip::cannot_run(&format!("{}: {e}", p.display()));
            None
        }
    }
}

/// Featurizes every line of `bytes` (skipping a header); returns the batch and the bad lines.
fn featurize_all(spec: FeatureSpec, bytes: &[u8]) -> (Batch, usize) {
    let text = FeatureSpec::from_toml(&spec.to_toml()).expect("the printed TOML reads back");
    assert_eq!(text, spec);
    let f = SpecFormat::new(spec, 7).unwrap();
    let mut b = f.empty_batch();
    let mut bad = 0;
    for (i, line) in bytes.strip_suffix(b"\n").unwrap_or(bytes).split(|&c| c == b'\n').enumerate() {
        if i == 0 && f.is_header(line) {
            continue;
        }
        if f.parse(line, &mut b).is_err() {
            bad += 1;
        }
    }
    b.check().unwrap();
    (b, bad)
}

#[test]
fn criteo_preset_featurizes_kaggle_and_1tb_lines() {
    for rel in ["criteo/sample.train", "criteo_1tb/day_0.part.txt"] {
        let Some(bytes) = data(rel) else { continue };
        let (b, bad) = featurize_all(FeatureSpec::preset("criteo", 100_000, 1).unwrap(), &bytes);
        assert_eq!((b.num_dense, b.sparse.len()), (13, 26));
        assert_eq!((b.len(), bad), (10_000, 0), "{rel}");
        assert!(b.labels.contains(&1.0) && b.labels.contains(&0.0));
        let empty = b.sparse.iter().map(|f| (0..b.len()).filter(|&i| f.bag(i).is_empty()).count()).sum::<usize>();
        assert!(empty > 0, "{rel}: empty categories are empty bags");
        assert!(b.dense.iter().all(|&v| v >= 0.0 && v.is_finite()));
    }
    // The first line of Kaggle train.txt, as documented in shared/data/README.md.
    if let Some(bytes) = data("criteo/sample.train") {
        let first = bytes.split(|&c| c == b'\n').next().unwrap();
        let f = SpecFormat::new(FeatureSpec::criteo(1000), 7).unwrap();
        let mut b = f.empty_batch();
        f.parse(first, &mut b).unwrap();
        assert_eq!(b.labels, [0.0]);
        assert!((b.dense[0] - 2f32.ln()).abs() < 1e-6, "I1 = 1 → ln 2");
        assert_eq!(b.dense[11], 0.0, "I12 is empty");
    }
}

#[test]
fn avazu_preset_featurizes_the_kaggle_sample() {
    for rel in ["avazu/train", "avazu/avazu_sample.txt"] {
        let Some(bytes) = data(rel) else { continue };
        let (b, bad) = featurize_all(FeatureSpec::preset("avazu", 100_000, 1).unwrap(), &bytes);
        assert_eq!((b.num_dense, b.sparse.len()), (0, 22));
        assert_eq!(bad, 0, "{rel}");
        assert!(b.len() >= 100);
        assert!(b.sparse.iter().all(|f| f.ids.len() == b.len()), "one id per field per line");
    }
    // The unlabeled test file has 23 columns: every line is malformed.
    if let Some(bytes) = data("avazu/test") {
        let (b, bad) = featurize_all(FeatureSpec::avazu(1000), &bytes);
        assert_eq!((b.len(), bad), (0, 1000));
    }
}

#[test]
fn taobao_ad_preset_featurizes_the_fuxictr_sample() {
    let Some(bytes) = data("taobao_ad/train_sample.csv") else { return };
    let (b, bad) = featurize_all(FeatureSpec::preset("taobao-ad", 10_000, 20).unwrap(), &bytes);
    assert_eq!((b.len(), bad), (100, 0));
    assert_eq!((b.num_dense, b.sparse.len()), (1, 16));
    assert_eq!(b.sparse[15].bag(0).len(), 2, "the first row clicked 170301^573514");
}

#[test]
fn elm_presets_featurize_generated_lines() {
    for (name, scale, max_len) in [("elm", 1, 50), ("elm_y_long", 8, 400)] {
        let mut bytes = Vec::new();
        for i in 0..200 {
            tiderec_sources::elm::elm_line(3, i, scale, &mut bytes);
            bytes.push(b'\n');
        }
        let spec = FeatureSpec::preset(name, 100_000, 1).unwrap();
        assert_eq!(spec.list[0].max_len, max_len);
        let (b, bad) = featurize_all(spec, &bytes);
        assert_eq!((b.len(), bad), (200, 0), "{name}");
        assert_eq!((b.num_dense, b.sparse.len()), (10, 28));
        let longest = (0..b.len()).map(|i| b.sparse[18].bag(i).len()).max().unwrap();
        assert!(longest > 50 * (scale - 1) && longest <= max_len, "{name}: longest list {longest}");
        // The same lines with mean pooling: weights 1/n on every list field.
        let mut mean = FeatureSpec::preset(name, 100_000, 1).unwrap();
        mean.list.iter_mut().for_each(|l| l.pooling = Pooling::Mean);
        let (m, _) = featurize_all(mean, &bytes);
        assert_eq!(m.sparse[18].ids, b.sparse[18].ids);
        for i in 0..m.len() {
            let w = m.sparse[18].bag_weights(i).unwrap();
            assert!(w.iter().all(|&x| (x * w.len() as f32 - 1.0).abs() < 1e-6));
        }
    }
}
