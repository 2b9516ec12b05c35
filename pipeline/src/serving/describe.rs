//! The `model` half of `model.json`: the model kind, every tensor's shape and
//! the forward computation spelled out, so a reader can rebuild the model from
//! `model.json` and `model.safetensors` alone.
//!
//! Conventions every description shares: a linear layer named `L` computes
//! `x · L.weightᵀ + L.bias` (PyTorch's `nn.Linear`); an MLP lists its layers in
//! order and says after which of them a ReLU follows; "pooled `<field>`" is the
//! sum of the rows of the field's ids in that table (zeros for a missing value);
//! concatenations list their parts in order.

use super::names::{crosses, InputNames};
use serde_json::{json, Value};
use tiderec_operators::nn::{DienConfig, DlrmConfig, FmConfig, Interest, ModelConfig, ParamTensor};

/// The layer names (`<prefix>.<i>`) of the MLP whose tensors start with `prefix.`.
fn layers(prefix: &str, params: &[ParamTensor]) -> Vec<String> {
    params
        .iter()
        .filter_map(|t| t.name.strip_prefix(&format!("{prefix}.")).and_then(|rest| rest.strip_suffix(".weight")))
        .map(|i| format!("{prefix}.{i}"))
        .collect()
}

fn mlp(prefix: &str, params: &[ParamTensor], relu_after_last: bool, input: Value) -> Value {
    json!({
        "layers": layers(prefix, params),
        "input": input,
        "activation": "relu",
        "relu_after_last": relu_after_last,
    })
}

/// The `forward` description of `model` (see the module docs).
pub fn forward(model: &ModelConfig, names: &InputNames) -> Value {
    let params = model.param_tensors();
    match model {
        ModelConfig::Dlrm(c) => dlrm(c, names, &params),
        ModelConfig::Fm(c) => fm_family(c, model, names, &params),
        ModelConfig::Dien(c) => dien(c, names, &params),
    }
}

fn dlrm(c: &DlrmConfig, names: &InputNames, params: &[ParamTensor]) -> Value {
    let n = c.num_sparse + 1;
    let mut pairs = Vec::new();
    for i in 1..n {
        let upto = if c.self_interaction { i + 1 } else { i };
        pairs.extend((0..upto).map(|j| [i, j]));
    }
    if c.self_interaction {
        pairs.push([0, 0]);
    }
    let vectors: Vec<String> = std::iter::once("bottom".to_string())
        .chain(names.sparse.iter().map(|f| format!("pooled embeddings.{f}")))
        .collect();
    json!({
        "bottom": mlp("bottom", params, true, json!(["dense"])),
        "interaction": {
            "kind": "dot",
            "vectors": vectors,
            "pairs": pairs,
            "output": "concat(vectors[0], [dot(vectors[i], vectors[j]) for [i, j] in pairs])",
        },
        "top": mlp("top", params, false, json!(["interaction"])),
        "logit": "the top MLP's single output",
    })
}

fn fm_family(c: &FmConfig, model: &ModelConfig, names: &InputNames, params: &[ParamTensor]) -> Value {
    let own = &names.sparse[..names.sparse.len() - crosses(model)];
    let mut terms = vec!["linear", "first_order"];
    let mut out = json!({
        "linear": "linear.bias + dense · linear.weightᵀ (linear.weight absent without dense features)",
        "first_order": {
            "fields": names.sparse,
            "formula": "Σ over fields f of pooled first_order.<f> (one value per field)",
        },
    });
    if c.dim > 0 && c.fm {
        terms.push("fm");
        out["fm"] = json!({
            "fields": own,
            "formula": "0.5 · Σ_c ((Σ_f v_f[c])² − Σ_f v_f[c]²), v_f = pooled embeddings.<f>",
        });
    }
    if !c.deep.is_empty() {
        terms.push("deep");
        let input: Vec<String> =
            std::iter::once("dense".to_string()).chain(own.iter().map(|f| format!("pooled embeddings.{f}"))).collect();
        out["deep"] = mlp("deep", params, false, json!(input));
    }
    out["terms"] = json!(terms);
    out["logit"] = json!("the sum of the terms");
    out
}

fn dien(c: &DienConfig, names: &InputNames, params: &[ParamTensor]) -> Value {
    let targets: Vec<&String> = c.target_fields.iter().map(|&f| &names.sparse[f]).collect();
    let mut input: Vec<String> = std::iter::once("dense".to_string())
        .chain(names.sparse.iter().map(|f| format!("pooled embeddings.{f}")))
        .collect();
    input.extend(["u".to_string(), "u ⊙ q".to_string()]);
    let interest = match c.interest {
        Interest::GruAttention => json!({
            "kind": "gru-attention",
            "gru": "torch.nn.GRU(E, E, batch_first=True) with gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, \
                    gru.bias_hh_l0 (gate rows stacked r, z, n), h_0 = 0: r = σ(W_ir x + b_ir + W_hr h + b_hr), \
                    z = σ(W_iz x + b_iz + W_hz h + b_hz), n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)), \
                    h' = (1 − z) ⊙ n + z ⊙ h, over the sample's valid steps",
            "keys": "k_t = h_t + x_t",
            "attention": "s_t = k_tᵀ · attention.weight · q; α = softmax of s over the valid steps; u = Σ_t α_t k_t \
                          (u = 0 for an empty history)",
        }),
        Interest::SumPooling => json!({"kind": "sum-pooling", "formula": "u = Σ_t x_t over the valid steps"}),
    };
    json!({
        "sequences": {
            "tables": targets.iter().map(|f| format!("embeddings.{f}")).collect::<Vec<_>>(),
            "max_len": c.max_len,
            "order": "oldest event first; a longer history keeps its most recent max_len events",
        },
        "x_t": "concat over the sequence fields (in order) of the row of event t in that field's table: width E = \
                num_sequences · dim",
        "q": format!(
            "concat of {} (the target fields, in sequence order)",
            targets.iter().map(|f| format!("pooled embeddings.{f}")).collect::<Vec<_>>().join(", ")
        ),
        "interest": interest,
        "mlp": mlp("mlp", params, false, json!(input)),
        "logit": "the MLP's single output",
    })
}

#[cfg(test)]
mod tests {
    use super::super::names::input_names;
    use super::*;

    /// The pair list is the interaction's output order: lower triangle by rows, and
    /// with self-interaction each row's diagonal then `(0, 0)` last.
    #[test]
    fn dlrm_pairs_follow_the_interaction_order() {
        let c =
            DlrmConfig { num_dense: 2, num_sparse: 2, dim: 3, bottom: vec![3], top: vec![1], self_interaction: false };
        let m = ModelConfig::Dlrm(c.clone());
        let f = forward(&m, &input_names(&m));
        assert_eq!(f["interaction"]["pairs"], json!([[1, 0], [2, 0], [2, 1]]));
        assert_eq!(f["bottom"]["layers"], json!(["bottom.0"]));
        let m = ModelConfig::Dlrm(DlrmConfig { self_interaction: true, ..c });
        let f = forward(&m, &input_names(&m));
        assert_eq!(f["interaction"]["pairs"], json!([[1, 0], [1, 1], [2, 0], [2, 1], [2, 2], [0, 0]]));
    }
}
