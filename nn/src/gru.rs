//! A GRU over padded, variable-length sequences, with AtRec's cell splitting.
//!
//! Gate order and equations follow `torch.nn.GRU` (rows of the weight
//! matrices are stacked `r, z, n`):
//!
//! ```text
//! r = σ(W_ir x + b_ir + W_hr h + b_hr)
//! z = σ(W_iz x + b_iz + W_hz h + b_hz)
//! n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))
//! h' = (1 − z) ⊙ n + z ⊙ h
//! ```
//!
//! **Split cell**: the sequences are packed (sorted by length, longest
//! first, as cuDNN's and PyTorch's packed sequences), so that at every step
//! the sequences still running are a prefix of the batch and steps past a
//! sequence's length cost nothing. The input projections `W_ih x` of a chunk
//! of time steps are one GEMM over the chunk's packed rows before the
//! recurrence (as many steps as fill about 256 KiB with a full batch, into
//! one reused chunk buffer that stays in L2; at DIEN shapes ten steps);
//! inside the loop only `h · W_hhᵀ` is computed, over the running prefix.
//! Backward mirrors it: per step the gate gradients and
//! `dh_{t−1} = dGh · W_hh`; per chunk `dW_ih`, `dW_hh`, the bias gradients
//! and `dx` (one GEMM / pass each over the chunk's packed rows, `dx` then
//! scattered into the batch-major layout). Every product with a weight runs
//! through [`gemm_packed`] with the weight packed once per pass; the split
//! cell's weight gradients (over a chunk of steps) through [`gemm_tn`],
//! which packs neither operand, the unsplit cell's (per step) through the
//! general GEMM, each the faster kernel for its shape. A step's gate
//! nonlinearities run as one flat loop over rows (`activate_rows`, shared by
//! both cells), after the split cell has gathered its two products and the
//! biases into the step's planes. [`Gru::forward_unsplit`] is the textbook
//! cell (per step one GEMM over the concatenation `[x_t, h]` of the whole
//! padded batch with a combined weight), kept as the baseline and oracle,
//! with the same kernels for its weight products.
//!
//! Packing is a function of the lengths alone (ties keep batch order), so
//! the results are deterministic for given inputs.
//!
//! Sequences shorter than `T` are masked: past its length a row keeps its
//! state (`h_t = h_{t−1}`) and receives no gate gradients.
//!
//! Parameters at `offset` in the flat buffer: `W_ih [3H × I]`, `W_hh [3H × H]`,
//! `b_ih [3H]`, `b_hh [3H]`.

use super::gemm::{gemm, Op};
use super::gemm_packed::{gemm_packed, gemm_tn, PackedRhs, LANES};
use super::loss::sigmoid_fast;
use super::Scalar;
use tiderec_records::rng::unit_f64;

/// GRU layer shape and parameter offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gru {
    /// Input width `I`.
    pub input: usize,
    /// Hidden width `H`.
    pub hidden: usize,
    /// Where `W_ih` starts in the flat parameter buffer.
    pub offset: usize,
}

/// Activations kept for backward.
#[derive(Clone, Debug, Default)]
pub struct GruCache<T> {
    /// `h_0 … h_T`, each `[B × H]` (`h_0` = 0).
    pub states: Vec<T>,
    gx: Vec<T>,
    /// Gate activations `r`, `z`, `n` and the candidate's recurrent part `hn`:
    /// per step `[B × H]` for the unsplit cell; for the split cell one row per
    /// packed row (see [`PackedSequences`]).
    r: Vec<T>,
    z: Vec<T>,
    n: Vec<T>,
    hn: Vec<T>,
    gh: Vec<T>,
    /// The split cell's sequences sorted by length, and its per-step row counts.
    packed: PackedSequences,
    /// `x` of the packed rows, `[rows × I]` (plus slack: the weight gradient reads whole vectors).
    xp: Vec<T>,
    /// The split cell's `h_t` of the packed rows, `[rows × H]`.
    hs: Vec<T>,
    /// Zeros, the start state of the packed rows.
    h0: Vec<T>,
    /// `W_ihᵀ` and `W_hhᵀ` packed for the split forward's products.
    w_input: PackedRhs<T>,
    w_recurrent: PackedRhs<T>,
    /// Buffers of the split backward, kept between calls (no allocation per step of training).
    scratch: std::cell::RefCell<BackwardScratch<T>>,
    batch: usize,
    steps: usize,
}

/// Working buffers of [`Gru::backward`].
#[derive(Clone, Debug, Default)]
struct BackwardScratch<T> {
    dgx: Vec<T>,
    dgh: Vec<T>,
    /// `∂L/∂h_t` and `∂L/∂h_{t−1}` of every sequence, in packed order, `[B × H]`.
    dh: Vec<T>,
    dh_prev: Vec<T>,
    /// `h_{t−1}` of a chunk's packed rows, for `dW_hh`.
    hc: Vec<T>,
    /// `dx` of a chunk's packed rows, before it is scattered into the batch-major `dx`.
    dxc: Vec<T>,
    /// `W_ih` and `W_hh` packed for the split backward's products.
    w_input: PackedRhs<T>,
    w_recurrent: PackedRhs<T>,
}

/// The split cell's packed layout of a batch (as cuDNN's and PyTorch's packed
/// sequences): the sequences sorted by length, longest first (ties in batch
/// order), so that the rows still inside their sequences at step `t` are the
/// first `active(t)` of that order; the packed rows of step `t` are
/// `offsets[t]..offsets[t + 1]`, row `offsets[t] + p` being sequence
/// `order[p]`. Steps past a sequence's length have no row: no product and no
/// gate runs for them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct PackedSequences {
    /// Batch indices, longest sequence first.
    order: Vec<usize>,
    /// `offsets[t]`: packed rows before step `t` (`T + 1` entries).
    offsets: Vec<usize>,
}

impl PackedSequences {
    /// Sorts `lengths` (each clamped to `steps`) into the packed layout, reusing the buffers.
    fn pack(&mut self, lengths: &[usize], steps: usize) {
        self.order.clear();
        self.order.extend(0..lengths.len());
        // Stable: equal lengths keep batch order, so the layout is a function of `lengths`.
        self.order.sort_by_key(|&b| std::cmp::Reverse(lengths[b].min(steps)));
        self.offsets.clear();
        self.offsets.push(0);
        let mut active = self.order.len();
        for t in 0..steps {
            while active > 0 && lengths[self.order[active - 1]].min(steps) <= t {
                active -= 1;
            }
            self.offsets.push(self.offsets[t] + active);
        }
    }

    /// Sequences still inside their length at step `t`.
    fn active(&self, t: usize) -> usize {
        self.offsets[t + 1] - self.offsets[t]
    }

    /// All packed rows.
    fn rows(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }
}

impl<T: Scalar> GruCache<T> {
    /// Hidden state after step `t` (1-based; 0 is the zero start state) as `[B × H]`.
    pub fn state(&self, t: usize, hidden: usize) -> &[T] {
        let bh = self.batch * hidden;
        &self.states[t * bh..(t + 1) * bh]
    }
}

impl Gru {
    /// Where `W_ih` (`[3H × I]`, gate rows `r, z, n`) lies in the flat buffer.
    pub fn w_ih(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + 3 * self.hidden * self.input
    }
    /// Where `W_hh` (`[3H × H]`) lies.
    pub fn w_hh(&self) -> std::ops::Range<usize> {
        let s = self.w_ih().end;
        s..s + 3 * self.hidden * self.hidden
    }
    /// Where `b_ih` (`[3H]`) lies.
    pub fn b_ih(&self) -> std::ops::Range<usize> {
        let s = self.w_hh().end;
        s..s + 3 * self.hidden
    }
    /// Where `b_hh` (`[3H]`) lies.
    pub fn b_hh(&self) -> std::ops::Range<usize> {
        let s = self.b_ih().end;
        s..s + 3 * self.hidden
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        3 * self.hidden * (self.input + self.hidden + 2)
    }

    /// PyTorch's initialisation: every parameter `U(−1/√H, 1/√H)`.
    pub fn init<T: Scalar>(&self, params: &mut [T], seed: u64, tag: u64) {
        let k = 1.0 / (self.hidden as f64).sqrt();
        for (i, p) in params[self.offset..self.offset + self.num_params()].iter_mut().enumerate() {
            *p = T::from_f64((unit_f64(seed, tag, 5, i as u64) * 2.0 - 1.0) * k);
        }
    }

    /// Runs the split cell over `x: [B × T × I]` with `lengths[b] ≤ T`; the
    /// states `h_1 … h_T` are in the cache (`[B × H]` each).
    pub fn forward<T: Scalar>(
        &self,
        params: &[T],
        x: &[T],
        lengths: &[usize],
        batch: usize,
        steps: usize,
        cache: &mut GruCache<T>,
    ) {
        let (h, i3, input) = (self.hidden, 3 * self.hidden, self.input);
        let bh = batch * h;
        cache.batch = batch;
        cache.steps = steps;
        cache.packed.pack(&lengths[..batch], steps);
        let rows = cache.packed.rows();
        // The input projections of a chunk of time steps before the recurrence,
        // one GEMM over the chunk's packed rows into one chunk-sized buffer that
        // stays in cache: gx[row × 3H] = x_row · W_ihᵀ (biases are added in the
        // gate step). A chunk is as many steps as fill about 256 KiB of gx with
        // every sequence present; for DIEN shapes that is 10 steps at once.
        let chunk = chunk_steps::<T>(batch * i3).min(steps.max(1));
        cache.gx.resize(chunk * batch * i3, T::ZERO);
        cache.gh.resize(batch * i3, T::ZERO);
        cache.w_input.pack(Op::T, input, i3, &params[self.w_ih()]);
        cache.w_recurrent.pack(Op::T, h, i3, &params[self.w_hh()]);
        let bias = SplitBias::new(&params[self.b_ih()], &params[self.b_hh()], h);
        pack_rows(x, steps, input, &cache.packed, &mut cache.xp);
        cache.hs.resize(rows * h, T::ZERO);
        cache.h0.clear();
        cache.h0.resize(bh, T::ZERO);
        for v in [&mut cache.r, &mut cache.z, &mut cache.n, &mut cache.hn] {
            v.resize(rows * h, T::ZERO);
        }
        let GruCache { gx, r, z, n, hn, gh, packed, xp, hs, h0, w_input, w_recurrent, .. } = cache;
        for t in 0..steps {
            let (row, active) = (packed.offsets[t], packed.active(t));
            if active == 0 {
                break; // so are all later steps: the longest sequence has ended
            }
            let first = packed.offsets[t - t % chunk];
            if t % chunk == 0 {
                let end = packed.offsets[(t + chunk).min(steps)];
                gemm_packed(end - row, &xp[row * input..], input, w_input, false, gx, i3);
            }
            // The only product inside the recurrence: gh = h_{t−1} · W_hhᵀ over
            // the sequences still running (a prefix of the previous step's rows).
            let (done, out) = hs.split_at_mut(row * h);
            let hp = if t == 0 { &h0[..] } else { &done[packed.offsets[t - 1] * h..] };
            let hp = &hp[..active * h];
            gemm_packed(active, hp, h, w_recurrent, false, gh, i3);
            let planes = row * h..(row + active) * h;
            let gx_t = &gx[(row - first) * i3..(row - first + active) * i3];
            let (r, z, n, hn) =
                (&mut r[planes.clone()], &mut z[planes.clone()], &mut n[planes.clone()], &mut hn[planes]);
            gather_split_rows(h, gx_t, &gh[..active * i3], &bias, StepPlanes { r, z, n, hn });
            activate_rows(hp, &mut out[..active * h], r, z, n, hn);
        }
        unpack_states(lengths, batch, steps, h, packed, hs, &mut cache.states);
    }

    fn prepare<T: Scalar>(&self, cache: &mut GruCache<T>, batch: usize, steps: usize) {
        // Every entry is written before it is read except h_0, so only h_0 is zeroed.
        let bh = batch * self.hidden;
        cache.states.resize((steps + 1) * bh, T::ZERO);
        cache.states[..bh].fill(T::ZERO);
        for v in [&mut cache.r, &mut cache.z, &mut cache.n, &mut cache.hn] {
            v.resize(steps * bh, T::ZERO);
        }
    }

    /// Back-propagates `dstates: [T × B × H]` (gradient w.r.t. `h_1 … h_T`) through
    /// the last `forward`; writes the parameter gradients into `grads` and `dx`.
    /// `x` and `lengths` are the forward's (its packed copy of `x` is what is read).
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: Scalar>(
        &self,
        params: &[T],
        x: &[T],
        lengths: &[usize],
        cache: &GruCache<T>,
        dstates: &[T],
        grads: &mut [T],
        dx: &mut [T],
    ) {
        let (h, i3, input, batch, steps) = (self.hidden, 3 * self.hidden, self.input, cache.batch, cache.steps);
        let bh = batch * h;
        let packed = &cache.packed;
        debug_assert_eq!(x.len(), batch * steps * input);
        let mut scratch = cache.scratch.borrow_mut();
        let BackwardScratch { dgx, dgh: dgh_chunk, dh, dh_prev, hc, dxc, w_input, w_recurrent } = &mut *scratch;
        w_input.pack(Op::N, i3, input, &params[self.w_ih()]);
        w_recurrent.pack(Op::N, i3, h, &params[self.w_hh()]);
        // The pre-activation gradients of a chunk of steps (packed rows, chunk-sized
        // buffers that stay in cache), so that dW_ih, dW_hh, dx and the biases are
        // one GEMM / one pass per chunk instead of one per step. Every entry is
        // written before it is read.
        let chunk = chunk_steps::<T>(batch * i3).min(steps.max(1));
        dgx.resize(chunk * batch * i3, T::ZERO);
        dgh_chunk.resize(chunk * batch * i3, T::ZERO);
        for v in [&mut *dh, &mut *dh_prev] {
            v.clear();
            v.resize(bh, T::ZERO);
        }
        for range in [self.w_ih(), self.w_hh(), self.b_ih(), self.b_hh()] {
            grads[range].fill(T::ZERO);
        }
        // Steps past a sequence's length have no packed row: their dx is zero.
        for (b, &len) in lengths[..batch].iter().enumerate() {
            dx[(b * steps + len.min(steps)) * input..(b + 1) * steps * input].fill(T::ZERO);
        }
        for t in (0..steps).rev() {
            // dh (packed order) += ∂L/∂h_t; a sequence past its length carries it unchanged.
            for (p, &b) in packed.order.iter().enumerate() {
                let e = &dstates[t * bh + b * h..t * bh + (b + 1) * h];
                for (d, &e) in dh[p * h..(p + 1) * h].iter_mut().zip(e) {
                    *d += e;
                }
            }
            let (row, active) = (packed.offsets[t], packed.active(t));
            let first = packed.offsets[t - t % chunk];
            if active > 0 {
                let hp = if t == 0 { &cache.h0[..] } else { &cache.hs[packed.offsets[t - 1] * h..] };
                for p in 0..active {
                    let acts = Activations::of(cache, (row + p) * h, h);
                    let local = row - first + p;
                    let dgxb = &mut dgx[local * i3..(local + 1) * i3];
                    let dghb = &mut dgh_chunk[local * i3..(local + 1) * i3];
                    let (dgxr, rest) = dgxb.split_at_mut(h);
                    let (dgxz, dgxn) = rest.split_at_mut(h);
                    let (dgh_rz, dghn) = dghb.split_at_mut(2 * h);
                    let (dhb, hpb, dpb) =
                        (&dh[p * h..(p + 1) * h], &hp[p * h..(p + 1) * h], &mut dh_prev[p * h..(p + 1) * h]);
                    gate_grads_row(&acts, dhb, hpb, dgxr, dgxz, dgxn, dghn, dpb);
                    // The r and z pre-activations are shared by both sides.
                    dgh_rz.copy_from_slice(&dgxb[..2 * h]);
                }
                // dh_{t−1} += dGh·W_hh (the only product the recurrence needs).
                let dgh = &dgh_chunk[(row - first) * i3..(row - first + active) * i3];
                gemm_packed(active, dgh, i3, w_recurrent, true, dh_prev, h);
                dh[..active * h].copy_from_slice(&dh_prev[..active * h]);
            }
            // A chunk of steps is complete: its weight and input gradients, one GEMM
            // each over all its packed rows while their dGx / dGh are still in cache.
            if t % chunk == 0 {
                let end = (t + chunk).min(steps);
                let rows = packed.offsets[end] - first;
                if rows == 0 {
                    continue;
                }
                let (dgx_c, dgh_c) = (&dgx[..rows * i3], &dgh_chunk[..rows * i3]);
                // dW_hh += dGhᵀ·h_{s−1} over the chunk's rows (h_{s−1} of step s's rows
                // is the first `active(s)` rows of step s − 1's output).
                hc.clear();
                for s in t..end {
                    let a = packed.active(s);
                    if s == 0 {
                        hc.extend_from_slice(&cache.h0[..a * h]);
                    } else {
                        let start = packed.offsets[s - 1] * h;
                        hc.extend_from_slice(&cache.hs[start..start + a * h]);
                    }
                }
                // Slack: the weight gradient reads rows to whole vectors.
                hc.resize(hc.len() + LANES, T::ZERO);
                weight_gradient(i3, h, rows, dgh_c, hc, &mut grads[self.w_hh()]);
                weight_gradient(i3, input, rows, dgx_c, &cache.xp[first * input..], &mut grads[self.w_ih()]);
                // dx of the chunk's rows, then scattered into the batch-major dx.
                dxc.resize(rows * input, T::ZERO);
                gemm_packed(rows, dgx_c, i3, w_input, false, dxc, input);
                for s in t..end {
                    for (p, &b) in packed.order[..packed.active(s)].iter().enumerate() {
                        let src = (packed.offsets[s] - first + p) * input;
                        dx[(b * steps + s) * input..(b * steps + s + 1) * input]
                            .copy_from_slice(&dxc[src..src + input]);
                    }
                }
                for (range, src) in [(self.b_hh(), dgh_c), (self.b_ih(), dgx_c)] {
                    let g = &mut grads[range];
                    for row in src.chunks_exact(i3) {
                        for (gv, &v) in g.iter_mut().zip(row) {
                            *gv += v;
                        }
                    }
                }
            }
        }
    }

    /// The unsplit baseline: per step one GEMM of `[x_t, h]` with the combined
    /// weight `[[W_ir W_hr]; [W_iz W_hz]; [W_in 0]; [0 W_hn]]` (`4H` outputs).
    /// Produces the same states as [`forward`](Self::forward).
    pub fn forward_unsplit<T: Scalar>(
        &self,
        params: &[T],
        x: &[T],
        lengths: &[usize],
        batch: usize,
        steps: usize,
        cache: &mut GruCache<T>,
    ) {
        let (h, i) = (self.hidden, self.input);
        let bh = batch * h;
        let width = i + h;
        let combined = PackedRhs::new(Op::T, width, 4 * h, &self.combined_weight(params));
        // The combined weight's four output blocks take the split cell's four biases.
        let split = SplitBias::new(&params[self.b_ih()], &params[self.b_hh()], h);
        let bias = [split.r, split.z, split.n, split.hn].concat();
        cache.batch = batch;
        cache.steps = steps;
        self.prepare(cache, batch, steps);
        let mut xh = vec![T::ZERO; batch * width];
        let mut g = vec![T::ZERO; batch * 4 * h];
        for t in 0..steps {
            let (prev, rest) = cache.states.split_at_mut((t + 1) * bh);
            let hp = &prev[t * bh..];
            for b in 0..batch {
                xh[b * width..b * width + i].copy_from_slice(&x[(b * steps + t) * i..(b * steps + t + 1) * i]);
                xh[b * width + i..(b + 1) * width].copy_from_slice(&hp[b * h..(b + 1) * h]);
            }
            for row in g.chunks_exact_mut(4 * h) {
                row.copy_from_slice(&bias);
            }
            gemm_packed(batch, &xh, width, &combined, true, &mut g, 4 * h);
            // The combined pre-activations already hold the biases: r, z, n's input
            // part and n's recurrent part go to the shared elementwise step.
            let planes = t * bh..(t + 1) * bh;
            let (r, z) = (&mut cache.r[planes.clone()], &mut cache.z[planes.clone()]);
            let (n, hn) = (&mut cache.n[planes.clone()], &mut cache.hn[planes]);
            for b in 0..batch {
                let gb = &g[b * 4 * h..(b + 1) * 4 * h];
                let row = b * h..(b + 1) * h;
                r[row.clone()].copy_from_slice(&gb[..h]);
                z[row.clone()].copy_from_slice(&gb[h..2 * h]);
                n[row.clone()].copy_from_slice(&gb[2 * h..3 * h]);
                hn[row].copy_from_slice(&gb[3 * h..]);
            }
            activate_step(h, t, lengths, hp, &mut rest[..bh], r, z, n, hn);
        }
    }

    fn combined_weight<T: Scalar>(&self, params: &[T]) -> Vec<T> {
        let (h, i) = (self.hidden, self.input);
        let width = i + h;
        let (wih, whh) = (&params[self.w_ih()], &params[self.w_hh()]);
        let mut w = vec![T::ZERO; 4 * h * width];
        for row in 0..3 * h {
            w[row * width..row * width + i].copy_from_slice(&wih[row * i..(row + 1) * i]);
            if row < 2 * h {
                w[row * width + i..(row + 1) * width].copy_from_slice(&whh[row * h..(row + 1) * h]);
            } else {
                let hrow = 3 * h + (row - 2 * h);
                w[hrow * width + i..(hrow + 1) * width].copy_from_slice(&whh[row * h..(row + 1) * h]);
            }
        }
        w
    }

    /// Back-propagation of the unsplit cell: the same gradients as
    /// [`backward`](Self::backward), computed per step with the combined weight.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_unsplit<T: Scalar>(
        &self,
        params: &[T],
        x: &[T],
        lengths: &[usize],
        cache: &GruCache<T>,
        dstates: &[T],
        grads: &mut [T],
        dx: &mut [T],
    ) {
        let (h, i, batch, steps) = (self.hidden, self.input, cache.batch, cache.steps);
        let (bh, width) = (batch * h, i + h);
        let combined = PackedRhs::new(Op::N, 4 * h, width, &self.combined_weight(params));
        let mut dcombined = vec![T::ZERO; 4 * h * width];
        let mut dbias = vec![T::ZERO; 4 * h];
        let mut dg = vec![T::ZERO; batch * 4 * h];
        let mut dxh = vec![T::ZERO; batch * width];
        let mut xh = vec![T::ZERO; batch * width];
        let mut dh = vec![T::ZERO; bh];
        for t in (0..steps).rev() {
            for (d, &e) in dh.iter_mut().zip(&dstates[t * bh..(t + 1) * bh]) {
                *d += e;
            }
            let hp = cache.state(t, h);
            let mut carry = vec![T::ZERO; bh];
            for b in 0..batch {
                xh[b * width..b * width + i].copy_from_slice(&x[(b * steps + t) * i..(b * steps + t + 1) * i]);
                xh[b * width + i..(b + 1) * width].copy_from_slice(&hp[b * h..(b + 1) * h]);
                let dgb = &mut dg[b * 4 * h..(b + 1) * 4 * h];
                if t >= lengths[b] {
                    dgb.fill(T::ZERO);
                    carry[b * h..(b + 1) * h].copy_from_slice(&dh[b * h..(b + 1) * h]);
                    continue;
                }
                let acts = Activations::of(cache, (t * batch + b) * h, h);
                let (dhb, hpb) = (&dh[b * h..(b + 1) * h], &hp[b * h..(b + 1) * h]);
                let cb = &mut carry[b * h..(b + 1) * h];
                let (dgr, rest) = dgb.split_at_mut(h);
                let (dgz, rest) = rest.split_at_mut(h);
                let (dgn, dghn) = rest.split_at_mut(h);
                gate_grads_row(&acts, dhb, hpb, dgr, dgz, dgn, dghn, cb);
            }
            // Per step (k = B) the general GEMM is the faster kernel for this
            // shape (measured on the split cell: 1.03–1.11× over `gemm_tn`).
            gemm(Op::T, Op::N, 4 * h, width, batch, T::ONE, &dg, &xh, T::ONE, &mut dcombined);
            for row in dg.chunks_exact(4 * h) {
                for (g, &v) in dbias.iter_mut().zip(row) {
                    *g += v;
                }
            }
            gemm_packed(batch, &dg, 4 * h, &combined, false, &mut dxh, width);
            for b in 0..batch {
                dx[(b * steps + t) * i..(b * steps + t + 1) * i].copy_from_slice(&dxh[b * width..b * width + i]);
                for j in 0..h {
                    carry[b * h + j] += dxh[b * width + i + j];
                }
            }
            dh = carry;
        }
        // Scatter the combined gradients back to the split layout.
        let (wi, wh, bi, bhh) = (self.w_ih(), self.w_hh(), self.b_ih(), self.b_hh());
        for row in 0..3 * h {
            grads[wi.start + row * i..wi.start + (row + 1) * i]
                .copy_from_slice(&dcombined[row * width..row * width + i]);
            let hrow = if row < 2 * h { row } else { 3 * h + row - 2 * h };
            grads[wh.start + row * h..wh.start + (row + 1) * h]
                .copy_from_slice(&dcombined[hrow * width + i..(hrow + 1) * width]);
        }
        grads[bi.start..bi.start + 2 * h].copy_from_slice(&dbias[..2 * h]);
        grads[bhh.start..bhh.start + 2 * h].copy_from_slice(&dbias[..2 * h]);
        grads[bi.start + 2 * h..bi.end].copy_from_slice(&dbias[2 * h..3 * h]);
        grads[bhh.start + 2 * h..bhh.end].copy_from_slice(&dbias[3 * h..]);
    }
}

/// `c[m × n] += aᵀ·b` for `a: [k × m]` and the first `k` rows of `b: [· × n]`
/// (the split cell's weight gradients over a chunk of steps: `k` is hundreds
/// of rows, `m = 3H`, `n = I` or `H`). [`gemm_tn`] reads both operands where
/// they lie: 1.07× the general GEMM (which packs both) at the DIEN shape,
/// 1.43× at `H = I = 36` (`cargo bench --bench packed_gemm`). It reads every
/// row of `b` to whole vectors, so `b` must run on past row `k` by `n`
/// rounded up to a multiple of 8 (the rest of the states, or slack); where it
/// does not (a tiny hidden width with a batch of one), the general GEMM runs.
fn weight_gradient<T: Scalar>(m: usize, n: usize, k: usize, a: &[T], b: &[T], c: &mut [T]) {
    if k == 0 || b.len() >= (k - 1) * n + n.div_ceil(LANES) * LANES {
        gemm_tn(m, n, k, a, m, b, n, true, c, n);
    } else {
        gemm(Op::T, Op::N, m, n, k, T::ONE, a, b, T::ONE, c);
    }
}

/// The biases of a step's gate pre-activations: `b_ir + b_hr`, `b_iz + b_hz`
/// (summed once), `b_in` and `b_hn` (kept apart: `r` multiplies only the latter).
struct SplitBias<T> {
    r: Vec<T>,
    z: Vec<T>,
    n: Vec<T>,
    hn: Vec<T>,
}

impl<T: Scalar> SplitBias<T> {
    fn new(b_ih: &[T], b_hh: &[T], h: usize) -> Self {
        let sum = |g: usize| (g * h..(g + 1) * h).map(|j| b_ih[j] + b_hh[j]).collect();
        SplitBias { r: sum(0), z: sum(1), n: b_ih[2 * h..3 * h].to_vec(), hn: b_hh[2 * h..3 * h].to_vec() }
    }
}

/// One step's `[B × H]` planes of the cache: the activations `r`, `z`, `n` and
/// the candidate's recurrent pre-activation `hn = W_hn h + b_hn` kept for backward.
struct StepPlanes<'a, T> {
    r: &'a mut [T],
    z: &'a mut [T],
    n: &'a mut [T],
    hn: &'a mut [T],
}

/// One hidden unit of one step from its pre-activations (biases included):
/// returns `(r, z, n, h_t)`.
#[inline(always)]
fn gate_unit<T: Scalar>(r_pre: T, z_pre: T, n_pre: T, hn: T, prev: T) -> (T, T, T, T) {
    let r = sigmoid_fast(r_pre);
    let z = sigmoid_fast(z_pre);
    let n = tanh(n_pre + r * hn);
    (r, z, n, (T::ONE - z) * n + z * prev)
}

/// The split cell's gathering of a step's pre-activations: for every packed row
/// of the step, the input projections `gx` plus the recurrent products `gh`
/// (both `[rows × 3H]`, gate blocks `r, z, n`, no biases) plus `bias`, into
/// the step's `[rows × H]` planes in the layout [`activate_rows`] reads.
#[inline(never)]
fn gather_split_rows<T: Scalar>(h: usize, gx: &[T], gh: &[T], bias: &SplitBias<T>, planes: StepPlanes<'_, T>) {
    let (br, bz, bn, bhn) = (&bias.r[..h], &bias.z[..h], &bias.n[..h], &bias.hn[..h]);
    let rows = gx.chunks_exact(3 * h).zip(gh.chunks_exact(3 * h));
    let planes = planes
        .r
        .chunks_exact_mut(h)
        .zip(planes.z.chunks_exact_mut(h))
        .zip(planes.n.chunks_exact_mut(h))
        .zip(planes.hn.chunks_exact_mut(h));
    for ((gxb, ghb), (((r, z), n), hn)) in rows.zip(planes) {
        let (xr, xz, xn) = (&gxb[..h], &gxb[h..2 * h], &gxb[2 * h..]);
        let (hr, hz, hh) = (&ghb[..h], &ghb[h..2 * h], &ghb[2 * h..]);
        for j in 0..h {
            r[j] = xr[j] + hr[j] + br[j];
            z[j] = xz[j] + hz[j] + bz[j];
            n[j] = xn[j] + bn[j];
            hn[j] = hh[j] + bhn[j];
        }
    }
}

/// The unsplit cell's elementwise step over the step's `[B × H]` planes: on
/// entry `r`, `z` hold the gate pre-activations, `n` the input part of the
/// candidate's pre-activation and `hn` its recurrent part, biases included; on
/// exit `r`, `z`, `n` hold the activations and `out` is `h_t`. Runs of
/// consecutive rows inside their sequences are one flat loop each; rows past
/// their length copy their state.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn activate_step<T: Scalar>(
    h: usize,
    t: usize,
    lengths: &[usize],
    prev: &[T],
    out: &mut [T],
    r: &mut [T],
    z: &mut [T],
    n: &mut [T],
    hn: &[T],
) {
    let mut b = 0;
    while b < lengths.len() {
        if t >= lengths[b] {
            out[b * h..(b + 1) * h].copy_from_slice(&prev[b * h..(b + 1) * h]);
            b += 1;
            continue;
        }
        let first = b;
        while b < lengths.len() && t < lengths[b] {
            b += 1;
        }
        let s = first * h..b * h;
        activate_rows(
            &prev[s.clone()],
            &mut out[s.clone()],
            &mut r[s.clone()],
            &mut z[s.clone()],
            &mut n[s.clone()],
            &hn[s],
        );
    }
}

/// The gates of consecutive rows as one flat loop: on entry `r`, `z` hold the
/// gate pre-activations, `n` the input part of the candidate's pre-activation
/// and `hn` its recurrent part, biases included; on exit `r`, `z`, `n` hold the
/// activations and `out` is `h_t` (`prev` is `h_{t−1}`). All slices have one length.
#[inline(always)]
fn activate_rows<T: Scalar>(prev: &[T], out: &mut [T], r: &mut [T], z: &mut [T], n: &mut [T], hn: &[T]) {
    let len = out.len();
    let (p, r, z, n, hn) = (&prev[..len], &mut r[..len], &mut z[..len], &mut n[..len], &hn[..len]);
    for k in 0..len {
        let (rk, zk, nk, ok) = gate_unit(r[k], z[k], n[k], hn[k], p[k]);
        r[k] = rk;
        z[k] = zk;
        n[k] = nk;
        out[k] = ok;
    }
}

/// One row's cached activations at one step.
struct Activations<'a, T> {
    r: &'a [T],
    z: &'a [T],
    n: &'a [T],
    hn: &'a [T],
}

impl<'a, T: Scalar> Activations<'a, T> {
    /// The `h` units starting at `base` of the cache's planes.
    #[inline(always)]
    fn of(cache: &'a GruCache<T>, base: usize, h: usize) -> Self {
        let s = base..base + h;
        Activations { r: &cache.r[s.clone()], z: &cache.z[s.clone()], n: &cache.n[s.clone()], hn: &cache.hn[s] }
    }
}

/// One row's gate gradients at one step, for `dh = ∂L/∂h_t` and `hp = h_{t−1}`:
/// with respect to the pre-activations of `r`, `z` and `n` (`n` before the
/// `r ⊙` product), to the candidate's recurrent part `W_hn h + b_hn`
/// (`dhn = r ⊙ dn`), and to `h_{t−1}` along the direct `z ⊙ h` path. Every
/// slice is one row (`h` values); taking them as separate arguments lets the
/// compiler vectorize the loop (they cannot alias).
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn gate_grads_row<T: Scalar>(
    acts: &Activations<'_, T>,
    dh: &[T],
    hp: &[T],
    dr: &mut [T],
    dz: &mut [T],
    dn: &mut [T],
    dhn: &mut [T],
    dprev: &mut [T],
) {
    let h = dh.len();
    let (r, z, n, hn, hp) = (&acts.r[..h], &acts.z[..h], &acts.n[..h], &acts.hn[..h], &hp[..h]);
    let (dr, dz, dn, dhn, dprev) = (&mut dr[..h], &mut dz[..h], &mut dn[..h], &mut dhn[..h], &mut dprev[..h]);
    for j in 0..h {
        let d = dh[j];
        let g_n = d * (T::ONE - z[j]) * (T::ONE - n[j] * n[j]);
        dr[j] = g_n * hn[j] * r[j] * (T::ONE - r[j]);
        dz[j] = d * (hp[j] - n[j]) * z[j] * (T::ONE - z[j]);
        dn[j] = g_n;
        dhn[j] = g_n * r[j];
        dprev[j] = d * z[j];
    }
}

#[inline(always)]
fn tanh<T: Scalar>(x: T) -> T {
    // tanh(x) = 2σ(2x) − 1, stable for large |x|.
    sigmoid_fast(x + x) * T::from_f64(2.0) - T::ONE
}

/// Time steps per chunk of the split cell: as many as fill about 256 KiB with
/// `per_step` values (at least one).
fn chunk_steps<T>(per_step: usize) -> usize {
    #[cfg(test)]
    {
        let forced = tests::FORCE_CHUNK.with(|c| c.get());
        if forced > 0 {
            return forced;
        }
    }
    // Measured at B 256, T 50, 36→36 with chunk-sized buffers: 128–256 KiB chunks
    // are 3–5% faster than 512 KiB and 7–10% faster than 1 MiB (the chunk's gx,
    // dGx and dGh no longer fit in L2 beside the weights and states).
    ((256 << 10) / (per_step.max(1) * std::mem::size_of::<T>())).max(1)
}

/// `x: [B × T × w]` (batch-major) in the packed layout: `[rows × w]`, row
/// `offsets[t] + p` being step `t` of sequence `order[p]`, plus `LANES` zeros
/// of slack (the weight gradient reads rows to whole vectors).
fn pack_rows<T: Scalar>(x: &[T], steps: usize, w: usize, packed: &PackedSequences, out: &mut Vec<T>) {
    out.clear();
    for t in 0..steps {
        for &b in &packed.order[..packed.active(t)] {
            out.extend_from_slice(&x[(b * steps + t) * w..(b * steps + t + 1) * w]);
        }
    }
    out.resize(out.len() + LANES, T::ZERO);
}

/// The states `h_0 … h_T` (`[T + 1] × [B × H]`, batch order) from the packed
/// `hs`: past its length a sequence keeps its last state; a sequence of length
/// 0 keeps the zero state.
fn unpack_states<T: Scalar>(
    lengths: &[usize],
    batch: usize,
    steps: usize,
    h: usize,
    packed: &PackedSequences,
    hs: &[T],
    states: &mut Vec<T>,
) {
    let bh = batch * h;
    states.resize((steps + 1) * bh, T::ZERO);
    states[..bh].fill(T::ZERO);
    for (p, &b) in packed.order.iter().enumerate() {
        let len = lengths[b].min(steps);
        for t in 1..=steps {
            let dst = &mut states[t * bh + b * h..t * bh + (b + 1) * h];
            if len == 0 {
                dst.fill(T::ZERO);
            } else {
                let row = packed.offsets[t.min(len) - 1] + p;
                dst.copy_from_slice(&hs[row * h..(row + 1) * h]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use tiderec_records::rng::normal_f64;

    thread_local! {
        /// Steps per input-side GEMM forced by a test (0: the size rule).
        pub(super) static FORCE_CHUNK: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// (layer, params, x, lengths, batch, steps, dstates)
    type Setup = (Gru, Vec<f64>, Vec<f64>, Vec<usize>, usize, usize, Vec<f64>);

    fn setup() -> Setup {
        let gru = Gru { input: 3, hidden: 4, offset: 1 };
        let (batch, steps) = (3, 4);
        let mut params = vec![0.0; 1 + gru.num_params()];
        gru.init(&mut params, 2, 0);
        let x: Vec<f64> = (0..batch * steps * 3).map(|i| normal_f64(3, 0, i as u64, 0)).collect();
        let lengths = vec![4, 2, 0];
        let r: Vec<f64> = (0..steps * batch * 4).map(|i| normal_f64(4, 0, i as u64, 0)).collect();
        (gru, params, x, lengths, batch, steps, r)
    }

    fn loss_of(gru: &Gru, p: &[f64], x: &[f64], lengths: &[usize], batch: usize, steps: usize, r: &[f64]) -> f64 {
        let mut c = GruCache::default();
        gru.forward(p, x, lengths, batch, steps, &mut c);
        c.states[batch * 4..].iter().zip(r).map(|(a, b)| a * b).sum()
    }

    #[test]
    fn gru_gradients_match_finite_differences() {
        let (gru, params, x, lengths, batch, steps, r) = setup();
        let mut cache = GruCache::default();
        gru.forward(&params, &x, &lengths, batch, steps, &mut cache);
        let mut grads = vec![0.0; params.len()];
        let mut dx = vec![0.0; x.len()];
        gru.backward(&params, &x, &lengths, &cache, &r, &mut grads, &mut dx);
        check_gradients(&params[1..], &grads[1..], |p| {
            let mut full = params.clone();
            full[1..].copy_from_slice(p);
            loss_of(&gru, &full, &x, &lengths, batch, steps, &r)
        });
        check_gradients(&x, &dx, |xx| loss_of(&gru, &params, xx, &lengths, batch, steps, &r));
        // A sequence of length 0 keeps the zero state and gets no input gradient.
        assert!(cache.state(steps, 4)[2 * 4..3 * 4].iter().all(|&v| v == 0.0));
        assert!(dx[2 * steps * 3..].iter().all(|&v| v == 0.0));
    }

    /// Widths below a vector and a batch of one (the last micro-batch of a
    /// stream): the weight gradient cannot read whole vectors past the states
    /// and falls back to the general GEMM; both cells still agree (f32 kernels).
    #[test]
    fn tiny_widths_and_a_single_sequence_agree_in_f32() {
        for (input, hidden, batch, steps) in [(1, 1, 1, 3), (2, 3, 1, 2), (5, 7, 2, 4), (9, 12, 1, 5)] {
            let gru = Gru { input, hidden, offset: 0 };
            let mut params = vec![0.0f32; gru.num_params()];
            gru.init(&mut params, 5, 0);
            let x: Vec<f32> = (0..batch * steps * input).map(|i| normal_f64(6, 0, i as u64, 0) as f32).collect();
            let lengths: Vec<usize> = (0..batch).map(|b| steps - b % steps).collect();
            let r: Vec<f32> = (0..steps * batch * hidden).map(|i| normal_f64(7, 0, i as u64, 0) as f32).collect();
            let (mut a, mut b) = (GruCache::default(), GruCache::default());
            gru.forward(&params, &x, &lengths, batch, steps, &mut a);
            gru.forward_unsplit(&params, &x, &lengths, batch, steps, &mut b);
            let (mut ga, mut gb) = (vec![0.0f32; params.len()], vec![0.0f32; params.len()]);
            let (mut dxa, mut dxb) = (vec![0.0f32; x.len()], vec![0.0f32; x.len()]);
            gru.backward(&params, &x, &lengths, &a, &r, &mut ga, &mut dxa);
            gru.backward_unsplit(&params, &x, &lengths, &b, &r, &mut gb, &mut dxb);
            for (u, v) in a.states.iter().zip(&b.states).chain(ga.iter().zip(&gb)).chain(dxa.iter().zip(&dxb)) {
                assert!((u - v).abs() < 1e-5 * (1.0 + v.abs()), "{input}->{hidden} b{batch}: {u} vs {v}");
            }
        }
    }

    #[test]
    fn packing_sorts_by_length_and_counts_the_running_sequences() {
        let mut packed = PackedSequences::default();
        // Lengths past the steps count as the steps; ties keep batch order.
        packed.pack(&[2, 5, 0, 7, 1], 5);
        assert_eq!(packed.order, [1, 3, 0, 4, 2]);
        assert_eq!(packed.offsets, [0, 4, 7, 9, 11, 13]);
        assert_eq!((0..5).map(|t| packed.active(t)).collect::<Vec<_>>(), [4, 3, 2, 2, 2]);
        // Reused for a batch with other lengths.
        packed.pack(&[0, 0], 3);
        assert_eq!(
            (packed.order.as_slice(), packed.offsets.as_slice(), packed.rows()),
            (&[0, 1][..], &[0, 0, 0, 0][..], 0)
        );
    }

    #[test]
    fn split_and_unsplit_cells_agree() {
        let (gru, params, x, lengths, batch, steps, r) = setup();
        let (mut a, mut b) = (GruCache::default(), GruCache::default());
        gru.forward(&params, &x, &lengths, batch, steps, &mut a);
        gru.forward_unsplit(&params, &x, &lengths, batch, steps, &mut b);
        for (u, v) in a.states.iter().zip(&b.states) {
            assert!((u - v).abs() < 1e-12, "{u} vs {v}");
        }
        let (mut ga, mut gb) = (vec![0.0; params.len()], vec![0.0; params.len()]);
        let (mut dxa, mut dxb) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        gru.backward(&params, &x, &lengths, &a, &r, &mut ga, &mut dxa);
        gru.backward_unsplit(&params, &x, &lengths, &b, &r, &mut gb, &mut dxb);
        for (u, v) in ga[1..].iter().zip(&gb[1..]).chain(dxa.iter().zip(&dxb)) {
            assert!((u - v).abs() < 1e-10, "{u} vs {v}");
        }
    }

    #[test]
    fn chunked_input_gemms_and_reused_caches_agree_with_the_unsplit_cell() {
        let (gru, params, x, lengths, batch, steps, r) = setup();
        let reference = |lengths: &[usize]| {
            let mut c = GruCache::default();
            gru.forward_unsplit(&params, &x, lengths, batch, steps, &mut c);
            let (mut g, mut dx) = (vec![0.0; params.len()], vec![0.0; x.len()]);
            gru.backward_unsplit(&params, &x, lengths, &c, &r, &mut g, &mut dx);
            (c.states, g, dx)
        };
        let other_lengths = vec![1, 4, 3];
        for chunk in [1, 2, 3, 4, 7] {
            FORCE_CHUNK.with(|c| c.set(chunk));
            // One cache for batches of different lengths, as in training.
            let mut cache = GruCache::default();
            for lens in [&other_lengths, &lengths, &other_lengths] {
                let (states, g_ref, dx_ref) = reference(lens);
                gru.forward(&params, &x, lens, batch, steps, &mut cache);
                let (mut g, mut dx) = (vec![7.0; params.len()], vec![7.0; x.len()]);
                gru.backward(&params, &x, lens, &cache, &r, &mut g, &mut dx);
                for (u, v) in cache.states.iter().zip(&states) {
                    assert!((u - v).abs() < 1e-12, "chunk {chunk}: state {u} vs {v}");
                }
                for (u, v) in g[1..].iter().zip(&g_ref[1..]).chain(dx.iter().zip(&dx_ref)) {
                    assert!((u - v).abs() < 1e-10, "chunk {chunk} lengths {lens:?}: {u} vs {v}");
                }
            }
        }
        FORCE_CHUNK.with(|c| c.set(0));
    }
}
