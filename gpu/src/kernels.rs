//! The CUDA C sources of the kernels (`gpu/kernels/*.cu`, compiled into the
//! crate with `include_str!`) and how NVRTC compiles them.
//!
//! Every file is self-contained (no includes) and becomes one module per
//! device per process (see [`crate::Device`]). The options are fixed:
//! IEEE division and square root, no flush to zero and **no FMA
//! contraction**, so each product and sum rounds as the CPU's Rust code does
//! and the elementwise kernels agree with the CPU to the last bit wherever
//! they sum in the same order.

use crate::GpuError;
use cudarc::nvrtc::{result, sys};
use std::ffi::{c_char, CString};

/// One kernel file and the entry points it defines.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// File name under `gpu/kernels/`.
    pub file: &'static str,
    /// The CUDA C source.
    pub source: &'static str,
    /// The `extern "C" __global__` functions it defines.
    pub functions: &'static [&'static str],
}

/// Every kernel file of the backend.
pub const SOURCES: &[KernelSource] = &[
    KernelSource {
        file: "linear.cu",
        source: include_str!("../kernels/linear.cu"),
        functions: &["bias_act_rows", "relu_backward", "column_reduce_chunks", "column_reduce_finish"],
    },
    KernelSource {
        file: "blas.cu",
        source: include_str!("../kernels/blas.cu"),
        functions: &["copy_rows_f32", "pack_rows_bf16"],
    },
    KernelSource {
        file: "interaction.cu",
        source: include_str!("../kernels/interaction.cu"),
        functions: &["interaction_forward", "interaction_backward"],
    },
    KernelSource { file: "fm.cu", source: include_str!("../kernels/fm.cu"), functions: &["fm_forward", "fm_backward"] },
    KernelSource {
        file: "embedding_bag.cu",
        source: include_str!("../kernels/embedding_bag.cu"),
        functions: &["pool_forward", "entry_bags", "pool_backward_rows"],
    },
    KernelSource {
        file: "sort.cu",
        source: include_str!("../kernels/sort.cu"),
        functions: &[
            "iota_u32",
            "check_below",
            "check_offsets",
            "radix_histogram",
            "exclusive_scan_u32",
            "scan_segments_u32",
            "add_segment_bases_u32",
            "radix_scatter",
        ],
    },
    KernelSource {
        file: "sparse.cu",
        source: include_str!("../kernels/sparse.cu"),
        functions: &["chunk_partial_sums", "sparse_update_rows"],
    },
    KernelSource {
        file: "gru.cu",
        source: include_str!("../kernels/gru.cu"),
        functions: &["gru_step_forward", "gru_step_backward"],
    },
    KernelSource {
        file: "attention.cu",
        source: include_str!("../kernels/attention.cu"),
        functions: &["attention_forward", "attention_backward"],
    },
    KernelSource {
        file: "optim.cu",
        source: include_str!("../kernels/optim.cu"),
        functions: &["write_scalars", "sgd_update", "adagrad_update", "adam_update"],
    },
    KernelSource {
        file: "loss.cu",
        source: include_str!("../kernels/loss.cu"),
        functions: &["bce_grad", "bce_sum", "sum_f64", "loss_guard"],
    },
    KernelSource {
        file: "wide.cu",
        source: include_str!("../kernels/wide.cu"),
        functions: &["wide_forward", "first_order_grad", "deep_input_gather", "deep_input_scatter_add", "add_assign"],
    },
    KernelSource {
        file: "fm_partial.cu",
        source: include_str!("../kernels/fm_partial.cu"),
        functions: &["fm_partial_logit", "fm_partial_grad", "shares_plus_bias", "relu_rows", "shares_grad"],
    },
    KernelSource {
        file: "resident.cu",
        source: include_str!("../kernels/resident.cu"),
        functions: &["resident_pool", "resident_entry_grads", "flag_nonfinite", "mark_rows"],
    },
    KernelSource {
        file: "rows.cu",
        source: include_str!("../kernels/rows.cu"),
        functions: &["gather_rows", "scatter_rows"],
    },
    KernelSource {
        file: "dien.cu",
        source: include_str!("../kernels/dien.cu"),
        functions: &[
            "dien_query",
            "dien_sum_pool",
            "dien_keys",
            "dien_mlp_input",
            "dien_dx_pooled",
            "dien_dx_interest",
            "dien_sum_pool_backward",
            "dien_keys_to_states",
            "dien_residual",
            "dien_target_grad",
        ],
    },
];

/// The oldest compute capability the kernels are built for: CUDA 13's NVRTC
/// no longer targets 7.0 and 7.2 (Volta, Xavier).
pub const MIN_CAPABILITY: (i32, i32) = (7, 5);

/// The virtual architecture `compute_XY` for compute capability `X.Y`: PTX,
/// which the compile check assembles with `ptxas`.
pub fn virtual_arch(major: i32, minor: i32) -> String {
    format!("compute_{major}{minor}")
}

/// The real architecture `sm_XY`: a cubin for exactly that device, which
/// the driver loads without compiling PTX again (so an NVRTC newer than the
/// driver within one CUDA major version still works).
pub fn real_arch(major: i32, minor: i32) -> String {
    format!("sm_{major}{minor}")
}

/// The NVRTC options every kernel file is compiled with, for `arch`
/// (`compute_XY` or `sm_XY`): IEEE division and square root, no flush to
/// zero, no FMA contraction, C++17.
pub fn compile_options(arch: &str) -> Vec<String> {
    vec![
        "--ftz=false".into(),
        "--prec-sqrt=true".into(),
        "--prec-div=true".into(),
        "--fmad=false".into(),
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
    ]
}

/// What NVRTC hands back for a compiled program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// PTX text (a `compute_XY` target).
    Ptx,
    /// A cubin (an `sm_XY` target).
    Cubin,
}

/// The NVRTC library's version `(major, minor)`. The caller must have
/// checked that NVRTC is present ([`crate::nvrtc_available`]).
pub fn nvrtc_version() -> Result<(i32, i32), GpuError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to live integers.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }.result().map_err(|e| GpuError::Compile {
        file: "-",
        arch: "-".into(),
        message: format!("nvrtcVersion: {e:?}"),
    })?;
    Ok((major, minor))
}

/// Compiles one kernel file with NVRTC for `arch` (no driver or device
/// needed) and returns the PTX or cubin it asks for. The caller must have
/// checked that NVRTC is present ([`crate::nvrtc_available`]); without it
/// cudarc would panic.
pub fn compile_to(source: &KernelSource, arch: &str, output: Output) -> Result<Vec<u8>, GpuError> {
    let fail = |message: String| GpuError::Compile { file: source.file, arch: arch.to_string(), message };
    let src = CString::new(source.source).map_err(|_| fail("the source holds a NUL byte".into()))?;
    let name = CString::new(source.file).map_err(|_| fail("the file name holds a NUL byte".into()))?;
    let prog = result::create_program(&src, Some(&name)).map_err(|e| fail(format!("{e:?}")))?;
    let out = (|| {
        // SAFETY: `prog` was just created and is destroyed below, after its last use.
        if let Err(e) = unsafe { result::compile_program(prog, &compile_options(arch)) } {
            // SAFETY: as above.
            let log = unsafe { result::get_program_log(prog) }
                .map(|l| l.iter().map(|&c| c as u8 as char).filter(|&c| c != '\0').collect::<String>())
                .unwrap_or_default();
            let hint = if e.0 == sys::nvrtcResult::NVRTC_ERROR_BUILTIN_OPERATION_FAILURE {
                " (NVRTC could not load libnvrtc-builtins: put the folder holding libnvrtc-builtins.so.* beside libnvrtc on LD_LIBRARY_PATH)"
            } else {
                ""
            };
            return Err(fail(format!("{e:?}{hint}: {log}")));
        }
        let (size_fn, get_fn): (SizeFn, GetFn) = match output {
            Output::Ptx => (sys::nvrtcGetPTXSize, sys::nvrtcGetPTX),
            Output::Cubin => (sys::nvrtcGetCUBINSize, sys::nvrtcGetCUBIN),
        };
        let mut size = 0usize;
        // SAFETY: `prog` compiled successfully; `size` is a live out-pointer.
        unsafe { size_fn(prog, &mut size) }.result().map_err(|e| fail(format!("reading the output size: {e:?}")))?;
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds exactly the `size` bytes NVRTC reported.
        unsafe { get_fn(prog, buf.as_mut_ptr() as *mut c_char) }
            .result()
            .map_err(|e| fail(format!("reading the output: {e:?}")))?;
        Ok(buf)
    })();
    // SAFETY: created above, not destroyed before.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

type SizeFn = unsafe fn(sys::nvrtcProgram, *mut usize) -> sys::nvrtcResult;
type GetFn = unsafe fn(sys::nvrtcProgram, *mut c_char) -> sys::nvrtcResult;

/// Compiles one kernel file to PTX text for `arch` (`compute_XY`): the
/// compile check's form.
pub fn compile(source: &KernelSource, arch: &str) -> Result<String, GpuError> {
    let mut bytes = compile_to(source, arch, Output::Ptx)?;
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    String::from_utf8(bytes).map_err(|_| GpuError::Compile {
        file: source.file,
        arch: arch.to_string(),
        message: "PTX is not UTF-8".into(),
    })
}
