#!/usr/bin/env bash
# The GPU check, run from a bundle built by `scripts/gpu_bundle.sh`, on a
# machine with an NVIDIA GPU, its driver, the CUDA 13 libraries (NVRTC,
# cuBLAS) and python3 with torch; no Rust needed.
#
#   run OUTDIR [SECONDS]     # SECONDS: the time budget, default 600
#
# BENCHES (environment): which benchmarks of steps 3 and 3c to run, a space-separated
# subset of "dlrm-2048 dlrm-16384 dlrm-65536 deepfm-16384 dien-2048 dlrm-16384-tf32
# dlrm-16384-bf16" (default: all).
# TESTS (environment): which test executables of steps 1 and 2 to run, by
# name (default: all); WORKERS_FILTER runs only the GPU-worker tests whose names hold it.
# BENCHES=none runs none of them (any word naming no benchmark does).
# PROFILE=0 skips the phase clock and ncu, NCU=0 ncu alone, STAGES=0 the stage clocks of step 3,
# AUC=0 the AUC runs of step 3c,
# HOTROWS=0 step 3d, GRAPHS=0 step 3e, READAHEAD=0 step 3f, HOSTTHREADS=0 step 3g, CPU=0 step 3b,
# KERNELS=0 step 3h, SCALING=0 step 4.
#
# In order, each step's log in OUTDIR:
#   0. the machine: GPU, driver, CPU (AMX or not), where the CUDA libraries are;
#   1. the kernel conformance and device-model suites, TIDEREC_REQUIRE_GPU=1;
#   2. the GPU-worker equivalence tests against the bundle's binary;
#   3. `tiderec bench` against the PyTorch reference on the same GPU,
#      alternated: DLRM at batch 2,048, 16,384 and 65,536, DeepFM and DIEN;
#   3c. tf32 and bf16 on the GPU: DLRM against PyTorch's, and the AUC of each
#      precision on the Criteo sample (when the bundle holds it) and on synthetic data;
#   3d. DLRM on Zipf-skewed ids, hot rows split against summed by one warp;
#   3e. DLRM with each training step replayed as a CUDA graph against launched kernel by kernel;
#   3f. `tiderec train` on the GPU reading its next micro-batch during the step against at its start;
#   3g. two GPU workers on one GPU, their host work on their share of the cores against one thread;
#   3b. the host CPU against PyTorch at one thread, DLRM at 2,048, fp32 and bf16
#      (PyTorch's bf16 autocast runs on AMX where the CPU has it; CPU=0 skips it);
#   3h. the host CPU's GEMM kernels on one pinned core (`tiderec bench kernels` at 128 and
#      2,048 rows) against the core's fp32 FMA peak and AMX bf16 peak (KERNELS=0 skips it);
#   4. if the budget allows, the CPU scaling section of benchmarks.py, W = 1..16.
# and OUTDIR/summary.txt, one screen, and OUTDIR/report.md (scripts/gpu_report.py),
# the page docs/benchmarks-gpu.md is made of. Every step's time limit is capped by what
# is left of the budget, so the summary and the report are written within it; give a
# budget below the caller's own limit (540 s of a 600 s call, and wrap the call in
# `timeout -k 10 570`: a process the kernel cannot kill still ends the call in time).
# summary.txt is written line by line, so what ran is there even if the call is killed.
# A test executable that fails runs again under compute-sanitizer's memcheck after step 2
# (only its failed tests), while 240 s of the budget are left. Use a fresh OUTDIR.
# Exit status: 0 when every test passed and every benchmark that ran succeeded; the
# last line counts what the budget skipped.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:?usage: run OUTDIR [SECONDS]}"
BUDGET="${2:-600}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
T0=$(date +%s)
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
FAILED=0
say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET - ($(date +%s) - T0))); }
elapsed() { echo $(($(date +%s) - T0)); }
# A step's time limit: LIMIT seconds, or what is left of the budget less a margin for
# the report (at least 5 s, so a step that starts late still gets a chance to fail fast).
cap() { local l=$(( $(left) - 15 )); [ "$l" -lt 5 ] && l=5; echo $(( $1 < l ? $1 : l )); }
SKIPPED=0
skip() { SKIPPED=$((SKIPPED + 1)); say "$1: skipped, budget spent"; }

# ---- 0. the machine and the CUDA libraries -------------------------------
{
    nvidia-smi 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    echo "nproc: $(nproc)"
    grep -m1 'model name' /proc/cpuinfo
    echo "amx_tile cpus: $(grep -c amx_tile /proc/cpuinfo)"
    echo "avx512f cpus: $(grep -c avx512f /proc/cpuinfo)"
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' 2>&1
} >"$OUT/machine.txt" 2>&1
say "bundle $(cat "$HERE/VERSION" 2>/dev/null) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
say "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, amx_tile: $(grep -c amx_tile /proc/cpuinfo)"

# NVRTC and cuBLAS: the loader's cache first, then CUDA's usual folders, then
# the nvidia-* Python wheels (torch's own copies).
need_dir() {
    local lib="$1" d
    # The CUDA 13 library (`.so.13…`): a CUDA 12 copy in the loader's cache does not count.
    if ldconfig -p 2>/dev/null | grep -q "$lib\.13"; then return 0; fi
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 \
        $(python3 -c 'import nvidia, os, glob
print(" ".join(sorted({os.path.dirname(p) for base in nvidia.__path__ for p in glob.glob(os.path.join(base, "*", "lib", "lib*.so*"))})))' 2>/dev/null); do
        if ls "$d"/"$lib".13* >/dev/null 2>&1; then
            export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            return 0
        fi
    done
    say "warning: $lib not found"
}
need_dir libnvrtc.so
need_dir libnvrtc-builtins.so
need_dir libcublas.so
{
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    ldconfig -p | grep -E 'libcuda\.so|nvrtc|cublas' || true
} >>"$OUT/machine.txt"

# Compiled kernels kept for every process of the run (each would otherwise compile them,
# about two seconds of CPU), in a private folder whatever the home folder's permissions.
export TIDEREC_KERNEL_CACHE="${TIDEREC_KERNEL_CACHE:-${TMPDIR:-/tmp}/tiderec-kernels-$(id -u)}"

# Test executables that failed (not by a timeout), and their failed tests, for memcheck.
MEMCHECK=()
# Runs one test executable with a time limit; records its result line.
run_test() {
    local name="$1" limit="$2"
    shift 2
    if [ "$(left)" -lt 30 ]; then
        skip "test $name"
        FAILED=1
        return
    fi
    local log="$OUT/test-$name.log"
    TIDEREC_REQUIRE_GPU=1 TIDEREC_BIN="$HERE/tiderec" RUST_BACKTRACE=1 \
        timeout -k 5 "$(cap "$limit")" "$HERE/tests/$name" "$@" >"$log" 2>&1
    local rc=$?
    local result
    result="$(grep -E '^test result:' "$log" | tail -1)"
    [ -n "$result" ] || result="no result line (exit $rc)"
    [ $rc -eq 0 ] || FAILED=1
    say "$(printf '%-24s exit %-3s %s' "$name" "$rc" "$result")"
    grep -E '^test .* FAILED$|panicked at' "$log" | head -5 | sed 's/^/    /' | tee -a "$SUMMARY" >/dev/null
    # A timeout would most likely hang again under memcheck; gpu_workers runs the binary, not kernels.
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] && [ "$name" != gpu_workers ]; then
        MEMCHECK+=("$name")
    fi
}

# Runs the failed tests of each failed executable again under compute-sanitizer's memcheck.
memcheck_failed() {
    local name tests
    command -v compute-sanitizer >/dev/null || return 0
    for name in "${MEMCHECK[@]+"${MEMCHECK[@]}"}"; do
        if [ "$(left)" -le 240 ]; then
            say "    memcheck of $name: skipped, $(left) s of the budget left (it needs 240)"
            continue
        fi
        # The failed tests by name (`test NAME ... FAILED`); none named: the whole executable.
        tests="$(sed -nE 's/^test (.+) \.\.\. FAILED$/\1/p' "$OUT/test-$name.log" | head -8 | xargs)"
        # shellcheck disable=SC2086
        TIDEREC_REQUIRE_GPU=1 timeout -k 5 "$(cap 90)" compute-sanitizer --tool memcheck --error-exitcode 9 \
            "$HERE/tests/$name" --test-threads=1 ${tests:+--exact $tests} >"$OUT/memcheck-$name.log" 2>&1
        say "    memcheck of $name${tests:+ ($tests)}: exit $? ($(grep -c 'Invalid' "$OUT/memcheck-$name.log") invalid accesses), memcheck-$name.log"
    done
}

# ---- 1. kernel conformance and device models ----------------------------
say "== 1. kernel conformance and device models ($(elapsed) s)"
# TESTS (environment): which test executables to run (default: all).
wanted_test() { [ -z "${TESTS:-}" ] || case " $TESTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
for t in "$HERE"/tests/*; do
    n="$(basename "$t")"
    [ "$n" = gpu_workers ] && continue
    wanted_test "$n" || continue
    # The resident worker's tests capture CUDA graphs: one test at a time, so that no
    # other thread's frees or handles can invalidate a capture.
    threads=4
    [ "$n" = resident ] && threads=1
    run_test "$n" 240 --test-threads=$threads --nocapture
done

# ---- 2. GPU workers against CPU workers ---------------------------------
say "== 2. GPU-worker equivalence ($(elapsed) s)"
# WORKERS_FILTER (environment): run only the GPU-worker tests whose names contain it.
if ! wanted_test gpu_workers; then
    say "gpu_workers: not among TESTS"
elif [ -x "$HERE/tests/gpu_workers" ]; then
    run_test gpu_workers 420 --test-threads=4 --nocapture ${WORKERS_FILTER:+"$WORKERS_FILTER"}
else
    FAILED=1
    say "gpu_workers: the bundle's tests/gpu_workers is missing or not executable"
fi
memcheck_failed

# Where a device-resident worker's step goes: each phase timed (the device waited for after
# each), then kernel by kernel. PROFILE=0 (environment) skips both.
[ "${PROFILE:-1}" = 0 ] && say "phases and kernels skipped: PROFILE=0"
for b in 16384 65536; do
    [ "${PROFILE:-1}" = 0 ] && break
    if [ "$(left)" -lt 60 ]; then
        skip "phases of dlrm batch $b"
        continue
    fi
    timeout -k 5 "$(cap 120)" "$HERE/tiderec" bench dlrm --device cuda:0 --batch-size $b --steps 20 --warmup 3 --json --phases \
        >"$OUT/phases-dlrm-$b.json" 2>"$OUT/phases-dlrm-$b.err" || FAILED=1
    say "dlrm batch $b, phases (ms): $(python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(", ".join(f"{k} {v:.2f}" for k, v in d["phase_ms"].items()))' "$OUT/phases-dlrm-$b.json" 2>/dev/null || echo "no result, see phases-dlrm-$b.err")"
done

# Kernel by kernel (Nsight Compute, one launch each, in a steady-state step), while time allows.
for m in dlrm deepfm; do
    if [ "${PROFILE:-1}" != 0 ] && [ "${NCU:-1}" != 0 ] && command -v ncu >/dev/null && [ "$(left)" -gt 200 ]; then
        sub="$m"
        [ "$m" = dlrm ] || sub="model --model $m"
        # shellcheck disable=SC2086
        timeout -k 5 100 ncu --csv --print-units base --metrics gpu__time_duration.sum --launch-skip 1200 --launch-count 70 \
            "$HERE/tiderec" bench $sub --device cuda:0 --batch-size 16384 --steps 5 --warmup 40 --json \
            >"$OUT/ncu-$m-16384.csv" 2>"$OUT/ncu-$m-16384.err"
        say "kernels of a $m step at 16384 (ncu, exit $?): $(python3 "$HERE/scripts/gpu_report.py" --kernels "$OUT/ncu-$m-16384.csv" 2>&1 | head -1)"
    fi
done

# ---- 3. tiderec against PyTorch on the same GPU -------------------------
say "== 3. bench against PyTorch on cuda:0 ($(elapsed) s)"
bench() {
    local tag="$1"
    shift
    if [ "$(left)" -lt 60 ]; then
        skip "$tag"
        return
    fi
    local limit rounds=3 prev=""
    limit=$(cap 150)
    for a in "$@"; do
        [ "$prev" = --rounds ] && rounds=$a
        prev=$a
    done
    # Each of the rounds' two runs gets its share of the time, so one slow run fails
    # alone and the others still make the table.
    timeout -k 5 "$limit" python3 "$HERE/scripts/bench_vs_torch.py" --tiderec "$HERE/tiderec" --device cuda:0 \
        --timeout $((limit / (2 * rounds + 1))) "$@" >"$OUT/bench-$tag.md" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || FAILED=1
    say "$tag (exit $rc):"
    grep -E '^\| median|^Failed' "$OUT/bench-$tag.md" | head -3 | sed 's/^/    /' | tee -a "$SUMMARY" >/dev/null
}
BENCHES="${BENCHES:-dlrm-2048 dlrm-16384 dlrm-65536 deepfm-16384 dien-2048 dlrm-16384-tf32 dlrm-16384-bf16}"
wanted() { case " $BENCHES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# One device-resident worker, where a host-rows worker's step goes (its stage clock), two
# GPU workers on one GPU with the rows each owns on the device (`two-`) or on the host, and
# one GPU worker under the tiered store on Zipf(1.1) ids, its hot tier on the device or not.
[ "${STAGES:-1}" = 0 ] && say "stage clocks skipped: STAGES=0"
for run in 16384 65536 host-16384 two-16384 two-host-16384 tiered-16384 tiered-host-16384; do
    [ "${STAGES:-1}" = 0 ] && break
    b="${run##*-}"
    flags=""
    case "$run" in two-*) flags="--workers 2" ;; esac
    case "$run" in tiered-*) flags="--hot-rows 65536 --zipf 1.1" ;; esac
    case "$run" in *host-*) flags="$flags --host-rows" ;; esac
    flags="${flags# }"
    if [ "$(left)" -lt 60 ]; then
        skip "stages of dlrm $run"
        continue
    fi
    timeout -k 5 "$(cap 120)" "$HERE/tiderec" bench dlrm --device cuda:0 --batch-size $b --steps 20 --warmup 3 --json $flags \
        >"$OUT/stages-dlrm-$run.json" 2>"$OUT/stages-dlrm-$run.err" || FAILED=1
    say "dlrm batch $b${flags:+ $flags} (ms): $(python3 -c 'import json, sys
d = json.load(open(sys.argv[1])); s = d["stage_ms"][0]
print(round(d["samples_per_sec"]), "samples/s, rows on device:", d.get("rows_on_device"), ", owned rows on device:", d.get("owned_rows_on_device"), ";", ", ".join(f"{k} {v:.1f}" for k, v in s.items()))' "$OUT/stages-dlrm-$run.json" 2>/dev/null || echo "no result, see stages-dlrm-$run.err")"
done
# Timed steps: about half a second of tiderec's steps or more, so that clocks and the
# first steps' costs weigh little (the process start and the tables' set-up are never timed).
wanted dlrm-2048 && bench dlrm-2048 --model dlrm --batch-size 2048 --steps 400 --warmup 20 --rounds 2
wanted dlrm-16384 && bench dlrm-16384 --model dlrm --batch-size 16384 --steps 200 --warmup 20 --rounds 3
wanted dlrm-65536 && bench dlrm-65536 --model dlrm --batch-size 65536 --steps 60 --warmup 5 --rounds 2
wanted deepfm-16384 && bench deepfm-16384 --model deepfm --batch-size 16384 --steps 100 --warmup 10 --rounds 2
wanted dien-2048 && bench dien-2048 --model dien --batch-size 2048 --steps 40 --warmup 5 --rounds 2

# ---- 3c. GPU precisions: tf32 and bf16 products, speed and AUC ----------
# tiderec `--precision tf32|bf16` (cuBLAS tensor-core GEMMs on fp32 buffers) against
# PyTorch with TF32 matrix products and under bf16 autocast; then the AUC of each
# precision on the Criteo sample (8,000 rows train, 2,000 eval, three seeds) and on the
# synthetic teacher stream, one device-resident worker.
say "== 3c. GPU precisions ($(elapsed) s)"
for p in tf32 bf16; do
    wanted "dlrm-16384-$p" && bench "dlrm-16384-$p" --model dlrm --batch-size 16384 --steps 200 --warmup 20 \
        --rounds 2 --precision $p
done
auc_of() { python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
a, l, s = d["auc"], d["logloss"], d["samples_per_sec"]
print(f"AUC {a:.4f}, logloss {l:.4f}, {s:.0f} samples/s")' "$1" 2>/dev/null || echo "no result"; }
[ "${AUC:-1}" = 0 ] && say "AUC runs skipped: AUC=0"
for p in fp32 tf32 bf16; do
    [ "${AUC:-1}" = 0 ] && break
    if [ "$(left)" -lt 60 ]; then
        skip "auc $p"
        continue
    fi
    if [ -s "$HERE/data/criteo-sample.train" ]; then
        for seed in 42 1 2; do
            [ "$(left)" -lt 40 ] && break
            (cd "$OUT" && timeout -k 5 "$(cap 60)" "$HERE/tiderec" train --data "criteo:$HERE/data/criteo-sample.train" \
                --eval-fraction 0.2 --epochs 1 --workers 1 --device cuda:0 --precision $p --seed $seed \
                --progress none --dead-letters "$OUT/dead-letters-$p-$seed.tsv" \
                --metrics-json "$OUT/auc-criteo-$p-$seed.json" >"$OUT/auc-criteo-$p-$seed.log" 2>&1) || FAILED=1
        done
        say "criteo sample $p, seed 42: $(auc_of "$OUT/auc-criteo-$p-42.json")"
    else
        say "criteo sample $p: skipped, the bundle holds no data/criteo-sample.train"
    fi
    (cd "$OUT" && timeout -k 5 "$(cap 90)" "$HERE/tiderec" train --workers 1 --device cuda:0 --precision $p --batch-size 2048 \
        --progress none --metrics-json "$OUT/auc-synthetic-$p.json" >"$OUT/auc-synthetic-$p.log" 2>&1) || FAILED=1
    say "synthetic $p: $(auc_of "$OUT/auc-synthetic-$p.json")"
done

# Alternated runs of two modes, ROUNDS rounds:
#   alternate PREFIX "MODE_A MODE_B" ROUNDS BATCH RUN [args...]
# calls `RUN MODE BATCH BASE args...` for each, which writes BASE.json (BASE is
# OUT/PREFIX-dlrm-BATCH-MODE-ROUND); stops when the budget runs low.
alternate() {
    local prefix=$1 modes=$2 rounds=$3 b=$4 run=$5
    shift 5
    for round in $(seq 1 "$rounds"); do
        for mode in $modes; do
            if [ "$(left)" -lt 40 ]; then
                skip "$prefix $b, round $round"
                return 1
            fi
            "$run" "$mode" "$b" "$OUT/$prefix-dlrm-$b-$mode-$round" "$@" || FAILED=1
        done
    done
}

# A run of `alternate`: `bench dlrm` with the environment variable VAR set to MODE.
#   bench_with MODE BATCH BASE VAR [bench args...]
bench_with() {
    local mode=$1 b=$2 base=$3 var=$4
    shift 4
    env "$var=$mode" timeout -k 5 "$(cap 60)" "$HERE/tiderec" bench dlrm --device cuda:0 --batch-size "$b" \
        --steps $((1600000 / b)) --warmup 5 --json "$@" >"$base.json" 2>"$base.err"
}

# A run of `alternate`: `tiderec train` with `--read-ahead MODE`, one device-resident worker,
# twice: 20 steps, then 320. BASE.json is the longer run's metrics with `samples_per_sec` the
# rate between the two (their samples' difference over their training times' difference), so
# that the first steps' costs (workspaces sized, graphs captured, the first batch made) weigh
# nothing, and `fixed_seconds` what the short run took beyond its steps at that rate.
#   train_read_ahead MODE BATCH BASE
train_read_ahead() {
    local mode=$1 b=$2 base=$3 steps
    for steps in 20 320; do
        (cd "$OUT" && timeout -k 5 "$(cap 60)" "$HERE/tiderec" train --workers 1 --device cuda:0 --batch-size "$b" \
            --samples $((b * steps)) --eval-fraction 0 --read-ahead "$mode" --progress none \
            --dead-letters "$OUT/dead-letters-$(basename "$base")-$steps.tsv" --metrics-json "$base-$steps.json" \
            >"$base-$steps.log" 2>&1) || return 1
    done
    python3 - "$base" <<'PY'
import json, sys
base = sys.argv[1]
short, long = (json.load(open(f"{base}-{n}.json")) for n in (20, 320))
dt, ds = long["train_seconds"] - short["train_seconds"], long["samples"] - short["samples"]
rate = ds / dt if dt > 0 and ds > 0 else 0.0
out = dict(long, whole_run_samples_per_sec=long["samples_per_sec"], samples_per_sec=rate,
           fixed_seconds=short["train_seconds"] - short["samples"] / rate if rate else None)
json.dump(out, open(f"{base}.json", "w"))
PY
}

# ---- 3d. hot rows: a run of duplicates split into chunks, or on one warp --
# DLRM on Zipf(1.1)-skewed ids (a table's top id in about 1 of 10 samples), one
# device-resident worker, the row update's hot runs split (the default) against
# summed by one warp (TIDEREC_GPU_HOT_ROWS=one-warp), alternated, HOT_ROUNDS rounds
# (default 2). HOTROWS=0 skips it.
if [ "${HOTROWS:-1}" = 0 ]; then
    say "== 3d. hot rows skipped: HOTROWS=0"
else
    say "== 3d. hot rows, split against one warp ($(elapsed) s)"
    for b in 16384 65536; do
        alternate hotrows "split one-warp" "${HOT_ROUNDS:-2}" $b bench_with TIDEREC_GPU_HOT_ROWS --zipf 1.1 || break
        say "dlrm batch $b, zipf 1.1 (samples/s): $(python3 "$HERE/scripts/gpu_report.py" --hot-rows "$OUT" $b 2>&1 | head -1)"
    done
fi

# ---- 3e. CUDA graphs: a step replayed as one graph, or launched kernel by kernel --
# DLRM on uniform ids, one device-resident worker, TIDEREC_GPU_GRAPHS=on (the default)
# against off, alternated, GRAPH_ROUNDS rounds (default 2). GRAPHS=0 skips it.
if [ "${GRAPHS:-1}" = 0 ]; then
    say "== 3e. CUDA graphs skipped: GRAPHS=0"
else
    say "== 3e. CUDA graphs, on against off ($(elapsed) s)"
    for b in 2048 16384; do
        alternate graphs "on off" "${GRAPH_ROUNDS:-2}" $b bench_with TIDEREC_GPU_GRAPHS || break
        say "dlrm batch $b (samples/s): $(python3 "$HERE/scripts/gpu_report.py" --graphs "$OUT" $b 2>&1 | head -1)"
    done
fi

# ---- 3f. reading ahead: the trainer's next micro-batch made during the step, or at its start --
# `tiderec train` (not `bench`: the trainer's own step, its data made by the synthetic stream)
# with one device-resident worker, DLRM at batch 16,384, `--read-ahead on` against `off`,
# each the rate between a run of 20 steps and one of 320, alternated, READ_ROUNDS rounds
# (default 2). READAHEAD=0 skips it.
if [ "${READAHEAD:-1}" = 0 ]; then
    say "== 3f. reading ahead skipped: READAHEAD=0"
else
    say "== 3f. tiderec train, reading ahead against in place ($(elapsed) s)"
    b=16384
    alternate readahead "on off" "${READ_ROUNDS:-2}" $b train_read_ahead
    say "tiderec train, dlrm batch $b (samples/s): $(python3 "$HERE/scripts/gpu_report.py" --read-ahead "$OUT" $b 2>&1 | head -1)"
fi

# ---- 3g. a GPU worker among several: its host work on its share of the cores, or on one thread --
# `bench dlrm --workers 2 --device cuda:0` (two GPU workers on one GPU, each keeping its own
# rows on the device; planning, pooling and the rows' gradient sums on the host) at a global
# batch of 32,768, TIDEREC_HOST_THREADS=auto (the default: cores / workers each) against 1,
# alternated, HOST_ROUNDS rounds (default 2). HOSTTHREADS=0 skips it.
if [ "${HOSTTHREADS:-1}" = 0 ]; then
    say "== 3g. host threads skipped: HOSTTHREADS=0"
else
    say "== 3g. two GPU workers, host work on the cores' share against one thread ($(elapsed) s)"
    b=32768
    alternate hostthreads "auto 1" "${HOST_ROUNDS:-2}" $b bench_with TIDEREC_HOST_THREADS --workers 2
    say "dlrm batch $b, 2 GPU workers (samples/s): $(python3 "$HERE/scripts/gpu_report.py" --host-threads "$OUT" $b 2>&1 | head -1)"
fi

# ---- 3b. the host CPU against PyTorch, fp32 and bf16 --------------------
# One worker / one thread, DLRM at batch 2,048: tiderec's CPU kernels against PyTorch
# eager, and tiderec `--precision bf16` against PyTorch's bf16 autocast (oneDNN's AMX
# kernels where the CPU has AMX). CPU=0 (environment) skips it.
if [ "${CPU:-1}" = 0 ]; then
    say "== 3b. host CPU against PyTorch skipped: CPU=0"
else
    say "== 3b. host CPU against PyTorch, fp32 and bf16 ($(elapsed) s)"
    for p in fp32 bf16; do
        if [ $p = bf16 ] && ! grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
            say "cpu $p: skipped, this CPU has neither AVX512-BF16 nor AMX"
            continue
        fi
        if [ "$(left)" -lt 90 ]; then
            skip "cpu $p"
            continue
        fi
        timeout -k 5 "$(cap 80)" python3 "$HERE/scripts/bench_vs_torch.py" --tiderec "$HERE/tiderec" --device cpu \
            --model dlrm --batch-size 2048 --steps 20 --warmup 5 --rounds 2 --precision $p --timeout 70 \
            >"$OUT/cpu-bench-dlrm-2048-$p.md" 2>&1
        rc=$?
        [ $rc -eq 0 ] || FAILED=1
        say "cpu dlrm-2048 $p (exit $rc):"
        grep -E '^\| median|^Failed' "$OUT/cpu-bench-dlrm-2048-$p.md" | head -3 | sed 's/^/    /' | tee -a "$SUMMARY" >/dev/null
    done
fi

# ---- 3h. the host CPU's GEMM kernels against its FMA and AMX peaks --------
# `tiderec bench kernels` at 128 and 2,048 rows (DLRM's MLP products, every candidate
# kernel, the one training chooses, the core's fp32 FMA and AMX bf16 peaks), pinned to
# the last core, as JSON for the report. KERNELS=0 (environment) skips it.
if [ "${KERNELS:-1}" = 0 ]; then
    say "== 3h. host CPU kernels skipped: KERNELS=0"
else
    say "== 3h. host CPU kernels against the core's peaks ($(elapsed) s)"
    core=$(($(nproc) - 1))
    for rows in 128 2048; do
        if [ "$(left)" -lt 75 ]; then
            skip "cpu kernels at $rows rows"
            continue
        fi
        timeout -k 5 "$(cap 120)" taskset -c "$core" "$HERE/tiderec" bench kernels --rows $rows --rounds 3 --json \
            >"$OUT/cpu-kernels-$rows.json" 2>"$OUT/cpu-kernels-$rows.err"
        rc=$?
        [ $rc -eq 0 ] || FAILED=1
        say "cpu kernels at $rows rows (exit $rc): $(python3 "$HERE/scripts/gpu_report.py" --cpu-kernels "$OUT/cpu-kernels-$rows.json" 2>&1 | head -1)"
    done
fi

# ---- 4. CPU scaling on this host ----------------------------------------
if [ "${SCALING:-1}" = 0 ]; then
    say "== 4. CPU scaling skipped: SCALING=0"
elif [ "$(left)" -gt 300 ]; then
    # benchmarks.py writes its page at the end: it needs the time for the whole section.
    say "== 4. CPU scaling, W = 1..16 ($(elapsed) s)"
    timeout -k 5 "$(cap 600)" python3 "$HERE/scripts/benchmarks.py" --only scaling --quick --samples 32768 \
        --max-workers 16 --timeout 60 --tiderec "$HERE/tiderec" --output "$OUT/scaling.md" >"$OUT/scaling.log" 2>&1
    say "scaling: exit $?"
else
    SKIPPED=$((SKIPPED + 1))
    say "== 4. CPU scaling skipped: $(left) s of the budget left (it needs 300)"
fi

python3 "$HERE/scripts/gpu_report.py" "$OUT" >"$OUT/report.md" 2>>"$OUT/summary.txt" ||
    say "the report could not be written"
say "== done in $(elapsed) s; $([ $FAILED -eq 0 ] && echo 'everything that ran passed' || echo 'SOMETHING FAILED: see the logs'); $SKIPPED skipped for the budget"
exit $FAILED
