//! GFLOP/s of DLRM's layer products at one worker's rows (default 1,024, a
//! worker's half of batch 2,048) on the kernels `Linear` chooses between:
//! matrixmultiply for every product, the `gemm` crate (`gemm_nt_acc`) and the
//! packed kernel (`Wᵀ` packed on every call, as in training) for the forward
//! `x·Wᵀ`. Medians of seven alternating rounds, in this thread's CPU time.
//!
//! `cargo bench -p tiderec-nn --bench dlrm_gemm_shapes [-- ROWS]`
use tiderec_nn::gemm::{gemm, gemm_nt_acc, Op};
use tiderec_nn::gemm_packed::{gemm_packed, PackedRhs};

fn cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").expect("Linux schedstat");
    s.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) * 1e-9
}

/// GFLOP/s of `f` (one product of `flops`) over about 0.1 s of CPU time.
fn rate(flops: f64, mut f: impl FnMut()) -> f64 {
    let start = cpu();
    let mut calls = 0;
    while cpu() - start < 0.1 {
        f();
        calls += 1;
    }
    flops * calls as f64 / (cpu() - start) / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` adds `--bench` to the arguments.
    let m: usize = std::env::args().skip(1).find(|a| !a.starts_with("--")).and_then(|s| s.parse().ok()).unwrap_or(1024);
    // (input, output) of the bottom MLP 13-512-256-64-16 and the top MLP 367-512-256.
    let layers = [(13, 512), (512, 256), (256, 64), (64, 16), (367, 512), (512, 256)];
    println!("{m} rows; GFLOP/s, medians of 7 rounds");
    println!("{:10} {:8} {:>15} {:>8} {:>8} {:>8}", "layer", "product", "m x n x k", "mm", "gemm", "packed");
    for &(input, output) in &layers {
        // forward y = x·Wᵀ, weight gradient dW = dyᵀ·x, input gradient dx = dy·W
        let products = [
            ("forward", Op::N, Op::T, m, output, input),
            ("dW", Op::T, Op::N, output, input, m),
            ("dx", Op::N, Op::N, m, input, output),
        ];
        for (name, op_a, op_b, rows, cols, depth) in products {
            let a: Vec<f32> = (0..rows * depth).map(|i| (i % 17) as f32 * 0.1).collect();
            let b: Vec<f32> = (0..depth * cols).map(|i| (i % 13) as f32 * 0.1).collect();
            let mut c = vec![0.0f32; rows * cols];
            let flops = 2.0 * (rows * cols * depth) as f64;
            let mut packed = PackedRhs::default();
            let (mut mm, mut crate_gemm, mut pk) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..7 {
                mm.push(rate(flops, || gemm(op_a, op_b, rows, cols, depth, 1.0, &a, &b, 1.0, &mut c)));
                if name == "forward" {
                    crate_gemm.push(rate(flops, || gemm_nt_acc(rows, cols, depth, &a, &b, &mut c)));
                    pk.push(rate(flops, || {
                        packed.pack(Op::T, depth, cols, &b);
                        gemm_packed(rows, &a, depth, &packed, true, &mut c, cols);
                    }));
                }
            }
            let show = |v: Vec<f64>| if v.is_empty() { String::new() } else { format!("{:.1}", median(v)) };
            println!(
                "{:10} {name:8} {:>15} {:>8.1} {:>8} {:>8}",
                format!("{input}->{output}"),
                format!("{rows}x{cols}x{depth}"),
                median(mm),
                show(crate_gemm),
                show(pk)
            );
        }
    }
}
