//! One DLRM forward + backward on the Kaggle shape (dim 16, bottom
//! 13-512-256-64-16, top 512-256-1), the compute part of a training step
//! without the exchanges. `tiderec bench dlrm` measures the whole step.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tiderec_operators::nn::loss::bce_with_logits_grad;
use tiderec_operators::nn::{Dlrm, DlrmConfig};
use tiderec_operators::rng::unit_f64;

fn dlrm_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("dlrm_forward_backward");
    group.sample_size(20);
    for batch in [128usize, 2048] {
        let cfg = DlrmConfig::kaggle();
        let mut model = Dlrm::<f32>::new(cfg.clone(), 1).unwrap();
        let dense: Vec<f32> = (0..batch * 13).map(|i| unit_f64(1, i as u64, 0, 0) as f32 * 3.0).collect();
        let pooled: Vec<f32> = (0..batch * 26 * 16).map(|i| unit_f64(2, i as u64, 0, 0) as f32 - 0.5).collect();
        let labels: Vec<f32> = (0..batch).map(|i| (i % 4 == 0) as u8 as f32).collect();
        let mut dlogits = vec![0.0f32; batch];
        let mut dpooled = vec![0.0f32; pooled.len()];
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_with_input(BenchmarkId::from_parameter(batch), &batch, |b, &batch| {
            b.iter(|| {
                let logits = model.forward(&dense, &pooled, batch).to_vec();
                bce_with_logits_grad(&logits, &labels, 1.0, &mut dlogits);
                model.backward(&dense, &pooled, &dlogits, &mut dpooled);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, dlrm_step);
criterion_main!(benches);
