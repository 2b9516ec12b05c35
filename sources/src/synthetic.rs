//! Synthetic generator (being written).
