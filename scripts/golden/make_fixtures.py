#!/usr/bin/env python3
"""Golden fixtures: PyTorch (float64) references for the layers and models in
nn/src/, read by operators/tests/golden.rs.

Run by hand from the repository root when a fixture has to change:

    python3 scripts/golden/make_fixtures.py

It needs only torch (CPU is enough). The test suite never runs it; the JSON it
writes to operators/tests/fixtures/ is committed.

Every fixture holds small, seeded, deterministic inputs, the parameters in
*our* flat layout (the exact buffer the Rust layer or model reads), the forward
outputs, and the gradients of a scalar loss with respect to every parameter
and every input, all computed by torch autograd in float64:

  fm_layer       FmInteraction (the FM second-order term) on rows [B x F x stride],
                 factor at row[offset..offset+k]; loss = sum_b out[b] * r[b].
  lr_model,      the `Fm` model (LR / FM / DeepFM / Wide & Deep) written as a torch
  fm_model,      module whose parameters map 1:1 onto our flat layout
  deepfm_model,  [b, a_1..a_nd, then per MLP layer W (out x in, row-major), b (out)];
  wdl_model      loss = sum_b BCEWithLogits(logit_b, label_b).
  gru            torch.nn.GRU (gate order r, z, n in the rows of W_ih, W_hh, b_ih,
                 b_hh, exactly as ours) on variable-length sequences with our
                 masking: past its length a row keeps its state. Loss =
                 sum_t sum_b r[t,b] . h_t[b] over all T steps (padded ones included).
  attention      bilinear attention pooling written from its formula:
                 s_t = k_t^T W q, alpha = softmax over the first len steps,
                 out = sum_t alpha_t k_t (zeros for len 0); loss = sum out * r.

Tensor layouts in the JSON are the Rust layouts (row-major, shapes given).
"""

import json
import os
import sys
import warnings

# torch warns once when NumPy is absent; nothing here uses NumPy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402

torch.set_default_dtype(torch.float64)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = os.path.join(ROOT, "operators", "tests", "fixtures")


def tensor(t):
    t = torch.as_tensor(t, dtype=torch.float64).detach()
    return {"shape": list(t.shape), "data": [float(v) for v in t.reshape(-1).tolist()]}


def write(name, description, config, inputs, params, outputs, grads):
    for group in (inputs, params, outputs, grads):
        for k, v in group.items():
            assert all(map(lambda x: x == x and abs(x) != float("inf"), v["data"])), (name, k)
    doc = {
        "name": name,
        "description": description,
        "generator": {"script": "scripts/golden/make_fixtures.py", "torch": torch.__version__, "dtype": "float64"},
        "config": config,
        "inputs": inputs,
        "params": params,
        "outputs": outputs,
        "grads": grads,
    }
    # One line per tensor: small files, readable diffs.
    lines = ["{"]
    keys = list(doc)
    for i, key in enumerate(keys):
        comma = "," if i + 1 < len(keys) else ""
        value = doc[key]
        if key in ("inputs", "params", "outputs", "grads"):
            if not value:
                lines.append(f"  {json.dumps(key)}: {{}}{comma}")
                continue
            lines.append(f"  {json.dumps(key)}: {{")
            names = list(value)
            for j, n in enumerate(names):
                c2 = "," if j + 1 < len(names) else ""
                lines.append(f"    {json.dumps(n)}: {json.dumps(value[n])}{c2}")
            lines.append(f"  }}{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, f"{name}.json")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {os.path.relpath(path, ROOT)}")


# ---------------------------------------------------------------- FM layer


def fm_term(v):
    """1/2 sum_c [(sum_f v_fc)^2 - sum_f v_fc^2] for v: [B x F x k]."""
    return 0.5 * (v.sum(dim=1).pow(2) - v.pow(2).sum(dim=1)).sum(dim=-1)


def make_fm_layer():
    torch.manual_seed(101)
    batch, fields, dim, stride, offset = 4, 3, 4, 6, 1
    rows = torch.randn(batch, fields, stride).requires_grad_()
    r = torch.randn(batch)
    out = fm_term(rows[:, :, offset : offset + dim])
    (out * r).sum().backward()
    write(
        "fm_layer",
        "FmInteraction: out[b] = 1/2 sum_c[(sum_f v_fc)^2 - sum_f v_fc^2], v_f = row[offset..offset+dim]; "
        "loss = sum_b out[b]*r[b]; grads.rows is d loss / d rows (zero outside the factor columns)",
        {"batch": batch, "num_fields": fields, "dim": dim, "stride": stride, "offset": offset},
        {"rows": tensor(rows), "r": tensor(r)},
        {},
        {"out": tensor(out)},
        {"rows": tensor(rows.grad)},
    )


# ---------------------------------------------------------------- LR / FM / DeepFM / WDL


class TorchFm(nn.Module):
    """Our `Fm` model. Embedding rows are [w, v_1..v_k]; per sample
    logit = b + a.x + sum_f w_f + [fm] FM(v) + [deep] MLP([x, v_1, ..., v_F])."""

    def __init__(self, num_dense, num_sparse, dim, deep, fm):
        super().__init__()
        self.num_dense, self.num_sparse, self.dim, self.fm = num_dense, num_sparse, dim, fm
        self.bias = nn.Parameter(torch.randn(1) * 0.1)
        self.a = nn.Parameter(torch.randn(num_dense) * 0.3)
        self.mlp = None
        if deep:
            widths = [num_dense + num_sparse * dim] + list(deep) + [1]
            layers = []
            for i in range(len(widths) - 1):
                layers.append(nn.Linear(widths[i], widths[i + 1]))  # torch's default init, seeded
                if i + 2 < len(widths):
                    layers.append(nn.ReLU())
            self.mlp = nn.Sequential(*layers)

    def ordered(self):
        """Parameters in our flat order; nn.Linear.weight is [out x in] row-major like ours."""
        ps = [self.bias, self.a]
        if self.mlp is not None:
            for m in self.mlp:
                if isinstance(m, nn.Linear):
                    ps += [m.weight, m.bias]
        return ps

    def flat_params(self):
        return torch.cat([p.detach().reshape(-1) for p in self.ordered()])

    def flat_grads(self):
        return torch.cat([p.grad.reshape(-1) for p in self.ordered()])

    def forward(self, dense, pooled):
        batch = dense.shape[0]
        w = pooled[:, :, 0]
        v = pooled[:, :, 1:]
        logit = self.bias + dense @ self.a + w.sum(dim=1)
        if self.fm and self.dim > 0:
            logit = logit + fm_term(v)
        if self.mlp is not None:
            deep_in = torch.cat([dense, v.reshape(batch, self.num_sparse * self.dim)], dim=1)
            logit = logit + self.mlp(deep_in).squeeze(1)
        return logit


def make_model(name, seed, dim, deep, fm):
    torch.manual_seed(seed)
    batch, num_dense, num_sparse = 4, 3, 3
    model = TorchFm(num_dense, num_sparse, dim, deep, fm)
    dense = torch.randn(batch, num_dense).abs().requires_grad_()
    pooled = (torch.randn(batch, num_sparse, 1 + dim) * 0.5).requires_grad_()
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0])
    logits = model(dense, pooled)
    logits.retain_grad()
    if model.mlp is not None:
        # Keep every hidden pre-activation clear of ReLU's kink, where the two sides'
        # rounding could pick different branches.
        with torch.no_grad():
            h = torch.cat([dense, pooled[:, :, 1:].reshape(batch, num_sparse * dim)], dim=1)
            for m in model.mlp:
                h = m(h)
                if isinstance(m, nn.Linear) and m is not model.mlp[-1]:
                    assert h.abs().min() > 1e-6, f"{name}: a pre-activation sits on ReLU's kink; change the seed"
    loss = nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
    loss.backward()
    write(
        f"{name}_model",
        f"Fm model ({name}): logit = b + a.x + sum_f w_f"
        + (" + FM(v)" if fm and dim > 0 else "")
        + (" + MLP([x, v_1..v_F]) (ReLU between layers, none after the last)" if deep else "")
        + "; loss = sum_b BCEWithLogits(logit_b, label_b); params in our flat layout "
        "[b, a_1..a_nd, per MLP layer W (out x in) then b]; grads.dense is computed by torch "
        "but our Model::backward does not produce it",
        {"batch": batch, "num_dense": num_dense, "num_sparse": num_sparse, "dim": dim, "deep": list(deep), "fm": fm},
        {"dense": tensor(dense), "pooled": tensor(pooled), "labels": tensor(labels)},
        {"params": tensor(model.flat_params())},
        {"logits": tensor(logits), "loss": tensor(loss)},
        {
            "params": tensor(model.flat_grads()),
            "logits": tensor(logits.grad),
            "pooled": tensor(pooled.grad),
            "dense": tensor(dense.grad),
        },
    )


# ---------------------------------------------------------------- GRU


def masked_gru_states(gru, x, lengths):
    """h_1..h_T as [T x B x H] with our semantics: step t updates row b only while
    t < lengths[b]; past its length a row keeps its state. Each step is torch.nn.GRU
    itself, run on one time step from the previous state."""
    batch, steps, _ = x.shape
    h = torch.zeros(batch, gru.hidden_size)
    mask = torch.arange(steps)[None, :] < lengths[:, None]  # [B x T]
    states = []
    for t in range(steps):
        _, h_new = gru(x[:, t : t + 1, :], h.unsqueeze(0).contiguous())
        h = torch.where(mask[:, t : t + 1], h_new[0], h)
        states.append(h)
    return torch.stack(states)


def make_gru():
    torch.manual_seed(202)
    inp, hidden, batch, steps = 3, 4, 4, 5
    lengths = torch.tensor([5, 2, 0, 3])
    gru = nn.GRU(inp, hidden, num_layers=1, batch_first=True)  # U(-1/sqrt(H), 1/sqrt(H)), seeded
    x = torch.randn(batch, steps, inp).requires_grad_()
    r = torch.randn(steps, batch, hidden)
    states = masked_gru_states(gru, x, lengths)
    (states * r).sum().backward()

    # Cross-check the per-step masking against torch's own variable-length path
    # (pack_padded_sequence cannot take length 0, so the non-empty rows only).
    with torch.no_grad():
        keep = (lengths > 0).nonzero().squeeze(1)
        packed = pack_padded_sequence(x[keep], lengths[keep], batch_first=True, enforce_sorted=False)
        out, h_n = gru(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=steps)
        for i, b in enumerate(keep.tolist()):
            assert torch.allclose(h_n[0, i], states[-1, b], rtol=0, atol=1e-13)
            for t in range(int(lengths[b])):
                assert torch.allclose(out[i, t], states[t, b], rtol=0, atol=1e-13)
        assert torch.all(states[:, 2, :] == 0)  # the empty row stays at h_0 = 0

    names = ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]
    ps = [getattr(gru, n) for n in names]
    write(
        "gru",
        "torch.nn.GRU (gate order r, z, n: rows [0,H) of W_ih/W_hh/b_ih/b_hh are r, [H,2H) z, [2H,3H) n; "
        "n = tanh(W_in x + b_in + r*(W_hn h + b_hn)), h' = (1-z)*n + z*h) over x [B x T x I]; "
        "per-sample lengths, past its length a row keeps its state (torch run step by step with that mask, "
        "cross-checked against pack_padded_sequence for the non-empty rows); "
        "params flat = [W_ih (3H x I), W_hh (3H x H), b_ih (3H), b_hh (3H)]; "
        "outputs.states = h_1..h_T as [T x B x H]; loss = sum_{t,b} r[t,b].h_t[b]",
        {"input": inp, "hidden": hidden, "batch": batch, "steps": steps, "lengths": lengths.tolist(),
         "gate_order": "r,z,n"},
        {"x": tensor(x), "r": tensor(r)},
        {"params": tensor(torch.cat([p.detach().reshape(-1) for p in ps]))},
        {"states": tensor(states)},
        {"params": tensor(torch.cat([p.grad.reshape(-1) for p in ps])), "x": tensor(x.grad)},
    )


# ---------------------------------------------------------------- attention


def attention_pool(w, query, keys, lengths):
    batch, _, dim = keys.shape
    outs = []
    for b in range(batch):
        n = int(lengths[b])
        if n == 0:
            outs.append(torch.zeros(dim))
            continue
        k = keys[b, :n]  # [n x D]
        s = k @ (w @ query[b])  # s_t = k_t^T W q
        alpha = torch.softmax(s, dim=0)
        outs.append(alpha @ k)
    return torch.stack(outs)


def make_attention():
    torch.manual_seed(303)
    dim, batch, steps = 4, 4, 5
    lengths = torch.tensor([5, 2, 0, 3])
    w = (torch.randn(dim, dim) * 0.5).requires_grad_()
    query = torch.randn(batch, dim).requires_grad_()
    keys = torch.randn(batch, steps, dim).requires_grad_()
    r = torch.randn(batch, dim)
    out = attention_pool(w, query, keys, lengths)
    (out * r).sum().backward()
    write(
        "attention",
        "AttentionPooling: s_t = k_t^T W q, alpha = softmax(s_1..s_len), out = sum_t alpha_t k_t "
        "(zeros for len 0); W [D x D] row-major; loss = sum out*r",
        {"dim": dim, "batch": batch, "steps": steps, "lengths": lengths.tolist()},
        {"query": tensor(query), "keys": tensor(keys), "r": tensor(r)},
        {"w": tensor(w)},
        {"out": tensor(out)},
        {"w": tensor(w.grad), "query": tensor(query.grad), "keys": tensor(keys.grad)},
    )


def main():
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}")
    make_fm_layer()
    make_model("lr", 401, dim=0, deep=[], fm=True)
    make_model("fm", 402, dim=4, deep=[], fm=True)
    make_model("deepfm", 403, dim=4, deep=[8, 6], fm=True)
    make_model("wdl", 404, dim=4, deep=[8, 6], fm=False)
    make_gru()
    make_attention()


if __name__ == "__main__":
    main()
