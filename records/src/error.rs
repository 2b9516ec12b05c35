//! The error types of this crate, and the configuration error every tiderec crate shares.
//!
//! The rule for every error below the binary: a variant carries typed fields, never a
//! bare message, so a caller matches on what went wrong ([`ShapeError`],
//! [`RestoreError`], [`DataflowError`]) and reads the numbers (table, row id, worker,
//! counts) from the fields; the `Display` text is built from those fields. A
//! configuration value is refused with the one shared [`ConfigError`], which the
//! error types of the other crates wrap unchanged. Only text that arrives from
//! outside as text (a GPU backend's error) stays a `String` field.

use std::fmt;
use thiserror::Error;

/// A configuration value that is out of range or inconsistent with another.
///
/// The one configuration error of tiderec: the error types of the other crates
/// (`SourceError`, `PipelineError`) wrap it unchanged, so a caller matches
/// [`ConfigError::key`] the same way whichever crate refused the value.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("invalid configuration `{key}`: {reason}")]
pub struct ConfigError {
    /// The offending key, as written in a configuration file or on the command line
    /// (`table_sizes`, `model.dim`, `span`, …).
    pub key: String,
    /// Why the value is refused, with the value itself where it helps.
    pub reason: String,
}

impl ConfigError {
    /// A configuration error naming `key`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError { key: key.into(), reason: reason.into() }
    }
}

/// Errors raised by operators, models and configuration checks in this crate.
///
/// A variant that wraps a typed part ([`ConfigError`], [`ShapeError`],
/// [`BatchError`](crate::batch::BatchError), [`RestoreError`], [`DataflowError`])
/// shows that part's message as its own and no cause besides (`transparent`), so
/// a report that prints an error with its causes names each one once.
#[derive(Debug, Error)]
pub enum OperatorError {
    /// A configuration value is out of range or inconsistent.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A batch does not match the shape the model was built for.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// A batch breaks its own invariants (see [`Batch::check`](crate::Batch::check)):
    /// its layout, a value that is not finite, a label outside `[0, 1]`.
    #[error(transparent)]
    Batch(#[from] crate::batch::BatchError),
    /// A checkpoint's state cannot be restored into this trainer.
    #[error(transparent)]
    Restore(#[from] RestoreError),
    /// A buffer's byte size overflows, or the system refused the memory.
    #[error("out of memory: {what}: {reason}")]
    Memory {
        /// The buffer being allocated (`table 3`, `dense optimizer state`, …).
        what: String,
        /// Why it could not be had: its size, and the system's error if one was given.
        reason: String,
    },
    /// The dataflow stopped every worker.
    #[error(transparent)]
    Dataflow(#[from] DataflowError),
    /// A caller's model returned another number of logits than its batch has samples
    /// (the step failed on every worker, as for [`OperatorError::Device`]).
    #[error("the model of worker {worker} returned {logits} logits for a batch of {samples} samples")]
    ModelOutput {
        /// The worker whose model returned them.
        worker: usize,
        /// Logits returned.
        logits: usize,
        /// Samples in the worker's batch.
        samples: usize,
    },
    /// The model's compute device failed (a GPU worker's CUDA error).
    #[error("compute device error on worker {worker}: {message}")]
    Device {
        /// The worker whose model failed.
        worker: usize,
        /// The device backend's description of the failure (it names the device).
        message: String,
    },
}

impl OperatorError {
    /// Shorthand for a configuration error naming `key`.
    pub fn config(key: impl Into<String>, reason: impl Into<String>) -> Self {
        OperatorError::Config(ConfigError::new(key, reason))
    }

    /// Shorthand for a [`OperatorError::Memory`] naming the buffer `what`.
    pub fn memory(what: impl Into<String>, reason: impl Into<String>) -> Self {
        OperatorError::Memory { what: what.into(), reason: reason.into() }
    }
}

/// The number of features of each kind, in a batch or in a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeatureCounts {
    /// Dense features.
    pub dense: usize,
    /// Sparse (categorical) fields.
    pub sparse: usize,
    /// Behaviour-sequence fields.
    pub sequences: usize,
}

impl fmt::Display for FeatureCounts {
    /// `dense / sparse / sequences`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} / {} / {}", self.dense, self.sparse, self.sequences)
    }
}

/// One id-carrying feature of a batch: a sparse field or a behaviour sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeatureSlot {
    /// Sparse field `k` (`Batch::sparse[k]`).
    Field(usize),
    /// Behaviour sequence `k` (`Batch::sequences[k]`).
    Sequence(usize),
}

impl FeatureSlot {
    /// Slot `k` when the sparse fields come first and the sequences after them.
    pub fn nth(k: usize, num_sparse: usize) -> Self {
        if k < num_sparse {
            FeatureSlot::Field(k)
        } else {
            FeatureSlot::Sequence(k - num_sparse)
        }
    }
}

impl fmt::Display for FeatureSlot {
    /// `field k` or `sequence k`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FeatureSlot::Field(k) => write!(f, "field {k}"),
            FeatureSlot::Sequence(k) => write!(f, "sequence {k}"),
        }
    }
}

/// A batch that does not fit the model it is fed to (the trainer's check of every
/// batch before a step; see [`OperatorError::Shape`]).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ShapeError {
    /// The batch has other feature counts than the model.
    #[error(
        "batch has {} dense / {} sparse / {} sequence features, the model expects {model}",
        .batch.dense,
        .batch.sparse,
        .batch.sequences
    )]
    FeatureCounts {
        /// The batch's counts.
        batch: FeatureCounts,
        /// The model's counts.
        model: FeatureCounts,
    },
    /// An id is not below the row count of the table its feature looks up.
    #[error("id {id} of {slot} is outside its table {table} of {rows} rows")]
    IdOutsideTable {
        /// The feature holding the id.
        slot: FeatureSlot,
        /// The id.
        id: u64,
        /// The embedding table the feature looks up.
        table: usize,
        /// The table's rows.
        rows: u64,
    },
    /// A sample has several ids in a field that travels as partial results, which
    /// carry one pooled row per sample.
    #[error(
        "field {field} travels as partial results (exchange `partial`), which needs at most one id \
         per sample, but sample {sample} has {ids}; use `rows` for this field"
    )]
    MultiIdPartial {
        /// The sparse field.
        field: usize,
        /// The sample (its index in the batch).
        sample: usize,
        /// The ids of that sample in that field.
        ids: usize,
    },
    /// A behaviour sequence is longer than the model's `max_len`.
    #[error("sample {sample} has a sequence of {len} items, longer than the model's max_len {max_len}")]
    SequenceTooLong {
        /// The sample (its index in the batch).
        sample: usize,
        /// The items of its sequence.
        len: usize,
        /// The model's longest sequence.
        max_len: usize,
    },
}

/// Why a checkpoint cannot be restored into a trainer (see [`OperatorError::Restore`]).
///
/// Checked before anything is overwritten; every variant names the table, row,
/// worker or counts that disagree.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum RestoreError {
    /// A checkpoint with no worker part.
    #[error("the checkpoint has no parts")]
    NoParts,
    /// The number of parts is not the writers' worker count.
    #[error("{parts} parts for a checkpoint written by {writers} workers")]
    PartCount {
        /// Parts found.
        parts: usize,
        /// Workers of the run that wrote the checkpoint (as the first part says).
        writers: usize,
    },
    /// Two parts come from different runs or steps.
    #[error(
        "part of worker {worker} is from a run of {workers} workers at step {step}, \
         another from {writers} workers at step {first_step}"
    )]
    MixedParts {
        /// The writer of the disagreeing part.
        worker: usize,
        /// The worker count that part names.
        workers: usize,
        /// The step that part names.
        step: u64,
        /// The worker count the first part names.
        writers: usize,
        /// The step the first part names.
        first_step: u64,
    },
    /// A worker wrote two parts, or a part names a worker outside the run.
    #[error("worker {worker} appears twice or is not below {writers}")]
    DuplicateWorker {
        /// The worker the part names.
        worker: usize,
        /// Workers of the run that wrote the checkpoint.
        writers: usize,
    },
    /// A part's rows have other widths than the model's.
    #[error(
        "part of worker {worker} has rows of {dim} values and {state_width} optimizer slots, \
         the model has {expected_dim} and {expected_state_width}"
    )]
    PartRowWidths {
        /// The writer of the part.
        worker: usize,
        /// Values per row in the part.
        dim: usize,
        /// Optimizer slots per row in the part.
        state_width: usize,
        /// Values per row of the model.
        expected_dim: usize,
        /// Optimizer slots per row of the trainer.
        expected_state_width: usize,
    },
    /// A part has another number of tables than the model.
    #[error("part of worker {worker} has {tables} tables, the model has {expected}")]
    TableCount {
        /// The writer of the part.
        worker: usize,
        /// Tables in the part.
        tables: usize,
        /// Tables of the model.
        expected: usize,
    },
    /// A table of a part has per-row frequencies, hot slots or last-use steps for some rows only.
    #[error("table {table} of worker {worker}: {ids} ids but {counts} counts, {hot} hot slots and {last_seen} last-use steps")]
    FrequencyCount {
        /// The table.
        table: usize,
        /// The writer of the part.
        worker: usize,
        /// Row ids in the part's table.
        ids: usize,
        /// Frequencies.
        counts: usize,
        /// Hot-tier slots.
        hot: usize,
        /// Last-use steps.
        last_seen: usize,
    },
    /// A row's last-use step lies after the step of the checkpoint that holds it.
    #[error("table {table} of worker {worker}: row {id} was last used at step {last_seen}, after the checkpoint's step {step}")]
    LastSeenAfterStep {
        /// The table.
        table: usize,
        /// The writer of the part.
        worker: usize,
        /// The row.
        id: u64,
        /// Its last-use step.
        last_seen: u64,
        /// The checkpoint's step.
        step: u64,
    },
    /// A table of a part has other value or slot counts than its ids need.
    #[error("table {table} of worker {worker}: {ids} ids but {values} values and {slots} optimizer slots")]
    PartTableWidths {
        /// The table.
        table: usize,
        /// The writer of the part.
        worker: usize,
        /// Row ids in the part's table.
        ids: usize,
        /// Row values in the part's table.
        values: usize,
        /// Optimizer slots in the part's table.
        slots: usize,
    },
    /// A part holds a row its writer did not own (or one past the table's end).
    #[error(
        "table {table}: row {id} in the part of worker {worker} of {workers} does not belong there \
         (table of {rows} rows)"
    )]
    MisplacedRow {
        /// The table.
        table: usize,
        /// The row id.
        id: u64,
        /// The writer of the part.
        worker: usize,
        /// Workers of the run that wrote the checkpoint.
        workers: usize,
        /// The table's rows.
        rows: u64,
    },
    /// A row appears in two parts, or twice in one.
    #[error("table {table}: row {id} appears twice")]
    DuplicateRow {
        /// The table.
        table: usize,
        /// The row id.
        id: u64,
    },
    /// A checkpoint restored into the fixed store lacks rows.
    #[error(
        "table {table}: {present} of its {rows} rows are in the checkpoint (a checkpoint of a dynamic \
         store restores only into store = dynamic or tiered)"
    )]
    MissingRows {
        /// The table.
        table: usize,
        /// Its rows in the checkpoint.
        present: u64,
        /// The table's rows.
        rows: u64,
    },
    /// A delta's part was given where whole parts are needed: it must first be
    /// applied onto the checkpoint it follows.
    #[error("part of worker {worker} holds only the changes since step {parent}; apply it onto that checkpoint")]
    UnresolvedDelta {
        /// The writer of the part.
        worker: usize,
        /// The step of the checkpoint it follows.
        parent: u64,
    },
    /// A delta does not follow the parts it is applied onto.
    #[error(
        "part of worker {worker} of {workers} follows step {parent:?}; it is applied onto step {base_step} of \
         {base_workers} workers"
    )]
    DeltaParent {
        /// The writer of the delta's part.
        worker: usize,
        /// Workers of the run that wrote the delta.
        workers: usize,
        /// The step the delta follows (`None`: not a delta).
        parent: Option<u64>,
        /// The step of the parts it is applied onto.
        base_step: u64,
        /// Workers of the run that wrote those parts.
        base_workers: usize,
    },
    /// A delta's changed admission counters are of another sketch than its parent's.
    #[error(
        "part of worker {worker} holds changes of an admission sketch of {len} counters, its parent one of {expected}"
    )]
    AdmissionLength {
        /// The writer of the delta's part.
        worker: usize,
        /// Counters in the delta's sketch.
        len: usize,
        /// Counters in the parent's.
        expected: usize,
    },
    /// A part was written by a trainer with other table sizes.
    #[error("part of worker {worker} is of tables of {sizes:?} rows, the model has {expected:?}")]
    TableSizes {
        /// The writer of the part.
        worker: usize,
        /// Its table sizes.
        sizes: Vec<u64>,
        /// The model's.
        expected: Vec<u64>,
    },
    /// A part of updated rows only, whose other rows are seeded with another seed than the trainer's.
    #[error(
        "part of worker {worker} lists only updated rows, the others seeded with {seed}; this trainer seeds \
         with {expected}"
    )]
    Seed {
        /// The writer of the part.
        worker: usize,
        /// The writer's seed.
        seed: u64,
        /// The trainer's.
        expected: u64,
    },
    /// A table of a part lists its rows out of order (ids must ascend).
    #[error("table {table} of worker {worker}: row ids do not ascend")]
    UnsortedRows {
        /// The table.
        table: usize,
        /// The writer of the part.
        worker: usize,
    },
    /// No part carries the dense parameters.
    #[error("no part carries the dense parameters")]
    NoDenseParams,
    /// A part's dense parameters are not the model's count.
    #[error("part of worker {worker} has {len} dense parameters, the model has {expected}")]
    DenseParamCount {
        /// The writer of the part.
        worker: usize,
        /// Dense parameters in the part.
        len: usize,
        /// Dense parameters of the model.
        expected: usize,
    },
    /// No dense-optimizer slice at all.
    #[error("no dense optimizer state")]
    NoOptimizerState,
    /// A dense-optimizer slice has other moment counts than its kind and length need.
    #[error(
        "{optimizer} state of {len} parameters at offset {offset} has {first} first and {second} second \
         moments (expected {expected_first} and {expected_second})"
    )]
    OptimizerMoments {
        /// The optimizer, as configured (`sgd`, `adagrad`, `adam`).
        optimizer: String,
        /// Parameters of the slice.
        len: usize,
        /// The slice's first parameter.
        offset: usize,
        /// First moments held.
        first: usize,
        /// Second moments (or accumulators) held.
        second: usize,
        /// First moments the kind needs.
        expected_first: usize,
        /// Second moments the kind needs.
        expected_second: usize,
    },
    /// Two dense-optimizer slices are of other kinds or update counts.
    #[error("dense optimizer slices disagree: {optimizer} at update {t} vs {other_optimizer} at update {other_t}")]
    OptimizerSlicesDisagree {
        /// The optimizer of the first slice (`sgd`, `adagrad`, `adam`).
        optimizer: String,
        /// The update count of the first slice.
        t: u64,
        /// The optimizer of the disagreeing slice.
        other_optimizer: String,
        /// The update count of the disagreeing slice.
        other_t: u64,
    },
    /// Dense-optimizer slices leave a gap or overlap.
    #[error("dense optimizer slices do not tile the parameters: a slice starts at {start}, expected {expected}")]
    OptimizerSlicesGap {
        /// Where the next slice starts.
        start: usize,
        /// Where it should start (the end of the slices before it).
        expected: usize,
    },
    /// The dense-optimizer slices together cover another length than the model's.
    #[error("dense optimizer state covers {covered} parameters, the model has {params}")]
    OptimizerCoverage {
        /// Parameters the slices cover.
        covered: usize,
        /// Dense parameters of the model.
        params: usize,
    },
    /// The checkpoint's dense optimizer is not the trainer's.
    #[error("dense optimizer state is {found}, the trainer uses {expected}")]
    OptimizerKind {
        /// The checkpoint's optimizer (`sgd`, `adagrad`, `adam`).
        found: String,
        /// The trainer's optimizer.
        expected: String,
    },
    /// A restored row names a table the model does not have.
    #[error("table {table} does not exist")]
    NoSuchTable {
        /// The table.
        table: usize,
    },
    /// A restored row is not owned by the worker it is restored into (or is past the table's end).
    #[error("row {id} of table {table} is not owned by worker {worker} of {workers} (table of {rows} rows)")]
    NotOwned {
        /// The table.
        table: usize,
        /// The row id.
        id: u64,
        /// The worker restoring it.
        worker: usize,
        /// Workers of the restoring run.
        workers: usize,
        /// The table's rows.
        rows: u64,
    },
    /// A restored row has other widths than the store's rows.
    #[error(
        "row {id} of table {table} has {values} values and {slots} optimizer slots, \
         expected {expected_values} and {expected_slots}"
    )]
    RowWidths {
        /// The table.
        table: usize,
        /// The row id.
        id: u64,
        /// Values given.
        values: usize,
        /// Optimizer slots given.
        slots: usize,
        /// Values per row of the store.
        expected_values: usize,
        /// Optimizer slots per row of the store.
        expected_slots: usize,
    },
}

/// Why online training stopped every worker (see [`OperatorError::Dataflow`]).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum DataflowError {
    /// Workers reported a failure (a batch that did not fit, a device error) in a step.
    #[error("{failed_workers} worker(s) failed at online step {step}")]
    StepFailed {
        /// The online step (1-based).
        step: u64,
        /// Workers that failed in it.
        failed_workers: u64,
    },
    /// A step found a non-finite loss, gradient or parameter.
    #[error("online step {step} found a non-finite loss, gradient or parameter; the model is ruined")]
    NonFinite {
        /// The online step (1-based).
        step: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_built_from_the_fields() {
        let e = OperatorError::from(ShapeError::FeatureCounts {
            batch: FeatureCounts { dense: 3, sparse: 2, sequences: 0 },
            model: FeatureCounts { dense: 2, sparse: 2, sequences: 0 },
        });
        assert_eq!(e.to_string(), "batch has 3 dense / 2 sparse / 0 sequence features, the model expects 2 / 2 / 0");
        let e =
            OperatorError::from(ShapeError::IdOutsideTable { slot: FeatureSlot::nth(3, 2), id: 9, table: 4, rows: 8 });
        assert_eq!(e.to_string(), "id 9 of sequence 1 is outside its table 4 of 8 rows");
        let e = OperatorError::from(RestoreError::NotOwned { table: 1, id: 5, worker: 0, workers: 2, rows: 10 });
        assert_eq!(e.to_string(), "row 5 of table 1 is not owned by worker 0 of 2 (table of 10 rows)");
        let e = OperatorError::from(DataflowError::StepFailed { step: 3, failed_workers: 1 });
        assert_eq!(e.to_string(), "1 worker(s) failed at online step 3");
        let e = OperatorError::from(crate::batch::BatchError::LabelOutOfRange { sample: 2, label: -1.0 });
        assert_eq!(e.to_string(), "sample 2: the label -1 is outside [0, 1]");
    }

    /// The error and its causes, as a report that prints every cause shows them.
    fn chain(e: &dyn std::error::Error) -> Vec<String> {
        std::iter::successors(Some(e), |e| e.source()).map(|e| e.to_string()).collect()
    }

    #[test]
    fn a_wrapped_part_is_named_once_in_the_chain_of_causes() {
        let batch = crate::batch::BatchError::NonFinite { sample: 0, value: crate::batch::BatchValue::Label };
        let errors = [
            OperatorError::from(ShapeError::SequenceTooLong { sample: 1, len: 9, max_len: 4 }),
            OperatorError::from(batch),
            OperatorError::from(RestoreError::NoParts),
            OperatorError::from(DataflowError::NonFinite { step: 2 }),
            OperatorError::config("model.dim", "must be positive"),
        ];
        for e in errors {
            let chain = chain(&e);
            assert_eq!(chain.len(), 1, "one message, no cause repeating it: {chain:?}");
        }
        let e = OperatorError::from(crate::batch::BatchError::NonFinite {
            sample: 0,
            value: crate::batch::BatchValue::Label,
        });
        assert_eq!(e.to_string(), "sample 0: the label is not a finite number", "no talk of a shape");
    }
}
