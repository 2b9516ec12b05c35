#!/usr/bin/env python3
"""PyTorch eager reference for `tiderec bench dlrm` and `tiderec bench model`.

Trains, in PyTorch eager mode, the models `tiderec bench` trains, on inputs of
the same shapes, with the same optimizers and hyper-parameters, and prints
training samples per second. `scripts/bench_vs_torch.py` runs it alternated
with `tiderec bench` and prints the ratio.

What is the same as `tiderec bench` (pipeline/src/cli/bench/dlrm.rs):

* dlrm: 26 tables x `--rows` (100,000) rows, dim 16, one id per table per
  sample, 13 dense features; bottom MLP 13-512-256-64-16 with ReLU after
  every layer, pairwise dot interaction of the bottom output and the 26
  pooled vectors without self-interaction (16 + 351 = 367 wide, lower
  triangle in row order), top MLP 367-512-256-1 with ReLU between layers.
* deepfm: 26 tables x `--rows` rows of width 17 (a first-order weight and a
  16-wide factor), 13 dense features; logit = b + a.x + sum of first-order
  weights + FM term over the factors + MLP([x, v_1 .. v_26]) with hidden
  widths 400-400-400 and an output layer of 1.
* dien: the synthetic behaviour stream's shape: user (20,000 rows), item
  (40 x 250 = 10,000 rows) and category (40 rows) tables, dim 16, no dense
  features; histories of 1..=20 (item, category) steps, reading the item
  and category tables; GRU 32 -> 32 (torch.nn.GRU gate layout, which is
  tiderec's), keys h_t + x_t, bilinear softmax attention against the target
  (item, category) with W initialised to I / sqrt(32), MLP over [pooled
  user/item/category, u, u * q] = 112-200-80-1.
* Loss: mean binary cross-entropy on logits (tiderec sums and scales the
  gradient by 1 / batch: the same gradient).
* Dense optimizer: `--optimizer` (tiderec's default `adagrad`; `adam`,
  `sgd`), lr 0.01, eps 1e-8, betas (0.9, 0.999), zero initial accumulator:
  torch.optim.Adagrad / Adam / SGD compute tiderec's update formulas.
* Embedding optimizer: row-wise Adagrad, lr 0.01, eps 1e-8, written here
  (torch.optim.Adagrad on a sparse gradient is element-wise): per step the
  sparse gradient of the embedding weight is coalesced (one summed gradient
  per distinct row), each touched row's accumulator grows by the mean of its
  squared gradient, and the row moves by lr / (sqrt(acc) + eps) times its
  gradient. Rows not in the batch are not touched.
* Initialisation laws: linear weights N(0, 2 / (in + out)), biases
  N(0, 1 / out); embedding rows U(-1/sqrt(rows), 1/sqrt(rows)) per table;
  DeepFM's dense linear weights N(0, 0.01^2) and bias 0; GRU U(-1/sqrt(H),
  1/sqrt(H)).
* Batches: 8 batches generated before timing and cycled; `--warmup` untimed
  steps (default 20), then `--steps` timed steps (default max(200,000 /
  batch, 50)); samples/s = steps x batch / seconds.

Deliberate differences:

* Random streams: ids, dense values and labels follow the same laws (ids
  uniform over the rows, dense values uniform on [0, 5), labels Bernoulli
  0.25 for dlrm/deepfm; the behaviour stream's Markov interests, Zipf(1.05)
  items per category and teacher, each user's home category a random
  one) but come from torch's generator, not tiderec's counter-based
  generators, and so do the initial weights: same shapes and laws, not
  the same numbers.
* Embeddings: the tables of a model are one `torch.nn.functional.embedding`
  weight (table t's rows at an offset), so a step does one gather and one
  sparse gradient for all tables instead of one `nn.EmbeddingBag` per table
  (the faster eager form; with one id per table a sum-pooled bag is the row).
* DIEN's GRU runs over the padded [B, 20, 32] batch (cuDNN / oneDNN's fused
  GRU) instead of stopping each row at its length; padded steps get no
  attention weight, so the valid states, the logits and every gradient are
  those of the masked GRU; only the work on padding differs.
* tiderec runs `--workers` timely workers that exchange rows and reduce
  gradients; this script runs one process with `--threads` intra-op threads
  (torch.set_num_threads), the usual way PyTorch trains on one machine.
* OpenMP threads wait passively (OMP_WAIT_POLICY=PASSIVE) unless the
  environment or `--omp-wait-policy active` says otherwise: on a machine
  shared with other processes, spinning threads that lose their core stall
  every parallel region (on a loaded 2-core machine 2 spinning threads ran
  DLRM an order of magnitude slower than 1 thread).
* The dense optimizer runs torch's fused kernel (`fused=True`, the same
  update) where this torch has one; `--fused-optimizer off` for the default
  per-tensor loop.
* On CUDA the batches are copied to the device before timing (tiderec's
  are in memory too); the clock is read after torch.cuda.synchronize().
  `--compile` applies torch.compile to the dense part; off by default: eager
  is the baseline.

Learning check: the JSON carries the mean loss of the first and the last
pass over the batch pool and the loss on one held-out batch of the same law
before and after training. With the default pool of 8 batches the models
fit those batches (and dlrm/deepfm labels are independent of the features);
`--pool N` with N >= steps trains on fresh batches, where dien's held-out
loss falls because its labels come from the behaviour teacher.

torch is imported after the arguments are parsed, so `--help` and
`--print-config` work where torch is not installed.
"""

import argparse
import json
import math
import os
import platform
import sys
import time

MODELS = ("dlrm", "deepfm", "dien")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="PyTorch eager training throughput of tiderec bench's models (see the module docstring).",
    )
    p.add_argument("--model", choices=MODELS, default="dlrm")
    p.add_argument("--batch-size", type=int, default=128, help="global batch size (default 128, as tiderec bench)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default max(200000 / batch, 50))")
    p.add_argument("--warmup", type=int, default=20, help="untimed warm-up steps (default 20)")
    p.add_argument("--threads", type=int, default=1, help="intra-op CPU threads (torch.set_num_threads)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--rows", type=int, default=100_000, help="rows per table for dlrm and deepfm (default 100000)")
    p.add_argument("--optimizer", choices=("adagrad", "adam", "sgd"), default="adagrad",
                   help="dense optimizer (default adagrad, as tiderec bench)")
    p.add_argument("--compile", action="store_true", help="torch.compile the dense part (default: eager)")
    p.add_argument("--precision", choices=("fp32", "bf16", "tf32"), default="fp32",
                   help="bf16: the dense model's forward under torch.autocast(bfloat16), which oneDNN runs on "
                        "AMX where the CPU has it; the loss and every parameter stay fp32. tf32 (GPU only): "
                        "fp32 matrix products on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32) "
                        "(default fp32)")
    p.add_argument("--omp-wait-policy", choices=("passive", "active"), default=None,
                   help="OMP_WAIT_POLICY for torch's OpenMP threads (default: the environment's, else passive)")
    p.add_argument("--fused-optimizer", choices=("on", "off"), default="on",
                   help="the dense optimizer's fused kernel (fused=True) where this torch has one (default on)")
    p.add_argument("--pool", type=int, default=8,
                   help="distinct training batches, cycled (default 8, as tiderec bench; more to check learning)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--print-config", action="store_true",
                   help="print the model shape and parameter counts (no torch needed) and exit")
    a = p.parse_args(argv)
    if a.batch_size < 1:
        p.error("--batch-size must be positive")
    if a.steps is not None and a.steps < 1:
        p.error("--steps must be positive")
    if a.warmup < 0:
        p.error("--warmup must not be negative")
    if a.threads < 1:
        p.error("--threads must be positive")
    if a.rows < 1:
        p.error("--rows must be positive")
    if a.pool < 1:
        p.error("--pool must be positive")
    if a.precision == "tf32" and not a.device.startswith("cuda"):
        p.error("--precision tf32 runs on a GPU (--device cuda[:N]) only")
    if not (a.device == "cpu" or a.device.startswith("cuda")):
        p.error(f"--device must be cpu or cuda[:N], got {a.device!r}")
    if a.steps is None:
        a.steps = max(200_000 // a.batch_size, 50)
    return a


# ---------------------------------------------------------------- shapes


def model_shape(model, rows):
    """The shape `tiderec bench` trains, as plain data."""
    if model == "dlrm":
        return {"num_dense": 13, "tables": [rows] * 26, "dim": 16, "bottom": [512, 256, 64, 16],
                "top": [512, 256, 1], "self_interaction": False}
    if model == "deepfm":
        return {"num_dense": 13, "tables": [rows] * 26, "dim": 16, "row_width": 17, "deep": [400, 400, 400]}
    if model == "dien":
        return {"num_dense": 0, "tables": [20_000, 40 * 250, 40], "dim": 16, "sequence_tables": [1, 2],
                "target_fields": [1, 2], "max_len": 20, "mlp": [200, 80], "categories": 40,
                "items_per_category": 250, "drift": 0.3}
    raise ValueError(model)


def mlp_params(widths):
    return sum(i * o + o for i, o in zip(widths, widths[1:]))


def param_counts(model, shape):
    """(dense, embedding) parameter counts, by tiderec's formulas."""
    d = shape["dim"]
    if model == "dlrm":
        n = len(shape["tables"]) + 1
        inter = d + n * (n - 1) // 2
        dense = mlp_params([shape["num_dense"]] + shape["bottom"]) + mlp_params([inter] + shape["top"])
        return dense, sum(shape["tables"]) * d
    if model == "deepfm":
        deep_in = shape["num_dense"] + len(shape["tables"]) * d
        dense = 1 + shape["num_dense"] + mlp_params([deep_in] + shape["deep"] + [1])
        return dense, sum(shape["tables"]) * shape["row_width"]
    e = len(shape["sequence_tables"]) * d
    mlp_in = shape["num_dense"] + len(shape["tables"]) * d + 2 * e
    dense = 3 * e * (e + e + 2) + e * e + mlp_params([mlp_in] + shape["mlp"] + [1])
    return dense, sum(shape["tables"]) * d


# ---------------------------------------------------------------- data


def flat_batches(torch, shape, batch, seed, pool=8):
    """dlrm / deepfm: one uniform id per table, dense U[0, 5), labels Bernoulli(0.25)."""
    g = torch.Generator().manual_seed(seed)
    tables = torch.tensor(shape["tables"], dtype=torch.int64)
    offsets = torch.cumsum(tables, 0) - tables
    out = []
    for _ in range(pool):
        ids = (torch.rand(batch, len(tables), generator=g, dtype=torch.float64) * tables).long() + offsets
        dense = torch.rand(batch, shape["num_dense"], generator=g) * 5.0
        labels = (torch.rand(batch, generator=g) < 0.25).float()
        out.append({"ids": ids, "dense": dense, "labels": labels})
    return out


def behavior_batches(torch, shape, batch, seed, pool=8):
    """dien: the law of tiderec's synthetic behaviour stream (sources/src/synthetic_behavior.rs)."""
    g = torch.Generator().manual_seed(seed)
    users, items, _ = shape["tables"]
    ipc, ncat, max_len, drift = shape["items_per_category"], shape["categories"], shape["max_len"], shape["drift"]
    ranks = torch.arange(1, ipc + 1, dtype=torch.float64) ** -1.05
    item_effect = 0.4 * torch.randn(items, generator=g, dtype=torch.float64)
    home_of = torch.randint(0, ncat, (users,), generator=g)
    offsets = torch.tensor([0, users, users + items])

    def item_rank(n):
        return torch.multinomial(ranks, n, replacement=True, generator=g)

    out = []
    for _ in range(pool):
        user = torch.randint(0, users, (batch,), generator=g)
        lengths = torch.randint(1, max_len + 1, (batch,), generator=g)
        hist_cat = torch.zeros(batch, max_len, dtype=torch.int64)
        interest = home_of[user].clone()
        for t in range(max_len):
            move = torch.rand(batch, generator=g) < drift
            interest = torch.where(move, torch.randint(0, ncat, (batch,), generator=g), interest)
            hist_cat[:, t] = interest
        hist_item = hist_cat * ipc + item_rank(batch * max_len).view(batch, max_len)
        last = hist_cat[torch.arange(batch), lengths - 1]
        coin = torch.rand(batch, generator=g) < 0.5
        target_cat = torch.where(coin, last, torch.randint(0, ncat, (batch,), generator=g))
        target = target_cat * ipc + item_rank(batch)
        t = torch.arange(max_len).unsqueeze(0)
        valid = t < lengths.unsqueeze(1)
        w = torch.where(valid, 0.6 ** (lengths.unsqueeze(1) - 1 - t).clamp(min=0).double(), 0.0)
        share = (w * (hist_cat == target_cat.unsqueeze(1))).sum(1) / w.sum(1)
        home = home_of[user]
        logit = (-1.6 + 1.2 * (target_cat == last).double() + 1.5 * share
                 - 0.8 * ((target_cat == home) & (target_cat != last)).double() + item_effect[target])
        labels = (torch.rand(batch, generator=g, dtype=torch.float64) < torch.sigmoid(logit)).float()
        ids = torch.stack([user, target, target_cat], 1) + offsets
        # [B, T, 2] (item, category) ids into the shared weight; padding past each length.
        seq = torch.stack([hist_item + offsets[1], hist_cat + offsets[2]], 2)
        out.append({"ids": ids, "seq": seq, "lengths": lengths,
                    "dense": torch.zeros(batch, 0), "labels": labels})
    return out


# ---------------------------------------------------------------- models (torch)


def build(torch, model, shape, seed):
    nn = torch.nn
    F = torch.nn.functional
    torch.manual_seed(seed)

    def linear(i, o, bias=True):
        lin = nn.Linear(i, o, bias=bias)
        with torch.no_grad():
            lin.weight.normal_(0.0, math.sqrt(2.0 / (i + o)))
            if bias:
                lin.bias.normal_(0.0, math.sqrt(1.0 / o))
        return lin

    def mlp(widths, relu_last):
        layers = []
        for k, (i, o) in enumerate(zip(widths, widths[1:])):
            layers.append(linear(i, o))
            if k + 2 < len(widths) or relu_last:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    d = shape["dim"]
    width = shape.get("row_width", d)

    class Dlrm(nn.Module):
        def __init__(self):
            super().__init__()
            n = len(shape["tables"]) + 1
            self.bottom = mlp([shape["num_dense"]] + shape["bottom"], True)
            self.top = mlp([d + n * (n - 1) // 2] + shape["top"], False)
            li, lj = torch.tril_indices(n, n, offset=-1)
            self.register_buffer("li", li, persistent=False)
            self.register_buffer("lj", lj, persistent=False)

        def forward(self, dense, rows, batch):
            x = self.bottom(dense)
            z = torch.cat([x.unsqueeze(1), rows.view(dense.shape[0], -1, d)], 1)
            gram = torch.bmm(z, z.transpose(1, 2))
            return self.top(torch.cat([x, gram[:, self.li, self.lj]], 1)).squeeze(1)

    class DeepFm(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(shape["num_dense"], 1)
            with torch.no_grad():
                self.linear.weight.normal_(0.0, 0.01)
                self.linear.bias.zero_()
            self.deep = mlp([shape["num_dense"] + len(shape["tables"]) * d] + shape["deep"] + [1], False)

        def forward(self, dense, rows, batch):
            r = rows.view(dense.shape[0], -1, width)
            w, v = r[:, :, 0], r[:, :, 1:]
            s = v.sum(1)
            fm = 0.5 * (s * s - (v * v).sum(1)).sum(1)
            deep = self.deep(torch.cat([dense, v.reshape(dense.shape[0], -1)], 1)).squeeze(1)
            return self.linear(dense).squeeze(1) + w.sum(1) + fm + deep

    class Dien(nn.Module):
        def __init__(self):
            super().__init__()
            e = len(shape["sequence_tables"]) * d
            self.e = e
            self.gru = nn.GRU(e, e, batch_first=True)  # default init: U(-1/sqrt(H), 1/sqrt(H))
            self.att = nn.Parameter(torch.eye(e) / math.sqrt(e))
            self.mlp = mlp([shape["num_dense"] + len(shape["tables"]) * d + 2 * e] + shape["mlp"] + [1], False)
            self.targets = list(shape["target_fields"])

        def forward(self, dense, rows, batch):
            seq_rows, lengths = batch["seq_rows"], batch["lengths"]
            b, t = seq_rows.shape[0], seq_rows.shape[1]
            pooled = rows.view(b, -1, d)
            q = pooled[:, self.targets, :].reshape(b, self.e)
            x = seq_rows.reshape(b, t, self.e)
            h, _ = self.gru(x)
            keys = h + x
            scores = torch.bmm(keys, (q @ self.att.t()).unsqueeze(2)).squeeze(2)
            mask = torch.arange(t, device=x.device).unsqueeze(0) < lengths.unsqueeze(1)
            alpha = torch.softmax(scores.masked_fill(~mask, float("-inf")), 1)
            u = torch.bmm(alpha.unsqueeze(1), keys).squeeze(1)
            return self.mlp(torch.cat([dense, pooled.reshape(b, -1), u, u * q], 1)).squeeze(1)

    dense_model = {"dlrm": Dlrm, "deepfm": DeepFm, "dien": Dien}[model]()
    # One weight for every table: table t's rows start at the sum of the earlier tables' sizes.
    parts = []
    for n in shape["tables"]:
        bound = 1.0 / math.sqrt(n)
        parts.append(torch.empty(n, width).uniform_(-bound, bound))
    weight = torch.cat(parts)
    return dense_model, weight


class RowwiseAdagrad:
    """Row-wise Adagrad on a weight whose gradient is a sparse COO tensor."""

    def __init__(self, torch, weight, lr=0.01, eps=1e-8):
        self.torch, self.weight, self.lr, self.eps = torch, weight, lr, eps
        self.acc = torch.zeros(weight.shape[0], device=weight.device, dtype=weight.dtype)

    def step(self):
        g = self.weight.grad.coalesce()  # one summed gradient per distinct row
        rows, values = g.indices()[0], g.values()
        with self.torch.no_grad():
            self.acc.index_add_(0, rows, values.pow(2).mean(1))
            scale = self.lr / (self.acc.index_select(0, rows).sqrt() + self.eps)
            self.weight.index_add_(0, rows, values * -scale.unsqueeze(1))
        self.weight.grad = None


# ---------------------------------------------------------------- run


def cpu_model_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(a):
    # Read by libgomp when torch loads it: set before the import.
    if a.omp_wait_policy is not None:
        os.environ["OMP_WAIT_POLICY"] = a.omp_wait_policy.upper()
    else:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {a.device}: torch {torch.__version__} sees no CUDA device")
    # Exact fp32 products unless tf32 is asked for (PyTorch's default, stated here).
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    shape = model_shape(a.model, a.rows)
    dense_model, weight = build(torch, a.model, shape, a.seed)
    dense_model.to(device)
    weight = weight.to(device).requires_grad_(True)
    dense_params = sum(p.numel() for p in dense_model.parameters())
    embedding_params = weight.numel()
    expected = param_counts(a.model, shape)
    if (dense_params, embedding_params) != expected:
        raise SystemExit(f"parameter counts {(dense_params, embedding_params)} differ from tiderec's {expected}")
    hp = {"lr": 0.01}
    if a.optimizer == "adagrad":
        kind, kw = torch.optim.Adagrad, dict(lr=0.01, eps=1e-8, initial_accumulator_value=0.0)
        hp["eps"] = 1e-8
    elif a.optimizer == "adam":
        kind, kw = torch.optim.Adam, dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8)
        hp.update(eps=1e-8, betas=[0.9, 0.999])
    else:
        kind, kw = torch.optim.SGD, dict(lr=0.01)
    fused = False
    # torch's fused Adagrad runs on the CPU only: on a GPU it raises at the first
    # step, so Adagrad there takes the default (foreach) implementation.
    fused_here = not (device.type == "cuda" and kind is torch.optim.Adagrad)
    if a.fused_optimizer == "on" and fused_here:
        try:
            opt = kind(dense_model.parameters(), fused=True, **kw)
            fused = True
        except (RuntimeError, TypeError, ValueError):
            pass
    if not fused:
        opt = kind(dense_model.parameters(), **kw)
    sparse_opt = RowwiseAdagrad(torch, weight, lr=0.01, eps=1e-8)
    forward = torch.compile(dense_model) if a.compile else dense_model

    gen = behavior_batches if a.model == "dien" else flat_batches
    # The pool of training batches, then one held-out batch of the same law.
    batches = []
    for b in gen(torch, shape, a.batch_size, a.seed, a.pool) + gen(torch, shape, a.batch_size, a.seed + 1, 1):
        t = {k: v.to(device) for k, v in b.items()}
        if a.model == "dien":
            n, steps = t["seq"].shape[0], t["seq"].shape[1]
            valid = (torch.arange(steps, device=device).unsqueeze(0) < t["lengths"].unsqueeze(1))
            flat = t["seq"].reshape(-1, 2)[valid.reshape(-1)].reshape(-1)
            # Positions (in [B*T*2]) of the valid sequence ids; padding stays zero.
            pos = torch.arange(n * steps * 2, device=device).view(n * steps, 2)[valid.reshape(-1)].reshape(-1)
            t.update(seq_ids=flat, seq_pos=pos)
        batches.append(t)
    heldout = batches.pop()

    F = torch.nn.functional
    d = shape["dim"]

    def loss_of(b):
        rows = F.embedding(b["ids"].reshape(-1), weight, sparse=True)
        if a.model == "dien":
            n, steps = b["seq"].shape[0], b["seq"].shape[1]
            seq_rows = F.embedding(b["seq_ids"], weight, sparse=True)
            full = torch.zeros(n * steps * 2, d, device=device, dtype=weight.dtype)
            b = dict(b, seq_rows=full.index_copy(0, b["seq_pos"], seq_rows).view(n, steps, 2 * d))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            logits = forward(b["dense"], rows, b)
        return F.binary_cross_entropy_with_logits(logits.float(), b["labels"])

    def heldout_loss():
        with torch.no_grad():
            return loss_of(heldout).item()

    def step(b):
        loss = loss_of(b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        # Two sparse gradients (targets and sequences) add into one before the row update.
        opt.step()
        sparse_opt.step()
        return loss.detach()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    heldout_before = heldout_loss()
    losses = []
    for s in range(a.warmup):
        losses.append(step(batches[s % len(batches)]))
    sync()
    start = time.perf_counter()
    for s in range(a.steps):
        losses.append(step(batches[(a.warmup + s) % len(batches)]))
    sync()
    secs = time.perf_counter() - start
    heldout_after = heldout_loss()
    loss_values = torch.stack(losses).float().cpu().tolist()
    window = max(1, min(len(batches), len(loss_values) // 4))
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = cpu_model_name()
    return {
        "model": a.model,
        "samples_per_sec": a.steps * a.batch_size / secs,
        "ms_per_step": secs * 1e3 / a.steps,
        "batch_size": a.batch_size,
        "steps": a.steps,
        "warmup": a.warmup,
        "device": a.device,
        "device_name": device_name,
        "cpu_model": cpu_model_name(),
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "compile": a.compile,
        "dense_optimizer": a.optimizer,
        "dense_hp": hp,
        "fused_optimizer": fused,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "sparse_optimizer": "rowwise-adagrad (written here; lr 0.01, eps 1e-8)",
        "dense_params": dense_params,
        "embedding_params": embedding_params,
        "pool": a.pool,
        # Mean loss over the first and the last pass over the pool (at most a quarter of the steps each).
        "loss_first": sum(loss_values[:window]) / window,
        "loss_last": sum(loss_values[-window:]) / window,
        # Loss on a batch never trained on, before and after training.
        "heldout_loss_before": heldout_before,
        "heldout_loss_after": heldout_after,
        "config": shape,
    }


def main(argv=None):
    a = parse_args(argv)
    if a.print_config:
        shape = model_shape(a.model, a.rows)
        dense, emb = param_counts(a.model, shape)
        print(json.dumps({"model": a.model, "dense_params": dense, "embedding_params": emb, "config": shape}))
        return 0
    r = run(a)
    if a.json:
        print(json.dumps(r))
    else:
        print(f"torch {r['torch_version']} {r['model']} batch {r['batch_size']} on {r['device']} "
              f"({r['device_name']}, {r['threads']} threads): {r['samples_per_sec']:.0f} samples/s "
              f"({r['ms_per_step']:.2f} ms/step, {r['steps']} steps); loss {r['loss_first']:.4f} -> "
              f"{r['loss_last']:.4f} (held-out batch {r['heldout_loss_before']:.4f} -> "
              f"{r['heldout_loss_after']:.4f}); {r['dense_params']} dense + {r['embedding_params']} embedding parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
