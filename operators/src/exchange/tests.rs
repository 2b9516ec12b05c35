use super::*;
use crate::batch::Batch;
use crate::nn::FmPartial;

fn batch(ids: &[&[u64]]) -> Batch {
    let mut b = Batch::new(0, ids.len());
    for i in 0..ids[0].len() {
        b.labels.push(0.0);
        for (t, col) in ids.iter().enumerate() {
            b.sparse[t].ids.push(col[i]);
            b.sparse[t].close_bag();
        }
    }
    b
}

#[test]
fn partial_slot_entries_walk_the_bitmap_in_order() {
    let mut slot = PartialSlot::new(130, 4, true);
    for (s, i) in [(0usize, 3u32), (63, 1), (64, 0), (129, 2)] {
        slot.push(s, i, s as f32);
    }
    let got: Vec<_> = slot.entries().collect();
    assert_eq!(got, vec![(0, 3, 0.0), (63, 1, 63.0), (64, 0, 64.0), (129, 2, 129.0)]);
    assert_eq!(slot.wire_bytes(), 3 * 8 + 4 * 2 + 4 * 4);
    let mut wide = PartialSlot::new(130, 70_000, false);
    wide.push(5, 69_999, 1.0);
    assert_eq!(wide.entries().collect::<Vec<_>>(), vec![(5, 69_999, 1.0)]);
    assert_eq!(wide.wire_bytes(), 3 * 8 + 4);
}

#[test]
fn the_planner_counts_bytes_like_the_trainer_and_prefers_the_cheaper_strategy() {
    // Table 0: one id everywhere (cheap as rows after de-duplication); tables 1–3: all distinct.
    let ids0: Vec<u64> = vec![3; 64];
    let ids1: Vec<u64> = (0..64).collect();
    let ids2: Vec<u64> = (64..128).collect();
    let batches = vec![(0usize, batch(&[&ids0, &ids1, &ids1, &ids1])), (1, batch(&[&ids0, &ids2, &ids2, &ids2]))];
    let sizes = [10u64, 1000, 1000, 1000];
    let input = PlanInput {
        workers: 2,
        row_width: 17,
        table_sizes: &sizes,
        partial: Some(FmPartial { dim: 16, fm: true, deep: None }),
        replicate_fraction: 0.0,
        batches: &batches,
    };
    let plan = plan_exchange(&input);
    // Table 0: id 3 lives on worker (3 + 0) % 2 = 1, remote for the batch of worker 0 only.
    let rows0 = (4.0 + 8.0 * 17.0) / 128.0;
    assert!((plan.costs[0].rows - rows0).abs() < 1e-9, "{:?}", plan.costs[0]);
    // Without de-duplication all 64 occurrences in worker 0's batch would travel.
    assert!((plan.costs[0].rows_without_dedup - 64.0 * (4.0 + 8.0 * 17.0) / 128.0).abs() < 1e-9);
    // Distinct ids: the same either way.
    assert!((plan.costs[1].rows_without_dedup - plan.costs[1].rows).abs() < 1e-9);
    // Table 1: half of each batch's 64 distinct ids are remote.
    let rows1 = 2.0 * 32.0 * (4.0 + 8.0 * 17.0) / 128.0;
    assert!((plan.costs[1].rows - rows1).abs() < 1e-9, "{:?}", plan.costs[1]);
    // Partial: per remote sample an index, per remote id its id, a bitmap per batch.
    let partial1 = 2.0 * (32.0 * (2.0 + 4.0) + 8.0) / 128.0;
    assert!((plan.costs[1].partial.unwrap() - partial1).abs() < 1e-9, "{:?}", plan.costs[1]);
    // The three wide tables save more than the partial results' shared cost (2 × 4 × 17 bytes).
    assert_eq!(plan.partial_fixed, 136.0);
    assert_eq!(plan.tables[0], TableExchange::Rows);
    assert!(plan.tables[1..].iter().all(|&t| t == TableExchange::Partial), "{:?}", plan.tables);
    assert!((plan.estimated - (rows0 + 3.0 * partial1 + 136.0)).abs() < 1e-9);
    assert!(plan.estimated < plan.estimated_rows);
    // With one wide table the saving does not cover the shared cost: rows everywhere.
    let one: Vec<(usize, Batch)> =
        batches.iter().map(|(h, b)| (*h, Batch { sparse: b.sparse[..2].to_vec(), ..b.clone() })).collect();
    let plan1 = plan_exchange(&PlanInput { table_sizes: &sizes[..2], batches: &one, ..input.clone() });
    assert_eq!(plan1.tables, vec![TableExchange::Rows; 2]);
    // Replicating 1% of table 1 = 10 rows: the most frequent (all tie at 1: the smallest ids).
    let plan = plan_exchange(&PlanInput { replicate_fraction: 0.01, partial: None, ..input });
    assert_eq!(plan.hot_candidates[1], (0..10).collect::<Vec<u64>>());
    assert_eq!(plan.hot_candidates[0], vec![3]);
    // Table 0's one hot row: each batch sends its gradient (4-byte index + row) to the other worker,
    // what `rows` costs on two workers (the request, row and gradient of one batch of the two).
    assert!((plan.costs[0].replicated - 2.0 * (4.0 + 4.0 * 17.0) / 128.0).abs() < 1e-9, "{:?}", plan.costs[0]);
    assert!(plan.replicated[0].is_empty());
    assert_eq!(plan.costs[0].replicated_hit_ratio, 1.0);
    assert!(plan.costs.iter().all(|c| c.partial.is_none()));
    assert!(plan.describe().contains("estimated bytes/sample"));
}
