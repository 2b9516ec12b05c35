//! The device layers against their CPU implementations in
//! `tiderec-operators`, on odd shapes and one-row batches (see `common` for
//! the error measure). Without a GPU every test prints why it skips.

mod common;

use common::{assert_close, assert_close_tensors, device, get, normal, put, tensor_parts, uniform, weight_and_bias};
use tiderec_gpu::nn;
use tiderec_operators::nn as cpu;

#[test]
fn linear_forward_and_backward_match_the_cpu() {
    let Some(dev) = device() else { return };
    for (input, output, batch, offset) in [(5, 3, 1, 0), (37, 19, 7, 3), (16, 64, 33, 1), (130, 257, 5, 0)] {
        for relu in [false, true] {
            let shape = cpu::linear::Linear { input, output, offset };
            let total = offset + shape.num_params() + 2;
            let mut params = normal(1, total);
            shape.init(&mut params, 2, 0);
            let x = normal(3, batch * input);
            let dy = normal(4, batch * output);
            let mut y = vec![0.0f32; batch * output];
            shape.forward(&params, &x, batch, (&mut y, relu), &mut cpu::gemm_packed::PackedRhs::default());
            let mut grads = vec![0.0f32; total];
            let mut dx = vec![0.0f32; batch * input];
            shape.backward(
                &params,
                &x,
                &dy,
                batch,
                &mut grads,
                Some((&mut dx, false)),
                &mut cpu::gemm_packed::PackedRhs::default(),
            );

            let layer = nn::linear::Linear { input, output, offset };
            let (p, xd, dyd) = (put(&dev, &params), put(&dev, &x), put(&dev, &dy));
            let mut yd = dev.zeros::<f32>(batch * output).unwrap();
            layer.forward(&dev, &p, &xd, batch, relu, &mut yd).unwrap();
            let what = format!("linear {input}->{output} batch {batch} relu {relu}");
            assert_close(&format!("{what} y"), &get(&dev, &yd, batch * output), &y);
            let mut gd = dev.zeros::<f32>(total).unwrap();
            let mut dxd = dev.zeros::<f32>(batch * input).unwrap();
            layer.backward(&dev, &p, &xd, &dyd, batch, &mut gd, Some(&mut dxd)).unwrap();
            let range = offset..offset + shape.num_params();
            assert_close_tensors(
                &what,
                &get(&dev, &gd, total)[..range.end],
                &grads[..range.end],
                &weight_and_bias(offset, input, output),
            );
            assert_close(&format!("{what} dx"), &get(&dev, &dxd, batch * input), &dx);
        }
    }
}

#[test]
fn mlp_forward_and_backward_match_the_cpu() {
    let Some(dev) = device() else { return };
    for (widths, batch, relu_last) in
        [(vec![13, 31, 7, 1], 9, false), (vec![4, 6, 5, 2], 1, true), (vec![27, 64, 33], 65, true)]
    {
        let mlp = cpu::mlp::Mlp::new(&widths, 2, relu_last);
        let total = 2 + mlp.num_params();
        let mut params = normal(5, total);
        mlp.init(&mut params, 6, 1);
        let x = normal(7, batch * widths[0]);
        let out_w = *widths.last().unwrap();
        let dout = normal(8, batch * out_w);
        let mut cache = cpu::mlp::MlpCache::default();
        let y = mlp.forward(&params, &x, batch, &mut cache).to_vec();
        let mut grads = vec![0.0f32; total];
        let mut dx = vec![0.0f32; x.len()];
        mlp.backward(&params, &x, batch, &mut cache, &dout, &mut grads, Some(&mut dx));

        let dmlp = nn::linear::Mlp::new(&widths, 2, relu_last);
        assert_eq!(dmlp.num_params(), mlp.num_params());
        let (p, xd, dd) = (put(&dev, &params), put(&dev, &x), put(&dev, &dout));
        let mut dcache = nn::linear::MlpCache::default();
        // The cache serves a larger batch first: the pass below reuses its buffers,
        // which then hold that batch's values.
        let big = 3 * batch + 1;
        let (xb, db) = (put(&dev, &normal(11, big * widths[0])), put(&dev, &normal(12, big * out_w)));
        dmlp.forward(&dev, &p, &xb, big, &mut dcache).unwrap();
        let mut gb = dev.zeros::<f32>(total).unwrap();
        dmlp.backward(&dev, &p, &xb, &mut dcache, &db, &mut gb, None).unwrap();
        dmlp.forward(&dev, &p, &xd, batch, &mut dcache).unwrap();
        let what = format!("mlp {widths:?} batch {batch}");
        assert_close(&format!("{what} y"), &get(&dev, dcache.output().unwrap(), batch * out_w), &y);
        let mut gd = dev.zeros::<f32>(total).unwrap();
        let mut dxd = dev.zeros::<f32>(x.len()).unwrap();
        dmlp.backward(&dev, &p, &xd, &mut dcache, &dd, &mut gd, Some(&mut dxd)).unwrap();
        let parts = tensor_parts(&cpu::named::mlp_tensors("mlp", &mlp));
        assert_close_tensors(&what, &get(&dev, &gd, total), &grads, &parts);
        assert_close(&format!("{what} dx"), &get(&dev, &dxd, x.len()), &dx);
    }
}

#[test]
fn dot_interaction_matches_the_cpu_with_and_without_self_interaction() {
    let Some(dev) = device() else { return };
    for (num_sparse, dim, batch) in [(1, 4, 1), (3, 16, 5), (26, 16, 33), (8, 5, 3), (39, 12, 2)] {
        for self_interaction in [false, true] {
            let it = cpu::interaction::DotInteraction { num_sparse, dim, self_interaction };
            let od = it.output_dim();
            let dense = normal(9, batch * dim);
            let pooled = normal(10, batch * num_sparse * dim);
            let dout = normal(11, batch * od);
            let mut out = vec![0.0f32; batch * od];
            it.forward_reference(&dense, &pooled, batch, &mut out);
            let (mut dd, mut dp) = (vec![0.0f32; dense.len()], vec![0.0f32; pooled.len()]);
            it.backward(&dense, &pooled, &dout, batch, &mut dd, &mut dp);

            let dit = nn::interaction::DotInteraction::new(&dev, num_sparse, dim, self_interaction).unwrap();
            assert_eq!(dit.output_dim(), od);
            let (de, po, go) = (put(&dev, &dense), put(&dev, &pooled), put(&dev, &dout));
            let mut outd = dev.zeros::<f32>(batch * od).unwrap();
            dit.forward(&dev, &de, &po, batch, &mut outd).unwrap();
            let what = format!("interaction F{num_sparse} d{dim} b{batch} self {self_interaction}");
            assert_close(&format!("{what} out"), &get(&dev, &outd, batch * od), &out);
            let mut ddd = dev.zeros::<f32>(dense.len()).unwrap();
            let mut dpd = dev.zeros::<f32>(pooled.len()).unwrap();
            dit.backward(&dev, &de, &po, &go, batch, &mut ddd, &mut dpd).unwrap();
            assert_close(&format!("{what} ddense"), &get(&dev, &ddd, dense.len()), &dd);
            assert_close(&format!("{what} dpooled"), &get(&dev, &dpd, pooled.len()), &dp);
        }
    }
}

#[test]
fn fm_term_matches_the_cpu() {
    let Some(dev) = device() else { return };
    for (num_fields, dim, stride, offset, batch) in [(4, 3, 5, 1, 2), (39, 16, 17, 1, 31), (2, 1, 1, 0, 1)] {
        let fm = cpu::fm::FmInteraction { num_fields, dim, stride, offset };
        let rows = normal(12, batch * num_fields * stride);
        let dout = normal(13, batch);
        let mut out = vec![0.0f32; batch];
        fm.forward(&rows, batch, &mut out);
        // The backward adds: start both sides from the same non-zero gradient.
        let start = normal(14, rows.len());
        let mut drows = start.clone();
        fm.backward(&rows, &dout, batch, &mut drows);

        let dfm = nn::fm::FmInteraction { num_fields, dim, stride, offset };
        let (r, g) = (put(&dev, &rows), put(&dev, &dout));
        let mut scratch = dev.zeros::<f32>(batch * dim).unwrap();
        let mut outd = dev.zeros::<f32>(batch).unwrap();
        dfm.forward(&dev, &r, batch, &mut scratch, &mut outd).unwrap();
        let what = format!("fm F{num_fields} k{dim} b{batch}");
        assert_close(&format!("{what} out"), &get(&dev, &outd, batch), &out);
        let mut dr = put(&dev, &start);
        dfm.backward(&dev, &r, &g, batch, &mut dr).unwrap();
        assert_close(&format!("{what} drows"), &get(&dev, &dr, rows.len()), &drows);
    }
}

/// One device cache serves every shape in turn, as a model's serves its
/// batches: its buffers are reused uncleared, so a shape that fits after a
/// smaller one (the fourth case after the second) reads none of the values
/// the smaller one left behind.
#[test]
fn gru_forward_and_backward_through_time_match_the_cpu() {
    let Some(dev) = device() else { return };
    let mut dcache = nn::gru::GruCache::default();
    for (input, hidden, batch, steps, lengths) in [
        (3, 4, 3, 4, vec![4usize, 2, 0]),
        (1, 1, 1, 3, vec![3]),
        (18, 36, 5, 7, vec![7, 1, 0, 5, 7]),
        (3, 4, 3, 4, vec![1, 4, 3]),
        (9, 12, 1, 5, vec![2]),
    ] {
        let gru = cpu::gru::Gru { input, hidden, offset: 1 };
        let total = 1 + gru.num_params();
        let mut params = vec![0.0f32; total];
        gru.init(&mut params, 15, 0);
        let x = normal(16, batch * steps * input);
        let dstates = normal(17, steps * batch * hidden);
        let mut cache = cpu::gru::GruCache::default();
        gru.forward(&params, &x, &lengths, batch, steps, &mut cache);
        let mut grads = vec![0.0f32; total];
        let mut dx = vec![0.0f32; x.len()];
        gru.backward(&params, &x, &lengths, &cache, &dstates, &mut grads, &mut dx);

        let dgru = nn::gru::Gru { input, hidden, offset: 1 };
        let lens: Vec<u32> = lengths.iter().map(|&l| l as u32).collect();
        let (p, xd, ld, dsd) = (put(&dev, &params), put(&dev, &x), put(&dev, &lens), put(&dev, &dstates));
        dgru.forward(&dev, &p, &xd, &ld, batch, steps, &mut dcache).unwrap();
        let what = format!("gru {input}->{hidden} b{batch} T{steps}");
        let n_states = (steps + 1) * batch * hidden;
        assert_close(
            &format!("{what} states"),
            &get(&dev, dcache.states.as_ref().unwrap(), n_states),
            &cache.states[..n_states],
        );
        let mut gd = dev.zeros::<f32>(total).unwrap();
        let mut dxd = dev.zeros::<f32>(x.len()).unwrap();
        dgru.backward(&dev, &p, &xd, &ld, &mut dcache, &dsd, &mut gd, &mut dxd).unwrap();
        assert_close(&format!("{what} grads"), &get(&dev, &gd, total)[1..], &grads[1..]);
        assert_close(&format!("{what} dx"), &get(&dev, &dxd, x.len()), &dx);
    }
}

/// As for the GRU, one device cache serves every shape in turn.
#[test]
fn attention_pooling_matches_the_cpu() {
    let Some(dev) = device() else { return };
    let mut dcache = nn::attention::AttentionCache::default();
    for (dim, batch, steps, lengths) in [
        (3, 3, 4, vec![4usize, 1, 0]),
        (18, 6, 11, vec![11, 0, 3, 20, 1, 7]),
        (1, 1, 1, vec![1]),
        (3, 3, 4, vec![0, 2, 4]),
    ] {
        let att = cpu::attention::AttentionPooling { dim, offset: 2 };
        let total = 2 + att.num_params();
        let params = uniform(18, total, -0.5, 0.5);
        let q = normal(19, batch * dim);
        let k = normal(20, batch * steps * dim);
        let dout = normal(21, batch * dim);
        let mut cache = cpu::attention::AttentionCache::default();
        let mut out = vec![0.0f32; batch * dim];
        att.forward(&params, &q, &k, &lengths, batch, steps, &mut out, &mut cache);
        let mut grads = vec![0.0f32; total];
        let (mut dq, mut dk) = (vec![0.0f32; q.len()], vec![0.0f32; k.len()]);
        att.backward(&params, &q, &k, &lengths, batch, steps, &dout, &cache, &mut grads, &mut dq, &mut dk);

        let datt = nn::attention::AttentionPooling { dim, offset: 2 };
        let lens: Vec<u32> = lengths.iter().map(|&l| l as u32).collect();
        let (p, qd, kd, ld, gd_out) =
            (put(&dev, &params), put(&dev, &q), put(&dev, &k), put(&dev, &lens), put(&dev, &dout));
        let mut outd = dev.zeros::<f32>(batch * dim).unwrap();
        datt.forward(&dev, &p, &qd, &kd, &ld, batch, steps, &mut outd, &mut dcache).unwrap();
        let what = format!("attention d{dim} b{batch} T{steps}");
        assert_close(&format!("{what} out"), &get(&dev, &outd, batch * dim), &out);
        let mut gd = dev.zeros::<f32>(total).unwrap();
        let (mut dqd, mut dkd) = (dev.zeros::<f32>(q.len()).unwrap(), dev.zeros::<f32>(k.len()).unwrap());
        datt.backward(&dev, &p, &qd, &kd, &ld, &gd_out, &mut dcache, &mut gd, &mut dqd, &mut dkd).unwrap();
        assert_close(&format!("{what} dW"), &get(&dev, &gd, total)[2..], &grads[2..]);
        assert_close(&format!("{what} dquery"), &get(&dev, &dqd, q.len()), &dq);
        assert_close(&format!("{what} dkeys"), &get(&dev, &dkd, k.len()), &dk);
    }
}

#[test]
fn bce_with_logits_matches_the_cpu() {
    let Some(dev) = device() else { return };
    for n in [1usize, 7, 1000, 4099] {
        let mut logits = normal(22, n);
        for (i, l) in logits.iter_mut().enumerate() {
            if i % 97 == 3 {
                *l *= 60.0; // far into both tails
            }
        }
        let labels: Vec<f32> = (0..n).map(|i| common::below(23, i, 2) as f32).collect();
        let scale = 1.0 / n as f32;
        let want_sum = cpu::loss::bce_with_logits_sum(&logits, &labels);
        let mut want_grad = vec![0.0f32; n];
        cpu::loss::bce_with_logits_grad(&logits, &labels, scale, &mut want_grad);
        let (l, y) = (put(&dev, &logits), put(&dev, &labels));
        let got_sum = nn::loss::bce_sum(&dev, &l, &y, n).unwrap();
        let mut g = dev.zeros::<f32>(n).unwrap();
        nn::loss::bce_grad(&dev, &l, &y, n, scale, &mut g).unwrap();
        let e = (got_sum - want_sum).abs() / want_sum.abs();
        println!("bce n{n} sum: relative error {e:.3e}");
        assert!(e <= 1e-12, "bce sum {got_sum} vs {want_sum}");
        assert_close(&format!("bce n{n} grad"), &get(&dev, &g, n), &want_grad);
    }
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let Some(dev) = device() else { return };
    let layer = nn::linear::Linear { input: 4, output: 3, offset: 0 };
    let p = dev.zeros::<f32>(layer.num_params()).unwrap();
    let x = dev.zeros::<f32>(4 * 2).unwrap();
    let mut y = dev.zeros::<f32>(3 * 2).unwrap();
    let err = layer.forward(&dev, &p, &x, 3, false, &mut y).unwrap_err();
    assert!(matches!(err, tiderec_gpu::GpuError::Shape { .. }), "{err:?}");
    assert!(err.to_string().contains("`x` holds 8 values, 12 needed"), "{err}");
    let short = dev.zeros::<f32>(5).unwrap();
    assert!(layer.forward(&dev, &short, &x, 2, false, &mut y).is_err());
    let fm = nn::fm::FmInteraction { num_fields: 2, dim: 4, stride: 3, offset: 0 };
    let rows = dev.zeros::<f32>(64).unwrap();
    let (mut s, mut o) = (dev.zeros::<f32>(64).unwrap(), dev.zeros::<f32>(4).unwrap());
    assert!(fm.forward(&dev, &rows, 2, &mut s, &mut o).unwrap_err().to_string().contains("does not fit rows"));
}

/// `Device::with_precision`: exact fp32 stays exact; tf32 and bf16 products
/// carry the error of rounding their operands to 10 and 7 mantissa bits
/// (unit roundoffs 2⁻¹¹ and 2⁻⁸), which shows they ran on the tensor cores,
/// and no more; a bf16 product is the exact product of the operands rounded
/// to nearest bf16 (ties to even), up to fp32 accumulation; odd row strides
/// (staged into aligned rows) give the same; and the device a reduced one
/// was made from stays exact.
#[test]
fn reduced_precision_gemms_round_their_operands_and_nothing_else() {
    use tiderec_operators::nn::Precision;
    let Some(dev) = device() else { return };
    let (m, n, k) = (257, 130, 512);
    let (a, b) = (normal(41, m * k), normal(42, k * n));
    let product = |round: fn(f32) -> f32| {
        let mut c = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| f64::from(round(a[i * k + p])) * f64::from(round(b[p * n + j]))).sum();
            }
        }
        c
    };
    let (exact, of_bf16) = (product(|x| x), product(common::round_bf16));
    // C = A·B with the operands stored at row strides `lda`, `ldb` (odd ones are staged).
    let run = |d: &tiderec_gpu::Device, (lda, ldb): (usize, usize)| {
        let widen = |v: &[f32], rows: usize, cols: usize, ld: usize| {
            let mut w = vec![0.0f32; rows * ld];
            for r in 0..rows {
                w[r * ld..r * ld + cols].copy_from_slice(&v[r * cols..(r + 1) * cols]);
            }
            w
        };
        let (ad, bd) = (put(d, &widen(&a, m, k, lda)), put(d, &widen(&b, k, n, ldb)));
        let mut cd = d.zeros::<f32>(m * n).unwrap();
        let ops = (tiderec_gpu::Op::N, tiderec_gpu::Op::N);
        tiderec_gpu::gemm(d, "test", ops, (m, n, k), &ad, lda, &bd, ldb, 0.0, &mut cd, n).unwrap();
        get(d, &cd, m * n)
    };
    let err = |c: &[f32]| common::rel_err_exact(c, &exact);
    let tf32 = dev.clone().with_precision(Precision::Tf32).unwrap();
    let bf16 = dev.clone().with_precision(Precision::Bf16).unwrap();
    let plain = (k, n);
    let (e32, etf, ebf) = (err(&run(&dev, plain)), err(&run(&tf32, plain)), err(&run(&bf16, plain)));
    let again = err(&run(&dev, plain));
    let (etf_odd, bf16_odd) = (err(&run(&tf32, (k + 1, n + 3))), run(&bf16, (k + 3, n + 1)));
    let ebf_exact = common::rel_err_exact(&run(&bf16, plain), &of_bf16);
    println!(
        "gemm {m}x{k}x{n}: normwise error fp32 {e32:.2e}, tf32 {etf:.2e} (odd strides {etf_odd:.2e}), bf16 {ebf:.2e}; \
         bf16 against the product of bf16-rounded operands {ebf_exact:.2e}"
    );
    assert_eq!(
        (tf32.precision(), bf16.precision(), dev.precision()),
        (Precision::Tf32, Precision::Bf16, Precision::Fp32)
    );
    assert!(e32 <= 1e-6 && again == e32, "fp32: {e32:.2e}, after the others {again:.2e}");
    assert!(etf > 2e-5 && etf < 2e-3, "tf32: {etf:.2e} is not a TF32 product's error");
    assert!(ebf > 2e-4 && ebf < 1.6e-2 && ebf > 2.0 * etf, "bf16: {ebf:.2e} is not a bf16 product's error");
    assert!(ebf_exact <= 1e-5, "bf16: {ebf_exact:.2e} from the product of bf16-rounded operands");
    assert!(etf_odd > 2e-5 && etf_odd < 2e-3, "tf32 with odd strides: {etf_odd:.2e}");
    assert_eq!(bf16_odd, run(&bf16, plain), "bf16: staged odd strides change the product");
}
