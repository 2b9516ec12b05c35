//! Seeded, counter-based randomness.
//!
//! Parameters must not depend on how many workers a run has, so an embedding
//! row is initialised from a hash of `(seed, table, id, column)` rather than
//! from a generator whose position depends on the order rows are visited.

use crate::features::mix64;

/// Added to [`unit_f64`]'s third integer before it is mixed.
pub const UNIT_OFFSET: u64 = 0x632b_e59b_d9b4_e019;

/// A uniform value in `[0, 1)` derived from four integers.
#[inline]
pub fn unit_f64(seed: u64, a: u64, b: u64, c: u64) -> f64 {
    let h = mix64(seed ^ mix64(a ^ mix64(b.wrapping_add(UNIT_OFFSET) ^ mix64(c))));
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A uniform value in `[-bound, bound)` for column `col` of row `id` of `table`.
#[inline]
pub fn row_uniform(seed: u64, table: usize, id: u64, col: usize, bound: f32) -> f32 {
    ((unit_f64(seed, table as u64, id, col as u64) * 2.0 - 1.0) * bound as f64) as f32
}

/// The initialisation bound of a table of `rows` rows: `1/√rows`, in f32.
#[inline]
pub fn init_bound(rows: u64) -> f32 {
    1.0 / (rows as f32).sqrt()
}

/// The seeded initial row of `id` in a table whose initialisation bound is `bound`
/// (`1/√n` for `n` rows): what every store, and a reader of a checkpoint of updated
/// rows only, gives a row no step changed.
#[inline]
pub fn init_row(seed: u64, table: usize, id: u64, bound: f32, row: &mut [f32]) {
    for (c, v) in row.iter_mut().enumerate() {
        *v = row_uniform(seed, table, id, c, bound);
    }
}

/// A standard normal value from two counter-based uniforms (Box–Muller).
#[inline]
pub fn normal_f64(seed: u64, a: u64, b: u64, c: u64) -> f64 {
    let u1 = unit_f64(seed, a, b, c.wrapping_mul(2)).max(1e-300);
    let u2 = unit_f64(seed, a, b, c.wrapping_mul(2) + 1);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_moments() {
        let n = 100_000;
        let mean: f64 = (0..n).map(|i| unit_f64(7, 1, i, 0)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        let m2: f64 = (0..n).map(|i| normal_f64(7, 1, i, 0).powi(2)).sum::<f64>() / n as f64;
        assert!((m2 - 1.0).abs() < 0.03, "second moment {m2}");
    }
}
