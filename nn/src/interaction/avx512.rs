//! The dot interaction's `f32` kernels on AVX-512F.
//!
//! Forward: per sample the vectors are transposed into `Zᵀ` (`d` rows of the
//! `n` vectors, padded with zeros to a multiple of 16), and eight rows of the
//! lower triangle at a time are computed as `Σ_c zᵢ[c]·Zᵀ[c][·]` over 16- or
//! 32-column blocks: each step loads one or two vectors of `Zᵀ` and
//! broadcasts eight values for up to sixteen independent chains; `Zᵀ` is
//! filled by gathers, sixteen vectors at a time. Backward: `dZ = S·Z` runs
//! eight rows at a time over 16-column vectors of the `z_j`, read where they
//! lie, with the symmetric pair gradient `S` read where it lies in the output
//! gradient (no matrix is built).
//!
//! Invariants: every output is the chain of the portable kernels (the
//! parent module): fused multiply-adds from zero over the components in order
//! (forward) or over `j` in ascending order (backward, the dense vector's own
//! gradient added last), so the results equal theirs bit for bit
//! (`tests::avx512_kernels_equal_the_portable_ones_bit_for_bit`). Lanes past a
//! vector's width are masked off: nothing outside the outputs' rows is written.

use super::DotInteraction;
use std::arch::x86_64::*;

/// Columns per 512-bit vector.
const V: usize = 16;
/// Rows of the output computed together.
const R: usize = 8;

/// Whether the kernels run here (AVX-512F, under `TIDEREC_MAX_ISA`).
#[inline]
pub(super) fn available() -> bool {
    tiderec_records::cpu::has(tiderec_records::cpu::Feature::Avx512F)
}

/// Where each row of the lower triangle starts in an output row and how many
/// pairs it holds: `(start, count)` for vectors `1..n` (index 0 unused).
fn triangle_rows(it: &DotInteraction) -> Vec<(usize, usize)> {
    let n = it.num_sparse + 1;
    let mut rows = vec![(0, 0); n];
    let mut k = it.dim;
    for (i, row) in rows.iter_mut().enumerate().skip(1) {
        let count = if it.self_interaction { i + 1 } else { i };
        *row = (k, count);
        k += count;
    }
    rows
}

/// The lanes `0..count` (`count ≤ 16`) as a mask.
#[inline]
fn lanes(count: usize) -> __mmask16 {
    if count >= V {
        !0
    } else {
        (1u16 << count) - 1
    }
}

/// [`DotInteraction::forward`] for `f32` (the caller checked [`available`]).
///
/// # Panics
/// When a slice is shorter than `batch` samples need.
pub(super) fn forward(it: &DotInteraction, dense: &[f32], pooled: &[f32], batch: usize, out: &mut [f32]) {
    let (d, n, od) = (it.dim, it.num_sparse + 1, it.output_dim());
    let fd = it.num_sparse * d;
    assert!(
        dense.len() >= batch * d && pooled.len() >= batch * fd && out.len() >= batch * od,
        "interaction forward: buffers shorter than {batch} samples"
    );
    if d == 0 {
        // No components: nothing to vectorise.
        return it.forward_portable(dense, pooled, batch, out);
    }
    assert!(fd < i32::MAX as usize, "interaction forward: {fd} values per sample");
    let npad = n.div_ceil(V) * V;
    let mut zt = vec![0.0f32; d * npad];
    let rows = triangle_rows(it);
    for b in 0..batch {
        let z0 = &dense[b * d..(b + 1) * d];
        let zs = &pooled[b * fd..(b + 1) * fd];
        let row = &mut out[b * od..(b + 1) * od];
        // SAFETY: AVX-512F is present (caller); `zt` holds `d` rows of `npad`
        // (≥ n) values, every vector `d` values, and each store stays inside
        // `row` (masked to the row's pairs, which end at `od`).
        unsafe {
            transpose(d, n, npad, z0, zs, &mut zt);
            sample_forward(d, n, npad, &rows, z0, zs, &zt, row);
        }
        if it.self_interaction {
            row[od - 1] = z0.iter().fold(0.0f32, |acc, &x| x.mul_add(x, acc));
        }
    }
}

/// `Zᵀ` of one sample: row `c` holds component `c` of `z₀ … z_{n−1}` (the
/// padding columns stay zero); sixteen pooled vectors per gather.
#[target_feature(enable = "avx512f")]
unsafe fn transpose(d: usize, n: usize, npad: usize, z0: &[f32], zs: &[f32], zt: &mut [f32]) {
    let index = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(d as i32),
    );
    let sparse = n - 1;
    for c in 0..d {
        let t = &mut zt[c * npad..(c + 1) * npad];
        t[0] = z0[c];
        let mut i = 0;
        while i < sparse {
            let mask = lanes(sparse - i);
            let v = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask, index, zs.as_ptr().add(i * d + c));
            _mm512_mask_storeu_ps(t.as_mut_ptr().add(1 + i), mask, v);
            i += V;
        }
    }
}

/// One sample's lower triangle into `row`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn sample_forward(
    d: usize,
    n: usize,
    npad: usize,
    rows: &[(usize, usize)],
    z0: &[f32],
    zs: &[f32],
    zt: &[f32],
    row: &mut [f32],
) {
    let mut first = 0;
    while first < d {
        let mask = lanes(d - first);
        _mm512_mask_storeu_ps(row.as_mut_ptr().add(first), mask, _mm512_maskz_loadu_ps(mask, z0.as_ptr().add(first)));
        first += V;
    }
    let vector = |i: usize| if i == 0 { z0.as_ptr() } else { zs.as_ptr().add((i - 1) * d) };
    let mut i0 = 1;
    while i0 < n {
        // Rows i0 .. i0 + 8; past the last row, repeat it (computed, never stored).
        let group: [usize; R] = std::array::from_fn(|r| (i0 + r).min(n - 1));
        let z: [*const f32; R] = group.map(vector);
        let columns = rows[group[R - 1]].1;
        let mut q = 0;
        while q * V < columns {
            if columns - q * V > V {
                gram_block::<2>(d, npad, q, &z, zt.as_ptr(), &group, rows, row);
                q += 2;
            } else {
                gram_block::<1>(d, npad, q, &z, zt.as_ptr(), &group, rows, row);
                q += 1;
            }
        }
        i0 += R;
    }
}

/// Columns `16q .. 16(q + B)` of the rows `group`, each row's pairs stored
/// where its part of `row` starts (masked to its pair count).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn gram_block<const B: usize>(
    d: usize,
    npad: usize,
    q: usize,
    z: &[*const f32; R],
    zt: *const f32,
    group: &[usize; R],
    rows: &[(usize, usize)],
    row: &mut [f32],
) {
    let mut acc = [[_mm512_setzero_ps(); B]; R];
    for c in 0..d {
        let t = zt.add(c * npad + q * V);
        let v: [__m512; B] = std::array::from_fn(|b| _mm512_loadu_ps(t.add(b * V)));
        for r in 0..R {
            let s = _mm512_set1_ps(*z[r].add(c));
            for b in 0..B {
                acc[r][b] = _mm512_fmadd_ps(s, v[b], acc[r][b]);
            }
        }
    }
    for r in 0..R {
        // A repeated last row is stored once, by its first copy.
        if r > 0 && group[r] == group[r - 1] {
            break;
        }
        let (start, count) = rows[group[r]];
        for (b, &x) in acc[r].iter().enumerate() {
            let first = (q + b) * V;
            if first < count {
                let at = start + first;
                let take = (count - first).min(V);
                assert!(at + take <= row.len(), "interaction forward: pair past the row");
                _mm512_mask_storeu_ps(row.as_mut_ptr().add(at), lanes(take), x);
            }
        }
    }
}

/// [`DotInteraction::backward`] for `f32` (the caller checked [`available`]).
///
/// # Panics
/// When a slice is shorter than `batch` samples need.
pub(super) fn backward(
    it: &DotInteraction,
    (dense, pooled, dout): (&[f32], &[f32], &[f32]),
    batch: usize,
    ddense: &mut [f32],
    dpooled: &mut [f32],
) {
    let (d, n, od) = (it.dim, it.num_sparse + 1, it.output_dim());
    let fd = it.num_sparse * d;
    assert!(
        dense.len() >= batch * d
            && pooled.len() >= batch * fd
            && dout.len() >= batch * od
            && ddense.len() >= batch * d
            && dpooled.len() >= batch * fd,
        "interaction backward: buffers shorter than {batch} samples"
    );
    let rows = triangle_rows(it);
    let diagonal = DiagonalBlocks::new(it, &rows);
    // A sample's output gradient, then a zero, then `S`'s diagonal under
    // self-interaction: every `S[i][j]` of a diagonal block is one index into it.
    let mut gx = vec![0.0f32; od + 1 + n];
    for b in 0..batch {
        let g = &dout[b * od..(b + 1) * od];
        gx[..od].copy_from_slice(g);
        if it.self_interaction {
            gx[od + 1] = g[od - 1] + g[od - 1];
            for (i, &(start, _)) in rows.iter().enumerate().skip(1) {
                gx[od + 1 + i] = g[start + i] + g[start + i];
            }
        }
        let z0 = &dense[b * d..(b + 1) * d];
        let zs = &pooled[b * fd..(b + 1) * fd];
        let dz0 = &mut ddense[b * d..(b + 1) * d];
        let dzs = &mut dpooled[b * fd..(b + 1) * fd];
        // SAFETY: AVX-512F is present (caller); every load and store is masked
        // to a vector's `d` values, inside the sample's slices; every index
        // into `gx` is below its length (`DiagonalBlocks::new`, and the
        // triangle's rows end before `od`).
        unsafe { sample_backward(d, n, (&gx, &rows, &diagonal), (z0, zs), dz0, dzs) };
    }
}

/// Where each entry of the 8 × 8 blocks on the diagonal of `S` lies in a
/// sample's extended output gradient (see [`backward`]): `S[i][j] = S[j][i]`
/// is the pair `(i, j)` of the lower triangle for `j < i`; `S[i][i]` is twice
/// the self pair's gradient, or zero without self-interaction.
struct DiagonalBlocks(Vec<[[u32; R]; R]>);

impl DiagonalBlocks {
    fn new(it: &DotInteraction, rows: &[(usize, usize)]) -> Self {
        let (n, od) = (rows.len(), it.output_dim());
        assert!(od + 1 + n < u32::MAX as usize, "interaction backward: {od} outputs per sample");
        let at = |i: usize, j: usize| -> u32 {
            let k = match j.cmp(&i) {
                std::cmp::Ordering::Less => rows[i].0 + j,
                std::cmp::Ordering::Greater => rows[j].0 + i,
                std::cmp::Ordering::Equal if it.self_interaction => od + 1 + i,
                std::cmp::Ordering::Equal => od,
            };
            k as u32
        };
        let blocks = (0..n)
            .step_by(R)
            .map(|r0| {
                // Columns and rows past the last repeat it (never read, never stored).
                std::array::from_fn(|jj| std::array::from_fn(|r| at((r0 + r).min(n - 1), (r0 + jj).min(n - 1))))
            })
            .collect();
        DiagonalBlocks(blocks)
    }
}

/// `dZ = S·Z` for one sample, eight rows at a time: for `j` below the rows
/// `S[r][j]` runs along row `r` of the triangle, for `j` above them along
/// row `j` (eight consecutive pairs), and the 8 × 8 block on the diagonal is
/// read pair by pair. The dense vector's gradient (the first `d` values of
/// the output gradient) is added to row 0 last.
#[target_feature(enable = "avx512f")]
unsafe fn sample_backward(
    d: usize,
    n: usize,
    (gx, rows, diagonal): (&[f32], &[(usize, usize)], &DiagonalBlocks),
    (z0, zs): (&[f32], &[f32]),
    dz0: &mut [f32],
    dzs: &mut [f32],
) {
    let vector = |j: usize| if j == 0 { z0.as_ptr() } else { zs.as_ptr().add((j - 1) * d) };
    let g = gx.as_ptr();
    let mut r0 = 0;
    while r0 < n {
        // Rows r0 .. r0 + 8; past the last row, repeat it (computed, never stored).
        let group: [usize; R] = std::array::from_fn(|r| (r0 + r).min(n - 1));
        let diagonal_end = (r0 + R).min(n);
        let block = &diagonal.0[r0 / R];
        // Row r's part of the triangle (read for j < r0, where every row is past row 0).
        let along: [*const f32; R] = group.map(|i| if r0 == 0 { g } else { g.add(rows[i].0) });
        let mut first = 0;
        while first < d {
            let mask = lanes(d - first);
            let mut acc = [_mm512_setzero_ps(); R];
            for j in 0..r0 {
                let v = _mm512_maskz_loadu_ps(mask, vector(j).add(first));
                for r in 0..R {
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(*along[r].add(j)), v, acc[r]);
                }
            }
            for (j, column) in (r0..diagonal_end).zip(block) {
                let v = _mm512_maskz_loadu_ps(mask, vector(j).add(first));
                for r in 0..R {
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(*g.add(column[r] as usize)), v, acc[r]);
                }
            }
            for (j, &(start, _)) in rows.iter().enumerate().skip(diagonal_end) {
                let v = _mm512_maskz_loadu_ps(mask, vector(j).add(first));
                let across = g.add(start + r0);
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(*across.add(r)), v, *a);
                }
            }
            for r in 0..R {
                if r > 0 && group[r] == group[r - 1] {
                    break;
                }
                match group[r] {
                    0 => {
                        let x = _mm512_add_ps(acc[r], _mm512_maskz_loadu_ps(mask, g.add(first)));
                        _mm512_mask_storeu_ps(dz0.as_mut_ptr().add(first), mask, x);
                    }
                    i => _mm512_mask_storeu_ps(dzs.as_mut_ptr().add((i - 1) * d + first), mask, acc[r]),
                }
            }
            first += V;
        }
        r0 += R;
    }
}
