//! `tiderec export` of a model whose spec names a column like a feature cross: every
//! sparse field keeps a name of its own, so every table tensor does too.

mod common;

use common::{run_ok, tiderec};
use std::path::Path;

/// A spec whose categorical column `cross_0` has the name of the first cross.
const SPEC: &str = r#"
delimiter = ","
header = true
columns = ["label", "x", "cross_0", "b"]
label = { column = "label" }
dense = [{ column = "x" }]
categorical = [{ column = "cross_0", buckets = 50 }, { column = "b", buckets = 50 }]
"#;

/// `n` lines of the spec's columns, with a header.
fn lines(n: usize) -> String {
    let mut text = String::from("label,x,cross_0,b\n");
    for i in 0..n {
        text.push_str(&format!("{},{},{},{}\n", i % 2, i % 7, (i * 3) % 11, (i * 5) % 13));
    }
    text
}

/// The names and shapes in a safetensors file's header.
fn header(path: &Path) -> serde_json::Map<String, serde_json::Value> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header.as_object().unwrap().clone()
}

/// Wide & Deep with the cross of `cross_0` and `b` exports: the cross is `cross_0_1`, with a
/// `first_order` tensor of its own beside the column's; a stray file under the old fixed
/// temporary name is neither in the way nor removed.
#[test]
fn a_spec_column_named_like_a_cross_exports_with_distinct_tensor_names() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (spec, data, ck, out) = (d.join("spec.toml"), d.join("data.csv"), d.join("ck"), d.join("serve"));
    std::fs::write(&spec, SPEC).unwrap();
    std::fs::write(&data, lines(200)).unwrap();
    run_ok(
        tiderec()
            .args(["train", "--model", "wdl", "--crosses", "0:1", "--progress", "none"])
            .args(["--batch-size", "16", "--steps", "3", "--spec"])
            .arg(&spec)
            .arg("--data")
            .arg(format!("csv:{}", data.display()))
            .arg("--checkpoint-dir")
            .arg(&ck),
    );
    std::fs::create_dir(&out).unwrap();
    let stray = out.join(".model.safetensors.tmp");
    std::fs::write(&stray, "a killed export's").unwrap();
    run_ok(tiderec().args(["export", "--checkpoint"]).arg(&ck).arg("--out").arg(&out));
    assert_eq!(std::fs::read_to_string(&stray).unwrap(), "a killed export's");

    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("model.json")).unwrap()).unwrap();
    assert_eq!(config["sparse_fields"], serde_json::json!(["cross_0", "b", "cross_0_1"]));
    assert_eq!(config["features"]["crosses"]["fields"], serde_json::json!(["cross_0_1"]));
    let tensors = header(&out.join("model.safetensors"));
    for name in ["first_order.cross_0", "embeddings.cross_0", "first_order.b", "first_order.cross_0_1"] {
        assert!(tensors.contains_key(name), "{name} in {:?}", tensors.keys().collect::<Vec<_>>());
    }
    assert!(!tensors.contains_key("embeddings.cross_0_1"), "a cross has no factor");
    // Every tensor of model.json is in the file with its shape.
    for (name, shape) in config["tensors"].as_object().unwrap() {
        assert_eq!(&tensors[name]["shape"], shape, "{name}");
    }
    let mut names: Vec<String> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, [".model.safetensors.tmp", "model.json", "model.safetensors"], "no temporary file of its own");
}
