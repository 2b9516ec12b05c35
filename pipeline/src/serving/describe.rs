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

/// The `forward` description of `model`, whose sequence fields read the tables
/// `sequence_tables` (see the module docs).
pub fn forward(model: &ModelConfig, names: &InputNames, sequence_tables: &[usize]) -> Value {
    let params = model.param_tensors();
    match model {
        ModelConfig::Dlrm(c) => dlrm(c, names, &params),
        ModelConfig::Fm(c) => fm_family(c, model, names, &params),
        ModelConfig::Dien(c) => dien(c, names, sequence_tables, &params),
        // `load` refuses these before any export is described.
        ModelConfig::Custom(_) => json!({"note": "a model of its program's own: the program describes its forward"}),
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

fn dien(c: &DienConfig, names: &InputNames, sequence_tables: &[usize], params: &[ParamTensor]) -> Value {
    let targets: Vec<&String> = c.target_fields.iter().map(|&f| &names.sparse[f]).collect();
    let mut input: Vec<String> = std::iter::once("dense".to_string())
        .chain(names.sparse.iter().map(|f| format!("pooled embeddings.{f}")))
        .collect();
    input.extend(["u".to_string(), "u ⊙ q".to_string()]);
    let e = c.interest_dim();
    let interest = match c.interest {
        Interest::GruAttention => json!({
            "kind": "gru-attention",
            "gru": {
                "module": format!("torch.nn.GRU({e}, {e}, batch_first=True), one layer, unidirectional"),
                "tensors": ["gru.weight_ih_l0", "gru.weight_hh_l0", "gru.bias_ih_l0", "gru.bias_hh_l0"],
                "gate_order": ["r", "z", "n"],
                "gates": "rows [0, E) of each tensor are the reset gate r, [E, 2E) the update gate z, [2E, 3E) the \
                          candidate n",
                "equations": [
                    "r_t = σ(W_ir x_t + b_ir + W_hr h_{t−1} + b_hr)",
                    "z_t = σ(W_iz x_t + b_iz + W_hz h_{t−1} + b_hz)",
                    "n_t = tanh(W_in x_t + b_in + r_t ⊙ (W_hn h_{t−1} + b_hn))",
                    "h_t = (1 − z_t) ⊙ n_t + z_t ⊙ h_{t−1}",
                ],
                "h_0": "zeros",
                "steps": "t = 1 … L, the record's valid steps only (padding after them changes nothing)",
            },
            "keys": "k_t = h_t + x_t",
            "attention": {
                "score": "s_t = k_tᵀ · attention.weight · q (attention.weight is [E, E])",
                "weights": "α = softmax(s_1 … s_L), computed as exp(s_t − max s) / Σ exp(s − max s)",
                "u": "u = Σ_t α_t k_t; u = 0 for an empty history (L = 0)",
            },
        }),
        Interest::SumPooling => json!({"kind": "sum-pooling", "u": "u = Σ_t x_t over t = 1 … L (0 for L = 0)"}),
    };
    json!({
        "sequences": {
            "fields": names.sequences,
            "tables": sequence_tables.iter().map(|&t| format!("embeddings.{}", names.sparse[t])).collect::<Vec<_>>(),
            "max_len": c.max_len,
            "order": "oldest event first; the records' histories are already cut to their most recent events \
                      (features.max_len)",
            "length": "a record's number of steps L is the length of its first sequence field (every format gives \
                       all of them one length)",
        },
        "x_t": format!(
            "concat over the sequence fields, in order, of the row of event t in that field's table: width E = \
             {} · {} = {e}",
            c.num_sequences, c.dim
        ),
        "q": {
            "fields": targets,
            "formula": "concat of pooled embeddings.<f> over the fields, in order (width E)",
        },
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
        let f = forward(&m, &input_names(&m, None, None), &[]);
        assert_eq!(f["interaction"]["pairs"], json!([[1, 0], [2, 0], [2, 1]]));
        assert_eq!(f["bottom"]["layers"], json!(["bottom.0"]));
        let m = ModelConfig::Dlrm(DlrmConfig { self_interaction: true, ..c });
        let f = forward(&m, &input_names(&m, None, None), &[]);
        assert_eq!(f["interaction"]["pairs"], json!([[1, 0], [1, 1], [2, 0], [2, 1], [2, 2], [0, 0]]));
    }
}
