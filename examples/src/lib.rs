//! Runnable examples of reusing tiderec operators; see the `examples/` directory.
