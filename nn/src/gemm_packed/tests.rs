use super::*;
use crate::gemm::gemm_reference;
use proptest::prelude::*;
use std::cell::Cell;

/// Every seventh index a value a ReLU or its mask treats apart (NaN, ±∞,
/// ±0, ± denormals, one exactly), else `v`.
fn special_or(i: usize, v: f32) -> f32 {
    const SPECIAL: [f32; 9] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-40, -1e-40, 1.0, -1.0];
    if i % 7 == 3 {
        SPECIAL[(i / 7) % SPECIAL.len()]
    } else {
        v
    }
}

fn check<T: Scalar>(m: usize, n: usize, k: usize, transposed: bool, accumulate: bool, seed: u64, tol: f64) {
    let val = |i: usize| T::from_f64(tiderec_records::rng::unit_f64(seed, i as u64, 0, 0) - 0.5);
    let a: Vec<T> = (0..m * k).map(val).collect();
    let b: Vec<T> = (0..k * n).map(|i| val(i + 100_000)).collect();
    let c0: Vec<T> = (0..m * n).map(|i| val(i + 200_000)).collect();
    let op = if transposed { Op::T } else { Op::N };
    let packed = PackedRhs::new(op, k, n, &b);
    let (mut c1, mut c2) = (c0.clone(), c0.clone());
    gemm_packed(m, &a, k, &packed, accumulate, &mut c1, n);
    let beta = if accumulate { T::ONE } else { T::ZERO };
    gemm_reference(Op::N, op, m, n, k, T::ONE, &a, &b, beta, &mut c2);
    for (x, y) in c1.iter().zip(&c2) {
        assert!((x.to_f64() - y.to_f64()).abs() <= tol, "{x:?} vs {y:?} at {m}x{n}x{k}");
    }
}

proptest! {
    #[test]
    fn packed_gemm_matches_reference_f64(m in 0usize..30, n in 0usize..90, k in 0usize..9, t in any::<bool>(), acc in any::<bool>(), seed in any::<u64>()) {
        check::<f64>(m, n, k, t, acc, seed, 1e-12);
    }

    #[test]
    fn packed_gemm_matches_reference_f32(m in 0usize..30, n in 0usize..90, k in 0usize..40, t in any::<bool>(), acc in any::<bool>(), seed in any::<u64>()) {
        check::<f32>(m, n, k, t, acc, seed, 1e-4);
    }
}

#[test]
fn strided_rows_are_read_and_written_in_place() {
    // Rows of a and c spaced wider than a row (a time step of batch-major sequences).
    let (m, n, k, lda, ldc) = (9, 20, 7, 13, 25);
    let val = |i: usize| tiderec_records::rng::unit_f64(3, i as u64, 0, 0) - 0.5;
    let a: Vec<f64> = (0..(m - 1) * lda + k).map(val).collect();
    let b: Vec<f64> = (0..k * n).map(|i| val(i + 1000)).collect();
    let mut c: Vec<f64> = (0..(m - 1) * ldc + n).map(|i| val(i + 2000)).collect();
    let before = c.clone();
    gemm_packed(m, &a, lda, &PackedRhs::new(Op::N, k, n, &b), true, &mut c, ldc);
    for (idx, (&got, &was)) in c.iter().zip(&before).enumerate() {
        let (i, j) = (idx / ldc, idx % ldc);
        let want = if j < n { was + (0..k).map(|p| a[i * lda + p] * b[p * n + j]).sum::<f64>() } else { was };
        assert!((got - want).abs() < 1e-12, "c[{i}][{j}]: {got} vs {want}");
    }
}

/// A product whose `c` is past `C_CHUNKS_OUTSIDE_MAX` runs each row group
/// through every chunk of the reduction; the same rows in slices small
/// enough to run each chunk through every group give it bit for bit, with
/// a forward's bias and ReLU finished as the blocks are written and the
/// column sums added (rows in order either way), on every kernel this CPU runs.
#[test]
fn both_loop_orders_give_equal_sums() {
    let (m, n, k, slice) = (1100, 256, 400, 100);
    assert!(m * n * 4 > C_CHUNKS_OUTSIDE_MAX && slice * n * 4 <= C_CHUNKS_OUTSIDE_MAX && k > K_CHUNK_MAX);
    let val = |i: usize| (tiderec_records::rng::unit_f64(5, i as u64, 0, 0) - 0.5) as f32;
    let a: Vec<f32> = (0..m * k).map(val).collect();
    let w: Vec<f32> = (0..n * k).map(|i| val(i + (1 << 24))).collect();
    let bias: Vec<f32> = (0..n).map(|i| val(i + (1 << 26))).collect();
    let packed = PackedRhs::new(Op::T, k, n, &w);
    for &kernel in PanelKernel::available() {
        let run = |rows: usize, a: &[f32], c: &mut [f32], sums: &[Cell<f32>]| {
            let finish = Finish { row: Some(&bias), relu: true, mask: None, sums: Some(sums) };
            gemm_packed_finish_with(rows, a, k, &packed, (false, finish), c, n, |s| packed_span_f32_with(kernel, s));
        };
        let (whole_sums, sliced_sums) = (vec![Cell::new(0.0f32); n], vec![Cell::new(0.0f32); n]);
        let mut whole = vec![f32::NAN; m * n];
        run(m, &a, &mut whole, &whole_sums);
        let mut sliced = vec![f32::NAN; m * n];
        for (a, c) in a.chunks(slice * k).zip(sliced.chunks_mut(slice * n)) {
            run(c.len() / n, a, c, &sliced_sums);
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(bits(&whole) == bits(&sliced), "{kernel:?}: the loop orders differ");
        let sums = |v: &[Cell<f32>]| v.iter().map(|x| x.get().to_bits()).collect::<Vec<_>>();
        assert!(sums(&whole_sums) == sums(&sliced_sums), "{kernel:?}: the loop orders' column sums differ");
    }
}

/// One buffer re-packed from a large operand to smaller ones (as an MLP's
/// layers share it): every packed value is the operand's, every padding
/// value is zero, whatever the previous pack left there.
#[test]
fn repacking_a_reused_buffer_writes_every_value() {
    let mut packed = PackedRhs::default();
    packed.pack(Op::N, 30, 100, &vec![7.0f32; 3000]);
    for (op, k, n) in [(Op::N, 9, 13), (Op::T, 11, 45), (Op::T, 5, 100), (Op::N, 3, 7)] {
        let b: Vec<f32> = (0..k * n).map(|i| i as f32 + 1.0).collect();
        packed.pack(op, k, n, &b);
        let fresh = PackedRhs::new(op, k, n, &b);
        assert_eq!(&packed.panels[..], &fresh.panels[..], "{op:?} {k}x{n}");
        let mut start = 0;
        for (first, pw) in panels(n) {
            let width = pw.min(n - first);
            for p in 0..k {
                let row = &packed.panels[start + p * pw..start + (p + 1) * pw];
                for (j, &v) in row.iter().enumerate() {
                    let want = if j >= width {
                        0.0
                    } else {
                        match op {
                            Op::N => b[p * n + first + j],
                            Op::T => b[(first + j) * k + p],
                        }
                    };
                    assert_eq!(v, want, "{op:?} {k}x{n}: panel at {first}, row {p}, column {j}");
                }
            }
            start += k * pw;
        }
        assert_eq!(start, packed.panels.len());
    }
}

/// Every kernel this CPU runs (not only the one `gemm_packed` picks) against
/// the reference, with row counts that exercise every block tail.
#[test]
fn every_available_kernel_matches_reference() {
    let kernels = PanelKernel::available();
    for &kernel in kernels {
        for (rows, k, pw, width, accumulate) in [
            (1, 5, 8, 8, false),
            (29, 36, 16, 16, true),
            (23, 32, 32, 32, false),
            (13, 9, 40, 36, true),
            (11, 72, 24, 17, false),
        ] {
            let lda = k + 3;
            let ldc = pw + 2;
            let val = |i: usize| (tiderec_records::rng::unit_f64(11, i as u64, 0, 0) - 0.5) as f32;
            let a: Vec<f32> = (0..rows * lda).map(val).collect();
            let panel: Vec<f32> = (0..k * pw).map(|i| val(i + 50_000)).collect();
            let c0: Vec<f32> = (0..rows * ldc).map(|i| val(i + 90_000)).collect();
            let mut c = c0.clone();
            packed_panel_f32_with(
                kernel,
                PanelProduct {
                    rows,
                    k,
                    a: &a,
                    lda,
                    a_step: 1,
                    panel: &panel,
                    panel_rs: pw,
                    pw,
                    c: &mut c,
                    ldc,
                    width,
                    accumulate,
                },
            );
            for r in 0..rows {
                for j in 0..ldc {
                    let was = c0[r * ldc + j] as f64;
                    let dot: f64 = (0..k).map(|p| a[r * lda + p] as f64 * panel[p * pw + j.min(pw - 1)] as f64).sum();
                    let want = if j >= width {
                        was
                    } else if accumulate {
                        was + dot
                    } else {
                        dot
                    };
                    let got = c[r * ldc + j] as f64;
                    assert!(
                        (got - want).abs() < 1e-4,
                        "{kernel:?} rows {rows} k {k} pw {pw}: c[{r}][{j}] {got} vs {want}"
                    );
                }
            }
        }
    }
    assert!(kernels.contains(&PanelKernel::best()));
}

/// The backward products on the packed kernels against matrixmultiply
/// itself: equal bit for bit on both layouts of `a`, on shapes with one to
/// three runs of [`MM_KC`] reduction steps and edge rows and columns, with
/// every vector kernel, `b` read in place with rows exactly `n` apart and
/// with NaN-filled gaps between rows (which must never reach `c`), ending
/// where its last row ends (a read past it panics), and one `tail` buffer
/// reused across shapes.
#[test]
fn mm_order_equals_matrixmultiply_bit_for_bit() {
    if !f32::packed_panel_is_vectorized() {
        eprintln!("no vector packed kernel on this CPU: the packed backward products are not used");
        return;
    }
    let mut tail = PackedRhs::default();
    for (m, n, k) in [
        (2, 2, 1),
        (64, 512, 256),
        (256, 512, 64),
        (17, 33, 255),
        (16, 13, 257),
        (40, 367, 512),
        (5, 16, 700),
        (9, 47, 30),
        (128, 367, 64),
    ] {
        let val = |i: usize| (tiderec_records::rng::unit_f64(21, i as u64, 0, 0) - 0.5) as f32;
        let b: Vec<f32> = (0..k * n).map(|i| val(i + 7_000_000)).collect();
        for op in [Op::N, Op::T] {
            let a: Vec<f32> = (0..m * k).map(val).collect();
            let mut want = vec![f32::NAN; m * n];
            crate::gemm::gemm(op, Op::N, m, n, k, 1.0, &a, &b, 0.0, &mut want);
            let relu_out: Vec<f32> = (0..m * n).map(|i| special_or(i, val(i + 9_000_000))).collect();
            let mut want_masked = want.clone();
            crate::relu::relu_backward_in_place(&mut want_masked, &relu_out);
            let (lda, a_step) = if op == Op::N { (k, 1) } else { (1, m) };
            for gap in [0, 5] {
                let ldb = n + gap;
                let mut strided = vec![f32::NAN; (k - 1) * ldb + n];
                for p in 0..k {
                    strided[p * ldb..p * ldb + n].copy_from_slice(&b[p * n..(p + 1) * n]);
                }
                let kernels = PanelKernel::available().iter().filter(|&&k| k != PanelKernel::Portable);
                // Each kernel reading `b` in place, then copying it a run at a time.
                let choices = kernels.flat_map(|&kernel| [false, true].map(|copy_b| MmOrderKernel { kernel, copy_b }));
                for choice in choices {
                    let kernel = (choice.kernel, if choice.copy_b { "copied" } else { "in place" });
                    // Without a mask, then through a ReLU's backward whose output is `relu_out`.
                    // The column sums added as the rows are written, from zero.
                    for (mask, want) in [(None, &want), (Some(&relu_out[..]), &want_masked)] {
                        let (mut got, mut sums) = (vec![f32::NAN; m * n], vec![0.0f32; n]);
                        let operands = (k, n, &strided[..], ldb);
                        let out = (&mut got[..], mask, Some(&mut sums[..]));
                        gemm_mm_order_f32(choice, m, &a, lda, a_step, operands, &mut tail, out, n);
                        for (i, (x, y)) in got.iter().zip(want).enumerate() {
                            assert!(
                                x.to_bits() == y.to_bits(),
                                "{kernel:?} {op:?} {m}x{n}x{k} ldb {ldb} mask {} [{i}]: {x} vs {y}",
                                mask.is_some()
                            );
                        }
                        let mut want_sums = vec![0.0f32; n];
                        for row in want.chunks_exact(n) {
                            for (s, &x) in want_sums.iter_mut().zip(row) {
                                *s += x;
                            }
                        }
                        assert!(
                            sums.iter().zip(&want_sums).all(|(x, y)| x.to_bits() == y.to_bits()),
                            "{kernel:?} {op:?} {m}x{n}x{k} ldb {ldb} mask {}: the column sums",
                            mask.is_some()
                        );
                    }
                }
            }
        }
    }
}

/// Packing a block of columns of a strided matrix gives the panels that
/// packing those columns as a matrix of their own gives.
#[test]
fn packing_columns_equals_packing_the_block() {
    let (k, ldb) = (11, 60);
    let b: Vec<f32> = (0..k * ldb).map(|i| i as f32).collect();
    let mut packed = PackedRhs::default();
    packed.pack(Op::N, 30, 100, &vec![7.0f32; 3000]);
    for (first, n) in [(0, 60), (53, 7), (20, 33), (59, 1)] {
        let block: Vec<f32> = (0..k).flat_map(|p| b[p * ldb + first..p * ldb + first + n].to_vec()).collect();
        packed.pack_columns(k, first, n, &b, ldb);
        let want = PackedRhs::new(Op::N, k, n, &block);
        assert_eq!((packed.k, packed.n, &packed.panels[..]), (want.k, want.n, &want.panels[..]), "columns {first}+{n}");
    }
    // No rows: nothing is read, however many columns.
    packed.pack_columns(0, 16, 32, &[], ldb);
    assert_eq!((packed.k, packed.n, packed.panels.len()), (0, 32, 0));
}

proptest! {
    /// The vector kernels differ only in vector width and register blocking:
    /// each entry of `c` is the same chain of fused multiply-adds, so their
    /// results are equal bit for bit (what lets the start-up measurement
    /// choose among them without changing a run's numbers).
    #[test]
    fn vector_kernels_agree_bit_for_bit(rows in 1usize..40, k in 1usize..300, vectors in 1usize..6, cut in 0usize..8, pad in 0usize..3, acc in any::<bool>(), seed in any::<u64>()) {
        let vector_kernels: Vec<PanelKernel> =
            PanelKernel::available().iter().copied().filter(|&kernel| kernel != PanelKernel::Portable).collect();
        let pw = vectors * LANES;
        let width = pw - cut.min(pw - 1);
        let (lda, ldc) = (k + pad, pw + pad);
        let val = |i: usize| (tiderec_records::rng::unit_f64(seed, i as u64, 0, 0) - 0.5) as f32;
        let a: Vec<f32> = (0..rows * lda).map(val).collect();
        let panel: Vec<f32> = (0..k * pw).map(|i| val(i + 1_000_000)).collect();
        let c0: Vec<f32> = (0..rows * ldc).map(|i| val(i + 2_000_000)).collect();
        let mut first: Option<Vec<f32>> = None;
        for &kernel in &vector_kernels {
            let mut c = c0.clone();
            packed_panel_f32_with(
                kernel,
                PanelProduct { rows, k, a: &a, lda, a_step: 1, panel: &panel, panel_rs: pw, pw, c: &mut c, ldc, width, accumulate: acc },
            );
            match &first {
                None => first = Some(c),
                Some(want) => {
                    for (i, (x, y)) in c.iter().zip(want).enumerate() {
                        prop_assert!(x.to_bits() == y.to_bits(), "{:?} c[{}] {} vs {}", kernel, i, x, y);
                    }
                }
            }
        }
    }

    /// Every vector kernel against the scalar oracle of its chain (a fused
    /// multiply-add per step from zero, then one add to `c`), bit for bit,
    /// for each way the values of `a` can lie: a row's values next to each
    /// other, the rows next to each other, or neither.
    #[test]
    fn vector_kernels_equal_their_chain_in_every_layout(rows in 1usize..30, k in 1usize..200, vectors in 1usize..6, layout in 0usize..3, cut in 0usize..8, pad in 0usize..3, acc in any::<bool>(), seed in any::<u64>()) {
        let pw = vectors * LANES;
        let width = pw - cut.min(pw - 1);
        let ldc = pw + pad;
        let (lda, a_step) = match layout {
            0 => (k + pad, 1),
            1 => (1, rows + pad),
            _ => (2 * k + pad + 1, 2),
        };
        let val = |i: usize| (tiderec_records::rng::unit_f64(seed, i as u64, 0, 0) - 0.5) as f32;
        let a: Vec<f32> = (0..(rows - 1) * lda + (k - 1) * a_step + 1).map(val).collect();
        let panel: Vec<f32> = (0..k * pw).map(|i| val(i + 1_000_000)).collect();
        let c0: Vec<f32> = (0..rows * ldc).map(|i| val(i + 2_000_000)).collect();
        let mut want = c0.clone();
        for r in 0..rows {
            for j in 0..width {
                let chain = (0..k).fold(0.0f32, |x, p| a[r * lda + p * a_step].mul_add(panel[p * pw + j], x));
                let o = &mut want[r * ldc + j];
                *o = if acc { *o + chain } else { chain };
            }
        }
        for &kernel in PanelKernel::available().iter().filter(|&&kernel| kernel != PanelKernel::Portable) {
            let mut c = c0.clone();
            packed_panel_f32_with(
                kernel,
                PanelProduct { rows, k, a: &a, lda, a_step, panel: &panel, panel_rs: pw, pw, c: &mut c, ldc, width, accumulate: acc },
            );
            for (i, (x, y)) in c.iter().zip(&want).enumerate() {
                prop_assert!(x.to_bits() == y.to_bits(), "{:?} layout {} c[{}] {} vs {}", kernel, layout, i, x, y);
            }
        }
    }

    /// Every vector kernel, run on whole spans as training runs them
    /// (the wide kernel spanning panels, masking the last vector), gives
    /// the one-panel AVX2 kernel's results bit for bit: odd row counts and
    /// widths, one row, outputs below, at and past a multiple of 16, and
    /// reductions of several chunks, accumulating or not.
    #[test]
    fn wide_kernel_equals_the_one_panel_kernels_bit_for_bit(m in 1usize..60, n in 1usize..150, k in 1usize..420, transposed in any::<bool>(), acc in any::<bool>(), seed in any::<u64>()) {
        let kernels: Vec<PanelKernel> =
            PanelKernel::available().iter().copied().filter(|&kernel| kernel != PanelKernel::Portable).collect();
        let val = |i: usize| (tiderec_records::rng::unit_f64(seed, i as u64, 0, 0) - 0.5) as f32;
        let a: Vec<f32> = (0..m * k).map(val).collect();
        let b: Vec<f32> = (0..k * n).map(|i| val(i + 1_000_000)).collect();
        let c0: Vec<f32> = (0..m * n).map(|i| val(i + 2_000_000)).collect();
        let packed = PackedRhs::new(if transposed { Op::T } else { Op::N }, k, n, &b);
        let mut first: Option<Vec<f32>> = None;
        for &kernel in &kernels {
            let mut c = c0.clone();
            gemm_packed_with(m, &a, k, &packed, acc, &mut c, n, |s| packed_span_f32_with(kernel, s));
            match &first {
                None => first = Some(c),
                Some(want) => {
                    for (i, (x, y)) in c.iter().zip(want).enumerate() {
                        prop_assert!(x.to_bits() == y.to_bits(), "{:?} {}x{}x{} c[{}] {} vs {}", kernel, m, n, k, i, x, y);
                    }
                }
            }
        }
    }

    /// A product with a [`Finish`] (a bias row and the ReLU, or a ReLU's
    /// backward mask, and the column sums) equals the plain product on the
    /// same kernel with the bias written into `c` first, the ReLU or mask
    /// applied after and the rows summed after that, bit for bit (NaN
    /// payloads aside), on every kernel: the wide kernel does it in
    /// registers, the others around each panel. Inputs include NaN,
    /// infinities, zeros of both signs and denormals.
    #[test]
    fn finish_in_registers_equals_finish_around(m in 1usize..60, n in 1usize..150, k in 0usize..420, relu in any::<bool>(), masked in any::<bool>(), summed in any::<bool>(), seed in any::<u64>()) {
        let val = |i: usize| special_or(i.wrapping_mul(2_654_435_761) >> 7, (tiderec_records::rng::unit_f64(seed, i as u64, 0, 0) - 0.5) as f32);
        let a: Vec<f32> = (0..m * k).map(val).collect();
        let b: Vec<f32> = (0..k * n).map(|i| val(i + 1_000_000)).collect();
        let row: Vec<f32> = (0..n).map(|i| val(i + 2_000_000)).collect();
        let mask: Vec<f32> = (0..m * n).map(|i| special_or(i, val(i + 3_000_000))).collect();
        let packed = PackedRhs::new(Op::T, k, n, &b);
        for &kernel in PanelKernel::available() {
            let sums = vec![Cell::new(0.0f32); n];
            let finish = Finish { row: Some(&row[..]), relu, mask: masked.then_some(&mask[..]), sums: summed.then_some(&sums[..]) };
            let mut want: Vec<f32> = (0..m).flat_map(|_| row.iter().copied()).collect();
            gemm_packed_with(m, &a, k, &packed, true, &mut want, n, |s| packed_span_f32_with(kernel, s));
            if relu {
                crate::relu::relu_in_place(&mut want);
            }
            if masked {
                crate::relu::relu_backward_in_place(&mut want, &mask);
            }
            let mut got = vec![f32::NAN; m * n];
            gemm_packed_finish_with(m, &a, k, &packed, (false, finish), &mut got, n, |s| packed_span_f32_with(kernel, s));
            for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                // Which NaN's payload a NaN + NaN keeps is not defined in
                // Rust (the compiler may swap an addition's operands).
                let same = x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
                prop_assert!(same, "{:?} {}x{}x{} relu {} mask {} c[{}] {} vs {}", kernel, m, n, k, relu, masked, i, x, y);
            }
            let mut want_sums = vec![0.0f32; n];
            if summed {
                for out in want.chunks_exact(n) {
                    for (s, &x) in want_sums.iter_mut().zip(out) {
                        *s += x;
                    }
                }
            }
            for (j, (x, y)) in sums.iter().map(Cell::get).zip(&want_sums).enumerate() {
                let same = x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
                prop_assert!(same, "{:?} {}x{}x{} relu {} mask {} sums[{}] {} vs {}", kernel, m, n, k, relu, masked, j, x, y);
            }
        }
    }

    #[test]
    fn unpacked_transposed_gemm_matches_reference(m in 0usize..40, n in 0usize..60, k in 0usize..420, pad in 0usize..3, acc in any::<bool>(), seed in any::<u64>()) {
        let (lda, ldb, ldc) = (m + pad, n + pad, n + 2 * pad);
        let val = |i: usize| tiderec_records::rng::unit_f64(seed, i as u64, 0, 0) - 0.5;
        let a: Vec<f64> = (0..k * lda).map(val).collect();
        // The slack after the last row that reading whole vectors needs.
        let b: Vec<f64> = (0..k * ldb + 8).map(|i| val(i + 100_000)).collect();
        let mut c: Vec<f64> = (0..m * ldc).map(|i| val(i + 200_000)).collect();
        let before = c.clone();
        gemm_tn(m, n, k, &a, lda, &b, ldb, acc, &mut c, ldc);
        for i in 0..m {
            for j in 0..ldc {
                let was = before[i * ldc + j];
                let dot = (0..k).map(|p| a[p * lda + i] * b[p * ldb + j.min(n.max(1) - 1)]).sum::<f64>();
                let want = if j >= n { was } else if acc { was + dot } else { dot };
                prop_assert!((c[i * ldc + j] - want).abs() < 1e-12, "c[{}][{}]: {} vs {}", i, j, c[i * ldc + j], want);
            }
        }
    }
}

#[test]
fn unpacked_transposed_gemm_f32_matches_reference() {
    for (m, n, k) in [(96, 32, 640), (108, 36, 500), (17, 40, 9), (64, 13, 130), (5, 8, 1)] {
        let val = |i: usize| (tiderec_records::rng::unit_f64(5, i as u64, 0, 0) - 0.5) as f32;
        let a: Vec<f32> = (0..k * m).map(val).collect();
        let mut b: Vec<f32> = (0..k * n).map(|i| val(i + 1_000_000)).collect();
        b.resize(k * n + 8, f32::NAN);
        let c0: Vec<f32> = (0..m * n).map(|i| val(i + 2_000_000)).collect();
        let mut c = c0.clone();
        gemm_tn(m, n, k, &a, m, &b, n, true, &mut c, n);
        let mut want = c0.clone();
        gemm_reference(Op::T, Op::N, m, n, k, 1.0, &a, &b[..k * n], 1.0, &mut want);
        for (x, y) in c.iter().zip(&want) {
            // NaN slack past the last row must never reach a written column.
            assert!((x - y).abs() < 1e-3, "{x} vs {y} at {m}x{n}x{k}");
        }
    }
}

#[test]
fn recurrence_shapes_match_reference() {
    // The last two span several reduction chunks.
    for (m, n, k) in [(256, 108, 36), (64, 96, 32), (256, 36, 108), (7, 144, 72), (30, 56, 400), (9, 17, 193)] {
        check::<f32>(m, n, k, true, true, 7, 1e-4);
        check::<f32>(m, n, k, false, false, 8, 1e-4);
    }
}

/// The split wide kernel against the whole one on fixed shapes that run it
/// (reductions past one part and one chunk, a short last part, whole and
/// partial row groups, every count of vectors a group takes, a ragged last
/// panel), with a bias row, the ReLU, a mask and column sums: equal bit for
/// bit, so the property tests' random draws are not all that covers it.
#[test]
fn split_wide_kernel_equals_the_whole_one_on_fixed_shapes() {
    if !PanelKernel::wide_available() {
        eprintln!("this CPU does not run the wide AVX-512 kernel: nothing to compare");
        return;
    }
    for (m, n, k) in [(24, 150, 130), (23, 150, 193), (48, 64, 65), (7, 40, 400), (30, 512, 367), (25, 16, 129)] {
        let val = |i: usize| {
            special_or(
                i.wrapping_mul(2_654_435_761) >> 9,
                (tiderec_records::rng::unit_f64(11, i as u64, 0, 0) - 0.5) as f32,
            )
        };
        let a: Vec<f32> = (0..m * k).map(val).collect();
        let b: Vec<f32> = (0..k * n).map(|i| val(i + 1_000_000)).collect();
        let row: Vec<f32> = (0..n).map(|i| val(i + 2_000_000)).collect();
        let mask: Vec<f32> = (0..m * n).map(|i| val(i + 3_000_000)).collect();
        let packed = PackedRhs::new(Op::T, k, n, &b);
        let run = |kernel: PanelKernel| {
            let sums = vec![Cell::new(0.5f32); n];
            let finish = Finish { row: Some(&row[..]), relu: true, mask: Some(&mask[..]), sums: Some(&sums[..]) };
            let mut c = vec![f32::NAN; m * n];
            gemm_packed_finish_with(m, &a, k, &packed, (false, finish), &mut c, n, |s| packed_span_f32_with(kernel, s));
            let mut plain: Vec<f32> = (0..m * n).map(|i| val(i + 4_000_000)).collect();
            gemm_packed_with(m, &a, k, &packed, true, &mut plain, n, |s| packed_span_f32_with(kernel, s));
            (c, sums.iter().map(Cell::get).collect::<Vec<f32>>(), plain)
        };
        let (whole, split) = (run(PanelKernel::Avx512Wide), run(PanelKernel::Avx512WideSplit));
        for (what, x, y) in
            [("c", &whole.0, &split.0), ("sums", &whole.1, &split.1), ("accumulated", &whole.2, &split.2)]
        {
            for (i, (p, q)) in x.iter().zip(y.iter()).enumerate() {
                let same = p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan());
                assert!(same, "{m}x{n}x{k} {what}[{i}]: whole {p} vs split {q}");
            }
        }
    }
}
