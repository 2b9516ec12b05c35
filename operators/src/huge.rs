//! Zeroed `f32` buffers backed by anonymous memory that asks for 2 MiB
//! transparent huge pages, and tables packed into one such buffer.
//!
//! Embedding lookups are random row gathers from tables far larger than the
//! caches; with 4 KiB pages nearly every row costs a TLB miss as well as a
//! cache miss. Huge pages (where the kernel grants them; `madvise` mode is
//! the common default) remove most TLB misses. Without them this is an
//! ordinary zeroed allocation.
//!
//! Invariants: a buffer of at least [`HUGE_PAGE`] bytes starts on a huge-page
//! boundary (the kernel backs only whole, aligned huge pages inside an advised
//! range, so an unaligned start loses the partial pages at both ends); every
//! table of [`HugeTables`] starts on a cache line.
//!
//! Sizes are checked: a length whose byte size does not fit in `usize`, or a
//! mapping the system refuses, is an [`OperatorError::Memory`] naming what was
//! being allocated, never a wrapped size or a panic.

use crate::OperatorError;
use memmap2::MmapMut;

/// A fixed-length, zero-initialised `f32` buffer.
pub struct HugeBuffer {
    map: Option<MmapMut>,
    /// Bytes from the start of `map` to the first value.
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for HugeBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HugeBuffer({} floats)", self.len)
    }
}

/// The transparent huge page size of x86-64 and most aarch64 kernels.
pub const HUGE_PAGE: usize = 2 << 20;

impl HugeBuffer {
    /// `len` zeros, for `what` (named in errors). Falls back to a plain anonymous map if huge
    /// pages are refused; errors when the byte size overflows or the system refuses the map.
    ///
    /// A buffer of at least [`HUGE_PAGE`] bytes starts on a huge-page boundary, so
    /// every whole huge page of it can be one: the map is one huge page longer than
    /// the buffer, and only the buffer's own range is advised (the unused head
    /// and tail of the map are never touched and take no memory).
    pub fn zeroed(len: usize, what: &str) -> Result<Self, OperatorError> {
        if len == 0 {
            return Ok(HugeBuffer { map: None, offset: 0, len });
        }
        let too_big =
            || OperatorError::memory(what, format!("{len} floats do not fit in this machine's address space"));
        let bytes = len.checked_mul(std::mem::size_of::<f32>()).ok_or_else(too_big)?;
        let aligned = bytes >= HUGE_PAGE;
        let mapped = if aligned { bytes.checked_add(HUGE_PAGE).ok_or_else(too_big)? } else { bytes };
        let map = MmapMut::map_anon(mapped)
            .map_err(|e| OperatorError::memory(what, format!("cannot map {mapped} bytes: {e}")))?;
        let offset = if aligned { map.as_ptr().align_offset(HUGE_PAGE) } else { 0 };
        #[cfg(target_os = "linux")]
        let _ = map.advise_range(memmap2::Advice::HugePage, offset, bytes);
        Ok(HugeBuffer { map: Some(map), offset, len })
    }
}

impl std::ops::Deref for HugeBuffer {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match &self.map {
            // SAFETY: the map is page-aligned, holds `offset` bytes and then `len` f32s
            // (`zeroed`), and zero bytes are a valid f32.
            Some(m) => unsafe { std::slice::from_raw_parts(m.as_ptr().add(self.offset) as *const f32, self.len) },
            None => &[],
        }
    }
}

impl std::ops::DerefMut for HugeBuffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        match &mut self.map {
            // SAFETY: as above, and the map is uniquely borrowed.
            Some(m) => unsafe { std::slice::from_raw_parts_mut(m.as_mut_ptr().add(self.offset) as *mut f32, self.len) },
            None => &mut [],
        }
    }
}

/// Values per cache line: every table of [`HugeTables`] starts on one, so a row
/// of a line's size (a 16-wide `f32` row) is one line, not two.
const LINE_FLOATS: usize = LINE / std::mem::size_of::<f32>();

/// Several zeroed `f32` tables back to back in one [`HugeBuffer`], each
/// starting on a cache line.
///
/// One map for all of them: a small table shares huge pages with its
/// neighbours instead of taking 4 KiB pages of its own, and only the last
/// table's tail can miss a huge page (one map per table leaves a partial huge
/// page at both ends of every table).
#[derive(Debug)]
pub struct HugeTables {
    buffer: HugeBuffer,
    /// Per table, its first value and its length.
    spans: Vec<(usize, usize)>,
}

impl HugeTables {
    /// Tables of `lens[t]` zeros, for `what` (named in errors). Errors when the
    /// total byte size overflows or the system refuses the map.
    pub fn zeroed(lens: &[usize], what: &str) -> Result<Self, OperatorError> {
        let mut spans = Vec::with_capacity(lens.len());
        let mut end = 0usize;
        for &len in lens {
            let start = end.checked_next_multiple_of(LINE_FLOATS);
            end = start.and_then(|s| s.checked_add(len)).ok_or_else(|| {
                OperatorError::memory(what, format!("{} tables do not fit in this machine's address space", lens.len()))
            })?;
            spans.push((end - len, len));
        }
        Ok(HugeTables { buffer: HugeBuffer::zeroed(end, what)?, spans })
    }

    /// Table `t`.
    #[inline]
    pub fn table(&self, t: usize) -> &[f32] {
        let (start, len) = self.spans[t];
        &self.buffer[start..start + len]
    }

    /// Table `t`, writable.
    #[inline]
    pub fn table_mut(&mut self, t: usize) -> &mut [f32] {
        let (start, len) = self.spans[t];
        &mut self.buffer[start..start + len]
    }

    /// The tables in order.
    pub fn tables(&self) -> impl Iterator<Item = &[f32]> + '_ {
        (0..self.spans.len()).map(|t| self.table(t))
    }
}

/// Hints the CPU to fetch the cache line at `p` (no-op where unsupported).
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Bytes per cache line on the CPUs this prefetches for.
const LINE: usize = 64;

/// Hints the CPU to fetch every cache line `values` touches: a row whose
/// bytes are not a multiple of a line (a DeepFM row of 17 floats, 68 bytes)
/// starts anywhere in its first line and always reaches into the next.
#[inline(always)]
pub fn prefetch_lines<T>(values: &[T]) {
    let first = values.as_ptr() as usize & !(LINE - 1);
    let end = values.as_ptr() as usize + std::mem::size_of_val(values);
    let mut line = first;
    while line < end {
        prefetch(line as *const u8);
        line += LINE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_and_writable() {
        let mut b = HugeBuffer::zeroed(1 << 20, "t").unwrap();
        assert!(b.iter().all(|&v| v == 0.0));
        b[12345] = 2.5;
        assert_eq!(b[12345], 2.5);
        assert_eq!(HugeBuffer::zeroed(0, "t").unwrap().len(), 0);
    }

    #[test]
    fn large_buffers_start_on_a_huge_page() {
        let b = HugeBuffer::zeroed(HUGE_PAGE / 4 + 3, "t").unwrap();
        assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(b.len(), HUGE_PAGE / 4 + 3);
        assert!(b.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn tables_start_on_cache_lines_and_do_not_overlap() {
        let lens = [3usize, 0, 16, 17, 1];
        let mut t = HugeTables::zeroed(&lens, "t").unwrap();
        for (k, &n) in lens.iter().enumerate() {
            assert_eq!(t.table(k).len(), n);
            assert_eq!(t.table(k).as_ptr() as usize % LINE, 0, "table {k}");
            t.table_mut(k).iter_mut().for_each(|v| *v = k as f32);
        }
        for (k, table) in t.tables().enumerate() {
            assert!(table.iter().all(|&v| v == k as f32), "table {k} was overwritten");
        }
        let e = HugeTables::zeroed(&[usize::MAX - 8, 16], "rows").unwrap_err().to_string();
        assert!(e.contains("rows") && e.contains("address space"), "{e}");
    }

    #[test]
    fn oversized_and_refused_maps_are_errors_naming_the_buffer() {
        let e = HugeBuffer::zeroed(usize::MAX / 2, "table 7").unwrap_err().to_string();
        assert!(e.contains("table 7") && e.contains("address space"), "{e}");
        // Fits the arithmetic but no system maps 2^62 bytes.
        let e = HugeBuffer::zeroed(1 << 60, "table 8").unwrap_err().to_string();
        assert!(e.contains("table 8") && e.contains("cannot map"), "{e}");
    }
}
