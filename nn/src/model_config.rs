//! The configuration that names a model and its shape, and builds it.
//!
//! [`ModelConfig`] is the one place that knows every model kind: the models
//! implement [`Model`] in their own files and know nothing of each other or of
//! this enum.

use crate::deepfm::{Fm, FmConfig};
use crate::dien::{Dien, DienConfig};
use crate::dlrm::{Dlrm, DlrmConfig};
use crate::fm_partial::FmPartial;
use crate::model::Model;
use crate::named::ParamTensor;
use crate::Scalar;
use serde::{Deserialize, Serialize};
use tiderec_records::OperatorError;

/// One MLP of a model ([`ModelConfig::mlp_stacks`]): layers
/// `widths[0] → widths[1] → …`, a ReLU after each but (unless `relu_last`) the last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlpStack {
    /// The widths, input first.
    pub widths: Vec<usize>,
    /// Whether a ReLU follows the last layer too.
    pub relu_last: bool,
}

/// Which model to train, with its shape.
///
/// Serialized with a `kind` tag naming the model: `dlrm`, `dien`, and for the
/// one [`FmConfig`] family `lr`, `fm`, `deepfm` or `wdl` after
/// [`FmConfig::name`]. Any of the four reads back as [`ModelConfig::Fm`] (the
/// shape decides the model), so configurations that wrote `"fm"` for all of
/// them still read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "TaggedModelConfig", into = "TaggedModelConfig")]
pub enum ModelConfig {
    /// DLRM: bottom MLP, dot interaction, top MLP.
    Dlrm(DlrmConfig),
    /// Logistic regression, factorization machine, DeepFM or Wide & Deep (see [`FmConfig`]).
    Fm(FmConfig),
    /// GRU interest extraction and attention over behaviour sequences (see [`DienConfig`]).
    Dien(DienConfig),
    /// A model of the caller's own, given to the trainer built
    /// (`Trainer::with_model`): only the inputs it reads are declared here.
    Custom(ModelInputs),
}

/// What a model of the caller's own reads ([`ModelConfig::Custom`]): the shape every
/// batch must have and the width of the embedding rows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInputs {
    /// Dense features per sample.
    pub num_dense: usize,
    /// Sparse fields per sample (one embedding table each).
    pub num_sparse: usize,
    /// Width of the embedding rows.
    pub dim: usize,
    /// Behaviour-sequence fields per sample (0 without).
    #[serde(default)]
    pub num_sequences: usize,
    /// Longest sequence a sample may carry (0 without sequences).
    #[serde(default)]
    pub max_len: usize,
}

impl ModelInputs {
    /// Inputs of `num_dense` dense features and `num_sparse` fields of `dim`-wide rows.
    pub fn new(num_dense: usize, num_sparse: usize, dim: usize) -> Self {
        ModelInputs { num_dense, num_sparse, dim, num_sequences: 0, max_len: 0 }
    }

    fn validate(&self) -> Result<(), OperatorError> {
        if self.dim == 0 {
            return Err(OperatorError::config("model.dim", "a custom model reads embedding rows at least 1 wide"));
        }
        if (self.num_sequences > 0) != (self.max_len > 0) {
            return Err(OperatorError::config(
                "model.max_len",
                "sequences need a positive max_len, and a positive max_len needs sequences",
            ));
        }
        Ok(())
    }
}

/// The serialized form of [`ModelConfig`]: one tag per model kind.
#[derive(Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum TaggedModelConfig {
    Dlrm(DlrmConfig),
    Lr(FmConfig),
    Fm(FmConfig),
    DeepFm(FmConfig),
    Wdl(FmConfig),
    Dien(DienConfig),
    Custom(ModelInputs),
}

impl From<TaggedModelConfig> for ModelConfig {
    fn from(t: TaggedModelConfig) -> Self {
        match t {
            TaggedModelConfig::Dlrm(c) => ModelConfig::Dlrm(c),
            TaggedModelConfig::Lr(c)
            | TaggedModelConfig::Fm(c)
            | TaggedModelConfig::DeepFm(c)
            | TaggedModelConfig::Wdl(c) => ModelConfig::Fm(c),
            TaggedModelConfig::Dien(c) => ModelConfig::Dien(c),
            TaggedModelConfig::Custom(c) => ModelConfig::Custom(c),
        }
    }
}

impl From<ModelConfig> for TaggedModelConfig {
    fn from(m: ModelConfig) -> Self {
        match m {
            ModelConfig::Dlrm(c) => TaggedModelConfig::Dlrm(c),
            ModelConfig::Fm(c) => match c.name() {
                "lr" => TaggedModelConfig::Lr(c),
                "fm" => TaggedModelConfig::Fm(c),
                "deepfm" => TaggedModelConfig::DeepFm(c),
                _ => TaggedModelConfig::Wdl(c),
            },
            ModelConfig::Dien(c) => TaggedModelConfig::Dien(c),
            ModelConfig::Custom(c) => TaggedModelConfig::Custom(c),
        }
    }
}

/// The default `(dense, embedding)` learning rates of the model named `name` (as
/// [`ModelConfig::name`] spells it), `None` for another name: what `tiderec train` and
/// tiderec-operators' `TrainerConfig::builder` use unless told otherwise.
///
/// Chosen by measurement: on the real Criteo sample (first 8,000 rows train, last 2,000
/// eval, one epoch, batch 128, seeds 1–3) each pair is the best of a grid of dense rates
/// 0.0003–0.01 and embedding rates 0.002–0.1 within 0.005 AUC (docs/training.md).
pub fn default_learning_rates(name: &str) -> Option<(f32, f32)> {
    Some(match name {
        "lr" => (0.01, 0.05),
        "fm" => (0.01, 0.01),
        "deepfm" | "wdl" => (0.001, 0.01),
        "dlrm" | "dien" | "dien-sum" | "custom" => (0.001, 0.05),
        _ => return None,
    })
}

impl ModelConfig {
    /// Dense features per sample.
    pub fn num_dense(&self) -> usize {
        match self {
            ModelConfig::Dlrm(c) => c.num_dense,
            ModelConfig::Fm(c) => c.num_dense,
            ModelConfig::Dien(c) => c.num_dense,
            ModelConfig::Custom(c) => c.num_dense,
        }
    }

    /// Sparse fields per sample.
    pub fn num_sparse(&self) -> usize {
        match self {
            ModelConfig::Dlrm(c) => c.num_sparse,
            ModelConfig::Fm(c) => c.num_sparse,
            ModelConfig::Dien(c) => c.num_sparse,
            ModelConfig::Custom(c) => c.num_sparse,
        }
    }

    /// Sequence fields per sample (0 for models without behaviour sequences).
    pub fn num_sequences(&self) -> usize {
        match self {
            ModelConfig::Dien(c) => c.num_sequences,
            ModelConfig::Custom(c) => c.num_sequences,
            _ => 0,
        }
    }

    /// Longest sequence a sample may carry (0 without sequences).
    pub fn max_sequence_len(&self) -> usize {
        match self {
            ModelConfig::Dien(c) => c.max_len,
            ModelConfig::Custom(c) => c.max_len,
            _ => 0,
        }
    }

    /// Width of the embedding rows this model reads.
    pub fn embedding_dim(&self) -> usize {
        match self {
            ModelConfig::Dlrm(c) => c.dim,
            ModelConfig::Fm(c) => c.embedding_dim(),
            ModelConfig::Dien(c) => c.dim,
            ModelConfig::Custom(c) => c.dim,
        }
    }

    /// The DES partial-result shape when the model supports that exchange (LR,
    /// FM, DeepFM and Wide & Deep without wide-only crosses), else `None`.
    pub fn partial(&self) -> Option<FmPartial> {
        match self {
            ModelConfig::Fm(c) => c.partial(),
            _ => None,
        }
    }

    /// The documented default `(dense, embedding)` learning rates of this model
    /// (see [`default_learning_rates`]).
    pub fn default_learning_rates(&self) -> (f32, f32) {
        default_learning_rates(self.name()).expect("every model kind has default learning rates")
    }

    /// A short name (`dlrm`, `lr`, `fm`, `deepfm`, `wdl`, `dien`, `dien-sum`, `custom`).
    pub fn name(&self) -> &'static str {
        match self {
            ModelConfig::Dlrm(_) => "dlrm",
            ModelConfig::Fm(c) => c.name(),
            ModelConfig::Dien(c) => c.name(),
            ModelConfig::Custom(_) => "custom",
        }
    }

    /// The model's MLPs as training runs them, in order: each a stack of fully
    /// connected layers chained through ReLUs.
    pub fn mlp_stacks(&self) -> Vec<MlpStack> {
        let stack = |first: usize, rest: &[usize], last: Option<usize>, relu_last: bool| MlpStack {
            widths: std::iter::once(first).chain(rest.iter().copied()).chain(last).collect(),
            relu_last,
        };
        match self {
            ModelConfig::Dlrm(c) => {
                let interaction = super::interaction::DotInteraction {
                    num_sparse: c.num_sparse,
                    dim: c.dim,
                    self_interaction: c.self_interaction,
                };
                vec![stack(c.num_dense, &c.bottom, None, true), stack(interaction.output_dim(), &c.top, None, false)]
            }
            ModelConfig::Fm(c) if !c.deep.is_empty() => {
                let input = c.num_dense + (c.num_sparse - c.wide_only.min(c.num_sparse)) * c.dim;
                vec![stack(input, &c.deep, Some(1), false)]
            }
            ModelConfig::Fm(_) => Vec::new(),
            ModelConfig::Dien(c) => {
                vec![stack(c.num_dense + c.num_sparse * c.dim + 2 * c.interest_dim(), &c.mlp, Some(1), false)]
            }
            // Its products are its own: no kernel is chosen for them.
            ModelConfig::Custom(_) => Vec::new(),
        }
    }

    /// `(input, output)` of every fully connected layer of the model's MLPs, in
    /// order (the shapes of its GEMMs, for [`kernel_choice`](super::kernel_choice)).
    pub fn mlp_layers(&self) -> Vec<(usize, usize)> {
        self.mlp_stacks().iter().flat_map(|s| s.widths.windows(2).map(|w| (w[0], w[1]))).collect()
    }

    /// Whether training computes the input gradient `dx` of layer `layer` of
    /// [`mlp_layers`](Self::mlp_layers): every layer but one whose input is the
    /// records' dense values alone (DLRM's first bottom layer), which nothing
    /// upstream needs a gradient of.
    pub fn mlp_layer_computes_dx(&self, layer: usize) -> bool {
        !matches!(self, ModelConfig::Dlrm(_)) || layer != 0
    }

    /// Checks the shape; errors name the offending key.
    pub fn validate(&self) -> Result<(), OperatorError> {
        match self {
            ModelConfig::Dlrm(c) => c.validate(),
            ModelConfig::Fm(c) => c.validate(),
            ModelConfig::Dien(c) => c.validate(),
            ModelConfig::Custom(c) => c.validate(),
        }
    }

    /// Builds and initialises the model from `seed`; a custom model is the caller's to build.
    pub fn build<T: Scalar>(&self, seed: u64) -> Result<Box<dyn Model<T>>, OperatorError> {
        Ok(match self {
            ModelConfig::Dlrm(c) => Box::new(Dlrm::<T>::new(c.clone(), seed)?),
            ModelConfig::Fm(c) => Box::new(Fm::<T>::new(c.clone(), seed)?),
            ModelConfig::Dien(c) => Box::new(Dien::<T>::new(c.clone(), seed)?),
            ModelConfig::Custom(_) => {
                return Err(OperatorError::config(
                    "model",
                    "a custom model is built by its program and handed to the trainer (Trainer::with_model)",
                ))
            }
        })
    }
}

impl ModelConfig {
    /// The model's dense parameters as named tensors, in buffer order (see the module docs).
    pub fn param_tensors(&self) -> Vec<ParamTensor> {
        match self {
            ModelConfig::Dlrm(c) => crate::dlrm::param_tensors(c),
            ModelConfig::Fm(c) => crate::deepfm::param_tensors(c),
            ModelConfig::Dien(c) => crate::dien::param_tensors(c),
            // Its parameters are its own: none is named here.
            ModelConfig::Custom(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind of the FM family is written under its own name and reads back
    /// unchanged; the old form, `"fm"` for all four, still reads.
    #[test]
    fn the_serialized_kind_is_the_model_kind() {
        let base = FmConfig { num_dense: 13, num_sparse: 26, dim: 8, deep: vec![], fm: true, wide_only: 0 };
        for (config, kind) in [
            (FmConfig { dim: 0, ..base.clone() }, "lr"),
            (base.clone(), "fm"),
            (FmConfig { deep: vec![16], ..base.clone() }, "deepfm"),
            (FmConfig { deep: vec![16], fm: false, ..base.clone() }, "wdl"),
        ] {
            let m = ModelConfig::Fm(config);
            let v = serde_json::to_value(&m).unwrap();
            assert_eq!(v["kind"], kind);
            assert_eq!(m.name(), kind);
            assert_eq!(serde_json::from_value::<ModelConfig>(v.clone()).unwrap(), m);
            let mut old = v;
            old["kind"] = "fm".into();
            assert_eq!(serde_json::from_value::<ModelConfig>(old).unwrap(), m);
        }
        let dlrm = ModelConfig::Dlrm(DlrmConfig::kaggle());
        let v = serde_json::to_value(&dlrm).unwrap();
        assert_eq!(v["kind"], "dlrm");
        assert_eq!(serde_json::from_value::<ModelConfig>(v).unwrap(), dlrm);
    }

    /// A custom model's inputs read back under kind `custom`; the trainer takes its
    /// shape, and building it is the program's: `build` refuses, naming `with_model`.
    #[test]
    fn a_custom_model_declares_its_inputs_only() {
        let m = ModelConfig::Custom(ModelInputs::new(13, 26, 8));
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["kind"], "custom");
        assert_eq!(serde_json::from_value::<ModelConfig>(v).unwrap(), m);
        assert_eq!((m.num_dense(), m.num_sparse(), m.embedding_dim(), m.num_sequences()), (13, 26, 8, 0));
        assert!(m.validate().is_ok() && m.param_tensors().is_empty() && m.mlp_layers().is_empty());
        let e = m.build::<f32>(1).err().expect("a custom model is not built here").to_string();
        assert!(e.contains("Trainer::with_model"), "{e}");
        let flat = ModelConfig::Custom(ModelInputs { max_len: 5, ..ModelInputs::new(1, 2, 4) });
        assert!(flat.validate().unwrap_err().to_string().contains("model.max_len"));
        assert!(ModelConfig::Custom(ModelInputs::new(1, 2, 0)).validate().is_err());
    }

    /// The listed layers are the built model's: DLRM Kaggle's seven products, and
    /// their parameters (`in·out + out` each) are every dense parameter of the model.
    #[test]
    fn mlp_layers_are_the_models_gemm_shapes() {
        let config = ModelConfig::Dlrm(DlrmConfig::kaggle());
        let layers = config.mlp_layers();
        assert_eq!(layers, vec![(13, 512), (512, 256), (256, 64), (64, 16), (367, 512), (512, 256), (256, 1)]);
        // As two stacks: the bottom MLP keeps its last ReLU, the top one ends at the logit.
        let stacks = config.mlp_stacks();
        let want = [(vec![13, 512, 256, 64, 16], true), (vec![367, 512, 256, 1], false)];
        assert_eq!(stacks.iter().map(|s| (s.widths.clone(), s.relu_last)).collect::<Vec<_>>(), want);
        let model = config.build::<f32>(1).unwrap();
        let listed: usize = layers.iter().map(|&(i, o)| i * o + o).sum();
        assert_eq!(listed, model.params().len());
        // Only the first bottom layer reads the dense values alone.
        let dx: Vec<bool> = (0..layers.len()).map(|i| config.mlp_layer_computes_dx(i)).collect();
        assert_eq!(dx, vec![false, true, true, true, true, true, true]);
    }
}
