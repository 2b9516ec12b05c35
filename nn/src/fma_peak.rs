//! The fp32 fused multiply-add peak of one core, measured.
//!
//! A GEMM kernel is judged against the most floating-point work the core can
//! do: every cycle, each FMA pipe retires one fused multiply-add per vector
//! lane. That ceiling depends on the CPU (an AMD Zen 4 core splits a 512-bit
//! FMA into two 256-bit halves, so its AVX-512 and AVX2 peaks are equal; an
//! Intel Sapphire Rapids core has two full 512-bit pipes) and on its clock
//! under load, so it is measured rather than computed from a datasheet.
//!
//! [`fma_chains`] keeps `ACCUMULATORS` independent chains `x ← x·a + b` in
//! vector registers — enough to cover the FMA latency times the number of pipes
//! on every x86 core in use — and does nothing else, so its rate is the core's
//! FMA throughput. Invariants:
//!
//! * every lane of every chain computes exactly [`fma_chain_scalar`]'s value
//!   (an FMA rounds once, on every kernel), so the work counted is the work
//!   done — the tests check it bit for bit;
//! * the kernel choice never affects a training result: this module only
//!   measures.
//!
//! [`measure_amx`] measures the bf16 ceiling of an AMX core the same way: four
//! independent `TDPBF16PS` on tiles already loaded, nothing else (the
//! crate's tile assembly), each 16 × 16 × 32 multiply-adds.
//!
//! [`measure_in_cache`] measures what lies between the FMA peak and a
//! training step's products: the packed GEMM kernel on a small product whose
//! operands never leave the caches ([`IN_CACHE_SHAPE`]). A product of a step
//! below that rate loses to its memory traffic and the work around the
//! kernel's loops; the in-cache rate below the peak is the loops' own cost on
//! this core.

use super::gemm::Op;
use super::gemm_packed::{gemm_packed, PackedRhs, PanelKernel};
use std::time::Instant;
use tiderec_records::cpu::{self, Feature};

/// Independent accumulator registers per kernel: 2 FMA pipes × 4 cycles of
/// latency need 8; 12 leaves slack for a fifth cycle and fits in the 16
/// registers of AVX2 beside the two constants.
const ACCUMULATORS: usize = 12;

/// A vector width the peak can be measured at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FmaWidth {
    /// 256-bit `vfmadd` on AVX2 + FMA (8 lanes).
    Avx2,
    /// 512-bit `vfmadd` on AVX-512F (16 lanes).
    Avx512,
}

impl FmaWidth {
    /// `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            FmaWidth::Avx2 => "avx2",
            FmaWidth::Avx512 => "avx512",
        }
    }

    /// f32 lanes per register.
    pub fn lanes(self) -> usize {
        match self {
            FmaWidth::Avx2 => 8,
            FmaWidth::Avx512 => 16,
        }
    }

    /// The widths this CPU runs under the `TIDEREC_MAX_ISA` cap
    /// ([`tiderec_records::cpu`]), narrowest first.
    pub fn available() -> Vec<FmaWidth> {
        let mut widths = Vec::new();
        if cpu::has(Feature::Avx2) && cpu::has(Feature::Fma) {
            widths.push(FmaWidth::Avx2);
        }
        if cpu::has(Feature::Avx512F) {
            widths.push(FmaWidth::Avx512);
        }
        widths
    }
}

/// One measured width.
#[derive(Clone, Copy, Debug)]
pub struct FmaRate {
    /// The vector width.
    pub width: FmaWidth,
    /// GFLOP/s of the fastest call (a fused multiply-add is two flops).
    pub gflops: f64,
}

/// The value of one chain after `steps` fused multiply-adds from `start`:
/// the scalar definition every vector lane must equal.
pub fn fma_chain_scalar(start: f32, a: f32, b: f32, steps: usize) -> f32 {
    let mut x = start;
    for _ in 0..steps {
        x = x.mul_add(a, b);
    }
    x
}

/// Runs `ACCUMULATORS` chains of `steps` fused multiply-adds on every lane of
/// `width`, chain `c` lane `l` starting at `starts[c * lanes + l]`, and
/// returns the final values in the same layout. `None` where the CPU lacks the
/// width.
pub fn fma_chains(width: FmaWidth, starts: &[f32], a: f32, b: f32, steps: usize) -> Option<Vec<f32>> {
    if !FmaWidth::available().contains(&width) || starts.len() != ACCUMULATORS * width.lanes() {
        return None;
    }
    let mut out = starts.to_vec();
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the width's extensions were detected above, and `out` holds
    // ACCUMULATORS registers' worth of lanes.
    unsafe {
        match width {
            FmaWidth::Avx2 => x86::chains_avx2(&mut out, a, b, steps),
            FmaWidth::Avx512 => x86::chains_avx512(&mut out, a, b, steps),
        }
    }
    Some(out)
}

/// Seconds per width and round the peak is measured for at least, however
/// short the `seconds` asked for: a ceiling caught only in a slow moment (a
/// virtual machine's speed swings) would be passed by the kernels it bounds.
pub const MIN_SECONDS: f64 = 0.25;

/// The fastest rate, in GFLOP/s, of calls of about a millisecond, repeated
/// for `seconds`: `call(n)` does `n` units of `flops_per_unit` flops each and
/// returns its seconds; `n` doubles from `first` until a call takes a
/// millisecond. Interference (another process, an interrupt) only ever slows
/// a call down, so the fastest call is the closest estimate of the rate.
fn fastest(seconds: f64, first: u64, flops_per_unit: f64, mut call: impl FnMut(u64) -> f64) -> f64 {
    let mut n = first.max(1);
    while call(n) < 1e-3 && n < 1 << 30 {
        n *= 2;
    }
    let flops = n as f64 * flops_per_unit;
    let mut best = 0.0_f64;
    let start = Instant::now();
    loop {
        best = best.max(flops / call(n) / 1e9);
        if start.elapsed().as_secs_f64() >= seconds {
            return best;
        }
    }
}

/// The core's fp32 FMA throughput at every width it runs: calls of about a
/// millisecond repeated for about `seconds` (at least [`MIN_SECONDS`]) per width
/// in each of `rounds` alternating rounds, the fastest call per width.
pub fn measure(seconds: f64, rounds: usize) -> Vec<FmaRate> {
    let seconds = seconds.max(MIN_SECONDS);
    let widths = FmaWidth::available();
    let mut best = vec![0.0_f64; widths.len()];
    let (a, b) = (0.999_999_9_f32, 1e-7_f32);
    for _ in 0..rounds.max(1) {
        for (w, &width) in widths.iter().enumerate() {
            let starts: Vec<f32> = (0..ACCUMULATORS * width.lanes()).map(|i| 1.0 + i as f32 * 1e-3).collect();
            let call = |steps: u64| {
                let t = Instant::now();
                std::hint::black_box(fma_chains(width, &starts, a, b, steps as usize));
                t.elapsed().as_secs_f64()
            };
            let flops_per_step = 2.0 * (ACCUMULATORS * width.lanes()) as f64;
            best[w] = best[w].max(fastest(seconds, 1 << 10, flops_per_step, call));
        }
    }
    widths.into_iter().zip(best).map(|(width, gflops)| FmaRate { width, gflops }).collect()
}

/// The core's AMX bf16 throughput in GFLOP/s (a multiply-add is two flops),
/// measured as [`measure`] measures a width; `None` where the CPU's own tiles
/// do not run (emulated tiles have no peak to measure).
pub fn measure_amx(seconds: f64, rounds: usize) -> Option<f64> {
    if !tiderec_records::cpu::has(tiderec_records::cpu::Feature::AmxBf16) {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        use super::amx_tile::{dot_products, Tiles, MACS_PER_ITERATION};
        let call = |iterations: u64| {
            let t = Instant::now();
            // SAFETY: AMX runs here (checked above); at least one iteration.
            unsafe {
                let tiles = Tiles::configure();
                dot_products(&tiles, iterations.max(1));
            }
            t.elapsed().as_secs_f64()
        };
        let flops_per_iteration = 2.0 * MACS_PER_ITERATION as f64;
        let rates = (0..rounds.max(1)).map(|_| fastest(seconds.max(MIN_SECONDS), 1 << 8, flops_per_iteration, call));
        Some(rates.fold(0.0, f64::max))
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// The product [`measure_in_cache`] repeats, `m × n × k` as the GEMM reports
/// write it: 24 rows (one row group of the packed kernels) × 64 columns (four
/// 16-wide panels) × a depth of 128 (one chunk of the reduction). Its operands,
/// 12 KB of `a`, 32 KB of packed `b` and 6 KB of `c` ([`IN_CACHE_BYTES`]),
/// stay in a core's L1 and L2 caches from call to call.
pub const IN_CACHE_SHAPE: (usize, usize, usize) = (24, 64, 128);

/// Bytes of [`IN_CACHE_SHAPE`]'s operands: `a`, `b` (its 64 columns are four
/// whole panels, so packing adds no padding) and `c`, in `f32`.
pub const IN_CACHE_BYTES: usize = {
    let (m, n, k) = IN_CACHE_SHAPE;
    4 * (m * k + k * n + m * n)
};

/// The packed GEMM kernel's rate on a product that stays in cache.
#[derive(Clone, Copy, Debug)]
pub struct InCacheRate {
    /// The kernel [`gemm_packed`] runs on this CPU ([`PanelKernel::best`]).
    pub kernel: PanelKernel,
    /// GFLOP/s of the fastest timed call.
    pub gflops: f64,
}

/// The fp32 rate of the packed kernel this CPU runs best on
/// [`IN_CACHE_SHAPE`], a product whose operands stay in cache, called over and
/// over (measured as [`measure`] measures a width): what the kernel's loops
/// reach when they never wait on memory, between the FMA peak above it and
/// the products of a training step below it.
pub fn measure_in_cache(seconds: f64, rounds: usize) -> InCacheRate {
    let (m, n, k) = IN_CACHE_SHAPE;
    let a: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.01 - 0.06).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 11) as f32 * 0.01 - 0.05).collect();
    let rhs = PackedRhs::new(Op::N, k, n, &b);
    let mut c = vec![0.0_f32; m * n];
    let mut call = |calls: u64| {
        let t = Instant::now();
        for _ in 0..calls {
            gemm_packed(m, std::hint::black_box(&a), k, &rhs, false, &mut c, n);
        }
        std::hint::black_box(&c);
        t.elapsed().as_secs_f64()
    };
    let flops_per_call = 2.0 * (m * n * k) as f64;
    let gflops = (0..rounds.max(1))
        .fold(0.0, |best: f64, _| best.max(fastest(seconds.max(MIN_SECONDS), 1, flops_per_call, &mut call)));
    InCacheRate { kernel: PanelKernel::best(), gflops }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::ACCUMULATORS;
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must have AVX2 and FMA; `x` holds `ACCUMULATORS * 8` lanes.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn chains_avx2(x: &mut [f32], a: f32, b: f32, steps: usize) {
        let (va, vb) = (_mm256_set1_ps(a), _mm256_set1_ps(b));
        let mut acc = [_mm256_setzero_ps(); ACCUMULATORS];
        for (c, r) in acc.iter_mut().enumerate() {
            *r = _mm256_loadu_ps(x.as_ptr().add(c * 8));
        }
        for _ in 0..steps {
            for r in acc.iter_mut() {
                *r = _mm256_fmadd_ps(*r, va, vb);
            }
        }
        for (c, r) in acc.iter().enumerate() {
            _mm256_storeu_ps(x.as_mut_ptr().add(c * 8), *r);
        }
    }

    /// # Safety
    /// The CPU must have AVX-512F; `x` holds `ACCUMULATORS * 16` lanes.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn chains_avx512(x: &mut [f32], a: f32, b: f32, steps: usize) {
        let (va, vb) = (_mm512_set1_ps(a), _mm512_set1_ps(b));
        let mut acc = [_mm512_setzero_ps(); ACCUMULATORS];
        for (c, r) in acc.iter_mut().enumerate() {
            *r = _mm512_loadu_ps(x.as_ptr().add(c * 16));
        }
        for _ in 0..steps {
            for r in acc.iter_mut() {
                *r = _mm512_fmadd_ps(*r, va, vb);
            }
        }
        for (c, r) in acc.iter().enumerate() {
            _mm512_storeu_ps(x.as_mut_ptr().add(c * 16), *r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lane_equals_the_scalar_chain() {
        let (a, b) = (0.999_9_f32, 0.001_f32);
        for width in FmaWidth::available() {
            let starts: Vec<f32> = (0..ACCUMULATORS * width.lanes()).map(|i| (i as f32 - 40.0) * 0.37).collect();
            for steps in [0, 1, 7, 1000] {
                let out = fma_chains(width, &starts, a, b, steps).unwrap();
                for (i, (&s, &o)) in starts.iter().zip(&out).enumerate() {
                    let want = fma_chain_scalar(s, a, b, steps);
                    assert_eq!(o.to_bits(), want.to_bits(), "{} lane {i} after {steps} steps", width.name());
                }
            }
        }
    }

    #[test]
    fn a_wrong_layout_or_width_is_refused() {
        for width in FmaWidth::available() {
            assert!(fma_chains(width, &[1.0; 3], 1.0, 0.0, 1).is_none());
        }
        if !FmaWidth::available().contains(&FmaWidth::Avx512) {
            assert!(fma_chains(FmaWidth::Avx512, &[1.0; ACCUMULATORS * 16], 1.0, 0.0, 1).is_none());
        }
    }

    #[test]
    fn the_measured_rate_is_positive_and_finite() {
        for rate in measure(0.002, 1) {
            assert!(rate.gflops.is_finite() && rate.gflops > 0.0, "{rate:?}");
        }
    }

    /// The in-cache rate is the best packed kernel's, and a rate.
    #[test]
    fn the_in_cache_rate_is_the_best_packed_kernels() {
        let rate = measure_in_cache(0.002, 1);
        assert_eq!(rate.kernel, PanelKernel::best());
        assert!(rate.gflops.is_finite() && rate.gflops > 0.0, "{rate:?}");
    }

    /// The AMX peak is measured exactly where AMX runs, and is a rate.
    #[test]
    fn the_amx_peak_is_measured_where_amx_runs() {
        match measure_amx(0.002, 1) {
            Some(gflops) => assert!(gflops.is_finite() && gflops > 0.0, "{gflops}"),
            None => {
                assert!(!tiderec_records::cpu::has(tiderec_records::cpu::Feature::AmxBf16));
                eprintln!("skipped: this CPU has no usable AMX-BF16 ({})", tiderec_records::cpu::describe());
            }
        }
    }
}
