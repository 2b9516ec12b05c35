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
use cudarc::nvrtc::{CompileOptions, Ptx};

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
        functions: &["bias_act_rows", "relu_backward", "column_sum"],
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
            "radix_scatter",
        ],
    },
    KernelSource {
        file: "sparse.cu",
        source: include_str!("../kernels/sparse.cu"),
        functions: &["sparse_update_rows"],
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
        functions: &["sgd_update", "adagrad_update", "adam_update"],
    },
    KernelSource { file: "loss.cu", source: include_str!("../kernels/loss.cu"), functions: &["bce_grad", "bce_sum"] },
    KernelSource {
        file: "wide.cu",
        source: include_str!("../kernels/wide.cu"),
        functions: &[
            "wide_forward",
            "wide_param_grads",
            "first_order_grad",
            "deep_input_gather",
            "deep_input_scatter_add",
            "add_assign",
        ],
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

/// The virtual architecture `compute_XY` for compute capability `X.Y`
/// (a `'static` string, as NVRTC's options in cudarc want one).
pub fn virtual_arch(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (7, 0) => "compute_70",
        (7, 2) => "compute_72",
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        // Any other capability: one small string per process and capability.
        _ => Box::leak(format!("compute_{major}{minor}").into_boxed_str()),
    }
}

/// The NVRTC options every kernel file is compiled with, for `arch` (`compute_XY`).
pub fn compile_options(arch: &'static str, file: &'static str) -> CompileOptions {
    CompileOptions {
        ftz: Some(false),
        prec_sqrt: Some(true),
        prec_div: Some(true),
        fmad: Some(false),
        use_fast_math: Some(false),
        arch: Some(arch),
        name: Some(file.to_string()),
        options: vec!["--std=c++17".to_string()],
        ..Default::default()
    }
}

/// Compiles one kernel file to PTX for `arch` with NVRTC (no driver or device
/// needed). The caller must have checked that NVRTC is present
/// ([`crate::nvrtc_available`]); without it cudarc would panic.
pub fn compile(source: &KernelSource, arch: &'static str) -> Result<Ptx, GpuError> {
    cudarc::nvrtc::compile_ptx_with_opts(source.source, compile_options(arch, source.file)).map_err(|e| {
        let message = match e {
            cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => {
                format!("{nvrtc:?}: {}", log.to_string_lossy())
            }
            other => format!("{other:?}"),
        };
        GpuError::Compile { file: source.file, arch: arch.to_string(), message }
    })
}
