//! Fused feature kernels: split → hash → bucket, split → parse → reduce,
//! one-hot → sum and concat → sum in one pass, with no intermediate strings,
//! tensors or one-hot rows.
//!
//! # Invariants
//! * Splitting is that of [`super::split`] (`slice::split` semantics: `k`
//!   delimiters give `k + 1` tokens, empty ones included), on the same
//!   AVX2-or-portable scan, which stops as soon as `max_tokens` is reached.
//! * A token's bucket depends only on its bytes, the seed and the table size:
//!   [`token_hash`] is `xxh3_64_with_seed(token, seed)` and [`reduce_bucket`]
//!   the multiply-shift range reduction of [`super::hash_bucket`], so every
//!   worker and every run agrees, whatever the token's encoding.
//! * Each fused kernel equals its `*_scalar` oracle, the unfused pipeline
//!   written plainly (split into owned byte strings, then hash / parse / count
//!   in separate passes over materialised intermediates), bit for bit.
//! * `out` vectors and `counts` are appended / added to, never cleared, so one
//!   call can extend the CSR bag of a batch.

use super::split::{for_each_token, scan_tokens};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The 64-bit hash of a token's bytes: `xxh3_64_with_seed(token, seed)`.
#[inline]
pub fn token_hash(seed: u64, token: &[u8]) -> u64 {
    xxh3_64_with_seed(token, seed)
}

/// Maps a well-mixed 64-bit hash onto `0..buckets` by multiply-shift
/// (`(hash × buckets) >> 64`), the reduction of [`super::hash_bucket`].
#[inline]
pub fn reduce_bucket(hash: u64, buckets: u64) -> u64 {
    debug_assert!(buckets > 0);
    ((hash as u128 * buckets as u128) >> 64) as u64
}

/// The bucket of one token: [`reduce_bucket`] of [`token_hash`].
#[inline]
pub fn token_bucket(seed: u64, token: &[u8], buckets: u64) -> u64 {
    reduce_bucket(token_hash(seed, token), buckets)
}

/// Split → hash → bucket fused: appends to `out` the bucket in
/// `0..buckets` of each token of `line` (see [`token_bucket`]), in order.
///
/// With `skip_empty`, empty tokens are dropped (an empty line then yields no
/// id: an absent list is an empty bag); without it they hash like any other
/// token. At most `max_tokens` ids are appended (`usize::MAX`: no limit):
/// the limit counts appended ids, i.e. non-empty tokens under `skip_empty`,
/// and the scan of the line stops at the delimiter that ends the last one.
///
/// # Panics
/// If `buckets == 0`.
pub fn split_hash_bucket(
    line: &[u8],
    delim: u8,
    seed: u64,
    buckets: u64,
    max_tokens: usize,
    skip_empty: bool,
    out: &mut Vec<u64>,
) {
    assert!(buckets > 0, "split_hash_bucket: zero buckets");
    if max_tokens == 0 {
        return;
    }
    let mut n = 0usize;
    scan_tokens(line, delim, |token| {
        if !(skip_empty && token.is_empty()) {
            out.push(token_bucket(seed, token, buckets));
            n += 1;
        }
        n < max_tokens
    });
}

/// The reference for [`split_hash_bucket`], unfused: split into owned byte
/// strings, drop empties, truncate, then a hash pass and a bucket pass.
pub fn split_hash_bucket_scalar(
    line: &[u8],
    delim: u8,
    seed: u64,
    buckets: u64,
    max_tokens: usize,
    skip_empty: bool,
    out: &mut Vec<u64>,
) {
    assert!(buckets > 0, "split_hash_bucket: zero buckets");
    let tokens: Vec<Vec<u8>> = line.split(|b| *b == delim).map(|t| t.to_vec()).collect();
    let kept: Vec<Vec<u8>> = tokens.into_iter().filter(|t| !(skip_empty && t.is_empty())).take(max_tokens).collect();
    let hashes: Vec<u64> = kept.iter().map(|t| xxh3_64_with_seed(t, seed)).collect();
    out.extend(hashes.iter().map(|&h| reduce_bucket(h, buckets)));
}

/// How [`split_parse_reduce`] combines the numbers of a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// The arithmetic mean.
    Mean,
    /// The sum.
    Sum,
}

/// Split → parse → reduce fused (the "numerical averaging" subgraph): parses
/// each non-empty token of `line` as an `f32` (exactly as `str::parse::<f32>`
/// would, via `fast-float2`, on bytes) and returns their mean or sum.
///
/// Empty tokens are skipped. At most `max_tokens` numbers are taken
/// (`usize::MAX`: all); tokens after the last one taken are not looked at.
/// The sum runs in `f64` in token order and is rounded to `f32` once, after
/// dividing by the count for [`Reduce::Mean`].
///
/// Returns `Ok(None)` when the line holds no number, and `Err(i)` where `i`
/// is the index in `line.split(delim)` (empty tokens counted) of the first
/// non-empty token that is not a number (`\r`, spaces and invalid UTF-8 make a
/// token not a number).
pub fn split_parse_reduce(line: &[u8], delim: u8, reduce: Reduce, max_tokens: usize) -> Result<Option<f32>, usize> {
    // -0.0, the neutral element of `+` (and where `Iterator::sum` starts), so `-0` sums to `-0`.
    let mut sum = -0.0f64;
    let mut count = 0usize;
    let mut index = 0usize;
    let mut bad = None;
    if max_tokens > 0 {
        scan_tokens(line, delim, |token| {
            if !token.is_empty() {
                match fast_float2::parse::<f32, _>(token) {
                    Ok(v) => {
                        sum += v as f64;
                        count += 1;
                    }
                    Err(_) => {
                        bad = Some(index);
                        return false;
                    }
                }
            }
            index += 1;
            count < max_tokens
        });
    }
    if let Some(i) = bad {
        return Err(i);
    }
    Ok(finish(sum, count, reduce))
}

fn finish(sum: f64, count: usize, reduce: Reduce) -> Option<f32> {
    match (count, reduce) {
        (0, _) => None,
        (_, Reduce::Sum) => Some(sum as f32),
        (n, Reduce::Mean) => Some((sum / n as f64) as f32),
    }
}

/// The reference for [`split_parse_reduce`], unfused: split into owned byte
/// strings, UTF-8-validate and `str::parse::<f32>` each into a vector, then
/// reduce it.
pub fn split_parse_reduce_scalar(
    line: &[u8],
    delim: u8,
    reduce: Reduce,
    max_tokens: usize,
) -> Result<Option<f32>, usize> {
    let tokens: Vec<Vec<u8>> = line.split(|b| *b == delim).map(|t| t.to_vec()).collect();
    let mut values: Vec<f32> = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        if values.len() == max_tokens {
            break;
        }
        if t.is_empty() {
            continue;
        }
        let parsed = std::str::from_utf8(t).ok().and_then(|s| s.parse::<f32>().ok());
        match parsed {
            Some(v) => values.push(v),
            None => return Err(i),
        }
    }
    let sum: f64 = values.iter().map(|&v| v as f64).sum();
    Ok(finish(sum, values.len(), reduce))
}

/// One-hot → sum fused: adds 1 to `counts[b]` for the bucket `b` (see
/// [`token_bucket`] with `buckets = counts.len()`) of each non-empty token of
/// `line`, i.e. the row sum of the sample's one-hot matrix, never built.
/// `counts` is added to, not cleared.
///
/// # Panics
/// If `counts.len() as u64 != buckets` or `buckets == 0`.
pub fn multi_hot_counts(line: &[u8], delim: u8, seed: u64, buckets: u64, counts: &mut [u32]) {
    assert!(
        buckets > 0 && counts.len() as u64 == buckets,
        "multi_hot_counts: {} counts for {buckets} buckets",
        counts.len()
    );
    for_each_token(line, delim, usize::MAX, |t| {
        if !t.is_empty() {
            counts[token_bucket(seed, t, buckets) as usize] += 1;
        }
    });
}

/// The reference for [`multi_hot_counts`], unfused: split into owned byte
/// strings, hash, bucket, build one one-hot row per token, then sum the rows.
pub fn multi_hot_counts_scalar(line: &[u8], delim: u8, seed: u64, buckets: u64, counts: &mut [u32]) {
    assert!(
        buckets > 0 && counts.len() as u64 == buckets,
        "multi_hot_counts: {} counts for {buckets} buckets",
        counts.len()
    );
    let tokens: Vec<Vec<u8>> = line.split(|b| *b == delim).filter(|t| !t.is_empty()).map(|t| t.to_vec()).collect();
    let ids: Vec<u64> = tokens.iter().map(|t| reduce_bucket(xxh3_64_with_seed(t, seed), buckets)).collect();
    let rows: Vec<Vec<u32>> = ids
        .iter()
        .map(|&id| {
            let mut row = vec![0u32; buckets as usize];
            row[id as usize] = 1;
            row
        })
        .collect();
    for row in &rows {
        for (c, r) in counts.iter_mut().zip(row) {
            *c += r;
        }
    }
}

/// Concat → sum fused: `out[j] = 0 + parts[0][j] + parts[1][j] + …`, summed
/// in part order, without building the `parts.len() × width` concatenation.
/// `out` is overwritten (all zeros for no parts). The loops are plain slices,
/// which the compiler vectorises (AVX2 on x86-64-v3).
///
/// # Panics
/// If a part's length differs from `out.len()`.
pub fn concat_sum(parts: &[&[f32]], out: &mut [f32]) {
    out.fill(0.0);
    for part in parts {
        assert_eq!(part.len(), out.len(), "concat_sum: part of width {} into {}", part.len(), out.len());
        for (o, x) in out.iter_mut().zip(part.iter()) {
            *o += *x;
        }
    }
}

/// The reference for [`concat_sum`], unfused: concatenate the parts into one
/// row-major matrix, then sum its columns.
pub fn concat_sum_scalar(parts: &[&[f32]], out: &mut [f32]) {
    let width = out.len();
    let mut matrix: Vec<f32> = Vec::new();
    for part in parts {
        assert_eq!(part.len(), width, "concat_sum: part of width {} into {width}", part.len());
        matrix.extend_from_slice(part);
    }
    for (j, o) in out.iter_mut().enumerate() {
        let mut s = 0.0f32;
        for r in 0..parts.len() {
            s += matrix[r * width + j];
        }
        *o = s;
    }
}

/// The bucket of `value` among sorted `boundaries` (ascending): the number of
/// boundaries `<= value`, so `value < boundaries[0]` → 0,
/// `boundaries[i-1] <= value < boundaries[i]` → `i`, and
/// `value >= boundaries[last]` → `boundaries.len()` (TensorFlow's
/// `Bucketize`). NaN compares below every boundary → 0. Binary search.
#[inline]
pub fn bucketize(value: f32, boundaries: &[f32]) -> u32 {
    boundaries.partition_point(|b| *b <= value) as u32
}

/// The reference for [`bucketize`]: a linear count.
pub fn bucketize_scalar(value: f32, boundaries: &[f32]) -> u32 {
    boundaries.iter().filter(|b| **b <= value).count() as u32
}

/// In place, `x ← ln(1 + max(min(max(x, lo), hi), 0))`: clamp to `[lo, hi]`
/// (a NaN becomes `lo`), then the [`super::log1p_clamped`] transform.
pub fn log1p_clamp_slice(xs: &mut [f32], lo: f32, hi: f32) {
    for x in xs {
        *x = super::log1p_clamped(x.max(lo).min(hi));
    }
}

/// The reference for [`log1p_clamp_slice`], unfused: a clamp pass, a
/// `max(·, 0)` pass and an `ln_1p` pass, each into a new vector.
pub fn log1p_clamp_slice_scalar(xs: &mut [f32], lo: f32, hi: f32) {
    let clamped: Vec<f32> = xs
        .iter()
        .map(|x| {
            if x.is_nan() || *x < lo {
                lo
            } else if *x > hi {
                hi
            } else {
                *x
            }
        })
        .collect();
    let positive: Vec<f32> = clamped.iter().map(|x| if *x > 0.0 { *x } else { 0.0 }).collect();
    for (x, p) in xs.iter_mut().zip(positive) {
        *x = p.ln_1p();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::split::tests::line_strategy;
    use proptest::prelude::*;

    fn same(a: Result<Option<f32>, usize>, b: Result<Option<f32>, usize>) -> bool {
        match (a, b) {
            (Ok(Some(x)), Ok(Some(y))) => x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
            (a, b) => a == b,
        }
    }

    fn check_hash(line: &[u8], delim: u8, seed: u64, buckets: u64) {
        for skip in [false, true] {
            for max in [0, 1, 2, 5, 50, usize::MAX] {
                let (mut fast, mut slow) = (vec![7], vec![7]);
                split_hash_bucket(line, delim, seed, buckets, max, skip, &mut fast);
                split_hash_bucket_scalar(line, delim, seed, buckets, max, skip, &mut slow);
                assert_eq!(fast, slow, "skip {skip} max {max}");
                assert!(fast[1..].iter().all(|&b| b < buckets));
            }
        }
        let (mut fast, mut slow) = (vec![0u32; buckets as usize], vec![0u32; buckets as usize]);
        multi_hot_counts(line, delim, seed, buckets, &mut fast);
        multi_hot_counts_scalar(line, delim, seed, buckets, &mut slow);
        assert_eq!(fast, slow);
    }

    fn check_parse(line: &[u8], delim: u8) {
        for reduce in [Reduce::Mean, Reduce::Sum] {
            for max in [0, 1, 3, usize::MAX] {
                let fast = split_parse_reduce(line, delim, reduce, max);
                let slow = split_parse_reduce_scalar(line, delim, reduce, max);
                assert!(
                    same(fast, slow),
                    "{:?}: {fast:?} vs {slow:?} ({reduce:?}, max {max})",
                    String::from_utf8_lossy(line)
                );
            }
        }
    }

    #[test]
    fn hash_edge_cases() {
        for line in [&b""[..], b";", b";;;", b"a;;b;", b";x", b"1;2;3\r", b"\x80\xff;\xc3\x28"] {
            check_hash(line, b';', 42, 17);
        }
        let mut ids = Vec::new();
        split_hash_bucket(b"", b';', 1, 10, usize::MAX, true, &mut ids);
        assert!(ids.is_empty(), "an empty list is an empty bag");
        split_hash_bucket(b"", b';', 1, 10, usize::MAX, false, &mut ids);
        assert_eq!(ids.len(), 1, "without skip_empty the empty line is one empty token");
        ids.clear();
        split_hash_bucket(b"a;b;a", b';', 1, 1 << 40, usize::MAX, true, &mut ids);
        assert_eq!(ids[0], ids[2]);
        assert_ne!(ids[0], ids[1]);
        assert_eq!(ids[0], token_bucket(1, b"a", 1 << 40));
    }

    #[test]
    fn parse_reduce_examples() {
        assert_eq!(split_parse_reduce(b"1;2;;3", b';', Reduce::Mean, usize::MAX), Ok(Some(2.0)));
        assert_eq!(split_parse_reduce(b"1;2;;3", b';', Reduce::Sum, usize::MAX), Ok(Some(6.0)));
        assert_eq!(split_parse_reduce(b"1;2;;3", b';', Reduce::Sum, 2), Ok(Some(3.0)));
        assert_eq!(split_parse_reduce(b"", b';', Reduce::Mean, usize::MAX), Ok(None));
        assert_eq!(split_parse_reduce(b";;", b';', Reduce::Mean, usize::MAX), Ok(None));
        assert_eq!(split_parse_reduce(b"1;;x;2", b';', Reduce::Mean, usize::MAX), Err(2));
        assert_eq!(split_parse_reduce(b"1;2\r", b';', Reduce::Mean, usize::MAX), Err(1));
        assert_eq!(split_parse_reduce(b"1;x", b';', Reduce::Mean, 1), Ok(Some(1.0)), "stops before the bad token");
        assert_eq!(split_parse_reduce(b"12.5;-2.5e1;.5", b';', Reduce::Sum, usize::MAX), Ok(Some(-12.0)));
        // Underflow keeps its sign, and the sum starts at -0 like `Iterator::sum`.
        let neg_zero = split_parse_reduce(b"-6.5e-309", b';', Reduce::Mean, usize::MAX);
        assert_eq!(neg_zero.map(|v| v.map(f32::to_bits)), Ok(Some((-0.0f32).to_bits())));
        for line in [
            &b""[..],
            b";",
            b"1;2;3\r",
            b"\x80;1",
            b"1e;2",
            b".",
            b"+",
            b"-",
            b"e5",
            b"inf;1",
            b"NaN",
            b"1.;.1",
            b"0x10",
        ] {
            check_parse(line, b';');
        }
    }

    #[test]
    fn long_lines() {
        let mut line = Vec::new();
        let mut i = 0u64;
        while line.len() < 100_000 {
            line.extend_from_slice(format!("{}.{};", i % 977, i % 10).as_bytes());
            i += 1;
        }
        check_parse(&line, b';');
        check_hash(&line, b';', 9, 1000);
        line.push(b'\r');
        check_parse(&line, b';');
    }

    #[test]
    fn concat_bucketize_log1p() {
        let a = [1.0f32, -0.0, 3.0];
        let b = [0.5f32, -0.0, f32::MAX];
        let (mut fast, mut slow) = ([9.0f32; 3], [9.0f32; 3]);
        concat_sum(&[&a, &b], &mut fast);
        concat_sum_scalar(&[&a, &b], &mut slow);
        assert_eq!(fast, [1.5, 0.0, f32::MAX]);
        assert_eq!(fast.map(f32::to_bits), slow.map(f32::to_bits));
        concat_sum(&[], &mut fast);
        assert_eq!(fast, [0.0; 3]);
        let bounds = [0.0f32, 10.0, 100.0];
        assert_eq!(bucketize(-5.0, &bounds), 0);
        assert_eq!(bucketize(0.0, &bounds), 1);
        assert_eq!(bucketize(99.9, &bounds), 2);
        assert_eq!(bucketize(150.0, &bounds), 3);
        assert_eq!(bucketize(f32::NAN, &bounds), 0);
        assert_eq!(bucketize(1.0, &[]), 0);
        let mut xs = [-3.0f32, 0.0, 1.0, 1e9, f32::NAN];
        log1p_clamp_slice(&mut xs, -1.0, 100.0);
        assert_eq!(xs, [0.0, 0.0, 2f32.ln(), 101f32.ln(), 0.0]);
    }

    fn bits(xs: &[f32]) -> Vec<u32> {
        xs.iter().map(|x| x.to_bits()).collect()
    }

    /// `-0.0` in, `+0.0` out, as the oracle's `x > 0` test gives (`f32::max` may keep the
    /// sign of a zero at run time, which `==` would not see).
    #[test]
    fn log1p_clamp_of_negative_zero_is_positive_zero() {
        for (lo, hi) in [(-1.0f32, 100.0), (-0.0, 0.0), (0.0, 5.0), (-0.0, 1.0)] {
            let input = [-0.0f32, 0.0, -1e-30, f32::NAN];
            let (mut fast, mut slow) = (input, input);
            log1p_clamp_slice(std::hint::black_box(&mut fast), std::hint::black_box(lo), std::hint::black_box(hi));
            log1p_clamp_slice_scalar(&mut slow, lo, hi);
            assert_eq!(bits(&fast), bits(&slow), "lo {lo} hi {hi}");
            assert_eq!(bits(&fast), [0; 4], "lo {lo} hi {hi}");
        }
        assert_eq!(super::super::log1p_clamped(std::hint::black_box(-0.0)).to_bits(), 0);
    }

    fn number_line() -> impl Strategy<Value = Vec<u8>> {
        let token = prop_oneof![
            4 => any::<f32>().prop_map(|v| v.to_string()),
            4 => (-100_000i32..100_000, 0u32..100).prop_map(|(i, f)| format!("{i}.{f}")),
            2 => any::<i64>().prop_map(|v| v.to_string()),
            1 => any::<f64>().prop_map(|v| format!("{v:e}")),
            1 => Just(String::new()),
            1 => "[0-9eE+\\-.a-z\r]{0,6}",
        ];
        proptest::collection::vec(token, 0..30).prop_map(|ts| ts.join(";").into_bytes())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn hash_matches_unfused(line in line_strategy(b';', 300), seed in any::<u64>(), buckets in 1u64..64) {
            check_hash(&line, b';', seed, buckets);
        }

        #[test]
        fn parse_matches_unfused(line in number_line()) {
            check_parse(&line, b';');
        }

        #[test]
        fn parse_matches_unfused_on_noise(line in line_strategy(b';', 200)) {
            check_parse(&line, b';');
        }

        #[test]
        fn concat_sum_matches_unfused(width in 0usize..70, rows in 0usize..6, seed in any::<u64>()) {
            let data: Vec<Vec<f32>> = (0..rows)
                .map(|r| (0..width).map(|j| (crate::features::mix64(seed ^ (r * 1000 + j) as u64) as i64 as f64 / 1e15) as f32).collect())
                .collect();
            let parts: Vec<&[f32]> = data.iter().map(|v| v.as_slice()).collect();
            let (mut fast, mut slow) = (vec![1.0f32; width], vec![2.0f32; width]);
            concat_sum(&parts, &mut fast);
            concat_sum_scalar(&parts, &mut slow);
            prop_assert_eq!(fast.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), slow.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        }

        #[test]
        fn bucketize_matches_linear(value in any::<f32>(), mut bounds in proptest::collection::vec(-1e3f32..1e3, 0..40)) {
            bounds.sort_by(f32::total_cmp);
            prop_assert_eq!(bucketize(value, &bounds), bucketize_scalar(value, &bounds));
            if let Some(&b) = bounds.first() {
                prop_assert_eq!(bucketize(b, &bounds), bucketize_scalar(b, &bounds));
            }
        }

        #[test]
        fn log1p_clamp_matches_unfused(
            mut xs in proptest::collection::vec(prop_oneof![8 => any::<f32>(), 1 => Just(-0.0f32), 1 => Just(0.0f32)], 0..50),
            lo in prop_oneof![4 => -10f32..0.5, 1 => Just(-0.0f32), 1 => Just(0.0f32)],
            span in prop_oneof![4 => 0f32..1e6, 1 => Just(0.0f32)],
        ) {
            let mut want = xs.clone();
            log1p_clamp_slice_scalar(&mut want, lo, lo + span);
            log1p_clamp_slice(std::hint::black_box(&mut xs), lo, lo + span);
            // Bit for bit: a zero of either sign (and NaN) comes out as +0.0 in both.
            prop_assert_eq!(bits(&xs), bits(&want));
        }
    }
}
