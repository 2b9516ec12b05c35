//! What the conformance tests share: the one decision whether they can run,
//! deterministic random data, and the error measures.
//!
//! **Error measure.** A device result `got` is compared with the CPU's `want`
//! (both fp32, the same inputs) by the normwise relative error in the max
//! norm, `max_i |got_i − want_i| / max_i |want_i|` (0 when both are all zero),
//! and must be at most [`TOLERANCE`] = 1e-5. Element-wise relative error is
//! not used: sums that cancel to near zero differ by reassociation alone.
#![allow(dead_code)]

use std::ops::Range;
use tiderec_gpu::cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use tiderec_gpu::{CudaSlice, Device};
use tiderec_operators::rng::normal_f64;

/// The largest normwise relative error a device result may have.
pub const TOLERANCE: f64 = 1e-5;

/// The device to test on, or `None` after printing why the test skips.
/// With `TIDEREC_REQUIRE_GPU=1` a missing device is a failure instead. (CI
/// has no GPU: under `CI=true` alone these tests skip.)
pub fn device() -> Option<Device> {
    match Device::open(0) {
        Ok(d) => Some(d),
        Err(e) => {
            if std::env::var("TIDEREC_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("TIDEREC_REQUIRE_GPU=1 but the GPU cannot be used: {e}");
            }
            eprintln!("skipping: {e}");
            None
        }
    }
}

/// `n` standard normal values, deterministic in `seed`.
pub fn normal(seed: u64, n: usize) -> Vec<f32> {
    (0..n).map(|i| normal_f64(seed, 17, i as u64, 0) as f32).collect()
}

/// `n` values uniform in `[lo, hi)` from `seed`.
pub fn uniform(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|i| lo + (hi - lo) * tiderec_operators::rng::unit_f64(seed, 23, i as u64, 0) as f32).collect()
}

/// An integer in `[0, bound)` from `(seed, i)`.
pub fn below(seed: u64, i: usize, bound: usize) -> usize {
    ((tiderec_operators::rng::unit_f64(seed, 29, i as u64, 0) * bound as f64) as usize).min(bound - 1)
}

/// The normwise relative error of `got` against `want`.
pub fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    rel_err_exact(got, &want.iter().map(|&w| f64::from(w)).collect::<Vec<f64>>())
}

/// Asserts `got` matches `want` within [`TOLERANCE`] and prints the error.
pub fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert!(got.iter().all(|v| v.is_finite()), "{what}: non-finite device values");
    let e = rel_err(got, want);
    println!("{what}: relative error {e:.3e} over {} values", want.len());
    assert!(e <= TOLERANCE, "{what}: relative error {e:.3e} > {TOLERANCE:e}");
}

/// Asserts every named part of `got` matches the same part of `want` within
/// [`TOLERANCE`], each measured against its own scale, so a small tensor's
/// error is not hidden behind a large one's. The parts must tile
/// `want[parts[0].start..]` in order, to its end.
pub fn assert_close_tensors(what: &str, got: &[f32], want: &[f32], parts: &[(String, Range<usize>)]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let mut at = parts.first().map_or(want.len(), |p| p.1.start);
    for (name, range) in parts {
        assert_eq!(range.start, at, "{what}: `{name}` does not start where the previous part ended");
        assert_close(&format!("{what}: {name}"), &got[range.clone()], &want[range.clone()]);
        at = range.end;
    }
    assert_eq!(at, want.len(), "{what}: the parts end at {at}, the buffer at {}", want.len());
}

/// The normwise relative error of the fp32 `got` against the exact (fp64) `exact`.
pub fn rel_err_exact(got: &[f32], exact: &[f64]) -> f64 {
    assert_eq!(got.len(), exact.len(), "lengths differ");
    let scale = exact.iter().fold(0.0f64, |m, &v| m.max(v.abs()));
    let diff = got.iter().zip(exact).fold(0.0f64, |m, (&g, &w)| m.max((g as f64 - w).abs()));
    if diff == 0.0 {
        0.0
    } else if scale == 0.0 {
        f64::INFINITY
    } else {
        diff / scale
    }
}

/// Asserts that the device's fp32 result `got` is as accurate as the CPU's fp32
/// result `cpu`, both measured against the exact result `exact` (the CPU model
/// in fp64 on the same inputs) part by part: within [`TOLERANCE`] of it, or,
/// where the CPU's own fp32 error is larger, within 4 times that error (another
/// summation order of the same reductions). Reductions over tens of thousands
/// of samples are not exact to 1e-5 in fp32 on either side: the CPU's own
/// gradient of DeepFM's last layer at batch 65,536 is 1.1e-5 from the exact one.
pub fn assert_as_accurate(what: &str, got: &[f32], cpu: &[f32], exact: &[f64], parts: &[(String, Range<usize>)]) {
    assert!(got.iter().all(|v| v.is_finite()), "{what}: non-finite device values");
    for (name, r) in parts {
        let (e_dev, e_cpu) =
            (rel_err_exact(&got[r.clone()], &exact[r.clone()]), rel_err_exact(&cpu[r.clone()], &exact[r.clone()]));
        let bound = TOLERANCE.max(4.0 * e_cpu);
        println!("{what}: {name}: relative error {e_dev:.3e} over {} values (the CPU's fp32: {e_cpu:.3e})", r.len());
        assert!(
            e_dev <= bound,
            "{what}: {name}: relative error {e_dev:.3e} > {bound:.3e} (the CPU's fp32: {e_cpu:.3e})"
        );
    }
}

/// The layers of a parameter list as `(stem, range)` parts: tensors named
/// `stem.weight` and `stem.bias` form one part (a bias gradient is the batch
/// reduction of its weight's with input 1, so it is measured at its layer's
/// scale, not alone: alone, a bias gradient that cancels to near zero has no
/// scale to be relative to), any other tensor is a part of its own.
pub fn layer_parts(tensors: &[tiderec_operators::nn::ParamTensor]) -> Vec<(String, Range<usize>)> {
    let stem = |n: &str| n.rsplit_once('.').map_or(n, |p| p.0).to_string();
    let mut parts: Vec<(String, Range<usize>)> = Vec::new();
    for t in tensors {
        let s = stem(&t.name);
        match parts.last_mut() {
            Some((last, r)) if *last == s && r.end == t.range().start => r.end = t.range().end,
            _ => parts.push((s, t.range())),
        }
    }
    parts
}

/// The named tensors of a flat parameter buffer as `(name, range)` parts.
pub fn tensor_parts(tensors: &[tiderec_operators::nn::ParamTensor]) -> Vec<(String, Range<usize>)> {
    tensors.iter().map(|t| (t.name.clone(), t.range())).collect()
}

/// A layer's weight `[output × input]` at `offset` and its bias `[output]` after it.
pub fn weight_and_bias(offset: usize, input: usize, output: usize) -> Vec<(String, Range<usize>)> {
    let w = offset + input * output;
    vec![("weight".into(), offset..w), ("bias".into(), w..w + output)]
}

/// Downloads the first `n` values.
pub fn get(dev: &Device, buf: &CudaSlice<f32>, n: usize) -> Vec<f32> {
    dev.download(buf, n).expect("download")
}

/// Uploads `host`.
pub fn put<T: DeviceRepr + ValidAsZeroBits + Copy>(dev: &Device, host: &[T]) -> CudaSlice<T> {
    dev.upload(host).expect("upload")
}

/// `x` rounded to the nearest bf16, ties to even, as an `f32` (the definition
/// the device's bf16 operands follow; finite, normal values only).
#[allow(dead_code)]
pub fn round_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    f32::from_bits((bits + 0x7fff + ((bits >> 16) & 1)) & 0xffff_0000)
}
