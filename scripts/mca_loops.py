#!/usr/bin/env python3
"""The fp32 GEMM kernels' inner loops in a tiderec binary, as llvm-mca predicts them.

Finds every loop of fused multiply-adds in the kernels' machine code (the wide
AVX-512 kernel, the one-panel AVX-512 and AVX2 kernels, and matrixmultiply's
AVX-512 kernel as the baseline), groups equal loop shapes, and runs each shape's
body through `llvm-mca` for a CPU model (`-mcpu`, default `sapphirerapids`).
A loop's shape is its register block: `R` rows of `a` broadcast times `Z`
vectors of `b` loaded per reduction step, `R·Z` fused multiply-adds per step.
The prediction assumes every load hits L1 and trusts the model's timing of each
instruction. The gap between it and a product's measured share of the FMA peak
(`tiderec bench kernels`) is what the memory system costs plus what the model
does not see of the core; the in-cache rate that `bench kernels` also reports
(the kernel on operands that never leave the caches) separates the two.

Needs `objdump` and `nm` (binutils) and `llvm-mca` (Debian's `llvm`).

    python3 scripts/mca_loops.py [--binary target/release/tiderec] [--mcpu sapphirerapids] [--json]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (kernel, as `tiderec bench kernels` names its candidates; pattern of its mangled symbols).
KERNELS = [
    ("avx512w", r"gemm_packed4wide(5flush|6blocks|5block)"),
    ("avx512", r"gemm_packed3x866avx5128panel_of"),
    ("avx512vl", r"gemm_packed3x868avx512vl10panel_laid"),
    ("avx2", r"gemm_packed3x864avx25panel|gemm_packed3x864avx210panel_laid"),
    ("matrixmultiply", r"matrixmultiply12sgemm_kernel20kernel_target_avx512"),
]

INSTRUCTION = re.compile(r"^\s*([0-9a-f]+):\s+(.*?)\s*$")
BRANCH = re.compile(r"^(j[a-z]+)\s+([0-9a-f]+)\b")
FMA = re.compile(r"^vfn?madd(132|213|231)ps\b")


class Missing(Exception):
    """A tool this script needs is not installed."""


def need(tool, package):
    path = shutil.which(tool)
    if path is None:
        raise Missing(f"`{tool}` not found (install {package})")
    return path


def symbols(binary, pattern):
    """`(start, size)` of every function of `binary` whose mangled name matches `pattern`."""
    out = subprocess.run([need("nm", "binutils"), "-S", binary], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTwW" and re.search(pattern, parts[3]):
            found.append((int(parts[0], 16), int(parts[1], 16)))
    return sorted(set(found))


def instructions(binary, start, size):
    """`[(address, text)]` of the function at `start` (AT&T syntax, symbols and comments dropped)."""
    out = subprocess.run([need("objdump", "binutils"), "-d", "--no-show-raw-insn", f"--start-address={start:#x}",
                          f"--stop-address={start + size:#x}", binary], capture_output=True, text=True,
                         check=True).stdout
    found = []
    for line in out.splitlines():
        m = INSTRUCTION.match(line)
        if m and m.group(2) and not m.group(2).startswith("("):
            text = re.sub(r"\s*<[^>]*>", "", m.group(2)).split("#")[0].strip()
            found.append((int(m.group(1), 16), re.sub(r"\s+", " ", text)))
    return found


def loops(code):
    """The innermost loops of fused multiply-adds: `[body]`, each body the instructions from a backward
    branch's target to the branch, that branch the only one inside."""
    index = {addr: i for i, (addr, _) in enumerate(code)}
    found = []
    for i, (addr, text) in enumerate(code):
        m = BRANCH.match(text)
        if not m or int(m.group(2), 16) >= addr or int(m.group(2), 16) not in index:
            continue
        body = code[index[int(m.group(2), 16)]:i + 1]
        if any(BRANCH.match(t) or t.startswith(("call", "ret")) for _, t in body[:-1]):
            continue
        if sum(bool(FMA.match(t)) for _, t in body) >= 8:
            found.append([t for _, t in body])
    return found


def lanes_of(body):
    """f32 lanes of the loop's vectors: 16 for zmm, 8 for ymm, 4 for xmm."""
    fmas = [t for t in body if FMA.match(t)]
    return 16 if any("zmm" in t for t in fmas) else 8 if any("ymm" in t for t in fmas) else 4


def shape(body):
    """`(fmas, vector loads, broadcasts, steps, R, Z)` of a loop body; `R`, `Z` and `steps` are None
    when the body is not a block of broadcasts times vector loads."""
    reg = {16: "zmm", 8: "ymm", 4: "xmm"}[lanes_of(body)]
    fmas = sum(bool(FMA.match(t)) for t in body)
    loads = sum(t.startswith(("vmovups", "vmovaps")) and "(" in t.split(",")[0] and reg in t for t in body)
    loads += sum(bool(FMA.match(t)) and "(" in t and "1to" not in t for t in body)
    bcasts = sum(t.startswith("vbroadcastss") and "(" in t for t in body) + sum("{1to" in t for t in body)
    if loads and bcasts and (loads * bcasts) % fmas == 0:
        steps = loads * bcasts // fmas
        if steps and loads % steps == 0 and bcasts % steps == 0 and fmas == steps * (loads // steps) * (bcasts // steps):
            return fmas, loads, bcasts, steps, bcasts // steps, loads // steps
    return fmas, loads, bcasts, None, None, None


def predict(body, mcpu, iterations=400):
    """llvm-mca's cycles per iteration of `body` (run as a loop) on `mcpu`."""
    text = [".Lloop:"] + body[:-1] + [f"{BRANCH.match(body[-1]).group(1)} .Lloop"]
    out = subprocess.run([need("llvm-mca", "Debian's llvm"), "-mtriple=x86_64", f"-mcpu={mcpu}",
                          f"-iterations={iterations}", "-all-stats=false", "-instruction-info=false",
                          "-resource-pressure=false"], input="\n".join(text) + "\n", capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"llvm-mca -mcpu={mcpu} failed: {out.stderr.strip().splitlines()[:1]}")
    cycles = int(re.search(r"Total Cycles:\s+(\d+)", out.stdout).group(1))
    return cycles / iterations


def model(mcpu):
    """`(llvm-mca's version, the resource names of the scheduling model it uses for mcpu)`: LLVM names
    a model's resources after it (`SKXPort0` is the Skylake-server model)."""
    mca = need("llvm-mca", "Debian's llvm")
    version = subprocess.run([mca, "--version"], capture_output=True, text=True).stdout
    version = (re.search(r"LLVM version (\S+)", version) or re.search(r"(\d+\.\d+\.\d+)", version or "?"))
    out = subprocess.run([mca, "-mtriple=x86_64", f"-mcpu={mcpu}"], input="vfmadd231ps %zmm0, %zmm1, %zmm2\n",
                         capture_output=True, text=True).stdout
    resources = re.findall(r"^\[\d+\]\s+-\s+(\S+)", out, re.M)
    return (version.group(1) if version else "?"), resources


def analyse(binary, mcpu):
    """One row per kernel and loop shape: the loop's counts and llvm-mca's prediction on `mcpu`."""
    rows = []
    for name, pattern in KERNELS:
        shapes = {}
        for start, size in symbols(binary, pattern):
            for body in loops(instructions(binary, start, size)):
                fmas, loads, bcasts, steps, r, z = shape(body)
                key = (lanes_of(body), r, z) if r else (lanes_of(body), "other", fmas, loads, bcasts)
                shapes.setdefault(key, []).append(body)
        for key, bodies in shapes.items():
            body = bodies[0]
            fmas, loads, bcasts, steps, r, z = shape(body)
            cycles = predict(body, mcpu)
            # Two FMA ports: 2 fused multiply-adds per cycle is the core's peak at this vector width.
            rows.append({"kernel": name, "block": f"{r} × {z}" if r else "other", "rows": r, "vectors": z,
                         "lanes": key[0], "steps_per_iteration": steps, "fmas": fmas, "vector_loads": loads,
                         "broadcasts": bcasts, "instructions": len(body), "copies": len(bodies),
                         "cycles_per_iteration": round(cycles, 2),
                         "fma_per_cycle": round(fmas / cycles, 3), "share_of_peak": round(fmas / cycles / 2, 3)})
    return rows


# How the wide kernel covers a product, mirrored from the Rust sources (`nn/src/gemm_packed.rs`:
# `GROUP_ROWS`, `panels`; `nn/src/gemm_packed/wide.rs`: `blocks`, `by_rows`). A block shape this
# model uses that the binary lacks is an error, so the mirror cannot drift silently.
GROUP_ROWS = 24
MAIN_ROWS = {1: 12, 2: 12, 3: 8, 4: 6}
TAIL_ROWS = (8, 4, 2, 1)


def panels(n):
    """`(first, width)` of the packed panels of `n` columns: 16 wide, the last at most 40 (whole 8s)."""
    first = 0
    while first < n:
        rest = n - first
        width = 16 if rest > 40 else -(-rest // 8) * 8
        yield first, width
        first += width


def wide_blocks(m, n):
    """`{(R, Z): blocks}` the wide kernel runs for `m` rows and `n` columns (each block runs every
    reduction step), or None where a last panel is not whole vectors (it runs on another kernel)."""
    vectors = 0
    for _, width in panels(n):
        if width % 16:
            return None
        vectors += width // 16
    groups = [4] * (vectors // 4) + ([vectors % 4] if vectors % 4 else [])
    blocks = {}
    for z in groups:
        main = MAIN_ROWS[z]
        for g in range(0, m, GROUP_ROWS):
            rows = min(GROUP_ROWS, m - g)
            sizes = [main] * (rows // main)
            rest = rows - main * (rows // main)
            for size in TAIL_ROWS:
                if size < main and rest >= size:
                    sizes.append(size)
                    rest -= size
            for r in sizes:
                blocks[(r, z)] = blocks.get((r, z), 0) + 1
    return blocks


def wide_prediction(loops_found, m, n, k):
    """The share of the 512-bit FMA peak the wide kernel's loops allow for an `m × n × k` product
    (llvm-mca's cycles per step of each block; the blocks' writes, packing and copies left out)."""
    blocks = wide_blocks(m, n)
    if blocks is None:
        return None
    per_step = {(r["rows"], r["vectors"]): r["cycles_per_iteration"] / r["steps_per_iteration"]
                for r in loops_found if r["kernel"] == "avx512w" and r["lanes"] == 16 and r["rows"]}
    missing = sorted(set(blocks) - set(per_step))
    if missing:
        raise RuntimeError(f"the binary's wide kernel has no loop for blocks {missing}: "
                           "update the mirror in scripts/mca_loops.py")
    cycles = k * sum(count * per_step[key] for key, count in blocks.items())
    return m * n * k / (cycles * 2 * 16)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "tiderec"))
    p.add_argument("--mcpu", default="sapphirerapids", help="llvm-mca's CPU model (default sapphirerapids)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = p.parse_args(argv)
    try:
        rows = analyse(a.binary, a.mcpu)
    except Missing as e:
        print(f"mca_loops: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({"mcpu": a.mcpu, "binary": a.binary, "loops": rows}, indent=1))
        return 0
    print(f"llvm-mca -mcpu={a.mcpu}, {a.binary}")
    for r in rows:
        print(f"{r['kernel']:15} {r['lanes']:2} lanes {r['block']:>7}  {r['fmas']:3} FMA {r['vector_loads']:3} loads "
              f"{r['broadcasts']:3} bcasts  {r['cycles_per_iteration']:6.2f} cycles  "
              f"{100 * r['share_of_peak']:5.1f}% of 2 FMA/cycle  ({r['copies']} copies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
