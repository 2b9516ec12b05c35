//! Whole-directory tests: write → find → identical parts; corruption and
//! missing files fall back to the previous checkpoint; pruning.

use super::layout::{list_checkpoints, shard_file, DENSE_FILE, MANIFEST_FILE};
use super::write::{create_temp, prune, restore_replaced, write_checkpoint};
use super::*;
use std::collections::BTreeMap;
use std::path::Path;
use tiderec_operators::optim::{DenseOptimizerKind, DenseOptimizerState};
use tiderec_operators::shard::shard_of;
use tiderec_operators::snapshot::{SketchCounters, TableRows, WorkerSnapshot};
use tiderec_operators::train::dense_slice;

const SIZES: [u64; 3] = [9, 1, 30];
const DENSE: usize = 11;

/// The parts of a 2-worker checkpoint at `step` whose values depend on `step`.
fn parts(step: u64) -> Vec<WorkerSnapshot> {
    let workers = 2;
    (0..workers)
        .map(|k| {
            let tables = SIZES
                .iter()
                .enumerate()
                .map(|(t, &n)| {
                    let ids: Vec<u64> = (0..n).filter(|&id| shard_of(t, id, workers) == k).collect();
                    TableRows {
                        rows: ids.iter().flat_map(|&id| [id as f32 + step as f32, -(t as f32), 0.5]).collect(),
                        state: ids.iter().map(|&id| id as f32 * 0.25).collect(),
                        counts: ids.iter().map(|&id| (id % 7) as u32).collect(),
                        hot: ids
                            .iter()
                            .map(|&id| if id < 3 { id as u32 } else { tiderec_operators::snapshot::COLD })
                            .collect(),
                        last_seen: ids.iter().map(|&id| step.saturating_sub(id % 5)).collect(),
                        ids,
                        removed: Vec::new(),
                    }
                })
                .collect();
            let slice = dense_slice(DENSE, k, workers);
            WorkerSnapshot {
                worker: k,
                workers,
                step,
                dim: 3,
                state_width: 1,
                dense_params: if k == 0 { (0..DENSE).map(|i| i as f32 * step as f32).collect() } else { Vec::new() },
                dense_optimizer: DenseOptimizerState {
                    kind: DenseOptimizerKind::Adam,
                    t: step,
                    offset: slice.start,
                    len: slice.len(),
                    m: slice.clone().map(|i| i as f32 * 0.1).collect(),
                    v: slice.map(|i| i as f32 * 0.01 + 1e-7).collect(),
                },
                tables,
                updated_only: false,
                delta_of: None,
                seed: 1,
                table_sizes: Vec::new(),
                // An admission sketch's counters: worker 0's mostly non-zero (written
                // whole), worker 1's mostly zero (written as its non-zero ones).
                admission: SketchCounters::from_dense(
                    &(0..16 + 49 * k as u64)
                        .map(|c| {
                            if k == 0 {
                                (c * step % 7 + 1) as u32
                            } else {
                                u32::from(c % 8 == 0) * (c * step % 7 + 1) as u32
                            }
                        })
                        .collect::<Vec<_>>(),
                ),
            }
        })
        .collect()
}

fn manifest(step: u64) -> Manifest {
    let config = serde_json::json!({"table_sizes": SIZES});
    Manifest {
        format_version: FORMAT_VERSION,
        step,
        epoch: 1,
        steps_in_epoch: step % 7,
        samples: step * 64,
        seed: 3,
        batch_size: 64,
        workers: 2,
        config_hash: config_hash(&config),
        config,
        pipeline: None,
        data_position: DataPosition { epoch: 1, global_steps_in_epoch: step % 7, ..Default::default() },
        progress: TrainingProgress {
            loss_total: 1.5,
            loss_window: vec![(0.5, 64)],
            bad_records_before_epoch: vec![0; 5],
            ..Default::default()
        },
        files: BTreeMap::new(),
        delta: None,
        updated_only: false,
    }
}

fn write(dir: &Path, step: u64, keep: usize) {
    let (path, warnings) = write_checkpoint(dir, &parts(step), manifest(step), keep).unwrap();
    assert!(path.ends_with(format!("ckpt-{step}")));
    assert!(warnings.is_empty(), "{warnings:?}");
}

fn flip_byte(path: &Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    let i = at.min(bytes.len() - 1);
    bytes[i] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn written_checkpoint_reads_back_identically() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 10, 3);
    let search = find_latest(dir.path()).unwrap();
    assert!(search.skipped.is_empty());
    let c = search.found.unwrap();
    assert_eq!(c.parts, parts(10), "every id, row, slot and dense value round-trips");
    let mut expected = manifest(10);
    expected.files = c.manifest.files.clone();
    assert_eq!(c.manifest, expected);
    let names: Vec<&String> = c.manifest.files.keys().collect();
    assert_eq!(names, vec![DENSE_FILE, "shard-0.safetensors", "shard-1.safetensors"]);
    // Nothing but the checkpoint is left in the directory.
    let entries: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(entries, vec!["ckpt-10"]);
}

/// Shards without frequency tensors (checkpoints written before the stores
/// kept them, or of the fixed table) load with empty counts, hot slots and
/// last-use steps; shards written before the last-use steps load with the rest.
#[test]
fn shards_without_frequencies_still_load() {
    let dir = tempfile::tempdir().unwrap();
    let mut old = parts(4);
    for p in &mut old {
        for t in &mut p.tables {
            t.counts.clear();
            t.hot.clear();
            t.last_seen.clear();
        }
        p.admission = Default::default();
    }
    write_checkpoint(dir.path(), &old, manifest(4), 3).unwrap();
    let c = find_latest(dir.path()).unwrap().found.unwrap();
    assert_eq!(c.parts, old);
    let mut before_last_seen = parts(6);
    for p in &mut before_last_seen {
        p.tables.iter_mut().for_each(|t| t.last_seen.clear());
    }
    write_checkpoint(dir.path(), &before_last_seen, manifest(6), 3).unwrap();
    let c = find_latest(dir.path()).unwrap().found.unwrap();
    assert_eq!(c.parts, before_last_seen);
    let all = parts(4);
    assert!(all[0].tables[2].counts.iter().any(|&c| c > 0), "the other tests carry counts");
    assert!(all[0].tables[2].last_seen.iter().any(|&s| s != 4), "and last-use steps");
    assert!(!all[1].admission.value.is_empty(), "and admission counters");
}

/// Rewrites the manifest of checkpoint `p` with another worker count.
fn set_workers(p: &Path, workers: usize) {
    let path = p.join(MANIFEST_FILE);
    let mut m: Manifest = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m.workers = workers;
    std::fs::write(path, serde_json::to_string(&m).unwrap()).unwrap();
}

#[test]
fn damaged_checkpoints_are_skipped_with_the_reason() {
    type Damage = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Damage)> = vec![
        ("checksum mismatch in shard-1.safetensors", Box::new(|p| flip_byte(&p.join(shard_file(1)), 5000))),
        ("checksum mismatch in dense.safetensors", Box::new(|p| flip_byte(&p.join(DENSE_FILE), 100))),
        ("manifest.json is missing", Box::new(|p| std::fs::remove_file(p.join(MANIFEST_FILE)).unwrap())),
        ("manifest.json does not parse", Box::new(|p| flip_byte(&p.join(MANIFEST_FILE), 0))),
        ("cannot read shard-0.safetensors", Box::new(|p| std::fs::remove_file(p.join(shard_file(0))).unwrap())),
        (
            "bytes, the manifest says",
            Box::new(|p| {
                let f = p.join(shard_file(0));
                let mut b = std::fs::read(&f).unwrap();
                b.truncate(b.len() / 2);
                std::fs::write(f, b).unwrap();
            }),
        ),
        (
            "the manifest lists",
            Box::new(|p| {
                let path = p.join(MANIFEST_FILE);
                let mut m: Manifest = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                m.workers = 3;
                std::fs::write(path, serde_json::to_string(&m).unwrap()).unwrap();
            }),
        ),
        // A corrupt worker count is rejected by the number of files, without
        // listing that many names (this used to overflow a capacity or run out of memory).
        (
            "a checkpoint of 18446744073709551615 workers has 18446744073709551615 files",
            Box::new(|p| set_workers(p, usize::MAX)),
        ),
        ("a checkpoint of 1099511627776 workers has", Box::new(|p| set_workers(p, 1 << 40))),
        (
            "a checkpoint of 2 workers has {\"dense.safetensors\", \"shard-0.safetensors\", \"shard-1.safetensors\"}",
            Box::new(|p| {
                let path = p.join(MANIFEST_FILE);
                let mut m: Manifest = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                let entry = m.files.remove("shard-1.safetensors").unwrap();
                m.files.insert("shard-7.safetensors".into(), entry);
                std::fs::write(path, serde_json::to_string(&m).unwrap()).unwrap();
            }),
        ),
    ];
    for (reason, damage) in cases {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), 10, 3);
        write(dir.path(), 20, 3);
        damage(&dir.path().join("ckpt-20"));
        let search = find_latest(dir.path()).unwrap();
        assert_eq!(search.skipped.len(), 1, "{reason}");
        assert!(search.skipped[0].path.ends_with("ckpt-20"));
        let got = search.skipped[0].reason.to_string();
        assert!(got.contains(reason), "expected `{reason}` in `{got}`");
        let c = search.found.expect("falls back to the previous checkpoint");
        assert_eq!(c.manifest.step, 10);
        assert_eq!(c.parts, parts(10));
    }
    // Nothing valid at all: no checkpoint, every one skipped; an absent directory has none.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 10, 3);
    std::fs::remove_file(dir.path().join("ckpt-10").join(DENSE_FILE)).unwrap();
    let search = find_latest(dir.path()).unwrap();
    assert!(search.found.is_none() && search.skipped.len() == 1);
    assert!(find_latest(&dir.path().join("absent")).unwrap().found.is_none());
}

/// A manifest whose data position disagrees with its own top-level epoch, steps in the
/// epoch or worker count is damaged: the search falls back to the checkpoint before it.
#[test]
fn a_manifest_whose_data_position_disagrees_with_itself_is_skipped_as_damage() {
    type Edit = Box<dyn Fn(&mut Manifest)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "`steps_in_epoch` is 6, `data_position.global_steps_in_epoch` is 3",
            Box::new(|m| m.data_position.global_steps_in_epoch = 3),
        ),
        ("`epoch` is 1, `data_position.epoch` is 0", Box::new(|m| m.data_position.epoch = 0)),
        ("`workers` is 2, `data_position.workers` is 1", Box::new(|m| m.data_position.workers = Some(1))),
    ];
    for (reason, edit) in cases {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), 10, 3);
        write(dir.path(), 20, 3);
        let path = dir.path().join("ckpt-20").join(MANIFEST_FILE);
        let mut m: Manifest = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut m);
        std::fs::write(&path, serde_json::to_string(&m).unwrap()).unwrap();
        let search = find_latest(dir.path()).unwrap();
        assert_eq!(search.skipped.len(), 1, "{reason}");
        let skipped = &search.skipped[0];
        let got = skipped.reason.to_string();
        assert!(got.contains(reason) && got.contains("manifest.json"), "expected `{reason}` in `{got}`");
        assert!(skipped.reason.is_damage(), "{got}");
        assert_eq!(search.found.expect("falls back to the previous checkpoint").manifest.step, 10);
    }
    // Recorded and agreeing, the worker count loads.
    let dir = tempfile::tempdir().unwrap();
    let mut m = manifest(20);
    m.data_position.workers = Some(2);
    write_checkpoint(dir.path(), &parts(20), m, 3).unwrap();
    assert_eq!(find_latest(dir.path()).unwrap().found.expect("loads").manifest.data_position.workers, Some(2));
}

#[test]
fn pruning_keeps_the_checkpoint_best_names() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 10, 2);
    super::write::mark_best(dir.path(), 10).unwrap();
    assert_eq!(super::layout::best_step(dir.path()), Some(10));
    for step in [20, 30, 40] {
        write(dir.path(), step, 2);
    }
    let steps: Vec<u64> = list_checkpoints(dir.path()).unwrap().into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, vec![10, 30, 40], "the newest two and the best");
    // The link moves atomically; the old best is then pruned like any other.
    super::write::mark_best(dir.path(), 40).unwrap();
    write(dir.path(), 50, 2);
    let steps: Vec<u64> = list_checkpoints(dir.path()).unwrap().into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, vec![30, 40, 50], "the old best went; the new one is kept beside the newest two");
    assert_eq!(super::layout::best_step(dir.path()), Some(40));
    assert!(dir.path().join("best").join("manifest.json").is_file());
}

#[test]
fn pruning_keeps_the_newest_and_removes_later_steps_and_stale_temporaries() {
    let dir = tempfile::tempdir().unwrap();
    for step in [5, 10, 15, 20] {
        write(dir.path(), step, 2);
    }
    let steps = |d: &Path| list_checkpoints(d).unwrap().into_iter().map(|(s, _)| s).collect::<Vec<_>>();
    assert_eq!(steps(dir.path()), vec![15, 20]);
    // A killed writer's temporary directory (another pid) and a checkpoint from a later step
    // of an interrupted run: both go when the next checkpoint (of step 18) is durable.
    std::fs::create_dir(dir.path().join(".tmp-ckpt-25-999999999")).unwrap();
    write(dir.path(), 18, 2);
    assert_eq!(steps(dir.path()), vec![15, 18]);
    assert!(!dir.path().join(".tmp-ckpt-25-999999999").exists());
    // This process's own temporary directory is not touched by prune.
    let mine = create_temp(dir.path(), 30).unwrap();
    assert!(prune(dir.path(), 18, 2).is_empty());
    assert!(mine.exists());
    // Writing a step that already exists replaces it.
    write(dir.path(), 18, 2);
    assert_eq!(find_latest(dir.path()).unwrap().found.unwrap().manifest.step, 18);
}

#[test]
fn unwritable_directory_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let e = write_checkpoint(&file, &parts(1), manifest(1), 3).unwrap_err().to_string();
    assert!(e.contains("plain-file"), "{e}");
}

/// A delta at `step` after `parent` of a chain from `base`: rows of ids ≡ step (mod 3) of
/// table 2 take the values of `parts(step)`, id 3 of table 0 is removed, and the
/// admission counters that differ from `parts(parent)`'s travel with their values of
/// `parts(step)` (worker 0's most of them, written dense; worker 1's a few, written as
/// they are).
fn write_delta(dir: &Path, step: u64, parent: u64, base: u64) -> Vec<WorkerSnapshot> {
    let whole = parts(step);
    let mut delta = whole.clone();
    for (p, before) in delta.iter_mut().zip(parts(parent)) {
        p.delta_of = Some(parent);
        let (now, before) = (&p.admission, &before.admission);
        let changed: Vec<(u32, u32)> = now
            .index
            .iter()
            .zip(&now.value)
            .filter(|&(i, v)| before.index.binary_search(i).map_or(true, |at| before.value[at] != *v))
            .map(|(&i, &v)| (i, v))
            .collect();
        p.admission = SketchCounters {
            len: now.len,
            index: changed.iter().map(|c| c.0).collect(),
            value: changed.iter().map(|c| c.1).collect(),
            changes_only: true,
        };
        for (t, rows) in p.tables.iter_mut().enumerate() {
            let keep: Vec<usize> = (0..rows.ids.len()).filter(|&i| t == 2 && rows.ids[i] % 3 == step % 3).collect();
            let pick = |v: &[f32], w: usize| keep.iter().flat_map(|&i| v[i * w..(i + 1) * w].to_vec()).collect();
            *rows = TableRows {
                rows: pick(&rows.rows, 3),
                state: pick(&rows.state, 1),
                counts: keep.iter().map(|&i| rows.counts[i]).collect(),
                hot: keep.iter().map(|&i| rows.hot[i]).collect(),
                last_seen: keep.iter().map(|&i| rows.last_seen[i]).collect(),
                ids: keep.iter().map(|&i| rows.ids[i]).collect(),
                removed: if t == 0 && shard_of(0, 3, 2) == p.worker { vec![3] } else { Vec::new() },
            };
        }
    }
    let mut m = manifest(step);
    m.delta = Some(DeltaLink { parent, base });
    write_checkpoint(dir, &delta, m, 100).unwrap();
    delta
}

/// A delta named through a symbolic link elsewhere finds its chain beside the directory
/// the link names; a broken chain's error names the full path of the missing link.
#[test]
fn a_delta_finds_its_chain_through_a_link_and_a_broken_chain_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 10, 100);
    write_delta(dir.path(), 20, 10, 10);
    let elsewhere = tempfile::tempdir().unwrap();
    let link = elsewhere.path().join("latest");
    std::os::unix::fs::symlink(dir.path().join("ckpt-20"), &link).unwrap();
    let c = super::load::load(&link, 20).expect("the chain is found beside the linked directory");
    assert_eq!(c.chain, vec![10, 20]);
    let inside = dir.path().join("ckpt-20").join("..").join("ckpt-20").join(".");
    assert_eq!(super::load::load(&inside, 20).unwrap().chain, vec![10, 20]);
    std::fs::remove_dir_all(dir.path().join("ckpt-10")).unwrap();
    let err = super::load::load(&link, 20).unwrap_err().to_string();
    let missing = std::fs::canonicalize(dir.path()).unwrap().join("ckpt-10");
    assert!(err.contains(&format!("{} of its chain cannot be used", missing.display())), "{err}");
}

/// A chain of two deltas reads as the whole checkpoint of its last step (the
/// scalar oracle applies each delta's rows by id); a damaged middle link makes
/// the later one unusable, with the reason naming the link, and the search falls
/// back to the whole checkpoint; pruning keeps every link a kept delta needs.
#[test]
fn a_delta_chain_reads_whole_falls_back_past_a_damaged_link_and_prunes_as_one() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 10, 100);
    let d20 = write_delta(dir.path(), 20, 10, 10);
    let d30 = write_delta(dir.path(), 30, 20, 10);
    let mut oracle: BTreeMap<(usize, usize, u64), Vec<f32>> = BTreeMap::new();
    for p in parts(10) {
        for (t, rows) in p.tables.iter().enumerate() {
            for (i, &id) in rows.ids.iter().enumerate() {
                oracle.insert((p.worker, t, id), rows.rows[3 * i..3 * i + 3].to_vec());
            }
        }
    }
    for delta in [&d20, &d30] {
        for p in delta {
            for (t, rows) in p.tables.iter().enumerate() {
                for &id in &rows.removed {
                    oracle.remove(&(p.worker, t, id));
                }
                for (i, &id) in rows.ids.iter().enumerate() {
                    oracle.insert((p.worker, t, id), rows.rows[3 * i..3 * i + 3].to_vec());
                }
            }
        }
    }
    let c = find_latest(dir.path()).unwrap().found.unwrap();
    assert_eq!((c.manifest.step, c.chain.clone()), (30, vec![10, 20, 30]));
    let mut got = BTreeMap::new();
    for p in &c.parts {
        assert_eq!((p.step, p.delta_of), (30, None));
        for (t, rows) in p.tables.iter().enumerate() {
            for (i, &id) in rows.ids.iter().enumerate() {
                got.insert((p.worker, t, id), rows.rows[3 * i..3 * i + 3].to_vec());
            }
        }
    }
    assert_eq!(got, oracle);
    assert_eq!(c.parts[0].dense_params, parts(30)[0].dense_params);
    // The deltas' changed admission counters, laid over the base's, are the last step's.
    let changed = |k: usize| d30[k].admission.index.len();
    assert!(changed(0) * 2 >= d30[0].admission.len && changed(1) * 2 < d30[1].admission.len && changed(1) > 0);
    for (p, expected) in c.parts.iter().zip(parts(30)) {
        assert_eq!(p.admission, expected.admission, "worker {}", p.worker);
    }

    // Pruning to one checkpoint keeps the whole chain of ckpt-30.
    assert!(prune(dir.path(), 30, 1).is_empty());
    let steps: Vec<u64> = list_checkpoints(dir.path()).unwrap().into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, vec![10, 20, 30]);

    flip_byte(&dir.path().join("ckpt-20").join(shard_file(1)), 200);
    let search = find_latest(dir.path()).unwrap();
    let reasons: Vec<String> = search.skipped.iter().map(|s| s.reason.to_string()).collect();
    assert_eq!(search.skipped.len(), 2, "{reasons:?}");
    assert!(reasons[0].contains("ckpt-20 of its chain cannot be used: checksum mismatch in shard-1"), "{reasons:?}");
    let c = search.found.unwrap();
    assert_eq!((c.manifest.step, c.parts.clone()), (10, parts(10)));
}

/// A delta whose parent is its own step would replace the checkpoint it needs: the
/// commit refuses it before renaming anything, and the checkpoint stays as it was.
#[test]
fn a_delta_of_its_own_step_is_refused_and_replaces_nothing() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 10, 3);
    let before = std::fs::read(dir.path().join("ckpt-10").join(MANIFEST_FILE)).unwrap();
    let mut m = manifest(10);
    m.delta = Some(DeltaLink { parent: 10, base: 10 });
    let e = write_checkpoint(dir.path(), &parts(10), m, 3).unwrap_err().to_string();
    assert!(e.contains("delta") && e.contains("ckpt-10"), "{e}");
    assert_eq!(std::fs::read(dir.path().join("ckpt-10").join(MANIFEST_FILE)).unwrap(), before);
    assert_eq!(find_latest(dir.path()).unwrap().found.unwrap().manifest.step, 10);
}

/// A replacement cut short between its two renames leaves `.old-ckpt-<step>-<pid>` and no
/// `ckpt-<step>`: the next prune renames it back instead of removing it; a `.old-…` whose
/// checkpoint exists is litter and goes.
#[test]
fn pruning_restores_a_replaced_checkpoint_whose_replacement_never_got_the_name() {
    let dir = tempfile::tempdir().unwrap();
    for step in [10, 20] {
        write(dir.path(), step, 3);
    }
    std::fs::rename(dir.path().join("ckpt-20"), dir.path().join(".old-ckpt-20-999999999")).unwrap();
    std::fs::create_dir(dir.path().join(".old-ckpt-10-999999998")).unwrap();
    let warnings = prune(dir.path(), 20, 3);
    assert!(warnings.iter().any(|w| w.contains("restored") && w.contains(".old-ckpt-20-999999999")), "{warnings:?}");
    let steps: Vec<u64> = list_checkpoints(dir.path()).unwrap().into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, vec![10, 20]);
    assert!(!dir.path().join(".old-ckpt-10-999999998").exists());
    assert_eq!(find_latest(dir.path()).unwrap().found.unwrap().manifest.step, 20);
}

/// A replacement interrupted by a crash of a process whose id this one has again (a
/// container's trainer is often process 1 on every start) is restored all the same, and
/// a leftover of that id beside its checkpoint does not stop the next replacement.
#[test]
fn a_replaced_checkpoint_left_under_this_process_id_is_restored_and_never_blocks_a_replacement() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 10, 3);
    let own = |step: u64| dir.path().join(format!(".old-ckpt-{step}-{}", std::process::id()));
    std::fs::rename(dir.path().join("ckpt-10"), own(10)).unwrap();
    let notes = restore_replaced(dir.path());
    assert!(notes.iter().any(|n| n.contains("restored")), "{notes:?}");
    assert_eq!(find_latest(dir.path()).unwrap().found.unwrap().manifest.step, 10);
    // A stale copy of this id beside a durable ckpt-10, then ckpt-10 written again.
    write(dir.path(), 20, 3);
    std::fs::create_dir(own(20)).unwrap();
    std::fs::write(own(20).join("stale"), b"x").unwrap();
    write(dir.path(), 20, 3);
    assert!(!own(20).exists(), "the stale copy and the replaced checkpoint are gone");
    assert_eq!(find_latest(dir.path()).unwrap().found.unwrap().manifest.step, 20);
}

/// Only damage is judged damage: a newer format version or a read failing for another
/// reason than a missing file may be a valid checkpoint.
#[test]
fn skipped_checkpoints_tell_damage_from_what_could_not_be_judged() {
    let io = |kind| LoadError::Read { file: "dense.safetensors".into(), source: std::io::Error::from(kind) };
    assert!(!LoadError::FormatVersion { version: FORMAT_VERSION + 1 }.is_damage());
    assert!(!io(std::io::ErrorKind::PermissionDenied).is_damage());
    assert!(io(std::io::ErrorKind::NotFound).is_damage());
    assert!(LoadError::NoManifest.is_damage());
    let chain = |source| LoadError::Chain { step: 5, path: "ckpt-5".into(), source: Box::new(source) };
    assert!(!chain(LoadError::FormatVersion { version: FORMAT_VERSION + 1 }).is_damage());
    assert!(chain(LoadError::NoManifest).is_damage());
}
