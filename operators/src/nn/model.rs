//! The interface every model implements, and the configuration that builds one.
//!
//! A model sees each sample as `num_dense` dense values and `num_sparse`
//! pooled embedding vectors of width `embedding_dim()`. Its dense
//! parameters live in one flat buffer (`params`, gradients in `grads`), so
//! the trainer can reduce-scatter, all-gather and checkpoint them without
//! knowing the model. Embedding rows are not part of the model: the trainer
//! owns them sharded across workers and hands the model pooled vectors.

use super::deepfm::{Fm, FmConfig};
use super::dlrm::{Dlrm, DlrmConfig};
use super::Scalar;
use crate::OperatorError;
use serde::{Deserialize, Serialize};

/// A trainable CTR model over dense features and pooled embeddings.
pub trait Model<T: Scalar>: Send {
    /// Dense parameters, in a fixed layout.
    fn params(&self) -> &[T];
    /// Mutable dense parameters (for optimizers and all-gathers).
    fn params_mut(&mut self) -> &mut [T];
    /// Gradients of the last `backward`, same layout as `params`.
    fn grads(&self) -> &[T];
    /// Parameters (mutable) and gradients at once, for fused updates.
    fn params_and_grads(&mut self) -> (&mut [T], &[T]);
    /// Width of each pooled embedding vector the model expects.
    fn embedding_dim(&self) -> usize;
    /// Logits for `dense: [B × num_dense]` and `pooled: [B × num_sparse × embedding_dim]`.
    fn forward(&mut self, dense: &[T], pooled: &[T], batch: usize) -> &[T];
    /// Back-propagates `dlogits` through the last `forward` (same inputs);
    /// fills `grads` and overwrites `dpooled`.
    fn backward(&mut self, dense: &[T], pooled: &[T], dlogits: &[T], dpooled: &mut [T]);
}

/// Which model to train, with its shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ModelConfig {
    /// DLRM: bottom MLP, dot interaction, top MLP.
    Dlrm(DlrmConfig),
    /// Logistic regression, factorization machine or DeepFM (see [`FmConfig`]).
    Fm(FmConfig),
}

impl ModelConfig {
    /// Dense features per sample.
    pub fn num_dense(&self) -> usize {
        match self {
            ModelConfig::Dlrm(c) => c.num_dense,
            ModelConfig::Fm(c) => c.num_dense,
        }
    }

    /// Sparse fields per sample.
    pub fn num_sparse(&self) -> usize {
        match self {
            ModelConfig::Dlrm(c) => c.num_sparse,
            ModelConfig::Fm(c) => c.num_sparse,
        }
    }

    /// Width of the embedding rows this model reads.
    pub fn embedding_dim(&self) -> usize {
        match self {
            ModelConfig::Dlrm(c) => c.dim,
            ModelConfig::Fm(c) => c.embedding_dim(),
        }
    }

    /// A short name (`dlrm`, `lr`, `fm`, `deepfm`).
    pub fn name(&self) -> &'static str {
        match self {
            ModelConfig::Dlrm(_) => "dlrm",
            ModelConfig::Fm(c) => c.name(),
        }
    }

    /// Checks the shape; errors name the offending key.
    pub fn validate(&self) -> Result<(), OperatorError> {
        match self {
            ModelConfig::Dlrm(c) => c.validate(),
            ModelConfig::Fm(c) => c.validate(),
        }
    }

    /// Builds and initialises the model from `seed`.
    pub fn build<T: Scalar>(&self, seed: u64) -> Result<Box<dyn Model<T>>, OperatorError> {
        Ok(match self {
            ModelConfig::Dlrm(c) => Box::new(Dlrm::<T>::new(c.clone(), seed)?),
            ModelConfig::Fm(c) => Box::new(Fm::<T>::new(c.clone(), seed)?),
        })
    }
}

impl<T: Scalar> Model<T> for Dlrm<T> {
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
    fn embedding_dim(&self) -> usize {
        self.config.dim
    }
    fn forward(&mut self, dense: &[T], pooled: &[T], batch: usize) -> &[T] {
        Dlrm::forward(self, dense, pooled, batch)
    }
    fn backward(&mut self, dense: &[T], pooled: &[T], dlogits: &[T], dpooled: &mut [T]) {
        Dlrm::backward(self, dense, pooled, dlogits, dpooled)
    }
}
