//! `scripts/benchmarks.py`, the generator of `docs/benchmarks.md`, against
//! this build's release binary: a `--quick` run of one cheap section writes the
//! machine header and a table whose ratio column holds a finite number, and a
//! section that fails is written with its error and makes the script exit 1.

mod common;

use common::skip;
use std::path::PathBuf;
use std::process::{Command, Output};

fn python3() -> Option<Command> {
    match Command::new("python3").arg("--version").output() {
        Ok(o) if o.status.success() => Some(Command::new("python3")),
        _ => {
            skip::cannot_run("python3 not found");
            None
        }
    }
}

fn binary() -> PathBuf {
    std::env::var_os("TIDEREC_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tiderec")), PathBuf::from)
}

/// Runs the script with `args` writing `out`; returns its output and the written document.
fn generate(args: &[&str], out: &std::path::Path) -> Option<(Output, String)> {
    let mut py = python3()?;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/benchmarks.py");
    let output = py
        .arg(script)
        .args(["--quick", "--tiderec"])
        .arg(binary())
        .args(args)
        .arg("--output")
        .arg(out)
        .output()
        .expect("python3 starts");
    let doc = std::fs::read_to_string(out).unwrap_or_else(|e| {
        panic!("{} not written ({e}); stderr: {}", out.display(), String::from_utf8_lossy(&output.stderr))
    });
    Some((output, doc))
}

/// The cells of the first data row of the table whose header contains `column`.
fn first_row<'a>(doc: &'a str, column: &str) -> (Vec<&'a str>, Vec<&'a str>) {
    let (header, mut rows) = table_rows(doc, column);
    assert!(!rows.is_empty(), "the table with a `{column}` column has no rows:\n{doc}");
    (header, rows.swap_remove(0))
}

#[test]
fn a_quick_section_writes_the_machine_header_and_a_finite_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("benchmarks.md");
    let Some((run, doc)) = generate(&["--only", "gru"], &out) else { return };
    assert!(run.status.success(), "exit {:?}; stderr: {}\n{doc}", run.status, String::from_utf8_lossy(&run.stderr));

    // The machine header: the CPU model of /proc/cpuinfo with its family and model
    // numbers, the extensions, the kernels chosen.
    assert!(doc.starts_with("# Benchmarks\n"), "{doc}");
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo.lines().find_map(|l| l.split_once(':').filter(|(k, _)| k.trim() == name).map(|(_, v)| v.trim()))
    };
    if let (Some(name), Some(family), Some(model)) = (field("model name"), field("cpu family"), field("model")) {
        let cpu = format!("{name} (family {family}, model {model})");
        assert!(doc.contains(&format!("| CPU | {cpu}, ")), "CPU `{cpu}` missing from the header:\n{doc}");
    }
    for row in ["| vector extensions | avx2 ", "| tiderec | ", "| load average (1 min) | ", "| rounds | 1"] {
        assert!(doc.contains(row), "`{row}` missing from the header:\n{doc}");
    }
    let (header, kernels) = first_row(&doc, "128 rows: forward");
    assert_eq!(header.len(), kernels.len());
    assert_eq!(kernels[0], "13→512", "{doc}");
    assert!(kernels[1..].iter().all(|k| !k.is_empty()), "a product without a chosen kernel: {kernels:?}");
    // The first layer reads the dense values: its dx is never computed, at either size.
    assert_eq!([kernels[3], kernels[6]], ["not computed"; 2], "{kernels:?}");

    // The section: prose, then the table with the ratio column holding a finite number.
    assert!(doc.contains("## GRU: split cell against the unsplit one"), "{doc}");
    let ratio = first_ratio(&doc, "split / unsplit");
    assert!(ratio.is_finite() && ratio > 0.0, "{ratio}");
    assert!(!doc.contains("Not measured"), "{doc}");
}

/// The number in column `column` (a ratio such as `**1.31×**`) of the first row of its table.
fn first_ratio(doc: &str, column: &str) -> f64 {
    let (header, row) = first_row(doc, column);
    let col = header.iter().position(|h| h.starts_with(column)).unwrap();
    row[col]
        .trim_matches('*')
        .trim_end_matches('×')
        .parse()
        .unwrap_or_else(|_| panic!("ratio cell `{}` is not a number: {row:?}", row[col]))
}

/// The stores' section: `tiderec bench cache` checks that the tiered and the
/// hash store end with the same rows, then reports their speed ratio.
#[test]
fn the_store_section_compares_the_tiered_store_with_the_hash_store() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("benchmarks.md");
    let Some((run, doc)) = generate(&["--only", "cache"], &out) else { return };
    assert!(run.status.success(), "exit {:?}; stderr: {}\n{doc}", run.status, String::from_utf8_lossy(&run.stderr));
    let ratio = first_ratio(&doc, "tiered / hash");
    assert!(ratio.is_finite() && ratio > 0.0, "{ratio}");
    let (_, row) = first_row(&doc, "hot-tier hit ratio");
    let hit: f64 = row[1].trim_end_matches('%').parse().unwrap();
    assert!((0.0..=100.0).contains(&hit), "{row:?}");
}

#[test]
fn a_failing_section_is_written_with_its_error_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("benchmarks.md");
    let missing = dir.path().join("no-such-criteo.tsv");
    let Some((run, doc)) = generate(&["--only", "features", "--criteo", missing.to_str().unwrap()], &out) else {
        return;
    };
    assert_eq!(run.status.code(), Some(1), "stderr: {}\n{doc}", String::from_utf8_lossy(&run.stderr));
    assert!(doc.contains("## Feature kernels\n\n**Not measured: this section failed.**"), "{doc}");
    assert!(doc.contains(&format!("{} not found", missing.display())), "the error names the file:\n{doc}");
    assert!(doc.contains("## Machine and build"), "{doc}");
}

/// The AVX2 comparison against an older build, here this same binary as the
/// baseline: every row runs both under `TIDEREC_MAX_ISA=avx2` and holds a
/// finite ratio; the section checks that this build reported the cap.
#[test]
fn the_avx2_section_compares_two_binaries_under_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("benchmarks.md");
    let bin = binary();
    let Some((run, doc)) = generate(&["--only", "avx2", "--baseline-bin", bin.to_str().unwrap()], &out) else {
        return;
    };
    assert!(run.status.success(), "exit {:?}; stderr: {}\n{doc}", run.status, String::from_utf8_lossy(&run.stderr));
    assert!(doc.contains("## AVX2-only kernels against the build before runtime kernel selection"), "{doc}");
    let ratio = first_ratio(&doc, "this / before");
    assert!(ratio.is_finite() && ratio > 0.0, "{ratio}");
    let rows = doc.lines().filter(|l| l.starts_with("| D")).count();
    assert_eq!(rows, 4, "DLRM at 128 and 2,048, DeepFM, DIEN:\n{doc}");
}

/// Asking for `section` by name without the binary it compares with is
/// refused with a usage error naming the flag.
fn assert_refused_without(section: &str, flag: &str) {
    let Some(mut py) = python3() else { return };
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/benchmarks.py");
    let out = py.arg(script).args(["--only", section]).output().expect("python3 starts");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("section {section} needs {flag}")));
}

/// Without `--baseline-bin` the section is refused when asked for by name.
#[test]
fn the_avx2_section_needs_a_baseline_binary() {
    assert_refused_without("avx2", "--baseline-bin");
}

/// `section`, a comparison with the older build `flag` names, run against this
/// same binary (`None` where it cannot run); it must exit 0.
fn against_this_binary(section: &str, flag: &str) -> Option<String> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("benchmarks.md");
    let bin = binary();
    let (run, doc) = generate(&["--only", section, flag, bin.to_str().unwrap()], &out)?;
    assert!(run.status.success(), "exit {:?}; stderr: {}\n{doc}", run.status, String::from_utf8_lossy(&run.stderr));
    Some(doc)
}

/// The GEMM-bound table (found by its `column`): one row per batch, 128 and
/// 2,048, each with two positive shares and a finite ratio.
fn assert_gemm_bound_rows(doc: &str, column: &str) {
    let (_, rows) = table_rows(doc, column);
    assert_eq!(rows.len(), 2, "batches 128 and 2,048:\n{doc}");
    for row in &rows {
        for share in [number(row[1]), number(row[2])] {
            assert!(share.is_finite() && share > 0.0, "a GEMM bound share that is no share: {row:?}");
        }
        let ratio = number(row[5]);
        assert!(ratio.is_finite() && ratio > 0.0, "{row:?}");
    }
}

/// The fp32 comparison against an older build, here this same binary: both
/// batches hold a finite ratio and GEMM bounds given as shares of the FMA peak
/// (positive; a `--quick` run under the test suite's load measures the peak
/// too briefly to bound them by 100%), and the product table gives each wide
/// product at both batches with each build's kernel and a finite ratio.
#[test]
fn the_fp32_section_compares_the_gemm_bound_with_the_fma_peak() {
    let Some(doc) = against_this_binary("fp32", "--previous-bin") else { return };
    assert!(doc.contains("## fp32 kernels on AVX-512 against the build before them"), "{doc}");
    assert_gemm_bound_rows(&doc, "share of the widest FMA peak");
    assert_product_rows(&doc, "dW");
}

/// The AVX2 fp32 comparison against an older build, here this same binary, both
/// under `TIDEREC_MAX_ISA=avx2` (the section checks that the cap was in force):
/// both batches hold GEMM-bound shares and a finite ratio, and the product
/// table gives each wide product at both batches with each build's kernel and
/// a finite ratio.
#[test]
fn the_fp32_avx2_section_compares_both_builds_under_the_cap() {
    let Some(doc) = against_this_binary("fp32-avx2", "--previous-bin") else { return };
    assert!(doc.contains("## fp32 kernels on AVX2 against the build before them"), "{doc}");
    assert_gemm_bound_rows(&doc, "share of the AVX2 FMA peak");
    assert_product_rows(&doc, "forward");
}

/// Everything since the wide kernel, against this same binary: the GEMM-bound
/// and per-product tables of the fp32 comparison, then DeepFM and DIEN in fp32
/// and DLRM in bf16, each with a finite ratio; the bf16 row also gives bf16
/// against fp32, or says it was not run where the CPU has no bf16 products.
#[test]
fn the_since_wide_section_compares_every_model_with_the_build_before_the_wide_kernel() {
    let Some(doc) = against_this_binary("since-wide", "--before-wide-bin") else { return };
    assert!(doc.contains("## This CPU against the build before the kernels for two-FMA-port cores"), "{doc}");
    assert_gemm_bound_rows(&doc, "share of the widest FMA peak");
    assert_product_rows(&doc, "forward");
    let (header, rows) = table_rows(&doc, "build before the wide kernel (baseline)");
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no `{name}`: {header:?}"));
    let models: Vec<(&str, &str)> = rows.iter().map(|r| (r[0], r[col("precision")])).collect();
    assert_eq!(models, [("DeepFM", "fp32"), ("DIEN", "fp32"), ("DLRM", "bf16")], "{doc}");
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has_bf16 = flags.contains(" avx512_bf16") || flags.contains(" amx_bf16");
    for row in &rows {
        let vs_fp32 = row[col("this build: bf16 / fp32, same rounds (per round)")];
        if row[1] == "bf16" && !has_bf16 {
            assert!(row[col("this build: samples/s (median)")].starts_with("not run"), "{row:?}");
            continue;
        }
        let ratio = number(row[col("this / before")]);
        assert!(ratio.is_finite() && ratio > 0.0, "{row:?}");
        if row[1] == "bf16" {
            let bf16_vs_fp32 = number(vs_fp32.split(' ').next().unwrap());
            assert!(bf16_vs_fp32.is_finite() && bf16_vs_fp32 > 0.0, "{row:?}");
        } else {
            assert!(vs_fp32.is_empty(), "{row:?}");
        }
    }
}

/// Without `--before-wide-bin` the section is refused when asked for by name.
#[test]
fn the_since_wide_section_needs_the_build_before_the_wide_kernel() {
    assert_refused_without("since-wide", "--before-wide-bin");
}

/// The per-product table of a comparison with an older build: `product` of the
/// 512→256 layer at both batches, and every row with each build's kernel and a
/// finite ratio.
fn assert_product_rows(doc: &str, product: &str) {
    let (_, products) = table_rows(doc, "build before: kernel");
    for batch in ["128", "2,048"] {
        let at = |r: &&Vec<&str>| r[0] == batch && r[1] == product && r[2] == "512->256";
        assert!(products.iter().any(|r| at(&r)), "no {product} 512->256 at {batch} rows:\n{doc}");
    }
    for row in &products {
        assert!(row[4].starts_with('`') && row[7].starts_with('`'), "{row:?}");
        let ratio = number(row[10]);
        assert!(ratio.is_finite() && ratio > 0.0, "{row:?}");
    }
}

/// The GEMM-bound section: tiderec's bound against NumPy's BLAS and, where
/// python3 has torch (the test command installs it), against PyTorch's BLAS at
/// 2,048 and 128 rows with a finite ratio each, PyTorch's bound as a share of
/// the FMA peak, and a product table per batch whose every product with a
/// PyTorch figure has a positive one and a finite ratio, the wide 512→256
/// forward among them. Without torch the section runs without those rows.
#[test]
fn the_gemm_section_compares_each_product_with_pytorchs_blas() {
    let has_torch = Command::new("python3").args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("benchmarks.md");
    let Some((run, doc)) = generate(&["--only", "gemm"], &out) else { return };
    assert!(run.status.success(), "exit {:?}; stderr: {}\n{doc}", run.status, String::from_utf8_lossy(&run.stderr));
    assert!(doc.contains("## The fp32 GEMM bound at batch 2,048"), "{doc}");
    let (_, bound) = table_rows(&doc, "baseline, same rounds");
    // The fp32 MLPs chained, against the products one by one, and training against them.
    for what in ["The MLPs in fp32, layers chained", "DLRM training"] {
        let row = bound
            .iter()
            .find(|r| r[0].starts_with(what) && (r[3].starts_with("the fp32") || r[3].contains("chained")))
            .unwrap_or_else(|| panic!("no `{what}` row against the chained MLPs or the products:\n{doc}"));
        let share = number(row[4].split_whitespace().next().unwrap_or_default());
        assert!(share.is_finite() && share > 0.0, "{row:?}");
    }
    let against_torch: Vec<&Vec<&str>> = bound.iter().filter(|r| r[3].contains("`torch.matmul`, one thread")).collect();
    if !has_torch {
        assert!(against_torch.is_empty() && !doc.contains("PyTorch GFLOP/s"), "{doc}");
        return;
    }
    assert_eq!(against_torch.len(), 2, "2,048 and 128 rows:\n{doc}");
    let torch_share = bound.iter().find(|r| r[0].starts_with("PyTorch's GEMM bound"));
    for row in against_torch.into_iter().chain(torch_share) {
        // `**1.02×**`, or `**67%** of the peak`.
        let ratio = number(row[4].split_whitespace().next().unwrap_or_default());
        assert!(ratio.is_finite() && ratio > 0.0, "{row:?}");
    }
    assert!(torch_share.is_some(), "no share of the FMA peak for PyTorch's bound:\n{doc}");
    let tables: Vec<&str> =
        doc.split("\n\n").filter(|t| t.starts_with("| product |") && t.contains("PyTorch GFLOP/s")).collect();
    assert_eq!(tables.len(), 2, "a product table at 2,048 and at 128 rows:\n{doc}");
    for (table, rows) in tables.iter().zip(["2048", "128"]) {
        let (header, products) = table_rows(table, "PyTorch GFLOP/s");
        let col =
            |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no `{name}`: {header:?}"));
        let (theirs, ours) = (col("PyTorch GFLOP/s (baseline)"), col("chosen / PyTorch"));
        assert!(
            products.iter().any(|r| r[0] == "forward" && r[1] == "512→256" && r[2] == format!("{rows}x256x512")),
            "no forward 512→256 at {rows} rows:\n{table}"
        );
        for row in products.iter().filter(|r| r[theirs] != "n/a") {
            assert!(number(row[theirs]) > 0.0 && number(row[ours]).is_finite() && number(row[ours]) > 0.0, "{row:?}");
        }
    }
}

/// Without `--previous-bin` the section is refused when asked for by name.
#[test]
fn the_fp32_avx2_section_needs_a_previous_binary() {
    assert_refused_without("fp32-avx2", "--previous-bin");
}

/// `--splice` rewrites the sections it runs in an existing document and leaves
/// every other line as it was; a section the document lacks is appended.
#[test]
fn splice_replaces_only_the_sections_it_runs() {
    let Some(mut py) = python3() else { return };
    let dir = tempfile::tempdir().unwrap();
    let doc = dir.path().join("benchmarks.md");
    let before = "# Benchmarks\n\nintro line\n\n## GRU: split cell against the unsplit one\n\nan old figure\n\n\
                  ## Another section\n\nkept as it is\n";
    std::fs::write(&doc, before).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/benchmarks.py");
    let run = py
        .arg(script)
        .args(["--quick", "--tiderec"])
        .arg(binary())
        .args(["--only", "gru", "--splice"])
        .arg(&doc)
        .output()
        .expect("python3 starts");
    assert!(run.status.success(), "stderr: {}", String::from_utf8_lossy(&run.stderr));
    let after = std::fs::read_to_string(&doc).unwrap();
    assert!(after.starts_with("# Benchmarks\n\nintro line\n\n## GRU: split cell against the unsplit one\n"), "{after}");
    assert!(!after.contains("an old figure"), "{after}");
    assert!(after.ends_with("## Another section\n\nkept as it is\n"), "{after}");
    assert!(!after.contains("## Machine and build"), "a splice writes no header:\n{after}");
    let ratio = first_ratio(&after, "split / unsplit");
    assert!(ratio.is_finite() && ratio > 0.0, "{ratio}");
}

/// Every data row of the table whose header contains `column`: its header cells and its rows' cells.
fn table_rows<'a>(doc: &'a str, column: &str) -> (Vec<&'a str>, Vec<Vec<&'a str>>) {
    let lines: Vec<&str> = doc.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with('|') && l.contains(column))
        .unwrap_or_else(|| panic!("no table with a `{column}` column:\n{doc}"));
    let cells = |l: &'a str| l.trim().trim_matches('|').split('|').map(str::trim).collect::<Vec<_>>();
    let rows = lines[at + 2..].iter().take_while(|l| l.starts_with('|')).map(|l| cells(l)).collect();
    (cells(lines[at]), rows)
}

/// A cell such as `**1.31×**`, `1,024`, `87%` or `12.5` as a number.
fn number(cell: &str) -> f64 {
    let bare = cell.trim_matches('*').trim_end_matches(['×', '%']).replace(',', "");
    bare.parse().unwrap_or_else(|_| panic!("`{cell}` is not a number"))
}

/// The scaling section: for W = 1 and 2, both series, tiderec's and PyTorch's samples/s,
/// speed-up over W = 1 and efficiency (speed-up / W), and the stage breakdown of
/// tiderec's steps from `bench dlrm --json`'s stage clock. Where python3 has no torch
/// (the test command installs it; a user's machine may not have it), the section still
/// runs tiderec and the independent trainers and its PyTorch cells say that PyTorch was
/// not run; with torch they hold its figures.
#[test]
fn the_scaling_section_reports_speed_up_efficiency_and_the_stage_breakdown() {
    let has_torch = Command::new("python3").args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("benchmarks.md");
    let Some((run, doc)) = generate(&["--only", "scaling", "--max-workers", "2"], &out) else { return };
    assert!(run.status.success(), "exit {:?}; stderr: {}\n{doc}", run.status, String::from_utf8_lossy(&run.stderr));
    assert!(doc.contains("## Scaling: W workers against PyTorch with W threads"), "{doc}");
    // The section names its CPU and rounds: it may be spliced in from a larger machine.
    let scripts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts");
    let cpu = Command::new("python3")
        .args(["-c", "import bench_vs_torch; print(bench_vs_torch.cpu_model())"])
        .current_dir(scripts)
        .output()
        .expect("python3 starts");
    let cpu = String::from_utf8_lossy(&cpu.stdout);
    assert!(doc.contains(&format!("Measured on {}, ", cpu.trim())), "the CPU `{cpu}` is not named:\n{doc}");
    assert!(doc.contains("; 1 alternated round, "), "the round count is not named:\n{doc}");

    let (header, rows) = table_rows(&doc, "tiderec efficiency");
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no `{name}`: {header:?}"));
    assert_eq!(rows.len(), 4, "two series × W = 1, 2:\n{doc}");
    let expected =
        [("(a)", 1, 2048.0, 2048.0), ("(a)", 2, 2048.0, 1024.0), ("(b)", 1, 512.0, 512.0), ("(b)", 2, 1024.0, 512.0)];
    for (row, (series, w, global, micro)) in rows.iter().zip(expected) {
        assert!(row[0].starts_with(series), "{row:?}");
        assert_eq!(number(row[col("W = workers = threads")].split(' ').next().unwrap()), w as f64, "{row:?}");
        assert_eq!(number(row[col("global batch")]), global, "{row:?}");
        assert_eq!(number(row[col("per-worker batch")]), micro, "{row:?}");
        let sides: &[&str] = if has_torch { &["tiderec", "PyTorch"] } else { &["tiderec"] };
        for side in sides {
            let samples = number(row[col(&format!("{side} samples/s (median)"))]);
            let speedup = number(row[col(&format!("{side} speed-up"))]);
            let efficiency = number(row[col(&format!("{side} efficiency"))]);
            assert!(samples > 0.0, "{row:?}");
            if w == 1 {
                assert_eq!((speedup, efficiency), (1.0, 100.0), "{side}: W = 1 is its own baseline: {row:?}");
            }
            // Efficiency is speed-up / W (both cells rounded).
            assert!((efficiency - 100.0 * speedup / w as f64).abs() <= 1.0, "{side}: {row:?}");
        }
        // The machine's ceiling: W independent trainers against W × W = 1, and tiderec against them.
        if w > 1 {
            let free = number(row[col("W independent trainers, samples/s")]);
            let tide = number(row[col("tiderec samples/s (median)")]);
            let base =
                number(rows.iter().find(|r| r[0].starts_with(series)).unwrap()[col("tiderec samples/s (median)")]);
            let machine = number(row[col("machine efficiency")]);
            assert!(free > 0.0, "{row:?}");
            assert!((machine - 100.0 * free / (w as f64 * base)).abs() <= 1.0, "{row:?}");
            assert!((number(row[col("tiderec / independent")]) - 100.0 * tide / free).abs() <= 1.0, "{row:?}");
        }
        if !has_torch {
            for c in ["PyTorch samples/s (median)", "PyTorch speed-up", "PyTorch efficiency", "tiderec / PyTorch"] {
                assert_eq!(row[col(c)], "not run (no torch)", "{c}: {row:?}");
            }
            continue;
        }
        let ratio = number(row[col("tiderec / PyTorch")]);
        let expect = number(row[col("tiderec samples/s (median)")]) / number(row[col("PyTorch samples/s (median)")]);
        assert!((ratio - expect).abs() <= 0.01 + 1e-3 * expect, "{row:?}");
    }
    assert_eq!(doc.contains("**PyTorch was not run**"), !has_torch, "the prose says whether PyTorch ran:\n{doc}");

    let (header, rows) = table_rows(&doc, "ms per step in the trainer");
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no `{name}`: {header:?}"));
    assert_eq!(rows.len(), 6, "two series × W = 1, 2, and the independent trainers at W = 2:\n{doc}");
    for row in &rows {
        let total = number(row[col("ms per step in the trainer")]);
        let parts: f64 = [
            "forward/backward, ms",
            "lookups (plan, serve), ms",
            "apply gradients (reduce), ms",
            "gather dense slices, ms",
            "outside the stages (rendezvous), ms",
        ]
        .iter()
        .map(|c| number(row[col(c)]))
        .sum();
        assert!(total > 0.0 && number(row[col("forward/backward, ms")]) > 0.0, "{row:?}");
        // The parts are the step: stages plus the time outside them (six cells, each rounded to 0.01 ms).
        assert!((parts - total).abs() <= 6.0 * 0.005 + 1e-9, "parts {parts} vs step {total}: {row:?}");
        let bytes = number(row[col("bytes exchanged per sample")]);
        if row[1] == "1" {
            assert_eq!(bytes, 0.0, "one worker exchanges nothing: {row:?}");
            assert_eq!(number(row[col("work per sample vs W = 1")]), 1.0, "{row:?}");
        } else if row[col("trainers")] == "independent" {
            assert_eq!(bytes, 0.0, "independent trainers exchange nothing: {row:?}");
        } else {
            assert!(bytes > 0.0, "two workers exchange rows and gradients: {row:?}");
        }
    }
    for series in ["(a) global batch fixed, W = 2:* efficiency", "(b) per-worker batch fixed, W = 2:* efficiency"] {
        assert!(doc.contains(series), "no finding `{series}`:\n{doc}");
    }
    assert_eq!(doc.matches("2 independent single-worker trainers on the same micro-batches").count(), 2, "{doc}");
}

#[test]
fn the_scaling_section_refuses_a_zero_worker_count() {
    let Some(mut py) = python3() else { return };
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/benchmarks.py");
    let out = py.arg(script).args(["--only", "scaling", "--max-workers", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-workers"), "{out:?}");
}
