//! A served model's embedding tables as named tensors, one or two per sparse field.
//!
//! * DLRM and DIEN: `embeddings.<field>` `[rows, dim]` (row `i` = id `i`). A DIEN
//!   sequence field reads a sparse field's table (`item_history` reads
//!   `embeddings.item`) and has none of its own.
//! * LR, FM, DeepFM and Wide & Deep, whose rows are `[w, v₁ … v_k]`:
//!   `first_order.<field>` `[rows, 1]` (the first-order weight `w`) and, when
//!   `k > 0`, `embeddings.<field>` `[rows, k]` (the factor `v`, which the FM term and
//!   the deep part read). A feature cross (wide-only) has only `first_order`:
//!   the model never reads its factor.

use super::names::{crosses, InputNames};
use tiderec_operators::nn::ModelConfig;

/// One table tensor, owning its values.
pub struct TableTensor {
    /// Name in `model.safetensors`.
    pub name: String,
    /// `[rows, width]`: the rows it holds (a whole table's, or the rows a compact export keeps).
    pub shape: Vec<usize>,
    /// `rows × width` values.
    pub values: Vec<f32>,
    /// The embedding table it comes from.
    pub table: usize,
    /// The columns of that table's rows it holds (`first..last`).
    pub columns: std::ops::Range<usize>,
}

/// Splits (or renames) `tables` (one per sparse field, `rows × embedding_dim`
/// each: every row of the table, or the rows a compact export keeps) into the tensors of
/// the module docs, consuming them one at a time so that at most one table is held twice.
pub fn table_tensors(model: &ModelConfig, names: &InputNames, tables: Vec<Vec<f32>>) -> Vec<TableTensor> {
    let e = model.embedding_dim().max(1);
    let first_wide_only = model.num_sparse() - crosses(model);
    let mut out = Vec::new();
    for (f, table) in tables.into_iter().enumerate() {
        let rows = table.len() / e;
        let name = &names.sparse[f];
        match model {
            ModelConfig::Fm(c) => {
                let k = c.dim;
                out.push(TableTensor {
                    name: format!("first_order.{name}"),
                    shape: vec![rows, 1],
                    values: table.iter().step_by(e).copied().collect(),
                    table: f,
                    columns: 0..1,
                });
                if k > 0 && f < first_wide_only {
                    let mut v = Vec::with_capacity(rows * k);
                    for row in table.chunks_exact(e) {
                        v.extend_from_slice(&row[1..]);
                    }
                    out.push(TableTensor {
                        name: format!("embeddings.{name}"),
                        shape: vec![rows, k],
                        values: v,
                        table: f,
                        columns: 1..e,
                    });
                }
            }
            _ => out.push(TableTensor {
                name: format!("embeddings.{name}"),
                shape: vec![rows, e],
                values: table,
                table: f,
                columns: 0..e,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::names::input_names;
    use super::*;
    use tiderec_operators::nn::FmConfig;

    /// FM rows `[w, v₁, v₂]` split into the first-order column and the factors;
    /// the cross keeps only its first-order weights.
    #[test]
    fn fm_rows_split_into_first_order_weights_and_factors() {
        let c = FmConfig { num_dense: 1, num_sparse: 2, dim: 2, deep: vec![3], fm: false, wide_only: 1 };
        let model = ModelConfig::Fm(c);
        let names = input_names(&model, None, None);
        let t = table_tensors(&model, &names, vec![vec![1., 2., 3., 4., 5., 6.], vec![7., 8., 9.]]);
        type Described<'a> = (&'a str, &'a [usize], &'a [f32], usize, std::ops::Range<usize>);
        let got: Vec<Described> = t
            .iter()
            .map(|t| (t.name.as_str(), t.shape.as_slice(), t.values.as_slice(), t.table, t.columns.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("first_order.field_0", &[2, 1][..], &[1., 4.][..], 0, 0..1),
                ("embeddings.field_0", &[2, 2][..], &[2., 3., 5., 6.][..], 0, 1..3),
                ("first_order.cross_0", &[1, 1][..], &[7.][..], 1, 0..1),
            ]
        );
    }
}
