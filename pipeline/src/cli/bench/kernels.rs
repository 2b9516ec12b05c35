//! `tiderec bench kernels`: every candidate of every class timed on a model's
//! MLP products, and the bound the products alone put on a step. The kernels a
//! run chooses at start-up are [`tiderec::kernels`]'s.

use serde::Serialize;
use tiderec_operators::cpu;
use tiderec_operators::nn::fma_peak;
use tiderec_operators::nn::gemm_bf16::Bf16Kernel;
use tiderec_operators::nn::kernel_choice::{
    cpu_features, cpu_features_line, cpu_model, install_backward_choices, install_forward, measure_backward,
    measure_bf16, measure_shape, median_calls_per_second, Backward, BackwardShape, Candidate, ForwardShape, Measure,
};
use tiderec_operators::nn::mlp::{Mlp, MlpCache};
use tiderec_operators::nn::{MlpStack, ModelConfig, Precision};

/// One candidate on one product in `tiderec bench kernels`.
#[derive(Clone, Debug, Serialize)]
pub struct CandidateRate {
    /// `packed-avx512`, `gemm-crate`, `matrixmultiply`, …
    pub kernel: String,
    /// Median GFLOP/s.
    pub gflops: f64,
    /// Whether it may be chosen (same summation order as the shape's class).
    pub eligible: bool,
}

/// One product in `tiderec bench kernels`.
#[derive(Clone, Debug, Serialize)]
pub struct ProductReport {
    /// `forward`, `dW` or `dx`.
    pub product: String,
    /// `input->output` of the layer.
    pub layer: String,
    /// `m x n x k` of the product.
    pub mnk: String,
    /// Every candidate timed.
    pub candidates: Vec<CandidateRate>,
    /// What training runs.
    pub chosen: String,
    /// The chosen candidate's GFLOP/s.
    pub chosen_gflops: f64,
}

/// `tiderec bench kernels`.
#[derive(Clone, Debug, Serialize)]
pub struct KernelsReport {
    /// `/proc/cpuinfo`'s model name.
    pub cpu: String,
    /// Vector extensions the kernels may use (the CPU's, under `TIDEREC_MAX_ISA`).
    pub features: Vec<String>,
    /// Extensions the CPU has that `TIDEREC_MAX_ISA` turns off (empty without a cap).
    pub features_off: Vec<String>,
    /// The `TIDEREC_MAX_ISA` cap (`native` when none is set).
    pub max_isa: String,
    /// `features` as the report line shows them, naming the cap when one is set.
    pub features_line: String,
    /// Rows per product (a worker's micro-batch).
    pub rows: usize,
    /// Every product of the model's MLPs.
    pub products: Vec<ProductReport>,
    /// Samples/s that one core could train if the step were only these products on the chosen kernels.
    pub gemm_bound_samples_per_sec: f64,
    /// The same bound under `--precision bf16` (where the CPU runs it), each
    /// product packing both operands from values.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gemm_bound_samples_per_sec_bf16: Option<f64>,
    /// Samples/s one core could train if the step were only the model's MLPs,
    /// forward and backward in fp32 with their layers chained as training runs
    /// them, on the kernels measured here (epilogues, the ReLUs' masks, the
    /// bias gradients and the products' packing included).
    pub mlp_samples_per_sec: f64,
    /// Samples/s one core could train if the step were only the model's MLPs,
    /// forward and backward, under `--precision bf16` with their layers chained
    /// as training runs them (on AMX each product packs its output for the
    /// products that read it next; packing and epilogues included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mlp_samples_per_sec_bf16: Option<f64>,
    /// Flops of the MLP products training computes (forward, dW, and dx where
    /// the layer's input needs a gradient) per sample.
    pub mlp_flops_per_sample: f64,
    /// The core's measured fp32 FMA throughput at each vector width it runs.
    pub fma_peak: Vec<PeakRate>,
    /// Samples/s one core could train if the MLP products ran at the best
    /// width's FMA peak: no fp32 implementation of the step can pass it.
    pub peak_bound_samples_per_sec: f64,
    /// The best packed kernel on a product that stays in cache
    /// ([`fma_peak::IN_CACHE_SHAPE`]): what its loops reach without waiting on memory.
    pub in_cache: InCacheReport,
    /// The core's measured AMX bf16 throughput (GFLOP/s), where AMX runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amx_peak_gflops: Option<f64>,
    /// Samples/s one core could train if the MLP products ran at the AMX bf16
    /// peak: no bf16 implementation of the step on this core can pass it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amx_peak_bound_samples_per_sec: Option<f64>,
}

/// The core's fp32 FMA throughput at one vector width.
#[derive(Clone, Debug, Serialize)]
pub struct PeakRate {
    /// `avx2` or `avx512`.
    pub width: String,
    /// GFLOP/s of the fastest timed call.
    pub gflops: f64,
}

/// The packed kernel's rate on a product that stays in cache.
#[derive(Clone, Debug, Serialize)]
pub struct InCacheReport {
    /// The kernel, named as the products' candidates are (`packed-avx512w`, …).
    pub kernel: String,
    /// `m x n x k` of the product, written as the products write theirs.
    pub mnk: String,
    /// Bytes of its operands (`a`, packed `b`, `c`).
    pub bytes: usize,
    /// GFLOP/s of the fastest timed call.
    pub gflops: f64,
}

/// Times every forward candidate and the backward products of `model`'s
/// layers at `rows` rows, `rounds` alternating rounds of `seconds` each.
pub fn run_kernels(model: &ModelConfig, rows: usize, seconds: f64, rounds: usize) -> KernelsReport {
    let measure = Measure { seconds, rounds, all: true, settle: 0 };
    let mut products = Vec::new();
    let mut step_seconds = 0.0;
    let bf16 = Bf16Kernel::best() != Bf16Kernel::Portable;
    let mut bf16_seconds = 0.0;
    let mut flops = 0.0;
    // The bf16 product of a layer, beside the fp32 candidates (another precision: never chosen).
    let mut bf16_rate = |product: Option<Backward>, input: usize, output: usize| {
        bf16.then(|| {
            let gflops = measure_bf16(product, rows, input, output, measure);
            bf16_seconds += 2.0 * (rows * input * output) as f64 / (gflops * 1e9);
            CandidateRate { kernel: Bf16Kernel::best().name().into(), gflops, eligible: false }
        })
    };
    for (layer, &(input, output)) in model.mlp_layers().iter().enumerate() {
        let shape = ForwardShape { rows, input, output };
        let c = measure_shape(shape, measure);
        install_forward(std::slice::from_ref(&c));
        let chosen_gflops = c.timings.iter().find(|t| t.candidate == c.chosen).map_or(0.0, |t| t.gflops);
        step_seconds += shape.flops() / (chosen_gflops * 1e9);
        flops += shape.flops();
        products.push(ProductReport {
            product: "forward".into(),
            layer: format!("{input}->{output}"),
            mnk: format!("{rows}x{output}x{input}"),
            candidates: c
                .timings
                .iter()
                .map(|t| CandidateRate { kernel: t.candidate.name().into(), gflops: t.gflops, eligible: t.eligible })
                .chain(bf16_rate(None, input, output))
                .collect(),
            chosen: c.chosen.name().into(),
            chosen_gflops,
        });
        // Backward: dW = dyᵀ·x (output × input over rows) and dx = dy·W (rows × input over
        // output), the latter where training computes it.
        let dx = model.mlp_layer_computes_dx(layer);
        for product in [Backward::Dw, Backward::Dx].into_iter().filter(|&p| p == Backward::Dw || dx) {
            let b = measure_backward(BackwardShape { product, rows, input, output }, measure);
            install_backward_choices(std::slice::from_ref(&b));
            let (m, n, k) = b.shape.mnk();
            let chosen_gflops = b.timings.iter().find(|t| t.candidate == b.chosen).map_or(0.0, |t| t.gflops);
            step_seconds += 2.0 * (m * n * k) as f64 / (chosen_gflops * 1e9);
            flops += 2.0 * (m * n * k) as f64;
            products.push(ProductReport {
                product: if product == Backward::Dw { "dW" } else { "dx" }.into(),
                layer: format!("{input}->{output}"),
                mnk: format!("{m}x{n}x{k}"),
                candidates: b
                    .timings
                    .iter()
                    .map(|t| CandidateRate {
                        kernel: t.candidate.name().into(),
                        gflops: t.gflops,
                        eligible: t.eligible,
                    })
                    .chain(bf16_rate(Some(product), input, output))
                    .collect(),
                chosen: b.chosen.name().into(),
                chosen_gflops,
            });
        }
    }
    let fma_peak: Vec<PeakRate> = fma_peak::measure(seconds, rounds)
        .into_iter()
        .map(|r| PeakRate { width: r.width.name().into(), gflops: r.gflops })
        .collect();
    let peak = fma_peak.iter().map(|r| r.gflops).fold(0.0, f64::max);
    let amx_peak_gflops = fma_peak::measure_amx(seconds, rounds);
    let in_cache = fma_peak::measure_in_cache(seconds, rounds);
    let (m, n, k) = fma_peak::IN_CACHE_SHAPE;
    let mlp_flops_per_sample = flops / rows as f64;
    KernelsReport {
        cpu: cpu_model(),
        features: cpu_features().iter().map(|s| s.to_string()).collect(),
        features_off: cpu::turned_off().iter().map(|f| f.name().to_string()).collect(),
        max_isa: cpu::max_isa().name().to_string(),
        features_line: cpu_features_line(),
        rows,
        products,
        gemm_bound_samples_per_sec: rows as f64 / step_seconds,
        gemm_bound_samples_per_sec_bf16: bf16.then(|| rows as f64 / bf16_seconds),
        // The fp32 chain runs on the kernels installed above, as training would choose them.
        mlp_samples_per_sec: rows as f64 / mlp_seconds(model, rows, Precision::Fp32, measure),
        mlp_samples_per_sec_bf16: bf16.then(|| rows as f64 / mlp_seconds(model, rows, Precision::Bf16, measure)),
        mlp_flops_per_sample,
        fma_peak,
        peak_bound_samples_per_sec: peak * 1e9 / mlp_flops_per_sample,
        in_cache: InCacheReport {
            kernel: Candidate::Packed(in_cache.kernel).name().into(),
            mnk: format!("{m}x{n}x{k}"),
            bytes: fma_peak::IN_CACHE_BYTES,
            gflops: in_cache.gflops,
        },
        amx_peak_gflops,
        amx_peak_bound_samples_per_sec: amx_peak_gflops.map(|g| g * 1e9 / mlp_flops_per_sample),
    }
}

/// Seconds of one forward and backward pass through every MLP of `model` at
/// `rows` rows in `precision`, as training chains each MLP's layers (the
/// median of the rounds per MLP).
fn mlp_seconds(model: &ModelConfig, rows: usize, precision: Precision, measure: Measure) -> f64 {
    let mut first_layer = 0;
    let mut seconds = 0.0;
    for stack in model.mlp_stacks() {
        let input_gradient = model.mlp_layer_computes_dx(first_layer);
        first_layer += stack.widths.len() - 1;
        seconds += stack_seconds(&stack, rows, input_gradient, precision, measure);
    }
    seconds
}

/// Seconds of one forward and backward pass through `stack` in `precision`,
/// the input gradient only with `input_gradient`.
fn stack_seconds(stack: &MlpStack, rows: usize, input_gradient: bool, precision: Precision, measure: Measure) -> f64 {
    let mlp = Mlp::new(&stack.widths, 0, stack.relu_last);
    let mut params = vec![0.0f32; mlp.num_params()];
    mlp.init(&mut params, 1, 0);
    let val = |i: usize| ((i.wrapping_mul(7919) % 1000) as f32) * 1e-3 - 0.5;
    let x: Vec<f32> = (0..rows * mlp.input()).map(val).collect();
    let dout: Vec<f32> = (0..rows * mlp.output()).map(|i| val(i + 5)).collect();
    let mut cache = MlpCache::default();
    if cache.set_precision(precision).is_err() {
        // Only asked for where the precision runs (bf16: the report's `bf16` condition).
        return f64::NAN;
    }
    let (mut grads, mut dx) = (vec![0.0f32; params.len()], vec![0.0f32; x.len()]);
    let mut pass = || {
        mlp.forward(&params, &x, rows, &mut cache);
        mlp.backward(&params, &x, rows, &mut cache, &dout, &mut grads, input_gradient.then_some(&mut dx[..]));
    };
    1.0 / median_calls_per_second(measure, &mut pass)
}

/// The report as a table: one row per product, one column per candidate.
pub fn print_kernels(r: &KernelsReport) {
    println!("CPU: {} ({})", r.cpu, r.features_line);
    println!("{} rows; GFLOP/s (median); * = chosen, x = another summation order or precision (never chosen)", r.rows);
    let mut names: Vec<String> = Vec::new();
    for p in &r.products {
        for c in &p.candidates {
            if !names.contains(&c.kernel) {
                names.push(c.kernel.clone());
            }
        }
    }
    print!("{:8} {:10} {:>14}", "product", "layer", "m x n x k");
    for n in &names {
        print!(" {n:>16}");
    }
    println!("  chosen");
    for p in &r.products {
        print!("{:8} {:10} {:>14}", p.product, p.layer, p.mnk);
        for n in &names {
            let cell = p.candidates.iter().find(|c| &c.kernel == n).map_or(String::new(), |c| {
                let mark = if c.kernel == p.chosen {
                    "*"
                } else if c.eligible {
                    " "
                } else {
                    "x"
                };
                format!("{:.1}{mark}", c.gflops)
            });
            print!(" {cell:>16}");
        }
        println!("  {}", p.chosen);
    }
    println!(
        "GEMM bound on one core (these products alone, chosen kernels): {:.0} samples/s",
        r.gemm_bound_samples_per_sec
    );
    let peaks: Vec<String> = r.fma_peak.iter().map(|p| format!("{:.1} GFLOP/s on {}", p.gflops, p.width)).collect();
    println!(
        "fp32 FMA peak of one core: {}; the MLP products ({:.2} MFLOP per sample) at that peak: {:.0} samples/s; \
         the chosen kernels' bound is {:.0}% of it",
        peaks.join(", "),
        r.mlp_flops_per_sample / 1e6,
        r.peak_bound_samples_per_sec,
        100.0 * r.gemm_bound_samples_per_sec / r.peak_bound_samples_per_sec
    );
    let peak = r.fma_peak.iter().map(|p| p.gflops).fold(0.0, f64::max);
    println!(
        "{} on a {} product that stays in cache: {:.1} GFLOP/s, {:.0}% of the FMA peak (its loops without waiting \
         on memory)",
        r.in_cache.kernel,
        r.in_cache.mnk,
        r.in_cache.gflops,
        100.0 * r.in_cache.gflops / peak
    );
    println!(
        "The MLPs in fp32 as training chains their layers on these kernels (forward and backward, epilogues and \
         packing included): {:.0} samples/s ({:.2}x the products one by one)",
        r.mlp_samples_per_sec,
        r.mlp_samples_per_sec / r.gemm_bound_samples_per_sec
    );
    if let Some(bf16) = r.gemm_bound_samples_per_sec_bf16 {
        println!(
            "GEMM bound on one core under --precision bf16: {bf16:.0} samples/s ({:.2}x fp32)",
            bf16 / r.gemm_bound_samples_per_sec
        );
    }
    if let (Some(mlp), Some(bf16)) = (r.mlp_samples_per_sec_bf16, r.gemm_bound_samples_per_sec_bf16) {
        println!(
            "The MLPs under --precision bf16 as training chains their layers (forward and backward, packing and \
             epilogues included): {mlp:.0} samples/s ({:.2}x the products one by one)",
            mlp / bf16
        );
    }
    if let (Some(gflops), Some(bound)) = (r.amx_peak_gflops, r.amx_peak_bound_samples_per_sec) {
        let share = r.gemm_bound_samples_per_sec_bf16.map_or(String::new(), |b| {
            format!("; the bf16 kernels' bound (packing included) is {:.0}% of it", 100.0 * b / bound)
        }) + &r
            .mlp_samples_per_sec_bf16
            .map_or(String::new(), |m| format!(", the chained MLPs {:.0}%", 100.0 * m / bound));
        println!(
            "AMX bf16 peak of one core: {gflops:.1} GFLOP/s; the MLP products at that peak: {bound:.0} samples/s{share}"
        );
    }
}
