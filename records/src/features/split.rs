//! Splitting a byte line on a one-byte delimiter, without allocating tokens.
//!
//! # Semantics
//! Every function here splits exactly like [`slice::split`] with
//! `|b| *b == delim`:
//! * a line with `k` delimiters has `k + 1` tokens, so the empty line is one
//!   empty token and a line made only of `k` delimiters is `k + 1` empty tokens;
//! * a leading, trailing or doubled delimiter gives an empty token;
//! * every other byte is data: bytes `0x80..=0xff` (invalid UTF-8 is fine),
//!   `\r` (a CRLF remnant stays in the last token), `\0`.
//!
//! Positions are byte indices into the line. With delimiter positions
//! `p_0 < p_1 < … < p_{k-1}` from [`split_positions`], token `i` is
//! `line[s_i..e_i]` where `s_0 = 0`, `s_i = p_{i-1} + 1`, `e_i = p_i` for
//! `i < k`, and `e_k = line.len()`. Lines must be shorter than 4 GiB
//! (`u32` positions); longer lines panic.
//!
//! # Kernels
//! One internal scan walks the delimiter positions in order and can stop
//! early; [`split_positions`], [`for_each_token`] and [`split_tokens_max`] (and
//! the fused kernels of [`super::fused`]) are built on it. On x86-64 with AVX2
//! (asked of [`crate::cpu::has`] at run time, so `TIDEREC_MAX_ISA=portable`
//! turns it off) it compares 32 bytes at a time
//! (`_mm256_cmpeq_epi8`), turns the result into a bit mask
//! (`_mm256_movemask_epi8`) and walks the set bits with `trailing_zeros`, so
//! its cost is one compare per 32 bytes plus one step per delimiter. Elsewhere
//! a portable SWAR scan does the same 8 bytes at a time in a `u64`. The
//! `*_scalar` functions are plain byte loops: the test oracles.

/// Appends to `out` the byte index of every `delim` in `line`, in increasing
/// order (see the module docs for how tokens lie between them). `out` is not
/// cleared. Uses AVX2 when the CPU has it.
///
/// # Panics
/// If `line.len() > u32::MAX`.
pub fn split_positions(line: &[u8], delim: u8, out: &mut Vec<u32>) {
    check_len(line);
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has(crate::cpu::Feature::Avx2) {
            // SAFETY: the CPU supports AVX2, checked just above.
            unsafe { positions_avx2(line, delim, out) };
            return;
        }
    }
    scan_delims(line, delim, |p| {
        out.push(p as u32);
        true
    });
}

/// [`split_positions`] with AVX2, 64 bytes per step: two compares give a
/// 64-bit mask whose set bits are written out four at a time without a
/// branch per delimiter (positions past the mask's last bit land in reserved
/// capacity and are not counted), then the length grows by the mask's
/// popcount. Dense delimiters (short fields) cost no branch mispredictions.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn positions_avx2(line: &[u8], delim: u8, out: &mut Vec<u32>) {
    use std::arch::x86_64::{__m256i, _mm256_cmpeq_epi8, _mm256_loadu_si256, _mm256_movemask_epi8, _mm256_set1_epi8};
    let needle = _mm256_set1_epi8(delim as i8);
    let (len, ptr) = (line.len(), line.as_ptr());
    let mut base = 0usize;
    while base + 64 <= len {
        // SAFETY: `base + 64 <= len`: both 32-byte loads are inside `line`; `loadu` needs no alignment.
        let (a, b) = unsafe {
            (
                _mm256_loadu_si256(ptr.add(base) as *const __m256i),
                _mm256_loadu_si256(ptr.add(base + 32) as *const __m256i),
            )
        };
        let lo = _mm256_movemask_epi8(_mm256_cmpeq_epi8(a, needle)) as u32 as u64;
        let hi = _mm256_movemask_epi8(_mm256_cmpeq_epi8(b, needle)) as u32 as u64;
        let mut mask = lo | (hi << 32);
        if mask != 0 {
            let n = mask.count_ones() as usize;
            // Groups of four may write up to 3 positions past the `n` counted: room for 64 + 3.
            out.reserve(67);
            let at = out.len();
            let dst = out.as_mut_ptr();
            let mut k = 0;
            while k < n {
                for j in 0..4 {
                    // SAFETY: `at + k + j < at + 67`, within the capacity reserved above.
                    unsafe { dst.add(at + k + j).write((base + mask.trailing_zeros() as usize) as u32) };
                    mask &= mask.wrapping_sub(1);
                }
                k += 4;
            }
            // SAFETY: the first `n` slots after `at` hold the block's positions, in order.
            unsafe { out.set_len(at + n) };
        }
        base += 64;
    }
    // SAFETY: the CPU supports AVX2 (this function's contract).
    unsafe {
        scan_avx2(&line[base..], delim, |p| {
            out.push((base + p) as u32);
            true
        })
    };
}

/// The reference for [`split_positions`]: a plain byte loop.
pub fn split_positions_scalar(line: &[u8], delim: u8, out: &mut Vec<u32>) {
    check_len(line);
    for (i, &b) in line.iter().enumerate() {
        if b == delim {
            out.push(i as u32);
        }
    }
}

/// [`split_positions`] with `memchr::memchr_iter`: a baseline for benchmarks.
pub fn split_positions_memchr(line: &[u8], delim: u8, out: &mut Vec<u32>) {
    check_len(line);
    out.extend(memchr::memchr_iter(delim, line).map(|p| p as u32));
}

/// Calls `f` on each of the first `max_tokens` tokens of `line` in order, as
/// `line.split(|b| *b == delim).take(max_tokens)` would yield them, and stops
/// scanning the line after the last one (`usize::MAX` means all tokens; `0`
/// calls `f` never).
pub fn for_each_token<'a>(line: &'a [u8], delim: u8, max_tokens: usize, mut f: impl FnMut(&'a [u8])) {
    if max_tokens == 0 {
        return;
    }
    let mut n = 0usize;
    scan_tokens(line, delim, |token| {
        f(token);
        n += 1;
        n < max_tokens
    });
}

/// The fields of `line` split on `delim` when there are exactly `N` of them
/// (stops scanning after the `N + 1`-th); `None` otherwise.
pub fn split_exact<const N: usize>(line: &[u8], delim: u8) -> Option<[&[u8]; N]> {
    let mut fields: [&[u8]; N] = [&[]; N];
    let mut n = 0;
    for_each_token(line, delim, N + 1, |t| {
        if n < N {
            fields[n] = t;
        }
        n += 1;
    });
    (n == N).then_some(fields)
}

/// Calls `f` on the tokens of `line` in order (as `line.split(|b| *b == delim)`
/// yields them) until `f` returns `false`; the rest of the line is not scanned.
pub fn scan_tokens<'a>(line: &'a [u8], delim: u8, mut f: impl FnMut(&'a [u8]) -> bool) {
    let mut start = 0usize;
    let mut open = true;
    scan_delims(line, delim, |p| {
        open = f(&line[start..p]);
        start = p + 1;
        open
    });
    if open {
        f(&line[start..]);
    }
}

/// Appends to `out` the `(start, end)` byte range of each of the first
/// `max_tokens` tokens of `line` (split and truncate fused: the scan stops at
/// the delimiter that ends token `max_tokens`; `usize::MAX` means all). Token
/// `i` is `line[start as usize..end as usize]`, the `i`-th item of
/// `line.split(|b| *b == delim)`.
///
/// # Panics
/// If `line.len() > u32::MAX`.
pub fn split_tokens_max(line: &[u8], delim: u8, max_tokens: usize, out: &mut Vec<(u32, u32)>) {
    check_len(line);
    if max_tokens == 0 {
        return;
    }
    let mut start = 0u32;
    let mut n = 0usize;
    scan_delims(line, delim, |p| {
        out.push((start, p as u32));
        start = p as u32 + 1;
        n += 1;
        n < max_tokens
    });
    if n < max_tokens {
        out.push((start, line.len() as u32));
    }
}

/// The reference for [`split_tokens_max`], from [`slice::split`].
pub fn split_tokens_max_scalar(line: &[u8], delim: u8, max_tokens: usize, out: &mut Vec<(u32, u32)>) {
    check_len(line);
    let base = line.as_ptr() as usize;
    for token in line.split(|b| *b == delim).take(max_tokens) {
        let start = (token.as_ptr() as usize - base) as u32;
        out.push((start, start + token.len() as u32));
    }
}

#[inline]
fn check_len(line: &[u8]) {
    assert!(line.len() <= u32::MAX as usize, "line of {} bytes: positions are u32", line.len());
}

/// Calls `f(p)` for each delimiter position `p` in increasing order until `f`
/// returns `false`. The one dispatch point between the AVX2 and the portable scan.
#[inline]
pub(crate) fn scan_delims(line: &[u8], delim: u8, f: impl FnMut(usize) -> bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has(crate::cpu::Feature::Avx2) {
            // SAFETY: the CPU supports AVX2, checked just above.
            unsafe { scan_avx2(line, delim, f) };
            return;
        }
    }
    scan_swar(line, delim, f);
}

/// The AVX2 scan: 32 bytes per compare; the last `len % 32` bytes are copied
/// into a 32-byte block and the bits past the end masked off.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn scan_avx2(line: &[u8], delim: u8, mut f: impl FnMut(usize) -> bool) {
    use std::arch::x86_64::{__m256i, _mm256_cmpeq_epi8, _mm256_loadu_si256, _mm256_movemask_epi8, _mm256_set1_epi8};
    let needle = _mm256_set1_epi8(delim as i8);
    let len = line.len();
    let ptr = line.as_ptr();
    let mut base = 0usize;
    while base + 32 <= len {
        // SAFETY: `base + 32 <= len`, so the 32 bytes read are inside `line`;
        // `loadu` has no alignment requirement.
        let v = unsafe { _mm256_loadu_si256(ptr.add(base) as *const __m256i) };
        let mut mask = _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, needle)) as u32;
        while mask != 0 {
            if !f(base + mask.trailing_zeros() as usize) {
                return;
            }
            mask &= mask - 1;
        }
        base += 32;
    }
    let rest = len - base;
    if rest > 0 {
        let mut block = [0u8; 32];
        block[..rest].copy_from_slice(&line[base..]);
        // SAFETY: `block` is 32 bytes long; `loadu` has no alignment requirement.
        let v = unsafe { _mm256_loadu_si256(block.as_ptr() as *const __m256i) };
        // The padding may equal `delim` (a zero delimiter): keep only the first `rest` bits.
        let mut mask = _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, needle)) as u32 & ((1u32 << rest) - 1);
        while mask != 0 {
            if !f(base + mask.trailing_zeros() as usize) {
                return;
            }
            mask &= mask - 1;
        }
    }
}

/// The portable scan: 8 bytes per step in a `u64`. `x = word ^ broadcast(delim)`
/// has a zero byte exactly where `delim` is; `!(((x & 0x7f…) + 0x7f…) | x | 0x7f…)`
/// sets the high bit of exactly those bytes (no carry crosses a byte).
pub(crate) fn scan_swar(line: &[u8], delim: u8, mut f: impl FnMut(usize) -> bool) {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let needle = u64::from_ne_bytes([delim; 8]);
    let mut chunks = line.chunks_exact(8);
    let mut base = 0usize;
    for chunk in &mut chunks {
        let x = u64::from_le_bytes(chunk.try_into().expect("8-byte chunk")) ^ needle;
        let mut mask = !(((x & LOW7).wrapping_add(LOW7)) | x | LOW7);
        while mask != 0 {
            if !f(base + (mask.trailing_zeros() / 8) as usize) {
                return;
            }
            mask &= mask - 1;
        }
        base += 8;
    }
    for (i, &b) in chunks.remainder().iter().enumerate() {
        if b == delim && !f(base + i) {
            return;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bytes from an alphabet rich in delimiters, `\r`, digits and non-UTF-8 bytes.
    pub(crate) fn line_strategy(delim: u8, max_len: usize) -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            3 => Just(delim),
            1 => Just(b'\r'),
            1 => Just(b'\n'),
            1 => Just(0u8),
            3 => b'0'..=b'9',
            2 => b'a'..=b'z',
            2 => 0x80u8..=0xff,
            1 => any::<u8>(),
        ];
        prop_oneof![
            proptest::collection::vec(byte.clone(), 0..max_len),
            // Lengths around the 32- and 64-byte blocks.
            prop::sample::select(vec![31usize, 32, 33, 63, 64, 65, 95, 96, 97])
                .prop_flat_map(move |n| proptest::collection::vec(byte.clone(), n)),
        ]
    }

    fn positions_via(scan: impl Fn(&[u8], u8, &mut dyn FnMut(usize) -> bool), line: &[u8], delim: u8) -> Vec<u32> {
        let mut out = Vec::new();
        scan(line, delim, &mut |p| {
            out.push(p as u32);
            true
        });
        out
    }

    fn check_all(line: &[u8], delim: u8) {
        let mut want = Vec::new();
        split_positions_scalar(line, delim, &mut want);
        let mut got = Vec::new();
        split_positions(line, delim, &mut got);
        assert_eq!(got, want, "split_positions");
        let mut got = Vec::new();
        split_positions_memchr(line, delim, &mut got);
        assert_eq!(got, want, "memchr");
        assert_eq!(positions_via(|l, d, f| scan_swar(l, d, f), line, delim), want, "swar");
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::detected(crate::cpu::Feature::Avx2) {
            // SAFETY: AVX2 is present, checked just above.
            let got = positions_via(|l, d, f| unsafe { scan_avx2(l, d, f) }, line, delim);
            assert_eq!(got, want, "avx2");
        }
        let tokens: Vec<&[u8]> = line.split(|b| *b == delim).collect();
        assert_eq!(tokens.len(), want.len() + 1);
        for max in [0, 1, 2, 3, tokens.len().saturating_sub(1), tokens.len(), tokens.len() + 1, usize::MAX] {
            let expect: Vec<&[u8]> = tokens.iter().take(max).copied().collect();
            let mut seen: Vec<&[u8]> = Vec::new();
            for_each_token(line, delim, max, |t| seen.push(t));
            assert_eq!(seen, expect, "for_each_token max {max}");
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            split_tokens_max(line, delim, max, &mut fast);
            split_tokens_max_scalar(line, delim, max, &mut slow);
            assert_eq!(fast, slow, "split_tokens_max max {max}");
            let ranged: Vec<&[u8]> = fast.iter().map(|&(s, e)| &line[s as usize..e as usize]).collect();
            assert_eq!(ranged, expect);
        }
    }

    #[test]
    fn edge_cases() {
        for delim in [b';', b',', b'\t', 0u8, 0xff] {
            check_all(b"", delim);
            check_all(&[delim], delim);
            check_all(&[delim; 100], delim);
            check_all(&[b'x'; 100], delim);
            for n in [31, 32, 33, 63, 64, 65] {
                let mut line = vec![b'a'; n];
                check_all(&line, delim);
                line[0] = delim;
                line[n - 1] = delim;
                check_all(&line, delim);
                line[n / 2] = delim;
                line[n / 2 + 1] = delim;
                check_all(&line, delim);
            }
        }
        // Blocks of 64 with 0..=64 delimiters each, appended to reused buffers.
        for n in [64, 127, 128, 129, 200, 256] {
            for every in 1..=9 {
                let line: Vec<u8> = (0..n).map(|i| if i % every == every - 1 { b';' } else { b'7' }).collect();
                check_all(&line, b';');
                let (mut fast, mut slow) = (vec![7u32; 3], vec![7u32; 3]);
                split_positions(&line, b';', &mut fast);
                split_positions_scalar(&line, b';', &mut slow);
                assert_eq!(fast, slow, "appends after what `out` held");
            }
        }
        check_all(b"a;b;;c;\r", b';');
        check_all(b";lead", b';');
        check_all(b"\x80\xff;\xc3\x28;", b';');
    }

    #[test]
    fn empty_and_delimiter_only_lines_match_slice_split() {
        let mut r = Vec::new();
        split_tokens_max(b"", b';', usize::MAX, &mut r);
        assert_eq!(r, vec![(0, 0)]);
        r.clear();
        split_tokens_max(b";;", b';', usize::MAX, &mut r);
        assert_eq!(r, vec![(0, 0), (1, 1), (2, 2)]);
    }

    #[test]
    fn very_long_lines() {
        let mut line = Vec::with_capacity(100_003);
        let mut x = 0x1234_5678_9abc_def0u64;
        while line.len() < 100_003 {
            x = crate::features::mix64(x);
            line.push(if x.is_multiple_of(7) { b';' } else { (x >> 8) as u8 });
        }
        check_all(&line, b';');
        check_all(&line, b'\r');
    }

    #[test]
    fn early_stop_leaves_the_rest_unscanned() {
        let mut calls = 0;
        scan_delims(b"a;b;c;d;e", b';', |_| {
            calls += 1;
            calls < 2
        });
        assert_eq!(calls, 2);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn fast_split_matches_scalar(line in line_strategy(b';', 300)) {
            check_all(&line, b';');
        }

        #[test]
        fn fast_split_matches_scalar_any_delim(delim in any::<u8>(), line in line_strategy(b',', 200)) {
            check_all(&line, delim);
        }
    }
}
