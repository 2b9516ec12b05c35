#!/usr/bin/env python3
"""The ranking metrics of scored samples by scikit-learn: the oracle of tiderec's own.

Reads TSV files of `score<TAB>label[<TAB>group]` lines (a label above 0.5 is a
positive) and prints one JSON object per file, one per line:

* `auc`: `roc_auc_score` (null with one class only);
* `pr_auc`: `average_precision_score` (null without positives);
* `gauc`: `roc_auc_score` of each group that holds both classes, averaged with
  the group's number of samples as weight (null without groups, or when no group
  holds both classes).

Usage: sklearn_metrics.py SAMPLES.tsv [SAMPLES.tsv ...]
"""

import collections
import json
import sys

from sklearn.metrics import average_precision_score, roc_auc_score


def metrics(path):
    scores, labels, groups = [], [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            scores.append(float(fields[0]))
            labels.append(1 if float(fields[1]) > 0.5 else 0)
            if len(fields) > 2:
                groups.append(fields[2])
    both = 0 < sum(labels) < len(labels)
    out = {
        "auc": float(roc_auc_score(labels, scores)) if both else None,
        "pr_auc": float(average_precision_score(labels, scores)) if sum(labels) > 0 else None,
        "gauc": None,
    }
    if groups:
        members = collections.defaultdict(list)
        for i, g in enumerate(groups):
            members[g].append(i)
        weighted, weight = 0.0, 0
        for rows in members.values():
            y = [labels[i] for i in rows]
            if 0 < sum(y) < len(y):
                weighted += len(rows) * roc_auc_score(y, [scores[i] for i in rows])
                weight += len(rows)
        out["gauc"] = weighted / weight if weight else None
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(json.dumps(metrics(arg)))
