#!/usr/bin/env python3
"""Reference scorer for a `tiderec export` snapshot, in NumPy.

Rebuilds the model from `model.json` and `model.safetensors` alone (LR, FM,
DeepFM, Wide & Deep, DLRM, DIEN and its sum-pooling baseline, with or without
feature crosses), featurizes raw records as `model.json`'s `features` section
describes (the hashes are reimplemented here: the MurmurHash3 finaliser from the
constants in model.json, XXH3-64 from its specification) and writes one
probability per record:

    python3 scripts/reference_scorer.py --model serve/ --out scores.csv day_0.tsv

The output is CSV with the header `file,position,score` (`,label` added when
the records carry labels): `position` is the record's 1-based line number in
its file, `score` the click probability `sigmoid(logit)`. A malformed record is
not scored: it is reported on stderr with its file and line, and counted. When
more than `--max-bad-fraction` of the records read are malformed (default 0.01,
as `tiderec predict`), or no record is read, nothing is written.

`--out` is written whole or not at all: to `NAME.tmp-PID` beside it, moved into
place once every record is scored, removed on an error. An existing `--out` is
replaced only with `--overwrite`; an `--out` that is one of the inputs (a record
file, a file directly in a record directory, the model's files) is refused.

Records are read in the format model.json spells out: Criteo TSV
(`label, I1..I13, C1..C26`), Avazu CSV (`id, click, hour, C1, …, C21`, a
header line first), the DIEN sample format of `amazon-dien` (`label, user,
item, category, item history, category history`) or the delimited records of
a feature spec (`csv`, `taobao-ad`: dense and numeric-list columns,
hash / identity / vocabulary / bucketized categoricals, scaled dense values,
pooled lists and sequences). They are labeled unless `--unlabeled` is given (the
same lines without their label column). A model trained on Parquet files
(`tiderec convert` output) scores their featurized rows: give the files or their
directory; `position` is then a row's 0-based index in its file, as `tiderec
predict` numbers it. A model whose records model.json does not spell out is
refused with a message saying so (a checkpoint that records no feature pipeline,
generated or Taobao behaviour-log data).

Needs NumPy and safetensors (`pip install numpy safetensors`), and pyarrow for
Parquet rows. Exit status:
0 on success, 2 on a model or input it cannot score (too many malformed records
among them) or an `--out` it refuses to write.
"""

import argparse
import csv
import json
import os
import re
import shutil
import stat
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file

FORMAT = "tiderec-serving"
FORMAT_VERSION = 3
MASK64 = (1 << 64) - 1
HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
# The UTF-8 byte order mark some files start with.
UTF8_BOM = b"\xef\xbb\xbf"


class ScorerError(Exception):
    """A model or input this scorer cannot handle; the message names it."""


# ---------------------------------------------------------------- hashing


def rotl64(x, r):
    return ((x << r) | (x >> (64 - r))) & MASK64


def reduce_bucket(h, rows):
    """Multiply-shift range reduction: the high 64 bits of the 128-bit product `h * rows`."""
    return (h * rows) >> 64


class Mix64:
    """The MurmurHash3 finaliser and the seeds and buckets built on it (constants from model.json)."""

    def __init__(self, hash_section):
        self.m1 = int(hash_section["mix64"]["m1"], 16)
        self.m2 = int(hash_section["mix64"]["m2"], 16)
        self.golden = int(hash_section["field_seed"]["golden"], 16)

    def __call__(self, x):
        x ^= x >> 33
        x = (x * self.m1) & MASK64
        x ^= x >> 33
        x = (x * self.m2) & MASK64
        x ^= x >> 33
        return x

    def field_seed(self, seed, f):
        return self(seed ^ self(self.golden ^ f))

    def bucket(self, seed, value, rows):
        return reduce_bucket(self(value ^ seed), rows)


# XXH3-64 (xxHash 0.8, `XXH3_64bits_withSeed`), written from the specification.
_P32_1, _P32_2, _P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
_P64_1, _P64_2, _P64_3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P64_4, _P64_5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)


def _u32(b, i):
    return int.from_bytes(b[i : i + 4], "little")


def _u64(b, i):
    return int.from_bytes(b[i : i + 8], "little")


def _fold(a, b):
    p = a * b
    return (p & MASK64) ^ (p >> 64)


def _avalanche(h):
    h ^= h >> 37
    h = (h * 0x165667919E3779F9) & MASK64
    return h ^ (h >> 32)


def _xxh64_avalanche(h):
    h ^= h >> 33
    h = (h * _P64_2) & MASK64
    h ^= h >> 29
    h = (h * _P64_3) & MASK64
    return h ^ (h >> 32)


def _mix16(data, i, secret, s, seed):
    lo = _u64(data, i) ^ ((_u64(secret, s) + seed) & MASK64)
    hi = _u64(data, i + 8) ^ ((_u64(secret, s + 8) - seed) & MASK64)
    return _fold(lo, hi)


def _xxh3_long(data, secret):
    acc = [_P32_3, _P64_1, _P64_2, _P64_3, _P64_4, _P32_2, _P64_5, _P32_1]
    n = len(data)

    def accumulate(at, s):
        for k in range(8):
            v = _u64(data, at + 8 * k)
            key = v ^ _u64(secret, s + 8 * k)
            acc[k ^ 1] = (acc[k ^ 1] + v) & MASK64
            acc[k] = (acc[k] + (key & 0xFFFFFFFF) * (key >> 32)) & MASK64

    stripes = (len(secret) - 64) // 8
    block = 64 * stripes
    blocks = (n - 1) // block
    for b in range(blocks):
        for st in range(stripes):
            accumulate(b * block + 64 * st, 8 * st)
        for k in range(8):
            a = acc[k] ^ (acc[k] >> 47) ^ _u64(secret, len(secret) - 64 + 8 * k)
            acc[k] = (a * _P32_1) & MASK64
    for st in range(((n - 1) - block * blocks) // 64):
        accumulate(blocks * block + 64 * st, 8 * st)
    accumulate(n - 64, len(secret) - 64 - 7)
    h = (n * _P64_1) & MASK64
    for k in range(4):
        h = (h + _fold(acc[2 * k] ^ _u64(secret, 11 + 16 * k), acc[2 * k + 1] ^ _u64(secret, 19 + 16 * k))) & MASK64
    return _avalanche(h)


def xxh3_64(data, seed):
    """`XXH3_64bits_withSeed(data, seed)`: the 64-bit XXH3 hash of the bytes `data`."""
    n, s = len(data), _SECRET
    if n == 0:
        return _xxh64_avalanche(seed ^ _u64(s, 56) ^ _u64(s, 64))
    if n <= 3:
        combo = (data[0] << 16) | (data[n >> 1] << 24) | data[n - 1] | (n << 8)
        return _xxh64_avalanche(combo ^ (((_u32(s, 0) ^ _u32(s, 4)) + seed) & MASK64))
    if n <= 8:
        seed ^= int.from_bytes((seed & 0xFFFFFFFF).to_bytes(4, "little"), "big") << 32
        v = (_u32(data, n - 4) + (_u32(data, 0) << 32)) & MASK64
        h = v ^ (((_u64(s, 8) ^ _u64(s, 16)) - seed) & MASK64)
        h ^= rotl64(h, 49) ^ rotl64(h, 24)
        h = (h * 0x9FB21C651E98DF25) & MASK64
        h ^= (h >> 35) + n
        h = (h * 0x9FB21C651E98DF25) & MASK64
        return h ^ (h >> 28)
    if n <= 16:
        lo = _u64(data, 0) ^ (((_u64(s, 24) ^ _u64(s, 32)) + seed) & MASK64)
        hi = _u64(data, n - 8) ^ (((_u64(s, 40) ^ _u64(s, 48)) - seed) & MASK64)
        swapped = int.from_bytes(lo.to_bytes(8, "little"), "big")
        return _avalanche((n + swapped + hi + _fold(lo, hi)) & MASK64)
    if n <= 128:
        acc = (n * _P64_1) & MASK64
        if n > 32:
            if n > 64:
                if n > 96:
                    acc += _mix16(data, 48, s, 96, seed) + _mix16(data, n - 64, s, 112, seed)
                acc += _mix16(data, 32, s, 64, seed) + _mix16(data, n - 48, s, 80, seed)
            acc += _mix16(data, 16, s, 32, seed) + _mix16(data, n - 32, s, 48, seed)
        acc += _mix16(data, 0, s, 0, seed) + _mix16(data, n - 16, s, 16, seed)
        return _avalanche(acc & MASK64)
    if n <= 240:
        acc = (n * _P64_1) & MASK64
        for i in range(8):
            acc += _mix16(data, 16 * i, s, 16 * i, seed)
        acc = _avalanche(acc & MASK64)
        for i in range(8, n // 16):
            acc += _mix16(data, 16 * i, s, 16 * (i - 8) + 3, seed)
        acc += _mix16(data, n - 16, s, 136 - 17, seed)
        return _avalanche(acc & MASK64)
    if seed:
        custom = bytearray()
        for i in range(0, len(s), 16):
            custom += ((_u64(s, i) + seed) & MASK64).to_bytes(8, "little")
            custom += ((_u64(s, i + 8) - seed) & MASK64).to_bytes(8, "little")
        s = bytes(custom)
    return _xxh3_long(data, s)


# ---------------------------------------------------------------- features
#
# A featurizer turns one line into (label or None, dense float32[num_dense],
# bags, sequences) or a reason string for a malformed record: `bags` holds each
# sparse field's row ids (empty for a missing value), `sequences` each sequence
# field's row ids, oldest event first.


class CriteoFeaturizer:
    """Criteo TSV featurization rebuilt from model.json's `features` section."""

    def __init__(self, features, labeled):
        h = features["hash"]
        self.mix = Mix64(h)
        seed = int(h["hash_seed"]) & MASK64
        self.fields = features["categorical"]
        self.dense = features["dense"]
        self.seeds = []
        for f in self.fields:
            s = self.mix.field_seed(seed, f["field_index"])
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

    def is_header(self, line):
        return False

    @staticmethod
    def dense_value(text):
        """float32(log1p(max(float32(v), 0))) of a decimal integer; None if malformed."""
        digits = text[1:] if text[:1] in (b"-", b"+") else text
        if not digits or len(digits) > 18 or not digits.isdigit():
            return None
        v = int(text)
        return np.log1p(np.float32(max(v, 0)), dtype=np.float32)

    @staticmethod
    def is_hash(text):
        """Whether a field is 8 hex digits, the shape of a categorical hash."""
        return len(text) == 8 and all(c in HEX_DIGITS for c in text)

    @staticmethod
    def hex_value(text):
        if not text or len(text) > 16 or not all(c in HEX_DIGITS for c in text):
            return None
        return int(text, 16)

    def parse(self, line):
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
        i13 = self.first + 12  # I13: the last of the 13 dense columns
        if len(parts) < self.max_fields and self.is_hash(parts[i13]):
            # Only trailing C fields can be missing: a hash at I13's place is a line that
            # lacks a leading column (an unlabeled line read as labeled), as tiderec refuses.
            return f"{len(parts)} fields, expected {self.max_fields}: field {i13} is a categorical hash"
        dense = np.zeros(len(self.dense), dtype=np.float32)
        for j, d in enumerate(self.dense):
            text = parts[self.first + j]
            if text:
                v = self.dense_value(text)
                if v is None:
                    return f"{d['name']}: {text[:20]!r} is not an integer"
                dense[j] = v
        bags = []
        for f, field in enumerate(self.fields):
            k = self.first + len(self.dense) + f
            text = parts[k] if k < len(parts) else b""
            if not text:
                bags.append([])
                continue
            v = self.hex_value(text)
            if v is None:
                return f"{field['name']}: {text[:20]!r} is not 1 to 16 hex digits"
            bags.append([self.mix.bucket(self.seeds[f], v, self.rows[f])])
        return label, dense, bags, []


class TokenTables:
    """Tables whose rows are XXH3 hashes of tokens: model.json's `tables` and `hash` sections."""

    def __init__(self, features):
        h = features["hash"]
        if h.get("function") != "xxh3_64_with_seed":
            raise ScorerError(f"hash {h.get('function')!r}: this scorer knows xxh3_64_with_seed")
        mix = Mix64(h)
        seed = int(h["hash_seed"]) & MASK64
        self.seeds, self.rows = [], []
        for t, table in enumerate(features["tables"]):
            s = mix.field_seed(seed, t)
            if s != int(table["seed"], 16):
                raise ScorerError(f"table {table['name']}: derived seed {s:#x} differs from model.json's {table['seed']}")
            self.seeds.append(s)
            self.rows.append(int(table["rows"]))

    def bucket(self, table, token):
        return reduce_bucket(xxh3_64(token, self.seeds[table]), self.rows[table])


class AmazonDienFeaturizer:
    """The DIEN sample format (`amazon-dien`) rebuilt from model.json's `features` section."""

    def __init__(self, features, labeled):
        self.tables = TokenTables(features)
        record = features["record"]
        self.num_columns = int(record["columns_count"])
        self.history_delimiter = bytes([int(record["history_delimiter"], 16)])
        self.fields = features["categorical"]
        self.sequences = features["sequences"]
        self.max_len = int(features["max_len"])
        self.labeled = labeled

    def is_header(self, line):
        return False

    def parse(self, line):
        if line.endswith(b"\r"):
            line = line[:-1]
        if not self.labeled:
            line = b"0\t" + line  # an unlabeled line is featurized as the labeled one
        parts = line.split(b"\t")
        if len(parts) != self.num_columns:
            shift = 0 if self.labeled else 1
            return f"{len(parts) - shift} fields, expected {self.num_columns - shift}"
        label = None
        if self.labeled:
            if parts[0] not in (b"0", b"1"):
                return f"label {parts[0][:20]!r} is not 0 or 1"
            label = int(parts[0])
        histories = [parts[s["column"]] for s in self.sequences]
        counts = {h.count(self.history_delimiter) for h in histories}
        if len(counts) > 1 or len({not h for h in histories}) > 1:
            return "the histories have different lengths"
        bags = []
        for field in self.fields:
            value = parts[field["column"]]
            bags.append([self.tables.bucket(field["table"], value)] if value else [])
        # One list of events: an event with an empty token is skipped in every history.
        split = [h.split(self.history_delimiter) if h else [] for h in histories]
        events = [e for e in zip(*split) if all(e)]
        events = events[max(len(events) - self.max_len, 0) :]
        seqs = [[self.tables.bucket(s["table"], e[k]) for e in events] for k, s in enumerate(self.sequences)]
        return label, np.zeros(0, dtype=np.float32), bags, seqs


class AvazuFeaturizer:
    """Avazu CSV (`avazu`) rebuilt from model.json's `features` section."""

    def __init__(self, features, labeled):
        self.tables = TokenTables(features)
        record = features["record"]
        self.num_columns = int(record["columns_count"])
        self.label_column = int(record["label_column"])
        self.header_prefix = record["header_prefix"].encode()
        self.hour_column = int(features["dense"][0]["column"])
        self.fields = features["categorical"]
        self.labeled = labeled

    def is_header(self, line):
        return line.startswith(self.header_prefix)

    def parse(self, line):
        if line.endswith(b"\r"):
            line = line[:-1]
        parts = line.split(b",")
        if not self.labeled:
            parts.insert(self.label_column, b"0")  # featurized as the labeled line
        if len(parts) != self.num_columns:
            shift = 0 if self.labeled else 1
            return f"{len(parts) - shift} fields, expected {self.num_columns - shift}"
        label = None
        if self.labeled:
            text = parts[self.label_column]
            if text not in (b"0", b"1"):
                return f"label {text[:20]!r} is not 0 or 1"
            label = int(text)
        when = parts[self.hour_column]
        if len(when) != 8 or not when.isdigit() or int(when[6:]) > 23:
            return f"hour {when[:20]!r} is not YYMMDDHH"
        hour = int(when[6:])
        dense = np.array([np.float32(hour) / np.float32(23.0)], dtype=np.float32)
        bags = []
        for field in self.fields:
            if field["column"] == self.hour_column:
                token = bytes([hour])  # the hour of day as one byte
            else:
                token = parts[field["column"]]
            bags.append([self.tables.bucket(field["table"], token)] if token else [])
        return label, dense, bags, []


class MeanBag(list):
    """The ids of a `pooling = "mean"` list: each row weighted float32(1 / n)."""


_FLOAT = re.compile(rb"[+-]?(?:[0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|(?i:inf|infinity|nan))")
_INT = re.compile(rb"[+-]?[0-9]{1,18}")


def parse_f32(text):
    """A decimal number (Rust's `str::parse::<f32>` syntax) as float32; None if it is not one."""
    if not _FLOAT.fullmatch(text):
        return None
    return np.float32(float(text))


class SpecFeaturizer:
    """Records of a feature spec (`csv`, `taobao-ad`) rebuilt from model.json's `features` section."""

    def __init__(self, features, labeled):
        mix = Mix64(features["hash"])
        seed = int(features["hash"]["hash_seed"]) & MASK64
        if features["hash"].get("function") != "xxh3_64_with_seed":
            raise ScorerError(f"hash {features['hash'].get('function')!r}: this scorer knows xxh3_64_with_seed")
        record = features["record"]
        self.delimiter = record["separator"].encode()
        self.columns = [c.encode() for c in record["columns"]]
        self.header = bool(record["header"])
        self.label_column = int(record["label_column"])
        self.dense = features["dense"]
        self.numeric = features["numeric_lists"]
        self.fields = features["categorical"]
        self.lists = features["lists"]
        for item in self.fields + self.lists:
            s = mix.field_seed(seed, int(item["seed_index"]))
            if s != int(item["seed"], 16):
                raise ScorerError(f"{item['name']}: derived seed {s:#x} differs from model.json's {item['seed']}")
            item["_seed"] = s
        for f in self.fields:
            if f["encoding"] == "vocabulary":
                if "vocabulary" not in f:
                    raise ScorerError(f"{f['name']}: its vocabulary is not in model.json ({f.get('note')})")
                f["_vocabulary"] = {t.encode(): i for i, t in enumerate(f["vocabulary"])}
            elif f["encoding"] in ("bucketize", "quantile"):
                f["_boundaries"] = np.array(f["boundaries"], dtype=np.float32)
            elif f["encoding"] not in ("hash", "identity"):
                raise ScorerError(f"{f['name']}: unknown encoding {f['encoding']!r}")
        self.num_sequences = sum(1 for l in self.lists if l["pooling"] == "none")
        self.num_pooled = len(self.lists) - self.num_sequences
        self.labeled = labeled

    def is_header(self, line):
        if not self.header:
            return False
        line = line[:-1] if line.endswith(b"\r") else line
        if line.startswith(self.columns[0]):
            return True
        if self.labeled:
            return False
        parts = line.split(self.delimiter)
        parts.insert(self.label_column, self.columns[self.label_column])
        return self.delimiter.join(parts).startswith(self.columns[0])

    def categorical_id(self, f, raw):
        """The row of a non-empty value; None for an absent one; a string when malformed."""
        if f["encoding"] == "hash":
            return reduce_bucket(xxh3_64(raw, f["_seed"]), int(f["rows"]))
        if f["encoding"] == "identity":
            v = int(raw) if _INT.fullmatch(raw) else -1
            return v if 0 <= v < int(f["rows"]) else f"{f['name']}: {raw[:20]!r} is not an id below {f['rows']}"
        if "_boundaries" in f:
            v = parse_f32(raw)
            if v is None or not np.isfinite(v):
                return f"{f['name']}: {raw[:20]!r} is not a finite number"
            return int(np.searchsorted(f["_boundaries"], v, side="right"))
        v = f["_vocabulary"].get(raw)
        if v is not None:
            return v
        oov = int(f["oov_buckets"])
        return len(f["_vocabulary"]) + reduce_bucket(xxh3_64(raw, f["_seed"]), oov) if oov else None

    @staticmethod
    def list_ids(l, raw):
        """The first max_len non-empty tokens of a pooled list, hashed into its table."""
        tokens = [t for t in raw.split(l["delimiter"].encode()[:1]) if t][: int(l["max_len"])]
        return [reduce_bucket(xxh3_64(t, l["_seed"]), int(l["rows"])) for t in tokens]

    @staticmethod
    def sequence_ids(lists, parts):
        """The `none` lists read together, position by position (model.json's list_rules),
        or a reason string for a malformed record."""
        def split(l):
            raw = parts[l["column"]]
            return raw.split(l["delimiter"].encode()[:1]) if raw else []

        positions = [split(l) for l in lists]
        if len({len(p) for p in positions}) > 1:
            return "the sequence lists have different lengths"
        kept = [k for k in range(len(positions[0])) if all(p[k] for p in positions)][: int(lists[0]["max_len"])]
        hashed = zip(lists, positions)
        return [[reduce_bucket(xxh3_64(p[k], l["_seed"]), int(l["rows"])) for k in kept] for l, p in hashed]

    def parse(self, line):
        if line.endswith(b"\r"):
            line = line[:-1]
        parts = line.split(self.delimiter)
        if not self.labeled:
            parts.insert(self.label_column, b"0")  # featurized as the labeled line
        if len(parts) != len(self.columns):
            shift = 0 if self.labeled else 1
            return f"{len(parts) - shift} fields, expected {len(self.columns) - shift}"
        label = None
        if self.labeled:
            text = parts[self.label_column]
            if text not in (b"0", b"1"):
                return f"label {text[:20]!r} is not 0 or 1"
            label = int(text)
        dense = []
        for d in self.dense:
            raw = parts[d["column"]]
            v = np.float32(0.0)
            if raw:
                v = parse_f32(raw)
                if v is None or not np.isfinite(v):
                    return f"{d['name']}: {raw[:20]!r} is not a finite number"
            if d["clamp"] is not None:
                v = np.float32(min(max(v, np.float32(d["clamp"][0])), np.float32(d["clamp"][1])))
            if d["log1p"]:
                v = np.log1p(np.float32(max(v, np.float32(0.0))), dtype=np.float32)
            if d.get("scale") is not None:
                v = (v - np.float32(d["scale"]["center"])) / np.float32(d["scale"]["width"])
            if not np.isfinite(v):
                return f"{d['name']}: {raw[:20]!r} is not finite after its transform"
            dense.append(v)
        for n in self.numeric:
            values = []
            for t in parts[n["column"]].split(n["delimiter"].encode()[:1]):
                if t:
                    v = parse_f32(t)
                    if v is None:
                        return f"{n['name']}: {t[:20]!r} is not a number"
                    values.append(float(v))
            total = 0.0
            for v in values:  # in order, in float64, rounded to float32 once
                total += v
            v = np.float32(0.0 if not values else total if n["reduce"] == "sum" else total / len(values))
            if not np.isfinite(v):
                return f"{n['name']}: not finite"
            dense.append(v)
        bags = []
        for f in self.fields:
            raw = parts[f["column"]]
            v = self.categorical_id(f, raw) if raw else None
            if isinstance(v, str):
                return v
            bags.append([] if v is None else [v])
        seqs = [None] * self.num_sequences
        pooled = [None] * self.num_pooled
        for l in self.lists:
            if l["pooling"] != "none":
                ids = self.list_ids(l, parts[l["column"]])
                pooled[l["slot"] - len(self.fields)] = MeanBag(ids) if l["pooling"] == "mean" else ids
        sequence_lists = [l for l in self.lists if l["pooling"] == "none"]
        if sequence_lists:
            ids = self.sequence_ids(sequence_lists, parts)
            if isinstance(ids, str):
                return ids
            for l, q in zip(sequence_lists, ids):
                seqs[l["slot"]] = q
        return label, np.array(dense, dtype=np.float32), bags + pooled, seqs


class Crosses:
    """Feature crosses appended after the data's sparse fields (model.json's `crosses`)."""

    def __init__(self, section, mix, hash_seed):
        if "pairs" not in section:
            raise ScorerError(f"the model has feature crosses that model.json cannot rebuild: {section.get('note')}")
        self.mix = mix
        self.pairs = [tuple(p) for p in section["pairs"]]
        self.rows = int(section["rows"])
        self.max_pairs = int(section["max_pairs"])
        salt = int(section["hash"]["salt"], 16)
        self.seeds = [mix.field_seed((hash_seed ^ salt) & MASK64, c) for c in range(len(self.pairs))]
        r = int(section["hash"]["rotate"])
        self.rotate = lambda b: rotl64(b, r)

    def append(self, bags):
        for c, (a, b) in enumerate(self.pairs):
            ids = []
            for x in bags[a]:
                for y in bags[b]:
                    if len(ids) < self.max_pairs:
                        ids.append(self.mix.bucket(self.seeds[c], self.mix(x) ^ self.rotate(y), self.rows))
            bags.append(ids)


class ParquetFeaturizer:
    """The featurized rows of Parquet files (`tiderec convert`): model.json's `parquet` section
    names the columns; the ids are stored, so nothing is hashed (crosses aside)."""

    def __init__(self, features, labeled):
        self.label = features["label"]["column"]
        self.dense = [d["column"] for d in features["dense"]]
        self.sparse = [(f["column"], f["kind"], int(f["rows"])) for f in features["sparse"]]
        self.sequences = [(q["column"], self.sparse[q["table"]][2]) for q in features["sequences"] if q["read_by_model"]]
        self.labeled = labeled

    @staticmethod
    def files(paths):
        """`paths` with each directory replaced by its `.parquet` files, in name order."""
        out = []
        for path in paths:
            if os.path.isdir(path):
                names = sorted(n for n in os.listdir(path) if n.endswith(".parquet"))
                if not names:
                    raise ScorerError(f"{path}: no .parquet files")
                out.extend(os.path.join(path, n) for n in names)
            else:
                out.append(path)
        return out

    def rows(self, path, batch_size):
        """Yields `(position, (label, dense, bags, sequences))` for every row of `path`, 0-based
        positions, or `(position, reason)` for a row that breaks the schema."""
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ScorerError("Parquet rows need pyarrow (pip install pyarrow)")
        try:
            f = pq.ParquetFile(path)
        except (OSError, ValueError) as e:
            raise ScorerError(f"{path}: not a Parquet file the model's rows were written to: {e}")
        names = set(f.schema_arrow.names)
        wanted = [self.label] + self.dense + [c for c, _, _ in self.sparse] + [c for c, _ in self.sequences]
        missing = [c for c in wanted if c not in names]
        if missing:
            raise ScorerError(f"{path}: no column {', '.join(missing)} (the model reads {', '.join(wanted)})")
        position = 0
        for batch in f.iter_batches(batch_size=batch_size, columns=wanted):
            cols = {name: batch.column(name).to_pylist() for name in wanted}
            for i in range(batch.num_rows):
                yield position, self.row(cols, i)
                position += 1

    def row(self, cols, i):
        label = cols[self.label][i]
        dense = np.array([cols[c][i] for c in self.dense], dtype=np.float32)
        bags = []
        for column, kind, rows in self.sparse:
            v = cols[column][i]
            ids = [] if v is None else ([v] if kind == "single" else list(v))
            if any(x >= rows for x in ids):
                return f"an id of `{column}` is not below its {rows} rows"
            bags.append(ids)
        seqs = []
        for column, rows in self.sequences:
            ids = list(cols[column][i] or [])
            if any(x >= rows for x in ids):
                return f"an id of `{column}` is not below its {rows} rows"
            seqs.append(ids)
        if len({len(q) for q in seqs}) > 1:
            return "the sequences have different lengths"
        return (f"{label:g}" if label is not None else None), dense, bags, seqs


class Featurizer:
    """The featurization of model.json: the format's reader, then the crosses."""

    def __init__(self, features, labeled):
        fmt = features.get("format")
        if fmt == "criteo-tsv":
            self.reader = CriteoFeaturizer(features, labeled)
        elif fmt == "amazon-dien":
            self.reader = AmazonDienFeaturizer(features, labeled)
        elif fmt == "avazu":
            self.reader = AvazuFeaturizer(features, labeled)
        elif fmt in ("csv", "taobao-ad") and "lists" in features:
            self.reader = SpecFeaturizer(features, labeled)
        elif fmt == "parquet" and "sparse" in features:
            self.reader = ParquetFeaturizer(features, labeled)
        else:
            raise ScorerError(
                f"features format {fmt!r}: model.json spells out criteo-tsv, avazu, amazon-dien, feature-spec "
                f"(csv, taobao-ad) records and Parquet rows only "
                f"({features.get('note', 'no note')})"
            )
        self.labeled = labeled
        self.crosses = None
        if "crosses" in features:
            h = features["hash"]
            self.crosses = Crosses(features["crosses"], Mix64(h), int(h["hash_seed"]) & MASK64)

    @property
    def parquet(self):
        return isinstance(self.reader, ParquetFeaturizer)

    def records(self, path, batch_size):
        """Yields `(position, parsed)` for every record of `path`: a line's 1-based number (headers
        and empty lines skipped) or a Parquet row's 0-based index."""
        if self.parquet:
            for pos, parsed in self.reader.rows(path, batch_size):
                yield pos, self.crossed(parsed)
            return
        try:
            f = open(path, "rb")
        except OSError as e:
            raise ScorerError(f"{path}: {e}")
        with f:
            for pos, line in enumerate(f, start=1):
                line = line[:-1] if line.endswith(b"\n") else line
                if pos == 1 and line.startswith(UTF8_BOM):
                    line = line[len(UTF8_BOM):]  # as tiderec's readers strip it
                if line in (b"", b"\r"):
                    continue  # an empty line is no record
                if pos == 1 and self.reader.is_header(line):
                    continue
                yield pos, self.crossed(self.reader.parse(line))

    def crossed(self, parsed):
        if not isinstance(parsed, str) and self.crosses is not None:
            self.crosses.append(parsed[2])
        return parsed


# ---------------------------------------------------------------- model


def relu(x):
    return np.maximum(x, 0.0)


def sigmoid(x):
    """1 / (1 + exp(-x)), stable for large |x|."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def input_parts(names, dense, known, pooled):
    """The parts of a model.json input list, in order: `dense`, a vector of `known`, or
    `pooled(table)` for `pooled <table>` (`embeddings.C1` reads field `C1`)."""
    parts = []
    for name in names:
        if name == "dense":
            parts.append(dense)
        elif name in known:
            parts.append(known[name])
        elif name.startswith("pooled "):
            parts.append(pooled(name[len("pooled ") :]))
        else:
            raise ScorerError(f"unknown input {name!r} in model.json")
    return parts


class Model:
    """The forward pass `model.json` describes, in float64 over the exported float32 tensors."""

    def __init__(self, config, tensors):
        self.kind = config["kind"]
        self.forward_spec = config["forward"]
        self.t = {name: v.astype(np.float64) for name, v in tensors.items()}
        for name, shape in config["tensors"].items():
            if name not in self.t:
                raise ScorerError(f"tensor {name} of model.json is missing from model.safetensors")
            if list(self.t[name].shape) != shape:
                raise ScorerError(f"tensor {name}: shape {list(self.t[name].shape)} in the file, {shape} in model.json")
        self.fields = config["sparse_fields"]
        self.num_dense = len(config["dense_features"])

    def pooled(self, table, bags):
        """Per record, the sum of `table`'s rows for the ids of `bags` (zeros for an empty bag): [B, width]."""
        t = self.t[table]
        out = np.zeros((len(bags), t.shape[1]))
        rec = [i for i, bag in enumerate(bags) for _ in bag]
        ids = [x for bag in bags for x in bag]
        if ids:
            rows = t[np.array(ids, dtype=np.int64)]
            # A mean-pooled list weighs each of its n rows float32(1 / n).
            w = [float(np.float32(1.0) / np.float32(len(bag))) if isinstance(bag, MeanBag) else 1.0 for bag in bags for _ in bag]
            np.add.at(out, np.array(rec), rows * np.array(w)[:, None])
        return out

    def field_bags(self, bags, name):
        f = self.fields.index(name)
        return [b[f] for b in bags]

    def mlp(self, spec, x):
        layers = spec["layers"]
        for i, name in enumerate(layers):
            x = x @ self.t[name + ".weight"].T + self.t[name + ".bias"]
            if i + 1 < len(layers) or spec["relu_after_last"]:
                x = relu(x)
        return x

    def inputs(self, names, dense, bags, known):
        """The concatenation of `names` (see `input_parts`)."""
        pooled = lambda table: self.pooled(table, self.field_bags(bags, table.split(".", 1)[1]))
        parts = input_parts(names, dense, known, pooled)
        return np.concatenate(parts, axis=1) if parts else np.zeros((dense.shape[0], 0))


    def logits(self, dense, bags, seqs):
        dense = dense.astype(np.float64)
        fw = self.forward_spec
        if self.kind == "dlrm":
            bottom = self.mlp(fw["bottom"], self.inputs(fw["bottom"]["input"], dense, bags, {}))
            inter = fw["interaction"]
            z = [self.inputs([v], dense, bags, {"bottom": bottom}) for v in inter["vectors"]]
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
                        logit += self.pooled("first_order." + name, self.field_bags(bags, name))[:, 0]
                elif term == "fm":
                    vs = [self.pooled("embeddings." + n, self.field_bags(bags, n)) for n in fw["fm"]["fields"]]
                    s = np.sum(vs, axis=0)
                    sq = np.sum([v * v for v in vs], axis=0)
                    logit += 0.5 * np.sum(s * s - sq, axis=1)
                elif term == "deep":
                    logit += self.mlp(fw["deep"], self.inputs(fw["deep"]["input"], dense, bags, {}))[:, 0]
                elif term != "linear":
                    raise ScorerError(f"unknown term {term!r} in model.json")
            return logit
        if self.kind in ("dien", "dien-sum"):
            return self.dien(dense, bags, seqs)
        raise ScorerError(f"model kind {self.kind!r} is not one this scorer knows")

    def dien(self, dense, bags, seqs):
        fw = self.forward_spec
        seq_spec = fw["sequences"]
        if not seqs or len(seqs[0]) != len(seq_spec["fields"]):
            got = len(seqs[0]) if seqs else 0
            raise ScorerError(f"the records have {got} sequence fields, the model reads {len(seq_spec['fields'])}")
        q = np.concatenate([self.pooled("embeddings." + n, self.field_bags(bags, n)) for n in fw["q"]["fields"]], axis=1)
        batch, e = q.shape
        # The steps: x_t = concat over the sequence fields of the row of event t; the
        # length is the first sequence field's (the formats give every field one length).
        lengths = np.array([len(s[0]) for s in seqs], dtype=np.int64)
        steps = int(lengths.max()) if batch else 0
        x = np.zeros((batch, steps, e))
        at = 0
        for j, table in enumerate(seq_spec["tables"]):
            t = self.t[table]
            d = t.shape[1]
            for i, s in enumerate(seqs):
                ids = s[j][: lengths[i]]
                if ids:
                    x[i, : len(ids), at : at + d] = t[np.array(ids, dtype=np.int64)]
            at += d
        if at != e:
            raise ScorerError(f"the sequence steps are {at} wide, the target q {e}")
        valid = np.arange(steps)[None, :] < lengths[:, None]  # [B, T]
        interest = fw["interest"]["kind"]
        if interest == "sum-pooling":
            u = np.sum(x * valid[:, :, None], axis=1)
        elif interest == "gru-attention":
            u = self.gru_attention(x, valid, q)
        else:
            raise ScorerError(f"unknown interest {interest!r} in model.json")
        mlp_in = self.inputs(fw["mlp"]["input"], dense, bags, {"u": u, "u ⊙ q": u * q})
        return self.mlp(fw["mlp"], mlp_in)[:, 0]

    def gru_attention(self, x, valid, q):
        """torch.nn.GRU over the valid steps (gate rows r, z, n), keys h_t + x_t, bilinear softmax attention."""
        batch, steps, e = x.shape
        w_ih, w_hh = self.t["gru.weight_ih_l0"], self.t["gru.weight_hh_l0"]
        b_ih, b_hh = self.t["gru.bias_ih_l0"], self.t["gru.bias_hh_l0"]
        gx = x @ w_ih.T + b_ih  # [B, T, 3E]
        h = np.zeros((batch, e))
        states = np.zeros_like(x)
        for t in range(steps):
            gh = h @ w_hh.T + b_hh
            r = sigmoid(gx[:, t, :e] + gh[:, :e])
            z = sigmoid(gx[:, t, e : 2 * e] + gh[:, e : 2 * e])
            n = np.tanh(gx[:, t, 2 * e :] + r * gh[:, 2 * e :])
            h_new = (1.0 - z) * n + z * h
            h = np.where(valid[:, t, None], h_new, h)  # past its length a row keeps its state
            states[:, t] = h
        keys = states + x
        wq = q @ self.t["attention.weight"].T  # (W q) per record
        scores = np.einsum("bte,be->bt", keys, wq)
        scores = np.where(valid, scores, -np.inf)
        top = np.max(scores, axis=1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)
        alpha = np.where(valid, np.exp(scores - top), 0.0)
        total = np.sum(alpha, axis=1, keepdims=True)
        alpha = alpha / np.where(total > 0, total, 1.0)  # an empty history pools to zeros
        return np.einsum("bt,bte->be", alpha, keys)


# ---------------------------------------------------------------- driver


def initial_rows(init, entry, width):
    """The initial values of every row of a compact table tensor (model.json's `compact_tables`):
    `[table_rows, width]` float32, exactly as tiderec's stores initialise them."""
    u64 = np.uint64
    m1, m2 = u64(int(init["mix64"]["m1"], 16)), u64(int(init["mix64"]["m2"], 16))

    def mix(x):
        x = x ^ (x >> u64(33))
        x = x * m1
        x = x ^ (x >> u64(33))
        x = x * m2
        return x ^ (x >> u64(33))

    seed, offset = u64(int(init["seed"])), u64(int(init["offset"], 16))
    first = int(entry["columns"][0])
    ids = np.arange(int(entry["table_rows"]), dtype=np.uint64)[:, None]
    cols = np.arange(first, first + width, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        h = mix(seed ^ mix(u64(int(entry["table"])) ^ mix((ids + offset) ^ mix(cols))))
    u = (h >> u64(11)).astype(np.float64) * (1.0 / float(1 << 53))
    return ((u * 2.0 - 1.0) * np.float64(np.float32(entry["bound"]))).astype(np.float32)


def expand_compact(config, tensors):
    """Whole tables from a compact export's listed rows and what the others hold (their
    initial values, or zeros)."""
    section = config.get("compact_tables")
    if section is None:
        return tensors
    for name, entry in section["tensors"].items():
        ids_name, rows_name = entry["ids"], entry["rows"]
        if ids_name not in tensors or rows_name not in tensors:
            raise ScorerError(f"compact table {name}: {ids_name} or {rows_name} is missing from model.safetensors")
        ids, rows = tensors.pop(ids_name).astype(np.int64), tensors.pop(rows_name)
        if section["others"] == "init":
            whole = initial_rows(section["init"], entry, rows.shape[1])
        elif section["others"] == "zero":
            whole = np.zeros((int(entry["table_rows"]), rows.shape[1]), dtype=np.float32)
        else:
            raise ScorerError(f"compact tables whose other rows hold {section['others']!r}")
        if len(ids) and (ids.min() < 0 or ids.max() >= whole.shape[0]):
            raise ScorerError(f"compact table {name}: an id is outside its {whole.shape[0]} rows")
        whole[ids] = rows
        tensors[name] = whole
    return tensors


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
    return config, expand_compact(config, tensors)


def bad_reason(reason):
    """The kind of a malformed record's reason, named as `tiderec` counts them."""
    if reason.startswith("label "):
        return "bad_label"
    if re.match(r"[0-9]+ fields, expected", reason):
        return "field_count"
    if reason.endswith("is not an integer"):
        return "bad_integer"
    if reason.endswith("hex digits"):
        return "bad_hex"
    if "finite" in reason:
        return "non_finite"
    return "other"


def score_files(model, featurizer, paths, writer, batch_size, limit):
    """Scores every record of `paths`, writing CSV rows; returns `(scored, malformed)`, the
    malformed records counted by kind (`bad_reason`)."""
    scored, bad = 0, {}
    if featurizer.parquet:
        paths = ParquetFeaturizer.files(paths)
    for path in paths:
        pending = []

        def flush():
            if not pending:
                return
            dense = np.stack([p[2] for p in pending])
            probs = sigmoid(model.logits(dense, [p[3] for p in pending], [p[4] for p in pending]))
            for (pos, label, _, _, _), p in zip(pending, probs):
                row = [path, pos, f"{p:.9g}"]
                if featurizer.labeled:
                    row.append(label)
                writer.writerow(row)
            pending.clear()

        for pos, parsed in featurizer.records(path, batch_size):
            if limit is not None and scored + len(pending) >= limit:
                break
            if isinstance(parsed, str):
                print(f"{path}:{pos}: malformed record: {parsed}", file=sys.stderr)
                kind = bad_reason(parsed)
                bad[kind] = bad.get(kind, 0) + 1
                continue
            pending.append((pos,) + parsed)
            if len(pending) == batch_size:
                scored += len(pending)
                flush()
        scored += len(pending)
        flush()
    return scored, bad


# `tiderec predict`'s default `--max-bad-fraction`.
MAX_BAD_FRACTION = 0.01


def check_bad(files, scored, bad, max_fraction, labeled):
    """Refuses a run whose malformed records are more than `max_fraction` of the records
    read, or that read no record at all, as `tiderec predict` does (with its hint at
    unlabeled files when one kind of malformed record dominates)."""
    malformed = sum(bad.values())
    read = scored + malformed
    where = ", ".join(files)
    if malformed and (malformed / read > max_fraction or scored == 0):
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(bad.items()))
        hint = ""
        if bad.get("bad_label", 0) > malformed / 2:
            hint = (
                ". Most of them have no 0/1 label in the label column: the file may be unlabeled (a test file "
                "without the label column, such as Kaggle's test.txt) or of another format"
            )
        elif bad.get("field_count", 0) > malformed / 2:
            hint = (
                ". Most of them have a number of fields the format does not allow: the file may be unlabeled "
                "(one column short), of another format, or use another delimiter"
            )
        if hint and labeled:
            hint += " (`--unlabeled` reads files without labels)"
        raise ScorerError(
            f"{where}: {malformed} of {read} records ({100.0 * malformed / read:.2f}%) are malformed ({kinds}), "
            f"more than --max-bad-fraction {max_fraction:g} allows; each is reported above{hint}. "
            "Nothing was written"
        )
    if read == 0:
        raise ScorerError(f"{where}: no records were read: the input is empty. Nothing was written")


def bad_fraction(text):
    """An argparse type: a fraction in [0, 1]."""
    try:
        v = float(text)
    except ValueError:
        v = None
    if v is None or not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in [0, 1]")
    return v


# ---------------------------------------------------------------- the output file


def is_special(path):
    """Whether `path` exists and is neither a file nor a directory (a device, a FIFO, a
    socket: `/dev/stdout`), which writing to replaces nothing."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def same_file(a, b):
    """Whether `a` and `b` are one file: the same device and inode when both exist (a hard
    or symbolic link to a file is that file), the same resolved path otherwise."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_out(out, inputs, overwrite):
    """Refuses `--out` before anything is written when it is one of `inputs` (`(path, what)`
    pairs: the record files and directories, the model's files), a file directly in an
    input directory, a directory, or (without `overwrite`) any existing path, a dangling
    symbolic link included. A device or a pipe is written in place and never refused."""
    if is_special(out):
        return
    for path, what in inputs:
        if same_file(out, path):
            raise ScorerError(
                f"--out {out} is the same file as the input {path} (from {what}): writing it would destroy "
                "the input; nothing was written, choose another path for --out"
            )
        if os.path.isdir(path) and os.path.dirname(os.path.realpath(out)) == os.path.realpath(path):
            raise ScorerError(
                f"--out {out} would be written into {path}, which is read as data (from {what}): the next run "
                "on that directory would read it as records; nothing was written"
            )
    if os.path.isdir(out):
        raise ScorerError(f"--out {out} is a directory: name a file to write the scores to")
    if not overwrite and os.path.lexists(out):
        raise ScorerError(f"--out {out} already exists: pass --overwrite to replace it")


def temp_beside(path):
    """A temporary name beside `path` that is this process's own (`NAME.tmp-PID`): writing it
    truncates no other file and no other run's temporary file."""
    return f"{path}.tmp-{os.getpid()}"


def commit_new(tmp, path):
    """Moves the finished `tmp` to `path` only if nothing is at `path` (a file made meanwhile
    stays as it is): `path` is linked to `tmp`, which makes the whole file visible at once,
    and the temporary name is removed. Where the file system cannot link, an existing `path`
    is refused just before a plain rename."""
    exists = ScorerError(
        f"--out {path} already exists (it appeared while the records were scored): pass --overwrite to "
        "replace it; it was left as it is"
    )
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise exists
    except OSError:
        if os.path.lexists(path):
            raise exists
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def write_whole(out, overwrite, write):
    """Returns `write(f)`, `f` a text file whose contents end up at `out` only if `write`
    returns: it writes `NAME.tmp-PID` beside `out`, then moves it to `out` (replacing it
    only with `overwrite`), and removes it on any error, so that `out` is either untouched
    or the whole CSV. `-` (stdout), a device or a pipe get the whole CSV copied from an
    unnamed temporary file once `write` returns, nothing otherwise."""
    if out == "-" or is_special(out):
        with tempfile.TemporaryFile("w+", newline="") as f:
            result = write(f)
            f.seek(0)
            if out == "-":
                shutil.copyfileobj(f, sys.stdout)
                sys.stdout.flush()
            else:
                try:
                    with open(out, "w", newline="") as dest:
                        shutil.copyfileobj(f, dest)
                except OSError as e:
                    raise ScorerError(f"--out {out}: {e}")
        return result
    tmp = temp_beside(out)
    try:
        try:
            f = open(tmp, "w", newline="")
        except OSError as e:
            raise ScorerError(f"--out {out}: cannot write {tmp}: {e}")
        with f:
            result = write(f)
        try:
            if overwrite:
                os.replace(tmp, out)
            else:
                commit_new(tmp, out)
        except OSError as e:
            raise ScorerError(f"--out {out}: {e}")
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return result


# ---------------------------------------------------------------- the command


def run(argv, prog, build, options):
    """The command of a scorer: `build(config, tensors, args)` makes the model (anything with
    `logits(dense, bags, sequences)`) of the export `--model`; `options` adds flags (name ->
    argparse keywords). Returns the exit status."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="directory written by `tiderec export`")
    ap.add_argument("--out", required=True, help="CSV file to write (`-`: stdout); written whole or not at all")
    ap.add_argument("--overwrite", action="store_true", help="replace --out when it exists (refused otherwise)")
    ap.add_argument("--unlabeled", action="store_true", help="records have no label column")
    ap.add_argument(
        "--max-bad-fraction",
        type=bad_fraction,
        default=MAX_BAD_FRACTION,
        metavar="F",
        help=f"fail, writing nothing, when more than this fraction of the records read is malformed "
        f"(default {MAX_BAD_FRACTION}, as tiderec predict)",
    )
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--limit", type=int, default=None, help="score at most this many records")
    for flag, keywords in options.items():
        ap.add_argument(flag, **keywords)
    ap.add_argument("files", nargs="+", help="record files (Parquet: files or directories), in the format model.json describes")
    args = ap.parse_args(argv)
    inputs = [(path, "the records to score") for path in args.files]
    inputs += [(os.path.join(args.model, name), "--model") for name in ("model.json", "model.safetensors")]
    try:
        if args.out != "-":
            check_out(args.out, inputs, args.overwrite)
        config, tensors = load(args.model)
        model = build(config, tensors, args)
        featurizer = Featurizer(config["features"], labeled=not args.unlabeled)

        def write(out):
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(["file", "position", "score"] + (["label"] if not args.unlabeled else []))
            scored, bad = score_files(model, featurizer, args.files, writer, max(args.batch_size, 1), args.limit)
            if args.limit != 0:
                check_bad(args.files, scored, bad, args.max_bad_fraction, not args.unlabeled)
            return scored, bad

        scored, bad = write_whole(args.out, args.overwrite, write)
    except ScorerError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    print(f"scored {scored} records with a {config['kind']} model, {sum(bad.values())} malformed", file=sys.stderr)
    return 0


def main(argv=None):
    return run(argv, "reference_scorer", lambda config, tensors, args: Model(config, tensors), {})


if __name__ == "__main__":
    sys.exit(main())
