//! AMX tile instructions, reached through inline assembly (stable Rust has no
//! AMX intrinsics): the tile configuration, the 32 × 32 block of
//! [`gemm_amx`](super::gemm_amx) and the loop that measures the tile peak.
//!
//! # What `TDPBF16PS` computes
//! Measured on the hardware (Sapphire Rapids) and checked by
//! `gemm_amx::tests`: for each entry, one instruction sums the products of the
//! *even* halves of its 16 pairs in order, each sum rounded to `f32` (nearest,
//! ties to even), the products of the *odd* halves likewise, adds the two sums
//! (rounded), and adds that to the accumulator (rounded):
//! `c ← c + (Σₑ + Σₒ)`. Products of two bf16 values are exact in `f32`.
//! The instruction treats denormals as zero and ignores `MXCSR`.
//!
//! [`emulated`] computes the block in software, for a CPU without AMX
//! (`TIDEREC_AMX_EMULATE=1`, [`TileUnit::Emulated`]).
//!
//! # Invariants
//! * Every function here but [`emulated`]'s runs only where
//!   [`Feature::AmxBf16`] is usable ([`tiderec_records::cpu::has`]; the
//!   callers check it); [`emulated`]'s runs anywhere.
//! * Tiles are configured by a [`Tiles`] guard and released when it drops, so
//!   no tile state outlives a product (a thread holding tile state makes each
//!   context switch save 8 KiB more).
//! * All eight tiles are 16 rows × 64 bytes: an `f32` tile holds 16 × 16
//!   values, a bf16 tile 16 rows of 16 pairs.
//!
//! [`Feature::AmxBf16`]: tiderec_records::cpu::Feature::AmxBf16
//! [`TileUnit::Emulated`]: tiderec_records::cpu::TileUnit::Emulated

pub(crate) mod emulated;

#[cfg(target_arch = "x86_64")]
use std::arch::asm;
use std::marker::PhantomData;

/// Rows of a tile.
pub(crate) const TILE_ROWS: usize = 16;
/// Pairs (or `f32` values) in a tile row: 64 bytes.
pub(crate) const TILE_PAIRS: usize = 16;
/// Rows and columns of the block [`block_32x32`] computes.
pub(crate) const BLOCK: usize = 32;

/// The 64-byte operand of `LDTILECFG`.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

/// The tiles of this thread, configured; released on drop. Not `Send`: the
/// configuration belongs to the thread that loaded it.
pub(crate) struct Tiles {
    _thread: PhantomData<*const ()>,
}

impl Tiles {
    /// Configures the eight tiles as 16 rows × 64 bytes (palette 1).
    ///
    /// # Safety
    /// The CPU runs AMX-BF16 and this process was granted the tile state
    /// ([`tiderec_records::cpu::has`]`(AmxBf16)`).
    #[cfg(target_arch = "x86_64")]
    pub(crate) unsafe fn configure() -> Tiles {
        let mut config =
            TileConfig { palette: 1, start_row: 0, reserved: [0; 14], bytes_per_row: [0; 16], rows: [0; 16] };
        for t in 0..8 {
            config.bytes_per_row[t] = (TILE_PAIRS * 4) as u16;
            config.rows[t] = TILE_ROWS as u8;
        }
        asm!("ldtilecfg [{0}]", in(reg) &config, options(nostack, readonly));
        Tiles { _thread: PhantomData }
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: a `Tiles` exists only where the tiles were configured, on this thread.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// `c[32×32] = start + a[32 rows × 16·blocks pairs] · b[16·blocks pairs × 32 columns]`:
/// pair `q` of row `r` of `a` at byte `r·lda + 4q`, pair row `q` of `b` at byte
/// `q·ldb` (32 pairs, one per column), row `i` of `c` at byte `i·ldc`. `start`
/// is zero when `start` is null, otherwise the 32 × 32 values with row `i` at
/// byte `start + i·lds` (`lds = 0` repeats one row: a bias). `prefetch`, when
/// not null, walks with `b`: each block brings the 2 KiB at it into L1 and
/// moves it one block on (it may point past any buffer: a prefetch never faults).
///
/// # Safety
/// `tiles` configured as [`Tiles::configure`] does; `blocks ≥ 1`; every
/// address above lies inside its buffer (32 rows of `a` with `16·blocks` pairs,
/// `16·blocks` rows of `b` with 32 pairs, 32 rows of 32 values of `c` and of `start`).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) unsafe fn block_32x32(
    _tiles: &Tiles,
    a: *const u32,
    lda: usize,
    b: *const u32,
    ldb: usize,
    blocks: usize,
    c: *mut f32,
    ldc: usize,
    (start, lds): (*const f32, usize),
    prefetch: *const u32,
) {
    debug_assert!(blocks >= 1);
    asm!(
        "test {s}, {s}",
        "jz 3f",
        "tileloadd tmm0, [{s} + {lds}*1]",
        "tileloadd tmm1, [{s} + {lds}*1 + 64]",
        "lea {t}, [{s} + {lds}*8]",
        "lea {t}, [{t} + {lds}*8]",
        "tileloadd tmm2, [{t} + {lds}*1]",
        "tileloadd tmm3, [{t} + {lds}*1 + 64]",
        "jmp 4f",
        "3:",
        "tilezero tmm0",
        "tilezero tmm1",
        "tilezero tmm2",
        "tilezero tmm3",
        "4:",
        "lea {a1}, [{a} + {lda}*8]",
        "lea {a1}, [{a1} + {lda}*8]",
        "mov {bstep}, {ldb}",
        "shl {bstep}, 4",
        "2:",
        "tileloadd tmm4, [{a} + {lda}*1]",
        "tileloadd tmm6, [{b} + {ldb}*1]",
        "tileloadd tmm7, [{b} + {ldb}*1 + 64]",
        "tdpbf16ps tmm0, tmm4, tmm6",
        "tdpbf16ps tmm1, tmm4, tmm7",
        "tileloadd tmm5, [{a1} + {lda}*1]",
        "tdpbf16ps tmm2, tmm5, tmm6",
        "tdpbf16ps tmm3, tmm5, tmm7",
        "add {a}, 64",
        "add {a1}, 64",
        "add {b}, {bstep}",
        "test {pf}, {pf}",
        "jz 5f",
        "prefetcht0 [{pf} + 0]",
        "prefetcht0 [{pf} + 64]",
        "prefetcht0 [{pf} + 128]",
        "prefetcht0 [{pf} + 192]",
        "prefetcht0 [{pf} + 256]",
        "prefetcht0 [{pf} + 320]",
        "prefetcht0 [{pf} + 384]",
        "prefetcht0 [{pf} + 448]",
        "prefetcht0 [{pf} + 512]",
        "prefetcht0 [{pf} + 576]",
        "prefetcht0 [{pf} + 640]",
        "prefetcht0 [{pf} + 704]",
        "prefetcht0 [{pf} + 768]",
        "prefetcht0 [{pf} + 832]",
        "prefetcht0 [{pf} + 896]",
        "prefetcht0 [{pf} + 960]",
        "prefetcht0 [{pf} + 1024]",
        "prefetcht0 [{pf} + 1088]",
        "prefetcht0 [{pf} + 1152]",
        "prefetcht0 [{pf} + 1216]",
        "prefetcht0 [{pf} + 1280]",
        "prefetcht0 [{pf} + 1344]",
        "prefetcht0 [{pf} + 1408]",
        "prefetcht0 [{pf} + 1472]",
        "prefetcht0 [{pf} + 1536]",
        "prefetcht0 [{pf} + 1600]",
        "prefetcht0 [{pf} + 1664]",
        "prefetcht0 [{pf} + 1728]",
        "prefetcht0 [{pf} + 1792]",
        "prefetcht0 [{pf} + 1856]",
        "prefetcht0 [{pf} + 1920]",
        "prefetcht0 [{pf} + 1984]",
        "add {pf}, {bstep}",
        "5:",
        "dec {k}",
        "jnz 2b",
        "tilestored [{c} + {ldc}*1], tmm0",
        "tilestored [{c} + {ldc}*1 + 64], tmm1",
        "lea {t}, [{c} + {ldc}*8]",
        "lea {t}, [{t} + {ldc}*8]",
        "tilestored [{t} + {ldc}*1], tmm2",
        "tilestored [{t} + {ldc}*1 + 64], tmm3",
        s = in(reg) start,
        lds = in(reg) lds,
        c = in(reg) c,
        ldc = in(reg) ldc,
        t = out(reg) _,
        a = inout(reg) a => _,
        a1 = out(reg) _,
        lda = in(reg) lda,
        b = inout(reg) b => _,
        ldb = in(reg) ldb,
        bstep = out(reg) _,
        k = inout(reg) blocks => _,
        pf = inout(reg) prefetch => _,
        options(nostack),
    );
}

/// Runs `iterations` × 4 independent `TDPBF16PS` on zeroed tiles (no memory
/// traffic): the tile unit's throughput, for [`amx_peak`](super::fma_peak).
/// Each instruction is 16 × 16 × 32 multiply-adds.
///
/// # Safety
/// `tiles` configured as [`Tiles::configure`] does; `iterations ≥ 1`.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn dot_products(_tiles: &Tiles, iterations: u64) {
    asm!(
        "tilezero tmm0",
        "tilezero tmm1",
        "tilezero tmm2",
        "tilezero tmm3",
        "tilezero tmm4",
        "tilezero tmm5",
        "tilezero tmm6",
        "tilezero tmm7",
        "2:",
        "tdpbf16ps tmm0, tmm4, tmm6",
        "tdpbf16ps tmm1, tmm4, tmm7",
        "tdpbf16ps tmm2, tmm5, tmm6",
        "tdpbf16ps tmm3, tmm5, tmm7",
        "dec {n}",
        "jnz 2b",
        n = inout(reg) iterations => _,
        options(nostack, nomem),
    );
}

/// Multiply-adds one [`dot_products`] iteration does.
pub(crate) const MACS_PER_ITERATION: u64 = 4 * (TILE_ROWS * TILE_PAIRS * 2 * TILE_PAIRS) as u64;
