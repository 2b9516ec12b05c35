//! `tiderec bench kernels --json` end to end: the MLP products' flop count is
//! DLRM's, the core's fused multiply-add peak is measured at every vector
//! width the CPU runs, and no product, and no bound built from them, passes
//! that peak (nor, under bf16, the AMX peak: the chained MLPs included); the
//! best packed kernel's in-cache rate is reported beside it.

mod common;

use common::{run_ok, tiderec};

#[test]
fn no_kernel_and_no_bound_passes_the_measured_fma_peak() {
    // Uncapped, so the widths measured are the CPU's (`/proc/cpuinfo`'s).
    let out = run_ok(tiderec().env_remove("TIDEREC_MAX_ISA").args([
        "bench",
        "kernels",
        "--rows",
        "64",
        "--seconds",
        "0.01",
        "--rounds",
        "1",
        "--json",
    ]));
    let r: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("bench kernels --json prints one JSON object");
    // DLRM's MLP layers: bottom 13-512-256-64-16, top 367-512-256-1. Forward,
    // dW and dx are 2·in·out flops each per sample, but the first bottom layer
    // reads the dense values, whose gradient nothing needs: no dx there.
    let layers = [(13, 512), (512, 256), (256, 64), (64, 16), (367, 512), (512, 256), (256, 1)];
    let want: f64 = layers.iter().map(|&(i, o)| 6.0 * (i * o) as f64).sum::<f64>() - 2.0 * (13 * 512) as f64;
    let dx_of_the_first =
        r["products"].as_array().unwrap().iter().any(|p| p["product"] == "dx" && p["layer"] == "13->512");
    assert!(!dx_of_the_first, "the dense input's gradient is never computed, so not timed: {r}");
    assert_eq!(r["mlp_flops_per_sample"].as_f64(), Some(want), "{r}");

    let peaks = r["fma_peak"].as_array().expect("fma_peak");
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has = |flag: &str| cpu.split_whitespace().any(|f| f == flag);
    let widths: Vec<&str> = peaks.iter().map(|p| p["width"].as_str().unwrap()).collect();
    assert_eq!(widths.contains(&"avx2"), has("avx2") && has("fma"), "{widths:?}");
    assert_eq!(widths.contains(&"avx512"), has("avx512f"), "{widths:?}");
    let peak = peaks.iter().map(|p| p["gflops"].as_f64().unwrap()).fold(0.0, f64::max);
    if peaks.is_empty() {
        return;
    }
    assert!(peak.is_finite() && peak > 0.0, "{r}");
    let peak_bound = r["peak_bound_samples_per_sec"].as_f64().unwrap();
    assert!((peak_bound - peak * 1e9 / want).abs() <= 1e-6 * peak_bound, "{peak_bound} vs {peak} GFLOP/s");
    let gemm_bound = r["gemm_bound_samples_per_sec"].as_f64().unwrap();
    assert!(gemm_bound > 0.0 && gemm_bound <= peak_bound, "GEMM bound {gemm_bound} above the peak bound {peak_bound}");
    for p in r["products"].as_array().unwrap() {
        let g = p["chosen_gflops"].as_f64().unwrap();
        assert!(g > 0.0 && g <= peak, "{} {} at {g} GFLOP/s passes the {peak} GFLOP/s peak", p["product"], p["layer"]);
    }
    // The fp32 MLPs chained as training runs them: timed on every CPU, and no faster than the peak allows.
    let chained = r["mlp_samples_per_sec"].as_f64().expect("the chained fp32 MLPs");
    assert!(chained > 0.0 && chained <= peak_bound, "chained fp32 MLPs {chained} above the peak bound {peak_bound}");
    // The best packed kernel on a product that stays in cache: named as the
    // products' candidates are, and among the packed kernels they were timed on.
    let in_cache = &r["in_cache"];
    assert_eq!(in_cache["mnk"], "24x64x128", "{r}");
    let g = in_cache["gflops"].as_f64().expect("the in-cache rate");
    assert!(g.is_finite() && g > 0.0, "{r}");
    let kernel = in_cache["kernel"].as_str().unwrap();
    let mut timed = r["products"].as_array().unwrap().iter().flat_map(|p| p["candidates"].as_array().unwrap().iter());
    assert!(kernel.starts_with("packed-") && timed.any(|c| c["kernel"] == kernel), "{kernel}: {r}");
    // The AMX bf16 peak: measured exactly where the CPU has AMX-BF16, and no
    // bf16 product or bound passes it.
    let amx = has("amx_tile") && has("amx_bf16");
    assert_eq!(r.get("amx_peak_gflops").is_some(), amx, "{r}");
    if !amx {
        eprintln!("this CPU has no AMX-BF16: no AMX peak to check");
        return;
    }
    let amx_peak = r["amx_peak_gflops"].as_f64().unwrap();
    let amx_bound = r["amx_peak_bound_samples_per_sec"].as_f64().unwrap();
    assert!((amx_bound - amx_peak * 1e9 / want).abs() <= 1e-6 * amx_bound, "{amx_bound} vs {amx_peak} GFLOP/s");
    let bf16_bound = r["gemm_bound_samples_per_sec_bf16"].as_f64().expect("a bf16 bound on an AMX CPU");
    assert!(bf16_bound > 0.0 && bf16_bound <= amx_bound, "bf16 bound {bf16_bound} above the AMX bound {amx_bound}");
    let chained = r["mlp_samples_per_sec_bf16"].as_f64().expect("the chained bf16 MLPs on an AMX CPU");
    assert!(chained > 0.0 && chained <= amx_bound, "chained bf16 MLPs {chained} above the AMX bound {amx_bound}");
    for p in r["products"].as_array().unwrap() {
        for c in p["candidates"].as_array().unwrap().iter().filter(|c| c["kernel"] == "bf16-amx") {
            let g = c["gflops"].as_f64().unwrap();
            assert!(
                g > 0.0 && g <= amx_peak,
                "{} {} at {g} GFLOP/s passes the AMX peak {amx_peak}",
                p["product"],
                p["layer"]
            );
        }
    }
}
