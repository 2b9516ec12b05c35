//! A deterministic, seeded byte mutator for line-oriented and binary inputs.
//!
//! Every mutation is a pure function of the input, the corpus and the
//! generator state, so a run is reproducible from its seed. The operators
//! are the ones that break record readers: bit flips and byte changes,
//! insertions and deletions, duplicated ranges, lines spliced in from other
//! seeds, injected delimiters (TAB, comma, `;`, `^`, `\x02`), CRLF, quotes
//! and NUL bytes, truncation, field values replaced by edge-case tokens
//! (huge integers, `inf`, `nan`, exponents, empty, signs, JSON fragments),
//! very long lines (longer than the readers' 64 KiB line limit), and blocks
//! of lines repeated hundreds of times.

/// Largest input the mutator produces.
pub const MAX_INPUT: usize = 512 * 1024;

/// splitmix64: a small, fast, seedable generator (no dependency, stable output).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// Tokens that exercise number parsers and field splitters.
const TOKENS: &[&[u8]] = &[
    b"",
    b"0",
    b"1",
    b"-1",
    b"2",
    b"inf",
    b"-inf",
    b"+inf",
    b"Infinity",
    b"nan",
    b"NaN",
    b"-nan",
    b"1e309",
    b"-1e309",
    b"1e-320",
    b"3.4028236e38",
    b"9223372036854775807",
    b"9223372036854775808",
    b"-9223372036854775808",
    b"-9223372036854775809",
    b"18446744073709551615",
    b"18446744073709551616",
    b"99999999999999999999999999999999999999",
    b"0x1f",
    b"ffffffffffffffff",
    b"fffffffffffffffff",
    b"00000000",
    b"1.5",
    b".",
    b"-",
    b"+",
    b"e",
    b"1e",
    b"null",
    b"true",
    b"\"\"",
    b"\"",
    b"{}",
    b"[]",
    b"{\"label\":1}",
    b"\\u0000",
    b"\xff\xfe",
    b"\xc3\x28",
    b"pv",
    b"\x00",
];

/// Bytes that split fields and lines.
const DELIMITERS: &[&[u8]] = &[b"\t", b",", b";", b"^", b"\x02", b"\n", b"\r\n", b"\r", b"\"", b"\0", b":", b" ", b"|"];

/// Whether `b` separates fields in one of the formats.
fn is_separator(b: u8) -> bool {
    matches!(b, b'\t' | b',' | b';' | b'^' | 0x02 | b'\n' | b'\r' | b':' | b'"' | b'{' | b'}' | b'[' | b']')
}

/// A random position in `0..=len`.
fn pos(rng: &mut Rng, len: usize) -> usize {
    rng.below(len + 1)
}

/// The line of `data` around byte `at`: `(start, end)` without its `\n`.
fn line_around(data: &[u8], at: usize) -> (usize, usize) {
    let at = at.min(data.len());
    let start = data[..at].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let end = data[at..].iter().position(|&b| b == b'\n').map_or(data.len(), |i| at + i);
    (start, end)
}

/// The field of `data` around byte `at`: the bytes between the nearest separators.
fn field_around(data: &[u8], at: usize) -> (usize, usize) {
    let at = at.min(data.len());
    let start = data[..at].iter().rposition(|&b| is_separator(b)).map_or(0, |i| i + 1);
    let end = data[at..].iter().position(|&b| is_separator(b)).map_or(data.len(), |i| at + i);
    (start, end)
}

/// A random whole line of a random seed of `corpus` (with its `\n`), if any.
fn random_line<'a>(rng: &mut Rng, corpus: &'a [Vec<u8>]) -> Option<&'a [u8]> {
    let seed = corpus.get(rng.below(corpus.len().max(1)))?;
    if seed.is_empty() {
        return None;
    }
    let (s, e) = line_around(seed, rng.below(seed.len()));
    Some(&seed[s..(e + 1).min(seed.len())])
}

/// Applies one random mutation to `data`.
pub fn mutate_once(rng: &mut Rng, data: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    let len = data.len();
    match rng.below(16) {
        // Flip one bit.
        0 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        // Set one byte to a random or an interesting value.
        1 if len > 0 => {
            let i = rng.below(len);
            data[i] = match rng.below(4) {
                0 => 0,
                1 => 0xFF,
                2 => b"\t,;^\x02\n\r\"\\{}[]:0189-.e"[rng.below(21)],
                _ => rng.next_u64() as u8,
            };
        }
        // Insert random bytes.
        2 => {
            let at = pos(rng, len);
            let n = 1 + rng.below(8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            data.splice(at..at, bytes);
        }
        // Delete a range.
        3 if len > 0 => {
            let at = rng.below(len);
            let cap = if rng.one_in(4) { len } else { 16 };
            let n = 1 + rng.below((len - at).min(cap));
            data.drain(at..at + n);
        }
        // Duplicate a range in place.
        4 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(64));
            let copy = data[at..at + n].to_vec();
            let to = pos(rng, len);
            data.splice(to..to, copy);
        }
        // Splice a line of another seed in at a line start.
        5 => {
            if let Some(line) = random_line(rng, corpus) {
                let line = line.to_vec();
                let (start, _) = line_around(data, pos(rng, len));
                data.splice(start..start, line);
            }
        }
        // Replace this input's tail from a line start by another seed's lines.
        6 => {
            if let Some(other) = corpus.get(rng.below(corpus.len().max(1))) {
                let (start, _) = line_around(data, pos(rng, len));
                let (from, _) = line_around(other, pos(rng, other.len()));
                data.truncate(start);
                data.extend_from_slice(&other[from..]);
            }
        }
        // Inject a delimiter, a line end, a quote or a NUL.
        7 => {
            let at = pos(rng, len);
            let d = DELIMITERS[rng.below(DELIMITERS.len())];
            data.splice(at..at, d.iter().copied());
        }
        // Replace a field by an edge-case token.
        8 | 9 => {
            let (s, e) = field_around(data, pos(rng, len));
            let t = TOKENS[rng.below(TOKENS.len())];
            data.splice(s..e, t.iter().copied());
        }
        // Truncate.
        10 if len > 0 => data.truncate(rng.below(len)),
        // LF → CRLF or CRLF → LF everywhere.
        11 => {
            if data.contains(&b'\r') {
                data.retain(|&b| b != b'\r');
            } else {
                let mut out = Vec::with_capacity(len + len / 32);
                for &b in data.iter() {
                    if b == b'\n' {
                        out.push(b'\r');
                    }
                    out.push(b);
                }
                *data = out;
            }
        }
        // A very long run of one byte (a field or a whole line beyond the line limit).
        12 => {
            let at = pos(rng, len);
            let n = match rng.below(3) {
                0 => 1 + rng.below(300),
                1 => 4000 + rng.below(200),
                _ => 65_536 + rng.below(16),
            };
            let b = b"0aF9,\t\x02;^ \""[rng.below(11)];
            data.splice(at..at, std::iter::repeat_n(b, n));
        }
        // Swap two lines.
        13 if len > 0 => {
            let (a0, a1) = line_around(data, rng.below(len));
            let (b0, b1) = line_around(data, rng.below(len));
            if a1 < b0 {
                let (x, y) = (data[a0..a1].to_vec(), data[b0..b1].to_vec());
                data.splice(b0..b1, x);
                data.splice(a0..a1, y);
            }
        }
        // Replace one digit run, chosen uniformly, by an extreme number.
        14 => {
            let runs: Vec<(usize, usize)> = {
                let mut runs = Vec::new();
                let mut i = 0;
                while i < len {
                    if data[i].is_ascii_digit() {
                        let s = i;
                        while i < len && data[i].is_ascii_digit() {
                            i += 1;
                        }
                        runs.push((s, i));
                    }
                    i += 1;
                }
                runs
            };
            if !runs.is_empty() {
                let (s, e) = runs[rng.below(runs.len())];
                let big: &[u8] = match rng.below(7) {
                    0 => b"18446744073709551615",
                    1 => b"18446744073709551616",
                    2 => b"4294967296",
                    3 => b"9223372036854775807",
                    4 => b"1099511627776",
                    5 => b"0",
                    _ => b"340282366920938463463374607431768211456",
                };
                data.splice(s..e, big.iter().copied());
            }
        }
        // Repeat a block of whole lines many times (a table of a TOML spec, a record).
        15 if len > 0 && rng.one_in(2) => {
            let (start, mut end) = line_around(data, rng.below(len));
            for _ in 0..rng.below(6) {
                end = line_around(data, (end + 1).min(len)).1;
            }
            let block = data[start..(end + 1).min(len)].to_vec();
            let times = if rng.one_in(2) { 2 + rng.below(8) } else { 200 + rng.below(120) };
            if block.len().saturating_mul(times) < MAX_INPUT {
                let copies: Vec<u8> = block.iter().copied().cycle().take(block.len() * times).collect();
                data.splice(start..start, copies);
            }
        }
        // Overwrite a little-endian 4 or 8 byte word with an extreme value (binary formats).
        _ if len >= 8 => {
            let i = rng.below(len - 7);
            let v: u64 = match rng.below(5) {
                0 => u64::MAX,
                1 => u64::MAX / 2 + 1,
                2 => 0,
                3 => u32::MAX as u64,
                _ => rng.next_u64() >> rng.below(64),
            };
            if rng.one_in(2) {
                data[i..i + 8].copy_from_slice(&v.to_le_bytes());
            } else {
                data[i..i + 4].copy_from_slice(&(v as u32).to_le_bytes());
            }
        }
        _ => {
            let at = pos(rng, len);
            data.insert(at, rng.next_u64() as u8);
        }
    }
    data.truncate(MAX_INPUT);
}

/// A mutant of `base`: one to five stacked mutations.
pub fn mutate(rng: &mut Rng, base: &[u8], corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut data = base.to_vec();
    let n = 1 + rng.below(5);
    for _ in 0..n {
        mutate_once(rng, &mut data, corpus);
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_mutants() {
        let corpus = vec![b"1\t2\t3\n0\t4\t5\n".to_vec(), b"a,b,c\r\n".to_vec()];
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..200).map(|i| mutate(&mut rng, &corpus[i % 2], &corpus)).collect::<Vec<_>>()
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
        assert!(run(5).iter().any(|m| m != &corpus[0] && m != &corpus[1]));
        assert!(run(5).iter().all(|m| m.len() <= MAX_INPUT));
    }
}
