"""GEMM-only bound of the Kaggle DLRM shape on one core, for comparison with
`tiderec bench dlrm`: times the forward and backward matrix products of every
layer (bottom 13-512-256-64-16, top 367-512-256-1; y = xW, dx = dy Wᵀ, dW = xᵀ dy)
with NumPy's BLAS limited to one thread, and prints GFLOP/s and the samples/s
the products alone would allow. Usage: python3 scripts/gemm_roofline.py [ROWS...]
(rows = samples per worker and step; default 64 128 1024 2048)."""
import os
import sys

os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"
import time  # noqa: E402

import numpy as np  # noqa: E402

LAYERS = [(13, 512), (512, 256), (256, 64), (64, 16), (367, 512), (512, 256), (256, 1)]


def bound(rows, repeats=200):
    rng = np.random.default_rng(0)
    seconds, flops = 0.0, 0
    for k, n in LAYERS:
        x = rng.random((rows, k), dtype=np.float32)
        w = rng.random((k, n), dtype=np.float32)
        dy = rng.random((rows, n), dtype=np.float32)
        for _ in range(5):
            x @ w, dy @ w.T, x.T @ dy
        start = time.perf_counter()
        for _ in range(repeats):
            x @ w, dy @ w.T, x.T @ dy
        seconds += (time.perf_counter() - start) / repeats
        flops += 3 * 2 * rows * k * n
    return flops / seconds / 1e9, rows / seconds


if __name__ == "__main__":
    print("numpy", np.__version__, "(one BLAS thread)")
    for rows in [int(a) for a in sys.argv[1:]] or [64, 128, 1024, 2048]:
        gflops, rate = bound(rows)
        print(f"rows {rows:5d}: {gflops:5.1f} GFLOP/s, {rate:8.0f} samples/s per core from the GEMMs alone")
