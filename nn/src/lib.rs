//! # tiderec-nn
//!
//! The model layer of tiderec: neural-network layers and models (MLP, FM,
//! DeepFM and Wide&Deep, DLRM, DIEN with its GRU and attention), the GEMM
//! kernels they run on and the run-time kernel choice, bf16 products (AVX-512
//! BF16 and AMX tiles), and the dense and sparse optimizers with their
//! learning-rate schedules. It depends
//! on the record layer (`tiderec-records`) only, and knows nothing of stores,
//! exchanges or workers.
//!
//! Layers and models:
//!
//! Every layer is generic over [`Scalar`] (`f32` for training, `f64` for the
//! finite-difference gradient checks) and reads its weights from, and writes
//! its gradients to, ranges of one flat parameter buffer owned by the model.
//! `backward` overwrites the gradient ranges it owns; it never accumulates
//! across calls.

#![deny(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

/// The buffer accessors of [`Model`] for a model whose flat buffers are its `params` and `grads` fields.
macro_rules! flat_buffer_accessors {
    () => {
        fn params(&self) -> &[T] {
            &self.params
        }
        fn params_mut(&mut self) -> &mut [T] {
            &mut self.params
        }
        fn grads(&self) -> &[T] {
            &self.grads
        }
        fn params_and_grads(&mut self) -> (&mut [T], &[T]) {
            (&mut self.params, &self.grads)
        }
        fn grads_mut(&mut self) -> &mut [T] {
            &mut self.grads
        }
    };
}

pub mod aligned;
mod amx_tile;
pub mod attention;
mod bf16_pack;
mod deep_partial;
pub mod deepfm;
pub mod dien;
pub mod dlrm;
pub mod embedding_bag;
pub mod fm;
mod fm_partial;
pub mod fma_peak;
pub mod gemm;
pub mod gemm_amx;
pub mod gemm_bf16;
pub mod gemm_packed;
pub mod gru;
pub mod interaction;
pub mod kernel_choice;
pub mod linear;
pub mod loss;
pub mod mlp;
pub mod model;
pub mod model_config;
pub mod named;
pub mod optim;
pub mod precision;
pub mod relu;
pub mod scalar;
pub mod schedule;

#[cfg(test)]
pub(crate) mod gradcheck;

pub use deep_partial::{DeepShares, DeepWeights, FirstLayer};
pub use deepfm::{Fm, FmConfig};
pub use dien::{Dien, DienConfig, Interest};
pub use dlrm::{Dlrm, DlrmConfig};
pub use fm_partial::FmPartial;
pub use model::{Model, PartialModel, SequenceInput};
pub use model_config::{MlpStack, ModelConfig, ModelInputs};
pub use named::ParamTensor;
pub use precision::Precision;
pub use scalar::Scalar;
