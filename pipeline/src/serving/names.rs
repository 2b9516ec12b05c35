//! Names of a served model's inputs: its dense features and its sparse fields.
//!
//! A checkpoint records the model's shape, not the data it read, so the names
//! come from the shape: a model of 13 dense and 26 sparse fields without
//! sequences reads Criteo records (`I1`…`I13`, `C1`…`C26`); any other model
//! gets positional names (`dense_<j>`, `field_<i>`, 0-based). Feature crosses
//! (the last `wide_only` sparse fields of LR and Wide & Deep) are `cross_<i>`.

use tiderec_operators::nn::ModelConfig;
use tiderec_sources::criteo::{NUM_DENSE, NUM_SPARSE};

/// The names of a model's inputs, in the order the model reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputNames {
    /// One per dense feature.
    pub dense: Vec<String>,
    /// One per sparse field (the data's own fields, then the crosses).
    pub sparse: Vec<String>,
    /// Whether the names are Criteo's (the model reads Criteo records).
    pub criteo: bool,
}

/// The sparse fields that are feature crosses (wide-only), counted from the end.
pub fn crosses(model: &ModelConfig) -> usize {
    match model {
        ModelConfig::Fm(c) => c.wide_only,
        _ => 0,
    }
}

/// Whether `model` reads Criteo records (13 dense, 26 sparse fields, no sequences).
pub fn is_criteo_shaped(model: &ModelConfig) -> bool {
    model.num_dense() == NUM_DENSE && model.num_sparse() - crosses(model) == NUM_SPARSE && model.num_sequences() == 0
}

/// The names of `model`'s inputs (see the module docs).
pub fn input_names(model: &ModelConfig) -> InputNames {
    let criteo = is_criteo_shaped(model);
    let own = model.num_sparse() - crosses(model);
    let dense =
        (0..model.num_dense()).map(|j| if criteo { format!("I{}", j + 1) } else { format!("dense_{j}") }).collect();
    let sparse = (0..own)
        .map(|i| if criteo { format!("C{}", i + 1) } else { format!("field_{i}") })
        .chain((0..crosses(model)).map(|i| format!("cross_{i}")))
        .collect();
    InputNames { dense, sparse, criteo }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiderec_operators::nn::{DlrmConfig, FmConfig};

    #[test]
    fn criteo_shaped_models_get_criteo_names_and_others_positional_ones() {
        let n = input_names(&ModelConfig::Dlrm(DlrmConfig::kaggle()));
        assert!(n.criteo);
        assert_eq!((n.dense[12].as_str(), n.sparse[0].as_str(), n.sparse[25].as_str()), ("I13", "C1", "C26"));
        let wdl = FmConfig { num_dense: 13, num_sparse: 28, dim: 4, deep: vec![8], fm: false, wide_only: 2 };
        let n = input_names(&ModelConfig::Fm(wdl));
        assert!(n.criteo);
        assert_eq!(&n.sparse[25..], ["C26", "cross_0", "cross_1"]);
        let avazu = FmConfig { num_dense: 0, num_sparse: 22, dim: 4, deep: vec![], fm: true, wide_only: 0 };
        let n = input_names(&ModelConfig::Fm(avazu));
        assert!(!n.criteo && n.dense.is_empty());
        assert_eq!(n.sparse[21], "field_21");
    }
}
