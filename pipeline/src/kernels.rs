//! The GEMM kernels of a run, chosen at start-up.
//!
//! [`choose_for_run`] lists a model's MLP products (forward, `dW`, `dx`) at
//! every worker's micro-batch and lets `tiderec_operators::nn::kernel_choice`
//! measure and install a kernel for each (only among kernels whose results are
//! equal bit for bit, so the choice never changes a run's numbers).

use crate::data::micro_batch;
use tiderec_operators::nn::gemm_bf16::Bf16Kernel;
use tiderec_operators::nn::kernel_choice::{
    backward_shapes, choose_backward_kernels, choose_forward_kernels, cpu_features_line, cpu_model, measure_bf16,
    summary, BackwardChoice, ForwardShape, Measure, ShapeChoice,
};
use tiderec_operators::nn::{ModelConfig, Precision};

/// The forward products of `model` at the micro-batches of `batch` over `workers`.
pub fn forward_shapes(model: &ModelConfig, batch: usize, workers: usize) -> Vec<ForwardShape> {
    let mut rows: Vec<usize> = (0..workers.max(1)).map(|w| micro_batch(batch, w, workers.max(1))).collect();
    rows.sort_unstable();
    rows.dedup();
    let layers = model.mlp_layers();
    rows.iter()
        .filter(|&&r| r > 0)
        .flat_map(|&r| layers.iter().map(move |&(input, output)| ForwardShape { rows: r, input, output }))
        .collect()
}

/// The kernels a run chose: forward and backward products.
pub struct RunKernels {
    /// Forward products.
    pub forward: Vec<ShapeChoice>,
    /// Backward products.
    pub backward: Vec<BackwardChoice>,
}

/// Measures and installs the kernels of a run's MLP products (a fraction of a
/// second), returning the choices.
pub fn choose_for_run(model: &ModelConfig, batch: usize, workers: usize) -> RunKernels {
    let shapes = forward_shapes(model, batch, workers);
    RunKernels {
        forward: choose_forward_kernels(&shapes, Measure::STARTUP),
        backward: choose_backward_kernels(&backward_shapes(&shapes), Measure::STARTUP),
    }
}

/// The line `train` and `bench dlrm` print: the CPU, the vector extensions the
/// kernels may use (and the `TIDEREC_MAX_ISA` cap, when one is set) and each product's kernel.
pub fn startup_line(k: &RunKernels) -> String {
    format!("kernels ({}; {}): {}", cpu_model(), cpu_features_line(), summary(&k.forward, &k.backward))
}

/// The start-up line of a run in `precision`: under `fp32` the kernels
/// [`choose_for_run`] measured and installed; under `bf16` the one kernel
/// every MLP product runs on (nothing to choose).
pub fn startup_line_for(model: &ModelConfig, batch: usize, workers: usize, precision: Precision) -> String {
    match precision {
        Precision::Fp32 => startup_line(&choose_for_run(model, batch, workers)),
        Precision::Bf16 => bf16_line(""),
        Precision::Tf32 => gpu_line(precision),
    }
}

/// The start-up line of a run whose workers are all GPU workers: what their GEMMs compute in.
pub fn gpu_line(precision: Precision) -> String {
    let how = match precision {
        Precision::Fp32 => "exact fp32 (cuBLAS pedantic math)",
        Precision::Tf32 => "tf32 operands on tensor cores, fp32 accumulation and storage",
        Precision::Bf16 => "bf16 operands on tensor cores, fp32 accumulation and storage",
    };
    format!("kernels (GPU workers): every GEMM in {} ({how})", precision.name())
}

fn bf16_line(note: &str) -> String {
    format!(
        "kernels ({}; {}): every MLP product {} (bf16 operands, fp32 accumulation{note})",
        cpu_model(),
        cpu_features_line(),
        Bf16Kernel::best().name()
    )
}

/// The precision a run trains in, and its start-up line: `requested`, except
/// where bf16 would run on the AVX-512 BF16 kernel (a CPU without AMX) and is
/// measured slower than fp32 on the run's own MLP products (alternating rounds
/// at start-up, a fraction of a second): bf16 must pay for its rounding, so
/// such a run trains in fp32 and the line says so. On AMX the tile products
/// are several times fp32's speed, and nothing is measured.
pub fn precision_for_run(
    model: &ModelConfig,
    batch: usize,
    workers: usize,
    requested: Precision,
) -> (Precision, String) {
    if requested == Precision::Fp32 || Bf16Kernel::best() != Bf16Kernel::Avx512Bf16 {
        return (requested, startup_line_for(model, batch, workers, requested));
    }
    let kernels = choose_for_run(model, batch, workers);
    let (fp32, bf16) = product_seconds(&kernels);
    let ratio = fp32 / bf16;
    if ratio >= 1.0 {
        return (Precision::Bf16, bf16_line(&format!("; measured {ratio:.2}x fp32 on these products")));
    }
    let line = format!(
        "{}; bf16 ({}) measured {ratio:.2}x fp32 on these products on this CPU, so this run trains in fp32",
        startup_line(&kernels),
        Bf16Kernel::best().name()
    );
    (Precision::Fp32, line)
}

/// Seconds of one pass over the run's MLP products on the chosen fp32 kernels
/// and on the bf16 kernel (operands packed as in training), measured now.
fn product_seconds(k: &RunKernels) -> (f64, f64) {
    let chosen = |timings: &[tiderec_operators::nn::kernel_choice::Timing], c| {
        timings.iter().find(|t| t.candidate == c).map_or(f64::INFINITY, |t| t.gflops)
    };
    let (mut fp32, mut bf16) = (0.0, 0.0);
    for f in &k.forward {
        let s = f.shape;
        fp32 += s.flops() / (chosen(&f.timings, f.chosen) * 1e9);
        bf16 += s.flops() / (measure_bf16(None, s.rows, s.input, s.output, Measure::STARTUP) * 1e9);
    }
    for b in &k.backward {
        let s = b.shape;
        let (m, n, kk) = s.mnk();
        let flops = 2.0 * (m * n * kk) as f64;
        fp32 += flops / (chosen(&b.timings, b.chosen) * 1e9);
        bf16 += flops / (measure_bf16(Some(s.product), s.rows, s.input, s.output, Measure::STARTUP) * 1e9);
    }
    (fp32, bf16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiderec_operators::nn::DlrmConfig;

    /// Batch 129 over two workers is micro-batches of 64 and 65 rows: every
    /// layer at both, nothing at zero rows.
    #[test]
    fn forward_shapes_cover_every_micro_batch() {
        let model = ModelConfig::Dlrm(DlrmConfig::kaggle());
        let shapes = forward_shapes(&model, 129, 2);
        assert_eq!(shapes.len(), 14);
        assert!(shapes.iter().all(|s| s.rows == 64 || s.rows == 65));
        assert!(shapes.contains(&ForwardShape { rows: 65, input: 367, output: 512 }));
        assert!(forward_shapes(&model, 1, 2).iter().all(|s| s.rows == 1));
    }
}
