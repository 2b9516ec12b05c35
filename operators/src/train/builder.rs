//! [`TrainerConfigBuilder`]: a [`TrainerConfig`] from a model and its tables, every
//! other setting at the default `tiderec train` uses.
//!
//! Invariant: [`TrainerConfigBuilder::build`] of a builder given only a model and
//! table sizes equals the trainer configuration of `tiderec train --model <that model>`
//! with those tables and the default settings (same seed, optimizers, learning rates,
//! accumulators, store and exchange): the command line builds its configuration
//! through this builder.

use super::TrainerConfig;
use crate::exchange::ExchangeConfig;
use crate::nn::ModelConfig;
use crate::optim::{DenseOptimizerKind, OptimizerParams, SparseOptimizerKind};
use crate::store::StoreConfig;
use crate::OperatorError;

/// The seed of a [`TrainerConfig::builder`] not given one (and of `tiderec train`).
pub const DEFAULT_SEED: u64 = 42;

/// The starting accumulator of the dense Adagrad (Keras' default): near-zero
/// gradients do not take full-size first steps.
pub const DENSE_INITIAL_ACCUMULATOR: f32 = 0.1;

/// The starting accumulator of the embedding Adagrads: rows whose gradient is at the
/// level of float noise do not take full-size first steps.
pub const SPARSE_INITIAL_ACCUMULATOR: f32 = 1e-6;

/// Builds a [`TrainerConfig`]; see [`TrainerConfig::builder`].
#[derive(Clone, Debug)]
pub struct TrainerConfigBuilder {
    config: TrainerConfig,
}

impl TrainerConfig {
    /// A configuration of `model` over tables of `table_sizes` rows (one per sparse
    /// field), every other setting at its default: seed [`DEFAULT_SEED`], Adam for the
    /// dense parameters and row-wise Adagrad for the embeddings at the model's
    /// [default learning rates](ModelConfig::default_learning_rates), the fixed store,
    /// rows exchanged. A model reading sequences needs
    /// [`sequence_tables`](TrainerConfigBuilder::sequence_tables).
    ///
    /// ```
    /// use tiderec_operators::nn::{DlrmConfig, ModelConfig};
    /// use tiderec_operators::optim::DenseOptimizerKind;
    /// use tiderec_operators::train::TrainerConfig;
    ///
    /// let model = ModelConfig::Dlrm(DlrmConfig { bottom: vec![64, 16], top: vec![64, 1], ..DlrmConfig::kaggle() });
    /// let config = TrainerConfig::builder(model, vec![10_000; 26])
    ///     .seed(3)
    ///     .dense_optimizer(DenseOptimizerKind::Adagrad)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!((config.dense_hp.lr, config.sparse_hp.lr), (0.001, 0.05)); // DLRM's defaults
    /// ```
    pub fn builder(model: ModelConfig, table_sizes: Vec<u64>) -> TrainerConfigBuilder {
        let (lr, sparse_lr) = model.default_learning_rates();
        TrainerConfigBuilder {
            config: TrainerConfig {
                model,
                table_sizes,
                seed: DEFAULT_SEED,
                dense_optimizer: DenseOptimizerKind::Adam,
                dense_hp: OptimizerParams {
                    initial_accumulator: DENSE_INITIAL_ACCUMULATOR,
                    ..OptimizerParams::with_lr(lr)
                },
                sparse_optimizer: SparseOptimizerKind::RowwiseAdagrad,
                sparse_hp: OptimizerParams {
                    initial_accumulator: SPARSE_INITIAL_ACCUMULATOR,
                    ..OptimizerParams::with_lr(sparse_lr)
                },
                sequence_tables: Vec::new(),
                store: StoreConfig::default(),
                exchange: ExchangeConfig::default(),
            },
        }
    }
}

impl TrainerConfigBuilder {
    /// The seed of every random initialisation.
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = seed;
        self
    }

    /// The optimizer of the dense parameters (its hyper-parameters stay).
    pub fn dense_optimizer(mut self, kind: DenseOptimizerKind) -> Self {
        self.config.dense_optimizer = kind;
        self
    }

    /// The optimizer of the embedding rows (its hyper-parameters stay).
    pub fn sparse_optimizer(mut self, kind: SparseOptimizerKind) -> Self {
        self.config.sparse_optimizer = kind;
        self
    }

    /// The dense learning rate.
    pub fn lr(mut self, lr: f32) -> Self {
        self.config.dense_hp.lr = lr;
        self
    }

    /// The embedding learning rate.
    pub fn sparse_lr(mut self, lr: f32) -> Self {
        self.config.sparse_hp.lr = lr;
        self
    }

    /// Every hyper-parameter of the dense optimizer.
    pub fn dense_hp(mut self, hp: OptimizerParams) -> Self {
        self.config.dense_hp = hp;
        self
    }

    /// Every hyper-parameter of the embedding optimizer.
    pub fn sparse_hp(mut self, hp: OptimizerParams) -> Self {
        self.config.sparse_hp = hp;
        self
    }

    /// For each sequence field of the model, the table its ids index.
    pub fn sequence_tables(mut self, tables: Vec<usize>) -> Self {
        self.config.sequence_tables = tables;
        self
    }

    /// Where each worker keeps its embedding rows.
    pub fn store(mut self, store: StoreConfig) -> Self {
        self.config.store = store;
        self
    }

    /// How each table's embeddings travel between workers.
    pub fn exchange(mut self, exchange: ExchangeConfig) -> Self {
        self.config.exchange = exchange;
        self
    }

    /// The configuration, [validated](TrainerConfig::validate): an error names the key.
    pub fn build(self) -> Result<TrainerConfig, OperatorError> {
        self.config.validate()?;
        Ok(self.config)
    }

    /// The configuration as set, unchecked (a [`Trainer`](super::Trainer) validates it
    /// when it starts).
    pub fn build_unchecked(self) -> TrainerConfig {
        self.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::DlrmConfig;

    #[test]
    fn a_bad_config_is_refused_naming_the_key() {
        let model = ModelConfig::Dlrm(DlrmConfig::kaggle());
        let e = TrainerConfig::builder(model.clone(), vec![10; 25]).build().unwrap_err().to_string();
        assert!(e.contains("table_sizes"), "{e}");
        let e = TrainerConfig::builder(model, vec![10; 26]).lr(f32::NAN).build().unwrap_err().to_string();
        assert!(e.contains("lr"), "{e}");
    }

    /// FTRL divides by the sparse learning rate: a decay that reaches 0 is refused naming
    /// `lr_decay`, with the command line's message; a step decay (never 0) is accepted,
    /// and so is a decay to 0 under another row optimizer.
    #[test]
    fn ftrl_refuses_a_decay_that_reaches_zero() {
        use crate::schedule::{LrDecay, LrSchedule};
        let with = |sparse: SparseOptimizerKind, decay: LrDecay| {
            let schedule = LrSchedule { warmup: 0, decay };
            let hp = OptimizerParams { schedule, ..OptimizerParams::with_lr(0.05) };
            TrainerConfig::builder(ModelConfig::Dlrm(DlrmConfig::kaggle()), vec![10; 26])
                .sparse_optimizer(sparse)
                .sparse_hp(hp)
                .build()
        };
        let to_zero = [LrDecay::Linear { horizon: 100 }, LrDecay::Cosine { horizon: 100 }];
        for (sparse, decay) in [SparseOptimizerKind::Ftrl, SparseOptimizerKind::FtrlAdagrad]
            .into_iter()
            .flat_map(|s| to_zero.map(|d| (s, d)))
        {
            match with(sparse, decay) {
                Err(OperatorError::Config(e)) => {
                    assert_eq!(e.key, "lr_decay", "{sparse} {decay:?}");
                    let reason = format!(
                        "{sparse} divides each weight's sums by --sparse-lr (FTRL's alpha): a {} decay reaches 0 \
                         and would make every weight NaN; use `step` decay or none",
                        decay.name()
                    );
                    assert_eq!(e.reason, reason);
                }
                other => panic!("{sparse} {decay:?}: {other:?}"),
            }
        }
        assert!(with(SparseOptimizerKind::Ftrl, LrDecay::Step { every: 10, rate: 0.5 }).is_ok());
        assert!(with(SparseOptimizerKind::Ftrl, LrDecay::None).is_ok());
        assert!(with(SparseOptimizerKind::RowwiseAdagrad, LrDecay::Linear { horizon: 100 }).is_ok());
    }

    fn fm(deep: Vec<usize>, fm: bool) -> crate::nn::FmConfig {
        crate::nn::FmConfig { num_dense: 13, num_sparse: 26, dim: 8, deep, fm, wide_only: 0 }
    }

    #[test]
    fn every_model_gets_its_default_learning_rates() {
        let cases = [
            ("dlrm", ModelConfig::Dlrm(DlrmConfig::kaggle()), (0.001, 0.05)),
            ("fm", ModelConfig::Fm(fm(vec![], true)), (0.01, 0.01)),
            ("lr", ModelConfig::Fm(fm(vec![], false)), (0.01, 0.05)),
            ("deepfm", ModelConfig::Fm(fm(vec![32], true)), (0.001, 0.01)),
        ];
        for (name, model, rates) in cases {
            let c = TrainerConfig::builder(model, vec![10; 26]).build().unwrap();
            assert_eq!((c.dense_hp.lr, c.sparse_hp.lr), rates, "{name}");
            assert_eq!(c.seed, DEFAULT_SEED);
        }
    }
}
