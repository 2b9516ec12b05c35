//! A growable buffer whose values start on a cache line.
//!
//! The vector kernels load 64 bytes at a time: a row of sixteen `f32` that
//! starts on a cache line is one line, and one that does not is two, which
//! costs a 512-bit load (or store) a second access. A `Vec` from the system
//! allocator starts 16 bytes into a page when it is large, so every such row
//! of it straddles two lines. [`AlignedVec`] keeps a few values of slack in
//! front and starts its contents on the first 64-byte boundary.
//!
//! Invariants: the contents are `buffer[start..start + len]`; `start` is less
//! than [`SLACK_BYTES`] worth of values, and the contents begin on a 64-byte
//! boundary whenever the allocator's alignment lets one fall inside the slack
//! (always for the primitive types the kernels use). Alignment is a matter of
//! speed only: the values are the same wherever they start.

use std::ops::{Deref, DerefMut};

/// Bytes of a cache line, the boundary the contents start on.
pub const SLACK_BYTES: usize = 64;

/// A resizable run of values starting on a 64-byte boundary.
#[derive(Default)]
pub struct AlignedVec<T> {
    buffer: Vec<T>,
    start: usize,
    len: usize,
}

impl<T: Clone> AlignedVec<T> {
    /// An empty buffer (no allocation).
    pub const fn new() -> Self {
        AlignedVec { buffer: Vec::new(), start: 0, len: 0 }
    }

    /// The values of `values`, starting on a cache line.
    pub fn from_slice(values: &[T]) -> Self {
        let mut v = AlignedVec::new();
        if let Some(first) = values.first() {
            v.resize(values.len(), first.clone());
            v.clone_from_slice(values);
        }
        v
    }

    /// Values of slack kept in front of the contents.
    fn slack() -> usize {
        SLACK_BYTES.div_ceil(std::mem::size_of::<T>().max(1))
    }

    /// Resizes to `len` values that the caller overwrites whole: within the
    /// allocation the values past the old length are left as an earlier use
    /// wrote them (initialized, not meaningful) rather than set to `value`, so
    /// a buffer that shrinks and grows again between uses (scratch shared by
    /// products of several shapes) is not filled each time. Past the
    /// allocation it grows as [`resize`](Self::resize) does.
    pub fn resize_to_overwrite(&mut self, len: usize, value: T) {
        if self.start + len > self.buffer.len() {
            self.resize(len, value);
        } else {
            self.len = len;
        }
    }

    /// Resizes to `len` values as `Vec::resize` does: the first
    /// `min(len, self.len())` values are kept, new ones are `value`. Grows
    /// the allocation only when it is too small.
    pub fn resize(&mut self, len: usize, value: T) {
        if self.start + len > self.buffer.len() {
            let mut buffer = vec![value.clone(); len + Self::slack()];
            let start = buffer.as_ptr().align_offset(SLACK_BYTES).min(Self::slack());
            let kept = self.len.min(len);
            buffer[start..start + kept].clone_from_slice(&self.buffer[self.start..self.start + kept]);
            (self.buffer, self.start) = (buffer, start);
        } else if len > self.len {
            self.buffer[self.start + self.len..self.start + len].fill(value);
        }
        self.len = len;
    }
}

impl<T> Deref for AlignedVec<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.buffer[self.start..self.start + self.len]
    }
}

impl<T> DerefMut for AlignedVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buffer[self.start..self.start + self.len]
    }
}

impl<T: Clone> Clone for AlignedVec<T> {
    /// A copy of the contents, aligned afresh in its own allocation.
    fn clone(&self) -> Self {
        AlignedVec::from_slice(self)
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for AlignedVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn aligned<T>(v: &AlignedVec<T>) -> bool {
        (v.as_ptr() as usize).is_multiple_of(SLACK_BYTES)
    }

    #[test]
    fn contents_start_on_a_cache_line() {
        let mut v = AlignedVec::<f32>::new();
        for len in [1, 13, 16, 1000, 300_000] {
            v.resize(len, 1.0);
            assert!(aligned(&v), "f32 × {len}");
        }
        let mut w = AlignedVec::<u16>::new();
        w.resize(77, 3);
        assert!(aligned(&w) && aligned(&w.clone()));
    }

    proptest! {
        /// Any sequence of resizes and writes leaves the contents a `Vec`
        /// put through the same sequence holds.
        #[test]
        fn resizes_as_a_vec_does(steps in proptest::collection::vec((0usize..400, any::<i16>()), 1..12)) {
            let (mut v, mut want) = (AlignedVec::<f64>::new(), Vec::<f64>::new());
            for (len, fill) in steps {
                v.resize(len, fill as f64);
                want.resize(len, fill as f64);
                if let (Some(a), Some(b)) = (v.last_mut(), want.last_mut()) {
                    *a += 0.5;
                    *b += 0.5;
                }
                prop_assert_eq!(&v[..], &want[..]);
                prop_assert!(v.is_empty() || aligned(&v));
                prop_assert_eq!(&v.clone()[..], &want[..]);
            }
        }

        /// The kept values stay, the length is the one asked for, the contents
        /// stay aligned, and only a grow past the allocation fills with `value`
        /// (within it the values are an earlier use's: the caller overwrites them).
        #[test]
        fn resizing_to_overwrite_keeps_the_kept_values(steps in proptest::collection::vec((0usize..400, any::<i16>()), 1..12)) {
            let mut v = AlignedVec::<f64>::new();
            for (len, fill) in steps {
                let before: Vec<f64> = v.to_vec();
                let capacity = v.buffer.len() - v.start;
                v.resize_to_overwrite(len, fill as f64);
                prop_assert_eq!(v.len(), len);
                let kept = before.len().min(len);
                prop_assert_eq!(&v[..kept], &before[..kept]);
                if len > capacity {
                    prop_assert!(v[kept..].iter().all(|&x| x == fill as f64));
                }
                prop_assert!(v.is_empty() || aligned(&v));
                for (i, x) in v.iter_mut().enumerate() {
                    *x = i as f64;
                }
            }
        }
    }
}
