//! Zeroed `f32` buffers backed by anonymous memory that asks for 2 MiB
//! transparent huge pages.
//!
//! Embedding lookups are random row gathers from tables far larger than the
//! caches; with 4 KiB pages nearly every row costs a TLB miss as well as a
//! cache miss. Huge pages (where the kernel grants them; `madvise` mode is
//! the common default) remove most TLB misses. Without them this is an
//! ordinary zeroed allocation.
//!
//! Sizes are checked: a length whose byte size does not fit in `usize`, or a
//! mapping the system refuses, is an [`OperatorError::Memory`] naming what was
//! being allocated, never a wrapped size or a panic.

use crate::OperatorError;
use memmap2::MmapMut;

/// A fixed-length, zero-initialised `f32` buffer.
pub struct HugeBuffer {
    map: Option<MmapMut>,
    len: usize,
}

impl std::fmt::Debug for HugeBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HugeBuffer({} floats)", self.len)
    }
}

impl HugeBuffer {
    /// `len` zeros, for `what` (named in errors). Falls back to a plain anonymous map if huge
    /// pages are refused; errors when the byte size overflows or the system refuses the map.
    pub fn zeroed(len: usize, what: &str) -> Result<Self, OperatorError> {
        if len == 0 {
            return Ok(HugeBuffer { map: None, len });
        }
        let bytes = len.checked_mul(std::mem::size_of::<f32>()).ok_or_else(|| {
            OperatorError::memory(what, format!("{len} floats do not fit in this machine's address space"))
        })?;
        let map = MmapMut::map_anon(bytes)
            .map_err(|e| OperatorError::memory(what, format!("cannot map {bytes} bytes: {e}")))?;
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Ok(HugeBuffer { map: Some(map), len })
    }
}

impl std::ops::Deref for HugeBuffer {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match &self.map {
            // SAFETY: the map is page-aligned, holds `len` f32s and zero bytes are a valid f32.
            Some(m) => unsafe { std::slice::from_raw_parts(m.as_ptr() as *const f32, self.len) },
            None => &[],
        }
    }
}

impl std::ops::DerefMut for HugeBuffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        match &mut self.map {
            // SAFETY: as above, and the map is uniquely borrowed.
            Some(m) => unsafe { std::slice::from_raw_parts_mut(m.as_mut_ptr() as *mut f32, self.len) },
            None => &mut [],
        }
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
    fn oversized_and_refused_maps_are_errors_naming_the_buffer() {
        let e = HugeBuffer::zeroed(usize::MAX / 2, "table 7").unwrap_err().to_string();
        assert!(e.contains("table 7") && e.contains("address space"), "{e}");
        // Fits the arithmetic but no system maps 2^62 bytes.
        let e = HugeBuffer::zeroed(1 << 60, "table 8").unwrap_err().to_string();
        assert!(e.contains("table 8") && e.contains("cannot map"), "{e}");
    }
}
