//! The errors of the GPU backend.

use thiserror::Error;

/// Errors of the GPU backend. Nothing in this crate panics on a missing
/// library, a missing device or a bad shape: each is one of these.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum GpuError {
    /// The CUDA driver library could not be loaded.
    #[error(
        "no CUDA driver: none of these libraries could be loaded: {}. Install the NVIDIA driver or put the folder holding libcuda.so.1 on LD_LIBRARY_PATH",
        searched.join(", ")
    )]
    NoDriver {
        /// The file names that were tried.
        searched: Vec<String>,
    },
    /// The driver is there but device `ordinal` is not.
    #[error("no CUDA device {ordinal}: the driver sees {count} device(s)")]
    NoDevice {
        /// The device asked for.
        ordinal: usize,
        /// Devices the driver reports.
        count: usize,
    },
    /// A CUDA library other than the driver could not be loaded.
    #[error(
        "the CUDA library `{library}` is missing: none of {} could be loaded. Put the folder holding it on LD_LIBRARY_PATH",
        searched.join(", ")
    )]
    LibraryMissing {
        /// `nvrtc` or `cublas`.
        library: &'static str,
        /// The file names that were tried.
        searched: Vec<String>,
    },
    /// The device is older than the kernels need.
    #[error("CUDA device {ordinal} has compute capability {major}.{minor}; the kernels need 7.5 or newer")]
    UnsupportedDevice {
        /// The device.
        ordinal: usize,
        /// Compute capability, major.
        major: i32,
        /// Compute capability, minor.
        minor: i32,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver error while {during}: {message}")]
    Driver {
        /// What was being done.
        during: &'static str,
        /// The driver's error.
        message: String,
    },
    /// NVRTC could not compile a kernel file.
    #[error("NVRTC could not compile {file} for {arch}: {message}")]
    Compile {
        /// The kernel file (`gpu/kernels/…`).
        file: &'static str,
        /// The target (`compute_90`, …).
        arch: String,
        /// NVRTC's error and log.
        message: String,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS error in {op}: {message}")]
    Blas {
        /// The operation.
        op: &'static str,
        /// cuBLAS's status.
        message: String,
    },
    /// An argument's size does not fit the shape given.
    #[error("{op}: {message}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// What does not fit.
        message: String,
    },
    /// Something this backend does not run on a device (yet).
    #[error("not available on a CUDA device: {0}")]
    Unsupported(String),
    /// An index (embedding row, bag offset) lies outside its range.
    #[error("{op}: {message}")]
    Index {
        /// The operation.
        op: &'static str,
        /// Which index, where, and the range.
        message: String,
    },
}

impl GpuError {
    pub(crate) fn shape(op: &'static str, message: impl Into<String>) -> Self {
        GpuError::Shape { op, message: message.into() }
    }

    pub(crate) fn driver(during: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> GpuError {
        move |e| GpuError::Driver { during, message: format!("{e:?}") }
    }

    pub(crate) fn blas(op: &'static str) -> impl FnOnce(cudarc::cublas::result::CublasError) -> GpuError {
        move |e| GpuError::Blas { op, message: format!("{e:?}") }
    }
}
