//! Every kernel file compiles with NVRTC to PTX for Hopper (`compute_90`),
//! defines exactly the entry points the crate loads, and — where `ptxas` is
//! available — assembles for `sm_90` without register spills. Needs NVRTC
//! only, no driver and no GPU (`scripts/test.sh` installs both from pip).
//! Without NVRTC the test prints why it skips; under `CI=true` it fails.
//! The cache of compiled kernels gives back what NVRTC compiled, and replaces
//! a damaged file.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use tiderec_gpu::cubin_cache::{cubin, cubins};
use tiderec_gpu::kernels::{compile, compile_to, Output, SOURCES};

/// Spilled bytes (stores or loads) any one kernel may have on `sm_90`.
const SPILL_LIMIT_BYTES: u64 = 0;

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

fn skip(reason: &str) {
    assert!(!in_ci(), "CI=true and the kernel compile check cannot run: {reason}");
    eprintln!("skipping: {reason}");
}

/// `ptxas` from `TIDEREC_PTXAS`, else from `PATH`.
fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TIDEREC_PTXAS") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("ptxas")).find(|p| p.is_file())
}

/// The `.entry` names a PTX module defines.
fn entries(ptx: &str) -> BTreeSet<String> {
    ptx.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix(".visible .entry ").or_else(|| l.strip_prefix(".entry "))?;
            Some(rest.split('(').next()?.trim().to_string())
        })
        .collect()
}

/// Per kernel: (registers, spill store bytes, spill load bytes) from `ptxas -v`.
fn resource_usage(log: &str) -> Vec<(String, u64, u64, u64)> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    let mut spills = (0u64, 0u64);
    let number_before = |line: &str, word: &str| -> Option<u64> {
        let at = line.find(word)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    for line in log.lines() {
        if let Some(at) = line.find("Compiling entry function '") {
            let rest = &line[at + "Compiling entry function '".len()..];
            current = rest.split('\'').next().map(str::to_string);
        } else if line.contains("spill stores") {
            spills = (
                number_before(line, "bytes spill stores").unwrap_or(0),
                number_before(line, "bytes spill loads").unwrap_or(0),
            );
        } else if line.contains("Used") && line.contains("registers") {
            if let (Some(name), Some(regs)) = (current.take(), number_before(line, "registers")) {
                out.push((name, regs, spills.0, spills.1));
            }
        }
    }
    out
}

#[test]
fn every_kernel_compiles_for_hopper_and_assembles_without_spills() {
    if !tiderec_gpu::nvrtc_available() {
        skip(&format!(
            "{} (scripts/test.sh installs it: pip install nvidia-cuda-nvrtc==13.0.88, lib folder on LD_LIBRARY_PATH)",
            tiderec_gpu::nvrtc_missing()
        ));
        return;
    }
    let ptxas = ptxas();
    if ptxas.is_none() {
        skip("ptxas not found (set TIDEREC_PTXAS or put it on PATH; pip install nvidia-cuda-nvcc==13.0.88); PTX is still checked");
    }
    let dir = tempfile::tempdir().unwrap();
    let mut total = 0;
    for source in SOURCES {
        let ptx = compile(source, "compute_90").unwrap_or_else(|e| panic!("{e}"));
        let text = ptx;
        assert!(text.contains(".target sm_90"), "{}: PTX for another target", source.file);
        // The form `Device::open` loads: a cubin for the device's own `sm_XY`.
        let cubin = compile_to(source, "sm_90", Output::Cubin).unwrap_or_else(|e| panic!("{e}"));
        assert!(cubin.starts_with(b"\x7fELF"), "{}: NVRTC's sm_90 output is not an ELF cubin", source.file);
        let want: BTreeSet<String> = source.functions.iter().map(|s| s.to_string()).collect();
        assert_eq!(entries(&text), want, "{}: the entry points differ from the list the crate loads", source.file);
        let Some(ptxas) = &ptxas else { continue };
        let ptx_path = dir.path().join(source.file.replace(".cu", ".ptx"));
        std::fs::write(&ptx_path, &text).unwrap();
        let out = Command::new(ptxas)
            .arg("-arch=sm_90")
            .arg("-v")
            .arg(&ptx_path)
            .arg("-o")
            .arg(ptx_path.with_extension("cubin"))
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", ptxas.display()));
        let log = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "ptxas failed on {}:\n{log}", source.file);
        let usage = resource_usage(&log);
        let names: BTreeSet<String> = usage.iter().map(|u| u.0.clone()).collect();
        assert_eq!(names, want, "{}: ptxas reported other kernels:\n{log}", source.file);
        for (name, regs, stores, loads) in usage {
            println!(
                "{:<16} {name:<22} {regs:>3} registers, {stores} bytes spill stores, {loads} bytes spill loads",
                source.file
            );
            if stores > SPILL_LIMIT_BYTES || loads > SPILL_LIMIT_BYTES {
                panic!("{name} spills {stores}/{loads} bytes on sm_90 (limit {SPILL_LIMIT_BYTES})");
            }
            total += 1;
        }
    }
    if ptxas.is_some() {
        let listed: usize = SOURCES.iter().map(|s| s.functions.len()).sum();
        assert_eq!(total, listed, "every kernel assembled");
        println!("{total} kernels in {} files assembled for sm_90", SOURCES.len());
    }
}

#[test]
fn the_kernel_cache_gives_back_what_nvrtc_compiled_and_replaces_a_damaged_file() {
    if !tiderec_gpu::nvrtc_available() {
        skip(&tiderec_gpu::nvrtc_missing().to_string());
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kernels");
    let source = SOURCES.iter().find(|s| s.file == "optim.cu").expect("optim.cu is a kernel file");
    let compiled = compile_to(source, "sm_90", Output::Cubin).unwrap();
    // Without a folder nothing is written.
    assert_eq!(cubin(source, "sm_90", None).unwrap(), compiled);
    assert!(!dir.exists());
    // The folder as `cache_dir` gives it: one that exists (a cache makes none).
    std::fs::create_dir(&dir).unwrap();
    // The first call compiles and stores one file, whole; the next reads it.
    assert_eq!(cubin(source, "sm_90", Some(&dir)).unwrap(), compiled);
    let files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().to_string();
    assert!(name.starts_with("optim-sm_90-") && name.ends_with(".cubin"), "{name}");
    let stored = std::fs::read(&files[0]).unwrap();
    assert!(stored.len() > compiled.len() && stored.ends_with(&compiled), "the file holds the cubin after a header");
    assert_eq!(cubin(source, "sm_90", Some(&dir)).unwrap(), compiled);
    // A damaged file is compiled again and replaced; another target is another file.
    std::fs::write(&files[0], &stored[..stored.len() / 2]).unwrap();
    assert_eq!(cubin(source, "sm_90", Some(&dir)).unwrap(), compiled);
    assert_eq!(std::fs::read(&files[0]).unwrap(), stored, "the damaged file is replaced");
    let other = cubin(source, "sm_80", Some(&dir)).unwrap();
    assert!(other.starts_with(b"\x7fELF"));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "sm_80 is cached beside sm_90, nothing else left");
    // Every file at once, on threads: what NVRTC compiles one by one; then from the cache.
    let all = tmp.path().join("all");
    std::fs::create_dir(&all).unwrap();
    let serial: Vec<Vec<u8>> = SOURCES.iter().map(|s| compile_to(s, "sm_90", Output::Cubin).unwrap()).collect();
    // Each with where it came from: compiled now, then read from the cache.
    let from = |cached: bool| serial.iter().map(|c| (c.clone(), cached)).collect::<Vec<_>>();
    let started = std::time::Instant::now();
    assert_eq!(cubins("sm_90", Some(&all)).unwrap(), from(false));
    let cold = started.elapsed();
    let started = std::time::Instant::now();
    assert_eq!(cubins("sm_90", Some(&all)).unwrap(), from(true));
    println!(
        "{} kernel files: compiled on threads in {cold:?}, read from the cache in {:?}",
        SOURCES.len(),
        started.elapsed()
    );
    assert_eq!(std::fs::read_dir(&all).unwrap().count(), SOURCES.len());
}
