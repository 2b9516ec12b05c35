#!/usr/bin/env bash
# Runs the whole tiderec test suite on a fresh machine.
#
# Installs what the tests need (today: nothing beyond the Rust toolchain and a
# C compiler; the Kafka broker joins with the online-trainer issue), builds in
# release mode (the tests spawn the release binary and train real models), and
# runs every test of every crate, doc tests included.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cc >/dev/null 2>&1; then
    echo "== installing a C compiler (needed by mimalloc)"
    if command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq build-essential
    else
        echo "no C compiler and no apt-get: install gcc or clang first" >&2
        exit 1
    fi
fi

if [ ! -d ../shared/data ]; then
    echo "note: ../shared/data is missing; tests on the real dataset samples will be skipped" >&2
fi

echo "== cargo build --release (workspace, all targets)"
cargo build --release --workspace --all-targets

echo "== cargo test --release (workspace)"
# Two test threads: the machine has two cores and the training tests use both.
cargo test --release --workspace -- --test-threads=2
