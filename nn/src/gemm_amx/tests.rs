use super::*;
use std::cell::Cell;
use tiderec_records::cpu::{self, Feature};

thread_local! {
    /// Whether this test thread runs the AMX products on emulated tiles.
    static EMULATE: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread asked for emulated tiles ([`on_tiles`]).
pub(super) fn emulating_here() -> bool {
    EMULATE.with(Cell::get)
}

/// The AMX products of this test thread run on [`OnTiles::unit`] while it lives.
pub(crate) struct OnTiles {
    pub(crate) unit: TileUnit,
}

impl Drop for OnTiles {
    fn drop(&mut self) {
        EMULATE.with(|e| e.set(false));
    }
}

/// Tiles for this test thread: the CPU's where it has usable AMX (or the
/// process asked for emulated ones), emulated ones where it has the AVX-512
/// F, BW and BF16 the packing and the epilogues need and the cap allows
/// `amx`; `None`, saying why, elsewhere. Emulated tiles check everything but
/// the tile instructions themselves ([`emulated`](crate::amx_tile::emulated)).
pub(crate) fn on_tiles() -> Option<OnTiles> {
    if let Some(unit) = cpu::tile_unit() {
        return Some(OnTiles { unit });
    }
    if !cpu::max_isa().allows(Feature::AmxBf16) {
        eprintln!("skipped: the cap turns AMX off, emulated tiles too ({})", cpu::describe());
        return None;
    }
    if [Feature::Avx512F, Feature::Avx512Bw, Feature::Avx512Bf16].into_iter().all(cpu::has) {
        eprintln!("this CPU has no usable AMX-BF16: the AMX products run on emulated tiles");
        EMULATE.with(|e| e.set(true));
        return Some(OnTiles { unit: TileUnit::Emulated });
    }
    eprintln!(
        "skipped: this CPU has neither usable AMX-BF16 nor AVX-512 BF16 for emulated tiles ({})",
        cpu::describe()
    );
    None
}

/// Runs `check` with the bf16 products on AMX tiles ([`on_tiles`]; skipped, saying why,
/// where there are none), after checking that the best bf16 kernel is then the AMX one.
pub(crate) fn on_amx_tiles(check: impl FnOnce()) {
    let Some(tiles) = on_tiles() else { return };
    assert_eq!(crate::gemm_bf16::Bf16Kernel::best(), crate::gemm_bf16::Bf16Kernel::Amx, "{:?}", tiles.unit);
    check();
}

fn operands(m: usize, n: usize, k: usize, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    // Normal values scaled over a wide range of exponents, so the order of
    // the sums shows in the last bits.
    let val = |i: usize| {
        let x = tiderec_records::rng::normal_f64(seed, i as u64, 0, 0);
        let e = (tiderec_records::rng::unit_f64(seed, i as u64, 1, 0) * 16.0) as i32 - 8;
        (x * 2f64.powi(e)) as f32
    };
    let a = (0..m * k).map(val).collect();
    let b = (0..k * n).map(|i| val(i + 10_000_000)).collect();
    let c = (0..m * n).map(|i| val(i + 20_000_000)).collect();
    (a, b, c)
}

/// Shapes with every edge: one row, rows past 32, widths not multiples of
/// 16 or 32, odd `k`, `k` past one and two chunks of the reduction, one column.
const SHAPES: [(usize, usize, usize); 13] = [
    (1, 1, 1),
    (3, 5, 2),
    (13, 17, 13),
    (33, 33, 31),
    (32, 32, 32),
    (64, 64, 64),
    (37, 70, 257),
    (64, 512, 13),
    (128, 1, 256),
    (50, 16, 600),
    (2, 40, 1000),
    (70, 96, 513),
    (33, 40, 2100),
];

/// The kernel, on both layouts of both operands, accumulating or not,
/// equals [`gemm_amx_reference`] bit for bit.
#[test]
fn kernel_equals_the_oracle_bit_for_bit() {
    let Some(_tiles) = on_tiles() else { return };
    let (mut lhs, mut rhs) = (AmxLhs::default(), AmxRhs::default());
    for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
        let (a, b, c0) = operands(m, n, k, s as u64);
        for (op_a, op_b, accumulate) in
            [(Op::N, Op::T, true), (Op::T, Op::N, false), (Op::N, Op::N, false), (Op::T, Op::T, true)]
        {
            let mut want = c0.clone();
            gemm_amx_reference(op_a, op_b, m, n, k, &a, &b, accumulate, &mut want);
            lhs.pack(op_a, m, k, &a);
            rhs.pack(op_b, k, n, &b);
            let mut got = c0.clone();
            gemm_amx(&lhs, &rhs, accumulate, &mut got, n);
            for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                assert!(
                    x.to_bits() == y.to_bits(),
                    "{op_a:?}{op_b:?} {m}x{n}x{k} acc {accumulate} [{i}]: {x:e} vs {y:e}"
                );
            }
        }
    }
}

/// Every shape of [`SHAPES`] with every start and epilogue (the ReLU's
/// backward against its output as values and as packed), each handed to
/// `f` with the packed operands, `c`'s starting values and the case's name.
fn each_case(seed: u64, mut f: impl FnMut(&str, (&AmxLhs, &AmxRhs), (Start<'_>, Epilogue<'_>), &[f32], usize)) {
    let (mut lhs, mut rhs, mut relu_packed) = (AmxLhs::default(), AmxRhs::default(), AmxRhs::default());
    for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
        let (a, b, c0) = operands(m, n, k, seed + s as u64);
        let bias: Vec<f32> = c0[..n].to_vec();
        let relu_out: Vec<f32> = c0.iter().rev().copied().collect();
        lhs.pack(Op::N, m, k, &a);
        rhs.pack(Op::T, k, n, &b);
        relu_packed.pack(Op::N, m, n, &relu_out);
        let starts = [Start::Zero, Start::Output, Start::Row(&bias)];
        let epilogues = [
            Epilogue::None,
            Epilogue::Relu,
            Epilogue::ReluBackward(&relu_out),
            Epilogue::ReluBackwardPacked(&relu_packed),
        ];
        for (start, epilogue) in starts.iter().flat_map(|&s| epilogues.iter().map(move |&e| (s, e))) {
            let case = format!("{m}x{n}x{k} {start:?} {epilogue:?}");
            f(&case, (&lhs, &rhs), (start, epilogue), &c0, k);
        }
    }
}

/// A product that packs its output for the next one writes the same `c`
/// as one that does not, and the packed output equals `c` packed
/// afterwards, padding included, bit for bit, as a left operand and as a
/// right one: on every shape, start and epilogue, into buffers left from a
/// larger shape.
#[test]
fn packing_the_output_equals_packing_it_afterwards() {
    let Some(_tiles) = on_tiles() else { return };
    let want_next = &mut AmxLhs::default();
    let (mut next, mut rows, mut want_rows) = (AmxLhs::default(), AmxRhs::default(), AmxRhs::default());
    let (big, _, _) = operands(70, 1, 600, 1);
    next.pack(Op::N, 70, 600, &big);
    rows.pack(Op::N, 70, 600, &big);
    each_case(200, |case, (lhs, rhs), (start, epilogue), c0, _| {
        let (m, n) = (lhs.m(), rhs.n());
        let mut want = c0.to_vec();
        gemm_amx_from(lhs, rhs, start, epilogue, &mut want, n);
        want_next.pack(Op::N, m, n, &want);
        want_rows.pack(Op::N, m, n, &want);
        let mut got = c0.to_vec();
        gemm_amx_packing(lhs, rhs, (start, epilogue), (&mut got, n), &mut next, Some(&mut rows));
        assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "c differs: {case}");
        let shape = |l: &Layout| (l.count, l.pairs, l.kp);
        assert_eq!(shape(&next.layout), shape(&want_next.layout), "{case}");
        assert_eq!(next.layout.used(), want_next.layout.used(), "packed output differs: {case}");
        assert_eq!(shape(&rows.layout), shape(&want_rows.layout), "{case}");
        assert_eq!(rows.layout.used(), want_rows.layout.used(), "output packed as rows differs: {case}");
    });
}

/// Packing while summing leaves the packing as it was, and its sums equal
/// [`row_sums`] bit for bit (and that, each row's chain in order), on both
/// layouts: the transposed one sums in the packing kernel where the CPU has
/// AVX-512 BF16, elsewhere in `row_sums`.
#[test]
fn packing_while_summing_equals_the_row_sums() {
    let (mut plain, mut summing) = (AmxLhs::default(), AmxLhs::default());
    for (s, &(m, _, k)) in SHAPES.iter().enumerate() {
        let (a, _, _) = operands(m, 1, k, 100 + s as u64);
        for op in [Op::T, Op::N] {
            let at = |i: usize, p: usize| if op == Op::N { a[i * k + p] } else { a[p * m + i] };
            let want: Vec<u32> = (0..m).map(|i| (0..k).fold(0.0f32, |acc, p| acc + at(i, p)).to_bits()).collect();
            let mut sums = vec![f32::NAN; m + 3];
            row_sums(op, m, k, &a, &mut sums);
            assert_eq!(sums[..m].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "row_sums {op:?} {m}x{k}");
            assert!(sums[m..].iter().all(|v| v.is_nan()), "row_sums wrote past m");
            plain.pack(op, m, k, &a);
            let mut fused = vec![f32::NAN; m + 3];
            summing.pack_summing(op, m, k, &a, Some(&mut fused));
            assert_eq!(fused[..m].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "fused {op:?} {m}x{k}");
            assert!(fused[m..].iter().all(|v| v.is_nan()), "the fused sums wrote past m");
            assert_eq!(plain.layout.used(), summing.layout.used(), "packing {op:?} {m}x{k}");
        }
    }
}

/// The oracle's order is the hardware's and no other: the same products
/// summed as one chain in order differ from it on these operands, so the
/// bit-for-bit test above could fail.
#[test]
fn the_oracle_is_not_a_plain_chain() {
    let (m, n, k) = (16, 16, 64);
    let (a, b, _) = operands(m, n, k, 7);
    let mut amx = vec![0.0; m * n];
    gemm_amx_reference(Op::N, Op::N, m, n, k, &a, &b, false, &mut amx);
    let mut chain = vec![0.0; m * n];
    crate::gemm_bf16::gemm_bf16_reference(Op::N, Op::N, m, n, k, &a, &b, false, &mut chain);
    let differ = amx.iter().zip(&chain).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    assert!(differ > m * n / 10, "{differ} of {} entries differ", m * n);
}

/// Rows of `c` wider than `n`: the columns past `n` are never written, and
/// buffers reused for smaller shapes are fully rewritten.
#[test]
fn only_the_product_entries_are_written() {
    let Some(_tiles) = on_tiles() else { return };
    let (mut lhs, mut rhs) = (AmxLhs::default(), AmxRhs::default());
    let (big_a, big_b, _) = operands(70, 70, 90, 9);
    lhs.pack(Op::N, 70, 90, &big_a);
    rhs.pack(Op::N, 90, 70, &big_b);
    let (m, n, k, ldc) = (30, 21, 9, 40);
    let (a, b, _) = operands(m, n, k, 3);
    lhs.pack(Op::N, m, k, &a);
    rhs.pack(Op::N, k, n, &b);
    let mut want = vec![0.0; m * n];
    gemm_amx_reference(Op::N, Op::N, m, n, k, &a, &b, false, &mut want);
    let mut c = vec![f32::NAN; (m - 1) * ldc + n];
    gemm_amx(&lhs, &rhs, false, &mut c, ldc);
    for (idx, &v) in c.iter().enumerate() {
        let (i, j) = (idx / ldc, idx % ldc);
        if j < n {
            assert_eq!(v.to_bits(), want[i * n + j].to_bits(), "[{i}][{j}]");
        } else {
            assert!(v.is_nan(), "[{i}][{j}] written");
        }
    }
}

/// Starting every chain at a bias row equals copying the row into `c` and
/// accumulating, and the ReLU epilogue a ReLU pass afterwards, bit for bit,
/// on shapes with edges and past one chunk.
#[test]
fn a_start_row_equals_a_copied_bias() {
    let Some(_tiles) = on_tiles() else { return };
    let (mut lhs, mut rhs) = (AmxLhs::default(), AmxRhs::default());
    let mut cut = 0;
    for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
        let (a, b, _) = operands(m, n, k, 50 + s as u64);
        let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.37 - 3.0).collect();
        lhs.pack(Op::N, m, k, &a);
        rhs.pack(Op::T, k, n, &b);
        let mut want: Vec<f32> = (0..m).flat_map(|_| bias.iter().copied()).collect();
        gemm_amx_reference(Op::N, Op::T, m, n, k, &a, &b, true, &mut want);
        let mut got = vec![f32::NAN; m * n];
        gemm_amx_from(&lhs, &rhs, Start::Row(&bias), Epilogue::None, &mut got, n);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{m}x{n}x{k}");
        cut += want.iter().filter(|&&v| v < 0.0).count();
        relu_in_place(&mut want);
        gemm_amx_from(&lhs, &rhs, Start::Row(&bias), Epilogue::Relu, &mut got, n);
        assert_eq!(bits(&got), bits(&want), "{m}x{n}x{k} with the ReLU epilogue");
    }
    assert!(cut > 1000, "only {cut} entries were negative: the ReLU was hardly tested");
}

/// The ReLU-backward epilogue equals the product followed by
/// `relu_backward_in_place` against the output, bit for bit, at a stride.
#[test]
fn the_relu_backward_epilogue_equals_a_pass_afterwards() {
    let Some(_tiles) = on_tiles() else { return };
    let (mut lhs, mut rhs) = (AmxLhs::default(), AmxRhs::default());
    for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
        let ldc = n + 3;
        let (a, b, _) = operands(m, n, k, 70 + s as u64);
        let out: Vec<f32> = (0..m * ldc).map(|i| if i % 3 == 0 { 0.0 } else { (i % 7) as f32 - 3.0 }).collect();
        lhs.pack(Op::N, m, k, &a);
        rhs.pack(Op::N, k, n, &b);
        let mut want = vec![0.0f32; m * n];
        gemm_amx_reference(Op::N, Op::N, m, n, k, &a, &b, false, &mut want);
        let mut got = vec![f32::NAN; m * ldc];
        gemm_amx_from(&lhs, &rhs, Start::Zero, Epilogue::ReluBackward(&out), &mut got, ldc);
        for i in 0..m {
            relu_backward_in_place(&mut want[i * n..(i + 1) * n], &out[i * ldc..i * ldc + n]);
            for j in 0..ldc {
                let g = got[i * ldc + j];
                if j < n {
                    assert_eq!(g.to_bits(), want[i * n + j].to_bits(), "{m}x{n}x{k} [{i}][{j}]");
                } else {
                    assert!(g.is_nan(), "{m}x{n}x{k} [{i}][{j}] written");
                }
            }
        }
    }
}

/// The vector packing of rows of `b` writes the portable packing's bits.
#[test]
fn row_packing_equals_portable() {
    if !crate::bf16_pack::bf16_vector_available() {
        eprintln!("skipped: this CPU has no AVX-512 BF16 (only the portable packing runs)");
        return;
    }
    for (k, n) in [(1, 1), (2, 3), (32, 16), (33, 17), (7, 40), (64, 33), (100, 5), (31, 70)] {
        let (b, _, _) = operands(k, 1, n, 12);
        let kp = round_up(k.div_ceil(2), TILE_PAIRS);
        let len = n.div_ceil(BLOCK) * kp * BLOCK;
        let (mut got, mut want) = (vec![7u32; len], vec![9u32; len]);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the features were checked; the buffers have the documented sizes.
        unsafe {
            x86::pack_rows(&b, k, n, &mut got, kp)
        };
        pack_rhs_portable(Op::N, &b, k, n, &mut want, kp, &mut Vec::new());
        assert_eq!(got, want, "{k}x{n}");
    }
}

/// The vector packing of columns of `b` (stored `n × k`, a layer's `Wᵀ`)
/// writes the portable packing's bits, padding included.
#[test]
fn column_packing_equals_portable() {
    if !crate::bf16_pack::bf16_vector_available() {
        eprintln!("skipped: this CPU has no AVX-512 BF16 (only the portable packing runs)");
        return;
    }
    for (k, n) in [(1, 1), (2, 3), (32, 16), (33, 17), (7, 40), (64, 33), (100, 5), (31, 70), (367, 512)] {
        let (b, _, _) = operands(n, 1, k, 13);
        let kp = round_up(k.div_ceil(2), TILE_PAIRS);
        let len = n.div_ceil(BLOCK) * kp * BLOCK;
        let (mut got, mut want) = (vec![7u32; len], vec![9u32; len]);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the features were checked; the buffers have the documented sizes.
        unsafe {
            x86::pack_columns(&b, k, n, &mut got, kp)
        };
        pack_rhs_portable(Op::T, &b, k, n, &mut want, kp, &mut Vec::new());
        assert_eq!(got, want, "{k}x{n}");
    }
}

/// The vector transposed packing writes the portable packing's bits.
#[test]
fn transposed_packing_equals_portable() {
    if !crate::bf16_pack::bf16_vector_available() {
        eprintln!("skipped: this CPU has no AVX-512 BF16 (only the portable packing runs)");
        return;
    }
    for (m, k) in [(1, 1), (3, 2), (16, 32), (17, 33), (40, 7), (33, 64), (5, 100)] {
        let (a, _, _) = operands(m, 1, k, 11);
        let kp = round_up(k.div_ceil(2), TILE_PAIRS);
        let (mut got, mut want) = (vec![7u32; m * kp], vec![9u32; m * kp]);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the features were checked; the buffers have the documented sizes.
        unsafe {
            x86::pack_transposed(&a, m, k, &mut got, kp, None)
        };
        pack_transposed_portable(&a, m, k, &mut want, kp, &mut Vec::new());
        assert_eq!(got, want, "{m}x{k}");
    }
}

/// The vector epilogue equals the scalar ReLU passes on the values where a
/// vector select could differ: NaN, `±0`, `±∞`, and at every width 1..=32.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_vector_epilogue_equals_the_scalar_passes_on_special_values() {
    let Some(_tiles) = on_tiles() else { return };
    let special = [f32::NAN, -0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY, -1.5, 2.5, -f32::MIN_POSITIVE];
    let (rows, ldc) = (3, 37);
    let value = |i: usize, shift: usize| special[(i * 7 + shift) % special.len()];
    let out: Vec<f32> = (0..rows * ldc).map(|i| value(i, 3)).collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let kp = 32;
    for cols in 1..=32 {
        for epilogue in [Epilogue::None, Epilogue::Relu, Epilogue::ReluBackward(&out)] {
            let c: Vec<f32> = (0..rows * ldc).map(|i| value(i, cols)).collect();
            let mut want = c.clone();
            let mut want_pairs = vec![0u32; rows * kp];
            for r in 0..rows {
                epilogue.apply(&mut want, ldc, (r, 2, cols));
                let row = &want[r * ldc + 2..r * ldc + 2 + cols];
                round_row_pairs(row, &mut want_pairs[r * kp + 1..r * kp + 17]);
            }
            for pack in [false, true] {
                let mut got = c.clone();
                let mut pairs = vec![u32::MAX; rows * kp];
                let to =
                    super::x86::PackTo { lhs: pack.then_some((pairs.as_mut_ptr(), kp)), rows: None, transposed: None };
                // SAFETY: AMX, emulated or not, runs only with AVX-512 F, BW and BF16; the block (rows × cols
                // from column 2) lies inside `got` and `out`, its pairs (1 to 16) in `pairs`.
                unsafe {
                    let block = (got.as_mut_ptr().add(2), ldc);
                    super::x86::finish_block(epilogue, block, ldc, (0, 2), (rows, cols), to, true)
                };
                assert_eq!(bits(&got), bits(&want), "{cols} columns, {epilogue:?}, packing {pack}");
                if pack {
                    for r in 0..rows {
                        let (got, want) = (&pairs[r * kp..(r + 1) * kp], &want_pairs[r * kp..(r + 1) * kp]);
                        assert_eq!(got[1..17], want[1..17], "{cols} columns, {epilogue:?}: row {r}'s pairs");
                        assert!(got[..1].iter().chain(&got[17..]).all(|&p| p == u32::MAX), "written past the block");
                    }
                }
            }
        }
    }
}

/// The ReLU-backward epilogue reading the packed output equals the scalar
/// pass against that output rounded to bf16, bit for bit, on special values
/// (NaN, `±0`, `±∞`, denormals), at every width 1..=32 of the first and of
/// the second panel; against the `f32` output it differs only where that is
/// a positive denormal, which rounds to `+0`.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_packed_relu_backward_reads_the_rounded_output() {
    let Some(_tiles) = on_tiles() else { return };
    let tiny = f32::from_bits(1);
    let special = [f32::NAN, -0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY, -1.5, 2.5, tiny, -tiny, 1e-39, 3.0];
    let (rows, ldc) = (5, 64);
    let value = |i: usize, shift: usize| special[(i * 7 + shift) % special.len()];
    let out: Vec<f32> = (0..rows * ldc).map(|i| value(i, 3)).collect();
    let rounded: Vec<f32> = out.iter().map(|&x| bf16_to_f32(round_bf16(x))).collect();
    let mut packed = AmxRhs::default();
    packed.pack(Op::N, rows, ldc, &out);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let none = super::x86::PackTo { lhs: None, rows: None, transposed: None };
    for (j, cols) in [0, 32].into_iter().flat_map(|j| (1..=32).map(move |cols| (j, cols))) {
        let c: Vec<f32> = (0..rows * ldc).map(|i| value(i, cols) * 0.5 + 1.0).collect();
        let (mut want, mut exact) = (c.clone(), c.clone());
        for r in 0..rows {
            Epilogue::ReluBackward(&rounded).apply(&mut want, ldc, (r, j, cols));
            Epilogue::ReluBackward(&out).apply(&mut exact, ldc, (r, j, cols));
        }
        let mut scalar = c.clone();
        let mut got = c.clone();
        for r in 0..rows {
            Epilogue::ReluBackwardPacked(&packed).apply(&mut scalar, ldc, (r, j, cols));
        }
        // SAFETY: AMX, emulated or not, runs only with AVX-512 F, BW and BF16; the block (rows × cols from
        // column j, a multiple of 32) lies inside `got` and the packed output.
        unsafe {
            let block = (got.as_mut_ptr().add(j), ldc);
            super::x86::finish_block(
                Epilogue::ReluBackwardPacked(&packed),
                block,
                ldc,
                (0, j),
                (rows, cols),
                none,
                true,
            )
        };
        assert_eq!(bits(&scalar), bits(&want), "scalar: {cols} columns from {j}");
        assert_eq!(bits(&got), bits(&want), "vector: {cols} columns from {j}");
        for (at, (&g, &e)) in got.iter().zip(&exact).enumerate() {
            let inside = (j..j + cols).contains(&(at % ldc));
            let positive_denormal = out[at] > 0.0 && out[at].is_subnormal();
            let differs = inside && positive_denormal && e != 0.0;
            assert_eq!(g.to_bits() != e.to_bits(), differs, "at {at}: {g} against {e}");
        }
    }
}

/// [`gemm_amx_into`] packs the finished `c` as packing it afterwards does,
/// bit for bit, padding included: as a left operand, as a right one, and
/// transposed with its column sums ([`AmxLhs::pack_summing`]); without
/// `write_c` it leaves `c` as it was where one chunk holds the reduction
/// (elsewhere it writes `c`): on every shape, start and epilogue, into
/// buffers left from a larger shape.
#[test]
fn every_packing_equals_packing_afterwards_with_or_without_c() {
    let Some(_tiles) = on_tiles() else { return };
    let (mut next, mut rows, mut t) = (AmxLhs::default(), AmxRhs::default(), AmxLhs::default());
    let (mut want_next, mut want_rows, mut want_t) = (AmxLhs::default(), AmxRhs::default(), AmxLhs::default());
    let (big, _, _) = operands(70, 1, 600, 1);
    next.pack(Op::N, 70, 600, &big);
    rows.pack(Op::N, 70, 600, &big);
    t.pack(Op::T, 600, 70, &big);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    each_case(300, |case, (lhs, rhs), (start, epilogue), c0, k| {
        let (m, n) = (lhs.m(), rhs.n());
        let mut want = c0.to_vec();
        gemm_amx_from(lhs, rhs, start, epilogue, &mut want, n);
        let mut want_sums = vec![f32::NAN; n];
        want_next.pack(Op::N, m, n, &want);
        want_rows.pack(Op::N, m, n, &want);
        want_t.pack_summing(Op::T, n, m, &want, Some(&mut want_sums));
        for write_c in [false, true] {
            let case = format!("{case} write_c {write_c}");
            let (mut got, mut sums) = (c0.to_vec(), vec![f32::NAN; n + 1]);
            let packings = Packings {
                lhs: Some(&mut next),
                rows: Some(&mut rows),
                transposed: Some((&mut t, &mut sums[..n])),
                write_c,
            };
            gemm_amx_into(lhs, rhs, (start, epilogue), (&mut got, n), packings);
            let one_chunk = k.div_ceil(2).div_ceil(TILE_PAIRS) * TILE_PAIRS <= CHUNK_PAIRS;
            assert_eq!(bits(&got), bits(if one_chunk && !write_c { c0 } else { &want }), "c: {case}");
            let shape = |l: &Layout| (l.count, l.pairs, l.kp);
            assert_eq!(shape(&next.layout), shape(&want_next.layout), "{case}");
            assert_eq!(next.layout.used(), want_next.layout.used(), "as a left operand: {case}");
            assert_eq!(shape(&rows.layout), shape(&want_rows.layout), "{case}");
            assert_eq!(rows.layout.used(), want_rows.layout.used(), "as rows: {case}");
            assert_eq!(shape(&t.layout), shape(&want_t.layout), "{case}");
            assert_eq!(t.layout.used(), want_t.layout.used(), "transposed: {case}");
            assert_eq!(bits(&sums[..n]), bits(&want_sums), "column sums: {case}");
            assert!(sums[n].is_nan(), "a sum past n written: {case}");
        }
    });
}

/// An empty reduction writes zeros (or leaves `c` when accumulating).
#[test]
fn an_empty_reduction_is_zero() {
    let Some(_tiles) = on_tiles() else { return };
    let (mut lhs, mut rhs) = (AmxLhs::default(), AmxRhs::default());
    lhs.pack(Op::N, 3, 0, &[]);
    rhs.pack(Op::N, 0, 4, &[]);
    let mut c = vec![5.0; 12];
    gemm_amx(&lhs, &rhs, true, &mut c, 4);
    assert!(c.iter().all(|&v| v == 5.0));
    gemm_amx(&lhs, &rhs, false, &mut c, 4);
    assert!(c.iter().all(|&v| v == 0.0));
}
