#!/usr/bin/env python3
"""Fails when the modules of a crate import each other in a cycle.

Reads every `.rs` file under each given `src` directory (default: every crate of
the workspace) except test modules in files of their own (`tests.rs`), takes the
paths a module names outside comments and outside an inline
`#[cfg(test)] mod tests` (`crate::a::b`, `super::a`, and `a::` or `self::a::`
for a child module declared in the file), maps each to the deepest module that
exists, and lifts each reference to the two sibling subtrees it joins (a
reference from `a::x::y` to `a::z` makes the unit `a::x` depend on `a::z`).
Sibling units must not depend on each other in a cycle; a module and its own
descendants may name each other (a `mod.rs` and its files are one unit).

Exit status 1 with every cycle printed; 0 with a count of the modules read.
"""

import collections
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRATES = ["records", "nn", "operators", "sources", "sinks", "gpu", "pipeline"]


def read_modules(src):
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src)[:-3]
            for tail in ("/mod", "lib", "main"):
                if rel.endswith(tail) and (tail != "lib" and tail != "main" or rel == tail):
                    rel = rel[: -len(tail)].rstrip("/")
            name = rel.replace("/", "::")
            if name == "tests" or name.endswith("::tests"):
                continue
            text = open(path, encoding="utf-8").read().split("#[cfg(test)]\nmod tests")[0]
            code = "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))
            mods[name] = code
    return mods


def related(a, b):
    """One module is the other's ancestor: a parent and its children may name each other."""
    return a == "" or b == "" or a.startswith(b + "::") or b.startswith(a + "::")


def edges(mods):
    graph = collections.defaultdict(set)

    def deepest(parts):
        for n in range(len(parts), 0, -1):
            cand = "::".join(parts[:n])
            if cand in mods:
                return cand
        return None

    for name, code in mods.items():
        here = name.split("::") if name else []
        parent = here[:-1]
        children = set(re.findall(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_0-9]+)\s*;", code, re.M))
        refs = []
        for p in re.findall(r"\bcrate::((?:[a-z_0-9]+::)*[a-z_0-9]+)", code):
            refs.append(p.split("::"))
        for p in re.findall(r"\bsuper::((?:[a-z_0-9]+::)*[a-z_0-9]+)", code):
            refs.append(parent + p.split("::"))
        for p in re.findall(r"\bsuper::\{", code):
            refs.append(parent)
        for child in children:
            if re.search(r"(?<![:\w])(?:self::)?%s::" % re.escape(child), code):
                refs.append(here + [child])
        for parts in refs:
            target = deepest(parts)
            if target is None or target == name or related(name, target):
                continue
            graph[name].add(target)
    return graph


def cycles(graph):
    found, seen_sets = [], set()
    index, low, stack, on = {}, {}, [], set()
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 and frozenset(comp) not in seen_sets:
                seen_sets.add(frozenset(comp))
                found.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            strong(v)
    return found


def sibling_graph(graph):
    """Lifts every edge to the two sibling subtrees it joins: an edge from `a::x::y`
    to `a::z` is an edge from the unit `a::x` to the unit `a::z` (children of `a`)."""
    lifted = collections.defaultdict(set)
    for src, dsts in graph.items():
        for dst in dsts:
            s, d = src.split("::"), dst.split("::")
            common = 0
            while common < min(len(s), len(d)) and s[common] == d[common]:
                common += 1
            lifted["::".join(s[: common + 1])].add("::".join(d[: common + 1]))
    return lifted


def main(argv):
    dirs = argv[1:] or [os.path.join(ROOT, c, "src") for c in CRATES]
    bad, total = False, 0
    for src in dirs:
        mods = read_modules(src)
        total += len(mods)
        for comp in cycles(sibling_graph(edges(mods))):
            bad = True
            print(f"{os.path.relpath(src, ROOT)}: modules import each other in a cycle: {', '.join(comp)}")
    if bad:
        return 1
    print(f"no module import cycles ({total} modules in {len(dirs)} crates)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
