//! What the conformance tests share: the one decision whether they can run,
//! deterministic random data, and the error measure.
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
    assert_eq!(got.len(), want.len(), "lengths differ");
    let scale = want.iter().fold(0.0f64, |m, &v| m.max((v as f64).abs()));
    let diff = got.iter().zip(want).fold(0.0f64, |m, (&g, &w)| m.max((g as f64 - w as f64).abs()));
    if diff == 0.0 {
        0.0
    } else if scale == 0.0 {
        f64::INFINITY
    } else {
        diff / scale
    }
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
