//! The packed GEMM's AVX2 kernel against its AVX-512VL variant (same
//! instructions, thirty-two registers, bigger blocks) on the GRU's products,
//! timed alternately (wall clock, 0.1 s per kernel and round), nine rounds, medians.
//!
//! `cargo bench -p tiderec-operators --bench panel_kernels`
use tiderec_operators::nn::gemm::Op;
use tiderec_operators::nn::gemm_packed::{gemm_packed_with, packed_panel_f32_with, PackedRhs, PanelKernel};

fn now() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
}

fn main() {
    let kernels = PanelKernel::available();
    println!("kernels on this CPU: {kernels:?}");
    let shapes = [
        ("DIEN gx chunk", 640, 96, 32),
        ("DIEN gh step", 64, 96, 32),
        ("DIEN dh_prev", 64, 32, 96),
        ("B256 gx chunk", 512, 108, 36),
        ("B256 gh step", 256, 108, 36),
        ("B256 dh_prev", 256, 36, 108),
        ("unsplit fwd", 256, 144, 72),
        ("unsplit dxh", 256, 72, 144),
    ];
    for (name, m, n, k) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5).collect();
        let packed = PackedRhs::new(Op::N, k, n, &b);
        let mut c = vec![0.0f32; m * n];
        let flops = 2.0 * (m * n * k) as f64;
        let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); kernels.len()];
        for _ in 0..9 {
            for (ki, &kernel) in kernels.iter().enumerate() {
                let (start, mut it) = (now(), 0u64);
                // Check the clock every 64 products.
                while it == 0 || now() - start < 0.1 {
                    for _ in 0..64 {
                        gemm_packed_with(m, &a, k, &packed, false, &mut c, n, |p| packed_panel_f32_with(kernel, p));
                    }
                    it += 64;
                }
                rounds[ki].push(flops * it as f64 / (now() - start) / 1e9);
            }
        }
        let medians: Vec<String> = rounds
            .iter_mut()
            .map(|r| {
                r.sort_by(f64::total_cmp);
                format!("{:6.1}", r[r.len() / 2])
            })
            .collect();
        println!("{name:14} {m:4}x{n:3}x{k:3}  GFLOP/s {}", medians.join("  "));
    }
}
