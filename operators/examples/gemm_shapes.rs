use tiderec_operators::nn::gemm::{gemm, Op};
use tiderec_operators::nn::gemm_packed::{gemm_packed, PackedRhs};
fn cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    s.split_whitespace().next().unwrap().parse::<f64>().unwrap() * 1e-9
}
fn main() {
    let shapes: &[(&str, Op, Op, usize, usize, usize)] = &[
        ("a gx chunk", Op::N, Op::T, 1024, 108, 36),
        ("b gh step", Op::N, Op::T, 256, 108, 36),
        ("c dh_prev", Op::N, Op::N, 256, 36, 108),
        ("d dW_hh", Op::T, Op::N, 108, 36, 1024),
        ("f dxt", Op::N, Op::N, 1024, 36, 108),
        ("u fwd", Op::N, Op::T, 256, 144, 72),
        ("u dW", Op::T, Op::N, 144, 72, 256),
        ("u dxh", Op::N, Op::N, 256, 72, 144),
        ("gx all", Op::N, Op::T, 12800, 108, 36),
        ("peak", Op::N, Op::N, 600, 16, 2000),
        ("peak96", Op::N, Op::N, 600, 96, 300),
        ("dW all", Op::T, Op::N, 108, 36, 12800),
    ];
    for &(name, oa, ob, m, n, k) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 13) as f32 * 0.1).collect();
        let mut c = vec![0.0f32; m * n];
        let flops = 2.0 * (m * n * k) as f64;
        let t0 = cpu();
        let mut it = 0;
        while cpu() - t0 < 0.3 { for _ in 0..20 { gemm(oa, ob, m, n, k, 1.0, &a, &b, 1.0, &mut c); it += 1; } }
        let g1 = flops * it as f64 / (cpu() - t0) / 1e9;
        let mut g2 = 0.0;
        if oa == Op::N {
            let pk = PackedRhs::new(ob, k, n, &b);
            let t0 = cpu(); let mut it = 0;
            while cpu() - t0 < 0.3 { for _ in 0..20 { gemm_packed(m, &a, k, &pk, true, &mut c, n); it += 1; } }
            g2 = flops * it as f64 / (cpu() - t0) / 1e9;
        }
        println!("{name:12} {m}x{n}x{k}: mm {g1:.1} GF/s small {g2:.1}");
    }
}
