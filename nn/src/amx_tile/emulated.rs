//! The 32 × 32 block of [`block_32x32`](super::block_32x32) computed in
//! software, for [`TileUnit::Emulated`](tiderec_records::cpu::TileUnit):
//! the same operands at the same addresses, the same chains.
//!
//! Each of the block's four `TDPBF16PS` per 16 pairs is replaced by its
//! definition (the parent module's docs): per entry, the even-step products
//! summed in order from the first one, the odd-step products likewise, the
//! two sums added and that added to the entry, every addition rounded to
//! `f32`. A product of two finite bf16 values is exact in `f32` unless it
//! overflows or falls below the normal range, so multiplying and then adding
//! rounds as the instruction does on normal values. The emulation equals
//! [`gemm_amx_reference`](crate::gemm_amx::gemm_amx_reference) everywhere;
//! the hardware only where every operand, start value, product and partial
//! sum is a normal finite number (the hardware treats a denormal operand as
//! zero, and what it makes of denormals elsewhere, overflows and NaN payloads
//! was not compared with this emulation).
//!
//! Invariant: the block reads every operand before it writes `c`, so `start`
//! may be `c` itself (a chain continued from the output).

use super::{BLOCK, TILE_PAIRS};

/// The `f32` value of the low (`even`) or high bf16 half of a pair.
#[inline(always)]
fn half(pair: u32, even: bool) -> f32 {
    f32::from_bits(if even { pair << 16 } else { pair & 0xffff_0000 })
}

/// [`block_32x32`](super::block_32x32) in software, with the same arguments
/// (byte strides; `prefetch` has nothing to do here).
///
/// # Safety
/// As [`block_32x32`](super::block_32x32)'s, without the tiles: `blocks ≥ 1`
/// and every address it names lies inside its buffer.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn block_32x32(
    a: *const u32,
    lda: usize,
    b: *const u32,
    ldb: usize,
    blocks: usize,
    c: *mut f32,
    ldc: usize,
    (start, lds): (*const f32, usize),
) {
    debug_assert!(blocks >= 1);
    let at = |base: *const u8, offset: usize| base.wrapping_add(offset);
    let mut acc = [[0f32; BLOCK]; BLOCK];
    if !start.is_null() {
        for (i, row) in acc.iter_mut().enumerate() {
            let from = at(start as *const u8, i * lds) as *const f32;
            row.copy_from_slice(std::slice::from_raw_parts(from, BLOCK));
        }
    }
    let (mut even_b, mut odd_b) = ([[0f32; BLOCK]; TILE_PAIRS], [[0f32; BLOCK]; TILE_PAIRS]);
    for block in 0..blocks {
        for q in 0..TILE_PAIRS {
            let row = at(b as *const u8, (block * TILE_PAIRS + q) * ldb) as *const u32;
            let pairs = std::slice::from_raw_parts(row, BLOCK);
            for j in 0..BLOCK {
                even_b[q][j] = half(pairs[j], true);
                odd_b[q][j] = half(pairs[j], false);
            }
        }
        for (i, out) in acc.iter_mut().enumerate() {
            let row = at(a as *const u8, i * lda + block * TILE_PAIRS * 4) as *const u32;
            let pairs = std::slice::from_raw_parts(row, TILE_PAIRS);
            let (mut even, mut odd) = ([0f32; BLOCK], [0f32; BLOCK]);
            let (a_even, a_odd) = (half(pairs[0], true), half(pairs[0], false));
            for j in 0..BLOCK {
                even[j] = a_even * even_b[0][j];
                odd[j] = a_odd * odd_b[0][j];
            }
            for q in 1..TILE_PAIRS {
                let (a_even, a_odd) = (half(pairs[q], true), half(pairs[q], false));
                for j in 0..BLOCK {
                    even[j] += a_even * even_b[q][j];
                    odd[j] += a_odd * odd_b[q][j];
                }
            }
            for j in 0..BLOCK {
                out[j] += even[j] + odd[j];
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        let to = at(c as *const u8, i * ldc) as *mut f32;
        std::slice::from_raw_parts_mut(to, BLOCK).copy_from_slice(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bf16_pack::pair;

    /// One block against the chains written out entry by entry, from zero and
    /// from a start row repeated (`lds = 0`), at padded strides.
    #[test]
    fn a_block_sums_as_the_instruction_defines() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
        };
        let (blocks, lda_pairs, ldb_pairs, ldc) = (3usize, 16 * 3 + 5, BLOCK + 3, BLOCK + 7);
        let a: Vec<u32> = (0..BLOCK * lda_pairs).map(|_| pair(next(), next())).collect();
        let b: Vec<u32> = (0..blocks * TILE_PAIRS * ldb_pairs).map(|_| pair(next(), next())).collect();
        let bias: Vec<f32> = (0..BLOCK).map(|_| next()).collect();
        for with_start in [false, true] {
            let mut c = vec![f32::NAN; BLOCK * ldc];
            let start = if with_start { (bias.as_ptr(), 0) } else { (std::ptr::null(), 0) };
            // SAFETY: every row named lies inside its buffer.
            unsafe {
                block_32x32(
                    a.as_ptr(),
                    lda_pairs * 4,
                    b.as_ptr(),
                    ldb_pairs * 4,
                    blocks,
                    c.as_mut_ptr(),
                    ldc * 4,
                    start,
                )
            };
            for i in 0..BLOCK {
                for j in 0..BLOCK {
                    let mut out = if with_start { bias[j] } else { 0.0 };
                    for block in 0..blocks {
                        let p = |q: usize, even: bool| {
                            let k = block * TILE_PAIRS + q;
                            half(a[i * lda_pairs + k], even) * half(b[k * ldb_pairs + j], even)
                        };
                        let (mut even, mut odd) = (p(0, true), p(0, false));
                        for q in 1..TILE_PAIRS {
                            even += p(q, true);
                            odd += p(q, false);
                        }
                        out += even + odd;
                    }
                    assert_eq!(c[i * ldc + j].to_bits(), out.to_bits(), "({i}, {j}) start {with_start}");
                }
                assert!(c[i * ldc + BLOCK..(i + 1) * ldc].iter().all(|x| x.is_nan()), "row {i}: past the block");
            }
        }
    }
}
