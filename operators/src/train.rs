//! Synchronous training on timely (being written).
