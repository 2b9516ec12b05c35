//! # tiderec-gpu
//!
//! The CUDA backend of tiderec. It is compiled only with the `cuda` feature;
//! without it every entry point exists with the same signature and returns
//! [`GpuError::NotCompiledWithCuda`], so callers need no `cfg` of their own.
//!
//! The backend is a placeholder in this release: even with `cuda` enabled,
//! [`Device::open`] reports that no kernels are built yet. Training runs on
//! CPU workers.

use thiserror::Error;

/// Errors of the GPU backend.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum GpuError {
    /// This build of tiderec has no CUDA support.
    #[error(
        "tiderec was built without CUDA support; rebuild with `--features cuda` on a machine with the CUDA toolkit"
    )]
    NotCompiledWithCuda,
    /// The `cuda` feature is on but the backend has no kernels yet.
    #[error("the CUDA backend is not implemented yet in this release; train on CPU workers")]
    NotImplemented,
}

/// A GPU device handle.
#[derive(Debug)]
pub struct Device {
    /// Ordinal of the device.
    pub ordinal: usize,
}

impl Device {
    /// Opens GPU `ordinal`.
    pub fn open(ordinal: usize) -> Result<Device, GpuError> {
        let _ = ordinal;
        if cfg!(feature = "cuda") {
            Err(GpuError::NotImplemented)
        } else {
            Err(GpuError::NotCompiledWithCuda)
        }
    }

    /// Number of visible devices (0 without CUDA).
    pub fn count() -> usize {
        0
    }
}

/// True when this build was compiled with the `cuda` feature.
pub fn compiled_with_cuda() -> bool {
    cfg!(feature = "cuda")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_cuda_every_entry_point_says_so() {
        if !compiled_with_cuda() {
            assert_eq!(Device::open(0).unwrap_err(), GpuError::NotCompiledWithCuda);
            assert!(Device::open(0).unwrap_err().to_string().contains("--features cuda"));
            assert_eq!(Device::count(), 0);
        }
    }
}
