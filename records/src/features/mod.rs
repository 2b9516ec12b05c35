//! Feature kernels for dense and categorical columns.
//!
//! Free functions over bytes and slices. The Criteo preset uses
//! [`log1p_clamped`] for counts and [`hash_bucket`] for the 32-bit hex
//! categories: the bucket of a value depends only on the value, the field's
//! seed and the table size, so every worker and every run agrees on it.
//!
//! Byte-line kernels for list-valued (sequence) columns live in submodules:
//! * [`split`]: delimiter positions and token ranges of a line (AVX2 with a
//!   portable fallback), `slice::split` semantics, early stop;
//! * [`fused`]: split → hash → bucket, split → parse → mean/sum, one-hot →
//!   sum, concat → sum, bucketize and clamped log1p, each in one pass with no
//!   intermediate strings, each equal to its unfused `*_scalar` oracle.

pub mod cross;
pub mod fused;
pub mod split;

/// `ln(1 + max(x, 0))`: the dense transform of the DLRM Criteo setup. Every zero and NaN
/// becomes `+0.0` (not `f32::max`, which may keep the sign of `-0.0`), so the result's bits
/// depend only on the value, whatever the CPU or the compiler's constant folding.
#[inline]
pub fn log1p_clamped(x: f32) -> f32 {
    (if x > 0.0 { x } else { 0.0 }).ln_1p()
}

/// Applies [`log1p_clamped`] in place.
pub fn log1p_clamped_slice(xs: &mut [f32]) {
    for x in xs {
        *x = log1p_clamped(*x);
    }
}

/// A 64-bit mixing function (the MurmurHash3 finaliser): a bijection whose
/// output bits each depend on every input bit.
#[inline]
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// The seed of field `field` derived from a run seed.
#[inline]
pub fn field_seed(seed: u64, field: usize) -> u64 {
    mix64(seed ^ mix64(0x9e37_79b9_7f4a_7c15 ^ field as u64))
}

/// Buckets `value` into `0..table_size` with a per-field seeded hash.
#[inline]
pub fn hash_bucket(field_seed: u64, value: u64, table_size: u64) -> u64 {
    debug_assert!(table_size > 0);
    // Multiply-shift range reduction: unbiased enough and cheaper than `%`.
    ((mix64(value ^ field_seed) as u128 * table_size as u128) >> 64) as u64
}

/// Parses up to 16 hex digits (either case) into a `u64`; `None` on any other byte
/// or an empty or longer input.
#[inline]
pub fn parse_hex(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 16 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in bytes {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return None,
        };
        v = (v << 4) | d as u64;
    }
    Some(v)
}

/// Parses an optionally negative decimal integer; `None` on any other byte,
/// an empty input or overflow.
#[inline]
pub fn parse_i64(bytes: &[u8]) -> Option<i64> {
    let (neg, digits) = match bytes.first() {
        Some(b'-') => (true, &bytes[1..]),
        Some(b'+') => (false, &bytes[1..]),
        _ => (false, bytes),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut v: i64 = 0;
    for &b in digits {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v * 10 + d as i64;
    }
    Some(if neg { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn log1p_clamps_negatives() {
        assert_eq!(log1p_clamped(-2.0), 0.0);
        assert!((log1p_clamped(1.0) - 2f32.ln()).abs() < 1e-7);
    }

    #[test]
    fn hex_and_int_edge_cases() {
        assert_eq!(parse_hex(b"68fd1e64"), Some(0x68fd1e64));
        assert_eq!(parse_hex(b"FFFFFFFF"), Some(0xffff_ffff));
        assert_eq!(parse_hex(b""), None);
        assert_eq!(parse_hex(b"68fz1e64"), None);
        assert_eq!(parse_i64(b"-2"), Some(-2));
        assert_eq!(parse_i64(b"1382"), Some(1382));
        assert_eq!(parse_i64(b"-"), None);
        assert_eq!(parse_i64(b"1.5"), None);
        assert_eq!(parse_i64(b"9999999999999999999"), None);
    }

    proptest! {
        #[test]
        fn hex_matches_std(v in any::<u32>()) {
            let s = format!("{v:08x}");
            prop_assert_eq!(parse_hex(s.as_bytes()), u64::from_str_radix(&s, 16).ok());
        }

        #[test]
        fn int_matches_std(v in -1_000_000_000_000i64..1_000_000_000_000) {
            let s = v.to_string();
            prop_assert_eq!(parse_i64(s.as_bytes()), Some(v));
        }

        #[test]
        fn bucket_in_range(seed in any::<u64>(), v in any::<u64>(), n in 1u64..10_000_000) {
            prop_assert!(hash_bucket(seed, v, n) < n);
        }
    }
}
