//! Golden tests: our layers and models in f64 against PyTorch (float64) references.
//!
//! The fixtures in `tests/fixtures/*.json` are written by
//! `python3 scripts/golden/make_fixtures.py` (run by hand, committed; the suite never
//! runs torch). Each holds seeded inputs, the parameters in our flat layout, torch's
//! forward outputs and torch autograd's gradients of a scalar loss with respect to
//! every parameter and input. Here each fixture's layer or model is run with those
//! parameters and inputs, and every output and gradient tensor of the fixture must
//! agree entry by entry:
//!
//! ```text
//! |ours − torch| ≤ 1e-5 · max(|ours|, |torch|, 1e-3)
//! ```
//!
//! i.e. 1e-5 relative, with an absolute floor of 1e-8 for values near zero. A fixture
//! tensor that no test compares fails the test too (except the few listed with a
//! reason), so a fixture cannot silently go unchecked.
//!
//! GRU gate order is torch's: the rows of `W_ih [3H × I]`, `W_hh [3H × H]`, `b_ih`,
//! `b_hh` are stacked `r, z, n`, and the fixture comes from `torch.nn.GRU` itself.

use serde_json::Value;
use std::cell::RefCell;
use std::collections::BTreeSet;
use tiderec_operators::nn::attention::{AttentionCache, AttentionPooling};
use tiderec_operators::nn::fm::FmInteraction;
use tiderec_operators::nn::gru::{Gru, GruCache};
use tiderec_operators::nn::loss::{bce_with_logits_grad, bce_with_logits_sum};
use tiderec_operators::nn::{FmConfig, ModelConfig};

/// Relative tolerance.
const RTOL: f64 = 1e-5;
/// Magnitude below which the tolerance stops shrinking (absolute floor `RTOL · FLOOR`).
const FLOOR: f64 = 1e-3;

/// `Ok` when every entry satisfies `|a − e| ≤ RTOL · max(|a|, |e|, FLOOR)`; otherwise an
/// error naming the fixture, the tensor, the first bad index (flat and per dimension)
/// and how many entries are off.
fn compare(fixture: &str, tensor: &str, shape: &[usize], expected: &[f64], actual: &[f64]) -> Result<(), String> {
    if expected.len() != actual.len() {
        return Err(format!(
            "fixture `{fixture}`, tensor `{tensor}`: torch has {} values (shape {shape:?}), ours has {}",
            expected.len(),
            actual.len()
        ));
    }
    let mut first = None;
    let mut bad = 0;
    for (i, (&e, &a)) in expected.iter().zip(actual).enumerate() {
        let allowed = RTOL * a.abs().max(e.abs()).max(FLOOR);
        // Written so that NaN on either side fails.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        if !((a - e).abs() <= allowed) {
            bad += 1;
            first.get_or_insert((i, e, a, allowed));
        }
    }
    match first {
        None => Ok(()),
        Some((i, e, a, allowed)) => Err(format!(
            "golden mismatch in fixture `{fixture}`, tensor `{tensor}` at index {i} {:?} of shape {shape:?}: \
             ours {a:e}, torch {e:e}, |diff| {:e} > allowed {allowed:e} \
             (|a−b| ≤ {RTOL:e}·max(|a|,|b|,{FLOOR:e})); {bad} of {} entries out of tolerance",
            unravel(i, shape),
            (a - e).abs(),
            expected.len()
        )),
    }
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            idx[d] = i % n;
            i /= n;
        }
    }
    idx
}

/// One parsed fixture, remembering which of its output and gradient tensors were compared.
struct Fixture {
    name: String,
    doc: Value,
    checked: RefCell<BTreeSet<String>>,
}

impl Fixture {
    fn load(name: &str) -> Fixture {
        let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("fixture `{name}`: cannot read {path}: {e} (run scripts/golden/make_fixtures.py)")
        });
        let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("fixture `{name}`: bad JSON: {e}"));
        assert_eq!(doc["name"], name, "fixture `{name}`: file names another fixture");
        assert_eq!(doc["generator"]["dtype"], "float64", "fixture `{name}`: references must be float64");
        Fixture { name: name.to_string(), doc, checked: RefCell::new(BTreeSet::new()) }
    }

    fn entry(&self, group: &str, name: &str) -> &Value {
        let v = &self.doc[group][name];
        assert!(v.is_object(), "fixture `{}`: no tensor `{group}.{name}`", self.name);
        v
    }

    fn shape(&self, group: &str, name: &str) -> Vec<usize> {
        self.entry(group, name)["shape"]
            .as_array()
            .unwrap_or_else(|| panic!("fixture `{}`: `{group}.{name}` has no shape", self.name))
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect()
    }

    fn tensor(&self, group: &str, name: &str) -> Vec<f64> {
        let data: Vec<f64> = self.entry(group, name)["data"]
            .as_array()
            .unwrap_or_else(|| panic!("fixture `{}`: `{group}.{name}` has no data", self.name))
            .iter()
            .map(|x| {
                x.as_f64().unwrap_or_else(|| panic!("fixture `{}`: `{group}.{name}`: {x} is not a number", self.name))
            })
            .collect();
        let n: usize = self.shape(group, name).iter().product();
        assert_eq!(data.len(), n, "fixture `{}`: `{group}.{name}` data does not fill its shape", self.name);
        data
    }

    fn usize(&self, key: &str) -> usize {
        self.doc["config"][key].as_u64().unwrap_or_else(|| panic!("fixture `{}`: config.{key} missing", self.name))
            as usize
    }

    fn usizes(&self, key: &str) -> Vec<usize> {
        self.doc["config"][key]
            .as_array()
            .unwrap_or_else(|| panic!("fixture `{}`: config.{key} missing", self.name))
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect()
    }

    /// Compares `actual` with the fixture's `group.name`, panicking loudly on mismatch.
    fn check(&self, group: &str, name: &str, actual: &[f64]) {
        let key = format!("{group}.{name}");
        if let Err(msg) = compare(&self.name, &key, &self.shape(group, name), &self.tensor(group, name), actual) {
            panic!("{msg}");
        }
        self.checked.borrow_mut().insert(key);
    }

    /// Asserts that every output and gradient tensor of the fixture was compared,
    /// except those in `skipped` (each with the reason it cannot be).
    fn all_checked(&self, skipped: &[(&str, &str)]) {
        for group in ["outputs", "grads"] {
            for name in self.doc[group].as_object().unwrap().keys() {
                let key = format!("{group}.{name}");
                let skip = skipped.iter().any(|(k, _)| *k == key);
                assert!(
                    skip || self.checked.borrow().contains(&key),
                    "fixture `{}`: tensor `{key}` was never compared",
                    self.name
                );
            }
        }
    }
}

#[test]
fn fm_layer_matches_torch() {
    let fx = Fixture::load("fm_layer");
    let fm = FmInteraction {
        num_fields: fx.usize("num_fields"),
        dim: fx.usize("dim"),
        stride: fx.usize("stride"),
        offset: fx.usize("offset"),
    };
    let batch = fx.usize("batch");
    let rows = fx.tensor("inputs", "rows");
    let r = fx.tensor("inputs", "r");
    let mut out = vec![0.0; batch];
    fm.forward(&rows, batch, &mut out);
    fx.check("outputs", "out", &out);
    // `backward` adds into the factor columns; start from zero.
    let mut drows = vec![0.0; rows.len()];
    fm.backward(&rows, &r, batch, &mut drows);
    fx.check("grads", "rows", &drows);
    fx.all_checked(&[]);
}

/// Runs an `Fm` model fixture (LR / FM / DeepFM / WDL); returns the fixture for further checks.
fn run_fm_model(name: &str, perturb: Option<(usize, f64)>) -> (Fixture, Vec<(String, Vec<f64>)>) {
    let fx = Fixture::load(&format!("{name}_model"));
    let cfg = FmConfig {
        num_dense: fx.usize("num_dense"),
        num_sparse: fx.usize("num_sparse"),
        dim: fx.usize("dim"),
        deep: fx.usizes("deep"),
        fm: fx.doc["config"]["fm"].as_bool().unwrap(),
        wide_only: 0,
    };
    let config = ModelConfig::Fm(cfg);
    assert_eq!(config.name(), name, "fixture `{}`: its config builds another model", fx.name);
    let mut model = config.build::<f64>(0).unwrap();
    let mut params = fx.tensor("params", "params");
    assert_eq!(model.params().len(), params.len(), "fixture `{}`: parameter count differs from our layout", fx.name);
    if let Some((i, delta)) = perturb {
        params[i] += delta;
    }
    model.params_mut().copy_from_slice(&params);
    let batch = fx.usize("batch");
    let dense = fx.tensor("inputs", "dense");
    let pooled = fx.tensor("inputs", "pooled");
    let labels: Vec<f32> = fx.tensor("inputs", "labels").iter().map(|&y| y as f32).collect();
    let logits = model.forward(&dense, &pooled, batch).to_vec();
    let loss = bce_with_logits_sum(&logits, &labels);
    let mut dlogits = vec![0.0; batch];
    bce_with_logits_grad(&logits, &labels, 1.0, &mut dlogits);
    let mut dpooled = vec![f64::NAN; pooled.len()]; // overwritten by backward
    model.backward(&dense, &pooled, &dlogits, &mut dpooled);
    let results = vec![
        ("outputs.logits".to_string(), logits),
        ("outputs.loss".to_string(), vec![loss]),
        ("grads.logits".to_string(), dlogits),
        ("grads.params".to_string(), model.grads().to_vec()),
        ("grads.pooled".to_string(), dpooled),
    ];
    (fx, results)
}

fn check_fm_model(name: &str) {
    let (fx, results) = run_fm_model(name, None);
    for (key, actual) in &results {
        let (group, tensor) = key.split_once('.').unwrap();
        fx.check(group, tensor, actual);
    }
    fx.all_checked(&[("grads.dense", "Model::backward does not produce gradients for the dense inputs")]);
}

#[test]
fn lr_model_matches_torch() {
    check_fm_model("lr");
}

#[test]
fn fm_model_matches_torch() {
    check_fm_model("fm");
}

#[test]
fn deepfm_model_matches_torch() {
    check_fm_model("deepfm");
}

#[test]
fn wdl_model_matches_torch() {
    check_fm_model("wdl");
}

fn check_gru(unsplit: bool) {
    let fx = Fixture::load("gru");
    assert_eq!(fx.doc["config"]["gate_order"], "r,z,n", "our rows are stacked r, z, n like torch.nn.GRU");
    let gru = Gru { input: fx.usize("input"), hidden: fx.usize("hidden"), offset: 0 };
    let (batch, steps, h) = (fx.usize("batch"), fx.usize("steps"), gru.hidden);
    let lengths = fx.usizes("lengths");
    let params = fx.tensor("params", "params");
    assert_eq!(gru.num_params(), params.len(), "fixture `gru`: parameter count differs from our layout");
    let x = fx.tensor("inputs", "x");
    let dstates = fx.tensor("inputs", "r");
    let mut cache = GruCache::default();
    if unsplit {
        gru.forward_unsplit(&params, &x, &lengths, batch, steps, &mut cache);
    } else {
        gru.forward(&params, &x, &lengths, batch, steps, &mut cache);
    }
    // h_1 … h_T, [T × B × H] like the fixture.
    fx.check("outputs", "states", &cache.states[batch * h..(steps + 1) * batch * h]);
    let mut grads = vec![f64::NAN; params.len()];
    let mut dx = vec![f64::NAN; x.len()];
    if unsplit {
        gru.backward_unsplit(&params, &x, &lengths, &cache, &dstates, &mut grads, &mut dx);
    } else {
        gru.backward(&params, &x, &lengths, &cache, &dstates, &mut grads, &mut dx);
    }
    fx.check("grads", "params", &grads);
    fx.check("grads", "x", &dx);
    fx.all_checked(&[]);
}

#[test]
fn gru_split_cell_matches_torch_gru() {
    check_gru(false);
}

#[test]
fn gru_unsplit_cell_matches_torch_gru() {
    check_gru(true);
}

#[test]
fn attention_matches_torch() {
    let fx = Fixture::load("attention");
    let att = AttentionPooling { dim: fx.usize("dim"), offset: 0 };
    let (batch, steps) = (fx.usize("batch"), fx.usize("steps"));
    let lengths = fx.usizes("lengths");
    let params = fx.tensor("params", "w");
    assert_eq!(att.num_params(), params.len());
    let query = fx.tensor("inputs", "query");
    let keys = fx.tensor("inputs", "keys");
    let r = fx.tensor("inputs", "r");
    let mut cache = AttentionCache::default();
    let mut out = vec![f64::NAN; batch * att.dim];
    att.forward(&params, &query, &keys, &lengths, batch, steps, &mut out, &mut cache);
    fx.check("outputs", "out", &out);
    let mut grads = vec![f64::NAN; params.len()];
    let (mut dq, mut dk) = (vec![f64::NAN; query.len()], vec![f64::NAN; keys.len()]);
    att.backward(&params, &query, &keys, &lengths, batch, steps, &r, &cache, &mut grads, &mut dq, &mut dk);
    fx.check("grads", "w", &grads);
    fx.check("grads", "query", &dq);
    fx.check("grads", "keys", &dk);
    fx.all_checked(&[]);
}

/// The comparison has teeth: on the DeepFM fixture, a change of 2e-5 relative in one
/// expected gradient entry is reported with fixture, tensor and index, while 5e-6
/// passes; and a model run with one MLP weight nudged by 1e-4 fails.
#[test]
fn comparison_catches_perturbations() {
    let fx = Fixture::load("deepfm_model");
    let shape = fx.shape("grads", "params");
    let expected = fx.tensor("grads", "params");
    // The largest-magnitude gradient entry, so the relative term (not the floor) governs.
    let i = (0..expected.len()).max_by(|&a, &b| expected[a].abs().total_cmp(&expected[b].abs())).unwrap();
    assert!(expected[i].abs() > FLOOR);
    let exact = compare(&fx.name, "grads.params", &shape, &expected, &expected);
    assert_eq!(exact, Ok(()));
    let mut actual = expected.clone();
    actual[i] *= 1.0 + 5e-6;
    assert_eq!(compare(&fx.name, "grads.params", &shape, &expected, &actual), Ok(()));
    actual[i] = expected[i] * (1.0 + 2e-5);
    let err = compare(&fx.name, "grads.params", &shape, &expected, &actual).unwrap_err();
    assert!(err.contains("`deepfm_model`") && err.contains("`grads.params`"), "{err}");
    assert!(err.contains(&format!("at index {i} [{i}]")) && err.contains("1 of"), "{err}");
    // NaN and length mismatches fail too.
    actual[i] = f64::NAN;
    assert!(compare(&fx.name, "grads.params", &shape, &expected, &actual).is_err());
    assert!(compare(&fx.name, "grads.params", &shape, &expected, &actual[1..]).is_err());
    // Multi-dimensional index in the message.
    let pshape = fx.shape("grads", "pooled");
    let pooled = fx.tensor("grads", "pooled");
    let mut p = pooled.clone();
    let last = p.len() - 1;
    p[last] += 1.0;
    let err = compare(&fx.name, "grads.pooled", &pshape, &pooled, &p).unwrap_err();
    let expect_idx: Vec<usize> = pshape.iter().map(|d| d - 1).collect();
    assert!(err.contains(&format!("at index {last} {expect_idx:?}")), "{err}");

    // End to end: the first weight of the MLP (right after b and a) nudged by 1e-4.
    let first_mlp_weight = 1 + fx.usize("num_dense");
    let (fx, results) = run_fm_model("deepfm", Some((first_mlp_weight, 1e-4)));
    let failures: Vec<String> = results
        .iter()
        .filter_map(|(key, actual)| {
            let (group, tensor) = key.split_once('.').unwrap();
            compare(&fx.name, key, &fx.shape(group, tensor), &fx.tensor(group, tensor), actual).err()
        })
        .collect();
    assert!(failures.iter().any(|m| m.contains("`outputs.logits`")), "{failures:?}");
    assert!(failures.iter().any(|m| m.contains("`grads.params`")), "{failures:?}");
}
