//! `TIDEREC_MAX_ISA`: the cap on the vector extensions the kernels use, as the
//! binary applies it (real processes). On a CPU without AVX-512 the cap to
//! `avx2` turns nothing off and the tests still run (the line still names it).

mod common;

use common::{metrics, run_err, run_ok, tiderec};

const TRAIN: &[&str] = &["train", "--samples", "4096", "--batch-size", "256", "--seed", "5", "--progress", "lines"];

/// One short training run under `cap` (`None`: the variable unset): its
/// kernels line (stderr), its `params L2` line (stdout) and the metrics' `params_l2`.
fn train(cap: Option<&str>) -> (String, String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("metrics.json");
    let mut cmd = tiderec();
    cmd.args(TRAIN).arg("--metrics-json").arg(&m);
    match cap {
        Some(v) => cmd.env("TIDEREC_MAX_ISA", v),
        None => cmd.env_remove("TIDEREC_MAX_ISA"),
    };
    let out = run_ok(&mut cmd);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let kernels = stderr.lines().find(|l| l.starts_with("kernels (")).expect("a kernels line").to_string();
    let l2 = stdout.lines().find(|l| l.trim_start().starts_with("params L2")).expect("a params L2 line").to_string();
    (kernels, l2, metrics(&m)["params_l2"].clone())
}

/// The kernels a kernels line names: what follows its `(CPU; extensions): `.
fn chosen_kernels(line: &str) -> &str {
    line.split_once("): ").map(|(_, k)| k).expect("`kernels (…): …`")
}

/// Under `avx2` no product runs an AVX-512 kernel, the line names the cap (and,
/// on an AVX-512 CPU, what it turns off), and the run trains the same
/// parameters as uncapped: the kernels are chosen inside summation classes,
/// where the AVX-512 kernels equal the AVX2 ones bit for bit.
#[test]
fn avx2_cap_runs_no_avx512_kernel_and_trains_the_same_numbers() {
    let (native_line, native_l2, native_bits) = train(None);
    let (capped_line, capped_l2, capped_bits) = train(Some("avx2"));
    assert!(!native_line.contains("TIDEREC_MAX_ISA"), "{native_line}");
    assert!(capped_line.contains("TIDEREC_MAX_ISA=avx2"), "{capped_line}");
    let kernels = chosen_kernels(&capped_line);
    assert!(kernels.contains("packed-avx2"), "the packed products run AVX2: {capped_line}");
    assert!(!kernels.contains("avx512"), "an AVX-512 kernel under the cap: {capped_line}");
    let avx512 = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains(" avx512f"));
    if avx512 {
        assert!(capped_line.contains("off: avx512f"), "{capped_line}");
        let features = native_line.split_once("): ").expect("kernels line").0;
        assert!(features.contains("avx512f"), "{native_line}");
    } else {
        eprintln!("no AVX-512 on this CPU: the cap turns nothing off");
    }
    assert_eq!(capped_l2, native_l2, "the cap changed the trained parameters");
    assert!(native_bits.as_f64().is_some_and(|l2| l2 > 0.0), "{native_bits}");
    assert_eq!(capped_bits, native_bits, "params_l2 differs in the metrics (every digit)");
}

/// `tiderec bench kernels --json` under `avx2`: the report names the cap, lists
/// AVX-512 among the extensions turned off (on an AVX-512 CPU), and times no
/// AVX-512 kernel.
#[test]
fn bench_kernels_report_names_the_cap() {
    let out = run_ok(tiderec().env("TIDEREC_MAX_ISA", "avx2").args([
        "bench",
        "kernels",
        "--rows",
        "64",
        "--seconds",
        "0.0005",
        "--rounds",
        "1",
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(v["max_isa"], "avx2", "{v}");
    let features: Vec<&str> = v["features"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    assert!(features.iter().all(|f| !f.starts_with("avx512")), "{features:?}");
    assert!(v["features_line"].as_str().unwrap().contains("TIDEREC_MAX_ISA=avx2"), "{v}");
    if std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains(" avx512f")) {
        assert!(v["features_off"].as_array().unwrap().iter().any(|f| f == "avx512f"), "{v}");
    }
    for p in v["products"].as_array().unwrap() {
        for c in p["candidates"].as_array().unwrap() {
            assert!(!c["kernel"].as_str().unwrap().contains("avx512"), "timed under the cap: {p}");
        }
    }
}

/// The `amx` level: under `avx512` an AMX CPU's bf16 products run on
/// AVX-512 BF16 and no AMX peak is measured; uncapped (or under `amx`) they run
/// on AMX tiles. Without AMX the test says so and checks the capped half,
/// and where the CPU has AVX-512 BF16 the same on emulated tiles
/// (`TIDEREC_AMX_EMULATE=1`): uncapped the products run on them and no AMX
/// peak is measured; under `avx512` they are off.
#[test]
fn the_amx_level_turns_the_tile_products_on_and_off() {
    let kernels_on = |cap: Option<&str>, emulate: bool| {
        let mut cmd = tiderec();
        if emulate {
            cmd.env("TIDEREC_AMX_EMULATE", "1");
        }
        match cap {
            Some(cap) => cmd.env("TIDEREC_MAX_ISA", cap),
            None => cmd.env_remove("TIDEREC_MAX_ISA"),
        };
        let out =
            run_ok(cmd.args(["bench", "kernels", "--rows", "64", "--seconds", "0.0005", "--rounds", "1", "--json"]));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
        let names: Vec<String> = v["products"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| p["candidates"].as_array().unwrap().iter().map(|c| c["kernel"].as_str().unwrap().to_string()))
            .collect();
        (v, names)
    };
    let kernels = |cap: Option<&str>| kernels_on(cap, false);
    let (capped, names) = kernels(Some("avx512"));
    assert!(!names.iter().any(|n| n.contains("amx")), "an AMX kernel under avx512: {names:?}");
    assert!(capped.get("amx_peak_gflops").is_none(), "an AMX peak under avx512: {capped}");
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flag = |f: &str| cpu.split_whitespace().any(|x| x == f);
    if !(flag("amx_tile") && flag("amx_bf16")) {
        if flag("avx512_bf16") {
            let (v, names) = kernels_on(None, true);
            assert!(names.iter().any(|n| n == "bf16-amx-emulated"), "{names:?}");
            assert!(v.get("amx_peak_gflops").is_none(), "an AMX peak on emulated tiles: {v}");
            let (_, names) = kernels_on(Some("avx512"), true);
            assert!(!names.iter().any(|n| n.contains("amx")), "an AMX kernel under avx512: {names:?}");
        }
        eprintln!(
            "skipped the AMX half on the CPU's tiles: this CPU has no AMX-BF16 (a missing instruction set, not a missing install){}",
            if flag("avx512_bf16") { "; checked it on emulated tiles" } else { "" }
        );
        return;
    }
    assert!(capped["features_off"].as_array().unwrap().iter().any(|f| f == "amx-bf16"), "{capped}");
    if flag("avx512_bf16") {
        assert!(names.iter().any(|n| n == "bf16-avx512"), "{names:?}");
    }
    for cap in [None, Some("amx")] {
        let (v, names) = kernels(cap);
        assert!(names.iter().any(|n| n == "bf16-amx"), "{cap:?}: {names:?}");
        assert!(v["amx_peak_gflops"].as_f64().is_some_and(|g| g > 0.0), "{v}");
    }
}

/// A value that names no cap is refused at start, naming the variable, the
/// value and the accepted values, before any training.
#[test]
fn an_invalid_cap_is_refused() {
    for bad in ["avx-2", "avx512f", "sse"] {
        let err = run_err(tiderec().env("TIDEREC_MAX_ISA", bad).args(TRAIN));
        assert!(err.contains(&format!("TIDEREC_MAX_ISA=\"{bad}\"")), "{err}");
        assert!(err.contains("native, amx, avx512, avx2, portable"), "{err}");
        assert!(!err.contains("kernels ("), "refused after the kernels were chosen: {err}");
    }
}
