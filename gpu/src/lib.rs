//! # tiderec-gpu
//!
//! The CUDA backend of tiderec: the model's kernels on an NVIDIA GPU, each
//! mirroring a CPU implementation in `tiderec-operators` (linear layers and
//! MLPs, DLRM's dot interaction, the FM term, embedding-bag pooling, the
//! split GRU, attention pooling, BCE on logits, the dense optimizers and the
//! sparse row updates), checked against it by the conformance tests in
//! `gpu/tests/`.
//!
//! ## Invariants
//!
//! * **Built everywhere, loaded at run time.** The crate needs no CUDA to
//!   build: cudarc loads `libcuda`, `libnvrtc` and `libcublas` when first
//!   asked. [`Device::open`] probes each library and the device count
//!   *before* any CUDA call, so a machine without them gets a
//!   [`GpuError`] naming what is missing (and the file names tried), never a
//!   panic; [`Device::count`] is 0 there.
//! * **Data lives on the device.** Every operation takes device buffers
//!   (`CudaSlice`) and shapes, runs on the device's one stream in call order
//!   and returns without waiting, except where its doc says it reads a value
//!   back (index checks, the BCE sum, downloads). Parameters and gradients
//!   keep the CPU's flat-buffer layout: a layer addresses its weights at an
//!   offset, exactly as its CPU twin. Buffers may be longer than a shape needs;
//!   shorter ones are a [`GpuError::Shape`], checked on the host before any launch.
//! * **fp32, exact.** Products run in cuBLAS `sgemm` with the handle in
//!   pedantic math mode (no TF32, no reduced-precision reductions); the kernels
//!   are compiled with IEEE division and square root and without FMA
//!   contraction, and sum in the CPU's order wherever one thread owns a sum.
//!   Results agree with the CPU to float reassociation (the conformance
//!   tests bound the relative error by 1e-5). Every reduction has a fixed
//!   order: the same inputs give the same bits on every run; duplicate
//!   embedding rows are grouped by a stable radix sort, never by atomics on values.
//! * **Compiled once per device per process.** The CUDA C sources
//!   (`gpu/kernels/*.cu`, in the binary via `include_str!`) are compiled by
//!   NVRTC for the device's compute capability (`compute_XY` PTX, finished by
//!   the driver) on the first `Device::open` of that device; later opens reuse
//!   the loaded modules. The test `compile_kernels` compiles every file for
//!   Hopper and assembles it with `ptxas` on machines without a GPU.
//! * Kernels need compute capability 7.0 or newer (warp match intrinsics) and
//!   a driver for CUDA 13.0 or newer (the bindings are pinned to the 13.0 API;
//!   NVRTC 13.0 writes PTX 9.0, which an older driver refuses at module load
//!   with a [`GpuError::Driver`]).
//! * **Models behind the host interface.** [`model::build`] gives a
//!   `tiderec_operators::nn::Model<f32>` whose passes run on a device while
//!   the flat parameters stay on the host in the CPU model's layout (see
//!   [`model`]): a trainer worker computes on a GPU unchanged.

#![deny(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

mod blas;
mod check;
pub mod cubin_cache;
mod device;
pub mod device_hot_tier;
pub mod device_shard;
mod error;
pub mod kernels;
pub mod model;
pub mod nn;
pub mod optim;
pub mod resident;
mod row_copy;
mod sort;
pub mod sparse;
mod tensor_core;

pub use blas::{gemm, Op};
/// The CUDA bindings the buffers and streams of this crate come from.
pub use cudarc;
pub use cudarc::driver::CudaSlice;
pub use device::{cublas_available, driver_available, nvrtc_available, nvrtc_missing, Device};
pub use error::GpuError;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_open_fails_with_the_files_it_tried() {
        if driver_available() {
            return;
        }
        assert_eq!(Device::count(), 0);
        let err = Device::open(0).unwrap_err();
        match &err {
            GpuError::NoDriver { searched } => {
                assert!(searched.iter().any(|s| s == "libcuda.so.1" || s == "nvcuda.dll"), "{searched:?}")
            }
            other => panic!("expected NoDriver, got {other:?}"),
        }
        assert!(err.to_string().contains("no CUDA driver"), "{err}");
    }

    /// Every kernel a wrapper launches by name is one `Device::open` loads
    /// (a name missing from `kernels::SOURCES` would only show on a GPU).
    #[test]
    fn every_launched_kernel_is_listed_in_the_sources() {
        let listed: Vec<&str> = kernels::SOURCES.iter().flat_map(|s| s.functions.iter().copied()).collect();
        let mut launched = Vec::new();
        let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
        if !src.is_dir() {
            // A test executable copied to another machine (the GPU check bundle) without the sources.
            assert!(std::env::var_os("CI").is_none_or(|v| v != "true"), "the sources are not at {}", src.display());
            eprintln!("skipping: the crate's sources are not at {} (the test command checks them)", src.display());
            return;
        }
        let mut dirs = vec![src];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for piece in text.split("dev.function(\"").skip(1) {
                        launched.push(piece.split('"').next().unwrap().to_string());
                    }
                }
            }
        }
        assert!(launched.len() >= 20, "found only {launched:?}");
        for name in &launched {
            assert!(listed.contains(&name.as_str()), "`{name}` is launched but not listed in kernels::SOURCES");
        }
        for name in listed {
            assert!(launched.iter().any(|l| l == name), "`{name}` is compiled but never launched");
        }
    }
}
