//! The public store constructors refuse a place among the workers or a row width
//! no store can hold (no workers, a worker index not below the worker count, rows
//! 0 wide) with a configuration error naming the key, instead of panicking.

use tiderec_operators::optim::{OptimizerParams, SparseOptimizerKind};
use tiderec_operators::shard::EmbeddingShard;
use tiderec_operators::store::{DynamicStore, Store, StoreConfig, StoreKind, StoreParams, TieredStore};
use tiderec_operators::OperatorError;

const TABLES: [u64; 2] = [10, 7];

fn params(worker: usize, workers: usize, dim: usize) -> StoreParams<'static> {
    StoreParams {
        worker,
        workers,
        dim,
        table_sizes: &TABLES,
        seed: 3,
        optimizer: SparseOptimizerKind::RowwiseAdagrad,
        hp: OptimizerParams::with_lr(0.1),
    }
}

/// The places refused, each with the key its error names.
const REFUSED: [((usize, usize, usize), &str); 4] =
    [((0, 0, 4), "workers"), ((2, 2, 4), "worker"), ((5, 2, 4), "worker"), ((0, 1, 0), "dim")];

fn key(e: OperatorError) -> String {
    match e {
        OperatorError::Config(c) => c.key,
        other => panic!("not a configuration error: {other:?}"),
    }
}

#[test]
fn store_new_refuses_no_workers_a_worker_outside_them_and_zero_width_rows() {
    for kind in [StoreKind::Fixed, StoreKind::Dynamic, StoreKind::Tiered] {
        let config = StoreConfig { kind, ..StoreConfig::default() };
        for ((worker, workers, dim), expected) in REFUSED {
            let e = Store::new(&config, &params(worker, workers, dim)).expect_err("refused");
            assert_eq!(key(e), expected, "{kind:?}, worker {worker} of {workers}, dim {dim}");
        }
        assert!(Store::new(&config, &params(1, 2, 4)).is_ok(), "{kind:?}");
    }
}

#[test]
fn the_stores_own_constructors_refuse_them_too() {
    let (dynamic, tiered) = (StoreConfig::default(), StoreConfig { kind: StoreKind::Tiered, ..StoreConfig::default() });
    for ((worker, workers, dim), expected) in REFUSED {
        let p = params(worker, workers, dim);
        let (hp, kind) = (p.hp, p.optimizer);
        let e = EmbeddingShard::new(worker, workers, dim, &TABLES, 3, kind, hp).expect_err("refused");
        assert_eq!(key(e), expected, "shard, worker {worker} of {workers}, dim {dim}");
        assert_eq!(key(DynamicStore::try_new(&dynamic, &p).expect_err("refused")), expected);
        assert_eq!(key(TieredStore::try_new(&tiered, &p).expect_err("refused")), expected);
        assert_eq!(key(p.validate().expect_err("refused")), expected);
    }
    let e = EmbeddingShard::new(0, 0, 4, &TABLES, 3, SparseOptimizerKind::Sgd, OptimizerParams::with_lr(0.1));
    assert_eq!(
        e.expect_err("refused").to_string(),
        "invalid configuration `workers`: rows are sharded over at least 1 worker, got 0"
    );
    let p = params(1, 2, 4);
    assert!(DynamicStore::try_new(&dynamic, &p).is_ok() && TieredStore::try_new(&tiered, &p).is_ok());
    let bad = StoreConfig { max_rows: Some(0), ..StoreConfig::default() };
    assert_eq!(key(DynamicStore::try_new(&bad, &p).expect_err("the store's settings are checked too")), "max_rows");
}
