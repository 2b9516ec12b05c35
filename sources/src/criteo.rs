//! Criteo TSV reader (being written).
