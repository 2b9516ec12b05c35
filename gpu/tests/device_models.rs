//! Device models against their CPU twins: the same configuration and seed
//! give the same flat parameters, and forward and backward on random inputs
//! agree within the conformance tolerance (normwise relative 1e-5) for the
//! logits, every parameter gradient and the pooled vectors' gradient, over
//! several steps with the parameters changed in between (the host copy is
//! uploaded again) and batches of different sizes; DIEN also with behaviour
//! sequences of every length from empty to the padded length. The DES
//! partial forms (LR, FM, DeepFM, Wide & Deep) are compared the same way on
//! random summed partial results.

mod common;

use common::{
    assert_as_accurate, assert_close, assert_close_tensors, device, layer_parts, normal, tensor_parts, uniform,
};
use tiderec_gpu::model;
use tiderec_operators::nn::{DienConfig, DlrmConfig, FmConfig, Interest, Model, ModelConfig, SequenceInput};

fn dlrm(self_interaction: bool) -> ModelConfig {
    ModelConfig::Dlrm(DlrmConfig {
        num_dense: 13,
        num_sparse: 26,
        dim: 16,
        bottom: vec![64, 32, 16],
        top: vec![48, 24, 1],
        self_interaction,
    })
}

fn fm(dim: usize, deep: Vec<usize>, fm: bool, wide_only: usize) -> ModelConfig {
    ModelConfig::Fm(FmConfig { num_dense: 13, num_sparse: 26, dim, deep, fm, wide_only })
}

/// Every model kind with a device form, with a name.
fn models() -> Vec<(&'static str, ModelConfig)> {
    vec![
        ("dlrm", dlrm(false)),
        ("dlrm self-interaction", dlrm(true)),
        ("lr", fm(0, vec![], true, 0)),
        ("lr with crosses", fm(0, vec![], true, 3)),
        ("fm", fm(8, vec![], true, 0)),
        ("deepfm", fm(8, vec![40, 20], true, 0)),
        ("wdl", fm(8, vec![40, 20], false, 0)),
        ("wdl with crosses", fm(8, vec![40, 20], false, 3)),
        ("deepfm without dense", ModelConfig::Fm(FmConfig { num_dense: 0, ..fm_config(8, vec![30], true) })),
    ]
}

fn fm_config(dim: usize, deep: Vec<usize>, fm: bool) -> FmConfig {
    FmConfig { num_dense: 13, num_sparse: 26, dim, deep, fm, wide_only: 0 }
}

/// Gives the fp64 model the fp32 model's parameters.
fn exact_params_from(cpu: &dyn Model<f32>, exact: &mut dyn Model<f64>) {
    for (x, &p) in exact.params_mut().iter_mut().zip(cpu.params()) {
        *x = f64::from(p);
    }
}

/// A host-side update, as the trainer's all-gather does: both models move by
/// the same random step, and the device model uploads its parameters again.
fn move_both(cpu: &mut dyn Model<f32>, gpu: &mut dyn Model<f32>, seed: u64) {
    let delta = normal(seed, cpu.params().len());
    for (p, d) in cpu.params_mut().iter_mut().zip(&delta) {
        *p -= 0.01 * d;
    }
    let (params, _) = gpu.params_and_grads();
    for (p, d) in params.iter_mut().zip(&delta) {
        *p -= 0.01 * d;
    }
    assert_eq!(gpu.params(), cpu.params());
}

/// One forward and backward of both models on the same random inputs,
/// measured against the CPU model in fp64 (`exact`, given the same parameters)
/// layer by layer (see `assert_as_accurate` and `layer_parts`).
fn compare_step(
    what: &str,
    cpu: &mut dyn Model<f32>,
    gpu: &mut dyn Model<f32>,
    exact: &mut dyn Model<f64>,
    c: &ModelConfig,
    batch: usize,
    seed: u64,
) {
    let (nd, f, e) = (c.num_dense(), c.num_sparse(), c.embedding_dim());
    exact_params_from(cpu, exact);
    let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    let dense = uniform(seed, batch * nd, 0.0, 3.0);
    let pooled: Vec<f32> = normal(seed + 1, batch * f * e).iter().map(|v| v * 0.3).collect();
    let want = cpu.forward(&dense, &pooled, batch).to_vec();
    let got = gpu.forward(&dense, &pooled, batch).to_vec();
    let exact_logits = exact.forward(&wide(&dense), &wide(&pooled), batch).to_vec();
    let all = |n: usize| vec![("all".to_string(), 0..n)];
    assert_as_accurate(&format!("{what}, batch {batch}: logits"), &got, &want, &exact_logits, &all(batch));
    let dlogits: Vec<f32> = normal(seed + 2, batch).iter().map(|v| v * 0.5).collect();
    let mut dp_cpu = vec![0.0; pooled.len()];
    let mut dp_gpu = vec![7.0; pooled.len()];
    let mut dp_exact = vec![0.0; pooled.len()];
    cpu.backward(&dense, &pooled, &dlogits, &mut dp_cpu);
    gpu.backward(&dense, &pooled, &dlogits, &mut dp_gpu);
    exact.backward(&wide(&dense), &wide(&pooled), &wide(&dlogits), &mut dp_exact);
    let parts = layer_parts(&c.param_tensors());
    let at = format!("{what}, batch {batch}: gradient");
    assert_as_accurate(&at, gpu.grads(), cpu.grads(), exact.grads(), &parts);
    let at = format!("{what}, batch {batch}: pooled gradients");
    assert_as_accurate(&at, &dp_gpu, &dp_cpu, &dp_exact, &all(dp_cpu.len()));
    assert!(gpu.take_error().is_none(), "{what}: no device error");
}

/// The gradients are compared tensor by tensor along `param_tensors`, which
/// must therefore tile each model's flat buffer (checked without a GPU).
#[test]
fn parameter_tensors_tile_every_flat_buffer() {
    let dien_models = [("dien", dien(Interest::GruAttention)), ("dien-sum", dien(Interest::SumPooling))];
    for (what, config) in models().into_iter().chain(dien_models) {
        let n = config.build::<f32>(9).unwrap().params().len();
        let mut at = 0;
        for t in config.param_tensors() {
            assert_eq!(t.offset, at, "{what}: `{}` starts at {} after {at}", t.name, t.offset);
            at += t.len();
        }
        assert_eq!(at, n, "{what}: the tensors end at {at}, the buffer at {n}");
    }
}

#[test]
fn device_models_match_the_cpu_models() {
    let Some(dev) = device() else { return };
    for (what, config) in models() {
        let mut cpu = config.build::<f32>(9).unwrap();
        let mut exact = config.build::<f64>(9).unwrap();
        let mut gpu = model::build(&config, 9, &dev).unwrap();
        assert_eq!(gpu.params(), cpu.params(), "{what}: the same initial parameters");
        assert_eq!(gpu.embedding_dim(), cpu.embedding_dim());
        let partial = cpu.partial_model().is_some();
        assert_eq!(
            gpu.partial_model().is_some(),
            partial,
            "{what}: a partial form on the device where the CPU has one"
        );
        // 65,536: the largest batch the benchmarks train, grids far past one wave.
        for (step, batch) in [37usize, 1, 128, 65_536, 5].into_iter().enumerate() {
            compare_step(what, cpu.as_mut(), gpu.as_mut(), exact.as_mut(), &config, batch, 100 + step as u64);
            move_both(cpu.as_mut(), gpu.as_mut(), 500 + step as u64);
        }
    }
}

/// One forward and backward of both models' DES partial forms on the same
/// random dense values and summed partial results, measured against the CPU
/// model in fp64 as [`compare_step`] does: the logits, every parameter
/// gradient (the first layer's factor columns zero on every side) and the
/// partial results' gradient, which must be overwritten whole.
fn compare_partial_step(
    what: &str,
    cpu: &mut dyn Model<f32>,
    gpu: &mut dyn Model<f32>,
    exact: &mut dyn Model<f64>,
    c: &ModelConfig,
    batch: usize,
    seed: u64,
) {
    exact_params_from(cpu, exact);
    let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    let width = cpu.partial_model().unwrap().shape().width();
    assert_eq!(gpu.partial_model().unwrap().shape(), cpu.partial_model().unwrap().shape(), "{what}");
    let dense = uniform(seed, batch * c.num_dense(), 0.0, 3.0);
    let partial: Vec<f32> = normal(seed + 1, batch * width).iter().map(|v| v * 0.3).collect();
    let want = cpu.partial_model().unwrap().forward_partial(&dense, &partial, batch).to_vec();
    let got = gpu.partial_model().unwrap().forward_partial(&dense, &partial, batch).to_vec();
    let exact_logits = exact.partial_model().unwrap().forward_partial(&wide(&dense), &wide(&partial), batch).to_vec();
    let all = |n: usize| vec![("all".to_string(), 0..n)];
    assert_as_accurate(&format!("{what}, batch {batch}: partial logits"), &got, &want, &exact_logits, &all(batch));
    let dlogits: Vec<f32> = normal(seed + 2, batch).iter().map(|v| v * 0.5).collect();
    let mut dp_cpu = vec![0.0; partial.len()];
    let mut dp_gpu = vec![7.0; partial.len()];
    let mut dp_exact = vec![0.0; partial.len()];
    cpu.partial_model().unwrap().backward_partial(&dense, &partial, &dlogits, &mut dp_cpu);
    gpu.partial_model().unwrap().backward_partial(&dense, &partial, &dlogits, &mut dp_gpu);
    exact.partial_model().unwrap().backward_partial(&wide(&dense), &wide(&partial), &wide(&dlogits), &mut dp_exact);
    let at = format!("{what}, batch {batch}: partial form's gradient");
    assert_as_accurate(&at, gpu.grads(), cpu.grads(), exact.grads(), &layer_parts(&c.param_tensors()));
    let at = format!("{what}, batch {batch}: partial results' gradients");
    assert_as_accurate(&at, &dp_gpu, &dp_cpu, &dp_exact, &all(dp_cpu.len()));
    assert!(gpu.take_error().is_none(), "{what}: no device error");
}

#[test]
fn device_partial_forms_match_the_cpu_partial_forms() {
    let Some(dev) = device() else { return };
    for (what, config) in models() {
        let mut cpu = config.build::<f32>(9).unwrap();
        if cpu.partial_model().is_none() {
            continue;
        }
        let mut exact = config.build::<f64>(9).unwrap();
        let mut gpu = model::build(&config, 9, &dev).unwrap();
        for (step, batch) in [37usize, 1, 128, 65_536, 5].into_iter().enumerate() {
            compare_partial_step(what, cpu.as_mut(), gpu.as_mut(), exact.as_mut(), &config, batch, 300 + step as u64);
            // A pass of the pooled form between two partial ones: each leaves the other's inputs alone.
            compare_step(what, cpu.as_mut(), gpu.as_mut(), exact.as_mut(), &config, 3, 400 + step as u64);
            move_both(cpu.as_mut(), gpu.as_mut(), 600 + step as u64);
        }
        // An empty batch: no logits, and the gradients of no samples.
        assert!(gpu.partial_model().unwrap().forward_partial(&[], &[], 0).is_empty(), "{what}");
        gpu.partial_model().unwrap().backward_partial(&[], &[], &[], &mut []);
        cpu.partial_model().unwrap().forward_partial(&[], &[], 0);
        cpu.partial_model().unwrap().backward_partial(&[], &[], &[], &mut []);
        assert_eq!(gpu.grads(), cpu.grads(), "{what}: partial form's gradients of an empty batch");
        assert!(gpu.take_error().is_none(), "{what}");
    }
}

#[test]
fn a_backward_of_the_other_form_is_a_reported_error() {
    let Some(dev) = device() else { return };
    let config = fm(8, vec![40, 20], true, 0);
    let (nd, f, e) = (config.num_dense(), config.num_sparse(), config.embedding_dim());
    let batch = 2;
    let width = config.build::<f32>(1).unwrap().partial_model().unwrap().shape().width();
    let (dense, pooled, partial) = (vec![0.5; batch * nd], vec![0.1; batch * f * e], vec![0.1; batch * width]);
    // A pooled forward, then the partial form's backward.
    let mut gpu = model::build(&config, 1, &dev).unwrap();
    gpu.forward(&dense, &pooled, batch);
    let mut dpartial = vec![7.0; partial.len()];
    gpu.partial_model().unwrap().backward_partial(&dense, &partial, &[0.1, 0.2], &mut dpartial);
    let err = gpu.take_error().expect("the unpaired backward is reported");
    assert!(err.contains("without a forward of it"), "{err}");
    assert!(dpartial.iter().all(|&v| v == 0.0) && gpu.grads().iter().all(|&v| v == 0.0));
    // A partial forward, then the pooled form's backward.
    let mut gpu = model::build(&config, 1, &dev).unwrap();
    gpu.partial_model().unwrap().forward_partial(&dense, &partial, batch);
    let mut dpooled = vec![7.0; pooled.len()];
    gpu.backward(&dense, &pooled, &[0.1, 0.2], &mut dpooled);
    let err = gpu.take_error().expect("the unpaired backward is reported");
    assert!(err.contains("without a forward of it"), "{err}");
    assert!(dpooled.iter().all(|&v| v == 0.0) && gpu.grads().iter().all(|&v| v == 0.0));
}

#[test]
fn an_empty_batch_gives_no_logits_and_zero_gradients() {
    let Some(dev) = device() else { return };
    for (what, config) in models() {
        let mut cpu = config.build::<f32>(3).unwrap();
        let mut exact = config.build::<f64>(3).unwrap();
        let mut gpu = model::build(&config, 3, &dev).unwrap();
        compare_step(what, cpu.as_mut(), gpu.as_mut(), exact.as_mut(), &config, 6, 1);
        assert!(gpu.forward(&[], &[], 0).is_empty());
        gpu.backward(&[], &[], &[], &mut []);
        cpu.forward(&[], &[], 0);
        cpu.backward(&[], &[], &[], &mut []);
        assert_eq!(gpu.grads(), cpu.grads(), "{what}: gradients of an empty batch");
        assert!(gpu.take_error().is_none());
    }
}

#[test]
fn too_short_inputs_are_a_reported_error_not_a_panic() {
    let Some(dev) = device() else { return };
    let config = dlrm(false);
    let mut gpu = model::build(&config, 1, &dev).unwrap();
    let logits = gpu.forward(&[0.0; 13], &[0.0; 26 * 16], 2).to_vec();
    assert!(logits.iter().all(|v| v.is_nan()), "{logits:?}");
    let err = gpu.take_error().expect("the short input is reported");
    assert!(err.contains("CUDA device 0") && err.contains("batch of 2"), "{err}");
    // The model stays failed: later passes give NaN without touching the device.
    assert!(gpu.forward(&[0.0; 13], &[0.0; 26 * 16], 1)[0].is_nan());
}

fn dien(interest: Interest) -> ModelConfig {
    ModelConfig::Dien(DienConfig {
        num_dense: 3,
        num_sparse: 4,
        dim: 6,
        num_sequences: 2,
        target_fields: vec![1, 3],
        max_len: 7,
        interest,
        mlp: vec![20, 10],
    })
}

/// One forward and backward with behaviour sequences (lengths 0 to `steps`, padding zero).
#[allow(clippy::too_many_arguments)]
fn compare_sequences(
    what: &str,
    cpu: &mut dyn Model<f32>,
    gpu: &mut dyn Model<f32>,
    c: &ModelConfig,
    batch: usize,
    steps: usize,
    seed: u64,
) {
    let (nd, f, d) = (c.num_dense(), c.num_sparse(), c.embedding_dim());
    let e = c.num_sequences() * d;
    let dense = uniform(seed, batch * nd, 0.0, 3.0);
    let pooled: Vec<f32> = normal(seed + 1, batch * f * d).iter().map(|v| v * 0.3).collect();
    let lengths: Vec<usize> =
        (0..batch).map(|b| if steps == 0 { 0 } else { (b * 5 + seed as usize) % (steps + 1) }).collect();
    let mut rows: Vec<f32> = normal(seed + 3, batch * steps * e).iter().map(|v| v * 0.3).collect();
    for (b, &len) in lengths.iter().enumerate() {
        rows[(b * steps + len) * e..(b + 1) * steps * e].fill(0.0);
    }
    let seq = SequenceInput { rows: &rows, lengths: &lengths, steps };
    let want = cpu.forward_sequences(&dense, &pooled, &seq, batch).to_vec();
    let got = gpu.forward_sequences(&dense, &pooled, &seq, batch).to_vec();
    let at = format!("{what}, batch {batch}, {steps} steps");
    assert_close(&format!("{at}: logits"), &got, &want);
    let dlogits: Vec<f32> = normal(seed + 2, batch).iter().map(|v| v * 0.5).collect();
    let (mut dp_cpu, mut dp_gpu) = (vec![0.0; pooled.len()], vec![7.0; pooled.len()]);
    let (mut ds_cpu, mut ds_gpu) = (vec![0.0; rows.len()], vec![7.0; rows.len()]);
    cpu.backward_sequences(&dense, &pooled, &seq, &dlogits, &mut dp_cpu, &mut ds_cpu);
    gpu.backward_sequences(&dense, &pooled, &seq, &dlogits, &mut dp_gpu, &mut ds_gpu);
    assert_close_tensors(&format!("{at}: gradient"), gpu.grads(), cpu.grads(), &tensor_parts(&c.param_tensors()));
    assert_close(&format!("{at}: pooled gradients"), &dp_gpu, &dp_cpu);
    assert_close(&format!("{at}: sequence gradients"), &ds_gpu, &ds_cpu);
    assert!(gpu.take_error().is_none(), "{at}: no device error");
}

#[test]
fn device_dien_matches_the_cpu_dien() {
    let Some(dev) = device() else { return };
    for (what, config) in [("dien", dien(Interest::GruAttention)), ("dien-sum", dien(Interest::SumPooling))] {
        let mut cpu = config.build::<f32>(4).unwrap();
        let mut gpu = model::build(&config, 4, &dev).unwrap();
        assert_eq!(gpu.params(), cpu.params(), "{what}: the same initial parameters");
        for (i, (batch, steps)) in [(9usize, 7usize), (1, 3), (33, 5), (4, 0)].into_iter().enumerate() {
            compare_sequences(what, cpu.as_mut(), gpu.as_mut(), &config, batch, steps, 40 + i as u64);
            let delta = normal(700 + i as u64, cpu.params().len());
            for ((c, g), d) in cpu.params_mut().iter_mut().zip(gpu.params_mut().iter_mut()).zip(&delta) {
                *c -= 0.01 * d;
                *g -= 0.01 * d;
            }
        }
        // Without sequences every history is empty.
        let mut exact = config.build::<f64>(4).unwrap();
        compare_step(what, cpu.as_mut(), gpu.as_mut(), exact.as_mut(), &config, 6, 90);
    }
}
