//! A set of Parquet files read as one dataset, and its split across workers.
//!
//! [`ParquetDataset::open`] reads every file's footer once (shared by all
//! workers of a process through an `Arc`), takes the [`SchemaDescription`]
//! from the files' key-value metadata and checks that every file has every
//! column it names, with the right type. It then enumerates all
//! `(file, row group)` pairs in file order: the *global row-group list*.
//!
//! # Invariants
//!
//! * **Every row group is read by exactly one worker per epoch.**
//!   [`assign_row_groups`] permutes the global list for the epoch (epoch 0
//!   keeps file order; later epochs use a permutation derived from the seed
//!   and the epoch only, so every worker computes the same one) and gives
//!   position `i` of the permuted list to worker `i mod W`. A dataset with
//!   fewer files than workers still uses every worker as long as it has at
//!   least `W` row groups.
//! * **Spans partition rows.** [`span_rows`] keeps rows
//!   `[round(n·from), round(n·to))` of a row group of `n` rows (to the end when
//!   `to = 1`), so spans `(0, f)` and `(f, 1)` partition every row group:
//!   that is how `--eval-fraction` holds out data.
//! * Files are used in the order given; [`list_parquet_files`] sorts by name.

use super::schema::{SchemaDescription, SparseKind, METADATA_KEY};
use crate::error::SourceError;
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::ProjectionMask;
use std::fs::File;
use std::path::{Path, PathBuf};
use tiderec_operators::features::mix64;

/// The `*.parquet` files of `dir` (hidden files excluded), sorted by name.
///
/// Errors name `dir`: it does not exist or cannot be listed, is not a
/// directory, or holds no Parquet file.
pub fn list_parquet_files(dir: &Path) -> Result<Vec<PathBuf>, SourceError> {
    let io_err = |source| SourceError::Io { path: dir.display().to_string(), source };
    let meta = std::fs::metadata(dir).map_err(io_err)?;
    if !meta.is_dir() {
        return Err(SourceError::schema(dir.display(), "is not a directory"));
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err)? {
        let path = entry.map_err(io_err)?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.ends_with(".parquet") && !name.starts_with('.') && path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(SourceError::schema(dir.display(), "holds no *.parquet files"));
    }
    files.sort();
    Ok(files)
}

/// One row group of the global list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowGroupRef {
    /// Index of the file in [`ParquetDataset::paths`].
    pub file: usize,
    /// Row group within the file.
    pub group: usize,
    /// Rows in the row group.
    pub rows: u64,
}

pub(crate) struct DatasetFile {
    pub(crate) path: PathBuf,
    pub(crate) meta: ArrowReaderMetadata,
    /// The label, dense and sparse columns of the description, nothing else.
    pub(crate) projection: ProjectionMask,
}

/// Parquet files read as one dataset; see the [module docs](self).
pub struct ParquetDataset {
    pub(crate) files: Vec<DatasetFile>,
    groups: Vec<RowGroupRef>,
    description: SchemaDescription,
    total_rows: u64,
}

impl std::fmt::Debug for ParquetDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetDataset")
            .field("files", &self.paths().collect::<Vec<_>>())
            .field("row_groups", &self.groups.len())
            .field("rows", &self.total_rows)
            .field("description", &self.description)
            .finish()
    }
}

impl ParquetDataset {
    /// [`list_parquet_files`] of `dir`, then [`open`](Self::open).
    pub fn open_dir(dir: &Path) -> Result<Self, SourceError> {
        Self::open(&list_parquet_files(dir)?)
    }

    /// Reads the footers of `paths` (in this order).
    ///
    /// The description is the `tiderec.schema` metadata of the first file
    /// that has one; every other file that has one must agree. Errors name
    /// the file: unreadable, not Parquet, bad metadata, no file with
    /// metadata, a missing column or one of the wrong type.
    pub fn open(paths: &[PathBuf]) -> Result<Self, SourceError> {
        if paths.is_empty() {
            return Err(SourceError::schema("parquet data", "no files given"));
        }
        let mut metas = Vec::with_capacity(paths.len());
        let mut description: Option<(SchemaDescription, &Path)> = None;
        for path in paths {
            let file =
                File::open(path).map_err(|source| SourceError::Io { path: path.display().to_string(), source })?;
            let meta = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new())
                .map_err(|source| SourceError::Parquet { path: path.display().to_string(), source })?;
            let kv = meta.metadata().file_metadata().key_value_metadata();
            let text = kv.and_then(|kv| kv.iter().find(|e| e.key == METADATA_KEY)).and_then(|e| e.value.as_deref());
            if let Some(text) = text {
                let d = SchemaDescription::from_json(text).map_err(|r| SourceError::schema(path.display(), r))?;
                match &description {
                    None => description = Some((d, path)),
                    Some((first, first_path)) if *first != d => {
                        return Err(SourceError::schema(
                            path.display(),
                            format!("its `{METADATA_KEY}` differs from that of {}", first_path.display()),
                        ))
                    }
                    Some(_) => {}
                }
            }
            metas.push(meta);
        }
        let Some((description, _)) = description else {
            return Err(SourceError::schema(
                paths[0].display(),
                format!(
                    "none of the {} file(s) has `{METADATA_KEY}` key-value metadata; write them with `tiderec \
                     convert` or add the JSON schema description (see docs/data.md)",
                    paths.len()
                ),
            ));
        };
        let mut files = Vec::with_capacity(paths.len());
        let mut groups = Vec::new();
        for (index, (path, meta)) in paths.iter().zip(metas).enumerate() {
            let projection = check_columns(path, &meta, &description)?;
            for (g, rg) in meta.metadata().row_groups().iter().enumerate() {
                // The decoder asserts on these (a corrupt footer): name the file instead.
                for c in rg.columns() {
                    let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
                    if start < 0 || c.compressed_size() < 0 {
                        return Err(SourceError::schema(
                            path.display(),
                            format!(
                                "row group {g}, column `{}`: the footer gives a negative byte range ({start}, {} bytes)",
                                c.column_path(),
                                c.compressed_size()
                            ),
                        ));
                    }
                }
                let rows = u64::try_from(rg.num_rows()).map_err(|_| {
                    SourceError::schema(path.display(), format!("row group {g} has {} rows", rg.num_rows()))
                })?;
                groups.push(RowGroupRef { file: index, group: g, rows });
            }
            files.push(DatasetFile { path: path.clone(), meta, projection });
        }
        let total_rows = groups.iter().map(|g| g.rows).sum();
        Ok(ParquetDataset { files, groups, description, total_rows })
    }

    /// What the files hold.
    pub fn description(&self) -> &SchemaDescription {
        &self.description
    }

    /// The files, in reading order.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|f| f.path.as_path())
    }

    /// The global row-group list (file order, then row-group order).
    pub fn row_groups(&self) -> &[RowGroupRef] {
        &self.groups
    }

    /// Rows over all files.
    pub fn total_rows(&self) -> u64 {
        self.total_rows
    }

    /// Rows of all files within `span` of each row group (see [`span_rows`]).
    pub fn rows_in_span(&self, span: (f64, f64)) -> u64 {
        self.groups.iter().map(|g| span_rows(g.rows, span).count() as u64).sum()
    }
}

/// Checks that the file has every column of `d` with its type; returns the projection on them.
fn check_columns(
    path: &Path,
    meta: &ArrowReaderMetadata,
    d: &SchemaDescription,
) -> Result<ProjectionMask, SourceError> {
    let schema = meta.schema();
    let mut roots = Vec::new();
    for (i, (name, want)) in d.column_types().into_iter().enumerate() {
        let Ok(index) = schema.index_of(name) else {
            let role = if i == 0 {
                "label"
            } else if i <= d.num_dense {
                "dense"
            } else if i <= d.num_dense + d.sparse.len() {
                "sparse"
            } else {
                "sequence"
            };
            return Err(SourceError::schema(
                path.display(),
                format!("no column `{name}` (the schema's {role} column)"),
            ));
        };
        let ty = schema.field(index).data_type();
        let ok = match d.sparse.get(i.wrapping_sub(1 + d.num_dense)) {
            _ if i <= d.num_dense => ty == &DataType::Float32,
            Some(sparse) => sparse.kind.accepts(ty),
            None => SparseKind::List.accepts(ty),
        };
        if !ok {
            return Err(SourceError::schema(path.display(), format!("column `{name}` is {ty}, expected {want}")));
        }
        roots.push(index);
    }
    Ok(ProjectionMask::roots(meta.parquet_schema(), roots))
}

/// The rows `[round(n·from), round(n·to))` of a row group of `rows` rows (to `rows` when `to ≥ 1`).
pub fn span_rows(rows: u64, span: (f64, f64)) -> std::ops::Range<u64> {
    let at = |f: f64| if f >= 1.0 { rows } else { ((rows as f64 * f).round() as u64).min(rows) };
    let (lo, hi) = (at(span.0), at(span.1));
    lo..hi.max(lo)
}

/// The order of `n` row groups in `epoch`: file order in epoch 0, a
/// permutation seeded by `seed` and `epoch` afterwards (Fisher–Yates).
pub fn row_group_order(n: usize, epoch: u64, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if epoch == 0 {
        return order;
    }
    let mut state = mix64(seed ^ mix64(epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x005E_ED0F_E90C));
    for i in (1..n).rev() {
        state = mix64(state.wrapping_add(0x9E37_79B9_7F4A_7C15));
        let j = (state % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// The indices into the global row-group list that worker `worker` of
/// `workers` reads in `epoch`, in reading order (round robin over
/// [`row_group_order`]).
pub fn assign_row_groups(n: usize, epoch: u64, seed: u64, worker: usize, workers: usize) -> Vec<usize> {
    row_group_order(n, epoch, seed).into_iter().skip(worker).step_by(workers.max(1)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignment_covers_every_row_group_once_per_epoch() {
        for n in [0, 1, 2, 5, 10, 37] {
            for workers in 1..=5 {
                for epoch in 0..4 {
                    let mut all: Vec<usize> =
                        (0..workers).flat_map(|w| assign_row_groups(n, epoch, 7, w, workers)).collect();
                    all.sort_unstable();
                    assert_eq!(all, (0..n).collect::<Vec<_>>(), "n {n} workers {workers} epoch {epoch}");
                    for w in 0..workers {
                        let mine = assign_row_groups(n, epoch, 7, w, workers);
                        // Round robin: sizes differ by at most one, and a worker gets a row group whenever n ≥ W.
                        assert!(mine.len() == n / workers || mine.len() == n.div_ceil(workers));
                    }
                }
            }
        }
        // Epoch 0 is file order, round robin.
        assert_eq!(assign_row_groups(10, 0, 7, 1, 3), vec![1, 4, 7]);
        // Later epochs are shuffled, deterministically, differently per epoch and seed.
        let e1 = row_group_order(50, 1, 7);
        assert_eq!(e1, row_group_order(50, 1, 7));
        assert_ne!(e1, (0..50).collect::<Vec<_>>());
        assert_ne!(e1, row_group_order(50, 2, 7));
        assert_ne!(e1, row_group_order(50, 1, 8));
    }

    #[test]
    fn spans_partition_rows() {
        for rows in [0u64, 1, 2, 7, 1000, 65_536] {
            for f in [0.0, 0.1, 0.5, 0.8, 0.999] {
                let (a, b) = (span_rows(rows, (0.0, f)), span_rows(rows, (f, 1.0)));
                assert_eq!(a.start, 0);
                assert_eq!(a.end, b.start);
                assert_eq!(b.end, rows);
            }
        }
    }
}
