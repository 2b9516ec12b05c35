//! The packed-panel kernels against matrixmultiply on the products they
//! replace: DLRM's fully connected forward at a worker's micro-batch
//! (`y = x·Wᵀ`, `Wᵀ` packed every call, as in training) and the GRU split
//! cell's weight gradient over a chunk of steps (`dW = dGᵀ·x`, nothing packed).
//! Each pair runs in one group, so criterion reports them side by side.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tiderec_nn::gemm::{gemm, Op};
use tiderec_nn::gemm_packed::{gemm_packed, gemm_tn, PackedRhs};
use tiderec_records::rng::unit_f64;

fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n).map(|i| unit_f64(seed, i as u64, 0, 0) as f32 - 0.5).collect()
}

fn linear_forward(c: &mut Criterion) {
    let mut group = c.benchmark_group("linear_forward_64_rows");
    group.sample_size(30);
    let batch = 64;
    for (input, output) in [(512usize, 256usize), (367, 512), (256, 64)] {
        let x = values(batch * input, 1);
        let w = values(output * input, 2);
        let mut y = vec![0.0f32; batch * output];
        let mut packed = PackedRhs::default();
        let shape = format!("{input}x{output}");
        group.throughput(Throughput::Elements((batch * input * output) as u64));
        group.bench_with_input(BenchmarkId::new("matrixmultiply", &shape), &(), |b, _| {
            b.iter(|| gemm(Op::N, Op::T, batch, output, input, 1.0, &x, &w, 0.0, &mut y))
        });
        group.bench_with_input(BenchmarkId::new("packed", &shape), &(), |b, _| {
            b.iter(|| {
                packed.pack(Op::T, input, output, &w);
                gemm_packed(batch, &x, input, &packed, false, &mut y, output);
            })
        });
    }
    group.finish();
}

fn gru_weight_gradient(c: &mut Criterion) {
    let mut group = c.benchmark_group("gru_weight_gradient");
    group.sample_size(30);
    // (rows of a chunk of steps, 3H, I): the DIEN shape and B 256 with H = I = 36.
    for (rows, m, n) in [(640usize, 96usize, 32usize), (1792, 108, 36)] {
        let a = values(rows * m, 3);
        let mut b = values(rows * n, 4);
        b.resize(rows * n + 8, 0.0);
        let mut dw = vec![0.0f32; m * n];
        let shape = format!("{rows}x{m}x{n}");
        group.throughput(Throughput::Elements((rows * m * n) as u64));
        group.bench_with_input(BenchmarkId::new("matrixmultiply", &shape), &(), |bch, _| {
            bch.iter(|| gemm(Op::T, Op::N, m, n, rows, 1.0, &a, &b, 1.0, &mut dw))
        });
        group.bench_with_input(BenchmarkId::new("gemm_tn", &shape), &(), |bch, _| {
            bch.iter(|| gemm_tn(m, n, rows, &a, m, &b, n, true, &mut dw, n))
        });
    }
    group.finish();
}

criterion_group!(benches, linear_forward, gru_weight_gradient);
criterion_main!(benches);
