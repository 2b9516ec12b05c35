#!/usr/bin/env bash
# Builds the GPU check bundle: everything a machine with a GPU, the CUDA
# libraries and python3 + torch (but no Rust toolchain) needs to prove the GPU
# backend in one go.
#
#   bash scripts/gpu_bundle.sh [DIR]      # default DIR: target/gpu-bundle
#
# DIR then holds the stripped release binary `tiderec`, the stripped GPU test
# executables under `tests/`, the PyTorch reference and benchmark scripts under
# `scripts/`, the Criteo sample under `data/` where `../shared` has it, and `run`,
# which does the whole check there:
#
#   DIR/run OUTDIR [SECONDS]
#
# (see `scripts/gpu_bundle_run.sh`, copied to DIR/run, for what it runs and in
# which order). The bundle must stay under 50 MB; this script fails otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-target/gpu-bundle}"
LIMIT_BYTES=$((50 * 1000 * 1000))

echo "== building the release binary and the GPU test executables" >&2
# `--workspace` for both, as the test command builds: the features of shared
# dependencies are unified over the workspace, so after a test-command build
# nothing is compiled again, and the binary is the one the tests run.
cargo build --release --workspace --bins
# The GPU test executables' paths (every test of tiderec-gpu, and the
# GPU-worker tests of the pipeline crate), from cargo's JSON messages.
LIST="$(cargo test --release --workspace --no-run --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("profile", {}).get("test") or not m.get("executable"):
        continue
    name, package = m["target"]["name"], m["package_id"]
    if "#tiderec-gpu@" in package or name == "gpu_workers":
        print(name, m["executable"])')"

rm -rf "$DIR"
mkdir -p "$DIR/tests" "$DIR/scripts"
strip -o "$DIR/tiderec" target/release/tiderec
while read -r name path; do
    [ -n "$name" ] || continue
    strip -o "$DIR/tests/$name" "$path"
done <<<"$LIST"
for s in bench_vs_torch.py torch_reference.py benchmarks.py gemm_roofline.py gpu_report.py; do
    cp "scripts/$s" "$DIR/scripts/$s"
done
cp scripts/gpu_bundle_run.sh "$DIR/run"
# The Criteo sample for the AUC of step 3c, where `../shared` has it (a GPU machine
# has no copy of it; the bundle is a build output, never part of the repository).
SAMPLE="../shared/data/criteo/sample.train"
if [ -s "$SAMPLE" ]; then
    mkdir -p "$DIR/data"
    cp "$SAMPLE" "$DIR/data/criteo-sample.train"
else
    echo "warning: $SAMPLE not found: step 3c of run will skip the Criteo sample's AUC" >&2
fi
chmod +x "$DIR/run" "$DIR/tiderec" "$DIR"/tests/*
git describe --always --dirty >"$DIR/VERSION" 2>/dev/null || echo unknown >"$DIR/VERSION"

# What `run` needs, all of it.
for f in tiderec run VERSION scripts/bench_vs_torch.py scripts/torch_reference.py scripts/benchmarks.py \
    scripts/gemm_roofline.py scripts/gpu_report.py tests/compile_kernels tests/conformance_embedding \
    tests/conformance_nn tests/conformance_optim tests/device_models tests/device_shard tests/resident \
    tests/gpu_workers; do
    if [ ! -s "$DIR/$f" ]; then
        echo "the bundle lacks $f" >&2
        exit 1
    fi
done
# `run` parses: its shell, and the report's reading of the packed binary's own JSON (a
# short `bench kernels`, step 3h's command), so a changed field fails here, not on the GPU machine.
bash -n "$DIR/run"
KERNELS_JSON="$(mktemp)"
trap 'rm -f "$KERNELS_JSON"' EXIT
"$DIR/tiderec" bench kernels --rows 16 --rounds 1 --seconds 0.002 --json >"$KERNELS_JSON"
LINE="$(python3 "$DIR/scripts/gpu_report.py" --cpu-kernels "$KERNELS_JSON")"
rm -f "$KERNELS_JSON"
case "$LINE" in
    "FMA peak "*) ;;
    *) echo "gpu_report.py cannot read \`tiderec bench kernels --json\`: $LINE" >&2; exit 1 ;;
esac
SIZE=$(du -sb "$DIR" | cut -f1)
echo "bundle: $DIR, $(ls "$DIR/tests" | wc -l) test executables, $SIZE bytes" >&2
ls -l "$DIR" "$DIR/tests" >&2
if [ "$SIZE" -gt "$LIMIT_BYTES" ]; then
    echo "the bundle is $SIZE bytes, over the limit of $LIMIT_BYTES" >&2
    exit 1
fi
