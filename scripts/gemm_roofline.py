"""GEMM-only bound of the Kaggle DLRM shape on one core, for comparison with
`tiderec bench dlrm` and `tiderec bench kernels`: times the forward and backward
matrix products of every layer (bottom 13-512-256-64-16, top 367-512-256-1;
y = xW, dx = dy Wᵀ, dW = xᵀ dy) with a plain BLAS limited to one thread — NumPy's,
or PyTorch's (`torch.matmul`, which runs Intel's MKL or oneDNN where PyTorch was
built with them) — and prints each product's GFLOP/s and the samples/s the
products alone would allow.

Usage: python3 scripts/gemm_roofline.py [--library numpy|torch] [ROWS...]
(rows = samples per worker and step; default 64 128 1024 2048)."""
import os
import sys

os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"
import time  # noqa: E402

LAYERS = [(13, 512), (512, 256), (256, 64), (64, 16), (367, 512), (512, 256), (256, 1)]


def operands(library, rows, k, n, seed):
    """x (rows × k), w (k × n), dy (rows × n) and a product function writing into `out`."""
    if library == "torch":
        import torch
        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(seed)
        x, w, dy = (torch.rand(shape, generator=g) for shape in ((rows, k), (k, n), (rows, n)))
        return x, w, dy, lambda a, b, out: torch.matmul(a, b, out=out), lambda shape: torch.empty(shape)
    import numpy as np
    rng = np.random.default_rng(seed)
    x, w, dy = (rng.random(shape, dtype=np.float32) for shape in ((rows, k), (k, n), (rows, n)))
    return x, w, dy, lambda a, b, out: np.matmul(a, b, out=out), lambda shape: np.empty(shape, dtype=np.float32)


def products(rows, repeats=200, library="numpy"):
    """Each layer's forward, `dW` and `dx` at `rows` rows: a list of
    {"product", "layer", "gflops"} in layer order (the products of `tiderec bench kernels`)."""
    out = []
    for i, (k, n) in enumerate(LAYERS):
        x, w, dy, matmul, empty = operands(library, rows, k, n, i)
        for name, a, b in (("forward", x, w), ("dW", x.T, dy), ("dx", dy, w.T)):
            result = empty((a.shape[0], b.shape[1]))
            for _ in range(5):
                matmul(a, b, result)
            start = time.perf_counter()
            for _ in range(repeats):
                matmul(a, b, result)
            seconds = (time.perf_counter() - start) / repeats
            out.append({"product": name, "layer": f"{k}->{n}", "gflops": 2 * rows * k * n / seconds / 1e9,
                        "seconds": seconds})
    return out


def summary(rows, repeats=200, library="numpy"):
    """All the products together (GFLOP/s, samples/s), each product, and the library's version."""
    timed = products(rows, repeats, library)
    seconds = sum(p["seconds"] for p in timed)
    flops = sum(3 * 2 * rows * k * n for k, n in LAYERS)
    return {"gflops": flops / seconds / 1e9, "samples_per_sec": rows / seconds, "products": timed,
            "version": version(library)}


def bound(rows, repeats=200, library="numpy"):
    """(GFLOP/s, samples/s) of all the products together."""
    s = summary(rows, repeats, library)
    return s["gflops"], s["samples_per_sec"]


def version(library):
    if library == "torch":
        import torch
        return f"PyTorch {torch.__version__}"
    import numpy
    return f"NumPy {numpy.__version__}"


if __name__ == "__main__":
    args = sys.argv[1:]
    library = "numpy"
    if args[:1] == ["--library"]:
        library, args = args[1], args[2:]
    print(version(library), "(one BLAS thread)")
    for rows in [int(a) for a in args] or [64, 128, 1024, 2048]:
        gflops, rate = bound(rows, library=library)
        print(f"rows {rows:5d}: {gflops:5.1f} GFLOP/s, {rate:8.0f} samples/s per core from the GEMMs alone")
