//! Split vs unsplit GRU cell, forward + backward, timed in this thread's CPU
//! time (`/proc/thread-self/schedstat`) rather than wall time, so that other
//! processes sharing the cores disturb the ratio less than they do
//! `tiderec bench gru`'s. Same inputs and the same rounds as that bench:
//! nine short alternating rounds, medians reported.
//!
//! `cargo run --release -p tiderec-operators --example gru_speed -- B T I H`
//! (`ONLY=split` or `ONLY=unsplit` times one cell, for profiling).
fn cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    s.split_whitespace().next().unwrap().parse::<f64>().unwrap() * 1e-9
}
use tiderec_operators::nn::gru::{Gru, GruCache};

fn main() {
    let a: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().unwrap()).collect();
    let (batch, steps, input, hidden) = (a[0], a[1], a[2], a[3]);
    let window = 0.25;
    let gru = Gru { input, hidden, offset: 0 };
    let mut params = vec![0.0f32; gru.num_params()];
    gru.init(&mut params, 1, 0);
    let x: Vec<f32> = (0..batch * steps * input).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let lengths: Vec<usize> =
        (0..batch).map(|b| 1 + (tiderec_operators::features::mix64(b as u64) % steps as u64) as usize).collect();
    let dstates: Vec<f32> = (0..steps * batch * hidden).map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5).collect();
    let mut grads = vec![0.0f32; params.len()];
    let mut dx = vec![0.0f32; x.len()];
    let mut cache = GruCache::default();
    let mut time = |split: bool| {
        let mut it = 0u64;
        let start = cpu();
        let window = if std::env::var_os("ONLY").is_some() { 4.0 } else { window };
        while it < 2 || (cpu() - start) < window {
            if split {
                gru.forward(&params, &x, &lengths, batch, steps, &mut cache);
                gru.backward(&params, &x, &lengths, &cache, &dstates, &mut grads, &mut dx);
            } else {
                gru.forward_unsplit(&params, &x, &lengths, batch, steps, &mut cache);
                gru.backward_unsplit(&params, &x, &lengths, &cache, &dstates, &mut grads, &mut dx);
            }
            it += 1;
        }
        (it * batch as u64) as f64 / (cpu() - start)
    };
    let (mut s, mut u, mut r) = (Vec::new(), Vec::new(), Vec::new());
    let only = std::env::var("ONLY").unwrap_or_default();
    if !only.is_empty() {
        let rate = time(only == "split");
        println!("B{batch} T{steps} {input}->{hidden}: {only} {rate:.0} seq/s");
        return;
    }
    for round in 0..9 {
        let (si, ui) = if round % 2 == 0 {
            let ui = time(false);
            (time(true), ui)
        } else {
            let si = time(true);
            (si, time(false))
        };
        s.push(si);
        u.push(ui);
        r.push(si / ui);
    }
    for v in [&mut s, &mut u, &mut r] {
        v.sort_by(f64::total_cmp);
    }
    println!(
        "B{batch} T{steps} {input}->{hidden}: split {:.0} seq/s, unsplit {:.0} seq/s, speedup {:.3} (rounds {:.3}–{:.3})",
        s[4], u[4], r[4], r[0], r[8]
    );
}
