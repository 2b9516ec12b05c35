//! `tiderec bench features`: the sequence-feature kernels of
//! `tiderec_operators::features` against the unfused pipelines they replace,
//! and the field splitters, on generated elm-shaped lines and the Criteo sample.

use serde::Serialize;
use std::time::Instant;
use tiderec_operators::features::mix64;

/// Throughput of one kernel over one data set.
#[derive(Clone, Debug, Serialize)]
pub struct Throughput {
    /// Megabytes (10⁶ bytes) of input per second.
    pub mb_per_sec: f64,
    /// Records (pipelines) or fields (field splits) per second.
    pub records_per_sec: f64,
}

/// `tiderec bench features`, one data set: the fused sequence pipeline, the
/// unfused pipeline it replaces, and plain splitting.
#[derive(Clone, Debug, Serialize)]
pub struct FeaturePipelineResult {
    /// `elm`, `elm_y_long` or `criteo`.
    pub dataset: String,
    /// Records (lines) in the set.
    pub records: usize,
    /// Mean bytes per record.
    pub mean_record_bytes: f64,
    /// Fused: `split_hash_bucket` on every list column (`split_parse_reduce`
    /// mean on the numeric ones as well); Criteo: `split_hash_bucket` of the
    /// TAB-separated line.
    pub fused: Throughput,
    /// The same features unfused: UTF-8 validation, split into owned
    /// `String`s, then a hash pass, a bucket pass, a parse pass and a mean pass
    /// over materialised vectors (as a TensorFlow feature column runs).
    pub unfused: Throughput,
    /// Plain split with `str::split` after UTF-8 validation (token lengths summed).
    pub str_split: Throughput,
    /// The same plain split with `for_each_token` on bytes.
    pub token_split: Throughput,
    /// `fused / unfused` (records per second).
    pub fused_vs_unfused: f64,
    /// `token_split / str_split`.
    pub token_split_vs_str_split: f64,
}

/// `tiderec bench features`, one set of fields: delimiter positions of each field.
#[derive(Clone, Debug, Serialize)]
pub struct FieldSplitResult {
    /// Which fields: the `;` list columns of a data set, or Criteo lines split on TAB.
    pub fields: String,
    /// Number of fields.
    pub count: usize,
    /// Mean bytes per field.
    pub mean_field_bytes: f64,
    /// Mean delimiters per field.
    pub mean_delimiters: f64,
    /// `split_positions` (AVX2 where the CPU has it).
    pub simd: Throughput,
    /// `split_positions_scalar`: a plain byte loop.
    pub bytes: Throughput,
    /// `split_positions_memchr`: `memchr::memchr_iter`.
    pub memchr: Throughput,
    /// `simd / bytes`.
    pub simd_vs_bytes: f64,
    /// `simd / memchr`.
    pub simd_vs_memchr: f64,
}

/// Result of `tiderec bench features`.
#[derive(Clone, Debug, Serialize)]
pub struct FeaturesBenchResult {
    /// Whether the AVX2 split runs (the CPU has AVX2 and `TIDEREC_MAX_ISA` allows it).
    pub avx2: bool,
    /// Seconds per measurement (each kernel is measured twice, alternating).
    pub seconds: f64,
    /// The Criteo file used, if it was found.
    pub criteo_file: Option<String>,
    /// One entry per data set.
    pub pipelines: Vec<FeaturePipelineResult>,
    /// One entry per field set.
    pub field_splits: Vec<FieldSplitResult>,
}

/// Table rows of the sequence-feature benchmark.
const FEATURE_BUCKETS: u64 = 1 << 20;

/// Lines stored back to back, without terminators.
struct Lines {
    buf: Vec<u8>,
    ends: Vec<usize>,
}

impl Lines {
    fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(self.ends.iter().copied()).map(move |(s, e)| &self.buf[s..e])
    }
}

fn elm_lines(records: usize, list_scale: usize) -> Lines {
    let mut lines = Lines { buf: Vec::new(), ends: Vec::with_capacity(records) };
    for i in 0..records {
        tiderec_sources::elm::elm_line(11, i as u64, list_scale, &mut lines.buf);
        lines.ends.push(lines.buf.len());
    }
    lines
}

fn file_lines(bytes: &[u8]) -> Lines {
    let mut lines = Lines { buf: Vec::with_capacity(bytes.len()), ends: Vec::new() };
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        lines.buf.extend_from_slice(line);
        lines.ends.push(lines.buf.len());
    }
    lines
}

/// How a data set's records are featurised.
#[derive(Clone, Copy)]
enum Shape {
    /// Comma-separated elm columns; `;` lists.
    Elm,
    /// One TAB-separated list per line.
    Criteo,
}

/// The fused pipeline over one record; returns a checksum.
fn fused_record(shape: Shape, line: &[u8], seeds: &[u64], ids: &mut Vec<u64>) -> u64 {
    use tiderec_operators::features::fused::{split_hash_bucket, split_parse_reduce, Reduce};
    use tiderec_operators::features::split::for_each_token;
    use tiderec_sources::elm::{ELM_LIST_COLUMNS, ELM_NUMERIC_LIST_COLUMNS};
    ids.clear();
    let mut check = 0u64;
    match shape {
        Shape::Elm => {
            let mut c = 0usize;
            for_each_token(line, b',', usize::MAX, |field| {
                if ELM_LIST_COLUMNS.contains(&c) {
                    split_hash_bucket(field, b';', seeds[c], FEATURE_BUCKETS, usize::MAX, true, ids);
                    if ELM_NUMERIC_LIST_COLUMNS.contains(&c) {
                        let mean = split_parse_reduce(field, b';', Reduce::Mean, usize::MAX).expect("numeric list");
                        check = check.wrapping_add(mean.unwrap_or(0.0).to_bits() as u64);
                    }
                }
                c += 1;
            });
        }
        Shape::Criteo => split_hash_bucket(line, b'\t', seeds[0], FEATURE_BUCKETS, usize::MAX, true, ids),
    }
    ids.iter().fold(check, |a, &b| a.wrapping_mul(31).wrapping_add(b))
}

/// The unfused pipeline over one record (owned strings, one pass per op); the
/// same checksum as [`fused_record`].
fn unfused_record(shape: Shape, line: &[u8], seeds: &[u64]) -> u64 {
    use tiderec_operators::features::fused::{reduce_bucket, token_hash};
    use tiderec_sources::elm::{ELM_LIST_COLUMNS, ELM_NUMERIC_LIST_COLUMNS};
    let text = std::str::from_utf8(line).expect("UTF-8 record");
    let mut all_ids: Vec<u64> = Vec::new();
    let mut check = 0u64;
    let hash_list = |list: &str, seed: u64, delim: char, all_ids: &mut Vec<u64>| {
        let tokens: Vec<String> = list.split(delim).filter(|t| !t.is_empty()).map(String::from).collect();
        let hashes: Vec<u64> = tokens.iter().map(|t| token_hash(seed, t.as_bytes())).collect();
        let ids: Vec<u64> = hashes.iter().map(|&h| reduce_bucket(h, FEATURE_BUCKETS)).collect();
        all_ids.extend_from_slice(&ids);
    };
    match shape {
        Shape::Elm => {
            let columns: Vec<String> = text.split(',').map(String::from).collect();
            for &c in &ELM_LIST_COLUMNS {
                hash_list(&columns[c], seeds[c], ';', &mut all_ids);
                if ELM_NUMERIC_LIST_COLUMNS.contains(&c) {
                    let tokens: Vec<String> =
                        columns[c].split(';').filter(|t| !t.is_empty()).map(String::from).collect();
                    let values: Vec<f32> = tokens.iter().map(|t| t.parse::<f32>().expect("numeric list")).collect();
                    let sum: f64 = values.iter().map(|&v| v as f64).sum();
                    let mean = if values.is_empty() { 0.0 } else { (sum / values.len() as f64) as f32 };
                    check = check.wrapping_add(mean.to_bits() as u64);
                }
            }
        }
        Shape::Criteo => hash_list(text, seeds[0], '\t', &mut all_ids),
    }
    all_ids.iter().fold(check, |a, &b| a.wrapping_mul(31).wrapping_add(b))
}

/// Plain split with `str::split`: sums token lengths of the list columns.
fn str_split_record(shape: Shape, line: &[u8], is_list: &[bool]) -> u64 {
    let text = std::str::from_utf8(line).expect("UTF-8 record");
    let mut acc = 0u64;
    match shape {
        Shape::Elm => {
            for (c, col) in text.split(',').enumerate() {
                if is_list[c] {
                    for t in col.split(';') {
                        acc += t.len() as u64 + 1;
                    }
                }
            }
        }
        Shape::Criteo => {
            for t in text.split('\t') {
                acc += t.len() as u64 + 1;
            }
        }
    }
    acc
}

/// Plain split with [`for_each_token`](tiderec_operators::features::split::for_each_token); same result.
fn token_split_record(shape: Shape, line: &[u8], is_list: &[bool]) -> u64 {
    use tiderec_operators::features::split::for_each_token;
    let mut acc = 0u64;
    match shape {
        Shape::Elm => {
            let mut c = 0usize;
            for_each_token(line, b',', usize::MAX, |col| {
                if is_list[c] {
                    for_each_token(col, b';', usize::MAX, |t| acc += t.len() as u64 + 1);
                }
                c += 1;
            });
        }
        Shape::Criteo => for_each_token(line, b'\t', usize::MAX, |t| acc += t.len() as u64 + 1),
    }
    acc
}

/// Calls `pass` (one pass over the data set) until `seconds` have gone by (at
/// least twice); returns passes per second.
fn passes_per_sec(seconds: f64, mut pass: impl FnMut() -> u64) -> f64 {
    let mut passes = 0u64;
    let start = Instant::now();
    while passes < 2 || start.elapsed().as_secs_f64() < seconds {
        std::hint::black_box(pass());
        passes += 1;
    }
    passes as f64 / start.elapsed().as_secs_f64()
}

/// Measures every kernel of `kernels` twice, alternating, and returns the mean passes per second of each.
fn alternate(seconds: f64, kernels: &mut [&mut dyn FnMut() -> u64]) -> Vec<f64> {
    let mut rates = vec![0.0; kernels.len()];
    for _ in 0..2 {
        for (rate, kernel) in rates.iter_mut().zip(kernels.iter_mut()) {
            *rate += passes_per_sec(seconds, &mut **kernel) / 2.0;
        }
    }
    rates
}

fn throughput(passes_per_sec: f64, bytes: usize, records: usize) -> Throughput {
    Throughput { mb_per_sec: passes_per_sec * bytes as f64 / 1e6, records_per_sec: passes_per_sec * records as f64 }
}

fn bench_pipeline(name: &str, shape: Shape, lines: &Lines, seconds: f64) -> FeaturePipelineResult {
    let seeds: Vec<u64> = (0..64).map(|c| tiderec_operators::features::field_seed(5, c)).collect();
    let mut is_list = [false; 39];
    for &c in &tiderec_sources::elm::ELM_LIST_COLUMNS {
        is_list[c] = true;
    }
    let mut ids = Vec::new();
    // The two pipelines compute the same features, and the two splits the same tokens.
    for line in lines.iter() {
        assert_eq!(fused_record(shape, line, &seeds, &mut ids), unfused_record(shape, line, &seeds));
        assert_eq!(str_split_record(shape, line, &is_list), token_split_record(shape, line, &is_list));
    }
    let mut fused = || lines.iter().map(|l| fused_record(shape, l, &seeds, &mut ids)).fold(0, u64::wrapping_add);
    let mut unfused = || lines.iter().map(|l| unfused_record(shape, l, &seeds)).fold(0, u64::wrapping_add);
    let mut str_split = || lines.iter().map(|l| str_split_record(shape, l, &is_list)).sum::<u64>();
    let mut token_split = || lines.iter().map(|l| token_split_record(shape, l, &is_list)).sum::<u64>();
    let rates = alternate(seconds, &mut [&mut fused, &mut unfused, &mut str_split, &mut token_split]);
    let (bytes, records) = (lines.buf.len(), lines.ends.len());
    FeaturePipelineResult {
        dataset: name.to_string(),
        records,
        mean_record_bytes: bytes as f64 / records as f64,
        fused: throughput(rates[0], bytes, records),
        unfused: throughput(rates[1], bytes, records),
        str_split: throughput(rates[2], bytes, records),
        token_split: throughput(rates[3], bytes, records),
        fused_vs_unfused: rates[0] / rates[1],
        token_split_vs_str_split: rates[3] / rates[2],
    }
}

fn bench_field_split(name: &str, fields: &[&[u8]], delim: u8, seconds: f64) -> FieldSplitResult {
    use tiderec_operators::features::split::{split_positions, split_positions_memchr, split_positions_scalar};
    let bytes: usize = fields.iter().map(|f| f.len()).sum();
    let delimiters = fields.iter().map(|f| f.iter().filter(|b| **b == delim).count()).sum::<usize>();
    let (mut p1, mut p2, mut p3) = (Vec::new(), Vec::new(), Vec::new());
    assert_eq!(count_positions(fields, delim, split_positions, &mut p1), delimiters as u64);
    assert_eq!(count_positions(fields, delim, split_positions_memchr, &mut p1), delimiters as u64);
    let mut simd = || count_positions(fields, delim, split_positions, &mut p1);
    let mut plain = || count_positions(fields, delim, split_positions_scalar, &mut p2);
    let mut memchr = || count_positions(fields, delim, split_positions_memchr, &mut p3);
    let rates = alternate(seconds, &mut [&mut simd, &mut plain, &mut memchr]);
    let n = fields.len().max(1);
    FieldSplitResult {
        fields: name.to_string(),
        count: fields.len(),
        mean_field_bytes: bytes as f64 / n as f64,
        mean_delimiters: delimiters as f64 / n as f64,
        simd: throughput(rates[0], bytes, fields.len()),
        bytes: throughput(rates[1], bytes, fields.len()),
        memchr: throughput(rates[2], bytes, fields.len()),
        simd_vs_bytes: rates[0] / rates[1],
        simd_vs_memchr: rates[0] / rates[2],
    }
}

/// Splits every field with `split`, reusing `positions`; returns the delimiter count.
fn count_positions(fields: &[&[u8]], delim: u8, split: fn(&[u8], u8, &mut Vec<u32>), positions: &mut Vec<u32>) -> u64 {
    let mut count = 0u64;
    for f in fields {
        positions.clear();
        split(f, delim, positions);
        count += positions.len() as u64;
    }
    count
}

/// `lines` lines of `bytes` bytes made of 7-digit ids each followed by `;`
/// (8-byte fields, AtRec's split benchmark shape), from a fixed seed.
fn eight_byte_fields(lines: usize, bytes: usize) -> Vec<Vec<u8>> {
    (0..lines)
        .map(|l| {
            let mut line = Vec::with_capacity(bytes);
            for k in 0..bytes / 8 {
                let id = 1_000_000 + mix64((l * bytes + k) as u64) % 9_000_000;
                line.extend_from_slice(id.to_string().as_bytes());
                line.push(b';');
            }
            line
        })
        .collect()
}

/// The `;` list columns of elm-shaped lines.
fn list_fields(lines: &Lines) -> Vec<&[u8]> {
    use tiderec_operators::features::split::for_each_token;
    let mut fields = Vec::new();
    for line in lines.iter() {
        let mut c = 0usize;
        for_each_token(line, b',', usize::MAX, |field| {
            if tiderec_sources::elm::ELM_LIST_COLUMNS.contains(&c) {
                fields.push(field);
            }
            c += 1;
        });
    }
    fields
}

/// `tiderec bench features`: sequence-feature kernels on elm-shaped lines
/// (4,000 records, histories up to 50 items), elm_y_long lines (600 records,
/// up to 400 items) and, when `criteo` exists, Criteo TSV lines. See
/// [`FeaturesBenchResult`] for what is measured.
pub fn run_features(seconds: f64, criteo: &std::path::Path) -> FeaturesBenchResult {
    let elm = elm_lines(4_000, 1);
    let elm_long = elm_lines(600, 8);
    let criteo_lines = std::fs::read(criteo).ok().map(|b| file_lines(&b));
    let mut pipelines = vec![
        bench_pipeline("elm", Shape::Elm, &elm, seconds),
        bench_pipeline("elm_y_long", Shape::Elm, &elm_long, seconds),
    ];
    let elm_fields = list_fields(&elm);
    let short: Vec<&[u8]> = elm_fields.iter().copied().filter(|f| f.len() <= 64).collect();
    let long_fields = list_fields(&elm_long);
    let eight = eight_byte_fields(256, 4096);
    let mut field_splits = vec![
        bench_field_split("elm lists", &elm_fields, b';', seconds),
        bench_field_split("elm lists <= 64 B", &short, b';', seconds),
        bench_field_split("elm_y_long lists", &long_fields, b';', seconds),
        bench_field_split(
            "8-byte fields, 4 KiB lines",
            &eight.iter().map(Vec::as_slice).collect::<Vec<_>>(),
            b';',
            seconds,
        ),
    ];
    if let Some(lines) = &criteo_lines {
        pipelines.push(bench_pipeline("criteo", Shape::Criteo, lines, seconds));
        let all: Vec<&[u8]> = lines.iter().collect();
        field_splits.push(bench_field_split("criteo lines (TAB)", &all, b'\t', seconds));
    }
    FeaturesBenchResult {
        avx2: tiderec_operators::cpu::has(tiderec_operators::cpu::Feature::Avx2),
        seconds,
        criteo_file: criteo_lines.map(|_| criteo.display().to_string()),
        pipelines,
        field_splits,
    }
}
