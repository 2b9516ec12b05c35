#!/usr/bin/env python3
"""A PyTorch `nn.Module` rebuilt from a `tiderec export` snapshot.

`load(model_dir)` reads `model.json` and `model.safetensors` (a compact export's
tables made whole first) and returns a `TiderecModel`: an `nn.Module` whose
`state_dict()` keys are the safetensors names (`bottom.0.weight`,
`embeddings.C1`, `gru.weight_ih_l0`, …), filled with `load_state_dict(...,
strict=True)`. A field named like an attribute of `nn.Module` (`type`, `training`,
`forward`, …) is an attribute with `_` appended (`model.embeddings.type_`); its
`state_dict()` key is still the export name (`embeddings.type`). Its layers are
PyTorch's own (`nn.Linear` for every MLP layer, the attention and the dense linear
part, `nn.GRU` for DIEN's interest extractor), so the module can be fine-tuned
or moved to a GPU like any other (`torch.jit.trace` does not take its inputs: a bag
without weights is `None`):

    import torch, torch_model
    model = torch_model.load("serve/")                 # float32, on the CPU
    batch = model.batch(records)                       # parsed records -> tensors
    probs = torch.sigmoid(model(*batch))

`model(dense, sparse, sequences)` takes
* `dense`: `[B, num_dense]` floats;
* `sparse`: per sparse field (model.json's `sparse_fields`, crosses included) an
  `(ids, offsets, weights)` bag triple as `torch.nn.functional.embedding_bag`
  takes it (`weights` None, or each id's weight: a mean-pooled list weighs its
  `n` rows `float32(1/n)`);
* `sequences`: `(ids [B, T], lengths [B])` of the behaviour sequences (one
  `ids` tensor per sequence field), or None for models without them;
and returns one logit per record.

As a command it scores records like `reference_scorer.py` (and `tiderec
predict`), with the same arguments and CSV:

    python3 scripts/torch_model.py --model serve/ --out scores.csv day_0.tsv

Records are featurized by `reference_scorer.py`'s featurizers (the formats
model.json spells out); `--out` (written whole or not at all), `--overwrite` and
`--max-bad-fraction` work as they do there. Needs PyTorch, NumPy and safetensors. Exit status: 0 on success, 2 on a
model or input it cannot score or an `--out` it refuses to write.
"""

import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import reference_scorer as ref


def attach(root, dotted, item):
    """Registers `item` (a module or a parameter) under `root` at the export name `dotted`,
    making plain container modules for the path's inner names; `root.paths` records the
    attribute path of every name registered.

    A name is registered as itself unless the module it goes in already has an attribute
    of that name (`type`, `training`, `forward`, `to`, … of `nn.Module`, or a name taken
    before): then `_` is appended until it is free (`embeddings.type` is the parameter
    `embeddings.type_`). `state_dict()` and `load_state_dict()` still use the export
    names (see `export_keys`)."""
    *parents, leaf = dotted.split(".")
    node, real = root, []
    for depth, name in enumerate(parents):
        key = ".".join(parents[: depth + 1])
        if key not in root.paths:
            slot = free_name(node, name)
            node.add_module(slot, nn.Module())
            root.paths[key] = ".".join(real + [slot])
        real = root.paths[key].split(".")
        node = node._modules[real[-1]]
    if dotted in root.paths:
        raise ref.ScorerError(f"tensor {dotted} is named twice")
    slot = free_name(node, leaf)
    if isinstance(item, nn.Parameter):
        node.register_parameter(slot, item)
    else:
        node.add_module(slot, item)
    root.paths[dotted] = ".".join(real + [slot])


def free_name(node, name):
    """`name`, with as many `_` appended as make it no attribute of `node` (its class's
    methods and properties, its own fields, the parameters and modules registered in it)."""
    slot = name
    while (
        not slot
        or hasattr(type(node), slot)
        or slot in vars(node)
        or slot in node._modules
        or slot in node._parameters
        or slot in node._buffers
    ):
        slot += "_"
    return slot


def export_keys(module, state_dict, prefix, local_metadata):
    """State-dict hook: the module's entries of `state_dict` renamed from attribute paths
    to export names, in place and in order."""
    items = list(state_dict.items())
    state_dict.clear()
    for key, value in items:
        if key.startswith(prefix):
            key = prefix + module.export_name(key[len(prefix) :])
        state_dict[key] = value


def attribute_keys(module, state_dict, prefix, *_):
    """Load-state-dict pre-hook: the module's entries of `state_dict` renamed from export
    names to attribute paths, in place."""
    ours = [k for k in state_dict if k.startswith(prefix)]
    # All taken out before any is put back: one tensor's attribute path may be another's export name.
    moved = {prefix + module.attribute_path(k[len(prefix) :]): state_dict.pop(k) for k in ours}
    state_dict.update(moved)


class TiderecModel(nn.Module):
    """The forward pass of model.json's `forward` section over parameters named as in the export."""

    def __init__(self, config, shapes):
        super().__init__()
        self.paths = {}  # export name -> attribute path (see `attach`)
        # The public hook registrations where this PyTorch has them, the older private ones otherwise.
        if hasattr(self, "register_state_dict_post_hook"):
            self.register_state_dict_post_hook(export_keys)
        else:
            self._register_state_dict_hook(export_keys)
        if hasattr(self, "register_load_state_dict_pre_hook"):
            self.register_load_state_dict_pre_hook(attribute_keys)
        else:
            self._register_load_state_dict_pre_hook(attribute_keys, with_module=True)
        self.kind = config["kind"]
        self.spec = config["forward"]
        self.fields = list(config["sparse_fields"])
        self.mlps = {part: self.spec[part] for part in ("bottom", "top", "deep", "mlp") if part in self.spec}
        for spec in self.mlps.values():
            for name in spec["layers"]:
                out, inp = shapes[name + ".weight"]
                attach(self, name, nn.Linear(inp, out))
        self.dense_linear = "linear.weight" in shapes
        if self.dense_linear:
            attach(self, "linear", nn.Linear(shapes["linear.weight"][1], 1))
        if "gru.weight_ih_l0" in shapes:
            width = shapes["gru.weight_hh_l0"][1]
            attach(self, "gru", nn.GRU(shapes["gru.weight_ih_l0"][1], width, batch_first=True))
        if "attention.weight" in shapes:
            out, inp = shapes["attention.weight"]
            attach(self, "attention", nn.Linear(inp, out, bias=False))
        # Embedding tables, the bias of a model without dense inputs: plain parameters.
        placed = set(self.state_dict())
        for name, shape in shapes.items():
            if name not in placed:
                attach(self, name, nn.Parameter(torch.zeros(shape)))
        unknown = set(self.state_dict()) - set(shapes)
        if unknown:
            raise ref.ScorerError(f"model.json does not name the module's tensors {sorted(unknown)}")

    # ------------------------------------------------------------ names

    def attribute_path(self, name):
        """The attribute path of the export name `name` (a registered name, or one inside
        a registered module: `linear.weight`); `name` itself when nothing registered holds it."""
        head, rest = name, ""
        while head not in self.paths:
            if "." not in head:
                return name
            head, tail = head.rsplit(".", 1)
            rest = "." + tail + rest
        return self.paths[head] + rest

    def export_name(self, path):
        """The export name of the attribute path `path` (the inverse of `attribute_path`)."""
        names = {real: name for name, real in self.paths.items()}
        head, rest = path, ""
        while head not in names:
            if "." not in head:
                return path
            head, tail = head.rsplit(".", 1)
            rest = "." + tail + rest
        return names[head] + rest

    def part(self, name):
        """The parameter or module of the export name `name` (`embeddings.C1`, `bottom.0`)."""
        node = self
        for attribute in self.attribute_path(name).split("."):
            node = getattr(node, attribute)
        return node

    # ------------------------------------------------------------ parts

    def _pooled(self, table, sparse):
        """The bag of `table`'s field (`embeddings.C1` reads field `C1`) pooled by sum: [B, width]."""
        ids, offsets, weights = sparse[self.fields.index(table.split(".", 1)[1])]
        return F.embedding_bag(ids, self.part(table), offsets, mode="sum", per_sample_weights=weights)

    def _mlp(self, part, x):
        spec = self.mlps[part]
        layers = spec["layers"]
        for i, name in enumerate(layers):
            x = self.part(name)(x)
            if i + 1 < len(layers) or spec["relu_after_last"]:
                x = torch.relu(x)
        return x

    def _inputs(self, names, dense, sparse, known):
        """The concatenation of `names` (see `reference_scorer.input_parts`)."""
        parts = ref.input_parts(names, dense, known, lambda table: self._pooled(table, sparse))
        return torch.cat(parts, dim=1) if parts else dense.new_zeros((dense.shape[0], 0))

    # ------------------------------------------------------------ forward

    def forward(self, dense, sparse, sequences=None):
        fw = self.spec
        if self.kind == "dlrm":
            bottom = self._mlp("bottom", self._inputs(fw["bottom"]["input"], dense, sparse, {}))
            inter = fw["interaction"]
            z = torch.stack([self._inputs([v], dense, sparse, {"bottom": bottom}) for v in inter["vectors"]], dim=1)
            gram = torch.bmm(z, z.transpose(1, 2))
            pairs = torch.tensor(inter["pairs"], dtype=torch.long).reshape(-1, 2)
            x = torch.cat([z[:, 0], gram[:, pairs[:, 0], pairs[:, 1]]], dim=1)
            return self._mlp("top", x)[:, 0]
        if self.kind in ("lr", "fm", "deepfm", "wdl"):
            bias = self.part("linear.bias")
            logit = bias[0].expand(dense.shape[0]).clone()
            if self.dense_linear:
                logit = logit + dense @ self.part("linear.weight")[0]
            for term in fw["terms"]:
                if term == "first_order":
                    for name in fw["first_order"]["fields"]:
                        logit = logit + self._pooled("first_order." + name, sparse)[:, 0]
                elif term == "fm":
                    vs = torch.stack([self._pooled("embeddings." + n, sparse) for n in fw["fm"]["fields"]])
                    s = vs.sum(dim=0)
                    logit = logit + 0.5 * (s * s - (vs * vs).sum(dim=0)).sum(dim=1)
                elif term == "deep":
                    logit = logit + self._mlp("deep", self._inputs(fw["deep"]["input"], dense, sparse, {}))[:, 0]
                elif term != "linear":
                    raise ref.ScorerError(f"unknown term {term!r} in model.json")
            return logit
        if self.kind in ("dien", "dien-sum"):
            return self._dien(dense, sparse, sequences)
        raise ref.ScorerError(f"model kind {self.kind!r} is not one this loader knows")

    def _dien(self, dense, sparse, sequences):
        fw = self.spec
        tables = fw["sequences"]["tables"]
        if sequences is None or len(sequences[0]) != len(tables):
            got = 0 if sequences is None else len(sequences[0])
            raise ref.ScorerError(f"the records have {got} sequence fields, the model reads {len(tables)}")
        seq_ids, lengths = sequences
        q = torch.cat([self._pooled("embeddings." + n, sparse) for n in fw["q"]["fields"]], dim=1)
        # Step t of a record is the concatenation of its sequence fields' rows of event t.
        x = torch.cat([F.embedding(ids, self.part(t)) for ids, t in zip(seq_ids, tables)], dim=2)
        if x.shape[2] != q.shape[1]:
            raise ref.ScorerError(f"the sequence steps are {x.shape[2]} wide, the target q {q.shape[1]}")
        valid = torch.arange(x.shape[1])[None, :] < lengths[:, None]  # [B, T]
        interest = fw["interest"]["kind"]
        if interest == "sum-pooling":
            u = (x * valid[:, :, None]).sum(dim=1)
        elif interest == "gru-attention":
            u = self._gru_attention(x, valid, q)
        else:
            raise ref.ScorerError(f"unknown interest {interest!r} in model.json")
        mlp_in = self._inputs(fw["mlp"]["input"], dense, sparse, {"u": u, "u ⊙ q": u * q})
        return self._mlp("mlp", mlp_in)[:, 0]

    def _gru_attention(self, x, valid, q):
        """The GRU over each record's valid steps (a record keeps its state past its length),
        keys `h_t + x_t`, softmax attention with scores `keys · (W q)` over the valid steps."""
        batch, steps, width = x.shape
        h = x.new_zeros((batch, width))
        states = []
        for t in range(steps):
            # One step of nn.GRU on the states of every record, kept where the step is past its end.
            _, h_new = self.part("gru")(x[:, t : t + 1], h[None])
            h = torch.where(valid[:, t, None], h_new[0], h)
            states.append(h)
        keys = (torch.stack(states, dim=1) if states else x) + x
        scores = torch.einsum("bte,be->bt", keys, self.part("attention")(q))
        scores = scores.masked_fill(~valid, float("-inf"))
        # A record without history pools to zeros.
        alpha = torch.nan_to_num(torch.softmax(scores, dim=1), nan=0.0)
        return torch.einsum("bt,bte->be", alpha, keys)

    # ------------------------------------------------------------ inputs

    def batch(self, records):
        """`(dense, sparse, sequences)` of parsed records (`reference_scorer` featurizers'
        `(label, dense, bags, sequences)`), in this module's floating type."""
        dtype = next(self.parameters()).dtype
        dense = torch.tensor(np.stack([r[1] for r in records]), dtype=dtype)
        sparse = []
        for f in range(len(self.fields)):
            bags = [r[2][f] for r in records]
            ids = torch.tensor([x for bag in bags for x in bag], dtype=torch.long)
            offsets = torch.tensor(np.cumsum([0] + [len(b) for b in bags[:-1]]), dtype=torch.long)
            weights = None
            if any(isinstance(b, ref.MeanBag) for b in bags):
                w = [float(np.float32(1.0) / np.float32(len(b))) if isinstance(b, ref.MeanBag) else 1.0 for b in bags for _ in b]
                weights = torch.tensor(w, dtype=dtype)
            sparse.append((ids, offsets, weights))
        sequences = None
        if records and records[0][3]:
            lengths = torch.tensor([len(r[3][0]) for r in records], dtype=torch.long)
            steps = int(lengths.max())
            seq_ids = []
            for j in range(len(records[0][3])):
                ids = torch.zeros((len(records), steps), dtype=torch.long)
                for i, r in enumerate(records):
                    s = r[3][j][: int(lengths[i])]
                    ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
                seq_ids.append(ids)
            sequences = (seq_ids, lengths)
        return dense, sparse, sequences


def load(model_dir, dtype=torch.float32):
    """The module of an export, its parameters loaded by name (`strict`), in `dtype`, in eval mode."""
    return module_of(*ref.load(model_dir), dtype)


def module_of(config, tensors, dtype=torch.float32):
    """[`load`] from a loaded `model.json` and its tensors (NumPy arrays, compact tables made whole)."""
    shapes = {name: list(v.shape) for name, v in tensors.items()}
    for name, shape in config["tensors"].items():
        if name not in shapes:
            raise ref.ScorerError(f"tensor {name} of model.json is missing from model.safetensors")
        if shapes[name] != shape:
            raise ref.ScorerError(f"tensor {name}: shape {shapes[name]} in the file, {shape} in model.json")
    model = TiderecModel(config, shapes)
    model.load_state_dict({name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in tensors.items()}, strict=True)
    return model.to(dtype).eval()


class Scorer:
    """`reference_scorer.score_files`' model interface over the module: float64 logits."""

    def __init__(self, module):
        self.module = module

    def logits(self, dense, bags, seqs):
        records = [(None, d, b, s) for d, b, s in zip(dense, bags, seqs)]
        with torch.no_grad():
            return self.module(*self.module.batch(records)).double().numpy()


def main(argv=None):
    dtypes = {"float32": torch.float32, "float64": torch.float64}
    dtype = dict(choices=sorted(dtypes), default="float32", help="the module's floating type (default float32)")
    return ref.run(argv, "torch_model", lambda c, t, args: Scorer(module_of(c, t, dtypes[args.dtype])), {"--dtype": dtype})


if __name__ == "__main__":
    sys.exit(main())
