//! The `compact_tables` section of `model.json`: how a reader rebuilds the whole tables of
//! an export that keeps only the rows its checkpoint lists (`tiderec export --compact`).
//!
//! A compact export stores each table tensor `T` (`embeddings.<field>`,
//! `first_order.<field>`) as `T.ids` (uint64, sorted) and `T.rows` (float32,
//! `[ids, width]`): the rows some training step changed (or, for a dynamic store,
//! the rows it held). Every other row holds what the checkpoint's loader gives it:
//! either the value every store gives a row no step changed, a counter-based hash
//! of the seed, the table, the id and the column
//! ([`tiderec_operators::store::init_row`]), or zeros (the absent rows of a dynamic
//! store that admits ids only after their first sighting). This section says which, spelling the formula out with its constants, so
//! that the whole table is exactly (bit for bit) the one a whole export writes.
//! `model.json`'s `tensors` keeps each table tensor's whole shape.

use super::tables::TableTensor;
use super::Unlisted;
use serde_json::{json, Value};
use tiderec_operators::store::{init_bound, UNIT_OFFSET};
use tiderec_operators::train::TrainerConfig;

/// The section for the table tensors `tables` of a model of `config` whose unlisted rows
/// hold `unlisted`.
pub fn section(config: &TrainerConfig, tables: &[TableTensor], unlisted: Unlisted) -> Value {
    let tensors: serde_json::Map<String, Value> = tables
        .iter()
        .map(|t| {
            let rows = config.table_sizes[t.table];
            let entry = json!({
                "ids": format!("{}.ids", t.name),
                "rows": format!("{}.rows", t.name),
                "table": t.table,
                "table_rows": rows,
                "columns": [t.columns.start, t.columns.end],
                "bound": init_bound(rows),
            });
            (t.name.clone(), entry)
        })
        .collect();
    let others = match unlisted {
        Unlisted::Seeded => "init",
        Unlisted::Zero => "zero",
    };
    json!({
        "layout": "each tensor T listed here is stored as T.ids (uint64 [k], sorted ascending) and T.rows (float32 \
                   [k, width]): row j of T.rows is row T.ids[j] of T. Every other row of T holds what `others` \
                   says: `init` (its initial value, given by `init`) or `zero`; T's whole shape is under `tensors`",
        "others": others,
        "init": {
            "value": "row i, column j of T = init(table, i, columns[0] + j, bound), the table's and bound of T's entry",
            "formula": "init(t, i, c, bound) = float32((u * 2 - 1) * float64(bound)) with u = (h >> 11) * 2^-53 \
                        in float64 and h = mix64(seed ^ mix64(t ^ mix64((i + offset) ^ mix64(c)))), all integer \
                        arithmetic on 64 bits, wrapping",
            "mix64": super::features::mix64_steps(),
            "seed": config.seed,
            "offset": format!("{UNIT_OFFSET:#018x}"),
            "bound": "float32(1 / sqrt(float32(table_rows))), computed in float32 (each entry's `bound`)",
        },
        "tensors": tensors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiderec_operators::nn::{DlrmConfig, ModelConfig};

    /// The section names each tensor's ids and rows, its table and columns, and the
    /// bound the stores initialise the table with.
    #[test]
    fn names_each_tensor_with_its_table_and_bound() {
        let model = ModelConfig::Dlrm(DlrmConfig { num_sparse: 2, ..DlrmConfig::kaggle() });
        let config = TrainerConfig::builder(model, vec![100, 400]).seed(9).build().unwrap();
        let t =
            TableTensor { name: "embeddings.b".into(), shape: vec![400, 16], values: vec![], table: 1, columns: 0..16 };
        let s = section(&config, &[t], Unlisted::Seeded);
        let e = &s["tensors"]["embeddings.b"];
        assert_eq!((e["ids"].as_str(), e["rows"].as_str()), (Some("embeddings.b.ids"), Some("embeddings.b.rows")));
        assert_eq!(
            (e["table"].as_u64(), e["table_rows"].as_u64(), e["bound"].as_f64()),
            (Some(1), Some(400), Some(f64::from(0.05f32)))
        );
        assert_eq!(s["init"]["seed"].as_u64(), Some(9));
        assert_eq!(s["init"]["offset"], "0x632be59bd9b4e019");
        assert_eq!(s["others"], "init");
    }
}
