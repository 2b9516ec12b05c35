//! A count-min sketch: approximate occurrence counts in fixed memory.

use crate::features::mix64;
use crate::snapshot::SketchCounters;

/// `depth` rows of `width` saturating `u32` counters. An estimate is never
/// below the true count and exceeds it by at most `e·N/width` with
/// probability `1 − e^−depth` (`N` = total count). Updates are conservative
/// (only the minimal counters grow), which tightens the estimates of rare ids
/// under skew.
///
/// With [`track_changes`](Self::track_changes) the sketch also knows which
/// counters grew since its last [`mark`](Self::mark), so a checkpoint delta
/// holds only those ([`changes`](Self::changes)).
#[derive(Clone, Debug)]
pub struct CountMinSketch {
    width: usize,
    depth: usize,
    seed: u64,
    counters: Vec<u32>,
    /// One bit per counter, set where it grew since the mark (with change tracking).
    changed: Option<Vec<u64>>,
    /// Counters were cleared, halved or replaced since the mark: a lower value
    /// cannot travel as a change, so the whole sketch must.
    rewritten: bool,
}

impl CountMinSketch {
    /// An empty sketch (`width` is rounded up to a power of two).
    pub fn new(width: usize, depth: usize, seed: u64) -> Self {
        let width = width.max(1).next_power_of_two();
        let depth = depth.max(1);
        CountMinSketch { width, depth, seed, counters: vec![0; width * depth], changed: None, rewritten: false }
    }

    /// This sketch, noting from now on which counters grow (see [`changes`](Self::changes)).
    pub fn track_changes(mut self) -> Self {
        self.changed = Some(vec![0; self.counters.len().div_ceil(64)]);
        self
    }

    /// Changes count from here (a checkpoint was taken).
    pub fn mark(&mut self) {
        if let Some(bits) = &mut self.changed {
            bits.fill(0);
        }
        self.rewritten = false;
    }

    /// The counters that grew since the [`mark`](Self::mark), with their values
    /// now (`changes_only`); `None` without change tracking, or when counters
    /// were cleared, halved or replaced since (the whole sketch must travel).
    pub fn changes(&self) -> Option<SketchCounters> {
        let bits = self.changed.as_ref().filter(|_| !self.rewritten)?;
        let (mut index, mut value) = (Vec::new(), Vec::new());
        for (w, &word) in bits.iter().enumerate() {
            let mut word = word;
            while word != 0 {
                let c = w * 64 + word.trailing_zeros() as usize;
                index.push(c as u32);
                value.push(self.counters[c]);
                word &= word - 1;
            }
        }
        Some(SketchCounters { len: self.counters.len(), index, value, changes_only: true })
    }

    /// Sets counter `c` to `next`, noting the change.
    #[inline]
    fn raise(&mut self, c: usize, next: u32) {
        self.counters[c] = next;
        if let Some(bits) = &mut self.changed {
            bits[c / 64] |= 1 << (c % 64);
        }
    }

    /// Counters per row.
    pub fn width(&self) -> usize {
        self.width
    }

    #[inline]
    fn hashes(&self, key: u64) -> (u64, u64) {
        let h = mix64(key ^ self.seed);
        (h, mix64(h) | 1)
    }

    #[inline]
    fn cell(&self, (h1, h2): (u64, u64), r: usize) -> usize {
        r * self.width + (h1.wrapping_add(h2.wrapping_mul(r as u64)) as usize & (self.width - 1))
    }

    /// The key of row `id` of `table`.
    #[inline]
    pub fn key(table: usize, id: u64) -> u64 {
        mix64(id ^ (table as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    /// Adds one occurrence of `key` and returns its new estimate.
    #[inline]
    pub fn add(&mut self, key: u64) -> u32 {
        let h = self.hashes(key);
        let next = self.estimate(key).saturating_add(1);
        for r in 0..self.depth {
            let c = self.cell(h, r);
            if self.counters[c] < next {
                self.raise(c, next);
            }
        }
        next
    }

    /// The counters, row by row (`depth × width`): what a checkpoint keeps.
    pub fn counters(&self) -> &[u32] {
        &self.counters
    }

    /// Replaces the counters with `counters` (a checkpoint's); false, with
    /// nothing changed, when they are not this sketch's `depth × width`.
    pub fn set_counters(&mut self, counters: &SketchCounters) -> bool {
        self.rewritten = true;
        counters.write_into(&mut self.counters)
    }

    /// Adds `n` occurrences of `key` at once (a restore), conservatively.
    pub fn add_n(&mut self, key: u64, n: u32) {
        let h = self.hashes(key);
        let next = self.estimate(key).saturating_add(n);
        for r in 0..self.depth {
            let c = self.cell(h, r);
            if self.counters[c] < next {
                self.raise(c, next);
            }
        }
    }

    /// The estimated count of `key` (≥ the true count).
    #[inline]
    pub fn estimate(&self, key: u64) -> u32 {
        let h = self.hashes(key);
        (0..self.depth).map(|r| self.counters[self.cell(h, r)]).min().unwrap_or(0)
    }

    /// Zeroes every counter.
    pub fn clear(&mut self) {
        self.counters.fill(0);
        self.rewritten = true;
    }

    /// Halves every counter (ages old counts).
    pub fn halve(&mut self) {
        for c in &mut self.counters {
            *c >>= 1;
        }
        self.rewritten = true;
    }

    /// Bytes of counters.
    pub fn bytes(&self) -> usize {
        self.counters.len() * 4
    }
}
