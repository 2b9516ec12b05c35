//! Device-side checks of index buffers and the stable radix sort that groups
//! duplicate rows (`gpu/kernels/sort.cu`). A caller that sorts every step keeps
//! a [`SortScratch`]: once its buffers fit the step, a sort allocates nothing.

use crate::check::{self, grid_for, THREADS};
use crate::{Device, GpuError};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

/// Threads of a block that scans a digit's tile counts, and of the one that scans the digits' totals.
const SCAN_THREADS: u32 = 256;

/// Keys per block of one radix pass.
const TILE: usize = 16 * THREADS as usize;

/// Reads back a `first bad position` flag (`u32::MAX`: none).
fn read_flag(dev: &Device, flag: &CudaSlice<u32>) -> Result<Option<usize>, GpuError> {
    let v = dev.download(flag, 1)?[0];
    Ok((v != u32::MAX).then_some(v as usize))
}

/// Fails (naming the first offender) unless every one of the first `n` keys is below `bound`.
/// Waits for the stream.
pub(crate) fn check_below(
    dev: &Device,
    op: &'static str,
    what: &str,
    keys: &CudaSlice<u32>,
    n: usize,
    bound: usize,
) -> Result<(), GpuError> {
    if n == 0 {
        return Ok(());
    }
    let (n32, bound32) = (check::u32_of(op, "entries", n)?, check::u32_of(op, "bound", bound)?);
    let mut flag = dev.upload(&[u32::MAX])?;
    let mut launch = dev.stream.launch_builder(dev.function("check_below"));
    launch.arg(keys).arg(&n32).arg(&bound32).arg(&mut flag);
    // SAFETY: `keys` holds at least n values (checked by the callers); the flag one.
    unsafe { launch.launch(grid_for(n)) }.map_err(GpuError::driver("launching check_below"))?;
    if let Some(pos) = read_flag(dev, &flag)? {
        let mut v = [0u32];
        dev.stream.memcpy_dtoh(&keys.slice(pos..pos + 1), &mut v).map_err(GpuError::driver("reading a bad index"))?;
        dev.synchronize()?;
        return Err(GpuError::Index { op, message: format!("{what} {} at position {pos} is not below {bound}", v[0]) });
    }
    Ok(())
}

/// Fails unless `offsets` (`batch + 1` values) start at 0, never decrease and end at `len`.
/// Waits for the stream.
pub(crate) fn check_offsets(
    dev: &Device,
    op: &'static str,
    offsets: &CudaSlice<u32>,
    batch: usize,
    len: usize,
) -> Result<(), GpuError> {
    check::len(op, "offsets", offsets, batch + 1, || format!("batch {batch} + 1"))?;
    let (b32, len32) = (check::u32_of(op, "batch", batch)?, check::u32_of(op, "entries", len)?);
    let mut flag = dev.upload(&[u32::MAX])?;
    if batch > 0 {
        let mut launch = dev.stream.launch_builder(dev.function("check_offsets"));
        launch.arg(offsets).arg(&b32).arg(&len32).arg(&mut flag);
        // SAFETY: `offsets` holds batch + 1 values (checked above).
        unsafe { launch.launch(grid_for(batch)) }.map_err(GpuError::driver("launching check_offsets"))?;
    }
    let mut last = [0u32];
    dev.stream
        .memcpy_dtoh(&offsets.slice(batch..batch + 1), &mut last)
        .map_err(GpuError::driver("reading the last offset"))?;
    let last = last[0];
    if let Some(b) = read_flag(dev, &flag)? {
        return Err(GpuError::Index {
            op,
            message: format!("the offsets of bag {b} are out of order or past the {len} entries (offsets must start at 0 and never decrease)"),
        });
    }
    if last as usize != len {
        return Err(GpuError::Index { op, message: format!("the offsets end at {last}, not at the {len} entries") });
    }
    Ok(())
}

/// The first `n` keys sorted ascending, stably, with their positions.
pub(crate) struct Sorted {
    /// The keys in order.
    pub keys: CudaSlice<u32>,
    /// `pos[i]`: where `keys[i]` was in the input (ascending among equal keys).
    pub pos: CudaSlice<u32>,
}

/// Sorts the first `n` keys (every key below `bound`, checked by the caller)
/// with a stable LSD radix sort, 8 bits a pass, as many passes as `bound` needs.
pub(crate) fn sort_keys(
    dev: &Device,
    op: &'static str,
    keys: &CudaSlice<u32>,
    n: usize,
    bound: usize,
) -> Result<Sorted, GpuError> {
    let mut scratch = SortScratch::default();
    let result = sort_keys_with(dev, op, (keys, n, bound), &mut scratch)?;
    let Some(Buffers { keys: [k0, k1], pos: [p0, p1], .. }) = scratch.buffers else {
        return Ok(Sorted { keys: dev.zeros(0)?, pos: dev.zeros(0)? });
    };
    Ok(if result == 0 { Sorted { keys: k0, pos: p0 } } else { Sorted { keys: k1, pos: p1 } })
}

/// The buffers of [`sort_keys_with`], kept between calls: once they have
/// grown to a step's size, a sort allocates and clears nothing (every value
/// a pass reads was written by that pass or the one before).
#[derive(Debug, Default)]
pub(crate) struct SortScratch {
    buffers: Option<Buffers>,
}

#[derive(Debug)]
struct Buffers {
    /// Keys and positions, read from one of each pair and written to the other in turn.
    keys: [CudaSlice<u32>; 2],
    pos: [CudaSlice<u32>; 2],
    /// `256 × tiles` digit counts, then first positions.
    hist: CudaSlice<u32>,
    /// The 256 digits' totals.
    totals: CudaSlice<u32>,
}

impl SortScratch {
    /// Buffers for `n` keys in `tiles` tiles, grown (zeroed once) when too small.
    fn reserve(&mut self, dev: &Device, n: usize, tiles: usize) -> Result<&mut Buffers, GpuError> {
        let fits = self.buffers.as_ref().is_some_and(|b| b.keys[0].len() >= n && b.hist.len() >= 256 * tiles);
        if !fits {
            self.buffers = Some(Buffers {
                keys: [dev.zeros(n)?, dev.zeros(n)?],
                pos: [dev.zeros(n)?, dev.zeros(n)?],
                hist: dev.zeros(256 * tiles)?,
                totals: dev.zeros(256)?,
            });
        }
        Ok(self.buffers.as_mut().expect("reserved above"))
    }

    /// The sorted keys and positions of the last [`sort_keys_with`] (the pair
    /// it named; the first `n` values of each).
    pub(crate) fn sorted(&self, pair: usize) -> Option<(&CudaSlice<u32>, &CudaSlice<u32>)> {
        self.buffers.as_ref().map(|b| (&b.keys[pair], &b.pos[pair]))
    }
}

/// [`sort_keys`] in `scratch`'s buffers: the first `n` of `keys` (every key
/// below `bound`) sorted stably; gives the pair of `scratch` that holds the
/// result ([`SortScratch::sorted`]). Nothing is allocated once the buffers fit.
pub(crate) fn sort_keys_with(
    dev: &Device,
    op: &'static str,
    (keys, n, bound): (&CudaSlice<u32>, usize, usize),
    scratch: &mut SortScratch,
) -> Result<usize, GpuError> {
    let n32 = check::u32_of(op, "entries", n)?;
    if n == 0 {
        return Ok(0);
    }
    check::len(op, "keys", keys, n, || format!("{n} keys"))?;
    let bits = usize::BITS - bound.saturating_sub(1).leading_zeros();
    let passes = bits.div_ceil(8).max(1) as usize;
    let tiles = n.div_ceil(TILE);
    let tiles32 = check::u32_of(op, "tiles", tiles)?;
    check::u32_of(op, "histogram", 256 * tiles)?;
    let tile32 = TILE as u32;
    let Buffers { keys: ks, pos: ps, hist, totals } = scratch.reserve(dev, n, tiles)?;
    dev.stream.memcpy_dtod(&keys.slice(..n), &mut ks[0].slice_mut(..n)).map_err(GpuError::driver("copying keys"))?;
    {
        let mut launch = dev.stream.launch_builder(dev.function("iota_u32"));
        launch.arg(&mut ps[0]).arg(&n32);
        // SAFETY: `ps[0]` holds at least n values.
        unsafe { launch.launch(grid_for(n)) }.map_err(GpuError::driver("launching iota_u32"))?;
    }
    let per_tile = LaunchConfig { grid_dim: (tiles32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    for pass in 0..passes {
        let shift = 8 * pass as u32;
        // Pass p reads pair p mod 2 and writes the other.
        let ([k0, k1], [p0, p1]) = (&mut *ks, &mut *ps);
        let ((ka, kb), (va, vb)) = if pass % 2 == 0 { ((k0, k1), (p0, p1)) } else { ((k1, k0), (p1, p0)) };
        let mut h = dev.stream.launch_builder(dev.function("radix_histogram"));
        h.arg(&*ka).arg(&n32).arg(&shift).arg(&tile32).arg(&tiles32).arg(&mut *hist);
        // SAFETY: `ka` holds n keys, `hist` at least 256 × tiles counts; one block per tile.
        unsafe { h.launch(per_tile) }.map_err(GpuError::driver("launching radix_histogram"))?;
        scan_histogram(dev, hist, tiles32, totals)?;
        let mut sc = dev.stream.launch_builder(dev.function("radix_scatter"));
        sc.arg(&*ka).arg(&*va).arg(&n32).arg(&shift).arg(&tile32).arg(&tiles32).arg(&*hist).arg(kb).arg(vb);
        // SAFETY: the scanned histogram places every key of every tile inside [0, n) of kb and vb.
        unsafe { sc.launch(per_tile) }.map_err(GpuError::driver("launching radix_scatter"))?;
    }
    Ok(passes % 2)
}

/// Turns a pass's `256 × tiles` digit-major counts into each (digit, tile)'s
/// first output position: every digit's tiles scanned by one block (its total
/// into `totals`), the totals scanned, each digit's base added to its tiles.
fn scan_histogram(
    dev: &Device,
    hist: &mut CudaSlice<u32>,
    tiles: u32,
    totals: &mut CudaSlice<u32>,
) -> Result<(), GpuError> {
    let block =
        |blocks: u32| LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (SCAN_THREADS, 1, 1), shared_mem_bytes: 0 };
    let mut s = dev.stream.launch_builder(dev.function("scan_segments_u32"));
    s.arg(&mut *hist).arg(&tiles).arg(&mut *totals);
    // SAFETY: `hist` holds 256 segments of `tiles` counts, `totals` 256 values; one block per segment.
    unsafe { s.launch(block(256)) }.map_err(GpuError::driver("launching scan_segments_u32"))?;
    let digits = 256u32;
    let mut s = dev.stream.launch_builder(dev.function("exclusive_scan_u32"));
    s.arg(&mut *totals).arg(&digits);
    // SAFETY: `totals` holds 256 values; one block of a multiple of 32 threads, at most 1024.
    unsafe { s.launch(block(1)) }.map_err(GpuError::driver("launching exclusive_scan_u32"))?;
    let mut s = dev.stream.launch_builder(dev.function("add_segment_bases_u32"));
    s.arg(&mut *hist).arg(&tiles).arg(&digits).arg(&*totals);
    // SAFETY: `hist` holds 256 × tiles values, `totals` one base per segment.
    unsafe { s.launch(grid_for(256 * tiles as usize)) }.map_err(GpuError::driver("launching add_segment_bases_u32"))?;
    Ok(())
}
