//! `tiderec bench gru`: the GRU cell's forward and backward, split (input
//! projections hoisted out of the recurrence) against unsplit, alternated.

use serde::Serialize;
use std::time::Instant;
use tiderec_operators::features::mix64;
use tiderec_operators::rng::unit_f64;

/// Result of `tiderec bench gru`: forward + backward of the split and the unsplit cell.
#[derive(Clone, Debug, Serialize)]
pub struct GruBenchResult {
    /// Sequences per batch.
    pub batch_size: usize,
    /// Time steps per sequence.
    pub steps: usize,
    /// Input width.
    pub input: usize,
    /// Hidden width.
    pub hidden: usize,
    /// Sequences per second, split cell (input projections hoisted out of the
    /// recurrence, sequences packed by length), median over the rounds.
    pub split_sequences_per_sec: f64,
    /// Sequences per second, unsplit cell (one GEMM over `[x_t, h]` per step), median over the rounds.
    pub unsplit_sequences_per_sec: f64,
    /// Median over the rounds of `split / unsplit`, each round timing both cells back to back.
    pub speedup: f64,
    /// Lowest and highest round's `split / unsplit`.
    pub speedup_range: [f64; 2],
    /// Every round's `split / unsplit`, in the order they ran.
    pub speedup_rounds: Vec<f64>,
}

/// Times GRU forward + backward with the split and the unsplit cell on the same
/// random inputs, `seconds` for each cell in all.
pub fn run_gru(batch: usize, steps: usize, input: usize, hidden: usize, seconds: f64) -> GruBenchResult {
    use tiderec_operators::nn::gru::{Gru, GruCache};
    let gru = Gru { input, hidden, offset: 0 };
    let mut params = vec![0.0f32; gru.num_params()];
    gru.init(&mut params, 1, 0);
    let x: Vec<f32> = (0..batch * steps * input).map(|i| unit_f64(2, i as u64, 0, 0) as f32 - 0.5).collect();
    // Lengths spread over 1..=steps, as in behaviour histories.
    let lengths: Vec<usize> = (0..batch).map(|b| 1 + (mix64(b as u64) % steps as u64) as usize).collect();
    let dstates: Vec<f32> = (0..steps * batch * hidden).map(|i| unit_f64(3, i as u64, 0, 0) as f32 - 0.5).collect();
    let mut grads = vec![0.0f32; params.len()];
    let mut dx = vec![0.0f32; x.len()];
    let mut cache = GruCache::default();
    let mut time = |split: bool, seconds: f64| {
        let mut iterations = 0u64;
        let start = Instant::now();
        while iterations < 2 || start.elapsed().as_secs_f64() < seconds {
            if split {
                gru.forward(&params, &x, &lengths, batch, steps, &mut cache);
                gru.backward(&params, &x, &lengths, &cache, &dstates, &mut grads, &mut dx);
            } else {
                gru.forward_unsplit(&params, &x, &lengths, batch, steps, &mut cache);
                gru.backward_unsplit(&params, &x, &lengths, &cache, &dstates, &mut grads, &mut dx);
            }
            iterations += 1;
        }
        (iterations * batch as u64) as f64 / start.elapsed().as_secs_f64()
    };
    // Short alternating rounds, each cell right after the other, so that both
    // see the same state of a shared machine; the medians over the rounds
    // discard rounds another process disturbed.
    let window = seconds / GRU_ROUNDS as f64;
    let (mut split, mut unsplit, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..GRU_ROUNDS {
        let (s, u) = if round % 2 == 0 {
            let u = time(false, window);
            (time(true, window), u)
        } else {
            let s = time(true, window);
            (s, time(false, window))
        };
        split.push(s);
        unsplit.push(u);
        ratios.push(s / u);
    }
    let speedup_rounds = ratios.clone();
    GruBenchResult {
        batch_size: batch,
        steps,
        input,
        hidden,
        split_sequences_per_sec: median(&mut split),
        unsplit_sequences_per_sec: median(&mut unsplit),
        speedup: median(&mut ratios),
        speedup_range: [ratios[0], ratios[ratios.len() - 1]],
        speedup_rounds,
    }
}

/// Alternating rounds of `run_gru` (odd, so the median is one round).
const GRU_ROUNDS: usize = 9;

/// Median of `values` (sorts them).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
