#!/usr/bin/env python3
"""Reference scorer for a `tiderec export` snapshot, in NumPy.

Rebuilds the model from `model.json` and `model.safetensors` alone (LR, FM,
DeepFM, Wide & Deep and DLRM), featurizes raw Criteo TSV records as
`model.json`'s `features` section describes (the hash is reimplemented here from
its constants), and writes one probability per record:

    python3 scripts/reference_scorer.py --model serve/ --out scores.csv day_0.tsv

The output is CSV with the header `file,position,score` (`,label` added when
the records carry labels): `position` is the record's 1-based line number in
its file, `score` the click probability `sigmoid(logit)`. A malformed record is
not scored: it is reported on stderr with its file and line, and counted.

Records are labeled (`label, I1..I13, C1..C26`) unless `--unlabeled` is given
(`I1..I13, C1..C26`, as Kaggle's test.txt). DIEN models (behaviour sequences)
and models with feature crosses are refused: their inputs cannot be rebuilt
from Criteo records and `model.json`.

Needs NumPy and safetensors (`pip install numpy safetensors`). Exit status:
0 on success, 2 on a model or input it cannot score.
"""

import argparse
import csv
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file

FORMAT = "tiderec-serving"
FORMAT_VERSION = 2
MASK64 = (1 << 64) - 1
HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")


class ScorerError(Exception):
    """A model or input this scorer cannot handle; the message names it."""


# ---------------------------------------------------------------- features


class CriteoFeaturizer:
    """Criteo TSV featurization rebuilt from model.json's `features` section."""

    def __init__(self, features, labeled):
        if features.get("format") != "criteo-tsv":
            raise ScorerError(f"features format {features.get('format')!r}: this scorer reads criteo-tsv only")
        if "crosses" in features:
            raise ScorerError("the model has feature crosses, which model.json cannot rebuild")
        h = features["hash"]
        self.m1 = int(h["mix64"]["m1"], 16)
        self.m2 = int(h["mix64"]["m2"], 16)
        golden = int(h["field_seed"]["golden"], 16)
        seed = int(h["hash_seed"]) & MASK64
        self.fields = features["categorical"]
        self.dense = features["dense"]
        self.seeds = []
        for f in self.fields:
            s = self.mix64(seed ^ self.mix64(golden ^ f["field_index"]))
            if s != int(f["seed"], 16):
                raise ScorerError(f"field {f['name']}: derived seed {s:#x} differs from model.json's {f['seed']}")
            self.seeds.append(s)
        self.rows = [int(f["rows"]) for f in self.fields]
        self.labeled = labeled
        record = features["record"]
        shift = 0 if labeled else 1
        self.max_fields = record["max_fields"] - shift
        self.min_fields = record["min_fields"] - shift
        self.first = 1 - shift  # column of I1

    def mix64(self, x):
        x ^= x >> 33
        x = (x * self.m1) & MASK64
        x ^= x >> 33
        x = (x * self.m2) & MASK64
        x ^= x >> 33
        return x

    def bucket(self, f, value):
        return (self.mix64(value ^ self.seeds[f]) * self.rows[f]) >> 64

    @staticmethod
    def dense_value(text):
        """float32(log1p(max(float32(v), 0))) of a decimal integer; None if malformed."""
        digits = text[1:] if text[:1] in (b"-", b"+") else text
        if not digits or len(digits) > 18 or not digits.isdigit():
            return None
        v = int(text)
        return np.log1p(np.float32(max(v, 0)), dtype=np.float32)

    @staticmethod
    def hex_value(text):
        if not text or len(text) > 16 or not all(c in HEX_DIGITS for c in text):
            return None
        return int(text, 16)

    def parse(self, line):
        """(label or None, dense float32[13], ids (None = missing)) or a reason string."""
        if line.endswith(b"\r"):
            line = line[:-1]
        parts = line.split(b"\t")
        if not self.min_fields <= len(parts) <= self.max_fields:
            return f"{len(parts)} fields, expected {self.min_fields} to {self.max_fields}"
        label = None
        if self.labeled:
            if parts[0] not in (b"0", b"1"):
                return f"label {parts[0][:20]!r} is not 0 or 1"
            label = int(parts[0])
        dense = np.zeros(len(self.dense), dtype=np.float32)
        for j, d in enumerate(self.dense):
            text = parts[self.first + j]
            if text:
                v = self.dense_value(text)
                if v is None:
                    return f"{d['name']}: {text[:20]!r} is not an integer"
                dense[j] = v
        ids = []
        for f, field in enumerate(self.fields):
            k = self.first + len(self.dense) + f
            text = parts[k] if k < len(parts) else b""
            if not text:
                ids.append(None)
                continue
            v = self.hex_value(text)
            if v is None:
                return f"{field['name']}: {text[:20]!r} is not 1 to 16 hex digits"
            ids.append(self.bucket(f, v))
        return label, dense, ids


# ---------------------------------------------------------------- model


def relu(x):
    return np.maximum(x, 0.0)


class Model:
    """The forward pass `model.json` describes, in float64 over the exported float32 tensors."""

    def __init__(self, config, tensors):
        self.kind = config["kind"]
        if self.kind in ("dien", "dien-sum"):
            raise ScorerError(f"{self.kind}: DIEN models read behaviour sequences; this scorer reads Criteo records only")
        self.forward_spec = config["forward"]
        self.t = {name: v.astype(np.float64) for name, v in tensors.items()}
        for name, shape in config["tensors"].items():
            if name not in self.t:
                raise ScorerError(f"tensor {name} of model.json is missing from model.safetensors")
            if list(self.t[name].shape) != shape:
                raise ScorerError(f"tensor {name}: shape {list(self.t[name].shape)} in the file, {shape} in model.json")
        self.fields = config["sparse_fields"]
        self.num_dense = len(config["dense_features"])

    def pooled(self, table, ids, f):
        """Rows of `table` for field f's ids (zeros where the value is missing): [B, width]."""
        t = self.t[table]
        col = np.array([-1 if row[f] is None else row[f] for row in ids], dtype=np.int64)
        out = np.zeros((len(ids), t.shape[1]))
        present = col >= 0
        out[present] = t[col[present]]
        return out

    def mlp(self, spec, x):
        layers = spec["layers"]
        for i, name in enumerate(layers):
            x = x @ self.t[name + ".weight"].T + self.t[name + ".bias"]
            if i + 1 < len(layers) or spec["relu_after_last"]:
                x = relu(x)
        return x

    def inputs(self, names, dense, ids, known):
        """The concatenation of `names`: `dense`, a vector in `known`, or `pooled <table>`."""
        parts = []
        for name in names:
            if name == "dense":
                parts.append(dense)
            elif name in known:
                parts.append(known[name])
            elif name.startswith("pooled "):
                table = name[len("pooled "):]
                field = table.split(".", 1)[1]
                parts.append(self.pooled(table, ids, self.fields.index(field)))
            else:
                raise ScorerError(f"unknown input {name!r} in model.json")
        return np.concatenate(parts, axis=1) if parts else np.zeros((dense.shape[0], 0))

    def logits(self, dense, ids):
        dense = dense.astype(np.float64)
        fw = self.forward_spec
        if self.kind == "dlrm":
            bottom = self.mlp(fw["bottom"], self.inputs(fw["bottom"]["input"], dense, ids, {}))
            inter = fw["interaction"]
            z = [self.inputs([v], dense, ids, {"bottom": bottom}) for v in inter["vectors"]]
            dots = [np.sum(z[i] * z[j], axis=1, keepdims=True) for i, j in inter["pairs"]]
            x = np.concatenate([z[0]] + dots, axis=1)
            return self.mlp(fw["top"], x)[:, 0]
        if self.kind in ("lr", "fm", "deepfm", "wdl"):
            logit = np.full(dense.shape[0], self.t["linear.bias"][0])
            if "linear.weight" in self.t:
                logit += dense @ self.t["linear.weight"][0]
            for term in fw["terms"]:
                if term == "first_order":
                    for name in fw["first_order"]["fields"]:
                        logit += self.pooled("first_order." + name, ids, self.fields.index(name))[:, 0]
                elif term == "fm":
                    vs = [self.pooled("embeddings." + n, ids, self.fields.index(n)) for n in fw["fm"]["fields"]]
                    s = np.sum(vs, axis=0)
                    sq = np.sum([v * v for v in vs], axis=0)
                    logit += 0.5 * np.sum(s * s - sq, axis=1)
                elif term == "deep":
                    logit += self.mlp(fw["deep"], self.inputs(fw["deep"]["input"], dense, ids, {}))[:, 0]
                elif term != "linear":
                    raise ScorerError(f"unknown term {term!r} in model.json")
            return logit
        raise ScorerError(f"model kind {self.kind!r} is not one this scorer knows")


def sigmoid(x):
    """1 / (1 + exp(-x)), stable for large |x|."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


# ---------------------------------------------------------------- driver


def load(model_dir):
    try:
        with open(os.path.join(model_dir, "model.json")) as f:
            config = json.load(f)
        tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    except (OSError, ValueError) as e:
        raise ScorerError(f"{model_dir}: {e}")
    if config.get("format") != FORMAT or config.get("format_version") != FORMAT_VERSION:
        raise ScorerError(
            f"{model_dir}: format {config.get('format')!r} version {config.get('format_version')!r}, "
            f"expected {FORMAT!r} version {FORMAT_VERSION}"
        )
    return config, tensors


def score_files(model, featurizer, paths, writer, batch_size, limit):
    """Scores every record of `paths`, writing CSV rows; returns (scored, malformed)."""
    scored = bad = 0
    for path in paths:
        pending = []

        def flush():
            if not pending:
                return
            dense = np.stack([p[2] for p in pending])
            ids = [p[3] for p in pending]
            probs = sigmoid(model.logits(dense, ids))
            for (pos, label, _, _), p in zip(pending, probs):
                row = [path, pos, f"{p:.9g}"]
                if featurizer.labeled:
                    row.append(label)
                writer.writerow(row)
            pending.clear()

        try:
            f = open(path, "rb")
        except OSError as e:
            raise ScorerError(f"{path}: {e}")
        with f:
            for pos, line in enumerate(f, start=1):
                if limit is not None and scored + len(pending) >= limit:
                    break
                line = line[:-1] if line.endswith(b"\n") else line
                if line in (b"", b"\r"):
                    continue  # an empty line is no record
                parsed = featurizer.parse(line)
                if isinstance(parsed, str):
                    print(f"{path}:{pos}: malformed record: {parsed}", file=sys.stderr)
                    bad += 1
                    continue
                pending.append((pos,) + parsed)
                if len(pending) == batch_size:
                    scored += len(pending)
                    flush()
        scored += len(pending)
        flush()
    return scored, bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="directory written by `tiderec export`")
    ap.add_argument("--out", required=True, help="CSV file to write (`-`: stdout)")
    ap.add_argument("--unlabeled", action="store_true", help="records have no label column")
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--limit", type=int, default=None, help="score at most this many records")
    ap.add_argument("files", nargs="+", help="Criteo TSV files")
    args = ap.parse_args(argv)
    try:
        config, tensors = load(args.model)
        model = Model(config, tensors)
        featurizer = CriteoFeaturizer(config["features"], labeled=not args.unlabeled)
        try:
            out = sys.stdout if args.out == "-" else open(args.out, "w", newline="")
        except OSError as e:
            raise ScorerError(f"{args.out}: {e}")
        try:
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(["file", "position", "score"] + (["label"] if not args.unlabeled else []))
            scored, bad = score_files(model, featurizer, args.files, writer, max(args.batch_size, 1), args.limit)
        finally:
            if out is not sys.stdout:
                out.close()
    except ScorerError as e:
        print(f"reference_scorer: {e}", file=sys.stderr)
        return 2
    print(f"scored {scored} records with a {config['kind']} model, {bad} malformed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
