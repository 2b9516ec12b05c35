//! GFLOP/s of the general GEMM (matrixmultiply) and of the packed-RHS GEMM
//! (`gemm_packed`, right-hand operand packed once outside the timing) on the
//! products of the GRU cells at B 256, 36→36 (`a`–`f` split cell, `u` unsplit
//! cell), in this thread's CPU time. `packed` is blank where the left operand
//! is transposed (weight gradients, which stay on matrixmultiply).
//!
//! `cargo bench -p tiderec-nn --bench gemm_shapes`
use tiderec_nn::gemm::{gemm, Op};
use tiderec_nn::gemm_packed::{gemm_packed, PackedRhs};

fn cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    s.split_whitespace().next().unwrap().parse::<f64>().unwrap() * 1e-9
}

/// GFLOP/s of `f` (one product of `flops`) over about 0.3 s of CPU time.
fn rate(flops: f64, mut f: impl FnMut()) -> f64 {
    let start = cpu();
    let mut calls = 0;
    while cpu() - start < 0.3 {
        for _ in 0..20 {
            f();
        }
        calls += 20;
    }
    flops * calls as f64 / (cpu() - start) / 1e9
}

fn main() {
    let shapes: &[(&str, Op, Op, usize, usize, usize)] = &[
        ("a gx chunk", Op::N, Op::T, 512, 108, 36),
        ("b gh step", Op::N, Op::T, 256, 108, 36),
        ("c dh_prev", Op::N, Op::N, 256, 36, 108),
        ("d dW_hh", Op::T, Op::N, 108, 36, 512),
        ("f dx step", Op::N, Op::N, 256, 36, 108),
        ("u fwd", Op::N, Op::T, 256, 144, 72),
        ("u dW", Op::T, Op::N, 144, 72, 256),
        ("u dxh", Op::N, Op::N, 256, 72, 144),
    ];
    println!("{:12} {:>14} {:>16} {:>8}", "product", "m x n x k", "matrixmultiply", "packed");
    for &(name, op_a, op_b, m, n, k) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 13) as f32 * 0.1).collect();
        let mut c = vec![0.0f32; m * n];
        let flops = 2.0 * (m * n * k) as f64;
        let general = rate(flops, || gemm(op_a, op_b, m, n, k, 1.0, &a, &b, 1.0, &mut c));
        let packed = if op_a == Op::N {
            let rhs = PackedRhs::new(op_b, k, n, &b);
            format!("{:.1}", rate(flops, || gemm_packed(m, &a, k, &rhs, true, &mut c, n)))
        } else {
            String::new()
        };
        println!("{name:12} {:>14} {general:>16.1} {packed:>8}", format!("{m}x{n}x{k}"));
    }
}
