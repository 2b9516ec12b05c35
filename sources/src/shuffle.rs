//! The order in which a training reader visits its share of line files in each epoch.
//!
//! Worker `w` of `W` owns, in every input file of `len` bytes, the bytes
//! [`worker_bytes`]`(len, span, w, W)`; a line belongs to the range in which its
//! first byte lies. Epoch 0 reads these ranges in file order. With a
//! [`BlockShuffle`], every epoch after the first cuts each of the worker's ranges
//! into blocks of [`BlockShuffle::block_bytes`] bytes, or of [`auto_block_bytes`] of the
//! worker's share when not given, longer when the share would have more than
//! [`MAX_BLOCKS`] of them ([`share_block_bytes`]; the last one of a range may
//! be shorter) and visits all of the worker's blocks, over all its files, in a
//! permutation of the shuffle's seed, the epoch and the worker ([`epoch_ranges`]).
//!
//! Line readers ([`crate::lines`]) read the lines that start in each range, and
//! Parquet files converted from line files ([`crate::parquet`]) the rows whose
//! `_line_start` lies in it, so both visit the same records in the same order.
//!
//! # Invariants
//!
//! * **Blocks partition a range.** The blocks of `[lo, hi)` are consecutive and
//!   cover it; since a line belongs to the block its first byte lies in, a
//!   shuffled epoch reads every line of the worker's ranges exactly once.
//! * **Pure.** The ranges of an epoch are a function of the file sizes, the span,
//!   the worker, the number of workers, the epoch, the block size and the seed
//!   only, so a resumed run re-enters an epoch in the order the interrupted run
//!   read it.
//! * **Epoch 0 is file order**, shuffle or not: the same ranges, in the same
//!   order, as without a shuffle.
//! * **Bounded plans.** An epoch's plan has at most [`MAX_BLOCKS`] blocks plus
//!   one per file, whatever the file sizes say (a damaged size in a converted
//!   file's metadata must not make a plan larger than memory).

use crate::error::SourceError;
use std::ops::Range;
use tiderec_records::features::mix64;

/// Blocks a worker's share is cut into when the block size is not given: enough to mix
/// the share's parts, few enough that each block is long.
pub const AUTO_BLOCKS: u64 = 64;
/// The smallest block of the automatic size: 64 KiB, some 250 Criteo lines, so a file of a
/// few megabytes still gives each worker dozens of blocks to permute.
pub const MIN_AUTO_BLOCK_BYTES: u64 = 64 * 1024;
/// The largest block of the automatic size: 16 MiB, some 65,000 Criteo lines, the rows of
/// one row group of a converted file. Replaying a converted file decompresses the pages
/// that hold a block's rows for every block, whole, so blocks of about a row group keep a
/// shuffled epoch of large files near the replay speed of file order.
pub const MAX_AUTO_BLOCK_BYTES: u64 = 16 << 20;

/// The most blocks a worker's share is cut into (plus one per file, for the last, shorter
/// block of each range): a share that would have more gets longer blocks. Some 25 MB of
/// plan at most; 4 KiB blocks reach it at a 4 GiB share, the automatic size at 16 TiB.
pub const MAX_BLOCKS: u64 = 1 << 20;

/// The automatic block size of a share of `share_bytes`: `share_bytes / AUTO_BLOCKS`
/// within [`MIN_AUTO_BLOCK_BYTES`, `MAX_AUTO_BLOCK_BYTES`].
pub fn auto_block_bytes(share_bytes: u64) -> u64 {
    (share_bytes / AUTO_BLOCKS).clamp(MIN_AUTO_BLOCK_BYTES, MAX_AUTO_BLOCK_BYTES)
}

/// The block size of a share of `share_bytes` cut into blocks of `block_bytes` (`None`: the
/// [automatic size](auto_block_bytes)): that size, or `⌈share_bytes / MAX_BLOCKS⌉` when longer.
/// (`share_bytes` is wide enough for the sum of any ranges.)
pub fn share_block_bytes(share_bytes: u128, block_bytes: Option<u64>) -> u64 {
    let wanted = block_bytes.unwrap_or_else(|| auto_block_bytes(u64::try_from(share_bytes).unwrap_or(u64::MAX)));
    let least = u64::try_from(share_bytes.div_ceil(u128::from(MAX_BLOCKS))).unwrap_or(u64::MAX);
    wanted.max(least)
}

/// The shuffle of the epochs after the first: blocks of `block_bytes` (or of
/// [`auto_block_bytes`] of the worker's share), permuted by `seed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockShuffle {
    seed: u64,
    block_bytes: Option<u64>,
}

impl BlockShuffle {
    /// A shuffle seeded by `seed` in blocks of `block_bytes` bytes (`None`: the automatic
    /// size); `Some(0)` is [`SourceError::Config`] naming `shuffle_block_bytes`.
    pub fn new(seed: u64, block_bytes: Option<u64>) -> Result<Self, SourceError> {
        if block_bytes == Some(0) {
            return Err(SourceError::config("shuffle_block_bytes", "a block must hold at least one byte"));
        }
        Ok(BlockShuffle { seed, block_bytes })
    }

    /// The seed of the permutations.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Bytes per block, when given (`None`: the automatic size of each share).
    pub fn block_bytes(&self) -> Option<u64> {
        self.block_bytes
    }
}

/// Bytes of one input file: the lines that start at `bytes.start ≤ p < bytes.end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ByteRange {
    /// Index of the file, in the order the files were given.
    pub file: usize,
    /// Offsets within the file (not line-aligned: a line belongs to the range its first byte lies in).
    pub bytes: Range<u64>,
}

/// The bytes `span = (from, to)` (fractions, `to ≥ 1` meaning the end) covers of a file of `len` bytes.
pub fn span_bytes(len: u64, span: (f64, f64)) -> Range<u64> {
    let lo = ((len as f64 * span.0).round() as u64).min(len);
    let hi = if span.1 >= 1.0 { len } else { ((len as f64 * span.1).round() as u64).min(len) };
    lo..hi.max(lo)
}

/// `lo + (hi − lo)·k/W`: where part `k` of `W` of `[lo, hi)` begins.
pub fn share_start(lo: u64, hi: u64, k: usize, workers: usize) -> u64 {
    lo + ((hi - lo) as u128 * k as u128 / workers.max(1) as u128) as u64
}

/// Worker `worker`'s part of the bytes `span` covers of a file of `len` bytes.
pub fn worker_bytes(len: u64, span: (f64, f64), worker: usize, workers: usize) -> Range<u64> {
    let r = span_bytes(len, span);
    share_start(r.start, r.end, worker, workers)..share_start(r.start, r.end, worker + 1, workers)
}

/// The worker's range of every file, in file order (empty ones included).
pub fn worker_ranges(file_bytes: &[u64], span: (f64, f64), worker: usize, workers: usize) -> Vec<ByteRange> {
    let range = |(file, &len)| ByteRange { file, bytes: worker_bytes(len, span, worker, workers) };
    file_bytes.iter().enumerate().map(range).collect()
}

/// The non-empty `ranges` cut into blocks of `block_bytes`, in order; each block starts
/// `block_bytes` after the previous one of its range.
pub fn cut_blocks(ranges: &[ByteRange], block_bytes: u64) -> Vec<ByteRange> {
    let step = block_bytes.max(1);
    let mut blocks = Vec::new();
    for r in ranges {
        let mut at = r.bytes.start;
        while at < r.bytes.end {
            let end = at.saturating_add(step).min(r.bytes.end);
            blocks.push(ByteRange { file: r.file, bytes: at..end });
            at = end;
        }
    }
    blocks
}

/// A permutation of `0..n` for `epoch`: the identity in epoch 0, afterwards a
/// Fisher–Yates shuffle seeded by `seed` and `epoch`.
pub fn permutation(n: usize, epoch: u64, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if epoch == 0 {
        return order;
    }
    let mut state = mix64(seed ^ mix64(epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x005E_ED0F_E90C));
    for i in (1..n).rev() {
        state = mix64(state.wrapping_add(0x9E37_79B9_7F4A_7C15));
        let j = (state % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// The order in which worker `worker` visits its `n` blocks in `epoch`: [`permutation`]
/// of a seed of its own, so that workers do not walk their blocks in step.
pub fn block_order(n: usize, epoch: u64, seed: u64, worker: usize) -> Vec<usize> {
    permutation(n, epoch, seed ^ mix64((worker as u64).wrapping_add(0xB10C_5EED)))
}

/// The ranges worker `worker` of `workers` reads in `epoch`, in reading order (see the
/// [module docs](self)): its range of every file in file order in epoch 0 or without a
/// shuffle, else all its blocks in [`block_order`].
pub fn epoch_ranges(
    file_bytes: &[u64],
    span: (f64, f64),
    worker: usize,
    workers: usize,
    epoch: u64,
    shuffle: Option<BlockShuffle>,
) -> Vec<ByteRange> {
    let ranges = worker_ranges(file_bytes, span, worker, workers);
    match shuffle {
        Some(s) if epoch > 0 => {
            let share: u128 = ranges.iter().map(|r| u128::from(r.bytes.end - r.bytes.start)).sum();
            let blocks = cut_blocks(&ranges, share_block_bytes(share, s.block_bytes));
            block_order(blocks.len(), epoch, s.seed, worker).into_iter().map(|i| blocks[i].clone()).collect()
        }
        _ => ranges,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_orders_are_permutations_identity_in_epoch_0() {
        for n in [0, 1, 2, 5, 10, 37, 1000] {
            for epoch in 0..4 {
                let mut order = block_order(n, epoch, 7, 1);
                if epoch == 0 {
                    assert_eq!(order, (0..n).collect::<Vec<_>>());
                }
                order.sort_unstable();
                assert_eq!(order, (0..n).collect::<Vec<_>>(), "n {n} epoch {epoch}");
            }
        }
        let e1 = block_order(50, 1, 7, 0);
        assert_eq!(e1, block_order(50, 1, 7, 0), "deterministic");
        assert_ne!(e1, (0..50).collect::<Vec<_>>());
        assert_ne!(e1, block_order(50, 2, 7, 0), "another epoch");
        assert_ne!(e1, block_order(50, 1, 8, 0), "another seed");
        assert_ne!(e1, block_order(50, 1, 7, 1), "another worker");
    }

    #[test]
    fn blocks_partition_the_worker_ranges_and_the_ranges_the_files() {
        let files = [0u64, 1, 999, 300_000, 1 << 20];
        for workers in 1..=3 {
            for span in [(0.0, 1.0), (0.0, 0.9), (0.9, 1.0)] {
                for (f, &len) in files.iter().enumerate() {
                    let all = span_bytes(len, span);
                    let parts: Vec<_> = (0..workers).map(|w| worker_bytes(len, span, w, workers)).collect();
                    assert_eq!(parts.first().unwrap().start, all.start, "file {f}");
                    assert_eq!(parts.last().unwrap().end, all.end, "file {f}");
                    assert!(parts.windows(2).all(|p| p[0].end == p[1].start), "file {f}");
                }
                for w in 0..workers {
                    let ranges = worker_ranges(&files, span, w, workers);
                    let blocks = cut_blocks(&ranges, 4096);
                    for r in ranges.iter().filter(|r| !r.bytes.is_empty()) {
                        let mine: Vec<_> = blocks.iter().filter(|b| b.file == r.file).collect();
                        assert_eq!(mine.first().unwrap().bytes.start, r.bytes.start);
                        assert_eq!(mine.last().unwrap().bytes.end, r.bytes.end);
                        assert!(mine.windows(2).all(|p| p[0].bytes.end == p[1].bytes.start));
                        assert!(mine.iter().all(|b| !b.bytes.is_empty() && b.bytes.end - b.bytes.start <= 4096));
                    }
                }
            }
        }
    }

    #[test]
    fn epoch_0_and_no_shuffle_read_the_worker_ranges_in_file_order() {
        let files = [10_000u64, 0, 70_000];
        let s = BlockShuffle::new(3, Some(1000)).unwrap();
        for w in 0..3 {
            let ranges = worker_ranges(&files, (0.0, 1.0), w, 3);
            assert_eq!(epoch_ranges(&files, (0.0, 1.0), w, 3, 0, Some(s)), ranges);
            assert_eq!(epoch_ranges(&files, (0.0, 1.0), w, 3, 2, None), ranges);
            let mut e1 = epoch_ranges(&files, (0.0, 1.0), w, 3, 1, Some(s));
            assert_ne!(e1, cut_blocks(&ranges, 1000), "epoch 1 is shuffled");
            e1.sort_by_key(|b| (b.file, b.bytes.start));
            assert_eq!(e1, cut_blocks(&ranges, 1000), "and visits every block once");
        }
    }

    /// However large the files say they are, a shuffled epoch has at most `MAX_BLOCKS`
    /// blocks (plus one per file) that still partition the worker's ranges; below that
    /// the block size is the one asked for.
    #[test]
    fn a_shuffled_plan_has_a_bounded_number_of_blocks() {
        assert_eq!(share_block_bytes(4 << 30, Some(4096)), 4096, "a 4 GiB share of 4 KiB blocks");
        assert_eq!(share_block_bytes((4 << 30) + 1, Some(4096)), 4097);
        assert_eq!(share_block_bytes(16 << 40, None), MAX_AUTO_BLOCK_BYTES, "16 TiB of automatic blocks");
        assert_eq!(share_block_bytes((16 << 40) + 1, None), MAX_AUTO_BLOCK_BYTES + 1);
        assert_eq!(share_block_bytes(2_422_799, None), MIN_AUTO_BLOCK_BYTES);
        let cases =
            [(vec![1u64 << 60], 1, Some(4096)), (vec![1 << 50, 3, 1 << 40], 2, None), (vec![u64::MAX; 2], 3, None)];
        for (files, workers, block) in cases {
            let s = BlockShuffle::new(9, block).unwrap();
            let ranges = worker_ranges(&files, (0.0, 1.0), 0, workers);
            let mut plan = epoch_ranges(&files, (0.0, 1.0), 0, workers, 1, Some(s));
            assert!(plan.len() as u64 <= MAX_BLOCKS + files.len() as u64, "{files:?}: {} blocks", plan.len());
            plan.sort_by_key(|b| (b.file, b.bytes.start));
            for r in ranges.iter().filter(|r| !r.bytes.is_empty()) {
                let blocks: Vec<_> = plan.iter().filter(|b| b.file == r.file).collect();
                assert_eq!(blocks.first().map(|b| b.bytes.start), Some(r.bytes.start));
                assert_eq!(blocks.last().map(|b| b.bytes.end), Some(r.bytes.end));
                assert!(blocks.windows(2).all(|p| p[0].bytes.end == p[1].bytes.start), "{files:?}");
            }
        }
    }

    #[test]
    fn a_block_of_no_bytes_is_refused_naming_the_setting() {
        assert_eq!(auto_block_bytes(2_422_799), MIN_AUTO_BLOCK_BYTES, "the Criteo sample: 37 blocks");
        assert_eq!(auto_block_bytes(48 << 20), 768 << 10);
        assert_eq!(auto_block_bytes(45 << 30), MAX_AUTO_BLOCK_BYTES);
        let e = BlockShuffle::new(1, Some(0)).unwrap_err().to_string();
        assert!(e.contains("shuffle_block_bytes"), "{e}");
    }
}
