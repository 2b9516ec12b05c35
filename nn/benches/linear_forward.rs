//! DLRM's fully connected forward `y = x·Wᵀ` (`W` stored `[out × in]`) at a
//! worker's micro-batch: matrixmultiply (packs both operands every call) vs
//! packing `Wᵀ` into panels and `gemm_packed` reading `x` in place, alternated,
//! nine rounds, medians.
//!
//! `cargo bench -p tiderec-nn --bench linear_forward [-- dx]`
//! (`dx`: the backward's input gradient `dx = dy·W` instead).
use tiderec_nn::gemm::{gemm, Op};
use tiderec_nn::gemm_packed::{gemm_packed, PackedRhs};

fn now() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
}

fn main() {
    let layers = [(13, 512), (512, 256), (256, 64), (64, 16), (367, 512), (512, 256), (256, 1)];
    let backward = std::env::args().any(|a| a == "dx");
    for batch in [64usize, 1024] {
        let mut totals = [0.0f64; 3];
        for &(input, output) in &layers {
            let mut x: Vec<f32> = (0..batch * input).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
            let w: Vec<f32> = (0..output * input).map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5).collect();
            let mut y = vec![0.0f32; batch * output];
            let mut packed = PackedRhs::default();
            let mut rounds = [Vec::new(), Vec::new(), Vec::new()];
            for _ in 0..9 {
                for (which, r) in rounds.iter_mut().enumerate() {
                    let (start, mut it) = (now(), 0u32);
                    while it == 0 || now() - start < 0.05 {
                        for _ in 0..8 {
                            match which {
                                0 if backward => gemm(Op::N, Op::N, batch, input, output, 1.0, &y, &w, 0.0, &mut x),
                                0 => gemm(Op::N, Op::T, batch, output, input, 1.0, &x, &w, 0.0, &mut y),
                                1 if backward => packed.pack(Op::N, output, input, &w),
                                1 => packed.pack(Op::T, input, output, &w),
                                _ if backward => {
                                    packed.pack(Op::N, output, input, &w);
                                    gemm_packed(batch, &y, output, &packed, false, &mut x, input);
                                }
                                _ => {
                                    packed.pack(Op::T, input, output, &w);
                                    gemm_packed(batch, &x, input, &packed, false, &mut y, output);
                                }
                            }
                        }
                        it += 8;
                    }
                    r.push((now() - start) / it as f64 * 1e6);
                }
            }
            let med: Vec<f64> = rounds
                .iter_mut()
                .map(|r| {
                    r.sort_by(f64::total_cmp);
                    r[4]
                })
                .collect();
            for (t, m) in totals.iter_mut().zip(&med) {
                *t += m;
            }
            println!(
                "batch {batch:4} {input:3}->{output:3}: matrixmultiply {:7.1} us, pack {:6.1} us, pack+packed {:7.1} us ({:.2}x)",
                med[0],
                med[1],
                med[2],
                med[0] / med[2]
            );
        }
        println!(
            "batch {batch:4} all layers: matrixmultiply {:.1} us, pack+packed {:.1} us ({:.2}x)",
            totals[0],
            totals[2],
            totals[0] / totals[2]
        );
    }
}
